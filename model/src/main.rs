//! `lockwright`: the verdict matrix of Redis locks and semaphores under
//! faults, computed by the model checker.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use clap::{Parser, Subcommand};
use lockwright_core::{applications, catalogue, ProtocolId};
use lockwright_model::cache::Cache;
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Cell, Verdict};
use lockwright_model::model::{LockModel, ModelConfig};
use lockwright_model::trace;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "lockwright",
    version,
    about = "Which Redis lock or semaphore is safe under which faults, checked"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the catalogue with origins.
    List,
    /// Check protocols under faults and print the verdict matrix.
    Check {
        /// Only this protocol (repeatable); default: all.
        #[arg(long = "protocol", short)]
        protocols: Vec<ProtocolId>,
        /// Only this fault (repeatable); default: the nine matrix columns.
        #[arg(long = "fault", short)]
        faults: Vec<Fault>,
        /// Print one JSON object per cell.
        #[arg(long, conflicts_with = "markdown")]
        json: bool,
        /// Print the matrix as Markdown.
        #[arg(long)]
        markdown: bool,
        /// Checker threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Also shorten every counterexample (slower).
        #[arg(long)]
        shortest: bool,
        /// Read checked cells from this directory and store the ones
        /// computed there (default: the directory named by
        /// LOCKWRIGHT_MATRIX_CACHE, else no cache). Cells are kept per
        /// source version; see `lockwright_model::cache`.
        #[arg(long, value_name = "DIR")]
        cache: Option<std::path::PathBuf>,
        /// Check with this many clients instead of each protocol's
        /// standard number (1 to 8; the cost grows steeply with each
        /// client). The expectations are those of the standard bounds, so
        /// a differing cell is reported, not hidden.
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=8))]
        clients: Option<u8>,
        /// Let this many retries per run fire late (within the retry
        /// jitter) instead of the standard bound's number; like
        /// `--clients`, a differing cell is reported, not hidden.
        #[arg(long, value_name = "N")]
        late_retries: Option<u8>,
    },
    /// Print the shortest counterexample for one cell.
    Explain {
        /// Protocol id.
        protocol: ProtocolId,
        /// Fault id.
        fault: Fault,
        /// Only this property; default: every violated one.
        #[arg(long)]
        property: Option<PropertyId>,
        /// Also write the trace as an SVG sequence diagram here.
        #[arg(long)]
        svg: Option<std::path::PathBuf>,
        /// Read checked cells from this directory and store the ones
        /// computed there (default: the directory named by
        /// LOCKWRIGHT_MATRIX_CACHE, else no cache). Cells are kept per
        /// source version; see `lockwright_model::cache`.
        #[arg(long, value_name = "DIR")]
        cache: Option<std::path::PathBuf>,
    },
    /// Generate the scenario catalogue (verdicts.md, one page per protocol
    /// with counterexamples and SVG diagrams, README.md) into a directory.
    Docs {
        /// Output directory.
        #[arg(long, default_value = "docs")]
        out: std::path::PathBuf,
        /// Worker threads (each cell is checked single-threaded).
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Read checked cells from this directory and store the ones
        /// computed there (default: the directory named by
        /// LOCKWRIGHT_MATRIX_CACHE, else no cache). Cells are kept per
        /// source version; see `lockwright_model::cache`.
        #[arg(long, value_name = "DIR")]
        cache: Option<std::path::PathBuf>,
    },
    /// Step through the model in stateright's Explorer, in a browser.
    Explore {
        /// Protocol id.
        protocol: ProtocolId,
        /// Fault id.
        fault: Fault,
        /// Address to serve on.
        #[arg(long, default_value = "127.0.0.1:3000")]
        addr: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List => {
            list();
            Ok(true)
        }
        Command::Check {
            protocols,
            faults,
            json,
            markdown,
            threads,
            shortest,
            cache,
            clients,
            late_retries,
        } => check(
            protocols,
            faults,
            Output { json, markdown },
            threads,
            shortest,
            Bounds {
                clients,
                late_retries,
            },
            open_cache(cache),
        ),
        Command::Explain {
            protocol,
            fault,
            property,
            svg,
            cache,
        } => explain(protocol, fault, property, svg, open_cache(cache)),
        Command::Explore {
            protocol,
            fault,
            addr,
        } => explore(protocol, fault, &addr),
        Command::Docs {
            out,
            threads,
            cache,
        } => docs(&out, threads, open_cache(cache)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The cache of `--cache DIR`, else of `LOCKWRIGHT_MATRIX_CACHE`, else none.
fn open_cache(dir: Option<std::path::PathBuf>) -> Option<Cache> {
    dir.map(Cache::new).or_else(Cache::from_env)
}

/// One line on standard error about what the cache did.
fn report_cache(cache: Option<&Cache>) {
    if let Some(cache) = cache {
        let stats = cache.stats();
        for reason in &stats.rejected {
            eprintln!("cache: rejected {reason}");
        }
        eprintln!(
            "cache {}: {} cells read, {} computed and stored, {} rejected",
            cache.dir().display(),
            stats.hits,
            stats.computed,
            stats.rejected.len()
        );
    }
}

fn list() {
    for e in catalogue() {
        println!(
            "{:<22} {:<9} {}",
            e.id.as_str(),
            format!("{:?}", e.kind).to_lowercase(),
            e.idea
        );
        println!("{:<32} origin: {}", "", e.origin);
    }
    for a in applications() {
        println!("{:<22} {:<9} {}", a.id, "app", a.idea);
        println!("{:<32} origin: {}; in {}", "", a.origin, a.module);
    }
}

/// How `check` prints the matrix.
struct Output {
    json: bool,
    markdown: bool,
}

/// The bounds `check` was told to widen or narrow; `None`: the standard's.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    clients: Option<u8>,
    late_retries: Option<u8>,
}

impl Bounds {
    fn is_standard(self) -> bool {
        self.clients.is_none() && self.late_retries.is_none()
    }
}

fn check(
    protocols: Vec<ProtocolId>,
    faults: Vec<Fault>,
    Output { json, markdown }: Output,
    threads: usize,
    shortest: bool,
    bounds: Bounds,
    cache: Option<Cache>,
) -> Result<bool> {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS)?;
    let protocols = if protocols.is_empty() {
        ProtocolId::all().collect()
    } else {
        protocols
    };
    let faults = if faults.is_empty() {
        Fault::COLUMNS.to_vec()
    } else {
        faults
    };
    let total = protocols.len() * faults.len();
    let started = Instant::now();
    let mut cells: Vec<Cell> = Vec::new();
    let mut states = 0usize;
    let mut generated = 0usize;
    for (i, &p) in protocols.iter().enumerate() {
        for (j, &f) in faults.iter().enumerate() {
            // A cached cell is the standard run: one thread, the model's
            // invariants on, shortest counterexamples.
            let run = match (bounds.is_standard(), &cache) {
                (true, Some(cache)) => matrix::standard_run(p, f, Some(cache))?,
                (true, None) => matrix::check(p, f, threads.max(1), shortest)?,
                (false, cache) => {
                    let mut cfg = ModelConfig::new(p, f);
                    if let Some(n) = bounds.clients {
                        cfg.clients = n;
                    }
                    if let Some(n) = bounds.late_retries {
                        cfg.late_retries = n;
                    }
                    let mut model =
                        LockModel::new(cfg, PropertyId::ALL.to_vec()).map_err(|source| {
                            matrix::CheckError::Config {
                                protocol: p,
                                source,
                            }
                        })?;
                    match cache {
                        Some(cache) => {
                            model.sanity = true;
                            cache.run(model)?
                        }
                        None => matrix::check_model(model, threads.max(1), shortest)?,
                    }
                }
            };
            states += run.states;
            generated += run.generated;
            let violated: Vec<&str> = run
                .cells
                .iter()
                .filter(|c| c.verdict == Verdict::Violated)
                .map(|c| c.property.as_str())
                .collect();
            eprintln!(
                "[{:>3}/{total}] {:<22} {:<17} {:>9} states {:>7.2} s{}  violated: {}",
                i * faults.len() + j + 1,
                p.as_str(),
                f.as_str(),
                run.states,
                run.seconds,
                if run.cached { " (cached)" } else { "" },
                if violated.is_empty() {
                    "-".to_owned()
                } else {
                    violated.join(", ")
                }
            );
            cells.extend(run.cells);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    report_cache(cache.as_ref());
    let mut mismatches = 0;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for c in &cells {
        let rule = matrix::expected(&rules, c.protocol, c.fault, c.property);
        let expected = rule.map(|r| r.verdict);
        if expected != Some(c.verdict) {
            mismatches += 1;
        }
        if json {
            let line = serde_json::json!({
                "protocol": c.protocol.as_str(),
                "fault": c.fault.as_str(),
                "property": c.property.as_str(),
                "verdict": c.verdict.as_str(),
                "expected": expected.map(Verdict::as_str),
                "reason": rule.map(|r| r.reason.as_str()),
                "source": rule.map(|r| r.source.as_str()),
                "states": c.states,
                "seconds": c.seconds,
                "trace_len": c.trace.as_ref().map(|t| t.len().saturating_sub(1)),
            });
            writeln!(out, "{line}")?;
        }
    }
    if !json {
        let table = render_matrix(&cells, &protocols, &faults, &rules, markdown);
        write!(out, "{table}")?;
    }
    eprintln!(
        "{} cells, {} unique states ({} generated) in {:.1} s: {:.0} states/s; {} differ from the expectations",
        cells.len(),
        states,
        generated,
        seconds,
        generated as f64 / seconds.max(1e-9),
        mismatches
    );
    if mismatches > 0 {
        for c in &cells {
            let rule = matrix::expected(&rules, c.protocol, c.fault, c.property);
            if rule.map(|r| r.verdict) != Some(c.verdict) {
                eprintln!(
                    "MISMATCH {} {} {}: checker says {}, expected {} ({})",
                    c.protocol,
                    c.fault,
                    c.property,
                    c.verdict,
                    rule.map(|r| r.verdict.as_str()).unwrap_or("nothing"),
                    rule.map(|r| r.reason.as_str()).unwrap_or("no rule")
                );
            }
        }
    }
    Ok(mismatches == 0)
}

fn render_matrix(
    cells: &[Cell],
    protocols: &[ProtocolId],
    faults: &[Fault],
    rules: &[matrix::Rule],
    markdown: bool,
) -> String {
    let mut s = String::new();
    let short = |p: PropertyId| match p {
        PropertyId::MutualExclusion => "ME",
        PropertyId::FencedResource => "FR",
        PropertyId::OwnerOnly => "OO",
        PropertyId::Progress => "PR",
    };
    let cell_text = |p: ProtocolId, f: Fault| -> String {
        let mut parts = Vec::new();
        for c in cells.iter().filter(|c| c.protocol == p && c.fault == f) {
            let expected = matrix::expected(rules, p, f, c.property).map(|r| r.verdict);
            let mark = if expected == Some(c.verdict) { "" } else { "!" };
            if c.verdict == Verdict::Violated || !mark.is_empty() {
                parts.push(format!(
                    "{}{}{}",
                    mark,
                    short(c.property),
                    if c.verdict == Verdict::Violated {
                        "✗"
                    } else {
                        "✓"
                    }
                ));
            }
        }
        if parts.is_empty() {
            "ok".to_owned()
        } else {
            parts.join(" ")
        }
    };
    if markdown {
        s.push_str("| protocol |");
        for f in faults {
            s.push_str(&format!(" {f} |"));
        }
        s.push_str("\n|---|");
        for _ in faults {
            s.push_str("---|");
        }
        s.push('\n');
        for p in protocols {
            s.push_str(&format!("| `{p}` |"));
            for f in faults {
                s.push_str(&format!(" {} |", cell_text(*p, *f)));
            }
            s.push('\n');
        }
    } else {
        s.push_str(&format!("{:<22}", "protocol"));
        for f in faults {
            s.push_str(&format!(" {:<12}", f.as_str()));
        }
        s.push('\n');
        for p in protocols {
            s.push_str(&format!("{:<22}", p.as_str()));
            for f in faults {
                s.push_str(&format!(" {:<12}", cell_text(*p, *f)));
            }
            s.push('\n');
        }
    }
    s.push_str("\nok: every property holds. ME mutual-exclusion, FR fenced-resource, OO owner-only, PR progress; ✗ violated; ! differs from the expectations.\n");
    s
}

fn explain(
    protocol: ProtocolId,
    fault: Fault,
    property: Option<PropertyId>,
    svg: Option<std::path::PathBuf>,
    cache: Option<Cache>,
) -> Result<bool> {
    let run = match &cache {
        Some(cache) => matrix::standard_run(protocol, fault, Some(cache))?,
        None => matrix::check(protocol, fault, 2, true)?,
    };
    report_cache(cache.as_ref());
    let mut any = false;
    for cell in &run.cells {
        if property.is_some_and(|p| p != cell.property) {
            continue;
        }
        let model = matrix::cell_model(protocol, fault, cell.property)?;
        match &cell.trace {
            None => println!(
                "{protocol} under {fault}: {} holds ({} states)",
                cell.property, cell.states
            ),
            Some(t) => {
                any = true;
                println!(
                    "{protocol} under {fault}: {} violated in {} steps:",
                    cell.property,
                    t.len().saturating_sub(1)
                );
                print!("{}", trace::text(&model, t));
                if let Some(path) = &svg {
                    let path = if property.is_none()
                        && run.cells.iter().filter(|c| c.trace.is_some()).count() > 1
                    {
                        path.with_file_name(format!(
                            "{}-{}.svg",
                            path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace"),
                            cell.property
                        ))
                    } else {
                        path.clone()
                    };
                    std::fs::write(&path, trace::svg(&model, t))?;
                    println!("(diagram written to {})", path.display());
                }
                println!();
            }
        }
    }
    if !any && svg.is_some() {
        eprintln!("no violation: no diagram written");
    }
    Ok(true)
}

fn explore(protocol: ProtocolId, fault: Fault, addr: &str) -> Result<bool> {
    use stateright::Model;
    let model = matrix::model_for(protocol, fault, PropertyId::ALL.to_vec())?;
    eprintln!("serving the explorer on http://{addr}/ (Ctrl-C to stop)");
    model.checker().serve(addr);
    Ok(true)
}

fn docs(out: &std::path::Path, threads: usize, cache: Option<Cache>) -> Result<bool> {
    let started = Instant::now();
    let docs = lockwright_model::docs::generate(threads, cache.as_ref())?;
    report_cache(cache.as_ref());
    docs.write_to(out)?;
    eprintln!(
        "{} files written to {} in {:.1} s",
        docs.files.len(),
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}
