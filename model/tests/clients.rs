//! The client bound, tested: every run of the standard bounds with fewer
//! than three clients (every protocol but the two of [`standard_clients`],
//! and the progress runs of those two, [`PROGRESS_CLIENTS`]) is rerun with
//! a third client, and every verdict must stay the same. A third client
//! multiplies a run's states many times over, so each three-client run is
//! stopped after a cap of generated states; a run that stops at the cap is
//! compared only where it already found a violation (a violation is
//! definite; a `holds` needs the whole space), and the properties it could
//! not decide are listed. `LOCKWRIGHT_CLIENTS_CAP=N` sets the cap (`0`:
//! none, the whole comparison, hours in release on 2 cores).
//!
//! A cell that differs and whose three-client space is beyond the budget
//! is listed in `matrix::BOUND_GAPS` (shown in the docs beside its
//! `holds`); none is now. The last two, `lease-semaphore` and
//! `time-fenced-semaphore` under `delay` (mutual exclusion), came from
//! their undo of an unanswered acquire, which the protocols no longer
//! send. This test fails when a listed gap is decided and does not show;
//! a capped run that finds no violation decides nothing, and the run uses
//! two checker threads, so whether a violation near the cap is found can
//! vary between runs (a violation found is always a real one).
//!
//! The comparison can fail: `set-px-get-del` with two clients for its
//! safety properties instead of three differs under `none`, and a test
//! below requires the comparison to say so.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

mod capped;

use lockwright_core::ProtocolId;
use lockwright_model::cache::Cache;
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::model::{standard_clients, ModelConfig, Mutation, PROGRESS_CLIENTS};

/// Generated states after which a three-client run stops unless
/// `LOCKWRIGHT_CLIENTS_CAP` says otherwise.
const DEFAULT_CAP: usize = 400_000;

fn cap() -> Option<usize> {
    capped::cap("LOCKWRIGHT_CLIENTS_CAP", DEFAULT_CAP)
}

/// One run's verdict on each of `properties` (see [`capped::verdicts`]),
/// without the model's own invariants.
fn verdicts(
    cfg: ModelConfig,
    properties: Vec<PropertyId>,
    cap: Option<usize>,
) -> Vec<(PropertyId, Option<Verdict>)> {
    capped::verdicts(cfg, properties, cap, false).0
}

/// The cells of `protocol` under `fault` where a third client gives
/// another verdict than the standard run, the properties the three-client
/// runs could not decide, and how many they decided.
fn compare(
    protocol: ProtocolId,
    fault: Fault,
    cap: Option<usize>,
    cache: &Cache,
) -> (Vec<String>, Vec<PropertyId>, usize) {
    let standard = matrix::standard_run(protocol, fault, Some(cache)).expect("model configures");
    let mut differ = Vec::new();
    let mut undecided = Vec::new();
    let mut decided = 0;
    for group in matrix::standard_groups(protocol) {
        let mut cfg = ModelConfig::for_properties(protocol, fault, &group);
        if cfg.clients >= 3 {
            continue;
        }
        let before = cfg.clients;
        cfg.clients = 3;
        for (p, wide) in verdicts(cfg, group, cap) {
            let narrow = capped::standard_verdict(&standard, p);
            match wide {
                None => undecided.push(p),
                Some(wide) => {
                    decided += 1;
                    if wide != narrow {
                        differ.push(format!(
                            "{protocol} {fault} {p}: {narrow} with {before} clients, {wide} with 3"
                        ));
                    }
                }
            }
        }
    }
    (differ, undecided, decided)
}

#[test]
fn a_third_client_changes_no_verdict_of_the_runs_with_two() {
    let cap = cap();
    let cache = capped::cache();
    println!(
        "three-client runs capped at {}; progress is checked with {PROGRESS_CLIENTS} clients",
        cap.map_or("no limit".to_owned(), |c| format!("{c} generated states"))
    );
    let (mut differ, mut known, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    let (mut compared, mut partial) = (0, Vec::new());
    for protocol in ProtocolId::all() {
        for fault in Fault::ALL {
            let (d, undecided, decided) = compare(protocol, fault, cap, &cache);
            for line in &d {
                println!("differs: {line}");
            }
            for &(p, f, q, _) in matrix::BOUND_GAPS {
                if (p, f) == (protocol, fault) && !undecided.contains(&q) {
                    let gap = format!("{p} {f} {q}: holds with 2 clients, violated with 3");
                    if d.contains(&gap) {
                        known.push(gap);
                    } else {
                        gone.push(gap);
                    }
                }
            }
            differ.extend(d.into_iter().filter(|g| !known.contains(g)));
            compared += decided;
            if !undecided.is_empty() {
                let names: Vec<&str> = undecided.iter().map(|p| p.as_str()).collect();
                partial.push(format!("{protocol} {fault} ({})", names.join(", ")));
            }
        }
    }
    println!(
        "{compared} cells compared with a third client; {} (protocol, fault) runs stopped at the \
         cap before deciding: {}",
        partial.len(),
        if partial.is_empty() {
            "none".to_owned()
        } else {
            partial.join("; ")
        }
    );
    println!(
        "known gaps of the bounds (matrix::BOUND_GAPS) that showed: {}",
        if known.is_empty() {
            "none".to_owned()
        } else {
            known.join("; ")
        }
    );
    assert!(
        gone.is_empty(),
        "a known gap of the bounds no longer shows; drop it from matrix::BOUND_GAPS:\n{}",
        gone.join("\n")
    );
    assert!(
        differ.is_empty(),
        "a third client changes {} verdict(s); widen standard_clients or, where that is \
         beyond the budget, list the cell in matrix::BOUND_GAPS:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// The mutation: two clients where the standard bounds have three. The
/// comparison must catch what two clients miss in `set-px-get-del` (a late
/// `DEL` removes a successor's key, and only a third client can enter).
#[test]
fn the_comparison_catches_the_verdicts_two_clients_miss() {
    assert_eq!(standard_clients(ProtocolId::SetPxGetDel), 3);
    let safety: Vec<PropertyId> = PropertyId::ALL
        .into_iter()
        .filter(|&p| p != PropertyId::Progress)
        .collect();
    let at = |clients| {
        let mut cfg = ModelConfig::new(ProtocolId::SetPxGetDel, Fault::None);
        cfg.clients = clients;
        verdicts(cfg, safety.clone(), None)
    };
    let (two, three) = (at(2), at(3));
    let differ: Vec<String> = two
        .iter()
        .zip(&three)
        .filter(|(a, b)| a.1 != b.1)
        .map(|((p, a), (_, b))| format!("{p}: {a:?} with 2 clients, {b:?} with 3"))
        .collect();
    assert_eq!(
        differ,
        [
            "mutual-exclusion: Some(Holds) with 2 clients, Some(Violated) with 3",
            "fenced-resource: Some(Holds) with 2 clients, Some(Violated) with 3",
        ]
    );
}

/// The two cells that were once the bounds' gaps, decided with a third
/// client over their whole state spaces: `lease-semaphore` and
/// `time-fenced-semaphore` under `delay` hold every property now that they
/// no longer undo an unanswered acquire (28.4 and 41.9 million states,
/// about 10 minutes and 5–7 GB each in release on 2 cores, hence opt-in:
/// `cargo test --release -p lockwright-model --test clients -- --ignored`).
/// Those figures are of the 32 s horizon, which this test keeps: with the
/// standard progress run's margin under `delay` (42 s,
/// `ModelConfig::obstruction`) the three-client spaces are larger, by how
/// much is not measured.
/// With the old undo the capped comparison above found mutual exclusion
/// violated in both.
#[test]
#[ignore = "about 20 minutes and up to 7 GB in release"]
fn the_lease_semaphores_hold_under_delay_with_a_third_client() {
    for protocol in [ProtocolId::LeaseSemaphore, ProtocolId::TimeFencedSemaphore] {
        let mut cfg = ModelConfig::new(protocol, Fault::Delay);
        cfg.clients = 3;
        cfg.horizon -= ModelConfig::obstruction(Fault::Delay, cfg.ttl);
        for (p, verdict) in verdicts(cfg, PropertyId::ALL.to_vec(), None) {
            assert_eq!(
                verdict,
                Some(Verdict::Holds),
                "{protocol} delay {p} with three clients"
            );
        }
    }
}

/// RedLock's late undo, which the standard bounds cannot show: a client
/// whose undo round got no reply from a master retried under the same
/// token, the held-up undo then deleted the key its retry was granted on
/// that master, and a third client took the lock beside it. It takes three
/// clients (one holds while the first fails and undoes, the third enters
/// after the late undo); with three clients on three masters the space is
/// beyond the budget, so the run puts RedLock on one master, where the
/// same late undo takes the holder's only key. The old machine
/// (`Mutation::RedlockRetriesUnderOneToken`) violates mutual exclusion and
/// fenced-resource there, the machine as it is (a new token after an
/// unanswered undo round) holds every property over the whole space
/// (11.7 million states at the horizon of a progress run under `delay`).
/// At the standard bounds (two clients, three masters) the old machine
/// holds every property: that run cannot see the mutation.
#[test]
fn a_late_redlock_undo_is_caught_with_a_third_client() {
    let mut cfg = ModelConfig::new(ProtocolId::Redlock, Fault::Delay);
    cfg.clients = 3;
    cfg.nodes = 1;
    mutant_caught_machine_holds(cfg, Mutation::RedlockRetriesUnderOneToken);
}

/// `mutation` of `cfg`'s protocol violates mutual exclusion and
/// fenced-resource in `cfg`'s whole space; the machine as it is holds
/// every property there. The mutant's run checks those two properties
/// only, so that it stops once it has found both.
fn mutant_caught_machine_holds(cfg: ModelConfig, mutation: Mutation) {
    let protocol = cfg.protocol;
    let mut mutant = cfg.clone();
    mutant.mutation = Some(mutation);
    let caught = [PropertyId::MutualExclusion, PropertyId::FencedResource];
    let mutant = verdicts(mutant, caught.to_vec(), None);
    for p in caught {
        let verdict = mutant.iter().find(|(q, _)| *q == p).and_then(|(_, v)| *v);
        assert_eq!(verdict, Some(Verdict::Violated), "{mutation:?}, {p}");
    }
    for (p, v) in verdicts(cfg, PropertyId::ALL.to_vec(), None) {
        assert_eq!(v, Some(Verdict::Holds), "{protocol}, three clients, {p}");
    }
}

/// The same late undo in `watch-semaphore`, found by a full three-client
/// check of its `delay` cell (86 million states, 11 minutes in release):
/// an acquire whose request was lost is undone with `SREM` of its token,
/// the `SREM` is held up, the retry under the same token is granted, the
/// late `SREM` removes that permit and the third client is admitted beside
/// the holder. The standard two-client run and the capped comparison above
/// do not see it. The machine now takes a new token after a release or
/// undo without a reply (`token.1`, ...). Cut at 6.5 s of true time the
/// space is small enough for every run (about 4 million states): the old
/// machine (`Mutation::WatchSemaphoreRetriesUnderOneToken`) violates
/// mutual exclusion and fenced-resource there, the machine as it is holds
/// every property.
#[test]
fn a_late_watch_semaphore_undo_is_caught_with_a_third_client() {
    let mut cfg = ModelConfig::new(ProtocolId::WatchSemaphore, Fault::Delay);
    cfg.clients = 3;
    cfg.horizon = 6_500;
    mutant_caught_machine_holds(cfg, Mutation::WatchSemaphoreRetriesUnderOneToken);
}
