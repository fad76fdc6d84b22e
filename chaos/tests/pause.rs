//! Client pause past the TTL (Kleppmann's GC pause), on one real master.
//!
//! Cells: (set-px-lua, pause, mutual-exclusion / fenced-resource) and
//! (fenced, pause, mutual-exclusion / fenced-resource).
//!
//! A client pause is not a `docker pause` of the master: the holder's task
//! simply sleeps past its validity and then writes as if it still held (no
//! renewal runs meanwhile: `auto_renew` is off, as in a stopped process).
//! The lock key expires on the server, a second client acquires and writes,
//! then the first one wakes and writes. Both believed they held: mutual
//! exclusion is broken for every lease. Only the fenced lock keeps the
//! resource consistent: its late write carries an older fence and is
//! refused.

mod common;

use std::time::Duration;

use common::{docker_ready, fence_of, report, Outcome, Resource};
use lockwright_chaos::{Cluster, History, NodeOptions, Op};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};

const TTL: Duration = Duration::from_millis(600);
const ROUNDS: usize = 3;

async fn paused_holder(urls: &[String], protocol: ProtocolId, history: &History) {
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(200),
        ..LockOptions::new(protocol, TTL)
    };
    let lock = Lock::new(common::clients(urls), "pause", options).expect("lock");
    let mut resource = Resource::for_protocol(protocol.as_str());
    for round in 0..ROUNDS {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let guard_a = lock
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("a acquires");
        history.grant(&a, fence_of(&guard_a), guard_a.valid_until());
        resource.write(history, &a, fence_of(&guard_a), "a before the pause");

        // a stops: no step, no renewal, until well past its validity.
        tokio::time::sleep_until((guard_a.valid_until() + Duration::from_millis(150)).into()).await;

        // Meanwhile the key expired on the server and b acquired.
        let guard_b = lock
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("b acquires");
        history.grant(&b, fence_of(&guard_b), guard_b.valid_until());
        resource.write(history, &b, fence_of(&guard_b), "b");

        // a resumes and, believing it still holds, writes.
        resource.write(history, &a, fence_of(&guard_a), "a after the pause");

        history.record(&b, Op::Release);
        assert!(guard_b.release().await.expect("b releases"), "b still held");
        history.record(&a, Op::Release);
        assert!(
            !guard_a.release().await.expect("a releases"),
            "a's hold was long gone"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_past_the_ttl_only_fencing_keeps_the_resource_consistent() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("set-px-lua", "pause"), ("fenced", "pause")]);
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("one master");
    let urls = cluster.urls();
    let mut outcomes = Vec::new();
    for (protocol, id, fenced_resource) in [
        ("set-px-lua", ProtocolId::SetPxLua, "violated"),
        ("fenced", ProtocolId::Fenced, "holds"),
    ] {
        let history = History::new();
        paused_holder(&urls, id, &history).await;
        let scenario = format!("pause/{protocol}");
        let clean = format!("{ROUNDS} rounds: every late write refused");
        outcomes.push((
            Outcome::from_history(
                &scenario,
                protocol,
                "pause",
                "mutual-exclusion",
                &history,
                1,
                "",
            ),
            "violated",
        ));
        outcomes.push((
            Outcome::from_history(
                &scenario,
                protocol,
                "pause",
                "fenced-resource",
                &history,
                1,
                &clean,
            ),
            fenced_resource,
        ));
    }
    report("pause", &outcomes);
}
