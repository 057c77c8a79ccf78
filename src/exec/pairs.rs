//! The spilled (build file, probe file) pairs of a level: joined side by side, one
//! per thread in a share of the free memory, or one at a time on all threads; each
//! either way round (the smaller file builds), at the next level with the radix bits
//! that suit it, or in the fallback ([`super::fallback`]) when it cannot split.
//!
//! Its own file because what a level spilled is joined after the level is gone, by
//! rules (shares of the memory, the bits of the level below, when a pair did not
//! split) that no single level needs.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_schema::DataType;
use spilljoin_memory::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, TrackConsumersPool,
};
use spilljoin_spill::{SpillCompression, SpillFile};

use super::fallback::fallback;
use super::level::{file_inputs, run_level};
use crate::batches::{lock, run_workers};
use crate::context::{Ctx, Facts, Level};
use crate::error::{JoinError, Result};
use crate::plan::JoinPlan;

/// Radix bits of every level below the first.
const SUB_LEVEL_BITS: u32 = 4;

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
/// threads idle for much of its join. The others, and every pair where there is no
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
        let compressed = ctx.spill.config().compression != SpillCompression::None;
        let fits =
            |pair: &Pair| share.is_none_or(|share| fits_share(plan, &pair.0, share, compressed));
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
pub(super) fn join_pair(
    ctx: &Ctx<'_>,
    level: Level,
    level_rows: u64,
    build_file: &SpillFile,
    probe_file: Option<&SpillFile>,
    facts: Facts,
) -> Result<()> {
    let compressed = ctx.spill.config().compression != SpillCompression::None;
    let next = level
        .bits
        .next_level(sub_level_bits(ctx.plan, build_file, compressed));
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
            let streams = ctx.plan.threads;
            let probe_inputs = match probe_file {
                Some(file) => file_inputs(file, streams)?,
                None => Vec::new(),
            };
            let build_inputs = file_inputs(build_file, streams)?;
            run_level(ctx, sub, build_inputs, probe_inputs, facts)?;
            Ok(())
        }
        _ => fallback(ctx, level, level_rows, build_file, probe_file, facts),
    }
}

/// The radix bits of the level below for a spilled pair: [`SUB_LEVEL_BITS`], or, when
/// the pair fits in the memory left ([`pair_bytes`]), enough partitions for every
/// thread to build a table — or one partition, for a pair of at most
/// [`ONE_TABLE_ROWS`] build rows counted as they are in memory
/// ([`counts_rows_as_read`]). More would cut every batch into more, smaller fragments
/// and probe two tables for nothing.
/// Should the estimate be wrong, the level below spills: with one partition it cannot
/// split, and the pair is joined in chunks ([`fallback`]); with more, the partitions
/// that spill are split again. [`pair_bytes`] counts one probe worker's buffers, not
/// all the headroom a level reserves for wide probe batches on every thread, so a
/// pair of wide rows on many threads can be judged to fit and then be joined in
/// chunks; counting the whole headroom kept such pairs out of one table everywhere
/// and spilled them a level deeper instead, which was slower (`BENCHMARKS.md`).
fn sub_level_bits(plan: &JoinPlan, build_file: &SpillFile, compressed: bool) -> u32 {
    let limit = plan.pool.limit().bytes();
    let free = limit.saturating_sub(plan.pool.reserved());
    if pair_bytes(plan, build_file, compressed) <= free {
        // (Only where the estimate counts the rows as they are in memory.)
        if build_file.rows() <= ONE_TABLE_ROWS && counts_rows_as_read(plan, compressed) {
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
/// table's build on one thread saves (`kernel/table build 1M unique` measures that
/// build); the spilled-pairs phase of such joins is faster with one table than with
/// one per thread. A pair joined alone takes at most the memory left, so under the
/// small limits that join pairs alone it is small; this was measured on such small
/// pairs only. Past this many rows (a skewed pair, or a large limit) each thread
/// keeps its own table, as before.
const ONE_TABLE_ROWS: u64 = 1 << 20;

/// About the memory joining a spilled pair in one piece takes: its build rows in
/// memory, their hashes while a word key's table is built, the table, and a probe
/// worker's batches beside them. Rows of fixed-width columns are counted at their
/// width in memory (a spill file may hold them narrower,
/// [`spilljoin_spill::segment_schema`]). Others are counted as they read back
/// ([`read_back_bytes`]) where that is all they take: an uncompressed file, joined on
/// one word key (no encoded keys beside the rows), without dictionary columns (read
/// back, each batch carries its segment's dictionary). Elsewhere they are counted at
/// four times the file's bytes (their concatenation, the key encoding and the table)
/// and 12 bytes more a row for each view column (written as offsets), which under
/// small limits takes pairs that fit for ones that do not and splits them finer than
/// they need.
///
/// Counted by the file's bytes alone, a narrow build of fixed-width keys seemed to
/// fit a share in a fraction of it, took several times its file's bytes in rows,
/// table and hashes, and every pair was joined in chunks.
fn pair_bytes(plan: &JoinPlan, build_file: &SpillFile, compressed: bool) -> usize {
    let rows = usize::try_from(build_file.rows()).unwrap_or(usize::MAX);
    let file = usize::try_from(build_file.bytes()).unwrap_or(usize::MAX);
    let schema = plan.spill_schema(true);
    let fields = schema.fields();
    let table = crate::table::ChainedTable::size_for(rows);
    let build = if let Some(widths) = crate::gather::fixed_widths(&schema) {
        let hashes = if plan.spills_hashes() { 0 } else { 8 };
        rows.saturating_mul(widths.iter().sum::<usize>() + hashes)
            .saturating_add(table)
    } else if counts_rows_as_read(plan, compressed) {
        // (Their hashes, and the key widened to a word with its validity, which a
        // key narrower than a word takes beside the rows.)
        usize::try_from(read_back_bytes(plan, build_file))
            .unwrap_or(usize::MAX)
            .saturating_add(rows.saturating_mul(8 + 9))
            .saturating_add(table)
    } else {
        let views = fields.iter().filter(|f| is_view(f.data_type())).count();
        file.saturating_mul(4)
            .saturating_add(rows.saturating_mul(12 * views))
    };
    let probe =
        crate::plan::probe_worker_bytes(plan.work_rows, plan.work_rows) + 3 * plan.work_rows * 32;
    build.saturating_add(probe)
}

/// Whether [`pair_bytes`] counts a pair's build rows as they are in memory: rows of
/// fixed-width columns, or rows counted as they read back (an uncompressed file, one
/// word key, no dictionary columns).
fn counts_rows_as_read(plan: &JoinPlan, compressed: bool) -> bool {
    let schema = plan.spill_schema(true);
    crate::gather::fixed_widths(&schema).is_some()
        || (!compressed
            && plan.keys.is_word_key()
            && !schema
                .fields()
                .iter()
                .any(|f| matches!(f.data_type(), DataType::Dictionary(..))))
}

/// Whether a column of `data_type` is a view column (read back from offsets).
fn is_view(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8View | DataType::BinaryView)
}

/// Whether a pair fits a share of `share` bytes to be joined in on one thread
/// ([`pair_bytes`]). Where either side's rows have variable-width columns, the
/// level's probe batches and output are as wide and as many as the share allows, up
/// to half of it ([`crate::plan::ProbeShape::workers_headroom`]), more than the probe
/// worker's buffers [`pair_bytes`] counts: the pair must then fit in the other
/// half, or its level spills within the share and joins it in chunks.
fn fits_share(plan: &JoinPlan, build_file: &SpillFile, share: usize, compressed: bool) -> bool {
    let fixed = |build| crate::gather::fixed_widths(&plan.spill_schema(build)).is_some();
    let room = if fixed(true) && fixed(false) {
        share
    } else {
        share / 2
    };
    share >= MIN_PAIR_SHARE && pair_bytes(plan, build_file, compressed) <= room
}

/// The bytes an uncompressed spilled build file's rows take once read back, as a
/// batch's bytes count them ([`crate::batches::batch_bytes`]): the file's bytes and,
/// for each row, what its columns regain: a view's 12 bytes (4 bytes of offset in
/// the file, a 16-byte view in memory), and a fixed-width column's width less the
/// narrowest it may be stored in (an `Int64` in the wide file schema,
/// [`spilljoin_spill::file_schema`], may be stored as an `Int32`). Not dictionary
/// columns, whose batches each count their dictionary.
fn read_back_bytes(plan: &JoinPlan, build_file: &SpillFile) -> u64 {
    let logical = plan.spill_schema(true);
    let stored = spilljoin_spill::file_schema(&logical);
    let per_row: usize = logical
        .fields()
        .iter()
        .zip(stored.fields())
        .map(|(l, f)| match (l.data_type(), f.data_type()) {
            (l, _) if is_view(l) => 12,
            (l, f) => {
                let narrowest = match f {
                    DataType::Int64 => Some(4),
                    f => f.primitive_width(),
                };
                l.primitive_width()
                    .zip(narrowest)
                    .map_or(0, |(l, f)| l.saturating_sub(f))
            }
        })
        .sum();
    build_file
        .bytes()
        .saturating_add(build_file.rows().saturating_mul(per_row as u64))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringViewArray};
    use arrow_schema::{ArrowError, DataType, Field, Schema};
    use spilljoin_spill::{SpillConfig, SpillManager};

    use super::read_back_bytes;
    use crate::batches::batch_bytes;
    use crate::HashJoinBuilder;

    /// A build side like TPC-H orders with strings: a key, a price, a short and a
    /// long string, the strings viewed out of a larger batch.
    fn orders(rows: usize) -> Result<RecordBatch, ArrowError> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("price", DataType::Decimal128(12, 2), true),
            Field::new("priority", DataType::Utf8View, true),
            Field::new("comment", DataType::Utf8View, true),
        ]));
        let long = |i: usize| format!("comment {i} {}", "x".repeat(20 + i % 60));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|i| i * 7),
            )),
            Arc::new(
                Decimal128Array::from_iter((0..rows).map(|i| (i % 9 != 0).then_some(i as i128)))
                    .with_precision_and_scale(12, 2)?,
            ),
            Arc::new(StringViewArray::from_iter(
                (0..rows).map(|i| (i % 5 != 0).then(|| format!("{}-URGENT", i % 5))),
            )),
            Arc::new(StringViewArray::from_iter_values((0..rows).map(long))),
        ];
        RecordBatch::try_new(schema, columns)
    }

    #[test]
    fn a_pairs_build_rows_are_counted_at_least_as_they_read_back_and_not_far_more(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let whole = orders(30_000)?;
        let join = HashJoinBuilder::new(whole.schema(), whole.schema(), [("k", "k")]).build()?;
        let plan = &join.plan;
        let dir = tempfile::tempdir()?;
        let spill = SpillManager::new(SpillConfig::default().with_root_dir(dir.path()))?;
        let mut writer = spill.create_writer(plan.spill_schema(true), "build")?;
        // Slices of a larger batch: their views share its buffers, which a file
        // does not hold.
        for start in (0..24_000).step_by(6_000) {
            let piece = whole.slice(start + 1_000, 5_000);
            writer.write(&RecordBatch::try_new(
                plan.spill_schema(true),
                piece.columns().to_vec(),
            )?)?;
        }
        let file = writer.finish()?;
        let mut read_back = 0;
        for batch in file.reader()? {
            read_back += batch_bytes(&batch?);
        }
        let counted = usize::try_from(read_back_bytes(plan, &file))?;
        assert!(counted >= read_back, "{counted} < {read_back}");
        assert!(
            counted * 4 <= read_back * 5,
            "{counted} is over 1.25 × {read_back}"
        );
        Ok(())
    }
}
