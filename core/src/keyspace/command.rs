//! Redis commands and replies as data.
//!
//! This is the vocabulary shared by the protocols (which emit [`Command`]s),
//! the keyspace model (which executes them) and the Redis adapter (which sends
//! them to a real server and turns the answer into a [`Reply`]).
//!
//! Keys, members and values are UTF-8 strings and sorted-set scores are
//! integers: every protocol in the catalogue stores tokens, counters and
//! millisecond timestamps, and integers keep the states hashable.

use super::script::Script;
use std::borrow::Cow;

/// The condition of a `SET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetCondition {
    /// Plain `SET`: always write.
    Always,
    /// `SET .. NX`: only when the key does not exist.
    Nx,
    /// `SET .. XX`: only when the key exists.
    Xx,
}

/// The expiry option of a `SET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetExpiry {
    /// No expiry option: the key loses any TTL it had.
    None,
    /// `PX ms`: expire `ms` milliseconds after the node's current time.
    Px(u64),
    /// `PXAT unix-ms`: expire at this instant of the node's clock.
    PxAt(u64),
}

/// One end of a `ZREMRANGEBYSCORE` range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScoreBound {
    /// `-inf`.
    NegInf,
    /// `+inf`.
    PosInf,
    /// An inclusive bound, `5`.
    Inclusive(i64),
    /// An exclusive bound, `(5`.
    Exclusive(i64),
}

/// A Redis command of the subset the catalogue uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// `SET key value [NX|XX] [PX ms|PXAT ms] [GET]`.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// `NX`, `XX` or neither.
        condition: SetCondition,
        /// `PX`, `PXAT` or neither.
        expiry: SetExpiry,
        /// `GET`: reply with the old value instead of `OK`/nil.
        get: bool,
    },
    /// `SETNX key value`.
    SetNx {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// `GET key`.
    Get {
        /// The key.
        key: String,
    },
    /// `GETSET key value`.
    GetSet {
        /// The key.
        key: String,
        /// The new value.
        value: String,
    },
    /// `DEL key [key ...]`.
    Del {
        /// The keys.
        keys: Vec<String>,
    },
    /// `EXISTS key [key ...]`.
    Exists {
        /// The keys.
        keys: Vec<String>,
    },
    /// `EXPIRE key seconds`.
    Expire {
        /// The key.
        key: String,
        /// Seconds from now; zero or negative deletes the key.
        seconds: i64,
    },
    /// `PEXPIRE key ms`.
    PExpire {
        /// The key.
        key: String,
        /// Milliseconds from now; zero or negative deletes the key.
        millis: i64,
    },
    /// `TTL key`.
    Ttl {
        /// The key.
        key: String,
    },
    /// `PTTL key`.
    PTtl {
        /// The key.
        key: String,
    },
    /// `INCR key`.
    Incr {
        /// The key.
        key: String,
    },
    /// `HINCRBY key field by`.
    HIncrBy {
        /// The key.
        key: String,
        /// The field.
        field: String,
        /// The increment.
        by: i64,
    },
    /// `HEXISTS key field`.
    HExists {
        /// The key.
        key: String,
        /// The field.
        field: String,
    },
    /// `HGET key field`.
    HGet {
        /// The key.
        key: String,
        /// The field.
        field: String,
    },
    /// `HDEL key field [field ...]`.
    HDel {
        /// The key.
        key: String,
        /// The fields.
        fields: Vec<String>,
    },
    /// `SADD key member [member ...]`.
    SAdd {
        /// The key.
        key: String,
        /// The members.
        members: Vec<String>,
    },
    /// `SREM key member [member ...]`.
    SRem {
        /// The key.
        key: String,
        /// The members.
        members: Vec<String>,
    },
    /// `SCARD key`.
    SCard {
        /// The key.
        key: String,
    },
    /// `SISMEMBER key member`.
    SIsMember {
        /// The key.
        key: String,
        /// The member.
        member: String,
    },
    /// `ZADD key score member [score member ...]`.
    ZAdd {
        /// The key.
        key: String,
        /// `(score, member)` pairs.
        members: Vec<(i64, String)>,
    },
    /// `ZREM key member [member ...]`.
    ZRem {
        /// The key.
        key: String,
        /// The members.
        members: Vec<String>,
    },
    /// `ZRANK key member`.
    ZRank {
        /// The key.
        key: String,
        /// The member.
        member: String,
    },
    /// `ZSCORE key member`.
    ZScore {
        /// The key.
        key: String,
        /// The member.
        member: String,
    },
    /// `ZCARD key`.
    ZCard {
        /// The key.
        key: String,
    },
    /// `ZREMRANGEBYSCORE key min max`.
    ZRemRangeByScore {
        /// The key.
        key: String,
        /// The lower bound.
        min: ScoreBound,
        /// The upper bound.
        max: ScoreBound,
    },
    /// `ZINTERSTORE dest numkeys key [key ...] WEIGHTS w [w ...]` (aggregate `SUM`).
    ZInterStore {
        /// The destination key.
        dest: String,
        /// The source keys.
        keys: Vec<String>,
        /// One weight per source key.
        weights: Vec<i64>,
    },
    /// `TIME`.
    Time,
    /// `WATCH key [key ...]` on this connection.
    Watch {
        /// The keys.
        keys: Vec<String>,
    },
    /// `UNWATCH` on this connection.
    Unwatch,
    /// `MULTI` on this connection.
    Multi,
    /// `EXEC` on this connection.
    Exec,
    /// `DISCARD` on this connection.
    Discard,
    /// `MULTI`, the commands, `EXEC`, sent together as one pipeline on this
    /// connection. The reply is `EXEC`'s: an array of replies, or nil when a
    /// watched key changed.
    Transaction(Vec<Command>),
    /// `WAIT numreplicas timeout`: block until that many replicas acknowledged
    /// this connection's writes. A lone node has no replicas and answers 0;
    /// a model with replicas answers it itself.
    Wait {
        /// Replicas to wait for.
        replicas: u32,
        /// Give up after this many ms.
        timeout_ms: u64,
    },
    /// `PUBLISH channel message` (the model has no subscribers: replies 0).
    Publish {
        /// The channel.
        channel: String,
        /// The message.
        message: String,
    },
    /// `EVALSHA`/`EVAL` of one of the catalogue's scripts: one atomic step.
    Eval {
        /// Which script.
        script: Script,
        /// `KEYS`.
        keys: Vec<String>,
        /// `ARGV`.
        args: Vec<String>,
    },
}

/// A reply from Redis (RESP2 shapes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The nil bulk string or nil array.
    Nil,
    /// A status reply such as `OK` or `QUEUED` (borrowed for the ones the
    /// core writes itself, so that an `OK` costs no allocation).
    Status(Cow<'static, str>),
    /// An integer reply.
    Int(i64),
    /// A bulk string.
    Bulk(String),
    /// An array.
    Array(Vec<Reply>),
    /// An error reply, such as `WRONGTYPE Operation against a key holding the wrong kind of value`.
    Error(String),
}

impl Reply {
    /// The `OK` status.
    pub fn ok() -> Reply {
        Reply::Status(Cow::Borrowed("OK"))
    }

    /// Is this the `OK` status?
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s == "OK")
    }

    /// The integer, if this is an integer reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The string, if this is a bulk or status reply.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Bulk(s) => Some(s),
            Reply::Status(s) => Some(s),
            _ => None,
        }
    }
}

/// The error text Redis replies with on wrong-type access.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
