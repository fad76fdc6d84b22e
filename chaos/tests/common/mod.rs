//! What every scenario shares: the environment check, the model's verdict
//! for a cell, and the results rows.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use lockwright_chaos::report::{self, Row};
use lockwright_chaos::{check_environment, Availability, History, Observed, Op};
use lockwright_core::locks::fenced::FencedResource;
use lockwright_core::{Fence, ProtocolId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::{Fault, PropertyId};

/// True when the test should run; prints the reason and returns false when it
/// should skip; fails the test when `CI` is set and Docker or the image is
/// missing.
pub fn docker_ready() -> bool {
    match check_environment() {
        Ok(Availability::Ready) => true,
        Ok(Availability::Skip(_)) => false,
        Err(error) => panic!("chaos tests require Docker and the image in CI: {error}"),
    }
}

/// The model checker's verdict for one cell.
///
/// The checker runs in-process (`matrix::check`, one thread), once per
/// (protocol, fault) and process; its verdicts are also kept on disk under
/// the target directory, keyed by a fingerprint of the core's and the
/// model's sources, because RedLock's cells take tens of seconds in a debug
/// build. Any change to either crate's sources computes them afresh.
pub fn model_verdict(protocol: &str, fault: &str, property: &str) -> Verdict {
    let property = PropertyId::from_str(property).expect("a model property");
    let verdicts = model_run(protocol, fault);
    verdicts
        .iter()
        .find(|(p, _)| *p == property)
        .map(|(_, verdict)| *verdict)
        .expect("every property has a cell")
}

/// Starts computing the model's verdicts for `cells` in the background, so
/// that the checker runs while the containers are faulted.
pub fn prefetch_model(cells: &[(&'static str, &'static str)]) {
    for &(protocol, fault) in cells {
        std::thread::spawn(move || {
            model_run(protocol, fault);
        });
    }
}

type Verdicts = Vec<(PropertyId, Verdict)>;
/// One slot per (protocol, fault): whoever locks it first runs the checker.
type Slot = Arc<Mutex<Option<Verdicts>>>;

fn model_run(protocol: &str, fault: &str) -> Verdicts {
    static RUNS: OnceLock<Mutex<HashMap<(String, String), Slot>>> = OnceLock::new();
    let slot = RUNS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry((protocol.to_owned(), fault.to_owned()))
        .or_default()
        .clone();
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(verdicts) = &*slot {
        return verdicts.clone();
    }
    let cache = model_cache_dir().join(format!("{protocol}.{fault}.txt"));
    let verdicts = read_verdicts(&cache).unwrap_or_else(|| {
        let id = ProtocolId::from_str(protocol).expect("a catalogue protocol");
        let fault_id = Fault::from_str(fault).expect("a model fault");
        let started = std::time::Instant::now();
        let run = matrix::check(id, fault_id, 1, false).expect("the model builds");
        eprintln!(
            "model: ({protocol}, {fault}) checked in {:.1} s, {} states",
            started.elapsed().as_secs_f64(),
            run.states
        );
        let verdicts: Verdicts = run
            .cells
            .iter()
            .map(|cell| (cell.property, cell.verdict))
            .collect();
        let text: String = verdicts
            .iter()
            .map(|(property, verdict)| format!("{} {}\n", property.as_str(), verdict.as_str()))
            .collect();
        let _ = std::fs::create_dir_all(model_cache_dir());
        let _ = std::fs::write(&cache, text);
        verdicts
    });
    *slot = Some(verdicts.clone());
    verdicts
}

fn read_verdicts(path: &Path) -> Option<Verdicts> {
    let text = std::fs::read_to_string(path).ok()?;
    let verdicts: Option<Verdicts> = text
        .lines()
        .map(|line| {
            let (property, verdict) = line.split_once(' ')?;
            let verdict = match verdict {
                "holds" => Verdict::Holds,
                "violated" => Verdict::Violated,
                _ => return None,
            };
            Some((PropertyId::from_str(property).ok()?, verdict))
        })
        .collect();
    verdicts.filter(|v| v.len() == PropertyId::ALL.len())
}

/// `<target tmp>/model-verdicts/<fingerprint of core/src and model/src>`.
fn model_cache_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["core/src", "model/src"] {
            collect_files(&root.join(dir), &mut files);
        }
        files.sort();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for file in &files {
            file.hash(&mut hasher);
            std::fs::read(file).unwrap_or_default().hash(&mut hasher);
        }
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("model-verdicts")
            .join(format!("{:016x}", hasher.finish()))
    })
    .clone()
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// One scenario's outcome for one model cell.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub scenario: String,
    pub protocol: &'static str,
    pub fault: &'static str,
    pub property: &'static str,
    pub observed: Observed,
    pub detail: String,
}

impl Outcome {
    /// The outcome of `property` in `history` (with `limit` holders allowed).
    pub fn from_history(
        scenario: &str,
        protocol: &'static str,
        fault: &'static str,
        property: &'static str,
        history: &History,
        limit: usize,
        clean_detail: &str,
    ) -> Self {
        let observed = history.verdict(property, limit);
        let detail = match &observed {
            Observed::Violated(reason) => reason.clone(),
            Observed::Holds => clean_detail.to_owned(),
        };
        Self {
            scenario: scenario.to_owned(),
            protocol,
            fault,
            property,
            observed,
            detail,
        }
    }
}

/// Prints the rows of one scenario, and asserts that each observation is the one the scenario set out
/// to show (`want`) and the one the model predicts.
pub fn report(file: &str, outcomes: &[(Outcome, &str)]) {
    let rows: Vec<Row> = outcomes
        .iter()
        .map(|(outcome, _)| Row {
            scenario: outcome.scenario.clone(),
            protocol: outcome.protocol.to_owned(),
            fault: outcome.fault.to_owned(),
            property: outcome.property.to_owned(),
            expected: model_verdict(outcome.protocol, outcome.fault, outcome.property)
                .as_str()
                .to_owned(),
            observed: outcome.observed.as_str().to_owned(),
            detail: outcome.detail.clone(),
        })
        .collect();
    assert!(
        !rows.is_empty(),
        "{file}: a scenario with no rows shows nothing"
    );
    eprintln!("\n{file}:\n{}", report::table(&rows));
    for ((outcome, want), row) in outcomes.iter().zip(&rows) {
        assert_eq!(
            outcome.observed.as_str(),
            *want,
            "{}: wanted {want}, observed {}",
            outcome.scenario,
            outcome.observed
        );
        assert!(
            row.agrees(),
            "{}: the model says {} for ({}, {}, {}), observed {}",
            row.scenario,
            row.expected,
            row.protocol,
            row.fault,
            row.property,
            outcome.observed
        );
    }
}

/// Sleeps on the tokio clock.
pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The protected resource: a fenced one refuses writes older than the newest
/// fence it accepted; a plain one accepts every write.
#[derive(Debug)]
pub enum Resource {
    /// Checks fences.
    Fenced(FencedResource<String>),
    /// Accepts everything.
    Plain(Vec<String>),
}

impl Resource {
    /// A resource for `protocol`: fenced when the protocol issues fences.
    pub fn for_protocol(protocol: &str) -> Self {
        if matches!(protocol, "fenced" | "lease-semaphore") {
            Resource::Fenced(FencedResource::new())
        } else {
            Resource::Plain(Vec::new())
        }
    }

    /// Writes `value` with `fence` and records it; returns whether it was
    /// accepted.
    pub fn write(
        &mut self,
        history: &History,
        client: &str,
        fence: Option<u64>,
        value: &str,
    ) -> bool {
        let accepted = match (self, fence) {
            (Resource::Fenced(resource), Some(fence)) => {
                resource.write(Fence(fence), value.to_owned()).is_ok()
            }
            // A fenced resource refuses a write without a fence.
            (Resource::Fenced(_), None) => false,
            (Resource::Plain(values), _) => {
                values.push(value.to_owned());
                true
            }
        };
        history.record(client, Op::Write { fence, accepted });
        accepted
    }
}

/// A lock guard's fence as a number.
pub fn fence_of(guard: &lockwright_redis::LockGuard) -> Option<u64> {
    guard.fence().map(|fence| fence.0)
}

/// A redis client for each URL.
pub fn clients(urls: &[String]) -> Vec<redis::Client> {
    urls.iter()
        .map(|url| redis::Client::open(url.as_str()).expect("a valid URL"))
        .collect()
}

/// A `try_acquire` that did not grant: `Ok(None)`, or `Unavailable` when
/// some master could not be reached (the adapter reports the last I/O error
/// with the denial).
pub fn is_denied(
    result: &Result<Option<lockwright_redis::LockGuard>, lockwright_redis::Error>,
) -> bool {
    matches!(
        result,
        Ok(None) | Err(lockwright_redis::Error::Unavailable(_))
    )
}

impl Outcome {
    /// Puts `prefix` before the detail.
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.detail = format!("{prefix}{}", self.detail);
        self
    }
}

/// The model's shortest counterexample for a cell, as text (`None` when the
/// property holds there).
pub fn model_counterexample(protocol: &str, fault: &str, property: &str) -> Option<String> {
    let protocol = ProtocolId::from_str(protocol).expect("a catalogue protocol");
    let fault = Fault::from_str(fault).expect("a model fault");
    let property = PropertyId::from_str(property).expect("a model property");
    let run = matrix::check(protocol, fault, 1, true).expect("the model builds");
    let cell = run
        .cells
        .into_iter()
        .find(|cell| cell.property == property)?;
    let model = matrix::cell_model(protocol, fault, property).expect("the model builds");
    cell.trace
        .map(|steps| lockwright_model::trace::text(&model, &steps))
}

/// Release a hold whose view includes masters nobody can reach: the
/// release runs on the others, and on those its outcome is unknown, which
/// the adapter reports as such ([`lockwright_redis::Error::OutcomeUnknown`]).
pub async fn release_with_unreachable(guard: lockwright_redis::LockGuard) {
    match guard.release().await {
        Ok(_) | Err(lockwright_redis::Error::OutcomeUnknown { .. }) => {}
        Err(e) => panic!("release: {e}"),
    }
}
