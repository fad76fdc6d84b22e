//! Core commands to Redis commands, Redis values to core replies.
//!
//! Public so that tests (the conformance suite) send exactly what the driver
//! sends and read replies exactly as the driver reads them.

use lockwright_core::keyspace::{Arg, Command, Reply};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, Value};
use std::future::Future;

/// The Redis commands written for a core [`Command`], in order: its
/// argument vectors ([`Command::for_each_vector`]), so `MULTI`, the inner
/// commands and `EXEC` for a [`Command::Transaction`], `EVALSHA` for a
/// script. The command's reply is the reply to the last one. Each argument
/// is copied once, straight from the command into the `Cmd`.
pub fn to_cmds(command: &Command) -> Vec<Cmd> {
    let mut cmds = Vec::with_capacity(1);
    command.for_each_vector(|argv| cmds.push(cmd_of(argv)));
    cmds
}

/// The one `Cmd` of a command that is a single vector (every command but a
/// transaction), without the vector of `Cmd`s that [`to_cmds`] builds.
fn single_cmd(command: &Command) -> Cmd {
    let mut cmd = Cmd::new();
    command.for_each_vector(|argv| cmd = cmd_of(argv));
    cmd
}

fn cmd_of(argv: &[Arg<'_>]) -> Cmd {
    let data = argv
        .iter()
        .map(|a| match a {
            Arg::Str(s) => s.len(),
            _ => 20,
        })
        .sum::<usize>();
    let mut c = Cmd::with_capacity(argv.len(), data);
    for arg in argv {
        arg.with_bytes(|b| {
            c.arg(b);
        });
    }
    c
}

fn from_argv(argv: &[String]) -> Cmd {
    let data = argv.iter().map(String::len).sum::<usize>();
    let mut c = Cmd::with_capacity(argv.len(), data);
    for arg in argv {
        c.arg(arg.as_str());
    }
    c
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
        Value::SimpleString(s) => Reply::Status(s.into()),
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

/// Run one core command on `conn` and return Redis' raw answer.
///
/// The command's argument vectors ([`Command::frames`]) are written as one
/// pipeline and only the last reply is read back: a
/// [`Command::Transaction`] is `MULTI … EXEC` and answers with `EXEC`'s
/// reply (an array, or nil when a watched key changed). [`Command::Eval`]
/// runs as `EVALSHA`, falling back to `EVAL` with the script's text when
/// the server answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a
/// failover).
pub async fn execute<C: ConnectionLike + Send>(
    conn: &mut C,
    command: &Command,
) -> Result<Value, RedisError> {
    execute_on(&mut Boxed(conn), command).await
}

/// A connection that runs packed commands: any redis-rs connection through
/// its [`ConnectionLike`] methods ([`Boxed`]), or one that runs a single
/// command without the boxed future those make (the driver's connections,
/// one allocation less per request).
pub(crate) trait Sends: Send {
    /// The connection as redis-rs sees it.
    fn like(&mut self) -> &mut (dyn ConnectionLike + Send);

    /// Run `cmd` and return its reply (by default through
    /// [`ConnectionLike::req_packed_command`]).
    fn send_one<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.like().req_packed_command(cmd)
    }
}

/// A redis-rs connection, run through [`ConnectionLike`].
pub(crate) struct Boxed<'c, C>(pub(crate) &'c mut C);

impl<C: ConnectionLike + Send> Sends for Boxed<'_, C> {
    fn like(&mut self) -> &mut (dyn ConnectionLike + Send) {
        self.0
    }
}

/// [`execute`] on any [`Sends`].
pub(crate) async fn execute_on<S: Sends + ?Sized>(
    conn: &mut S,
    command: &Command,
) -> Result<Value, RedisError> {
    let first = match command {
        Command::Transaction(_) => send(conn, &to_cmds(command)).await,
        single => conn.send_one(&single_cmd(single)).await,
    };
    // The script's text only when the server asked for it (building the
    // `EVAL` vector copies the whole script).
    if !is_noscript(&first) {
        return first;
    }
    match (command, command.eval_text_argv()) {
        (Command::Eval { script, .. }, Some(text)) => {
            tracing::debug!(script = script.name(), "NOSCRIPT: sending the script text");
            conn.send_one(&from_argv(&text)).await
        }
        _ => first,
    }
}

/// Write `cmds` together and return the reply to the last one.
async fn send<S: Sends + ?Sized>(conn: &mut S, cmds: &[Cmd]) -> Result<Value, RedisError> {
    match cmds {
        [single] => conn.send_one(single).await,
        // `MULTI` … `EXEC`: an atomic pipeline writes exactly these frames,
        // and a cluster connection routes it to one node as a whole.
        [_multi, inner @ .., _exec] => {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for c in inner {
                pipe.add_command(c.clone());
            }
            // Skip MULTI's OK and every QUEUED; read EXEC's reply only.
            let mut replies = conn
                .like()
                .req_packed_commands(&pipe, inner.len() + 1, 1)
                .await?;
            Ok(replies.pop().unwrap_or(Value::Nil))
        }
        [] => Ok(Value::Nil),
    }
}

/// [`execute`], with the answer turned into a core reply. `Err` carries a
/// connection problem (the outcome is unknown); server errors are replies.
pub async fn execute_reply<C: ConnectionLike + Send>(
    conn: &mut C,
    command: &Command,
) -> Result<Reply, RedisError> {
    execute_reply_on(&mut Boxed(conn), command).await
}

/// [`execute_reply`] on any [`Sends`].
pub(crate) async fn execute_reply_on<S: Sends + ?Sized>(
    conn: &mut S,
    command: &Command,
) -> Result<Reply, RedisError> {
    match execute_on(conn, command).await {
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
    use lockwright_core::keyspace::{Script, SetCondition, SetExpiry};

    #[test]
    fn set_nx_px_is_packed_as_redis_expects() {
        let [c] = &to_cmds(&Command::Set {
            key: "{a}".into(),
            value: "t".into(),
            condition: SetCondition::Nx,
            expiry: SetExpiry::Px(100),
            get: false,
        })[..] else {
            panic!("one command");
        };
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
    fn a_transaction_is_sent_as_multi_its_commands_exec() {
        let cmds = to_cmds(&Command::Transaction(vec![Command::Incr {
            key: "n".into(),
        }]));
        let names: Vec<String> = cmds
            .iter()
            .map(|c| match c.args_iter().next() {
                Some(redis::Arg::Simple(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(names, ["MULTI", "INCR", "EXEC"]);
    }

    #[test]
    fn every_script_is_sent_by_the_sha1_of_its_text() {
        for script in Script::ALL {
            assert_eq!(
                script.sha1(),
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
