//! The cache of checked cells gives what the checker computes, and nothing
//! else: a cell read back equals a fresh computation, and files of another
//! source version, damaged files and traces that do not replay are
//! rejected with a typed error and computed again.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use lockwright_core::ProtocolId;
use lockwright_model::cache::{Cache, CacheError};
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Run};
use lockwright_model::LockModel;
use std::path::{Path, PathBuf};

const PROTOCOL: ProtocolId = ProtocolId::SetPxLua;
const FAULT: Fault = Fault::Pause;

/// A directory of this test's own, empty.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cache-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The model of the standard run.
fn model() -> LockModel {
    let mut model = matrix::model_for(PROTOCOL, FAULT, PropertyId::ALL.to_vec()).unwrap();
    model.sanity = true;
    model
}

/// Everything a run reports except how long it took and where it came from.
fn assert_same(a: &Run, b: &Run) {
    assert_eq!(a.states, b.states);
    assert_eq!(a.generated, b.generated);
    assert_eq!(a.cells.len(), b.cells.len());
    for (x, y) in a.cells.iter().zip(&b.cells) {
        assert_eq!(
            (x.protocol, x.fault, x.property, x.verdict, x.states),
            (y.protocol, y.fault, y.property, y.verdict, y.states)
        );
        assert_eq!(x.trace, y.trace, "{}", x.property);
    }
    assert_eq!(a.broken, b.broken);
}

#[test]
fn a_cached_cell_equals_a_fresh_computation() {
    let dir = fresh_dir("equal");
    let fresh = matrix::standard_run(PROTOCOL, FAULT, None).unwrap();
    assert!(!fresh.cached);
    assert!(
        fresh.cells.iter().any(|c| c.trace.is_some()),
        "the cell has a counterexample to store"
    );
    let cache = Cache::new(&dir);
    let first = matrix::standard_run(PROTOCOL, FAULT, Some(&cache)).unwrap();
    assert!(!first.cached);
    let second = matrix::standard_run(PROTOCOL, FAULT, Some(&cache)).unwrap();
    assert!(second.cached);
    assert_same(&fresh, &first);
    assert_same(&fresh, &second);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.computed), (1, 1));
    assert!(stats.rejected.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_of_another_source_version_is_ignored() {
    let dir = fresh_dir("other-sources");
    let model = model();
    let fresh = matrix::standard_run(PROTOCOL, FAULT, None).unwrap();
    // A file of other sources, with other verdicts.
    let mut wrong = fresh.clone();
    for c in &mut wrong.cells {
        c.verdict = matrix::Verdict::Holds;
        c.trace = None;
    }
    let other = Cache::with_fingerprint(&dir, "0123456789abcdef0123456789abcdef");
    other.store(&model, &wrong).unwrap();
    assert!(other.load(&model).is_ok());
    let cache = Cache::new(&dir);
    // Its key differs, so it is not even looked at.
    assert!(matches!(
        cache.load(&model),
        Err(CacheError::Missing { .. })
    ));
    // Put where this version's file goes, it is rejected for its key.
    std::fs::copy(other.path(&model), cache.path(&model)).unwrap();
    assert!(matches!(cache.load(&model), Err(CacheError::Stale { .. })));
    let run = cache.run(model).unwrap();
    assert!(!run.cached);
    assert_same(&fresh, &run);
    assert_eq!(cache.stats().rejected.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_files_are_typed_errors_and_computed_again() {
    let dir = fresh_dir("damaged");
    let model = model();
    let cache = Cache::new(&dir);
    let fresh = cache.run(model.clone()).unwrap();
    let path = cache.path(&model);
    let good = std::fs::read_to_string(&path).unwrap();
    let value: serde_json::Value = serde_json::from_str(&good).unwrap();

    let damaged = |text: &str| {
        std::fs::write(&path, text).unwrap();
        cache.load(&model)
    };
    // Truncated, empty, not JSON.
    assert!(matches!(
        damaged(&good[..good.len() / 2]),
        Err(CacheError::Corrupt { .. })
    ));
    assert!(matches!(damaged(""), Err(CacheError::Corrupt { .. })));
    assert!(matches!(
        damaged("\u{0}\u{1}garbage"),
        Err(CacheError::Corrupt { .. })
    ));
    // A verdict turned around without its trace.
    let mut v = value.clone();
    let props = v["properties"].as_array_mut().unwrap();
    let violated = props
        .iter()
        .position(|p| p["verdict"] == "violated")
        .unwrap();
    props[violated]["verdict"] = "holds".into();
    assert!(matches!(
        damaged(&v.to_string()),
        Err(CacheError::Corrupt { .. })
    ));
    // A property in the wrong place.
    let mut v = value.clone();
    v["properties"].as_array_mut().unwrap().swap(0, 1);
    assert!(matches!(
        damaged(&v.to_string()),
        Err(CacheError::Corrupt { .. })
    ));
    // A trace cut short, one with an action that does not exist, one whose
    // stored length differs from its replay.
    let trace = |v: &mut serde_json::Value| -> serde_json::Value {
        v["properties"][violated]["trace"].clone()
    };
    let mut v = value.clone();
    let mut t = trace(&mut v);
    let choices = t["choices"].as_array_mut().unwrap();
    choices.pop();
    t["length"] = (choices.len() + 1).into();
    v["properties"][violated]["trace"] = t;
    assert!(matches!(
        damaged(&v.to_string()),
        Err(CacheError::Trace { .. })
    ));
    let mut v = value.clone();
    let mut t = trace(&mut v);
    t["choices"][0] = 9999.into();
    v["properties"][violated]["trace"] = t;
    assert!(matches!(
        damaged(&v.to_string()),
        Err(CacheError::Trace { .. })
    ));
    let mut v = value.clone();
    let mut t = trace(&mut v);
    let length = t["length"].as_u64().unwrap();
    t["length"] = (length + 1).into();
    v["properties"][violated]["trace"] = t;
    assert!(matches!(
        damaged(&v.to_string()),
        Err(CacheError::Trace { .. })
    ));
    // Each damage is computed again, and the file repaired.
    let before = cache.stats().rejected.len();
    let run = cache.run(model.clone()).unwrap();
    assert!(!run.cached);
    assert_same(&fresh, &run);
    assert_eq!(cache.stats().rejected.len(), before + 1);
    assert!(cache.run(model).unwrap().cached);
    let _ = std::fs::remove_dir_all(&dir);
}
