//! The catalogue's Lua scripts: their text (sent to real Redis) and their
//! meaning (executed atomically by the keyspace model). Each script's text
//! lives here once; the conformance tests check that both agree.
//!
//! Release scripts also `PUBLISH` on the channel `<lock key>:released`, so
//! that waiters can be woken without polling, when their last argument is
//! `1` (see [`Config::notify_releases`](crate::Config::notify_releases));
//! without it they are the classic scripts. The keyspace model treats
//! `PUBLISH` as a no-op that reaches no subscriber.
//!
//! The model of each script is the same sequence of `redis.call`s as its
//! Lua text, run on the keyspace's command layer: a `redis.call` error
//! aborts the script with that error reply and keeps the writes made before
//! it, as Redis does, and carries the location Redis 7 appends to it
//! (` script: <sha1>, on @user_script:<line>.`).

use super::semantics::{parse_i64, NOT_AN_INTEGER};
use super::{Command, Keyspace, Reply, ScoreBound, SetCondition, SetExpiry};

/// A script of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Script {
    /// `KEYS[1]` lock key, `ARGV[1]` token, optional `ARGV[2]` = `1` to
    /// publish a release notice. Deletes the key when it holds the token and
    /// returns 1, else returns 0. Called with the token alone it is the
    /// compare-and-delete of redis.io and most clients.
    CompareAndDelete,
    /// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` ttl ms. Sets the TTL when
    /// the key holds the token and returns 1, else returns 0.
    CompareAndPExpire,
    /// Redisson's reentrant lock. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner. When the key is missing or the owner already has a
    /// field, increments the owner's count, sets the TTL and returns nil;
    /// otherwise returns the key's PTTL.
    ReentrantLock,
    /// Redisson's reentrant unlock. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner, optional `ARGV[3]` = `1` to publish a release notice.
    /// Nil when the owner holds nothing; otherwise decrements the count: when
    /// still positive sets the TTL and returns 0, else deletes the key,
    /// publishes the notice if asked and returns 1.
    ReentrantUnlock,
    /// Redisson's watchdog renewal. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner. Sets the TTL and returns 1 when the owner has a field,
    /// else returns 0.
    ReentrantRenew,
    /// `KEYS[1]` lock key, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]`
    /// ttl ms. `SET NX PX`; on success `INCR`s the fence counter and returns
    /// the new fence, otherwise returns nil.
    FencedAcquire,
    /// `KEYS[1]` lock key, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]`
    /// ttl ms. As [`Script::FencedAcquire`], but the fence is
    /// `max(stored + 1, server TIME in µs)`: it reads `TIME`, `INCR`s the
    /// counter and, when the result is below the clock, stores the clock's
    /// reading instead. Returns the new fence, or nil when the key exists.
    TimeFencedAcquire,
    /// `KEYS[1]` permits zset (member = permit token, score = deadline on the
    /// server clock in ms), `KEYS[2]` fence counter, `KEYS[3]` limit key,
    /// `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` limit used when the limit
    /// key is missing (then stored). Reads the server `TIME`, drops expired
    /// permits (deadline < now), and when fewer than `limit` remain adds the
    /// token with deadline now + ttl, `INCR`s the fence and returns it;
    /// otherwise returns nil.
    LeaseAcquire,
    /// The keys and arguments of [`Script::LeaseAcquire`], and the same
    /// steps, but the fence is `max(stored + 1, server TIME in µs)`: after
    /// the `INCR`, when the result is below the clock's reading in
    /// microseconds (the same `TIME` call), it stores and returns the
    /// reading instead. Returns the new fence, or nil when the semaphore is
    /// full.
    TimeFencedLeaseAcquire,
    /// `KEYS[1]` permits zset, `ARGV[1]` token, optional `ARGV[2]` = `1` to
    /// publish a release notice. `ZREM`s the token, publishes the notice (if
    /// asked) when one was removed, returns the `ZREM` count.
    LeaseRelease,
    /// `KEYS[1]` permits zset, `ARGV[1]` token, `ARGV[2]` ttl ms. Reads the
    /// server `TIME`, drops expired permits; when the token is still present
    /// sets its deadline to now + ttl and returns 1, else returns 0.
    LeaseRenew,
}

impl Script {
    /// Every script, in a fixed order.
    pub const ALL: [Script; 11] = [
        Script::CompareAndDelete,
        Script::CompareAndPExpire,
        Script::ReentrantLock,
        Script::ReentrantUnlock,
        Script::ReentrantRenew,
        Script::FencedAcquire,
        Script::TimeFencedAcquire,
        Script::LeaseAcquire,
        Script::TimeFencedLeaseAcquire,
        Script::LeaseRelease,
        Script::LeaseRenew,
    ];

    /// A short stable name, used in traces.
    pub fn name(self) -> &'static str {
        match self {
            Script::CompareAndDelete => "compare-and-delete",
            Script::CompareAndPExpire => "compare-and-pexpire",
            Script::ReentrantLock => "reentrant-lock",
            Script::ReentrantUnlock => "reentrant-unlock",
            Script::ReentrantRenew => "reentrant-renew",
            Script::FencedAcquire => "fenced-acquire",
            Script::TimeFencedAcquire => "time-fenced-acquire",
            Script::LeaseAcquire => "lease-acquire",
            Script::TimeFencedLeaseAcquire => "time-fenced-lease-acquire",
            Script::LeaseRelease => "lease-release",
            Script::LeaseRenew => "lease-renew",
        }
    }

    /// The Lua source sent to Redis (valid Redis 7 Lua; the model's meaning
    /// of each script is [`Keyspace`]'s `EVAL`, written as the same sequence
    /// of `redis.call`s).
    pub fn lua(self) -> &'static str {
        match self {
            Script::CompareAndDelete => {
                r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  if ARGV[2] == '1' then
    redis.call('publish', KEYS[1] .. ':released', ARGV[1])
  end
  return 1
end
return 0"#
            }
            Script::CompareAndPExpire => {
                r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0"#
            }
            Script::ReentrantLock => {
                r#"if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])"#
            }
            Script::ReentrantUnlock => {
                r#"if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if counter > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 0
end
redis.call('del', KEYS[1])
if ARGV[3] == '1' then
  redis.call('publish', KEYS[1] .. ':released', ARGV[2])
end
return 1"#
            }
            Script::ReentrantRenew => {
                r#"if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0"#
            }
            Script::FencedAcquire => {
                r#"if redis.call('exists', KEYS[1]) == 1 then
  return nil
end
local fence = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return fence"#
            }
            Script::TimeFencedAcquire => {
                r#"if redis.call('exists', KEYS[1]) == 1 then
  return nil
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = redis.call('incr', KEYS[2])
if fence < now then
  fence = now
  redis.call('set', KEYS[2], string.format('%d', now))
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return fence"#
            }
            Script::LeaseAcquire => {
                r#"local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', '(' .. now)
local limit = redis.call('get', KEYS[3])
if not limit then
  limit = ARGV[3]
  redis.call('set', KEYS[3], limit)
end
if redis.call('zcard', KEYS[1]) < tonumber(limit) then
  local fence = redis.call('incr', KEYS[2])
  redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return fence
end
return nil"#
            }
            Script::TimeFencedLeaseAcquire => {
                r#"local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', '(' .. now)
local limit = redis.call('get', KEYS[3])
if not limit then
  limit = ARGV[3]
  redis.call('set', KEYS[3], limit)
end
if redis.call('zcard', KEYS[1]) < tonumber(limit) then
  local fence = redis.call('incr', KEYS[2])
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if fence < us then
    fence = us
    redis.call('set', KEYS[2], string.format('%d', us))
  end
  redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return fence
end
return nil"#
            }
            Script::LeaseRelease => {
                r#"local removed = redis.call('zrem', KEYS[1], ARGV[1])
if removed > 0 and ARGV[2] == '1' then
  redis.call('publish', KEYS[1] .. ':released', ARGV[1])
end
return removed"#
            }
            Script::LeaseRenew => {
                r#"local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', '(' .. now)
if redis.call('zscore', KEYS[1], ARGV[1]) then
  redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
return 0"#
            }
        }
    }
}

/// A release script's arguments: `args`, then `1` when the caller asks for a
/// release notice (see [`Config::notify_releases`](crate::Config::notify_releases)).
pub fn release_args(mut args: Vec<String>, notify: bool) -> Vec<String> {
    if notify {
        args.push("1".to_owned());
    }
    args
}

/// What a script run produces: the reply it returns, or (as `Err`) the
/// error reply that aborts it, as `redis.call` raises it. Writes made before
/// the error stay, as in Redis.
type Run = Result<Reply, Reply>;

/// Redis' text when a `redis.call` argument is nil (a missing `KEYS[i]` or
/// `ARGV[i]`).
const NIL_ARGUMENT: &str = "ERR Lua redis lib command arguments must be strings or integers";

/// One script execution: the keyspace, the time, `KEYS` and `ARGV`, and
/// the line of the script's source it is at.
struct Lua<'a> {
    keyspace: &'a mut Keyspace,
    now: u64,
    keys: &'a [String],
    args: &'a [String],
    script: Script,
    /// Where the script is: its `n`-th `redis.call` of a command, as
    /// (name, n). An error raised here is reported at that call's line
    /// ([`Lua::line`]), as Lua's `currentline`.
    site: (&'static str, usize),
}

impl Lua<'_> {
    /// Move to the script's `nth` (from 0) `redis.call('name'` in source
    /// order. Every error raised until the next move (a nil argument, a
    /// command's error reply, a Lua error on a nil number) is reported at
    /// that call's line, as Redis reports it. Nothing is looked up here:
    /// the line is found only when an error needs it.
    fn at(&mut self, name: &'static str, nth: usize) {
        self.site = (name, nth);
    }

    /// The source line (1-based) of the current site ([`Lua::at`]); 0 if
    /// the source has no such call, a bug of the model's meaning of the
    /// script that the tests comparing its errors with Redis' would show.
    fn line(&self) -> u32 {
        let (name, nth) = self.site;
        let line = call_line(self.script.lua(), name, nth);
        debug_assert!(
            line.is_some(),
            "{} has no redis.call('{name}') number {nth}",
            self.script.name()
        );
        line.unwrap_or(0)
    }

    /// `redis.call`: run a command, raise its error reply. It runs at the
    /// current site ([`Lua::at`]), which must call it.
    fn call(&mut self, command: Command) -> Run {
        match self.keyspace.apply(self.now, &command) {
            Reply::Error(e) => {
                #[cfg(debug_assertions)]
                if let Some(argv) = command.argv() {
                    // The site's line calls this command (it may call
                    // another first, as `reentrant-lock`'s line 1 does).
                    let name = argv[0].to_ascii_lowercase();
                    let text = (self.line() as usize)
                        .checked_sub(1)
                        .and_then(|i| self.script.lua().lines().nth(i));
                    debug_assert!(
                        text.is_some_and(|t| line_calls(t, &name)),
                        "{}: {name} raised on line {}, which does not call it",
                        self.script.name(),
                        self.line()
                    );
                }
                Err(Reply::Error(e))
            }
            reply => Ok(reply),
        }
    }

    /// `KEYS[i + 1]` handed to `redis.call`.
    fn key(&self, i: usize) -> Result<String, Reply> {
        self.keys
            .get(i)
            .cloned()
            .ok_or_else(|| Reply::Error(NIL_ARGUMENT.into()))
    }

    /// `ARGV[i + 1]` handed to `redis.call`.
    /// `ARGV[i + 1] == '1'` (a missing argument is nil, which is not `'1'`).
    fn flag(&self, i: usize) -> bool {
        self.args.get(i).is_some_and(|a| a == "1")
    }

    fn arg(&self, i: usize) -> Result<String, Reply> {
        self.args
            .get(i)
            .cloned()
            .ok_or_else(|| Reply::Error(NIL_ARGUMENT.into()))
    }

    /// `ARGV[i + 1]` handed to a command that parses it as an integer.
    fn int_arg(&self, i: usize) -> Result<i64, Reply> {
        parse_i64(&self.arg(i)?).ok_or_else(|| Reply::Error(NOT_AN_INTEGER.into()))
    }

    /// `redis.call('time')` as (seconds, microseconds).
    fn time(&mut self) -> Result<(i64, i64), Reply> {
        self.at("time", 0);
        let reply = self.call(Command::Time)?;
        let part = |i: usize| match &reply {
            Reply::Array(items) => items.get(i).and_then(Reply::as_str).and_then(parse_i64),
            _ => None,
        };
        part(0)
            .zip(part(1))
            .ok_or_else(|| Reply::Error("ERR user_script: unexpected TIME reply".into()))
    }

    /// `redis.call('time')` turned into microseconds, as
    /// `time-fenced-acquire` does: `t[1] * 1000000 + t[2]`.
    fn time_us(&mut self) -> Result<i64, Reply> {
        let (secs, micros) = self.time()?;
        Ok(secs.saturating_mul(1_000_000).saturating_add(micros))
    }
}

/// Lua's `tonumber` for the integers the scripts read; anything else
/// becomes nil, and using nil raises the Lua error `what` at the current
/// line ([`Lua::at`]).
///
/// Decimal integers only: Lua 5.1 also reads `1.5`, `1e3`, `0x10` and
/// integers beyond 64 bits as numbers, where this model raises the error
/// instead. The protocols send decimal integers, as do the conformance
/// sequences; a front end that sends other numbers is outside the model.
fn lua_number(lua: &Lua<'_>, value: Option<&str>, what: &str) -> Result<i64, Reply> {
    value
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| Reply::Error(format!("ERR user_script:{}: {what}", lua.line())))
}

/// The line (1-based) of `source`'s `nth` (from 0) line that holds a
/// `redis.call('name'`, if it has that many.
fn call_line(source: &str, name: &str, nth: usize) -> Option<u32> {
    source
        .lines()
        .enumerate()
        .filter(|(_, text)| line_calls(text, name))
        .nth(nth)
        .and_then(|(i, _)| u32::try_from(i + 1).ok())
}

/// `text` holds a `redis.call('name'` of exactly that command name
/// (`zrem` is not found in `redis.call('zremrangebyscore'`).
fn line_calls(text: &str, name: &str) -> bool {
    text.match_indices("redis.call('").any(|(at, open)| {
        text[at + open.len()..]
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('\''))
    })
}

const COMPARE_NIL: &str = "attempt to compare number with nil";
const ARITHMETIC_NIL: &str = "attempt to perform arithmetic on a nil value";

fn released(key: &str) -> String {
    format!("{key}:released")
}

fn is_one(reply: &Reply) -> bool {
    reply.as_int() == Some(1)
}

impl Keyspace {
    /// `EVAL` of a catalogue script: its meaning, atomically at `now`. An
    /// error raised inside it ends it (its earlier writes stay) with Redis
    /// 7's location suffix, ` script: <sha1>, on @user_script:<line>.`
    /// (Redis' `luaCallFunction`: the error handler records the line of
    /// the Lua code that raised it, or that made the `redis.call` which did).
    pub(super) fn run_script(
        &mut self,
        now: u64,
        script: Script,
        keys: &[String],
        args: &[String],
    ) -> Reply {
        let mut lua = Lua {
            keyspace: self,
            now,
            keys,
            args,
            script,
            site: ("", 0),
        };
        let run = match script {
            Script::CompareAndDelete => compare_and_delete(&mut lua),
            Script::CompareAndPExpire => compare_and_pexpire(&mut lua),
            Script::ReentrantLock => reentrant_lock(&mut lua),
            Script::ReentrantUnlock => reentrant_unlock(&mut lua),
            Script::ReentrantRenew => reentrant_renew(&mut lua),
            Script::FencedAcquire => fenced_acquire(&mut lua, FenceSource::Counter),
            Script::TimeFencedAcquire => fenced_acquire(&mut lua, FenceSource::CounterOrClock),
            Script::LeaseAcquire => lease_acquire(&mut lua, FenceSource::Counter),
            Script::TimeFencedLeaseAcquire => lease_acquire(&mut lua, FenceSource::CounterOrClock),
            Script::LeaseRelease => lease_release(&mut lua),
            Script::LeaseRenew => lease_renew(&mut lua),
        };
        run.unwrap_or_else(|error| match error {
            Reply::Error(text) => Reply::Error(format!(
                "{text} script: {}, on @user_script:{}.",
                script.sha1(),
                lua.line()
            )),
            other => other,
        })
    }
}

/// `redis.call('get', KEYS[1]) == ARGV[1]` (a nil `ARGV[1]` equals nothing).
fn holds_token(lua: &mut Lua<'_>) -> Result<bool, Reply> {
    lua.at("get", 0);
    let key = lua.key(0)?;
    let current = lua.call(Command::Get { key })?;
    Ok(matches!((&current, lua.args.first()), (Reply::Bulk(v), Some(token)) if v == token))
}

fn compare_and_delete(lua: &mut Lua<'_>) -> Run {
    if !holds_token(lua)? {
        return Ok(Reply::Int(0));
    }
    lua.at("del", 0);
    let key = lua.key(0)?;
    lua.call(Command::Del {
        keys: vec![key.clone()],
    })?;
    if lua.flag(1) {
        lua.at("publish", 0);
        let message = lua.arg(0)?;
        lua.call(Command::Publish {
            channel: released(&key),
            message,
        })?;
    }
    Ok(Reply::Int(1))
}

fn compare_and_pexpire(lua: &mut Lua<'_>) -> Run {
    if !holds_token(lua)? {
        return Ok(Reply::Int(0));
    }
    lua.at("pexpire", 0);
    let key = lua.key(0)?;
    let millis = lua.int_arg(1)?;
    lua.call(Command::PExpire { key, millis })
}

fn reentrant_lock(lua: &mut Lua<'_>) -> Run {
    lua.at("exists", 0);
    let key = lua.key(0)?;
    let free = lua.call(Command::Exists {
        keys: vec![key.clone()],
    })? == Reply::Int(0);
    // `or` short-circuits: with the key free, `ARGV[2]` first reaches a
    // `redis.call` on line 2 (a nil one is raised there).
    let grant = free || {
        let owner = lua.arg(1)?;
        is_one(&lua.call(Command::HExists {
            key: key.clone(),
            field: owner,
        })?)
    };
    if !grant {
        lua.at("pttl", 0);
        return lua.call(Command::PTtl { key });
    }
    lua.at("hincrby", 0);
    let owner = lua.arg(1)?;
    lua.call(Command::HIncrBy {
        key: key.clone(),
        field: owner,
        by: 1,
    })?;
    lua.at("pexpire", 0);
    let millis = lua.int_arg(0)?;
    lua.call(Command::PExpire { key, millis })?;
    Ok(Reply::Nil)
}

fn reentrant_unlock(lua: &mut Lua<'_>) -> Run {
    lua.at("hexists", 0);
    let key = lua.key(0)?;
    let owner = lua.arg(1)?;
    let held = lua.call(Command::HExists {
        key: key.clone(),
        field: owner.clone(),
    })?;
    if held == Reply::Int(0) {
        return Ok(Reply::Nil);
    }
    lua.at("hincrby", 0);
    let counter = lua.call(Command::HIncrBy {
        key: key.clone(),
        field: owner.clone(),
        by: -1,
    })?;
    if counter.as_int().is_some_and(|n| n > 0) {
        lua.at("pexpire", 0);
        let millis = lua.int_arg(0)?;
        lua.call(Command::PExpire { key, millis })?;
        return Ok(Reply::Int(0));
    }
    lua.at("del", 0);
    lua.call(Command::Del {
        keys: vec![key.clone()],
    })?;
    if lua.flag(2) {
        lua.at("publish", 0);
        lua.call(Command::Publish {
            channel: released(&key),
            message: owner,
        })?;
    }
    Ok(Reply::Int(1))
}

fn reentrant_renew(lua: &mut Lua<'_>) -> Run {
    lua.at("hexists", 0);
    let key = lua.key(0)?;
    let owner = lua.arg(1)?;
    let held = lua.call(Command::HExists {
        key: key.clone(),
        field: owner,
    })?;
    if !is_one(&held) {
        return Ok(Reply::Int(0));
    }
    lua.at("pexpire", 0);
    let millis = lua.int_arg(0)?;
    lua.call(Command::PExpire { key, millis })?;
    Ok(Reply::Int(1))
}

/// Where a fence-issuing grant takes its fence from.
#[derive(Clone, Copy)]
enum FenceSource {
    /// `INCR` of the stored counter (`fenced-acquire`).
    Counter,
    /// `max(INCR of the stored counter, TIME in µs)`, the larger one stored
    /// (`time-fenced-acquire`, `time-fenced-lease-acquire`).
    CounterOrClock,
}

fn fenced_acquire(lua: &mut Lua<'_>, source: FenceSource) -> Run {
    // The fence is issued before the key is set, so that a fence that
    // cannot be issued (a non-number at the fence key) leaves no lock key
    // behind: a script's error does not undo its earlier writes.
    lua.at("exists", 0);
    let key = lua.key(0)?;
    if lua.call(Command::Exists {
        keys: vec![key.clone()],
    })? == Reply::Int(1)
    {
        return Ok(Reply::Nil);
    }
    let clock = match source {
        FenceSource::Counter => None,
        FenceSource::CounterOrClock => Some(lua.time_us()?),
    };
    let fence = issue_fence(lua, clock)?;
    // The lock key's SET: the last `set` of the script (the time-fenced
    // one stores a clock fence with an earlier one).
    let sets = match source {
        FenceSource::Counter => 0,
        FenceSource::CounterOrClock => 1,
    };
    lua.at("set", sets);
    let value = lua.arg(0)?;
    // SET parses PX as an integer; a non-positive one is refused by SET
    // itself with "invalid expire time".
    let ms = lua.int_arg(1)?;
    lua.call(Command::Set {
        key,
        value,
        condition: SetCondition::Always,
        expiry: SetExpiry::Px(u64::try_from(ms).unwrap_or(0)),
        get: false,
    })?;
    Ok(fence)
}

/// `INCR` of the fence counter at `KEYS[2]`; with a clock reading in µs,
/// a result below it is replaced by the reading, stored at the counter.
fn issue_fence(lua: &mut Lua<'_>, clock_us: Option<i64>) -> Run {
    lua.at("incr", 0);
    let fence_key = lua.key(1)?;
    let fence = lua.call(Command::Incr {
        key: fence_key.clone(),
    })?;
    match (clock_us, fence.as_int()) {
        (Some(now), Some(counted)) if counted < now => {
            // The fence's SET: the first `set` of `time-fenced-acquire`,
            // the second of `time-fenced-lease-acquire` (after the limit's).
            let earlier = usize::from(lua.script == Script::TimeFencedLeaseAcquire);
            lua.at("set", earlier);
            lua.call(Command::Set {
                key: fence_key,
                value: now.to_string(),
                condition: SetCondition::Always,
                expiry: SetExpiry::None,
                get: false,
            })?;
            Ok(Reply::Int(now))
        }
        _ => Ok(fence),
    }
}

/// The lease scripts' first step: read the server clock and drop the
/// permits whose deadline is before it. Returns the clock as milliseconds
/// (`t[1] * 1000 + floor(t[2] / 1000)`) and as microseconds
/// (`t[1] * 1000000 + t[2]`).
fn drop_expired_permits(lua: &mut Lua<'_>) -> Result<(i64, i64), Reply> {
    let (secs, micros) = lua.time()?;
    let now = secs.saturating_mul(1000).saturating_add(micros / 1000);
    let now_us = secs.saturating_mul(1_000_000).saturating_add(micros);
    lua.at("zremrangebyscore", 0);
    let key = lua.key(0)?;
    lua.call(Command::ZRemRangeByScore {
        key,
        min: ScoreBound::NegInf,
        max: ScoreBound::Exclusive(now),
    })?;
    Ok((now, now_us))
}

fn lease_acquire(lua: &mut Lua<'_>, source: FenceSource) -> Run {
    let (now, now_us) = drop_expired_permits(lua)?;
    lua.at("get", 0);
    let limit_key = lua.key(2)?;
    let limit = match lua.call(Command::Get {
        key: limit_key.clone(),
    })? {
        Reply::Bulk(limit) => limit,
        _ => {
            lua.at("set", 0);
            let limit = lua.arg(2)?;
            lua.call(Command::Set {
                key: limit_key,
                value: limit.clone(),
                condition: SetCondition::Always,
                expiry: SetExpiry::None,
                get: false,
            })?;
            limit
        }
    };
    lua.at("zcard", 0);
    let permits = lua.key(0)?;
    let held = lua.call(Command::ZCard {
        key: permits.clone(),
    })?;
    let limit = lua_number(lua, Some(&limit), COMPARE_NIL)?;
    if held.as_int().is_none_or(|held| held >= limit) {
        return Ok(Reply::Nil);
    }
    // The fence first, as in fenced-acquire: no permit without a fence.
    let clock = match source {
        FenceSource::Counter => None,
        FenceSource::CounterOrClock => Some(now_us),
    };
    let fence = issue_fence(lua, clock)?;
    lua.at("zadd", 0);
    let ttl = lua_number(lua, lua.args.get(1).map(String::as_str), ARITHMETIC_NIL)?;
    let token = lua.arg(0)?;
    lua.call(Command::ZAdd {
        key: permits,
        members: vec![(now.saturating_add(ttl), token)],
    })?;
    Ok(fence)
}

fn lease_release(lua: &mut Lua<'_>) -> Run {
    lua.at("zrem", 0);
    let key = lua.key(0)?;
    let token = lua.arg(0)?;
    let removed = lua.call(Command::ZRem {
        key: key.clone(),
        members: vec![token.clone()],
    })?;
    if removed.as_int().is_some_and(|n| n > 0) && lua.flag(1) {
        lua.at("publish", 0);
        lua.call(Command::Publish {
            channel: released(&key),
            message: token,
        })?;
    }
    Ok(removed)
}

fn lease_renew(lua: &mut Lua<'_>) -> Run {
    let (now, _) = drop_expired_permits(lua)?;
    lua.at("zscore", 0);
    let key = lua.key(0)?;
    let token = lua.arg(0)?;
    let score = lua.call(Command::ZScore {
        key: key.clone(),
        member: token.clone(),
    })?;
    if score == Reply::Nil {
        return Ok(Reply::Int(0));
    }
    lua.at("zadd", 0);
    let ttl = lua_number(lua, lua.args.get(1).map(String::as_str), ARITHMETIC_NIL)?;
    lua.call(Command::ZAdd {
        key,
        members: vec![(now.saturating_add(ttl), token)],
    })?;
    Ok(Reply::Int(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_line_counts_whole_command_names_in_source_order() {
        let source = Script::TimeFencedLeaseAcquire.lua();
        assert_eq!(call_line(source, "time", 0), Some(1));
        // `zremrangebyscore` does not count as `zrem`.
        assert_eq!(call_line(source, "zrem", 0), None);
        assert_eq!(call_line(source, "zremrangebyscore", 0), Some(3));
        assert_eq!(call_line(source, "set", 0), Some(7));
        assert_eq!(call_line(source, "set", 1), Some(14));
        assert_eq!(call_line(source, "set", 2), None);
        // Two calls on one line count as that line once per name.
        let lock = Script::ReentrantLock.lua();
        assert_eq!(call_line(lock, "exists", 0), Some(1));
        assert_eq!(call_line(lock, "hexists", 0), Some(1));
        assert_eq!(call_line(lock, "pttl", 0), Some(6));
    }
}
