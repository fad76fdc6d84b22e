//! The combined results table: the rows every scenario saved on its last
//! run (under the target directory), one table for the whole suite.
//!
//! Cargo runs the test files in name order, so within one `cargo test -p
//! lockwright-chaos` the scenarios named after `results` still show their
//! previous run here; `chaos/ci.sh` prints this table again once the whole
//! suite has run. Every row must agree with the model.

mod common;

use lockwright_chaos::report;

#[test]
fn every_scenario_agrees_with_the_model() {
    let rows = report::load(&common::results_dir()).expect("the saved rows");
    if rows.is_empty() {
        eprintln!("no scenario has saved results yet (they skip without Docker)");
        return;
    }
    eprintln!(
        "\nChaos results: {} rows from {}\n{}",
        rows.len(),
        common::results_dir().display(),
        report::table(&rows)
    );
    let mismatches: Vec<_> = rows.iter().filter(|row| !row.agrees()).collect();
    assert!(
        mismatches.is_empty(),
        "observed differs from the model: {mismatches:?}"
    );
}
