//! Replays the committed fuzz corpus (fuzz/corpus/<target>/) and the crash reproducers
//! (fuzz/regressions/<target>/) through each target on stable Rust, so `cargo test` catches any
//! regression the fuzzers once covered without needing nightly or cargo-fuzz.

use std::path::{Path, PathBuf};

use deltaserve_fuzz_targets::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files directly in `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(kind: &str) -> usize {
    let mut total = 0;
    for (name, run) in TARGETS {
        for file in inputs(&fuzz_dir().join(kind).join(name)) {
            let data = std::fs::read(&file).expect("readable corpus file");
            // A panic names the file through the hook's message; print it first so it is not lost.
            eprintln!("replaying {}", file.display());
            run(&data);
            total += 1;
        }
    }
    total
}

#[test]
fn corpus_replays_without_failures() {
    let replayed = replay("corpus");
    for (name, _) in TARGETS {
        assert!(
            !inputs(&fuzz_dir().join("corpus").join(name)).is_empty(),
            "fuzz/corpus/{name} is empty or missing"
        );
    }
    eprintln!("{replayed} corpus inputs replayed");
}

#[test]
fn regressions_replay_without_failures() {
    let replayed = replay("regressions");
    eprintln!("{replayed} regression inputs replayed");
}

/// Every target directory in fuzz/ belongs to a target (a renamed target must not leave its corpus
/// unreplayed).
#[test]
fn corpus_directories_match_the_targets() {
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("readable directory entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                TARGETS.iter().any(|(target, _)| *target == name),
                "fuzz/{kind}/{name} has no target"
            );
        }
    }
}
