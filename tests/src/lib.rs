//! # lockwright-tests
//!
//! Integration tests across crates: the Redis adapter against real
//! `redis-server` processes, and conformance of the keyspace model with Redis.
//!
//! Every test starts its own `redis-server` on a free loopback port with
//! [`RedisServer::start`] (or [`redis_or_skip`]) and the server is killed when
//! the handle drops. Outside CI a missing `redis-server` skips the test with a
//! loud message; with `CI=true` it is a failure.

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
}

/// Find `redis-server` on `PATH`.
pub fn find_redis_server() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").ok_or_else(|| "PATH is not set".to_owned())?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| "no redis-server on PATH (apt-get install -y redis-server)".to_owned())
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

impl RedisServer {
    /// Start a fresh server (no persistence) on a free port and wait until it
    /// answers `PING`.
    pub fn start() -> Result<RedisServer, String> {
        let binary = find_redis_server()?;
        let mut last_error = String::new();
        // A free port can be taken between choosing and binding it: retry.
        for _ in 0..5 {
            let port = free_port()?;
            let child = Command::new(&binary)
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dir", &std::env::temp_dir().to_string_lossy()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
            let mut server = RedisServer { child, port };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(5) {
                if ping(port) {
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
