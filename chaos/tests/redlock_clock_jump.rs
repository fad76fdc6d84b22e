//! RedLock over five real masters, one of whose clocks jumps (Kleppmann,
//! "How to do distributed locking", 2016).
//!
//! Cell: (redlock, clock-jump, mutual-exclusion).
//!
//! Client 1 reaches masters A, B, C and client 2 reaches C, D, E (each is
//! given an unreachable address for the two it cannot reach, which is
//! Kleppmann's network partition, per client). Client 1 acquires on A, B, C:
//! a majority. C's clock then jumps forward past the TTL (libfaketime), so
//! the key expires on C. Client 2 acquires on C, D, E: a majority too, while
//! client 1's validity has not run out. Both hold the lock.

mod common;

use std::time::Duration;

use common::{clients, docker_ready, fence_of, report, unreachable_url, Outcome};
use lockwright_chaos::{Cluster, History, NodeOptions, Op};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};

const TTL: Duration = Duration::from_secs(10);

fn options() -> LockOptions {
    LockOptions {
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::Redlock, TTL)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_on_one_of_five_masters_gives_two_majorities() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("redlock", "clock-jump")]);
    let mut cluster = Cluster::start(5, &NodeOptions::default())
        .await
        .expect("five masters");
    let urls = cluster.urls();
    let (dead_1, dead_2) = (unreachable_url(), unreachable_url());
    let first_view = [&urls[0], &urls[1], &urls[2], &dead_1, &dead_2].map(String::clone);
    let second_view = [&dead_1, &dead_2, &urls[2], &urls[3], &urls[4]].map(String::clone);
    let first = Lock::new(clients(&first_view), "kleppmann", options()).expect("lock");
    let second = Lock::new(clients(&second_view), "kleppmann", options()).expect("lock");
    let history = History::new();

    let guard_1 = first
        .try_acquire()
        .await
        .expect("acquire")
        .expect("client 1 holds A, B, C");
    history.grant("client-1", fence_of(&guard_1), guard_1.valid_until());

    // Without the jump, client 2 sees C taken and gets only D and E.
    assert!(
        common::is_denied(&second.try_acquire().await),
        "client 2 must be refused while C holds client 1's key"
    );
    history.record("client-2", Op::Denied);

    cluster
        .node_mut(2)
        .jump_clock(i64::try_from(TTL.as_millis()).unwrap_or(i64::MAX) + 1_000)
        .expect("C's clock jumps");
    let guard_2 = second
        .try_acquire()
        .await
        .expect("acquire")
        .expect("client 2 holds C, D, E");
    history.grant("client-2", fence_of(&guard_2), guard_2.valid_until());
    assert!(guard_1.is_held(), "client 1 still believes it holds");

    history.record("client-2", Op::Release);
    common::release_with_unreachable(guard_2).await;
    history.record("client-1", Op::Release);
    common::release_with_unreachable(guard_1).await;

    let outcome = Outcome::from_history(
        "redlock_clock_jump",
        "redlock",
        "clock-jump",
        "mutual-exclusion",
        &history,
        1,
        "",
    );
    report("redlock_clock_jump", &[(outcome, "violated")]);
}
