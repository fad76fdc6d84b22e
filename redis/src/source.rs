//! Where a node's connections go: a fixed address, or the master a set of
//! Sentinels names at the time of connecting.

use redis::{ConnectionAddr, RedisError};
use std::time::Duration;

/// How to reach one node.
#[derive(Clone)]
pub(crate) enum Source {
    /// A fixed address (boxed: a client with TLS support is large).
    Direct(Box<redis::Client>),
    /// The current master of a Sentinel-monitored group.
    Sentinel(Box<SentinelGroup>),
    /// A Redis Cluster: requests go through one cluster connection, which
    /// sends each to the master of its keys' slot.
    Cluster {
        /// The cluster client (seed nodes, timeouts).
        client: Box<redis::cluster::ClusterClient>,
        /// A seed node, for the pub/sub connection of release notices (a
        /// Cluster delivers every `PUBLISH` to every node).
        seed: Box<redis::Client>,
    },
}

/// A master group watched by Sentinels.
#[derive(Clone)]
pub(crate) struct SentinelGroup {
    /// The Sentinels, asked in order.
    pub(crate) sentinels: Vec<redis::Client>,
    /// The group's name (`sentinel monitor <name> ...`).
    pub(crate) master_name: String,
    /// Credentials, database and protocol for the master; its address is
    /// replaced by the one the Sentinels name.
    pub(crate) template: redis::Client,
}

impl Source {
    /// A client for the node as of now: for a Sentinel group, the master
    /// the first answering Sentinel names (asked at every connect, so a
    /// failover is followed by the next connection).
    pub(crate) async fn client(&self, timeout: Duration) -> Result<redis::Client, RedisError> {
        match self {
            Source::Direct(client) => Ok((**client).clone()),
            Source::Sentinel(group) => group.master(timeout).await,
            Source::Cluster { seed, .. } => Ok((**seed).clone()),
        }
    }

    /// For logs and Debug: the address, or the Sentinel group (never a
    /// password).
    pub(crate) fn describe(&self) -> String {
        match self {
            Source::Direct(client) => client.get_connection_info().addr().to_string(),
            Source::Cluster { seed, .. } => {
                format!("cluster via {}", seed.get_connection_info().addr())
            }
            Source::Sentinel(group) => format!(
                "sentinel {} via {}",
                group.master_name,
                group
                    .sentinels
                    .iter()
                    .map(|s| s.get_connection_info().addr().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

impl SentinelGroup {
    /// The master the first Sentinel able to name it names. When none
    /// can, the error is a passing one (a Sentinel down or slow) if any
    /// was: only when every Sentinel answered that it cannot name this
    /// master (not a Sentinel, no such group) is the error one that no
    /// retry mends, whatever the Sentinels' order.
    async fn master(&self, timeout: Duration) -> Result<redis::Client, RedisError> {
        let mut permanent: Option<RedisError> = None;
        let mut transient: Option<RedisError> = None;
        for sentinel in &self.sentinels {
            let error = match tokio::time::timeout(timeout, self.ask(sentinel)).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) => e,
                Err(_) => {
                    RedisError::from((redis::ErrorKind::Io, "sentinel did not answer in time"))
                }
            };
            if crate::conn::classify(&error).permanent.is_some() {
                permanent = Some(error);
            } else {
                transient = Some(error);
            }
        }
        Err(transient.or(permanent).unwrap_or_else(|| {
            RedisError::from((redis::ErrorKind::EmptySentinelList, "no sentinel given"))
        }))
    }

    async fn ask(&self, sentinel: &redis::Client) -> Result<redis::Client, RedisError> {
        // Timed by `master`'s timeout as a whole (redis-rs' default reply
        // timeout of 500 ms would cut a longer connect timeout short).
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query_async(&mut conn)
            .await?;
        let Some((host, port)) = addr else {
            return Err(RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the sentinel does not know this master",
                self.master_name.clone(),
            )));
        };
        let info = self
            .template
            .get_connection_info()
            .clone()
            .set_addr(ConnectionAddr::Tcp(host, port));
        redis::Client::open(info)
    }
}
