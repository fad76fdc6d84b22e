//! Waiting without polling: a waiter with `notify` wakes on the release
//! script's `PUBLISH`, long before its fallback (bounded by the TTL); the
//! waiters of one lock are served in line, one attempt per release; a
//! holder that releases silently still lets them in, on their fallback.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions, Nodes};
use lockwright_tests::{raw, redis_or_skip};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn options(notify: bool) -> LockOptions {
    LockOptions {
        auto_renew: false,
        notify,
        // A fallback (up to retry_max) far longer than any notice takes.
        retry_max: Duration::from_secs(10),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(30))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_wakes_on_release_not_on_its_fallback() {
    let Some(redis) = redis_or_skip("notify") else {
        return;
    };
    let holder_lock = Lock::new([redis.client()], "notified", options(true)).unwrap();
    let waiter_lock = Lock::new([redis.client()], "notified", options(true)).unwrap();
    woken_by_the_release(&holder_lock, waiter_lock, Duration::from_secs(5)).await;
}

/// `holder_lock` is taken, a waiter on `waiter_lock` settles into its wait,
/// and the holder releases: the waiter must get the lock within `within`,
/// and less than 4 s after the release, i.e. woken by the release's notice
/// rather than its fallback.
async fn woken_by_the_release(holder_lock: &Lock, waiter_lock: Lock, within: Duration) {
    let holder = holder_lock.try_acquire().await.unwrap().expect("granted");
    let waiter = tokio::spawn(async move {
        let guard = waiter_lock.acquire().await?;
        Ok::<_, Error>((Instant::now(), guard))
    });
    // Let the waiter be denied once and settle into its wait (its fallback
    // is 5–10 s: half or more of min(TTL = 30 s, retry_max = 10 s)).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "excluded while held");
    let released_at = Instant::now();
    assert_eq!(holder.release().await, Ok(true));
    let (acquired_at, guard) = tokio::time::timeout(within, waiter)
        .await
        .expect("the waiter gets the lock")
        .expect("task")
        .expect("acquired");
    let delay = acquired_at.duration_since(released_at);
    assert!(
        delay < Duration::from_secs(4),
        "woken by the notification, not the 5-10 s fallback: {delay:?}"
    );
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_times_out_while_held() {
    let Some(redis) = redis_or_skip("notify timeout") else {
        return;
    };
    let lock = Lock::new([redis.client()], "busy", options(true)).unwrap();
    let holder = lock.try_acquire().await.unwrap().expect("granted");
    let started = Instant::now();
    assert_eq!(
        lock.acquire_timeout(Duration::from_millis(300))
            .await
            .map(|_| ()),
        Err(Error::Timeout)
    );
    assert!(started.elapsed() < Duration::from_millis(1_000));
    assert_eq!(holder.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_line_one_attempt_per_release() {
    let Some(redis) = redis_or_skip("notify line") else {
        return;
    };
    let lock = Lock::new([redis.client()], "line", options(true)).unwrap();
    let holder = lock.try_acquire().await.unwrap().expect("granted");
    let mut admin = redis.conn().await;
    let _: () = raw(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (lock, order) = (lock.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await.expect("acquired");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(guard.release().await, Ok(true));
        }));
        // Join the line in this order.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(holder.release().await, Ok(true));
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("every waiter gets the lock")
            .expect("task");
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2], "served in line");
    // The first waiter tried once on joining (denied); the others waited
    // for their turn; each release woke one waiter, whose one try won.
    let stats: String = raw(&mut admin, redis::cmd("INFO").arg("commandstats")).await;
    let sets = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(sets, Some(4), "SET calls: 1 denied + 3 granted\n{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_release_lets_a_notified_waiter_in_on_its_fallback() {
    let Some(redis) = redis_or_skip("notify fallback") else {
        return;
    };
    let short = |notify| LockOptions {
        auto_renew: false,
        notify,
        request_timeout: Duration::from_millis(200),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_millis(400))
    };
    let silent = Lock::new([redis.client()], "silent", short(false)).unwrap();
    let waiting = Lock::new([redis.client()], "silent", short(true)).unwrap();
    let holder = silent.try_acquire().await.unwrap().expect("granted");
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(holder.release().await, Ok(true));
    // No notice: the fallback (200–400 ms at a 400 ms TTL) lets it in.
    let guard = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("in on the fallback")
        .expect("task")
        .expect("acquired");
    assert_eq!(guard.release().await, Ok(true));
}

/// The server's count of connected clients.
async fn connected_clients(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = raw(admin, redis::cmd("INFO").arg("clients")).await;
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_notified_locks_share_one_pubsub_connection() {
    let Some(redis) = redis_or_skip("notify at scale") else {
        return;
    };
    const LOCKS: usize = 200;
    let mut admin = redis.conn().await;
    let holders = Nodes::new([redis.client()]);
    let waiters = Nodes::new([redis.client()]);
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..LOCKS {
        let name = format!("scale-{i}");
        let lock = Lock::on(&holders, name.clone(), options(true)).unwrap();
        held.push(lock.try_acquire().await.unwrap().expect("granted"));
        let lock = Lock::on(&waiters, name, options(true)).unwrap();
        waiting.push(tokio::spawn(async move { lock.acquire().await }));
    }
    // Every waiter subscribed (one channel per lock) before we count.
    let mut channels = 0;
    for _ in 0..200 {
        let names: Vec<String> = raw(
            &mut admin,
            redis::cmd("PUBSUB").arg("CHANNELS").arg("*:released"),
        )
        .await;
        channels = names.len();
        if channels == LOCKS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(channels, LOCKS, "one channel per waiting lock");
    // admin + the holders' shared connection + the waiters' shared
    // connection + the waiters' one pub/sub connection.
    assert_eq!(connected_clients(&mut admin).await, 4);
    for guard in held {
        assert_eq!(guard.release().await, Ok(true));
    }
    for waiter in waiting {
        let guard = tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("every waiter gets its lock")
            .expect("task")
            .expect("acquired");
        assert_eq!(guard.release().await, Ok(true));
    }
}

async fn subscribers(admin: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: (String, i64) = raw(admin, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    reply.1
}

/// With `exact_key`, a waiter listens on exactly its key's channel (no
/// pattern that would also match `<name>-other:released`), for a lock and
/// for a leased semaphore (whose release publishes on its permits key), and
/// is woken by the release, not its fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_key_waiters_listen_on_their_own_channel_and_wake_on_release() {
    let Some(redis) = redis_or_skip("notify with exact keys") else {
        return;
    };
    let mut admin = redis.conn().await;
    let nodes = Nodes::new([redis.client()]);
    for (protocol, name, channel) in [
        (ProtocolId::SetPxLua, "order1", "order1:released"),
        (ProtocolId::LeaseSemaphore, "pool", "pool:permits:released"),
        (
            ProtocolId::TimeFencedSemaphore,
            "clocked",
            "clocked:permits:released",
        ),
    ] {
        let options = LockOptions {
            exact_key: true,
            auto_renew: false,
            ..options(true)
        };
        let options = LockOptions {
            protocol,
            ..options
        };
        let (holder, waiter) = match protocol {
            ProtocolId::SetPxLua => {
                let lock = Lock::on(&nodes, name, options).unwrap();
                let holder = lock.try_acquire().await.unwrap().expect("granted");
                (holder, tokio::spawn(async move { lock.acquire().await }))
            }
            _ => {
                let semaphore = lockwright_redis::Semaphore::on(&nodes, name, options).unwrap();
                let holder = semaphore.try_acquire().await.unwrap().expect("granted");
                (
                    holder,
                    tokio::spawn(async move { semaphore.acquire().await }),
                )
            }
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "{protocol}: excluded while held");
        assert_eq!(subscribers(&mut admin, channel).await, 1, "{protocol}");
        let patterns: i64 = raw(&mut admin, redis::cmd("PUBSUB").arg("NUMPAT")).await;
        assert_eq!(patterns, 0, "{protocol}: no pattern subscription");
        let released_at = Instant::now();
        assert_eq!(holder.release().await, Ok(true));
        let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter gets in")
            .expect("task")
            .expect("acquired");
        let delay = released_at.elapsed();
        assert!(
            delay < Duration::from_secs(4),
            "{protocol}: woken by the notice, not the 5-10 s fallback: {delay:?}"
        );
        assert_eq!(guard.release().await, Ok(true));
    }
}

/// A `Lock` whose notices connection was opened on a runtime that has
/// since shut down: the connection's reader ended with that runtime, and a
/// waiter on a later runtime must still wake on the release's notice (the
/// hub connects again), not wait for its 5–10 s fallback.
#[test]
fn notices_survive_the_runtime_that_opened_their_connection() {
    let Some(redis) = redis_or_skip("notify across runtimes") else {
        return;
    };
    let holder_lock = Lock::new([redis.client()], "runtimes", options(true)).unwrap();
    let waiter_lock = Lock::new([redis.client()], "runtimes", options(true)).unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    };
    // The first runtime: a waiter joins (which subscribes), then all ends.
    let first = runtime();
    first.block_on(async {
        let holder = holder_lock.try_acquire().await.unwrap().expect("granted");
        let waiter = waiter_lock
            .acquire_timeout(Duration::from_millis(300))
            .await;
        assert!(waiter.is_err(), "excluded while held");
        assert_eq!(holder.release().await, Ok(true));
    });
    drop(first);
    // The second: the waiter must be woken by the notice.
    runtime().block_on(woken_by_the_release(
        &holder_lock,
        waiter_lock,
        Duration::from_secs(12),
    ));
}
