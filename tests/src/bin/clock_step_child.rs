//! The child process of `tests/clock_step.rs`: it runs under libfaketime,
//! whose wall clock the test steps back while the child runs, and reports
//! the leases both front ends grant it against its monotonic and wall
//! clocks.
//!
//! Usage: `clock_step_child <redis-url> <host:port>`. Each `take` line on
//! stdin acquires a `set-px-lua` lock through the async adapter
//! (`lockwright-redis`) and one through the blocking front end
//! (`lockwright-blocking`), and one through [`wall_clock_lease`], a
//! minimal front end of the core's machine that reads the wall clock at
//! every step (the kind the model's `client-step` column is about, kept
//! here as the mutant the test must catch); prints one line
//! `lease async_ms=.. blocking_ms=.. wall_lease_ms=.. mono_ms=.. wall_ms=..`
//! and releases all three: the async lease's `valid_until()` and the
//! monotonic clock in ms since the child started, the blocking lease's
//! `valid_until` in that front end's own milliseconds, the wall-clock
//! front end's in the wall clock's, the wall clock in ms since the epoch.
//! `quit` ends it.

use lockwright_core::{
    Acquire, Config, Event, Machine, Millis, Outcome, Protocol, ProtocolId, Token,
};
use lockwright_redis::{redis, wire, Lock, LockOptions};
use std::io::BufRead;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(addr)) = (args.next(), args.next()) else {
        return Err("usage: clock_step_child <redis-url> <host:port>".into());
    };
    let start = Instant::now();
    let ttl = Duration::from_secs(10);
    let lock = Lock::new(
        [redis::Client::open(url.as_str())?],
        "clock-step-async",
        LockOptions::new(ProtocolId::SetPxLua, ttl),
    )?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let blocking = lockwright_blocking::Lock::new(
        ProtocolId::SetPxLua,
        Config {
            ttl_ms: 10_000,
            ..Config::new("clock-step-blocking")
        },
        vec![addr],
        Duration::from_secs(1),
    )?;
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "take" => {
                let guard = lock.acquire().await?;
                let async_ms = guard.valid_until().duration_since(start).as_millis();
                let held = blocking
                    .try_acquire()?
                    .ok_or("the blocking lock is taken")?;
                let blocking_ms = held.lease().valid_until.0;
                let wall_lease_ms = wall_clock_lease(&mut conn).await?;
                let mono_ms = start.elapsed().as_millis();
                let wall_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
                println!(
                    "lease async_ms={async_ms} blocking_ms={blocking_ms} \
                     wall_lease_ms={wall_lease_ms} mono_ms={mono_ms} wall_ms={wall_ms}"
                );
                guard.release().await?;
                held.release()?;
            }
            "quit" => break,
            other => return Err(format!("unknown command {other:?}").into()),
        }
    }
    Ok(())
}

/// The wall clock, ms since the epoch.
fn wall() -> Millis {
    Millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0)),
    )
}

/// Takes and releases a `set-px-lua` lock with the core's machine, read
/// the wall clock at every step: the lease's `valid_until`.
async fn wall_clock_lease(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<u64, Box<dyn std::error::Error>> {
    let config = Config {
        ttl_ms: 10_000,
        ..Config::new("clock-step-wall")
    };
    let mut machine = Machine::new(ProtocolId::SetPxLua, &config, Token::new("wall"))?;
    machine.acquire(wall(), Acquire::Once)?;
    let valid_until = match drive(&mut machine, conn).await? {
        Event::Acquired(lease) => lease.valid_until.0,
        other => return Err(format!("the wall-clock lock: {other:?}").into()),
    };
    machine.release(wall())?;
    match drive(&mut machine, conn).await? {
        Event::Released { .. } => Ok(valid_until),
        other => Err(format!("the wall-clock release: {other:?}").into()),
    }
}

/// Sends the machine's requests and feeds it the replies until it reports
/// an event.
async fn drive(
    machine: &mut Machine,
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<Event, Box<dyn std::error::Error>> {
    loop {
        if let Some(event) = machine.poll_event() {
            return Ok(event);
        }
        let request = machine
            .poll_transmit()
            .ok_or("the machine waits with nothing to send")?;
        let reply = wire::execute_reply(conn, &request.command).await?;
        machine.handle_reply(wall(), request.id, Outcome::Reply(reply));
    }
}
