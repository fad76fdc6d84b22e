//! The driver: the loop that owns one core machine and runs it against
//! real Redis, in the style of quinn's `ConnectionDriver`.
//!
//! Each pass of its loop does what the core's contract asks, in order:
//!
//! 1. feed inputs: a reply (or [`Outcome::Unknown`]) from a node, the timer
//!    when the clock reached [`Protocol::poll_timeout`], or an operation the
//!    application asked for (acquire, release, extend);
//! 2. drain [`Protocol::poll_transmit`], handing each request to the `conn`
//!    module's per-node queues; drain [`Protocol::poll_event`], routing each
//!    event to the operation waiting for it (or to the lease cell: renewals,
//!    loss);
//! 3. re-arm its one timer at the machine's next deadline.
//!
//! Every call passes the *current* time of the process' monotonic clock
//! (see the `clock` module), never the deadline it woke up for.
//!
//! An acquire runs the loop inside the caller's future ([`Inline`]): no task
//! and no channel stand between the caller and its requests, nor between
//! the driver and the outcome, which it leaves in a slot of its own for the
//! caller to take ([`Done::Inline`]). A granted hold's driver stays with the
//! guard, run by the guard's calls in the same way, unless the machine has
//! work of its own before the lease ends. When that work is a deadline
//! (automatic renewal), the driver is parked (the `park` module): the
//! guard's calls still run it inline, and the nodes' alarm task moves it to
//! a task of its own when the deadline comes. When it has requests to see
//! to (an undo still to resend), it moves to a task at once. The task serves
//! the guard (release, extend, renewal, loss at the end of validity)
//! through a channel and answers each call on a channel of its own
//! ([`Done::Channel`]).
//! Connections are the `conn` module's: shared per node, or the hold's own
//! for the protocols that `WATCH`.
//!
//! When the application's handle goes away (a guard dropped, or an acquire
//! future dropped part-way), the driver finishes what is in flight, releases
//! any hold it got (best effort) and stops. If even that cannot happen (the
//! runtime shuts down, the process dies), the hold ends with its TTL.

use crate::clock::clock;
use crate::conn::{Failure, Finished, Io, Route};
use crate::error::{Error, Operation};
use crate::lease_cell::LeaseCell;
pub(crate) use crate::park::{Alarms, Parked, Taken};
use futures_util::future::Either;
use lockwright_core::{
    Acquire, Event, Extension, Lease, Machine, Millis, Outcome, Protocol, Request,
};
use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{Instant, Sleep};
use tracing::Instrument;

/// `future`, run inside `span` when a subscriber wants the span, and as it
/// is otherwise: `Instrumented` enters and exits even a disabled span on
/// every poll (a check per poll, and a wrapper around every future of the
/// lock's hot path) for nothing when nobody records it. A driver spawned
/// as a task keeps `instrument`: it is polled far less often.
///
/// A plain function returning either future, not an `async fn`: an
/// `async fn` keeps `future` as its argument and again as what it awaits,
/// so its own future was two to three times the size of `future`, and
/// each of the hot path's nested calls copied the whole of it.
pub(crate) fn in_span<F: std::future::Future>(
    span: tracing::Span,
    future: F,
) -> Either<F, tracing::instrument::Instrumented<F>> {
    if span.is_disabled() {
        Either::Left(future)
    } else {
        Either::Right(future.instrument(span))
    }
}

/// How long an acquire may take, in the application's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    Once,
    Within(Duration),
    Forever,
}

/// What the application got from a successful acquire.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) lease: Lease,
    pub(crate) cell: LeaseCell,
}

/// Where the outcome of an operation goes.
#[derive(Debug)]
pub(crate) enum Done<T> {
    /// To the caller that runs the driver inline ([`Inline::drive`]): the
    /// driver's answer slot, for the operation of this number. No channel
    /// is made for it; an answer for another number (an operation whose
    /// caller gave up) is refused, as a closed channel refuses it.
    Inline(u64),
    /// To a caller waiting on a driver that runs as a task.
    Channel(oneshot::Sender<T>),
}

/// An operation's outcome, as the driver's answer slot keeps it.
#[derive(Debug)]
pub(crate) enum Answer {
    Acquire(Result<Option<Granted>, Error>),
    Release(Result<bool, Error>),
    Lease(Result<Lease, Error>),
}

/// An outcome type that fits the answer slot.
pub(crate) trait Answered: Sized {
    fn into_answer(self) -> Answer;
    /// The outcome, if `answer` is one of this type.
    fn from_answer(answer: Answer) -> Option<Self>;
}

macro_rules! answered {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl Answered for $t {
            fn into_answer(self) -> Answer {
                Answer::$variant(self)
            }
            fn from_answer(answer: Answer) -> Option<Self> {
                match answer {
                    Answer::$variant(value) => Some(value),
                    _ => None,
                }
            }
        }
    )*};
}

answered! {
    Result<Option<Granted>, Error> => Acquire,
    Result<bool, Error> => Release,
    Result<Lease, Error> => Lease,
}

/// An operation the application asks the driver for.
#[derive(Debug)]
pub(crate) enum Call {
    Acquire {
        how: How,
        done: Done<Result<Option<Granted>, Error>>,
    },
    Release {
        done: Done<Result<bool, Error>>,
    },
    Extend {
        done: Done<Result<Lease, Error>>,
    },
    /// Take a held reentrant lock once more (one attempt).
    Reenter {
        done: Done<Result<Lease, Error>>,
    },
}

impl Call {
    /// The number of the inline operation this is, if it is one.
    fn inline_number(&self) -> Option<u64> {
        match self {
            Call::Acquire { done, .. } => done.inline_number(),
            Call::Release { done } => done.inline_number(),
            Call::Extend { done } | Call::Reenter { done } => done.inline_number(),
        }
    }
}

impl<T> Done<T> {
    fn inline_number(&self) -> Option<u64> {
        match self {
            Done::Inline(n) => Some(*n),
            Done::Channel(_) => None,
        }
    }
}

/// The operation whose outcome the next event decides.
#[derive(Debug)]
enum Pending {
    None,
    Acquire(Done<Result<Option<Granted>, Error>>),
    Release(Done<Result<bool, Error>>),
    Extend(Done<Result<Lease, Error>>),
    Reenter(Done<Result<Lease, Error>>),
    /// A release the driver started itself (the handle went away).
    Cleanup,
}

impl Pending {
    fn inline_number(&self) -> Option<u64> {
        match self {
            Pending::Acquire(done) => done.inline_number(),
            Pending::Release(done) => done.inline_number(),
            Pending::Extend(done) | Pending::Reenter(done) => done.inline_number(),
            Pending::None | Pending::Cleanup => None,
        }
    }
}

/// Settings of a hold's requests.
#[derive(Clone, Debug)]
pub(crate) struct NodeSettings {
    pub(crate) request_timeout: Duration,
    /// Exact keys: the rewrite of the core's key names.
    pub(crate) keys: Option<std::sync::Arc<crate::keys::KeyMap>>,
}

/// How to remove, with the owner token alone, a hold the machine does not
/// (or no longer) knows of: the command for every node, and whether to
/// repeat it while it answers `0` (a reentrant count above one). Built once
/// per lock; the command is written out only when a release by token is
/// sent (rarely: after an unanswered acquire, or a release of a hold
/// already lost).
#[derive(Clone, Debug)]
pub(crate) struct TokenRelease {
    pub(crate) script: lockwright_core::keyspace::Script,
    /// The script's keys.
    pub(crate) keys: Vec<String>,
    /// The arguments before the token.
    pub(crate) args_before: Vec<String>,
    /// Ask the script to publish a release notice.
    pub(crate) notify: bool,
    pub(crate) repeat_while_zero: bool,
    /// Also after an acquire request without a reply, whose next attempt
    /// then runs under a new owner token (see [`FreshAttempt`]): otherwise
    /// the attempt's hold, which nobody would release, blocks the lock
    /// until its TTL (under `setnx-del`, for ever). (RedLock and the ZSET
    /// and WATCH semaphores undo such attempts themselves;
    /// `lease-semaphore` and `time-fenced-semaphore` leave them to their
    /// TTL, since an undo by the token their retry reuses could remove the
    /// retry's permit.)
    pub(crate) after_unknown_attempt: bool,
}

impl TokenRelease {
    /// The command that removes `token`'s hold.
    fn command(&self, token: &lockwright_core::Token) -> lockwright_core::keyspace::Command {
        let mut args = Vec::with_capacity(self.args_before.len() + 2);
        args.extend(self.args_before.iter().cloned());
        args.push(token.0.to_string());
        lockwright_core::keyspace::Command::Eval {
            script: self.script,
            keys: self.keys.clone(),
            args: lockwright_core::keyspace::script::release_args(args, self.notify),
        }
    }
}

/// Builds the machine for the attempt after an unanswered one: the same
/// protocol and configuration under a new owner token, its base retry
/// delay doubled for each machine built before it (`n`, from 1; capped at
/// the maximum), so that attempts against a dead node still back off. The
/// doublings of the earlier machines' own denied attempts are not carried
/// over: after a denial streak and one unanswered attempt the delay starts
/// lower again (availability only).
pub(crate) type MakeMachine =
    std::sync::Arc<dyn Fn(u32) -> Result<(Machine, lockwright_core::Token), Error> + Send + Sync>;

/// A new owner token for every attempt after an unanswered one.
///
/// The unanswered attempt is undone by its token (see [`TokenRelease`]).
/// If the retry reused that token, the undo could remove the retry's hold:
/// an undo without a reply retires its connection, the retry goes out on
/// a new one and is granted, and a server that held the old connection's
/// undo back runs it afterwards; a rival then takes the lock beside its
/// holder. Under a new token the undo matches nothing of the retry's, so
/// it is left to run (it still removes a late write of the unanswered
/// attempt, if it comes after that write).
///
/// The driver swaps the machine when the old one's retry timer fires (the
/// old machine holds nothing and has no request in flight then), so the
/// retry keeps the old machine's timing.
pub(crate) struct FreshAttempt {
    make: MakeMachine,
    /// The acquire in progress, for the new machine.
    how: Option<Acquire>,
    /// An attempt went unanswered: the next one needs a new machine.
    owed: bool,
    /// New machines built for this acquire so far.
    built: u32,
}

impl FreshAttempt {
    /// Fresh machines from `make`.
    pub(crate) fn new(make: MakeMachine) -> FreshAttempt {
        FreshAttempt {
            make,
            how: None,
            owed: false,
            built: 0,
        }
    }
}

impl std::fmt::Debug for FreshAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshAttempt")
            .field("how", &self.how)
            .field("owed", &self.owed)
            .field("built", &self.built)
            .finish_non_exhaustive()
    }
}

/// A hold's [`TokenRelease`]: the lock's, and the hold's owner token.
#[derive(Debug)]
pub(crate) struct HoldRelease {
    pub(crate) how: std::sync::Arc<TokenRelease>,
    pub(crate) token: lockwright_core::Token,
}

/// Token-release requests carry ids from the top of the range, which no
/// machine reaches.
const FIRST_TOKEN_RELEASE_ID: u64 = u64::MAX / 2;

/// A token release in flight: the rounds left for its node.
#[derive(Debug)]
struct TokenReleaseRequest {
    id: u64,
    /// The release, by the token of the hold it was sent for (a later
    /// attempt may run under another token).
    command: lockwright_core::keyspace::Command,
    node: usize,
    rounds_left: usize,
    /// Resends left when it gets no reply (the undo of an unanswered
    /// attempt: a hold left behind might never expire under `setnx-del`).
    retries_left: usize,
    /// Its first sending (the acquire's answer waits for these; resends
    /// go on in the background).
    first: bool,
}

/// Resends of an undo that got no reply, before its TTL (if any) is left
/// to end the hold.
const UNDO_RETRIES: usize = 10;

/// The wait before an undo's first resend, ms; each later resend waits
/// twice as long as the one before, up to [`UNDO_RESEND_MAX_MS`]. A server
/// that refuses or drops every connection at once would otherwise see the
/// [`UNDO_RETRIES`] resends back to back; spaced out, they span about 4 s,
/// long enough to outlast a brief outage.
const UNDO_RESEND_FIRST_MS: u64 = 10;

/// The longest wait between two resends of an undo, ms.
const UNDO_RESEND_MAX_MS: u64 = 1_000;

/// The wait before the resend that leaves `retries_left` more, ms.
fn undo_resend_delay(retries_left: usize) -> u64 {
    let sent_before = UNDO_RETRIES.saturating_sub(retries_left + 1);
    let doublings = u32::try_from(sent_before).unwrap_or(u32::MAX).min(16);
    (UNDO_RESEND_FIRST_MS << doublings).min(UNDO_RESEND_MAX_MS)
}

/// An undo resend waiting for its time.
#[derive(Debug)]
struct DelayedResend {
    due: Millis,
    command: lockwright_core::keyspace::Command,
    node: usize,
    rounds_left: usize,
    retries_left: usize,
}

/// The answers to a token release the application waits for.
#[derive(Debug)]
struct TokenReleaseTally {
    done: Done<Result<bool, Error>>,
    removed: bool,
    unknown: Option<String>,
}

/// A driver for `machine` over `routes` (node `i` is `routes[i]`), not yet
/// running: [`Inline::drive`] runs it inside the caller's future, and
/// [`Inline::into_holder`] parks it or moves it to a task of its own when
/// the hold acts on its own (automatic renewal, undo resends). A driver
/// taken from `spare` keeps the routes and settings it was first made with:
/// a spare belongs to one lock, whose routes and settings never change, so
/// every call for that lock must pass the same ones.
pub(crate) fn new(
    machine: Machine,
    routes: &[Route],
    settings: &NodeSettings,
    span: tracing::Span,
    token_release: Option<HoldRelease>,
    fresh: Option<FreshAttempt>,
    spare: &std::sync::Arc<Spare>,
) -> Inline {
    if let Some(mut driver) = spare.take() {
        driver.reuse(machine, span, token_release, fresh);
        driver.spare = Some(std::sync::Arc::clone(spare));
        return Inline(Some(driver));
    }
    let lost = std::sync::Arc::new(Notify::new());
    Inline(Some(Box::new(Driver {
        machine,
        io: Io::new(routes, settings.request_timeout, settings.keys.clone()),
        ops: None,
        deferred: VecDeque::new(),
        pending: Pending::None,
        cell: None,
        lost,
        warned: None,
        unanswered: None,
        token_release,
        fresh,
        undo_owed: false,
        token_requests: Vec::new(),
        resends: Vec::new(),
        next_token_id: FIRST_TOKEN_RELEASE_ID,
        tally: None,
        released_by_token: None,
        answer: None,
        inline_op: 0,
        sleep: None,
        timers_runtime: None,
        span,
        spare: Some(std::sync::Arc::clone(spare)),
    })))
}

/// A lock's spare driver: the last of its holds' drivers to end inline with
/// nothing left to do, kept for the lock's next acquire, which then
/// allocates no driver (about 1 KB), no per-node links and no loss signal
/// of its own. One per lock at most; it keeps no connection, timer or span
/// of the hold that left it (see [`Spare::keep`]).
#[derive(Default)]
pub(crate) struct Spare(std::sync::Mutex<Option<Box<Driver>>>);

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare").finish_non_exhaustive()
    }
}

impl Spare {
    fn take(&self) -> Option<Box<Driver>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Keep `driver`, whose hold has ended, in place of any earlier spare.
    /// It is reset first ([`Driver::reset`]): what outlives a hold only by
    /// being kept goes now, the connections of the hold's own close (a
    /// `WATCH` connection is not kept open), the timers go (they belong to
    /// the runtime they were made in) and the span closes (a subscriber
    /// sees the hold end when it ends). A kept driver does not point back
    /// at its spare (`driver.spare` is `None` here), which would keep both
    /// alive after the lock is gone.
    fn keep(&self, mut driver: Box<Driver>) {
        driver.reset();
        let earlier = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(driver);
        drop(earlier);
    }
}

/// A driver run by the future that owns it. Dropped with work left (a
/// request in flight, a hold), it moves to a task that finishes the work:
/// it gives back any hold and stops.
pub(crate) struct Inline(Option<Box<Driver>>);

impl Inline {
    /// No driver (every call answers [`Error::DriverGone`]).
    pub(crate) fn none() -> Inline {
        Inline(None)
    }

    /// Hand `op` to the machine.
    pub(crate) fn apply(&mut self, op: Call) {
        if let Some(driver) = &mut self.0 {
            driver.apply(op);
        }
    }

    /// Where the outcome of the next operation handed to this driver
    /// goes: the answer slot, under a new operation number. Whatever an
    /// earlier operation left there, or still owes, is no longer taken.
    pub(crate) fn done<T>(&mut self) -> Done<T> {
        match &mut self.0 {
            Some(driver) => {
                driver.inline_op = driver.inline_op.wrapping_add(1);
                driver.answer = None;
                Done::Inline(driver.inline_op)
            }
            None => Done::Inline(0),
        }
    }

    /// Run the driver until the operation last numbered by
    /// [`Inline::done`] has its outcome. `None` when it never will (the
    /// driver dropped the operation, as a closed channel would say).
    pub(crate) async fn drive<T: Answered>(&mut self) -> Option<T> {
        let driver = self.0.as_mut()?;
        driver.on_this_runtime();
        let span = driver.span.clone();
        in_span(span, async {
            loop {
                driver.drain();
                if let Some(answer) = driver.answer.take() {
                    let value = T::from_answer(answer)?;
                    // A hold removed by token (an unanswered attempt)
                    // is gone before the caller hears the outcome.
                    while driver.token_requests.iter().any(|r| r.first) {
                        driver.step().await;
                    }
                    return Some(value);
                }
                if !driver.owes_inline_caller() {
                    return None;
                }
                driver.step().await;
            }
        })
        .await
    }

    /// Hand a granted hold's driver to its guard: kept inline while the
    /// machine has nothing to do on its own before the lease ends (the
    /// guard's calls run it); parked with `alarms` when all it has to do is
    /// wait for a deadline (automatic renewal): the guard's calls still run
    /// it inline, and only a hold that reaches its deadline moves to a task
    /// of its own; moved to a task at once when it has requests to see to
    /// (an undo still to resend, or owed another try).
    pub(crate) fn into_holder(self, alarms: &std::sync::Arc<Alarms>) -> Holder {
        match self.own_work() {
            OwnWork::None => Holder::Inline(self),
            OwnWork::Deadline(at) => match Parked::park(self, at, alarms) {
                Ok(parked) => Holder::Parked(parked),
                // No runtime to set an alarm on, nor to run a task on.
                Err(inline) => Holder::Inline(inline),
            },
            OwnWork::Requests => Holder::Task(self.into_task()),
        }
    }

    /// What the machine does on its own before its lease ends, while
    /// nobody calls.
    pub(crate) fn own_work(&self) -> OwnWork {
        let Some(driver) = self.0.as_ref() else {
            return OwnWork::None;
        };
        // Undo resends still waiting for their time, or sent and owed
        // another try should they fail, need the requests seen to.
        if !driver.resends.is_empty()
            || driver.token_requests.iter().any(|r| r.retries_left > 0)
            || !driver.io.is_idle()
        {
            return OwnWork::Requests;
        }
        let lease_end = driver.machine.lease().map(|l| l.valid_until);
        let at = match (driver.machine.poll_timeout(), lease_end) {
            (Some(at), Some(end)) if at < end => at,
            (Some(at), None) => at,
            _ => return OwnWork::None,
        };
        match driver.instant_of(at) {
            Some(instant) => OwnWork::Deadline(instant),
            // Beyond what the clock can represent: as good as never.
            None => OwnWork::None,
        }
    }

    /// Move the driver to a task of its own, which serves the guard's
    /// calls through the returned channel.
    pub(crate) fn into_task(mut self) -> mpsc::UnboundedSender<Call> {
        let (ops, rx) = mpsc::unbounded_channel();
        if let Some(mut driver) = self.0.take() {
            driver.ops = Some(rx);
            let span = driver.span.clone();
            tokio::spawn(driver.run().instrument(span));
        }
        ops
    }

    /// The hold's loss signal: notified (`notify_waiters`) once the driver
    /// has marked the lease cell lost, so that whoever waits looks at the
    /// cell again.
    pub(crate) fn lost(&self) -> std::sync::Arc<Notify> {
        match &self.0 {
            Some(driver) => std::sync::Arc::clone(&driver.lost),
            None => std::sync::Arc::new(Notify::new()),
        }
    }

    /// Run `op` to its end inside the caller's future.
    async fn call<T: Answered>(&mut self, op: Call) -> Option<T> {
        let driver = self.0.as_mut()?;
        // The machine's deadlines passed while nobody ran it (between the
        // guard's calls): let it act on them first, as a task would have.
        let now = driver.catch_up();
        driver.apply_at(now, op);
        self.drive().await
    }
}

/// What a hold's machine does on its own, while nobody calls, before its
/// lease ends ([`Inline::own_work`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OwnWork {
    /// Nothing: the guard's calls run it.
    None,
    /// It acts at this instant (a renewal), and has no request to see to
    /// before then.
    Deadline(Instant),
    /// It has requests in flight or to resend.
    Requests,
}

/// Who runs a granted hold's machine.
pub(crate) enum Holder {
    /// The guard's own calls.
    Inline(Inline),
    /// The guard's own calls until its deadline; from then on a task (see
    /// [`Parked`]).
    Parked(std::sync::Arc<Parked>),
    /// A task, reached through this channel.
    Task(mpsc::UnboundedSender<Call>),
}

impl Holder {
    /// Run the operation `op` builds and wait for its result.
    pub(crate) async fn call<T>(
        &mut self,
        op: impl FnOnce(Done<Result<T, Error>>) -> Call,
    ) -> Result<T, Error>
    where
        Result<T, Error>: Answered,
    {
        let ops = match self {
            Holder::Inline(inline) => {
                let done = inline.done();
                return inline.call(op(done)).await.ok_or(Error::DriverGone)?;
            }
            Holder::Parked(parked) => match Parked::take(parked) {
                // Put back when `borrowed` goes, parked for its next
                // deadline or moved to a task: after the call, or when the
                // call is cut short (the driver then finishes the call's
                // work as it would inline, or in its task).
                Taken::Here(mut borrowed) => {
                    let inline = borrowed.inline();
                    let done = inline.done();
                    return inline.call(op(done)).await.ok_or(Error::DriverGone)?;
                }
                Taken::Task(ops) => ops,
                Taken::Gone => return Err(Error::DriverGone),
            },
            Holder::Task(ops) => ops.clone(),
        };
        let (done, result) = oneshot::channel();
        ops.send(op(Done::Channel(done)))
            .map_err(|_| Error::DriverGone)?;
        result.await.map_err(|_| Error::DriverGone)?
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        let Some(mut driver) = self.0.take() else {
            return;
        };
        // Nobody takes an answer any more: an outcome still owed (a grant)
        // is refused, and given back, as a closed channel would make it.
        driver.inline_op = driver.inline_op.wrapping_add(1);
        driver.answer = None;
        if driver.io.is_idle()
            && driver.resends.is_empty()
            && driver.machine.lease().is_none()
            && !driver.machine.is_busy()
        {
            if let Some(spare) = driver.spare.take() {
                spare.keep(driver);
            }
            return;
        }
        // Cut short (an acquire future dropped part-way, or a grant nobody
        // takes): finish in the background. Without a runtime the TTL ends
        // whatever hold is left.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let span = driver.span.clone();
            runtime.spawn(driver.run().instrument(span));
        }
    }
}

struct Driver {
    machine: Machine,
    io: Io,
    /// The handle's operations; `None` while run inline, or once the handle
    /// is gone.
    ops: Option<mpsc::UnboundedReceiver<Call>>,
    /// Operations the machine refused as busy; retried after every pass.
    deferred: VecDeque<Call>,
    pending: Pending,
    cell: Option<LeaseCell>,
    /// Wakes the guard's `lost()` futures once the cell says lost (a
    /// `Notify`, not a `watch` channel: nothing to do when the driver ends,
    /// where a `watch` sender wakes its eight notifier shards on drop).
    lost: std::sync::Arc<Notify>,
    /// The connection problem last logged at `warn` during an acquire (one
    /// line per new problem, not one per retry).
    warned: Option<String>,
    /// A request of the pending release or extend that got no reply: its
    /// outcome, and so the operation's, is unknown.
    unanswered: Option<String>,
    /// How to remove a hold by its token (None: the protocol cannot).
    token_release: Option<HoldRelease>,
    /// Where an attempt after an unanswered one runs under a new token.
    fresh: Option<FreshAttempt>,
    /// An acquire request just went unanswered: undo it by token unless the
    /// machine holds (see `undo_if_not_held`).
    undo_owed: bool,
    /// Token-release requests in flight.
    token_requests: Vec<TokenReleaseRequest>,
    /// Undo resends not sent yet, each waiting for its time.
    resends: Vec<DelayedResend>,
    next_token_id: u64,
    /// A release of a hold the machine had already given up, answered when
    /// its token-release requests are.
    tally: Option<TokenReleaseTally>,
    /// What the release by token of this hold answered, for the further
    /// releases of a reentrant guard's levels.
    released_by_token: Option<bool>,
    /// The outcome of the current inline operation ([`Done::Inline`]),
    /// until its caller takes it.
    answer: Option<Answer>,
    /// The number of the current inline operation: the only one whose
    /// outcome the answer slot takes.
    inline_op: u64,
    /// The timer, created at the first deadline.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The runtime the timers (this one and the `Io`'s) were made in, as
    /// of the last call or task that ran the driver
    /// ([`Driver::on_this_runtime`]).
    timers_runtime: Option<tokio::runtime::Id>,
    span: tracing::Span,
    /// Where this driver goes when its hold ends inline with nothing left
    /// to do (see [`Spare`]); `None` while it is kept there.
    spare: Option<std::sync::Arc<Spare>>,
}

impl Driver {
    /// Clear everything a hold left in this driver, as it is kept in a
    /// [`Spare`]: afterwards it is what [`new`] would make but for the
    /// machine, which [`Driver::reuse`] replaces, the loss signal, which
    /// `reuse` checks, and the operation number, which keeps counting so
    /// that no earlier operation's number comes back. Every field is named,
    /// so that a field added later must be considered here.
    fn reset(&mut self) {
        let Driver {
            // Replaced by `reuse`.
            machine: _,
            io,
            ops,
            deferred,
            pending,
            cell,
            // Checked by `reuse`: a `lost()` future of the last guard's may
            // still hold it.
            lost: _,
            warned,
            unanswered,
            token_release,
            fresh,
            undo_owed,
            token_requests,
            resends,
            next_token_id,
            tally,
            released_by_token,
            answer,
            inline_op: _,
            sleep,
            timers_runtime,
            span,
            // Already taken: a kept driver does not point at its spare.
            spare: _,
        } = self;
        io.clear();
        *ops = None;
        deferred.clear();
        *pending = Pending::None;
        *cell = None;
        *warned = None;
        *unanswered = None;
        *token_release = None;
        *fresh = None;
        *undo_owed = false;
        token_requests.clear();
        resends.clear();
        *next_token_id = FIRST_TOKEN_RELEASE_ID;
        *tally = None;
        *released_by_token = None;
        *answer = None;
        *sleep = None;
        *timers_runtime = None;
        *span = tracing::Span::none();
    }

    /// Make this driver, reset when it was kept ([`Driver::reset`]), the
    /// driver of a new hold, as [`new`] would make it.
    fn reuse(
        &mut self,
        machine: Machine,
        span: tracing::Span,
        token_release: Option<HoldRelease>,
        fresh: Option<FreshAttempt>,
    ) {
        debug_assert!(
            self.io.is_idle() && self.deferred.is_empty() && self.sleep.is_none(),
            "a driver is reused only as reset when it was kept"
        );
        self.machine = machine;
        // The earlier hold's loss signal is used again only when nothing
        // else holds it (a `lost()` future of that guard's may).
        if std::sync::Arc::get_mut(&mut self.lost).is_none() {
            self.lost = std::sync::Arc::new(Notify::new());
        }
        self.token_release = token_release;
        self.fresh = fresh;
        self.span = span;
    }

    fn now(&self) -> Millis {
        clock().now()
    }

    /// Hand `value` to whoever waits for it: `Err(value)` back when nobody
    /// does (a closed channel, or an inline operation whose caller moved on
    /// or went away).
    fn finish<T: Answered>(&mut self, done: Done<T>, value: T) -> Result<(), T> {
        match done {
            Done::Channel(sender) => sender.send(value),
            Done::Inline(n) if n == self.inline_op && self.answer.is_none() => {
                self.answer = Some(value.into_answer());
                Ok(())
            }
            Done::Inline(_) => Err(value),
        }
    }

    /// Whether the current inline operation is still owed its outcome: it
    /// is pending, deferred, or a release by token is tallying its answer.
    fn owes_inline_caller(&self) -> bool {
        let current = Some(self.inline_op);
        self.pending.inline_number() == current
            || self.deferred.iter().any(|op| op.inline_number() == current)
            || self
                .tally
                .as_ref()
                .is_some_and(|t| t.done.inline_number() == current)
    }

    fn instant_of(&self, at: Millis) -> Option<Instant> {
        clock().instant_of(at).map(Instant::from_std)
    }

    /// Drop the timers if they were made in another runtime than the one
    /// running the driver now: a timer belongs to its runtime, and polling
    /// it from another after that one shut down panics. A guard's calls
    /// may come from any runtime; each call, and a task at its start, asks
    /// here (one look at the current runtime per call).
    fn on_this_runtime(&mut self) {
        let now = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
        if now != self.timers_runtime {
            self.sleep = None;
            self.io.drop_timer();
            self.timers_runtime = now;
        }
    }

    async fn run(mut self: Box<Self>) {
        self.on_this_runtime();
        loop {
            self.drain();
            if self.should_stop() {
                break;
            }
            self.step().await;
        }
        tracing::debug!("driver stopped");
    }

    /// Feed the timer if the machine's deadline has passed. Returns the
    /// current time: the clock is read again only when the machine acted
    /// (a reading costs about 90 instructions, and the guard's call that
    /// follows needs one).
    fn catch_up(&mut self) -> Millis {
        let now = self.now();
        if self.machine.poll_timeout().is_some_and(|at| at <= now) {
            self.machine.handle_timeout(now);
            self.drain();
            return self.now();
        }
        now
    }

    /// Wait for one input (a reply, the timer, an operation) and feed it.
    async fn step(&mut self) {
        let machine_at = self.machine.poll_timeout();
        let resend_at = self.resends.iter().map(|r| r.due).min();
        let for_machine = match (machine_at, resend_at) {
            (Some(m), Some(r)) => m <= r,
            (m, _) => m.is_some(),
        };
        let deadline = machine_at
            .into_iter()
            .chain(resend_at)
            .min()
            .and_then(|t| self.instant_of(t));
        // Re-armed only when the deadline moves (a RedLock round passes here
        // once per reply, with the same deadline). Little is saved: tokio
        // moves a pending timer to the same or a later tick with one atomic
        // swap; only a timer that has fired is registered anew. A timer that
        // fired and is asked for the same deadline fires again at once, as
        // after a reset.
        if let Some(at) = deadline {
            match &mut self.sleep {
                Some(sleep) if sleep.deadline() == at => {}
                Some(sleep) => sleep.as_mut().reset(at),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let ops_open = self.ops.is_some();
        let busy = !self.io.is_idle();
        tokio::select! {
            finished = self.io.next(), if busy => {
                let Finished { id, node, outcome, failure } = finished;
                if id.0 >= FIRST_TOKEN_RELEASE_ID {
                    self.on_token_release(id.0, outcome, failure);
                    return;
                }
                if let Some(failure) = failure {
                    self.on_failure(node, failure);
                } else {
                    self.warned = None;
                    if let Some(slot) = self.io.answered_mut(node) {
                        *slot = Some(Ok(()));
                    }
                }
                let now = self.now();
                self.machine.handle_reply(now, id, outcome);
                self.undo_if_not_held();
            }
            () = fire(&mut self.sleep), if deadline.is_some() => {
                let now = self.now();
                self.send_due_resends(now, !for_machine);
                if for_machine && !self.start_fresh_attempt(now) {
                    self.machine.handle_timeout(now);
                }
            }
            op = next_op(&mut self.ops), if ops_open => match op {
                Some(op) => self.apply(op),
                None => {
                    self.ops = None;
                    tracing::debug!("handle dropped");
                }
            },
            else => {
                // Nothing can happen: no request, no deadline, no handle.
                // (`should_stop` ends a spawned driver before this; inline,
                // the machine always waits for something while an
                // operation is pending.)
                std::future::pending::<()>().await;
            }
        }
    }

    /// The handle is gone and nothing is left to do.
    fn should_stop(&mut self) -> bool {
        if self.ops.is_some() || !self.deferred.is_empty() {
            return false;
        }
        if self.machine.lease().is_some() && !matches!(self.pending, Pending::Cleanup) {
            // Best-effort release of a hold nobody will release.
            let now = self.now();
            if self.machine.release(now).is_ok() {
                tracing::debug!("releasing an abandoned hold");
                self.pending = Pending::Cleanup;
                if let Some(cell) = &self.cell {
                    cell.release();
                }
                self.drain();
            }
            return false;
        }
        // A request in flight may still be a grant that must be undone.
        self.io.is_idle() && self.resends.is_empty() && self.machine.lease().is_none()
    }

    fn apply(&mut self, op: Call) {
        let now = self.now();
        self.apply_at(now, op);
    }

    /// [`Driver::apply`] at `now`, a reading of the clock just taken.
    fn apply_at(&mut self, now: Millis, op: Call) {
        self.unanswered = None;
        let result = match &op {
            Call::Acquire { how, .. } => {
                let how = match how {
                    How::Once => Acquire::Once,
                    How::Within(d) => {
                        Acquire::Until(now + u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    }
                    How::Forever => Acquire::Until(Millis(u64::MAX)),
                };
                if let Some(fresh) = &mut self.fresh {
                    fresh.how = Some(how);
                    fresh.owed = false;
                }
                self.machine.acquire(now, how)
            }
            // The lease cell is marked released when the hold ends (a
            // reentrant hold taken twice lives on after one release).
            Call::Release { .. } => self.machine.release(now),
            Call::Extend { .. } => self.machine.extend(now),
            Call::Reenter { .. } => self.machine.acquire(now, Acquire::Once),
        };
        match (result, op) {
            (Err(lockwright_core::UsageError::Busy), op) => self.deferred.push_back(op),
            (Err(e), Call::Acquire { done, .. }) => drop(self.finish(done, Err(e.into()))),
            (Err(lockwright_core::UsageError::NotHeld), Call::Release { done })
                if self.token_release.is_some() =>
            {
                // Lost by our reckoning (validity ran out, a renewal found
                // it gone), yet the key may still be ours on the server:
                // ask Redis, with the token.
                if let Some(removed) = self.released_by_token {
                    // An earlier release of this hold already removed it by
                    // token (every level of a reentrant hold at once).
                    drop(self.finish(done, Ok(removed)));
                    return;
                }
                let rounds = match &self.token_release {
                    Some(t) if t.how.repeat_while_zero => usize::MAX,
                    _ => 1,
                };
                self.send_token_release(rounds, 0);
                self.tally = Some(TokenReleaseTally {
                    done,
                    removed: false,
                    unknown: None,
                });
            }
            (Err(e), Call::Release { done }) => drop(self.finish(done, Err(e.into()))),
            (Err(e), Call::Extend { done } | Call::Reenter { done }) => {
                drop(self.finish(done, Err(e.into())))
            }
            (Ok(()), Call::Acquire { done, .. }) => self.pending = Pending::Acquire(done),
            (Ok(()), Call::Release { done }) => self.pending = Pending::Release(done),
            (Ok(()), Call::Extend { done }) => self.pending = Pending::Extend(done),
            (Ok(()), Call::Reenter { done }) => self.pending = Pending::Reenter(done),
        }
    }

    /// Drain the machine's outputs: requests to the node workers, events to
    /// their waiters; then retry deferred operations.
    fn drain(&mut self) {
        loop {
            while let Some(request) = self.machine.poll_transmit() {
                self.transmit(request);
            }
            let mut progressed = false;
            while let Some(event) = self.machine.poll_event() {
                progressed = true;
                self.route(event);
            }
            if !self.machine.is_busy() && matches!(self.pending, Pending::None) {
                if let Some(op) = self.deferred.pop_front() {
                    self.apply(op);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn transmit(&mut self, request: Request) {
        let id = request.id;
        if let Some(slot) = self.io.answered_mut(usize::from(request.node.0)) {
            *slot = None;
        }
        if !self.io.send(request) {
            // No such node: the request never ran.
            let now = self.now();
            self.machine.handle_reply(now, id, Outcome::Unknown);
        }
    }

    /// A request got no reply (or could not be sent).
    fn on_failure(&mut self, node: usize, failure: Failure) {
        if let Some(slot) = self.io.answered_mut(node) {
            *slot = Some(Err(failure.text.clone()));
        }
        match &self.pending {
            Pending::Release(_) | Pending::Extend(_) | Pending::Reenter(_) => {
                self.unanswered = Some(failure.text.clone());
            }
            Pending::Acquire(_) => {
                // Decided once the machine has seen the unknown outcome
                // (`undo_if_not_held`): a machine that counts the attempt
                // as granted (`setnx-expire` after a won `SETNX` whose
                // `EXPIRE` went unanswered) holds under this token, and
                // an undo would delete its hold.
                self.undo_owed = self
                    .token_release
                    .as_ref()
                    .is_some_and(|t| t.how.after_unknown_attempt);
                if let Some(error) = failure.permanent {
                    // No retry can mend it: end the acquire now. The machine
                    // still gets its unknown outcome and winds down.
                    tracing::error!(error = %error, "acquire failed");
                    if let Pending::Acquire(done) =
                        std::mem::replace(&mut self.pending, Pending::None)
                    {
                        drop(self.finish(done, Err(error)));
                    }
                } else if self.warned.as_deref() != Some(failure.text.as_str()) {
                    tracing::warn!(node, problem = %failure.text, "redis unreachable, retrying");
                    self.warned = Some(failure.text);
                } else {
                    tracing::debug!(node, problem = %failure.text, "redis unreachable, retrying");
                }
            }
            Pending::None | Pending::Cleanup => {
                tracing::debug!(node, problem = %failure.text, "no reply");
            }
        }
    }

    /// After an acquire request without a reply, once the machine has seen
    /// that: undo the attempt by its token unless the machine now holds
    /// under it. One round only (an unanswered attempt adds one level at
    /// most). The next attempt runs under a new token (without a
    /// [`FreshAttempt`], under the same token, after the undo on this node).
    fn undo_if_not_held(&mut self) {
        if !std::mem::take(&mut self.undo_owed) || self.machine.lease().is_some() {
            return;
        }
        self.send_token_release(1, UNDO_RETRIES);
        if let Some(fresh) = &mut self.fresh {
            fresh.owed = true;
        }
    }

    /// Send the token release to every node.
    fn send_token_release(&mut self, rounds: usize, retries: usize) {
        let Some(release) = &self.token_release else {
            return;
        };
        let command = release.how.command(&release.token);
        for node in 0..self.io.nodes() {
            self.send_token_request(node, command.clone(), rounds, retries, true);
        }
    }

    fn send_token_request(
        &mut self,
        node: usize,
        command: lockwright_core::keyspace::Command,
        rounds_left: usize,
        retries_left: usize,
        first: bool,
    ) {
        let id = self.next_token_id;
        self.next_token_id = self.next_token_id.wrapping_add(1);
        let Ok(node_id) = u8::try_from(node) else {
            return;
        };
        let request = Request {
            id: lockwright_core::RequestId(id),
            node: lockwright_core::NodeId(node_id),
            command: command.clone(),
        };
        if self.io.send(request) {
            self.token_requests.push(TokenReleaseRequest {
                id,
                command,
                node,
                rounds_left,
                retries_left,
                first,
            });
        }
    }

    /// Where the retry after an unanswered attempt runs under the same
    /// token (the machine's own retry, without a [`FreshAttempt`]), the
    /// grant withdraws every undo of that attempt that has not been written
    /// yet: such an undo (a resend queued behind the retry) would now
    /// remove the hold just granted. An undo already written was written
    /// before the retry (requests to one node go one at a time). On one
    /// connection it also ran first; but an undo without a reply retires
    /// its connection and the retry goes out on a new one, so a server that
    /// held the old connection's undo back could still run it after the
    /// grant. The withdrawal cannot close that; a new token for the retry
    /// does, and drivers with a [`FreshAttempt`] do not withdraw.
    fn withdraw_undos(&mut self) {
        if !self.resends.is_empty() {
            tracing::debug!(
                resends = self.resends.len(),
                "undo resends withdrawn: the retry was granted"
            );
            self.resends.clear();
        }
        let io = &mut self.io;
        self.token_requests.retain(|r| {
            let withdrawn = io.cancel(lockwright_core::RequestId(r.id));
            if withdrawn {
                tracing::debug!(node = r.node, "undo withdrawn: the retry was granted");
            }
            !withdrawn
        });
    }

    /// The machine's retry timer fired after an unanswered attempt: build
    /// a new machine, under a new token, and start the acquire on it
    /// instead (see [`FreshAttempt`]). `false`: nothing to swap, the timer
    /// is the machine's.
    fn start_fresh_attempt(&mut self, now: Millis) -> bool {
        let Some(fresh) = &mut self.fresh else {
            return false;
        };
        let Some(how) = fresh.how else {
            return false;
        };
        let swap = fresh.owed
            && matches!(self.pending, Pending::Acquire(_))
            && self.machine.lease().is_none()
            && !self
                .io
                .has_request_below(lockwright_core::RequestId(FIRST_TOKEN_RELEASE_ID));
        if !swap {
            return false;
        }
        fresh.owed = false;
        fresh.built = fresh.built.saturating_add(1);
        let started = (fresh.make)(fresh.built).and_then(|(machine, token)| {
            self.machine = machine;
            if let Some(release) = &mut self.token_release {
                release.token = token;
            }
            tracing::debug!("retrying under a new owner token");
            self.machine.acquire(now, how).map_err(Error::from)
        });
        if let Err(e) = started {
            if let Pending::Acquire(done) = std::mem::replace(&mut self.pending, Pending::None) {
                drop(self.finish(done, Err(e)));
            }
        }
        true
    }

    /// Send the undo resends whose time has come (`earliest`: also the
    /// first in line, which the timer woke up for).
    fn send_due_resends(&mut self, now: Millis, earliest: bool) {
        let first_due = self.resends.iter().map(|r| r.due).min();
        let mut i = 0;
        while i < self.resends.len() {
            let due = self.resends[i].due;
            if due <= now || (earliest && Some(due) == first_due) {
                let r = self.resends.swap_remove(i);
                self.send_token_request(r.node, r.command, r.rounds_left, r.retries_left, false);
            } else {
                i += 1;
            }
        }
    }

    /// A token release's answer: once more while a reentrant count is left,
    /// then, when the application waits, its result once every node answered.
    fn on_token_release(&mut self, id: u64, outcome: Outcome, failure: Option<Failure>) {
        let Some(at) = self.token_requests.iter().position(|r| r.id == id) else {
            return;
        };
        let request = self.token_requests.swap_remove(at);
        match (&outcome, failure) {
            (_, Some(_)) if request.retries_left > 0 => {
                let retries_left = request.retries_left - 1;
                let due = self.now() + undo_resend_delay(retries_left);
                self.resends.push(DelayedResend {
                    due,
                    command: request.command,
                    node: request.node,
                    rounds_left: request.rounds_left,
                    retries_left,
                });
                return;
            }
            (_, Some(failure)) => {
                tracing::warn!(
                    problem = %failure.text,
                    "could not remove a hold by its token; its TTL ends it"
                );
                if let Some(tally) = &mut self.tally {
                    tally.unknown = Some(failure.text);
                }
            }
            (Outcome::Reply(lockwright_core::keyspace::Reply::Int(0)), None)
                if request.rounds_left > 1 =>
            {
                self.send_token_request(
                    request.node,
                    request.command,
                    request.rounds_left - 1,
                    0,
                    true,
                );
                return;
            }
            (Outcome::Reply(lockwright_core::keyspace::Reply::Int(0)), None)
                if self
                    .token_release
                    .as_ref()
                    .is_some_and(|t| t.how.repeat_while_zero) =>
            {
                // Levels of ours are left (an undo's single round): the
                // machine's last release takes them off.
                if let Some(tally) = &mut self.tally {
                    tally.unknown = Some("levels of ours are left".to_owned());
                }
            }
            (Outcome::Reply(lockwright_core::keyspace::Reply::Int(1)), None) => {
                tracing::info!("removed a hold by its token");
                if let Some(tally) = &mut self.tally {
                    tally.removed = true;
                }
            }
            (Outcome::Reply(lockwright_core::keyspace::Reply::Error(e)), None) => {
                if let Some(tally) = &mut self.tally {
                    tally.unknown = Some(e.clone());
                }
            }
            _ => {}
        }
        if self.token_requests.is_empty() {
            if let Some(tally) = self.tally.take() {
                let result = match tally.unknown {
                    Some(reason) if !tally.removed => Err(Error::OutcomeUnknown {
                        operation: Operation::Release,
                        reason,
                    }),
                    _ => Ok(tally.removed),
                };
                if let Ok(removed) = result {
                    self.released_by_token = Some(removed);
                }
                drop(self.finish(tally.done, result));
            }
        }
    }

    /// The result of a denied acquire: taken (`Ok(None)`), or unreachable
    /// when too few nodes answered the last attempt to tell.
    fn denial(&self) -> Result<Option<Granted>, Error> {
        let nodes = self.io.nodes();
        let answered = self
            .io
            .answered()
            .filter(|a| matches!(a, Some(Ok(()))))
            .count();
        let reason = self.io.answered().find_map(|a| match a {
            Some(Err(reason)) => Some(reason.clone()),
            _ => None,
        });
        let Some(reason) = reason else {
            return Ok(None);
        };
        let quorum = nodes / 2 + 1;
        if nodes <= 1 {
            Err(Error::Unavailable(reason))
        } else if answered < quorum {
            Err(Error::QuorumUnreachable {
                answered,
                nodes,
                quorum,
                reason,
            })
        } else {
            Ok(None)
        }
    }

    /// `value`, unless a request of `operation` went unanswered: then its
    /// outcome is unknown.
    fn unless_unanswered<T>(&mut self, operation: Operation, value: T) -> Result<T, Error> {
        match self.unanswered.take() {
            Some(reason) => Err(Error::OutcomeUnknown { operation, reason }),
            None => Ok(value),
        }
    }

    fn route(&mut self, event: Event) {
        tracing::debug!(event = event_name(&event), "event");
        let pending = std::mem::replace(&mut self.pending, Pending::None);
        match (event, pending) {
            (Event::Acquired(lease), Pending::Acquire(done)) => {
                if self.fresh.is_none() {
                    self.withdraw_undos();
                }
                // A release by token after a loss names the token the hold
                // was granted under (RedLock may have taken a new one).
                if let Some(release) = &mut self.token_release {
                    release.token = lease.token.clone();
                }
                let cell = LeaseCell::new(lease.valid_until);
                self.cell = Some(cell.clone());
                if let Err(Ok(Some(granted))) = self.finish(done, Ok(Some(Granted { lease, cell })))
                {
                    // The acquire future was dropped part-way: give the hold back.
                    let now = self.now();
                    granted.cell.release();
                    if self.machine.release(now).is_ok() {
                        self.pending = Pending::Cleanup;
                    }
                }
            }
            (Event::Denied, Pending::Acquire(done)) => {
                drop(self.finish(done, self.denial()));
            }
            (Event::Acquired(lease), Pending::Reenter(done)) => {
                if let Some(cell) = &self.cell {
                    if let Some(version) = cell.begin_renewal() {
                        cell.renewed(version, lease.valid_until);
                    }
                }
                drop(self.finish(done, Ok(lease)));
            }
            (Event::Denied, Pending::Reenter(done)) => {
                // No reply: the lock script may have run (the machine's last
                // release then takes that level off as well). Otherwise the
                // hold was found gone (`Lost` came first).
                let error = match self.unless_unanswered(Operation::Reenter, ()) {
                    Err(unknown) => unknown,
                    Ok(()) => self.denial().err().unwrap_or(Error::Lost),
                };
                drop(self.finish(done, Err(error)));
            }
            (Event::Released { was_held }, Pending::Release(done)) => {
                if self.machine.lease().is_none() {
                    if let Some(cell) = &self.cell {
                        cell.release();
                    }
                }
                // The machine counts a release without a reply as "gone";
                // the caller is told the truth: nobody knows.
                let result = self.unless_unanswered(Operation::Release, was_held);
                drop(self.finish(done, result));
            }
            (Event::Released { .. }, Pending::Cleanup) => {}
            (Event::Extended { lease, by }, pending) => {
                if let Some(cell) = &self.cell {
                    if let Some(version) = cell.begin_renewal() {
                        cell.renewed(version, lease.valid_until);
                    }
                }
                match (by, pending) {
                    (Extension::Extend, Pending::Extend(done)) => {
                        drop(self.finish(done, Ok(lease)))
                    }
                    (_, other) => self.pending = other,
                }
            }
            (
                Event::NotExtended {
                    by: Extension::Extend,
                },
                Pending::Extend(done),
            ) => {
                let result = self.unless_unanswered(Operation::Extend, ());
                drop(self.finish(done, result.and(Err(Error::NotExtended))));
            }
            (Event::Lost, pending) => {
                if let Some(cell) = &self.cell {
                    if cell.lose() {
                        tracing::warn!("hold lost");
                        self.lost.notify_waiters();
                    }
                }
                match pending {
                    // The validity ran out with the extend still unanswered:
                    // it may have run (the key then lives on), so its outcome
                    // is unknown rather than a loss.
                    Pending::Extend(done) if self.unanswered.is_some() || !self.io.is_idle() => {
                        let reason = self
                            .unanswered
                            .take()
                            .unwrap_or_else(|| "no reply before the lease ran out".to_owned());
                        drop(self.finish(
                            done,
                            Err(Error::OutcomeUnknown {
                                operation: Operation::Extend,
                                reason,
                            }),
                        ));
                    }
                    Pending::Extend(done) => drop(self.finish(done, Err(Error::Lost))),
                    // `Lost` concludes an extend and nothing else: an
                    // acquire, a re-entry or a release goes on to an event
                    // of its own (a reentrant lock's nested release, say,
                    // still ends with `Released`).
                    other => self.pending = other,
                }
            }
            (Event::Failed(e), Pending::Acquire(done)) => drop(self.finish(done, Err(e.into()))),
            (Event::Failed(e), Pending::Release(done)) => drop(self.finish(done, Err(e.into()))),
            (Event::Failed(e), Pending::Extend(done) | Pending::Reenter(done)) => {
                drop(self.finish(done, Err(e.into())))
            }
            (Event::RenewalFailed(e), pending) => {
                // The hold stands until its validity; the next renewal tries
                // again. No operation of the caller ends here.
                tracing::warn!(error = %e, "renewal failed");
                self.pending = pending;
            }
            (Event::Failed(e), Pending::Cleanup) => {
                tracing::warn!(error = %e, "cleanup release failed")
            }
            (event, pending) => {
                // An event no operation waits for (an automatic renewal that
                // did not go through, say): the machine has already acted on it.
                tracing::debug!(event = event_name(&event), "unclaimed event");
                self.pending = pending;
            }
        }
    }
}

/// The event's kind, for logs (a lease carries the owner token, which is
/// not logged).
fn event_name(event: &Event) -> &'static str {
    match event {
        Event::Acquired(_) => "acquired",
        Event::Denied => "denied",
        Event::Released { was_held: true } => "released",
        Event::Released { was_held: false } => "released (was gone)",
        Event::Extended {
            by: Extension::Renewal,
            ..
        } => "renewed",
        Event::Extended { .. } => "extended",
        Event::NotExtended {
            by: Extension::Renewal,
        } => "not renewed",
        Event::NotExtended { .. } => "not extended",
        Event::Lost => "lost",
        Event::Failed(_) => "failed",
        Event::RenewalFailed(_) => "renewal failed",
    }
}

async fn fire(sleep: &mut Option<Pin<Box<Sleep>>>) {
    match sleep {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn next_op(ops: &mut Option<mpsc::UnboundedReceiver<Call>>) -> Option<Call> {
    match ops {
        Some(ops) => ops.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Nodes;
    use lockwright_core::{Config, ProtocolId, Token};
    use std::sync::Arc;

    fn idle_driver(spare: &Arc<Spare>, routes: &[Route]) -> Inline {
        let machine = Machine::new(ProtocolId::SetPxLua, &Config::new("spare"), Token::new("t"))
            .expect("a valid configuration");
        let settings = NodeSettings {
            request_timeout: Duration::from_secs(1),
            keys: None,
        };
        new(
            machine,
            routes,
            &settings,
            tracing::Span::none(),
            None,
            None,
            spare,
        )
    }

    #[test]
    fn an_idle_driver_is_kept_without_keeping_its_spare_alive() {
        // No connection is opened: the driver sends nothing.
        let client = redis::Client::open("redis://127.0.0.1:1/").expect("a valid URL");
        let routes = Nodes::new([client]).routes(ProtocolId::SetPxLua);
        let spare = Arc::new(Spare::default());
        let first = idle_driver(&spare, &routes);
        assert_eq!(
            Arc::strong_count(&spare),
            2,
            "a running driver knows its spare"
        );
        drop(first);
        // Kept, and not pointing back at the spare: the lock's handle is
        // the only one, so the spare and its driver go with the lock.
        assert_eq!(Arc::strong_count(&spare), 1);
        assert!(spare.0.lock().unwrap().is_some());
        let second = idle_driver(&spare, &routes);
        assert!(spare.0.lock().unwrap().is_none(), "the next hold took it");
        assert_eq!(Arc::strong_count(&spare), 2);
        drop(second);
        assert_eq!(Arc::strong_count(&spare), 1);
    }
}
