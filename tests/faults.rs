//! Faults at every phase of a spilling join: a full disk (`ENOSPC`), a spill file cut
//! short, a read that fails (`EIO`), a garbled message header and a changed byte of
//! data (found by its write's checksum), injected by the spill crate's fault hook
//! (`spilljoin_spill::FaultPlan`, feature `fault-injection`, which this crate's
//! dev-dependency turns on) into the build's spill, the probe's, the reading back of
//! spilled pairs, the writes of a level below, the hot-key split and the chunked
//! fallback, for every join type. Each must end with the typed error
//! (`JoinError::Spill` with the spill error of the fault), every reservation back at
//! zero and no file left; and with a plan that never fires, the reference answer.
//!
//! A phase is reached by forcing: every partition spilled at level 0
//! (`with_force_spill(1.0)`), also at level 1 (`with_force_spill_depth(1)`), every
//! pair sent to the fallback (`with_max_depth(0)`), the hot key split off or not
//! (`with_hot_key_split`), one partition joined in several chunks; or by a small
//! limit, where partitions spill while workers wait for memory. A fault is aimed by
//! the label of the files it counts (`build-d0`, `probe-d1`, `build-hot`, ...) and
//! the operation it fires at, and each case checks that it fired and that the join
//! got to the phase (a level 1, a hot-key split, a fallback): none passes without
//! reaching it.

mod common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use common::{reference_join, rendered_rows};
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::spill::{
    FaultKind, FaultPlan, SpillConfig, SpillError, SpillManager, SpillReadMode,
};
use spilljoin::{HashJoin, HashJoinBuilder, HotKeySplit, JoinError, JoinType, NullEquality};

/// Every join type.
const JOIN_TYPES: [JoinType; 11] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::LeftAnti,
    JoinType::RightSemi,
    JoinType::RightAnti,
    JoinType::LeftMark,
    JoinType::LeftNotIn,
    JoinType::RightNotIn,
];

/// How a join is made to reach a phase: forced spilling, or a small limit.
#[derive(Debug, Clone, Copy)]
struct Phase {
    name: &'static str,
    /// Levels down to this depth spill every partition; `None`: spilling only when
    /// memory runs out.
    force_depth: Option<u32>,
    /// Pairs deeper than this go to the fallback.
    max_depth: u32,
    hot_key_split: HotKeySplit,
    /// A tenth of each side's rows share one key.
    hot_key: bool,
    limit_bytes: usize,
    threads: usize,
    /// Rows of the left and the right input, keys they are drawn from.
    shape: Shape,
    read_mode: SpillReadMode,
    /// Radix bits of level 0 (`None`: the planner's choice).
    partition_bits: Option<u32>,
}

/// The inputs of a phase: rows of the left and the right input, and the keys they
/// take.
#[derive(Debug, Clone, Copy)]
struct Shape {
    left_rows: i64,
    right_rows: i64,
    keys: i64,
    batch_rows: usize,
}

/// Small inputs, for forced spilling (and a reference join that takes no time).
const SMALL: Shape = Shape {
    left_rows: 3000,
    right_rows: 2000,
    keys: 400,
    batch_rows: 250,
};

/// Level 0 spills every partition on both sides; the pairs are joined a level down.
const SPILLED: Phase = Phase {
    name: "level 0 spilled",
    force_depth: Some(0),
    max_depth: spilljoin::MAX_DEPTH,
    hot_key_split: HotKeySplit::Auto,
    hot_key: false,
    limit_bytes: 64 << 20,
    threads: 2,
    shape: SMALL,
    read_mode: SpillReadMode::Buffered,
    partition_bits: None,
};

/// [`PRESSURE`] on one thread, where what is written when is the same at every run:
/// the build's 91st to 96th writes are those that make room for the probe once the
/// input has ended.
const PRESSURE_1: Phase = Phase {
    name: "memory pressure, one thread",
    threads: 1,
    ..PRESSURE
};

/// One partition at level 0, joined in chunks under 2 MiB: the pair's build file in
/// several chunks, its probe file read once per chunk.
const CHUNKS: Phase = Phase {
    name: "chunked fallback, several chunks",
    force_depth: Some(0),
    max_depth: 0,
    hot_key_split: HotKeySplit::Never,
    partition_bits: Some(0),
    ..PRESSURE
};

/// [`SPILLED`] with the files read through memory maps.
const MMAP: Phase = Phase {
    name: "level 0 spilled, mapped",
    read_mode: SpillReadMode::Mmap,
    ..SPILLED
};

/// Level 1 spills every partition too: the pairs repartition, and their own pairs are
/// joined at level 2 (or in the fallback, where one did not split).
const LEVEL_1: Phase = Phase {
    name: "level 1 spilled",
    force_depth: Some(1),
    ..SPILLED
};

/// Every pair of level 0 is joined in chunks, none split by hot key.
const CHUNKED: Phase = Phase {
    name: "chunked fallback",
    max_depth: 0,
    hot_key_split: HotKeySplit::Never,
    ..SPILLED
};

/// Every pair of level 0 goes to the fallback, and the one with a dominant key has it
/// split off into files of its own (`build-hot`, `probe-cold`, ...).
const HOT_KEY: Phase = Phase {
    name: "hot key split",
    max_depth: 0,
    hot_key_split: HotKeySplit::Always,
    hot_key: true,
    ..SPILLED
};

/// Spilling because memory runs out (2 MiB for 40 000 and 80 000 rows of about 60
/// bytes), on four threads: partitions spill while workers are still collecting,
/// written outside the collector's lock while others wait for memory, and the pairs
/// are joined side by side.
const PRESSURE: Phase = Phase {
    name: "memory pressure",
    force_depth: None,
    limit_bytes: 2 << 20,
    threads: 4,
    shape: Shape {
        left_rows: 40_000,
        right_rows: 80_000,
        keys: 20_000,
        batch_rows: 1000,
    },
    ..SPILLED
};

/// The typed error a fault must end the join with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    /// `JoinError::Spill(SpillError::Io { .. })` of kind `StorageFull`.
    NoSpace,
    /// `JoinError::Spill(SpillError::Corrupt { .. })`.
    Corrupt,
    /// `JoinError::Spill(SpillError::Io { .. })` with `EIO`.
    ReadError,
}

impl Expected {
    fn of(kind: FaultKind) -> Self {
        match kind {
            FaultKind::NoSpace => Expected::NoSpace,
            FaultKind::CorruptMessage | FaultKind::ShortRead | FaultKind::FlippedByte => {
                Expected::Corrupt
            }
            FaultKind::ReadError => Expected::ReadError,
        }
    }

    fn matches(self, error: &JoinError) -> bool {
        match (self, error) {
            (Expected::NoSpace, JoinError::Spill(SpillError::Io { source, .. })) => {
                source.kind() == std::io::ErrorKind::StorageFull
            }
            (Expected::Corrupt, JoinError::Spill(SpillError::Corrupt { .. })) => true,
            (Expected::ReadError, JoinError::Spill(SpillError::Io { source, .. })) => {
                source.raw_os_error() == Some(5) || !cfg!(unix)
            }
            _ => false,
        }
    }
}

/// One fault: where it is aimed, and the forcing that reaches it.
#[derive(Debug, Clone, Copy)]
struct Case {
    phase: Phase,
    kind: FaultKind,
    /// The files it counts operations on.
    label: &'static str,
    /// The operation it fires at (1: the first).
    nth: u64,
}

const fn case(phase: Phase, kind: FaultKind, label: &'static str, nth: u64) -> Case {
    Case {
        phase,
        kind,
        label,
        nth,
    }
}

/// The inputs of `phase`: `(left, right)`, without null keys, so that no file but
/// the partitions' is written: a fault aimed at the files of a level reaches them in
/// the phase the case names.
fn inputs(phase: Phase) -> (RecordBatch, RecordBatch) {
    let Shape {
        left_rows,
        right_rows,
        keys,
        ..
    } = phase.shape;
    (
        side("l", left_rows, keys, phase.hot_key),
        side("r", right_rows, keys, phase.hot_key),
    )
}

/// One side: key `{prefix}k0`, int payload `{prefix}v`, string payload `{prefix}s`.
fn side(prefix: &str, n: i64, keys: i64, hot_key: bool) -> RecordBatch {
    let k: Int64Array = (0..n)
        .map(|i| {
            Some(if hot_key && i % 10 == 0 {
                7
            } else {
                i * 37 % keys
            })
        })
        .collect();
    let v: Int64Array = (0..n).map(|i| Some(i % 20)).collect();
    let s: StringArray = (0..n)
        .map(|i| Some(format!("{prefix}{i}-{}", "x".repeat((i % 30) as usize))))
        .collect();
    RecordBatch::try_from_iter(vec![
        (format!("{prefix}k0"), Arc::new(k) as ArrayRef),
        (format!("{prefix}v"), Arc::new(v) as ArrayRef),
        (format!("{prefix}s"), Arc::new(s) as ArrayRef),
    ])
    .unwrap()
}

/// A batch as an input stream of `rows`-row batches.
fn stream_of(batch: &RecordBatch, rows: usize) -> Vec<Result<RecordBatch, ArrowError>> {
    (0..batch.num_rows())
        .step_by(rows)
        .map(|start| Ok(batch.slice(start, rows.min(batch.num_rows() - start))))
        .collect()
}

/// What one join runs with, and what it must leave behind: nothing.
struct Setup {
    pool: Arc<dyn MemoryPool>,
    spill: SpillManager,
    root: tempfile::TempDir,
}

impl Setup {
    /// A pool of the phase's limit and a manager with `faults`, if any.
    fn new(phase: Phase, faults: Option<&FaultPlan>) -> Self {
        let root = tempfile::tempdir().unwrap();
        let mut config = SpillConfig::default()
            .with_root_dir(root.path())
            .with_read_mode(phase.read_mode);
        if let Some(faults) = faults {
            config = config.with_faults(faults.clone());
        }
        Setup {
            pool: Arc::new(GreedyMemoryPool::new(phase.limit_bytes)),
            spill: SpillManager::new(config).unwrap(),
            root,
        }
    }

    /// The join of `inputs` that `phase` forces.
    fn join(
        &self,
        phase: Phase,
        join_type: JoinType,
        inputs: &(RecordBatch, RecordBatch),
    ) -> HashJoin {
        let (left, right) = inputs;
        let (fraction, depth) = match phase.force_depth {
            Some(depth) => (1.0, depth),
            None => (0.0, 0),
        };
        let builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
            .with_join_type(join_type)
            .with_memory_pool(Arc::clone(&self.pool))
            .with_spill_manager(self.spill.clone())
            .with_threads(phase.threads)
            .with_batch_size(phase.shape.batch_rows)
            .with_force_spill(fraction)
            .with_force_spill_depth(depth)
            .with_max_depth(phase.max_depth)
            .with_hot_key_split(phase.hot_key_split);
        match phase.partition_bits {
            Some(bits) => builder.with_partition_bits(bits),
            None => builder,
        }
        .build()
        .unwrap()
    }

    /// Checks, once the join's stream is dropped, that its reservations are back at
    /// zero and its files gone; then that the private directory goes with the
    /// manager.
    fn assert_clean(self, join: HashJoin, context: &str) {
        assert_eq!(self.pool.reserved(), 0, "reservations left: {context}");
        assert_eq!(self.spill.live_files(), 0, "spill files left: {context}");
        let spill_files = std::fs::read_dir(self.spill.dir())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".arrows")
            })
            .count();
        assert_eq!(spill_files, 0, "files left: {context}");
        drop((join, self.spill));
        let left: Vec<_> = std::fs::read_dir(self.root.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?} left: {context}");
    }
}

/// Runs `join_type` with the fault of `case`: the typed error, the fault fired, and
/// nothing left.
fn run_fault(case: Case, join_type: JoinType) {
    let faults = FaultPlan::new().with_rule(case.kind, case.label, case.nth);
    let setup = Setup::new(case.phase, Some(&faults));
    let inputs = inputs(case.phase);
    let join = setup.join(case.phase, join_type, &inputs);
    let (left, right) = inputs;
    let rows = case.phase.shape.batch_rows;
    let mut stream = join
        .execute(stream_of(&left, rows), stream_of(&right, rows))
        .unwrap();
    let results: Vec<_> = stream.by_ref().collect();
    let metrics = stream.metrics();
    drop(stream);
    let context = format!("{join_type:?}, {case:?}, {metrics:?}, faults {faults:?}");
    assert_eq!(faults.fired(), 1, "the fault did not fire: {context}");
    match results.last() {
        Some(Err(e)) if Expected::of(case.kind).matches(e) => {}
        Some(Err(e)) => panic!("{e:?} ({e}) is not the fault's error: {context}"),
        _ => panic!("the join did not fail: {context}"),
    }
    assert!(
        results[..results.len() - 1].iter().all(Result::is_ok),
        "an error before the last: {context}"
    );
    assert_phase(case, &metrics, &context);
    setup.assert_clean(join, &context);
}

/// Checks that the join got as far as the phase the case aims at: spilled at all,
/// down a level for the files of level 1, into the hot-key split for its files, into
/// the fallback for reads of the chunked phase.
fn assert_phase(case: Case, m: &spilljoin::JoinMetrics, context: &str) {
    assert!(m.partitions_spilled > 0, "nothing spilled: {context}");
    if case.label.ends_with("-d1") {
        assert!(m.max_depth >= 1, "no level 1: {context}");
    }
    if case.label.contains("hot") || case.label.contains("cold") {
        assert!(m.hot_key_splits > 0, "no hot key split: {context}");
    }
    if case.phase.max_depth == 0 && case.kind == FaultKind::ShortRead {
        assert!(m.fallbacks > 0, "no fallback: {context}");
    }
}

/// Runs every case on every join type.
fn run_all(cases: &[Case]) {
    for &case in cases {
        for join_type in JOIN_TYPES {
            run_fault(case, join_type);
        }
    }
}

/// The level-0 build's spill writes: the first one or a later one fails with
/// `ENOSPC`, or the first is garbled and found when its pair is read back.
#[test]
fn faults_in_the_build_spill() {
    run_all(&[
        case(SPILLED, FaultKind::NoSpace, "build-d0", 1),
        case(SPILLED, FaultKind::NoSpace, "build-d0", 6),
        case(SPILLED, FaultKind::CorruptMessage, "build-d0", 1),
        case(SPILLED, FaultKind::FlippedByte, "build-d0", 2),
    ]);
}

/// The level-0 probe's spill writes.
#[test]
fn faults_in_the_probe_spill() {
    run_all(&[
        case(SPILLED, FaultKind::NoSpace, "probe-d0", 1),
        case(SPILLED, FaultKind::NoSpace, "probe-d0", 4),
        case(SPILLED, FaultKind::CorruptMessage, "probe-d0", 2),
        case(SPILLED, FaultKind::FlippedByte, "probe-d0", 1),
        case(MMAP, FaultKind::FlippedByte, "probe-d0", 3),
    ]);
}

/// Reading level 0's spilled pairs back as the inputs of level 1: a build file, or a
/// probe file, cut short, read into memory or through a map.
#[test]
fn faults_reading_spilled_pairs_back() {
    run_all(&[
        case(SPILLED, FaultKind::ShortRead, "build-d0", 1),
        case(SPILLED, FaultKind::ShortRead, "probe-d0", 3),
        case(MMAP, FaultKind::ShortRead, "build-d0", 2),
        case(MMAP, FaultKind::CorruptMessage, "probe-d0", 1),
        case(SPILLED, FaultKind::ReadError, "build-d0", 2),
        case(MMAP, FaultKind::ReadError, "probe-d0", 1),
    ]);
}

/// Faults while memory runs out: a write of a partition spilled while the build is
/// collecting (early or late) or while it makes room for the probe, of a probe
/// buffer, and a read of a pair joined beside others.
#[test]
fn faults_under_memory_pressure() {
    run_all(&[
        case(PRESSURE, FaultKind::NoSpace, "build-d0", 1),
        case(PRESSURE, FaultKind::NoSpace, "build-d0", 40),
        case(PRESSURE, FaultKind::NoSpace, "build-d0", 75),
        case(PRESSURE_1, FaultKind::NoSpace, "build-d0", 93),
        case(PRESSURE, FaultKind::NoSpace, "probe-d0", 10),
        case(PRESSURE, FaultKind::NoSpace, "probe-d0", 30),
        case(PRESSURE, FaultKind::CorruptMessage, "build-d0", 60),
        case(PRESSURE, FaultKind::ShortRead, "build-d0", 5),
        case(PRESSURE, FaultKind::ShortRead, "build-d0", 70),
        case(PRESSURE, FaultKind::ShortRead, "probe-d0", 30),
        case(PRESSURE, FaultKind::ReadError, "probe-d0", 12),
    ]);
}

/// A pair that repartitions: the spill writes of level 1 on both sides, and the
/// reading back of its own pairs.
#[test]
fn faults_at_level_1() {
    run_all(&[
        case(LEVEL_1, FaultKind::NoSpace, "build-d1", 1),
        case(LEVEL_1, FaultKind::NoSpace, "probe-d1", 2),
        case(LEVEL_1, FaultKind::CorruptMessage, "build-d1", 1),
        case(LEVEL_1, FaultKind::FlippedByte, "probe-d1", 1),
        case(LEVEL_1, FaultKind::ShortRead, "probe-d1", 1),
        case(LEVEL_1, FaultKind::ReadError, "build-d1", 1),
    ]);
}

/// The fallback's split of a dominant key: the rewrites of both files into the key's
/// pair and the rest, and the chunked join's reads of the key's pair.
#[test]
fn faults_in_the_hot_key_split() {
    run_all(&[
        case(HOT_KEY, FaultKind::NoSpace, "build-hot", 1),
        case(HOT_KEY, FaultKind::NoSpace, "probe-cold", 1),
        case(HOT_KEY, FaultKind::CorruptMessage, "build-cold", 1),
        case(HOT_KEY, FaultKind::ShortRead, "-hot", 2),
        case(HOT_KEY, FaultKind::ReadError, "-cold", 1),
    ]);
}

/// The chunked fallback's reads of the build file and of the probe file, and a
/// garbled probe message it finds; and a read of a later chunk's pass, where the
/// build file takes several chunks (the 150th read of a level-0 file: the pair's
/// files hold about 120 messages, and the probe side is read once per chunk).
#[test]
fn faults_in_the_chunked_fallback() {
    run_all(&[
        case(CHUNKED, FaultKind::ShortRead, "build-d0", 1),
        case(CHUNKED, FaultKind::ShortRead, "probe-d0", 2),
        case(CHUNKED, FaultKind::CorruptMessage, "probe-d0", 1),
        case(CHUNKED, FaultKind::FlippedByte, "build-d0", 1),
        case(CHUNKS, FaultKind::ShortRead, "-d0", 150),
        case(CHUNKS, FaultKind::ReadError, "-d0", 140),
    ]);
}

/// With a plan whose faults never fire, every phase's join gives the reference
/// answer: the hook itself changes nothing. (And it counted what it saw, so the plan
/// was the join's.)
#[test]
fn a_plan_that_never_fires_changes_nothing() {
    for phase in [SPILLED, LEVEL_1, CHUNKED, HOT_KEY, MMAP] {
        let inputs = inputs(phase);
        let (left, right) = &inputs;
        let rows = phase.shape.batch_rows;
        for join_type in JOIN_TYPES {
            let faults = FaultPlan::new()
                .no_space_on_write("-", u64::MAX)
                .short_read("-", u64::MAX);
            let setup = Setup::new(phase, Some(&faults));
            let join = setup.join(phase, join_type, &inputs);
            let got = join
                .execute(stream_of(left, rows), stream_of(right, rows))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_else(|e| panic!("{}, {join_type:?}: {e}", phase.name));
            let expected = expected_rows(left, right, join_type);
            let context = format!("{}, {join_type:?}, faults {faults:?}", phase.name);
            assert!(rendered_rows(&got) == expected, "wrong answer: {context}");
            let seen = faults.seen();
            assert!(
                seen.iter().all(|&n| n > 0),
                "the hook saw nothing: {context}"
            );
            setup.assert_clean(join, &context);
        }
    }
}

/// Under memory pressure, and in several chunks, a plan that never fires gives what
/// the same join gives without one; and the chunked phase does take several chunks
/// (a file read more than once, which one chunk never does for an inner join).
#[test]
fn a_plan_that_never_fires_changes_nothing_under_memory_pressure() {
    for phase in [PRESSURE, CHUNKS] {
        let inputs = inputs(phase);
        let (left, right) = &inputs;
        let rows = phase.shape.batch_rows;
        for join_type in [
            JoinType::Inner,
            JoinType::Full,
            JoinType::LeftMark,
            JoinType::RightNotIn,
        ] {
            let faults = FaultPlan::new()
                .no_space_on_write("-d0", u64::MAX)
                .short_read("-d0", u64::MAX);
            let mut outputs = Vec::new();
            for plan in [Some(&faults), None] {
                let setup = Setup::new(phase, plan);
                let join = setup.join(phase, join_type, &inputs);
                let got = join
                    .execute(stream_of(left, rows), stream_of(right, rows))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap_or_else(|e| panic!("{}, {join_type:?}: {e}", phase.name));
                outputs.push(rendered_rows(&got));
                setup.assert_clean(join, phase.name);
            }
            let context = format!("{}, {join_type:?}, faults {faults:?}", phase.name);
            assert!(outputs[0] == outputs[1], "another answer: {context}");
            let [writes, reads] = faults.seen()[..] else {
                unreachable!()
            };
            assert!(writes > 0, "the hook saw nothing: {context}");
            if phase.name == CHUNKS.name && join_type == JoinType::Inner {
                assert!(reads > writes, "one chunk: {context}");
            }
        }
    }
}

/// A prepared build (`HashJoin::prepare`, shared by the probes that attach it): a
/// full disk while it spills fails the preparation; a read of its spilled partitions
/// that fails or is cut short fails the probe that reads it, and a later probe of the
/// same build (whose files the failed read left as they were) still gives the
/// reference answer; nothing is left once the build and the join go.
#[test]
fn faults_in_a_prepared_build_and_its_probes() {
    let inputs = inputs(SPILLED);
    let right = &inputs.1;
    let rows = SPILLED.shape.batch_rows;
    for join_type in [
        JoinType::Inner,
        JoinType::Full,
        JoinType::LeftAnti,
        JoinType::RightSemi,
        JoinType::RightNotIn,
    ] {
        let faults = FaultPlan::new().no_space_on_write("build-d0", 3);
        let setup = Setup::new(SPILLED, Some(&faults));
        let join = setup.join(SPILLED, join_type, &inputs);
        let context = format!("preparing, {join_type:?}, faults {faults:?}");
        match join.prepare(stream_of(right, rows)) {
            Err(e) if Expected::NoSpace.matches(&e) => {}
            Err(e) => panic!("{e:?} ({e}) is not the fault's error: {context}"),
            Ok(_) => panic!("the preparation did not fail: {context}"),
        }
        assert_eq!(faults.fired(), 1, "the fault did not fire: {context}");
        setup.assert_clean(join, &context);

        for kind in [FaultKind::ShortRead, FaultKind::ReadError] {
            probe_prepared_with_a_fault(join_type, kind, &inputs, rows);
        }
    }
}

/// The probing half of [`faults_in_a_prepared_build_and_its_probes`].
fn probe_prepared_with_a_fault(
    join_type: JoinType,
    kind: FaultKind,
    inputs: &(RecordBatch, RecordBatch),
    rows: usize,
) {
    let (left, right) = inputs;
    let faults = FaultPlan::new().with_rule(kind, "build-d0", 1);
    let setup = Setup::new(SPILLED, Some(&faults));
    let join = setup.join(SPILLED, join_type, inputs);
    let context = format!("probing, {join_type:?}, faults {faults:?}");
    let prepared = join.prepare(stream_of(right, rows)).unwrap();
    let first: Vec<_> = join
        .execute_prepared(prepared.clone(), stream_of(left, rows))
        .unwrap()
        .collect();
    assert_eq!(faults.fired(), 1, "the fault did not fire: {context}");
    match first.last() {
        Some(Err(e)) if Expected::of(kind).matches(e) => {}
        Some(Err(e)) => panic!("{e:?} ({e}) is not the fault's error: {context}"),
        _ => panic!("the probe did not fail: {context}"),
    }
    let again = join
        .execute_prepared(prepared.clone(), stream_of(left, rows))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("the second probe failed: {e}: {context}"));
    let expected = expected_rows(left, right, join_type);
    assert!(rendered_rows(&again) == expected, "wrong answer: {context}");
    drop(prepared);
    setup.assert_clean(join, &context);
}

/// The reference join's rows for `left` and `right` joined on their first columns.
fn expected_rows(left: &RecordBatch, right: &RecordBatch, join_type: JoinType) -> Vec<String> {
    reference_join(
        left,
        right,
        &[(0, 0)],
        join_type,
        false,
        NullEquality::NullEqualsNothing,
    )
}
