//! Connections killed mid-acquire (`CLIENT KILL`) and acquire futures dropped
//! part-way leave no lock beyond its TTL.

use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use lockwright_tests::{raw, redis_or_skip};
use std::future::Future;
use std::time::Duration;

const TTL_MS: u64 = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_and_dropped_acquires_leave_no_lock_beyond_its_ttl() {
    let Some(redis) = redis_or_skip("client kill") else {
        return;
    };
    for protocol in [
        ProtocolId::SetPxLua,
        ProtocolId::Fenced,
        ProtocolId::SetPxWatch,
        ProtocolId::Reentrant,
    ] {
        let options = LockOptions {
            auto_renew: false,
            request_timeout: Duration::from_millis(200),
            ..LockOptions::new(protocol, Duration::from_millis(TTL_MS))
        };
        let lock = Lock::new([redis.client()], "killed", options).unwrap();
        // Acquires that are cut short at different points while a killer
        // drops every other connection.
        let killer = {
            let mut killer_conn = redis.conn().await;
            tokio::spawn(async move {
                let mut killed = 0;
                for _ in 0..40 {
                    let n: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("normal")
                        .arg("SKIPME")
                        .arg("yes")
                        .query_async(&mut killer_conn)
                        .await;
                    killed += n.unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                killed
            })
        };
        let (mut granted, mut cut) = (0, 0);
        // 40 attempts, and more (up to 200) until one was granted and one
        // cut short.
        for i in 0..200u64 {
            if i >= 40 && granted > 0 && cut > 0 {
                break;
            }
            let attempt = lock.acquire_timeout(Duration::from_millis(100));
            if i >= 40 && cut == 0 {
                // No cut-off has cut one short yet (on loopback a grant can
                // come before tokio's 1 ms timer turns): drop this one
                // after its first poll, which starts the request.
                let mut attempt = std::pin::pin!(attempt);
                let first =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(attempt.as_mut().poll(cx)))
                        .await;
                match first {
                    std::task::Poll::Ready(Ok(_guard)) => granted += 1,
                    std::task::Poll::Ready(Err(_)) => {}
                    std::task::Poll::Pending => cut += 1,
                }
                continue;
            }
            // Drop the future after a varying delay: part-way or after the grant.
            // Past the first 40, a generous cut-off: a grant needs a
            // connect and a round trip, which a loaded machine may not
            // finish in a few milliseconds.
            let cut_off = if i < 40 {
                Duration::from_micros(100 + i * 150)
            } else {
                Duration::from_millis(50)
            };
            match tokio::time::timeout(cut_off, attempt).await {
                Ok(Ok(_guard)) => granted += 1,
                Ok(Err(_)) => {}
                Err(_) => cut += 1,
            }
        }
        let killed = killer.await.unwrap();
        // The run did what it is for: connections were killed, some
        // acquires were granted (so the lock key was written during the
        // kills) and some were cut short.
        eprintln!("{protocol}: {killed} connections killed, {granted} granted, {cut} cut short");
        assert!(killed > 0, "{protocol}: no connection was killed");
        assert!(granted > 0, "{protocol}: no acquire was granted");
        assert!(cut > 0, "{protocol}: no acquire was cut short");
        // Whatever happened, within the TTL (plus slack) the key is gone
        // and the lock can be taken again.
        tokio::time::sleep(Duration::from_millis(TTL_MS + 200)).await;
        let mut check = redis.conn().await;
        let exists: i64 = raw(&mut check, redis::cmd("EXISTS").arg("{killed}")).await;
        assert_eq!(exists, 0, "{protocol}: no lock beyond its TTL");
        let guard = lock
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{protocol}: {e}"))
            .unwrap_or_else(|| panic!("{protocol}: free after the TTL"));
        assert_eq!(guard.release().await, Ok(true), "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_gives_back_a_grant_before_the_ttl() {
    let Some(redis) = redis_or_skip("dropped acquire") else {
        return;
    };
    let options = LockOptions {
        auto_renew: false,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(60))
    };
    let lock = Lock::new([redis.client()], "abandoned", options).unwrap();
    let sets = redis.calls("set").await;
    let evals = redis.calls("evalsha").await + redis.calls("eval").await;
    // Start an acquire and drop it at once: the driver keeps going, and
    // gives back the grant it gets.
    let attempt = lock.acquire();
    let _ = tokio::time::timeout(Duration::from_micros(1), attempt).await;
    // The dropped acquire's SET reached the server, and its grant was
    // given back (the release's EVALSHA ran, or its EVAL after NOSCRIPT).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while redis.calls("set").await == sets
        || redis.calls("evalsha").await + redis.calls("eval").await == evals
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped acquire's driver sent no SET, or no release"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Far before the 60 s TTL the lock is free.
    let guard = lock
        .acquire_timeout(Duration::from_secs(2))
        .await
        .expect("the abandoned grant was released");
    assert_eq!(guard.release().await, Ok(true));
}
