//! `lockwright`: the verdict matrix of Redis locks and semaphores under
//! faults, computed by the model checker.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use clap::{Parser, Subcommand};
use lockwright_core::{applications, catalogue, ProtocolId};
use lockwright_model::cache::Cache;
use lockwright_model::docs::short;
use lockwright_model::fault::{Fault, FaultPair, PropertyId};
use lockwright_model::matrix::{self, Cell, Verdict};
use lockwright_model::model::{LockModel, ModelConfig};
use lockwright_model::pairs::{self, PairCell};
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
        /// Only this fault (repeatable); default: the matrix columns.
        #[arg(long = "fault", short)]
        faults: Vec<Fault>,
        /// Check under this pair of faults in one run, each acting once
        /// (repeatable, e.g. `--faults pause+restart`; `--faults columns`:
        /// every pair of two matrix columns) instead of single faults. Each
        /// cell is shown beside its verdicts under each fault alone; `*`
        /// marks a violation that neither fault shows alone.
        #[arg(
            long = "faults",
            value_name = "A+B",
            conflicts_with_all = ["faults", "clients", "late_retries", "nodes"],
            value_parser = parse_pairs,
        )]
        pairs: Vec<Vec<FaultPair>>,
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
        /// Check RedLock on this many masters instead of the standard
        /// three (1 to 7; an odd number has a strict majority to lose).
        /// The other protocols run on one node whatever this says. Like
        /// `--clients`, a differing cell is reported, not hidden.
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=7))]
        nodes: Option<u8>,
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
            pairs,
            json,
            markdown,
            threads,
            cache,
            ..
        } if !pairs.is_empty() => check_pairs(
            protocols,
            pairs.concat(),
            Output { json, markdown },
            threads,
            open_cache(cache),
        ),
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
            nodes,
            pairs: _,
        } => check(
            protocols,
            faults,
            Output { json, markdown },
            threads,
            shortest,
            Bounds {
                clients,
                late_retries,
                nodes,
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

/// `--faults`: one pair, or `columns` for every pair of two matrix columns.
fn parse_pairs(s: &str) -> std::result::Result<Vec<FaultPair>, lockwright_model::fault::PairError> {
    if s == "columns" {
        return Ok(FaultPair::of_columns());
    }
    Ok(vec![s.parse()?])
}

/// `check --faults`: every protocol under every pair, beside its standard
/// runs under each fault alone.
fn check_pairs(
    protocols: Vec<ProtocolId>,
    pairs: Vec<FaultPair>,
    Output { json, markdown }: Output,
    threads: usize,
    cache: Option<Cache>,
) -> Result<bool> {
    let protocols = if protocols.is_empty() {
        ProtocolId::all().collect()
    } else {
        protocols
    };
    let total = protocols.len() * pairs.len();
    let started = Instant::now();
    let mut cells: Vec<PairCell> = Vec::new();
    let mut singles: std::collections::BTreeMap<(ProtocolId, Fault), matrix::Run> =
        std::collections::BTreeMap::new();
    let mut states = 0usize;
    for (i, &p) in protocols.iter().enumerate() {
        for (j, &pair) in pairs.iter().enumerate() {
            for f in [pair.first(), pair.second()] {
                if let std::collections::btree_map::Entry::Vacant(slot) = singles.entry((p, f)) {
                    slot.insert(match &cache {
                        Some(cache) => matrix::standard_run(p, f, Some(cache))?,
                        None => matrix::check(p, f, threads.max(1), false)?,
                    });
                }
            }
            // The table shows each new violation's shortest counterexample.
            let run = pairs::pair_run(p, pair, threads, true, cache.as_ref())?;
            states += run.states;
            let (first, second) = (&singles[&(p, pair.first())], &singles[&(p, pair.second())]);
            let new = PairCell::new(pair, &run, first, second);
            let violated: Vec<String> = new
                .iter()
                .filter(|c| c.verdict == Verdict::Violated)
                .map(|c| {
                    format!(
                        "{}{}",
                        c.property,
                        if c.only_with_both() { "*" } else { "" }
                    )
                })
                .collect();
            eprintln!(
                "[{:>3}/{total}] {:<22} {:<24} {:>9} states {:>7.2} s{}  violated: {}  ({:.0} s elapsed)",
                i * pairs.len() + j + 1,
                p.as_str(),
                pair.to_string(),
                run.states,
                run.seconds,
                if run.cached { " (cached)" } else { "" },
                if violated.is_empty() { "-".to_owned() } else { violated.join(", ") },
                started.elapsed().as_secs_f64()
            );
            cells.extend(new);
        }
    }
    report_cache(cache.as_ref());
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if json {
        for c in &cells {
            let line = serde_json::json!({
                "protocol": c.protocol.as_str(),
                "pair": c.pair.to_string(),
                "property": c.property.as_str(),
                "verdict": c.verdict.as_str(),
                "alone": [c.alone[0].as_str(), c.alone[1].as_str()],
                "only_with_both": c.only_with_both(),
                "trace_len": c.trace.as_ref().map(|t| t.len().saturating_sub(1)),
            });
            writeln!(out, "{line}")?;
        }
    } else {
        write!(
            out,
            "{}",
            render_pairs(&cells, &protocols, &pairs, markdown)?
        )?;
    }
    let contradictions: Vec<&PairCell> =
        cells.iter().filter(|c| c.contradicts_superset()).collect();
    eprintln!(
        "{} cells under {} pairs, {} unique states in {:.1} s; {} violated only with both faults",
        cells.len(),
        pairs.len(),
        states,
        started.elapsed().as_secs_f64(),
        cells.iter().filter(|c| c.only_with_both()).count()
    );
    for c in &contradictions {
        eprintln!(
            "MODEL ERROR {} {} {}: holds under the pair, violated under a fault alone",
            c.protocol, c.pair, c.property
        );
    }
    Ok(contradictions.is_empty())
}

/// A Markdown table's header row and rule: `first`, then `columns`.
fn markdown_head(first: &str, columns: impl Iterator<Item = String>) -> String {
    let mut head = format!("| {first} |");
    let mut rule = String::from("|---|");
    for c in columns {
        head.push_str(&format!(" {c} |"));
        rule.push_str("---|");
    }
    format!("{head}\n{rule}\n")
}

/// The pairs table, and the counterexample of every violation that
/// neither fault shows alone.
fn render_pairs(
    cells: &[PairCell],
    protocols: &[ProtocolId],
    pairs: &[FaultPair],
    markdown: bool,
) -> Result<String> {
    let cell_text = |p: ProtocolId, pair: FaultPair| -> String {
        let parts: Vec<String> = cells
            .iter()
            .filter(|c| c.protocol == p && c.pair == pair && c.verdict == Verdict::Violated)
            .map(|c| {
                format!(
                    "{}{}",
                    short(c.property),
                    if c.only_with_both() { "*" } else { "" }
                )
            })
            .collect();
        if parts.is_empty() {
            "ok".to_owned()
        } else {
            parts.join(" ")
        }
    };
    let mut s = String::new();
    if markdown {
        let args: Vec<String> = protocols.iter().map(|p| format!("-p {p}")).collect();
        let which = if pairs == FaultPair::of_columns().as_slice() {
            "columns".to_owned()
        } else {
            pairs
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" --faults ")
        };
        s.push_str(&format!(
            "# Fault pairs\n\n<!-- Generated by `cargo run --release -p lockwright-model -- check {} --faults {which} --markdown`; do not edit. -->\n\n",
            args.join(" ")
        ));
        s.push_str(&format!(
            "Each cell is computed by the model checker: the protocol under two faults in one run, each acting at most once, at the standard bounds of [verdicts.md](verdicts.md) (where `progress` is checked, the horizon moves by each fault's obstruction: {} ms when both faults may keep the clients out), every property checked over the whole state space. A pair can do everything either fault can do alone (it may leave the other unused), so a property violated under one fault alone is violated under the pair too (unless the other is `client-skew`, which sets a client's clock for the whole run; the command reports a model error should a pair hold what one fault alone breaks). A promotion puts another machine in node 0's slot: a clock fault or a cut of the old master does not carry over to it. What a pair adds is marked `*`: violated under the pair, held under each fault alone; its shortest counterexample follows the table. These traces are the model's: unlike the single-fault matrix, pairs are not replayed on real Redis. Computed for {} of the catalogue's protocols at source fingerprint `{}` ({} pairs, {} cells).\n\n",
            ModelConfig::new(ProtocolId::SetPxLua, Fault::Pause)
                .with_also(Fault::Delay)
                .horizon,
            protocols.len(),
            lockwright_model::cache::SOURCE_FINGERPRINT,
            pairs.len(),
            cells.len()
        ));
        // One row per pair (53 columns would not read), one column per
        // protocol.
        s.push_str(&markdown_head(
            "pair",
            protocols.iter().map(|p| format!("`{p}`")),
        ));
        for &pair in pairs {
            s.push_str(&format!("| `{pair}` |"));
            for &p in protocols {
                s.push_str(&format!(" {} |", cell_text(p, pair)));
            }
            s.push('\n');
        }
    } else {
        s.push_str(&format!("{:<24}", "pair"));
        for p in protocols {
            s.push_str(&format!(" {:<22}", p.as_str()));
        }
        s.push('\n');
        for &pair in pairs {
            s.push_str(&format!("{:<24}", pair.to_string()));
            for &p in protocols {
                s.push_str(&format!(" {:<22}", cell_text(p, pair)));
            }
            s.push('\n');
        }
    }
    s.push_str("\nok: every property holds. ME mutual-exclusion, FR fenced-resource, OO owner-only, PR progress: violated under the pair; * violated under the pair while it holds under each fault alone.\n");
    for c in cells.iter().filter(|c| c.only_with_both()) {
        let Some(t) = &c.trace else { continue };
        let model = pairs::pair_model(c.protocol, c.pair, vec![c.property])?;
        if markdown {
            s.push_str(&format!(
                "\n### `{}` under `{}`: `{}`\n\nShortest counterexample, {} steps:\n\n```text\n{}```\n",
                c.protocol,
                c.pair,
                c.property,
                t.len().saturating_sub(1),
                trace::text(&model, t)
            ));
        } else {
            s.push_str(&format!(
                "\n{} under {}: {} violated in {} steps (holds under each fault alone):\n{}",
                c.protocol,
                c.pair,
                c.property,
                t.len().saturating_sub(1),
                trace::text(&model, t)
            ));
        }
    }
    Ok(s)
}

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
    /// RedLock's masters.
    nodes: Option<u8>,
}

impl Bounds {
    fn is_standard(self) -> bool {
        self.clients.is_none() && self.late_retries.is_none() && self.nodes.is_none()
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
    // With a cache every cell is the standard run, checked single-threaded
    // (the state counts it stores must not depend on scheduling): the
    // cells then run side by side, one per thread. Without one, each cell
    // runs on all the checker threads in turn.
    let (workers, checker_threads) = match cache {
        Some(_) => (threads.max(1), 1),
        None => (1, threads.max(1)),
    };
    let run_cell =
        |&(p, f): &(ProtocolId, Fault)| -> std::result::Result<matrix::Run, matrix::CheckError> {
            Ok(match (bounds.is_standard(), &cache) {
                (true, Some(cache)) => matrix::standard_run(p, f, Some(cache))?,
                (true, None) => matrix::check(p, f, checker_threads, shortest)?,
                (false, cache) => {
                    let mut cfg = ModelConfig::new(p, f);
                    if let Some(n) = bounds.clients {
                        cfg.clients = n;
                    }
                    if let Some(n) = bounds.late_retries {
                        cfg.late_retries = n;
                    }
                    if let (Some(n), ProtocolId::Redlock) = (bounds.nodes, p) {
                        cfg.nodes = n;
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
                        None => matrix::check_model(model, checker_threads, shortest)?,
                    }
                }
            })
        };
    let progress = |done: usize, &(p, f): &(ProtocolId, Fault), run: &matrix::Run| {
        let violated: Vec<&str> = run
            .cells
            .iter()
            .filter(|c| c.verdict == Verdict::Violated)
            .map(|c| c.property.as_str())
            .collect();
        eprintln!(
            "[{done:>3}/{total}] {:<22} {:<17} {:>9} states {:>7.2} s{}  violated: {}  ({:.0} s elapsed)",
            p.as_str(),
            f.as_str(),
            run.states,
            run.seconds,
            if run.cached { " (cached)" } else { "" },
            if violated.is_empty() {
                "-".to_owned()
            } else {
                violated.join(", ")
            },
            started.elapsed().as_secs_f64(),
        );
    };
    let asked: Vec<(ProtocolId, Fault)> = protocols
        .iter()
        .flat_map(|&p| faults.iter().map(move |&f| (p, f)))
        .collect();
    let jobs: Vec<(usize, (ProtocolId, Fault))> = matrix::largest_first(&asked)
        .into_iter()
        .map(|i| (i, asked[i]))
        .collect();
    let runs = matrix::par_map(
        &jobs,
        workers,
        |(_, cell)| run_cell(cell),
        |done, (_, cell), run| progress(done, cell, run),
    )?;
    // Back in the order asked for (protocols, then faults), whatever order
    // they were checked in.
    let mut runs: Vec<(usize, matrix::Run)> = jobs.iter().map(|j| j.0).zip(runs).collect();
    runs.sort_by_key(|r| r.0);
    let mut states = 0usize;
    let mut generated = 0usize;
    // The rate counts only the states this run computed: a cached cell's
    // were computed by an earlier one.
    let mut computed = 0usize;
    let mut cells: Vec<Cell> = Vec::new();
    for (_, run) in runs {
        states += run.states;
        generated += run.generated;
        if !run.cached {
            computed += run.states;
        }
        cells.extend(run.cells);
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
    let rate = if computed == 0 {
        "all read from the cache".to_owned()
    } else {
        format!(
            "{:.0} unique states/s computed",
            computed as f64 / seconds.max(1e-9)
        )
    };
    eprintln!(
        "{} cells, {} unique states ({} generated) in {:.1} s: {rate}; {} differ from the expectations",
        cells.len(),
        states,
        generated,
        seconds,
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
        s.push_str(&markdown_head(
            "protocol",
            faults.iter().map(|f| f.to_string()),
        ));
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
