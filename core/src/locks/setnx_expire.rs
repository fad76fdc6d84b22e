//! `setnx-expire`: `SETNX key token`, then `EXPIRE key seconds` as a second,
//! separate step; a waiter that finds a key without TTL gives it one.
//!
//! ## Idea
//!
//! `setnx-del` deadlocks when its holder dies. The fix of the time was a
//! TTL: after winning the `SETNX`, the holder sets an expiry on the key, so
//! a dead holder's key disappears by itself. Because `SETNX` could not set
//! an expiry, that takes two commands, and a holder can die between them,
//! leaving a key with no TTL. So a waiter that finds the key taken asks for
//! its `TTL`; when the reply is -1 (no expiry) it sets the expiry itself,
//! the "repair", and the key will run out at last.
//!
//! ## Origin
//!
//! "Redis in Action", 6.2.5, `acquire_lock_with_timeout`:
//!
//! ```text
//! if conn.setnx(lockname, identifier):
//!     conn.expire(lockname, lock_timeout)
//!     return identifier
//! elif not conn.ttl(lockname):        # no expiry set
//!     conn.expire(lockname, lock_timeout)
//! time.sleep(.001)                    # and try again until the deadline
//! ```
//!
//! `EXPIRE` takes whole seconds, so the TTL is `ceil(ttl / 1000)` s. Release
//! is the book's `release_lock` (`WATCH`, `GET`, `MULTI DEL EXEC` when the
//! value is ours, else `UNWATCH`), shared with `setnx-del`; extend runs the
//! same sequence with `PEXPIRE`.
//!
//! ## Known failure
//!
//! The validity is measured from the send time of the `SETNX`:
//! `valid_until = sent_at + ttl − drift`. A holder that crashes between
//! `SETNX` and `EXPIRE` leaves a key with no TTL until some waiter's `TTL`
//! finds it and repairs it; only from then on does the countdown start, so
//! waiters lose up to one TTL more than the book suggests, but there is no
//! deadlock. A reply lost on the `EXPIRE` is handled the book's way (the
//! result of `EXPIRE` is ignored): the lock is held, perhaps without TTL,
//! until a waiter repairs it. Like every lease it fails mutual exclusion
//! when the holder pauses past its TTL.

use crate::config::{Config, ConfigError};
use crate::engine::{watch_begin, watch_step, Scaffold, Timer, WatchStep, Watched};
use crate::keyspace::{Command, Reply};
use crate::protocol::{
    Acquire, Event, Lease, NodeId, Outcome, Protocol, ProtocolError, Request, RequestId, Token,
    UsageError,
};
use crate::time::Millis;

// ---------------------------------------------------------------------------
// States.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Idle,
    /// `SETNX` in flight.
    Acquiring {
        req: RequestId,
        sent_at: Millis,
        how: Acquire,
    },
    /// `SETNX` won; the separate `EXPIRE` is in flight.
    Expiring {
        req: RequestId,
        sent_at: Millis,
    },
    /// `SETNX` lost; `TTL` is in flight.
    CheckingTtl {
        req: RequestId,
        how: Acquire,
    },
    /// The key had no TTL; the repairing `EXPIRE` is in flight.
    Repairing {
        req: RequestId,
        how: Acquire,
    },
    /// Taken; the retry timer is armed.
    BackingOff {
        how: Acquire,
    },
    Held {
        lease: Lease,
    },
    /// The watched `PEXPIRE` is in flight.
    Extending {
        req: RequestId,
        step: WatchStep,
        sent_at: Millis,
        lease: Lease,
    },
    /// The watched `DEL` is in flight.
    Releasing {
        req: RequestId,
        step: WatchStep,
        lease: Lease,
        then: Then,
    },
}

/// What follows a release.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Then {
    /// The application asked: report `Released`.
    Report,
    /// A grant is undone because its `EXPIRE` failed: report the error.
    Fail(ProtocolError),
}

/// The `setnx-expire` lock machine. Its driver must give it a connection of
/// its own: `WATCH` state lives on the connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetnxExpire {
    key: String,
    ttl_ms: u64,
    drift_ms: u64,
    token: Token,
    state: State,
    base: Scaffold,
}

impl SetnxExpire {
    /// A lock on `config.name` for the owner `token`. No automatic renewal
    /// (the book has none).
    pub fn new(config: &Config, token: Token) -> Result<SetnxExpire, ConfigError> {
        config.validate_single("setnx-expire")?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        Ok(SetnxExpire {
            key: config.key(),
            ttl_ms: config.ttl_ms,
            drift_ms: config.drift(),
            token,
            state: State::Idle,
            base: Scaffold::new(config.backoff(), config.reply_timeout_ms),
        })
    }

    fn send(&mut self, now: Millis, command: Command) -> RequestId {
        self.base.send(now, NodeId(0), Timer::Reply, command)
    }

    /// `EXPIRE key ceil(ttl / 1000)`: the book's whole seconds.
    fn expire_command(&self) -> Command {
        Command::Expire {
            key: self.key.clone(),
            seconds: self.ttl_ms.div_ceil(1_000) as i64,
        }
    }

    fn send_setnx(&mut self, now: Millis, how: Acquire) {
        let req = self.send(
            now,
            Command::SetNx {
                key: self.key.clone(),
                value: self.token.0.clone(),
            },
        );
        self.state = State::Acquiring {
            req,
            sent_at: now,
            how,
        };
    }

    fn lease_from(&self, sent_at: Millis) -> Lease {
        Lease {
            token: self.token.clone(),
            fence: None,
            valid_until: sent_at + (self.ttl_ms - self.drift_ms),
        }
    }

    fn hold(&mut self, lease: Lease) {
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        self.state = State::Held { lease };
    }

    fn go_idle(&mut self) {
        self.base.timers.clear_all();
        self.state = State::Idle;
    }

    fn fail(&mut self, error: ProtocolError) {
        self.go_idle();
        self.base.out.emit(Event::Failed(error));
    }

    fn retry_or_deny(&mut self, now: Millis, how: Acquire) {
        self.state = if self.base.retry_or_deny(now, how) {
            State::BackingOff { how }
        } else {
            State::Idle
        };
    }

    fn start_release(&mut self, now: Millis, lease: Lease, then: Then) {
        self.base.timers.clear_all();
        let (command, step) = watch_begin(&self.key);
        let req = self.send(now, command);
        self.state = State::Releasing {
            req,
            step,
            lease,
            then,
        };
    }

    /// Stay held on the old lease after an extend that did not go through.
    fn hold_on(&mut self, now: Millis, lease: Lease, event: Event) {
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return;
        }
        self.hold(lease);
        self.base.out.emit(event);
    }

    fn current_request(&self) -> Option<RequestId> {
        match &self.state {
            State::Acquiring { req, .. }
            | State::Expiring { req, .. }
            | State::CheckingTtl { req, .. }
            | State::Repairing { req, .. }
            | State::Extending { req, .. }
            | State::Releasing { req, .. } => Some(*req),
            State::Idle | State::BackingOff { .. } | State::Held { .. } => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Transitions.
// ---------------------------------------------------------------------------

impl Protocol for SetnxExpire {
    fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
        match self.state {
            State::Idle => {}
            State::Held { .. } => return Err(UsageError::AlreadyHeld),
            _ => return Err(UsageError::Busy),
        }
        self.base.backoff.reset();
        self.send_setnx(now, how);
        Ok(())
    }

    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &self.state {
            State::Held { lease } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        self.start_release(now, lease, Then::Report);
        Ok(())
    }

    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        let lease = match &self.state {
            State::Held { lease } => lease.clone(),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        let (command, step) = watch_begin(&self.key);
        let req = self.send(now, command);
        self.state = State::Extending {
            req,
            step,
            sent_at: now,
            lease,
        };
        Ok(())
    }

    fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        if self.current_request() != Some(id) {
            return;
        }
        self.base.timers.clear(Timer::Reply);
        let state = std::mem::replace(&mut self.state, State::Idle);
        match (state, outcome) {
            // Step one won: set the expiry as a second request.
            (State::Acquiring { sent_at, .. }, Outcome::Reply(Reply::Int(1))) => {
                let req = self.send(now, self.expire_command());
                self.state = State::Expiring { req, sent_at };
            }
            // Taken: does the key have a TTL?
            (State::Acquiring { how, .. }, Outcome::Reply(Reply::Int(0))) => {
                let req = self.send(
                    now,
                    Command::Ttl {
                        key: self.key.clone(),
                    },
                );
                self.state = State::CheckingTtl { req, how };
            }
            (State::Acquiring { how, .. }, Outcome::Unknown) => self.retry_or_deny(now, how),
            (State::Acquiring { .. }, Outcome::Reply(Reply::Error(e))) => {
                self.fail(ProtocolError::Redis(e));
            }
            (State::Acquiring { .. }, Outcome::Reply(reply)) => {
                self.fail(ProtocolError::UnexpectedReply {
                    request: "SETNX",
                    reply,
                });
            }
            // The book ignores what `EXPIRE` answers; so does an unknown
            // outcome: the key is ours, with a TTL or, at worst, until a
            // waiter repairs it.
            (State::Expiring { sent_at, .. }, Outcome::Reply(Reply::Int(_)) | Outcome::Unknown) => {
                let lease = self.lease_from(sent_at);
                self.hold(lease.clone());
                self.base.out.emit(Event::Acquired(lease));
            }
            (State::Expiring { sent_at, .. }, Outcome::Reply(reply)) => {
                // The key is ours but may have no TTL: undo the grant.
                let error = match reply {
                    Reply::Error(e) => ProtocolError::Redis(e),
                    reply => ProtocolError::UnexpectedReply {
                        request: "EXPIRE",
                        reply,
                    },
                };
                let lease = self.lease_from(sent_at);
                self.start_release(now, lease, Then::Fail(error));
            }
            // The book's repair: a key without expiry gets one.
            (State::CheckingTtl { how, .. }, Outcome::Reply(Reply::Int(-1))) => {
                let req = self.send(now, self.expire_command());
                self.state = State::Repairing { req, how };
            }
            (State::CheckingTtl { how, .. }, Outcome::Reply(Reply::Int(_)) | Outcome::Unknown) => {
                self.retry_or_deny(now, how);
            }
            (State::CheckingTtl { .. }, Outcome::Reply(Reply::Error(e))) => {
                self.fail(ProtocolError::Redis(e));
            }
            (State::CheckingTtl { .. }, Outcome::Reply(reply)) => {
                self.fail(ProtocolError::UnexpectedReply {
                    request: "TTL",
                    reply,
                });
            }
            (State::Repairing { how, .. }, Outcome::Reply(Reply::Int(_)) | Outcome::Unknown) => {
                self.retry_or_deny(now, how);
            }
            (State::Repairing { .. }, Outcome::Reply(Reply::Error(e))) => {
                self.fail(ProtocolError::Redis(e));
            }
            (State::Repairing { .. }, Outcome::Reply(reply)) => {
                self.fail(ProtocolError::UnexpectedReply {
                    request: "EXPIRE",
                    reply,
                });
            }
            (
                State::Extending {
                    step,
                    sent_at,
                    lease,
                    ..
                },
                Outcome::Reply(reply),
            ) => {
                let act = Command::PExpire {
                    key: self.key.clone(),
                    millis: self.ttl_ms as i64,
                };
                match watch_step(&self.key, &self.token.0, &act, step, reply) {
                    Watched::Send(command, step) => {
                        let req = self.send(now, command);
                        self.state = State::Extending {
                            req,
                            step,
                            sent_at,
                            lease,
                        };
                    }
                    Watched::Done { ours: true } => {
                        let lease = self.lease_from(sent_at);
                        self.hold(lease.clone());
                        self.base.out.emit(Event::Extended(lease));
                    }
                    Watched::Done { ours: false } => {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    }
                    Watched::Failed(e) => self.hold_on(now, lease, Event::Failed(e)),
                }
            }
            (State::Extending { lease, .. }, Outcome::Unknown) => {
                self.hold_on(now, lease, Event::NotExtended);
            }
            (
                State::Releasing {
                    step, lease, then, ..
                },
                Outcome::Reply(reply),
            ) => {
                let act = Command::Del {
                    keys: vec![self.key.clone()],
                };
                match watch_step(&self.key, &self.token.0, &act, step, reply) {
                    Watched::Send(command, step) => {
                        let req = self.send(now, command);
                        self.state = State::Releasing {
                            req,
                            step,
                            lease,
                            then,
                        };
                    }
                    Watched::Done { ours } => self.finish_release(ours, then),
                    Watched::Failed(e) => match then {
                        Then::Fail(cause) => self.fail(cause),
                        Then::Report => self.fail(e),
                    },
                }
            }
            // Whether the release ran is unknown; the TTL bounds the hold.
            (State::Releasing { then, .. }, Outcome::Unknown) => self.finish_release(false, then),
            (state, _) => self.state = state,
        }
    }

    fn handle_timeout(&mut self, now: Millis) {
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
                    self.send_setnx(now, how);
                }
                (Timer::Expiry, State::Held { .. } | State::Extending { .. }) => {
                    self.go_idle();
                    self.base.out.emit(Event::Lost);
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
        !matches!(self.state, State::Idle | State::Held { .. })
    }
}

impl SetnxExpire {
    fn finish_release(&mut self, ours: bool, then: Then) {
        self.go_idle();
        match then {
            Then::Report => self.base.out.emit(Event::Released { was_held: ours }),
            Then::Fail(e) => self.base.out.emit(Event::Failed(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{ConnId, Keyspace};
    use crate::protocol::testkit::{answer, drive, drop_requests, lease, run_until};

    fn config() -> Config {
        Config {
            ttl_ms: 2_000,
            drift_ms: Some(20),
            retry_base_ms: 100,
            retry_max_ms: 400,
            retry_jitter_percent: 0,
            ..Config::new("orders")
        }
    }

    fn lock(token: &str) -> SetnxExpire {
        SetnxExpire::new(&config(), Token(token.into())).unwrap()
    }

    fn ttl(redis: &mut Keyspace, now: Millis) -> Reply {
        redis.execute(
            ConnId(9),
            now,
            &Command::Ttl {
                key: "{orders}".into(),
            },
        )
    }

    #[test]
    fn acquire_is_setnx_then_a_separate_expire_in_whole_seconds() {
        let mut redis = Keyspace::new();
        let mut a = SetnxExpire::new(
            &Config {
                ttl_ms: 1_500,
                ..config()
            },
            Token("a".into()),
        )
        .unwrap();
        a.acquire(Millis(100), Acquire::Once).unwrap();
        let setnx = a.poll_transmit().unwrap();
        assert_eq!(
            setnx.command,
            Command::SetNx {
                key: "{orders}".into(),
                value: "a".into()
            }
        );
        let reply = redis.execute(ConnId(0), Millis(100), &setnx.command);
        a.handle_reply(Millis(105), setnx.id, Outcome::Reply(reply));
        assert_eq!(a.poll_event(), None, "not held before the EXPIRE step");
        let expire = a.poll_transmit().unwrap();
        assert_eq!(
            expire.command,
            Command::Expire {
                key: "{orders}".into(),
                seconds: 2
            }
        );
        let reply = redis.execute(ConnId(0), Millis(105), &expire.command);
        a.handle_reply(Millis(110), expire.id, Outcome::Reply(reply));
        // Validity from the SETNX send time: 100 + 1500 − 20.
        assert_eq!(a.poll_event(), Some(Event::Acquired(lease("a", 1_580))));
        assert_eq!(ttl(&mut redis, Millis(110)), Reply::Int(2));
    }

    #[test]
    fn a_second_client_is_excluded_and_gets_in_after_the_release() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(0)),
            [Event::Acquired(lease("a", 1_980))]
        );
        b.acquire(Millis(10), Acquire::Once).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(10)), [Event::Denied]);
        a.release(Millis(20)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(20)),
            [Event::Released { was_held: true }]
        );
        b.acquire(Millis(30), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(30)),
            [Event::Acquired(lease("b", 2_010))]
        );
    }

    #[test]
    fn the_hold_is_lost_at_valid_until_and_the_key_expires() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        assert_eq!(a.poll_timeout(), Some(Millis(1_980)));
        assert_eq!(
            run_until(&mut a, &mut redis, 0, Millis(1_980)),
            [Event::Lost]
        );
        assert_eq!(a.lease(), None);
        assert_eq!(a.poll_timeout(), None);
        b.acquire(Millis(2_001), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(2_001)),
            [Event::Acquired(lease("b", 3_981))]
        );
        // `a`'s late release finds nothing of its own.
        assert_eq!(a.release(Millis(2_002)), Err(UsageError::NotHeld));
    }

    #[test]
    fn a_waiter_retries_until_the_key_expires() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(0), Acquire::Until(Millis(5_000))).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(0)), []);
        let events = run_until(&mut b, &mut redis, 1, Millis(4_000));
        // Attempts at 0, 100, 300, 700, 1100, 1500, 1900, 2300: the key
        // expired at 2000 on the server.
        assert_eq!(events, [Event::Acquired(lease("b", 2_300 + 1_980))]);
    }

    #[test]
    fn retry_until_a_deadline_then_deny() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(0), Acquire::Until(Millis(500))).unwrap();
        drive(&mut b, &mut redis, 1, Millis(0));
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(10_000)),
            [Event::Denied]
        );
        assert!(!b.is_busy());
    }

    #[test]
    fn a_crash_between_setnx_and_expire_is_repaired_by_a_waiter() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        let setnx = a.poll_transmit().unwrap();
        assert_eq!(
            redis.execute(ConnId(0), Millis(0), &setnx.command),
            Reply::Int(1)
        );
        // `a` crashes before its EXPIRE: the key has no TTL.
        drop(a);
        assert_eq!(ttl(&mut redis, Millis(1)), Reply::Int(-1));
        let later = Millis(60_000);
        b.acquire(later, Acquire::Once).unwrap();
        let setnx = b.poll_transmit().unwrap();
        let reply = redis.execute(ConnId(1), later, &setnx.command);
        b.handle_reply(later, setnx.id, Outcome::Reply(reply));
        let ttl_req = b.poll_transmit().unwrap();
        assert_eq!(
            ttl_req.command,
            Command::Ttl {
                key: "{orders}".into()
            }
        );
        let reply = redis.execute(ConnId(1), later, &ttl_req.command);
        assert_eq!(reply, Reply::Int(-1));
        b.handle_reply(later, ttl_req.id, Outcome::Reply(reply));
        // The repair.
        assert_eq!(
            drive(&mut b, &mut redis, 1, later),
            [Event::Denied],
            "the repairing waiter does not take the lock itself"
        );
        assert_eq!(ttl(&mut redis, later), Reply::Int(2));
        // Once the repaired TTL runs out, the lock is free again.
        let free = later + 2_001;
        b.acquire(free, Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, free),
            [Event::Acquired(lease("b", free.0 + 1_980))]
        );
    }

    #[test]
    fn a_waiter_leaves_a_key_with_a_ttl_alone() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(10), Acquire::Once).unwrap();
        let requests: Vec<Command> = {
            let mut seen = Vec::new();
            while let Some(r) = b.poll_transmit() {
                seen.push(r.command.clone());
                let reply = redis.execute(ConnId(1), Millis(10), &r.command);
                b.handle_reply(Millis(10), r.id, Outcome::Reply(reply));
            }
            seen
        };
        assert_eq!(requests.len(), 2, "SETNX and TTL, no EXPIRE: {requests:?}");
        assert_eq!(b.poll_event(), Some(Event::Denied));
    }

    #[test]
    fn extend_resets_the_ttl_under_watch_and_moves_the_validity() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.extend(Millis(1_000)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1_000)),
            [Event::Extended(lease("a", 2_980))]
        );
        assert_eq!(a.poll_timeout(), Some(Millis(2_980)));
        let pttl = redis.execute(
            ConnId(9),
            Millis(1_000),
            &Command::PTtl {
                key: "{orders}".into(),
            },
        );
        assert_eq!(pttl, Reply::Int(2_000));
    }

    #[test]
    fn extend_after_the_key_was_taken_reports_lost_and_touches_nothing() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        // Server time runs ahead: the key expires while `a` thinks it holds.
        b.acquire(Millis(2_500), Acquire::Once).unwrap();
        drive(&mut b, &mut redis, 1, Millis(2_500));
        a.extend(Millis(1_500)).unwrap();
        assert_eq!(
            crate::protocol::testkit::drive_at(&mut a, &mut redis, 0, Millis(1_500), Millis(2_600)),
            [Event::Lost]
        );
        // `b`'s TTL was not touched: it still runs out at 4500.
        let pttl = redis.execute(
            ConnId(9),
            Millis(2_600),
            &Command::PTtl {
                key: "{orders}".into(),
            },
        );
        assert_eq!(pttl, Reply::Int(1_900));
    }

    #[test]
    fn an_extend_with_an_unknown_outcome_keeps_the_old_lease() {
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        a.extend(Millis(10)).unwrap();
        assert_eq!(
            answer(&mut a, Millis(10), Outcome::Unknown),
            [Event::NotExtended]
        );
        assert_eq!(a.lease(), Some(&lease("a", 1_980)));
        assert_eq!(a.poll_timeout(), Some(Millis(1_980)));
    }

    #[test]
    fn a_failed_expire_step_undoes_the_grant() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        let setnx = a.poll_transmit().unwrap();
        let reply = redis.execute(ConnId(0), Millis(0), &setnx.command);
        a.handle_reply(Millis(0), setnx.id, Outcome::Reply(reply));
        assert_eq!(
            answer(
                &mut a,
                Millis(0),
                Outcome::Reply(Reply::Error("ERR oom".into()))
            ),
            []
        );
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(1)),
            [Event::Failed(ProtocolError::Redis("ERR oom".into()))]
        );
        let exists = redis.execute(
            ConnId(9),
            Millis(1),
            &Command::Exists {
                keys: vec!["{orders}".into()],
            },
        );
        assert_eq!(exists, Reply::Int(0));
    }

    #[test]
    fn bad_config_and_empty_token_are_typed_errors() {
        assert_eq!(
            SetnxExpire::new(&config(), Token(String::new())),
            Err(ConfigError::EmptyToken)
        );
        assert_eq!(
            SetnxExpire::new(
                &Config {
                    ttl_ms: 0,
                    ..config()
                },
                Token("a".into())
            ),
            Err(ConfigError::ZeroTtl)
        );
        assert!(matches!(
            SetnxExpire::new(
                &Config {
                    drift_ms: Some(5_000),
                    ..config()
                },
                Token("a".into())
            ),
            Err(ConfigError::DriftNotBelowTtl { .. })
        ));
    }

    #[test]
    fn garbage_replies_fail_without_panicking() {
        // (replies that lead to the step under test, the garbage reply)
        let paths: [(&[Reply], Reply); 5] = [
            (&[], Reply::Bulk("x".into())),
            (&[Reply::Int(0)], Reply::Bulk("x".into())),
            (&[Reply::Int(0)], Reply::Error("WRONGTYPE".into())),
            (&[Reply::Int(0), Reply::Int(-1)], Reply::Nil),
            (&[], Reply::Array(vec![Reply::Nil])),
        ];
        for (before, garbage) in paths {
            let mut a = lock("a");
            a.acquire(Millis(0), Acquire::Once).unwrap();
            for reply in before {
                assert_eq!(answer(&mut a, Millis(0), Outcome::Reply(reply.clone())), []);
            }
            let events = answer(&mut a, Millis(0), Outcome::Reply(garbage.clone()));
            assert!(
                matches!(events.as_slice(), [Event::Failed(_)]),
                "{before:?} {garbage:?}: {events:?}"
            );
            assert!(!a.is_busy());
            assert_eq!(a.lease(), None);
        }
        // Garbage inside the watched extend keeps the hold.
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        a.extend(Millis(5)).unwrap();
        answer(&mut a, Millis(5), Outcome::Reply(Reply::ok()));
        answer(&mut a, Millis(5), Outcome::Reply(Reply::Bulk("a".into())));
        let events = answer(
            &mut a,
            Millis(5),
            Outcome::Reply(Reply::Array(vec![Reply::Bulk("?".into())])),
        );
        assert!(
            matches!(
                events.as_slice(),
                [Event::Failed(ProtocolError::UnexpectedReply {
                    request: "EXEC",
                    ..
                })]
            ),
            "{events:?}"
        );
        assert_eq!(a.lease(), Some(&lease("a", 1_980)));
        // Stale ids are ignored.
        let lost = drop_requests(&mut a);
        assert!(lost.is_empty());
        a.handle_reply(Millis(6), RequestId(0), Outcome::Reply(Reply::Int(0)));
        assert_eq!(a.poll_event(), None);
        assert!(!a.is_busy());
    }
}
