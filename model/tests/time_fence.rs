//! `time-fenced` keeps `fenced-resource` under `restart` and `failover`
//! only because of what it adds to `fenced`, and `time-fenced-semaphore`
//! only because of what it adds to `lease-semaphore`; the check would say
//! so if they did not: each mutation below takes one ingredient away and
//! the checker finds the superseded write accepted again. (That the
//! unmutated protocols hold there is the matrix rows' test.)

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use lockwright_core::keyspace::{Command, Script};
use lockwright_core::{Acquire, Machine, Millis, Protocol, ProtocolId, Token};
use lockwright_model::fault::{Fault, PropertyId};
use lockwright_model::matrix::{self, Verdict};
use lockwright_model::model::ModelConfig;

fn fenced_resource(cfg: ModelConfig) -> Verdict {
    let run = matrix::check_config(cfg, 1, false).expect("model configures");
    run.cells
        .iter()
        .find(|c| c.property == PropertyId::FencedResource)
        .expect("every property has a cell")
        .verdict
}

/// The first request of an acquire.
fn grant(protocol: ProtocolId) -> Command {
    let cfg = ModelConfig::new(protocol, Fault::None).core_config(0);
    let mut machine = Machine::new(protocol, &cfg, Token("c0".into())).unwrap();
    machine
        .acquire(Millis(0), Acquire::Until(Millis(1_000)))
        .unwrap();
    machine.poll_transmit().expect("an acquire sends").command
}

#[test]
fn the_fence_without_the_clock_repeats_after_a_restart_or_failover() {
    // `fenced` is `time-fenced` with `max(stored + 1, TIME)` cut down to
    // `stored + 1`: the same recipe, keys and arguments, another script.
    assert_same_grant_but_the_script(
        ProtocolId::TimeFenced,
        ProtocolId::Fenced,
        (Script::TimeFencedAcquire, Script::FencedAcquire),
    );
    for fault in [Fault::Restart, Fault::Failover] {
        assert_eq!(
            fenced_resource(ModelConfig::new(ProtocolId::TimeFenced, fault)),
            Verdict::Holds,
            "time-fenced {fault}"
        );
        assert_eq!(
            fenced_resource(ModelConfig::new(ProtocolId::Fenced, fault)),
            Verdict::Violated,
            "the clock cut out of the fence: fenced {fault}"
        );
    }
}

#[test]
fn a_restart_or_promotion_that_takes_no_time_lets_the_clock_fence_repeat() {
    // The node's clock must move on across the restart: with none of it,
    // the first grant after it reads the same microsecond as the last one
    // before it, and two holders carry one fence.
    for fault in [Fault::Restart, Fault::Failover] {
        let mut cfg = ModelConfig::new(ProtocolId::TimeFenced, fault);
        cfg.restart_ms = 0;
        assert_eq!(
            fenced_resource(cfg),
            Verdict::Violated,
            "time-fenced {fault} in no time"
        );
    }
}

/// The grants of `with_clock` and `counter_only` are the same command but
/// for the script: the first `max(stored + 1, TIME)`, the second
/// `stored + 1`.
fn assert_same_grant_but_the_script(
    with_clock: ProtocolId,
    counter_only: ProtocolId,
    scripts: (Script, Script),
) {
    let (
        Command::Eval {
            script: a,
            keys: ka,
            args: aa,
        },
        Command::Eval {
            script: b,
            keys: kb,
            args: ab,
        },
    ) = (grant(with_clock), grant(counter_only))
    else {
        panic!("both grants are scripts");
    };
    assert_eq!((a, b), scripts);
    assert_eq!((ka, aa), (kb, ab));
}

#[test]
fn the_semaphore_fence_without_the_clock_repeats_after_a_restart_or_failover() {
    // `lease-semaphore` is `time-fenced-semaphore` with the clock cut out
    // of its fence: the same recipe, keys and arguments, another script.
    assert_same_grant_but_the_script(
        ProtocolId::TimeFencedSemaphore,
        ProtocolId::LeaseSemaphore,
        (Script::TimeFencedLeaseAcquire, Script::LeaseAcquire),
    );
    for fault in [Fault::Restart, Fault::Failover] {
        assert_eq!(
            fenced_resource(ModelConfig::new(ProtocolId::LeaseSemaphore, fault)),
            Verdict::Violated,
            "the clock cut out of the fence: lease-semaphore {fault}"
        );
    }
}

#[test]
fn a_restart_that_takes_no_time_lets_the_semaphore_clock_fence_repeat() {
    let mut cfg = ModelConfig::new(ProtocolId::TimeFencedSemaphore, Fault::Restart);
    cfg.restart_ms = 0;
    assert_eq!(
        fenced_resource(cfg),
        Verdict::Violated,
        "time-fenced-semaphore restart in no time"
    );
}
