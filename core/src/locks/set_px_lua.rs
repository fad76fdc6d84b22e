//! `set-px-lua`: `SET key token NX PX ttl`, released and extended by atomic
//! Lua compare-and-act scripts.
//!
//! Origin: the single-instance lock of redis.io's distributed-lock page and
//! pyRedisLock 2.0. The token makes the release owner-checked and the script
//! makes the check and the delete one step, so a release can never delete a
//! successor's lock. Like every lease it is only as safe as the holder's
//! promise to stop when its validity runs out: a paused holder that resumes
//! after its TTL still believes it holds (the `pause` fault).
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: SET key token NX PX ttl → OK / Acquired
//!     Acquiring --> Backoff: nil (taken)
//!     Backoff --> Acquiring: retry timer
//!     Backoff --> [*]: deadline passed / Denied
//!     Held --> Held: compare-and-pexpire → 1 / Extended
//!     Held --> Held: compare-and-pexpire → 0 / NotExtended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: compare-and-delete / Released
//! ```

use super::lease_lock::{lease_lock, Grant, OwnerCheck, SetPxRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::protocol::Token;

engine_machine! {
    /// The `set-px-lua` lock machine.
    SetPxLua(SetPxRecipe)
}

impl SetPxLua {
    /// A lock on `config.name` for the owner `token`. No automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<SetPxLua, ConfigError> {
        lease_lock(
            "set-px-lua",
            config,
            token,
            OwnerCheck::Script,
            Grant::SetNxPx,
            false,
        )
        .map(SetPxLua)
    }
}
