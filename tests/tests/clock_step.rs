//! A client's wall clock that steps back (NTP steps a clock that ran
//! ahead) does not reach either front end: both read one monotonic clock
//! anchored to the wall clock once per process (`redis/src/clock.rs`, the
//! blocking crate's `now`). The model's `client-step` column is for front
//! ends that read the wall clock at every step; this test is why the
//! nemesis does not run that fault against the adapter.
//!
//! The step is real: the child process (`src/bin/clock_step_child.rs`)
//! runs under libfaketime with its monotonic clock left alone, as an NTP
//! step leaves it, and the test moves the offset file between two leases.
//! The child's own `SystemTime` shows the step (the test fails if it does
//! not); the leases granted across it must follow the monotonic clock.
//! The child also runs the core's machine under a minimal front end that
//! reads the wall clock at every step: its second deadline comes two
//! seconds short, and the same check must flag it (the mutant this test
//! keeps). Either front end's clock read from the wall clock at every call
//! fails the test the same way.

use lockwright_tests::{libfaketime_or_skip, redis_or_skip};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// How far the test steps the child's wall clock back, ms.
const STEP_MS: i64 = 2_000;

/// Tolerance, ms, between a lease's deadline and the monotonic time that
/// passed: two leases' own round trips (the first also connects) and the
/// clocks' whole-ms readings, on a loaded machine. A quarter of the step,
/// so that a deadline that moved with the step is still far outside it.
const TOLERANCE_MS: i64 = STEP_MS / 4;

/// One `lease` line of the child.
#[derive(Debug)]
struct Lease {
    async_ms: i64,
    blocking_ms: i64,
    wall_lease_ms: i64,
    mono_ms: i64,
    wall_ms: i64,
}

fn parse(line: &str) -> Lease {
    let field = |name: &str| -> i64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in the child's line {line:?}"))
    };
    assert!(line.starts_with("lease "), "the child said {line:?}");
    Lease {
        async_ms: field("async_ms"),
        blocking_ms: field("blocking_ms"),
        wall_lease_ms: field("wall_lease_ms"),
        mono_ms: field("mono_ms"),
        wall_ms: field("wall_ms"),
    }
}

#[test]
fn a_step_of_the_wall_clock_does_not_reach_either_front_end() {
    let test = "a_step_of_the_wall_clock_does_not_reach_either_front_end";
    let Some(libfaketime) = libfaketime_or_skip(test) else {
        return;
    };
    let Some(redis) = redis_or_skip(test) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("lockwright-clock-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let offset = dir.join("offset");
    std::fs::write(&offset, "+0.000").expect("the offset file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_clock_step_child"))
        .arg(redis.url())
        .arg(format!("127.0.0.1:{}", redis.port()))
        .env("LD_PRELOAD", libfaketime)
        .env("FAKETIME_TIMESTAMP_FILE", &offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut take = |stdin: &mut std::process::ChildStdin| {
        writeln!(stdin, "take").expect("the child reads");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the child answers");
        parse(line.trim())
    };
    let before = take(&mut stdin);
    std::fs::write(
        &offset,
        format!("-{}.{:03}", STEP_MS / 1000, STEP_MS % 1000),
    )
    .expect("the step");
    let after = take(&mut stdin);
    writeln!(stdin, "quit").expect("the child reads");
    let status = child.wait().expect("the child ends");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "the child failed: {status}");

    let mono = after.mono_ms - before.mono_ms;
    let wall = after.wall_ms - before.wall_ms;
    // The step happened to the child's wall clock.
    assert!(
        (wall - (mono - STEP_MS)).abs() <= TOLERANCE_MS,
        "the child's wall clock moved {wall} ms while {mono} ms passed: no step of {STEP_MS} ms"
    );
    // Both front ends' deadlines moved on with the monotonic clock.
    for (front_end, moved) in [
        ("lockwright-redis", after.async_ms - before.async_ms),
        (
            "lockwright-blocking",
            after.blocking_ms - before.blocking_ms,
        ),
    ] {
        assert!(
            follows(moved, mono),
            "{front_end}: the second lease's deadline moved {moved} ms after {mono} ms passed \
             and a {STEP_MS} ms step back of the wall clock ({before:?}, {after:?})"
        );
    }
    // The mutant: a front end that reads the wall clock at every step.
    let moved = after.wall_lease_ms - before.wall_lease_ms;
    assert!(
        !follows(moved, mono) && (moved - (mono - STEP_MS)).abs() <= TOLERANCE_MS,
        "the wall-clock front end's deadline moved {moved} ms after {mono} ms passed: \
         the check would not catch it"
    );
}

/// Did a deadline that moved `moved` ms follow `mono` ms of monotonic time?
fn follows(moved: i64, mono: i64) -> bool {
    (moved - mono).abs() <= TOLERANCE_MS
}
