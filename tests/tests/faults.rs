//! The adapter tells the truth under faults: a release or extend without a
//! reply is an unknown outcome, never "already gone"; errors no retry can
//! mend end an acquire at once; RedLock tells "taken" from "unreachable";
//! every protocol surfaces `WRONGTYPE`; a fenced grant whose fence cannot be
//! issued leaves nothing behind.
//!
//! The servers are real `redis-server` processes, stopped with `SIGSTOP`
//! and killed with `SIGKILL`; unreachable servers are closed loopback ports
//! and names under `.invalid`.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions, Operation, Semaphore};
use lockwright_tests::{acquire_error, closed_port, raw, redis_or_skip, RedisServer, ReplyLoss};
use std::time::Duration;

fn options(protocol: ProtocolId) -> LockOptions {
    LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(protocol, Duration::from_secs(10))
    }
}

fn client(url: &str) -> redis::Client {
    match redis::Client::open(url) {
        Ok(c) => c,
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A release sent to a stopped (`SIGSTOP`) server gets no reply, so its
/// outcome is unknown, and what the resumed server then does shows why:
/// a release in one script (`set-px-lua`, `fenced`, `reentrant`) waits in
/// the socket and runs late, so the hold is gone; `set-px-watch`'s release
/// is a sequence whose first command (`WATCH`) got no reply, so the rest
/// was never sent and the hold stays until its TTL. The scripts are loaded
/// first: a late `EVALSHA` refused with `NOSCRIPT` would leave every hold
/// in place by accident of the script cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_stopped_server_is_unknown_and_may_run_late() {
    let Some(redis) = redis_or_skip("release to a stopped server") else {
        return;
    };
    redis.load_scripts().await;
    for (protocol, runs_late) in [
        (ProtocolId::SetPxLua, true),
        (ProtocolId::Fenced, true),
        (ProtocolId::Reentrant, true),
        (ProtocolId::SetPxWatch, false),
    ] {
        let lock = Lock::new([redis.client()], "stopped", options(protocol)).unwrap();
        let guard = lock.try_acquire().await.unwrap().expect("granted");
        redis.pause();
        let released = guard.release().await;
        redis.resume();
        match released {
            Err(Error::OutcomeUnknown {
                operation: Operation::Release,
                ..
            }) => {}
            other => panic!("{protocol}: expected an unknown outcome, got {other:?}"),
        }
        let gone = redis.gone_within("{stopped}", Duration::from_secs(3)).await;
        assert_eq!(gone, runs_late, "{protocol}: did the late release run?");
        let mut conn = redis.conn().await;
        let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{stopped}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_killed_server_is_unknown() {
    let Some(mut redis) = redis_or_skip("release to a killed server") else {
        return;
    };
    let lock = Lock::new([redis.client()], "killed", options(ProtocolId::SetPxLua)).unwrap();
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    redis.kill();
    match guard.release().await {
        Err(Error::OutcomeUnknown {
            operation: Operation::Release,
            ..
        }) => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_says_gone_only_when_redis_said_so() {
    let Some(redis) = redis_or_skip("release of a gone hold") else {
        return;
    };
    let lock = Lock::new([redis.client()], "gone", options(ProtocolId::SetPxLua)).unwrap();
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    let mut conn = redis.conn().await;
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{gone}")).await;
    assert_eq!(guard.release().await, Ok(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_to_a_stopped_server_is_unknown_and_the_old_lease_stands() {
    let Some(redis) = redis_or_skip("extend to a stopped server") else {
        return;
    };
    for protocol in [
        ProtocolId::SetPxLua,
        ProtocolId::Fenced,
        ProtocolId::Reentrant,
    ] {
        let lock = Lock::new([redis.client()], "ext", options(protocol)).unwrap();
        let mut guard = lock.try_acquire().await.unwrap().expect("granted");
        let until = guard.valid_until();
        redis.pause();
        let extended = guard.extend().await;
        redis.resume();
        match extended {
            Err(Error::OutcomeUnknown {
                operation: Operation::Extend,
                ..
            }) => {}
            other => panic!("{protocol}: expected an unknown outcome, got {other:?}"),
        }
        assert!(guard.is_held(), "{protocol}: the old lease still stands");
        assert!(!guard.is_lost(), "{protocol}");
        assert_eq!(guard.valid_until(), until, "{protocol}: not moved");
        assert_eq!(guard.release().await, Ok(true), "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reenter_without_a_reply_is_unknown_and_the_release_takes_its_level_off() {
    let Some(redis) = redis_or_skip("reenter to a stopped server") else {
        return;
    };
    let lock = Lock::new([redis.client()], "again", options(ProtocolId::Reentrant)).unwrap();
    let mut guard = lock.try_acquire().await.unwrap().expect("granted");
    redis.pause();
    let reentered = guard.reenter().await;
    redis.resume();
    match reentered {
        Err(Error::OutcomeUnknown {
            operation: Operation::Reenter,
            ..
        }) => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(guard.hold_count(), 1, "the unknown level is not counted");
    // The stopped server ran the lock script once it was resumed.
    let mut conn = redis.conn().await;
    let counts: Vec<String> = raw(&mut conn, redis::cmd("HVALS").arg("{again}")).await;
    assert_eq!(counts, ["2"], "the level was taken on the server");
    // One release takes off our level and the unknown one.
    assert_eq!(guard.release().await, Ok(true));
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{again}")).await;
    assert_eq!(exists, 0, "no count outlives the hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_grant_ran_without_a_reply_leaves_no_hold() {
    let Some(redis) = redis_or_skip("acquire with a lost reply") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    // Loaded beforehand: an `EVALSHA` whose `NOSCRIPT` answer is lost would
    // never fall back to `EVAL`.
    redis.load_scripts().await;
    // The grant command of each protocol, as Redis counts it.
    for (protocol, grant) in [
        (ProtocolId::SetPxLua, "set"),
        (ProtocolId::SetPxGetDel, "set"),
        (ProtocolId::Fenced, "incr"),
        (ProtocolId::SetnxDel, "setnx"),
        (ProtocolId::SetnxExpire, "setnx"),
        (ProtocolId::Reentrant, "hincrby"),
    ] {
        let name = format!("orphan-{protocol}");
        let key = format!("{{{name}}}");
        let lock = Lock::new([relay.client()], &name, options(protocol)).unwrap();
        let before = redis.calls(grant).await;
        // Every reply on the connection that sends the grant is lost; the
        // clean-up goes out on a new connection.
        relay.arm(&key);
        let attempt = lock.try_acquire().await;
        relay.arm("never sent: disarmed");
        assert!(
            matches!(attempt, Err(Error::Unavailable(_))),
            "{protocol}: {attempt:?}"
        );
        assert!(
            redis.calls(grant).await > before,
            "{protocol}: the grant ran on the server"
        );
        let mut conn = redis.conn().await;
        let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg(&key)).await;
        assert_eq!(exists, 0, "{protocol}: the unanswered grant was undone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_ends_acquire_at_once() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "right-pw"])
        .map(Some)
        .or_else(|e| {
            if lockwright_tests::in_ci() {
                Err(e)
            } else {
                eprintln!("\n*** SKIPPED wrong password: {e} ***\n");
                Ok(None)
            }
        })
        .unwrap()
    else {
        return;
    };
    let url = format!("redis://:wrong-pw@127.0.0.1:{}/", redis.port());
    for protocol in [ProtocolId::SetPxLua, ProtocolId::SetPxWatch] {
        let lock = Lock::new([client(&url)], "auth", options(protocol)).unwrap();
        match acquire_error("wrong password", lock.acquire()).await {
            Error::Auth(text) => assert!(!text.contains("wrong-pw"), "{text}"),
            other => panic!("{protocol}: expected an authentication error, got {other:?}"),
        }
    }
    let right = format!("redis://:right-pw@127.0.0.1:{}/", redis.port());
    let lock = Lock::new([client(&right)], "auth", options(ProtocolId::SetPxLua)).unwrap();
    assert_eq!(lock.acquire().await.unwrap().release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_ends_acquire_at_once() {
    let lock = Lock::new(
        [client("redis://no-such-node.invalid:6379/")],
        "nowhere",
        options(ProtocolId::SetPxLua),
    )
    .unwrap();
    match acquire_error("unknown host", lock.acquire()).await {
        Error::UnknownHost(text) => assert!(text.contains("no-such-node.invalid")),
        other => panic!("expected an unknown host error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_until_the_deadline() {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let lock = Lock::new([client(&url)], "refused", options(ProtocolId::SetPxLua)).unwrap();
    // Not a permanent error: an acquire without deadline keeps trying.
    let forever = tokio::time::timeout(Duration::from_millis(500), lock.acquire()).await;
    assert!(forever.is_err(), "still retrying: {forever:?}");
    // With a deadline, the deadline's error names the connection problem.
    match lock.acquire_timeout(Duration::from_millis(300)).await {
        Err(Error::Unavailable(reason)) => assert!(!reason.is_empty()),
        other => panic!("expected Unavailable at the deadline, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_tells_taken_from_quorum_unreachable() {
    let (Some(a), Some(mut b), Some(mut c)) = (
        redis_or_skip("redlock quorum"),
        redis_or_skip("redlock quorum"),
        redis_or_skip("redlock quorum"),
    ) else {
        return;
    };
    let clients = || [a.client(), b.client(), c.client()];
    let holder = Lock::new(clients(), "rl", options(ProtocolId::Redlock)).unwrap();
    let held = holder.try_acquire().await.unwrap().expect("granted");
    let other = Lock::new(clients(), "rl", options(ProtocolId::Redlock)).unwrap();
    assert!(other.try_acquire().await.unwrap().is_none(), "taken");
    held.release().await.unwrap();

    b.kill();
    c.kill();
    match other.try_acquire().await {
        Err(Error::QuorumUnreachable {
            answered: 1,
            nodes: 3,
            quorum: 2,
            ..
        }) => {}
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
    match other.acquire_timeout(Duration::from_millis(300)).await {
        Err(Error::QuorumUnreachable { .. }) => {}
        other => panic!("expected QuorumUnreachable at the deadline, got {other:?}"),
    }
}

/// Put a value of the type no protocol of `protocol`'s kind uses under
/// `key`: a hash where strings and sorted sets live, a string where hashes
/// live.
async fn squat(redis: &RedisServer, protocol: ProtocolId, key: &str) {
    let mut conn = redis.conn().await;
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg(key)).await;
    if protocol == ProtocolId::Reentrant {
        let _: () = raw(&mut conn, redis::cmd("SET").arg(key).arg("squatter")).await;
    } else {
        let _: i64 = raw(&mut conn, redis::cmd("HSET").arg(key).arg("f").arg("v")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_protocol_surfaces_wrongtype() {
    let Some(redis) = redis_or_skip("wrongtype everywhere") else {
        return;
    };
    for protocol in ProtocolId::all().filter(|p| p.kind() == lockwright_core::Kind::Lock) {
        squat(&redis, protocol, "{typed}").await;
        let lock = Lock::new([redis.client()], "typed", options(protocol)).unwrap();
        match lock.try_acquire().await {
            Err(e) if e.is_wrong_type() => {}
            other => panic!("{protocol}: try_acquire: expected WRONGTYPE, got {other:?}"),
        }
        match acquire_error("wrong type", lock.acquire()).await {
            e if e.is_wrong_type() => {}
            other => panic!("{protocol}: acquire: expected WRONGTYPE, got {other:?}"),
        }
        // Waiting for release notices does not hide it either.
        let notified = LockOptions {
            notify: true,
            ..options(protocol)
        };
        let lock = Lock::new([redis.client()], "typed", notified).unwrap();
        match acquire_error("wrong type, notified", lock.acquire()).await {
            e if e.is_wrong_type() => {}
            other => panic!("{protocol}: notified acquire: expected WRONGTYPE, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_semaphore_protocol_surfaces_wrongtype() {
    let Some(redis) = redis_or_skip("wrongtype semaphores") else {
        return;
    };
    for protocol in ProtocolId::all().filter(|p| p.kind() == lockwright_core::Kind::Semaphore) {
        let mut conn = redis.conn().await;
        let _: () = raw(&mut conn, &mut redis::cmd("FLUSHALL")).await;
        let _: () = raw(&mut conn, redis::cmd("SET").arg("{sem}").arg("squatter")).await;
        for suffix in ["permits", "holders", "owner"] {
            let key = format!("{{sem}}:{suffix}");
            let _: () = raw(&mut conn, redis::cmd("SET").arg(key).arg("squatter")).await;
        }
        // watch-semaphore reads its size from a key an administrator sets.
        let _: () = raw(&mut conn, redis::cmd("SET").arg("{sem}:max").arg(2)).await;
        let sem = Semaphore::new(
            [redis.client()],
            "sem",
            LockOptions {
                limit: 2,
                ..options(protocol)
            },
        )
        .unwrap();
        match acquire_error("wrong type", sem.acquire()).await {
            e if e.is_wrong_type() => {}
            other => panic!("{protocol}: expected WRONGTYPE, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_cannot_be_issued_leaves_no_lock_key() {
    let Some(redis) = redis_or_skip("non-numeric fence") else {
        return;
    };
    let mut conn = redis.conn().await;
    let _: () = raw(
        &mut conn,
        redis::cmd("SET").arg("{fenced}:fence").arg("not-a-number"),
    )
    .await;
    let lock = Lock::new([redis.client()], "fenced", options(ProtocolId::Fenced)).unwrap();
    match lock.try_acquire().await {
        Err(Error::Redis(text)) => assert!(text.contains("not an integer"), "{text}"),
        other => panic!("expected the INCR error, got {other:?}"),
    }
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{fenced}")).await;
    assert_eq!(exists, 0, "no lock key left behind");

    let _: () = raw(
        &mut conn,
        redis::cmd("SET").arg("{permits}:fence").arg("not-a-number"),
    )
    .await;
    let sem = Semaphore::new(
        [redis.client()],
        "permits",
        LockOptions {
            limit: 2,
            ..options(ProtocolId::LeaseSemaphore)
        },
    )
    .unwrap();
    match sem.try_acquire().await {
        Err(Error::Redis(text)) => assert!(text.contains("not an integer"), "{text}"),
        other => panic!("expected the INCR error, got {other:?}"),
    }
    let left: i64 = raw(&mut conn, redis::cmd("ZCARD").arg("{permits}:permits")).await;
    assert_eq!(left, 0, "no permit left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_speak_redis_ends_acquire_at_once() {
    // A loopback listener that answers anything with bytes that are not
    // the Redis protocol.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 512];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(b"!not redis\r\n").is_err() {
                    break;
                }
            }
        }
    });
    let url = format!("redis://127.0.0.1:{port}/");
    let lock = Lock::new([client(&url)], "garbled", options(ProtocolId::SetPxLua)).unwrap();
    match acquire_error("not redis", lock.acquire()).await {
        Error::Protocol(_) => {}
        other => panic!("expected a protocol error, got {other:?}"),
    }
}
