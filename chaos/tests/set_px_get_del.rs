//! `set-px-get-del` deletes its successor's lock on a real master (the
//! unsafe `IdentityLock` of "Redis使用手册").
//!
//! Cells: (set-px-get-del, pause, owner-only) violated, and as a control
//! (set-px-lua, pause, owner-only) holds.
//!
//! The release is `GET`, compare in the client, then `DEL`. The adapter
//! has no hook to stop a client between two requests of one operation, so
//! the scenario drives the core machine itself ([`DrivenMachine`], the
//! adapter's wire functions): client 1 starts its release, its `GET` runs
//! and answers with its own token, and the client pauses with the `DEL` in
//! hand. Its key expires, client 2 acquires, then client 1's `DEL` runs:
//! client 2's key is gone while client 2 holds. With `set-px-lua` the
//! release is one compare-and-delete script, held back the same way; run
//! late, it finds client 2's token and deletes nothing.

mod common;

use std::time::Duration;

use common::{docker_ready, report, Outcome};
use lockwright_chaos::{Cluster, DrivenMachine, History, NodeOptions, Op};
use lockwright_core::{Config, Event, ProtocolId};
use redis::AsyncCommands;

const TTL_MS: u64 = 500;

async fn paused_release(urls: &[String], protocol: ProtocolId) -> History {
    let config = Config {
        ttl_ms: TTL_MS,
        auto_renew: false,
        ..Config::new(format!("gap-{protocol}"))
    };
    let key = config.key();
    let history = History::new();
    let mut first = DrivenMachine::new(protocol, &config, "client-1", urls, 0).expect("machine");
    let mut second = DrivenMachine::new(protocol, &config, "client-2", urls, 0).expect("machine");

    let lease = first
        .try_acquire()
        .await
        .expect("acquire")
        .expect("granted");
    history.grant("client-1", None, first.instant_of(lease.valid_until));

    // Client 1 leaves its critical section and starts releasing.
    history.record("client-1", Op::Release);
    first.start_release().expect("release");
    let mut held_back = first.next_request().expect("the first release request");
    if protocol == ProtocolId::SetPxGetDel {
        // The GET runs and answers with client 1's own token...
        first.run_request(held_back).await;
        // ...and the compare passed: the DEL is next, and is held back.
        held_back = first.next_request().expect("the DEL");
    }

    // The pause: the key expires, client 2 acquires.
    tokio::time::sleep(Duration::from_millis(TTL_MS + 100)).await;
    let lease_2 = second
        .try_acquire()
        .await
        .expect("acquire")
        .expect("granted");
    history.grant("client-2", None, second.instant_of(lease_2.valid_until));

    // Client 1 resumes.
    first.run_request(held_back).await;
    let event = first.drive_to_event().await.expect("release outcome");
    eprintln!("{protocol}: client 1's late release reported {event:?}");

    let client = redis::Client::open(urls[0].as_str()).expect("url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let value: Option<String> = connection.get(&key).await.expect("GET");
    if second.lease().is_some() && value.as_deref() != Some("client-2") {
        history.record(
            "client-1",
            Op::RemovedHoldOf {
                victim: "client-2".into(),
            },
        );
        assert_eq!(
            event,
            Event::Released { was_held: true },
            "client 1 believes it removed its own hold"
        );
    }
    history.record("client-2", Op::Release);
    second.start_release().expect("release");
    let _ = second.drive_to_event().await;
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_then_del_deletes_the_successors_lock_and_the_script_does_not() {
    if !docker_ready() {
        return;
    }
    common::prefetch_model(&[("set-px-get-del", "pause"), ("set-px-lua", "pause")]);
    let cluster = Cluster::start(1, &NodeOptions::default())
        .await
        .expect("one master");
    let urls = cluster.urls();
    let get_del = paused_release(&urls, ProtocolId::SetPxGetDel).await;
    let lua = paused_release(&urls, ProtocolId::SetPxLua).await;
    report(
        "set_px_get_del",
        &[
            (
                Outcome::from_history(
                    "set_px_get_del/paused-release",
                    "set-px-get-del",
                    "pause",
                    "owner-only",
                    &get_del,
                    1,
                    "",
                ),
                "violated",
            ),
            (
                Outcome::from_history(
                    "set_px_get_del/paused-release",
                    "set-px-lua",
                    "pause",
                    "owner-only",
                    &lua,
                    1,
                    "the late compare-and-delete found client 2's token and deleted nothing",
                ),
                "holds",
            ),
        ],
    );
}
