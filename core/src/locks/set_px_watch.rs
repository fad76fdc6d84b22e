//! `set-px-watch`: `SET key token NX PX ttl`, released under
//! `WATCH`/`MULTI`/`EXEC`.
//!
//! Origin: `release_lock` of "Redis in Action" 6.2 and the `IdentityLock`
//! with `WATCH` of "Redis使用手册". The `WATCH` makes the `EXEC` abort when
//! the key changed (or expired) after the `GET`, so the release retries
//! instead of deleting a successor's lock. Extend works the same way.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: SET key token NX PX ttl → OK
//!     Acquiring --> Backoff: nil (taken)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: extend (WATCH, GET, MULTI PEXPIRE EXEC)
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> Releasing: EXEC → nil (key changed), start again
//!     Releasing --> [*]: WATCH, GET = token, MULTI DEL EXEC / Released
//!     Releasing --> [*]: GET ≠ token, UNWATCH / Released (was_held false)
//! ```

use super::lease_lock::{lease_lock, Grant, OwnerCheck, SetPxRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::protocol::Token;

engine_machine! {
    /// The `set-px-watch` lock machine. Its driver must give it a connection of
    /// its own: `WATCH` state lives on the connection.
    SetPxWatch(SetPxRecipe)
}

impl SetPxWatch {
    /// A lock on `config.name` for the owner `token`. No automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<SetPxWatch, ConfigError> {
        lease_lock(
            "set-px-watch",
            config,
            token,
            OwnerCheck::Watch,
            Grant::SetNxPx,
            false,
        )
        .map(SetPxWatch)
    }
}
