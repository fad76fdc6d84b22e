//! Section 4: the cache-stampede guard.
//!
//! `readers` tasks read one expired (absent) key at the same instant; the
//! loader takes [`LOAD`]. Without the guard every reader misses, loads and
//! sets (the stampede); with [`Cache::get_or_load`] one loads and the others
//! re-read until the value is there.

use crate::util::{BenchError, Result};
use lockwright_redis::{Cache, CacheOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

/// The slow loader's duration.
pub(crate) const LOAD: Duration = Duration::from_millis(50);
const KEY: &str = "hot";

/// What one configuration measured.
#[derive(Clone, Debug)]
pub(crate) struct Stampede {
    /// Loader calls over all rounds.
    pub(crate) loader_calls: u64,
    /// Every read's latency.
    pub(crate) latencies: Vec<Duration>,
    /// Reads that failed.
    pub(crate) errors: u64,
}

async fn load(calls: &AtomicU64) -> std::result::Result<String, BenchError> {
    calls.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(LOAD).await;
    Ok("expensive value".to_owned())
}

/// `rounds` rounds of `readers` simultaneous reads of an absent key.
pub(crate) async fn run(
    client: &redis::Client,
    guarded: bool,
    readers: usize,
    rounds: usize,
) -> Result<Stampede> {
    let mut admin = client.get_multiplexed_async_connection().await?;
    let shared = client.get_multiplexed_async_connection().await?;
    let cache = Cache::new(client.clone(), "stampede", CacheOptions::default())?;
    let calls = Arc::new(AtomicU64::new(0));
    let mut latencies = Vec::new();
    let mut errors = 0;
    for _ in 0..rounds {
        redis::cmd("FLUSHALL").query_async::<()>(&mut admin).await?;
        let barrier = Arc::new(Barrier::new(readers));
        let mut handles = Vec::new();
        for _ in 0..readers {
            let (barrier, calls, cache, mut conn) = (
                barrier.clone(),
                calls.clone(),
                cache.clone(),
                shared.clone(),
            );
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let read = if guarded {
                    cache
                        .get_or_load(KEY, || async { load(&calls).await })
                        .await
                        .map_err(BenchError::from)
                } else {
                    naive(&mut conn, &calls).await
                };
                (started.elapsed(), read.is_ok())
            }));
        }
        for h in handles {
            let (took, ok) = h.await?;
            latencies.push(took);
            if !ok {
                errors += 1;
            }
        }
    }
    Ok(Stampede {
        loader_calls: calls.load(Ordering::Relaxed),
        latencies,
        errors,
    })
}

/// GET; on a miss, load and SET with a TTL.
async fn naive(conn: &mut redis::aio::MultiplexedConnection, calls: &AtomicU64) -> Result<String> {
    let cached: Option<String> = redis::cmd("GET").arg(KEY).query_async(conn).await?;
    if let Some(v) = cached {
        return Ok(v);
    }
    let v = load(calls).await?;
    redis::cmd("SET")
        .arg(KEY)
        .arg(&v)
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(conn)
        .await?;
    Ok(v)
}
