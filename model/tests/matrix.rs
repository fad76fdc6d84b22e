//! The verdict matrix as tests: every (protocol, fault, property) cell is
//! computed by the checker and compared with `model/expectations.txt`; a
//! differing cell fails with its counterexample printed.

use lockwright_core::ProtocolId;
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::trace;

fn check_protocol(protocol: ProtocolId) {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS).expect("expectations parse");
    let mut failures = Vec::new();
    for fault in Fault::ALL {
        // The model's own invariants are checked in the same run: no run
        // stops before the horizon, no message outlives its deadline.
        let mut model = matrix::model_for(protocol, fault, PropertyId::ALL.to_vec()).unwrap();
        model.sanity = true;
        let run = matrix::check_model(model.clone(), 1, false);
        for (name, trace) in &run.broken {
            failures.push(format!(
                "{protocol} {fault}: the model's invariant \"{name}\" fails:\n{}",
                trace::text(&model, trace)
            ));
        }
        for cell in &run.cells {
            let rule =
                matrix::expected(&rules, protocol, fault, cell.property).unwrap_or_else(|| {
                    panic!("no expectation covers {protocol} {fault} {}", cell.property)
                });
            if rule.verdict != cell.verdict {
                let model = matrix::model_for(protocol, fault, PropertyId::ALL.to_vec()).unwrap();
                let shown = match &cell.trace {
                    Some(t) => trace::text(&model, t),
                    None => {
                        "(no counterexample: the property held in every reachable state)\n".into()
                    }
                };
                failures.push(format!(
                    "{protocol} {fault} {}: checker says {}, expectations.txt line {} says {} ({})\n{shown}",
                    cell.property, cell.verdict, rule.line, rule.verdict, rule.reason
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cell(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! matrix_rows {
    ($($name:ident => $id:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_protocol(ProtocolId::$id);
            }
        )*
    };
}

matrix_rows! {
    setnx_del_row_matches_the_expectations => SetnxDel,
    setnx_expire_row_matches_the_expectations => SetnxExpire,
    setnx_getset_row_matches_the_expectations => SetnxGetset,
    set_px_get_del_row_matches_the_expectations => SetPxGetDel,
    set_px_watch_row_matches_the_expectations => SetPxWatch,
    set_px_lua_row_matches_the_expectations => SetPxLua,
    reentrant_row_matches_the_expectations => Reentrant,
    redlock_row_matches_the_expectations => Redlock,
    fenced_row_matches_the_expectations => Fenced,
    time_fenced_row_matches_the_expectations => TimeFenced,
    zset_semaphore_row_matches_the_expectations => ZsetSemaphore,
    fair_semaphore_row_matches_the_expectations => FairSemaphore,
    fair_semaphore_locked_row_matches_the_expectations => FairSemaphoreLocked,
    watch_semaphore_row_matches_the_expectations => WatchSemaphore,
    lease_semaphore_row_matches_the_expectations => LeaseSemaphore,
}

/// Unique states of every protocol without faults, pinned so that an
/// accidental change to the model (or to a machine) shows up here.
#[test]
fn unique_state_counts_without_faults_are_pinned() {
    let pinned: [(ProtocolId, usize); 15] = PINNED;
    let mut actual = Vec::new();
    for (protocol, _) in pinned {
        let run = matrix::check(protocol, Fault::None, 1, false).unwrap();
        actual.push((protocol, run.states));
    }
    assert_eq!(
        actual, pinned,
        "state counts changed: update PINNED only if the change is intended"
    );
}

const PINNED: [(ProtocolId, usize); 15] = [
    (ProtocolId::SetnxDel, 2123),
    (ProtocolId::SetnxExpire, 10229),
    (ProtocolId::SetnxGetset, 1103),
    (ProtocolId::SetPxGetDel, 1961),
    (ProtocolId::SetPxWatch, 4213),
    (ProtocolId::SetPxLua, 1005),
    (ProtocolId::Reentrant, 17621),
    (ProtocolId::Redlock, 80939),
    (ProtocolId::Fenced, 17621),
    (ProtocolId::ZsetSemaphore, 465),
    (ProtocolId::FairSemaphore, 1019),
    (ProtocolId::FairSemaphoreLocked, 2191),
    (ProtocolId::WatchSemaphore, 4714),
    (ProtocolId::LeaseSemaphore, 16521),
    (ProtocolId::TimeFenced, 18067),
];

#[test]
fn every_rule_has_a_reason_and_a_source_and_every_cell_is_covered() {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS).unwrap();
    for rule in &rules {
        assert!(!rule.source.is_empty(), "line {} has no source", rule.line);
    }
    for p in ProtocolId::all() {
        for f in Fault::ALL {
            for prop in PropertyId::ALL {
                assert!(matrix::expected(&rules, p, f, prop).is_some());
            }
        }
    }
}

#[test]
fn malformed_expectations_are_typed_errors() {
    assert!(matrix::parse_expectations("* * * maybe | r | s").is_err());
    assert!(matrix::parse_expectations("nope * * holds | r | s").is_err());
    assert!(matrix::parse_expectations("* * holds | r | s").is_err());
    assert!(matrix::parse_expectations("* * * holds |  | s").is_err());
}

#[test]
fn the_reported_counterexample_is_the_shortest() {
    // set-px-lua under pause: the shortest violation of mutual exclusion.
    let model = matrix::model_for(
        ProtocolId::SetPxLua,
        Fault::Pause,
        vec![PropertyId::MutualExclusion],
    )
    .unwrap();
    let run = matrix::check(ProtocolId::SetPxLua, Fault::Pause, 1, true).unwrap();
    let cell = run
        .cells
        .iter()
        .find(|c| c.property == PropertyId::MutualExclusion)
        .unwrap();
    assert_eq!(cell.verdict, Verdict::Violated);
    let t = cell.trace.as_ref().unwrap();
    // Nothing shorter exists: searching with one step less finds nothing.
    assert!(matrix::shortest_trace(&model, PropertyId::MutualExclusion, t.len() - 1).is_none());
    // And the violation is really in the last state.
    assert!(!model.holds_in(PropertyId::MutualExclusion, &t.last().unwrap().0));
    assert!(model.holds_in(PropertyId::MutualExclusion, &t[t.len() - 2].0));
}
