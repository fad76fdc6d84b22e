//! `reentrant` is reentrant through the API: a held guard re-enters as the
//! same owner, the server counts the holds, and the lock is released when
//! the count reaches zero.

use lockwright_core::{ProtocolId, UsageError};
use lockwright_redis::{Error, Lock, LockOptions};
use lockwright_tests::{raw, redis_or_skip, RedisServer};
use std::time::Duration;

fn options(protocol: ProtocolId) -> LockOptions {
    LockOptions {
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(protocol, Duration::from_secs(10))
    }
}

async fn count_on_server(redis: &RedisServer, token: &str) -> Option<i64> {
    let mut conn = redis.conn().await;
    raw(&mut conn, redis::cmd("HGET").arg("{nested}").arg(token)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_acquire_is_counted_and_released_at_zero() {
    let Some(redis) = redis_or_skip("nested reentrant acquire") else {
        return;
    };
    let lock = Lock::new([redis.client()], "nested", options(ProtocolId::Reentrant)).unwrap();
    let mut guard = lock.acquire().await.unwrap();
    let token = guard.token().0.to_string();
    assert_eq!(guard.hold_count(), 1);
    assert_eq!(guard.reenter().await, Ok(2));
    assert_eq!(guard.reenter().await, Ok(3));
    assert_eq!(count_on_server(&redis, &token).await, Some(3));

    // Another owner still waits.
    let other = lock.try_acquire().await.unwrap();
    assert!(other.is_none(), "held by the first owner");

    assert_eq!(guard.leave().await, Ok(2));
    assert_eq!(guard.leave().await, Ok(1));
    assert!(guard.is_held(), "one level left");
    assert_eq!(count_on_server(&redis, &token).await, Some(1));
    assert_eq!(guard.leave().await, Ok(0));
    assert!(!guard.is_held(), "released at zero");
    assert!(!guard.is_lost());
    let mut conn = redis.conn().await;
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{nested}")).await;
    assert_eq!(exists, 0);
    // A guard that left its last level holds nothing to re-enter, and takes
    // nothing on the server.
    assert_eq!(
        guard.reenter().await,
        Err(Error::Usage(UsageError::NotHeld))
    );
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{nested}")).await;
    assert_eq!(exists, 0);
    drop(guard);

    // release() takes every level at once.
    let mut guard = lock.acquire().await.unwrap();
    assert_eq!(guard.reenter().await, Ok(2));
    assert_eq!(guard.release().await, Ok(true));
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{nested}")).await;
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentering_a_lost_hold_says_lost() {
    let Some(redis) = redis_or_skip("reenter lost") else {
        return;
    };
    let lock = Lock::new([redis.client()], "nested", options(ProtocolId::Reentrant)).unwrap();
    let mut guard = lock.acquire().await.unwrap();
    let mut conn = redis.conn().await;
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{nested}")).await;
    let _: i64 = raw(
        &mut conn,
        redis::cmd("HSET")
            .arg("{nested}")
            .arg("someone-else")
            .arg(1),
    )
    .await;
    assert_eq!(guard.reenter().await, Err(Error::Lost));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_protocols_do_not_reenter() {
    let Some(redis) = redis_or_skip("reenter elsewhere") else {
        return;
    };
    let lock = Lock::new([redis.client()], "flat", options(ProtocolId::SetPxLua)).unwrap();
    let mut guard = lock.acquire().await.unwrap();
    assert_eq!(
        guard.reenter().await,
        Err(Error::Usage(UsageError::AlreadyHeld))
    );
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_acquire_with_an_unrepresentable_deadline_does_not_panic() {
    let Some(redis) = redis_or_skip("notified acquire_timeout(MAX)") else {
        return;
    };
    let options = LockOptions {
        notify: true,
        ..options(ProtocolId::SetPxLua)
    };
    let lock = Lock::new([redis.client()], "far", options).unwrap();
    let guard = lock.acquire_timeout(Duration::MAX).await.unwrap();
    assert_eq!(guard.release().await, Ok(true));
}
