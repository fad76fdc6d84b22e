//! What the nemesis clients write and what the protected resource keeps.

use serde::{Deserialize, Serialize};

/// How an operation ended, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It took effect.
    Ok,
    /// It certainly did not take effect.
    Fail,
    /// It may or may not have taken effect (a timeout, a lost connection).
    Indeterminate,
}

impl Outcome {
    /// `ok`, `fail` or `indeterminate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Indeterminate => "indeterminate",
        }
    }
}

/// Which step of a client's loop an [`OpRecord`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// Acquire the lock or a permit.
    Acquire,
    /// The critical section's read of the resource (its entry).
    Read,
    /// The critical section's write to the resource (its exit).
    Write,
    /// The client left its section without writing (validity too short,
    /// `lost()` fired).
    Abandon,
    /// Release the hold.
    Release,
}

/// One operation of one client, written as a JSON line.
///
/// Times are microseconds since the Unix epoch on the host kernel's clock
/// (containers share it), which the client reads through the vDSO, past
/// libfaketime, also when its own clock is skewed (`client-skew`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRecord {
    /// The client's number.
    pub client: u32,
    /// The loop iteration (one acquire, section and release).
    pub seq: u64,
    /// The step.
    pub op: OpKind,
    /// When the client invoked it.
    pub invoke_us: u64,
    /// When it completed.
    pub complete_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The hold's fence, when the protocol issues one.
    pub fence: Option<u64>,
    /// Free text: the error, the reason for abandoning.
    #[serde(default)]
    pub detail: String,
}

/// One entry of the protected resource's log: every read and write that
/// reached the resource, accepted or refused, in the order the resource
/// (a single-threaded Redis running one Lua script) executed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The writing client.
    pub client: u32,
    /// Its loop iteration.
    pub seq: u64,
    /// [`OpKind::Read`] or [`OpKind::Write`].
    pub op: OpKind,
    /// The fence sent, if any.
    pub fence: Option<u64>,
    /// Did the resource accept it?
    pub accepted: bool,
    /// The resource's clock (`TIME`) when it ran, in µs.
    pub at_us: u64,
}

impl LogEntry {
    /// Parses `client|seq|read or write|fence or empty|ok or refused|µs`.
    pub fn parse(text: &str) -> Option<LogEntry> {
        let mut parts = text.split('|');
        let client = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let op = match parts.next()? {
            "read" => OpKind::Read,
            "write" => OpKind::Write,
            _ => return None,
        };
        let fence = match parts.next()? {
            "" => None,
            fence => Some(fence.parse().ok()?),
        };
        let accepted = match parts.next()? {
            "ok" => true,
            "refused" => false,
            _ => return None,
        };
        let at_us = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(LogEntry {
            client,
            seq,
            op,
            fence,
            accepted,
            at_us,
        })
    }

    /// The text [`LogEntry::parse`] reads.
    pub fn to_text(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.client,
            self.seq,
            if self.op == OpKind::Read {
                "read"
            } else {
                "write"
            },
            self.fence.map(|f| f.to_string()).unwrap_or_default(),
            if self.accepted { "ok" } else { "refused" },
            self.at_us
        )
    }
}

/// The resource's script: `KEYS[1]` the log (a list), `KEYS[2]` the
/// highest fence accepted; `ARGV` client, seq, `read` or `write`, fence
/// (empty for none). A fenced access with a fence lower than the highest
/// accepted is refused; an access without a fence is accepted (the
/// resource of an unfenced protocol). Every access is appended to the log,
/// refused ones too. Returns 1 when accepted, 0 when refused.
pub const RESOURCE_SCRIPT: &str = r#"
local fence = ARGV[4]
local accepted = true
if fence ~= '' then
  local high = redis.call('GET', KEYS[2])
  if high and tonumber(fence) < tonumber(high) then
    accepted = false
  elseif (not high) or tonumber(fence) > tonumber(high) then
    redis.call('SET', KEYS[2], fence)
  end
end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local verdict = 'refused'
if accepted then verdict = 'ok' end
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. fence .. '|' .. verdict .. '|' .. string.format('%d', us))
if accepted then return 1 end
return 0
"#;

/// The resource's log key for lock `name`.
pub fn log_key(name: &str) -> String {
    format!("nemesis:{name}:log")
}

/// The resource's list of marks for lock `name`: `client|seq`, pushed by a
/// client as it begins the last step of its section (the modify step and
/// the write, which run to their end once begun). Not part of the log the
/// checker judges; the nemesis aims some faults at it.
pub fn marks_key(name: &str) -> String {
    format!("nemesis:{name}:marks")
}

/// The resource's highest-fence key for lock `name`.
pub fn high_key(name: &str) -> String {
    format!("nemesis:{name}:high")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entries_round_trip_and_garbage_is_refused() {
        let entry = LogEntry {
            client: 3,
            seq: 17,
            op: OpKind::Write,
            fence: Some(9),
            accepted: false,
            at_us: 1_700_000_000_123_456,
        };
        assert_eq!(LogEntry::parse(&entry.to_text()), Some(entry));
        let unfenced = "1|2|read||ok|5";
        assert_eq!(LogEntry::parse(unfenced).map(|e| e.fence), Some(None));
        for bad in [
            "",
            "1|2|read||ok",
            "1|2|jump||ok|5",
            "x|2|read||ok|5",
            "1|2|read||ok|5|6",
        ] {
            assert_eq!(LogEntry::parse(bad), None, "{bad}");
        }
    }
}
