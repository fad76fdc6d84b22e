//! A one-request-per-connection HTTP shim between testcontainers and an older
//! Docker daemon.
//!
//! testcontainers 0.28 talks to the daemon through bollard 0.21 with a fixed
//! API version (`/v1.53/...`, no negotiation). A daemon older than that
//! answers every call with "client version 1.53 is too new" (Docker 20.10
//! stops at 1.41). When the daemon is older, [`ensure`] starts this shim on
//! 127.0.0.1 in a thread of its own and points `DOCKER_HOST` at it. For each
//! connection the shim strips the version prefix from the request line (the
//! daemon then uses its own version), asks for `Connection: close` so that one
//! connection carries one request, and pipes the bytes both ways to the
//! daemon's unix socket. The few calls the chaos crate makes (create, start,
//! inspect, logs, pause, stop, remove, networks) have compatible shapes.
//!
//! The docker CLI (the crate's `docker` module) negotiates by itself and is always given
//! the original `DOCKER_HOST`.

use std::path::PathBuf;
use std::sync::OnceLock;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::docker::docker_blocking;
use crate::ChaosError;

/// The API version bollard 0.21 (testcontainers 0.28) sends.
const CLIENT_API: (u32, u32) = (1, 53);
/// Longest request head the shim accepts.
const MAX_HEAD: usize = 64 * 1024;

static ORIGINAL_DOCKER_HOST: OnceLock<Option<String>> = OnceLock::new();
static SHIM: OnceLock<Result<Option<String>, String>> = OnceLock::new();

/// `DOCKER_HOST` as it was before the shim replaced it.
pub(crate) fn original_docker_host() -> Option<&'static str> {
    ORIGINAL_DOCKER_HOST
        .get_or_init(|| std::env::var("DOCKER_HOST").ok())
        .as_deref()
}

/// Makes testcontainers able to talk to the daemon: starts the shim when the
/// daemon is older than testcontainers' API version. Returns the shim's
/// address when one runs. Idempotent; call it before any testcontainers call.
pub fn ensure() -> Result<Option<&'static str>, ChaosError> {
    let original = original_docker_host();
    SHIM.get_or_init(|| start(original))
        .as_ref()
        .map(|address| address.as_deref())
        .map_err(|message| ChaosError::ApiShim(message.clone()))
}

fn start(original: Option<&str>) -> Result<Option<String>, String> {
    let socket = match original {
        None => PathBuf::from("/var/run/docker.sock"),
        Some(host) => match host.strip_prefix("unix://") {
            Some(path) => PathBuf::from(path),
            // A TCP or TLS daemon is left alone.
            None => return Ok(None),
        },
    };
    let version = docker_blocking(&["version", "--format", "{{.Server.APIVersion}}"])
        .map_err(|error| error.to_string())?;
    if parse_version(&version).is_none_or(|daemon| daemon >= CLIENT_API) {
        return Ok(None);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("lockwright-docker-api-shim".into())
        .spawn(move || runtime.block_on(serve(listener, socket)))
        .map_err(|e| e.to_string())?;
    let docker_host = format!("tcp://{address}");
    // Read by testcontainers each time it creates its client. Set once, before
    // the first container, from a process that only runs chaos code.
    std::env::set_var("DOCKER_HOST", &docker_host);
    Ok(Some(docker_host))
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

async fn serve(listener: std::net::TcpListener, socket: PathBuf) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            // A failed connection is seen by the client as a failed request.
            let _ = relay(client, socket).await;
        });
    }
}

async fn relay(mut client: TcpStream, socket: PathBuf) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(8192);
    let head_end = loop {
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too long"));
        }
        let mut chunk = [0u8; 8192];
        let read = client.read(&mut chunk).await?;
        if read == 0 {
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = rewrite_head(&String::from_utf8_lossy(&buffer[..head_end]));
    let mut daemon = UnixStream::connect(socket).await?;
    daemon.write_all(head.as_bytes()).await?;
    daemon.write_all(&buffer[head_end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut daemon).await?;
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Strips `/vX.Y` from the request target and, unless the request asks for a
/// protocol upgrade (attach, exec), replaces `Connection` with `close`.
fn rewrite_head(head: &str) -> String {
    let mut lines = head.split("\r\n").filter(|line| !line.is_empty());
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.splitn(3, ' ');
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let version = parts.next().unwrap_or("HTTP/1.1");
    let headers: Vec<&str> = lines.collect();
    let upgrade = headers
        .iter()
        .any(|line| line.to_ascii_lowercase().starts_with("upgrade:"));
    let mut out = format!("{method} {} {version}\r\n", strip_api_version(target));
    for line in &headers {
        if !upgrade && line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !upgrade {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out
}

fn strip_api_version(target: &str) -> &str {
    let Some(rest) = target.strip_prefix("/v") else {
        return target;
    };
    let end = rest.find('/').unwrap_or(rest.len());
    if end > 0 && rest[..end].chars().all(|c| c.is_ascii_digit() || c == '.') {
        if end == rest.len() {
            "/"
        } else {
            &rest[end..]
        }
    } else {
        target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_prefix_is_stripped_and_the_connection_closed() {
        let head = "POST /v1.53/containers/create?name=x HTTP/1.1\r\nhost: d\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n";
        assert_eq!(
            rewrite_head(head),
            "POST /containers/create?name=x HTTP/1.1\r\nhost: d\r\ncontent-length: 2\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn upgrade_requests_keep_their_connection_header() {
        let head =
            "POST /v1.53/exec/1/start HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n";
        assert_eq!(
            rewrite_head(head),
            "POST /exec/1/start HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        );
    }

    #[test]
    fn targets_without_a_version_are_unchanged() {
        assert_eq!(strip_api_version("/_ping"), "/_ping");
        assert_eq!(strip_api_version("/v1.41"), "/");
        assert_eq!(strip_api_version("/volumes/x"), "/volumes/x");
        assert_eq!(parse_version("1.41"), Some((1, 41)));
        assert_eq!(parse_version("x"), None);
    }
}
