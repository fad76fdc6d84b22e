//! `set-px-get-del`: `SET key token NX PX ttl`, released by `GET`, compare in
//! the client, then `DEL` as a separate step.
//!
//! Origin: the unsafe `IdentityLock` of "Redis使用手册". Between the `GET`
//! and the `DEL` the key can expire and be taken by another client; the `DEL`
//! then deletes the successor's lock. Extend has the same gap (`GET`, then
//! `PEXPIRE`), so it can extend someone else's lock.
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
//!     Held --> Extending: extend
//!     Extending --> Held: GET = token, then PEXPIRE (second step) / Extended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> Deleting: GET = token
//!     Deleting --> [*]: DEL key (second step, unguarded) / Released
//!     Releasing --> [*]: GET ≠ token / Released (was_held false)
//! ```

use super::lease_lock::{lease_lock, Grant, OwnerCheck, SetPxRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::protocol::Token;

engine_machine! {
    /// The `set-px-get-del` lock machine.
    SetPxGetDel(SetPxRecipe)
}

impl SetPxGetDel {
    /// A lock on `config.name` for the owner `token`. No automatic renewal.
    pub fn new(config: &Config, token: Token) -> Result<SetPxGetDel, ConfigError> {
        lease_lock(
            "set-px-get-del",
            config,
            token,
            OwnerCheck::GetThenAct,
            Grant::SetNxPx,
            false,
        )
        .map(SetPxGetDel)
    }
}
