//! The public entry point: define a join with [`HashJoinBuilder`], run it with
//! [`HashJoin::execute`], read its output from the [`JoinStream`].
//!
//! Execution runs on its own threads; the stream hands their output batches over a
//! bounded channel, so a slow consumer slows the join rather than growing a queue.
//! Dropping the stream stops the join, waits for its threads, and releases every
//! reservation.
//!
//! ```text
//!  HashJoinBuilder ──build()──► HashJoin ──execute(left, right)──► JoinStream
//!   (settings)      validate,    (plan,      coordinating thread:   (batches,
//!                   build side,   mirror)    exec::run, workers     cancel,
//!                   fan-out                                          metrics)
//! ```
//!
//! The files, from definition to output:
//!
//! - `builder`: [`HashJoinBuilder`] and its settings ([`InputStatistics`], the batch
//!   size limits), and the planning that `build` does: validation, the choice of
//!   build side, the plan and its mirror.
//! - `partition_bits`: [`partition_bits_for`], the first level's fan-out from the
//!   build's expected size and the memory limit ([`DEFAULT_PARTITION_BITS`]).
//! - `hash_join`: [`HashJoin`], a validated join: what it was planned to do, and
//!   `execute`.
//! - `stream`: starting the join's coordinating thread (`HashJoin::spawn`), the
//!   [`JoinStream`] of its output, and the [`CancelHandle`].
//! - `metrics`: [`JoinMetrics`], the figures of an execution, and the
//!   [`MetricsHandle`] that reads them from another thread.

mod builder;
mod hash_join;
mod metrics;
mod partition_bits;
mod stream;
#[cfg(test)]
mod tests;

pub use builder::{HashJoinBuilder, InputStatistics, DEFAULT_BATCH_SIZE_ROWS, MAX_BATCH_SIZE_ROWS};
pub use hash_join::HashJoin;
pub(crate) use metrics::snapshot;
pub use metrics::{JoinMetrics, MetricsHandle};
pub use partition_bits::{partition_bits_for, DEFAULT_PARTITION_BITS, SMALL_BUILD_ROWS};
pub use stream::{CancelHandle, JoinStream};
