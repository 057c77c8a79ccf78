//! The chunked join, where the fallback ([`super::fallback`]) ends: the build file is
//! read in chunks that fit, each chunk becomes one table that the whole probe file
//! is probed against, and per-probe-row match bits carry outer, anti, semi and mark
//! semantics across chunks — a block nested loop with a hash table per block.
//!
//! ```text
//!  for each chunk of the build file (as much as the memory takes, at least a batch):
//!     one table ◄─ the chunk
//!     probe file ─► probe the table ─► matched pairs output now
//!                                      probe rows matched for the first time:
//!                                      marked (a probe semi join outputs them now)
//!     the chunk's build rows the join keeps ─► output
//!  probe file again ─► probe rows decided by their marks (outer, anti, mark) ─► output
//! ```
//!
//! Its own file because it is a join of its own, single-threaded and independent of
//! the hash bits, with state ([`Chunked`], [`BuildChunks`]) that lives across chunks.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use arrow_array::{BooleanArray, RecordBatch, UInt32Array};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::ArrowError;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};
use spilljoin_spill::SpillFile;

use super::level::{attach_back, file_input, level_split};
use crate::batches::{batch_bytes, detach_hashes};
use crate::build::{finish_partition, BuiltSide, Partition, PartitionBuffer, Unmatchable};
use crate::context::{Ctx, Facts, Level};
use crate::error::{JoinError, Result};
use crate::join_type::BuildJoinType;
use crate::output::OutputSink;
use crate::partition::HashBits;
use crate::plan::JoinPlan;
use crate::probe::{emit_build_rows, ProbeState, Prober};

/// Joins a spilled pair in chunks: the build file in chunks that fit, each joined
/// with the whole probe file (single-threaded).
pub(super) fn chunked(
    ctx: &Ctx<'_>,
    level: Level,
    build_file: &SpillFile,
    probe_file: Option<&SpillFile>,
    facts: Facts,
) -> Result<()> {
    let mut join = Chunked::new(ctx, level, probe_file, facts)?;
    let mut build = BuildChunks {
        batches: file_input(build_file)?,
        pending: None,
    };
    let mut sink = ctx.sink();
    loop {
        if ctx.cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        let Some(built) = build.next_chunk(ctx, &join.consumer)? else {
            break;
        };
        join.probe_chunk(&built, &mut sink)?;
    }
    join.emit_decided_probe_rows(&mut sink)?;
    ctx.finish_sink(&mut sink)?;
    Ok(())
}

/// What a chunked join keeps from one build chunk to the next: the level each
/// chunk's table is probed at, and which probe rows of the file some chunk matched.
struct Chunked<'a, 'c> {
    ctx: &'a Ctx<'c>,
    /// The level below the pair's, of one partition: each chunk's table.
    level: Level,
    probe_file: Option<&'a SpillFile>,
    facts: Facts,
    /// Every reservation of the join is made through it.
    consumer: MemoryReservation,
    /// Whether the join type decides probe rows by whether any chunk matched them.
    tracks_probe: bool,
    /// Per probe row of the file: matched in some chunk? One bit a row (none when
    /// not tracked), reserved in `_matched_bytes`.
    matched: BooleanBufferBuilder,
    _matched_bytes: MemoryReservation,
}

impl<'a, 'c> Chunked<'a, 'c> {
    fn new(
        ctx: &'a Ctx<'c>,
        level: Level,
        probe_file: Option<&'a SpillFile>,
        facts: Facts,
    ) -> Result<Self> {
        let plan = ctx.plan;
        let consumer = MemoryConsumer::new("spilljoin fallback")
            .with_can_spill(true)
            .register(&plan.pool);
        let probe_rows = probe_file.map_or(0, |f| f.rows()) as usize;
        let mut matched_bytes = consumer.new_empty();
        let tracks_probe = plan.resolved.tracks_matched_probe_rows();
        let tracked_rows = if tracks_probe { probe_rows } else { 0 };
        matched_bytes.try_grow(tracked_rows.div_ceil(8))?;
        let mut matched = BooleanBufferBuilder::new(tracked_rows);
        matched.append_n(tracked_rows, false);
        let level = Level {
            bits: HashBits::new(0),
            depth: level.depth + 1,
            hashed_input: plan.spills_hashes(),
            force_spill_fraction: 0.0,
            key_bounds: false,
            build_rows: None,
        };
        Ok(Self {
            ctx,
            level,
            probe_file,
            facts,
            consumer,
            tracks_probe,
            matched,
            _matched_bytes: matched_bytes,
        })
    }

    /// Probes the whole probe file against one chunk's table, marking the probe rows
    /// it matched, then outputs the chunk's build rows that the join keeps.
    fn probe_chunk(&mut self, built: &BuiltSide, sink: &mut OutputSink) -> Result<()> {
        let ctx = self.ctx;
        let plan = ctx.plan;
        let state = ProbeState::new(
            ctx,
            self.level,
            built,
            self.consumer.new_empty(),
            self.facts,
        )?;
        let mut prober =
            Prober::new(ctx, self.level.bits, built, &state).without_probe_row_output();
        let mut offset = 0usize;
        if let Some(file) = self.probe_file {
            for batch in file_input(file)? {
                if ctx.cancel.load(Ordering::Relaxed) {
                    return Err(JoinError::Cancelled);
                }
                let batch = batch.map_err(|e| ctx.input_error(plan.probe_side(), e))?;
                let (batch, hashes) = level_split(plan, &batch, false)?;
                if self.tracks_probe && offset + batch.num_rows() > self.matched.len() {
                    return Err(more_rows_than_said(file));
                }
                prober.probe(&batch, Some(&hashes), sink)?;
                if self.tracks_probe {
                    self.mark_matched(prober.matched(), &batch, offset, sink)?;
                }
                offset += batch.num_rows();
            }
        }
        emit_build_rows(plan, built, &state, 0, None, sink)
    }

    /// Marks the rows of `batch` (at `offset` in the probe file) that `matched` says
    /// this chunk matched and no chunk before it did; a probe semi join outputs them
    /// now, once.
    fn mark_matched(
        &mut self,
        matched: &[bool],
        batch: &RecordBatch,
        offset: usize,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let plan = self.ctx.plan;
        let newly: Vec<u32> = matched
            .iter()
            .enumerate()
            .filter(|&(r, &m)| m && !self.matched.get_bit(offset + r))
            .map(|(r, _)| r as u32)
            .collect();
        for &r in &newly {
            self.matched.set_bit(offset + r as usize, true);
        }
        if plan.resolved == BuildJoinType::ProbeSemi && !newly.is_empty() {
            let rows = UInt32Array::from(newly);
            sink.push(
                plan.output
                    .gather(rows.len(), Some((batch, &rows)), None, None)?,
            )?;
        }
        Ok(())
    }

    /// Outputs the probe rows decided only now that every chunk has been seen: the
    /// unmatched ones (outer, anti) or all with their mark.
    fn emit_decided_probe_rows(mut self, sink: &mut OutputSink) -> Result<()> {
        let plan = self.ctx.plan;
        let matched = self.matched.finish();
        if !self.tracks_probe || plan.resolved == BuildJoinType::ProbeSemi {
            return Ok(());
        }
        let Some(file) = self.probe_file else {
            return Ok(());
        };
        let mut offset = 0usize;
        for batch in file_input(file)? {
            let batch = batch.map_err(|e| self.ctx.input_error(plan.probe_side(), e))?;
            // Only the rows are needed here, not their hashes.
            let batch = if plan.spills_hashes() {
                detach_hashes(&batch)?.0
            } else {
                batch
            };
            let n = batch.num_rows();
            if offset + n > matched.len() {
                return Err(more_rows_than_said(file));
            }
            let seen = matched.slice(offset, n);
            offset += n;
            sink.push(decided_probe_rows(plan, &batch, seen)?)?;
        }
        Ok(())
    }
}

/// The output of a probe file's `batch` once every chunk has been seen, `seen`
/// holding whether some chunk matched each row: all rows with it as their mark
/// (a probe mark join), or the rows no chunk matched.
fn decided_probe_rows(
    plan: &JoinPlan,
    batch: &RecordBatch,
    seen: BooleanBuffer,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    if plan.resolved == BuildJoinType::ProbeMark {
        let all = UInt32Array::from_iter_values(0..n as u32);
        plan.output.gather(
            n,
            Some((batch, &all)),
            None,
            Some(&BooleanArray::new(seen, None)),
        )
    } else {
        let rows = crate::batches::select_rows(0..n as u32, |r| !seen.value(r));
        plan.output
            .gather(rows.len(), Some((batch, &rows)), None, None)
    }
}

/// The error for a probe spill file that holds more rows than its count said.
fn more_rows_than_said(file: &SpillFile) -> JoinError {
    JoinError::Internal(format!(
        "probe spill file {} holds more rows than it said",
        file.path().display()
    ))
}

/// The build file of a chunked join, read a chunk at a time.
struct BuildChunks<B> {
    batches: B,
    /// The batch that did not fit the last chunk: the first of the next.
    pending: Option<RecordBatch>,
}

impl<B> BuildChunks<B>
where
    B: Iterator<Item = Result<RecordBatch, ArrowError>>,
{
    /// The next chunk of the build file as a built side of one table, as many
    /// batches as `consumer` can reserve room for (at least one); `None` at the
    /// file's end.
    fn next_chunk(
        &mut self,
        ctx: &Ctx<'_>,
        consumer: &MemoryReservation,
    ) -> Result<Option<BuiltSide>> {
        let plan = ctx.plan;
        let mut chunk = consumer.new_empty();
        let mut buffer = PartitionBuffer::default();
        while let Some(batch) = self.pending.take().map(Ok).or_else(|| self.batches.next()) {
            let batch = batch.map_err(|e| ctx.input_error(plan.build_side, e))?;
            let (batch, hashes) = level_split(plan, &batch, true)?;
            // The batch, its hashes and key encoding, and its share of the table.
            let need = batch_bytes(&batch) * 2 + hashes.len() * 24 + 1024;
            if chunk.try_grow(need).is_err() {
                if buffer.rows() == 0 {
                    chunk.try_grow(need)?;
                } else {
                    self.pending = Some(attach_back(plan, &batch, &hashes)?);
                    break;
                }
            }
            buffer.push(batch, hashes.to_vec(), need);
        }
        if buffer.rows() == 0 {
            return Ok(None);
        }
        one_table(plan, buffer, chunk).map(Some)
    }
}

/// A chunk's rows, reserved in `chunk`, as a built side of one in-memory partition.
fn one_table(
    plan: &JoinPlan,
    buffer: PartitionBuffer,
    chunk: MemoryReservation,
) -> Result<BuiltSide> {
    let held = buffer.bytes();
    let chunk_rows = buffer.rows() as u64;
    let reservation = Mutex::new(chunk);
    let part = finish_partition(plan, buffer, held, &reservation, true)?;
    Ok(BuiltSide {
        partitions: vec![Partition::InMemory(part)],
        unmatchable: Unmatchable::default(),
        num_rows: chunk_rows,
        has_null_key: false,
        bounds: Vec::new(),
        _reservation: reservation.into_inner().unwrap_or_else(|p| p.into_inner()),
    })
}
