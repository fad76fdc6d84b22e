//! `reentrant`: a hash lock with a per-owner hold count and a watchdog that
//! renews the TTL at a third of it.
//!
//! ## Idea
//!
//! The lock is a hash at `{name}`: field = owner token, value = how many
//! times that owner has taken it. Three scripts keep it consistent:
//! the lock script creates the hash or increments the owner's count (when
//! the key is missing or already the owner's) and resets the TTL; the unlock
//! script decrements and deletes the key when the count reaches zero; the
//! renew script resets the TTL while the owner still has a field. So the
//! same owner may take the lock again while holding it (reentrancy), and a
//! holder that lives longer than the TTL keeps the lock by renewing it
//! ("watchdog") every `ttl / 3`, while a crashed holder's lock still runs out
//! after one TTL.
//!
//! ## Origin
//!
//! Redisson's `RLock` (`RedissonLock`): the three scripts are
//! [`Script::ReentrantLock`], [`Script::ReentrantUnlock`] and
//! [`Script::ReentrantRenew`], with `ARGV = [ttl, owner]`, and its
//! `lockWatchdogTimeout` renews at a third of the lease time.
//!
//! ## Choices
//!
//! - [`Protocol::acquire`] while this machine holds is allowed: it runs the
//!   lock script again and, on success, [`Reentrant::hold_count`] goes up and
//!   [`Event::Acquired`] carries the refreshed lease. When the reply says the
//!   key is someone else's, our hold is gone: [`Event::Lost`], then the
//!   acquire goes on as a fresh one (retry or [`Event::Denied`]).
//! - [`Protocol::release`] runs the unlock script once. Every successful
//!   unlock reports `Released { was_held: true }`, whether or not the count
//!   reached zero; [`Reentrant::hold_count`] and [`Protocol::lease`] say
//!   whether the lock is still held. An unlock with an unknown outcome is
//!   counted as done and reported `Released { was_held: false }`. When our
//!   count reaches zero but the unlock script answers that the server's has
//!   not (a lock script whose reply never came did run, or an unlock with an
//!   unknown outcome did not), the machine runs the unlock script again
//!   until the field is gone and only then reports the release, so no count
//!   of ours outlives the hold by a TTL.
//! - The watchdog (with `config.auto_renew`) fires at `send time + ttl / 3`
//!   after every grant or renewal. A renewal that succeeds reports
//!   [`Event::Extended`] (by [`Extension::Renewal`]) with
//!   `valid_until = renewal sent + ttl − drift`; one that finds no field
//!   reports [`Event::Lost`]; one with an unknown outcome reports
//!   [`Event::NotExtended`], keeps the old lease and tries again a third of
//!   a TTL later, and the hold is [`Event::Lost`] when its `valid_until`
//!   passes. [`Protocol::extend`] runs the renew script too, or, while a
//!   renewal is in flight, joins it: that renewal's reply then concludes
//!   the extend ([`Extension::Extend`]).
//! - A release is never blocked by a renewal in flight, and that renewal's
//!   reply is ignored once the release has started: a renewal answered
//!   after a release must not resurrect the hold (Redisson #7272). On the
//!   server the renew script cannot resurrect it either: it only sets a TTL
//!   on an owner's existing field.
//!
//! ## Known failure
//!
//! Renewal makes a pause or a GC stop worse, not better: the watchdog keeps
//! the lock while the holder is alive but stalled, and a holder that resumes
//! after its TTL ran out (the `pause` fault) still believes it holds, as
//! with every lease. Without fencing the resource cannot tell.
//!
//! ## Why it does not run on the engine
//!
//! The single-node locks are recipes on one engine with one operation in
//! flight; this lock counts nested holds and keeps a background renewal in
//! flight beside the application's own acquire or release (with a reply
//! timer of its own), which that one-operation state machine cannot express.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: reentrant-lock → nil (count + 1)
//!     Acquiring --> Backoff: reentrant-lock → PTTL (someone else's)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: acquire again, count + 1
//!     Held --> Held: watchdog every ttl/3, reentrant-renew → 1 / Extended
//!     Held --> [*]: reentrant-renew → 0 / Lost
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Held: release, reentrant-unlock → 0 (count still above 0)
//!     Held --> [*]: release, reentrant-unlock → 1 (key deleted) / Released
//! ```

use crate::config::{Config, ConfigError};
use crate::engine::{retry_at, Scaffold, Timer};
use crate::keyspace::script::release_args;
use crate::keyspace::{Command, Reply, Script};
use crate::protocol::{
    Acquire, Event, Extension, Lease, NodeId, Outcome, Protocol, ProtocolError, Request, RequestId,
    Token, UsageError,
};
use crate::time::Millis;

// ---------------------------------------------------------------------------
// States.
// ---------------------------------------------------------------------------

/// What this machine holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Hold {
    lease: Lease,
    /// How many acquires are not yet released (≥ 1).
    count: u32,
}

/// The operation the application started.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Doing {
    Idle,
    /// The lock script is in flight.
    Acquiring {
        req: RequestId,
        sent_at: Millis,
        how: Acquire,
    },
    /// Taken; the retry timer is armed.
    BackingOff {
        how: Acquire,
    },
    /// A manual extend (the renew script) is in flight.
    Extending {
        req: RequestId,
        sent_at: Millis,
    },
    /// The unlock script is in flight.
    Releasing {
        req: RequestId,
        sent_at: Millis,
        /// Our count has reached zero but the server's had not: a lock
        /// script whose reply never came did run. Unlock again until the
        /// field is gone.
        draining: bool,
    },
}

/// An automatic renewal in flight, beside whatever the application does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Renewal {
    req: RequestId,
    sent_at: Millis,
}

/// The `reentrant` lock machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reentrant {
    key: String,
    ttl_ms: u64,
    drift_ms: u64,
    auto_renew: bool,
    notify_releases: bool,
    token: Token,
    hold: Option<Hold>,
    op: Doing,
    renewal: Option<Renewal>,
    base: Scaffold,
}

impl Reentrant {
    /// A lock on `config.name` for the owner `token`; the watchdog renews at
    /// TTL/3 when `config.auto_renew` is set.
    pub fn new(config: &Config, token: Token) -> Result<Reentrant, ConfigError> {
        config.validate_single("reentrant")?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        Ok(Reentrant {
            key: config.key(),
            ttl_ms: config.ttl_ms,
            drift_ms: config.drift(),
            auto_renew: config.auto_renew,
            notify_releases: config.notify_releases,
            token,
            hold: None,
            op: Doing::Idle,
            renewal: None,
            base: Scaffold::new(config.backoff(), config.reply_timeout_ms),
        })
    }

    /// How many acquires of this machine are not yet released (0 when not
    /// held).
    pub fn hold_count(&self) -> u32 {
        self.hold.as_ref().map_or(0, |h| h.count)
    }

    fn send(&mut self, now: Millis, reply_timer: Timer, script: Script) -> RequestId {
        let args = vec![self.ttl_ms.to_string(), self.token.0.to_string()];
        let args = match script {
            Script::ReentrantUnlock => release_args(args, self.notify_releases),
            _ => args,
        };
        self.base.send(
            now,
            NodeId(0),
            reply_timer,
            Command::Eval {
                script,
                keys: vec![self.key.clone()],
                args,
            },
        )
    }

    fn send_lock(&mut self, now: Millis, how: Acquire) {
        let req = self.send(now, Timer::Reply, Script::ReentrantLock);
        self.op = Doing::Acquiring {
            req,
            sent_at: now,
            how,
        };
    }

    fn send_unlock(&mut self, now: Millis, sent_at: Millis, draining: bool) {
        let req = self.send(now, Timer::Reply, Script::ReentrantUnlock);
        self.op = Doing::Releasing {
            req,
            sent_at,
            draining,
        };
    }

    fn valid_from(&self, sent_at: Millis) -> Millis {
        sent_at + (self.ttl_ms - self.drift_ms)
    }

    /// Arm the hold's timers: expiry at its validity, the watchdog a third
    /// of a TTL after `renew_from`.
    fn arm(&mut self, renew_from: Millis) {
        if let Some(hold) = &self.hold {
            self.base.timers.set(Timer::Expiry, hold.lease.valid_until);
            if self.auto_renew {
                self.base
                    .timers
                    .set(Timer::Renew, renew_from + (self.ttl_ms / 3).max(1));
            }
        }
    }

    /// Forget any automatic renewal in flight: its reply will be ignored.
    fn cancel_renewal(&mut self) {
        self.renewal = None;
        self.base.timers.clear(Timer::Renew);
        self.base.timers.clear(Timer::RenewReply);
    }

    /// The hold is gone (released, lost or expired).
    fn drop_hold(&mut self) {
        self.hold = None;
        self.cancel_renewal();
        self.base.timers.clear(Timer::Expiry);
    }

    fn lose(&mut self) {
        self.drop_hold();
        self.base.out.emit(Event::Lost);
    }

    fn retry_or_deny(&mut self, now: Millis, how: Acquire) {
        self.base.timers.clear(Timer::Retry);
        match retry_at(&mut self.base.backoff, now, how) {
            Some(at) => {
                self.base.timers.set(Timer::Retry, at);
                self.op = Doing::BackingOff { how };
            }
            None => {
                self.op = Doing::Idle;
                self.base.out.emit(Event::Denied);
            }
        }
    }

    fn op_request(&self) -> Option<RequestId> {
        match self.op {
            Doing::Acquiring { req, .. }
            | Doing::Extending { req, .. }
            | Doing::Releasing { req, .. } => Some(req),
            Doing::Idle | Doing::BackingOff { .. } => None,
        }
    }

    fn unexpected(request: &'static str, reply: Reply) -> ProtocolError {
        match reply {
            Reply::Error(e) => ProtocolError::Redis(e),
            reply => ProtocolError::UnexpectedReply { request, reply },
        }
    }
}

// ---------------------------------------------------------------------------
// Transitions.
// ---------------------------------------------------------------------------

impl Reentrant {
    fn on_lock_reply(&mut self, now: Millis, sent_at: Millis, how: Acquire, outcome: Outcome) {
        match outcome {
            // Granted: a new hold, or one more on ours.
            Outcome::Reply(Reply::Nil) => {
                self.op = Doing::Idle;
                let fresh = self.valid_from(sent_at);
                let hold = match self.hold.take() {
                    Some(Hold { lease, count }) => Hold {
                        lease: Lease {
                            valid_until: lease.valid_until.max(fresh),
                            ..lease
                        },
                        count: count.saturating_add(1),
                    },
                    None => Hold {
                        lease: Lease {
                            token: self.token.clone(),
                            fence: None,
                            valid_until: fresh,
                        },
                        count: 1,
                    },
                };
                let lease = hold.lease.clone();
                self.hold = Some(hold);
                if self.renewal.is_none() {
                    self.arm(sent_at);
                } else {
                    self.base.timers.set(Timer::Expiry, lease.valid_until);
                }
                self.base.out.emit(Event::Acquired(lease));
            }
            // Taken (the reply is the key's PTTL). If we thought we held it,
            // our field is gone: the hold is lost.
            Outcome::Reply(Reply::Int(_)) => {
                if self.hold.is_some() {
                    self.lose();
                }
                self.retry_or_deny(now, how);
            }
            Outcome::Unknown => self.retry_or_deny(now, how),
            Outcome::Reply(reply) => {
                self.op = Doing::Idle;
                self.base
                    .out
                    .emit(Event::Failed(Self::unexpected("reentrant-lock", reply)));
            }
        }
    }

    fn on_unlock_reply(&mut self, now: Millis, sent_at: Millis, outcome: Outcome) {
        self.op = Doing::Idle;
        let (deleted, was_held) = match outcome {
            Outcome::Reply(Reply::Nil) => {
                self.drop_hold();
                self.base.out.emit(Event::Released { was_held: false });
                return;
            }
            Outcome::Reply(Reply::Int(1)) => (true, true),
            Outcome::Reply(Reply::Int(0)) => (false, true),
            Outcome::Unknown => (false, false),
            Outcome::Reply(reply) => {
                // Nothing is known to have changed: the hold stands.
                self.rearm_after_release(now, now);
                self.base
                    .out
                    .emit(Event::Failed(Self::unexpected("reentrant-unlock", reply)));
                return;
            }
        };
        let count = self.hold_count().saturating_sub(1);
        match &mut self.hold {
            Some(hold) if !deleted && count > 0 => {
                hold.count = count;
                self.rearm_after_release(now, sent_at);
            }
            _ => {
                self.drop_hold();
                if was_held && !deleted {
                    // Ours is zero, the server's is not: a lock script with
                    // an unknown outcome ran. Take the rest off too.
                    self.send_unlock(now, sent_at, true);
                    return;
                }
            }
        }
        self.base.out.emit(Event::Released { was_held });
    }

    /// A further unlock after ours reached zero: until the field is gone
    /// (`1`, or nil when its TTL or a restart took it first), or the reply
    /// is lost (the TTL removes what is left).
    fn on_drain_reply(&mut self, now: Millis, sent_at: Millis, outcome: Outcome) {
        match outcome {
            Outcome::Reply(Reply::Int(0)) => self.send_unlock(now, sent_at, true),
            Outcome::Reply(Reply::Int(_) | Reply::Nil) | Outcome::Unknown => {
                self.base.out.emit(Event::Released { was_held: true });
            }
            Outcome::Reply(reply) => {
                self.base
                    .out
                    .emit(Event::Failed(Self::unexpected("reentrant-unlock", reply)));
            }
        }
    }

    /// After a release that left the hold in place, the timers it cleared
    /// resume (the watchdog counting from `renew_from`).
    fn rearm_after_release(&mut self, now: Millis, renew_from: Millis) {
        if self
            .hold
            .as_ref()
            .is_some_and(|h| now >= h.lease.valid_until)
        {
            self.lose();
            return;
        }
        self.arm(renew_from);
    }

    /// A renew script reply, from the watchdog or a manual extend.
    fn on_renew_reply(&mut self, now: Millis, sent_at: Millis, by: Extension, outcome: Outcome) {
        let Some(old) = self.hold.as_ref().map(|h| h.lease.valid_until) else {
            return;
        };
        let failure = match outcome {
            Outcome::Reply(Reply::Int(1)) => {
                let valid_until = old.max(self.valid_from(sent_at));
                let lease = self.hold.as_mut().map(|h| {
                    h.lease.valid_until = valid_until;
                    h.lease.clone()
                });
                self.arm(sent_at);
                if let Some(lease) = lease {
                    self.base.out.emit(Event::Extended { lease, by });
                }
                return;
            }
            Outcome::Reply(Reply::Int(0)) => return self.lose(),
            Outcome::Unknown => Event::NotExtended { by },
            Outcome::Reply(reply) => {
                let error = Self::unexpected("reentrant-renew", reply);
                match by {
                    Extension::Extend => Event::Failed(error),
                    Extension::Renewal => Event::RenewalFailed(error),
                }
            }
        };
        // The old lease stands until its validity; try again later, before
        // it runs out.
        if now >= old {
            return self.lose();
        }
        self.arm(now);
        if self.auto_renew {
            let at = crate::engine::renewal_retry_at(now, old, self.ttl_ms);
            self.base.timers.set(Timer::Renew, at);
        }
        self.base.out.emit(failure);
    }
}

impl Protocol for Reentrant {
    /// Also allowed while held: takes the lock once more.
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        if self.op != Doing::Idle {
            return Err(UsageError::Busy);
        }
        self.base.backoff.reset();
        self.send_lock(now, how);
        Ok(())
    }

    /// Undoes one acquire; an automatic renewal in flight does not block it.
    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        if self.op != Doing::Idle {
            return Err(UsageError::Busy);
        }
        if self.hold.is_none() {
            return Err(UsageError::NotHeld);
        }
        self.cancel_renewal();
        self.base.timers.clear(Timer::Expiry);
        self.send_unlock(now, now, false);
        Ok(())
    }

    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        if self.op != Doing::Idle {
            return Err(UsageError::Busy);
        }
        if self.hold.is_none() {
            return Err(UsageError::NotHeld);
        }
        // Join the watchdog's renewal in flight: its reply concludes this
        // extend.
        if let Some(Renewal { req, sent_at }) = self.renewal.take() {
            if let Some(deadline) = self.base.timers.get(Timer::RenewReply) {
                self.base.timers.set(Timer::Reply, deadline);
            }
            self.base.timers.clear(Timer::RenewReply);
            self.op = Doing::Extending { req, sent_at };
            return Ok(());
        }
        self.cancel_renewal();
        let req = self.send(now, Timer::Reply, Script::ReentrantRenew);
        self.op = Doing::Extending { req, sent_at: now };
        Ok(())
    }

    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        if let Some(renewal) = self.renewal.as_ref().filter(|r| r.req == id) {
            let sent_at = renewal.sent_at;
            self.renewal = None;
            self.base.timers.clear(Timer::RenewReply);
            self.on_renew_reply(now, sent_at, Extension::Renewal, outcome);
            return;
        }
        if self.op_request() != Some(id) {
            return;
        }
        self.base.timers.clear(Timer::Reply);
        match std::mem::replace(&mut self.op, Doing::Idle) {
            Doing::Acquiring { sent_at, how, .. } => self.on_lock_reply(now, sent_at, how, outcome),
            Doing::Releasing {
                sent_at, draining, ..
            } => {
                if draining {
                    self.on_drain_reply(now, sent_at, outcome);
                } else {
                    self.on_unlock_reply(now, sent_at, outcome);
                }
            }
            Doing::Extending { sent_at, .. } => {
                self.on_renew_reply(now, sent_at, Extension::Extend, outcome);
            }
            op @ (Doing::Idle | Doing::BackingOff { .. }) => self.op = op,
        }
    }

    fn handle_timeout(&mut self, now: Millis) {
        let due = self.base.due(now);
        for timer in due {
            match timer {
                Timer::Reply => {
                    if let Some(req) = self.op_request() {
                        self.handle_reply(now, req, Outcome::Unknown);
                    }
                }
                Timer::RenewReply => {
                    if let Some(req) = self.renewal.as_ref().map(|r| r.req) {
                        self.handle_reply(now, req, Outcome::Unknown);
                    }
                }
                Timer::Retry => {
                    if let Doing::BackingOff { how } = self.op {
                        self.send_lock(now, how);
                    }
                }
                Timer::Expiry if self.hold.is_some() => {
                    // A manual extend still in flight can no longer help.
                    if matches!(self.op, Doing::Extending { .. }) {
                        self.op = Doing::Idle;
                        self.base.timers.clear(Timer::Reply);
                    }
                    self.lose();
                }
                Timer::Renew if self.hold.is_some() && self.renewal.is_none() => {
                    let req = self.send(now, Timer::RenewReply, Script::ReentrantRenew);
                    self.renewal = Some(Renewal { req, sent_at: now });
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
        self.hold.as_ref().map(|h| &h.lease)
    }

    /// An application operation is in flight; a background renewal does not
    /// count (it blocks nothing).
    fn is_busy(&self) -> bool {
        self.op != Doing::Idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{ConnId, Keyspace};
    use crate::protocol::testkit::{answer, drive, drop_requests, lease, run_until};

    fn config(auto_renew: bool) -> Config {
        Config {
            ttl_ms: 3_000,
            drift_ms: Some(30),
            retry_base_ms: 100,
            retry_max_ms: 100,
            retry_jitter_percent: 0,
            auto_renew,
            ..Config::new("orders")
        }
    }

    fn lock(token: &str, auto_renew: bool) -> Reentrant {
        Reentrant::new(&config(auto_renew), Token(token.into())).unwrap()
    }

    fn count_on_server(redis: &mut Keyspace, owner: &str, now: Millis) -> Reply {
        redis.execute(
            ConnId(9),
            now,
            &Command::HGet {
                key: "{orders}".into(),
                field: owner.into(),
            },
        )
    }

    #[test]
    fn acquire_writes_a_count_of_one_and_a_second_owner_is_denied() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a", false), lock("b", false));
        a.acquire(Millis(100), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(100)),
            [Event::Acquired(lease("a", 3_070))]
        );
        assert_eq!(a.hold_count(), 1);
        assert_eq!(
            count_on_server(&mut redis, "a", Millis(100)),
            Reply::Bulk("1".into())
        );
        b.acquire(Millis(200), Acquire::Once).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(200)), [Event::Denied]);
        assert_eq!(b.hold_count(), 0);
        assert_eq!(b.lease(), None);
    }

    #[test]
    fn a_reenter_that_ran_without_a_reply_is_taken_off_by_the_last_release() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", false);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        // The second lock script runs on the server; its reply is lost.
        a.acquire(Millis(100), Acquire::Once).unwrap();
        let request = a.poll_transmit().expect("the lock script");
        redis.execute(ConnId(0), Millis(100), &request.command);
        a.handle_reply(Millis(100), request.id, Outcome::Unknown);
        assert_eq!(
            std::iter::from_fn(|| a.poll_event()).collect::<Vec<_>>(),
            [Event::Denied]
        );
        assert_eq!(a.hold_count(), 1, "ours did not count it");
        assert_eq!(
            count_on_server(&mut redis, "a", Millis(100)),
            Reply::Bulk("2".into())
        );
        // Our last release unlocks until the server's count is gone too.
        a.release(Millis(200)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(200)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.hold_count(), 0);
        assert_eq!(count_on_server(&mut redis, "a", Millis(200)), Reply::Nil);
        let mut b = lock("b", false);
        b.acquire(Millis(300), Acquire::Once).unwrap();
        assert!(matches!(
            drive(&mut b, &mut redis, 1, Millis(300))[..],
            [Event::Acquired(_)]
        ));
    }

    #[test]
    fn acquire_twice_then_release_twice() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", false);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.acquire(Millis(1_000), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_000)),
            [Event::Acquired(lease("a", 3_970))],
            "the second grant reset the TTL"
        );
        assert_eq!(a.hold_count(), 2);
        assert_eq!(
            count_on_server(&mut redis, "a", Millis(1_000)),
            Reply::Bulk("2".into())
        );
        a.release(Millis(1_100)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_100)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.hold_count(), 1);
        assert!(a.lease().is_some());
        assert_eq!(
            count_on_server(&mut redis, "a", Millis(1_100)),
            Reply::Bulk("1".into())
        );
        a.release(Millis(1_200)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_200)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.hold_count(), 0);
        assert_eq!(a.lease(), None);
        assert_eq!(a.poll_timeout(), None);
        assert_eq!(count_on_server(&mut redis, "a", Millis(1_200)), Reply::Nil);
        assert_eq!(a.release(Millis(1_300)), Err(UsageError::NotHeld));
    }

    #[test]
    fn without_renewal_the_hold_expires_and_the_next_owner_gets_in() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a", false), lock("b", false));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        assert_eq!(a.poll_timeout(), Some(Millis(2_970)));
        assert_eq!(
            run_until(&mut a, &mut redis, 0, Millis(5_000)),
            [Event::Lost]
        );
        assert_eq!(a.hold_count(), 0);
        b.acquire(Millis(0), Acquire::Until(Millis(10_000)))
            .unwrap();
        drive(&mut b, &mut redis, 1, Millis(0));
        // Retries every 100 ms; the key expires after 3000 on the server.
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(3_200)),
            [Event::Acquired(lease("b", 3_100 + 2_970))]
        );
        // `a`'s late release finds nothing.
        assert_eq!(a.release(Millis(3_300)), Err(UsageError::NotHeld));
    }

    #[test]
    fn retry_until_the_deadline_then_deny() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a", false), lock("b", false));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(0), Acquire::Until(Millis(450))).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(0)), []);
        assert_eq!(b.poll_timeout(), Some(Millis(100)));
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(10_000)),
            [Event::Denied]
        );
        assert!(!b.is_busy());
        assert_eq!(b.poll_timeout(), None);
    }

    #[test]
    fn the_watchdog_keeps_the_lock_alive_past_its_ttl() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a", true), lock("b", false));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        assert_eq!(a.poll_timeout(), Some(Millis(1_000)), "renewal at ttl/3");
        let events = run_until(&mut a, &mut redis, 0, Millis(10_000));
        let expected: Vec<Event> = (1..=10)
            .map(|i| Event::Extended {
                lease: lease("a", i * 1_000 + 2_970),
                by: Extension::Renewal,
            })
            .collect();
        assert_eq!(events, expected);
        assert_eq!(
            a.poll_timeout(),
            Some(Millis(11_000)),
            "the deadline moved on"
        );
        b.acquire(Millis(10_500), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(10_500)),
            [Event::Denied]
        );
        a.release(Millis(10_600)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(10_600)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.poll_timeout(), None, "the watchdog stops with the hold");
    }

    #[test]
    fn a_renewal_answered_after_the_release_does_not_resurrect_the_hold() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", true);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.handle_timeout(Millis(1_000));
        let renewal = a.poll_transmit().expect("the watchdog renews");
        // The release is not blocked by the renewal in flight.
        assert!(!a.is_busy());
        a.release(Millis(1_001)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_001)),
            [Event::Released { was_held: true }]
        );
        // The renewal reaches the server late, and its reply the client.
        let reply = redis.execute(ConnId(0), Millis(1_002), &renewal.command);
        assert_eq!(reply, Reply::Int(0), "no field, no TTL set");
        a.handle_reply(Millis(1_003), renewal.id, Outcome::Reply(Reply::Int(1)));
        assert_eq!(a.poll_event(), None);
        assert_eq!(a.lease(), None);
        assert_eq!(a.hold_count(), 0);
        assert_eq!(a.poll_timeout(), None);
        let exists = redis.execute(
            ConnId(9),
            Millis(1_003),
            &Command::Exists {
                keys: vec!["{orders}".into()],
            },
        );
        assert_eq!(exists, Reply::Int(0));
    }

    #[test]
    fn a_renewal_in_flight_during_a_partial_release_is_replaced_by_a_new_one() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", true);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.acquire(Millis(10), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(10));
        // The second grant moved the watchdog to 10 + 1000.
        assert_eq!(a.poll_timeout(), Some(Millis(1_010)));
        a.handle_timeout(Millis(1_010));
        let stale = drop_requests(&mut a);
        assert_eq!(stale.len(), 1);
        a.release(Millis(1_011)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_011)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.hold_count(), 1);
        a.handle_reply(Millis(1_012), stale[0].id, Outcome::Unknown);
        assert_eq!(a.poll_event(), None, "the old renewal is forgotten");
        assert_eq!(
            a.poll_timeout(),
            Some(Millis(2_011)),
            "the watchdog goes on"
        );
    }

    #[test]
    fn a_renewal_that_finds_no_field_reports_lost() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", true);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        redis.execute(
            ConnId(9),
            Millis(500),
            &Command::Del {
                keys: vec!["{orders}".into()],
            },
        );
        assert_eq!(
            run_until(&mut a, &mut redis, 0, Millis(1_000)),
            [Event::Lost]
        );
        assert_eq!(a.lease(), None);
        assert_eq!(a.poll_timeout(), None);
    }

    #[test]
    fn unknown_renewals_keep_the_old_lease_until_it_runs_out() {
        let mut a = lock("a", true);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Nil));
        let mut events = Vec::new();
        while let Some(t) = a.poll_timeout() {
            a.handle_timeout(t);
            while let Some(r) = a.poll_transmit() {
                a.handle_reply(t, r.id, Outcome::Unknown);
            }
            events.extend(std::iter::from_fn(|| a.poll_event()));
        }
        let not_extended = Event::NotExtended {
            by: Extension::Renewal,
        };
        assert_eq!(
            events,
            [
                not_extended.clone(),
                not_extended.clone(),
                not_extended.clone(),
                not_extended,
                Event::Lost
            ],
            "tries at 1000, then halfway to the lease's end but at least a \
             twelfth of a TTL apart: 1985, 2477, 2727; lost at 2970"
        );
        assert_eq!(a.lease(), None);
    }

    #[test]
    fn manual_extend_runs_the_renew_script() {
        let mut redis = Keyspace::new();
        let mut a = lock("a", false);
        assert_eq!(a.extend(Millis(0)), Err(UsageError::NotHeld));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.extend(Millis(2_000)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(2_000)),
            [Event::Extended {
                lease: lease("a", 4_970),
                by: Extension::Extend
            }]
        );
        let pttl = redis.execute(
            ConnId(9),
            Millis(4_000),
            &Command::PTtl {
                key: "{orders}".into(),
            },
        );
        assert_eq!(pttl, Reply::Int(1_000));
    }

    #[test]
    fn reacquiring_a_lost_hold_reports_lost_then_denied() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a", false), lock("b", false));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        // The server clock runs ahead: the key expires and `b` takes it.
        b.acquire(Millis(3_500), Acquire::Once).unwrap();
        drive(&mut b, &mut redis, 1, Millis(3_500));
        a.acquire(Millis(1_000), Acquire::Once).unwrap();
        assert_eq!(
            crate::protocol::testkit::drive_at(&mut a, &mut redis, 0, Millis(1_000), Millis(3_600)),
            [Event::Lost, Event::Denied]
        );
        assert_eq!(a.hold_count(), 0);
    }

    #[test]
    fn bad_config_and_empty_token_are_typed_errors() {
        assert_eq!(
            Reentrant::new(&config(true), Token::new("")),
            Err(ConfigError::EmptyToken)
        );
        assert!(matches!(
            Reentrant::new(
                &Config {
                    ttl_ms: u64::MAX,
                    ..config(true)
                },
                Token("a".into())
            ),
            Err(ConfigError::TtlTooLarge { .. })
        ));
        assert!(matches!(
            Reentrant::new(
                &Config {
                    nodes: 2,
                    ..config(true)
                },
                Token("a".into())
            ),
            Err(ConfigError::SingleNodeOnly { .. })
        ));
    }

    #[test]
    fn garbage_replies_fail_without_panicking_and_stale_ids_are_ignored() {
        // Acquire.
        for garbage in [
            Reply::Bulk("OK".into()),
            Reply::Array(vec![]),
            Reply::Error("NOSCRIPT".into()),
        ] {
            let mut a = lock("a", true);
            a.acquire(Millis(0), Acquire::Once).unwrap();
            let events = answer(&mut a, Millis(0), Outcome::Reply(garbage.clone()));
            assert!(
                matches!(events.as_slice(), [Event::Failed(_)]),
                "{garbage:?}: {events:?}"
            );
            assert!(!a.is_busy());
            assert_eq!(a.lease(), None);
        }
        // Release and renewal: the hold stands.
        let mut a = lock("a", true);
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Nil));
        a.release(Millis(10)).unwrap();
        let events = answer(&mut a, Millis(10), Outcome::Reply(Reply::Int(7)));
        assert!(
            matches!(events.as_slice(), [Event::Failed(_)]),
            "{events:?}"
        );
        assert_eq!(a.hold_count(), 1);
        a.handle_timeout(Millis(1_010));
        let events = answer(
            &mut a,
            Millis(1_010),
            Outcome::Reply(Reply::Bulk("1".into())),
        );
        assert!(
            matches!(
                events.as_slice(),
                [Event::RenewalFailed(ProtocolError::UnexpectedReply {
                    request: "reentrant-renew",
                    ..
                })]
            ),
            "{events:?}"
        );
        assert_eq!(a.lease(), Some(&lease("a", 2_970)));
        a.handle_reply(Millis(1_011), RequestId(0), Outcome::Reply(Reply::Nil));
        a.handle_reply(Millis(1_011), RequestId(77), Outcome::Reply(Reply::Int(0)));
        assert_eq!(a.poll_event(), None);
        assert_eq!(a.hold_count(), 1);
    }
}
