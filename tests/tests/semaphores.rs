//! Every semaphore protocol of the catalogue that the core provides, against
//! real Redis: `limit` permits are granted, the next is denied, a release
//! frees a permit, an unrenewed permit expires.

use lockwright_core::{catalogue, Kind, ProtocolId};
use lockwright_redis::{Error, LimitError, LockOptions, Semaphore};
use lockwright_tests::redis_or_skip;
use std::time::Duration;

fn options(protocol: ProtocolId, ttl_ms: u64, limit: u32) -> LockOptions {
    LockOptions {
        auto_renew: false,
        limit,
        // Shorter than the TTL, as the adapter requires.
        request_timeout: Duration::from_millis(500.min(ttl_ms / 2)),
        ..LockOptions::new(protocol, Duration::from_millis(ttl_ms))
    }
}

async fn limits_and_frees(protocol: ProtocolId, redis: &lockwright_tests::RedisServer) -> bool {
    let sem = Semaphore::new([redis.client()], "pool", options(protocol, 5_000, 2))
        .unwrap_or_else(|e| panic!("{protocol}: {e}"));
    if protocol == ProtocolId::WatchSemaphore {
        // Its max size is set by an administrator; until then acquiring is a
        // typed error.
        assert_eq!(
            sem.try_acquire().await.map(|_| ()),
            Err(Error::Limit(LimitError::Missing {
                key: "{pool}:max".into()
            }))
        );
        sem.set_limit(2).await.unwrap();
    }
    // zset-semaphore ranks by the client's millisecond clock and breaks ties
    // by token (a documented flaw of that specimen): acquisitions in the same
    // millisecond can over-admit, so this test spaces them out.
    let tick = || tokio::time::sleep(Duration::from_millis(3));
    let a = sem
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{protocol}: {e}"))
        .unwrap_or_else(|| panic!("{protocol}: first permit"));
    tick().await;
    let b = sem
        .try_acquire()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{protocol}: second permit"));
    tick().await;
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "{protocol}: a third permit over limit 2 is denied"
    );
    assert_eq!(a.release().await, Ok(true), "{protocol}");
    let c = sem
        .acquire_timeout(Duration::from_millis(1_000))
        .await
        .unwrap_or_else(|e| panic!("{protocol}: a freed permit is granted: {e}"));
    tick().await;
    assert!(sem.try_acquire().await.unwrap().is_none(), "{protocol}");
    assert_eq!(b.release().await, Ok(true), "{protocol}");
    assert_eq!(c.release().await, Ok(true), "{protocol}");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_semaphore_grants_up_to_its_limit_and_frees_on_release() {
    let mut exercised = Vec::new();
    for entry in catalogue().iter().filter(|e| e.kind == Kind::Semaphore) {
        let Some(redis) = redis_or_skip(entry.id.as_str()) else {
            return;
        };
        if limits_and_frees(entry.id, &redis).await {
            exercised.push(entry.id.as_str());
        }
    }
    eprintln!("exercised: {exercised:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_protocol_is_not_a_semaphore() {
    let Some(redis) = redis_or_skip("kind") else {
        return;
    };
    let err = Semaphore::new(
        [redis.client()],
        "pool",
        options(ProtocolId::SetPxLua, 1_000, 2),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(err, Error::WrongKind { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_semaphore_permits_renew_and_expire() {
    let Some(redis) = redis_or_skip("lease-semaphore") else {
        return;
    };
    let renewing = LockOptions {
        auto_renew: true,
        ..options(ProtocolId::LeaseSemaphore, 300, 1)
    };
    let sem = Semaphore::new([redis.client()], "leases", renewing).unwrap();
    let p = sem.try_acquire().await.unwrap().expect("granted");
    assert!(p.fence().is_some(), "lease-semaphore permits are fenced");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(p.is_held(), "renewed past its TTL");
    assert!(sem.try_acquire().await.unwrap().is_none());
    assert_eq!(p.release().await, Ok(true));

    let once = Semaphore::new(
        [redis.client()],
        "leases",
        options(ProtocolId::LeaseSemaphore, 300, 1),
    )
    .unwrap();
    let stale = once.try_acquire().await.unwrap().expect("granted");
    tokio::time::timeout(Duration::from_millis(1_000), stale.lost())
        .await
        .expect("an unrenewed permit is lost when its lease runs out");
    let next = once
        .acquire_timeout(Duration::from_millis(1_000))
        .await
        .expect("the expired permit is free");
    assert!(next.fence() > stale.fence(), "fences increase");
    assert_eq!(next.release().await, Ok(true));
}
