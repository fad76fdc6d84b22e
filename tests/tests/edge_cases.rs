//! Hostile inputs and server states: typed errors or correct fallbacks, never
//! a panic.

use lockwright_core::config::MAX_TTL_MS;
use lockwright_core::{ConfigError, ProtocolId};
use lockwright_redis::{Error, Lock, LockOptions};
use lockwright_tests::{raw, redis_or_skip};
use std::time::Duration;

fn options(protocol: ProtocolId, ttl: Duration) -> LockOptions {
    LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(protocol, ttl)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_ttl_an_empty_name_and_a_brace_are_config_errors() {
    let Some(redis) = redis_or_skip("config") else {
        return;
    };
    let zero = Lock::new(
        [redis.client()],
        "a",
        options(ProtocolId::SetPxLua, Duration::ZERO),
    );
    assert_eq!(zero.map(|_| ()), Err(Error::Config(ConfigError::ZeroTtl)));
    let empty = Lock::new(
        [redis.client()],
        "",
        options(ProtocolId::SetPxLua, Duration::from_secs(1)),
    );
    assert_eq!(
        empty.map(|_| ()),
        Err(Error::Config(ConfigError::EmptyName))
    );
    let brace = Lock::new(
        [redis.client()],
        "a}b",
        options(ProtocolId::SetPxLua, Duration::from_secs(1)),
    );
    assert!(matches!(
        brace,
        Err(Error::Config(ConfigError::BraceInName(_)))
    ));
    let too_long = Lock::new(
        [redis.client()],
        "a",
        options(ProtocolId::SetPxLua, Duration::from_millis(MAX_TTL_MS + 1)),
    );
    assert!(matches!(
        too_long,
        Err(Error::Config(ConfigError::TtlTooLarge { .. }))
    ));
    let two_nodes = Lock::new(
        [redis.client(), redis.client()],
        "a",
        options(ProtocolId::SetPxLua, Duration::from_secs(1)),
    );
    assert!(matches!(
        two_nodes,
        Err(Error::Config(ConfigError::SingleNodeOnly { .. }))
    ));
    let huge = Lock::new(
        [redis.client()],
        "a",
        options(ProtocolId::SetPxLua, Duration::MAX),
    );
    assert!(matches!(
        huge,
        Err(Error::Config(ConfigError::TtlTooLarge { .. }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_ttl_works_end_to_end() {
    let Some(redis) = redis_or_skip("huge ttl") else {
        return;
    };
    for protocol in [ProtocolId::SetPxLua, ProtocolId::Fenced] {
        let lock = Lock::new(
            [redis.client()],
            "forever",
            options(protocol, Duration::from_millis(MAX_TTL_MS)),
        )
        .unwrap();
        let mut guard = lock.try_acquire().await.unwrap().expect("granted");
        assert!(
            guard.remaining() > Duration::from_secs(86_400 * 365),
            "{protocol}"
        );
        let mut conn = redis.conn().await;
        let pttl: i64 = raw(&mut conn, redis::cmd("PTTL").arg("{forever}")).await;
        assert!(pttl > 1 << 52, "{protocol}: PTTL {pttl}");
        guard.extend().await.unwrap();
        assert_eq!(guard.release().await, Ok(true), "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrongtype_lock_key_gives_typed_errors_not_panics() {
    let Some(redis) = redis_or_skip("wrongtype") else {
        return;
    };
    let mut conn = redis.conn().await;
    // A hash already sits under the lock key: SET NX does not touch it, and
    // the adapter says why the lock cannot be taken.
    let _: i64 = raw(
        &mut conn,
        redis::cmd("HSET").arg("{typed}").arg("f").arg("v"),
    )
    .await;
    let lock = Lock::new(
        [redis.client()],
        "typed",
        options(ProtocolId::SetPxLua, Duration::from_secs(5)),
    )
    .unwrap();
    match lock.try_acquire().await {
        Err(e) => assert!(e.is_wrong_type(), "{e}"),
        Ok(guard) => panic!("expected WRONGTYPE, got {guard:?}"),
    }
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{typed}")).await;

    // Held, then someone turns the key into a hash: the release script's GET
    // fails with WRONGTYPE, which comes back whole as a typed error.
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{typed}")).await;
    let _: i64 = raw(
        &mut conn,
        redis::cmd("HSET").arg("{typed}").arg("f").arg("v"),
    )
    .await;
    match guard.release().await {
        Err(Error::Redis(text)) => assert!(
            text.contains("WRONGTYPE Operation against a key holding the wrong kind of value"),
            "{text}"
        ),
        other => panic!("expected a WRONGTYPE error, got {other:?}"),
    }

    // The reentrant lock reads the key as a hash: a string there is WRONGTYPE
    // on acquire already.
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg("{typed}")).await;
    let _: () = raw(&mut conn, redis::cmd("SET").arg("{typed}").arg("x")).await;
    let reentrant = Lock::new(
        [redis.client()],
        "typed",
        options(ProtocolId::Reentrant, Duration::from_secs(5)),
    );
    let reentrant = reentrant.expect("a reentrant lock");
    match reentrant.try_acquire().await {
        Err(Error::Redis(text)) => assert!(text.contains("WRONGTYPE"), "{text}"),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_falls_back_to_eval() {
    let Some(redis) = redis_or_skip("noscript") else {
        return;
    };
    let mut conn = redis.conn().await;
    let lock = Lock::new(
        [redis.client()],
        "scripted",
        options(ProtocolId::Fenced, Duration::from_secs(5)),
    )
    .unwrap();
    let mut guard = lock.try_acquire().await.unwrap().expect("granted");
    let _: () = raw(&mut conn, redis::cmd("SCRIPT").arg("FLUSH")).await;
    guard.extend().await.expect("extend after SCRIPT FLUSH");
    let _: () = raw(&mut conn, redis::cmd("SCRIPT").arg("FLUSH")).await;
    assert_eq!(
        guard.release().await,
        Ok(true),
        "release after SCRIPT FLUSH"
    );
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{scripted}")).await;
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_a_typed_error() {
    let Some(redis) = redis_or_skip("unreachable") else {
        return;
    };
    let port = redis.port();
    drop(redis);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let lock = Lock::new(
        [client],
        "gone",
        options(ProtocolId::SetPxLua, Duration::from_secs(1)),
    )
    .unwrap();
    match lock.try_acquire().await {
        Err(Error::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_output_never_shows_the_password() {
    let client = redis::Client::open("redis://user:s3cret-pw@127.0.0.1:1/").unwrap();
    let lock = Lock::new(
        [client],
        "a",
        options(ProtocolId::SetPxLua, Duration::from_secs(1)),
    )
    .unwrap();
    let shown = format!("{lock:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("127.0.0.1:1"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_a_replica_on_a_lone_master_is_a_typed_error_and_undoes_the_grant() {
    let Some(redis) = redis_or_skip("wait replicas") else {
        return;
    };
    let opts = LockOptions {
        wait_replicas: Some(1),
        ..options(ProtocolId::SetPxLua, Duration::from_secs(1))
    };
    let lock = Lock::new([redis.client()], "replicated", opts).unwrap();
    assert_eq!(
        lock.try_acquire().await.map(|_| ()),
        Err(Error::ReplicasNotAcknowledged {
            wanted: 1,
            acknowledged: 0
        })
    );
    let mut conn = redis.conn().await;
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{replicated}")).await;
    assert_eq!(exists, 0, "the unacknowledged grant was undone");
}

/// A server busy for longer than redis-rs' own default reply timeout (500 ms)
/// but well within the lock's `request_timeout`: the acquire waits for the
/// reply and gets the lock. (The connection's library timeout used to cut
/// every reply off at 500 ms, whatever `request_timeout` said.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_the_lock_s_own_not_the_client_library_s() {
    let Some(redis) = redis_or_skip("request timeout") else {
        return;
    };
    let lock = Lock::new(
        [redis.client()],
        "slow-server",
        LockOptions {
            request_timeout: Duration::from_secs(4),
            ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(10))
        },
    )
    .expect("valid options");
    // Connect first, so that the acquire below is not waiting to connect.
    drop(lock.try_acquire().await.expect("an idle server answers"));
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut busy = redis
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    // A script that keeps the server busy for 1.2 s: every other client's
    // command waits for it.
    let spin = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') \
                 local from = t[1] * 1000000 + t[2] \
                 repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - from > 1200000 \
                 return 1",
            )
            .arg(0)
            .query_async::<i64>(&mut busy)
            .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = std::time::Instant::now();
    let got = lock.try_acquire().await;
    let waited = started.elapsed();
    assert_eq!(
        spin.await.expect("the spin task").expect("the script ran"),
        1
    );
    let guard = got
        .expect("a reply within the 4 s request timeout is an answer")
        .expect("nobody else holds the lock");
    assert!(
        waited >= Duration::from_millis(600),
        "the acquire waited for the busy server ({waited:?}), so the reply came after 500 ms"
    );
    assert!(guard.release().await.expect("released"));
}

/// A `Lock` used from one runtime and then from another: the shared
/// connection's I/O task ran on the first runtime and ended with it, so the
/// connection is dead though the server never closed it. The next request,
/// from the second runtime, must open a new connection before it is written,
/// not be written to the dead one and come back as an unknown outcome (the
/// command never reached the server). `set-px-watch` is the control: its
/// holds open a connection of their own, on the runtime of the moment.
#[test]
fn a_connection_whose_runtime_ended_is_reopened_before_a_request_is_written() {
    let Some(redis) = redis_or_skip("a connection whose runtime ended") else {
        return;
    };
    for protocol in [
        ProtocolId::SetPxLua,
        ProtocolId::Redlock,
        ProtocolId::SetPxWatch,
    ] {
        let lock = Lock::new(
            [redis.client()],
            "runtimes",
            options(protocol, Duration::from_secs(5)),
        )
        .unwrap();
        for round in 0..3 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                // One attempt: an unknown outcome is not retried over.
                let guard = lock
                    .try_acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{protocol}, runtime {round}: acquire: {e}"))
                    .unwrap_or_else(|| panic!("{protocol}, runtime {round}: not granted"));
                let released = guard
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("{protocol}, runtime {round}: release: {e}"));
                assert!(
                    released,
                    "{protocol}, runtime {round}: release not confirmed"
                );
            });
            drop(rt);
        }
    }
}
