//! # lockwright-tests
//!
//! Integration tests across crates: the Redis adapter against real
//! `redis-server` processes, and conformance of the keyspace model with Redis.
//!
//! Every test starts its own `redis-server` on a free loopback port with
//! [`RedisServer::start`] (or [`redis_or_skip`]) and the server is killed when
//! the handle drops. Outside CI a missing `redis-server` skips the test with a
//! loud message; with `CI=true` it is a failure.

use lockwright_chaos::FakeClock;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Is this a CI run (`CI` set to something other than empty, `0` or `false`)?
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A `redis-server` child process on a loopback port, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    /// Files of its own (a Sentinel's or a Cluster node's configuration),
    /// removed on drop.
    files: Vec<PathBuf>,
}

/// Find `redis-server` on `PATH`.
pub fn find_redis_server() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").ok_or_else(|| "PATH is not set".to_owned())?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| "no redis-server on PATH (apt-get install -y redis-server)".to_owned())
}

/// The `redis-server` built with libc's malloc that
/// `.ci/build-redis-image.sh` compiles for the chaos image and keeps in its
/// cache (`$LOCKWRIGHT_CACHE`, by default `~/.cache/lockwright/redis-faketime`,
/// linked as `redis-server-libc`), or the file `LOCKWRIGHT_REDIS_LIBC`
/// names. libfaketime runs under it (it does not start under jemalloc).
pub fn find_redis_server_libc() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("LOCKWRIGHT_REDIS_LIBC") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "LOCKWRIGHT_REDIS_LIBC={} is not a file",
                path.display()
            ))
        };
    }
    let cache = match std::env::var_os("LOCKWRIGHT_CACHE").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/lockwright/redis-faketime"),
    };
    // The script points this link at the binary it last built or found.
    let path = cache.join("redis-server-libc");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no {} (.ci/build-redis-image.sh builds it)",
            path.display()
        ))
    }
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// The arguments of a plain server on `port`: loopback only, no
/// persistence, files in the temporary directory.
fn plain_args(port: u16) -> Vec<String> {
    vec![
        "--port".to_owned(),
        port.to_string(),
        "--bind".to_owned(),
        "127.0.0.1".to_owned(),
        "--save".to_owned(),
        String::new(),
        "--appendonly".to_owned(),
        "no".to_owned(),
        "--dir".to_owned(),
        std::env::temp_dir().to_string_lossy().into_owned(),
    ]
}

/// Does something answer on `port` with a Redis reply (any, even an
/// authentication error)?
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 1];
    stream.read_exact(&mut buf).is_ok() && (buf[0] == b'+' || buf[0] == b'-')
}

/// A loopback port nothing listens on (bound, then released): connecting
/// to it is refused.
pub fn closed_port() -> u16 {
    match free_port() {
        Ok(port) => port,
        Err(e) => panic!("no free loopback port: {e}"),
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!("kill -{name} {pid}: {other:?}"),
    }
}

impl RedisServer {
    /// Start a fresh server (no persistence) on a free port and wait until it
    /// answers `PING`.
    pub fn start() -> Result<RedisServer, String> {
        RedisServer::start_with(&[])
    }

    /// [`RedisServer::start`] with extra command-line arguments (for
    /// example `["--requirepass", "secret"]`). The readiness check is a TCP
    /// connect, so it works with a password too.
    pub fn start_with(extra: &[&str]) -> Result<RedisServer, String> {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        RedisServer::launch(|port| {
            let mut args = plain_args(port);
            args.extend(extra.iter().cloned());
            Ok((args, Vec::new()))
        })
    }

    /// A plain server whose wall clock stands still where `clock` puts it
    /// (a [`FakeClock::frozen`] read through `library`, see
    /// [`libfaketime_or_skip`]): `TIME`, expiry and every script read
    /// `clock`'s reading; its monotonic clock runs, so its timers work as
    /// usual. The server is the libc-malloc build of
    /// [`find_redis_server_libc`]: libfaketime cannot start under jemalloc,
    /// which Debian's `redis-server` uses.
    pub fn start_frozen(library: &str, clock: &FakeClock) -> Result<RedisServer, String> {
        let file = clock.file();
        let mut env: Vec<(&str, &std::ffi::OsStr)> = vec![
            ("LD_PRELOAD", library.as_ref()),
            ("FAKETIME_TIMESTAMP_FILE", file.as_os_str()),
            ("FAKETIME_NO_CACHE", "1".as_ref()),
        ];
        env.extend(
            lockwright_chaos::frozen_env()
                .into_iter()
                .map(|(name, value)| (name, value.as_ref())),
        );
        RedisServer::launch_binary(&find_redis_server_libc()?, &env, |port| {
            Ok((plain_args(port), Vec::new()))
        })
    }

    /// A Sentinel on a free port, monitoring the master on `master_port`
    /// as `master_name` with a quorum of 1, judging a master down after
    /// 1 s. Its configuration file (Sentinel rewrites it) is removed on
    /// drop.
    pub fn start_sentinel(master_port: u16, master_name: &str) -> Result<RedisServer, String> {
        RedisServer::launch(|port| {
            let dir = std::env::temp_dir();
            let conf = dir.join(format!("lockwright-sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 3000\n",
                dir = dir.display(),
            );
            std::fs::write(&conf, text).map_err(|e| format!("write {}: {e}", conf.display()))?;
            let args = vec![conf.to_string_lossy().into_owned(), "--sentinel".to_owned()];
            Ok((args, vec![conf]))
        })
    }

    /// A Cluster node (`cluster-enabled yes`) on a free port, not yet part
    /// of a cluster. Its nodes file is removed on drop.
    pub fn start_cluster_node() -> Result<RedisServer, String> {
        RedisServer::launch(|port| {
            let file = format!("lockwright-nodes-{port}.conf");
            let path = std::env::temp_dir().join(&file);
            let _ = std::fs::remove_file(&path);
            let mut args = plain_args(port);
            args.extend(
                ["--cluster-enabled", "yes", "--cluster-config-file", &file].map(str::to_owned),
            );
            Ok((args, vec![path]))
        })
    }

    /// Start `redis-server` with the arguments `make` gives for a free
    /// port, and wait until it answers.
    fn launch(
        make: impl Fn(u16) -> Result<(Vec<String>, Vec<PathBuf>), String>,
    ) -> Result<RedisServer, String> {
        RedisServer::launch_binary(&find_redis_server()?, &[], make)
    }

    /// [`RedisServer::launch`] of `binary` with extra environment variables.
    fn launch_binary(
        binary: &std::path::Path,
        env: &[(&str, &std::ffi::OsStr)],
        make: impl Fn(u16) -> Result<(Vec<String>, Vec<PathBuf>), String>,
    ) -> Result<RedisServer, String> {
        let mut last_error = String::new();
        // A free port can be taken between choosing and binding it: retry.
        for _ in 0..5 {
            let port = free_port()?;
            let (args, files) = make(port)?;
            let child = Command::new(binary)
                .args(&args)
                // An inherited FAKETIME would override a clock file.
                .env_remove("FAKETIME")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
            let mut server = RedisServer { child, port, files };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(5) {
                if ping(port) || answers(port) {
                    return Ok(server);
                }
                if let Ok(Some(status)) = server.child.try_wait() {
                    last_error = format!("redis-server exited with {status} (port {port})");
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if last_error.is_empty() {
                last_error = format!("redis-server did not answer PING on port {port}");
            }
        }
        Err(last_error)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for it.
    pub fn client(&self) -> redis::Client {
        match redis::Client::open(self.url()) {
            Ok(c) => c,
            Err(e) => panic!("a loopback URL is always valid: {e}"),
        }
    }

    /// A fresh multiplexed connection of its own.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        match self.client().get_multiplexed_async_connection().await {
            Ok(c) => c,
            Err(e) => panic!("connect to the test server: {e}"),
        }
    }
}

impl RedisServer {
    /// Stop the server with `SIGSTOP`: it keeps its sockets open and
    /// answers nothing until [`resume`](RedisServer::resume).
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    /// Let a paused server run again (`SIGCONT`).
    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }

    /// Kill the server (`SIGKILL`) and wait for it: its port is then closed
    /// and connections to it are refused.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            // A stopped process still dies of SIGKILL; SIGCONT first anyway
            // so that nothing is left stopped if the kill were refused.
            let _ = Command::new("kill")
                .args(["-CONT".to_owned(), self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Where Debian's `libfaketime` package puts the library, per architecture.
pub const LIBFAKETIME: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// The libfaketime library for `test`, or skip: outside CI a missing
/// library prints `SKIPPED` and returns `None`; under `CI=true` it panics
/// (a failure).
pub fn libfaketime_or_skip(test: &str) -> Option<&'static str> {
    let found = LIBFAKETIME
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    if found.is_none() {
        assert!(
            !in_ci(),
            "{test}: libfaketime is required under CI (apt-get install libfaketime; looked for {LIBFAKETIME:?})"
        );
        eprintln!(
            "\n*** SKIPPED {test}: libfaketime not found (apt-get install libfaketime) ***\n"
        );
    }
    found
}

/// Start a server for `test`, or skip: outside CI a missing `redis-server`
/// prints `SKIPPED: redis-server not found: <reason>` and returns `None`;
/// under `CI=true` it panics (a failure).
pub fn redis_or_skip(test: &str) -> Option<RedisServer> {
    match RedisServer::start() {
        Ok(server) => Some(server),
        Err(reason) if in_ci() => panic!("{test}: redis-server is required under CI: {reason}"),
        Err(reason) => {
            eprintln!("\n*** SKIPPED {test}: redis-server not found: {reason} ***\n");
            None
        }
    }
}

/// Run a raw command on `conn` and decode its reply.
pub async fn raw<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    cmd: &mut redis::Cmd,
) -> T {
    match cmd.query_async(conn).await {
        Ok(v) => v,
        Err(e) => panic!("raw command failed: {e}"),
    }
}

/// Store a fence counter at `key` an hour (in µs) ahead of `redis`' clock,
/// as a counter left by a clock that stepped back; returns the value stored.
pub async fn fence_counter_ahead_of_the_clock(redis: &RedisServer, key: &str) -> u64 {
    let mut conn = redis.conn().await;
    let (secs, micros): (u64, u64) = raw(&mut conn, &mut redis::cmd("TIME")).await;
    let ahead = secs * 1_000_000 + micros + 3_600_000_000;
    let _: () = raw(&mut conn, redis::cmd("SET").arg(key).arg(ahead.to_string())).await;
    ahead
}

/// The fence counter stored at `key`, as the integer string Redis holds.
pub async fn stored_fence(redis: &RedisServer, key: &str) -> String {
    let mut conn = redis.conn().await;
    raw(&mut conn, redis::cmd("GET").arg(key)).await
}

/// A 3-master Redis Cluster on loopback ports (no replicas): slots split in
/// three ranges, nodes introduced with `CLUSTER MEET`. Killed on drop.
#[derive(Debug)]
pub struct Cluster {
    /// The masters, in slot order (node 0 serves slots 0–5460).
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Start it and wait until every node says `cluster_state:ok`.
    pub async fn start() -> Result<Cluster, String> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(RedisServer::start_cluster_node()?);
        }
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (node, (first, last)) in nodes.iter().zip(ranges) {
            let mut conn = node.conn().await;
            let _: () = try_raw(
                &mut conn,
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            )
            .await?;
        }
        let mut first = nodes[0].conn().await;
        for node in &nodes[1..] {
            let _: () = try_raw(
                &mut first,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.port()),
            )
            .await?;
        }
        let cluster = Cluster { nodes };
        for _ in 0..300 {
            if cluster.is_ok().await {
                return Ok(cluster);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("the cluster did not reach cluster_state:ok within 30 s".to_owned())
    }

    async fn is_ok(&self) -> bool {
        for node in &self.nodes {
            let mut conn = node.conn().await;
            let info: Result<String, _> =
                try_raw(&mut conn, redis::cmd("CLUSTER").arg("INFO")).await;
            match info {
                Ok(info)
                    if info.contains("cluster_state:ok")
                        && info.contains("cluster_known_nodes:3") => {}
                _ => return false,
            }
        }
        true
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub async fn slot(&self, key: &str) -> u16 {
        let mut conn = self.nodes[0].conn().await;
        raw(&mut conn, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await
    }

    /// The node serving `slot` in the initial layout.
    pub fn initial_owner(&self, slot: u16) -> &RedisServer {
        &self.nodes[match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }]
    }
}

/// Start a cluster for `test`, or skip as [`redis_or_skip`] does.
pub async fn cluster_or_skip(test: &str) -> Option<Cluster> {
    if let Err(reason) = find_redis_server() {
        if in_ci() {
            panic!("{test}: redis-server is required under CI: {reason}");
        }
        eprintln!("\n*** SKIPPED {test}: redis-server not found: {reason} ***\n");
        return None;
    }
    match Cluster::start().await {
        Ok(cluster) => Some(cluster),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// [`raw`], returning the error instead of panicking.
pub async fn try_raw<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    cmd: &mut redis::Cmd,
) -> Result<T, String> {
    cmd.query_async(conn).await.map_err(|e| e.to_string())
}

/// What a [`Relay`] does with a connection, from the request that decided
/// it on (a later decision other than `Pass` replaces it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Requests and replies go through.
    Pass,
    /// Requests reach the server and run; no reply comes back.
    LoseReplies,
    /// Requests never reach the server (and so nothing comes back).
    DropRequests,
    /// Requests are held back (in order, in the relay) until
    /// [`Relay::release_held`]; then they reach the server, also when the
    /// client has closed the connection in the meantime. Replies that
    /// come before the release pass.
    HoldRequests,
    /// The request never reaches the server and the connection is closed
    /// at once: the client's request fails without waiting for a timeout.
    Close,
}

/// A TCP relay on a loopback port in front of a server. Each chunk a client
/// sends is shown to `decide` first; its fate then holds for the rest of
/// that connection. Replies that pass are delayed by `reply_delay` (a
/// slower network). The relay's tasks end with the runtime that started
/// it.
#[derive(Debug)]
pub struct Relay {
    port: u16,
    release: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl Relay {
    /// Listen on a free loopback port and relay to `upstream_port`.
    pub async fn start(
        upstream_port: u16,
        reply_delay: Duration,
        decide: impl Fn(&[u8]) -> Fate + Send + Sync + 'static,
    ) -> Relay {
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
            Ok(l) => l,
            Err(e) => panic!("relay: cannot bind a loopback port: {e}"),
        };
        let port = match listener.local_addr() {
            Ok(a) => a.port(),
            Err(e) => panic!("relay: {e}"),
        };
        let decide = std::sync::Arc::new(decide);
        let release = std::sync::Arc::new(tokio::sync::watch::channel(false).0);
        let released = release.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                else {
                    continue;
                };
                let held = released.subscribe();
                tokio::spawn(relay_one(client, server, decide.clone(), reply_delay, held));
            }
        });
        Relay { port, release }
    }

    /// Let every request held by [`Fate::HoldRequests`] through, now and
    /// from then on.
    pub fn release_held(&self) {
        self.release.send_replace(true);
    }

    /// A client of the server through the relay.
    pub fn client(&self) -> redis::Client {
        match redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)) {
            Ok(c) => c,
            Err(e) => panic!("relay client: {e}"),
        }
    }
}

async fn relay_one(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    decide: std::sync::Arc<impl Fn(&[u8]) -> Fate + Send + Sync + 'static>,
    reply_delay: Duration,
    mut released: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fate = std::sync::Arc::new(std::sync::Mutex::new(Fate::Pass));
    let current = |fate: &std::sync::Mutex<Fate>| *fate.lock().unwrap_or_else(|e| e.into_inner());
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let decided = fate.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut held: Vec<u8> = Vec::new();
        loop {
            let read = tokio::select! {
                read = client_read.read(&mut buf) => Some(read),
                _ = released.wait_for(|r| *r), if !held.is_empty() => None,
            };
            let Some(read) = read else {
                if server_write.write_all(&held).await.is_err() {
                    return;
                }
                held.clear();
                continue;
            };
            let n = match read {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            let chunk = &buf[..n];
            let now = decide(chunk);
            if now != Fate::Pass {
                *decided.lock().unwrap_or_else(|e| e.into_inner()) = now;
            }
            match current(&decided) {
                Fate::DropRequests => continue,
                Fate::Close => break,
                Fate::HoldRequests if !*released.borrow() => {
                    held.extend_from_slice(chunk);
                    continue;
                }
                _ => {}
            }
            if server_write.write_all(chunk).await.is_err() {
                break;
            }
        }
        // The client went away with requests held: they still reach the
        // server once released (a request the network delivers late).
        let release_came = !held.is_empty() && released.wait_for(|r| *r).await.is_ok();
        if release_came {
            let _ = server_write.write_all(&held).await;
            // Long enough for the server to read them before the close.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = server_read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if matches!(current(&fate), Fate::LoseReplies | Fate::DropRequests) {
                continue;
            }
            if !reply_delay.is_zero() {
                tokio::time::sleep(reply_delay).await;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(up, down);
}

/// A [`Relay`] that loses the replies of chosen connections: once a
/// connection has sent a request containing the armed needle, the server
/// still receives and runs everything that connection sends, but nothing
/// it answers on that connection comes back. Other connections pass
/// untouched.
#[derive(Debug)]
pub struct ReplyLoss {
    relay: Relay,
    needle: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl ReplyLoss {
    /// Listen on a free loopback port and relay to `upstream_port`.
    pub async fn start(upstream_port: u16) -> ReplyLoss {
        let needle = std::sync::Arc::new(std::sync::Mutex::new(None::<Vec<u8>>));
        let armed = needle.clone();
        let relay = Relay::start(upstream_port, Duration::ZERO, move |chunk| {
            let hit = armed.lock().ok().and_then(|n| n.clone()).is_some_and(|n| {
                !n.is_empty() && chunk.windows(n.len()).any(|w| w == n.as_slice())
            });
            if hit {
                Fate::LoseReplies
            } else {
                Fate::Pass
            }
        })
        .await;
        ReplyLoss { relay, needle }
    }

    /// From now on, a connection that sends `needle` loses every reply.
    pub fn arm(&self, needle: &str) {
        if let Ok(mut n) = self.needle.lock() {
            *n = Some(needle.as_bytes().to_vec());
        }
    }

    /// A client of the server through the relay.
    pub fn client(&self) -> redis::Client {
        self.relay.client()
    }
}

/// A hang guard, not a speed check: an acquire that "waits forever" fails
/// the test instead of hanging it.
pub const HANG: Duration = Duration::from_secs(60);

/// The error an acquire that must fail ends with; a grant, or a wait past
/// [`HANG`], fails the test (named by `what`).
pub async fn acquire_error(
    what: &str,
    acquire: impl std::future::Future<
        Output = Result<lockwright_redis::LockGuard, lockwright_redis::Error>,
    >,
) -> lockwright_redis::Error {
    match tokio::time::timeout(HANG, acquire).await {
        Ok(Err(e)) => e,
        Ok(Ok(guard)) => panic!("{what}: granted, expected an error: {guard:?}"),
        Err(_) => panic!("{what}: still waiting after {HANG:?}"),
    }
}

impl RedisServer {
    /// `PTTL key` (-2 when the key is missing, -1 without a TTL).
    pub async fn pttl(&self, key: &str) -> i64 {
        let mut conn = self.conn().await;
        raw(&mut conn, redis::cmd("PTTL").arg(key)).await
    }

    /// How often the server ran `command` (lower case, as `INFO
    /// commandstats` names it; scripts' inner calls included).
    pub async fn calls(&self, command: &str) -> u64 {
        let mut conn = self.conn().await;
        let info: String = raw(&mut conn, redis::cmd("INFO").arg("commandstats")).await;
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Whether `key` is gone within `within`, polled every 20 ms (`false`
    /// if it is still there when the time is up).
    pub async fn gone_within(&self, key: &str, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.exists(key).await == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> i64 {
        let mut conn = self.conn().await;
        raw(&mut conn, redis::cmd("EXISTS").arg(key)).await
    }

    /// Load every catalogue script (`SCRIPT LOAD`): with replies lost, an
    /// `EVALSHA` answered `NOSCRIPT` would never fall back to `EVAL`.
    pub async fn load_scripts(&self) {
        let mut conn = self.conn().await;
        for script in lockwright_core::keyspace::Script::ALL {
            let _: String = raw(
                &mut conn,
                redis::cmd("SCRIPT").arg("LOAD").arg(script.lua()),
            )
            .await;
        }
    }
}
