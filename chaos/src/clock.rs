//! A node's fake clock: a libfaketime file in a host directory that is
//! bind-mounted into the container. It holds either an offset from the real
//! time (the clock runs) or, for a replay, an absolute reading in
//! milliseconds since the epoch (the wall clock stands still where the
//! harness puts it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::ChaosError;

/// File name of the offset inside the mounted directory.
pub(crate) const OFFSET_FILE: &str = "offset";

/// The offset, in milliseconds, that libfaketime adds to one node's clocks.
///
/// The file holds a relative offset such as `+1.500` (seconds). The node
/// starts with `+0.000` (the real time); libfaketime rereads the file on every
/// clock call (`FAKETIME_NO_CACHE=1`), so a rewrite is a jump at run time of
/// both the wall clock and the monotonic clock Redis uses for expiry.
#[derive(Debug)]
pub struct FakeClock {
    dir: PathBuf,
    offset_ms: i64,
    /// `Some(reading)`: a frozen clock (see [`FakeClock::frozen`]).
    frozen_ms: Option<u64>,
}

impl FakeClock {
    /// Creates a fresh directory under the system temp dir holding `+0.000`.
    pub fn new() -> Result<Self, ChaosError> {
        Self::create(None)
    }

    /// A frozen clock reading `0.000`: the wall clock of a node started with
    /// [`frozen_env`] stands at this many milliseconds since the epoch until
    /// [`set_frozen_ms`](Self::set_frozen_ms) moves it (its monotonic clock
    /// keeps running, so timers and replication work as usual).
    pub fn frozen() -> Result<Self, ChaosError> {
        Self::create(Some(0))
    }

    fn create(frozen_ms: Option<u64>) -> Result<Self, ChaosError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.subsec_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!(
            "lockwright-faketime-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let clock = Self {
            dir,
            offset_ms: 0,
            frozen_ms,
        };
        clock.write()?;
        Ok(clock)
    }

    /// The host directory to bind-mount.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file libfaketime reads (`FAKETIME_TIMESTAMP_FILE`), for a process
    /// on the host.
    pub fn file(&self) -> PathBuf {
        self.dir.join(OFFSET_FILE)
    }

    /// The current offset from the real time, in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// Sets the offset from the real time (negative: the clock goes back).
    pub fn set_offset_ms(&mut self, offset_ms: i64) -> Result<(), ChaosError> {
        self.offset_ms = offset_ms;
        self.write()
    }

    /// The reading of a frozen clock (`None` for an offset clock).
    pub fn frozen_ms(&self) -> Option<u64> {
        self.frozen_ms
    }

    /// Sets a frozen clock's reading, in milliseconds since the epoch; an
    /// offset clock becomes frozen (only meaningful for a node started with
    /// [`frozen_env`]).
    pub fn set_frozen_ms(&mut self, ms: u64) -> Result<(), ChaosError> {
        self.frozen_ms = Some(ms);
        self.write()
    }

    /// Moves the clock forward by `ms` from where it is now.
    pub fn jump_ms(&mut self, ms: i64) -> Result<(), ChaosError> {
        self.set_offset_ms(self.offset_ms.saturating_add(ms))
    }

    fn write(&self) -> Result<(), ChaosError> {
        // Write then rename, so that libfaketime never reads a half-written file.
        let temporary = self.dir.join(format!("{OFFSET_FILE}.tmp"));
        let text = match self.frozen_ms {
            Some(ms) => faketime_absolute(ms),
            None => faketime_offset(self.offset_ms),
        };
        std::fs::write(&temporary, format!("{text}\n"))?;
        std::fs::rename(&temporary, self.dir.join(OFFSET_FILE))?;
        Ok(())
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        // Best effort: a leftover directory in the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// libfaketime's relative offset syntax: `[+-]seconds.millis`.
pub(crate) fn faketime_offset(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let magnitude = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}", magnitude / 1000, magnitude % 1000)
}

/// An absolute reading in the `%s` format (seconds since the epoch) with
/// milliseconds: libfaketime parses the fraction after the format and
/// freezes the clock there.
///
/// libfaketime turns the fraction into nanoseconds through a `double` and
/// truncates, so `.021` would read as 20.999999 ms and Redis would see
/// millisecond 20. Half a microsecond more keeps every reading on its
/// millisecond and on its whole microsecond (`TIME` still answers
/// `…021000`).
pub(crate) fn faketime_absolute(ms: u64) -> String {
    format!("{}.{:03}0005", ms / 1000, ms % 1000)
}

/// The environment that makes libfaketime read a [`FakeClock::frozen`] file:
/// absolute readings in seconds since the epoch, and the monotonic clock
/// left alone.
pub fn frozen_env() -> [(&'static str, &'static str); 2] {
    [
        ("FAKETIME_FMT", "%s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_written_in_faketime_syntax() {
        assert_eq!(faketime_offset(0), "+0.000");
        assert_eq!(faketime_offset(1_500), "+1.500");
        assert_eq!(faketime_offset(-2_007), "-2.007");
        assert_eq!(faketime_offset(i64::MIN), "-9223372036854775.808");
    }

    #[test]
    fn frozen_readings_are_seconds_with_milliseconds() {
        assert_eq!(faketime_absolute(0), "0.0000005");
        assert_eq!(faketime_absolute(10_001), "10.0010005");
        let mut clock = FakeClock::frozen().expect("temp dir");
        clock.set_frozen_ms(42_250).expect("write");
        let text = std::fs::read_to_string(clock.dir().join(OFFSET_FILE)).expect("read");
        assert_eq!(text, "42.2500005\n");
    }

    #[test]
    fn a_jump_accumulates_and_rewrites_the_file() {
        let mut clock = FakeClock::new().expect("temp dir");
        clock.jump_ms(1_000).expect("write");
        clock.jump_ms(250).expect("write");
        assert_eq!(clock.offset_ms(), 1_250);
        let text = std::fs::read_to_string(clock.dir().join(OFFSET_FILE)).expect("read");
        assert_eq!(text, "+1.250\n");
        let dir = clock.dir().to_path_buf();
        drop(clock);
        assert!(!dir.exists());
    }
}
