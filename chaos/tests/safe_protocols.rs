//! The protocols the model calls safe (`set-px-lua`, `fenced`,
//! `lease-semaphore`) under a killed client, a partitioned master and a
//! paused master: no violation over K rounds each.
//!
//! Cells: (p, crash, …), (p, partition, …) and (p, delay, …) for
//! mutual-exclusion and fenced-resource. The faults map onto the model's
//! classes as follows:
//!
//! - **crash** (the model's `crash`: a client stops for good): the holder
//!   runs on a runtime of its own, which is dropped while it holds (no
//!   release, no renewal). It counts as inside until its last validity.
//! - **partition**: the master is disconnected from the clients' network
//!   for 1.5 TTL while the lock is held and contended, then healed.
//! - **delay** (messages delayed, replies that never come): the master is
//!   frozen with `docker pause` for 1.5 TTL; its clock runs on, queued
//!   requests are answered late or time out.
//!
//! Each round runs the three protocols at once, each with its own key, a
//! well-behaved holder (it writes only while its validity has time left,
//! and leaves on `lost()`) and a contender that waits for the lock. The
//! fenced protocols write to a fenced resource; `set-px-lua` to a plain one.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{docker_ready, fence_of, report, Outcome, Resource};
use lockwright_chaos::{Cluster, History, NodeOptions, Op, RedisNode};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockGuard, LockOptions, Semaphore};
use tokio::sync::{oneshot, Mutex};

const TTL: Duration = Duration::from_millis(500);
/// Rounds per fault.
const ROUNDS: usize = 12;
/// How long a fault lasts.
const FAULT: Duration = Duration::from_millis(750);
/// How long a holder means to hold (through the fault).
const HOLD: Duration = Duration::from_millis(1_200);
/// A write needs at least this much validity left.
const MARGIN: Duration = Duration::from_millis(50);

const PROTOCOLS: [(&str, ProtocolId); 3] = [
    ("set-px-lua", ProtocolId::SetPxLua),
    ("fenced", ProtocolId::Fenced),
    ("lease-semaphore", ProtocolId::LeaseSemaphore),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Crash,
    Partition,
    Pause,
}

impl Fault {
    /// The model's fault class.
    fn model(self) -> &'static str {
        match self {
            Fault::Crash => "crash",
            Fault::Partition => "partition",
            Fault::Pause => "delay",
        }
    }
}

/// A lock or a one-permit semaphore.
#[derive(Clone, Debug)]
enum Target {
    Lock(Lock),
    Semaphore(Semaphore),
}

impl Target {
    fn new(url: &str, protocol: ProtocolId, name: &str) -> Self {
        let client = redis::Client::open(url).expect("url");
        let options = LockOptions {
            request_timeout: Duration::from_millis(150),
            ..LockOptions::new(protocol, TTL)
        };
        if protocol == ProtocolId::LeaseSemaphore {
            Target::Semaphore(Semaphore::new([client], name, options).expect("semaphore"))
        } else {
            Target::Lock(Lock::new([client], name, options).expect("lock"))
        }
    }

    async fn acquire_within(&self, timeout: Duration) -> Option<LockGuard> {
        match self {
            Target::Lock(lock) => lock.acquire_timeout(timeout).await.ok(),
            Target::Semaphore(semaphore) => semaphore.acquire_timeout(timeout).await.ok(),
        }
    }
}

/// One protocol's share of a round: history, resource, and its key.
struct Subject {
    protocol: ProtocolId,
    target: Target,
    history: History,
    resource: Arc<Mutex<Resource>>,
    renews: bool,
}

impl Subject {
    fn grant(&self, client: &str, guard: &LockGuard) {
        if self.renews {
            self.history.grant_renewing(client, fence_of(guard));
        } else {
            self.history
                .grant(client, fence_of(guard), guard.valid_until());
        }
    }

    /// Leaves the critical section now, or at the end of its validity if
    /// that came first.
    fn leave(&self, client: &str, guard: &LockGuard) {
        let at = Instant::now().min(guard.valid_until());
        self.history.record_at_instant(at, client, Op::Release);
    }

    async fn write(&self, client: &str, guard: &LockGuard, what: &str) {
        if guard.remaining() > MARGIN && !guard.is_lost() {
            self.resource
                .lock()
                .await
                .write(&self.history, client, fence_of(guard), what);
        }
    }
}

/// A well-behaved holder: writes, holds through the fault, leaves on
/// `lost()` or after [`HOLD`], writes again if still valid, releases.
async fn holder(subject: Arc<Subject>, client: String, granted: oneshot::Sender<()>) {
    let guard = subject
        .target
        .acquire_within(Duration::from_secs(5))
        .await
        .expect("the holder acquires");
    subject.grant(&client, &guard);
    subject.write(&client, &guard, "holder").await;
    let _ = granted.send(());
    tokio::select! {
        () = guard.lost() => {}
        () = tokio::time::sleep(HOLD) => {}
    }
    subject.write(&client, &guard, "holder, later").await;
    subject.leave(&client, &guard);
    let _ = guard.release().await;
}

/// A holder that crashes: its runtime is dropped while it holds.
fn crashing_holder(subject: Arc<Subject>, client: String, granted: oneshot::Sender<()>) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let guard = subject
                .target
                .acquire_within(Duration::from_secs(5))
                .await
                .expect("the holder acquires");
            subject.grant(&client, &guard);
            subject.write(&client, &guard, "holder").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The crash: inside until its validity as last renewed.
            subject
                .history
                .record_at_instant(guard.valid_until(), &client, Op::Leave);
            std::mem::forget(guard);
        });
        // Dropping the runtime kills the driver task: no release, no renewal.
        drop(runtime);
        let _ = granted.send(());
    });
}

/// Waits for the lock, writes, releases; `None` when it never came.
async fn contender(subject: Arc<Subject>, client: String) -> Option<Duration> {
    let started = Instant::now();
    let guard = subject
        .target
        .acquire_within(TTL * 3 + HOLD + FAULT)
        .await?;
    let waited = started.elapsed();
    subject.grant(&client, &guard);
    subject.write(&client, &guard, "contender").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    subject.leave(&client, &guard);
    let _ = guard.release().await;
    Some(waited)
}

async fn inject(node: &RedisNode, fault: Fault) {
    match fault {
        Fault::Crash => {}
        Fault::Partition => {
            node.partition().await.expect("partition");
            tokio::time::sleep(FAULT).await;
            node.heal().await.expect("heal");
        }
        Fault::Pause => {
            node.pause().await.expect("pause");
            tokio::time::sleep(FAULT).await;
            node.unpause().await.expect("unpause");
        }
    }
}

async fn rounds(node: &RedisNode, fault: Fault) -> Vec<(Outcome, &'static str)> {
    let url = node.url();
    let subjects: Vec<Arc<Subject>> = PROTOCOLS
        .iter()
        .map(|&(name, protocol)| {
            Arc::new(Subject {
                protocol,
                target: Target::new(&url, protocol, &format!("{name}-{}", fault.model())),
                history: History::new(),
                resource: Arc::new(Mutex::new(Resource::for_protocol(name))),
                renews: protocol != ProtocolId::SetPxLua,
            })
        })
        .collect();
    let mut longest_wait = vec![Duration::ZERO; subjects.len()];
    for round in 0..ROUNDS {
        let mut holders = Vec::new();
        let mut grants = Vec::new();
        for subject in &subjects {
            let (granted, was_granted) = oneshot::channel();
            let client = format!("holder-{round}");
            if fault == Fault::Crash {
                crashing_holder(subject.clone(), client, granted);
            } else {
                holders.push(tokio::spawn(holder(subject.clone(), client, granted)));
            }
            grants.push(was_granted);
        }
        for granted in grants {
            granted.await.expect("the holder got going");
        }
        let contenders: Vec<_> = subjects
            .iter()
            .map(|subject| tokio::spawn(contender(subject.clone(), format!("contender-{round}"))))
            .collect();
        inject(node, fault).await;
        for holder in holders {
            holder.await.expect("holder");
        }
        for ((subject, contender), longest) in
            subjects.iter().zip(contenders).zip(&mut longest_wait)
        {
            let waited = contender.await.expect("contender").unwrap_or_else(|| {
                panic!(
                    "{} under {fault:?}: the contender never acquired (progress)",
                    subject.protocol
                )
            });
            *longest = (*longest).max(waited);
        }
    }
    let mut outcomes = Vec::new();
    for ((subject, (name, _)), longest) in subjects.iter().zip(PROTOCOLS).zip(longest_wait) {
        let holds = subject.history.holds().len();
        let writes = subject
            .history
            .entries()
            .iter()
            .filter(|entry| matches!(entry.op, Op::Write { .. }))
            .count();
        let scenario = format!("safe_protocols/{}", fault.model());
        for property in ["mutual-exclusion", "fenced-resource"] {
            let clean = format!(
                "{ROUNDS} rounds, {holds} holds, {writes} writes, longest wait {} ms",
                longest.as_millis()
            );
            outcomes.push((
                Outcome::from_history(
                    &scenario,
                    name,
                    fault.model(),
                    property,
                    &subject.history,
                    1,
                    &clean,
                ),
                "holds",
            ));
        }
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safe_protocols_survive_crash_partition_and_pause() {
    if !docker_ready() {
        return;
    }
    let cells: Vec<(&'static str, &'static str)> = PROTOCOLS
        .iter()
        .flat_map(|&(name, _)| {
            [Fault::Crash, Fault::Partition, Fault::Pause].map(|fault| (name, fault.model()))
        })
        .collect();
    common::prefetch_model(&cells);
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("one master");
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for fault in [Fault::Crash, Fault::Partition, Fault::Pause] {
        outcomes.extend(rounds(cluster.node(0), fault).await);
        eprintln!("{fault:?}: done after {:?}", started.elapsed());
    }
    report("safe_protocols", &outcomes);
}
