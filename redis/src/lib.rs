//! # lockwright-redis
//!
//! The thin tokio + redis driver that runs `lockwright-core` machines against
//! real Redis servers, and the async lock and semaphore API built on it.
//! It adds no protocol logic of its own: every decision (when to retry, what
//! a reply means, when a lease is lost, when to renew) is the core machine's;
//! this crate executes the machine's requests, feeds the replies and the
//! clock back, and turns events into futures.
//!
//! - [`Lock`] / [`LockGuard`] and [`Semaphore`] / [`Permit`]: `acquire`,
//!   `try_acquire`, `acquire_timeout`; the guard has `fence()`,
//!   `valid_until()`, `extend()`, `release()` and `lost()`. Protocols that
//!   renew (`reentrant`, `fenced`, `lease-semaphore`) renew while the guard
//!   lives.
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
//! - Wake-on-release (`LockOptions::notify`): one subscription per lock,
//!   its waiters served in line, one attempt per release notice.
//! - Owner tokens are 128 bits from the OS CSPRNG. AUTH comes from the
//!   `redis://user:password@host` URL, TLS from `rediss://` URLs (with the
//!   crate feature `tls`); no password or owner token reaches Debug output
//!   or logs. Every operation runs in a `tracing` span.
//!
//! ## Cancellation
//!
//! Dropping an `acquire` future part-way leaves no lock beyond its TTL: the
//! driver task outlives the future, sees its handle gone, and releases any
//! grant that still arrives; if the driver cannot run at all (the runtime
//! shuts down), the lock key carries a TTL and expires on its own. Dropping
//! a guard releases in the background the same way.
//!
//! ```no_run
//! use lockwright_core::ProtocolId;
//! use lockwright_redis::{Lock, LockOptions};
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
pub mod lease_cell;
#[cfg(not(loom))]
mod lock;
#[cfg(not(loom))]
mod notices;
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
pub use error::Error;
#[cfg(not(loom))]
pub use lock::{Lock, LockGuard, LockOptions, Permit, Semaphore};
