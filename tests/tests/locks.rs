//! Every lock protocol of the catalogue that the core provides, against real
//! Redis: it acquires, excludes, releases, extends and expires.

use lockwright_core::{catalogue, Kind, ProtocolId};
use lockwright_redis::{Error, Lock, LockOptions};
use lockwright_tests::{
    fence_counter_ahead_of_the_clock, raw, redis_or_skip, stored_fence, RedisServer,
};
use std::time::Duration;

fn servers_for(protocol: ProtocolId) -> Option<Vec<RedisServer>> {
    let n = if protocol == ProtocolId::Redlock {
        3
    } else {
        1
    };
    (0..n).map(|_| redis_or_skip(protocol.as_str())).collect()
}

fn options(protocol: ProtocolId, ttl_ms: u64) -> LockOptions {
    LockOptions {
        auto_renew: false,
        // Shorter than the TTL, as the adapter requires.
        request_timeout: Duration::from_millis(500.min(ttl_ms / 2)),
        ..LockOptions::new(protocol, Duration::from_millis(ttl_ms))
    }
}

/// The protocols whose hold has no TTL (it never expires on its own).
fn has_ttl(protocol: ProtocolId) -> bool {
    protocol != ProtocolId::SetnxDel
}

/// A lock over `servers`.
fn new_lock(servers: &[&RedisServer], name: &str, options: LockOptions) -> Lock {
    let protocol = options.protocol;
    let clients: Vec<_> = servers.iter().map(|s| s.client()).collect();
    Lock::new(clients, name, options).unwrap_or_else(|e| panic!("{protocol}: {e}"))
}

async fn acquires_excludes_releases(protocol: ProtocolId, servers: &[RedisServer]) {
    let all: Vec<&RedisServer> = servers.iter().collect();
    let lock = new_lock(&all, "orders", options(protocol, 2_000));
    let guard = lock
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{protocol}: {e}"))
        .unwrap_or_else(|| panic!("{protocol}: a free lock is granted"));
    assert!(guard.is_held(), "{protocol}");
    assert!(
        guard.remaining() > Duration::from_millis(1_000),
        "{protocol}"
    );

    // Excludes: a second owner is denied, also when it retries for a while.
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "{protocol}: excluded"
    );
    assert_eq!(
        lock.acquire_timeout(Duration::from_millis(150))
            .await
            .map(|_| ()),
        Err(Error::Timeout),
        "{protocol}"
    );

    // The key the core uses holds something while held.
    let mut conn = servers[0].conn().await;
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{orders}")).await;
    assert_eq!(exists, 1, "{protocol}: the lock key exists");

    // Releases: ours is removed, and the lock is free again.
    assert_eq!(guard.release().await, Ok(true), "{protocol}");
    let again = lock
        .try_acquire()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{protocol}: free again after release"));
    assert_eq!(again.release().await, Ok(true), "{protocol}");
}

/// Extends a hold past its first TTL; `false` for a lock with no TTL.
async fn extends(protocol: ProtocolId, servers: &[RedisServer]) -> bool {
    if !has_ttl(protocol) {
        return false;
    }
    let all: Vec<&RedisServer> = servers.iter().collect();
    let lock = new_lock(&all, "extended", options(protocol, 600));
    let mut guard = lock.try_acquire().await.unwrap().expect("granted");
    let first = guard.valid_until();
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard
        .extend()
        .await
        .unwrap_or_else(|e| panic!("{protocol}: extend: {e}"));
    assert!(
        guard.valid_until() >= first + Duration::from_millis(250),
        "{protocol}: extend moves validity forward"
    );
    // Past the first TTL the lock is still held and still excludes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(guard.is_held(), "{protocol}: held past the first TTL");
    assert!(lock.try_acquire().await.unwrap().is_none(), "{protocol}");
    assert_eq!(guard.release().await, Ok(true), "{protocol}");
    true
}

/// Lets a hold expire and another owner take it; `false` for a lock with
/// no TTL.
async fn expires(protocol: ProtocolId, servers: &[RedisServer]) -> bool {
    if !has_ttl(protocol) {
        return false;
    }
    let all: Vec<&RedisServer> = servers.iter().collect();
    let lock = new_lock(&all, "expiring", options(protocol, 300));
    let stale = lock.try_acquire().await.unwrap().expect("granted");
    // Without renewal, the core reports the hold lost when validity runs out.
    tokio::time::timeout(Duration::from_millis(1_000), stale.lost())
        .await
        .unwrap_or_else(|_| panic!("{protocol}: lost() fires when the lease runs out"));
    assert!(stale.is_lost(), "{protocol}");
    // Once Redis expired the key, another owner gets it while the stale
    // guard still exists.
    let next = lock
        .acquire_timeout(Duration::from_millis(1_000))
        .await
        .unwrap_or_else(|e| panic!("{protocol}: expired lock is free: {e}"));
    // The stale release removes nothing of the new owner's: Redis says so
    // when asked by token; `setnx-getset` stores no owner to ask by.
    let expected = match protocol {
        ProtocolId::SetnxGetset => Err(Error::Lost),
        _ => Ok(false),
    };
    assert_eq!(stale.release().await, expected, "{protocol}");
    assert!(next.is_held(), "{protocol}");
    assert!(lock.try_acquire().await.unwrap().is_none(), "{protocol}");
    assert_eq!(next.release().await, Ok(true), "{protocol}");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_acquires_excludes_releases_extends_and_expires() {
    let (mut locks, mut extended, mut expired) = (Vec::new(), Vec::new(), Vec::new());
    for entry in catalogue().iter().filter(|e| e.kind == Kind::Lock) {
        let Some(servers) = servers_for(entry.id) else {
            return;
        };
        acquires_excludes_releases(entry.id, &servers).await;
        locks.push(entry.id);
        if extends(entry.id, &servers).await {
            extended.push(entry.id);
        }
        if expires(entry.id, &servers).await {
            expired.push(entry.id);
        }
    }
    eprintln!("exercised: {locks:?}; extended and expired: {extended:?}");
    // Every lock of the catalogue, and every one with a TTL (all but
    // setnx-del) extended and expired: none left out silently.
    let with_ttl: Vec<ProtocolId> = locks.iter().copied().filter(|&p| has_ttl(p)).collect();
    assert_eq!(locks.len(), 10, "{locks:?}");
    assert_eq!(with_ttl.len(), locks.len() - 1, "only setnx-del has no TTL");
    assert_eq!(extended, with_ttl);
    assert_eq!(expired, with_ttl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_issues_increasing_fences_and_renews_automatically() {
    let Some(redis) = redis_or_skip("fenced") else {
        return;
    };
    let opts = LockOptions {
        auto_renew: true,
        ..options(ProtocolId::Fenced, 300)
    };
    let lock = new_lock(&[&redis], "fenced", opts);
    let a = lock.try_acquire().await.unwrap().expect("granted");
    let fa = a.fence().expect("fenced issues a fence");
    // Renewal at TTL/3 keeps it held well past the TTL.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(a.is_held(), "renewed past its TTL");
    assert!(!a.is_lost());
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(a.release().await, Ok(true));
    let b = lock.try_acquire().await.unwrap().expect("granted");
    assert!(b.fence().expect("fence") > fa, "fences increase");
    assert_eq!(b.release().await, Ok(true));
}

/// The fence the adapter hands out after the node lost everything
/// (`FLUSHALL` stands for a restart without persistence), for a fresh lock
/// that held `fence` before.
async fn fence_after_the_node_forgets(protocol: ProtocolId, redis: &RedisServer) -> (u64, u64) {
    let lock = new_lock(&[redis], protocol.as_str(), options(protocol, 2_000));
    let a = lock.try_acquire().await.unwrap().expect("granted");
    let before = a.fence().expect("a fence").0;
    assert_eq!(a.release().await, Ok(true));
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, &mut redis::cmd("FLUSHALL")).await;
    // Redis' clock moves on meanwhile, as it does across a real restart.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let b = lock.try_acquire().await.unwrap().expect("granted");
    let after = b.fence().expect("a fence").0;
    assert_eq!(b.release().await, Ok(true));
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_fenced_fences_keep_growing_after_the_node_forgets_its_counter() {
    let Some(redis) = redis_or_skip("time-fenced") else {
        return;
    };
    let (before, after) = fence_after_the_node_forgets(ProtocolId::TimeFenced, &redis).await;
    assert!(after > before, "time-fenced: {after} after {before}");
    // The fence is Redis' clock in microseconds.
    let mut conn = redis.conn().await;
    let (secs, micros): (u64, u64) = raw(&mut conn, &mut redis::cmd("TIME")).await;
    let now = secs * 1_000_000 + micros;
    assert!(
        after <= now && now - after < 60_000_000,
        "{after} is the clock ({now})"
    );
    // The same with `fenced`'s counter alone: the fence starts over.
    let (before, after) = fence_after_the_node_forgets(ProtocolId::Fenced, &redis).await;
    assert_eq!((before, after), (1, 1), "fenced repeats its fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_renewal_finds_the_key_taken() {
    let Some(redis) = redis_or_skip("lost") else {
        return;
    };
    // TTL 3 s: the renewal at TTL/3 (1 s) finds the key taken; the validity
    // would run out only at about 3 s, so `lost()` resolving within 2 s is
    // the driver's word, not the expiry.
    let opts = LockOptions {
        auto_renew: true,
        ..options(ProtocolId::Fenced, 3_000)
    };
    let lock = new_lock(&[&redis], "stolen", opts);
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    let mut conn = redis.conn().await;
    // Someone else overwrites the key (an operator, a buggy client).
    let _: () = raw(
        &mut conn,
        redis::cmd("SET")
            .arg("{stolen}")
            .arg("intruder")
            .arg("PX")
            .arg(60_000),
    )
    .await;
    tokio::time::timeout(Duration::from_millis(2_000), guard.lost())
        .await
        .expect(
            "the next renewal finds the key taken and reports the loss before the validity ends",
        );
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, Ok(false));
    let value: String = raw(&mut conn, redis::cmd("GET").arg("{stolen}")).await;
    assert_eq!(value, "intruder", "the loser never touches the new value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_in_the_background() {
    let Some(redis) = redis_or_skip("drop") else {
        return;
    };
    let lock = Lock::new(
        [redis.client()],
        "dropped",
        options(ProtocolId::SetPxLua, 60_000),
    )
    .unwrap();
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    drop(guard);
    // Far before the 60 s TTL, the lock is free again.
    let next = lock
        .acquire_timeout(Duration::from_millis(1_000))
        .await
        .expect("the dropped guard's release ran");
    assert_eq!(next.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_gets_the_lock_after_release() {
    let Some(redis) = redis_or_skip("wait") else {
        return;
    };
    let lock = Lock::new(
        [redis.client()],
        "queue",
        options(ProtocolId::SetPxLua, 10_000),
    )
    .unwrap();
    let holder = lock.try_acquire().await.unwrap().expect("granted");
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "excluded while held");
    assert_eq!(holder.release().await, Ok(true));
    let got = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter gets the lock soon after the release")
        .expect("task")
        .expect("acquired");
    assert!(got.is_held());
    assert_eq!(got.release().await, Ok(true));
}

/// The branch of `max(stored + 1, TIME µs)` where the stored counter is
/// ahead of the clock: the fence is exactly the counter plus one, stored as
/// an integer string, and not the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_fenced_follows_a_counter_that_is_ahead_of_the_clock() {
    let Some(redis) = redis_or_skip("time-fenced") else {
        return;
    };
    let ahead = fence_counter_ahead_of_the_clock(&redis, "{ahead}:fence").await;
    let lock = new_lock(&[&redis], "ahead", options(ProtocolId::TimeFenced, 2_000));
    let g = lock.try_acquire().await.unwrap().expect("granted");
    assert_eq!(g.fence().expect("a fence").0, ahead + 1);
    assert_eq!(
        stored_fence(&redis, "{ahead}:fence").await,
        (ahead + 1).to_string()
    );
    assert_eq!(g.release().await, Ok(true));
}

/// A guard call given up part way (its future dropped while the request is
/// in flight) leaves its outcome to nobody: the guard's next call gets its
/// own answer, not the abandoned one's. The guard's driver runs inline here
/// (no automatic renewal), where both calls share the driver's answer slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_call_given_up_part_way_does_not_answer_the_next_one() {
    let Some(redis) = redis_or_skip("given-up") else {
        return;
    };
    let lock = new_lock(&[&redis], "given-up", options(ProtocolId::SetPxLua, 10_000));
    let mut guard = lock.try_acquire().await.unwrap().expect("granted");
    // Polled once, the extend sends its request and waits (the server is
    // paused for 300 ms, so no reply can come back within the poll); the
    // zero timeout then drops it.
    pause(&redis, 300).await;
    let extend = tokio::time::timeout(Duration::ZERO, guard.extend()).await;
    assert!(extend.is_err(), "the extend was still waiting for Redis");
    // The release waits for the extend's reply (one operation at a time),
    // which must not be taken for its own.
    assert_eq!(guard.release().await, Ok(true));
    assert!(
        lock.try_acquire().await.unwrap().is_some(),
        "the lock is free after the release"
    );
}

/// An acquire future dropped with its request in flight: the grant that
/// then arrives goes to nobody, and the driver, finishing in the
/// background, gives it back rather than leaving the key to its TTL (60 s
/// here). Two mechanisms do it: the answer slot refuses the grant (the
/// dropped caller's number is retired), and a driver whose handle is gone
/// releases any hold it still has; this test fails only with both removed
/// (checked by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_acquire_was_dropped_is_given_back() {
    let Some(redis) = redis_or_skip("dropped acquire") else {
        return;
    };
    let lock = new_lock(
        &[&redis],
        "dropped-acquire",
        options(ProtocolId::SetPxLua, 60_000),
    );
    // Polled once, the acquire sends its request; the zero timeout then
    // drops the future before the reply comes (the server is paused for
    // 300 ms, so none can come within the poll).
    pause(&redis, 300).await;
    let dropped = tokio::time::timeout(Duration::ZERO, lock.acquire()).await;
    assert!(dropped.is_err(), "the acquire was still waiting for Redis");
    let next = lock
        .acquire_timeout(Duration::from_millis(2_000))
        .await
        .expect("the grant nobody took was given back");
    assert_eq!(next.release().await, Ok(true));
}

/// Pause every client of `redis` for `ms` milliseconds (`CLIENT PAUSE`):
/// their commands wait in the server until then.
async fn pause(redis: &RedisServer, ms: u64) {
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, redis::cmd("CLIENT").arg("PAUSE").arg(ms)).await;
}
