//! Waiting without polling: a waiter with `notify` wakes on the release
//! script's `PUBLISH`, long before its fallback (bounded by the holder's TTL).

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions};
use lockwright_tests::redis_or_skip;
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
    let holder_lock = Lock::new([redis.client()], "notified", options(false)).unwrap();
    let waiter_lock = Lock::new([redis.client()], "notified", options(true)).unwrap();
    let holder = holder_lock.try_acquire().await.unwrap().expect("granted");
    let waiter = tokio::spawn(async move {
        let guard = waiter_lock.acquire().await?;
        Ok::<_, Error>((Instant::now(), guard))
    });
    // Let the waiter be denied once and settle into its wait (its fallback
    // is 1–2 s: half or more of min(PTTL ≈ 30 s, 2 s)).
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
