//! A join, resolved once into build and probe terms.
//!
//! Everything the user said in left/right terms is translated here: which input
//! builds, the engine's join type ([`BuildJoinType`]), the key columns of each role,
//! the filter's column sides and the output layout. Past this module the engine speaks
//! only of build and probe.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use spilljoin_memory::MemoryPool;
use spilljoin_spill::SpillManager;

use crate::error::{JoinError, Result, Side};
use crate::filter::ResolvedFilter;
use crate::join_type::{BuildJoinType, JoinType};
use crate::keys::{KeySpec, NullEquality};
use crate::output::OutputLayout;
use crate::partition::HashBits;

/// A join ready to execute.
#[derive(Debug, Clone)]
pub(crate) struct JoinPlan {
    pub join_type: JoinType,
    pub resolved: BuildJoinType,
    pub build_side: Side,
    pub keys: KeySpec,
    pub filter: Option<ResolvedFilter>,
    pub output: OutputLayout,
    pub build_schema: SchemaRef,
    pub probe_schema: SchemaRef,
    pub pool: Arc<dyn MemoryPool>,
    pub spill: Option<SpillManager>,
    pub batch_size: usize,
    /// Rows processed at a time inside the join (input slices, candidate pairs,
    /// spill writes): the batch size, lowered under small memory limits so that
    /// every worker's buffers fit (see [`work_rows_for`]).
    pub work_rows: usize,
    pub threads: usize,
    pub bits: HashBits,
    pub force_spill_fraction: Option<f64>,
    /// The deepest level that [`force_spill_fraction`](Self::force_spill_fraction)
    /// applies to (`None`: the environment decides; see [`ForceSpill`]).
    pub force_spill_depth: Option<u32>,
    /// The deepest level spilled pairs are repartitioned to (at most
    /// [`crate::MAX_DEPTH`]); below it a pair too big goes to the fallback.
    pub max_depth: u32,
    pub hot_key_split: HotKeySplit,
    /// The same join with the other input building, for spilled pairs whose probe
    /// side turns out smaller; `None` where roles cannot swap (`NOT IN`).
    pub mirror: Option<Arc<JoinPlan>>,
    /// The build input's rows, when known before it is read (statistics): level 0's
    /// spilled partitions size their bloom filters for them.
    pub build_rows_hint: Option<u64>,
    /// The build input's bytes in memory, when known before it is read (the size hint
    /// or statistics): with the rows, how many partitions level 0 expects to spill.
    pub build_bytes_hint: Option<u64>,
}

impl JoinPlan {
    /// This plan (and its mirror) on one thread, drawing from `pool`: for a spilled
    /// pair joined beside others ([`crate::exec`]).
    pub fn on_one_thread(&self, pool: &Arc<dyn MemoryPool>) -> JoinPlan {
        let mut one = self.clone();
        one.threads = 1;
        one.pool = Arc::clone(pool);
        one.mirror = self.mirror.as_ref().map(|mirror| {
            let mut m = JoinPlan::clone(mirror);
            m.threads = 1;
            m.pool = Arc::clone(pool);
            m.mirror = None;
            Arc::new(m)
        });
        one
    }

    /// The side that probes.
    pub fn probe_side(&self) -> Side {
        self.build_side.other()
    }

    /// Whether spill files carry each row's key hash ([`crate::batches::HASH_COLUMN`]).
    /// Word keys (one fixed-width column of at most 8 bytes) do not: hashing a word
    /// again when its file is read back (`benches/kernels.rs`, "hash u64") costs less
    /// than writing and reading 8 more bytes a row (a third of an orders ⋈ lineitem
    /// spill row), and their in-memory partitions drop their hashes anyway.
    pub fn spills_hashes(&self) -> bool {
        !self.keys.is_word_key()
    }

    /// The schema of the spill files of the build (`build == true`) or probe input.
    pub fn spill_schema(&self, build: bool) -> SchemaRef {
        let schema = if build {
            &self.build_schema
        } else {
            &self.probe_schema
        };
        if self.spills_hashes() {
            crate::batches::with_hash_column(schema)
        } else {
            Arc::clone(schema)
        }
    }

    /// The key hashes of a build (`build == true`) or probe batch, into `out`.
    pub fn hash_rows(&self, batch: &RecordBatch, build: bool, out: &mut Vec<u64>) -> Result<()> {
        let (columns, _) = self.keys.evaluate_columns(batch, build)?;
        crate::hash::hash_keys(&columns, batch.num_rows(), out)
    }

    /// Whether rows with a null key can never match.
    pub fn nulls_never_match(&self) -> bool {
        self.keys.null_equality == NullEquality::NullEqualsNothing
    }

    /// Checks that a batch of the build (`build == true`) or probe input has the
    /// column types the join was defined with.
    pub fn check_batch(&self, batch: &RecordBatch, build: bool) -> Result<()> {
        let (expected, side) = if build {
            (&self.build_schema, self.build_side)
        } else {
            (&self.probe_schema, self.probe_side())
        };
        let found = batch.schema_ref();
        let same = found.fields().len() == expected.fields().len()
            && found
                .fields()
                .iter()
                .zip(expected.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if same {
            Ok(())
        } else {
            Err(JoinError::SchemaMismatch {
                side,
                expected: expected.to_string(),
                found: found.to_string(),
            })
        }
    }
}

/// The rows the join processes at a time: `batch_size`, but under a small limit at
/// most `limit / (threads × 1 KiB)` (each worker's buffers take a few dozen bytes
/// per row of a batch), and at least [`MIN_WORK_ROWS`]: smaller pieces cost more in
/// per-piece overhead than they save (a join under a tiny limit ran several times
/// slower with pieces of a few hundred rows than with whole batches).
pub(crate) fn work_rows_for(batch_size: usize, limit_bytes: usize, threads: usize) -> usize {
    let by_memory = limit_bytes / (threads.max(1) * 1024);
    batch_size.min(by_memory.max(MIN_WORK_ROWS))
}

/// The fewest rows the join processes at a time (unless the batch size is smaller,
/// or the rows are so wide that fewer make a piece: [`JoinPlan::piece_rows_of`]).
pub(crate) const MIN_WORK_ROWS: usize = 1024;

/// A piece of an input batch takes at most this share of a worker's part of the
/// limit: while a piece is joined, it, its copies into partitions (or its candidate
/// pairs' gathered columns), its hashes and key encodings, and a spill buffer's
/// batch of its rows live together.
const PIECE_SHARE: usize = 16;

impl JoinPlan {
    /// The shape the probe's headroom is modelled from ([`ProbeShape`]).
    pub(crate) fn probe_shape(&self) -> ProbeShape {
        ProbeShape {
            limit: self.pool.limit().bytes(),
            threads: self.threads,
            work_rows: self.work_rows,
            batch_size: self.batch_size,
        }
    }

    /// The most bytes of input rows one worker joins at a time:
    /// `limit / (threads × PIECE_SHARE)`.
    pub(crate) fn piece_bytes(&self) -> usize {
        self.pool.limit().bytes() / (PIECE_SHARE * self.threads.max(1))
    }

    /// The rows of a batch of `rows` rows and `bytes` bytes
    /// ([`crate::batches::batch_bytes`], a pass over a view column's views: measured
    /// once by callers that need it too) joined at a time:
    /// [`work_rows`](Self::work_rows), or fewer (at least one) when that many of its
    /// rows would take more than [`piece_bytes`](Self::piece_bytes). [`MIN_WORK_ROWS`]
    /// narrow rows are a few dozen KiB, but a thousand rows of 8 KiB strings are 8 MiB
    /// a piece, several times over per worker: without this, the floor of a join of
    /// wide rows grew with `threads × MIN_WORK_ROWS × row width` instead of with its
    /// batches.
    pub(crate) fn piece_rows_of(&self, rows: usize, bytes: usize) -> usize {
        if rows == 0 {
            return self.work_rows;
        }
        let row_bytes = (bytes / rows).max(1);
        self.work_rows.min((self.piece_bytes() / row_bytes).max(1))
    }
}

/// Whether the fallback for a spilled pair that its hash bits cannot split first
/// splits off the rows of its dominant key (see [`JoinMetrics::hot_key_splits`](crate::JoinMetrics::hot_key_splits)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HotKeySplit {
    /// When it costs less than the chunked join's extra reads of the probe file
    /// (the probe file is large against the build file and the memory).
    #[default]
    Auto,
    /// Whenever a key holds half of the pair's first build rows and the split's
    /// buffers fit (tests use it to run the split on small inputs).
    Always,
    /// Never: such pairs are joined in chunks against their whole probe file.
    Never,
}

/// The environment variable that forces the spill path: `all`, or a fraction of the
/// partitions from 0 to 1, spilled at level 0 and at the levels
/// [`FORCE_SPILL_DEPTH_ENV`] adds (see [`HashJoinBuilder::with_force_spill`](crate::HashJoinBuilder::with_force_spill)).
pub const FORCE_SPILL_ENV: &str = "SPILLJOIN_FORCE_SPILL";

/// The environment variable that applies [`FORCE_SPILL_ENV`] down to a depth of the
/// spilled pairs' levels (see [`HashJoinBuilder::with_force_spill_depth`](crate::HashJoinBuilder::with_force_spill_depth)).
pub const FORCE_SPILL_DEPTH_ENV: &str = "SPILLJOIN_FORCE_SPILL_DEPTH";

/// Forced spilling (tests): which fraction of each level's partitions spill whatever
/// the memory, at the levels from 0 to `depth`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ForceSpill {
    fraction: f64,
    depth: u32,
}

impl ForceSpill {
    /// The plan's setting, or the environment's where the plan sets none.
    pub fn of(plan: &JoinPlan) -> Self {
        let env = |name: &str| std::env::var(name).ok();
        let fraction = Self::fraction(plan.force_spill_fraction);
        let depth = plan.force_spill_depth.unwrap_or_else(|| {
            env(FORCE_SPILL_DEPTH_ENV).map_or(0, |v| v.parse::<u32>().unwrap_or(0))
        });
        ForceSpill { fraction, depth }
    }

    /// The fraction of partitions forced to spill: `setting` (a plan's), or the
    /// environment's where it is `None`.
    pub fn fraction(setting: Option<f64>) -> f64 {
        setting.unwrap_or_else(|| match std::env::var(FORCE_SPILL_ENV).ok() {
            Some(v) if v.eq_ignore_ascii_case("all") => 1.0,
            Some(v) => v.parse::<f64>().map_or(0.0, |f| f.clamp(0.0, 1.0)),
            None => 0.0,
        })
    }

    /// The fraction of partitions forced to spill at a level of this depth.
    pub fn at(&self, depth: u32) -> f64 {
        if depth <= self.depth {
            self.fraction
        } else {
            0.0
        }
    }
}

/// What the probe's workers and its output batches take while it runs, which the
/// build leaves free for them (its *headroom*, reserved before the tables are
/// planned), as a function of the join's shape: one model for the build that
/// reserves it and for the fan-out that must leave room for it one level down.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeShape {
    pub limit: usize,
    pub threads: usize,
    pub work_rows: usize,
    pub batch_size: usize,
}

impl ProbeShape {
    /// The workers' part of the headroom, at most half of the limit: each worker's
    /// buffers ([`probe_worker_bytes`]) and three batches of `work_batch_bytes` (the
    /// piece being probed, the output and the spill pieces made from it), and the
    /// output batches in flight: a batch being assembled per worker and the
    /// channel's two per worker, of rows `build_row_bytes + probe_row_bytes` wide
    /// (up to an eighth of the limit). [`crate::channel`] lets up to a quarter wait
    /// where the pool has the room (as in the spilled pairs' phase, where the
    /// level's tables are gone); where it has not, workers wait for the caller.
    /// Counting the quarter here took a narrow build under 3.4 MiB out of one level.
    pub fn workers_headroom(
        &self,
        work_batch_bytes: usize,
        build_row_bytes: usize,
        probe_row_bytes: usize,
    ) -> usize {
        let threads = self.threads.max(1);
        let per_worker = probe_worker_bytes(self.work_rows, self.work_rows)
            .saturating_add(work_batch_bytes.max(16 * 1024).saturating_mul(3));
        let piece = self.limit / (PIECE_SHARE * threads);
        let batch_bytes = self
            .batch_size
            .saturating_mul(build_row_bytes.saturating_add(probe_row_bytes))
            .min(piece);
        let output = (3 * threads * batch_bytes).min(self.limit / 8);
        per_worker
            .saturating_mul(threads)
            .saturating_add(output)
            .min(self.limit / 2)
    }
}

/// The bytes one probe worker's buffers hold at most for batches of `batch_rows`
/// rows and `pair_rows` matched pairs (reserved by the caller).
pub(crate) fn probe_worker_bytes(batch_rows: usize, pair_rows: usize) -> usize {
    batch_rows * (8 + 4 + 4 + 1 + 1) + pair_rows * 8 + 1024
}
