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
//!
//! Each hold count runs in a child process of its own (this binary with
//! `--scale-cell`), so that its resident memory grows from a fresh start:
//! in a process that has run other sections, memory they freed is reused
//! and the growth under-counts.

use crate::util::{self, BenchError, Result};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockGuard, LockOptions, Nodes};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
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
    /// How late each observed renewal left, behind its schedule: how many
    /// renewals left how many whole milliseconds late.
    pub(crate) lags: BTreeMap<u64, u64>,
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
    // Warm up what every hold shares (the connection, the scripts, the
    // runtime's threads and their allocator arenas) and make room for the
    // bench's own lists before the first reading: the growth is then the
    // holds'.
    let warm = Lock::on(&nodes, "scale:warm-up", options.clone())?;
    warm.acquire().await?.release().await?;
    drop(warm);
    let per_worker = count / WORKERS + 1;
    let mut lists: Vec<Vec<(Lock, LockGuard)>> = (0..WORKERS)
        .map(|_| Vec::with_capacity(per_worker))
        .collect();
    let mut held: Vec<(Lock, LockGuard)> = Vec::with_capacity(count);
    let mut last: Vec<Instant> = Vec::with_capacity(count);
    let before = resident_bytes();
    let started = Instant::now();
    let mut handles = Vec::new();
    for (worker, mut list) in lists.drain(..).enumerate() {
        let (nodes, options) = (nodes.clone(), options.clone());
        handles.push(tokio::spawn(async move {
            for i in (worker..count).step_by(WORKERS) {
                let lock = Lock::on(&nodes, format!("scale:{i}"), options.clone())?;
                let guard = lock.acquire().await?;
                list.push((lock, guard));
            }
            Ok::<_, BenchError>(list)
        }));
    }
    for h in handles {
        held.append(&mut h.await??);
    }
    let acquire_time = started.elapsed();
    let bytes_per_hold = match (before, resident_bytes()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / count.max(1) as f64),
        _ => None,
    };

    // The window: the renewals the server runs, the client's CPU, and each
    // guard's `valid_until` read four times per renewal period. It starts
    // half a period after the last grant, so that the holds taken last do
    // not renew right at its end (and out of it, by their lag).
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    // The engine renews at send time + ttl / 3 in whole milliseconds.
    let period = Duration::from_millis((ttl_ms / 3).max(1));
    let sweep_every = period / 4;
    tokio::time::sleep(period / 2).await;
    last.extend(held.iter().map(|(_, g)| g.valid_until()));
    let mut lags: BTreeMap<u64, u64> = BTreeMap::new();
    util::reset_stats(&mut admin).await?;
    let cpu0 = util::threads_cpu_ns();
    let t0 = Instant::now();
    let mut sweeping_ns = 0u64;
    while t0.elapsed() < window {
        tokio::time::sleep(sweep_every.min(window.saturating_sub(t0.elapsed()))).await;
        let sweep = util::thread_cpu_ns();
        for ((_, guard), last) in held.iter().zip(last.iter_mut()) {
            let now = guard.valid_until();
            if now > *last {
                let step = now - *last;
                // Two renewals between readings cannot happen (they are a
                // period apart and the readings a quarter of one), but if
                // they did, their lags are counted together.
                let renewals = (step.as_secs_f64() / period.as_secs_f64()).floor().max(1.0);
                let late = step.saturating_sub(period.mul_f64(renewals));
                *lags
                    .entry(u64::try_from(late.as_millis()).unwrap_or(u64::MAX))
                    .or_default() += 1;
                *last = now;
            }
        }
        if let (Some(a), Some(b)) = (sweep, util::thread_cpu_ns()) {
            sweeping_ns += b.saturating_sub(a);
        }
    }
    let elapsed = t0.elapsed();
    let cpu1 = util::threads_cpu_ns();
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
        (Some(a), Some(b)) if renewals > 0 => {
            let cpu_ns = b.saturating_sub(a).saturating_sub(sweeping_ns);
            Some(cpu_ns as f64 / 1e3 / renewals as f64)
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

impl Scale {
    /// Renewals whose lag was observed.
    pub(crate) fn renewals_seen(&self) -> u64 {
        self.lags.values().sum()
    }

    /// The `q` quantile of the lags (nearest rank); `None` when no
    /// renewal was seen.
    pub(crate) fn lag(&self, q: f64) -> Option<Duration> {
        let total = self.renewals_seen();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (&ms, &n) in &self.lags {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_millis(ms));
            }
        }
        None
    }

    /// One line of `key=value` fields, for the parent process.
    fn to_line(&self) -> String {
        let lags: Vec<String> = self
            .lags
            .iter()
            .map(|(ms, n)| format!("{ms}:{n}"))
            .collect();
        format!(
            "holds={} ttl_ms={} acquire_us={} bytes_per_hold={} window_us={} renewals_per_sec={} ideal_per_sec={} client_cpu_us={} lost={} lags={}",
            self.holds,
            self.ttl.as_millis(),
            self.acquire_time.as_micros(),
            self.bytes_per_hold.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            self.window.as_micros(),
            self.renewals_per_sec,
            self.ideal_per_sec,
            self.client_cpu_us.map_or_else(|| "-".to_owned(), |c| c.to_string()),
            self.lost,
            lags.join(",")
        )
    }

    /// The inverse of [`Scale::to_line`].
    fn from_line(line: &str) -> Result<Scale> {
        let fields: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .collect();
        let bad = |what: &str| BenchError(format!("scale cell: bad or missing {what} in {line:?}"));
        let get = |k: &str| fields.get(k).copied().ok_or_else(|| bad(k));
        let num = |k: &str| -> Result<f64> { get(k)?.parse::<f64>().map_err(|_| bad(k)) };
        let int = |k: &str| -> Result<u64> { get(k)?.parse::<u64>().map_err(|_| bad(k)) };
        let opt = |k: &str| -> Result<Option<f64>> {
            match get(k)? {
                "-" => Ok(None),
                v => v.parse::<f64>().map(Some).map_err(|_| bad(k)),
            }
        };
        let mut lags = BTreeMap::new();
        for pair in get("lags")?.split(',').filter(|p| !p.is_empty()) {
            let (ms, n) = pair.split_once(':').ok_or_else(|| bad("lags"))?;
            lags.insert(
                ms.parse().map_err(|_| bad("lags"))?,
                n.parse().map_err(|_| bad("lags"))?,
            );
        }
        Ok(Scale {
            holds: usize::try_from(int("holds")?).map_err(|_| bad("holds"))?,
            ttl: Duration::from_millis(int("ttl_ms")?),
            acquire_time: Duration::from_micros(int("acquire_us")?),
            bytes_per_hold: opt("bytes_per_hold")?,
            window: Duration::from_micros(int("window_us")?),
            renewals_per_sec: num("renewals_per_sec")?,
            ideal_per_sec: num("ideal_per_sec")?,
            client_cpu_us: opt("client_cpu_us")?,
            lags,
            lost: usize::try_from(int("lost")?).map_err(|_| bad("lost"))?,
        })
    }
}

/// The child side: `--scale-cell PORT COUNT TTL_MS WINDOW_MS` runs one hold
/// count against the server on loopback port `PORT` and prints its line.
pub(crate) fn run_cell(args: &[String]) -> Result<()> {
    let usage = || BenchError("usage: --scale-cell PORT COUNT TTL_MS WINDOW_MS".into());
    let [port, count, ttl, window] = args else {
        return Err(usage());
    };
    let port: u16 = port.parse().map_err(|_| usage())?;
    let count: usize = count.parse().map_err(|_| usage())?;
    let ttl = Duration::from_millis(ttl.parse().map_err(|_| usage())?);
    let window = Duration::from_millis(window.parse().map_err(|_| usage())?);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let scale = runtime.block_on(run(&client, count, ttl, window))?;
    println!("{}", scale.to_line());
    Ok(())
}

/// Run `count` holds in a child process against the server on `port`,
/// killed (an error) if it has not finished by a generous deadline: the
/// window, two TTLs, and a minute plus a millisecond per hold to take and
/// give them back.
pub(crate) fn run_in_child(
    port: u16,
    count: usize,
    ttl: Duration,
    window: Duration,
) -> Result<Scale> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args([
            "--scale-cell".to_owned(),
            port.to_string(),
            count.to_string(),
            ttl.as_millis().to_string(),
            window.as_millis().to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError("scale cell: no stdout".into()))?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).map(|_| out)
    });
    let limit = window
        + ttl * 2
        + Duration::from_secs(60)
        + Duration::from_millis(u64::try_from(count).unwrap_or(u64::MAX));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > limit {
            child.kill()?;
            child.wait()?;
            return Err(BenchError(format!(
                "scale cell of {count} holds still running after {} s: stopped",
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader
        .join()
        .map_err(|_| BenchError("scale cell: the reader thread panicked".into()))??;
    if !status.success() {
        return Err(BenchError(format!(
            "scale cell of {count} holds failed ({status}): {}",
            stdout.trim()
        )));
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("holds="))
        .ok_or_else(|| BenchError(format!("scale cell of {count} holds printed no result")))?;
    Scale::from_line(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_line_reads_back_and_lag_quantiles_are_nearest_rank() {
        let s = Scale {
            holds: 1000,
            ttl: Duration::from_secs(30),
            acquire_time: Duration::from_micros(12_345),
            bytes_per_hold: Some(4321.5),
            window: Duration::from_secs(30),
            renewals_per_sec: 99.5,
            ideal_per_sec: 100.0,
            client_cpu_us: None,
            lags: BTreeMap::from([(0, 90), (1, 9), (7, 1)]),
            lost: 0,
        };
        let back = Scale::from_line(&s.to_line()).expect("reads back");
        assert_eq!(back.holds, 1000);
        assert_eq!(back.bytes_per_hold, Some(4321.5));
        assert_eq!(back.client_cpu_us, None);
        assert_eq!(back.lags, s.lags);
        assert_eq!(back.renewals_seen(), 100);
        assert_eq!(back.lag(0.5), Some(Duration::ZERO));
        assert_eq!(back.lag(0.99), Some(Duration::from_millis(1)));
        assert_eq!(back.lag(1.0), Some(Duration::from_millis(7)));
        let none = Scale {
            lags: BTreeMap::new(),
            ..back
        };
        assert_eq!(none.lag(0.99), None);
        assert!(Scale::from_line("holds=1").is_err());
        assert!(Scale::from_line(&s.to_line().replace("holds=1000", "holds=-1")).is_err());
    }
}
