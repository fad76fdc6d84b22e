//! Section 5: many renewing holds at once.
//!
//! `count` locks of a renewing protocol (`fenced`, `auto_renew` on, so
//! every hold's driver renews it every TTL/3) are taken on one [`Nodes`]
//! and held through a window of several renewal periods. Measured: the
//! process' resident memory per hold (the `Lock` handle, its guard and the
//! driver task that renews it), the renewal commands the server ran per
//! second against the ideal (one per hold per TTL/3), the client CPU per
//! renewal, and how late each renewal left: every renewal moves the
//! guard's `valid_until` to its send time + TTL − drift, so the step
//! between two readings of it is the time between two renewals' sends, and
//! that step minus TTL/3 is how late the second one left.

use crate::util::{self, BenchError, Result};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockGuard, LockOptions, Nodes};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The protocol whose holds renew.
pub(crate) const PROTOCOL: ProtocolId = ProtocolId::Fenced;

/// Tasks that acquire (and release) the holds.
const WORKERS: usize = 64;

/// What one hold count measured.
#[derive(Clone, Debug)]
pub(crate) struct Scale {
    /// Holds taken and kept.
    pub(crate) holds: usize,
    /// The lease.
    pub(crate) ttl: Duration,
    /// How long taking them all took.
    pub(crate) acquire_time: Duration,
    /// Resident memory per hold, in bytes (`None` where `/proc/self/status`
    /// cannot be read).
    pub(crate) bytes_per_hold: Option<f64>,
    /// The window the renewals were counted over.
    pub(crate) window: Duration,
    /// Renewal commands (`EVALSHA`) the server ran per second in the window.
    pub(crate) renewals_per_sec: f64,
    /// One per hold per TTL/3.
    pub(crate) ideal_per_sec: f64,
    /// Client CPU per renewal in µs (the bench's own readings of the guards
    /// taken out), `None` where `/proc/self/stat` cannot be read.
    pub(crate) client_cpu_us: Option<f64>,
    /// How late each observed renewal left, behind its schedule.
    pub(crate) lags: Vec<Duration>,
    /// Holds lost or no longer held at the end of the window (expected 0).
    pub(crate) lost: usize,
}

/// `VmRSS` of this process, in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Take `count` holds on `client`'s server, keep them for `window`, then
/// release them.
pub(crate) async fn run(
    client: &redis::Client,
    count: usize,
    ttl: Duration,
    window: Duration,
) -> Result<Scale> {
    let mut admin = client.get_multiplexed_async_connection().await?;
    redis::cmd("FLUSHALL").query_async::<()>(&mut admin).await?;
    let nodes = Nodes::new([client.clone()]);
    let options = LockOptions::new(PROTOCOL, ttl);
    if !options.auto_renew {
        return Err(BenchError(format!("{PROTOCOL} does not renew")));
    }
    let before = resident_bytes();
    let started = Instant::now();
    let mut handles = Vec::new();
    for worker in 0..WORKERS {
        let (nodes, options) = (nodes.clone(), options.clone());
        handles.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for i in (worker..count).step_by(WORKERS) {
                let lock = Lock::on(&nodes, format!("scale:{i}"), options.clone())?;
                let guard = lock.acquire().await?;
                held.push((lock, guard));
            }
            Ok::<_, BenchError>(held)
        }));
    }
    let mut held: Vec<(Lock, LockGuard)> = Vec::with_capacity(count);
    for h in handles {
        held.extend(h.await??);
    }
    let acquire_time = started.elapsed();
    let bytes_per_hold = match (before, resident_bytes()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / count.max(1) as f64),
        _ => None,
    };

    // The window: the renewals the server runs, the client's CPU, and each
    // guard's `valid_until` read four times per renewal period.
    let period = ttl / 3;
    let sweep_every = period / 4;
    let mut last: Vec<Instant> = held.iter().map(|(_, g)| g.valid_until()).collect();
    let mut lags = Vec::new();
    let ticks = util::clock_ticks();
    util::reset_stats(&mut admin).await?;
    let cpu0 = util::process_cpu(ticks);
    let t0 = Instant::now();
    let mut sweeping = Duration::ZERO;
    while t0.elapsed() < window {
        tokio::time::sleep(sweep_every.min(window.saturating_sub(t0.elapsed()))).await;
        let sweep = Instant::now();
        for ((_, guard), last) in held.iter().zip(last.iter_mut()) {
            let now = guard.valid_until();
            if now > *last {
                let step = now - *last;
                // Two renewals between readings cannot happen (they are a
                // period apart and the readings a quarter of one), but if
                // they did, their lags are counted together.
                let renewals = (step.as_secs_f64() / period.as_secs_f64()).floor().max(1.0);
                let late = step.saturating_sub(period.mul_f64(renewals));
                lags.push(late);
                *last = now;
            }
        }
        sweeping += sweep.elapsed();
    }
    let elapsed = t0.elapsed();
    let cpu1 = util::process_cpu(ticks);
    let commands = util::command_counts(&mut admin).await?;
    let renewals = commands.get("evalsha").copied().unwrap_or(0);
    let lost = held
        .iter()
        .filter(|(_, g)| g.is_lost() || !g.is_held())
        .count();

    // Give every hold back.
    let held = Arc::new(std::sync::Mutex::new(held));
    let mut handles = Vec::new();
    for _ in 0..WORKERS {
        let held = Arc::clone(&held);
        handles.push(tokio::spawn(async move {
            loop {
                let next = held
                    .lock()
                    .map_err(|_| BenchError("poisoned".into()))?
                    .pop();
                let Some((_lock, guard)) = next else {
                    return Ok::<(), BenchError>(());
                };
                guard.release().await?;
            }
        }));
    }
    for h in handles {
        h.await??;
    }
    redis::cmd("FLUSHALL").query_async::<()>(&mut admin).await?;

    let client_cpu_us = match (cpu0, cpu1) {
        (Some(a), Some(b)) => {
            let cpu = b.saturating_sub(a).saturating_sub(sweeping);
            Some(cpu.as_secs_f64() * 1e6 / renewals.max(1) as f64)
        }
        _ => None,
    };
    Ok(Scale {
        holds: count,
        ttl,
        acquire_time,
        bytes_per_hold,
        window: elapsed,
        renewals_per_sec: renewals as f64 / elapsed.as_secs_f64(),
        ideal_per_sec: count as f64 / period.as_secs_f64(),
        client_cpu_us,
        lags,
        lost,
    })
}
