//! The verdict matrix as tests: every (protocol, fault, property) cell is
//! computed by the checker and compared with `model/expectations.txt`; a
//! differing cell fails with its counterexample printed.
//!
//! Each run is the standard run ([`matrix::standard_run`]) through the
//! cache in `target/tmp/matrix-cache`, shared with `tests/docs.rs` and the
//! chaos replay test: whichever needs a cell first computes it with the
//! checker, for the sources of this build (see `lockwright_model::cache`).

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use lockwright_core::ProtocolId;
use lockwright_model::cache::Cache;
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::trace;
use std::path::Path;

/// The cache the model and chaos tests share.
fn cache() -> Cache {
    Cache::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("matrix-cache"))
}

/// The standard model of `protocol` under `fault`, checking every
/// property, for the tests that walk it step by step.
fn standard_model(protocol: ProtocolId, fault: Fault) -> lockwright_model::LockModel {
    lockwright_model::LockModel::new(
        lockwright_model::ModelConfig::new(protocol, fault),
        PropertyId::ALL.to_vec(),
    )
    .expect("the standard bounds are valid")
}

/// The verdict on `property` of `protocol` under `fault` (run as
/// `mutation` when one is given, which must mutate `protocol`), at the
/// standard bounds for that property checked alone.
fn verdict_alone(
    protocol: ProtocolId,
    fault: Fault,
    property: PropertyId,
    mutation: Option<lockwright_model::model::Mutation>,
) -> Verdict {
    let mutated = mutation.and_then(|m| m.protocol());
    assert!(
        mutated.is_none_or(|m| m == protocol),
        "{mutation:?} mutates {mutated:?}"
    );
    let mut cfg = lockwright_model::ModelConfig::for_properties(protocol, fault, &[property]);
    cfg.mutation = mutation;
    verdict_of_run(cfg, property).0
}

/// The verdict on `property` of the run of `cfg` (two checker threads, no
/// shortening), and its unique states.
fn verdict_of_run(cfg: lockwright_model::ModelConfig, property: PropertyId) -> (Verdict, usize) {
    let run = matrix::check_config(cfg, 2, false).expect("model configures");
    let verdict = run
        .cells
        .iter()
        .find(|c| c.property == property)
        .map(|c| c.verdict)
        .expect("the property is checked");
    (verdict, run.states)
}

/// The actions `model` enables in `state`.
fn enabled_in(
    model: &lockwright_model::LockModel,
    state: &lockwright_model::State,
) -> Vec<lockwright_model::Action> {
    let mut actions = Vec::new();
    model.enabled(state, &mut actions);
    actions
}

fn check_protocol(protocol: ProtocolId) {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS).expect("expectations parse");
    let cache = cache();
    let mut failures = Vec::new();
    for fault in Fault::ALL {
        // The model's own invariants are checked in the progress run
        // (`matrix::checks_invariants`): no run stops before the horizon, no
        // message outlives its deadline.
        let run = matrix::standard_run(protocol, fault, Some(&cache)).unwrap();
        for (name, trace) in &run.broken {
            // Which run's invariant it was: the trace replays in its model.
            let model = matrix::standard_groups(protocol)
                .into_iter()
                .map(|g| matrix::model_for(protocol, fault, g).unwrap())
                .find(|m| {
                    trace
                        .first()
                        .is_some_and(|(s, _)| s.clients.len() == usize::from(m.cfg.clients))
                })
                .expect("one of the runs' models has the trace's clients");
            failures.push(format!(
                "{protocol} {fault}: the model's invariant \"{name}\" fails:\n{}",
                trace::text(&model, trace)
            ));
        }
        for cell in &run.cells {
            let model = matrix::cell_model(protocol, fault, cell.property).unwrap();
            let rule =
                matrix::expected(&rules, protocol, fault, cell.property).unwrap_or_else(|| {
                    panic!("no expectation covers {protocol} {fault} {}", cell.property)
                });
            if rule.verdict != cell.verdict {
                let shown = match &cell.trace {
                    Some(t) => trace::text(&model, t),
                    None => {
                        "(no counterexample: the property held in every reachable state)\n".into()
                    }
                };
                failures.push(format!(
                    "{protocol} {fault} {}: checker says {}, expectations.txt line {} says {} ({})\n{shown}",
                    cell.property, cell.verdict, rule.line, rule.verdict, rule.reason
                ));
            }
        }
    }
    eprintln!("{protocol}: {}", cache.summary());
    assert!(
        failures.is_empty(),
        "{} cell(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! matrix_rows {
    ($($name:ident => $id:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_protocol(ProtocolId::$id);
            }
        )*
    };
}

matrix_rows! {
    setnx_del_row_matches_the_expectations => SetnxDel,
    setnx_expire_row_matches_the_expectations => SetnxExpire,
    setnx_getset_row_matches_the_expectations => SetnxGetset,
    set_px_get_del_row_matches_the_expectations => SetPxGetDel,
    set_px_watch_row_matches_the_expectations => SetPxWatch,
    set_px_lua_row_matches_the_expectations => SetPxLua,
    reentrant_row_matches_the_expectations => Reentrant,
    redlock_row_matches_the_expectations => Redlock,
    fenced_row_matches_the_expectations => Fenced,
    time_fenced_row_matches_the_expectations => TimeFenced,
    zset_semaphore_row_matches_the_expectations => ZsetSemaphore,
    fair_semaphore_row_matches_the_expectations => FairSemaphore,
    fair_semaphore_locked_row_matches_the_expectations => FairSemaphoreLocked,
    watch_semaphore_row_matches_the_expectations => WatchSemaphore,
    lease_semaphore_row_matches_the_expectations => LeaseSemaphore,
    time_fenced_semaphore_row_matches_the_expectations => TimeFencedSemaphore,
}

/// Unique states of every protocol without faults, pinned so that an
/// accidental change to the model (or to a machine) shows up here.
#[test]
fn unique_state_counts_without_faults_are_pinned() {
    let pinned: [(ProtocolId, usize); 16] = PINNED;
    let mut actual = Vec::new();
    for (protocol, _) in pinned {
        let run = matrix::check(protocol, Fault::None, 1, false).unwrap();
        actual.push((protocol, run.states));
    }
    assert_eq!(
        actual, pinned,
        "state counts changed: update PINNED only if the change is intended"
    );
}

const PINNED: [(ProtocolId, usize); 16] = [
    (ProtocolId::SetnxDel, 2123),
    (ProtocolId::SetnxExpire, 27947),
    // The two protocols checked in two runs (safety with three clients,
    // stopped once all three properties are found; progress with two):
    // the sum.
    (ProtocolId::SetnxGetset, 85857),
    (ProtocolId::SetPxGetDel, 59329),
    (ProtocolId::SetPxWatch, 7757),
    (ProtocolId::SetPxLua, 1437),
    (ProtocolId::Reentrant, 17621),
    // 80939 before master symmetry (`Reductions::master_symmetry`).
    (ProtocolId::Redlock, 28147),
    (ProtocolId::Fenced, 17621),
    (ProtocolId::ZsetSemaphore, 593),
    (ProtocolId::FairSemaphore, 1285),
    (ProtocolId::FairSemaphoreLocked, 2583),
    (ProtocolId::WatchSemaphore, 4714),
    (ProtocolId::LeaseSemaphore, 16521),
    (ProtocolId::TimeFenced, 18067),
    (ProtocolId::TimeFencedSemaphore, 16957),
];

#[test]
fn every_rule_has_a_reason_and_a_source_and_every_cell_is_covered() {
    let rules = matrix::parse_expectations(matrix::EXPECTATIONS).unwrap();
    for rule in &rules {
        assert!(!rule.source.is_empty(), "line {} has no source", rule.line);
    }
    for p in ProtocolId::all() {
        for f in Fault::ALL {
            for prop in PropertyId::ALL {
                assert!(matrix::expected(&rules, p, f, prop).is_some());
            }
        }
    }
}

#[test]
fn malformed_expectations_are_typed_errors() {
    assert!(matrix::parse_expectations("* * * maybe | r | s").is_err());
    assert!(matrix::parse_expectations("nope * * holds | r | s").is_err());
    assert!(matrix::parse_expectations("* * holds | r | s").is_err());
    assert!(matrix::parse_expectations("* * * holds |  | s").is_err());
}

#[test]
fn the_reported_counterexample_is_the_shortest() {
    use stateright::{Checker, Model};
    // set-px-lua under pause: the shortest violation of mutual exclusion.
    // The model of the run that decides the cell (its horizon is that of
    // a run that also checks progress).
    let model = matrix::cell_model(
        ProtocolId::SetPxLua,
        Fault::Pause,
        PropertyId::MutualExclusion,
    )
    .unwrap();
    let run = matrix::check(ProtocolId::SetPxLua, Fault::Pause, 1, true).unwrap();
    let cell = run
        .cells
        .iter()
        .find(|c| c.property == PropertyId::MutualExclusion)
        .unwrap();
    assert_eq!(cell.verdict, Verdict::Violated);
    let t = cell.trace.as_ref().unwrap();
    // Nothing shorter exists: the checker itself, bounded to paths of one
    // state less (a path of `n` states is checked when the depth bound
    // exceeds `n`), finds no violation; bounded to this length, it does.
    let within = |states: usize| {
        model
            .clone()
            .checker()
            .target_max_depth(states + 1)
            .spawn_bfs()
            .join()
            .discovery(PropertyId::MutualExclusion.as_str())
            .is_some()
    };
    assert!(!within(t.len() - 1));
    assert!(within(t.len()));
    // And the violation is really in the last state.
    assert!(!model.holds_in(PropertyId::MutualExclusion, &t.last().unwrap().0));
    assert!(model.holds_in(PropertyId::MutualExclusion, &t[t.len() - 2].0));
    // `explain` (this run), the docs and the replay show the same trace:
    // one search finds them all.
    let standard = matrix::standard_run(ProtocolId::SetPxLua, Fault::Pause, None).unwrap();
    let docs = standard
        .cells
        .iter()
        .find(|c| c.property == PropertyId::MutualExclusion)
        .and_then(|c| c.trace.as_ref());
    assert_eq!(docs, Some(t));
}

/// The standard run leaves the model's own invariants out of its
/// three-client safety runs ([`matrix::checks_invariants`]): they are
/// checked here over the three-client space of each such protocol up to a
/// horizon of one TTL and a half (of the standard three TTLs and a bit), under no fault, a pause, a
/// delay and a client's cut from the node (about 5 million states: the
/// standard runs of all fourteen faults took 65 million with the
/// invariants on).
#[test]
fn invariants_hold_with_three_clients() {
    let mut failures = Vec::new();
    for protocol in ProtocolId::all() {
        let mut cfg = lockwright_model::ModelConfig::new(protocol, Fault::None);
        if cfg.clients < 3 {
            continue;
        }
        for fault in [
            Fault::None,
            Fault::Pause,
            Fault::Delay,
            Fault::ClientPartition,
        ] {
            cfg.fault = fault;
            cfg.horizon = cfg.ttl * 3 / 2;
            let mut model = lockwright_model::LockModel::new(cfg.clone(), Vec::new()).unwrap();
            model.sanity = true;
            let run = matrix::check_model(model.clone(), 1, false).unwrap();
            eprintln!(
                "{protocol} {fault}: {} states, invariants checked",
                run.states
            );
            for (name, trace) in &run.broken {
                failures.push(format!(
                    "{protocol} {fault}: the model's invariant \"{name}\" fails:\n{}",
                    trace::text(&model, trace)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `client-partition` cuts one client off from one node and no one else:
/// the cut client's request is lost (no reply, nothing run), a rival's
/// request to the same node runs, and when the cut heals the cut client's
/// patience starts again (it could not reach the node while cut). With the
/// cut applied to every client, as `partition` does, the rival's request
/// would be lost too and this fails.
#[test]
fn a_client_cut_off_alone_is_the_only_one_that_loses_its_requests() {
    use lockwright_model::{Action, State};
    let model = standard_model(ProtocolId::SetPxLua, Fault::ClientPartition);
    let enabled = |s: &State| enabled_in(&model, s);
    // The node runs client `c`'s first request, however the model offers it.
    let run_request = |s: &State, c: u8| -> State {
        let action = enabled(s)
            .into_iter()
            .find(|a| {
                matches!(a, Action::Deliver { client, node: 0 } | Action::RoundTrip { client, node: 0 } if *client == c)
            })
            .unwrap_or_else(|| panic!("c{c} has a request to run"));
        model.step(s, &action).unwrap()
    };
    let start = model.initial();
    // Clients are alike: only client 0 is struck (client symmetry).
    let cuts: Vec<Action> = enabled(&start)
        .into_iter()
        .filter(|a| matches!(a, Action::CutLink { .. }))
        .collect();
    assert_eq!(cuts, vec![Action::CutLink { client: 0, node: 0 }]);
    let cut = model.step(&start, &cuts[0]).unwrap();
    assert!(cut.nodes[0].cut_off(0) && !cut.nodes[0].cut_off(1));
    let now = cut.nodes[0].now(cut.time);
    let lost = run_request(&cut, 0);
    assert_eq!(
        lost.nodes[0].keyspace.live(now).count(),
        0,
        "the cut client's acquire must not run"
    );
    assert!(
        model
            .link_of(&lost, 0, 0)
            .replies
            .front()
            .is_some_and(|r| r.lost),
        "the cut client gets no answer"
    );
    let granted = run_request(&lost, 1);
    assert_eq!(
        granted.nodes[0].keyspace.live(now).count(),
        1,
        "the rival, which still reaches the node, must be granted"
    );
    // The heal restarts the cut client's patience.
    let tick = enabled(&granted)
        .into_iter()
        .find(|a| matches!(a, Action::Tick(_)))
        .expect("time may pass");
    let later = model.step(&granted, &tick).unwrap();
    assert!(later.time > granted.time);
    let healed = model.step(&later, &Action::Heal(0)).unwrap();
    assert_eq!(healed.nodes[0].cut, 0);
    assert_eq!(healed.clients[0].waiting_since, Some(healed.time));
    // A RedLock client cut off from one master of three still reaches a
    // majority: it is judged throughout, so the heal leaves its patience
    // alone.
    let redlock = standard_model(ProtocolId::Redlock, Fault::ClientPartition);
    let start = redlock.initial();
    let mut later = redlock
        .step(&start, &Action::CutLink { client: 0, node: 0 })
        .unwrap();
    // Run the requests until time may pass, then let it pass once: c0 is
    // still waiting for the cut master's answer.
    for _ in 0..64 {
        let actions = enabled_in(&redlock, &later);
        let next = actions
            .iter()
            .find(|a| matches!(a, Action::Tick(_)))
            .or_else(|| {
                actions
                    .iter()
                    .find(|a| matches!(a, Action::Deliver { .. } | Action::RoundTrip { .. }))
            })
            .expect("a request to run or time to pass")
            .clone();
        later = redlock.step(&later, &next).unwrap();
        if matches!(next, Action::Tick(_)) {
            break;
        }
    }
    assert!(later.time > start.time && later.nodes[0].cut_off(0));
    assert!(later.clients[0].waiting_since.is_some());
    let healed = redlock.step(&later, &Action::Heal(0)).unwrap();
    assert_eq!(
        healed.clients[0].waiting_since,
        start.clients[0].waiting_since
    );
}

/// `split-brain` keeps the old master serving one client after the
/// promotion: that client's acquire runs on the old master, a rival's
/// request still on its way to the old master is lost in the cut, and the
/// rival's retry, after its timeout, is granted by the promoted replica, so
/// both hold (with every request sent to the slot's new master, as
/// `failover` does, the rival's first request would be granted or refused
/// there and this fails). When the old master learns of the promotion its
/// data goes, and a request its client still had on the way fails unrun
/// (were it run on the new master instead, this fails).
#[test]
fn a_split_brain_grants_on_two_masters_until_the_old_one_learns() {
    use lockwright_core::Outcome;
    use lockwright_model::{Action, State};
    let model = standard_model(ProtocolId::SetPxLua, Fault::SplitBrain);
    let enabled = |s: &State| enabled_in(&model, s);
    let start = model.initial();
    // Clients are alike: the old master keeps client 0 (client symmetry).
    let splits: Vec<Action> = enabled(&start)
        .into_iter()
        .filter(|a| matches!(a, Action::Split(_) | Action::Promote))
        .collect();
    assert_eq!(splits, vec![Action::Split(0)]);
    let split = model.step(&start, &splits[0]).unwrap();
    assert!(split.nodes[0].on_old_master(0) && !split.nodes[0].on_old_master(1));
    // c1's request, sent before the split, is lost in the cut.
    let lost = enabled(&split)
        .into_iter()
        .find(|a| {
            matches!(
                a,
                Action::Deliver { client: 1, node: 0 } | Action::RoundTrip { client: 1, node: 0 }
            )
        })
        .expect("c1's request may arrive");
    let lost = model.step(&split, &lost).unwrap();
    assert!(model
        .link_of(&lost, 1, 0)
        .replies
        .front()
        .is_some_and(|r| r.lost));
    // The promotion takes its millisecond; the old master serves c0 at once.
    let c0 = enabled(&lost)
        .into_iter()
        .find(|a| {
            matches!(
                a,
                Action::Deliver { client: 0, node: 0 } | Action::RoundTrip { client: 0, node: 0 }
            )
        })
        .expect("c0's request may arrive");
    let mut s = model.step(&lost, &c0).unwrap();
    // c1 times out and retries until the new master grants it.
    for _ in 0..64 {
        if s.clients[1].at_server {
            break;
        }
        let actions = enabled(&s);
        let next = actions
            .iter()
            .find(|a| {
                matches!(
                    a,
                    Action::Deliver { client: 1, .. }
                        | Action::RoundTrip { client: 1, .. }
                        | Action::Receive { client: 1, .. }
                        | Action::Timeout { client: 1, .. }
                        | Action::Timer(1)
                )
            })
            .or_else(|| actions.iter().find(|a| matches!(a, Action::Tick(_))))
            .expect("c1 goes on or time passes")
            .clone();
        s = model.step(&s, &next).unwrap();
    }
    let node = &s.nodes[0];
    let old = node.old.as_ref().expect("the old master still serves c0");
    assert_eq!(old.keyspace.live(old.now(s.time)).count(), 1, "c0's grant");
    assert_eq!(
        node.keyspace.live(node.now(s.time)).count(),
        1,
        "c1's grant on the promoted replica"
    );
    assert!(s.clients[0].at_server && s.clients[1].at_server);
    // c0 sends another request (its release, once it holds); the demotion
    // then fails it unrun and drops the old master.
    for _ in 0..16 {
        if !model.link_of(&s, 0, 0).requests.is_empty() {
            break;
        }
        let next = enabled(&s)
            .into_iter()
            .find(|a| {
                matches!(a, Action::Check(0) | Action::Write(0))
                    || matches!(a, Action::Receive { client: 0, .. })
            })
            .expect("c0 goes on");
        s = model.step(&s, &next).unwrap();
    }
    assert!(
        !model.link_of(&s, 0, 0).requests.is_empty(),
        "c0 sent a request"
    );
    let demoted = model.step(&s, &Action::Demote).unwrap();
    assert!(demoted.nodes[0].old.is_none());
    let link = model.link_of(&demoted, 0, 0);
    assert!(link.requests.is_empty());
    assert!(link
        .replies
        .back()
        .is_some_and(|r| r.outcome == Outcome::Unknown && !r.lost));
    assert_eq!(
        demoted.nodes[0].keyspace, s.nodes[0].keyspace,
        "the request did not run on the new master"
    );
}

/// `delay` under the symmetry reductions (`LockModel::may_delay_on`,
/// `may_delay_client`). Without master symmetry, RedLock's first held-up or
/// lost message is client 0's, on a link to node 0; the second, after a
/// hold or after a loss, may be client 0's or client 1's, on a link to node
/// 0 or 1 (1 stands for every client and node not yet struck); beside a
/// node fault, which is the one kept to node 0, client 0's links to every
/// node may be struck. With it (the standard bounds), renaming masters
/// stands for the node rule: a strike may hit a link to any master.
#[test]
fn delay_strikes_the_first_client_and_node_first() {
    use lockwright_model::{Action, State};
    let struck = |model: &lockwright_model::LockModel, s: &State| {
        let mut links: Vec<(u8, u8)> = enabled_in(model, s)
            .into_iter()
            .filter_map(|a| match a {
                Action::Hold { client, node }
                | Action::LoseRequest { client, node }
                | Action::LoseReply { client, node } => Some((client, node)),
                _ => None,
            })
            .collect();
        links.sort_unstable();
        links.dedup();
        links
    };
    let renaming = standard_model(ProtocolId::Redlock, Fault::Delay);
    let start = renaming.initial();
    assert_eq!(struck(&renaming, &start), vec![(0, 0), (0, 1), (0, 2)]);
    let after = renaming
        .step(&start, &Action::Hold { client: 0, node: 0 })
        .expect("c0's first request to node 0 may be held up");
    assert_eq!(
        struck(&renaming, &after),
        vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    );
    let mut cfg = lockwright_model::ModelConfig::new(ProtocolId::Redlock, Fault::Delay);
    cfg.reductions.master_symmetry = false;
    let model = lockwright_model::LockModel::new(cfg, PropertyId::ALL.to_vec()).unwrap();
    let start = model.initial();
    assert_eq!(struck(&model, &start), vec![(0, 0)]);
    // After a loss, c0's link to node 0 has nothing left to hold up.
    for (first, second) in [
        (
            Action::Hold { client: 0, node: 0 },
            vec![(0, 0), (0, 1), (1, 0), (1, 1)],
        ),
        (
            Action::LoseRequest { client: 0, node: 0 },
            vec![(0, 1), (1, 0), (1, 1)],
        ),
    ] {
        let after = model
            .step(&start, &first)
            .expect("c0's first request to node 0 may be struck");
        assert_eq!(struck(&model, &after), second, "after {first:?}");
    }
    let mut pair = lockwright_model::ModelConfig::new(ProtocolId::Redlock, Fault::Delay);
    pair.also = Some(Fault::Restart);
    pair.reductions.master_symmetry = false;
    let pair = lockwright_model::LockModel::new(pair, PropertyId::ALL.to_vec()).unwrap();
    assert_eq!(struck(&pair, &pair.initial()), vec![(0, 0), (0, 1), (0, 2)]);
}

/// The renewing leases keep mutual exclusion under `client-step` by their
/// renewal alone (they renew every third of a TTL, so a renewal 500 ms
/// late still lands long before the key expires): `fenced` without it
/// (`Mutation::FencedWithoutRenewal`) is violated there, as `set-px-lua`
/// is, and still holds with no fault.
#[test]
fn a_client_step_breaks_a_lease_that_does_not_renew() {
    use lockwright_model::model::Mutation;
    let me = |fault: Fault, mutation: Option<Mutation>| {
        verdict_alone(
            ProtocolId::Fenced,
            fault,
            PropertyId::MutualExclusion,
            mutation,
        )
    };
    let mutant = Some(Mutation::FencedWithoutRenewal);
    assert_eq!(me(Fault::ClientStep, None), Verdict::Holds, "fenced");
    assert_eq!(
        me(Fault::ClientStep, mutant),
        Verdict::Violated,
        "the mutant"
    );
    assert_eq!(
        me(Fault::None, mutant),
        Verdict::Holds,
        "the mutant, no fault"
    );
}

/// Every `holds` of the matrix sits in a column that can fail: wherever
/// some protocol holds a property under a fault, the checker finds that
/// property violated under the same fault, at the same bounds, by another
/// protocol of the catalogue or, where none is, by a kept mutant. A
/// property that the model under a fault could not break at all (a check
/// that never fires there) would show here as a column of `holds` alone.
///
/// What this does not show: faults are optional actions, so a violation
/// in a column may be one on which its fault does not act (every
/// violation under `none` is one under each fault). That a fault leaves
/// room to see a violation after it strikes is
/// `a_starved_waiter_is_seen_after_every_fault`'s business.
///
/// Four columns are all `holds` for progress (`none`, `client-skew`,
/// `client-step`, `clock-jump`: no protocol starves a waiter there); the
/// mutant `setnx-del` whose release deletes another key
/// (`Mutation::SetnxDelReleaseMissesItsKey`) does, in each of them, and
/// the test requires exactly those four, so that the docs that name them
/// stay true.
#[test]
fn every_column_that_holds_somewhere_can_fail() {
    use lockwright_model::model::Mutation;
    // The kept mutant for each property, run where no protocol of the
    // catalogue is violated.
    let mutants = [(PropertyId::Progress, Mutation::SetnxDelReleaseMissesItsKey)];
    let cache = cache();
    let (mut unwitnessed, mut by_mutant) = (Vec::new(), Vec::new());
    for fault in Fault::ALL {
        let runs: Vec<(ProtocolId, matrix::Run)> = ProtocolId::all()
            .map(|p| (p, matrix::standard_run(p, fault, Some(&cache)).unwrap()))
            .collect();
        for property in PropertyId::ALL {
            let verdicts: Vec<Verdict> = runs
                .iter()
                .flat_map(|(_, run)| &run.cells)
                .filter(|c| c.property == property)
                .map(|c| c.verdict)
                .collect();
            assert_eq!(
                verdicts.len(),
                runs.len(),
                "{fault} {property}: one cell per protocol"
            );
            if !verdicts.contains(&Verdict::Holds) || verdicts.contains(&Verdict::Violated) {
                continue;
            }
            let Some(&(_, mutation)) = mutants.iter().find(|(p, _)| *p == property) else {
                unwitnessed.push(format!("{fault} {property}: no mutant is kept for it"));
                continue;
            };
            let protocol = mutation.protocol().expect("a mutant of one protocol");
            let verdict = verdict_alone(protocol, fault, property, Some(mutation));
            if verdict == Verdict::Violated {
                by_mutant.push(format!("{fault} {property}"));
            } else {
                unwitnessed.push(format!(
                    "{fault} {property}: every protocol holds and the mutant {mutation:?} is {verdict:?}"
                ));
            }
        }
    }
    eprintln!("columns witnessed by a mutant alone: {by_mutant:?}");
    assert!(
        unwitnessed.is_empty(),
        "columns whose holds nothing can break:\n{}",
        unwitnessed.join("\n")
    );
    assert_eq!(
        by_mutant,
        [
            "none progress",
            "client-skew progress",
            "client-step progress",
            "clock-jump progress"
        ],
        "the columns that only a mutant breaks (README.md names them)"
    );
}

/// `watch-semaphore` keeps mutual exclusion under `restart` because the
/// restart loses the max-size key with the holders, and every later
/// acquire fails with a typed error (`Missing`, which progress reports). A
/// front end that reads a missing size as its configured limit
/// (`Mutation::WatchSemaphoreDefaultsAMissingSize`) admits a new holder
/// beside one that still believes it holds; with no fault it holds, as
/// the specimen does.
#[test]
fn watch_semaphore_holds_under_restart_only_by_failing() {
    use lockwright_model::model::Mutation;
    let (p, me) = (ProtocolId::WatchSemaphore, PropertyId::MutualExclusion);
    let mutant = Some(Mutation::WatchSemaphoreDefaultsAMissingSize);
    assert_eq!(verdict_alone(p, Fault::Restart, me, None), Verdict::Holds);
    assert_eq!(
        verdict_alone(p, Fault::Restart, PropertyId::Progress, None),
        Verdict::Violated,
        "the specimen fails its acquires after the restart"
    );
    assert_eq!(
        verdict_alone(p, Fault::Restart, me, mutant),
        Verdict::Violated,
        "the mutant"
    );
    assert_eq!(
        verdict_alone(p, Fault::None, me, mutant),
        Verdict::Holds,
        "the mutant, no fault"
    );
}

/// Progress can fail for every protocol, also where no fault of the matrix
/// breaks it: an application that leaks its hold
/// (`Mutation::LeaksItsHold`: after its write it leaves without releasing,
/// while its machine goes on) starves the waiters wherever nothing ends
/// the hold, that is where the lease is renewed or there is no TTL, and
/// the TTL frees it everywhere else. With no fault, the verdicts split
/// exactly so.
#[test]
fn a_leaked_hold_starves_the_waiters_unless_its_ttl_frees_it() {
    use lockwright_model::model::Mutation;
    // Where nothing ends a leaked hold: no TTL at all, or a machine that
    // renews its lease for as long as it holds.
    let never_ends = [
        (ProtocolId::SetnxDel, "no TTL"),
        (ProtocolId::WatchSemaphore, "no TTL"),
        (ProtocolId::Reentrant, "renewed"),
        (ProtocolId::Fenced, "renewed"),
        (ProtocolId::TimeFenced, "renewed"),
        (ProtocolId::LeaseSemaphore, "renewed"),
        (ProtocolId::TimeFencedSemaphore, "renewed"),
    ];
    let mut wrong = Vec::new();
    for p in ProtocolId::all() {
        let why = never_ends
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, why)| *why);
        let mutant = Some(Mutation::LeaksItsHold);
        let leaked = verdict_alone(p, Fault::None, PropertyId::Progress, mutant);
        let expected = match why {
            Some(_) => Verdict::Violated,
            None => Verdict::Holds,
        };
        eprintln!(
            "{p}: a leaked hold {}: progress {leaked}",
            why.unwrap_or("expires")
        );
        if leaked != expected {
            wrong.push(format!("{p}: progress {leaked}, expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every fault leaves room to see a violation after it strikes: the
/// mutant whose release deletes another key
/// (`Mutation::SetnxDelReleaseMissesItsKey`) starves a waiter, and under
/// each fault the checker finds that starvation in a state where the
/// fault has already acted (`ModelConfig::after_fault`), within the
/// standard horizon. A fault that ends too close to the horizon for a
/// waiter's patience to run out after it would make every `progress` of
/// its column read `holds` whatever the protocol did: `restart-delayed`,
/// whose node stays down for the TTL, once did, and `watch-semaphore`'s
/// starvation after it was hidden until the horizon moved by the node's
/// time down (`ModelConfig::obstruction`).
#[test]
fn a_starved_waiter_is_seen_after_every_fault() {
    use lockwright_model::model::Mutation;
    let mut unseen = Vec::new();
    for fault in Fault::ALL {
        let mut cfg = lockwright_model::ModelConfig::for_properties(
            ProtocolId::SetnxDel,
            fault,
            &[PropertyId::Progress],
        );
        cfg.mutation = Some(Mutation::SetnxDelReleaseMissesItsKey);
        cfg.after_fault = true;
        let (verdict, states) = verdict_of_run(cfg, PropertyId::Progress);
        eprintln!("{fault}: {states} states, progress after the fault {verdict}");
        if verdict != Verdict::Violated {
            unseen.push(fault);
        }
    }
    assert!(unseen.is_empty(), "no starvation seen after {unseen:?}");
}

/// A paused client whose hold the servers still keep holds waiters back
/// while it is paused, in whatever unfinished phase the pause caught it:
/// here a holder that has written and whose release is emitted but not
/// yet written when it pauses (where the model's pause falls), so it is
/// no longer inside, but its key stays. `setnx-del`'s key never expires:
/// paused to the horizon, the waiter's patience keeps moving with time
/// (`State::last_inside`) and `progress` holds throughout, as it does
/// behind a paused holder that is still inside; with the old rule, which
/// excused only the holder, the waiter was judged from the pause on and
/// `progress` fails here after its 30 s patience. `set-px-lua`'s key
/// expires after its TTL: from then on the paused client obstructs no
/// longer and the patience stops moving (a rule that excused every paused
/// client would fail there).
#[test]
fn a_paused_client_whose_hold_stays_holds_waiters_back() {
    use lockwright_model::model::Phase;
    use lockwright_model::{Action, LockModel, State};
    // c0 takes the lock, writes, emits its release and pauses; then time
    // passes (and c1 tries) until `until` says stop, c0 never resuming.
    // Each state after time passed is handed to `each`.
    fn pause_a_releaser(
        model: &LockModel,
        mut until: impl FnMut(&State) -> bool,
        mut each: impl FnMut(&State),
    ) -> State {
        let step = |s: &State, a: &Action| model.step(s, a).unwrap();
        let mut s = model.initial();
        for _ in 0..8 {
            if s.clients[0].phase != Phase::Acquiring {
                break;
            }
            let a = enabled_in(model, &s)
                .into_iter()
                .find(|a| {
                    matches!(
                        a,
                        Action::RoundTrip { client: 0, .. }
                            | Action::Deliver { client: 0, .. }
                            | Action::Receive { client: 0, .. }
                    )
                })
                .expect("c0's acquire goes on");
            s = step(&s, &a);
        }
        s = step(&s, &Action::Check(0));
        s = step(&s, &Action::Write(0));
        assert_eq!(s.clients[0].phase, Phase::Releasing);
        s = step(&s, &Action::Pause(0));
        assert!(s.clients[0].at_server, "c0's key is still at the node");
        while !until(&s) {
            let actions = enabled_in(model, &s);
            let next = actions
                .iter()
                .find(|a| matches!(a, Action::Tick(_)))
                .or_else(|| actions.iter().find(|a| !matches!(a, Action::Resume(_))))
                .expect("something but the resumption is enabled");
            s = step(&s, next);
            assert!(s.clients[0].paused);
            if matches!(next, Action::Tick(_)) {
                each(&s);
            }
        }
        s
    }
    // No expiry: paused to the horizon, the waiter is excused throughout.
    let model = standard_model(ProtocolId::SetnxDel, Fault::Pause);
    let horizon = model.cfg.horizon;
    let mut ticks = 0;
    let end = pause_a_releaser(
        &model,
        |s| s.time >= horizon,
        |s| {
            ticks += 1;
            assert!(s.clients[0].at_server);
            assert_eq!(
                s.last_inside, s.time,
                "a paused client's hold obstructs at t={}",
                s.time
            );
            assert!(
                model.holds_in(PropertyId::Progress, s),
                "progress at t={}",
                s.time
            );
        },
    );
    assert!(ticks > 2, "time passed {ticks} times");
    assert!(
        end.time > model.cfg.patience() + 1_000,
        "the run outlasts a patience"
    );
    assert!(end.clients[1].waiting_since.is_some(), "c1 still waits");
    // A TTL: once the key has expired, the paused client obstructs no more.
    let model = standard_model(ProtocolId::SetPxLua, Fault::Pause);
    let mut lapsed = None;
    pause_a_releaser(
        &model,
        |s| !s.clients[0].at_server,
        |s| {
            if s.clients[0].at_server {
                assert_eq!(s.last_inside, s.time, "the key is still there");
            } else {
                lapsed = Some((s.time, s.last_inside));
            }
        },
    );
    let (time, last_inside) = lapsed.expect("the key expires while c0 is paused");
    assert!(
        last_inside < time,
        "the patience stops when the hold lapses (t={time}, last inside {last_inside})"
    );
}
