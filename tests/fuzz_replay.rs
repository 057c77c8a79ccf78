//! Replays inputs of the `join_spill` fuzz target as it runs them (the case and its
//! check are `tests/common/spill_case.rs`): its seeds, which must spill and finish
//! with the reference's answer, and the inputs it crashed on, kept in
//! `tests/data/join_spill/` once fixed.
//!
//! `SPILLJOIN_FUZZ_INPUT=path` replays one file instead (a crash under
//! `fuzz/artifacts/join_spill/`, say) and prints its case and figures.

mod common;

use std::path::{Path, PathBuf};

use common::spill_case::{Outcome, SpillCase};

/// The files of `dir` under the repository root, sorted.
fn inputs(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && path.extension().is_none_or(|e| e != "md"))
        .collect();
    files.sort();
    files
}

/// Decodes and checks one input, printing what it ran.
fn replay(path: &Path) -> (SpillCase, Outcome) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let case = SpillCase::decode(&bytes);
    let outcome = case.check();
    eprintln!("{}: {case:?}\n  {outcome:?}", path.display());
    (case, outcome)
}

#[test]
fn the_fuzz_seeds_spill_and_match_the_reference() {
    if let Ok(path) = std::env::var("SPILLJOIN_FUZZ_INPUT") {
        replay(Path::new(&path));
        return;
    }
    let seeds = inputs("fuzz/seeds/join_spill");
    assert!(!seeds.is_empty());
    let mut idle = Vec::new();
    for path in &seeds {
        let (_, outcome) = replay(path);
        if outcome.exhausted || outcome.metrics.partitions_spilled == 0 {
            idle.push(path.display().to_string());
        }
    }
    assert!(
        idle.is_empty(),
        "seeds that do not spill or do not finish: {idle:?}"
    );
}

/// The inputs `join_spill` crashed on, each named after its bug, replayed once fixed.
/// (A join with two threads may go either way near its floor: each is run a few
/// times.)
#[test]
fn the_crash_inputs_of_the_fuzz_target_pass() {
    let crashes = inputs("tests/data/join_spill");
    assert!(!crashes.is_empty());
    for path in &crashes {
        for _ in 0..3 {
            replay(path);
        }
    }
}
