//! The verdict matrix: every (protocol, fault, property) cell computed by the
//! checker, compared with the recorded expectations.

use crate::fault::{Fault, PropertyId};
use crate::model::{Action, LockModel, ModelConfig, State};
use lockwright_core::ProtocolId;
use stateright::{Checker, Model};
use std::fmt;
use std::time::Instant;

/// The checker's answer for one property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// No reachable state within the bounds violates it.
    Holds,
    /// Some reachable state violates it.
    Violated,
}

impl Verdict {
    /// `holds` or `violated`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Violated => "violated",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A counterexample: states and the action taken from each.
pub type Trace = Vec<(State, Option<Action>)>;

/// One computed cell.
#[derive(Clone, Debug)]
pub struct Cell {
    /// Protocol.
    pub protocol: ProtocolId,
    /// Fault.
    pub fault: Fault,
    /// Property.
    pub property: PropertyId,
    /// What the checker found.
    pub verdict: Verdict,
    /// Unique states explored by the run that decided the cell.
    pub states: usize,
    /// Seconds that run took (shared by the properties of one run).
    pub seconds: f64,
    /// The counterexample, for violations (shortest when asked for).
    pub trace: Option<Trace>,
}

/// What the checker returned for one (protocol, fault) run.
#[derive(Clone, Debug)]
pub struct Run {
    /// One cell per property.
    pub cells: Vec<Cell>,
    /// Unique states.
    pub states: usize,
    /// States generated (with repeats).
    pub generated: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The model's own invariants that failed, with a counterexample each
    /// (checked only with [`LockModel::sanity`] on).
    pub broken: Vec<(&'static str, Trace)>,
}

/// An error setting up a check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The protocol rejected the model's configuration.
    #[error("cannot configure {protocol}: {source}")]
    Config {
        /// The protocol.
        protocol: ProtocolId,
        /// Why.
        source: lockwright_core::ConfigError,
    },
}

/// Build the model for one cell.
pub fn model_for(
    protocol: ProtocolId,
    fault: Fault,
    properties: Vec<PropertyId>,
) -> Result<LockModel, CheckError> {
    LockModel::new(ModelConfig::new(protocol, fault), properties)
        .map_err(|source| CheckError::Config { protocol, source })
}

/// Check every property of `protocol` under `fault` in one breadth-first
/// run. With `shortest`, each violation's trace is then shortened by
/// iterative deepening.
pub fn check(
    protocol: ProtocolId,
    fault: Fault,
    threads: usize,
    shortest: bool,
) -> Result<Run, CheckError> {
    check_config(ModelConfig::new(protocol, fault), threads, shortest)
}

/// [`check`] with bounds of the caller's own (another latency, horizon or
/// set of reductions).
pub fn check_config(cfg: ModelConfig, threads: usize, shortest: bool) -> Result<Run, CheckError> {
    let protocol = cfg.protocol;
    let model = LockModel::new(cfg, PropertyId::ALL.to_vec())
        .map_err(|source| CheckError::Config { protocol, source })?;
    Ok(check_model(model, threads, shortest))
}

/// [`check`] of a model built by the caller (for instance with
/// [`LockModel::sanity`] on: its invariants' counterexamples are then in
/// [`Run::broken`]).
pub fn check_model(model: LockModel, threads: usize, shortest: bool) -> Run {
    let (protocol, fault) = (model.cfg.protocol, model.cfg.fault);
    let started = Instant::now();
    let checker = model.clone().checker().threads(threads).spawn_bfs().join();
    let seconds = started.elapsed().as_secs_f64();
    let states = checker.unique_state_count();
    let generated = checker.state_count();
    let mut cells = Vec::new();
    for property in PropertyId::ALL {
        let found = checker.discovery(property.as_str());
        let (verdict, trace) = match found {
            None => (Verdict::Holds, None),
            Some(path) => {
                let trace = path.into_vec();
                let trace = if shortest {
                    shortest_trace(&model, property, trace.len()).unwrap_or(trace)
                } else {
                    trace
                };
                (Verdict::Violated, Some(trace))
            }
        };
        cells.push(Cell {
            protocol,
            fault,
            property,
            verdict,
            states,
            seconds,
            trace,
        });
    }
    let broken = ["time passes", "deadlines kept"]
        .into_iter()
        .filter(|_| model.sanity)
        .filter_map(|name| Some((name, checker.discovery(name)?.into_vec())))
        .collect();
    Run {
        cells,
        states,
        generated,
        seconds,
        broken,
    }
}

/// The shortest counterexample for `property`, found by searching on the
/// depth bound: a violation within `d` steps exists for every `d` at least the
/// shortest length, so a binary search over `target_max_depth` finds it.
/// `known` is the length (states) of a counterexample already found.
pub fn shortest_trace(model: &LockModel, property: PropertyId, known: usize) -> Option<Trace> {
    let mut only = model.clone();
    only.properties = vec![property];
    // A path of `n` states is checked when target_max_depth > n.
    let find = |n: usize| -> Option<Trace> {
        only.clone()
            .checker()
            .target_max_depth(n + 1)
            .spawn_bfs()
            .join()
            .discovery(property.as_str())
            .map(|p| p.into_vec())
    };
    let (mut lo, mut hi) = (1usize, known);
    let mut best = find(hi)?;
    hi = best.len();
    while lo < hi {
        let mid = (lo + hi) / 2;
        match find(mid) {
            Some(t) => {
                hi = t.len().min(mid);
                best = t;
            }
            None => lo = mid + 1,
        }
    }
    Some(best)
}

/// One expectation rule: a pattern of cells, the verdict they should have,
/// why, and where that comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    protocols: Option<Vec<ProtocolId>>,
    faults: Option<Vec<Fault>>,
    properties: Option<Vec<PropertyId>>,
    /// The expected verdict.
    pub verdict: Verdict,
    /// One-line reason.
    pub reason: String,
    /// Source.
    pub source: String,
    /// Line in the file.
    pub line: usize,
}

/// The expectations file, compiled in.
pub const EXPECTATIONS: &str = include_str!("../expectations.txt");

/// A malformed expectations line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expectations.txt line {line}: {message}")]
pub struct ExpectationError {
    /// Line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn parse_list<T: std::str::FromStr>(
    field: &str,
    line: usize,
) -> Result<Option<Vec<T>>, ExpectationError>
where
    T::Err: fmt::Display,
{
    if field == "*" {
        return Ok(None);
    }
    field
        .split(',')
        .map(|s| {
            s.trim().parse::<T>().map_err(|e| ExpectationError {
                line,
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// Parse the expectations: `protocols faults properties verdict | reason | source`,
/// where each of the first three is `*` or a comma-separated list. The last
/// rule matching a cell decides it.
pub fn parse_expectations(text: &str) -> Result<Vec<Rule>, ExpectationError> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let mut parts = raw.splitn(3, '|');
        let head = parts.next().unwrap_or_default();
        let reason = parts.next().unwrap_or_default().trim().to_owned();
        let source = parts.next().unwrap_or_default().trim().to_owned();
        let fields: Vec<&str> = head.split_whitespace().collect();
        let [p, f, prop, v] = fields[..] else {
            return Err(ExpectationError {
                line,
                message: format!("expected 4 fields before '|', found {}", fields.len()),
            });
        };
        let verdict = match v {
            "holds" => Verdict::Holds,
            "violated" => Verdict::Violated,
            other => {
                return Err(ExpectationError {
                    line,
                    message: format!("verdict must be holds or violated, not {other:?}"),
                })
            }
        };
        if reason.is_empty() {
            return Err(ExpectationError {
                line,
                message: "a rule needs a reason".into(),
            });
        }
        rules.push(Rule {
            protocols: parse_list(p, line)?,
            faults: parse_list(f, line)?,
            properties: parse_list(prop, line)?,
            verdict,
            reason,
            source,
            line,
        });
    }
    Ok(rules)
}

/// The rule that decides a cell, if any.
pub fn expected(
    rules: &[Rule],
    protocol: ProtocolId,
    fault: Fault,
    property: PropertyId,
) -> Option<&Rule> {
    rules.iter().rev().find(|r| {
        r.protocols.as_ref().is_none_or(|v| v.contains(&protocol))
            && r.faults.as_ref().is_none_or(|v| v.contains(&fault))
            && r.properties.as_ref().is_none_or(|v| v.contains(&property))
    })
}
