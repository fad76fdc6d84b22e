//! One small seeded generator for the whole workspace: the engine's retry
//! jitter, the simulator's draws, and the chaos schedules and replays all
//! take their randomness from [`SplitMix64`], so a seed means the same
//! sequence everywhere.

/// SplitMix64: a tiny, good-enough generator, so the core needs no `rand`.
/// The value is the state; the same seed gives the same sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in the inclusive range.
    pub fn range(&mut self, (min, max): (u64, u64)) -> u64 {
        match (max - min).checked_add(1) {
            Some(span) => min + self.next_u64() % span,
            None => self.next_u64(),
        }
    }

    /// True with the given chance in percent (0 never, 100 always).
    pub fn chance(&mut self, percent: u8) -> bool {
        percent > 0 && self.next_u64() % 100 < u64::from(percent)
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn splitmix_ranges_are_inclusive_and_repeatable() {
        let mut a = SplitMix64(3);
        let mut b = SplitMix64(3);
        let mut seen = [false; 4];
        for _ in 0..200 {
            let x = a.range((2, 5));
            assert_eq!(x, b.range((2, 5)));
            seen[(x - 2) as usize] = true;
        }
        assert_eq!(seen, [true; 4]);
        assert!(!a.chance(0));
        assert!(a.chance(100));
    }
}
