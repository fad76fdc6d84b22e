//! The results table: one row per (scenario, model cell), expected by the
//! model beside observed on real Redis.
//!
//! A scenario prints its own rows, from its own run, and asserts each.

use std::fmt::Write as _;

/// One row of the results table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// The scenario (its test file and case).
    pub scenario: String,
    /// Protocol id.
    pub protocol: String,
    /// Fault id, as the model spells it.
    pub fault: String,
    /// Property id.
    pub property: String,
    /// The model checker's verdict for the cell.
    pub expected: String,
    /// What the history showed: `holds` or `violated`.
    pub observed: String,
    /// How it showed (the violation, or how many iterations ran clean).
    pub detail: String,
}

impl Row {
    /// Does the observation agree with the model?
    pub fn agrees(&self) -> bool {
        self.expected == self.observed
    }
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "scenario",
        "protocol",
        "fault",
        "property",
        "expected by the model",
        "observed",
        "",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|row| {
            [
                row.scenario.clone(),
                row.protocol.clone(),
                row.fault.clone(),
                row.property.clone(),
                row.expected.clone(),
                row.observed.clone(),
                if row.agrees() { "ok" } else { "MISMATCH" }.to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        let padded: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        let _ = writeln!(out, "| {} |", padded.join(" | ").trim_end());
    };
    line(&mut out, &header.map(str::to_owned));
    line(&mut out, &widths.map(|width| "-".repeat(width)));
    for row in &cells {
        line(&mut out, row);
    }
    for row in rows {
        if !row.detail.is_empty() {
            let _ = writeln!(
                out,
                "  {} {} / {}: {}",
                row.scenario, row.protocol, row.property, row.detail
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(expected: &str, observed: &str) -> Row {
        Row {
            scenario: "s".into(),
            protocol: "redlock".into(),
            fault: "clock-jump".into(),
            property: "mutual-exclusion".into(),
            expected: expected.into(),
            observed: observed.into(),
            detail: "two\tmajorities".into(),
        }
    }

    #[test]
    fn the_table_marks_mismatches() {
        let text = table(&[row("violated", "violated"), row("holds", "violated")]);
        assert!(text.contains("expected by the model"), "{text}");
        assert_eq!(text.matches("MISMATCH").count(), 1, "{text}");
    }
}
