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
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: SETNX key now+ttl+1 → 1
//!     Acquiring --> Reading: SETNX → 0
//!     Reading --> Backoff: GET → timestamp in the future
//!     Reading --> TakingOver: GET → timestamp in the past (by OUR clock)
//!     TakingOver --> Held: GETSET → old timestamp still expired
//!     TakingOver --> Backoff: GETSET → fresh timestamp (lost the race)
//!     Backoff --> Acquiring: retry timer
//!     Held --> [*]: own timestamp passes / Lost
//!     Held --> Releasing: release (only before own timeout)
//!     Releasing --> [*]: DEL key / Released
//! ```

use crate::config::{Config, ConfigError};
use crate::engine::{engine_machine, Engine, EngineConfig, Next, Op, Recipe};
use crate::keyspace::{Command, Reply};
use crate::protocol::{Lease, ProtocolError, Token};
use crate::time::Millis;

// ---------------------------------------------------------------------------
// Steps and recipe.
// ---------------------------------------------------------------------------

/// Where a request sequence of `setnx-getset` is. The timestamp a request
/// writes is its send time plus the TTL: the engine keeps the send time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// `SETNX key ts` in flight.
    Setnx,
    /// `SETNX` lost; `GET key` in flight.
    Read,
    /// The stored timestamp had passed; `GETSET key ts` in flight.
    TakeOver,
    /// `GETSET key new_ts` (extend) in flight; our timestamp was `ts`.
    Extend { ts: u64 },
    /// `DEL key` in flight.
    Delete,
}

/// The commands of `setnx-getset` and what their replies mean.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetnxGetsetRecipe {
    key: String,
    ttl_ms: u64,
    drift_ms: u64,
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

impl SetnxGetsetRecipe {
    /// The timestamp a hold taken at `now` runs out at, by our clock.
    fn expiry_at(&self, now: Millis) -> String {
        now.get().saturating_add(self.ttl_ms).to_string()
    }

    /// The timestamp stored for `lease`.
    fn stored(&self, lease: &Lease) -> u64 {
        lease.valid_until.get().saturating_add(self.drift_ms)
    }

    fn setnx(&self, now: Millis) -> Command {
        Command::SetNx {
            key: self.key.clone(),
            value: self.expiry_at(now),
        }
    }

    fn getset(&self, now: Millis) -> Command {
        Command::GetSet {
            key: self.key.clone(),
            value: self.expiry_at(now),
        }
    }
}

impl Recipe for SetnxGetsetRecipe {
    type Step = Step;

    /// The key holds a timestamp, not a token: nothing to change.
    fn retoken(&mut self, _token: &Token) {}
    // The recipe holds whatever it won; a late grant expires at once.
    const UNDOES_LATE_GRANTS: bool = false;

    fn start(&self, op: Op, now: Millis) -> (Command, Step) {
        match op {
            Op::Acquire => (self.setnx(now), Step::Setnx),
            // Extends start from the lease: see `start_extend`.
            Op::Extend => (self.getset(now), Step::Extend { ts: 0 }),
            Op::Release => (
                Command::Del {
                    keys: vec![self.key.clone()],
                },
                Step::Delete,
            ),
        }
    }

    fn advance(&self, _op: Op, step: Step, reply: Reply, now: Millis) -> Next<Step> {
        match (step, reply) {
            (Step::Setnx, Reply::Int(1)) => Next::Granted(None),
            (Step::Setnx, Reply::Int(0)) => Next::Send(
                Command::Get {
                    key: self.key.clone(),
                },
                Step::Read,
            ),
            (Step::Setnx, reply) => Next::Abort(ProtocolError::UnexpectedReply {
                request: "SETNX",
                reply,
            }),
            // Deleted meanwhile: the recipe tries SETNX again at once.
            (Step::Read, Reply::Nil) => Next::Send(self.setnx(now), Step::Setnx),
            (Step::Read, reply) => match timestamp("GET", reply) {
                Err(e) => Next::Abort(e),
                // Not expired by our clock: taken.
                Ok(stored) if stored >= now.get() => Next::NotGranted,
                Ok(_) => Next::Send(self.getset(now), Step::TakeOver),
            },
            // The key vanished before our GETSET: our GETSET created it.
            (Step::TakeOver, Reply::Nil) => Next::Granted(None),
            (Step::TakeOver, reply) => match timestamp("GETSET", reply) {
                Err(e) => Next::Abort(e),
                // Still expired: nobody beat us to it.
                Ok(old) if old < now.get() => Next::Granted(None),
                // Another client took it over first (and we have pushed its
                // timestamp to ours, as the recipe accepts).
                Ok(_) => Next::NotGranted,
            },
            // The key was gone; our GETSET has created it anyway.
            (Step::Extend { .. }, Reply::Nil) => Next::Done { ours: false },
            // The old value must be our own timestamp; otherwise someone
            // took it over and our GETSET overwrote theirs.
            (Step::Extend { ts }, reply) => match timestamp("GETSET", reply) {
                Ok(old) => Next::Done { ours: old == ts },
                Err(e) => Next::Failed(e),
            },
            (Step::Delete, Reply::Int(n)) => Next::Done { ours: n == 1 },
            (Step::Delete, reply) => Next::Failed(ProtocolError::UnexpectedReply {
                request: "DEL",
                reply,
            }),
        }
    }

    /// A lost reply is a lost attempt; an error is reported at once.
    fn doubt(&self, _step: &Step, error: Option<ProtocolError>) -> Next<Step> {
        match error {
            None => Next::NotGranted,
            Some(e) => Next::Abort(e),
        }
    }

    fn start_extend(&self, lease: &Lease, now: Millis) -> (Command, Step) {
        let ts = self.stored(lease);
        (self.getset(now), Step::Extend { ts })
    }

    /// Only the requests that write our timestamp can grant.
    fn timed(&self, step: &Step) -> bool {
        *step != Step::Read
    }

    /// The recipe's owner check is by time: past our own timestamp the key
    /// is no longer ours to delete, and past our validity not ours to
    /// extend.
    fn gone(&self, op: Op, lease: &Lease, now: Millis) -> bool {
        match op {
            Op::Release => now.get() >= self.stored(lease),
            _ => now >= lease.valid_until,
        }
    }
}

engine_machine! {
    /// The `setnx-getset` lock machine.
    SetnxGetset(SetnxGetsetRecipe)
}

impl SetnxGetset {
    /// A lock on `config.name` for the owner `token` (which only names the
    /// lease: Redis stores the expiry timestamp). No automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<SetnxGetset, ConfigError> {
        let engine = EngineConfig::checked(
            config.validate_single("setnx-getset"),
            config,
            token.clone(),
        )?;
        let recipe = SetnxGetsetRecipe {
            key: config.key(),
            ttl_ms: config.ttl_ms,
            drift_ms: config.drift(),
        };
        Ok(SetnxGetset(Engine::new(recipe, engine)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{ConnId, Keyspace, SetCondition, SetExpiry};
    use crate::protocol::testkit::{answer, drive, lease, run_until};
    use crate::protocol::{Acquire, Event, Extension, Outcome, Protocol, RequestId};

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
            [Event::Extended {
                lease: lease("a", 1_490),
                by: Extension::Extend
            }]
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
            SetnxGetset::new(&config(), Token::new("")),
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
