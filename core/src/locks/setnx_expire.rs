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
//!
//! The repair races its holder: a waiter's `TTL` can read -1 between the
//! holder's `SETNX` and its `EXPIRE`, and the waiter's `EXPIRE` then runs
//! on a key whose holder has set its own TTL, resetting it. That breaks
//! owner-only with no fault at all (the key lives a little longer than
//! its holder believes, which costs waiters time, not safety); a
//! conditional repair (`EXPIRE key seconds NX`, Redis 7) would not.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Expiring: SETNX key token → 1
//!     Expiring --> Held: EXPIRE key ceil(ttl/1000) / Acquired
//!     Acquiring --> Checking: SETNX → 0 (taken)
//!     Checking --> Backoff: TTL ≥ 0
//!     Checking --> Backoff: TTL = -1, EXPIRE (repair)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: extend (WATCH, GET, MULTI PEXPIRE EXEC)
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: WATCH, GET, MULTI DEL EXEC / Released
//! ```

use super::setnx_del::setnx_start;
use crate::config::{Config, ConfigError};
use crate::engine::{
    engine_machine, watch_step, Engine, EngineConfig, Next, Op, Recipe, WatchStep,
};
use crate::keyspace::{Command, Reply};
use crate::protocol::{ProtocolError, Token};
use crate::time::Millis;

// ---------------------------------------------------------------------------
// Steps and recipe.
// ---------------------------------------------------------------------------

/// Where a request sequence of `setnx-expire` is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// `SETNX` in flight.
    Setnx,
    /// `SETNX` won; the separate `EXPIRE` is in flight.
    Expire,
    /// `SETNX` lost; `TTL` is in flight.
    CheckTtl,
    /// The key had no TTL; the repairing `EXPIRE` is in flight.
    Repair,
    /// The watched `DEL` (release) or `PEXPIRE` (extend) is at this step.
    Watched(WatchStep),
}

/// The commands of `setnx-expire` and what their replies mean.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetnxExpireRecipe {
    key: String,
    ttl_ms: u64,
    token: Token,
}

impl SetnxExpireRecipe {
    /// `EXPIRE key ceil(ttl / 1000)`: the book's whole seconds.
    fn expire_command(&self) -> Command {
        Command::Expire {
            key: self.key.clone(),
            seconds: self.ttl_ms.div_ceil(1_000) as i64,
        }
    }
}

impl Recipe for SetnxExpireRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.clone();
    }
    const KEEPS_RELEASED_LEASE: bool = true;
    // The book holds whatever its SETNX won; a late grant expires at once.
    const UNDOES_LATE_GRANTS: bool = false;

    fn start(&self, op: Op, _now: Millis) -> (Command, Step) {
        setnx_start(&self.key, &self.token, op, Step::Setnx, Step::Watched)
    }

    fn advance(&self, op: Op, step: Step, reply: Reply, _now: Millis) -> Next<Step> {
        match (step, reply) {
            // Step one won: set the expiry as a second request.
            (Step::Setnx, Reply::Int(1)) => Next::Send(self.expire_command(), Step::Expire),
            // Taken: does the key have a TTL?
            (Step::Setnx, Reply::Int(0)) => Next::Send(
                Command::Ttl {
                    key: self.key.clone(),
                },
                Step::CheckTtl,
            ),
            (Step::Setnx, reply) => abort("SETNX", reply),
            // The book ignores what `EXPIRE` answers: the key is ours, with
            // a TTL or, at worst, until a waiter repairs it.
            (Step::Expire, Reply::Int(_)) => Next::Granted(None),
            // The key is ours but may have no TTL: undo the grant.
            (Step::Expire, reply) => Next::Failed(ProtocolError::UnexpectedReply {
                request: "EXPIRE",
                reply,
            }),
            // The book's repair: a key without expiry gets one.
            (Step::CheckTtl, Reply::Int(-1)) => Next::Send(self.expire_command(), Step::Repair),
            (Step::CheckTtl, Reply::Int(_)) => Next::NotGranted,
            (Step::CheckTtl, reply) => abort("TTL", reply),
            (Step::Repair, Reply::Int(_)) => Next::NotGranted,
            (Step::Repair, reply) => abort("EXPIRE", reply),
            (Step::Watched(step), reply) => {
                let act = match op {
                    Op::Extend => Command::PExpire {
                        key: self.key.clone(),
                        millis: self.ttl_ms as i64,
                    },
                    _ => Command::Del {
                        keys: vec![self.key.clone()],
                    },
                };
                watch_step(&self.key, &self.token.0, act, step, reply, Step::Watched)
            }
        }
    }

    /// A lost reply is a lost attempt, except on the `EXPIRE` after a won
    /// `SETNX`: the key is ours (the book ignores that reply). An error
    /// there undoes the grant; anywhere else it is reported at once.
    fn doubt(&self, step: &Step, error: Option<ProtocolError>) -> Next<Step> {
        match (step, error) {
            (Step::Expire, None) => Next::Granted(None),
            (Step::Expire, Some(e)) => Next::Failed(e),
            (_, None) => Next::NotGranted,
            (_, Some(e)) => Next::Abort(e),
        }
    }

    /// Only the `SETNX` and its `EXPIRE` can grant; a waiter's `TTL` and
    /// repair keep no send time.
    fn timed(&self, step: &Step) -> bool {
        !matches!(step, Step::CheckTtl | Step::Repair)
    }
}

/// An acquire step's reply of the wrong shape.
fn abort(request: &'static str, reply: Reply) -> Next<Step> {
    Next::Abort(ProtocolError::UnexpectedReply { request, reply })
}

engine_machine! {
    /// The `setnx-expire` lock machine. Its driver must give it a connection of
    /// its own: `WATCH` state lives on the connection.
    SetnxExpire(SetnxExpireRecipe)
}

impl SetnxExpire {
    /// A lock on `config.name` for the owner `token`. No automatic renewal
    /// (the book has none).
    pub fn new(config: &Config, token: Token) -> Result<SetnxExpire, ConfigError> {
        let engine = EngineConfig::checked(
            config.validate_single("setnx-expire"),
            config,
            token.clone(),
        )?;
        let recipe = SetnxExpireRecipe {
            key: config.key(),
            ttl_ms: config.ttl_ms,
            token: token.clone(),
        };
        Ok(SetnxExpire(Engine::new(recipe, engine)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{ConnId, Keyspace};
    use crate::protocol::testkit::{answer, drive, drop_requests, lease, run_until};
    use crate::protocol::{Acquire, Event, Extension, Outcome, Protocol, RequestId, UsageError};

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
            [Event::Extended {
                lease: lease("a", 2_980),
                by: Extension::Extend
            }]
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
            [Event::NotExtended {
                by: Extension::Extend
            }]
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
            SetnxExpire::new(&config(), Token::new("")),
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
