//! A guarded critical section with `lost()` handling.
//!
//! Run against a local Redis: `cargo run -p lockwright-redis --example guarded
//! [redis://127.0.0.1:6379/]`.
//!
//! The worker takes the `fenced` lock (automatic renewal on), then does its
//! work in steps. Each step races the lock's `lost()` future: if renewal
//! fails or the lease runs out, the worker stops at once instead of writing
//! with a lock it no longer holds, and every write carries the fence so that
//! the resource can refuse a stale holder anyway.

use lockwright_redis::{redis, Error, Lock, LockOptions, ProtocolId};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let client = redis::Client::open(url)?;
    // Renews at TTL/3 while the guard lives.
    let options = LockOptions::new(ProtocolId::Fenced, Duration::from_secs(3));
    let lock = Lock::new([client], "invoice-batch", options)?;

    let guard = match lock.acquire_timeout(Duration::from_secs(5)).await {
        Ok(guard) => guard,
        Err(Error::Timeout) => {
            println!("someone else is running the batch; giving up");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let fence = guard.fence();
    println!("holding the lock with fence {fence:?}");

    let lost = guard.lost();
    tokio::pin!(lost);
    for step in 1..=5 {
        tokio::select! {
            () = &mut lost => {
                eprintln!("lock lost at step {step}: stopping before touching the resource");
                return Ok(());
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                // A real worker writes to the resource here, passing `fence`
                // so that the resource refuses writes from an older holder.
                println!("step {step} done under fence {fence:?}, {:?} left", guard.remaining());
            }
        }
    }
    let removed = guard.release().await?;
    println!("released (removed our hold: {removed})");
    Ok(())
}
