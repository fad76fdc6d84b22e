//! The cache-stampede guard: single flight around a slow load, per key.
//!
//! When a popular cache entry expires, every reader misses at once and every
//! one of them runs the slow loader (a "stampede"). The guard lets exactly
//! one caller per key load while the others wait and re-read:
//!
//! 1. [`StampedeGuard::get_or_load`] sends `GET key`. A value is a
//!    [`StampedeEvent::Hit`].
//! 2. On a miss it tries, once, a catalogue lock (`config.guard_lock`,
//!    `set-px-lua` by default) named `<config.name>:<key>` — one lock per
//!    cache key, never a global one.
//! 3. The winner gets [`StampedeEvent::Load`]: the driver runs the loader
//!    and hands the value to [`StampedeGuard::handle_loaded`], which writes
//!    `SET key value PX cache_ttl`, releases the lock and reports
//!    [`StampedeEvent::Stored`].
//! 4. Losers re-read the cache every few ms (jittered, `config.retry_base_ms`)
//!    until the value appears, for at most the lock TTL; after that the
//!    loader is presumed dead and the waiter tries the lock itself.
//!
//! The load has a timeout: when the winner's lock validity
//! (`sent_at + ttl − drift`) runs out before the value arrives, the guard
//! reports [`StampedeEvent::LoadTimedOut`] and forgets the load, so a dead
//! or slow loader never blocks readers past the lock TTL.
//!
//! The guard is sans-IO like every machine of the core: drive it with
//! `poll_transmit`, `handle_reply`, `poll_event`, `poll_timeout` and
//! `handle_timeout` exactly as a [`Protocol`] (request ids of the embedded
//! lock are odd, the guard's own even). It runs one `get_or_load` at a time.

use crate::catalogue::{Kind, Machine, ProtocolId};
use crate::config::{Config, ConfigError, MAX_TTL_MS};
use crate::engine::{
    earliest, embedded_timeout, poll_both, reply_of, route_reply, Backoff, Outbox, Timer,
    TimerTable,
};
use crate::keyspace::{Command, Reply, SetCondition, SetExpiry};
use crate::protocol::{
    Acquire, Event, Lease, NodeId, Outcome, Protocol, ProtocolError, Request, RequestId, Token,
};
use crate::time::Millis;
use std::collections::VecDeque;

/// What the guard reports to its application.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StampedeEvent {
    /// The cache holds this value.
    Hit(String),
    /// This caller won the key's lock: run the loader, then call
    /// [`StampedeGuard::handle_loaded`] (or [`StampedeGuard::handle_load_failed`]).
    Load,
    /// The loaded value is in the cache and the lock is released.
    Stored,
    /// The lock validity ran out before the loader delivered: the load is
    /// forgotten and other callers may load.
    LoadTimedOut,
    /// The loader gave up; the lock is released.
    LoadAbandoned,
    /// A request failed; the guard is idle again.
    Failed(ProtocolError),
}

/// A call the guard cannot take in its current state, or a bad key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum StampedeError {
    /// A `get_or_load` is already in flight.
    #[error("a get_or_load is already in progress")]
    Busy,
    /// `handle_loaded` or `handle_load_failed` without a `Load` in progress.
    #[error("no load is in progress")]
    NotLoading,
    /// The cache key is empty.
    #[error("the cache key is empty")]
    EmptyKey,
    /// The key's lock cannot be built (for example a brace in the key).
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What to report once the lock is released.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Then {
    Stored,
    Abandoned,
    Failed(ProtocolError),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Idle,
    /// The first `GET` is in flight.
    Reading {
        req: RequestId,
        key: String,
    },
    /// The lock's acquire is in flight.
    Locking {
        key: String,
        wait_until: Option<Millis>,
    },
    /// Lost the lock; re-read at the `Timer::Reread` timer until `wait_until`.
    Waiting {
        key: String,
        wait_until: Millis,
    },
    /// A waiter's re-read is in flight.
    Rereading {
        req: RequestId,
        key: String,
        wait_until: Millis,
    },
    /// Won the lock; the driver is loading.
    Loading {
        key: String,
        lease: Lease,
    },
    /// The cache `SET` is in flight.
    Filling {
        req: RequestId,
    },
    /// The lock's release is in flight.
    Unlocking {
        then: Then,
    },
}

/// A single-flight cache guard. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StampedeGuard {
    /// The lock configuration; its name is the namespace of the per-key locks.
    lock_config: Config,
    cache_ttl_ms: u64,
    token: Token,
    poll: Backoff,
    lock: Option<Box<Machine>>,
    state: State,
    timers: TimerTable,
    out: Outbox,
    events: VecDeque<StampedeEvent>,
}

impl StampedeGuard {
    /// A guard whose per-key locks are `config.guard_lock` machines named
    /// `<config.name>:<key>` with `config.ttl_ms` (the load timeout), owned
    /// by `token`; loaded values are cached for `cache_ttl_ms`. Waiters
    /// re-read every `config.retry_base_ms` (± `config.retry_jitter_percent`).
    pub fn new(config: &Config, cache_ttl_ms: u64, token: Token) -> Result<Self, ConfigError> {
        config.validate_single("stampede-guard")?;
        if token.0.is_empty() {
            return Err(ConfigError::EmptyToken);
        }
        if cache_ttl_ms == 0 {
            return Err(ConfigError::ZeroTtl);
        }
        if cache_ttl_ms > MAX_TTL_MS {
            return Err(ConfigError::TtlTooLarge {
                ttl_ms: cache_ttl_ms,
                max_ms: MAX_TTL_MS,
            });
        }
        let lock = config.guard_lock;
        if lock.kind() != Kind::Lock || lock == ProtocolId::Redlock {
            return Err(ConfigError::BadGuardLock(lock.as_str()));
        }
        let poll_ms = config.retry_base_ms.max(1);
        Ok(StampedeGuard {
            lock_config: Config {
                auto_renew: false,
                wait_replicas: None,
                ..config.clone()
            },
            cache_ttl_ms,
            token,
            poll: Backoff::new(poll_ms, poll_ms, config.retry_jitter_percent, config.seed),
            lock: None,
            state: State::Idle,
            timers: TimerTable::default(),
            out: Outbox::default(),
            events: VecDeque::new(),
        })
    }

    /// The lock name guarding cache key `key`.
    pub fn lock_name(&self, key: &str) -> String {
        format!("{}:{}", self.lock_config.name, key)
    }

    // ---- mutators ----

    /// Read `key`, loading it under the key's lock on a miss.
    pub fn get_or_load(&mut self, now: Millis, key: &str) -> Result<(), StampedeError> {
        if self.state != State::Idle {
            return Err(StampedeError::Busy);
        }
        if key.is_empty() {
            return Err(StampedeError::EmptyKey);
        }
        let config = Config {
            name: self.lock_name(key).into(),
            ..self.lock_config.clone()
        };
        let lock = Machine::new(self.lock_config.guard_lock, &config, self.token.clone())?;
        self.lock = Some(Box::new(lock));
        self.poll.reset();
        let req = self.read(now, key);
        self.state = State::Reading {
            req,
            key: key.to_owned(),
        };
        Ok(())
    }

    /// The loader delivered `value`: cache it, then release the lock.
    pub fn handle_loaded(&mut self, now: Millis, value: String) -> Result<(), StampedeError> {
        let State::Loading { key, .. } = &self.state else {
            return Err(StampedeError::NotLoading);
        };
        let command = Command::Set {
            key: key.clone(),
            value,
            condition: SetCondition::Always,
            expiry: SetExpiry::Px(self.cache_ttl_ms),
            get: false,
        };
        self.timers.clear(Timer::LoadDeadline);
        let req = self.send(now, command);
        self.state = State::Filling { req };
        Ok(())
    }

    /// The loader failed: release the lock without caching anything.
    pub fn handle_load_failed(&mut self, now: Millis) -> Result<(), StampedeError> {
        if !matches!(self.state, State::Loading { .. }) {
            return Err(StampedeError::NotLoading);
        }
        self.timers.clear(Timer::LoadDeadline);
        self.unlock(now, Then::Abandoned);
        Ok(())
    }

    // ---- inputs ----

    /// A reply, or an unknown outcome, for request `id`.
    pub fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
        match route_reply(&mut self.lock, now, id, outcome) {
            Some((own, outcome)) => self.handle_own_reply(now, own, outcome),
            None => self.pump_lock(now),
        }
    }

    /// A reply, or an unknown outcome, for the guard's own request `inner`.
    fn handle_own_reply(&mut self, now: Millis, inner: RequestId, outcome: Outcome) {
        let current = match &self.state {
            State::Reading { req, .. } | State::Rereading { req, .. } | State::Filling { req } => {
                *req
            }
            _ => return,
        };
        if current != inner {
            return;
        }
        self.timers.clear(Timer::Reply);
        let state = std::mem::replace(&mut self.state, State::Idle);
        let reply = reply_of(outcome);
        match state {
            State::Reading { key, .. } => match reply {
                Ok(Reply::Bulk(value)) => self.finish(StampedeEvent::Hit(value)),
                // A miss, or no answer: try to become the loader.
                Ok(Reply::Nil) | Err(None) => self.lock_or_wait(now, key, None),
                Ok(reply) => self.finish(StampedeEvent::Failed(ProtocolError::UnexpectedReply {
                    request: "GET cache",
                    reply,
                })),
                Err(Some(e)) => self.finish(StampedeEvent::Failed(e)),
            },
            State::Rereading {
                key, wait_until, ..
            } => match reply {
                Ok(Reply::Bulk(value)) => self.finish(StampedeEvent::Hit(value)),
                Ok(Reply::Nil) | Err(None) if now >= wait_until => {
                    self.lock_or_wait(now, key, Some(wait_until))
                }
                Ok(Reply::Nil) | Err(None) => self.wait(now, key, wait_until),
                Ok(reply) => self.finish(StampedeEvent::Failed(ProtocolError::UnexpectedReply {
                    request: "GET cache",
                    reply,
                })),
                Err(Some(e)) => self.finish(StampedeEvent::Failed(e)),
            },
            State::Filling { .. } => {
                let then = match reply {
                    Ok(r) if r.is_ok() => Then::Stored,
                    Ok(reply) => Then::Failed(ProtocolError::UnexpectedReply {
                        request: "SET cache",
                        reply,
                    }),
                    Err(Some(e)) => Then::Failed(e),
                    Err(None) => {
                        Then::Failed(ProtocolError::Missing("a reply to the cache SET".into()))
                    }
                };
                self.unlock(now, then);
            }
            other => self.state = other,
        }
    }

    /// The clock reached (or passed) the instant [`StampedeGuard::poll_timeout`] gave.
    pub fn handle_timeout(&mut self, now: Millis) {
        if embedded_timeout(&mut self.lock, now) {
            self.pump_lock(now);
        }
        let due = self.timers.expire(now);
        for timer in due {
            match (timer, &self.state) {
                (Timer::Reread, State::Waiting { key, wait_until }) => {
                    let (key, wait_until) = (key.clone(), *wait_until);
                    let req = self.read(now, &key);
                    self.state = State::Rereading {
                        req,
                        key,
                        wait_until,
                    };
                }
                (Timer::LoadDeadline, State::Loading { .. }) => self.load_timed_out(),
                (Timer::Reply, State::Reading { req, .. } | State::Rereading { req, .. })
                | (Timer::Reply, State::Filling { req }) => {
                    let req = *req;
                    self.handle_own_reply(now, req, Outcome::Unknown);
                }
                _ => {}
            }
        }
    }

    // ---- outputs ----

    /// The next request to execute.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Request> {
        poll_both(&mut self.lock, &mut self.out)
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<StampedeEvent> {
        self.events.pop_front()
    }

    /// When to call [`StampedeGuard::handle_timeout`] next, if at all.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        earliest(&self.lock, self.timers.next())
    }

    /// Is a `get_or_load` in progress?
    pub fn is_busy(&self) -> bool {
        self.state != State::Idle
    }

    // ---- transitions ----

    fn send(&mut self, now: Millis, command: Command) -> RequestId {
        if let Some(t) = self.lock_config.reply_timeout_ms {
            self.timers.set(Timer::Reply, now + t);
        }
        self.out.send(NodeId(0), command)
    }

    fn read(&mut self, now: Millis, key: &str) -> RequestId {
        self.send(
            now,
            Command::Get {
                key: key.to_owned(),
            },
        )
    }

    fn finish(&mut self, event: StampedeEvent) {
        self.timers.clear_all();
        self.state = State::Idle;
        self.lock = None;
        self.events.push_back(event);
    }

    /// Try the key's lock once. A waiter whose window has passed keeps
    /// trying at every re-read until the dead loader's lock expires.
    fn lock_or_wait(&mut self, now: Millis, key: String, wait_until: Option<Millis>) {
        let started = self
            .lock
            .as_mut()
            .is_some_and(|l| l.acquire(now, Acquire::Once).is_ok());
        if !started {
            // The lock machine is still busy with an earlier attempt.
            let wait_until = wait_until.unwrap_or(now + self.lock_config.ttl_ms);
            return self.wait(now, key, wait_until);
        }
        self.state = State::Locking { key, wait_until };
        self.pump_lock(now);
    }

    fn wait(&mut self, now: Millis, key: String, wait_until: Millis) {
        self.timers.set(Timer::Reread, now + self.poll.next_delay());
        self.state = State::Waiting { key, wait_until };
    }

    fn unlock(&mut self, now: Millis, then: Then) {
        let releasing = self
            .lock
            .as_mut()
            .is_some_and(|l| l.lease().is_some() && l.release(now).is_ok());
        if releasing {
            self.state = State::Unlocking { then };
            self.pump_lock(now);
        } else {
            self.report(then);
        }
    }

    fn report(&mut self, then: Then) {
        self.finish(match then {
            Then::Stored => StampedeEvent::Stored,
            Then::Abandoned => StampedeEvent::LoadAbandoned,
            Then::Failed(e) => StampedeEvent::Failed(e),
        });
    }

    fn load_timed_out(&mut self) {
        self.finish(StampedeEvent::LoadTimedOut);
    }

    fn pump_lock(&mut self, now: Millis) {
        loop {
            let Some(event) = self.lock.as_mut().and_then(|l| l.poll_event()) else {
                return;
            };
            match (&self.state, event) {
                (State::Locking { key, .. }, Event::Acquired(lease)) => {
                    let key = key.clone();
                    self.timers.set(Timer::LoadDeadline, lease.valid_until);
                    self.state = State::Loading { key, lease };
                    self.events.push_back(StampedeEvent::Load);
                }
                (State::Locking { key, wait_until }, Event::Denied) => {
                    let key = key.clone();
                    let wait_until = wait_until.unwrap_or(now + self.lock_config.ttl_ms);
                    self.wait(now, key, wait_until);
                }
                (State::Locking { .. }, Event::Failed(e)) => {
                    self.finish(StampedeEvent::Failed(e));
                }
                (State::Loading { .. }, Event::Lost) => self.load_timed_out(),
                (
                    State::Unlocking { then },
                    Event::Released { .. } | Event::Failed(_) | Event::Lost,
                ) => {
                    let then = then.clone();
                    self.report(then);
                }
                _ => {}
            }
        }
    }
}
