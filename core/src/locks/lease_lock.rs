//! The mechanism shared by the `SET NX PX` family: `set-px-get-del`,
//! `set-px-watch`, `set-px-lua` and `fenced`.
//!
//! All four write a random owner token under `{name}` with a TTL and measure
//! their validity from the send time of the acquiring request:
//! `valid_until = sent_at + ttl − drift`. They differ in how a release or an
//! extend makes sure it touches only its own key:
//!
//! | style | conditional step |
//! |---|---|
//! | [`Guard::GetThenAct`] | `GET`, compare, then `DEL`/`PEXPIRE` as a second step (not atomic) |
//! | [`Guard::Watch`] | `WATCH`, `GET`, compare, `MULTI … EXEC` (aborts and retries when the key changed) |
//! | [`Guard::Script`] | one compare-and-act script (atomic) |
//!
//! and in how they acquire ([`Grant::SetNxPx`] or the fence-issuing
//! [`Grant::FencedScript`]).

use crate::config::{Config, ConfigError};
use crate::engine::{Scaffold, Timer};
use crate::keyspace::script::release_args;
use crate::keyspace::{Command, Reply, Script, SetCondition, SetExpiry};
use crate::protocol::{
    Acquire, Event, Fence, Lease, Outcome, ProtocolError, Request, RequestId, Token, UsageError,
};
use crate::time::Millis;

/// How a release or extend makes sure the key is still ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Guard {
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
}

/// What a conditional step does once the key is known to be ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Act {
    Delete,
    Expire,
}

/// Where a conditional (release/extend) sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// `Script`: the script is in flight. `GetThenAct`: the act is in flight.
    /// `Watch`: the `EXEC` is in flight.
    Act,
    /// `GetThenAct` and `Watch`: the `GET` is in flight.
    Get,
    /// `Watch`: the `WATCH` is in flight.
    Watch,
    /// `Watch`: the `UNWATCH` after a foreign value is in flight.
    Unwatch,
}

/// What follows a release.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Then {
    /// The application asked: report `Released`.
    Report,
    /// A grant is being undone because of this error: report it.
    Fail(ProtocolError),
    /// A grant came back too late: try again.
    Retry(Acquire),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Idle,
    Acquiring {
        req: RequestId,
        sent_at: Millis,
        how: Acquire,
    },
    /// Granted; `WAIT` for replicas in flight.
    AwaitingReplicas {
        req: RequestId,
        lease: Lease,
    },
    /// Taken; the retry timer is armed.
    BackingOff {
        how: Acquire,
    },
    Held {
        lease: Lease,
        renew_from: Millis,
    },
    Extending {
        req: RequestId,
        step: Step,
        sent_at: Millis,
        lease: Lease,
        automatic: bool,
    },
    Releasing {
        req: RequestId,
        step: Step,
        lease: Lease,
        /// What to do once released.
        then: Then,
    },
}

/// A `SET NX PX` lease lock, parameterised by its guard and grant style.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LeaseLock {
    key: String,
    fence_key: String,
    ttl_ms: u64,
    drift_ms: u64,
    auto_renew: bool,
    wait_replicas: Option<u32>,
    notify_releases: bool,
    token: Token,
    guard: Guard,
    grant: Grant,
    state: State,
    base: Scaffold,
}

impl LeaseLock {
    pub(crate) fn new(
        protocol: &'static str,
        config: &Config,
        token: Token,
        guard: Guard,
        grant: Grant,
        auto_renew: bool,
    ) -> Result<LeaseLock, ConfigError> {
        config.validate_single(protocol)?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        Ok(LeaseLock {
            key: config.key(),
            fence_key: config.key_with("fence"),
            ttl_ms: config.ttl_ms,
            drift_ms: config.drift(),
            auto_renew,
            wait_replicas: config.wait_replicas,
            notify_releases: config.notify_releases,
            token,
            guard,
            grant,
            state: State::Idle,
            base: Scaffold::new(config.backoff(), config.reply_timeout_ms),
        })
    }

    fn send(&mut self, now: Millis, command: Command) -> RequestId {
        self.base
            .send(now, crate::protocol::NodeId(0), Timer::Reply, command)
    }

    fn lease_from(&self, sent_at: Millis, fence: Option<Fence>) -> Lease {
        Lease {
            token: self.token.clone(),
            fence,
            valid_until: sent_at + (self.ttl_ms - self.drift_ms),
        }
    }

    fn send_grant(&mut self, now: Millis) -> RequestId {
        let command = match self.grant {
            Grant::SetNxPx => Command::Set {
                key: self.key.clone(),
                value: self.token.0.clone(),
                condition: SetCondition::Nx,
                expiry: SetExpiry::Px(self.ttl_ms),
                get: false,
            },
            Grant::FencedScript => Command::Eval {
                script: Script::FencedAcquire,
                keys: vec![self.key.clone(), self.fence_key.clone()],
                args: vec![self.token.0.clone(), self.ttl_ms.to_string()],
            },
        };
        self.send(now, command)
    }

    /// The command that acts once the key is known to be ours (or, for
    /// `Script`, that checks and acts in one step).
    fn act_command(&self, act: Act) -> Command {
        let key = self.key.clone();
        match (self.guard, act) {
            (Guard::Script, Act::Delete) => Command::Eval {
                script: Script::CompareAndDelete,
                keys: vec![key],
                args: release_args(vec![self.token.0.clone()], self.notify_releases),
            },
            (Guard::Script, Act::Expire) => Command::Eval {
                script: Script::CompareAndPExpire,
                keys: vec![key],
                args: vec![self.token.0.clone(), self.ttl_ms.to_string()],
            },
            (Guard::GetThenAct, Act::Delete) => Command::Del { keys: vec![key] },
            (Guard::GetThenAct, Act::Expire) => Command::PExpire {
                key,
                millis: self.ttl_ms as i64,
            },
            (Guard::Watch, Act::Delete) => {
                Command::Transaction(vec![Command::Del { keys: vec![key] }])
            }
            (Guard::Watch, Act::Expire) => Command::Transaction(vec![Command::PExpire {
                key,
                millis: self.ttl_ms as i64,
            }]),
        }
    }

    /// Start a conditional release/extend sequence; returns its first request and step.
    fn start_conditional(&mut self, now: Millis, act: Act) -> (RequestId, Step) {
        match self.guard {
            Guard::Script => {
                let cmd = self.act_command(act);
                (self.send(now, cmd), Step::Act)
            }
            Guard::GetThenAct => {
                let key = self.key.clone();
                (self.send(now, Command::Get { key }), Step::Get)
            }
            Guard::Watch => {
                let keys = vec![self.key.clone()];
                (self.send(now, Command::Watch { keys }), Step::Watch)
            }
        }
    }

    /// Advance a conditional release/extend sequence on a reply.
    fn advance_conditional(
        &mut self,
        now: Millis,
        act: Act,
        step: Step,
        reply: Reply,
    ) -> Conditional {
        match (step, reply) {
            (_, Reply::Error(e)) => Conditional::Failed(ProtocolError::Redis(e)),
            (Step::Watch, r) if r.is_ok() => {
                let key = self.key.clone();
                Conditional::Continue(self.send(now, Command::Get { key }), Step::Get)
            }
            (Step::Get, Reply::Bulk(v)) if v == self.token.0 => {
                let cmd = self.act_command(act);
                Conditional::Continue(self.send(now, cmd), Step::Act)
            }
            (Step::Get, Reply::Bulk(_) | Reply::Nil) => {
                if self.guard == Guard::Watch {
                    Conditional::Continue(self.send(now, Command::Unwatch), Step::Unwatch)
                } else {
                    Conditional::Done { ours: false }
                }
            }
            (Step::Unwatch, _) => Conditional::Done { ours: false },
            // Script or GetThenAct: the act's count (DEL, PEXPIRE or script).
            (Step::Act, Reply::Int(n)) if self.guard != Guard::Watch => {
                Conditional::Done { ours: n == 1 }
            }
            // Watch: EXEC aborted because the key changed: start again.
            (Step::Act, Reply::Nil) if self.guard == Guard::Watch => {
                let (req, step) = self.start_conditional(now, act);
                Conditional::Continue(req, step)
            }
            (Step::Act, Reply::Array(items)) if self.guard == Guard::Watch => Conditional::Done {
                ours: items.first().and_then(Reply::as_int) == Some(1),
            },
            (step, reply) => Conditional::Failed(ProtocolError::UnexpectedReply {
                request: match step {
                    Step::Act => "release/extend",
                    Step::Get => "GET",
                    Step::Watch => "WATCH",
                    Step::Unwatch => "UNWATCH",
                },
                reply,
            }),
        }
    }

    fn hold(&mut self, lease: Lease, renew_from: Millis) {
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        if self.auto_renew {
            self.base
                .timers
                .set(Timer::Renew, renew_from + (self.ttl_ms / 3).max(1));
        }
        self.state = State::Held { lease, renew_from };
    }

    fn go_idle(&mut self) {
        self.base.timers.clear_all();
        self.state = State::Idle;
    }

    /// A failed attempt: retry after a jittered delay if the deadline allows.
    fn retry_or_deny(&mut self, now: Millis, how: Acquire) {
        self.state = if self.base.retry_or_deny(now, how) {
            State::BackingOff { how }
        } else {
            State::Idle
        };
    }

    fn start_release(&mut self, now: Millis, lease: Lease, then: Then) {
        self.base.timers.clear_all();
        let (req, step) = self.start_conditional(now, Act::Delete);
        self.state = State::Releasing {
            req,
            step,
            lease,
            then,
        };
    }

    fn start_extend(&mut self, now: Millis, lease: Lease, automatic: bool) {
        self.base.timers.clear(Timer::Renew);
        let (req, step) = self.start_conditional(now, Act::Expire);
        self.state = State::Extending {
            req,
            step,
            sent_at: now,
            lease,
            automatic,
        };
    }

    fn on_granted(&mut self, now: Millis, sent_at: Millis, fence: Option<Fence>, how: Acquire) {
        let lease = self.lease_from(sent_at, fence);
        if now >= lease.valid_until {
            // The grant came back too late to be of use: undo it, then retry.
            self.start_release(now, lease, Then::Retry(how));
            return;
        }
        if let Some(replicas) = self.wait_replicas {
            let timeout_ms = (lease.valid_until - now).min(self.ttl_ms / 10).max(1);
            let req = self.send(
                now,
                Command::Wait {
                    replicas,
                    timeout_ms,
                },
            );
            self.state = State::AwaitingReplicas { req, lease };
            return;
        }
        self.hold(lease.clone(), sent_at);
        self.base.out.emit(Event::Acquired(lease));
    }

    pub(crate) fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        match self.state {
            State::Idle => {}
            State::Held { .. } => return Err(UsageError::AlreadyHeld),
            _ => return Err(UsageError::Busy),
        }
        self.base.backoff.reset();
        let req = self.send_grant(now);
        self.state = State::Acquiring {
            req,
            sent_at: now,
            how,
        };
        Ok(())
    }

    pub(crate) fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &self.state {
            State::Held { lease, .. } => lease.clone(),
            // An automatic renewal in flight does not block a release; its
            // reply is ignored from now on.
            State::Extending {
                lease,
                automatic: true,
                ..
            } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        self.start_release(now, lease, Then::Report);
        Ok(())
    }

    pub(crate) fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &self.state {
            State::Held { lease, .. } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        self.start_extend(now, lease, false);
        Ok(())
    }

    pub(crate) fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        let current = match &self.state {
            State::Acquiring { req, .. }
            | State::AwaitingReplicas { req, .. }
            | State::Extending { req, .. }
            | State::Releasing { req, .. } => *req,
            _ => return,
        };
        if current != id {
            return;
        }
        self.base.timers.clear(Timer::Reply);
        let state = std::mem::replace(&mut self.state, State::Idle);
        match (state, outcome) {
            (State::Acquiring { sent_at, how, .. }, outcome) => {
                let fence = match (self.grant, outcome) {
                    (Grant::SetNxPx, Outcome::Reply(r)) if r.is_ok() => Some(None),
                    (Grant::FencedScript, Outcome::Reply(Reply::Int(f))) if f > 0 => {
                        Some(Some(Fence(f as u64)))
                    }
                    (_, Outcome::Reply(Reply::Nil)) | (_, Outcome::Unknown) => None,
                    (_, Outcome::Reply(Reply::Error(e))) => {
                        self.go_idle();
                        self.base.out.emit(Event::Failed(ProtocolError::Redis(e)));
                        return;
                    }
                    (_, Outcome::Reply(reply)) => {
                        self.go_idle();
                        self.base
                            .out
                            .emit(Event::Failed(ProtocolError::UnexpectedReply {
                                request: "acquire",
                                reply,
                            }));
                        return;
                    }
                };
                match fence {
                    Some(fence) => self.on_granted(now, sent_at, fence, how),
                    None => self.retry_or_deny(now, how),
                }
            }
            (State::AwaitingReplicas { lease, .. }, outcome) => {
                let wanted = self.wait_replicas.unwrap_or(0);
                let acknowledged = match outcome {
                    Outcome::Reply(Reply::Int(n)) if n >= 0 => n as u32,
                    _ => 0,
                };
                if acknowledged >= wanted && now < lease.valid_until {
                    let renew_from = lease
                        .valid_until
                        .get()
                        .saturating_sub(self.ttl_ms - self.drift_ms);
                    self.hold(lease.clone(), Millis(renew_from));
                    self.base.out.emit(Event::Acquired(lease));
                } else {
                    self.start_release(
                        now,
                        lease,
                        Then::Fail(ProtocolError::ReplicasNotAcknowledged {
                            wanted,
                            acknowledged,
                        }),
                    );
                }
            }
            (
                State::Extending {
                    step,
                    sent_at,
                    lease,
                    automatic,
                    ..
                },
                Outcome::Reply(reply),
            ) => match self.advance_conditional(now, Act::Expire, step, reply) {
                Conditional::Continue(req, step) => {
                    self.state = State::Extending {
                        req,
                        step,
                        sent_at,
                        lease,
                        automatic,
                    }
                }
                Conditional::Done { ours: true } => {
                    let lease = self.lease_from(sent_at, lease.fence);
                    self.hold(lease.clone(), sent_at);
                    self.base.out.emit(Event::Extended(lease));
                }
                Conditional::Done { ours: false } => {
                    // The key is no longer ours: the hold is gone.
                    self.go_idle();
                    self.base.out.emit(Event::Lost);
                }
                Conditional::Failed(e) => {
                    self.hold_on(now, lease);
                    self.base.out.emit(Event::Failed(e));
                }
            },
            (State::Extending { lease, .. }, Outcome::Unknown) => {
                // Unknown: keep the old lease; never release silently.
                self.hold_on(now, lease);
                self.base.out.emit(Event::NotExtended);
            }
            (
                State::Releasing {
                    step, lease, then, ..
                },
                Outcome::Reply(reply),
            ) => match self.advance_conditional(now, Act::Delete, step, reply) {
                Conditional::Continue(req, step) => {
                    self.state = State::Releasing {
                        req,
                        step,
                        lease,
                        then,
                    }
                }
                Conditional::Done { ours } => self.finish_release(now, ours, then),
                Conditional::Failed(e) => {
                    let e = match then {
                        Then::Fail(cause) => cause,
                        _ => e,
                    };
                    self.go_idle();
                    self.base.out.emit(Event::Failed(e));
                }
            },
            (State::Releasing { then, .. }, Outcome::Unknown) => {
                // Whether the release ran is unknown; the TTL bounds the hold.
                self.finish_release(now, false, then);
            }
            (state, _) => self.state = state,
        }
    }

    fn finish_release(&mut self, now: Millis, ours: bool, then: Then) {
        self.go_idle();
        match then {
            Then::Report => self.base.out.emit(Event::Released { was_held: ours }),
            Then::Fail(e) => self.base.out.emit(Event::Failed(e)),
            Then::Retry(how) => self.retry_or_deny(now, how),
        }
    }

    /// Stay held on the old lease after an extend that did not go through.
    fn hold_on(&mut self, now: Millis, lease: Lease) {
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return;
        }
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        self.state = State::Held {
            renew_from: now,
            lease,
        };
    }

    pub(crate) fn handle_timeout(&mut self, now: Millis) {
        let due = self.base.due(now);
        for timer in due {
            match (timer, &self.state) {
                (Timer::Reply, _) => {
                    if let Some(req) = self.current_request() {
                        self.handle_reply(now, req, Outcome::Unknown);
                    }
                }
                (Timer::Retry, State::BackingOff { how }) => {
                    let how = *how;
                    let req = self.send_grant(now);
                    self.state = State::Acquiring {
                        req,
                        sent_at: now,
                        how,
                    };
                }
                (Timer::Expiry, State::Held { .. } | State::Extending { .. }) => {
                    self.go_idle();
                    self.base.out.emit(Event::Lost);
                }
                (Timer::Renew, State::Held { lease, .. }) => {
                    let lease = lease.clone();
                    self.start_extend(now, lease, true);
                }
                _ => {}
            }
        }
    }

    fn current_request(&self) -> Option<RequestId> {
        match &self.state {
            State::Acquiring { req, .. }
            | State::AwaitingReplicas { req, .. }
            | State::Extending { req, .. }
            | State::Releasing { req, .. } => Some(*req),
            _ => None,
        }
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Request> {
        self.base.poll_transmit()
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.base.poll_event()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Millis> {
        self.base.poll_timeout()
    }

    pub(crate) fn lease(&self) -> Option<&Lease> {
        match &self.state {
            State::Held { lease, .. } | State::Extending { lease, .. } => Some(lease),
            _ => None,
        }
    }

    pub(crate) fn is_busy(&self) -> bool {
        !matches!(self.state, State::Idle | State::Held { .. })
    }
}

/// Where a conditional sequence went after a reply.
enum Conditional {
    Continue(RequestId, Step),
    Done { ours: bool },
    Failed(ProtocolError),
}

/// Implements [`Protocol`](crate::protocol::Protocol) for a newtype around a
/// [`LeaseLock`].
macro_rules! delegate_protocol {
    ($ty:ty, $field:tt) => {
        impl $crate::protocol::Protocol for $ty {
            fn acquire(
                &mut self,
                now: $crate::time::Millis,
                how: $crate::protocol::Acquire,
            ) -> Result<(), $crate::protocol::UsageError> {
                self.$field.acquire(now, how)
            }
            fn release(
                &mut self,
                now: $crate::time::Millis,
            ) -> Result<(), $crate::protocol::UsageError> {
                self.$field.release(now)
            }
            fn extend(
                &mut self,
                now: $crate::time::Millis,
            ) -> Result<(), $crate::protocol::UsageError> {
                self.$field.extend(now)
            }
            fn handle_reply(
                &mut self,
                now: $crate::time::Millis,
                id: $crate::protocol::RequestId,
                outcome: $crate::protocol::Outcome,
            ) {
                self.$field.handle_reply(now, id, outcome)
            }
            fn handle_timeout(&mut self, now: $crate::time::Millis) {
                self.$field.handle_timeout(now)
            }
            fn poll_transmit(&mut self) -> Option<$crate::protocol::Request> {
                self.$field.poll_transmit()
            }
            fn poll_event(&mut self) -> Option<$crate::protocol::Event> {
                self.$field.poll_event()
            }
            fn poll_timeout(&self) -> Option<$crate::time::Millis> {
                self.$field.poll_timeout()
            }
            fn lease(&self) -> Option<&$crate::protocol::Lease> {
                self.$field.lease()
            }
            fn is_busy(&self) -> bool {
                self.$field.is_busy()
            }
        }
    };
}
pub(crate) use delegate_protocol;
