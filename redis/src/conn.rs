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
//! server closes the socket); the next request opens a new connection
//! before it is written. Only a request written to a connection that then
//! fails, or that times out, gets [`Outcome::Unknown`]; that also retires
//! the connection, so the next request reconnects.
//!
//! Requests to one node leave in the order the machine emitted them, one at
//! a time (the next is written when the previous one's reply is in);
//! requests to different nodes (RedLock) run in parallel.

use crate::wire;
use futures_util::future::BoxFuture;
use lockwright_core::keyspace::Reply;
use lockwright_core::{Outcome, Request, RequestId};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A live shared connection.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
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
    client: redis::Client,
    /// The connect timeout.
    timeout: Duration,
    live: Mutex<Option<Live>>,
    /// One connect at a time; the others wait for it and share its result.
    connecting: tokio::sync::Mutex<()>,
    generations: AtomicU64,
}

impl SharedConn {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> SharedConn {
        SharedConn {
            client,
            timeout,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(0),
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
        let (conn, closed) = connect(&self.client, self.timeout).await?;
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
    // Replies are timed by each request's own timeout (see `run_shared`).
    let config = AsyncConnectionConfig::new().set_connection_timeout(timeout);
    let info = client.get_connection_info();
    let ConnectionAddr::Tcp(host, port) = &info.addr else {
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        return Ok((conn, None));
    };
    let timed_out = || RedisError::from((redis::ErrorKind::IoError, "connect timed out"));
    let stream = tokio::time::timeout(
        timeout,
        tokio::net::TcpStream::connect((host.as_str(), *port)),
    )
    .await
    .map_err(|_| timed_out())??;
    stream.set_nodelay(true)?;
    let (conn, io_task) = tokio::time::timeout(
        timeout,
        MultiplexedConnection::new_with_config(&info.redis, stream, config),
    )
    .await
    .map_err(|_| timed_out())??;
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    tokio::spawn(async move {
        io_task.await;
        flag.store(true, Ordering::Release);
        tracing::debug!("connection closed");
    });
    Ok((conn, Some(closed)))
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
/// use lockwright_core::ProtocolId;
/// use lockwright_redis::{Lock, LockOptions, Nodes};
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
        }
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
        self.shared
            .iter()
            .map(|s| s.client.get_connection_info().addr.to_string())
            .collect()
    }

    /// The routes of `protocol`'s holds: the shared connections, or (for the
    /// protocols that `WATCH`) the clients, for connections of each hold's own.
    pub(crate) fn routes(&self, protocol: lockwright_core::ProtocolId) -> Vec<Route> {
        self.shared
            .iter()
            .map(|shared| {
                if protocol.uses_watch() {
                    Route::Own(shared.client.clone())
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
    /// A connection of the hold's own to this client's node.
    Own(redis::Client),
}

impl Route {
    pub(crate) fn client(&self) -> &redis::Client {
        match self {
            Route::Shared(shared) => &shared.client,
            Route::Own(client) => client,
        }
    }
}

/// A finished request: its outcome, and for an unknown outcome the
/// connection problem behind it.
pub(crate) struct Finished {
    pub(crate) id: RequestId,
    pub(crate) outcome: Outcome,
    pub(crate) io_error: Option<String>,
}

/// A request on its way: its id and the future that runs it (which hands
/// back, for [`Route::Own`], the connection to keep using).
struct InFlight {
    id: RequestId,
    /// In a mutex only to make guards `Sync`; reached through `get_mut`,
    /// which never locks.
    future: Mutex<RequestFuture>,
}

type RequestFuture = BoxFuture<'static, (Result<Reply, String>, Option<MultiplexedConnection>)>;

struct Link {
    route: Route,
    own: Option<MultiplexedConnection>,
    in_flight: Option<InFlight>,
    queue: VecDeque<Request>,
}

/// One hold's requests: per-node queues and the request in flight on each
/// node (at most one, so that a node runs them in order).
pub(crate) struct Io {
    links: Vec<Link>,
    timeout: Duration,
    /// Where the next poll starts, so that no node starves another.
    next_link: usize,
}

impl Io {
    pub(crate) fn new(routes: &[Route], timeout: Duration) -> Io {
        Io {
            links: routes
                .iter()
                .map(|route| Link {
                    route: route.clone(),
                    own: None,
                    in_flight: None,
                    queue: VecDeque::new(),
                })
                .collect(),
            timeout,
            next_link: 0,
        }
    }

    /// Queue `request` for its node. `false`: there is no such node.
    pub(crate) fn send(&mut self, request: Request) -> bool {
        let node = usize::from(request.node.0);
        let timeout = self.timeout;
        let Some(link) = self.links.get_mut(node) else {
            return false;
        };
        if link.in_flight.is_some() {
            link.queue.push_back(request);
        } else {
            link.start(node, request, timeout);
        }
        true
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
        let count = self.links.len();
        for i in 0..count {
            let node = (self.next_link + i) % count;
            let link = &mut self.links[node];
            let Some(in_flight) = &mut link.in_flight else {
                continue;
            };
            let future = in_flight
                .future
                .get_mut()
                .unwrap_or_else(|e| e.into_inner());
            let std::task::Poll::Ready((result, own)) = future.as_mut().poll(cx) else {
                continue;
            };
            let id = in_flight.id;
            link.in_flight = None;
            link.own = own;
            if let Some(request) = link.queue.pop_front() {
                link.start(node, request, self.timeout);
            }
            self.next_link = (node + 1) % count;
            return std::task::Poll::Ready(finished(id, result));
        }
        std::task::Poll::Pending
    }
}

impl Link {
    fn start(&mut self, node: usize, request: Request, timeout: Duration) {
        tracing::trace!(id = request.id.0, node, "transmit");
        let id = request.id;
        let future: RequestFuture = match &self.route {
            Route::Shared(shared) => {
                let shared = Arc::clone(shared);
                Box::pin(async move { (run_shared(&shared, &request, timeout).await, None) })
            }
            Route::Own(client) => {
                let client = client.clone();
                let conn = self.own.take();
                Box::pin(async move { run_own(&client, conn, &request, timeout).await })
            }
        };
        self.in_flight = Some(InFlight {
            id,
            future: Mutex::new(future),
        });
    }
}

fn finished(id: RequestId, result: Result<Reply, String>) -> Finished {
    match result {
        Ok(reply) => Finished {
            id,
            outcome: Outcome::Reply(reply),
            io_error: None,
        },
        Err(e) => Finished {
            id,
            outcome: Outcome::Unknown,
            io_error: Some(e),
        },
    }
}

/// Run `request` on `conn` within `timeout`. `Err`: a connection problem or
/// the timeout (the outcome is unknown); server errors are replies.
async fn execute(
    conn: &mut MultiplexedConnection,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, String> {
    match tokio::time::timeout(timeout, wire::execute_reply(conn, &request.command)).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("request timed out".to_owned()),
    }
}

async fn run_shared(
    shared: &SharedConn,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, String> {
    // A failed connect means the request was never written: still an
    // unknown outcome for the machine (it cannot tell), with the reason.
    let mut live = shared.get().await.map_err(|e| e.to_string())?;
    let result = execute(&mut live.conn, request, timeout).await;
    if result.is_err() {
        shared.retire(live.generation);
    }
    result
}

async fn run_own(
    client: &redis::Client,
    conn: Option<MultiplexedConnection>,
    request: &Request,
    timeout: Duration,
) -> (Result<Reply, String>, Option<MultiplexedConnection>) {
    let mut conn = match conn {
        Some(conn) => conn,
        None => match connect(client, timeout).await {
            Ok((conn, _)) => conn,
            Err(e) => return (Err(e.to_string()), None),
        },
    };
    let result = execute(&mut conn, request, timeout).await;
    // After a failure the connection (and any WATCH on it) is dropped: the
    // next request reconnects, and the server forgets the watch with the
    // old socket.
    let keep = result.is_ok().then_some(conn);
    (result, keep)
}
