//! The catalogue: stable ids, origins, and one enum that holds any machine.

use crate::config::{Config, ConfigError};
use crate::protocol::{
    Acquire, Event, Lease, Outcome, Protocol, Request, RequestId, Token, UsageError,
};
use crate::time::Millis;
use std::fmt;
use std::str::FromStr;

/// Lock or semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// At most one holder.
    Lock,
    /// At most `limit` holders.
    Semaphore,
}

/// The stable id of a catalogue protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolId {
    /// SETNX, no TTL, DEL to release.
    SetnxDel,
    /// SETNX then EXPIRE as two steps, with the TTL repair.
    SetnxExpire,
    /// The SETNX + GETSET expiry-timestamp recipe.
    SetnxGetset,
    /// SET NX PX; release = GET, compare, DEL.
    SetPxGetDel,
    /// SET NX PX; release under WATCH/MULTI/EXEC.
    SetPxWatch,
    /// SET NX PX; atomic Lua release and extend.
    SetPxLua,
    /// Hash lock with per-owner count and watchdog renewal.
    Reentrant,
    /// RedLock over N independent masters.
    Redlock,
    /// SET NX PX plus a fence counter INCRed on every grant.
    Fenced,
    /// SET NX PX plus a fence of max(counter + 1, server TIME in µs).
    TimeFenced,
    /// ZSET scored by client time; rank < limit.
    ZsetSemaphore,
    /// Counter + owner ZSET + ZINTERSTORE.
    FairSemaphore,
    /// The fair semaphore guarded by a lock.
    FairSemaphoreLocked,
    /// Holder SET + max size under WATCH.
    WatchSemaphore,
    /// One atomic script per operation, server-side expiry, fenced permits.
    LeaseSemaphore,
    /// `lease-semaphore` with a fence of max(counter + 1, server TIME in µs).
    TimeFencedSemaphore,
}

/// One row of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CatalogueEntry {
    /// The stable id.
    pub id: ProtocolId,
    /// Lock or semaphore.
    pub kind: Kind,
    /// Where it comes from.
    pub origin: &'static str,
    /// The idea in one line.
    pub idea: &'static str,
}

const CATALOGUE: [CatalogueEntry; 16] = [
    entry(
        ProtocolId::SetnxDel,
        Kind::Lock,
        "\"Redis in Action\" simple lock; pyRedisLock 1.0",
        "SETNX, no TTL, DEL to release",
    ),
    entry(
        ProtocolId::SetnxExpire,
        Kind::Lock,
        "\"Redis in Action\" lock with timeout",
        "SETNX then EXPIRE (two steps), TTL repair when TTL == -1",
    ),
    entry(
        ProtocolId::SetnxGetset,
        Kind::Lock,
        "the SETNX + GETSET timestamp recipe (old SETNX docs)",
        "value is an expiry timestamp from the client clock; GETSET takeover",
    ),
    entry(
        ProtocolId::SetPxGetDel,
        Kind::Lock,
        "\"Redis使用手册\" unsafe IdentityLock",
        "SET NX PX; release = GET, compare, DEL",
    ),
    entry(
        ProtocolId::SetPxWatch,
        Kind::Lock,
        "\"Redis in Action\" / IdentityLock with WATCH",
        "SET NX PX; release inside WATCH/MULTI/EXEC",
    ),
    entry(
        ProtocolId::SetPxLua,
        Kind::Lock,
        "Lua compare-and-delete (pyRedisLock 2.0, redis.io)",
        "SET NX PX; atomic Lua release and extend",
    ),
    entry(
        ProtocolId::Reentrant,
        Kind::Lock,
        "Redisson RLock",
        "hash with per-owner count, watchdog renewal at TTL/3",
    ),
    entry(
        ProtocolId::Redlock,
        Kind::Lock,
        "Redlock (redis.io distlock)",
        "quorum of N masters, drift = ttl/100 + 2 ms, validity check, release everywhere",
    ),
    entry(
        ProtocolId::Fenced,
        Kind::Lock,
        "beyond the sources (Kleppmann 2016 fencing tokens)",
        "SET NX PX and INCR of a fence counter in one script; the resource rejects stale fences",
    ),
    entry(
        ProtocolId::TimeFenced,
        Kind::Lock,
        "beyond the sources (fenced, with a fence that survives restart and failover)",
        "fenced, with fence = max(counter + 1, server TIME in µs): a node that lost its counter starts above every earlier fence",
    ),
    entry(
        ProtocolId::ZsetSemaphore,
        Kind::Semaphore,
        "\"Redis in Action\" 6.3.1 counting semaphore",
        "ZSET scored by client time; rank < limit",
    ),
    entry(
        ProtocolId::FairSemaphore,
        Kind::Semaphore,
        "\"Redis in Action\" 6.3.2 fair semaphore",
        "INCR counter + owner ZSET + ZINTERSTORE; rank in the owner set",
    ),
    entry(
        ProtocolId::FairSemaphoreLocked,
        Kind::Semaphore,
        "\"Redis in Action\" 6.3.5 semaphore with a lock",
        "the fair semaphore's acquire guarded by a catalogue lock",
    ),
    entry(
        ProtocolId::WatchSemaphore,
        Kind::Semaphore,
        "\"Redis使用手册\" semaphore",
        "holder SET + max size under WATCH/MULTI/EXEC",
    ),
    entry(
        ProtocolId::LeaseSemaphore,
        Kind::Semaphore,
        "beyond the sources",
        "one atomic script per operation, server-side expiry, fenced permits, renewal",
    ),
    entry(
        ProtocolId::TimeFencedSemaphore,
        Kind::Semaphore,
        "beyond the sources (lease-semaphore, with time-fenced's fence)",
        "lease-semaphore, with fence = max(counter + 1, server TIME in µs): a node that lost its counter starts above every earlier fence",
    ),
];

const fn entry(
    id: ProtocolId,
    kind: Kind,
    origin: &'static str,
    idea: &'static str,
) -> CatalogueEntry {
    CatalogueEntry {
        id,
        kind,
        origin,
        idea,
    }
}

/// Every protocol of the catalogue, locks first.
pub fn catalogue() -> &'static [CatalogueEntry] {
    &CATALOGUE
}

/// An application built on the catalogue's locks (not itself a lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApplicationEntry {
    /// The stable id.
    pub id: &'static str,
    /// Where it comes from.
    pub origin: &'static str,
    /// The idea in one line.
    pub idea: &'static str,
    /// The module that implements it.
    pub module: &'static str,
}

const APPLICATIONS: [ApplicationEntry; 1] = [ApplicationEntry {
    id: "stampede-guard",
    origin: "cache-stampede protection (single flight per key)",
    idea: "on a miss one caller per key loads and fills the cache under a catalogue lock; the others wait and re-read",
    module: "lockwright_core::stampede",
}];

/// The applications listed next to the protocols: the cache-stampede guard.
pub fn applications() -> &'static [ApplicationEntry] {
    &APPLICATIONS
}

impl ProtocolId {
    /// Every id, in catalogue order.
    pub fn all() -> impl Iterator<Item = ProtocolId> {
        CATALOGUE.iter().map(|e| e.id)
    }

    /// The stable kebab-case id.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolId::SetnxDel => "setnx-del",
            ProtocolId::SetnxExpire => "setnx-expire",
            ProtocolId::SetnxGetset => "setnx-getset",
            ProtocolId::SetPxGetDel => "set-px-get-del",
            ProtocolId::SetPxWatch => "set-px-watch",
            ProtocolId::SetPxLua => "set-px-lua",
            ProtocolId::Reentrant => "reentrant",
            ProtocolId::Redlock => "redlock",
            ProtocolId::Fenced => "fenced",
            ProtocolId::TimeFenced => "time-fenced",
            ProtocolId::ZsetSemaphore => "zset-semaphore",
            ProtocolId::FairSemaphore => "fair-semaphore",
            ProtocolId::FairSemaphoreLocked => "fair-semaphore-locked",
            ProtocolId::WatchSemaphore => "watch-semaphore",
            ProtocolId::LeaseSemaphore => "lease-semaphore",
            ProtocolId::TimeFencedSemaphore => "time-fenced-semaphore",
        }
    }

    /// The catalogue row.
    pub fn entry(self) -> &'static CatalogueEntry {
        CATALOGUE
            .iter()
            .find(|e| e.id == self)
            .expect("every id has a catalogue row")
    }

    /// Lock or semaphore.
    pub fn kind(self) -> Kind {
        self.entry().kind
    }

    /// Does the machine send `WATCH`? Its requests then depend on the state
    /// of one connection (the watched keys, until `EXEC`, `UNWATCH` or a
    /// disconnect), so a driver must give each hold a connection of its own.
    /// Every other protocol sends single commands, scripts and `MULTI … EXEC`
    /// blocks that carry no state between requests, and may share one
    /// multiplexed connection per node with any number of holds.
    pub fn uses_watch(self) -> bool {
        matches!(
            self,
            ProtocolId::SetnxDel
                | ProtocolId::SetnxExpire
                | ProtocolId::SetPxWatch
                | ProtocolId::WatchSemaphore
        )
    }
}

/// Which clock a protocol's `now` must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockUse {
    /// Each client's own monotonic clock: `now` is compared only with this
    /// machine's earlier readings (leases, timers, retries).
    Local,
    /// A clock all clients share (Unix time in milliseconds): the protocol
    /// writes `now` to Redis and other clients compare it with theirs
    /// (`setnx-getset`'s expiry timestamps, the client-time scores of the
    /// ZSET semaphores). Skew between clients is the `client-skew` fault.
    Shared,
}

impl ProtocolId {
    /// Which clock `now` must be for this protocol.
    pub fn clock(self) -> ClockUse {
        match self {
            ProtocolId::SetnxGetset
            | ProtocolId::ZsetSemaphore
            | ProtocolId::FairSemaphore
            | ProtocolId::FairSemaphoreLocked => ClockUse::Shared,
            _ => ClockUse::Local,
        }
    }
}

impl fmt::Display for ProtocolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An id that is not in the catalogue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?}; `lockwright list` shows the catalogue")]
pub struct UnknownProtocol(pub String);

impl FromStr for ProtocolId {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProtocolId::all()
            .find(|id| id.as_str() == s)
            .ok_or_else(|| UnknownProtocol(s.to_owned()))
    }
}

macro_rules! machines {
    ($($id:ident => $ty:ty),* $(,)?) => {
        /// Any catalogue machine, so that drivers and models can hold every
        /// protocol in one type.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum Machine {
            $(
                #[doc = concat!("The `", stringify!($id), "` machine.")]
                $id($ty),
            )*
        }

        impl Machine {
            /// Build the machine for `id` from `config`, holding `token`.
            pub fn new(id: ProtocolId, config: &Config, token: Token) -> Result<Machine, ConfigError> {
                match id {
                    $(ProtocolId::$id => Ok(Machine::$id(<$ty>::new(config, token)?)),)*
                }
            }

            /// Which protocol this is.
            pub fn id(&self) -> ProtocolId {
                match self {
                    $(Machine::$id(_) => ProtocolId::$id,)*
                }
            }
        }

        impl Protocol for Machine {
            fn acquire(&mut self, now: Millis, how: Acquire) -> Result<(), UsageError> {
                match self { $(Machine::$id(m) => m.acquire(now, how),)* }
            }
            fn release(&mut self, now: Millis) -> Result<(), UsageError> {
                match self { $(Machine::$id(m) => m.release(now),)* }
            }
            fn extend(&mut self, now: Millis) -> Result<(), UsageError> {
                match self { $(Machine::$id(m) => m.extend(now),)* }
            }
            fn handle_reply(&mut self, now: Millis, id: RequestId, outcome: Outcome) {
                match self { $(Machine::$id(m) => m.handle_reply(now, id, outcome),)* }
            }
            fn handle_timeout(&mut self, now: Millis) {
                match self { $(Machine::$id(m) => m.handle_timeout(now),)* }
            }
            fn poll_transmit(&mut self) -> Option<Request> {
                match self { $(Machine::$id(m) => m.poll_transmit(),)* }
            }
            fn poll_event(&mut self) -> Option<Event> {
                match self { $(Machine::$id(m) => m.poll_event(),)* }
            }
            fn poll_timeout(&self) -> Option<Millis> {
                match self { $(Machine::$id(m) => m.poll_timeout(),)* }
            }
            fn lease(&self) -> Option<&Lease> {
                match self { $(Machine::$id(m) => m.lease(),)* }
            }
            fn is_busy(&self) -> bool {
                match self { $(Machine::$id(m) => m.is_busy(),)* }
            }
        }
    };
}

// One line per protocol: `Id => Type` (the type has
// `fn new(&Config, Token) -> Result<Self, ConfigError>` and implements `Protocol`).
machines! {
    SetPxLua => crate::locks::set_px_lua::SetPxLua,
    SetPxGetDel => crate::locks::set_px_get_del::SetPxGetDel,
    SetPxWatch => crate::locks::set_px_watch::SetPxWatch,
    Fenced => crate::locks::fenced::FencedLock,
    TimeFenced => crate::locks::time_fenced::TimeFencedLock,
    SetnxDel => crate::locks::setnx_del::SetnxDel,
    SetnxExpire => crate::locks::setnx_expire::SetnxExpire,
    SetnxGetset => crate::locks::setnx_getset::SetnxGetset,
    Reentrant => crate::locks::reentrant::Reentrant,
    ZsetSemaphore => crate::semaphores::zset_semaphore::ZsetSemaphore,
    FairSemaphore => crate::semaphores::fair_semaphore::FairSemaphore,
    FairSemaphoreLocked => crate::semaphores::fair_semaphore_locked::FairSemaphoreLocked,
    WatchSemaphore => crate::semaphores::watch_semaphore::WatchSemaphore,
    LeaseSemaphore => crate::semaphores::lease_semaphore::LeaseSemaphore,
    TimeFencedSemaphore => crate::semaphores::time_fenced_semaphore::TimeFencedSemaphore,
    Redlock => crate::locks::redlock::Redlock,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        let ids: Vec<_> = ProtocolId::all().collect();
        assert_eq!(ids.len(), 16);
        for id in &ids {
            assert_eq!(id.as_str().parse::<ProtocolId>(), Ok(*id));
        }
        assert!("nope".parse::<ProtocolId>().is_err());
        let locks = catalogue().iter().filter(|e| e.kind == Kind::Lock).count();
        assert_eq!(locks, 10);
        assert_eq!(applications().len(), 1);
    }
}
