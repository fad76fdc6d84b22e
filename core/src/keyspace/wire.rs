//! How a [`Command`] goes over the wire: the argument vectors a front end
//! sends, in order, and which reply answers the command.
//!
//! - A single command is one argument vector ([`Command::argv`]).
//! - [`Command::Eval`] is sent as `EVALSHA <sha1> numkeys keys… args…`
//!   ([`Script::sha1`]); when the server answers `NOSCRIPT` (after
//!   `SCRIPT FLUSH`, a restart or a failover), send
//!   [`Command::eval_text_argv`] instead (`EVAL <text> …`). Both run the same
//!   script, and only one of them runs.
//! - [`Command::Transaction`] is `MULTI`, each inner command, `EXEC`, written
//!   together on one connection ([`Command::frames`]); the command's reply is
//!   the last one, `EXEC`'s (an array, or nil when a watched key changed).
//!   Nothing may be sent on that connection in between.
//!
//! RESP framing of a vector is `*<n>\r\n` then `$<len>\r\n<arg>\r\n` per
//! argument; replies map to [`Reply`](super::Reply) as RESP2 types do (an error reply is
//! [`Reply::Error`](super::Reply::Error) with Redis' full text, `-` stripped).

use super::command::{Command, ScoreBound, SetCondition, SetExpiry};
use super::script::Script;

fn score(bound: ScoreBound) -> String {
    match bound {
        ScoreBound::NegInf => "-inf".to_owned(),
        ScoreBound::PosInf => "+inf".to_owned(),
        ScoreBound::Inclusive(n) => n.to_string(),
        ScoreBound::Exclusive(n) => format!("({n}"),
    }
}

fn vector(name: &str, args: &[&str]) -> Vec<String> {
    std::iter::once(name)
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

fn with_all(name: &str, first: &[&str], rest: &[String]) -> Vec<String> {
    let mut v = vector(name, first);
    v.extend(rest.iter().cloned());
    v
}

fn eval(name: &str, script_or_sha: &str, keys: &[String], args: &[String]) -> Vec<String> {
    let mut v = Vec::with_capacity(3 + keys.len() + args.len());
    v.push(name.to_owned());
    v.push(script_or_sha.to_owned());
    v.push(keys.len().to_string());
    v.extend(keys.iter().cloned());
    v.extend(args.iter().cloned());
    v
}

impl Command {
    /// The argument vector of this command as Redis reads it (`EVALSHA` for
    /// a script). `None` for [`Command::Transaction`], which is several:
    /// see [`Command::frames`].
    pub fn argv(&self) -> Option<Vec<String>> {
        Some(match self {
            Command::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => {
                let mut v = vector("SET", &[key, value]);
                match condition {
                    SetCondition::Always => {}
                    SetCondition::Nx => v.push("NX".into()),
                    SetCondition::Xx => v.push("XX".into()),
                }
                match expiry {
                    SetExpiry::None => {}
                    SetExpiry::Px(ms) => v.extend(["PX".into(), ms.to_string()]),
                    SetExpiry::PxAt(ms) => v.extend(["PXAT".into(), ms.to_string()]),
                }
                if *get {
                    v.push("GET".into());
                }
                v
            }
            Command::SetNx { key, value } => vector("SETNX", &[key, value]),
            Command::Get { key } => vector("GET", &[key]),
            Command::GetSet { key, value } => vector("GETSET", &[key, value]),
            Command::Del { keys } => with_all("DEL", &[], keys),
            Command::Exists { keys } => with_all("EXISTS", &[], keys),
            Command::Expire { key, seconds } => vector("EXPIRE", &[key, &seconds.to_string()]),
            Command::PExpire { key, millis } => vector("PEXPIRE", &[key, &millis.to_string()]),
            Command::Ttl { key } => vector("TTL", &[key]),
            Command::PTtl { key } => vector("PTTL", &[key]),
            Command::Incr { key } => vector("INCR", &[key]),
            Command::HIncrBy { key, field, by } => {
                vector("HINCRBY", &[key, field, &by.to_string()])
            }
            Command::HExists { key, field } => vector("HEXISTS", &[key, field]),
            Command::HGet { key, field } => vector("HGET", &[key, field]),
            Command::HDel { key, fields } => with_all("HDEL", &[key], fields),
            Command::SAdd { key, members } => with_all("SADD", &[key], members),
            Command::SRem { key, members } => with_all("SREM", &[key], members),
            Command::SCard { key } => vector("SCARD", &[key]),
            Command::SIsMember { key, member } => vector("SISMEMBER", &[key, member]),
            Command::ZAdd { key, members } => {
                let mut v = vector("ZADD", &[key]);
                for (s, member) in members {
                    v.push(s.to_string());
                    v.push(member.clone());
                }
                v
            }
            Command::ZRem { key, members } => with_all("ZREM", &[key], members),
            Command::ZRank { key, member } => vector("ZRANK", &[key, member]),
            Command::ZScore { key, member } => vector("ZSCORE", &[key, member]),
            Command::ZCard { key } => vector("ZCARD", &[key]),
            Command::ZRemRangeByScore { key, min, max } => {
                vector("ZREMRANGEBYSCORE", &[key, &score(*min), &score(*max)])
            }
            Command::ZInterStore {
                dest,
                keys,
                weights,
            } => {
                let mut v = with_all("ZINTERSTORE", &[dest, &keys.len().to_string()], keys);
                v.push("WEIGHTS".into());
                v.extend(weights.iter().map(i64::to_string));
                v
            }
            Command::Time => vector("TIME", &[]),
            Command::Watch { keys } => with_all("WATCH", &[], keys),
            Command::Unwatch => vector("UNWATCH", &[]),
            Command::Multi => vector("MULTI", &[]),
            Command::Exec => vector("EXEC", &[]),
            Command::Discard => vector("DISCARD", &[]),
            Command::Transaction(_) => return None,
            Command::Wait {
                replicas,
                timeout_ms,
            } => vector("WAIT", &[&replicas.to_string(), &timeout_ms.to_string()]),
            Command::Publish { channel, message } => vector("PUBLISH", &[channel, message]),
            Command::Eval { script, keys, args } => eval("EVALSHA", script.sha1(), keys, args),
        })
    }

    /// The vectors to write, in order, for this command: one for a single
    /// command, `MULTI` … `EXEC` for a transaction. The command's reply is
    /// the reply to the last vector.
    pub fn frames(&self) -> Vec<Vec<String>> {
        match self {
            Command::Transaction(commands) => {
                let mut frames = vec![vector("MULTI", &[])];
                frames.extend(commands.iter().flat_map(Command::frames));
                frames.push(vector("EXEC", &[]));
                frames
            }
            single => single.argv().into_iter().collect(),
        }
    }

    /// For [`Command::Eval`], the `EVAL` vector carrying the script's text:
    /// what to send when `EVALSHA` was answered `NOSCRIPT`.
    pub fn eval_text_argv(&self) -> Option<Vec<String>> {
        match self {
            Command::Eval { script, keys, args } => Some(eval("EVAL", script.lua(), keys, args)),
            _ => None,
        }
    }
}

impl Script {
    /// The SHA1 of the script's text, in hex: what `EVALSHA` names it by.
    pub fn sha1(self) -> &'static str {
        use std::sync::OnceLock;
        static SHAS: OnceLock<Vec<String>> = OnceLock::new();
        let shas = SHAS.get_or_init(|| {
            Script::ALL
                .iter()
                .map(|s| hex(&sha1(s.lua().as_bytes())))
                .collect()
        });
        Script::ALL
            .iter()
            .position(|&s| s == self)
            .and_then(|i| shas.get(i))
            .map_or("", String::as_str)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-1 (FIPS 180-4), for script names only: not for anything secret.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut message = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bits.to_be_bytes());
    for block in message.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, &wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_matches_the_standard_vectors() {
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(&sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
    }

    #[test]
    fn a_script_sha1_is_the_one_redis_names_it_by() {
        // `SCRIPT LOAD` of this text on redis-server 7 answers this SHA1
        // (tests/tests/scripts.rs checks every script against a live server).
        assert_eq!(
            Script::CompareAndPExpire.sha1(),
            "b08102f5c0d4d4e605c7ec82cb3dbc3c344d9147"
        );
    }

    #[test]
    fn a_transaction_is_multi_its_commands_exec() {
        let t = Command::Transaction(vec![
            Command::Incr { key: "n".into() },
            Command::Del {
                keys: vec!["a".into(), "b".into()],
            },
        ]);
        assert_eq!(t.argv(), None);
        assert_eq!(
            t.frames(),
            [
                vec!["MULTI"],
                vec!["INCR", "n"],
                vec!["DEL", "a", "b"],
                vec!["EXEC"]
            ]
        );
    }

    #[test]
    fn a_script_goes_by_its_sha_with_the_text_as_fallback() {
        let c = Command::Eval {
            script: Script::CompareAndDelete,
            keys: vec!["{a}".into()],
            args: vec!["t".into()],
        };
        let sha = Script::CompareAndDelete.sha1();
        assert_eq!(sha.len(), 40);
        assert_eq!(
            c.argv(),
            Some(vec![
                "EVALSHA".into(),
                sha.into(),
                "1".into(),
                "{a}".into(),
                "t".into()
            ])
        );
        let text = c.eval_text_argv().expect("a script");
        assert_eq!(text[0], "EVAL");
        assert_eq!(text[1], Script::CompareAndDelete.lua());
    }

    #[test]
    fn set_nx_px_is_what_redis_reads() {
        let c = Command::Set {
            key: "{a}".into(),
            value: "t".into(),
            condition: SetCondition::Nx,
            expiry: SetExpiry::Px(100),
            get: false,
        };
        assert_eq!(c.frames(), [vec!["SET", "{a}", "t", "NX", "PX", "100"]]);
    }
}
