//! The cache-stampede helper: [`Cache::get_or_load`], single flight per key.
//!
//! A thin driver for the core's [`StampedeGuard`]: on a cache miss exactly one
//! caller per key (the winner of the key's lock, `<name>:<key>`) runs the
//! loader and stores the value; the others re-read until it appears. The
//! decisions are the guard's; this module runs its requests and its loader.

use crate::clock::clock;
use crate::conn::{Finished, Io, Route, SharedConn};
use crate::token::{owner_token, seed};
use crate::{Error, OptionsError};
use lockwright_core::stampede::{StampedeEvent, StampedeGuard};
use lockwright_core::{Config, ProtocolId};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// How a [`Cache`] behaves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheOptions {
    /// The lock guarding each key's load (a single-node catalogue lock).
    pub guard_lock: ProtocolId,
    /// The load timeout: the per-key lock's TTL.
    pub load_timeout: Duration,
    /// How long a loaded value stays cached.
    pub cache_ttl: Duration,
    /// How often waiters re-read the cache.
    pub reread: Duration,
    /// How long the driver waits for one reply; shorter than
    /// `load_timeout` ([`OptionsError::RequestTimeoutNotBelowTtl`]).
    pub request_timeout: Duration,
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        CacheOptions {
            guard_lock: ProtocolId::SetPxLua,
            load_timeout: Duration::from_secs(10),
            cache_ttl: Duration::from_secs(60),
            reread: Duration::from_millis(10),
            request_timeout: Duration::from_secs(1),
        }
    }
}

/// A cache in front of a slow loader, on one Redis node.
///
/// Keys are namespaced by the cache's name: the value of `key` in the cache
/// `name` is stored at `<name>:<key>`, and its load is guarded by the lock
/// `{lock:<name>:<key>}`.
#[derive(Clone)]
pub struct Cache {
    /// One multiplexed connection, shared by every call (and every clone).
    route: Route,
    /// The cache's name: the namespace of its keys.
    name: String,
    /// The per-key locks' configuration (named `lock`: the guard names each
    /// key's lock `lock:<value key>`).
    config: Config,
    cache_ttl_ms: u64,
    request_timeout: Duration,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("name", &self.name)
            .field("node", &self.route.describe())
            .finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Cache {
    /// A cache whose keys are namespaced by `name` (see [`Cache`]).
    pub fn new(
        client: redis::Client,
        name: impl Into<String>,
        options: CacheOptions,
    ) -> Result<Cache, Error> {
        let name = name.into();
        // Validate the name as a lock name would be.
        Config::new(name.clone()).validate()?;
        let config = Config {
            ttl_ms: millis(options.load_timeout),
            retry_base_ms: millis(options.reread).max(1),
            retry_max_ms: millis(options.reread).max(1),
            guard_lock: options.guard_lock,
            ..Config::new("lock")
        };
        let cache_ttl_ms = millis(options.cache_ttl);
        // Validate once.
        StampedeGuard::new(&config, cache_ttl_ms, lockwright_core::Token("v".into()))?;
        if options.request_timeout >= options.load_timeout {
            // A load lock's grant could arrive after its lease ended.
            return Err(OptionsError::RequestTimeoutNotBelowTtl {
                request_timeout: options.request_timeout,
                ttl: options.load_timeout,
            }
            .into());
        }
        let request_timeout = options.request_timeout.max(Duration::from_millis(1));
        Ok(Cache {
            route: Route::Shared(Arc::new(SharedConn::new(client, request_timeout))),
            name,
            config,
            cache_ttl_ms,
            request_timeout,
        })
    }

    /// The cached value of `key`; on a miss, the value `loader` produces
    /// (run by exactly one caller per key at a time), which is then cached.
    ///
    /// Dropping this future part-way leaves at most the key's lock behind,
    /// until its TTL (the load timeout).
    pub async fn get_or_load<F, Fut, E>(&self, key: &str, loader: F) -> Result<String, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<String, E>>,
        E: fmt::Display,
    {
        let span = tracing::info_span!("get_or_load", cache = %self.name, key);
        self.run(key, loader).instrument(span).await
    }

    async fn run<F, Fut, E>(&self, key: &str, loader: F) -> Result<String, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<String, E>>,
        E: fmt::Display,
    {
        let config = Config {
            seed: seed()?,
            ..self.config.clone()
        };
        let mut guard = StampedeGuard::new(&config, self.cache_ttl_ms, owner_token()?)?;
        let mut io = Io::new(
            std::slice::from_ref(&self.route),
            self.request_timeout,
            None,
        );
        let mut loader = Some(loader);
        let mut loaded: Option<String> = None;
        let mut load_error: Option<String> = None;
        let mut last_io_error: Option<String> = None;
        // An empty key stays empty, for the guard to refuse.
        let key = if key.is_empty() {
            String::new()
        } else {
            format!("{}:{key}", self.name)
        };
        guard.get_or_load(clock().now(), &key)?;
        loop {
            while let Some(request) = guard.poll_transmit() {
                let id = request.id;
                if !io.send(request) {
                    guard.handle_reply(clock().now(), id, lockwright_core::Outcome::Unknown);
                }
            }
            if let Some(event) = guard.poll_event() {
                match event {
                    StampedeEvent::Hit(value) => return Ok(value),
                    StampedeEvent::Load => {
                        let Some(load) = loader.take() else {
                            return Err(Error::Load("the loader was asked for twice".into()));
                        };
                        match load().await {
                            Ok(value) => {
                                loaded = Some(value.clone());
                                guard.handle_loaded(clock().now(), value)?;
                            }
                            Err(e) => {
                                load_error = Some(e.to_string());
                                guard.handle_load_failed(clock().now())?;
                            }
                        }
                    }
                    StampedeEvent::Stored | StampedeEvent::LoadTimedOut => {
                        if let Some(value) = loaded.take() {
                            return Ok(value);
                        }
                        return Err(Error::Timeout);
                    }
                    StampedeEvent::LoadAbandoned => {
                        return Err(Error::Load(load_error.take().unwrap_or_default()));
                    }
                    StampedeEvent::Failed(e) => {
                        return Err(match last_io_error.take() {
                            Some(reason) => Error::Unavailable(reason),
                            None => e.into(),
                        })
                    }
                }
                continue;
            }
            let deadline = guard
                .poll_timeout()
                .and_then(|t| clock().instant_of(t))
                .map(tokio::time::Instant::from_std);
            let busy = !io.is_idle();
            tokio::select! {
                Finished { id, outcome, failure, .. } = io.next(), if busy => {
                    if let Some(failure) = failure {
                        if let Some(error) = failure.permanent {
                            return Err(error);
                        }
                        last_io_error = Some(failure.text);
                    }
                    guard.handle_reply(clock().now(), id, outcome);
                }
                () = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => guard.handle_timeout(clock().now()),
            }
        }
    }
}
