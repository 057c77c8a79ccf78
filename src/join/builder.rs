//! Defining a join: [`HashJoinBuilder`] and its settings, and the planning that
//! [`build`](HashJoinBuilder::build) does — validating the definition, choosing the
//! build side, sizing the first level's partitions ([`super::partition_bits`]) and
//! resolving the plan (and its mirror, for spilled pairs that swap roles).
//!
//! Its own file because it is the whole of the user's definition of a join, and
//! the one place user-facing left/right become build/probe.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use spilljoin_memory::{MemoryPool, UnboundedMemoryPool};
use spilljoin_spill::SpillManager;

use super::partition_bits::{partition_bits_for, SMALL_BUILD_ROWS};
use super::HashJoin;
use crate::context::MAX_DEPTH;
use crate::error::{JoinError, Result, Side};
use crate::filter::{JoinFilter, ResolvedFilter};
use crate::join_type::JoinType;
use crate::keys::{KeySpec, NullEquality};
use crate::output::OutputLayout;
use crate::partition::{HashBits, MAX_PARTITION_BITS};
use crate::plan::{ForceSpill, HotKeySplit, JoinPlan};

/// The default output batch size in rows.
pub const DEFAULT_BATCH_SIZE_ROWS: usize = 8192;

/// The largest batch size accepted (2^20 rows): per-batch buffers are sized by it.
pub const MAX_BATCH_SIZE_ROWS: usize = 1 << 20;

/// Defines a join. Every setting has a default except the inputs' schemas and keys.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use arrow_array::{Int64Array, RecordBatch, StringArray};
/// use arrow_schema::{DataType, Field, Schema};
/// use spilljoin::{HashJoinBuilder, JoinType};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let orders = Arc::new(Schema::new(vec![
///     Field::new("o_id", DataType::Int64, false),
///     Field::new("o_cust", DataType::Int64, false),
/// ]));
/// let customers = Arc::new(Schema::new(vec![
///     Field::new("c_id", DataType::Int64, false),
///     Field::new("c_name", DataType::Utf8, false),
/// ]));
/// let left = RecordBatch::try_new(orders.clone(), vec![
///     Arc::new(Int64Array::from(vec![1, 2, 3])),
///     Arc::new(Int64Array::from(vec![10, 20, 10])),
/// ])?;
/// let right = RecordBatch::try_new(customers.clone(), vec![
///     Arc::new(Int64Array::from(vec![10, 30])),
///     Arc::new(StringArray::from(vec!["ann", "bob"])),
/// ])?;
/// let join = HashJoinBuilder::new(orders, customers, [("o_cust", "c_id")])
///     .with_join_type(JoinType::Inner)
///     .build()?;
/// let output = join.execute(vec![Ok(left)], vec![Ok(right)])?;
/// let rows: usize = output.map(|b| b.map(|b| b.num_rows())).sum::<Result<_, _>>()?;
/// assert_eq!(rows, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HashJoinBuilder {
    left: SchemaRef,
    right: SchemaRef,
    on: Vec<(String, String)>,
    join_type: JoinType,
    filter: Option<JoinFilter>,
    null_equality: NullEquality,
    pool: Option<Arc<dyn MemoryPool>>,
    spill: Option<SpillManager>,
    batch_size_rows: usize,
    threads: usize,
    projection: Option<Vec<usize>>,
    partition_bits: Option<u32>,
    build_size_hint_bytes: Option<u64>,
    swap_spilled_pairs: bool,
    force_spill_fraction: Option<f64>,
    force_spill_depth: Option<u32>,
    statistics: (InputStatistics, InputStatistics),
    swap_sides: bool,
    build_side: Option<Side>,
    hot_key_split: HotKeySplit,
    max_depth: u32,
}

/// What is known about an input's size before it is read: bytes of the columns the
/// join reads (decoded, as Arrow), and rows. Either may be unknown.
///
/// The planner builds on the smaller input: it compares bytes when both sides have
/// them, else rows when both have those; otherwise it does not swap (the right input
/// builds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputStatistics {
    /// Bytes of the columns the join reads, as Arrow arrays, if known.
    pub bytes: Option<u64>,
    /// Rows, if known.
    pub rows: Option<u64>,
}

impl InputStatistics {
    /// Nothing known.
    pub fn unknown() -> Self {
        Self::default()
    }

    /// Known bytes and rows.
    pub fn new(bytes: Option<u64>, rows: Option<u64>) -> Self {
        Self { bytes, rows }
    }
}

impl HashJoinBuilder {
    /// A join of `left` and `right` on pairs of (left column, right column) names.
    /// Defaults: inner, no filter, nulls equal nothing, an unbounded pool, batches of
    /// [`DEFAULT_BATCH_SIZE_ROWS`], as many threads as cores, all output columns.
    pub fn new<L: Into<String>, R: Into<String>>(
        left: SchemaRef,
        right: SchemaRef,
        on: impl IntoIterator<Item = (L, R)>,
    ) -> Self {
        Self {
            left,
            right,
            on: on.into_iter().map(|(l, r)| (l.into(), r.into())).collect(),
            join_type: JoinType::Inner,
            filter: None,
            null_equality: NullEquality::default(),
            pool: None,
            spill: None,
            batch_size_rows: DEFAULT_BATCH_SIZE_ROWS,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            projection: None,
            partition_bits: None,
            build_size_hint_bytes: None,
            swap_spilled_pairs: true,
            force_spill_fraction: None,
            force_spill_depth: None,
            statistics: Default::default(),
            swap_sides: true,
            build_side: None,
            hot_key_split: HotKeySplit::Auto,
            max_depth: MAX_DEPTH,
        }
    }

    /// The join type.
    pub fn with_join_type(mut self, join_type: JoinType) -> Self {
        self.join_type = join_type;
        self
    }

    /// A residual filter, applied to candidate pairs after the key lookup.
    pub fn with_filter(mut self, filter: JoinFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// How null keys compare.
    pub fn with_null_equality(mut self, null_equality: NullEquality) -> Self {
        self.null_equality = null_equality;
        self
    }

    /// The memory pool every buffer of the join is reserved from.
    pub fn with_memory_pool(mut self, pool: Arc<dyn MemoryPool>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Where the join spills what does not fit (default: a private directory under
    /// the system temp dir, made when the join starts).
    pub fn with_spill_manager(mut self, spill: SpillManager) -> Self {
        self.spill = Some(spill);
        self
    }

    /// The most rows an output batch holds, between 1 and [`MAX_BATCH_SIZE_ROWS`].
    /// Input batches larger than this are processed in slices of this size.
    pub fn with_batch_size(mut self, rows: usize) -> Self {
        self.batch_size_rows = rows.clamp(1, MAX_BATCH_SIZE_ROWS);
        self
    }

    /// Worker threads for the build and the probe (at least 1). The output multiset
    /// does not depend on it.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Picks and orders output columns, by index into the full output (left columns,
    /// right columns, mark, as the join type keeps them).
    pub fn with_projection(mut self, columns: Vec<usize>) -> Self {
        self.projection = Some(columns);
        self
    }

    /// Radix bits of the first partitioning level (0 to 8), overriding the choice
    /// described at [`partition_bits_for`]; the output does not depend on it.
    pub fn with_partition_bits(mut self, bits: u32) -> Self {
        self.partition_bits = Some(bits);
        self
    }

    /// How deep spilled pairs may be repartitioned (default and most:
    /// [`MAX_DEPTH`], which the hash bits bound). A spilled pair
    /// still too big at this depth is joined by the chunked fallback; 0 sends every
    /// spilled pair of level 0 there. Fewer levels write each spilled byte fewer
    /// times but read the probe file once per chunk of the build file; the output
    /// does not depend on it. More than `MAX_DEPTH` is an
    /// [`InvalidJoin`](JoinError::InvalidJoin) error from [`build`](Self::build).
    pub fn with_max_depth(mut self, depth: u32) -> Self {
        self.max_depth = depth;
        self
    }

    /// The build input's expected size in memory, in bytes (for example from Parquet
    /// metadata), used to choose the partition fan-out; see [`partition_bits_for`].
    pub fn with_build_size_hint(mut self, bytes: u64) -> Self {
        self.build_size_hint_bytes = Some(bytes);
        self
    }

    /// Whether a spilled (build, probe) pair whose probe side turns out smaller is
    /// joined with the probe side building (default: yes). Turning it off only costs
    /// time; the output is the same.
    pub fn with_swap_spilled_pairs(mut self, swap: bool) -> Self {
        self.swap_spilled_pairs = swap;
        self
    }

    /// Whether a spilled pair with a dominant key splits that key off before the
    /// chunked fallback (default [`HotKeySplit::Auto`]). The output does not depend on
    /// it.
    pub fn with_hot_key_split(mut self, mode: HotKeySplit) -> Self {
        self.hot_key_split = mode;
        self
    }

    /// Spills this fraction (0 to 1) of the build partitions whatever the memory, so
    /// that the spilling code runs on small inputs (tests). Without it, the
    /// `SPILLJOIN_FORCE_SPILL` environment variable decides (`all` or a fraction).
    pub fn with_force_spill(mut self, fraction: f64) -> Self {
        self.force_spill_fraction = Some(fraction.clamp(0.0, 1.0));
        self
    }

    /// Applies [`with_force_spill`](Self::with_force_spill)'s fraction also to the
    /// levels that join spilled pairs, down to this depth (0: level 0 only; at most
    /// [`MAX_DEPTH`] counts). Forced with the fraction 1 at depth 1
    /// and more, every spilled pair is repartitioned instead of joined in memory,
    /// and a pair whose next level has a single partition ends in the chunked
    /// fallback: the recursion and fallback paths then run on small inputs too
    /// (tests). Without it, the `SPILLJOIN_FORCE_SPILL_DEPTH` environment variable
    /// decides, and 0 without that.
    pub fn with_force_spill_depth(mut self, depth: u32) -> Self {
        self.force_spill_depth = Some(depth);
        self
    }

    /// What is known of each input's size, for choosing the build side (the smaller
    /// input builds; see [`InputStatistics`]). Without statistics the right input
    /// builds. The build side's bytes also size the partition fan-out, unless
    /// [`with_build_size_hint`](Self::with_build_size_hint) says otherwise.
    pub fn with_statistics(mut self, left: InputStatistics, right: InputStatistics) -> Self {
        self.statistics = (left, right);
        self
    }

    /// Whether the planner may build on the left input when statistics show it is the
    /// smaller (default: yes). With `false` the right input always builds. Either way
    /// the output (columns, their order, the rows) is the same; only speed and memory
    /// differ.
    pub fn with_side_swap(mut self, swap: bool) -> Self {
        self.swap_sides = swap;
        self
    }

    /// Makes `side` the build side whatever the statistics say: for a planner above
    /// that has already chosen (DataFusion's `JoinSelection` builds on the left). The
    /// output is the same either way.
    pub fn with_build_side(mut self, side: Side) -> Self {
        self.build_side = Some(side);
        self
    }

    /// The side that builds, and why.
    fn choose_build_side(&self) -> (Side, String) {
        if let Some(side) = self.build_side {
            let name = match side {
                Side::Left => "left",
                Side::Right => "right",
            };
            return (
                side,
                format!("the {name} input builds: the caller chose it"),
            );
        }
        if !self.swap_sides {
            return (
                Side::Right,
                "the right input builds: side swapping is off".into(),
            );
        }
        let (left, right) = self.statistics;
        let (l, r, unit) = match (left.bytes, right.bytes, left.rows, right.rows) {
            (Some(l), Some(r), _, _) => (l, r, "bytes"),
            (_, _, Some(l), Some(r)) => (l, r, "rows"),
            _ => {
                return (
                    Side::Right,
                    "the right input builds: the inputs' sizes are not both known".into(),
                )
            }
        };
        if l < r {
            (
                Side::Left,
                format!("the left input builds: it is smaller ({l} vs {r} {unit})"),
            )
        } else {
            (
                Side::Right,
                format!("the right input builds: it is not larger ({r} vs {l} {unit})"),
            )
        }
    }

    /// Validates the definition.
    ///
    /// # Errors
    /// [`JoinError::NoSuchColumn`], [`JoinError::KeyTypeMismatch`],
    /// [`JoinError::UnsupportedKeyType`], or [`JoinError::InvalidJoin`] (no keys, a
    /// `NOT IN` with more than one key or with nulls-equal-nulls, a filter column out of
    /// range, too many partition bits).
    pub fn build(self) -> Result<HashJoin> {
        let (build, build_side_reason) = self.choose_build_side();
        self.check_settings()?;
        let pool = self
            .pool
            .clone()
            .unwrap_or_else(|| Arc::new(UnboundedMemoryPool::new()));
        let build_stats = match build {
            Side::Left => self.statistics.0,
            Side::Right => self.statistics.1,
        };
        let build_bytes_hint = self.build_size_hint_bytes.or(build_stats.bytes);
        let build_schema = match build {
            Side::Left => &self.left,
            Side::Right => &self.right,
        };
        // A small build's bytes, when only its rows are known, so that the fan-out
        // can tell whether it fits (`SMALL_BUILD_ROWS`).
        let bits_bytes_hint =
            build_bytes_hint.or_else(|| small_build_bytes(build_schema, build_stats.rows));
        let partition_bits = match self.partition_bits {
            Some(bits) if bits > MAX_PARTITION_BITS => {
                return Err(JoinError::InvalidJoin(format!(
                    "{bits} partition bits is more than the {MAX_PARTITION_BITS} allowed"
                )))
            }
            Some(bits) => bits,
            None => match partition_bits_for(
                bits_bytes_hint,
                build_stats.rows,
                pool.limit().bytes(),
                self.threads,
                self.batch_size_rows,
            ) {
                // Forced spilling (tests) spills a fraction of the partitions: a
                // small build still gets several, so that some stay in memory.
                0 if ForceSpill::fraction(self.force_spill_fraction) > 0.0 => {
                    super::DEFAULT_PARTITION_BITS
                }
                bits => bits,
            },
        };
        let bits = HashBits::new(partition_bits);
        let mut plan = self.plan_for(build, Arc::clone(&pool), bits)?;
        // (The mirror plan only joins spilled pairs, whose sizes are known exactly.)
        plan.build_rows_hint = build_stats.rows;
        plan.build_bytes_hint = build_bytes_hint;
        // Spilled pairs may swap roles when their probe file is the smaller; NOT IN
        // keeps its orientation, since its facts belong to one side.
        if self.swap_spilled_pairs && !self.join_type.is_null_aware() {
            plan.mirror = Some(Arc::new(self.plan_for(build.other(), pool, bits)?));
        }
        Ok(HashJoin {
            plan: Arc::new(plan),
            build_side_reason: build_side_reason.into(),
        })
    }

    /// The settings' checks that need no schema: what a null-aware join does not
    /// take, and the recursion depth.
    fn check_settings(&self) -> Result<()> {
        if self.join_type.is_null_aware() {
            if self.on.len() != 1 {
                return Err(JoinError::InvalidJoin(format!(
                    "{} takes exactly one key, not {}",
                    self.join_type,
                    self.on.len()
                )));
            }
            if self.null_equality == NullEquality::NullEqualsNull {
                return Err(JoinError::InvalidJoin(format!(
                    "{} is null-aware by definition; nulls-equal-nulls does not apply",
                    self.join_type
                )));
            }
            if self.filter.is_some() {
                return Err(JoinError::InvalidJoin(format!(
                    "{} does not take a residual filter",
                    self.join_type
                )));
            }
        }
        if self.max_depth > MAX_DEPTH {
            return Err(JoinError::InvalidJoin(format!(
                "a recursion depth of {} is more than the {MAX_DEPTH} levels the hash bits allow",
                self.max_depth
            )));
        }
        Ok(())
    }

    /// The plan with `build` as the build side.
    fn plan_for(&self, build: Side, pool: Arc<dyn MemoryPool>, bits: HashBits) -> Result<JoinPlan> {
        let keys = KeySpec::resolve(build, &self.left, &self.right, &self.on, self.null_equality)?;
        let filter = self
            .filter
            .clone()
            .map(|f| ResolvedFilter::new(f, build, &self.left, &self.right))
            .transpose()?;
        let output = OutputLayout::new(
            self.join_type,
            build,
            &self.left,
            &self.right,
            self.projection.as_deref(),
        )?;
        let work_rows =
            crate::plan::work_rows_for(self.batch_size_rows, pool.limit().bytes(), self.threads);
        let (build_schema, probe_schema) = match build {
            Side::Right => (Arc::clone(&self.right), Arc::clone(&self.left)),
            Side::Left => (Arc::clone(&self.left), Arc::clone(&self.right)),
        };
        Ok(JoinPlan {
            join_type: self.join_type,
            resolved: self.join_type.resolve(build),
            build_side: build,
            keys,
            filter,
            output,
            build_schema,
            probe_schema,
            pool,
            spill: self.spill.clone(),
            batch_size: self.batch_size_rows,
            work_rows,
            threads: self.threads,
            bits,
            force_spill_fraction: self.force_spill_fraction,
            force_spill_depth: self.force_spill_depth,
            max_depth: self.max_depth,
            hot_key_split: self.hot_key_split,
            mirror: None,
            build_rows_hint: None,
            build_bytes_hint: None,
        })
    }
}

/// What a build of `rows` rows of `schema` is taken to need, when they are at most
/// [`SMALL_BUILD_ROWS`]: each fixed-width column its width, any other column 64 bytes
/// (more than most strings of a small build; a wrong guess costs speed only).
fn small_build_bytes(schema: &SchemaRef, rows: Option<u64>) -> Option<u64> {
    let rows = rows.filter(|&r| r <= SMALL_BUILD_ROWS)?;
    let row: usize = schema
        .fields()
        .iter()
        .map(|f| f.data_type().primitive_width().unwrap_or(64))
        .sum();
    Some(rows.saturating_mul(row as u64))
}
