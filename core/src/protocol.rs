//! The driving contract shared by every lock and semaphore machine.
//!
//! A machine is driven in four kinds of call, and a driver MUST use them in
//! this order after every input:
//!
//! 1. **inputs**: [`Protocol::handle_reply`] for every reply (or unknown
//!    outcome) and [`Protocol::handle_timeout`] when the clock has reached
//!    [`Protocol::poll_timeout`];
//! 2. **mutators**: [`Protocol::acquire`], [`Protocol::release`],
//!    [`Protocol::extend`] when the application asks;
//! 3. **outputs**: drain [`Protocol::poll_transmit`] until `None` and execute
//!    each [`Request`] on its node, drain [`Protocol::poll_event`] until
//!    `None`, then re-arm one timer at [`Protocol::poll_timeout`].
//!
//! Every call that needs the time takes `now`, the caller's monotonic clock.
//! A machine never performs I/O, never reads a clock and never draws random
//! numbers: owner tokens are given to it and jitter comes from a seeded
//! generator in its state.

use crate::keyspace::{Command, Reply};
use crate::time::Millis;
use std::collections::VecDeque;
use std::fmt;

/// A Redis node, by index into the driver's list of nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u8);

/// Identifies a request so that its reply can be handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// A command the machine asks its driver to run on one node, on the
/// machine's own connection to that node (WATCH and MULTI are per
/// connection, so a driver MUST NOT share that connection with other
/// machines while a protocol uses them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// Hand the reply back with this id.
    pub id: RequestId,
    /// The node to run it on.
    pub node: NodeId,
    /// The command.
    pub command: Command,
}

/// What became of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The node replied (an error reply is still a reply).
    Reply(Reply),
    /// No reply came: a timeout, a dropped connection, a refused connection.
    /// The command may or may not have run.
    Unknown,
}

/// An owner token: identifies the holder in the values it writes.
/// The adapter draws 128 bits from the OS CSPRNG; models use fixed tokens.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub String);

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fencing token: increases with every grant of the same lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

/// What a holder knows about its hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The owner token written to Redis.
    pub token: Token,
    /// The fence, for protocols that issue one.
    pub fence: Option<Fence>,
    /// The holder must leave its critical section when its own clock reaches
    /// this instant (measured from the time the acquiring request was sent).
    pub valid_until: Millis,
}

/// Why a machine gave up on a request sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ProtocolError {
    /// Redis answered with an error reply (for example `WRONGTYPE`).
    #[error("redis replied with an error: {0}")]
    Redis(String),
    /// A reply had a shape the protocol does not expect.
    #[error("unexpected reply to {request}: {reply:?}")]
    UnexpectedReply {
        /// What was asked.
        request: &'static str,
        /// What came back.
        reply: Reply,
    },
    /// `WAIT` after a grant was acknowledged by fewer replicas than asked;
    /// the grant has been undone.
    #[error("{acknowledged} of {wanted} replicas acknowledged the grant")]
    ReplicasNotAcknowledged {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acknowledged: u32,
    },
    /// A configuration needed at run time is missing on the server (for
    /// example a semaphore's max size).
    #[error("missing on the server: {0}")]
    Missing(String),
}

/// What a machine reports to its application.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The lock or permit is held.
    Acquired(Lease),
    /// A try-once attempt found it taken, or the acquire deadline passed.
    Denied,
    /// Our hold was released. `was_held` is false when the release found the
    /// hold already gone (expired, or taken by someone else).
    Released {
        /// Did the release remove our own hold?
        was_held: bool,
    },
    /// The hold was extended; the new lease replaces the old one.
    Extended(Lease),
    /// An extend did not succeed; the old lease still stands until its
    /// `valid_until` (an extend never silently releases).
    NotExtended,
    /// The hold is gone: validity ran out, or renewal found it taken.
    Lost,
    /// The operation failed with an error; the machine is idle again (any
    /// partial hold it may have left on a node is being released).
    Failed(ProtocolError),
}

/// How hard an acquire tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Acquire {
    /// One attempt; `Denied` when taken.
    Once,
    /// Retry with jittered backoff until this instant of the caller's clock.
    Until(Millis),
}

/// A call made in a state that does not allow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UsageError {
    /// An operation is already in flight.
    #[error("an operation is already in progress")]
    Busy,
    /// Release or extend without a hold.
    #[error("not held")]
    NotHeld,
    /// Acquire while already holding (non-reentrant protocols).
    #[error("already held")]
    AlreadyHeld,
}

/// A sans-IO lock or semaphore machine. See the [module docs](self) for the
/// order in which a driver calls it.
pub trait Protocol: Clone + fmt::Debug + Eq + std::hash::Hash {
    /// Start acquiring.
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError>;
    /// Start releasing the current hold.
    fn release(&mut self, now: Millis) -> Result<(), UsageError>;
    /// Start extending the current hold by the configured TTL.
    fn extend(&mut self, now: Millis) -> Result<(), UsageError>;
    /// A reply, or an unknown outcome, for request `id`. Replies to requests
    /// the machine no longer waits for are ignored.
    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome);
    /// The clock reached (or passed) the instant [`Protocol::poll_timeout`] gave.
    fn handle_timeout(&mut self, now: Millis);
    /// The next request to execute.
    #[must_use]
    fn poll_transmit(&mut self) -> Option<Request>;
    /// The next event for the application.
    #[must_use]
    fn poll_event(&mut self) -> Option<Event>;
    /// When to call [`Protocol::handle_timeout`] next, if at all.
    #[must_use]
    fn poll_timeout(&self) -> Option<Millis>;
    /// The current hold, as far as the machine knows.
    fn lease(&self) -> Option<&Lease>;
    /// Is an operation in flight?
    fn is_busy(&self) -> bool;
}

/// The output queues and request numbering every machine shares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Outbox {
    next_request: u64,
    transmits: VecDeque<Request>,
    events: VecDeque<Event>,
}

impl Outbox {
    /// Queue `command` for `node`; returns the id its reply will carry.
    pub fn send(&mut self, node: NodeId, command: Command) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.transmits.push_back(Request { id, node, command });
        id
    }

    /// Queue an event.
    pub fn emit(&mut self, event: Event) {
        self.events.push_back(event);
    }

    /// Dequeue the next request.
    pub fn poll_transmit(&mut self) -> Option<Request> {
        self.transmits.pop_front()
    }

    /// Dequeue the next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

/// Jittered exponential backoff between acquire attempts. The jitter comes
/// from a SplitMix64 generator seeded by the caller, so runs are repeatable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    /// First delay in ms.
    pub base_ms: u64,
    /// Largest delay in ms.
    pub max_ms: u64,
    /// Fraction of each delay, in percent, that is randomised (0 = none).
    pub jitter_percent: u8,
    attempt: u32,
    rng: u64,
}

impl Backoff {
    /// A backoff from `base_ms` doubling up to `max_ms`, with `jitter_percent`
    /// of each delay drawn from a generator seeded with `seed`.
    pub fn new(base_ms: u64, max_ms: u64, jitter_percent: u8, seed: u64) -> Backoff {
        Backoff {
            base_ms,
            max_ms: max_ms.max(base_ms),
            jitter_percent: jitter_percent.min(100),
            attempt: 0,
            rng: seed,
        }
    }

    /// Start a new acquisition: the next delay is `base_ms` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> u64 {
        let exp = self
            .base_ms
            .saturating_mul(1u64 << self.attempt.min(32))
            .min(self.max_ms);
        self.attempt = self.attempt.saturating_add(1);
        let spread = exp * u64::from(self.jitter_percent) / 100;
        if spread == 0 {
            return exp.max(1);
        }
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (exp - spread + z % (spread + 1)).max(1)
    }
}

/// A small table of named deadlines; [`Timers::next`] is the earliest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Timers<const N: usize> {
    at: [Option<Millis>; N],
}

impl<const N: usize> Default for Timers<N> {
    fn default() -> Self {
        Timers { at: [None; N] }
    }
}

impl<const N: usize> Timers<N> {
    /// Arm timer `index` at `at`.
    pub fn set(&mut self, index: usize, at: Millis) {
        self.at[index] = Some(at);
    }

    /// Disarm timer `index`.
    pub fn clear(&mut self, index: usize) {
        self.at[index] = None;
    }

    /// Disarm every timer.
    pub fn clear_all(&mut self) {
        self.at = [None; N];
    }

    /// When timer `index` fires, if armed.
    pub fn get(&self, index: usize) -> Option<Millis> {
        self.at[index]
    }

    /// The earliest armed deadline.
    pub fn next(&self) -> Option<Millis> {
        self.at.iter().flatten().min().copied()
    }

    /// Disarm and return the index of every timer due at `now`.
    pub fn expire(&mut self, now: Millis) -> impl Iterator<Item = usize> + '_ {
        let mut due = [false; N];
        for (i, t) in self.at.iter_mut().enumerate() {
            if t.is_some_and(|t| t <= now) {
                *t = None;
                due[i] = true;
            }
        }
        due.into_iter()
            .enumerate()
            .filter_map(|(i, d)| d.then_some(i))
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
/// the timer table (`N` timers, named by the machine), the acquire backoff
/// and the reply timeout. The steps every machine takes the same way live
/// here once; what a machine does with its own state stays in the machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Scaffold<const N: usize> {
    /// Requests and events waiting to be polled.
    pub(crate) out: Outbox,
    /// The machine's deadlines.
    pub(crate) timers: Timers<N>,
    /// Delays between acquire attempts.
    pub(crate) backoff: Backoff,
    reply_timeout_ms: Option<u64>,
}

impl<const N: usize> Scaffold<N> {
    /// Empty queues, no timer armed; replies time out after
    /// `reply_timeout_ms` when given.
    pub(crate) fn new(backoff: Backoff, reply_timeout_ms: Option<u64>) -> Scaffold<N> {
        Scaffold {
            out: Outbox::default(),
            timers: Timers::default(),
            backoff,
            reply_timeout_ms,
        }
    }

    /// Queue `command` for `node` and, when replies time out, arm timer
    /// `reply_timer` for it.
    pub(crate) fn send(
        &mut self,
        now: Millis,
        node: NodeId,
        reply_timer: usize,
        command: Command,
    ) -> RequestId {
        if let Some(t) = self.reply_timeout_ms {
            self.timers.set(reply_timer, now + t);
        }
        self.out.send(node, command)
    }

    /// After a failed attempt: disarm every timer, then either arm
    /// `retry_timer` for the next attempt (`true`: the machine backs off) or,
    /// when `how` allows no further attempt, report [`Event::Denied`]
    /// (`false`: the machine is idle).
    pub(crate) fn retry_or_deny(&mut self, now: Millis, how: Acquire, retry_timer: usize) -> bool {
        self.timers.clear_all();
        match retry_at(&mut self.backoff, now, how) {
            Some(at) => {
                self.timers.set(retry_timer, at);
                true
            }
            None => {
                self.out.emit(Event::Denied);
                false
            }
        }
    }

    /// Disarm and return every timer due at `now`.
    pub(crate) fn due(&mut self, now: Millis) -> Vec<usize> {
        self.timers.expire(now).collect()
    }
}

/// The three outputs of a machine that keeps its queues and timers in a
/// [`Scaffold`] field named `base`: expands to `poll_transmit`, `poll_event`
/// and `poll_timeout`, inside a `Protocol` impl (no visibility given) or an
/// inherent impl (`pub(crate)`).
macro_rules! poll_from_scaffold {
    ($($vis:tt)*) => {
        $($vis)* fn poll_transmit(&mut self) -> Option<$crate::protocol::Request> {
            self.base.out.poll_transmit()
        }

        $($vis)* fn poll_event(&mut self) -> Option<$crate::protocol::Event> {
            self.base.out.poll_event()
        }

        $($vis)* fn poll_timeout(&self) -> Option<$crate::time::Millis> {
            self.base.timers.next()
        }
    };
}
pub(crate) use poll_from_scaffold;

/// Implements [`Protocol`] for a newtype by handing every call to its field
/// `$field` (a machine with the same inherent methods).
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

/// Test drivers shared by the machine tests of this crate: run a machine's
/// requests on a [`Keyspace`](crate::keyspace::Keyspace), fire its timers,
/// drop or answer its requests by hand.
#[cfg(test)]
pub(crate) mod testkit {
    use crate::keyspace::{ConnId, Keyspace};
    use crate::protocol::{Event, Lease, Outcome, Protocol, Request, Token};
    use crate::time::Millis;

    /// Run every queued request of `m` on `redis` (connection `conn`, node
    /// clock `server_now`), feed each reply back at client time
    /// `client_now`, and return the events.
    pub(crate) fn drive_at<P: Protocol>(
        m: &mut P,
        redis: &mut Keyspace,
        conn: u32,
        client_now: Millis,
        server_now: Millis,
    ) -> Vec<Event> {
        while let Some(request) = m.poll_transmit() {
            let reply = redis.execute(ConnId(conn), server_now, &request.command);
            m.handle_reply(client_now, request.id, Outcome::Reply(reply));
        }
        std::iter::from_fn(|| m.poll_event()).collect()
    }

    /// [`drive_at`] with one clock for client and server.
    pub(crate) fn drive<P: Protocol>(
        m: &mut P,
        redis: &mut Keyspace,
        conn: u32,
        now: Millis,
    ) -> Vec<Event> {
        drive_at(m, redis, conn, now, now)
    }

    /// Fire every timer due by `until` in order, driving after each one;
    /// returns the events and the instant of the last timer fired.
    pub(crate) fn run_until<P: Protocol>(
        m: &mut P,
        redis: &mut Keyspace,
        conn: u32,
        until: Millis,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        let mut fired = 0;
        while let Some(t) = m.poll_timeout().filter(|t| *t <= until) {
            m.handle_timeout(t);
            events.extend(drive(m, redis, conn, t));
            fired += 1;
            assert!(fired < 10_000, "timers never settle: {m:?}");
        }
        events
    }

    /// Take every queued request without running it: the client crashed
    /// (or the network ate them).
    pub(crate) fn drop_requests<P: Protocol>(m: &mut P) -> Vec<Request> {
        std::iter::from_fn(|| m.poll_transmit()).collect()
    }

    /// A lease without fence, as the SETNX and hash locks grant it.
    pub(crate) fn lease(token: &str, valid_until: u64) -> Lease {
        Lease {
            token: Token(token.into()),
            fence: None,
            valid_until: Millis(valid_until),
        }
    }

    /// Take every queued request and every queued event, without running
    /// anything.
    pub(crate) fn drain<P: Protocol>(m: &mut P) -> (Vec<Request>, Vec<Event>) {
        (
            std::iter::from_fn(|| m.poll_transmit()).collect(),
            std::iter::from_fn(|| m.poll_event()).collect(),
        )
    }

    /// Feed `outcome` to the next queued request of `m` instead of running it.
    pub(crate) fn answer<P: Protocol>(m: &mut P, now: Millis, outcome: Outcome) -> Vec<Event> {
        let request = m.poll_transmit().expect("a request is queued");
        m.handle_reply(now, request.id, outcome);
        std::iter::from_fn(|| m.poll_event()).collect()
    }
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
        let mut t: Timers<2> = Timers::default();
        t.set(0, Millis(10));
        t.set(1, Millis(20));
        assert_eq!(t.next(), Some(Millis(10)));
        assert_eq!(t.expire(Millis(10)).collect::<Vec<_>>(), [0]);
        assert_eq!(
            t.next(),
            Some(Millis(20)),
            "a fired deadline must not stay armed"
        );
        assert_eq!(t.expire(Millis(15)).count(), 0);
    }
}
