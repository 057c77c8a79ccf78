//! The public entry point: define a join with [`HashJoinBuilder`], run it with
//! [`HashJoin::execute`], read its output from the [`JoinStream`].
//!
//! Execution runs on its own threads; the stream hands their output batches over a
//! bounded channel, so a slow consumer slows the join rather than growing a queue.
//! Dropping the stream stops the join, waits for its threads, and releases every
//! reservation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use crossbeam::channel::Receiver;
use spilljoin_memory::{MemoryPool, UnboundedMemoryPool};
use spilljoin_spill::{SpillConfig, SpillManager};

use crate::batches::panic_message;
use crate::context::{Ctx, JoinPhase, SharedMetrics, MAX_DEPTH};
use crate::error::{JoinError, Result, Side};
use crate::exec::run;
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

/// The default radix bits of the first partitioning level (16 partitions): enough
/// partitions for every thread to build tables in parallel, few enough that the
/// per-partition fragments of a batch stay hundreds of rows long.
pub const DEFAULT_PARTITION_BITS: u32 = 4;

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
    /// [`MAX_DEPTH`](crate::MAX_DEPTH), which the hash bits bound). A spilled pair
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
    /// [`MAX_DEPTH`](crate::MAX_DEPTH) counts). Forced with the fraction 1 at depth 1
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

    /// The side that builds, and why.
    fn choose_build_side(&self) -> (Side, String) {
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
        let pool = self
            .pool
            .clone()
            .unwrap_or_else(|| Arc::new(UnboundedMemoryPool::new()));
        let build_stats = match build {
            Side::Left => self.statistics.0,
            Side::Right => self.statistics.1,
        };
        let build_bytes_hint = self.build_size_hint_bytes.or(build_stats.bytes);
        let partition_bits = match self.partition_bits {
            Some(bits) if bits > MAX_PARTITION_BITS => {
                return Err(JoinError::InvalidJoin(format!(
                    "{bits} partition bits is more than the {MAX_PARTITION_BITS} allowed"
                )))
            }
            Some(bits) => bits,
            None => partition_bits_for(
                build_bytes_hint,
                build_stats.rows,
                pool.limit().bytes(),
                self.threads,
            ),
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

/// The radix bits of the first partitioning level, from the build's expected size
/// (bytes in memory and, when known, rows) and the memory limit.
///
/// Partitions that spill are joined one at a time at the next level, so the fewest
/// partitions that can each be joined there in one piece are best: every further
/// partition cuts each build and probe batch into one more fragment, one more
/// buffer to fill and write, and one more file (SF10 orders ⋈ lineitem, two
/// threads, three alternating runs: at a 10% limit 4.22 s in 32 partitions, 4.42 s
/// in 64, 5.47 s in 128; at 25% 4.11 s in 16, 4.33 s in 32, 4.71 s in 64). Fewer
/// than that, and the partitions spill again one level down (the same at 5%: 4.59
/// s in 64 partitions and one level, 5.97 s in 32 and two).
///
/// With the build's rows known, a partition of `r` rows and `n` bytes is taken to
/// need `n + 8r` (its rows and their hashes) plus its table
/// ([`ChainedTable::size_for`](crate::table::ChainedTable::size_for)), and one
/// level to hold it with a quarter to spare for the probe's batches:
/// `b` is the smallest number of bits, at least [`DEFAULT_PARTITION_BITS`], for
/// which `1.25 ×` that need fits the limit, or [`MAX_PARTITION_BITS`] when none
/// does (the partitions are split again one level down). This
/// is calibrated on the joins that did and did not stay in one level (limit over
/// need, partitions of TPC-H orders and of `NOT IN`'s one-column lineitem keys): all
/// that went two levels deep had 1.01 or less, all that stayed had 1.44 or more.
/// With only the bytes known, a partition is taken to need three times its bytes
/// and `b = ceil(log2(8 × build / limit))` (the rule before rows were known,
/// conservative for the wide rows that need less).
///
/// Either way, no more than a quarter of the limit can buffer (about 32 KiB per
/// spilled partition), or half when only that many partitions can each be joined in
/// one level (a 34 MiB build under a 3.4 MiB limit: 16 partitions too large for one
/// level, every row written twice; 32 that fit), or as many as each keep 16 KiB of
/// the whole limit when only that many can (the same build under 1.7 MiB: 64
/// partitions, not 8 split again). A build that fits eight times over gets two
/// partitions per thread (at most [`DEFAULT_PARTITION_BITS`] bits). Unknown sizes or
/// no limit give the default; a partition that still does not fit is split again at
/// the next level.
pub fn partition_bits_for(
    build_size_hint_bytes: Option<u64>,
    build_rows_hint: Option<u64>,
    limit_bytes: usize,
    threads: usize,
) -> u32 {
    let Some(build) = build_size_hint_bytes else {
        return DEFAULT_PARTITION_BITS;
    };
    if limit_bytes == usize::MAX || limit_bytes == 0 {
        return DEFAULT_PARTITION_BITS;
    }
    let ratio = 8.0 * build as f64 / limit_bytes as f64;
    if ratio <= 1.0 {
        // The build fits eight times over: partitions only need to keep every thread
        // busy building tables. Fewer, larger fragments halve the scatter's
        // per-fragment overhead (SF10 orders build 0.73 s with 16 partitions, 0.63 s
        // with 2).
        return (threads.max(1).next_power_of_two().ilog2() + 1).min(DEFAULT_PARTITION_BITS);
    }
    // (No rows at all beside some bytes is not a count to size by.)
    let build_rows_hint = build_rows_hint.filter(|&rows| rows > 0);
    // Whether a partition of the build fits one level below.
    let one_level = |bits: u32| match build_rows_hint {
        Some(rows) => one_level_need(build >> bits, rows >> bits)
            .is_some_and(|need| need as f64 * ONE_LEVEL_SLACK <= limit_bytes as f64),
        None => (build >> bits) as f64 * 3.0 <= limit_bytes as f64,
    };
    let wanted = match build_rows_hint {
        Some(_) => (DEFAULT_PARTITION_BITS..MAX_PARTITION_BITS)
            .find(|&bits| one_level(bits))
            .unwrap_or(MAX_PARTITION_BITS),
        None => (ratio.log2().ceil() as u32).clamp(DEFAULT_PARTITION_BITS, MAX_PARTITION_BITS),
    };
    // Every spilled partition keeps a few pieces per side in memory; under a tiny
    // limit, fewer partitions (split again at the next level) beat many that cannot
    // all be buffered — a quarter of the limit buys buffers. More where that is what
    // lets the partitions be joined in one level: half of the limit, or all of it
    // while each partition still gets `MIN_ONE_LEVEL_SHARE`, since writing every row
    // once more costs more than writing it in smaller pieces (SF1 orders ⋈ lineitem
    // at 1.7 MiB, inner: 0.61–0.86 s in 8 partitions and two levels, 0.48–0.50 s in
    // 64 and one).
    let affordable = |share: usize| {
        (limit_bytes / (share * PER_PARTITION_SPILL_BYTES))
            .max(4)
            .ilog2()
    };
    let quarter = wanted.min(affordable(4));
    let whole = wanted.min((limit_bytes / MIN_ONE_LEVEL_SHARE).max(4).ilog2());
    [quarter, wanted.min(affordable(2)), whole]
        .into_iter()
        .find(|&bits| one_level(bits))
        .unwrap_or(quarter)
}

/// What joining a partition of `rows` rows and `bytes` bytes in one piece is taken to
/// need, before [`ONE_LEVEL_SLACK`]: its rows, their hashes and its table; `None`
/// when one table cannot index that many rows.
fn one_level_need(bytes: u64, rows: u64) -> Option<u64> {
    let rows_each = usize::try_from(rows)
        .ok()
        .filter(|&r| r <= crate::table::MAX_TABLE_ROWS)?;
    Some(
        bytes
            .saturating_add(rows.saturating_mul(8))
            .saturating_add(crate::table::ChainedTable::size_for(rows_each) as u64),
    )
}

/// How much more than a partition's rows, hashes and table the level below is taken
/// to need to join it in one piece (the probe's batches, the output): see
/// [`partition_bits_for`].
const ONE_LEVEL_SLACK: f64 = 1.25;

/// What one spilled partition holds in memory while it is written, at most: the
/// pieces of its build and probe rows waiting to be written.
const PER_PARTITION_SPILL_BYTES: usize = 32 * 1024;

/// The least of the limit each partition is left when more partitions are what
/// lets a build be joined in one level.
const MIN_ONE_LEVEL_SHARE: usize = 16 * 1024;

/// A validated join, ready to execute any number of times.
#[derive(Debug, Clone)]
pub struct HashJoin {
    pub(crate) plan: Arc<JoinPlan>,
    build_side_reason: Arc<str>,
}

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

/// Stops a running join from any thread: its stream then ends with
/// [`JoinError::Cancelled`], and, as after any end, its reservations are released and
/// its spill files removed once the stream is dropped or has ended.
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Asks the join to stop. Workers notice between batches.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Reads a running join's figures from any thread; see
/// [`JoinStream::metrics_handle`].
#[derive(Debug, Clone)]
pub struct MetricsHandle {
    metrics: Arc<SharedMetrics>,
    pool: Arc<dyn MemoryPool>,
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
    /// ([`HashJoinBuilder::with_max_depth`]).
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
    /// [`JoinError::Io`] if the join's thread cannot be started. Everything else,
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

    /// Runs `job` on the join's coordinating thread and returns the stream of its
    /// output. `owned_output`: output batches must own their buffers.
    pub(crate) fn spawn<F>(&self, owned_output: bool, job: F) -> Result<JoinStream>
    where
        F: FnOnce(&Ctx<'_>) -> Result<()> + Send + 'static,
    {
        let plan = Arc::clone(&self.plan);
        let spill = match &plan.spill {
            Some(spill) => spill.clone(),
            None => SpillManager::new(SpillConfig::default())?,
        };
        let force = ForceSpill::of(&plan);
        let cancel = Arc::new(AtomicBool::new(false));
        let (sender, receiver) =
            crate::channel::output_channel(plan.threads * 2, &plan.pool, Arc::clone(&cancel));
        let gate = Arc::clone(&sender.gate);
        let metrics = Arc::new(SharedMetrics::default());
        let handle = {
            let (cancel, metrics) = (Arc::clone(&cancel), Arc::clone(&metrics));
            std::thread::Builder::new()
                .name("spilljoin".into())
                .spawn(move || {
                    let ctx = Ctx {
                        plan: &plan,
                        spill,
                        sender: &sender,
                        cancel: &cancel,
                        metrics: &metrics,
                        owned_output,
                        force,
                    };
                    // A panic here (the coordinating thread runs the spilled pairs and
                    // the fallback) must end the stream with an error, never as if
                    // the join had finished.
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&ctx)))
                            .unwrap_or_else(|panic| {
                                Err(JoinError::WorkerPanicked(panic_message(&panic)))
                            });
                    metrics.set_phase(JoinPhase::Done);
                    // After a cancel from a `CancelHandle` the stream ends with the
                    // error; after a drop nobody receives it.
                    if let Err(e) = result {
                        let _ = sender.sender.send(Err(e));
                    }
                })
                .map_err(|source| JoinError::Io {
                    path: "<thread>".into(),
                    source,
                })?
        };
        Ok(JoinStream {
            schema: self.schema(),
            pool: Arc::clone(&self.plan.pool),
            receiver: Some(receiver),
            gate,
            cancel,
            handle: Some(handle),
            metrics,
            failed: false,
        })
    }
}

/// The output of an executing join: an iterator of batches of at most the configured
/// batch size. After an error it ends.
///
/// Dropping it before the end cancels the join and waits for its threads; every
/// reservation of the join is released when the drop returns.
#[derive(Debug)]
pub struct JoinStream {
    schema: SchemaRef,
    pool: Arc<dyn MemoryPool>,
    receiver: Option<Receiver<crate::channel::Sent>>,
    /// Counts the batches in the channel; each is released as it is taken.
    gate: Arc<crate::channel::OutputGate>,
    cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    metrics: Arc<SharedMetrics>,
    failed: bool,
}

impl JoinStream {
    /// The schema of the output batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// A handle that stops the join from another thread (a signal handler, a
    /// timeout).
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(Arc::clone(&self.cancel))
    }

    /// The figures so far (final once the stream has ended). Cheap: it reads
    /// counters, so a progress display may call it often.
    pub fn metrics(&self) -> JoinMetrics {
        self.metrics_handle().metrics()
    }

    /// A handle that reads the figures from another thread (a progress display)
    /// while this one consumes the stream.
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle {
            metrics: Arc::clone(&self.metrics),
            pool: Arc::clone(&self.pool),
        }
    }

    /// Stops the join and waits for its thread. Returns an error if the thread
    /// ended by a panic that it could not report through the channel.
    fn stop(&mut self) -> Option<JoinError> {
        self.cancel.store(true, Ordering::Relaxed);
        // Dropping the receiver unblocks workers waiting to send.
        self.receiver = None;
        let handle = self.handle.take()?;
        let panicked = handle
            .join()
            .err()
            .map(|panic| JoinError::WorkerPanicked(panic_message(&panic)));
        // Every worker is done: the batches the channel held are gone with it.
        self.gate.clear_channel();
        panicked
    }
}

impl Iterator for JoinStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let received = self.receiver.as_ref()?.recv();
        match received {
            Ok(Ok((batch, bytes))) => {
                self.gate.release(bytes);
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                self.failed = true;
                self.stop();
                Some(Err(e))
            }
            Err(_) => {
                // Every sender is gone: the join finished — unless its thread died.
                self.failed = true;
                self.stop().map(Err)
            }
        }
    }
}

impl Drop for JoinStream {
    fn drop(&mut self) {
        // Nothing can be reported from a drop; the join's memory and files are
        // released either way.
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_max_depth_beyond_the_hash_bits_is_refused() {
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "k",
            arrow_schema::DataType::Int64,
            true,
        )]));
        let join = |depth| {
            HashJoinBuilder::new(Arc::clone(&schema), Arc::clone(&schema), [("k", "k")])
                .with_max_depth(depth)
                .build()
        };
        assert_eq!(join(0).map(|j| j.max_depth()).ok(), Some(0));
        assert_eq!(join(MAX_DEPTH).map(|j| j.max_depth()).ok(), Some(MAX_DEPTH));
        assert!(matches!(
            join(MAX_DEPTH + 1),
            Err(JoinError::InvalidJoin(_))
        ));
    }

    #[test]
    fn partitions_are_as_many_as_one_level_needs_while_they_can_be_buffered() {
        // SF1 orders (34.7 MiB in memory) under 50%, 25%, 10%, 5% and 2.5%.
        let build = Some(36_375_008);
        let bits: Vec<u32> = [17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584]
            .iter()
            .map(|&limit| partition_bits_for(build, None, limit, 2))
            .collect();
        // 25%: a quarter of the limit buys the 64 partitions one level needs; 10%: half
        // of it buys 32; 5%: only 64 fit one level, each keeping 27 KiB of the limit;
        // 2.5%: 128 would be needed, with 7 KiB each: 4 partitions, split again.
        assert_eq!(bits, [5, 6, 5, 6, 2]);
        for (&b, limit) in bits.iter().zip([18.0, 9.0, 3.6, 1.8]) {
            let part = (36_375_008u64 >> b) as f64 * 3.0;
            assert!(part <= limit * 1e6, "{b} bits: {part} bytes at {limit} MB");
        }
        // No limit, or no size: the default.
        assert_eq!(
            partition_bits_for(build, Some(1_500_000), usize::MAX, 2),
            DEFAULT_PARTITION_BITS
        );
        assert_eq!(
            partition_bits_for(None, None, MIB, 2),
            DEFAULT_PARTITION_BITS
        );
        assert_eq!(
            partition_bits_for(None, Some(1_500_000), MIB, 2),
            DEFAULT_PARTITION_BITS
        );
        // Zero rows beside some bytes: sized by the bytes alone.
        let limits = [17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584];
        for limit in limits {
            assert_eq!(
                partition_bits_for(build, Some(0), limit, 2),
                partition_bits_for(build, None, limit, 2)
            );
        }
        // Absurd statistics do not overflow: no fan-out fits, the most is asked for
        // and then capped by what the limit can buffer.
        for limit in [1, 64 * 1024, MIB, 1 << 30] {
            let bits = partition_bits_for(Some(u64::MAX), Some(u64::MAX), limit, 2);
            assert!(bits <= MAX_PARTITION_BITS);
        }
        assert_eq!(
            partition_bits_for(Some(u64::MAX), Some(u64::MAX), 1 << 30, 2),
            MAX_PARTITION_BITS
        );
    }

    #[test]
    fn known_rows_give_the_fewest_partitions_that_each_join_in_one_level() -> Result<(), String> {
        // (bytes, rows, limits, bits): SF1 orders (o_orderkey, o_totalprice) under
        // 50%, 25%, 10%, 5%, 2.5% of its Arrow bytes; SF10 orders under 25%, 10%, 5%;
        // SF10 `NOT IN`'s lineitem keys (one Int64 column) under 25%, 10%, 5%. Each
        // choice is the one measured fastest (`partition_bits_for`'s doc), except
        // SF1 at 2.5%, below what one level can take at any fan-out the limit can
        // buffer (as without rows).
        let cases: [(u64, u64, &[usize], &[u32]); 3] = [
            (
                36_375_008,
                1_500_000,
                &[17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584],
                &[4, 4, 5, 6, 2],
            ),
            (
                363_750_230,
                15_000_000,
                &[89_967_616, 35_986_432, 17_993_728],
                &[4, 5, 6],
            ),
            (
                68_529_312,
                8_566_164,
                &[17_131_520, 6_852_608, 3_426_304],
                &[5, 6, 7],
            ),
        ];
        for (bytes, rows, limits, want) in cases {
            let bits: Vec<u32> = limits
                .iter()
                .map(|&limit| partition_bits_for(Some(bytes), Some(rows), limit, 2))
                .collect();
            assert_eq!(bits, want, "{bytes} bytes, {rows} rows");
            // One fewer bit would not fit one level (where the limit allowed more).
            for (&b, &limit) in bits.iter().zip(limits) {
                if b > DEFAULT_PARTITION_BITS {
                    let need = one_level_need(bytes >> (b - 1), rows >> (b - 1))
                        .ok_or_else(|| format!("{rows} rows in {b} bits fit no table"))?;
                    assert!(need as f64 * ONE_LEVEL_SLACK > limit as f64);
                }
            }
        }
        Ok(())
    }
}
