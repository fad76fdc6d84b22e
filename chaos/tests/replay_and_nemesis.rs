//! The two long suites against real Redis in one test binary: the replay of
//! every counterexample of the matrix (`replay.rs`) and the randomized
//! nemesis (`nemesis.rs`).
//!
//! Cargo runs test binaries one after another and libtest runs the tests of
//! one binary side by side, so here the two suites overlap. Neither needs
//! the CPU the other leaves: the replay's node clocks stand still between
//! its steps (a replay's verdict does not depend on how long a step takes),
//! and the nemesis mostly waits on real time. Filter as usual:
//! `cargo test -p lockwright-chaos --test replay_and_nemesis nemesis`.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

mod common;
#[path = "nemesis.rs"]
mod nemesis;
#[path = "replay.rs"]
mod replay;
