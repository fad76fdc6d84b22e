//! Redis masters in containers and the faults injected into them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use testcontainers::core::{IntoContainerPort, Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::clock::{frozen_env, FakeClock, OFFSET_FILE};
use crate::docker::docker;
use crate::{api_shim, ChaosError};

/// Name of the local image built by `.ci/build-redis-image.sh`.
pub const IMAGE_NAME: &str = "lockwright/redis-faketime";
/// Tag of the local image.
pub const IMAGE_TAG: &str = "7";
/// Where the image keeps libfaketime (Debian's path).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Mount point of the node's [`FakeClock`] directory inside the container.
pub const FAKETIME_DIR: &str = "/faketime";
/// The port Redis listens on inside the container.
pub const REDIS_PORT: u16 = 6379;

/// `image:tag` of the default image.
pub fn default_image() -> String {
    format!("{IMAGE_NAME}:{IMAGE_TAG}")
}

/// What a master keeps across a kill and restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Persistence {
    /// `--save '' --appendonly no`: a restarted master is empty.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: every acknowledged write
    /// survives a kill.
    AofFsyncAlways,
}

/// How to start each node of a [`crate::Cluster`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeOptions {
    /// What survives a restart.
    pub persistence: Persistence,
    /// Image name (never pulled: it must exist locally).
    pub image: String,
    /// Image tag.
    pub tag: String,
    /// How long a start or restart may take before it is an error.
    pub startup_timeout: Duration,
    /// Extra `redis-server` arguments, appended after the defaults.
    pub extra_args: Vec<String>,
    /// Start with a frozen wall clock at the epoch, moved only by
    /// [`RedisNode::set_frozen_clock_ms`] (a replay sets each node's clock to
    /// the model's). Otherwise the clock runs, offset from the real time.
    pub frozen_clock: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            persistence: Persistence::None,
            image: IMAGE_NAME.to_owned(),
            tag: IMAGE_TAG.to_owned(),
            startup_timeout: Duration::from_secs(30),
            extra_args: Vec::new(),
            frozen_clock: false,
        }
    }
}

impl NodeOptions {
    /// Options with the given persistence and defaults for the rest.
    pub fn with_persistence(persistence: Persistence) -> Self {
        Self {
            persistence,
            ..Self::default()
        }
    }

    /// The `redis-server` arguments these options stand for.
    pub fn redis_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--protected-mode",
            "no",
            "--save",
            "",
            // Replicas sync at once instead of waiting 5 s for company.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        let persistence: &[&str] = match self.persistence {
            Persistence::None => &["--appendonly", "no"],
            Persistence::AofFsyncAlways => &["--appendonly", "yes", "--appendfsync", "always"],
        };
        args.extend(persistence.iter().map(|arg| (*arg).to_owned()));
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// One Redis master in a container, reached from the host on
/// `127.0.0.1:host_port`.
///
/// The host port is fixed when the node is created, so it stays the same
/// across [`kill`](Self::kill) and [`restart`](Self::restart): clients keep
/// their configuration. Dropping the node removes the container.
#[derive(Debug)]
pub struct RedisNode {
    container: ContainerAsync<GenericImage>,
    name: String,
    host_port: u16,
    network: String,
    peer_network: String,
    clock: FakeClock,
    persistence: Persistence,
}

impl RedisNode {
    /// Starts a node attached to `network` (the clients' path, through the
    /// published port) and `peer_network` (node-to-node traffic such as
    /// replication). Both networks must exist, except that testcontainers
    /// creates `network` when it is missing.
    pub async fn start(
        name: &str,
        network: &str,
        peer_network: &str,
        options: &NodeOptions,
    ) -> Result<Self, ChaosError> {
        api_shim::ensure()?;
        let host_port = free_port()?;
        let clock = if options.frozen_clock {
            FakeClock::frozen()?
        } else {
            FakeClock::new()?
        };
        let dir = clock.dir().to_string_lossy().into_owned();
        // testcontainers pulls only when creating the container answers 404
        // (no such image); the image is checked first so that it never tries.
        let image = format!("{}:{}", options.image, options.tag);
        if docker(&["image", "inspect", "--format", "{{.Id}}", &image])
            .await
            .is_err()
        {
            return Err(ChaosError::ImageMissing(image));
        }
        let mut image = GenericImage::new(options.image.as_str(), options.tag.as_str())
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_cmd(options.redis_args())
            .with_container_name(name)
            .with_network(network)
            .with_env_var("LD_PRELOAD", LIBFAKETIME)
            .with_env_var(
                "FAKETIME_TIMESTAMP_FILE",
                format!("{FAKETIME_DIR}/{OFFSET_FILE}"),
            )
            .with_env_var("FAKETIME_NO_CACHE", "1")
            // No `FAKETIME` variable: libfaketime would prefer it to the file.
            // The file starts at `+0.000`, the real time.
            .with_mount(Mount::bind_mount(dir, FAKETIME_DIR))
            .with_mapped_port(host_port, REDIS_PORT.tcp())
            .with_startup_timeout(options.startup_timeout)
            .with_label("org.lockwright.chaos", "node");
        if options.frozen_clock {
            for (name, value) in frozen_env() {
                image = image.with_env_var(name, value);
            }
        }
        let container = image.start().await?;
        docker(&["network", "connect", peer_network, name]).await?;
        let node = Self {
            container,
            name: name.to_owned(),
            host_port,
            network: network.to_owned(),
            peer_network: peer_network.to_owned(),
            clock,
            persistence: options.persistence,
        };
        node.wait_ready(options.startup_timeout).await?;
        Ok(node)
    }

    // --- getters -------------------------------------------------------------

    /// The container's name (also a docker CLI handle).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The testcontainers handle.
    pub fn container(&self) -> &ContainerAsync<GenericImage> {
        &self.container
    }

    /// The port on 127.0.0.1 that reaches this node's Redis.
    pub fn host_port(&self) -> u16 {
        self.host_port
    }

    /// `redis://127.0.0.1:<host_port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.host_port)
    }

    /// What survives a restart of this node.
    pub fn persistence(&self) -> Persistence {
        self.persistence
    }

    /// The node's clock offset from the real time, in milliseconds.
    pub fn clock_offset_ms(&self) -> i64 {
        self.clock.offset_ms()
    }

    /// A plain redis client for this node.
    pub fn client(&self) -> Result<redis::Client, ChaosError> {
        Ok(redis::Client::open(self.url())?)
    }

    /// A new connection whose connect and every reply time out after
    /// `timeout` (a partitioned or paused node must not hang a test).
    pub async fn connect_with_timeout(
        &self,
        timeout: Duration,
    ) -> Result<MultiplexedConnection, ChaosError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Ok(self
            .client()?
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// A new connection with one-second timeouts.
    pub async fn connect(&self) -> Result<MultiplexedConnection, ChaosError> {
        self.connect_with_timeout(Duration::from_secs(1)).await
    }

    /// PING on a fresh connection, with `timeout` for connect and reply.
    pub async fn ping_within(&self, timeout: Duration) -> Result<(), ChaosError> {
        let mut connection = self.connect_with_timeout(timeout).await?;
        let reply: String = redis::cmd("PING").query_async(&mut connection).await?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(ChaosError::UnexpectedReply(reply))
        }
    }

    /// The node's own clock (`TIME`), in milliseconds since the epoch.
    pub async fn server_time_ms(&self) -> Result<i64, ChaosError> {
        let mut connection = self.connect().await?;
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut connection).await?;
        Ok(seconds * 1000 + micros / 1000)
    }

    /// Waits until the node answers PING, polling every 50 ms.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ChaosError> {
        let deadline = Instant::now() + timeout;
        loop {
            let error = match self.ping_within(Duration::from_millis(500)).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: format!("{} to answer PING ({error})", self.name),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // --- faults --------------------------------------------------------------

    /// Kills the server with SIGKILL (no shutdown save, no goodbye to
    /// clients). With [`Persistence::AofFsyncAlways`] every acknowledged
    /// write is already on disk.
    pub async fn kill(&self) -> Result<(), ChaosError> {
        docker(&["kill", "--signal", "KILL", &self.name]).await?;
        Ok(())
    }

    /// Starts the killed container again on the same host port and waits
    /// until it answers: empty without persistence, with its AOF otherwise.
    pub async fn restart(&self) -> Result<(), ChaosError> {
        docker(&["start", &self.name]).await?;
        self.wait_ready(Duration::from_secs(30)).await
    }

    /// Freezes every process of the container (cgroup freezer): connections
    /// stay open, nothing is answered, and the server's clock keeps running.
    pub async fn pause(&self) -> Result<(), ChaosError> {
        self.container.pause().await?;
        Ok(())
    }

    /// Thaws a [`pause`](Self::pause)d node; queued commands are then served.
    pub async fn unpause(&self) -> Result<(), ChaosError> {
        self.container.unpause().await?;
        Ok(())
    }

    /// Cuts the node off from everyone: disconnects it from both networks
    /// (Docker moves the published port to any network still attached, so
    /// both must go). New connections and PINGs from clients fail, and so
    /// does replication.
    pub async fn partition(&self) -> Result<(), ChaosError> {
        let attached = self.attached_networks().await?;
        for network in [&self.network, &self.peer_network] {
            if attached.contains(network) {
                docker(&["network", "disconnect", network, &self.name]).await?;
            }
        }
        Ok(())
    }

    /// Undoes [`partition`](Self::partition) (and
    /// [`isolate_from_peers`](Self::isolate_from_peers)) and waits until the
    /// node answers.
    pub async fn heal(&self) -> Result<(), ChaosError> {
        let attached = self.attached_networks().await?;
        for network in [&self.network, &self.peer_network] {
            if !attached.contains(network) {
                docker(&["network", "connect", network, &self.name]).await?;
            }
        }
        self.wait_ready(Duration::from_secs(10)).await
    }

    async fn attached_networks(&self) -> Result<Vec<String>, ChaosError> {
        let names = docker(&[
            "inspect",
            "--format",
            "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}",
            &self.name,
        ])
        .await?;
        Ok(names.split_whitespace().map(str::to_owned).collect())
    }

    /// Cuts the node off from the other nodes (replication), while clients
    /// still reach it.
    pub async fn isolate_from_peers(&self) -> Result<(), ChaosError> {
        docker(&["network", "disconnect", &self.peer_network, &self.name]).await?;
        Ok(())
    }

    /// Undoes [`isolate_from_peers`](Self::isolate_from_peers).
    pub async fn rejoin_peers(&self) -> Result<(), ChaosError> {
        docker(&["network", "connect", &self.peer_network, &self.name]).await?;
        Ok(())
    }

    /// Moves this node's clock forward by `ms` milliseconds (negative: back)
    /// at once, on top of any earlier jump. Keys whose expiry falls inside
    /// the jump are expired on their next access.
    pub fn jump_clock(&mut self, ms: i64) -> Result<(), ChaosError> {
        self.clock.jump_ms(ms)
    }

    /// Sets a frozen clock's reading (milliseconds since the epoch): see
    /// [`NodeOptions::frozen_clock`].
    pub fn set_frozen_clock_ms(&mut self, ms: u64) -> Result<(), ChaosError> {
        self.clock.set_frozen_ms(ms)
    }

    /// Sets this node's clock offset from the real time.
    pub fn set_clock_offset(&mut self, offset_ms: i64) -> Result<(), ChaosError> {
        self.clock.set_offset_ms(offset_ms)
    }

    // --- replication ---------------------------------------------------------

    /// The node's address on the peer network (what replicas connect to).
    pub async fn peer_address(&self) -> Result<String, ChaosError> {
        let template = format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            self.peer_network
        );
        let address = docker(&["inspect", "--format", &template, &self.name]).await?;
        if address.is_empty() {
            Err(ChaosError::UnexpectedReply(format!(
                "{} has no address on {}",
                self.name, self.peer_network
            )))
        } else {
            Ok(address)
        }
    }

    /// Makes this node a replica of `master` (`REPLICAOF`) and waits until
    /// the link is up and the initial sync is done.
    pub async fn replicate_from(&self, master: &RedisNode) -> Result<(), ChaosError> {
        let address = master.peer_address().await?;
        let mut connection = self.connect().await?;
        let _: String = redis::cmd("REPLICAOF")
            .arg(&address)
            .arg(REDIS_PORT)
            .query_async(&mut connection)
            .await?;
        let timeout = Duration::from_secs(15);
        let deadline = Instant::now() + timeout;
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut connection)
                .await?;
            if info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: format!("{} to sync from {}", self.name, master.name),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Promotes a replica to master (`REPLICAOF NO ONE`).
    pub async fn promote(&self) -> Result<(), ChaosError> {
        let mut connection = self.connect().await?;
        let _: String = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut connection)
            .await?;
        Ok(())
    }
}

/// A port on 127.0.0.1 that is free now (the OS picks it).
fn free_port() -> Result<u16, ChaosError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A name no other container of this machine has: prefix, process, a
/// counter and the clock's nanoseconds.
pub(crate) fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_selects_the_redis_arguments() {
        let none = NodeOptions::default().redis_args().join(" ");
        assert!(none.ends_with("--appendonly no"), "{none}");
        assert!(none.contains("--save  --repl"), "{none}");
        let aof = NodeOptions::with_persistence(Persistence::AofFsyncAlways)
            .redis_args()
            .join(" ");
        assert!(
            aof.ends_with("--appendonly yes --appendfsync always"),
            "{aof}"
        );
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name("x"), unique_name("x"));
    }
}
