//! The fallback for a spilled pair that its hash bits cannot split (one key
//! dominates, or no bits are left): whether to split the dominant key off first, and
//! that split; the chunked join that both end in is [`super::chunked`].
//!
//! Its own file because it is the one place a pair leaves the recursion: what it
//! decides (a hot key's pair in chunks, the rest back to [`join_pair`]) concerns
//! neither levels nor the chunked join.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::BooleanArray;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};
use spilljoin_spill::SpillFile;

use super::chunked::chunked;
use super::level::{file_input, level_split};
use super::pairs::join_pair;
use crate::batches::write_counted;
use crate::context::{Ctx, Facts, Level};
use crate::error::{JoinError, Result};
use crate::plan::{HotKeySplit, JoinPlan};

/// Joins a spilled pair that its hash bits cannot split.
///
/// When one hash value (one key, bar collisions) holds at least half of the build
/// file's first rows, and reading the whole probe file once per build chunk would cost
/// more than writing both files once more, the pair is split first
/// ([`split_hot_key`]): that key's rows, on both sides, are joined in chunks against
/// that key's probe rows only, and the other rows go back to [`join_pair`], where they
/// split like any pair. Otherwise the whole pair is joined in chunks ([`chunked`]).
pub(super) fn fallback(
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
