//! `watch-semaphore`: the semaphore of "Redis使用手册", kept faithful on
//! purpose: it is a specimen.
//!
//! Two keys: `{name}:holders` (a SET of owner tokens) and `{name}:max` (the
//! maximum number of holders, a string set by an administrator with
//! [`set_max_size_command`]). An acquire is optimistic:
//!
//! ```text
//! WATCH {name}:holders
//! GET {name}:max                    # nil → Failed(Missing("max size"))
//! SCARD {name}:holders
//! size < max ?  MULTI SADD {name}:holders token EXEC   # nil: changed → start again
//!            :  UNWATCH, denied
//! ```
//!
//! Release is `SREM`; extend only checks membership (`SISMEMBER`). An
//! acquire whose outcome is unknown is undone with that `SREM`; when the
//! undo (or any release) gets no reply, the machine's next attempt runs
//! under a new token (`token.1`, `token.2`, ...), because the `SREM` may
//! still run late and would remove a permit granted to the same token.
//! The checker finds that late `SREM` admitting a third client under
//! `delay` when the token is kept (the test
//! `clients::a_late_watch_semaphore_undo_is_caught_with_a_third_client`).
//! **There is no expiry at all**: a holder that crashes keeps its permit
//! forever (its lease is valid until `u64::MAX`), and the semaphore shrinks
//! by one for good. `lease-semaphore` is the answer.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Counting: WATCH holders, GET max
//!     Counting --> Held: SCARD below max, MULTI SADD holders token EXEC → OK
//!     Counting --> Acquiring: EXEC → nil (holders changed), start again
//!     Counting --> Backoff: SCARD at max, UNWATCH
//!     Counting --> [*]: max missing / Failed
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: extend, SISMEMBER → 1 / Extended
//!     Held --> Releasing: release
//!     Releasing --> [*]: SREM holders token / Released
//! ```

use super::item;
use crate::config::{Config, ConfigError, MAX_LIMIT};
use crate::engine::{engine_machine, unexpected, Engine, EngineConfig, Next, Op, Recipe};
use crate::keyspace::{Command, Reply, SetCondition, SetExpiry};
use crate::protocol::{ProtocolError, Token};
use crate::time::Millis;

/// Why a size could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SizeError {
    /// The max-size key is not set.
    #[error("the semaphore's max size is not set")]
    Missing,
    /// The stored value is not a number.
    #[error("the semaphore size {0:?} is not a number")]
    NotANumber(String),
    /// The stored value is negative.
    #[error("the semaphore size {0} is negative")]
    Negative(i64),
    /// Redis answered with an error.
    #[error("redis replied with an error: {0}")]
    Redis(String),
    /// A reply of another shape.
    #[error("unexpected reply: {0:?}")]
    Unexpected(Reply),
}

/// The holders SET of the semaphore `config.name`.
pub fn holders_key(config: &Config) -> String {
    config.key_with("holders")
}

/// The max-size key of the semaphore `config.name`.
pub fn max_size_key(config: &Config) -> String {
    config.key_with("max")
}

/// `SET {name}:max size`: the administrative command that sets the maximum
/// number of holders. Zero and sizes above [`MAX_LIMIT`] are refused.
pub fn set_max_size_command(config: &Config, size: u32) -> Result<Command, ConfigError> {
    if size == 0 {
        return Err(ConfigError::ZeroLimit);
    }
    if size > MAX_LIMIT {
        return Err(ConfigError::LimitTooLarge {
            limit: size,
            max: MAX_LIMIT,
        });
    }
    Ok(Command::Set {
        key: max_size_key(config),
        value: size.to_string(),
        condition: SetCondition::Always,
        expiry: SetExpiry::None,
        get: false,
    })
}

/// `GET {name}:max`; read the reply with [`parse_max_size`].
pub fn get_max_size_command(config: &Config) -> Command {
    Command::Get {
        key: max_size_key(config),
    }
}

/// `SCARD {name}:holders`; read the reply with [`parse_current_size`].
pub fn current_size_command(config: &Config) -> Command {
    Command::SCard {
        key: holders_key(config),
    }
}

/// The max size from the reply to [`get_max_size_command`].
pub fn parse_max_size(reply: &Reply) -> Result<u64, SizeError> {
    match reply {
        Reply::Nil => Err(SizeError::Missing),
        Reply::Bulk(s) => match s.trim().parse::<i64>() {
            Ok(n) if n < 0 => Err(SizeError::Negative(n)),
            Ok(n) => Ok(n.unsigned_abs()),
            Err(_) => Err(SizeError::NotANumber(s.clone())),
        },
        Reply::Error(e) => Err(SizeError::Redis(e.clone())),
        other => Err(SizeError::Unexpected(other.clone())),
    }
}

/// The number of holders from the reply to [`current_size_command`].
pub fn parse_current_size(reply: &Reply) -> Result<u64, SizeError> {
    match reply {
        Reply::Int(n) if *n < 0 => Err(SizeError::Negative(*n)),
        Reply::Int(n) => Ok(n.unsigned_abs()),
        Reply::Error(e) => Err(SizeError::Redis(e.clone())),
        other => Err(SizeError::Unexpected(other.clone())),
    }
}

/// What an acquire does once its `UNWATCH` is answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Unwatched {
    /// The semaphore was full.
    Full,
    /// The max size was unreadable.
    Fail(ProtocolError),
}

/// Where a `watch-semaphore` request sequence is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    Watch,
    GetMax,
    Size { max: u64 },
    Add,
    Unwatch(Unwatched),
    Release,
    Check,
}

/// The commands of `watch-semaphore`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct WatchRecipe {
    holders: String,
    max: String,
    token: String,
    /// A deliberate bug for the tests
    /// ([`WatchSemaphore::with_a_default_for_a_missing_size`]): the size
    /// read when the max-size key is missing.
    missing_max: Option<u64>,
}

impl Recipe for WatchRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.0.to_string();
    }

    fn start(&self, op: Op, _now: Millis) -> (Command, Step) {
        match op {
            Op::Acquire => (
                Command::Watch {
                    keys: vec![self.holders.clone()],
                },
                Step::Watch,
            ),
            Op::Release => (
                Command::SRem {
                    key: self.holders.clone(),
                    members: vec![self.token.clone()],
                },
                Step::Release,
            ),
            Op::Extend => (
                Command::SIsMember {
                    key: self.holders.clone(),
                    member: self.token.clone(),
                },
                Step::Check,
            ),
        }
    }

    fn advance(&self, op: Op, step: Step, reply: Reply, now: Millis) -> Next<Step> {
        match step {
            Step::Watch if reply.is_ok() => Next::Send(
                Command::Get {
                    key: self.max.clone(),
                },
                Step::GetMax,
            ),
            Step::Watch => unexpected("WATCH", reply),
            Step::GetMax => match parse_max_size(&reply).or_else(|e| match e {
                SizeError::Missing => self.missing_max.ok_or(e),
                e => Err(e),
            }) {
                Ok(max) => Next::Send(
                    Command::SCard {
                        key: self.holders.clone(),
                    },
                    Step::Size { max },
                ),
                Err(e) => {
                    let failure = match e {
                        SizeError::Missing => ProtocolError::Missing("max size".into()),
                        _ => ProtocolError::UnexpectedReply {
                            request: "GET max size",
                            reply,
                        },
                    };
                    Next::Send(Command::Unwatch, Step::Unwatch(Unwatched::Fail(failure)))
                }
            },
            Step::Size { max } => match parse_current_size(&reply) {
                Ok(size) if size < max => Next::Send(
                    Command::Transaction(vec![Command::SAdd {
                        key: self.holders.clone(),
                        members: vec![self.token.clone()],
                    }]),
                    Step::Add,
                ),
                Ok(_) => Next::Send(Command::Unwatch, Step::Unwatch(Unwatched::Full)),
                Err(_) => unexpected("SCARD", reply),
            },
            // The holders changed since WATCH: start again, as the book does.
            Step::Add if reply == Reply::Nil => {
                let (command, step) = self.start(op, now);
                Next::Send(command, step)
            }
            Step::Add => match item(&reply, 1, 0) {
                Some(Reply::Int(_)) => Next::Granted(None),
                _ => unexpected("EXEC SADD", reply),
            },
            Step::Unwatch(_) if !reply.is_ok() => unexpected("UNWATCH", reply),
            Step::Unwatch(Unwatched::Full) => Next::NotGranted,
            Step::Unwatch(Unwatched::Fail(e)) => Next::Failed(e),
            Step::Release => match reply {
                Reply::Int(n) => Next::Done { ours: n > 0 },
                reply => unexpected("SREM", reply),
            },
            Step::Check => match reply {
                Reply::Int(n) => Next::Done { ours: n == 1 },
                reply => unexpected("SISMEMBER", reply),
            },
        }
    }
}

engine_machine! {
    /// The `watch-semaphore` machine.
    WatchSemaphore(WatchRecipe)
}

impl WatchSemaphore {
    /// A semaphore on `{name}:holders` whose size lives in `{name}:max`
    /// (set it with [`set_max_size_command`]; `config.limit` is only
    /// validated), for the owner `token`. Permits never expire.
    pub fn new(config: &Config, token: Token) -> Result<WatchSemaphore, ConfigError> {
        WatchSemaphore::build(config, token, None)
    }

    fn build(
        config: &Config,
        token: Token,
        missing_max: Option<u64>,
    ) -> Result<WatchSemaphore, ConfigError> {
        let mut engine = EngineConfig::checked(
            config.validate_semaphore("watch-semaphore"),
            config,
            token.clone(),
        )?;
        let recipe = WatchRecipe {
            holders: holders_key(config),
            max: max_size_key(config),
            token: token.0.to_string(),
            missing_max,
        };
        engine.ttl_ms = None;
        Ok(WatchSemaphore(Engine::new(recipe, engine)))
    }

    /// A deliberate bug, for the tests that must catch it: every attempt
    /// runs under `token`, also after an undo (`SREM`) that got no reply,
    /// which may then run late and remove the permit a later attempt was
    /// granted.
    #[doc(hidden)]
    pub fn with_one_token_for_every_attempt(
        config: &Config,
        token: Token,
    ) -> Result<WatchSemaphore, ConfigError> {
        let mut machine = WatchSemaphore::new(config, token)?;
        machine.0.one_token = true;
        Ok(machine)
    }

    /// A deliberate bug, for the tests that must catch it: a missing
    /// max-size key is read as `config.limit`, as a front end that falls
    /// back to its configured size would. A restart that empties the node
    /// loses the holders and the size together; the specimen then fails
    /// every acquire, while this one admits new holders beside those that
    /// still believe they hold.
    #[doc(hidden)]
    pub fn with_a_default_for_a_missing_size(
        config: &Config,
        token: Token,
    ) -> Result<WatchSemaphore, ConfigError> {
        WatchSemaphore::build(config, token, Some(u64::from(config.limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ProtocolError;

    /// Like the shared watched step, the acquire's `UNWATCH` checks its
    /// reply: anything but OK fails the sequence.
    #[test]
    fn an_unwatch_answered_with_anything_but_ok_fails() {
        let recipe = WatchRecipe {
            holders: "h".into(),
            max: "m".into(),
            token: "t".into(),
            missing_max: None,
        };
        let step = || Step::Unwatch(Unwatched::Full);
        let now = Millis(0);
        assert_eq!(
            recipe.advance(Op::Acquire, step(), Reply::ok(), now),
            Next::NotGranted
        );
        assert!(matches!(
            recipe.advance(Op::Acquire, step(), Reply::Int(1), now),
            Next::Failed(ProtocolError::UnexpectedReply {
                request: "UNWATCH",
                ..
            })
        ));
    }
}
