//! A node's fake clock: a libfaketime offset file in a host directory that
//! is bind-mounted into the container.

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
}

impl FakeClock {
    /// Creates a fresh directory under the system temp dir holding `+0.000`.
    pub fn new() -> Result<Self, ChaosError> {
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
        let clock = Self { dir, offset_ms: 0 };
        clock.write()?;
        Ok(clock)
    }

    /// The host directory to bind-mount.
    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// Moves the clock forward by `ms` from where it is now.
    pub fn jump_ms(&mut self, ms: i64) -> Result<(), ChaosError> {
        self.set_offset_ms(self.offset_ms.saturating_add(ms))
    }

    fn write(&self) -> Result<(), ChaosError> {
        // Write then rename, so that libfaketime never reads a half-written file.
        let temporary = self.dir.join(format!("{OFFSET_FILE}.tmp"));
        std::fs::write(&temporary, format!("{}\n", faketime_offset(self.offset_ms)))?;
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
