//! The results table: one row per (scenario, model cell), expected by the
//! model beside observed on real Redis.
//!
//! Each scenario prints its own rows and saves them to
//! `<dir>/<scenario>.tsv` ([`save`]); [`load`] reads every file back so that one table
//! of the whole suite can be printed at the end (`tests/results.rs`).

use std::fmt::Write as _;
use std::path::Path;

use crate::ChaosError;

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

/// Writes `rows` to `<dir>/<file>.tsv`, replacing what an earlier run
/// saved there (tabs and newlines in cells become spaces).
pub fn save(dir: &Path, file: &str, rows: &[Row]) -> Result<(), ChaosError> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let mut out = std::fs::File::create(dir.join(format!("{file}.tsv")))?;
    for row in rows {
        let fields = [
            &row.scenario,
            &row.protocol,
            &row.fault,
            &row.property,
            &row.expected,
            &row.observed,
            &row.detail,
        ]
        .map(|field| field.replace(['\t', '\n'], " "));
        writeln!(out, "{}", fields.join("\t"))?;
    }
    Ok(())
}

/// Every row of every `*.tsv` file in `dir`, by file name.
pub fn load(dir: &Path) -> Result<Vec<Row>, ChaosError> {
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "tsv"))
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    files.sort();
    let mut rows = Vec::new();
    for file in files {
        for line in std::fs::read_to_string(&file)?.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            if let [scenario, protocol, fault, property, expected, observed, detail] = fields[..] {
                rows.push(Row {
                    scenario: scenario.to_owned(),
                    protocol: protocol.to_owned(),
                    fault: fault.to_owned(),
                    property: property.to_owned(),
                    expected: expected.to_owned(),
                    observed: observed.to_owned(),
                    detail: detail.to_owned(),
                });
            }
        }
    }
    Ok(rows)
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

    #[test]
    fn rows_survive_a_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("lockwright-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        save(&dir, "a", &[row("holds", "violated")]).unwrap();
        save(&dir, "a", &[row("violated", "violated")]).unwrap();
        save(&dir, "b", &[row("holds", "holds")]).unwrap();
        let rows = load(&dir).unwrap();
        assert_eq!(rows.len(), 2, "a second save replaces the first");
        assert_eq!(rows[0].detail, "two majorities");
        assert_eq!(rows[1].expected, "holds");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
