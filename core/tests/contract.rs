//! The contract a second front end relies on, checked against the machines
//! themselves rather than stated by hand:
//!
//! - every command a catalogue machine emits is sent as argument vectors
//!   ([`Command::frames`]) from which the same command reads back;
//! - `ProtocolId::clock()` is `Local` exactly for the protocols whose
//!   commands do not change when every client reading of the clock moves by
//!   the same amount;
//! - a machine never has two requests in flight to one node, so replies
//!   from different nodes may be handed back in any order;
//! - every event concludes the operation the contract names, and every
//!   operation is concluded (see [`conclude`]).
//!
//! The runs are seeded random walks (48 seeds of each of two
//! configurations) of two or three clients over keyspace nodes: acquire,
//! extend, release, time passing (timers handed over late at times),
//! replies delivered in any order across nodes, replies lost (with or
//! without the command running).

use lockwright_core::keyspace::{
    Command, ConnId, Keyspace, Reply, ScoreBound, Script, SetCondition, SetExpiry,
};
use lockwright_core::rng::SplitMix64;
use lockwright_core::{
    Acquire, Call, ClockUse, Config, Event, Extension, Machine, Millis, Outcome, Protocol,
    ProtocolId, Request, Token,
};
use std::collections::BTreeSet;

/// The server clock of every node, in every run: independent of the
/// clients' clocks.
const SERVER_BASE: u64 = 1_700_000_000_000;

/// What a run saw.
#[derive(Debug, Default)]
struct Run {
    /// Every request, per client, in the order the machines emitted them.
    requests: Vec<(usize, Request)>,
    /// The most requests one client had in flight to one node at once.
    most_in_flight_per_node: usize,
    /// Replies handed back to a request after which the same client had
    /// sent another to the same node.
    stale_replies: usize,
    /// Events that broke the conclusion rule (see [`conclude`]).
    misconcluded: Vec<String>,
    /// How many `Lost` events came while each kind of operation was
    /// pending: [none, acquire, release, extend].
    lost_while: [usize; 4],
    /// Events seen, by kind ([`kind_of`]).
    concluded: [usize; 9],
}

/// An event's kind, as an index: Acquired, Denied, Released, Extended by
/// the application's extend, NotExtended, Lost, Failed, RenewalFailed,
/// Extended by a renewal.
fn kind_of(event: &Event) -> usize {
    match event {
        Event::Acquired(_) => 0,
        Event::Denied => 1,
        Event::Released { .. } => 2,
        Event::Extended {
            by: Extension::Extend,
            ..
        } => 3,
        Event::Extended { .. } => 8,
        Event::NotExtended { .. } => 4,
        Event::Lost => 5,
        Event::Failed(_) => 6,
        Event::RenewalFailed(_) => 7,
    }
}

/// The application's call of `op` returned `Ok`: a machine takes one
/// operation at a time, so nothing may still be pending (an operation it
/// dropped without concluding would leave its driver waiting for ever).
fn start(pending: &mut Option<Call>, op: Call, problems: &mut Vec<String>) {
    if let Some(before) = pending.replace(op) {
        problems.push(format!(
            "{op:?} started while {before:?} was never concluded"
        ));
    }
}

/// What is pending after `event` by the contract's rule
/// ([`Event::concludes`]), or why the event does not fit: an event that
/// only ever concludes a call (all but `Lost` and a renewal's events) must
/// find that call pending.
fn conclude(pending: Option<Call>, event: &Event) -> Result<Option<Call>, String> {
    if pending.is_some_and(|call| event.concludes(call)) {
        return Ok(None);
    }
    let may_conclude_nothing = matches!(
        event,
        Event::Lost
            | Event::RenewalFailed(_)
            | Event::Extended {
                by: Extension::Renewal,
                ..
            }
            | Event::NotExtended {
                by: Extension::Renewal
            }
    );
    if may_conclude_nothing {
        Ok(pending)
    } else {
        Err(format!("{event:?} concludes nothing pending ({pending:?})"))
    }
}

fn config(id: ProtocolId, variant: u8) -> Config {
    let mut c = Config {
        ttl_ms: 1_000,
        nodes: if id == ProtocolId::Redlock { 3 } else { 1 },
        limit: 2,
        retry_base_ms: 20,
        retry_max_ms: 100,
        seed: 7,
        auto_renew: true,
        ..Config::new("res")
    };
    if variant == 1 {
        c.auto_renew = false;
        c.notify_releases = true;
        c.wait_replicas = Some(0);
        c.guard_lock = ProtocolId::SetnxExpire;
    }
    c
}

/// The nodes of a run before any client comes: empty, but for
/// watch-semaphore's size, which its application sets first.
fn fresh_nodes(id: ProtocolId, config: &Config) -> Vec<Keyspace> {
    let mut nodes: Vec<Keyspace> = (0..config.nodes).map(|_| Keyspace::new()).collect();
    if id == ProtocolId::WatchSemaphore {
        let set = lockwright_core::semaphores::watch_semaphore::set_max_size_command(
            config,
            config.limit,
        )
        .expect("a valid limit");
        nodes[0].execute(ConnId(99), Millis(SERVER_BASE), &set);
    }
    nodes
}

/// A seeded random walk of `id`'s clients whose clocks read
/// `client_base + t` while every node's reads `SERVER_BASE + t`.
fn walk(id: ProtocolId, variant: u8, seed: u64, client_base: u64) -> Run {
    let config = config(id, variant);
    let clients = if config.limit > 1 && id.kind() == lockwright_core::Kind::Semaphore {
        3
    } else {
        2
    };
    let mut machines: Vec<Machine> = (0..clients)
        .map(|c| {
            Machine::new(id, &config, Token::new(format!("client-{c}"))).expect("valid config")
        })
        .collect();
    let mut nodes = fresh_nodes(id, &config);
    // Requests in flight, per client, in emission order.
    let mut in_flight: Vec<Vec<Request>> = vec![Vec::new(); clients];
    // Requests followed by a later one of the same client to the same node.
    let mut superseded = BTreeSet::new();
    let mut rng = SplitMix64(seed);
    let mut run = Run::default();
    let mut pending: Vec<Option<Call>> = vec![None; clients];
    let mut t = 0u64;
    let now = |t: u64| Millis(client_base + t);

    for step in 0..4_000 {
        // 400 random steps, then the walk finishes what the application
        // started: it answers the requests of a client with an operation
        // pending, or lets time pass to its timers, until none is pending.
        let finishing = step >= 400;
        if finishing && pending.iter().all(Option::is_none) {
            break;
        }
        let (c, choice) = if finishing {
            let c = pending.iter().position(Option::is_some).unwrap_or(0);
            (c, if in_flight[c].is_empty() { 4 } else { 5 })
        } else {
            let c = (rng.next_u64() % clients as u64) as usize;
            (c, rng.next_u64() % 10)
        };
        let m = &mut machines[c];
        match choice {
            0 => {
                if m.acquire(now(t), Acquire::Until(now(t + 3_000))).is_ok() {
                    start(&mut pending[c], Call::Acquire, &mut run.misconcluded);
                }
            }
            1 => {
                if m.acquire(now(t), Acquire::Once).is_ok() {
                    start(&mut pending[c], Call::Acquire, &mut run.misconcluded);
                }
            }
            2 => {
                if m.extend(now(t)).is_ok() {
                    start(&mut pending[c], Call::Extend, &mut run.misconcluded);
                }
            }
            3 => {
                if m.release(now(t)).is_ok() {
                    start(&mut pending[c], Call::Release, &mut run.misconcluded);
                }
            }
            4 => {
                // Time passes, up to the next timer of some client or a bit.
                let step = 1 + rng.next_u64() % 400;
                let next = machines
                    .iter()
                    .filter_map(|m| m.poll_timeout())
                    .map(|d| d.get().saturating_sub(client_base))
                    .min();
                t = match next {
                    Some(d) if d > t && d <= t + step => d,
                    _ => t + step,
                };
                // A driver may be late to its timers: sometimes a reply is
                // handed back before a timer already due has fired.
                if !rng.next_u64().is_multiple_of(4) {
                    for m in &mut machines {
                        if m.poll_timeout().is_some_and(|d| d <= now(t)) {
                            m.handle_timeout(now(t));
                        }
                    }
                }
            }
            pick => {
                // A reply: to any request in flight, in any order across nodes.
                if !in_flight[c].is_empty() {
                    // A node runs one client's requests in the order sent;
                    // across nodes, any order.
                    let picked = (rng.next_u64() % in_flight[c].len() as u64) as usize;
                    let node = in_flight[c][picked].node;
                    let oldest = in_flight[c].iter().position(|r| r.node == node);
                    let request = in_flight[c].remove(oldest.unwrap_or(picked));
                    let runs = pick != 9 || rng.next_u64().is_multiple_of(2);
                    let reply = runs.then(|| {
                        nodes[usize::from(request.node.0)].execute(
                            ConnId(c as u32),
                            Millis(SERVER_BASE + t),
                            &request.command,
                        )
                    });
                    let outcome = match reply {
                        Some(reply) if pick != 9 => Outcome::Reply(reply),
                        _ => Outcome::Unknown,
                    };
                    // The reentrant lock's background renewal and a nested
                    // acquire or release are both awaited at once.
                    if id != ProtocolId::Reentrant && superseded.contains(&(c, request.id)) {
                        // The machine no longer waits for this reply: it
                        // must change nothing.
                        let before = machines[c].clone();
                        machines[c].handle_reply(now(t), request.id, outcome);
                        assert_eq!(
                            machines[c], before,
                            "{id}: a stale reply changed the machine"
                        );
                        run.stale_replies += 1;
                    } else {
                        machines[c].handle_reply(now(t), request.id, outcome);
                    }
                }
            }
        }
        for (c, m) in machines.iter_mut().enumerate() {
            while let Some(request) = m.poll_transmit() {
                for earlier in in_flight[c].iter().filter(|r| r.node == request.node) {
                    superseded.insert((c, earlier.id));
                }
                in_flight[c].push(request.clone());
                run.requests.push((c, request));
            }
            while let Some(event) = m.poll_event() {
                if event == Event::Lost {
                    let kind = match pending[c] {
                        None => 0,
                        Some(Call::Acquire) => 1,
                        Some(Call::Release) => 2,
                        Some(Call::Extend) => 3,
                    };
                    run.lost_while[kind] += 1;
                }
                match conclude(pending[c], &event) {
                    Ok(next) => pending[c] = next,
                    Err(why) => {
                        run.misconcluded.push(format!("c{c} at {t}: {why}"));
                        pending[c] = None;
                    }
                }
                run.concluded[kind_of(&event)] += 1;
            }
            // A machine with nothing in progress has concluded every
            // operation: a driver waiting for one would wait for ever.
            if let Some(op) = pending[c].filter(|_| !m.is_busy()) {
                run.misconcluded
                    .push(format!("c{c} at {t}: idle with {op:?} never concluded"));
                pending[c] = None;
            }
            let per_node = in_flight[c]
                .iter()
                .map(|r| in_flight[c].iter().filter(|o| o.node == r.node).count())
                .max()
                .unwrap_or(0);
            run.most_in_flight_per_node = run.most_in_flight_per_node.max(per_node);
        }
    }
    for (c, op) in pending.iter().enumerate() {
        if let Some(op) = op {
            run.misconcluded.push(format!(
                "c{c}: {op:?} still unconcluded when the walk ended"
            ));
        }
    }
    run
}

fn walks(id: ProtocolId, client_base: u64) -> Vec<Run> {
    (0..2u8)
        .flat_map(|variant| (0..48).map(move |seed| (variant, seed)))
        .map(|(variant, seed)| walk(id, variant, seed, client_base))
        .collect()
}

/// Read a command back from the argument vectors written for it.
fn parse(frames: &[Vec<String>]) -> Option<Command> {
    match frames {
        [single] => parse_one(single),
        [multi, inner @ .., exec] if multi == &["MULTI"] && exec == &["EXEC"] => Some(
            Command::Transaction(inner.iter().map(|v| parse_one(v)).collect::<Option<_>>()?),
        ),
        _ => None,
    }
}

fn parse_one(argv: &[String]) -> Option<Command> {
    let (name, args) = argv.split_first()?;
    let fixed = match name.as_str() {
        "TIME" | "UNWATCH" | "MULTI" | "EXEC" | "DISCARD" => Some(0),
        "GET" | "TTL" | "PTTL" | "INCR" | "SCARD" | "ZCARD" => Some(1),
        "SETNX" | "GETSET" | "EXPIRE" | "PEXPIRE" | "HEXISTS" | "HGET" | "SISMEMBER" | "ZRANK"
        | "ZSCORE" | "WAIT" | "PUBLISH" => Some(2),
        "HINCRBY" | "ZREMRANGEBYSCORE" => Some(3),
        _ => None,
    };
    if fixed.is_some_and(|n| n != args.len()) {
        return None;
    }
    let s = |i: usize| args.get(i).cloned();
    let n = |i: usize| args.get(i)?.parse::<i64>().ok();
    let rest = |from: usize| args.get(from..).map(<[String]>::to_vec);
    let bound = |i: usize| -> Option<ScoreBound> {
        let a = args.get(i)?;
        Some(match a.as_str() {
            "-inf" => ScoreBound::NegInf,
            "+inf" => ScoreBound::PosInf,
            x => match x.strip_prefix('(') {
                Some(e) => ScoreBound::Exclusive(e.parse().ok()?),
                None => ScoreBound::Inclusive(x.parse().ok()?),
            },
        })
    };
    Some(match name.as_str() {
        "SET" => {
            let (mut condition, mut expiry, mut get) =
                (SetCondition::Always, SetExpiry::None, false);
            let mut i = 2;
            while i < args.len() {
                match args[i].as_str() {
                    "NX" => condition = SetCondition::Nx,
                    "XX" => condition = SetCondition::Xx,
                    "GET" => get = true,
                    "PX" | "PXAT" => {
                        let ms = args.get(i + 1)?.parse().ok()?;
                        expiry = if args[i] == "PX" {
                            SetExpiry::Px(ms)
                        } else {
                            SetExpiry::PxAt(ms)
                        };
                        i += 1;
                    }
                    _ => return None,
                }
                i += 1;
            }
            Command::Set {
                key: s(0)?,
                value: s(1)?,
                condition,
                expiry,
                get,
            }
        }
        "SETNX" => Command::SetNx {
            key: s(0)?,
            value: s(1)?,
        },
        "GET" => Command::Get { key: s(0)? },
        "GETSET" => Command::GetSet {
            key: s(0)?,
            value: s(1)?,
        },
        "DEL" => Command::Del { keys: rest(0)? },
        "EXISTS" => Command::Exists { keys: rest(0)? },
        "EXPIRE" => Command::Expire {
            key: s(0)?,
            seconds: n(1)?,
        },
        "PEXPIRE" => Command::PExpire {
            key: s(0)?,
            millis: n(1)?,
        },
        "TTL" => Command::Ttl { key: s(0)? },
        "PTTL" => Command::PTtl { key: s(0)? },
        "INCR" => Command::Incr { key: s(0)? },
        "HINCRBY" => Command::HIncrBy {
            key: s(0)?,
            field: s(1)?,
            by: n(2)?,
        },
        "HEXISTS" => Command::HExists {
            key: s(0)?,
            field: s(1)?,
        },
        "HGET" => Command::HGet {
            key: s(0)?,
            field: s(1)?,
        },
        "HDEL" => Command::HDel {
            key: s(0)?,
            fields: rest(1)?,
        },
        "SADD" => Command::SAdd {
            key: s(0)?,
            members: rest(1)?,
        },
        "SREM" => Command::SRem {
            key: s(0)?,
            members: rest(1)?,
        },
        "SCARD" => Command::SCard { key: s(0)? },
        "SISMEMBER" => Command::SIsMember {
            key: s(0)?,
            member: s(1)?,
        },
        "ZADD" => {
            let pairs = args.get(1..)?;
            if pairs.len() % 2 != 0 {
                return None;
            }
            Command::ZAdd {
                key: s(0)?,
                members: pairs
                    .chunks_exact(2)
                    .map(|p| Some((p[0].parse().ok()?, p[1].clone())))
                    .collect::<Option<_>>()?,
            }
        }
        "ZREM" => Command::ZRem {
            key: s(0)?,
            members: rest(1)?,
        },
        "ZRANK" => Command::ZRank {
            key: s(0)?,
            member: s(1)?,
        },
        "ZSCORE" => Command::ZScore {
            key: s(0)?,
            member: s(1)?,
        },
        "ZCARD" => Command::ZCard { key: s(0)? },
        "ZREMRANGEBYSCORE" => Command::ZRemRangeByScore {
            key: s(0)?,
            min: bound(1)?,
            max: bound(2)?,
        },
        "ZINTERSTORE" => {
            let count = usize::try_from(n(1)?).ok()?;
            let keys = args.get(2..2 + count)?.to_vec();
            if args.get(2 + count)? != "WEIGHTS" {
                return None;
            }
            let weights = args[3 + count..]
                .iter()
                .map(|w| w.parse().ok())
                .collect::<Option<Vec<i64>>>()?;
            Command::ZInterStore {
                dest: s(0)?,
                keys,
                weights,
            }
        }
        "TIME" => Command::Time,
        "WATCH" => Command::Watch { keys: rest(0)? },
        "UNWATCH" => Command::Unwatch,
        "MULTI" => Command::Multi,
        "EXEC" => Command::Exec,
        "DISCARD" => Command::Discard,
        "WAIT" => Command::Wait {
            replicas: s(0)?.parse().ok()?,
            timeout_ms: s(1)?.parse().ok()?,
        },
        "PUBLISH" => Command::Publish {
            channel: s(0)?,
            message: s(1)?,
        },
        "EVALSHA" => {
            let sha = s(0)?;
            let script = Script::ALL.into_iter().find(|x| x.sha1() == sha)?;
            let count = usize::try_from(n(1)?).ok()?;
            Command::Eval {
                script,
                keys: args.get(2..2 + count)?.to_vec(),
                args: args.get(2 + count..)?.to_vec(),
            }
        }
        _ => return None,
    })
}

/// The variant's position in [`Command`]; no wildcard, so that a new
/// command kind fails to compile here until it has a case in
/// [`one_of_each`].
fn kind(command: &Command) -> usize {
    match command {
        Command::Set { .. } => 0,
        Command::SetNx { .. } => 1,
        Command::Get { .. } => 2,
        Command::GetSet { .. } => 3,
        Command::Del { .. } => 4,
        Command::Exists { .. } => 5,
        Command::Expire { .. } => 6,
        Command::PExpire { .. } => 7,
        Command::Ttl { .. } => 8,
        Command::PTtl { .. } => 9,
        Command::Incr { .. } => 10,
        Command::HIncrBy { .. } => 11,
        Command::HExists { .. } => 12,
        Command::HGet { .. } => 13,
        Command::HDel { .. } => 14,
        Command::SAdd { .. } => 15,
        Command::SRem { .. } => 16,
        Command::SCard { .. } => 17,
        Command::SIsMember { .. } => 18,
        Command::ZAdd { .. } => 19,
        Command::ZRem { .. } => 20,
        Command::ZRank { .. } => 21,
        Command::ZScore { .. } => 22,
        Command::ZCard { .. } => 23,
        Command::ZRemRangeByScore { .. } => 24,
        Command::ZInterStore { .. } => 25,
        Command::Time => 26,
        Command::Watch { .. } => 27,
        Command::Unwatch => 28,
        Command::Multi => 29,
        Command::Exec => 30,
        Command::Discard => 31,
        Command::Transaction(_) => 32,
        Command::Wait { .. } => 33,
        Command::Publish { .. } => 34,
        Command::Eval { .. } => 35,
    }
}

const KINDS: usize = 36;

fn one_of_each() -> Vec<Command> {
    let k = || "{res}".to_owned();
    let v = |x: &str| x.to_owned();
    vec![
        Command::Set {
            key: k(),
            value: v("t"),
            condition: SetCondition::Nx,
            expiry: SetExpiry::Px(1_000),
            get: false,
        },
        Command::SetNx {
            key: k(),
            value: v("t"),
        },
        Command::Get { key: k() },
        Command::GetSet {
            key: k(),
            value: v("1700000000000"),
        },
        Command::Del {
            keys: vec![k(), v("{res}:2")],
        },
        Command::Exists { keys: vec![k()] },
        Command::Expire {
            key: k(),
            seconds: -1,
        },
        Command::PExpire {
            key: k(),
            millis: 500,
        },
        Command::Ttl { key: k() },
        Command::PTtl { key: k() },
        Command::Incr { key: k() },
        Command::HIncrBy {
            key: k(),
            field: v("f"),
            by: -1,
        },
        Command::HExists {
            key: k(),
            field: v("f"),
        },
        Command::HGet {
            key: k(),
            field: v("f"),
        },
        Command::HDel {
            key: k(),
            fields: vec![v("f"), v("g")],
        },
        Command::SAdd {
            key: k(),
            members: vec![v("m")],
        },
        Command::SRem {
            key: k(),
            members: vec![v("m")],
        },
        Command::SCard { key: k() },
        Command::SIsMember {
            key: k(),
            member: v("m"),
        },
        Command::ZAdd {
            key: k(),
            members: vec![(-3, v("a")), (7, v("b"))],
        },
        Command::ZRem {
            key: k(),
            members: vec![v("a")],
        },
        Command::ZRank {
            key: k(),
            member: v("a"),
        },
        Command::ZScore {
            key: k(),
            member: v("a"),
        },
        Command::ZCard { key: k() },
        Command::ZRemRangeByScore {
            key: k(),
            min: ScoreBound::NegInf,
            max: ScoreBound::Exclusive(-5),
        },
        Command::ZInterStore {
            dest: k(),
            keys: vec![v("{res}:a"), v("{res}:b")],
            weights: vec![1, 0],
        },
        Command::Time,
        Command::Watch { keys: vec![k()] },
        Command::Unwatch,
        Command::Multi,
        Command::Exec,
        Command::Discard,
        Command::Transaction(vec![
            Command::Del { keys: vec![k()] },
            Command::ZRemRangeByScore {
                key: k(),
                min: ScoreBound::Inclusive(0),
                max: ScoreBound::PosInf,
            },
        ]),
        Command::Wait {
            replicas: 1,
            timeout_ms: 100,
        },
        Command::Publish {
            channel: v("{res}:released"),
            message: v("t"),
        },
        Command::Eval {
            script: Script::CompareAndDelete,
            keys: vec![k()],
            args: vec![v("t")],
        },
    ]
}

#[test]
fn every_command_kind_reads_back_from_its_argument_vectors() {
    let commands = one_of_each();
    let kinds: BTreeSet<usize> = commands.iter().map(kind).collect();
    assert_eq!(kinds.len(), KINDS, "one command of each kind");
    for command in commands {
        let frames = command.frames();
        assert_eq!(parse(&frames).as_ref(), Some(&command), "{frames:?}");
        // The single vector is the only frame, except for a transaction.
        match command.argv() {
            Some(argv) => assert_eq!(frames, [argv]),
            None => assert!(matches!(command, Command::Transaction(_))),
        }
    }
}

#[test]
fn every_script_reads_back_by_its_sha1() {
    for script in Script::ALL {
        let command = Command::Eval {
            script,
            keys: vec!["{res}".into()],
            args: vec!["a b".into(), String::new()],
        };
        assert_eq!(
            parse(&command.frames()),
            Some(command.clone()),
            "{script:?}"
        );
        let text = command.eval_text_argv().expect("a script");
        assert_eq!(text[1], script.lua());
        assert_eq!(text[2..], command.argv().expect("a single vector")[2..]);
    }
}

#[test]
fn every_command_the_machines_emit_reads_back_from_its_argument_vectors() {
    let mut seen = BTreeSet::new();
    for id in ProtocolId::all() {
        let mut emitted = 0;
        for run in walks(id, SERVER_BASE) {
            for (_, request) in run.requests {
                if let Command::Transaction(inner) = &request.command {
                    seen.extend(inner.iter().map(kind));
                }
                let frames = request.command.frames();
                assert_eq!(
                    parse(&frames).as_ref(),
                    Some(&request.command),
                    "{id}: {frames:?}"
                );
                seen.insert(kind(&request.command));
                emitted += 1;
            }
        }
        assert!(emitted > 10, "{id}: the walks exercise the machine");
    }
    // The walks reach the commands the catalogue is built from.
    for command in [
        Command::Transaction(Vec::new()),
        Command::Watch { keys: Vec::new() },
        Command::GetSet {
            key: String::new(),
            value: String::new(),
        },
        Command::ZInterStore {
            dest: String::new(),
            keys: Vec::new(),
            weights: Vec::new(),
        },
        Command::Wait {
            replicas: 0,
            timeout_ms: 0,
        },
    ] {
        assert!(seen.contains(&kind(&command)), "never emitted: {command:?}");
    }
}

#[test]
fn clock_is_shared_exactly_where_commands_carry_the_client_clock() {
    for id in ProtocolId::all() {
        let a = walks(id, SERVER_BASE);
        let b = walks(id, SERVER_BASE + 86_400_000);
        let commands = |runs: &[Run]| -> Vec<Vec<Command>> {
            runs.iter()
                .map(|r| r.requests.iter().map(|(_, q)| q.command.clone()).collect())
                .collect()
        };
        let same = commands(&a) == commands(&b);
        let expected = if same {
            ClockUse::Local
        } else {
            ClockUse::Shared
        };
        assert_eq!(
            id.clock(),
            expected,
            "{id}: commands {} when every client clock moves by a day",
            if same { "stay the same" } else { "change" }
        );
    }
}

/// A driver may write a machine's next request to a node before the reply
/// to its previous one has come (pipelining), but the node must run them in
/// the order the machine emitted them. Except for the reentrant lock (whose
/// background renewal runs beside a nested acquire or release), a machine
/// sends to a node again only once it no longer waits for its earlier
/// request there; that earlier request (an extend whose lease ran out
/// meanwhile, a RedLock acquire given up on) may still be on its way, and
/// its reply changes nothing.
#[test]
fn a_machine_waits_only_for_its_latest_request_to_each_node() {
    let mut pipelined = BTreeSet::new();
    for id in ProtocolId::all() {
        let runs = walks(id, SERVER_BASE);
        let most = runs.iter().map(|r| r.most_in_flight_per_node).max();
        let stale: usize = runs.iter().map(|r| r.stale_replies).sum();
        assert!(most >= Some(1), "{id}: requests were sent");
        if most > Some(1) {
            pipelined.insert(id);
            if id != ProtocolId::Reentrant {
                assert!(stale > 0, "{id}: the stale replies were handed back");
            }
        }
    }
    // The walks do reach a second request to a node before the first one's
    // reply: the checks in the walk are not vacuous.
    assert!(pipelined.contains(&ProtocolId::Reentrant), "{pipelined:?}");
    assert!(pipelined.len() > 1, "{pipelined:?}");
}

/// Acquire with automatic renewal on, then let time pass until the machine
/// sends a request nobody asked for: its renewal. `None` for a protocol
/// that does not renew (or does not grant on an empty node).
fn renewal_in_flight(id: ProtocolId) -> Option<(Machine, Vec<Keyspace>, Request, Millis)> {
    let config = Config {
        auto_renew: true,
        ..config(id, 0)
    };
    let mut m = Machine::new(id, &config, Token("me".into())).expect("valid config");
    let mut nodes = fresh_nodes(id, &config);
    let mut now = Millis(SERVER_BASE);
    m.acquire(now, Acquire::Once).expect("idle");
    let mut acquired = false;
    while let Some(request) = m.poll_transmit() {
        let reply = nodes[usize::from(request.node.0)].execute(ConnId(0), now, &request.command);
        m.handle_reply(now, request.id, Outcome::Reply(reply));
        acquired |= std::iter::from_fn(|| m.poll_event())
            .any(|e| matches!(e, lockwright_core::Event::Acquired(_)));
    }
    if !acquired {
        // `watch-semaphore` needs its max size on the server first; it
        // grants permits that never expire, so it does not renew anyway.
        return None;
    }
    let first = m.poll_timeout()?;
    // A renewal comes before the lease runs out.
    let valid_until = m.lease()?.valid_until;
    if first >= valid_until {
        return None;
    }
    now = first;
    m.handle_timeout(now);
    let renewal = m.poll_transmit()?;
    Some((m, nodes, renewal, now))
}

#[test]
fn an_extend_during_a_renewal_joins_it() {
    let mut renewing = BTreeSet::new();
    for id in ProtocolId::all() {
        let Some((mut m, mut nodes, renewal, now)) = renewal_in_flight(id) else {
            continue;
        };
        renewing.insert(id);
        // The application's extend neither fails nor sends a second request.
        assert_eq!(m.extend(now), Ok(()), "{id}");
        assert_eq!(m.poll_transmit(), None, "{id}: joined, not sent again");
        let reply = nodes[usize::from(renewal.node.0)].execute(ConnId(0), now, &renewal.command);
        m.handle_reply(now, renewal.id, Outcome::Reply(reply));
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        assert!(
            matches!(
                events.as_slice(),
                [lockwright_core::Event::Extended {
                    by: Extension::Extend,
                    ..
                }]
            ),
            "{id}: the renewal's reply concludes the extend: {events:?}"
        );
    }
    assert!(renewing.contains(&ProtocolId::Reentrant), "{renewing:?}");
    assert!(
        renewing.contains(&ProtocolId::LeaseSemaphore),
        "{renewing:?}"
    );
}

#[test]
fn a_renewal_nobody_asked_for_says_so() {
    for id in ProtocolId::all() {
        let Some((mut m, mut nodes, renewal, now)) = renewal_in_flight(id) else {
            continue;
        };
        let reply = nodes[usize::from(renewal.node.0)].execute(ConnId(0), now, &renewal.command);
        m.handle_reply(now, renewal.id, Outcome::Reply(reply));
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        assert!(
            matches!(
                events.as_slice(),
                [lockwright_core::Event::Extended {
                    by: Extension::Renewal,
                    ..
                }]
            ),
            "{id}: {events:?}"
        );
        // With no renewal in flight, extend sends its own request.
        assert_eq!(m.extend(now), Ok(()), "{id}");
        assert!(m.poll_transmit().is_some(), "{id}: extend sends");
    }
}

/// A renewal that gets no reply, or an error, leaves the hold standing on
/// its old lease, and renewal tries again before that lease runs out
/// (`Event::RenewalFailed`: "the hold stands, renewal tries again"); an
/// extend of the application's that gets no reply does the same.
#[test]
fn renewal_tries_again_after_a_renewal_or_an_extend_that_did_not_go_through() {
    let mut renewing = BTreeSet::new();
    for id in ProtocolId::all() {
        for (case, user_extend, outcome) in [
            ("unanswered renewal", false, Outcome::Unknown),
            (
                "refused renewal",
                false,
                Outcome::Reply(Reply::Error("ERR busy".into())),
            ),
            ("unanswered extend", true, Outcome::Unknown),
        ] {
            let Some((mut m, _nodes, renewal, now)) = renewal_in_flight(id) else {
                continue;
            };
            renewing.insert(id);
            let mut now = now;
            let mut pending = renewal;
            if user_extend {
                // Let the renewal through first, then the application's
                // extend goes unanswered.
                let mut nodes = _nodes;
                let reply =
                    nodes[usize::from(pending.node.0)].execute(ConnId(0), now, &pending.command);
                m.handle_reply(now, pending.id, Outcome::Reply(reply));
                while m.poll_event().is_some() {}
                now = Millis(now.0 + 1);
                m.extend(now).expect("held");
                pending = m.poll_transmit().expect("the extend sends");
            }
            let valid_until = m.lease().expect("held").valid_until;
            m.handle_reply(now, pending.id, outcome.clone());
            let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
            assert_eq!(events.len(), 1, "{id}, {case}: {events:?}");
            assert!(
                !matches!(events[0], lockwright_core::Event::Lost),
                "{id}, {case}: {events:?}"
            );
            assert!(m.lease().is_some(), "{id}, {case}: the hold stands");
            // The next deadline is a renewal, before the old lease ends.
            let next = m.poll_timeout().expect("a deadline");
            assert!(
                next < valid_until,
                "{id}, {case}: next deadline {next:?} not before the lease's end {valid_until:?}"
            );
            m.handle_timeout(next);
            let again = m.poll_transmit();
            assert!(
                again.is_some(),
                "{id}, {case}: renewal tries again at {next:?}"
            );
        }
    }
    assert!(renewing.contains(&ProtocolId::Fenced), "{renewing:?}");
    assert!(renewing.contains(&ProtocolId::Reentrant), "{renewing:?}");
    assert!(
        renewing.contains(&ProtocolId::LeaseSemaphore),
        "{renewing:?}"
    );
}

/// Every event concludes the operation the contract says it does, and only
/// while that operation is pending: a driver can keep one pending
/// operation per machine and never guess. `Lost` concludes a pending
/// extend and leaves an acquire or a release pending.
#[test]
fn every_event_concludes_the_operation_the_contract_names() {
    let mut lost_while = [0; 4];
    for id in ProtocolId::all() {
        let mut seen = [0; 9];
        for run in walks(id, 1_000_000) {
            assert_eq!(run.misconcluded, Vec::<String>::new(), "{id}");
            for (total, n) in lost_while.iter_mut().zip(run.lost_while) {
                *total += n;
            }
            for (total, n) in seen.iter_mut().zip(run.concluded) {
                *total += n;
            }
        }
        eprintln!(
            "{id}: Acquired, Denied, Released, Extended (extend), NotExtended, Lost, \
             Failed, RenewalFailed, Extended (renewal) seen {seen:?}"
        );
        // Every machine is taken through acquires, releases and extends.
        assert!(seen[0] > 0 && seen[2] > 0 && seen[3] > 0, "{id}: {seen:?}");
    }
    eprintln!("Lost while pending [nothing, acquire, release, extend]: {lost_while:?}");
    // The walks take `Lost` with nothing pending, during an acquire and a
    // release (which go on) and during an extend (which it concludes).
    assert!(lost_while.iter().all(|n| *n > 0), "{lost_while:?}");
}

#[test]
fn an_error_reply_to_a_renewal_concludes_no_operation_of_the_application() {
    let error = || Outcome::Reply(lockwright_core::keyspace::Reply::Error("ERR boom".into()));
    let mut renewing = 0;
    for id in ProtocolId::all() {
        let Some((mut m, _, renewal, now)) = renewal_in_flight(id) else {
            continue;
        };
        renewing += 1;
        let mut joined = m.clone();
        m.handle_reply(now, renewal.id, error());
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        assert!(
            matches!(
                events.as_slice(),
                [lockwright_core::Event::RenewalFailed(_)]
            ),
            "{id}: {events:?}"
        );
        assert!(m.lease().is_some(), "{id}: the old lease stands");
        // Joined by the application's extend, the same reply fails the extend.
        assert_eq!(joined.extend(now), Ok(()), "{id}");
        joined.handle_reply(now, renewal.id, error());
        let events: Vec<_> = std::iter::from_fn(|| joined.poll_event()).collect();
        assert!(
            matches!(events.as_slice(), [lockwright_core::Event::Failed(_)]),
            "{id}: {events:?}"
        );
    }
    assert!(renewing >= 2);
}

/// A renewal that fails late in the lease (here at 0.7 of it: a request
/// timeout of 0.37 TTL, e.g. the adapter's default 1 s with a 2.7 s TTL,
/// or a second failure in a row) is still tried again before the old
/// lease ends, as `RenewalFailed` promises.
#[test]
fn renewal_failing_late_in_the_lease_still_tries_again_before_it_ends() {
    let mut renewing = BTreeSet::new();
    let mut failing = Vec::new();
    for id in ProtocolId::all() {
        let Some((mut m, _nodes, renewal, sent)) = renewal_in_flight(id) else {
            continue;
        };
        renewing.insert(id);
        let valid_until = m.lease().expect("held").valid_until;
        // The renewal (sent at 1/3 TTL) is unanswered at 0.7 TTL of the
        // lease, well before its end (0.988 TTL).
        let failed_at = Millis(valid_until.0 - 288);
        assert!(failed_at > sent, "{id}");
        m.handle_reply(failed_at, renewal.id, Outcome::Unknown);
        while m.poll_event().is_some() {}
        assert!(m.lease().is_some(), "{id}: the hold stands");
        // Run the machine's timers until it sends a renewal or loses.
        let mut sent_again = false;
        let mut lost = false;
        for _ in 0..10 {
            let Some(at) = m.poll_timeout() else { break };
            m.handle_timeout(at);
            if m.poll_transmit().is_some() {
                sent_again = true;
                break;
            }
            if std::iter::from_fn(|| m.poll_event())
                .any(|e| matches!(e, lockwright_core::Event::Lost))
            {
                lost = true;
                break;
            }
        }
        if !sent_again || lost {
            failing.push(format!(
                "{id} ({} ms left, lost: {lost})",
                valid_until.0 - failed_at.0
            ));
        }
    }
    assert!(renewing.contains(&ProtocolId::Fenced), "{renewing:?}");
    assert!(
        failing.is_empty(),
        "no renewal retried before the lease ended: {failing:?}"
    );
}
