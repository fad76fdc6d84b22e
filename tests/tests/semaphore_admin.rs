//! Semaphore administration: reading and changing the limit every client
//! shares, and typed errors when the limit key is missing or not a number.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, LimitError, LockOptions, Semaphore};
use lockwright_tests::{raw, redis_or_skip};
use std::time::Duration;

fn options(protocol: ProtocolId, limit: u32) -> LockOptions {
    LockOptions {
        limit,
        auto_renew: false,
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(protocol, Duration::from_secs(10))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_limit_applies_to_every_client() {
    let Some(redis) = redis_or_skip("limit change") else {
        return;
    };
    for protocol in [
        ProtocolId::LeaseSemaphore,
        ProtocolId::TimeFencedSemaphore,
        ProtocolId::WatchSemaphore,
    ] {
        let name = format!("pool-{protocol}");
        let sem = Semaphore::new([redis.client()], name.clone(), options(protocol, 1)).unwrap();
        if protocol == ProtocolId::WatchSemaphore {
            sem.set_limit(1).await.unwrap();
        }
        let a = sem.try_acquire().await.unwrap().expect("first permit");
        assert_eq!(sem.limit().await, Ok(1), "{protocol}");
        // A client built later with another `limit` option does not change
        // the limit in force...
        let other = Semaphore::new([redis.client()], name.clone(), options(protocol, 5)).unwrap();
        assert!(other.try_acquire().await.unwrap().is_none(), "{protocol}");
        // ...set_limit does, for everyone.
        other.set_limit(2).await.unwrap();
        assert_eq!(sem.limit().await, Ok(2), "{protocol}");
        let b = sem.try_acquire().await.unwrap().expect("second permit");
        assert!(other.try_acquire().await.unwrap().is_none(), "{protocol}");
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_non_numeric_limit_is_a_typed_error() {
    let Some(redis) = redis_or_skip("limit key") else {
        return;
    };
    let lease = Semaphore::new(
        [redis.client()],
        "broken",
        options(ProtocolId::LeaseSemaphore, 2),
    )
    .unwrap();
    assert_eq!(
        lease.limit().await,
        Err(Error::Limit(LimitError::Missing {
            key: "{broken}:limit".into()
        }))
    );
    let mut conn = redis.conn().await;
    let _: () = raw(
        &mut conn,
        redis::cmd("SET").arg("{broken}:limit").arg("lots"),
    )
    .await;
    let not_a_number = Error::Limit(LimitError::NotANumber {
        key: "{broken}:limit".into(),
        value: "lots".into(),
    });
    assert_eq!(lease.limit().await, Err(not_a_number.clone()));
    assert_eq!(lease.try_acquire().await.map(|_| ()), Err(not_a_number));

    let watch = Semaphore::new(
        [redis.client()],
        "broken",
        options(ProtocolId::WatchSemaphore, 2),
    )
    .unwrap();
    let _: () = raw(&mut conn, redis::cmd("SET").arg("{broken}:max").arg("many")).await;
    assert_eq!(
        watch.try_acquire().await.map(|_| ()),
        Err(Error::Limit(LimitError::NotANumber {
            key: "{broken}:max".into(),
            value: "many".into(),
        }))
    );

    let zset = Semaphore::new(
        [redis.client()],
        "broken",
        options(ProtocolId::ZsetSemaphore, 2),
    )
    .unwrap();
    assert_eq!(zset.limit().await, Ok(2));
    assert_eq!(
        zset.set_limit(3).await,
        Err(Error::Limit(LimitError::PerClient {
            protocol: ProtocolId::ZsetSemaphore
        }))
    );
}
