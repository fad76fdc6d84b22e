//! A cache of checked cells: each (protocol, fault) run of
//! [`matrix::standard_run`] is computed once per source version and read
//! back by whoever needs it next (the matrix test, the docs test, the
//! replay test, and the CLI and the `replay` binary when given a cache).
//!
//! # What a cell file holds
//!
//! One JSON file per run, `<protocol>--<fault>--<key hash>.json`, written to
//! a temporary file and renamed into place (readers never see half a file;
//! two threads computing the same cell at once both write the same thing).
//! It holds the run's key, its state counts and time, each property's
//! verdict, and every counterexample (the shortest of each violated
//! property, the checker's for each broken invariant of the model) as the
//! index of the action taken at each step among
//! [`LockModel::enabled`] from the initial state.
//!
//! # Soundness
//!
//! The key is [`SOURCE_FINGERPRINT`] (a hash, made by `model/build.rs`, of
//! `core/src/**`, `model/src/**` but for the sources that take no part
//! in checking a cell (`trace.rs`, `docs/`, `main.rs`, `pairs.rs`, `sim.rs`), the manifests,
//! `Cargo.lock` and the
//! compiler's version), this file format's version, and the run's own
//! inputs: the whole [`ModelConfig`](crate::ModelConfig) (bounds and
//! reductions), the properties and whether the model's invariants are on.
//! A file whose key differs, that does not parse, or whose traces do not
//! replay to a state that violates their property (each trace's last state,
//! and none before it for a shortest one) is rejected with a
//! [`CacheError`] and the run is computed again; a cache never turns into a
//! panic or a verdict the checker did not compute for these sources.
//!
//! The cache only saves computing the same run twice. CI starts from a clean
//! clone, so its cache is empty; it runs the CLI's `check --cache` first
//! (in release), which computes every standard cell and stores it, and the
//! tests read those results (a test needing a cell nobody stored computes
//! it). Every verdict CI reports was computed by the checker in that same
//! CI run.

use crate::matrix::{self, Cell, CheckError, Run, Trace, Verdict};
use crate::model::LockModel;
use serde::{Deserialize, Serialize};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A hash of every source that can change a verdict, a state count or a
/// counterexample, made by `model/build.rs` when one of them changes.
pub const SOURCE_FINGERPRINT: &str = env!("LOCKWRIGHT_SOURCE_FINGERPRINT");

/// The environment variable naming a cache directory for the CLI and the
/// `replay` binary (their `--cache DIR` does the same).
pub const ENV: &str = "LOCKWRIGHT_MATRIX_CACHE";

/// The version of the cell file format; part of every key.
const FORMAT: u32 = 1;

/// Why a cached cell was not used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// No file for this key.
    #[error("{path}: no cached cell")]
    Missing {
        /// The file looked for.
        path: String,
    },
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a cell file (truncated, not JSON, a field missing
    /// or out of place).
    #[error("{path}: not a cell file: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The file was written for another key: other sources, another file
    /// format, other bounds.
    #[error("{path}: written for another source version or other inputs")]
    Stale {
        /// The file.
        path: String,
    },
    /// A stored counterexample does not replay to a violation of its
    /// property.
    #[error("{path}: the stored trace of {what} does not replay: {message}")]
    Trace {
        /// The file.
        path: String,
        /// The property or invariant.
        what: String,
        /// What went wrong.
        message: String,
    },
}

/// What a cache did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Runs read from the cache.
    pub hits: usize,
    /// Runs computed (and stored).
    pub computed: usize,
    /// Files found but rejected, with the reason (each run was then
    /// computed).
    pub rejected: Vec<String>,
}

/// A directory of checked cells for one source version.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    fingerprint: String,
    stats: Mutex<Stats>,
}

#[derive(Serialize, Deserialize)]
struct StoredTrace {
    /// States in the trace (actions + 1).
    length: usize,
    /// The index of each action among the enabled ones.
    choices: Vec<usize>,
}

#[derive(Serialize, Deserialize)]
struct StoredProperty {
    property: String,
    verdict: String,
    trace: Option<StoredTrace>,
}

#[derive(Serialize, Deserialize)]
struct StoredBroken {
    invariant: String,
    trace: StoredTrace,
}

#[derive(Serialize, Deserialize)]
struct CellFile {
    key: String,
    states: usize,
    generated: usize,
    seconds: f64,
    properties: Vec<StoredProperty>,
    broken: Vec<StoredBroken>,
}

/// The names of the model's own invariants ([`LockModel::sanity`]).
const INVARIANTS: [&str; 2] = ["time passes", "deadlines kept"];

fn invariant_holds(model: &LockModel, name: &str, state: &crate::State) -> bool {
    match name {
        "time passes" => model.time_passes(state),
        _ => model.deadlines_kept(state),
    }
}

impl Cache {
    /// A cache in `dir` (created when the first cell is stored) for the
    /// sources this crate was built from.
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache::with_fingerprint(dir, SOURCE_FINGERPRINT)
    }

    /// A cache in `dir` that takes its files for those of the sources
    /// hashing to `fingerprint` (to test that another version's files are
    /// not used).
    pub fn with_fingerprint(dir: impl Into<PathBuf>, fingerprint: &str) -> Cache {
        Cache {
            dir: dir.into(),
            fingerprint: fingerprint.to_owned(),
            stats: Mutex::new(Stats::default()),
        }
    }

    /// The cache named by [`ENV`], if set and not empty.
    pub fn from_env() -> Option<Cache> {
        std::env::var_os(ENV)
            .filter(|v| !v.is_empty())
            .map(Cache::new)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the cache did so far.
    pub fn stats(&self) -> Stats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// One line on what the cache did so far: runs read, computed, and
    /// files rejected with their reasons.
    pub fn summary(&self) -> String {
        let stats = self.stats();
        format!(
            "{} runs read from {}, {} computed, rejected: {:?}",
            stats.hits,
            self.dir.display(),
            stats.computed,
            stats.rejected
        )
    }

    fn note(&self, f: impl FnOnce(&mut Stats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// The key of `model`'s run: everything its result depends on.
    pub fn key(&self, model: &LockModel) -> String {
        format!(
            "sources {} format {FORMAT} threads 1 shortest sanity {} properties {:?} config {:?}",
            self.fingerprint, model.sanity, model.properties, model.cfg
        )
    }

    /// The file of `model`'s run.
    pub fn path(&self, model: &LockModel) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(self.key(model).as_bytes());
        self.dir.join(format!(
            "{}--{}--{:016x}.json",
            model.cfg.protocol,
            model.cfg.fault,
            h.finish()
        ))
    }

    /// The run of `model` ([`matrix::check_model`] on one thread with
    /// shortest counterexamples): read from the cache when a valid file is
    /// there, else computed and stored. A rejected file is counted in
    /// [`Stats::rejected`] and replaced.
    pub fn run(&self, model: LockModel) -> Result<Run, CheckError> {
        match self.load(&model) {
            Ok(run) => {
                self.note(|s| s.hits += 1);
                return Ok(run);
            }
            Err(CacheError::Missing { .. }) => {}
            Err(e) => self.note(|s| s.rejected.push(e.to_string())),
        }
        let run = matrix::check_model(model.clone(), 1, true)?;
        self.store(&model, &run)?;
        self.note(|s| s.computed += 1);
        Ok(run)
    }

    /// Write `run`, the run of `model`, to its file (a temporary file
    /// renamed into place).
    pub fn store(&self, model: &LockModel, run: &Run) -> Result<(), CacheError> {
        let path = self.path(model);
        let io = |p: &Path, source| CacheError::Io {
            path: p.display().to_string(),
            source,
        };
        let stored = |trace: &Trace| -> Result<StoredTrace, CacheError> {
            let choices =
                matrix::choices_of(model, trace).map_err(|message| CacheError::Trace {
                    path: path.display().to_string(),
                    what: "a computed trace".into(),
                    message,
                })?;
            Ok(StoredTrace {
                length: trace.len(),
                choices,
            })
        };
        let file = CellFile {
            key: self.key(model),
            states: run.states,
            generated: run.generated,
            seconds: run.seconds,
            properties: run
                .cells
                .iter()
                .map(|c| {
                    Ok(StoredProperty {
                        property: c.property.as_str().to_owned(),
                        verdict: c.verdict.as_str().to_owned(),
                        trace: c.trace.as_ref().map(&stored).transpose()?,
                    })
                })
                .collect::<Result<_, CacheError>>()?,
            broken: run
                .broken
                .iter()
                .map(|(name, t)| {
                    Ok(StoredBroken {
                        invariant: (*name).to_owned(),
                        trace: stored(t)?,
                    })
                })
                .collect::<Result<_, CacheError>>()?,
        };
        let text = serde_json::to_string(&file).map_err(|e| CacheError::Corrupt {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let tmp = path.with_extension(format!(
            "tmp-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&path, e)
        })
    }

    /// Read the run of `model` from its file, replaying and checking every
    /// stored trace.
    pub fn load(&self, model: &LockModel) -> Result<Run, CacheError> {
        let path = self.path(model);
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CacheError::Missing { path: shown })
            }
            Err(source) => {
                return Err(CacheError::Io {
                    path: shown,
                    source,
                })
            }
        };
        let corrupt = |message: String| CacheError::Corrupt {
            path: shown.clone(),
            message,
        };
        let file: CellFile = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if file.key != self.key(model) {
            return Err(CacheError::Stale { path: shown });
        }
        if file.properties.len() != model.properties.len() {
            return Err(corrupt(format!(
                "{} properties, not {}",
                file.properties.len(),
                model.properties.len()
            )));
        }
        if file.states == 0 {
            return Err(corrupt("no states".into()));
        }
        let replay = |what: &str,
                      stored: &StoredTrace,
                      violates: &dyn Fn(&crate::State) -> bool,
                      first: bool|
         -> Result<Trace, CacheError> {
            let bad = |message: String| CacheError::Trace {
                path: shown.clone(),
                what: what.to_owned(),
                message,
            };
            let trace = matrix::trace_from_choices(model, &stored.choices).map_err(bad)?;
            if trace.len() != stored.length {
                return Err(bad(format!(
                    "{} states, the file says {}",
                    trace.len(),
                    stored.length
                )));
            }
            let (last, before) = trace.split_last().ok_or_else(|| bad("empty".into()))?;
            if !violates(&last.0) {
                return Err(bad("its last state does not violate it".into()));
            }
            if first && before.iter().any(|(s, _)| violates(s)) {
                return Err(bad("an earlier state already violates it".into()));
            }
            Ok(trace)
        };
        let mut cells = Vec::new();
        for (&property, stored) in model.properties.iter().zip(&file.properties) {
            if stored.property != property.as_str() {
                return Err(corrupt(format!(
                    "property {:?} where {property} belongs",
                    stored.property
                )));
            }
            let (verdict, trace) = match (stored.verdict.as_str(), &stored.trace) {
                ("holds", None) => (Verdict::Holds, None),
                ("violated", Some(t)) => {
                    let violates = |s: &crate::State| !model.holds_in(property, s);
                    let trace = replay(property.as_str(), t, &violates, true)?;
                    (Verdict::Violated, Some(trace))
                }
                (v, t) => {
                    return Err(corrupt(format!(
                        "{property}: verdict {v:?} {} a trace",
                        if t.is_some() { "with" } else { "without" }
                    )))
                }
            };
            cells.push(Cell {
                protocol: model.cfg.protocol,
                fault: model.cfg.fault,
                property,
                verdict,
                states: file.states,
                seconds: file.seconds,
                trace,
            });
        }
        let mut broken = Vec::new();
        for b in &file.broken {
            let Some(&name) = INVARIANTS.iter().find(|&&n| n == b.invariant) else {
                return Err(corrupt(format!("unknown invariant {:?}", b.invariant)));
            };
            if !model.sanity {
                return Err(corrupt(format!("invariant {name:?} of a run without them")));
            }
            let violates = |s: &crate::State| !invariant_holds(model, name, s);
            broken.push((name, replay(name, &b.trace, &violates, false)?));
        }
        Ok(Run {
            cells,
            states: file.states,
            generated: file.generated,
            seconds: file.seconds,
            broken,
            cached: true,
        })
    }
}
