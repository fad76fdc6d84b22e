//! The randomized nemesis, short and seeded: client containers running the
//! real adapter under real faults of every class (client crashes, pauses
//! and clock skew, iptables partitions, node SIGKILLs with and without AOF,
//! delayed or with the clock stepped back, node clock jumps, a delaying
//! relay, Redis Sentinel failovers with and without the replica's clock
//! lag); each observed cell compared with the model's matrix, and each
//! client mutation required to be caught.
//!
//! `NEMESIS_SEED` replays another seed; `NEMESIS_JOBS` sets how many runs
//! go side by side (3). The table is printed and written to
//! `target/tmp/nemesis.md`.

use std::time::{Duration, Instant};

use lockwright_chaos::in_ci;
use lockwright_chaos::nemesis::campaign::{
    failures, progress_line, rows, run_mutation, run_side_by_side, table, Settings,
};
use lockwright_chaos::nemesis::run::{
    bridged_traffic_filtered, cut_chain, run, BRIDGE_NF_CALL_IPTABLES,
};
use lockwright_chaos::nemesis::Mutation;
use lockwright_core::ProtocolId;
use lockwright_model::Fault;

/// What a task of the test returns.
enum Done {
    Run(Box<lockwright_chaos::nemesis::run::RunReport>),
    Mutation(lockwright_chaos::nemesis::campaign::MutationRow),
}

/// The cells of the CI run.
const CELLS: [(ProtocolId, Fault); 24] = [
    (ProtocolId::SetPxLua, Fault::None),
    (ProtocolId::SetPxLua, Fault::Crash),
    (ProtocolId::SetnxDel, Fault::Crash),
    (ProtocolId::SetPxLua, Fault::Pause),
    (ProtocolId::SetPxLua, Fault::Partition),
    (ProtocolId::SetPxLua, Fault::Restart),
    (ProtocolId::SetPxLua, Fault::RestartPersisted),
    (ProtocolId::SetPxLua, Fault::ClockJump),
    (ProtocolId::SetPxLua, Fault::Failover),
    (ProtocolId::Fenced, Fault::Pause),
    (ProtocolId::Fenced, Fault::ClockJump),
    (ProtocolId::Fenced, Fault::Partition),
    (ProtocolId::Reentrant, Fault::Partition),
    (ProtocolId::Redlock, Fault::Partition),
    (ProtocolId::LeaseSemaphore, Fault::Partition),
    (ProtocolId::SetPxLua, Fault::ClientSkew),
    (ProtocolId::Redlock, Fault::ClientSkew),
    (ProtocolId::SetPxLua, Fault::Delay),
    (ProtocolId::SetPxGetDel, Fault::Delay),
    (ProtocolId::SetPxLua, Fault::ClockBack),
    (ProtocolId::SetPxLua, Fault::RestartDelayed),
    (ProtocolId::SetPxLua, Fault::FailoverClockLag),
    (ProtocolId::Redlock, Fault::ClientPartition),
    (ProtocolId::SetPxLua, Fault::SplitBrain),
];

/// The cells run for 16 TTLs, where progress after a healing fault is
/// judged: `setnx-del` × `restart-persisted` is the model's violation (a
/// restart kills the hold's own connection, its release gives up, and the
/// persisted key has no TTL).
const LONG_CELLS: [(ProtocolId, Fault); 2] = [
    (ProtocolId::SetPxLua, Fault::Partition),
    (ProtocolId::SetnxDel, Fault::RestartPersisted),
];

fn iptables_ready() -> bool {
    let ok = std::process::Command::new("iptables")
        .args(cut_chain("-S"))
        .output()
        .is_ok_and(|o| o.status.success())
        && bridged_traffic_filtered(
            std::fs::read_to_string(BRIDGE_NF_CALL_IPTABLES)
                .ok()
                .as_deref(),
        );
    if !ok {
        assert!(
            !in_ci(),
            "the nemesis needs iptables, its raw table (root) and \
             {BRIDGE_NF_CALL_IPTABLES} = 1 in CI"
        );
        eprintln!(
            "\n*** SKIPPED: iptables, its raw table or {BRIDGE_NF_CALL_IPTABLES} = 1 is not available ***\n"
        );
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_nemesis_agrees_with_the_model_and_catches_every_mutation() {
    if !crate::common::docker_ready() || !iptables_ready() {
        return;
    }
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_124);
    eprintln!("nemesis: seed {seed} (replay with NEMESIS_SEED={seed})");
    let settings = Settings {
        clients: 5,
        run_duration: Duration::from_secs(8),
        ttl_ms: 1000,
        seed,
        client_binary: env!("CARGO_BIN_EXE_nemesis-client").into(),
        lease_semaphore_limit: 2,
    };
    // Three runs at a time: each has its own network, containers and
    // rules, and mostly waits on real time (see `run_side_by_side`).
    let at_once = std::env::var("NEMESIS_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let started = Instant::now();
    type Job = std::pin::Pin<Box<dyn std::future::Future<Output = Done> + Send>>;
    let mut jobs: Vec<Job> = Vec::new();
    for (index, (protocol, fault)) in CELLS.into_iter().enumerate() {
        let config = settings.config(protocol, fault, seed + index as u64, Mutation::None);
        jobs.push(Box::pin(async move {
            let report = run(&config).await.expect("a nemesis run");
            eprintln!("{}", progress_line(started.elapsed(), &report));
            Done::Run(Box::new(report))
        }));
    }
    // Runs of 16 TTLs: the faults stop eleven TTLs before the end, and
    // progress is judged over the healthy stretch after the last one.
    let long = Settings {
        run_duration: Duration::from_secs(16),
        ..settings.clone()
    };
    for (index, (protocol, fault)) in LONG_CELLS.into_iter().enumerate() {
        let seed = seed + (CELLS.len() + index) as u64;
        let config = long.config(protocol, fault, seed, Mutation::None);
        jobs.push(Box::pin(async move {
            let report = run(&config).await.expect("a nemesis run");
            eprintln!("{}", progress_line(started.elapsed(), &report));
            assert!(
                report.progress_judged,
                "({}, {}) seed {seed}: a run of 16 TTLs leaves a healthy stretch to judge progress in",
                protocol.as_str(),
                fault.as_str()
            );
            Done::Run(Box::new(report))
        }));
    }
    for mutation in Mutation::ALL {
        let settings = settings.clone();
        jobs.push(Box::pin(async move {
            let row = run_mutation(&settings, mutation, 3, |report| {
                eprintln!("{}", progress_line(started.elapsed(), report));
            })
            .await
            .expect("a mutation run");
            Done::Mutation(row)
        }));
    }
    // The mutation runs last longest (up to three runs each): they start first.
    jobs.rotate_right(Mutation::ALL.len());
    let mut reports = Vec::new();
    let mut mutations = Vec::new();
    for done in run_side_by_side(jobs, at_once)
        .await
        .expect("the nemesis tasks")
    {
        match done {
            Done::Run(report) => reports.push(*report),
            Done::Mutation(row) => mutations.push(row),
        }
    }
    let rows = rows(&reports);
    let text = table(&rows, &mutations);
    eprintln!("\n{text}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("nemesis.md");
    std::fs::write(&path, format!("seed {seed}\n\n{text}")).expect("write the table");
    // Every run did something: a run without acquires shows nothing.
    for report in &reports {
        assert!(
            report.acquired > 0 && report.judgement.complete_sections > 0,
            "({}, {}) seed {}: no complete critical section",
            report.config.protocol.as_str(),
            report.config.fault.as_str(),
            report.config.seed
        );
    }
    let failed = failures(&reports, &rows, &mutations);
    assert!(
        failed.is_empty(),
        "nemesis failures:\n{}",
        failed.join("\n")
    );
    eprintln!("nemesis: {:.0} s", started.elapsed().as_secs_f64());
}
