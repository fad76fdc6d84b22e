//! What each data command does to the keys, with Redis 7's replies.
//!
//! Every lookup first applies lazy expiry (an expired key is deleted, which
//! dirties the connections that watched it live), and every real
//! modification touches the key for `WATCH`. Scripts run on these same
//! functions through [`Keyspace::apply`].

use super::{
    Command, Entry, Keyspace, Reply, ScoreBound, SetCondition, SetExpiry, Value, WRONGTYPE,
};
use std::collections::{BTreeMap, BTreeSet};

/// `ERR value is not an integer or out of range`.
pub(super) const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";

fn error(text: &str) -> Reply {
    Reply::Error(text.to_owned())
}

fn wrongtype() -> Reply {
    error(WRONGTYPE)
}

fn int(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn expire_time_error(command: &str) -> Reply {
    Reply::Error(format!("ERR invalid expire time in '{command}' command"))
}

/// Redis' `string2ll`: an optional `-`, then digits without a leading zero
/// (only `0` itself may start with `0`), no spaces, no `+`, within `i64`.
pub(super) fn parse_i64(s: &str) -> Option<i64> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    if s == "0" {
        return Some(0);
    }
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.parse().ok()
}

/// The members of a sorted set in rank order: by score, then by member.
pub(super) fn by_rank(zset: &BTreeMap<String, i64>) -> Vec<(&str, i64)> {
    let mut members: Vec<(&str, i64)> = zset.iter().map(|(m, s)| (m.as_str(), *s)).collect();
    members.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
    members
}

fn above_min(score: i64, min: ScoreBound) -> bool {
    match min {
        ScoreBound::NegInf => true,
        ScoreBound::PosInf => false,
        ScoreBound::Inclusive(m) => score >= m,
        ScoreBound::Exclusive(m) => score > m,
    }
}

fn below_max(score: i64, max: ScoreBound) -> bool {
    match max {
        ScoreBound::NegInf => false,
        ScoreBound::PosInf => true,
        ScoreBound::Inclusive(m) => score <= m,
        ScoreBound::Exclusive(m) => score < m,
    }
}

/// The error Redis gives before running or queueing a command with too few
/// arguments (an empty key or member list).
pub(super) fn arity_error(command: &Command) -> Option<Reply> {
    let name = match command {
        Command::Del { keys } if keys.is_empty() => "del",
        Command::Exists { keys } if keys.is_empty() => "exists",
        Command::Watch { keys } if keys.is_empty() => "watch",
        Command::HDel { fields, .. } if fields.is_empty() => "hdel",
        Command::SAdd { members, .. } if members.is_empty() => "sadd",
        Command::SRem { members, .. } if members.is_empty() => "srem",
        Command::ZAdd { members, .. } if members.is_empty() => "zadd",
        Command::ZRem { members, .. } if members.is_empty() => "zrem",
        Command::ZInterStore { keys, weights, .. } if keys.is_empty() && weights.is_empty() => {
            "zinterstore"
        }
        _ => return None,
    };
    Some(Reply::Error(format!(
        "ERR wrong number of arguments for '{name}' command"
    )))
}

impl Keyspace {
    /// Run one data command now, outside any transaction logic (what Redis'
    /// command procedure does once `processCommand` has let it through).
    pub(super) fn apply(&mut self, now: u64, command: &Command) -> Reply {
        if let Some(error) = arity_error(command) {
            return error;
        }
        match command {
            Command::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => self.set(now, key, value, *condition, *expiry, *get),
            Command::SetNx { key, value } => {
                match self.set(now, key, value, SetCondition::Nx, SetExpiry::None, false) {
                    Reply::Nil => Reply::Int(0),
                    Reply::Error(e) => Reply::Error(e),
                    _ => Reply::Int(1),
                }
            }
            Command::Get { key } => match self.read(now, key) {
                None => Reply::Nil,
                Some(Value::Str(s)) => Reply::Bulk(s.clone()),
                Some(_) => wrongtype(),
            },
            Command::GetSet { key, value } => {
                self.set(now, key, value, SetCondition::Always, SetExpiry::None, true)
            }
            Command::Del { keys } => {
                let mut deleted = 0;
                for key in keys {
                    self.expire_if_needed(now, key);
                    if self.entries.remove(key).is_some() {
                        self.touch(key);
                        deleted += 1;
                    }
                }
                int(deleted)
            }
            Command::Exists { keys } => {
                let n = keys.iter().filter(|k| self.read(now, k).is_some()).count();
                int(n)
            }
            Command::Expire { key, seconds } => self.expire(now, key, *seconds, true),
            Command::PExpire { key, millis } => self.expire(now, key, *millis, false),
            Command::Ttl { key } => self.ttl(now, key, false),
            Command::PTtl { key } => self.ttl(now, key, true),
            Command::Incr { key } => self.incr(now, key),
            Command::HIncrBy { key, field, by } => self.hincrby(now, key, field, *by),
            Command::HExists { key, field } => match self.read(now, key) {
                None => Reply::Int(0),
                Some(Value::Hash(h)) => Reply::Int(i64::from(h.contains_key(field))),
                Some(_) => wrongtype(),
            },
            Command::HGet { key, field } => match self.read(now, key) {
                None => Reply::Nil,
                Some(Value::Hash(h)) => h.get(field).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
                Some(_) => wrongtype(),
            },
            Command::HDel { key, fields } => {
                self.remove_from(now, key, fields, |value, fields| match value {
                    Value::Hash(h) => Ok(fields.iter().filter(|f| h.remove(*f).is_some()).count()),
                    _ => Err(wrongtype()),
                })
            }
            Command::SAdd { key, members } => self.sadd(now, key, members),
            Command::SRem { key, members } => {
                self.remove_from(now, key, members, |value, members| match value {
                    Value::Set(s) => Ok(members.iter().filter(|m| s.remove(*m)).count()),
                    _ => Err(wrongtype()),
                })
            }
            Command::SCard { key } => match self.read(now, key) {
                None => Reply::Int(0),
                Some(Value::Set(s)) => int(s.len()),
                Some(_) => wrongtype(),
            },
            Command::SIsMember { key, member } => match self.read(now, key) {
                None => Reply::Int(0),
                Some(Value::Set(s)) => Reply::Int(i64::from(s.contains(member))),
                Some(_) => wrongtype(),
            },
            Command::ZAdd { key, members } => self.zadd(now, key, members),
            Command::ZRem { key, members } => {
                self.remove_from(now, key, members, |value, members| match value {
                    Value::ZSet(z) => Ok(members.iter().filter(|m| z.remove(*m).is_some()).count()),
                    _ => Err(wrongtype()),
                })
            }
            Command::ZRank { key, member } => match self.read(now, key) {
                None => Reply::Nil,
                Some(Value::ZSet(z)) => match z.get(member) {
                    None => Reply::Nil,
                    Some(&score) => int(z
                        .iter()
                        .filter(|(m, s)| (**s, m.as_str()) < (score, member.as_str()))
                        .count()),
                },
                Some(_) => wrongtype(),
            },
            Command::ZScore { key, member } => match self.read(now, key) {
                None => Reply::Nil,
                Some(Value::ZSet(z)) => z
                    .get(member)
                    .map_or(Reply::Nil, |s| Reply::Bulk(s.to_string())),
                Some(_) => wrongtype(),
            },
            Command::ZCard { key } => match self.read(now, key) {
                None => Reply::Int(0),
                Some(Value::ZSet(z)) => int(z.len()),
                Some(_) => wrongtype(),
            },
            Command::ZRemRangeByScore { key, min, max } => {
                let (min, max) = (*min, *max);
                self.remove_from(now, key, &(), |value, ()| match value {
                    Value::ZSet(z) => {
                        let before = z.len();
                        z.retain(|_, s| !(above_min(*s, min) && below_max(*s, max)));
                        Ok(before - z.len())
                    }
                    _ => Err(wrongtype()),
                })
            }
            Command::ZInterStore {
                dest,
                keys,
                weights,
            } => self.zinterstore(now, dest, keys, weights),
            Command::Time => Reply::Array(vec![
                Reply::Bulk((now / 1000).to_string()),
                Reply::Bulk(((now % 1000) * 1000).to_string()),
            ]),
            Command::Wait { .. } | Command::Publish { .. } => Reply::Int(0),
            Command::Unwatch => Reply::ok(),
            Command::Eval { script, keys, args } => self.run_script(now, *script, keys, args),
            // Connection commands never reach here: `execute` handles them,
            // and scripts and queues never hold them. Redis refuses them in
            // scripts with this text.
            Command::Watch { .. }
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Transaction(_) => error("ERR This Redis command is not allowed from script"),
        }
    }

    /// The live value of `key` (lazy expiry first).
    fn read(&mut self, now: u64, key: &str) -> Option<&Value> {
        self.expire_if_needed(now, key);
        self.entries.get(key).map(|e| &e.value)
    }

    /// `SET` and its relatives (`GETSET` is `SET` with `GET`).
    fn set(
        &mut self,
        now: u64,
        key: &str,
        value: &str,
        condition: SetCondition,
        expiry: SetExpiry,
        get: bool,
    ) -> Reply {
        // Redis validates the expire time first, then GET's type, then NX/XX.
        let deadline = match expiry {
            SetExpiry::None => None,
            SetExpiry::Px(ms) | SetExpiry::PxAt(ms) => {
                let Ok(ms) = i64::try_from(ms) else {
                    return error(NOT_AN_INTEGER);
                };
                if ms <= 0 {
                    return expire_time_error("set");
                }
                let base = if matches!(expiry, SetExpiry::Px(_)) {
                    i128::from(now)
                } else {
                    0
                };
                let at = base + i128::from(ms);
                match u64::try_from(at) {
                    Ok(at) if at <= i64::MAX as u64 => Some(at),
                    _ => return expire_time_error("set"),
                }
            }
        };
        let old = match self.read(now, key) {
            None => None,
            Some(Value::Str(s)) => Some(s.clone()),
            Some(_) if get => return wrongtype(),
            Some(_) => Some(String::new()),
        };
        let refused = match condition {
            SetCondition::Always => false,
            SetCondition::Nx => old.is_some(),
            SetCondition::Xx => old.is_none(),
        };
        if !refused {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Str(value.to_owned()),
                    expires_at: deadline,
                },
            );
            self.touch(key);
        }
        match (get, refused) {
            (true, _) => old.map_or(Reply::Nil, Reply::Bulk),
            (false, true) => Reply::Nil,
            (false, false) => Reply::ok(),
        }
    }

    /// `EXPIRE` (`seconds`) and `PEXPIRE`.
    fn expire(&mut self, now: u64, key: &str, amount: i64, seconds: bool) -> Reply {
        let name = if seconds { "expire" } else { "pexpire" };
        let mut when = i128::from(amount);
        if seconds {
            if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&amount) {
                return expire_time_error(name);
            }
            when *= 1000;
        }
        when += i128::from(now);
        if when > i128::from(i64::MAX) {
            return expire_time_error(name);
        }
        self.expire_if_needed(now, key);
        let Some(entry) = self.entries.get_mut(key) else {
            return Reply::Int(0);
        };
        match u64::try_from(when) {
            Ok(at) if at > now => entry.expires_at = Some(at),
            // A deadline that is not in the future deletes the key at once.
            _ => {
                self.entries.remove(key);
            }
        }
        self.touch(key);
        Reply::Int(1)
    }

    fn ttl(&mut self, now: u64, key: &str, millis: bool) -> Reply {
        self.expire_if_needed(now, key);
        let Some(entry) = self.entries.get(key) else {
            return Reply::Int(-2);
        };
        match entry.expires_at {
            None => Reply::Int(-1),
            Some(at) => {
                let ms = i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX);
                Reply::Int(if millis { ms } else { (ms + 500) / 1000 })
            }
        }
    }

    fn incr(&mut self, now: u64, key: &str) -> Reply {
        self.expire_if_needed(now, key);
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            value: Value::Str("0".to_owned()),
            expires_at: None,
        });
        let Value::Str(s) = &mut entry.value else {
            return wrongtype();
        };
        let Some(old) = parse_i64(s) else {
            return error(NOT_AN_INTEGER);
        };
        let Some(new) = old.checked_add(1) else {
            return error(OVERFLOW);
        };
        *s = new.to_string();
        self.touch(key);
        Reply::Int(new)
    }

    fn hincrby(&mut self, now: u64, key: &str, field: &str, by: i64) -> Reply {
        self.expire_if_needed(now, key);
        let old = match self.entries.get(key).map(|e| &e.value) {
            None => 0,
            Some(Value::Hash(h)) => match h.get(field) {
                None => 0,
                Some(v) => match parse_i64(v) {
                    Some(n) => n,
                    None => return error("ERR hash value is not an integer"),
                },
            },
            Some(_) => return wrongtype(),
        };
        let Some(new) = old.checked_add(by) else {
            return error(OVERFLOW);
        };
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            value: Value::Hash(BTreeMap::new()),
            expires_at: None,
        });
        if let Value::Hash(h) = &mut entry.value {
            h.insert(field.to_owned(), new.to_string());
        }
        self.touch(key);
        Reply::Int(new)
    }

    fn sadd(&mut self, now: u64, key: &str, members: &[String]) -> Reply {
        self.expire_if_needed(now, key);
        if self
            .entries
            .get(key)
            .is_some_and(|e| !matches!(e.value, Value::Set(_)))
        {
            return wrongtype();
        }
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            value: Value::Set(BTreeSet::new()),
            expires_at: None,
        });
        let Value::Set(set) = &mut entry.value else {
            return wrongtype();
        };
        let added = members.iter().filter(|m| set.insert((*m).clone())).count();
        if added > 0 {
            self.touch(key);
        }
        int(added)
    }

    fn zadd(&mut self, now: u64, key: &str, members: &[(i64, String)]) -> Reply {
        self.expire_if_needed(now, key);
        if self
            .entries
            .get(key)
            .is_some_and(|e| !matches!(e.value, Value::ZSet(_)))
        {
            return wrongtype();
        }
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            value: Value::ZSet(BTreeMap::new()),
            expires_at: None,
        });
        let Value::ZSet(zset) = &mut entry.value else {
            return wrongtype();
        };
        let (mut added, mut changed) = (0, false);
        for (score, member) in members {
            match zset.insert(member.clone(), *score) {
                None => added += 1,
                Some(old) => changed |= old != *score,
            }
        }
        if added > 0 || changed {
            self.touch(key);
        }
        int(added)
    }

    /// A removal from an aggregate (`HDEL`, `SREM`, `ZREM`,
    /// `ZREMRANGEBYSCORE`): replies the count removed, deletes the key when
    /// it becomes empty, touches it when anything was removed.
    fn remove_from<A: ?Sized>(
        &mut self,
        now: u64,
        key: &str,
        what: &A,
        remove: impl FnOnce(&mut Value, &A) -> Result<usize, Reply>,
    ) -> Reply {
        self.expire_if_needed(now, key);
        let Some(entry) = self.entries.get_mut(key) else {
            return Reply::Int(0);
        };
        let removed = match remove(&mut entry.value, what) {
            Ok(n) => n,
            Err(reply) => return reply,
        };
        let empty = match &entry.value {
            Value::Str(_) => false,
            Value::Hash(h) => h.is_empty(),
            Value::Set(s) => s.is_empty(),
            Value::ZSet(z) => z.is_empty(),
        };
        if empty {
            self.entries.remove(key);
        }
        if removed > 0 {
            self.touch(key);
        }
        int(removed)
    }

    fn zinterstore(&mut self, now: u64, dest: &str, keys: &[String], weights: &[i64]) -> Reply {
        if keys.is_empty() {
            return error("ERR at least 1 input key is needed for 'zinterstore' command");
        }
        // Redis reads (and type-checks) every source before parsing WEIGHTS.
        let mut sources: Vec<Option<BTreeMap<String, i64>>> = Vec::with_capacity(keys.len());
        for key in keys {
            sources.push(match self.read(now, key) {
                None => None,
                Some(Value::ZSet(z)) => Some(z.clone()),
                Some(Value::Set(s)) => Some(s.iter().map(|m| (m.clone(), 1)).collect()),
                Some(_) => return wrongtype(),
            });
        }
        if !weights.is_empty() && weights.len() != keys.len() {
            return error("ERR syntax error");
        }
        let weight = |i: usize| weights.get(i).copied().unwrap_or(1);
        let mut result = BTreeMap::new();
        if let Some(Some(first)) = sources.first() {
            'members: for (member, score) in first {
                let mut sum = score.saturating_mul(weight(0));
                for (i, source) in sources.iter().enumerate().skip(1) {
                    match source.as_ref().and_then(|s| s.get(member)) {
                        Some(s) => sum = sum.saturating_add(s.saturating_mul(weight(i))),
                        None => continue 'members,
                    }
                }
                result.insert(member.clone(), sum);
            }
        }
        let cardinality = result.len();
        self.expire_if_needed(now, dest);
        if cardinality > 0 {
            self.entries.insert(
                dest.to_owned(),
                Entry {
                    value: Value::ZSet(result),
                    expires_at: None,
                },
            );
            self.touch(dest);
        } else if self.entries.remove(dest).is_some() {
            self.touch(dest);
        }
        int(cardinality)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_i64_follows_string2ll() {
        for ok in [
            "0",
            "1",
            "-1",
            "9223372036854775807",
            "-9223372036854775808",
            "10",
        ] {
            assert!(parse_i64(ok).is_some(), "{ok}");
        }
        for bad in [
            "",
            "-",
            "-0",
            "007",
            "+1",
            " 1",
            "1 ",
            "1.0",
            "9223372036854775808",
            "abc",
            "0x1",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad}");
        }
    }

    #[test]
    fn rank_order_is_score_then_member() {
        let z: BTreeMap<String, i64> = [
            ("b".to_owned(), 1),
            ("a".to_owned(), 2),
            ("c".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(by_rank(&z), [("b", 1), ("c", 1), ("a", 2)]);
    }
}
