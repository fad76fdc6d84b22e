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
        let run = pairs::pair_run(p, pair, 2, None).unwrap();
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
    // Nine faulty columns, less the one pair of two restarts.
    assert_eq!(FaultPair::of_columns().len(), 9 * 8 / 2 - 1);
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
