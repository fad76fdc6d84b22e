//! Section 2: sixteen waiters on one lock, each holding it for 1 ms.
//!
//! Handoff latency is the time from the holder calling `release` to the
//! next `acquire` returning (whoever it is), so it includes the release's
//! own round trip. Commands per acquisition come from `INFO commandstats`
//! over the window, divided by the acquisitions in the window.

use crate::throughput::TTL;
use crate::util::{self, BenchError, Result};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The hold inside the critical section.
pub(crate) const HOLD: Duration = Duration::from_millis(1);
/// Waiters.
pub(crate) const WAITERS: usize = 16;

/// A way of waiting for the lock.
pub(crate) enum Waiter {
    /// The adapter's lock.
    Adapter(Lock),
    /// rslock's `acquire` (retries with a random delay up to 200 ms).
    Rslock(rslock::LockManager),
}

impl Waiter {
    /// The adapter with `set-px-lua` and `tune` applied to the defaults.
    pub(crate) fn adapter(
        client: &redis::Client,
        name: &str,
        tune: impl FnOnce(&mut LockOptions),
    ) -> Result<Waiter> {
        let mut options = LockOptions::new(ProtocolId::SetPxLua, TTL);
        tune(&mut options);
        Ok(Waiter::Adapter(Lock::new([client.clone()], name, options)?))
    }

    /// Acquire, hold for [`HOLD`], release, recording into `shared`.
    async fn hold_once(&self, task: usize, name: &str, shared: &Mutex<Shared>) -> Result<()> {
        match self {
            Waiter::Adapter(lock) => {
                let guard = lock.acquire().await?;
                let acquired = acquired(shared, task);
                tokio::time::sleep(HOLD).await;
                releasing(shared, task, acquired);
                guard.release().await?;
            }
            Waiter::Rslock(manager) => {
                let guard = manager.acquire(name, TTL).await?;
                let acquired = acquired(shared, task);
                tokio::time::sleep(HOLD).await;
                releasing(shared, task, acquired);
                guard.release().await;
            }
        }
        Ok(())
    }
}

/// The lock was just acquired: close the handoff that led here.
fn acquired(shared: &Mutex<Shared>, task: usize) -> Instant {
    let now = Instant::now();
    if let Ok(mut s) = shared.lock() {
        let released = s.released_at.take();
        if s.counting {
            if let Some((r, by)) = released {
                let handoff = now.saturating_duration_since(r);
                s.handoffs.push(handoff);
                if by == task {
                    s.same_task += 1;
                } else {
                    s.handoffs_other.push(handoff);
                }
            }
            s.acquisitions += 1;
        }
    }
    now
}

/// The holder is about to call release: open the next handoff.
fn releasing(shared: &Mutex<Shared>, task: usize, acquired: Instant) {
    let now = Instant::now();
    if let Ok(mut s) = shared.lock() {
        if s.counting {
            s.holds.push(now.saturating_duration_since(acquired));
        }
        s.released_at = Some((now, task));
    }
}

/// What one configuration measured.
#[derive(Clone, Debug)]
pub(crate) struct Contention {
    /// Acquisitions inside the window.
    pub(crate) acquisitions: usize,
    /// Acquisitions per second.
    pub(crate) per_sec: f64,
    /// Handoff latencies inside the window.
    pub(crate) handoffs: Vec<Duration>,
    /// The handoffs to a task other than the releasing one.
    pub(crate) handoffs_other: Vec<Duration>,
    /// Handoffs won by the releasing task itself (it loops straight back
    /// into `acquire`).
    pub(crate) same_task: usize,
    /// Mean measured hold (the 1 ms sleep as the timer delivers it).
    pub(crate) mean_hold: Duration,
    /// Redis commands per acquisition, by command.
    pub(crate) commands: BTreeMap<String, u64>,
    /// All commands / acquisitions.
    pub(crate) commands_per_acquisition: f64,
}

#[derive(Default)]
struct Shared {
    /// When the current holder called release, and which task it is.
    released_at: Option<(Instant, usize)>,
    /// Counting: inside the window.
    counting: bool,
    handoffs: Vec<Duration>,
    handoffs_other: Vec<Duration>,
    same_task: usize,
    holds: Vec<Duration>,
    acquisitions: usize,
}

/// Run [`WAITERS`] tasks on `waiter` (lock name `name`, on the server
/// behind `stats`) for `warmup` + `window`.
pub(crate) async fn measure(
    waiter: Arc<Waiter>,
    name: &str,
    stats: &mut redis::aio::MultiplexedConnection,
    warmup: Duration,
    window: Duration,
) -> Result<Contention> {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for task in 0..WAITERS {
        let (waiter, shared, stop, name) = (
            waiter.clone(),
            shared.clone(),
            stop.clone(),
            name.to_owned(),
        );
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                waiter.hold_once(task, &name, &shared).await?;
            }
            Ok::<(), BenchError>(())
        }));
    }
    tokio::time::sleep(warmup).await;
    util::reset_stats(stats).await?;
    let t0 = Instant::now();
    if let Ok(mut s) = shared.lock() {
        s.counting = true;
        s.released_at = None;
    }
    tokio::time::sleep(window).await;
    let counts = util::command_counts(stats).await?;
    let elapsed = t0.elapsed();
    let result = match shared.lock() {
        Ok(mut s) => {
            s.counting = false;
            (
                s.acquisitions,
                std::mem::take(&mut s.handoffs),
                std::mem::take(&mut s.holds),
                std::mem::take(&mut s.handoffs_other),
                s.same_task,
            )
        }
        Err(_) => return Err(BenchError("a waiter panicked".into())),
    };
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await??;
    }
    let (acquisitions, handoffs, holds, handoffs_other, same_task) = result;
    let total: u64 = counts.values().sum();
    Ok(Contention {
        acquisitions,
        per_sec: acquisitions as f64 / elapsed.as_secs_f64(),
        handoffs,
        handoffs_other,
        same_task,
        mean_hold: util::mean(&holds),
        commands_per_acquisition: total as f64 / acquisitions.max(1) as f64,
        commands: counts,
    })
}
