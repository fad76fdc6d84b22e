//! Connections to the nodes, and the requests in flight on them.
//!
//! Two kinds of route lead to a node:
//!
//! - [`Route::Shared`]: one multiplexed connection per node, shared by every
//!   hold of a [`Lock`](crate::Lock) (and its clones). Used for every
//!   protocol whose requests carry no connection state
//!   ([`ProtocolId::uses_watch`](lockwright_core::ProtocolId::uses_watch)
//!   is false): single commands, scripts, and `MULTI … EXEC` written as one
//!   pipeline, which no other request can interleave.
//! - [`Route::Own`]: a connection of the hold's own, opened at its first
//!   request, for the protocols that `WATCH`: the watched keys belong to
//!   one connection until `EXEC`, and another hold's requests on it would
//!   corrupt them.
//!
//! A shared connection must not fail a request because it died while
//! nobody used it (a server restart, `CLIENT KILL`, an idle timeout): the
//! request would never have reached the server, yet its outcome would read
//! as unknown. So the adapter runs the connection's I/O task itself and
//! marks the connection closed the moment that task ends (it ends when the
//! server closes the socket, or with the runtime it was spawned on, when a
//! `Lock` outlives that runtime); the next request opens a new connection
//! before it is written. That holds for plain TCP; a TLS, Unix-socket or
//! Cluster connection is opened by redis-rs, which does not say when its
//! I/O ends, so a dead idle one is noticed by the first request that fails
//! on it (see [`connect`]). Only a request written to a connection that then
//! fails, or that times out, gets [`Outcome::Unknown`]; that also retires
//! the connection, so the next request reconnects.
//!
//! Requests to one node leave in the order the machine emitted them, one at
//! a time (the next is written when the previous one's reply is in);
//! requests to different nodes (RedLock) run in parallel.

use crate::keys::KeyMap;
use crate::notices::Hub;
use crate::source::{SentinelGroup, Source};
use crate::wire;
use crate::{Error, OptionsError};
use futures_util::future::{BoxFuture, Either};
use lockwright_core::keyspace::Reply;
use lockwright_core::{Outcome, Request, RequestId};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::Value;
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A connection to one node, or to a Redis Cluster (which routes each
/// request to the master of its keys' slot and follows `MOVED`/`ASK`).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One node.
    Single(MultiplexedConnection),
    /// A Cluster.
    Cluster(ClusterConnection),
}

/// A single node's request runs on redis-rs' own future (no boxed future
/// per request, which `ConnectionLike` would make); a Cluster's through
/// `ConnectionLike`, which routes it.
impl wire::Sends for Conn {
    fn like(&mut self) -> &mut (dyn ConnectionLike + Send) {
        self
    }

    fn send_one<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl std::future::Future<Output = Result<Value, RedisError>> + Send + 'a {
        match self {
            Conn::Single(c) => Either::Left(c.send_packed_command(cmd)),
            Conn::Cluster(c) => Either::Right(c.req_packed_command(cmd)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A live shared connection.
#[derive(Clone)]
struct Live {
    conn: Conn,
    /// Set when the connection's I/O task has ended (`None`: the connection
    /// was opened by redis-rs, which does not say; see [`connect`]).
    closed: Option<Arc<AtomicBool>>,
    generation: u64,
}

impl Live {
    fn is_open(&self) -> bool {
        self.closed
            .as_ref()
            .is_none_or(|closed| !closed.load(Ordering::Acquire))
    }
}

/// One node's shared multiplexed connection, opened lazily and reopened
/// after it closes or fails.
pub(crate) struct SharedConn {
    source: Arc<Source>,
    /// The connect timeout.
    timeout: Duration,
    live: Mutex<Option<Live>>,
    /// One connect at a time; the others wait for it and share its result.
    connecting: tokio::sync::Mutex<()>,
    generations: AtomicU64,
    /// Slots for the requests on the live connection, kept between requests
    /// (see [`LiveSlot`]).
    slots: Mutex<Vec<LiveSlot>>,
    /// The node's pub/sub connection for release notices (opened by the
    /// first lock with `notify` that waits).
    pub(crate) hub: Arc<Hub>,
}

impl SharedConn {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> SharedConn {
        SharedConn::from_source(Source::Direct(Box::new(client)), timeout)
    }

    fn from_source(source: Source, timeout: Duration) -> SharedConn {
        let source = Arc::new(source);
        SharedConn {
            hub: Hub::new(Arc::clone(&source), timeout),
            source,
            timeout,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
            slots: Mutex::new(Vec::new()),
        }
    }

    /// A slot for a request on the live connection: a spare one, or a new
    /// one when every slot is in use.
    fn take_slot(&self) -> LiveSlot {
        let spare = self.slots.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.unwrap_or_else(live_slot)
    }

    /// Keep `slot`, emptied, for the next request (up to [`SPARE_SLOTS`]).
    fn give_back(&self, mut slot: LiveSlot) {
        slot.clear();
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.len() < SPARE_SLOTS {
            slots.push(slot);
        }
    }

    fn current(&self) -> Option<Live> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.as_ref().filter(|l| l.is_open()).cloned()
    }

    async fn get(&self) -> Result<Live, RedisError> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _one = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let (conn, closed) = match &*self.source {
            Source::Cluster { client, .. } => {
                let conn = tokio::time::timeout(self.timeout, client.get_async_connection())
                    .await
                    .map_err(|_| RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
                (Conn::Cluster(conn), None)
            }
            _ => {
                let client = self.source.client(self.timeout).await?;
                let (conn, closed) = connect(&client, self.timeout).await?;
                (Conn::Single(conn), closed)
            }
        };
        let live = Live {
            conn,
            closed,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
        tracing::debug!(generation = live.generation, "connected");
        Ok(live)
    }

    /// Retire the connection of `generation` (if it is still the current
    /// one): the next request reconnects.
    fn retire(&self, generation: u64) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
        }
    }
}

/// Open a multiplexed connection. For TCP addresses the adapter runs the
/// connection's I/O task itself and returns a flag set when it ends; other
/// addresses (TLS, Unix sockets) go through redis-rs, without the flag: a
/// dead idle connection is then noticed by the first request that fails on
/// it.
async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> Result<(MultiplexedConnection, Option<Arc<AtomicBool>>), RedisError> {
    // Replies are timed by the adapter, by each hold's `request_timeout`
    // (the `Io`'s timer, or `execute`): redis-rs' own default of 500 ms per
    // reply would cut a longer `request_timeout` short.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let info = client.get_connection_info();
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        return Ok((conn, None));
    };
    let timed_out = || RedisError::from((redis::ErrorKind::Io, "connect timed out"));
    let addresses = tokio::time::timeout(timeout, resolve(host, *port))
        .await
        .map_err(|_| timed_out())??;
    let stream = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addresses[..]))
        .await
        .map_err(|_| timed_out())??;
    stream.set_nodelay(true)?;
    let (conn, io_task) = tokio::time::timeout(
        timeout,
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config),
    )
    .await
    .map_err(|_| timed_out())??;
    let closed = Arc::new(AtomicBool::new(false));
    let flag = ClosedOnDrop(Arc::clone(&closed));
    tokio::spawn(async move {
        // The flag is set when the I/O task ends and also when this task
        // is dropped unfinished: the runtime it was spawned on shut down,
        // which ends the connection's I/O with it.
        let _flag = flag;
        io_task.await;
    });
    Ok((conn, Some(closed)))
}

/// Marks a shared connection closed when dropped: by the task that runs the
/// connection's I/O, whether the I/O ended (the server closed the socket) or
/// the task was dropped with its runtime. Without the second, a `Lock` used
/// from a runtime after the one that opened its connection ended wrote its
/// next request to a dead connection and read the outcome as unknown,
/// though the request never left (`edge_cases.rs`,
/// `a_connection_whose_runtime_ended_is_reopened_before_a_request_is_written`).
struct ClosedOnDrop(Arc<AtomicBool>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
        tracing::debug!("connection closed");
    }
}

/// A connection of its own to `source`'s node as of now.
async fn connect_to(
    source: &Source,
    timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let client = source.client(timeout).await?;
    Ok(connect(&client, timeout).await?.0)
}

/// The addresses of `host`. A name that does not exist fails with an error
/// [`classify`] tells apart from a resolver that is down for a while.
async fn resolve(host: &str, port: u16) -> Result<Vec<std::net::SocketAddr>, RedisError> {
    match tokio::net::lookup_host((host, port)).await {
        Ok(found) => {
            let found: Vec<_> = found.collect();
            if found.is_empty() {
                Err(unknown_host(host, "no address"))
            } else {
                Ok(found)
            }
        }
        // EAI_AGAIN ("Temporary failure in name resolution") may clear;
        // anything else (EAI_NONAME, ...) is an answer about the name.
        Err(e) if e.to_string().contains("Temporary failure") => Err(e.into()),
        Err(e) => Err(unknown_host(host, &e.to_string())),
    }
}

const UNKNOWN_HOST: &str = "unknown host";

fn unknown_host(host: &str, why: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Client,
        UNKNOWN_HOST,
        format!("{host}: {why}"),
    ))
}

/// A request that got no reply, or could not be sent: why, and whether a
/// retry can mend it.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    /// The problem, for logs and errors (never a password: redis-rs errors
    /// do not carry the URL).
    pub(crate) text: String,
    /// `Some`: no retry can mend it (wrong password, unknown host, a reply
    /// that is not the Redis protocol).
    pub(crate) permanent: Option<Error>,
}

impl Failure {
    fn transient(text: impl Into<String>) -> Failure {
        Failure {
            text: text.into(),
            permanent: None,
        }
    }
}

/// Sort a connection-level error: permanent (authentication, unknown host,
/// protocol) or transient (refused, reset, timed out: the server may come
/// back).
pub(crate) fn classify(e: &RedisError) -> Failure {
    let text = e.to_string();
    // A Cluster connection wraps its nodes' errors: their kinds and codes
    // survive only in the text.
    let says = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let permanent = if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || says(&["WRONGPASS", "NOAUTH", "NOPERM", "AuthenticationFailed"])
    {
        Some(Error::Auth(text.clone()))
    } else if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel
        || says(&[
            "cluster support disabled",
            "unknown command 'SENTINEL'",
            "unknown command `SENTINEL`",
        ])
    {
        Some(Error::Topology(text.clone()))
    } else if e.kind() == redis::ErrorKind::Client && text.contains(UNKNOWN_HOST) {
        Some(Error::UnknownHost(
            e.detail().map_or_else(|| text.clone(), str::to_owned),
        ))
    } else if e.kind() == redis::ErrorKind::Parse {
        Some(Error::Protocol(text.clone()))
    } else {
        None
    };
    Failure { text, permanent }
}

/// Connections to a set of Redis nodes (one node, or RedLock's masters),
/// shared by every [`Lock`](crate::Lock) and [`Semaphore`](crate::Semaphore)
/// built on it with `Lock::on` / `Semaphore::on`: one multiplexed
/// connection per node, opened at the first request, reopened when the
/// server closes it. Cheap to clone (clones share the connections).
///
/// A process that takes many locks (one per order, per item, per task) on
/// the same servers should build them on one `Nodes`: each `Lock::new`
/// opens connections of its own.
///
/// ```no_run
/// use lockwright_redis::{redis, Lock, LockOptions, Nodes, ProtocolId};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), lockwright_redis::Error> {
/// let nodes = Nodes::new([redis::Client::open("redis://127.0.0.1/").expect("a valid URL")]);
/// let options = LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(5));
/// for order in ["o-1", "o-2"] {
///     let lock = Lock::on(&nodes, format!("order:{order}"), options.clone())?;
///     let guard = lock.acquire().await?;
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Nodes {
    shared: Arc<[Arc<SharedConn>]>,
    /// The alarm task that wakes the parked holds of every lock on these
    /// nodes (see the `park` module).
    alarms: Arc<crate::park::Alarms>,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Addresses only: connection info also holds the password.
        f.debug_list().entries(self.addresses()).finish()
    }
}

impl Nodes {
    /// Connections to `clients`' nodes (node `i` is the `i`-th client), with
    /// a one-second connect timeout.
    pub fn new(clients: impl IntoIterator<Item = redis::Client>) -> Nodes {
        Nodes::with_connect_timeout(clients, Duration::from_secs(1))
    }

    /// As [`Nodes::new`], giving up on a connect after `timeout` (the
    /// request then fails as unavailable).
    pub fn with_connect_timeout(
        clients: impl IntoIterator<Item = redis::Client>,
        timeout: Duration,
    ) -> Nodes {
        let timeout = timeout.max(Duration::from_millis(1));
        Nodes {
            shared: clients
                .into_iter()
                .map(|client| Arc::new(SharedConn::new(client, timeout)))
                .collect(),
            alarms: Arc::default(),
        }
    }

    /// One node: the master of the Sentinel group `master_name`, as named
    /// by `sentinels` (asked in order) each time a connection is opened, so
    /// that after a failover the next connection goes to the new master.
    /// Connections to the master use `master`'s credentials, database and
    /// protocol (its address is not used). A connection to a master that
    /// has been demoted ends when Sentinel reconfigures it, or at its first
    /// `READONLY` reply (an unknown outcome), and the next request
    /// reconnects; a hold whose key the new master does not have is then
    /// reported lost by its next renewal or extend.
    ///
    /// [`OptionsError::NoSentinels`] when `sentinels` is empty. A Sentinel
    /// list in which every answer is "not a Sentinel" or "no such master"
    /// ends acquires at once with [`Error::Topology`].
    ///
    /// ```no_run
    /// use lockwright_redis::{redis, Lock, LockOptions, Nodes, ProtocolId};
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), lockwright_redis::Error> {
    /// let sentinels = ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"]
    ///     .map(|url| redis::Client::open(url).expect("a valid URL"));
    /// let master = redis::Client::open("redis://:secret@master/").expect("a valid URL");
    /// let nodes = Nodes::sentinel(sentinels, "mymaster", master, Duration::from_secs(1))?;
    /// let lock = Lock::on(&nodes, "invoices", LockOptions::new(ProtocolId::Fenced, Duration::from_secs(5)))?;
    /// let guard = lock.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = redis::Client>,
        master_name: impl Into<String>,
        master: redis::Client,
        connect_timeout: Duration,
    ) -> Result<Nodes, Error> {
        let group = SentinelGroup {
            sentinels: sentinels.into_iter().collect(),
            master_name: master_name.into(),
            template: master,
        };
        if group.sentinels.is_empty() {
            return Err(OptionsError::NoSentinels.into());
        }
        let timeout = connect_timeout.max(Duration::from_millis(1));
        Ok(Nodes {
            shared: Arc::from([Arc::new(SharedConn::from_source(
                Source::Sentinel(Box::new(group)),
                timeout,
            ))]),
            alarms: Arc::default(),
        })
    }

    /// One node that is a whole Redis Cluster, reached through `seeds` (any
    /// of its nodes; their credentials are used for every node). Each
    /// request goes to the master of its keys' slot, and the client follows
    /// `MOVED` and `ASK` redirections, so each lock's machine runs against
    /// the master of its slot: every key of a lock (`{name}`,
    /// `{name}:fence`, ...) carries the hash tag `{name}`, so they share a
    /// slot. Release notices come over a pub/sub connection to the first
    /// seed (a Cluster delivers every `PUBLISH` to every node).
    ///
    /// The protocols that `WATCH` (`setnx-del`, `setnx-expire`,
    /// `set-px-watch`, `watch-semaphore`) need a connection of their own to
    /// one node and are refused on a Cluster
    /// ([`OptionsError::WatchOnCluster`](crate::OptionsError::WatchOnCluster)).
    ///
    /// ```no_run
    /// use lockwright_redis::{redis, Lock, LockOptions, Nodes, ProtocolId};
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), lockwright_redis::Error> {
    /// let seeds = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]
    ///     .map(|url| redis::Client::open(url).expect("a valid URL"));
    /// let nodes = Nodes::cluster(seeds, Duration::from_secs(1))?;
    /// let lock = Lock::on(&nodes, "invoices", LockOptions::new(ProtocolId::Fenced, Duration::from_secs(5)))?;
    /// let guard = lock.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster(
        seeds: impl IntoIterator<Item = redis::Client>,
        connect_timeout: Duration,
    ) -> Result<Nodes, Error> {
        let seeds: Vec<redis::Client> = seeds.into_iter().collect();
        let Some(seed) = seeds.first().cloned() else {
            return Err(OptionsError::NoSeeds.into());
        };
        let timeout = connect_timeout.max(Duration::from_millis(1));
        let client = redis::cluster::ClusterClient::builder(
            seeds.iter().map(|s| s.get_connection_info().clone()),
        )
        .connection_timeout(timeout)
        .build()
        .map_err(|e| {
            classify(&e)
                .permanent
                .unwrap_or(Error::Unavailable(e.to_string()))
        })?;
        Ok(Nodes {
            shared: Arc::from([Arc::new(SharedConn::from_source(
                Source::Cluster {
                    client: Box::new(client),
                    seed: Box::new(seed),
                },
                timeout,
            ))]),
            alarms: Arc::default(),
        })
    }

    /// Is this a Redis Cluster (built with [`Nodes::cluster`])?
    pub fn is_cluster(&self) -> bool {
        self.shared
            .iter()
            .any(|s| matches!(*s.source, Source::Cluster { .. }))
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// No node at all (every lock on it fails to build).
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }

    /// Each node's address (never its password).
    pub fn addresses(&self) -> Vec<String> {
        self.shared.iter().map(|s| s.source.describe()).collect()
    }

    /// Node `i`'s release-notice hub.
    pub(crate) fn hub(&self, i: usize) -> Option<Arc<Hub>> {
        self.shared.get(i).map(|s| Arc::clone(&s.hub))
    }

    /// The alarm task of these nodes' parked holds.
    pub(crate) fn alarms(&self) -> &Arc<crate::park::Alarms> {
        &self.alarms
    }

    /// The routes of `protocol`'s holds: the shared connections, or (for the
    /// protocols that `WATCH`) the clients, for connections of each hold's own.
    pub(crate) fn routes(&self, protocol: lockwright_core::ProtocolId) -> Vec<Route> {
        self.shared
            .iter()
            .map(|shared| {
                if protocol.uses_watch() {
                    Route::Own(Arc::clone(&shared.source))
                } else {
                    Route::Shared(Arc::clone(shared))
                }
            })
            .collect()
    }
}

/// Where a hold's requests to one node go.
#[derive(Clone)]
pub(crate) enum Route {
    /// The node's shared connection.
    Shared(Arc<SharedConn>),
    /// A connection of the hold's own to this node.
    Own(Arc<Source>),
}

impl Route {
    /// The node, for logs and Debug (never a password).
    pub(crate) fn describe(&self) -> String {
        match self {
            Route::Shared(shared) => shared.source.describe(),
            Route::Own(source) => source.describe(),
        }
    }
}

/// A finished request: its node, its outcome, and for an unknown outcome
/// the connection problem behind it.
pub(crate) struct Finished {
    pub(crate) id: RequestId,
    pub(crate) node: usize,
    pub(crate) outcome: Outcome,
    pub(crate) failure: Option<Failure>,
}

/// The most spare [`LiveSlot`]s a node keeps: as many as its requests in
/// flight at once, up to this bound (a slot is about 1.6 KB).
const SPARE_SLOTS: usize = 64;

/// A place on the heap for the future of a request on a live shared
/// connection, used again by the node's next request. The
/// future is about 1.5 KB (most of it redis-rs' own), above what glibc
/// keeps in its per-thread cache (1,032 bytes): a box of its own per
/// request took malloc's and free's slow paths twice per lock+unlock
/// cycle. A slot is held only while its request is in flight (a hold that
/// sends nothing keeps none), then goes back to its node's spares.
type LiveSlot = Box<dyn LiveRun>;

/// A [`LiveSlot`]'s operations, on a future type that cannot be named.
trait LiveRun: Send {
    /// Start the run of `request` on `live`, in place of the last one.
    fn start(&mut self, live: Live, request: Request);
    /// Poll the run started last; once it is ready the slot is empty.
    fn poll_run(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Reply, Failure>>;
    /// Drop the run, finished or not (the request's reply is then ignored).
    fn clear(&mut self);
}

struct Reusable<M, F> {
    make: M,
    run: Pin<Box<Option<F>>>,
}

impl<M, F> LiveRun for Reusable<M, F>
where
    M: Fn(Live, Request) -> F + Send,
    F: std::future::Future<Output = Result<Reply, Failure>> + Send,
{
    fn start(&mut self, live: Live, request: Request) {
        let run = (self.make)(live, request);
        self.run.set(Some(run));
    }

    fn poll_run(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Reply, Failure>> {
        let Some(run) = self.run.as_mut().as_pin_mut() else {
            // Nothing started: no reply will come (not reached: a link
            // polls its slot only while its request runs there).
            return std::task::Poll::Pending;
        };
        let result = std::task::ready!(run.poll(cx));
        self.run.set(None);
        std::task::Poll::Ready(result)
    }

    fn clear(&mut self) {
        self.run.set(None);
    }
}

/// A new, empty [`LiveSlot`].
fn live_slot() -> LiveSlot {
    fn reusable<M, F>(make: M) -> Reusable<M, F>
    where
        M: Fn(Live, Request) -> F,
    {
        Reusable {
            make,
            run: Box::pin(None),
        }
    }
    // The run of one request on a live shared connection, the usual path.
    // An async block, not an `async fn`: an `async fn`'s future keeps its
    // arguments twice (as given, and as the body's locals), 190 bytes more
    // to copy into the slot per request.
    Box::new(reusable(|mut live: Live, request: Request| async move {
        let result = wire::execute_reply_on(&mut live.conn, &request.command).await;
        demoted(result.map_err(|e| classify(&e)))
    }))
}

/// A request on its way: its id, and the request itself until its first
/// poll, then the future that runs it (which hands back, for
/// [`Route::Own`], the connection to keep using).
struct InFlight {
    id: RequestId,
    run: Run,
    /// For a request written to a live shared connection: when its reply
    /// is late, and that connection's generation (retired when it is).
    /// The [`Io`]'s one timer watches these deadlines. (A request that must
    /// connect first times itself.)
    deadline: Option<(tokio::time::Instant, u64)>,
}

/// Where an [`InFlight`] request is.
enum Run {
    /// Next on its node, not yet written: it picks its connection, and its
    /// deadline starts, when the hold's driver first polls it (a hold run
    /// by its guard's calls may not poll for a long while).
    Waiting(Request),
    /// Started on a live shared connection, in its link's slot.
    Live,
    /// Started. In a mutex only to make guards `Sync`; reached through
    /// `get_mut`, which never locks.
    Running(Mutex<RequestFuture>),
}

type RequestFuture = BoxFuture<'static, (Result<Reply, Failure>, Option<MultiplexedConnection>)>;

struct Link {
    route: Route,
    own: Option<MultiplexedConnection>,
    /// The slot of the request in flight on a live shared connection (a
    /// mutex, as for [`Run::Running`], only to make guards `Sync`).
    slot: Option<Mutex<LiveSlot>>,
    in_flight: Option<InFlight>,
    queue: VecDeque<Request>,
    /// How the node's latest request ended, as the driver recorded it (see
    /// [`Io::answered`]).
    answered: Option<Result<(), String>>,
}

/// One hold's requests: per-node queues and the request in flight on each
/// node (at most one, so that a node runs them in order).
pub(crate) struct Io {
    links: Vec<Link>,
    timeout: Duration,
    /// Exact keys: rename the core's keys before sending.
    keys: Option<Arc<KeyMap>>,
    /// Where the next poll starts, so that no node starves another.
    next_link: usize,
    /// One timer for the reply deadlines of every request in flight (a
    /// timer per request costs a registration in the runtime's timer wheel
    /// each): armed at the earliest deadline or before it, and re-armed
    /// when it fires early. Created at the first deadline.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Where `timer` is armed.
    armed: Option<tokio::time::Instant>,
    /// `timer` was seen to fire at `armed` and has not been re-armed since
    /// (`false` does not mean it has not fired: only that no poll saw it).
    fired: bool,
}

impl Io {
    pub(crate) fn new(routes: &[Route], timeout: Duration, keys: Option<Arc<KeyMap>>) -> Io {
        Io {
            links: routes
                .iter()
                .map(|route| Link {
                    route: route.clone(),
                    own: None,
                    slot: None,
                    in_flight: None,
                    queue: VecDeque::new(),
                    answered: None,
                })
                .collect(),
            timeout,
            keys,
            next_link: 0,
            timer: None,
            armed: None,
            fired: false,
        }
    }

    /// Back to what [`Io::new`] made, keeping the links and their queues'
    /// allocations, for the next hold of the same lock (see
    /// `driver::Spare`; it keeps only an idle `Io`, whose links hold no
    /// request slot). Connections of the hold's own close now, as they
    /// would with the `Io`, and the reply timer goes too: it belongs to the
    /// runtime it was made in, and the next hold may run in another. Every
    /// field of `Io` and `Link` is reset here: a field added to either must
    /// be added here too.
    pub(crate) fn clear(&mut self) {
        for link in &mut self.links {
            link.own = None;
            link.slot = None;
            link.in_flight = None;
            link.queue.clear();
            link.answered = None;
        }
        self.next_link = 0;
        self.timer = None;
        self.armed = None;
        self.fired = false;
    }

    /// Forget the reply timer (made in a runtime that may be gone); the
    /// next poll arms a new one for the requests in flight.
    pub(crate) fn drop_timer(&mut self) {
        self.timer = None;
        self.armed = None;
        self.fired = false;
    }

    /// Queue `request` for its node. `false`: there is no such node.
    pub(crate) fn send(&mut self, mut request: Request) -> bool {
        if let Some(keys) = &self.keys {
            keys.command(&mut request.command);
        }
        let node = usize::from(request.node.0);
        let Some(link) = self.links.get_mut(node) else {
            return false;
        };
        if link.in_flight.is_some() {
            link.queue.push_back(request);
        } else {
            link.start(node, request);
        }
        true
    }

    /// The number of nodes.
    pub(crate) fn nodes(&self) -> usize {
        self.links.len()
    }

    /// Per node, how its latest request ended, as the driver recorded it:
    /// `Some(Ok(()))` replied, `Some(Err(_))` no reply (with why), `None`
    /// in flight or never sent. Tells a denial caused by unreachable nodes
    /// from one caused by a taken lock. (Kept here, beside each node's
    /// queue, so that a hold allocates no vector of its own for it.)
    pub(crate) fn answered(&self) -> impl Iterator<Item = &Option<Result<(), String>>> {
        self.links.iter().map(|l| &l.answered)
    }

    /// Node `node`'s entry of [`Io::answered`], to record an outcome.
    pub(crate) fn answered_mut(&mut self, node: usize) -> Option<&mut Option<Result<(), String>>> {
        self.links.get_mut(node).map(|l| &mut l.answered)
    }

    /// A request with an id below `id` is queued or in flight.
    pub(crate) fn has_request_below(&self, id: RequestId) -> bool {
        self.links.iter().any(|l| {
            l.in_flight.as_ref().is_some_and(|f| f.id < id) || l.queue.iter().any(|r| r.id < id)
        })
    }

    /// Nothing queued or in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.links.iter().all(|l| l.in_flight.is_none())
    }

    /// The next finished request; never resolves while nothing is in flight
    /// (use it behind `if !io.is_idle()` in a `select!`).
    pub(crate) async fn next(&mut self) -> Finished {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Finished> {
        use std::future::Future;
        use std::task::Poll;
        let count = self.links.len();
        for i in 0..count {
            let node = (self.next_link + i) % count;
            let link = &mut self.links[node];
            let Some(in_flight) = &mut link.in_flight else {
                continue;
            };
            if let Run::Waiting(_) = in_flight.run {
                if let Run::Waiting(request) = std::mem::replace(&mut in_flight.run, Run::Live) {
                    let (run, deadline) =
                        link.route
                            .begin(&mut link.own, &mut link.slot, request, self.timeout);
                    in_flight.run = run;
                    in_flight.deadline = deadline;
                }
            }
            let polled = match &mut in_flight.run {
                Run::Live => match &mut link.slot {
                    Some(slot) => slot
                        .get_mut()
                        .unwrap_or_else(|e| e.into_inner())
                        .poll_run(cx)
                        .map(|result| (result, None)),
                    None => continue,
                },
                Run::Running(future) => future
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                    .poll(cx),
                Run::Waiting(_) => continue,
            };
            let Poll::Ready((result, own)) = polled else {
                continue;
            };
            let id = in_flight.id;
            let result = match (result, in_flight.deadline) {
                // Errors of a live shared connection retire it.
                (Err(failure), Some((_, generation))) => {
                    if let Route::Shared(shared) = &link.route {
                        shared.retire(generation);
                    }
                    Err(failure)
                }
                (result, _) => result,
            };
            return Poll::Ready(self.finish(node, id, result, own));
        }
        loop {
            let earliest = self
                .links
                .iter()
                .enumerate()
                .filter_map(|(node, l)| Some((l.in_flight.as_ref()?.deadline?.0, node)))
                .min();
            let Some((deadline, node)) = earliest else {
                return Poll::Pending;
            };
            // The clock is read only once the timer has fired (a timer armed
            // at a deadline already past fires at the timer driver's next
            // turn), not on every poll: a RedLock round polls here once per
            // reply. An overdue request therefore expires when its timer is
            // seen to fire, at most one timer turn after its deadline.
            if self.armed.is_some_and(|at| at <= deadline) && self.fired {
                if deadline <= tokio::time::Instant::now() {
                    return Poll::Ready(self.expire(node));
                }
                // Fired for a request that has finished since: re-arm.
                self.armed = None;
                self.fired = false;
            }
            if self.armed.is_none_or(|at| at > deadline) {
                match &mut self.timer {
                    Some(timer) => timer.as_mut().reset(deadline),
                    None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
                }
                self.armed = Some(deadline);
                self.fired = false;
            }
            let Some(timer) = &mut self.timer else {
                return Poll::Pending;
            };
            match timer.as_mut().poll(cx) {
                // Fired: at the earliest deadline, or at an earlier one whose
                // request has since finished; look again.
                Poll::Ready(()) => self.fired = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The request in flight on `node` got no reply by its deadline: its
    /// outcome is unknown, and the connection is retired (the next request
    /// reconnects; the late reply, if any, is dropped with it).
    fn expire(&mut self, node: usize) -> Finished {
        let link = &mut self.links[node];
        // Only a request with a deadline expires, so there is one.
        let (id, deadline) = link
            .in_flight
            .as_ref()
            .map_or((RequestId(u64::MAX), None), |f| (f.id, f.deadline));
        if let (Route::Shared(shared), Some((_, generation))) = (&link.route, deadline) {
            shared.retire(generation);
        }
        let failure = Failure::transient(no_reply_within(self.timeout));
        self.finish(node, id, Err(failure), None)
    }

    /// Withdraw request `id` if it has not been written yet (queued, or next
    /// on its node but not yet polled): `true` when it is withdrawn and will
    /// never reach the server.
    pub(crate) fn cancel(&mut self, id: RequestId) -> bool {
        for link in &mut self.links {
            if let Some(at) = link.queue.iter().position(|r| r.id == id) {
                link.queue.remove(at);
                return true;
            }
            let waiting = link
                .in_flight
                .as_ref()
                .is_some_and(|f| f.id == id && matches!(f.run, Run::Waiting(_)));
            if waiting {
                link.in_flight = link.queue.pop_front().map(Link::waiting);
                return true;
            }
        }
        false
    }

    /// `node`'s request `id` is done: start the next one queued for the
    /// node, and report `result`.
    fn finish(
        &mut self,
        node: usize,
        id: RequestId,
        result: Result<Reply, Failure>,
        own: Option<MultiplexedConnection>,
    ) -> Finished {
        let count = self.links.len();
        let link = &mut self.links[node];
        link.in_flight = None;
        link.own = own;
        if let (Some(slot), Route::Shared(shared)) = (link.slot.take(), &link.route) {
            shared.give_back(slot.into_inner().unwrap_or_else(|e| e.into_inner()));
        }
        if let Some(request) = link.queue.pop_front() {
            link.start(node, request);
        }
        self.next_link = (node + 1) % count;
        finished(id, node, result)
    }
}

fn no_reply_within(timeout: Duration) -> String {
    format!(
        "no reply within the request timeout ({} ms)",
        timeout.as_millis()
    )
}

impl Link {
    /// `request` is next on this node: it starts at the driver's next poll.
    fn start(&mut self, node: usize, request: Request) {
        tracing::trace!(id = request.id.0, node, "transmit");
        self.in_flight = Some(Link::waiting(request));
    }

    fn waiting(request: Request) -> InFlight {
        InFlight {
            id: request.id,
            run: Run::Waiting(request),
            deadline: None,
        }
    }
}

impl Route {
    /// The future that runs `request` now, on the connection of the moment
    /// (`own`: the hold's own connection, for [`Route::Own`]), and its
    /// deadline when the [`Io`]'s timer watches it.
    fn begin(
        &self,
        own: &mut Option<MultiplexedConnection>,
        slot: &mut Option<Mutex<LiveSlot>>,
        request: Request,
        timeout: Duration,
    ) -> (Run, Option<(tokio::time::Instant, u64)>) {
        match self {
            Route::Shared(shared) => match shared.current() {
                // The usual case: a live connection, a slot of the node's
                // for the run, and the Io's timer watches the reply's
                // deadline.
                Some(live) => {
                    let deadline = (tokio::time::Instant::now() + timeout, live.generation);
                    slot.get_or_insert_with(|| Mutex::new(shared.take_slot()))
                        .get_mut()
                        .unwrap_or_else(|e| e.into_inner())
                        .start(live, request);
                    (Run::Live, Some(deadline))
                }
                None => {
                    let shared = Arc::clone(shared);
                    let future =
                        Box::pin(
                            async move { (run_shared(&shared, &request, timeout).await, None) },
                        );
                    (Run::Running(Mutex::new(future)), None)
                }
            },
            Route::Own(client) => {
                let client = Arc::clone(client);
                let conn = own.take();
                let future =
                    Box::pin(async move { run_own(&client, conn, &request, timeout).await });
                (Run::Running(Mutex::new(future)), None)
            }
        }
    }
}

fn finished(id: RequestId, node: usize, result: Result<Reply, Failure>) -> Finished {
    match result {
        Ok(reply) => Finished {
            id,
            node,
            outcome: Outcome::Reply(reply),
            failure: None,
        },
        Err(e) => Finished {
            id,
            node,
            outcome: Outcome::Unknown,
            failure: Some(e),
        },
    }
}

/// Run `request` on `conn` within `timeout`. `Err`: a connection problem or
/// the timeout (the outcome is unknown); server errors are replies.
async fn execute<C: wire::Sends>(
    conn: &mut C,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, Failure> {
    match tokio::time::timeout(timeout, wire::execute_reply_on(conn, &request.command)).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) => Err(classify(&e)),
        Err(_) => Err(Failure::transient(no_reply_within(timeout))),
    }
}

async fn run_shared(
    shared: &SharedConn,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, Failure> {
    // A failed connect means the request was never written: still an
    // unknown outcome for the machine (it cannot tell), with the reason.
    let mut live = shared.get().await.map_err(|e| classify(&e))?;
    let result = demoted(execute(&mut live.conn, request, timeout).await);
    if result.is_err() {
        shared.retire(live.generation);
    }
    result
}

/// A `READONLY` reply: the node is no longer a master (a failover demoted
/// it). Not an answer of the protocol's: the connection is retired so that
/// the next request goes to the master of the moment, and the machine gets
/// an unknown outcome.
fn demoted(result: Result<Reply, Failure>) -> Result<Reply, Failure> {
    match result {
        Ok(Reply::Error(text)) if text.starts_with("READONLY") => Err(Failure::transient(format!(
            "the node is a replica now: {text}"
        ))),
        other => other,
    }
}

async fn run_own(
    source: &Source,
    conn: Option<MultiplexedConnection>,
    request: &Request,
    timeout: Duration,
) -> (Result<Reply, Failure>, Option<MultiplexedConnection>) {
    let conn = match conn {
        Some(conn) => conn,
        None => match connect_to(source, timeout).await {
            Ok(conn) => conn,
            Err(e) => return (Err(classify(&e)), None),
        },
    };
    // As a single node's `Conn`, so that the command runs on redis-rs' own
    // future, unboxed.
    let mut conn = Conn::Single(conn);
    let result = demoted(execute(&mut conn, request, timeout).await);
    // After a failure the connection (and any WATCH on it) is dropped: the
    // next request reconnects, and the server forgets the watch with the
    // old socket.
    let keep = match conn {
        Conn::Single(conn) if result.is_ok() => Some(conn),
        _ => None,
    };
    (result, keep)
}

impl Route {
    /// Run one command outside any machine (a diagnostic or a clean-up),
    /// on the shared connection or a connection of its own.
    pub(crate) async fn run_once(
        &self,
        command: lockwright_core::keyspace::Command,
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let request = Request {
            id: RequestId(u64::MAX),
            node: lockwright_core::NodeId(0),
            command,
        };
        match self {
            Route::Shared(shared) => run_shared(shared, &request, timeout).await,
            Route::Own(client) => run_own(client, None, &request, timeout).await.0,
        }
    }

    /// The Redis type of `key` (`TYPE`): `string`, `hash`, `none`, ...
    pub(crate) async fn type_of(&self, key: &str, timeout: Duration) -> Result<String, Failure> {
        let mut conn = match self {
            Route::Shared(shared) => shared.get().await.map_err(|e| classify(&e))?.conn,
            Route::Own(source) => Conn::Single(
                connect_to(source, timeout)
                    .await
                    .map_err(|e| classify(&e))?,
            ),
        };
        let mut cmd = redis::cmd("TYPE");
        cmd.arg(key);
        match tokio::time::timeout(timeout, cmd.query_async::<String>(&mut conn)).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(Failure::transient("no reply to TYPE")),
        }
    }
}
