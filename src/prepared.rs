//! Prepared builds: a build side built once and probed by any number of joins, one
//! after another or at the same time.
//!
//! ```text
//!  HashJoin::prepare(build input) ─► PreparedBuild (immutable, shared by Arc):
//!       in-memory partitions + tables, spilled partition files (read-only),
//!       key bounds, null-key fact, its memory reservation
//!  HashJoin::execute_prepared(prepared, probe) ─► JoinStream, with its own
//!       visited bits, probe facts, probe spill files and output
//! ```
//!
//! What a probe changes lives apart from the build (in the probe's `ProbeState`), so
//! probes never see each other. A spilled partition is joined by each probe from the
//! build's file, which nobody writes after the build. Output batches own their
//! buffers: gathers copy values, and the few types whose gathers share buffers (views,
//! dictionaries) are copied, so no output batch keeps the build alive.
//!
//! The build's memory stays reserved, and its files stay on disk, until the last
//! handle is dropped; an execution holds a handle only until its probe input has been
//! read (it then needs just the spilled files), so a build that is prepared, executed
//! once and dropped costs no more memory than [`HashJoin::execute`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::BooleanBufferBuilder;
use arrow_schema::{ArrowError, DataType, SchemaRef};
use spilljoin_spill::{SpillConfig, SpillFile, SpillManager};

use crate::batches::panic_message;
use crate::bloom::Bloom;
use crate::bounds::KeyBounds;
use crate::build::{build_side, BuiltSide, Partition};
use crate::context::{Ctx, Facts, JoinPhase, Level, SharedMetrics};
use crate::error::{JoinError, Result, Side};
use crate::exec::{join_spilled_pairs, probe_level, LevelRows};
use crate::hash::hash_keys;
use crate::join::{snapshot, HashJoin, JoinMetrics, JoinStream};
use crate::keys::{normalize, null_rows, NullEquality};
use crate::plan::ForceSpill;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};

/// A build side built once, to be probed by any number of joins (see the module
/// docs). Cloning it is cheap: clones share the build.
///
/// Attaching it to a join ([`HashJoin::execute_prepared`]) checks that the join builds
/// on an input of the same schema, with the same key columns and null equality. It
/// cannot check that the data is the snapshot the caller means: attaching a build of
/// other data silently gives other results. Identity is the caller's business (or
/// [`crate::BuildCache`]'s, keyed by the caller).
#[derive(Debug, Clone)]
pub struct PreparedBuild {
    inner: Arc<Prepared>,
}

#[derive(Debug)]
struct Prepared {
    built: BuiltSide,
    level: Level,
    build_side: Side,
    build_schema: SchemaRef,
    key_columns: Vec<usize>,
    key_types: Vec<DataType>,
    null_equality: NullEquality,
    /// Whether build rows with a key that never matches were kept.
    keeps_unmatchable: bool,
    metrics: JoinMetrics,
    /// A bloom filter over the keys of the in-memory partitions, for `may_contain`,
    /// built on its first call. `None` inside if the pool refused its memory then
    /// (not retried): the tables answer instead where they kept hashes, and word-key
    /// partitions (which keep none) answer "maybe".
    membership: std::sync::OnceLock<Option<(Bloom, MemoryReservation)>>,
    /// The pool the build reserves from (for the membership filter).
    pool: Arc<dyn spilljoin_memory::MemoryPool>,
    /// The spill files' directory, kept while the files are.
    _spill: SpillManager,
}

impl HashJoin {
    /// Builds this join's build side once, for [`execute_prepared`](Self::execute_prepared)
    /// to probe any number of times. Runs on the calling thread (and the join's
    /// worker threads) and returns when the build is complete. Under a memory limit
    /// the partitions that do not fit are spilled, as in [`execute`](Self::execute);
    /// their files are read by every probe.
    ///
    /// The prepared build keeps the build rows every join type needs (rows with null
    /// keys included when this join type outputs them), so it can be attached to
    /// joins of other types, filters and projections over the same build input.
    ///
    /// # Errors
    /// As the build phase of [`execute`](Self::execute): input errors,
    /// [`JoinError::ResourcesExhausted`] below the memory floor, spill errors.
    pub fn prepare<B>(&self, build: B) -> Result<PreparedBuild>
    where
        B: IntoIterator<Item = Result<RecordBatch, ArrowError>>,
        B::IntoIter: Send,
    {
        self.prepare_partitioned(vec![build.into_iter()])
    }

    /// Like [`prepare`](Self::prepare), with the build input split into several streams
    /// that workers decode in parallel.
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare).
    pub fn prepare_partitioned<B>(&self, build: Vec<B>) -> Result<PreparedBuild>
    where
        B: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    {
        let plan = &*self.plan;
        let spill = match &plan.spill {
            Some(spill) => spill.clone(),
            None => SpillManager::new(SpillConfig::default())?,
        };
        // The build sends no output; the channel only completes the context.
        let (sender, _receiver) =
            crate::channel::output_channel(1, &plan.pool, Arc::new(AtomicBool::new(false)));
        let cancel = AtomicBool::new(false);
        let metrics = SharedMetrics::default();
        let ctx = Ctx {
            plan,
            spill: spill.clone(),
            sender: &sender,
            cancel: &cancel,
            metrics: &metrics,
            owned_output: true,
            force: ForceSpill::of(plan),
        };
        let level = Level {
            bits: plan.bits,
            depth: 0,
            hashed_input: false,
            force_spill_fraction: ctx.force.at(0),
            key_bounds: true,
            build_rows: None,
        };
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            PreparedBuild::build_in(&ctx, level, build)
        }))
        .unwrap_or_else(|panic| Err(JoinError::WorkerPanicked(panic_message(&panic))))?;
        Ok(built)
    }

    /// Checks that `prepared` can be this join's build side: same build input side,
    /// schema, key columns and types, and null equality, and it kept the build rows
    /// this join type outputs.
    ///
    /// # Errors
    /// [`JoinError::PreparedBuildMismatch`] saying what differs.
    pub fn check_prepared(&self, prepared: &PreparedBuild) -> Result<()> {
        let plan = &self.plan;
        let p = &prepared.inner;
        let mismatch = |what: String| Err(JoinError::PreparedBuildMismatch(what));
        if plan.build_side != p.build_side {
            return mismatch(format!(
                "the build was prepared from the {} input; this join builds on the {} input",
                p.build_side, plan.build_side
            ));
        }
        if plan.build_schema.fields() != p.build_schema.fields() {
            return mismatch(format!(
                "the build input's schema differs: prepared {}, this join {}",
                p.build_schema, plan.build_schema
            ));
        }
        if plan.keys.build_columns != p.key_columns || plan.keys.types != p.key_types {
            let names = |cols: &[usize]| {
                cols.iter()
                    .map(|&c| p.build_schema.field(c).name().clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return mismatch(format!(
                "the build keys differ: prepared on ({}), this join on ({})",
                names(&p.key_columns),
                names(&plan.keys.build_columns)
            ));
        }
        if plan.keys.null_equality != p.null_equality {
            return mismatch(format!(
                "null equality differs: prepared with {:?}, this join {:?}",
                p.null_equality, plan.keys.null_equality
            ));
        }
        if plan.resolved.keeps_unmatchable_build_rows() && !p.keeps_unmatchable {
            return mismatch(format!(
                "a {} join outputs build rows whose key is null, which a build prepared for \
                 a join that drops them did not keep",
                plan.join_type
            ));
        }
        Ok(())
    }

    /// Probes a prepared build with `probe` and returns the output stream; the same
    /// output as [`execute`](Self::execute) over the build's input. Any number of
    /// executions may run at once, each with its own state. Under a memory limit,
    /// the build left room for one probe with the preparing join's threads; more
    /// concurrent probes need more memory (a prepared build cannot spill further),
    /// so give them a pool with room, or expect [`JoinError::ResourcesExhausted`].
    ///
    /// The execution holds its handle until the probe input is read; pass a clone to
    /// keep the build for later joins.
    ///
    /// # Errors
    /// [`JoinError::PreparedBuildMismatch`] (see [`check_prepared`](Self::check_prepared));
    /// [`JoinError::Io`] if the join's thread cannot start. The rest is reported
    /// through the stream.
    pub fn execute_prepared<P>(&self, prepared: PreparedBuild, probe: P) -> Result<JoinStream>
    where
        P: IntoIterator<Item = Result<RecordBatch, ArrowError>>,
        P::IntoIter: Send + 'static,
    {
        self.execute_prepared_partitioned(prepared, vec![probe.into_iter()])
    }

    /// Like [`execute_prepared`](Self::execute_prepared), with the probe input split
    /// into several streams.
    ///
    /// # Errors
    /// As [`execute_prepared`](Self::execute_prepared).
    pub fn execute_prepared_partitioned<P>(
        &self,
        prepared: PreparedBuild,
        probe: Vec<P>,
    ) -> Result<JoinStream>
    where
        P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
    {
        self.check_prepared(&prepared)?;
        self.spawn(true, move |ctx| run_prepared(ctx, prepared, probe))
    }
}

impl HashJoin {
    /// Like [`execute_partitioned`](Self::execute_partitioned), and calls `on_built`
    /// with the build side once it is built, before the first probe batch is read.
    /// The [`PreparedBuild`] it gets offers the build's key bounds and membership, so
    /// a probe input that is opened lazily can skip what cannot match (see
    /// [`may_skip_unmatchable_probe_rows`](Self::may_skip_unmatchable_probe_rows)).
    /// Keep its handle no longer than the probe input: it holds the build's memory.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn execute_partitioned_observed<L, R, F>(
        &self,
        left: Vec<L>,
        right: Vec<R>,
        on_built: F,
    ) -> Result<JoinStream>
    where
        L: Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
        R: Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static,
        F: FnOnce(&PreparedBuild) + Send + 'static,
    {
        self.spawn(false, move |ctx| {
            let level = Level {
                bits: ctx.plan.bits,
                depth: 0,
                hashed_input: false,
                force_spill_fraction: ctx.force.at(0),
                key_bounds: true,
                build_rows: None,
            };
            match ctx.plan.build_side {
                Side::Right => run_observed(ctx, level, right, left, on_built),
                Side::Left => run_observed(ctx, level, left, right, on_built),
            }
        })
    }
}

/// A bloom filter over the hashes of `built`'s in-memory partitions, reserved from
/// the join's pool; `None` if the pool refuses.
fn membership_filter(
    pool: &Arc<dyn spilljoin_memory::MemoryPool>,
    built: &BuiltSide,
    key_columns: &[usize],
) -> Option<(Bloom, MemoryReservation)> {
    let rows: usize = built
        .partitions
        .iter()
        .map(|p| match p {
            Partition::InMemory(part) => part.batch.num_rows(),
            Partition::Spilled(_) => 0,
        })
        .sum();
    let mut reservation = MemoryConsumer::new("spilljoin build membership").register(pool);
    if reservation
        .try_grow(Bloom::membership_bytes_for(rows))
        .is_err()
    {
        return None;
    }
    let mut bloom = Bloom::membership(rows);
    for p in &built.partitions {
        if let Partition::InMemory(part) = p {
            // Partitions hold only rows whose key can match (every one is in the
            // table). Word-key partitions keep no hashes: hash their keys again.
            if part.hashes.len() == part.batch.num_rows() {
                for &hash in &part.hashes {
                    bloom.insert(hash);
                }
            } else {
                // In slices, so the scratch stays small (it is not reserved).
                let mut hashes = Vec::new();
                let rows = part.batch.num_rows();
                for start in (0..rows).step_by(REHASH_ROWS) {
                    let slice = part.batch.slice(start, REHASH_ROWS.min(rows - start));
                    let columns = key_columns
                        .iter()
                        .map(|&c| normalize(slice.column(c)))
                        .collect::<Result<Vec<_>>>()
                        .ok()?;
                    hash_keys(&columns, slice.num_rows(), &mut hashes).ok()?;
                    for &hash in &hashes {
                        bloom.insert(hash);
                    }
                }
            }
        }
    }
    Some((bloom, reservation))
}

/// Rows hashed at a time when a membership filter is built from a partition's keys.
const REHASH_ROWS: usize = 8192;

/// Builds level 0 into a shareable build, shows it to `on_built`, then probes it.
fn run_observed<B, P, F>(
    ctx: &Ctx<'_>,
    level: Level,
    build: Vec<B>,
    probe: Vec<P>,
    on_built: F,
) -> Result<()>
where
    B: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    F: FnOnce(&PreparedBuild),
{
    let prepared = PreparedBuild::build_in(ctx, level, build)?;
    on_built(&prepared);
    run_prepared(ctx, prepared, probe)
}

impl PreparedBuild {
    /// Builds level 0 of `ctx`'s join from `build` into a shareable build.
    pub(crate) fn build_in<B>(ctx: &Ctx<'_>, level: Level, build: Vec<B>) -> Result<Self>
    where
        B: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
    {
        let plan = ctx.plan;
        let start = Instant::now();
        let built = build_side(ctx, level, build)?;
        let metrics = ctx.metrics;
        metrics
            .build_nanos
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        metrics
            .peak_reserved_bytes
            .fetch_max(plan.pool.reserved() as u64, Ordering::Relaxed);
        let mut figures = snapshot(metrics, built._reservation.size() as u64);
        figures.build_rows = built.num_rows;
        Ok(PreparedBuild {
            inner: Arc::new(Prepared {
                level,
                build_side: plan.build_side,
                build_schema: Arc::clone(&plan.build_schema),
                key_columns: plan.keys.build_columns.clone(),
                key_types: plan.keys.types.clone(),
                null_equality: plan.keys.null_equality,
                keeps_unmatchable: plan.resolved.keeps_unmatchable_build_rows(),
                metrics: figures,
                membership: std::sync::OnceLock::new(),
                pool: Arc::clone(&plan.pool),
                built,
                _spill: ctx.spill.clone(),
            }),
        })
    }

    /// Which input of the join it was prepared for builds.
    pub fn build_side(&self) -> Side {
        self.inner.build_side
    }

    /// The schema of the build input.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.inner.build_schema)
    }

    /// Build input rows (rows with null keys included).
    pub fn num_rows(&self) -> u64 {
        self.inner.built.num_rows
    }

    /// Bytes it holds reserved in the pool it was built with (spilled partitions are
    /// on disk and not counted).
    pub fn memory_bytes(&self) -> usize {
        let membership = self
            .inner
            .membership
            .get()
            .and_then(|m| m.as_ref())
            .map_or(0, |(_, r)| r.size());
        self.inner.built._reservation.size() + membership
    }

    /// Partitions that were spilled to disk while building.
    pub fn spilled_partitions(&self) -> usize {
        self.inner
            .built
            .partitions
            .iter()
            .filter(|p| matches!(p, Partition::Spilled(_)))
            .count()
    }

    /// Whether some build row has a null key.
    pub fn has_null_key(&self) -> bool {
        self.inner.built.has_null_key
    }

    /// The figures of the build (rows, time, spilling).
    pub fn metrics(&self) -> JoinMetrics {
        self.inner.metrics.clone()
    }

    /// How many handles share this build (this one included): executions still
    /// reading their probe input hold one each.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The smallest and largest value of each key column, in key order (normalized
    /// values: dictionaries decoded). `None` for a column with no non-null value or
    /// of a type that keeps no bounds (floats, booleans). A probe row whose key lies
    /// outside them cannot match.
    pub fn key_bounds(&self) -> Vec<Option<KeyBounds>> {
        let bounds = &self.inner.built.bounds;
        (0..self.inner.key_types.len())
            .map(|i| bounds.get(i).cloned().flatten())
            .collect()
    }

    /// For each row of the given probe key columns (in key order, of the key types):
    /// could it match a build row? `false` is certain; `true` may be wrong (bloom
    /// filters: one over the in-memory partitions' keys, about 8 bits a key, small
    /// enough to stay in cache, and those of the spilled partitions). Rows with a
    /// null key are `false` unless nulls equal nulls.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if the columns do not have the key types.
    pub fn may_contain(&self, key_columns: &[ArrayRef]) -> Result<BooleanArray> {
        let p = &self.inner;
        if key_columns.len() != p.key_types.len() {
            return Err(JoinError::InvalidJoin(format!(
                "{} key columns given, the build has {}",
                key_columns.len(),
                p.key_types.len()
            )));
        }
        let columns = key_columns
            .iter()
            .map(normalize)
            .collect::<Result<Vec<_>>>()?;
        for (i, (c, t)) in columns.iter().zip(&p.key_types).enumerate() {
            if c.data_type() != t {
                return Err(JoinError::InvalidJoin(format!(
                    "key column {i} has type {}, the build key has {t}",
                    c.data_type()
                )));
            }
        }
        let n = columns.first().map_or(0, |c| c.len());
        if columns.iter().any(|c| c.len() != n) {
            return Err(JoinError::InvalidJoin(format!(
                "key columns of different lengths: {:?}",
                columns.iter().map(|c| c.len()).collect::<Vec<_>>()
            )));
        }
        let nulls = null_rows(&columns);
        let mut hashes = Vec::with_capacity(n);
        hash_keys(&columns, n, &mut hashes)?;
        let nulls_never_match = p.null_equality == NullEquality::NullEqualsNothing;
        let membership = p
            .membership
            .get_or_init(|| membership_filter(&p.pool, &p.built, &p.key_columns));
        let mut out = BooleanBufferBuilder::new(n);
        for (row, &hash) in hashes.iter().enumerate() {
            if nulls_never_match && nulls.as_ref().is_some_and(|nb| nb.is_null(row)) {
                out.append(false);
                continue;
            }
            let found = match &p.built.partitions[p.level.bits.partition_of(hash)] {
                Partition::InMemory(_) if membership.is_some() => membership
                    .as_ref()
                    .is_some_and(|(m, _)| m.may_contain(hash)),
                // No filter (memory refused it) and no hashes kept (word keys):
                // maybe.
                // (A table looked up by key, not hash: maybe.)
                Partition::InMemory(part)
                    if part.table.by_key() || part.hashes.len() != part.batch.num_rows() =>
                {
                    true
                }
                Partition::InMemory(part) => {
                    let mut found = false;
                    part.table.for_each_candidate(hash, &part.hashes, |_| {
                        found = true;
                        std::ops::ControlFlow::Break(())
                    });
                    found
                }
                Partition::Spilled(s) => s.bloom.as_ref().is_none_or(|b| b.may_contain(hash)),
            };
            out.append(found);
        }
        Ok(BooleanArray::new(out.finish(), None))
    }

    pub(crate) fn level(&self) -> Level {
        self.inner.level
    }

    pub(crate) fn built(&self) -> &BuiltSide {
        &self.inner.built
    }

    /// The spilled partitions' files (new handles), by partition.
    pub(crate) fn spilled_files(&self) -> Vec<(usize, SpillFile)> {
        self.inner
            .built
            .partitions
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Partition::Spilled(s) => Some((i, s.file.clone())),
                Partition::InMemory(_) => None,
            })
            .collect()
    }
}

/// Probes a prepared build: level 0 over its shared partitions, then the pairs it
/// spilled. The handle is dropped once the probe input is read, so a build nobody
/// else holds is freed before the spilled pairs are joined.
pub(crate) fn run_prepared<P>(ctx: &Ctx<'_>, prepared: PreparedBuild, probe: Vec<P>) -> Result<()>
where
    P: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let level = prepared.level();
    let built = prepared.built();
    ctx.metrics
        .build_rows
        .store(built.num_rows, Ordering::Relaxed);
    ctx.metrics.set_phase(JoinPhase::Probe);
    let (facts, probe_files, probe_rows) = probe_level(ctx, level, built, probe, Facts::default())?;
    let level_rows = LevelRows {
        build: built.num_rows,
        probe: probe_rows,
    };
    let spilled = prepared.spilled_files();
    drop(prepared);
    let start = Instant::now();
    ctx.metrics.set_phase(JoinPhase::SpilledPairs);
    join_spilled_pairs(ctx, level, level_rows, spilled, probe_files, facts)?;
    ctx.metrics
        .spilled_nanos
        .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    ctx.metrics.set_phase(JoinPhase::Done);
    Ok(())
}
