//! Wake-on-release: one subscription per lock, one waiter woken per notice.
//!
//! With `LockOptions::notify`, the release scripts publish a notice on
//! `<key>:released`. Every [`Lock`](crate::Lock) (and its clones) keeps one
//! pattern subscription to its notices, opened by its first waiting acquire
//! and closed when the lock is dropped, and a FIFO of its waiting acquires.
//! A notice wakes the waiter at the head of the line only: it tries once;
//! on success it leaves the line, otherwise it stays first and waits for
//! the next notice. A waiter that joins behind others does not try before
//! its turn, so the holders of one process hand the lock on in order, and a
//! release costs one attempt, not one per waiter.
//!
//! Notices are a hint, never a grant: every attempt is the protocol's own
//! acquire, and every waiter also retries after a fallback delay (bounded
//! by the TTL), in case a notice is lost (a dropped subscription, a holder
//! that releases silently, a hold that expires).

use futures_util::StreamExt;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{oneshot, watch, Notify};

/// The state of a lock's subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listening {
    /// No listener (never started, or its connection ended).
    Off,
    /// Subscribing.
    Starting,
    /// Subscribed: notices arrive.
    On,
}

struct Line {
    next_id: u64,
    waiters: VecDeque<(u64, Arc<Notify>)>,
    /// Stops the listener when the lock goes away.
    stop: Option<oneshot::Sender<()>>,
}

/// One lock's subscription to its release notices and its line of waiters.
pub(crate) struct Notices {
    client: redis::Client,
    pattern: String,
    timeout: Duration,
    line: Mutex<Line>,
    listening: watch::Sender<Listening>,
}

impl Notices {
    /// Notices of the lock whose key is `key`, read from `client`'s node
    /// (the channels `<key>*:released`: the lock key's, or a semaphore's
    /// permits key's).
    pub(crate) fn new(client: redis::Client, key: &str, timeout: Duration) -> Arc<Notices> {
        Arc::new(Notices {
            client,
            pattern: format!("{key}*:released"),
            timeout,
            line: Mutex::new(Line {
                next_id: 0,
                waiters: VecDeque::new(),
                stop: None,
            }),
            listening: watch::channel(Listening::Off).0,
        })
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join the line. The ticket tells whether anyone was ahead, and waits
    /// for this waiter's turn. Starts the subscription if it is off, and
    /// waits (at most the request timeout) until it is on, so that no
    /// notice sent after this returns is missed.
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
        self.start_listening();
        let mut listening = self.listening.subscribe();
        // Without a subscription (refused, or slow) the fallback retries
        // still run; the waiter does not fail for want of notices.
        let _ = tokio::time::timeout(
            self.timeout,
            listening.wait_for(|l| *l != Listening::Starting),
        )
        .await;
        ticket
    }

    fn start_listening(self: &Arc<Notices>) {
        let started = self.listening.send_if_modified(|l| {
            if *l == Listening::Off {
                *l = Listening::Starting;
                true
            } else {
                false
            }
        });
        if !started {
            return;
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        self.line().stop = Some(stop_tx);
        tokio::spawn(listen(
            Arc::downgrade(self),
            self.client.clone(),
            self.pattern.clone(),
            self.timeout,
            stop_rx,
        ));
    }

    /// A notice came: wake the first waiter.
    fn wake_first(&self) {
        if let Some((_, notify)) = self.line().waiters.front() {
            notify.notify_one();
        }
    }

    /// The subscription ended: wake everyone (they try, then wait on their
    /// fallback; the next waiter to join subscribes again).
    fn wake_all(&self) {
        for (_, notify) in &self.line().waiters {
            notify.notify_one();
        }
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        // Dropping the sender stops the listener.
        self.line().stop = None;
    }
}

async fn listen(
    notices: Weak<Notices>,
    client: redis::Client,
    pattern: String,
    timeout: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    let subscribe = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.psubscribe(&pattern).await?;
        Ok::<_, redis::RedisError>(pubsub.into_on_message())
    };
    let subscribed = tokio::select! {
        result = tokio::time::timeout(timeout, subscribe) => result.ok().and_then(Result::ok),
        _ = &mut stop => return,
    };
    let Some(mut messages) = subscribed else {
        tracing::debug!("release notices: subscribe failed");
        if let Some(notices) = notices.upgrade() {
            notices.listening.send_replace(Listening::Off);
        }
        return;
    };
    if let Some(notices) = notices.upgrade() {
        notices.listening.send_replace(Listening::On);
    }
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(notices) = notices.upgrade() else { return };
                if message.is_none() {
                    tracing::debug!("release notices: subscription ended");
                    notices.listening.send_replace(Listening::Off);
                    notices.wake_all();
                    return;
                }
                tracing::trace!("release notice");
                notices.wake_first();
            }
            _ = &mut stop => return,
        }
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
