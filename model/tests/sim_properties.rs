//! Properties of the catalogue's locks, checked on random schedules of the
//! deterministic simulator (`lockwright_model::sim`), and properties of the
//! simulator itself.

use lockwright_core::keyspace::Command;
use lockwright_core::{Config, Event, Millis, ProtocolId};
use lockwright_model::model::ClientClock;
use lockwright_model::sim::{
    ClientId, History, Sim, SimConfig, Strike, Undelivered, What, Workload,
};
use proptest::prelude::*;

/// A schedule without faults: random seed, clients, latency and clock offsets
/// (every clock at the same rate). A round trip (at most 60 ms) always fits
/// in the TTL (at least 100 ms), so every run grants the lock.
#[derive(Clone, Debug)]
struct Schedule {
    seed: u64,
    clients: u32,
    latency_ms: (u64, u64),
    ttl_ms: u64,
    client_offsets: Vec<u64>,
    node_offsets: Vec<u64>,
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (
        any::<u64>(),
        2u32..=5,
        0u64..=10,
        0u64..=20,
        100u64..=300,
        proptest::collection::vec(0u64..=10_000, 5),
        proptest::collection::vec(0u64..=10_000, 3),
    )
        .prop_map(
            |(seed, clients, min, spread, ttl_ms, client_offsets, node_offsets)| Schedule {
                seed,
                clients,
                latency_ms: (min, min + spread),
                ttl_ms,
                client_offsets,
                node_offsets,
            },
        )
}

fn exact_from(offset_ms: u64) -> ClientClock {
    ClientClock::with_rate_ppt(offset_ms, 1000)
}

fn run_schedule(protocol: ProtocolId, nodes: u8, s: &Schedule) -> History {
    let config = Config {
        ttl_ms: s.ttl_ms,
        nodes,
        // RedLock's per-node timeout (`ttl/10` by default) must cover a round trip.
        reply_timeout_ms: Some(2 * s.latency_ms.1 + 5),
        retry_base_ms: 2,
        retry_max_ms: 20,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        seed: s.seed,
        clients: s.clients,
        latency_ms: s.latency_ms,
        reply_timeout_ms: 200,
        client_clock: s.client_offsets.iter().copied().map(exact_from).collect(),
        node_clock: s.node_offsets.iter().copied().map(exact_from).collect(),
        workload: Workload {
            start_ms: (0, 20),
            acquire_timeout_ms: Some(500),
            hold_ms: (1, s.ttl_ms),
            think_ms: (0, 20),
        },
        horizon_ms: 3_000,
        ..SimConfig::new(protocol, config)
    };
    match Sim::new(cfg) {
        Ok(sim) => sim.run(),
        Err(e) => panic!("{protocol}: the simulator refused a valid configuration: {e}"),
    }
}

/// Asserts mutual exclusion on one schedule; on failure prints the holds and
/// the trace.
fn assert_one_holder(protocol: ProtocolId, nodes: u8, s: &Schedule) -> Result<(), TestCaseError> {
    let history = run_schedule(protocol, nodes, s);
    let acquired = history
        .entries
        .iter()
        .filter(|e| matches!(e.what, What::Event(Event::Acquired(_))))
        .count();
    prop_assert!(acquired > 0, "{protocol}: nobody ever acquired\n{history}");
    prop_assert!(
        history.max_concurrent_holders() <= 1,
        "{protocol}: two holders inside their validity\nholds: {:?}\n{history}",
        history.holds()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_two_holders_inside_validity_without_faults_set_px_watch(s in schedule()) {
        assert_one_holder(ProtocolId::SetPxWatch, 1, &s)?;
    }

    #[test]
    fn no_two_holders_inside_validity_without_faults_set_px_lua(s in schedule()) {
        assert_one_holder(ProtocolId::SetPxLua, 1, &s)?;
    }

    #[test]
    fn no_two_holders_inside_validity_without_faults_fenced(s in schedule()) {
        assert_one_holder(ProtocolId::Fenced, 1, &s)?;
    }

    #[test]
    fn no_two_holders_inside_validity_without_faults_reentrant(s in schedule()) {
        assert_one_holder(ProtocolId::Reentrant, 1, &s)?;
    }

    #[test]
    fn no_two_holders_inside_validity_without_faults_redlock_3_nodes(s in schedule()) {
        assert_one_holder(ProtocolId::Redlock, 3, &s)?;
    }
}

/// A workload built to make a `GET … DEL` release straddle the key's expiry:
/// holds end at (or just before) the lease's validity, and latency is large
/// enough that the key expires between the `GET` and the `DEL`.
fn straddling_expiry(protocol: ProtocolId, seed: u64) -> History {
    let config = Config {
        ttl_ms: 100,
        retry_base_ms: 1,
        retry_max_ms: 4,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        seed,
        clients: 3,
        latency_ms: (1, 12),
        reply_timeout_ms: 80,
        workload: Workload {
            start_ms: (0, 5),
            acquire_timeout_ms: Some(400),
            hold_ms: (90, 100),
            think_ms: (0, 3),
        },
        horizon_ms: 1_000,
        ..SimConfig::new(protocol, config)
    };
    match Sim::new(cfg) {
        Ok(sim) => sim.run(),
        Err(e) => panic!("{protocol}: the simulator refused a valid configuration: {e}"),
    }
}

/// The first seed below `seeds` whose run has a successor deletion.
fn find_successor_deletion(protocol: ProtocolId, seeds: u64) -> Option<(u64, History)> {
    (0..seeds)
        .map(|seed| (seed, straddling_expiry(protocol, seed)))
        .find(|(_, h)| !h.successor_deletions().is_empty())
}

#[test]
fn set_px_get_del_can_delete_its_successors_lock() {
    let Some((seed, history)) = find_successor_deletion(ProtocolId::SetPxGetDel, 200) else {
        panic!("no schedule among 200 seeds where a GET/DEL release deletes a successor's lock");
    };
    let deletion = history.successor_deletions()[0].clone();
    let (Some(culprit), What::Trespassed { owner, .. }) = (deletion.client, &deletion.what) else {
        panic!("a successor deletion names its culprit: {deletion:?}");
    };
    assert_ne!(culprit, *owner);
    // The trace around it: from the culprit's last acquire to the deletion.
    let from = history
        .entries
        .iter()
        .rposition(|e| {
            e.client == Some(culprit)
                && e.at <= deletion.at
                && matches!(e.what, What::AcquireCalled(_))
        })
        .unwrap_or(0);
    let to = history
        .entries
        .iter()
        .position(|e| *e == deletion)
        .unwrap_or(history.entries.len() - 1);
    println!("set-px-get-del: seed {seed}: {culprit} deleted {owner}'s lock");
    for entry in &history.entries[from..=to] {
        println!("{entry}");
    }
    // The deleted key was the victim's: its last command on the node before
    // the deletion was a granted `SET NX`.
    let victims_last = history.entries[..to]
        .iter()
        .rev()
        .find(|e| e.client == Some(*owner) && matches!(e.what, What::Executed { .. }))
        .map(|e| &e.what);
    assert!(
        matches!(
            victims_last,
            Some(What::Executed { command: Command::Set { .. }, reply, .. }) if reply.is_ok()
        ),
        "{owner}'s last command before the deletion: {victims_last:?}"
    );
}

#[test]
fn set_px_get_del_successor_deletion_lets_two_holders_in() {
    let found = (0..200).find_map(|seed| {
        let history = straddling_expiry(ProtocolId::SetPxGetDel, seed);
        let both =
            !history.successor_deletions().is_empty() && history.max_concurrent_holders() >= 2;
        both.then_some((seed, history))
    });
    let Some((seed, history)) = found else {
        panic!("no schedule among 200 seeds where a deleted successor overlaps another holder");
    };
    println!("set-px-get-del: seed {seed}: holds {:?}", history.holds());
}

#[test]
fn set_px_lua_never_deletes_a_successors_lock_on_the_same_search() {
    if let Some((seed, history)) = find_successor_deletion(ProtocolId::SetPxLua, 200) {
        panic!(
            "set-px-lua deleted a successor's lock with seed {seed}: {:?}\n{history}",
            history.successor_deletions()
        );
    }
    // The search is not vacuous: the same schedules do contend.
    let history = straddling_expiry(ProtocolId::SetPxLua, 0);
    let grants = history
        .entries
        .iter()
        .filter(|e| matches!(e.what, What::Event(Event::Acquired(_))))
        .count();
    assert!(grants >= 3, "only {grants} grants\n{history}");
    assert!(history.max_concurrent_holders() <= 1);
}

fn small_run(seed: u64) -> History {
    let config = Config {
        ttl_ms: 80,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        seed,
        clients: 4,
        latency_ms: (0, 9),
        loss_percent: 5,
        reply_timeout_ms: 30,
        horizon_ms: 1_000,
        ..SimConfig::new(ProtocolId::SetPxLua, config)
    };
    Sim::new(cfg).expect("a valid configuration").run()
}

#[test]
fn the_simulator_is_deterministic_same_seed_same_history() {
    let a = small_run(42);
    let b = small_run(42);
    assert!(a.entries.len() > 100, "a run this short proves little");
    assert_eq!(a, b);
    assert_ne!(a, small_run(43), "the seed should matter");
    // Loss was drawn, and lost messages turned into timeouts.
    assert!(a
        .entries
        .iter()
        .any(|e| matches!(e.what, What::TimedOut { .. })));
}

#[test]
fn history_is_in_true_time_order() {
    let h = small_run(7);
    assert!(h.entries.windows(2).all(|w| w[0].at <= w[1].at));
}

/// One client, one try, 4 ms each way: the `SET` runs at t=4 and its reply
/// would arrive at t=8. The machine's own reply timer fires at t=5.
fn timer_before_reply(reply_timeout_ms: u64) -> History {
    let config = Config {
        ttl_ms: 1_000,
        reply_timeout_ms: Some(5),
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        clients: 1,
        latency_ms: (4, 4),
        reply_timeout_ms,
        workload: Workload {
            start_ms: (0, 0),
            acquire_timeout_ms: None,
            hold_ms: (10, 10),
            think_ms: (1_000, 1_000),
        },
        horizon_ms: 20,
        ..SimConfig::new(ProtocolId::SetPxLua, config)
    };
    Sim::new(cfg).expect("a valid configuration").run()
}

#[test]
fn the_simulator_handles_the_earliest_event_first_a_timer_at_5_before_a_reply_at_8() {
    let h = timer_before_reply(50);
    let executed = h
        .entries
        .iter()
        .find(|e| matches!(e.what, What::Executed { .. }))
        .expect("the SET reached the node");
    assert_eq!(executed.at, Millis(4));
    // Had the reply at t=8 been handled before the timer at t=5, the lock
    // would have been acquired.
    let events: Vec<(Millis, &Event)> = h
        .entries
        .iter()
        .filter_map(|e| match &e.what {
            What::Event(ev) => Some((e.at, ev)),
            _ => None,
        })
        .collect();
    assert_eq!(events, [(Millis(5), &Event::Denied)], "{h}");
}

#[test]
fn the_simulators_reply_timeout_gives_up_and_discards_the_late_reply() {
    let h = timer_before_reply(3);
    let what: Vec<(Millis, &What)> = h
        .entries
        .iter()
        .filter(|e| matches!(e.what, What::TimedOut { .. } | What::Dropped { .. }))
        .map(|e| (e.at, &e.what))
        .collect();
    assert!(
        matches!(
            what.as_slice(),
            [
                (Millis(3), What::TimedOut { .. }),
                (
                    Millis(8),
                    What::Dropped {
                        why: Undelivered::LateReply,
                        ..
                    }
                )
            ]
        ),
        "{h}"
    );
}

#[test]
fn a_node_restart_without_persistence_lets_a_second_holder_in() {
    let found = (0..50).find_map(|seed| {
        let config = Config {
            ttl_ms: 200,
            ..Config::new("orders")
        };
        let cfg = SimConfig {
            seed,
            clients: 3,
            workload: Workload {
                hold_ms: (150, 200),
                ..Workload::default()
            },
            faults: vec![Strike::NodeRestart {
                node: lockwright_core::NodeId(0),
                at: Millis(60),
                down_ms: 5,
            }],
            horizon_ms: 600,
            ..SimConfig::new(ProtocolId::SetPxLua, config)
        };
        let h = Sim::new(cfg).expect("a valid configuration").run();
        (h.max_concurrent_holders() >= 2).then_some(h)
    });
    let h = found.expect("a restart in the middle of a hold lets someone else in");
    assert!(h
        .entries
        .iter()
        .any(|e| e.what == What::NodeDown(lockwright_core::NodeId(0))));
}

#[test]
fn a_slow_client_clock_overstays_its_lease() {
    // c0's clock runs at half speed: it believes its lease is valid for
    // twice as long as the key lives.
    let config = Config {
        ttl_ms: 100,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        clients: 2,
        client_clock: vec![ClientClock::with_rate_ppt(0, 500), ClientClock::EXACT],
        workload: Workload {
            start_ms: (0, 0),
            hold_ms: (1_000, 1_000),
            ..Workload::default()
        },
        horizon_ms: 400,
        ..SimConfig::new(ProtocolId::SetPxLua, config)
    };
    let h = Sim::new(cfg).expect("a valid configuration").run();
    assert_eq!(h.max_concurrent_holders(), 2, "{h}");
    let holds = h.holds();
    assert!(holds.iter().any(|x| x.client == ClientId(0)));
    assert!(holds.iter().any(|x| x.client == ClientId(1)));
}

#[test]
fn bad_simulator_configurations_are_typed_errors() {
    use lockwright_model::sim::SimError;
    let base = SimConfig::new(ProtocolId::SetPxLua, Config::new("orders"));
    let err = |cfg: SimConfig| Sim::new(cfg).err();
    assert_eq!(
        err(SimConfig {
            clients: 0,
            ..base.clone()
        }),
        Some(SimError::ZeroClients)
    );
    assert!(matches!(
        err(SimConfig {
            latency_ms: (5, 1),
            ..base.clone()
        }),
        Some(SimError::BadRange { .. })
    ));
    assert_eq!(
        err(SimConfig {
            loss_percent: 101,
            ..base.clone()
        }),
        Some(SimError::LossAbove100(101))
    );
    assert!(matches!(
        err(SimConfig {
            faults: vec![Strike::ClientCrash {
                client: ClientId(9),
                at: Millis(0)
            }],
            ..base.clone()
        }),
        Some(SimError::FaultTarget(_))
    ));
    let mut bad = base;
    bad.config.ttl_ms = 0;
    assert!(matches!(err(bad), Some(SimError::Config(_))));
}

/// c0 starts at once and holds for a long time, c1 starts at 10 ms; c0
/// crashes at 20 ms while it holds.
fn crash_while_holding(protocol: ProtocolId) -> History {
    let config = Config {
        ttl_ms: 200,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        clients: 2,
        latency_ms: (1, 2),
        workload: Workload {
            start_ms: (0, 0),
            acquire_timeout_ms: Some(5_000),
            hold_ms: (1_000, 1_000),
            think_ms: (0, 0),
        },
        faults: vec![Strike::ClientCrash {
            client: ClientId(0),
            at: Millis(20),
        }],
        horizon_ms: 2_000,
        ..SimConfig::new(protocol, config)
    };
    let mut cfg = cfg;
    // c1 starts 10 ms later: it is paused until then.
    cfg.faults.push(Strike::ClientPause {
        client: ClientId(1),
        at: Millis(0),
        for_ms: 10,
    });
    Sim::new(cfg).expect("a valid configuration").run()
}

fn acquired_at(h: &History, client: ClientId) -> Vec<Millis> {
    h.entries
        .iter()
        .filter(|e| e.client == Some(client) && matches!(e.what, What::Event(Event::Acquired(_))))
        .map(|e| e.at)
        .collect()
}

#[test]
fn a_crashed_holder_blocks_setnx_del_forever_but_a_set_px_lua_lease_expires() {
    let h = crash_while_holding(ProtocolId::SetnxDel);
    assert_eq!(acquired_at(&h, ClientId(0)).len(), 1, "{h}");
    assert!(h.entries.iter().any(|e| e.what == What::ClientCrashed));
    assert_eq!(acquired_at(&h, ClientId(1)), [], "{h}");
    // The crashed client is not driven any more: nothing of c0 after 20 ms
    // but its requests still in flight.
    assert!(h
        .entries
        .iter()
        .filter(|e| e.client == Some(ClientId(0)) && e.at > Millis(20))
        .all(|e| matches!(e.what, What::Executed { .. })));

    let h = crash_while_holding(ProtocolId::SetPxLua);
    let c1 = acquired_at(&h, ClientId(1));
    assert!(
        c1.first().is_some_and(|t| *t >= Millis(200)),
        "c1 gets the lock once c0's key expires: {c1:?}\n{h}"
    );
    assert_eq!(h.max_concurrent_holders(), 1);
}

#[test]
fn a_paused_client_handles_nothing_until_the_pause_ends() {
    let h = crash_while_holding(ProtocolId::SetPxLua);
    let c1_first = h
        .entries
        .iter()
        .find(|e| e.client == Some(ClientId(1)) && !matches!(e.what, What::ClientPaused { .. }))
        .expect("c1 does something");
    assert_eq!(c1_first.at, Millis(10), "{h}");
}

/// c0 holds for a long time and c1 waits; c0 is paused from `pause_at` for
/// 400 ms. With a 200 ms TTL, c0's validity ends at about 188 ms.
fn pause_while_holding(pause_at: u64) -> History {
    let config = Config {
        ttl_ms: 200,
        ..Config::new("orders")
    };
    let cfg = SimConfig {
        clients: 2,
        latency_ms: (1, 1),
        workload: Workload {
            start_ms: (0, 0),
            acquire_timeout_ms: Some(5_000),
            hold_ms: (1_000, 1_000),
            think_ms: (1_000, 1_000),
        },
        faults: vec![
            Strike::ClientPause {
                client: ClientId(1),
                at: Millis(0),
                for_ms: 10,
            },
            Strike::ClientPause {
                client: ClientId(0),
                at: Millis(pause_at),
                for_ms: 400,
            },
        ],
        horizon_ms: 1_000,
        ..SimConfig::new(ProtocolId::SetPxLua, config)
    };
    Sim::new(cfg).expect("a valid configuration").run()
}

/// The inside rule shared with the model (`lockwright_model::inside`): a
/// holder paused when its validity ends cannot see its clock and stays
/// inside until the pause ends, so c1, granted once c0's key expired, is
/// inside beside it; a pause that begins after the validity's end does
/// not bring c0 back. Without the pause in `History::holds` the first run
/// shows one holder.
#[test]
fn a_holder_paused_over_its_validitys_end_is_inside_until_the_pause_ends() {
    let h = pause_while_holding(100);
    assert_eq!(acquired_at(&h, ClientId(0)).len(), 1, "{h}");
    assert!(
        acquired_at(&h, ClientId(1))
            .first()
            .is_some_and(|t| *t < Millis(500)),
        "c1 gets the lock once c0's key expires, during c0's pause\n{h}"
    );
    assert_eq!(h.max_concurrent_holders(), 2, "{h}");
    let c0 = h
        .holds()
        .into_iter()
        .find(|s| s.client == ClientId(0))
        .unwrap();
    assert_eq!(c0.to, Millis(500), "{h}");

    let h = pause_while_holding(250);
    assert!(!acquired_at(&h, ClientId(1)).is_empty(), "{h}");
    assert_eq!(h.max_concurrent_holders(), 1, "{h}");

    // Two pauses that overlap are one: a pause of c0 from 100 to 200 ms,
    // over its validity's end (about 188 ms), and one struck during it that
    // runs to 550 ms keep c0 inside until 550 ms.
    let mut h = pause_while_holding(150);
    h.entries
        .retain(|e| e.client != Some(ClientId(0)) || !matches!(e.what, What::ClientPaused { .. }));
    for (at, until) in [(100, 200), (150, 550)] {
        h.entries.push(lockwright_model::sim::HistoryEntry {
            at: Millis(at),
            client: Some(ClientId(0)),
            what: What::ClientPaused {
                until: Millis(until),
            },
        });
    }
    h.entries.sort_by_key(|e| e.at);
    let c0 = h
        .holds()
        .into_iter()
        .find(|s| s.client == ClientId(0))
        .unwrap();
    assert_eq!(c0.to, Millis(550), "{h}");
}

/// `ProtocolId::uses_watch` is what drivers use to decide whether a hold may
/// share a connection: it must name exactly the machines that send `WATCH`,
/// on runs long enough to take every path (contention, releases, extends
/// after holds that outlive the TTL, expiry).
#[test]
fn uses_watch_names_exactly_the_machines_that_send_watch() {
    for protocol in ProtocolId::all() {
        let nodes = if protocol == ProtocolId::Redlock {
            3
        } else {
            1
        };
        let mut sent_watch = false;
        let mut commands = 0usize;
        for seed in 0..8 {
            let s = Schedule {
                seed,
                clients: 3,
                latency_ms: (1, 4),
                ttl_ms: 150,
                client_offsets: vec![0; 5],
                node_offsets: vec![0; 3],
            };
            for entry in run_schedule(protocol, nodes, &s).entries {
                if let What::Sent { command, .. } = entry.what {
                    commands += 1;
                    sent_watch |= matches!(command, Command::Watch { .. });
                }
            }
        }
        assert!(
            commands > 100,
            "{protocol}: the runs sent {commands} commands"
        );
        assert_eq!(
            protocol.uses_watch(),
            sent_watch,
            "{protocol}: uses_watch() disagrees with the commands the machine sent"
        );
    }
}

/// Each strike names the model's fault class it is an instance of.
#[test]
fn strikes_name_the_models_fault_classes() {
    use lockwright_model::Fault;
    let node = lockwright_core::NodeId(0);
    let client = ClientId(0);
    let at = Millis(5);
    let cases = [
        (
            Strike::NodeRestart {
                node,
                at,
                down_ms: 1,
            },
            Some(Fault::Restart),
        ),
        (
            Strike::NodeRestart {
                node,
                at,
                down_ms: 101,
            },
            Some(Fault::RestartDelayed),
        ),
        (
            Strike::NodeClockJump {
                node,
                at,
                by_ms: 150,
            },
            Some(Fault::ClockJump),
        ),
        (
            Strike::NodeClockJump {
                node,
                at,
                by_ms: -150,
            },
            None,
        ),
        (Strike::ClientCrash { client, at }, Some(Fault::Crash)),
        (
            Strike::ClientPause {
                client,
                at,
                for_ms: 50,
            },
            Some(Fault::Pause),
        ),
    ];
    for (strike, class) in cases {
        assert_eq!(strike.class(100), class, "{strike:?}");
    }
}
