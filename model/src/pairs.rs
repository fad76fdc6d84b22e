//! Fault pairs: two fault classes in one run, each acting at most once
//! (`lockwright check --faults a+b`).
//!
//! A pair's run can do everything either fault's run can (it may leave the
//! other fault unused), with one exception that changes a run from its
//! first step: `client-skew` sets a client's clock for the whole run. (A
//! failover's replica only adds steps, replication and the promotion: no
//! client of the model waits for replicas.) So a property violated under
//! either fault alone is violated under the pair too, unless the other is
//! `client-skew`; what a pair adds is a violation neither fault shows
//! alone. [`PairCell::new`] says which cells are such.
//!
//! A promotion puts another machine in node 0's slot: what a restart, a
//! clock fault or a cut did to the old master does not carry over to it.
//!
//! Symmetry: with two client-level faults (crash, pause, delay), or one
//! beside `client-skew`, a fault may strike any client; with two node
//! faults (clock-jump, a restart, a failover, partition), any node. Each
//! fault alone keeps its reduction (see `LockModel::may_strike`).

use crate::cache::Cache;
use crate::fault::{Fault, FaultPair, PropertyId};
use crate::matrix::{self, CheckError, Run, Trace, Verdict};
use crate::model::{LockModel, ModelConfig};
use lockwright_core::ProtocolId;

/// The model that checks `properties` of `protocol` under both faults of
/// `pair`, at the standard bounds for those properties.
pub fn pair_model(
    protocol: ProtocolId,
    pair: FaultPair,
    properties: Vec<PropertyId>,
) -> Result<LockModel, CheckError> {
    let cfg =
        ModelConfig::for_properties(protocol, pair.first(), &properties).with_also(pair.second());
    LockModel::new(cfg, properties).map_err(|source| CheckError::Config { protocol, source })
}

/// Every property of `protocol` under `pair`, one run per group of
/// [`matrix::standard_groups`]. With a `cache`, as [`matrix::standard_run`]
/// does it (one thread, the model's own invariants on in the progress run,
/// shortest counterexamples; read back when stored); without, with `threads`,
/// and with the shortest counterexamples when `shortest` says so (a caller
/// that wants the verdicts alone saves their searches). The cells' `fault`
/// is the pair's first.
pub fn pair_run(
    protocol: ProtocolId,
    pair: FaultPair,
    threads: usize,
    shortest: bool,
    cache: Option<&Cache>,
) -> Result<Run, CheckError> {
    let mut runs = Vec::new();
    for group in matrix::standard_groups(protocol) {
        let mut model = pair_model(protocol, pair, group.clone())?;
        runs.push(match cache {
            Some(cache) => {
                model.sanity = matrix::checks_invariants(&group);
                cache.run(model)?
            }
            None => matrix::check_model(model, threads.max(1), shortest)?,
        });
    }
    let run = Run::merge(runs);
    if let Some((name, _)) = run.broken.first() {
        return Err(CheckError::Inconsistent(format!(
            "{protocol} under {pair}: the model's own invariant \"{name}\" failed"
        )));
    }
    Ok(run)
}

/// One property of one protocol under a pair, beside its verdicts under
/// each fault alone.
#[derive(Clone, Debug)]
pub struct PairCell {
    /// Protocol.
    pub protocol: ProtocolId,
    /// The pair.
    pub pair: FaultPair,
    /// Property.
    pub property: PropertyId,
    /// The checker's verdict under the pair.
    pub verdict: Verdict,
    /// The verdicts under the first and the second fault alone.
    pub alone: [Verdict; 2],
    /// The counterexample under the pair, for a violation.
    pub trace: Option<Trace>,
}

impl PairCell {
    /// The cells of `pair_run` beside the single runs `first` and
    /// `second` of the same protocol.
    pub fn new(pair: FaultPair, run: &Run, first: &Run, second: &Run) -> Vec<PairCell> {
        let verdict_in = |r: &Run, p: PropertyId| {
            r.cells
                .iter()
                .find(|c| c.property == p)
                .map_or(Verdict::Holds, |c| c.verdict)
        };
        run.cells
            .iter()
            .map(|c| PairCell {
                protocol: c.protocol,
                pair,
                property: c.property,
                verdict: c.verdict,
                alone: [
                    verdict_in(first, c.property),
                    verdict_in(second, c.property),
                ],
                trace: c.trace.clone(),
            })
            .collect()
    }

    /// Violated under the pair while it holds under each fault alone.
    pub fn only_with_both(&self) -> bool {
        self.verdict == Verdict::Violated && self.alone == [Verdict::Holds, Verdict::Holds]
    }

    /// Holds under the pair while violated under one fault alone: possible
    /// only where the other fault changes the run from its start
    /// (`client-skew`); anything else is an error of the model.
    pub fn contradicts_superset(&self) -> bool {
        let (a, b) = (self.pair.first(), self.pair.second());
        let changes_start = |f: Fault| f == Fault::ClientSkew;
        self.verdict == Verdict::Holds
            && ((self.alone[0] == Verdict::Violated && !changes_start(b))
                || (self.alone[1] == Verdict::Violated && !changes_start(a)))
    }
}
