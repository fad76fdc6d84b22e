//! The driver: a tokio task that owns one core machine and runs it against
//! real Redis, in the style of quinn's `ConnectionDriver`.
//!
//! Each pass of its loop does what the core's contract asks, in order:
//!
//! 1. feed inputs: a reply (or [`Outcome::Unknown`]) from a node, the timer
//!    when the clock reached [`Protocol::poll_timeout`], or an operation the
//!    application asked for (acquire, release, extend);
//! 2. drain [`Protocol::poll_transmit`], handing each request to its node's
//!    worker; drain [`Protocol::poll_event`], routing each event to the
//!    operation waiting for it (or to the lease cell: renewals, loss);
//! 3. re-arm its one timer at the machine's next deadline.
//!
//! Every call passes the *current* time of the process' monotonic clock
//! (see the `clock` module), never the deadline it woke up for.
//!
//! One worker task per node owns that node's connection. The connection is
//! dedicated to this machine (never shared with another lock), because WATCH
//! and MULTI state is per connection; requests to one node run in the order
//! the machine emitted them, requests to different nodes (RedLock) run in
//! parallel. A connection error or a timeout becomes [`Outcome::Unknown`] and
//! drops the connection; the next request reconnects.
//!
//! When the application's handle goes away (a guard dropped, or an acquire
//! future dropped part-way), the driver finishes what is in flight, releases
//! any hold it got (best effort) and stops. If even that cannot happen (the
//! runtime shuts down, the process dies), the hold ends with its TTL.

use crate::clock::clock;
use crate::lease_cell::LeaseCell;
use crate::{wire, Error};
use lockwright_core::{
    Acquire, Event, Lease, Machine, Millis, Outcome, Protocol, Request, RequestId,
};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::Instrument;

/// How long an acquire may take, in the application's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    Once,
    Within(Duration),
    Forever,
}

/// What the application got from a successful acquire.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) lease: Lease,
    pub(crate) cell: LeaseCell,
}

/// An operation the application asks the driver for.
#[derive(Debug)]
pub(crate) enum Op {
    Acquire {
        how: How,
        done: oneshot::Sender<Result<Option<Granted>, Error>>,
    },
    Release {
        done: oneshot::Sender<Result<bool, Error>>,
    },
    Extend {
        done: oneshot::Sender<Result<Lease, Error>>,
    },
}

/// The operation whose outcome the next event decides.
#[derive(Debug)]
enum Pending {
    None,
    Acquire(oneshot::Sender<Result<Option<Granted>, Error>>),
    Release(oneshot::Sender<Result<bool, Error>>),
    Extend(oneshot::Sender<Result<Lease, Error>>),
    /// A release the driver started itself (the handle went away).
    Cleanup,
}

/// The application's end of a driver.
#[derive(Debug)]
pub(crate) struct DriverHandle {
    pub(crate) ops: mpsc::UnboundedSender<Op>,
    pub(crate) lost: watch::Receiver<bool>,
}

/// Per-node settings of the workers.
#[derive(Clone, Debug)]
pub(crate) struct NodeSettings {
    pub(crate) request_timeout: Duration,
}

/// Spawn a driver for `machine` over `clients` (node `i` is `clients[i]`).
pub(crate) fn spawn(
    machine: Machine,
    clients: &[redis::Client],
    settings: NodeSettings,
    span: tracing::Span,
) -> DriverHandle {
    let (ops_tx, ops_rx) = mpsc::unbounded_channel();
    let (replies_tx, replies_rx) = mpsc::unbounded_channel();
    let (lost_tx, lost_rx) = watch::channel(false);
    let nodes = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let (tx, rx) = mpsc::unbounded_channel();
            let worker = node_worker(client.clone(), settings.clone(), rx, replies_tx.clone());
            tokio::spawn(worker.instrument(tracing::debug_span!(parent: &span, "node", node = i)));
            tx
        })
        .collect();
    let driver = Driver {
        machine,
        nodes,
        replies: replies_rx,
        ops: ops_rx,
        ops_open: true,
        deferred: VecDeque::new(),
        pending: Pending::None,
        cell: None,
        lost: lost_tx,
        in_flight: 0,
        last_io_error: None,
    };
    tokio::spawn(driver.run().instrument(span));
    DriverHandle {
        ops: ops_tx,
        lost: lost_rx,
    }
}

struct Driver {
    machine: Machine,
    nodes: Vec<mpsc::UnboundedSender<Request>>,
    replies: mpsc::UnboundedReceiver<(RequestId, Outcome, Option<String>)>,
    ops: mpsc::UnboundedReceiver<Op>,
    ops_open: bool,
    /// Operations the machine refused as busy; retried after every pass.
    deferred: VecDeque<Op>,
    pending: Pending,
    cell: Option<LeaseCell>,
    lost: watch::Sender<bool>,
    in_flight: usize,
    /// The last connection problem, cleared by any reply: tells a denial
    /// caused by an unreachable Redis from one caused by a taken lock.
    last_io_error: Option<String>,
}

impl Driver {
    fn now(&self) -> Millis {
        clock().now()
    }

    fn instant_of(&self, at: Millis) -> Option<Instant> {
        clock().instant_of(at).map(Instant::from_std)
    }

    async fn run(mut self) {
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        loop {
            self.drain();
            if self.should_stop() {
                break;
            }
            let deadline = self.machine.poll_timeout().and_then(|t| self.instant_of(t));
            if let Some(at) = deadline {
                sleep.as_mut().reset(at);
            }
            tokio::select! {
                Some((id, outcome, io_error)) = self.replies.recv() => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    if matches!(outcome, Outcome::Reply(_)) {
                        self.last_io_error = None;
                    } else if io_error.is_some() {
                        self.last_io_error = io_error;
                    }
                    let now = self.now();
                    self.machine.handle_reply(now, id, outcome);
                }
                () = &mut sleep, if deadline.is_some() => {
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
                op = self.ops.recv(), if self.ops_open => match op {
                    Some(op) => self.apply(op),
                    None => {
                        self.ops_open = false;
                        tracing::debug!("handle dropped");
                    }
                },
            }
        }
        tracing::debug!("driver stopped");
    }

    /// The handle is gone and nothing is left to do.
    fn should_stop(&mut self) -> bool {
        if self.ops_open || !self.deferred.is_empty() {
            return false;
        }
        if self.machine.lease().is_some() && !matches!(self.pending, Pending::Cleanup) {
            // Best-effort release of a hold nobody will release.
            let now = self.now();
            if self.machine.release(now).is_ok() {
                tracing::debug!("releasing an abandoned hold");
                self.pending = Pending::Cleanup;
                if let Some(cell) = &self.cell {
                    cell.release();
                }
                self.drain();
            }
            return false;
        }
        // A request in flight may still be a grant that must be undone.
        self.in_flight == 0 && self.machine.lease().is_none()
    }

    fn apply(&mut self, op: Op) {
        let now = self.now();
        let result = match &op {
            Op::Acquire { how, .. } => {
                let how = match how {
                    How::Once => Acquire::Once,
                    How::Within(d) => {
                        Acquire::Until(now + u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    }
                    How::Forever => Acquire::Until(Millis(u64::MAX)),
                };
                self.machine.acquire(now, how)
            }
            Op::Release { .. } => {
                if let Some(cell) = &self.cell {
                    cell.release();
                }
                self.machine.release(now)
            }
            Op::Extend { .. } => self.machine.extend(now),
        };
        match (result, op) {
            (Err(lockwright_core::UsageError::Busy), op) => self.deferred.push_back(op),
            (Err(e), Op::Acquire { done, .. }) => drop(done.send(Err(e.into()))),
            (Err(e), Op::Release { done }) => drop(done.send(Err(e.into()))),
            (Err(e), Op::Extend { done }) => drop(done.send(Err(e.into()))),
            (Ok(()), Op::Acquire { done, .. }) => self.pending = Pending::Acquire(done),
            (Ok(()), Op::Release { done }) => self.pending = Pending::Release(done),
            (Ok(()), Op::Extend { done }) => self.pending = Pending::Extend(done),
        }
    }

    /// Drain the machine's outputs: requests to the node workers, events to
    /// their waiters; then retry deferred operations.
    fn drain(&mut self) {
        loop {
            while let Some(request) = self.machine.poll_transmit() {
                self.transmit(request);
            }
            let mut progressed = false;
            while let Some(event) = self.machine.poll_event() {
                progressed = true;
                self.route(event);
            }
            if !self.machine.is_busy() && matches!(self.pending, Pending::None) {
                if let Some(op) = self.deferred.pop_front() {
                    self.apply(op);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn transmit(&mut self, request: Request) {
        tracing::trace!(id = request.id.0, node = request.node.0, "transmit");
        match self.nodes.get(usize::from(request.node.0)) {
            Some(node) if node.send(request.clone()).is_ok() => self.in_flight += 1,
            _ => {
                // No such node, or its worker is gone: the request never ran.
                let now = self.now();
                self.machine.handle_reply(now, request.id, Outcome::Unknown);
            }
        }
    }

    fn route(&mut self, event: Event) {
        tracing::debug!(event = event_name(&event), "event");
        let pending = std::mem::replace(&mut self.pending, Pending::None);
        match (event, pending) {
            (Event::Acquired(lease), Pending::Acquire(done)) => {
                let cell = LeaseCell::new(lease.valid_until);
                self.cell = Some(cell.clone());
                if let Err(Ok(Some(granted))) = done.send(Ok(Some(Granted { lease, cell }))) {
                    // The acquire future was dropped part-way: give the hold back.
                    let now = self.now();
                    granted.cell.release();
                    if self.machine.release(now).is_ok() {
                        self.pending = Pending::Cleanup;
                    }
                }
            }
            (Event::Denied, Pending::Acquire(done)) => {
                let result = match self.last_io_error.take() {
                    Some(reason) => Err(Error::Unavailable(reason)),
                    None => Ok(None),
                };
                drop(done.send(result));
            }
            (Event::Released { was_held }, Pending::Release(done)) => {
                drop(done.send(Ok(was_held)));
            }
            (Event::Released { .. }, Pending::Cleanup) => {}
            (Event::Extended(lease), pending) => {
                if let Some(cell) = &self.cell {
                    if let Some(version) = cell.begin_renewal() {
                        cell.renewed(version, lease.valid_until);
                    }
                }
                match pending {
                    Pending::Extend(done) => drop(done.send(Ok(lease))),
                    other => self.pending = other,
                }
            }
            (Event::NotExtended, Pending::Extend(done)) => drop(done.send(Err(Error::NotExtended))),
            (Event::Lost, pending) => {
                if let Some(cell) = &self.cell {
                    if cell.lose() {
                        tracing::warn!("hold lost");
                        self.lost.send_replace(true);
                    }
                }
                match pending {
                    Pending::Extend(done) => drop(done.send(Err(Error::Lost))),
                    Pending::Release(done) => drop(done.send(Ok(false))),
                    other => self.pending = other,
                }
            }
            (Event::Failed(e), Pending::Acquire(done)) => drop(done.send(Err(e.into()))),
            (Event::Failed(e), Pending::Release(done)) => drop(done.send(Err(e.into()))),
            (Event::Failed(e), Pending::Extend(done)) => drop(done.send(Err(e.into()))),
            (Event::Failed(e), Pending::Cleanup) => {
                tracing::warn!(error = %e, "cleanup release failed")
            }
            (event, pending) => {
                // An event no operation waits for (an automatic renewal that
                // did not go through, say): the machine has already acted on it.
                tracing::debug!(event = event_name(&event), "unclaimed event");
                self.pending = pending;
            }
        }
    }
}

/// The event's kind, for logs (a lease carries the owner token, which is
/// not logged).
fn event_name(event: &Event) -> &'static str {
    match event {
        Event::Acquired(_) => "acquired",
        Event::Denied => "denied",
        Event::Released { was_held: true } => "released",
        Event::Released { was_held: false } => "released (was gone)",
        Event::Extended(_) => "extended",
        Event::NotExtended => "not extended",
        Event::Lost => "lost",
        Event::Failed(_) => "failed",
    }
}

/// Runs one node's requests, in order, on a connection of its own.
pub(crate) async fn node_worker(
    client: redis::Client,
    settings: NodeSettings,
    mut requests: mpsc::UnboundedReceiver<Request>,
    replies: mpsc::UnboundedSender<(RequestId, Outcome, Option<String>)>,
) {
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    while let Some(request) = requests.recv().await {
        let span = tracing::debug_span!("request", id = request.id.0);
        let result = tokio::time::timeout(
            settings.request_timeout,
            run_one(&client, &settings, &mut conn, &request),
        )
        .instrument(span)
        .await;
        let (outcome, io_error) = match result {
            Ok(Ok(reply)) => (Outcome::Reply(reply), None),
            Ok(Err(e)) => {
                conn = None;
                (Outcome::Unknown, Some(e.to_string()))
            }
            Err(_) => {
                conn = None;
                (Outcome::Unknown, Some("request timed out".to_owned()))
            }
        };
        if replies.send((request.id, outcome, io_error)).is_err() {
            break;
        }
    }
}

async fn run_one(
    client: &redis::Client,
    settings: &NodeSettings,
    conn: &mut Option<redis::aio::MultiplexedConnection>,
    request: &Request,
) -> Result<lockwright_core::keyspace::Reply, redis::RedisError> {
    if conn.is_none() {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(settings.request_timeout)
            .set_response_timeout(settings.request_timeout);
        *conn = Some(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    match conn {
        Some(c) => wire::execute_reply(c, &request.command).await,
        None => Err(redis::RedisError::from((
            redis::ErrorKind::IoError,
            "not connected",
        ))),
    }
}
