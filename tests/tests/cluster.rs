//! `Nodes::cluster` against a real 3-master Redis Cluster started on
//! loopback ports: each lock runs against the master of its slot, two
//! processes exclude each other, `MOVED` is followed when a slot changes
//! hands, and the protocols that `WATCH` are refused.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions, Nodes, OptionsError, Semaphore};
use lockwright_tests::{
    acquire_error, cluster_or_skip, raw, redis_or_skip, try_raw, Cluster, RedisServer,
};
use std::time::Duration;

fn options(protocol: ProtocolId) -> LockOptions {
    LockOptions {
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(protocol, Duration::from_secs(10))
    }
}

/// Lock names whose slots fall on each of the three masters.
async fn names_on_every_master(cluster: &Cluster) -> Vec<(String, u16)> {
    let mut found: Vec<Option<(String, u16)>> = vec![None, None, None];
    for i in 0.. {
        let name = format!("order-{i}");
        let slot = cluster.slot(&format!("{{{name}}}")).await;
        let owner = match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        if found[owner].is_none() {
            found[owner] = Some((name, slot));
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.into_iter().flatten().collect()
}

async fn exists(node: &RedisServer, key: &str) -> i64 {
    let mut conn = node.conn().await;
    raw(&mut conn, redis::cmd("EXISTS").arg(key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_run_on_the_master_of_their_slot_and_exclude_across_processes() {
    let Some(cluster) = cluster_or_skip("cluster").await else {
        return;
    };
    let ours = Nodes::cluster([cluster.nodes[0].client()], Duration::from_millis(500)).unwrap();
    let theirs = Nodes::cluster([cluster.nodes[2].client()], Duration::from_millis(500)).unwrap();
    assert!(ours.is_cluster());
    for (name, slot) in names_on_every_master(&cluster).await {
        let owner = cluster.initial_owner(slot);
        for protocol in [
            ProtocolId::SetPxLua,
            ProtocolId::Fenced,
            ProtocolId::Reentrant,
        ] {
            let lock = Lock::on(&ours, name.clone(), options(protocol)).unwrap();
            let rival = Lock::on(&theirs, name.clone(), options(protocol)).unwrap();
            let guard = lock.try_acquire().await.unwrap().expect("granted");
            assert_eq!(exists(owner, &format!("{{{name}}}")).await, 1, "{protocol}");
            if protocol == ProtocolId::Fenced {
                assert_eq!(exists(owner, &format!("{{{name}}}:fence")).await, 1);
            }
            assert!(rival.try_acquire().await.unwrap().is_none(), "{protocol}");
            assert_eq!(guard.release().await, Ok(true), "{protocol}");
            let guard = rival.try_acquire().await.unwrap().expect("free again");
            assert_eq!(guard.release().await, Ok(true), "{protocol}");
        }
        let sem = Semaphore::on(
            &ours,
            format!("pool-{name}"),
            LockOptions {
                limit: 2,
                ..options(ProtocolId::LeaseSemaphore)
            },
        )
        .unwrap();
        let a = sem.try_acquire().await.unwrap().expect("permit");
        let b = sem.try_acquire().await.unwrap().expect("permit");
        assert!(sem.try_acquire().await.unwrap().is_none(), "limit 2");
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
    assert!(matches!(
        Lock::on(&ours, "w", options(ProtocolId::SetPxWatch)),
        Err(Error::Options(OptionsError::WatchOnCluster { .. }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_follows_its_slot_to_a_new_master() {
    let Some(cluster) = cluster_or_skip("cluster moved").await else {
        return;
    };
    let nodes = Nodes::cluster([cluster.nodes[0].client()], Duration::from_millis(500)).unwrap();
    let name = "moving";
    let key = format!("{{{name}}}");
    let slot = cluster.slot(&key).await;
    let from = cluster.initial_owner(slot);
    let lock = Lock::on(&nodes, name, options(ProtocolId::Fenced)).unwrap();
    // The cluster connection learns the slot map on its first request.
    let guard = lock.try_acquire().await.unwrap().expect("granted");
    assert_eq!(guard.release().await, Ok(true));
    let mut admin = from.conn().await;
    let _: i64 = raw(&mut admin, redis::cmd("DEL").arg(&key)).await;
    let _: i64 = raw(&mut admin, redis::cmd("DEL").arg(format!("{key}:fence"))).await;

    // Hand the (now empty) slot to another master.
    let to = cluster
        .nodes
        .iter()
        .find(|n| n.port() != from.port())
        .expect("three masters");
    let mut target = to.conn().await;
    let to_id: String = raw(&mut target, redis::cmd("CLUSTER").arg("MYID")).await;
    let mut set_slot = redis::cmd("CLUSTER");
    set_slot.arg("SETSLOT").arg(slot).arg("NODE").arg(&to_id);
    let _: () = raw(&mut target, &mut set_slot.clone()).await;
    let _: String = raw(&mut target, redis::cmd("CLUSTER").arg("BUMPEPOCH")).await;
    // The others are told too, best effort.
    for node in &cluster.nodes {
        if node.port() != to.port() {
            let mut conn = node.conn().await;
            let _: Result<(), String> = try_raw(&mut conn, &mut set_slot.clone()).await;
        }
    }
    // The old owner now redirects.
    let mut moved = false;
    for _ in 0..300 {
        let reply: Result<Option<String>, String> =
            try_raw(&mut admin, redis::cmd("GET").arg(&key)).await;
        if reply.is_err_and(|e| e.to_uppercase().contains("MOVED")) {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "the old owner redirects the slot");

    // The client's slot map is stale: its request meets MOVED and follows it.
    let guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("granted on the new owner");
    assert_eq!(exists(to, &key).await, 1, "the key lives on the new owner");
    assert_eq!(guard.release().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notified_waiters_subscribe_on_the_cluster_and_get_the_lock() {
    let Some(cluster) = cluster_or_skip("cluster notify").await else {
        return;
    };
    let notified = LockOptions {
        notify: true,
        ..options(ProtocolId::SetPxLua)
    };
    let ours = Nodes::cluster([cluster.nodes[0].client()], Duration::from_millis(500)).unwrap();
    let theirs = Nodes::cluster([cluster.nodes[2].client()], Duration::from_millis(500)).unwrap();
    let holder = Lock::on(&ours, "notified", notified.clone()).unwrap();
    let guard = holder.try_acquire().await.unwrap().expect("granted");
    let waiter = Lock::on(&theirs, "notified", notified).unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    // The waiter's channel is subscribed on its seed node.
    let mut seed = cluster.nodes[2].conn().await;
    let mut subscribers = 0;
    for _ in 0..300 {
        let reply: (String, i64) = raw(
            &mut seed,
            redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("{notified}:released"),
        )
        .await;
        subscribers = reply.1;
        if subscribers > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(subscribers, 1, "one subscription for the waiting lock");
    assert_eq!(guard.release().await, Ok(true));
    let guard = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the waiter gets the lock")
        .expect("task")
        .expect("acquired");
    assert_eq!(guard.release().await, Ok(true));
}

fn wrong_set_up(nodes: &Nodes) -> Lock {
    Lock::on(nodes, "wrong-set-up", options(ProtocolId::SetPxLua)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_cluster_set_up_is_an_error_not_a_wait() {
    let Some(plain) = redis_or_skip("cluster set-up errors") else {
        return;
    };
    let t = Duration::from_millis(500);
    assert_eq!(
        Nodes::cluster(Vec::<redis::Client>::new(), t).err(),
        Some(Error::Options(OptionsError::NoSeeds))
    );
    // A seed with cluster support disabled.
    let nodes = Nodes::cluster([plain.client()], t).unwrap();
    match acquire_error("no cluster", wrong_set_up(&nodes).acquire()).await {
        Error::Topology(text) => assert!(text.contains("cluster support disabled"), "{text}"),
        other => panic!("a seed that is no cluster node: {other:?}"),
    }
    // A seed that refuses our password.
    let guarded = match RedisServer::start_with(&["--requirepass", "right-pw"]) {
        Ok(server) => server,
        Err(e) => panic!("redis-server with a password: {e}"),
    };
    let wrong =
        redis::Client::open(format!("redis://:wrong-pw@127.0.0.1:{}/", guarded.port())).unwrap();
    let nodes = Nodes::cluster([wrong], t).unwrap();
    match acquire_error("wrong password", wrong_set_up(&nodes).acquire()).await {
        Error::Auth(_) => {}
        other => panic!("a wrong password: {other:?}"),
    }
}
