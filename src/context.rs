//! What every part of one execution shares: the context ([`Ctx`]: plan, spill
//! manager, output channel, cancel flag, metrics), one level of the hybrid join
//! ([`Level`]) and its spill files ([`LevelFiles`]), the probe input's facts that
//! every level needs ([`Facts`]), and the execution's counters ([`SharedMetrics`],
//! [`JoinPhase`]).
//!
//! It sits below build, probe and exec, which all take a `&Ctx`: imports among the
//! engine's modules go one way, from the phases down to this and to the plan.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{ArrowError, SchemaRef};
use spilljoin_spill::{SpillError, SpillGroup, SpillManager, SpillWriter};

use crate::batches::detach_hashes;
use crate::error::{JoinError, Result, Side};
use crate::output::OutputSink;
use crate::partition::HashBits;
use crate::plan::{ForceSpill, JoinPlan};

/// The deepest recursion level (the default, and the most
/// [`HashJoinBuilder::with_max_depth`](crate::HashJoinBuilder::with_max_depth)
/// allows); a partition still too big below it goes to the fallback. Four levels of
/// 4 bits split a build 2^20 ways (16 at level 0).
pub const MAX_DEPTH: u32 = 4;

/// Counters of one execution, shared by its threads.
#[derive(Debug, Default)]
pub(crate) struct SharedMetrics {
    pub build_rows: AtomicU64,
    pub probe_rows: AtomicU64,
    pub output_rows: AtomicU64,
    pub build_nanos: AtomicU64,
    pub probe_nanos: AtomicU64,
    pub spilled_nanos: AtomicU64,
    pub peak_reserved_bytes: AtomicU64,
    pub build_rows_spilled: AtomicU64,
    pub build_bytes_spilled: AtomicU64,
    pub probe_rows_spilled: AtomicU64,
    pub probe_bytes_spilled: AtomicU64,
    pub build_batches_spilled: AtomicU64,
    pub probe_batches_spilled: AtomicU64,
    pub probe_rows_skipped: AtomicU64,
    pub spill_files: AtomicU64,
    pub build_spill_files: AtomicU64,
    pub probe_spill_files: AtomicU64,
    pub partitions_spilled: AtomicU64,
    pub max_depth: AtomicU64,
    pub fallbacks: AtomicU64,
    pub hot_key_splits: AtomicU64,
    pub swapped_pairs: AtomicU64,
    pub phase: std::sync::atomic::AtomicU8,
}

impl SharedMetrics {
    /// The counters that writes to the build's (`build`) or the probe's spill files
    /// add to.
    pub fn spill_counters(&self, build: bool) -> crate::batches::SpillCounters<'_> {
        if build {
            crate::batches::SpillCounters {
                rows: &self.build_rows_spilled,
                bytes: &self.build_bytes_spilled,
                batches: &self.build_batches_spilled,
            }
        } else {
            crate::batches::SpillCounters {
                rows: &self.probe_rows_spilled,
                bytes: &self.probe_bytes_spilled,
                batches: &self.probe_batches_spilled,
            }
        }
    }

    pub fn set_phase(&self, phase: JoinPhase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    pub fn phase(&self) -> JoinPhase {
        match self.phase.load(Ordering::Relaxed) {
            0 => JoinPhase::Build,
            1 => JoinPhase::Probe,
            2 => JoinPhase::SpilledPairs,
            _ => JoinPhase::Done,
        }
    }
}

/// What a running join is doing (see [`crate::JoinMetrics::phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum JoinPhase {
    /// Reading the build input and building tables.
    #[default]
    Build = 0,
    /// Streaming the probe input (and, at its end, emitting build rows).
    Probe = 1,
    /// Joining the partitions that were spilled, after the probe input ended.
    SpilledPairs = 2,
    /// Finished (or stopped).
    Done = 3,
}

impl std::fmt::Display for JoinPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JoinPhase::Build => "build",
            JoinPhase::Probe => "probe",
            JoinPhase::SpilledPairs => "spilled partitions",
            JoinPhase::Done => "done",
        })
    }
}

/// The spill files of one side of a level: segments of a few shared files
/// ([`SpillGroup`]), as many as threads (partition p writes to file p mod
/// threads), instead of a file per partition. A level under
/// a small limit spills every partition on both sides, and creating (and
/// deleting) a file costs more than writing it where the file system scans past
/// recently deleted inodes (see [`SpillGroup`]).
#[derive(Debug)]
pub(crate) struct LevelFiles {
    group: SpillGroup,
    build: bool,
    /// The group's files counted in the join's metrics so far.
    counted: AtomicUsize,
}

impl LevelFiles {
    /// The files of the build side (`build`) or the probe side of a level at `depth`.
    pub fn new(ctx: &Ctx<'_>, depth: u32, build: bool) -> Self {
        let side = if build { "build" } else { "probe" };
        Self {
            group: ctx
                .spill
                .create_group(&format!("{side}-d{depth}"), ctx.plan.threads.max(1)),
            build,
            counted: AtomicUsize::new(0),
        }
    }

    /// A writer of partition `p`'s spill file; a file it creates is counted in the
    /// join's metrics.
    pub fn create_writer(&self, ctx: &Ctx<'_>, schema: SchemaRef, p: usize) -> Result<SpillWriter> {
        let writer = self.group.create_writer(schema, p)?;
        let now = self.group.files_created();
        let before = self.counted.fetch_max(now, Ordering::Relaxed);
        if now > before {
            let new = (now - before) as u64;
            let metrics = ctx.metrics;
            metrics.spill_files.fetch_add(new, Ordering::Relaxed);
            let side = if self.build {
                &metrics.build_spill_files
            } else {
                &metrics.probe_spill_files
            };
            side.fetch_add(new, Ordering::Relaxed);
        }
        Ok(writer)
    }
}

/// What every part of one execution shares.
pub(crate) struct Ctx<'a> {
    pub plan: &'a JoinPlan,
    pub spill: SpillManager,
    pub sender: &'a crate::channel::OutputChannel,
    pub cancel: &'a AtomicBool,
    pub metrics: &'a SharedMetrics,
    /// Whether output batches must own all their buffers (a prepared build's are
    /// shared and outlive no output; see [`crate::PreparedBuild`]).
    pub owned_output: bool,
    /// Forced spilling, by level (tests).
    pub force: ForceSpill,
}

impl Ctx<'_> {
    /// An input's error: a spill file's error when the input was one.
    pub fn input_error(&self, side: Side, e: ArrowError) -> JoinError {
        match e {
            ArrowError::ExternalError(inner) => match inner.downcast::<SpillError>() {
                Ok(spill) => JoinError::Spill(*spill),
                Err(other) => JoinError::Input {
                    side,
                    source: ArrowError::ExternalError(other),
                },
            },
            source => JoinError::Input { side, source },
        }
    }

    /// A sink for output batches of this execution.
    pub fn sink(&self) -> OutputSink {
        OutputSink::new(
            self.plan.output.schema.clone(),
            self.plan.batch_size,
            self.plan.piece_bytes(),
            self.sender.clone(),
        )
        .with_owned_buffers(self.owned_output)
        .with_pairs(&self.plan.output)
    }

    /// Sends what a sink still holds and counts its rows.
    pub fn finish_sink(&self, sink: &mut OutputSink) -> Result<()> {
        sink.finish()?;
        self.metrics
            .output_rows
            .fetch_add(sink.rows(), Ordering::Relaxed);
        Ok(())
    }

    /// Records the pool's reservation if it is the highest so far.
    pub fn note_peak(&self) {
        self.metrics
            .peak_reserved_bytes
            .fetch_max(self.plan.pool.reserved() as u64, Ordering::Relaxed);
    }
}

/// One level of the hybrid join.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Level {
    /// The hash bits that pick partitions at this level.
    pub bits: HashBits,
    /// 0 for the user's inputs.
    pub depth: u32,
    /// Whether input batches carry their hashes (read back from spill files).
    pub hashed_input: bool,
    /// Fraction of partitions spilled whatever the memory (tests).
    pub force_spill_fraction: f64,
    /// Whether the build keeps its key bounds (prepared builds).
    pub key_bounds: bool,
    /// The build's rows, when known before it is read (a spilled partition's file):
    /// a level of one partition allocates its buffers once, for all of them.
    pub build_rows: Option<u64>,
}

impl Level {
    /// Checks an input batch and splits off its stored hashes, if it has them.
    pub fn split_input(
        &self,
        plan: &JoinPlan,
        batch: &RecordBatch,
        build: bool,
    ) -> Result<(RecordBatch, Option<ScalarBuffer<u64>>)> {
        let (batch, hashes) = if self.hashed_input {
            let (batch, hashes) = detach_hashes(batch)?;
            (batch, Some(hashes))
        } else {
            (batch.clone(), None)
        };
        plan.check_batch(&batch, build)?;
        // From here on every batch has exactly the declared schema (an input's field
        // metadata or names may differ; spill files insist on one schema).
        let schema = if build {
            &plan.build_schema
        } else {
            &plan.probe_schema
        };
        let batch = if batch.schema_ref() == schema {
            batch
        } else {
            RecordBatch::try_new_with_options(
                Arc::clone(schema),
                batch.columns().to_vec(),
                &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
            )
            .map_err(|source| JoinError::SchemaMismatch {
                side: if build {
                    plan.build_side
                } else {
                    plan.probe_side()
                },
                expected: schema.to_string(),
                found: format!("{} ({source})", batch.schema()),
            })?
        };
        Ok((batch, hashes))
    }
}

/// Facts of the level-0 probe input that `NOT IN` with the subquery on the probe
/// side needs in every level.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Facts {
    pub probe_non_empty: bool,
    pub probe_has_null: bool,
}
