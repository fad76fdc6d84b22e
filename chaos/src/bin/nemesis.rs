//! The randomized nemesis for long runs: round after round of the chosen
//! (protocol, fault) cells with fresh seeds, then the mutations; prints a
//! progress line per run, the table and the summary line.
//!
//! ```text
//! cargo run -p lockwright-chaos --release --bin nemesis -- --minutes 10 --clients 5 --seed 1
//! ```
//!
//! Needs Docker, the local image `lockwright/redis-faketime:7`
//! (`.ci/build-redis-image.sh`), iptables (root) and the `nemesis-client`
//! binary next to this one (`cargo build -p lockwright-chaos --release
//! --bins` builds both).

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use clap::Parser;
use lockwright_chaos::nemesis::campaign::{
    failures, progress_line, rows, run_mutation, table, unjudged, Agreement, Settings,
};
use lockwright_chaos::nemesis::run::{applies_to, not_applicable, run};
use lockwright_chaos::nemesis::Mutation;
use lockwright_chaos::{check_environment, Availability, ChaosError};
use lockwright_core::ProtocolId;
use lockwright_model::Fault;

/// The randomized nemesis against the real adapter.
#[derive(Debug, Parser)]
struct Args {
    /// Minutes of correct-client runs (at least one round is run).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Client containers per run (1 to 20).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=20))]
    clients: u16,
    /// First seed (printed; run `i` uses `seed + i`).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds the clients of one run loop (raised where a fault needs more:
    /// four TTLs and a second, twelve TTLs for crash, for a failover 30 s
    /// or four TTLs of at least 8 s, so 32 s, for a split brain 15 s and
    /// seven TTLs).
    #[arg(long, default_value_t = 10)]
    run_seconds: u64,
    /// Lease TTL in ms (`failover` and `failover-clock-lag` runs use at
    /// least 8000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    ttl_ms: u64,
    /// Protocols, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "set-px-lua,fenced,time-fenced,redlock,lease-semaphore,time-fenced-semaphore,reentrant"
    )]
    protocols: Vec<String>,
    /// Fault classes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,crash,pause,client-skew,clock-jump,clock-back,restart,failover,delay,partition,client-partition,restart-delayed,restart-persisted,failover-clock-lag,split-brain"
    )]
    faults: Vec<String>,
    /// Mutations to try, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "overstate,plain-del,no-fence,ignore-lost"
    )]
    mutations: Vec<String>,
    /// Runs per mutation before it counts as not caught (0 skips them).
    #[arg(long, default_value_t = 3)]
    mutation_runs: usize,
    /// The client binary (default: `nemesis-client` next to this binary).
    #[arg(long)]
    client_binary: Option<PathBuf>,
    /// Permits of `lease-semaphore` (the other semaphores run with one);
    /// its fenced resource is judged only at 1, as the model checks it.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4))]
    lease_semaphore_limit: u32,
    /// After the first round, run only the cells that the model says are
    /// violated and that runs judged without finding, until none is left
    /// or the minutes are spent: how many runs each violation takes to
    /// find. (Violated cells that no run can judge are listed, not rerun.)
    #[arg(long)]
    until_found: bool,
    /// Also write the table, with the command line and the run's figures,
    /// to this Markdown file.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Chaos(#[from] ChaosError),
    #[error(transparent)]
    Name(#[from] lockwright_chaos::nemesis::UnknownName),
    #[error(transparent)]
    Fault(#[from] lockwright_model::fault::UnknownFault),
    #[error("unknown protocol {0}")]
    Protocol(String),
    #[error("cannot locate the nemesis-client binary: {0}")]
    Binary(String),
    #[error("Docker or the image is missing")]
    Unavailable,
    #[error("no fault class given applies to any protocol given (each pair skipped is listed above with the reason)")]
    NothingToRun,
    #[error("interrupted; the current run's containers, network and rules were removed")]
    Interrupted,
}

async fn campaign(args: Args) -> Result<bool, Error> {
    if check_environment()? != Availability::Ready {
        return Err(Error::Unavailable);
    }
    let protocols = args
        .protocols
        .iter()
        .map(|p| ProtocolId::from_str(p).map_err(|_| Error::Protocol(p.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let faults = args
        .faults
        .iter()
        .map(|f| Fault::from_str(f))
        .collect::<Result<Vec<_>, _>>()?;
    let client_binary = match args.client_binary.clone() {
        Some(path) => path,
        None => std::env::current_exe()
            .map_err(|e| Error::Binary(e.to_string()))?
            .with_file_name("nemesis-client"),
    };
    if !client_binary.exists() {
        return Err(Error::Binary(format!(
            "{} does not exist (cargo build -p lockwright-chaos --release --bins)",
            client_binary.display()
        )));
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    println!("nemesis: seed {seed} (replay with --seed {seed})");
    let settings = Settings {
        clients: usize::from(args.clients),
        run_duration: Duration::from_secs(args.run_seconds.max(3)),
        ttl_ms: args.ttl_ms.max(100),
        seed,
        client_binary,
        lease_semaphore_limit: args.lease_semaphore_limit,
    };
    let started = Instant::now();
    let budget = Duration::from_secs_f64(args.minutes.max(0.0) * 60.0);
    let mut reports = Vec::new();
    let mut next_seed = seed;
    // Every (protocol, fault) the campaign will not run, with the reason,
    // also when none is left to run.
    for &protocol in &protocols {
        for &fault in &faults {
            if let Some(why) = not_applicable(fault, protocol) {
                println!(
                    "skipped: {} x {} ({why})",
                    protocol.as_str(),
                    fault.as_str()
                );
            }
        }
    }
    if !protocols
        .iter()
        .any(|&p| faults.iter().any(|f| applies_to(*f, p)))
    {
        return Err(Error::NothingToRun);
    }
    let mut first_round = true;
    let mut rounds = 0;
    let mut errors: Vec<String> = Vec::new();
    let mut errors_in_a_row = 0;
    'rounds: loop {
        rounds += 1;
        // With --until-found, the rounds after the first run only the
        // violated cells not found yet.
        let open: Vec<(ProtocolId, Fault)> = rows(&reports)
            .iter()
            .filter(|row| row.agreement == Agreement::NotFound)
            .map(|row| (row.protocol, row.fault))
            .collect();
        if !first_round && args.until_found && open.is_empty() {
            break 'rounds;
        }
        for &protocol in &protocols {
            for &fault in &faults {
                if !first_round && args.until_found && !open.contains(&(protocol, fault)) {
                    continue;
                }
                if started.elapsed() >= budget && !first_round {
                    break 'rounds;
                }
                if not_applicable(fault, protocol).is_some() {
                    continue;
                }
                let config = settings.config(protocol, fault, next_seed, Mutation::None);
                next_seed = next_seed.wrapping_add(1);
                // A run that errs (its fault could not be made to happen,
                // a container did not start) is reported and the campaign
                // goes on; three in a row end it.
                match run(&config).await {
                    Ok(report) => {
                        println!("{}", progress_line(started.elapsed(), &report));
                        reports.push(report);
                        errors_in_a_row = 0;
                    }
                    Err(error) => {
                        let text = format!(
                            "({}, {}) seed {}: {error}",
                            protocol.as_str(),
                            fault.as_str(),
                            config.seed
                        );
                        println!("run error: {text}");
                        errors.push(text);
                        errors_in_a_row += 1;
                        if errors_in_a_row >= 3 {
                            println!("three runs in a row erred: the campaign stops");
                            break 'rounds;
                        }
                    }
                }
            }
        }
        first_round = false;
        if started.elapsed() >= budget {
            break 'rounds;
        }
    }
    let mut mutations = Vec::new();
    if args.mutation_runs > 0 {
        for mutation in &args.mutations {
            let mutation = Mutation::from_str(mutation)?;
            let row = run_mutation(&settings, mutation, args.mutation_runs, |report| {
                println!("{}", progress_line(started.elapsed(), report));
            })
            .await;
            match row {
                Ok(row) => mutations.push(row),
                Err(error) => {
                    let text = format!("mutation {}: {error}", mutation.as_str());
                    println!("run error: {text}");
                    errors.push(text);
                }
            }
        }
    }
    let rows = rows(&reports);
    let text = table(&rows, &mutations);
    println!("\n{text}");
    let mut failed = failures(&reports, &rows, &mutations);
    failed.extend(errors.iter().map(|e| format!("run error: {e}")));
    let unjudged = unjudged(&reports);
    if !unjudged.is_empty() {
        println!("{unjudged}");
    }
    for failure in &failed {
        println!("FAILED: {failure}");
    }
    if let Some(path) = &args.markdown {
        let command: Vec<String> = std::env::args().skip(1).collect();
        let mut doc = format!(
            "# A long nemesis run\n\nGenerated by `nemesis {}`: seed {seed}, {} clients, TTL {} ms, \
             runs of at least {} s, {} runs in {} rounds, {:.1} minutes. \
             \"first in run r\" is how many runs of that cell it took to find its first \
             violation.\n\n{text}\n{unjudged}",
            command.join(" "),
            settings.clients,
            settings.ttl_ms,
            settings.run_duration.as_secs(),
            reports.len(),
            rounds,
            started.elapsed().as_secs_f64() / 60.0,
        );
        if failed.is_empty() {
            doc.push_str("\nNo failure: no holds cell showed a violation, no integrity finding.\n");
        } else {
            doc.push_str("\n## Failures\n\n");
            for failure in &failed {
                doc.push_str(&format!("- {failure}\n"));
            }
        }
        std::fs::write(path, doc).map_err(|e| Error::Binary(format!("{}: {e}", path.display())))?;
        println!("written: {}", path.display());
    }
    Ok(failed.is_empty())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("nemesis: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Ctrl-C drops the campaign, and with it the current run's topology,
    // which removes its containers, network and rules.
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = campaign(args) => outcome,
            _ = tokio::signal::ctrl_c() => Err(Error::Interrupted),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nemesis: {e}");
            ExitCode::FAILURE
        }
    }
}
