//! The nemesis checker: judges a run from the protected resource's log and
//! the clients' histories, trusting neither the adapter's validity nor the
//! clients' own claims: mutual exclusion and the fenced resource are read
//! from the log (the integrity checks compare the clients' answers with
//! it). The clients' records serve only to make a verdict more careful or
//! where no log can: an access its client saw time out is not counted as
//! certain; owner-only uses the acquires' times (a pause excuses an
//! overlap; the other holder's lease must certainly have stood); progress
//! is judged from the acquires alone ([`progress`]).
//!
//! The resource is a single Redis running one script, so its log is a total
//! order of the accesses that reached it, in real time. A client's critical
//! section is the stretch from its read (entry) to its write (exit) of one
//! loop iteration; both are in the log when they reached the resource,
//! whether accepted or refused. The checks:
//!
//! - **mutual exclusion**: when a client's read (one its client saw
//!   answered: a read that timed out may have run after its client gave up)
//!   is logged while more than
//!   `limit - 1` other clients' sections are open, that is, their read is
//!   logged before it and their write after it, more than `limit` clients
//!   were inside at the instant the resource ran that read. A section whose
//!   write never reached the resource (abandoned, crashed, timed out), or
//!   whose write its client saw time out, is never counted as open: no uncertainty window is guessed, so a reported
//!   overlap is certain and a missed one is possible.
//!
//!   A section is the part of a client's stay inside (the rule shared by
//!   the model, the simulator and the scenario histories,
//!   `lockwright_model::inside`) that the resource can witness: the read
//!   comes after the grant, and the write comes no later than the stay's
//!   end, since by that rule a write after the validity's end extends the
//!   stay to it. So two open sections are two stays inside at once; the
//!   converse need not hold (a stay with no logged write, the time between
//!   a grant and its read), which is why a missed overlap is possible.
//! - **fenced resource** (locks only): the resource accepted a client's
//!   write after it accepted the read of another client that entered after
//!   that client's own accepted read: a superseded holder's write landed
//!   after its successor's access.
//! - **fence order**: the fences of accepted accesses never decrease.
//! - **lost or duplicated accesses**: each (client, iteration, step) is
//!   logged at most once, each access its client saw succeed is logged as
//!   accepted, and none its client saw refused (or never sent) is logged as
//!   accepted.

use std::collections::HashMap;

use super::record::{LogEntry, OpKind, OpRecord, Outcome};

/// What the checker found for one property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The check: `mutual-exclusion`, `unpaused-overlap`,
    /// `fenced-resource`, `fence-order`, `lost-or-duplicated`, `progress`.
    pub check: &'static str,
    /// The evidence: the log entries involved.
    pub excerpt: String,
}

/// The checker's verdicts for one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judgement {
    /// Every violation found (empty: none).
    pub findings: Vec<Finding>,
    /// Sections with both their read and their write logged.
    pub complete_sections: usize,
}

impl Judgement {
    /// The findings of one check.
    pub fn of(&self, check: &str) -> impl Iterator<Item = &Finding> {
        let check = check.to_owned();
        self.findings.iter().filter(move |f| f.check == check)
    }

    /// Was `check` violated?
    pub fn violated(&self, check: &str) -> bool {
        self.of(check).next().is_some()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Section {
    read: Option<usize>,
    write: Option<usize>,
}

/// A client paused by the nemesis from `from_us` to `to_us` (host time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paused {
    /// The client.
    pub client: u32,
    /// When the pause command was issued.
    pub from_us: u64,
    /// When the unpause command returned.
    pub to_us: u64,
}

/// Slack around a pause when deciding whether a section was paused: the
/// resource's clock and the harness' are the same host clock, the slack
/// covers the time between a command and its effect.
const PAUSE_SLACK_US: u64 = 100_000;

/// Judges a run: `log` in the resource's order, `history` the clients'
/// records (any order), `limit` the permits allowed at once (1 for a lock).
pub fn judge(log: &[LogEntry], history: &[OpRecord], limit: usize) -> Judgement {
    judge_with_pauses(log, history, limit, &[], u64::MAX)
}

/// [`judge`], and also `unpaused-overlap`: a mutual-exclusion overlap in
/// which no hold involved was paused by the nemesis (`paused`); a hold runs
/// from its acquire's invocation (from `history`, when recorded) to its
/// write, or its read when no write was logged. A
/// paused holder explains an overlap (the pause cells of the matrix); two
/// unpaused sections overlapping in a run whose only fault is pauses mean
/// that a hold was ended by someone other than its owner or its TTL.
///
/// `lease_us` (the TTL) makes that certain: an unpaused section counts only
/// when the entering client's acquire completed before the section's
/// holder's acquire was invoked plus the TTL, so that the holder's key
/// had certainly not expired on its own (a holder that writes late, past
/// its lease, is no evidence against the owner check). Sections without
/// an acquire record then do not count. `u64::MAX` drops the condition.
pub fn judge_with_pauses(
    log: &[LogEntry],
    history: &[OpRecord],
    limit: usize,
    paused: &[Paused],
    lease_us: u64,
) -> Judgement {
    let mut judgement = Judgement::default();
    let mut sections: HashMap<(u32, u64), Section> = HashMap::new();
    let mut seen: HashMap<(u32, u64, bool), usize> = HashMap::new();
    for (index, entry) in log.iter().enumerate() {
        let is_read = entry.op == OpKind::Read;
        if let Some(first) = seen.insert((entry.client, entry.seq, is_read), index) {
            judgement.findings.push(Finding {
                check: "lost-or-duplicated",
                excerpt: format!(
                    "logged twice: #{first} {} and #{index} {}",
                    log[first].to_text(),
                    entry.to_text()
                ),
            });
            continue;
        }
        let section = sections.entry((entry.client, entry.seq)).or_default();
        if is_read {
            section.read = Some(index);
        } else {
            section.write = Some(index);
        }
    }
    let complete: Vec<((u32, u64), usize, usize)> = sections
        .iter()
        .filter_map(|(&key, s)| match (s.read, s.write) {
            (Some(r), Some(w)) if r < w => Some((key, r, w)),
            _ => None,
        })
        .collect();
    judgement.complete_sections = complete.len();
    // When each hold began: its acquire's invocation (host clock), when the
    // client recorded one. A pause between the acquire and the read leaves
    // the holder's lease running out before its section opens, so it
    // explains the overlaps of that section as much as a pause inside it.
    let acquired_at: HashMap<(u32, u64), u64> = history
        .iter()
        .filter(|r| r.op == OpKind::Acquire && r.outcome == Outcome::Ok)
        .map(|r| ((r.client, r.seq), r.invoke_us))
        .collect();
    let granted_at: HashMap<(u32, u64), u64> = history
        .iter()
        .filter(|r| r.op == OpKind::Acquire && r.outcome == Outcome::Ok)
        .map(|r| ((r.client, r.seq), r.complete_us))
        .collect();

    // A read its client did not see answered (a timeout: it may have run
    // late, after the client gave up and released) is no certain entry.
    let unanswered: std::collections::HashSet<(u32, u64)> = history
        .iter()
        .filter(|r| r.op == OpKind::Read && r.outcome == Outcome::Indeterminate)
        .map(|r| (r.client, r.seq))
        .collect();
    // Likewise a write its client saw time out may have run after the
    // client released: it does not certainly close the section where it
    // is logged, so that section is not counted as open (the fenced
    // resource still judges the write itself).
    let write_unanswered: std::collections::HashSet<(u32, u64)> = history
        .iter()
        .filter(|r| r.op == OpKind::Write && r.outcome == Outcome::Indeterminate)
        .map(|r| (r.client, r.seq))
        .collect();

    // Mutual exclusion: at each read, who else is certainly inside?
    for (index, entry) in log.iter().enumerate() {
        if entry.op != OpKind::Read || unanswered.contains(&(entry.client, entry.seq)) {
            continue;
        }
        let inside: Vec<&((u32, u64), usize, usize)> = complete
            .iter()
            .filter(|((client, seq), r, w)| {
                *client != entry.client
                    && *r < index
                    && index < *w
                    && !write_unanswered.contains(&(*client, *seq))
            })
            .collect();
        let was_paused = |client: u32, from: usize, to: usize| {
            let seq = log[from].seq;
            let (mut from, to) = (log[from].at_us, log[to].at_us);
            if let Some(&at) = acquired_at.get(&(client, seq)) {
                from = from.min(at);
            }
            paused.iter().any(|p| {
                p.client == client
                    && p.from_us <= to + PAUSE_SLACK_US
                    && from <= p.to_us + PAUSE_SLACK_US
            })
        };
        if inside.len() + 1 > limit {
            let own = sections
                .get(&(entry.client, entry.seq))
                .and_then(|s| s.write)
                .unwrap_or(index);
            // The entering client was granted at or before its read.
            let granted = granted_at
                .get(&(entry.client, entry.seq))
                .map_or(entry.at_us, |&at| at.min(entry.at_us));
            let lease_stood = |client: u32, seq: u64| {
                lease_us == u64::MAX
                    || acquired_at
                        .get(&(client, seq))
                        .is_some_and(|&at| granted < at.saturating_add(lease_us))
            };
            let unpaused = inside
                .iter()
                .filter(|((client, seq), r, w)| {
                    !was_paused(*client, *r, *w) && lease_stood(*client, *seq)
                })
                .count();
            if !was_paused(entry.client, index, own) && unpaused + 1 > limit {
                judgement.findings.push(Finding {
                    check: "unpaused-overlap",
                    excerpt: format!("#{index} {} (no section paused)", entry.to_text()),
                });
            }
            let mut excerpt = format!("#{index} {} entered while inside:", entry.to_text());
            for ((_, _), r, w) in inside.iter().take(4) {
                excerpt.push_str(&format!(
                    " [#{r} {} .. #{w} {}]",
                    log[*r].to_text(),
                    log[*w].to_text()
                ));
            }
            judgement.findings.push(Finding {
                check: "mutual-exclusion",
                excerpt,
            });
        }
    }

    // Fenced resource: an accepted write of a holder whose successor's read
    // was accepted after its own.
    if limit == 1 {
        for &((client, _), r, w) in &complete {
            if !(log[r].accepted && log[w].accepted) {
                continue;
            }
            if let Some((k, later)) = log
                .iter()
                .enumerate()
                .take(w)
                .skip(r + 1)
                .find(|(_, e)| e.op == OpKind::Read && e.accepted && e.client != client)
            {
                judgement.findings.push(Finding {
                    check: "fenced-resource",
                    excerpt: format!(
                        "#{r} {} then #{k} {} then the older holder's #{w} {} accepted",
                        log[r].to_text(),
                        later.to_text(),
                        log[w].to_text()
                    ),
                });
            }
        }
    }

    // Fence order among accepted accesses.
    let mut high: Option<(usize, u64)> = None;
    for (index, entry) in log.iter().enumerate() {
        let (true, Some(fence)) = (entry.accepted, entry.fence) else {
            continue;
        };
        match high {
            Some((at, top)) if fence < top => judgement.findings.push(Finding {
                check: "fence-order",
                excerpt: format!(
                    "#{index} {} accepted after #{at} {}",
                    entry.to_text(),
                    log[at].to_text()
                ),
            }),
            _ => high = Some((index, fence)),
        }
    }

    // Every access a client saw answered is logged with that answer.
    for record in history {
        let is_read = match record.op {
            OpKind::Read => true,
            OpKind::Write => false,
            _ => continue,
        };
        let logged = seen
            .get(&(record.client, record.seq, is_read))
            .map(|&i| &log[i]);
        let problem = match (record.outcome, logged) {
            (Outcome::Indeterminate, _) => None,
            (Outcome::Ok, None) => Some("answered ok but not logged"),
            // Refused, or never sent (no connection).
            (Outcome::Fail, None) => None,
            (Outcome::Ok, Some(entry)) if !entry.accepted => Some("answered ok, logged refused"),
            (Outcome::Fail, Some(entry)) if entry.accepted => Some("answered refused, logged ok"),
            _ => None,
        };
        if let Some(problem) = problem {
            judgement.findings.push(Finding {
                check: "lost-or-duplicated",
                excerpt: format!(
                    "client {} seq {} {:?} ({}): {problem}",
                    record.client,
                    record.seq,
                    record.op,
                    record.outcome.as_str()
                ),
            });
        }
    }
    judgement
}

/// Progress over a stretch `[from_us, to_us]` in which the system is
/// healthy (no fault active, the last one at least two TTLs past): a
/// stretch of `patience_us` or more without a single successful acquire,
/// while some client was waiting in an acquire across its middle, is a
/// violation (a deadlock, a leaked hold). A correct client's hold lasts
/// under two TTLs, so a patience of four TTLs leaves no honest explanation.
/// Judged from the clients' records: an acquire is `Ok` when its client
/// got the lock, and when it waited.
pub fn progress(
    history: &[OpRecord],
    from_us: u64,
    to_us: u64,
    patience_us: u64,
) -> Option<Finding> {
    let mut grants: Vec<u64> = history
        .iter()
        .filter(|r| r.op == OpKind::Acquire && r.outcome == Outcome::Ok)
        .map(|r| r.complete_us)
        .filter(|&at| from_us <= at && at <= to_us)
        .collect();
    grants.sort_unstable();
    let mut points = vec![from_us];
    points.extend(grants);
    points.push(to_us);
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.saturating_sub(a) < patience_us {
            continue;
        }
        let middle = a + (b - a) / 2;
        if let Some(waiter) = history
            .iter()
            .find(|r| r.op == OpKind::Acquire && r.invoke_us <= middle && middle <= r.complete_us)
        {
            return Some(Finding {
                check: "progress",
                excerpt: format!(
                    "no acquire succeeded for {} ms while client {} waited (its acquire {} from {} to {} µs)",
                    (b - a) / 1000,
                    waiter.client,
                    waiter.outcome.as_str(),
                    waiter.invoke_us,
                    waiter.complete_us
                ),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: &[&str]) -> Vec<LogEntry> {
        lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                LogEntry::parse(&format!("{line}|{i}")).unwrap_or_else(|| panic!("{line}"))
            })
            .collect()
    }

    #[test]
    fn sequential_sections_are_clean() {
        let log = log(&[
            "1|1|read|1|ok",
            "1|1|write|1|ok",
            "2|1|read|2|ok",
            "2|1|write|2|ok",
        ]);
        let judgement = judge(&log, &[], 1);
        assert_eq!(judgement.findings, vec![]);
        assert_eq!(judgement.complete_sections, 2);
    }

    #[test]
    fn an_entry_inside_another_section_is_an_overlap() {
        let log = log(&[
            "1|1|read||ok",
            "2|1|read||ok",
            "1|1|write||ok",
            "2|1|write||ok",
        ]);
        let judgement = judge(&log, &[], 1);
        assert!(judgement.violated("mutual-exclusion"));
        // Unfenced: the older holder's write was accepted after the newer read.
        assert!(judgement.violated("fenced-resource"));
        // Two permits allow it.
        assert!(!judge(&log, &[], 2).violated("mutual-exclusion"));
    }

    #[test]
    fn a_fence_that_refuses_the_stale_write_keeps_the_resource_safe() {
        let log = log(&[
            "1|1|read|5|ok",
            "2|1|read|6|ok",
            "1|1|write|5|refused",
            "2|1|write|6|ok",
        ]);
        let judgement = judge(&log, &[], 1);
        // The sections still overlapped in time ...
        assert!(judgement.violated("mutual-exclusion"));
        // ... but the resource refused the superseded write.
        assert!(!judgement.violated("fenced-resource"));
        assert!(!judgement.violated("fence-order"));
    }

    #[test]
    fn a_section_without_its_write_is_not_guessed_open() {
        let log = log(&["1|1|read||ok", "2|1|read||ok", "2|1|write||ok"]);
        assert_eq!(judge(&log, &[], 1).findings, vec![]);
    }

    #[test]
    fn an_overlap_explained_by_a_pause_is_not_an_unpaused_overlap() {
        // Entries are timed 0, 1, 2, 3 µs.
        let log = log(&[
            "1|1|read||ok",
            "2|1|read||ok",
            "1|1|write||ok",
            "2|1|write||ok",
        ]);
        let none = judge_with_pauses(&log, &[], 1, &[], u64::MAX);
        assert!(none.violated("unpaused-overlap"));
        let pause = Paused {
            client: 1,
            from_us: 1,
            to_us: 2,
        };
        let judged = judge_with_pauses(&log, &[], 1, &[pause], u64::MAX);
        assert!(judged.violated("mutual-exclusion"));
        assert!(!judged.violated("unpaused-overlap"));
    }

    #[test]
    fn three_holders_of_a_two_permit_semaphore_are_over_the_limit() {
        let log = log(&[
            "1|1|read|1|ok",
            "2|1|read|2|ok",
            "3|1|read|3|ok",
            "1|1|write|1|ok",
            "2|1|write|2|ok",
            "3|1|write|3|ok",
        ]);
        assert!(judge(&log, &[], 2).violated("mutual-exclusion"));
        assert!(!judge(&log, &[], 3).violated("mutual-exclusion"));
    }

    #[test]
    fn fences_accepted_out_of_order_are_flagged() {
        let log = log(&["1|1|read|7|ok", "1|1|write|7|ok", "2|1|read|6|ok"]);
        assert!(judge(&log, &[], 1).violated("fence-order"));
    }

    fn record(client: u32, seq: u64, op: OpKind, outcome: Outcome) -> OpRecord {
        OpRecord {
            client,
            seq,
            op,
            invoke_us: 0,
            complete_us: 1,
            outcome,
            fence: None,
            detail: String::new(),
        }
    }

    #[test]
    fn an_overlap_after_the_holders_lease_ran_out_is_no_owner_violation() {
        // Client 1 acquired at 0 and wrote late, after client 2 got in;
        // client 2 acquired at 2 µs, read at 3 µs.
        let log = log(&["1|1|read||ok", "2|1|read||ok", "1|1|write||ok"]);
        let mut history = vec![
            record(1, 1, OpKind::Acquire, Outcome::Ok),
            record(2, 1, OpKind::Acquire, Outcome::Ok),
        ];
        history[0].invoke_us = 0;
        history[1].complete_us = 2;
        // A lease of 1 µs had run out when client 2 was granted: client 1's
        // key may have expired on its own, nothing says anyone removed it.
        let late = judge_with_pauses(&log, &history, 1, &[], 1);
        assert!(late.violated("mutual-exclusion"));
        assert!(!late.violated("unpaused-overlap"));
        // With a lease of 1 s it certainly stood: someone removed it.
        let removed = judge_with_pauses(&log, &history, 1, &[], 1_000_000);
        assert!(removed.violated("unpaused-overlap"));
        // Without the holder's acquire record, nothing is certain.
        let unknown = judge_with_pauses(&log, &history[1..], 1, &[], 1_000_000);
        assert!(!unknown.violated("unpaused-overlap"));
    }

    fn acquire(client: u32, from: u64, to: u64, outcome: Outcome) -> OpRecord {
        let mut r = record(client, 0, OpKind::Acquire, outcome);
        r.invoke_us = from;
        r.complete_us = to;
        r
    }

    #[test]
    fn a_waiter_that_never_gets_in_is_a_progress_violation() {
        // Grants at 1 and 2 s, then client 2 waits from 2 s to the end.
        let history = [
            acquire(1, 900_000, 1_000_000, Outcome::Ok),
            acquire(1, 1_900_000, 2_000_000, Outcome::Ok),
            acquire(2, 2_000_000, 4_000_000, Outcome::Fail),
            acquire(2, 4_000_000, 6_000_000, Outcome::Fail),
        ];
        let found = progress(&history, 0, 6_000_000, 3_000_000).expect("a stall");
        assert_eq!(found.check, "progress");
        // A longer patience, or a grant in the gap, and it is no violation.
        assert!(progress(&history, 0, 6_000_000, 4_500_000).is_none());
        let mut granted = history.to_vec();
        granted.push(acquire(3, 3_900_000, 4_000_000, Outcome::Ok));
        assert!(progress(&granted, 0, 6_000_000, 3_000_000).is_none());
        // A gap nobody waited in is no violation either.
        assert!(progress(&history[..2], 0, 6_000_000, 3_000_000).is_none());
    }

    #[test]
    fn a_write_that_timed_out_does_not_certainly_close_its_section() {
        // Client 1's write is logged after client 2's read, but client 1
        // saw it time out: it may have run after client 1 released.
        let log = log(&["1|1|read||ok", "2|1|read||ok", "1|1|write||ok"]);
        let timed_out = [record(1, 1, OpKind::Write, Outcome::Indeterminate)];
        let judged = judge(&log, &timed_out, 1);
        assert!(!judged.violated("mutual-exclusion"));
        // The resource still accepted it after the successor's read.
        assert!(judged.violated("fenced-resource"));
    }

    #[test]
    fn a_read_that_timed_out_is_no_certain_entry() {
        // Client 2's read ran inside client 1's section, but client 2 saw
        // it time out: it may have run after client 2 gave up.
        let log = log(&["1|1|read||ok", "2|1|read||ok", "1|1|write||ok"]);
        assert!(judge(&log, &[], 1).violated("mutual-exclusion"));
        let timed_out = [record(2, 1, OpKind::Read, Outcome::Indeterminate)];
        assert!(!judge(&log, &timed_out, 1).violated("mutual-exclusion"));
        let answered = [record(2, 1, OpKind::Read, Outcome::Ok)];
        assert!(judge(&log, &answered, 1).violated("mutual-exclusion"));
    }

    #[test]
    fn lost_and_duplicated_accesses_are_flagged() {
        let twice = log(&["1|1|read||ok", "1|1|read||ok"]);
        assert!(judge(&twice, &[], 1).violated("lost-or-duplicated"));
        let one = log(&["1|1|read||ok"]);
        let lost = [record(1, 1, OpKind::Write, Outcome::Ok)];
        assert!(judge(&one, &lost, 1).violated("lost-or-duplicated"));
        let unknown = [record(1, 1, OpKind::Write, Outcome::Indeterminate)];
        assert!(!judge(&one, &unknown, 1).violated("lost-or-duplicated"));
        let refused = [record(1, 1, OpKind::Read, Outcome::Fail)];
        assert!(judge(&one, &refused, 1).violated("lost-or-duplicated"));
        let never_sent = [record(1, 1, OpKind::Write, Outcome::Fail)];
        assert!(!judge(&one, &never_sent, 1).violated("lost-or-duplicated"));
    }

    #[test]
    fn a_pause_between_the_acquire_and_the_read_explains_the_overlap() {
        // Client 1 acquired at 0 µs, was paused from 1 to 2 µs, and read
        // only at 500 ms, long after its lease ran out: client 2, not
        // paused, got in meanwhile. The pause explains the overlap although
        // it ended before client 1's section began.
        let mut log = log(&[
            "2|1|read||ok",
            "1|1|read||ok",
            "2|1|write||ok",
            "1|1|write||ok",
        ]);
        for (i, entry) in log.iter_mut().enumerate() {
            entry.at_us = 500_000 + i as u64;
        }
        let mut acquire = record(1, 1, OpKind::Acquire, Outcome::Ok);
        acquire.invoke_us = 0;
        let pause = Paused {
            client: 1,
            from_us: 1,
            to_us: 2,
        };
        let judged = judge_with_pauses(&log, &[acquire.clone()], 1, &[pause], u64::MAX);
        assert!(judged.violated("mutual-exclusion"));
        assert!(!judged.violated("unpaused-overlap"));
        // Without the pause both sections are unpaused.
        assert!(judge_with_pauses(&log, &[acquire], 1, &[], u64::MAX).violated("unpaused-overlap"));
    }

    #[test]
    fn a_resource_that_accepts_an_older_fence_is_caught() {
        // The superseded holder's write (fence 5) accepted after its
        // successor's read (fence 6): a broken resource.
        let log = log(&[
            "1|1|read|5|ok",
            "2|1|read|6|ok",
            "1|1|write|5|ok",
            "2|1|write|6|ok",
        ]);
        let judgement = judge(&log, &[], 1);
        assert!(judgement.violated("fence-order"));
        assert!(judgement.violated("fenced-resource"));
        // An indeterminate write that did land is judged from the log.
        let unknown = [record(1, 1, OpKind::Write, Outcome::Indeterminate)];
        assert!(judge(&log, &unknown, 1).violated("fenced-resource"));
        // A refused read opens no accepted access: the holder it would
        // have superseded may still write.
        let refused = log_of_refused_read();
        assert!(!judge(&refused, &[], 1).violated("fenced-resource"));
    }

    fn log_of_refused_read() -> Vec<LogEntry> {
        log(&["1|1|read|6|ok", "2|1|read|5|refused", "1|1|write|6|ok"])
    }
}
