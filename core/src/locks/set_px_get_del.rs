//! `set-px-get-del`: `SET key token NX PX ttl`, released by `GET`, compare in
//! the client, then `DEL` as a separate step.
//!
//! Origin: the unsafe `IdentityLock` of "Redis使用手册". Between the `GET`
//! and the `DEL` the key can expire and be taken by another client; the `DEL`
//! then deletes the successor's lock. Extend has the same gap (`GET`, then
//! `PEXPIRE`), so it can extend someone else's lock.

use super::lease_lock::{lease_lock, Grant, Guard, SetPxRecipe};
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
            Guard::GetThenAct,
            Grant::SetNxPx,
            false,
        )
        .map(SetPxGetDel)
    }
}
