//! The async API: [`Lock`] and [`LockGuard`], [`Semaphore`] and [`Permit`].

use crate::clock::clock;
use crate::conn::{Nodes, Route};
use crate::driver::{self, Call, HoldRelease, Holder, How, NodeSettings, TokenRelease};
use crate::keys::KeyMap;
use crate::lease_cell::{LeaseCell, Phase};
use crate::notices::Notices;
use crate::token::{seed, token_and_seed};
use crate::{Error, LimitError, OptionsError};
use lockwright_core::keyspace::{Command, Reply, Script};
use lockwright_core::{Config, Fence, Kind, Lease, Machine, ProtocolId, Token, UsageError};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How a [`Lock`] or [`Semaphore`] behaves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockOptions {
    /// Which catalogue protocol runs.
    pub protocol: ProtocolId,
    /// The lease's time to live: at least 1 ms (Redis' resolution; a
    /// fraction of a millisecond beyond that is cut off).
    pub ttl: Duration,
    /// Semaphores: how many holders at most. Must stay 1 on a [`Lock`].
    pub limit: u32,
    /// How long the driver waits for one reply before treating its outcome
    /// as unknown (and reconnecting). Must be shorter than `ttl`.
    pub request_timeout: Duration,
    /// Renew the hold automatically while the guard lives. Only
    /// `reentrant`, `fenced`, `time-fenced`, `lease-semaphore` and
    /// `time-fenced-semaphore` renew;
    /// [`LockOptions::new`] turns it on for them and off for the others,
    /// and asking it of another protocol is
    /// [`OptionsError::AutoRenewWithoutRenewal`].
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
    /// missed or never sent (after at most `retry_max`, as polling would).
    /// The notices of every lock on one [`Nodes`] arrive on one pub/sub
    /// connection per node. Every process taking the lock should set it: a
    /// holder without it releases silently, and waiters then fall back to
    /// their timed retry.
    pub notify: bool,
    /// Interop mode: use the name exactly as given as the lock key (no
    /// `{…}` hash tag, braces allowed), so that lockwright and another
    /// client of the same key exclude one another: redis-py's `Lock` and
    /// rslock with `set-px-lua`, Redisson's `RLock` with `reentrant`.
    /// Companion keys become `<name>:fence`, `<name>:permits`, ... What it
    /// gives up: in Redis Cluster the companions are no longer in the lock
    /// key's slot (unless the name carries a hash tag of its own), so the
    /// protocols whose scripts touch several keys (`fenced`, the
    /// semaphores) fail there with `CROSSSLOT`.
    pub exact_key: bool,
}

impl Default for LockOptions {
    fn default() -> LockOptions {
        LockOptions {
            protocol: ProtocolId::SetPxLua,
            ttl: Duration::from_secs(10),
            limit: 1,
            request_timeout: Duration::from_secs(1),
            auto_renew: false,
            wait_replicas: None,
            drift: None,
            retry_base: Duration::from_millis(10),
            retry_max: Duration::from_millis(200),
            notify: false,
            exact_key: false,
        }
    }
}

impl LockOptions {
    /// Defaults with `protocol` and `ttl`; `auto_renew` is on for the
    /// protocols that renew.
    pub fn new(protocol: ProtocolId, ttl: Duration) -> LockOptions {
        LockOptions {
            protocol,
            ttl,
            auto_renew: renews(protocol),
            ..LockOptions::default()
        }
    }

    /// The adapter's own checks (the core checks the rest).
    fn check(&self, wanted: Kind) -> Result<(), OptionsError> {
        if self.ttl < Duration::from_millis(1) && !self.ttl.is_zero() {
            return Err(OptionsError::SubMillisecondTtl { ttl: self.ttl });
        }
        if !self.ttl.is_zero() && self.request_timeout >= self.ttl {
            return Err(OptionsError::RequestTimeoutNotBelowTtl {
                request_timeout: self.request_timeout,
                ttl: self.ttl,
            });
        }
        if wanted == Kind::Lock && self.limit != 1 {
            return Err(OptionsError::LimitOnLock { limit: self.limit });
        }
        if self.auto_renew && !renews(self.protocol) {
            return Err(OptionsError::AutoRenewWithoutRenewal {
                protocol: self.protocol,
            });
        }
        Ok(())
    }
}

/// Does the protocol's machine renew a hold on its own (with `auto_renew`)?
fn renews(protocol: ProtocolId) -> bool {
    matches!(
        protocol,
        ProtocolId::Reentrant
            | ProtocolId::Fenced
            | ProtocolId::TimeFenced
            | ProtocolId::LeaseSemaphore
            | ProtocolId::TimeFencedSemaphore
    )
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

/// The Redis types a protocol may keep at its main key (`{name}`), for the
/// protocols whose acquire reads a key of another type as "taken" instead
/// of failing with `WRONGTYPE`.
fn key_type(protocol: ProtocolId) -> Option<&'static [&'static str]> {
    match protocol {
        ProtocolId::SetnxDel
        | ProtocolId::SetnxExpire
        | ProtocolId::SetnxGetset
        | ProtocolId::SetPxGetDel
        | ProtocolId::SetPxWatch
        | ProtocolId::SetPxLua
        | ProtocolId::Fenced
        | ProtocolId::TimeFenced
        | ProtocolId::Redlock => Some(&["string"]),
        ProtocolId::Reentrant => Some(&["hash"]),
        _ => None,
    }
}

/// Errors a later attempt may not see: the node could not be reached.
fn is_transient(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_) | Error::QuorumUnreachable { .. })
}

/// The name of the core's key `key` in Redis (renamed with exact keys).
/// The key a protocol's release script removes our hold from, and whose
/// `:released` channel it publishes on: a lease semaphore's permits, the
/// lock key otherwise.
fn released_key(protocol: ProtocolId, config: &Config) -> String {
    match protocol {
        ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore => config.key_with("permits"),
        _ => config.key(),
    }
}

fn redis_key(settings: &NodeSettings, key: &str) -> String {
    match &settings.keys {
        Some(keys) => keys.key(key),
        None => key.to_owned(),
    }
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
    /// How a hold is removed by its owner token (`None`: it cannot be).
    token_release: Option<Arc<TokenRelease>>,
    /// An attempt after an unanswered one runs under a new owner token
    /// (`false` only in [`Lock::retrying_under_one_token`]).
    fresh_tokens: bool,
    /// The maker of the machines for those attempts, built once for the
    /// lock (see [`Shared::fresh_attempts`]).
    make_fresh: Option<driver::MakeMachine>,
    /// The driver the last hold left, for the next acquire.
    spare: Arc<driver::Spare>,
    /// The nodes' alarm task, for holds that renew (see `driver::Parked`).
    alarms: Arc<driver::Alarms>,
}

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
        options.check(wanted)?;
        if nodes.is_cluster() && options.protocol.uses_watch() {
            return Err(OptionsError::WatchOnCluster {
                protocol: options.protocol,
            }
            .into());
        }
        // Exact keys: the core works on a tagged placeholder name (its own
        // rules for names, such as no braces, then do not apply to `name`)
        // and the adapter renames the keys on their way to Redis.
        let (core_name, keys) = if options.exact_key {
            if name.is_empty() {
                return Err(Error::Config(lockwright_core::ConfigError::EmptyName));
            }
            let placeholder = Config::new("exact");
            let keys = KeyMap::new(placeholder.key(), name);
            (placeholder.name, Some(Arc::new(keys)))
        } else {
            (name.into(), None)
        };
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
            ..Config::new(core_name)
        };
        // Validate once, with a placeholder owner, so that a bad configuration
        // fails here rather than at the first acquire.
        build_machine(options.protocol, &config, Token("validation".into()))?;
        let routes = nodes.routes(options.protocol);
        let settings = NodeSettings {
            request_timeout: request_timeout(options),
            keys,
        };
        let notices = match (options.notify, nodes.hub(0)) {
            (true, Some(hub)) => {
                let released = released_key(options.protocol, &config);
                let channel = format!("{}:released", redis_key(&settings, &released));
                Some(Notices::new(hub, channel))
            }
            _ => None,
        };
        let token_release = Shared::token_release(options.protocol, &config);
        let make_fresh = Shared::make_fresh(options.protocol, &config, token_release.as_deref());
        Ok(Shared {
            routes,
            protocol: options.protocol,
            token_release,
            config,
            settings,
            notices,
            fresh_tokens: true,
            make_fresh,
            spare: Arc::default(),
            alarms: Arc::clone(nodes.alarms()),
        })
    }

    /// The name of the core's key `key` in Redis.
    fn redis_key(&self, key: &str) -> String {
        redis_key(&self.settings, key)
    }

    /// `command` with the keys Redis should see.
    fn redis_command(&self, mut command: Command) -> Command {
        if let Some(keys) = &self.settings.keys {
            keys.command(&mut command);
        }
        command
    }

    /// The lock's name as the user gave it (for logs and Debug).
    fn name(&self) -> String {
        match &self.settings.keys {
            Some(_) => self.redis_key(&self.config.key()),
            None => self.config.name.to_string(),
        }
    }

    async fn acquire(&self, how: How) -> Result<Option<LockGuard>, Error> {
        if let Some(notices) = &self.notices {
            if how != How::Once {
                return self.acquire_notified(notices, how).await;
            }
        }
        if how == How::Once {
            let granted = self.acquire_driven(How::Once).await?;
            if granted.is_none() {
                self.check_key_type().await?;
            }
            return Ok(granted);
        }
        // A first attempt of its own: when it is denied, make sure the key
        // holds what the protocol writes (a lock key of another type reads
        // as "taken" to `SET NX` and `SETNX`, and would be waited on
        // forever), then wait the usual way.
        let started = tokio::time::Instant::now();
        match self.acquire_driven(How::Once).await {
            Ok(Some(guard)) => return Ok(Some(guard)),
            Ok(None) => self.check_key_type().await?,
            // Unreachable for now: the waiting acquire retries until its
            // deadline and reports the problem then.
            Err(e) if is_transient(&e) => {}
            Err(e) => return Err(e),
        }
        let how = match how {
            How::Within(d) => How::Within(d.saturating_sub(started.elapsed())),
            other => other,
        };
        self.acquire_driven(how).await
    }

    /// After a denial: `WRONGTYPE` when the lock key holds a value of a type
    /// the protocol never writes there. The check is a diagnostic (one
    /// `TYPE` on the first node); when it cannot run, the denial stands.
    async fn check_key_type(&self) -> Result<(), Error> {
        let Some(expected) = key_type(self.protocol) else {
            return Ok(());
        };
        let Some(route) = self.routes.first() else {
            return Ok(());
        };
        let key = self.redis_key(&self.config.key());
        match route.type_of(&key, self.settings.request_timeout).await {
            Ok(found) if found != "none" && !expected.contains(&found.as_str()) => {
                Err(Error::Redis(format!(
                    "WRONGTYPE Operation against a key holding the wrong kind of value \
                     ({key} holds a {found}; {} keeps a {} there)",
                    self.protocol,
                    expected.join(" or ")
                )))
            }
            _ => Ok(()),
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
            // A deadline beyond what the clock can represent is none.
            How::Within(d) => tokio::time::Instant::now().checked_add(d),
            How::Once | How::Forever => None,
        };
        // In line (and subscribed) before the first attempt, so that a
        // release between a denied attempt and the wait is not missed.
        let ticket = notices.join().await;
        let mut try_now = !ticket.had_waiters_ahead();
        let mut type_checked = false;
        let mut unreachable: Option<Error> = None;
        loop {
            if try_now {
                match self.acquire_driven(How::Once).await {
                    Ok(Some(guard)) => {
                        ticket.granted();
                        return Ok(Some(guard));
                    }
                    Ok(None) => {
                        unreachable = None;
                        if !type_checked {
                            type_checked = true;
                            self.check_key_type().await?;
                        }
                    }
                    Err(e) if is_transient(&e) => unreachable = Some(e),
                    Err(e) => return Err(e),
                }
            }
            try_now = true;
            let mut wait = self.fallback_wait()?;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return match unreachable {
                        Some(e) => Err(e),
                        None => Ok(None),
                    };
                }
                wait = wait.min(left);
            }
            tokio::select! {
                () = ticket.notified() => tracing::debug!("release notice"),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to wait for a notice before trying anyway: no longer than
    /// polling would (`retry_max`), nor than the TTL, jittered to 50–100 %.
    /// A holder that releases without a notice (a peer library, a client
    /// without `notify`) then costs a waiter no more than polling does.
    fn fallback_wait(&self) -> Result<Duration, Error> {
        let bound = Duration::from_millis(self.config.ttl_ms.min(self.config.retry_max_ms));
        let percent = 50 + seed()? % 51;
        Ok(bound * u32::try_from(percent).unwrap_or(100) / 100 + Duration::from_millis(1))
    }

    async fn acquire_driven(&self, how: How) -> Result<Option<LockGuard>, Error> {
        let span = tracing::info_span!(
            "hold",
            name = %self.name(),
            protocol = %self.protocol,
        );
        let op_span = tracing::info_span!(parent: &span, "acquire", ?how);
        driver::in_span(op_span, async {
            let (token, seed) = token_and_seed()?;
            let config = Config {
                seed,
                ..self.config.clone()
            };
            let token_release = self.token_release.as_ref().map(|how| HoldRelease {
                how: Arc::clone(how),
                token: token.clone(),
            });
            let machine = if self.protocol == ProtocolId::Redlock && !self.fresh_tokens {
                Machine::Redlock(
                    lockwright_core::locks::redlock::Redlock::with_one_token_for_every_round(
                        &config, token,
                    )?,
                )
            } else {
                build_machine(self.protocol, &config, token)?
            };
            let fresh = self.fresh_attempts();
            // The acquire runs in this future. Dropping the future part-way
            // drops `driver`, which then finishes in a task of its own: it
            // gives back any grant that arrives and stops.
            let mut driver = driver::new(
                machine,
                &self.routes,
                &self.settings,
                span.clone(),
                token_release,
                fresh,
                &self.spare,
            );
            let done = driver.done();
            driver.apply(Call::Acquire { how, done });
            let granted = driver
                .drive::<Result<Option<driver::Granted>, Error>>()
                .await
                .ok_or(Error::DriverGone)??;
            Ok(match granted {
                Some(g) => Some(LockGuard {
                    protocol: self.protocol,
                    holds: 1,
                    lost: driver.lost(),
                    holder: driver.into_holder(&self.alarms),
                    lease: g.lease,
                    cell: g.cell,
                    span,
                }),
                None => None,
            })
        })
        .await
    }

    /// Where an acquire undoes its unanswered attempts by token, what makes
    /// the machines for the attempts after them, each under a new owner
    /// token (see `driver::FreshAttempt`).
    fn fresh_attempts(&self) -> Option<driver::FreshAttempt> {
        self.make_fresh.clone().map(driver::FreshAttempt::new)
    }

    /// The maker behind [`Shared::fresh_attempts`], for a lock of
    /// `protocol` with `base` whose unanswered attempts are undone as
    /// `token_release` says (`None`: they are not, and no maker is needed).
    fn make_fresh(
        protocol: ProtocolId,
        base: &Config,
        token_release: Option<&TokenRelease>,
    ) -> Option<driver::MakeMachine> {
        if !token_release.is_some_and(|t| t.after_unknown_attempt) {
            return None;
        }
        let base = base.clone();
        Some(Arc::new(move |n: u32| {
            let (token, seed) = token_and_seed()?;
            // The base delay doubles with each machine built (see `MakeMachine`).
            let grown = base
                .retry_base_ms
                .saturating_mul(1u64 << n.min(32))
                .min(base.retry_max_ms)
                .max(base.retry_base_ms);
            let config = Config {
                seed,
                retry_base_ms: grown,
                ..base.clone()
            };
            Ok((build_machine(protocol, &config, token.clone())?, token))
        }))
    }

    /// How to remove this protocol's hold with the owner token alone: after
    /// an acquire request without a reply (that request may have written a
    /// hold under our token, which nobody would release; under `setnx-del`,
    /// which sets no TTL, ever), and for a release after the hold was lost
    /// by our reckoning (the key may still be ours on the server). `None`
    /// where nothing on the server names the owner (`setnx-getset` stores a
    /// timestamp) or the release is a multi-step recipe (the ZSET and WATCH
    /// semaphores).
    fn token_release(protocol: ProtocolId, config: &Config) -> Option<Arc<TokenRelease>> {
        let with = |script, keys, args_before, repeat_while_zero, after_unknown_attempt| {
            Some(Arc::new(TokenRelease {
                script,
                keys,
                args_before,
                notify: config.notify_releases,
                repeat_while_zero,
                after_unknown_attempt,
            }))
        };
        let key = || vec![config.key()];
        match protocol {
            ProtocolId::SetPxLua
            | ProtocolId::SetPxGetDel
            | ProtocolId::SetPxWatch
            | ProtocolId::Fenced
            | ProtocolId::TimeFenced
            | ProtocolId::SetnxDel
            | ProtocolId::SetnxExpire => with(Script::CompareAndDelete, key(), vec![], false, true),
            // The machine undoes an unanswered round on every master itself.
            ProtocolId::Redlock => with(Script::CompareAndDelete, key(), vec![], false, false),
            // A lost hold's levels all go: unlock while levels are left.
            ProtocolId::Reentrant => with(
                Script::ReentrantUnlock,
                key(),
                vec![config.ttl_ms.to_string()],
                true,
                true,
            ),
            ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore => with(
                Script::LeaseRelease,
                vec![released_key(protocol, config)],
                vec![],
                false,
                false,
            ),
            _ => None,
        }
    }

    fn fmt_nodes(&self) -> Vec<String> {
        // The address only: a client's connection info also holds the
        // password, which must never reach Debug output or logs.
        self.routes.iter().map(|r| r.describe()).collect()
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
/// Memory: after its first hold ends, a `Lock` (with its clones) keeps that
/// hold's driver, emptied, for its next acquire (about 1 to 2 KB: the
/// driver, its per-node links and the last machine), and each node keeps
/// up to 64 spare request slots of about 1.6 KB for the requests of every
/// lock on it. The driver goes with the `Lock` and its clones, the slots
/// with the node (its `Nodes` and every lock on them).
///
/// ```no_run
/// # async fn demo() -> Result<(), lockwright_redis::Error> {
/// use lockwright_redis::{redis, Lock, LockOptions, ProtocolId};
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
            .field("name", &self.shared.name())
            .field("protocol", &self.shared.protocol)
            .field("nodes", &self.shared.fmt_nodes())
            .finish()
    }
}

impl Lock {
    /// A lock on `name` over `clients` (one node, or RedLock's masters),
    /// with connections of its own (shared by its clones). Fails with
    /// [`Error::Config`] for a configuration the core rejects (empty name,
    /// TTL 0 or too large, several nodes for a single-node protocol),
    /// [`Error::Options`] for options the adapter refuses (a request timeout
    /// not below the TTL, a TTL under 1 ms, a `limit` other than 1,
    /// `auto_renew` on a protocol that does not renew) and
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

    /// A deliberate bug, for the tests that must catch it: the attempt
    /// after an unanswered one reuses the owner token, so the undo of the
    /// unanswered attempt, held up on the network, can remove the retry's
    /// hold (for RedLock: its machine's round after an unanswered undo
    /// round, `Redlock::with_one_token_for_every_round`). Takes effect on a
    /// lock without clones (call it on the lock [`Lock::new`] returned);
    /// otherwise it changes nothing.
    #[doc(hidden)]
    pub fn retrying_under_one_token(mut self) -> Lock {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.fresh_tokens = false;
            shared.make_fresh = None;
        }
        self
    }

    /// The Redis key holding the lock: `{name}`, or the name itself with
    /// [`LockOptions::exact_key`].
    pub fn key(&self) -> String {
        self.shared.redis_key(&self.shared.config.key())
    }

    /// Wait until the lock is ours. Ends at once with an error no retry can
    /// mend (see the crate docs); an unreachable server is retried for as
    /// long as it takes.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        self.shared
            .acquire(How::Forever)
            .await?
            .ok_or(Error::Timeout)
    }

    /// One attempt: `None` when someone else holds it;
    /// [`Error::Unavailable`] (RedLock: [`Error::QuorumUnreachable`]) when
    /// too few nodes answered to tell.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.shared.acquire(How::Once).await
    }

    /// Retry until `timeout`; [`Error::Timeout`] when it runs out first
    /// with the lock taken, [`Error::Unavailable`] (RedLock:
    /// [`Error::QuorumUnreachable`]) when the last attempt could not reach
    /// enough nodes.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard, Error> {
        self.shared
            .acquire(How::Within(timeout))
            .await?
            .ok_or(Error::Timeout)
    }
}

/// A counting semaphore: at most `limit` permits at once.
///
/// Where the limit lives depends on the protocol: `lease-semaphore` and
/// `time-fenced-semaphore` keep it on the server at `{name}:limit` (the `limit` option is stored there by
/// the first acquire that finds it missing, and is ignored afterwards);
/// `watch-semaphore` reads `{name}:max`, which an administrator sets; the
/// others use each client's own `limit` option. [`Semaphore::limit`] reads
/// the limit in force and [`Semaphore::set_limit`] changes the shared one.
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.shared.name())
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
        match self.shared.acquire(How::Forever).await {
            Ok(permit) => permit.ok_or(Error::Timeout),
            Err(e) => Err(self.explain_failure(e).await),
        }
    }

    /// One attempt: `None` when every permit is taken.
    pub async fn try_acquire(&self) -> Result<Option<Permit>, Error> {
        match self.shared.acquire(How::Once).await {
            Ok(permit) => Ok(permit),
            Err(e) => Err(self.explain_failure(e).await),
        }
    }

    /// Retry until `timeout`; [`Error::Timeout`] when it runs out first.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit, Error> {
        match self.shared.acquire(How::Within(timeout)).await {
            Ok(permit) => permit.ok_or(Error::Timeout),
            Err(e) => Err(self.explain_failure(e).await),
        }
    }
}

/// Semaphore administration: where the limit lives on the server.
impl Semaphore {
    /// The key holding the limit shared by every client, for the protocols
    /// that keep one (`lease-semaphore` and `time-fenced-semaphore`:
    /// `{name}:limit`, `watch-semaphore`:
    /// `{name}:max`).
    fn limit_key(&self) -> Result<String, Error> {
        let config = &self.shared.config;
        let key = match self.shared.protocol {
            ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore => {
                lockwright_core::semaphores::lease_semaphore::limit_key(config)
            }
            ProtocolId::WatchSemaphore => {
                lockwright_core::semaphores::watch_semaphore::max_size_key(config)
            }
            protocol => return Err(LimitError::PerClient { protocol }.into()),
        };
        Ok(self.shared.redis_key(&key))
    }

    async fn run_admin(&self, command: Command) -> Result<Reply, Error> {
        let Some(route) = self.shared.routes.first() else {
            return Err(Error::Unavailable("no node".into()));
        };
        route
            .run_once(command, self.shared.settings.request_timeout)
            .await
            .map_err(|f| f.permanent.unwrap_or(Error::Unavailable(f.text)))
    }

    /// The limit in force: read from the server for `lease-semaphore`,
    /// `time-fenced-semaphore` and `watch-semaphore` (shared by every client; [`LimitError::Missing`]
    /// when not set yet, [`LimitError::NotANumber`] when it holds something
    /// else), this client's `limit` option for the others.
    pub async fn limit(&self) -> Result<u32, Error> {
        let key = match self.limit_key() {
            Ok(key) => key,
            Err(Error::Limit(LimitError::PerClient { .. })) => return Ok(self.shared.config.limit),
            Err(e) => return Err(e),
        };
        match self.run_admin(Command::Get { key: key.clone() }).await? {
            Reply::Nil => Err(LimitError::Missing { key }.into()),
            Reply::Bulk(value) => match value.trim().parse::<u32>() {
                Ok(limit) if limit > 0 => Ok(limit),
                _ => Err(LimitError::NotANumber { key, value }.into()),
            },
            Reply::Error(text) => Err(Error::Redis(text)),
            other => Err(Error::UnexpectedReply {
                request: "GET limit",
                reply: format!("{other:?}"),
            }),
        }
    }

    /// Change the limit for every client: `SET` of the limit key for
    /// `lease-semaphore`, `time-fenced-semaphore` and `watch-semaphore`.
    /// Holders beyond a lowered limit keep their permits until they release
    /// (or, for the lease semaphores, until they expire); new permits are granted only
    /// below the new limit. [`LimitError::PerClient`] for the protocols
    /// whose limit is each client's own option.
    pub async fn set_limit(&self, limit: u32) -> Result<(), Error> {
        self.limit_key()?;
        let config = &self.shared.config;
        let command = match self.shared.protocol {
            ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore => {
                lockwright_core::semaphores::lease_semaphore::set_limit_command(config, limit)?
            }
            _ => lockwright_core::semaphores::watch_semaphore::set_max_size_command(config, limit)?,
        };
        match self.run_admin(self.shared.redis_command(command)).await? {
            Reply::Error(text) => Err(Error::Redis(text)),
            _ => Ok(()),
        }
    }

    /// After a failed acquire: say what is wrong with the limit key, if
    /// anything (a Lua comparison error or an unexpected `GET` reply
    /// otherwise hides it).
    async fn explain_failure(&self, error: Error) -> Error {
        let limit_related = matches!(
            (&error, self.shared.protocol),
            (
                Error::Redis(_),
                ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore
            ) | (
                Error::UnexpectedReply { .. } | Error::Missing(_),
                ProtocolId::WatchSemaphore
            )
        );
        if !limit_related {
            return error;
        }
        match (self.limit().await, self.shared.protocol) {
            // The lease semaphores store their limit when the key is missing: a
            // missing key explains nothing.
            (Err(e @ Error::Limit(LimitError::NotANumber { .. })), _) => e,
            (Err(e @ Error::Limit(_)), ProtocolId::WatchSemaphore) => e,
            _ => error,
        }
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
    protocol: ProtocolId,
    /// How many times this owner holds it (`reentrant` only goes above 1).
    holds: u32,
    holder: Holder,
    /// The driver's loss signal (see `driver::Inline::lost`).
    lost: Arc<Notify>,
    lease: Lease,
    cell: LeaseCell,
    span: tracing::Span,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner token is the proof of ownership: not printed.
        f.debug_struct("LockGuard")
            .field("fence", &self.lease.fence)
            .field("holds", &self.holds)
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
        let lost = Arc::clone(&self.lost);
        let cell = self.cell.clone();
        async move {
            loop {
                // Registered before the cell is read, so that a loss marked
                // after the reading still wakes this wait.
                let notified = lost.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
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
                    // Lost by the driver's word (a failed renewal or extend):
                    // the cell says so now. A driver gone without a word
                    // leaves the expiry.
                    () = &mut notified => {}
                    // Validity ran out, unless a renewal moved it: look again.
                    () = expiry => {}
                }
            }
        }
    }

    async fn call<T>(
        &mut self,
        op: impl FnOnce(driver::Done<Result<T, Error>>) -> Call,
    ) -> Result<T, Error>
    where
        Result<T, Error>: driver::Answered,
    {
        self.holder.call(op).await
    }

    /// Extend the hold by the TTL, measured from now.
    ///
    /// [`Error::OutcomeUnknown`] when the extend got no reply: the old lease
    /// still bounds the hold ([`valid_until`](LockGuard::valid_until) does
    /// not move). [`Error::Lost`] when Redis said the hold is gone.
    pub async fn extend(&mut self) -> Result<(), Error> {
        let span = tracing::info_span!(parent: &self.span, "extend");
        match driver::in_span(span, self.call(|done| Call::Extend { done })).await {
            Ok(lease) => {
                self.lease = lease;
                Ok(())
            }
            Err(Error::Usage(UsageError::NotHeld)) => Err(Error::Lost),
            Err(e) => Err(e),
        }
    }

    /// `reentrant`: take the held lock once more, as the same owner (what a
    /// second `acquire` by the holder means in Redisson's `RLock`). The
    /// server's count for this owner goes up by one and the TTL starts
    /// again; the lock is released when [`leave`](LockGuard::leave) has
    /// been called as many times as it was entered, or at once by
    /// [`release`](LockGuard::release). Returns the new hold count.
    ///
    /// A second [`Lock::acquire`] does not re-enter: every acquire is a new
    /// owner, which waits for this one.
    ///
    /// [`Error::Usage`] (`AlreadyHeld`) for the other protocols, (`NotHeld`)
    /// after [`leave`](LockGuard::leave) brought the count to zero;
    /// [`Error::Lost`] when the hold turned out to be gone;
    /// [`Error::OutcomeUnknown`] when the lock script got no reply: the level
    /// is not counted here but may stand on the server, and the last
    /// release (or [`leave`](LockGuard::leave) to zero) takes it off too.
    pub async fn reenter(&mut self) -> Result<u32, Error> {
        if self.protocol != ProtocolId::Reentrant {
            return Err(Error::Usage(UsageError::AlreadyHeld));
        }
        // Left at the last level: the guard holds nothing to re-enter.
        if self.holds == 0 {
            return Err(Error::Usage(UsageError::NotHeld));
        }
        let span = tracing::info_span!(parent: &self.span, "reenter");
        match driver::in_span(span, self.call(|done| Call::Reenter { done })).await {
            Ok(lease) => {
                self.lease = lease;
                self.holds += 1;
                Ok(self.holds)
            }
            Err(Error::Usage(UsageError::NotHeld)) => Err(Error::Lost),
            Err(e) => Err(e),
        }
    }

    /// Undo one [`reenter`](LockGuard::reenter) (or, at the last level, the
    /// acquire): the server's count goes down by one, and the lock is
    /// released when it reaches zero. Returns the hold count left; at 0 the
    /// guard no longer holds anything. Fails as [`release`](LockGuard::release)
    /// does (and counts a level with an unknown outcome as left).
    pub async fn leave(&mut self) -> Result<u32, Error> {
        if self.holds <= 1 {
            self.cell.release();
        }
        let span = tracing::info_span!(parent: &self.span, "leave");
        let result = driver::in_span(span, self.call(|done| Call::Release { done })).await;
        self.holds = self.holds.saturating_sub(1);
        // A nested level left after the hold ran out: the machine reported
        // `Lost` (which does not conclude the release) and then the level's
        // own `Released`; the hold is gone all the same.
        let lost_meanwhile = self.holds > 0 && self.cell.snapshot().phase == Phase::Lost;
        match result {
            Ok(true) if !lost_meanwhile => Ok(self.holds),
            Ok(_) | Err(Error::Usage(UsageError::NotHeld)) => {
                self.holds = 0;
                Err(Error::Lost)
            }
            Err(e) => Err(e),
        }
    }

    /// How many times this owner holds the lock: 1 after an acquire, one
    /// more per [`reenter`](LockGuard::reenter), one less per
    /// [`leave`](LockGuard::leave).
    pub fn hold_count(&self) -> u32 {
        self.holds
    }

    /// Release the hold. `Ok(true)` when our hold was removed, `Ok(false)`
    /// when Redis said it was already gone (expired, or taken by someone
    /// else). [`Error::OutcomeUnknown`] when a request of the release got no
    /// reply: the hold may still stand on the server until its TTL.
    ///
    /// A hold already lost by this process' reckoning (its validity ran
    /// out, a renewal found it gone) is still released by its owner token,
    /// so the answer is Redis' and, when Redis answers, no key of ours
    /// outlives the guard; only
    /// the protocols with nothing on the server that names the owner
    /// (`setnx-getset`, the ZSET and WATCH semaphores) answer
    /// [`Error::Lost`] instead.
    pub async fn release(mut self) -> Result<bool, Error> {
        let span = tracing::info_span!(parent: &self.span, "release");
        // A lost hold is released by its token, every level at once.
        let lost = self.is_lost();
        self.cell.release();
        // A reentrant hold entered several times is released level by level
        // (the unlock script takes one level per call), down to zero.
        loop {
            let result =
                match driver::in_span(span.clone(), self.call(|done| Call::Release { done })).await
                {
                    // Lost by our reckoning, and the protocol cannot ask Redis
                    // by token whether the key is still ours.
                    Err(Error::Usage(UsageError::NotHeld)) => Err(Error::Lost),
                    other => other,
                };
            self.holds = self.holds.saturating_sub(1);
            if lost || self.holds == 0 || !matches!(result, Ok(true)) {
                return result;
            }
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
