//! # lockwright-redis
//!
//! The thin tokio + redis driver that runs `lockwright-core` machines against
//! real Redis servers, and the async lock and semaphore API built on it.
//!
//! It re-exports what its API names: [`redis`] (redis-rs 1.x, for
//! `redis::Client`), [`ProtocolId`], [`Fence`], [`Token`] and the core's
//! error types, so `lockwright-redis` and `tokio` are the only
//! dependencies a user needs.
//! It adds no protocol logic of its own: every decision (when to retry, what
//! a reply means, when a lease is lost, when to renew) is the core machine's;
//! this crate executes the machine's requests, feeds the replies and the
//! clock back, and turns events into futures.
//!
//! - [`Lock`] / [`LockGuard`] and [`Semaphore`] / [`Permit`]: `acquire`,
//!   `try_acquire`, `acquire_timeout`; the guard has `fence()`,
//!   `valid_until()`, `extend()`, `release()` and `lost()`. Protocols that
//!   renew (`reentrant`, `fenced`, `time-fenced`, `lease-semaphore`,
//!   `time-fenced-semaphore`) renew while the guard lives.
//! - [`Cache::get_or_load`]: the cache-stampede guard, single flight per key.
//! - [`Nodes`]: one multiplexed connection per node, shared by every lock
//!   and semaphore built on it with `Lock::on` / `Semaphore::on`
//!   (`Lock::new` makes a private one). The protocols that `WATCH` get a
//!   connection per hold instead. A connection the server closed is
//!   replaced before the next request is written.
//! - The driver (see the `driver` module docs) runs an acquire inside the
//!   caller's future and a guard's release and extend inside theirs; only
//!   holds that renew on their own get a task. It sends `EVALSHA` with a
//!   `NOSCRIPT` fallback to `EVAL`, `MULTI … EXEC` as one pipeline, and turns
//!   connection errors and timeouts into the core's unknown outcome.
//! - Wake-on-release (`LockOptions::notify`): one pub/sub connection per
//!   node of a `Nodes`, shared by all its locks (one channel per lock with
//!   waiters); each lock's waiters served in line, one attempt per release
//!   notice, and a fallback retry no later than polling's.
//! - Owner tokens are 128 bits from the OS CSPRNG. AUTH comes from the
//!   `redis://user:password@host` URL, TLS from `rediss://` URLs (with the
//!   crate feature `tls`); no password or owner token reaches Debug output
//!   or logs. Every operation runs in a `tracing` span.
//!
//! ## What the errors say
//!
//! - A release or extend that got no reply fails with
//!   [`Error::OutcomeUnknown`]: the hold may or may not still be on the
//!   server. `release()` answers `Ok(false)` only when Redis said the hold
//!   was gone.
//! - An acquire ends at once on what no retry can mend: [`Error::Auth`],
//!   [`Error::UnknownHost`], [`Error::Protocol`], or an error reply
//!   ([`Error::Redis`], such as `WRONGTYPE` when the lock key holds a value
//!   of another type; see [`Error::is_wrong_type`]). A refused connection
//!   or a timeout is retried until the acquire's deadline (logged at
//!   `warn`, once per new problem), then reported as
//!   [`Error::Unavailable`], or for RedLock [`Error::QuorumUnreachable`]
//!   when too few masters answered to tell "taken" (`Ok(None)`,
//!   [`Error::Timeout`]) from "unreachable".
//! - `fenced` and `lease-semaphore` write the hold before they `INCR` the
//!   fence; when the `INCR` fails, the acquire removes that hold (with its
//!   own token) before it reports the error.
//!
//! ## Cancellation
//!
//! Dropping an `acquire` future part-way leaves no lock beyond its TTL: the
//! driver task outlives the future, sees its handle gone, and releases any
//! grant that still arrives; if the driver cannot run at all (the runtime
//! shuts down), the lock key carries a TTL and expires on its own. Dropping
//! a guard releases in the background the same way.
//!
//! A `Lock` may outlive the runtime it was first used in: a shared
//! connection's I/O runs on the runtime that opened it and ends with it. To
//! a master reached over plain TCP (directly or through Sentinel) the next
//! request, from another runtime, opens a new connection before it is
//! written. A TLS, Unix-socket or Cluster connection is opened by redis-rs,
//! which does not say when its I/O ends: there the first request after the
//! runtime ended fails, as an unknown outcome, and the one after it
//! reconnects.
//!
//! ```no_run
//! use lockwright_redis::{redis, Lock, LockOptions, ProtocolId};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), lockwright_redis::Error> {
//! let client = redis::Client::open("redis://127.0.0.1/").expect("a valid URL");
//! let options = LockOptions::new(ProtocolId::Fenced, Duration::from_secs(5));
//! let lock = Lock::new([client], "invoices", options)?;
//! let guard = lock.acquire().await?;
//! tokio::select! {
//!     () = guard.lost() => { /* stop touching the resource */ }
//!     () = tokio::time::sleep(Duration::from_millis(10)) => { /* work, with guard.fence() */ }
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

#[cfg(not(loom))]
mod cache;
#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod conn;
#[cfg(not(loom))]
mod driver;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod keys;
pub mod lease_cell;
#[cfg(not(loom))]
mod lock;
#[cfg(not(loom))]
mod notices;
#[cfg(not(loom))]
mod park;
#[cfg(not(loom))]
mod source;
mod sync;
#[cfg(not(loom))]
pub mod token;
#[cfg(not(loom))]
pub mod wire;

#[cfg(not(loom))]
pub use cache::{Cache, CacheOptions};
#[cfg(not(loom))]
pub use conn::Nodes;
#[cfg(not(loom))]
pub use error::{Error, LimitError, Operation, OptionsError};
#[cfg(not(loom))]
pub use lock::{Lock, LockGuard, LockOptions, Permit, Semaphore};
/// The core types the API names: the protocol catalogue, fences, owner
/// tokens and the errors [`Error`] wraps.
#[cfg(not(loom))]
pub use lockwright_core::{
    stampede::StampedeError, ConfigError, Fence, Kind, ProtocolError, ProtocolId, Token, UsageError,
};
/// The redis-rs crate this adapter is built on (1.x): build clients with
/// `lockwright_redis::redis::Client::open` without a `redis` dependency of
/// your own, or depend on the same major version.
#[cfg(not(loom))]
pub use redis;
