//! Undoing an unanswered acquire attempt by token races with the machine's
//! retry: a relay that loses replies, drops requests and adds a 5 ms round
//! trip shows that the undo never takes off a hold the retry was granted,
//! and that an undo that itself got no reply is sent again, so the attempt
//! cannot block the lock (under `setnx-del`, for ever).

use lockwright_core::keyspace::Script;
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use lockwright_tests::redis_or_skip;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fate {
    Pass,
    LoseReply,
    Drop,
}

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

async fn relay(upstream: u16, plan: Arc<Plan>) -> u16 {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            let plan = plan.clone();
            tokio::spawn(async move {
                let state = Arc::new(std::sync::Mutex::new(Fate::Pass));
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up_state = state.clone();
                let up = async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let fate = plan.decide(&buf[..n]);
                        {
                            let mut s = up_state.lock().unwrap();
                            if fate != Fate::Pass {
                                *s = fate;
                            }
                            if *s == Fate::Drop {
                                continue;
                            }
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        if *state.lock().unwrap() != Fate::Pass {
                            continue;
                        }
                        // A network with a 5 ms round trip.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                tokio::join!(up, down);
            });
        }
    });
    port
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
        lock_fates: vec![LoseReply, LoseReply, LoseReply],
        unlock_fates: vec![Pass, Drop],
    });
    let port = relay(redis.port(), plan.clone()).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
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
        lock_fates: vec![LoseReply],
        unlock_fates: vec![Drop],
    });
    let port = relay(redis.port(), plan.clone()).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
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
