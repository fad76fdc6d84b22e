//! The scenario catalogue in `docs/`, generated from the model.
//!
//! [`generate`] checks every (protocol, fault) cell with
//! [`matrix::standard_run`] (through a [`Cache`] when given one), which also
//! finds the shortest counterexample of every violated property, and renders
//!
//! - `verdicts.md`: the whole matrix (the nine fault columns and the restart
//!   variants), the legend, and the expectation behind every notable cell;
//! - `protocols/<id>.md`: one page per catalogue protocol: idea, origin, the
//!   machine's essay, the Redis commands it sends (recorded by driving the
//!   machine against the keyspace model), its Lua scripts, a state diagram,
//!   its row of the matrix, and every counterexample as text and as an SVG
//!   sequence diagram (`protocols/svg/<id>--<fault>--<property>.svg`), each
//!   replayed on real Redis by `chaos/tests/replay.rs`;
//! - `README.md`: the index.
//!
//! The output is a pure function of the code: no timestamps, no timings, no
//! state counts. `model/tests/docs.rs` regenerates it and fails when the
//! committed copy differs. Regenerate with
//! `cargo run --release -p lockwright-model -- docs`.
//!
//! # Shortest counterexamples
//!
//! The pages need traces that are both shortest and repeatable; they are
//! those of [`matrix::shortest_counterexamples`], the same search `explain`,
//! the matrix test and the replay use.

use crate::cache::Cache;
use crate::fault::{Fault, PropertyId};
use crate::matrix::{self, Cell, CheckError, Rule, Trace, Verdict};
use crate::model::{standard_clients, ModelConfig, PROGRESS_CLIENTS};
use crate::trace;
use lockwright_core::keyspace::{
    Command, ConnId, Keyspace, Reply, ScoreBound, Script, SetCondition, SetExpiry,
};
use lockwright_core::{
    catalogue, Acquire, ConfigError, Event, Kind, Lease, Machine, Millis, Outcome, Protocol,
    ProtocolId, Token,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// The guide "Driving the core from your own front end" (`docs/driving.md`).
/// Its Rust code blocks run as doctests of this crate, so the loop it shows
/// is checked on every `cargo test`.
#[doc = include_str!("../../docs/driving.md")]
pub mod driving_guide {}

/// What can go wrong while generating the docs.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// A model could not be configured.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The expectations file does not parse.
    #[error(transparent)]
    Expectations(#[from] matrix::ExpectationError),
    /// A machine rejected its configuration while recording commands.
    #[error("cannot configure {protocol}: {source}")]
    Config {
        /// The protocol.
        protocol: ProtocolId,
        /// Why.
        source: ConfigError,
    },
    /// The generation found something that cannot be (a worker panicked, a
    /// recorded request went to a node that does not exist).
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    /// Writing the files failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The generated files, by path relative to the docs directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Docs {
    /// Path (with `/`) → contents.
    pub files: BTreeMap<String, String>,
}

impl Docs {
    /// Write every file under `dir`, creating directories as needed. Files
    /// already there that are not generated (the guides) are left alone;
    /// SVGs of counterexamples that no longer exist are removed.
    pub fn write_to(&self, dir: &Path) -> Result<(), DocsError> {
        let io = |path: &Path, source| DocsError::Io {
            path: path.display().to_string(),
            source,
        };
        let svg_dir = dir.join("protocols").join("svg");
        if let Ok(entries) = std::fs::read_dir(&svg_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".svg")
                    && !self.files.contains_key(&format!("protocols/svg/{name}"))
                {
                    std::fs::remove_file(entry.path()).map_err(|e| io(&entry.path(), e))?;
                }
            }
        }
        for (rel, text) in &self.files {
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::write(&path, text).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

/// Everything the checker computed for one (protocol, fault) cell.
#[derive(Clone, Debug)]
pub struct CellResult {
    /// One verdict per property, from [`matrix::standard_run`].
    pub cells: Vec<Cell>,
    /// The shortest counterexample of every violated property.
    pub traces: BTreeMap<PropertyId, Trace>,
}

/// The whole matrix with its counterexamples.
#[derive(Clone, Debug)]
pub struct Computed {
    /// By (protocol, fault), every fault of [`Fault::ALL`].
    pub results: BTreeMap<(ProtocolId, Fault), CellResult>,
}

/// Check every protocol under every fault on `threads` worker threads (each
/// cell single-threaded, so the result does not depend on scheduling),
/// reading and storing cells in `cache` when given one.
pub fn compute(threads: usize, cache: Option<&Cache>) -> Result<Computed, DocsError> {
    let cells: Vec<(ProtocolId, Fault)> = ProtocolId::all()
        .flat_map(|p| Fault::ALL.into_iter().map(move |f| (p, f)))
        .collect();
    let jobs: Vec<(ProtocolId, Fault)> = matrix::largest_first(&cells)
        .into_iter()
        .map(|i| cells[i])
        .collect();
    let results = matrix::par_map(
        &jobs,
        threads,
        |&(p, f)| compute_cell(p, f, cache),
        |_, _, _| {},
    )?;
    Ok(Computed {
        results: jobs.into_iter().zip(results).collect(),
    })
}

/// Check one (protocol, fault) run and find the shortest counterexample of
/// every violated property: one cell of [`compute`].
pub fn compute_cell(
    protocol: ProtocolId,
    fault: Fault,
    cache: Option<&Cache>,
) -> Result<CellResult, DocsError> {
    let run = matrix::standard_run(protocol, fault, cache)?;
    let traces = run
        .cells
        .iter()
        .filter_map(|c| Some((c.property, c.trace.clone()?)))
        .collect();
    Ok(CellResult {
        cells: run.cells,
        traces,
    })
}

/// Check everything (through `cache` when given one) and render every
/// generated file.
pub fn generate(threads: usize, cache: Option<&Cache>) -> Result<Docs, DocsError> {
    let computed = compute(threads, cache)?;
    render(&computed)
}

/// Render the generated files from computed results.
pub fn render(computed: &Computed) -> Result<Docs, DocsError> {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS)?;
    let mut docs = Docs::default();
    docs.files
        .insert("verdicts.md".into(), verdicts_md(computed, &rules));
    for entry in catalogue() {
        let (page, svgs) = protocol_page(entry.id, computed, &rules)?;
        docs.files
            .insert(format!("protocols/{}.md", entry.id), page);
        for (name, svg) in svgs {
            docs.files.insert(format!("protocols/svg/{name}"), svg);
        }
    }
    docs.files.insert("README.md".into(), readme(computed));
    Ok(docs)
}

// ---------------------------------------------------------------------------
// Words

const REGENERATE: &str = "cargo run --release -p lockwright-model -- docs";

/// The two-letter code of a property in the verdict tables (`ME`, `FR`,
/// `OO`, `PR`).
pub fn short(p: PropertyId) -> &'static str {
    match p {
        PropertyId::MutualExclusion => "ME",
        PropertyId::FencedResource => "FR",
        PropertyId::OwnerOnly => "OO",
        PropertyId::Progress => "PR",
    }
}

fn property_summary(p: PropertyId) -> &'static str {
    match p {
        PropertyId::MutualExclusion => "at most one holder (`limit` for semaphores) is inside its critical section; a well-behaved client leaves when its own clock says its validity ran out, unless it is paused",
        PropertyId::FencedResource => "the protected resource never accepts a write from a holder whose hold was superseded by one whose write it already accepted (with fencing it refuses older fences; without, it accepts every write)",
        PropertyId::OwnerOnly => "no release or extend removes or extends another owner's hold",
        PropertyId::Progress => "a running waiting client does not wait longer than `2·ttl + 2·max retry delay` while no live client is inside and every node is up and reachable",
    }
}

fn fault_summary(f: Fault) -> &'static str {
    match f {
        Fault::None => "no fault: only interleavings of clients, nodes and time",
        Fault::Crash => "a client stops for good at any step",
        Fault::Pause => "a client takes no step while time advances (GC pause, stalled VM), then resumes",
        Fault::ClientSkew => "client clocks disagree: one is half a TTL ahead and runs 1 % slow (within RedLock's drift allowance)",
        Fault::ClockJump => "one node's clock jumps forward by TTL + 1",
        Fault::ClockBack => "a node restarts empty and its clock comes back 500 ms behind (more than the restart took)",
        Fault::Restart => "a node restarts empty; it is down for 1 ms",
        Fault::RestartDelayed => "a node restarts empty but stays down for longer than the TTL first",
        Fault::RestartPersisted => "a node restarts with its data (AOF with `fsync always`)",
        Fault::Failover => "node 0 has an asynchronous replica that is promoted, dropping what it had not received; the promotion takes 1 ms",
        Fault::FailoverClockLag => "failover, with the replica's clock 500 ms behind its master's",
        Fault::Delay => "one request is held up past the TTL (the client times out; the request still runs later, after requests on the new connection may have overtaken it), and one request or reply may be lost",
        Fault::Partition => "a node is cut off from every client for a while; messages into the cut are lost and their senders time out",
    }
}

fn anchor(f: Fault, p: PropertyId) -> String {
    format!("{f}--{p}")
}

fn svg_name(id: ProtocolId, f: Fault, p: PropertyId) -> String {
    format!("{id}--{f}--{p}.svg")
}

fn bounds(protocol: ProtocolId) -> String {
    let cfg = ModelConfig::new(protocol, Fault::None);
    format!(
        "{} clients{}, {} node{}, TTL {} ms, retries every {}–{} ms plus up to {} ms of jitter, request latency up to {} ms, reply timeout {} ms, horizon {} ms, one fault action per run",
        cfg.clients,
        if cfg.clients == PROGRESS_CLIENTS {
            String::new()
        } else {
            format!(" ({PROGRESS_CLIENTS} for progress)")
        },
        cfg.nodes,
        if cfg.nodes == 1 { "" } else { "s" },
        cfg.ttl,
        cfg.retry_base,
        cfg.retry_max,
        cfg.retry_jitter,
        cfg.latency,
        cfg.reply_timeout,
        cfg.horizon
    )
}

fn verdict_of(computed: &Computed, p: ProtocolId, f: Fault, prop: PropertyId) -> Option<Verdict> {
    computed
        .results
        .get(&(p, f))?
        .cells
        .iter()
        .find(|c| c.property == prop)
        .map(|c| c.verdict)
}

fn violated(computed: &Computed, p: ProtocolId, f: Fault) -> Vec<PropertyId> {
    PropertyId::ALL
        .into_iter()
        .filter(|&prop| verdict_of(computed, p, f, prop) == Some(Verdict::Violated))
        .collect()
}

fn rule_text(rule: Option<&Rule>) -> String {
    match rule {
        Some(r) => format!(
            "{} ({}; `model/expectations.txt` line {})",
            r.reason, r.source, r.line
        ),
        None => "no expectation covers this cell".into(),
    }
}

// ---------------------------------------------------------------------------
// verdicts.md

fn verdicts_md(computed: &Computed, rules: &[Rule]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# The verdict matrix\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `lockwright docs`; do not edit. Regenerate with `{REGENERATE}`. -->\n"
    );
    let _ = writeln!(s, "Every cell is computed by the model checker (`lockwright_model::matrix::standard_run`): the core's own machines, Redis nodes as the core's keyspace model, and one fault class per column. Each cell lists the properties the checker found **violated**; `ok` means all four hold within the bounds. A link leads to the protocol page with the shortest counterexample. `!` marks a verdict that differs from `model/expectations.txt` (none should).\n");
    let _ = writeln!(
        s,
        "Bounds: {} (three clients for the safety properties of {}, whose late `DEL` takes a third client to show a double admission; three nodes for `redlock`).\n",
        bounds(ProtocolId::SetPxLua).replace("1 node", "one node"),
        ProtocolId::all()
            .filter(|&p| standard_clients(p) == 3)
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(" and ")
    );
    s.push_str("| protocol |");
    for f in Fault::ALL {
        let _ = write!(s, " {f} |");
    }
    s.push_str("\n|---|");
    for _ in Fault::ALL {
        s.push_str("---|");
    }
    s.push('\n');
    for p in ProtocolId::all() {
        let _ = write!(s, "| [`{p}`](protocols/{p}.md) |");
        for f in Fault::ALL {
            let mut parts = Vec::new();
            for prop in PropertyId::ALL {
                let v = verdict_of(computed, p, f, prop);
                let expected = matrix::expected(rules, p, f, prop).map(|r| r.verdict);
                let mark = if expected == v { "" } else { "!" };
                match v {
                    Some(Verdict::Violated) => parts.push(format!(
                        "{mark}[{}](protocols/{p}.md#{})",
                        short(prop),
                        anchor(f, prop)
                    )),
                    _ if !mark.is_empty() => parts.push(format!("{mark}{}✓", short(prop))),
                    _ if matrix::bound_gap(p, f, prop).is_some() => {
                        parts.push(format!("{}✓[†](#beyond-the-bounds)", short(prop)))
                    }
                    _ => {}
                }
            }
            if parts.is_empty() {
                s.push_str(" ok |");
            } else {
                let _ = write!(s, " {} |", parts.join(" "));
            }
        }
        s.push('\n');
    }
    s.push_str("\n## <a id=\"beyond-the-bounds\"></a>Known beyond the bounds\n\n");
    s.push_str("A `holds` marked † is the checker's verdict at the bounds above, and a wider run shows it violated (`lockwright_model::matrix::BOUND_GAPS`; the test named fails if a wider run decides it holds)");
    if matrix::BOUND_GAPS.is_empty() {
        s.push_str(". None is marked: `model/tests/clients.rs` reruns every two-client run with a third client (each stopped at a cap of states, compared where it decides) and `model/tests/reductions.rs` reruns small bounds without each reduction, and neither finds a verdict that differs.\n");
    } else {
        s.push_str(":\n\n");
    }
    for (p, f, prop, why) in matrix::BOUND_GAPS {
        let _ = writeln!(s, "- `{p}` × `{f}` × `{prop}`: {why}.");
    }
    s.push_str("\n## Legend\n\n");
    s.push_str("| code | property | holds when |\n|---|---|---|\n");
    for p in PropertyId::ALL {
        let _ = writeln!(s, "| {} | `{p}` | {} |", short(p), property_summary(p));
    }
    s.push_str("\n| fault | what the environment may do |\n|---|---|\n");
    for f in Fault::ALL {
        let _ = writeln!(s, "| `{f}` | {} |", fault_summary(f));
    }
    s.push_str("\nThe first nine columns are the matrix of `lockwright check`; `restart-delayed` and `restart-persisted` are the restart variants (RedLock's delayed restarts, AOF with `fsync always`).\n");

    s.push_str("\n## Where each verdict was expected\n\n");
    s.push_str("Every cell is also predicted in `model/expectations.txt`, from the literature or from analysis, before or after investigation; the test `cargo test -p lockwright-model --test matrix` fails when a computed verdict differs. This table lists every cell not decided by the baseline rule (\"no fault of this class breaks this property\"), with the rule that predicts it.\n\n");
    s.push_str("| protocol | fault | property | computed | expected | why | source |\n|---|---|---|---|---|---|---|\n");
    let baseline = rules.first().map(|r| r.line);
    for p in ProtocolId::all() {
        for f in Fault::ALL {
            for prop in PropertyId::ALL {
                let Some(v) = verdict_of(computed, p, f, prop) else {
                    continue;
                };
                let rule = matrix::expected(rules, p, f, prop);
                let notable =
                    rule.map(|r| r.line) != baseline || rule.map(|r| r.verdict) != Some(v);
                if !notable {
                    continue;
                }
                let computed_text = if v == Verdict::Violated {
                    format!("[violated](protocols/{p}.md#{})", anchor(f, prop))
                } else {
                    "holds".to_owned()
                };
                let _ = writeln!(
                    s,
                    "| `{p}` | `{f}` | `{prop}` | {computed_text} | {} | {} | {} (line {}) |",
                    rule.map(|r| r.verdict.as_str()).unwrap_or("—"),
                    rule.map(|r| escape_cell(&r.reason)).unwrap_or_default(),
                    rule.map(|r| escape_cell(&r.source)).unwrap_or_default(),
                    rule.map(|r| r.line).unwrap_or(0)
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\n## Regenerating\n\n```sh\n{REGENERATE}            # rewrites docs/verdicts.md, docs/protocols/, docs/README.md\ncargo test -p lockwright-model --test docs   # fails when the committed copy is stale\n```"
    );
    s
}

fn escape_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

// ---------------------------------------------------------------------------
// README.md

fn readme(computed: &Computed) -> String {
    let mut s = String::new();
    s.push_str("# lockwright docs\n\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `lockwright docs`; do not edit. Regenerate with `{REGENERATE}`. -->\n"
    );
    s.push_str("A catalogue of Redis locks and semaphores and the failure scenarios the model checker finds in them. Everything under `protocols/` and `verdicts.md` is generated from the model; the two guides are written by hand and point at the cells that back each claim.\n\n");
    s.push_str("- [The verdict matrix](verdicts.md): every protocol under every fault, with the expectation behind each cell.\n");
    s.push_str("- [The replay on real Redis](replay.md): every counterexample executed step by step on Redis containers (generated by the chaos crate's `replay` binary).\n");
    s.push_str("- [Choosing a lock](choosing.md): which protocol under which failure assumptions; fencing, `WAIT`, RedLock's assumptions.\n");
    s.push_str("- [Driving the core from your own front end](driving.md): the sans-IO driving loop (checked as a doctest).\n");
    s.push_str("- [Benchmarks](benchmarks.md), where generated.\n\n");
    for kind in [Kind::Lock, Kind::Semaphore] {
        let _ = writeln!(
            s,
            "## {}\n\n| protocol | idea | origin | violated cells |\n|---|---|---|---|",
            if kind == Kind::Lock {
                "Locks"
            } else {
                "Semaphores"
            }
        );
        for e in catalogue().iter().filter(|e| e.kind == kind) {
            let n: usize = Fault::ALL
                .into_iter()
                .map(|f| violated(computed, e.id, f).len())
                .sum();
            let _ = writeln!(
                s,
                "| [`{}`](protocols/{}.md) | {} | {} | {n} |",
                e.id,
                e.id,
                escape_cell(e.idea),
                escape_cell(e.origin)
            );
        }
        s.push('\n');
    }
    s
}

// ---------------------------------------------------------------------------
// Protocol pages

fn protocol_page(
    id: ProtocolId,
    computed: &Computed,
    rules: &[Rule],
) -> Result<(String, Vec<(String, String)>), DocsError> {
    let entry = id.entry();
    let mut s = String::new();
    let mut svgs = Vec::new();
    let _ = writeln!(s, "# `{id}`\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `lockwright docs`; do not edit. Regenerate with `{REGENERATE}`. -->\n"
    );
    let _ = writeln!(
        s,
        "**{}.** {}  \n**Origin:** {}  \n**Machine:** `core/src/{}`\n",
        if entry.kind == Kind::Lock {
            "Lock"
        } else {
            "Semaphore"
        },
        entry.idea,
        entry.origin,
        machine_file(id)
    );
    s.push_str("## The idea\n\nFrom the machine's own documentation:\n\n");
    s.push_str(&essay_markdown(essay(id)));
    s.push_str("\n\n## What it sends to Redis\n\n");
    let transcript = record_commands(id)?;
    s.push_str("Recorded by driving the core machine against the keyspace model (the same commands the Redis adapter sends): `c0` acquires, `c1` tries while it is held, `c0` extends and releases, then `c1` acquires and releases. Times are the clients' clocks in ms; the lock name is `r`.\n\n```text\n");
    s.push_str(&transcript.lines.join("\n"));
    s.push_str("\n```\n");
    if !transcript.scripts.is_empty() {
        s.push_str("\nThe Lua scripts (text from `Script::lua()`, sent with `EVALSHA`):\n");
        for script in &transcript.scripts {
            let _ = writeln!(s, "\n`{}`:\n\n```lua\n{}\n```", script.name(), script.lua());
        }
    }
    s.push_str("\n## State machine\n\n");
    s.push_str("The client's view, summarised from the machine (every path ends with an event: `Acquired`, `Denied`, `Released`, `Extended`, `NotExtended`, `Lost`, `Failed`):\n\n```mermaid\n");
    s.push_str(&state_diagram(id)?);
    s.push_str("```\n");

    s.push_str("\n## Verdicts\n\n");
    let _ = writeln!(
        s,
        "Bounds: {}. ✓ holds, ✗ violated (linked to its counterexample); `!` differs from `model/expectations.txt`. The whole matrix: [verdicts.md](../verdicts.md).\n",
        bounds(id)
    );
    s.push_str("| fault |");
    for p in PropertyId::ALL {
        let _ = write!(s, " {p} |");
    }
    s.push_str("\n|---|---|---|---|---|\n");
    for f in Fault::ALL {
        let _ = write!(s, "| `{f}` |");
        for p in PropertyId::ALL {
            let v = verdict_of(computed, id, f, p);
            let expected = matrix::expected(rules, id, f, p).map(|r| r.verdict);
            let mark = if expected == v { "" } else { "!" };
            match v {
                Some(Verdict::Violated) => {
                    let _ = write!(s, " {mark}[✗](#{}) |", anchor(f, p));
                }
                Some(Verdict::Holds) if matrix::bound_gap(id, f, p).is_some() => {
                    let _ = write!(s, " {mark}✓[†](../verdicts.md#beyond-the-bounds) |");
                }
                Some(Verdict::Holds) => {
                    let _ = write!(s, " {mark}✓ |");
                }
                None => s.push_str(" ? |"),
            }
        }
        s.push('\n');
    }
    let confirmations: Vec<&ChaosTest> = CHAOS
        .iter()
        .filter(|c| {
            c.protocol == id
                && verdict_of(computed, id, c.fault, c.property) == Some(Verdict::Holds)
        })
        .collect();
    if !confirmations.is_empty() {
        s.push_str("\nCells that hold, confirmed on real Redis by the chaos suite:\n\n");
        for c in confirmations {
            let _ = writeln!(
                s,
                "- `{}` × `{}`: {} — `{}` in [`{}`](../../{})",
                c.fault, c.property, c.shows, c.test, c.file, c.file
            );
        }
    }

    s.push_str("\n## Counterexamples\n\n");
    s.push_str("Each is a shortest one: a breadth-first search over the model that keeps the first violating state of each property (ties broken by the model's action order). Each step is the action, then the state it led to: true time `t`, each client's clock reading (`c0@…`) and belief, each node's clock reading (`n0@…`) and keys with their expiry on the node's clock. In each diagram a green bar on a client's lifeline spans the steps during which it is inside its critical section (it believes it holds and its own clock has not passed its validity, or it is paused), and the step at which the property breaks is shaded red.\n");
    let mut any = false;
    for f in Fault::ALL {
        let Some(result) = computed.results.get(&(id, f)) else {
            continue;
        };
        if result.traces.is_empty() {
            continue;
        }
        for (&p, t) in &result.traces {
            any = true;
            let model = matrix::cell_model(id, f, p)?;
            let name = svg_name(id, f, p);
            let rule = matrix::expected(rules, id, f, p);
            let _ = writeln!(s, "\n### <a id=\"{}\"></a>`{f}` × `{p}`\n", anchor(f, p));
            let _ = writeln!(s, "*Fault:* {}.  ", fault_summary(f));
            let _ = writeln!(s, "*Expected:* {}.\n", rule_text(rule));
            let _ = writeln!(
                s,
                "Shortest counterexample, {} steps:\n\n```text\n{}```\n",
                t.len().saturating_sub(1),
                trace::text(&model, t)
            );
            let _ = writeln!(s, "![{id} under {f}: {p} violated](svg/{name})\n");
            s.push_str(REPLAYED);
            if let Some(c) = CHAOS
                .iter()
                .find(|c| c.protocol == id && c.fault == f && c.property == p)
            {
                let _ = writeln!(
                    s,
                    "Also shown by `{}` in [`{}`](../../{}): {}.",
                    c.test, c.file, c.file, c.shows
                );
            }
            svgs.push((name, trace::svg(&model, t)));
        }
    }
    if !any {
        s.push_str("\nNone: every property holds under every fault within the bounds.\n");
    }
    Ok((s, svgs))
}

fn machine_file(id: ProtocolId) -> &'static str {
    match id {
        ProtocolId::SetnxDel => "locks/setnx_del.rs",
        ProtocolId::SetnxExpire => "locks/setnx_expire.rs",
        ProtocolId::SetnxGetset => "locks/setnx_getset.rs",
        ProtocolId::SetPxGetDel => "locks/set_px_get_del.rs",
        ProtocolId::SetPxWatch => "locks/set_px_watch.rs",
        ProtocolId::SetPxLua => "locks/set_px_lua.rs",
        ProtocolId::Reentrant => "locks/reentrant.rs",
        ProtocolId::Redlock => "locks/redlock.rs",
        ProtocolId::Fenced => "locks/fenced.rs",
        ProtocolId::TimeFenced => "locks/time_fenced.rs",
        ProtocolId::ZsetSemaphore => "semaphores/zset_semaphore.rs",
        ProtocolId::FairSemaphore => "semaphores/fair_semaphore.rs",
        ProtocolId::FairSemaphoreLocked => "semaphores/fair_semaphore_locked.rs",
        ProtocolId::WatchSemaphore => "semaphores/watch_semaphore.rs",
        ProtocolId::LeaseSemaphore => "semaphores/lease_semaphore.rs",
        ProtocolId::TimeFencedSemaphore => "semaphores/time_fenced_semaphore.rs",
    }
}

/// The machine file's source, compiled in so that its essay cannot drift
/// from the page.
fn source(id: ProtocolId) -> &'static str {
    match id {
        ProtocolId::SetnxDel => include_str!("../../core/src/locks/setnx_del.rs"),
        ProtocolId::SetnxExpire => include_str!("../../core/src/locks/setnx_expire.rs"),
        ProtocolId::SetnxGetset => include_str!("../../core/src/locks/setnx_getset.rs"),
        ProtocolId::SetPxGetDel => include_str!("../../core/src/locks/set_px_get_del.rs"),
        ProtocolId::SetPxWatch => include_str!("../../core/src/locks/set_px_watch.rs"),
        ProtocolId::SetPxLua => include_str!("../../core/src/locks/set_px_lua.rs"),
        ProtocolId::Reentrant => include_str!("../../core/src/locks/reentrant.rs"),
        ProtocolId::Redlock => include_str!("../../core/src/locks/redlock.rs"),
        ProtocolId::Fenced => include_str!("../../core/src/locks/fenced.rs"),
        ProtocolId::TimeFenced => include_str!("../../core/src/locks/time_fenced.rs"),
        ProtocolId::ZsetSemaphore => include_str!("../../core/src/semaphores/zset_semaphore.rs"),
        ProtocolId::FairSemaphore => include_str!("../../core/src/semaphores/fair_semaphore.rs"),
        ProtocolId::FairSemaphoreLocked => {
            include_str!("../../core/src/semaphores/fair_semaphore_locked.rs")
        }
        ProtocolId::WatchSemaphore => include_str!("../../core/src/semaphores/watch_semaphore.rs"),
        ProtocolId::LeaseSemaphore => include_str!("../../core/src/semaphores/lease_semaphore.rs"),
        ProtocolId::TimeFencedSemaphore => {
            include_str!("../../core/src/semaphores/time_fenced_semaphore.rs")
        }
    }
}

/// The lines of the `//!` essay at the top of the machine file.
fn essay_lines(id: ProtocolId) -> impl Iterator<Item = &'static str> {
    source(id)
        .lines()
        .skip_while(|l| !l.starts_with("//!"))
        .map_while(|l| l.strip_prefix("//!"))
        .map(|rest| rest.strip_prefix(' ').unwrap_or(rest))
}

/// The essay the page shows: the machine file's `//!` essay up to its
/// state diagram (which the page shows under a heading of its own).
fn essay(id: ProtocolId) -> String {
    let lines: Vec<&str> = essay_lines(id)
        .take_while(|l| *l != DIAGRAM_HEADING)
        .collect();
    lines.join("\n").trim_end().to_owned()
}

/// Rustdoc Markdown to plain Markdown: intra-doc links become code spans,
/// headings move down two levels (the page has its own).
fn essay_markdown(essay: String) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for line in essay.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            out.push_str(line);
            out.push('\n');
            continue;
        }
        if in_code {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let line = if line.starts_with('#') {
            format!("##{line}")
        } else {
            line.to_owned()
        };
        out.push_str(&strip_intra_doc_links(&line));
        out.push('\n');
    }
    out.trim_end().to_owned()
}

fn strip_intra_doc_links(line: &str) -> String {
    // `[`x`]` → `x`; `[`x`](path)` → `x`; `[text](crate::x)` → text.
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(close) = after.find(']') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &after[..close];
        let tail = &after[close + 1..];
        if let Some(link_tail) = tail.strip_prefix('(') {
            if let Some(end) = link_tail.find(')') {
                let target = &link_tail[..end];
                if target.starts_with("http") {
                    out.push_str(&rest[start..start + 1 + close + 1 + end + 2]);
                } else {
                    out.push_str(inner);
                }
                rest = &link_tail[end + 1..];
                continue;
            }
        }
        if inner.starts_with('`') && inner.ends_with('`') {
            out.push_str(inner);
        } else {
            out.push('[');
            out.push_str(inner);
            out.push(']');
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------
// Recorded commands

/// What a protocol sent in the recorded scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// One line per command or event.
    pub lines: Vec<String>,
    /// Every script it ran.
    pub scripts: BTreeSet<Script>,
}

/// Drive two clients of `id` against keyspace nodes through a fixed scenario
/// and record every command, reply and event.
pub fn record_commands(id: ProtocolId) -> Result<Transcript, DocsError> {
    let cfg = ModelConfig::new(id, Fault::None);
    let mut nodes: Vec<Keyspace> = (0..cfg.nodes).map(|_| Keyspace::new()).collect();
    let mut t = Transcript::default();
    let config_of = |c: u8| cfg.core_config(c);
    if id == ProtocolId::WatchSemaphore {
        let config = config_of(0);
        let set_max = Command::Set {
            key: config.key_with("max"),
            value: config.limit.to_string(),
            condition: SetCondition::Always,
            expiry: SetExpiry::None,
            get: false,
        };
        for (n, node) in nodes.iter_mut().enumerate() {
            let reply = node.execute(ConnId(u32::MAX), Millis(0), &set_max);
            t.lines.push(format!(
                "     admin → n{n}: {}  ⇒ {}",
                redis_cli(&set_max),
                reply_cli(&reply)
            ));
        }
    }
    let mut machines = Vec::new();
    for c in 0..2u8 {
        let m = Machine::new(id, &config_of(c), Token::new(format!("c{c}"))).map_err(|source| {
            DocsError::Config {
                protocol: id,
                source,
            }
        })?;
        machines.push(m);
    }
    let steps: [(u8, u64, &'static str); 6] = [
        (0, 0, "acquire"),
        (1, 1_000, "acquire"),
        (0, 2_000, "extend"),
        (0, 3_000, "release"),
        (1, 4_000, "acquire"),
        (1, 5_000, "release"),
    ];
    for (c, at, call) in steps {
        let now = Millis(at);
        let Some(m) = machines.get_mut(usize::from(c)) else {
            continue;
        };
        let result = match call {
            "acquire" => m.acquire(now, Acquire::Once),
            "extend" => m.extend(now),
            _ => m.release(now),
        };
        t.lines.push(format!("{at:>5} c{c} {call}"));
        if let Err(source) = result {
            // Recorded, not fatal: the page shows what the machine said.
            t.lines.push(format!("      c{c} refused: {source}"));
            continue;
        }
        drive(&mut t, &mut nodes, m, c, now)?;
    }
    Ok(t)
}

fn drive(
    t: &mut Transcript,
    nodes: &mut [Keyspace],
    m: &mut Machine,
    c: u8,
    now: Millis,
) -> Result<(), DocsError> {
    for _ in 0..1_000 {
        let mut busy = false;
        while let Some(req) = m.poll_transmit() {
            busy = true;
            let n = usize::from(req.node.0);
            let node = nodes
                .get_mut(n)
                .ok_or_else(|| DocsError::Inconsistent(format!("request to unknown node n{n}")))?;
            let reply = node.execute(ConnId(u32::from(c)), now, &req.command);
            collect_scripts(&req.command, &mut t.scripts);
            t.lines.push(format!(
                "      c{c} → n{n}: {}  ⇒ {}",
                redis_cli(&req.command),
                reply_cli(&reply)
            ));
            m.handle_reply(now, req.id, Outcome::Reply(reply));
        }
        while let Some(e) = m.poll_event() {
            busy = true;
            t.lines
                .push(format!("      c{c} event: {}", event_text(&e)));
        }
        if !busy {
            return Ok(());
        }
    }
    Err(DocsError::Inconsistent(
        "the machine never stopped sending".into(),
    ))
}

fn collect_scripts(c: &Command, out: &mut BTreeSet<Script>) {
    match c {
        Command::Eval { script, .. } => {
            out.insert(*script);
        }
        Command::Transaction(cmds) => cmds.iter().for_each(|c| collect_scripts(c, out)),
        _ => {}
    }
}

fn lease_text(l: &Lease) -> String {
    match l.fence {
        Some(f) => format!("valid until {} (fence {})", l.valid_until.get(), f.0),
        None if l.valid_until.get() == u64::MAX => "valid until forever (no TTL)".into(),
        None => format!("valid until {}", l.valid_until.get()),
    }
}

fn event_text(e: &Event) -> String {
    match e {
        Event::Acquired(l) => format!("Acquired, {}", lease_text(l)),
        Event::Denied => "Denied".into(),
        Event::Released { was_held } => format!("Released {{ was_held: {was_held} }}"),
        Event::Extended { lease: l, .. } => format!("Extended, {}", lease_text(l)),
        Event::NotExtended { .. } => "NotExtended".into(),
        Event::Lost => "Lost".into(),
        Event::Failed(err) => format!("Failed: {err}"),
        Event::RenewalFailed(err) => format!("RenewalFailed: {err}"),
    }
}

fn bound(b: &ScoreBound) -> String {
    match b {
        ScoreBound::NegInf => "-inf".into(),
        ScoreBound::PosInf => "+inf".into(),
        ScoreBound::Inclusive(v) => v.to_string(),
        ScoreBound::Exclusive(v) => format!("({v}"),
    }
}

/// A command as `redis-cli` would show it (a script by its name).
pub fn redis_cli(c: &Command) -> String {
    match c {
        Command::HIncrBy { key, field, by } => format!("HINCRBY {key} {field} {by}"),
        Command::HExists { key, field } => format!("HEXISTS {key} {field}"),
        Command::HGet { key, field } => format!("HGET {key} {field}"),
        Command::HDel { key, fields } => format!("HDEL {key} {}", fields.join(" ")),
        Command::Exists { keys } => format!("EXISTS {}", keys.join(" ")),
        Command::PTtl { key } => format!("PTTL {key}"),
        Command::Incr { key } => format!("INCR {key}"),
        Command::SAdd { key, members } => format!("SADD {key} {}", members.join(" ")),
        Command::SRem { key, members } => format!("SREM {key} {}", members.join(" ")),
        Command::SCard { key } => format!("SCARD {key}"),
        Command::SIsMember { key, member } => format!("SISMEMBER {key} {member}"),
        Command::ZAdd { key, members } => format!(
            "ZADD {key} {}",
            members
                .iter()
                .map(|(s, m)| format!("{s} {m}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Command::ZRem { key, members } => format!("ZREM {key} {}", members.join(" ")),
        Command::ZRank { key, member } => format!("ZRANK {key} {member}"),
        Command::ZScore { key, member } => format!("ZSCORE {key} {member}"),
        Command::ZCard { key } => format!("ZCARD {key}"),
        Command::ZRemRangeByScore { key, min, max } => {
            format!("ZREMRANGEBYSCORE {key} {} {}", bound(min), bound(max))
        }
        Command::ZInterStore {
            dest,
            keys,
            weights,
        } => format!(
            "ZINTERSTORE {dest} {} {} WEIGHTS {}",
            keys.len(),
            keys.join(" "),
            weights
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Command::Time => "TIME".into(),
        Command::Unwatch => "UNWATCH".into(),
        Command::Multi => "MULTI".into(),
        Command::Exec => "EXEC".into(),
        Command::Discard => "DISCARD".into(),
        Command::Transaction(cmds) => format!(
            "MULTI; {}; EXEC",
            cmds.iter().map(redis_cli).collect::<Vec<_>>().join("; ")
        ),
        Command::Wait {
            replicas,
            timeout_ms,
        } => format!("WAIT {replicas} {timeout_ms}"),
        Command::Publish { channel, message } => format!("PUBLISH {channel} {message}"),
        Command::Eval { script, keys, args } => {
            let mut s = format!("EVALSHA <{}> {}", script.name(), keys.len());
            for k in keys.iter().chain(args) {
                s.push(' ');
                s.push_str(k);
            }
            s
        }
        other => crate::model::command_text(other),
    }
}

/// A reply as `redis-cli` would show it.
pub fn reply_cli(r: &Reply) -> String {
    crate::model::reply_text(r)
}

// ---------------------------------------------------------------------------
// State diagrams (Mermaid), kept in the machines' own essays.

/// The heading in a machine's essay under which its state diagram is
/// kept; the essay the page shows ends before it.
const DIAGRAM_HEADING: &str = "# State machine";

/// The Mermaid diagram in the machine file's essay (the lines inside its
/// ```` ```mermaid ```` block, `stateDiagram-v2` first).
fn state_diagram(id: ProtocolId) -> Result<String, DocsError> {
    let mut lines = essay_lines(id)
        .skip_while(|l| *l != DIAGRAM_HEADING)
        .skip_while(|l| *l != "```mermaid")
        .skip(1);
    let mut out = String::new();
    for line in lines.by_ref() {
        if line == "```" {
            return Ok(out);
        }
        out.push_str(line);
        out.push('\n');
    }
    Err(DocsError::Inconsistent(format!(
        "{} has no ```mermaid block under \"{DIAGRAM_HEADING}\" in its essay",
        machine_file(id)
    )))
}

// ---------------------------------------------------------------------------
// The chaos suite (`chaos/tests/`): which test shows which cell on real Redis.

/// What every counterexample's page says about real Redis: the replay test
/// fails unless this trace replays with every reply and key equal.
const REPLAYED: &str = "*On real Redis:* this trace is replayed step by step by `chaos/tests/replay.rs` (every reply, key and expiry equal to the model's at every step; see [the replay table](../replay.md)).\n\n";

/// A chaos test that observes one model cell on real Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChaosTest {
    /// Protocol.
    pub protocol: ProtocolId,
    /// Model fault.
    pub fault: Fault,
    /// Property.
    pub property: PropertyId,
    /// File, from the workspace root.
    pub file: &'static str,
    /// The test function.
    pub test: &'static str,
    /// What it shows.
    pub shows: &'static str,
}

const fn chaos(
    protocol: ProtocolId,
    fault: Fault,
    property: PropertyId,
    file: &'static str,
    test: &'static str,
    shows: &'static str,
) -> ChaosTest {
    ChaosTest {
        protocol,
        fault,
        property,
        file,
        test,
        shows,
    }
}

/// The hand-written chaos scenarios and the cells they observe
/// (`model/tests/docs.rs` checks that each named test exists and names its
/// cell). Every violated cell is also replayed step by step on real Redis
/// by `chaos/tests/replay.rs`.
pub const CHAOS: &[ChaosTest] = &[
    chaos(ProtocolId::SetPxLua, Fault::Failover, PropertyId::MutualExclusion, "chaos/tests/failover.rs", "failover_loses_the_lock_and_wait_narrows_the_window", "the adapter itself, over a master and a replica whose link is cut: the unreplicated grant is lost when the replica is promoted and a second client acquires; with `WAIT 1` the grant is refused, and only the unwaited extend remains a window"),
];
