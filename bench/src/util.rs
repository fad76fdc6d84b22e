//! What every section shares: the error type, percentiles, INFO parsing.

use std::collections::BTreeMap;
use std::time::Duration;

/// Everything a benchmark step can fail with, rendered.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BenchError(pub(crate) String);

impl BenchError {
    pub(crate) fn new(context: &str, e: impl std::fmt::Display) -> BenchError {
        BenchError(format!("{context}: {e}"))
    }
}

impl From<redis::RedisError> for BenchError {
    fn from(e: redis::RedisError) -> BenchError {
        BenchError::new("redis", e)
    }
}

impl From<lockwright_redis::Error> for BenchError {
    fn from(e: lockwright_redis::Error) -> BenchError {
        BenchError::new("lockwright-redis", e)
    }
}

impl From<rslock::LockError> for BenchError {
    fn from(e: rslock::LockError) -> BenchError {
        BenchError::new("rslock", e)
    }
}

impl From<tokio::task::JoinError> for BenchError {
    fn from(e: tokio::task::JoinError) -> BenchError {
        BenchError::new("task", e)
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> BenchError {
        BenchError::new("io", e)
    }
}

/// A benchmark result.
pub(crate) type Result<T> = std::result::Result<T, BenchError>;

/// The `q`-quantile (0.0–1.0) of `samples` (nearest rank); zero when empty.
pub(crate) fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean of `samples`; zero when empty.
pub(crate) fn mean(samples: &[Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let total: Duration = samples.iter().sum();
    total / u32::try_from(samples.len()).unwrap_or(u32::MAX)
}

/// Milliseconds with two decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// `calls` per command name from `INFO commandstats`
/// (`cmdstat_set:calls=3,usec=...`).
pub(crate) fn commandstats(info: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.trim().parse::<u64>().ok());
        if let Some(calls) = calls {
            out.insert(name.to_owned(), calls);
        }
    }
    out
}

/// Reset a server's command statistics.
pub(crate) async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) -> Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

/// A server's command counts since the last reset, without the
/// bench's own `INFO` and `CONFIG` calls.
pub(crate) async fn command_counts(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut counts = commandstats(&info);
    counts.remove("info");
    counts.remove("config|resetstat");
    counts.remove("config");
    Ok(counts)
}

/// Clock ticks per second of `/proc/<pid>/stat` times: `AT_CLKTCK` from
/// `/proc/self/auxv` (what `getconf CLK_TCK` reports), else `getconf
/// CLK_TCK`, else 100 (the Linux default).
pub(crate) fn clock_ticks() -> u64 {
    const AT_CLKTCK: u64 = 17;
    let from_auxv = std::fs::read("/proc/self/auxv").ok().and_then(|bytes| {
        let word = std::mem::size_of::<usize>();
        bytes.chunks_exact(2 * word).find_map(|pair| {
            let read = |b: &[u8]| {
                let mut buf = [0u8; 8];
                buf[..word].copy_from_slice(b);
                u64::from_ne_bytes(buf)
            };
            let (key, value) = pair.split_at(word);
            (read(key) == AT_CLKTCK).then(|| read(value))
        })
    });
    from_auxv
        .or_else(|| {
            std::process::Command::new("getconf")
                .arg("CLK_TCK")
                .output()
                .ok()
                .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        })
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// This process's CPU time so far as (user time, system time), every
/// thread, children not included, from `/proc/self/stat`; `None` where it
/// cannot be read.
pub(crate) fn process_cpu_split(ticks_per_sec: u64) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name: state is field 3, utime
    // field 14 and stime field 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let tps = ticks_per_sec.max(1);
    let of = |ticks: u64| {
        Duration::from_secs(ticks / tps) + Duration::from_secs(ticks % tps) / tps as u32
    };
    Some((of(utime), of(stime)))
}

/// The CPU time of this process's threads so far, in nanoseconds: the
/// first field of each `/proc/self/task/<tid>/schedstat`, summed (`None`
/// where it cannot be read). Finer than [`process_cpu_split`]'s clock ticks; a
/// thread that ends between two readings takes its time with it.
pub(crate) fn threads_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// The CPU time of the calling thread so far, in nanoseconds
/// (`/proc/thread-self/schedstat`), or `None`.
pub(crate) fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The machine's busy and total CPU time so far, in ticks (the `cpu` line
/// of `/proc/stat`; busy is everything but idle and iowait), or `None`.
pub(crate) fn machine_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// `used_cpu_user + used_cpu_sys` of a server's `INFO cpu`, in seconds.
pub(crate) fn server_cpu_seconds(info: &str) -> f64 {
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// A server's CPU time so far (`INFO cpu`), in seconds.
pub(crate) async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(server_cpu_seconds(&info))
}

/// `counts` as `name×n` pairs, largest first.
pub(crate) fn render_counts(counts: &BTreeMap<String, u64>, per: f64) -> String {
    let mut pairs: Vec<(&String, &u64)> = counts.iter().collect();
    pairs.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    pairs
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(name, n)| format!("{} {:.2}", name.to_uppercase(), **n as f64 / per))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_is_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&s, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&s, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn commandstats_reads_calls_per_command() {
        let info = "# Commandstats\r\ncmdstat_set:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_client|setinfo:calls=4,usec=1\r\ngarbage\r\n";
        let c = commandstats(info);
        assert_eq!(c.get("set"), Some(&12));
        assert_eq!(c.get("client|setinfo"), Some(&4));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn server_cpu_sums_user_and_sys_only() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n\
                    used_cpu_sys_children:9.0\r\nused_cpu_user_main_thread:2.0\r\n";
        assert!((server_cpu_seconds(info) - 3.75).abs() < 1e-9);
    }

    #[test]
    fn process_cpu_is_readable_here() {
        let ticks = clock_ticks();
        assert!(ticks > 0);
        assert!(process_cpu_split(ticks).is_some());
    }
}
