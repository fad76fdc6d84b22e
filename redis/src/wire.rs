//! Core commands to Redis commands, Redis values to core replies.
//!
//! Public so that tests (the conformance suite) send exactly what the driver
//! sends and read replies exactly as the driver reads them.

use lockwright_core::keyspace::{Command, Reply, ScoreBound, Script, SetCondition, SetExpiry};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, Value};
use std::sync::OnceLock;

/// The Redis command for a core [`Command`]. [`Command::Transaction`] and
/// [`Command::Eval`] need more than one command: see [`execute`].
pub fn to_cmd(command: &Command) -> Cmd {
    match command {
        Command::Set {
            key,
            value,
            condition,
            expiry,
            get,
        } => {
            // Sized up front: the command of every acquire.
            let mut c = Cmd::with_capacity(7, 32 + key.len() + value.len());
            c.arg("SET");
            c.arg(key).arg(value);
            match condition {
                SetCondition::Always => {}
                SetCondition::Nx => {
                    c.arg("NX");
                }
                SetCondition::Xx => {
                    c.arg("XX");
                }
            }
            match expiry {
                SetExpiry::None => {}
                SetExpiry::Px(ms) => {
                    c.arg("PX").arg(ms);
                }
                SetExpiry::PxAt(ms) => {
                    c.arg("PXAT").arg(ms);
                }
            }
            if *get {
                c.arg("GET");
            }
            c
        }
        Command::SetNx { key, value } => cmd2("SETNX", key, value),
        Command::Get { key } => cmd1("GET", key),
        Command::GetSet { key, value } => cmd2("GETSET", key, value),
        Command::Del { keys } => cmd_n("DEL", keys),
        Command::Exists { keys } => cmd_n("EXISTS", keys),
        Command::Expire { key, seconds } => cmd2("EXPIRE", key, seconds),
        Command::PExpire { key, millis } => cmd2("PEXPIRE", key, millis),
        Command::Ttl { key } => cmd1("TTL", key),
        Command::PTtl { key } => cmd1("PTTL", key),
        Command::Incr { key } => cmd1("INCR", key),
        Command::HIncrBy { key, field, by } => {
            let mut c = cmd2("HINCRBY", key, field);
            c.arg(by);
            c
        }
        Command::HExists { key, field } => cmd2("HEXISTS", key, field),
        Command::HGet { key, field } => cmd2("HGET", key, field),
        Command::HDel { key, fields } => {
            let mut c = cmd1("HDEL", key);
            c.arg(fields);
            c
        }
        Command::SAdd { key, members } => {
            let mut c = cmd1("SADD", key);
            c.arg(members);
            c
        }
        Command::SRem { key, members } => {
            let mut c = cmd1("SREM", key);
            c.arg(members);
            c
        }
        Command::SCard { key } => cmd1("SCARD", key),
        Command::SIsMember { key, member } => cmd2("SISMEMBER", key, member),
        Command::ZAdd { key, members } => {
            let mut c = cmd1("ZADD", key);
            for (score, member) in members {
                c.arg(score).arg(member);
            }
            c
        }
        Command::ZRem { key, members } => {
            let mut c = cmd1("ZREM", key);
            c.arg(members);
            c
        }
        Command::ZRank { key, member } => cmd2("ZRANK", key, member),
        Command::ZScore { key, member } => cmd2("ZSCORE", key, member),
        Command::ZCard { key } => cmd1("ZCARD", key),
        Command::ZRemRangeByScore { key, min, max } => {
            let mut c = cmd1("ZREMRANGEBYSCORE", key);
            c.arg(score_bound(*min)).arg(score_bound(*max));
            c
        }
        Command::ZInterStore {
            dest,
            keys,
            weights,
        } => {
            let mut c = cmd1("ZINTERSTORE", dest);
            c.arg(keys.len()).arg(keys).arg("WEIGHTS").arg(weights);
            c
        }
        Command::Time => redis::cmd("TIME"),
        Command::Watch { keys } => cmd_n("WATCH", keys),
        Command::Unwatch => redis::cmd("UNWATCH"),
        Command::Multi => redis::cmd("MULTI"),
        Command::Exec => redis::cmd("EXEC"),
        Command::Discard => redis::cmd("DISCARD"),
        Command::Transaction(_) => {
            // Sent as a MULTI..EXEC pipeline by `execute`; on its own it is
            // just the EXEC that would close it.
            redis::cmd("EXEC")
        }
        Command::Wait {
            replicas,
            timeout_ms,
        } => cmd2("WAIT", replicas, timeout_ms),
        Command::Publish { channel, message } => cmd2("PUBLISH", channel, message),
        Command::Eval { script, keys, args } => eval_cmd("EVAL", script.lua(), keys, args),
    }
}

fn cmd1<A: redis::ToRedisArgs>(name: &str, a: A) -> Cmd {
    let mut c = redis::cmd(name);
    c.arg(a);
    c
}

fn cmd2<A: redis::ToRedisArgs, B: redis::ToRedisArgs>(name: &str, a: A, b: B) -> Cmd {
    let mut c = redis::cmd(name);
    c.arg(a).arg(b);
    c
}

fn cmd_n(name: &str, keys: &[String]) -> Cmd {
    let mut c = redis::cmd(name);
    c.arg(keys);
    c
}

fn eval_cmd(name: &str, script_or_sha: &str, keys: &[String], args: &[String]) -> Cmd {
    // Sized up front: the command is built for every release and extend.
    let data = name.len()
        + script_or_sha.len()
        + 4
        + keys.iter().chain(args).map(String::len).sum::<usize>();
    let mut c = Cmd::with_capacity(3 + keys.len() + args.len(), data);
    c.arg(name)
        .arg(script_or_sha)
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    c
}

fn score_bound(b: ScoreBound) -> String {
    match b {
        ScoreBound::NegInf => "-inf".to_owned(),
        ScoreBound::PosInf => "+inf".to_owned(),
        ScoreBound::Inclusive(n) => n.to_string(),
        ScoreBound::Exclusive(n) => format!("({n}"),
    }
}

/// The core reply for a Redis value: nil, status, integer, bulk (as UTF-8,
/// invalid bytes replaced), array, and server errors with Redis' full text.
pub fn to_reply(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(bytes) => Reply::Bulk(String::from_utf8_lossy(&bytes).into_owned()),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(to_reply).collect())
        }
        Value::SimpleString(s) => Reply::Status(s),
        Value::Okay => Reply::ok(),
        Value::Map(pairs) => Reply::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [to_reply(k), to_reply(v)])
                .collect(),
        ),
        Value::Double(d) => Reply::Bulk(d.to_string()),
        Value::Boolean(b) => Reply::Int(i64::from(b)),
        Value::VerbatimString { text, .. } => Reply::Bulk(text),
        Value::ServerError(e) => Reply::Error(match e.details() {
            Some(detail) => format!("{} {}", e.code(), detail),
            None => e.code().to_owned(),
        }),
        other => Reply::Error(format!("ERR unsupported reply shape: {other:?}")),
    }
}

/// The full error text when `e` is a server error reply; `None` when it is
/// a connection problem (I/O, timeout, refused), whose outcome is unknown.
pub fn server_error_text(e: &RedisError) -> Option<String> {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return None;
    }
    let code = e.code()?;
    Some(match e.detail() {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_owned(),
    })
}

fn is_noscript(result: &Result<Value, RedisError>) -> bool {
    match result {
        Ok(Value::ServerError(e)) => e.code() == "NOSCRIPT",
        Err(e) => e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript),
        Ok(_) => false,
    }
}

/// The SHA1 of each catalogue script's text, computed once.
fn script_sha(script: Script) -> &'static str {
    static SHAS: OnceLock<Vec<(Script, String)>> = OnceLock::new();
    let shas = SHAS.get_or_init(|| {
        Script::ALL
            .iter()
            .map(|&s| (s, redis::Script::new(s.lua()).get_hash().to_owned()))
            .collect()
    });
    shas.iter()
        .find(|(s, _)| *s == script)
        .map_or("", |(_, sha)| sha.as_str())
}

/// Run one core command on `conn` and return Redis' raw answer.
///
/// [`Command::Transaction`] runs as one `MULTI … EXEC` pipeline and answers
/// with `EXEC`'s reply (an array, or nil when a watched key changed).
/// [`Command::Eval`] runs as `EVALSHA`, falling back to `EVAL` with the
/// script's text when the server answers `NOSCRIPT` (after `SCRIPT FLUSH`,
/// a restart or a failover).
pub async fn execute<C: ConnectionLike + Send + ?Sized>(
    conn: &mut C,
    command: &Command,
) -> Result<Value, RedisError> {
    match command {
        Command::Transaction(commands) => {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for c in commands {
                pipe.add_command(to_cmd(c));
            }
            // Skip MULTI's OK and every QUEUED; read EXEC's reply only.
            let mut replies = conn
                .req_packed_commands(&pipe, commands.len() + 1, 1)
                .await?;
            Ok(replies.pop().unwrap_or(Value::Nil))
        }
        Command::Eval { script, keys, args } => {
            let lua = script.lua();
            let first = conn
                .req_packed_command(&eval_cmd("EVALSHA", script_sha(*script), keys, args))
                .await;
            if is_noscript(&first) {
                tracing::debug!(script = script.name(), "NOSCRIPT: sending the script text");
                conn.req_packed_command(&eval_cmd("EVAL", lua, keys, args))
                    .await
            } else {
                first
            }
        }
        other => conn.req_packed_command(&to_cmd(other)).await,
    }
}

/// [`execute`], with the answer turned into a core reply. `Err` carries a
/// connection problem (the outcome is unknown); server errors are replies.
pub async fn execute_reply<C: ConnectionLike + Send + ?Sized>(
    conn: &mut C,
    command: &Command,
) -> Result<Reply, RedisError> {
    match execute(conn, command).await {
        Ok(v) => Ok(to_reply(v)),
        Err(e) => match server_error_text(&e) {
            Some(text) => Ok(Reply::Error(text)),
            None => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_nx_px_is_packed_as_redis_expects() {
        let c = to_cmd(&Command::Set {
            key: "{a}".into(),
            value: "t".into(),
            condition: SetCondition::Nx,
            expiry: SetExpiry::Px(100),
            get: false,
        });
        let args: Vec<String> = c
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not a plain argument>".into(),
            })
            .collect();
        assert_eq!(args, ["SET", "{a}", "t", "NX", "PX", "100"]);
    }

    #[test]
    fn every_script_is_sent_by_the_sha1_of_its_text() {
        for script in Script::ALL {
            assert_eq!(
                script_sha(script),
                redis::Script::new(script.lua()).get_hash(),
                "{}",
                script.name()
            );
        }
    }

    #[test]
    fn values_map_to_replies() {
        assert_eq!(to_reply(Value::Nil), Reply::Nil);
        assert_eq!(to_reply(Value::Okay), Reply::ok());
        assert_eq!(to_reply(Value::Int(-2)), Reply::Int(-2));
        assert_eq!(
            to_reply(Value::Array(vec![
                Value::BulkString(b"x".to_vec()),
                Value::Nil
            ])),
            Reply::Array(vec![Reply::Bulk("x".into()), Reply::Nil])
        );
        assert_eq!(
            to_reply(Value::SimpleString("QUEUED".into())),
            Reply::Status("QUEUED".into())
        );
    }
}
