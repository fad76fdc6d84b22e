//! One master with an asynchronous replica; the replica is promoted
//! (`REPLICAOF NO ONE`) after replication was cut (antirez, "Why
//! failover-based implementations are not enough").
//!
//! Cell: (set-px-lua, failover, mutual-exclusion).
//!
//! - Without `WAIT`: client 1's grant never reached the replica; after the
//!   promotion client 2 acquires on the new master while client 1 holds.
//! - With `WAIT 1` (`LockOptions::wait_replicas`) the window narrows: a
//!   grant made while replication is cut is not reported (the adapter
//!   fails with `ReplicasNotAcknowledged` and undoes it), so the promotion
//!   loses nothing anyone believed in. The window that remains is what
//!   `WAIT` does not cover: an extend is not waited for, so the promoted
//!   replica keeps the old expiry, and client 2 acquires when it passes
//!   while client 1 believes in its extension. (The model has no `WAIT`; its
//!   counterexample for the cell is the unreplicated write, which is what
//!   the extend is here.)

mod common;

use std::time::{Duration, Instant};

use common::{clients, docker_ready, fence_of, report, Outcome};
use lockwright_chaos::{Cluster, History, NodeOptions, Op};
use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions};

const TTL: Duration = Duration::from_millis(2_000);

fn options(wait_replicas: Option<u32>) -> LockOptions {
    LockOptions {
        wait_replicas,
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(ProtocolId::SetPxLua, TTL)
    }
}

/// Puts the replica back under the master, synced.
async fn reset(cluster: &Cluster) {
    let replica = cluster.node(1);
    // Rejoining fails when it is still attached: either way it is attached.
    let _ = replica.rejoin_peers().await;
    replica
        .replicate_from(cluster.node(0))
        .await
        .expect("replica synced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_the_lock_and_wait_narrows_the_window() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("set-px-lua", "failover")]);
    let cluster = Cluster::start_replicated(&NodeOptions::default())
        .await
        .expect("master and replica");
    let master = vec![cluster.node(0).url()];
    let promoted = vec![cluster.node(1).url()];

    // 1. No WAIT: the unreplicated grant is lost.
    let plain = History::new();
    {
        let first = Lock::new(clients(&master), "no-wait", options(None)).expect("lock");
        let second = Lock::new(clients(&promoted), "no-wait", options(None)).expect("lock");
        cluster.node(1).isolate_from_peers().await.expect("cut");
        let guard_1 = first
            .try_acquire()
            .await
            .expect("acquire")
            .expect("granted");
        plain.grant("client-1", fence_of(&guard_1), guard_1.valid_until());
        cluster.node(1).promote().await.expect("promote");
        let guard_2 = second
            .try_acquire()
            .await
            .expect("acquire")
            .expect("the promoted replica never saw client 1's key");
        plain.grant("client-2", fence_of(&guard_2), guard_2.valid_until());
        plain.record("client-2", Op::Release);
        guard_2.release().await.expect("release");
        plain.record("client-1", Op::Release);
        let _ = guard_1.release().await;
    }

    // 2. WAIT 1 with replication cut: the grant is refused, not believed.
    reset(&cluster).await;
    let waited = History::new();
    {
        let first = Lock::new(clients(&master), "wait-cut", options(Some(1))).expect("lock");
        let second = Lock::new(clients(&promoted), "wait-cut", options(Some(1))).expect("lock");
        cluster.node(1).isolate_from_peers().await.expect("cut");
        match first.try_acquire().await {
            Err(Error::ReplicasNotAcknowledged { .. }) => waited.record("client-1", Op::Denied),
            other => panic!("a grant that no replica acknowledged was reported: {other:?}"),
        }
        cluster.node(1).promote().await.expect("promote");
        // The promoted node has no replica: client 2 asks for none.
        let second_plain = Lock::new(clients(&promoted), "wait-cut", options(None)).expect("lock");
        drop(second);
        let guard_2 = second_plain
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free on the promoted replica");
        waited.grant("client-2", fence_of(&guard_2), guard_2.valid_until());
        waited.record("client-2", Op::Release);
        guard_2.release().await.expect("release");
    }
    // WAIT closed the window of the unreplicated grant: the match above
    // fails the test on any grant to client 1, so this history holds one
    // grant only (a mutual-exclusion verdict on it could not fail, and is
    // not asserted; section 3 adds to this history).

    // 3. WAIT 1, replicated grant, then an extend that is not waited for.
    reset(&cluster).await;
    {
        let first = Lock::new(clients(&master), "wait-extend", options(Some(1))).expect("lock");
        let second = Lock::new(clients(&promoted), "wait-extend", options(None)).expect("lock");
        let mut guard_1 = first
            .try_acquire()
            .await
            .expect("acquire")
            .expect("granted and replicated");
        waited.grant("client-1", fence_of(&guard_1), guard_1.valid_until());
        cluster.node(1).isolate_from_peers().await.expect("cut");
        tokio::time::sleep(TTL / 2).await;
        guard_1.extend().await.expect("extend on the master");
        // The new validity replaces the old one.
        waited.record("client-1", Op::Leave);
        waited.grant("client-1", fence_of(&guard_1), guard_1.valid_until());
        cluster.node(1).promote().await.expect("promote");
        let started = Instant::now();
        let guard_2 = second
            .acquire_timeout(TTL * 2)
            .await
            .expect("the old expiry passes on the promoted replica");
        waited.grant("client-2", fence_of(&guard_2), guard_2.valid_until());
        eprintln!(
            "client 2 acquired {:?} after the promotion; client 1 still had {:?}",
            started.elapsed(),
            guard_1.remaining()
        );
        waited.record("client-2", Op::Release);
        guard_2.release().await.expect("release");
        waited.record("client-1", Op::Release);
        let _ = guard_1.release().await;
    }

    if let Some(trace) = common::model_counterexample("set-px-lua", "failover", "mutual-exclusion")
    {
        eprintln!("\nThe model's shortest counterexample for (set-px-lua, failover, mutual-exclusion):\n{trace}");
    }
    report(
        "failover",
        &[
            (
                Outcome::from_history(
                    "failover/no-wait",
                    "set-px-lua",
                    "failover",
                    "mutual-exclusion",
                    &plain,
                    1,
                    "",
                ),
                "violated",
            ),
            (
                Outcome::from_history(
                    "failover/wait-1",
                    "set-px-lua",
                    "failover",
                    "mutual-exclusion",
                    &waited,
                    1,
                    "",
                )
                .with_prefix("grant with replication cut refused (no second holder); remains: "),
                "violated",
            ),
        ],
    );
}
