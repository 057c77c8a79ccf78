//! `SpilljoinExec`: DataFusion's hash join, executed by spilljoin, so it spills
//! instead of failing with "Resources exhausted".
//!
//! It keeps the `HashJoinExec` it replaces as its definition: keys, filter, join
//! type, projection, partition mode, null handling and fetch are that node's, and so
//! are its plan properties (output partitioning, equivalences, emission type,
//! boundedness) and its statistics, which the plan above was built against (all but
//! a distributed `NOT IN`'s partitioning, below).
//!
//! Executions, by partition mode:
//! - `Partitioned`: output partition `i` joins left partition `i` with right
//!   partition `i`, one engine execution each, side by side.
//! - `CollectLeft`: one engine execution for the whole join, over the one left
//!   partition and every right partition; the output partitions share its output.
//!   Unmatched build rows, `NOT IN` facts and the probe's null keys then need no
//!   coordination between partitions, and a `NOT IN` can build on the subquery side.
//!   Sharing the output is only right where `HashJoinExec` does not promise that
//!   output partition `i` holds probe partition `i`'s rows.
//! - `CollectLeft` where it does (a hash- or range-partitioned probe, and a join
//!   type that outputs probe rows only): the build is prepared once and each output
//!   partition probes it with its own probe partition ([`crate::shared_build`]).
//!   The rule makes these unless `spilljoin.prepared_collect_left` is off. With
//!   `spilljoin.distributed` every `CollectLeft` join that outputs probe rows only
//!   runs so: its partitions may be tasks in different processes.
//! - `NOT IN` with `spilljoin.distributed`: a shape `HashJoinExec` has no mode for.
//!   Its outer (left) side keeps its partitions and the subquery (right) is one
//!   partition; output partition `i` is outer partition `i` joined with the whole
//!   subquery (the engine's `NOT IN` builds on the subquery side, and its null and
//!   emptiness facts are the build's alone), so a distributed engine runs a task per
//!   outer partition. In one process the subquery is prepared once for all of them,
//!   as above; as tasks, each prepares its own. The node's properties are then its
//!   own: `HashJoinExec`'s but for the partitioning, the outer side's count.
//!
//! [`SpilljoinExec::try_new`] refuses joins with an output ordering (the engine does
//! not keep the probe's order); the rule leaves them to `HashJoinExec`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, Statistics};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan,
    ExecutionPlanProperties, InputDistributionRequirements, Partitioning, PlanProperties,
};
use datafusion::physical_plan::{ChildStats, StatisticsArgs};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};

use crate::config::SpilljoinConfig;
use crate::execution::{engine_join, Shared};
use crate::metrics::Report;
use crate::run::{Inputs, Run};
use crate::shared_build::{attach as attach_build, BuildHandle, SharedBuild};
use crate::translate::Definition;

/// A hash join that spills: see the module docs.
pub struct SpilljoinExec {
    hash: Arc<HashJoinExec>,
    definition: Arc<Definition>,
    metrics: ExecutionPlanMetricsSet,
    /// The run all partitions of a `CollectLeft` join share (held weakly: see
    /// [`Shared`]).
    shared: Arc<Mutex<Shared>>,
    /// The build all partitions of a `CollectLeft` join that keeps the probe's
    /// partitioning probe (held weakly: see [`SharedBuild`]).
    shared_build: Arc<Mutex<SharedBuild>>,
    /// How many join executions of the plan share the memory pool (see
    /// [`SpilljoinExec::set_pool_share`]).
    pool_share: AtomicUsize,
    /// The `spilljoin.*` settings fixed when the plan was made (see
    /// [`SpilljoinExec::with_settings`]); without them, the executing session's.
    settings: Option<SpilljoinConfig>,
    /// The plan properties: `hash`'s, but for a `NOT IN` per outer partition.
    properties: Arc<PlanProperties>,
}

impl SpilljoinExec {
    /// The spilling join for `hash`'s definition.
    ///
    /// # Errors
    /// `NotImplemented` when it cannot run it with the same plan properties: a
    /// partition mode of `Auto`, an output ordering, a dynamic filter already pushed
    /// to the probe, or keys the engine cannot hash.
    pub fn try_new(hash: Arc<HashJoinExec>) -> Result<Self> {
        check_supported(&hash)?;
        let definition = Arc::new(Definition::new(&hash)?);
        Ok(Self {
            definition,
            metrics: ExecutionPlanMetricsSet::new(),
            shared: Arc::new(Mutex::new(Shared::default())),
            shared_build: Arc::new(Mutex::new(SharedBuild::default())),
            pool_share: AtomicUsize::new(1),
            settings: None,
            properties: Arc::clone(hash.properties()),
            hash,
        })
    }

    /// Runs with `settings` rather than the `spilljoin.*` settings of the session
    /// that executes it: [`SpilljoinRule`](crate::SpilljoinRule) fixes the planning
    /// session's, so that a plan shipped to another process
    /// ([`SpilljoinCodec`](crate::SpilljoinCodec)) runs as it was configured.
    pub fn with_settings(mut self, settings: SpilljoinConfig) -> Self {
        self.properties = match not_in_per_outer_partition(&self.hash, Some(&settings)) {
            true => not_in_properties(&self.hash),
            false => Arc::clone(self.hash.properties()),
        };
        self.settings = Some(settings);
        self
    }

    /// The settings fixed with [`with_settings`](Self::with_settings), if any.
    pub fn settings(&self) -> Option<&SpilljoinConfig> {
        self.settings.as_ref()
    }

    /// The settings fixed with [`with_settings`](Self::with_settings), else the
    /// defaults.
    pub(crate) fn settings_or_default(&self) -> SpilljoinConfig {
        self.settings.clone().unwrap_or_default()
    }

    /// Plans each execution of this join for `1 / executions` of the memory pool's
    /// limit: the executions of all the plan's joins, which run side by side and
    /// each keep a working set for their probe. The pool still decides what each
    /// holds; the share sizes what the engine sets aside (probe headroom, pieces,
    /// output in flight). [`SpilljoinRule`](crate::SpilljoinRule) sets it.
    pub fn set_pool_share(&self, executions: usize) {
        self.pool_share.store(executions.max(1), Ordering::Relaxed);
    }

    /// The join executions that share the pool (1 unless the rule set it).
    pub fn pool_share(&self) -> usize {
        self.pool_share.load(Ordering::Relaxed)
    }

    /// The engine executions this join makes: one per output partition, or one for
    /// all of them (`CollectLeft`). A `CollectLeft` join whose output keeps the
    /// probe's partitioning counts once too: its build, planned for the share, leaves
    /// room for its one-thread probes as for one probe of `target_partitions` threads
    /// (counting a probe per partition halved that room, and the probes of the
    /// `collect_left_keeps_the_probe_partitioning` test ran out of memory).
    pub fn executions(&self) -> usize {
        match self.hash.mode {
            PartitionMode::CollectLeft => 1,
            _ => self.properties().output_partitioning().partition_count(),
        }
    }

    /// Whether this is a `CollectLeft` join that outputs build rows under
    /// `spilljoin.distributed`, whose probe side is then one partition.
    fn outputs_build_rows_in_one_task(&self) -> bool {
        self.settings.as_ref().is_some_and(|s| s.distributed)
            && self.hash.mode == PartitionMode::CollectLeft
            && !outputs_probe_only(&self.hash)
            && !self.per_outer_partition()
    }

    /// Whether this is a `NOT IN` joined per outer partition (see the module docs).
    fn per_outer_partition(&self) -> bool {
        not_in_per_outer_partition(&self.hash, self.settings.as_ref())
    }

    /// The `HashJoinExec` this join executes.
    pub fn hash_join(&self) -> &Arc<HashJoinExec> {
        &self.hash
    }

    /// A spilling join for a new definition, or that definition itself when it is
    /// one the engine cannot run with its properties (the output stays correct).
    fn rewrap(&self, hash: HashJoinExec) -> Arc<dyn ExecutionPlan> {
        let hash = Arc::new(hash);
        match Self::try_new(Arc::clone(&hash)) {
            Ok(exec) => {
                exec.set_pool_share(self.pool_share());
                match &self.settings {
                    Some(settings) => Arc::new(exec.with_settings(settings.clone())),
                    None => Arc::new(exec),
                }
            }
            Err(_) => hash,
        }
    }
}

/// Why `hash` cannot be run with its own plan properties, if it cannot.
fn check_supported(hash: &HashJoinExec) -> Result<()> {
    let refuse = |why: &str| {
        Err(DataFusionError::NotImplemented(format!(
            "SpilljoinExec: {why}"
        )))
    };
    if hash.properties().output_ordering().is_some() {
        return refuse("the join's output is ordered; the engine does not keep the probe's order");
    }
    if !hash.dynamic_expressions_produced().is_empty() {
        return refuse("a dynamic filter has been pushed to the probe side");
    }
    match hash.mode {
        PartitionMode::Partitioned => Ok(()),
        PartitionMode::Auto => refuse("partition mode Auto (run after JoinSelection)"),
        PartitionMode::CollectLeft
            if keeps_probe_partitioning(hash) && !outputs_probe_only(hash) =>
        {
            refuse("a CollectLeft join that keeps the probe's partitioning and outputs build rows")
        }
        PartitionMode::CollectLeft => Ok(()),
    }
}

/// Whether `hash` is a `CollectLeft` join whose output partition `i` must hold the
/// rows of probe partition `i`.
pub(crate) fn keeps_probe_partitioning(hash: &HashJoinExec) -> bool {
    hash.mode == PartitionMode::CollectLeft
        && matches!(
            hash.properties().output_partitioning(),
            Partitioning::Hash(..) | Partitioning::Range(..)
        )
        && hash.right().output_partitioning().partition_count() > 1
}

/// Whether `hash` is a `NOT IN` that runs per outer partition with `settings` (see
/// the module docs): `spilljoin.distributed` and a null-aware `CollectLeft` join.
pub(crate) fn not_in_per_outer_partition(
    hash: &HashJoinExec,
    settings: Option<&SpilljoinConfig>,
) -> bool {
    settings.is_some_and(|s| s.distributed)
        && hash.mode == PartitionMode::CollectLeft
        && hash.null_aware
}

/// The properties of a `NOT IN` per outer partition: `hash`'s equivalences (its
/// output rows are outer rows, as theirs), emission and boundedness, and as many
/// output partitions as the outer side has, of no known partitioning.
fn not_in_properties(hash: &HashJoinExec) -> Arc<PlanProperties> {
    let own = hash.properties();
    let outer = hash.left().output_partitioning().partition_count();
    Arc::new(PlanProperties::new(
        own.eq_properties.clone(),
        Partitioning::UnknownPartitioning(outer),
        own.emission_type,
        own.boundedness,
    ))
}

/// Whether `hash` outputs rows of its probe (right) side only, so each probe
/// partition can be joined alone with the whole build.
pub(crate) fn outputs_probe_only(hash: &HashJoinExec) -> bool {
    use datafusion::common::JoinType as T;
    matches!(
        hash.join_type(),
        T::Inner | T::Right | T::RightSemi | T::RightAnti | T::RightMark
    ) && !hash.null_aware
}

impl fmt::Debug for SpilljoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpilljoinExec")
            .field("hash", &self.hash)
            .finish()
    }
}

impl DisplayAs for SpilljoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => self.hash.fmt_as(t, f),
            _ => {
                let line = displayable(self.hash.as_ref()).one_line().to_string();
                let line = line.trim_end();
                let line = line.strip_prefix("HashJoinExec: ").unwrap_or(line);
                write!(f, "SpilljoinExec: {line}")?;
                if self.per_outer_partition() {
                    write!(f, ", per outer partition")?;
                }
                // A plan made to spill whatever the memory says so (tests, and
                // whoever checks that a cluster took the setting).
                match self.settings.as_ref().map(|s| s.force_spill) {
                    Some(fraction) if fraction > 0.0 => write!(f, ", force_spill={fraction}"),
                    _ => Ok(()),
                }
            }
        }
    }
}

impl ExecutionPlan for SpilljoinExec {
    fn name(&self) -> &'static str {
        "SpilljoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        self.input_distribution_requirements().into_per_child()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        // Distributed, a join that outputs build rows sees every probe row in one
        // task (`spilljoin.distributed`): its probe side must stay one partition
        // when a distributed planner re-enforces distributions stage by stage.
        if self.outputs_build_rows_in_one_task() {
            return InputDistributionRequirements::new(vec![
                Distribution::SinglePartition,
                Distribution::SinglePartition,
            ]);
        }
        if self.per_outer_partition() {
            return InputDistributionRequirements::new(vec![
                Distribution::UnspecifiedDistribution,
                Distribution::SinglePartition,
            ]);
        }
        self.hash.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        // Spilled partitions are joined after the probe: no input order survives.
        vec![false, false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.hash.left(), self.hash.right()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.hash.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut builder = self.hash.builder();
        if matches!(
            options.children_properties,
            ChildrenPropertiesMode::Recompute
        ) {
            builder = builder.recompute_properties();
        }
        Ok(self.rewrap(builder.with_new_children(children)?.build()?))
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.rewrap(self.hash.builder().reset_state().build()?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let partitions = self.properties().output_partitioning().partition_count();
        if partition >= partitions {
            return Err(DataFusionError::Internal(format!(
                "SpilljoinExec: partition {partition} of {partitions}"
            )));
        }
        self.check_collected_inputs()?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let fetch = self.hash.fetch();
        let starting = self.starter(partition, partitions, context);
        let output = futures::stream::once(async move {
            let run = starting.await?;
            Ok::<_, DataFusionError>(output_stream(run, baseline, fetch))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            output,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        match self.per_outer_partition() {
            // Outer partition `partition`, the whole subquery.
            true => vec![ChildStats::At(partition), ChildStats::At(None)],
            false => self.hash.child_stats_requests(partition),
        }
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.hash.statistics_from_inputs(input_stats, args)
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }

    fn fetch(&self) -> Option<usize> {
        self.hash.fetch()
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let hash = self.hash.builder().with_fetch(limit).build().ok()?;
        Some(self.rewrap(hash))
    }
}

impl SpilljoinExec {
    /// Checks that the input a `CollectLeft` join reads whole is one partition (the
    /// subquery of a `NOT IN` per outer partition, else the left input): a plan whose
    /// children were changed without the setting that shaped them would otherwise
    /// read only the first partition.
    fn check_collected_inputs(&self) -> Result<()> {
        if self.hash.mode != PartitionMode::CollectLeft {
            return Ok(());
        }
        let (name, collected) = match self.per_outer_partition() {
            true => ("right (the NOT IN subquery)", self.hash.right()),
            false => ("left", self.hash.left()),
        };
        match collected.output_partitioning().partition_count() {
            1 => Ok(()),
            n => Err(DataFusionError::Internal(format!(
                "SpilljoinExec: the {name} input of a CollectLeft join has {n} partitions, not 1"
            ))),
        }
    }

    /// What starts (or joins) partition `partition`'s run, on its stream's first poll.
    fn starter(
        &self,
        partition: usize,
        partitions: usize,
        context: Arc<TaskContext>,
    ) -> BoxFuture<'static, Result<Option<Arc<Run>>>> {
        let hash = Arc::clone(&self.hash);
        let definition = Arc::clone(&self.definition);
        let report = Report::new(&self.metrics, partition);
        let share = self.pool_share();
        let settings = self.settings.clone();
        let distributed = settings.as_ref().is_some_and(|s| s.distributed);
        if hash.mode == PartitionMode::CollectLeft
            && (keeps_probe_partitioning(&hash)
                || (distributed && outputs_probe_only(&hash))
                || self.per_outer_partition())
        {
            return self.probe_shared_build(partition, partitions, context, report);
        }
        let shared = Arc::clone(&self.shared);
        async move {
            let start = |inputs: Inputs, threads: usize| {
                let join = engine_join(
                    &definition,
                    &context,
                    (partition, threads, share),
                    settings.as_ref(),
                )?;
                Run::start(Arc::clone(&definition), join, inputs, report)
            };
            match hash.mode {
                PartitionMode::CollectLeft => {
                    crate::execution::attach(&shared, partition, partitions, || {
                        let inputs = collect_left_inputs(&hash, &definition, &context)?;
                        start(inputs, context.session_config().target_partitions())
                    })
                }
                _ => {
                    let left = hash.left().execute(partition, Arc::clone(&context))?;
                    let right = hash.right().execute(partition, Arc::clone(&context))?;
                    let inputs = match definition.swapped {
                        false => Inputs {
                            left: vec![left],
                            right: vec![right],
                        },
                        true => Inputs {
                            left: vec![right],
                            right: vec![left],
                        },
                    };
                    start(inputs, 1).map(Some)
                }
            }
        }
        .boxed()
    }

    /// Partition `partition`'s run where the output keeps the probe's partitioning
    /// (or is a `NOT IN` per outer partition): the shared prepared build (started by
    /// the first partition), probed with this partition's probe input alone.
    fn probe_shared_build(
        &self,
        partition: usize,
        partitions: usize,
        context: Arc<TaskContext>,
        report: Report,
    ) -> BoxFuture<'static, Result<Option<Arc<Run>>>> {
        let hash = Arc::clone(&self.hash);
        let definition = Arc::clone(&self.definition);
        let share = self.pool_share();
        let settings = self.settings.clone();
        let shared = Arc::clone(&self.shared_build);
        let metrics = self.metrics.clone();
        // The engine builds on DataFusion's left input, its own right for `RightMark`
        // (see `crate::translate`); a `NOT IN` per outer partition on the subquery,
        // DataFusion's right input, probed with the outer partitions.
        let (build_child, probe_child) = match self.per_outer_partition() {
            false => (Arc::clone(hash.left()), Arc::clone(hash.right())),
            true => (Arc::clone(hash.right()), Arc::clone(hash.left())),
        };
        let build_is_left = !definition.swapped && !self.per_outer_partition();
        async move {
            let threads = context.session_config().target_partitions();
            let start = || {
                let join = engine_join(
                    &definition,
                    &context,
                    (partition, threads, share),
                    settings.as_ref(),
                )?;
                let input = build_child.execute(0, Arc::clone(&context))?;
                let report = Report::new(&metrics, partition);
                let definition = Arc::clone(&definition);
                BuildHandle::start(definition, join, input, build_is_left, report)
            };
            let build = attach_build(&shared, partition, partitions, start)?;
            let prepared = build.prepared().await?;
            let join = engine_join(
                &definition,
                &context,
                (partition, 1, share),
                settings.as_ref(),
            )?;
            let probe = probe_child.execute(partition, Arc::clone(&context))?;
            let probe_is_left = !build_is_left;
            Run::start_probe(
                definition,
                join,
                prepared,
                probe,
                probe_is_left,
                build,
                report,
            )
            .map(Some)
        }
        .boxed()
    }
}

/// The inputs of the one run of a `CollectLeft` join: the left partition and every
/// right partition.
fn collect_left_inputs(
    hash: &HashJoinExec,
    definition: &Definition,
    context: &Arc<TaskContext>,
) -> Result<Inputs> {
    let left = vec![hash.left().execute(0, Arc::clone(context))?];
    let right = (0..hash.right().output_partitioning().partition_count())
        .map(|i| hash.right().execute(i, Arc::clone(context)))
        .collect::<Result<Vec<_>>>()?;
    Ok(match definition.swapped {
        false => Inputs { left, right },
        true => Inputs {
            left: right,
            right: left,
        },
    })
}

/// One output partition's stream of a run: its batches, at most `fetch` rows (none
/// without a run: a `CollectLeft` run that gave all its output to other partitions).
fn output_stream(
    run: Option<Arc<Run>>,
    baseline: BaselineMetrics,
    fetch: Option<usize>,
) -> futures::stream::BoxStream<'static, Result<arrow_array::RecordBatch>> {
    let remaining = fetch.unwrap_or(usize::MAX);
    futures::stream::unfold(
        (run, baseline, remaining),
        |(run, baseline, remaining)| async move {
            let Some(current) = run else {
                baseline.done();
                return None;
            };
            let item = match remaining {
                0 => None,
                _ => current.next().await,
            };
            let Some(item) = item else {
                baseline.done();
                // Dropping the run here (the last stream's) stops the join and
                // removes its files before the stream reports its end.
                drop(current);
                return None;
            };
            let item = item.map(|batch| {
                let batch = match batch.num_rows() > remaining {
                    true => batch.slice(0, remaining),
                    false => batch,
                };
                // Rows, batches and bytes, as DataFusion's operators record them.
                (&batch).record_output(&baseline);
                batch
            });
            let left = remaining - item.as_ref().map_or(0, |b| b.num_rows());
            Some((item, (Some(current), baseline, left)))
        },
    )
    .boxed()
}
