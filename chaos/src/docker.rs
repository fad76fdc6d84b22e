//! The docker CLI, for the faults testcontainers has no call for (network
//! disconnect/connect, SIGKILL, restart of a killed container) and for the
//! daemon and image checks.
//!
//! The CLI negotiates its API version with the daemon, so it works with any
//! daemon; it always talks to the daemon the process was started with (see
//! [`crate::api_shim`] for why that is not always `DOCKER_HOST`).

use std::process::Stdio;

use tokio::process::Command;

use crate::{api_shim, ChaosError};

/// Runs `docker <args>` and returns its trimmed standard output.
pub(crate) async fn docker(args: &[&str]) -> Result<String, ChaosError> {
    let mut command = Command::new("docker");
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match api_shim::original_docker_host() {
        Some(host) => command.env("DOCKER_HOST", host),
        None => command.env_remove("DOCKER_HOST"),
    };
    let output = command
        .output()
        .await
        .map_err(|source| ChaosError::DockerCli {
            args: args.join(" "),
            message: source.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(ChaosError::DockerCli {
            args: args.join(" "),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Blocking variant of [`docker`], for checks made before any runtime work.
pub(crate) fn docker_blocking(args: &[&str]) -> Result<String, ChaosError> {
    let mut command = std::process::Command::new("docker");
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match api_shim::original_docker_host() {
        Some(host) => command.env("DOCKER_HOST", host),
        None => command.env_remove("DOCKER_HOST"),
    };
    let output = command.output().map_err(|source| ChaosError::DockerCli {
        args: args.join(" "),
        message: source.to_string(),
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(ChaosError::DockerCli {
            args: args.join(" "),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Why the chaos tests cannot run here, if they cannot: no docker CLI, no
/// daemon, or no local image (it is never pulled).
pub(crate) fn unavailable_reason(image: &str) -> Option<String> {
    if let Err(error) = docker_blocking(&["version", "--format", "{{.Server.APIVersion}}"]) {
        return Some(format!("Docker is not available: {error}"));
    }
    if docker_blocking(&["image", "inspect", "--format", "{{.Id}}", image]).is_err() {
        return Some(format!(
            "image {image} is not present locally (build it with .ci/build-redis-image.sh; \
             it is never pulled)"
        ));
    }
    None
}

/// The process id a chaos resource name carries after `prefix`
/// (`lockwright-chaos-<pid>-…`, `lockwright-faketime-<pid>-…`).
fn owner_pid(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Is a process with this id alive on this machine?
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what chaos runs of processes that no longer exist left behind
/// (a run killed before it could clean up): their containers, networks,
/// nemesis iptables rules and directories. Best effort: a failure leaves them for the next run.
pub(crate) fn remove_leftovers() {
    const NAMES: &str = "lockwright-chaos-";
    let dead = |name: &&str| owner_pid(name, NAMES).is_some_and(|pid| !alive(pid));
    if let Ok(names) = docker_blocking(&[
        "ps",
        "-a",
        "--filter",
        "label=org.lockwright.chaos",
        "--format",
        "{{.Names}}",
    ]) {
        let gone: Vec<&str> = names.lines().filter(dead).collect();
        if !gone.is_empty() {
            eprintln!("removing {} containers of earlier chaos runs", gone.len());
            let _ = docker_blocking(&[&["rm", "-f"][..], &gone].concat());
        }
    }
    if let Ok(names) = docker_blocking(&["network", "ls", "--format", "{{.Name}}"]) {
        for network in names.lines().filter(dead) {
            let _ = docker_blocking(&["network", "rm", network]);
        }
    }
    crate::nemesis::run::remove_leftover_rules(|owner| {
        owner_pid(owner, NAMES).is_some_and(|pid| !alive(pid))
    });
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if owner_pid(&name, "lockwright-faketime-")
                .or_else(|| owner_pid(&name, NAMES))
                .is_some_and(|pid| !alive(pid))
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_resource_is_read_from_its_name() {
        assert_eq!(
            owner_pid("lockwright-chaos-4242-3-1a2b-0", "lockwright-chaos-"),
            Some(4242)
        );
        assert_eq!(
            owner_pid("lockwright-chaos-4242-3-1a2b-peers", "lockwright-chaos-"),
            Some(4242)
        );
        assert_eq!(
            owner_pid("lockwright-faketime-17-0-99", "lockwright-faketime-"),
            Some(17)
        );
        assert_eq!(owner_pid("bridge", "lockwright-chaos-"), None);
        assert_eq!(owner_pid("lockwright-chaos-x-1", "lockwright-chaos-"), None);
        assert!(alive(std::process::id()));
    }
}
