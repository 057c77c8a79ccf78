//! [`HashJoin`], a validated join: what it was planned to do, and starting it over
//! its inputs.
//!
//! Its own file because it is the join a user holds between definition and
//! execution; how an execution runs and hands its output over is [`super::stream`].

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use spilljoin_spill::SpillManager;

use super::JoinStream;
use crate::error::{Result, Side};
use crate::exec::run;
use crate::join_type::JoinType;
use crate::plan::JoinPlan;

/// A validated join, ready to execute any number of times.
#[derive(Debug, Clone)]
pub struct HashJoin {
    pub(crate) plan: Arc<JoinPlan>,
    pub(super) build_side_reason: Arc<str>,
}

impl HashJoin {
    /// The schema of the output batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.plan.output.schema)
    }

    /// The join type.
    pub fn join_type(&self) -> JoinType {
        self.plan.join_type
    }

    /// The type of each key pair after normalization (dictionaries decoded).
    pub fn key_types(&self) -> &[arrow_schema::DataType] {
        &self.plan.keys.types
    }

    /// How deep spilled pairs may be repartitioned
    /// ([`HashJoinBuilder::with_max_depth`](super::HashJoinBuilder::with_max_depth)).
    pub fn max_depth(&self) -> u32 {
        self.plan.max_depth
    }

    /// Radix bits of the first partitioning level.
    pub fn partition_bits(&self) -> u32 {
        self.plan.bits.bits()
    }

    /// Which input builds.
    pub fn build_side(&self) -> Side {
        self.plan.build_side
    }

    /// Whether probe rows that can match no build row may be dropped from the probe
    /// input (by a scan that knows the build's key bounds or membership, see
    /// [`crate::PreparedBuild`]) without changing the output.
    pub fn may_skip_unmatchable_probe_rows(&self) -> bool {
        self.plan.resolved.may_skip_unmatchable_probe_rows()
    }

    /// The engine's join type: the user's, in build and probe terms.
    pub fn build_join_type(&self) -> crate::BuildJoinType {
        self.plan.resolved
    }

    /// Why that input builds, in a sentence (for `--explain`).
    pub fn build_side_reason(&self) -> &str {
        &self.build_side_reason
    }

    /// The memory limit of the join's pool in bytes (`usize::MAX` when unbounded).
    pub fn memory_limit(&self) -> usize {
        self.plan.pool.limit().bytes()
    }

    /// The spill manager given to the builder, if any.
    pub fn spill_manager(&self) -> Option<&SpillManager> {
        self.plan.spill.as_ref()
    }

    /// Starts the join over `left` and `right` (any iterators of batches, such as
    /// arrow's `RecordBatchReader`s) and returns its output stream. The build input
    /// is read whole first; the probe input is streamed.
    ///
    /// # Errors
    /// [`JoinError::Io`](crate::JoinError::Io) if the join's thread cannot be started. Everything else,
    /// including reading the inputs, is reported through the stream.
    pub fn execute<L, R>(&self, left: L, right: R) -> Result<JoinStream>
    where
        L: IntoIterator<Item = Result<RecordBatch, ArrowError>>,
        L::IntoIter: Send + 'static,
        R: IntoIterator<Item = Result<RecordBatch, ArrowError>>,
        R::IntoIter: Send + 'static,
    {
        self.execute_partitioned(vec![left.into_iter()], vec![right.into_iter()])
    }

    /// Like [`execute`](Self::execute), with each input split into several streams
    /// (for example, one per group of Parquet row groups). Worker threads read
    /// different streams at the same time, so decoding the inputs runs in parallel;
    /// a stream is read by one worker at a time, start to end. Any stream may be
    /// empty; the output does not depend on how the inputs are split.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn execute_partitioned<L, R>(&self, left: Vec<L>, right: Vec<R>) -> Result<JoinStream>
    where
        L: Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
        R: Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
    {
        self.spawn(false, move |ctx| match ctx.plan.build_side {
            Side::Right => run(ctx, right, left),
            Side::Left => run(ctx, left, right),
        })
    }
}
