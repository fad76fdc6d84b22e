//! `setnx-getset`: the value is the holder's expiry timestamp, taken from the
//! client's clock; an expired lock is taken over with `GETSET`.
//!
//! ## Idea
//!
//! Before `SET NX PX` existed, the `SETNX` documentation page gave a recipe
//! for a lock that survives a crashed holder without any server-side TTL:
//! the value stored is `current time + lock timeout + 1`, and everyone can
//! tell from it whether the holder's time is up. A client that finds the key
//! taken reads the timestamp; when it lies in the past (by the reader's own
//! clock), the reader takes the lock over with `GETSET key new_timestamp`.
//! `GETSET` returns the value it replaced: if that is still an expired
//! timestamp, nobody beat the reader to it and it holds the lock; if it is a
//! fresh one, another client took it over first, and the reader backs off
//! (having pushed the winner's timestamp a little later, which the recipe
//! accepts as harmless).
//!
//! ## Origin
//!
//! The old redis.io page for `SETNX`, "Handling deadlocks":
//! `SETNX lock.foo <current Unix time + lock timeout + 1>`; on 0, `GET
//! lock.foo`; if expired, `GETSET lock.foo <current Unix time + lock timeout
//! + 1>` and check the old value; release by `DEL` only "if the lock is
//!   still valid", i.e. before the holder's own timeout.
//!
//! Timestamps here are milliseconds of the clock passed in as `now`. For
//! this protocol `now` must be a clock that all clients share, such as Unix
//! time, since one client reads the timestamps another wrote: the protocol's
//! premise and its weakness. The token is not stored; the timestamp
//! identifies the holder.
//!
//! ## Known failure
//!
//! Safety rests on synchronised client clocks. A client whose clock runs
//! ahead of the holder's by more than the holder's remaining time sees the
//! holder's timestamp as expired, takes the lock over, and both believe
//! they hold it (`client-skew` breaks `mutual-exclusion`). The same happens
//! when a holder pauses past its own timestamp. The release's owner check is
//! by time only: a holder whose clock runs behind the others can `DEL` a
//! successor's lock. A `GETSET` that loses the takeover race has still
//! overwritten the winner's timestamp with its own.

use crate::config::{Config, ConfigError};
use crate::engine::{Scaffold, Timer};
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
    /// `SETNX key ts` in flight.
    Acquiring {
        req: RequestId,
        ts: u64,
        how: Acquire,
    },
    /// `SETNX` lost; `GET key` in flight.
    Reading {
        req: RequestId,
        how: Acquire,
    },
    /// The stored timestamp had passed; `GETSET key ts` in flight.
    TakingOver {
        req: RequestId,
        ts: u64,
        how: Acquire,
    },
    /// Taken; the retry timer is armed.
    BackingOff {
        how: Acquire,
    },
    /// Ours until `ts` by our clock.
    Held {
        lease: Lease,
        ts: u64,
    },
    /// `GETSET key new_ts` in flight.
    Extending {
        req: RequestId,
        new_ts: u64,
        lease: Lease,
        ts: u64,
    },
    /// `DEL key` in flight.
    Releasing {
        req: RequestId,
    },
}

/// The `setnx-getset` lock machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetnxGetset {
    key: String,
    ttl_ms: u64,
    drift_ms: u64,
    token: Token,
    state: State,
    base: Scaffold,
}

/// A stored timestamp, or the reply that is not one.
fn timestamp(request: &'static str, reply: Reply) -> Result<u64, ProtocolError> {
    match reply {
        Reply::Bulk(s) => s.parse().map_err(|_| ProtocolError::UnexpectedReply {
            request,
            reply: Reply::Bulk(s),
        }),
        Reply::Error(e) => Err(ProtocolError::Redis(e)),
        reply => Err(ProtocolError::UnexpectedReply { request, reply }),
    }
}

impl SetnxGetset {
    /// A lock on `config.name` for the owner `token` (which only names the
    /// lease: Redis stores the expiry timestamp). No automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<SetnxGetset, ConfigError> {
        config.validate_single("setnx-getset")?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        Ok(SetnxGetset {
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

    /// The timestamp a hold taken at `now` runs out at, by our clock.
    fn expiry_at(&self, now: Millis) -> u64 {
        now.get().saturating_add(self.ttl_ms)
    }

    fn send_setnx(&mut self, now: Millis, how: Acquire) {
        let ts = self.expiry_at(now);
        let req = self.send(
            now,
            Command::SetNx {
                key: self.key.clone(),
                value: ts.to_string(),
            },
        );
        self.state = State::Acquiring { req, ts, how };
    }

    fn lease_for(&self, ts: u64) -> Lease {
        Lease {
            token: self.token.clone(),
            fence: None,
            valid_until: Millis(ts.saturating_sub(self.drift_ms)),
        }
    }

    fn hold(&mut self, ts: u64) -> Lease {
        let lease = self.lease_for(ts);
        self.base.timers.clear_all();
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        self.state = State::Held {
            lease: lease.clone(),
            ts,
        };
        lease
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

    fn current_request(&self) -> Option<RequestId> {
        match &self.state {
            State::Acquiring { req, .. }
            | State::Reading { req, .. }
            | State::TakingOver { req, .. }
            | State::Extending { req, .. }
            | State::Releasing { req } => Some(*req),
            State::Idle | State::BackingOff { .. } | State::Held { .. } => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Transitions.
// ---------------------------------------------------------------------------

impl Protocol for SetnxGetset {
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

    /// `DEL` only while our own timestamp has not passed (the recipe's owner
    /// check, by time); past it, reports `Released { was_held: false }`
    /// without a request.
    fn release(&mut self, now: Millis) -> Result<(), UsageError> {
        let ts = match &self.state {
            State::Held { ts, .. } => *ts,
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        self.base.timers.clear_all();
        if now.get() < ts {
            let req = self.send(
                now,
                Command::Del {
                    keys: vec![self.key.clone()],
                },
            );
            self.state = State::Releasing { req };
        } else {
            self.state = State::Idle;
            self.base.out.emit(Event::Released { was_held: false });
        }
        Ok(())
    }

    /// `GETSET key now+ttl` while the lease is still valid by our clock; the
    /// old value must be our own timestamp, or the hold is reported lost
    /// (the blind `GETSET` has written ours anyway, as in the recipe).
    fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
        let (lease, ts) = match &self.state {
            State::Held { lease, ts } => (lease.clone(), *ts),
            State::Idle => return Err(UsageError::NotHeld),
            _ => return Err(UsageError::Busy),
        };
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return Ok(());
        }
        let new_ts = self.expiry_at(now);
        let req = self.send(
            now,
            Command::GetSet {
                key: self.key.clone(),
                value: new_ts.to_string(),
            },
        );
        self.state = State::Extending {
            req,
            new_ts,
            lease,
            ts,
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
            (State::Acquiring { ts, .. }, Outcome::Reply(Reply::Int(1))) => {
                let lease = self.hold(ts);
                self.base.out.emit(Event::Acquired(lease));
            }
            (State::Acquiring { how, .. }, Outcome::Reply(Reply::Int(0))) => {
                let req = self.send(
                    now,
                    Command::Get {
                        key: self.key.clone(),
                    },
                );
                self.state = State::Reading { req, how };
            }
            (State::Acquiring { how, .. }, Outcome::Unknown)
            | (State::Reading { how, .. }, Outcome::Unknown)
            | (State::TakingOver { how, .. }, Outcome::Unknown) => self.retry_or_deny(now, how),
            (State::Acquiring { .. }, Outcome::Reply(Reply::Error(e))) => {
                self.fail(ProtocolError::Redis(e));
            }
            (State::Acquiring { .. }, Outcome::Reply(reply)) => {
                self.fail(ProtocolError::UnexpectedReply {
                    request: "SETNX",
                    reply,
                });
            }
            // Deleted meanwhile: the recipe tries SETNX again at once.
            (State::Reading { how, .. }, Outcome::Reply(Reply::Nil)) => self.send_setnx(now, how),
            (State::Reading { how, .. }, Outcome::Reply(reply)) => {
                match timestamp("GET", reply) {
                    Err(e) => self.fail(e),
                    // Not expired by our clock: taken.
                    Ok(stored) if stored >= now.get() => self.retry_or_deny(now, how),
                    Ok(_) => {
                        let ts = self.expiry_at(now);
                        let req = self.send(
                            now,
                            Command::GetSet {
                                key: self.key.clone(),
                                value: ts.to_string(),
                            },
                        );
                        self.state = State::TakingOver { req, ts, how };
                    }
                }
            }
            // The key vanished before our GETSET: our GETSET created it.
            (State::TakingOver { ts, .. }, Outcome::Reply(Reply::Nil)) => {
                let lease = self.hold(ts);
                self.base.out.emit(Event::Acquired(lease));
            }
            (State::TakingOver { ts, how, .. }, Outcome::Reply(reply)) => {
                match timestamp("GETSET", reply) {
                    Err(e) => self.fail(e),
                    // Still expired: nobody beat us to it.
                    Ok(old) if old < now.get() => {
                        let lease = self.hold(ts);
                        self.base.out.emit(Event::Acquired(lease));
                    }
                    // Another client took it over first (and we have pushed
                    // its timestamp to ours, as the recipe accepts).
                    Ok(_) => self.retry_or_deny(now, how),
                }
            }
            (
                State::Extending {
                    new_ts, lease, ts, ..
                },
                Outcome::Reply(reply),
            ) => match reply {
                // The key was gone; our GETSET has created it anyway.
                Reply::Nil => {
                    self.go_idle();
                    self.base.out.emit(Event::Lost);
                }
                reply => match timestamp("GETSET", reply) {
                    Ok(old) if old == ts => {
                        let lease = self.hold(new_ts);
                        self.base.out.emit(Event::Extended(lease));
                    }
                    // Someone took it over; our GETSET overwrote theirs.
                    Ok(_) => {
                        self.go_idle();
                        self.base.out.emit(Event::Lost);
                    }
                    Err(e) => self.keep(now, lease, ts, Event::Failed(e)),
                },
            },
            (State::Extending { lease, ts, .. }, Outcome::Unknown) => {
                self.keep(now, lease, ts, Event::NotExtended);
            }
            (State::Releasing { .. }, Outcome::Reply(Reply::Int(n))) => {
                self.go_idle();
                self.base.out.emit(Event::Released { was_held: n == 1 });
            }
            (State::Releasing { .. }, Outcome::Unknown) => {
                self.go_idle();
                self.base.out.emit(Event::Released { was_held: false });
            }
            (State::Releasing { .. }, Outcome::Reply(Reply::Error(e))) => {
                self.fail(ProtocolError::Redis(e));
            }
            (State::Releasing { .. }, Outcome::Reply(reply)) => {
                self.fail(ProtocolError::UnexpectedReply {
                    request: "DEL",
                    reply,
                });
            }
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
            State::Held { lease, .. } | State::Extending { lease, .. } => Some(lease),
            _ => None,
        }
    }

    fn is_busy(&self) -> bool {
        !matches!(self.state, State::Idle | State::Held { .. })
    }
}

impl SetnxGetset {
    /// Stay held on the old lease after an extend that did not go through.
    fn keep(&mut self, now: Millis, lease: Lease, ts: u64, event: Event) {
        if now >= lease.valid_until {
            self.go_idle();
            self.base.out.emit(Event::Lost);
            return;
        }
        self.base.timers.set(Timer::Expiry, lease.valid_until);
        self.state = State::Held { lease, ts };
        self.base.out.emit(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{ConnId, Keyspace, SetCondition, SetExpiry};
    use crate::protocol::testkit::{answer, drive, lease, run_until};

    fn config() -> Config {
        Config {
            ttl_ms: 1_000,
            drift_ms: Some(10),
            retry_base_ms: 100,
            retry_max_ms: 100,
            retry_jitter_percent: 0,
            ..Config::new("orders")
        }
    }

    fn lock(token: &str) -> SetnxGetset {
        SetnxGetset::new(&config(), Token(token.into())).unwrap()
    }

    fn stored(redis: &mut Keyspace) -> Reply {
        redis.execute(
            ConnId(9),
            Millis(0),
            &Command::Get {
                key: "{orders}".into(),
            },
        )
    }

    #[test]
    fn acquire_stores_our_expiry_timestamp() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(5_000), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(5_000)),
            [Event::Acquired(lease("a", 5_990))]
        );
        assert_eq!(stored(&mut redis), Reply::Bulk("6000".into()));
        assert_eq!(a.poll_timeout(), Some(Millis(5_990)));
    }

    #[test]
    fn a_second_client_is_denied_while_the_timestamp_is_in_the_future() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(1_000), Acquire::Once).unwrap();
        // At 1000 the stored 1000 is not yet in the past.
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(1_000)), [Event::Denied]);
        assert_eq!(stored(&mut redis), Reply::Bulk("1000".into()));
    }

    #[test]
    fn release_deletes_before_our_timestamp_and_not_after() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.release(Millis(500)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(500)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(stored(&mut redis), Reply::Nil);
        b.acquire(Millis(600), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(600)),
            [Event::Acquired(lease("b", 1_590))]
        );
        // Past its own timestamp a holder leaves the key alone.
        b.release(Millis(1_600)).unwrap();
        assert_eq!(b.poll_transmit(), None);
        assert_eq!(b.poll_event(), Some(Event::Released { was_held: false }));
        assert_eq!(stored(&mut redis), Reply::Bulk("1600".into()));
    }

    #[test]
    fn an_expired_timestamp_is_taken_over_with_getset() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        assert_eq!(
            run_until(&mut a, &mut redis, 0, Millis(2_000)),
            [Event::Lost]
        );
        // `a` crashed or left without releasing; the key stays (no TTL).
        b.acquire(Millis(1_001), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(1_001)),
            [Event::Acquired(lease("b", 1_991))]
        );
        assert_eq!(stored(&mut redis), Reply::Bulk("2001".into()));
    }

    #[test]
    fn retries_until_the_holder_expires_or_the_deadline_passes() {
        let mut redis = Keyspace::new();
        let (mut a, mut b, mut c) = (lock("a"), lock("b"), lock("c"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        c.acquire(Millis(0), Acquire::Until(Millis(350))).unwrap();
        drive(&mut c, &mut redis, 2, Millis(0));
        assert_eq!(
            run_until(&mut c, &mut redis, 2, Millis(5_000)),
            [Event::Denied]
        );
        b.acquire(Millis(0), Acquire::Until(Millis(5_000))).unwrap();
        drive(&mut b, &mut redis, 1, Millis(0));
        // Attempts every 100 ms; the stored 1000 is in the past at 1100.
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(2_000)),
            [Event::Acquired(lease("b", 2_090))]
        );
    }

    #[test]
    fn a_key_deleted_before_the_get_is_retried_with_setnx_at_once() {
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(0)));
        assert_eq!(answer(&mut a, Millis(1), Outcome::Reply(Reply::Nil)), []);
        let again = a.poll_transmit().unwrap();
        assert_eq!(
            again.command,
            Command::SetNx {
                key: "{orders}".into(),
                value: "1001".into()
            }
        );
        a.handle_reply(Millis(1), again.id, Outcome::Reply(Reply::Int(1)));
        assert_eq!(a.poll_event(), Some(Event::Acquired(lease("a", 991))));
    }

    /// Run the next queued request of `m` at node time `server_now` and hand
    /// its reply back at client time `client_now`.
    fn step(m: &mut SetnxGetset, redis: &mut Keyspace, client_now: Millis, server_now: Millis) {
        let r = m.poll_transmit().unwrap();
        let reply = redis.execute(ConnId(1), server_now, &r.command);
        m.handle_reply(client_now, r.id, Outcome::Reply(reply));
    }

    #[test]
    fn the_loser_of_a_takeover_race_backs_off_after_pushing_the_winners_timestamp() {
        let mut redis = Keyspace::new();
        redis.execute(
            ConnId(9),
            Millis(0),
            &Command::SetNx {
                key: "{orders}".into(),
                value: "100".into(),
            },
        );
        let (mut b, mut c) = (lock("b"), lock("c"));
        let (at, later) = (Millis(500), Millis(520));
        b.acquire(at, Acquire::Once).unwrap();
        c.acquire(at, Acquire::Once).unwrap();
        // Both find the key taken and read the expired timestamp 100.
        step(&mut b, &mut redis, at, at);
        step(&mut c, &mut redis, at, at);
        step(&mut b, &mut redis, at, at);
        step(&mut c, &mut redis, later, at);
        // `b`'s GETSET goes first and wins.
        step(&mut b, &mut redis, at, at);
        assert_eq!(b.poll_event(), Some(Event::Acquired(lease("b", 1_490))));
        // `c`'s GETSET returns `b`'s fresh timestamp: it backs off ...
        step(&mut c, &mut redis, later, later);
        assert_eq!(c.poll_event(), Some(Event::Denied));
        assert_eq!(c.lease(), None);
        // ... having pushed `b`'s timestamp to its own.
        assert_eq!(stored(&mut redis), Reply::Bulk("1520".into()));
    }

    #[test]
    fn skewed_clocks_let_two_clients_both_believe_they_hold() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        // Real time 0: `a`'s clock is right, `b`'s runs 2 s ahead.
        a.acquire(Millis(0), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(0)),
            [Event::Acquired(lease("a", 990))]
        );
        let b_clock = Millis(2_000);
        b.acquire(b_clock, Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, b_clock),
            [Event::Acquired(lease("b", 2_990))]
        );
        // At real time 100 both are inside their validity by their own clocks.
        let a_now = Millis(100);
        let b_now = Millis(2_100);
        assert!(a.lease().is_some_and(|l| a_now < l.valid_until));
        assert!(b.lease().is_some_and(|l| b_now < l.valid_until));
        // And `a`'s release, still "in time" by its clock, deletes `b`'s lock.
        a.release(a_now).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, a_now),
            [Event::Released { was_held: true }]
        );
        assert_eq!(stored(&mut redis), Reply::Nil);
    }

    #[test]
    fn extend_getsets_a_new_timestamp_and_detects_a_takeover() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.extend(Millis(500)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(500)),
            [Event::Extended(lease("a", 1_490))]
        );
        assert_eq!(stored(&mut redis), Reply::Bulk("1500".into()));
        // `b`'s clock runs ahead: it takes over.
        b.acquire(Millis(1_600), Acquire::Once).unwrap();
        drive(&mut b, &mut redis, 1, Millis(1_600));
        assert!(b.lease().is_some());
        a.extend(Millis(900)).unwrap();
        assert_eq!(drive(&mut a, &mut redis, 0, Millis(900)), [Event::Lost]);
        assert_eq!(a.lease(), None);
        // An extend past the validity reports the loss without a request.
        let mut c = lock("c");
        c.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut c, Millis(0), Outcome::Reply(Reply::Int(1)));
        c.extend(Millis(995)).unwrap();
        assert_eq!(c.poll_transmit(), None);
        assert_eq!(c.poll_event(), Some(Event::Lost));
    }

    #[test]
    fn an_unparseable_stored_value_fails_without_panicking() {
        let mut redis = Keyspace::new();
        redis.execute(
            ConnId(9),
            Millis(0),
            &Command::Set {
                key: "{orders}".into(),
                value: "not a timestamp".into(),
                condition: SetCondition::Always,
                expiry: SetExpiry::None,
                get: false,
            },
        );
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(0)),
            [Event::Failed(ProtocolError::UnexpectedReply {
                request: "GET",
                reply: Reply::Bulk("not a timestamp".into())
            })]
        );
        assert!(!a.is_busy());
    }

    #[test]
    fn garbage_replies_fail_and_stale_ids_are_ignored() {
        let paths: [(&[Reply], Reply); 6] = [
            (&[], Reply::Bulk("1".into())),
            (&[], Reply::Error("ERR x".into())),
            (&[Reply::Int(0)], Reply::Int(3)),
            (&[Reply::Int(0)], Reply::Bulk("-5".into())),
            (&[Reply::Int(0), Reply::Bulk("0".into())], Reply::Int(1)),
            (
                &[Reply::Int(0), Reply::Bulk("0".into())],
                Reply::Bulk("x".into()),
            ),
        ];
        for (before, garbage) in paths {
            let mut a = lock("a");
            a.acquire(Millis(10), Acquire::Once).unwrap();
            for reply in before {
                assert_eq!(
                    answer(&mut a, Millis(10), Outcome::Reply(reply.clone())),
                    []
                );
            }
            let events = answer(&mut a, Millis(10), Outcome::Reply(garbage.clone()));
            assert!(
                matches!(events.as_slice(), [Event::Failed(_)]),
                "{before:?} {garbage:?}: {events:?}"
            );
            assert!(!a.is_busy());
        }
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        a.extend(Millis(10)).unwrap();
        let events = answer(&mut a, Millis(10), Outcome::Reply(Reply::Int(1)));
        assert!(
            matches!(events.as_slice(), [Event::Failed(_)]),
            "{events:?}"
        );
        assert_eq!(
            a.lease(),
            Some(&lease("a", 990)),
            "a failed extend keeps the lease"
        );
        a.handle_reply(Millis(11), RequestId(0), Outcome::Reply(Reply::Int(0)));
        assert_eq!(a.poll_event(), None);
        a.release(Millis(20)).unwrap();
        let events = answer(&mut a, Millis(20), Outcome::Reply(Reply::Nil));
        assert!(
            matches!(events.as_slice(), [Event::Failed(_)]),
            "{events:?}"
        );
    }

    #[test]
    fn bad_config_and_empty_token_are_typed_errors() {
        assert_eq!(
            SetnxGetset::new(&config(), Token(String::new())),
            Err(ConfigError::EmptyToken)
        );
        assert!(matches!(
            SetnxGetset::new(
                &Config {
                    name: "a}b".into(),
                    ..config()
                },
                Token("a".into())
            ),
            Err(ConfigError::BraceInName(_))
        ));
    }
}
