//! The keyspace model against Redis 7's documented (and observed) replies:
//! every command, the expiry edge, WRONGTYPE paths, WATCH/MULTI/EXEC and
//! every script's paths.

use lockwright_core::keyspace::{
    Command, ConnId, Keyspace, Reply, ScoreBound, Script, SetCondition, SetExpiry, Value, WRONGTYPE,
};
use lockwright_core::Millis;
use proptest::prelude::*;

const A: ConnId = ConnId(1);
const B: ConnId = ConnId(2);

fn s(x: &str) -> String {
    x.to_owned()
}

fn strs(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|x| s(x)).collect()
}

fn bulk(x: &str) -> Reply {
    Reply::Bulk(s(x))
}

fn err(x: &str) -> Reply {
    Reply::Error(s(x))
}

fn wrongtype() -> Reply {
    err(WRONGTYPE)
}

/// `error` raised inside `script` at `line` of its Lua source, with the
/// location Redis 7 appends (the lines are read off [`Script::lua`]).
fn raised(script: Script, line: u32, error: Reply) -> Reply {
    match error {
        Reply::Error(text) => Reply::Error(format!(
            "{text} script: {}, on @user_script:{line}.",
            script.sha1()
        )),
        other => panic!("not an error: {other:?}"),
    }
}

fn status(x: &str) -> Reply {
    Reply::Status(s(x).into())
}

fn set(key: &str, value: &str) -> Command {
    set_with(key, value, SetCondition::Always, SetExpiry::None, false)
}

fn set_with(
    key: &str,
    value: &str,
    condition: SetCondition,
    expiry: SetExpiry,
    get: bool,
) -> Command {
    Command::Set {
        key: s(key),
        value: s(value),
        condition,
        expiry,
        get,
    }
}

fn set_px(key: &str, value: &str, ms: u64) -> Command {
    set_with(key, value, SetCondition::Always, SetExpiry::Px(ms), false)
}

fn get(key: &str) -> Command {
    Command::Get { key: s(key) }
}

fn del(keys: &[&str]) -> Command {
    Command::Del { keys: strs(keys) }
}

fn pttl(key: &str) -> Command {
    Command::PTtl { key: s(key) }
}

fn ttl(key: &str) -> Command {
    Command::Ttl { key: s(key) }
}

fn watch(keys: &[&str]) -> Command {
    Command::Watch { keys: strs(keys) }
}

fn hset(key: &str, field: &str) -> Command {
    Command::HIncrBy {
        key: s(key),
        field: s(field),
        by: 1,
    }
}

fn sadd(key: &str, members: &[&str]) -> Command {
    Command::SAdd {
        key: s(key),
        members: strs(members),
    }
}

fn zadd(key: &str, members: &[(i64, &str)]) -> Command {
    Command::ZAdd {
        key: s(key),
        members: members.iter().map(|(sc, m)| (*sc, s(m))).collect(),
    }
}

fn eval(script: Script, keys: &[&str], args: &[&str]) -> Command {
    Command::Eval {
        script,
        keys: strs(keys),
        args: strs(args),
    }
}

/// A keyspace driven at an explicit node time.
struct Node {
    ks: Keyspace,
    now: u64,
}

impl Node {
    fn new() -> Node {
        Node {
            ks: Keyspace::new(),
            now: 1_000,
        }
    }
    fn on(&mut self, conn: ConnId, c: Command) -> Reply {
        self.ks.execute(conn, Millis(self.now), &c)
    }
    fn run(&mut self, c: Command) -> Reply {
        self.on(A, c)
    }
    fn at(&mut self, now: u64) -> &mut Node {
        self.now = now;
        self
    }
}

// ---------------------------------------------------------------- strings

#[test]
fn set_and_get() {
    let mut n = Node::new();
    assert_eq!(n.run(get("k")), Reply::Nil);
    assert_eq!(n.run(set("k", "v")), Reply::ok());
    assert_eq!(n.run(get("k")), bulk("v"));
    assert_eq!(n.run(set("k", "w")), Reply::ok());
    assert_eq!(n.run(get("k")), bulk("w"));
}

#[test]
fn set_nx_and_xx_conditions() {
    let mut n = Node::new();
    let nx = |v| set_with("k", v, SetCondition::Nx, SetExpiry::None, false);
    let xx = |v| set_with("k", v, SetCondition::Xx, SetExpiry::None, false);
    assert_eq!(n.run(xx("a")), Reply::Nil);
    assert_eq!(n.run(get("k")), Reply::Nil);
    assert_eq!(n.run(nx("b")), Reply::ok());
    assert_eq!(n.run(nx("c")), Reply::Nil);
    assert_eq!(n.run(get("k")), bulk("b"));
    assert_eq!(n.run(xx("d")), Reply::ok());
    assert_eq!(n.run(get("k")), bulk("d"));
}

#[test]
fn set_overwrites_any_type_without_get() {
    let mut n = Node::new();
    n.run(hset("h", "f"));
    assert_eq!(n.run(set("h", "v")), Reply::ok());
    assert_eq!(n.run(get("h")), bulk("v"));
}

#[test]
fn set_get_replies_old_value_and_refuses_non_strings() {
    let mut n = Node::new();
    let set_get = |c, v| set_with("k", v, c, SetExpiry::None, true);
    assert_eq!(n.run(set_get(SetCondition::Always, "a")), Reply::Nil);
    assert_eq!(n.run(set_get(SetCondition::Always, "b")), bulk("a"));
    // NX GET on an existing key: the old value, and nothing written.
    assert_eq!(n.run(set_get(SetCondition::Nx, "c")), bulk("b"));
    assert_eq!(n.run(get("k")), bulk("b"));
    // XX GET on a missing key: nil, nothing written.
    let xx = set_with("m", "x", SetCondition::Xx, SetExpiry::None, true);
    assert_eq!(n.run(xx), Reply::Nil);
    assert_eq!(n.run(get("m")), Reply::Nil);
    n.run(hset("h", "f"));
    for c in [SetCondition::Always, SetCondition::Nx, SetCondition::Xx] {
        assert_eq!(
            n.run(set_with("h", "x", c, SetExpiry::None, true)),
            wrongtype()
        );
    }
    assert_eq!(
        n.run(Command::HGet {
            key: s("h"),
            field: s("f")
        }),
        bulk("1")
    );
}

#[test]
fn set_px_sets_a_relative_deadline_and_pxat_an_absolute_one() {
    let mut n = Node::new();
    n.run(set_px("k", "v", 30));
    assert_eq!(n.ks.get_entry("k").unwrap().expires_at, Some(1_030));
    assert_eq!(n.run(pttl("k")), Reply::Int(30));
    let pxat = set_with(
        "j",
        "v",
        SetCondition::Always,
        SetExpiry::PxAt(5_000),
        false,
    );
    assert_eq!(n.run(pxat), Reply::ok());
    assert_eq!(n.run(pttl("j")), Reply::Int(4_000));
}

#[test]
fn pxat_in_the_past_sets_an_expired_key() {
    let mut n = Node::new();
    let pxat = set_with("k", "v", SetCondition::Always, SetExpiry::PxAt(10), false);
    assert_eq!(n.run(pxat), Reply::ok());
    assert_eq!(n.run(get("k")), Reply::Nil);
}

#[test]
fn plain_set_clears_the_ttl() {
    let mut n = Node::new();
    n.run(set_px("k", "v", 30));
    n.run(set("k", "w"));
    assert_eq!(n.run(pttl("k")), Reply::Int(-1));
}

#[test]
fn set_rejects_invalid_expire_times() {
    let mut n = Node::new();
    let invalid = err("ERR invalid expire time in 'set' command");
    assert_eq!(n.run(set_px("k", "v", 0)), invalid);
    let pxat0 = set_with("k", "v", SetCondition::Always, SetExpiry::PxAt(0), false);
    assert_eq!(n.run(pxat0), invalid);
    // now + ms overflows a signed 64-bit deadline.
    assert_eq!(n.run(set_px("k", "v", i64::MAX as u64)), invalid);
    // Not representable as a Redis integer at all.
    assert_eq!(
        n.run(set_px("k", "v", u64::MAX)),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(n.run(get("k")), Reply::Nil);
}

#[test]
fn expiry_edge_deadline_is_still_live_one_ms_later_is_gone() {
    let mut n = Node::new();
    n.run(set_px("k", "v", 30)); // deadline 1_030
    assert_eq!(n.at(1_030).run(get("k")), bulk("v"));
    assert_eq!(n.run(pttl("k")), Reply::Int(0));
    assert_eq!(n.run(ttl("k")), Reply::Int(0));
    assert_eq!(n.at(1_031).run(get("k")), Reply::Nil);
    assert_eq!(n.run(pttl("k")), Reply::Int(-2));
    assert_eq!(
        n.ks.get_entry("k"),
        None,
        "GET deleted the expired key lazily"
    );
}

#[test]
fn setnx_replies_integers_and_sets_no_ttl() {
    let mut n = Node::new();
    let setnx = |v: &str| Command::SetNx {
        key: s("k"),
        value: s(v),
    };
    assert_eq!(n.run(setnx("a")), Reply::Int(1));
    assert_eq!(n.run(setnx("b")), Reply::Int(0));
    assert_eq!(n.run(get("k")), bulk("a"));
    assert_eq!(n.run(pttl("k")), Reply::Int(-1));
    // An expired key counts as missing.
    n.run(set_px("e", "old", 5));
    let setnx_e = Command::SetNx {
        key: s("e"),
        value: s("new"),
    };
    assert_eq!(n.at(1_006).run(setnx_e), Reply::Int(1));
}

#[test]
fn getset_replies_old_value_and_clears_ttl() {
    let mut n = Node::new();
    let getset = |k: &str, v: &str| Command::GetSet {
        key: s(k),
        value: s(v),
    };
    assert_eq!(n.run(getset("k", "a")), Reply::Nil);
    n.run(set_px("k", "b", 100));
    assert_eq!(n.run(getset("k", "c")), bulk("b"));
    assert_eq!(n.run(pttl("k")), Reply::Int(-1));
    n.run(sadd("s", &["m"]));
    assert_eq!(n.run(getset("s", "x")), wrongtype());
}

#[test]
fn del_and_exists_count_live_keys_with_duplicates() {
    let mut n = Node::new();
    n.run(set("a", "1"));
    n.run(set_px("b", "1", 5));
    let exists = |keys: &[&str]| Command::Exists { keys: strs(keys) };
    assert_eq!(n.run(exists(&["a", "a", "b", "c"])), Reply::Int(3));
    n.at(1_006);
    assert_eq!(n.run(exists(&["a", "b"])), Reply::Int(1));
    assert_eq!(n.run(del(&["a", "a", "b", "c"])), Reply::Int(1));
    assert_eq!(n.run(exists(&["a"])), Reply::Int(0));
}

#[test]
fn expire_and_pexpire() {
    let mut n = Node::new();
    let expire = |k: &str, seconds| Command::Expire { key: s(k), seconds };
    let pexpire = |k: &str, millis| Command::PExpire { key: s(k), millis };
    assert_eq!(n.run(expire("k", 10)), Reply::Int(0));
    n.run(set("k", "v"));
    assert_eq!(n.run(expire("k", 10)), Reply::Int(1));
    assert_eq!(n.run(pttl("k")), Reply::Int(10_000));
    assert_eq!(n.run(pexpire("k", 250)), Reply::Int(1));
    assert_eq!(n.run(pttl("k")), Reply::Int(250));
    // Non-positive: delete, reply 1 because it existed.
    assert_eq!(n.run(pexpire("k", 0)), Reply::Int(1));
    assert_eq!(n.run(get("k")), Reply::Nil);
    n.run(set("k", "v"));
    assert_eq!(n.run(expire("k", -1)), Reply::Int(1));
    assert_eq!(n.run(Command::Exists { keys: strs(&["k"]) }), Reply::Int(0));
    // An expired key counts as missing.
    n.run(set_px("k", "v", 5));
    assert_eq!(n.at(1_006).run(pexpire("k", 100)), Reply::Int(0));
}

#[test]
fn expire_overflow_is_an_invalid_expire_time() {
    let mut n = Node::new();
    n.run(set("k", "v"));
    assert_eq!(
        n.run(Command::Expire {
            key: s("k"),
            seconds: i64::MAX
        }),
        err("ERR invalid expire time in 'expire' command")
    );
    assert_eq!(
        n.run(Command::PExpire {
            key: s("k"),
            millis: i64::MAX
        }),
        err("ERR invalid expire time in 'pexpire' command")
    );
    // Checked before the key is looked up.
    assert_eq!(
        n.run(Command::Expire {
            key: s("missing"),
            seconds: i64::MAX / 1000 + 1
        }),
        err("ERR invalid expire time in 'expire' command")
    );
    assert_eq!(n.run(pttl("k")), Reply::Int(-1));
}

#[test]
fn ttl_and_pttl_report_missing_persistent_and_rounded_remaining_time() {
    let mut n = Node::new();
    assert_eq!(n.run(ttl("k")), Reply::Int(-2));
    n.run(set("k", "v"));
    assert_eq!(n.run(ttl("k")), Reply::Int(-1));
    assert_eq!(n.run(pttl("k")), Reply::Int(-1));
    for (ms, secs) in [(499, 0), (500, 1), (1_499, 1), (1_500, 2), (10_000, 10)] {
        n.run(set_px("k", "v", ms));
        assert_eq!(n.run(ttl("k")), Reply::Int(secs), "pttl {ms}");
        assert_eq!(n.run(pttl("k")), Reply::Int(ms as i64));
    }
}

#[test]
fn incr_starts_at_zero_keeps_ttl_and_checks_integers() {
    let mut n = Node::new();
    let incr = |k: &str| Command::Incr { key: s(k) };
    assert_eq!(n.run(incr("c")), Reply::Int(1));
    assert_eq!(n.run(incr("c")), Reply::Int(2));
    assert_eq!(n.run(get("c")), bulk("2"));
    n.run(set_px("t", "41", 100));
    assert_eq!(n.run(incr("t")), Reply::Int(42));
    assert_eq!(n.run(pttl("t")), Reply::Int(100));
    let not_int = err("ERR value is not an integer or out of range");
    for bad in ["x", "007", "+1", "-0", " 1", "1.5", ""] {
        n.run(set("b", bad));
        assert_eq!(n.run(incr("b")), not_int, "{bad:?}");
    }
    n.run(set("m", &i64::MAX.to_string()));
    assert_eq!(
        n.run(incr("m")),
        err("ERR increment or decrement would overflow")
    );
    n.run(set("neg", "-5"));
    assert_eq!(n.run(incr("neg")), Reply::Int(-4));
    n.run(sadd("s", &["a"]));
    assert_eq!(n.run(incr("s")), wrongtype());
    // After expiry, INCR starts over without a TTL.
    assert_eq!(n.at(1_101).run(incr("t")), Reply::Int(1));
    assert_eq!(n.run(pttl("t")), Reply::Int(-1));
}

#[test]
fn get_on_non_string_is_wrongtype() {
    let mut n = Node::new();
    n.run(zadd("z", &[(1, "a")]));
    assert_eq!(n.run(get("z")), wrongtype());
}

// ---------------------------------------------------------------- hashes

#[test]
fn hash_commands() {
    let mut n = Node::new();
    let hincrby = |f: &str, by| Command::HIncrBy {
        key: s("h"),
        field: s(f),
        by,
    };
    let hexists = |f: &str| Command::HExists {
        key: s("h"),
        field: s(f),
    };
    let hget = |f: &str| Command::HGet {
        key: s("h"),
        field: s(f),
    };
    assert_eq!(n.run(hexists("a")), Reply::Int(0));
    assert_eq!(n.run(hget("a")), Reply::Nil);
    assert_eq!(n.run(hincrby("a", 5)), Reply::Int(5));
    assert_eq!(n.run(hincrby("a", -7)), Reply::Int(-2));
    assert_eq!(n.run(hincrby("b", 1)), Reply::Int(1));
    assert_eq!(n.run(hexists("a")), Reply::Int(1));
    assert_eq!(n.run(hget("a")), bulk("-2"));
    let hdel = |fields: &[&str]| Command::HDel {
        key: s("h"),
        fields: strs(fields),
    };
    assert_eq!(n.run(hdel(&["a", "zz"])), Reply::Int(1));
    assert_eq!(n.run(hdel(&["b"])), Reply::Int(1));
    assert_eq!(n.ks.get_entry("h"), None, "an empty hash is deleted");
    assert_eq!(n.run(hdel(&["b"])), Reply::Int(0));
}

#[test]
fn hincrby_overflow_keeps_the_old_value() {
    let mut n = Node::new();
    let hincrby = |by| Command::HIncrBy {
        key: s("h"),
        field: s("f"),
        by,
    };
    n.run(hincrby(i64::MAX));
    assert_eq!(
        n.run(hincrby(1)),
        err("ERR increment or decrement would overflow")
    );
    assert_eq!(
        n.run(Command::HGet {
            key: s("h"),
            field: s("f")
        }),
        bulk(&i64::MAX.to_string())
    );
}

#[test]
fn hincrby_keeps_the_ttl() {
    let mut n = Node::new();
    n.run(hset("h", "f"));
    n.run(Command::PExpire {
        key: s("h"),
        millis: 50,
    });
    n.run(hset("h", "f"));
    assert_eq!(n.run(pttl("h")), Reply::Int(50));
}

#[test]
fn hash_commands_on_a_string_are_wrongtype() {
    let mut n = Node::new();
    n.run(set("k", "v"));
    assert_eq!(n.run(hset("k", "f")), wrongtype());
    assert_eq!(
        n.run(Command::HExists {
            key: s("k"),
            field: s("f")
        }),
        wrongtype()
    );
    assert_eq!(
        n.run(Command::HGet {
            key: s("k"),
            field: s("f")
        }),
        wrongtype()
    );
    assert_eq!(
        n.run(Command::HDel {
            key: s("k"),
            fields: strs(&["f"])
        }),
        wrongtype()
    );
}

// ---------------------------------------------------------------- sets

#[test]
fn set_commands() {
    let mut n = Node::new();
    let scard = || Command::SCard { key: s("s") };
    let sismember = |m: &str| Command::SIsMember {
        key: s("s"),
        member: s(m),
    };
    let srem = |ms: &[&str]| Command::SRem {
        key: s("s"),
        members: strs(ms),
    };
    assert_eq!(n.run(scard()), Reply::Int(0));
    assert_eq!(n.run(sadd("s", &["a", "b", "a"])), Reply::Int(2));
    assert_eq!(n.run(sadd("s", &["b", "c"])), Reply::Int(1));
    assert_eq!(n.run(scard()), Reply::Int(3));
    assert_eq!(n.run(sismember("a")), Reply::Int(1));
    assert_eq!(n.run(sismember("z")), Reply::Int(0));
    assert_eq!(n.run(srem(&["a", "z"])), Reply::Int(1));
    assert_eq!(n.run(srem(&["b", "c"])), Reply::Int(2));
    assert_eq!(n.ks.get_entry("s"), None, "an empty set is deleted");
    n.run(set("k", "v"));
    assert_eq!(n.run(sadd("k", &["a"])), wrongtype());
    assert_eq!(n.run(Command::SCard { key: s("k") }), wrongtype());
}

// ---------------------------------------------------------------- sorted sets

#[test]
fn zadd_counts_new_members_and_updates_scores() {
    let mut n = Node::new();
    assert_eq!(n.run(zadd("z", &[(5, "a"), (3, "b")])), Reply::Int(2));
    assert_eq!(n.run(zadd("z", &[(1, "a"), (7, "c")])), Reply::Int(1));
    let zscore = |m: &str| Command::ZScore {
        key: s("z"),
        member: s(m),
    };
    assert_eq!(n.run(zscore("a")), bulk("1"));
    assert_eq!(n.run(zscore("x")), Reply::Nil);
    assert_eq!(n.run(Command::ZCard { key: s("z") }), Reply::Int(3));
    // Duplicates in one call: counted once, the last score wins.
    assert_eq!(n.run(zadd("y", &[(1, "m"), (-4, "m")])), Reply::Int(1));
    assert_eq!(
        n.run(Command::ZScore {
            key: s("y"),
            member: s("m")
        }),
        bulk("-4")
    );
}

#[test]
fn zrank_orders_by_score_then_member() {
    let mut n = Node::new();
    n.run(zadd("z", &[(2, "a"), (1, "c"), (1, "b"), (0, "d")]));
    let zrank = |m: &str| Command::ZRank {
        key: s("z"),
        member: s(m),
    };
    assert_eq!(n.run(zrank("d")), Reply::Int(0));
    assert_eq!(n.run(zrank("b")), Reply::Int(1));
    assert_eq!(n.run(zrank("c")), Reply::Int(2));
    assert_eq!(n.run(zrank("a")), Reply::Int(3));
    assert_eq!(n.run(zrank("x")), Reply::Nil);
    assert_eq!(
        n.run(Command::ZRank {
            key: s("none"),
            member: s("a")
        }),
        Reply::Nil
    );
}

#[test]
fn zrem_and_zremrangebyscore_delete_empty_sets() {
    let mut n = Node::new();
    n.run(zadd("z", &[(1, "a"), (2, "b"), (3, "c"), (4, "d")]));
    let range = |min, max| Command::ZRemRangeByScore {
        key: s("z"),
        min,
        max,
    };
    assert_eq!(
        n.run(range(ScoreBound::Exclusive(1), ScoreBound::Inclusive(3))),
        Reply::Int(2)
    );
    assert_eq!(
        n.run(range(ScoreBound::Inclusive(5), ScoreBound::Inclusive(1))),
        Reply::Int(0)
    );
    assert_eq!(
        n.run(range(ScoreBound::NegInf, ScoreBound::Exclusive(4))),
        Reply::Int(1)
    );
    assert_eq!(
        n.run(Command::ZRem {
            key: s("z"),
            members: strs(&["d", "x"])
        }),
        Reply::Int(1)
    );
    assert_eq!(n.ks.get_entry("z"), None);
    n.run(zadd("z", &[(1, "a")]));
    assert_eq!(
        n.run(range(ScoreBound::NegInf, ScoreBound::PosInf)),
        Reply::Int(1)
    );
    assert_eq!(n.ks.get_entry("z"), None);
}

#[test]
fn zset_commands_on_a_hash_are_wrongtype() {
    let mut n = Node::new();
    n.run(hset("h", "f"));
    assert_eq!(n.run(zadd("h", &[(1, "a")])), wrongtype());
    assert_eq!(n.run(Command::ZCard { key: s("h") }), wrongtype());
    assert_eq!(
        n.run(Command::ZRank {
            key: s("h"),
            member: s("a")
        }),
        wrongtype()
    );
    assert_eq!(
        n.run(Command::ZRemRangeByScore {
            key: s("h"),
            min: ScoreBound::NegInf,
            max: ScoreBound::PosInf
        }),
        wrongtype()
    );
}

fn zinterstore(dest: &str, keys: &[&str], weights: &[i64]) -> Command {
    Command::ZInterStore {
        dest: s(dest),
        keys: strs(keys),
        weights: weights.to_vec(),
    }
}

#[test]
fn zinterstore_sums_weighted_scores_and_counts_sets_as_score_one() {
    let mut n = Node::new();
    n.run(zadd("owners", &[(10, "a"), (20, "b"), (30, "c")]));
    n.run(zadd("counter", &[(1, "a"), (2, "b"), (3, "d")]));
    n.run(sadd("holders", &["a", "b", "c"]));
    n.run(set("dest", "old string"));
    assert_eq!(
        n.run(zinterstore(
            "dest",
            &["owners", "counter", "holders"],
            &[0, 1, 5]
        )),
        Reply::Int(2)
    );
    let entry = n.ks.get_entry("dest").unwrap();
    assert_eq!(
        entry.value,
        Value::ZSet([(s("a"), 6), (s("b"), 7)].into_iter().collect())
    );
    // Without WEIGHTS every weight is 1.
    assert_eq!(
        n.run(zinterstore("d2", &["owners", "holders"], &[])),
        Reply::Int(3)
    );
    assert_eq!(
        n.run(Command::ZScore {
            key: s("d2"),
            member: s("c")
        }),
        bulk("31")
    );
}

#[test]
fn zinterstore_with_a_missing_source_deletes_the_destination() {
    let mut n = Node::new();
    n.run(zadd("z", &[(1, "a")]));
    n.run(zadd("dest", &[(1, "x")]));
    assert_eq!(
        n.run(zinterstore("dest", &["z", "missing"], &[1, 1])),
        Reply::Int(0)
    );
    assert_eq!(n.ks.get_entry("dest"), None);
    // The destination may be a source.
    assert_eq!(n.run(zinterstore("z", &["z"], &[3])), Reply::Int(1));
    assert_eq!(
        n.run(Command::ZScore {
            key: s("z"),
            member: s("a")
        }),
        bulk("3")
    );
}

#[test]
fn zinterstore_errors() {
    let mut n = Node::new();
    n.run(zadd("z", &[(1, "a")]));
    n.run(set("str", "v"));
    assert_eq!(n.run(zinterstore("d", &["z", "str"], &[1, 1])), wrongtype());
    // WRONGTYPE is found before a bad WEIGHTS clause.
    assert_eq!(n.run(zinterstore("d", &["z", "str"], &[1])), wrongtype());
    assert_eq!(
        n.run(zinterstore("d", &["z", "z"], &[1])),
        err("ERR syntax error")
    );
    assert_eq!(
        n.run(zinterstore("d", &[], &[])),
        err("ERR wrong number of arguments for 'zinterstore' command")
    );
    assert_eq!(
        n.run(zinterstore("d", &[], &[1])),
        err("ERR at least 1 input key is needed for 'zinterstore' command")
    );
    assert_eq!(n.ks.get_entry("d"), None);
}

// ---------------------------------------------------------------- misc

#[test]
fn time_publish_and_wait() {
    let mut n = Node::new();
    assert_eq!(
        n.at(1_700_000_123_456).run(Command::Time),
        Reply::Array(vec![bulk("1700000123"), bulk("456000")])
    );
    assert_eq!(
        n.run(Command::Publish {
            channel: s("c"),
            message: s("m")
        }),
        Reply::Int(0)
    );
    assert_eq!(
        n.run(Command::Wait {
            replicas: 1,
            timeout_ms: 10
        }),
        Reply::Int(0)
    );
}

#[test]
fn empty_argument_lists_are_arity_errors() {
    let mut n = Node::new();
    let cases = [
        (del(&[]), "del"),
        (Command::Exists { keys: vec![] }, "exists"),
        (watch(&[]), "watch"),
        (
            Command::HDel {
                key: s("h"),
                fields: vec![],
            },
            "hdel",
        ),
        (sadd("s", &[]), "sadd"),
        (
            Command::SRem {
                key: s("s"),
                members: vec![],
            },
            "srem",
        ),
        (zadd("z", &[]), "zadd"),
        (
            Command::ZRem {
                key: s("z"),
                members: vec![],
            },
            "zrem",
        ),
    ];
    for (command, name) in cases {
        assert_eq!(
            n.run(command),
            Reply::Error(format!(
                "ERR wrong number of arguments for '{name}' command"
            ))
        );
    }
}

// ---------------------------------------------------------------- MULTI / EXEC

#[test]
fn multi_queues_and_exec_runs_in_order() {
    let mut n = Node::new();
    assert_eq!(n.run(Command::Multi), Reply::ok());
    assert!(n.ks.in_multi(A));
    assert_eq!(n.run(set("k", "1")), status("QUEUED"));
    assert_eq!(n.run(Command::Incr { key: s("k") }), status("QUEUED"));
    assert_eq!(n.run(hset("k", "f")), status("QUEUED"));
    // Another connection does not see the queued writes yet.
    assert_eq!(n.on(B, get("k")), Reply::Nil);
    assert_eq!(
        n.run(Command::Exec),
        Reply::Array(vec![Reply::ok(), Reply::Int(2), wrongtype()])
    );
    assert!(!n.ks.in_multi(A));
    assert_eq!(n.on(B, get("k")), bulk("2"));
}

#[test]
fn exec_and_discard_without_multi_are_errors() {
    let mut n = Node::new();
    assert_eq!(n.run(Command::Exec), err("ERR EXEC without MULTI"));
    assert_eq!(n.run(Command::Discard), err("ERR DISCARD without MULTI"));
}

#[test]
fn nested_multi_and_watch_inside_multi_are_errors_that_keep_the_transaction() {
    let mut n = Node::new();
    n.run(Command::Multi);
    assert_eq!(
        n.run(Command::Multi),
        err("ERR MULTI calls can not be nested")
    );
    assert_eq!(
        n.run(watch(&["k"])),
        err("ERR WATCH inside MULTI is not allowed")
    );
    n.run(set("k", "v"));
    assert_eq!(n.run(Command::Exec), Reply::Array(vec![Reply::ok()]));
}

#[test]
fn a_command_rejected_while_queueing_aborts_exec() {
    let mut n = Node::new();
    n.run(Command::Multi);
    n.run(set("k", "v"));
    assert_eq!(
        n.run(del(&[])),
        err("ERR wrong number of arguments for 'del' command")
    );
    assert_eq!(
        n.run(Command::Exec),
        err("EXECABORT Transaction discarded because of previous errors.")
    );
    assert_eq!(n.run(get("k")), Reply::Nil);
    assert!(!n.ks.in_multi(A));
}

#[test]
fn discard_drops_the_queue() {
    let mut n = Node::new();
    n.run(Command::Multi);
    n.run(set("k", "v"));
    assert_eq!(n.run(Command::Discard), Reply::ok());
    assert_eq!(n.run(get("k")), Reply::Nil);
    assert_eq!(n.ks, Keyspace::new());
}

#[test]
fn unwatch_inside_multi_is_queued() {
    let mut n = Node::new();
    n.run(Command::Multi);
    assert_eq!(n.run(Command::Unwatch), status("QUEUED"));
    assert_eq!(n.run(Command::Exec), Reply::Array(vec![Reply::ok()]));
}

#[test]
fn transaction_is_multi_commands_exec() {
    let mut n = Node::new();
    let t = Command::Transaction(vec![set("k", "1"), Command::Incr { key: s("k") }]);
    assert_eq!(n.run(t), Reply::Array(vec![Reply::ok(), Reply::Int(2)]));
    assert!(!n.ks.in_multi(A));
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Array(vec![]));
    let rejected = Command::Transaction(vec![set("k", "9"), del(&[])]);
    assert_eq!(
        n.run(rejected),
        err("EXECABORT Transaction discarded because of previous errors.")
    );
    assert_eq!(n.run(get("k")), bulk("2"));
}

// ---------------------------------------------------------------- WATCH

/// WATCH k on A, then `meanwhile` on B, then A's transaction: did it run?
fn watched_exec_runs(setup: &[Command], meanwhile: &[Command], exec_at: u64) -> bool {
    let mut n = Node::new();
    for c in setup {
        n.on(B, c.clone());
    }
    n.run(watch(&["k"]));
    for c in meanwhile {
        n.on(B, c.clone());
    }
    let reply = n
        .at(exec_at)
        .run(Command::Transaction(vec![set("other", "x")]));
    match reply {
        Reply::Array(_) => true,
        Reply::Nil => false,
        other => panic!("unexpected EXEC reply {other:?}"),
    }
}

#[test]
fn watch_without_changes_lets_exec_run() {
    assert!(watched_exec_runs(&[set("k", "v")], &[get("k")], 1_000));
    assert!(watched_exec_runs(&[], &[], 1_000));
}

#[test]
fn watch_aborts_exec_when_the_key_is_modified() {
    assert!(!watched_exec_runs(
        &[set("k", "v")],
        &[set("k", "w")],
        1_000
    ));
    // Writing the same value is still a modification.
    assert!(!watched_exec_runs(
        &[set("k", "v")],
        &[set("k", "v")],
        1_000
    ));
    assert!(!watched_exec_runs(&[], &[set("k", "v")], 1_000));
    assert!(!watched_exec_runs(
        &[set("k", "v")],
        &[Command::PExpire {
            key: s("k"),
            millis: 100
        }],
        1_000
    ));
    assert!(!watched_exec_runs(&[], &[hset("k", "f")], 1_000));
}

#[test]
fn watch_aborts_exec_when_the_key_is_deleted() {
    assert!(!watched_exec_runs(&[set("k", "v")], &[del(&["k"])], 1_000));
    assert!(!watched_exec_runs(
        &[set("k", "v")],
        &[Command::Expire {
            key: s("k"),
            seconds: 0
        }],
        1_000
    ));
}

#[test]
fn only_real_modifications_touch_a_watched_key() {
    let nx = set_with("k", "w", SetCondition::Nx, SetExpiry::None, false);
    assert!(watched_exec_runs(&[set("k", "v")], &[nx], 1_000));
    let xx = set_with("k", "w", SetCondition::Xx, SetExpiry::None, false);
    assert!(watched_exec_runs(&[], &[xx], 1_000));
    assert!(watched_exec_runs(&[], &[del(&["k"])], 1_000));
    assert!(watched_exec_runs(
        &[sadd("k", &["a"])],
        &[sadd("k", &["a"])],
        1_000
    ));
    assert!(watched_exec_runs(
        &[zadd("k", &[(1, "a")])],
        &[zadd("k", &[(1, "a")])],
        1_000
    ));
    assert!(watched_exec_runs(
        &[hset("k", "f")],
        &[Command::HDel {
            key: s("k"),
            fields: strs(&["g"])
        }],
        1_000
    ));
    assert!(watched_exec_runs(
        &[],
        &[zinterstore("k", &["missing"], &[])],
        1_000
    ));
    assert!(!watched_exec_runs(
        &[set("k", "v")],
        &[zinterstore("k", &["missing"], &[])],
        1_000
    ));
}

#[test]
fn watch_aborts_exec_when_a_live_key_expires_before_exec() {
    // Live at WATCH (deadline 1_010), expired at EXEC, never accessed.
    assert!(!watched_exec_runs(&[set_px("k", "v", 10)], &[], 1_011));
    // At the deadline it is still live.
    assert!(watched_exec_runs(&[set_px("k", "v", 10)], &[], 1_010));
}

#[test]
fn watch_aborts_exec_when_a_live_key_is_deleted_lazily_by_expiry() {
    let mut n = Node::new();
    n.on(B, set_px("k", "v", 10));
    n.run(watch(&["k"]));
    assert_eq!(n.at(1_020).on(B, get("k")), Reply::Nil);
    assert_eq!(n.ks.get_entry("k"), None);
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn a_key_already_expired_at_watch_counts_as_missing() {
    let mut n = Node::new();
    n.on(B, set_px("k", "v", 10));
    n.at(1_020).run(watch(&["k"]));
    // Its lazy deletion is no change ...
    assert_eq!(n.on(B, get("k")), Reply::Nil);
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Array(vec![]));
    // ... but a new write is.
    n.on(B, set_px("k", "v", 10));
    n.at(1_040).run(watch(&["k"]));
    n.on(B, set("k", "new"));
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn own_writes_between_watch_and_multi_abort_too() {
    let mut n = Node::new();
    n.run(watch(&["k"]));
    n.run(set("k", "mine"));
    assert_eq!(n.run(Command::Transaction(vec![get("k")])), Reply::Nil);
}

#[test]
fn writes_inside_the_transaction_touch_other_connections() {
    let mut n = Node::new();
    n.on(B, watch(&["k"]));
    n.run(Command::Transaction(vec![set("k", "v")]));
    assert_eq!(n.on(B, Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn exec_unwatch_and_discard_forget_watched_keys() {
    for end in [Command::Unwatch, Command::Exec, Command::Discard] {
        let mut n = Node::new();
        n.run(watch(&["k"]));
        if end != Command::Unwatch {
            n.run(Command::Multi);
        }
        n.run(end.clone());
        n.on(B, set("k", "v"));
        assert_eq!(
            n.run(Command::Transaction(vec![])),
            Reply::Array(vec![]),
            "after {end:?}"
        );
    }
}

#[test]
fn exec_without_multi_keeps_the_watch() {
    let mut n = Node::new();
    n.run(watch(&["k"]));
    assert_eq!(n.run(Command::Exec), err("ERR EXEC without MULTI"));
    n.on(B, set("k", "v"));
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn a_script_write_touches_watched_keys() {
    let mut n = Node::new();
    n.on(B, set("k", "tok"));
    n.run(watch(&["k"]));
    n.on(B, eval(Script::CompareAndDelete, &["k"], &["tok"]));
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn drop_connection_forgets_watch_and_multi() {
    let mut n = Node::new();
    n.run(watch(&["k"]));
    n.on(B, Command::Multi);
    n.on(B, set("q", "v"));
    n.ks.drop_connection(B);
    assert!(!n.ks.in_multi(B));
    assert_eq!(n.on(B, Command::Exec), err("ERR EXEC without MULTI"));
    n.ks.drop_connections();
    n.on(B, set("k", "v"));
    // A was watching when its connection was reset: its next EXEC reports the
    // transaction aborted rather than running it unwatched.
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Nil);
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Array(vec![]));
}

// ---------------------------------------------------------------- helpers

#[test]
fn purge_expired_deletes_expired_keys_and_keeps_watch_semantics() {
    let mut n = Node::new();
    n.run(set_px("live", "v", 100));
    n.run(set_px("k", "v", 10));
    n.run(set_px("old", "v", 5));
    n.on(B, watch(&["k"]));
    n.at(1_007).run(watch(&["old"]));
    n.ks.purge_expired(Millis(1_011));
    assert_eq!(n.ks.entries().map(|(k, _)| k).collect::<Vec<_>>(), ["live"]);
    // B watched k while live: aborted. A watched old after it expired: runs.
    assert_eq!(n.at(1_011).on(B, Command::Transaction(vec![])), Reply::Nil);
    assert_eq!(n.run(Command::Transaction(vec![])), Reply::Array(vec![]));
}

#[test]
fn purged_and_unpurged_states_compare_equal_once_purged() {
    let mut a = Keyspace::new();
    a.execute(A, Millis(0), &set_px("k", "v", 5));
    let b = Keyspace::new();
    assert_ne!(a, b);
    a.purge_expired(Millis(6));
    assert_eq!(a, b);
}

#[test]
fn live_entries_and_get_entry() {
    let mut n = Node::new();
    n.run(set_px("a", "1", 10));
    n.run(set("b", "2"));
    let now = Millis(1_011);
    assert_eq!(n.ks.entries().count(), 2);
    assert_eq!(n.ks.live(now).map(|(k, _)| k).collect::<Vec<_>>(), ["b"]);
    let a = n.ks.get_entry("a").unwrap();
    assert!(a.is_expired(now));
    assert!(!a.is_expired(Millis(1_010)));
    assert_eq!(a.value, Value::Str(s("1")));
    assert_eq!(n.ks.get_live("a", now), None);
    assert!(n.ks.get_live("b", now).is_some());
}

#[test]
fn restart_loses_keys_and_connections() {
    let mut n = Node::new();
    n.run(set("k", "v"));
    n.on(B, Command::Multi);
    n.ks.restart();
    assert_eq!(n.ks, Keyspace::new());
    assert_eq!(n.on(B, Command::Exec), err("ERR EXEC without MULTI"));
}

#[test]
fn replicate_from_copies_data_not_connections() {
    let mut master = Node::new();
    master.run(set_px("k", "v", 100));
    master.on(B, Command::Multi);
    let mut replica = Node::new();
    replica.run(set("stale", "x"));
    replica.run(watch(&["k"]));
    replica.ks.replicate_from(&master.ks);
    assert_eq!(
        replica.ks.entries().collect::<Vec<_>>(),
        master.ks.entries().collect::<Vec<_>>()
    );
    assert!(!replica.ks.in_multi(B));
    assert_eq!(replica.run(pttl("k")), Reply::Int(100));
    // The replicated write touched the replica's watcher.
    assert_eq!(replica.run(Command::Transaction(vec![])), Reply::Nil);
}

#[test]
fn render_lists_live_keys_of_every_type() {
    let mut n = Node::new();
    n.run(set_px("{orders}", "tok-a", 30));
    n.run(hset("h", "owner"));
    n.run(sadd("s", &["b", "a"]));
    n.run(zadd("z", &[(2, "x"), (1, "y")]));
    assert_eq!(
        n.ks.render(Millis(1_000)),
        r#"h={"owner": 1}, s={"a", "b"}, z=["y": 1, "x": 2], {orders}="tok-a" (pttl 30)"#
    );
    assert_eq!(
        n.ks.render(Millis(1_031)),
        r#"h={"owner": 1}, s={"a", "b"}, z=["y": 1, "x": 2]"#
    );
}

// ---------------------------------------------------------------- scripts

#[test]
fn every_script_has_lua_text_that_calls_redis() {
    for script in Script::ALL {
        let lua = script.lua();
        assert!(lua.contains("redis.call("), "{}", script.name());
        assert!(!lua.contains("not implemented"), "{}", script.name());
    }
    for script in [
        Script::CompareAndDelete,
        Script::ReentrantUnlock,
        Script::LeaseRelease,
    ] {
        assert!(
            script
                .lua()
                .contains("redis.call('publish', KEYS[1] .. ':released'"),
            "{} publishes its release",
            script.name()
        );
    }
    for script in [
        Script::LeaseAcquire,
        Script::TimeFencedLeaseAcquire,
        Script::LeaseRenew,
        Script::TimeFencedAcquire,
    ] {
        assert!(script.lua().contains("redis.call('time')"));
    }
}

#[test]
fn compare_and_delete_paths() {
    let mut n = Node::new();
    let cad = |tok: &str| eval(Script::CompareAndDelete, &["lock"], &[tok]);
    assert_eq!(n.run(cad("me")), Reply::Int(0));
    n.run(set_px("lock", "other", 100));
    assert_eq!(n.run(cad("me")), Reply::Int(0));
    assert_eq!(n.run(get("lock")), bulk("other"));
    assert_eq!(n.run(cad("other")), Reply::Int(1));
    assert_eq!(n.run(get("lock")), Reply::Nil);
    n.run(hset("lock", "f"));
    assert_eq!(
        n.run(cad("me")),
        raised(Script::CompareAndDelete, 1, wrongtype())
    );
}

#[test]
fn compare_and_pexpire_paths() {
    let mut n = Node::new();
    let cap = |tok: &str, ttl: &str| eval(Script::CompareAndPExpire, &["lock"], &[tok, ttl]);
    assert_eq!(n.run(cap("me", "500")), Reply::Int(0));
    n.run(set_px("lock", "me", 100));
    assert_eq!(n.run(cap("other", "500")), Reply::Int(0));
    assert_eq!(n.run(pttl("lock")), Reply::Int(100));
    assert_eq!(n.run(cap("me", "500")), Reply::Int(1));
    assert_eq!(n.run(pttl("lock")), Reply::Int(500));
    assert_eq!(
        n.run(cap("me", "soon")),
        raised(
            Script::CompareAndPExpire,
            2,
            err("ERR value is not an integer or out of range")
        )
    );
    n.run(sadd("lock", &["x"]));
    // SADD on a string is refused; make the key a set first.
    n.run(del(&["lock"]));
    n.run(sadd("lock", &["x"]));
    assert_eq!(
        n.run(cap("me", "500")),
        raised(Script::CompareAndPExpire, 1, wrongtype())
    );
}

#[test]
fn reentrant_lock_paths() {
    let mut n = Node::new();
    let lock = |owner: &str| eval(Script::ReentrantLock, &["h"], &["300", owner]);
    assert_eq!(n.run(lock("me")), Reply::Nil);
    assert_eq!(
        n.run(Command::HGet {
            key: s("h"),
            field: s("me")
        }),
        bulk("1")
    );
    assert_eq!(n.run(pttl("h")), Reply::Int(300));
    // Reentry: count 2, TTL reset.
    assert_eq!(n.at(1_100).run(lock("me")), Reply::Nil);
    assert_eq!(
        n.run(Command::HGet {
            key: s("h"),
            field: s("me")
        }),
        bulk("2")
    );
    assert_eq!(n.run(pttl("h")), Reply::Int(300));
    // Someone else: the PTTL.
    assert_eq!(n.at(1_150).run(lock("you")), Reply::Int(250));
    // Expired: anyone may take it.
    assert_eq!(n.at(1_401).run(lock("you")), Reply::Nil);
    n.run(set("str", "v"));
    assert_eq!(
        n.run(eval(Script::ReentrantLock, &["str"], &["300", "me"])),
        raised(Script::ReentrantLock, 1, wrongtype())
    );
}

#[test]
fn reentrant_lock_with_a_bad_ttl_fails_after_counting_like_redis() {
    let mut n = Node::new();
    assert_eq!(
        n.run(eval(Script::ReentrantLock, &["h"], &["soon", "me"])),
        raised(
            Script::ReentrantLock,
            3,
            err("ERR value is not an integer or out of range")
        )
    );
    // Redis does not roll back the HINCRBY that ran before the error.
    assert_eq!(
        n.run(Command::HGet {
            key: s("h"),
            field: s("me")
        }),
        bulk("1")
    );
    assert_eq!(n.run(pttl("h")), Reply::Int(-1));
}

#[test]
fn reentrant_unlock_paths() {
    let mut n = Node::new();
    let lock = eval(Script::ReentrantLock, &["h"], &["300", "me"]);
    let unlock = |owner: &str| eval(Script::ReentrantUnlock, &["h"], &["300", owner]);
    assert_eq!(n.run(unlock("me")), Reply::Nil);
    n.run(lock.clone());
    n.run(lock);
    assert_eq!(n.run(unlock("you")), Reply::Nil);
    assert_eq!(n.at(1_200).run(unlock("me")), Reply::Int(0));
    assert_eq!(n.run(pttl("h")), Reply::Int(300));
    assert_eq!(n.run(unlock("me")), Reply::Int(1));
    assert_eq!(n.ks.get_entry("h"), None);
    assert_eq!(n.run(unlock("me")), Reply::Nil);
    n.run(set("str", "v"));
    assert_eq!(
        n.run(eval(Script::ReentrantUnlock, &["str"], &["300", "me"])),
        raised(Script::ReentrantUnlock, 1, wrongtype())
    );
}

#[test]
fn reentrant_renew_paths() {
    let mut n = Node::new();
    let renew = |owner: &str| eval(Script::ReentrantRenew, &["h"], &["300", owner]);
    assert_eq!(n.run(renew("me")), Reply::Int(0));
    n.run(eval(Script::ReentrantLock, &["h"], &["300", "me"]));
    assert_eq!(n.at(1_250).run(renew("you")), Reply::Int(0));
    assert_eq!(n.run(pttl("h")), Reply::Int(50));
    assert_eq!(n.run(renew("me")), Reply::Int(1));
    assert_eq!(n.run(pttl("h")), Reply::Int(300));
    assert_eq!(n.at(1_551).run(renew("me")), Reply::Int(0), "expired");
}

#[test]
fn fenced_acquire_paths() {
    let mut n = Node::new();
    let acquire =
        |tok: &str, ttl: &str| eval(Script::FencedAcquire, &["lock", "fence"], &[tok, ttl]);
    assert_eq!(n.run(acquire("a", "100")), Reply::Int(1));
    assert_eq!(n.run(pttl("lock")), Reply::Int(100));
    assert_eq!(n.run(acquire("b", "100")), Reply::Nil);
    assert_eq!(n.run(get("fence")), bulk("1"));
    assert_eq!(n.at(1_101).run(acquire("b", "100")), Reply::Int(2));
    assert_eq!(n.run(get("lock")), bulk("b"));
    assert_eq!(
        n.at(1_300).run(acquire("c", "0")),
        raised(
            Script::FencedAcquire,
            5,
            err("ERR invalid expire time in 'set' command")
        )
    );
    assert_eq!(
        n.run(acquire("c", "x")),
        raised(
            Script::FencedAcquire,
            5,
            err("ERR value is not an integer or out of range")
        )
    );
}

#[test]
fn fenced_acquire_with_a_wrong_type_fence_leaves_no_lock_like_redis() {
    let mut n = Node::new();
    n.run(sadd("fence", &["x"]));
    assert_eq!(
        n.run(eval(
            Script::FencedAcquire,
            &["lock", "fence"],
            &["a", "100"]
        )),
        raised(Script::FencedAcquire, 4, wrongtype())
    );
    // The fence is issued before the lock key is set: no fence, no lock.
    assert_eq!(n.run(get("lock")), Reply::Nil);
}

#[test]
fn time_fenced_acquire_issues_the_larger_of_counter_and_clock_and_survives_a_restart() {
    let mut n = Node::new();
    let acquire = |tok: &str| eval(Script::TimeFencedAcquire, &["lock", "fence"], &[tok, "100"]);
    // The node clock reads 1000 ms: the first fence is the clock in µs.
    assert_eq!(n.run(acquire("a")), Reply::Int(1_000_000));
    assert_eq!(n.run(get("fence")), bulk("1000000"));
    assert_eq!(n.run(pttl("lock")), Reply::Int(100));
    assert_eq!(n.run(acquire("b")), Reply::Nil);
    // Within the same microsecond the stored counter decides: + 1.
    n.run(del(&["lock"]));
    assert_eq!(n.run(acquire("b")), Reply::Int(1_000_001));
    // The counter lost with a restart: the clock, a millisecond later, is
    // above every fence before.
    n.ks.restart();
    n.run(del(&["lock"]));
    assert_eq!(n.at(1_001).run(acquire("c")), Reply::Int(1_001_000));
    // A clock stepped back: the counter still decides while it is kept...
    n.run(del(&["lock"]));
    assert_eq!(n.at(500).run(acquire("d")), Reply::Int(1_001_001));
    // ...and once it is lost, the fence goes backwards (the assumption).
    n.ks.restart();
    assert_eq!(n.run(acquire("e")), Reply::Int(500_000));
    assert_eq!(
        n.run(eval(
            Script::TimeFencedAcquire,
            &["lock2", "fence"],
            &["f", "0"]
        )),
        raised(
            Script::TimeFencedAcquire,
            11,
            err("ERR invalid expire time in 'set' command")
        )
    );
}

fn lease_acquire(tok: &str, ttl: &str, limit: &str) -> Command {
    eval(
        Script::LeaseAcquire,
        &["permits", "fence", "limit"],
        &[tok, ttl, limit],
    )
}

fn zscore(key: &str, member: &str) -> Command {
    Command::ZScore {
        key: s(key),
        member: s(member),
    }
}

#[test]
fn lease_acquire_grants_up_to_the_limit_with_increasing_fences() {
    let mut n = Node::new();
    assert_eq!(n.run(lease_acquire("a", "100", "2")), Reply::Int(1));
    assert_eq!(
        n.run(get("limit")),
        bulk("2"),
        "the default limit is stored"
    );
    assert_eq!(n.run(zscore("permits", "a")), bulk("1100"));
    assert_eq!(
        n.at(1_010).run(lease_acquire("b", "100", "2")),
        Reply::Int(2)
    );
    assert_eq!(n.run(lease_acquire("c", "100", "2")), Reply::Nil);
    assert_eq!(n.run(get("fence")), bulk("2"));
    // A stored limit wins over ARGV[3].
    assert_eq!(n.run(lease_acquire("c", "100", "5")), Reply::Nil);
}

#[test]
fn lease_acquire_drops_permits_whose_deadline_has_passed() {
    let mut n = Node::new();
    n.run(lease_acquire("a", "100", "1")); // deadline 1_100
                                           // At the deadline the permit still counts ...
    assert_eq!(n.at(1_100).run(lease_acquire("b", "100", "1")), Reply::Nil);
    // ... one ms later it is dropped.
    assert_eq!(
        n.at(1_101).run(lease_acquire("b", "100", "1")),
        Reply::Int(2)
    );
    assert_eq!(n.run(zscore("permits", "a")), Reply::Nil);
    assert_eq!(n.run(zscore("permits", "b")), bulk("1201"));
}

#[test]
fn lease_acquire_errors() {
    let mut n = Node::new();
    n.run(set("permits", "v"));
    assert_eq!(
        n.run(lease_acquire("a", "100", "1")),
        raised(Script::LeaseAcquire, 3, wrongtype())
    );
    let mut n = Node::new();
    assert_eq!(
        n.run(lease_acquire("a", "100", "many")),
        raised(
            Script::LeaseAcquire,
            9,
            err("ERR user_script:9: attempt to compare number with nil")
        )
    );
    assert_eq!(
        n.run(get("limit")),
        bulk("many"),
        "the SET before the error stays"
    );
    let mut n = Node::new();
    assert_eq!(
        n.run(lease_acquire("a", "soon", "1")),
        raised(
            Script::LeaseAcquire,
            11,
            err("ERR user_script:11: attempt to perform arithmetic on a nil value")
        )
    );
    assert_eq!(
        n.run(get("fence")),
        bulk("1"),
        "the INCR before the error stays, as in Redis"
    );
}

#[test]
fn lease_release_paths() {
    let mut n = Node::new();
    let release = |tok: &str| eval(Script::LeaseRelease, &["permits"], &[tok]);
    assert_eq!(n.run(release("a")), Reply::Int(0));
    n.run(lease_acquire("a", "100", "2"));
    assert_eq!(n.run(release("b")), Reply::Int(0));
    assert_eq!(n.run(release("a")), Reply::Int(1));
    assert_eq!(n.ks.get_entry("permits"), None);
    n.run(set("permits", "v"));
    assert_eq!(
        n.run(release("a")),
        raised(Script::LeaseRelease, 1, wrongtype())
    );
}

#[test]
fn lease_renew_paths() {
    let mut n = Node::new();
    let renew = |tok: &str| eval(Script::LeaseRenew, &["permits"], &[tok, "100"]);
    assert_eq!(n.run(renew("a")), Reply::Int(0));
    n.run(lease_acquire("a", "100", "2")); // deadline 1_100
    assert_eq!(n.at(1_050).run(renew("a")), Reply::Int(1));
    assert_eq!(n.run(zscore("permits", "a")), bulk("1150"));
    assert_eq!(n.run(renew("b")), Reply::Int(0));
    // Expired: dropped, not renewed.
    assert_eq!(n.at(1_151).run(renew("a")), Reply::Int(0));
    assert_eq!(n.ks.get_entry("permits"), None);
}

#[test]
fn scripts_with_missing_keys_or_args_fail_like_redis_lua() {
    let mut n = Node::new();
    let nil_arg = err("ERR Lua redis lib command arguments must be strings or integers");
    assert_eq!(
        n.run(eval(Script::CompareAndDelete, &[], &["a"])),
        raised(Script::CompareAndDelete, 1, nil_arg.clone())
    );
    assert_eq!(
        n.run(eval(Script::ReentrantRenew, &["h"], &["300"])),
        raised(Script::ReentrantRenew, 1, nil_arg)
    );
    // A nil ARGV[1] compares unequal: no error.
    assert_eq!(
        n.run(eval(Script::CompareAndDelete, &["k"], &[])),
        Reply::Int(0)
    );
}

// ---------------------------------------------------------------- properties

fn arb_command() -> impl Strategy<Value = Command> {
    let key = prop::sample::select(vec!["a", "b", "h"]).prop_map(s);
    let value = prop::sample::select(vec!["1", "x"]).prop_map(s);
    let ttl = prop::sample::select(vec![1u64, 5, 20]);
    prop_oneof![
        (key.clone(), value.clone(), ttl).prop_map(|(k, v, t)| set_px(&k, &v, t)),
        (key.clone(), value.clone()).prop_map(|(k, v)| set(&k, &v)),
        (key.clone(), value).prop_map(|(k, v)| Command::SetNx { key: k, value: v }),
        key.clone().prop_map(|k| Command::Get { key: k }),
        key.clone().prop_map(|k| Command::Incr { key: k }),
        key.clone().prop_map(|k| Command::PTtl { key: k }),
        key.clone().prop_map(|k| Command::Del { keys: vec![k] }),
        key.clone().prop_map(|k| Command::Watch { keys: vec![k] }),
        key.clone().prop_map(|k| hset(&k, "f")),
        key.clone()
            .prop_map(|k| eval(Script::CompareAndDelete, &[&k], &["1"])),
        key.prop_map(|k| Command::Transaction(vec![Command::Incr { key: k }])),
        Just(Command::Multi),
        Just(Command::Exec),
    ]
}

fn arb_expiring_command() -> impl Strategy<Value = Command> {
    let key = prop::sample::select(vec!["a", "b"]).prop_map(s);
    prop_oneof![
        (key.clone(), 1u64..50).prop_map(|(k, t)| set_px(&k, "v", t)),
        key.clone().prop_map(|k| Command::Get { key: k }),
        key.clone().prop_map(|k| Command::Del { keys: vec![k] }),
        key.clone().prop_map(|k| Command::Watch { keys: vec![k] }),
        key.clone().prop_map(|k| Command::SRem {
            key: k,
            members: strs(&["m"])
        }),
        key.clone().prop_map(|k| Command::HDel {
            key: k,
            fields: strs(&["m"])
        }),
        key.clone().prop_map(|k| zinterstore(&k, &["missing"], &[])),
        key.prop_map(|k| Command::PExpire { key: k, millis: 0 }),
        Just(Command::Multi),
        Just(Command::Exec),
    ]
}

proptest! {
    /// Deleting expired keys early (active expiry) never changes a reply.
    #[test]
    fn purging_expired_keys_is_unobservable(
        steps in prop::collection::vec((arb_command(), 0u64..4, any::<bool>(), any::<bool>()), 1..40)
    ) {
        let mut lazy = Keyspace::new();
        let mut eager = Keyspace::new();
        let mut now = 0;
        for (command, advance, on_b, purge) in steps {
            now += advance;
            if purge {
                eager.purge_expired(Millis(now));
            }
            let conn = if on_b { B } else { A };
            let expected = lazy.execute(conn, Millis(now), &command);
            prop_assert_eq!(eager.execute(conn, Millis(now), &command), expected);
        }
    }

    /// A `Transaction` replies exactly like `MULTI`, its commands, `EXEC`.
    #[test]
    fn transaction_equals_multi_commands_exec(
        setup in prop::collection::vec(arb_command(), 0..10),
        body in prop::collection::vec(arb_command(), 0..5),
    ) {
        let mut one = Keyspace::new();
        for c in &setup {
            one.execute(A, Millis(1), c);
        }
        let mut steps = one.clone();
        let reply = one.execute(A, Millis(2), &Command::Transaction(body.clone()));
        steps.execute(A, Millis(2), &Command::Multi);
        for c in &body {
            steps.execute(A, Millis(2), c);
        }
        prop_assert_eq!(steps.execute(A, Millis(2), &Command::Exec), reply);
        prop_assert_eq!(steps, one);
    }

    /// Model states stay canonical: once every key has expired and been
    /// purged and every connection has ended its transaction, the node
    /// equals a fresh one (no leftover empty aggregates or sessions).
    #[test]
    fn finished_and_expired_states_equal_the_fresh_node(
        steps in prop::collection::vec((arb_expiring_command(), any::<bool>()), 0..30)
    ) {
        let mut ks = Keyspace::new();
        for (c, on_b) in &steps {
            ks.execute(if *on_b { B } else { A }, Millis(0), c);
        }
        for conn in [A, B] {
            ks.execute(conn, Millis(0), &Command::Discard);
            ks.execute(conn, Millis(0), &Command::Unwatch);
        }
        ks.purge_expired(Millis(1_000));
        prop_assert_eq!(ks, Keyspace::new());
    }
}

#[test]
fn a_watch_lost_to_a_restart_aborts_the_next_exec_instead_of_running_unwatched() {
    let mut ks = Keyspace::new();
    let (a, b) = (ConnId(1), ConnId(2));
    let t = Millis(0);
    ks.execute(b, t, &set("k", "mine"));
    assert_eq!(ks.execute(a, t, &watch(&["k"])), status("OK"));
    ks.restart();
    ks.execute(b, t, &set("k", "theirs"));
    let tx = Command::Transaction(vec![del(&["k"])]);
    assert_eq!(
        ks.execute(a, t, &tx),
        Reply::Nil,
        "the lost WATCH must abort"
    );
    assert_eq!(ks.execute(a, t, &get("k")), bulk("theirs"));
    // The abort ends the transaction: the connection is clean again.
    assert_eq!(ks.execute(a, t, &tx), Reply::Array(vec![Reply::Int(1)]));
    // A connection that was not watching is unaffected.
    ks.execute(b, t, &set("k", "x"));
    ks.drop_connections();
    assert_eq!(ks.execute(b, t, &tx), Reply::Array(vec![Reply::Int(1)]));
}

fn time_fenced_lease_acquire(tok: &str, ttl: &str, limit: &str) -> Command {
    eval(
        Script::TimeFencedLeaseAcquire,
        &["permits", "fence", "limit"],
        &[tok, ttl, limit],
    )
}

#[test]
fn time_fenced_lease_acquire_issues_the_larger_of_counter_and_clock_and_survives_a_restart() {
    let mut n = Node::new();
    // The node clock reads 1000 ms: the first fence is the clock in µs, the
    // deadline the clock in ms plus the TTL.
    assert_eq!(
        n.run(time_fenced_lease_acquire("a", "100", "2")),
        Reply::Int(1_000_000)
    );
    assert_eq!(n.run(get("fence")), bulk("1000000"));
    assert_eq!(n.run(zscore("permits", "a")), bulk("1100"));
    // Within the same microsecond the stored counter decides: + 1.
    assert_eq!(
        n.run(time_fenced_lease_acquire("b", "100", "2")),
        Reply::Int(1_000_001)
    );
    assert_eq!(
        n.run(time_fenced_lease_acquire("c", "100", "2")),
        Reply::Nil
    );
    // The counter and the permits lost with a restart: the clock, a
    // millisecond later, is above every fence before.
    n.ks.restart();
    assert_eq!(
        n.at(1_001).run(time_fenced_lease_acquire("c", "100", "2")),
        Reply::Int(1_001_000)
    );
    // A clock stepped back: the counter still decides while it is kept...
    assert_eq!(
        n.at(500).run(time_fenced_lease_acquire("d", "100", "2")),
        Reply::Int(1_001_001)
    );
    // ...and once it is lost, the fence goes backwards (the assumption).
    n.ks.restart();
    assert_eq!(
        n.run(time_fenced_lease_acquire("e", "100", "2")),
        Reply::Int(500_000)
    );
}

#[test]
fn time_fenced_lease_acquire_errors_name_the_lines_of_its_text() {
    let mut n = Node::new();
    assert_eq!(
        n.run(time_fenced_lease_acquire("a", "100", "many")),
        raised(
            Script::TimeFencedLeaseAcquire,
            9,
            err("ERR user_script:9: attempt to compare number with nil")
        )
    );
    let mut n = Node::new();
    assert_eq!(
        n.run(time_fenced_lease_acquire("a", "soon", "1")),
        raised(
            Script::TimeFencedLeaseAcquire,
            16,
            err("ERR user_script:16: attempt to perform arithmetic on a nil value")
        )
    );
    assert_eq!(
        n.run(get("fence")),
        bulk("1000000"),
        "the fence stored before the error stays, as in Redis"
    );
    let mut n = Node::new();
    n.run(set("fence", "x"));
    assert_eq!(
        n.run(time_fenced_lease_acquire("a", "100", "1")),
        raised(
            Script::TimeFencedLeaseAcquire,
            10,
            err("ERR value is not an integer or out of range")
        )
    );
    assert_eq!(
        n.run(zscore("permits", "a")),
        Reply::Nil,
        "no permit without a fence"
    );
}
