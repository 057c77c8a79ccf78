//! The build phase: the build input, radix-partitioned into hash tables, spilling the
//! largest partitions when memory runs out.
//!
//! ```text
//!  build batches ─► keys ─► hash ─► partition (high bits) ─► per-partition buffers:
//!   (N threads pull from the input streams)                   rows gathered compactly
//!                                                              (`GatherBuffer`, every
//!                                                              type but nested ones,
//!                                                              which keep fragments),
//!                                                              with their hashes (not
//!                                                              for word keys)
//!                                                              │
//!        a reservation fails? ─► flush the buffered rows of an already spilled
//!                                partition, else spill the largest in-memory one
//!                                (IPC file, hashes kept as a column unless
//!                                the key is one word; bloom filter)
//!  end of input ─► force-spill (tests), reserve probe headroom, then give every
//!                  in-memory partition its table (spilling more if tables don't fit)
//!                  ─► BuiltSide (immutable): in-memory partitions + spilled files
//! ```
//!
//! **The spill trigger** is [`BuildCollector::reserve`]: a failed reservation is the
//! only reason to spill, and the victim is the partition holding the most buffered
//! bytes. Spilled partitions keep receiving rows, buffered a batch at a time; a full
//! buffer is taken out under the collector's lock and written after it is released
//! (each spilled partition's writer has a lock of its own), so that under a small
//! limit, where most rows are written, the workers do not queue behind each other's
//! writes.
//!
//! Rows whose key can never match (a null key under SQL equality) are not hashed into
//! any partition: joins that output unmatched build rows keep them aside (spilled like
//! a partition if memory runs out), the others drop them.
//!
//! # Files
//!
//! - [`built`]: what the build hands to the probe — [`BuiltSide`], its [`Partition`]s
//!   (in memory with a table, or spilled with a bloom filter) and the
//!   [`Unmatchable`] rows.
//! - [`collector`]: the state the build workers share — [`BuildCollector`], its
//!   locked [`CollectorState`](collector::CollectorState) and each partition's
//!   [`PartitionBuffer`], with their lock order.
//! - [`collect`]: collecting rows into partitions — a worker's loop over its input,
//!   cutting batches into pieces, hashing and grouping them, and adding each
//!   partition's rows to its buffer (gathered in place, or as fragments).
//! - [`spill`]: the spill trigger and the victim choice — `reserve`, what to free
//!   when it fails, starting a partition's spill (its file and bloom filter), and
//!   writing buffered rows to a file.
//! - [`bloom_sizing`]: how large the spilled partitions' bloom filters are when the
//!   level's rows are known beforehand, and the memory set aside for them.
//! - [`write_outside_lock`]: the protocol by which a spilled partition's buffered rows
//!   are taken out under the collector's lock and written after it is released
//!   (`Unwritten`, `WriteEnded`), and how a worker short of memory waits for such a
//!   write: the build's side of [`crate::write_out`], which the probe shares.
//! - [`finish`]: the end of the input — forced spills, the probe's headroom, which
//!   partitions keep a table in memory, and finishing every partition (in memory or
//!   closed on disk).
//! - [`finish_partition`](mod@finish_partition): one in-memory partition's rows,
//!   keys and table (also used by the fallback's chunks).
//! - [`shared_index`]: one key index shared by all partitions, when their keys are
//!   dense words.

mod bloom_sizing;
mod built;
mod collect;
mod collector;
mod finish;
mod finish_partition;
mod shared_index;
mod spill;
mod write_outside_lock;

use std::sync::atomic::{AtomicBool, AtomicU64};

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;

use crate::batches::{run_workers, InputStreams};
use crate::context::{Ctx, Level};
use crate::error::Result;

pub(crate) use self::built::{BuiltPartition, BuiltSide, Partition, Unmatchable};
// Named by no other module today, but one of the build's outputs like those above.
#[allow(unused_imports)]
pub(crate) use self::built::SpilledPartition;
use self::collector::BuildCollector;
pub(crate) use self::collector::PartitionBuffer;
pub(crate) use self::finish_partition::finish_partition;

/// Reads the whole build input of one level into partitions, spilling as needed, and
/// builds the tables of the partitions that stay in memory.
pub(crate) fn build_side<I>(ctx: &Ctx<'_>, level: Level, input: Vec<I>) -> Result<BuiltSide>
where
    I: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let collector = BuildCollector::new(ctx, level);
    let input = InputStreams::new(input);
    let num_rows = AtomicU64::new(0);
    let has_null_key = AtomicBool::new(false);
    run_workers(ctx.plan.threads, ctx.cancel, || {
        collector.collect(&input, &num_rows, &has_null_key)
    })?;
    collector.finish(num_rows.into_inner(), has_null_key.into_inner())
}
