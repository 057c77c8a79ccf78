//! Executing a join: one *level* of the hybrid hash join, and what happens to the
//! partitions it spilled.
//!
//! ```text
//!  run_level(level 0: user inputs)
//!    build ─► BuiltSide: in-memory partitions + spilled partitions (files, blooms)
//!    probe ─► in-memory partitions: output now
//!             spilled partitions: rows that may match ─► probe spill file
//!                                 rows that cannot (bloom) ─► unmatched now
//!    emit unmatched/semi/anti/mark build rows of in-memory partitions
//!    for each spilled (build file, probe file) pair — side by side, one per thread,
//!    each in its own share of the free memory, when they fit one; else one at a
//!    time on all threads:
//!       split it? ─► run_level(level + 1: the two files, next hash bits)
//!       one key dominates (no split) or no hash bits left ─► fallback:
//!          probe file large? ─► split the dominant key off: its pair ─► chunked,
//!                                                         the rest ─► as any pair
//!          otherwise ─► chunked
//! ```
//!
//! Recursion writes each spilled byte once per level. Its depth is bounded by the
//! plan's (`with_max_depth`, at most [`MAX_DEPTH`]) and by the hash bits
//! ([`crate::partition::MAX_TOTAL_PARTITION_BITS`]); a partition that does not split
//! (one key holds most of its rows) goes to the fallback. Chunked, the build file is
//! read in chunks that fit, each chunk is joined with the whole probe file, and
//! per-probe-row match bits carry outer, anti, semi and mark semantics across chunks:
//! a block nested loop with a hash table per block. When the probe file is large, the
//! dominant key is split off first, so that only its own probe rows are read once per
//! chunk — what a sort-merge join's grouping of equal keys would buy, for one rewrite
//! of each file instead of an external sort of both.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use std::sync::Arc;

use arrow_array::{BooleanArray, RecordBatch, UInt32Array};
use arrow_buffer::{BooleanBufferBuilder, ScalarBuffer};
use arrow_schema::ArrowError;
use spilljoin_memory::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool,
};
use spilljoin_spill::SpillFile;

use crate::batches::{
    batch_bytes, detach_hashes, lock, pieces, run_workers, write_counted, InputStreams,
};
use crate::build::{
    build_side, finish_partition, BuiltSide, Partition, PartitionBuffer, Unmatchable,
};
use crate::context::{Ctx, Facts, JoinPhase, Level};
use crate::error::{JoinError, Result};
use crate::join_type::BuildJoinType;
use crate::output::OutputSink;
use crate::partition::HashBits;
use crate::plan::{HotKeySplit, JoinPlan};
use crate::probe::{emit_build_rows, emit_unmatchable, ProbeState, Prober};

/// Radix bits of every level below the first.
const SUB_LEVEL_BITS: u32 = 4;

/// A spill file as an input stream.
fn file_input(
    file: &SpillFile,
) -> Result<impl Iterator<Item = Result<RecordBatch, ArrowError>> + Send> {
    Ok(file
        .reader()?
        .map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e)))))
}

/// Runs one level over its inputs, then the pairs it spilled. Returns the probe facts
/// it saw.
pub(crate) fn run_level<B, P>(
    ctx: &Ctx<'_>,
    level: Level,
    build: Vec<B>,
    probe: Vec<P>,
    facts: Facts,
) -> Result<Facts>
where
    B: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    ctx.metrics
        .max_depth
        .fetch_max(level.depth as u64, Ordering::Relaxed);
    let start = Instant::now();
    let built = build_side(ctx, level, build)?;
    if level.depth == 0 {
        ctx.metrics.set_phase(JoinPhase::Probe);
        ctx.metrics
            .build_nanos
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    ctx.note_peak();

    let (facts, probe_files, probe_rows) = probe_level(ctx, level, &built, probe, facts)?;

    // Release this level's tables before joining what it spilled.
    let level_rows = LevelRows {
        build: built.num_rows,
        probe: probe_rows,
    };
    let spilled = release_level(built);
    let start = Instant::now();
    if level.depth == 0 {
        ctx.metrics.set_phase(JoinPhase::SpilledPairs);
    }
    join_spilled_pairs(ctx, level, level_rows, spilled, probe_files, facts)?;
    if level.depth == 0 {
        ctx.metrics
            .spilled_nanos
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    Ok(facts)
}

/// The probe side of one level over its built side: streams the probe input past it,
/// outputs the build rows the join keeps, and closes the probe spill files (returned
/// per partition) with the probe facts it saw.
pub(crate) fn probe_level<P>(
    ctx: &Ctx<'_>,
    level: Level,
    built: &BuiltSide,
    probe: Vec<P>,
    facts: Facts,
) -> Result<(Facts, Vec<Option<SpillFile>>, u64)>
where
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let plan = ctx.plan;
    let start = Instant::now();
    let consumer = MemoryConsumer::new("spilljoin probe").register(&plan.pool);
    let state = ProbeState::new(ctx, level, built, consumer.new_empty(), facts)?;
    let probe_rows = probe_phase(ctx, level, built, &state, &consumer, probe)?;
    let facts = state.facts();
    if plan.resolved.emits_build_rows_at_end() {
        emit_build_phase(ctx, built, &state, facts)?;
    }
    if level.depth == 0 {
        ctx.metrics
            .probe_nanos
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    let probe_files = state.finish_spills(ctx)?;
    Ok((facts, probe_files, probe_rows))
}

/// Streams the probe input past `built` on every worker; returns the rows read.
fn probe_phase<P>(
    ctx: &Ctx<'_>,
    level: Level,
    built: &BuiltSide,
    state: &ProbeState,
    consumer: &MemoryReservation,
    probe: Vec<P>,
) -> Result<u64>
where
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let plan = ctx.plan;
    let probe_input = InputStreams::new(probe);
    let rows = AtomicU64::new(0);
    run_workers(plan.threads, ctx.cancel, || {
        let mut current = None;
        let mut reservation = consumer.new_empty();
        state.reserve(
            ctx,
            &mut reservation,
            crate::plan::probe_worker_bytes(plan.work_rows, plan.work_rows),
        )?;
        let mut prober = Prober::new(ctx, level.bits, built, state);
        let mut sink = ctx.sink();
        loop {
            if ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let batch = match probe_input.next(&mut current) {
                None => break,
                Some(item) => item.map_err(|e| ctx.input_error(plan.probe_side(), e))?,
            };
            // As much memory as the batch holds, while it is probed in pieces
            // (slices of it).
            probe_input_batch(
                ctx,
                level,
                &batch,
                &rows,
                (state, &mut reservation),
                &mut prober,
                &mut sink,
            )?;
            ctx.note_peak();
        }
        ctx.finish_sink(&mut sink)
    })?;
    Ok(rows.into_inner())
}

/// Probes one input batch, in pieces; counts its rows into `rows`.
fn probe_input_batch(
    ctx: &Ctx<'_>,
    level: Level,
    batch: &RecordBatch,
    rows: &AtomicU64,
    (state, reservation): (&ProbeState, &mut MemoryReservation),
    prober: &mut Prober<'_>,
    sink: &mut OutputSink,
) -> Result<()> {
    let plan = ctx.plan;
    let (batch, hashes) = level.split_input(plan, batch, false)?;
    rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
    if level.depth == 0 {
        ctx.metrics
            .probe_rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
    }
    // (Each piece reserved while it is probed; the input batch itself is not.)
    for (piece, hashes) in pieces(&batch, hashes.as_ref(), plan.piece_rows(&batch)) {
        let bytes = batch_bytes(&piece);
        state.reserve(ctx, reservation, bytes)?;
        prober.probe(&piece, hashes.as_deref(), sink)?;
        reservation.shrink(bytes);
    }
    Ok(())
}

/// The batches of build rows a worker outputs at a time after the probe
/// ([`emit_build_phase`]): a spilled pair's one table of 94K rows (SF1 orders at a
/// 25% limit) is output in three chunks.
const EMIT_CHUNK_BATCHES: usize = 4;

/// Outputs the build rows the join keeps (in-memory partitions and unmatchable
/// rows), once every probe worker is done.
fn emit_build_phase(
    ctx: &Ctx<'_>,
    built: &BuiltSide,
    state: &ProbeState,
    facts: Facts,
) -> Result<()> {
    let plan = ctx.plan;
    // The workers take the partitions' rows in chunks, so that a level of fewer
    // partitions than threads (a spilled pair joined in one table) is output on
    // every thread too: ends[p] is the end of partition p's chunks in the count of
    // all chunks.
    let chunk = plan.batch_size.max(1) * EMIT_CHUNK_BATCHES;
    let ends: Vec<usize> = built
        .partitions
        .iter()
        .scan(0, |end, partition| {
            if let Partition::InMemory(part) = partition {
                *end += part.batch.num_rows().div_ceil(chunk);
            }
            Some(*end)
        })
        .collect();
    let chunks = ends.last().copied().unwrap_or(0);
    let next = AtomicUsize::new(0);
    run_workers(plan.threads.min(chunks.max(1)), ctx.cancel, || {
        let mut sink = ctx.sink();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks {
                break;
            }
            if ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            // The partition whose chunks hold chunk i, and where it starts in them.
            let p = ends.partition_point(|&end| end <= i);
            let first = if p == 0 { 0 } else { ends[p - 1] };
            let start = (i - first) * chunk;
            emit_build_rows(plan, built, state, p, Some(start..start + chunk), &mut sink)?;
        }
        ctx.finish_sink(&mut sink)
    })?;
    let mut sink = ctx.sink();
    emit_unmatchable(plan, &built.unmatchable, facts, &mut sink)?;
    ctx.finish_sink(&mut sink)
}

/// Frees a level's tables, bloom filters and reservation, and returns the files of
/// its spilled partitions.
fn release_level(built: BuiltSide) -> Vec<(usize, SpillFile)> {
    // (A struct destructured with `..` keeps its other fields alive to the end of the
    // scope: name and drop each one.)
    let BuiltSide {
        partitions,
        unmatchable,
        _reservation,
        ..
    } = built;
    drop(unmatchable);
    let spilled = partitions
        .into_iter()
        .enumerate()
        .filter_map(|(p, part)| match part {
            Partition::Spilled(s) => Some((p, s.file)),
            Partition::InMemory(_) => None,
        })
        .collect();
    drop(_reservation);
    spilled
}

/// A spilled (build file, probe file) pair, its probe file absent when no probe row
/// reached the partition.
type Pair = (SpillFile, Option<SpillFile>);

/// The least memory a pair joined beside others is given: the floor every join is
/// tested to finish at with up to four threads and 8192-row batches
/// (`tests/spill_harness.rs`), for a pair joined on one thread.
const MIN_PAIR_SHARE: usize = 4 << 20;

/// Joins each spilled (build, probe) pair of a level, building on the smaller side
/// when the plan allows it.
///
/// Pairs that clearly fit in an equal share of the free memory are joined
/// side by side, one per thread, each in a pool of its own that holds its share
/// (reserved from the join's pool first, so the shares never take more than the
/// limit, and a pair's memory is its own however the other fares): a pair's build
/// and probe each read one file, which one thread reads at a time, and finishing a
/// pair's tables waits for its slowest partition, so all threads on one pair left
/// half of the second idle (SF10 orders ⋈ lineitem at a 25% limit: 1.31–1.35 s with
/// one thread, 0.97–1.15 s with two). The others, and every pair where there is no
/// room for shares, are joined one at a time with all threads.
pub(crate) fn join_spilled_pairs(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: LevelRows,
    spilled: Vec<(usize, SpillFile)>,
    mut probe_files: Vec<Option<SpillFile>>,
    facts: Facts,
) -> Result<()> {
    let plan = ctx.plan;
    let mut pairs: Vec<Pair> = Vec::new();
    for (p, build_file) in spilled {
        let probe_file = probe_files[p].take();
        if probe_file.is_none() && !plan.resolved.emits_build_rows_at_end() {
            continue; // no probe row can meet these build rows, and none is output
        }
        pairs.push((build_file, probe_file));
    }
    let workers = plan.threads.min(pairs.len());
    if workers > 1 {
        let limit = plan.pool.limit();
        let share = match limit {
            MemoryLimit::Infinite => None,
            // (Less the room output batches may take in flight, which the gate
            // reserves from this pool, not from a pair's: without it every batch
            // found the pool full and waited for the channel to empty.)
            MemoryLimit::Finite(bytes) => Some(
                bytes
                    .saturating_sub(plan.pool.reserved())
                    .saturating_sub(bytes / crate::channel::IN_FLIGHT_SHARE)
                    / workers,
            ),
        };
        // A pair fits its share when what it takes to join in one piece does.
        let fits = |pair: &Pair| {
            share.is_none_or(|share| share >= MIN_PAIR_SHARE && pair_bytes(plan, &pair.0) <= share)
        };
        let (side_by_side, alone): (Vec<Pair>, Vec<Pair>) = pairs.into_iter().partition(fits);
        pairs = alone;
        if side_by_side.len() > 1 {
            join_pairs_side_by_side(ctx, level, level_rows, side_by_side, share, facts)?;
        } else {
            pairs.extend(side_by_side);
        }
    }
    for (build_file, probe_file) in pairs {
        join_either_way(ctx, level, level_rows, build_file, probe_file, facts)?;
    }
    Ok(())
}

/// Joins `pairs` on `plan.threads` workers, one pair per worker at a time; each
/// worker's join runs on one thread in a pool of `share` bytes (reserved from the
/// join's pool while the workers run), or in the join's pool when it has no limit.
fn join_pairs_side_by_side(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: LevelRows,
    pairs: Vec<Pair>,
    share: Option<usize>,
    facts: Facts,
) -> Result<()> {
    let plan = ctx.plan;
    let workers = plan.threads.min(pairs.len());
    let shares = MemoryConsumer::new("spilljoin pair shares").register(&plan.pool);
    let mut held = shares.new_empty();
    if let Some(share) = share {
        if held.try_grow(share * workers).is_err() {
            // Another user of the pool took the room meanwhile (nothing of this
            // join's holds memory between levels): one pair at a time.
            for (build_file, probe_file) in pairs {
                join_either_way(ctx, level, level_rows, build_file, probe_file, facts)?;
            }
            return Ok(());
        }
    }
    ctx.note_peak();
    let slots: Vec<Mutex<Option<Pair>>> = pairs.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let next = AtomicUsize::new(0);
    run_workers(workers, ctx.cancel, || {
        let pool: Arc<dyn MemoryPool> = match share {
            Some(share) => Arc::new(TrackConsumersPool::new(
                GreedyMemoryPool::new(share),
                NonZeroUsize::MIN.saturating_add(4),
            )),
            None => Arc::clone(&plan.pool),
        };
        let one = plan.on_one_thread(&pool);
        let pair_ctx = Ctx {
            plan: &one,
            spill: ctx.spill.clone(),
            sender: ctx.sender,
            cancel: ctx.cancel,
            metrics: ctx.metrics,
            owned_output: ctx.owned_output,
            force: ctx.force,
        };
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = slots.get(i) else {
                return Ok(());
            };
            if ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let Some((build_file, probe_file)) = lock(slot).take() else {
                continue;
            };
            join_either_way(&pair_ctx, level, level_rows, build_file, probe_file, facts)?;
        }
    })?;
    drop(held);
    Ok(())
}

/// The rows a level partitioned on each side: a spilled pair of it that kept nearly
/// all of its side's rows did not split ([`join_pair`]). A pair that swaps roles is
/// measured against the level's probe rows, not its build rows (a swapped pair's
/// narrow probe rows once counted against the few wide build rows of its level, and
/// went to the fallback for no reason).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LevelRows {
    pub build: u64,
    pub probe: u64,
}

/// Joins one spilled pair, building on its probe file instead when that is smaller
/// and the plan has a mirror.
fn join_either_way(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: LevelRows,
    build_file: SpillFile,
    probe_file: Option<SpillFile>,
    facts: Facts,
) -> Result<()> {
    match (&ctx.plan.mirror, probe_file) {
        (Some(mirror), Some(probe_file)) if probe_file.bytes() < build_file.bytes() => {
            ctx.metrics.swapped_pairs.fetch_add(1, Ordering::Relaxed);
            let swapped = Ctx {
                plan: mirror,
                spill: ctx.spill.clone(),
                sender: ctx.sender,
                cancel: ctx.cancel,
                metrics: ctx.metrics,
                owned_output: ctx.owned_output,
                force: ctx.force,
            };
            join_pair(
                &swapped,
                level,
                level_rows.probe,
                &probe_file,
                Some(&build_file),
                facts,
            )
        }
        (_, probe_file) => join_pair(
            ctx,
            level,
            level_rows.build,
            &build_file,
            probe_file.as_ref(),
            facts,
        ),
    }
}

/// Joins one spilled pair: at the next level, or in chunks when it cannot split.
fn join_pair(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: u64,
    build_file: &SpillFile,
    probe_file: Option<&SpillFile>,
    facts: Facts,
) -> Result<()> {
    let next = level.bits.next_level(sub_level_bits(ctx.plan, build_file));
    // A pair that keeps (nearly) all of its level's rows did not split: one key
    // dominates, and repartitioning again would only rewrite it.
    let no_progress = level.depth > 0 && build_file.rows() * 10 >= level_rows * 9;
    match next {
        Some(bits) if level.depth < ctx.plan.max_depth && !no_progress => {
            let sub = Level {
                bits,
                depth: level.depth + 1,
                hashed_input: ctx.plan.spills_hashes(),
                force_spill_fraction: ctx.force.at(level.depth + 1),
                key_bounds: false,
                build_rows: Some(build_file.rows()),
            };
            let probe_inputs = probe_file
                .map(file_input)
                .transpose()?
                .into_iter()
                .collect();
            run_level(ctx, sub, vec![file_input(build_file)?], probe_inputs, facts)?;
            Ok(())
        }
        _ => fallback(ctx, level, level_rows, build_file, probe_file, facts),
    }
}

/// The radix bits of the level below for a spilled pair: [`SUB_LEVEL_BITS`], or, when
/// the pair clearly fits in the memory left ([`pair_bytes`]), one partition — or, for
/// a pair of more than [`ONE_TABLE_ROWS`] build rows joined on several threads, only
/// enough partitions for every thread to build a table. More would cut every batch
/// into more, smaller fragments and probe two tables for nothing (SF10 orders ⋈
/// lineitem at a 50% limit: 16 sub-partitions of ~500 rows per batch; at 25%, one
/// table per side-by-side pair instead of two: spilled-pairs phase 0.82–0.95 →
/// 0.71–0.81 s).
/// Should the estimate be wrong, the level below spills: with one partition it cannot
/// split, and the pair is joined in chunks ([`fallback`]).
fn sub_level_bits(plan: &JoinPlan, build_file: &SpillFile) -> u32 {
    let limit = plan.pool.limit().bytes();
    let free = limit.saturating_sub(plan.pool.reserved());
    if pair_bytes(plan, build_file) <= free {
        // (Only where the estimate counts fixed-width rows at their width: should a
        // level of one partition spill, the pair can only be joined in chunks.)
        let counted = crate::gather::fixed_widths(&plan.spill_schema(true)).is_some();
        if counted && build_file.rows() <= ONE_TABLE_ROWS {
            0
        } else {
            plan.threads.max(1).next_power_of_two().ilog2()
        }
    } else {
        SUB_LEVEL_BITS
    }
}

/// A spilled pair joined alone on several threads (its build is too large for a
/// share of the memory, under small limits) builds one table while its build file
/// has at most this many rows. Its probe rows then need no grouping by hash — nor a
/// hash at all where the table is looked up by key — which costs more than the
/// table's build on one thread saves (about a millisecond per million rows: `kernel/
/// table build 1M unique`). Spilled-pairs phase with one table instead of one per
/// thread, two threads, three alternating runs: SF1 orders ⋈ lineitem at 1.7 MiB
/// (23K build rows a pair) 0.149–0.152 → 0.130–0.132 s, SF10 customer ⋈ orders at
/// 1.7 MiB 0.338–0.348 → 0.292–0.294 s, SF10 `NOT IN` at 3.3 MiB (67K rows a pair)
/// 0.418–0.432 → 0.390–0.412 s. A pair joined alone takes at most the memory left,
/// so under the small limits that join pairs alone it is small; measured up to 67K
/// rows. Past this many rows (a skewed pair, or a large limit) each thread keeps its
/// own table, as before.
const ONE_TABLE_ROWS: u64 = 1 << 20;

/// About the memory joining a spilled pair in one piece takes: its build rows in
/// memory, their hashes while a word key's table is built, the table, and a probe
/// worker's batches beside them. Rows of fixed-width columns are counted at their
/// width in memory (a spill file may hold them narrower, [`spilljoin_spill::segment_schema`]);
/// others at four times the file's bytes (their concatenation, the key encoding and
/// the table).
///
/// Counted by the file's bytes alone, a one-column build of 268K `Int64` keys per
/// pair (TPC-H `NOT IN`, SF10, 25%) seemed to fit a share of 8.8 MB in 2.2 MB; it
/// took 4 MiB of rows, 5.2 MB of table and 2.1 MB of hashes, and all 32 pairs were
/// joined in chunks.
fn pair_bytes(plan: &JoinPlan, build_file: &SpillFile) -> usize {
    let rows = usize::try_from(build_file.rows()).unwrap_or(usize::MAX);
    let file = usize::try_from(build_file.bytes()).unwrap_or(usize::MAX);
    let build = match crate::gather::fixed_widths(&plan.spill_schema(true)) {
        Some(widths) => {
            let hashes = if plan.spills_hashes() { 0 } else { 8 };
            rows.saturating_mul(widths.iter().sum::<usize>() + hashes)
                .saturating_add(crate::table::ChainedTable::size_for(rows))
        }
        None => file.saturating_mul(4),
    };
    let probe =
        crate::plan::probe_worker_bytes(plan.work_rows, plan.work_rows) + 3 * plan.work_rows * 32;
    build.saturating_add(probe)
}

/// Joins a spilled pair that its hash bits cannot split.
///
/// When one hash value (one key, bar collisions) holds at least half of the build
/// file's first rows, and reading the whole probe file once per build chunk would cost
/// more than writing both files once more, the pair is split first
/// ([`split_hot_key`]): that key's rows, on both sides, are joined in chunks against
/// that key's probe rows only, and the other rows go back to [`join_pair`], where they
/// split like any pair. Otherwise the whole pair is joined in chunks ([`chunked`]).
fn fallback(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: u64,
    build_file: &SpillFile,
    probe_file: Option<&SpillFile>,
    facts: Facts,
) -> Result<()> {
    ctx.metrics.fallbacks.fetch_add(1, Ordering::Relaxed);
    let split = |probe_file: &&SpillFile| match ctx.plan.hot_key_split {
        HotKeySplit::Auto => split_pays(ctx.plan, build_file, probe_file),
        HotKeySplit::Always => true,
        HotKeySplit::Never => false,
    };
    if let Some(probe_file) = probe_file.filter(split) {
        let consumer = MemoryConsumer::new("spilljoin hot key split")
            .with_can_spill(false)
            .register(&ctx.plan.pool);
        let mut reservation = consumer.new_empty();
        // The sample's hashes, then a batch in flight (filtered twice); without room
        // for them the pair is joined in chunks.
        let room = HOT_SAMPLE_ROWS * 8 + 3 * ctx.plan.work_rows * 64;
        if reservation.try_grow(room).is_ok() {
            if let Some(hot) = hot_hash(ctx, build_file)? {
                return split_hot_key(
                    ctx,
                    level,
                    level_rows,
                    [build_file, probe_file],
                    hot,
                    facts,
                    reservation,
                );
            }
        }
    }
    chunked(ctx, level, build_file, probe_file, facts)
}

/// Rows of a build file sampled for its most frequent hash.
const HOT_SAMPLE_ROWS: usize = 64 * 1024;

/// Whether splitting off a hot key costs less than the chunked join's extra reads of
/// the probe file: with `c` build chunks, the chunked join reads the probe file `c`
/// times; a split writes and reads both files once more.
fn split_pays(plan: &JoinPlan, build_file: &SpillFile, probe_file: &SpillFile) -> bool {
    let free = plan
        .pool
        .limit()
        .bytes()
        .saturating_sub(plan.pool.reserved())
        .max(1) as u64;
    // A chunk holds a batch, its copy, hashes and table: about twice the file bytes.
    let chunks = (build_file.bytes().saturating_mul(2)).div_ceil(free).max(1);
    let extra_reads = (chunks - 1).saturating_mul(probe_file.bytes());
    let split = 2 * (build_file.bytes() + probe_file.bytes());
    extra_reads > split
}

/// The hash that at least half of the first [`HOT_SAMPLE_ROWS`] rows of `file` (a
/// build spill file) share, if one does.
fn hot_hash(ctx: &Ctx<'_>, file: &SpillFile) -> Result<Option<u64>> {
    let plan = ctx.plan;
    let mut sample: Vec<u64> = Vec::with_capacity(HOT_SAMPLE_ROWS);
    for batch in file_input(file)? {
        let batch = batch.map_err(|e| ctx.input_error(plan.build_side, e))?;
        let (_, hashes) = level_split(plan, &batch, true)?;
        let room = HOT_SAMPLE_ROWS - sample.len();
        sample.extend(hashes.iter().take(room));
        if sample.len() >= HOT_SAMPLE_ROWS {
            break;
        }
    }
    sample.sort_unstable();
    let (mut best, mut best_count, mut run) = (None, 0, 0);
    for (i, &h) in sample.iter().enumerate() {
        run = if i > 0 && sample[i - 1] == h {
            run + 1
        } else {
            1
        };
        if run > best_count {
            (best, best_count) = (Some(h), run);
        }
    }
    Ok(best.filter(|_| best_count * 2 >= sample.len() && !sample.is_empty()))
}

/// Splits a pair into the rows whose hash is `hot` and the others, on both sides (one
/// more write of each file, which keeps its format), then joins the hot pair in chunks
/// and sends the rest back to [`join_pair`]. Every key's rows land in one of the two
/// pairs on both sides, so each pair is a complete join of its keys: probe rows are
/// decided in the pair that holds them, build rows likewise.
fn split_hot_key(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: u64,
    [build_file, probe_file]: [&SpillFile; 2],
    hot: u64,
    facts: Facts,
    reservation: MemoryReservation,
) -> Result<()> {
    let plan = ctx.plan;
    ctx.metrics.hot_key_splits.fetch_add(1, Ordering::Relaxed);
    let [hot_build, cold_build] = split_file(ctx, build_file, true, hot)?;
    let [hot_probe, cold_probe] = split_file(ctx, probe_file, false, hot)?;
    drop(reservation);
    if hot_probe.rows() > 0 || plan.resolved.emits_build_rows_at_end() {
        chunked(ctx, level, &hot_build, Some(&hot_probe), facts)?;
    }
    drop((hot_build, hot_probe));
    if cold_build.rows() == build_file.rows() {
        // Nothing was hot after all (the sample was not the file): no progress.
        return chunked(ctx, level, &cold_build, Some(&cold_probe), facts);
    }
    if cold_probe.rows() > 0 || plan.resolved.emits_build_rows_at_end() {
        join_pair(
            ctx,
            level,
            level_rows,
            &cold_build,
            Some(&cold_probe),
            facts,
        )?;
    }
    Ok(())
}

/// Rewrites a spill file of the build (`build == true`) or probe side as two: the
/// rows whose hash is `hot`, and the others.
fn split_file(ctx: &Ctx<'_>, file: &SpillFile, build: bool, hot: u64) -> Result<[SpillFile; 2]> {
    let plan = ctx.plan;
    let side = if build { "build" } else { "probe" };
    let counters = ctx.metrics.spill_counters(build);
    let files_counter = if build {
        &ctx.metrics.build_spill_files
    } else {
        &ctx.metrics.probe_spill_files
    };
    let schema = plan.spill_schema(build);
    let mut writers = [
        ctx.spill
            .create_writer(Arc::clone(&schema), &format!("{side}-hot"))?,
        ctx.spill
            .create_writer(Arc::clone(&schema), &format!("{side}-cold"))?,
    ];
    ctx.metrics.spill_files.fetch_add(2, Ordering::Relaxed);
    files_counter.fetch_add(2, Ordering::Relaxed);
    let side_of_input = if build {
        plan.build_side
    } else {
        plan.probe_side()
    };
    for batch in file_input(file)? {
        if ctx.cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        let batch = batch.map_err(|e| ctx.input_error(side_of_input, e))?;
        let (_, hashes) = level_split(plan, &batch, build)?;
        let is_hot: BooleanArray = hashes.iter().map(|&h| Some(h == hot)).collect();
        let is_cold: BooleanArray = hashes.iter().map(|&h| Some(h != hot)).collect();
        for (writer, mask) in writers.iter_mut().zip([&is_hot, &is_cold]) {
            let part = arrow_select::filter::filter_record_batch(&batch, mask)?;
            if part.num_rows() > 0 {
                write_counted(writer, &part, &counters)?;
            }
        }
    }
    let [hot_writer, cold_writer] = writers;
    Ok([hot_writer.finish()?, cold_writer.finish()?])
}

/// Joins a spilled pair in chunks: the build file in chunks that fit, each joined
/// with the whole probe file (single-threaded).
fn chunked(
    ctx: &Ctx<'_>,
    level: Level,
    build_file: &SpillFile,
    probe_file: Option<&SpillFile>,
    facts: Facts,
) -> Result<()> {
    let plan = ctx.plan;
    let resolved = plan.resolved;
    let bits = HashBits::new(0);
    let consumer = MemoryConsumer::new("spilljoin fallback")
        .with_can_spill(true)
        .register(&plan.pool);
    let probe_rows = probe_file.map_or(0, |f| f.rows()) as usize;
    // Per probe row of the file: matched in some chunk? One bit a row.
    let mut matched_bits = consumer.new_empty();
    let tracks_probe = resolved.tracks_matched_probe_rows();
    let tracked_rows = if tracks_probe { probe_rows } else { 0 };
    matched_bits.try_grow(tracked_rows.div_ceil(8))?;
    let mut matched = BooleanBufferBuilder::new(tracked_rows);
    matched.append_n(tracked_rows, false);
    let mut build = file_input(build_file)?;
    let mut pending: Option<RecordBatch> = None;
    let mut sink = ctx.sink();
    loop {
        if ctx.cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        // Read a chunk of the build file that fits.
        let mut chunk = consumer.new_empty();
        let mut buffer = PartitionBuffer::default();
        while let Some(batch) = pending.take().map(Ok).or_else(|| build.next()) {
            let batch = batch.map_err(|e| ctx.input_error(plan.build_side, e))?;
            let (batch, hashes) = level_split(plan, &batch, true)?;
            // The batch, its hashes and key encoding, and its share of the table.
            let need = batch_bytes(&batch) * 2 + hashes.len() * 24 + 1024;
            if chunk.try_grow(need).is_err() {
                if buffer.rows() == 0 {
                    chunk.try_grow(need)?;
                } else {
                    pending = Some(attach_back(plan, &batch, &hashes)?);
                    break;
                }
            }
            buffer.push(batch, hashes.to_vec(), need);
        }
        if buffer.rows() == 0 {
            break;
        }
        let held = buffer.bytes();
        let chunk_rows = buffer.rows() as u64;
        let reservation = Mutex::new(chunk);
        let part = finish_partition(plan, buffer, held, &reservation, true)?;
        let built = BuiltSide {
            partitions: vec![Partition::InMemory(part)],
            unmatchable: Unmatchable::default(),
            num_rows: chunk_rows,
            has_null_key: false,
            bounds: Vec::new(),
            _reservation: reservation.into_inner().unwrap_or_else(|p| p.into_inner()),
        };
        let state = ProbeState::new(
            ctx,
            Level {
                bits,
                depth: level.depth + 1,
                hashed_input: ctx.plan.spills_hashes(),
                force_spill_fraction: 0.0,
                key_bounds: false,
                build_rows: None,
            },
            &built,
            consumer.new_empty(),
            facts,
        )?;
        let mut prober = Prober::new(ctx, bits, &built, &state).without_probe_row_output();
        let mut offset = 0usize;
        if let Some(file) = probe_file {
            for batch in file_input(file)? {
                if ctx.cancel.load(Ordering::Relaxed) {
                    return Err(JoinError::Cancelled);
                }
                let batch = batch.map_err(|e| ctx.input_error(plan.probe_side(), e))?;
                let (batch, hashes) = level_split(plan, &batch, false)?;
                if tracks_probe && offset + batch.num_rows() > matched.len() {
                    return Err(JoinError::Internal(format!(
                        "probe spill file {} holds more rows than it said",
                        file.path().display()
                    )));
                }
                prober.probe(&batch, Some(&hashes), &mut sink)?;
                if tracks_probe {
                    let newly: Vec<u32> = prober
                        .matched()
                        .iter()
                        .enumerate()
                        .filter(|&(r, &m)| m && !matched.get_bit(offset + r))
                        .map(|(r, _)| r as u32)
                        .collect();
                    for &r in &newly {
                        matched.set_bit(offset + r as usize, true);
                    }
                    if resolved == BuildJoinType::ProbeSemi && !newly.is_empty() {
                        let rows = UInt32Array::from(newly);
                        sink.push(plan.output.gather(
                            rows.len(),
                            Some((&batch, &rows)),
                            None,
                            None,
                        )?)?;
                    }
                }
                offset += batch.num_rows();
            }
        }
        emit_build_rows(plan, &built, &state, 0, None, &mut sink)?;
    }
    // Probe rows decided only now that every chunk has been seen.
    let matched = matched.finish();
    if tracks_probe && resolved != BuildJoinType::ProbeSemi {
        if let Some(file) = probe_file {
            let mut offset = 0usize;
            for batch in file_input(file)? {
                let batch = batch.map_err(|e| ctx.input_error(plan.probe_side(), e))?;
                // Only the rows are needed here, not their hashes.
                let batch = if plan.spills_hashes() {
                    detach_hashes(&batch)?.0
                } else {
                    batch
                };
                let n = batch.num_rows();
                if offset + n > matched.len() {
                    return Err(JoinError::Internal(format!(
                        "probe spill file {} holds more rows than it said",
                        file.path().display()
                    )));
                }
                let seen = matched.slice(offset, n);
                offset += n;
                let out = if resolved == BuildJoinType::ProbeMark {
                    let all = UInt32Array::from_iter_values(0..n as u32);
                    plan.output.gather(
                        n,
                        Some((&batch, &all)),
                        None,
                        Some(&BooleanArray::new(seen, None)),
                    )?
                } else {
                    let rows = crate::batches::select_rows(0..n as u32, |r| !seen.value(r));
                    plan.output
                        .gather(rows.len(), Some((&batch, &rows)), None, None)?
                };
                sink.push(out)?;
            }
        }
    }
    ctx.finish_sink(&mut sink)?;
    Ok(())
}

/// A batch read back from a spill file of the build (`build == true`) or probe side,
/// and its rows' hashes: the stored ones, or hashed again for word keys.
fn level_split(
    plan: &JoinPlan,
    batch: &RecordBatch,
    build: bool,
) -> Result<(RecordBatch, ScalarBuffer<u64>)> {
    if plan.spills_hashes() {
        return detach_hashes(batch);
    }
    let mut hashes = Vec::new();
    plan.hash_rows(batch, build, &mut hashes)?;
    Ok((batch.clone(), hashes.into()))
}

fn attach_back(
    plan: &JoinPlan,
    batch: &RecordBatch,
    hashes: &ScalarBuffer<u64>,
) -> Result<RecordBatch> {
    crate::batches::attach_hashes(batch, hashes.to_vec(), &plan.spill_schema(true))
}

/// Runs a whole join: level 0 over the user's inputs.
pub(crate) fn run<B, P>(ctx: &Ctx<'_>, build: Vec<B>, probe: Vec<P>) -> Result<()>
where
    B: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let level = Level {
        bits: ctx.plan.bits,
        depth: 0,
        hashed_input: false,
        force_spill_fraction: ctx.force.at(0),
        key_bounds: false,
        build_rows: None,
    };
    let result = run_level(ctx, level, build, probe, Facts::default()).map(|_| ());
    ctx.metrics.set_phase(JoinPhase::Done);
    result
}
