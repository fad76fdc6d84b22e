//! # lockwright-bench
//!
//! One command, `cargo run --release -p lockwright-bench`, starts its own
//! local `redis-server` processes, measures the adapter beside rslock and a
//! raw redis-rs loop, the contention handoff, the "Redis in Action"
//! marketplace, the cache-stampede guard and the model checker, prints
//! progress on stderr and writes `docs/benchmarks.md`.
//!
//! The default run takes about 3–4 minutes (each marketplace mix alone runs
//! 10 s). Flags: `--quick` (short windows, about 30 s, no model checking,
//! written to `target/benchmarks-quick.md`), `--model` (check the model even with
//! `--quick`), `--no-model`, `--model-cap SECS` (per protocol × fault run,
//! default 20), `--out PATH`.

mod allocs;
mod contention;
mod market;
mod model_run;
mod points;
mod report;
mod scale;
mod stampede;
mod throughput;
mod util;

use lockwright_tests::RedisServer;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use util::{BenchError, Result};

/// Every allocation is counted (section 1's allocations per cycle).
#[global_allocator]
static ALLOCATOR: allocs::Counting = allocs::Counting;

/// What the command line asked for.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `--quick`.
    pub(crate) quick: bool,
    /// Check the model.
    pub(crate) model: bool,
    /// Cap per model run.
    pub(crate) model_cap: Duration,
    /// Where the report goes.
    pub(crate) out: PathBuf,
    /// Warm-up before each throughput and contention window.
    pub(crate) warmup: Duration,
    /// Each throughput point's window.
    pub(crate) window: Duration,
    /// Each contention configuration's window.
    pub(crate) contention_window: Duration,
    /// Each marketplace run.
    pub(crate) market_window: Duration,
    /// Stampede rounds.
    pub(crate) stampede_rounds: usize,
    /// Stampede readers.
    pub(crate) stampede_readers: usize,
    /// The command line, for the report.
    pub(crate) command: String,
    /// Section 5: the hold counts.
    pub(crate) scale_counts: Vec<usize>,
    /// Section 5: the TTL of the renewing holds.
    pub(crate) scale_ttl: Duration,
    /// Section 5: the window over which renewals are counted.
    pub(crate) scale_window: Duration,
    /// `--point`: measure only these section-1 points.
    pub(crate) points: Vec<points::Spec>,
    /// `--rounds`: how many times each `--point` is measured.
    pub(crate) rounds: usize,
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

fn parse_args(args: &[String]) -> Result<Settings> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut s = Settings {
        quick,
        model: !quick,
        model_cap: Duration::from_secs(20),
        out: workspace_root().join(if quick {
            "target/benchmarks-quick.md"
        } else {
            "docs/benchmarks.md"
        }),
        warmup: Duration::from_millis(if quick { 150 } else { 300 }),
        window: Duration::from_millis(if quick { 500 } else { 2000 }),
        contention_window: Duration::from_millis(if quick { 1000 } else { 2500 }),
        market_window: Duration::from_millis(if quick { 700 } else { 10_000 }),
        stampede_rounds: if quick { 2 } else { 5 },
        stampede_readers: 32,
        command: if quick {
            "cargo run --release -p lockwright-bench -- --quick".into()
        } else {
            "cargo run --release -p lockwright-bench".into()
        },
        scale_counts: if quick {
            vec![1_000, 10_000]
        } else {
            vec![1_000, 10_000, 100_000]
        },
        scale_ttl: Duration::from_secs(if quick { 6 } else { 30 }),
        scale_window: Duration::from_secs(if quick { 6 } else { 30 }),
        points: Vec::new(),
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {}
            "--model" => s.model = true,
            "--no-model" => s.model = false,
            "--model-cap" => {
                let secs: u64 = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| BenchError("--model-cap needs whole seconds".into()))?;
                s.model_cap = Duration::from_secs(secs);
            }
            "--out" => {
                s.out = it
                    .next()
                    .map(PathBuf::from)
                    .ok_or_else(|| BenchError("--out needs a path".into()))?;
            }
            "--scale" => {
                let text = it
                    .next()
                    .ok_or_else(|| BenchError("--scale needs hold counts, e.g. 1000,10000".into()))?;
                s.scale_counts = text
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().ok().filter(|&n| (1..=1_000_000).contains(&n)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        BenchError(format!(
                            "--scale {text:?}: hold counts from 1 to 1000000, separated by commas"
                        ))
                    })?;
                s.scale_counts.sort_unstable();
                s.scale_counts.dedup();
            }
            "--point" => {
                let text = it
                    .next()
                    .ok_or_else(|| BenchError("--point needs WHO:MASTERS:TASKS".into()))?;
                s.points.push(points::parse(text)?);
            }
            "--rounds" => {
                s.rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n: &usize| n >= 1)
                    .ok_or_else(|| BenchError("--rounds needs a whole number ≥ 1".into()))?;
            }
            "--help" | "-h" => {
                return Err(BenchError(
                    "usage: lockwright-bench [--quick] [--model | --no-model] [--model-cap SECS] [--scale COUNTS] [--out PATH]\n       lockwright-bench [--quick] --point WHO:MASTERS:TASKS [--point ...] [--rounds N]"
                        .into(),
                ))
            }
            other => return Err(BenchError(format!("unknown argument {other:?} (try --help)"))),
        }
    }
    Ok(s)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The child side of the scale section.
    if args.first().map(String::as_str) == Some("--scale-cell") {
        return match scale::run_cell(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    // The child side of the model section.
    if args.first().map(String::as_str) == Some("--model-cell") {
        let threads = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(1);
        return match (args.get(1), args.get(2)) {
            (Some(p), Some(f)) => match model_run::run_cell(p, f, threads) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            },
            _ => ExitCode::FAILURE,
        };
    }
    match parse_args(&args).and_then(run) {
        Ok(Some(path)) => {
            eprintln!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockwright-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start_servers(n: usize) -> Result<Vec<RedisServer>> {
    (0..n)
        .map(|_| RedisServer::start().map_err(|e| BenchError::new("redis-server", e)))
        .collect()
}

fn run(settings: Settings) -> Result<Option<PathBuf>> {
    let started = std::time::Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    eprintln!("starting 5 redis-server masters");
    let masters = start_servers(5)?;
    if !settings.points.is_empty() {
        runtime.block_on(points::run(
            &settings.points,
            settings.rounds,
            settings.warmup,
            settings.window,
            &masters,
        ))?;
        return Ok(None);
    }
    let mut report = report::Report::new(settings.clone());
    runtime.block_on(report::run_redis_sections(&settings, &masters, &mut report))?;
    drop(masters);
    drop(runtime);
    if settings.model {
        eprintln!(
            "model checking: every protocol under every matrix column, each run capped at {} s",
            settings.model_cap.as_secs()
        );
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        report.model = Some(model_run::run_matrix(settings.model_cap, threads)?);
        report.model_threads = threads;
    }
    report.wall = started.elapsed();
    let text = report.render();
    if let Some(dir) = settings.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&settings.out, text)?;
    Ok(Some(settings.out))
}
