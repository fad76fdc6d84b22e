//! The semaphore protocols of the catalogue, one file each.
//!
//! | id | file | origin |
//! |---|---|---|
//! | `zset-semaphore` | [`zset_semaphore`] | "Redis in Action" 6.3.1 |
//! | `fair-semaphore` | [`fair_semaphore`] | "Redis in Action" 6.3.2 |
//! | `fair-semaphore-locked` | [`fair_semaphore_locked`] | "Redis in Action" 6.3.5 |
//! | `watch-semaphore` | [`watch_semaphore`] | "Redis使用手册" |
//! | `lease-semaphore` | [`lease_semaphore`] | beyond the sources |
//! | `time-fenced-semaphore` | [`time_fenced_semaphore`] | beyond the sources |
//!
//! Every semaphore is a *recipe* (which commands an acquire, a release and
//! an extend send, and what each reply means) run by the one engine
//! (`engine.rs`) that the single-node locks run on too.
//!
//! A permit is a [`Lease`](crate::protocol::Lease). An acquire that fails after writing something
//! (a rank above the limit, an error, an unknown outcome) first runs the
//! recipe's release to take its entry out again, then retries or reports.

pub mod fair_semaphore;
pub mod fair_semaphore_locked;
pub mod lease_semaphore;
pub mod time_fenced_semaphore;
pub mod watch_semaphore;
pub mod zset_semaphore;

use crate::keyspace::{Command, Reply, ScoreBound};
use crate::time::Millis;

/// A client timestamp as a sorted-set score.
pub(crate) fn score(now: Millis) -> i64 {
    i64::try_from(now.get()).unwrap_or(i64::MAX)
}

/// The item `index` of a transaction reply of `len` items, if that is its shape.
pub(crate) fn item(reply: &Reply, len: usize, index: usize) -> Option<&Reply> {
    match reply {
        Reply::Array(items) if items.len() == len => items.get(index),
        _ => None,
    }
}

/// The first command of the book's ZSET semaphores' acquire: drop every
/// holder whose timestamp is older than the TTL at `now`
/// (`ZREMRANGEBYSCORE sem -inf (now-ttl`).
pub(crate) fn purge_expired(sem: &str, now: i64, ttl_ms: i64) -> Command {
    Command::ZRemRangeByScore {
        key: sem.to_owned(),
        min: ScoreBound::NegInf,
        max: ScoreBound::Exclusive(now.saturating_sub(ttl_ms)),
    }
}
