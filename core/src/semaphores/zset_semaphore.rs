//! `zset-semaphore`: the counting semaphore of "Redis in Action" 6.3.1
//! (`acquire_semaphore`), kept faithful on purpose: it is a specimen.
//!
//! The semaphore is one sorted set `{name}`: member = owner token, score =
//! the *client's* clock when it acquired. An acquire is one transaction:
//!
//! ```text
//! MULTI
//!   ZREMRANGEBYSCORE {name} -inf (now−ttl   # drop holders timed out by OUR clock
//!   ZADD {name} now token
//!   ZRANK {name} token
//! EXEC
//! ```
//!
//! and the permit is ours when the rank is below the limit; otherwise the
//! client `ZREM`s its entry and is denied (or retries). Release is `ZREM`.
//! The book has no refresh; extend here is `ZSCORE` (still a member?) then
//! `ZADD {name} now token` — two steps, so an entry timed out by another
//! client between them is written back (accepted and documented).
//!
//! Every client judges the others' time-outs with its own clock, and ranks
//! are ordered by client clocks too, so **under client clock skew it
//! over-admits**: a client whose clock runs ahead drops holders that are
//! still valid by their own clocks, and a client whose clock runs behind
//! scores below the current holders and takes a rank inside the limit while
//! they still believe they hold. The fair semaphore was the book's answer.
//!
//! Even without skew, scores are stamped when a request is *sent*: a
//! request stamped earlier that reaches Redis later (or one with the same
//! millisecond, which ties on the token) ranks ahead of a client already
//! admitted, and the semaphore over-admits the same way.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: MULTI ZREMRANGEBYSCORE, ZADD now token, ZRANK EXEC → rank below limit
//!     Acquiring --> Undo: rank at or above limit
//!     Undo --> Backoff: ZREM token
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: extend, ZSCORE then ZADD now token / Extended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: ZREM token / Released
//! ```

use super::{item, purge_expired, score};
use crate::config::{Config, ConfigError};
use crate::engine::{engine_machine, unexpected, Engine, EngineConfig, Next, Op, Recipe};
use crate::keyspace::{Command, Reply};
use crate::protocol::Token;
use crate::time::Millis;

/// Where a `zset-semaphore` request sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// The acquire transaction.
    Acquire,
    /// The release `ZREM`.
    Release,
    /// Extend: the `ZSCORE` membership check; then refresh with this score.
    Check { score: i64 },
    /// Extend: the refreshing `ZADD`.
    Refresh,
}

/// The commands of `zset-semaphore`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ZsetRecipe {
    sem: String,
    token: String,
    ttl_ms: i64,
    limit: i64,
}

impl Recipe for ZsetRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.0.to_string();
    }

    fn start(&self, op: Op, now: Millis) -> (Command, Step) {
        let now = score(now);
        match op {
            Op::Acquire => (
                Command::Transaction(vec![
                    purge_expired(&self.sem, now, self.ttl_ms),
                    Command::ZAdd {
                        key: self.sem.clone(),
                        members: vec![(now, self.token.clone())],
                    },
                    Command::ZRank {
                        key: self.sem.clone(),
                        member: self.token.clone(),
                    },
                ]),
                Step::Acquire,
            ),
            Op::Release => (
                Command::ZRem {
                    key: self.sem.clone(),
                    members: vec![self.token.clone()],
                },
                Step::Release,
            ),
            Op::Extend => (
                Command::ZScore {
                    key: self.sem.clone(),
                    member: self.token.clone(),
                },
                Step::Check { score: now },
            ),
        }
    }

    fn advance(&self, _op: Op, step: Step, reply: Reply, _now: Millis) -> Next<Step> {
        match step {
            Step::Acquire => match item(&reply, 3, 2) {
                Some(Reply::Int(rank)) if *rank < self.limit => Next::Granted(None),
                Some(Reply::Int(_) | Reply::Nil) => Next::Undo,
                _ => unexpected("acquire transaction", reply),
            },
            Step::Release => match reply {
                Reply::Int(n) => Next::Done { ours: n > 0 },
                reply => unexpected("ZREM", reply),
            },
            Step::Check { score } => match reply {
                Reply::Nil => Next::Done { ours: false },
                Reply::Bulk(_) | Reply::Int(_) => Next::Send(
                    Command::ZAdd {
                        key: self.sem.clone(),
                        members: vec![(score, self.token.clone())],
                    },
                    Step::Refresh,
                ),
                reply => unexpected("ZSCORE", reply),
            },
            Step::Refresh => match reply {
                Reply::Int(_) => Next::Done { ours: true },
                reply => unexpected("ZADD", reply),
            },
        }
    }
}

engine_machine! {
    /// The `zset-semaphore` machine.
    ZsetSemaphore(ZsetRecipe)
}

impl ZsetSemaphore {
    /// A semaphore of `config.limit` permits on the sorted set `{name}`, for
    /// the owner `token`. Permits time out `config.ttl_ms` after the
    /// acquiring client's clock reading; no automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<ZsetSemaphore, ConfigError> {
        let engine = EngineConfig::checked(
            config.validate_semaphore("zset-semaphore"),
            config,
            token.clone(),
        )?;
        let recipe = ZsetRecipe {
            sem: config.key(),
            token: token.0.to_string(),
            ttl_ms: i64::try_from(config.ttl_ms).unwrap_or(i64::MAX),
            limit: i64::from(config.limit),
        };
        Ok(ZsetSemaphore(Engine::new(recipe, engine)))
    }
}
