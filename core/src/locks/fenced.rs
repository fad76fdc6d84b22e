//! `fenced`: `SET NX PX` and `INCR` of a per-lock fence counter in one
//! script; release and extend by compare-and-act scripts; automatic renewal.
//!
//! Beyond the sources: Kleppmann ("How to do distributed locking", 2016)
//! shows that no lease can stop a paused holder from acting after its lease
//! ran out, and that the fix belongs to the resource: every grant carries a
//! number larger than all before it, and the resource refuses a write whose
//! fence is older than one it has accepted. [`FencedResource`] is that
//! resource.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: fenced-acquire → fence (SET NX PX + INCR) / Acquired with fence
//!     Acquiring --> Backoff: fenced-acquire → nil (taken)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: compare-and-pexpire → 1 / Extended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: compare-and-delete / Released
//!     note right of Held: the resource refuses a write whose fence is older than one it accepted
//! ```

use super::lease_lock::{lease_lock, Grant, OwnerCheck, SetPxRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::protocol::{Fence, Token};

engine_machine! {
    /// The `fenced` lock machine.
    FencedLock(SetPxRecipe)
}

impl FencedLock {
    /// A lock on `config.name` for the owner `token`; renews at TTL/3 when
    /// `config.auto_renew` is set.
    pub fn new(config: &Config, token: Token) -> Result<FencedLock, ConfigError> {
        lease_lock(
            "fenced",
            config,
            token,
            OwnerCheck::Script,
            Grant::FencedScript,
            config.auto_renew,
        )
        .map(FencedLock)
    }
}

/// A write refused by a [`FencedResource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("stale fence {offered:?}: the resource already accepted {accepted:?}")]
pub struct StaleFence {
    /// The fence the write carried.
    pub offered: Fence,
    /// The highest fence accepted so far.
    pub accepted: Fence,
}

/// A resource that refuses writes carrying a fence older than the newest one
/// it has accepted. Writes with the same fence as the newest are accepted
/// (one holder may write many times).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FencedResource<T> {
    highest: Option<Fence>,
    value: Option<T>,
}

impl<T> FencedResource<T> {
    /// An empty resource.
    pub fn new() -> FencedResource<T> {
        FencedResource {
            highest: None,
            value: None,
        }
    }

    /// Write `value` under `fence`.
    pub fn write(&mut self, fence: Fence, value: T) -> Result<(), StaleFence> {
        if let Some(accepted) = self.highest {
            if fence < accepted {
                return Err(StaleFence {
                    offered: fence,
                    accepted,
                });
            }
        }
        self.highest = Some(fence);
        self.value = Some(value);
        Ok(())
    }

    /// The newest accepted fence.
    pub fn highest(&self) -> Option<Fence> {
        self.highest
    }

    /// The last accepted value.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_rejects_an_older_fence_and_accepts_equal_or_newer() {
        let mut r = FencedResource::new();
        assert_eq!(r.write(Fence(2), "a"), Ok(()));
        assert_eq!(r.write(Fence(2), "b"), Ok(()));
        assert_eq!(
            r.write(Fence(1), "stale"),
            Err(StaleFence {
                offered: Fence(1),
                accepted: Fence(2)
            })
        );
        assert_eq!(r.value(), Some(&"b"));
        assert_eq!(r.write(Fence(3), "c"), Ok(()));
        assert_eq!(r.highest(), Some(Fence(3)));
    }
}
