//! A pure model of one Redis node: the subset of commands the catalogue uses.
//!
//! Expiry is judged lazily against the node's own clock, passed to every call,
//! with Redis' rule (a key is expired when `now > deadline`), so a model can
//! skew and jump node clocks independently.

mod command;
pub mod script;

pub use command::{Command, Reply, ScoreBound, SetCondition, SetExpiry, WRONGTYPE};
pub use script::Script;

use crate::time::Millis;
use std::collections::{BTreeMap, BTreeSet};

/// The connection a command arrives on (WATCH and MULTI state are per connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

/// A stored value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// A string.
    Str(String),
    /// A hash.
    Hash(BTreeMap<String, String>),
    /// A set.
    Set(BTreeSet<String>),
    /// A sorted set: member → integer score.
    ZSet(BTreeMap<String, i64>),
}

/// One key's value and absolute expiry deadline on the node clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Expiry deadline (ms on the node's clock), if any.
    pub expires_at: Option<u64>,
}

/// One Redis node's keyspace and per-connection state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Keyspace {
    entries: BTreeMap<String, Entry>,
}

impl Keyspace {
    /// An empty node.
    pub fn new() -> Keyspace {
        Keyspace::default()
    }

    /// Execute one command arriving on `conn` at node time `now`.
    pub fn execute(&mut self, _conn: ConnId, _now: Millis, _command: &Command) -> Reply {
        Reply::Error("ERR not implemented".into())
    }
}
