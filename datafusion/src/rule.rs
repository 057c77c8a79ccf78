//! `SpilljoinRule`: the physical optimizer rule that puts [`SpilljoinExec`] where
//! DataFusion planned a `HashJoinExec`; [`CollectLeftRule`], which first plans the
//! joins DataFusion would partition by key as one execution each; and
//! [`with_spilljoin`], which installs both.
//!
//! Where it runs: after `JoinSelection` (which chose the build side and the partition
//! mode) and every rule that rewrites joins or their projections and limits, and
//! *before* the post-optimization `FilterPushdown`, which is where `HashJoinExec`
//! creates the dynamic filter it pushes to its probe scan. The spilling join does
//! not make dynamic filters: a probe row the build cannot match is dropped by the
//! engine's bloom filters instead, also for spilled partitions. Joins the engine
//! cannot run with the same plan properties (see [`SpilljoinExec::try_new`]) stay
//! `HashJoinExec`s.
//!
//! It also tells each join how many join executions share the pool
//! ([`SpilljoinExec::set_pool_share`]): under a limit, each plans its working set for
//! its share, not for the whole pool.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::Result;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::ExecutionPlanProperties;

use crate::config::SpilljoinConfig;
use crate::exec::{keeps_probe_partitioning, outputs_probe_only};
use crate::SpilljoinExec;

/// Replaces every `HashJoinExec` it can by a [`SpilljoinExec`] (see the module
/// docs); off with `SET spilljoin.enabled = false`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpilljoinRule;

impl SpilljoinRule {
    /// The rule.
    pub fn new() -> Self {
        Self
    }
}

impl PhysicalOptimizerRule for SpilljoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let settings = SpilljoinConfig::from_session(config);
        if !settings.enabled {
            return Ok(plan);
        }
        let plan = plan
            .transform_up(|node| {
                let Some(hash) = node.downcast_ref::<HashJoinExec>() else {
                    return Ok(Transformed::no(node));
                };
                if keeps_probe_partitioning(hash)
                    && (!settings.prepared_collect_left
                        || build_is_under(hash, settings.prepared_collect_left_min_bytes))
                {
                    return Ok(Transformed::no(node));
                }
                let partitions = hash.properties().output_partitioning().partition_count();
                // The builder keeps every field of the node, its properties included.
                let hash = Arc::new(match settings.distributed {
                    true => distributed_shape(hash)?,
                    false => hash.builder().build()?,
                });
                Ok(match SpilljoinExec::try_new(hash) {
                    Ok(exec) => {
                        let exec = Arc::new(exec.with_settings(settings.clone()));
                        Transformed::yes(single_where_it_was(exec, partitions))
                    }
                    Err(_) => Transformed::no(node),
                })
            })
            .data()?;
        let joins = spilling_joins(&plan);
        let executions = joins.iter().map(|j| j.executions()).sum();
        for join in joins {
            join.set_pool_share(executions);
        }
        Ok(plan)
    }

    fn name(&self) -> &str {
        "SpilljoinRule"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Makes the `Partitioned` hash joins `CollectLeft` (`spilljoin.collect_left`), right
/// after `JoinSelection` chose the modes and before `EnsureRequirements` repartitions
/// the inputs for them, so that the plan above is built for the join's real
/// partitioning. A `Partitioned` join runs one engine execution per partition on
/// inputs a `RepartitionExec` first hashed by key, which under a limit spills both
/// inputs on its own before the joins spill them again; the engine partitions by the
/// same hash itself, so one execution on every thread does that work once
/// (DataFusion's own failing workload, "SQL through DataFusion" in `BENCHMARKS.md`).
/// Joins with an output ordering keep their mode: the engine does
/// not keep it, so [`SpilljoinRule`] leaves them to `HashJoinExec`, which should not
/// then have to hold a whole build.
#[derive(Debug, Default, Clone, Copy)]
pub struct CollectLeftRule;

impl PhysicalOptimizerRule for CollectLeftRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let settings = SpilljoinConfig::from_session(config);
        if !settings.enabled || !settings.collect_left || settings.distributed {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(hash) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if hash.mode != PartitionMode::Partitioned
                || hash.properties().output_ordering().is_some()
            {
                return Ok(Transformed::no(node));
            }
            let collect_left = hash
                .builder()
                .with_partition_mode(PartitionMode::CollectLeft)
                .build()?;
            Ok(Transformed::yes(
                Arc::new(collect_left) as Arc<dyn ExecutionPlan>
            ))
        })
        .data()
    }

    fn name(&self) -> &str {
        "SpilljoinCollectLeft"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `hash` as a distributed engine can run it (`spilljoin.distributed`). A `NOT IN`
/// gets back its outer (left) side's partitions and has its subquery (right)
/// coalesced: each outer partition is joined with the whole subquery
/// ([`SpilljoinExec`]'s module docs). Not where a limit holds the outer side in one
/// partition: one on the coalesce (`LIMIT` in the outer query, pushed down), or on
/// the join itself, which would then apply to each partition; such a `NOT IN` runs
/// in one task, its subquery coalesced all the same. Another `CollectLeft` join that
/// outputs build rows gets its probe side coalesced to one partition, so that one
/// task sees every probe row before it outputs the build rows none matched. (In one process the
/// partitions share one run instead; as tasks of a distributed engine each would
/// output them, some wrongly.)
fn distributed_shape(hash: &HashJoinExec) -> Result<HashJoinExec> {
    if hash.mode == PartitionMode::CollectLeft && hash.null_aware {
        let outer = hash.left();
        let outer = match outer.downcast_ref::<CoalescePartitionsExec>() {
            Some(coalesced) if coalesced.fetch().is_none() && hash.fetch().is_none() => {
                Arc::clone(coalesced.input())
            }
            _ => Arc::clone(outer),
        };
        let subquery = one_partition(hash.right());
        return hash
            .builder()
            .with_new_children(vec![outer, subquery])?
            .build();
    }
    if hash.mode != PartitionMode::CollectLeft || outputs_probe_only(hash) {
        return hash.builder().build();
    }
    let probe = one_partition(hash.right());
    hash.builder()
        .with_new_children(vec![Arc::clone(hash.left()), probe])?
        .build()
}

/// `plan` as one partition: coalesced if it has more, an empty plan of its schema
/// if it has none.
fn one_partition(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    match plan.output_partitioning().partition_count() {
        0 => Arc::new(EmptyExec::new(plan.schema())),
        1 => Arc::clone(plan),
        _ => Arc::new(CoalescePartitionsExec::new(Arc::clone(plan))),
    }
}

/// `join`, coalesced where the `HashJoinExec` it replaced had one output partition
/// and it has more (a `NOT IN` per outer partition): the plan above may rely on one.
fn single_where_it_was(join: Arc<SpilljoinExec>, partitions: usize) -> Arc<dyn ExecutionPlan> {
    let join: Arc<dyn ExecutionPlan> = join;
    match partitions {
        1 => one_partition(&join),
        _ => join,
    }
}

/// Every [`SpilljoinExec`] in `plan`.
fn spilling_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&SpilljoinExec> {
    let mut joins: Vec<&SpilljoinExec> = plan.downcast_ref::<SpilljoinExec>().into_iter().collect();
    for child in plan.children() {
        joins.extend(spilling_joins(child));
    }
    joins
}

/// Whether DataFusion's statistics put `hash`'s build (left) input under `bytes`:
/// its bytes, or else its rows at the widths of its columns (a variable-width value
/// taken as [`VARIABLE_WIDTH_GUESS`] bytes; a filter above a scan leaves only rows).
/// Unknown sizes are not under.
fn build_is_under(hash: &HashJoinExec, bytes: usize) -> bool {
    let build = hash.left();
    let Ok(stats) = StatisticsContext::new().compute(build.as_ref(), &StatisticsArgs::new()) else {
        return false;
    };
    if let Some(&size) = stats.total_byte_size.get_value() {
        return size < bytes;
    }
    let row_bytes: usize = build
        .schema()
        .fields()
        .iter()
        .map(|f| {
            f.data_type()
                .primitive_width()
                .unwrap_or(VARIABLE_WIDTH_GUESS)
        })
        .sum();
    stats
        .num_rows
        .get_value()
        .is_some_and(|&rows| rows.saturating_mul(row_bytes.max(1)) < bytes)
}

/// The bytes a value of a column of no fixed width is taken to hold when only a
/// build's rows are known ([`build_is_under`]).
const VARIABLE_WIDTH_GUESS: usize = 32;

/// DataFusion's default physical optimizer rules with [`SpilljoinRule`] in its place
/// (before the post-optimization filter pushdown) and [`CollectLeftRule`] in its
/// (right after `JoinSelection`).
pub fn physical_optimizer_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = PhysicalOptimizer::new().rules;
    if let Some(selection) = rules
        .iter()
        .position(|rule| rule.name() == "join_selection")
    {
        rules.insert(selection + 1, Arc::new(CollectLeftRule));
    }
    let at = rules
        .iter()
        .rposition(|rule| rule.name().starts_with("FilterPushdown"))
        .or_else(|| {
            rules
                .iter()
                .position(|rule| rule.name() == "SanityCheckPlan")
        })
        .unwrap_or(rules.len());
    rules.insert(at, Arc::new(SpilljoinRule));
    rules
}

/// Installs the spilling join on a session: [`SpilljoinRule`] among the default
/// physical optimizer rules, and the `spilljoin.*` settings on its configuration
/// (keeping any already there), with `RepartitionExec`'s spill files closed after
/// each batch unless the session chose their size
/// ([`with_spilljoin_config`](crate::with_spilljoin_config): DataFusion 55.2's
/// repartition otherwise stalls now and then under a memory limit).
///
/// ```
/// use datafusion::execution::session_state::SessionStateBuilder;
/// use datafusion::prelude::SessionContext;
///
/// let state = spilljoin_datafusion::with_spilljoin(SessionStateBuilder::new().with_default_features()).build();
/// let ctx = SessionContext::new_with_state(state);
/// # let _ = ctx;
/// ```
pub fn with_spilljoin(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    let config = builder.config().take().unwrap_or_default();
    builder
        .with_config(crate::config::with_spilljoin_config(config))
        .with_physical_optimizer_rules(physical_optimizer_rules())
}
