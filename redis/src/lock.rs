//! The async API: [`Lock`] and [`LockGuard`], [`Semaphore`] and [`Permit`].

use crate::clock::clock;
use crate::conn::{Nodes, Route};
use crate::driver::{self, Holder, How, NodeSettings, Op};
use crate::lease_cell::{LeaseCell, Phase};
use crate::notices::Notices;
use crate::token::{seed, token_and_seed};
use crate::Error;
use lockwright_core::{Config, Fence, Kind, Lease, Machine, ProtocolId, Token, UsageError};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

/// How a [`Lock`] or [`Semaphore`] behaves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockOptions {
    /// Which catalogue protocol runs.
    pub protocol: ProtocolId,
    /// The lease's time to live.
    pub ttl: Duration,
    /// Semaphores: how many holders at most.
    pub limit: u32,
    /// How long the driver waits for one reply before treating its outcome
    /// as unknown (and reconnecting).
    pub request_timeout: Duration,
    /// Renew the hold automatically, for the protocols that renew
    /// (`reentrant`, `fenced`, `lease-semaphore`).
    pub auto_renew: bool,
    /// After a grant, `WAIT` for this many replicas; fewer acknowledging
    /// undoes the grant and fails with [`Error::ReplicasNotAcknowledged`].
    pub wait_replicas: Option<u32>,
    /// Clock-drift allowance subtracted from every lease; `None` is RedLock's
    /// `ttl/100 + 2 ms`.
    pub drift: Option<Duration>,
    /// First delay between acquire attempts.
    pub retry_base: Duration,
    /// Largest delay between acquire attempts.
    pub retry_max: Duration,
    /// Wake-on-release: this lock's releases publish a notice on
    /// `<key>:released` (the release scripts' `PUBLISH`, see
    /// `Config::notify_releases`), and its waiters wait for notices instead of
    /// the core's timed retries, with a fallback retry in case a notice is
    /// missed or never sent. Every process taking the lock should set it: a
    /// holder without it releases silently, and waiters then fall back to
    /// their timed retry.
    pub notify: bool,
}

impl Default for LockOptions {
    fn default() -> LockOptions {
        LockOptions {
            protocol: ProtocolId::SetPxLua,
            ttl: Duration::from_secs(10),
            limit: 1,
            request_timeout: Duration::from_secs(1),
            auto_renew: true,
            wait_replicas: None,
            drift: None,
            retry_base: Duration::from_millis(10),
            retry_max: Duration::from_millis(200),
            notify: false,
        }
    }
}

impl LockOptions {
    /// Defaults with `protocol` and `ttl`.
    pub fn new(protocol: ProtocolId, ttl: Duration) -> LockOptions {
        LockOptions {
            protocol,
            ttl,
            ..LockOptions::default()
        }
    }
}

fn request_timeout(options: &LockOptions) -> Duration {
    options.request_timeout.max(Duration::from_millis(1))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Build a machine; the core validates the configuration.
fn build_machine(id: ProtocolId, config: &Config, token: Token) -> Result<Machine, Error> {
    Ok(Machine::new(id, config, token)?)
}

/// What a lock and a semaphore share.
struct Shared {
    /// Node `i`'s route: its shared connection, or (for the protocols that
    /// `WATCH`) its client, for connections of each hold's own.
    routes: Vec<Route>,
    protocol: ProtocolId,
    config: Config,
    settings: NodeSettings,
    /// With `notify`: the lock's release notices and line of waiters.
    notices: Option<Arc<Notices>>,
}

/// The longest fallback wait between notified attempts.
const MAX_NOTIFY_FALLBACK: Duration = Duration::from_secs(2);

impl Shared {
    fn new(
        nodes: &Nodes,
        name: String,
        options: &LockOptions,
        wanted: Kind,
    ) -> Result<Shared, Error> {
        let actual = options.protocol.kind();
        if actual != wanted {
            return Err(Error::WrongKind {
                protocol: options.protocol,
                wanted,
                actual,
            });
        }
        let config = Config {
            ttl_ms: millis(options.ttl),
            nodes: u8::try_from(nodes.len()).unwrap_or(u8::MAX),
            limit: options.limit,
            drift_ms: options.drift.map(millis),
            reply_timeout_ms: None,
            retry_base_ms: millis(options.retry_base).max(1),
            retry_max_ms: millis(options.retry_max).max(1),
            auto_renew: options.auto_renew,
            wait_replicas: options.wait_replicas,
            notify_releases: options.notify,
            ..Config::new(name)
        };
        // Validate once, with a placeholder owner, so that a bad configuration
        // fails here rather than at the first acquire.
        build_machine(options.protocol, &config, Token("validation".into()))?;
        let routes = nodes.routes(options.protocol);
        let notices = match (options.notify, routes.first()) {
            (true, Some(route)) => Some(Notices::new(
                route.client().clone(),
                &config.key(),
                request_timeout(options),
            )),
            _ => None,
        };
        Ok(Shared {
            routes,
            protocol: options.protocol,
            config,
            settings: NodeSettings {
                request_timeout: request_timeout(options),
            },
            notices,
        })
    }

    async fn acquire(&self, how: How) -> Result<Option<LockGuard>, Error> {
        match &self.notices {
            Some(notices) if how != How::Once => self.acquire_notified(notices, how).await,
            _ => self.acquire_driven(how).await,
        }
    }

    /// Wait without polling: in line behind this lock's other waiters, one
    /// attempt per release notice (see the `notices` module), with a
    /// jittered fallback retry in case a notice never comes.
    async fn acquire_notified(
        &self,
        notices: &Arc<Notices>,
        how: How,
    ) -> Result<Option<LockGuard>, Error> {
        let deadline = match how {
            How::Within(d) => Some(tokio::time::Instant::now() + d),
            How::Once | How::Forever => None,
        };
        // In line (and subscribed) before the first attempt, so that a
        // release between a denied attempt and the wait is not missed.
        let ticket = notices.join().await;
        let mut try_now = !ticket.had_waiters_ahead();
        loop {
            if try_now {
                if let Some(guard) = self.acquire_driven(How::Once).await? {
                    ticket.granted();
                    return Ok(Some(guard));
                }
            }
            try_now = true;
            let mut wait = self.fallback_wait()?;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                wait = wait.min(left);
            }
            tokio::select! {
                () = ticket.notified() => tracing::debug!("release notice"),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to wait for a notice before trying anyway: the TTL (a hold
    /// ends by then unless renewed), capped, jittered to 50–100 %.
    fn fallback_wait(&self) -> Result<Duration, Error> {
        let bound = Duration::from_millis(self.config.ttl_ms).min(MAX_NOTIFY_FALLBACK);
        let percent = 50 + seed()? % 51;
        Ok(bound * u32::try_from(percent).unwrap_or(100) / 100 + Duration::from_millis(1))
    }

    async fn acquire_driven(&self, how: How) -> Result<Option<LockGuard>, Error> {
        let span = tracing::info_span!(
            "hold",
            name = %self.config.name,
            protocol = %self.protocol,
        );
        let op_span = tracing::info_span!(parent: &span, "acquire", ?how);
        async {
            let (token, seed) = token_and_seed()?;
            let config = Config {
                seed,
                ..self.config.clone()
            };
            let machine = build_machine(self.protocol, &config, token)?;
            // The acquire runs in this future. Dropping the future part-way
            // drops `driver`, which then finishes in a task of its own: it
            // gives back any grant that arrives and stops.
            let mut driver = driver::new(machine, &self.routes, &self.settings, span.clone());
            let (done, mut result) = oneshot::channel();
            driver.apply(Op::Acquire { how, done });
            let granted = driver.drive(&mut result).await.ok_or(Error::DriverGone)??;
            Ok(match granted {
                Some(g) => Some(LockGuard {
                    lost: driver.lost(),
                    holder: driver.into_holder(),
                    lease: g.lease,
                    cell: g.cell,
                    span,
                }),
                None => None,
            })
        }
        .instrument(op_span)
        .await
    }

    fn fmt_nodes(&self) -> Vec<String> {
        // The address only: a client's connection info also holds the
        // password, which must never reach Debug output or logs.
        self.routes
            .iter()
            .map(|r| r.client().get_connection_info().addr.to_string())
            .collect()
    }
}

/// A distributed lock on one name, over one Redis node (or several, for
/// RedLock). Cheap to clone; clones share one connection per node (see
/// below). Every acquire makes a new owner token and a new machine.
///
/// Connections: the holds of a `Lock` and its clones share one multiplexed
/// connection per node, opened at the first request and reopened when the
/// server closes it. The protocols that `WATCH` (`setnx-del`,
/// `setnx-expire`, `set-px-watch`, `watch-semaphore`) open a connection per
/// hold instead, since watched keys belong to one connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockwright_redis::Error> {
/// use lockwright_redis::{Lock, LockOptions};
/// use lockwright_core::ProtocolId;
/// use std::time::Duration;
///
/// let client = redis::Client::open("redis://127.0.0.1:6379/").expect("a valid URL");
/// let lock = Lock::new(vec![client], "orders", LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(5)))?;
/// let guard = lock.acquire_timeout(Duration::from_secs(1)).await?;
/// // ... critical section, until guard.valid_until() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.shared.config.name)
            .field("protocol", &self.shared.protocol)
            .field("nodes", &self.shared.fmt_nodes())
            .finish()
    }
}

impl Lock {
    /// A lock on `name` over `clients` (one node, or RedLock's masters),
    /// with connections of its own (shared by its clones). Fails with
    /// [`Error::Config`] for a configuration the core rejects (empty name,
    /// TTL 0 or too large, several nodes for a single-node protocol) and
    /// [`Error::WrongKind`] for a semaphore protocol.
    pub fn new(
        clients: impl IntoIterator<Item = redis::Client>,
        name: impl Into<String>,
        options: LockOptions,
    ) -> Result<Lock, Error> {
        let nodes = Nodes::with_connect_timeout(clients, request_timeout(&options));
        Lock::on(&nodes, name, options)
    }

    /// A lock on `name` over the connections of `nodes`, shared with every
    /// other lock and semaphore on them. Fails as [`Lock::new`] does.
    pub fn on(nodes: &Nodes, name: impl Into<String>, options: LockOptions) -> Result<Lock, Error> {
        let shared = Shared::new(nodes, name.into(), &options, Kind::Lock)?;
        Ok(Lock {
            shared: Arc::new(shared),
        })
    }

    /// The protocol this lock runs.
    pub fn protocol(&self) -> ProtocolId {
        self.shared.protocol
    }

    /// The Redis key holding the lock: `{name}`.
    pub fn key(&self) -> String {
        self.shared.config.key()
    }

    /// Wait until the lock is ours.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        self.shared
            .acquire(How::Forever)
            .await?
            .ok_or(Error::Timeout)
    }

    /// One attempt: `None` when someone else holds it.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.shared.acquire(How::Once).await
    }

    /// Retry until `timeout`; [`Error::Timeout`] when it runs out first.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard, Error> {
        self.shared
            .acquire(How::Within(timeout))
            .await?
            .ok_or(Error::Timeout)
    }
}

/// A counting semaphore: at most `limit` permits at once.
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.shared.config.name)
            .field("protocol", &self.shared.protocol)
            .field("limit", &self.shared.config.limit)
            .field("nodes", &self.shared.fmt_nodes())
            .finish()
    }
}

impl Semaphore {
    /// A semaphore on `name` with `options.limit` permits, on one node,
    /// with connections of its own (shared by its clones).
    pub fn new(
        clients: impl IntoIterator<Item = redis::Client>,
        name: impl Into<String>,
        options: LockOptions,
    ) -> Result<Semaphore, Error> {
        let nodes = Nodes::with_connect_timeout(clients, request_timeout(&options));
        Semaphore::on(&nodes, name, options)
    }

    /// A semaphore on `name` over the connections of `nodes`, shared with
    /// every other lock and semaphore on them.
    pub fn on(
        nodes: &Nodes,
        name: impl Into<String>,
        options: LockOptions,
    ) -> Result<Semaphore, Error> {
        let shared = Shared::new(nodes, name.into(), &options, Kind::Semaphore)?;
        Ok(Semaphore {
            shared: Arc::new(shared),
        })
    }

    /// Wait for a permit.
    pub async fn acquire(&self) -> Result<Permit, Error> {
        self.shared
            .acquire(How::Forever)
            .await?
            .ok_or(Error::Timeout)
    }

    /// One attempt: `None` when every permit is taken.
    pub async fn try_acquire(&self) -> Result<Option<Permit>, Error> {
        self.shared.acquire(How::Once).await
    }

    /// Retry until `timeout`; [`Error::Timeout`] when it runs out first.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit, Error> {
        self.shared
            .acquire(How::Within(timeout))
            .await?
            .ok_or(Error::Timeout)
    }
}

/// A semaphore permit: the same guard as a lock's.
pub type Permit = LockGuard;

/// A held lock (or permit).
///
/// Leave the critical section by [`valid_until`](LockGuard::valid_until) or
/// when [`lost`](LockGuard::lost) fires, whichever is first. Protocols that
/// renew keep renewing while the guard lives. Dropping the guard releases
/// the hold in the background (best effort: if that release cannot run,
/// the TTL ends the hold).
pub struct LockGuard {
    holder: Holder,
    lost: watch::Receiver<bool>,
    lease: Lease,
    cell: LeaseCell,
    span: tracing::Span,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner token is the proof of ownership: not printed.
        f.debug_struct("LockGuard")
            .field("fence", &self.lease.fence)
            .field("phase", &self.cell.snapshot().phase)
            .field("valid_until", &self.valid_until())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The fencing token, for protocols that issue one: pass it to the
    /// protected resource, which must refuse older fences.
    pub fn fence(&self) -> Option<Fence> {
        self.lease.fence
    }

    /// The owner token written to Redis.
    pub fn token(&self) -> &Token {
        &self.lease.token
    }

    /// When the hold stops being valid on this process' monotonic clock
    /// (moves forward with every renewal).
    pub fn valid_until(&self) -> Instant {
        let clock = clock();
        clock
            .instant_of(self.cell.snapshot().valid_until)
            // A TTL beyond what `Instant` can represent: far enough.
            .or_else(|| Instant::now().checked_add(Duration::from_secs(u64::from(u32::MAX))))
            .unwrap_or_else(Instant::now)
    }

    /// Time left until [`valid_until`](LockGuard::valid_until).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Is the hold still held (not released, not lost, not expired)?
    pub fn is_held(&self) -> bool {
        self.cell.snapshot().phase == Phase::Held && self.remaining() > Duration::ZERO
    }

    /// Has the hold been lost (its validity ran out, or a renewal or extend
    /// found the key gone or taken)?
    pub fn is_lost(&self) -> bool {
        let snapshot = self.cell.snapshot();
        match snapshot.phase {
            Phase::Lost => true,
            Phase::Released => false,
            Phase::Held => clock().now() >= snapshot.valid_until,
        }
    }

    /// Resolves once, when the hold is lost: its validity ran out without a
    /// renewal, or a renewal or extend found the key gone or taken. Never
    /// resolves after a release. Use it in a `select!` beside the critical
    /// section.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut lost = self.lost.clone();
        let cell = self.cell.clone();
        async move {
            loop {
                let snapshot = cell.snapshot();
                let until = match snapshot.phase {
                    Phase::Lost => return,
                    Phase::Released => return std::future::pending::<()>().await,
                    Phase::Held if clock().now() >= snapshot.valid_until => return,
                    Phase::Held => clock().instant_of(snapshot.valid_until),
                };
                let expiry = async {
                    match until {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // Lost by the driver's word (a failed renewal or extend);
                    // a driver gone without a word leaves the expiry.
                    Ok(_) = lost.wait_for(|lost| *lost) => return,
                    // Validity ran out, unless a renewal moved it: look again.
                    () = expiry => {}
                }
            }
        }
    }

    async fn call<T>(
        &mut self,
        op: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> Op,
    ) -> Result<T, Error> {
        self.holder.call(op).await
    }

    /// Extend the hold by the TTL, measured from now.
    pub async fn extend(&mut self) -> Result<(), Error> {
        let span = tracing::info_span!(parent: &self.span, "extend");
        match self.call(|done| Op::Extend { done }).instrument(span).await {
            Ok(lease) => {
                self.lease = lease;
                Ok(())
            }
            Err(Error::Usage(UsageError::NotHeld)) => Err(Error::Lost),
            Err(e) => Err(e),
        }
    }

    /// Release the hold. `Ok(true)` when our hold was removed, `Ok(false)`
    /// when it was already gone (expired, or taken by someone else).
    pub async fn release(mut self) -> Result<bool, Error> {
        let span = tracing::info_span!(parent: &self.span, "release");
        self.cell.release();
        match self
            .call(|done| Op::Release { done })
            .instrument(span)
            .await
        {
            // Already lost: nothing of ours is left to remove.
            Err(Error::Usage(UsageError::NotHeld)) => Ok(false),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_and_guards_are_send_and_sync() {
        assert_send_sync::<Lock>();
        assert_send_sync::<Semaphore>();
        assert_send_sync::<LockGuard>();
        assert_send_sync::<Nodes>();
    }
}
