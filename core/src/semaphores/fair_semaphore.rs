//! `fair-semaphore`: the fair semaphore of "Redis in Action" 6.3.2
//! (`acquire_fair_semaphore`, `release_fair_semaphore`,
//! `refresh_fair_semaphore`), kept faithful on purpose: it is a specimen.
//!
//! Three keys share the `{name}` tag: `{name}` (timeout zset: token → the
//! client's clock at acquire), `{name}:owner` (owner zset: token → counter)
//! and `{name}:counter`. Ranks come from a server-side counter instead of
//! client clocks, so skewed clocks no longer decide the order. An acquire is
//! two round trips, as in the book:
//!
//! ```text
//! MULTI                                          # step 1
//!   ZREMRANGEBYSCORE {name} -inf (now−ttl        # time-outs, by OUR clock
//!   ZINTERSTORE {name}:owner 2 {name}:owner {name} WEIGHTS 1 0
//!   INCR {name}:counter                          # → counter
//! EXEC
//! MULTI                                          # step 2
//!   ZADD {name} now token
//!   ZADD {name}:owner counter token
//!   ZRANK {name}:owner token                     # < limit → held
//! EXEC
//! ```
//!
//! A rank at or above the limit takes both entries out again (`ZREM` ×2)
//! and denies or retries. Release is the same pair of `ZREM`s (was it
//! held = the first one removed something). Extend is `ZADD {name} now
//! token`: when it answers 1 the entry was new — it had timed out — so the
//! client removes it again and reports the permit lost.
//!
//! **The acquire race** the book warns about: steps 1 and 2 are separate,
//! so a client that drew a *lower* counter but reaches step 2 *later* ranks
//! ahead of a client that has already been admitted: both hold, and the
//! semaphore over-admits. `fair-semaphore-locked` closes the race with a lock.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Step1: acquire
//!     Step1 --> Step2: MULTI ZREMRANGEBYSCORE, ZINTERSTORE, INCR counter EXEC
//!     Step2 --> Held: MULTI ZADD, ZADD owner counter, ZRANK owner EXEC → rank below limit
//!     Step2 --> Undo: rank at or above limit
//!     Undo --> Backoff: ZREM token from both sets
//!     Backoff --> Step1: retry timer
//!     Held --> Held: extend, ZADD now token → 0 / Extended
//!     Held --> [*]: ZADD → 1 (had timed out), ZREM / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: ZREM from both sets / Released
//! ```

use super::{item, purge_expired, score};
use crate::config::{Config, ConfigError};
use crate::engine::{engine_machine, unexpected, Engine, EngineConfig, Next, Op, Recipe};
use crate::keyspace::{Command, Reply};
use crate::protocol::Token;
use crate::time::Millis;

/// Where a fair-semaphore request sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// Acquire step 1 (time-outs, intersection, counter), stamped `score`.
    Counter { score: i64 },
    /// Acquire step 2 (both `ZADD`s and the rank).
    Rank,
    /// The release (or undo) transaction.
    Release,
    /// The refreshing `ZADD`.
    Refresh,
}

/// The commands of the fair semaphore (shared with the locked variant).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FairRecipe {
    sem: String,
    owner: String,
    counter: String,
    token: String,
    ttl_ms: i64,
    limit: i64,
}

impl FairRecipe {
    pub(crate) fn new(config: &Config, token: &Token) -> FairRecipe {
        FairRecipe {
            sem: config.key(),
            owner: config.key_with("owner"),
            counter: config.key_with("counter"),
            token: token.0.to_string(),
            ttl_ms: i64::try_from(config.ttl_ms).unwrap_or(i64::MAX),
            limit: i64::from(config.limit),
        }
    }

    fn zadd(&self, key: &str, score: i64) -> Command {
        Command::ZAdd {
            key: key.to_owned(),
            members: vec![(score, self.token.clone())],
        }
    }

    fn zrem(&self, key: &str) -> Command {
        Command::ZRem {
            key: key.to_owned(),
            members: vec![self.token.clone()],
        }
    }
}

impl Recipe for FairRecipe {
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
                    Command::ZInterStore {
                        dest: self.owner.clone(),
                        keys: vec![self.owner.clone(), self.sem.clone()],
                        weights: vec![1, 0],
                    },
                    Command::Incr {
                        key: self.counter.clone(),
                    },
                ]),
                Step::Counter { score: now },
            ),
            Op::Release => (
                Command::Transaction(vec![self.zrem(&self.sem), self.zrem(&self.owner)]),
                Step::Release,
            ),
            Op::Extend => (self.zadd(&self.sem, now), Step::Refresh),
        }
    }

    fn advance(&self, _op: Op, step: Step, reply: Reply, _now: Millis) -> Next<Step> {
        match step {
            Step::Counter { score } => match item(&reply, 3, 2) {
                Some(Reply::Int(counter)) => Next::Send(
                    Command::Transaction(vec![
                        self.zadd(&self.sem, score),
                        self.zadd(&self.owner, *counter),
                        Command::ZRank {
                            key: self.owner.clone(),
                            member: self.token.clone(),
                        },
                    ]),
                    Step::Rank,
                ),
                _ => unexpected("fair acquire step 1", reply),
            },
            Step::Rank => match item(&reply, 3, 2) {
                Some(Reply::Int(rank)) if *rank < self.limit => Next::Granted(None),
                Some(Reply::Int(_) | Reply::Nil) => Next::Undo,
                _ => unexpected("fair acquire step 2", reply),
            },
            Step::Release => match item(&reply, 2, 0) {
                Some(Reply::Int(n)) => Next::Done { ours: *n > 0 },
                _ => unexpected("fair release", reply),
            },
            Step::Refresh => match reply {
                Reply::Int(0) => Next::Done { ours: true },
                Reply::Int(1) => Next::LostUndo,
                reply => unexpected("ZADD refresh", reply),
            },
        }
    }
}

engine_machine! {
    /// The `fair-semaphore` machine.
    FairSemaphore(FairRecipe)
}

impl FairSemaphore {
    /// A fair semaphore of `config.limit` permits on `{name}`,
    /// `{name}:owner` and `{name}:counter`, for the owner `token`. Permits
    /// time out `config.ttl_ms` after the acquiring client's clock reading;
    /// no automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<FairSemaphore, ConfigError> {
        let engine = EngineConfig::checked(
            config.validate_semaphore("fair-semaphore"),
            config,
            token.clone(),
        )?;
        let recipe = FairRecipe::new(config, &token);
        Ok(FairSemaphore(Engine::new(recipe, engine)))
    }
}
