//! Lost replies, cancelled acquires and locally expired guards: the
//! adapter reports what Redis said (or that nobody knows), and leaves no
//! hold of ours behind. Replies are lost by a relay (`ReplyLoss`) in front
//! of a real `redis-server`: the requests run, their answers never come.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions, Operation};
use lockwright_tests::{raw, redis_or_skip, ReplyLoss};
use std::time::Duration;

/// A guard whose local validity ran out (drift allowance) while its key is
/// still on the server: `release()` still asks Redis, with the token, and
/// removes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_local_expiry_says_gone_while_the_key_stands() {
    let Some(redis) = redis_or_skip("release after local expiry") else {
        return;
    };
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        drift: Some(Duration::from_millis(1500)),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(3))
    };
    let lock = Lock::new([redis.client()], "drifted", options).unwrap();
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(guard.is_lost());
    let before = redis.pttl("{drifted}").await;
    let released = guard.release().await;
    let left = redis.exists("{drifted}").await;
    assert_eq!(released, Ok(true), "PTTL before the release: {before} ms");
    assert_eq!(left, 0, "the key was removed");
}

/// The same for a reentrant hold entered three times: the release by token
/// takes every level off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_local_expiry_takes_every_reentrant_level_off() {
    let Some(redis) = redis_or_skip("reentrant release after local expiry") else {
        return;
    };
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        drift: Some(Duration::from_millis(1500)),
        ..LockOptions::new(ProtocolId::Reentrant, Duration::from_secs(3))
    };
    let lock = Lock::new([redis.client()], "levels", options).unwrap();
    let mut guard = lock.try_acquire().await.unwrap().expect("granted");
    assert_eq!(guard.reenter().await, Ok(2));
    assert_eq!(guard.reenter().await, Ok(3));
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(guard.is_lost());
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(redis.exists("{levels}").await, 0, "no level left");
}

/// A renewing guard whose renewals run but whose replies are lost (an
/// asymmetric fault): the guard reports itself lost, and `release()` does
/// not answer "gone" unless the key is gone: it releases by token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_loss_by_unanswered_renewals_is_not_known_gone() {
    let Some(redis) = redis_or_skip("release after loss, lost replies") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let options = LockOptions {
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::Fenced, Duration::from_millis(1500))
    };
    assert!(options.auto_renew);
    let lock = Lock::new([relay.client()], "renew-lost", options).unwrap();
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    relay.arm("{renew-lost}");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost while renewal replies are lost");
    let left_before = redis.pttl("{renew-lost}").await;
    let released = guard.release().await;
    relay.arm("never sent: disarmed");
    let left = redis.pttl("{renew-lost}").await;
    assert!(
        !matches!(released, Ok(false)) || left == -2,
        "release() = {released:?} although Redis never answered; the key is still \
         there with PTTL {left} ms (before the release: {left_before} ms)"
    );
}

/// An extend whose request gets no reply and whose wait outlives the lease
/// is an unknown outcome, not a loss (the extend may have run and the key
/// then stands for a new TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_extend_past_validity_is_unknown_not_lost() {
    let Some(redis) = redis_or_skip("unanswered extend past validity") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let mut failures = Vec::new();
    for protocol in [ProtocolId::SetPxLua, ProtocolId::Reentrant] {
        let name = format!("late-extend-{protocol}");
        let key = format!("{{{name}}}");
        let options = LockOptions {
            auto_renew: false,
            request_timeout: Duration::from_millis(600),
            ..LockOptions::new(protocol, Duration::from_millis(1000))
        };
        let lock = Lock::new([relay.client()], &name, options).unwrap();
        let mut guard = lock.try_acquire().await.unwrap().expect("granted");
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The extend runs on the server; its reply is lost.
        relay.arm(&key);
        let extended = guard.extend().await;
        relay.arm("never sent: disarmed");
        let left = redis.pttl(&key).await;
        let released = guard.release().await;
        let after = redis.exists(&key).await;
        let mut conn = redis.conn().await;
        let _: i64 = raw(&mut conn, redis::cmd("DEL").arg(&key)).await;
        if !matches!(
            extended,
            Err(Error::OutcomeUnknown {
                operation: Operation::Extend,
                ..
            })
        ) {
            failures.push(format!(
                "{protocol}: extend() = {extended:?}; the key's PTTL then: {left} ms; \
                 then release() = {released:?} and the key exists: {after}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// An acquire future dropped (here by `tokio::time::timeout`) after a grant
/// request that ran without a reply: the undo still runs (in the
/// background), so no key of ours stays (under `setnx-del`, for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_after_an_unanswered_grant_leaves_no_hold() {
    let Some(redis) = redis_or_skip("cancelled acquire, lost reply") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let mut failures = Vec::new();
    for protocol in [
        ProtocolId::SetnxDel,
        ProtocolId::SetPxLua,
        ProtocolId::Reentrant,
    ] {
        let name = format!("cancelled-{protocol}");
        let key = format!("{{{name}}}");
        let options = LockOptions {
            auto_renew: false,
            request_timeout: Duration::from_millis(300),
            ..LockOptions::new(protocol, Duration::from_secs(10))
        };
        let lock = Lock::new([relay.client()], &name, options).unwrap();
        relay.arm(&key);
        let cancelled = tokio::time::timeout(Duration::from_millis(1500), lock.acquire()).await;
        assert!(cancelled.is_err(), "{protocol}: {cancelled:?}");
        relay.arm("never sent: disarmed");
        // Let the driver finish in the background.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let left = redis.exists(&key).await;
        let ttl = redis.pttl(&key).await;
        let mut conn = redis.conn().await;
        let _: i64 = raw(&mut conn, redis::cmd("DEL").arg(&key)).await;
        if left != 0 {
            failures.push(format!(
                "{protocol}: the cancelled acquire left its hold (PTTL {ttl})"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `acquire()` without a deadline, after one grant ran without a reply:
/// the grant is undone by its token before the next attempt (which runs
/// under a new token), so the acquire gets the free lock once the fault is
/// gone instead of waiting for its own hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_does_not_wait_for_its_own_unanswered_grant() {
    let Some(redis) = redis_or_skip("self-deadlock after lost reply") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let name = "selfblock";
    let key = "{selfblock}";
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::SetnxDel, Duration::from_secs(10))
    };
    let lock = Lock::new([relay.client()], name, options).unwrap();
    relay.arm(key);
    let acquire = tokio::spawn({
        let lock = lock.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), lock.acquire()).await }
    });
    // Past the first attempt (whose own undo runs) into the waiting phase.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The fault is gone; nobody else holds the lock.
    relay.arm("never sent: disarmed");
    let got = acquire.await.unwrap();
    let left = redis.exists(key).await;
    let mut conn = redis.conn().await;
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg(key)).await;
    assert!(
        matches!(got, Ok(Ok(_))),
        "acquire() still waiting after 5 s for a lock only its own unanswered \
         SETNX holds (key exists: {left}): {got:?}"
    );
}

/// The README's adapter example, as written (a compile check).
#[allow(dead_code)]
mod readme {
    use lockwright_redis::{redis, Lock, LockOptions, Nodes, ProtocolId};
    use std::time::Duration;

    async fn demo() -> Result<(), lockwright_redis::Error> {
        let open = |url: &str| redis::Client::open(url).expect("a valid URL");
        let t = Duration::from_secs(1);
        // One node; a Sentinel group (follows failover); a Redis Cluster.
        let single = Nodes::new([open("redis://127.0.0.1:6379/")]);
        let sentinel = Nodes::sentinel(
            [open("redis://127.0.0.1:26379/")],
            "mymaster",
            open("redis://127.0.0.1/"),
            t,
        )?;
        let cluster = Nodes::cluster([open("redis://127.0.0.1:7000/")], t)?;
        for nodes in [single, sentinel, cluster] {
            let lock = Lock::on(
                &nodes,
                "invoices",
                LockOptions::new(ProtocolId::Fenced, Duration::from_secs(5)),
            )?;
            let guard = lock.acquire().await?;
            guard.release().await?;
        }
        Ok(())
    }
}

/// `calls` of `command` in the server's `INFO commandstats`.
async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = raw(conn, redis::cmd("INFO").arg("commandstats")).await;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Wait until the server has run `command` at least `n` times.
async fn until_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str, n: u64) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while calls(conn, command).await < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the server never ran {command} {n} times");
}

/// An acquire attempt without a reply is undone by token; when that undo
/// gets no reply either, it is sent again, queued behind the next attempt.
/// If that attempt is granted, the resend must not delete the hold just
/// granted (it runs under a new token, so the resend matches nothing of
/// it; with the retry under the same token the queued resend is withdrawn
/// instead). Scripted on the
/// server's command counts: the second `SET` (the waiting acquire's first
/// attempt) loses its reply, its undo (the second `EVALSHA`) loses its
/// reply, then the fault is gone and the retry is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_retry_is_not_undone_by_a_resent_undo() {
    let Some(redis) = redis_or_skip("granted retry vs resent undo") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let mut stats = redis.conn().await;
    let _: () = raw(&mut stats, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let key = "{undone}";
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(20),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(10))
    };
    let lock = Lock::new([relay.client()], "undone", options).unwrap();
    // Every connection that sends a SET loses its replies: the first
    // attempt (one of its own) and the waiting acquire's first attempt.
    relay.arm("$3\r\nSET\r\n");
    let acquire = tokio::spawn({
        let lock = lock.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                lock.acquire_timeout(Duration::from_secs(8)),
            )
            .await
        }
    });
    until_calls(&mut stats, "set", 2).await;
    // The second attempt is on its way: its undo loses its reply too.
    relay.arm(key);
    until_calls(&mut stats, "evalsha", 2).await;
    // That undo is on its way; from now on new connections pass.
    relay.arm("never sent: disarmed");
    let guard = match acquire.await.unwrap() {
        Ok(Ok(guard)) => guard,
        other => panic!("the retry after the fault should be granted: {other:?}"),
    };
    assert_eq!(redis.exists(key).await, 1, "granted, so the key is there");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        redis.exists(key).await,
        1,
        "still held: no undo ran after the grant"
    );
    assert_eq!(
        guard.release().await,
        Ok(true),
        "the release found the hold (a resent undo had not removed it)"
    );
    assert_eq!(redis.exists(key).await, 0);
}

/// A hold run by its guard's calls (no renewal): its acquire was answered,
/// its release is not. The release is an unknown outcome once the request
/// timeout has passed, not when the lease runs out 20 s later: the hold's
/// one reply timer, armed for the acquire and fired since, is armed again
/// for the release. (A first hold on the lock opens the connection, so
/// that the second hold's requests are timed by that timer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_is_unknown_after_the_request_timeout() {
    let Some(redis) = redis_or_skip("unanswered release") else {
        return;
    };
    let relay = ReplyLoss::start(redis.port()).await;
    redis.load_scripts().await;
    let key = "{late-release}";
    let options = LockOptions {
        auto_renew: false,
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(20))
    };
    let lock = Lock::new([relay.client()], "late-release", options).unwrap();
    let first = lock.try_acquire().await.unwrap().expect("granted");
    assert_eq!(first.release().await, Ok(true));
    let guard = lock.try_acquire().await.unwrap().expect("granted again");
    // Past the acquire's reply deadline: the timer armed for it fires.
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.arm(key);
    let started = std::time::Instant::now();
    let released = tokio::time::timeout(Duration::from_secs(30), guard.release()).await;
    let took = started.elapsed();
    relay.arm("never sent: disarmed");
    let mut conn = redis.conn().await;
    let _: i64 = raw(&mut conn, redis::cmd("DEL").arg(key)).await;
    assert!(
        matches!(
            released,
            Ok(Err(Error::OutcomeUnknown {
                operation: Operation::Release,
                ..
            }))
        ),
        "release() = {released:?}"
    );
    // Ten times the request timeout: a bound on a hang, not a speed check.
    assert!(
        took < Duration::from_secs(3),
        "the unanswered release was reported after {took:?}, not after the 300 ms request timeout"
    );
}

/// A renewal, or an extend of the application's, that gets no reply leaves
/// the hold standing on its old lease, and renewal tries again: the hold
/// outlives its TTL several times over. Writes are held up at the server
/// (`CLIENT PAUSE … WRITE`) past the request timeout, so the request runs
/// late and its reply is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_goes_on_after_a_renewal_or_an_extend_without_a_reply() {
    let Some(redis) = redis_or_skip("renewal after an unanswered renewal") else {
        return;
    };
    for protocol in [
        ProtocolId::Fenced,
        ProtocolId::TimeFenced,
        ProtocolId::Reentrant,
    ] {
        let options = LockOptions {
            auto_renew: true,
            request_timeout: Duration::from_millis(150),
            ..LockOptions::new(protocol, Duration::from_millis(1_500))
        };
        let name = format!("renew-on-{protocol}");
        let lock = Lock::new([redis.client()], name.as_str(), options).unwrap();
        let mut guard = lock.acquire().await.unwrap();
        let mut conn = redis.conn().await;
        // The application's extend, unanswered within its timeout.
        let _: () = raw(
            &mut conn,
            redis::cmd("CLIENT").arg("PAUSE").arg(400).arg("WRITE"),
        )
        .await;
        assert!(
            matches!(
                guard.extend().await,
                Err(Error::OutcomeUnknown {
                    operation: Operation::Extend,
                    ..
                })
            ),
            "{protocol}: the extend got no reply in time"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The next renewal (due about 0.5 s after the extend) unanswered too.
        let _: () = raw(
            &mut conn,
            redis::cmd("CLIENT").arg("PAUSE").arg(400).arg("WRITE"),
        )
        .await;
        // Four TTLs later: renewed all along.
        tokio::time::sleep(Duration::from_millis(6_000)).await;
        assert!(guard.is_held(), "{protocol}: renewal went on: {guard:?}");
        assert!(!guard.is_lost(), "{protocol}");
        assert!(
            redis.pttl(&lock.key()).await > 0,
            "{protocol}: the key stands"
        );
        assert_eq!(guard.release().await, Ok(true), "{protocol}");
    }
}

/// With the default request timeout (1 s) and a 2 s TTL, a renewal held
/// up at the server past the request timeout is unanswered at about
/// 1.67 s, with 0.3 s of the lease left: the retry comes within it (a
/// third of a TTL later would be after the lease's end), and Redis
/// answers again from about 1.75 s on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_renewal_with_the_default_request_timeout_is_retried() {
    let Some(redis) = redis_or_skip("renewal retried within the lease") else {
        return;
    };
    let options = LockOptions {
        auto_renew: true,
        ..LockOptions::new(ProtocolId::Fenced, Duration::from_millis(2_000))
    };
    assert_eq!(
        options.request_timeout,
        Duration::from_secs(1),
        "the default"
    );
    let lock = Lock::new([redis.client()], "renew-late", options).unwrap();
    let guard = lock.acquire().await.unwrap();
    let mut conn = redis.conn().await;
    tokio::time::sleep(Duration::from_millis(550)).await;
    // Writes held up from 0.55 s to 1.75 s: the renewal (0.67 s) runs late
    // and is never answered within its 1 s.
    let _: () = raw(
        &mut conn,
        redis::cmd("CLIENT").arg("PAUSE").arg(1_200).arg("WRITE"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        guard.is_held(),
        "lost after one unanswered renewal, no retry within the lease: {guard:?}"
    );
    let _ = guard.release().await;
}
