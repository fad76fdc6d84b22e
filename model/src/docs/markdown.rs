//! The pages: the verdict matrix, one page per protocol, the index, and
//! the table of chaos tests (see the [parent module](super)).

use super::*;
use std::fmt::Write as _;

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
        PropertyId::OwnerOnly => "no command a client sends (acquire, undo, release, extend, renewal) removes, changes or sets an expiry on another owner's hold; evictions, takeovers and repairs by the protocol's own rule are judged by mutual exclusion",
        PropertyId::Progress => "a running waiting client does not wait longer than `2·ttl + 2·max retry delay` while no live client is inside, no paused client that has not finished still holds at the servers (acquiring, holding, or with its release not yet sent), and every node is up and reachable (a client cut off alone from its node, or from a majority of RedLock's masters, is excused until the cut heals; while a RedLock master is down or cut off from every client nobody is judged: two waiters can then split the other two masters between them on every round, a livelock that only a random retry delay breaks, and the model's retries are fixed, not random: each fires at its machine's delay, one per run up to a second late)",
    }
}

fn fault_summary(f: Fault) -> &'static str {
    match f {
        Fault::None => "no fault: only interleavings of clients, nodes and time",
        Fault::Crash => "a client stops for good at any step",
        Fault::Pause => "a client takes no step while time advances (GC pause, stalled VM), then resumes",
        Fault::ClientSkew => "client clocks disagree: one is half a TTL ahead and runs 1 % slow (within RedLock's drift allowance)",
        Fault::ClientStep => "one client's clock steps back by 500 ms once, at any instant (an NTP step); its machine reads that clock at every step, as a front end that reads the wall clock does (the adapter's clock is monotonic: a step after it started does not reach it)",
        Fault::ClockJump => "one node's clock jumps forward by TTL + 1",
        Fault::ClockBack => "a node restarts empty and its clock comes back 500 ms behind (more than the restart took)",
        Fault::Restart => "a node restarts empty; it is down for 1 ms",
        Fault::RestartDelayed => "a node restarts empty but stays down for longer than the TTL first",
        Fault::RestartPersisted => "a node restarts with its data (AOF with `fsync always`)",
        Fault::Failover => "node 0 has an asynchronous replica that is promoted, dropping what it had not received; the promotion takes 1 ms",
        Fault::FailoverClockLag => "failover, with the replica's clock 500 ms behind its master's",
        Fault::SplitBrain => "failover in a split brain: the replica is promoted while one client still reaches the old master, which accepts its writes until it learns of the promotion, then drops them and kills its connections",
        Fault::Delay => "one request is held up past the TTL (the client times out; the request still runs later, after requests on the new connection may have overtaken it), and one request or reply may be lost",
        Fault::Partition => "a node is cut off from every client for a while; messages into the cut are lost and their senders time out",
        Fault::ClientPartition => "one client is cut off from one node for a while, while the other clients still reach it; the client's messages into the cut are lost and it times out",
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
        "{} clients{}, {} node{}, TTL {} ms, retries every {}–{} ms plus up to {} ms of jitter, request latency up to {} ms, reply timeout {} ms, horizon {} ms (where `progress` is checked, {}: each may keep the clients out, or one client from a quorum, for longer than a TTL, and a waiter's patience counts from the end of such an obstruction), one fault action per run",
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
        cfg.horizon,
        moved_horizons(&cfg),
    )
}

/// Where `progress` is checked, each horizon other than `cfg`'s with the
/// faults that move it there, one group per distinct
/// [`ModelConfig::obstruction`], the groups apart by "; " (e.g. "42001 ms
/// under `pause` and `delay`").
fn moved_horizons(cfg: &ModelConfig) -> String {
    let mut groups: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for f in Fault::ALL {
        let obstruction = ModelConfig::obstruction(f, cfg.ttl);
        if obstruction > 0 {
            groups
                .entry(cfg.horizon + obstruction)
                .or_default()
                .push(format!("`{f}`"));
        }
    }
    groups
        .into_iter()
        .map(|(horizon, faults)| format!("{horizon} ms under {}", english_list(&faults)))
        .collect::<Vec<_>>()
        .join("; ")
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
        s.push_str(". None is marked: `model/tests/clients.rs` reruns every two-client run with a third client (each stopped at a cap of states, compared where it decides), `model/tests/nodes.rs` reruns RedLock's three-master runs on five masters (likewise capped, deciding 20 of RedLock's 64 cells; whole, the five-master `pause` space alone passed 20 GB unfinished) and `model/tests/reductions.rs` reruns small bounds without each reduction (RedLock's and `fair-semaphore-locked`'s full rows on request, `-- --ignored`; prompt delivery and the late-retry bound under six faults and prompt replies under all but `split-brain` unless `LOCKWRIGHT_FULL_REDUCTIONS=1`), and none finds a verdict that differs. At the reductions test's horizons (at most a TTL and a second) a waiter's 30 s patience cannot run out, so that test judges `progress` with a patience of 9 s and compares it for every switch but prompt delivery and all-off (latency alone stretches an unobstructed wait to 9.4 s there, a third of the standard patience); RedLock's half-TTL runs (5 s) stay below even that patience.\n");
    } else {
        s.push_str(":\n\n");
    }
    for (p, f, prop, why) in matrix::BOUND_GAPS {
        let _ = writeln!(s, "- `{p}` × `{f}` × `{prop}`: {why}.");
    }
    s.push_str("\n## <a id=\"can-it-fail\"></a>Can each `ok` fail?\n\n");
    s.push_str("A property that the model under a fault could not break would read `ok` in every row of that column. Wherever a protocol holds a property under a fault, the checker finds the same property violated under the same fault, at the same bounds, by another protocol of the table");
    let all_hold: Vec<String> = Fault::ALL
        .into_iter()
        .flat_map(|f| PropertyId::ALL.into_iter().map(move |prop| (f, prop)))
        .filter(|&(f, prop)| {
            ProtocolId::all().all(|p| verdict_of(computed, p, f, prop) == Some(Verdict::Holds))
        })
        .map(|(f, prop)| format!("`{f}` × `{prop}`"))
        .collect();
    if all_hold.is_empty() {
        s.push('.');
    } else {
        let _ = write!(
            s,
            "; where no protocol is violated ({}), by a mutant the tests keep: `setnx-del` whose release checks the owner, then deletes another key, so that every hold stays for ever and a waiter starves",
            all_hold.join(", ")
        );
    }
    s.push_str(" (`model/tests/matrix.rs`, `every_column_that_holds_somewhere_can_fail`, computes this from the same runs and fails on a column that nothing breaks). Faults are optional actions, so such a violation may be one on which the fault does not act; that each fault leaves room to see a violation after it strikes, within the horizon, is a second test: the same mutant starves a waiter in a state where the fault has acted, under every fault (`a_starved_waiter_is_seen_after_every_fault`; under `delay`, after its lost-message strike, as holding a message up does not spend the fault's budget). It once failed for `restart-delayed`, whose node stays down for the TTL: a waiter's patience counts from the node's return, so at a 32 s horizon no starvation after it could be seen, and `watch-semaphore` × `restart-delayed` × `progress` read `ok`; the horizon of that column's progress run now moves by the node's time down. Where `progress` is checked, the horizon now moves by a TTL and a millisecond under every fault that may keep the clients out that long (`ModelConfig::obstruction`: a node down or cut off from every client, a client cut off from a quorum, a paused holder, a message held up beyond the latency bound), so that such an obstruction may outlast every lease and still leave a waiter its whole patience. That longer horizon first flipped five cells under `pause` to `progress` violated; the trace showed the model's own client loop at fault: a holder whose validity ran out before it wrote left without releasing, and its renewal kept the lock for ever, as the `LeaksItsHold` mutant does on purpose. The client now releases there, as a front end's dropped guard does, and no verdict changed. The margin is still finite: a starvation that needs an obstruction longer than a TTL and about 2 s is not seen. Most runs check all four properties at once, and so the safety properties too at the longer horizon; the three-client safety runs of `setnx-getset` and `set-px-get-del` keep 32 s. At the longer horizon the safety properties of every protocol gave the same verdicts under these five faults as at 32 s.\n\n");
    s.push_str("Per protocol, the tests keep mutants where a row holds for a reason worth showing. An application that leaks its hold (it leaves after its write without releasing, while its machine goes on) starves the waiters under `none` wherever nothing ends the hold: `setnx-del` and `watch-semaphore`, which have no TTL, and the five protocols that renew their lease (`reentrant`, `fenced`, `time-fenced`, `lease-semaphore`, `time-fenced-semaphore`); the other nine keep progress, as their TTL frees the leaked hold (`a_leaked_hold_starves_the_waiters_unless_its_ttl_frees_it`). `watch-semaphore` keeps mutual exclusion under `restart` only because every acquire after it fails (the restart loses the max-size key): a front end that reads a missing size as its configured limit admits a second holder (`watch_semaphore_holds_under_restart_only_by_failing`). `fenced` keeps mutual exclusion under `client-step` by its renewal alone (`a_client_step_breaks_a_lease_that_does_not_renew`).\n");
    s.push_str("\n## Legend\n\n");
    s.push_str("| code | property | holds when |\n|---|---|---|\n");
    for p in PropertyId::ALL {
        let _ = writeln!(s, "| {} | `{p}` | {} |", short(p), property_summary(p));
    }
    s.push_str("\n| fault | what the environment may do |\n|---|---|\n");
    for f in Fault::ALL {
        let _ = writeln!(s, "| `{f}` | {} |", fault_summary(f));
    }
    let _ = writeln!(
        s,
        "\nThe first {} faults are the columns of `lockwright check`; `restart-delayed`, `restart-persisted`, `failover-clock-lag` and `split-brain` are variants of a restart and a failover (RedLock's delayed restarts, AOF with `fsync always`, a promoted replica whose clock lags, an old master that keeps serving one client until it learns of the promotion).",
        Fault::COLUMNS.len()
    );

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
        ProtocolId::SetnxDel => include_str!("../../../core/src/locks/setnx_del.rs"),
        ProtocolId::SetnxExpire => include_str!("../../../core/src/locks/setnx_expire.rs"),
        ProtocolId::SetnxGetset => include_str!("../../../core/src/locks/setnx_getset.rs"),
        ProtocolId::SetPxGetDel => include_str!("../../../core/src/locks/set_px_get_del.rs"),
        ProtocolId::SetPxWatch => include_str!("../../../core/src/locks/set_px_watch.rs"),
        ProtocolId::SetPxLua => include_str!("../../../core/src/locks/set_px_lua.rs"),
        ProtocolId::Reentrant => include_str!("../../../core/src/locks/reentrant.rs"),
        ProtocolId::Redlock => include_str!("../../../core/src/locks/redlock.rs"),
        ProtocolId::Fenced => include_str!("../../../core/src/locks/fenced.rs"),
        ProtocolId::TimeFenced => include_str!("../../../core/src/locks/time_fenced.rs"),
        ProtocolId::ZsetSemaphore => include_str!("../../../core/src/semaphores/zset_semaphore.rs"),
        ProtocolId::FairSemaphore => include_str!("../../../core/src/semaphores/fair_semaphore.rs"),
        ProtocolId::FairSemaphoreLocked => {
            include_str!("../../../core/src/semaphores/fair_semaphore_locked.rs")
        }
        ProtocolId::WatchSemaphore => {
            include_str!("../../../core/src/semaphores/watch_semaphore.rs")
        }
        ProtocolId::LeaseSemaphore => {
            include_str!("../../../core/src/semaphores/lease_semaphore.rs")
        }
        ProtocolId::TimeFencedSemaphore => {
            include_str!("../../../core/src/semaphores/time_fenced_semaphore.rs")
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

/// `a`, `a and b`, `a, b and c`.
fn english_list(items: &[String]) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}
