//! Replays the model's shortest counterexamples on real Redis containers.
//!
//! ```text
//! cargo run --release -p lockwright-chaos --bin replay -- [PROTOCOL|all] [FAULT|all]
//! ```
//!
//! For every violated (protocol, fault, property) cell selected, it finds
//! the shortest counterexample and executes it step by step on real Redis
//! (see `lockwright_chaos::replay`), printing one line per cell, then a
//! summary. Exit status 0 when every trace was reproduced, 1 when one
//! diverged, 2 on a usage or harness error.

use std::process::ExitCode;
use std::time::Instant;

use lockwright_chaos::replay::{cases, Bench, ReplayOptions, Verdict};
use lockwright_core::ProtocolId;
use lockwright_model::Fault;

fn usage() -> ExitCode {
    eprintln!("usage: replay [PROTOCOL|all] [FAULT|all]");
    eprintln!(
        "protocols: {}",
        ProtocolId::all()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!("faults: {}", Fault::ALL.map(|f| f.to_string()).join(" "));
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() > 2 || args.iter().any(|a| a == "-h" || a == "--help") {
        return usage();
    }
    let protocols: Vec<ProtocolId> = match args.first().map(String::as_str) {
        None | Some("all") => ProtocolId::all().collect(),
        Some(p) => match p.parse() {
            Ok(p) => vec![p],
            Err(e) => {
                eprintln!("{e}");
                return usage();
            }
        },
    };
    let faults: Vec<Fault> = match args.get(1).map(String::as_str) {
        None | Some("all") => Fault::ALL.to_vec(),
        Some(f) => match f.parse() {
            Ok(f) => vec![f],
            Err(e) => {
                eprintln!("{e}");
                return usage();
            }
        },
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(&protocols, &faults)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(
    protocols: &[ProtocolId],
    faults: &[Fault],
) -> Result<bool, lockwright_chaos::ChaosError> {
    if let lockwright_chaos::Availability::Skip(reason) = lockwright_chaos::check_environment()? {
        return Err(lockwright_chaos::ChaosError::Unavailable(reason));
    }
    let started = Instant::now();
    let mut bench = Bench::new();
    let (mut reproduced, mut diverged) = (0, 0);
    for &protocol in protocols {
        for &fault in faults {
            for case in cases(protocol, fault)? {
                let t = Instant::now();
                let r = bench
                    .replay(&case.model, &case.trace, ReplayOptions::default())
                    .await?;
                match r.verdict {
                    Verdict::Reproduced => reproduced += 1,
                    Verdict::Diverged { .. } => diverged += 1,
                }
                println!(
                    "{protocol} × {fault} × {}: {} ({} steps, {} requests, {} key comparisons, {} container faults; {:.1} s)",
                    case.property,
                    r.verdict,
                    r.steps,
                    r.requests,
                    r.comparisons,
                    r.node_faults,
                    t.elapsed().as_secs_f64()
                );
            }
        }
    }
    println!(
        "{reproduced} reproduced, {diverged} diverged, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(diverged == 0)
}
