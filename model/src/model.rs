//! The stateright model: the core's own machines, Redis nodes as core
//! keyspaces, a ghost true time, per-client and per-node clocks, the network
//! and the protected resource, with faults as budgeted nondeterministic
//! actions.
//!
//! # How time works
//!
//! A ghost *true time* advances only by [`Action::Tick`], and only to the
//! next instant at which something can change: a client timer or reply
//! timeout, a key's expiry on some node, a node coming back up, a lease's
//! end. Each client reads its own clock `offset + true·num/den`; each node
//! reads `true + offset` (a clock jump raises the offset), starting at
//! [`NODE_CLOCK_START`]. Without the `pause` fault time cannot pass a
//! running client's obligation (a due timer or reply timeout, the end of its
//! validity, the write it has checked it may do).
//!
//! # The workload
//!
//! Every client runs one round: acquire (retrying until the horizon), hold
//! for any time up to its validity (time stops at its last millisecond, so
//! a holder may use all of it), check its validity, write to the protected
//! resource, release. A holder whose validity has run out when it checks
//! skips the write and releases at once, as a front end's dropped guard
//! does. The check and the write are separate steps, so a
//! pause can fall between them. A retry fires when its machine armed it or
//! at any instant (a model instant, not any millisecond) up to
//! [`ModelConfig::retry_jitter`] later. The adapter's jittered backoff draws
//! each delay from `[exp/2, exp]`, earlier than the longest; the machines
//! here draw the longest (no jitter) and the model shifts a retry later
//! instead: what the jitter changes is where one client's retries fall
//! against another's and against expiries, and a fixed 1 s window later
//! gives such shifts, though not the adapter's exact range
//! ([`Reductions::bounded_late_retries`] opens the window for
//! [`ModelConfig::late_retries`] retries per run).
//! A client whose acquire gives up still wanted the lock: `progress` counts
//! it as waiting (in the model only error replies that repeat make an
//! acquire fail: a missing limit key; a transport error is retried).
//!
//! # The network
//!
//! One link per (client, node) pair, FIFO in each direction as TCP is;
//! links interleave freely. A message is never duplicated. Every request
//! may be in flight while time passes, for up to
//! [`ModelConfig::latency`]; a running client receives the reply when the
//! request runs ([`Reductions::prompt_replies`]), a paused one when it
//! resumes. The driver gives up on a reply after
//! [`ModelConfig::reply_timeout`] by the client's clock, as the adapter
//! does: the machine gets [`Outcome::Unknown`], the connection is retired,
//! and a request not yet run stays on it and may run later, after requests
//! on the new connection (`delay` holds one request that long). A request
//! to a node that is down, or on a connection that died with a restart,
//! fails at once; a request into a partition is lost, and its client times
//! out. A partition cuts a node off from every client (`partition`) or one
//! client off from one node while the others still reach it
//! (`client-partition`): [`NodeState::cut`] keeps a bit per client.
//!
//! # Ghosts
//!
//! The grant order that `fenced-resource` compares is taken where the
//! servers grant: when a client's token comes to hold on a quorum of nodes
//! (one node but for RedLock). Owner-only compares the holds on a node
//! before and after each command of a client, in every phase, and counts an
//! expiry set on another's key; exempt are the evictions of a protocol's
//! own expiry rule and the commands a recipe sends to another's key right
//! after the read its rule acts on, a word each request carries from when
//! it was sent ([`Sent::by_rule`]).

use crate::fault::{Family, Fault, PropertyId, CLOCK_STEP_BACK};
use lockwright_core::keyspace::{Command, ConnId, Entry, Keyspace, Reply, SetCondition, Value};
use lockwright_core::locks::redlock::Redlock;
use lockwright_core::locks::setnx_del::SetnxDel;
use lockwright_core::semaphores::lease_semaphore::LeaseSemaphore;
use lockwright_core::semaphores::watch_semaphore::WatchSemaphore;
use lockwright_core::{
    Acquire, Config, ConfigError, Event, Kind, Lease, Machine, Millis, Outcome, Protocol,
    ProtocolId, Request, RequestId, Token,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

/// Every node's clock reading at true time 0. Not 0: the replay runs real
/// servers on the model's node clocks, and a Redis that loads its data (an
/// AOF after a restart, a replica's first sync) while its clock reads 0
/// fails an assertion. No protocol compares node and client clocks, so
/// where the node clocks start changes no verdict.
pub const NODE_CLOCK_START: u64 = 1_000;

/// The parameters of one check.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelConfig {
    /// The protocol under test.
    pub protocol: ProtocolId,
    /// The fault class the environment may use.
    pub fault: Fault,
    /// A second fault class the environment may use in the same run, each
    /// with its own budget (`lockwright check --faults a+b`); `None` in
    /// every standard run. See [`FaultPair`](crate::fault::FaultPair) for which pairs are allowed.
    pub also: Option<Fault>,
    /// Number of clients (at most 8: a node keeps one bit per client).
    pub clients: u8,
    /// Number of Redis nodes (3 for RedLock, else 1).
    pub nodes: u8,
    /// Lease TTL in model milliseconds.
    pub ttl: u64,
    /// First retry delay.
    pub retry_base: u64,
    /// Largest retry delay.
    pub retry_max: u64,
    /// Retry jitter, ms of the client's clock: a retry the machine armed
    /// for `d` fires at any instant from `d` to `d + retry_jitter`, shifting
    /// clients' retries against each other as the adapter's jittered
    /// backoff does (it draws earlier delays, see the module docs and
    /// [`LockModel::may_defer`]).
    pub retry_jitter: u64,
    /// How many retries per run may fire late, within
    /// [`ModelConfig::retry_jitter`] ([`Reductions::bounded_late_retries`];
    /// unbounded with that reduction off).
    pub late_retries: u8,
    /// True time at which exploration stops.
    pub horizon: u64,
    /// How long a waiter may go without a live holder inside before
    /// `progress` counts as violated; `None` (every standard run): derived
    /// from the bounds, see [`ModelConfig::patience`]. The reductions test
    /// sets it below most of its small horizons, so that `progress` can
    /// fail there and be compared too.
    pub patience: Option<u64>,
    /// The horizon leaves a waiter its whole patience after each fault's
    /// obstruction ([`ModelConfig::obstruction`]): on wherever `progress`
    /// is checked, off in a run of the safety properties alone
    /// ([`ModelConfig::for_properties`]), which keeps the 32 s horizon.
    pub progress_margin: bool,
    /// Latency bound of one message, ms of true time: every request and
    /// every reply may be in flight for up to this long while time passes.
    pub latency: u64,
    /// The driver's reply timeout, ms of the client's clock (the adapter's
    /// `request_timeout`): a request still unanswered this long after it was
    /// sent is an unknown outcome, its connection is retired, and the
    /// request may still run later.
    pub reply_timeout: u64,
    /// How long a restarting node (`restart`, `restart-persisted`,
    /// `clock-back`) or a promotion (`failover*`) keeps the node from
    /// answering, ms of true time. A real one takes far longer; 1 ms is the
    /// least that lets a node clock move on across it.
    pub restart_ms: u64,
    /// Which reductions the checker may use (all on by default; a test turns
    /// each off at small bounds and requires the same verdicts).
    pub reductions: Reductions,
    /// A deliberate bug: the clients run this machine in place of
    /// `protocol`'s (which should be [`Mutation::protocol`]), for the tests
    /// that show a check can fail. `None` in every standard run.
    pub mutation: Option<Mutation>,
    /// Judge the properties only in states where the run's fault has acted
    /// (its budget spent; always, for `none` and `client-skew`, which have
    /// no action): a test's way to show that a violation can still be seen
    /// after the fault strikes, within the horizon. `false` in every
    /// standard run.
    pub after_fault: bool,
}

/// A deliberately broken protocol the model can run in place of the
/// core's, so that a test can show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `lease-semaphore` undoes an acquire whose reply never came with a
    /// release of the owner's token, as it once did
    /// (`LeaseSemaphore::with_undo_of_unanswered_acquires`).
    LeaseSemaphoreUndoesUnanswered,
    /// `redlock` runs every round under the client's one token, also after
    /// an undo round some master did not answer, as it once did
    /// (`Redlock::with_one_token_for_every_round`).
    RedlockRetriesUnderOneToken,
    /// `watch-semaphore` runs every attempt under the client's one token,
    /// also after an undo that got no reply, as it once did
    /// (`WatchSemaphore::with_one_token_for_every_attempt`).
    WatchSemaphoreRetriesUnderOneToken,
    /// `fenced` without its renewal (`auto_renew` off): the lease lasts one
    /// TTL from the grant, as `set-px-lua`'s does. The renewing leases keep
    /// mutual exclusion under `client-step` by their renewal alone, and this
    /// mutant shows the column catches a lease that does not renew.
    FencedWithoutRenewal,
    /// `setnx-del` whose release checks the owner and then deletes another
    /// key (`SetnxDel::with_release_of_another_key`): every hold stays for
    /// ever, so a waiter never gets the lock. Progress holds in four matrix
    /// columns for every protocol; this mutant shows the check fails there
    /// when a waiter is starved (`tests/matrix.rs`).
    SetnxDelReleaseMissesItsKey,
    /// `watch-semaphore` that reads a missing max-size key as its
    /// configured limit (`WatchSemaphore::with_a_default_for_a_missing_size`):
    /// after a restart empties the node it admits new holders beside the
    /// old ones, where the specimen fails every acquire. Mutual exclusion
    /// holds under `restart` for that failure alone (`tests/matrix.rs`).
    WatchSemaphoreDefaultsAMissingSize,
    /// The application leaks its hold: after its write a client leaves
    /// without releasing, while its machine goes on as it would (renewing,
    /// where the protocol renews). A lease frees itself when its TTL runs
    /// out; a renewed lease, or a lock without TTL, never does, and the
    /// waiters starve (Redisson's watchdog renewing the lock of an owner
    /// that forgot to unlock). `tests/matrix.rs` runs it for every protocol.
    LeaksItsHold,
}

impl Mutation {
    /// The protocol this mutates; `None` for a mutation of the client
    /// around any protocol's machine.
    pub fn protocol(self) -> Option<ProtocolId> {
        Some(match self {
            Mutation::LeaseSemaphoreUndoesUnanswered => ProtocolId::LeaseSemaphore,
            Mutation::RedlockRetriesUnderOneToken => ProtocolId::Redlock,
            Mutation::WatchSemaphoreRetriesUnderOneToken => ProtocolId::WatchSemaphore,
            Mutation::FencedWithoutRenewal => ProtocolId::Fenced,
            Mutation::SetnxDelReleaseMissesItsKey => ProtocolId::SetnxDel,
            Mutation::WatchSemaphoreDefaultsAMissingSize => ProtocolId::WatchSemaphore,
            Mutation::LeaksItsHold => return None,
        })
    }
}

/// The reductions of the state space, each a switch so that a test can
/// rerun small bounds without it and compare the verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reductions {
    /// Client-level faults strike client 0 only, but for the second of
    /// `delay`'s two strikes (one message held up, one lost), which may
    /// strike client 0 or client 1, standing for every client not yet
    /// struck: clients are interchangeable until one is struck (see
    /// `LockModel::may_strike` and `LockModel::may_delay_client`).
    pub client_symmetry: bool,
    /// Node faults strike node 0 only; in a run with no node fault and
    /// without [`Reductions::master_symmetry`], `delay`'s first strike hits
    /// a link to node 0 and its second a link to node 0 or node 1, standing
    /// for every node not yet struck: nodes are interchangeable until one
    /// is struck (see `LockModel::may_strike_node` and
    /// `LockModel::may_delay_on`). With master symmetry, `delay` strikes a
    /// link to any master.
    pub node_symmetry: bool,
    /// A message is delivered no later than the next instant at which
    /// something else can change, instead of at any instant up to its own
    /// deadline (see [`LockModel::next_instant`]).
    pub prompt_delivery: bool,
    /// A running client receives its reply in the same step as the node
    /// runs the request: the whole round trip's latency is the request's.
    /// See [`Action::RoundTrip`] for why that keeps the verdicts.
    pub prompt_replies: bool,
    /// The window of [`ModelConfig::retry_jitter`] stays open until
    /// [`ModelConfig::late_retries`] retries per run have fired late; then
    /// retries fire when the machine armed them. (A client whose window was
    /// open when another's late retry closed them all fires at once, so a
    /// run may hold one late retry more; a client paused past its retry
    /// that fires on resuming counts as late too.) Off, any number of
    /// retries may fire late. A late retry lines a rival's attempt up with
    /// an expiry or a release; every later retry shifts with it. The bound
    /// once hid a bug: `lease-semaphore` undid an unanswered acquire by its
    /// token, and a held-up undo removed the permit of a later attempt; at
    /// the standard bounds that took three late retries (one or two found
    /// nothing), and the reductions test found it by turning this bound
    /// off. The protocol no longer sends that undo; the test keeps it as
    /// a mutation that must be caught without the bound.
    pub bounded_late_retries: bool,
    /// RedLock's masters that no fault singles out are interchangeable, so
    /// a state and the same state with such masters renamed are one state
    /// to the checker: the state's fingerprint ([`State`]'s `Hash`) sorts
    /// their parts. A master's part is its node, every client's link to it
    /// and what each client's round keeps for it; nothing else in a RedLock
    /// state names a master by number (requests and timers are named by
    /// request id, and a request's node is left out of its hash: its link
    /// places it). Node 0 keeps its place in a run with a node fault: the
    /// fault strikes node 0 alone (with [`Reductions::node_symmetry`], and
    /// any node without it, or with two node faults), and failover's
    /// replica and split-brain's old master are node 0's. `delay` then
    /// strikes a link to any master instead of to nodes 0 and 1 only
    /// ([`LockModel::may_delay_on`]): renaming covers that restriction.
    /// Every step treats the other masters alike, so renaming them maps a
    /// run to a run and keeps every property's value. The fingerprint also
    /// writes each request id as current (the round's request to that
    /// master) or stale, which merges states that differ in id numbers
    /// alone: a machine matches a reply by id and ignores any other, ids
    /// only grow, and nothing else reads them. The checker explores one
    /// state of each class, the first it meets, and its traces are real
    /// runs.
    pub master_symmetry: bool,
    /// A crashed client never takes a step again, so its fingerprint
    /// ([`State`]'s `Hash`) keeps only what the rest of the run can still
    /// observe of it: that it crashed, whether the servers hold for it
    /// (`at_server`, which `server_grants` compares to count a new grant),
    /// and the requests it left on the wire and on retired connections,
    /// which still run at the nodes (each as its command, deadline, late
    /// flag and rule word; under master symmetry, on the master's link).
    /// Left out: its machine, clock, phase, ghosts of its own, the replies
    /// coming back to it, and its requests' ids and reply timeouts. Every
    /// reader of those requires the client to run (`ClientState::runs`):
    /// receiving, timing out, its timers, checks, writes and faults (a
    /// reply to a crashed client stays on its link unread, `delay` strikes no
    /// crashed client's link, and time waits for no reply or obligation of
    /// it), `inside` and `progress` count it out, and a request id is read
    /// only by a machine matching its reply. Two exceptions write only what
    /// is left out: `execute` reads its phase to set `gave_back`, which
    /// `server_grants` reads to reset its `grant`, and records a `probe`
    /// for its next request; a crashed client's grant and probe are never
    /// read. So two states that differ only there have the same actions,
    /// and their successors again differ only there: the checker explores
    /// one of them, and its traces are real runs. A test holds the
    /// fingerprint to an oracle that blanks those fields in the states a
    /// small run reaches, and the reductions test reruns `crash` and the
    /// crash pairs at small bounds without it.
    pub forget_crashed: bool,
}

impl Reductions {
    /// Every reduction on.
    pub const ALL: Reductions = Reductions {
        client_symmetry: true,
        node_symmetry: true,
        prompt_delivery: true,
        prompt_replies: true,
        bounded_late_retries: true,
        master_symmetry: true,
        forget_crashed: true,
    };
    /// Every reduction off.
    pub const NONE: Reductions = Reductions {
        client_symmetry: false,
        node_symmetry: false,
        prompt_delivery: false,
        prompt_replies: false,
        bounded_late_retries: false,
        master_symmetry: false,
        forget_crashed: false,
    };
}

impl ModelConfig {
    /// The standard bounds for every property of `protocol` under `fault`
    /// ([`ModelConfig::for_properties`] gives those for a group of them):
    /// [`standard_clients`] clients, one
    /// node (three for RedLock), a 10 s TTL (whole seconds, so that the
    /// book's `EXPIRE` in seconds means what it says), retries every 2–4 s,
    /// and a horizon just past the progress patience (32 s), later by the
    /// time the fault keeps every client out ([`ModelConfig::obstruction`];
    /// a second fault's, [`ModelConfig::with_also`]) while
    /// [`ModelConfig::progress_margin`] is on, as it is here.
    ///
    /// Time only stops at instants where something can change, so the scale
    /// costs no states; it keeps RedLock's `ttl/100 + 2 ms` drift allowance
    /// in proportion.
    pub fn new(protocol: ProtocolId, fault: Fault) -> ModelConfig {
        ModelConfig::standard(protocol, fault, true)
    }

    /// The standard bounds, with the horizon moved by `fault`'s obstruction
    /// when `progress_margin` is on.
    fn standard(protocol: ProtocolId, fault: Fault, progress_margin: bool) -> ModelConfig {
        let ttl = 10_000;
        ModelConfig {
            protocol,
            fault,
            also: None,
            clients: standard_clients(protocol),
            nodes: if protocol == ProtocolId::Redlock {
                3
            } else {
                1
            },
            ttl,
            retry_base: 2_000,
            retry_max: 4_000,
            retry_jitter: 1_000,
            late_retries: 1,
            horizon: if progress_margin {
                32_000 + ModelConfig::obstruction(fault, ttl)
            } else {
                32_000
            },
            patience: None,
            progress_margin,
            latency: 400,
            reply_timeout: 1_000,
            restart_ms: 1,
            reductions: Reductions::ALL,
            mutation: None,
            after_fault: false,
        }
    }

    /// The standard bounds for checking `properties` of `protocol` under
    /// `fault`: [`ModelConfig::new`], with [`PROGRESS_CLIENTS`] clients
    /// when progress is the only property, and without the
    /// [`ModelConfig::progress_margin`] when progress is not checked: the
    /// safety properties keep the 32 s horizon (at which they were checked
    /// with the margin too, and gave the same verdicts; the margin only
    /// matters for a waiter's patience).
    pub fn for_properties(
        protocol: ProtocolId,
        fault: Fault,
        properties: &[PropertyId],
    ) -> ModelConfig {
        let progress = properties.contains(&PropertyId::Progress);
        let mut cfg = ModelConfig::standard(protocol, fault, progress);
        if properties == [PropertyId::Progress] {
            cfg.clients = PROGRESS_CLIENTS;
        }
        cfg
    }

    /// The run may use fault class `f`.
    pub fn has(&self, f: Fault) -> bool {
        self.fault == f || self.also == Some(f)
    }

    /// The fault classes of the run: `fault`, then `also`.
    fn faults(&self) -> impl Iterator<Item = Fault> {
        std::iter::once(self.fault).chain(self.also)
    }

    /// The run's fault of `family` (the first, should a config name two).
    fn of_family(&self, family: Family) -> Option<Fault> {
        self.faults().find(|f| f.family() == family)
    }

    /// The budget bit of fault `f` (bit 0: `fault`, bit 1: `also`); 0 when
    /// the run does not have it.
    fn budget_bit(&self, f: Fault) -> u8 {
        if self.fault == f {
            1
        } else if self.also == Some(f) {
            2
        } else {
            0
        }
    }

    /// How long `fault` may keep every client from the lock when it
    /// strikes, as far as the horizon must allow for it: 0 for most faults,
    /// a TTL and a millisecond for the five below. A delayed restart keeps
    /// its node down for the TTL and a millisecond; a pause, a cut (of a node from every client,
    /// or of one client from a quorum) and a message held up beyond the
    /// latency bound last as long as the run lets them, and the margin lets
    /// them outlast a TTL by a millisecond, long enough for every lease
    /// granted before they struck to run out. `progress` counts a waiter's
    /// patience from the end of such an obstruction, so the horizon moves
    /// by as much: with 32 s against a patience of 30 s, a waiter starved
    /// by a restart at 2 s could only be judged after 42 s, and
    /// `restart-delayed` × `progress` read `holds` wherever `restart` ×
    /// `progress` is violated. The faults left out hold a waiter back by
    /// at most a second, within the 2 s between the patience and the
    /// horizon: a restart or a promotion takes 1 ms; a client's clock
    /// stepped back keeps its holder inside 500 ms longer; a node clock
    /// set back keeps keys 500 ms longer; split brain loses requests for
    /// up to the 1 s reply timeout; a crash or a clock jump holds nobody
    /// back at all (what it breaks lasts, and is judged like any
    /// starvation).
    pub fn obstruction(fault: Fault, ttl: u64) -> u64 {
        match fault {
            Fault::RestartDelayed
            | Fault::Pause
            | Fault::Partition
            | Fault::ClientPartition
            | Fault::Delay => ttl + 1,
            _ => 0,
        }
    }

    /// The same bounds with `second` acting too, once
    /// ([`ModelConfig::also`]), the horizon moved by its obstruction when
    /// the [`ModelConfig::progress_margin`] is on.
    pub fn with_also(mut self, second: Fault) -> ModelConfig {
        self.also = Some(second);
        if self.progress_margin {
            self.horizon += ModelConfig::obstruction(second, self.ttl);
        }
        self
    }

    /// The budget bit of the run's fault of `family`.
    fn family_bit(&self, family: Family) -> u8 {
        self.of_family(family).map_or(0, |f| self.budget_bit(f))
    }

    /// How long a waiting client may wait with no live holder inside
    /// before `progress` counts as violated: [`ModelConfig::patience`]'s
    /// field when set, else two TTLs and two of the longest retries (a
    /// lease left by a crashed holder runs out, and a waiter's retry comes,
    /// twice over).
    pub fn patience(&self) -> u64 {
        self.patience
            .unwrap_or(2 * self.ttl + 2 * self.longest_retry())
    }

    /// The longest retry delay with jitter.
    pub fn longest_retry(&self) -> u64 {
        self.retry_max + self.retry_jitter
    }

    /// Client `client`'s machine: the protocol's own, or its
    /// [`ModelConfig::mutation`].
    pub fn machine(&self, client: u8) -> Result<Machine, ConfigError> {
        let (config, token) = (
            self.core_config(client),
            Token::new(LockModel::token(client)),
        );
        match self.mutation {
            None => Machine::new(self.protocol, &config, token),
            Some(Mutation::LeaseSemaphoreUndoesUnanswered) => {
                LeaseSemaphore::with_undo_of_unanswered_acquires(&config, token)
                    .map(Machine::LeaseSemaphore)
            }
            Some(Mutation::RedlockRetriesUnderOneToken) => {
                Redlock::with_one_token_for_every_round(&config, token).map(Machine::Redlock)
            }
            Some(Mutation::WatchSemaphoreRetriesUnderOneToken) => {
                WatchSemaphore::with_one_token_for_every_attempt(&config, token)
                    .map(Machine::WatchSemaphore)
            }
            Some(Mutation::FencedWithoutRenewal) => {
                let config = Config {
                    auto_renew: false,
                    ..config
                };
                Machine::new(ProtocolId::Fenced, &config, token)
            }
            Some(Mutation::SetnxDelReleaseMissesItsKey) => {
                SetnxDel::with_release_of_another_key(&config, token).map(Machine::SetnxDel)
            }
            Some(Mutation::WatchSemaphoreDefaultsAMissingSize) => {
                WatchSemaphore::with_a_default_for_a_missing_size(&config, token)
                    .map(Machine::WatchSemaphore)
            }
            Some(Mutation::LeaksItsHold) => Machine::new(self.protocol, &config, token),
        }
    }

    /// The core configuration every client machine is built from.
    pub fn core_config(&self, client: u8) -> Config {
        Config {
            ttl_ms: self.ttl,
            nodes: self.nodes,
            limit: 1,
            retry_base_ms: self.retry_base,
            retry_max_ms: self.retry_max,
            retry_jitter_percent: 0,
            seed: u64::from(client),
            auto_renew: true,
            ..Config::new("r")
        }
    }
}

/// The number of clients in the standard bounds of `protocol` for its
/// safety properties (mutual exclusion, fenced resource, owner-only):
/// three for the locks whose release compares the owner and deletes in two
/// separate commands (`set-px-get-del`, `setnx-getset`), two for every
/// other protocol. Progress is checked with [`PROGRESS_CLIENTS`].
///
/// Such a release can delete a successor's key (owner-only), and it takes
/// a third client to turn that into a double admission: the first holder's
/// late `DEL` removes the second's key and the third enters while the
/// second is inside. With two clients each running one round, nobody is
/// left to enter, and the model published `holds` for mutual exclusion
/// where real Redis shows a violation (the nemesis found it under `delay`;
/// a third client finds it with latency alone). The other protocols stay
/// at two clients for cost; `tests/clients.rs` reruns each of them with a
/// third client wherever that run fits a cap of states and requires the
/// same verdicts.
pub fn standard_clients(protocol: ProtocolId) -> u8 {
    match protocol {
        ProtocolId::SetPxGetDel | ProtocolId::SetnxGetset => 3,
        _ => 2,
    }
}

/// The number of clients with which progress is checked, for every
/// protocol. A run that checks progress cannot stop early where progress
/// holds: it has to cover the whole space. With three clients, the two
/// protocols of [`standard_clients`] reached 85 million states over
/// thirteen faults (before `client-partition`). The three-client safety run stops once its three
/// properties are found, as they are in nearly every column: the model's
/// own invariants ([`LockModel::sanity`]), which would keep it going to the
/// end of the space, ride on the progress run instead
/// ([`crate::matrix::checks_invariants`]), and the 26 rows of those
/// thirteen faults took 7.3 million states (39 s on 2 cores). Progress stays at two clients. One all-in-one three-client run found
/// progress holding in all 26 rows, as with two clients;
/// `tests/clients.rs` repeats that comparison within its cap.
pub const PROGRESS_CLIENTS: u8 = 2;

/// A clock: `offset + true·num/den`, read in whole milliseconds. The
/// model's clients run on one; so do the simulator's clients and nodes
/// ([`crate::sim`]), where the rate is given in parts per thousand
/// ([`ClientClock::with_rate_ppt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientClock {
    /// Reading at true time 0.
    pub offset: u64,
    /// Rate numerator.
    pub num: u64,
    /// Rate denominator.
    pub den: u64,
    /// How far the clock has stepped back since true time 0
    /// ([`Fault::ClientStep`]): subtracted from every reading. A step
    /// strikes only once the clock reads at least this much, so no reading
    /// falls below zero.
    pub back: u64,
}

impl Default for ClientClock {
    /// [`ClientClock::EXACT`].
    fn default() -> Self {
        ClientClock::EXACT
    }
}

impl ClientClock {
    /// True time, from zero.
    pub const EXACT: ClientClock = ClientClock {
        offset: 0,
        num: 1,
        den: 1,
        back: 0,
    };

    /// The skewed clock of [`Fault::ClientSkew`] for a TTL of `ttl` ms:
    /// half a TTL ahead and 1 % slow, within RedLock's drift allowance
    /// (`ttl/100 + 2` ms) over one TTL. The chaos nemesis sets its skewed
    /// clients' clocks from it.
    pub const fn skewed(ttl: u64) -> ClientClock {
        ClientClock {
            offset: ttl / 2,
            num: 99,
            den: 100,
            back: 0,
        }
    }

    /// A clock reading `offset` at true time zero and running at `ppt`
    /// parts per thousand of true time (1000 exact, 1010 1 % fast).
    pub fn with_rate_ppt(offset: u64, ppt: u64) -> ClientClock {
        ClientClock {
            offset,
            num: ppt,
            den: 1000,
            back: 0,
        }
    }

    /// The reading at true time `t`.
    pub fn at(self, t: u64) -> Millis {
        Millis((self.offset + t * self.num / self.den).saturating_sub(self.back))
    }

    /// The first true time at which the reading is at least `local`
    /// (`None` when that is beyond any horizon).
    pub fn true_time_of(self, local: Millis) -> Option<u64> {
        let l = local.get().checked_add(self.back)?;
        if l <= self.offset {
            return Some(0);
        }
        let d = l - self.offset;
        if d > u64::MAX / (2 * self.den) {
            return None;
        }
        Some((d * self.den).div_ceil(self.num))
    }
}

/// Where a client's single round is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Acquiring (retrying).
    Acquiring,
    /// Holds, has not yet checked its validity for the write.
    Holding(Lease),
    /// Checked that its validity has not run out; the write comes next.
    Checked(Lease),
    /// Wrote (or was refused), or found at its check that its validity had
    /// run out, and is releasing.
    Releasing,
    /// Finished its round (released, denied, lost or failed).
    Done,
}

/// One client: a core machine plus the application around it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientState {
    /// The core machine.
    pub machine: Machine,
    /// Its clock.
    pub clock: ClientClock,
    /// Its round.
    pub phase: Phase,
    /// Paused (takes no step).
    pub paused: bool,
    /// Crashed (takes no step, ever).
    pub crashed: bool,
    /// True time since which it waits to acquire.
    pub waiting_since: Option<u64>,
    /// Grant sequence number of its latest hold, taken when the servers
    /// granted it (ghost).
    pub grant: u32,
    /// Ghost: the servers hold the lock (a quorum of them for RedLock) or a
    /// permit for this client right now.
    pub at_server: bool,
    /// Ghost, within one step: the client's own command took its hold off a
    /// node while it was acquiring.
    pub gave_back: bool,
    /// Ghost: what the client's last command on its current connection to
    /// a node read, when the protocol's rule lets the next command act on
    /// another's key ([`LockModel::by_rule`]).
    pub probe: Option<Probe>,
}

/// A read a protocol acts on by its own rule, on node `node` (ghost, see
/// [`LockModel::by_rule`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Probe {
    /// The node.
    pub node: u8,
    /// The key read.
    pub key: String,
    /// What the read found.
    pub found: Found,
}

/// What a [`Probe`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Found {
    /// `TTL` or `PTTL` -1: a key without expiry, which `setnx-expire`'s
    /// waiter repairs with an `EXPIRE`.
    NoTtl,
    /// `GET` read a value, which `setnx-getset`'s waiter takes over with
    /// `GETSET` when the stamp has expired by its clock.
    Value,
}

impl ClientState {
    /// The digest of everything but what its machine's round keeps per
    /// master (see [`Reductions::master_symmetry`]).
    fn digest_apart_from_masters(&self) -> u64 {
        // Every field, so that a new one cannot be left out unnoticed.
        let ClientState {
            machine,
            clock,
            phase,
            paused,
            crashed,
            waiting_since,
            grant,
            at_server,
            gave_back,
            probe,
        } = self;
        let mut h = digest_hasher();
        match machine {
            Machine::Redlock(m) => m.hash_apart_from_masters(&mut h),
            other => other.hash(&mut h),
        }
        (clock, phase, paused, crashed, waiting_since).hash(&mut h);
        (grant, at_server, gave_back, probe).hash(&mut h);
        h.finish()
    }

    /// The digest of what the rest of a run can still observe of a crashed
    /// client: that it crashed, and whether the servers hold for it (see
    /// [`Reductions::forget_crashed`]).
    fn digest_crashed(&self) -> u64 {
        let mut h = digest_hasher();
        (self.crashed, self.at_server).hash(&mut h);
        h.finish()
    }

    /// Feed `state` what its machine's round keeps for master `n` and its
    /// `link` to that master, each request id as current (the round's
    /// request to `n`) or stale: the machine matches a reply by id and
    /// ignores any other, and nothing else reads an id, so which stale id
    /// a message carries, or which number the current one has, changes
    /// nothing (see [`Reductions::master_symmetry`]).
    fn hash_master<H: std::hash::Hasher>(&self, n: usize, link: &Link, state: &mut H) {
        // A machine without rounds (none renames masters) keeps its ids.
        let current = match &self.machine {
            Machine::Redlock(m) => {
                m.hash_master(n, state);
                Some(m.round_request(n))
            }
            other => {
                other.hash(state);
                None
            }
        };
        let is_current = |id: RequestId| match current {
            Some(current) => (Some(id) == current, 0),
            None => (false, id.0.wrapping_add(1)),
        };
        let hash_sent =
            |sent: &Sent, state: &mut H| sent.hash_with_id(is_current(sent.request.id), state);
        let Link {
            requests,
            replies,
            orphans,
        } = link;
        requests.len().hash(state);
        for sent in requests {
            hash_sent(sent, state);
        }
        replies.len().hash(state);
        for back in replies {
            let Returning {
                id,
                outcome,
                due,
                timeout,
                lost,
            } = back;
            (is_current(*id), outcome, due, timeout, lost).hash(state);
        }
        orphans.len().hash(state);
        for orphan in orphans {
            let Orphan { sent, slot } = orphan;
            hash_sent(sent, state);
            slot.hash(state);
        }
    }

    /// Inside its critical section at true time `t`, by the shared rule
    /// ([`crate::inside`]): it believes it holds (holding or checked, not
    /// crashed) and its clock reads before its validity's end, or it is
    /// stuck. Here stuck is paused: a running holder must act at the
    /// instant its validity ends (it is an obligation, see
    /// [`LockModel::next_instant`]: time cannot pass it before the holder
    /// checks and releases), and a checked holder writes at the instant it
    /// checked, so a paused holder whose clock is past its validity was
    /// paused when the validity ended, or at the instant it learnt of a
    /// lease already over: a grant or an extension whose reply came after
    /// its `valid_until`, with a pause striking before the holder checked.
    /// The rule counts that holder out, this test counts it in until it
    /// resumes: the model's verdicts err on the side of a violation there,
    /// and only a fault pair reaches it (a late reply and a pause at once).
    pub(crate) fn inside(&self, t: u64) -> bool {
        let (holds, within_validity) = match &self.phase {
            Phase::Holding(lease) | Phase::Checked(lease) => {
                (!self.crashed, self.clock.at(t) < lease.valid_until)
            }
            _ => (false, false),
        };
        crate::inside::inside(crate::inside::Holder {
            holds,
            within_validity,
            stuck: self.paused,
        })
    }

    fn runs(&self) -> bool {
        !self.crashed && !self.paused
    }
}

/// One Redis node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeState {
    /// Its data and connections.
    pub keyspace: Keyspace,
    /// Its clock reads true time plus this.
    pub offset: u64,
    /// Down (restarting) until this true time.
    pub down_until: Option<u64>,
    /// The clients cut off from the node, one bit per client: every bit
    /// under `partition`, one under `client-partition`.
    pub cut: u8,
    /// The asynchronous replica (`failover*`, `split-brain`, until the
    /// promotion).
    pub replica: Option<Keyspace>,
    /// `split-brain`: the old master, still serving one client after its
    /// replica was promoted in this slot, until it learns of the promotion.
    pub old: Option<Box<OldMaster>>,
    /// `split-brain`: the other clients, whose connection still leads to
    /// the old master, cut off from them: their requests are lost (black-
    /// holed, as under `partition`) until a timeout retires the connection
    /// and the next one finds the new master.
    pub stale: u8,
    /// Ghost: which client last wrote each string key.
    pub writers: BTreeMap<String, u8>,
    /// Protocols that `WATCH` (a connection of each client's own): bit `c`
    /// set when client `c` has a connection open to the node.
    pub connected: u8,
    /// Bit `c` set when client `c`'s connection died with a restart or a
    /// failover and the client has not yet noticed: its next request is
    /// written to the dead socket and gets no reply.
    pub dead: u8,
}

/// The old master of a `split-brain` failover: another machine than the
/// promoted replica that now serves node 0's slot, still taking one
/// client's requests.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OldMaster {
    /// Its data and connections.
    pub keyspace: Keyspace,
    /// Its clock reads true time plus this.
    pub offset: u64,
    /// Ghost: which client last wrote each string key.
    pub writers: BTreeMap<String, u8>,
    /// The client that still reaches it (the others reach the new master).
    pub client: u8,
}

impl OldMaster {
    /// Its clock reading at true time `t`.
    pub fn now(&self, t: u64) -> Millis {
        Millis(t + self.offset)
    }
}

impl NodeState {
    /// The node's clock reading at true time `t`.
    pub fn now(&self, t: u64) -> Millis {
        Millis(t + self.offset)
    }

    /// Every open connection dies (a restart, a failover): each client
    /// notices at its next request. The connection of the client a split
    /// brain's old master still serves is not to this machine and stays.
    fn lose_connections(&mut self) {
        let kept = self.old.as_ref().map_or(0, |o| 1u8 << o.client) & self.connected;
        self.dead |= self.connected & !kept;
        self.connected = kept;
    }

    /// Is the node up at true time `t` (not restarting)?
    pub fn up(&self, t: u64) -> bool {
        self.down_until.is_none_or(|u| t >= u)
    }

    /// Is client `c` cut off from the node?
    pub fn cut_off(&self, c: u8) -> bool {
        self.cut & (1u8 << c) != 0
    }

    /// Does client `c`'s request to this slot reach the old master of a
    /// `split-brain` failover rather than the promoted replica?
    pub fn on_old_master(&self, c: u8) -> bool {
        self.old.as_ref().is_some_and(|o| o.client == c)
    }

    /// When the old master of a `split-brain` serves client `c`, swaps its
    /// data, clock and ghost writers with the slot's, so that `c`'s request
    /// runs there, and says so; a second call swaps them back. The old
    /// master is up (it never went down): the slot's `down_until` is the
    /// promotion's and stays, so callers ask `up` only of the new master.
    fn swap_old_for(&mut self, c: u8) -> bool {
        match self.old.as_deref_mut() {
            Some(old) if old.client == c => {
                std::mem::swap(&mut self.keyspace, &mut old.keyspace);
                std::mem::swap(&mut self.offset, &mut old.offset);
                std::mem::swap(&mut self.writers, &mut old.writers);
                true
            }
            _ => false,
        }
    }
}

/// A request on its way to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The request, shared by the states a step copies the link into
    /// (it hashes as the request less its node, which the link it is on
    /// names: see [`Reductions::master_symmetry`]).
    pub request: Arc<Request>,
    /// True time by which it reaches the node (it may arrive any time
    /// before).
    pub due: u64,
    /// The client-clock reading at which the driver stops waiting for its
    /// reply.
    pub timeout: Millis,
    /// Held up by the `delay` fault beyond the latency bound.
    pub late: bool,
    /// Sent to another's key by the protocol's own rule, right after the
    /// read the rule acts on (ghost, decided when it was sent, see
    /// [`LockModel::by_rule`]): it keeps that word when it runs late.
    pub by_rule: bool,
}

impl Hash for Sent {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.hash_with_id(self.request.id, state);
    }
}

impl Sent {
    /// Feed `state` this request, its id written as `id` and its node left
    /// out (its link names it): the one hash of a [`Sent`], with the id
    /// as it is or, under [`Reductions::master_symmetry`], as current or
    /// stale.
    fn hash_with_id<H: std::hash::Hasher>(&self, id: impl Hash, state: &mut H) {
        let Sent {
            request,
            due,
            timeout,
            late,
            by_rule,
        } = self;
        let Request {
            id: _,
            node: _,
            command,
        } = &**request;
        (id, command, due, timeout, late, by_rule).hash(state);
    }

    /// Feed `state` what still matters of a crashed client's request: its
    /// command, deadline, late flag and rule word (its node is its link's;
    /// see [`Reductions::forget_crashed`]).
    fn hash_crashed<H: std::hash::Hasher>(&self, state: &mut H) {
        let Sent {
            request,
            due,
            timeout: _,
            late,
            by_rule,
        } = self;
        (&request.command, due, late, by_rule).hash(state);
    }
}

/// A reply on its way back to the client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Returning {
    /// The request it answers.
    pub id: RequestId,
    /// What became of the request.
    pub outcome: Outcome,
    /// True time by which it reaches a running client.
    pub due: u64,
    /// The client-clock reading at which the driver stops waiting for it.
    pub timeout: Millis,
    /// Lost (a lost reply, a request into a partition): it never arrives,
    /// and the client learns nothing until its timeout.
    pub lost: bool,
}

/// The messages on one (client, node) link.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Link {
    /// Requests on their way to the node, on the client's current
    /// connection (FIFO, as TCP is).
    pub requests: VecDeque<Sent>,
    /// Replies on their way back.
    pub replies: VecDeque<Returning>,
    /// Requests the client gave up on: their connection is retired, so a
    /// later request on a new connection may overtake them, and what they
    /// answer is never read.
    pub orphans: VecDeque<Orphan>,
}

/// A request its client gave up on, on a retired connection of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Orphan {
    /// The request, as it was sent.
    pub sent: Sent,
    /// Which of the client's retired connections to the node it is on
    /// (see [`orphan_conn`]).
    pub slot: u8,
}

impl Link {
    /// Feed `state` what a crashed client's link still does: the requests
    /// on it and on its retired connections, which still run at the node,
    /// each as its command, deadline, late flag and rule word (and its
    /// connection's slot), without its id and reply timeout; the replies,
    /// which nobody reads, not at all (see [`Reductions::forget_crashed`]).
    fn hash_crashed<H: std::hash::Hasher>(&self, state: &mut H) {
        let Link {
            requests,
            replies: _,
            orphans,
        } = self;
        requests.len().hash(state);
        for sent in requests {
            sent.hash_crashed(state);
        }
        orphans.len().hash(state);
        for Orphan { sent, slot } in orphans {
            sent.hash_crashed(state);
            slot.hash(state);
        }
    }

    /// The timeout of the oldest request the client still waits for.
    fn oldest_timeout(&self) -> Option<Millis> {
        match self.replies.front() {
            Some(r) => Some(r.timeout),
            None => self.requests.front().map(|r| r.timeout),
        }
    }
}

/// The connection id of one of a client's retired connections (`slot`
/// below 8), apart from its current one, on which an orphaned request runs.
pub fn orphan_conn(client: u8, slot: u8) -> ConnId {
    ConnId(0x100 + u32::from(client) * 8 + u32::from(slot))
}

/// The protected resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resource {
    /// Highest fence accepted (fenced protocols).
    pub highest_fence: Option<u64>,
    /// Highest grant whose write was accepted (ghost).
    pub newest_grant: u32,
    /// A superseded holder's write was accepted after its successor's.
    pub stale_accepted: bool,
}

/// A vector whose elements the states that leave them unchanged share.
///
/// Cloning a [`State`] copies one pointer per client, node and link instead
/// of their machines, keyspaces and queues; the first write to an element
/// through `IndexMut` (or [`Parts::iter_mut`]) copies that element alone
/// ([`Arc::make_mut`]). A step changes one or two clients, nodes and links,
/// so most of a successor is its parent's.
///
/// It compares and prints as the `Vec<T>` it stands for, so traces are
/// those of a plain vector. It hashes as the digests of its elements
/// (64 bits each, aHash with fixed seeds, as the checker's fingerprints): an element's digest is taken
/// the first time a state holding it is hashed and kept with it, so that
/// fingerprinting a successor reads only the elements its step wrote. Two
/// states that differ in an element differ in its digest but for a hash
/// collision, as likely as one of the checker's own 64-bit fingerprints.
#[derive(Clone, PartialEq, Eq)]
pub struct Parts<T>(Vec<Arc<Part<T>>>);

/// An element of [`Parts`] and its digest, once taken (a write through
/// `IndexMut` drops it).
#[derive(Clone, Debug)]
pub struct Part<T> {
    value: T,
    digest: std::sync::OnceLock<u64>,
}

impl<T: PartialEq> PartialEq for Part<T> {
    fn eq(&self, other: &Part<T>) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Part<T> {}

impl<T: Hash> Part<T> {
    fn digest(&self) -> u64 {
        // Fixed seeds: the same element has the same digest in every run
        // of one build (nothing keeps a digest beyond its run).
        *self.digest.get_or_init(|| {
            let mut h = digest_hasher();
            self.value.hash(&mut h);
            h.finish()
        })
    }
}

impl<T: Clone> Part<T> {
    /// The value, to change it: copied first if another state shares it,
    /// and without a digest until it is hashed again.
    fn write(part: &mut Arc<Part<T>>) -> &mut T {
        let part = Arc::make_mut(part);
        part.digest.take();
        &mut part.value
    }
}

impl<T: Hash> Hash for Parts<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.0.len());
        for part in &self.0 {
            state.write_u64(part.digest());
        }
    }
}

impl<T: Clone> Parts<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The elements, read only (nothing is copied).
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.0.iter().map(|e| &e.value)
    }

    /// Every element, each copied first if another state shares it: use
    /// indexing to change one.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.0.iter_mut().map(Part::write)
    }
}

impl<T> FromIterator<T> for Parts<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Parts(
            iter.into_iter()
                .map(|value| {
                    Arc::new(Part {
                        value,
                        digest: std::sync::OnceLock::new(),
                    })
                })
                .collect(),
        )
    }
}

impl<T> std::ops::Index<usize> for Parts<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        &self.0[i].value
    }
}

impl<T: Clone> std::ops::IndexMut<usize> for Parts<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        Part::write(&mut self.0[i])
    }
}

impl<'a, T: Clone> IntoIterator for &'a Parts<T> {
    type Item = &'a T;
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, Arc<Part<T>>>, fn(&'a Arc<Part<T>>) -> &'a T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|e| &e.value)
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Parts<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|e| &e.value))
            .finish()
    }
}

/// The whole model state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Ghost true time.
    pub time: u64,
    /// The clients.
    pub clients: Parts<ClientState>,
    /// The nodes.
    pub nodes: Parts<NodeState>,
    /// Links, index `client * nodes + node`.
    pub links: Parts<Link>,
    /// The protected resource.
    pub resource: Resource,
    /// Fault actions left: bit 0 while the run's fault may still act, bit
    /// 1 likewise for its second fault ([`ModelConfig::also`]); each acts
    /// once.
    pub budget: u8,
    /// `delay`: messages that may still be held up beyond the latency bound
    /// (one per run).
    pub holds_left: u8,
    /// Retries that may still fire late ([`Reductions::bounded_late_retries`]).
    pub late_retries_left: u8,
    /// Grants so far, counted where the servers grant (ghost).
    pub grants: u32,
    /// A command other than an eviction ([`LockModel::evicts`]) or a
    /// recipe's rule ([`LockModel::by_rule`]) removed or changed another
    /// owner's hold, or set an expiry on it (ghost, sticky).
    pub owner_violation: bool,
    /// Last true time a live client was inside, a paused client that will
    /// still give its hold back held it at the servers, a node was cut off
    /// from every client or down, or a message was held up beyond the
    /// latency bound: a waiter's patience runs from here.
    pub last_inside: u64,
    /// The masters from this one on are interchangeable
    /// ([`Reductions::master_symmetry`]); the number of nodes when none are
    /// (a constant of the run).
    pub alike_from: u8,
    /// A crashed client's fingerprint keeps only what the rest of the run
    /// can observe of it ([`Reductions::forget_crashed`]; a constant of the
    /// run).
    pub forget_crashed: bool,
}

impl Hash for State {
    /// The fingerprint: every field, but where two or more masters are
    /// alike ([`State::alike_from`]) their parts are hashed in sorted order,
    /// so that renaming them leaves the fingerprint as it is.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Every field, so that a new one cannot be left out unnoticed.
        let State {
            time,
            clients,
            nodes,
            links,
            resource,
            budget,
            holds_left,
            late_retries_left,
            grants,
            owner_violation,
            last_inside,
            alike_from,
            forget_crashed,
        } = self;
        (time, resource, budget, holds_left, late_retries_left).hash(state);
        (grants, owner_violation, last_inside, alike_from).hash(state);
        forget_crashed.hash(state);
        let alike = usize::from(*alike_from);
        let forgotten = |client: &ClientState| *forget_crashed && client.crashed;
        let n = nodes.len();
        if n < alike + 2 {
            if !clients.iter().any(forgotten) {
                (clients, nodes, links).hash(state);
                return;
            }
            nodes.hash(state);
            for (c, (client, part)) in clients.iter().zip(&clients.0).enumerate() {
                let own = &links.0[c * n..(c + 1) * n];
                if forgotten(client) {
                    state.write_u64(client.digest_crashed());
                    for link in own {
                        link.value.hash_crashed(state);
                    }
                } else {
                    state.write_u64(part.digest());
                    for link in own {
                        state.write_u64(link.digest());
                    }
                }
            }
            return;
        }
        for client in clients {
            state.write_u64(if forgotten(client) {
                client.digest_crashed()
            } else {
                client.digest_apart_from_masters()
            });
        }
        let view = |m: usize| -> u64 {
            let mut h = digest_hasher();
            h.write_u64(nodes.0[m].digest());
            for (c, client) in clients.iter().enumerate() {
                let link = &links[c * n + m];
                if forgotten(client) {
                    link.hash_crashed(&mut h);
                } else {
                    client.hash_master(m, link, &mut h);
                }
            }
            h.finish()
        };
        let mut views: Vec<u64> = (0..n).map(view).collect();
        views[alike..].sort_unstable();
        views.hash(state);
    }
}

/// The hasher of every digest the model takes itself (aHash, fixed seeds).
fn digest_hasher() -> ahash::AHasher {
    ahash::RandomState::with_seeds(0x6c6f_636b, 0x7772_6967, 0x6874, 0x7061_7274).build_hasher()
}

/// A step of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The node runs the first request on the link.
    Deliver {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// The node runs the first request on the link and the running client
    /// receives the reply, in one step ([`Reductions::prompt_replies`]).
    ///
    /// Why the verdicts stay: the request itself may still be in flight
    /// while time passes, so the node runs it at any instant up to the
    /// latency bound, and the client learns the outcome when it runs. A
    /// reply that came later would only make the client learn later: a
    /// grant is believed later (its validity is counted from the send, or
    /// for RedLock shortened by the longer wait), a release or a refusal is
    /// known later, and the retry that follows is sent later, which the
    /// request's own latency covers. Replies that never come (lost, cut off,
    /// held beyond the bound) are kept. The test `reductions_keep_the_verdicts`
    /// reruns small bounds with replies in flight of their own.
    RoundTrip {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// The node runs the oldest request the client gave up on; its reply
    /// is never read.
    DeliverOrphan {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// The client's driver stops waiting for the oldest reply on the link
    /// (an unknown outcome) and retires the connection.
    Timeout {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// The client receives the first reply on the link.
    Receive {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// The client's clock reached its machine's deadline.
    Timer(u8),
    /// The holder checks its validity before writing.
    Check(u8),
    /// The holder writes to the resource, then releases.
    Write(u8),
    /// True time advances to this instant.
    Tick(u64),
    /// `crash`: the client stops for good.
    Crash(u8),
    /// `pause`: the client stops taking steps.
    Pause(u8),
    /// The paused client resumes.
    Resume(u8),
    /// `client-step`: the client's clock steps back by
    /// [`CLOCK_STEP_BACK`](crate::fault::CLOCK_STEP_BACK) ms.
    StepBack(u8),
    /// `clock-jump`: the node's clock jumps forward by TTL + 1.
    JumpClock(u8),
    /// `restart*`, `clock-back`: the node restarts.
    Restart(u8),
    /// `failover`: the replica catches up with node 0.
    Replicate,
    /// `failover*`: the replica of node 0 is promoted in its place.
    Promote,
    /// `split-brain`: the replica of node 0 is promoted in its place, while
    /// the old master still serves this client (the others now reach the
    /// new master).
    Split(u8),
    /// `split-brain`: the old master learns of the promotion: it becomes a
    /// replica of the new master, dropping what was written to it since,
    /// and kills its clients' connections, so that requests its client has
    /// on the way fail.
    Demote,
    /// `delay`: the first message on the link is held up beyond the
    /// latency bound, until after the lease's TTL.
    Hold {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// `delay`: the first request on the link is lost.
    LoseRequest {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// `delay`: the first reply on the link is lost; with none on the way
    /// yet, the first request runs and its reply is lost.
    LoseReply {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// `partition`: the node is cut off from every client.
    Cut(u8),
    /// `client-partition`: the client is cut off from the node; the other
    /// clients still reach it.
    CutLink {
        /// Client.
        client: u8,
        /// Node.
        node: u8,
    },
    /// `partition`, `client-partition`: the cut heals.
    Heal(u8),
}

/// A model of one protocol under one fault class.
#[derive(Clone, Debug)]
pub struct LockModel {
    /// The bounds.
    pub cfg: ModelConfig,
    /// The properties checked (and named in counterexamples).
    pub properties: Vec<PropertyId>,
    /// Also check the model's own invariants ([`LockModel::time_passes`],
    /// [`LockModel::deadlines_kept`]) as the properties "time passes" and
    /// "deadlines kept" (tests only: it costs an `enabled` per state).
    pub sanity: bool,
    limit: usize,
}

impl LockModel {
    /// A model of `cfg` checking `properties`.
    pub fn new(cfg: ModelConfig, properties: Vec<PropertyId>) -> Result<LockModel, ConfigError> {
        // Build one machine to surface configuration errors early.
        cfg.machine(0)?;
        let limit = match cfg.protocol.kind() {
            Kind::Lock => 1,
            Kind::Semaphore => cfg.core_config(0).limit as usize,
        };
        Ok(LockModel {
            cfg,
            properties,
            sanity: false,
            limit,
        })
    }

    fn token(client: u8) -> String {
        format!("c{client}")
    }

    /// The client a token names: `c<n>`, or `c<n>.<k>` for the `k`th new
    /// token its machine took after a release that got no reply.
    fn owner_of_token(s: &str) -> Option<u8> {
        match s.as_bytes() {
            [b'c', d @ b'0'..=b'7'] => Some(d - b'0'),
            [b'c', d @ b'0'..=b'7', b'.', rest @ ..]
                if !rest.is_empty() && rest.iter().all(u8::is_ascii_digit) =>
            {
                Some(d - b'0')
            }
            _ => None,
        }
    }

    fn link(&self, client: u8, node: u8) -> usize {
        usize::from(client) * usize::from(self.cfg.nodes) + usize::from(node)
    }

    /// The link between `client` and `node` in `state`.
    pub fn link_of<'s>(&self, state: &'s State, client: u8, node: u8) -> &'s Link {
        &state.links[self.link(client, node)]
    }

    /// What `node` answers to the first request on `client`'s link in
    /// `state`, as a [`Action::Deliver`] would compute it (`None` when no
    /// request waits there). A replay compares real Redis' answer with it.
    pub fn answer(&self, state: &State, client: u8, node: u8) -> Option<Outcome> {
        self.link_of(state, client, node).requests.front()?;
        let mut after = state.clone();
        self.deliver(&mut after, client, node);
        let link = &after.links[self.link(client, node)];
        link.replies.back().map(|back| back.outcome.clone())
    }

    /// The initial state.
    pub fn initial(&self) -> State {
        let cfg = &self.cfg;
        let mut nodes: Vec<NodeState> = (0..cfg.nodes)
            .map(|_| NodeState {
                keyspace: Keyspace::new(),
                offset: NODE_CLOCK_START,
                down_until: None,
                cut: 0,
                replica: None,
                old: None,
                stale: 0,
                writers: BTreeMap::new(),
                connected: 0,
                dead: 0,
            })
            .collect();
        if cfg.protocol == ProtocolId::WatchSemaphore {
            // The semaphore's administrator set its size before any client came.
            let config = cfg.core_config(0);
            let set_max = Command::Set {
                key: config.key_with("max"),
                value: config.limit.to_string(),
                condition: lockwright_core::keyspace::SetCondition::Always,
                expiry: lockwright_core::keyspace::SetExpiry::None,
                get: false,
            };
            for n in &mut nodes {
                n.keyspace
                    .execute(ConnId(u32::MAX), Millis(NODE_CLOCK_START), &set_max);
            }
        }
        if cfg.faults().any(Fault::has_replica) {
            nodes[0].replica = Some(Keyspace::new());
        }
        let clients = (0..cfg.clients)
            .map(|c| {
                let clock = if cfg.has(Fault::ClientSkew) && c == 1 {
                    ClientClock::skewed(cfg.ttl)
                } else {
                    ClientClock::EXACT
                };
                let machine = cfg.machine(c).expect("validated in LockModel::new");
                ClientState {
                    machine,
                    clock,
                    phase: Phase::Acquiring,
                    paused: false,
                    crashed: false,
                    waiting_since: Some(0),
                    grant: 0,
                    at_server: false,
                    gave_back: false,
                    probe: None,
                }
            })
            .collect();
        let mut state = State {
            time: 0,
            clients,
            nodes: nodes.into_iter().collect(),
            links: (0..usize::from(cfg.clients) * usize::from(cfg.nodes))
                .map(|_| Link::default())
                .collect(),
            resource: Resource::default(),
            budget: cfg
                .faults()
                .filter(|f| !matches!(f, Fault::None | Fault::ClientSkew))
                .fold(0, |bits, f| bits | cfg.budget_bit(f)),
            holds_left: u8::from(cfg.has(Fault::Delay)),
            late_retries_left: if cfg.retry_jitter == 0 {
                0
            } else if cfg.reductions.bounded_late_retries {
                cfg.late_retries
            } else {
                u8::MAX
            },
            grants: 0,
            owner_violation: false,
            last_inside: 0,
            alike_from: self.alike_from(),
            forget_crashed: cfg.reductions.forget_crashed,
        };
        for c in 0..cfg.clients {
            let client = &mut state.clients[usize::from(c)];
            let deadline = client.clock.at(cfg.horizon + cfg.ttl);
            let now = client.clock.at(0);
            client
                .machine
                .acquire(now, Acquire::Until(deadline))
                .expect("a new machine is idle");
            self.drain(&mut state, c);
        }
        state
    }

    /// Client `c` gives the lock back, after its write or at a check that
    /// found its validity over: its machine releases and the client waits
    /// in [`Phase::Releasing`] for the outcome, or, should the machine
    /// refuse, the client is done.
    fn give_back(&self, state: &mut State, c: u8) {
        let client = &mut state.clients[usize::from(c)];
        let now = client.clock.at(state.time);
        client.phase = match client.machine.release(now) {
            Ok(()) => Phase::Releasing,
            Err(_) => Phase::Done,
        };
        self.drain(state, c);
    }

    /// Move a client's requests onto the wire and react to its events.
    fn drain(&self, state: &mut State, c: u8) {
        let ci = usize::from(c);
        let now = state.clients[ci].clock.at(state.time);
        while let Some(request) = state.clients[ci].machine.poll_transmit() {
            let l = self.link(c, request.node.0);
            let by_rule = Self::sent_by_rule(&mut state.clients[ci], &request);
            state.links[l].requests.push_back(Sent {
                request: Arc::new(request),
                due: state.time + self.cfg.latency,
                timeout: now + self.cfg.reply_timeout,
                late: false,
                by_rule,
            });
        }
        while let Some(event) = state.clients[ci].machine.poll_event() {
            let client = &mut state.clients[ci];
            match event {
                Event::Acquired(lease) => {
                    // The grant's number was taken when the servers granted
                    // it (`server_grants`). A client that believes it holds
                    // though the servers never held it for it at once (a
                    // RedLock quorum whose keys were never all there
                    // together) takes its number now.
                    if client.grant == 0 {
                        state.grants += 1;
                        client.grant = state.grants;
                    }
                    client.waiting_since = None;
                    client.phase = Phase::Holding(lease);
                }
                Event::Extended { lease, .. } => match client.phase {
                    Phase::Holding(_) => client.phase = Phase::Holding(lease),
                    Phase::Checked(_) => client.phase = Phase::Checked(lease),
                    _ => {}
                },
                // A client that gives up acquiring (its deadline passed, or
                // Redis answered with an error, as `watch-semaphore` does
                // once its limit key is lost) still wanted the lock: it
                // keeps waiting for `progress`, and no retry of the
                // application's can help it where the error repeats.
                Event::Denied | Event::Failed(_) if matches!(client.phase, Phase::Acquiring) => {
                    client.phase = Phase::Done;
                }
                Event::Denied | Event::Lost | Event::Failed(_) | Event::Released { .. } => {
                    client.waiting_since = None;
                    client.phase = Phase::Done;
                }
                // The old lease stands and renewal tries again (the core's
                // contract): the holder is still inside and will release.
                // Leaving here would abandon a machine that renews.
                Event::NotExtended { .. } | Event::RenewalFailed(_) => {}
            }
        }
    }

    /// The earliest true-time instant at which client `c` must act: a due
    /// timer, the end of its validity, the write it checked it may do, or
    /// the driver's reply timeout.
    fn obligation(&self, state: &State, c: usize) -> Option<u64> {
        let client = &state.clients[c];
        let slack = if self.may_defer(state, c) {
            self.cfg.retry_jitter
        } else {
            0
        };
        let timer = client
            .machine
            .poll_timeout()
            .and_then(|d| client.clock.true_time_of(d + slack));
        let phase = match &client.phase {
            Phase::Holding(lease) => client.clock.true_time_of(lease.valid_until),
            Phase::Checked(_) => Some(state.time),
            _ => None,
        };
        let timeout = (0..self.cfg.nodes)
            .filter_map(|n| state.links[self.link(c as u8, n)].oldest_timeout())
            .min()
            .and_then(|d| client.clock.true_time_of(d));
        [timer, phase, timeout].into_iter().flatten().min()
    }

    /// The instant at which client `c` may act though nothing obliges it
    /// to: the last instant at which a holder's check still passes, so that
    /// a holder may use all of its validity (the instant at which it ends is
    /// an obligation, and the check fails there).
    fn last_check(&self, state: &State, c: usize) -> Option<u64> {
        let client = &state.clients[c];
        match &client.phase {
            Phase::Holding(lease) => client
                .clock
                .true_time_of(lease.valid_until)
                .map(|t| t.saturating_sub(1)),
            _ => None,
        }
    }

    /// May client `c`'s armed retry still fire late? With
    /// [`ModelConfig::retry_jitter`] a retry fires at any instant up to the
    /// jitter after its machine armed it: the machine drew the shortest
    /// delay, the driver sleeps any delay up to the jitter longer (the
    /// adapter's backoff draws from a range too, below its longest delay),
    /// as long as the
    /// run has a late retry left ([`Reductions::bounded_late_retries`]). A client
    /// waits for its retry when it is acquiring with nothing in flight and
    /// nothing to read.
    fn may_defer(&self, state: &State, c: usize) -> bool {
        state.late_retries_left > 0
            && matches!(state.clients[c].phase, Phase::Acquiring)
            && (0..self.cfg.nodes).all(|n| {
                let link = &state.links[self.link(c as u8, n)];
                link.requests.is_empty() && link.replies.is_empty()
            })
    }

    /// May some client's late retry fire at true time `d`? Then `d` is
    /// an instant of its own even with [`Reductions::prompt_delivery`]: a
    /// retry that fires as a message's deadline runs out (the last moment
    /// a DEL can still be in flight) is a different run from one that
    /// fires before or after it.
    fn may_retry_at(&self, state: &State, d: u64) -> bool {
        state.clients.iter().enumerate().any(|(c, client)| {
            client.runs()
                && self.may_defer(state, c)
                && client.machine.poll_timeout().is_some_and(|at| {
                    let from = client.clock.true_time_of(at);
                    let to = client.clock.true_time_of(at + self.cfg.retry_jitter);
                    from.is_some_and(|f| f < d) && to.is_some_and(|u| d <= u)
                })
        })
    }

    /// The earliest deadline of a message in flight: a running or crashed
    /// client's requests and the replies to running clients. A paused
    /// client's requests wait for it to resume, then are due within the
    /// latency bound (the pause struck after its machine emitted them and
    /// before its driver wrote them: the model's client steps emit and
    /// write at once, so this is where such a pause falls); its replies
    /// wait for it too.
    fn message_deadline(&self, state: &State) -> Option<u64> {
        let mut earliest = None::<u64>;
        for (c, client) in state.clients.iter().enumerate() {
            for n in 0..self.cfg.nodes {
                let link = &state.links[self.link(c as u8, n)];
                let sent = link
                    .requests
                    .iter()
                    .filter(|_| !client.paused || client.crashed)
                    .chain(link.orphans.iter().map(|o| &o.sent))
                    .map(|m| m.due);
                // Replies arrive in order: those behind a lost one wait for
                // the client to time out on it (which loses them too).
                let back = link
                    .replies
                    .iter()
                    .take_while(|m| !m.lost)
                    .filter(|_| client.runs())
                    .map(|m| m.due);
                for due in sent.chain(back) {
                    earliest = Some(earliest.map_or(due, |e| e.min(due)));
                }
            }
        }
        earliest
    }

    /// The next instant worth advancing to, if time may advance at all.
    ///
    /// Time stops at every instant at which something can change: a
    /// client's obligation, a key's expiry on some node, a node coming back
    /// up. Messages stay in flight while it passes, up to their deadlines.
    /// With [`Reductions::prompt_delivery`] a deadline is not an instant of
    /// its own (unless a late retry may fire then, see
    /// [`LockModel::may_retry_at`]): a message must arrive before the next instant at which
    /// something else changes when that instant lies beyond its deadline.
    /// What it gives up is arriving later within a stretch in which nothing
    /// changes: the same order of events, with node clocks read later (a
    /// key written later expires later) and a reply read later; the test
    /// `reductions_keep_the_verdicts` reruns small bounds without it.
    fn next_instant(&self, state: &State) -> Option<u64> {
        let t = state.time;
        if t >= self.cfg.horizon {
            return None;
        }
        let mut next = self.cfg.horizon;
        for (c, client) in state.clients.iter().enumerate() {
            if client.crashed {
                continue;
            }
            let due = self.obligation(state, c);
            if client.runs() && due.is_some_and(|d| d <= t) {
                return None;
            }
            // A retry that may fire late may also fire when it is due.
            let retry = if self.may_defer(state, c) {
                client
                    .machine
                    .poll_timeout()
                    .and_then(|d| client.clock.true_time_of(d))
            } else {
                None
            };
            let last_check = self.last_check(state, c);
            for d in due.into_iter().chain(retry).chain(last_check) {
                if d > t {
                    next = next.min(d);
                }
            }
        }
        for node in &state.nodes {
            if let Some(u) = node.down_until {
                if u > t {
                    next = next.min(u);
                }
            }
            // A split brain's old master expires its keys by its own clock.
            let old = node.old.iter().map(|o| (&o.keyspace, o.offset));
            for (keyspace, offset) in std::iter::once((&node.keyspace, node.offset)).chain(old) {
                for (_, entry) in keyspace.entries() {
                    if let Some(deadline) = entry.expires_at {
                        // Expired once the node clock passes the deadline.
                        let at = (deadline + 1).saturating_sub(offset);
                        if at > t {
                            next = next.min(at);
                        }
                    }
                }
            }
        }
        match self.message_deadline(state) {
            Some(d) if d <= t => None,
            Some(d) if d < next => {
                (!self.cfg.reductions.prompt_delivery || self.may_retry_at(state, d)).then_some(d)
            }
            _ => Some(next),
        }
    }

    /// Every hold visible on a node at its time `now`: (key, member, owner,
    /// expiry). Sorted-set members count by owner token; where the scores are
    /// server-clock deadlines (`lease-semaphore`, `time-fenced-semaphore`), a member past its deadline
    /// is no longer a hold, and dropping it touches no one.
    fn holds(&self, node: &NodeState, now: Millis) -> BTreeSet<(String, String, u8, Option<u64>)> {
        let mut out = BTreeSet::new();
        self.each_hold(
            &node.keyspace,
            &node.writers,
            now,
            |key, member, owner, expiry| {
                out.insert((key.to_owned(), member.to_owned(), owner, expiry));
            },
        );
        out
    }

    /// The owners of the holds visible on a node at its time `now`, one
    /// bit per client: what [`LockModel::holds`] lists, without building it.
    fn owners(&self, node: &NodeState, now: Millis) -> u8 {
        self.owners_in(&node.keyspace, &node.writers, now)
    }

    /// [`LockModel::owners`] of a keyspace and its ghost writers.
    fn owners_in(&self, keyspace: &Keyspace, writers: &BTreeMap<String, u8>, now: Millis) -> u8 {
        let mut bits = 0u8;
        self.each_hold(keyspace, writers, now, |_, _, owner, _| {
            bits |= 1u8 << owner
        });
        bits
    }

    /// Calls `hold(key, member, owner, expiry)` for every hold visible on a
    /// node at its time `now` (the member is empty for a plain key).
    fn each_hold(
        &self,
        keyspace: &Keyspace,
        writers: &BTreeMap<String, u8>,
        now: Millis,
        mut hold: impl FnMut(&str, &str, u8, Option<u64>),
    ) {
        let deadlines = matches!(
            self.cfg.protocol,
            ProtocolId::LeaseSemaphore | ProtocolId::TimeFencedSemaphore
        );
        for (key, entry) in keyspace.live(now) {
            let Entry { value, expires_at } = entry;
            match value {
                Value::Str(s) => {
                    let owner = Self::owner_of_token(s).or_else(|| writers.get(key).copied());
                    if let Some(o) = owner {
                        hold(key, "", o, *expires_at);
                    }
                }
                Value::Hash(h) => {
                    for field in h.keys() {
                        if let Some(o) = Self::owner_of_token(field) {
                            hold(key, field, o, *expires_at);
                        }
                    }
                }
                Value::Set(s) => {
                    for m in s {
                        if let Some(o) = Self::owner_of_token(m) {
                            hold(key, m, o, *expires_at);
                        }
                    }
                }
                Value::ZSet(z) => {
                    for (m, score) in z {
                        if deadlines && *score < now.get() as i64 {
                            continue;
                        }
                        if let Some(o) = Self::owner_of_token(m) {
                            hold(key, m, o, Some(*score as u64));
                        }
                    }
                }
            }
        }
    }

    fn record_writers(
        &self,
        writers: &mut BTreeMap<String, u8>,
        c: u8,
        command: &Command,
        reply: &Reply,
    ) {
        match (command, reply) {
            (Command::Set { key, .. }, r) if r.is_ok() || matches!(r, Reply::Bulk(_)) => {
                writers.insert(key.clone(), c);
            }
            (Command::SetNx { key, .. }, Reply::Int(1)) => {
                writers.insert(key.clone(), c);
            }
            (Command::GetSet { key, value }, old) => {
                // A `GETSET` takes the key over only when the value it
                // replaced had expired by the writer's clock when it sent
                // (its new value is that clock plus the TTL); a losing one
                // overwrites a live holder's timestamp with a close one, as
                // the recipe accepts, and the holder stays the owner.
                let sent_at = value
                    .parse::<u64>()
                    .ok()
                    .map(|v| v.saturating_sub(self.cfg.ttl));
                let took_over = match old {
                    Reply::Nil => true,
                    Reply::Bulk(old) => old
                        .parse::<u64>()
                        .ok()
                        .zip(sent_at)
                        .is_some_and(|(old, at)| old < at),
                    _ => false,
                };
                if took_over {
                    writers.insert(key.clone(), c);
                }
            }
            (Command::Transaction(cmds), Reply::Array(replies)) => {
                for (cmd, r) in cmds.iter().zip(replies) {
                    self.record_writers(writers, c, cmd, r);
                }
            }
            _ => {}
        }
    }

    /// Runs `command` of client `c` on node `n` over connection `conn`,
    /// with the ghost bookkeeping: who wrote each plain key, whether the
    /// command touched another owner's hold, and the read a recipe's rule
    /// acts on next.
    fn execute(&self, state: &mut State, c: u8, n: u8, sent: &Sent, conn: ConnId) -> Reply {
        let command = &sent.request.command;
        let t = state.time;
        let node = &mut state.nodes[usize::from(n)];
        if self.cfg.protocol.uses_watch() && conn == ConnId(u32::from(c)) {
            node.connected |= 1u8 << c;
        }
        let now = node.now(t);
        let owners_before = self.owners(node, now);
        let held_before = owners_before & (1u8 << c) != 0;
        // Owner-only is judged on every command a client sends, in every
        // phase and whatever phase its client is in when it runs (a release
        // or undo may run late, after its client moved on), except the
        // commands that evict holds by the protocol's own expiry rule or
        // act on another's key by its rule; only a node holding another
        // owner's hold can be touched.
        let before = (owners_before & !(1u8 << c) != 0
            && Self::may_touch(command)
            && !Self::by_rule(sent.by_rule, &node.keyspace, now, command))
        .then(|| self.holds(node, now));
        let reply = match command {
            Command::Wait { replicas, .. } => {
                let synced = node
                    .replica
                    .as_ref()
                    .is_some_and(|r| same_data(r, &node.keyspace));
                Reply::Int(i64::from(synced).min(i64::from(*replicas)))
            }
            command => node.keyspace.execute(conn, now, command),
        };
        self.record_writers(&mut node.writers, c, command, &reply);
        if let Some(before) = before {
            let after = self.holds(node, now);
            let touched = before
                .iter()
                .filter(|h| h.2 != c)
                .any(|h| !after.contains(h));
            // An expiry set on another's key acts on its hold even when the
            // deadline comes out the same: the command is judged, not the
            // instant it ran at. (Two `EXPIRE`s at one instant leave the same
            // deadline, and prompt delivery runs a request at the instant
            // the last thing changed, so judging by the deadline alone would
            // miss, under the reduction, what a later instant shows.)
            let mut expired_for_another = false;
            Self::each_expiry_set(command, &reply, &mut |key| {
                expired_for_another |= before.iter().any(|h| h.0 == key && h.2 != c);
            });
            if touched || expired_for_another {
                state.owner_violation = true;
            }
        }
        let acquiring = matches!(state.clients[usize::from(c)].phase, Phase::Acquiring);
        if acquiring && held_before && self.owners(node, now) & (1u8 << c) == 0 {
            // An acquiring client took its own hold off (a failed round's
            // release, an undo): a grant it believes in later is a new one
            // (`server_grants`).
            state.clients[usize::from(c)].gave_back = true;
        }
        node.keyspace.purge_expired(now);
        // The read a recipe's rule acts on, for the client's next request
        // to this node (`sent_by_rule`). Only the two recipes whose rule
        // acts on another's key after a read record it, so that the other
        // protocols' states do not multiply by a ghost they never use. A
        // request of a retired connection (an orphan) makes none: its
        // client never reads the reply.
        let found = match (self.cfg.protocol, command, &reply) {
            (
                ProtocolId::SetnxExpire,
                Command::Ttl { key } | Command::PTtl { key },
                Reply::Int(-1),
            ) => Some((key, Found::NoTtl)),
            (ProtocolId::SetnxGetset, Command::Get { key }, Reply::Bulk(_)) => {
                Some((key, Found::Value))
            }
            _ => None,
        };
        if let Some((key, found)) = found.filter(|_| conn == ConnId(u32::from(c))) {
            state.clients[usize::from(c)].probe = Some(Probe {
                node: n,
                key: key.clone(),
                found,
            });
        }
        reply
    }

    /// Whether `request`, which `client` is sending, acts on another's key
    /// by its protocol's rule: the client's last read on that node
    /// ([`Probe`]) is the one the rule acts on, for this command and key.
    /// Any request to that node ends the probe: the rule acts on the read
    /// with the very next command.
    fn sent_by_rule(client: &mut ClientState, request: &Request) -> bool {
        let Some(probe) = client.probe.take_if(|p| p.node == request.node.0) else {
            return false;
        };
        match (&request.command, probe.found) {
            (Command::Expire { key, .. } | Command::PExpire { key, .. }, Found::NoTtl)
            | (Command::GetSet { key, .. }, Found::Value) => *key == probe.key,
            _ => false,
        }
    }

    /// Calls `key` for each key `command` set an expiry on (`EXPIRE` or
    /// `PEXPIRE` answered 1, also inside a transaction).
    fn each_expiry_set(command: &Command, reply: &Reply, key: &mut impl FnMut(&str)) {
        match (command, reply) {
            (Command::Expire { key: k, .. } | Command::PExpire { key: k, .. }, Reply::Int(1)) => {
                key(k)
            }
            (Command::Transaction(cmds), Reply::Array(replies)) => {
                for (cmd, r) in cmds.iter().zip(replies) {
                    Self::each_expiry_set(cmd, r, key);
                }
            }
            _ => {}
        }
    }

    /// `command` evicts holds that the protocol's own rule says have timed
    /// out, whoever owns them: the book's ZSET semaphores drop members older
    /// than the TTL by the acquirer's clock (`ZREMRANGEBYSCORE`, then
    /// `ZINTERSTORE` of the fair ones' owner set). Such an eviction is the
    /// protocol's design, not a client acting on a hold it takes for its
    /// own; when it evicts a live hold (a skewed clock), mutual exclusion
    /// is what breaks, and that property judges it.
    fn evicts(command: &Command) -> bool {
        match command {
            Command::ZRemRangeByScore { .. } | Command::ZInterStore { .. } => true,
            Command::Transaction(cmds) => cmds.iter().any(Self::evicts),
            _ => false,
        }
    }

    /// `command`, sent by the protocol's rule right after the read the rule
    /// acts on (`sent_by_rule`, decided when it was sent), acts on
    /// another's key as that rule allows:
    /// - `setnx-expire`'s repair: a waiter whose `TTL` found the key
    ///   without expiry gives it one with `EXPIRE`, and the key has still
    ///   none now. A repair that runs when the key has an expiry again
    ///   (the holder's own `EXPIRE` ran in between) resets another
    ///   holder's TTL: that one is judged.
    /// - `setnx-getset`'s takeover: a waiter that read a stamp with `GET`
    ///   takes the key over with `GETSET` (its owner changes only when the
    ///   stamp had expired by the waiter's clock, see `record_writers`; a
    ///   losing one leaves the owner as it was). A `GETSET` with no `GET`
    ///   before it, the recipe's extend, is judged.
    fn by_rule(sent_by_rule: bool, keyspace: &Keyspace, now: Millis, command: &Command) -> bool {
        sent_by_rule
            && match command {
                Command::Expire { key, .. } | Command::PExpire { key, .. } => keyspace
                    .get_live(key, now)
                    .is_some_and(|entry| entry.expires_at.is_none()),
                _ => true,
            }
    }

    /// `command` is judged by owner-only: it is no eviction
    /// ([`LockModel::evicts`]) and it can remove or change a hold it does
    /// not name by its client's token. Reads, `SET NX`, `SETNX`, and adding
    /// the client's own member or field cannot; the others (a plain or `XX`
    /// `SET`, `GETSET`, `DEL`, `EXPIRE`, removals by member or field,
    /// scripts, transactions holding one of these) are compared before and
    /// after.
    fn may_touch(command: &Command) -> bool {
        match command {
            Command::Set { condition, .. } => *condition != SetCondition::Nx,
            Command::GetSet { .. }
            | Command::Del { .. }
            | Command::Expire { .. }
            | Command::PExpire { .. }
            | Command::HDel { .. }
            | Command::SRem { .. }
            | Command::ZRem { .. }
            | Command::Eval { .. } => true,
            Command::Transaction(cmds) => {
                !Self::evicts(command) && cmds.iter().any(Self::may_touch)
            }
            _ => false,
        }
    }

    /// The node runs the first request on the client's current connection.
    /// A node that is down refuses it, and a connection that died with a
    /// restart or failover fails it: the client learns at once that the
    /// outcome is unknown. A node cut off never sees it: no reply comes.
    fn deliver(&self, state: &mut State, c: u8, n: u8) {
        let l = self.link(c, n);
        let Some(sent) = state.links[l].requests.pop_front() else {
            return;
        };
        let t = state.time;
        let on_old = state.nodes[usize::from(n)].swap_old_for(c);
        let node = &mut state.nodes[usize::from(n)];
        let bit = 1u8 << c;
        let (outcome, lost) = if node.cut_off(c) || node.stale & bit != 0 {
            (Outcome::Unknown, true)
        } else if node.dead & bit != 0 || !(on_old || node.up(t)) {
            node.dead &= !bit;
            (Outcome::Unknown, false)
        } else {
            let conn = ConnId(u32::from(c));
            let reply = self.execute(state, c, n, &sent, conn);
            (Outcome::Reply(reply), false)
        };
        if on_old {
            state.nodes[usize::from(n)].swap_old_for(c);
        }
        state.links[l].replies.push_back(Returning {
            id: sent.request.id,
            outcome,
            due: t + self.cfg.latency,
            timeout: sent.timeout,
            lost,
        });
    }

    /// The node runs the oldest orphaned request, on the retired connection;
    /// nobody reads the reply.
    fn deliver_orphan(&self, state: &mut State, c: u8, n: u8) {
        let l = self.link(c, n);
        let Some(Orphan { sent, slot }) = state.links[l].orphans.pop_front() else {
            return;
        };
        let t = state.time;
        let conn = orphan_conn(c, slot);
        let on_old = state.nodes[usize::from(n)].swap_old_for(c);
        let node = &state.nodes[usize::from(n)];
        let bit = 1u8 << c;
        if !node.cut_off(c) && (node.dead | node.stale) & bit == 0 && (on_old || node.up(t)) {
            self.execute(state, c, n, &sent, conn);
        }
        let node = &mut state.nodes[usize::from(n)];
        node.keyspace.drop_connection(conn);
        if on_old {
            node.swap_old_for(c);
        }
    }

    fn receive(&self, state: &mut State, c: u8, n: u8) {
        let l = self.link(c, n);
        let Some(back) = state.links[l].replies.pop_front() else {
            return;
        };
        let ci = usize::from(c);
        if back.outcome == Outcome::Unknown && self.cfg.protocol.uses_watch() {
            // The adapter retires a connection whose request got no reply
            // and opens a new one for the next: the watches of the old one
            // are of no use to this client any more.
            let node = &mut state.nodes[usize::from(n)];
            node.keyspace.drop_connection(ConnId(u32::from(c)));
            node.connected &= !(1u8 << c);
        }
        if state.clients[ci].crashed {
            return;
        }
        let now = state.clients[ci].clock.at(state.time);
        state.clients[ci]
            .machine
            .handle_reply(now, back.id, back.outcome);
        self.drain(state, c);
    }

    /// The driver stops waiting for the oldest reply on the link: the
    /// machine gets an unknown outcome and the connection is retired. A
    /// request not yet run stays on the retired connection and may still
    /// run (a later one, on a new connection, may overtake it); a reply
    /// already on its way is never read.
    fn time_out(&self, state: &mut State, c: u8, n: u8) {
        let l = self.link(c, n);
        let link = &mut state.links[l];
        let (id, orphaned) = if let Some(back) = link.replies.pop_front() {
            (back.id, None)
        } else if let Some(sent) = link.requests.pop_front() {
            let id = sent.request.id;
            let slot = (0..8u8)
                .find(|k| link.orphans.iter().all(|o| o.slot != *k))
                .expect("fewer than 8 orphans on a link");
            link.orphans.push_back(Orphan { sent, slot });
            (id, Some(slot))
        } else {
            return;
        };
        // Replies still on their way come in on the retired connection,
        // which nobody reads: the client times out on each in turn.
        for back in &mut link.replies {
            back.lost = true;
        }
        let node = &mut state.nodes[usize::from(n)];
        let bit = 1u8 << c;
        node.connected &= !bit;
        node.dead &= !bit;
        node.stale &= !bit;
        let conn = ConnId(u32::from(c));
        if let Some(slot) = orphaned {
            node.keyspace.move_connection(conn, orphan_conn(c, slot));
        } else {
            node.keyspace.drop_connection(conn);
        }
        let ci = usize::from(c);
        let now = state.clients[ci].clock.at(state.time);
        state.clients[ci]
            .machine
            .handle_reply(now, id, Outcome::Unknown);
        self.drain(state, c);
    }

    /// Ghost bookkeeping of grants where the servers make them: a client
    /// whose token now holds on a quorum of nodes (one node but for RedLock)
    /// and did not before takes the next grant number.
    fn server_grants(&self, state: &mut State) {
        let t = state.time;
        let mut held_on = [0u8; 8];
        for node in &state.nodes {
            let mut owners = self.owners(node, node.now(t));
            if let Some(old) = &node.old {
                // A hold on the old master of a split brain is a hold on
                // the slot for the client it serves.
                owners |= self.owners_in(&old.keyspace, &old.writers, old.now(t));
            }
            for (c, count) in held_on.iter_mut().enumerate() {
                *count += (owners >> c) & 1;
            }
        }
        let quorum = self.cfg.nodes / 2 + 1;
        for (c, &held) in held_on.iter().enumerate().take(state.clients.len()) {
            let holding = held >= quorum;
            let seen = &state.clients[c];
            if seen.at_server == holding && !seen.gave_back {
                // Nothing changes: leave the client shared with the parent.
                continue;
            }
            let client = &mut state.clients[c];
            if holding && !client.at_server {
                state.grants += 1;
                client.grant = state.grants;
            } else if !holding && client.at_server && client.gave_back {
                // Its own release or undo ended the grant: nothing it
                // believes later can be that grant.
                client.grant = 0;
            }
            client.at_server = holding;
            client.gave_back = false;
        }
    }

    fn after_step(&self, state: &mut State) {
        self.server_grants(state);
        let t = state.time;
        // A node down or cut off from every client obstructs every client;
        // a cut of one client excuses that client alone (`progress`). So
        // does a paused client whose hold the servers still keep and that
        // will still give it back (acquiring, holding or releasing, not
        // done: a hold a finished client left behind is leaked, paused or
        // not): a paused holder counts as inside, and one paused after its
        // write, before its release went out, keeps the lock just as long.
        // (Without this, a waiter behind a paused releaser was judged from
        // the pause on, and behind a paused holder only from its
        // resumption.)
        let every = self.every_client();
        let obstructed = state.nodes.iter().any(|n| !n.up(t) || n.cut == every);
        let stuck_with_hold = state
            .clients
            .iter()
            .any(|c| c.paused && !c.crashed && c.at_server && c.phase != Phase::Done);
        if obstructed || stuck_with_hold || state.clients.iter().any(|c| c.inside(t)) {
            state.last_inside = t;
        }
    }

    /// The model's own invariant: before the horizon, some action is always
    /// enabled (no run stops early, leaving what follows unexplored).
    pub fn time_passes(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.enabled(state, &mut actions);
        state.time >= self.cfg.horizon || !actions.is_empty()
    }

    /// The model's own invariant: no message whose deadline binds is still
    /// in flight past it (time never passes a due message).
    pub fn deadlines_kept(&self, state: &State) -> bool {
        self.message_deadline(state)
            .is_none_or(|due| due >= state.time)
    }

    /// The verdict of `property` on `state`: `true` when it holds.
    pub fn holds_in(&self, property: PropertyId, state: &State) -> bool {
        if self.cfg.after_fault && state.budget & self.cfg.budget_bit(self.cfg.fault) != 0 {
            return true;
        }
        match property {
            PropertyId::MutualExclusion => {
                state
                    .clients
                    .iter()
                    .filter(|c| c.inside(state.time))
                    .count()
                    <= self.limit
            }
            PropertyId::FencedResource => !state.resource.stale_accepted,
            PropertyId::OwnerOnly => !state.owner_violation,
            PropertyId::Progress => state.clients.iter().enumerate().all(|(i, c)| {
                // A client cut off from so many nodes that it cannot reach a
                // quorum is excused while it is; its patience counts from
                // the heal (see `Action::Heal`).
                !c.runs()
                    || self.beyond_quorum(state, i as u8)
                    || c.waiting_since.is_none_or(|w| {
                        state.time.saturating_sub(w.max(state.last_inside)) <= self.cfg.patience()
                    })
            }),
        }
    }

    /// Is client `c` cut off from more nodes than a quorum can spare (from
    /// its one node, or for RedLock from a majority of the masters)? Such a
    /// client cannot acquire until a cut heals, so `progress` excuses it;
    /// one cut off from a single master of three still reaches a majority
    /// and is judged.
    fn beyond_quorum(&self, state: &State, c: u8) -> bool {
        let cut = state.nodes.iter().filter(|n| n.cut_off(c)).count();
        cut > usize::from(self.cfg.nodes - 1) / 2
    }

    /// One bit for each of the run's clients (a node cut off from all).
    fn every_client(&self) -> u8 {
        u8::MAX >> (8 - self.cfg.clients)
    }

    /// May a client-level fault (crash, pause, a client's clock step, a
    /// held or lost message, a client's cut from a node) strike client `c`? Clients start identical but for their token, and
    /// every step is defined alike for each, so renaming `c0` and `c1`
    /// maps any run in which `c1` is struck to one in which `c0` is: a
    /// symmetry reduction over identical clients. It does not hold where
    /// token order decides something (`zset-semaphore` breaks score ties by
    /// member name) or where clients differ (`client-skew`, which has no
    /// client-level fault anyway). With a fault pair, clients are alike
    /// only while one client-level fault may strike and neither fault is
    /// `client-skew`: a pair of two client-level faults, or one with
    /// `client-skew`, strikes any client. `delay` strikes twice (one
    /// message held up, one lost): its second strike may also hit client 1
    /// ([`LockModel::may_delay_client`]).
    fn may_strike(&self, c: u8) -> bool {
        let pair_breaks_symmetry = self.cfg.also.is_some()
            && (self.cfg.has(Fault::ClientSkew)
                || self
                    .cfg
                    .faults()
                    .filter(|f| {
                        matches!(
                            f,
                            Fault::Crash
                                | Fault::Pause
                                | Fault::ClientStep
                                | Fault::Delay
                                | Fault::ClientPartition
                                | Fault::SplitBrain
                        )
                    })
                    .count()
                    > 1);
        c == 0
            || !self.cfg.reductions.client_symmetry
            || pair_breaks_symmetry
            || self.cfg.protocol == ProtocolId::ZsetSemaphore
    }

    /// May a node fault strike node `n`? Nodes are interchangeable (every
    /// client treats them alike and their deliveries interleave freely), so
    /// a node fault need only strike node 0: a symmetry reduction. With a
    /// fault pair of two node faults (node 0's replica counts: it makes
    /// node 0 differ) the nodes differ once the first has struck, so any
    /// node may be struck.
    fn may_strike_node(&self, n: u8) -> bool {
        let node_faults = self
            .cfg
            .faults()
            .filter(|&f| self.distinguishes_nodes(f))
            .count();
        n == 0 || !self.cfg.reductions.node_symmetry || node_faults > 1
    }

    /// The first of the masters that are interchangeable
    /// ([`Reductions::master_symmetry`]): those a fault may single out by
    /// number come before it. A node fault strikes node 0 alone (or, with
    /// [`Reductions::node_symmetry`] off, any node; node 0 still differs:
    /// failover's replica and split-brain's old master are node 0's);
    /// `delay` strikes a link to any master where masters are renamed
    /// ([`LockModel::may_delay_on`]). Only RedLock has masters to rename;
    /// with fewer than two alike, the fingerprint is the plain one.
    fn alike_from(&self) -> u8 {
        let cfg = &self.cfg;
        if !self.renames_masters() {
            return cfg.nodes;
        }
        u8::from(cfg.faults().any(|f| self.distinguishes_nodes(f))).min(cfg.nodes)
    }

    /// May a `delay` strike (a message held up or lost) hit a link to node
    /// `n`? Nodes are interchangeable until a strike makes one differ, as
    /// for [`LockModel::may_strike_node`]: renaming nodes throughout a run
    /// maps it to another run of the model. So the first strike need only
    /// hit node 0, and the second (`delay` holds one message and loses one)
    /// node 0 again or node 1, which stands for every node not yet struck.
    /// A run with a node fault as well keeps every node: that fault is the
    /// one restricted to node 0, and the delay must stay free to strike
    /// wherever it strikes relative to it. So does a run that renames
    /// masters ([`Reductions::master_symmetry`]), where renaming stands for
    /// this rule. Single-node protocols have one node anyway.
    /// `strikes` is [`LockModel::delay_strikes`].
    fn may_delay_on(&self, n: u8, strikes: u8) -> bool {
        let node_fault = self.cfg.faults().any(|f| self.distinguishes_nodes(f));
        n <= strikes || !self.cfg.reductions.node_symmetry || node_fault || self.renames_masters()
    }

    /// Does the run treat interchangeable masters as one
    /// ([`Reductions::master_symmetry`])? Then `delay` may strike a link to
    /// any master ([`LockModel::may_delay_on`]): renaming covers what
    /// keeping the strikes to nodes 0 and 1 did, and more.
    fn renames_masters(&self) -> bool {
        self.cfg.reductions.master_symmetry && self.cfg.protocol == ProtocolId::Redlock
    }

    /// May a `delay` strike hit client `c`'s links? Where client symmetry
    /// keeps client-level faults to client 0 ([`LockModel::may_strike`]),
    /// `delay`'s first strike hits client 0 and its second client 0 or 1,
    /// which stands for every client not yet struck: once the first has
    /// struck, client 0 differs from the others.
    /// `strikes` is [`LockModel::delay_strikes`].
    fn may_delay_client(&self, c: u8, strikes: u8) -> bool {
        self.may_strike(c) || c <= strikes
    }

    /// How many of `delay`'s two strikes (one message held up, one lost)
    /// the run has used.
    fn delay_strikes(&self, state: &State) -> u8 {
        let held = u8::from(self.cfg.has(Fault::Delay)) - state.holds_left;
        let lost = u8::from(
            self.cfg.has(Fault::Delay) && state.budget & self.cfg.budget_bit(Fault::Delay) == 0,
        );
        held + lost
    }

    /// Does fault `f` make one node differ from the others (a node fault;
    /// node 0's replica counts)?
    fn distinguishes_nodes(&self, f: Fault) -> bool {
        f == Fault::ClockJump
            || matches!(
                f.family(),
                Family::Partition | Family::Restart | Family::Failover
            )
    }

    /// Every action enabled in `state`.
    pub fn enabled(&self, state: &State, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        let can = |f: Fault| state.budget & cfg.budget_bit(f) != 0;
        let delay_strikes = self.delay_strikes(state);
        for c in 0..cfg.clients {
            let client = &state.clients[usize::from(c)];
            let strike = self.may_strike(c);
            let now = client.clock.at(state.time);
            let delay_client =
                cfg.has(Fault::Delay) && !client.crashed && self.may_delay_client(c, delay_strikes);
            for n in 0..cfg.nodes {
                let link = &state.links[self.link(c, n)];
                let delay = delay_client && self.may_delay_on(n, delay_strikes);
                if delay && state.holds_left > 0 && link.requests.front().is_some_and(|m| !m.late) {
                    actions.push(Action::Hold { client: c, node: n });
                }
                if delay && can(Fault::Delay) {
                    if !link.requests.is_empty() {
                        actions.push(Action::LoseRequest { client: c, node: n });
                    }
                    let reply = link.replies.front().is_some_and(|r| !r.lost);
                    if reply || (link.replies.is_empty() && !link.requests.is_empty()) {
                        actions.push(Action::LoseReply { client: c, node: n });
                    }
                }
                // A crashed client's requests already on the wire arrive; a
                // paused client's wait for it to resume, as do its replies.
                if !link.requests.is_empty() && (!client.paused || client.crashed) {
                    let prompt = cfg.reductions.prompt_replies && client.runs();
                    if prompt && link.replies.is_empty() {
                        actions.push(Action::RoundTrip { client: c, node: n });
                    } else {
                        actions.push(Action::Deliver { client: c, node: n });
                    }
                }
                if !link.orphans.is_empty() {
                    actions.push(Action::DeliverOrphan { client: c, node: n });
                }
                if client.runs() {
                    if link.replies.front().is_some_and(|r| !r.lost) {
                        actions.push(Action::Receive { client: c, node: n });
                    }
                    if link.oldest_timeout().is_some_and(|d| d <= now) {
                        actions.push(Action::Timeout { client: c, node: n });
                    }
                }
            }
            if client.runs() {
                if client
                    .machine
                    .poll_timeout()
                    .is_some_and(|d| d <= client.clock.at(state.time))
                {
                    actions.push(Action::Timer(c));
                }
                match client.phase {
                    Phase::Holding(_) => actions.push(Action::Check(c)),
                    Phase::Checked(_) => actions.push(Action::Write(c)),
                    _ => {}
                }
                if strike && can(Fault::Crash) {
                    actions.push(Action::Crash(c));
                }
                if strike && can(Fault::Pause) {
                    actions.push(Action::Pause(c));
                }
                // A step while the client is paused reads as one at its
                // resumption: it reads its clock only when it takes a step
                // (and counts as inside while it is paused anyway).
                if strike && can(Fault::ClientStep) && now.get() >= CLOCK_STEP_BACK {
                    actions.push(Action::StepBack(c));
                }
            }
            if client.paused && !client.crashed {
                actions.push(Action::Resume(c));
            }
        }
        for n in 0..cfg.nodes {
            let node = &state.nodes[usize::from(n)];
            if self.may_strike_node(n) {
                if can(Fault::ClockJump) {
                    actions.push(Action::JumpClock(n));
                }
                if let Some(restart) = cfg.of_family(Family::Restart) {
                    if can(restart) {
                        actions.push(Action::Restart(n));
                    }
                }
                if can(Fault::Partition) {
                    actions.push(Action::Cut(n));
                }
                if can(Fault::ClientPartition) {
                    for c in (0..cfg.clients).filter(|&c| self.may_strike(c)) {
                        actions.push(Action::CutLink { client: c, node: n });
                    }
                }
            }
            if node.cut != 0 {
                actions.push(Action::Heal(n));
            }
        }
        if let Some(replica) = &state.nodes[0].replica {
            if !same_data(replica, &state.nodes[0].keyspace) {
                actions.push(Action::Replicate);
            }
            if cfg.of_family(Family::Failover).is_some_and(can) {
                if cfg.has(Fault::SplitBrain) {
                    for c in (0..cfg.clients).filter(|&c| self.may_strike(c)) {
                        actions.push(Action::Split(c));
                    }
                } else {
                    actions.push(Action::Promote);
                }
            }
        }
        if state.nodes[0].old.is_some() {
            actions.push(Action::Demote);
        }
        if let Some(t) = self.next_instant(state) {
            actions.push(Action::Tick(t));
        }
    }

    /// The state after `action`.
    pub fn step(&self, state: &State, action: &Action) -> Option<State> {
        let mut s = state.clone();
        match *action {
            Action::Deliver { client, node } => self.deliver(&mut s, client, node),
            Action::RoundTrip { client, node } => {
                self.deliver(&mut s, client, node);
                let back = s.links[self.link(client, node)].replies.front();
                if back.is_some_and(|b| !b.lost) {
                    self.receive(&mut s, client, node);
                }
            }
            Action::DeliverOrphan { client, node } => self.deliver_orphan(&mut s, client, node),
            Action::Timeout { client, node } => self.time_out(&mut s, client, node),
            Action::Receive { client, node } => self.receive(&mut s, client, node),
            Action::Timer(c) => {
                let ci = usize::from(c);
                let late = self.may_defer(&s, ci)
                    && s.clients[ci]
                        .machine
                        .poll_timeout()
                        .is_some_and(|d| d < s.clients[ci].clock.at(s.time));
                if late && self.cfg.reductions.bounded_late_retries {
                    s.late_retries_left -= 1;
                }
                let client = &mut s.clients[ci];
                let now = client.clock.at(s.time);
                client.machine.handle_timeout(now);
                self.drain(&mut s, c);
            }
            Action::Check(c) => {
                let client = &mut s.clients[usize::from(c)];
                let now = client.clock.at(s.time);
                if let Phase::Holding(lease) = &client.phase {
                    if now < lease.valid_until {
                        client.phase = Phase::Checked(lease.clone());
                    } else {
                        // Its validity ran out before it wrote: it skips the
                        // write and gives the lock back, as a front end's
                        // guard does when it is dropped. Leaving without the
                        // release would leak a hold that a renewing machine
                        // keeps alive for ever (`Mutation::LeaksItsHold`).
                        self.give_back(&mut s, c);
                    }
                }
            }
            Action::Write(c) => {
                let ci = usize::from(c);
                let Phase::Checked(lease) = s.clients[ci].phase.clone() else {
                    return None;
                };
                let grant = s.clients[ci].grant;
                let r = &mut s.resource;
                let accept = match (lease.fence, r.highest_fence) {
                    (Some(f), Some(h)) => f.0 >= h,
                    _ => true,
                };
                if accept {
                    if let Some(f) = lease.fence {
                        r.highest_fence = Some(f.0);
                    }
                    if grant < r.newest_grant {
                        r.stale_accepted = true;
                    }
                    r.newest_grant = r.newest_grant.max(grant);
                }
                if matches!(self.cfg.mutation, Some(Mutation::LeaksItsHold)) {
                    s.clients[ci].phase = Phase::Done;
                } else {
                    self.give_back(&mut s, c);
                }
            }
            Action::Tick(t) => {
                let late = s.links.iter().any(|l| {
                    let orphans = l.orphans.iter().map(|o| &o.sent);
                    l.requests.iter().chain(orphans).any(|m| m.late)
                });
                s.time = t;
                if late {
                    // A message held up beyond the latency bound obstructs
                    // like a cut.
                    s.last_inside = t;
                }
            }
            Action::Crash(c) => {
                s.budget &= !self.cfg.budget_bit(Fault::Crash);
                s.clients[usize::from(c)].crashed = true;
                s.clients[usize::from(c)].waiting_since = None;
            }
            Action::Pause(c) => {
                s.budget &= !self.cfg.budget_bit(Fault::Pause);
                s.clients[usize::from(c)].paused = true;
            }
            Action::StepBack(c) => {
                s.budget &= !self.cfg.budget_bit(Fault::ClientStep);
                s.clients[usize::from(c)].clock.back += CLOCK_STEP_BACK;
            }
            Action::Resume(c) => {
                let due = s.time + self.cfg.latency;
                for n in 0..self.cfg.nodes {
                    let link = &mut s.links[self.link(c, n)];
                    for m in link.requests.iter_mut() {
                        m.due = m.due.max(due);
                    }
                }
                let client = &mut s.clients[usize::from(c)];
                client.paused = false;
                // Patience counts only the time it runs.
                if client.waiting_since.is_some() {
                    client.waiting_since = Some(s.time);
                }
            }
            Action::JumpClock(n) => {
                s.budget &= !self.cfg.budget_bit(Fault::ClockJump);
                let node = &mut s.nodes[usize::from(n)];
                node.offset += self.cfg.ttl + 1;
                let now = node.now(s.time);
                node.keyspace.purge_expired(now);
            }
            Action::Restart(n) => {
                s.budget &= !self.cfg.family_bit(Family::Restart);
                let node = &mut s.nodes[usize::from(n)];
                node.lose_connections();
                // A restart takes time: `restart_ms` of true time pass
                // before the node answers again (a fence read from the
                // node's clock relies on it).
                let mut down = self.cfg.restart_ms;
                let kind = self.cfg.of_family(Family::Restart);
                match kind.unwrap_or(Fault::Restart) {
                    Fault::RestartPersisted => node.keyspace.drop_connections(),
                    Fault::RestartDelayed => {
                        node.keyspace.restart();
                        node.writers.clear();
                        down = self.cfg.ttl + 1;
                    }
                    _ => {
                        node.keyspace.restart();
                        node.writers.clear();
                    }
                }
                if kind == Some(Fault::ClockBack) {
                    node.offset -= CLOCK_STEP_BACK;
                }
                node.down_until = Some(s.time + down);
            }
            Action::Replicate => {
                let master = s.nodes[0].keyspace.clone();
                if let Some(replica) = &mut s.nodes[0].replica {
                    replica.replicate_from(&master);
                }
            }
            Action::Promote | Action::Split(_) => {
                s.budget &= !self.cfg.family_bit(Family::Failover);
                let t = s.time;
                let node = &mut s.nodes[0];
                if let Some(replica) = node.replica.take() {
                    if let Action::Split(c) = *action {
                        // `split-brain`: the old master stays up, serving
                        // client `c`, whose connection goes on there; the
                        // others' connections still lead to it, across the
                        // cut: their requests are lost until they time out.
                        node.old = Some(Box::new(OldMaster {
                            keyspace: node.keyspace.clone(),
                            offset: node.offset,
                            writers: node.writers.clone(),
                            client: c,
                        }));
                        node.stale = self.every_client() & !(1u8 << c);
                    } else {
                        node.lose_connections();
                    }
                    node.keyspace.replicate_from(&replica);
                    node.keyspace.drop_connections();
                    // The promotion takes time, as a restart does.
                    node.down_until = Some(t + self.cfg.restart_ms);
                    // The replica is another machine. With a fault pair,
                    // what struck the old master's slot does not carry
                    // over: the replica's clock reads as node clocks start
                    // (less the lag under `failover-clock-lag`), not as a
                    // jumped or stepped-back one, and a cut isolated the
                    // old master, not it. (A single fault leaves these as
                    // they start, so this changes no single-fault run.)
                    node.offset = NODE_CLOCK_START;
                    node.cut = 0;
                    if self.cfg.has(Fault::FailoverClockLag) {
                        node.offset -= CLOCK_STEP_BACK;
                    }
                }
            }
            Action::Demote => {
                let t = s.time;
                let old = s.nodes[0].old.take()?;
                // Its own client and the others whose connection still led
                // to it: Sentinel's reconfiguration kills those connections.
                let on_old = std::mem::take(&mut s.nodes[0].stale) | 1u8 << old.client;
                for c in (0..self.cfg.clients).filter(|c| on_old & (1u8 << c) != 0) {
                    let bit = 1u8 << c;
                    let l = self.link(c, 0);
                    let in_flight = !s.links[l].requests.is_empty();
                    let node = &mut s.nodes[0];
                    if node.connected & bit != 0 {
                        // A connection of its own (the protocols that
                        // `WATCH`): the client notices at its next request,
                        // or now if a request of its is on the way (its
                        // failure, below, retires the connection).
                        node.connected &= !bit;
                        if !in_flight {
                            node.dead |= bit;
                        }
                    }
                    // What the client has on the way fails with the
                    // connection: a request not yet run never runs, and its
                    // sender learns at once that the outcome is unknown.
                    // Replies already on their way still arrive; requests
                    // on retired connections die with them.
                    let link = &mut s.links[l];
                    while let Some(sent) = link.requests.pop_front() {
                        link.replies.push_back(Returning {
                            id: sent.request.id,
                            outcome: Outcome::Unknown,
                            due: t + self.cfg.latency,
                            timeout: sent.timeout,
                            lost: false,
                        });
                    }
                    link.orphans.clear();
                }
            }
            Action::Hold { client, node } => {
                s.holds_left -= 1;
                let l = self.link(client, node);
                let mut held = None;
                for (i, m) in s.links[l].requests.iter_mut().enumerate() {
                    if i == 0 {
                        m.due += self.cfg.ttl;
                        m.late = true;
                        held = Some(m.due);
                    } else if let Some(due) = held {
                        // Behind it on the same connection: no earlier.
                        m.due = m.due.max(due);
                    }
                }
            }
            Action::LoseRequest { client, node } => {
                s.budget &= !self.cfg.budget_bit(Fault::Delay);
                let l = self.link(client, node);
                if let Some(sent) = s.links[l].requests.pop_front() {
                    s.links[l].replies.push_back(Returning {
                        id: sent.request.id,
                        outcome: Outcome::Unknown,
                        due: sent.due,
                        timeout: sent.timeout,
                        lost: true,
                    });
                }
            }
            Action::LoseReply { client, node } => {
                s.budget &= !self.cfg.budget_bit(Fault::Delay);
                let l = self.link(client, node);
                if s.links[l].replies.is_empty() {
                    // The request runs; its reply never comes back.
                    self.deliver(&mut s, client, node);
                }
                if let Some(front) = s.links[l].replies.front_mut() {
                    front.lost = true;
                }
            }
            Action::Cut(n) => {
                s.budget &= !self.cfg.budget_bit(Fault::Partition);
                s.nodes[usize::from(n)].cut = self.every_client();
            }
            Action::CutLink { client, node } => {
                s.budget &= !self.cfg.budget_bit(Fault::ClientPartition);
                s.nodes[usize::from(node)].cut |= 1u8 << client;
            }
            Action::Heal(n) => {
                // A client cut off alone from a quorum waited without
                // reaching it: as after a pause, its patience counts from
                // now. (A cut of every client holds every waiter's patience
                // back through `State::last_inside` instead; a client that
                // still reached a quorum was judged throughout.)
                if s.nodes[usize::from(n)].cut != self.every_client() {
                    let excused: Vec<bool> = (0..self.cfg.clients)
                        .map(|c| self.beyond_quorum(&s, c))
                        .collect();
                    for (client, excused) in s.clients.iter_mut().zip(excused) {
                        if excused && client.waiting_since.is_some() {
                            client.waiting_since = Some(s.time);
                        }
                    }
                }
                s.nodes[usize::from(n)].cut = 0;
            }
        }
        self.after_step(&mut s);
        Some(s)
    }

    /// A readable account of `state`: true time, clocks, keys, beliefs.
    pub fn describe(&self, state: &State) -> String {
        let mut out = String::new();
        let _ = write!(out, "t={}", state.time);
        for (i, c) in state.clients.iter().enumerate() {
            let _ = write!(out, " | c{i}@{}", c.clock.at(state.time).get());
            let phase = match &c.phase {
                Phase::Acquiring => "acquiring".to_owned(),
                Phase::Holding(l) => format!("holds until {}{}", l.valid_until.get(), fence(l)),
                Phase::Checked(l) => format!("checked, writes{}", fence(l)),
                Phase::Releasing => "releasing".to_owned(),
                Phase::Done => "done".to_owned(),
            };
            let _ = write!(out, " {phase}");
            if c.crashed {
                out.push_str(" CRASHED");
            }
            if c.paused {
                out.push_str(" PAUSED");
            }
        }
        for (i, n) in state.nodes.iter().enumerate() {
            let now = n.now(state.time);
            let _ = write!(out, " | n{i}@{} {}", now.get(), n.keyspace.render(now));
            if n.cut == self.every_client() {
                out.push_str(" CUT");
            } else if n.cut != 0 {
                for c in 0..self.cfg.clients {
                    if n.cut_off(c) {
                        let _ = write!(out, " CUT(c{c})");
                    }
                }
            }
            if n.down_until.is_some_and(|u| state.time < u) {
                out.push_str(" DOWN");
            }
            for c in (0..self.cfg.clients).filter(|c| n.stale & (1u8 << c) != 0) {
                let _ = write!(out, " STALE(c{c})");
            }
            if let Some(old) = &n.old {
                let now = old.now(state.time);
                let _ = write!(
                    out,
                    " | n{i}'s old master for c{}@{} {}",
                    old.client,
                    now.get(),
                    old.keyspace.render(now)
                );
            }
        }
        out
    }

    /// A readable account of `action` taken from `state`.
    pub fn describe_action(&self, state: &State, action: &Action) -> String {
        match action {
            Action::Deliver { client, node } => {
                let l = &state.links[self.link(*client, *node)];
                let Some(sent) = l.requests.front() else {
                    return format!("n{node} runs c{client}'s request");
                };
                let reply = match self.answer(state, *client, *node) {
                    Some(Outcome::Reply(reply)) => format!("→ {}", reply_text(&reply)),
                    _ if state.nodes[usize::from(*node)].cut_off(*client) => {
                        "(lost in the cut)".to_owned()
                    }
                    _ => "→ no reply (unknown outcome)".to_owned(),
                };
                format!(
                    "n{node} runs c{client}'s {} {reply}",
                    command_text(&sent.request.command)
                )
            }
            Action::RoundTrip { client, node } => self.describe_action(
                state,
                &Action::Deliver {
                    client: *client,
                    node: *node,
                },
            ),
            Action::DeliverOrphan { client, node } => {
                let l = &state.links[self.link(*client, *node)];
                match l.orphans.front().map(|o| &o.sent) {
                    Some(sent) => format!(
                        "n{node} runs c{client}'s late {} (nobody reads the reply)",
                        command_text(&sent.request.command)
                    ),
                    None => format!("n{node} runs c{client}'s late request"),
                }
            }
            Action::Timeout { client, node } => {
                format!("c{client} times out waiting for n{node} (unknown outcome)")
            }
            Action::Receive { client, node } => {
                let l = &state.links[self.link(*client, *node)];
                match l.replies.front().map(|b| &b.outcome) {
                    Some(Outcome::Reply(r)) => {
                        format!("c{client} gets {} from n{node}", reply_text(r))
                    }
                    Some(Outcome::Unknown) => {
                        format!("c{client} gets no reply from n{node} (unknown outcome)")
                    }
                    None => format!("c{client} receives from n{node}"),
                }
            }
            Action::Timer(c) => format!("c{c}'s timer fires"),
            Action::Check(c) => format!("c{c} checks its validity"),
            Action::Write(c) => format!("c{c} writes to the resource and releases"),
            Action::Tick(t) => format!("time passes to {t}"),
            Action::Crash(c) => format!("c{c} crashes"),
            Action::Pause(c) => format!("c{c} pauses"),
            Action::StepBack(c) => format!("c{c}'s clock steps back by {CLOCK_STEP_BACK} ms"),
            Action::Resume(c) => format!("c{c} resumes"),
            Action::JumpClock(n) => format!("n{n}'s clock jumps forward by {}", self.cfg.ttl + 1),
            Action::Restart(n) if self.cfg.has(Fault::ClockBack) => {
                format!("n{n} restarts empty, its clock {CLOCK_STEP_BACK} ms behind")
            }
            Action::Restart(n) => format!(
                "n{n} restarts ({})",
                self.cfg
                    .of_family(Family::Restart)
                    .unwrap_or(Fault::Restart)
            ),
            Action::Replicate => "n0's replica catches up".to_owned(),
            Action::Promote if self.cfg.has(Fault::FailoverClockLag) => {
                format!("n0's replica, its clock {CLOCK_STEP_BACK} ms behind, is promoted")
            }
            Action::Promote => "n0's replica is promoted".to_owned(),
            Action::Split(c) => {
                format!("n0's replica is promoted; c{c} still reaches the old master (split brain)")
            }
            Action::Demote => {
                "the old master learns of the promotion: it drops its writes and its clients"
                    .to_owned()
            }
            Action::Hold { client, node } => {
                format!("c{client}'s request to n{node} is held up past the TTL")
            }
            Action::LoseRequest { client, node } => {
                format!("c{client}'s request to n{node} is lost")
            }
            Action::LoseReply { client, node } => {
                let l = &state.links[self.link(*client, *node)];
                if l.replies.is_empty() {
                    let ran = self.describe_action(
                        state,
                        &Action::Deliver {
                            client: *client,
                            node: *node,
                        },
                    );
                    format!("{ran}, and the reply to c{client} is lost")
                } else {
                    format!("n{node}'s reply to c{client} is lost")
                }
            }
            Action::Cut(n) => format!("n{n} is cut off"),
            Action::CutLink { client, node } => format!("c{client} is cut off from n{node}"),
            Action::Heal(n) => format!("n{n}'s cut heals"),
        }
    }
}

fn fence(l: &Lease) -> String {
    l.fence
        .map(|f| format!(" (fence {})", f.0))
        .unwrap_or_default()
}

fn same_data(a: &Keyspace, b: &Keyspace) -> bool {
    a.entries().eq(b.entries())
}

/// A short rendering of a command, as `redis-cli` would show it.
pub fn command_text(c: &Command) -> String {
    match c {
        Command::Transaction(cmds) => format!(
            "MULTI; {}; EXEC",
            cmds.iter().map(command_text).collect::<Vec<_>>().join("; ")
        ),
        Command::Eval { script, keys, args } => {
            format!(
                "EVALSHA <{}> {} {}",
                script.name(),
                keys.join(" "),
                args.join(" ")
            )
        }
        other => match other.argv() {
            Some(argv) => argv.join(" "),
            None => format!("{other:?}"),
        },
    }
}

/// A short rendering of a reply.
pub fn reply_text(r: &Reply) -> String {
    match r {
        Reply::Nil => "nil".to_owned(),
        Reply::Status(s) => s.to_string(),
        Reply::Int(n) => format!("(integer) {n}"),
        Reply::Bulk(s) => format!("{s:?}"),
        Reply::Array(items) => format!(
            "[{}]",
            items.iter().map(reply_text).collect::<Vec<_>>().join(", ")
        ),
        Reply::Error(e) => format!("(error) {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    /// Every permutation `to` of `0..n` that leaves `0..fixed` in place
    /// (master `i` becomes master `to[i]`).
    fn renamings(n: usize, fixed: usize) -> Vec<Vec<usize>> {
        fn extend(prefix: &mut Vec<usize>, n: usize, out: &mut Vec<Vec<usize>>) {
            if prefix.len() == n {
                out.push(prefix.clone());
                return;
            }
            for next in 0..n {
                if !prefix.contains(&next) {
                    prefix.push(next);
                    extend(prefix, n, out);
                    prefix.pop();
                }
            }
        }
        let mut out = Vec::new();
        extend(&mut (0..fixed).collect(), n, &mut out);
        out
    }

    /// The state with its masters renamed (`to`), written out in full,
    /// each request id written as the master whose current request it is,
    /// or as stale, and each crashed client blanked to what the rest of the
    /// run can observe of it (its machine replaced by `blank`, its
    /// requests' ids and timeouts zeroed, its replies dropped): the oracle
    /// the fingerprint of master symmetry and of forgotten crashed clients
    /// is held to. It shares no code with the fingerprint: it moves the
    /// parts themselves and compares their whole text.
    fn renamed_text(state: &State, to: &[usize], blank: &Machine) -> String {
        let n = state.nodes.len();
        let mut t = state.clone();
        t.alike_from = 0;
        t.forget_crashed = false;
        for (i, &ti) in to.iter().enumerate() {
            t.nodes[ti] = state.nodes[i].clone();
        }
        for c in 0..state.clients.len() {
            let crashed = state.clients[c].crashed;
            let current: Vec<Option<RequestId>> = match &state.clients[c].machine {
                Machine::Redlock(m) => (0..n).map(|i| m.round_request(i)).collect(),
                _ => vec![None; n],
            };
            let id = |id: RequestId| match current.iter().position(|&r| r == Some(id)) {
                _ if crashed => RequestId(0),
                Some(i) => RequestId(to[i] as u64),
                None => RequestId(u64::MAX),
            };
            if crashed {
                t.clients[c] = ClientState {
                    machine: blank.clone(),
                    clock: ClientClock::EXACT,
                    phase: Phase::Done,
                    paused: false,
                    crashed: true,
                    waiting_since: None,
                    grant: 0,
                    at_server: state.clients[c].at_server,
                    gave_back: false,
                    probe: None,
                };
            } else if let Machine::Redlock(m) = &mut t.clients[c].machine {
                m.rename_masters(to, id);
            }
            for (i, &ti) in to.iter().enumerate() {
                let mut link = state.links[c * n + i].clone();
                let fix = |sent: &mut Sent| {
                    let mut request = (*sent.request).clone();
                    request.id = id(request.id);
                    request.node = lockwright_core::NodeId(ti as u8);
                    sent.request = Arc::new(request);
                    if crashed {
                        sent.timeout = Millis(0);
                    }
                };
                link.requests.iter_mut().for_each(fix);
                link.orphans.iter_mut().for_each(|o| fix(&mut o.sent));
                for back in &mut link.replies {
                    back.id = id(back.id);
                }
                if crashed {
                    link.replies.clear();
                }
                t.links[c * n + ti] = link;
            }
        }
        format!("{t:?}")
    }

    /// The faults that single out node 0 (it keeps its place).
    const NODE_FAULTS: [Fault; 7] = [
        Fault::ClockJump,
        Fault::ClockBack,
        Fault::Restart,
        Fault::Failover,
        Fault::SplitBrain,
        Fault::Partition,
        Fault::ClientPartition,
    ];

    fn digest(s: &State) -> u64 {
        let mut h = digest_hasher();
        s.hash(&mut h);
        h.finish()
    }

    /// The fingerprint the checker takes of a state where masters from
    /// `alike_from` on are renamed and crashed clients forgotten.
    fn symmetric_print(s: &State, alike_from: u8) -> u64 {
        let mut r = s.clone();
        r.alike_from = alike_from;
        r.forget_crashed = true;
        digest(&r)
    }

    /// Over every state a small RedLock run under `fault` reaches with
    /// master symmetry off (breadth first, up to a cap), do the classes of
    /// `print` and of [`renamed_text`]'s smallest text agree?
    fn classes_agree(fault: Fault, print: fn(&State, u8) -> u64) -> Result<(), String> {
        let mut cfg = ModelConfig::new(ProtocolId::Redlock, fault);
        cfg.clients = 2;
        cfg.horizon = cfg.ttl / 2;
        let fixed = usize::from(NODE_FAULTS.contains(&fault));
        classes_agree_in(cfg, fixed, print)
    }

    /// Over every state a small run of `cfg` reaches with master symmetry
    /// and forgotten crashed clients off (breadth first, up to a cap), do
    /// the classes of `print` and of [`renamed_text`]'s smallest text
    /// (masters from `fixed` on renamed) agree? `Err` names the first two
    /// states where they do not, or says that no two states merged.
    fn classes_agree_in(
        cfg: ModelConfig,
        fixed: usize,
        print: fn(&State, u8) -> u64,
    ) -> Result<(), String> {
        classes_agree_capped(cfg, fixed, print, 6_000).map(|_| ())
    }

    /// [`classes_agree_in`] over the first `cap` states; returns them, with
    /// the model they were reached in (master symmetry and forgotten
    /// crashed clients off).
    fn classes_agree_capped(
        mut cfg: ModelConfig,
        fixed: usize,
        print: fn(&State, u8) -> u64,
        cap: usize,
    ) -> Result<(Vec<State>, LockModel), String> {
        let what = match cfg.also {
            Some(also) => format!("{} {}+{also}", cfg.protocol, cfg.fault),
            None => format!("{} {}", cfg.protocol, cfg.fault),
        };
        let reduced = LockModel::new(cfg.clone(), vec![PropertyId::MutualExclusion]).unwrap();
        cfg.reductions.master_symmetry = false;
        cfg.reductions.forget_crashed = false;
        let full = LockModel::new(cfg, vec![PropertyId::MutualExclusion]).unwrap();
        assert_eq!(usize::from(reduced.alike_from()), fixed, "{what}");
        let initial = full.initial();
        let blank = initial.clients[0].machine.clone();
        let mut seen = std::collections::HashSet::new();
        let mut queue = VecDeque::from([initial]);
        let mut states = Vec::new();
        while let Some(s) = queue.pop_front() {
            if states.len() == cap {
                break;
            }
            if !seen.insert(digest(&s)) {
                continue;
            }
            let mut actions = Vec::new();
            full.enabled(&s, &mut actions);
            queue.extend(actions.iter().filter_map(|a| full.step(&s, a)));
            states.push(s);
        }
        let perms = renamings(usize::from(reduced.cfg.nodes), fixed);
        let mut by_print = std::collections::HashMap::new();
        let mut by_text = std::collections::HashMap::new();
        for s in &states {
            let print = print(s, reduced.alike_from());
            let text = perms
                .iter()
                .map(|to| renamed_text(s, to, &blank))
                .min()
                .unwrap();
            if *by_text.entry(text.clone()).or_insert(print) != print {
                return Err(format!(
                    "{what}: renamings of one state have two fingerprints:\n{s:?}"
                ));
            }
            let print_text = by_print.entry(print).or_insert(text.clone());
            if *print_text != text {
                return Err(format!(
                    "{what}: one fingerprint for states no renaming relates:\n{print_text}\n{text}"
                ));
            }
        }
        if by_print.len() == states.len() {
            return Err(format!(
                "{what}: no two of the {} states merged",
                states.len()
            ));
        }
        Ok((states, full))
    }

    /// Master symmetry's fingerprint merges two states exactly when some
    /// renaming of the interchangeable masters turns one into the other
    /// (request ids as current or stale, crashed clients forgotten), under
    /// every fault that renames differently (none, one master kept in
    /// place). Two mutants of the fingerprint fail the same comparison
    /// below; a third, which hashes every request id as stale, passes it:
    /// in the states these runs reach, whether a message answers the
    /// current round follows from the rest of the state.
    #[test]
    fn master_symmetry_merges_exactly_the_renamings() {
        for fault in [Fault::None, Fault::Crash, Fault::Delay]
            .into_iter()
            .chain(NODE_FAULTS)
        {
            classes_agree(fault, symmetric_print).unwrap();
        }
    }

    /// The comparison can fail: a fingerprint that leaves the masters'
    /// data out (every node's keyspace emptied first) merges states no
    /// renaming relates (under `restart`, which empties one master and not
    /// the others; under `none` the keys follow from the rounds' answers),
    /// and one that does not sort the parts of the
    /// masters (the plain fingerprint) gives renamings of one state two
    /// fingerprints.
    #[test]
    fn master_symmetry_mutants_fail_the_comparison() {
        fn without_data(s: &State, alike_from: u8) -> u64 {
            let mut r = s.clone();
            for node in r.nodes.iter_mut() {
                node.keyspace = Keyspace::new();
            }
            symmetric_print(&r, alike_from)
        }
        fn unsorted(s: &State, _: u8) -> u64 {
            symmetric_print(s, u8::MAX)
        }
        let lacks = classes_agree(Fault::Restart, without_data)
            .expect_err("the fingerprint without the masters' data");
        assert!(lacks.contains("no renaming relates"), "{lacks}");
        let split = classes_agree(Fault::None, unsorted).expect_err("the unsorted fingerprint");
        assert!(split.contains("two fingerprints"), "{split}");
    }

    /// The small single-node runs the fingerprint of forgotten crashed
    /// clients is compared on: a recipe whose rule records a probe
    /// (`setnx-getset`, also with the crashed client's link cut), one that
    /// `WATCH`es on a connection of its own (`set-px-watch`, under pairs
    /// that kill connections too: a restart, a split brain's demotion), one
    /// with a late undo (`set-px-get-del`, under `delay` too, whose held-up
    /// request outlives its timeout on a retired connection) and a
    /// semaphore.
    fn crash_runs() -> Vec<ModelConfig> {
        let run = |protocol, also| {
            let mut cfg = ModelConfig::new(protocol, Fault::Crash);
            cfg.clients = 2;
            cfg.horizon = cfg.ttl + 1_000;
            cfg.also = also;
            cfg
        };
        vec![
            run(ProtocolId::SetnxGetset, None),
            run(ProtocolId::SetnxGetset, Some(Fault::ClientPartition)),
            run(ProtocolId::SetPxWatch, Some(Fault::Restart)),
            run(ProtocolId::SetPxWatch, Some(Fault::SplitBrain)),
            run(ProtocolId::SetPxGetDel, Some(Fault::Delay)),
            run(ProtocolId::LeaseSemaphore, None),
        ]
    }

    /// Forgetting a crashed client's dead state
    /// ([`Reductions::forget_crashed`]) merges two states exactly when they
    /// differ only in what the rest of the run cannot observe (the
    /// oracle's blanked text), on single-node runs (RedLock's with master
    /// symmetry are compared above, `crash` among them).
    ///
    /// The oracle blanks the fields the fingerprint leaves out, so it shows
    /// that the fingerprint keeps the rest, not that what it leaves out is
    /// never read: the test also checks that directly. Of every two states
    /// it reaches with one fingerprint, it requires the same enabled
    /// actions, in the same order, successors with pairwise the same
    /// fingerprints, and the same value of every property and of the
    /// model's own invariants; and that such states were met with a crashed
    /// client's request still on the wire and on a retired connection.
    #[test]
    fn forgetting_crashed_clients_merges_exactly_their_dead_state() {
        let (mut merged, mut on_wire, mut orphaned) = (0, 0, 0);
        for cfg in crash_runs() {
            let what = format!("{} {} {:?}", cfg.protocol, cfg.fault, cfg.also);
            let (states, full) = classes_agree_capped(cfg, 1, symmetric_print, 20_000).unwrap();
            let print = |s: &State| symmetric_print(s, 1);
            let mut first = std::collections::HashMap::new();
            for b in &states {
                let Some(a) = first.insert(print(b), b) else {
                    continue;
                };
                first.insert(print(b), a);
                merged += 1;
                let n = usize::from(full.cfg.nodes);
                let dead_links = || {
                    (0..b.clients.len())
                        .filter(|&c| b.clients[c].crashed)
                        .flat_map(|c| (c * n..(c + 1) * n).map(|l| &b.links[l]))
                };
                on_wire += usize::from(dead_links().any(|l| !l.requests.is_empty()));
                orphaned += usize::from(dead_links().any(|l| !l.orphans.is_empty()));
                let (mut x, mut y) = (Vec::new(), Vec::new());
                full.enabled(a, &mut x);
                full.enabled(b, &mut y);
                assert_eq!(x, y, "{what}: merged states enable different actions");
                for action in &x {
                    let next = |s: &State| full.step(s, action).map(|t| print(&t));
                    assert_eq!(next(a), next(b), "{what}: {action:?} parts merged states");
                }
                for property in PropertyId::ALL {
                    assert_eq!(
                        full.holds_in(property, a),
                        full.holds_in(property, b),
                        "{what}: merged states differ in {property}"
                    );
                }
                assert_eq!(full.time_passes(a), full.time_passes(b), "{what}");
                assert_eq!(full.deadlines_kept(a), full.deadlines_kept(b), "{what}");
            }
        }
        assert!(
            merged > 0 && on_wire > 0,
            "{merged} merged, {on_wire} on the wire"
        );
        assert!(
            orphaned > 0,
            "no merged state has a crashed client's orphan"
        );
    }

    /// The comparison can fail: a fingerprint that forgets nothing gives
    /// one class two fingerprints, and one that also forgets the requests
    /// a crashed client left on the wire (which still run) or their
    /// deadlines merges states the oracle tells apart. (Forgetting whether
    /// the servers hold for it is no such mutant: `at_server` is set from
    /// the nodes' data after every step, so it follows from the rest of
    /// the state; the fingerprint keeps it all the same.)
    #[test]
    fn forgetting_mutants_fail_the_comparison() {
        fn remembering(s: &State, _: u8) -> u64 {
            digest(s)
        }
        fn without_requests(s: &State, alike_from: u8) -> u64 {
            let mut r = s.clone();
            let n = r.nodes.len();
            for c in 0..r.clients.len() {
                if r.clients[c].crashed {
                    for l in c * n..(c + 1) * n {
                        r.links[l].requests.clear();
                    }
                }
            }
            symmetric_print(&r, alike_from)
        }
        fn without_orphans(s: &State, alike_from: u8) -> u64 {
            let mut r = s.clone();
            let n = r.nodes.len();
            for c in 0..r.clients.len() {
                if r.clients[c].crashed {
                    for l in c * n..(c + 1) * n {
                        r.links[l].orphans.clear();
                    }
                }
            }
            symmetric_print(&r, alike_from)
        }
        fn without_deadlines(s: &State, alike_from: u8) -> u64 {
            let mut r = s.clone();
            let n = r.nodes.len();
            for c in 0..r.clients.len() {
                if r.clients[c].crashed {
                    for l in c * n..(c + 1) * n {
                        r.links[l].requests.iter_mut().for_each(|m| m.due = 0);
                    }
                }
            }
            symmetric_print(&r, alike_from)
        }
        let runs = crash_runs();
        let split = classes_agree_in(runs[0].clone(), 1, remembering)
            .expect_err("the fingerprint that forgets nothing");
        assert!(split.contains("two fingerprints"), "{split}");
        let any_fails = |print: fn(&State, u8) -> u64| {
            runs.iter().find_map(|cfg| {
                classes_agree_in(cfg.clone(), 1, print)
                    .err()
                    .filter(|e| e.contains("no renaming relates"))
            })
        };
        assert!(
            any_fails(without_requests).is_some(),
            "forgetting requests passes"
        );
        assert!(
            any_fails(without_orphans).is_some(),
            "forgetting the requests on retired connections passes"
        );
        assert!(
            any_fails(without_deadlines).is_some(),
            "forgetting the requests' deadlines passes"
        );
    }

    #[test]
    fn clocks_convert_both_ways() {
        let fast = ClientClock::with_rate_ppt(100, 1_500);
        assert_eq!(fast.at(0), Millis(100));
        assert_eq!(fast.at(10), Millis(115));
        // The first true instant at which the reading reaches 116 is 11.
        assert_eq!(fast.true_time_of(Millis(116)), Some(11));
        assert_eq!(fast.at(11), Millis(116));
        assert_eq!(fast.true_time_of(Millis(50)), Some(0));
        let slow = ClientClock::with_rate_ppt(0, 999);
        for reading in [1, 998, 999, 1_000, 123_457] {
            let t = slow.true_time_of(Millis(reading)).unwrap();
            assert!(slow.at(t) >= Millis(reading));
            assert!(slow.at(t - 1) < Millis(reading));
        }
        assert_eq!(ClientClock::default(), ClientClock::EXACT);
    }

    #[test]
    fn a_stepped_clock_reads_back_and_its_deadlines_come_later() {
        let mut clock = ClientClock::EXACT;
        clock.back = CLOCK_STEP_BACK;
        assert_eq!(clock.at(2_000), Millis(1_500));
        // A deadline at reading 9_898 (a lease granted at 0) now falls
        // 500 ms of true time later.
        assert_eq!(clock.true_time_of(Millis(9_898)), Some(10_398));
        assert_eq!(clock.at(10_398), Millis(9_898));
        assert_eq!(clock.at(10_397), Millis(9_897));
    }

    #[test]
    fn a_step_strikes_once_and_only_a_clock_that_reads_past_it() {
        let model = LockModel::new(
            ModelConfig::new(ProtocolId::SetPxLua, Fault::ClientStep),
            vec![PropertyId::MutualExclusion],
        )
        .unwrap();
        let mut state = model.initial();
        let steps = |state: &State| {
            let mut actions = Vec::new();
            model.enabled(state, &mut actions);
            actions
                .into_iter()
                .filter(|a| matches!(a, Action::StepBack(_)))
                .collect::<Vec<_>>()
        };
        assert!(steps(&state).is_empty(), "the clock reads 0");
        state.time = CLOCK_STEP_BACK;
        // Client symmetry: client 0 stands for every client.
        assert_eq!(steps(&state), [Action::StepBack(0)]);
        let stepped = model.step(&state, &Action::StepBack(0)).unwrap();
        assert_eq!(stepped.clients[0].clock.at(stepped.time), Millis(0));
        assert_eq!(stepped.clients[1].clock.at(stepped.time), Millis(500));
        assert!(steps(&stepped).is_empty(), "one step per run");
    }

    #[test]
    fn parts_print_and_compare_as_the_vector_they_stand_for() {
        let v: Vec<String> = vec!["a".into(), "bc".into()];
        let parts: Parts<String> = v.iter().cloned().collect();
        assert_eq!(format!("{parts:?}"), format!("{v:?}"));
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts.iter().collect::<Vec<_>>(),
            v.iter().collect::<Vec<_>>()
        );
        let same: Parts<String> = v.iter().cloned().collect();
        assert_eq!(parts, same);
    }

    #[test]
    fn parts_hash_as_their_elements_and_a_write_changes_the_hash() {
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        let parts: Parts<String> = ["a", "b"].into_iter().map(String::from).collect();
        let same: Parts<String> = ["a", "b"].into_iter().map(String::from).collect();
        assert_eq!(h.hash_one(&parts), h.hash_one(&same));
        let swapped: Parts<String> = ["b", "a"].into_iter().map(String::from).collect();
        assert_ne!(h.hash_one(&parts), h.hash_one(&swapped));
        let longer: Parts<String> = ["a", "b", ""].into_iter().map(String::from).collect();
        assert_ne!(h.hash_one(&parts), h.hash_one(&longer));
        // The digest of an element is kept once taken; a write must drop
        // it, or the successor would hash as its parent.
        let mut next = parts.clone();
        next[1].push('!');
        assert_ne!(h.hash_one(&parts), h.hash_one(&next));
        for s in next.iter_mut() {
            s.clear();
        }
        let empty: Parts<String> = ["", ""].into_iter().map(String::from).collect();
        assert_eq!(h.hash_one(&next), h.hash_one(&empty));
        next[0].push('!');
        next[0].pop();
        assert_eq!(h.hash_one(&next), h.hash_one(&empty));
    }

    /// A model of `protocol` and its initial state, where every client is
    /// acquiring, with `run` executing one client's command on node 0.
    fn judged(protocol: ProtocolId) -> (LockModel, State) {
        let model = LockModel::new(
            ModelConfig::new(protocol, Fault::None),
            vec![PropertyId::OwnerOnly],
        )
        .unwrap();
        let state = model.initial();
        (model, state)
    }

    /// Client `c` sends `command` to node 0, as `drain` does.
    fn send(state: &mut State, c: u8, command: Command) -> Sent {
        let request = Request {
            id: RequestId(0),
            node: lockwright_core::NodeId(0),
            command,
        };
        let by_rule = LockModel::sent_by_rule(&mut state.clients[usize::from(c)], &request);
        Sent {
            request: Arc::new(request),
            due: 0,
            timeout: Millis(0),
            late: false,
            by_rule,
        }
    }

    /// Client `c` sends `command` and node 0 runs it on its current
    /// connection.
    fn run(model: &LockModel, state: &mut State, c: u8, command: Command) -> Reply {
        let sent = send(state, c, command);
        model.execute(state, c, 0, &sent, ConnId(u32::from(c)))
    }

    fn key() -> String {
        "{r}".to_owned()
    }

    /// Client `c`'s `TTL` finds the key without expiry.
    fn ttl_reads_none(model: &LockModel, state: &mut State, c: u8) {
        assert_eq!(
            run(model, state, c, Command::Ttl { key: key() }),
            Reply::Int(-1)
        );
    }

    /// `SETNX {r} c<c>`.
    fn setnx(c: u8) -> Command {
        Command::SetNx {
            key: key(),
            value: format!("c{c}"),
        }
    }

    /// `SET {r} value NX PX 10000`.
    fn set_nx_px(value: &str) -> Command {
        Command::Set {
            key: key(),
            value: value.into(),
            condition: SetCondition::Nx,
            expiry: lockwright_core::keyspace::SetExpiry::Px(10_000),
            get: false,
        }
    }

    #[test]
    fn an_acquiring_clients_delete_of_anothers_key_breaks_owner_only() {
        // The undo of an acquire (or a release that runs late, after its
        // client began acquiring again) runs while its client is acquiring:
        // owner-only is judged there too, not only while it releases.
        let (model, mut state) = judged(ProtocolId::SetPxGetDel);
        let set = set_nx_px("c1");
        assert!(run(&model, &mut state, 1, set).is_ok());
        assert!(matches!(state.clients[0].phase, Phase::Acquiring));
        run(&model, &mut state, 0, Command::Get { key: key() });
        assert!(!state.owner_violation, "a read touches nothing");
        run(&model, &mut state, 0, Command::Del { keys: vec![key()] });
        assert!(state.owner_violation);
    }

    #[test]
    fn a_repair_of_a_key_without_ttl_is_exempt_and_a_late_one_is_not() {
        let (model, mut state) = judged(ProtocolId::SetnxExpire);
        let expire = Command::Expire {
            key: key(),
            seconds: 10,
        };
        assert_eq!(run(&model, &mut state, 0, setnx(0)), Reply::Int(1));
        assert_eq!(run(&model, &mut state, 1, setnx(1)), Reply::Int(0));
        // The waiter finds no TTL and gives the key one: the recipe's repair.
        let mut repaired = state.clone();
        ttl_reads_none(&model, &mut repaired, 1);
        run(&model, &mut repaired, 1, expire.clone());
        assert!(!repaired.owner_violation, "the repair is the recipe's rule");
        // The same EXPIRE without the probe before it acts on the holder's
        // key as if it were the sender's own (a late EXPIRE of a grant
        // that was superseded).
        let mut trespass = state.clone();
        run(&model, &mut trespass, 1, expire.clone());
        assert!(trespass.owner_violation);
        // A repair that runs after the holder set its own TTL resets it.
        let mut late = state;
        ttl_reads_none(&model, &mut late, 1);
        run(&model, &mut late, 0, expire.clone());
        assert!(!late.owner_violation, "the holder's own EXPIRE");
        // At the same instant the reset leaves the deadline as it was, and
        // still acts on the holder's key.
        let mut at_once = late.clone();
        run(&model, &mut at_once, 1, expire.clone());
        assert!(at_once.owner_violation);
        late.time += 1_000;
        run(&model, &mut late, 1, expire);
        assert!(late.owner_violation);
    }

    #[test]
    fn a_takeover_after_a_read_is_exempt_and_an_extends_getset_is_not() {
        let (model, mut state) = judged(ProtocolId::SetnxGetset);
        let getset = Command::GetSet {
            key: key(),
            value: "20000".into(),
        };
        // c1 holds, its stamp long past by c0's reckoning.
        run(
            &model,
            &mut state,
            1,
            Command::SetNx {
                key: key(),
                value: "5".into(),
            },
        );
        let mut takeover = state.clone();
        run(&model, &mut takeover, 0, Command::Get { key: key() });
        run(&model, &mut takeover, 0, getset.clone());
        assert!(!takeover.owner_violation, "the recipe's takeover");
        // The same GETSET with no GET before it (the recipe's extend, run by
        // a client that no longer holds) takes another's key over.
        let mut extend = state;
        run(&model, &mut extend, 0, getset);
        assert!(extend.owner_violation);
    }

    #[test]
    fn a_request_keeps_the_rule_it_was_sent_under_when_it_runs_late() {
        let (model, mut state) = judged(ProtocolId::SetnxExpire);
        let expire = Command::Expire {
            key: key(),
            seconds: 10,
        };
        run(&model, &mut state, 0, setnx(0));
        ttl_reads_none(&model, &mut state, 1);
        // c1 sends its repair; it is held up, c1 times out and tries again
        // on a new connection, and the repair runs late, on the retired one,
        // while the key has still no TTL: it is still the repair.
        let repair = send(&mut state, 1, expire.clone());
        assert!(repair.by_rule);
        run(&model, &mut state, 1, setnx(1));
        model.execute(&mut state, 1, 0, &repair, orphan_conn(1, 0));
        assert!(!state.owner_violation);
        // An EXPIRE sent with no read before it is no repair, late or not.
        let stray = send(&mut state, 1, expire);
        assert!(!stray.by_rule);
        model.execute(&mut state, 1, 0, &stray, orphan_conn(1, 1));
        assert!(state.owner_violation);
    }

    #[test]
    fn a_late_getset_of_an_extend_is_judged_though_a_read_came_since() {
        let (model, mut state) = judged(ProtocolId::SetnxGetset);
        run(
            &model,
            &mut state,
            1,
            Command::SetNx {
                key: key(),
                value: "5".into(),
            },
        );
        let extend = send(
            &mut state,
            0,
            Command::GetSet {
                key: key(),
                value: "20000".into(),
            },
        );
        assert!(!extend.by_rule);
        // c0 acquires again meanwhile and reads the stamp; its old extend
        // then runs late and takes c1's key over.
        run(&model, &mut state, 0, Command::Get { key: key() });
        model.execute(&mut state, 0, 0, &extend, orphan_conn(0, 0));
        assert!(state.owner_violation);
    }

    #[test]
    fn an_expiry_set_inside_a_transaction_on_anothers_key_is_judged() {
        let (model, mut state) = judged(ProtocolId::SetPxWatch);
        let set = set_nx_px("c1");
        run(&model, &mut state, 1, set);
        let extend = Command::Transaction(vec![Command::PExpire {
            key: key(),
            millis: 10_000,
        }]);
        run(&model, &mut state, 0, extend);
        assert!(state.owner_violation);
    }

    #[test]
    fn an_eviction_by_the_protocols_expiry_rule_is_exempt() {
        let (model, mut state) = judged(ProtocolId::ZsetSemaphore);
        let add = Command::ZAdd {
            key: key(),
            members: vec![(0, "c1".into())],
        };
        run(&model, &mut state, 1, add);
        let purge = Command::ZRemRangeByScore {
            key: key(),
            min: lockwright_core::keyspace::ScoreBound::NegInf,
            max: lockwright_core::keyspace::ScoreBound::Inclusive(i64::MAX),
        };
        assert_eq!(run(&model, &mut state, 0, purge), Reply::Int(1));
        assert!(!state.owner_violation);
        let mut by_member = state.clone();
        run(
            &model,
            &mut by_member,
            1,
            Command::ZAdd {
                key: key(),
                members: vec![(0, "c1".into())],
            },
        );
        run(
            &model,
            &mut by_member,
            0,
            Command::ZRem {
                key: key(),
                members: vec!["c1".into()],
            },
        );
        assert!(by_member.owner_violation, "a removal by member is judged");
    }

    #[test]
    fn a_write_copies_only_the_element_written() {
        let parts: Parts<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
        let mut next = parts.clone();
        next[1].push('!');
        assert_eq!(parts[1], "b", "the parent is unchanged");
        assert_eq!(next[1], "b!");
        assert!(Arc::ptr_eq(&parts.0[0], &next.0[0]));
        assert!(Arc::ptr_eq(&parts.0[2], &next.0[2]));
        assert!(!Arc::ptr_eq(&parts.0[1], &next.0[1]));
        assert_ne!(parts, next);
    }
}
