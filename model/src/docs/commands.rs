//! What each machine sends, recorded by driving two clients against the
//! keyspace model through a fixed scenario, and commands and replies as
//! `redis-cli` shows them (see the [parent module](super)).

use super::*;
use std::collections::BTreeSet;

// ---------------------------------------------------------------------------
// Recorded commands

/// What a protocol sent in the recorded scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// One line per command or event.
    pub lines: Vec<String>,
    /// Every script it ran.
    pub scripts: BTreeSet<Script>,
}

/// Drive two clients of `id` against keyspace nodes through a fixed scenario
/// and record every command, reply and event.
pub fn record_commands(id: ProtocolId) -> Result<Transcript, DocsError> {
    let cfg = ModelConfig::new(id, Fault::None);
    let mut nodes: Vec<Keyspace> = (0..cfg.nodes).map(|_| Keyspace::new()).collect();
    let mut t = Transcript::default();
    let config_of = |c: u8| cfg.core_config(c);
    if id == ProtocolId::WatchSemaphore {
        let config = config_of(0);
        let set_max = Command::Set {
            key: config.key_with("max"),
            value: config.limit.to_string(),
            condition: SetCondition::Always,
            expiry: SetExpiry::None,
            get: false,
        };
        for (n, node) in nodes.iter_mut().enumerate() {
            let reply = node.execute(ConnId(u32::MAX), Millis(0), &set_max);
            t.lines.push(format!(
                "     admin → n{n}: {}  ⇒ {}",
                redis_cli(&set_max),
                reply_cli(&reply)
            ));
        }
    }
    let mut machines = Vec::new();
    for c in 0..2u8 {
        let m = Machine::new(id, &config_of(c), Token::new(format!("c{c}"))).map_err(|source| {
            DocsError::Config {
                protocol: id,
                source,
            }
        })?;
        machines.push(m);
    }
    let steps: [(u8, u64, &'static str); 6] = [
        (0, 0, "acquire"),
        (1, 1_000, "acquire"),
        (0, 2_000, "extend"),
        (0, 3_000, "release"),
        (1, 4_000, "acquire"),
        (1, 5_000, "release"),
    ];
    for (c, at, call) in steps {
        let now = Millis(at);
        let Some(m) = machines.get_mut(usize::from(c)) else {
            continue;
        };
        let result = match call {
            "acquire" => m.acquire(now, Acquire::Once),
            "extend" => m.extend(now),
            _ => m.release(now),
        };
        t.lines.push(format!("{at:>5} c{c} {call}"));
        if let Err(source) = result {
            // Recorded, not fatal: the page shows what the machine said.
            t.lines.push(format!("      c{c} refused: {source}"));
            continue;
        }
        drive(&mut t, &mut nodes, m, c, now)?;
    }
    Ok(t)
}

fn drive(
    t: &mut Transcript,
    nodes: &mut [Keyspace],
    m: &mut Machine,
    c: u8,
    now: Millis,
) -> Result<(), DocsError> {
    for _ in 0..1_000 {
        let mut busy = false;
        while let Some(req) = m.poll_transmit() {
            busy = true;
            let n = usize::from(req.node.0);
            let node = nodes
                .get_mut(n)
                .ok_or_else(|| DocsError::Inconsistent(format!("request to unknown node n{n}")))?;
            let reply = node.execute(ConnId(u32::from(c)), now, &req.command);
            collect_scripts(&req.command, &mut t.scripts);
            t.lines.push(format!(
                "      c{c} → n{n}: {}  ⇒ {}",
                redis_cli(&req.command),
                reply_cli(&reply)
            ));
            m.handle_reply(now, req.id, Outcome::Reply(reply));
        }
        while let Some(e) = m.poll_event() {
            busy = true;
            t.lines
                .push(format!("      c{c} event: {}", event_text(&e)));
        }
        if !busy {
            return Ok(());
        }
    }
    Err(DocsError::Inconsistent(
        "the machine never stopped sending".into(),
    ))
}

fn collect_scripts(c: &Command, out: &mut BTreeSet<Script>) {
    match c {
        Command::Eval { script, .. } => {
            out.insert(*script);
        }
        Command::Transaction(cmds) => cmds.iter().for_each(|c| collect_scripts(c, out)),
        _ => {}
    }
}

fn lease_text(l: &Lease) -> String {
    match l.fence {
        Some(f) => format!("valid until {} (fence {})", l.valid_until.get(), f.0),
        None if l.valid_until.get() == u64::MAX => "valid until forever (no TTL)".into(),
        None => format!("valid until {}", l.valid_until.get()),
    }
}

fn event_text(e: &Event) -> String {
    match e {
        Event::Acquired(l) => format!("Acquired, {}", lease_text(l)),
        Event::Denied => "Denied".into(),
        Event::Released { was_held } => format!("Released {{ was_held: {was_held} }}"),
        Event::Extended { lease: l, .. } => format!("Extended, {}", lease_text(l)),
        Event::NotExtended { .. } => "NotExtended".into(),
        Event::Lost => "Lost".into(),
        Event::Failed(err) => format!("Failed: {err}"),
        Event::RenewalFailed(err) => format!("RenewalFailed: {err}"),
    }
}

fn bound(b: &ScoreBound) -> String {
    match b {
        ScoreBound::NegInf => "-inf".into(),
        ScoreBound::PosInf => "+inf".into(),
        ScoreBound::Inclusive(v) => v.to_string(),
        ScoreBound::Exclusive(v) => format!("({v}"),
    }
}

/// A command as `redis-cli` would show it (a script by its name).
pub fn redis_cli(c: &Command) -> String {
    match c {
        Command::HIncrBy { key, field, by } => format!("HINCRBY {key} {field} {by}"),
        Command::HExists { key, field } => format!("HEXISTS {key} {field}"),
        Command::HGet { key, field } => format!("HGET {key} {field}"),
        Command::HDel { key, fields } => format!("HDEL {key} {}", fields.join(" ")),
        Command::Exists { keys } => format!("EXISTS {}", keys.join(" ")),
        Command::PTtl { key } => format!("PTTL {key}"),
        Command::Incr { key } => format!("INCR {key}"),
        Command::SAdd { key, members } => format!("SADD {key} {}", members.join(" ")),
        Command::SRem { key, members } => format!("SREM {key} {}", members.join(" ")),
        Command::SCard { key } => format!("SCARD {key}"),
        Command::SIsMember { key, member } => format!("SISMEMBER {key} {member}"),
        Command::ZAdd { key, members } => format!(
            "ZADD {key} {}",
            members
                .iter()
                .map(|(s, m)| format!("{s} {m}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Command::ZRem { key, members } => format!("ZREM {key} {}", members.join(" ")),
        Command::ZRank { key, member } => format!("ZRANK {key} {member}"),
        Command::ZScore { key, member } => format!("ZSCORE {key} {member}"),
        Command::ZCard { key } => format!("ZCARD {key}"),
        Command::ZRemRangeByScore { key, min, max } => {
            format!("ZREMRANGEBYSCORE {key} {} {}", bound(min), bound(max))
        }
        Command::ZInterStore {
            dest,
            keys,
            weights,
        } => format!(
            "ZINTERSTORE {dest} {} {} WEIGHTS {}",
            keys.len(),
            keys.join(" "),
            weights
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Command::Time => "TIME".into(),
        Command::Unwatch => "UNWATCH".into(),
        Command::Multi => "MULTI".into(),
        Command::Exec => "EXEC".into(),
        Command::Discard => "DISCARD".into(),
        Command::Transaction(cmds) => format!(
            "MULTI; {}; EXEC",
            cmds.iter().map(redis_cli).collect::<Vec<_>>().join("; ")
        ),
        Command::Wait {
            replicas,
            timeout_ms,
        } => format!("WAIT {replicas} {timeout_ms}"),
        Command::Publish { channel, message } => format!("PUBLISH {channel} {message}"),
        Command::Eval { script, keys, args } => {
            let mut s = format!("EVALSHA <{}> {}", script.name(), keys.len());
            for k in keys.iter().chain(args) {
                s.push(' ');
                s.push_str(k);
            }
            s
        }
        other => crate::model::command_text(other),
    }
}

/// A reply as `redis-cli` would show it.
pub fn reply_cli(r: &Reply) -> String {
    crate::model::reply_text(r)
}
