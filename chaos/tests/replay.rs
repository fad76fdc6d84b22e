//! Every counterexample of the verdict matrix, replayed on real Redis.
//!
//! The replay (`lockwright_chaos::replay`) executes the model's shortest
//! counterexample of each violated cell action by action on real servers
//! whose wall clocks stand at the model's node clocks, with real kills,
//! restarts and replication, and requires Redis' reply and keys to equal
//! the model's at every step. The other tests here are deliberate faults in
//! the harness that the replay must catch, and a check of the frozen clock
//! it relies on.

mod common;

use std::time::Instant;

use common::docker_ready;
use lockwright_chaos::replay::{all_cases, cases, Bench, Case, ReplayOptions, Verdict};
use lockwright_chaos::{Cluster, NodeOptions};
use lockwright_core::ProtocolId;
use lockwright_model::matrix;
use lockwright_model::{Fault, PropertyId};

fn case(protocol: ProtocolId, fault: Fault, property: PropertyId) -> Case {
    cases(protocol, fault)
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
    let all = all_cases(2).expect("the model checks");
    eprintln!(
        "{} violated cells, counterexamples found in {:.0} s",
        all.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(!all.is_empty(), "the matrix has violated cells");
    let mut bench = Bench::new();
    let mut diverged = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let r = bench
            .replay(&c.model, &c.trace, ReplayOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{} × {} × {}: {e}", c.protocol, c.fault, c.property));
        eprintln!(
            "[{}/{}] {} × {} × {}: {} ({} steps, {} requests, {} container faults)",
            i + 1,
            all.len(),
            c.protocol,
            c.fault,
            c.property,
            r.verdict,
            r.steps,
            r.requests,
            r.node_faults
        );
        if r.verdict != Verdict::Reproduced {
            diverged.push(format!(
                "{} × {} × {}: {}",
                c.protocol, c.fault, c.property, r.verdict
            ));
        }
    }
    eprintln!(
        "{} of {} counterexamples reproduced on real Redis in {:.0} s",
        all.len() - diverged.len(),
        all.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(diverged.is_empty(), "diverged:\n{}", diverged.join("\n"));
}

async fn replay_with(c: &Case, options: ReplayOptions) -> Verdict {
    let mut bench = Bench::new();
    bench
        .replay(&c.model, &c.trace, options)
        .await
        .expect("the harness runs")
        .verdict
}

/// With the node clocks left at 0 nothing expires, and the successor's
/// `SET NX` that the model grants is refused by Redis.
#[tokio::test]
async fn a_replay_whose_node_clocks_stand_still_diverges() {
    if !docker_ready() {
        return;
    }
    let c = case(
        ProtocolId::SetPxGetDel,
        Fault::Pause,
        PropertyId::MutualExclusion,
    );
    assert_eq!(
        replay_with(&c, ReplayOptions::default()).await,
        Verdict::Reproduced
    );
    let frozen = ReplayOptions {
        node_clocks: false,
        ..ReplayOptions::default()
    };
    let verdict = replay_with(&c, frozen).await;
    assert!(matches!(verdict, Verdict::Diverged { .. }), "{verdict}");
}

/// Without the kill, the restarted node still holds the first lock.
#[tokio::test]
async fn a_replay_that_skips_the_restart_diverges() {
    if !docker_ready() {
        return;
    }
    for fault in [Fault::Restart, Fault::Failover] {
        let c = case(ProtocolId::SetPxLua, fault, PropertyId::MutualExclusion);
        assert_eq!(
            replay_with(&c, ReplayOptions::default()).await,
            Verdict::Reproduced
        );
        let no_faults = ReplayOptions {
            node_faults: false,
            ..ReplayOptions::default()
        };
        let verdict = replay_with(&c, no_faults).await;
        assert!(
            matches!(verdict, Verdict::Diverged { .. }),
            "{fault}: {verdict}"
        );
    }
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
