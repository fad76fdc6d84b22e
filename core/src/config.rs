//! Construction parameters, validated into typed errors.

use crate::catalogue::ProtocolId;
use crate::engine::Backoff;
use std::sync::Arc;

/// The largest TTL accepted, in ms: 2^53 − 1. Redis accepts `PX` up to
/// `i64::MAX − now`, and Lua turns `ARGV` numbers into doubles, which are
/// exact up to 2^53; staying below both keeps every script exact.
pub const MAX_TTL_MS: u64 = (1 << 53) - 1;

/// The largest semaphore limit accepted.
pub const MAX_LIMIT: u32 = 1 << 20;

/// The largest number of RedLock masters accepted.
pub const MAX_NODES: u8 = 15;

/// A configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ConfigError {
    /// The lock name is empty.
    #[error("the lock name is empty")]
    EmptyName,
    /// The name contains `{` or `}`, which would break the `{name}` hash tag.
    #[error("the lock name {0:?} contains a brace, which would break its {{name}} hash tag")]
    BraceInName(String),
    /// The owner token is empty.
    #[error("the owner token is empty")]
    EmptyToken,
    /// TTL of zero.
    #[error("the TTL is zero")]
    ZeroTtl,
    /// TTL above [`MAX_TTL_MS`].
    #[error("the TTL {ttl_ms} ms is above the largest accepted, {max_ms} ms")]
    TtlTooLarge {
        /// The TTL given.
        ttl_ms: u64,
        /// The largest accepted.
        max_ms: u64,
    },
    /// No nodes.
    #[error("zero Redis nodes")]
    ZeroNodes,
    /// Too many nodes.
    #[error("{nodes} nodes is above the largest accepted, {max}")]
    TooManyNodes {
        /// The number given.
        nodes: u8,
        /// The largest accepted.
        max: u8,
    },
    /// A protocol that runs on one node was given several.
    #[error("{protocol} runs on exactly one node, not {nodes}")]
    SingleNodeOnly {
        /// The protocol.
        protocol: &'static str,
        /// The number given.
        nodes: u8,
    },
    /// The clock-drift allowance leaves no validity.
    #[error("the drift allowance {drift_ms} ms is not below the TTL {ttl_ms} ms")]
    DriftNotBelowTtl {
        /// The drift given.
        drift_ms: u64,
        /// The TTL.
        ttl_ms: u64,
    },
    /// A per-request reply timeout of zero, or not below the TTL.
    #[error("the reply timeout {timeout_ms} ms must be above zero and below the TTL {ttl_ms} ms")]
    BadReplyTimeout {
        /// The timeout given.
        timeout_ms: u64,
        /// The TTL.
        ttl_ms: u64,
    },
    /// A semaphore limit of zero.
    #[error("the semaphore limit is zero")]
    ZeroLimit,
    /// A semaphore limit above [`MAX_LIMIT`].
    #[error("the semaphore limit {limit} is above the largest accepted, {max}")]
    LimitTooLarge {
        /// The limit given.
        limit: u32,
        /// The largest accepted.
        max: u32,
    },
    /// The guard lock of a locked semaphore must itself be a lock.
    #[error("{0} cannot guard a semaphore: it is not a single-node lock")]
    BadGuardLock(&'static str),
}

/// Everything a catalogue machine is built from. Fields a protocol does not
/// use are ignored by it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// The resource name; every key of one lock shares the hash tag `{name}`.
    /// Shared, so that a copy of the configuration (one per acquire, for
    /// its seed) costs no allocation.
    pub name: Arc<str>,
    /// Lease time to live, ms.
    pub ttl_ms: u64,
    /// Number of Redis nodes (RedLock masters); 1 for the others.
    pub nodes: u8,
    /// Semaphore limit.
    pub limit: u32,
    /// RedLock clock-drift allowance in ms; `None` means `ttl/100 + 2`.
    /// Single-node leases subtract it too.
    pub drift_ms: Option<u64>,
    /// Per-node reply timeout in ms (RedLock: much smaller than the TTL);
    /// `None` leaves timeouts to the driver.
    pub reply_timeout_ms: Option<u64>,
    /// First retry delay, ms.
    pub retry_base_ms: u64,
    /// Largest retry delay, ms.
    pub retry_max_ms: u64,
    /// Randomised share of each retry delay, percent.
    pub retry_jitter_percent: u8,
    /// Seed of the jitter generator.
    pub seed: u64,
    /// Renew the hold automatically (reentrant, fenced, lease-semaphore).
    pub auto_renew: bool,
    /// After a grant, `WAIT` for this many replicas before reporting it;
    /// when fewer acknowledge in time the grant is undone and fails.
    pub wait_replicas: Option<u32>,
    /// The lock that guards `fair-semaphore-locked`.
    pub guard_lock: ProtocolId,
    /// Release scripts (`set-px-lua`, `fenced`, `redlock`, `reentrant`,
    /// `lease-semaphore`) also `PUBLISH` a notice on `<key>:released`, for
    /// waiters that subscribe instead of polling. Off by default: nobody
    /// listens, and the notice costs a command per release.
    pub notify_releases: bool,
}

impl Config {
    /// Defaults for `name`: 10 s TTL, one node, limit 1, RedLock's drift,
    /// 10–200 ms retries with 50 % jitter, automatic renewal on.
    pub fn new(name: impl Into<Arc<str>>) -> Config {
        Config {
            name: name.into(),
            ttl_ms: 10_000,
            nodes: 1,
            limit: 1,
            drift_ms: None,
            reply_timeout_ms: None,
            retry_base_ms: 10,
            retry_max_ms: 200,
            retry_jitter_percent: 50,
            seed: 0,
            auto_renew: true,
            wait_replicas: None,
            guard_lock: ProtocolId::SetPxLua,
            notify_releases: false,
        }
    }

    /// The drift allowance: the configured one, or RedLock's `ttl/100 + 2`.
    pub fn drift(&self) -> u64 {
        self.drift_ms.unwrap_or(self.ttl_ms / 100 + 2)
    }

    /// A backoff built from the retry fields.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            self.retry_base_ms,
            self.retry_max_ms,
            self.retry_jitter_percent,
            self.seed,
        )
    }

    /// Check the fields every protocol relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.name.contains(['{', '}']) {
            return Err(ConfigError::BraceInName(self.name.to_string()));
        }
        if self.ttl_ms == 0 {
            return Err(ConfigError::ZeroTtl);
        }
        if self.ttl_ms > MAX_TTL_MS {
            return Err(ConfigError::TtlTooLarge {
                ttl_ms: self.ttl_ms,
                max_ms: MAX_TTL_MS,
            });
        }
        if self.nodes == 0 {
            return Err(ConfigError::ZeroNodes);
        }
        if self.nodes > MAX_NODES {
            return Err(ConfigError::TooManyNodes {
                nodes: self.nodes,
                max: MAX_NODES,
            });
        }
        if self.drift() >= self.ttl_ms {
            return Err(ConfigError::DriftNotBelowTtl {
                drift_ms: self.drift(),
                ttl_ms: self.ttl_ms,
            });
        }
        if let Some(t) = self.reply_timeout_ms {
            if t == 0 || t >= self.ttl_ms {
                return Err(ConfigError::BadReplyTimeout {
                    timeout_ms: t,
                    ttl_ms: self.ttl_ms,
                });
            }
        }
        Ok(())
    }

    /// [`Config::validate`] plus: exactly one node.
    pub fn validate_single(&self, protocol: &'static str) -> Result<(), ConfigError> {
        self.validate()?;
        if self.nodes != 1 {
            return Err(ConfigError::SingleNodeOnly {
                protocol,
                nodes: self.nodes,
            });
        }
        Ok(())
    }

    /// [`Config::validate_single`] plus: a sane semaphore limit.
    pub fn validate_semaphore(&self, protocol: &'static str) -> Result<(), ConfigError> {
        self.validate_single(protocol)?;
        if self.limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        if self.limit > MAX_LIMIT {
            return Err(ConfigError::LimitTooLarge {
                limit: self.limit,
                max: MAX_LIMIT,
            });
        }
        Ok(())
    }

    /// The key holding a lock's value: `{name}`.
    pub fn key(&self) -> String {
        // Built by hand: each acquire of a front end builds its keys, and
        // `format!` costs several times as much.
        let mut key = String::with_capacity(self.name.len() + 2);
        key.push('{');
        key.push_str(&self.name);
        key.push('}');
        key
    }

    /// A companion key of the lock: `{name}:suffix`.
    pub fn key_with(&self, suffix: &str) -> String {
        let mut key = String::with_capacity(self.name.len() + suffix.len() + 3);
        key.push('{');
        key.push_str(&self.name);
        key.push_str("}:");
        key.push_str(suffix);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_are_typed_errors() {
        let ok = Config::new("orders");
        assert_eq!(ok.validate(), Ok(()));
        let mut c = ok.clone();
        c.name = "".into();
        assert_eq!(c.validate(), Err(ConfigError::EmptyName));
        let mut c = ok.clone();
        c.ttl_ms = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroTtl));
        let mut c = ok.clone();
        c.ttl_ms = MAX_TTL_MS + 1;
        assert!(matches!(c.validate(), Err(ConfigError::TtlTooLarge { .. })));
        let mut c = ok.clone();
        c.nodes = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroNodes));
        let mut c = ok.clone();
        c.drift_ms = Some(c.ttl_ms);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::DriftNotBelowTtl { .. })
        ));
        let mut c = ok.clone();
        c.ttl_ms = 2; // default drift 2 ms is not below 2 ms
        assert!(matches!(
            c.validate(),
            Err(ConfigError::DriftNotBelowTtl { .. })
        ));
        let mut c = ok.clone();
        c.name = "a{b".into();
        assert!(matches!(c.validate(), Err(ConfigError::BraceInName(_))));
        let mut c = ok;
        c.limit = 0;
        assert_eq!(c.validate_semaphore("x"), Err(ConfigError::ZeroLimit));
    }

    #[test]
    fn keys_share_the_hash_tag() {
        let c = Config::new("orders");
        assert_eq!(c.key(), "{orders}");
        assert_eq!(c.key_with("fence"), "{orders}:fence");
    }
}
