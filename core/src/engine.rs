//! The one engine every single-node machine runs on.
//!
//! A single-node lock or semaphore is a *recipe* (which commands an
//! acquire, a release and an extend send, and what each reply means) run by
//! the [`Engine`] of this module, which owns everything the machines have in
//! common: the state machine, retries with jittered backoff, the validity
//! `sent_at + ttl − drift`, the expiry, renewal and reply timers, undoing a
//! partial acquire, the one watched release step shared by every `WATCH`
//! protocol ([`watch_begin`], [`watch_step`]), and — for
//! `fair-semaphore-locked` — holding a catalogue lock around the acquire,
//! whose requests share the engine's id space (even ids are the engine's,
//! odd ids the embedded machine's).
//!
//! Only machines that do not fit stay bespoke: RedLock fans one request out
//! to every node, and the reentrant lock counts its holds and renews in the
//! background; their essays say so.
//!
//! The scaffolding below the engine (output queues, the [`Timer`] table,
//! the acquire [`Backoff`]) is shared by the bespoke machines too.

use crate::catalogue::Machine;
use crate::config::{Config, ConfigError};
use crate::keyspace::{Command, Reply};
use crate::protocol::{
    Acquire, Event, Extension, Fence, Lease, NodeId, Outcome, Protocol, ProtocolError, Request,
    RequestId, Token, UsageError,
};
use crate::rng::SplitMix64;
use crate::time::Millis;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

// ---------------------------------------------------------------------------
// Scaffolding: output queues, timers, backoff.
// ---------------------------------------------------------------------------

/// The output queues and request numbering every machine shares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Outbox {
    next_request: u64,
    transmits: VecDeque<Request>,
    events: VecDeque<Event>,
}

impl Outbox {
    /// Queue `command` for `node`; returns the id its reply will carry.
    pub(crate) fn send(&mut self, node: NodeId, command: Command) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.transmits.push_back(Request { id, node, command });
        id
    }

    /// Queue an event.
    pub(crate) fn emit(&mut self, event: Event) {
        self.events.push_back(event);
    }

    /// Dequeue the next request.
    pub(crate) fn poll_transmit(&mut self) -> Option<Request> {
        self.transmits.pop_front()
    }

    /// Dequeue the next event.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

/// Jittered exponential backoff between acquire attempts. The jitter comes
/// from a [`SplitMix64`] generator seeded by the caller, so runs are
/// repeatable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Backoff {
    base_ms: u64,
    max_ms: u64,
    jitter_percent: u8,
    attempt: u32,
    rng: SplitMix64,
}

impl Backoff {
    /// A backoff from `base_ms` doubling up to `max_ms`, with `jitter_percent`
    /// of each delay drawn from a generator seeded with `seed`.
    pub(crate) fn new(base_ms: u64, max_ms: u64, jitter_percent: u8, seed: u64) -> Backoff {
        Backoff {
            base_ms,
            max_ms: max_ms.max(base_ms),
            jitter_percent: jitter_percent.min(100),
            attempt: 0,
            rng: SplitMix64(seed),
        }
    }

    /// Start a new acquisition: the next delay is `base_ms` again.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> u64 {
        let exp = self
            .base_ms
            .saturating_mul(1u64 << self.attempt.min(32))
            .min(self.max_ms);
        self.attempt = self.attempt.saturating_add(1);
        let spread = exp * u64::from(self.jitter_percent) / 100;
        if spread == 0 {
            return exp.max(1);
        }
        (exp - spread + self.rng.next_u64() % (spread + 1)).max(1)
    }
}

/// The deadlines a machine can arm, as indices into its [`TimerTable`].
/// When several are due at once they fire in this order (RedLock puts
/// [`Timer::Reply`] first, see there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Timer {
    /// The next acquire attempt.
    Retry,
    /// A cache waiter's next read (`stampede`).
    Reread,
    /// A cache loader's lock runs out (`stampede`).
    LoadDeadline,
    /// The lease's validity ends.
    Expiry,
    /// Automatic renewal is due.
    Renew,
    /// The request in flight has had no reply for too long.
    Reply,
    /// The reentrant lock's background renewal has had no reply for too long.
    RenewReply,
}

impl Timer {
    const ALL: [Timer; 7] = [
        Timer::Retry,
        Timer::Reread,
        Timer::LoadDeadline,
        Timer::Expiry,
        Timer::Renew,
        Timer::Reply,
        Timer::RenewReply,
    ];
}

/// One deadline per [`Timer`]; [`TimerTable::next`] is the earliest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct TimerTable {
    at: [Option<Millis>; Timer::ALL.len()],
}

impl TimerTable {
    /// Arm `timer` at `at`.
    pub(crate) fn set(&mut self, timer: Timer, at: Millis) {
        self.at[timer as usize] = Some(at);
    }

    /// Disarm `timer`.
    pub(crate) fn clear(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    /// Disarm every timer.
    pub(crate) fn clear_all(&mut self) {
        self.at = Default::default();
    }

    /// When `timer` fires, if armed.
    pub(crate) fn get(&self, timer: Timer) -> Option<Millis> {
        self.at[timer as usize]
    }

    /// The earliest armed deadline.
    pub(crate) fn next(&self) -> Option<Millis> {
        self.at.iter().flatten().min().copied()
    }

    /// Disarm and return every timer due at `now`, in [`Timer`] order.
    pub(crate) fn expire(&mut self, now: Millis) -> Vec<Timer> {
        Timer::ALL
            .into_iter()
            .filter(|t| {
                let at = &mut self.at[*t as usize];
                let due = at.is_some_and(|at| at <= now);
                if due {
                    *at = None;
                }
                due
            })
            .collect()
    }
}

/// When to try again after a failed attempt, or `None` to give up: the next
/// jittered delay of `backoff`, as long as it still lands by the deadline of
/// [`Acquire::Until`]. [`Acquire::Once`] never retries.
pub(crate) fn retry_at(backoff: &mut Backoff, now: Millis, how: Acquire) -> Option<Millis> {
    match how {
        Acquire::Once => None,
        Acquire::Until(deadline) => {
            let at = now + backoff.next_delay();
            (at <= deadline).then_some(at)
        }
    }
}

/// What every machine keeps beside its protocol state: the output queues,
/// the timer table, the acquire backoff and the reply timeout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Scaffold {
    /// Requests and events waiting to be polled.
    pub(crate) out: Outbox,
    /// The machine's deadlines.
    pub(crate) timers: TimerTable,
    /// Delays between acquire attempts.
    pub(crate) backoff: Backoff,
    reply_timeout_ms: Option<u64>,
}

impl Scaffold {
    /// Empty queues, no timer armed; replies time out after
    /// `reply_timeout_ms` when given.
    pub(crate) fn new(backoff: Backoff, reply_timeout_ms: Option<u64>) -> Scaffold {
        Scaffold {
            out: Outbox::default(),
            timers: TimerTable::default(),
            backoff,
            reply_timeout_ms,
        }
    }

    /// Queue `command` for `node` and, when replies time out, arm
    /// `reply_timer` for it.
    pub(crate) fn send(
        &mut self,
        now: Millis,
        node: NodeId,
        reply_timer: Timer,
        command: Command,
    ) -> RequestId {
        if let Some(t) = self.reply_timeout_ms {
            self.timers.set(reply_timer, now + t);
        }
        self.out.send(node, command)
    }

    /// After a failed attempt: disarm every timer, then either arm
    /// [`Timer::Retry`] for the next attempt (`true`: the machine backs off)
    /// or, when `how` allows no further attempt, report [`Event::Denied`]
    /// (`false`: the machine is idle).
    pub(crate) fn retry_or_deny(&mut self, now: Millis, how: Acquire) -> bool {
        self.timers.clear_all();
        match retry_at(&mut self.backoff, now, how) {
            Some(at) => {
                self.timers.set(Timer::Retry, at);
                true
            }
            None => {
                self.out.emit(Event::Denied);
                false
            }
        }
    }

    /// Disarm and return every timer due at `now`.
    pub(crate) fn due(&mut self, now: Millis) -> Vec<Timer> {
        self.timers.expire(now)
    }

    /// The next queued request.
    pub(crate) fn poll_transmit(&mut self) -> Option<Request> {
        self.out.poll_transmit()
    }

    /// The next queued event.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.out.poll_event()
    }

    /// The earliest armed deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Millis> {
        self.timers.next()
    }
}

/// Where a machine stands, for the usage checks its mutators make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Nothing held, nothing in flight.
    Idle,
    /// Held, nothing in flight.
    Held,
    /// An operation is in flight.
    Busy,
}

impl Standing {
    /// `acquire` starts only from idle.
    pub(crate) fn may_acquire(self) -> Result<(), UsageError> {
        match self {
            Standing::Idle => Ok(()),
            Standing::Held => Err(UsageError::AlreadyHeld),
            Standing::Busy => Err(UsageError::Busy),
        }
    }

    /// `release` and `extend` start only from a hold.
    pub(crate) fn may_use_hold(self) -> Result<(), UsageError> {
        match self {
            Standing::Held => Ok(()),
            Standing::Idle => Err(UsageError::NotHeld),
            Standing::Busy => Err(UsageError::Busy),
        }
    }
}

// ---------------------------------------------------------------------------
// Requests of an embedded machine.
// ---------------------------------------------------------------------------

/// Request ids of a machine's own requests are even, those of a machine it
/// embeds (the engine's guard lock, a stampede guard's per-key lock) odd, so
/// that both can number from zero without colliding. The outer machine
/// routes every input and output through the four functions below and
/// never sees an outer id itself.
fn own_id(id: RequestId) -> RequestId {
    RequestId(id.0.wrapping_mul(2))
}

/// The outer id of a request of an embedded machine.
fn inner_id(id: RequestId) -> RequestId {
    RequestId(id.0.wrapping_mul(2).wrapping_add(1))
}

/// Split an outer id: `(is the embedded machine's, its own id)`.
fn split_id(id: RequestId) -> (bool, RequestId) {
    (id.0 % 2 == 1, RequestId(id.0 / 2))
}

/// A reply for outer id `id`: handed to the embedded machine when it is
/// one of its requests (`None` back: pump its events), else returned with
/// the outer machine's own id.
pub(crate) fn route_reply(
    embedded: &mut Option<Box<Machine>>,
    now: Millis,
    id: RequestId,
    outcome: Outcome,
) -> Option<(RequestId, Outcome)> {
    let (is_embedded, inner) = split_id(id);
    if !is_embedded {
        return Some((inner, outcome));
    }
    if let Some(machine) = embedded.as_mut() {
        machine.handle_reply(now, inner, outcome);
    }
    None
}

/// Hand the embedded machine its timeout if it is due; `true` when it ran
/// (pump its events).
pub(crate) fn embedded_timeout(embedded: &mut Option<Box<Machine>>, now: Millis) -> bool {
    match embedded.as_mut() {
        Some(machine) if machine.poll_timeout().is_some_and(|t| t <= now) => {
            machine.handle_timeout(now);
            true
        }
        _ => false,
    }
}

/// The next request to send, the embedded machine's first, with its outer
/// id.
pub(crate) fn poll_both(embedded: &mut Option<Box<Machine>>, own: &mut Outbox) -> Option<Request> {
    if let Some(mut request) = embedded.as_mut().and_then(|m| m.poll_transmit()) {
        request.id = inner_id(request.id);
        return Some(request);
    }
    let mut request = own.poll_transmit()?;
    request.id = own_id(request.id);
    Some(request)
}

/// The earlier of the outer machine's deadline `own` and the embedded
/// machine's.
pub(crate) fn earliest(embedded: &Option<Box<Machine>>, own: Option<Millis>) -> Option<Millis> {
    let inner = embedded.as_ref().and_then(|m| m.poll_timeout());
    match (own, inner) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The reply of `outcome`, or why there is none: an error reply (also one
/// inside a transaction's reply) or no reply at all (`None`).
pub(crate) fn reply_of(outcome: Outcome) -> Result<Reply, Option<ProtocolError>> {
    let reply = match outcome {
        Outcome::Reply(reply) => reply,
        Outcome::Unknown => return Err(None),
    };
    let error = match &reply {
        Reply::Error(e) => Some(e.clone()),
        Reply::Array(items) => items.iter().find_map(|r| match r {
            Reply::Error(e) => Some(e.clone()),
            _ => None,
        }),
        _ => None,
    };
    match error {
        Some(e) => Err(Some(ProtocolError::Redis(e))),
        None => Ok(reply),
    }
}

// ---------------------------------------------------------------------------
// The watched release step, shared by every `WATCH` protocol.
// ---------------------------------------------------------------------------

/// Where the book's `release_lock` sequence is: `WATCH`, `GET`, then either
/// `MULTI act EXEC` (our value) or `UNWATCH` (not ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WatchStep {
    /// `WATCH key` is in flight.
    Watch,
    /// `GET key` is in flight.
    Get,
    /// `MULTI act EXEC` is in flight.
    Exec,
    /// `UNWATCH` after a foreign (or missing) value is in flight.
    Unwatch,
}

impl WatchStep {
    fn name(self) -> &'static str {
        match self {
            WatchStep::Watch => "WATCH",
            WatchStep::Get => "GET",
            WatchStep::Exec => "EXEC",
            WatchStep::Unwatch => "UNWATCH",
        }
    }
}

/// The first request of a watched sequence on `key`, at the recipe step
/// `wrap` makes of it.
pub(crate) fn watch_begin<S>(key: &str, wrap: fn(WatchStep) -> S) -> (Command, S) {
    (
        Command::Watch {
            keys: vec![key.to_owned()],
        },
        wrap(WatchStep::Watch),
    )
}

/// Advance a watched sequence on `key` that runs `act` when the key holds
/// `ours`; `wrap` makes recipe steps of its steps. An aborted `EXEC` starts
/// the sequence again, as the book's `while True` loop does on
/// `WatchError`. Every reply is checked: an `UNWATCH` that does not answer
/// OK and an error inside the `EXEC` reply fail the sequence.
pub(crate) fn watch_step<S>(
    key: &str,
    ours: &str,
    act: Command,
    step: WatchStep,
    reply: Reply,
    wrap: fn(WatchStep) -> S,
) -> Next<S> {
    match (step, reply) {
        (_, Reply::Error(e)) => Next::Failed(ProtocolError::Redis(e)),
        (WatchStep::Watch, r) if r.is_ok() => Next::Send(
            Command::Get {
                key: key.to_owned(),
            },
            wrap(WatchStep::Get),
        ),
        (WatchStep::Get, Reply::Bulk(v)) if v == ours => {
            Next::Send(Command::Transaction(vec![act]), wrap(WatchStep::Exec))
        }
        (WatchStep::Get, Reply::Bulk(_) | Reply::Nil) => {
            Next::Send(Command::Unwatch, wrap(WatchStep::Unwatch))
        }
        (WatchStep::Unwatch, r) if r.is_ok() => Next::Done { ours: false },
        (WatchStep::Exec, Reply::Nil) => {
            let (command, step) = watch_begin(key, wrap);
            Next::Send(command, step)
        }
        (WatchStep::Exec, Reply::Array(items)) => match items.as_slice() {
            [Reply::Int(n)] => Next::Done { ours: *n == 1 },
            [Reply::Error(e)] => Next::Failed(ProtocolError::Redis(e.clone())),
            _ => unexpected("EXEC", Reply::Array(items)),
        },
        (step, reply) => unexpected(step.name(), reply),
    }
}

// ---------------------------------------------------------------------------
// The engine.
// ---------------------------------------------------------------------------

/// An operation of the application, as the machines' steps name it: which
/// operation a recipe step belongs to, what a RedLock round asks every
/// master to do (`SET NX PX`, the compare-and-delete script, the
/// compare-and-`PEXPIRE` script).
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
    /// Acquire: the lock or permit is ours.
    Granted(Option<Fence>),
    /// Acquire: not granted and nothing of ours was written: retry.
    NotGranted,
    /// Acquire: not granted, and our entry must be taken out again: retry.
    Undo,
    /// Acquire: the grant is confirmed (after [`Recipe::confirm`]'s step).
    Confirmed(Option<Fence>),
    /// Acquire: give up with this error; nothing of ours was written.
    Abort(ProtocolError),
    /// Release or extend: did it find (and act on) our own entry?
    Done {
        /// Our entry was there.
        ours: bool,
    },
    /// Extend: the refresh found us timed out and wrote us back; take the
    /// entry out again and report the permit lost.
    LostUndo,
    /// The sequence failed with this error (an acquire first takes out
    /// what it may have written).
    Failed(ProtocolError),
}

/// The protocol-specific part of a single-node lock or semaphore: its
/// commands and what their replies mean. Error replies (also inside a
/// transaction's reply) and lost replies never reach [`Recipe::advance`]:
/// the engine decides what they mean, asking [`Recipe::doubt`] on an
/// acquire. The provided items say where a recipe departs from the usual
/// course; each lock that needs one says why.
pub(crate) trait Recipe: Clone + Debug + PartialEq + Eq + Hash {
    /// Where a request sequence is.
    type Step: Clone + Debug + PartialEq + Eq + Hash;
    /// The first command of `op`.
    fn start(&self, op: Op, now: Millis) -> (Command, Self::Step);
    /// From now on, write and compare `token` (see [`Engine`]'s new token
    /// after an unanswered release).
    fn retoken(&mut self, token: &Token);
    /// The next move after `reply` to `step` of `op`.
    fn advance(&self, op: Op, step: Self::Step, reply: Reply, now: Millis) -> Next<Self::Step>;
    /// The next move when an acquire step's reply is an error (`Some`) or
    /// never came (`None`). By default something of ours may have been
    /// written: take it out again, then retry or fail.
    fn doubt(&self, step: &Self::Step, error: Option<ProtocolError>) -> Next<Self::Step> {
        let _ = step;
        match error {
            None => Next::Undo,
            Some(e) => Next::Failed(e),
        }
    }
    /// Does a release in flight keep the lease it releases in the machine's
    /// state? The engine never reads it; the lock machines kept it before
    /// they ran on the engine, and keeping it keeps their model-checked
    /// state spaces (which tell states apart by it) exactly as they were.
    const KEEPS_RELEASED_LEASE: bool = false;
    /// Does a hold keep since when it counts (its acquire's send time, or
    /// the instant an extend did not go through)? Never read either; kept
    /// for the same reason by the `SET NX PX` locks.
    const KEEPS_HOLD_START: bool = false;
    /// Does the lease being taken at `step` count from the send time of the
    /// sequence's first request? Where it does not (no TTL, or a step that
    /// can no longer grant) the machine keeps no send time.
    fn timed(&self, step: &Self::Step) -> bool {
        let _ = step;
        true
    }
    /// Is a grant that comes back too late to be of use taken out again and
    /// retried? A recipe that says no holds it, and the expiry timer reports
    /// it lost at once.
    const UNDOES_LATE_GRANTS: bool = true;
    /// Does the recipe judge, by the client clock alone, that `lease` is no
    /// longer ours at `now`? Then a release reports
    /// `Released { was_held: false }` and an extend `Lost`, without a
    /// request. By default it never does.
    fn gone(&self, op: Op, lease: &Lease, now: Millis) -> bool {
        let _ = (op, lease, now);
        false
    }
    /// The first command of an extend of `lease`. By default
    /// [`Recipe::start`]'s.
    fn start_extend(&self, lease: &Lease, now: Millis) -> (Command, Self::Step) {
        let _ = lease;
        self.start(Op::Extend, now)
    }
    /// Is there anything to extend? A recipe without TTL says no: an extend
    /// reports [`Event::Extended`] with the same lease at once.
    const EXTENDS: bool = true;
    /// A step to run once an acquire is granted with `lease` and before it
    /// is reported (`WAIT` for replicas); its reply must come to
    /// [`Next::Confirmed`]. By default none.
    fn confirm(&self, lease: &Lease, now: Millis) -> Option<(Command, Self::Step)> {
        let _ = (lease, now);
        None
    }
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
        /// Since when the hold counts, when the recipe keeps it
        /// ([`Recipe::KEEPS_HOLD_START`]).
        since: Option<Millis>,
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
        /// The lease released, when the recipe keeps it
        /// ([`Recipe::KEEPS_RELEASED_LEASE`]).
        lease: Option<Lease>,
    },
}

/// How long `fair-semaphore-locked` tries for its guard on a try-once
/// acquire: the book's `acquire_timeout=.01`.
pub(crate) const GUARD_WAIT_MS: u64 = 10;

/// The shared single-node machine around a [`Recipe`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Engine<R: Recipe> {
    /// Shared by the machine's clones until one of them takes a new
    /// token, so that a clone (the model checker makes one per step)
    /// copies none of its keys and scripts.
    recipe: Arc<R>,
    /// The owner token of the next acquire and of the hold it gets: the
    /// given one, or `given.n` after `n` unanswered releases.
    token: Token,
    /// The owner token the machine was built with.
    given: Token,
    /// Releases (or undos) without a reply so far.
    renamed: u32,
    /// A deliberate bug for the tests: never take a new token.
    pub(crate) one_token: bool,
    /// `None`: permits never expire (`watch-semaphore`).
    ttl_ms: Option<u64>,
    drift_ms: u64,
    auto_renew: bool,
    base: Scaffold,
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
    /// [`EngineConfig::from`] once `valid` (the config's check for the
    /// protocol) passed and `token` is not empty.
    pub(crate) fn checked(
        valid: Result<(), ConfigError>,
        config: &Config,
        token: Token,
    ) -> Result<EngineConfig, ConfigError> {
        valid?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        Ok(EngineConfig::from(config, token))
    }

    /// The usual parameters from a validated config: TTL, drift, reply
    /// timeout and backoff; no renewal, no guard.
    pub(crate) fn from(config: &Config, token: Token) -> EngineConfig {
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
    /// An idle machine running `recipe`.
    pub(crate) fn new(recipe: R, c: EngineConfig) -> Engine<R> {
        Engine {
            recipe: Arc::new(recipe),
            given: c.token.clone(),
            renamed: 0,
            one_token: false,
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
        self.base.send(now, NodeId(0), Timer::Reply, command)
    }

    /// The send time an acquire or extend at `step` keeps: `sent_at`, or
    /// nothing (zero) at a step whose lease does not count from it.
    fn stamp(&self, step: &R::Step, sent_at: Millis) -> Millis {
        if self.recipe.timed(step) {
            sent_at
        } else {
            Millis(0)
        }
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

    fn standing(&self) -> Standing {
        match self.state {
            State::Idle => Standing::Idle,
            State::Held { .. } => Standing::Held,
            _ => Standing::Busy,
        }
    }

    fn go_idle(&mut self) {
        self.base.timers.clear_all();
        self.state = State::Idle;
    }

    fn hold(&mut self, lease: Lease, renew_from: Millis) {
        self.base.timers.clear_all();
        if let Some(ttl) = self.ttl_ms {
            self.base.timers.set(Timer::Expiry, lease.valid_until);
            if self.auto_renew {
                self.base
                    .timers
                    .set(Timer::Renew, renew_from + (ttl / 3).max(1));
            }
        }
        let since = R::KEEPS_HOLD_START.then_some(renew_from);
        self.state = State::Held { lease, since };
    }

    /// Stay held on the old lease after an extend that did not go through,
    /// and report `event`; when the lease has run out by then, report
    /// `Lost` alone, which concludes the extend (the contract: one event
    /// per operation, see `Event::Lost`). With `auto_renew`, renewal tries
    /// again ([`renewal_retry_at`]; the extend cleared its timer): an
    /// unanswered or refused renewal, or the application's extend, must
    /// not end the renewals of a hold that stands.
    fn hold_on(&mut self, now: Millis, lease: Lease, event: Event) {
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return;
        }
        self.base.timers.clear(Timer::Reply);
        if let Some(ttl) = self.ttl_ms {
            self.base.timers.set(Timer::Expiry, lease.valid_until);
            if self.auto_renew {
                let at = renewal_retry_at(now, lease.valid_until, ttl);
                self.base.timers.set(Timer::Renew, at);
            }
        }
        let since = R::KEEPS_HOLD_START.then_some(now);
        self.state = State::Held { lease, since };
        self.base.out.emit(event);
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
            sent_at: self.stamp(&step, now),
            step,
            how,
        };
    }

    /// Take a partial acquire (that would have granted `lease`) out again,
    /// then conclude with `after`.
    fn undo(&mut self, now: Millis, lease: Lease, after: After) {
        self.start_release(now, lease, Then::Attempt(after));
    }

    fn start_release(&mut self, now: Millis, lease: Lease, then: Then) {
        self.base.timers.clear_all();
        let (command, step) = self.recipe.start(Op::Release, now);
        let req = self.send(now, command);
        let lease = R::KEEPS_RELEASED_LEASE.then_some(lease);
        self.state = State::Releasing {
            req,
            step,
            then,
            lease,
        };
    }

    fn start_extend(&mut self, now: Millis, lease: Lease, automatic: bool) {
        self.base.timers.clear(Timer::Renew);
        let (command, step) = self.recipe.start_extend(&lease, now);
        let req = self.send(now, command);
        self.state = State::Extending {
            req,
            sent_at: self.stamp(&step, now),
            step,
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
        self.state = if self.base.retry_or_deny(now, how) {
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
        self.base.timers.clear(Timer::Reply);
        let state = std::mem::replace(&mut self.state, State::Idle);
        let reply = reply_of(outcome);
        match state {
            State::Acquiring {
                step, sent_at, how, ..
            } => {
                // What an undo takes out: the lease this attempt would grant.
                let partial = self.lease_from(sent_at, None);
                let was_timed = self.recipe.timed(&step);
                let next = match reply {
                    Ok(reply) => self.recipe.advance(Op::Acquire, step, reply, now),
                    Err(error) => self.recipe.doubt(&step, error),
                };
                match next {
                    Next::Send(command, step) => {
                        let req = self.send(now, command);
                        // A lease counts from the first timed request of a
                        // run of them.
                        let from = if was_timed { sent_at } else { now };
                        self.state = State::Acquiring {
                            req,
                            sent_at: self.stamp(&step, from),
                            step,
                            how,
                        };
                    }
                    Next::Granted(fence) => self.granted(now, sent_at, how, fence, true),
                    Next::Confirmed(fence) => self.granted(now, sent_at, how, fence, false),
                    Next::NotGranted => self.conclude(now, After::Retry(how)),
                    Next::Undo => self.undo(now, partial, After::Retry(how)),
                    Next::Failed(e) => self.undo(now, partial, After::Failed(e)),
                    Next::Abort(e) => self.conclude(now, After::Failed(e)),
                    Next::Done { .. } | Next::LostUndo => self.undo(
                        now,
                        partial,
                        After::Failed(ProtocolError::Missing("a recipe step".into())),
                    ),
                }
            }
            State::Releasing {
                step, then, lease, ..
            } => {
                let failure = match reply {
                    Ok(reply) => match self.recipe.advance(Op::Release, step, reply, now) {
                        Next::Send(command, step) => {
                            let req = self.send(now, command);
                            self.state = State::Releasing {
                                req,
                                step,
                                then,
                                lease,
                            };
                            return;
                        }
                        Next::Done { ours } => return self.finish_release(now, ours, then),
                        Next::Failed(e) => e,
                        _ => ProtocolError::Missing("a recipe step".into()),
                    },
                    // Whether the release ran is unknown; any TTL bounds the
                    // hold. It may still run later: no later hold of this
                    // machine may carry its token.
                    Err(None) => {
                        self.rename();
                        return self.finish_release(now, false, then);
                    }
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
                let by = if automatic {
                    Extension::Renewal
                } else {
                    Extension::Extend
                };
                let failed = |e| match by {
                    Extension::Extend => Event::Failed(e),
                    Extension::Renewal => Event::RenewalFailed(e),
                };
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(None) => return self.hold_on(now, lease, Event::NotExtended { by }),
                    Err(Some(e)) => return self.hold_on(now, lease, failed(e)),
                };
                match self.recipe.advance(Op::Extend, step, reply, now) {
                    Next::Send(command, step) => {
                        let req = self.send(now, command);
                        self.state = State::Extending {
                            req,
                            sent_at: self.stamp(&step, sent_at),
                            step,
                            lease,
                            automatic,
                        };
                    }
                    Next::Done { ours: true } => {
                        let lease = self.lease_from(sent_at, lease.fence);
                        self.hold(lease.clone(), sent_at);
                        self.base.out.emit(Event::Extended { lease, by });
                    }
                    Next::Done { ours: false } => {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    }
                    Next::LostUndo => self.start_release(now, lease, Then::Lost),
                    Next::Failed(e) => self.hold_on(now, lease, failed(e)),
                    _ => self.hold_on(
                        now,
                        lease,
                        failed(ProtocolError::Missing("a recipe step".into())),
                    ),
                }
            }
            other => self.state = other,
        }
    }

    /// An acquire sent at `sent_at` is granted: hold it, unless it came too
    /// late to be of use or (with `confirm`) the recipe confirms it first.
    fn granted(
        &mut self,
        now: Millis,
        sent_at: Millis,
        how: Acquire,
        fence: Option<Fence>,
        confirm: bool,
    ) {
        let lease = self.lease_from(sent_at, fence);
        if R::UNDOES_LATE_GRANTS && now >= lease.valid_until {
            // Too late to be of use: give it back, try again.
            return self.undo(now, lease, After::Retry(how));
        }
        if let Some((command, step)) = confirm.then(|| self.recipe.confirm(&lease, now)).flatten() {
            let req = self.send(now, command);
            self.state = State::Acquiring {
                req,
                step,
                sent_at,
                how,
            };
            return;
        }
        self.conclude(
            now,
            After::Granted {
                lease,
                renew_from: sent_at,
            },
        );
    }

    /// A release (or undo) got no reply: it may still run, held up on the
    /// network or on a connection the driver retired, and delete whatever
    /// holds its token. Had the next attempt reused that token, the late
    /// release could take the hold it is granted (the checker finds it for
    /// `watch-semaphore` under `delay` with three clients), so later
    /// attempts run under `given.n`.
    fn rename(&mut self) {
        if self.one_token {
            return;
        }
        self.renamed = self.renamed.saturating_add(1);
        self.token = Token::new(format!("{}.{}", self.given.0, self.renamed));
        Arc::make_mut(&mut self.recipe).retoken(&self.token);
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
}

impl<R: Recipe> Protocol for Engine<R> {
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        self.standing().may_acquire()?;
        self.base.backoff.reset();
        self.attempt(now, how);
        Ok(())
    }

    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        // An automatic renewal in flight does not block a release; its reply
        // is ignored from now on.
        let lease = match &self.state {
            State::Held { lease, .. }
            | State::Extending {
                lease,
                automatic: true,
                ..
            } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        if self.recipe.gone(Op::Release, &lease, now) {
            self.go_idle();
            self.base.out.emit(Event::Released { was_held: false });
            return Ok(());
        }
        self.start_release(now, lease, Then::Report);
        Ok(())
    }

    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &mut self.state {
            State::Held { lease, .. } => lease.clone(),
            // Join the automatic renewal in flight: its reply concludes
            // this extend.
            State::Extending { automatic, .. } if *automatic => {
                *automatic = false;
                return Ok(());
            }
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        if !R::EXTENDS {
            self.base.out.emit(Event::Extended {
                lease,
                by: Extension::Extend,
            });
            return Ok(());
        }
        if self.recipe.gone(Op::Extend, &lease, now) {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return Ok(());
        }
        self.start_extend(now, lease, false);
        Ok(())
    }

    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        match route_reply(&mut self.guard, now, id, outcome) {
            Some((own, outcome)) => self.handle_own_reply(now, own, outcome),
            None => self.pump_guard(now),
        }
    }

    fn handle_timeout(&mut self, now: Millis) {
        if embedded_timeout(&mut self.guard, now) {
            self.pump_guard(now);
        }
        let due = self.base.due(now);
        for timer in due {
            match (timer, &self.state) {
                (Timer::Reply, _) => {
                    if let Some(req) = self.current_request() {
                        self.handle_own_reply(now, req, Outcome::Unknown);
                    }
                }
                (Timer::Retry, State::BackingOff { how }) => {
                    let how = *how;
                    self.attempt(now, how);
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

    fn poll_transmit(&mut self) -> Option<Request> {
        poll_both(&mut self.guard, &mut self.base.out)
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.base.out.poll_event()
    }

    fn poll_timeout(&self) -> Option<Millis> {
        earliest(&self.guard, self.base.timers.next())
    }

    fn lease(&self) -> Option<&Lease> {
        match &self.state {
            State::Held { lease, .. } | State::Extending { lease, .. } => Some(lease),
            _ => None,
        }
    }

    fn is_busy(&self) -> bool {
        self.standing() == Standing::Busy
    }
}

/// A catalogue machine that is an [`Engine`] around its recipe: it is driven
/// as that engine is.
pub(crate) trait OnEngine: Clone + Debug + Eq + Hash {
    /// The recipe the engine runs.
    type Recipe: Recipe;
    /// The engine.
    fn engine(&self) -> &Engine<Self::Recipe>;
    /// The engine, to drive it.
    fn engine_mut(&mut self) -> &mut Engine<Self::Recipe>;
}

impl<M: OnEngine> Protocol for M {
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        self.engine_mut().acquire(now, how)
    }
    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        self.engine_mut().release(now)
    }
    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        self.engine_mut().extend(now)
    }
    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        self.engine_mut().handle_reply(now, id, outcome)
    }
    fn handle_timeout(&mut self, now: Millis) {
        self.engine_mut().handle_timeout(now)
    }
    fn poll_transmit(&mut self) -> Option<Request> {
        self.engine_mut().poll_transmit()
    }
    fn poll_event(&mut self) -> Option<Event> {
        self.engine_mut().poll_event()
    }
    fn poll_timeout(&self) -> Option<Millis> {
        self.engine().poll_timeout()
    }
    fn lease(&self) -> Option<&Lease> {
        self.engine().lease()
    }
    fn is_busy(&self) -> bool {
        self.engine().is_busy()
    }
}

/// Declares a catalogue machine that is an [`Engine`] around a recipe: the
/// public newtype and the [`OnEngine`] impl through which it is driven.
macro_rules! engine_machine {
    ($(#[$attr:meta])* $name:ident($recipe:ty)) => {
        $(#[$attr])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct $name($crate::engine::Engine<$recipe>);

        impl $crate::engine::OnEngine for $name {
            type Recipe = $recipe;
            fn engine(&self) -> &$crate::engine::Engine<$recipe> {
                &self.0
            }
            fn engine_mut(&mut self) -> &mut $crate::engine::Engine<$recipe> {
                &mut self.0
            }
        }
    };
}
pub(crate) use engine_machine;

/// The "unexpected reply" failure of a recipe step.
pub(crate) fn unexpected<S>(request: &'static str, reply: Reply) -> Next<S> {
    Next::Failed(ProtocolError::UnexpectedReply { request, reply })
}

/// When renewal tries again after a renewal or an extend, failed at `now`,
/// of a lease valid until `valid_until`: a third of a TTL later, as after a
/// renewal that went through, but no later than halfway to the lease's end,
/// so that a failure late in the lease (a reply timeout near a third of the
/// TTL, or a second failure in a row) still leaves a try before the lease
/// runs out; and no sooner than a twelfth of a TTL, so that failures that
/// come at once (a connection refused) make a few tries per lease, not one
/// per millisecond (at most four after a failure at a third of the TTL:
/// at about 2/3, 5/6 and 11/12 of it, and one the expiry overtakes).
pub(crate) fn renewal_retry_at(now: Millis, valid_until: Millis, ttl_ms: u64) -> Millis {
    let left = valid_until.0.saturating_sub(now.0);
    now + (ttl_ms / 3).min(left / 2).max(ttl_ms / 12).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_without_jitter() {
        let mut b = Backoff::new(10, 50, 0, 1);
        let delays: Vec<u64> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(delays, [10, 20, 40, 50, 50]);
        b.reset();
        assert_eq!(b.next_delay(), 10);
    }

    #[test]
    fn backoff_jitter_stays_in_range_and_is_repeatable() {
        let mut a = Backoff::new(100, 100, 50, 7);
        let mut b = Backoff::new(100, 100, 50, 7);
        for _ in 0..100 {
            let d = a.next_delay();
            assert!((50..=100).contains(&d), "{d}");
            assert_eq!(d, b.next_delay());
        }
    }

    #[test]
    fn timers_fire_once_and_the_deadline_moves_on() {
        let mut t = TimerTable::default();
        t.set(Timer::Retry, Millis(10));
        t.set(Timer::Expiry, Millis(20));
        assert_eq!(t.next(), Some(Millis(10)));
        assert_eq!(t.expire(Millis(10)), [Timer::Retry]);
        assert_eq!(
            t.next(),
            Some(Millis(20)),
            "a fired deadline must not stay armed"
        );
        assert_eq!(t.get(Timer::Retry), None);
        assert!(t.expire(Millis(15)).is_empty());
    }

    #[test]
    fn timers_due_together_fire_in_declaration_order() {
        let mut t = TimerTable::default();
        t.set(Timer::Reply, Millis(5));
        t.set(Timer::Retry, Millis(5));
        t.set(Timer::Expiry, Millis(4));
        assert_eq!(
            t.expire(Millis(5)),
            [Timer::Retry, Timer::Expiry, Timer::Reply]
        );
        assert_eq!(t.next(), None);
    }

    #[test]
    fn usage_checks_follow_the_standing() {
        use Standing::{Busy, Held, Idle};
        assert_eq!(Idle.may_acquire(), Ok(()));
        assert_eq!(Held.may_acquire(), Err(UsageError::AlreadyHeld));
        assert_eq!(Busy.may_acquire(), Err(UsageError::Busy));
        assert_eq!(Held.may_use_hold(), Ok(()));
        assert_eq!(Idle.may_use_hold(), Err(UsageError::NotHeld));
        assert_eq!(Busy.may_use_hold(), Err(UsageError::Busy));
    }

    #[test]
    fn embedded_request_ids_do_not_collide_and_split_back() {
        for n in [0, 1, 7, u64::MAX / 2] {
            let (own, inner) = (own_id(RequestId(n)), inner_id(RequestId(n)));
            assert_ne!(own, inner);
            assert_eq!(split_id(own), (false, RequestId(n)));
            assert_eq!(split_id(inner), (true, RequestId(n)));
        }
    }
}
