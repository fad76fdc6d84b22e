//! Running the Redis sections in order and rendering `docs/benchmarks.md`.

use crate::contention::{self, Contention, Waiter};
use crate::market::{self, Market, Variant};
use crate::model_run::{CellOutcome, ModelCell};
use crate::scale::{self, Scale};
use crate::stampede::{self, Stampede};
use crate::throughput::{self, Contender, Point};
use crate::util::{mean, ms, quantile, render_counts, Result};
use crate::Settings;
use lockwright_core::ProtocolId;
use lockwright_redis::LockOptions;
use lockwright_tests::RedisServer;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// Task counts of section 1.
const TASKS: [usize; 2] = [1, 16];

/// One section-1 row: which contender on how many masters and tasks.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// `adapter:<protocol>`, `rslock`, `raw` or `raw-nagle`.
    pub(crate) who: String,
    /// Masters.
    pub(crate) masters: usize,
    /// Tasks.
    pub(crate) tasks: usize,
    /// The measurement.
    pub(crate) point: Point,
}

/// Section 1 runs every point twice, in two passes one after the other
/// (within a pass, the contenders at one point back to back): the tables
/// show the first; the targets are judged in both.
const PASSES: usize = 2;

/// Everything measured in one run.
#[derive(Debug)]
pub(crate) struct Report {
    settings: Settings,
    rows: Vec<Row>,
    /// The second pass of section 1.
    rows_again: Vec<Row>,
    contention: Vec<(String, Contention)>,
    market_options: String,
    market: Vec<(Variant, usize, usize, Market)>,
    stampede: Vec<(bool, Stampede)>,
    scale: Vec<Scale>,
    /// The model section, when it ran.
    pub(crate) model: Option<Vec<ModelCell>>,
    /// Checker threads.
    pub(crate) model_threads: usize,
    /// The whole run.
    pub(crate) wall: Duration,
}

impl Report {
    /// An empty report.
    pub(crate) fn new(settings: Settings) -> Report {
        Report {
            settings,
            rows: Vec::new(),
            rows_again: Vec::new(),
            contention: Vec::new(),
            market_options: String::new(),
            market: Vec::new(),
            stampede: Vec::new(),
            scale: Vec::new(),
            model: None,
            model_threads: 0,
            wall: Duration::ZERO,
        }
    }

    fn row(&self, who: &str, masters: usize, tasks: usize) -> Option<&Point> {
        Report::find(&self.rows, who, masters, tasks)
    }

    fn find<'a>(rows: &'a [Row], who: &str, masters: usize, tasks: usize) -> Option<&'a Point> {
        rows.iter()
            .find(|r| r.who == who && r.masters == masters && r.tasks == tasks)
            .map(|r| &r.point)
    }
}

async fn admins(servers: &[RedisServer]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut out = Vec::new();
    for s in servers {
        out.push(s.conn().await);
    }
    out
}

/// Sections 1–4, against `masters` (5 servers; more are started for 2–4).
pub(crate) async fn run_redis_sections(
    settings: &Settings,
    masters: &[RedisServer],
    report: &mut Report,
) -> Result<()> {
    let (warmup, window) = (settings.warmup, settings.window);
    // Section 1.
    let configs: [(&str, Option<ProtocolId>, usize); 12] = [
        ("adapter:set-px-lua", Some(ProtocolId::SetPxLua), 1),
        ("adapter:fenced", Some(ProtocolId::Fenced), 1),
        ("adapter:time-fenced", Some(ProtocolId::TimeFenced), 1),
        (
            "adapter:lease-semaphore",
            Some(ProtocolId::LeaseSemaphore),
            1,
        ),
        (
            "adapter:time-fenced-semaphore",
            Some(ProtocolId::TimeFencedSemaphore),
            1,
        ),
        ("adapter:reentrant", Some(ProtocolId::Reentrant), 1),
        ("adapter:redlock", Some(ProtocolId::Redlock), 3),
        ("adapter:redlock", Some(ProtocolId::Redlock), 5),
        ("rslock", None, 1),
        ("rslock", None, 3),
        ("rslock", None, 5),
        ("raw", None, 1),
    ];
    let mut all: Vec<(&str, Option<ProtocolId>, usize)> = configs.to_vec();
    all.push(("raw", None, 3));
    all.push(("raw", None, 5));
    // The raw loop on redis-rs' default socket (Nagle's algorithm on), at
    // the fewest and the most masters: what the socket option costs.
    all.push(("raw-nagle", None, 1));
    all.push(("raw-nagle", None, 5));
    eprintln!(
        "[1/5] lock+unlock cycles/s ({} points, {:.1} s each, {PASSES} passes)",
        all.len() * TASKS.len(),
        window.as_secs_f64()
    );
    // The contenders at one point (masters, tasks) are measured back to
    // back, so that a ratio compares windows seconds apart rather than
    // minutes (this machine's load drifts over minutes); the second pass
    // runs them in the reverse order, so that of any two contenders each
    // runs first in one pass, and a drift within a point's block cannot
    // favour one of them in both.
    let mut counts: Vec<usize> = all.iter().map(|c| c.2).collect();
    counts.sort_unstable();
    counts.dedup();
    for pass in 1..=PASSES {
        for &n in &counts {
            let servers = &masters[..n];
            let mut admin = admins(servers).await;
            let mut at_n: Vec<(&str, Option<ProtocolId>)> = all
                .iter()
                .filter(|c| c.2 == n)
                .map(|&(who, protocol, _)| (who, protocol))
                .collect();
            if pass % 2 == 0 {
                at_n.reverse();
            }
            for tasks in TASKS {
                for &(who, protocol) in &at_n {
                    let contender = Contender::named(who, protocol, servers, tasks).await?;
                    let point =
                        throughput::measure(&mut admin, Arc::new(contender), tasks, warmup, window)
                            .await?;
                    eprintln!(
                        "  pass {pass}: {who:<20} {n} master(s) {tasks:>2} task(s): {:>8.0} cycles/s, {:.2} commands and {:.2} connections per cycle",
                        point.per_sec, point.commands_per_cycle, point.connections_per_cycle
                    );
                    let row = Row {
                        who: who.to_owned(),
                        masters: n,
                        tasks,
                        point,
                    };
                    if pass == 1 {
                        report.rows.push(row);
                    } else {
                        report.rows_again.push(row);
                    }
                }
            }
        }
    }
    // The tables list the rows by contender, as `all` names them.
    let rank = |r: &Row| {
        let at = all.iter().position(|c| c.0 == r.who && c.2 == r.masters);
        (at.unwrap_or(usize::MAX), r.tasks)
    };
    report.rows.sort_by_key(rank);
    report.rows_again.sort_by_key(rank);

    // Section 2, on a server of its own.
    eprintln!(
        "[2/5] contention: {} waiters, {} ms hold, {:.1} s per configuration",
        contention::WAITERS,
        contention::HOLD.as_millis(),
        settings.contention_window.as_secs_f64()
    );
    let server =
        RedisServer::start().map_err(|e| crate::util::BenchError::new("redis-server", e))?;
    let client = server.client();
    let mut stats = server.conn().await;
    let configs: Vec<(String, Waiter)> = vec![
        (
            "adapter, wake-on-release (notify: true)".into(),
            Waiter::adapter(&client, "contended-notify", |o| o.notify = true)?,
        ),
        (
            "adapter, polling (defaults: retry 10–200 ms)".into(),
            Waiter::adapter(&client, "contended-poll", |_| {})?,
        ),
        (
            "adapter, polling (retry 1 ms)".into(),
            Waiter::adapter(&client, "contended-poll1", |o| {
                o.retry_base = Duration::from_millis(1);
                o.retry_max = Duration::from_millis(1);
            })?,
        ),
        (
            "rslock acquire (defaults: 3 tries, 0–200 ms apart)".into(),
            Waiter::Rslock(rslock::LockManager::from_clients(vec![throughput::socket(
                &server, true,
            )?])),
        ),
    ];
    for (i, (label, waiter)) in configs.into_iter().enumerate() {
        let c = contention::measure(
            Arc::new(waiter),
            &format!("rs-contended-{i}"),
            &mut stats,
            warmup,
            settings.contention_window,
        )
        .await?;
        eprintln!(
            "  {label:<52} {:>6.0} acq/s, handoff p50 {} ms p99 {} ms (to another waiter p50 {} ms; {} of {} re-acquired by the releaser), {:.2} commands/acq",
            c.per_sec,
            ms(quantile(&c.handoffs, 0.5)),
            ms(quantile(&c.handoffs, 0.99)),
            ms(quantile(&c.handoffs_other, 0.5)),
            c.same_task,
            c.handoffs.len(),
            c.commands_per_acquisition
        );
        report.contention.push((label, c));
    }
    drop(stats);
    drop(server);

    // Section 3.
    eprintln!(
        "[3/5] marketplace: 3 variants × 3 mixes, {:.1} s each",
        settings.market_window.as_secs_f64()
    );
    let server =
        RedisServer::start().map_err(|e| crate::util::BenchError::new("redis-server", e))?;
    let client = server.client();
    // The book's `acquire_lock` retries every millisecond: the same here.
    let options = LockOptions {
        retry_base: Duration::from_millis(1),
        retry_max: Duration::from_millis(1),
        ..LockOptions::new(ProtocolId::SetPxLua, throughput::TTL)
    };
    report.market_options = "`set-px-lua`, TTL 10 s, polling every 1 ms as the book's \
        `acquire_lock` does (`retry_base` = `retry_max` = 1 ms), other options default"
        .into();
    for variant in Variant::ALL {
        for (listers, buyers) in [(1, 1), (5, 1), (5, 5)] {
            let m = market::run(
                &client,
                variant,
                listers,
                buyers,
                settings.market_window,
                options.clone(),
            )
            .await?;
            eprintln!(
                "  {:<15} {listers}L/{buyers}B: listed {:>7}, bought {:>7}, retries {:>7}, missed {:>5}",
                variant.label(),
                m.listed,
                m.bought,
                m.purchase_retries,
                m.missed
            );
            report.market.push((variant, listers, buyers, m));
        }
    }
    drop(server);

    // Section 4.
    eprintln!(
        "[4/5] cache stampede: {} readers, {} rounds, {} ms loader",
        settings.stampede_readers,
        settings.stampede_rounds,
        stampede::LOAD.as_millis()
    );
    let server =
        RedisServer::start().map_err(|e| crate::util::BenchError::new("redis-server", e))?;
    let client = server.client();
    for guarded in [false, true] {
        let s = stampede::run(
            &client,
            guarded,
            settings.stampede_readers,
            settings.stampede_rounds,
        )
        .await?;
        eprintln!(
            "  {:<28} loader calls {:>4}, p99 read {} ms",
            if guarded {
                "Cache::get_or_load"
            } else {
                "naive get-miss-load-set"
            },
            s.loader_calls,
            ms(quantile(&s.latencies, 0.99))
        );
        report.stampede.push((guarded, s));
    }
    drop(server);

    // Section 5.
    eprintln!(
        "[5/5] {} renewing holds at once ({}, TTL {} s, {} s each)",
        settings
            .scale_counts
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        scale::PROTOCOL,
        settings.scale_ttl.as_secs(),
        settings.scale_window.as_secs()
    );
    let server =
        RedisServer::start().map_err(|e| crate::util::BenchError::new("redis-server", e))?;
    for &count in &settings.scale_counts {
        let (port, ttl, window) = (server.port(), settings.scale_ttl, settings.scale_window);
        let s = tokio::task::spawn_blocking(move || scale::run_in_child(port, count, ttl, window))
            .await
            .map_err(|e| crate::util::BenchError::new("scale cell", e))??;
        eprintln!(
            "  {count:>7} holds: {} per hold, {:.0} renewals/s of {:.0} ideal, lag p99 {} ms, {} lost",
            s.bytes_per_hold
                .map_or_else(|| "n/a".to_owned(), |b| format!("{:.0} B", b)),
            s.renewals_per_sec,
            s.ideal_per_sec,
            lag_ms(s.lag(0.99)),
            s.lost
        );
        report.scale.push(s);
    }
    Ok(())
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| format!("({program} not found)"))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `name version` of the packages in Cargo.lock called `name`.
fn locked_versions(name: &str) -> Vec<String> {
    let lock =
        std::fs::read_to_string(crate::workspace_root().join("Cargo.lock")).unwrap_or_default();
    let mut out = Vec::new();
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l == format!("name = \"{name}\"") {
            if let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = ")) {
                out.push(v.trim_matches('"').to_owned());
            }
        }
    }
    out
}

/// A lag in ms, `n/a` when no renewal was seen.
fn lag_ms(lag: Option<Duration>) -> String {
    lag.map_or_else(|| "n/a".to_owned(), ms)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Client + server CPU per cycle, in µs.
fn cpu_total(p: &Point) -> Option<f64> {
    p.client_cpu_us.map(|c| c + p.server_cpu_us)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

impl Report {
    /// The Markdown report.
    pub(crate) fn render(&self) -> String {
        let mut o = String::new();
        let s = &self.settings;
        let _ = writeln!(o, "# Benchmarks\n");
        let _ = writeln!(
            o,
            "Generated by `{}` on {} in {:.0} s of wall time. Every figure below was measured in that \
             one run; rerun the command to regenerate this file (it starts its own `redis-server` \
             processes on free loopback ports and stops them at the end; `--quick` runs shorter \
             windows, skips model checking and writes `target/benchmarks-quick.md` instead).\n",
            s.command,
            command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            self.wall.as_secs_f64()
        );
        if s.quick {
            let _ = writeln!(
                o,
                "**Quick mode**: windows of {:.1} s, noisier than the default run.\n",
                s.window.as_secs_f64()
            );
        }
        let _ = writeln!(o, "## Machine and versions\n");
        let _ = writeln!(
            o,
            "| | |\n|---|---|\n| CPUs (`nproc`) | {} |\n| CPU | {} |\n| kernel | {} |\n| rustc | {} |\n| redis-server | {} |\n| redis (crate, adapter and raw loop) | {} |\n| rslock | {} (on redis {}) |\n| tokio | {} |\n| stateright | {} |\n| lockwright-* | {} |\n",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model(),
            command_output("uname", &["-sr"]),
            command_output("rustc", &["--version"]),
            command_output("redis-server", &["--version"]),
            locked_versions("redis").first().cloned().unwrap_or_default(),
            locked_versions("rslock").join(", "),
            // One redis-rs for all when the lock file holds a single one.
            locked_versions("redis").last().cloned().unwrap_or_default(),
            locked_versions("tokio").join(", "),
            locked_versions("stateright").join(", "),
            env!("CARGO_PKG_VERSION"),
        );
        let _ = writeln!(
            o,
            "The client (the bench, on a tokio multi-thread runtime with one worker per CPU) and every \
             `redis-server` share these CPUs, over loopback; absolute figures therefore say little \
             about a production deployment, so comparisons are given as ratios measured side by side \
             in the same run.\n"
        );
        self.render_throughput(&mut o);
        self.render_contention(&mut o);
        self.render_market(&mut o);
        self.render_stampede(&mut o);
        self.render_scale(&mut o);
        self.render_model(&mut o);
        o
    }

    fn render_throughput(&self, o: &mut String) {
        let s = &self.settings;
        let _ = writeln!(o, "## 1. Lock+unlock cycles per second\n");
        let _ = writeln!(
            o,
            "Each task locks and unlocks a name of its own in a loop (no contention; that is section 2), \
             TTL 10 s, for {:.1} s after a {:.1} s warm-up. **adapter** is `lockwright_redis::Lock` \
             (`acquire()` then `guard.release()`, default `LockOptions`, so `notify` is off and the \
             release script publishes nothing), one lock per task, every lock built with `Lock::on` \
             on one shared `Nodes`: one multiplexed connection per master for all of them (the \
             protocols measured here do not WATCH, so no hold opens a connection of its own). \
             **rslock** is `rslock::LockManager::lock` then `unlock`, one manager shared by the \
             tasks; **raw** is a redis-rs loop of `SET key token NX PX` then `EVALSHA` \
             compare-and-delete on one shared multiplexed connection per master (on several \
             masters: each step sent to all masters in parallel), the two round trips a correct \
             lease lock needs. The three use the same socket option: the adapter sets \
             `TCP_NODELAY` on its connections, and rslock and the raw loop are given clients that \
             set it too (redis-rs leaves it off by default); **raw-nagle** is the raw loop on \
             redis-rs' default socket, with Nagle's algorithm on (see below). Commands and new connections per cycle are summed over the masters \
             (from `INFO commandstats` and `total_connections_received` deltas over the window). \
             **Client CPU** is the bench process's user + system time over the window (`utime` + \
             `stime` of `/proc/self/stat`, in ticks of 1/{} s) per cycle; **server CPU** is the \
             masters' `used_cpu_user` + `used_cpu_sys` deltas of `INFO cpu`, summed, per cycle. \
             Both are read in the same window as the cycle count and include whatever else ran in \
             it (the runtime's own work, the servers' cron), which is small beside the cycles. \
             Its **system** part is `stime` alone: time the kernel spent on the process' behalf \
             (system calls, the loopback network stack, scheduling). \
             **CPUs busy** is (client + server CPU time) ÷ wall time, i.e. cycles/s × CPU per \
             cycle; **machine busy** is the busy share of all CPUs over the window, whoever used \
             them (`/proc/stat`). **Allocations** are the heap allocation calls (`alloc`, \
             `alloc_zeroed`, `realloc`) the bench process made over the window per cycle, counted \
             by its global allocator in one counter per thread (so counting adds no traffic \
             between the CPUs): unlike the CPU figures, this count depends little on what else \
             the machine did (retries, timeouts and buffer growth under load can still change it).\n",
            s.window.as_secs_f64(),
            s.warmup.as_secs_f64(),
            crate::util::clock_ticks()
        );
        let _ = writeln!(
            o,
            "| protocol | masters | tasks | adapter cycles/s | rslock cycles/s | raw cycles/s | adapter ÷ rslock | adapter ÷ raw | adapter commands/cycle | adapter connections/cycle |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut targets = Vec::new();
        for row in self.rows.iter().filter(|r| r.who.starts_with("adapter:")) {
            let protocol = row.who.trim_start_matches("adapter:");
            let (Some(rs), Some(raw)) = (
                self.row("rslock", row.masters, row.tasks),
                self.row("raw", row.masters, row.tasks),
            ) else {
                continue;
            };
            let p = &row.point;
            let (vs_rs, vs_raw) = (ratio(p.per_sec, rs.per_sec), ratio(p.per_sec, raw.per_sec));
            let _ = writeln!(
                o,
                "| {protocol} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.1} | {:.2} |",
                row.masters, row.tasks, p.per_sec, rs.per_sec, raw.per_sec, vs_rs, vs_raw,
                p.commands_per_cycle, p.connections_per_cycle
            );
            targets.extend(self.targets(protocol, row.masters, row.tasks));
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Commands per cycle by contender (all masters together):\n"
        );
        let _ = writeln!(
            o,
            "| contender | masters | tasks | cycles/s | commands/cycle | connections/cycle | client CPU µs/cycle | of which system | server CPU µs/cycle | client + server µs/cycle | CPUs busy (client + servers) | machine busy | allocations/cycle | by command |"
        );
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for row in &self.rows {
            let p = &row.point;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {:.1} | {} | {:.2} | {} | {:.1} | {} |",
                row.who,
                row.masters,
                row.tasks,
                p.per_sec,
                p.commands_per_cycle,
                p.connections_per_cycle,
                p.client_cpu_us
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                p.client_sys_us
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                p.server_cpu_us,
                cpu_total(p).map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                p.cpus_busy,
                p.machine_busy
                    .map_or_else(|| "n/a".to_owned(), |m| format!("{:.0} %", 100.0 * m)),
                p.allocs_per_cycle,
                render_counts(&p.commands, p.cycles.max(1) as f64)
            );
        }
        self.render_time_fence_cost(o);
        self.render_socket_option(o);
        let anomalies: u64 = self.rows.iter().map(|r| r.point.anomalies).sum();
        let _ = writeln!(
            o,
            "\nCycles in which the lock was found not held at release: {anomalies} (expected 0).\n"
        );
        let _ = writeln!(o, "### Targets\n");
        let _ = writeln!(
            o,
            "Every point of this section was measured twice, in two passes one after the other \
             (the tables above show the first); within a pass the contenders at one point \
             (masters, tasks) run back to back, so that a ratio compares windows seconds apart, \
             and the second pass runs them in the reverse order. A target is met only when it is \
             met in both. \
             The raw loop is the limit (the same two round trips with nothing else): \
             `set-px-lua` and `redlock` are to sit at ≥ 0.95× it, the protocols whose scripts do \
             more work per round trip (fences, counts, the permit ZSET) at ≥ 0.8× it; every \
             point at ≥ 1.0× rslock, with adapter client CPU per cycle ≤ 1.2× the raw loop's.\n"
        );
        let _ = writeln!(
            o,
            "| point | target | pass 1 | pass 2 | |\n|---|---|---:|---:|---|"
        );
        for t in &targets {
            let _ = writeln!(o, "{t}");
        }
        let missed = targets.iter().filter(|t| t.contains("missed")).count();
        let _ = writeln!(o, "\n{missed} of {} targets missed.\n", targets.len());
        self.render_why(o);
    }

    /// The target rows of one adapter point, judged in both passes.
    fn targets(&self, protocol: &str, masters: usize, tasks: usize) -> Vec<String> {
        let who = format!("adapter:{protocol}");
        let passes = [&self.rows, &self.rows_again];
        let measure = |f: &dyn Fn(&Point, &Point, &Point) -> Option<f64>| -> Vec<Option<f64>> {
            passes
                .iter()
                .map(|rows| {
                    let a = Report::find(rows, &who, masters, tasks)?;
                    let raw = Report::find(rows, "raw", masters, tasks)?;
                    let rs = Report::find(rows, "rslock", masters, tasks)?;
                    f(a, raw, rs)
                })
                .collect()
        };
        let raw_floor = if matches!(protocol, "set-px-lua" | "redlock") {
            0.95
        } else {
            0.8
        };
        let point = format!("{protocol}, {masters} master(s), {tasks} task(s)");
        let mut rows = Vec::new();
        let mut line = |target: String, values: Vec<Option<f64>>, met: &dyn Fn(f64) -> bool| {
            let cell = |v: &Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}×"));
            let all_met = values.iter().all(|v| v.is_some_and(met));
            rows.push(format!(
                "| {point} | {target} | {} | {} | {} |",
                cell(&values[0]),
                values.get(1).map_or_else(|| "n/a".to_owned(), cell),
                verdict(all_met)
            ));
        };
        line(
            format!("≥ {raw_floor:.2}× raw"),
            measure(&|a, raw, _| (raw.per_sec > 0.0).then(|| ratio(a.per_sec, raw.per_sec))),
            &|v| v >= raw_floor,
        );
        line(
            "≥ 1.0× rslock".to_owned(),
            measure(&|a, _, rs| (rs.per_sec > 0.0).then(|| ratio(a.per_sec, rs.per_sec))),
            &|v| v >= 1.0,
        );
        line(
            "client CPU/cycle ≤ 1.2× raw's".to_owned(),
            measure(&|a, raw, _| {
                let (a, raw) = (a.client_cpu_us?, raw.client_cpu_us?);
                (raw > 0.0).then(|| ratio(a, raw))
            }),
            &|v| v <= 1.2,
        );
        rows
    }

    /// What the time fence costs beside the counter it replaces, from the
    /// rows of this run: `time-fenced` against `fenced` and
    /// `time-fenced-semaphore` against `lease-semaphore`, at each task count.
    fn render_time_fence_cost(&self, o: &mut String) {
        let mut lines = Vec::new();
        for (with_clock, counter) in [
            ("time-fenced", "fenced"),
            ("time-fenced-semaphore", "lease-semaphore"),
        ] {
            for tasks in [1, 16] {
                let (Some(a), Some(b)) = (
                    self.row(&format!("adapter:{with_clock}"), 1, tasks),
                    self.row(&format!("adapter:{counter}"), 1, tasks),
                ) else {
                    continue;
                };
                let cpu = match (cpu_total(a), cpu_total(b)) {
                    (Some(x), Some(y)) => {
                        format!(", client + server CPU {:.2}× per cycle", ratio(x, y))
                    }
                    _ => String::new(),
                };
                lines.push(format!(
                    "- `{with_clock}` ÷ `{counter}`, {tasks} task(s): {:.2}× the cycles/s, \
                     {:+.1} commands per cycle{cpu}.",
                    ratio(a.per_sec, b.per_sec),
                    a.commands_per_cycle - b.commands_per_cycle
                ));
            }
        }
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\n### The cost of the time fence\n\nThe fence of `time-fenced` and \
             `time-fenced-semaphore` is `max(stored + 1, TIME in µs)`, computed in the grant \
             script that already runs: no extra round trip, but more work inside the script \
             (the commands above count the calls a script makes). Measured in this run, beside \
             the protocol with the plain counter:\n"
        );
        for line in lines {
            let _ = writeln!(o, "{line}");
        }
    }

    /// What Nagle's algorithm does to the raw loop, from the `raw-nagle`
    /// rows beside the `raw` ones (both passes).
    fn render_socket_option(&self, o: &mut String) {
        let mut lines = Vec::new();
        for row in self.rows.iter().filter(|r| r.who == "raw-nagle") {
            let (n, tasks) = (row.masters, row.tasks);
            fn pair(rows: &[Row], n: usize, tasks: usize) -> Option<(&Point, &Point)> {
                Some((
                    Report::find(rows, "raw-nagle", n, tasks)?,
                    Report::find(rows, "raw", n, tasks)?,
                ))
            }
            let (Some((a, b)), again) =
                (pair(&self.rows, n, tasks), pair(&self.rows_again, n, tasks))
            else {
                continue;
            };
            let second = again.map_or_else(String::new, |(a2, b2)| {
                format!(" (pass 2: {:.2}×)", ratio(a2.per_sec, b2.per_sec))
            });
            let sys = match (a.client_sys_us, b.client_sys_us) {
                (Some(x), Some(y)) => format!(", client system CPU {x:.1} against {y:.1} µs"),
                _ => String::new(),
            };
            lines.push(format!(
                "- {n} master(s), {tasks} task(s): {:.2}× the cycles/s{second}{sys}, server CPU \
                 {:.1} against {:.1} µs per cycle.",
                ratio(a.per_sec, b.per_sec),
                a.server_cpu_us,
                b.server_cpu_us
            ));
        }
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\n### The socket option\n\nThe raw loop on redis-rs' default socket (Nagle's \
             algorithm on: a small write waits while an earlier one is unacknowledged, so the \
             requests of many tasks leave in fewer segments) ÷ the same loop with `TCP_NODELAY`, \
             the option all three contenders above use:\n"
        );
        for line in lines {
            let _ = writeln!(o, "{line}");
        }
        let _ = writeln!(
            o,
            "\nThe adapter always sets `TCP_NODELAY` (as hiredis and node-redis do, and redis-rs \
             itself by default from its 2.0 on): a request never waits for another's acknowledgement. The comparisons \
             above and the targets below therefore give the raw loop and rslock the same \
             option; with redis-rs' default socket they would measure the option, not the \
             work per cycle."
        );
    }

    /// The section-1 explanation, computed from the rows.
    fn render_why(&self, o: &mut String) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let conns = self
            .rows
            .iter()
            .filter(|r| r.who.starts_with("adapter:"))
            .map(|r| r.point.connections_per_cycle)
            .fold(0.0f64, f64::max);
        let cmds = |who: &str| self.row(who, 1, 16).map_or(0.0, |p| p.commands_per_cycle);
        let (adapter_cmds, raw_cmds, rs_cmds) =
            (cmds("adapter:set-px-lua"), cmds("raw"), cmds("rslock"));
        let mut text = String::from("**Where the time goes.** ");
        if (adapter_cmds - raw_cmds).abs() < 0.05 {
            let _ = write!(
                text,
                "Not in the protocol's commands: the adapter's set-px-lua cycle sends the same two \
                 requests as the raw loop (`SET NX PX`, then `EVALSHA` of the compare-and-delete; \
                 `INFO commandstats` also counts the GET and DEL run inside the script, and with \
                 `notify` off the script publishes nothing): {adapter_cmds:.2} commands per cycle \
                 against the raw loop's {raw_cmds:.2} and rslock's {rs_cmds:.2} (1 master, 16 tasks). "
            );
        } else {
            let _ = write!(
                text,
                "The adapter's set-px-lua cycle counted {adapter_cmds:.2} commands against the raw \
                 loop's {raw_cmds:.2} and rslock's {rs_cmds:.2} (1 master, 16 tasks; `INFO \
                 commandstats` also counts commands run inside scripts). "
            );
        }
        let allocs = |who: &str, n: usize| self.row(who, n, 16).map(|p| p.allocs_per_cycle);
        for (who, n) in [("adapter:set-px-lua", 1), ("adapter:redlock", 5)] {
            if let (Some(a), Some(raw), Some(rs)) =
                (allocs(who, n), allocs("raw", n), allocs("rslock", n))
            {
                let _ = write!(
                    text,
                    "Heap allocations per cycle ({n} master(s), 16 tasks): {} {a:.1}, the raw \
                     loop {raw:.1}, rslock {rs:.1}. ",
                    who.trim_start_matches("adapter:")
                );
            }
        }
        if conns < 0.01 {
            let _ = write!(
                text,
                "Nor in connections: after warm-up no adapter point opened a new connection (at most \
                 {conns:.3} per cycle), as with rslock and the raw loop. "
            );
        } else {
            let _ = write!(
                text,
                "The adapter still opened up to {conns:.2} new connections per cycle (rslock and the \
                 raw loop none after warm-up), each costing round trips and accept/close work in \
                 `redis-server`. "
            );
        }
        let _ = write!(
            text,
            "The client and every `redis-server` share {cpus} CPUs, so no contender can run faster \
             than {cpus} CPU-seconds per second divided by its client + server CPU time per cycle \
             (cycles/s = CPUs busy ÷ CPU time per cycle). When two contenders get the same CPU \
             time per second, as they do when both saturate the CPUs, the ratio of their rates is \
             the inverse ratio of their (client + server) CPU time per cycle, and the two CPU \
             columns show on which side the difference lies."
        );
        let _ = writeln!(o, "{text}\n");
        for (who, masters) in [("adapter:set-px-lua", 1), ("adapter:redlock", 5)] {
            if let Some(line) = self.cpu_comparison(who, masters, 16) {
                let _ = writeln!(o, "- {line}");
            }
        }
        let one_task: Vec<&Point> = self
            .rows
            .iter()
            .filter(|r| r.tasks == 1 && r.masters == 1)
            .map(|r| &r.point)
            .collect();
        let max_busy = one_task.iter().map(|p| p.cpus_busy).fold(0.0f64, f64::max);
        let machine_idle = one_task
            .iter()
            .all(|p| p.machine_busy.is_some_and(|m| m < 0.9));
        if !one_task.is_empty() && machine_idle && max_busy < 0.8 * cpus as f64 {
            let _ = writeln!(
                o,
                "- At 1 task on 1 master the CPUs are not saturated (at most {max_busy:.2} of {cpus} \
                 busy): one task waits for each round trip, so latency, not CPU, bounds those rates."
            );
        }
        let crowded = self.rows.iter().filter(|r| {
            r.point.machine_busy.is_some_and(|m| m >= 0.95) && r.point.cpus_busy < 0.8 * cpus as f64
        });
        let crowded = crowded.count();
        if crowded > 0 {
            let _ = writeln!(
                o,
                "- At {crowded} of {} points the machine was at least 95 % busy while the client \
                 and the servers used less than 80 % of it: other processes took part of the CPUs \
                 during this run, so its rates are lower, and its ratios noisier, than on a quiet \
                 machine.",
                self.rows.len()
            );
        }
        let _ = writeln!(o);
    }

    /// Client and server CPU per cycle of the adapter row `who` beside the
    /// raw loop and rslock at the same point, with what they predict.
    fn cpu_comparison(&self, who: &str, masters: usize, tasks: usize) -> Option<String> {
        let a = self.row(who, masters, tasks)?;
        let raw = self.row("raw", masters, tasks)?;
        let rs = self.row("rslock", masters, tasks)?;
        let (at, rt, st) = (cpu_total(a)?, cpu_total(raw)?, cpu_total(rs)?);
        let cell = |p: &Point, t: f64| {
            format!(
                "{:.1} client + {:.1} server = {t:.1} µs",
                p.client_cpu_us.unwrap_or(0.0),
                p.server_cpu_us
            )
        };
        let mut line = format!(
            "{masters} master(s), {tasks} tasks, CPU time per cycle: adapter ({}) {}, raw loop {}, \
             rslock {}. ",
            who.trim_start_matches("adapter:"),
            cell(a, at),
            cell(raw, rt),
            cell(rs, st)
        );
        for (name, other, ot) in [("the raw loop", raw, rt), ("rslock", rs, st)] {
            let predicted = ratio(ot, at);
            let measured = ratio(a.per_sec, other.per_sec);
            let _ = write!(
                line,
                "Against {name}: (client + server) CPU per cycle predicts adapter ÷ {name} = \
                 {predicted:.2}×, measured {measured:.2}×"
            );
            let same_cpu =
                other.cpus_busy > 0.0 && (a.cpus_busy / other.cpus_busy - 1.0).abs() <= 0.1;
            let _ = write!(
                line,
                " ({:.2} and {:.2} CPUs busy{}{}). ",
                a.cpus_busy,
                other.cpus_busy,
                match (a.machine_busy, other.machine_busy) {
                    (Some(x), Some(y)) => format!(
                        ", the machine {:.0} % and {:.0} % busy",
                        100.0 * x,
                        100.0 * y
                    ),
                    _ => String::new(),
                },
                if same_cpu {
                    ": both got about the same CPU time per second (within 10 %), so the rates \
                     stand near the inverse ratio of their CPU time per cycle"
                } else {
                    ": they did not get the same CPU time per second, so the CPU per cycle \
                     explains the ratio only in part"
                }
            );
        }
        let (dc, ds) = (
            a.client_cpu_us.unwrap_or(0.0) - raw.client_cpu_us.unwrap_or(0.0),
            a.server_cpu_us - raw.server_cpu_us,
        );
        let dsys = match (a.client_sys_us, raw.client_sys_us) {
            (Some(x), Some(y)) => Some(x - y),
            _ => None,
        };
        let _ = write!(
            line,
            "Beside the raw loop the adapter spends {} µs {} client CPU{} and {} µs {} server CPU \
             per cycle{}.",
            format_args!("{:.1}", dc.abs()),
            if dc >= 0.0 { "more" } else { "less" },
            match dsys {
                Some(d) => format!(
                    " ({:.1} µs {} of it system time, {:.1} µs {} user time)",
                    d.abs(),
                    if d >= 0.0 { "more" } else { "less" },
                    (dc - d).abs(),
                    if dc - d >= 0.0 { "more" } else { "less" }
                ),
                None => String::new(),
            },
            format_args!("{:.1}", ds.abs()),
            if ds >= 0.0 { "more" } else { "less" },
            if dc > 0.0 && dc > 2.0 * ds.abs() {
                ": the difference is mostly in the client, in the adapter's own work per cycle, \
                 not in what the servers are asked to do"
            } else if ds > 0.0 && ds > 2.0 * dc.abs() {
                ": the difference is mostly on the servers"
            } else {
                ""
            }
        );
        Some(line)
    }

    fn render_contention(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "## 2. Contention: {} waiters, {} ms hold\n",
            contention::WAITERS,
            contention::HOLD.as_millis()
        );
        let _ = writeln!(
            o,
            "{} tasks loop on one `set-px-lua` lock (TTL 10 s): acquire, sleep 1 ms (tokio's timer, \
             so the measured hold is a little longer), release. **Handoff** is the time from the \
             holder calling `release` to the next `acquire` returning, whoever gets it (it includes \
             the release's own round trip). Commands per acquisition are every command the server \
             counted over the {:.1} s window (`INFO commandstats` after `CONFIG RESETSTAT`) divided \
             by the acquisitions in it. Targets: handoff p50 ≤ 1 ms; ≤ 4 commands per acquisition.\n",
            contention::WAITERS,
            self.settings.contention_window.as_secs_f64()
        );
        let _ = writeln!(o, "| configuration | acquisitions/s | mean hold ms | handoff p50 ms | handoff p99 ms | to another waiter: p50 ms | p99 ms | re-acquired by the releaser | commands/acquisition | p50 ≤ 1 ms | ≤ 4 commands | commands by name (per acquisition) |");
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
        );
        for (label, c) in &self.contention {
            let p50 = quantile(&c.handoffs, 0.5);
            let _ = writeln!(
                o,
                "| {label} | {:.0} | {} | {} | {} | {} | {} | {:.0} % | {:.2} | {} | {} | {} |",
                c.per_sec,
                ms(c.mean_hold),
                ms(p50),
                ms(quantile(&c.handoffs, 0.99)),
                ms(quantile(&c.handoffs_other, 0.5)),
                ms(quantile(&c.handoffs_other, 0.99)),
                100.0 * c.same_task as f64 / c.handoffs.len().max(1) as f64,
                c.commands_per_acquisition,
                verdict(p50 <= Duration::from_millis(1)),
                verdict(c.commands_per_acquisition <= 4.0),
                render_counts(&c.commands, c.acquisitions.max(1) as f64)
            );
        }
        self.render_contention_reading(o);
    }

    /// The section-2 reading, computed from the rows.
    fn render_contention_reading(&self, o: &mut String) {
        let find = |needle: &str| {
            self.contention
                .iter()
                .find(|(label, _)| label.contains(needle))
                .map(|(_, c)| c)
        };
        let per_acq = |c: &Contention, name: &str| {
            c.commands.get(name).copied().unwrap_or(0) as f64 / c.acquisitions.max(1) as f64
        };
        let same = |c: &Contention| 100.0 * c.same_task as f64 / c.handoffs.len().max(1) as f64;
        let mut text = String::from(
            "\nReading the table: `INFO commandstats` counts the commands run inside scripts, so \
             an uncontended `set-px-lua` acquire + release counts 4 with `notify` off (SET, \
             EVALSHA, and GET and DEL inside the release script; rslock's try is the same 4) and 5 \
             with `notify: true` (the release script also PUBLISHes the release notice). The ≤ 4 \
             target is therefore the floor of polling and rslock, with no room for a single denied \
             attempt, and one below the floor of wake-on-release.",
        );
        if let Some(w) = find("wake-on-release") {
            let subscribes = w.commands.get("subscribe").copied().unwrap_or(0);
            let sets = per_acq(w, "set");
            let _ = write!(
                text,
                " Wake-on-release keeps one channel subscription per `Lock` ({}), lines its \
                 waiters up first come first served and wakes only the first in line per release \
                 notice, which tries once (`SET NX PX`); there is no `PTTL` probe and no connection \
                 per acquire, and a waiter that hears nothing retries after min(TTL, 2 s) jittered \
                 to 50–100 %. Measured: {:.2} commands per acquisition against that floor of 5, \
                 {sets:.2} SET per acquisition ({}), handoff p50 {} ms (to another waiter {} ms), \
                 {:.0} % of acquisitions by the task that had just released.",
                if subscribes == 0 {
                    "made before the window, so no SUBSCRIBE is counted in it".to_owned()
                } else {
                    format!("SUBSCRIBE {subscribes} time(s) in the window")
                },
                w.commands_per_acquisition,
                if sets <= 1.005 {
                    "next to no denied attempt".to_owned()
                } else {
                    format!("{:.2} denied attempts per acquisition", sets - 1.0)
                },
                ms(quantile(&w.handoffs, 0.5)),
                ms(quantile(&w.handoffs_other, 0.5)),
                same(w)
            );
        }
        if let Some(p) = find("polling (defaults") {
            let _ = write!(
                text,
                " Polling lets the releasing task, which loops straight back into `acquire`, win \
                 again at once while the others sleep their retry delay: with the default delays \
                 {:.0} % of acquisitions went back to the releaser, so the handoff is short (p50 {} \
                 ms) but unfair, at {:.2} commands per acquisition ({:.2} SET).",
                same(p),
                ms(quantile(&p.handoffs, 0.5)),
                p.commands_per_acquisition,
                per_acq(p, "set")
            );
        }
        if let Some(p) = find("retry 1 ms") {
            let _ = write!(
                text,
                " Polling every 1 ms buys a handoff p50 of {} ms with {:.2} commands per \
                 acquisition ({:.2} SET, the denied attempts).",
                ms(quantile(&p.handoffs, 0.5)),
                p.commands_per_acquisition,
                per_acq(p, "set")
            );
        }
        let _ = writeln!(o, "{text}\n");
    }

    fn render_market(&self, o: &mut String) {
        let _ = writeln!(o, "## 3. The \"Redis in Action\" marketplace\n");
        let _ = writeln!(
            o,
            "Chapters 4.4 and 6.2: sellers put a new item in their inventory and list it (move it to \
             the `market:` ZSET); buyers pick a random listed item (`ZRANDMEMBER`) and buy it (price \
             from seller to buyer, item to the buyer's inventory, delisted). Each mix runs for {:.1} s ({}the \
             book runs 60 s). \
             **WATCH/MULTI** is the book's `list_item`/`purchase_item` with the redis crate directly \
             (WATCH the inventory, or the market and the buyer; retry when EXEC aborts). The lock \
             variants run the same reads and the same MULTI/EXEC without WATCH inside a lock of the \
             adapter: one lock named `market:` for everything, or one lock per item \
             (`market:<item>.<seller>`, the book's fine-grained locking, a `Lock` made per \
             operation); every lock of a variant is built with `Lock::on` on one shared `Nodes`, so \
             all of them share one connection. Lock options: {}. \
             *Retries* counts WATCH aborts of purchases (listing aborts in parentheses); the lock \
             variants wait inside `acquire` instead and have none. *Missed* counts purchases that \
             found the item sold already. Latencies are means per completed operation, including \
             retries and lock waits.\n",
            self.settings.market_window.as_secs_f64(),
            if self.settings.quick {
                "shortened by `--quick`; "
            } else {
                ""
            },
            self.market_options
        );
        let _ = writeln!(o, "| variant | listers | buyers | listed | bought | purchase retries (list) | missed | mean list ms | mean purchase ms |");
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (v, l, b, m) in &self.market {
            let _ = writeln!(
                o,
                "| {} | {l} | {b} | {} | {} | {} ({}) | {} | {} | {} |",
                v.label(),
                m.listed,
                m.bought,
                m.purchase_retries,
                m.list_retries,
                m.missed,
                ms(mean(&m.list_latency)),
                ms(mean(&m.buy_latency))
            );
        }
        let bought = |v: Variant| {
            self.market
                .iter()
                .find(|(x, l, b, _)| *x == v && *l == 5 && *b == 5)
                .map_or(0, |(_, _, _, m)| m.bought)
        };
        let (w, ml, il) = (
            bought(Variant::Watch),
            bought(Variant::MarketLock),
            bought(Variant::ItemLock),
        );
        let best = ml.max(il);
        let reproduces = best as f64 >= 2.0 * w as f64;
        let _ = writeln!(
            o,
            "\nThe book (table 6.1 against 6.2 and 6.3) reports that under contention (5 listers, \
             5 buyers) the WATCH version completes only a small fraction of the purchases the locked \
             versions complete, spending its time in retries, and that fine-grained locks do best. \
             Here, with 5 listers and 5 buyers: WATCH bought {w}, the market lock {ml}, per-item \
             locks {il}. **{}**\n",
            if reproduces {
                format!(
                    "This reproduces the book's claim: the best lock variant completes {:.1}× the WATCH \
                     variant's purchases.",
                    ratio(best as f64, w.max(1) as f64)
                )
            } else {
                format!(
                    "This does not reproduce the book's claim (best lock variant {:.2}× WATCH). \
                     Likely reasons: Redis on loopback answers in tens of microseconds, so a WATCH \
                     window is short and conflicts are rarer than over the book's network and Python \
                     client; and every locked operation adds the lock's own two round trips \
                     (`SET NX PX`, then the release script) to the operation's, where the WATCH \
                     version adds one (WATCH) and pays only when a conflict forces a retry.",
                    ratio(best as f64, w.max(1) as f64)
                )
            }
        );
    }

    fn render_scale(&self, o: &mut String) {
        let Some(first) = self.scale.first() else {
            return;
        };
        let ttl = first.ttl;
        let _ = writeln!(o, "## 5. Many renewing holds at once\n");
        let _ = writeln!(
            o,
            "`N` locks of `{}` (TTL {} s, `auto_renew` on: each hold's driver renews it every \
             TTL/3 = {:.1} s) are built with `Lock::on` on one `Nodes` (one connection), taken by \
             64 tasks and held for {:.0} s, then released; each N runs in a fresh child process. \
             **Memory per hold** is the growth of that process' resident set (`VmRSS`) from \
             before the locks were built to after the last was taken, ÷ N: the `Lock` handle, \
             its guard and the driver task that renews it. **Renewals/s** is the server's `EVALSHA` count over the window (`INFO \
             commandstats`; nothing else runs a script then) ÷ the window, beside the ideal N ÷ \
             (TTL/3). **Lag** is how late each renewal left behind its schedule: a renewal moves \
             the guard's `valid_until` to its send time + TTL − drift, so the bench reads every \
             guard's `valid_until` four times per renewal period and each step between two \
             readings, less TTL/3, is how late the driver issued the renewal that made it (in whole \
             milliseconds, the resolution of the lease's clock; the time the request then waits \
             on the connection is not in it). The window starts half a renewal period after the \
             last grant, after one warm-up hold taken and given back. **Client CPU per \
             renewal** is the CPU time of the process' threads over the window (`schedstat`, in \
             ns), less the CPU time of those readings, ÷ the renewals the server counted.\n",
            scale::PROTOCOL,
            ttl.as_secs(),
            (ttl / 3).as_secs_f64(),
            first.window.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "| holds | taken in s | memory per hold | renewals/s | ideal/s | renewals ÷ ideal | lag p50 ms | lag p99 ms | lag max ms | renewals seen | client CPU µs/renewal | lost |"
        );
        let _ = writeln!(
            o,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for s in &self.scale {
            let _ = writeln!(
                o,
                "| {} | {:.2} | {} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} |",
                s.holds,
                s.acquire_time.as_secs_f64(),
                s.bytes_per_hold
                    .map_or_else(|| "n/a".to_owned(), |b| format!("{:.1} KiB", b / 1024.0)),
                s.renewals_per_sec,
                s.ideal_per_sec,
                ratio(s.renewals_per_sec, s.ideal_per_sec),
                lag_ms(s.lag(0.5)),
                lag_ms(s.lag(0.99)),
                lag_ms(s.lag(1.0)),
                s.renewals_seen(),
                s.client_cpu_us
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                s.lost
            );
        }
        let smallest = self.scale.iter().min_by_key(|s| s.holds);
        let largest = self.scale.iter().max_by_key(|s| s.holds);
        let (Some(small), Some(large)) = (smallest, largest) else {
            return;
        };
        if small.holds == large.holds {
            return;
        }
        let _ = writeln!(
            o,
            "\nTarget: the cost per hold at {} holds within 1.5× of the figure at {} holds \
             (a ratio that cannot be computed is a miss).\n",
            large.holds, small.holds
        );
        let _ = writeln!(
            o,
            "| cost | {} holds | {} holds | ratio | |\n|---|---:|---:|---:|---|",
            small.holds, large.holds
        );
        let row = |name: &str, a: Option<f64>, b: Option<f64>, unit: &str, scale: f64| {
            let r = match (a, b) {
                (Some(a), Some(b)) if a > 0.0 => Some(b / a),
                _ => None,
            };
            let cell = |v: Option<f64>| {
                v.map_or_else(|| "n/a".to_owned(), |v| format!("{:.1} {unit}", v / scale))
            };
            format!(
                "| {name} | {} | {} | {} | {} |",
                cell(a),
                cell(b),
                r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}×")),
                verdict(r.is_some_and(|r| r <= 1.5))
            )
        };
        let _ = writeln!(
            o,
            "{}",
            row(
                "memory per hold",
                small.bytes_per_hold,
                large.bytes_per_hold,
                "KiB",
                1024.0
            )
        );
        let _ = writeln!(
            o,
            "{}",
            row(
                "client CPU per renewal",
                small.client_cpu_us,
                large.client_cpu_us,
                "µs",
                1.0
            )
        );
        let (la, lb) = (small.lag(0.99), large.lag(0.99));
        let _ = writeln!(
            o,
            "| renewal lag p99 | {} ms | {} ms | {} | |",
            lag_ms(la),
            lag_ms(lb),
            match (la, lb) {
                (Some(a), Some(b)) if !a.is_zero() =>
                    format!("{:.2}×", b.as_secs_f64() / a.as_secs_f64()),
                _ => "n/a".to_owned(),
            }
        );
        if let (Some(a), Some(b)) = (small.bytes_per_hold, large.bytes_per_hold) {
            let marginal = (b * large.holds as f64 - a * small.holds as f64)
                / (large.holds - small.holds) as f64;
            let _ = writeln!(
                o,
                "\nThe marginal memory of a hold between the two ((growth at {} − growth at {}) ÷ \
                 {} holds, so that what every run pays once cancels out): {:.1} KiB.",
                large.holds,
                small.holds,
                large.holds - small.holds,
                marginal / 1024.0
            );
        }
        let lost: usize = self.scale.iter().map(|s| s.lost).sum();
        let _ = writeln!(
            o,
            "\nHolds lost or no longer held at the end of a window: {lost} (expected 0).\n"
        );
    }

    fn render_stampede(&self, o: &mut String) {
        let _ = writeln!(o, "## 4. The cache-stampede guard\n");
        let _ = writeln!(
            o,
            "{} readers read one absent (expired) key at the same instant; the loader sleeps {} ms. \
             *Naive* is `GET`, and on a miss load then `SET … PX`; *guarded* is \
             `Cache::get_or_load` (default `CacheOptions`: `set-px-lua` per key, re-read every 10 ms). \
             {} rounds, the key and the lock gone before each.\n",
            self.settings.stampede_readers,
            stampede::LOAD.as_millis(),
            self.settings.stampede_rounds
        );
        let _ = writeln!(
            o,
            "| reader | loader calls | per round | read p50 ms | read p99 ms | max ms | errors |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|");
        for (guarded, s) in &self.stampede {
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {} | {} | {} | {} |",
                if *guarded {
                    "guarded (`Cache::get_or_load`)"
                } else {
                    "naive get-miss-load-set"
                },
                s.loader_calls,
                s.loader_calls as f64 / self.settings.stampede_rounds.max(1) as f64,
                ms(quantile(&s.latencies, 0.5)),
                ms(quantile(&s.latencies, 0.99)),
                ms(quantile(&s.latencies, 1.0)),
                s.errors
            );
        }
        let _ = writeln!(
            o,
            "\nThe guard's price is latency: waiters see the load time plus up to one re-read \
             interval; its gain is that the \
             database behind the loader sees one load per expiry instead of one per reader.\n"
        );
    }

    fn render_model(&self, o: &mut String) {
        let _ = writeln!(o, "## 6. Model checking\n");
        let Some(cells) = &self.model else {
            let _ = writeln!(
                o,
                "Not run (`--quick` or `--no-model`; pass `--model` to include it).\n"
            );
            return;
        };
        let _ = writeln!(
            o,
            "`lockwright_model::matrix::check` (breadth-first, {} checker threads, no trace \
             shortening) for every catalogue protocol under each of the {} matrix columns, each \
             (protocol, fault) run in a child process capped at {} s; a run over the cap is stopped \
             and listed as skipped (raise the cap with `--model-cap SECS`). The verdicts themselves \
             are the `lockwright check` command's business (docs of `model/`); this section reports \
             cost only.\n",
            self.model_threads,
            lockwright_model::Fault::COLUMNS.len(),
            self.settings.model_cap.as_secs()
        );
        let mut per: BTreeMap<&str, (u64, f64, usize, usize)> = BTreeMap::new();
        let (mut states, mut secs, mut done, mut skipped) = (0u64, 0f64, 0usize, Vec::new());
        let (mut generated, mut violated) = (0u64, 0u64);
        let mut failed = Vec::new();
        for c in cells {
            let e = per.entry(c.protocol.as_str()).or_default();
            match &c.outcome {
                CellOutcome::Done {
                    states: st,
                    seconds,
                    generated: g,
                    violated: v,
                } => {
                    generated += g;
                    violated += u64::from(*v);
                    e.0 += st;
                    e.1 += seconds;
                    e.2 += 1;
                    states += st;
                    secs += seconds;
                    done += 1;
                }
                CellOutcome::Skipped(d) => {
                    e.3 += 1;
                    skipped.push(format!(
                        "{} × {} (stopped after {:.0} s)",
                        c.protocol,
                        c.fault,
                        d.as_secs_f64()
                    ));
                }
                CellOutcome::Failed(err) => {
                    failed.push(format!("{} × {}: {err}", c.protocol, c.fault))
                }
            }
        }
        let _ = writeln!(
            o,
            "| protocol | runs done | skipped | unique states | seconds | states/s |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|");
        let order: Vec<&str> =
            cells
                .iter()
                .map(|c| c.protocol.as_str())
                .fold(Vec::new(), |mut v, p| {
                    if !v.contains(&p) {
                        v.push(p);
                    }
                    v
                });
        for p in order {
            if let Some((st, s, d, sk)) = per.get(p) {
                let _ = writeln!(
                    o,
                    "| {p} | {d} | {sk} | {st} | {s:.2} | {:.0} |",
                    ratio(*st as f64, *s)
                );
            }
        }
        let _ = writeln!(
            o,
            "| **all** | {done} | {} | {states} | {secs:.2} | {:.0} |",
            skipped.len(),
            ratio(states as f64, secs)
        );
        let _ = writeln!(
            o,
            "\nOver the runs that finished: {states} unique states ({generated} generated) in \
             {secs:.1} s of checker time, {:.0} unique states/s; {violated} (protocol, fault, \
             property) cells violated.\n",
            ratio(states as f64, secs)
        );
        if !skipped.is_empty() {
            let _ = writeln!(o, "Skipped at the cap: {}.\n", skipped.join("; "));
        }
        if !failed.is_empty() {
            let _ = writeln!(o, "Failed: {}.\n", failed.join("; "));
        }
    }
}
