//! Histories of what clients did, and the checks run over them.
//!
//! A scenario records every grant, release, protected write and observation
//! with its time (microseconds since the history began, on this process'
//! monotonic clock) and fence. The checks are a lock-set and lost-update
//! check in the manner of Jepsen's etcd lock tests:
//!
//! - **mutual exclusion** ([`History::overlaps`]): more than `limit` holds
//!   inside their critical sections at one instant. A hold is inside by the
//!   rule the model and the simulator use (`lockwright_model::inside`): from
//!   its grant until the earlier of its release and its validity, and,
//!   beyond that, until its last protected write: a client that writes
//!   after its validity ran out (a paused client that resumes) still
//!   believed it held.
//! - **fenced resource** ([`History::stale_writes`]): a write accepted from a
//!   hold that was superseded (in grant order) by a hold whose write the
//!   resource had already accepted: the lost update.
//! - **owner only** ([`History::foreign_removals`]): a client's release or
//!   extend removed another client's hold, as observed on the server.

use lockwright_model::inside::Stay;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The client was granted a hold valid until `valid_until_us` (history
    /// time), with a fence when the protocol issues one.
    Grant {
        /// The fence, if any.
        fence: Option<u64>,
        /// When the client must leave its critical section.
        valid_until_us: u64,
    },
    /// An acquire attempt came back without a grant.
    Denied,
    /// The client left its critical section and asked for a release.
    Release,
    /// The client left its critical section without releasing (it crashed,
    /// or its validity ran out and it noticed).
    Leave,
    /// A protected write, accepted or refused by the resource.
    Write {
        /// The fence the write carried, if any.
        fence: Option<u64>,
        /// Did the resource accept it?
        accepted: bool,
    },
    /// This client's request removed the hold of `victim`, which had not
    /// released it.
    RemovedHoldOf {
        /// The client whose hold was removed.
        victim: String,
    },
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Microseconds since the history began.
    pub at_us: u64,
    /// Which client.
    pub client: String,
    /// What it did.
    pub op: Op,
}

/// A hold as the checks see it: from grant to the end of its critical
/// section.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The holder.
    pub client: String,
    /// Position in grant order (0 = first grant).
    pub rank: usize,
    /// Grant time.
    pub from_us: u64,
    /// End of the critical section (see the module docs).
    pub to_us: u64,
    /// The fence, if any.
    pub fence: Option<u64>,
}

/// Two (or more than `limit`) holds inside at once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Overlap {
    /// When the excess began.
    pub at_us: u64,
    /// The holds inside at that instant.
    pub holds: Vec<Hold>,
}

/// A write accepted out of grant order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StaleWrite {
    /// The stale writer.
    pub client: String,
    /// When its write was accepted.
    pub at_us: u64,
    /// Its hold's rank in grant order.
    pub rank: usize,
    /// The rank of the newer hold whose write was accepted before it.
    pub superseded_by: usize,
}

/// A thread-safe, append-only history shared by a scenario's clients.
#[derive(Clone, Debug)]
pub struct History {
    origin: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose time 0 is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Microseconds since the history began.
    pub fn now_us(&self) -> u64 {
        self.us_of(Instant::now())
    }

    /// History time (µs) of `instant` (0 for instants before the history).
    pub fn us_of(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX)
    }

    /// Records `op` by `client` now.
    pub fn record(&self, client: &str, op: Op) {
        let at_us = self.now_us();
        self.record_at(at_us, client, op);
    }

    /// Records `op` by `client` at `at_us`.
    pub fn record_at(&self, at_us: u64, client: &str, op: Op) {
        self.lock().push(Entry {
            at_us,
            client: client.to_owned(),
            op,
        });
    }

    /// Records a grant now, valid for `validity` from now on.
    pub fn grant(&self, client: &str, fence: Option<u64>, valid_until: Instant) {
        let valid_until_us = self.us_of(valid_until);
        self.record(
            client,
            Op::Grant {
                fence,
                valid_until_us,
            },
        );
    }

    /// Records a grant now for a hold that renews itself: it lasts until the
    /// client records [`Op::Leave`] or [`Op::Release`].
    pub fn grant_renewing(&self, client: &str, fence: Option<u64>) {
        self.record(
            client,
            Op::Grant {
                fence,
                valid_until_us: u64::MAX,
            },
        );
    }

    /// Records `op` by `client` at `instant` (which may lie ahead: a crashed
    /// holder counts as inside until its validity runs out).
    pub fn record_at_instant(&self, instant: Instant, client: &str, op: Op) {
        self.record_at(self.us_of(instant), client, op);
    }

    /// Records a grant whose validity is `validity` from now.
    pub fn grant_for(&self, client: &str, fence: Option<u64>, validity: Duration) {
        self.grant(client, fence, Instant::now() + validity);
    }

    /// Every entry, in time order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries = self.lock().clone();
        entries.sort_by_key(|entry| entry.at_us);
        entries
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every hold, in grant order, each ending by the shared inside rule
    /// (`lockwright_model::inside::Stay`): at the first of its release or
    /// leave, the client's next grant, and its validity's end, or its last
    /// protected write when that came after the validity's end (the sign
    /// of a holder that could not see its clock: a pause).
    pub fn holds(&self) -> Vec<Hold> {
        /// How a hold's stay ends (`stays[i]` is `holds[i]`'s).
        struct Open {
            left: Option<u64>,
            last_write: Option<u64>,
        }
        let entries = self.entries();
        let mut holds: Vec<Hold> = Vec::new();
        let mut stays: Vec<Open> = Vec::new();
        // Index in `stays` of each client's current hold.
        let mut current: Vec<(String, usize)> = Vec::new();
        for entry in &entries {
            let open = current
                .iter()
                .position(|(client, _)| *client == entry.client);
            match &entry.op {
                Op::Grant {
                    fence,
                    valid_until_us,
                } => {
                    if let Some(at) = open {
                        stays[current.remove(at).1].left = Some(entry.at_us);
                    }
                    let rank = holds.len();
                    holds.push(Hold {
                        client: entry.client.clone(),
                        rank,
                        from_us: entry.at_us,
                        to_us: *valid_until_us,
                        fence: *fence,
                    });
                    stays.push(Open {
                        left: None,
                        last_write: None,
                    });
                    current.push((entry.client.clone(), rank));
                }
                Op::Release | Op::Leave => {
                    if let Some(at) = open {
                        stays[current.remove(at).1].left = Some(entry.at_us);
                    }
                }
                Op::Write { .. } => {
                    if let Some(at) = open {
                        stays[current[at].1].last_write = Some(entry.at_us);
                    }
                }
                Op::Denied | Op::RemovedHoldOf { .. } => {}
            }
        }
        for (hold, stay) in holds.iter_mut().zip(stays) {
            let validity_ends = hold.to_us;
            hold.to_us = Stay {
                from: hold.from_us,
                validity_ends,
                left: stay.left,
                stuck: stay
                    .last_write
                    .filter(|w| *w > validity_ends)
                    .map(|w| (validity_ends, w)),
            }
            .end();
        }
        holds
    }

    /// The first instant at which more than `limit` holds were inside,
    /// if any (a sweep over the holds' intervals; an interval ending when
    /// another begins does not overlap it).
    pub fn overlaps(&self, limit: usize) -> Option<Overlap> {
        let holds = self.holds();
        let mut starts: Vec<&Hold> = holds.iter().collect();
        starts.sort_by_key(|hold| hold.from_us);
        for hold in &starts {
            let at = hold.from_us;
            let inside: Vec<Hold> = holds
                .iter()
                .filter(|other| other.from_us <= at && at < other.to_us)
                .cloned()
                .collect();
            if inside.len() > limit {
                return Some(Overlap {
                    at_us: at,
                    holds: inside,
                });
            }
        }
        None
    }

    /// Writes accepted from a hold superseded by a hold whose write had
    /// already been accepted.
    pub fn stale_writes(&self) -> Vec<StaleWrite> {
        let entries = self.entries();
        let holds = self.holds();
        let mut rank_of_client: Vec<(String, usize)> = Vec::new();
        let mut newest: Option<usize> = None;
        let mut stale = Vec::new();
        let mut granted = 0;
        for entry in &entries {
            match &entry.op {
                Op::Grant { .. } => {
                    rank_of_client.retain(|(client, _)| *client != entry.client);
                    rank_of_client.push((entry.client.clone(), holds[granted].rank));
                    granted += 1;
                }
                Op::Write { accepted: true, .. } => {
                    let Some(rank) = rank_of_client
                        .iter()
                        .find(|(client, _)| *client == entry.client)
                        .map(|(_, rank)| *rank)
                    else {
                        continue;
                    };
                    match newest {
                        Some(newer) if rank < newer => stale.push(StaleWrite {
                            client: entry.client.clone(),
                            at_us: entry.at_us,
                            rank,
                            superseded_by: newer,
                        }),
                        _ => newest = Some(rank),
                    }
                }
                _ => {}
            }
        }
        stale
    }

    /// `(remover, victim)` for every observed removal of another's hold.
    pub fn foreign_removals(&self) -> Vec<(String, String)> {
        self.entries()
            .into_iter()
            .filter_map(|entry| match entry.op {
                Op::RemovedHoldOf { victim } => Some((entry.client, victim)),
                _ => None,
            })
            .collect()
    }

    /// Whether `property` (a model property id) was violated in this
    /// history, with a one-line reason.
    pub fn verdict(&self, property: &str, limit: usize) -> Observed {
        let violation = match property {
            "mutual-exclusion" => self.overlaps(limit).map(|overlap| {
                let who: Vec<String> = overlap
                    .holds
                    .iter()
                    .map(|hold| {
                        format!(
                            "{} [{}..{}] ms{}",
                            hold.client,
                            ms(hold.from_us),
                            ms(hold.to_us),
                            hold.fence
                                .map(|fence| format!(" fence {fence}"))
                                .unwrap_or_default()
                        )
                    })
                    .collect();
                format!(
                    "{} holds inside at {} ms: {}",
                    overlap.holds.len(),
                    ms(overlap.at_us),
                    who.join(", ")
                )
            }),
            "fenced-resource" => self.stale_writes().first().map(|stale| {
                format!(
                    "{} (grant #{}) wrote at {} ms after grant #{} had written",
                    stale.client,
                    stale.rank,
                    ms(stale.at_us),
                    stale.superseded_by
                )
            }),
            "owner-only" => self
                .foreign_removals()
                .first()
                .map(|(remover, victim)| format!("{remover} removed {victim}'s hold")),
            other => Some(format!("no check for property {other}")),
        };
        match violation {
            Some(reason) => Observed::Violated(reason),
            None => Observed::Holds,
        }
    }
}

/// Microseconds as milliseconds with one decimal.
fn ms(us: u64) -> String {
    format!("{}.{}", us / 1000, us % 1000 / 100)
}

/// What a scenario observed for one property.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Observed {
    /// No violation in the history.
    Holds,
    /// A violation, and what it was.
    Violated(String),
}

impl Observed {
    /// `holds` or `violated`, as the model's verdicts are spelled.
    pub fn as_str(&self) -> &'static str {
        match self {
            Observed::Holds => "holds",
            Observed::Violated(_) => "violated",
        }
    }
}

impl fmt::Display for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Observed::Holds => f.write_str("holds"),
            Observed::Violated(reason) => write!(f, "violated ({reason})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(history: &History, at: u64, client: &str, fence: u64, until: u64) {
        history.record_at(
            at,
            client,
            Op::Grant {
                fence: Some(fence),
                valid_until_us: until,
            },
        );
    }

    #[test]
    fn sequential_holds_do_not_overlap() {
        let history = History::new();
        grant(&history, 0, "a", 1, 100);
        history.record_at(50, "a", Op::Release);
        grant(&history, 60, "b", 2, 160);
        assert_eq!(history.overlaps(1), None);
        assert_eq!(history.verdict("mutual-exclusion", 1), Observed::Holds);
    }

    #[test]
    fn a_late_write_extends_the_hold_into_an_overlap() {
        let history = History::new();
        grant(&history, 0, "a", 1, 100);
        grant(&history, 120, "b", 2, 220);
        assert_eq!(history.overlaps(1), None);
        history.record_at(
            150,
            "a",
            Op::Write {
                fence: Some(1),
                accepted: false,
            },
        );
        let overlap = history.overlaps(1).expect("a paused writer overlaps");
        assert_eq!(overlap.at_us, 120);
        assert_eq!(overlap.holds.len(), 2);
        assert_eq!(history.overlaps(2), None, "two permits allow it");
    }

    #[test]
    fn accepted_writes_out_of_grant_order_are_stale() {
        let history = History::new();
        grant(&history, 0, "a", 1, 100);
        grant(&history, 120, "b", 2, 220);
        let write = |at, client: &str, accepted| {
            history.record_at(
                at,
                client,
                Op::Write {
                    fence: None,
                    accepted,
                },
            );
        };
        write(130, "b", true);
        write(140, "a", false);
        assert!(history.stale_writes().is_empty(), "a refused write is fine");
        write(150, "a", true);
        let stale = history.stale_writes();
        assert_eq!(stale.len(), 1);
        assert_eq!((stale[0].rank, stale[0].superseded_by), (0, 1));
        assert_eq!(history.verdict("fenced-resource", 1).as_str(), "violated");
    }

    #[test]
    fn removals_of_another_hold_break_owner_only() {
        let history = History::new();
        assert_eq!(history.verdict("owner-only", 1), Observed::Holds);
        history.record("a", Op::RemovedHoldOf { victim: "b".into() });
        assert_eq!(history.foreign_removals(), [("a".into(), "b".into())]);
    }
}
