//! Waiting without polling: a waiter with `notify` wakes on the release
//! script's `PUBLISH`, long before its fallback (bounded by the TTL); the
//! waiters of one lock are served in line, one attempt per release; a
//! holder that releases silently still lets them in, on their fallback.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions};
use lockwright_tests::{raw, redis_or_skip};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn options(notify: bool) -> LockOptions {
    LockOptions {
        auto_renew: false,
        notify,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(30))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_wakes_on_release_not_on_its_fallback() {
    let Some(redis) = redis_or_skip("notify") else {
        return;
    };
    let holder_lock = Lock::new([redis.client()], "notified", options(true)).unwrap();
    let waiter_lock = Lock::new([redis.client()], "notified", options(true)).unwrap();
    let holder = holder_lock.try_acquire().await.unwrap().expect("granted");
    let waiter = tokio::spawn(async move {
        let guard = waiter_lock.acquire().await?;
        Ok::<_, Error>((Instant::now(), guard))
    });
    // Let the waiter be denied once and settle into its wait (its fallback
    // is 1–2 s: half or more of min(TTL = 30 s, 2 s)).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "excluded while held");
    let released_at = Instant::now();
    assert_eq!(holder.release().await, Ok(true));
    let (acquired_at, guard) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the lock")
        .expect("task")
        .expect("acquired");
    let delay = acquired_at.duration_since(released_at);
    assert!(
        delay < Duration::from_millis(700),
        "woken by the notification, not the 1-2 s fallback: {delay:?}"
    );
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_times_out_while_held() {
    let Some(redis) = redis_or_skip("notify timeout") else {
        return;
    };
    let lock = Lock::new([redis.client()], "busy", options(true)).unwrap();
    let holder = lock.try_acquire().await.unwrap().expect("granted");
    let started = Instant::now();
    assert_eq!(
        lock.acquire_timeout(Duration::from_millis(300))
            .await
            .map(|_| ()),
        Err(Error::Timeout)
    );
    assert!(started.elapsed() < Duration::from_millis(1_000));
    assert_eq!(holder.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_line_one_attempt_per_release() {
    let Some(redis) = redis_or_skip("notify line") else {
        return;
    };
    let lock = Lock::new([redis.client()], "line", options(true)).unwrap();
    let holder = lock.try_acquire().await.unwrap().expect("granted");
    let mut admin = redis.conn().await;
    let _: () = raw(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (lock, order) = (lock.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await.expect("acquired");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(guard.release().await, Ok(true));
        }));
        // Join the line in this order.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(holder.release().await, Ok(true));
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("every waiter gets the lock")
            .expect("task");
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2], "served in line");
    // The first waiter tried once on joining (denied); the others waited
    // for their turn; each release woke one waiter, whose one try won.
    let stats: String = raw(&mut admin, redis::cmd("INFO").arg("commandstats")).await;
    let sets = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(sets, Some(4), "SET calls: 1 denied + 3 granted\n{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_release_lets_a_notified_waiter_in_on_its_fallback() {
    let Some(redis) = redis_or_skip("notify fallback") else {
        return;
    };
    let short = |notify| LockOptions {
        auto_renew: false,
        notify,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_millis(400))
    };
    let silent = Lock::new([redis.client()], "silent", short(false)).unwrap();
    let waiting = Lock::new([redis.client()], "silent", short(true)).unwrap();
    let holder = silent.try_acquire().await.unwrap().expect("granted");
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(holder.release().await, Ok(true));
    // No notice: the fallback (200–400 ms at a 400 ms TTL) lets it in.
    let guard = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("in on the fallback")
        .expect("task")
        .expect("acquired");
    assert_eq!(guard.release().await, Ok(true));
}
