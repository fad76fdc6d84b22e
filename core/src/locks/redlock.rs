//! `redlock`: one lock over N independent Redis masters.
//!
//! Origin: antirez's distributed-lock page on redis.io ("the Redlock
//! algorithm"). A client that wants the lock
//!
//! 1. notes the time `t0` on its own monotonic clock and sends
//!    `SET {name} token NX PX ttl` to **all** N masters at once, each with a
//!    reply timeout much smaller than the TTL, so that a dead master does not
//!    stall the attempt;
//! 2. when every master has answered or timed out, computes
//!    `elapsed = now − t0` and `validity = ttl − elapsed − drift`, where the
//!    drift allowance (default `ttl/100 + 2 ms`) covers the masters' clocks
//!    running faster than the client's;
//! 3. holds the lock when at least a quorum `N/2 + 1` of masters said `OK`
//!    **and** some validity is left: the lease runs until
//!    `t0 + ttl − drift` on the client clock (measured from the *send* time,
//!    so a slow round eats into it);
//! 4. otherwise releases the lock on **every** master (not only the ones that
//!    said `OK`: a master whose reply was lost may hold it) and retries after
//!    a jittered delay.
//!
//! Release runs the owner-checked compare-and-delete script on every master;
//! extend runs the owner-checked compare-and-`PEXPIRE` script on every master
//! and needs a quorum within a validity computed the same way from its own
//! send time.
//!
//! The machine also fixes the bugs that deployed clients have had:
//!
//! | bug | here |
//! |---|---|
//! | node-redlock #296: a quorum reached after the validity ran out was still reported as held | [`decide`] denies when `validity ≤ 0`, and the partial locks are released |
//! | redlock-py (and redlock-rs): an error reply after the quorum made the acquire fail *without* releasing the locks already taken | an error reply counts as a failed master; the round still ends normally, releases on every master, then reports [`Event::Failed`] |
//! | rslock: a failed extend released the lock | a failed extend only reports [`Event::NotExtended`]; the old lease stands until its `valid_until`, then [`Event::Lost`] |
//! | rslock: `validity − 500 ms` underflowed for small TTLs | all arithmetic saturates; `validity ≤ 0` means deny |
//!
//! Choices this machine makes where the page leaves room:
//!
//! - **Error replies fail the acquire.** An error reply (`WRONGTYPE`, `OOM`,
//!   `MISCONF`, a reply of the wrong shape) is a failed master in the tally,
//!   and after the round the acquire is undone on every master and reported
//!   as [`Event::Failed`] (no retry), even when a quorum said `OK`: the error
//!   says the deployment is broken (the key is used for something else, a
//!   master refuses writes), which a retry will not mend. Timeouts and lost
//!   connections ([`Outcome::Unknown`]) are ordinary failed masters.
//! - **Reply timeout.** All requests of a round leave at `t0`, so one timer at
//!   `t0 + timeout` serves every master. The timeout is
//!   [`Config::reply_timeout_ms`] or, when unset, `max(1, ttl/10)` ms; it must
//!   be below the TTL.
//! - **Early end.** An acquire or extend round ends as soon as the quorum can
//!   no longer be reached; replies that come later are ignored (each round
//!   has fresh request ids). A release round waits for every master.
//! - **Denied after the clean-up.** After a failed attempt the machine waits
//!   for the release round before it reports [`Event::Denied`] or backs off,
//!   so two rounds are never in flight at once.
//! - **A new token after an unanswered release.** A compare-and-delete
//!   that got no reply may still run later (held up on the network, or on
//!   a connection the driver retired), and it deletes whatever key holds
//!   its token. Had the next round reused that token, such a late undo
//!   could delete the key the retry was just granted on that master, take
//!   the holder below a quorum and let a rival take the lock beside it. So
//!   after a release round (an undo or the application's release) in which
//!   some master did not answer, the machine's next round runs under a new
//!   owner token: the given token with `.1`, `.2`, ... appended. The lease
//!   names the token its round was granted under. A late `SET NX` of a
//!   failed round can still leave a key under the old token: it blocks that
//!   master until its TTL, never a hold of ours.
//!
//! Redlock's safety rests on bounded clock drift and on masters that do not
//! forget a key: a master whose clock jumps forward, or that restarts empty
//! without a delayed restart, lets a second client reach a quorum (the
//! `clock-jump` and `restart` faults).
//!
//! Redlock does not run on the engine of the single-node locks: each of its
//! steps is a round fanned out to every master and judged by quorum, with
//! one reply timer per round, where the engine sends one request to one
//! node at a time.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Round: acquire, t0 = now
//!     Round --> Round: SET key token NX PX ttl on every master
//!     Round --> Held: quorum OK and ttl − elapsed − drift > 0 / Acquired
//!     Round --> Undo: no quorum, or no validity left, or an error reply
//!     Undo --> Backoff: compare-and-delete on every master, then a new token if one did not answer
//!     Undo --> [*]: after an error reply / Failed
//!     Backoff --> Round: retry timer
//!     Backoff --> [*]: deadline passed / Denied
//!     Held --> Held: compare-and-pexpire on every master, quorum / Extended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: compare-and-delete on every master / Released
//! ```

use crate::config::{Config, ConfigError};
use crate::engine::{Op, Scaffold, Standing, Timer};
use crate::keyspace::script::release_args;
use crate::keyspace::{Command, Reply, Script, SetCondition, SetExpiry};
use crate::protocol::{
    Acquire, Event, Extension, Lease, NodeId, Outcome, Protocol, ProtocolError, Request, RequestId,
    Token, UsageError,
};
use crate::time::Millis;
use std::hash::{Hash, Hasher};

/// The number of masters that must agree among `nodes`: `nodes/2 + 1`.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The verdict on one acquire or extend round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Held, for `validity_ms` more on the client clock.
    Held {
        /// `ttl − elapsed − drift`, above zero.
        validity_ms: u64,
    },
    /// Fewer than a quorum of masters agreed.
    NoQuorum {
        /// Masters that agreed.
        acks: usize,
        /// Masters needed.
        quorum: usize,
    },
    /// A quorum agreed, but the round took so long that no validity is left
    /// (node-redlock #296).
    NoValidity {
        /// Masters that agreed.
        acks: usize,
    },
}

/// Redlock's decision rule, as a pure function: `acks` of `nodes` masters
/// agreed, the round took `elapsed` ms on the client clock, the lock lives
/// `ttl` ms on each master and `drift` ms are allowed for clock drift.
///
/// Held when `acks ≥ nodes/2 + 1` and `ttl − elapsed − drift > 0`. The
/// subtraction saturates, so a tiny TTL or a slow round yields zero validity
/// (deny), never a wrapped-around huge one.
///
/// ```
/// use lockwright_core::locks::redlock::{decide, Decision};
/// assert_eq!(decide(3, 5, 10_000, 40, 102), Decision::Held { validity_ms: 9_858 });
/// assert_eq!(decide(2, 5, 10_000, 40, 102), Decision::NoQuorum { acks: 2, quorum: 3 });
/// assert_eq!(decide(5, 5, 3, 1, 2), Decision::NoValidity { acks: 5 });
/// ```
pub fn decide(acks: usize, nodes: usize, ttl: u64, elapsed: u64, drift: u64) -> Decision {
    let quorum = quorum(nodes);
    if acks < quorum {
        return Decision::NoQuorum { acks, quorum };
    }
    match ttl.saturating_sub(elapsed).saturating_sub(drift) {
        0 => Decision::NoValidity { acks },
        validity_ms => Decision::Held { validity_ms },
    }
}

/// One master's part in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    /// No reply yet.
    Pending,
    /// `OK` (acquire) or 1 (extend, release).
    Yes,
    /// Nil (acquire: taken) or 0 (extend, release: not ours).
    No,
    /// Timed out, unknown outcome, or an error reply.
    Failed,
}

/// One request to every master, sent at `sent_at`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Round {
    op: Op,
    sent_at: Millis,
    /// The request sent to master `i`.
    requests: Vec<RequestId>,
    /// Master `i`'s answer so far.
    answers: Vec<Answer>,
    /// The first error reply of the round, if any.
    error: Option<ProtocolError>,
}

impl Round {
    fn count(&self, answer: Answer) -> usize {
        self.answers.iter().filter(|a| **a == answer).count()
    }

    /// Every master answered, or (acquire, extend) the quorum is out of reach.
    fn is_over(&self) -> bool {
        let pending = self.count(Answer::Pending);
        pending == 0
            || (self.op != Op::Release
                && self.count(Answer::Yes) + pending < quorum(self.answers.len()))
    }

    /// Record master `i`'s outcome.
    fn record(&mut self, i: usize, outcome: Outcome) {
        let (answer, error) = match (self.op, outcome) {
            (_, Outcome::Unknown) => (Answer::Failed, None),
            (_, Outcome::Reply(Reply::Error(e))) => (Answer::Failed, Some(ProtocolError::Redis(e))),
            (Op::Acquire, Outcome::Reply(r)) if r.is_ok() => (Answer::Yes, None),
            (Op::Acquire, Outcome::Reply(Reply::Nil)) => (Answer::No, None),
            (Op::Extend | Op::Release, Outcome::Reply(Reply::Int(1))) => (Answer::Yes, None),
            (Op::Extend | Op::Release, Outcome::Reply(Reply::Int(0))) => (Answer::No, None),
            (op, Outcome::Reply(reply)) => (
                Answer::Failed,
                Some(ProtocolError::UnexpectedReply {
                    request: match op {
                        Op::Acquire => "SET NX PX",
                        Op::Extend => "compare-and-pexpire",
                        Op::Release => "compare-and-delete",
                    },
                    reply,
                }),
            ),
        };
        if let Some(slot) = self.answers.get_mut(i) {
            *slot = answer;
        }
        if self.error.is_none() {
            self.error = error;
        }
    }
}

/// What follows a release round.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Then {
    /// The application asked: report `Released`.
    Report,
    /// An attempt failed: back off and retry, or deny.
    Retry(Acquire),
    /// An attempt met an error reply: report it.
    Fail(ProtocolError),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Idle,
    Acquiring {
        round: Round,
        how: Acquire,
    },
    /// An attempt failed and was cleaned up; the retry timer is armed.
    BackingOff {
        how: Acquire,
    },
    Held {
        lease: Lease,
    },
    Extending {
        round: Round,
        lease: Lease,
    },
    Releasing {
        round: Round,
        then: Then,
    },
}

/// The `redlock` machine: one lock over `config.nodes` masters, which are
/// [`NodeId`]`(0)` to `NodeId(N − 1)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Redlock {
    key: String,
    /// The owner token the machine was built with.
    given: Token,
    /// The token of the current (or next) acquire round and of the hold it
    /// gets: `given`, or `given.n` after `n` renamings.
    token: Token,
    /// How many times a new token was taken (see the module docs).
    renamed: u32,
    /// A deliberate bug for the tests: never take a new token.
    one_token: bool,
    nodes: u8,
    ttl_ms: u64,
    drift_ms: u64,
    reply_timeout_ms: u64,
    notify_releases: bool,
    state: State,
    base: Scaffold,
}

impl Redlock {
    /// A lock on `config.name` over `config.nodes` masters for the owner
    /// `token`. Besides [`Config::validate`]'s checks (at least one master,
    /// drift below the TTL, ...), the token must not be empty and the reply
    /// timeout (default `max(1, ttl/10)` ms) must be below the TTL.
    pub fn new(config: &Config, token: Token) -> Result<Redlock, ConfigError> {
        config.validate()?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        let reply_timeout_ms = config
            .reply_timeout_ms
            .unwrap_or((config.ttl_ms / 10).max(1));
        if reply_timeout_ms == 0 || reply_timeout_ms >= config.ttl_ms {
            return Err(ConfigError::BadReplyTimeout {
                timeout_ms: reply_timeout_ms,
                ttl_ms: config.ttl_ms,
            });
        }
        Ok(Redlock {
            key: config.key(),
            given: token.clone(),
            token,
            renamed: 0,
            one_token: false,
            nodes: config.nodes,
            ttl_ms: config.ttl_ms,
            drift_ms: config.drift(),
            reply_timeout_ms,
            notify_releases: config.notify_releases,
            state: State::Idle,
            // No per-request reply timer: a round arms the reply timer once for all
            // of its masters.
            base: Scaffold::new(config.backoff(), None),
        })
    }

    /// Feed `state` everything of this machine but what its current round
    /// keeps per master: with [`Redlock::hash_master`] for each master, the
    /// pieces of a fingerprint that does not change when masters are
    /// renamed, for a model checker that treats interchangeable masters as
    /// one (a symmetry reduction). Nothing hashed here names a master by its
    /// number: requests and timers are named by [`RequestId`], which the
    /// masters' parts carry. The outbox is hashed as it is; a checker that
    /// renames masters must have drained it (its requests name masters).
    pub fn hash_apart_from_masters<H: Hasher>(&self, state: &mut H) {
        // Every field, so that a new one cannot be left out unnoticed.
        let Redlock {
            key,
            given,
            token,
            renamed,
            one_token,
            nodes,
            ttl_ms,
            drift_ms,
            reply_timeout_ms,
            notify_releases,
            state: phase,
            base,
        } = self;
        (key, given, token, renamed, one_token, nodes).hash(state);
        (ttl_ms, drift_ms, reply_timeout_ms, notify_releases, base).hash(state);
        std::mem::discriminant(phase).hash(state);
        let round = match phase {
            State::Idle => None,
            State::Acquiring { round, how } => {
                how.hash(state);
                Some(round)
            }
            State::BackingOff { how } => {
                how.hash(state);
                None
            }
            State::Held { lease } => {
                lease.hash(state);
                None
            }
            State::Extending { round, lease } => {
                lease.hash(state);
                Some(round)
            }
            State::Releasing { round, then } => {
                then.hash(state);
                Some(round)
            }
        };
        if let Some(Round {
            op,
            sent_at,
            requests,
            answers,
            error,
        }) = round
        {
            (op, sent_at, error, requests.len(), answers.len()).hash(state);
        }
    }

    /// Feed `state` master `i`'s answer in the current round (nothing
    /// between rounds). See [`Redlock::hash_apart_from_masters`].
    pub fn hash_master<H: Hasher>(&self, i: usize, state: &mut H) {
        self.round().map(|r| r.answers.get(i)).hash(state);
    }

    /// The id of the current round's request to master `i` (none between
    /// rounds): a reply with another id is stale, and the machine ignores
    /// it. A checker that renames masters hashes ids by that alone
    /// (current or stale), since no other id can ever match.
    pub fn round_request(&self, i: usize) -> Option<RequestId> {
        self.round()?.requests.get(i).copied()
    }

    /// Rename the masters: master `i` becomes master `to[i]` (`to` is a
    /// permutation of `0..nodes`; anything else leaves the machine as it
    /// is), and every request id of the current round becomes `id(old)`.
    /// For checkers and their tests, which rename masters to compare a
    /// state with its renamings; a machine in use has no reason to.
    pub fn rename_masters(&mut self, to: &[usize], mut id: impl FnMut(RequestId) -> RequestId) {
        let n = usize::from(self.nodes);
        let mut seen = vec![false; n];
        if to.len() != n
            || !to
                .iter()
                .all(|&t| t < n && !std::mem::replace(&mut seen[t], true))
        {
            return;
        }
        let round = match &mut self.state {
            State::Acquiring { round, .. }
            | State::Extending { round, .. }
            | State::Releasing { round, .. } => round,
            State::Idle | State::BackingOff { .. } | State::Held { .. } => return,
        };
        if round.requests.len() != n || round.answers.len() != n {
            return;
        }
        let (requests, answers) = (round.requests.clone(), round.answers.clone());
        for (i, &t) in to.iter().enumerate() {
            round.requests[t] = id(requests[i]);
            round.answers[t] = answers[i];
        }
    }

    fn round(&self) -> Option<&Round> {
        match &self.state {
            State::Acquiring { round, .. }
            | State::Extending { round, .. }
            | State::Releasing { round, .. } => Some(round),
            State::Idle | State::BackingOff { .. } | State::Held { .. } => None,
        }
    }

    /// A deliberate bug, for the tests that must catch it: every round
    /// runs under `token`, also after a release round that got no reply
    /// from some master (see the module docs for what a late undo then
    /// does).
    #[doc(hidden)]
    pub fn with_one_token_for_every_round(
        config: &Config,
        token: Token,
    ) -> Result<Redlock, ConfigError> {
        let mut lock = Redlock::new(config, token)?;
        lock.one_token = true;
        Ok(lock)
    }

    // Getters.

    /// The owner token the next acquire round runs under (the one the
    /// machine was built with until a release round goes unanswered).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The number of masters.
    pub fn nodes(&self) -> usize {
        usize::from(self.nodes)
    }

    /// The number of masters that must agree.
    pub fn quorum(&self) -> usize {
        quorum(self.nodes())
    }

    /// The drift allowance in ms.
    pub fn drift_ms(&self) -> u64 {
        self.drift_ms
    }

    /// The reply timeout of every round in ms.
    pub fn reply_timeout_ms(&self) -> u64 {
        self.reply_timeout_ms
    }

    // Rounds.

    fn command(&self, op: Op) -> Command {
        match op {
            Op::Acquire => Command::Set {
                key: self.key.clone(),
                value: self.token.0.to_string(),
                condition: SetCondition::Nx,
                expiry: SetExpiry::Px(self.ttl_ms),
                get: false,
            },
            Op::Extend => Command::Eval {
                script: Script::CompareAndPExpire,
                keys: vec![self.key.clone()],
                args: vec![self.token.0.to_string(), self.ttl_ms.to_string()],
            },
            Op::Release => Command::Eval {
                script: Script::CompareAndDelete,
                keys: vec![self.key.clone()],
                args: release_args(vec![self.token.0.to_string()], self.notify_releases),
            },
        }
    }

    /// Queue `op` for every master before any reply can come back, and arm
    /// the round's reply timeout.
    fn start_round(&mut self, now: Millis, op: Op) -> Round {
        let requests = (0..self.nodes)
            .map(|i| {
                let command = self.command(op);
                self.base.out.send(NodeId(i), command)
            })
            .collect();
        self.base
            .timers
            .set(Timer::Reply, now + self.reply_timeout_ms);
        Round {
            op,
            sent_at: now,
            requests,
            answers: vec![Answer::Pending; self.nodes()],
            error: None,
        }
    }

    fn round_mut(&mut self) -> Option<&mut Round> {
        match &mut self.state {
            State::Acquiring { round, .. }
            | State::Extending { round, .. }
            | State::Releasing { round, .. } => Some(round),
            _ => None,
        }
    }

    /// The lease a round sent at `sent_at` earns: `sent_at + ttl − drift`.
    fn lease_from(&self, sent_at: Millis) -> Lease {
        Lease {
            token: self.token.clone(),
            fence: None,
            valid_until: sent_at + self.ttl_ms.saturating_sub(self.drift_ms),
        }
    }

    /// Apply [`decide`] to a finished acquire or extend round.
    fn verdict(&self, now: Millis, round: &Round) -> Option<Lease> {
        let decision = decide(
            round.count(Answer::Yes),
            round.answers.len(),
            self.ttl_ms,
            now - round.sent_at,
            self.drift_ms,
        );
        let lease = self.lease_from(round.sent_at);
        match decision {
            Decision::Held { .. } if lease.valid_until > now => Some(lease),
            _ => None,
        }
    }

    fn finish_round(&mut self, now: Millis) {
        self.base.timers.clear(Timer::Reply);
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Acquiring { round, how } => {
                if let Some(error) = round.error {
                    self.start_release(now, Then::Fail(error));
                    return;
                }
                match self.verdict(now, &round) {
                    Some(lease) => {
                        self.hold(lease.clone());
                        self.base.out.emit(Event::Acquired(lease));
                    }
                    // Too few masters, or too late: undo everywhere.
                    None => self.start_release(now, Then::Retry(how)),
                }
            }
            State::Extending { round, lease } => match self.verdict(now, &round) {
                Some(new) => {
                    self.hold(new.clone());
                    self.base.out.emit(Event::Extended {
                        lease: new,
                        by: Extension::Extend,
                    });
                }
                // Never release on a failed extend: the old lease stands.
                None => {
                    self.base.out.emit(Event::NotExtended {
                        by: Extension::Extend,
                    });
                    if lease.valid_until <= now {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    } else {
                        self.hold(lease);
                    }
                }
            },
            State::Releasing { round, then } => {
                let was_held = round.count(Answer::Yes) > 0;
                if round.count(Answer::Failed) > 0 {
                    self.rename();
                }
                self.go_idle();
                match then {
                    Then::Report => self.base.out.emit(Event::Released { was_held }),
                    Then::Retry(how) => self.retry_or_deny(now, how),
                    Then::Fail(error) => self.base.out.emit(Event::Failed(error)),
                }
            }
            state => self.state = state,
        }
    }

    // Transitions.

    fn hold(&mut self, lease: Lease) {
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        self.state = State::Held { lease };
    }

    /// A compare-and-delete under the current token may still run: later
    /// rounds take a new token, which it cannot match.
    fn rename(&mut self) {
        if self.one_token {
            return;
        }
        self.renamed = self.renamed.saturating_add(1);
        self.token = Token::new(format!("{}.{}", self.given.0, self.renamed));
    }

    fn go_idle(&mut self) {
        self.base.timers.clear_all();
        self.state = State::Idle;
    }

    fn start_release(&mut self, now: Millis, then: Then) {
        self.base.timers.clear_all();
        let round = self.start_round(now, Op::Release);
        self.state = State::Releasing { round, then };
    }

    fn start_acquire(&mut self, now: Millis, how: Acquire) {
        let round = self.start_round(now, Op::Acquire);
        self.state = State::Acquiring { round, how };
    }

    /// A failed, cleaned-up attempt: retry after a jittered delay if the
    /// deadline allows, else deny.
    fn standing(&self) -> Standing {
        match self.state {
            State::Idle => Standing::Idle,
            State::Held { .. } => Standing::Held,
            _ => Standing::Busy,
        }
    }

    fn retry_or_deny(&mut self, now: Millis, how: Acquire) {
        self.state = if self.base.retry_or_deny(now, how) {
            State::BackingOff { how }
        } else {
            State::Idle
        };
    }
}

impl Protocol for Redlock {
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        self.standing().may_acquire()?;
        self.base.backoff.reset();
        self.start_acquire(now, how);
        Ok(())
    }

    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        self.standing().may_use_hold()?;
        self.start_release(now, Then::Report);
        Ok(())
    }

    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        self.standing().may_use_hold()?;
        let State::Held { lease } = &self.state else {
            return Err(UsageError::Busy);
        };
        let lease = lease.clone();
        // The expiry timer of the old lease stays armed.
        let round = self.start_round(now, Op::Extend);
        self.state = State::Extending { round, lease };
        Ok(())
    }

    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        let Some(round) = self.round_mut() else {
            return;
        };
        // Replies to an earlier round, or a second reply, are ignored.
        let Some(i) = round.requests.iter().position(|r| *r == id) else {
            return;
        };
        if round.answers.get(i) != Some(&Answer::Pending) {
            return;
        }
        round.record(i, outcome);
        if round.is_over() {
            self.finish_round(now);
        }
    }

    fn handle_timeout(&mut self, now: Millis) {
        let mut due = self.base.due(now);
        // A round that timed out is concluded before a retry or an expiry
        // due at the same instant is looked at.
        due.sort_by_key(|timer| *timer != Timer::Reply);
        for timer in due {
            match timer {
                Timer::Reply => {
                    if let Some(round) = self.round_mut() {
                        for answer in &mut round.answers {
                            if *answer == Answer::Pending {
                                *answer = Answer::Failed;
                            }
                        }
                        self.finish_round(now);
                    }
                }
                Timer::Retry => {
                    if let State::BackingOff { how } = self.state {
                        self.start_acquire(now, how);
                    }
                }
                Timer::Expiry => {
                    // Checked against the lease: an extend finished in this
                    // same call may have re-armed the timer for a new one.
                    if let State::Held { lease } | State::Extending { lease, .. } = &self.state {
                        if lease.valid_until <= now {
                            self.go_idle();
                            self.base.out.emit(Event::Lost);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn poll_transmit(&mut self) -> Option<Request> {
        self.base.poll_transmit()
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.base.poll_event()
    }

    fn poll_timeout(&self) -> Option<Millis> {
        self.base.poll_timeout()
    }

    fn lease(&self) -> Option<&Lease> {
        match &self.state {
            State::Held { lease } | State::Extending { lease, .. } => Some(lease),
            _ => None,
        }
    }

    fn is_busy(&self) -> bool {
        self.standing() == Standing::Busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::WRONGTYPE;
    use crate::protocol::testkit::drain;
    use crate::protocol::Request;

    fn config(nodes: u8, ttl_ms: u64) -> Config {
        Config {
            ttl_ms,
            nodes,
            retry_jitter_percent: 0,
            ..Config::new("lock")
        }
    }

    fn lock(nodes: u8, ttl_ms: u64) -> Redlock {
        Redlock::new(&config(nodes, ttl_ms), Token("me".into())).unwrap()
    }

    fn is_release(r: &Request) -> bool {
        matches!(
            r.command,
            Command::Eval {
                script: Script::CompareAndDelete,
                ..
            }
        )
    }

    #[test]
    fn decide_requires_a_majority() {
        for (nodes, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (15, 8)] {
            assert_eq!(quorum(nodes), q);
            assert!(matches!(
                decide(q, nodes, 100, 0, 3),
                Decision::Held { validity_ms: 97 }
            ));
            assert_eq!(
                decide(q - 1, nodes, 100, 0, 3),
                Decision::NoQuorum {
                    acks: q - 1,
                    quorum: q
                }
            );
        }
    }

    #[test]
    fn decide_saturates_instead_of_underflowing() {
        assert_eq!(decide(3, 3, 3, 1, 2), Decision::NoValidity { acks: 3 });
        assert_eq!(
            decide(3, 3, 3, u64::MAX, 2),
            Decision::NoValidity { acks: 3 }
        );
        assert_eq!(
            decide(3, 3, 3, 0, u64::MAX),
            Decision::NoValidity { acks: 3 }
        );
        assert_eq!(decide(3, 3, 3, 0, 2), Decision::Held { validity_ms: 1 });
    }

    #[test]
    fn construction_rejects_bad_configs() {
        let mut c = config(0, 100);
        assert_eq!(
            Redlock::new(&c, Token("me".into())),
            Err(ConfigError::ZeroNodes)
        );
        c.nodes = 3;
        assert_eq!(
            Redlock::new(&c, Token::new("")),
            Err(ConfigError::EmptyToken)
        );
        c.ttl_ms = 1; // default drift 2 ms ≥ 1 ms
        assert!(matches!(
            Redlock::new(&c, Token("me".into())),
            Err(ConfigError::DriftNotBelowTtl { .. })
        ));
        c.drift_ms = Some(0); // default reply timeout 1 ms is not below 1 ms
        assert_eq!(
            Redlock::new(&c, Token("me".into())),
            Err(ConfigError::BadReplyTimeout {
                timeout_ms: 1,
                ttl_ms: 1
            })
        );
        let l = lock(5, 10_000);
        assert_eq!(
            (l.quorum(), l.drift_ms(), l.reply_timeout_ms()),
            (3, 102, 1_000)
        );
    }

    #[test]
    fn acquire_sends_to_every_master_before_any_reply() {
        let mut l = lock(5, 1_000);
        l.acquire(Millis(7), Acquire::Once).unwrap();
        let (sent, events) = drain(&mut l);
        assert!(events.is_empty());
        let nodes: Vec<u8> = sent.iter().map(|r| r.node.0).collect();
        assert_eq!(nodes, [0, 1, 2, 3, 4]);
        assert!(sent.iter().all(|r| matches!(
            &r.command,
            Command::Set { key, value, condition: SetCondition::Nx, expiry: SetExpiry::Px(1_000), get: false }
                if key == "{lock}" && value == "me"
        )));
        assert_eq!(l.poll_timeout(), Some(Millis(107)));
        assert!(l.is_busy());
    }

    #[test]
    fn quorum_acquires_with_validity_from_the_send_time() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(10), Acquire::Once).unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(20), sent[0].id, Outcome::Reply(Reply::ok()));
        l.handle_reply(Millis(30), sent[1].id, Outcome::Reply(Reply::ok()));
        // Quorum reached, but the round waits for the third master.
        assert_eq!(drain(&mut l).1, []);
        l.handle_reply(Millis(40), sent[2].id, Outcome::Reply(Reply::Nil));
        let lease = Lease {
            token: Token("me".into()),
            fence: None,
            valid_until: Millis(10 + 1_000 - 12),
        };
        assert_eq!(
            drain(&mut l),
            (vec![], vec![Event::Acquired(lease.clone())])
        );
        assert_eq!(l.lease(), Some(&lease));
        assert_eq!(l.poll_timeout(), Some(lease.valid_until));
    }

    #[test]
    fn too_few_acks_release_everywhere_then_deny() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(1), sent[0].id, Outcome::Reply(Reply::ok()));
        l.handle_reply(Millis(2), sent[1].id, Outcome::Reply(Reply::Nil));
        l.handle_reply(Millis(3), sent[2].id, Outcome::Reply(Reply::Nil));
        let (release, events) = drain(&mut l);
        assert!(events.is_empty());
        assert_eq!(release.len(), 3);
        assert!(release.iter().all(is_release));
        for r in &release {
            l.handle_reply(Millis(4), r.id, Outcome::Reply(Reply::Int(0)));
        }
        assert_eq!(drain(&mut l).1, [Event::Denied]);
        assert!(!l.is_busy());
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn reply_timeout_fails_silent_masters_and_late_replies_are_ignored() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(5), sent[0].id, Outcome::Reply(Reply::ok()));
        assert_eq!(l.poll_timeout(), Some(Millis(100)));
        l.handle_timeout(Millis(100));
        let (release, events) = drain(&mut l);
        assert!(events.is_empty());
        assert!(release.iter().all(is_release));
        // The deadline moved on to the release round's timeout.
        assert_eq!(l.poll_timeout(), Some(Millis(200)));
        // A late OK from the old round changes nothing.
        let before = l.clone();
        l.handle_reply(Millis(101), sent[1].id, Outcome::Reply(Reply::ok()));
        assert_eq!(l, before);
        l.handle_timeout(Millis(200));
        assert_eq!(drain(&mut l).1, [Event::Denied]);
    }

    #[test]
    fn quorum_out_of_reach_ends_the_round_early() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(1), sent[0].id, Outcome::Reply(Reply::Nil));
        assert_eq!(drain(&mut l).0, []);
        l.handle_reply(Millis(2), sent[1].id, Outcome::Unknown);
        let (release, _) = drain(&mut l);
        assert_eq!(release.len(), 3);
    }

    #[test]
    fn error_after_quorum_releases_everywhere_then_fails() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(0), Acquire::Until(Millis(10_000)))
            .unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(1), sent[0].id, Outcome::Reply(Reply::ok()));
        l.handle_reply(Millis(2), sent[1].id, Outcome::Reply(Reply::ok()));
        l.handle_reply(
            Millis(3),
            sent[2].id,
            Outcome::Reply(Reply::Error(WRONGTYPE.into())),
        );
        let (release, events) = drain(&mut l);
        assert!(events.is_empty());
        assert_eq!(release.len(), 3);
        assert!(release.iter().all(is_release));
        for (r, n) in release.iter().zip([1, 1, 0]) {
            l.handle_reply(Millis(4), r.id, Outcome::Reply(Reply::Int(n)));
        }
        assert_eq!(
            drain(&mut l).1,
            [Event::Failed(ProtocolError::Redis(WRONGTYPE.into()))]
        );
        assert!(!l.is_busy());
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn slow_quorum_is_denied_and_released() {
        // node-redlock #296: every master said OK, but the validity ran out.
        let c = Config {
            reply_timeout_ms: Some(99),
            ..config(3, 100)
        };
        let mut l = Redlock::new(&c, Token("me".into())).unwrap();
        l.acquire(Millis(0), Acquire::Once).unwrap();
        let (sent, _) = drain(&mut l);
        for r in &sent {
            // 100 − 97 − 3 = 0: no validity left.
            l.handle_reply(Millis(97), r.id, Outcome::Reply(Reply::ok()));
        }
        let (release, events) = drain(&mut l);
        assert_eq!(events, []);
        assert_eq!(release.len(), 3);
        assert!(release.iter().all(is_release));
        for r in &release {
            l.handle_reply(Millis(98), r.id, Outcome::Reply(Reply::Int(1)));
        }
        assert_eq!(drain(&mut l).1, [Event::Denied]);

        // One millisecond earlier the same round holds for 1 ms.
        let mut l = Redlock::new(&c, Token("me".into())).unwrap();
        l.acquire(Millis(0), Acquire::Once).unwrap();
        for r in drain(&mut l).0 {
            l.handle_reply(Millis(96), r.id, Outcome::Reply(Reply::ok()));
        }
        let (_, events) = drain(&mut l);
        let [Event::Acquired(lease)] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(lease.valid_until, Millis(97));
    }

    #[test]
    fn retries_until_the_deadline_with_backoff() {
        let mut l = lock(1, 1_000);
        l.acquire(Millis(0), Acquire::Until(Millis(25))).unwrap();
        let mut now = Millis(0);
        let mut attempts = 0;
        loop {
            let (sent, events) = drain(&mut l);
            if let Some(e) = events.first() {
                assert_eq!(e, &Event::Denied);
                break;
            }
            let idle = sent.is_empty();
            for r in sent {
                if matches!(r.command, Command::Set { .. }) {
                    attempts += 1;
                    l.handle_reply(now, r.id, Outcome::Reply(Reply::Nil));
                } else {
                    l.handle_reply(now, r.id, Outcome::Reply(Reply::Int(0)));
                }
            }
            if let Some(t) = l.poll_timeout().filter(|_| idle) {
                assert!(t > now, "the deadline must move forward");
                now = t;
                l.handle_timeout(now);
            }
        }
        // Attempts at 0, 10 (delay 10) and 30 would pass the deadline: 2.
        assert_eq!(attempts, 2);
    }

    /// The token a request writes or compares against.
    fn token_of(r: &Request) -> String {
        match &r.command {
            Command::Set { value, .. } => value.clone(),
            Command::Eval { args, .. } => args[0].clone(),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Round 1 gets nothing; its undo gets no reply from master 0 (which
    /// may run it later, after round 2 was granted there); round 2 then
    /// runs under `me.1` and is granted under it. Without a missing undo
    /// reply the token stays; the mutant never changes it.
    fn second_round_token(one_token: bool, undo_answered_by_all: bool) -> (String, String) {
        let c = config(3, 1_000);
        let token = Token("me".into());
        let mut l = if one_token {
            Redlock::with_one_token_for_every_round(&c, token).unwrap()
        } else {
            Redlock::new(&c, token).unwrap()
        };
        l.acquire(Millis(0), Acquire::Until(Millis(10_000)))
            .unwrap();
        for r in drain(&mut l).0 {
            assert_eq!(token_of(&r), "me");
            l.handle_reply(Millis(1), r.id, Outcome::Unknown);
        }
        let undo = drain(&mut l).0;
        assert!(undo.iter().all(is_release) && undo.len() == 3);
        for r in &undo {
            assert_eq!(token_of(r), "me", "the undo is by the round's token");
            let outcome = if r.node == NodeId(0) && !undo_answered_by_all {
                Outcome::Unknown
            } else {
                Outcome::Reply(Reply::Int(0))
            };
            l.handle_reply(Millis(2), r.id, outcome);
        }
        let retry_at = l.poll_timeout().expect("backing off");
        l.handle_timeout(retry_at);
        let round = drain(&mut l).0;
        assert_eq!(round.len(), 3);
        let sent = token_of(&round[0]);
        assert!(round.iter().all(|r| token_of(r) == sent));
        for r in round {
            l.handle_reply(retry_at + 1, r.id, Outcome::Reply(Reply::ok()));
        }
        let lease = l.lease().expect("granted").token.0.to_string();
        (sent, lease)
    }

    #[test]
    fn a_retry_after_an_unanswered_undo_runs_under_a_new_token() {
        assert_eq!(
            second_round_token(false, false),
            ("me.1".to_owned(), "me.1".to_owned())
        );
        assert_eq!(
            second_round_token(false, true),
            ("me".to_owned(), "me".to_owned())
        );
        assert_eq!(
            second_round_token(true, false),
            ("me".to_owned(), "me".to_owned()),
            "the deliberate bug keeps the token"
        );
    }

    #[test]
    fn an_unanswered_release_gives_the_next_acquire_a_new_token() {
        let mut l = lock(3, 1_000);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        for r in drain(&mut l).0 {
            l.handle_reply(Millis(1), r.id, Outcome::Reply(Reply::ok()));
        }
        assert_eq!(l.lease().unwrap().token.as_str(), "me");
        l.release(Millis(2)).unwrap();
        let release = drain(&mut l).0;
        for r in &release {
            let outcome = if r.node == NodeId(2) {
                Outcome::Unknown
            } else {
                Outcome::Reply(Reply::Int(1))
            };
            l.handle_reply(Millis(3), r.id, outcome);
        }
        assert_eq!(l.token().as_str(), "me.1");
        l.acquire(Millis(4), Acquire::Once).unwrap();
        assert!(drain(&mut l).0.iter().all(|r| token_of(r) == "me.1"));
    }

    #[test]
    fn failed_extend_keeps_the_old_lease_until_it_runs_out() {
        let mut l = lock(3, 100);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        for r in drain(&mut l).0 {
            l.handle_reply(Millis(1), r.id, Outcome::Reply(Reply::ok()));
        }
        let Some(Event::Acquired(lease)) = drain(&mut l).1.pop() else {
            panic!("not acquired")
        };
        assert_eq!(lease.valid_until, Millis(97));
        l.extend(Millis(50)).unwrap();
        let (sent, _) = drain(&mut l);
        assert!(sent.iter().all(|r| matches!(
            &r.command,
            Command::Eval { script: Script::CompareAndPExpire, args, .. } if args == &["me", "100"]
        )));
        l.handle_reply(Millis(51), sent[0].id, Outcome::Reply(Reply::Int(1)));
        l.handle_reply(Millis(51), sent[1].id, Outcome::Reply(Reply::Int(0)));
        l.handle_reply(Millis(51), sent[2].id, Outcome::Unknown);
        let (sent, events) = drain(&mut l);
        assert_eq!(sent, [], "a failed extend must not release");
        assert_eq!(
            events,
            [Event::NotExtended {
                by: Extension::Extend
            }]
        );
        assert_eq!(l.lease(), Some(&lease));
        assert_eq!(l.poll_timeout(), Some(Millis(97)));
        l.handle_timeout(Millis(97));
        assert_eq!(drain(&mut l), (vec![], vec![Event::Lost]));
        assert_eq!(l.lease(), None);
    }

    #[test]
    fn successful_extend_measures_from_its_send_time() {
        let mut l = lock(3, 100);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        for r in drain(&mut l).0 {
            l.handle_reply(Millis(1), r.id, Outcome::Reply(Reply::ok()));
        }
        let _ = drain(&mut l);
        l.extend(Millis(60)).unwrap();
        let (sent, _) = drain(&mut l);
        l.handle_reply(Millis(62), sent[0].id, Outcome::Reply(Reply::Int(1)));
        l.handle_reply(Millis(62), sent[1].id, Outcome::Reply(Reply::Int(1)));
        l.handle_reply(Millis(62), sent[2].id, Outcome::Reply(Reply::Int(1)));
        let (_, events) = drain(&mut l);
        let Some(Event::Extended { lease, .. }) = events.first() else {
            panic!("{events:?}")
        };
        assert_eq!(lease.valid_until, Millis(60 + 97));
        assert_eq!(l.poll_timeout(), Some(Millis(157)));
    }

    #[test]
    fn release_counts_masters_that_deleted() {
        let mut l = lock(3, 100);
        l.acquire(Millis(0), Acquire::Once).unwrap();
        for r in drain(&mut l).0 {
            l.handle_reply(Millis(1), r.id, Outcome::Reply(Reply::ok()));
        }
        let _ = drain(&mut l);
        assert_eq!(
            l.acquire(Millis(2), Acquire::Once),
            Err(UsageError::AlreadyHeld)
        );
        l.release(Millis(5)).unwrap();
        assert_eq!(l.release(Millis(5)), Err(UsageError::Busy));
        let (sent, _) = drain(&mut l);
        assert!(sent.iter().all(is_release));
        l.handle_reply(Millis(6), sent[0].id, Outcome::Reply(Reply::Int(0)));
        l.handle_reply(
            Millis(6),
            sent[1].id,
            Outcome::Reply(Reply::Error("OOM".into())),
        );
        assert_eq!(drain(&mut l).1, []);
        l.handle_reply(Millis(6), sent[2].id, Outcome::Reply(Reply::Int(1)));
        assert_eq!(drain(&mut l).1, [Event::Released { was_held: true }]);
        assert_eq!(l.release(Millis(7)), Err(UsageError::NotHeld));
    }
}
