//! The clock the driver passes to the machines.
//!
//! One clock for the whole process: monotonic (an `Instant` plus elapsed
//! time, so it never jumps back), anchored once to the Unix epoch. A
//! per-driver origin would do for leases measured by their own holder, but
//! the protocols whose `ProtocolId::clock()` is `ClockUse::Shared`
//! (`setnx-getset` and the ZSET semaphores) compare timestamps written by
//! *different* owners (the recipes use the wall clock), so every owner must
//! read the same clock; across processes the anchor makes them agree as far
//! as the hosts' clocks did when each process anchored, which is exactly
//! those recipes' assumption (and their `client-skew` weakness).
//!
//! A step of the wall clock after the anchor (an NTP step) does not reach
//! this clock, so a lease's deadline never moves with it
//! (`tests/tests/clock_step.rs` steps a real process's wall clock to show
//! it). Two processes anchored on either side of a step disagree by the
//! step for as long as both run, as skewed clocks do; and `Instant` is
//! `CLOCK_MONOTONIC`, which stops while the host is suspended, so a
//! suspend is a pause of every hold in the process.

use lockwright_core::Millis;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The process clock.
#[derive(Debug)]
pub(crate) struct Clock {
    origin: Instant,
    origin_ms: u64,
}

/// The process-wide clock, anchored on first use.
pub(crate) fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| Clock {
        origin: Instant::now(),
        origin_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2))
            .unwrap_or(0),
    })
}

impl Clock {
    /// The current time.
    pub(crate) fn now(&self) -> Millis {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Millis(self.origin_ms.saturating_add(elapsed))
    }

    /// The instant a reading of this clock corresponds to, when representable.
    pub(crate) fn instant_of(&self, at: Millis) -> Option<Instant> {
        self.origin
            .checked_add(Duration::from_millis(at.0.saturating_sub(self.origin_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_map_back_to_instants_and_never_go_back() {
        let c = clock();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let at = c.instant_of(a + 1_000).unwrap();
        let d = at.duration_since(c.instant_of(a).unwrap());
        assert_eq!(d, Duration::from_millis(1_000));
    }
}
