//! # lockwright-chaos
//!
//! The model against real Redis. This crate holds the infrastructure (the
//! containers, their faults, the environment check), the [`replay`] of
//! model traces on real servers, the [`history`] checks and the [`report`]
//! table of the remaining hand-written scenario.
//!
//! ## The replay (`replay`, `tests/replay.rs`, the `replay` binary)
//!
//! Every violated cell of the verdict matrix has a shortest counterexample;
//! [`replay::Bench::replay`] executes it action by action on Redis
//! containers and requires every reply, every key and the protected
//! resource to equal the model's at every step. The test replays all of
//! them, and seeded random paths of every (protocol, fault) run with a
//! property that holds, and fails on the first disagreement; it also keeps
//! deliberate harness faults (clocks left still or one millisecond off,
//! restarts skipped) that the replay must catch. `docs/replay.md` is the
//! generated table:
//!
//! ```text
//! cargo run --release -p lockwright-chaos --bin replay -- --markdown docs/replay.md
//! cargo run --release -p lockwright-chaos --bin replay -- set-px-get-del pause owner-only
//! ```
//!
//! ## What is real and what the harness plays
//!
//! Real in a replay: the servers and their replies; node time (each node's
//! wall clock frozen by libfaketime at the model's node clock, so keys
//! expire when the model says, and a clock jump is the same file moved);
//! restarts (SIGKILL and a start of the container, with AOF `fsync always`
//! for `restart-persisted`, kept down as long as the model says for
//! `restart-delayed`); failover (a second container synced by real
//! replication at the model's "replica catches up" step, detached
//! otherwise, and made the clients' node at "promoted" with the old master
//! killed); dead connections after a restart or failover. A restart is a
//! killed process, not a lost machine: the kernel's page cache survives
//! SIGKILL, so `fsync always` is configured but not put to the test (the
//! model has no power loss). Played by the harness: the protected resource
//! (a Redis store of its own running the model's rule in one script: refuse
//! an older fence, note a write whose ghost grant is older than one already
//! written), the network (a partitioned node's
//! requests and lost requests are not sent, a lost reply is read and
//! dropped, a delayed message is sent when the model delivers it) and the
//! clients (a paused or crashed client takes no step; a skewed client reads
//! the model's clock). The grant order that makes a write stale is the
//! model's ghost, sent to the store as data.
//!
//! ## The hand-written scenario
//!
//! `tests/failover.rs` runs the adapter (`lockwright-redis`) against a
//! master and a replica whose link is cut, with and without `WAIT`, which
//! the model does not have yet; it prints its rows (scenario | protocol |
//! fault | property | expected by the model | observed) and asserts that each
//! is the model's verdict. Its client clocks are the test process' own.
//! `tests/faults.rs` checks each container fault on its own.
//!
//! ## The nemesis (`nemesis`, `tests/nemesis.rs`, the `nemesis` binary)
//!
//! Randomized runs against the adapter users run. Each run creates a
//! network, its Redis nodes (one, or five for RedLock), a resource Redis
//! and N client containers (default 5, up to 20) of a local image built by
//! the run itself ([`nemesis::run::ensure_client_image`]: `FROM` the Redis
//! image, plus the `nemesis-client` binary and the shared libraries `ldd`
//! names, at their real paths; nothing is pulled). Each client loops
//! acquire → read the resource → (the protocols that renew: work for 0.5 to
//! 1.5 TTLs, leaving when `lost()` fires) → modify, begun only with the
//! modify step and a quarter of the TTL of validity left → write the
//! resource → release, with `lockwright-redis` (`Lock`, `Semaphore`,
//! guards, fences, `valid_until()`, `lost()`), and appends one JSON line per
//! operation with
//! its invocation and completion times on the host clock (read through the
//! vDSO, past libfaketime, also by a skewed client) and its outcome:
//! ok, fail, or indeterminate (a timeout or lost connection: recorded as
//! unknown, never as success or failure).
//!
//! The resource runs one Lua script that appends every access,
//! `client|seq|read or write|fence|ok or refused|µs`, to a list, and
//! refuses a fence lower than the highest it accepted. The checker
//! ([`nemesis::checker`]) judges from that list, the single order in which
//! the resource ran the accesses: two clients are certainly inside at once
//! when one's read is logged between the other's read and write (a
//! section whose write never reached the resource is not counted, so
//! nothing is guessed); a superseded holder's write accepted after its
//! successor's read violates the fenced resource; fences accepted out of
//! order, accesses logged twice, or logged otherwise than their client saw
//! them answered are integrity failures; a semaphore fails when more
//! sections than permits overlap. Owner-only is judged for locks under
//! pauses and delays: an overlap of two sections neither of whose clients
//! was paused, entered while the other holder's lease certainly still
//! stood.
//!
//! Faults, real and seeded (the seed is printed and replays the schedule
//! and the clients' choices; container timing still varies):
//!
//! The faults are the model's own ([`lockwright_model::Fault`]; how each
//! strikes is listed in [`nemesis::run`]), one per column of the model: client `crash` (`docker kill`, for good), client `pause`
//! (`docker pause`), `client-skew` (libfaketime in about half the client
//! containers: half a TTL ahead, 1 % slow, checked from each client's
//! clock probes), `partition` and `client-partition` (iptables black holes
//! between chosen client and node containers, or one client and one node),
//! `restart`, `restart-persisted`, `restart-delayed`
//! and `clock-back` (SIGKILL of a node's `redis-server`, started again by
//! the node container's supervisor: at once, with AOF, after more than a
//! TTL, or with its libfaketime clock set back), `clock-jump`
//! (libfaketime in the node's `redis-server`, its offset moved forward at
//! run time), `delay` (a TCP relay container, [`nemesis::relay`], holds a
//! client's request or reply past its timeout) and `failover` and
//! `failover-clock-lag` (a replica, its clock behind in the second, and
//! three Redis Sentinels; the replication link cut, the master killed, the
//! replica promoted by the Sentinels); `docs/nemesis.md` has the whole
//! table and the model column each is compared with.
//!
//! Progress is judged over the healthy stretch after the start, the crash
//! or the last fault, where it is at least the patience. The model's
//! `delay` may also lose a message; the relay only holds them.
//!
//! Mutations ([`nemesis::Mutation`], in the client, never in the library)
//! must be caught: working 20 % of the TTL past `valid_until()`
//! (`set-px-lua`, no fault), releasing with a plain `DEL` (`set-px-lua`,
//! pauses, judged as owner-only), not passing the fence to the resource
//! (holding the lock without renewal)
//! (`fenced`, pauses), ignoring `lost()` (`reentrant`, partitions). Each
//! cell's model verdict is read from `model/expectations.txt`: a violation
//! in a holds cell fails the test with its seed and log excerpt, unless the
//! model lists the cell as a known gap of its bounds
//! (`lockwright_model::matrix::BOUND_GAPS`: reported, not failed); a
//! violated cell not found is reported as `not found`.
//!
//! Every container, network and rule carries the prefix
//! `lockwright-chaos-<pid>-nemesis-<n>` (directories: that prefix, or
//! `lockwright-faketime-<pid>-` for the fake clocks) and is removed at the
//! end of its run, also on an error or a panic; [`check_environment`]
//! removes those of processes that are gone.
//!
//! ```text
//! cargo run -p lockwright-chaos --release --bin nemesis -- --minutes 10 --clients 5 --seed 1
//! ```
//!
//! ## The image
//!
//! `lockwright/redis-faketime:7` is built locally, once per machine, by
//! `.ci/build-redis-image.sh` (about 40 s the first time, nothing after;
//! `FORCE=1` rebuilds). No registry is involved and the image is never pulled.
//! It is `FROM scratch` and holds only `redis-server` compiled from Debian's
//! source package with `MALLOC=libc` (Debian's binary links jemalloc, which
//! hangs under libfaketime), libc, libm, ld-linux and libfaketime.
//!
//! ## Nodes and faults
//!
//! [`Cluster::start`] starts `n` masters on two fresh networks: the clients'
//! network, through which a fixed host port on 127.0.0.1 is published, and a
//! peer network for replication. Each [`RedisNode`] runs
//! `redis-server --save '' --appendonly no` (or `--appendonly yes
//! --appendfsync always` with [`Persistence::AofFsyncAlways`]) under
//! `LD_PRELOAD=libfaketime.so.1`, `FAKETIME_NO_CACHE=1` and
//! `FAKETIME_TIMESTAMP_FILE` in a bind-mounted host directory holding the
//! node's offset (`+0.000`, the real time, to begin with), or, with
//! [`NodeOptions::frozen_clock`] (the replay), an absolute reading at which
//! the wall clock stands until the harness moves it.
//!
//! | fault | call | effect |
//! |---|---|---|
//! | kill | [`RedisNode::kill`] | SIGKILL; [`RedisNode::restart`] brings it back empty, or with its AOF |
//! | partition | [`RedisNode::partition`] / [`RedisNode::heal`] | disconnects the clients' network: connecting fails |
//! | replication cut | [`RedisNode::isolate_from_peers`] / [`RedisNode::rejoin_peers`] | clients still reach the node |
//! | pause | [`RedisNode::pause`] / [`RedisNode::unpause`] | `docker pause`: nothing is answered |
//! | clock jump | [`RedisNode::jump_clock`] | the node's clocks jump by `ms` at once; keys expire early |
//! | failover | [`RedisNode::replicate_from`], [`RedisNode::promote`] | `REPLICAOF`, `REPLICAOF NO ONE` |
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockwright_chaos::ChaosError> {
//! use lockwright_chaos::{Cluster, NodeOptions};
//! let mut cluster = Cluster::start(5, &NodeOptions::default()).await?;
//! let urls = cluster.urls(); // redis://127.0.0.1:<port>/ each
//! cluster.node_mut(0).jump_clock(10_000)?; // node 0 is now 10 s ahead
//! cluster.node(1).partition().await?;
//! cluster.node(1).heal().await?;
//! # let _ = urls; Ok(()) }
//! ```
//!
//! ## Running the tests
//!
//! `cargo test -p lockwright-chaos` needs Docker and the image. Without them
//! each test prints `SKIPPED: <reason>` and passes, unless the environment
//! variable `CI` is set: then a missing Docker or image is a failure
//! ([`check_environment`]).
//!
//! testcontainers 0.28 speaks Docker API 1.53 and does not negotiate; with
//! an older daemon (Docker 20.10 stops at 1.41) the crate routes it through
//! a small local shim ([`api_shim`]). Faults that testcontainers has no call
//! for use the docker CLI, which negotiates by itself.

pub mod api_shim;
mod clock;
mod docker;
pub mod history;
pub mod nemesis;
mod node;
pub mod replay;
pub mod report;

use std::time::Duration;

pub use clock::{frozen_env, FakeClock};
pub use history::{History, Observed, Op};
pub use node::{
    default_image, NodeOptions, Persistence, RedisNode, FAKETIME_DIR, IMAGE_NAME, IMAGE_TAG,
    LIBFAKETIME, REDIS_PORT,
};

/// Everything that can go wrong while setting up or faulting containers.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Docker or the image is missing where it is required (`CI` is set).
    #[error("chaos environment unavailable: {0}")]
    Unavailable(String),
    /// The local image does not exist; it is never pulled.
    #[error("image {0} is not present locally; build it with .ci/build-redis-image.sh")]
    ImageMissing(String),
    /// A docker CLI call failed.
    #[error("docker {args}: {message}")]
    DockerCli {
        /// The arguments given to `docker`.
        args: String,
        /// Its error output.
        message: String,
    },
    /// The Docker API shim could not start.
    #[error("docker API shim: {0}")]
    ApiShim(String),
    /// testcontainers failed.
    #[error("testcontainers: {0}")]
    Testcontainers(#[from] testcontainers::TestcontainersError),
    /// The redis client failed (includes timeouts of partitioned nodes).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Local file or socket I/O failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Something did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
    /// The model checker could not produce the counterexamples to replay.
    #[error("model: {0}")]
    Model(#[from] lockwright_model::docs::DocsError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Output {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The harness (a replay's or the nemesis') failed; the text names the
    /// cell, path or step.
    #[error("harness: {0}")]
    Harness(String),
    /// A reply that the infrastructure did not expect.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

/// Whether chaos tests can run here.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Availability {
    /// Docker answers and the image exists.
    Ready,
    /// Outside CI: the tests should skip, for this reason (already printed).
    Skip(String),
}

/// Checks Docker and the default image, and starts the API shim if needed.
/// When they are ready, it removes the containers, networks and clock
/// directories of earlier chaos runs whose process no longer exists (a run
/// killed before it could clean up).
///
/// Outside CI a missing piece gives [`Availability::Skip`] after printing
/// `SKIPPED: <reason>` to stderr; with the environment variable `CI` set it
/// is an error, so that CI never passes by skipping.
pub fn check_environment() -> Result<Availability, ChaosError> {
    let reason = match docker::unavailable_reason(&default_image()) {
        None => match api_shim::ensure() {
            Ok(_) => {
                docker::remove_leftovers();
                return Ok(Availability::Ready);
            }
            Err(error) => error.to_string(),
        },
        Some(reason) => reason,
    };
    if in_ci() {
        return Err(ChaosError::Unavailable(reason));
    }
    eprintln!("\n*** SKIPPED: {reason} ***\n");
    Ok(Availability::Skip(reason))
}

/// Is the environment variable `CI` set to something other than empty,
/// `0` or `false`?
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// `n` Redis masters on two networks of their own (clients, peers).
///
/// Dropping the cluster removes its containers and networks.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<RedisNode>,
    network: String,
    peer_network: String,
}

impl Cluster {
    /// Starts `n` nodes with the same options, one after the other.
    pub async fn start(n: usize, options: &NodeOptions) -> Result<Self, ChaosError> {
        api_shim::ensure()?;
        let network = node::unique_name("lockwright-chaos");
        let peer_network = format!("{network}-peers");
        docker::docker(&[
            "network",
            "create",
            "--label",
            "org.lockwright.chaos=peers",
            &peer_network,
        ])
        .await?;
        let mut cluster = Self {
            nodes: Vec::with_capacity(n),
            network,
            peer_network,
        };
        for index in 0..n {
            let name = format!("{}-{index}", cluster.network);
            let node =
                RedisNode::start(&name, &cluster.network, &cluster.peer_network, options).await?;
            cluster.nodes.push(node);
        }
        Ok(cluster)
    }

    /// A master and a replica of it (node 0 and node 1), synced.
    pub async fn start_replicated(options: &NodeOptions) -> Result<Self, ChaosError> {
        let cluster = Self::start(2, options).await?;
        cluster.nodes[1].replicate_from(&cluster.nodes[0]).await?;
        Ok(cluster)
    }

    /// All nodes, in start order.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// Node `index`.
    ///
    /// # Panics
    /// When `index` is out of range (a bug in the test, not a fault).
    pub fn node(&self, index: usize) -> &RedisNode {
        &self.nodes[index]
    }

    /// Node `index`, mutably (clock jumps).
    ///
    /// # Panics
    /// When `index` is out of range.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisNode {
        &mut self.nodes[index]
    }

    /// The nodes' URLs, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// The clients' network name.
    pub fn network(&self) -> &str {
        &self.network
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The peer network is ours; the clients' network and the containers
        // belong to testcontainers, which removes them when the nodes drop.
        for node in &self.nodes {
            let _ = docker::docker_blocking(&[
                "network",
                "disconnect",
                "--force",
                &self.peer_network,
                node.name(),
            ]);
        }
        let _ = docker::docker_blocking(&["network", "rm", &self.peer_network]);
    }
}
