//! Every counterexample of the verdict matrix, replayed on real Redis.
//!
//! The replay (`lockwright_chaos::replay`) executes the model's shortest
//! counterexample of each violated cell action by action on real servers
//! whose wall clocks stand at the model's node clocks, with real kills,
//! restarts and replication, and requires Redis' reply and keys to equal
//! the model's at every step. The other tests here are deliberate faults in
//! the harness that the replay must catch, and a check of the frozen clock
//! it relies on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use crate::common::docker_ready;
use lockwright_chaos::replay::{
    cases, plan, Bench, Case, ReplayOptions, Suite, Verdict, SUITE_BENCHES,
};
use lockwright_chaos::{Cluster, NodeOptions};
use lockwright_core::ProtocolId;
use lockwright_model::cache::Cache;
use lockwright_model::matrix;
use lockwright_model::model::Phase;
use lockwright_model::{Fault, PropertyId};

/// The cache of checked cells the model tests share (`target/tmp`, the
/// same for every test binary of the workspace): whichever test needs a
/// cell first computes it.
fn cache() -> Cache {
    Cache::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("matrix-cache"))
}

fn case(protocol: ProtocolId, fault: Fault, property: PropertyId) -> Case {
    cases(protocol, fault, Some(&cache()))
        .expect("the model checks")
        .into_iter()
        .find(|c| c.property == property)
        .expect("the cell is violated")
}

#[tokio::test]
async fn every_counterexample_of_the_matrix_replays_on_real_redis() {
    if !docker_ready() {
        return;
    }
    let started = Instant::now();
    // A table from an earlier run is never shown as this one's.
    let table = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay.md");
    let _ = std::fs::remove_file(&table);
    let cache = cache();
    let plan = plan(2, Some(&cache)).expect("the model checks");
    eprintln!("{}", cache.summary());
    eprintln!(
        "{} violated cells, {} runs with a property that holds; checked in {:.0} s",
        plan.violated.len(),
        plan.holds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(!plan.violated.is_empty(), "the matrix has violated cells");
    let mut benches: Vec<Bench> = (0..SUITE_BENCHES).map(|_| Bench::new()).collect();
    let suite = Suite::run(&mut benches, &plan, |line| eprintln!("{line}"))
        .await
        .expect("the harness runs");
    std::fs::write(&table, suite.markdown()).expect("write the table");
    eprintln!(
        "{} ({:.0} s); table: {}",
        suite.summary(),
        started.elapsed().as_secs_f64(),
        table.display()
    );
    let mismatches = suite.mismatches();
    assert!(
        mismatches.is_empty(),
        "mismatches:\n{}",
        mismatches.join("\n")
    );
    // The committed table names exactly these cells, each reproduced.
    let committed = committed_table();
    let cells: BTreeSet<String> = plan
        .violated
        .iter()
        .map(|c| format!("{} | {} | {}", c.protocol, c.fault, c.property))
        .collect();
    assert_eq!(
        committed.keys().cloned().collect::<BTreeSet<_>>(),
        cells,
        "docs/replay.md lists other cells than the matrix violates; regenerate it with {REGENERATE}"
    );
    for (cell, outcome) in &committed {
        assert_eq!(
            outcome, "reproduced",
            "docs/replay.md: {cell}; regenerate it with {REGENERATE}"
        );
    }
}

const REGENERATE: &str =
    "cargo run --release -p lockwright-chaos --bin replay -- --markdown docs/replay.md";

/// The violated-cell rows of the committed `docs/replay.md`: "protocol |
/// fault | property" → what it says happened on real Redis.
fn committed_table() -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/replay.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; generate it with {REGENERATE}", path.display()));
    let section = text
        .split("## Violated cells")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/replay.md has a violated-cells section");
    section
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| protocol"))
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            (fields.len() >= 4).then(|| {
                (
                    format!("{} | {} | {}", fields[0], fields[1], fields[2]),
                    fields[3].to_owned(),
                )
            })
        })
        .collect()
}

/// The faithful replay of `c` reproduces it, and the replay with
/// `mutation` (a deliberate fault in the harness) diverges.
async fn caught(c: &Case, mutation: ReplayOptions) {
    let mut bench = Bench::new();
    let mut verdicts = Vec::new();
    for options in [ReplayOptions::default(), mutation] {
        let replay = bench.replay(&c.model, &c.trace, options).await;
        verdicts.push(replay.expect("the harness runs").verdict);
    }
    assert_eq!(verdicts[0], Verdict::Reproduced);
    let mutated = &verdicts[1];
    assert!(
        matches!(mutated, Verdict::Diverged { .. }),
        "{} × {} with {mutation:?}: {mutated}",
        c.protocol,
        c.fault
    );
}

/// Deliberate faults in the harness, each of which a replay must catch:
/// node clocks that stand still at 0 (nothing expires, and the successor's
/// `SET NX` that the model grants is refused); node clocks one millisecond
/// behind or ahead of the model's (the deadline Redis stores for the first
/// `SET … PX` differs from the model's by that millisecond); a restart, a
/// failover or a split brain's promotion that is not carried out (the node
/// still holds the first lock, or for `time-fenced` and
/// `time-fenced-semaphore` still has the fence counter, so the second
/// fence is the counter's and not the stepped-back clock's); node clocks
/// at 0 under `time-fenced` (every fence is the counter's).
#[tokio::test]
async fn deliberate_faults_in_the_harness_are_caught() {
    if !docker_ready() {
        return;
    }
    let faithful = ReplayOptions::default();
    let mutations = [
        (
            ProtocolId::SetPxGetDel,
            Fault::Pause,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_clocks: false,
                ..faithful
            },
        ),
        (
            ProtocolId::SetPxLua,
            Fault::Pause,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_clock_error_ms: -1,
                ..faithful
            },
        ),
        (
            ProtocolId::SetPxLua,
            Fault::Pause,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_clock_error_ms: 1,
                ..faithful
            },
        ),
        (
            ProtocolId::SetPxLua,
            Fault::Restart,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
        (
            ProtocolId::SetPxLua,
            Fault::Failover,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
        (
            ProtocolId::TimeFenced,
            Fault::ClockBack,
            PropertyId::FencedResource,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
        (
            ProtocolId::SetPxLua,
            Fault::SplitBrain,
            PropertyId::MutualExclusion,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
        (
            ProtocolId::TimeFenced,
            Fault::FailoverClockLag,
            PropertyId::FencedResource,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
        (
            ProtocolId::TimeFenced,
            Fault::ClockBack,
            PropertyId::FencedResource,
            ReplayOptions {
                node_clocks: false,
                ..faithful
            },
        ),
        (
            ProtocolId::TimeFencedSemaphore,
            Fault::ClockBack,
            PropertyId::FencedResource,
            ReplayOptions {
                node_faults: false,
                ..faithful
            },
        ),
    ];
    // One at a time: a bench's containers are dropped synchronously, and
    // testcontainers' drop waits for work on this test's one-thread runtime,
    // which another replay's bench in flight here would keep from running.
    for (protocol, fault, property, mutation) in mutations {
        caught(&case(protocol, fault, property), mutation).await;
    }
}

/// A time-fenced protocol on real Redis: after a real restart (SIGKILL and
/// start of the container) and after a real promotion of a replica that
/// never received the first grant, the second holder's fence, issued by the
/// real script from the node's clock, is above the first holder's, so the
/// resource refuses the superseded holder's write. The shortest
/// counterexample of mutual exclusion is the scenario: both believe they
/// hold, and the replay requires Redis' fences to equal the model's.
async fn fences_grow_across_a_real_restart_and_a_real_promotion(protocol: ProtocolId) {
    for fault in [Fault::Restart, Fault::Failover] {
        let c = case(protocol, fault, PropertyId::MutualExclusion);
        let last = &c.trace.last().expect("a trace has states").0;
        let mut holds: Vec<(u32, u64)> = last
            .clients
            .iter()
            .filter_map(|client| match &client.phase {
                Phase::Holding(lease) | Phase::Checked(lease) => {
                    Some((client.grant, lease.fence?.0))
                }
                _ => None,
            })
            .collect();
        holds.sort();
        assert_eq!(holds.len(), 2, "{protocol} × {fault}: two holders");
        assert!(
            holds[0].1 < holds[1].1,
            "{protocol} × {fault}: the later grant has the higher fence: {holds:?}"
        );
        let replay = Bench::new()
            .replay(&c.model, &c.trace, ReplayOptions::default())
            .await
            .expect("the harness runs");
        assert_eq!(replay.verdict, Verdict::Reproduced, "{protocol} × {fault}");
        assert!(replay.node_faults > 0, "a real {fault} was carried out");
    }
}

/// `time-fenced`: see [`fences_grow_across_a_real_restart_and_a_real_promotion`].
#[tokio::test]
async fn time_fenced_fences_grow_across_a_real_restart_and_a_real_promotion() {
    if !docker_ready() {
        return;
    }
    fences_grow_across_a_real_restart_and_a_real_promotion(ProtocolId::TimeFenced).await;
}

/// `time-fenced-semaphore`: the permits are forgotten (two holders of a
/// one-permit semaphore), the fence is not.
#[tokio::test]
async fn time_fenced_semaphore_fences_grow_across_a_real_restart_and_a_real_promotion() {
    if !docker_ready() {
        return;
    }
    fences_grow_across_a_real_restart_and_a_real_promotion(ProtocolId::TimeFencedSemaphore).await;
}

/// A trace is only replayed by the model that produced it: a pause under
/// the fault-free model is not a step it can take.
#[tokio::test]
async fn a_trace_of_another_model_is_refused() {
    if !docker_ready() {
        return;
    }
    let c = case(
        ProtocolId::SetPxGetDel,
        Fault::Pause,
        PropertyId::MutualExclusion,
    );
    let other = matrix::model_for(
        ProtocolId::SetPxGetDel,
        Fault::None,
        PropertyId::ALL.to_vec(),
    )
    .expect("the model builds");
    let mut bench = Bench::new();
    let result = bench
        .replay(&other, &c.trace, ReplayOptions::default())
        .await;
    assert!(result.is_err(), "{result:?}");
}

/// The frozen clock reads exactly what the harness writes, to the
/// microsecond, and Redis' expiry deadlines follow it.
#[tokio::test]
async fn a_frozen_node_clock_reads_the_written_millisecond() {
    if !docker_ready() {
        return;
    }
    let options = NodeOptions {
        frozen_clock: true,
        ..NodeOptions::default()
    };
    let mut cluster = Cluster::start(1, &options).await.expect("a node");
    let mut conn = cluster.node(0).connect().await.expect("connect");
    for ms in [0_u64, 2_021, 10_001, 86_400_123] {
        cluster.node_mut(0).set_frozen_clock_ms(ms).expect("write");
        let (secs, micros): (String, String) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .expect("TIME");
        assert_eq!(
            (secs, micros),
            ((ms / 1000).to_string(), ((ms % 1000) * 1000).to_string())
        );
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("PX")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SET");
        let at: u64 = redis::cmd("PEXPIRETIME")
            .arg("k")
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        assert_eq!(at, ms + 1000);
    }
}
