//! Golden, data-driven tests of RedLock (raft-rs style).
//!
//! Every `core/tests/testdata/redlock*.txt` file is a list of cases:
//!
//! ```text
//! # comment lines: the source of the case (node-redlock #296, rslock, ...)
//! directive arg=value ...
//! [more input lines, for `decide`]
//! ----
//! expected output, one item per line
//! <blank line>
//! ```
//!
//! Directives:
//!
//! - `decide`: each following input line `acks= nodes= ttl= elapsed= drift=`
//!   is run through [`decide`]; one output line each.
//! - `new nodes= ttl= [drift=] [timeout=] [token=] [retry=base,max]`: a fresh
//!   machine over `nodes` empty [`Keyspace`] masters (no jitter).
//! - `acquire at=T once|until=D`, `release at=T`, `extend at=T`: call the
//!   mutator at client time `T`.
//! - `deliver at=T [n0 n1 ...]`: every request in flight (to the listed
//!   masters, default all) is executed on its master's keyspace at node time
//!   `T` and the reply handed back at client time `T`. Requests the machine
//!   sends meanwhile stay in flight.
//! - `reply at=T nI ok|nil|int:N|err:TEXT|unknown`: a scripted reply to the
//!   oldest request in flight to master `I` (the keyspace does not run it;
//!   `TEXT` is the rest of the line).
//! - `drop nI`: the requests in flight to master `I` are lost.
//! - `tick at=T`: [`Protocol::handle_timeout`] if a timer is due at `T`.
//! - `exec nI at=T set|hincrby|del ...`: a command on one master, as another
//!   client would send it.
//! - `keys at=T`: the lock key on every master (value and PTTL).
//! - `lease`: the machine's lease and whether it is busy.
//!
//! After a machine directive the output lists what the machine did: `send`
//! lines, `event` lines and the `wake` deadline. Set `REWRITE=1` to rewrite
//! the expected outputs from the actual ones (then review the diff).

use lockwright_core::keyspace::{Command, ConnId, Keyspace, Reply, SetCondition, SetExpiry};
use lockwright_core::locks::redlock::{decide, Decision, Redlock};
use lockwright_core::{
    Acquire, Config, Event, Extension, Millis, Outcome, Protocol, Request, Token,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The machine under test, its masters and the requests in flight.
#[derive(Default)]
struct World {
    lock: Option<Redlock>,
    nodes: Vec<Keyspace>,
    inflight: Vec<Request>,
    key: String,
}

type Args = BTreeMap<String, String>;

/// `at=5 once n0` → {"at": "5", "once": "", "n0": ""}.
fn parse_args<'a>(words: impl Iterator<Item = &'a str>) -> Args {
    words
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (w.to_owned(), String::new()),
        })
        .collect()
}

fn num(args: &Args, name: &str) -> Result<u64, String> {
    args.get(name)
        .ok_or_else(|| format!("missing {name}="))?
        .parse()
        .map_err(|e| format!("{name}: {e}"))
}

fn at(args: &Args) -> Result<Millis, String> {
    num(args, "at").map(Millis)
}

fn node_arg(word: &str) -> Result<usize, String> {
    word.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("expected a master nI, got {word:?}"))
}

fn fmt_command(command: &Command) -> String {
    match command {
        Command::Eval { script, keys, args } => {
            format!(
                "EVAL {} {} {}",
                script.name(),
                keys.join(" "),
                args.join(" ")
            )
        }
        Command::Set { .. } | Command::HIncrBy { .. } | Command::Del { .. } => {
            command.argv().unwrap_or_default().join(" ")
        }
        other => format!("{other:?}"),
    }
}

fn fmt_reply(reply: &Reply) -> String {
    match reply {
        Reply::Nil => "nil".into(),
        Reply::Status(s) if s == "OK" => "ok".into(),
        Reply::Status(s) => format!("status:{s}"),
        Reply::Int(n) => format!("int:{n}"),
        Reply::Bulk(s) => format!("bulk:{s}"),
        Reply::Error(e) => format!("err:{e}"),
        Reply::Array(items) => {
            let items: Vec<String> = items.iter().map(fmt_reply).collect();
            format!("[{}]", items.join(", "))
        }
    }
}

fn parse_outcome(word: &str) -> Result<Outcome, String> {
    Ok(Outcome::Reply(match word {
        "ok" => Reply::ok(),
        "nil" => Reply::Nil,
        "unknown" => return Ok(Outcome::Unknown),
        w => match w.split_once(':') {
            Some(("int", n)) => Reply::Int(n.parse().map_err(|e| format!("int: {e}"))?),
            Some(("err", e)) => Reply::Error(e.to_owned()),
            Some(("bulk", b)) => Reply::Bulk(b.to_owned()),
            _ => return Err(format!("unknown reply {w:?}")),
        },
    }))
}

fn fmt_event(event: &Event) -> String {
    match event {
        Event::Acquired(lease) => format!("Acquired valid_until={}", lease.valid_until.get()),
        // RedLock has no automatic renewal: every extension is `extend`'s.
        Event::Extended { lease, by } => {
            assert_eq!(*by, Extension::Extend);
            format!("Extended valid_until={}", lease.valid_until.get())
        }
        Event::NotExtended { by } => {
            assert_eq!(*by, Extension::Extend);
            "NotExtended".to_owned()
        }
        other => format!("{other:?}"),
    }
}

impl World {
    fn lock(&mut self) -> Result<&mut Redlock, String> {
        self.lock
            .as_mut()
            .ok_or_else(|| "no machine: use `new`".into())
    }

    /// Drain the machine's outputs into `out` after an input.
    fn drain(&mut self, out: &mut Vec<String>) -> Result<(), String> {
        let lock = self.lock.as_mut().ok_or("no machine")?;
        while let Some(request) = lock.poll_transmit() {
            out.push(format!(
                "send n{} r{} {}",
                request.node.0,
                request.id.0,
                fmt_command(&request.command)
            ));
            self.inflight.push(request);
        }
        while let Some(event) = lock.poll_event() {
            out.push(format!("event {}", fmt_event(&event)));
        }
        out.push(match lock.poll_timeout() {
            Some(t) => format!("wake {}", t.get()),
            None => "wake none".into(),
        });
        Ok(())
    }

    /// Hand `outcome` for `request` back to the machine.
    fn answer(
        &mut self,
        now: Millis,
        request: &Request,
        outcome: Outcome,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        let shown = match &outcome {
            Outcome::Reply(r) => fmt_reply(r),
            Outcome::Unknown => "unknown".into(),
        };
        out.push(format!("n{} r{} <- {shown}", request.node.0, request.id.0));
        self.lock()?.handle_reply(now, request.id, outcome);
        Ok(())
    }

    fn run(&mut self, directive: &str, extra: &[&str]) -> Result<Vec<String>, String> {
        let mut words = directive.split_whitespace();
        let name = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        let args = parse_args(rest.iter().copied());
        let mut out = Vec::new();
        match name {
            "decide" => {
                for line in extra {
                    let a = parse_args(line.split_whitespace());
                    let d = decide(
                        num(&a, "acks")? as usize,
                        num(&a, "nodes")? as usize,
                        num(&a, "ttl")?,
                        num(&a, "elapsed")?,
                        num(&a, "drift")?,
                    );
                    out.push(match d {
                        Decision::Held { validity_ms } => format!("held validity={validity_ms}"),
                        Decision::NoQuorum { acks, quorum } => {
                            format!("no-quorum acks={acks} quorum={quorum}")
                        }
                        Decision::NoValidity { acks } => format!("no-validity acks={acks}"),
                    });
                }
            }
            "new" => {
                let mut config = Config {
                    nodes: num(&args, "nodes")? as u8,
                    ttl_ms: num(&args, "ttl")?,
                    retry_jitter_percent: 0,
                    ..Config::new("lock")
                };
                config.drift_ms = args
                    .get("drift")
                    .map(|d| d.parse())
                    .transpose()
                    .map_err(|e| format!("drift: {e}"))?;
                config.reply_timeout_ms = args
                    .get("timeout")
                    .map(|d| d.parse())
                    .transpose()
                    .map_err(|e| format!("timeout: {e}"))?;
                if let Some((base, max)) = args.get("retry").and_then(|r| r.split_once(',')) {
                    config.retry_base_ms = base.parse().map_err(|e| format!("retry: {e}"))?;
                    config.retry_max_ms = max.parse().map_err(|e| format!("retry: {e}"))?;
                }
                let token = Token::new(args.get("token").cloned().unwrap_or_else(|| "me".into()));
                *self = World::default();
                match Redlock::new(&config, token) {
                    Ok(lock) => {
                        out.push(format!(
                            "ok quorum={} drift={} timeout={}",
                            lock.quorum(),
                            lock.drift_ms(),
                            lock.reply_timeout_ms()
                        ));
                        self.nodes = vec![Keyspace::new(); lock.nodes()];
                        self.key = config.key();
                        self.lock = Some(lock);
                    }
                    Err(e) => out.push(format!("error {e:?}")),
                }
            }
            "acquire" => {
                let how = match args.get("until") {
                    Some(d) => {
                        Acquire::Until(Millis(d.parse().map_err(|e| format!("until: {e}"))?))
                    }
                    None if args.contains_key("once") => Acquire::Once,
                    None => return Err("acquire needs `once` or `until=`".into()),
                };
                let now = at(&args)?;
                if let Err(e) = self.lock()?.acquire(now, how) {
                    out.push(format!("usage error {e:?}"));
                }
                self.drain(&mut out)?;
            }
            "release" | "extend" => {
                let now = at(&args)?;
                let lock = self.lock()?;
                let result = if name == "release" {
                    lock.release(now)
                } else {
                    lock.extend(now)
                };
                if let Err(e) = result {
                    out.push(format!("usage error {e:?}"));
                }
                self.drain(&mut out)?;
            }
            "deliver" => {
                let now = at(&args)?;
                let only: Vec<usize> = rest
                    .iter()
                    .filter(|w| w.starts_with('n'))
                    .map(|w| node_arg(w))
                    .collect::<Result<_, _>>()?;
                let (now_due, later): (Vec<Request>, Vec<Request>) =
                    std::mem::take(&mut self.inflight)
                        .into_iter()
                        .partition(|r| only.is_empty() || only.contains(&usize::from(r.node.0)));
                self.inflight = later;
                for request in now_due {
                    let node = self
                        .nodes
                        .get_mut(usize::from(request.node.0))
                        .ok_or("request to an unknown master")?;
                    let reply = node.execute(ConnId(0), now, &request.command);
                    self.answer(now, &request, Outcome::Reply(reply), &mut out)?;
                }
                self.drain(&mut out)?;
            }
            "reply" => {
                let now = at(&args)?;
                let at_node = rest
                    .iter()
                    .position(|w| w.starts_with('n'))
                    .ok_or("reply needs a master nI")?;
                let node = node_arg(rest[at_node])?;
                // The reply is the rest of the line: error texts have spaces.
                let outcome = parse_outcome(&rest[at_node + 1..].join(" "))?;
                let index = self
                    .inflight
                    .iter()
                    .position(|r| usize::from(r.node.0) == node)
                    .ok_or_else(|| format!("nothing in flight to n{node}"))?;
                let request = self.inflight.remove(index);
                self.answer(now, &request, outcome, &mut out)?;
                self.drain(&mut out)?;
            }
            "drop" => {
                let node = node_arg(rest.first().ok_or("drop needs a master nI")?)?;
                self.inflight.retain(|r| {
                    let lost = usize::from(r.node.0) == node;
                    if lost {
                        out.push(format!("n{} r{} lost", r.node.0, r.id.0));
                    }
                    !lost
                });
            }
            "tick" => {
                let now = at(&args)?;
                let lock = self.lock()?;
                match lock.poll_timeout() {
                    Some(t) if t <= now => lock.handle_timeout(now),
                    _ => out.push("no timer due".into()),
                }
                self.drain(&mut out)?;
            }
            "exec" => {
                let node = node_arg(rest.first().ok_or("exec needs a master nI")?)?;
                let now = at(&args)?;
                let words: Vec<&str> = rest[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.contains('='))
                    .collect();
                let command = match words.as_slice() {
                    ["set", key, value] => Command::Set {
                        key: (*key).into(),
                        value: (*value).into(),
                        condition: SetCondition::Always,
                        expiry: SetExpiry::None,
                        get: false,
                    },
                    ["set", key, value, "px", ms] => Command::Set {
                        key: (*key).into(),
                        value: (*value).into(),
                        condition: SetCondition::Always,
                        expiry: SetExpiry::Px(ms.parse().map_err(|e| format!("px: {e}"))?),
                        get: false,
                    },
                    ["hincrby", key, field, by] => Command::HIncrBy {
                        key: (*key).into(),
                        field: (*field).into(),
                        by: by.parse().map_err(|e| format!("hincrby: {e}"))?,
                    },
                    ["del", key] => Command::Del {
                        keys: vec![(*key).into()],
                    },
                    other => return Err(format!("unknown exec {other:?}")),
                };
                let ks = self.nodes.get_mut(node).ok_or("unknown master")?;
                let reply = ks.execute(ConnId(1), now, &command);
                out.push(format!(
                    "n{node} {} -> {}",
                    fmt_command(&command),
                    fmt_reply(&reply)
                ));
            }
            "keys" => {
                let now = at(&args)?;
                let key = self.key.clone();
                for (i, node) in self.nodes.iter_mut().enumerate() {
                    let value = node.execute(ConnId(1), now, &Command::Get { key: key.clone() });
                    let pttl = node.execute(ConnId(1), now, &Command::PTtl { key: key.clone() });
                    out.push(format!(
                        "n{i} {key}: {} pttl={}",
                        fmt_reply(&value),
                        fmt_reply(&pttl)
                    ));
                }
            }
            "lease" => {
                let lock = self.lock()?;
                let busy = lock.is_busy();
                out.push(match lock.lease() {
                    Some(lease) => {
                        format!("lease valid_until={} busy={busy}", lease.valid_until.get())
                    }
                    None => format!("lease none busy={busy}"),
                });
            }
            other => return Err(format!("unknown directive {other:?}")),
        }
        Ok(out)
    }
}

/// One case of a golden file.
struct Case {
    /// Line number of the directive (1-based), for messages.
    line: usize,
    directive: String,
    extra: Vec<String>,
    expected: Vec<String>,
}

/// A golden file split into verbatim text (comments, blank lines) and cases.
enum Piece {
    Text(String),
    Case(Case),
}

fn parse_file(text: &str) -> Vec<Piece> {
    let lines: Vec<&str> = text.lines().collect();
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() || line.starts_with('#') {
            pieces.push(Piece::Text(line.to_owned()));
            i += 1;
            continue;
        }
        let start = i;
        let directive = line.to_owned();
        let mut extra = Vec::new();
        i += 1;
        while i < lines.len() && lines[i] != "----" {
            extra.push(lines[i].to_owned());
            i += 1;
        }
        i += 1; // the separator
        let mut expected = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() {
            expected.push(lines[i].to_owned());
            i += 1;
        }
        pieces.push(Piece::Case(Case {
            line: start + 1,
            directive,
            extra,
            expected,
        }));
    }
    pieces
}

fn run_file(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    // Only `REWRITE=1` rewrites, and never under CI, where a rewrite would
    // pass every case unchecked.
    let rewrite = std::env::var("REWRITE").is_ok_and(|v| v == "1");
    assert!(
        !(rewrite && std::env::var("CI").is_ok_and(|v| v == "true")),
        "REWRITE=1 under CI=true would rewrite the golden files instead of checking them"
    );
    let mut world = World::default();
    let mut rewritten = String::new();
    let mut failures = Vec::new();
    let mut cases = 0;
    for piece in parse_file(&text) {
        match piece {
            Piece::Text(t) => {
                rewritten.push_str(&t);
                rewritten.push('\n');
            }
            Piece::Case(case) => {
                cases += 1;
                let extra: Vec<&str> = case.extra.iter().map(String::as_str).collect();
                let actual = world
                    .run(&case.directive, &extra)
                    .unwrap_or_else(|e| vec![format!("harness error: {e}")]);
                if actual != case.expected {
                    failures.push(format!(
                        "{}:{}: {}\n--- expected\n{}\n--- actual\n{}\n",
                        path.display(),
                        case.line,
                        case.directive,
                        case.expected.join("\n"),
                        actual.join("\n")
                    ));
                }
                rewritten.push_str(&case.directive);
                rewritten.push('\n');
                for line in &case.extra {
                    rewritten.push_str(line);
                    rewritten.push('\n');
                }
                rewritten.push_str("----\n");
                for line in &actual {
                    rewritten.push_str(line);
                    rewritten.push('\n');
                }
            }
        }
    }
    assert!(cases > 0, "{}: no cases", path.display());
    if rewrite {
        std::fs::write(path, rewritten).unwrap();
        return;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name)
}

#[test]
fn every_redlock_golden_file_has_a_test() {
    let mut files: Vec<String> = std::fs::read_dir(testdata(""))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("redlock") && n.ends_with(".txt"))
        .collect();
    files.sort();
    assert_eq!(files, GOLDEN_FILES);
}

const GOLDEN_FILES: [&str; 5] = [
    "redlock_acquire.txt",
    "redlock_decide.txt",
    "redlock_extend.txt",
    "redlock_release.txt",
    "redlock_timeouts.txt",
];

#[test]
fn redlock_decide_golden() {
    run_file(&testdata("redlock_decide.txt"));
}

#[test]
fn redlock_acquire_golden() {
    run_file(&testdata("redlock_acquire.txt"));
}

#[test]
fn redlock_extend_golden() {
    run_file(&testdata("redlock_extend.txt"));
}

#[test]
fn redlock_release_golden() {
    run_file(&testdata("redlock_release.txt"));
}

#[test]
fn redlock_timeouts_golden() {
    run_file(&testdata("redlock_timeouts.txt"));
}
