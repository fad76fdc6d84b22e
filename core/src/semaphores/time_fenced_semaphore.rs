//! `time-fenced-semaphore`: `lease-semaphore` with `time-fenced`'s fence.
//! The acquire script issues
//! `fence = max(stored + 1, server TIME in microseconds)`; the permits,
//! their server-clock deadlines, the limit on the server, release and
//! renewal are `lease-semaphore`'s.
//!
//! Beyond the sources. `lease-semaphore` fences its permits with an `INCR`
//! counter at `{name}:fence`, next to the permits it guards. A restart
//! without `fsync always` empties it and a promoted replica may lack its
//! last increments; the next permit then carries a fence the resource has
//! already accepted, and the resource takes a write from a holder it
//! should refuse (the `restart` and `failover` columns of
//! `lease-semaphore`).
//!
//! The acquire script here reads the server `TIME` once, as
//! `lease-semaphore`'s already does for the deadlines, and uses it twice:
//! in milliseconds for the permit's deadline and in microseconds as the
//! floor of the fence. A node that comes back empty, or a replica that
//! takes the master's place, starts issuing fences from its clock, above
//! every fence issued before, as long as
//!
//! - no node's clock, the current master's or a future master's, reads
//!   below the highest fence issued (a restart or promotion moves the
//!   clock on by the time it takes, so a step back smaller than that is
//!   safe), and
//! - the counter is not ahead of the clock when the node forgets it.
//!
//! While the node keeps its data the stored counter keeps the fence
//! increasing whatever the clock does. A clock that steps back there issues
//! no old fence at that moment, but it leaves the counter ahead of the
//! clock by the size of the step (as does a forward jump later corrected,
//! or permits granted faster than one per microsecond), and a restart or
//! promotion inside that window repeats fences. The model allows one fault
//! per run: its `clock-back` column (a restart whose clock comes back
//! behind) and `failover-clock-lag` (a promoted replica whose clock lags)
//! show the violation, each with its trace, while `restart` and `failover`
//! show the hole closed. Like every semaphore in the model, these verdicts
//! are at limit 1.
//!
//! What the fence cannot help with is the count: a restarted node forgets
//! the permits too, and a promoted replica may lack the last ones, so more
//! than `limit` clients hold permits at once under `restart` and
//! `failover`, exactly as with `lease-semaphore`. The limit is kept only
//! where the resource refuses the older fences, which for a semaphore means
//! the resource admits at most one writer at a time by fence order; a
//! resource that must admit `limit` concurrent writers gets no protection
//! from a fence, time-based or not.
//!
//! The fence is one comparison and at most one `SET` inside the script
//! that already runs: no extra round trip, no disk. Fences are
//! microseconds since the epoch (about 2^51 today), so they fit Lua's
//! doubles exactly and a resource compares them as integers. The
//! alternatives (`WAIT`, `fsync always`, a fence kept by the resource) are
//! weighed on `time-fenced`'s page; they weigh the same here.
//!
//! # State machine
//!
//! The client's view, summarised from the machine (the protocol pages of
//! `docs/` show this diagram).
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Acquiring: acquire
//!     Acquiring --> Held: time-fenced-lease-acquire → fence = max(counter + 1, TIME in µs) (server TIME, drop expired, ZADD deadline) / Acquired
//!     Acquiring --> Backoff: time-fenced-lease-acquire → nil (full)
//!     Acquiring --> Backoff: no reply (an unknown permit is left to its TTL, not undone)
//!     Backoff --> Acquiring: retry timer
//!     Held --> Held: renew every ttl/3, lease-renew → 1 / Extended
//!     Held --> [*]: lease-renew → 0 / Lost
//!     Held --> [*]: valid_until passes / Lost
//!     Held --> Releasing: release
//!     Releasing --> [*]: lease-release (ZREM own token) / Released
//!     note right of Held: a node that lost its counter starts from its clock, above every earlier fence
//! ```

use super::lease_semaphore::{lease_engine, LeaseRecipe};
use crate::config::{Config, ConfigError};
use crate::engine::engine_machine;
use crate::keyspace::Script;
use crate::protocol::Token;

engine_machine! {
    /// The `time-fenced-semaphore` machine.
    TimeFencedSemaphore(LeaseRecipe)
}

impl TimeFencedSemaphore {
    /// A semaphore of `config.limit` permits (unless the server already has
    /// a limit) on `{name}:permits`, for the owner `token`, whose fences are
    /// `max(stored + 1, server TIME in µs)`; renewed automatically at a
    /// third of the TTL when `config.auto_renew`.
    pub fn new(config: &Config, token: Token) -> Result<TimeFencedSemaphore, ConfigError> {
        lease_engine(
            "time-fenced-semaphore",
            Script::TimeFencedLeaseAcquire,
            config,
            token,
            false,
        )
        .map(TimeFencedSemaphore)
    }
}
