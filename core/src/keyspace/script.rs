//! The catalogue's Lua scripts: their text (sent to real Redis) and their
//! meaning (executed atomically by the keyspace model). Each script's text
//! lives here once; the conformance tests check that both agree.
//!
//! Release scripts also `PUBLISH` on the channel `<lock key>:released` so
//! that waiters can be woken without polling; the keyspace model treats
//! `PUBLISH` as a no-op that reaches no subscriber.

/// A script of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Script {
    /// `KEYS[1]` lock key, `ARGV[1]` token. Deletes the key when it holds the
    /// token and returns 1 (publishing a release notice), else returns 0.
    CompareAndDelete,
    /// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` ttl ms. Sets the TTL when
    /// the key holds the token and returns 1, else returns 0.
    CompareAndPExpire,
    /// Redisson's reentrant lock. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner. When the key is missing or the owner already has a
    /// field, increments the owner's count, sets the TTL and returns nil;
    /// otherwise returns the key's PTTL.
    ReentrantLock,
    /// Redisson's reentrant unlock. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner. Nil when the owner holds nothing; otherwise decrements
    /// the count: when still positive sets the TTL and returns 0, else deletes
    /// the key, publishes a release notice and returns 1.
    ReentrantUnlock,
    /// Redisson's watchdog renewal. `KEYS[1]` hash key, `ARGV[1]` ttl ms,
    /// `ARGV[2]` owner. Sets the TTL and returns 1 when the owner has a field,
    /// else returns 0.
    ReentrantRenew,
    /// `KEYS[1]` lock key, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]`
    /// ttl ms. `SET NX PX`; on success `INCR`s the fence counter and returns
    /// the new fence, otherwise returns nil.
    FencedAcquire,
    /// `KEYS[1]` permits zset (member = permit token, score = deadline on the
    /// server clock in ms), `KEYS[2]` fence counter, `KEYS[3]` limit key,
    /// `ARGV[1]` token, `ARGV[2]` ttl ms, `ARGV[3]` limit used when the limit
    /// key is missing (then stored). Reads the server `TIME`, drops expired
    /// permits (deadline < now), and when fewer than `limit` remain adds the
    /// token with deadline now + ttl, `INCR`s the fence and returns it;
    /// otherwise returns nil.
    LeaseAcquire,
    /// `KEYS[1]` permits zset, `ARGV[1]` token. `ZREM`s the token, publishes
    /// a release notice when one was removed, returns the `ZREM` count.
    LeaseRelease,
    /// `KEYS[1]` permits zset, `ARGV[1]` token, `ARGV[2]` ttl ms. Reads the
    /// server `TIME`, drops expired permits; when the token is still present
    /// sets its deadline to now + ttl and returns 1, else returns 0.
    LeaseRenew,
}

impl Script {
    /// Every script, in a fixed order.
    pub const ALL: [Script; 9] = [
        Script::CompareAndDelete,
        Script::CompareAndPExpire,
        Script::ReentrantLock,
        Script::ReentrantUnlock,
        Script::ReentrantRenew,
        Script::FencedAcquire,
        Script::LeaseAcquire,
        Script::LeaseRelease,
        Script::LeaseRenew,
    ];

    /// A short stable name, used in traces.
    pub fn name(self) -> &'static str {
        match self {
            Script::CompareAndDelete => "compare-and-delete",
            Script::CompareAndPExpire => "compare-and-pexpire",
            Script::ReentrantLock => "reentrant-lock",
            Script::ReentrantUnlock => "reentrant-unlock",
            Script::ReentrantRenew => "reentrant-renew",
            Script::FencedAcquire => "fenced-acquire",
            Script::LeaseAcquire => "lease-acquire",
            Script::LeaseRelease => "lease-release",
            Script::LeaseRenew => "lease-renew",
        }
    }

    /// The Lua source sent to Redis.
    pub fn lua(self) -> &'static str {
        match self {
            Script::CompareAndDelete => {
                r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[1] .. ':released', ARGV[1])
  return 1
end
return 0"#
            }
            Script::CompareAndPExpire => {
                r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0"#
            }
            // The remaining scripts are filled in with the keyspace model.
            _ => "return redis.error_reply('ERR script not implemented')",
        }
    }
}
