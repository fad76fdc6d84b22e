//! Exact keys (interop mode): the core names every key after the lock's
//! hash tag (`{name}`, `{name}:fence`, ...); with `LockOptions::exact_key`
//! the adapter rewrites those names on their way to Redis so that the lock
//! key is the name exactly as given (`name`, `name:fence`, ...), the key a
//! peer library (redis-py, rslock, Redisson) uses.

use lockwright_core::keyspace::Command;

/// The rewrite from the core's tagged keys to the exact ones.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyMap {
    /// The core's lock key, `{placeholder}`.
    tagged: String,
    /// The key as the user gave it.
    exact: String,
}

impl KeyMap {
    pub(crate) fn new(tagged: String, exact: String) -> KeyMap {
        KeyMap { tagged, exact }
    }

    /// `key` as Redis should see it: the lock key and its companions
    /// (`<lock key>:suffix`) renamed, anything else untouched.
    pub(crate) fn key(&self, key: &str) -> String {
        match key.strip_prefix(self.tagged.as_str()) {
            Some(rest) if rest.is_empty() || rest.starts_with(':') => {
                format!("{}{rest}", self.exact)
            }
            _ => key.to_owned(),
        }
    }

    fn rename(&self, key: &mut String) {
        let mapped = self.key(key);
        *key = mapped;
    }

    fn rename_all(&self, keys: &mut [String]) {
        for key in keys {
            self.rename(key);
        }
    }

    /// Rename every key (and the notice channel) of `command`.
    pub(crate) fn command(&self, command: &mut Command) {
        match command {
            Command::Set { key, .. }
            | Command::SetNx { key, .. }
            | Command::Get { key }
            | Command::GetSet { key, .. }
            | Command::Expire { key, .. }
            | Command::PExpire { key, .. }
            | Command::Ttl { key }
            | Command::PTtl { key }
            | Command::Incr { key }
            | Command::HIncrBy { key, .. }
            | Command::HExists { key, .. }
            | Command::HGet { key, .. }
            | Command::HDel { key, .. }
            | Command::SAdd { key, .. }
            | Command::SRem { key, .. }
            | Command::SCard { key }
            | Command::SIsMember { key, .. }
            | Command::ZAdd { key, .. }
            | Command::ZRem { key, .. }
            | Command::ZRank { key, .. }
            | Command::ZScore { key, .. }
            | Command::ZCard { key }
            | Command::ZRemRangeByScore { key, .. } => self.rename(key),
            Command::Del { keys } | Command::Exists { keys } | Command::Watch { keys } => {
                self.rename_all(keys)
            }
            Command::ZInterStore { dest, keys, .. } => {
                self.rename(dest);
                self.rename_all(keys);
            }
            Command::Publish { channel, .. } => self.rename(channel),
            Command::Eval { keys, .. } => self.rename_all(keys),
            Command::Transaction(commands) => {
                for command in commands {
                    self.command(command);
                }
            }
            Command::Time
            | Command::Unwatch
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Wait { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_key_and_its_companions_are_renamed_and_nothing_else() {
        let map = KeyMap::new("{p}".into(), "orders:1".into());
        assert_eq!(map.key("{p}"), "orders:1");
        assert_eq!(map.key("{p}:fence"), "orders:1:fence");
        assert_eq!(map.key("{p}x"), "{p}x");
        assert_eq!(map.key("other"), "other");
        let mut eval = Command::Eval {
            script: lockwright_core::keyspace::Script::FencedAcquire,
            keys: vec!["{p}".into(), "{p}:fence".into()],
            args: vec!["{p}".into()],
        };
        map.command(&mut eval);
        let Command::Eval { keys, args, .. } = eval else {
            unreachable!()
        };
        assert_eq!(keys, ["orders:1", "orders:1:fence"]);
        assert_eq!(args, ["{p}"], "arguments are not keys");
    }
}
