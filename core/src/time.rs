//! Time as data: the caller's clock, passed in.

use std::fmt;
use std::ops::{Add, Sub};

/// A reading of some clock in milliseconds.
///
/// For a client machine this is the caller's *local monotonic* clock; for a
/// [`Keyspace`](crate::keyspace::Keyspace) it is the node's own wall clock.
/// The core never reads a clock: every call that needs the time takes one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    /// The zero instant.
    pub const ZERO: Millis = Millis(0);

    /// Milliseconds since the clock's origin.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating at `u64::MAX` instead of overflowing.
    pub const fn saturating_add(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    pub const fn saturating_since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<u64> for Millis {
    type Output = Millis;
    fn add(self, ms: u64) -> Millis {
        self.saturating_add(ms)
    }
}

impl Sub<Millis> for Millis {
    type Output = u64;
    fn sub(self, earlier: Millis) -> u64 {
        self.saturating_since(earlier)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
