//! A deterministic discrete-event simulator: several client machines against
//! several keyspace nodes, with controllable clocks, latency, loss and faults.
//!
//! # What is simulated
//!
//! **Time.** The simulator keeps a ghost *true time* in milliseconds that no
//! participant can read. Everything that happens is an event scheduled at a
//! true instant; a priority queue keyed by `(true time, sequence number)`
//! always hands out the earliest event next, and events at the same instant
//! run in the order they were scheduled. Nothing runs between events, there
//! is no real clock and no thread, so a run is a pure function of its
//! [`SimConfig`]: the same seed gives the same [`History`], entry for entry.
//!
//! **Clocks.** Every client and every node reads its own clock, a
//! [`ClientClock`], the model's: `reading = offset + true × rate / 1000`, with
//! the rate in parts per thousand ([`ClientClock::with_rate_ppt`]: 1000 runs
//! at true speed, 1010 runs 1 % fast). A node
//! clock can in addition be jumped by [`Strike::NodeClockJump`] (NTP stepping
//! the wall clock); client clocks are monotonic, as the core's contract asks.
//! A machine is always called with its client's reading; a keyspace executes
//! every command at its node's reading, so expiry is judged by the node's
//! clock exactly as in Redis. A client deadline (the machine's
//! [`poll_timeout`](lockwright_core::Protocol::poll_timeout), a hold that ends, a reply
//! timeout) is converted to the first true instant at which that client's
//! clock reaches it.
//!
//! **Network.** Client `i` has one connection to each node, and the node sees
//! it as [`ConnId`]`(i)`. Every message (request or reply) takes a latency
//! drawn uniformly from [`SimConfig::latency_ms`], but a connection is FIFO
//! like TCP: a message never overtakes an earlier one on the same connection
//! and direction. With [`SimConfig::loss_percent`] a request or a reply is
//! lost. The simulator, like a real driver, gives up on a request when the
//! client's clock has run [`SimConfig::reply_timeout_ms`] past its send time
//! and hands the machine [`Outcome::Unknown`]; a reply arriving after that is
//! discarded. A node executes a request the instant it arrives, atomically.
//! The latency, loss and workload draws come from one SplitMix64 generator
//! seeded with [`SimConfig::seed`].
//!
//! **Clients.** Each client runs a [`Machine`] of [`SimConfig::protocol`]
//! with token `c0`, `c1`, … and an application loop, the [`Workload`]:
//! acquire until a deadline, hold for a drawn time or until the lease's
//! `valid_until` (by its own clock), whichever comes first, release, think,
//! again. After every input to a machine the simulator drains its outputs:
//! every request is sent, every event is recorded and answered by the
//! application, and one timer is armed at the new `poll_timeout`.
//!
//! **Faults** are scheduled events ([`Strike`]): a node restart (it loses its
//! data through [`Keyspace::restart`] and drops every request reaching it
//! while down), a node clock jump, a client crash (it is no longer driven;
//! its requests in flight still execute) and a client pause (its events wait
//! until the pause ends while its clock runs on).
//!
//! # What is recorded
//!
//! The [`History`] lists, in true-time order, every application call, every
//! machine event, every request sent, executed, lost or timed out, every fault,
//! and every *trespass*: a command of one client that deleted, overwrote or
//! re-timed a key whose value was another client's token (checked by looking
//! at the node before and after the command; only string values are
//! checked, so hash locks and timestamp-valued locks are out of its reach).
//! Two checkers read it. [`History::max_concurrent_holders`] counts clients
//! *inside* at once, where a client is inside from `Acquired` (or
//! `Extended`) until the earliest of its release call, `Lost`, its crash, or
//! the instant its own clock reaches the lease's `valid_until`: a
//! well-behaved holder leaves when its clock says so, and a lock is safe
//! when no two are ever inside. [`History::successor_deletions`] lists the
//! trespasses that removed someone else's key. A history prints as a trace,
//! one entry per line.
//!
//! ```
//! use lockwright_model::sim::{Sim, SimConfig};
//! use lockwright_core::{Config, ProtocolId};
//!
//! let config = Config { ttl_ms: 100, ..Config::new("orders") };
//! let cfg = SimConfig { seed: 7, clients: 3, ..SimConfig::new(ProtocolId::SetPxLua, config) };
//! let history = Sim::new(cfg).unwrap().run();
//! assert!(history.max_concurrent_holders() <= 1);
//! assert!(history.successor_deletions().is_empty());
//! ```

use crate::inside::Stay;
use crate::model::ClientClock;
use lockwright_core::catalogue::{Machine, ProtocolId};
use lockwright_core::config::{Config, ConfigError};
use lockwright_core::keyspace::{Command, ConnId, Entry, Keyspace, Reply, SetCondition, Value};
use lockwright_core::protocol::{
    Acquire, Event, Lease, NodeId, Outcome, Protocol, Request, RequestId, Token, UsageError,
};
use lockwright_core::rng::SplitMix64;
use lockwright_core::time::Millis;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;

/// A simulated client, by index; it is also the [`ConnId`] its connections
/// carry on every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u32);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("c{}", self.0))
    }
}

/// A fault striking at a scheduled true instant: the simulator's schedule
/// of the model's fault classes ([`crate::Fault`]). `NodeRestart` is a
/// `restart` (`restart-delayed` when down longer than the TTL),
/// `NodeClockJump` forward is a `clock-jump`, `ClientCrash` a `crash`,
/// `ClientPause` a `pause`; unlike the model's, any number may strike in
/// one run, at the times given.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Strike {
    /// The node goes down at `at` losing its data ([`Keyspace::restart`]),
    /// drops every request reaching it for `down_ms`, then comes back.
    NodeRestart {
        /// The node.
        node: NodeId,
        /// When it goes down (true time).
        at: Millis,
        /// How long it stays down.
        down_ms: u64,
    },
    /// The node's clock jumps by `by_ms` (negative: backwards) at `at`.
    NodeClockJump {
        /// The node.
        node: NodeId,
        /// When (true time).
        at: Millis,
        /// The jump, ms.
        by_ms: i64,
    },
    /// The client dies at `at` and is never driven again.
    ClientCrash {
        /// The client.
        client: ClientId,
        /// When (true time).
        at: Millis,
    },
    /// The client stops at `at` for `for_ms` (a GC pause): its timers,
    /// replies and application steps wait until the pause is over, while its
    /// clock runs on.
    ClientPause {
        /// The client.
        client: ClientId,
        /// When (true time).
        at: Millis,
        /// How long.
        for_ms: u64,
    },
}

impl Strike {
    /// The model's fault class of which this strike is one instance, for
    /// locks of `ttl_ms`: `None` for a node clock that jumps back, which
    /// the model takes only with a restart (`clock-back`).
    pub fn class(&self, ttl_ms: u64) -> Option<crate::Fault> {
        use crate::Fault;
        Some(match self {
            Strike::NodeRestart { down_ms, .. } if *down_ms > ttl_ms => Fault::RestartDelayed,
            Strike::NodeRestart { .. } => Fault::Restart,
            Strike::NodeClockJump { by_ms, .. } if *by_ms > 0 => Fault::ClockJump,
            Strike::NodeClockJump { .. } => return None,
            Strike::ClientCrash { .. } => Fault::Crash,
            Strike::ClientPause { .. } => Fault::Pause,
        })
    }
}

/// The application loop every client runs. Ranges are inclusive `(min, max)`
/// in ms of the client's own clock, drawn uniformly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Workload {
    /// When the first acquire starts.
    pub start_ms: (u64, u64),
    /// `Some(t)`: acquire with [`Acquire::Until`] `now + t`; `None`: [`Acquire::Once`].
    pub acquire_timeout_ms: Option<u64>,
    /// How long to hold (cut short by the lease's `valid_until`).
    pub hold_ms: (u64, u64),
    /// The pause between one attempt's end and the next acquire.
    pub think_ms: (u64, u64),
}

impl Default for Workload {
    /// Start within 10 ms, try for up to 1 s, hold 5–50 ms, think 0–20 ms.
    fn default() -> Self {
        Workload {
            start_ms: (0, 10),
            acquire_timeout_ms: Some(1_000),
            hold_ms: (5, 50),
            think_ms: (0, 20),
        }
    }
}

/// Everything a run is built from. Start from [`SimConfig::new`] and
/// override fields with struct update syntax.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SimConfig {
    /// Seeds the network and workload draws and every machine's jitter.
    pub seed: u64,
    /// Number of clients (tokens `c0`, `c1`, …).
    pub clients: u32,
    /// The protocol every client runs.
    pub protocol: ProtocolId,
    /// The machines' configuration; `config.nodes` is the number of nodes.
    /// Each client's machine gets its own jitter seed derived from `seed`.
    pub config: Config,
    /// One-way latency of every message, inclusive `(min, max)` ms.
    pub latency_ms: (u64, u64),
    /// Chance, in percent, that a request or a reply is lost.
    pub loss_percent: u8,
    /// A client gives up on a request when its clock has run this long past
    /// the send time, and hands its machine [`Outcome::Unknown`].
    pub reply_timeout_ms: u64,
    /// Client clocks by index; missing entries are exact clocks from zero.
    pub client_clock: Vec<ClientClock>,
    /// Node clocks by index; missing entries are exact clocks from zero.
    pub node_clock: Vec<ClientClock>,
    /// The application loop.
    pub workload: Workload,
    /// Faults, by true time.
    pub faults: Vec<Strike>,
    /// The run ends at this true instant.
    pub horizon_ms: u64,
}

impl SimConfig {
    /// Two clients, 1–5 ms latency, no loss, 100 ms reply timeout, exact
    /// clocks, the default [`Workload`], no faults, 2 s of true time.
    pub fn new(protocol: ProtocolId, config: Config) -> SimConfig {
        SimConfig {
            seed: 0,
            clients: 2,
            protocol,
            config,
            latency_ms: (1, 5),
            loss_percent: 0,
            reply_timeout_ms: 100,
            client_clock: Vec::new(),
            node_clock: Vec::new(),
            workload: Workload::default(),
            faults: Vec::new(),
            horizon_ms: 2_000,
        }
    }
}

/// A [`SimConfig`] that cannot run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SimError {
    /// The machines' configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No clients.
    #[error("zero clients")]
    ZeroClients,
    /// An inclusive range whose minimum is above its maximum.
    #[error("the {what} range ({min}, {max}) has its minimum above its maximum")]
    BadRange {
        /// Which range.
        what: &'static str,
        /// Its minimum.
        min: u64,
        /// Its maximum.
        max: u64,
    },
    /// A loss chance above 100 %.
    #[error("a loss of {0} % is above 100 %")]
    LossAbove100(u8),
    /// A reply timeout of zero.
    #[error("the reply timeout is zero")]
    ZeroReplyTimeout,
    /// A clock that does not run.
    #[error("a clock rate of zero")]
    ZeroClockRate,
    /// A fault names a node or a client that does not exist.
    #[error("a fault names a missing node or client: {0:?}")]
    FaultTarget(Strike),
}

/// How a trespassing command changed another client's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trespass {
    /// The key is gone.
    Deleted,
    /// The key now holds another value.
    Overwritten,
    /// The key still holds the owner's token with another TTL.
    ExpiryChanged,
}

/// Why a request never reached a node or its reply never reached the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Undelivered {
    /// The network lost the request.
    RequestLost,
    /// The network lost the reply.
    ReplyLost,
    /// The node was down when the request arrived.
    NodeDown,
    /// The request names a node that does not exist.
    NoSuchNode,
    /// The reply came after the client had given up on it.
    LateReply,
}

/// What happened, in a [`HistoryEntry`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum What {
    /// The application called `acquire`.
    AcquireCalled(Acquire),
    /// The application called `release`: from now on it is outside.
    ReleaseCalled,
    /// The machine refused an application call.
    Refused(UsageError),
    /// The machine reported an event.
    Event(Event),
    /// A request left the client.
    Sent {
        /// The node.
        node: NodeId,
        /// The request id.
        request: RequestId,
        /// The command.
        command: Command,
    },
    /// A node executed a request.
    Executed {
        /// The node.
        node: NodeId,
        /// The request id.
        request: RequestId,
        /// The node's clock when it executed.
        node_time: Millis,
        /// The command.
        command: Command,
        /// The reply.
        reply: Reply,
    },
    /// A message went missing (see [`Undelivered`]).
    Dropped {
        /// The request.
        request: RequestId,
        /// Why.
        why: Undelivered,
    },
    /// The client gave up on a request: its machine got [`Outcome::Unknown`].
    TimedOut {
        /// The request.
        request: RequestId,
    },
    /// The last executed command of this client changed another client's key.
    Trespassed {
        /// The node.
        node: NodeId,
        /// The key.
        key: String,
        /// The client whose token the key held.
        owner: ClientId,
        /// What the command did to it.
        change: Trespass,
    },
    /// A node went down.
    NodeDown(NodeId),
    /// A node came back, restarted.
    NodeUp(NodeId),
    /// A node's clock jumped.
    NodeClockJumped {
        /// The node.
        node: NodeId,
        /// By how much, ms.
        by_ms: i64,
    },
    /// The client crashed.
    ClientCrashed,
    /// The client paused until this true instant.
    ClientPaused {
        /// End of the pause, true time.
        until: Millis,
    },
    /// The run stopped early: events kept coming at one instant (a machine
    /// whose deadline does not move forward).
    Stalled,
}

/// One line of a [`History`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HistoryEntry {
    /// True time.
    pub at: Millis,
    /// The client concerned, if any (node faults concern none).
    pub client: Option<ClientId>,
    /// What happened.
    pub what: What,
}

/// A stretch of true time `[from, to)` during which a client was inside its
/// critical section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The client.
    pub client: ClientId,
    /// Start (true time, inclusive).
    pub from: Millis,
    /// End (true time, exclusive).
    pub to: Millis,
}

/// Everything that happened in a run, in true-time order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct History {
    /// The entries.
    pub entries: Vec<HistoryEntry>,
    /// Each client's clock, to turn its readings into true time.
    pub client_clocks: Vec<ClientClock>,
    /// The true instant the run ended.
    pub end: Millis,
}

impl History {
    /// Every stretch during which a client was inside, by the shared rule
    /// ([`crate::inside::Stay`]): from `Acquired` or `Extended` until the
    /// earliest of its release call, `Lost`, its crash, and the instant its
    /// own clock reaches the lease's `valid_until`, or, when a pause covers
    /// that instant, the pause's end (a paused client cannot see its clock).
    /// Stretches of one client that overlap are merged.
    pub fn holds(&self) -> Vec<Hold> {
        let mut pauses: BTreeMap<ClientId, Vec<(u64, u64)>> = BTreeMap::new();
        for entry in &self.entries {
            if let (Some(client), What::ClientPaused { until }) = (entry.client, &entry.what) {
                pauses
                    .entry(client)
                    .or_default()
                    .push((entry.at.0, until.0));
            }
        }
        // Pauses that overlap are one pause.
        for spans in pauses.values_mut() {
            *spans = merged(std::mem::take(spans));
        }
        let stay = |client: ClientId, from: u64, validity_ends: u64, left: Option<u64>| {
            let stuck = pauses.get(&client).and_then(|ps| {
                ps.iter()
                    .copied()
                    .find(|&(start, end)| start <= validity_ends && validity_ends < end)
            });
            let stay = Stay {
                from,
                validity_ends,
                left,
                stuck,
            };
            (from, stay.end())
        };
        let mut per_client: BTreeMap<ClientId, Vec<(u64, u64)>> = BTreeMap::new();
        let mut open: BTreeMap<ClientId, (u64, u64)> = BTreeMap::new();
        for entry in &self.entries {
            let Some(client) = entry.client else { continue };
            let t = entry.at.0;
            let lease: Option<&Lease> = match &entry.what {
                What::Event(Event::Acquired(l) | Event::Extended { lease: l, .. }) => Some(l),
                What::ReleaseCalled
                | What::ClientCrashed
                | What::Event(Event::Lost | Event::Released { .. }) => None,
                _ => continue,
            };
            if let Some((from, validity_ends)) = open.remove(&client) {
                per_client.entry(client).or_default().push(stay(
                    client,
                    from,
                    validity_ends,
                    Some(t),
                ));
            }
            if let Some(lease) = lease {
                let clock = self
                    .client_clocks
                    .get(client.0 as usize)
                    .copied()
                    .unwrap_or_default();
                let validity_ends = clock.true_time_of(lease.valid_until).unwrap_or(u64::MAX);
                open.insert(client, (t, validity_ends));
            }
        }
        for (client, (from, validity_ends)) in open {
            per_client
                .entry(client)
                .or_default()
                .push(stay(client, from, validity_ends, None));
        }
        let mut holds = Vec::new();
        for (client, mut spans) in per_client {
            spans.retain(|(from, to)| from < to);
            holds.extend(merged(spans).into_iter().map(|(from, to)| Hold {
                client,
                from: Millis(from),
                to: Millis(to),
            }));
        }
        holds.sort_by_key(|h| (h.from, h.client));
        holds
    }

    /// The largest number of clients inside at the same instant (see
    /// [`History::holds`]). A lock is safe in this run when it is at most 1.
    pub fn max_concurrent_holders(&self) -> usize {
        // Ends sort before starts at the same instant: stretches are half-open.
        let mut points: Vec<(u64, i8)> = Vec::new();
        for h in self.holds() {
            points.push((h.from.0, 1));
            points.push((h.to.0, -1));
        }
        points.sort_unstable();
        let mut inside = 0usize;
        let mut max = 0usize;
        for (_, step) in points {
            if step > 0 {
                inside += 1;
                max = max.max(inside);
            } else {
                inside = inside.saturating_sub(1);
            }
        }
        max
    }

    /// Every command that deleted or overwrote a key holding another
    /// client's token (only token-valued string keys are checked: a lock
    /// whose value is a timestamp or a hash is not).
    pub fn successor_deletions(&self) -> Vec<&HistoryEntry> {
        self.entries
            .iter()
            .filter(|e| {
                matches!(
                    e.what,
                    What::Trespassed {
                        change: Trespass::Deleted | Trespass::Overwritten,
                        ..
                    }
                )
            })
            .collect()
    }

    /// Every trespass, including re-timing another client's key.
    pub fn trespasses(&self) -> Vec<&HistoryEntry> {
        self.entries
            .iter()
            .filter(|e| matches!(e.what, What::Trespassed { .. }))
            .collect()
    }
}

/// Stretches `[from, to)` sorted, with those that overlap or touch made
/// one.
fn merged(mut spans: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (from, to) in spans {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

impl fmt::Display for HistoryEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>7}  ", self.at.0)?;
        match self.client {
            Some(c) => write!(f, "{c:<4}")?,
            None => write!(f, "    ")?,
        }
        match &self.what {
            What::Sent {
                node,
                request,
                command,
            } => write!(f, "sent #{} to n{}: {command:?}", request.0, node.0),
            What::Executed {
                node,
                request,
                node_time,
                command,
                reply,
            } => write!(
                f,
                "n{} ran #{} at node time {}: {command:?} -> {reply:?}",
                node.0, request.0, node_time.0
            ),
            other => write!(f, "{other:?}"),
        }
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in &self.entries {
            writeln!(f, "{entry}")?;
        }
        Ok(())
    }
}

/// What the simulator does next.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Fault(Strike),
    NodeUp(usize),
    /// A request reaches its node.
    Deliver {
        client: usize,
        node: usize,
        request: Request,
    },
    /// A reply reaches its client.
    Reply {
        client: usize,
        request: RequestId,
        reply: Reply,
    },
    /// The client's reply timeout for `request`.
    GiveUp {
        client: usize,
        request: RequestId,
    },
    /// The machine's timer; stale when the generation moved on.
    Timer {
        client: usize,
        generation: u64,
    },
    /// The application's next step; stale when the generation moved on.
    App {
        client: usize,
        generation: u64,
    },
}

impl Action {
    /// The client whose pause delays this action.
    fn paused_client(&self) -> Option<usize> {
        match self {
            Action::Reply { client, .. }
            | Action::GiveUp { client, .. }
            | Action::Timer { client, .. }
            | Action::App { client, .. } => Some(*client),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Scheduled {
    at: u64,
    seq: u64,
    action: Action,
}

impl Ord for Scheduled {
    // Reversed: `BinaryHeap` is a max-heap and the earliest must come first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The events still to run, earliest first, ties in scheduling order.
#[derive(Clone, Debug, Default)]
struct Agenda {
    heap: BinaryHeap<Scheduled>,
    seq: u64,
}

impl Agenda {
    fn push(&mut self, at: u64, action: Action) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            action,
        });
    }

    fn pop(&mut self) -> Option<Scheduled> {
        self.heap.pop()
    }
}

/// Where the application loop of a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    /// The next step is an acquire.
    Idle,
    Acquiring,
    /// The next step is the release; the hold ends at `hold_end` (client clock)
    /// unless the lease runs out first.
    Holding {
        hold_end: Millis,
    },
    Releasing,
}

#[derive(Clone, Debug)]
struct Client {
    machine: Machine,
    clock: ClientClock,
    alive: bool,
    paused_until: u64,
    timer_generation: u64,
    app_generation: u64,
    app: App,
    /// Requests waiting for a reply, with the node they went to.
    pending: BTreeMap<RequestId, usize>,
}

#[derive(Clone, Debug)]
struct Node {
    keyspace: Keyspace,
    clock: ClientClock,
    jump_ms: i64,
    up: bool,
}

impl Node {
    fn now(&self, true_ms: u64) -> Millis {
        let reading = i128::from(self.clock.at(true_ms).0) + i128::from(self.jump_ms);
        Millis(u64::try_from(reading.max(0)).unwrap_or(u64::MAX))
    }
}

/// Stop after this many events at one instant: a deadline that does not move.
const MAX_EVENTS_AT_ONE_INSTANT: u32 = 100_000;

/// A simulation, ready to [`run`](Sim::run).
#[derive(Clone, Debug)]
pub struct Sim {
    latency_ms: (u64, u64),
    loss_percent: u8,
    reply_timeout_ms: u64,
    workload: Workload,
    horizon_ms: u64,
    now: u64,
    agenda: Agenda,
    rng: SplitMix64,
    tokens: Vec<Token>,
    clients: Vec<Client>,
    nodes: Vec<Node>,
    /// Last arrival on each connection, `[client × nodes + node]`.
    request_fifo: Vec<u64>,
    reply_fifo: Vec<u64>,
    history: Vec<HistoryEntry>,
}

fn check_range(what: &'static str, (min, max): (u64, u64)) -> Result<(), SimError> {
    if min > max {
        return Err(SimError::BadRange { what, min, max });
    }
    Ok(())
}

impl Sim {
    /// Build the clients' machines and the nodes; refuse a configuration that
    /// cannot run.
    pub fn new(cfg: SimConfig) -> Result<Sim, SimError> {
        if cfg.clients == 0 {
            return Err(SimError::ZeroClients);
        }
        check_range("latency", cfg.latency_ms)?;
        check_range("start", cfg.workload.start_ms)?;
        check_range("hold", cfg.workload.hold_ms)?;
        check_range("think", cfg.workload.think_ms)?;
        if cfg.loss_percent > 100 {
            return Err(SimError::LossAbove100(cfg.loss_percent));
        }
        if cfg.reply_timeout_ms == 0 {
            return Err(SimError::ZeroReplyTimeout);
        }
        if cfg
            .client_clock
            .iter()
            .chain(&cfg.node_clock)
            .any(|c| c.num == 0 || c.den == 0)
        {
            return Err(SimError::ZeroClockRate);
        }
        cfg.config.validate()?;
        let node_count = usize::from(cfg.config.nodes);
        let client_count = cfg.clients as usize;
        for fault in &cfg.faults {
            let ok = match fault {
                Strike::NodeRestart { node, .. } | Strike::NodeClockJump { node, .. } => {
                    usize::from(node.0) < node_count
                }
                Strike::ClientCrash { client, .. } | Strike::ClientPause { client, .. } => {
                    (client.0 as usize) < client_count
                }
            };
            if !ok {
                return Err(SimError::FaultTarget(fault.clone()));
            }
        }

        let mut seeds = SplitMix64(cfg.seed ^ cfg.config.seed);
        let mut tokens = Vec::with_capacity(client_count);
        let mut clients = Vec::with_capacity(client_count);
        for i in 0..client_count {
            let token = Token::new(format!("c{i}"));
            let config = Config {
                seed: seeds.next_u64(),
                ..cfg.config.clone()
            };
            let machine = Machine::new(cfg.protocol, &config, token.clone())?;
            tokens.push(token);
            clients.push(Client {
                machine,
                clock: cfg.client_clock.get(i).copied().unwrap_or_default(),
                alive: true,
                paused_until: 0,
                timer_generation: 0,
                app_generation: 0,
                app: App::Idle,
                pending: BTreeMap::new(),
            });
        }
        let nodes = (0..node_count)
            .map(|i| Node {
                keyspace: Keyspace::new(),
                clock: cfg.node_clock.get(i).copied().unwrap_or_default(),
                jump_ms: 0,
                up: true,
            })
            .collect();

        let mut sim = Sim {
            latency_ms: cfg.latency_ms,
            loss_percent: cfg.loss_percent,
            reply_timeout_ms: cfg.reply_timeout_ms,
            workload: cfg.workload,
            horizon_ms: cfg.horizon_ms,
            now: 0,
            agenda: Agenda::default(),
            rng: SplitMix64(cfg.seed),
            tokens,
            clients,
            nodes,
            request_fifo: vec![0; client_count * node_count],
            reply_fifo: vec![0; client_count * node_count],
            history: Vec::new(),
        };
        for fault in cfg.faults {
            let at = match &fault {
                Strike::NodeRestart { at, .. }
                | Strike::NodeClockJump { at, .. }
                | Strike::ClientCrash { at, .. }
                | Strike::ClientPause { at, .. } => at.0,
            };
            sim.agenda.push(at, Action::Fault(fault));
        }
        for client in 0..client_count {
            let start = sim.rng.range(sim.workload.start_ms);
            sim.schedule_app(client, start);
        }
        Ok(sim)
    }

    /// Run until the horizon (or until nothing is left to do) and return the
    /// history.
    pub fn run(mut self) -> History {
        let mut same_instant = 0u32;
        while let Some(next) = self.agenda.pop() {
            if next.at > self.horizon_ms {
                break;
            }
            if next.at == self.now {
                same_instant += 1;
                if same_instant > MAX_EVENTS_AT_ONE_INSTANT {
                    self.record(None, What::Stalled);
                    break;
                }
            } else {
                same_instant = 0;
            }
            self.now = next.at;
            if let Some(c) = next.action.paused_client() {
                if self.clients[c].paused_until > self.now {
                    let until = self.clients[c].paused_until;
                    self.agenda.push(until, next.action);
                    continue;
                }
            }
            self.handle(next.action);
        }
        History {
            entries: self.history,
            client_clocks: self.clients.iter().map(|c| c.clock).collect(),
            end: Millis(self.now.max(self.horizon_ms)),
        }
    }

    fn record(&mut self, client: Option<usize>, what: What) {
        self.history.push(HistoryEntry {
            at: Millis(self.now),
            client: client.map(|c| ClientId(c as u32)),
            what,
        });
    }

    fn client_now(&self, client: usize) -> Millis {
        self.clients[client].clock.at(self.now)
    }

    /// The true instant at which `client`'s clock reads `reading`, not before now.
    fn when_client_reads(&self, client: usize, reading: Millis) -> u64 {
        self.clients[client]
            .clock
            .true_time_of(reading)
            .unwrap_or(u64::MAX)
            .max(self.now)
    }

    /// Schedule the application's next step `after_ms` of the client's clock from now.
    fn schedule_app(&mut self, client: usize, after_ms: u64) {
        let at = self.client_now(client) + after_ms;
        self.schedule_app_at(client, at);
    }

    fn schedule_app_at(&mut self, client: usize, reading: Millis) {
        let c = &mut self.clients[client];
        c.app_generation += 1;
        let generation = c.app_generation;
        let at = self.when_client_reads(client, reading);
        self.agenda.push(at, Action::App { client, generation });
    }

    fn think(&mut self, client: usize) {
        self.clients[client].app = App::Idle;
        let think = self.rng.range(self.workload.think_ms);
        self.schedule_app(client, think);
    }

    fn handle(&mut self, action: Action) {
        match action {
            Action::Fault(fault) => self.fault(fault),
            Action::NodeUp(node) => {
                self.nodes[node].up = true;
                self.record(None, What::NodeUp(NodeId(node as u8)));
            }
            Action::Deliver {
                client,
                node,
                request,
            } => self.deliver(client, node, request),
            Action::Reply {
                client,
                request,
                reply,
            } => {
                if !self.clients[client].alive {
                    return;
                }
                if self.clients[client].pending.remove(&request).is_none() {
                    let why = Undelivered::LateReply;
                    self.record(Some(client), What::Dropped { request, why });
                    return;
                }
                let now = self.client_now(client);
                let outcome = Outcome::Reply(reply);
                self.clients[client]
                    .machine
                    .handle_reply(now, request, outcome);
                self.drain(client);
            }
            Action::GiveUp { client, request } => {
                if !self.clients[client].alive
                    || self.clients[client].pending.remove(&request).is_none()
                {
                    return;
                }
                self.record(Some(client), What::TimedOut { request });
                let now = self.client_now(client);
                self.clients[client]
                    .machine
                    .handle_reply(now, request, Outcome::Unknown);
                self.drain(client);
            }
            Action::Timer { client, generation } => {
                let c = &self.clients[client];
                if !c.alive || c.timer_generation != generation {
                    return;
                }
                let now = self.client_now(client);
                self.clients[client].machine.handle_timeout(now);
                self.drain(client);
            }
            Action::App { client, generation } => {
                let c = &self.clients[client];
                if !c.alive || c.app_generation != generation {
                    return;
                }
                self.app_step(client);
            }
        }
    }

    fn fault(&mut self, fault: Strike) {
        match fault {
            Strike::NodeRestart { node, down_ms, .. } => {
                let index = usize::from(node.0);
                // Without persistence the data dies with the process.
                self.nodes[index].up = false;
                self.nodes[index].keyspace.restart();
                self.record(None, What::NodeDown(node));
                self.agenda
                    .push(self.now.saturating_add(down_ms), Action::NodeUp(index));
            }
            Strike::NodeClockJump { node, by_ms, .. } => {
                let n = &mut self.nodes[usize::from(node.0)];
                n.jump_ms = n.jump_ms.saturating_add(by_ms);
                self.record(None, What::NodeClockJumped { node, by_ms });
            }
            Strike::ClientCrash { client, .. } => {
                let c = client.0 as usize;
                if self.clients[c].alive {
                    self.clients[c].alive = false;
                    self.record(Some(c), What::ClientCrashed);
                }
            }
            Strike::ClientPause { client, for_ms, .. } => {
                let c = client.0 as usize;
                let until = self.now.saturating_add(for_ms);
                let p = &mut self.clients[c].paused_until;
                *p = (*p).max(until);
                // A pause that strikes during a longer one ends with it.
                let until = *p;
                self.record(
                    Some(c),
                    What::ClientPaused {
                        until: Millis(until),
                    },
                );
            }
        }
    }

    /// The application's next step: acquire, or release a hold.
    fn app_step(&mut self, client: usize) {
        let now = self.client_now(client);
        match self.clients[client].app {
            App::Idle => {
                let how = match self.workload.acquire_timeout_ms {
                    Some(t) => Acquire::Until(now + t),
                    None => Acquire::Once,
                };
                match self.clients[client].machine.acquire(now, how) {
                    Ok(()) => {
                        self.clients[client].app = App::Acquiring;
                        self.record(Some(client), What::AcquireCalled(how));
                    }
                    Err(e) => {
                        self.record(Some(client), What::Refused(e));
                        self.think(client);
                    }
                }
            }
            App::Holding { .. } => {
                // Recorded before the call: the events it may emit come after.
                self.record(Some(client), What::ReleaseCalled);
                match self.clients[client].machine.release(now) {
                    Ok(()) => self.clients[client].app = App::Releasing,
                    Err(e) => {
                        self.record(Some(client), What::Refused(e));
                        self.think(client);
                    }
                }
            }
            App::Acquiring | App::Releasing => {}
        }
        self.drain(client);
    }

    /// After every input: send every request, record and answer every event,
    /// re-arm the timer.
    fn drain(&mut self, client: usize) {
        while let Some(request) = self.clients[client].machine.poll_transmit() {
            self.send(client, request);
        }
        while let Some(event) = self.clients[client].machine.poll_event() {
            self.react(client, &event);
            self.record(Some(client), What::Event(event));
        }
        let c = &mut self.clients[client];
        c.timer_generation += 1;
        let generation = c.timer_generation;
        if let Some(deadline) = c.machine.poll_timeout() {
            let at = self.when_client_reads(client, deadline);
            self.agenda.push(at, Action::Timer { client, generation });
        }
    }

    /// The application's answer to a machine event.
    fn react(&mut self, client: usize, event: &Event) {
        let app = self.clients[client].app;
        match (app, event) {
            (_, Event::Acquired(lease)) => {
                let hold = self.rng.range(self.workload.hold_ms);
                let hold_end = self.client_now(client) + hold;
                self.clients[client].app = App::Holding { hold_end };
                self.schedule_app_at(client, hold_end.min(lease.valid_until));
            }
            (App::Holding { hold_end }, Event::Extended { lease, .. }) => {
                self.schedule_app_at(client, hold_end.min(lease.valid_until));
            }
            (App::Acquiring, Event::Denied | Event::Failed(_))
            | (App::Holding { .. }, Event::Lost)
            | (App::Releasing, Event::Released { .. } | Event::Failed(_) | Event::Lost) => {
                self.think(client)
            }
            _ => {}
        }
    }

    fn latency(&mut self) -> u64 {
        self.rng.range(self.latency_ms)
    }

    fn send(&mut self, client: usize, request: Request) {
        let node = usize::from(request.node.0);
        let id = request.id;
        self.record(
            Some(client),
            What::Sent {
                node: request.node,
                request: id,
                command: request.command.clone(),
            },
        );
        self.clients[client].pending.insert(id, node);
        let give_up = self.client_now(client) + self.reply_timeout_ms;
        let at = self.when_client_reads(client, give_up);
        self.agenda.push(
            at,
            Action::GiveUp {
                client,
                request: id,
            },
        );
        if node >= self.nodes.len() {
            let why = Undelivered::NoSuchNode;
            self.record(Some(client), What::Dropped { request: id, why });
            return;
        }
        if self.rng.chance(self.loss_percent) {
            let why = Undelivered::RequestLost;
            self.record(Some(client), What::Dropped { request: id, why });
            return;
        }
        let conn = client * self.nodes.len() + node;
        let arrival = (self.now + self.latency()).max(self.request_fifo[conn]);
        self.request_fifo[conn] = arrival;
        self.agenda.push(
            arrival,
            Action::Deliver {
                client,
                node,
                request,
            },
        );
    }

    fn deliver(&mut self, client: usize, node: usize, request: Request) {
        let id = request.id;
        if !self.nodes[node].up {
            let why = Undelivered::NodeDown;
            self.record(Some(client), What::Dropped { request: id, why });
            return;
        }
        let node_time = self.nodes[node].now(self.now);
        let before = self.foreign_keys(client, node, node_time, &request.command);
        let conn = ConnId(client as u32);
        let reply = self.nodes[node]
            .keyspace
            .execute(conn, node_time, &request.command);
        self.record(
            Some(client),
            What::Executed {
                node: request.node,
                request: id,
                node_time,
                command: request.command,
                reply: reply.clone(),
            },
        );
        for (key, owner, value, expires_at) in before {
            let change = match read_key(&self.nodes[node].keyspace, node_time, &key) {
                None => Some(Trespass::Deleted),
                Some((v, _)) if v != value => Some(Trespass::Overwritten),
                Some((_, t)) if t != expires_at => Some(Trespass::ExpiryChanged),
                _ => None,
            };
            if let Some(change) = change {
                let trespass = What::Trespassed {
                    node: NodeId(node as u8),
                    key,
                    owner: ClientId(owner as u32),
                    change,
                };
                self.record(Some(client), trespass);
            }
        }

        if self.rng.chance(self.loss_percent) {
            let why = Undelivered::ReplyLost;
            self.record(Some(client), What::Dropped { request: id, why });
            return;
        }
        let conn = client * self.nodes.len() + node;
        let arrival = (self.now + self.latency()).max(self.reply_fifo[conn]);
        self.reply_fifo[conn] = arrival;
        self.agenda.push(
            arrival,
            Action::Reply {
                client,
                request: id,
                reply,
            },
        );
    }

    /// The keys `command` may delete, overwrite or re-time that hold another
    /// client's token right now: `(key, owner, value, expiry deadline)`.
    fn foreign_keys(
        &self,
        client: usize,
        node: usize,
        node_time: Millis,
        command: &Command,
    ) -> Vec<(String, usize, String, Option<u64>)> {
        let mut keys = Vec::new();
        written_keys(command, &mut keys);
        if keys.is_empty() {
            return Vec::new();
        }
        keys.sort_unstable();
        keys.dedup();
        let mut found = Vec::new();
        for key in keys {
            let keyspace = &self.nodes[node].keyspace;
            let Some((value, expires_at)) = read_key(keyspace, node_time, key) else {
                continue;
            };
            let owner = self.tokens.iter().position(|t| *t.0 == *value);
            if let Some(owner) = owner.filter(|&o| o != client) {
                found.push((key.to_owned(), owner, value, expires_at));
            }
        }
        found
    }
}

/// The string value and expiry deadline of `key` if it is live at `now`.
fn read_key(keyspace: &Keyspace, now: Millis, key: &str) -> Option<(String, Option<u64>)> {
    match keyspace.get_live(key, now) {
        Some(Entry {
            value: Value::Str(v),
            expires_at,
        }) => Some((v.clone(), *expires_at)),
        _ => None,
    }
}

/// The keys a command can delete, overwrite or re-time. `SET NX` and
/// `SETNX` cannot touch an existing key and are left out.
fn written_keys<'a>(command: &'a Command, keys: &mut Vec<&'a str>) {
    match command {
        Command::Set { key, condition, .. } if *condition != SetCondition::Nx => keys.push(key),
        Command::GetSet { key, .. }
        | Command::Expire { key, .. }
        | Command::PExpire { key, .. } => keys.push(key),
        Command::Del { keys: k } | Command::Eval { keys: k, .. } => {
            keys.extend(k.iter().map(String::as_str))
        }
        Command::Transaction(commands) => {
            for c in commands {
                written_keys(c, keys);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agenda_hands_out_the_earliest_event_first_and_ties_in_order() {
        let mut agenda = Agenda::default();
        let app = |client| Action::App {
            client,
            generation: 0,
        };
        agenda.push(7, app(0));
        agenda.push(5, app(1));
        agenda.push(5, app(2));
        agenda.push(6, app(3));
        let order: Vec<(u64, Action)> =
            std::iter::from_fn(|| agenda.pop().map(|s| (s.at, s.action))).collect();
        assert_eq!(order, [(5, app(1)), (5, app(2)), (6, app(3)), (7, app(0))]);
    }
}
