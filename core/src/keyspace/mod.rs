//! A pure model of one Redis node: the subset of commands the catalogue uses.
//!
//! Expiry is judged lazily against the node's own clock, passed to every call,
//! with Redis' rule (a key is expired when `now > deadline`), so a model can
//! skew and jump node clocks independently.
//!
//! The model follows Redis 7 reply for reply, error text for error text: a
//! conformance test runs the same commands against a real `redis-server` and
//! requires identical replies. It is built in three layers:
//!
//! - **connections** (this file): `WATCH`, `MULTI`, `EXEC`, `DISCARD` and the
//!   queue of each connection, in [`Keyspace::execute`];
//! - **commands** (`semantics.rs`): what each data command does to the keys,
//!   including lazy expiry and which writes "touch" a key for `WATCH`;
//! - **scripts** ([`script`]): each Lua script's text, and its meaning written
//!   once in Rust as the same sequence of `redis.call`s on the command layer.
//!
//! ## `WATCH` and expiry
//!
//! Redis marks a watching connection dirty when a watched key is *touched*:
//! a real modification (a `SET`, a `DEL` that deleted, a `ZADD` that changed
//! something; not a failed `SET NX` nor a `DEL` of a missing key). Expiry
//! counts as a modification only for keys that were live when watched
//! (Redis ≥ 6.0.9): such a key aborts the `EXEC` when it is expired at `EXEC`
//! time or was deleted by expiry meanwhile, while a key that was already
//! expired at `WATCH` time is treated as missing. As in Redis, a dirty
//! connection forgets its watched keys, which also keeps model states small.
//!
//! Known limits: scores are `i64` (Redis uses doubles, the same for every
//! integer below 2^53, which covers millisecond timestamps), and a script that
//! fails in Lua itself (not in a `redis.call`) gets a generic `ERR` text.

mod command;
pub mod script;
mod semantics;
pub mod wire;

pub use command::{Command, Reply, ScoreBound, SetCondition, SetExpiry, WRONGTYPE};
pub use script::Script;
pub use wire::Arg;

use crate::time::Millis;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

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

impl Value {
    /// Redis' name of the type, as `TYPE` prints it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::Set(_) => "set",
            Value::ZSet(_) => "zset",
        }
    }
}

/// One key's value and absolute expiry deadline on the node clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Expiry deadline (ms on the node's clock), if any.
    pub expires_at: Option<u64>,
}

impl Entry {
    /// Is the key expired at node time `now`? Redis' rule: `now > deadline`,
    /// so at `now == deadline` the key is still live.
    pub fn is_expired(&self, now: Millis) -> bool {
        self.expires_at.is_some_and(|deadline| now.0 > deadline)
    }

    /// The remaining time to live at `now` as `PTTL` reports it for a live
    /// key: `None` without a deadline, else the milliseconds left (0 once
    /// the deadline is reached).
    pub fn pttl(&self, now: Millis) -> Option<u64> {
        self.expires_at
            .map(|deadline| deadline.saturating_sub(now.0))
    }
}

/// How a key was when a connection watched it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum WatchedAs {
    /// The key existed and was live: its later expiry aborts the `EXEC`.
    Live,
    /// The key was missing or already expired: only a real write aborts.
    Missing,
}

/// The queue of a connection inside `MULTI`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Queue {
    /// The queued commands, in order.
    commands: Vec<Command>,
    /// A command was rejected while queueing: `EXEC` answers `EXECABORT`.
    rejected: bool,
}

/// The `WATCH` and `MULTI` state of one connection. A connection in its
/// default state is not stored, so that equal behaviour means equal states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Session {
    /// Watched keys (forgotten once the connection is dirty).
    watched: BTreeMap<String, WatchedAs>,
    /// A watched key was touched: the next `EXEC` aborts.
    dirty: bool,
    /// Inside `MULTI`: the queue.
    queue: Option<Queue>,
}

impl Session {
    fn is_idle(&self) -> bool {
        self.watched.is_empty() && !self.dirty && self.queue.is_none()
    }
}

/// The reply to `EXEC` after a command was rejected while queueing.
const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// One Redis node's keyspace and per-connection state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Keyspace {
    entries: BTreeMap<String, Entry>,
    sessions: BTreeMap<ConnId, Session>,
}

// Getters.
impl Keyspace {
    /// An empty node.
    pub fn new() -> Keyspace {
        Keyspace::default()
    }

    /// Every stored key, in key order, including keys that are expired but
    /// not yet deleted (Redis deletes lazily).
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> + '_ {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// The keys live at node time `now`, in key order.
    pub fn live(&self, now: Millis) -> impl Iterator<Item = (&str, &Entry)> + '_ {
        self.entries().filter(move |(_, e)| !e.is_expired(now))
    }

    /// The stored entry of `key`, expired or not (see [`Entry::is_expired`]).
    pub fn get_entry(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The entry of `key` if it is live at `now`.
    pub fn get_live(&self, key: &str, now: Millis) -> Option<&Entry> {
        self.entries.get(key).filter(|e| !e.is_expired(now))
    }

    /// Does `conn` have a `MULTI` open?
    pub fn in_multi(&self, conn: ConnId) -> bool {
        self.sessions.get(&conn).is_some_and(|s| s.queue.is_some())
    }

    /// A compact rendering of the live keys for traces, sorted by key:
    /// `{orders}="tok-a" (pttl 30), {orders}:fence=3`. Strings are quoted
    /// unless they are integers; hashes print as `{field: value}`, sets as
    /// `{a, b}`, sorted sets as `[member: score]` in rank order. An empty
    /// node renders as `(empty)`.
    pub fn render(&self, now: Millis) -> String {
        let mut out = String::new();
        for (key, entry) in self.live(now) {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(key);
            out.push('=');
            render_value(&mut out, &entry.value);
            if let Some(pttl) = entry.pttl(now) {
                let _ = write!(out, " (pttl {pttl})");
            }
        }
        if out.is_empty() {
            out.push_str("(empty)");
        }
        out
    }
}

fn render_scalar(out: &mut String, s: &str) {
    if semantics::parse_i64(s).is_some() {
        out.push_str(s);
    } else {
        let _ = write!(out, "{s:?}");
    }
}

fn render_value(out: &mut String, value: &Value) {
    match value {
        Value::Str(s) => render_scalar(out, s),
        Value::Hash(h) => {
            out.push('{');
            for (i, (f, v)) in h.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_scalar(out, f);
                out.push_str(": ");
                render_scalar(out, v);
            }
            out.push('}');
        }
        Value::Set(s) => {
            out.push('{');
            for (i, m) in s.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_scalar(out, m);
            }
            out.push('}');
        }
        Value::ZSet(z) => {
            out.push('[');
            for (i, (m, score)) in semantics::by_rank(z).into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_scalar(out, m);
                let _ = write!(out, ": {score}");
            }
            out.push(']');
        }
    }
}

// Inputs.
impl Keyspace {
    /// Execute one command arriving on `conn` at node time `now`, with Redis'
    /// reply. Inside `MULTI` a data command is queued (`QUEUED`) and runs at
    /// `EXEC`; [`Command::Transaction`] is `MULTI`, its commands and `EXEC`
    /// in one step, replying with `EXEC`'s reply.
    pub fn execute(&mut self, conn: ConnId, now: Millis, command: &Command) -> Reply {
        if let Command::Transaction(commands) = command {
            // A pipeline: every reply but EXEC's is read and dropped by the client.
            self.execute(conn, now, &Command::Multi);
            for c in commands {
                self.execute(conn, now, c);
            }
            return self.execute(conn, now, &Command::Exec);
        }
        // Redis checks the arity before anything else, and a rejected
        // command inside MULTI dooms the transaction.
        if let Some(error) = semantics::arity_error(command) {
            if let Some(queue) = self.queue_mut(conn) {
                queue.rejected = true;
            }
            return error;
        }
        let in_multi = self.in_multi(conn);
        match command {
            Command::Multi if in_multi => Reply::Error("ERR MULTI calls can not be nested".into()),
            Command::Multi => {
                self.session_mut(conn).queue = Some(Queue::default());
                Reply::ok()
            }
            Command::Exec => self.exec(conn, now.0),
            Command::Discard if in_multi => {
                self.sessions.remove(&conn);
                Reply::ok()
            }
            Command::Discard => Reply::Error("ERR DISCARD without MULTI".into()),
            Command::Watch { .. } if in_multi => {
                Reply::Error("ERR WATCH inside MULTI is not allowed".into())
            }
            Command::Watch { keys } => {
                self.watch(conn, now.0, keys);
                Reply::ok()
            }
            _ if in_multi => {
                if let Some(queue) = self.queue_mut(conn) {
                    queue.commands.push(command.clone());
                }
                Reply::Status(Cow::Borrowed("QUEUED"))
            }
            Command::Unwatch => {
                self.unwatch(conn);
                Reply::ok()
            }
            _ => self.apply(now.0, command),
        }
    }

    fn session_mut(&mut self, conn: ConnId) -> &mut Session {
        self.sessions.entry(conn).or_default()
    }

    fn queue_mut(&mut self, conn: ConnId) -> Option<&mut Queue> {
        self.sessions.get_mut(&conn).and_then(|s| s.queue.as_mut())
    }

    fn watch(&mut self, conn: ConnId, now: u64, keys: &[String]) {
        let mut marks = Vec::with_capacity(keys.len());
        for key in keys {
            let live = self
                .entries
                .get(key)
                .is_some_and(|e| !e.is_expired(Millis(now)));
            marks.push(if live {
                WatchedAs::Live
            } else {
                WatchedAs::Missing
            });
        }
        let session = self.session_mut(conn);
        // A dirty connection's EXEC fails anyway: Redis does not record more.
        if session.dirty {
            return;
        }
        for (key, mark) in keys.iter().zip(marks) {
            // Watching a key twice keeps the first mark, as in Redis.
            session.watched.entry(key.clone()).or_insert(mark);
        }
    }

    fn unwatch(&mut self, conn: ConnId) {
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.watched.clear();
            session.dirty = false;
            if session.is_idle() {
                self.sessions.remove(&conn);
            }
        }
    }

    fn exec(&mut self, conn: ConnId, now: u64) -> Reply {
        let Some(session) = self.sessions.remove(&conn) else {
            return Reply::Error("ERR EXEC without MULTI".into());
        };
        let Some(queue) = session.queue else {
            // Not in MULTI: keep the WATCH state as it was.
            self.sessions.insert(conn, session);
            return Reply::Error("ERR EXEC without MULTI".into());
        };
        // EXEC always ends the transaction and unwatches (the session is gone).
        if queue.rejected {
            return Reply::Error(EXECABORT.into());
        }
        let expired_since_watch = session.watched.iter().any(|(key, mark)| {
            *mark == WatchedAs::Live
                && self
                    .entries
                    .get(key)
                    .is_some_and(|e| e.is_expired(Millis(now)))
        });
        if session.dirty || expired_since_watch {
            return Reply::Nil;
        }
        Reply::Array(queue.commands.iter().map(|c| self.apply(now, c)).collect())
    }

    /// A real modification of `key`: every connection watching it is dirty.
    fn touch(&mut self, key: &str) {
        for session in self.sessions.values_mut() {
            if session.watched.contains_key(key) {
                session.dirty = true;
                session.watched.clear();
            }
        }
    }

    /// `key` was deleted because it expired: only connections that watched
    /// it while it was live are dirty (Redis ≥ 6.0.9).
    fn touch_expired(&mut self, key: &str) {
        for session in self.sessions.values_mut() {
            if session.watched.get(key) == Some(&WatchedAs::Live) {
                session.dirty = true;
                session.watched.clear();
            }
        }
    }

    /// Redis' lazy expiry: delete `key` when it is expired at `now`.
    fn expire_if_needed(&mut self, now: u64, key: &str) {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.is_expired(Millis(now)))
        {
            self.entries.remove(key);
            self.touch_expired(key);
        }
    }
}

// Mutators for models and tests.
impl Keyspace {
    /// The node restarted without persistence: every key and every
    /// connection's state is lost (see [`Keyspace::drop_connections`] for
    /// what a watching connection sees next).
    pub fn restart(&mut self) {
        self.entries.clear();
        self.drop_connections();
    }

    /// Forget one connection's `WATCH` and `MULTI` state (it disconnected).
    pub fn drop_connection(&mut self, conn: ConnId) {
        self.sessions.remove(&conn);
    }

    /// The connection `from` goes on as `to` (with its `WATCH` and `MULTI`
    /// state): a driver retired it for its later requests while what it
    /// already wrote is still to run.
    pub fn move_connection(&mut self, from: ConnId, to: ConnId) {
        match self.sessions.remove(&from) {
            Some(session) => {
                self.sessions.insert(to, session);
            }
            None => {
                self.sessions.remove(&to);
            }
        }
    }

    /// Every connection is reset (the node restarted or failed over): its
    /// `WATCH` and `MULTI` state is lost. A connection that was watching keys
    /// answers its next `EXEC` with nil: a driver that loses a watching
    /// connection must report the transaction as aborted, never replay it
    /// unwatched on a new connection (redis-py raises `WatchError` there).
    pub fn drop_connections(&mut self) {
        let watching: Vec<ConnId> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.watched.is_empty() || s.dirty)
            .map(|(c, _)| *c)
            .collect();
        self.sessions.clear();
        for conn in watching {
            self.sessions.insert(
                conn,
                Session {
                    dirty: true,
                    ..Session::default()
                },
            );
        }
    }

    /// Physically delete every key expired at `now`, as Redis' active expiry
    /// does; connections that watched such a key while it was live become
    /// dirty, exactly as if the key had been deleted lazily.
    pub fn purge_expired(&mut self, now: Millis) {
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.is_expired(now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.entries.remove(&key);
            self.touch_expired(&key);
        }
    }

    /// Copy `master`'s keys (not its connections): a replica catching up.
    /// Every key that changes touches this node's watchers, as the
    /// replication stream would.
    pub fn replicate_from(&mut self, master: &Keyspace) {
        let changed: BTreeSet<String> = self
            .entries
            .iter()
            .filter(|(k, e)| master.entries.get(*k) != Some(e))
            .chain(
                master
                    .entries
                    .iter()
                    .filter(|(k, e)| self.entries.get(*k) != Some(e)),
            )
            .map(|(k, _)| k.clone())
            .collect();
        for key in &changed {
            self.touch(key);
        }
        self.entries = master.entries.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_px(key: &str, value: &str, ms: u64) -> Command {
        Command::Set {
            key: key.into(),
            value: value.into(),
            condition: SetCondition::Always,
            expiry: SetExpiry::Px(ms),
            get: false,
        }
    }

    #[test]
    fn idle_sessions_are_not_stored() {
        let mut ks = Keyspace::new();
        let c = ConnId(1);
        ks.execute(
            c,
            Millis(0),
            &Command::Watch {
                keys: vec!["k".into()],
            },
        );
        assert_eq!(ks.sessions.len(), 1);
        ks.execute(c, Millis(0), &Command::Unwatch);
        assert_eq!(ks, Keyspace::new());
        ks.execute(c, Millis(0), &Command::Multi);
        ks.execute(c, Millis(0), &Command::Exec);
        assert_eq!(ks, Keyspace::new());
    }

    #[test]
    fn dirty_connection_forgets_its_watched_keys() {
        let mut ks = Keyspace::new();
        let (a, b) = (ConnId(1), ConnId(2));
        ks.execute(
            a,
            Millis(0),
            &Command::Watch {
                keys: vec!["k".into(), "j".into()],
            },
        );
        ks.execute(b, Millis(0), &set_px("k", "v", 10));
        let session = &ks.sessions[&a];
        assert!(session.dirty);
        assert!(session.watched.is_empty());
    }

    #[test]
    fn render_shows_live_keys_sorted_with_pttl() {
        let mut ks = Keyspace::new();
        ks.execute(ConnId(0), Millis(0), &set_px("{orders}", "tok-a", 30));
        ks.execute(
            ConnId(0),
            Millis(0),
            &Command::Incr {
                key: "{orders}:fence".into(),
            },
        );
        ks.execute(ConnId(0), Millis(0), &set_px("gone", "x", 1));
        assert_eq!(
            ks.render(Millis(2)),
            r#"{orders}="tok-a" (pttl 28), {orders}:fence=1"#
        );
        assert_eq!(Keyspace::new().render(Millis(0)), "(empty)");
    }
}
