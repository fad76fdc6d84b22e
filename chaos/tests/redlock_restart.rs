//! RedLock over three real masters, one of which is killed and restarted
//! without persistence: at once, or only after the TTL (antirez's "delayed
//! restarts").
//!
//! Cells: (redlock, restart, mutual-exclusion) and
//! (redlock, restart-delayed, mutual-exclusion).
//!
//! Client 1 reaches A and B, client 2 reaches B and C (each is given an
//! unreachable address for the third). Client 1 acquires on A and B, a
//! majority. B is killed (SIGKILL) and restarted empty:
//!
//! - at once: client 2 acquires on B and C while client 1 still holds;
//! - after more than the TTL: client 2, retrying all along, gets its
//!   majority only after client 1's validity has run out.

mod common;

use std::time::Duration;

use common::{clients, docker_ready, fence_of, report, unreachable_url, Outcome};
use lockwright_chaos::{Cluster, History, NodeOptions, Op};
use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};

/// Long enough for a restart to finish well inside client 1's validity.
const LONG_TTL: Duration = Duration::from_secs(10);
/// Short, so that the delayed restart does not take long.
const SHORT_TTL: Duration = Duration::from_millis(1_500);

fn options(ttl: Duration) -> LockOptions {
    LockOptions {
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::Redlock, ttl)
    }
}

async fn restart(cluster: &Cluster, name: &str, ttl: Duration, delay: Option<Duration>) -> History {
    let urls = cluster.urls();
    let (dead_1, dead_2) = (unreachable_url(), unreachable_url());
    let first_view = [urls[0].clone(), urls[1].clone(), dead_1];
    let second_view = [dead_2, urls[1].clone(), urls[2].clone()];
    let first = Lock::new(clients(&first_view), name, options(ttl)).expect("lock");
    let second = Lock::new(clients(&second_view), name, options(ttl)).expect("lock");
    let history = History::new();

    let guard_1 = first
        .try_acquire()
        .await
        .expect("acquire")
        .expect("client 1 holds A and B");
    history.grant("client-1", fence_of(&guard_1), guard_1.valid_until());
    assert!(
        common::is_denied(&second.try_acquire().await),
        "client 2 must be refused while B holds client 1's key"
    );
    history.record("client-2", Op::Denied);

    let node = cluster.node(1);
    node.kill().await.expect("kill B");
    let contender = tokio::spawn(async move {
        second
            .acquire_timeout(Duration::from_secs(10))
            .await
            .expect("client 2 acquires")
    });
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    node.restart().await.expect("restart B empty");
    let guard_2 = contender.await.expect("join");
    history.grant("client-2", fence_of(&guard_2), guard_2.valid_until());

    history.record("client-2", Op::Release);
    common::release_with_unreachable(guard_2).await;
    history.record("client-1", Op::Release);
    let _ = guard_1.release().await;
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_breaks_redlock_unless_delayed_beyond_the_ttl() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("redlock", "restart"), ("redlock", "restart-delayed")]);
    let cluster = Cluster::start(3, &NodeOptions::default())
        .await
        .expect("three masters");

    let at_once = restart(&cluster, "restart-at-once", LONG_TTL, None).await;
    let delayed = restart(
        &cluster,
        "restart-delayed",
        SHORT_TTL,
        Some(SHORT_TTL + Duration::from_millis(500)),
    )
    .await;

    report(
        "redlock_restart",
        &[
            (
                Outcome::from_history(
                    "redlock_restart/at-once",
                    "redlock",
                    "restart",
                    "mutual-exclusion",
                    &at_once,
                    1,
                    "",
                ),
                "violated",
            ),
            (
                Outcome::from_history(
                    "redlock_restart/delayed",
                    "redlock",
                    "restart-delayed",
                    "mutual-exclusion",
                    &delayed,
                    1,
                    "client 2 acquired only after client 1's validity",
                ),
                "holds",
            ),
        ],
    );
}
