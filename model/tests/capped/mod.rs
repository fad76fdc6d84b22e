//! Runs stopped at a cap of generated states, shared by the tests that
//! rerun the standard bounds wider (`clients.rs`, `nodes.rs`).

use lockwright_model::cache::Cache;
use lockwright_model::fault::PropertyId;
use lockwright_model::matrix::{self, Run, Verdict};
use lockwright_model::model::{LockModel, ModelConfig};
use stateright::{Checker, Model};
use std::path::Path;

/// The cap in the environment variable `var` (`0`: none), else `default`.
pub(crate) fn cap(var: &str, default: usize) -> Option<usize> {
    match std::env::var(var) {
        Ok(v) => match v.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => panic!("{var}={v:?} is not a number of states"),
        },
        Err(_) => Some(default),
    }
}

/// One run's verdict on each of `properties`: `None` for a property it
/// could not decide (no violation found, and the run stopped at the cap);
/// and the run's unique states. With `sanity` and `progress` among
/// `properties` the model's own invariants are checked too, as in the
/// standard run, and must hold.
pub(crate) fn verdicts(
    cfg: ModelConfig,
    properties: Vec<PropertyId>,
    cap: Option<usize>,
    sanity: bool,
) -> (Vec<(PropertyId, Option<Verdict>)>, usize) {
    let mut model = LockModel::new(cfg, properties.clone()).expect("model configures");
    model.sanity = sanity && matrix::checks_invariants(&properties);
    let sanity = model.sanity;
    let mut checker = model.checker().threads(2);
    if let Some(cap) = cap {
        checker = checker.target_state_count(cap);
    }
    let checker = checker.spawn_bfs().join();
    // Stopped by the cap, a run has generated at least `cap` states (the
    // checker looks at the count after each block of states); below it,
    // it has covered its whole space.
    let complete = cap.is_none_or(|cap| checker.state_count() < cap);
    for invariant in ["time passes", "deadlines kept"] {
        assert!(
            !sanity || checker.discovery(invariant).is_none(),
            "the model's own invariant {invariant:?} breaks on these bounds"
        );
    }
    let verdicts = properties
        .into_iter()
        .map(|p| {
            let verdict = match checker.discovery(p.as_str()) {
                Some(_) => Some(Verdict::Violated),
                None if complete => Some(Verdict::Holds),
                None => None,
            };
            (p, verdict)
        })
        .collect();
    (verdicts, checker.unique_state_count())
}

/// The verdict of the standard run `run` on property `p`.
pub(crate) fn standard_verdict(run: &Run, p: PropertyId) -> Verdict {
    run.cells
        .iter()
        .find(|c| c.property == p)
        .expect("the standard run has every property")
        .verdict
}

/// The cache of standard runs that the matrix test and CI's main job fill.
pub(crate) fn cache() -> Cache {
    Cache::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("matrix-cache"))
}
