//! The randomized nemesis: clients of the real adapter in containers of
//! their own, real container faults on a seeded schedule, a protected
//! resource that logs every access, and a checker that judges from that
//! log. See the crate docs for what is real and what is not.

pub mod campaign;
pub mod checker;
pub mod record;
pub mod relay;
pub mod run;

use std::str::FromStr;

/// A deliberate bug in the nemesis client (never in the adapter library),
/// which the nemesis must catch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The correct client.
    #[default]
    None,
    /// Works past `valid_until()` by 20 % of the TTL before its write.
    Overstate,
    /// Releases with a plain `DEL` of the lock key (no owner check).
    PlainDel,
    /// Does not pass its fence to the resource (and holds the lock without
    /// renewal, so that a pause aimed at its read lands in the step only
    /// the fence can protect).
    NoFence,
    /// Ignores `lost()` and validity: keeps working after renewal failed.
    IgnoreLost,
}

impl Mutation {
    /// Every mutation, the correct client excluded.
    pub const ALL: [Mutation; 4] = [
        Mutation::Overstate,
        Mutation::PlainDel,
        Mutation::NoFence,
        Mutation::IgnoreLost,
    ];

    /// The command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::None => "none",
            Mutation::Overstate => "overstate",
            Mutation::PlainDel => "plain-del",
            Mutation::NoFence => "no-fence",
            Mutation::IgnoreLost => "ignore-lost",
        }
    }
}

/// An unknown name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what}: {name}")]
pub struct UnknownName {
    /// What kind of name.
    pub what: &'static str,
    /// The name given.
    pub name: String,
}

impl FromStr for Mutation {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Mutation::None]
            .into_iter()
            .chain(Mutation::ALL)
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "mutation",
                name: s.to_owned(),
            })
    }
}

/// A small seeded generator (the core's SplitMix64): the schedule and the
/// clients' choices replay from the seed.
#[derive(Clone, Debug)]
pub struct Rng(lockwright_core::rng::SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(lockwright_core::rng::SplitMix64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `low..=high` (`low` when `high < low`).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        self.0.range((low, high))
    }

    /// `k` distinct indices of `0..n`, in random order.
    pub fn choose(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..n {
            let j = i + (self.next_u64() % (n - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(k.min(n));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_parse_and_the_generator_replays() {
        for m in Mutation::ALL {
            assert_eq!(m.as_str().parse::<Mutation>(), Ok(m));
        }
        assert!("typo".parse::<Mutation>().is_err());
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        assert!((0..100).all(|_| (3..=5).contains(&a.range(3, 5))));
        let picked = a.choose(5, 3);
        assert_eq!(picked.len(), 3);
        assert!(picked.iter().all(|&i| i < 5));
    }
}
