//! Fault pairs: a pair's run can do what either fault alone can, and the
//! second fault really acts.

use lockwright_core::ProtocolId;
use lockwright_model::fault::{Fault, FaultPair, PairError, PropertyId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::pairs::{self, PairCell};

fn verdict(run: &matrix::Run, p: PropertyId) -> Verdict {
    run.cells
        .iter()
        .find(|c| c.property == p)
        .map(|c| c.verdict)
        .expect("every property is checked")
}

/// `set-px-lua` keeps mutual exclusion under `crash` and loses it under
/// `restart`; under the pair it is lost whichever fault comes first in the
/// pair's name (the second fault's budget is its own), and every property
/// violated alone is violated under the pair.
#[test]
fn a_pair_loses_what_either_fault_loses_alone() {
    let p = ProtocolId::SetPxLua;
    let crash = matrix::check(p, Fault::Crash, 2, false).unwrap();
    let restart = matrix::check(p, Fault::Restart, 2, false).unwrap();
    assert_eq!(verdict(&crash, PropertyId::MutualExclusion), Verdict::Holds);
    assert_eq!(
        verdict(&restart, PropertyId::MutualExclusion),
        Verdict::Violated
    );
    for (a, b, first, second) in [
        (Fault::Crash, Fault::Restart, &crash, &restart),
        (Fault::Restart, Fault::Crash, &restart, &crash),
    ] {
        let pair = FaultPair::new(a, b).unwrap();
        let run = pairs::pair_run(p, pair, 2, false, None).unwrap();
        let cells = PairCell::new(pair, &run, first, second);
        assert_eq!(
            verdict(&run, PropertyId::MutualExclusion),
            Verdict::Violated,
            "{pair}"
        );
        assert!(
            cells.iter().all(|c| !c.contradicts_superset()),
            "{pair}: {cells:?}"
        );
        // Both faults act: more states than either alone.
        assert!(run.states > first.states.max(second.states), "{pair}");
    }
}

/// Both faults of a pair act in one run, each once: after `c0` crashes the
/// node may still restart, and after both neither may act again (in either
/// order of the pair's name).
#[test]
fn each_fault_of_a_pair_acts_once_in_the_same_run() {
    use lockwright_model::Action;
    for (a, b) in [
        (Fault::Crash, Fault::Restart),
        (Fault::Restart, Fault::Crash),
    ] {
        let pair = FaultPair::new(a, b).unwrap();
        let model =
            pairs::pair_model(ProtocolId::SetPxLua, pair, PropertyId::ALL.to_vec()).unwrap();
        let enabled = |s: &lockwright_model::State| {
            let mut actions = Vec::new();
            model.enabled(s, &mut actions);
            actions
        };
        let faults = |s: &lockwright_model::State| -> Vec<Action> {
            enabled(s)
                .into_iter()
                .filter(|a| matches!(a, Action::Crash(_) | Action::Restart(_)))
                .collect()
        };
        let start = model.initial();
        assert_eq!(
            faults(&start),
            vec![Action::Crash(0), Action::Restart(0)],
            "{pair}"
        );
        let crashed = model.step(&start, &Action::Crash(0)).unwrap();
        assert_eq!(faults(&crashed), vec![Action::Restart(0)], "{pair}");
        let both = model.step(&crashed, &Action::Restart(0)).unwrap();
        assert_eq!(faults(&both), vec![], "{pair}");
        let restarted = model.step(&start, &Action::Restart(0)).unwrap();
        assert_eq!(faults(&restarted), vec![Action::Crash(0)], "{pair}");
    }
}

/// Which nodes a pair's node faults may strike in RedLock's three: node 0
/// alone while one node fault is in the run (the nodes are alike), any
/// node with two (they differ once one has struck; a failover's replica
/// makes node 0 differ from the start).
#[test]
fn two_node_faults_may_strike_any_node() {
    use lockwright_model::Action;
    let struck = |a: Fault, b: Fault| -> Vec<Action> {
        let pair = FaultPair::new(a, b).unwrap();
        let model = pairs::pair_model(ProtocolId::Redlock, pair, vec![PropertyId::MutualExclusion])
            .unwrap();
        let mut actions = Vec::new();
        model.enabled(&model.initial(), &mut actions);
        actions
            .into_iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Restart(_)
                        | Action::Cut(_)
                        | Action::CutLink { .. }
                        | Action::JumpClock(_)
                )
            })
            .collect()
    };
    assert_eq!(
        struck(Fault::Pause, Fault::Restart),
        vec![Action::Restart(0)]
    );
    assert_eq!(struck(Fault::Crash, Fault::Partition), vec![Action::Cut(0)]);
    assert_eq!(
        struck(Fault::ClockJump, Fault::Partition),
        vec![
            Action::JumpClock(0),
            Action::Cut(0),
            Action::JumpClock(1),
            Action::Cut(1),
            Action::JumpClock(2),
            Action::Cut(2),
        ]
    );
    // A client's cut from a node is a node fault and a client-level one:
    // beside a pause (two client-level faults) it strikes any client, on
    // node 0; beside another node fault, client 0 on any node.
    assert_eq!(
        struck(Fault::Pause, Fault::ClientPartition),
        vec![
            Action::CutLink { client: 0, node: 0 },
            Action::CutLink { client: 1, node: 0 }
        ]
    );
    assert_eq!(
        struck(Fault::ClockJump, Fault::ClientPartition),
        (0..3)
            .flat_map(|node| [Action::JumpClock(node), Action::CutLink { client: 0, node }])
            .collect::<Vec<_>>()
    );
    assert_eq!(
        struck(Fault::Failover, Fault::Restart),
        vec![Action::Restart(0), Action::Restart(1), Action::Restart(2)]
    );
}

/// Each fault of a pair acts once: a pair of two faults of the same kind
/// of step is refused, and so are `none` and a fault twice, each with its
/// own error.
#[test]
fn pairs_are_parsed_and_refused_with_their_reason() {
    let ok: FaultPair = "pause+restart".parse().unwrap();
    assert_eq!((ok.first(), ok.second()), (Fault::Pause, Fault::Restart));
    assert_eq!(ok.to_string(), "pause+restart");
    assert!(matches!(
        "pause".parse::<FaultPair>(),
        Err(PairError::NotAPair(_))
    ));
    assert!(matches!(
        "pause+nap".parse::<FaultPair>(),
        Err(PairError::Unknown(_))
    ));
    assert!(matches!(
        "none+pause".parse::<FaultPair>(),
        Err(PairError::WithNone(_))
    ));
    assert!(matches!(
        "pause+pause".parse::<FaultPair>(),
        Err(PairError::Twice(_))
    ));
    assert!(matches!(
        "restart+clock-back".parse::<FaultPair>(),
        Err(PairError::SameStep(..))
    ));
    // Eleven faulty columns, less the pair of two restarts and the pair of
    // two cuts.
    assert_eq!(FaultPair::of_columns().len(), 11 * 10 / 2 - 2);
}

/// A single fault's run is the standard run: `also` is `None` and the
/// budget bit of the one fault is bit 0, so nothing of a single run
/// changes (the pinned state counts in `matrix.rs` say the same).
#[test]
fn a_single_fault_run_has_no_second_fault() {
    let cfg = lockwright_model::ModelConfig::new(ProtocolId::Fenced, Fault::Pause);
    assert_eq!(cfg.also, None);
    assert!(cfg.has(Fault::Pause) && !cfg.has(Fault::Crash));
}

/// `docs/pairs.md` is the checker's output, not a hand-kept table: every
/// `set-px-lua` cell in it is computed again here and must name the same
/// violated properties and the same `*` marks. (The other columns are
/// costlier; the doc says which sources computed them.)
#[test]
fn the_pairs_doc_matches_the_checker_for_set_px_lua() {
    let doc = include_str!("../../docs/pairs.md");
    let mut lines = doc.lines().skip_while(|l| !l.starts_with("| pair |"));
    let header: Vec<&str> = lines
        .next()
        .expect("the pairs table")
        .split('|')
        .map(str::trim)
        .collect();
    let column = header
        .iter()
        .position(|h| *h == "`set-px-lua`")
        .expect("a set-px-lua column");
    let p = ProtocolId::SetPxLua;
    let mut rows = 0;
    // Each fault alone is checked once, not once per pair it is half of.
    let mut singles = std::collections::BTreeMap::new();
    let mut single = |f: Fault| -> matrix::Run {
        singles
            .entry(f)
            .or_insert_with(|| matrix::check(p, f, 2, false).expect("checks"))
            .clone()
    };
    for line in lines.skip(1).take_while(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let pair: FaultPair = cells[1].trim_matches('`').parse().expect("a pair");
        let mut in_doc: Vec<&str> = cells[column].split_whitespace().collect();
        in_doc.retain(|c| *c != "ok");
        in_doc.sort_unstable();
        let run = pairs::pair_run(p, pair, 2, false, None).expect("checks");
        let (first, second) = (single(pair.first()), single(pair.second()));
        let mut computed: Vec<String> = PairCell::new(pair, &run, &first, &second)
            .iter()
            .filter(|c| c.verdict == Verdict::Violated)
            .map(|c| {
                format!(
                    "{}{}",
                    lockwright_model::docs::short(c.property),
                    if c.only_with_both() { "*" } else { "" }
                )
            })
            .collect();
        computed.sort_unstable();
        assert_eq!(
            in_doc, computed,
            "{p} under {pair}: docs/pairs.md against the checker"
        );
        rows += 1;
    }
    assert_eq!(
        rows,
        FaultPair::of_columns().len(),
        "one row per pair of columns"
    );
}
