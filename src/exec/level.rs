//! One level of the hybrid join, from its inputs to the files it spilled: build,
//! probe, the build rows output after the probe, and the release of its tables
//! before its spilled pairs are joined ([`super::pairs`]). Also how a spill file is
//! read back as the input of the level below, which the pairs and the fallback share.
//!
//! Its own file because it is the one place a level's phases are sequenced (and
//! timed at level 0); what happens to the spilled pairs is a concept of its own.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_buffer::ScalarBuffer;
use arrow_schema::ArrowError;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};
use spilljoin_spill::SpillFile;

use super::pairs::{join_spilled_pairs, LevelRows};
use crate::batches::{batch_bytes, detach_hashes, pieces, run_workers, InputStreams};
use crate::build::{build_side, BuiltSide, Partition};
use crate::context::{Ctx, Facts, JoinPhase, Level};
use crate::error::{JoinError, Result};
use crate::output::OutputSink;
use crate::plan::JoinPlan;
use crate::probe::{emit_build_rows, emit_unmatchable, ProbeState, Prober};

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

/// Runs one level over its inputs, then the pairs it spilled. Returns the probe facts
/// it saw.
pub(super) fn run_level<B, P>(
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
    // (Each piece reserved while it is probed; the input batch itself is not.) A
    // batch of one piece is measured once: a view column's measure is a pass over
    // its views.
    let whole_bytes = batch_bytes(&batch);
    let piece_rows = plan.piece_rows_of(batch.num_rows(), whole_bytes);
    for (piece, hashes) in pieces(&batch, hashes.as_ref(), piece_rows) {
        let bytes = if piece.num_rows() == batch.num_rows() {
            whole_bytes
        } else {
            batch_bytes(&piece)
        };
        state.reserve(ctx, reservation, bytes)?;
        prober.probe(&piece, hashes.as_deref(), sink)?;
        reservation.shrink(bytes);
    }
    Ok(())
}

/// The batches of build rows a worker outputs at a time after the probe
/// ([`emit_build_phase`]): few enough that even a spilled pair's one table is output
/// in several chunks, and so on several threads.
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

/// A spill file as up to `streams` input streams over consecutive runs of its
/// batches ([`SpillFile::readers`]), so that as many workers read and decode it at
/// once: one stream kept a spilled pair's build on one thread, most of it reading
/// the file, while the others waited on the stream's lock.
pub(super) fn file_inputs(
    file: &SpillFile,
    streams: usize,
) -> Result<Vec<impl Iterator<Item = Result<RecordBatch, ArrowError>> + Send>> {
    Ok(file
        .readers(streams)?
        .into_iter()
        .map(|reader| reader.map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e)))))
        .collect())
}

/// A spill file as an input stream.
pub(super) fn file_input(
    file: &SpillFile,
) -> Result<impl Iterator<Item = Result<RecordBatch, ArrowError>> + Send> {
    Ok(file
        .reader()?
        .map(|r| r.map_err(|e| ArrowError::ExternalError(Box::new(e)))))
}

/// A batch read back from a spill file of the build (`build == true`) or probe side,
/// and its rows' hashes: the stored ones, or hashed again for word keys.
pub(super) fn level_split(
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

/// A build batch split by [`level_split`] made whole again: its hashes attached as
/// a build spill file stores them.
pub(super) fn attach_back(
    plan: &JoinPlan,
    batch: &RecordBatch,
    hashes: &ScalarBuffer<u64>,
) -> Result<RecordBatch> {
    crate::batches::attach_hashes(batch, hashes.to_vec(), &plan.spill_schema(true))
}
