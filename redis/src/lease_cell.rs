//! The state a guard, its driver (which renews) and `lost()` share.
//!
//! Three parties touch one hold at once: the application (through the guard:
//! `release`, `valid_until`), the driver task (which applies renewals and
//! notices a lost lease) and whoever waits on `lost()`. Their shared state is
//! this small synchronous cell, kept apart from all I/O so that loom can
//! check every interleaving of it:
//!
//! - a renewal racing a release never resurrects the released hold (the
//!   Redisson #7272 bug: a watchdog renewal landing after `unlock` brought
//!   the lease back);
//! - the hold is reported lost at most once, and never after a release;
//! - releasing twice is harmless: only the first release counts.
//!
//! Transitions only leave [`Phase::Held`]; nothing ever goes back to it.

use crate::sync::{Arc, Mutex, MutexGuard};
use lockwright_core::Millis;

/// Where a hold is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Held; renewals may extend it.
    Held,
    /// Released by the application (or by the guard's drop).
    Released,
    /// Lost: validity ran out, or renewal found it gone.
    Lost,
}

/// A consistent reading of the cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseSnapshot {
    /// The phase.
    pub phase: Phase,
    /// Bumped by every applied renewal.
    pub version: u64,
    /// The end of validity on the driver's clock.
    pub valid_until: Millis,
}

/// The shared lease state of one hold. Cheap to clone (an `Arc`).
#[derive(Clone, Debug)]
pub struct LeaseCell {
    inner: Arc<Mutex<LeaseSnapshot>>,
}

impl LeaseCell {
    /// A held lease valid until `valid_until`.
    pub fn new(valid_until: Millis) -> LeaseCell {
        LeaseCell {
            inner: Arc::new(Mutex::new(LeaseSnapshot {
                phase: Phase::Held,
                version: 0,
                valid_until,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LeaseSnapshot> {
        // A poisoned lock only means another thread panicked mid-update of
        // plain data; the data is still a valid snapshot.
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> LeaseSnapshot {
        *self.lock()
    }

    /// A renewal is about to be sent: the version it starts from, or `None`
    /// when the hold is no longer held (then do not renew).
    pub fn begin_renewal(&self) -> Option<u64> {
        let s = self.lock();
        (s.phase == Phase::Held).then_some(s.version)
    }

    /// A renewal that started at `version` succeeded with a new validity.
    /// Applied only when the hold is still held and no other renewal was
    /// applied in between; returns whether it was applied. A renewal never
    /// moves a released or lost hold back to held.
    pub fn renewed(&self, version: u64, valid_until: Millis) -> bool {
        let mut s = self.lock();
        if s.phase != Phase::Held || s.version != version {
            return false;
        }
        s.version += 1;
        s.valid_until = s.valid_until.max(valid_until);
        true
    }

    /// The application releases. True for the release that moved the hold
    /// out of `Held`; false for a second release or a release after loss.
    pub fn release(&self) -> bool {
        let mut s = self.lock();
        if s.phase != Phase::Held {
            return false;
        }
        s.phase = Phase::Released;
        true
    }

    /// The hold is lost. True exactly once, for the call that moved it out
    /// of `Held`: only that caller notifies `lost()` waiters.
    pub fn lose(&self) -> bool {
        let mut s = self.lock();
        if s.phase != Phase::Held {
            return false;
        }
        s.phase = Phase::Lost;
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_after_release_is_not_applied() {
        let cell = LeaseCell::new(Millis(100));
        let v = cell.begin_renewal().unwrap();
        assert!(cell.release());
        assert!(!cell.renewed(v, Millis(500)));
        let s = cell.snapshot();
        assert_eq!((s.phase, s.valid_until), (Phase::Released, Millis(100)));
        assert_eq!(cell.begin_renewal(), None);
    }

    #[test]
    fn lost_is_reported_once_and_never_after_release() {
        let cell = LeaseCell::new(Millis(100));
        assert!(cell.lose());
        assert!(!cell.lose());
        assert!(!cell.release());
        let released = LeaseCell::new(Millis(100));
        assert!(released.release());
        assert!(!released.release());
        assert!(!released.lose());
    }

    #[test]
    fn a_stale_renewal_is_not_applied() {
        let cell = LeaseCell::new(Millis(100));
        let a = cell.begin_renewal().unwrap();
        let b = cell.begin_renewal().unwrap();
        assert!(cell.renewed(a, Millis(200)));
        assert!(!cell.renewed(b, Millis(150)));
        assert_eq!(cell.snapshot().valid_until, Millis(200));
        assert_eq!(cell.snapshot().version, 1);
    }
}

#[cfg(loom)]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    #[test]
    fn loom_a_renewal_racing_a_release_never_resurrects_the_lock() {
        loom::model(|| {
            let cell = LeaseCell::new(Millis(100));
            let renewer = {
                let cell = cell.clone();
                thread::spawn(move || {
                    if let Some(v) = cell.begin_renewal() {
                        // The renewal's round trip happens here.
                        thread::yield_now();
                        cell.renewed(v, Millis(200))
                    } else {
                        false
                    }
                })
            };
            let released = cell.release();
            let renewed = renewer.join().unwrap();
            assert!(released, "nothing else ends the hold");
            let s = cell.snapshot();
            assert_eq!(s.phase, Phase::Released);
            assert_eq!(cell.begin_renewal(), None);
            // A renewal that landed is only visible if it landed before the release.
            assert_eq!(s.valid_until == Millis(200), renewed);
        });
    }

    #[test]
    fn loom_lost_fires_exactly_once() {
        loom::model(|| {
            let cell = LeaseCell::new(Millis(100));
            let fired = loom::sync::Arc::new(AtomicUsize::new(0));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let cell = cell.clone();
                    let fired = fired.clone();
                    thread::spawn(move || {
                        // The expiry timer and a failed renewal both report loss.
                        if cell.lose() {
                            fired.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(fired.load(Ordering::SeqCst), 1);
            assert_eq!(cell.snapshot().phase, Phase::Lost);
        });
    }

    #[test]
    fn loom_release_and_loss_race_to_exactly_one_end() {
        loom::model(|| {
            let cell = LeaseCell::new(Millis(100));
            let loser = {
                let cell = cell.clone();
                thread::spawn(move || cell.lose())
            };
            let released = cell.release();
            let lost = loser.join().unwrap();
            assert!(
                released ^ lost,
                "exactly one of release and loss ends the hold"
            );
            let phase = cell.snapshot().phase;
            assert_eq!(phase == Phase::Lost, lost);
        });
    }

    #[test]
    fn loom_double_release_is_harmless() {
        loom::model(|| {
            let cell = LeaseCell::new(Millis(100));
            let other = {
                let cell = cell.clone();
                thread::spawn(move || cell.release())
            };
            let mine = cell.release();
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one release counts");
            assert_eq!(cell.snapshot().phase, Phase::Released);
            assert!(!cell.lose());
        });
    }
}
