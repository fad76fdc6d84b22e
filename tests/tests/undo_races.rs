//! Undoing an unanswered acquire attempt by token races with the machine's
//! retry: a relay that loses replies, drops requests and adds a 5 ms round
//! trip shows that the undo never takes off a hold the retry was granted,
//! and that an undo that itself got no reply is sent again, so the attempt
//! cannot block the lock (under `setnx-del`, for ever).

use lockwright_core::keyspace::Script;
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use lockwright_tests::{redis_or_skip, Fate, Relay};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Plan {
    locks: AtomicUsize,
    unlocks: AtomicUsize,
    lock_needle: &'static str,
    unlock_needle: &'static str,
    lock_fates: Vec<Fate>,
    unlock_fates: Vec<Fate>,
}

impl Plan {
    fn decide(&self, chunk: &[u8]) -> Fate {
        let has = |s: &str| chunk.windows(s.len()).any(|w| w == s.as_bytes());
        if has(self.lock_needle) {
            let n = self.locks.fetch_add(1, Ordering::SeqCst);
            return self.lock_fates.get(n).copied().unwrap_or(Fate::Pass);
        }
        if has(self.unlock_needle) {
            let n = self.unlocks.fetch_add(1, Ordering::SeqCst);
            return self.unlock_fates.get(n).copied().unwrap_or(Fate::Pass);
        }
        Fate::Pass
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_reentrant_hold_survives_the_undo_of_earlier_attempts() {
    let Some(redis) = redis_or_skip("reentrant undo after grant") else {
        return;
    };
    redis.load_scripts().await;
    // Attempt 1 (the first, one-shot acquire, token T1): lost reply, its
    // undo runs. Then the waiting acquire (token T2): attempt 2 runs with
    // its reply lost and its undo never reaches Redis; attempt 3 runs with
    // its reply lost (count 2), its undo runs (count 1, answers 0) while
    // attempt 4 waits behind it; attempt 4 is granted (count 2); the
    // undo's later rounds then take the count to 0 and delete the key.
    use Fate::*;
    let plan = Arc::new(Plan {
        locks: AtomicUsize::new(0),
        unlocks: AtomicUsize::new(0),
        lock_needle: Script::ReentrantLock.sha1(),
        unlock_needle: Script::ReentrantUnlock.sha1(),
        lock_fates: vec![LoseReplies, LoseReplies, LoseReplies],
        unlock_fates: vec![Pass, DropRequests],
    });
    // A network with a 5 ms round trip.
    let relay = Relay::start(redis.port(), Duration::from_millis(5), {
        let plan = plan.clone();
        move |chunk| plan.decide(chunk)
    })
    .await;
    let client = relay.client();
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(1),
        retry_max: Duration::from_millis(1),
        ..LockOptions::new(ProtocolId::Reentrant, Duration::from_secs(10))
    };
    let lock = Lock::new([client], "undo-race", options).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await;
    let Ok(Ok(guard)) = got else {
        let mut conn = redis.conn().await;
        let h: std::collections::HashMap<String, i64> =
            lockwright_tests::raw(&mut conn, redis::cmd("HGETALL").arg("{undo-race}")).await;
        let keys: Vec<String> = lockwright_tests::raw(&mut conn, redis::cmd("KEYS").arg("*")).await;
        let ty: String =
            lockwright_tests::raw(&mut conn, redis::cmd("TYPE").arg("{undo-race}")).await;
        panic!(
            "keys {keys:?} type {ty}; acquire: {got:?}; lock scripts {}, unlock scripts {}; hash {h:?}",
            plan.locks.load(Ordering::SeqCst),
            plan.unlocks.load(Ordering::SeqCst)
        );
    };
    let exists = redis.exists("{undo-race}").await;
    let locks = plan.locks.load(Ordering::SeqCst);
    let unlocks = plan.unlocks.load(Ordering::SeqCst);
    let lost = guard.is_lost();
    eprintln!("after grant: exists {exists}");
    assert_eq!(
        exists, 1,
        "acquire() granted (is_lost = {lost}), yet the key is gone from Redis: the \
         undo's later rounds ran after the retry's grant (lock scripts {locks}, \
         unlock scripts {unlocks})"
    );
}

/// A one-shot acquire whose `SETNX` runs without a reply and whose undo
/// (compare-and-delete by token) is dropped too: the undo is sent again, so
/// the next attempt (a new token) is not blocked by the first one's key,
/// which under `setnx-del` (no TTL) would stay for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_undo_is_sent_again_and_does_not_block_the_next_attempt() {
    let Some(redis) = redis_or_skip("unanswered undo") else {
        return;
    };
    redis.load_scripts().await;
    use Fate::*;
    let plan = Arc::new(Plan {
        locks: AtomicUsize::new(0),
        unlocks: AtomicUsize::new(0),
        lock_needle: "SETNX",
        unlock_needle: Script::CompareAndDelete.sha1(),
        lock_fates: vec![LoseReplies],
        unlock_fates: vec![DropRequests],
    });
    // A network with a 5 ms round trip.
    let relay = Relay::start(redis.port(), Duration::from_millis(5), {
        let plan = plan.clone();
        move |chunk| plan.decide(chunk)
    })
    .await;
    let client = relay.client();
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::SetnxDel, Duration::from_secs(10))
    };
    let lock = Lock::new([client], "orphan", options).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), lock.acquire()).await;
    let pttl = redis.pttl("{orphan}").await;
    assert!(
        matches!(got, Ok(Ok(_))),
        "acquire() after the fault is gone: {got:?}; the key left by the first \
         attempt has PTTL {pttl} (-1: no TTL, for ever); lock requests {}, undo requests {}",
        plan.locks.load(Ordering::SeqCst),
        plan.unlocks.load(Ordering::SeqCst)
    );
}

/// What a held-back undo left of a hold granted after it.
#[derive(Debug, PartialEq, Eq)]
enum AfterTheUndo {
    /// The key still names the holder.
    Held,
    /// The key is gone or names nobody we know: the undo removed the
    /// retry's hold, and a rival could take the lock beside its holder.
    Removed(String),
}

/// An unanswered acquire attempt (its request never reaches Redis), whose
/// undo is held up on the network past its reply timeout; the acquire's
/// next attempt goes out on a new connection and is granted; then the
/// held undo reaches Redis and runs. `one_token`: the deliberate bug of
/// retrying under the unanswered attempt's token.
async fn held_back_undo(protocol: ProtocolId, one_token: bool) -> Option<AfterTheUndo> {
    let redis = redis_or_skip("held-back undo")?;
    redis.load_scripts().await;
    let (lock_needle, unlock_needle) = match protocol {
        ProtocolId::SetnxDel => ("$5\r\nSETNX\r\n", Script::CompareAndDelete.sha1()),
        ProtocolId::Reentrant => (Script::ReentrantLock.sha1(), Script::ReentrantUnlock.sha1()),
        ProtocolId::Fenced => (
            Script::FencedAcquire.sha1(),
            Script::CompareAndDelete.sha1(),
        ),
        _ => ("$3\r\nSET\r\n", Script::CompareAndDelete.sha1()),
    };
    use Fate::*;
    let plan = Arc::new(Plan {
        locks: AtomicUsize::new(0),
        unlocks: AtomicUsize::new(0),
        lock_needle,
        unlock_needle,
        // The first attempt (a one-shot attempt of its own) finds a rival's
        // key; the waiting acquire's first attempt is lost.
        lock_fates: vec![Pass, DropRequests],
        unlock_fates: vec![HoldRequests],
    });
    let relay = Relay::start(redis.port(), Duration::ZERO, {
        let plan = plan.clone();
        move |chunk| plan.decide(chunk)
    })
    .await;
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(200),
        retry_base: Duration::from_millis(300),
        retry_max: Duration::from_millis(300),
        ..LockOptions::new(protocol, Duration::from_secs(30))
    };
    let name = "held-undo";
    // A rival's hold, gone before the retry.
    let mut conn = redis.conn().await;
    let mut rival = if protocol == ProtocolId::Reentrant {
        redis::cmd("HSET")
            .arg("{held-undo}")
            .arg("rival")
            .arg(1)
            .clone()
    } else {
        redis::cmd("SET").arg("{held-undo}").arg("rival").clone()
    };
    let _: redis::Value = lockwright_tests::raw(&mut conn, &mut rival).await;
    let _: i64 =
        lockwright_tests::raw(&mut conn, redis::cmd("PEXPIRE").arg("{held-undo}").arg(150)).await;
    let mut lock = Lock::new([relay.client()], name, options).unwrap();
    if one_token {
        lock = lock.retrying_under_one_token();
    }
    let got = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await;
    let Ok(Ok(guard)) = got else {
        panic!("{protocol}: acquire after one unanswered attempt: {got:?}");
    };
    let attempts = plan.locks.load(Ordering::SeqCst);
    let undos = plan.unlocks.load(Ordering::SeqCst);
    assert!(
        attempts >= 3 && undos >= 1,
        "{protocol}: the fault did not happen as planned ({attempts} attempts, {undos} undos)"
    );
    let token = guard.token().0.to_string();
    let key = lock.key();
    let holds = |conn: &mut redis::aio::MultiplexedConnection| {
        let key = key.clone();
        let token = token.clone();
        let mut conn = conn.clone();
        async move {
            if protocol == ProtocolId::Reentrant {
                let levels: Option<i64> =
                    lockwright_tests::raw(&mut conn, redis::cmd("HGET").arg(&key).arg(&token))
                        .await;
                match levels {
                    Some(n) if n > 0 => AfterTheUndo::Held,
                    other => AfterTheUndo::Removed(format!("levels {other:?}")),
                }
            } else {
                let value: Option<String> =
                    lockwright_tests::raw(&mut conn, redis::cmd("GET").arg(&key)).await;
                match value {
                    Some(v) if v.contains(&token) => AfterTheUndo::Held,
                    other => AfterTheUndo::Removed(format!("value {other:?}")),
                }
            }
        }
    };
    assert_eq!(
        holds(&mut conn).await,
        AfterTheUndo::Held,
        "{protocol}: granted, yet the key does not name the holder"
    );
    relay.release_held();
    // The held undo reaches Redis and runs (the relay gives it 200 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = holds(&mut conn).await;
    drop(guard);
    Some(after)
}

/// The attempt after an unanswered one runs under a new owner token, so
/// the unanswered attempt's undo, however late it runs, cannot remove the
/// hold that attempt was granted: for every lock whose adapter undoes
/// unanswered attempts by token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_undo_cannot_remove_the_retrys_hold() {
    for protocol in [
        ProtocolId::SetPxLua,
        ProtocolId::Fenced,
        ProtocolId::SetnxDel,
        ProtocolId::Reentrant,
    ] {
        let Some(after) = held_back_undo(protocol, false).await else {
            return;
        };
        assert_eq!(
            after,
            AfterTheUndo::Held,
            "{protocol}: the late undo removed the hold"
        );
    }
}

/// The same run with the retry under the unanswered attempt's token (a
/// deliberate bug): the late undo removes the retry's hold, which the test
/// above would report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_undo_removes_the_hold_of_a_retry_under_the_same_token() {
    for protocol in [
        ProtocolId::SetPxLua,
        ProtocolId::SetnxDel,
        ProtocolId::Fenced,
        ProtocolId::Reentrant,
    ] {
        let Some(after) = held_back_undo(protocol, true).await else {
            return;
        };
        assert!(
            matches!(after, AfterTheUndo::Removed(_)),
            "{protocol}: the mutant's late undo left the hold: {after:?}"
        );
    }
}

/// RedLock over three masters: the first round of the waiting acquire
/// gets no reply from masters 0 and 1 (master 2 is taken by a rival), its
/// undo on master 0 is held up past its timeout, the next round is granted
/// on masters 0 and 1, and then the held undo reaches master 0 and runs.
/// Returns whether master 0 still names the holder. `one_token`: the
/// machine's deliberate bug of running every round under one token.
async fn redlock_held_back_undo(one_token: bool) -> Option<bool> {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(redis_or_skip("redlock held-back undo")?);
    }
    let key = "{held-undo}";
    for (i, server) in servers.iter().enumerate() {
        server.load_scripts().await;
        // A rival's key: for good on master 2, gone before the retry on 1.
        let expiry = match i {
            1 => Some(150),
            2 => Some(60_000),
            _ => None,
        };
        if let Some(ms) = expiry {
            let mut conn = server.conn().await;
            let _: redis::Value = lockwright_tests::raw(
                &mut conn,
                redis::cmd("SET").arg(key).arg("rival").arg("PX").arg(ms),
            )
            .await;
        }
    }
    use Fate::*;
    let plans: Vec<Arc<Plan>> = (0..3)
        .map(|i| {
            Arc::new(Plan {
                locks: AtomicUsize::new(0),
                unlocks: AtomicUsize::new(0),
                lock_needle: "$3\r\nSET\r\n",
                unlock_needle: Script::CompareAndDelete.sha1(),
                // Attempt 1 (one-shot, its own token) is denied; the
                // waiting acquire's first round is lost on masters 0 and 1.
                lock_fates: match i {
                    2 => vec![],
                    _ => vec![Pass, DropRequests],
                },
                unlock_fates: match i {
                    0 => vec![Pass, HoldRequests],
                    _ => vec![],
                },
            })
        })
        .collect();
    let mut relays = Vec::new();
    for (server, plan) in servers.iter().zip(&plans) {
        let plan = plan.clone();
        relays.push(
            Relay::start(server.port(), Duration::ZERO, move |chunk| {
                plan.decide(chunk)
            })
            .await,
        );
    }
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(200),
        retry_base: Duration::from_millis(300),
        retry_max: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::Redlock, Duration::from_secs(30))
    };
    let mut lock = Lock::new(relays.iter().map(Relay::client), "held-undo", options).unwrap();
    if one_token {
        lock = lock.retrying_under_one_token();
    }
    let got = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await;
    let Ok(Ok(guard)) = got else {
        panic!("redlock: acquire after one lost round: {got:?}");
    };
    let rounds: Vec<usize> = plans
        .iter()
        .map(|p| p.locks.load(Ordering::SeqCst))
        .collect();
    let undos = plans[0].unlocks.load(Ordering::SeqCst);
    assert!(
        rounds[0] >= 3 && undos >= 2,
        "redlock: the fault did not happen as planned ({rounds:?} SETs per master, {undos} undos on master 0)"
    );
    let token = guard.token().0.to_string();
    let on_master_0 = || async {
        let mut conn = servers[0].conn().await;
        let value: Option<String> =
            lockwright_tests::raw(&mut conn, redis::cmd("GET").arg(key)).await;
        value.as_deref() == Some(token.as_str())
    };
    assert!(
        on_master_0().await,
        "redlock: granted, yet master 0 does not name the holder"
    );
    relays[0].release_held();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = on_master_0().await;
    drop(guard);
    Some(held)
}

/// RedLock's round after an undo round that a master did not answer runs
/// under a new token, so the late undo cannot take master 0 from the
/// holder's quorum; with one token for every round (a deliberate bug) it
/// does, and the holder is left on one master of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_redlock_undo_cannot_remove_a_later_rounds_key() {
    let Some(held) = redlock_held_back_undo(false).await else {
        return;
    };
    assert!(held, "the late undo removed the holder's key on master 0");
    let Some(held) = redlock_held_back_undo(true).await else {
        return;
    };
    assert!(
        !held,
        "the mutant's late undo left master 0's key: the test cannot fail"
    );
}

/// `setnx-expire` counts a won `SETNX` whose `EXPIRE` got no reply as
/// granted (the key is ours, maybe without a TTL). The adapter undoes an
/// unanswered acquire request by token only when the machine does not
/// hold afterwards: an undo here would delete the hold just granted, and a
/// rival would take the lock beside its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_last_request_went_unanswered_is_not_undone() {
    let Some(redis) = redis_or_skip("setnx-expire unanswered EXPIRE") else {
        return;
    };
    redis.load_scripts().await;
    let relay = Relay::start(redis.port(), Duration::ZERO, |chunk: &[u8]| {
        let needle = b"$6\r\nEXPIRE\r\n";
        if chunk.windows(needle.len()).any(|w| w == needle) {
            Fate::LoseReplies
        } else {
            Fate::Pass
        }
    })
    .await;
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(200),
        ..LockOptions::new(ProtocolId::SetnxExpire, Duration::from_secs(30))
    };
    let lock = Lock::new([relay.client()], "lost-expire", options).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), lock.try_acquire()).await;
    let Ok(Ok(Some(guard))) = got else {
        panic!("setnx-expire after an unanswered EXPIRE: {got:?}");
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        redis.exists("{lost-expire}").await,
        1,
        "the holder's key is gone"
    );
    let rival = Lock::new(
        [redis.client()],
        "lost-expire",
        LockOptions::new(ProtocolId::SetnxExpire, Duration::from_secs(30)),
    )
    .unwrap();
    let rival_got = rival.try_acquire().await;
    assert!(
        matches!(rival_got, Ok(None)),
        "a rival got the lock beside the holder: {rival_got:?}"
    );
    drop(guard);
}

/// A one-shot acquire whose `SETNX` runs without a reply, and a server
/// that drops the connection of every undo as it comes (the undo fails at
/// once, with no timeout to wait for): the undo is sent again ten times,
/// each after a wait twice the last (10 ms, 20 ms, ... up to 1 s), not
/// back to back. The assertion is a lower bound on the time the resends
/// take, which a slow machine cannot break; back to back they took a few
/// milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_resends_after_a_failure_are_spaced_out() {
    let Some(redis) = redis_or_skip("undo resends spaced out") else {
        return;
    };
    redis.load_scripts().await;
    let undo_sha = Script::CompareAndDelete.sha1();
    let locks = Arc::new(AtomicUsize::new(0));
    let undos = Arc::new(std::sync::Mutex::new(Vec::<std::time::Instant>::new()));
    let relay = Relay::start(redis.port(), Duration::ZERO, {
        let (locks, undos) = (locks.clone(), undos.clone());
        move |chunk| {
            let has = |s: &str| chunk.windows(s.len()).any(|w| w == s.as_bytes());
            if has(undo_sha) {
                undos
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(std::time::Instant::now());
                Fate::Close
            } else if has("$5\r\nSETNX\r\n") && locks.fetch_add(1, Ordering::SeqCst) == 0 {
                Fate::LoseReplies
            } else {
                Fate::Pass
            }
        }
    })
    .await;
    let options = LockOptions {
        auto_renew: false,
        notify: false,
        request_timeout: Duration::from_millis(200),
        ..LockOptions::new(ProtocolId::SetnxDel, Duration::from_secs(10))
    };
    let lock = Lock::new([relay.client()], "spaced-undo", options).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), lock.try_acquire()).await;
    assert!(
        matches!(got, Ok(Ok(None)) | Ok(Err(_))),
        "a one-shot acquire whose only attempt got no reply holds nothing: {got:?}"
    );
    // 1 + 10 sendings; the resends wait 10+20+...+640+1000+1000+1000 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let sent = loop {
        let sent = undos.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if sent.len() >= 11 || std::time::Instant::now() > deadline {
            break sent;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(sent.len(), 11, "undo sendings: {sent:?}");
    // Each wait is timed on a clock read in whole milliseconds, so it may
    // end up to 1 ms early: the bounds allow 2 ms per wait.
    let span = sent[10].duration_since(sent[0]);
    assert!(
        span >= Duration::from_millis(4_250),
        "the ten resends of a failing undo took {span:?}; spaced out they take at least 4.27 s"
    );
    let gaps: Vec<Duration> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[0] >= Duration::from_millis(8) && gaps[9] >= Duration::from_millis(998),
        "gaps between undo sendings: {gaps:?}"
    );
    // Nothing more after the last resend: its TTL (none for setnx-del) or
    // an operator is left to end the hold.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let total = undos.lock().unwrap_or_else(|e| e.into_inner()).len();
    assert_eq!(total, 11, "undo sendings after the last resend");
}
