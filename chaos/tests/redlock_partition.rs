//! RedLock over three real masters while a minority, then a majority, of
//! them is cut off from every client (disconnected from the network).
//!
//! Cell: (redlock, partition, mutual-exclusion).
//!
//! - Minority (one master): two clients contend for the lock round after
//!   round; each still gets its majority from the two reachable masters,
//!   one at a time. No two holds overlap.
//! - Majority (two masters): nobody can assemble a majority; every acquire
//!   fails, so nothing is granted and nothing overlaps. After the heal the
//!   lock is available again (the partial grants were released or expired).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{clients, docker_ready, fence_of, report, Outcome, Resource};
use lockwright_chaos::{Cluster, History, NodeOptions, Op};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_millis(1_000);
/// Rounds each client holds the lock during the minority partition.
const ROUNDS: usize = 8;

fn options() -> LockOptions {
    LockOptions {
        request_timeout: Duration::from_millis(200),
        ..LockOptions::new(ProtocolId::Redlock, TTL)
    }
}

async fn contend(
    lock: Lock,
    client: &'static str,
    history: History,
    resource: Arc<Mutex<Resource>>,
) -> usize {
    let mut held = 0;
    for round in 0..ROUNDS {
        let Ok(guard) = lock.acquire_timeout(Duration::from_secs(5)).await else {
            continue;
        };
        history.grant(client, fence_of(&guard), guard.valid_until());
        if guard.is_held() {
            resource.lock().await.write(
                &history,
                client,
                fence_of(&guard),
                &format!("{client} {round}"),
            );
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        history.record(client, Op::Release);
        let _ = guard.release().await;
        held += 1;
        // Let the other client in.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioning_a_minority_or_a_majority_of_redlock_masters_never_gives_two_holders() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("redlock", "partition")]);
    let cluster = Cluster::start(3, &NodeOptions::default())
        .await
        .expect("three masters");
    let urls = cluster.urls();

    // A minority: one master unreachable.
    cluster.node(2).partition().await.expect("partition C");
    let minority = History::new();
    let resource = Arc::new(Mutex::new(Resource::Plain(Vec::new())));
    let lock = Lock::new(clients(&urls), "minority", options()).expect("lock");
    let first = tokio::spawn(contend(
        lock.clone(),
        "client-1",
        minority.clone(),
        resource.clone(),
    ));
    let second = tokio::spawn(contend(lock, "client-2", minority.clone(), resource));
    let held = first.await.expect("join") + second.await.expect("join");
    assert_eq!(
        held,
        2 * ROUNDS,
        "with a majority reachable, every round holds"
    );
    cluster.node(2).heal().await.expect("heal C");

    // A majority: two masters unreachable.
    cluster.node(0).partition().await.expect("partition A");
    cluster.node(1).partition().await.expect("partition B");
    let majority = History::new();
    let lock = Lock::new(clients(&urls), "majority", options()).expect("lock");
    for client in ["client-1", "client-2"] {
        match lock.acquire_timeout(Duration::from_millis(1_500)).await {
            Ok(guard) => {
                majority.grant(client, fence_of(&guard), guard.valid_until());
                panic!("{client} acquired without a majority");
            }
            Err(_) => majority.record(client, Op::Denied),
        }
    }
    cluster.node(0).heal().await.expect("heal A");
    cluster.node(1).heal().await.expect("heal B");
    let guard = lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("after the heal the lock is free again");
    majority.grant("client-1", fence_of(&guard), guard.valid_until());
    majority.record("client-1", Op::Release);
    guard.release().await.expect("release");

    report(
        "redlock_partition",
        &[
            (
                Outcome::from_history(
                    "redlock_partition/minority",
                    "redlock",
                    "partition",
                    "mutual-exclusion",
                    &minority,
                    1,
                    &format!("{} holds in turn, none overlapping", 2 * ROUNDS),
                ),
                "holds",
            ),
            (
                Outcome::from_history(
                    "redlock_partition/minority",
                    "redlock",
                    "partition",
                    "fenced-resource",
                    &minority,
                    1,
                    "every write in grant order",
                ),
                "holds",
            ),
            (
                Outcome::from_history(
                    "redlock_partition/majority",
                    "redlock",
                    "partition",
                    "mutual-exclusion",
                    &majority,
                    1,
                    "no acquire succeeded during the partition; one after the heal",
                ),
                "holds",
            ),
        ],
    );
}
