//! Fault classes and the properties checked under them.

use std::fmt;
use std::str::FromStr;

/// How far a node's clock steps back under [`Fault::ClockBack`], how far
/// a replica's lags under [`Fault::FailoverClockLag`] and how far a client's
/// steps back under [`Fault::ClientStep`], in ms: more than the 1 ms a
/// restart or a promotion takes in the model and than RedLock's drift
/// allowance (`ttl/100 + 2`), a step NTP takes rather than slews, and less
/// than [`NODE_CLOCK_START`](crate::model::NODE_CLOCK_START), so that a node
/// clock never reads below zero.
pub const CLOCK_STEP_BACK: u64 = 500;

/// A fault class: what the environment may do to the protocol, each a
/// budgeted nondeterministic action of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// No fault: only interleavings of clients, nodes and time.
    None,
    /// A client stops for good at any step.
    Crash,
    /// A client takes no step while time advances (a GC pause, a stalled VM).
    Pause,
    /// Client clocks disagree: one clock is half a TTL ahead and runs 1 %
    /// slow (within RedLock's drift allowance of `ttl/100 + 2`).
    ClientSkew,
    /// One client's clock steps back by [`CLOCK_STEP_BACK`] ms, once, at any
    /// instant once it reads that much (an NTP step after the host's clock
    /// ran ahead; a step before that instant is the same as one at it, since
    /// the machine reads its clock only when it acts). The client's machine
    /// reads that clock at every step, as a front end that reads the wall
    /// clock does: a lease it holds looks valid for that much longer, its
    /// timers and timeouts fire that much later, and the stamps it writes
    /// (the recipes that compare clients' clocks) are that much older. The
    /// adapter's own clock is `CLOCK_MONOTONIC` anchored to the wall clock
    /// once per process (`redis/src/clock.rs`): a step of the wall clock
    /// after that does not reach its leases, but it leaves the process
    /// skewed against one started after the step ([`Fault::ClientSkew`]),
    /// and a suspend, which stops `CLOCK_MONOTONIC`, is a
    /// [`Fault::Pause`].
    ClientStep,
    /// One node's clock jumps forward by more than the TTL.
    ClockJump,
    /// A node's clock steps back by [`CLOCK_STEP_BACK`] ms as it restarts
    /// empty (a reboot whose clock comes back behind, until NTP corrects
    /// it): the restart takes less time than the clock lost.
    ClockBack,
    /// A node restarts empty; it is down for 1 ms.
    Restart,
    /// A node restarts empty, but stays down for longer than the TTL first.
    RestartDelayed,
    /// A node restarts with its data (AOF with `fsync always`).
    RestartPersisted,
    /// Node 0 has an asynchronous replica; replication is its own step; the
    /// replica is promoted, dropping what it had not received; the
    /// promotion takes 1 ms.
    Failover,
    /// `failover`, but the replica's clock lags its master's by
    /// [`CLOCK_STEP_BACK`] ms: the promoted node's clock reads less than
    /// the old master's did.
    FailoverClockLag,
    /// Split-brain failover: node 0's replica is promoted, as under
    /// `failover`, while the old master, cut off from the failure detector
    /// but not from one client, still accepts that client's writes until it
    /// learns of the promotion; it then becomes a replica of the new master
    /// (what was written to it since is lost) and drops its clients'
    /// connections, as Sentinel's reconfiguration does.
    SplitBrain,
    /// One request is held up beyond the latency bound, past the TTL: its
    /// client times out, retires the connection, and the request still runs
    /// later, possibly after requests sent on the new connection. One
    /// request or reply may also be lost.
    Delay,
    /// A node is cut off from every client for a while; requests into the
    /// cut are lost (black-holed) and their senders time out.
    Partition,
    /// One client is cut off from one node for a while, while the other
    /// clients still reach it: the client's requests to that node are lost
    /// (black-holed) and it times out, as under [`Fault::Partition`], but
    /// the others go on acquiring and releasing there meanwhile.
    ClientPartition,
}

impl Fault {
    /// The twelve columns of the verdict matrix.
    pub const COLUMNS: [Fault; 12] = [
        Fault::None,
        Fault::Crash,
        Fault::Pause,
        Fault::ClientSkew,
        Fault::ClientStep,
        Fault::ClockJump,
        Fault::ClockBack,
        Fault::Restart,
        Fault::Failover,
        Fault::Delay,
        Fault::Partition,
        Fault::ClientPartition,
    ];

    /// Every fault, the columns first, then the restart and failover
    /// variants. `split-brain` is a variant for its cost: a second master
    /// for the rest of a run makes it the costliest single fault to check,
    /// and a pairs table with it
    /// would not fit a test run (`split-brain+delay` of `set-px-lua` alone
    /// passed 3 GB and two minutes unfinished).
    pub const ALL: [Fault; 16] = [
        Fault::None,
        Fault::Crash,
        Fault::Pause,
        Fault::ClientSkew,
        Fault::ClientStep,
        Fault::ClockJump,
        Fault::ClockBack,
        Fault::Restart,
        Fault::Failover,
        Fault::Delay,
        Fault::Partition,
        Fault::ClientPartition,
        Fault::RestartDelayed,
        Fault::RestartPersisted,
        Fault::FailoverClockLag,
        Fault::SplitBrain,
    ];

    /// Does the fault give node 0 an asynchronous replica to promote?
    pub fn has_replica(self) -> bool {
        matches!(
            self,
            Fault::Failover | Fault::FailoverClockLag | Fault::SplitBrain
        )
    }

    /// Which kind of step the fault takes: faults of one family other than
    /// [`Family::Own`] are variants of the same step and cannot share a run.
    pub fn family(self) -> Family {
        match self {
            Fault::Restart | Fault::RestartDelayed | Fault::RestartPersisted | Fault::ClockBack => {
                Family::Restart
            }
            Fault::Failover | Fault::FailoverClockLag | Fault::SplitBrain => Family::Failover,
            Fault::Partition | Fault::ClientPartition => Family::Partition,
            _ => Family::Own,
        }
    }

    /// The stable id.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Crash => "crash",
            Fault::Pause => "pause",
            Fault::ClientSkew => "client-skew",
            Fault::ClientStep => "client-step",
            Fault::ClockJump => "clock-jump",
            Fault::ClockBack => "clock-back",
            Fault::Restart => "restart",
            Fault::RestartDelayed => "restart-delayed",
            Fault::RestartPersisted => "restart-persisted",
            Fault::Failover => "failover",
            Fault::FailoverClockLag => "failover-clock-lag",
            Fault::SplitBrain => "split-brain",
            Fault::Delay => "delay",
            Fault::Partition => "partition",
            Fault::ClientPartition => "client-partition",
        }
    }
}

/// Faults that are variants of one step ([`Fault::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// A node restarts (`restart`, `restart-delayed`, `restart-persisted`,
    /// `clock-back`).
    Restart,
    /// Node 0's replica is promoted (`failover`, `failover-clock-lag`,
    /// `split-brain`).
    Failover,
    /// A node is cut off (`partition`, `client-partition`): one heal ends
    /// either cut.
    Partition,
    /// A step of its own.
    Own,
}

/// Two fault classes in one run, each acting at most once
/// (`lockwright check --faults a+b`). Written `a+b`; the order does not
/// change the runs, only which fault's budget is bit 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FaultPair(Fault, Fault);

impl FaultPair {
    /// The pair of `a` and `b`: two different faults, neither `none`, not
    /// two variants of one step (two restarts, two failovers).
    pub fn new(a: Fault, b: Fault) -> Result<FaultPair, PairError> {
        if a == Fault::None || b == Fault::None {
            return Err(PairError::WithNone(format!("{a}+{b}")));
        }
        if a == b {
            return Err(PairError::Twice(a));
        }
        if a.family() != Family::Own && a.family() == b.family() {
            return Err(PairError::SameStep(a, b));
        }
        Ok(FaultPair(a, b))
    }

    /// The first fault.
    pub fn first(self) -> Fault {
        self.0
    }

    /// The second fault.
    pub fn second(self) -> Fault {
        self.1
    }

    /// Every pair of two matrix columns ([`Fault::COLUMNS`]), in column
    /// order: the 53 that [`FaultPair::new`] allows.
    pub fn of_columns() -> Vec<FaultPair> {
        let mut out = Vec::new();
        for (i, &a) in Fault::COLUMNS.iter().enumerate() {
            for &b in &Fault::COLUMNS[i + 1..] {
                if let Ok(p) = FaultPair::new(a, b) {
                    out.push(p);
                }
            }
        }
        out
    }
}

impl fmt::Display for FaultPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("{}+{}", self.0, self.1))
    }
}

impl FromStr for FaultPair {
    type Err = PairError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((a, b)) = s.split_once('+') else {
            return Err(PairError::NotAPair(s.to_owned()));
        };
        FaultPair::new(a.parse()?, b.parse()?)
    }
}

/// A text or two faults that are not a [`FaultPair`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// No `+` between two fault names.
    #[error("{0:?} is not a fault pair: write two faults joined by '+', e.g. pause+restart")]
    NotAPair(String),
    /// A name that is not a fault.
    #[error(transparent)]
    Unknown(#[from] UnknownFault),
    /// `none` in a pair.
    #[error("{0}: 'none' cannot be half of a fault pair")]
    WithNone(String),
    /// The same fault twice.
    #[error("{0}+{0}: a pair needs two different faults (each acts once per run)")]
    Twice(Fault),
    /// Two variants of one step.
    #[error(
        "{0}+{1}: both are a variant of the same step (a restart, a failover, or a cut); pick one"
    )]
    SameStep(Fault, Fault),
}

/// A name that is not a fault class.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault {0:?}; known: none, crash, pause, client-skew, client-step, clock-jump, clock-back, restart, restart-delayed, restart-persisted, failover, failover-clock-lag, split-brain, delay, partition, client-partition")]
pub struct UnknownFault(pub String);

/// A safety or liveness property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PropertyId {
    /// At most one holder (`limit` for semaphores) inside its critical
    /// section; a well-behaved client leaves when its own clock says its
    /// validity ran out, unless it is paused.
    MutualExclusion,
    /// The resource accepts writes in grant order: it never accepts a write
    /// from a holder whose hold was superseded by one whose write it already
    /// accepted. With fencing it refuses an older fence; without fencing it
    /// accepts every write, so such a stale write is a violation.
    FencedResource,
    /// No command a client sends (acquire, undo, release, extend, renewal;
    /// judged when it runs, also after its client has moved on) removes or
    /// changes another owner's hold, or sets an expiry on it (even one that
    /// leaves the deadline where it was). Exempt are evictions by the
    /// protocol's own expiry rule (the ZSET semaphores' purge) and the
    /// commands a recipe sends to another's key right after the read its
    /// rule acts on (`setnx-getset`'s `GETSET` takeover after a `GET`,
    /// `setnx-expire`'s repair of a key whose `TTL` read -1 and that has
    /// still none): where they act on a live hold, mutual exclusion breaks.
    OwnerOnly,
    /// A running waiting client does not wait longer than `2·ttl + 2·longest
    /// retry delay (with jitter)` while no live client is inside, no paused
    /// client that has not finished still holds at the servers, and every
    /// node is up and reachable (no deadlock, no leaked permit); a client
    /// cut off alone (`client-partition`) from its node, or from so many
    /// RedLock masters that it cannot reach a majority, is excused until the
    /// cut heals, and its wait counts from then, while the others are
    /// judged throughout. A client
    /// whose acquire gave up (an error reply, or its deadline) still waits:
    /// it wanted the lock and did not get it.
    Progress,
}

impl PropertyId {
    /// Every property.
    pub const ALL: [PropertyId; 4] = [
        PropertyId::MutualExclusion,
        PropertyId::FencedResource,
        PropertyId::OwnerOnly,
        PropertyId::Progress,
    ];

    /// The stable id.
    pub fn as_str(self) -> &'static str {
        match self {
            PropertyId::MutualExclusion => "mutual-exclusion",
            PropertyId::FencedResource => "fenced-resource",
            PropertyId::OwnerOnly => "owner-only",
            PropertyId::Progress => "progress",
        }
    }
}

/// A name that is not a property.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown property {0:?}; known: mutual-exclusion, fenced-resource, owner-only, progress")]
pub struct UnknownProperty(pub String);

/// `Display` as the stable id and `FromStr` from it, for an id enum with
/// `ALL` and `as_str`.
macro_rules! stable_id {
    ($ty:ty, $err:ident) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = $err;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $err(s.to_owned()))
            }
        }
    };
}

stable_id!(Fault, UnknownFault);
stable_id!(PropertyId, UnknownProperty);
