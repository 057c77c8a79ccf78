//! The figures of an execution: [`JoinMetrics`], read from the counters that the
//! join's threads update ([`crate::context::SharedMetrics`]) by the stream or a
//! [`MetricsHandle`] on another thread.
//!
//! Its own file because it is the join's public report, a struct of its own with a
//! field per figure.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use spilljoin_memory::MemoryPool;

use crate::context::{JoinPhase, SharedMetrics};

/// The figures in `m`, with the pool's current reservation.
pub(crate) fn snapshot(m: &SharedMetrics, reserved_bytes: u64) -> JoinMetrics {
    {
        JoinMetrics {
            phase: m.phase(),
            reserved_bytes,
            build_rows: m.build_rows.load(Ordering::Relaxed),
            probe_rows: m.probe_rows.load(Ordering::Relaxed),
            output_rows: m.output_rows.load(Ordering::Relaxed),
            build_time: Duration::from_nanos(m.build_nanos.load(Ordering::Relaxed)),
            probe_time: Duration::from_nanos(m.probe_nanos.load(Ordering::Relaxed)),
            spilled_time: Duration::from_nanos(m.spilled_nanos.load(Ordering::Relaxed)),
            peak_reserved_bytes: m.peak_reserved_bytes.load(Ordering::Relaxed),
            build_rows_spilled: m.build_rows_spilled.load(Ordering::Relaxed),
            build_bytes_spilled: m.build_bytes_spilled.load(Ordering::Relaxed),
            probe_rows_spilled: m.probe_rows_spilled.load(Ordering::Relaxed),
            probe_bytes_spilled: m.probe_bytes_spilled.load(Ordering::Relaxed),
            build_batches_spilled: m.build_batches_spilled.load(Ordering::Relaxed),
            probe_batches_spilled: m.probe_batches_spilled.load(Ordering::Relaxed),
            probe_rows_skipped: m.probe_rows_skipped.load(Ordering::Relaxed),
            spill_files: m.spill_files.load(Ordering::Relaxed),
            build_spill_files: m.build_spill_files.load(Ordering::Relaxed),
            probe_spill_files: m.probe_spill_files.load(Ordering::Relaxed),
            partitions_spilled: m.partitions_spilled.load(Ordering::Relaxed),
            max_depth: m.max_depth.load(Ordering::Relaxed),
            fallbacks: m.fallbacks.load(Ordering::Relaxed),
            hot_key_splits: m.hot_key_splits.load(Ordering::Relaxed),
            swapped_pairs: m.swapped_pairs.load(Ordering::Relaxed),
        }
    }
}

/// Reads a running join's figures from any thread; see
/// [`JoinStream::metrics_handle`](super::JoinStream::metrics_handle).
#[derive(Debug, Clone)]
pub struct MetricsHandle {
    pub(super) metrics: Arc<SharedMetrics>,
    pub(super) pool: Arc<dyn MemoryPool>,
}

impl MetricsHandle {
    /// The figures so far (final once the join has ended). Cheap: it reads
    /// counters, so a progress display may call it often.
    pub fn metrics(&self) -> JoinMetrics {
        snapshot(&self.metrics, self.pool.reserved() as u64)
    }
}

/// Figures of one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JoinMetrics {
    /// What the join is doing now.
    pub phase: JoinPhase,
    /// Bytes the join's pool has reserved now (the pool's count, shared with anything
    /// else that uses the pool).
    pub reserved_bytes: u64,
    /// Build input rows (so far, while building).
    pub build_rows: u64,
    /// Probe input rows.
    pub probe_rows: u64,
    /// Output rows.
    pub output_rows: u64,
    /// Time spent reading the build input and building tables.
    pub build_time: Duration,
    /// Time spent probing.
    pub probe_time: Duration,
    /// Time spent joining spilled partitions after the probe input ended.
    pub spilled_time: Duration,
    /// The most bytes the pool had reserved at once, as seen by the join.
    pub peak_reserved_bytes: u64,
    /// Build rows written to spill files (at every level).
    pub build_rows_spilled: u64,
    /// Bytes of build spill files written (at every level).
    pub build_bytes_spilled: u64,
    /// Probe rows written to spill files (at every level). Where only the probe's key
    /// set counts (the build side's semi, anti and mark joins and `NOT IN`, without a
    /// filter), a row repeating the key of the row before it is not written, and
    /// counted neither here nor in [`probe_rows_skipped`](Self::probe_rows_skipped).
    pub probe_rows_spilled: u64,
    /// Bytes of probe spill files written (at every level).
    pub probe_bytes_spilled: u64,
    /// Batches (IPC messages, one write each) of build spill files written (at every
    /// level): rows per batch tell how well writes were buffered.
    pub build_batches_spilled: u64,
    /// Batches of probe spill files written (at every level).
    pub probe_batches_spilled: u64,
    /// Probe rows of spilled partitions that the bloom filters showed could not match,
    /// so they were never written.
    pub probe_rows_skipped: u64,
    /// Spill files created on disk. The spilled partitions of one side of a level
    /// share up to one file per thread, so this is not a count of partitions
    /// (see `partitions_spilled`).
    pub spill_files: u64,
    /// Build-side spill files created (at every level; a swapped pair's build side
    /// is the probe input's).
    pub build_spill_files: u64,
    /// Probe-side spill files created (at every level).
    pub probe_spill_files: u64,
    /// Build partitions spilled (at every level).
    pub partitions_spilled: u64,
    /// The deepest recursion level reached (0: nothing was repartitioned).
    pub max_depth: u64,
    /// Spilled pairs their hash bits could not split (one key dominated, or no bits
    /// were left), joined by the fallback.
    pub fallbacks: u64,
    /// Fallbacks that first split off the rows of their dominant key, so that only
    /// that key's probe rows are read once per build chunk.
    pub hot_key_splits: u64,
    /// Spilled pairs joined with the probe side building, because it was smaller.
    pub swapped_pairs: u64,
}
