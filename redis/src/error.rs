//! The adapter's typed errors.

use lockwright_core::{ConfigError, Kind, ProtocolError, ProtocolId, UsageError};

/// Everything a lock or semaphore operation can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work (empty name, TTL 0, TTL too large, ...).
    #[error("bad configuration: {0}")]
    Config(#[from] ConfigError),
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
    /// An extend did not go through (no reply); the old lease still stands.
    #[error("the extend got no answer; the old lease still stands")]
    NotExtended,
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
