//! Wake-on-release: one pub/sub connection per node of a [`Nodes`], shared
//! by all its locks; one waiter woken per notice.
//!
//! With `LockOptions::notify`, the release scripts publish a notice on
//! `<key>:released`. Each node of a [`Nodes`] has one [`Hub`]: a single
//! pub/sub connection, opened by the first waiting acquire of any lock on
//! it, carrying one subscription to the channel `<key>:released` per lock that
//! has waiters, dropped when the last lock on that key goes away. Every
//! [`Lock`](crate::Lock) (and its clones) keeps a FIFO of its waiting
//! acquires ([`Notices`]). A notice wakes the waiter at the head of the
//! line only: it tries once; on success it leaves the line, otherwise it
//! stays first and waits for the next notice. A waiter that joins behind
//! others does not try before its turn, so the holders of one process hand
//! the lock on in order, and a release costs one attempt, not one per
//! waiter.
//!
//! Notices are a hint, never a grant: every attempt is the protocol's own
//! acquire, and every waiter also retries after a fallback delay (the
//! polling delay, `retry_max`), in case a notice is lost (a dropped
//! subscription, a holder that releases silently, a hold that expires).
//!
//! [`Nodes`]: crate::Nodes

use crate::source::Source;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

/// One node's pub/sub connection, shared by every lock of a `Nodes`.
pub(crate) struct Hub {
    source: Arc<Source>,
    timeout: Duration,
    state: Mutex<HubState>,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct HubState {
    /// The live connection's sink (`None`: not connected).
    sink: Option<PubSubSink>,
    /// Which connection `sink` belongs to.
    generation: u64,
    /// Stops the reader of the live connection.
    stop: Option<oneshot::Sender<()>>,
    /// Channel → the locks listening to it, and whether it is subscribed
    /// on the live connection.
    channels: HashMap<String, Channel>,
}

#[derive(Default)]
struct Channel {
    listeners: Vec<Weak<Notices>>,
    subscribed: bool,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("node", &self.source.describe())
            .finish_non_exhaustive()
    }
}

/// Held by the reader task of one pub/sub connection: when the task ends,
/// however it ends, the hub forgets that connection ([`Hub::lost`], which
/// does nothing for a connection already forgotten or replaced). The task
/// ends when the server closes the stream, when the hub stops or replaces
/// the connection, and also when it is dropped unfinished because the
/// runtime it was spawned on shut down, which ends the connection's I/O
/// with it. Without that last case, a `Nodes` used from a runtime after the
/// one that opened its notices connection kept the dead sink and its
/// waiters never heard a notice again (`notify.rs`,
/// `notices_survive_the_runtime_that_opened_their_connection`).
struct LostOnDrop {
    hub: Weak<Hub>,
    generation: u64,
}

impl Drop for LostOnDrop {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lost(self.generation);
        }
    }
}

impl Hub {
    pub(crate) fn new(source: Arc<Source>, timeout: Duration) -> Arc<Hub> {
        Arc::new(Hub {
            source,
            timeout,
            state: Mutex::new(HubState::default()),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make sure `notices`' channel is subscribed on a live connection
    /// (connecting if needed). Failures are logged, not returned: without
    /// notices the waiters still retry on their fallback.
    async fn listen(self: &Arc<Hub>, notices: &Arc<Notices>) {
        let channel = notices.channel.clone();
        {
            let mut state = self.state();
            let entry = state.channels.entry(channel.clone()).or_default();
            entry.listeners.retain(|w| w.strong_count() > 0);
            if !entry
                .listeners
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(notices)))
            {
                entry.listeners.push(Arc::downgrade(notices));
            }
            if entry.subscribed && state.sink.is_some() {
                return;
            }
        }
        let result = tokio::time::timeout(self.timeout, self.subscribe(&channel)).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "release notices: subscribe failed"),
            Err(_) => tracing::debug!("release notices: subscribe timed out"),
        }
    }

    async fn subscribe(self: &Arc<Hub>, channel: &str) -> redis::RedisResult<()> {
        let (mut sink, generation) = self.connect().await?;
        sink.subscribe(channel).await?;
        let mut state = self.state();
        if state.generation == generation {
            if let Some(entry) = state.channels.get_mut(channel) {
                entry.subscribed = true;
            }
        }
        Ok(())
    }

    /// The live connection's sink, connecting first if there is none.
    async fn connect(self: &Arc<Hub>) -> redis::RedisResult<(PubSubSink, u64)> {
        if let Some(live) = self.live() {
            return Ok(live);
        }
        let _one = self.connecting.lock().await;
        if let Some(live) = self.live() {
            return Ok(live);
        }
        let client = self.source.client(self.timeout).await?;
        let (sink, mut stream) = client.get_async_pubsub().await?.split();
        let (stop, mut stopped) = oneshot::channel();
        let generation = {
            let mut state = self.state();
            state.generation += 1;
            state.sink = Some(sink.clone());
            state.stop = Some(stop);
            for entry in state.channels.values_mut() {
                entry.subscribed = false;
            }
            state.generation
        };
        tracing::debug!(generation, "release notices: connected");
        let hub = Arc::downgrade(self);
        tokio::spawn(async move {
            let _lost = LostOnDrop {
                hub: hub.clone(),
                generation,
            };
            loop {
                tokio::select! {
                    message = stream.next() => {
                        let Some(hub) = hub.upgrade() else { break };
                        match message {
                            Some(message) => hub.wake(message.get_channel_name()),
                            None => break,
                        }
                    }
                    _ = &mut stopped => break,
                }
            }
        });
        Ok((sink, generation))
    }

    fn live(&self) -> Option<(PubSubSink, u64)> {
        let state = self.state();
        state.sink.clone().map(|sink| (sink, state.generation))
    }

    /// A notice on `channel`: wake the first waiter of every lock on it.
    fn wake(&self, channel: &str) {
        let listeners: Vec<Arc<Notices>> = {
            let state = self.state();
            let Some(entry) = state.channels.get(channel) else {
                return;
            };
            entry.listeners.iter().filter_map(Weak::upgrade).collect()
        };
        tracing::trace!(channel, "release notice");
        for notices in listeners {
            notices.wake_first();
        }
    }

    /// The connection of `generation` ended: forget it and wake everyone
    /// (they try, then wait on their fallback; the next waiter to join
    /// connects again). Nothing happens when that connection was already
    /// forgotten (no sink) or replaced (a newer generation).
    fn lost(&self, generation: u64) {
        let listeners: Vec<Arc<Notices>> = {
            let mut state = self.state();
            if state.generation != generation || state.sink.is_none() {
                return;
            }
            state.sink = None;
            state.stop = None;
            state
                .channels
                .values_mut()
                .flat_map(|entry| {
                    entry.subscribed = false;
                    entry.listeners.iter().filter_map(Weak::upgrade)
                })
                .collect()
        };
        tracing::debug!("release notices: connection ended");
        for notices in listeners {
            notices.wake_all();
        }
    }

    /// A lock went away: drop its channel once no lock listens to it.
    fn forget(&self, channel: &str) {
        let sink = {
            let mut state = self.state();
            let Some(entry) = state.channels.get_mut(channel) else {
                return;
            };
            entry.listeners.retain(|w| w.strong_count() > 0);
            if !entry.listeners.is_empty() {
                return;
            }
            let subscribed = entry.subscribed;
            state.channels.remove(channel);
            if !subscribed {
                return;
            }
            state.sink.clone()
        };
        if let (Some(mut sink), Ok(runtime)) = (sink, tokio::runtime::Handle::try_current()) {
            let channel = channel.to_owned();
            runtime.spawn(async move {
                let _ = sink.unsubscribe(channel).await;
            });
        }
    }

    /// How many channels are subscribed (for tests of the crate).
    #[cfg(test)]
    fn subscribed(&self) -> usize {
        self.state()
            .channels
            .values()
            .filter(|p| p.subscribed)
            .count()
    }
}

struct Line {
    next_id: u64,
    waiters: VecDeque<(u64, Arc<Notify>)>,
}

/// One lock's release notices (through its node's [`Hub`]) and its line of
/// waiters.
pub(crate) struct Notices {
    hub: Arc<Hub>,
    channel: String,
    line: Mutex<Line>,
}

impl Notices {
    /// Notices published on `channel` (`<key>:released`, where `<key>` is
    /// the key the release script removes from: the lock key, or a
    /// semaphore's permits key), through `hub`.
    pub(crate) fn new(hub: Arc<Hub>, channel: String) -> Arc<Notices> {
        Arc::new(Notices {
            hub,
            channel,
            line: Mutex::new(Line {
                next_id: 0,
                waiters: VecDeque::new(),
            }),
        })
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join the line. The ticket tells whether anyone was ahead, and waits
    /// for this waiter's turn. Subscribes (at most the request timeout) if
    /// the lock's channel is not subscribed yet, so that no notice sent
    /// after this returns is missed.
    pub(crate) async fn join(self: &Arc<Notices>) -> Ticket {
        let notify = Arc::new(Notify::new());
        let (id, ahead) = {
            let mut line = self.line();
            let id = line.next_id;
            line.next_id += 1;
            let ahead = !line.waiters.is_empty();
            line.waiters.push_back((id, Arc::clone(&notify)));
            (id, ahead)
        };
        let ticket = Ticket {
            notices: Arc::clone(self),
            id,
            notify,
            ahead,
            done: false,
        };
        self.hub.listen(self).await;
        ticket
    }

    /// A notice came: wake the first waiter.
    fn wake_first(&self) {
        if let Some((_, notify)) = self.line().waiters.front() {
            notify.notify_one();
        }
    }

    /// The subscription ended: wake everyone.
    fn wake_all(&self) {
        for (_, notify) in &self.line().waiters {
            notify.notify_one();
        }
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        self.hub.forget(&self.channel);
    }
}

/// A place in a lock's line of waiters. Leaving the line (dropping the
/// ticket) without a grant passes a possible wake-up on to the next waiter.
pub(crate) struct Ticket {
    notices: Arc<Notices>,
    id: u64,
    notify: Arc<Notify>,
    ahead: bool,
    done: bool,
}

impl Ticket {
    /// Was anyone in line when this waiter joined? Then it waits for its
    /// turn (a notice) before its first attempt.
    pub(crate) fn had_waiters_ahead(&self) -> bool {
        self.ahead
    }

    /// Wait for a notice addressed to this waiter (it is first in line).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }

    /// This waiter got the lock: it leaves the line without waking the
    /// next one (the next release will).
    pub(crate) fn granted(mut self) {
        self.done = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut line = self.notices.line();
        let was_first = line.waiters.front().is_some_and(|(id, _)| *id == self.id);
        line.waiters.retain(|(id, _)| *id != self.id);
        if was_first && !self.done {
            // Gave up (timeout, error, cancelled): a notice meant for it
            // may be lost with it, so the next waiter looks for itself.
            if let Some((_, next)) = line.waiters.front() {
                next.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_hub_subscribes_nothing() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let hub = Hub::new(
            Arc::new(Source::Direct(Box::new(client))),
            Duration::from_millis(10),
        );
        assert_eq!(hub.subscribed(), 0);
    }
}
