//! `setnx-del`: `SETNX key token` with no TTL at all, released under
//! `WATCH`/`MULTI DEL EXEC`.
//!
//! ## Idea
//!
//! The simplest lock Redis offers: whoever creates the key holds the lock.
//! `SETNX {name} token` replies 1 to exactly one client; the others get 0 and
//! try again later. The holder writes a random token so that its release can
//! check that the key is still its own before deleting it.
//!
//! ## Origin
//!
//! "Redis in Action", 6.2.3, `acquire_lock` and `release_lock`; pyRedisLock
//! 1.0 did the same with a plain `DEL` as its release. This machine follows
//! the book's release: `WATCH key`, `GET key`; when the value is our token,
//! `MULTI DEL EXEC` (and start again when `EXEC` aborts because the key
//! changed), otherwise `UNWATCH`. Either release has the same weakness below.
//!
//! ## Known failure
//!
//! There is no TTL, so there is no lease: a hold lasts until its holder
//! deletes the key, and [`Lease::valid_until`](crate::protocol::Lease::valid_until) is "forever"
//! (`Millis(u64::MAX)`). A holder that crashes before releasing leaves the
//! key behind and every later acquire is denied for ever: `progress` fails
//! under the `crash` fault. The book says so itself and moves on to the lock
//! with a timeout (`setnx-expire`). The same deadlock follows from a lost
//! reply: a `SETNX` that ran but whose reply never came leaves our own token
//! in the key, and this machine (like the book) treats the attempt as failed.
//!
//! `extend` has nothing to extend: it reports `Extended` with the same
//! lease at once.
//!
//! The `WATCH` sequence is the engine's one watched release step, shared
//! with `setnx-expire` and `set-px-watch`.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: SETNX key token → 1
//!     Acquiring --> Backoff: SETNX → 0 (taken)
//!     Backoff --> Acquiring: retry timer
//!     Backoff --> [*]: deadline passed / Denied
//!     Held --> Held: extend (nothing to extend) / Extended
//!     Held --> Releasing: release
//!     Releasing --> Releasing: EXEC aborted, WATCH again
//!     Releasing --> [*]: WATCH, GET = token, MULTI DEL EXEC / Released
//!     Releasing --> [*]: GET ≠ token, UNWATCH / Released (was_held false)
//! ```

use crate::config::{Config, ConfigError};
use crate::engine::{
    engine_machine, watch_begin, watch_step, Engine, EngineConfig, Next, Op, Recipe, WatchStep,
};
use crate::keyspace::{Command, Reply};
use crate::protocol::{ProtocolError, Token};
use crate::time::Millis;

// ---------------------------------------------------------------------------
// Steps and recipe.
// ---------------------------------------------------------------------------

/// Where a request sequence of `setnx-del` is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// `SETNX` in flight.
    Setnx,
    /// The watched release is at this step.
    Watched(WatchStep),
}

/// The first command of `op` of a SETNX lock (`setnx-del`, `setnx-expire`):
/// `SETNX key token` at step `setnx`, or the watched release or extend.
pub(crate) fn setnx_start<S>(
    key: &str,
    token: &Token,
    op: Op,
    setnx: S,
    watched: fn(WatchStep) -> S,
) -> (Command, S) {
    match op {
        Op::Acquire => (
            Command::SetNx {
                key: key.to_owned(),
                value: token.0.to_string(),
            },
            setnx,
        ),
        Op::Release | Op::Extend => watch_begin(key, watched),
    }
}

/// The commands of `setnx-del` and what their replies mean.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetnxDelRecipe {
    key: String,
    token: Token,
    /// A deliberate bug for the tests ([`SetnxDel::with_release_of_another_key`]):
    /// the release deletes this key instead of the lock's.
    release_deletes: Option<String>,
}

impl Recipe for SetnxDelRecipe {
    type Step = Step;

    fn retoken(&mut self, token: &Token) {
        self.token = token.clone();
    }

    fn timed(&self, _step: &Step) -> bool {
        false
    }
    const EXTENDS: bool = false;

    fn start(&self, op: Op, _now: Millis) -> (Command, Step) {
        setnx_start(&self.key, &self.token, op, Step::Setnx, Step::Watched)
    }

    fn advance(&self, _op: Op, step: Step, reply: Reply, _now: Millis) -> Next<Step> {
        match (step, reply) {
            (Step::Setnx, Reply::Int(1)) => Next::Granted(None),
            (Step::Setnx, Reply::Int(0)) => Next::NotGranted,
            (Step::Setnx, reply) => Next::Abort(ProtocolError::UnexpectedReply {
                request: "SETNX",
                reply,
            }),
            (Step::Watched(step), reply) => {
                let key = self.release_deletes.as_ref().unwrap_or(&self.key);
                let act = Command::Del {
                    keys: vec![key.clone()],
                };
                watch_step(&self.key, &self.token.0, act, step, reply, Step::Watched)
            }
        }
    }

    /// The book only knows "setnx returned true": an unknown `SETNX` is a
    /// lost attempt, even when it ran and left our token behind.
    fn doubt(&self, _step: &Step, error: Option<ProtocolError>) -> Next<Step> {
        match error {
            None => Next::NotGranted,
            Some(e) => Next::Abort(e),
        }
    }
}

engine_machine! {
    /// The `setnx-del` lock machine. Its driver must give it a connection of its
    /// own: the release's `WATCH` state lives on the connection.
    SetnxDel(SetnxDelRecipe)
}

impl SetnxDel {
    /// A lock on `config.name` for the owner `token`. `config.ttl_ms` is
    /// validated but not used: this lock has no TTL.
    pub fn new(config: &Config, token: Token) -> Result<SetnxDel, ConfigError> {
        SetnxDel::build(config, token, None)
    }

    fn build(
        config: &Config,
        token: Token,
        release_deletes: Option<String>,
    ) -> Result<SetnxDel, ConfigError> {
        let mut engine =
            EngineConfig::checked(config.validate_single("setnx-del"), config, token.clone())?;
        let recipe = SetnxDelRecipe {
            key: config.key(),
            token,
            release_deletes,
        };
        // Whether the DEL of a release ran may be unknown: with no TTL a key
        // left behind stays for ever, the specimen's weakness.
        engine.ttl_ms = None;
        Ok(SetnxDel(Engine::new(recipe, engine)))
    }

    /// A deliberate bug, for the tests that must catch it: the release
    /// checks the owner as it should, then deletes another key (the lock's
    /// name with a `:typo` suffix), so every hold stays for ever and every
    /// later acquire waits in vain. A check of progress that cannot see
    /// this cannot see a deadlock at all.
    #[doc(hidden)]
    pub fn with_release_of_another_key(
        config: &Config,
        token: Token,
    ) -> Result<SetnxDel, ConfigError> {
        SetnxDel::build(config, token, Some(config.key_with("typo")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{
        Acquire, Event, Extension, Lease, Outcome, Protocol, RequestId, UsageError,
    };

    /// The lease of a lock without TTL: valid until we delete it.
    const FOREVER: Millis = Millis(u64::MAX);
    use crate::keyspace::Keyspace;
    use crate::protocol::testkit::{answer, drive, drop_requests, lease, run_until};

    fn config() -> Config {
        Config {
            ttl_ms: 1_000,
            retry_base_ms: 10,
            retry_max_ms: 40,
            retry_jitter_percent: 0,
            ..Config::new("orders")
        }
    }

    fn lock(token: &str) -> SetnxDel {
        SetnxDel::new(&config(), Token(token.into())).unwrap()
    }

    fn held(token: &str) -> Lease {
        lease(token, FOREVER.get())
    }

    #[test]
    fn acquire_holds_for_ever_and_a_second_client_is_denied() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(0)),
            [Event::Acquired(held("a"))]
        );
        assert_eq!(a.poll_timeout(), None, "no TTL, nothing to wake up for");
        b.acquire(Millis(5), Acquire::Once).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(5)), [Event::Denied]);
        assert_eq!(b.lease(), None);
        assert_eq!(
            a.acquire(Millis(6), Acquire::Once),
            Err(UsageError::AlreadyHeld)
        );
    }

    #[test]
    fn release_deletes_our_key_and_lets_the_next_client_in() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.release(Millis(10)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(10)),
            [Event::Released { was_held: true }]
        );
        assert_eq!(a.lease(), None);
        b.acquire(Millis(20), Acquire::Once).unwrap();
        assert_eq!(
            drive(&mut b, &mut redis, 1, Millis(20)),
            [Event::Acquired(held("b"))]
        );
        assert_eq!(a.release(Millis(30)), Err(UsageError::NotHeld));
    }

    #[test]
    fn release_does_not_delete_a_foreign_value() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        // Someone overwrote the key (an operator, or another protocol).
        redis.execute(
            crate::keyspace::ConnId(9),
            Millis(1),
            &Command::Set {
                key: "{orders}".into(),
                value: "intruder".into(),
                condition: crate::keyspace::SetCondition::Always,
                expiry: crate::keyspace::SetExpiry::None,
                get: false,
            },
        );
        a.release(Millis(2)).unwrap();
        assert_eq!(
            drive(&mut a, &mut redis, 0, Millis(2)),
            [Event::Released { was_held: false }]
        );
        let value = redis.execute(
            crate::keyspace::ConnId(9),
            Millis(3),
            &Command::Get {
                key: "{orders}".into(),
            },
        );
        assert_eq!(value, Reply::Bulk("intruder".into()));
    }

    #[test]
    fn an_aborted_exec_starts_the_release_again() {
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
        a.release(Millis(1)).unwrap();
        answer(&mut a, Millis(1), Outcome::Reply(Reply::ok()));
        answer(&mut a, Millis(1), Outcome::Reply(Reply::Bulk("a".into())));
        // EXEC: nil, the watched key changed.
        assert_eq!(answer(&mut a, Millis(1), Outcome::Reply(Reply::Nil)), []);
        let again = a.poll_transmit().unwrap();
        assert_eq!(
            again.command,
            Command::Watch {
                keys: vec!["{orders}".into()]
            }
        );
    }

    #[test]
    fn extend_has_nothing_to_extend_and_reports_the_same_lease() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        assert_eq!(a.extend(Millis(0)), Err(UsageError::NotHeld));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        a.extend(Millis(1)).unwrap();
        assert_eq!(a.poll_transmit(), None);
        assert_eq!(
            a.poll_event(),
            Some(Event::Extended {
                lease: held("a"),
                by: Extension::Extend
            })
        );
        assert_eq!(a.lease(), Some(&held("a")));
    }

    #[test]
    fn retries_until_the_deadline_then_denies() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(0), Acquire::Until(Millis(100))).unwrap();
        assert_eq!(drive(&mut b, &mut redis, 1, Millis(0)), []);
        // No jitter: attempts at 0, 10, 30, 70; the next (110) is too late.
        assert_eq!(b.poll_timeout(), Some(Millis(10)));
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(1_000)),
            [Event::Denied]
        );
        assert_eq!(b.poll_timeout(), None);
        assert!(!b.is_busy());
    }

    #[test]
    fn a_waiter_gets_the_lock_once_the_holder_releases() {
        let mut redis = Keyspace::new();
        let (mut a, mut b) = (lock("a"), lock("b"));
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        b.acquire(Millis(0), Acquire::Until(Millis(1_000))).unwrap();
        drive(&mut b, &mut redis, 1, Millis(0));
        a.release(Millis(15)).unwrap();
        drive(&mut a, &mut redis, 0, Millis(15));
        assert_eq!(
            run_until(&mut b, &mut redis, 1, Millis(1_000)),
            [Event::Acquired(held("b"))]
        );
    }

    #[test]
    fn a_crashed_holder_deadlocks_everyone_for_ever() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        drive(&mut a, &mut redis, 0, Millis(0));
        // `a` crashes while holding: it never releases.
        drop(a);
        let mut b = lock("b");
        let much_later = Millis(365 * 24 * 3_600_000);
        b.acquire(much_later, Acquire::Until(much_later + 10_000))
            .unwrap();
        let mut events = drive(&mut b, &mut redis, 1, much_later);
        events.extend(run_until(&mut b, &mut redis, 1, much_later + 20_000));
        assert_eq!(events, [Event::Denied]);
    }

    #[test]
    fn a_lost_setnx_reply_deadlocks_even_its_sender() {
        let mut redis = Keyspace::new();
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        // The SETNX runs, its reply is lost.
        let request = a.poll_transmit().unwrap();
        redis.execute(crate::keyspace::ConnId(0), Millis(0), &request.command);
        a.handle_reply(Millis(0), request.id, Outcome::Unknown);
        assert_eq!(a.poll_event(), Some(Event::Denied));
        a.acquire(Millis(10), Acquire::Once).unwrap();
        assert_eq!(drive(&mut a, &mut redis, 0, Millis(10)), [Event::Denied]);
    }

    #[test]
    fn a_reply_timeout_is_an_unknown_outcome() {
        let mut a = SetnxDel::new(
            &Config {
                reply_timeout_ms: Some(50),
                ..config()
            },
            Token("a".into()),
        )
        .unwrap();
        a.acquire(Millis(0), Acquire::Once).unwrap();
        let lost = drop_requests(&mut a);
        assert_eq!(lost.len(), 1);
        assert_eq!(a.poll_timeout(), Some(Millis(50)));
        a.handle_timeout(Millis(50));
        assert_eq!(a.poll_event(), Some(Event::Denied));
        // The late reply is stale and ignored.
        a.handle_reply(Millis(60), lost[0].id, Outcome::Reply(Reply::Int(1)));
        assert_eq!(a.lease(), None);
        assert_eq!(a.poll_event(), None);
    }

    #[test]
    fn bad_config_and_empty_token_are_typed_errors() {
        assert_eq!(
            SetnxDel::new(&config(), Token::new("")),
            Err(ConfigError::EmptyToken)
        );
        assert_eq!(
            SetnxDel::new(
                &Config {
                    name: "".into(),
                    ..config()
                },
                Token("a".into())
            ),
            Err(ConfigError::EmptyName)
        );
        assert!(matches!(
            SetnxDel::new(
                &Config {
                    nodes: 3,
                    ..config()
                },
                Token("a".into())
            ),
            Err(ConfigError::SingleNodeOnly { nodes: 3, .. })
        ));
    }

    #[test]
    fn garbage_replies_fail_without_panicking_and_stale_ids_are_ignored() {
        let garbage = [
            Reply::Nil,
            Reply::Int(7),
            Reply::Bulk("x".into()),
            Reply::Array(vec![]),
            Reply::Status("QUEUED".into()),
        ];
        for reply in garbage {
            let mut a = lock("a");
            a.acquire(Millis(0), Acquire::Once).unwrap();
            let events = answer(&mut a, Millis(0), Outcome::Reply(reply.clone()));
            assert!(
                matches!(
                    events.as_slice(),
                    [Event::Failed(ProtocolError::UnexpectedReply { .. })]
                ),
                "{reply:?}: {events:?}"
            );
            assert!(!a.is_busy());
        }
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        let events = answer(
            &mut a,
            Millis(0),
            Outcome::Reply(Reply::Error("ERR x".into())),
        );
        assert_eq!(
            events,
            [Event::Failed(ProtocolError::Redis("ERR x".into()))]
        );
        // Release sequence: garbage at each step.
        for step in 0..3 {
            let mut a = lock("a");
            a.acquire(Millis(0), Acquire::Once).unwrap();
            answer(&mut a, Millis(0), Outcome::Reply(Reply::Int(1)));
            a.release(Millis(1)).unwrap();
            let good = [Reply::ok(), Reply::Bulk("a".into())];
            for reply in &good[..step] {
                answer(&mut a, Millis(1), Outcome::Reply(reply.clone()));
            }
            let events = answer(&mut a, Millis(1), Outcome::Reply(Reply::Int(42)));
            assert!(
                matches!(events.as_slice(), [Event::Failed(_)]),
                "step {step}: {events:?}"
            );
            assert!(!a.is_busy());
        }
        // A reply to an id never sent is ignored.
        let mut a = lock("a");
        a.acquire(Millis(0), Acquire::Once).unwrap();
        a.handle_reply(Millis(0), RequestId(99), Outcome::Reply(Reply::Int(1)));
        assert!(a.is_busy());
        assert_eq!(a.poll_event(), None);
    }
}
