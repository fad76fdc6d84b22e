//! The adapter's typed errors.

use lockwright_core::{ConfigError, Kind, ProtocolError, ProtocolId, UsageError};
use std::time::Duration;

/// Everything a lock or semaphore operation can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work (empty name, TTL 0, TTL too large, ...).
    #[error("bad configuration: {0}")]
    Config(#[from] ConfigError),
    /// The adapter's options cannot work (see [`OptionsError`]).
    #[error("bad options: {0}")]
    Options(#[from] OptionsError),
    /// A semaphore's limit could not be read, written or used.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A lock was asked for with a semaphore protocol, or the other way round.
    #[error("{protocol} is a {actual:?}, not a {wanted:?}")]
    WrongKind {
        /// The protocol asked for.
        protocol: ProtocolId,
        /// What the caller wanted.
        wanted: Kind,
        /// What the protocol is.
        actual: Kind,
    },
    /// Redis answered with an error reply, kept in full (for example
    /// `WRONGTYPE Operation against a key holding the wrong kind of value`).
    #[error("redis replied with an error: {0}")]
    Redis(String),
    /// A reply had a shape the protocol does not expect.
    #[error("unexpected reply to {request}: {reply}")]
    UnexpectedReply {
        /// What was asked.
        request: &'static str,
        /// What came back, rendered.
        reply: String,
    },
    /// `WAIT` after the grant was acknowledged by fewer replicas than asked;
    /// the grant has been undone.
    #[error("{acknowledged} of {wanted} replicas acknowledged the grant")]
    ReplicasNotAcknowledged {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acknowledged: u32,
    },
    /// Something the protocol needs is missing on the server.
    #[error("missing on the server: {0}")]
    Missing(String),
    /// `acquire_timeout` ran out before the lock could be taken.
    #[error("timed out waiting for the lock")]
    Timeout,
    /// No node could be reached (connection refused, dropped or timed out).
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// The call was made in a state that does not allow it.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// An extend did not go through; the old lease still stands.
    #[error("the extend did not go through; the old lease still stands")]
    NotExtended,
    /// A release, extend or reenter got no reply (the server is stopped, the
    /// connection dropped, the request timed out): whether Redis applied it
    /// is unknown. After an unknown release the hold may still stand on the
    /// server until its TTL ends it; after an unknown extend the old lease
    /// still bounds what this process may assume.
    #[error("the {operation} got no reply, its outcome is unknown: {reason}")]
    OutcomeUnknown {
        /// The operation whose outcome is unknown.
        operation: Operation,
        /// The connection problem behind it.
        reason: String,
    },
    /// The server refused our credentials (`AUTH` failed). No retry helps.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The node's host name does not resolve. No retry helps.
    #[error("unknown host: {0}")]
    UnknownHost(String),
    /// The server sent something that is not the Redis protocol. No retry
    /// helps.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The servers are not the deployment the [`Nodes`](crate::Nodes) say
    /// they are: a Cluster seed with cluster support disabled, a Sentinel
    /// that is a plain server or does not know the master's name. No retry
    /// helps.
    #[error("not the deployment the nodes describe: {0}")]
    Topology(String),
    /// RedLock: too few masters answered to reach a quorum, so "taken" could
    /// not be told from "unreachable".
    #[error("{answered} of {nodes} masters answered, {quorum} needed: {reason}")]
    QuorumUnreachable {
        /// Masters that answered the last attempt.
        answered: usize,
        /// Masters in all.
        nodes: usize,
        /// Masters a grant needs.
        quorum: usize,
        /// The connection problem of a master that did not answer.
        reason: String,
    },
    /// The hold is gone: its validity ran out or someone else holds the key.
    #[error("the hold was lost")]
    Lost,
    /// The driver task is gone (the runtime is shutting down).
    #[error("the lock's driver task has stopped")]
    DriverGone,
    /// The cache loader failed (its error, rendered).
    #[error("the cache loader failed: {0}")]
    Load(String),
    /// A cache-stampede guard call was refused (empty key, ...).
    #[error(transparent)]
    Stampede(#[from] lockwright_core::stampede::StampedeError),
    /// The OS random number generator failed to produce an owner token.
    #[error("the OS random number generator failed: {0}")]
    Random(String),
}

/// [`LockOptions`](crate::LockOptions) that cannot work, found when the lock
/// or semaphore is built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A reply could arrive after the lease it grants has ended: the
    /// request timeout must be shorter than the TTL.
    #[error("the request timeout ({request_timeout:?}) must be shorter than the TTL ({ttl:?})")]
    RequestTimeoutNotBelowTtl {
        /// The request timeout asked for.
        request_timeout: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// Redis counts TTLs in whole milliseconds; a TTL under one millisecond
    /// would be zero there. (Longer TTLs are cut to whole milliseconds.)
    #[error("a TTL of {ttl:?} is below Redis' 1 ms resolution")]
    SubMillisecondTtl {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// `limit` belongs to semaphores; a lock has one holder.
    #[error("a lock has one holder; limit {limit} is for semaphores")]
    LimitOnLock {
        /// The limit asked for.
        limit: u32,
    },
    /// The protocol `WATCH`es, which needs a connection of its own to one
    /// node; a Cluster's requests go through the cluster connection.
    #[error("{protocol} uses WATCH, which lockwright does not run on a Redis Cluster")]
    WatchOnCluster {
        /// The protocol asked for.
        protocol: ProtocolId,
    },
    /// [`Nodes::sentinel`](crate::Nodes::sentinel) was given no Sentinel.
    #[error("a Sentinel group needs at least one Sentinel")]
    NoSentinels,
    /// [`Nodes::cluster`](crate::Nodes::cluster) was given no seed node.
    #[error("a Cluster needs at least one seed node")]
    NoSeeds,
    /// `auto_renew` was asked of a protocol that never renews (only
    /// `reentrant`, `fenced`, `time-fenced`, `lease-semaphore` and
    /// `time-fenced-semaphore` do).
    #[error("{protocol} does not renew; auto_renew is for reentrant, fenced, time-fenced, lease-semaphore and time-fenced-semaphore")]
    AutoRenewWithoutRenewal {
        /// The protocol asked for.
        protocol: ProtocolId,
    },
}

/// What is wrong with a semaphore's limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The limit key is not set (`watch-semaphore` needs an administrator
    /// to set it; `lease-semaphore` and `time-fenced-semaphore` store their
    /// `limit` option there at the first acquire).
    #[error("the semaphore's limit key {key} is not set")]
    Missing {
        /// The limit key.
        key: String,
    },
    /// The limit key holds something other than a positive number.
    #[error("the semaphore's limit key {key} holds {value:?}, not a positive number")]
    NotANumber {
        /// The limit key.
        key: String,
        /// What it holds.
        value: String,
    },
    /// The protocol keeps no limit on the server: each client passes its
    /// own `limit` (`zset-semaphore`, `fair-semaphore`,
    /// `fair-semaphore-locked`), so there is nothing to change for others.
    #[error("{protocol} keeps no limit on the server; each client uses its own `limit` option")]
    PerClient {
        /// The protocol.
        protocol: ProtocolId,
    },
}

/// Which operation of a held guard an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`LockGuard::release`](crate::LockGuard::release).
    Release,
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    Extend,
    /// [`LockGuard::reenter`](crate::LockGuard::reenter): the level may have
    /// been taken on the server without being counted here; the last
    /// release takes it off too.
    Reenter,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Release => "release",
            Operation::Extend => "extend",
            Operation::Reenter => "reenter",
        })
    }
}

impl Error {
    /// Redis answered `WRONGTYPE`: the key holds a value of another type
    /// than the protocol uses.
    pub fn is_wrong_type(&self) -> bool {
        matches!(self, Error::Redis(text) if text.starts_with("WRONGTYPE"))
    }

    /// Is this an error that retrying cannot mend (authentication, unknown
    /// host, a protocol error, an error reply)?
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::Auth(_) | Error::UnknownHost(_) | Error::Protocol(_) | Error::Redis(_)
        )
    }
}

impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Error {
        match e {
            ProtocolError::Redis(text) => Error::Redis(text),
            ProtocolError::UnexpectedReply { request, reply } => Error::UnexpectedReply {
                request,
                reply: format!("{reply:?}"),
            },
            ProtocolError::ReplicasNotAcknowledged {
                wanted,
                acknowledged,
            } => Error::ReplicasNotAcknowledged {
                wanted,
                acknowledged,
            },
            ProtocolError::Missing(what) => Error::Missing(what),
        }
    }
}
