//! Section 6: the verdict matrix through `lockwright_model::matrix::check`.
//!
//! Each (protocol, fault) run happens in a child process (this binary with
//! `--model-cell`), so a run that exceeds the cap can be stopped and
//! reported as skipped instead of stretching the whole benchmark.

use crate::util::{BenchError, Result};
use lockwright_core::ProtocolId;
use lockwright_model::fault::Fault;
use lockwright_model::matrix::{self, Verdict};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One (protocol, fault) run.
#[derive(Clone, Debug)]
pub(crate) struct ModelCell {
    /// Protocol id.
    pub(crate) protocol: String,
    /// Fault id.
    pub(crate) fault: String,
    /// What came of it.
    pub(crate) outcome: CellOutcome,
}

/// A run's result.
#[derive(Clone, Debug)]
pub(crate) enum CellOutcome {
    /// Finished: unique states, generated states, checker seconds, violated properties.
    Done {
        states: u64,
        generated: u64,
        seconds: f64,
        violated: u32,
    },
    /// Stopped at the cap.
    Skipped(Duration),
    /// The child failed.
    Failed(String),
}

/// The child's side: check one cell and print one line.
pub(crate) fn run_cell(protocol: &str, fault: &str, threads: usize) -> Result<()> {
    let p: ProtocolId = protocol
        .parse()
        .map_err(|e| BenchError::new("protocol", e))?;
    let f: Fault = fault.parse().map_err(|e| BenchError::new("fault", e))?;
    let run = matrix::check(p, f, threads, false).map_err(|e| BenchError::new("check", e))?;
    let violated = run
        .cells
        .iter()
        .filter(|c| c.verdict == Verdict::Violated)
        .count();
    println!(
        "cell {} {} {:.4} {}",
        run.states, run.generated, run.seconds, violated
    );
    Ok(())
}

fn parse_line(out: &str) -> Option<CellOutcome> {
    let line = out.lines().find(|l| l.starts_with("cell "))?;
    let mut f = line.split_whitespace().skip(1);
    Some(CellOutcome::Done {
        states: f.next()?.parse().ok()?,
        generated: f.next()?.parse().ok()?,
        seconds: f.next()?.parse().ok()?,
        violated: f.next()?.parse().ok()?,
    })
}

/// Every protocol under every matrix column, each capped at `cap`.
pub(crate) fn run_matrix(cap: Duration, threads: usize) -> Result<Vec<ModelCell>> {
    let exe = std::env::current_exe()?;
    let protocols: Vec<ProtocolId> = ProtocolId::all().collect();
    let total = protocols.len() * Fault::COLUMNS.len();
    let mut cells = Vec::new();
    for p in &protocols {
        for f in Fault::COLUMNS {
            let mut child = Command::new(&exe)
                .args(["--model-cell", p.as_str(), f.as_str(), &threads.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let started = Instant::now();
            let outcome = loop {
                if let Some(status) = child.try_wait()? {
                    let mut out = String::new();
                    let mut err = String::new();
                    if let Some(mut s) = child.stdout.take() {
                        s.read_to_string(&mut out)?;
                    }
                    if let Some(mut s) = child.stderr.take() {
                        s.read_to_string(&mut err)?;
                    }
                    break match (status.success(), parse_line(&out)) {
                        (true, Some(done)) => done,
                        _ => CellOutcome::Failed(format!(
                            "exit {status}: {}",
                            err.lines().last().unwrap_or("")
                        )),
                    };
                }
                if started.elapsed() > cap {
                    child.kill()?;
                    child.wait()?;
                    break CellOutcome::Skipped(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let n = cells.len() + 1;
            match &outcome {
                CellOutcome::Done {
                    states, seconds, ..
                } => eprintln!(
                    "  model [{n:>3}/{total}] {p:<22} {f:<12} {states:>9} states {seconds:>6.2} s"
                ),
                CellOutcome::Skipped(d) => eprintln!(
                    "  model [{n:>3}/{total}] {p:<22} {f:<12} skipped after {:.0} s",
                    d.as_secs_f64()
                ),
                CellOutcome::Failed(e) => {
                    eprintln!("  model [{n:>3}/{total}] {p:<22} {f:<12} failed: {e}")
                }
            }
            cells.push(ModelCell {
                protocol: p.as_str().to_owned(),
                fault: f.as_str().to_owned(),
                outcome,
            });
        }
    }
    Ok(cells)
}
