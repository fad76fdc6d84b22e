//! The semaphore protocols of the catalogue, one file each.
//!
//! | id | file | origin |
//! |---|---|---|
//! | `zset-semaphore` | [`zset_semaphore`] | "Redis in Action" 6.3.1 |
//! | `fair-semaphore` | [`fair_semaphore`] | "Redis in Action" 6.3.2 |
//! | `fair-semaphore-locked` | [`fair_semaphore_locked`] | "Redis in Action" 6.3.5 |
//! | `watch-semaphore` | [`watch_semaphore`] | "Redis使用手册" |
//! | `lease-semaphore` | [`lease_semaphore`] | beyond the sources |
//!
//! Every semaphore is a *recipe* (which commands an acquire, a release and
//! an extend send, and what each reply means) run by one shared engine
//! (this module) that owns everything the recipes have in common with the
//! locks: the state machine, retries with jittered backoff, the validity
//! `sent_at + ttl − drift`, the expiry, renewal and reply timers, undoing a
//! partial acquire, and — for `fair-semaphore-locked` — holding a catalogue
//! lock around the acquire.
//!
//! A permit is a [`Lease`]. An acquire that fails after writing something
//! (a rank above the limit, an error, an unknown outcome) first runs the
//! recipe's release to take its entry out again, then retries or reports.

pub mod fair_semaphore;
pub mod fair_semaphore_locked;
pub mod lease_semaphore;
pub mod watch_semaphore;
pub mod zset_semaphore;

use crate::catalogue::Machine;
use crate::keyspace::{Command, Reply};
use crate::protocol::{
    Acquire, Backoff, Event, Fence, Lease, NodeId, Outcome, Protocol, ProtocolError, Request,
    RequestId, Scaffold, Token, UsageError,
};
use crate::time::Millis;
use std::fmt::Debug;
use std::hash::Hash;

/// Which operation a recipe step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    Acquire,
    Release,
    Extend,
}

/// What a recipe makes of a reply.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Next<S> {
    /// Send this command next; its reply goes to this step.
    Send(Command, S),
    /// Acquire: the permit is ours.
    Granted(Option<Fence>),
    /// Acquire: no permit and nothing of ours was written.
    NotGranted,
    /// Acquire: no permit, and our entry must be taken out again.
    Undo,
    /// Release or extend: did it find (and act on) our own entry?
    Done {
        /// Our entry was there.
        ours: bool,
    },
    /// Extend: the refresh found us timed out and wrote us back; take the
    /// entry out again and report the permit lost.
    LostUndo,
    /// The reply makes no sense for this step.
    Failed(ProtocolError),
}

/// The protocol-specific part of a semaphore: commands and reply meanings.
/// Error replies (also inside a transaction's reply) never reach a recipe.
pub(crate) trait Recipe: Clone + Debug + PartialEq + Eq + Hash {
    /// Where a request sequence is.
    type Step: Clone + Debug + PartialEq + Eq + Hash;
    /// The first command of `op`.
    fn start(&self, op: Op, now: Millis) -> (Command, Self::Step);
    /// The next move after `reply` to `step` of `op`.
    fn advance(&self, op: Op, step: Self::Step, reply: Reply, now: Millis) -> Next<Self::Step>;
}

/// What an acquire attempt came to (reported once any guard lock is released).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum After {
    Granted { lease: Lease, renew_from: Millis },
    Retry(Acquire),
    Failed(ProtocolError),
}

/// What follows a release sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Then {
    /// The application asked: report `Released`.
    Report,
    /// An acquire attempt is being undone; then conclude it.
    Attempt(After),
    /// An extend found the permit timed out: report `Lost`.
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State<S> {
    Idle,
    /// The guard lock's acquire is in flight.
    Guarding {
        how: Acquire,
    },
    Acquiring {
        req: RequestId,
        step: S,
        sent_at: Millis,
        how: Acquire,
    },
    /// The guard lock's release is in flight; then conclude.
    Unguarding {
        after: After,
    },
    BackingOff {
        how: Acquire,
    },
    Held {
        lease: Lease,
    },
    Extending {
        req: RequestId,
        step: S,
        sent_at: Millis,
        lease: Lease,
        automatic: bool,
    },
    Releasing {
        req: RequestId,
        step: S,
        then: Then,
    },
}

const RETRY: usize = 0;
const EXPIRY: usize = 1;
const RENEW: usize = 2;
const REPLY: usize = 3;

/// How long `fair-semaphore-locked` tries for its guard on a try-once
/// acquire: the book's `acquire_timeout=.01`.
pub(crate) const GUARD_WAIT_MS: u64 = 10;

/// Request ids of the engine's own requests are even, the guard lock's odd,
/// so that both can number from zero without colliding.
pub(crate) fn own_id(id: RequestId) -> RequestId {
    RequestId(id.0.wrapping_mul(2))
}

/// The outer id of a request of an embedded machine.
pub(crate) fn inner_id(id: RequestId) -> RequestId {
    RequestId(id.0.wrapping_mul(2).wrapping_add(1))
}

/// Split an outer id: `(is the embedded machine's, its own id)`.
pub(crate) fn split_id(id: RequestId) -> (bool, RequestId) {
    (id.0 % 2 == 1, RequestId(id.0 / 2))
}

/// The first error reply in `reply` or, for a transaction, in its items.
pub(crate) fn error_in(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Error(e) => Some(e.clone()),
        Reply::Array(items) => items.iter().find_map(|r| match r {
            Reply::Error(e) => Some(e.clone()),
            _ => None,
        }),
        _ => None,
    }
}

/// A client timestamp as a sorted-set score.
pub(crate) fn score(now: Millis) -> i64 {
    i64::try_from(now.get()).unwrap_or(i64::MAX)
}

/// The item `index` of a transaction reply of `len` items, if that is its shape.
pub(crate) fn item(reply: &Reply, len: usize, index: usize) -> Option<&Reply> {
    match reply {
        Reply::Array(items) if items.len() == len => items.get(index),
        _ => None,
    }
}

/// The shared semaphore machine around a [`Recipe`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Engine<R: Recipe> {
    recipe: R,
    token: Token,
    /// `None`: permits never expire (`watch-semaphore`).
    ttl_ms: Option<u64>,
    drift_ms: u64,
    auto_renew: bool,
    base: Scaffold<4>,
    state: State<R::Step>,
    /// The lock held around every acquire attempt (`fair-semaphore-locked`).
    guard: Option<Box<Machine>>,
}

/// Construction parameters of an [`Engine`] beyond the recipe.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    pub(crate) token: Token,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) drift_ms: u64,
    pub(crate) reply_timeout_ms: Option<u64>,
    pub(crate) auto_renew: bool,
    pub(crate) backoff: Backoff,
    pub(crate) guard: Option<Box<Machine>>,
}

impl EngineConfig {
    /// The usual parameters from a validated config: TTL, drift, reply
    /// timeout and backoff; no renewal, no guard.
    pub(crate) fn from(config: &crate::config::Config, token: Token) -> EngineConfig {
        EngineConfig {
            token,
            ttl_ms: Some(config.ttl_ms),
            drift_ms: config.drift(),
            reply_timeout_ms: config.reply_timeout_ms,
            auto_renew: false,
            backoff: config.backoff(),
            guard: None,
        }
    }
}

impl<R: Recipe> Engine<R> {
    pub(crate) fn new(recipe: R, c: EngineConfig) -> Engine<R> {
        Engine {
            recipe,
            token: c.token,
            ttl_ms: c.ttl_ms,
            drift_ms: c.drift_ms,
            auto_renew: c.auto_renew,
            base: Scaffold::new(c.backoff, c.reply_timeout_ms),
            state: State::Idle,
            guard: c.guard,
        }
    }

    /// The protocol of the guard lock, if there is one.
    pub(crate) fn guard_id(&self) -> Option<crate::catalogue::ProtocolId> {
        self.guard.as_ref().map(|g| g.id())
    }

    fn send(&mut self, now: Millis, command: Command) -> RequestId {
        self.base.send(now, NodeId(0), REPLY, command)
    }

    fn lease_from(&self, sent_at: Millis, fence: Option<Fence>) -> Lease {
        let valid_until = match self.ttl_ms {
            Some(ttl) => sent_at + ttl.saturating_sub(self.drift_ms),
            None => Millis(u64::MAX),
        };
        Lease {
            token: self.token.clone(),
            fence,
            valid_until,
        }
    }

    fn go_idle(&mut self) {
        self.base.timers.clear_all();
        self.state = State::Idle;
    }

    fn hold(&mut self, lease: Lease, renew_from: Millis) {
        self.base.timers.clear_all();
        if let Some(ttl) = self.ttl_ms {
            self.base.timers.set(EXPIRY, lease.valid_until);
            if self.auto_renew {
                self.base.timers.set(RENEW, renew_from + (ttl / 3).max(1));
            }
        }
        self.state = State::Held { lease };
    }

    /// Stay held on the old lease after an extend that did not go through.
    fn hold_on(&mut self, now: Millis, lease: Lease) {
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return;
        }
        self.base.timers.clear(REPLY);
        if self.ttl_ms.is_some() {
            self.base.timers.set(EXPIRY, lease.valid_until);
        }
        self.state = State::Held { lease };
    }

    /// One acquire attempt: through the guard when there is one.
    fn attempt(&mut self, now: Millis, how: Acquire) {
        if let Some(guard) = self.guard.as_mut() {
            let guard_how = match how {
                Acquire::Once => Acquire::Until(now + GUARD_WAIT_MS),
                until => until,
            };
            if guard.acquire(now, guard_how).is_ok() {
                self.state = State::Guarding { how };
                self.pump_guard(now);
                return;
            }
            // The guard is still busy with an earlier release: try later.
            self.retry_or_deny(now, how);
            return;
        }
        self.start_acquire(now, how);
    }

    fn start_acquire(&mut self, now: Millis, how: Acquire) {
        let (command, step) = self.recipe.start(Op::Acquire, now);
        let req = self.send(now, command);
        self.state = State::Acquiring {
            req,
            step,
            sent_at: now,
            how,
        };
    }

    /// Take a partial acquire out again, then conclude with `after`.
    fn undo(&mut self, now: Millis, after: After) {
        self.start_release(now, Then::Attempt(after));
    }

    fn start_release(&mut self, now: Millis, then: Then) {
        self.base.timers.clear_all();
        let (command, step) = self.recipe.start(Op::Release, now);
        let req = self.send(now, command);
        self.state = State::Releasing { req, step, then };
    }

    fn start_extend(&mut self, now: Millis, lease: Lease, automatic: bool) {
        self.base.timers.clear(RENEW);
        let (command, step) = self.recipe.start(Op::Extend, now);
        let req = self.send(now, command);
        self.state = State::Extending {
            req,
            step,
            sent_at: now,
            lease,
            automatic,
        };
    }

    /// The attempt is over: release the guard if it is held, then report.
    fn conclude(&mut self, now: Millis, after: After) {
        if let Some(guard) = self.guard.as_mut() {
            if guard.lease().is_some() && guard.release(now).is_ok() {
                self.base.timers.clear_all();
                self.state = State::Unguarding { after };
                self.pump_guard(now);
                return;
            }
        }
        self.apply(now, after);
    }

    fn apply(&mut self, now: Millis, after: After) {
        match after {
            After::Granted { lease, renew_from } => {
                self.hold(lease.clone(), renew_from);
                self.base.out.emit(Event::Acquired(lease));
            }
            After::Retry(how) => self.retry_or_deny(now, how),
            After::Failed(e) => {
                self.go_idle();
                self.base.out.emit(Event::Failed(e));
            }
        }
    }

    /// A failed attempt: retry after a jittered delay if the deadline allows.
    fn retry_or_deny(&mut self, now: Millis, how: Acquire) {
        self.state = if self.base.retry_or_deny(now, how, RETRY) {
            State::BackingOff { how }
        } else {
            State::Idle
        };
    }

    /// React to the guard lock's events.
    fn pump_guard(&mut self, now: Millis) {
        loop {
            let Some(event) = self.guard.as_mut().and_then(|g| g.poll_event()) else {
                return;
            };
            match (&self.state, event) {
                (State::Guarding { how }, Event::Acquired(_)) => {
                    let how = *how;
                    self.start_acquire(now, how);
                }
                (State::Guarding { how }, Event::Denied) => {
                    let how = *how;
                    self.apply(now, After::Retry(how));
                }
                (State::Guarding { .. }, Event::Failed(e)) => self.apply(now, After::Failed(e)),
                (
                    State::Unguarding { after },
                    Event::Released { .. } | Event::Failed(_) | Event::Lost,
                ) => {
                    let after = after.clone();
                    self.apply(now, after);
                }
                // The guard ran out while we were acquiring: nothing to
                // release at the end any more.
                _ => {}
            }
        }
    }

    pub(crate) fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        match self.state {
            State::Idle => {}
            State::Held { .. } => return Err(UsageError::AlreadyHeld),
            _ => return Err(UsageError::Busy),
        }
        self.base.backoff.reset();
        self.attempt(now, how);
        Ok(())
    }

    pub(crate) fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        match &self.state {
            State::Held { .. }
            | State::Extending {
                automatic: true, ..
            } => {}
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        }
        self.start_release(now, Then::Report);
        Ok(())
    }

    pub(crate) fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &self.state {
            State::Held { lease } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        self.start_extend(now, lease, false);
        Ok(())
    }

    pub(crate) fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        let (is_guard, inner) = split_id(id);
        if is_guard {
            if let Some(guard) = self.guard.as_mut() {
                guard.handle_reply(now, inner, outcome);
                self.pump_guard(now);
            }
            return;
        }
        self.handle_own_reply(now, inner, outcome);
    }

    fn current_request(&self) -> Option<RequestId> {
        match &self.state {
            State::Acquiring { req, .. }
            | State::Extending { req, .. }
            | State::Releasing { req, .. } => Some(*req),
            _ => None,
        }
    }

    fn handle_own_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        if self.current_request() != Some(id) {
            return;
        }
        self.base.timers.clear(REPLY);
        let state = std::mem::replace(&mut self.state, State::Idle);
        let reply = match outcome {
            Outcome::Reply(reply) => match error_in(&reply) {
                Some(e) => Err(Some(ProtocolError::Redis(e))),
                None => Ok(reply),
            },
            Outcome::Unknown => Err(None),
        };
        match state {
            State::Acquiring {
                step, sent_at, how, ..
            } => {
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(None) => return self.undo(now, After::Retry(how)),
                    Err(Some(e)) => return self.undo(now, After::Failed(e)),
                };
                match self.recipe.advance(Op::Acquire, step, reply, now) {
                    Next::Send(command, step) => {
                        let req = self.send(now, command);
                        self.state = State::Acquiring {
                            req,
                            step,
                            sent_at,
                            how,
                        };
                    }
                    Next::Granted(fence) => {
                        let lease = self.lease_from(sent_at, fence);
                        if now >= lease.valid_until {
                            // Too late to be of use: give it back, try again.
                            self.undo(now, After::Retry(how));
                        } else {
                            self.conclude(
                                now,
                                After::Granted {
                                    lease,
                                    renew_from: sent_at,
                                },
                            );
                        }
                    }
                    Next::NotGranted => self.conclude(now, After::Retry(how)),
                    Next::Undo => self.undo(now, After::Retry(how)),
                    Next::Failed(e) => self.undo(now, After::Failed(e)),
                    Next::Done { .. } | Next::LostUndo => self.undo(
                        now,
                        After::Failed(ProtocolError::Missing("a recipe step".into())),
                    ),
                }
            }
            State::Releasing { step, then, .. } => {
                let failure = match reply {
                    Ok(reply) => match self.recipe.advance(Op::Release, step, reply, now) {
                        Next::Send(command, step) => {
                            let req = self.send(now, command);
                            self.state = State::Releasing { req, step, then };
                            return;
                        }
                        Next::Done { ours } => return self.finish_release(now, ours, then),
                        Next::Failed(e) => e,
                        _ => ProtocolError::Missing("a recipe step".into()),
                    },
                    // Whether the release ran is unknown; any TTL bounds the hold.
                    Err(None) => return self.finish_release(now, false, then),
                    Err(Some(e)) => e,
                };
                match then {
                    Then::Attempt(After::Failed(cause)) => self.conclude(now, After::Failed(cause)),
                    Then::Attempt(_) => self.conclude(now, After::Failed(failure)),
                    Then::Report => {
                        self.go_idle();
                        self.base.out.emit(Event::Failed(failure));
                    }
                    Then::Lost => {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    }
                }
            }
            State::Extending {
                step,
                sent_at,
                lease,
                automatic,
                ..
            } => {
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(None) => {
                        self.hold_on(now, lease);
                        self.base.out.emit(Event::NotExtended);
                        return;
                    }
                    Err(Some(e)) => {
                        self.hold_on(now, lease);
                        self.base.out.emit(Event::Failed(e));
                        return;
                    }
                };
                match self.recipe.advance(Op::Extend, step, reply, now) {
                    Next::Send(command, step) => {
                        let req = self.send(now, command);
                        self.state = State::Extending {
                            req,
                            step,
                            sent_at,
                            lease,
                            automatic,
                        };
                    }
                    Next::Done { ours: true } => {
                        let lease = self.lease_from(sent_at, lease.fence);
                        self.hold(lease.clone(), sent_at);
                        self.base.out.emit(Event::Extended(lease));
                    }
                    Next::Done { ours: false } => {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    }
                    Next::LostUndo => self.start_release(now, Then::Lost),
                    Next::Failed(e) => {
                        self.hold_on(now, lease);
                        self.base.out.emit(Event::Failed(e));
                    }
                    _ => {
                        self.hold_on(now, lease);
                        self.base.out.emit(Event::Failed(ProtocolError::Missing(
                            "a recipe step".into(),
                        )));
                    }
                }
            }
            other => self.state = other,
        }
    }

    fn finish_release(&mut self, now: Millis, ours: bool, then: Then) {
        match then {
            Then::Report => {
                self.go_idle();
                self.base.out.emit(Event::Released { was_held: ours });
            }
            Then::Attempt(after) => self.conclude(now, after),
            Then::Lost => {
                self.go_idle();
                self.base.out.emit(Event::Lost);
            }
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Millis) {
        if let Some(guard) = self.guard.as_mut() {
            if guard.poll_timeout().is_some_and(|t| t <= now) {
                guard.handle_timeout(now);
                self.pump_guard(now);
            }
        }
        let due = self.base.due(now);
        for timer in due {
            match (timer, &self.state) {
                (REPLY, _) => {
                    if let Some(req) = self.current_request() {
                        self.handle_own_reply(now, req, Outcome::Unknown);
                    }
                }
                (RETRY, State::BackingOff { how }) => {
                    let how = *how;
                    self.attempt(now, how);
                }
                (EXPIRY, State::Held { .. } | State::Extending { .. }) => {
                    self.go_idle();
                    self.base.out.emit(Event::Lost);
                }
                (RENEW, State::Held { lease }) => {
                    let lease = lease.clone();
                    self.start_extend(now, lease, true);
                }
                _ => {}
            }
        }
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Request> {
        if let Some(mut request) = self.guard.as_mut().and_then(|g| g.poll_transmit()) {
            request.id = inner_id(request.id);
            return Some(request);
        }
        let mut request = self.base.out.poll_transmit()?;
        request.id = own_id(request.id);
        Some(request)
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.base.out.poll_event()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Millis> {
        let guard = self.guard.as_ref().and_then(|g| g.poll_timeout());
        match (self.base.timers.next(), guard) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn lease(&self) -> Option<&Lease> {
        match &self.state {
            State::Held { lease } | State::Extending { lease, .. } => Some(lease),
            _ => None,
        }
    }

    pub(crate) fn is_busy(&self) -> bool {
        !matches!(self.state, State::Idle | State::Held { .. })
    }
}

/// Implements `Protocol` for a newtype around an [`Engine`].
macro_rules! engine_protocol {
    ($ty:ty) => {
        $crate::protocol::delegate_protocol!($ty, 0);
    };
}
pub(crate) use engine_protocol;

/// The "unexpected reply" failure of a recipe step.
pub(crate) fn unexpected<S>(request: &'static str, reply: Reply) -> Next<S> {
    Next::Failed(ProtocolError::UnexpectedReply { request, reply })
}
