//! Interop mode (`LockOptions::exact_key`): lockwright and the peers that
//! install from the package registries here — redis-py's `Lock` and rslock
//! — exclude one another on one existing key, both ways.
//!
//! redis-py runs in a `python3` child process (the test needs `pip install
//! redis`; outside CI a missing module skips the test loudly, as a missing
//! `redis-server` does).

use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use lockwright_tests::{in_ci, raw, redis_or_skip, RedisServer};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// A key as another application would name it: no hash tag.
const KEY: &str = "orders:42";

fn exact(protocol: ProtocolId) -> LockOptions {
    LockOptions {
        exact_key: true,
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(protocol, Duration::from_secs(10))
    }
}

/// redis-py's `Lock` on `KEY`, driven line by line over stdin/stdout:
/// `acquire` answers `True`/`False` (one non-blocking attempt), `release`
/// answers `ok` or the error's class name.
const PEER: &str = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
lock = r.lock(sys.argv[2], timeout=10)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "acquire":
        print(lock.acquire(blocking=False), flush=True)
    elif cmd == "release":
        try:
            lock.release()
            print("ok", flush=True)
        except Exception as e:
            print(type(e).__name__, flush=True)
"#;

/// A redis-py child process, killed on drop.
struct RedisPy {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl RedisPy {
    /// Start it, or skip (outside CI) when python3 or redis-py is missing.
    fn start(redis: &RedisServer) -> Option<RedisPy> {
        // Run outside the workspace: its `redis/` folder would shadow the
        // Python package.
        let spawned = Command::new("python3")
            .args(["-c", PEER, &redis.port().to_string(), KEY])
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return skip(&format!("cannot run python3: {e}")),
        };
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = RedisPy {
            child,
            stdin,
            stdout,
        };
        match peer.read() {
            Some(line) if line == "ready" => Some(peer),
            _ => {
                let mut why = String::new();
                if let Some(mut err) = peer.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut why);
                }
                skip(&format!(
                    "redis-py did not start (pip install redis): {why}"
                ))
            }
        }
    }

    fn read(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim().to_owned()),
            _ => None,
        }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("write to redis-py");
        self.stdin.flush().expect("flush");
        self.read()
            .unwrap_or_else(|| panic!("redis-py gave no answer to {command}"))
    }
}

impl Drop for RedisPy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn skip<T>(reason: &str) -> Option<T> {
    if in_ci() {
        panic!("redis-py is required under CI: {reason}");
    }
    eprintln!("\n*** SKIPPED redis-py interop: {reason} ***\n");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockwright_and_redis_py_exclude_each_other_both_ways() {
    let Some(redis) = redis_or_skip("redis-py interop") else {
        return;
    };
    let Some(mut peer) = RedisPy::start(&redis) else {
        return;
    };
    let lock = Lock::new([redis.client()], KEY, exact(ProtocolId::SetPxLua)).unwrap();
    assert_eq!(lock.key(), KEY);

    // lockwright holds: redis-py is refused.
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    let mut conn = redis.conn().await;
    let exists: i64 = raw(&mut conn, redis::cmd("EXISTS").arg(KEY)).await;
    assert_eq!(exists, 1, "the key exactly as given");
    assert_eq!(peer.ask("acquire"), "False");
    assert_eq!(guard.release().await, Ok(true));

    // redis-py holds: lockwright is refused.
    assert_eq!(peer.ask("acquire"), "True");
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(peer.ask("release"), "ok");
    let guard = lock.try_acquire().await.unwrap().expect("free again");
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockwright_and_rslock_exclude_each_other_both_ways() {
    let Some(redis) = redis_or_skip("rslock interop") else {
        return;
    };
    let peer = rslock::LockManager::new(vec![redis.url()]);
    let lock = Lock::new([redis.client()], KEY, exact(ProtocolId::SetPxLua)).unwrap();

    // lockwright holds: rslock is refused.
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    assert!(peer.lock(KEY, Duration::from_secs(10)).await.is_err());
    assert_eq!(guard.release().await, Ok(true));

    // rslock holds: lockwright is refused.
    let theirs = peer
        .lock(KEY, Duration::from_secs(10))
        .await
        .expect("rslock gets the free key");
    assert!(lock.try_acquire().await.unwrap().is_none());
    peer.unlock(&theirs).await;
    let guard = lock.try_acquire().await.unwrap().expect("free again");
    assert_eq!(guard.release().await, Ok(true));

    // RedLock over one master is rslock's own protocol: same key, same
    // exclusion.
    let redlock = Lock::new([redis.client()], KEY, exact(ProtocolId::Redlock)).unwrap();
    let guard = redlock.try_acquire().await.unwrap().expect("granted");
    assert!(peer.lock(KEY, Duration::from_secs(10)).await.is_err());
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_keys_allow_braces_and_keep_companions_beside_the_key() {
    let Some(redis) = redis_or_skip("exact keys") else {
        return;
    };
    // A name with a hash tag of its own (what a Cluster user would pick).
    let name = "acct{7}:lock";
    let lock = Lock::new([redis.client()], name, exact(ProtocolId::Fenced)).unwrap();
    assert_eq!(lock.key(), name);
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    let mut conn = redis.conn().await;
    let fence: i64 = raw(&mut conn, redis::cmd("GET").arg("acct{7}:lock:fence")).await;
    assert_eq!(Some(lockwright_core::Fence(1)), guard.fence());
    assert_eq!(fence, 1);
    let tagged: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{acct{7}:lock}")).await;
    assert_eq!(tagged, 0, "nothing under a wrapped name");
    assert_eq!(guard.release().await, Ok(true));
}
