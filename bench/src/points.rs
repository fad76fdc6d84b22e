//! `--point WHO:MASTERS:TASKS` (repeatable; WHO is `raw`, `raw-nagle`,
//! `rslock` or `adapter:<protocol>`): section 1's measurement of the
//! named points only, each run `--rounds` times in turn (so that the points
//! share the machine's ups and downs), printed on stdout; no report is
//! written. For comparing a change side by side and for profiling one
//! point (`perf record` on the bench process).

use crate::throughput::{self, Contender};
use crate::util::{BenchError, Result};
use lockwright_core::ProtocolId;
use lockwright_tests::RedisServer;
use std::sync::Arc;
use std::time::Duration;

/// One point asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `raw`, `rslock` or `adapter:<protocol>`.
    pub(crate) who: String,
    protocol: Option<ProtocolId>,
    masters: usize,
    tasks: usize,
}

/// `WHO:MASTERS:TASKS`, e.g. `adapter:set-px-lua:1:16` or `raw:5:16`.
pub(crate) fn parse(text: &str) -> Result<Spec> {
    let bad = |why: &str| {
        BenchError(format!(
            "--point {text:?}: {why} (WHO:MASTERS:TASKS, e.g. adapter:set-px-lua:1:16 or raw:5:16)"
        ))
    };
    let mut parts: Vec<&str> = text.rsplitn(3, ':').collect();
    parts.reverse();
    let [who, masters, tasks] = parts[..] else {
        return Err(bad("three fields needed"));
    };
    let masters: usize = masters
        .parse()
        .map_err(|_| bad("MASTERS is not a number"))?;
    let tasks: usize = tasks.parse().map_err(|_| bad("TASKS is not a number"))?;
    if !(1..=5).contains(&masters) {
        return Err(bad("MASTERS must be 1 to 5"));
    }
    if !(1..=1024).contains(&tasks) {
        return Err(bad("TASKS must be 1 to 1024"));
    }
    let protocol = match who.strip_prefix("adapter:") {
        Some(name) => Some(
            name.parse::<ProtocolId>()
                .map_err(|_| bad(&format!("no protocol named {name:?}")))?,
        ),
        None if throughput::WHO.contains(&who) => None,
        None => return Err(bad("WHO is raw, raw-nagle, rslock or adapter:<protocol>")),
    };
    if protocol.is_some_and(|p| p != ProtocolId::Redlock) && masters != 1 {
        return Err(bad("only redlock runs on more than one master"));
    }
    Ok(Spec {
        who: who.to_owned(),
        protocol,
        masters,
        tasks,
    })
}

/// Measure `specs` in turn, `rounds` times, against `masters`.
pub(crate) async fn run(
    specs: &[Spec],
    rounds: usize,
    warmup: Duration,
    window: Duration,
    masters: &[RedisServer],
) -> Result<()> {
    println!("| round | point | cycles/s | client CPU µs/cycle | of which system | server CPU µs/cycle | commands/cycle | allocations/cycle | cycles run |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for round in 1..=rounds {
        for spec in specs {
            let servers = &masters[..spec.masters];
            let mut admins = Vec::new();
            for s in servers {
                admins.push(s.conn().await);
            }
            let contender = Contender::named(&spec.who, spec.protocol, servers, spec.tasks).await?;
            let point =
                throughput::measure(&mut admins, Arc::new(contender), spec.tasks, warmup, window)
                    .await?;
            println!(
                "| {round} | {}:{}:{} | {:.0} | {} | {} | {:.1} | {:.2} | {:.1} | {} |",
                spec.who,
                spec.masters,
                spec.tasks,
                point.per_sec,
                point
                    .client_cpu_us
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                point
                    .client_sys_us
                    .map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1}")),
                point.server_cpu_us,
                point.commands_per_cycle,
                point.allocs_per_cycle,
                point.cycles_run
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_and_bad_ones_are_refused() {
        let p = parse("adapter:set-px-lua:1:16").expect("valid");
        assert_eq!(p.who, "adapter:set-px-lua");
        assert_eq!(p.protocol, Some(ProtocolId::SetPxLua));
        assert_eq!((p.masters, p.tasks), (1, 16));
        assert_eq!(parse("raw:5:1").expect("valid").protocol, None);
        assert_eq!(parse("raw-nagle:1:16").expect("valid").who, "raw-nagle");
        for bad in [
            "raw:5",
            "raw:x:1",
            "raw:6:1",
            "adapter:nope:1:1",
            "who:1:1",
            "raw:1:0",
        ] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
