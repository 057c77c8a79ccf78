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
    /// applies to (`None`: the environment decides; see [`crate::join::ForceSpill`]).
    pub force_spill_depth: Option<u32>,
    /// The deepest level spilled pairs are repartitioned to (at most
    /// [`crate::MAX_DEPTH`]); below it a pair too big goes to the fallback.
    pub max_depth: u32,
    pub hot_key_split: crate::join::HotKeySplit,
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
    /// again when its file is read back costs 2–3 ns a row (`benches/kernels.rs`,
    /// "hash u64"), less than writing and reading 8 more bytes a row (a third of an
    /// orders ⋈ lineitem spill row), and their in-memory partitions drop their hashes
    /// anyway.
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
/// per-piece overhead than they save (SF1 orders ⋈ lineitem at 3.4 MiB: 2.1 s with
/// 435-row pieces, 0.74 s with 8192).
pub(crate) fn work_rows_for(batch_size: usize, limit_bytes: usize, threads: usize) -> usize {
    let by_memory = limit_bytes / (threads.max(1) * 1024);
    batch_size.min(by_memory.max(MIN_WORK_ROWS))
}

/// The fewest rows the join processes at a time (unless the batch size is smaller,
/// or the rows are so wide that fewer make a piece: [`JoinPlan::piece_rows`]).
pub(crate) const MIN_WORK_ROWS: usize = 1024;

/// A piece of an input batch takes at most this share of a worker's part of the
/// limit: while a piece is joined, it, its copies into partitions (or its candidate
/// pairs' gathered columns), its hashes and key encodings, and a spill buffer's
/// batch of its rows live together.
const PIECE_SHARE: usize = 16;

impl JoinPlan {
    /// The most bytes of input rows one worker joins at a time:
    /// `limit / (threads × PIECE_SHARE)`.
    pub(crate) fn piece_bytes(&self) -> usize {
        self.pool.limit().bytes() / (PIECE_SHARE * self.threads.max(1))
    }

    /// The rows of `batch` joined at a time: [`work_rows`](Self::work_rows), or fewer
    /// (at least one) when that many of its rows would take more than
    /// [`piece_bytes`](Self::piece_bytes). [`MIN_WORK_ROWS`] narrow rows are a few
    /// dozen KiB, but a thousand rows of 8 KiB strings are 8 MiB a piece, several
    /// times over per worker: without this, the floor of a join of wide rows grew
    /// with `threads × MIN_WORK_ROWS × row width` instead of with its batches (4
    /// threads joining 8 MiB batches of 2 KB rows needed 29 MiB).
    pub(crate) fn piece_rows(&self, batch: &RecordBatch) -> usize {
        self.piece_rows_of(batch.num_rows(), crate::batches::batch_bytes(batch))
    }

    /// [`piece_rows`](Self::piece_rows) of a batch of `rows` rows and `bytes` bytes
    /// ([`crate::batches::batch_bytes`], a pass over a view column's views: measured
    /// once by callers that need it too).
    pub(crate) fn piece_rows_of(&self, rows: usize, bytes: usize) -> usize {
        if rows == 0 {
            return self.work_rows;
        }
        let row_bytes = (bytes / rows).max(1);
        self.work_rows.min((self.piece_bytes() / row_bytes).max(1))
    }
}
