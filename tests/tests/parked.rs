//! Renewing holds are parked: a hold whose machine has nothing to do
//! before its first renewal stays with its guard (no task of its own), and
//! the nodes' alarm task moves it to a task when the renewal comes.

use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions, Nodes};
use lockwright_tests::{raw, redis_or_skip};
use std::time::{Duration, Instant};

fn renewing(ttl_ms: u64) -> LockOptions {
    LockOptions {
        auto_renew: true,
        request_timeout: Duration::from_millis(250.min(ttl_ms / 2)),
        ..LockOptions::new(ProtocolId::Fenced, Duration::from_millis(ttl_ms))
    }
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Wait up to 2 s for the runtime's live tasks to number `n`.
async fn tasks_settle_at(n: usize) -> usize {
    let start = Instant::now();
    while alive_tasks() != n && start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_holds_run_no_task_until_their_first_renewal() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let nodes = Nodes::new([redis.client()]);
    // TTL 1.5 s: the first renewal at 0.5 s.
    let locks: Vec<Lock> = (0..8)
        .map(|i| Lock::on(&nodes, format!("parked-{i}"), renewing(1_500)).unwrap())
        .collect();
    // A first hold taken and given back: the connection's I/O task and the
    // alarm task run from here on.
    let warm = locks[0].acquire().await.unwrap();
    assert_eq!(warm.release().await, Ok(true));
    let baseline = tasks_settle_at(alive_tasks()).await;
    let started = Instant::now();
    let mut guards = Vec::new();
    for lock in &locks {
        guards.push(lock.acquire().await.unwrap());
    }
    let first_until: Vec<_> = guards.iter().map(|g| g.valid_until()).collect();
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "the holds were taken well before their first renewal"
    );
    assert_eq!(
        alive_tasks(),
        baseline,
        "eight renewing holds before their first renewal: no task of their own"
    );
    // Past the first renewal (0.5 s) and the TTL: each hold was renewed by
    // a task of its own, moved there by the alarm.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    for (guard, until) in guards.iter().zip(&first_until) {
        assert!(guard.is_held(), "renewed past its TTL");
        assert!(
            guard.valid_until() > *until,
            "the renewal moved the validity"
        );
    }
    assert_eq!(
        alive_tasks(),
        baseline + guards.len(),
        "after their first renewal each hold runs in a task of its own"
    );
    for guard in guards {
        assert_eq!(guard.release().await, Ok(true));
    }
    assert_eq!(
        tasks_settle_at(baseline).await,
        baseline,
        "the holds' tasks end with their release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_short_leaves_the_hold_renewing_and_releasable() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let options = LockOptions {
        // Well above the pause below: the extend is answered, late.
        request_timeout: Duration::from_millis(600),
        ..renewing(1_500)
    };
    let lock = Lock::new([redis.client()], "parked-cut", options).unwrap();
    let mut guard = lock.acquire().await.unwrap();
    // Writes wait 200 ms at the server, so that the extend below cannot be
    // answered before it is cut short.
    let mut conn = redis.conn().await;
    let _: () = raw(
        &mut conn,
        redis::cmd("CLIENT").arg("PAUSE").arg(200).arg("WRITE"),
    )
    .await;
    // An extend cut short after its first poll: its request is written,
    // then the call's future is dropped.
    let finished = tokio::select! {
        biased;
        result = guard.extend() => Some(result),
        () = std::future::ready(()) => None,
    };
    assert_eq!(finished, None, "the extend was cut short");
    // Past the TTL twice: the driver went back to its guard (to a task,
    // since the cut extend was still in flight), so renewals went on.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    assert!(
        guard.is_held(),
        "still renewed after the cut call: lost {} {:?}",
        guard.is_lost(),
        guard
    );
    assert!(lock.try_acquire().await.unwrap().is_none());
    guard
        .extend()
        .await
        .expect("the guard's calls still reach the driver");
    assert_eq!(guard.release().await, Ok(true));
    let again = lock.try_acquire().await.unwrap().expect("released");
    assert_eq!(again.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_before_the_renewal_moves_the_alarm() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let lock = Lock::new([redis.client()], "parked-extend", renewing(900)).unwrap();
    let mut guard = lock.acquire().await.unwrap();
    // Extended at 0.2 s, before the renewal due at 0.3 s: the renewal moves
    // to 0.5 s, and the alarm set for 0.3 s finds nothing due.
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.extend().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(guard.is_held(), "renewed from the moved deadline on");
    assert!(!guard.is_lost());
    assert_eq!(guard.release().await, Ok(true));
}
