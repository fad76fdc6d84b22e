//! Smoke tests: each fault of lockwright-chaos, on real containers, with an
//! outcome that would differ without the fault.
//!
//! Needs Docker and the local image (`.ci/build-redis-image.sh`). Without
//! them each test prints `SKIPPED: <reason>` and passes, unless `CI` is set.

use std::time::{Duration, Instant};

use lockwright_chaos::{check_environment, Availability, Cluster, NodeOptions, Persistence};
use redis::AsyncCommands;

/// True when the test should run; prints the reason and returns false when it
/// should skip; fails the test when `CI` is set and Docker or the image is
/// missing.
fn docker_ready() -> bool {
    match check_environment() {
        Ok(Availability::Ready) => true,
        Ok(Availability::Skip(_)) => false,
        Err(error) => panic!("chaos tests require Docker and the image in CI: {error}"),
    }
}

async fn set_px(node: &lockwright_chaos::RedisNode, key: &str, ttl_ms: u64) {
    let mut connection = node.connect().await.expect("connect");
    let reply: String = redis::cmd("SET")
        .arg(key)
        .arg("owner-a")
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut connection)
        .await
        .expect("SET NX PX");
    assert_eq!(reply, "OK");
}

async fn get(node: &lockwright_chaos::RedisNode, key: &str) -> Option<String> {
    let mut connection = node.connect().await.expect("connect");
    connection.get(key).await.expect("GET")
}

async fn pttl(node: &lockwright_chaos::RedisNode, key: &str) -> i64 {
    let mut connection = node.connect().await.expect("connect");
    connection.pttl(key).await.expect("PTTL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_jump_moves_time_and_expires_a_key_early() {
    if !docker_ready() {
        return;
    }
    let mut cluster = Cluster::start(2, &NodeOptions::default())
        .await
        .expect("cluster");
    let ttl = 30_000;
    for node in cluster.nodes() {
        set_px(node, "lock", ttl).await;
    }
    let before = cluster.node(0).server_time_ms().await.expect("TIME");

    // A jump smaller than the TTL: the key stays, its PTTL drops by the jump.
    cluster.node_mut(0).jump_clock(10_000).expect("jump");
    let after = cluster.node(0).server_time_ms().await.expect("TIME");
    assert!(
        (10_000..12_000).contains(&(after - before)),
        "TIME moved by {} ms",
        after - before
    );
    let remaining = pttl(cluster.node(0), "lock").await;
    assert!(
        (0..=20_000).contains(&remaining),
        "PTTL after a 10 s jump: {remaining}"
    );

    // Past the TTL: the key is gone on the jumped node only.
    cluster
        .node_mut(0)
        .jump_clock(ttl as i64 + 1_000)
        .expect("jump");
    assert_eq!(get(cluster.node(0), "lock").await, None);
    assert_eq!(pttl(cluster.node(0), "lock").await, -2);
    assert_eq!(
        get(cluster.node(1), "lock").await.as_deref(),
        Some("owner-a")
    );
    assert!(pttl(cluster.node(1), "lock").await > 25_000);
    assert_eq!(cluster.node(0).clock_offset_ms(), 41_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_without_persistence_forgets_the_lock() {
    if !docker_ready() {
        return;
    }
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("cluster");
    let node = cluster.node(0);
    let port = node.host_port();
    set_px(node, "lock", 60_000).await;
    node.kill().await.expect("kill");
    assert!(node.ping_within(Duration::from_millis(300)).await.is_err());
    node.restart().await.expect("restart");
    assert_eq!(node.host_port(), port);
    assert_eq!(get(node, "lock").await, None, "a restarted empty master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_with_aof_fsync_always_keeps_the_lock() {
    if !docker_ready() {
        return;
    }
    let options = NodeOptions::with_persistence(Persistence::AofFsyncAlways);
    let cluster = Cluster::start(1, &options).await.expect("cluster");
    let node = cluster.node(0);
    set_px(node, "lock", 60_000).await;
    node.kill().await.expect("kill");
    node.restart().await.expect("restart");
    assert_eq!(get(node, "lock").await.as_deref(), Some("owner-a"));
    let remaining = pttl(node, "lock").await;
    assert!(
        (1..=60_000).contains(&remaining),
        "the TTL survives too: {remaining}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_blocks_clients_until_healed() {
    if !docker_ready() {
        return;
    }
    let cluster = Cluster::start(2, &NodeOptions::default())
        .await
        .expect("cluster");
    set_px(cluster.node(0), "lock", 60_000).await;
    cluster.node(0).partition().await.expect("partition");
    let started = Instant::now();
    assert!(
        cluster
            .node(0)
            .ping_within(Duration::from_millis(500))
            .await
            .is_err(),
        "PING through a partition must fail"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    cluster
        .node(1)
        .ping_within(Duration::from_millis(500))
        .await
        .expect("the other node is not partitioned");
    cluster.node(0).heal().await.expect("heal");
    assert_eq!(
        get(cluster.node(0), "lock").await.as_deref(),
        Some("owner-a"),
        "a partition loses no data"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_withholds_replies_until_unpaused() {
    if !docker_ready() {
        return;
    }
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("cluster");
    let node = cluster.node(0);
    let mut connection = node.connect().await.expect("connect");
    set_px(node, "lock", 60_000).await;
    node.pause().await.expect("pause");
    let mut paused = connection.clone();
    let pending = tokio::spawn(async move {
        let started = Instant::now();
        let reply: redis::RedisResult<Option<String>> = paused.get("lock").await;
        (reply, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!pending.is_finished(), "a paused node must not answer");
    node.unpause().await.expect("unpause");
    let (reply, waited) = pending.await.expect("join");
    // The connection times out after 1 s; either the reply arrived after the
    // thaw or the client gave up: in both cases it waited through the pause.
    assert!(waited >= Duration::from_millis(700), "waited {waited:?}");
    if let Ok(value) = reply {
        assert_eq!(value.as_deref(), Some("owner-a"));
    }
    let value: Option<String> = connection.get("lock").await.expect("GET after unpause");
    assert_eq!(value.as_deref(), Some("owner-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_the_unreplicated_write() {
    if !docker_ready() {
        return;
    }
    let cluster = Cluster::start_replicated(&NodeOptions::default())
        .await
        .expect("master and replica");
    let (master, replica) = (cluster.node(0), cluster.node(1));

    set_px(master, "replicated", 60_000).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(replica, "replicated").await.is_none() {
        assert!(Instant::now() < deadline, "the replica never got the write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    replica.isolate_from_peers().await.expect("cut replication");
    set_px(master, "lock", 60_000).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    replica.promote().await.expect("REPLICAOF NO ONE");

    assert_eq!(get(master, "lock").await.as_deref(), Some("owner-a"));
    assert_eq!(
        get(replica, "replicated").await.as_deref(),
        Some("owner-a"),
        "the promoted replica has what was replicated"
    );
    assert_eq!(get(replica, "lock").await, None, "and not the lock");
    // A second client now acquires the same lock on the new master.
    let mut connection = replica.connect().await.expect("connect");
    let reply: Option<String> = redis::cmd("SET")
        .arg("lock")
        .arg("owner-b")
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut connection)
        .await
        .expect("SET on the promoted replica");
    assert_eq!(reply.as_deref(), Some("OK"), "two owners of one lock");
}
