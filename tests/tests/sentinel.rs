//! `Nodes::sentinel` against real `redis-server --sentinel` processes: a
//! master, its replica and one Sentinel on loopback ports. The lock follows
//! a failover to the new master, and a grant whose key the new master does
//! not have is reported lost.

use lockwright_core::ProtocolId;
use lockwright_redis::{Error, Lock, LockOptions, Nodes, OptionsError};
use lockwright_tests::{acquire_error, closed_port, raw, redis_or_skip, RedisServer};
use std::time::Duration;

const GROUP: &str = "lockwright-group";

fn started(what: &str, result: Result<RedisServer, String>) -> RedisServer {
    match result {
        Ok(server) => server,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Poll `check` every 100 ms for up to 30 s (a hang guard for a
/// reconfiguration the servers do on their own clock).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

async fn role(server: &RedisServer) -> String {
    let mut conn = server.conn().await;
    let role: Vec<redis::Value> = raw(&mut conn, &mut redis::cmd("ROLE")).await;
    match role.first() {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

async fn named_master(sentinel: &RedisServer) -> Option<u16> {
    let mut conn = sentinel.conn().await;
    let addr: Option<(String, u16)> = raw(
        &mut conn,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(GROUP),
    )
    .await;
    addr.map(|(_, port)| port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_follows_a_sentinel_failover_and_reports_a_vanished_grant_lost() {
    let Some(master) = redis_or_skip("sentinel") else {
        return;
    };
    let replica = started(
        "replica",
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]),
    );
    let sentinel = started(
        "sentinel",
        RedisServer::start_sentinel(master.port(), GROUP),
    );
    // The replica is in sync and the Sentinel knows it.
    eventually("the replica is connected", || async {
        let mut conn = master.conn().await;
        let info: String = raw(&mut conn, redis::cmd("INFO").arg("replication")).await;
        info.contains("connected_slaves:1") && info.contains("state=online")
    })
    .await;
    eventually("the sentinel knows the replica", || async {
        let mut conn = sentinel.conn().await;
        let replicas: Vec<redis::Value> =
            raw(&mut conn, redis::cmd("SENTINEL").arg("replicas").arg(GROUP)).await;
        !replicas.is_empty()
    })
    .await;

    let nodes = Nodes::sentinel(
        [sentinel.client()],
        GROUP,
        redis::Client::open("redis://127.0.0.1/").unwrap(),
        Duration::from_millis(500),
    )
    .unwrap();
    assert!(format!("{nodes:?}").contains(GROUP));
    let options = LockOptions {
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::Fenced, Duration::from_secs(3))
    };
    let lock = Lock::on(&nodes, "orders", options).unwrap();
    let guard = lock.acquire().await.unwrap();
    let mut conn = master.conn().await;
    let on_master: i64 = raw(&mut conn, redis::cmd("EXISTS").arg("{orders}")).await;
    assert_eq!(on_master, 1, "granted on the master Sentinel named");

    // Fail over to the replica (refused with NOGOODSLAVE until the
    // Sentinel has a fresh report of it: ask again).
    eventually("the sentinel starts a failover", || async {
        let mut conn = sentinel.conn().await;
        redis::cmd("SENTINEL")
            .arg("failover")
            .arg(GROUP)
            .query_async::<redis::Value>(&mut conn)
            .await
            .is_ok()
    })
    .await;
    eventually("the sentinel names the replica", || async {
        named_master(&sentinel).await == Some(replica.port())
    })
    .await;
    eventually("the replica is a master", || async {
        role(&replica).await == "master"
    })
    .await;
    // The grant was replicated; make the new master lose it (as an
    // unreplicated write would be lost).
    let mut promoted = replica.conn().await;
    let _: i64 = raw(&mut promoted, redis::cmd("DEL").arg("{orders}")).await;

    // The renewal now runs against the new master, finds no key: lost.
    tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("the vanished grant is reported lost");
    drop(guard);

    // New grants go to the new master.
    let guard = lock.acquire().await.unwrap();
    let on_new: i64 = raw(&mut promoted, redis::cmd("EXISTS").arg("{orders}")).await;
    assert_eq!(on_new, 1, "granted on the new master");
    assert_eq!(guard.release().await, Ok(true));
}

fn wrong_set_up(nodes: &Nodes) -> Lock {
    let options = LockOptions {
        request_timeout: Duration::from_millis(300),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(3))
    };
    Lock::on(nodes, "wrong-set-up", options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sentinel_set_up_is_an_error_not_a_wait() {
    let Some(plain) = redis_or_skip("sentinel set-up errors") else {
        return;
    };
    let t = Duration::from_millis(500);
    assert_eq!(
        Nodes::sentinel([], GROUP, plain.client(), t).err(),
        Some(Error::Options(OptionsError::NoSentinels))
    );
    // A plain server where a Sentinel should be.
    let nodes = Nodes::sentinel([plain.client()], GROUP, plain.client(), t).unwrap();
    match acquire_error("not a sentinel", wrong_set_up(&nodes).acquire()).await {
        Error::Topology(text) => assert!(text.contains("SENTINEL"), "{text}"),
        other => panic!("a plain server as Sentinel: {other:?}"),
    }
    // A Sentinel that does not know the group's name.
    let sentinel = started("sentinel", RedisServer::start_sentinel(plain.port(), GROUP));
    let nodes = Nodes::sentinel([sentinel.client()], "no-such-group", plain.client(), t).unwrap();
    match acquire_error("unknown master", wrong_set_up(&nodes).acquire()).await {
        Error::Topology(_) => {}
        other => panic!("an unknown master name: {other:?}"),
    }
    // A Sentinel that is down might know the group: keep trying, in
    // either order, until the deadline.
    let down = redis::Client::open(format!("redis://127.0.0.1:{}/", closed_port())).unwrap();
    for sentinels in [
        [sentinel.client(), down.clone()],
        [down.clone(), sentinel.client()],
    ] {
        let nodes = Nodes::sentinel(sentinels, "no-such-group", plain.client(), t).unwrap();
        let result = wrong_set_up(&nodes)
            .acquire_timeout(Duration::from_millis(800))
            .await;
        assert!(
            matches!(result, Err(Error::Timeout | Error::Unavailable(_))),
            "with a Sentinel down the error may pass: {result:?}"
        );
    }
}
