//! Who is inside the critical section: the one rule that the model
//! ([`crate::model::ClientState`]), the simulator ([`crate::sim::History`])
//! and the chaos histories (`lockwright_chaos::history`) share.
//!
//! A client is inside from the moment a grant reaches it (from then on it
//! believes it holds) until the first of
//!
//! - **leaving**: it calls release, its machine reports the hold lost, or
//!   it crashes (a crashed client touches nothing more);
//! - **its validity's end as it can see it**: the instant its own clock
//!   reads the lease's `valid_until`, if it can act on that reading then.
//!   A holder that cannot (it is *stuck*: a paused process, a stalled VM)
//!   stays inside until it runs again, since a well-behaved holder checks
//!   its clock before it acts and a stuck one acts on what it checked
//!   before. The model and the simulator know when a client is paused. A
//!   history of real processes knows only what a pause leaves behind: a
//!   protected write after the validity's end, which shows that the holder
//!   still acted as one until that write.
//!
//! A pause that begins after the validity's end does not bring a holder
//! back: it left at that end. [`inside`] judges one instant; [`Stay::end`]
//! gives the end of a whole stay; the test below checks that the two agree.

/// What the rule needs to know of a holder at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// It believes it holds: a grant reached it and it has not left
    /// (released, been told the hold is lost, crashed).
    pub holds: bool,
    /// Its own clock reads before the lease's `valid_until`.
    pub within_validity: bool,
    /// It was stuck when its clock reached `valid_until` and still is
    /// (paused, and has not taken a step since).
    pub stuck: bool,
}

/// Is a holder in this situation inside its critical section?
pub fn inside(h: Holder) -> bool {
    h.holds && (h.within_validity || h.stuck)
}

/// One stay over true time, for histories: a grant reached the client at
/// `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stay {
    /// The true instant the grant reached the client.
    pub from: u64,
    /// The first true instant at which the client's own clock reads the
    /// lease's `valid_until`.
    pub validity_ends: u64,
    /// The true instant it left (release call, lost, crash), if it did.
    pub left: Option<u64>,
    /// A stretch `[start, end)` of true time during which it was stuck; it
    /// counts only if it covers `validity_ends`. A history of real
    /// processes passes `(validity_ends, w)` for a protected write at `w`
    /// after the validity's end.
    pub stuck: Option<(u64, u64)>,
}

impl Stay {
    /// The true instant the stay ends (exclusive: the client is inside at
    /// every `t` with `from <= t < end`).
    pub fn end(&self) -> u64 {
        let own_end = match self.stuck {
            Some((start, end)) if start <= self.validity_ends && self.validity_ends < end => end,
            _ => self.validity_ends,
        };
        self.left
            .map_or(own_end, |left| left.min(own_end))
            .max(self.from)
    }

    /// The rule at one instant `t`, as the model applies it to a state.
    pub fn inside_at(&self, t: u64) -> bool {
        let stuck = self.stuck.is_some_and(|(start, end)| {
            start <= self.validity_ends && self.validity_ends < end && t < end
        });
        inside(Holder {
            holds: self.from <= t && self.left.is_none_or(|left| t < left),
            within_validity: t < self.validity_ends,
            stuck,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stay over a small range, at every instant: the end of the
    /// stay and the rule at each instant agree.
    #[test]
    fn a_stays_end_is_where_the_rule_at_each_instant_turns_false() {
        let mut checked = 0;
        for from in 0..4 {
            for validity_ends in 0..8 {
                for left in (0..9).map(Some).chain([None]) {
                    for stuck in (0..9)
                        .flat_map(|a| (a..10).map(move |b| Some((a, b))))
                        .chain([None])
                    {
                        let stay = Stay {
                            from,
                            validity_ends,
                            left,
                            stuck,
                        };
                        let end = stay.end();
                        for t in 0..12 {
                            let expected = from <= t && t < end;
                            assert_eq!(stay.inside_at(t), expected, "{stay:?} at {t} (end {end})");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    #[test]
    fn a_pause_over_the_validitys_end_keeps_the_holder_inside_and_a_later_one_does_not() {
        let base = Stay {
            from: 0,
            validity_ends: 10,
            left: None,
            stuck: None,
        };
        assert_eq!(base.end(), 10);
        assert_eq!(
            Stay {
                stuck: Some((5, 15)),
                ..base
            }
            .end(),
            15
        );
        assert_eq!(
            Stay {
                stuck: Some((11, 15)),
                ..base
            }
            .end(),
            10
        );
        assert_eq!(
            Stay {
                stuck: Some((5, 10)),
                ..base
            }
            .end(),
            10
        );
        // Leaving (a crash) ends a stay even while stuck.
        assert_eq!(
            Stay {
                stuck: Some((5, 15)),
                left: Some(12),
                ..base
            }
            .end(),
            12
        );
        assert!(!inside(Holder {
            holds: false,
            within_validity: true,
            stuck: true
        }));
    }
}
