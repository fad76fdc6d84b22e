//! The verdict matrix: every (protocol, fault, property) cell computed by the
//! checker, compared with the recorded expectations.

use crate::cache::{Cache, CacheError};
use crate::fault::{Fault, PropertyId};
use crate::model::{Action, LockModel, ModelConfig, State};
use lockwright_core::ProtocolId;
use stateright::{Checker, Model};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
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
    /// Read from a [`Cache`] rather than computed by this call (the
    /// verdicts and counts are those of the run that wrote it, `seconds`
    /// included).
    pub cached: bool,
}

impl Run {
    /// The runs of one (protocol, fault) as one: the cells in property
    /// order, the counts and times summed, cached only if every run was.
    pub fn merge(runs: Vec<Run>) -> Run {
        let mut merged = Run {
            cells: Vec::new(),
            states: 0,
            generated: 0,
            seconds: 0.0,
            broken: Vec::new(),
            cached: !runs.is_empty(),
        };
        for run in runs {
            merged.cells.extend(run.cells);
            merged.states += run.states;
            merged.generated += run.generated;
            merged.seconds += run.seconds;
            merged.broken.extend(run.broken);
            merged.cached &= run.cached;
        }
        merged.cells.sort_by_key(|c| c.property);
        merged
    }
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
    /// The checker and the counterexample search disagree, or a trace does
    /// not replay to the state it was found at.
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    /// A computed cell could not be written to the cache.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// Build the model that checks `properties` of `protocol` under `fault`
/// at the standard bounds for those properties
/// ([`ModelConfig::for_properties`]).
pub fn model_for(
    protocol: ProtocolId,
    fault: Fault,
    properties: Vec<PropertyId>,
) -> Result<LockModel, CheckError> {
    LockModel::new(
        ModelConfig::for_properties(protocol, fault, &properties),
        properties,
    )
    .map_err(|source| CheckError::Config { protocol, source })
}

/// The model whose standard run decides `property` of `protocol` under
/// `fault` (one of [`standard_groups`]): the model to render or replay
/// that cell's counterexample with.
pub fn cell_model(
    protocol: ProtocolId,
    fault: Fault,
    property: PropertyId,
) -> Result<LockModel, CheckError> {
    let group = standard_groups(protocol)
        .into_iter()
        .find(|g| g.contains(&property))
        .unwrap_or_else(|| vec![property]);
    model_for(protocol, fault, group)
}

/// Cells whose `holds` at the standard bounds is known to be an artefact
/// of those bounds: a wider run finds them violated. Each is shown in the
/// docs beside its verdict; the tests that find one
/// (`model/tests/clients.rs`, `model/tests/reductions.rs`) fail when a
/// wider run decides that it holds after all, so that the list shrinks
/// when the bounds widen.
///
/// None is known. The last two, `lease-semaphore` and
/// `time-fenced-semaphore` × `delay` × `mutual-exclusion`, were violated
/// with a third client or without the late-retry bound: their undo of an
/// unanswered acquire, held up on the wire, removed a permit granted later
/// under the same token. The protocols no longer undo it; with a third
/// client their whole `delay` spaces hold (`lockwright check -p
/// lease-semaphore -p time-fenced-semaphore -f delay --clients 3`).
pub const BOUND_GAPS: &[(ProtocolId, Fault, PropertyId, &str)] = &[];

/// Why `(protocol, fault, property)`'s `holds` is a known artefact of the
/// bounds ([`BOUND_GAPS`]), if it is one.
pub fn bound_gap(protocol: ProtocolId, fault: Fault, property: PropertyId) -> Option<&'static str> {
    BOUND_GAPS
        .iter()
        .find(|&&(p, f, q, _)| (p, f, q) == (protocol, fault, property))
        .map(|&(_, _, _, why)| why)
}

/// The properties checked together in one run of the standard bounds:
/// all four in one run, except where a protocol's safety properties take
/// more clients than its progress ([`crate::model::standard_clients`]):
/// then the safety properties in one run and progress in another.
pub fn standard_groups(protocol: ProtocolId) -> Vec<Vec<PropertyId>> {
    let progress = [PropertyId::Progress];
    if ModelConfig::for_properties(protocol, Fault::None, &PropertyId::ALL).clients
        == ModelConfig::for_properties(protocol, Fault::None, &progress).clients
    {
        return vec![PropertyId::ALL.to_vec()];
    }
    vec![
        PropertyId::ALL
            .into_iter()
            .filter(|&p| p != PropertyId::Progress)
            .collect(),
        progress.to_vec(),
    ]
}

/// Check every property of `protocol` under `fault`, in one breadth-first
/// run per group of [`standard_groups`]. With `shortest`, each violation's trace is then replaced by the
/// shortest counterexample ([`shortest_counterexamples`]).
pub fn check(
    protocol: ProtocolId,
    fault: Fault,
    threads: usize,
    shortest: bool,
) -> Result<Run, CheckError> {
    let mut runs = Vec::new();
    for group in standard_groups(protocol) {
        runs.push(check_model(
            model_for(protocol, fault, group)?,
            threads,
            shortest,
        )?);
    }
    Ok(Run::merge(runs))
}

/// [`check`] with bounds of the caller's own (another latency, horizon or
/// set of reductions).
pub fn check_config(cfg: ModelConfig, threads: usize, shortest: bool) -> Result<Run, CheckError> {
    let protocol = cfg.protocol;
    let model = LockModel::new(cfg, PropertyId::ALL.to_vec())
        .map_err(|source| CheckError::Config { protocol, source })?;
    check_model(model, threads, shortest)
}

/// Run `work` on every job on `threads` worker threads, one job per thread
/// at a time (a cell checked single-threaded does not depend on
/// scheduling), taking jobs in the order given: put the largest first, so
/// that none starts last while the other workers idle. `done` sees each
/// result as it comes, with the number finished so far (for progress).
/// The first error stops the workers from taking further jobs and is
/// returned; otherwise the results come back in the order of `jobs`.
pub fn par_map<J: Sync, R: Send, E: Send>(
    jobs: &[J],
    threads: usize,
    work: impl Fn(&J) -> Result<R, E> + Sync,
    done: impl Fn(usize, &J, &R) + Sync,
) -> Result<Vec<R>, E> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(jobs.iter().map(|_| None).collect());
    let failure: Mutex<Option<E>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                // A panicking job stops the other workers from taking more
                // (the scope then raises the panic).
                let _stop = StopOnPanic(&next, jobs.len());
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { return };
                match work(job) {
                    Ok(r) => {
                        done(finished.fetch_add(1, Ordering::Relaxed) + 1, job, &r);
                        if let Ok(mut all) = results.lock() {
                            all[i] = Some(r);
                        }
                    }
                    Err(e) => {
                        if let Ok(mut slot) = failure.lock() {
                            slot.get_or_insert(e);
                        }
                        next.store(jobs.len(), Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    // Every job ran and succeeded: an error returned above, and a worker's
    // panic ends the scope with it.
    Ok(results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect())
}

/// Stops [`par_map`]'s workers from taking further jobs when dropped
/// during a panic.
struct StopOnPanic<'a>(&'a std::sync::atomic::AtomicUsize, usize);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(self.1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The order in which [`par_map`] should take `cells`, as indices into
/// it: multi-node runs (RedLock) first, as they are the largest, the rest
/// in the order given.
pub fn largest_first(cells: &[(ProtocolId, Fault)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| {
        let (p, f) = cells[i];
        std::cmp::Reverse(ModelConfig::new(p, f).nodes)
    });
    order
}

/// Whether the standard run of `group` checks the model's own invariants
/// ([`LockModel::sanity`]): in the group that checks progress, and only
/// there. Every protocol has exactly one such group, so every (protocol,
/// fault) run has its invariants checked over the whole space at
/// [`crate::model::PROGRESS_CLIENTS`] clients.
///
/// Why not in every group: a run with the invariants on cannot stop early,
/// since they hold (any counterexample of theirs fails the run), so it
/// covers its whole state space. A progress run covers it anyway wherever
/// progress holds, but a safety-only run of three clients
/// ([`crate::model::standard_clients`]) stops as soon as its properties
/// are all found, which with the invariants on it never did: the
/// set-px-get-del and setnx-getset rows covered 65 million states for
/// verdicts found in 7 million. The three-client space is then left
/// without the invariants but for `tests/matrix.rs`, which checks them
/// there at a shorter horizon under four faults
/// (`invariants_hold_with_three_clients`).
pub fn checks_invariants(group: &[PropertyId]) -> bool {
    group.contains(&PropertyId::Progress)
}

/// The standard run of one cell, the one the matrix test, the docs, the
/// replay and (with a cache) the CLI share: the standard bounds, every
/// property, the model's own invariants on in the progress group
/// ([`checks_invariants`]), one checker thread (so state counts do not
/// depend on scheduling), and the shortest counterexample of every violated
/// property. With a `cache`, a run stored for the same sources and inputs
/// is read instead of computed, and a computed one is stored (see
/// [`crate::cache`]).
pub fn standard_run(
    protocol: ProtocolId,
    fault: Fault,
    cache: Option<&Cache>,
) -> Result<Run, CheckError> {
    let mut runs = Vec::new();
    for group in standard_groups(protocol) {
        let mut model = model_for(protocol, fault, group.clone())?;
        model.sanity = checks_invariants(&group);
        runs.push(match cache {
            Some(cache) => cache.run(model)?,
            None => check_model(model, 1, true)?,
        });
    }
    Ok(Run::merge(runs))
}

/// [`check`] of a model built by the caller (for instance with
/// [`LockModel::sanity`] on: its invariants' counterexamples are then in
/// [`Run::broken`]).
pub fn check_model(model: LockModel, threads: usize, shortest: bool) -> Result<Run, CheckError> {
    let (protocol, fault) = (model.cfg.protocol, model.cfg.fault);
    let started = Instant::now();
    let checker = model.clone().checker().threads(threads).spawn_bfs().join();
    let seconds = started.elapsed().as_secs_f64();
    let states = checker.unique_state_count();
    let generated = checker.state_count();
    let found: Vec<(PropertyId, Option<Trace>)> = model
        .properties
        .iter()
        .map(|&p| (p, checker.discovery(p.as_str()).map(|path| path.into_vec())))
        .collect();
    let mut shortest_traces = if shortest {
        let violated: Vec<PropertyId> = found
            .iter()
            .filter(|(_, t)| t.is_some())
            .map(|(p, _)| *p)
            .collect();
        shortest_counterexamples(&model, &violated)?
    } else {
        BTreeMap::new()
    };
    let mut cells = Vec::new();
    for (property, trace) in found {
        let (verdict, trace) = match trace {
            None => (Verdict::Holds, None),
            Some(trace) => (
                Verdict::Violated,
                Some(shortest_traces.remove(&property).unwrap_or(trace)),
            ),
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
    Ok(Run {
        cells,
        states,
        generated,
        seconds,
        broken,
        cached: false,
    })
}

/// Fingerprints are already hashes: the map of parents uses them as they are.
#[derive(Clone, Copy, Debug, Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Parents = HashMap<u64, Option<(u64, usize)>, std::hash::BuildHasherDefault<Identity>>;

fn fingerprint(state: &State) -> u64 {
    let mut h = DefaultHasher::new();
    state.hash(&mut h);
    h.finish()
}

/// The shortest counterexample of each property in `wanted`, by one
/// single-threaded breadth-first search over the model
/// ([`LockModel::enabled`], [`LockModel::step`], [`LockModel::holds_in`])
/// that stops when all are found.
///
/// Stateright's breadth-first checker keeps the *last* violating state it
/// meets for a property, and with several threads which one that is varies
/// from run to run. This search keeps the *first* violating state of each
/// property: no counterexample is shorter, and ties are broken by the
/// model's action order, so the trace is the same on every run. Every
/// property in `wanted` must be violated somewhere (the checker said so);
/// otherwise this is a [`CheckError::Inconsistent`].
pub fn shortest_counterexamples(
    model: &LockModel,
    wanted: &[PropertyId],
) -> Result<BTreeMap<PropertyId, Trace>, CheckError> {
    let mut found: BTreeMap<PropertyId, u64> = BTreeMap::new();
    if wanted.is_empty() {
        return Ok(BTreeMap::new());
    }
    let init = model.initial();
    let init_fp = fingerprint(&init);
    let mut parents = Parents::default();
    parents.insert(init_fp, None);
    for &p in wanted {
        if !model.holds_in(p, &init) {
            found.insert(p, init_fp);
        }
    }
    let mut queue: VecDeque<(State, u64)> = VecDeque::from([(init, init_fp)]);
    let mut actions: Vec<Action> = Vec::new();
    while found.len() < wanted.len() {
        let Some((state, fp)) = queue.pop_front() else {
            break;
        };
        actions.clear();
        model.enabled(&state, &mut actions);
        for (i, action) in actions.iter().enumerate() {
            let Some(next) = model.step(&state, action) else {
                continue;
            };
            let next_fp = fingerprint(&next);
            if parents.contains_key(&next_fp) {
                continue;
            }
            parents.insert(next_fp, Some((fp, i)));
            for &p in wanted {
                if !found.contains_key(&p) && !model.holds_in(p, &next) {
                    found.insert(p, next_fp);
                }
            }
            queue.push_back((next, next_fp));
        }
    }
    let mut traces = BTreeMap::new();
    for &p in wanted {
        let Some(&target) = found.get(&p) else {
            return Err(CheckError::Inconsistent(format!(
                "{} {}: the checker found {p} violated, the search did not",
                model.cfg.protocol, model.cfg.fault
            )));
        };
        let mut choices = Vec::new();
        let mut at = target;
        while let Some(Some((parent, i))) = parents.get(&at) {
            choices.push(*i);
            at = *parent;
        }
        choices.reverse();
        let trace = trace_from_choices(model, &choices).map_err(CheckError::Inconsistent)?;
        if trace.last().map(|(s, _)| fingerprint(s)) != Some(target) {
            return Err(CheckError::Inconsistent(
                "replay: fingerprint collision".into(),
            ));
        }
        traces.insert(p, trace);
    }
    Ok(traces)
}

/// The trace that takes, from the initial state, the `choices[k]`-th
/// enabled action ([`LockModel::enabled`]) at step `k`; an index out of
/// range or an action that does not apply is an error saying so.
pub fn trace_from_choices(model: &LockModel, choices: &[usize]) -> Result<Trace, String> {
    let mut trace: Trace = Vec::with_capacity(choices.len() + 1);
    let mut state = model.initial();
    let mut actions = Vec::new();
    for (k, &i) in choices.iter().enumerate() {
        actions.clear();
        model.enabled(&state, &mut actions);
        let action = actions.get(i).cloned().ok_or_else(|| {
            format!(
                "step {k}: action {i} of {} enabled does not exist",
                actions.len()
            )
        })?;
        let next = model
            .step(&state, &action)
            .ok_or_else(|| format!("step {k}: action {i} does not apply"))?;
        trace.push((state, Some(action)));
        state = next;
    }
    trace.push((state, None));
    Ok(trace)
}

/// The index of each action of `trace` among the actions enabled in its
/// state ([`LockModel::enabled`]): what [`trace_from_choices`] replays.
pub fn choices_of(model: &LockModel, trace: &Trace) -> Result<Vec<usize>, String> {
    let mut actions = Vec::new();
    let mut choices = Vec::with_capacity(trace.len());
    for (k, (state, action)) in trace.iter().enumerate() {
        let Some(action) = action else { continue };
        actions.clear();
        model.enabled(state, &mut actions);
        let i = actions
            .iter()
            .position(|a| a == action)
            .ok_or_else(|| format!("step {k}: the action is not enabled in its state"))?;
        choices.push(i);
    }
    Ok(choices)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_map_keeps_the_job_order_and_reports_each_job() {
        let jobs: Vec<u64> = (0..40).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let out = par_map(
            &jobs,
            3,
            |&j| {
                // Later jobs finish sooner, so completion order differs.
                std::thread::sleep(std::time::Duration::from_millis(40 - j));
                Ok::<u64, ()>(j * j)
            },
            |n, &j, &r| seen.lock().unwrap().push((n, j, r)),
        )
        .unwrap();
        assert_eq!(out, jobs.iter().map(|j| j * j).collect::<Vec<_>>());
        let mut seen = seen.into_inner().unwrap();
        let counts: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(counts, (1..=40).collect::<Vec<_>>());
        seen.sort_by_key(|s| s.1);
        assert!(seen.iter().all(|&(_, j, r)| r == j * j));
    }

    #[test]
    fn par_map_stops_at_the_first_error() {
        let jobs: Vec<u32> = (0..1000).collect();
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let out = par_map(
            &jobs,
            2,
            |&j| {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if j == 5 {
                    Err(format!("job {j} failed"))
                } else {
                    Ok(j)
                }
            },
            |_, _, _| {},
        );
        assert_eq!(out, Err("job 5 failed".to_owned()));
        assert!(ran.into_inner() < 100, "workers kept taking jobs");
    }

    #[test]
    fn largest_first_puts_redlock_first() {
        let cells: Vec<(ProtocolId, Fault)> = ProtocolId::all()
            .flat_map(|p| Fault::COLUMNS.into_iter().map(move |f| (p, f)))
            .collect();
        let order = largest_first(&cells);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..cells.len()).collect::<Vec<_>>(),
            "a permutation"
        );
        let redlock = order
            .iter()
            .take_while(|&&i| cells[i].0 == ProtocolId::Redlock)
            .count();
        assert_eq!(redlock, Fault::COLUMNS.len());
        // The rest keep their order.
        assert!(order[redlock..].windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_panicking_job_stops_the_other_workers() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        /// Set when the panicking job's frame unwinds: after the panic
        /// hook, however long that takes (a backtrace in CI).
        struct Unwound<'a>(&'a AtomicBool);
        impl Drop for Unwound<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let jobs: Vec<u32> = (0..1000).collect();
        let unwound = AtomicBool::new(false);
        let started_after = AtomicUsize::new(0);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            par_map(
                &jobs,
                2,
                |&j| {
                    if unwound.load(Ordering::SeqCst) {
                        started_after.fetch_add(1, Ordering::SeqCst);
                    }
                    if j == 5 {
                        let _unwound = Unwound(&unwound);
                        panic!("job 5 panics");
                    }
                    // The jobs after the panicking one wait for it to
                    // unwind (up to 20 s), so that the other worker is
                    // still taking jobs when it has.
                    let waited = std::time::Instant::now();
                    while j > 5
                        && !unwound.load(Ordering::SeqCst)
                        && waited.elapsed() < std::time::Duration::from_secs(20)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Ok::<u32, ()>(j)
                },
                |_, _, _| {},
            )
        }));
        assert!(out.is_err(), "the panic reaches the caller");
        // The other worker may take one job between the panicking job's
        // unwinding and the stop; without the stop it takes all the rest.
        let after = started_after.into_inner();
        assert!(
            after <= 2,
            "workers kept taking jobs after the panic: {after}"
        );
    }
}
