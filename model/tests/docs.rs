//! The committed scenario catalogue (`docs/`) is what the model computes now:
//! regenerate it and compare every generated file, and check that every
//! link into a protocol page and every chaos test named by the pages exist.

/// The checker's allocator (see `lockwright_model::Allocator`).
#[global_allocator]
static ALLOCATOR: lockwright_model::Allocator = lockwright_model::Allocator;

use lockwright_core::ProtocolId;
use lockwright_model::cache::Cache;
use lockwright_model::docs::{self, CHAOS};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const REGENERATE: &str = "cargo run --release -p lockwright-model -- docs";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("model/ has a parent")
        .to_path_buf()
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  committed: {x}\n  generated: {y}", i + 1);
        }
    }
    format!(
        "lengths differ: committed {} lines, generated {} lines",
        a.lines().count(),
        b.lines().count()
    )
}

#[test]
fn committed_docs_match_a_fresh_generation() {
    // The cells come through the cache `tests/matrix.rs` and the chaos
    // replay test share (computed here when none of them ran before).
    let cache = Cache::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("matrix-cache"));
    let generated = docs::generate(2, Some(&cache)).expect("docs generate");
    eprintln!("{}", cache.summary());
    let dir = std::env::temp_dir().join(format!("lockwright-docs-{}", std::process::id()));
    generated.write_to(&dir).expect("docs write");
    let docs_dir = workspace().join("docs");
    let mut stale = Vec::new();
    for (rel, text) in &generated.files {
        match std::fs::read_to_string(docs_dir.join(rel)) {
            Ok(committed) if &committed == text => {}
            Ok(committed) => stale.push(format!(
                "docs/{rel} differs ({}); diff -u docs/{rel} {}",
                first_difference(&committed, text),
                dir.join(rel).display()
            )),
            Err(e) => stale.push(format!("docs/{rel} is missing ({e})")),
        }
    }
    // No stale SVG may stay behind.
    let svg_dir = docs_dir.join("protocols").join("svg");
    if let Ok(entries) = std::fs::read_dir(&svg_dir) {
        for entry in entries.flatten() {
            let rel = format!("protocols/svg/{}", entry.file_name().to_string_lossy());
            if !generated.files.contains_key(&rel) {
                stale.push(format!("docs/{rel} is no longer generated"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the committed docs are stale; regenerate them with `{REGENERATE}`\n(fresh copy in {})\n{}",
        dir.display(),
        stale.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn there_is_one_page_per_catalogue_protocol_and_every_svg_is_linked() {
    let docs_dir = workspace().join("docs");
    for id in ProtocolId::all() {
        let page = std::fs::read_to_string(docs_dir.join(format!("protocols/{id}.md")))
            .unwrap_or_else(|e| panic!("no page for {id}: {e}"));
        assert!(page.contains("## Verdicts"), "{id}: no verdicts section");
        for line in page.lines() {
            if let Some(start) = line.find("](svg/") {
                let name = &line[start + 6..line.len() - 1];
                assert!(
                    docs_dir.join("protocols/svg").join(name).exists(),
                    "{id}: links a missing diagram {name}"
                );
            }
        }
    }
}

/// Every `protocols/<id>.md#anchor` link in the guides and the matrix
/// points at an anchor that exists.
#[test]
fn links_into_protocol_pages_resolve() {
    let docs_dir = workspace().join("docs");
    let mut broken = BTreeSet::new();
    for file in ["verdicts.md", "choosing.md", "driving.md", "README.md"] {
        let Ok(text) = std::fs::read_to_string(docs_dir.join(file)) else {
            broken.insert(format!("{file} is missing"));
            continue;
        };
        for (i, _) in text.match_indices("(protocols/") {
            let i = i + 1;
            let rest = &text[i + "protocols/".len()..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = &rest[..end];
            let (page, anchor) = target.split_once('#').unwrap_or((target, ""));
            if !page.ends_with(".md") {
                continue;
            }
            let Ok(body) = std::fs::read_to_string(docs_dir.join("protocols").join(page)) else {
                broken.insert(format!("{file}: {target} (no such page)"));
                continue;
            };
            let ok = anchor.is_empty()
                || body.contains(&format!("<a id=\"{anchor}\"></a>"))
                || (anchor == "verdicts" && body.contains("\n## Verdicts\n"));
            if !ok {
                broken.insert(format!("{file}: {target} (no such anchor)"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links (a verdict may have changed; update the guide):\n{}",
        broken.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_chaos_test_named_by_the_pages_exists_and_names_its_cell() {
    for c in CHAOS {
        let path = workspace().join(c.file);
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            source.contains(&format!("fn {}(", c.test)),
            "{} has no test {}",
            c.file,
            c.test
        );
        let protocol = format!("\"{}\"", c.protocol);
        assert!(
            source.contains(&protocol) || source.contains(&format!("{:?}", c.protocol)),
            "{} does not name {}",
            c.file,
            c.protocol
        );
        assert!(
            source.contains(&format!("\"{}\"", c.property)),
            "{} does not name {}",
            c.file,
            c.property
        );
    }
}

#[test]
fn recorded_commands_show_the_release_of_each_lock() {
    // The Lua compare-and-delete for set-px-lua, the separate GET and DEL
    // for set-px-get-del: what the pages say each protocol sends.
    let lua = docs::record_commands(ProtocolId::SetPxLua).unwrap();
    assert!(lua
        .lines
        .iter()
        .any(|l| l.contains("EVALSHA <compare-and-delete>")));
    let get_del = docs::record_commands(ProtocolId::SetPxGetDel).unwrap();
    assert!(get_del.lines.iter().any(|l| l.contains(": DEL {r}")));
    assert!(get_del.scripts.is_empty());
}
