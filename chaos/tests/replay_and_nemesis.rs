//! The two long suites against real Redis in one test binary: the replay of
//! every counterexample of the matrix (`replay.rs`) and the randomized
//! nemesis (`nemesis.rs`).
//!
//! Cargo runs test binaries one after another and libtest runs the tests of
//! one binary side by side, so here the two suites overlap. The nemesis
//! mostly waits on real time. The replay keeps the Docker daemon busy
//! (about 60 % of two cores, mostly system time, in one measurement), but
//! its verdicts do not depend on how long a step takes (its node clocks
//! stand still between steps) unless a request waits out its 2 s timeout.
//! What they share is the host's CPU and Docker daemon; the nemesis' cuts
//! are iptables rules that the replay's `docker network create` calls do
//! not disturb (see `lockwright_chaos::nemesis::run::CUT_CHAIN`). Filter as
//! usual:
//! `cargo test -p lockwright-chaos --test replay_and_nemesis nemesis`.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

mod common;
#[path = "nemesis.rs"]
mod nemesis;
#[path = "replay.rs"]
mod replay;
