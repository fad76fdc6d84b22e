//! The "Redis in Action" ZSET counting semaphore under client clock skew,
//! on a real master: over-admission.
//!
//! Cell: (zset-semaphore, client-skew, mutual-exclusion).
//!
//! Holders are scored by their own clock when they acquire, and every
//! acquire first drops the members older than `now − ttl` by the
//! acquirer's clock. A client whose clock runs ahead by more than the TTL
//! drops a holder that is still valid by its own clock and takes its place:
//! two holders of a one-permit semaphore. The adapter's clock cannot be
//! offset, so the scenario drives the core machine itself
//! ([`DrivenMachine`]). With equal clocks the same attempt is refused.
//! (The model finds this cell violated even without skew, from two acquires
//! in the same millisecond; that race is not what this scenario shows.)

mod common;

use common::{docker_ready, report, Outcome};
use lockwright_chaos::{Cluster, DrivenMachine, History, NodeOptions, Op};
use lockwright_core::{Config, ProtocolId};

const TTL_MS: u64 = 2_000;

async fn admit(urls: &[String], name: &str, skew_ms: i64) -> History {
    let config = Config {
        ttl_ms: TTL_MS,
        limit: 1,
        auto_renew: false,
        ..Config::new(name)
    };
    let history = History::new();
    let protocol = ProtocolId::ZsetSemaphore;
    let mut first = DrivenMachine::new(protocol, &config, "client-1", urls, 0).expect("machine");
    let mut second =
        DrivenMachine::new(protocol, &config, "client-2", urls, skew_ms).expect("machine");
    let lease = first
        .try_acquire()
        .await
        .expect("acquire")
        .expect("admitted");
    history.grant("client-1", None, first.instant_of(lease.valid_until));
    match second.try_acquire().await.expect("acquire") {
        Some(lease) => history.grant("client-2", None, second.instant_of(lease.valid_until)),
        None => history.record("client-2", Op::Denied),
    }
    // Both work inside for a while.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    for (client, machine) in [("client-1", &mut first), ("client-2", &mut second)] {
        if machine.lease().is_some() {
            history.record(client, Op::Release);
            machine.start_release().expect("release");
            let _ = machine.drive_to_event().await;
        }
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_clock_runs_ahead_is_admitted_beyond_the_limit() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("zset-semaphore", "client-skew")]);
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("one master");
    let urls = cluster.urls();
    let skewed = admit(&urls, "skewed", i64::try_from(TTL_MS).unwrap_or(0) + 1_000).await;
    let equal = admit(&urls, "equal", 0).await;
    assert_eq!(
        equal.verdict("mutual-exclusion", 1).as_str(),
        "holds",
        "with equal clocks the second acquire is refused"
    );
    report(
        "zset_semaphore_skew",
        &[(
            Outcome::from_history(
                "zset_semaphore_skew/ahead-by-ttl+1s",
                "zset-semaphore",
                "client-skew",
                "mutual-exclusion",
                &skewed,
                1,
                "",
            ),
            "violated",
        )],
    );
}
