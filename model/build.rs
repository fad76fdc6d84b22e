//! The source fingerprint of the verdict cache (`src/cache.rs`): a hash of
//! everything that can change a verdict, a state count or a counterexample:
//! the core's and the model's sources, the manifests, `Cargo.lock` (the
//! stateright version among the rest) and the compiler's version. Cargo
//! reruns this script whenever one of those files changes.
//!
//! Five model sources are left out because no code of theirs runs while a
//! cell is checked or a cached cell is validated (`src/cache.rs` replays
//! traces with the model alone, and a cell's key holds its whole
//! configuration, so a model they build is keyed by what it is):
//! `src/trace.rs` (a trace as text and SVG), `src/docs/` (the pages),
//! `src/main.rs` (the command line), `src/pairs.rs` (fault pairs beside
//! single faults) and `src/sim.rs` (the random simulator, which drives the
//! machines itself). A change to them
//! still shows in the generated docs, which the docs test compares with
//! the committed ones; leaving them out lets a change of rendering reuse
//! the checked cells instead of checking the matrix again.

use std::path::{Path, PathBuf};

/// Sources that take no part in checking a cell (see the module docs): a
/// file, or every file under a directory ending in `/`.
const RENDERING: [&str; 5] = [
    "model/src/trace.rs",
    "model/src/docs/",
    "model/src/main.rs",
    "model/src/pairs.rs",
    "model/src/sim.rs",
];

/// Is `rel` (a path from the workspace root) one of [`RENDERING`]?
fn rendering(rel: &str) -> bool {
    RENDERING.iter().any(|r| {
        if r.ends_with('/') {
            rel.starts_with(r)
        } else {
            rel == *r
        }
    })
}

/// FNV-1a, 128 bits.
struct Fnv(u128);

impl Fnv {
    fn new() -> Self {
        Fnv(0x6c62_272e_07bb_0142_62b8_2175_6295_c58d)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u128::from(b);
            self.0 = self
                .0
                .wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
        }
    }
    /// A length-prefixed field, so that no two sequences of fields hash
    /// the same bytes.
    fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let dirs = [root.join("core/src"), manifest.join("src")];
    let single = [
        root.join("Cargo.lock"),
        root.join("Cargo.toml"),
        root.join("core/Cargo.toml"),
        manifest.join("Cargo.toml"),
        manifest.join("build.rs"),
    ];
    let mut files = Vec::new();
    for dir in &dirs {
        if dir.exists() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        files_under(dir, &mut files);
    }
    for file in &single {
        if file.exists() {
            println!("cargo:rerun-if-changed={}", file.display());
            files.push(file.clone());
        }
    }
    let mut named: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap_or(&p).to_string_lossy();
            (rel.replace('\\', "/"), p)
        })
        .filter(|(rel, _)| !rendering(rel))
        .collect();
    named.sort();
    let mut h = Fnv::new();
    for (rel, path) in &named {
        h.field(rel.as_bytes());
        h.field(&std::fs::read(path).unwrap_or_default());
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    h.field(&version);
    println!("cargo:rustc-env=LOCKWRIGHT_SOURCE_FINGERPRINT={:032x}", h.0);
}
