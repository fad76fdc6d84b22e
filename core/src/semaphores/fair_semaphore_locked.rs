//! `fair-semaphore-locked`: the fair semaphore whose acquire runs while
//! holding a lock, as in "Redis in Action" 6.3.5
//! (`acquire_semaphore_with_lock`):
//!
//! ```text
//! guard = acquire_lock(name, acquire_timeout=10 ms)
//! if guard: try: acquire_fair_semaphore(...) finally: release_lock(guard)
//! ```
//!
//! The guard is any single-node lock of the catalogue (`config.guard_lock`,
//! `set-px-lua` by default), embedded as a [`Machine`] and driven through
//! this machine: its requests go out with odd request ids, ours with even
//! ones, on the same node. With acquires serialised, the two steps of the
//! fair acquire can no longer interleave, which removes the acquire race;
//! releases and refreshes stay unguarded, as in the book.
//!
//! The guard lock is named `{name}:guard`, so its key is `{{name}:guard}`:
//! a different hash tag from the semaphore's keys. That is harmless here —
//! the lock and the semaphore are never touched by one command — but on a
//! Redis Cluster they may live on different shards.
//!
//! A try-once acquire waits up to 10 ms for the guard (the book's value);
//! an acquire with a deadline waits for it until the deadline. The result
//! is reported after the guard has been released.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Guarding: acquire
//!     Guarding --> Step1: guard lock acquired (set-px-lua by default)
//!     Guarding --> Backoff: guard taken
//!     Step1 --> Step2: MULTI ZREMRANGEBYSCORE, ZINTERSTORE, INCR counter EXEC
//!     Step2 --> Unguarding: MULTI ZADD, ZADD owner, ZRANK owner EXEC
//!     Unguarding --> Held: guard released, rank below limit / Acquired
//!     Unguarding --> Backoff: guard released, rank at or above limit (entries removed)
//!     Backoff --> Guarding: retry timer
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release (unguarded)
//!     Releasing --> [*]: ZREM from both sets / Released
//! ```

use super::fair_semaphore::FairRecipe;
use crate::catalogue::{Kind, Machine, ProtocolId};
use crate::config::{Config, ConfigError};
use crate::engine::{engine_machine, Engine, EngineConfig};
use crate::protocol::Token;

engine_machine! {
    /// The `fair-semaphore-locked` machine.
    FairSemaphoreLocked(FairRecipe)
}

impl FairSemaphoreLocked {
    /// A fair semaphore of `config.limit` permits on `{name}`, whose
    /// acquires are guarded by a `config.guard_lock` lock on `{name}:guard`
    /// (same TTL, no automatic renewal), for the owner `token`.
    pub fn new(config: &Config, token: Token) -> Result<FairSemaphoreLocked, ConfigError> {
        let mut engine = EngineConfig::checked(
            config.validate_semaphore("fair-semaphore-locked"),
            config,
            token.clone(),
        )?;
        let guard_id = config.guard_lock;
        if guard_id.kind() != Kind::Lock || guard_id == ProtocolId::Redlock {
            return Err(ConfigError::BadGuardLock(guard_id.as_str()));
        }
        let guard_config = Config {
            name: format!("{}:guard", config.name).into(),
            auto_renew: false,
            wait_replicas: None,
            ..config.clone()
        };
        let guard = Machine::new(guard_id, &guard_config, token.clone())?;
        let recipe = FairRecipe::new(config, &token);
        engine.guard = Some(Box::new(guard));
        Ok(FairSemaphoreLocked(Engine::new(recipe, engine)))
    }

    /// Which lock guards the acquires.
    pub fn guard_lock(&self) -> Option<ProtocolId> {
        self.0.guard_id()
    }
}
