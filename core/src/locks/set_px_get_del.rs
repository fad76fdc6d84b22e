//! `set-px-get-del`: `SET key token NX PX ttl`, released by `GET`, compare in
//! the client, then `DEL` as a separate step.
//!
//! Origin: the unsafe `IdentityLock` of "Redis使用手册". Between the `GET`
//! and the `DEL` the key can expire and be taken by another client; the `DEL`
//! then deletes the successor's lock. Extend has the same gap (`GET`, then
//! `PEXPIRE`), so it can extend someone else's lock.

use super::lease_lock::{lease_lock, Grant, Guard, LeaseRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::{Engine, OnEngine};
use crate::protocol::Token;

/// The `set-px-get-del` lock machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetPxGetDel(Engine<LeaseRecipe>);

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

impl OnEngine for SetPxGetDel {
    type Recipe = LeaseRecipe;
    fn engine(&self) -> &Engine<LeaseRecipe> {
        &self.0
    }
    fn engine_mut(&mut self) -> &mut Engine<LeaseRecipe> {
        &mut self.0
    }
}
