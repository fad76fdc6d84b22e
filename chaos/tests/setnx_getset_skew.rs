//! The SETNX + GETSET timestamp recipe under client clock skew, on a real
//! master.
//!
//! Cell: (setnx-getset, client-skew, mutual-exclusion); control:
//! (setnx-getset, none, mutual-exclusion).
//!
//! The lock's value is the holder's expiry timestamp, read from the
//! holder's clock; a client that finds it in the past by its own clock
//! takes the lock over with `GETSET`. The adapter reads one process-wide
//! clock and has no way to offset it, so the scenario drives the core
//! machine itself ([`DrivenMachine`]) with each client's clock offset: a
//! client whose clock runs ahead by more than the TTL sees client 1's
//! timestamp as expired and takes over while client 1 holds. With equal
//! clocks the same attempt is refused.

mod common;

use common::{docker_ready, report, Outcome};
use lockwright_chaos::{Cluster, DrivenMachine, History, NodeOptions, Op};
use lockwright_core::{Config, ProtocolId};

const TTL_MS: u64 = 2_000;

async fn takeover(urls: &[String], name: &str, skew_ms: i64) -> History {
    let config = Config {
        ttl_ms: TTL_MS,
        auto_renew: false,
        ..Config::new(name)
    };
    let history = History::new();
    let protocol = ProtocolId::SetnxGetset;
    let mut first = DrivenMachine::new(protocol, &config, "client-1", urls, 0).expect("machine");
    let mut second =
        DrivenMachine::new(protocol, &config, "client-2", urls, skew_ms).expect("machine");
    let lease = first
        .try_acquire()
        .await
        .expect("acquire")
        .expect("granted");
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
async fn a_client_whose_clock_runs_ahead_takes_over_a_held_lock() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("setnx-getset", "client-skew"), ("setnx-getset", "none")]);
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("one master");
    let urls = cluster.urls();
    let skewed = takeover(&urls, "skewed", i64::try_from(TTL_MS).unwrap_or(0) + 1_000).await;
    let equal = takeover(&urls, "equal", 0).await;
    report(
        "setnx_getset_skew",
        &[
            (
                Outcome::from_history(
                    "setnx_getset_skew/ahead-by-ttl+1s",
                    "setnx-getset",
                    "client-skew",
                    "mutual-exclusion",
                    &skewed,
                    1,
                    "",
                ),
                "violated",
            ),
            (
                Outcome::from_history(
                    "setnx_getset_skew/equal-clocks",
                    "setnx-getset",
                    "none",
                    "mutual-exclusion",
                    &equal,
                    1,
                    "client 2 was refused",
                ),
                "holds",
            ),
        ],
    );
}
