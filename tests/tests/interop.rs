//! Interop: a `set-px-lua` lock taken by this library and the standard scheme
//! other clients use (`SET key token NX PX ttl`, released by a Lua
//! compare-and-delete) exclude each other on the same key, `{name}`.

use lockwright_core::ProtocolId;
use lockwright_redis::{Lock, LockOptions};
use lockwright_tests::{raw, redis_or_skip};
use std::time::Duration;

const FOREIGN_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

fn lock(redis: &lockwright_tests::RedisServer) -> Lock {
    let options = LockOptions {
        auto_renew: false,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(10))
    };
    Lock::new([redis.client()], "shared", options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_lock_excludes_a_foreign_client() {
    let Some(redis) = redis_or_skip("interop") else {
        return;
    };
    let ours = lock(&redis);
    let mut foreign = redis.conn().await;
    let guard = ours.try_acquire().await.unwrap().expect("granted");
    let taken: Option<String> = raw(
        &mut foreign,
        redis::cmd("SET")
            .arg("{shared}")
            .arg("foreign-token")
            .arg("NX")
            .arg("PX")
            .arg(10_000),
    )
    .await;
    assert_eq!(
        taken, None,
        "the foreign SET NX is refused while we hold it"
    );
    // Its compare-and-delete with its own token removes nothing of ours.
    let deleted: i64 = raw(
        &mut foreign,
        redis::cmd("EVAL")
            .arg(FOREIGN_RELEASE)
            .arg(1)
            .arg("{shared}")
            .arg("foreign-token"),
    )
    .await;
    assert_eq!(deleted, 0);
    let value: String = raw(&mut foreign, redis::cmd("GET").arg("{shared}")).await;
    assert_eq!(
        value.as_str(),
        guard.token().as_str(),
        "the key holds our token"
    );
    assert_eq!(guard.release().await, Ok(true));
    let taken: Option<String> = raw(
        &mut foreign,
        redis::cmd("SET")
            .arg("{shared}")
            .arg("foreign-token")
            .arg("NX")
            .arg("PX")
            .arg(10_000),
    )
    .await;
    assert_eq!(
        taken.as_deref(),
        Some("OK"),
        "free for the foreign client after our release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_lock_excludes_ours() {
    let Some(redis) = redis_or_skip("interop") else {
        return;
    };
    let ours = lock(&redis);
    let mut foreign = redis.conn().await;
    let taken: Option<String> = raw(
        &mut foreign,
        redis::cmd("SET")
            .arg("{shared}")
            .arg("foreign-token")
            .arg("NX")
            .arg("PX")
            .arg(10_000),
    )
    .await;
    assert_eq!(taken.as_deref(), Some("OK"));
    assert!(
        ours.try_acquire().await.unwrap().is_none(),
        "held by the foreign client"
    );
    let waiting = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.acquire_timeout(Duration::from_secs(3)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted: i64 = raw(
        &mut foreign,
        redis::cmd("EVAL")
            .arg(FOREIGN_RELEASE)
            .arg(1)
            .arg("{shared}")
            .arg("foreign-token"),
    )
    .await;
    assert_eq!(deleted, 1, "our waiting never touched the foreign hold");
    let guard = waiting
        .await
        .unwrap()
        .expect("ours after the foreign release");
    assert_eq!(guard.release().await, Ok(true));
}
