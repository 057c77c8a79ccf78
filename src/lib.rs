//! spilljoin: an out-of-core equi-join engine for Apache Arrow.
//!
//! It joins two streams of [`RecordBatch`](arrow_array::RecordBatch)es on equal keys,
//! inside a fixed memory budget, and is meant to be as fast as the best in-memory hash
//! joins when the build side fits.
//!
//! ```text
//!  build input ─► keys ─► xxh3 hash ─► radix partitions ─► per-partition hash tables
//!                                                              │ (immutable)
//!  probe input ─► keys ─► xxh3 hash ─► same partitions ─► lookup ─► residual filter
//!                                                                      │
//!                                      output batches ◄─ gather (take) ◄┘
//!  end: unmatched / semi / anti / mark build rows from per-execution visited bits
//!
//!  when a reservation fails: the largest partition goes to an IPC spill file; probe
//!  rows of spilled partitions follow it to disk (unless a bloom filter rules them
//!  out); each spilled pair is joined afterwards at the next level of hash bits
//! ```
//!
//! Every buffer that grows with the input is reserved from a
//! [`MemoryPool`](spilljoin_memory::MemoryPool) first. Modules, one concept each:
//! [`keys`] (key columns, types, equality), [`hash`] (xxh3 per column),
//! [`partition`] (radix bits), [`table`] (chained hash table), `build` (the build
//! phase and the spill trigger), `probe` (the probe phase and routing to spilled
//! partitions), `exec` (levels, spilled pairs, the chunked fallback), `bloom`,
//! `batches` (batch sizes, the spill files' hash column, workers), [`filter`]
//! (residual predicates), `output` (layout and batching), [`join_type`].
//!
//! Start at [`HashJoinBuilder`].
#![warn(missing_docs)]

mod batches;
mod bloom;
mod bounds;
mod build;
mod cache;
mod channel;
mod context;
mod error;
mod exec;
pub mod filter;
pub mod gather;
pub mod hash;
mod join;
pub mod join_type;
pub mod keys;
mod output;
pub mod partition;
mod plan;
mod prepared;
mod probe;
pub mod table;
mod write_out;

pub use bounds::KeyBounds;
pub use cache::{BuildCache, BuildKey};
pub use context::{JoinPhase, MAX_DEPTH};
pub use error::{JoinError, Result, Side};
pub use filter::{FilterPredicate, JoinFilter};
pub use join::{
    partition_bits_for, CancelHandle, HashJoin, HashJoinBuilder, InputStatistics, JoinMetrics,
    JoinStream, MetricsHandle, DEFAULT_BATCH_SIZE_ROWS, DEFAULT_PARTITION_BITS,
    MAX_BATCH_SIZE_ROWS, SMALL_BUILD_ROWS,
};
pub use join_type::{BuildJoinType, JoinType};
pub use keys::NullEquality;
pub use output::MARK_COLUMN;
pub use plan::{HotKeySplit, FORCE_SPILL_DEPTH_ENV, FORCE_SPILL_ENV};
pub use prepared::PreparedBuild;
pub use spilljoin_memory as memory;
pub use spilljoin_spill as spill;
