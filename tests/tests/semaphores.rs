//! Every semaphore protocol of the catalogue that the core provides, against
//! real Redis: `limit` permits are granted, the next is denied, a release
//! frees a permit; the lease semaphores' unrenewed permits expire (the other
//! semaphores' permits time out by their own rules, checked in the model
//! and the replay).

use lockwright_core::{catalogue, Kind, ProtocolId};
use lockwright_redis::{Error, LimitError, LockOptions, Semaphore};
use lockwright_tests::{
    fence_counter_ahead_of_the_clock, raw, redis_or_skip, stored_fence, RedisServer,
};
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

async fn limits_and_frees(protocol: ProtocolId, redis: &RedisServer) {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_semaphore_grants_up_to_its_limit_and_frees_on_release() {
    let mut exercised = Vec::new();
    for entry in catalogue().iter().filter(|e| e.kind == Kind::Semaphore) {
        let Some(redis) = redis_or_skip(entry.id.as_str()) else {
            return;
        };
        limits_and_frees(entry.id, &redis).await;
        exercised.push(entry.id.as_str());
    }
    eprintln!("exercised: {exercised:?}");
    assert_eq!(
        exercised.len(),
        6,
        "every semaphore of the catalogue: {exercised:?}"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_fenced_semaphore_permits_renew_and_expire_with_growing_fences() {
    let Some(redis) = redis_or_skip("time-fenced-semaphore") else {
        return;
    };
    let renewing = LockOptions {
        auto_renew: true,
        ..options(ProtocolId::TimeFencedSemaphore, 300, 1)
    };
    let sem = Semaphore::new([redis.client()], "clocked", renewing).unwrap();
    let p = sem.try_acquire().await.unwrap().expect("granted");
    assert!(
        p.fence().is_some(),
        "time-fenced-semaphore permits are fenced"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(p.is_held(), "renewed past its TTL");
    assert!(sem.try_acquire().await.unwrap().is_none());
    assert_eq!(p.release().await, Ok(true));

    let once = Semaphore::new(
        [redis.client()],
        "clocked",
        options(ProtocolId::TimeFencedSemaphore, 300, 1),
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

/// The fences the adapter hands out before and after the node lost
/// everything (`FLUSHALL` stands for a restart without persistence), for a
/// fresh semaphore of `protocol`.
async fn fence_after_the_node_forgets(protocol: ProtocolId, redis: &RedisServer) -> (u64, u64) {
    let sem = Semaphore::new(
        [redis.client()],
        protocol.as_str(),
        options(protocol, 2_000, 2),
    )
    .unwrap();
    let a = sem.try_acquire().await.unwrap().expect("granted");
    let before = a.fence().expect("a fence").0;
    assert_eq!(a.release().await, Ok(true));
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, &mut redis::cmd("FLUSHALL")).await;
    // Redis' clock moves on meanwhile, as it does across a real restart.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let b = sem.try_acquire().await.unwrap().expect("granted");
    let after = b.fence().expect("a fence").0;
    assert_eq!(b.release().await, Ok(true));
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_fenced_semaphore_fences_keep_growing_after_the_node_forgets_its_counter() {
    let Some(redis) = redis_or_skip("time-fenced-semaphore") else {
        return;
    };
    let (before, after) =
        fence_after_the_node_forgets(ProtocolId::TimeFencedSemaphore, &redis).await;
    assert!(
        after > before,
        "time-fenced-semaphore: {after} after {before}"
    );
    // The fence is Redis' clock in microseconds.
    let mut conn = redis.conn().await;
    let (secs, micros): (u64, u64) = raw(&mut conn, &mut redis::cmd("TIME")).await;
    let now = secs * 1_000_000 + micros;
    assert!(
        after <= now && now - after < 60_000_000,
        "{after} is the clock ({now})"
    );
    // The same with `lease-semaphore`'s counter alone: the fence starts over.
    let (before, after) = fence_after_the_node_forgets(ProtocolId::LeaseSemaphore, &redis).await;
    assert_eq!((before, after), (1, 1), "lease-semaphore repeats its fence");
}

/// The branch of `max(stored + 1, TIME µs)` where the stored counter is
/// ahead of the clock (left by a clock that stepped back, or by grants
/// within one µs): the fence is exactly the counter plus one, stored as an
/// integer string, and not the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_fenced_semaphore_follows_a_counter_that_is_ahead_of_the_clock() {
    let Some(redis) = redis_or_skip("time-fenced-semaphore") else {
        return;
    };
    let ahead = fence_counter_ahead_of_the_clock(&redis, "{ahead}:fence").await;
    let sem = Semaphore::new(
        [redis.client()],
        "ahead",
        options(ProtocolId::TimeFencedSemaphore, 2_000, 2),
    )
    .unwrap();
    let p = sem.try_acquire().await.unwrap().expect("granted");
    assert_eq!(p.fence().expect("a fence").0, ahead + 1);
    assert_eq!(
        stored_fence(&redis, "{ahead}:fence").await,
        (ahead + 1).to_string()
    );
    assert_eq!(p.release().await, Ok(true));
}
