//! Replay: a model counterexample executed on real Redis, action by action.
//!
//! The model's trace is a sequence of (state, action). The replay walks it
//! with real servers (containers of the local image) standing in for the
//! model's nodes, and requires at every step that Redis answers exactly what
//! the model's keyspace answered and holds exactly the keys the model holds.
//! When every step agrees, the counterexample is a real execution: the
//! clients' beliefs, built from those very replies, are the model's, so the
//! violation the checker found happens on real Redis.
//!
//! What is real and what the harness is:
//!
//! - **Requests** are the ones the core machines in the trace emitted,
//!   sent by the adapter's own encoding ([`lockwright_redis::wire::execute`]:
//!   `EVALSHA` with the `EVAL` fallback, `MULTI … EXEC` as one pipeline) on
//!   one real connection per (client, node) pair, so WATCH state lives where
//!   the model keeps it.
//! - **Node time** is the model's: every node's wall clock is frozen by
//!   libfaketime at the model's node clock, in milliseconds since the epoch,
//!   and moved before each step ([`NodeOptions::frozen_clock`]). Keys expire
//!   on the real server exactly when the model says; a clock jump moves the
//!   same file.
//! - **Node faults are real:** `restart` is SIGKILL and a start of the
//!   container (empty; with AOF `fsync always` for `restart-persisted`; for
//!   `restart-delayed` the container stays down until the model brings the
//!   node back, and requests meanwhile really fail). `failover` uses a
//!   second container fed by real replication: at the model's "replica
//!   catches up" step it attaches to the master (`REPLICAOF`), syncs and
//!   detaches again (`REPLICAOF NO ONE`), so it sees no write between those
//!   steps; at "promoted" the clients' node becomes that container and the
//!   old master is killed.
//! - **The network is the harness:** a partitioned node's requests, and a
//!   lost request, are not sent; a lost reply is read and thrown away; a
//!   request in flight (up to the latency bound, or held up by `delay`) is
//!   sent when the model delivers it. A reply timeout retires the pair's
//!   connection as the adapter does: a request not yet run then runs later
//!   on that retired connection, and the next request opens a new one.
//!   Client faults
//!   (pause, crash, skew, a client's clock step) are the model's client
//!   machines taking no step or reading the model's clocks; nothing real is
//!   needed for them.
//!
//! Keys are compared through a separate connection per node (`KEYS`, the
//! value, `PEXPIRETIME`) on every node that is up, after every step; a read
//! deletes only keys that are already expired, as the model's own purge
//! after each delivery does.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use lockwright_core::keyspace::{Entry, Value};
use lockwright_core::rng::SplitMix64;
use lockwright_core::ProtocolId;
use lockwright_core::{Millis, Outcome};
use lockwright_model::cache::Cache;
use lockwright_model::docs::CellResult;
use lockwright_model::matrix::{self, Trace, Verdict as CheckVerdict};
use lockwright_model::model::Phase;
use lockwright_model::{Action, Fault, LockModel, PropertyId, State};
use lockwright_redis::wire;
use redis::aio::MultiplexedConnection;

use crate::{ChaosError, Cluster, NodeOptions, Persistence, RedisNode};

/// How long a replayed request may take before its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The connection key of a client's retired connection `slot` (the model's
/// [`lockwright_model::model::Orphan::slot`]), on which an orphaned request
/// still runs: the high bit, the slot, the client.
fn retired(client: u8, slot: u8) -> u8 {
    0x80 | (slot << 3) | client
}

/// Deliberate faults in the harness, to show that a replay can fail (each
/// is kept as a test). The default replays faithfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplayOptions {
    /// Move the node clocks to the model's (`false` leaves every node at
    /// time 0, so nothing ever expires).
    pub node_clocks: bool,
    /// Milliseconds added to every node clock reading the replay writes:
    /// `-1` is a keyspace model whose keys expire one millisecond late
    /// compared with Redis (`0` replays faithfully).
    pub node_clock_error_ms: i64,
    /// Carry out restarts and failovers on the containers (`false` skips
    /// them, so the data survives).
    pub node_faults: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            node_clocks: true,
            node_clock_error_ms: 0,
            node_faults: true,
        }
    }
}

/// How a replay ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every step agreed with real Redis.
    Reproduced,
    /// Real Redis disagreed with the model at this step.
    Diverged {
        /// Index of the step (0 is the first action).
        step: usize,
        /// The model's account of the action.
        action: String,
        /// What differed: the model's side, then Redis'.
        what: String,
    },
}

/// The result of one replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Actions in the trace.
    pub steps: usize,
    /// Requests sent to real Redis.
    pub requests: usize,
    /// Keyspace comparisons made.
    pub comparisons: usize,
    /// Container faults carried out (kills, starts, syncs, promotions).
    pub node_faults: usize,
    /// Replica syncs by real replication (the model's "replica catches up").
    pub replications: usize,
    /// One line per step taken: the model's account of the action and, for
    /// a request, Redis' answer beside the model's.
    pub log: Vec<String>,
    /// How it ended.
    pub verdict: Verdict,
}

impl Replay {
    /// One line: the verdict, then the counts and `seconds`.
    pub fn line(&self, seconds: f64) -> String {
        format!(
            "{} ({} steps, {} requests, {} key comparisons, {} container faults; {seconds:.1} s)",
            self.verdict, self.steps, self.requests, self.comparisons, self.node_faults
        )
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Reproduced => f.write_str("reproduced"),
            Verdict::Diverged { step, action, what } => {
                write!(f, "diverged at step {step} ({action}): {what}")
            }
        }
    }
}

/// One violated cell of the matrix and its shortest counterexample.
#[derive(Clone, Debug)]
pub struct Case {
    /// The protocol.
    pub protocol: ProtocolId,
    /// The fault class.
    pub fault: Fault,
    /// The violated property.
    pub property: PropertyId,
    /// The model that produced the trace.
    pub model: LockModel,
    /// The shortest counterexample, as the docs show it.
    pub trace: Trace,
}

/// The violated cells of one (protocol, fault) run with their shortest
/// counterexamples (the same run and search the docs use), in property
/// order; the run is read from `cache` when it holds it.
pub fn cases(
    protocol: ProtocolId,
    fault: Fault,
    cache: Option<&Cache>,
) -> Result<Vec<Case>, ChaosError> {
    let result = lockwright_model::docs::compute_cell(protocol, fault, cache)?;
    Ok(split(protocol, fault, result)?.0)
}

/// What a whole-matrix replay runs: the shortest counterexample of every
/// violated cell, and the (protocol, fault) runs with a property that holds.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Every violated cell, in (protocol, fault, property) order.
    pub violated: Vec<Case>,
    /// Every run with at least one property that holds, with its model
    /// and the properties that hold (a (protocol, fault) whose properties
    /// are checked in two runs, [`matrix::standard_groups`], may give two).
    pub holds: Vec<(LockModel, Vec<PropertyId>)>,
}

/// The plan for the whole matrix, computed on `threads` worker threads by
/// the runs the docs use ([`lockwright_model::docs::compute`]), each read
/// from `cache` when it holds it and stored there when computed.
pub fn plan(threads: usize, cache: Option<&Cache>) -> Result<Plan, ChaosError> {
    let computed = lockwright_model::docs::compute(threads, cache)?;
    let mut plan = Plan {
        violated: Vec::new(),
        holds: Vec::new(),
    };
    for ((protocol, fault), result) in computed.results {
        let (cases, holding) = split(protocol, fault, result)?;
        plan.violated.extend(cases);
        plan.holds.extend(holding);
    }
    Ok(plan)
}

/// A run's model and the properties that hold in it.
type Holding = (LockModel, Vec<PropertyId>);

/// One (protocol, fault)'s checker result as replay cases (one per
/// violated property, each with the model of the run that decided it), and
/// the properties that hold with the model of their run.
fn split(
    protocol: ProtocolId,
    fault: Fault,
    result: CellResult,
) -> Result<(Vec<Case>, Vec<Holding>), ChaosError> {
    let model_of = |property| {
        matrix::cell_model(protocol, fault, property)
            .map_err(lockwright_model::docs::DocsError::from)
    };
    let mut holding = Vec::new();
    for group in matrix::standard_groups(protocol) {
        let held: Vec<PropertyId> = result
            .cells
            .iter()
            .filter(|c| c.verdict == CheckVerdict::Holds && group.contains(&c.property))
            .map(|c| c.property)
            .collect();
        if let Some(&first) = held.first() {
            holding.push((model_of(first)?, held));
        }
    }
    let mut cases = Vec::new();
    for (property, trace) in result.traces {
        cases.push(Case {
            protocol,
            fault,
            property,
            model: model_of(property)?,
            trace,
        });
    }
    Ok((cases, holding))
}

/// A seeded random path of `model`: from the initial state, each step one
/// of the enabled actions (faults included) drawn at random, until none is
/// enabled or `max_steps` were taken. A drawn tick is drawn again once, so
/// that letting time pass weighs `1/(n+1)` of any other action (`n` actions
/// enabled) and paths do not race to the horizon. The same seed gives the
/// same path.
pub fn random_path(model: &LockModel, seed: u64, max_steps: usize) -> Trace {
    let mut rng = SplitMix64(seed);
    let mut state = model.initial();
    let mut trace = Trace::new();
    let mut actions = Vec::new();
    for _ in 0..max_steps {
        actions.clear();
        model.enabled(&state, &mut actions);
        if actions.is_empty() {
            break;
        }
        let last = actions.len() as u64 - 1;
        let mut pick = rng.range((0, last)) as usize;
        if matches!(actions[pick], Action::Tick(_)) {
            pick = rng.range((0, last)) as usize;
        }
        let action = actions.swap_remove(pick);
        let Some(next) = model.step(&state, &action) else {
            break;
        };
        trace.push((state, Some(action)));
        state = next;
    }
    trace.push((state, None));
    trace
}

/// Random paths replayed per (protocol, fault) run with a property that
/// holds, in a suite run.
pub const PATHS_PER_RUN: u64 = 2;
/// Steps per random path at most.
pub const PATH_STEPS: usize = 80;
/// Benches (sets of containers) a whole suite run replays on side by side
/// ([`Suite::run`]).
pub const SUITE_BENCHES: usize = 2;

/// One violated cell's replay in a suite run.
#[derive(Clone, Debug)]
pub struct CellReplay {
    /// The protocol.
    pub protocol: ProtocolId,
    /// The fault class.
    pub fault: Fault,
    /// The violated property.
    pub property: PropertyId,
    /// What happened.
    pub replay: Replay,
    /// Wall-clock seconds it took.
    pub seconds: f64,
}

/// One random path's replay in a suite run.
#[derive(Clone, Debug)]
pub struct PathReplay {
    /// The protocol.
    pub protocol: ProtocolId,
    /// The fault class.
    pub fault: Fault,
    /// The properties that hold in this run.
    pub holds: Vec<PropertyId>,
    /// The path's seed.
    pub seed: u64,
    /// What happened.
    pub replay: Replay,
    /// Wall-clock seconds it took.
    pub seconds: f64,
}

/// Everything one suite run replayed, in order.
#[derive(Clone, Debug, Default)]
pub struct Suite {
    /// The violated cells' counterexamples.
    pub cells: Vec<CellReplay>,
    /// The random paths of the runs that hold.
    pub paths: Vec<PathReplay>,
}

/// One replay of a suite run, in the order the suite reports them.
enum Job<'a> {
    Cell(&'a Case),
    Path(&'a LockModel, &'a [PropertyId], u64),
}

/// What one job gave.
enum Done {
    Cell(CellReplay),
    Path(PathReplay),
}

/// What the benches of one [`Suite::run`] share: the jobs, the next one
/// to take, the results by job, the progress callback.
struct Shared<'a, P> {
    jobs: Vec<Job<'a>>,
    cells: usize,
    next: Cell<usize>,
    cells_done: Cell<usize>,
    paths_done: Cell<usize>,
    /// The first harness error, in time.
    failed: RefCell<Option<ChaosError>>,
    results: RefCell<Vec<Option<Done>>>,
    progress: RefCell<P>,
}

impl<P: FnMut(&str)> Shared<'_, P> {
    /// One bench's loop: take the next job until none is left or another
    /// bench failed.
    async fn work(&self, bench: &mut Bench) {
        loop {
            let i = self.next.get();
            let Some(job) = self.jobs.get(i) else {
                return;
            };
            if self.failed.borrow().is_some() {
                return;
            }
            self.next.set(i + 1);
            match self.replay(bench, job).await {
                Ok(done) => self.results.borrow_mut()[i] = Some(done),
                Err(e) => {
                    self.failed.borrow_mut().get_or_insert(e);
                    return;
                }
            }
        }
    }

    async fn replay(&self, bench: &mut Bench, job: &Job<'_>) -> Result<Done, ChaosError> {
        Ok(match *job {
            Job::Cell(case) => {
                let what = format!("{} × {} × {}", case.protocol, case.fault, case.property);
                let (replay, seconds) = timed(bench, &case.model, &case.trace, &what).await?;
                self.cells_done.set(self.cells_done.get() + 1);
                self.report(format!(
                    "[{}/{}] {what}: {}",
                    self.cells_done.get(),
                    self.cells,
                    replay.line(seconds)
                ));
                Done::Cell(CellReplay {
                    protocol: case.protocol,
                    fault: case.fault,
                    property: case.property,
                    replay,
                    seconds,
                })
            }
            Job::Path(model, holds, seed) => {
                let what = format!("{} × {} seed {seed}", model.cfg.protocol, model.cfg.fault);
                let trace = random_path(model, seed, PATH_STEPS);
                let (replay, seconds) = timed(bench, model, &trace, &what).await?;
                self.paths_done.set(self.paths_done.get() + 1);
                self.report(format!(
                    "[path {}] {what}: {}",
                    self.paths_done.get(),
                    replay.line(seconds).replacen("reproduced", "agreed", 1)
                ));
                Done::Path(PathReplay {
                    protocol: model.cfg.protocol,
                    fault: model.cfg.fault,
                    holds: holds.to_vec(),
                    seed,
                    replay,
                    seconds,
                })
            }
        })
    }

    fn report(&self, line: String) {
        (self.progress.borrow_mut())(&line);
    }
}

/// Replays `trace` of `model` on `bench`: the replay and the seconds it
/// took; a harness error names `what` was replayed.
async fn timed(
    bench: &mut Bench,
    model: &LockModel,
    trace: &Trace,
    what: &str,
) -> Result<(Replay, f64), ChaosError> {
    let started = std::time::Instant::now();
    let replay = bench
        .replay(model, trace, ReplayOptions::default())
        .await
        .map_err(|e| ChaosError::Harness(format!("{what}: {e}")))?;
    Ok((replay, started.elapsed().as_secs_f64()))
}

impl Suite {
    /// Replays the shortest counterexample of every violated cell of
    /// `plan` and [`PATHS_PER_RUN`] random paths of every run with a
    /// property that holds, calling `progress` with one line per replay.
    ///
    /// Each bench of `benches` (its own containers) takes the next replay
    /// when it finishes one, so with two benches two replays run side by
    /// side: most of a replay's time is spent waiting on Docker and Redis,
    /// and each replay has its containers to itself, as with one bench.
    /// The suite lists the replays in plan order whatever the order they
    /// finished in. The first harness error (in time) stops the benches
    /// from taking more replays and is returned once the replays under way
    /// end; an empty `benches` is an error too.
    pub async fn run(
        benches: &mut [Bench],
        plan: &Plan,
        progress: impl FnMut(&str),
    ) -> Result<Suite, ChaosError> {
        let mut jobs: Vec<Job<'_>> = plan.violated.iter().map(Job::Cell).collect();
        for (model, holds) in &plan.holds {
            jobs.extend((0..PATHS_PER_RUN).map(|seed| Job::Path(model, holds, seed)));
        }
        let shared = Shared {
            jobs,
            cells: plan.violated.len(),
            next: Cell::new(0),
            cells_done: Cell::new(0),
            paths_done: Cell::new(0),
            failed: RefCell::new(None),
            results: RefCell::new(Vec::new()),
            progress: RefCell::new(progress),
        };
        shared
            .results
            .borrow_mut()
            .extend(shared.jobs.iter().map(|_| None));
        if benches.is_empty() {
            return Err(ChaosError::Harness(
                "a suite run needs at least one bench".into(),
            ));
        }
        let workers = benches.iter_mut().map(|bench| shared.work(bench));
        futures_util::future::join_all(workers).await;
        if let Some(e) = shared.failed.into_inner() {
            return Err(e);
        }
        let mut suite = Suite::default();
        for done in shared.results.into_inner() {
            match done {
                Some(Done::Cell(c)) => suite.cells.push(c),
                Some(Done::Path(p)) => suite.paths.push(p),
                None => {
                    return Err(ChaosError::Harness(
                        "a replay of the suite did not run".into(),
                    ))
                }
            }
        }
        Ok(suite)
    }

    /// Violated cells reproduced.
    pub fn reproduced(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| c.replay.verdict == Verdict::Reproduced)
            .count()
    }

    /// Every replay that disagreed with the model, one line each.
    pub fn mismatches(&self) -> Vec<String> {
        let cells = self.cells.iter().filter_map(|c| match &c.replay.verdict {
            Verdict::Reproduced => None,
            v => Some(format!(
                "{} × {} × {}: {v}",
                c.protocol, c.fault, c.property
            )),
        });
        let paths = self.paths.iter().filter_map(|p| match &p.replay.verdict {
            Verdict::Reproduced => None,
            v => Some(format!("{} × {} seed {}: {v}", p.protocol, p.fault, p.seed)),
        });
        cells.chain(paths).collect()
    }

    /// `replay: R of V violated cells reproduced, H holds paths replayed, M mismatches`.
    pub fn summary(&self) -> String {
        format!(
            "replay: {} of {} violated cells reproduced, {} holds paths replayed, {} mismatches",
            self.reproduced(),
            self.cells.len(),
            self.paths.len(),
            self.mismatches().len()
        )
    }

    /// The Markdown page `docs/replay.md`: what is replayed and how, the
    /// summary, one row per violated cell and one per random path.
    pub fn markdown(&self) -> String {
        let verdict = |v: &Verdict, ok: &str| match v {
            Verdict::Reproduced => ok.to_owned(),
            other => other.to_string().replace('|', "\\|"),
        };
        let mut cells = String::new();
        for c in &self.cells {
            let _ = writeln!(
                cells,
                "| {} | {} | {} | {} | {} | {} | {:.1} |",
                c.protocol,
                c.fault,
                c.property,
                verdict(&c.replay.verdict, "reproduced"),
                c.replay.steps,
                c.replay.requests,
                c.seconds
            );
        }
        let mut paths = String::new();
        for p in &self.paths {
            let holds = p
                .holds
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                paths,
                "| {} | {} | {holds} | {} | {} | {} | {} | {} |",
                p.protocol,
                p.fault,
                p.seed,
                verdict(&p.replay.verdict, "agreed"),
                p.replay.steps,
                p.replay.requests,
                p.replay.node_faults
            );
        }
        let synced = |fault_replays: Vec<&Replay>| {
            let with = fault_replays.iter().filter(|r| r.replications > 0).count();
            (with, fault_replays.len())
        };
        let (cells_synced, cells_failover) = synced(
            self.cells
                .iter()
                .filter(|c| c.fault.has_replica())
                .map(|c| &c.replay)
                .collect(),
        );
        let (paths_synced, paths_failover) = synced(
            self.paths
                .iter()
                .filter(|p| p.fault.has_replica())
                .map(|p| &p.replay)
                .collect(),
        );
        format!(
            "{PAGE_HEAD}\n\
Failover coverage: {cells_synced} of the {cells_failover} failover counterexamples and \
{paths_synced} of the {paths_failover} failover paths sync the replica by replication before \
the promotion; the others promote a replica that never synced, which on the server is an \
empty node taking the master's place.\n\n**{}.**\n\n## Violated cells\n\n\
| protocol | fault | property | on real Redis | steps | requests | seconds |\n\
|---|---|---|---|---|---|---|\n\
{cells}\n\
## Random paths of the runs that hold\n\n\
For every (protocol, fault) run with a property that holds, {PATHS_PER_RUN} seeded random paths \
of the model (each step one of the enabled actions, at most one fault per path as in the \
model, a drawn tick drawn again once so that time passes less often, at most {PATH_STEPS} \
steps) are replayed the same way: the model and Redis must agree at every step.\n\n\
| protocol | fault | holds | seed | Redis and the model | steps | requests | container faults |\n\
|---|---|---|---|---|---|---|---|\n\
{paths}",
            self.summary()
        )
    }
}

/// What `docs/replay.md` says before its tables.
const PAGE_HEAD: &str = "# Replay on real Redis

Generated by `cargo run --release -p lockwright-chaos --bin replay -- --markdown docs/replay.md` \
(Docker and the local image needed; see `.ci/build-redis-image.sh`). The test \
`chaos/tests/replay.rs` runs the same replays in `cargo test` and fails when this table names \
other cells than the matrix violates.

Each row is the model checker's shortest counterexample for one violated cell (the trace on \
the protocol's page), executed action by action on Redis 7 containers: the requests the core \
machines emitted, sent with the adapter's encoding on one connection per (client, node); every \
node's wall clock frozen by libfaketime at the model's node clock; restarts as SIGKILL and start \
of the container (AOF `fsync always` for `restart-persisted`; a killed process keeps the \
kernel's page cache, so the fsync itself is not put to the test); failover as a second \
container that syncs from the master by real replication at the model's \"replica catches up\" \
step and becomes the clients' node at \"promoted\", the old master killed. A step agrees when \
Redis' reply equals the model's and, after it, every key, value and expiry deadline on every \
node that is up equals the model's.

What the harness plays rather than makes real: the network (a partitioned node's requests and \
lost requests are not sent, a lost reply is read and dropped, a message in flight is sent when the \
model delivers it, and a request whose client timed out runs on the retired connection when the \
model runs it), the clients (a paused or crashed client takes no step, a skewed client \
or one whose clock steps back reads the model's clock) and the protected resource (a Redis store of its own running the \
model's rule in one script, fed the model's ghost grant order: it checks that the writes arrive \
as the model says, not the rule itself).
";

/// The containers replays run on, started when first needed and reused
/// (reset between replays). Dropping it removes them.
#[derive(Debug, Default)]
pub struct Bench {
    plain: Option<Containers>,
    aof: Option<Containers>,
    /// The protected resource: a Redis of its own, never faulted.
    store: Option<Cluster>,
}

/// One set of containers with the same options.
#[derive(Debug)]
struct Containers {
    cluster: Cluster,
    /// Killed and not started again.
    down: Vec<bool>,
    /// The clock reading last written, per container.
    clock: Vec<Option<u64>>,
}

/// Containers in the plain set: three nodes (RedLock) and a replica.
const PLAIN: usize = 4;
/// Containers in the AOF set: three nodes.
const AOF: usize = 3;
/// Index of the replica container in the plain set.
const REPLICA: usize = 3;

impl Bench {
    /// An empty bench; containers start on the first replay that needs them.
    pub fn new() -> Self {
        Self::default()
    }

    async fn containers(
        &mut self,
        persistence: Persistence,
    ) -> Result<&mut Containers, ChaosError> {
        let (slot, count) = match persistence {
            Persistence::None => (&mut self.plain, PLAIN),
            Persistence::AofFsyncAlways => (&mut self.aof, AOF),
        };
        if slot.is_none() {
            let options = NodeOptions {
                frozen_clock: true,
                ..NodeOptions::with_persistence(persistence)
            };
            let cluster = Cluster::start(count, &options).await?;
            *slot = Some(Containers {
                cluster,
                down: vec![false; count],
                clock: vec![None; count],
            });
        }
        slot.as_mut()
            .ok_or_else(|| ChaosError::UnexpectedReply("containers just started".into()))
    }

    async fn store(&mut self) -> Result<MultiplexedConnection, ChaosError> {
        if self.store.is_none() {
            self.store = Some(Cluster::start(1, &NodeOptions::default()).await?);
        }
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| ChaosError::UnexpectedReply("store just started".into()))?;
        let mut conn = store.node(0).connect_with_timeout(REQUEST_TIMEOUT).await?;
        let _: () = redis::cmd("DEL")
            .arg(RESOURCE_KEY)
            .query_async(&mut conn)
            .await?;
        Ok(conn)
    }

    /// Replays `trace`, which `model` produced, on real Redis.
    ///
    /// `Err` is a harness failure (Docker, a container that does not come
    /// up, a trace the model did not produce); a disagreement between Redis
    /// and the model is `Ok` with [`Verdict::Diverged`].
    pub async fn replay(
        &mut self,
        model: &LockModel,
        trace: &Trace,
        options: ReplayOptions,
    ) -> Result<Replay, ChaosError> {
        let cfg = &model.cfg;
        let persistence = if cfg.fault == Fault::RestartPersisted {
            Persistence::AofFsyncAlways
        } else {
            Persistence::None
        };
        let nodes = usize::from(cfg.nodes);
        let failover = cfg.fault.has_replica();
        let store = self.store().await?;
        let containers = self.containers(persistence).await?;
        if nodes > containers.down.len() - usize::from(failover) {
            return Err(ChaosError::UnexpectedReply(format!(
                "a replay needs {nodes} nodes; the bench has {}",
                containers.down.len()
            )));
        }
        let mut run = Run {
            model,
            options,
            containers,
            slots: (0..nodes).collect(),
            replica: failover.then_some(REPLICA),
            old: None,
            conns: BTreeMap::new(),
            admin: BTreeMap::new(),
            store,
            report: Replay {
                steps: trace.len().saturating_sub(1),
                requests: 0,
                comparisons: 0,
                node_faults: 0,
                replications: 0,
                log: Vec::new(),
                verdict: Verdict::Reproduced,
            },
        };
        run.reset(trace).await?;
        let verdict = run.walk(trace).await?;
        run.report.verdict = verdict;
        Ok(run.report)
    }
}

/// One replay in progress.
struct Run<'a> {
    model: &'a LockModel,
    options: ReplayOptions,
    containers: &'a mut Containers,
    /// The container serving each model node.
    slots: Vec<usize>,
    /// The container standing in for node 0's replica (`failover`).
    replica: Option<usize>,
    /// `split-brain`: the old master's container and the client it still
    /// serves, from the promotion until it learns of it.
    old: Option<(usize, u8)>,
    /// One connection per (client, node) pair, opened when first used.
    conns: BTreeMap<(u8, u8), MultiplexedConnection>,
    /// One connection per container for setup and keyspace reads.
    admin: BTreeMap<usize, MultiplexedConnection>,
    /// The connection to the protected resource's store.
    store: MultiplexedConnection,
    report: Replay,
}

/// A disagreement found at one step: what the model said, what Redis did.
type Mismatch = Option<String>;

impl Run<'_> {
    fn node(&self, container: usize) -> &RedisNode {
        self.containers.cluster.node(container)
    }

    async fn admin(&mut self, container: usize) -> Result<&mut MultiplexedConnection, ChaosError> {
        if !self.admin.contains_key(&container) {
            let conn = self
                .node(container)
                .connect_with_timeout(REQUEST_TIMEOUT)
                .await?;
            self.admin.insert(container, conn);
        }
        self.admin
            .get_mut(&container)
            .ok_or_else(|| ChaosError::UnexpectedReply("admin connection".into()))
    }

    fn set_clock(&mut self, container: usize, ms: u64) -> Result<(), ChaosError> {
        let ms = if self.options.node_clocks {
            ms.saturating_add_signed(self.options.node_clock_error_ms)
        } else {
            0
        };
        if self.containers.clock[container] != Some(ms) {
            self.containers
                .cluster
                .node_mut(container)
                .set_frozen_clock_ms(ms)?;
            self.containers.clock[container] = Some(ms);
        }
        Ok(())
    }

    /// Every node's (and the replica's, and a split brain's old master's)
    /// clock at the model's reading in `state`.
    fn set_clocks(&mut self, state: &State) -> Result<(), ChaosError> {
        for (n, node) in state.nodes.iter().enumerate() {
            let ms = node.now(state.time).get();
            self.set_clock(self.slots[n], ms)?;
            if n == 0 {
                if let Some(replica) = self.replica {
                    self.set_clock(replica, ms)?;
                }
                if let (Some((container, _)), Some(old)) = (self.old, &node.old) {
                    self.set_clock(container, old.now(state.time).get())?;
                }
            }
        }
        Ok(())
    }

    /// The container a request of connection `conn` (a client, or one of
    /// its retired connections) to `node` reaches: the old master of a
    /// split brain for the client it still serves, else the node's slot.
    fn container_of(&self, conn: u8, node: u8) -> usize {
        match self.old {
            Some((container, client)) if node == 0 && conn & 0x07 == client => container,
            _ => self.slots[usize::from(node)],
        }
    }

    async fn start(&mut self, container: usize) -> Result<(), ChaosError> {
        self.node(container).restart().await?;
        self.containers.down[container] = false;
        self.report.node_faults += 1;
        Ok(())
    }

    async fn kill(&mut self, container: usize) -> Result<(), ChaosError> {
        self.node(container).kill().await?;
        self.containers.down[container] = true;
        self.admin.remove(&container);
        self.report.node_faults += 1;
        Ok(())
    }

    /// Every container this replay uses up, empty, detached, at time 0, and
    /// loaded with the keys of the trace's first state.
    async fn reset(&mut self, trace: &Trace) -> Result<(), ChaosError> {
        let first = trace
            .first()
            .map(|(state, _)| state)
            .ok_or_else(|| ChaosError::UnexpectedReply("an empty trace".into()))?;
        let used: Vec<usize> = self.slots.iter().copied().chain(self.replica).collect();
        for &container in &used {
            if self.containers.down[container] {
                self.node(container).restart().await?;
                self.containers.down[container] = false;
            }
            self.set_clock(container, 0)?;
            let conn = self.admin(container).await?;
            let _: () = redis::cmd("REPLICAOF")
                .arg("NO")
                .arg("ONE")
                .query_async(conn)
                .await?;
            let _: () = redis::cmd("FLUSHALL").query_async(conn).await?;
            // A node that synced as a replica (a failover's replica, a split
            // brain's demoted old master) wrote the master's data to its
            // RDB file, which a restart would load: an empty one replaces it.
            // A replica's full sync of the last replay may still have its
            // background save running, which refuses SAVE until it ends.
            let mut tries = 0;
            loop {
                match redis::cmd("SAVE").query_async::<()>(&mut *conn).await {
                    Err(e) if tries < 200 && e.to_string().contains("save already in progress") => {
                        tries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    done => break done?,
                }
            }
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(conn).await?;
        }
        self.set_clocks(first)?;
        for (n, node) in first.nodes.iter().enumerate() {
            let now = node.now(first.time);
            let entries = live(&node.keyspace, now);
            let conn = self.admin(self.slots[n]).await?;
            for (key, entry) in entries {
                load(conn, &key, &entry).await?;
            }
        }
        Ok(())
    }

    /// Walks the trace; `Ok(Diverged)` at the first disagreement.
    async fn walk(&mut self, trace: &Trace) -> Result<Verdict, ChaosError> {
        let first = &trace[0].0;
        for n in 0..first.nodes.len() {
            if let Some(what) = self.compare_node(first, n as u8).await? {
                return Ok(Verdict::Diverged {
                    step: 0,
                    action: "the initial state".into(),
                    what,
                });
            }
        }
        for (i, pair) in trace.windows(2).enumerate() {
            let (state, action) = &pair[0];
            let next = &pair[1].0;
            let Some(action) = action else {
                return Err(ChaosError::UnexpectedReply(format!(
                    "step {i} of the trace has no action"
                )));
            };
            let mut enabled = Vec::new();
            self.model.enabled(state, &mut enabled);
            if !enabled.contains(action) || self.model.step(state, action).as_ref() != Some(next) {
                return Err(ChaosError::UnexpectedReply(format!(
                    "step {i} ({}) does not lead where the trace says: not this model's trace",
                    self.model.describe_action(state, action)
                )));
            }
            self.report.log.push(format!(
                "{i:>4}. {}",
                self.model.describe_action(state, action)
            ));
            if let Some(what) = self.step(state, action, next).await? {
                return Ok(Verdict::Diverged {
                    step: i,
                    action: self.model.describe_action(state, action),
                    what,
                });
            }
        }
        Ok(Verdict::Reproduced)
    }

    async fn step(
        &mut self,
        state: &State,
        action: &Action,
        next: &State,
    ) -> Result<Mismatch, ChaosError> {
        self.set_clocks(state)?;
        self.bring_back(state).await?;
        let touched: Vec<u8> = match *action {
            Action::Deliver { client, node } | Action::RoundTrip { client, node } => {
                let answer = self.deliver(state, client, node).await?;
                if let Err(what) = answer {
                    return Ok(Some(what));
                }
                let lost = state.nodes[usize::from(node)].cut_off(client);
                if matches!(action, Action::RoundTrip { .. })
                    && answer == Ok(Outcome::Unknown)
                    && !lost
                {
                    // Received at once: the adapter retires the connection.
                    self.conns.remove(&(client, node));
                }
                vec![node]
            }
            Action::LoseReply { client, node } => {
                if !self.model.link_of(state, client, node).replies.is_empty() {
                    // A reply already on its way: the harness drops it.
                    Vec::new()
                } else {
                    // The request runs; the harness drops its reply.
                    let answer = self.deliver(state, client, node).await?;
                    if let Err(what) = answer {
                        return Ok(Some(what));
                    }
                    vec![node]
                }
            }
            Action::DeliverOrphan { client, node } => {
                // The request the client gave up on runs on its retired
                // connection; nobody reads the reply, the keys are compared.
                let orphan = self.model.link_of(state, client, node).orphans.front();
                let slot = orphan.map_or(0, |o| o.slot);
                let command = orphan
                    .map(|o| o.sent.request.command.clone())
                    .ok_or_else(|| {
                        ChaosError::UnexpectedReply(format!(
                            "no late request from c{client} to n{node}"
                        ))
                    })?;
                let retired = retired(client, slot);
                let model_node = &state.nodes[usize::from(node)];
                let up = model_node.on_old_master(client) || model_node.up(state.time);
                // As the model: not on a connection it has dead or cut off
                // by a split brain.
                let alive = (model_node.dead | model_node.stale) & (1u8 << client) == 0;
                if !model_node.cut_off(client) && up && alive {
                    // On the retired connection when there was one; a pair
                    // that had none has no session state to keep.
                    self.report.requests += 1;
                    let _ = self.send(retired, node, &command).await;
                }
                self.conns.remove(&(retired, node));
                vec![node]
            }
            Action::Timeout { client, node } => {
                // The adapter retires the connection: a request still on it
                // may run later (on that connection), the next one opens a
                // new one.
                let link = self.model.link_of(state, client, node);
                let orphaned = link.replies.is_empty() && !link.requests.is_empty();
                let slot = self.model.link_of(next, client, node).orphans.back();
                match (self.conns.remove(&(client, node)), slot) {
                    (Some(conn), Some(o)) if orphaned => {
                        self.conns.insert((retired(client, o.slot), node), conn);
                    }
                    _ => {}
                }
                Vec::new()
            }
            Action::Receive { client, node } => {
                let front = self.model.link_of(state, client, node).replies.front();
                if front.is_some_and(|back| back.outcome == Outcome::Unknown) {
                    // The adapter retires a connection whose request got no
                    // reply; the next request opens a new one.
                    self.conns.remove(&(client, node));
                }
                Vec::new()
            }
            Action::Restart(node) => {
                if self.options.node_faults {
                    let container = self.slots[usize::from(node)];
                    self.kill(container).await?;
                    if self.model.cfg.fault != Fault::RestartDelayed {
                        self.start(container).await?;
                    }
                }
                self.lose_connections(node);
                vec![node]
            }
            Action::JumpClock(node) => vec![node],
            Action::Replicate => {
                self.replicate().await?;
                vec![0]
            }
            Action::Promote => {
                self.promote().await?;
                vec![0]
            }
            Action::Split(client) => {
                self.split(client).await?;
                vec![0]
            }
            Action::Demote => {
                self.demote(state.nodes[0].stale).await?;
                Vec::new()
            }
            Action::Write(client) => {
                if let Some(what) = self.write(state, client, next).await? {
                    return Ok(Some(what));
                }
                Vec::new()
            }
            // The network and the clients are the harness: a cut, a heal,
            // a lost request, a held link, a tick, a timer, a check, a pause,
            // a crash or a client's clock step change nothing on the servers.
            Action::Timer(_)
            | Action::Check(_)
            | Action::Tick(_)
            | Action::Crash(_)
            | Action::Pause(_)
            | Action::StepBack(_)
            | Action::Resume(_)
            | Action::Hold { .. }
            | Action::LoseRequest { .. }
            | Action::Cut(_)
            | Action::CutLink { .. }
            | Action::Heal(_) => Vec::new(),
        };
        self.set_clocks(next)?;
        // The node the step touched first, then every other one: a change
        // the model makes to a node it does not send to shows at once.
        let others = (0..next.nodes.len() as u8).filter(|n| !touched.contains(n));
        for node in touched.iter().copied().chain(others) {
            if let Some(what) = self.compare_node(next, node).await? {
                return Ok(Some(what));
            }
        }
        if matches!(action, Action::Replicate) {
            if let Some(what) = self.compare_replica(next).await? {
                return Ok(Some(what));
            }
        }
        if let (Some((container, client)), Some(old)) = (self.old, &next.nodes[0].old) {
            let expected = live(&old.keyspace, old.now(next.time));
            let name = format!("n0's old master (serving c{client})");
            if let Some(what) = self.compare(container, expected, &name).await? {
                return Ok(Some(what));
            }
        }
        Ok(None)
    }

    /// The holder's write, made to the real store by [`RESOURCE_SCRIPT`],
    /// whose state must then equal the model's resource.
    async fn write(
        &mut self,
        state: &State,
        client: u8,
        next: &State,
    ) -> Result<Mismatch, ChaosError> {
        let holder = &state.clients[usize::from(client)];
        let Phase::Checked(lease) = &holder.phase else {
            return Err(ChaosError::UnexpectedReply(format!(
                "c{client} writes without having checked its lease"
            )));
        };
        let fence = lease.fence.map(|f| f.0.to_string()).unwrap_or_default();
        let _: redis::Value = redis::cmd("EVAL")
            .arg(RESOURCE_SCRIPT)
            .arg(1)
            .arg(RESOURCE_KEY)
            .arg(fence)
            .arg(holder.grant)
            .query_async(&mut self.store)
            .await?;
        self.report.requests += 1;
        let real: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(RESOURCE_KEY)
            .query_async(&mut self.store)
            .await?;
        let model = &next.resource;
        let expected = Resource {
            fence: model.highest_fence,
            newest: u64::from(model.newest_grant),
            stale: model.stale_accepted,
        };
        let observed = Resource {
            fence: real.get("fence").and_then(|f| f.parse().ok()),
            newest: real.get("grant").and_then(|g| g.parse().ok()).unwrap_or(0),
            stale: real.get("stale").is_some_and(|s| s == "1"),
        };
        Ok((expected != observed).then(|| {
            format!("the resource: the model has {expected:?}, the store has {observed:?}")
        }))
    }

    /// Starts a `restart-delayed` node's container once the model has the
    /// node up again.
    async fn bring_back(&mut self, state: &State) -> Result<(), ChaosError> {
        for (n, node) in state.nodes.iter().enumerate() {
            let container = self.slots[n];
            let back = node.down_until.is_none_or(|until| state.time >= until);
            if back && self.containers.down[container] {
                self.start(container).await?;
            }
        }
        Ok(())
    }

    /// The node's connections died with it. For the protocols that `WATCH`
    /// (a connection of the hold's own) they are kept: the next request is
    /// written to the dead socket and fails, as in the adapter. The others
    /// share a connection that the adapter replaces before it writes, so
    /// they are dropped and the next request opens a new one.
    fn lose_connections(&mut self, node: u8) {
        if !self.model.cfg.protocol.uses_watch() {
            self.conns.retain(|&(_, n), _| n != node);
        }
    }

    /// Runs the first request on the (client, node) link, as the model's
    /// delivery does, and compares the outcome with the model's.
    async fn deliver(
        &mut self,
        state: &State,
        client: u8,
        node: u8,
    ) -> Result<Result<Outcome, String>, ChaosError> {
        let model = self.model;
        let Some(request) = model
            .link_of(state, client, node)
            .requests
            .front()
            .map(|sent| &sent.request)
        else {
            return Err(ChaosError::UnexpectedReply(format!(
                "no request from c{client} to n{node} to deliver"
            )));
        };
        let expected = model
            .answer(state, client, node)
            .ok_or_else(|| ChaosError::UnexpectedReply("the model gave no answer".into()))?;
        let model_node = &state.nodes[usize::from(node)];
        let container = self.container_of(client, node);
        let on_old = model_node.on_old_master(client);
        let stale = model_node.stale & (1u8 << client) != 0;
        let observed = if model_node.cut_off(client) || stale {
            // The partition is the harness: the request is not sent (a
            // split brain's cut between the old master and the clients on
            // the other side is one).
            Outcome::Unknown
        } else if !on_old && !model_node.up(state.time) && !self.containers.down[container] {
            // The node is still coming up (the millisecond a restart or a
            // promotion takes in the model) on a server that is already
            // up: the harness plays the refusal, and the connection it
            // would have failed on is gone.
            self.conns.remove(&(client, node));
            Outcome::Unknown
        } else {
            self.report.requests += 1;
            self.send(client, node, &request.command).await
        };
        self.report.log.push(format!(
            "        model: {} | Redis: {}",
            outcome_text(&expected),
            outcome_text(&observed)
        ));
        if expected == observed {
            Ok(Ok(observed))
        } else {
            Ok(Err(format!(
                "the model answers {}, Redis answered {}",
                outcome_text(&expected),
                outcome_text(&observed)
            )))
        }
    }

    /// One request on the pair's own connection; any connection failure is
    /// an unknown outcome, as the adapter reports it.
    async fn send(
        &mut self,
        client: u8,
        node: u8,
        command: &lockwright_core::keyspace::Command,
    ) -> Outcome {
        let container = self.container_of(client, node);
        if !self.conns.contains_key(&(client, node)) {
            match self
                .node(container)
                .connect_with_timeout(REQUEST_TIMEOUT)
                .await
            {
                Ok(conn) => {
                    self.conns.insert((client, node), conn);
                }
                Err(_) => return Outcome::Unknown,
            }
        }
        let Some(conn) = self.conns.get_mut(&(client, node)) else {
            return Outcome::Unknown;
        };
        match wire::execute_reply(conn, command).await {
            Ok(reply) => Outcome::Reply(reply),
            Err(_) => {
                self.conns.remove(&(client, node));
                Outcome::Unknown
            }
        }
    }

    /// The replica attaches to node 0's container, syncs, and detaches.
    async fn replicate(&mut self) -> Result<(), ChaosError> {
        let Some(replica) = self.replica else {
            return Err(ChaosError::UnexpectedReply("no replica to sync".into()));
        };
        if !self.options.node_faults {
            return Ok(());
        }
        let master = self.slots[0];
        let cluster = &self.containers.cluster;
        cluster
            .node(replica)
            .replicate_from(cluster.node(master))
            .await?;
        cluster.node(replica).promote().await?;
        self.report.node_faults += 1;
        self.report.replications += 1;
        Ok(())
    }

    /// The replica becomes node 0; the old master is killed.
    async fn promote(&mut self) -> Result<(), ChaosError> {
        let Some(replica) = self.replica.take() else {
            return Err(ChaosError::UnexpectedReply("no replica to promote".into()));
        };
        if !self.options.node_faults {
            return Ok(());
        }
        self.node(replica).promote().await?;
        let old = self.slots[0];
        self.kill(old).await?;
        self.slots[0] = replica;
        self.lose_connections(0);
        Ok(())
    }

    /// `split-brain`: the replica becomes node 0 for every client but
    /// `client`, whose requests still reach the old master, which stays up.
    /// The others' connections still lead to it, across a cut the harness
    /// plays (their requests are not sent) until they time out; the next
    /// ones open on the new master.
    async fn split(&mut self, client: u8) -> Result<(), ChaosError> {
        let Some(replica) = self.replica.take() else {
            return Err(ChaosError::UnexpectedReply("no replica to promote".into()));
        };
        if !self.options.node_faults {
            return Ok(());
        }
        self.node(replica).promote().await?;
        self.report.node_faults += 1;
        self.old = Some((self.slots[0], client));
        self.slots[0] = replica;
        Ok(())
    }

    /// `split-brain`: the old master learns of the promotion as Sentinel
    /// tells it: it becomes a replica of the new master (a real sync that
    /// replaces what was written to it since) and its client connections
    /// are killed (`CLIENT KILL TYPE normal`): its own client's and those
    /// of the clients in `stale` (the model's bits), still led to it.
    /// Where the model keeps a connection of the client's own (the
    /// protocols that `WATCH`), the next request fails on the killed one;
    /// the other connections are dropped and the next request opens on the
    /// new master.
    async fn demote(&mut self, stale: u8) -> Result<(), ChaosError> {
        let Some((container, client)) = self.old.take() else {
            if self.options.node_faults {
                return Err(ChaosError::UnexpectedReply(
                    "no old master to demote".into(),
                ));
            }
            return Ok(());
        };
        let cluster = &self.containers.cluster;
        cluster
            .node(container)
            .replicate_from(cluster.node(self.slots[0]))
            .await?;
        let conn = self.admin(container).await?;
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query_async(conn)
            .await?;
        self.report.node_faults += 1;
        self.report.replications += 1;
        let on_old = stale | 1u8 << client;
        let watch = self.model.cfg.protocol.uses_watch();
        self.conns.retain(|&(conn, node), _| {
            let killed = node == 0 && on_old & (1u8 << (conn & 0x07)) != 0;
            !(killed && (conn & 0x80 != 0 || !watch))
        });
        Ok(())
    }

    async fn compare_node(&mut self, state: &State, node: u8) -> Result<Mismatch, ChaosError> {
        let model_node = &state.nodes[usize::from(node)];
        let container = self.slots[usize::from(node)];
        if self.containers.down[container] {
            return Ok(None);
        }
        let now = model_node.now(state.time);
        let expected = live(&model_node.keyspace, now);
        self.compare(container, expected, &format!("n{node}")).await
    }

    async fn compare_replica(&mut self, state: &State) -> Result<Mismatch, ChaosError> {
        let (Some(container), Some(keyspace)) = (self.replica, &state.nodes[0].replica) else {
            return Ok(None);
        };
        let now = state.nodes[0].now(state.time);
        let expected = live(keyspace, now);
        self.compare(container, expected, "n0's replica").await
    }

    async fn compare(
        &mut self,
        container: usize,
        expected: BTreeMap<String, Entry>,
        name: &str,
    ) -> Result<Mismatch, ChaosError> {
        self.report.comparisons += 1;
        let conn = self.admin(container).await?;
        let observed = read_keyspace(conn).await?;
        Ok((expected != observed).then(|| {
            format!(
                "{name}'s keys: the model has {}, Redis has {}",
                keys_text(&expected),
                keys_text(&observed)
            )
        }))
    }
}

/// The store's key for the protected resource.
const RESOURCE_KEY: &str = "resource";

/// The protected resource's write, in one script: refuse a fence lower than
/// the highest accepted; otherwise record the fence, and note when the
/// writer's grant is older than one already written (a stale write
/// accepted). Grants are the model's ghost order of grants, sent as data.
const RESOURCE_SCRIPT: &str = r"
local fence = ARGV[1]
local highest = redis.call('HGET', KEYS[1], 'fence')
if fence ~= '' and highest and tonumber(fence) < tonumber(highest) then
  return 0
end
if fence ~= '' then redis.call('HSET', KEYS[1], 'fence', fence) end
local grant = tonumber(ARGV[2])
local newest = tonumber(redis.call('HGET', KEYS[1], 'grant') or '0')
if grant < newest then redis.call('HSET', KEYS[1], 'stale', '1') end
if grant > newest then redis.call('HSET', KEYS[1], 'grant', ARGV[2]) end
return 1
";

/// The resource as the model and the store both describe it.
#[derive(Debug, PartialEq, Eq)]
struct Resource {
    fence: Option<u64>,
    newest: u64,
    stale: bool,
}

fn live(keyspace: &lockwright_core::keyspace::Keyspace, now: Millis) -> BTreeMap<String, Entry> {
    keyspace
        .live(now)
        .map(|(k, e)| (k.to_owned(), e.clone()))
        .collect()
}

/// Writes one model entry into Redis.
async fn load(
    conn: &mut MultiplexedConnection,
    key: &str,
    entry: &Entry,
) -> Result<(), ChaosError> {
    let mut cmd = match &entry.value {
        Value::Str(s) => {
            let mut c = redis::cmd("SET");
            c.arg(key).arg(s);
            c
        }
        Value::Hash(h) => {
            let mut c = redis::cmd("HSET");
            c.arg(key);
            for (f, v) in h {
                c.arg(f).arg(v);
            }
            c
        }
        Value::Set(s) => {
            let mut c = redis::cmd("SADD");
            c.arg(key);
            for m in s {
                c.arg(m);
            }
            c
        }
        Value::ZSet(z) => {
            let mut c = redis::cmd("ZADD");
            c.arg(key);
            for (m, score) in z {
                c.arg(*score).arg(m);
            }
            c
        }
    };
    let _: redis::Value = cmd.query_async(conn).await?;
    if let Some(deadline) = entry.expires_at {
        cmd = redis::cmd("PEXPIREAT");
        let _: redis::Value = cmd.arg(key).arg(deadline).query_async(conn).await?;
    }
    Ok(())
}

/// Every live key of a real node with its value and absolute expiry.
async fn read_keyspace(
    conn: &mut MultiplexedConnection,
) -> Result<BTreeMap<String, Entry>, ChaosError> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await?;
    let mut out = BTreeMap::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
        let value = match kind.as_str() {
            "string" => {
                let v: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
                match v {
                    Some(v) => Value::Str(v),
                    None => continue,
                }
            }
            "hash" => {
                let h: BTreeMap<String, String> =
                    redis::cmd("HGETALL").arg(&key).query_async(conn).await?;
                Value::Hash(h)
            }
            "set" => {
                let s: BTreeSet<String> =
                    redis::cmd("SMEMBERS").arg(&key).query_async(conn).await?;
                Value::Set(s)
            }
            "zset" => {
                let z: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(conn)
                    .await?;
                let mut scores = BTreeMap::new();
                for (member, score) in z {
                    if score.fract() != 0.0 {
                        return Err(ChaosError::UnexpectedReply(format!(
                            "{key}: member {member} has the non-integer score {score}"
                        )));
                    }
                    scores.insert(member, score as i64);
                }
                Value::ZSet(scores)
            }
            // Expired (and deleted) between KEYS and TYPE.
            "none" => continue,
            other => {
                return Err(ChaosError::UnexpectedReply(format!(
                    "{key} has type {other}, which no protocol uses"
                )))
            }
        };
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(&key)
            .query_async(conn)
            .await?;
        let expires_at = match at {
            -2 => continue,
            -1 => None,
            ms => Some(ms as u64),
        };
        out.insert(key, Entry { value, expires_at });
    }
    Ok(out)
}

fn outcome_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Reply(r) => lockwright_model::model::reply_text(r),
        Outcome::Unknown => "nothing (unknown outcome)".into(),
    }
}

fn keys_text(keys: &BTreeMap<String, Entry>) -> String {
    if keys.is_empty() {
        return "none".into();
    }
    keys.iter()
        .map(|(k, e)| match e.expires_at {
            Some(at) => format!("{k}={:?} (expires at {at})", e.value),
            None => format!("{k}={:?}", e.value),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
