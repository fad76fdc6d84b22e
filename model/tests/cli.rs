//! The `lockwright check` command's bound options reach the model: RedLock
//! on another number of masters checks another space, the other protocols
//! ignore the option, and a number out of range is a usage error, not a
//! panic.

use std::process::Command;

/// The unique states of each cell `lockwright check` prints as JSON.
fn states(args: &[&str]) -> Vec<u64> {
    let out = Command::new(env!("CARGO_BIN_EXE_lockwright"))
        .arg("check")
        .args(args)
        .arg("--json")
        .output()
        .expect("lockwright runs");
    assert!(
        out.status.success(),
        "lockwright check {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("\"states\":")?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn nodes_sets_redlocks_masters_and_nothing_else() {
    let one = states(&["-p", "redlock", "-f", "none", "--nodes", "1"]);
    let three = states(&["-p", "redlock", "-f", "none", "--nodes", "3"]);
    let standard = states(&["-p", "redlock", "-f", "none"]);
    assert!(!one.is_empty(), "{one:?}");
    assert!(
        one.iter().max() < three.iter().min(),
        "three masters have more states than one: {one:?} against {three:?}"
    );
    assert_eq!(three, standard, "RedLock's standard bound is three masters");
    let lua = states(&["-p", "set-px-lua", "-f", "none"]);
    let lua_with_nodes = states(&["-p", "set-px-lua", "-f", "none", "--nodes", "5"]);
    assert_eq!(
        lua, lua_with_nodes,
        "a single-node protocol ignores --nodes"
    );
}

#[test]
fn nodes_out_of_range_is_a_usage_error() {
    for bad in ["0", "8", "five"] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockwright"))
            .args(["check", "-p", "redlock", "-f", "none", "--nodes", bad])
            .output()
            .expect("lockwright runs");
        assert_eq!(out.status.code(), Some(2), "--nodes {bad}: usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--nodes"), "--nodes {bad}: {err}");
        assert!(!err.contains("panicked"), "--nodes {bad}: {err}");
    }
}
