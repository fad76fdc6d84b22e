//! `time-fenced`: `fenced` with a fence that does not go backwards when the
//! node forgets its counter. The grant script issues
//! `fence = max(stored + 1, server TIME in microseconds)`; release, extend
//! and renewal are `fenced`'s.
//!
//! Beyond the sources. `fenced` keeps its fence in an `INCR` counter, and
//! the counter lives where the lock key lives: a restart without `fsync
//! always` empties it, and a promoted replica may not have received its
//! last increments. The next grant then gets a fence the resource has
//! already seen, and the resource accepts a superseded holder's write
//! (the `restart` and `failover` columns of `fenced`). Redisson's
//! `RFencedLock` has the same counter and the same hole.
//!
//! The fix here reads the node's clock in the grant script. A node that
//! comes back empty, or a replica that takes the master's place, starts
//! counting from its clock in microseconds, which is above every fence
//! issued before as long as
//!
//! - no node's clock, the current master's or a future master's, reads
//!   below the highest fence issued. A restart or promotion moves the
//!   clock on by the time it takes; the fence is safe if the clock did not
//!   step back by more than that (a promoted replica's clock must not lag
//!   its old master's by more than that), and
//! - the counter is not ahead of the clock when the node forgets it.
//!
//! Between restarts the stored counter keeps the fence increasing whatever
//! the clock does: a clock that steps back on a node that keeps its data
//! issues no old fence at that moment. But it leaves the counter ahead of
//! the clock by the size of the step, and so does a forward jump that is
//! later corrected, or grants faster than one per microsecond: a restart or
//! promotion inside that window starts from a clock below fences already
//! issued, and fences repeat. The model allows one fault per run, so it
//! shows this only as its `clock-back` column (a restart whose clock comes
//! back behind) and `failover-clock-lag` (a promoted replica whose clock
//! lags), each with its trace, not as a step back followed by a later
//! restart; `restart` and `failover` show the hole closed.
//!
//! Mutual exclusion is no better than `fenced`'s: a restarted node still
//! forgets the hold, and only the resource's refusal of the older fence
//! keeps its data safe.
//!
//! Why this and not the alternatives:
//!
//! - `WAIT` for the counter's replication before using a fence closes
//!   `failover` only when `WAIT` succeeds, costs a round trip to a replica
//!   on every grant, and does nothing for a restart of a node without
//!   replicas.
//! - `fsync always` (`restart-persisted`) closes `restart` at the cost of a
//!   disk flush per write, on every key of the node, and not `failover`.
//! - A fence kept by the resource (it hands out the numbers) moves the
//!   problem to the resource, which must then be a durable,
//!   linearizable counter — if it is, the lock is hardly needed.
//! - A client's clock as the fence is what `setnx-getset` does with expiry:
//!   it needs every client's clock to agree.
//!
//! The server clock costs one `TIME` inside the script that already runs,
//! no extra round trip and no disk, and what it assumes (server clocks that
//! never read below a fence already issued) is what NTP in slew mode
//! and a monotonic hardware clock give. Fences are microseconds since the
//! epoch (about 2^51 today), so they fit Lua's doubles exactly and a
//! resource compares them as integers.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: time-fenced-acquire → fence = max(counter + 1, TIME in µs) (SET NX PX) / Acquired with fence
//!     Acquiring --> Backoff: time-fenced-acquire → nil (taken)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: compare-and-pexpire → 1 / Extended
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: compare-and-delete / Released
//!     note right of Held: a node that lost its counter starts from its clock, above every earlier fence
//! ```

use super::lease_lock::{lease_lock, Grant, OwnerCheck, SetPxRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::protocol::Token;

engine_machine! {
    /// The `time-fenced` lock machine.
    TimeFencedLock(SetPxRecipe)
}

impl TimeFencedLock {
    /// A lock on `config.name` for the owner `token`; renews at TTL/3 when
    /// `config.auto_renew` is set.
    pub fn new(config: &Config, token: Token) -> Result<TimeFencedLock, ConfigError> {
        lease_lock(
            "time-fenced",
            config,
            token,
            OwnerCheck::Script,
            Grant::TimeFencedScript,
            config.auto_renew,
        )
        .map(TimeFencedLock)
    }
}
