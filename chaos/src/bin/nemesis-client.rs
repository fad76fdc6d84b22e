//! One nemesis client: loops acquire → read → (work, for the protocols that
//! renew) → modify → write → release on
//! the real adapter (`lockwright-redis`) against the nodes it is given, and
//! appends a JSON line per operation to `--out`. Runs in a container of its
//! own (see `lockwright_chaos::nemesis::run`); `--mutation` builds in one
//! deliberate bug.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use lockwright_chaos::nemesis::record::{
    high_key, log_key, marks_key, OpKind, OpRecord, Outcome, RESOURCE_SCRIPT,
};
use lockwright_chaos::nemesis::run::{LOCK_NAME, SENTINEL_GROUP};
use lockwright_chaos::nemesis::{relay, Mutation, Rng, UnknownName};
use lockwright_core::catalogue::Kind;
use lockwright_redis::redis::aio::MultiplexedConnection;
use lockwright_redis::redis::{self, AsyncConnectionConfig};
use lockwright_redis::{Error, Lock, LockGuard, LockOptions, Nodes, ProtocolId, Semaphore};

/// A nemesis client.
#[derive(Debug, Parser)]
struct Args {
    /// This client's number.
    #[arg(long)]
    id: u32,
    /// The catalogue protocol.
    #[arg(long)]
    protocol: String,
    /// The nodes' URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<String>,
    /// The protected resource's URL.
    #[arg(long)]
    resource: String,
    /// The lock's name.
    #[arg(long, default_value = LOCK_NAME)]
    lock: String,
    /// The lease's TTL in milliseconds.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// Permits of a semaphore.
    #[arg(long, default_value_t = 1)]
    limit: u32,
    /// How long to loop, in milliseconds.
    #[arg(long)]
    duration_ms: u64,
    /// A deliberate bug: none, overstate, plain-del, no-fence, ignore-lost.
    #[arg(long, default_value = "none")]
    mutation: String,
    /// Where to append the history (JSON lines).
    #[arg(long)]
    out: PathBuf,
    /// Seed of this client's choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A file whose appearance starts the run: the client waits (up to a
    /// minute) until the file exists before its first acquire and before
    /// it starts counting `--duration-ms`, so that
    /// clients started one after another run over the same interval. A
    /// file, not a start time, because a client's clock may be skewed.
    #[arg(long)]
    start_file: Option<PathBuf>,
    /// Sentinel URLs, comma-separated: when given, the master is the one
    /// they name for the group `nemesis` (the first `--nodes` URL is only
    /// the template of the master's connection settings).
    #[arg(long, default_value = "")]
    sentinels: String,
}

#[derive(Debug, thiserror::Error)]
enum ClientError {
    #[error(transparent)]
    Name(#[from] UnknownName),
    #[error("unknown protocol {0}")]
    Protocol(String),
    #[error("usage: {0}")]
    Usage(&'static str),
    #[error("the start file {0} did not appear within a minute")]
    NoStart(PathBuf),
    #[error("adapter: {0}")]
    Adapter(#[from] Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("history file: {0}")]
    Io(#[from] std::io::Error),
    #[error("history record: {0}")]
    Json(#[from] serde_json::Error),
}

/// The real time in µs, for the history. Read through rustix, which asks
/// the kernel (its vDSO) without libc's `clock_gettime`: a client whose
/// clock is skewed with libfaketime (an `LD_PRELOAD` of libc's functions)
/// records real times, while the adapter it runs (tokio's `Instant`,
/// `SystemTime`) reads the skewed clock. The clock file (see
/// [`ClockProbe`]) lets the nemesis check both.
fn now_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1000
}

/// One reading of the three clocks a client has: the real time (see
/// [`now_us`]), the wall clock its libc gives (`SystemTime`, skewed under
/// libfaketime) and the monotonic clock the adapter's timers run on
/// (`Instant`, as µs since the first probe). The two others are read
/// between two readings of the real time; `real_us` is their midpoint and
/// `width_us` their distance, the reading's uncertainty.
#[derive(Debug)]
struct ClockProbe {
    real_us: u64,
    wall_us: u64,
    monotonic_us: u64,
    width_us: u64,
}

impl ClockProbe {
    /// The narrowest of up to 100 readings, the first under 200 µs.
    fn take(origin: Instant) -> ClockProbe {
        let read = || {
            let before = now_us();
            let wall_us = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0);
            let monotonic_us = origin.elapsed().as_micros() as u64;
            let after = now_us();
            ClockProbe {
                real_us: before + after.saturating_sub(before) / 2,
                wall_us,
                monotonic_us,
                width_us: after.saturating_sub(before),
            }
        };
        let mut best = read();
        for _ in 0..100 {
            if best.width_us < 200 {
                break;
            }
            let next = read();
            if next.width_us < best.width_us {
                best = next;
            }
        }
        best
    }

    /// `real wall monotonic width`, one line.
    fn line(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.real_us, self.wall_us, self.monotonic_us, self.width_us
        )
    }
}

enum Handle {
    Lock(Lock),
    Semaphore(Semaphore),
}

impl Handle {
    async fn acquire(&self, timeout: Duration) -> Result<LockGuard, Error> {
        match self {
            Handle::Lock(lock) => lock.acquire_timeout(timeout).await,
            Handle::Semaphore(semaphore) => semaphore.acquire_timeout(timeout).await,
        }
    }
}

/// How an adapter error leaves the operation.
fn classify(error: &Error) -> Outcome {
    match error {
        Error::Timeout | Error::Lost => Outcome::Fail,
        _ => Outcome::Indeterminate,
    }
}

struct Client {
    args: Args,
    mutation: Mutation,
    out: std::io::LineWriter<std::fs::File>,
    resource: redis::Client,
    connection: Option<MultiplexedConnection>,
    script: redis::Script,
    rng: Rng,
    ttl: Duration,
}

impl Client {
    fn record(
        &mut self,
        seq: u64,
        op: OpKind,
        invoke_us: u64,
        outcome: Outcome,
        fence: Option<u64>,
        detail: String,
    ) -> Result<(), ClientError> {
        let record = OpRecord {
            client: self.args.id,
            seq,
            op,
            invoke_us,
            complete_us: now_us(),
            outcome,
            fence,
            detail,
        };
        serde_json::to_writer(&mut self.out, &record)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    /// One access to the resource: accepted, refused, or unknown.
    async fn access(&mut self, seq: u64, op: &str, fence: Option<u64>) -> (Outcome, String) {
        if self.connection.is_none() {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(Duration::from_millis(500)));
            match self
                .resource
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(connection) => self.connection = Some(connection),
                // Not connected: nothing was sent.
                Err(e) => return (Outcome::Fail, format!("connect: {e}")),
            }
        }
        let Some(connection) = self.connection.as_mut() else {
            return (Outcome::Fail, "no connection".to_owned());
        };
        let reply: Result<i64, _> = self
            .script
            .key(log_key(&self.args.lock))
            .key(high_key(&self.args.lock))
            .arg(self.args.id)
            .arg(seq)
            .arg(op)
            .arg(fence.map(|f| f.to_string()).unwrap_or_default())
            .invoke_async(connection)
            .await;
        match reply {
            Ok(1) => (Outcome::Ok, String::new()),
            Ok(_) => (Outcome::Fail, "refused".to_owned()),
            Err(e) => {
                self.connection = None;
                (Outcome::Indeterminate, e.to_string())
            }
        }
    }

    /// Tells the nemesis (on the resource's marks list) that iteration
    /// `seq` begins its last step. Best effort: a mark lost is a fault not
    /// aimed, nothing more.
    async fn mark(&mut self, seq: u64) {
        if let Some(connection) = self.connection.as_mut() {
            let pushed: Result<i64, _> = redis::cmd("RPUSH")
                .arg(marks_key(&self.args.lock))
                .arg(format!("{}|{seq}", self.args.id))
                .query_async(connection)
                .await;
            if pushed.is_err() {
                self.connection = None;
            }
        }
    }

    async fn release(
        &mut self,
        seq: u64,
        guard: LockGuard,
        handle: &Handle,
    ) -> Result<(), ClientError> {
        let invoke = now_us();
        let fence = guard.fence().map(|f| f.0);
        let (outcome, detail) = match (self.mutation, handle) {
            (Mutation::PlainDel, Handle::Lock(lock)) => {
                let key = lock.key();
                let mut outcome = Outcome::Ok;
                let mut detail = String::new();
                for url in &self.args.nodes {
                    let result: Result<i64, redis::RedisError> = async {
                        let config = AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(Duration::from_millis(250)))
                            .set_response_timeout(Some(Duration::from_millis(250)));
                        let mut c = redis::Client::open(url.as_str())?
                            .get_multiplexed_async_connection_with_config(&config)
                            .await?;
                        redis::cmd("DEL").arg(&key).query_async(&mut c).await
                    }
                    .await;
                    if let Err(e) = result {
                        outcome = Outcome::Indeterminate;
                        detail = e.to_string();
                    }
                }
                // The guard's own release runs in the background on drop.
                drop(guard);
                (outcome, format!("plain DEL {detail}"))
            }
            _ => match guard.release().await {
                Ok(true) => (Outcome::Ok, String::new()),
                Ok(false) => (Outcome::Fail, "already gone".to_owned()),
                Err(e) => (classify(&e), e.to_string()),
            },
        };
        self.record(seq, OpKind::Release, invoke, outcome, fence, detail)
    }
}

async fn run(args: Args) -> Result<(), ClientError> {
    let mutation = Mutation::from_str(&args.mutation)?;
    let protocol = ProtocolId::from_str(&args.protocol)
        .map_err(|_| ClientError::Protocol(args.protocol.clone()))?;
    let ttl = Duration::from_millis(args.ttl_ms.max(20));
    let mut options = LockOptions::new(protocol, ttl);
    options.request_timeout = (ttl / 4).min(Duration::from_millis(250));
    options.retry_base = Duration::from_millis(5);
    options.retry_max = Duration::from_millis(40);
    options.limit = args.limit;
    // The no-fence client holds its lock without renewal, so that its
    // section is the read and the uninterruptible modify step alone: a
    // pause aimed at its read then lands where only the fence can refuse
    // its late write (with renewal, the pause lands in the work, and
    // `lost()` ends the section before it writes).
    if mutation == Mutation::NoFence {
        options.auto_renew = false;
    }
    let clients = args
        .nodes
        .iter()
        .map(|url| redis::Client::open(url.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let semaphore = protocol.kind() == Kind::Semaphore;
    let sentinels = args
        .sentinels
        .split(',')
        .filter(|url| !url.is_empty())
        .map(redis::Client::open)
        .collect::<Result<Vec<_>, _>>()?;
    let nodes = if sentinels.is_empty() {
        Nodes::with_connect_timeout(clients, options.request_timeout)
    } else {
        let template = clients.into_iter().next().ok_or(ClientError::Usage(
            "--sentinels needs a --nodes URL as the template",
        ))?;
        Nodes::sentinel(sentinels, SENTINEL_GROUP, template, options.request_timeout)?
    };
    let handle = if semaphore {
        Handle::Semaphore(Semaphore::on(&nodes, &args.lock, options.clone())?)
    } else {
        let mut options = options.clone();
        options.limit = 1;
        Handle::Lock(Lock::on(&nodes, &args.lock, options)?)
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)?;
    let mut client = Client {
        resource: redis::Client::open(args.resource.as_str())?,
        rng: Rng::new(args.seed ^ u64::from(args.id).wrapping_mul(0x9E37_79B9)),
        mutation,
        out: std::io::LineWriter::new(file),
        connection: None,
        script: redis::Script::new(RESOURCE_SCRIPT),
        ttl,
        args,
    };
    if let Some(start) = &client.args.start_file {
        let waited = Instant::now();
        while !start.exists() {
            if waited.elapsed() > Duration::from_secs(60) {
                return Err(ClientError::NoStart(start.clone()));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // The clock file: a probe at the start and one at the end, from which
    // the nemesis reads each client's skew and rate.
    let origin = Instant::now();
    let clock_path = client.args.out.with_extension("clock");
    std::fs::write(&clock_path, ClockProbe::take(origin).line())?;
    let deadline = origin + Duration::from_millis(client.args.duration_ms);
    let ttl_ms = client.ttl.as_millis() as u64;
    let mut seq = 0;
    while Instant::now() < deadline {
        seq += 1;
        let invoke = now_us();
        let guard = match handle.acquire(client.ttl * 2).await {
            Ok(guard) => guard,
            Err(e) => {
                client.record(
                    seq,
                    OpKind::Acquire,
                    invoke,
                    classify(&e),
                    None,
                    e.to_string(),
                )?;
                let pause = client.rng.range(0, 20);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        };
        let fence = guard.fence().map(|f| f.0);
        client.record(
            seq,
            OpKind::Acquire,
            invoke,
            Outcome::Ok,
            fence,
            String::new(),
        )?;
        let sent_fence = if mutation == Mutation::NoFence {
            None
        } else {
            fence
        };
        let mut abandoned: Option<String> = None;
        // The section begins with the read of the resource.
        let at = now_us();
        let (outcome, detail) = client.access(seq, "read", sent_fence).await;
        client.record(seq, OpKind::Read, at, outcome, sent_fence, detail)?;
        if outcome != Outcome::Ok {
            abandoned = Some("read not accepted".to_owned());
        }
        // Protocols that renew do long work, watching lost().
        if abandoned.is_none() && options.auto_renew {
            let work = Duration::from_millis(client.rng.range(ttl_ms / 2, ttl_ms * 3 / 2));
            if mutation == Mutation::IgnoreLost {
                tokio::time::sleep(work).await;
            } else {
                tokio::select! {
                    biased;
                    () = guard.lost() => abandoned = Some("lost() fired during the work".to_owned()),
                    () = tokio::time::sleep(work) => {}
                }
            }
        }
        // The modify step and the write run to their end once begun: they
        // start only with the modify step and a quarter of the TTL left.
        let modify = Duration::from_millis(client.rng.range(ttl_ms / 5, ttl_ms * 2 / 5));
        let checks = !matches!(mutation, Mutation::Overstate | Mutation::IgnoreLost);
        if abandoned.is_none() && checks && guard.remaining() < modify + client.ttl / 4 {
            abandoned = Some(format!("{:?} left, too short", guard.remaining()));
        }
        if abandoned.is_none() {
            client.mark(seq).await;
            if mutation == Mutation::Overstate {
                let until = guard.valid_until() + client.ttl / 5;
                tokio::time::sleep_until(until.into()).await;
            } else {
                tokio::time::sleep(modify).await;
            }
            let at = now_us();
            let (outcome, detail) = client.access(seq, "write", sent_fence).await;
            client.record(seq, OpKind::Write, at, outcome, sent_fence, detail)?;
        }
        if let Some(reason) = abandoned {
            client.record(seq, OpKind::Abandon, now_us(), Outcome::Ok, fence, reason)?;
        }
        client.release(seq, guard, &handle).await?;
    }
    // Over a run of seconds, a rate of 0.99 shows as tens of milliseconds.
    let mut file = std::fs::OpenOptions::new().append(true).open(&clock_path)?;
    file.write_all(ClockProbe::take(origin).line().as_bytes())?;
    Ok(())
}

/// `nemesis-client supervise PROGRAM ARGS...`: the entry point of a node
/// container. Runs PROGRAM (redis-server) as its child; on SIGUSR1 kills it
/// with SIGKILL (a real kill -9 of the real process, nothing simulated) and
/// on SIGUSR2 starts it again, so that a node comes back in milliseconds
/// where a restart of its container takes hundreds. SIGTERM kills the child
/// and exits; a child that dies by itself ends the supervisor with it.
/// `SUPERVISE_LD_PRELOAD`, when set, is the child's `LD_PRELOAD`.
async fn supervise(program: String, argv: Vec<String>) -> Result<(), SuperviseError> {
    use tokio::signal::unix::{signal, SignalKind};
    // `SUPERVISE_LD_PRELOAD` becomes the child's `LD_PRELOAD` (libfaketime
    // for redis-server, not for the supervisor).
    let preload = std::env::var_os("SUPERVISE_LD_PRELOAD");
    let start = || {
        let mut command = tokio::process::Command::new(&program);
        command.args(&argv).kill_on_drop(true);
        if let Some(preload) = &preload {
            command.env("LD_PRELOAD", preload);
        }
        command.spawn()
    };
    async fn exited(
        child: &mut Option<tokio::process::Child>,
    ) -> std::io::Result<std::process::ExitStatus> {
        match child {
            Some(child) => child.wait().await,
            None => std::future::pending().await,
        }
    }
    let mut kill = signal(SignalKind::user_defined1())?;
    let mut restart = signal(SignalKind::user_defined2())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut child = Some(start()?);
    loop {
        tokio::select! {
            // A kill is handled before a restart that is already pending.
            biased;
            _ = kill.recv() => {
                if let Some(mut running) = child.take() {
                    running.kill().await?;
                    eprintln!("supervise: {program} killed with SIGKILL");
                }
            }
            _ = restart.recv() => {
                if child.is_none() {
                    child = Some(start()?);
                    eprintln!("supervise: {program} started again");
                }
            }
            _ = term.recv() => {
                if let Some(mut running) = child.take() {
                    running.kill().await?;
                }
                return Ok(());
            }
            status = exited(&mut child) => {
                return Err(format!("{program} exited by itself: {}", status?).into());
            }
        }
    }
}

/// `nemesis-client relay --control ADDR LISTEN=TARGET...`: the delaying
/// relay of `delay` runs (see `lockwright_chaos::nemesis::relay`).
fn relay_args(args: Vec<String>) -> Result<(Vec<relay::Route>, std::net::SocketAddr), String> {
    let mut control = None;
    let mut routes = Vec::new();
    let mut words = args.into_iter();
    while let Some(word) = words.next() {
        if word == "--control" {
            let addr = words.next().ok_or("--control needs an address")?;
            control = Some(addr.parse().map_err(|e| format!("--control {addr}: {e}"))?);
        } else {
            routes.push(word.parse::<relay::Route>().map_err(|e| e.to_string())?);
        }
    }
    match (control, routes.is_empty()) {
        (Some(control), false) => Ok((routes, control)),
        (None, _) => Err("--control ADDR is required".to_owned()),
        (_, true) => Err("at least one route LISTEN=TARGET is required".to_owned()),
    }
}

/// The supervisor's error.
type SuperviseError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("nemesis-client: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut raw = std::env::args().skip(1);
    let first = raw.next();
    if first.as_deref() == Some("relay") {
        return match relay_args(raw.collect()) {
            Ok((routes, control)) => match runtime.block_on(relay::serve(routes, control)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("nemesis-client relay: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("nemesis-client relay: {e}\nusage: nemesis-client relay --control ADDR LISTEN=TARGET...");
                ExitCode::FAILURE
            }
        };
    }
    if first.as_deref() == Some("supervise") {
        let Some(program) = raw.next() else {
            eprintln!("nemesis-client supervise: PROGRAM ARGS... expected");
            return ExitCode::FAILURE;
        };
        return match runtime.block_on(supervise(program, raw.collect())) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nemesis-client supervise: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nemesis-client: {e}");
            ExitCode::FAILURE
        }
    }
}
