//! Section 3: the "Redis in Action" marketplace (chapters 4.4 and 6.2).
//!
//! Sellers put a fresh item in their inventory and list it (move it to the
//! `market:` ZSET as `item.seller`); buyers pick a random listed item and buy
//! it (move the price between the users' funds, the item to the buyer's
//! inventory). Three variants, as in the book: (a) optimistic WATCH/MULTI
//! with retries (the book's `list_item`/`purchase_item`), (b) one lock on the
//! whole market, (c) one lock per item (the book's fine-grained locking).
//! The locked variants run the same commands inside the lock with MULTI/EXEC
//! but without WATCH; every lock of a run (the per-item ones are made per
//! operation) is on one shared [`Nodes`], so they share one connection.

use crate::util::{BenchError, Result};
use lockwright_redis::{Lock, LockOptions, Nodes};
use redis::aio::MultiplexedConnection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MARKET: &str = "market:";
const PRICE: i64 = 10;

/// How the marketplace guards its operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// WATCH/MULTI/EXEC, retried on conflict.
    Watch,
    /// One lock named `market:`.
    MarketLock,
    /// One lock per item, `market:<item>.<seller>`.
    ItemLock,
}

impl Variant {
    /// The three variants, in the book's order.
    pub(crate) const ALL: [Variant; 3] = [Variant::Watch, Variant::MarketLock, Variant::ItemLock];

    /// For the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Variant::Watch => "WATCH/MULTI",
            Variant::MarketLock => "market lock",
            Variant::ItemLock => "per-item locks",
        }
    }
}

/// What one run counted.
#[derive(Clone, Debug, Default)]
pub(crate) struct Market {
    /// Items listed.
    pub(crate) listed: u64,
    /// Items bought.
    pub(crate) bought: u64,
    /// WATCH conflicts retried by purchases.
    pub(crate) purchase_retries: u64,
    /// WATCH conflicts retried by listings.
    pub(crate) list_retries: u64,
    /// Purchases that found the item sold already.
    pub(crate) missed: u64,
    /// Listing latencies.
    pub(crate) list_latency: Vec<Duration>,
    /// Latencies of the purchases that bought.
    pub(crate) buy_latency: Vec<Duration>,
}

struct Ctx {
    client: redis::Client,
    variant: Variant,
    options: LockOptions,
    /// The connection every lock of the run shares.
    nodes: Nodes,
    market_lock: Lock,
    stop: AtomicBool,
    tally: Mutex<Market>,
}

impl Ctx {
    fn lock_for(&self, member: &str) -> Result<Lock> {
        match self.variant {
            Variant::ItemLock => Ok(Lock::on(
                &self.nodes,
                format!("market:{member}"),
                self.options.clone(),
            )?),
            _ => Ok(self.market_lock.clone()),
        }
    }

    fn add(&self, f: impl FnOnce(&mut Market)) {
        if let Ok(mut t) = self.tally.lock() {
            f(&mut t);
        }
    }
}

/// Run `listers` sellers and `buyers` buyers for `window` with `variant`
/// on the (otherwise idle) server behind `client`.
pub(crate) async fn run(
    client: &redis::Client,
    variant: Variant,
    listers: usize,
    buyers: usize,
    window: Duration,
    options: LockOptions,
) -> Result<Market> {
    let mut admin = client.get_multiplexed_async_connection().await?;
    redis::cmd("FLUSHALL").query_async::<()>(&mut admin).await?;
    for b in 0..buyers {
        redis::cmd("HSET")
            .arg(format!("users:b{b}"))
            .arg("funds")
            .arg(1_000_000_000_000i64)
            .query_async::<()>(&mut admin)
            .await?;
    }
    let nodes = Nodes::new([client.clone()]);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        variant,
        market_lock: Lock::on(&nodes, "market:", options.clone())?,
        nodes,
        options,
        stop: AtomicBool::new(false),
        tally: Mutex::new(Market::default()),
    });
    let mut handles = Vec::new();
    for s in 0..listers {
        let ctx = ctx.clone();
        handles.push(tokio::spawn(async move { seller(&ctx, s).await }));
    }
    for b in 0..buyers {
        let ctx = ctx.clone();
        handles.push(tokio::spawn(async move { buyer(&ctx, b).await }));
    }
    tokio::time::sleep(window).await;
    ctx.stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await??;
    }
    let tally = ctx
        .tally
        .lock()
        .map_err(|_| BenchError("a market task panicked".into()))?
        .clone();
    Ok(tally)
}

async fn seller(ctx: &Ctx, s: usize) -> Result<()> {
    let mut conn = ctx.client.get_multiplexed_async_connection().await?;
    let seller = format!("s{s}");
    let inventory = format!("inventory:{seller}");
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        n += 1;
        let item = format!("i{s}_{n}");
        redis::cmd("SADD")
            .arg(&inventory)
            .arg(&item)
            .query_async::<()>(&mut conn)
            .await?;
        let started = Instant::now();
        let (listed, retries) = match ctx.variant {
            Variant::Watch => list_watch(&mut conn, &seller, &item, &ctx.stop).await?,
            _ => {
                let lock = ctx.lock_for(&format!("{item}.{seller}"))?;
                let guard = lock.acquire().await?;
                let listed = list_unguarded(&mut conn, &seller, &item).await?;
                guard.release().await?;
                (listed, 0)
            }
        };
        let took = started.elapsed();
        ctx.add(|t| {
            t.list_retries += retries;
            if listed {
                t.listed += 1;
                t.list_latency.push(took);
            }
        });
    }
    Ok(())
}

/// The book's `list_item`: WATCH the inventory, check, MULTI, move, EXEC.
async fn list_watch(
    conn: &mut MultiplexedConnection,
    seller: &str,
    item: &str,
    stop: &AtomicBool,
) -> Result<(bool, u64)> {
    let inventory = format!("inventory:{seller}");
    let mut retries = 0;
    while !stop.load(Ordering::Relaxed) {
        redis::cmd("WATCH")
            .arg(&inventory)
            .query_async::<()>(conn)
            .await?;
        let present: bool = redis::cmd("SISMEMBER")
            .arg(&inventory)
            .arg(item)
            .query_async(conn)
            .await?;
        if !present {
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            return Ok((false, retries));
        }
        let done: Option<(i64, i64)> = redis::pipe()
            .atomic()
            .zadd(MARKET, format!("{item}.{seller}"), PRICE)
            .srem(&inventory, item)
            .query_async(conn)
            .await?;
        if done.is_some() {
            return Ok((true, retries));
        }
        retries += 1;
    }
    Ok((false, retries))
}

/// Listing inside a lock: check, then MULTI, move, EXEC (no WATCH).
async fn list_unguarded(
    conn: &mut MultiplexedConnection,
    seller: &str,
    item: &str,
) -> Result<bool> {
    let inventory = format!("inventory:{seller}");
    let present: bool = redis::cmd("SISMEMBER")
        .arg(&inventory)
        .arg(item)
        .query_async(conn)
        .await?;
    if !present {
        return Ok(false);
    }
    redis::pipe()
        .atomic()
        .zadd(MARKET, format!("{item}.{seller}"), PRICE)
        .srem(&inventory, item)
        .query_async::<()>(conn)
        .await?;
    Ok(true)
}

/// How a purchase ended.
enum Bought {
    Yes,
    /// Sold to someone else first.
    Gone,
    /// The window closed during WATCH retries.
    Abandoned,
}

async fn buyer(ctx: &Ctx, b: usize) -> Result<()> {
    let mut conn = ctx.client.get_multiplexed_async_connection().await?;
    let buyer = format!("b{b}");
    while !ctx.stop.load(Ordering::Relaxed) {
        let pick: Option<String> = redis::cmd("ZRANDMEMBER")
            .arg(MARKET)
            .query_async(&mut conn)
            .await?;
        let Some(member) = pick else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let started = Instant::now();
        let (outcome, retries) = match ctx.variant {
            Variant::Watch => purchase_watch(&mut conn, &buyer, &member, &ctx.stop).await?,
            _ => {
                let lock = ctx.lock_for(&member)?;
                let guard = lock.acquire().await?;
                let outcome = purchase_unguarded(&mut conn, &buyer, &member).await?;
                guard.release().await?;
                (outcome, 0)
            }
        };
        let took = started.elapsed();
        ctx.add(|t| {
            t.purchase_retries += retries;
            match outcome {
                Bought::Yes => {
                    t.bought += 1;
                    t.buy_latency.push(took);
                }
                Bought::Gone => t.missed += 1,
                Bought::Abandoned => {}
            }
        });
    }
    Ok(())
}

fn seller_of(member: &str) -> Result<(&str, &str)> {
    member
        .rsplit_once('.')
        .ok_or_else(|| BenchError(format!("market member without a seller: {member}")))
}

/// The book's `purchase_item`: WATCH the market and the buyer, check price
/// and funds, MULTI, move money and item, EXEC; retry on conflict.
async fn purchase_watch(
    conn: &mut MultiplexedConnection,
    buyer: &str,
    member: &str,
    stop: &AtomicBool,
) -> Result<(Bought, u64)> {
    let buyer_key = format!("users:{buyer}");
    let mut retries = 0;
    while !stop.load(Ordering::Relaxed) {
        redis::cmd("WATCH")
            .arg(MARKET)
            .arg(&buyer_key)
            .query_async::<()>(conn)
            .await?;
        let (price, funds): (Option<f64>, Option<f64>) = redis::pipe()
            .zscore(MARKET, member)
            .hget(&buyer_key, "funds")
            .query_async(conn)
            .await?;
        let affordable = matches!((price, funds), (Some(p), Some(f)) if p <= f);
        if !affordable {
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            return Ok((Bought::Gone, retries));
        }
        let done: Option<redis::Value> = transfer(member, buyer)?.query_async(conn).await?;
        if done.is_some() {
            return Ok((Bought::Yes, retries));
        }
        retries += 1;
    }
    Ok((Bought::Abandoned, retries))
}

/// The purchase inside a lock: the same checks and MULTI/EXEC, no WATCH.
async fn purchase_unguarded(
    conn: &mut MultiplexedConnection,
    buyer: &str,
    member: &str,
) -> Result<Bought> {
    let buyer_key = format!("users:{buyer}");
    let (price, funds): (Option<f64>, Option<f64>) = redis::pipe()
        .zscore(MARKET, member)
        .hget(&buyer_key, "funds")
        .query_async(conn)
        .await?;
    if !matches!((price, funds), (Some(p), Some(f)) if p <= f) {
        return Ok(Bought::Gone);
    }
    transfer(member, buyer)?.query_async::<()>(conn).await?;
    Ok(Bought::Yes)
}

/// MULTI: pay the seller, charge the buyer, move the item, delist it; EXEC.
fn transfer(member: &str, buyer: &str) -> Result<redis::Pipeline> {
    let (item, seller) = seller_of(member)?;
    let mut pipe = redis::pipe();
    pipe.atomic()
        .hincr(format!("users:{seller}"), "funds", PRICE)
        .hincr(format!("users:{buyer}"), "funds", -PRICE)
        .sadd(format!("inventory:{buyer}"), item)
        .zrem(MARKET, member);
    Ok(pipe)
}
