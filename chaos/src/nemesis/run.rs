//! One nemesis run: the topology (a network, Redis nodes, the resource and
//! the client containers), the seeded fault schedule, and the verdicts.
//!
//! Every container, network, iptables rule and directory a run creates
//! carries the name prefix `lockwright-chaos-<pid>-nemesis-<n>`; the
//! [`Topology`] removes them when it is dropped (also on a panic or an
//! error), and [`crate::check_environment`] removes those of runs whose
//! process is gone.
//!
//! # How each fault strikes
//!
//! The nemesis strikes the model's faults ([`Fault`], one name for both:
//! a run's fault is compared with the model's column of that name), each on
//! the real processes and network. One is not the same fault on both
//! sides: the model's `partition` cuts one node from every client, the
//! nemesis cuts chosen client-node pairs (some clients still reach the
//! node), so its verdicts are compared with that column as the nearest.
//! Tables list the faults in the model's column order.
//!
//! - **`none`**: no fault: contention only.
//! - **`crash`**: `docker kill --signal KILL` of a client container as it
//!   enters its section: the holder dies holding, for good (it is not started
//!   again). Once per run.
//! - **`pause`**: `docker pause` of a client container for 1.2 to 2 TTLs:
//!   three times in four the client that has just read the resource (inside
//!   its section), else the one that wrote last.
//! - **`partition`**: iptables DROP rules ([`CUT_CHAIN`]) between chosen
//!   client and node containers (both directions of each pair: a black hole,
//!   no reset), for 1.5 to 3 TTLs, begun as a client enters its section (when
//!   one does within a TTL) and always cutting that client.
//! - **`client-partition`**: the same rules between one client (the one that
//!   has just entered, when one does) and one node, while every other client
//!   still reaches it; the model's column of that name cuts one client from
//!   one node once, the nemesis again after each heal.
//! - **`restart`**: SIGKILL of a node's `redis-server` process as a client
//!   begins the last step of its section (when one does within two TTLs; on
//!   RedLock, a node of a holder whose token is on exactly three of the
//!   five), started again by the node container's supervisor after up to 100
//!   ms; the node comes back empty.
//! - **`restart-persisted`**: as `restart` with `--appendonly yes
//!   --appendfsync always`.
//! - **`clock-jump`**: a node's clock jumps forward by 1.2 to 2 TTLs, aimed
//!   as `restart` is: libfaketime in the node's `redis-server`, its offset
//!   file rewritten at run time, so the real process reads a clock that has
//!   moved on and expires the keys early. The jumps add up; the clock never
//!   goes back.
//! - **`failover`**: a real Redis Sentinel failover: the node has a replica
//!   and three Sentinels (quorum 2) and the clients find the master through
//!   the Sentinels. The nemesis cuts the replication link (iptables DROP
//!   between master and replica), waits a TTL (so that every lease the
//!   replica received has run out), then, as a client that entered its
//!   section on a grant made since (never replicated) begins the last step of
//!   that section (or, when none does, three TTLs after the cut), kills the
//!   master's `redis-server` with SIGKILL; the Sentinels promote the replica.
//!   Once per run; single-master protocols only.
//! - **`split-brain`**: a real Sentinel failover in a split brain: with the
//!   replica and Sentinels of `failover`, iptables DROP rules cut node 0 and
//!   one client (the one that has just entered, when one has) off from the
//!   replica, the Sentinels and the other clients. The Sentinels promote the
//!   replica and the other clients follow them to it, while the cut-off
//!   client goes on with the old master, which still accepts writes (it
//!   cannot reconnect elsewhere: the Sentinels are out of its reach). Two to
//!   three TTLs after the promotion the cut heals; the Sentinels make the
//!   old master a replica of the new one (its writes since are lost) and
//!   kill its client connections, some 10 s later (they wait until it has
//!   reported itself as master for four publish periods); the nemesis waits
//!   until its `ROLE` says so. The run lasts 15 s and seven TTLs, so that
//!   a stretch with one master follows. Once per run; single-master
//!   protocols only.
//! - **`client-skew`**: client clocks disagree, as in the model: about half
//!   the clients (at least one, seeded) run under libfaketime (`LD_PRELOAD`
//!   in their container) with a clock half a TTL ahead that runs 1 % slow,
//!   the adapter's timers (tokio's `Instant`) and wall clock alike. Their
//!   records keep the real time (read through the vDSO); the nemesis checks
//!   each client's offset and rate from its clock file.
//! - **`clock-back`**: as `restart`, and the node's clock comes back
//!   [`CLOCK_STEP_BACK`] ms behind (libfaketime's offset set back before the
//!   supervisor starts it again; the nemesis reads the node's `TIME` to
//!   check). The steps add up.
//! - **`restart-delayed`**: as `restart`, but the node stays down for 1.2 to
//!   2 TTLs before the supervisor starts it again.
//! - **`failover-clock-lag`**: as `failover`, with the replica's
//!   `redis-server` under libfaketime, its clock [`FAILOVER_CLOCK_LAG_MS`] behind
//!   its master's from the start (the nemesis reads its `TIME` to check),
//!   more than the promotion takes. Redis 7 replicates a relative expiry as
//!   an absolute one (`PXAT`), so the promoted replica keeps each key that
//!   much longer.
//! - **`delay`**: a delaying TCP relay (`nemesis-client relay`, a container
//!   of its own) sits between the clients and every node. As a client enters
//!   its section, the nemesis has the relay hold the next request (three
//!   times in four) or reply that client sends or gets for 1.2 to 2 TTLs: the
//!   client times out, retires the connection and goes on over a new one,
//!   which is not held, and the held request still reaches the node
//!   afterwards. The relay reports each hold it really made.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockwright_core::catalogue::Kind;
use lockwright_core::ProtocolId;
use lockwright_model::fault::{Family, CLOCK_STEP_BACK};
use lockwright_model::matrix::{expected, parse_expectations, Verdict, EXPECTATIONS};
use lockwright_model::model::ClientClock;
use lockwright_model::{Fault, PropertyId};
use lockwright_redis::{Lock, LockOptions};
use redis::AsyncConnectionConfig;

use super::checker::{judge_with_pauses, progress, Judgement, Paused};
use super::record::{log_key, marks_key, LogEntry, OpKind, OpRecord, Outcome};
use super::{Mutation, Rng};
use crate::clock::{FakeClock, OFFSET_FILE};
use crate::docker::{docker, docker_blocking};
use crate::{
    default_image, ChaosError, NodeOptions, Persistence, FAKETIME_DIR, LIBFAKETIME, REDIS_PORT,
};

/// The local image the clients run in (tagged by a hash of the binary).
pub const CLIENT_IMAGE: &str = "lockwright/nemesis-client";
/// Where the client binary sits in its image.
pub const CLIENT_PATH: &str = "/usr/local/bin/nemesis-client";

/// Where the Redis image (and so the client image built on it) keeps
/// `redis-server`.
const REDIS_SERVER_PATH: &str = "/usr/local/bin/redis-server";

/// Can a run of `protocol` have `fault`? A failover needs a single master
/// (a Sentinel group watches one), so not RedLock.
pub fn applies_to(fault: Fault, protocol: ProtocolId) -> bool {
    not_applicable(fault, protocol).is_none()
}

/// Why a run of `protocol` cannot have `fault`, when it cannot.
pub fn not_applicable(fault: Fault, protocol: ProtocolId) -> Option<&'static str> {
    if fault.has_replica() && protocol == ProtocolId::Redlock {
        Some("a Sentinel group watches one master")
    } else if fault == Fault::ClientStep {
        Some(
            "the adapter's clock is CLOCK_MONOTONIC, anchored to the wall clock once per \
             process: a step of a client's wall clock after that does not reach its leases, as \
             tests/tests/clock_step.rs shows (the model's column is for front ends that read \
             the wall clock at every step)",
        )
    } else {
        None
    }
}

/// A kill -9 of a node's `redis-server` and its start again?
fn is_restart(fault: Fault) -> bool {
    fault.family() == Family::Restart
}

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The protocol under test.
    pub protocol: ProtocolId,
    /// The faults injected.
    pub fault: Fault,
    /// How many client containers.
    pub clients: usize,
    /// How long the clients loop.
    pub duration: Duration,
    /// The lease TTL.
    pub ttl_ms: u64,
    /// Permits of a semaphore (1 for locks).
    pub limit: u32,
    /// Seed of the schedule and of the clients' choices.
    pub seed: u64,
    /// A deliberate bug in every client, or none.
    pub mutation: Mutation,
    /// The `nemesis-client` binary to put in the client image.
    pub client_binary: PathBuf,
}

impl RunConfig {
    /// How many nodes the protocol runs on: 5 for RedLock, 1 otherwise.
    pub fn nodes(&self) -> usize {
        if self.protocol == ProtocolId::Redlock {
            5
        } else {
            1
        }
    }

    /// Is the protocol a semaphore?
    pub fn is_semaphore(&self) -> bool {
        self.protocol.kind() == Kind::Semaphore
    }
}

/// What a run observed.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The run's settings.
    pub config: RunConfig,
    /// Operations the clients recorded.
    pub operations: usize,
    /// Of which ended indeterminate.
    pub indeterminate: usize,
    /// Acquires that succeeded.
    pub acquired: usize,
    /// Faults applied, as text, in order.
    pub faults: Vec<String>,
    /// The checker's findings.
    pub judgement: Judgement,
    /// Was progress judged (a healthy stretch of at least the patience)?
    pub progress_judged: bool,
    /// The resource's log.
    pub log: Vec<LogEntry>,
}

/// What the nemesis observed for one model property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// A violation, with its evidence.
    Violated(String),
    /// None seen.
    Clean,
    /// The nemesis cannot judge this property in this cell.
    NotJudged,
}

impl RunReport {
    /// The nemesis' observation of `property`. Mutual exclusion and the
    /// fenced resource are read from the resource's log; owner-only is
    /// judged only for locks under pauses and delays, as an overlap of two
    /// unpaused sections while the other holder's lease certainly stood;
    /// progress over the healthy stretch from two TTLs after the start (no
    /// fault, client skew), the crash or the end of the last fault to the
    /// clients' deadline, where that stretch is at least the patience (see
    /// [`progress`]; a healing fault leaves one only in runs of 16 TTLs or
    /// more).
    pub fn observed(&self, property: PropertyId) -> Observed {
        let check = match property {
            PropertyId::MutualExclusion => "mutual-exclusion",
            // A semaphore's only at one permit: the model checks
            // semaphores at one permit, and its fenced resource compares
            // the order of grants, which two holders of a semaphore with
            // more permits break legitimately.
            PropertyId::FencedResource if !self.config.is_semaphore() || self.config.limit == 1 => {
                "fenced-resource"
            }
            // Locks only: a semaphore over its limit with every lease
            // standing may be an admission race (mutual exclusion), not a
            // removal of another's entry.
            PropertyId::OwnerOnly
                if !self.config.is_semaphore()
                    && matches!(self.config.fault, Fault::Pause | Fault::Delay) =>
            {
                "unpaused-overlap"
            }
            PropertyId::Progress if self.progress_judged => "progress",
            _ => return Observed::NotJudged,
        };
        match self.judgement.of(check).next() {
            Some(finding) => Observed::Violated(finding.excerpt.clone()),
            None => Observed::Clean,
        }
    }

    /// Integrity findings that no model cell explains: accesses lost,
    /// duplicated or answered differently from what the resource logged,
    /// fences accepted out of order (the resource refuses them).
    pub fn integrity_failures(&self) -> Vec<String> {
        self.judgement
            .findings
            .iter()
            .filter(|f| matches!(f.check, "fence-order" | "lost-or-duplicated"))
            .map(|f| format!("{}: {}", f.check, f.excerpt))
            .collect()
    }
}

/// The model's verdict for a cell, from `model/expectations.txt`.
pub fn model_verdict(protocol: ProtocolId, fault: Fault, property: PropertyId) -> Verdict {
    let rules = parse_expectations(EXPECTATIONS).unwrap_or_default();
    expected(&rules, protocol, fault, property)
        .map(|rule| rule.verdict)
        .unwrap_or(Verdict::Holds)
}

// --- the client image ----------------------------------------------------------

/// Builds (once per binary) the local client image: `FROM` the Redis image,
/// which already carries libc, libm and ld-linux, plus the client binary
/// and the shared libraries `ldd` names, at their real paths. Returns its
/// `name:tag`. Nothing is pulled.
pub async fn ensure_client_image(binary: &Path) -> Result<String, ChaosError> {
    // Runs side by side ask at once: one builds, the others wait for its
    // tag (the build directory is per process), and later runs of the same
    // binary skip the hash and the `docker image inspect`.
    static BUILT: tokio::sync::Mutex<Option<(PathBuf, String)>> =
        tokio::sync::Mutex::const_new(None);
    let mut built = BUILT.lock().await;
    if let Some((path, tag)) = built.as_ref() {
        if path == binary {
            return Ok(tag.clone());
        }
    }
    let tag = build_client_image(binary).await?;
    *built = Some((binary.to_owned(), tag.clone()));
    Ok(tag)
}

async fn build_client_image(binary: &Path) -> Result<String, ChaosError> {
    let bytes = std::fs::read(binary)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let tag = format!("{CLIENT_IMAGE}:{:016x}", hasher.finish());
    if docker(&["image", "inspect", "--format", "{{.Id}}", &tag])
        .await
        .is_ok()
    {
        return Ok(tag);
    }
    let dir = std::env::temp_dir().join(format!(
        "lockwright-chaos-{}-client-image",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/local/bin"))?;
    std::fs::copy(binary, rootfs.join(CLIENT_PATH.trim_start_matches('/')))?;
    let ldd = tokio::process::Command::new("ldd")
        .arg(binary)
        .output()
        .await?;
    for path in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
    {
        let named = Path::new(path);
        let real = std::fs::canonicalize(named)?;
        let target = rootfs.join(real.strip_prefix("/").unwrap_or(&real));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&real, &target)?;
        // The name the loader asks for, next to the real file.
        if let (Some(parent), Some(name)) = (real.parent(), named.file_name()) {
            let link = rootfs
                .join(parent.strip_prefix("/").unwrap_or(parent))
                .join(name);
            if !link.exists() {
                if let Some(file) = real.file_name() {
                    std::os::unix::fs::symlink(file, &link)?;
                }
            }
        }
    }
    let base = default_image();
    std::fs::write(
        dir.join("Dockerfile"),
        format!("FROM {base}\nCOPY rootfs/ /\nENTRYPOINT [\"{CLIENT_PATH}\"]\n"),
    )?;
    let context = dir.to_string_lossy().into_owned();
    let built = docker(&[
        "build",
        "-q",
        "-t",
        &tag,
        "--label",
        "org.lockwright.chaos=client-image",
        &context,
    ])
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    built?;
    // Older client images of this machine are of no further use.
    if let Ok(tags) = docker(&[
        "images",
        CLIENT_IMAGE,
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])
    .await
    {
        for old in tags.lines().filter(|t| *t != tag) {
            let _ = docker(&["rmi", old]).await;
        }
    }
    Ok(tag)
}

// --- the topology ----------------------------------------------------------------

static RUNS: AtomicU64 = AtomicU64::new(0);

/// The containers, network, rules and files of one run. Dropping it
/// removes them all.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
    subnet: String,
    network: Option<String>,
    containers: Vec<String>,
    rules: Vec<Vec<String>>,
    out_dir: PathBuf,
    /// This run's number in the process (runs side by side have their own).
    number: u64,
}

impl Topology {
    fn new() -> Result<Topology, ChaosError> {
        let number = RUNS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("lockwright-chaos-{}-nemesis-{number}", std::process::id());
        let out_dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&out_dir)?;
        Ok(Topology {
            prefix,
            subnet: String::new(),
            network: None,
            containers: Vec::new(),
            rules: Vec::new(),
            out_dir,
            number,
        })
    }

    /// `10.213.k.<host>`.
    fn ip(&self, host: u8) -> String {
        format!("{}.{host}", self.subnet)
    }

    async fn create_network(&mut self) -> Result<(), ChaosError> {
        let name = format!("{}-net", self.prefix);
        // From this run's own number: runs side by side start their search
        // at different subnets.
        let start = (u64::from(std::process::id()) * 7 + self.number * 3) % 200;
        let mut last = None;
        for attempt in 0..40 {
            let subnet = format!("10.213.{}", (start + attempt) % 250);
            let cidr = format!("{subnet}.0/24");
            match docker(&[
                "network",
                "create",
                "--subnet",
                &cidr,
                "--label",
                "org.lockwright.chaos=nemesis",
                &name,
            ])
            .await
            {
                Ok(_) => {
                    self.subnet = subnet;
                    self.network = Some(name);
                    return Ok(());
                }
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| ChaosError::Harness("no free subnet".to_owned())))
    }

    async fn run_container(
        &mut self,
        name: &str,
        ip: &str,
        args: &[&str],
    ) -> Result<(), ChaosError> {
        let network = self.network.clone().unwrap_or_default();
        let mut all = vec![
            "run",
            "-d",
            "--name",
            name,
            "--network",
            &network,
            "--ip",
            ip,
            "--label",
            "org.lockwright.chaos=nemesis",
        ];
        all.extend_from_slice(args);
        self.containers.push(name.to_owned());
        docker(&all).await?;
        Ok(())
    }

    async fn add_rule(&mut self, spec: Vec<String>) -> Result<(), ChaosError> {
        let mut insert = cut_chain("-I");
        insert.extend(spec.iter().cloned());
        iptables(&insert).await?;
        self.rules.push(spec);
        Ok(())
    }

    async fn remove_rules(&mut self) -> Result<(), ChaosError> {
        // Every rule is tried; the ones that could not be deleted stay
        // tracked (for `cleanup`) and the first error is returned.
        let mut first_error = None;
        for spec in std::mem::take(&mut self.rules) {
            let mut delete = cut_chain("-D");
            delete.extend(spec.iter().cloned());
            if let Err(e) = iptables(&delete).await {
                self.rules.push(spec);
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Removes everything the run created (idempotent; also run on drop).
    pub fn cleanup(&mut self) {
        for spec in std::mem::take(&mut self.rules) {
            let mut delete = cut_chain("-D");
            delete.extend(spec);
            let _ = std::process::Command::new("iptables")
                .args(&delete)
                .output();
        }
        let containers = std::mem::take(&mut self.containers);
        if !containers.is_empty() {
            let names: Vec<&str> = containers.iter().map(String::as_str).collect();
            let _ = docker_blocking(&[&["rm", "-f"][..], &names].concat());
        }
        if let Some(network) = self.network.take() {
            let _ = docker_blocking(&["network", "rm", &network]);
        }
        let _ = std::fs::remove_dir_all(&self.out_dir);
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.cleanup();
    }
}

async fn iptables(args: &[String]) -> Result<(), ChaosError> {
    let output = tokio::process::Command::new("iptables")
        .args(args)
        .output()
        .await?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ChaosError::DockerCli {
            args: format!("(iptables) {}", args.join(" ")),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Where the cuts go: `-t raw -A PREROUTING`. Bridged traffic between two
/// containers passes `raw PREROUTING` (with `br_netfilter`) before any chain
/// Docker manages. Not `DOCKER-USER`: each `docker network create` makes
/// Docker 20.10 delete the `FORWARD -j DOCKER-USER` jump and insert it again,
/// two iptables calls apart, and packets forwarded in between skip every
/// `DOCKER-USER` rule; runs side by side create networks while others'
/// cuts are in place.
pub const CUT_CHAIN: [&str; 3] = ["-t", "raw", "PREROUTING"];

/// `iptables -w <op> …` on [`CUT_CHAIN`]: `op` is `-I`, `-D` or `-S`.
pub fn cut_chain(op: &str) -> Vec<String> {
    vec![
        "-w".to_owned(),
        CUT_CHAIN[0].to_owned(),
        CUT_CHAIN[1].to_owned(),
        op.to_owned(),
        CUT_CHAIN[2].to_owned(),
    ]
}

/// Removes the cut rules ([`CUT_CHAIN`]) of nemesis runs whose process is
/// gone.
pub(crate) fn remove_leftover_rules(dead: impl Fn(&str) -> bool) {
    let Ok(output) = std::process::Command::new("iptables")
        .args(cut_chain("-S"))
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let owner = words
            .windows(2)
            .find(|w| w[0] == "--comment")
            .map(|w| w[1].trim_matches('"'));
        if words.first() == Some(&"-A") && owner.is_some_and(&dead) {
            // `-S` prints `-A PREROUTING <spec>`: delete `<spec>`.
            let mut args = cut_chain("-D");
            args.extend(words.iter().skip(2).map(|w| w.trim_matches('"').to_owned()));
            let _ = std::process::Command::new("iptables").args(&args).output();
        }
    }
}

/// The switch that makes traffic between containers of one bridge network
/// pass the host's iptables chains (`br_netfilter`).
pub const BRIDGE_NF_CALL_IPTABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// Do iptables rules see traffic between two containers of one bridge
/// network? Only with `br_netfilter` loaded and its switch (the text of
/// [`BRIDGE_NF_CALL_IPTABLES`], `None` when absent) on; otherwise the
/// partition's DROP rules would cut nothing and its cells would pass
/// vacuously.
pub fn bridged_traffic_filtered(switch: Option<&str>) -> bool {
    switch.is_some_and(|text| text.trim() == "1")
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn redis_ready(
    url: &str,
    timeout: Duration,
) -> Result<redis::aio::MultiplexedConnection, ChaosError> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = async {
            let mut c = connect_once(url, Duration::from_millis(1000)).await?;
            let _: String = redis::cmd("PING").query_async(&mut c).await?;
            Ok::<_, redis::RedisError>(c)
        }
        .await;
        match attempt {
            Ok(c) => return Ok(c),
            Err(error) if Instant::now() >= deadline => {
                return Err(ChaosError::Timeout {
                    what: format!("{url} to answer PING ({error})"),
                    after: timeout,
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Waits until `url` refuses a new connection: the node's process is gone.
async fn redis_gone(url: &str, timeout: Duration) -> Result<(), ChaosError> {
    let deadline = Instant::now() + timeout;
    loop {
        let answered = query_once::<String>(url, redis::cmd("PING")).await.is_ok();
        if !answered {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ChaosError::Timeout {
                what: format!("{url} to stop answering after SIGKILL"),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An iptables rule (for [`CUT_CHAIN`]) that drops every packet from `src`
/// to `dst`, tagged with the run's prefix.
fn drop_rule(src: &str, dst: &str, prefix: &str) -> Vec<String> {
    [
        "-s",
        src,
        "-d",
        dst,
        "-m",
        "comment",
        "--comment",
        prefix,
        "-j",
        "DROP",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Whether client container `name` has stopped running (it ended its
/// run, or failed): a fault aimed at it then has nothing to strike.
async fn client_gone(name: &str) -> Result<bool, ChaosError> {
    let running = docker(&["inspect", "--format", "{{.State.Running}}", name]).await?;
    Ok(running != "true")
}

/// Progress is violated by a healthy stretch of this many TTLs without a
/// successful acquire while a client waits (a correct hold lasts under two).
pub const PROGRESS_PATIENCE_TTLS: u64 = 4;

/// The name of the lock (or semaphore) the clients contend for.
pub const LOCK_NAME: &str = "nemesis";

/// The name of the master group the Sentinels watch.
pub const SENTINEL_GROUP: &str = "nemesis";

/// A failover run's replica and Sentinels.
struct SentinelGroup {
    replica_ip: String,
    /// `redis://ip:26379/` of each Sentinel.
    urls: Vec<String>,
    /// The address of each Sentinel.
    ips: Vec<String>,
}

impl SentinelGroup {
    /// Waits until the old master at `old_ip` says it is a replica (the
    /// Sentinels reconfigured it after a split brain healed).
    async fn await_demotion(&self, old_ip: &str, timeout: Duration) -> Result<(), ChaosError> {
        let deadline = Instant::now() + timeout;
        let url = format!("redis://{old_ip}:{REDIS_PORT}/");
        loop {
            let role: Option<Vec<redis::Value>> = query_once(&url, redis::cmd("ROLE")).await.ok();
            let first = role.as_deref().and_then(|r| r.first());
            if matches!(first, Some(redis::Value::BulkString(b)) if b.as_slice() == b"slave") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: "the Sentinels to make the old master a replica".to_owned(),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every Sentinel names the replica as the master and the
    /// replica says it is one.
    async fn await_promotion(&self, timeout: Duration) -> Result<(), ChaosError> {
        let deadline = Instant::now() + timeout;
        let replica_url = format!("redis://{}:{REDIS_PORT}/", self.replica_ip);
        loop {
            let mut named = 0;
            for url in &self.urls {
                let addr: Option<(String, u16)> = query_once(url, {
                    let mut cmd = redis::cmd("SENTINEL");
                    cmd.arg("get-master-addr-by-name").arg(SENTINEL_GROUP);
                    cmd
                })
                .await
                .ok()
                .flatten();
                if addr.is_some_and(|(ip, _)| ip == self.replica_ip) {
                    named += 1;
                }
            }
            let role: Option<Vec<redis::Value>> =
                query_once(&replica_url, redis::cmd("ROLE")).await.ok();
            let is_master = matches!(
                role.as_deref().and_then(|r| r.first()),
                Some(redis::Value::BulkString(b)) if b == b"master"
            );
            if named == self.urls.len() && is_master {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: format!(
                        "the Sentinels to promote the replica ({named} of {} name it)",
                        self.urls.len()
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// `EXISTS key`.
fn exists(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("EXISTS");
    cmd.arg(key);
    cmd
}

/// One command on a fresh connection, with short timeouts.
async fn query_once<T: redis::FromRedisValue>(
    url: &str,
    cmd: redis::Cmd,
) -> Result<T, redis::RedisError> {
    let mut c = connect_once(url, Duration::from_millis(300)).await?;
    cmd.query_async(&mut c).await
}

/// A fresh connection to `url`: 300 ms to connect, `response` per reply.
async fn connect_once(
    url: &str,
    response: Duration,
) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(300)))
        .set_response_timeout(Some(response));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Starts the replica of the master at `master_ip` and three Sentinels
/// (quorum 2, `down-after-milliseconds` 250) and waits until the replica
/// is in sync and every Sentinel knows it and the two other Sentinels.
async fn start_sentinel_group(
    topology: &mut Topology,
    image: &str,
    redis_image: &str,
    master_ip: &str,
    replica_clock: Option<&FakeClock>,
) -> Result<SentinelGroup, ChaosError> {
    let replica_ip = topology.ip(20);
    let replica_args = NodeOptions {
        extra_args: vec![
            "--replicaof".to_owned(),
            master_ip.to_owned(),
            REDIS_PORT.to_string(),
        ],
        ..NodeOptions::default()
    }
    .redis_args();
    let faked = replica_clock.map(faketime_args).unwrap_or_default();
    let mut args: Vec<&str> = faked.iter().map(String::as_str).collect();
    args.extend_from_slice(&[image, "supervise", REDIS_SERVER_PATH]);
    args.extend(replica_args.iter().map(String::as_str));
    topology
        .run_container(&format!("{}-replica", topology.prefix), &replica_ip, &args)
        .await?;
    let (mut urls, mut ips) = (Vec::new(), Vec::new());
    for index in 0..3u8 {
        let dir = topology.out_dir.join(format!("sentinel-{index}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("sentinel.conf"),
            format!(
                "port {SENTINEL_PORT}\n\
                 sentinel monitor {SENTINEL_GROUP} {master_ip} {REDIS_PORT} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_GROUP} 250\n\
                 sentinel failover-timeout {SENTINEL_GROUP} 2000\n"
            ),
        )?;
        let ip = topology.ip(30 + index);
        let mount = format!("{}:/sentinel", dir.to_string_lossy());
        topology
            .run_container(
                &format!("{}-sentinel-{index}", topology.prefix),
                &ip,
                &[
                    "-v",
                    &mount,
                    redis_image,
                    "/sentinel/sentinel.conf",
                    "--sentinel",
                ],
            )
            .await?;
        urls.push(format!("redis://{ip}:{SENTINEL_PORT}/"));
        ips.push(ip);
    }
    redis_ready(
        &format!("redis://{replica_ip}:{REDIS_PORT}/"),
        Duration::from_secs(20),
    )
    .await?;
    let timeout = Duration::from_secs(30);
    let deadline = Instant::now() + timeout;
    loop {
        let info: String = query_once(&format!("redis://{replica_ip}:{REDIS_PORT}/"), {
            let mut cmd = redis::cmd("INFO");
            cmd.arg("replication");
            cmd
        })
        .await
        .unwrap_or_default();
        if info.contains("master_link_status:up") {
            break;
        }
        if Instant::now() >= deadline {
            return Err(ChaosError::Timeout {
                what: "the replica to be in sync with the master".to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for url in &urls {
        loop {
            let master: Vec<String> = query_once(url, {
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg("master").arg(SENTINEL_GROUP);
                cmd
            })
            .await
            .unwrap_or_default();
            let field = |name: &str| {
                master
                    .chunks(2)
                    .find(|pair| pair[0] == name)
                    .and_then(|pair| pair.get(1))
                    .cloned()
                    .unwrap_or_default()
            };
            if field("num-slaves") == "1" && field("num-other-sentinels") == "2" {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: format!("{url} to know the replica and two other Sentinels"),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(SentinelGroup {
        replica_ip,
        urls,
        ips,
    })
}

/// The `docker run` arguments that run a node's `redis-server` (not its
/// supervisor) under libfaketime, reading `clock`'s offset file on every
/// clock call.
fn faketime_args(clock: &FakeClock) -> Vec<String> {
    vec![
        "-e".to_owned(),
        format!("SUPERVISE_LD_PRELOAD={LIBFAKETIME}"),
        "-e".to_owned(),
        format!("FAKETIME_TIMESTAMP_FILE={FAKETIME_DIR}/{OFFSET_FILE}"),
        "-e".to_owned(),
        "FAKETIME_NO_CACHE=1".to_owned(),
        "-v".to_owned(),
        format!("{}:{FAKETIME_DIR}", clock.dir().to_string_lossy()),
    ]
}

/// How far the clock of the node at `url` reads behind the host's, in ms
/// (negative: ahead), from its `TIME`. The host's time is taken after the
/// reply, so the round trip only adds to the reading.
async fn clock_behind_ms(url: &str) -> Result<i64, ChaosError> {
    let (secs, micros): (u64, u64) = query_once(url, redis::cmd("TIME")).await?;
    let node_ms = (secs * 1000 + micros / 1000) as i64;
    Ok((now_us() / 1000) as i64 - node_ms)
}

/// RedLock: the lowest-numbered node of a holder whose token is on exactly
/// a bare majority of the nodes (`GET` of the lock's key on each), or
/// `None` (no such holder, or a node did not answer).
async fn bare_majority_node(node_ips: &[String], key: &str) -> Option<usize> {
    let mut holders: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (index, ip) in node_ips.iter().enumerate() {
        let url = format!("redis://{ip}:{REDIS_PORT}/");
        let mut get = redis::cmd("GET");
        get.arg(key);
        match query_once::<Option<String>>(&url, get).await {
            Ok(Some(token)) => holders.entry(token).or_default().push(index),
            Ok(None) => {}
            Err(_) => return None,
        }
    }
    let majority = node_ips.len() / 2 + 1;
    holders
        .into_values()
        .find(|nodes| nodes.len() == majority)
        .and_then(|nodes| nodes.first().copied())
}

/// Where a fault aimed at client `client`'s iteration `seq` landed, from
/// the resource's log: before that iteration's write (the holder was still
/// inside), after it, or in an iteration that never wrote.
fn landed(log: &[LogEntry], client: u32, seq: u64, struck_us: u64) -> String {
    let write = log
        .iter()
        .find(|e| e.client == client && e.seq == seq && e.op == OpKind::Write);
    match write {
        Some(w) if w.at_us > struck_us => format!(
            " (landed inside: its write came {} ms later)",
            (w.at_us - struck_us) / 1000
        ),
        Some(w) => format!(
            " (landed after its write, by {} ms)",
            (struck_us - w.at_us) / 1000
        ),
        None => " (that section never wrote)".to_owned(),
    }
}

/// `" as client C begins its last step"`, or nothing (an unaimed fault).
fn last_step(client: Option<u32>) -> String {
    client
        .map(|c| format!(" as client {c} begins its last step"))
        .unwrap_or_default()
}

/// The entries of the resource's list `key` from `*seen` on, moving
/// `*seen` past them (none when the resource does not answer: the next
/// poll reads them).
async fn tail(
    resource: &mut redis::aio::MultiplexedConnection,
    key: &str,
    seen: &mut usize,
) -> Vec<String> {
    let fresh: Vec<String> = redis::cmd("LRANGE")
        .arg(key)
        .arg(*seen)
        .arg(-1)
        .query_async(resource)
        .await
        .unwrap_or_default();
    *seen += fresh.len();
    fresh
}

/// The note on a RedLock node fault that found no holder to aim at.
const NO_BARE_MAJORITY: &str =
    " (unaimed: no holder's token was on exactly a bare majority of the nodes within two TTLs)";

/// How far the replica's clock lags its master's under
/// `failover-clock-lag`. The model's lag is 500 ms with a promotion of
/// 1 ms: the promoted node's clock reads less than the old master's did.
/// A real promotion takes 1.4 to 1.5 s here, so the lag must be longer than
/// that for the same to hold.
pub const FAILOVER_CLOCK_LAG_MS: u64 = 3000;

/// The rate of a skewed client's clock: the model's
/// ([`ClientClock::skewed`]).
pub const SKEW_RATE: f64 = {
    let clock = ClientClock::skewed(0);
    clock.num as f64 / clock.den as f64
};

/// Checks every client's clock file (`real wall monotonic width` at its
/// start and its end, see `nemesis-client`): a client in `skewed` must read
/// its wall clock half a TTL ahead of the real time (±50 ms) and its
/// monotonic clock must run at [`SKEW_RATE`] of the real time; every other
/// client's at 1. The rate may be off by 0.1 % plus the two readings'
/// widths over the time between them. Returns one line per skewed client,
/// for the fault list.
fn check_skew(dir: &Path, config: &RunConfig, skewed: &[usize]) -> Result<Vec<String>, ChaosError> {
    let mut lines = Vec::new();
    for index in 0..config.clients {
        let path = dir.join(format!("client-{index}.clock"));
        let text = std::fs::read_to_string(&path)?;
        let probes: Vec<[f64; 4]> = text
            .lines()
            .map(|line| {
                let words: Vec<f64> = line
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                <[f64; 4]>::try_from(words)
                    .map_err(|_| ChaosError::UnexpectedReply(format!("{}: {line}", path.display())))
            })
            .collect::<Result<_, _>>()?;
        let [start, end] = probes[..] else {
            return Err(ChaosError::UnexpectedReply(format!(
                "{}: two probes expected, found {}",
                path.display(),
                probes.len()
            )));
        };
        let real = (end[0] - start[0]).max(1.0);
        let rate = (end[2] - start[2]) / real;
        let rate_slack = 0.001 + (start[3] + end[3]) / real;
        let ahead_ms = (start[1] - start[0]) / 1000.0;
        let is_skewed = skewed.contains(&index);
        let (want_rate, want_ahead) = if is_skewed {
            (SKEW_RATE, ClientClock::skewed(config.ttl_ms).offset as f64)
        } else {
            (1.0, 0.0)
        };
        if (rate - want_rate).abs() > rate_slack || (ahead_ms - want_ahead).abs() > 50.0 {
            return Err(ChaosError::Harness(format!(
                "client {index}'s clock reads {ahead_ms:.0} ms ahead at rate {rate:.4} \
                 (±{rate_slack:.4}), expected {want_ahead:.0} ms at {want_rate} \
                 (libfaketime not in effect?)"
            )));
        }
        if is_skewed {
            lines.push(format!(
                "client {index} clock {ahead_ms:+.0} ms, rate {rate:.4} over {:.1} s",
                real / 1e6
            ));
        }
    }
    Ok(lines)
}

/// The relay's control port (see [`super::relay`]).
pub const RELAY_CONTROL_PORT: u16 = 7000;

/// The relay's port for node `index`.
fn relay_port(index: usize) -> u16 {
    REDIS_PORT + 1 + index as u16
}

/// The nemesis' end of the relay's control connection.
struct RelayControl {
    ip: String,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RelayControl {
    async fn connect(ip: &str) -> Result<RelayControl, ChaosError> {
        use tokio::io::AsyncBufReadExt;
        let stream = tokio::net::TcpStream::connect((ip, RELAY_CONTROL_PORT)).await?;
        let (read, writer) = stream.into_split();
        Ok(RelayControl {
            ip: ip.to_owned(),
            lines: tokio::io::BufReader::new(read).lines(),
            writer,
        })
    }

    async fn send(&mut self, line: &str) -> Result<(), ChaosError> {
        use tokio::io::AsyncWriteExt;
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .await?;
        Ok(())
    }

    /// The next line, within `timeout` (`None`: none came).
    async fn next(&mut self, timeout: Duration) -> Result<Option<String>, ChaosError> {
        match tokio::time::timeout(timeout, self.lines.next_line()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(line))) => Ok(Some(line)),
            Ok(Ok(None)) => Err(ChaosError::Harness(
                "the relay closed its control connection".to_owned(),
            )),
            Ok(Err(e)) => Err(e.into()),
        }
    }

    /// The next line, which must come within `timeout`.
    async fn expect(&mut self, timeout: Duration) -> Result<String, ChaosError> {
        self.next(timeout)
            .await?
            .ok_or_else(|| ChaosError::Timeout {
                what: "the relay to answer".to_owned(),
                after: timeout,
            })
    }

    /// Has the relay hold the next `count` requests (`request`) or
    /// replies of the client at `ip`, each after `skip` more, for `ms`. The
    /// first must fire within `within`; the others get 50 ms more (a RedLock
    /// fan-out sends to every node at once) and are then cancelled. Waits
    /// until every held chunk went on. Returns the relay's `held` and
    /// `released` (or `lost`) lines: empty when nothing was held.
    async fn hold(
        &mut self,
        ip: &str,
        request: bool,
        ms: u64,
        skip: u64,
        count: usize,
        within: Duration,
    ) -> Result<Vec<String>, ChaosError> {
        let direction = if request { "request" } else { "reply" };
        for _ in 0..count {
            self.send(&format!("hold {ip} {direction} {ms} {skip}"))
                .await?;
        }
        for _ in 0..count {
            let answer = self.expect(Duration::from_secs(5)).await?;
            if answer != "armed" {
                return Err(ChaosError::UnexpectedReply(format!("relay: {answer}")));
            }
        }
        let (mut held, mut done) = (Vec::new(), Vec::new());
        let sort = |line: String, held: &mut Vec<String>, done: &mut Vec<String>| {
            if line.starts_with("held ") {
                held.push(line);
            } else if line.starts_with("released ") || line.starts_with("lost ") {
                done.push(line);
            } else {
                return Err(ChaosError::UnexpectedReply(format!("relay: {line}")));
            }
            Ok(())
        };
        if let Some(first) = self.next(within).await? {
            sort(first, &mut held, &mut done)?;
            let until = Instant::now() + Duration::from_millis(50);
            while held.len() < count {
                let left = until.saturating_duration_since(Instant::now());
                match self.next(left).await? {
                    Some(line) if !left.is_zero() => sort(line, &mut held, &mut done)?,
                    Some(line) => {
                        sort(line, &mut held, &mut done)?;
                        break;
                    }
                    None => break,
                }
            }
        }
        if held.len() < count {
            // Disarm the rest. A hold may fire just before the cancel; its
            // lines then come before `cancelled` (the relay sends `held`
            // under the lock that `cancel` takes).
            self.send("cancel").await?;
            loop {
                let line = self.expect(Duration::from_secs(5)).await?;
                if line.starts_with("cancelled") {
                    break;
                }
                sort(line, &mut held, &mut done)?;
            }
        }
        while done.len() < held.len() {
            let line = self
                .expect(Duration::from_millis(ms) + Duration::from_secs(10))
                .await?;
            sort(line, &mut held, &mut done)?;
        }
        held.extend(done);
        Ok(held)
    }
}

/// The port the Sentinels listen on.
const SENTINEL_PORT: u16 = 26379;

/// One run: starts the topology, runs the clients under the seeded fault
/// schedule, heals, collects the histories and the resource's log, judges.
pub async fn run(config: &RunConfig) -> Result<RunReport, ChaosError> {
    if let Some(why) = not_applicable(config.fault, config.protocol) {
        return Err(ChaosError::Harness(format!(
            "{} x {}: not run: {why}",
            config.protocol.as_str(),
            config.fault.as_str()
        )));
    }
    crate::api_shim::ensure()?;
    let image = ensure_client_image(&config.client_binary).await?;
    let mut topology = Topology::new()?;
    let result = run_in(config, &image, &mut topology).await;
    if let Some(keep) = std::env::var_os("NEMESIS_KEEP") {
        // For study: NEMESIS_KEEP=DIR copies the clients' histories and
        // every container's log to DIR/<protocol>-<fault>-<seed>-<mutation>/ before
        // the run's files and containers go.
        // The mutation in the name: a mutation's first run has the seed of
        // the first cell, and the two may run side by side.
        let dir = Path::new(&keep).join(format!(
            "{}-{}-{}-{}",
            config.protocol.as_str(),
            config.fault.as_str(),
            config.seed,
            config.mutation.as_str()
        ));
        if std::fs::create_dir_all(&dir).is_ok() {
            for entry in std::fs::read_dir(&topology.out_dir)
                .into_iter()
                .flatten()
                .flatten()
            {
                if entry
                    .path()
                    .extension()
                    .is_some_and(|e| e == "jsonl" || e == "clock")
                {
                    let _ = std::fs::copy(entry.path(), dir.join(entry.file_name()));
                }
            }
            for name in &topology.containers {
                if let Ok(output) = std::process::Command::new("docker")
                    .args(["logs", "--timestamps", name])
                    .output()
                {
                    let mut text = output.stdout;
                    text.extend_from_slice(&output.stderr);
                    let short = name.trim_start_matches(&topology.prefix);
                    let _ =
                        std::fs::write(dir.join(format!("{}.log", short.trim_matches('-'))), text);
                }
            }
            eprintln!(
                "nemesis: histories and container logs kept in {}",
                dir.display()
            );
        }
    }
    topology.cleanup();
    result
}

async fn run_in(
    config: &RunConfig,
    image: &str,
    topology: &mut Topology,
) -> Result<RunReport, ChaosError> {
    if (matches!(config.fault, Fault::Partition | Fault::ClientPartition)
        || config.fault.has_replica())
        && !bridged_traffic_filtered(
            std::fs::read_to_string(BRIDGE_NF_CALL_IPTABLES)
                .ok()
                .as_deref(),
        )
    {
        return Err(ChaosError::Harness(format!(
            "{BRIDGE_NF_CALL_IPTABLES} is not 1: iptables does not see traffic between \
             containers of one network, so a partition would cut nothing \
             (modprobe br_netfilter)"
        )));
    }
    topology.create_network().await?;
    let redis_image = default_image();
    // The nodes' redis-server arguments, as the replay's nodes have them.
    let node_args = NodeOptions::with_persistence(if config.fault == Fault::RestartPersisted {
        Persistence::AofFsyncAlways
    } else {
        Persistence::None
    })
    .redis_args();
    let resource_ip = topology.ip(2);
    let resource_name = format!("{}-resource", topology.prefix);
    topology
        .run_container(
            &resource_name,
            &resource_ip,
            &[
                &redis_image,
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        .await?;
    let mut node_names = Vec::new();
    let mut node_ips = Vec::new();
    // Under clock jumps and steps back every node's redis-server runs under libfaketime
    // with an offset file of its own (the supervisor and the clients do
    // not: the variables reach redis-server only).
    let mut clocks: Vec<FakeClock> = Vec::new();
    for index in 0..config.nodes() {
        let name = format!("{}-node-{index}", topology.prefix);
        let ip = topology.ip(10 + index as u8);
        // The node runs redis-server under the client binary's supervisor,
        // which kills it with SIGKILL and starts it again on signals from
        // the nemesis (see `Fault::Restart`).
        let mut faked = Vec::new();
        if matches!(config.fault, Fault::ClockJump | Fault::ClockBack) {
            let clock = FakeClock::new()?;
            faked = faketime_args(&clock);
            clocks.push(clock);
        }
        let mut args: Vec<&str> = faked.iter().map(String::as_str).collect();
        args.extend_from_slice(&[image, "supervise", REDIS_SERVER_PATH]);
        args.extend(node_args.iter().map(String::as_str));
        topology.run_container(&name, &ip, &args).await?;
        node_names.push(name);
        node_ips.push(ip);
    }
    // The lock's key, for the check that a failover's aimed grant never
    // reached the replica.
    // And for RedLock's aimed node faults (locks only: a semaphore keeps
    // several keys).
    let lock_key = if !config.is_semaphore() {
        let template = redis::Client::open(format!("redis://{}:{REDIS_PORT}/", node_ips[0]))?;
        let ttl = Duration::from_millis(config.ttl_ms.max(20));
        let mut options = LockOptions::new(config.protocol, ttl);
        // As the clients set it (it must be shorter than the TTL).
        options.request_timeout = (ttl / 4).min(Duration::from_millis(250));
        let lock = Lock::new([template], LOCK_NAME, options)
            .map_err(|e| ChaosError::Harness(format!("the lock's key: {e}")))?;
        Some(lock.key())
    } else {
        None
    };
    let mut faults = Vec::new();
    let mut replica_clock: Option<FakeClock> = None;
    let sentinels = if config.fault.has_replica() {
        if config.nodes() != 1 {
            return Err(ChaosError::Harness(format!(
                "failover runs need a single-master protocol, not {}",
                config.protocol.as_str()
            )));
        }
        // Under `failover-clock-lag` the replica's clock is behind from the
        // start.
        if config.fault == Fault::FailoverClockLag {
            let mut clock = FakeClock::new()?;
            clock.set_offset_ms(-(FAILOVER_CLOCK_LAG_MS as i64))?;
            replica_clock = Some(clock);
        }
        let group = start_sentinel_group(
            topology,
            image,
            &redis_image,
            &node_ips[0],
            replica_clock.as_ref(),
        )
        .await?;
        if replica_clock.is_some() {
            let url = format!("redis://{}:{REDIS_PORT}/", group.replica_ip);
            let behind = clock_behind_ms(&url).await?;
            if behind + 50 < FAILOVER_CLOCK_LAG_MS as i64 {
                return Err(ChaosError::Harness(format!(
                    "the replica's clock is {behind} ms behind, not {FAILOVER_CLOCK_LAG_MS} \
                     (libfaketime not in effect?)"
                )));
            }
            faults.push(format!("replica clock {behind} ms behind its master's"));
        }
        Some(group)
    } else {
        None
    };
    let resource_url = format!("redis://{resource_ip}:{REDIS_PORT}/");
    let mut resource = redis_ready(&resource_url, Duration::from_secs(20)).await?;
    for ip in &node_ips {
        redis_ready(
            &format!("redis://{ip}:{REDIS_PORT}/"),
            Duration::from_secs(20),
        )
        .await?;
    }
    // Under `delay` the clients reach every node through the relay: node
    // `i` at the relay's port `REDIS_PORT + 1 + i`.
    let mut relay = None;
    if config.fault == Fault::Delay {
        let relay_ip = topology.ip(40);
        let routes: Vec<String> = node_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("0.0.0.0:{}={ip}:{REDIS_PORT}", relay_port(i)))
            .collect();
        let control = format!("0.0.0.0:{RELAY_CONTROL_PORT}");
        let mut args = vec![image, "relay", "--control", &control];
        args.extend(routes.iter().map(String::as_str));
        topology
            .run_container(&format!("{}-relay", topology.prefix), &relay_ip, &args)
            .await?;
        for i in 0..node_ips.len() {
            redis_ready(
                &format!("redis://{relay_ip}:{}/", relay_port(i)),
                Duration::from_secs(20),
            )
            .await?;
        }
        relay = Some(RelayControl::connect(&relay_ip).await?);
    }
    let nodes_arg = node_ips
        .iter()
        .enumerate()
        .map(|(i, ip)| match &relay {
            Some(control) => format!("redis://{}:{}/", control.ip, relay_port(i)),
            None => format!("redis://{ip}:{REDIS_PORT}/"),
        })
        .collect::<Vec<_>>()
        .join(",");
    let out_mount = format!("{}:/out", topology.out_dir.to_string_lossy());
    // Empty unless the clients find the master through Sentinels.
    let sentinels_arg = sentinels
        .as_ref()
        .map(|group| group.urls.join(","))
        .unwrap_or_default();
    let mut client_names = Vec::new();
    let mut client_ips = Vec::new();
    // Under `client-skew` about half the clients (at least one) run under
    // libfaketime: half a TTL ahead, 1 % slow (the model's skew).
    let skewed: Vec<usize> = if config.fault == Fault::ClientSkew {
        let mut chosen =
            Rng::new(config.seed ^ 0x5eed_c10c).choose(config.clients, (config.clients / 2).max(1));
        chosen.sort_unstable();
        chosen
    } else {
        Vec::new()
    };
    let ahead_ms = ClientClock::skewed(config.ttl_ms).offset;
    let skew_args = [
        "-e".to_owned(),
        format!("LD_PRELOAD={LIBFAKETIME}"),
        "-e".to_owned(),
        format!(
            "FAKETIME=+{}.{:03} x{SKEW_RATE}",
            ahead_ms / 1000,
            ahead_ms % 1000
        ),
    ];
    // A start file left by an earlier run in the same directory would let
    // the clients start at once.
    let start_file = topology.out_dir.join("start");
    match std::fs::remove_file(&start_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    for index in 0..config.clients {
        let name = format!("{}-client-{index}", topology.prefix);
        let ip = topology.ip(100 + index as u8);
        let id = index.to_string();
        let ttl = config.ttl_ms.to_string();
        let limit = config.limit.to_string();
        let duration = config.duration.as_millis().to_string();
        let out = format!("/out/client-{index}.jsonl");
        let seed = config.seed.to_string();
        let protocol = config.protocol.as_str();
        let mut args: Vec<&str> = vec!["-v", &out_mount];
        if skewed.contains(&index) {
            args.extend(skew_args.iter().map(String::as_str));
        }
        args.extend_from_slice(&[
            image,
            "--id",
            &id,
            "--protocol",
            protocol,
            "--nodes",
            &nodes_arg,
            "--resource",
            &resource_url,
            "--ttl-ms",
            &ttl,
            "--limit",
            &limit,
            "--duration-ms",
            &duration,
            "--mutation",
            config.mutation.as_str(),
            "--out",
            &out,
            "--seed",
            &seed,
            "--sentinels",
            &sentinels_arg,
            "--start-file",
            "/out/start",
        ]);
        topology.run_container(&name, &ip, &args).await?;
        client_names.push(name);
        client_ips.push(ip);
    }

    // --- the nemesis ---------------------------------------------------------
    // The clients, started one after another, wait for this file: they all
    // run from here for `config.duration`, so that none has ended before
    // the last fault (`client_gone` covers one that exits early anyway).
    std::fs::write(&start_file, b"")?;
    let mut rng = Rng::new(config.seed);
    let ttl = config.ttl_ms;
    let started = Instant::now();
    let started_us = now_us();
    let end = started + config.duration;
    let mut pauses: Vec<Paused> = Vec::new();
    let mut seen = 0usize;
    // Each client inside its section: the iteration and when its read ran.
    let mut open_reads: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut seen_marks = 0usize;
    let mut last_write: Option<u32> = None;
    let mut newest_read: Option<u32> = None;
    // The client killed for good, and when (crash runs).
    let mut crashed: Option<(usize, u64)> = None;
    // When the replication link was cut (failover runs).
    let mut cut_at_us: Option<u64> = None;
    // Whether the pause that is due aims inside a section (drawn once per
    // pause, so that waiting for a target does not consume the seed).
    let mut aim: Option<bool> = None;
    // A failover's first step (the replication cut) comes after a second:
    // its kill waits for a grant made after the cut.
    let mut next_fault = started
        + Duration::from_millis(if config.fault.has_replica() {
            1000
        } else {
            rng.range(ttl / 2, ttl)
        });
    let key = log_key(LOCK_NAME);
    // The failover waits a TTL after its cut before it kills, so its loop
    // runs almost to the end; the other faults stop two TTLs before it, or
    // in a run of at least 16 TTLs eleven before it, so that after the last
    // one is over (the longest, a pause or a delay, waits up to two TTLs
    // for its target and lasts up to two more) a healthy stretch of two
    // TTLs to settle and the progress patience of four remains.
    let faults_end = if config.fault.has_replica() {
        end - Duration::from_millis(ttl / 2)
    } else if config.duration >= Duration::from_millis(ttl * 16) {
        end - Duration::from_millis(ttl * 11)
    } else {
        end - Duration::from_millis(ttl * 2)
    };
    // When the last fault was over.
    let mut healed_us = started_us;
    // The faults aimed at a section's last step: (index in `faults`,
    // client, iteration, when the fault struck), to tell afterwards from
    // the log whether the holder was still inside.
    let mut aims: Vec<(usize, u32, u64, u64)> = Vec::new();
    while Instant::now() < faults_end {
        // Follow the resource's log: who is inside, who just left.
        let fresh = tail(&mut resource, &key, &mut seen).await;
        let mut read_now: Option<(u32, u64)> = None;
        for entry in fresh.iter().filter_map(|text| LogEntry::parse(text)) {
            if entry.op == OpKind::Read {
                open_reads.insert(entry.client, (entry.seq, entry.at_us));
                newest_read = Some(entry.client);
                read_now = Some((entry.client, entry.at_us));
            } else {
                open_reads.remove(&entry.client);
                last_write = Some(entry.client);
            }
        }
        // And the marks: who has just begun the last step of its section.
        let marks = tail(&mut resource, &marks_key(LOCK_NAME), &mut seen_marks).await;
        let mut modifying_now: Option<(u32, u64, u64)> = None;
        for mark in &marks {
            let Some((client, seq)) = mark.split_once('|') else {
                continue;
            };
            let (Ok(client), Ok(seq)) = (client.parse::<u32>(), seq.parse::<u64>()) else {
                continue;
            };
            if let Some(&(open_seq, read_at)) = open_reads.get(&client) {
                if open_seq == seq {
                    modifying_now = Some((client, seq, read_at));
                }
            }
        }
        if Instant::now() < next_fault {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        // Crashes, partitions and delays are aimed at a holder that has
        // just entered its section (its read is in this poll of the log),
        // so that the fault lands with the section still ahead of it; the
        // faults that make a node forget or expire the hold (restarts,
        // clock jumps) at a holder that has just begun the last step of its
        // section (its mark), which runs to its end once begun: a holder
        // that renews would otherwise see its lease gone at its next
        // renewal and leave before its write. The nemesis waits up to a
        // TTL for a read, two for a mark.
        let at_mark = is_restart(config.fault) || config.fault == Fault::ClockJump;
        // RedLock: a node that forgets or expires the hold matters only
        // when the holder holds a bare majority (its token on exactly
        // three of the five nodes); the fault then strikes one of those.
        let mut struck_node: Option<usize> = None;
        let entered = if at_mark && config.nodes() > 1 {
            match (modifying_now, &lock_key) {
                (Some((client, _, _)), Some(key)) => {
                    struck_node = bare_majority_node(&node_ips, key).await;
                    struck_node.map(|_| client)
                }
                _ => None,
            }
        } else if at_mark {
            modifying_now.map(|(client, _, _)| client)
        } else {
            read_now
                .map(|(client, _)| client)
                .filter(|c| open_reads.contains_key(c))
        };
        let aimed = at_mark
            || matches!(
                config.fault,
                Fault::Partition | Fault::ClientPartition | Fault::Crash | Fault::Delay
            );
        let patience = Duration::from_millis(if at_mark { ttl * 2 } else { ttl });
        if aimed && entered.is_none() && Instant::now() < next_fault + patience {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        // What a node fault aimed at a mark says of its target, and the
        // target whose write tells afterwards where it landed (none when a
        // RedLock fault found no holder on a bare majority).
        let unaimed = config.nodes() > 1 && struck_node.is_none();
        let aim_note = if unaimed {
            NO_BARE_MAJORITY.to_owned()
        } else {
            last_step(entered)
        };
        let marked = modifying_now
            .filter(|_| !unaimed)
            .map(|(client, seq, _)| (client, seq));
        match config.fault {
            // The skew is the clients' from their start (checked from
            // their clock files once they are done). A client step is not
            // run (`not_applicable`).
            Fault::None | Fault::ClientSkew | Fault::ClientStep => {
                next_fault = end;
            }
            Fault::Delay => {
                let Some(control) = relay.as_mut() else {
                    return Err(ChaosError::Harness("no relay".to_owned()));
                };
                let target = entered
                    .map(|c| c as usize)
                    .unwrap_or_else(|| rng.range(0, config.clients as u64 - 1) as usize);
                let request = rng.range(0, 3) != 0;
                // RedLock: a majority of the fan-out's requests (or
                // replies), one per node. One node: half the holds let one
                // request pass first, so that the second is held (for
                // set-px-get-del's release, the `DEL` after the `GET`).
                let (count, skip) = if config.nodes() > 1 {
                    (config.nodes() / 2 + 1, 0)
                } else {
                    (1, rng.range(0, 1))
                };
                let hold = rng.range(ttl * 6 / 5, ttl * 2);
                let held = control
                    .hold(
                        &client_ips[target],
                        request,
                        hold,
                        skip,
                        count,
                        Duration::from_millis(ttl * 2),
                    )
                    .await?;
                if !held.is_empty() {
                    faults.push(format!(
                        "delay {}{} of client {target}{} {hold} ms: {}",
                        if skip == 1 { "second " } else { "" },
                        if request { "request" } else { "reply" },
                        if entered.is_some() {
                            " (aimed as it entered its section)"
                        } else {
                            ""
                        },
                        held.join("; ")
                    ));
                }
                next_fault = Instant::now() + Duration::from_millis(rng.range(ttl / 4, ttl));
            }
            Fault::Crash => {
                let target = entered
                    .map(|c| c as usize)
                    .unwrap_or_else(|| rng.range(0, config.clients as u64 - 1) as usize);
                if let Err(e) = docker(&["kill", "--signal", "KILL", &client_names[target]]).await {
                    if !client_gone(&client_names[target]).await? {
                        return Err(e);
                    }
                    // It had already ended: draw a target again.
                    next_fault = Instant::now();
                    continue;
                }
                crashed = Some((target, now_us()));
                faults.push(format!(
                    "kill -9 client {target}{}",
                    if entered.is_some() {
                        " inside its section"
                    } else {
                        ""
                    }
                ));
                next_fault = end;
            }
            Fault::Pause => {
                // Three pauses in four hit a client inside its section: the
                // nemesis waits (up to two TTLs) for a read of the resource
                // and pauses its reader at once, while it has most of its
                // section ahead. The fourth hits the client that wrote last,
                // just out of its section.
                let aim_inside = *aim.get_or_insert_with(|| rng.range(0, 3) != 0);
                let inside = newest_read.filter(|c| open_reads.contains_key(c));
                if aim_inside
                    && inside.is_none()
                    && Instant::now() < next_fault + Duration::from_millis(ttl * 2)
                {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                aim = None;
                let target = if aim_inside {
                    inside.or(last_write)
                } else {
                    last_write.or(inside)
                }
                .map(|c| c as usize)
                .unwrap_or_else(|| rng.range(0, config.clients as u64 - 1) as usize);
                let hold = rng.range(ttl * 6 / 5, ttl * 2);
                let from_us = now_us();
                if let Err(e) = docker(&["pause", &client_names[target]]).await {
                    if !client_gone(&client_names[target]).await? {
                        return Err(e);
                    }
                    // It had already ended (its exit code is judged with
                    // the others'): nothing paused, nothing recorded.
                    next_fault =
                        Instant::now() + Duration::from_millis(rng.range(ttl / 10, ttl / 2));
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(hold)).await;
                docker(&["unpause", &client_names[target]]).await?;
                pauses.push(Paused {
                    client: target as u32,
                    from_us,
                    to_us: now_us(),
                });
                faults.push(format!("pause client {target} {hold} ms"));
                next_fault = Instant::now() + Duration::from_millis(rng.range(ttl / 10, ttl / 2));
            }
            Fault::Partition | Fault::ClientPartition => {
                // `partition`: a majority of the clients from some nodes;
                // `client-partition`: one client from one node.
                let one = config.fault == Fault::ClientPartition;
                let cut = if one { 1 } else { config.clients / 2 + 1 };
                let mut chosen = rng.choose(config.clients, cut);
                // The holder that has just entered (else any inside) is
                // always among the cut: the partition then tests what it
                // does when its lease runs out while others still reach
                // the node.
                let inside = newest_read.filter(|c| open_reads.contains_key(c));
                if let Some(holder) = entered.or(inside) {
                    let holder = holder as usize;
                    if !chosen.contains(&holder) {
                        chosen[0] = holder;
                    }
                }
                let node_count = if one || config.nodes() == 1 {
                    1
                } else {
                    rng.range(2, 3) as usize
                };
                let hold = rng.range(ttl * 3 / 2, ttl * 3);
                let mut text = Vec::new();
                for &client in &chosen {
                    for node in rng.choose(config.nodes(), node_count) {
                        for (src, dst) in [
                            (&client_ips[client], &node_ips[node]),
                            (&node_ips[node], &client_ips[client]),
                        ] {
                            let rule = drop_rule(src, dst, &topology.prefix);
                            topology.add_rule(rule).await?;
                        }
                        text.push(format!("c{client}-n{node}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(hold)).await;
                topology.remove_rules().await?;
                faults.push(format!("{} {} {hold} ms", config.fault, text.join(",")));
                next_fault = Instant::now() + Duration::from_millis(rng.range(ttl / 4, ttl));
            }
            Fault::SplitBrain => {
                let Some(group) = &sentinels else {
                    return Err(ChaosError::Harness("no Sentinel group".to_owned()));
                };
                // The minority side: the master and one client (the one
                // that has just entered, when one has). Everything else
                // (the replica, the Sentinels, the other clients) is the
                // majority side; DROP rules both ways between the sides.
                let minority = read_now
                    .map(|(client, _)| client as usize)
                    .unwrap_or_else(|| rng.range(0, config.clients as u64 - 1) as usize);
                let majority: Vec<&String> = std::iter::once(&group.replica_ip)
                    .chain(&group.ips)
                    .collect();
                let others = client_ips
                    .iter()
                    .enumerate()
                    .filter(|&(c, _)| c != minority)
                    .map(|(_, ip)| ip);
                let mut pairs: Vec<(&String, &String)> = majority
                    .iter()
                    .chain(others.collect::<Vec<_>>().iter())
                    .map(|&ip| (&node_ips[0], ip))
                    .collect();
                pairs.extend(majority.iter().map(|&ip| (&client_ips[minority], ip)));
                for (a, b) in pairs {
                    for (src, dst) in [(a, b), (b, a)] {
                        let rule = drop_rule(src, dst, &topology.prefix);
                        topology.add_rule(rule).await?;
                    }
                }
                let cut = Instant::now();
                group.await_promotion(Duration::from_secs(30)).await?;
                let promoted = cut.elapsed().as_millis();
                // Both masters serve their sides for two to three TTLs;
                // then the Sentinels reach the old master again, make it a
                // replica of the new one and kill its clients' connections.
                let hold = rng.range(ttl * 2, ttl * 3);
                tokio::time::sleep(Duration::from_millis(hold)).await;
                topology.remove_rules().await?;
                let healed = Instant::now();
                group
                    .await_demotion(&node_ips[0], Duration::from_secs(30))
                    .await?;
                faults.push(format!(
                    "split brain: node 0 and client {minority} cut off from the replica, the \
                     Sentinels and the other clients; the Sentinels named the replica after \
                     {promoted} ms; healed {hold} ms later, node 0 made a replica after {} ms",
                    healed.elapsed().as_millis()
                ));
                next_fault = end;
            }
            Fault::Failover | Fault::FailoverClockLag => {
                let Some(group) = &sentinels else {
                    return Err(ChaosError::Harness("no Sentinel group".to_owned()));
                };
                match cut_at_us {
                    None => {
                        // Cut the replication link both ways; grants from
                        // now on stay on the master.
                        for (src, dst) in [
                            (&node_ips[0], &group.replica_ip),
                            (&group.replica_ip, &node_ips[0]),
                        ] {
                            let rule = drop_rule(src, dst, &topology.prefix);
                            topology.add_rule(rule).await?;
                        }
                        cut_at_us = Some(now_us());
                        faults.push("replication link cut".to_owned());
                    }
                    Some(cut) => {
                        // The replica holds what the master had at the cut,
                        // and every lease granted by then has run out a TTL
                        // later: a grant made after that is certainly not
                        // on the replica, and no older one stands in its
                        // way there. Kill the master as a client that entered
                        // its section on such a grant begins its last step
                        // (its mark), which runs to its end once begun.
                        // A replica whose clock lags keeps a key that much
                        // longer.
                        let lag = if config.fault == Fault::FailoverClockLag {
                            FAILOVER_CLOCK_LAG_MS
                        } else {
                            0
                        };
                        let stale_until = cut + (ttl + lag + 100) * 1000;
                        let fresh = modifying_now.filter(|(_, _, read_at)| *read_at > stale_until);
                        let waited = now_us().saturating_sub(cut) / 1000;
                        if fresh.is_none() && waited < ttl * 3 {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            continue;
                        }
                        // The cut holds: the grant the kill aims at is not on
                        // the replica (a replica hides keys past their expiry).
                        if let (Some(key), Some((client, _, _))) = (&lock_key, fresh) {
                            let replica = format!("redis://{}:{REDIS_PORT}/", group.replica_ip);
                            let mut on_replica = query_once(&replica, exists(key)).await;
                            for _ in 0..3 {
                                if on_replica.is_ok() {
                                    break;
                                }
                                on_replica = query_once(&replica, exists(key)).await;
                            }
                            let on_replica: i64 = on_replica?;
                            if on_replica != 0 {
                                return Err(ChaosError::Harness(format!(
                                    "client {client}'s grant reached the replica: the \
                                     replication cut did not hold"
                                )));
                            }
                        }
                        let url = format!("redis://{}:{REDIS_PORT}/", node_ips[0]);
                        let struck_us = now_us();
                        docker(&["kill", "--signal", "USR1", &node_names[0]]).await?;
                        redis_gone(&url, Duration::from_secs(5)).await?;
                        let killed = Instant::now();
                        group.await_promotion(Duration::from_secs(30)).await?;
                        faults.push(format!(
                            "SIGKILL master node 0 {waited} ms after the cut{}; \
                             the Sentinels named the replica after {} ms",
                            last_step(fresh.map(|(client, _, _)| client)),
                            killed.elapsed().as_millis()
                        ));
                        if let Some((client, seq, _)) = fresh {
                            aims.push((faults.len() - 1, client, seq, struck_us));
                        }
                        next_fault = end;
                    }
                }
            }
            Fault::ClockJump => {
                let drawn = rng.range(0, config.nodes() as u64 - 1) as usize;
                let node = struck_node.unwrap_or(drawn);
                let jump = rng.range(ttl * 6 / 5, ttl * 2);
                let struck_us = now_us();
                clocks[node].jump_ms(jump as i64)?;
                // The jump took: the node's own TIME reads the offset ahead.
                let offset = clocks[node].offset_ms();
                let node_url = format!("redis://{}:{REDIS_PORT}/", node_ips[node]);
                // Host time taken before the question: the round trip
                // only adds to the node's reading.
                let before_ms = now_us() / 1000;
                let (secs, micros): (u64, u64) = query_once(&node_url, redis::cmd("TIME")).await?;
                let node_ms = secs * 1000 + micros / 1000;
                let expected = before_ms + offset.max(0) as u64;
                if node_ms + 50 < expected {
                    return Err(ChaosError::Harness(format!(
                        "node {node}'s clock did not jump: TIME reads {node_ms} ms, \
                         expected at least {expected} - 50 (libfaketime not in effect?)"
                    )));
                }
                faults.push(format!(
                    "clock of node {node} jumps +{jump} ms (offset {} ms){}",
                    clocks[node].offset_ms(),
                    aim_note
                ));
                if let Some((client, seq)) = marked {
                    aims.push((faults.len() - 1, client, seq, struck_us));
                }
                next_fault = Instant::now() + Duration::from_millis(rng.range(ttl / 2, ttl * 2));
            }
            Fault::Restart | Fault::RestartPersisted | Fault::RestartDelayed | Fault::ClockBack => {
                let drawn = rng.range(0, config.nodes() as u64 - 1) as usize;
                let node = struck_node.unwrap_or(drawn);
                let down = if config.fault == Fault::RestartDelayed {
                    rng.range(ttl * 6 / 5, ttl * 2)
                } else {
                    rng.range(0, 100)
                };
                let url = format!("redis://{}:{REDIS_PORT}/", node_ips[node]);
                // SIGUSR1: the supervisor kills redis-server with SIGKILL.
                let struck_us = now_us();
                docker(&["kill", "--signal", "USR1", &node_names[node]]).await?;
                redis_gone(&url, Duration::from_secs(5)).await?;
                tokio::time::sleep(Duration::from_millis(down)).await;
                // Under `clock-back` the node's clock comes back behind by
                // more than the restart took.
                if config.fault == Fault::ClockBack {
                    let offset = clocks[node].offset_ms() - CLOCK_STEP_BACK as i64;
                    clocks[node].set_offset_ms(offset)?;
                }
                // SIGUSR2: the supervisor starts it again.
                docker(&["kill", "--signal", "USR2", &node_names[node]]).await?;
                redis_ready(&url, Duration::from_secs(20)).await?;
                let mut text = format!("kill -9 node {node}{aim_note}, down {down} ms");
                if config.fault == Fault::ClockBack {
                    let behind = clock_behind_ms(&url).await?;
                    let offset = clocks[node].offset_ms();
                    if behind + 50 < -offset {
                        return Err(ChaosError::Harness(format!(
                            "node {node}'s clock reads {behind} ms behind after its restart, \
                             not {} (libfaketime not in effect?)",
                            -offset
                        )));
                    }
                    text.push_str(&format!(", its clock back {behind} ms"));
                }
                faults.push(text);
                if let Some((client, seq)) = marked {
                    aims.push((faults.len() - 1, client, seq, struck_us));
                }
                next_fault = Instant::now() + Duration::from_millis(rng.range(ttl / 2, ttl * 2));
            }
        }
        // Every fault above is over (healed, or for good) when its arm
        // ends: the healthy stretch starts after the last one.
        healed_us = now_us();
    }

    // A run whose fault never happened shows nothing about the fault.
    let happened = match config.fault {
        // The skew is checked once the clients are done.
        Fault::None | Fault::ClientSkew => true,
        Fault::Failover | Fault::FailoverClockLag => {
            faults.iter().any(|f| f.starts_with("SIGKILL master"))
        }
        Fault::SplitBrain => faults.iter().any(|f| f.starts_with("split brain")),
        Fault::Crash => crashed.is_some(),
        _ => !faults.is_empty(),
    };
    if !happened {
        return Err(ChaosError::Harness(format!(
            "the {} run ended before its fault (faults: {faults:?}): give it more time \
             (at least four TTLs and a second)",
            config.fault.as_str()
        )));
    }

    // --- heal, wait, collect -------------------------------------------------
    topology.remove_rules().await?;
    let wait_until = end + Duration::from_millis(ttl * 4) + Duration::from_secs(10);
    for name in &client_names {
        loop {
            let running = docker(&["inspect", "--format", "{{.State.Running}}", name]).await?;
            if running != "true" || Instant::now() > wait_until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (index, name) in client_names.iter().enumerate() {
        let _ = docker(&["kill", name]).await;
        let code = docker(&["inspect", "--format", "{{.State.ExitCode}}", name]).await?;
        if code != "0" && crashed.map(|(c, _)| c) != Some(index) {
            let logs = docker(&["logs", "--tail", "5", name])
                .await
                .unwrap_or_default();
            return Err(ChaosError::Harness(format!(
                "client {name} exited with {code}: {logs}"
            )));
        }
    }
    if config.fault == Fault::ClientSkew {
        faults.extend(check_skew(&topology.out_dir, config, &skewed)?);
    }
    let texts: Vec<String> = redis::cmd("LRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query_async(&mut resource)
        .await?;
    let mut log = Vec::with_capacity(texts.len());
    for text in &texts {
        log.push(LogEntry::parse(text).ok_or_else(|| ChaosError::UnexpectedReply(text.clone()))?);
    }
    for (index, client, seq, struck_us) in aims {
        faults[index].push_str(&landed(&log, client, seq, struck_us));
    }
    let mut history = Vec::new();
    for index in 0..config.clients {
        let path = topology.out_dir.join(format!("client-{index}.jsonl"));
        let mut text = std::fs::read_to_string(&path)?;
        // A client killed by the nemesis may have died inside a line.
        if crashed.map(|(c, _)| c) == Some(index) && !text.ends_with('\n') {
            let whole = text.rfind('\n').map_or(0, |at| at + 1);
            text.truncate(whole);
        }
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: OpRecord = serde_json::from_str(line)
                .map_err(|e| ChaosError::UnexpectedReply(format!("{line}: {e}")))?;
            history.push(record);
        }
    }
    let mut judgement = judge_with_pauses(
        &log,
        &history,
        config.limit.max(1) as usize,
        &pauses,
        config.ttl_ms * 1000,
    );
    // Progress, where the run has a healthy stretch: from two TTLs after
    // the start (no fault, or the clients' skew, which is no outage), after
    // the crash, or after the last fault was over, to the clients'
    // deadline. Judged where that stretch is at least the patience.
    let ttl_us = config.ttl_ms * 1000;
    let healthy_from = match (config.fault, crashed) {
        (Fault::None | Fault::ClientSkew, _) => Some(started_us + 2 * ttl_us),
        (Fault::Crash, Some((_, at))) => Some(at + 2 * ttl_us),
        (Fault::Crash, None) => None,
        _ => Some(healed_us + 2 * ttl_us),
    };
    let patience_us = PROGRESS_PATIENCE_TTLS * ttl_us;
    let to = started_us + config.duration.as_micros() as u64;
    let progress_judged = healthy_from.is_some_and(|from| to.saturating_sub(from) >= patience_us);
    if let (true, Some(from)) = (progress_judged, healthy_from) {
        if let Some(finding) = progress(&history, from, to, patience_us) {
            judgement.findings.push(finding);
        }
    }
    Ok(RunReport {
        config: config.clone(),
        operations: history.len(),
        indeterminate: history
            .iter()
            .filter(|r| r.outcome == Outcome::Indeterminate)
            .count(),
        acquired: history
            .iter()
            .filter(|r| r.op == OpKind::Acquire && r.outcome == Outcome::Ok)
            .count(),
        faults,
        judgement,
        progress_judged,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_faults_apply_to_single_masters_only_and_a_client_step_to_none() {
        for fault in Fault::ALL {
            assert_eq!(
                applies_to(fault, ProtocolId::Redlock),
                !fault.has_replica() && fault != Fault::ClientStep,
                "{fault}"
            );
            assert_eq!(
                applies_to(fault, ProtocolId::SetPxLua),
                fault != Fault::ClientStep,
                "{fault}"
            );
        }
        let restarts: Vec<Fault> = Fault::ALL.into_iter().filter(|&f| is_restart(f)).collect();
        assert_eq!(
            restarts,
            [
                Fault::ClockBack,
                Fault::Restart,
                Fault::RestartDelayed,
                Fault::RestartPersisted
            ]
        );
    }

    #[test]
    fn a_partition_needs_bridged_traffic_to_pass_iptables() {
        assert!(bridged_traffic_filtered(Some("1\n")));
        assert!(!bridged_traffic_filtered(Some("0\n")));
        // br_netfilter not loaded: the switch does not exist.
        assert!(!bridged_traffic_filtered(None));
    }
}
