//! Many runs, their table against the model, and the mutation checks:
//! what the `nemesis` binary and `tests/nemesis.rs` share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use lockwright_core::ProtocolId;
use lockwright_model::matrix::Verdict;
use lockwright_model::PropertyId;

use super::run::{model_verdict, run, Observed, RunConfig, RunReport};
use super::Mutation;
use crate::ChaosError;
use lockwright_model::Fault;

/// The properties the nemesis judges (each only where
/// [`RunReport::observed`] can).
pub const JUDGED: [PropertyId; 4] = [
    PropertyId::MutualExclusion,
    PropertyId::FencedResource,
    PropertyId::OwnerOnly,
    PropertyId::Progress,
];

/// How long a run of `fault` lasts: at least what was asked, four TTLs
/// and a second (the faults stop two TTLs before the end and an aimed
/// fault may wait a TTL for its target), twelve TTLs after a crash (a
/// healthy stretch of four TTLs to judge progress in, two TTLs after the
/// crash), for a failover 30 s or four TTLs (it waits a TTL after its
/// replication cut before it kills), and for a split brain 15 s and seven
/// TTLs (the old master is made a replica some 10 s after the heal).
pub fn run_duration(fault: Fault, asked: Duration, ttl_ms: u64) -> Duration {
    let ttls = |n: u64| Duration::from_millis(ttl_ms.saturating_mul(n));
    let floor = match fault {
        Fault::None => Duration::ZERO,
        Fault::Crash => ttls(12),
        Fault::Failover | Fault::FailoverClockLag => Duration::from_secs(30).max(ttls(4)),
        // A second before the cut, a promotion of one to two seconds, the
        // split for up to three TTLs, the demotion (Sentinel reconfigures
        // the old master only once it has seen it report itself as master
        // for four publish periods, 8 s, so about 10 s after the heal),
        // then a stretch of four TTLs with one master again.
        Fault::SplitBrain => Duration::from_secs(15) + ttls(7),
        _ => ttls(4) + Duration::from_secs(1),
    };
    asked.max(floor)
}

/// Settings shared by every run of a campaign.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Client containers per run.
    pub clients: usize,
    /// How long the clients of one run loop.
    pub run_duration: Duration,
    /// Lease TTL.
    pub ttl_ms: u64,
    /// First seed; run `i` uses `seed + i`.
    pub seed: u64,
    /// The `nemesis-client` binary.
    pub client_binary: PathBuf,
    /// Permits of `lease-semaphore` (the other semaphores run with one).
    /// At 1 its fenced resource is judged as the model judges it.
    pub lease_semaphore_limit: u32,
}

impl Settings {
    /// The configuration of one run. A failover run lasts at least 30 s
    /// with a TTL of at least 8 s: the Sentinels take one to two seconds
    /// to promote the replica, a holder that entered before the master
    /// died must still be inside its section (a fifth to two fifths of the
    /// TTL) when a contender gets in on the new master, and the kill waits
    /// a TTL after the replication cut. A split brain keeps the TTL asked
    /// for: both masters serve their sides for two to three TTLs after the
    /// promotion, however long it took.
    pub fn config(
        &self,
        protocol: ProtocolId,
        fault: Fault,
        seed: u64,
        mutation: Mutation,
    ) -> RunConfig {
        let ttl_ms = if matches!(fault, Fault::Failover | Fault::FailoverClockLag) {
            self.ttl_ms.max(8000)
        } else {
            self.ttl_ms
        };
        RunConfig {
            protocol,
            fault,
            clients: self.clients,
            duration: run_duration(fault, self.run_duration, ttl_ms),
            ttl_ms,
            limit: if protocol == ProtocolId::LeaseSemaphore {
                self.lease_semaphore_limit.max(1)
            } else {
                1
            },
            seed,
            mutation,
            client_binary: self.client_binary.clone(),
        }
    }
}

/// Where a mutation is tried: a cell whose property the model says holds
/// for the correct protocol, so a violation there is the mutation's.
pub fn mutation_cell(mutation: Mutation) -> (ProtocolId, Fault, PropertyId) {
    match mutation {
        Mutation::None | Mutation::Overstate => (
            ProtocolId::SetPxLua,
            Fault::None,
            PropertyId::MutualExclusion,
        ),
        Mutation::PlainDel => (ProtocolId::SetPxLua, Fault::Pause, PropertyId::OwnerOnly),
        Mutation::NoFence => (ProtocolId::Fenced, Fault::Pause, PropertyId::FencedResource),
        Mutation::IgnoreLost => (
            ProtocolId::Reentrant,
            Fault::Partition,
            PropertyId::MutualExclusion,
        ),
    }
}

/// How a cell's observations compare with the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Both say holds, or both say violated.
    Agree,
    /// The model says violated; no run found it (not a failure).
    NotFound,
    /// The model says holds and a run found a violation: the evidence.
    Disagree(String),
    /// The model says holds, a run found a violation, and the cell is one
    /// of the model's known gaps of its bounds
    /// ([`lockwright_model::matrix::BOUND_GAPS`]: a wider model run finds
    /// it violated too). Reported, not a failure of the run.
    BeyondModelBounds(String),
}

/// One row of the table: a (protocol, fault, property) cell over its runs.
#[derive(Clone, Debug)]
pub struct Row {
    /// Protocol.
    pub protocol: ProtocolId,
    /// Fault class.
    pub fault: Fault,
    /// Property.
    pub property: PropertyId,
    /// Runs of this cell.
    pub runs: usize,
    /// Operations recorded by the clients.
    pub operations: usize,
    /// Of which indeterminate.
    pub indeterminate: usize,
    /// Runs that found a violation.
    pub found: usize,
    /// The model's verdict.
    pub model: Verdict,
    /// Agreement.
    pub agreement: Agreement,
    /// Seed of the first run that found a violation.
    pub seed: Option<u64>,
    /// Which run of the cell (1 for its first) first found a violation.
    pub first_found: Option<usize>,
}

/// Aggregates runs into rows (judged properties only).
pub fn rows(reports: &[RunReport]) -> Vec<Row> {
    let mut rows: BTreeMap<(String, Fault, usize), Row> = BTreeMap::new();
    for report in reports {
        let config = &report.config;
        for (index, property) in JUDGED.into_iter().enumerate() {
            let observed = report.observed(property);
            if observed == Observed::NotJudged {
                continue;
            }
            let model = model_verdict(config.protocol, config.fault, property);
            let row = rows
                .entry((config.protocol.as_str().to_owned(), config.fault, index))
                .or_insert_with(|| Row {
                    protocol: config.protocol,
                    fault: config.fault,
                    property,
                    runs: 0,
                    operations: 0,
                    indeterminate: 0,
                    found: 0,
                    model,
                    agreement: if model == Verdict::Violated {
                        Agreement::NotFound
                    } else {
                        Agreement::Agree
                    },
                    seed: None,
                    first_found: None,
                });
            row.runs += 1;
            row.operations += report.operations;
            row.indeterminate += report.indeterminate;
            if let Observed::Violated(excerpt) = observed {
                row.found += 1;
                row.seed.get_or_insert(config.seed);
                row.first_found.get_or_insert(row.runs);
                match model {
                    Verdict::Violated => row.agreement = Agreement::Agree,
                    Verdict::Holds if row.agreement == Agreement::Agree => {
                        let evidence = format!(
                            "seed {}: {excerpt}; faults: {}",
                            config.seed,
                            report.faults.join("; ")
                        );
                        let gap = lockwright_model::matrix::bound_gap(
                            config.protocol,
                            config.fault,
                            property,
                        );
                        row.agreement = match gap {
                            Some(_) => Agreement::BeyondModelBounds(evidence),
                            None => Agreement::Disagree(evidence),
                        };
                    }
                    Verdict::Holds => {}
                }
            }
        }
    }
    rows.into_values().collect()
}

/// The cells of the runs' (protocol, fault) pairs that the model says are
/// violated and that the nemesis did not judge in any run (owner-only
/// outside pauses and delays, progress where no healthy stretch was long
/// enough, the fenced resource of a semaphore), as a paragraph for the
/// table's reader; empty when there are none.
pub fn unjudged(reports: &[RunReport]) -> String {
    let mut cells: BTreeMap<(String, &'static str, &'static str), ()> = BTreeMap::new();
    for report in reports {
        let config = &report.config;
        for property in JUDGED {
            let never = reports
                .iter()
                .filter(|r| r.config.protocol == config.protocol && r.config.fault == config.fault)
                .all(|r| r.observed(property) == Observed::NotJudged);
            if never && model_verdict(config.protocol, config.fault, property) == Verdict::Violated
            {
                cells.insert(
                    (
                        config.protocol.as_str().to_owned(),
                        config.fault.as_str(),
                        property.as_str(),
                    ),
                    (),
                );
            }
        }
    }
    if cells.is_empty() {
        return String::new();
    }
    let list: Vec<String> = cells
        .keys()
        .map(|(p, f, q)| format!("{p} × {f} × {q}"))
        .collect();
    format!(
        "Violated in the model, not judged by these runs: {}.\n",
        list.join(", ")
    )
}

/// A mutation's outcome.
#[derive(Clone, Debug)]
pub struct MutationRow {
    /// The mutation.
    pub mutation: Mutation,
    /// Where it was tried.
    pub cell: (ProtocolId, Fault, PropertyId),
    /// Runs tried.
    pub runs: usize,
    /// The evidence of the first run that caught it.
    pub caught: Option<String>,
}

/// Runs `mutation` in its cell, up to `attempts` runs (seeds `seed`,
/// `seed + 1`, ...), until one shows a violation of the cell's property.
pub async fn run_mutation(
    settings: &Settings,
    mutation: Mutation,
    attempts: usize,
    mut progress: impl FnMut(&RunReport),
) -> Result<MutationRow, ChaosError> {
    let cell = mutation_cell(mutation);
    let (protocol, fault, property) = cell;
    let mut row = MutationRow {
        mutation,
        cell,
        runs: 0,
        caught: None,
    };
    for attempt in 0..attempts {
        let seed = settings.seed.wrapping_add(attempt as u64);
        let report = run(&settings.config(protocol, fault, seed, mutation)).await?;
        row.runs += 1;
        progress(&report);
        if let Observed::Violated(excerpt) = report.observed(property) {
            row.caught = Some(format!("seed {seed}: {excerpt}"));
            break;
        }
    }
    Ok(row)
}

/// Runs every future of `jobs`, at most `at_once` at a time, each on a
/// task of its own, and returns their outputs in the order given.
///
/// Nemesis runs are independent (each has its own network, subnet,
/// containers, rules and files), and most of a run is waiting: for its
/// clients to loop for their duration, for a fault's next step, for a
/// failover. Side by side, the runs keep every fault real; what they
/// share is the host's CPU, which is why `at_once` stays small.
pub async fn run_side_by_side<T: Send + 'static>(
    jobs: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
    at_once: usize,
) -> Result<Vec<T>, ChaosError> {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(at_once.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (index, job) in jobs.into_iter().enumerate() {
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (index, job.await)
        });
    }
    let mut done = Vec::new();
    while let Some(joined) = set.join_next().await {
        done.push(joined.map_err(|e| ChaosError::Harness(format!("a nemesis task: {e}")))?);
    }
    done.sort_by_key(|(index, _)| *index);
    Ok(done.into_iter().map(|(_, output)| output).collect())
}

/// The table and summary of a campaign.
pub fn table(rows: &[Row], mutations: &[MutationRow]) -> String {
    let mut out = String::from(
        "| protocol | fault | property | runs | operations | indeterminate | violations found | model | agree? |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let agree = match &row.agreement {
            Agreement::Agree => "yes".to_owned(),
            Agreement::NotFound => "not found".to_owned(),
            Agreement::Disagree(_) => "NO".to_owned(),
            Agreement::BeyondModelBounds(_) => "no: beyond the model's bounds (†)".to_owned(),
        };
        let first = row
            .first_found
            .map(|run| format!(", first in run {run}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} of {} runs{first} | {} | {} |\n",
            row.protocol.as_str(),
            row.fault.as_str(),
            row.property.as_str(),
            row.runs,
            row.operations,
            row.indeterminate,
            row.found,
            row.runs,
            row.model.as_str(),
            agree
        ));
    }
    if !mutations.is_empty() {
        out.push_str("\n| mutation | protocol | fault | property | runs | caught |\n|---|---|---|---|---|---|\n");
        for m in mutations {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                m.mutation.as_str(),
                m.cell.0.as_str(),
                m.cell.1.as_str(),
                m.cell.2.as_str(),
                m.runs,
                if m.caught.is_some() { "yes" } else { "NO" }
            ));
        }
    }
    for row in rows {
        if let Agreement::BeyondModelBounds(evidence) = &row.agreement {
            out.push_str(&format!(
                "\n- † {} × {} × {}: the model says holds at its bounds and knows it for a gap \
                 of them ({}); the nemesis found it on real Redis. Evidence: {evidence}\n",
                row.protocol.as_str(),
                row.fault.as_str(),
                row.property.as_str(),
                lockwright_model::matrix::bound_gap(row.protocol, row.fault, row.property)
                    .unwrap_or_default()
            ));
        }
    }
    out.push('\n');
    out.push_str(&summary(rows, mutations));
    out.push('\n');
    out
}

/// `nemesis: A of C cells agree with the model, K of M mutations caught`.
pub fn summary(rows: &[Row], mutations: &[MutationRow]) -> String {
    let agree = rows
        .iter()
        .filter(|r| r.agreement == Agreement::Agree)
        .count();
    let caught = mutations.iter().filter(|m| m.caught.is_some()).count();
    format!(
        "nemesis: {agree} of {} cells agree with the model, {caught} of {} mutations caught",
        rows.len(),
        mutations.len()
    )
}

/// What fails a campaign: a holds cell with a violation (with its seed and
/// evidence), an integrity finding, a mutation not caught.
pub fn failures(reports: &[RunReport], rows: &[Row], mutations: &[MutationRow]) -> Vec<String> {
    let mut out = Vec::new();
    for row in rows {
        if let Agreement::Disagree(evidence) = &row.agreement {
            out.push(format!(
                "({}, {}, {}): the model says holds, the nemesis found {evidence}",
                row.protocol.as_str(),
                row.fault.as_str(),
                row.property.as_str()
            ));
        }
    }
    for report in reports {
        for failure in report.integrity_failures() {
            out.push(format!(
                "({}, {}) seed {}: {failure}",
                report.config.protocol.as_str(),
                report.config.fault.as_str(),
                report.config.seed
            ));
        }
    }
    for m in mutations.iter().filter(|m| m.caught.is_none()) {
        out.push(format!(
            "mutation {} not caught in {} runs of ({}, {})",
            m.mutation.as_str(),
            m.runs,
            m.cell.0.as_str(),
            m.cell.1.as_str()
        ));
    }
    out
}

/// The progress line of a finished run, followed by one line per fault.
pub fn progress_line(elapsed: Duration, report: &RunReport) -> String {
    let config = &report.config;
    let mut found: Vec<&str> = report.judgement.findings.iter().map(|f| f.check).collect();
    found.sort_unstable();
    found.dedup();
    format!(
        "[{:>5.0}s] {} x {} seed {}{}: {} ops ({} acquired, {} indeterminate), {} faults, findings: {}{}",
        elapsed.as_secs_f64(),
        config.protocol.as_str(),
        config.fault.as_str(),
        config.seed,
        if config.mutation == Mutation::None {
            String::new()
        } else {
            format!(" mutation {}", config.mutation.as_str())
        },
        report.operations,
        report.acquired,
        report.indeterminate,
        report.faults.len(),
        if found.is_empty() {
            "none".to_owned()
        } else {
            found.join(", ")
        },
        report
            .faults
            .iter()
            .map(|fault| format!("\n          - {fault}"))
            .collect::<String>()
    )
}
