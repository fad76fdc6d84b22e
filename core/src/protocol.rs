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
//! **Order per node.** A node MUST run one machine's requests in the order
//! [`Protocol::poll_transmit`] gave them; a driver MAY pipeline them (write
//! the next before the previous reply has come) on one connection, whose
//! replies come back in that order. Replies are handed back as they arrive;
//! replies from different nodes may come back in any order. A machine sends
//! to a node again while an earlier request there is in flight only when it
//! no longer waits for the earlier one (its reply is then ignored) or, in
//! `reentrant`, when its background renewal and a nested operation run
//! together.
//!
//! Every call that needs the time takes `now`, the caller's monotonic clock.
//! Where [`ProtocolId::clock`](crate::catalogue::ProtocolId::clock) is
//! [`ClockUse::Shared`](crate::catalogue::ClockUse::Shared), the protocol
//! writes `now` to Redis for other clients to compare, so `now` must also be
//! a clock all clients share (Unix milliseconds, read monotonically).
//! A machine never performs I/O, never reads a clock and never draws random
//! numbers: owner tokens are given to it and jitter comes from a seeded
//! generator in its state.

use crate::keyspace::{Command, Reply};
use crate::time::Millis;
use std::fmt;
use std::sync::Arc;

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
/// Shared, not copied, by the leases, events and machine clones that carry
/// it; it hashes and compares as its text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub Arc<str>);

impl Token {
    /// A token of `text`.
    pub fn new(text: impl Into<Arc<str>>) -> Token {
        Token(text.into())
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

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
    Extended {
        /// The new lease.
        lease: Lease,
        /// The application's [`Protocol::extend`] or an automatic renewal.
        by: Extension,
    },
    /// An extend did not succeed; the old lease still stands until its
    /// `valid_until` (an extend never silently releases).
    NotExtended {
        /// The application's [`Protocol::extend`] or an automatic renewal.
        by: Extension,
    },
    /// The hold is gone: validity ran out, or renewal found it taken. It
    /// concludes the application's `extend` if one is in flight, and no
    /// other operation: an acquire or a release in flight goes on to an
    /// event of its own.
    Lost,
    /// The application's operation failed with an error. After an acquire
    /// or a release the machine is idle again (any partial hold it may have
    /// left on a node is being released); after an extend the old lease
    /// still stands until its `valid_until`.
    Failed(ProtocolError),
    /// An automatic renewal got an error reply. The old lease still stands
    /// until its `valid_until`, and renewal tries again; no operation of
    /// the application is concluded by this.
    RenewalFailed(ProtocolError),
}

impl Event {
    /// Does this event conclude `call`, the application's operation in
    /// flight? `Acquired` and `Denied` conclude an acquire, `Released` a
    /// release, `Extended` and `NotExtended` by [`Extension::Extend`] an
    /// extend, `Lost` an extend (an acquire or a release goes on to an
    /// event of its own), `Failed` any call; a renewal's events
    /// (`Extended`/`NotExtended` by [`Extension::Renewal`], `RenewalFailed`)
    /// none. A driver keeps the one call in flight and waits for the event
    /// for which this is true; `core/tests/contract.rs` checks every
    /// machine against it.
    pub fn concludes(&self, call: Call) -> bool {
        match self {
            Event::Acquired(_) | Event::Denied => call == Call::Acquire,
            Event::Released { .. } => call == Call::Release,
            Event::Extended { by, .. } | Event::NotExtended { by } => {
                *by == Extension::Extend && call == Call::Extend
            }
            Event::Lost => call == Call::Extend,
            Event::Failed(_) => true,
            Event::RenewalFailed(_) => false,
        }
    }
}

/// An operation the application starts on a machine: [`Protocol::acquire`],
/// [`Protocol::release`] or [`Protocol::extend`]. One is in flight at a
/// time; [`Event::concludes`] says which event ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// [`Protocol::acquire`].
    Acquire,
    /// [`Protocol::release`].
    Release,
    /// [`Protocol::extend`].
    Extend,
}

/// Which operation an [`Event::Extended`] or [`Event::NotExtended`]
/// concludes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Extension {
    /// The application's [`Protocol::extend`]. An `extend` called while an
    /// automatic renewal is in flight joins it: the renewal's reply
    /// concludes the `extend`, and is reported as this.
    Extend,
    /// An automatic renewal (`Config::auto_renew`) that the application did
    /// not ask for.
    Renewal,
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
    /// Start extending the current hold by the configured TTL. While an
    /// automatic renewal is in flight, join it instead of sending another
    /// request: its reply concludes this extend ([`Extension::Extend`]).
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
