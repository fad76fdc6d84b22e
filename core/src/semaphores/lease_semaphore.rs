//! `lease-semaphore` (beyond the sources): one atomic script per operation,
//! expiry judged by the server's clock, fenced permits, renewal.
//!
//! Three keys share the `{name}` tag: `{name}:permits` (a zset: token →
//! deadline on the server clock), `{name}:fence` (a counter) and
//! `{name}:limit` (the limit; stored by the first acquire from its
//! `ARGV[3]`, changed with [`set_limit_command`]).
//!
//! - acquire: [`Script::LeaseAcquire`] reads the server `TIME`, drops
//!   permits whose deadline passed, and when fewer than the limit remain
//!   adds ours with deadline `now + ttl` and returns a fresh fence;
//! - release: [`Script::LeaseRelease`], `ZREM` of our own token only;
//! - an acquire whose reply never came is left to its TTL, as the lease
//!   locks leave theirs: it is not undone. An undo would be a release of
//!   our token, and a token is the same for every attempt of a holder: an
//!   undo held up on the wire could run after a later attempt was granted
//!   under that token and remove the new permit, admitting a rival beside
//!   its holder (the model checker found it under `delay` once any number
//!   of late retries was allowed; `model/tests/reductions.rs` keeps the
//!   undo as a mutation it must catch). An error reply means the script
//!   stopped before its `ZADD`, its last write: nothing to undo either.
//! - renew: [`Script::LeaseRenew`] moves our own deadline to `now + ttl`
//!   when the permit is still there (1), else 0 → [`Event::Lost`](crate::Event::Lost).
//!
//! Client clocks decide nothing on the server, so skew cannot evict a live
//! holder; a crashed holder's permit comes back after the TTL. The client's
//! own validity is `sent_at + ttl − drift`, which ends before the server
//! deadline. With `config.auto_renew` the machine renews at a third of the
//! TTL. Because the limit lives on the server and the script counts the
//! permits that remain, lowering it never admits more than the new limit
//! (holders above it keep their permits until they leave).
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: lease-acquire → fence (server TIME, drop expired, ZADD deadline) / Acquired
//!     Acquiring --> Backoff: lease-acquire → nil (full)
//!     Acquiring --> Backoff: no reply (an unknown permit is left to its TTL, not undone)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: renew every ttl/3, lease-renew → 1 / Extended
//!     Held --> [*]: lease-renew → 0 / Lost
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: lease-release (ZREM own token) / Released
//! ```

use crate::config::{Config, ConfigError, MAX_LIMIT};
use crate::engine::{engine_machine, unexpected, Engine, EngineConfig, Next, Op, Recipe};
use crate::keyspace::script::release_args;
use crate::keyspace::{Command, Reply, Script, SetCondition, SetExpiry};
use crate::protocol::{Fence, ProtocolError, Token};
use crate::time::Millis;

/// The permits zset of the semaphore `config.name`.
pub fn permits_key(config: &Config) -> String {
    config.key_with("permits")
}

/// The limit key of the semaphore `config.name`.
pub fn limit_key(config: &Config) -> String {
    config.key_with("limit")
}

/// `SET {name}:limit limit`: change the limit on the server. Zero and
/// limits above [`MAX_LIMIT`] are refused.
pub fn set_limit_command(config: &Config, limit: u32) -> Result<Command, ConfigError> {
    if limit == 0 {
        return Err(ConfigError::ZeroLimit);
    }
    if limit > MAX_LIMIT {
        return Err(ConfigError::LimitTooLarge {
            limit,
            max: MAX_LIMIT,
        });
    }
    Ok(Command::Set {
        key: limit_key(config),
        value: limit.to_string(),
        condition: SetCondition::Always,
        expiry: SetExpiry::None,
        get: false,
    })
}

/// Where a `lease-semaphore` request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    Acquire,
    Release,
    Renew,
}

/// The scripts of `lease-semaphore` (and of `time-fenced-semaphore`, which
/// differs only in its acquire script).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LeaseRecipe {
    acquire: Script,
    permits: String,
    fence: String,
    limit_key: String,
    token: String,
    ttl_ms: String,
    limit: String,
    notify_releases: bool,
    /// The mutation of [`LeaseSemaphore::with_undo_of_unanswered_acquires`].
    undoes_unanswered: bool,
}

impl Recipe for LeaseRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.0.to_string();
    }

    fn start(&self, op: Op, _now: Millis) -> (Command, Step) {
        match op {
            Op::Acquire => (
                Command::Eval {
                    script: self.acquire,
                    keys: vec![
                        self.permits.clone(),
                        self.fence.clone(),
                        self.limit_key.clone(),
                    ],
                    args: vec![self.token.clone(), self.ttl_ms.clone(), self.limit.clone()],
                },
                Step::Acquire,
            ),
            Op::Release => (
                Command::Eval {
                    script: Script::LeaseRelease,
                    keys: vec![self.permits.clone()],
                    args: release_args(vec![self.token.clone()], self.notify_releases),
                },
                Step::Release,
            ),
            Op::Extend => (
                Command::Eval {
                    script: Script::LeaseRenew,
                    keys: vec![self.permits.clone()],
                    args: vec![self.token.clone(), self.ttl_ms.clone()],
                },
                Step::Renew,
            ),
        }
    }

    fn advance(&self, _op: Op, step: Step, reply: Reply, _now: Millis) -> Next<Step> {
        match (step, reply) {
            (Step::Acquire, Reply::Int(fence)) if fence > 0 => {
                Next::Granted(Some(Fence(fence.unsigned_abs())))
            }
            (Step::Acquire, Reply::Nil) => Next::NotGranted,
            (Step::Acquire, reply) => unexpected(self.acquire.name(), reply),
            (Step::Release, Reply::Int(n)) => Next::Done { ours: n > 0 },
            (Step::Release, reply) => unexpected("lease-release", reply),
            (Step::Renew, Reply::Int(n @ (0 | 1))) => Next::Done { ours: n == 1 },
            (Step::Renew, reply) => unexpected("lease-renew", reply),
        }
    }

    /// Nothing is undone (see the module docs): an unanswered acquire is
    /// left to its TTL and retried, an error reply fails the acquire.
    fn doubt(&self, _step: &Step, error: Option<ProtocolError>) -> Next<Step> {
        match (error, self.undoes_unanswered) {
            (None, false) => Next::NotGranted,
            (Some(e), false) => Next::Abort(e),
            (None, true) => Next::Undo,
            (Some(e), true) => Next::Failed(e),
        }
    }
}

engine_machine! {
    /// The `lease-semaphore` machine.
    LeaseSemaphore(LeaseRecipe)
}

impl LeaseSemaphore {
    /// A semaphore of `config.limit` permits (unless the server already has
    /// a limit) on `{name}:permits`, for the owner `token`, renewed
    /// automatically at a third of the TTL when `config.auto_renew`.
    pub fn new(config: &Config, token: Token) -> Result<LeaseSemaphore, ConfigError> {
        lease_engine(
            "lease-semaphore",
            Script::LeaseAcquire,
            config,
            token,
            false,
        )
        .map(LeaseSemaphore)
    }

    /// A deliberately broken machine, for the tests that must catch it:
    /// [`LeaseSemaphore::new`]'s, but an acquire whose reply never came is
    /// undone by a release of the owner's token, and the next attempt runs
    /// under that same token even when the undo got no reply, as this
    /// protocol once did. A late undo then removes a permit granted later
    /// under the same token. Never use it to protect anything.
    #[doc(hidden)]
    pub fn with_undo_of_unanswered_acquires(
        config: &Config,
        token: Token,
    ) -> Result<LeaseSemaphore, ConfigError> {
        let mut engine =
            lease_engine("lease-semaphore", Script::LeaseAcquire, config, token, true)?;
        engine.one_token = true;
        Ok(LeaseSemaphore(engine))
    }
}

/// The engine of a lease semaphore named `protocol` whose grants run the
/// script `acquire` (one with [`Script::LeaseAcquire`]'s keys and
/// arguments); `undoes_unanswered` only for the mutation of
/// [`LeaseSemaphore::with_undo_of_unanswered_acquires`].
pub(crate) fn lease_engine(
    protocol: &'static str,
    acquire: Script,
    config: &Config,
    token: Token,
    undoes_unanswered: bool,
) -> Result<Engine<LeaseRecipe>, ConfigError> {
    let mut engine =
        EngineConfig::checked(config.validate_semaphore(protocol), config, token.clone())?;
    let recipe = LeaseRecipe {
        acquire,
        permits: permits_key(config),
        fence: config.key_with("fence"),
        limit_key: limit_key(config),
        token: token.0.to_string(),
        ttl_ms: config.ttl_ms.to_string(),
        limit: config.limit.to_string(),
        notify_releases: config.notify_releases,
        undoes_unanswered,
    };
    engine.auto_renew = config.auto_renew;
    Ok(Engine::new(recipe, engine))
}
