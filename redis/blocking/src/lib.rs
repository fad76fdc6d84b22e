//! # lockwright-blocking
//!
//! A second front end for the `lockwright-core` machines: blocking, over
//! `std::net::TcpStream`, with RESP written from the core's own argument
//! vectors ([`Command::frames`]). It uses nothing but the core's public
//! contract (`docs/driving.md`), no async runtime and no Redis client
//! library; its size is the measure of that contract.
//!
//! What it does: one connection per node per hold (so the protocols that
//! `WATCH` work too), requests to different nodes written before any reply
//! is read, requests to one node answered in the order they were sent, a
//! reply timeout per read (a timeout or a broken connection is the core's
//! [`Outcome::Unknown`], and the connection is dropped: a request whose
//! outcome is unknown is never resent), `EVALSHA` with the `EVAL` fallback on
//! `NOSCRIPT`. What it leaves out: TLS, AUTH, RESP3, automatic renewal
//! (timers fire only inside calls: leave `auto_renew` off and call
//! [`Guard::extend`]), and the removal of a hold that an unanswered acquire
//! of a single-node lock may have written under the lock's token (see
//! `docs/driving.md`, "What the loop must not do"): such a hold stands
//! until its TTL runs out, and until then this lock is not granted to
//! anyone, itself included (`lockwright-redis` removes it and retries
//! under a new token).
//!
//! ```no_run
//! use lockwright_blocking::Lock;
//! use lockwright_core::{Config, ProtocolId};
//! use std::time::Duration;
//!
//! let lock = Lock::new(ProtocolId::SetPxLua, Config { ttl_ms: 5_000, ..Config::new("orders") },
//!                      vec!["127.0.0.1:6379".into()], Duration::from_millis(500))?;
//! if let Some(guard) = lock.try_acquire()? {
//!     // ... critical section, until guard.lease().valid_until ...
//!     guard.release()?;
//! }
//! # Ok::<(), lockwright_blocking::Error>(())
//! ```

use lockwright_core::keyspace::{Arg, Command, Reply};
use lockwright_core::{
    Acquire, Call, Config, ConfigError, Event, Lease, Machine, Millis, Outcome, Protocol,
    ProtocolError, ProtocolId, Request, RequestId, Token, UsageError,
};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What an operation can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error("bad configuration: {0}")]
    Config(#[from] ConfigError),
    /// The call is not allowed in the machine's state.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// The machine failed the operation (an error reply, an unexpected one).
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A request of a release or extend got no reply: its outcome is
    /// unknown (the hold may stand until its TTL).
    #[error("no reply, the outcome is unknown: {0}")]
    OutcomeUnknown(String),
    /// The OS random number generator failed.
    #[error("no owner token: {0}")]
    Random(String),
}

/// The clock passed to the machines: monotonic, anchored once to Unix time,
/// so that it also serves the protocols whose `now` all clients share
/// ([`lockwright_core::ClockUse::Shared`]).
fn now() -> Millis {
    static ORIGIN: OnceLock<(Instant, u64)> = OnceLock::new();
    let (origin, unix_ms) = ORIGIN.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        (Instant::now(), unix)
    });
    let elapsed = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
    Millis(unix_ms.saturating_add(elapsed))
}

/// A lock (or semaphore) on `config.name` over the nodes at `addrs`
/// (`host:port`; RedLock's masters in order).
#[derive(Clone, Debug)]
pub struct Lock {
    protocol: ProtocolId,
    config: Config,
    addrs: Vec<String>,
    reply_timeout: Duration,
}

impl Lock {
    /// A lock running `protocol`; each read waits at most `reply_timeout`.
    pub fn new(
        protocol: ProtocolId,
        config: Config,
        addrs: Vec<String>,
        reply_timeout: Duration,
    ) -> Result<Lock, Error> {
        let config = Config {
            nodes: u8::try_from(addrs.len()).unwrap_or(u8::MAX),
            ..config
        };
        Machine::new(protocol, &config, Token("validation".into()))?;
        Ok(Lock {
            protocol,
            config,
            addrs,
            reply_timeout: reply_timeout.max(Duration::from_millis(1)),
        })
    }

    /// One attempt: `Ok(None)` when taken.
    pub fn try_acquire(&self) -> Result<Option<Guard>, Error> {
        self.acquire(Acquire::Once)
    }

    /// Retry until `timeout` has passed: `Ok(None)` when still taken.
    pub fn acquire_within(&self, timeout: Duration) -> Result<Option<Guard>, Error> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.acquire(Acquire::Until(Millis(now().0.saturating_add(ms))))
    }

    fn acquire(&self, how: Acquire) -> Result<Option<Guard>, Error> {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
        let seed = u64::from_le_bytes([
            bytes[16], bytes[17], bytes[18], bytes[19], bytes[20], bytes[21], bytes[22], bytes[23],
        ]);
        let token = Token::new(
            bytes[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
        );
        let config = Config {
            seed,
            ..self.config.clone()
        };
        let mut driver = Driver {
            machine: Machine::new(self.protocol, &config, token)?,
            conns: self.addrs.iter().map(|a| Conn::new(a.clone())).collect(),
            reply_timeout: self.reply_timeout,
            unanswered: None,
        };
        driver.machine.acquire(now(), how)?;
        match driver.run(Call::Acquire)? {
            Event::Acquired(lease) => Ok(Some(Guard { lease, driver })),
            _ => Ok(None),
        }
    }
}

/// A hold. Dropping it without [`Guard::release`] leaves the key to its TTL.
#[derive(Debug)]
pub struct Guard {
    lease: Lease,
    driver: Driver,
}

impl Guard {
    /// The lease: owner token, fence, validity on this process' clock.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Extend the lease by a TTL: [`Error::OutcomeUnknown`] without a
    /// reply; `Ok(false)` when the machine reports it not extended or lost.
    pub fn extend(&mut self) -> Result<bool, Error> {
        self.driver.machine.extend(now())?;
        match self.driver.run(Call::Extend)? {
            Event::Extended { lease, .. } => {
                self.lease = lease;
                Ok(true)
            }
            _ => self.driver.unknown_or(false),
        }
    }

    /// Release: `Ok(true)` when our hold was removed, `Ok(false)` when Redis
    /// said it was gone, [`Error::OutcomeUnknown`] without a reply.
    pub fn release(mut self) -> Result<bool, Error> {
        self.driver.machine.release(now())?;
        match self.driver.run(Call::Release)? {
            Event::Released { was_held } => self.driver.unknown_or(was_held),
            _ => self.driver.unknown_or(false),
        }
    }
}

#[derive(Debug)]
struct Driver {
    machine: Machine,
    conns: Vec<Conn>,
    reply_timeout: Duration,
    /// The last connection problem of the operation in flight.
    unanswered: Option<String>,
}

impl Driver {
    /// Run the machine until it concludes the application's `call`
    /// ([`Event::concludes`]): send its requests,
    /// hand it the replies, sleep until its timers.
    fn run(&mut self, call: Call) -> Result<Event, Error> {
        self.unanswered = None;
        loop {
            let batch: Vec<Request> = std::iter::from_fn(|| self.machine.poll_transmit()).collect();
            if !batch.is_empty() {
                for (request, outcome) in self.exchange(&batch) {
                    self.machine.handle_reply(now(), request, outcome);
                }
                continue;
            }
            if let Some(event) = self.machine.poll_event() {
                match event {
                    Event::Failed(e) => return Err(e.into()),
                    concluded if concluded.concludes(call) => return Ok(concluded),
                    _ => {}
                }
                continue;
            }
            match self.machine.poll_timeout() {
                Some(at) => {
                    let wait = at.0.saturating_sub(now().0);
                    std::thread::sleep(Duration::from_millis(wait));
                    self.machine.handle_timeout(now());
                }
                // Idle, nothing to report, the call not concluded: the
                // contract rules this out (core/tests/contract.rs).
                None => {
                    return Err(Error::Protocol(ProtocolError::Missing(format!(
                        "an event concluding the {call:?} call"
                    ))))
                }
            }
        }
    }

    fn unknown_or(&mut self, value: bool) -> Result<bool, Error> {
        match self.unanswered.take() {
            Some(reason) => Err(Error::OutcomeUnknown(reason)),
            None => Ok(value),
        }
    }

    /// Write every request (each node's in order), then read the replies.
    fn exchange(&mut self, batch: &[Request]) -> Vec<(RequestId, Outcome)> {
        let mut written = Vec::with_capacity(batch.len());
        for request in batch {
            let node = usize::from(request.node.0);
            let sent = match self.conns.get_mut(node) {
                Some(conn) => conn.write(&request.command, self.reply_timeout),
                None => Err(format!("no node {node}")),
            };
            written.push(sent);
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for (request, sent) in batch.iter().zip(written) {
            let node = usize::from(request.node.0);
            let outcome = match (sent, self.conns.get_mut(node)) {
                (Ok(frames), Some(conn)) => conn.read(&request.command, frames),
                (Err(e), _) => Err(e),
                (Ok(_), None) => Err(format!("no node {node}")),
            };
            outcomes.push((
                request.id,
                match outcome {
                    Ok(reply) => Outcome::Reply(reply),
                    Err(reason) => {
                        self.unanswered = Some(reason);
                        Outcome::Unknown
                    }
                },
            ));
        }
        outcomes
    }
}

/// One node's connection, opened on first use and dropped after any
/// problem (the next request opens a new one).
#[derive(Debug)]
struct Conn {
    addr: String,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    fn new(addr: String) -> Conn {
        Conn { addr, stream: None }
    }

    fn open(&mut self, timeout: Duration) -> Result<&mut BufReader<TcpStream>, String> {
        if self.stream.is_none() {
            let addr = self
                .addr
                .to_socket_addrs()
                .map_err(|e| format!("{}: {e}", self.addr))?
                .next()
                .ok_or_else(|| format!("{}: no address", self.addr))?;
            let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
            stream
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            stream
                .set_write_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            self.stream = Some(BufReader::new(stream));
        }
        self.stream
            .as_mut()
            .ok_or_else(|| "not connected".to_owned())
    }

    /// Write the command's frames; returns how many replies to read.
    fn write(&mut self, command: &Command, timeout: Duration) -> Result<usize, String> {
        let mut out = Vec::new();
        let mut frames = 0;
        command.for_each_vector(|argv| {
            frames += 1;
            encode(&mut out, argv);
        });
        let result = self
            .open(timeout)
            .and_then(|s| s.get_mut().write_all(&out).map_err(|e| e.to_string()));
        if result.is_err() {
            self.stream = None;
        }
        result.map(|()| frames)
    }

    /// Read `frames` replies; the command's is the last. `NOSCRIPT` to an
    /// `EVALSHA` sends the script's text and reads that reply instead.
    fn read(&mut self, command: &Command, frames: usize) -> Result<Reply, String> {
        let result = self.read_replies(frames);
        // The script's text only when the server asks for it.
        let noscript = matches!(&result, Ok(Reply::Error(e)) if e.starts_with("NOSCRIPT"));
        let text = if noscript {
            command.eval_text_argv()
        } else {
            None
        };
        let result = match (result, text) {
            (Ok(Reply::Error(_)), Some(text)) => {
                let args: Vec<Arg<'_>> = text.iter().map(|a| Arg::Str(a)).collect();
                let mut out = Vec::new();
                encode(&mut out, &args);
                match self.stream.as_mut() {
                    Some(s) => s
                        .get_mut()
                        .write_all(&out)
                        .map_err(|e| e.to_string())
                        .and_then(|()| self.read_replies(1)),
                    None => Err("not connected".to_owned()),
                }
            }
            (other, _) => other,
        };
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn read_replies(&mut self, n: usize) -> Result<Reply, String> {
        let stream = self.stream.as_mut().ok_or("not connected")?;
        let mut last = Reply::Nil;
        for _ in 0..n {
            last = decode(stream)?;
        }
        Ok(last)
    }
}

/// RESP: `*<n>` then `$<len>` and the bytes of each argument.
fn encode(out: &mut Vec<u8>, argv: &[Arg<'_>]) {
    out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
    for arg in argv {
        arg.with_bytes(|bytes| {
            out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        });
    }
}

/// One RESP2 reply.
fn decode(r: &mut impl BufRead) -> Result<Reply, String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => return Err("connection closed".into()),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    let line = line.trim_end_matches("\r\n");
    let mut chars = line.chars();
    let kind = chars.next();
    let rest = chars.as_str();
    let number = || {
        rest.parse::<i64>()
            .map_err(|_| format!("bad RESP line {line:?}"))
    };
    match kind {
        Some('+') if rest == "OK" => Ok(Reply::ok()),
        Some('+') => Ok(Reply::Status(rest.to_owned().into())),
        Some('-') => Ok(Reply::Error(rest.to_owned())),
        Some(':') => Ok(Reply::Int(number()?)),
        Some('$') => match usize::try_from(number()?) {
            Err(_) => Ok(Reply::Nil),
            // Redis' proto-max-bulk-len default: a longer one is not Redis.
            Ok(len) if len > 512 << 20 => Err(format!("bulk of {len} bytes")),
            Ok(len) => {
                let mut bytes = vec![0u8; len + 2];
                r.read_exact(&mut bytes).map_err(|e| e.to_string())?;
                bytes.truncate(len);
                Ok(Reply::Bulk(String::from_utf8_lossy(&bytes).into_owned()))
            }
        },
        Some('*') => match usize::try_from(number()?) {
            Err(_) => Ok(Reply::Nil),
            Ok(n) => (0..n)
                .map(|_| decode(r))
                .collect::<Result<_, _>>()
                .map(Reply::Array),
        },
        _ => Err(format!("not RESP: {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_as_resp2() {
        let mut input: &[u8] = b"+OK\r\n-ERR no\r\n:7\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n*-1\r\n";
        let replies: Vec<Reply> = (0..6).map(|_| decode(&mut input).unwrap()).collect();
        assert_eq!(
            replies,
            [
                Reply::ok(),
                Reply::Error("ERR no".into()),
                Reply::Int(7),
                Reply::Bulk("abc".into()),
                Reply::Nil,
                Reply::Array(vec![Reply::Int(1), Reply::Nil]),
            ]
        );
        assert!(decode(&mut input).is_err(), "closed");
        // Not RESP at all (a multi-byte first character, bad lengths):
        // errors, never a panic.
        let mut garbage: &[u8] = "é\r\n$x\r\n*-\r\n$9223372036854775807\r\n".as_bytes();
        assert!(decode(&mut garbage).is_err());
        assert!(decode(&mut garbage).is_err());
        assert!(decode(&mut garbage).is_err());
        assert!(decode(&mut garbage).is_err());
    }

    #[test]
    fn commands_encode_as_resp_arrays() {
        let mut out = Vec::new();
        encode(&mut out, &[Arg::Str("GET"), Arg::Str("{a}")]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$3\r\n{a}\r\n");
    }
}
