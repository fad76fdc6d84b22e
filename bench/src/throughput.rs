//! Section 1: uncontended lock+unlock cycles per second.
//!
//! Every task locks a name of its own (no contention: that is section 2),
//! acquires, releases, and counts the cycle. Three contenders per point:
//! the adapter's [`Lock`] (a one-permit [`Semaphore`] for the semaphore
//! protocols), rslock's `LockManager` (one manager shared by the
//! tasks, as its docs use it) and a raw redis-rs loop of `SET NX PX` then
//! `EVALSHA` compare-and-delete on one shared multiplexed connection per
//! master: the two round trips any correct lease lock needs. Every
//! contender's sockets set `TCP_NODELAY`, as the adapter's do; `raw-nagle`
//! is the raw loop on redis-rs' default socket (Nagle's algorithm on).

use crate::util::{self, BenchError, Result};
use futures_util::future::join_all;
use lockwright_core::{Kind, ProtocolId};
use lockwright_redis::{Lock, LockOptions, Nodes, Semaphore};
use lockwright_tests::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The lease of every contender.
pub(crate) const TTL: Duration = Duration::from_secs(10);

/// The compare-and-delete of the raw loop (the same text as rslock's).
const UNLOCK_SCRIPT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end"#;

/// One way of taking and giving back a lock.
pub(crate) enum Contender {
    /// The adapter: one [`Lock`] per task.
    Adapter(Vec<Lock>),
    /// The adapter's semaphore protocols: one one-permit [`Semaphore`] per
    /// task.
    AdapterSemaphore(Vec<Semaphore>),
    /// rslock: one manager, one resource name per task.
    Rslock {
        manager: rslock::LockManager,
        keys: Vec<String>,
    },
    /// SET NX PX + EVALSHA, in parallel on every master.
    Raw {
        conns: Vec<MultiplexedConnection>,
        sha: String,
        keys: Vec<String>,
    },
}

impl Contender {
    /// The adapter running `protocol` over `clients`, one lock per task,
    /// every lock on one [`Nodes`] (one connection per master, as rslock's
    /// manager and the raw loop have).
    pub(crate) fn adapter(
        protocol: ProtocolId,
        clients: &[redis::Client],
        tasks: usize,
    ) -> Result<Contender> {
        let nodes = Nodes::new(clients.to_vec());
        if protocol.kind() == Kind::Semaphore {
            let semaphores = (0..tasks)
                .map(|t| {
                    Semaphore::on(
                        &nodes,
                        format!("tp:{protocol}:{}:{t}", clients.len()),
                        LockOptions::new(protocol, TTL),
                    )
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            return Ok(Contender::AdapterSemaphore(semaphores));
        }
        let locks = (0..tasks)
            .map(|t| {
                Lock::on(
                    &nodes,
                    format!("tp:{protocol}:{}:{t}", clients.len()),
                    LockOptions::new(protocol, TTL),
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Contender::Adapter(locks))
    }

    /// rslock over `clients` (one manager for every task).
    pub(crate) fn rslock(clients: &[redis::Client], tasks: usize) -> Contender {
        Contender::Rslock {
            manager: rslock::LockManager::from_clients(clients.to_vec()),
            keys: (0..tasks)
                .map(|t| format!("rs:{}:{t}", clients.len()))
                .collect(),
        }
    }

    /// The contender `who` names (see [`WHO`]) on `servers`, with `tasks`
    /// tasks. The adapter always sets `TCP_NODELAY` on its connections;
    /// `raw` and `rslock` are given clients that set it too, so that the
    /// three send the same requests over sockets alike. `raw-nagle` is the
    /// raw loop on redis-rs' default socket, which leaves Nagle's algorithm
    /// on: it coalesces the small requests of many tasks into fewer
    /// segments while a reply is outstanding.
    pub(crate) async fn named(
        who: &str,
        protocol: Option<ProtocolId>,
        servers: &[RedisServer],
        tasks: usize,
    ) -> Result<Contender> {
        let clients = |nodelay: bool| -> Result<Vec<redis::Client>> {
            servers.iter().map(|s| socket(s, nodelay)).collect()
        };
        Ok(match (who, protocol) {
            (_, Some(p)) => {
                let plain: Vec<redis::Client> = servers.iter().map(RedisServer::client).collect();
                Contender::adapter(p, &plain, tasks)?
            }
            ("rslock", None) => Contender::rslock(&clients(true)?, tasks),
            ("raw", None) => Contender::raw(&clients(true)?, tasks).await?,
            ("raw-nagle", None) => Contender::raw(&clients(false)?, tasks).await?,
            _ => return Err(BenchError(format!("no contender named {who:?}"))),
        })
    }

    /// The raw loop over `clients`: loads the script on every master.
    pub(crate) async fn raw(clients: &[redis::Client], tasks: usize) -> Result<Contender> {
        let mut conns = Vec::new();
        let mut sha = String::new();
        for client in clients {
            let mut conn = client.get_multiplexed_async_connection().await?;
            sha = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(UNLOCK_SCRIPT)
                .query_async(&mut conn)
                .await?;
            conns.push(conn);
        }
        Ok(Contender::Raw {
            conns,
            sha,
            keys: (0..tasks)
                .map(|t| format!("raw:{}:{t}", clients.len()))
                .collect(),
        })
    }

    /// One lock+unlock cycle of task `task`; `false` when the lock was not
    /// held through the cycle (never expected: nobody else uses the name).
    async fn cycle(&self, task: usize, seq: u64) -> Result<bool> {
        match self {
            Contender::Adapter(locks) => {
                let lock = locks
                    .get(task)
                    .ok_or_else(|| BenchError("no lock for the task".into()))?;
                let guard = lock.acquire().await?;
                Ok(guard.release().await?)
            }
            Contender::AdapterSemaphore(semaphores) => {
                let semaphore = semaphores
                    .get(task)
                    .ok_or_else(|| BenchError("no semaphore for the task".into()))?;
                let permit = semaphore.acquire().await?;
                Ok(permit.release().await?)
            }
            Contender::Rslock { manager, keys } => {
                let key = keys
                    .get(task)
                    .ok_or_else(|| BenchError("no key for the task".into()))?;
                let lock = manager.lock(key.as_str(), TTL).await?;
                manager.unlock(&lock).await;
                Ok(true)
            }
            Contender::Raw { conns, sha, keys } => {
                let key = keys
                    .get(task)
                    .ok_or_else(|| BenchError("no key for the task".into()))?;
                let token = format!("{task}:{seq}");
                let ttl_ms = u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX);
                let granted = join_all(conns.iter().map(|c| {
                    let mut c = c.clone();
                    let (key, token) = (key.clone(), token.clone());
                    async move {
                        redis::cmd("SET")
                            .arg(key)
                            .arg(token)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl_ms)
                            .query_async::<Option<String>>(&mut c)
                            .await
                    }
                }))
                .await
                .into_iter()
                .filter(|r| matches!(r, Ok(Some(_))))
                .count();
                let released = join_all(conns.iter().map(|c| {
                    let mut c = c.clone();
                    let (key, token) = (key.clone(), token.clone());
                    async move {
                        redis::cmd("EVALSHA")
                            .arg(sha)
                            .arg(1)
                            .arg(key)
                            .arg(token)
                            .query_async::<i64>(&mut c)
                            .await
                    }
                }))
                .await;
                for r in released {
                    r?;
                }
                Ok(granted > conns.len() / 2)
            }
        }
    }
}

/// The contenders other than the adapter, by name.
pub(crate) const WHO: [&str; 3] = ["raw", "raw-nagle", "rslock"];

/// A client for `server` whose connections set `TCP_NODELAY` to `nodelay`
/// (redis-rs' default is off).
pub(crate) fn socket(server: &RedisServer, nodelay: bool) -> Result<redis::Client> {
    let info = server
        .client()
        .get_connection_info()
        .clone()
        .set_tcp_settings(TcpSettings::default().set_nodelay(nodelay));
    Ok(redis::Client::open(info)?)
}

/// One measured point.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    /// Cycles completed inside the window.
    pub(crate) cycles: u64,
    /// Cycles completed in all, warm-up and the tail after the window
    /// included (for per-cycle costs read off a profiler).
    pub(crate) cycles_run: u64,
    /// Cycles per second.
    pub(crate) per_sec: f64,
    /// Cycles in which the lock turned out not to be held (expected 0).
    pub(crate) anomalies: u64,
    /// Redis commands per cycle, summed over the masters.
    pub(crate) commands_per_cycle: f64,
    /// New client connections per cycle, summed over the masters.
    pub(crate) connections_per_cycle: f64,
    /// Commands per cycle by name.
    pub(crate) commands: BTreeMap<String, u64>,
    /// The bench process's CPU time (user + system) per cycle, in µs
    /// (`None` where `/proc/self/stat` cannot be read).
    pub(crate) client_cpu_us: Option<f64>,
    /// The system (kernel) part of `client_cpu_us` (`stime`), µs per cycle.
    pub(crate) client_sys_us: Option<f64>,
    /// Heap allocations (`alloc`, `alloc_zeroed` and `realloc` calls) the
    /// bench process made per cycle over the window, whichever thread made
    /// them (see the `allocs` module).
    pub(crate) allocs_per_cycle: f64,
    /// The masters' CPU time (`INFO cpu` user + system, summed) per cycle,
    /// in µs.
    pub(crate) server_cpu_us: f64,
    /// The CPUs busy on average over the window: (client + server CPU time)
    /// ÷ wall time.
    pub(crate) cpus_busy: f64,
    /// The share of the machine's CPU time that was busy over the window,
    /// whoever used it (`/proc/stat`), 0–1.
    pub(crate) machine_busy: Option<f64>,
}

/// `total_connections_received` of `INFO stats`.
async fn connections_received(conn: &mut MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

/// Run `tasks` tasks of `contender` for `warmup`, then count cycles (and the
/// commands, connections and CPU time the servers behind `admins` saw, and
/// this process's CPU time) for `window`.
pub(crate) async fn measure(
    admins: &mut [MultiplexedConnection],
    contender: Arc<Contender>,
    tasks: usize,
    warmup: Duration,
    window: Duration,
) -> Result<Point> {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let anomalies = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (contender, stop, cycles, anomalies) = (
            contender.clone(),
            stop.clone(),
            cycles.clone(),
            anomalies.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                if !contender.cycle(task, seq).await? {
                    anomalies.fetch_add(1, Ordering::Relaxed);
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }));
    }
    tokio::time::sleep(warmup).await;
    let ticks = util::clock_ticks();
    let mut conns0 = 0;
    let mut server0 = 0.0;
    for admin in admins.iter_mut() {
        util::reset_stats(admin).await?;
        conns0 += connections_received(admin).await?;
        server0 += util::server_cpu(admin).await?;
    }
    let client0 = util::process_cpu_split(ticks);
    let allocs0 = crate::allocs::total();
    let machine0 = util::machine_cpu();
    let (c0, a0, t0) = (
        cycles.load(Ordering::Relaxed),
        anomalies.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (c1, a1, elapsed) = (
        cycles.load(Ordering::Relaxed),
        anomalies.load(Ordering::Relaxed),
        t0.elapsed(),
    );
    let client1 = util::process_cpu_split(ticks);
    let allocs1 = crate::allocs::total();
    let machine1 = util::machine_cpu();
    let mut server1 = 0.0;
    for admin in admins.iter_mut() {
        server1 += util::server_cpu(admin).await?;
    }
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    let mut conns1 = 0;
    for admin in admins.iter_mut() {
        for (name, n) in util::command_counts(admin).await? {
            *commands.entry(name).or_default() += n;
        }
        conns1 += connections_received(admin).await?;
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await??;
    }
    let cycles_run = cycles.load(Ordering::Relaxed);
    let done = c1 - c0;
    let per = done.max(1) as f64;
    let (client, client_sys) = match (client0, client1) {
        (Some((u0, s0)), Some((u1, s1))) => {
            let system = s1.saturating_sub(s0).as_secs_f64();
            (
                Some(u1.saturating_sub(u0).as_secs_f64() + system),
                Some(system),
            )
        }
        _ => (None, None),
    };
    let server = (server1 - server0).max(0.0);
    Ok(Point {
        cycles: done,
        cycles_run,
        per_sec: done as f64 / elapsed.as_secs_f64(),
        anomalies: a1 - a0,
        commands_per_cycle: commands.values().sum::<u64>() as f64 / done.max(1) as f64,
        connections_per_cycle: conns1.saturating_sub(conns0) as f64 / done.max(1) as f64,
        commands,
        client_cpu_us: client.map(|c| c * 1e6 / per),
        client_sys_us: client_sys.map(|c| c * 1e6 / per),
        allocs_per_cycle: allocs1.saturating_sub(allocs0) as f64 / per,
        server_cpu_us: server * 1e6 / per,
        cpus_busy: (client.unwrap_or(0.0) + server) / elapsed.as_secs_f64(),
        machine_busy: match (machine0, machine1) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                Some(b1.saturating_sub(b0) as f64 / (t1 - t0) as f64)
            }
            _ => None,
        },
    })
}
