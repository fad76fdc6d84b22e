//! The blocking front end (`lockwright-blocking`, std::net and the core's
//! contract only) against real `redis-server` processes: set-px-lua,
//! fenced, RedLock on three masters, lease-semaphore and
//! time-fenced-semaphore exclude, fence and admit as the adapter does, and
//! a release without a reply is unknown.

use lockwright_blocking::{Error, Lock};
use lockwright_core::{Config, ProtocolId};
use lockwright_tests::{redis_or_skip, RedisServer};
use std::time::Duration;

const REPLY: Duration = Duration::from_millis(300);

fn lock(protocol: ProtocolId, name: &str, servers: &[&RedisServer], limit: u32) -> Lock {
    let config = Config {
        ttl_ms: 10_000,
        limit,
        ..Config::new(name)
    };
    let addrs = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    match Lock::new(protocol, config, addrs, REPLY) {
        Ok(lock) => lock,
        Err(e) => panic!("{protocol}: {e}"),
    }
}

fn extra(what: &str) -> RedisServer {
    match RedisServer::start() {
        Ok(s) => s,
        Err(e) => panic!("{what}: {e}"),
    }
}

#[test]
fn set_px_lua_excludes_and_releases() {
    let Some(redis) = redis_or_skip("blocking set-px-lua") else {
        return;
    };
    let (a, b) = (
        lock(ProtocolId::SetPxLua, "orders", &[&redis], 1),
        lock(ProtocolId::SetPxLua, "orders", &[&redis], 1),
    );
    let guard = a.try_acquire().unwrap().expect("free");
    assert!(b.try_acquire().unwrap().is_none(), "excluded while held");
    assert_eq!(guard.release(), Ok(true));
    let guard = b.try_acquire().unwrap().expect("free again");
    assert_eq!(guard.release(), Ok(true));
}

#[test]
fn fenced_grants_increasing_fences() {
    let Some(redis) = redis_or_skip("blocking fenced") else {
        return;
    };
    let l = lock(ProtocolId::Fenced, "ledger", &[&redis], 1);
    let mut fences = Vec::new();
    for _ in 0..3 {
        let guard = l.try_acquire().unwrap().expect("free");
        fences.push(guard.lease().fence.expect("fenced").0);
        assert_eq!(guard.release(), Ok(true));
    }
    assert_eq!(fences, [1, 2, 3]);
}

#[test]
fn redlock_needs_a_majority_of_three() {
    let Some(first) = redis_or_skip("blocking redlock") else {
        return;
    };
    let (second, mut third) = (extra("second master"), extra("third master"));
    let masters = [&first, &second, &third];
    let (a, b) = (
        lock(ProtocolId::Redlock, "red", &masters, 1),
        lock(ProtocolId::Redlock, "red", &masters, 1),
    );
    let guard = a.try_acquire().unwrap().expect("free");
    assert!(
        b.try_acquire().unwrap().is_none(),
        "excluded on every master"
    );
    assert_eq!(guard.release(), Ok(true));
    // Two of three masters still make a majority.
    third.kill();
    let guard = b.try_acquire().unwrap().expect("a majority is up");
    assert!(guard.lease().valid_until.0 > 0);
    // Released on the two; on the dead one nobody knows.
    assert!(matches!(guard.release(), Err(Error::OutcomeUnknown(_))));
}

#[test]
fn lease_semaphore_admits_up_to_its_limit() {
    let Some(redis) = redis_or_skip("blocking lease-semaphore") else {
        return;
    };
    let pool = lock(ProtocolId::LeaseSemaphore, "pool", &[&redis], 2);
    let first = pool.try_acquire().unwrap().expect("a permit");
    let second = pool.try_acquire().unwrap().expect("a second permit");
    assert!(pool.try_acquire().unwrap().is_none(), "the limit is 2");
    let fences = (first.lease().fence, second.lease().fence);
    assert!(fences.0 < fences.1, "{fences:?}");
    assert_eq!(first.release(), Ok(true));
    let third = pool.try_acquire().unwrap().expect("a permit came back");
    assert_eq!(third.release(), Ok(true));
    assert_eq!(second.release(), Ok(true));
}

#[test]
fn time_fenced_semaphore_admits_up_to_its_limit_with_clock_fences() {
    let Some(redis) = redis_or_skip("blocking time-fenced-semaphore") else {
        return;
    };
    let pool = lock(ProtocolId::TimeFencedSemaphore, "clocked", &[&redis], 2);
    let first = pool.try_acquire().unwrap().expect("a permit");
    let second = pool.try_acquire().unwrap().expect("a second permit");
    assert!(pool.try_acquire().unwrap().is_none(), "the limit is 2");
    let (Some(a), Some(b)) = (first.lease().fence, second.lease().fence) else {
        panic!("time-fenced-semaphore permits are fenced");
    };
    assert!(a < b, "{a:?} {b:?}");
    // The first fence is Redis' clock in µs, not a counter starting at 1.
    assert!(a.0 > 1_000_000_000_000_000, "{a:?}");
    assert_eq!(first.release(), Ok(true));
    let third = pool.try_acquire().unwrap().expect("a permit came back");
    assert!(third.lease().fence > Some(b));
    assert_eq!(third.release(), Ok(true));
    assert_eq!(second.release(), Ok(true));
}

/// A release sent to a stopped (`SIGSTOP`) server gets no reply: its
/// outcome is unknown, and rightly so, since the server runs it once it is
/// resumed. The release script is loaded first, so that the late
/// `EVALSHA` is not refused with `NOSCRIPT` (which would leave the hold in
/// place by accident of the script cache).
#[test]
fn a_release_to_a_stopped_server_is_unknown_and_runs_late() {
    let Some(redis) = redis_or_skip("blocking unknown release") else {
        return;
    };
    // The shared helpers are async; this front end is not.
    let rt = tokio::runtime::Runtime::new().expect("a runtime for the helpers");
    rt.block_on(redis.load_scripts());
    let l = lock(ProtocolId::SetPxLua, "stopped", &[&redis], 1);
    let guard = l.try_acquire().unwrap().expect("free");
    redis.pause();
    let released = guard.release();
    // Still held while the server is stopped and the release waits in its
    // socket.
    assert!(
        matches!(released, Err(Error::OutcomeUnknown(_))),
        "{released:?}"
    );
    redis.resume();
    assert!(
        rt.block_on(redis.gone_within("{stopped}", Duration::from_secs(3))),
        "the resumed server ran the late release"
    );
    let again = l.try_acquire().unwrap().expect("released late, so free");
    assert_eq!(again.release(), Ok(true));
}

/// After `SCRIPT FLUSH` the release's `EVALSHA` is answered `NOSCRIPT`; the
/// front end then sends the script's text (`EVAL`) and the release goes
/// through.
#[test]
fn a_release_after_script_flush_sends_the_script_text() {
    let Some(redis) = redis_or_skip("blocking NOSCRIPT") else {
        return;
    };
    let l = lock(ProtocolId::SetPxLua, "flushed", &[&redis], 1);
    let guard = l.try_acquire().unwrap().expect("free");
    let mut admin = redis.client().get_connection().expect("connect");
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut admin)
        .expect("SCRIPT FLUSH");
    assert_eq!(guard.release(), Ok(true));
    let again = l.try_acquire().unwrap().expect("released, so free");
    assert_eq!(again.release(), Ok(true));
}
