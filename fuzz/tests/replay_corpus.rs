//! Replays the fuzz corpus through the targets' bodies, on the stable toolchain and
//! without cargo-fuzz: every file of `corpus/<target>/`, and of `artifacts/<target>/`
//! when a fuzzing run left crashes there (so a crash stays red here until it is fixed).
//!
//! `cargo test --manifest-path fuzz/Cargo.toml`

use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

use deadline_fuzz::TARGETS;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The regular files directly in `dir`, sorted; none when it does not exist.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every input of `target` and returns how many came from the committed corpus.
/// Fails with the list of inputs that panicked.
fn replay(name: &str, target: fn(&[u8])) -> usize {
    let corpus = files_in(&root().join("corpus").join(name));
    let artifacts = files_in(&root().join("artifacts").join(name));
    let mut failures = Vec::new();
    for path in corpus.iter().chain(&artifacts) {
        let data = fs::read(path).expect("readable corpus file");
        if panic::catch_unwind(|| target(&data)).is_err() {
            failures.push(format!(
                "{}: b\"{}\"",
                path.strip_prefix(root()).unwrap_or(path).display(),
                data.escape_ascii()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} inputs failed:\n  {}",
        failures.len(),
        corpus.len() + artifacts.len(),
        failures.join("\n  ")
    );
    eprintln!(
        "{name}: {} corpus and {} artifact inputs replayed",
        corpus.len(),
        artifacts.len()
    );
    corpus.len()
}

fn target(name: &str) -> fn(&[u8]) {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .expect("a known target")
}

#[test]
fn timeout_header_corpus() {
    let replayed = replay("timeout_header", target("timeout_header"));
    assert!(
        replayed >= 20,
        "the seed corpus is missing ({replayed} files)"
    );
}

#[test]
fn order_body_corpus() {
    let replayed = replay("order_body", target("order_body"));
    assert!(
        replayed >= 20,
        "the seed corpus is missing ({replayed} files)"
    );
}

#[test]
fn grpc_timeout_corpus() {
    let replayed = replay("grpc_timeout", target("grpc_timeout"));
    assert!(
        replayed >= 20,
        "the seed corpus is missing ({replayed} files)"
    );
}

/// Every folder under corpus/ belongs to a target, and every target has a fuzz_targets/
/// file: a renamed target cannot silently stop being replayed.
#[test]
fn corpus_folders_and_targets_match() {
    let mut folders: Vec<String> = fs::read_dir(root().join("corpus"))
        .expect("fuzz/corpus exists")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    names.sort();
    assert_eq!(folders, names);
    for name in &names {
        let source = root().join("fuzz_targets").join(format!("{name}.rs"));
        assert!(source.is_file(), "{} is missing", source.display());
    }
}
