//! The scenario catalogue in `docs/`, generated from the model.
//!
//! [`generate`] checks every (protocol, fault) cell with
//! [`matrix::standard_run`] (through a [`Cache`] when given one), which also
//! finds the shortest counterexample of every violated property, and renders
//!
//! - `verdicts.md`: the whole matrix (the nine fault columns and the restart
//!   variants), the legend, and the expectation behind every notable cell;
//! - `protocols/<id>.md`: one page per catalogue protocol: idea, origin, the
//!   machine's essay, the Redis commands it sends (recorded by driving the
//!   machine against the keyspace model), its Lua scripts, a state diagram,
//!   its row of the matrix, and every counterexample as text and as an SVG
//!   sequence diagram (`protocols/svg/<id>--<fault>--<property>.svg`), each
//!   replayed on real Redis by `chaos/tests/replay.rs`;
//! - `README.md`: the index.
//!
//! The output is a pure function of the code: no timestamps, no timings, no
//! state counts. `model/tests/docs.rs` regenerates it and fails when the
//! committed copy differs. Regenerate with
//! `cargo run --release -p lockwright-model -- docs`.
//!
//! The module is split by what each part does: this file computes (it
//! runs the checker through [`matrix::standard_run`] and nothing else),
//! `markdown` renders the pages, `commands` records what each machine
//! sends by driving it against the keyspace model and prints it as
//! `redis-cli` would.
//!
//! # Shortest counterexamples
//!
//! The pages need traces that are both shortest and repeatable; they are
//! those of [`matrix::shortest_counterexamples`], the same search `explain`,
//! the matrix test and the replay use.

use crate::cache::Cache;
use crate::fault::{Fault, PropertyId};
use crate::matrix::{self, Cell, CheckError, Rule, Trace, Verdict};
use crate::model::{standard_clients, ModelConfig, PROGRESS_CLIENTS};
use crate::trace;
use lockwright_core::keyspace::{
    Command, ConnId, Keyspace, Reply, ScoreBound, Script, SetCondition, SetExpiry,
};
use lockwright_core::{
    catalogue, Acquire, ConfigError, Event, Kind, Lease, Machine, Millis, Outcome, Protocol,
    ProtocolId, Token,
};
use std::collections::BTreeMap;
use std::path::Path;

/// The guide "Driving the core from your own front end" (`docs/driving.md`).
/// Its Rust code blocks run as doctests of this crate, so the loop it shows
/// is checked on every `cargo test`.
#[doc = include_str!("../../../docs/driving.md")]
pub mod driving_guide {}

/// What can go wrong while generating the docs.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// A model could not be configured.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The expectations file does not parse.
    #[error(transparent)]
    Expectations(#[from] matrix::ExpectationError),
    /// A machine rejected its configuration while recording commands.
    #[error("cannot configure {protocol}: {source}")]
    Config {
        /// The protocol.
        protocol: ProtocolId,
        /// Why.
        source: ConfigError,
    },
    /// The generation found something that cannot be (a worker panicked, a
    /// recorded request went to a node that does not exist).
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    /// Writing the files failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The generated files, by path relative to the docs directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Docs {
    /// Path (with `/`) → contents.
    pub files: BTreeMap<String, String>,
}

impl Docs {
    /// Write every file under `dir`, creating directories as needed. Files
    /// already there that are not generated (the guides) are left alone;
    /// SVGs of counterexamples that no longer exist are removed.
    pub fn write_to(&self, dir: &Path) -> Result<(), DocsError> {
        let io = |path: &Path, source| DocsError::Io {
            path: path.display().to_string(),
            source,
        };
        let svg_dir = dir.join("protocols").join("svg");
        if let Ok(entries) = std::fs::read_dir(&svg_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".svg")
                    && !self.files.contains_key(&format!("protocols/svg/{name}"))
                {
                    std::fs::remove_file(entry.path()).map_err(|e| io(&entry.path(), e))?;
                }
            }
        }
        for (rel, text) in &self.files {
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::write(&path, text).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

/// Everything the checker computed for one (protocol, fault) cell.
#[derive(Clone, Debug)]
pub struct CellResult {
    /// One verdict per property, from [`matrix::standard_run`].
    pub cells: Vec<Cell>,
    /// The shortest counterexample of every violated property.
    pub traces: BTreeMap<PropertyId, Trace>,
}

/// The whole matrix with its counterexamples.
#[derive(Clone, Debug)]
pub struct Computed {
    /// By (protocol, fault), every fault of [`Fault::ALL`].
    pub results: BTreeMap<(ProtocolId, Fault), CellResult>,
}

/// Check every protocol under every fault on `threads` worker threads (each
/// cell single-threaded, so the result does not depend on scheduling),
/// reading and storing cells in `cache` when given one.
pub fn compute(threads: usize, cache: Option<&Cache>) -> Result<Computed, DocsError> {
    let cells: Vec<(ProtocolId, Fault)> = ProtocolId::all()
        .flat_map(|p| Fault::ALL.into_iter().map(move |f| (p, f)))
        .collect();
    let jobs: Vec<(ProtocolId, Fault)> = matrix::largest_first(&cells)
        .into_iter()
        .map(|i| cells[i])
        .collect();
    let results = matrix::par_map(
        &jobs,
        threads,
        |&(p, f)| compute_cell(p, f, cache),
        |_, _, _| {},
    )?;
    Ok(Computed {
        results: jobs.into_iter().zip(results).collect(),
    })
}

/// Check one (protocol, fault) run and find the shortest counterexample of
/// every violated property: one cell of [`compute`].
pub fn compute_cell(
    protocol: ProtocolId,
    fault: Fault,
    cache: Option<&Cache>,
) -> Result<CellResult, DocsError> {
    let run = matrix::standard_run(protocol, fault, cache)?;
    let traces = run
        .cells
        .iter()
        .filter_map(|c| Some((c.property, c.trace.clone()?)))
        .collect();
    Ok(CellResult {
        cells: run.cells,
        traces,
    })
}

/// Check everything (through `cache` when given one) and render every
/// generated file.
pub fn generate(threads: usize, cache: Option<&Cache>) -> Result<Docs, DocsError> {
    let computed = compute(threads, cache)?;
    render(&computed)
}

mod commands;
mod markdown;

pub use commands::{record_commands, redis_cli, reply_cli, Transcript};
pub use markdown::{render, short, ChaosTest, CHAOS};
