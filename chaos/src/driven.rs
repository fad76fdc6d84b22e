//! A core machine driven by the scenario itself, step by step, against real
//! Redis nodes, on a clock with an injectable offset.
//!
//! The adapter (`lockwright-redis`) runs each hold in a task of its own on
//! one process-wide clock, which is what production wants and what two
//! faults cannot get at: a client clock that runs ahead of another's
//! (`client-skew`), and a client that stops between two requests of one
//! operation (the `pause` between `set-px-get-del`'s `GET` and `DEL`). A
//! [`DrivenMachine`] runs the same core machine with the adapter's own wire
//! functions ([`lockwright_redis::wire::execute_reply`]), but the scenario
//! owns the loop: it reads the clock with its own offset, and it may take a
//! request out ([`DrivenMachine::next_request`]), hold it, and run it later
//! ([`DrivenMachine::run_request`]).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockwright_core::{
    Acquire, Config, Event, Lease, Machine, Millis, Outcome, Protocol, ProtocolId, Request, Token,
};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::ChaosError;

/// A core machine, its connections (one per node) and its clock.
#[derive(Debug)]
pub struct DrivenMachine {
    machine: Machine,
    clients: Vec<redis::Client>,
    connections: Vec<Option<MultiplexedConnection>>,
    request_timeout: Duration,
    origin: Instant,
    origin_ms: u64,
    offset_ms: i64,
}

impl DrivenMachine {
    /// A machine for `protocol` with `config` (whose `nodes` must match
    /// `urls`), owner `token`, whose clock reads the Unix time plus
    /// `offset_ms`.
    pub fn new(
        protocol: ProtocolId,
        config: &Config,
        token: &str,
        urls: &[String],
        offset_ms: i64,
    ) -> Result<Self, ChaosError> {
        let machine = Machine::new(protocol, config, Token(token.to_owned()))
            .map_err(|error| ChaosError::UnexpectedReply(format!("config: {error}")))?;
        let clients = urls
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX / 2))
            .unwrap_or_default();
        Ok(Self {
            connections: clients.iter().map(|_| None).collect(),
            clients,
            machine,
            request_timeout: Duration::from_millis(500),
            origin: Instant::now(),
            origin_ms,
            offset_ms,
        })
    }

    /// This client's clock: Unix milliseconds plus its offset.
    pub fn now(&self) -> Millis {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX / 4);
        let real = self.origin_ms.saturating_add(elapsed);
        Millis(real.saturating_add_signed(self.offset_ms))
    }

    /// The instant at which this client's clock reads `at`.
    pub fn instant_of(&self, at: Millis) -> Instant {
        let now = self.now();
        let now_instant = Instant::now();
        if at >= now {
            now_instant + Duration::from_millis(at.0 - now.0)
        } else {
            now_instant
                .checked_sub(Duration::from_millis(now.0 - at.0))
                .unwrap_or(now_instant)
        }
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The current hold.
    pub fn lease(&self) -> Option<&Lease> {
        self.machine.lease()
    }

    /// One acquire attempt, driven to its event: the lease, or `None` when
    /// denied (or failed).
    pub async fn try_acquire(&mut self) -> Result<Option<Lease>, ChaosError> {
        let now = self.now();
        self.machine
            .acquire(now, Acquire::Once)
            .map_err(|error| ChaosError::UnexpectedReply(format!("acquire: {error}")))?;
        match self.drive_to_event().await? {
            Event::Acquired(lease) => Ok(Some(lease)),
            _ => Ok(None),
        }
    }

    /// Starts a release; drive it with [`next_request`](Self::next_request)
    /// and [`run_request`](Self::run_request), or
    /// [`drive_to_event`](Self::drive_to_event).
    pub fn start_release(&mut self) -> Result<(), ChaosError> {
        let now = self.now();
        self.machine
            .release(now)
            .map_err(|error| ChaosError::UnexpectedReply(format!("release: {error}")))
    }

    /// The next request the machine asks for, without running it.
    pub fn next_request(&mut self) -> Option<Request> {
        self.machine.poll_transmit()
    }

    /// Runs `request` on its node and hands the reply (or an unknown
    /// outcome) back to the machine.
    pub async fn run_request(&mut self, request: Request) {
        let outcome = self.execute(&request).await;
        let now = self.now();
        self.machine.handle_reply(now, request.id, outcome);
    }

    /// The next event, if one is queued.
    pub fn next_event(&mut self) -> Option<Event> {
        self.machine.poll_event()
    }

    /// Runs every request and timer until the machine reports an event.
    pub async fn drive_to_event(&mut self) -> Result<Event, ChaosError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            while let Some(request) = self.machine.poll_transmit() {
                self.run_request(request).await;
            }
            if let Some(event) = self.machine.poll_event() {
                return Ok(event);
            }
            if Instant::now() >= deadline {
                return Err(ChaosError::Timeout {
                    what: "the machine to report an event".into(),
                    after: Duration::from_secs(30),
                });
            }
            match self.machine.poll_timeout() {
                Some(at) => {
                    let wake = self.instant_of(at);
                    tokio::time::sleep_until(wake.into()).await;
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
                None if !self.machine.is_busy() => {
                    return Err(ChaosError::UnexpectedReply(
                        "the machine is idle and reports nothing".into(),
                    ))
                }
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    async fn execute(&mut self, request: &Request) -> Outcome {
        let index = usize::from(request.node.0);
        let Some(client) = self.clients.get(index) else {
            return Outcome::Unknown;
        };
        if self.connections[index].is_none() {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.request_timeout))
                .set_response_timeout(Some(self.request_timeout));
            match client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(connection) => self.connections[index] = Some(connection),
                Err(_) => return Outcome::Unknown,
            }
        }
        let Some(connection) = self.connections[index].as_mut() else {
            return Outcome::Unknown;
        };
        match lockwright_redis::wire::execute_reply(connection, &request.command).await {
            Ok(reply) => Outcome::Reply(reply),
            Err(_) => {
                // The outcome is unknown; reconnect next time.
                self.connections[index] = None;
                Outcome::Unknown
            }
        }
    }
}
