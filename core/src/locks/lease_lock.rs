//! The mechanism shared by the `SET NX PX` family: `set-px-get-del`,
//! `set-px-watch`, `set-px-lua`, `fenced` and `time-fenced`.
//!
//! All five write a random owner token under `{name}` with a TTL and measure
//! their validity from the send time of the acquiring request:
//! `valid_until = sent_at + ttl − drift`. They differ in how a release or an
//! extend makes sure it touches only its own key:
//!
//! | style | conditional step |
//! |---|---|
//! | [`OwnerCheck::GetThenAct`] | `GET`, compare, then `DEL`/`PEXPIRE` as a second step (not atomic) |
//! | [`OwnerCheck::Watch`] | `WATCH`, `GET`, compare, `MULTI … EXEC` (aborts and retries when the key changed) |
//! | [`OwnerCheck::Script`] | one compare-and-act script (atomic) |
//!
//! and in how they acquire ([`Grant::SetNxPx`] or one of the fence-issuing
//! scripts, [`Grant::FencedScript`] and [`Grant::TimeFencedScript`]).
//!
//! All five are one recipe, [`SetPxRecipe`], run by the
//! [engine](crate::engine); [`OwnerCheck::Watch`] uses the engine's one watched
//! release step, so an `UNWATCH` or `EXEC` reply is checked the same way as
//! in `setnx-del`.

use crate::config::{Config, ConfigError};
use crate::engine::{
    unexpected, watch_begin, watch_step, Engine, EngineConfig, Next, Op, Recipe, WatchStep,
};
use crate::keyspace::script::release_args;
use crate::keyspace::{Command, Reply, Script, SetCondition, SetExpiry};
use crate::protocol::{Fence, Lease, ProtocolError, Token};
use crate::time::Millis;

/// How a release or extend makes sure the key is still ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OwnerCheck {
    /// `GET`, compare in the client, then act: another client's key can be
    /// hit when ours expires between the two steps.
    GetThenAct,
    /// `WATCH`, `GET`, compare, `MULTI`/act/`EXEC`.
    Watch,
    /// One atomic compare-and-act script.
    Script,
}

/// How a grant is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Grant {
    /// `SET key token NX PX ttl`.
    SetNxPx,
    /// The `fenced-acquire` script: `SET NX PX` and `INCR` of the fence counter.
    FencedScript,
    /// The `time-fenced-acquire` script: `SET NX PX` and a fence of
    /// `max(counter + 1, server TIME in µs)`.
    TimeFencedScript,
}

impl Grant {
    /// The script that issues the fence, for the fence-issuing grants.
    fn fence_script(self) -> Option<Script> {
        match self {
            Grant::SetNxPx => None,
            Grant::FencedScript => Some(Script::FencedAcquire),
            Grant::TimeFencedScript => Some(Script::TimeFencedAcquire),
        }
    }
}

/// Where a request sequence of a lease lock is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// Acquire: the grant (`SET NX PX` or the fenced script) is in flight.
    Grant,
    /// Acquire: granted; `WAIT` for replicas is in flight.
    Replicas {
        fence: Option<Fence>,
        valid_until: Millis,
    },
    /// `Script`: the script is in flight. `GetThenAct`: the act is in flight.
    Act,
    /// `GetThenAct`: the `GET` is in flight.
    Get,
    /// `Watch`: the watched sequence is at this step.
    Watched(WatchStep),
}

/// The recipe of the `SET NX PX` family, parameterised by guard and grant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetPxRecipe {
    key: String,
    /// Empty when the grant keeps no fence (no script reads it).
    fence_key: String,
    ttl_ms: u64,
    wait_replicas: Option<u32>,
    notify_releases: bool,
    token: Token,
    guard: OwnerCheck,
    grant: Grant,
}

/// A lease lock's engine: `protocol` names it in config errors; renews at
/// TTL/3 when `auto_renew`.
pub(crate) fn lease_lock(
    protocol: &'static str,
    config: &Config,
    token: Token,
    guard: OwnerCheck,
    grant: Grant,
    auto_renew: bool,
) -> Result<Engine<SetPxRecipe>, ConfigError> {
    let mut engine =
        EngineConfig::checked(config.validate_single(protocol), config, token.clone())?;
    let recipe = SetPxRecipe {
        key: config.key(),
        fence_key: match grant.fence_script() {
            Some(_) => config.key_with("fence"),
            None => String::new(),
        },
        ttl_ms: config.ttl_ms,
        wait_replicas: config.wait_replicas,
        notify_releases: config.notify_releases,
        token: token.clone(),
        guard,
        grant,
    };
    engine.auto_renew = auto_renew;
    Ok(Engine::new(recipe, engine))
}

impl SetPxRecipe {
    /// The command that acts once the key is known to be ours (or, for
    /// `Script`, that checks and acts in one step): delete it on release,
    /// expire it anew on extend.
    fn act_command(&self, op: Op) -> Command {
        let key = self.key.clone();
        let delete = op == Op::Release;
        match (self.guard, delete) {
            (OwnerCheck::Script, true) => Command::Eval {
                script: Script::CompareAndDelete,
                keys: vec![key],
                args: release_args(vec![self.token.0.to_string()], self.notify_releases),
            },
            (OwnerCheck::Script, false) => Command::Eval {
                script: Script::CompareAndPExpire,
                keys: vec![key],
                args: vec![self.token.0.to_string(), self.ttl_ms.to_string()],
            },
            // Second step, or inside the watched transaction.
            (_, true) => Command::Del { keys: vec![key] },
            (_, false) => Command::PExpire {
                key,
                millis: self.ttl_ms as i64,
            },
        }
    }

    fn grant_command(&self) -> Command {
        match self.grant.fence_script() {
            None => Command::Set {
                key: self.key.clone(),
                value: self.token.0.to_string(),
                condition: SetCondition::Nx,
                expiry: SetExpiry::Px(self.ttl_ms),
                get: false,
            },
            Some(script) => Command::Eval {
                script,
                keys: vec![self.key.clone(), self.fence_key.clone()],
                args: vec![self.token.0.to_string(), self.ttl_ms.to_string()],
            },
        }
    }

    /// The grant is undone when fewer replicas than asked acknowledged it.
    fn not_acknowledged(&self, acknowledged: u32) -> Next<Step> {
        Next::Failed(ProtocolError::ReplicasNotAcknowledged {
            wanted: self.wait_replicas.unwrap_or(0),
            acknowledged,
        })
    }
}

impl Recipe for SetPxRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.clone();
    }
    const KEEPS_RELEASED_LEASE: bool = true;
    const KEEPS_HOLD_START: bool = true;

    fn start(&self, op: Op, _now: Millis) -> (Command, Step) {
        match (op, self.guard) {
            (Op::Acquire, _) => (self.grant_command(), Step::Grant),
            (_, OwnerCheck::Script) => (self.act_command(op), Step::Act),
            (_, OwnerCheck::GetThenAct) => (
                Command::Get {
                    key: self.key.clone(),
                },
                Step::Get,
            ),
            (_, OwnerCheck::Watch) => watch_begin(&self.key, Step::Watched),
        }
    }

    fn advance(&self, op: Op, step: Step, reply: Reply, now: Millis) -> Next<Step> {
        match (step, reply) {
            (Step::Grant, Reply::Nil) => Next::NotGranted,
            (Step::Grant, r) if self.grant == Grant::SetNxPx && r.is_ok() => Next::Granted(None),
            (Step::Grant, Reply::Int(f)) if self.grant != Grant::SetNxPx && f > 0 => {
                Next::Granted(Some(Fence(f as u64)))
            }
            (Step::Grant, reply) => Next::Abort(ProtocolError::UnexpectedReply {
                request: "acquire",
                reply,
            }),
            (Step::Replicas { fence, valid_until }, reply) => {
                let acknowledged = match reply {
                    Reply::Int(n) if n >= 0 => n as u32,
                    _ => 0,
                };
                if acknowledged >= self.wait_replicas.unwrap_or(0) && now < valid_until {
                    Next::Confirmed(fence)
                } else {
                    self.not_acknowledged(acknowledged)
                }
            }
            (Step::Get, Reply::Bulk(v)) if *v == *self.token.0 => {
                Next::Send(self.act_command(op), Step::Act)
            }
            (Step::Get, Reply::Bulk(_) | Reply::Nil) => Next::Done { ours: false },
            // Script or GetThenAct: the act's count (DEL, PEXPIRE or script).
            (Step::Act, Reply::Int(n)) => Next::Done { ours: n == 1 },
            (Step::Get, reply) => unexpected("GET", reply),
            (Step::Act, reply) => unexpected("release/extend", reply),
            (Step::Watched(step), reply) => {
                let act = self.act_command(op);
                watch_step(&self.key, &self.token.0, act, step, reply, Step::Watched)
            }
        }
    }

    /// Nothing is written by a grant that failed or whose reply was lost
    /// (an unknown `SET NX PX` is left to its TTL); a `WAIT` that fails
    /// counts no replica.
    fn doubt(&self, step: &Step, error: Option<ProtocolError>) -> Next<Step> {
        match (step, error) {
            (Step::Replicas { .. }, _) => self.not_acknowledged(0),
            (_, None) => Next::NotGranted,
            (_, Some(e)) => Next::Abort(e),
        }
    }

    fn confirm(&self, lease: &Lease, now: Millis) -> Option<(Command, Step)> {
        let replicas = self.wait_replicas?;
        let timeout_ms = (lease.valid_until - now).min(self.ttl_ms / 10).max(1);
        Some((
            Command::Wait {
                replicas,
                timeout_ms,
            },
            Step::Replicas {
                fence: lease.fence,
                valid_until: lease.valid_until,
            },
        ))
    }
}
