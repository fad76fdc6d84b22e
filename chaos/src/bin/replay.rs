//! Replays the model's counterexamples (and seeded random paths) on real
//! Redis containers.
//!
//! ```text
//! replay                              every violated cell, and 2 random paths of every run that holds
//! replay PROTOCOL FAULT               that run's violated cells
//! replay PROTOCOL FAULT PROPERTY      one cell, every step printed
//! replay PROTOCOL FAULT seed=N        one random path, every step printed
//! replay --markdown FILE              the whole suite, and its table written to FILE
//! replay --cache DIR ...              any of the above, reading and storing checked cells in DIR
//! ```
//!
//! Without `--cache`, the directory named by `LOCKWRIGHT_MATRIX_CACHE` is
//! the cache when set; with neither, every cell is checked afresh (see
//! `lockwright_model::cache`).
//!
//! Each replay executes the trace step by step on real Redis (see
//! `lockwright_chaos::replay`) and requires Redis' replies and keys to equal
//! the model's. Exit status 0 when everything agreed, 1 on a mismatch, 2 on
//! a usage or harness error.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use std::process::ExitCode;
use std::time::Instant;

use lockwright_chaos::replay::{
    cases, plan, random_path, Bench, ReplayOptions, Suite, Verdict, PATH_STEPS, SUITE_BENCHES,
};
use lockwright_chaos::{check_environment, Availability, ChaosError};
use lockwright_core::ProtocolId;
use lockwright_model::cache::Cache;
use lockwright_model::matrix::{self, Trace};
use lockwright_model::{Fault, LockModel, PropertyId};

enum Selection {
    /// Everything; the table goes to this file when given.
    All(Option<String>),
    /// One run's violated cells.
    Run(ProtocolId, Fault),
    /// One cell, verbosely.
    Cell(ProtocolId, Fault, PropertyId),
    /// One random path, verbosely.
    Path(ProtocolId, Fault, u64),
}

fn usage_text() -> String {
    format!(
        "usage: replay [--cache DIR] ([--markdown FILE] | PROTOCOL FAULT [PROPERTY | seed=N])\n\
         protocols: {}\nfaults: {}\nproperties: {}",
        ProtocolId::all()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        Fault::ALL.map(|f| f.to_string()).join(" "),
        PropertyId::ALL.map(|p| p.to_string()).join(" ")
    )
}

fn usage(error: &str) -> ExitCode {
    eprintln!("replay: {error}\n{}", usage_text());
    ExitCode::from(2)
}

/// [`say`] with `format!` arguments.
macro_rules! out {
    ($($arg:tt)*) => {
        say(&format!($($arg)*))
    };
}

/// One line to standard output; a closed pipe (`| head`) is not an error
/// worth a panic, so a failed write is dropped.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn parse(args: &[String]) -> Result<Selection, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match args {
        [] => Ok(Selection::All(None)),
        [flag, file] if flag == "--markdown" => Ok(Selection::All(Some(file.clone()))),
        [p, f, rest @ ..] if rest.len() <= 1 => {
            let protocol: ProtocolId = p.parse().map_err(|e| text(&e))?;
            let fault: Fault = f.parse().map_err(|e| text(&e))?;
            match rest.first() {
                None => Ok(Selection::Run(protocol, fault)),
                Some(arg) => match arg.strip_prefix("seed=") {
                    Some(seed) => seed
                        .parse()
                        .map(|seed| Selection::Path(protocol, fault, seed))
                        .map_err(|e| format!("seed {seed:?}: {e}")),
                    None => arg
                        .parse()
                        .map(|property| Selection::Cell(protocol, fault, property))
                        .map_err(|e| text(&e)),
                },
            }
        }
        _ => Err("unexpected arguments".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        say(&usage_text());
        return ExitCode::SUCCESS;
    }
    let (cache, args) = match args.as_slice() {
        [flag, dir, rest @ ..] if flag == "--cache" => (Some(Cache::new(dir)), rest.to_vec()),
        [flag] if flag == "--cache" => return usage("--cache needs a directory"),
        _ => (Cache::from_env(), args),
    };
    let selection = match parse(&args) {
        Ok(s) => s,
        Err(e) => return usage(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replay: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // On Ctrl-C the run future is dropped, and with it the containers.
    let interrupted = runtime.block_on(async {
        tokio::select! {
            result = run(selection, cache.as_ref()) => Some(result),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    let Some(result) = interrupted else {
        eprintln!("replay: interrupted; containers removed");
        return ExitCode::from(130);
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::from(2)
        }
    }
}

/// One replay with every step printed, then its line; `true` when it agreed.
async fn verbose(
    bench: &mut Bench,
    model: &LockModel,
    trace: &Trace,
    label: &str,
    started: Instant,
) -> Result<bool, ChaosError> {
    let r = bench.replay(model, trace, ReplayOptions::default()).await?;
    out!("{}", r.log.join("\n"));
    out!("{label}: {}", r.line(started.elapsed().as_secs_f64()));
    Ok(r.verdict == Verdict::Reproduced)
}

async fn run(selection: Selection, cache: Option<&Cache>) -> Result<bool, ChaosError> {
    if let Availability::Skip(reason) = check_environment()? {
        return Err(ChaosError::Unavailable(reason));
    }
    let started = Instant::now();
    let mut bench = Bench::new();
    match selection {
        Selection::Cell(protocol, fault, property) => {
            let Some(case) = cases(protocol, fault, cache)?
                .into_iter()
                .find(|c| c.property == property)
            else {
                out!("{protocol} × {fault} × {property} holds: there is no counterexample");
                return Ok(true);
            };
            let label = format!("{protocol} × {fault} × {property}");
            verbose(&mut bench, &case.model, &case.trace, &label, started).await
        }
        Selection::Path(protocol, fault, seed) => {
            let model = matrix::model_for(protocol, fault, PropertyId::ALL.to_vec())
                .map_err(lockwright_model::docs::DocsError::from)?;
            let trace = random_path(&model, seed, PATH_STEPS);
            let label = format!("{protocol} × {fault} seed {seed}");
            verbose(&mut bench, &model, &trace, &label, started).await
        }
        Selection::Run(protocol, fault) => {
            let mut ok = true;
            let cases = cases(protocol, fault, cache)?;
            if cases.is_empty() {
                out!("{protocol} × {fault}: every property holds, there is no counterexample to replay (try `seed=N` for a random path)");
            }
            for case in cases {
                let t = Instant::now();
                let r = bench
                    .replay(&case.model, &case.trace, ReplayOptions::default())
                    .await?;
                ok &= r.verdict == Verdict::Reproduced;
                out!(
                    "{protocol} × {fault} × {}: {}",
                    case.property,
                    r.line(t.elapsed().as_secs_f64())
                );
            }
            Ok(ok)
        }
        Selection::All(markdown) => {
            let output = |path: &String, source| ChaosError::Output {
                path: path.clone(),
                source,
            };
            if let Some(file) = &markdown {
                // Fail now, not after the whole run, when the file cannot be written.
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(file)
                    .map_err(|e| output(file, e))?;
            }
            let plan = plan(2, cache)?;
            if let Some(cache) = cache {
                let stats = cache.stats();
                for reason in &stats.rejected {
                    out!("cache: rejected {reason}");
                }
                out!(
                    "cache {}: {} runs read, {} computed and stored",
                    cache.dir().display(),
                    stats.hits,
                    stats.computed
                );
            }
            out!(
                "{} violated cells, {} runs with a property that holds; checked in {:.0} s",
                plan.violated.len(),
                plan.holds.len(),
                started.elapsed().as_secs_f64()
            );
            drop(bench);
            let mut benches: Vec<Bench> = (0..SUITE_BENCHES).map(|_| Bench::new()).collect();
            let suite = Suite::run(&mut benches, &plan, say).await?;
            out!(
                "{} ({:.0} s)",
                suite.summary(),
                started.elapsed().as_secs_f64()
            );
            if let Some(file) = markdown {
                std::fs::write(&file, suite.markdown()).map_err(|e| output(&file, e))?;
                out!("wrote {file}");
            }
            Ok(suite.mismatches().is_empty())
        }
    }
}
