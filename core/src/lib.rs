//! # lockwright-core
//!
//! This crate contains no networking code and reads no clock: it is the
//! sans-IO core of lockwright. It holds
//!
//! - every lock and semaphore of the [catalogue](catalogue::catalogue) as a
//!   pure state machine implementing [`Protocol`];
//! - a pure model of the Redis keyspace those protocols use
//!   ([`keyspace::Keyspace`]), with expiry judged against each node's own
//!   clock, so that a model checker can skew, jump and restart nodes;
//! - the Lua scripts, stored once ([`keyspace::Script`]).
//!
//! The same machines are driven by the stateright model and the
//! deterministic simulator (`lockwright-model`), the Redis adapter
//! (`lockwright-redis`) and any other front end.
//!
//! ## Driving a machine
//!
//! Inputs go in through `handle_*` and the mutators; outputs are drained with
//! `poll_*`. **After every input, drain the outputs**: execute every request,
//! hand every reply back with its id, then arm one timer for
//! [`Protocol::poll_timeout`]. A reply that never comes is handed back as
//! [`Outcome::Unknown`]. Here a keyspace plays the Redis server:
//!
//! ```
//! use lockwright_core::keyspace::{ConnId, Keyspace};
//! use lockwright_core::{Acquire, Config, Event, Machine, Millis, Outcome, Protocol, ProtocolId, Token};
//!
//! let mut redis = Keyspace::new();
//! let config = Config { ttl_ms: 1_000, ..Config::new("orders") };
//! let mut lock = Machine::new(ProtocolId::SetPxLua, &config, Token("me".into())).unwrap();
//!
//! // One pass of a driver: run every request, feed every reply back,
//! // collect the events.
//! fn drive(lock: &mut Machine, redis: &mut Keyspace, now: Millis) -> Vec<Event> {
//!     while let Some(request) = lock.poll_transmit() {
//!         // A real driver sends `request.command` to node `request.node`.
//!         let reply = redis.execute(ConnId(0), now, &request.command);
//!         lock.handle_reply(now, request.id, Outcome::Reply(reply));
//!     }
//!     std::iter::from_fn(|| lock.poll_event()).collect()
//! }
//!
//! let mut now = Millis(0);
//! lock.acquire(now, Acquire::Once).unwrap();
//! let events = drive(&mut lock, &mut redis, now);
//! let Some(Event::Acquired(lease)) = events.first() else { panic!("{events:?}") };
//! assert_eq!(lease.valid_until, Millis(1_000 - 12)); // ttl − drift (ttl/100 + 2)
//!
//! // Nothing to do until the lease runs out: the driver sleeps until then.
//! assert_eq!(lock.poll_timeout(), Some(lease.valid_until));
//! now = Millis(500);
//! lock.release(now).unwrap();
//! assert_eq!(drive(&mut lock, &mut redis, now), [Event::Released { was_held: true }]);
//! ```

pub mod catalogue;
pub mod config;
pub(crate) mod engine;
pub mod keyspace;
pub mod locks;
pub mod protocol;
pub mod rng;
pub mod semaphores;
pub mod stampede;
pub mod time;

pub use catalogue::{
    applications, catalogue, ApplicationEntry, CatalogueEntry, ClockUse, Kind, Machine, ProtocolId,
};
pub use config::{Config, ConfigError};
pub use protocol::{
    Acquire, Call, Event, Extension, Fence, Lease, NodeId, Outcome, Protocol, ProtocolError,
    Request, RequestId, Token, UsageError,
};
pub use time::Millis;
