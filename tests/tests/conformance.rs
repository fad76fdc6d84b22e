//! Conformance: random sequences of the commands the protocols use run on a
//! real `redis-server` and on `lockwright_core::keyspace::Keyspace` must give
//! identical replies and identical final state.
//!
//! Small alphabets make keys, members and tokens collide, so wrong types,
//! missing keys, watched-key aborts and script branches all happen. Two
//! connections take part (WATCH on one, writes on the other).
//!
//! Time is exact: the server runs under libfaketime with its wall clock
//! frozen ([`FakeClock::frozen`]), and the model is given the same reading. A
//! sequence starts at [`T0`] and moves both clocks forward only by its own
//! `Advance` steps (a millisecond, a few, or past every TTL), so expiry at
//! the boundary (`now > deadline`), the deadlines the lease scripts store
//! as scores, the clock fences of `time-fenced-acquire` and
//! `time-fenced-lease-acquire` and every remaining-time reply are compared
//! exactly, like everything else, error texts included.
//!
//! `CI=true` runs 1,000 sequences; locally 100 (or `LOCKWRIGHT_CONFORMANCE_CASES`).

use lockwright_chaos::FakeClock;
use lockwright_core::keyspace::script::release_args;
use lockwright_core::keyspace::{
    Command, ConnId, Keyspace, Reply, ScoreBound, Script, SetCondition, SetExpiry, Value,
};
use lockwright_core::Millis;
use lockwright_redis::wire;
use lockwright_tests::{in_ci, libfaketime_or_skip, raw, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestRunner};
use std::collections::BTreeMap;

const KEYS: [&str; 3] = ["{k}", "{k}:a", "{k}:b"];
const VALUES: [&str; 4] = ["t1", "t2", "1", "7"];
const MEMBERS: [&str; 3] = ["t1", "t2", "m"];
/// Where every sequence's clock starts, ms since the epoch.
const T0: u64 = 1_800_000_000_123;
/// `PXAT` deadlines: 100 s before T0, and 100 s after it.
const PXATS: [u64; 2] = [T0 - 100_000, T0 + 100_000];
/// How far an `Advance` step moves the clock: to a TTL of 1 ms and past
/// it, past the short TTLs, and past every long one (200 s at most).
const ADVANCES: [u64; 4] = [1, 2, 5, 250_000];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(str::to_owned)
}
fn value() -> impl Strategy<Value = String> {
    prop::sample::select(&VALUES[..]).prop_map(str::to_owned)
}
fn member() -> impl Strategy<Value = String> {
    prop::sample::select(&MEMBERS[..]).prop_map(str::to_owned)
}
fn keys() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(key(), 1..3)
}
fn members() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(member(), 1..3)
}
/// TTL arguments in ms: long, short (a few `Advance` steps end them), or
/// degenerate.
fn ttl_ms_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("100000".to_owned()),
        3 => Just("200000".to_owned()),
        1 => Just("1".to_owned()),
        1 => Just("5".to_owned()),
        1 => Just("0".to_owned()),
        1 => Just("t1".to_owned()),
    ]
}
fn score() -> impl Strategy<Value = i64> {
    -3i64..4
}
fn bound() -> impl Strategy<Value = ScoreBound> {
    prop_oneof![
        Just(ScoreBound::NegInf),
        Just(ScoreBound::PosInf),
        score().prop_map(ScoreBound::Inclusive),
        score().prop_map(ScoreBound::Exclusive),
    ]
}

fn eval() -> impl Strategy<Value = Command> {
    (
        prop::sample::select(&Script::ALL[..]),
        prop::collection::vec(key(), 3),
        value(),
        ttl_ms_arg(),
        prop_oneof![Just("1".to_owned()), Just("2".to_owned())],
        any::<bool>(),
    )
        .prop_map(|(script, ks, token, ttl, limit, notify)| {
            let (keys, args) = match script {
                Script::CompareAndDelete | Script::LeaseRelease => {
                    (vec![ks[0].clone()], release_args(vec![token], notify))
                }
                Script::CompareAndPExpire | Script::LeaseRenew => {
                    (vec![ks[0].clone()], vec![token, ttl])
                }
                Script::ReentrantUnlock => {
                    (vec![ks[0].clone()], release_args(vec![ttl, token], notify))
                }
                Script::ReentrantLock | Script::ReentrantRenew => {
                    (vec![ks[0].clone()], vec![ttl, token])
                }
                Script::FencedAcquire | Script::TimeFencedAcquire => {
                    (ks[..2].to_vec(), vec![token, ttl])
                }
                Script::LeaseAcquire | Script::TimeFencedLeaseAcquire => {
                    (ks, vec![token, ttl, limit])
                }
            };
            Command::Eval { script, keys, args }
        })
}

/// A data command (no connection-state commands): usable inside a transaction.
fn data_command() -> impl Strategy<Value = Command> {
    let set = (
        key(),
        value(),
        prop::sample::select(&[SetCondition::Always, SetCondition::Nx, SetCondition::Xx][..]),
        prop_oneof![
            2 => Just(SetExpiry::None),
            4 => prop_oneof![Just(100_000u64), Just(200_000u64)].prop_map(SetExpiry::Px),
            1 => prop_oneof![Just(0u64), Just(1), Just(5)].prop_map(SetExpiry::Px),
            1 => prop::sample::select(&PXATS[..]).prop_map(SetExpiry::PxAt),
        ],
        any::<bool>(),
    )
        .prop_map(|(key, value, condition, expiry, get)| Command::Set {
            key,
            value,
            condition,
            expiry,
            get,
        });
    prop_oneof![
        6 => set,
        2 => (key(), value()).prop_map(|(key, value)| Command::SetNx { key, value }),
        3 => key().prop_map(|key| Command::Get { key }),
        1 => (key(), value()).prop_map(|(key, value)| Command::GetSet { key, value }),
        2 => keys().prop_map(|keys| Command::Del { keys }),
        1 => keys().prop_map(|keys| Command::Exists { keys }),
        1 => (key(), prop_oneof![Just(100i64), Just(200), Just(0), Just(-1)])
            .prop_map(|(key, seconds)| Command::Expire { key, seconds }),
        2 => (key(), prop_oneof![Just(100_000i64), Just(200_000), Just(0), Just(-5), Just(2)])
            .prop_map(|(key, millis)| Command::PExpire { key, millis }),
        1 => key().prop_map(|key| Command::Ttl { key }),
        2 => key().prop_map(|key| Command::PTtl { key }),
        2 => key().prop_map(|key| Command::Incr { key }),
        2 => (key(), member(), -2i64..3).prop_map(|(key, field, by)| Command::HIncrBy { key, field, by }),
        1 => (key(), member()).prop_map(|(key, field)| Command::HExists { key, field }),
        1 => (key(), member()).prop_map(|(key, field)| Command::HGet { key, field }),
        1 => (key(), members()).prop_map(|(key, fields)| Command::HDel { key, fields }),
        2 => (key(), members()).prop_map(|(key, members)| Command::SAdd { key, members }),
        1 => (key(), members()).prop_map(|(key, members)| Command::SRem { key, members }),
        1 => key().prop_map(|key| Command::SCard { key }),
        1 => (key(), member()).prop_map(|(key, member)| Command::SIsMember { key, member }),
        3 => (key(), prop::collection::vec((score(), member()), 1..3))
            .prop_map(|(key, members)| Command::ZAdd { key, members }),
        1 => (key(), members()).prop_map(|(key, members)| Command::ZRem { key, members }),
        2 => (key(), member()).prop_map(|(key, member)| Command::ZRank { key, member }),
        1 => (key(), member()).prop_map(|(key, member)| Command::ZScore { key, member }),
        1 => key().prop_map(|key| Command::ZCard { key }),
        1 => (key(), bound(), bound()).prop_map(|(key, min, max)| Command::ZRemRangeByScore { key, min, max }),
        1 => (key(), prop::collection::vec((key(), -2i64..3), 1..3)).prop_map(|(dest, kw)| {
            let (keys, weights) = kw.into_iter().unzip();
            Command::ZInterStore { dest, keys, weights }
        }),
        1 => (key(), value()).prop_map(|(channel, message)| Command::Publish { channel, message }),
        5 => eval(),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        12 => data_command(),
        2 => keys().prop_map(|keys| Command::Watch { keys }),
        1 => Just(Command::Unwatch),
        1 => Just(Command::Multi),
        1 => Just(Command::Exec),
        1 => Just(Command::Discard),
        1 => Just(Command::Wait { replicas: 0, timeout_ms: 1 }),
        3 => prop::collection::vec(data_command(), 1..4).prop_map(Command::Transaction),
    ]
}

/// One step of a sequence: a command on connection 0 or 1, or both clocks
/// moved forward.
#[derive(Clone, Debug)]
enum Step {
    Run(u8, Command),
    Advance(u64),
}

fn sequence() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        8 => (0u8..2, command()).prop_map(|(conn, command)| Step::Run(conn, command)),
        1 => prop::sample::select(&ADVANCES[..]).prop_map(Step::Advance),
    ];
    prop::collection::vec(step, 1..25)
}

/// A key's type, value and remaining TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dumped {
    Str(String),
    Hash(Vec<(String, String)>),
    Set(Vec<String>),
    ZSet(Vec<(String, i64)>),
}

type Dump = BTreeMap<String, (Dumped, Option<i64>)>;

fn dump_model(ks: &Keyspace, now: Millis) -> Dump {
    ks.live(now)
        .map(|(k, e)| {
            let v = match &e.value {
                Value::Str(s) => Dumped::Str(s.clone()),
                Value::Hash(h) => {
                    Dumped::Hash(h.iter().map(|(f, v)| (f.clone(), v.clone())).collect())
                }
                Value::Set(s) => Dumped::Set(s.iter().cloned().collect()),
                Value::ZSet(z) => {
                    let mut items: Vec<_> = z.iter().map(|(m, s)| (m.clone(), *s)).collect();
                    items.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
                    Dumped::ZSet(items)
                }
            };
            let pttl = e.pttl(now).map(|p| i64::try_from(p).unwrap_or(i64::MAX));
            (k.to_owned(), (v, pttl))
        })
        .collect()
}

async fn dump_real(conn: &mut redis::aio::MultiplexedConnection) -> Dump {
    let mut out = Dump::new();
    let mut names: Vec<String> = raw(conn, redis::cmd("KEYS").arg("*")).await;
    names.sort();
    for k in names {
        let kind: String = raw(conn, redis::cmd("TYPE").arg(&k)).await;
        let v = match kind.as_str() {
            "string" => Dumped::Str(raw(conn, redis::cmd("GET").arg(&k)).await),
            "hash" => {
                let h: BTreeMap<String, String> = raw(conn, redis::cmd("HGETALL").arg(&k)).await;
                Dumped::Hash(h.into_iter().collect())
            }
            "set" => {
                let mut s: Vec<String> = raw(conn, redis::cmd("SMEMBERS").arg(&k)).await;
                s.sort();
                Dumped::Set(s)
            }
            "zset" => Dumped::ZSet(
                raw(
                    conn,
                    redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES"),
                )
                .await,
            ),
            "none" => continue,
            other => panic!("unexpected type {other} of {k}"),
        };
        let pttl: i64 = raw(conn, redis::cmd("PTTL").arg(&k)).await;
        out.insert(k, (v, (pttl >= 0).then_some(pttl)));
    }
    out
}

async fn run_sequence(
    redis: &RedisServer,
    clock: &mut FakeClock,
    sequence: &[Step],
) -> Result<Vec<Reply>, String> {
    let mut now = T0;
    let mut set_clock = |ms: u64| {
        clock
            .set_frozen_ms(ms)
            .map_err(|e| format!("the clock file: {e}"))
    };
    set_clock(now)?;
    let mut replies = Vec::new();
    let admin = &mut redis.conn().await;
    let _: () = raw(admin, &mut redis::cmd("FLUSHALL")).await;
    let mut conns = [redis.conn().await, redis.conn().await];
    let mut model = Keyspace::new();
    for (i, step) in sequence.iter().enumerate() {
        let (conn, command) = match step {
            Step::Advance(ms) => {
                now += ms;
                set_clock(now)?;
                continue;
            }
            Step::Run(conn, command) => (*conn, command),
        };
        let conn_id = ConnId(u32::from(conn));
        if matches!(command, Command::Transaction(_)) && model.in_multi(conn_id) {
            // A pipelined MULTI..EXEC inside an open MULTI: the client library
            // reports the nested MULTI's error instead of EXEC's reply, which
            // says nothing about Redis. Not generated by any protocol.
            continue;
        }
        let real = match wire::execute_reply(&mut conns[usize::from(conn)], command).await {
            Ok(reply) => reply,
            Err(e) => return Err(format!("step {i}: connection error {e}")),
        };
        let expected = model.execute(conn_id, Millis(now), command);
        if real != expected {
            return Err(format!(
                "step {i} on conn {conn}: {command:?}\n  redis: {real:?}\n  model: {expected:?}"
            ));
        }
        replies.push(real);
    }
    let real = dump_real(admin).await;
    let expected = dump_model(&model, Millis(now));
    if real != expected {
        return Err(format!(
            "final state\n  redis: {real:?}\n  model: {expected:?}"
        ));
    }
    Ok(replies)
}

fn cases() -> u32 {
    let default = if in_ci() { 1_000 } else { 100 };
    std::env::var("LOCKWRIGHT_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(if in_ci() { 1_000 } else { 1 })
}

/// A server with a frozen clock at [`T0`], its clock, and a runtime, with
/// every script loaded (so that EVALSHA finds them even when it is queued
/// inside a MULTI, where no NOSCRIPT fallback is possible); or `None` after
/// a loud skip outside CI.
fn frozen_redis_or_skip(test: &str) -> Option<(RedisServer, FakeClock, tokio::runtime::Runtime)> {
    let library = libfaketime_or_skip(test)?;
    let mut clock = FakeClock::frozen().expect("a clock file");
    clock.set_frozen_ms(T0).expect("a clock file");
    let redis = match RedisServer::start_frozen(library, &clock) {
        Ok(redis) => redis,
        Err(reason) if in_ci() => {
            panic!("{test}: a libc-malloc redis-server is required under CI: {reason}")
        }
        Err(reason) => {
            eprintln!("\n*** SKIPPED {test}: no libc-malloc redis-server: {reason} ***\n");
            return None;
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut admin = rt.block_on(redis.conn());
    for script in Script::ALL {
        let _: String = rt.block_on(raw(
            &mut admin,
            redis::cmd("SCRIPT").arg("LOAD").arg(script.lua()),
        ));
    }
    Some((redis, clock, rt))
}

#[test]
fn the_keyspace_model_gives_the_same_replies_and_state_as_redis() {
    let Some((redis, clock, rt)) = frozen_redis_or_skip("conformance") else {
        return;
    };
    let mut runner = TestRunner::new(PropConfig {
        cases: cases(),
        failure_persistence: None,
        ..PropConfig::default()
    });
    // The runner takes a `Fn`; each case has the clock to itself.
    let clock = std::cell::RefCell::new(clock);
    let result = runner.run(&sequence(), |seq| {
        rt.block_on(run_sequence(&redis, &mut clock.borrow_mut(), &seq))
            .map(drop)
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("the keyspace model diverges from Redis: {e}");
    }
}

/// The clock is exact: a key set with `PX 1` is live at its deadline and
/// gone a millisecond later, and a permit of a 1 ms lease is kept by a
/// renewal at its deadline and pruned by one after it, in Redis and in the
/// model alike. A model whose keys expired at the deadline
/// (`now >= deadline`) fails here and in the random sequences above; with
/// the unfrozen clock these tests had before, neither could tell.
#[test]
fn expiry_is_compared_to_the_millisecond() {
    let Some((redis, clock, rt)) = frozen_redis_or_skip("conformance at the deadline") else {
        return;
    };
    let mut clock = clock;
    let get = |key: &str| {
        Step::Run(
            0,
            Command::Get {
                key: key.to_owned(),
            },
        )
    };
    let permits = || "{k}:b".to_owned();
    let renew = |ttl: &str| {
        Step::Run(
            1,
            Command::Eval {
                script: Script::LeaseRenew,
                keys: vec![permits()],
                args: vec!["t2".to_owned(), ttl.to_owned()],
            },
        )
    };
    let sequence = vec![
        Step::Run(
            0,
            Command::Set {
                key: "{k}".to_owned(),
                value: "t1".to_owned(),
                condition: SetCondition::Always,
                expiry: SetExpiry::Px(1),
                get: false,
            },
        ),
        Step::Run(
            1,
            Command::Eval {
                script: Script::LeaseAcquire,
                keys: vec![permits(), "{k}:a".to_owned(), "{k}:limit".to_owned()],
                args: vec!["t2".to_owned(), "1".to_owned(), "2".to_owned()],
            },
        ),
        Step::Advance(1),
        get("{k}"),
        Step::Run(
            0,
            Command::ZScore {
                key: permits(),
                member: "t2".to_owned(),
            },
        ),
        // At its deadline the permit is kept (pruned below `now` only):
        // renewed, to a deadline 1 ms later.
        renew("1"),
        Step::Advance(1),
        get("{k}"),
        // Past its deadline the renewal prunes the permit first.
        Step::Advance(2),
        renew("100000"),
    ];
    let replies = rt
        .block_on(run_sequence(&redis, &mut clock, &sequence))
        .unwrap_or_else(|e| panic!("the keyspace model diverges from Redis: {e}"));
    let bulk = |s: &str| Reply::Bulk(s.to_owned());
    assert_eq!(
        replies,
        [
            Reply::ok(),
            Reply::Int(1),
            bulk("t1"),
            bulk(&(T0 + 1).to_string()),
            Reply::Int(1),
            Reply::Nil,
            Reply::Int(0),
        ],
        "Redis' replies at the deadline and a millisecond after it"
    );
}

/// Redis 7 appends ` script: <sha1>, on @user_script:<line>.` to an error
/// raised inside a script, at the line of the `redis.call` that raised it
/// (here the fence's `INCR` on line 4 of `fenced-acquire`, against a
/// string that is not a number); the keyspace model replies the same.
/// (The random sequences above compare every script error exactly too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_errors_carry_redis_suffix() {
    let Some(redis) = lockwright_tests::redis_or_skip("script error suffix") else {
        return;
    };
    let mut conn = redis.conn().await;
    let _: () = raw(&mut conn, redis::cmd("SET").arg("{k}:b").arg("t1")).await;
    let command = Command::Eval {
        script: Script::FencedAcquire,
        keys: vec!["{k}".into(), "{k}:b".into()],
        args: vec!["t1".into(), "100000".into()],
    };
    let real = wire::execute_reply(&mut conn, &command)
        .await
        .expect("a reply");
    let mut model = Keyspace::new();
    model.execute(
        ConnId(0),
        Millis(0),
        &Command::Set {
            key: "{k}:b".into(),
            value: "t1".into(),
            condition: SetCondition::Always,
            expiry: SetExpiry::None,
            get: false,
        },
    );
    let expected = model.execute(ConnId(0), Millis(0), &command);
    assert_eq!(real, expected);
}

/// A missing `KEYS[i]` or `ARGV[i]` is nil in Lua, and Redis raises it at
/// the line where it first reaches a `redis.call` (past any `or` that
/// short-circuits): every catalogue script, with every prefix of its keys
/// and several argument lists, on an empty key, a hash and a string. Where
/// either side answers with an error, the two errors must be the same text,
/// line included. (Successful replies may read the clock, which this
/// server does not share with the model; the sequences above compare them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_script_arguments_are_raised_at_redis_line() {
    let Some(redis) = lockwright_tests::redis_or_skip("missing script arguments") else {
        return;
    };
    let mut conn = redis.conn().await;
    let keys_of = |n: usize| KEYS[..n].iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let arg_lists: [&[&str]; 5] = [
        &[],
        &["100"],
        &["100", "t1"],
        &["t1", "100"],
        &["t1", "100", "2"],
    ];
    let mut errors = 0;
    for script in Script::ALL {
        for n in 0..=KEYS.len() {
            for args in arg_lists {
                for before in ["none", "hash", "string"] {
                    let _: () = raw(&mut conn, &mut redis::cmd("FLUSHALL")).await;
                    let mut model = Keyspace::new();
                    let setup = match before {
                        "hash" => Some(Command::HIncrBy {
                            key: KEYS[0].into(),
                            field: "t1".into(),
                            by: 1,
                        }),
                        "string" => Some(Command::Set {
                            key: KEYS[0].into(),
                            value: "x".into(),
                            condition: SetCondition::Always,
                            expiry: SetExpiry::None,
                            get: false,
                        }),
                        _ => None,
                    };
                    if let Some(setup) = &setup {
                        wire::execute_reply(&mut conn, setup)
                            .await
                            .expect("a reply");
                        model.execute(ConnId(0), Millis(T0), setup);
                    }
                    let command = Command::Eval {
                        script,
                        keys: keys_of(n),
                        args: args.iter().map(|a| a.to_string()).collect(),
                    };
                    let real = wire::execute_reply(&mut conn, &command)
                        .await
                        .expect("a reply");
                    let expected = model.execute(ConnId(0), Millis(T0), &command);
                    if matches!(real, Reply::Error(_)) || matches!(expected, Reply::Error(_)) {
                        errors += 1;
                        assert_eq!(
                            real,
                            expected,
                            "{} with {n} keys, args {args:?}, key {before}",
                            script.name()
                        );
                    }
                }
            }
        }
    }
    assert!(errors > 100, "only {errors} cases raised an error");
}
