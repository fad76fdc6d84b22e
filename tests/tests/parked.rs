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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime of one thread, for a call made from elsewhere and then gone.
fn short_lived() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A renewing hold granted on a runtime of its own (returned), then
/// extended from a short-lived runtime that is gone by the return.
fn extended_from_a_short_lived_runtime(
    redis: &lockwright_tests::RedisServer,
    name: &str,
    ttl_ms: u64,
) -> (tokio::runtime::Runtime, Lock, lockwright_redis::LockGuard) {
    let rt = runtime();
    let lock = Lock::new([redis.client()], name, renewing(ttl_ms)).unwrap();
    let mut guard = rt.block_on(lock.acquire()).unwrap();
    short_lived().block_on(guard.extend()).unwrap();
    (rt, lock, guard)
}

/// A parked guard dropped outside any runtime: its driver goes back to the
/// grant runtime, which releases the hold.
#[test]
fn a_parked_guard_dropped_outside_the_runtime_is_released() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let rt = runtime();
    // TTL 10 s: the first renewal (3.3 s) is far off, the hold stays parked.
    let lock = Lock::new([redis.client()], "parked-drop-outside", renewing(10_000)).unwrap();
    let guard = rt.block_on(lock.acquire()).unwrap();
    // Dropped on this thread, outside the runtime, which still runs.
    drop(guard);
    std::thread::sleep(Duration::from_millis(500));
    let again = rt.block_on(lock.try_acquire()).unwrap();
    assert!(
        again.is_some(),
        "the dropped guard's hold was not released (it stands until its TTL)"
    );
    rt.block_on(again.unwrap().release()).unwrap();
}

/// A guard call made from another runtime that then goes away: the hold's
/// alarms run on its grant runtime, which still runs, so it keeps
/// renewing.
#[test]
fn an_extend_from_a_short_lived_runtime_leaves_the_hold_renewing() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let (rt, lock, guard) = extended_from_a_short_lived_runtime(&redis, "parked-two-runtimes", 900);
    // Past the TTL twice, with `rt` running all along.
    std::thread::sleep(Duration::from_millis(2_000));
    assert!(
        guard.is_held(),
        "not renewed although its runtime still runs: lost {}",
        guard.is_lost()
    );
    let rival = rt.block_on(lock.try_acquire()).unwrap();
    assert!(rival.is_none(), "a rival got the lock");
    rt.block_on(guard.release()).unwrap();
}

/// A registration earlier than the deadline the alarm task sleeps until
/// wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_deadline_registered_later_wakes_the_alarm_task() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let nodes = lockwright_redis::Nodes::new([redis.client()]);
    let long = Lock::on(&nodes, "parked-long", renewing(60_000)).unwrap();
    let short = Lock::on(&nodes, "parked-short", renewing(900)).unwrap();
    let a = long.acquire().await.unwrap(); // the alarm sleeps until +20 s
    let b = short.acquire().await.unwrap(); // renewal due at +0.3 s
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(b.is_held(), "the short hold was not renewed");
    assert_eq!(b.release().await, Ok(true));
    assert_eq!(a.release().await, Ok(true));
}

/// An alarm made stale by a call (an extend moved the deadline) leaves
/// the hold parked until its new deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_hold_stays_parked_past_its_old_deadline() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let nodes = lockwright_redis::Nodes::new([redis.client()]);
    let lock = Lock::on(&nodes, "parked-stale-alarm", renewing(3_000)).unwrap();
    let warm = lock.acquire().await.unwrap();
    assert_eq!(warm.release().await, Ok(true));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = alive_tasks();
    let mut guard = lock.acquire().await.unwrap(); // renewal due at 1.0 s
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.extend().await.unwrap(); // renewal now due at 1.5 s
    tokio::time::sleep(Duration::from_millis(700)).await; // 1.2 s
    assert_eq!(
        alive_tasks(),
        baseline,
        "moved to a task before its deadline"
    );
    tokio::time::sleep(Duration::from_millis(1_000)).await; // 2.2 s
    assert_eq!(alive_tasks(), baseline + 1, "moved at its deadline");
    assert!(guard.is_held());
    assert_eq!(guard.release().await, Ok(true));
}

/// A parked guard dropped inside the runtime is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_parked_guard_releases_it() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let lock = Lock::new([redis.client()], "parked-drop", renewing(60_000)).unwrap();
    drop(lock.acquire().await.unwrap());
    let next = lock
        .acquire_timeout(Duration::from_millis(1_000))
        .await
        .expect("the dropped parked guard was released");
    assert_eq!(next.release().await, Ok(true));
}

/// The driver's timers, made in a short-lived runtime by a call run
/// there, are not polled by the next call after that runtime is gone.
#[test]
fn a_call_after_a_short_lived_runtime_went_away_does_not_panic() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let (rt, _lock, mut guard) =
        extended_from_a_short_lived_runtime(&redis, "parked-dead-timer", 10_000);
    // Well within the TTL, back on the runtime that runs.
    let extended = rt.block_on(async {
        tokio::spawn(async move {
            let r = guard.extend().await;
            (r, guard)
        })
        .await
    });
    let (result, guard) = extended.expect("the extend's task panicked");
    result.unwrap();
    assert_eq!(rt.block_on(guard.release()), Ok(true));
}

/// A parked guard dropped inside another, short-lived runtime: its
/// driver goes back to the grant runtime, which releases the hold (a
/// release spawned on the short-lived runtime would die with it).
#[test]
fn a_parked_guard_dropped_in_a_short_lived_runtime_is_released() {
    let Some(redis) = redis_or_skip("parked holds") else {
        return;
    };
    let rt = runtime();
    let lock = Lock::new([redis.client()], "parked-drop-other", renewing(10_000)).unwrap();
    let guard = rt.block_on(lock.acquire()).unwrap();
    {
        short_lived().block_on(async move { drop(guard) });
    }
    std::thread::sleep(Duration::from_millis(500));
    let again = rt.block_on(lock.try_acquire()).unwrap();
    assert!(
        again.is_some(),
        "the guard dropped in a short-lived runtime was not released (it stands until its TTL)"
    );
    rt.block_on(again.unwrap().release()).unwrap();
}
