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

/// One argument of a command as it goes over the wire, borrowed from the
/// command: a string, or a number that is written in decimal. What
/// [`Command::for_each_vector`] hands out, so that a front end can write a
/// command's arguments (into its own buffer, RESP, or a client library's
/// command type) without building a string for each of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg<'a> {
    /// A string, as it is.
    Str(&'a str),
    /// A signed integer, in decimal.
    Int(i64),
    /// An unsigned integer, in decimal.
    UInt(u64),
    /// A `ZREMRANGEBYSCORE` bound: `-inf`, `+inf`, `5` or `(5`.
    Score(ScoreBound),
}

impl Arg<'_> {
    /// Call `f` with the argument's bytes (a number is written into a
    /// buffer on the stack: no allocation).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut buf = [0u8; 24];
        match *self {
            Arg::Str(s) => f(s.as_bytes()),
            Arg::Int(n) => f(decimal(n.unsigned_abs(), n < 0, false, &mut buf)),
            Arg::UInt(n) => f(decimal(n, false, false, &mut buf)),
            Arg::Score(ScoreBound::NegInf) => f(b"-inf"),
            Arg::Score(ScoreBound::PosInf) => f(b"+inf"),
            Arg::Score(ScoreBound::Inclusive(n)) => {
                f(decimal(n.unsigned_abs(), n < 0, false, &mut buf))
            }
            Arg::Score(ScoreBound::Exclusive(n)) => {
                f(decimal(n.unsigned_abs(), n < 0, true, &mut buf))
            }
        }
    }

    /// The argument as an owned string.
    pub fn to_string_lossy(&self) -> String {
        self.with_bytes(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// `magnitude` in decimal at the end of `buf`, after `-` when `negative`
/// and `(` when `open` (on 64 bits: a 128-bit division is a library call).
fn decimal(magnitude: u64, negative: bool, open: bool, buf: &mut [u8; 24]) -> &[u8] {
    let mut at = buf.len();
    let mut rest = magnitude;
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    if open {
        at -= 1;
        buf[at] = b'(';
    }
    &buf[at..]
}

fn strs<'a>(v: &mut ArgBuf<'a>, items: &'a [String]) {
    v.extend(items.iter().map(|s| Arg::Str(s)));
}

/// How many arguments an [`ArgBuf`] holds without allocating: every
/// command the catalogue's protocols send fits (the longest, a script
/// call, is `EVALSHA`, the SHA, the key count, up to four keys and four
/// arguments).
const INLINE_ARGS: usize = 12;

/// One argument vector being built: on the stack up to [`INLINE_ARGS`]
/// arguments, on the heap beyond (so that writing a command allocates
/// nothing for its argument list).
struct ArgBuf<'a> {
    inline: [Arg<'a>; INLINE_ARGS],
    len: usize,
    /// Every argument, once there are more than fit inline.
    spill: Vec<Arg<'a>>,
}

impl<'a> ArgBuf<'a> {
    fn new() -> ArgBuf<'a> {
        ArgBuf {
            inline: [Arg::UInt(0); INLINE_ARGS],
            len: 0,
            spill: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.len = 0;
        self.spill.clear();
    }

    fn push(&mut self, arg: Arg<'a>) {
        if self.spill.is_empty() && self.len < INLINE_ARGS {
            self.inline[self.len] = arg;
            self.len += 1;
            return;
        }
        if self.spill.is_empty() {
            self.spill.extend_from_slice(&self.inline[..self.len]);
        }
        self.spill.push(arg);
    }

    fn extend(&mut self, args: impl IntoIterator<Item = Arg<'a>>) {
        for arg in args {
            self.push(arg);
        }
    }

    fn as_slice(&self) -> &[Arg<'a>] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    fn set(&mut self, at: usize, arg: Arg<'a>) {
        if self.spill.is_empty() {
            self.inline[at] = arg;
        } else {
            self.spill[at] = arg;
        }
    }
}

impl Command {
    /// The arguments of this command, if it is a single vector, appended to
    /// `v`; `false` for [`Command::Transaction`] (several vectors).
    fn args<'a>(&'a self, v: &mut ArgBuf<'a>) -> bool {
        use Arg::{Int, Str, UInt};
        match self {
            Command::Set {
                key,
                value,
                condition,
                expiry,
                get,
            } => {
                v.extend([Str("SET"), Str(key), Str(value)]);
                match condition {
                    SetCondition::Always => {}
                    SetCondition::Nx => v.push(Str("NX")),
                    SetCondition::Xx => v.push(Str("XX")),
                }
                match expiry {
                    SetExpiry::None => {}
                    SetExpiry::Px(ms) => v.extend([Str("PX"), UInt(*ms)]),
                    SetExpiry::PxAt(ms) => v.extend([Str("PXAT"), UInt(*ms)]),
                }
                if *get {
                    v.push(Str("GET"));
                }
            }
            Command::SetNx { key, value } => v.extend([Str("SETNX"), Str(key), Str(value)]),
            Command::Get { key } => v.extend([Str("GET"), Str(key)]),
            Command::GetSet { key, value } => v.extend([Str("GETSET"), Str(key), Str(value)]),
            Command::Del { keys } => {
                v.push(Str("DEL"));
                strs(v, keys);
            }
            Command::Exists { keys } => {
                v.push(Str("EXISTS"));
                strs(v, keys);
            }
            Command::Expire { key, seconds } => v.extend([Str("EXPIRE"), Str(key), Int(*seconds)]),
            Command::PExpire { key, millis } => v.extend([Str("PEXPIRE"), Str(key), Int(*millis)]),
            Command::Ttl { key } => v.extend([Str("TTL"), Str(key)]),
            Command::PTtl { key } => v.extend([Str("PTTL"), Str(key)]),
            Command::Incr { key } => v.extend([Str("INCR"), Str(key)]),
            Command::HIncrBy { key, field, by } => {
                v.extend([Str("HINCRBY"), Str(key), Str(field), Int(*by)]);
            }
            Command::HExists { key, field } => v.extend([Str("HEXISTS"), Str(key), Str(field)]),
            Command::HGet { key, field } => v.extend([Str("HGET"), Str(key), Str(field)]),
            Command::HDel { key, fields } => {
                v.extend([Str("HDEL"), Str(key)]);
                strs(v, fields);
            }
            Command::SAdd { key, members } => {
                v.extend([Str("SADD"), Str(key)]);
                strs(v, members);
            }
            Command::SRem { key, members } => {
                v.extend([Str("SREM"), Str(key)]);
                strs(v, members);
            }
            Command::SCard { key } => v.extend([Str("SCARD"), Str(key)]),
            Command::SIsMember { key, member } => {
                v.extend([Str("SISMEMBER"), Str(key), Str(member)]);
            }
            Command::ZAdd { key, members } => {
                v.extend([Str("ZADD"), Str(key)]);
                for (score, member) in members {
                    v.extend([Int(*score), Str(member)]);
                }
            }
            Command::ZRem { key, members } => {
                v.extend([Str("ZREM"), Str(key)]);
                strs(v, members);
            }
            Command::ZRank { key, member } => v.extend([Str("ZRANK"), Str(key), Str(member)]),
            Command::ZScore { key, member } => v.extend([Str("ZSCORE"), Str(key), Str(member)]),
            Command::ZCard { key } => v.extend([Str("ZCARD"), Str(key)]),
            Command::ZRemRangeByScore { key, min, max } => v.extend([
                Str("ZREMRANGEBYSCORE"),
                Str(key),
                Arg::Score(*min),
                Arg::Score(*max),
            ]),
            Command::ZInterStore {
                dest,
                keys,
                weights,
            } => {
                v.extend([Str("ZINTERSTORE"), Str(dest), UInt(keys.len() as u64)]);
                strs(v, keys);
                v.push(Str("WEIGHTS"));
                v.extend(weights.iter().map(|w| Int(*w)));
            }
            Command::Time => v.push(Str("TIME")),
            Command::Watch { keys } => {
                v.push(Str("WATCH"));
                strs(v, keys);
            }
            Command::Unwatch => v.push(Str("UNWATCH")),
            Command::Multi => v.push(Str("MULTI")),
            Command::Exec => v.push(Str("EXEC")),
            Command::Discard => v.push(Str("DISCARD")),
            Command::Transaction(_) => return false,
            Command::Wait {
                replicas,
                timeout_ms,
            } => v.extend([Str("WAIT"), UInt(u64::from(*replicas)), UInt(*timeout_ms)]),
            Command::Publish { channel, message } => {
                v.extend([Str("PUBLISH"), Str(channel), Str(message)]);
            }
            Command::Eval { script, keys, args } => {
                v.extend([Str("EVALSHA"), Str(script.sha1()), UInt(keys.len() as u64)]);
                strs(v, keys);
                strs(v, args);
            }
        }
        true
    }

    /// Call `f` with each argument vector to write for this command, in
    /// order: the same vectors as [`Command::frames`], borrowed from the
    /// command (built on the stack: no allocation for a vector of up to 12
    /// arguments, a heap buffer growing as a vector's does beyond, none per
    /// argument).
    pub fn for_each_vector<'a>(&'a self, mut f: impl FnMut(&[Arg<'a>])) {
        let mut scratch = ArgBuf::new();
        self.vectors(&mut scratch, &mut f);
    }

    fn vectors<'a>(&'a self, scratch: &mut ArgBuf<'a>, f: &mut impl FnMut(&[Arg<'a>])) {
        scratch.clear();
        if self.args(scratch) {
            f(scratch.as_slice());
            return;
        }
        if let Command::Transaction(commands) = self {
            f(&[Arg::Str("MULTI")]);
            for command in commands {
                command.vectors(scratch, f);
            }
            f(&[Arg::Str("EXEC")]);
        }
    }

    /// The argument vector of this command as Redis reads it (`EVALSHA` for
    /// a script). `None` for [`Command::Transaction`], which is several:
    /// see [`Command::frames`].
    pub fn argv(&self) -> Option<Vec<String>> {
        let mut v = ArgBuf::new();
        self.args(&mut v)
            .then(|| v.as_slice().iter().map(Arg::to_string_lossy).collect())
    }

    /// The vectors to write, in order, for this command: one for a single
    /// command, `MULTI` … `EXEC` for a transaction. The command's reply is
    /// the reply to the last vector.
    pub fn frames(&self) -> Vec<Vec<String>> {
        let mut frames = Vec::new();
        self.for_each_vector(|v| frames.push(v.iter().map(Arg::to_string_lossy).collect()));
        frames
    }

    /// For [`Command::Eval`], the `EVAL` vector carrying the script's text:
    /// what to send when `EVALSHA` was answered `NOSCRIPT`.
    pub fn eval_text_argv(&self) -> Option<Vec<String>> {
        let mut v = ArgBuf::new();
        match self {
            Command::Eval { script, .. } if self.args(&mut v) => {
                v.set(0, Arg::Str("EVAL"));
                v.set(1, Arg::Str(script.lua()));
                Some(v.as_slice().iter().map(Arg::to_string_lossy).collect())
            }
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
    fn numbers_are_written_as_rust_writes_them() {
        let cases = [
            (Arg::Int(0), "0".to_owned()),
            (Arg::Int(-7), "-7".to_owned()),
            (Arg::Int(i64::MIN), i64::MIN.to_string()),
            (Arg::Int(i64::MAX), i64::MAX.to_string()),
            (Arg::UInt(u64::MAX), u64::MAX.to_string()),
            (Arg::Score(ScoreBound::Exclusive(-3)), "(-3".to_owned()),
            (
                Arg::Score(ScoreBound::Exclusive(i64::MIN)),
                format!("({}", i64::MIN),
            ),
            (Arg::Score(ScoreBound::Inclusive(12)), "12".to_owned()),
            (Arg::Score(ScoreBound::NegInf), "-inf".to_owned()),
            (Arg::Score(ScoreBound::PosInf), "+inf".to_owned()),
        ];
        for (arg, text) in cases {
            assert_eq!(arg.to_string_lossy(), text, "{arg:?}");
        }
    }

    #[test]
    fn long_vectors_spill_to_the_heap_intact() {
        // Around the inline capacity: every argument, in order, whether the
        // vector fits on the stack or not. `DEL` with n keys has n + 1
        // arguments (3, exactly 12, the first spill at 13, and 26); the
        // script call has n + 5 (7 inline, then 16, 17 and 30).
        for n in [2, INLINE_ARGS - 1, INLINE_ARGS, 2 * INLINE_ARGS + 1] {
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let command = Command::Del { keys: keys.clone() };
            let mut expected = vec!["DEL".to_owned()];
            expected.extend(keys.iter().cloned());
            assert_eq!(command.argv(), Some(expected.clone()), "{n} keys");
            let mut seen: Vec<Vec<String>> = Vec::new();
            command.for_each_vector(|v| seen.push(v.iter().map(Arg::to_string_lossy).collect()));
            assert_eq!(seen, vec![expected], "{n} keys");
            let script = Command::Eval {
                script: Script::CompareAndDelete,
                keys: keys.clone(),
                args: vec!["a".into(), "b".into()],
            };
            let text = script.eval_text_argv().expect("a script");
            assert_eq!(text[0], "EVAL");
            assert_eq!(text[1], Script::CompareAndDelete.lua());
            assert_eq!(text[2], n.to_string());
            assert_eq!(text.len(), 3 + n + 2);
            assert_eq!(text[3 + n + 1], "b");
        }
        // A transaction reuses one buffer: a short command after a spilled
        // one is written from the stack again, whole and alone.
        let long: Vec<String> = (0..2 * INLINE_ARGS).map(|i| format!("k{i}")).collect();
        let transaction = Command::Transaction(vec![
            Command::Del { keys: long.clone() },
            Command::Get { key: "x".into() },
        ]);
        let mut seen: Vec<Vec<String>> = Vec::new();
        transaction.for_each_vector(|v| seen.push(v.iter().map(Arg::to_string_lossy).collect()));
        let mut del = vec!["DEL".to_owned()];
        del.extend(long);
        assert_eq!(
            seen,
            vec![
                vec!["MULTI".to_owned()],
                del,
                vec!["GET".to_owned(), "x".to_owned()],
                vec!["EXEC".to_owned()],
            ]
        );
    }

    #[test]
    fn borrowed_vectors_are_the_frames() {
        let t = Command::Transaction(vec![
            Command::ZRemRangeByScore {
                key: "z".into(),
                min: ScoreBound::NegInf,
                max: ScoreBound::Exclusive(5),
            },
            Command::Wait {
                replicas: 2,
                timeout_ms: 30,
            },
        ]);
        let mut seen = Vec::new();
        t.for_each_vector(|v| seen.push(v.iter().map(Arg::to_string_lossy).collect::<Vec<_>>()));
        assert_eq!(
            seen,
            [
                vec!["MULTI"],
                vec!["ZREMRANGEBYSCORE", "z", "-inf", "(5"],
                vec!["WAIT", "2", "30"],
                vec!["EXEC"],
            ]
        );
        assert_eq!(seen, t.frames());
    }

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
