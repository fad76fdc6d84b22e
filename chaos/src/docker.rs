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
