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
}
