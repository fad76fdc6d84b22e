//! # lockwright-model
//!
//! Stateright checks of the core's own machines: which Redis lock or
//! semaphore keeps which property under which fault, with the shortest
//! counterexample for every violation.
//!
//! The model ([`model::LockModel`]) holds `lockwright-core` types directly:
//! each client is a [`lockwright_core::Machine`], each Redis node a
//! [`lockwright_core::keyspace::Keyspace`]. What is checked is what runs.
//! Faults ([`fault::Fault`]) are budgeted nondeterministic actions; the four
//! properties ([`fault::PropertyId`]) are evaluated in every reachable state
//! within the bounds of [`model::ModelConfig`].
//!
//! [`matrix`] runs the checker for every (protocol, fault) cell and compares
//! each verdict with the expectations in `model/expectations.txt`;
//! [`cache`] keeps each checked cell for the next test or command that
//! needs it, for as long as the sources stay the same;
//! [`trace`] prints a counterexample step by step and draws it as an SVG
//! sequence diagram. The `lockwright` binary is the command line.
//!
//! [`sim`] runs the same machines in a deterministic discrete-event
//! simulator instead: random runs with latency, loss and scheduled faults,
//! far longer than the checker's bounds, judged by the same rule of who is
//! inside ([`inside`]).

pub mod cache;
pub mod docs;
pub mod fault;
pub mod inside;
pub mod matrix;
pub mod model;
pub mod pairs;
pub mod sim;
pub mod trace;

/// The allocator for programs that run the checker, to be declared by each
/// (`#[global_allocator] static A: lockwright_model::Allocator =
/// lockwright_model::Allocator;`: the `lockwright` binary, the model's
/// tests, the chaos replay): the checker clones a whole state for every step
/// it takes, and with the system allocator a third of its time went to
/// `malloc` and `free`. A library does not choose it for its users, and the
/// chaos clients keep the system allocator.
pub use mimalloc::MiMalloc as Allocator;

pub use fault::{Fault, FaultPair, PropertyId};
pub use model::{Action, LockModel, ModelConfig, State};

use stateright::{Model, Property};

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.enabled(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.step(state, &action)
    }

    fn format_action(&self, action: &Action) -> String {
        format!("{action:?}")
    }

    fn format_step(&self, last_state: &State, action: Action) -> Option<String> {
        let next = self.step(last_state, &action)?;
        Some(format!(
            "{}\n{}",
            self.describe_action(last_state, &action),
            self.describe(&next)
        ))
    }

    fn as_svg(&self, path: stateright::Path<State, Action>) -> Option<String> {
        let steps: Vec<(State, Option<Action>)> = path.into_vec();
        Some(trace::svg(self, &steps))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        self.properties
            .iter()
            .map(|p| match p {
                PropertyId::MutualExclusion => {
                    Property::always("mutual-exclusion", |m: &LockModel, s| {
                        m.holds_in(PropertyId::MutualExclusion, s)
                    })
                }
                PropertyId::FencedResource => {
                    Property::always("fenced-resource", |m: &LockModel, s| {
                        m.holds_in(PropertyId::FencedResource, s)
                    })
                }
                PropertyId::OwnerOnly => Property::always("owner-only", |m: &LockModel, s| {
                    m.holds_in(PropertyId::OwnerOnly, s)
                }),
                PropertyId::Progress => Property::always("progress", |m: &LockModel, s| {
                    m.holds_in(PropertyId::Progress, s)
                }),
            })
            .chain(
                self.sanity
                    .then(|| Property::always("time passes", |m: &LockModel, s| m.time_passes(s))),
            )
            .chain(self.sanity.then(|| {
                Property::always("deadlines kept", |m: &LockModel, s| m.deadlines_kept(s))
            }))
            .collect()
    }
}
