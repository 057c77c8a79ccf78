//! From a `HashJoinExec`'s definition to spilljoin's: join type, build side, keys,
//! residual filter, projection, and the batches on either side of the engine.
//!
//! ```text
//!  DataFusion batch (input schema) ─► InputMap: columns renamed to their index
//!      ("0", "1", ...), non-column keys evaluated and appended ("k0", ...) ─► engine
//!  engine output (its own names) ─► the HashJoinExec's output schema, same columns
//! ```
//!
//! Renaming makes keys and filter columns positional, so duplicate or odd column
//! names in DataFusion schemas cannot confuse the engine's lookup by name; the output
//! gets DataFusion's names, nullability and metadata back unchanged.
//!
//! Join types: DataFusion builds on the left, and so does the engine here, with two
//! exceptions. `RightMark` has no engine type of its own: the inputs swap and it runs
//! as the engine's `LeftMark` with the right (DataFusion's left) building. A
//! null-aware `LeftAnti` (`NOT IN`) builds on the subquery (right) side, the
//! orientation `HashJoinExec` cannot take: memory then grows with the subquery, and
//! the outer rows stream.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};
use datafusion::common::NullEquality as DfNullEquality;
use datafusion::common::{DataFusionError, JoinSide, JoinType as DfJoinType, Result};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::JoinFilter as DfJoinFilter;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use spilljoin::{HashJoinBuilder, InputStatistics, JoinFilter, JoinType, NullEquality, Side};

/// How one input's batches become the engine's: renamed columns plus evaluated keys.
#[derive(Debug)]
pub(crate) struct InputMap {
    /// The engine's schema of this input.
    schema: SchemaRef,
    /// Key expressions that are not plain columns, appended in order.
    computed: Vec<PhysicalExprRef>,
}

impl InputMap {
    /// The batch as the engine sees it.
    pub(crate) fn apply(&self, batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
        let rows = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        for expr in &self.computed {
            let value = expr.evaluate(&batch).map_err(to_arrow)?;
            columns.push(value.into_array(rows).map_err(to_arrow)?);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
    }

    /// The engine's schema of this input.
    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// A `HashJoinExec` in the engine's terms.
#[derive(Debug)]
pub(crate) struct Definition {
    /// The join without pool, spill manager, threads or batch size (set per execution).
    pub builder: HashJoinBuilder,
    /// Whether the engine's left input is DataFusion's right (`RightMark`).
    pub swapped: bool,
    /// The engine's left and right inputs.
    pub left: InputMap,
    /// See `left`.
    pub right: InputMap,
    /// The schema of the output batches, as `HashJoinExec` reports it.
    pub output: SchemaRef,
}

impl Definition {
    /// Translates `hash`.
    ///
    /// # Errors
    /// `NotImplemented` for a definition the engine cannot run (a key type it does not
    /// hash, `PartitionMode::Auto`); the rule then keeps the `HashJoinExec`.
    pub(crate) fn new(hash: &HashJoinExec) -> Result<Self> {
        let swapped = *hash.join_type() == DfJoinType::RightMark;
        let (join_type, build) = engine_join_type(*hash.join_type(), hash.null_aware)?;
        let (df_first, df_second) = (hash.left().schema(), hash.right().schema());
        let (first_schema, second_schema) = match swapped {
            false => (df_first, df_second),
            true => (df_second, df_first),
        };
        let pairs: Vec<(PhysicalExprRef, PhysicalExprRef)> = hash
            .on()
            .iter()
            .map(|(l, r)| match swapped {
                false => (Arc::clone(l), Arc::clone(r)),
                true => (Arc::clone(r), Arc::clone(l)),
            })
            .collect();
        let (left, left_keys) = input_map(&first_schema, pairs.iter().map(|p| &p.0))?;
        let (right, right_keys) = input_map(&second_schema, pairs.iter().map(|p| &p.1))?;
        let on: Vec<(String, String)> = left_keys.into_iter().zip(right_keys).collect();
        let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), on)
            .with_join_type(join_type)
            .with_null_equality(match hash.null_equality() {
                DfNullEquality::NullEqualsNothing => NullEquality::NullEqualsNothing,
                DfNullEquality::NullEqualsNull => NullEquality::NullEqualsNull,
            })
            .with_build_side(build);
        // Per execution: one partition of each input, or all of a collected left.
        let collected = *hash.partition_mode() == PartitionMode::CollectLeft;
        let (first_rows, second_rows) = (
            rows_estimate(hash.left(), !collected),
            rows_estimate(hash.right(), true),
        );
        builder = match swapped {
            false => builder.with_statistics(first_rows, second_rows),
            true => builder.with_statistics(second_rows, first_rows),
        };
        if let Some(filter) = hash.filter() {
            builder = builder.with_filter(engine_filter(filter, swapped));
        }
        if let Some(projection) = hash.projection.as_ref() {
            builder = builder.with_projection(projection.iter().copied().collect());
        }
        // Fail now, at planning, on what the engine refuses (key types, mostly).
        builder
            .clone()
            .build()
            .map_err(|e| DataFusionError::NotImplemented(format!("SpilljoinExec: {e}")))?;
        Ok(Self {
            builder,
            swapped,
            left,
            right,
            output: datafusion::physical_plan::ExecutionPlan::schema(hash),
        })
    }

    /// An engine output batch with DataFusion's output schema.
    pub(crate) fn output_batch(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.output),
            batch.columns().to_vec(),
            &options,
        )?)
    }
}

/// The rows DataFusion expects of `input` (exact or estimated), as engine statistics
/// of one execution: all of them, or a partition's share (`per_partition`). Rows only,
/// since DataFusion's byte sizes are not the Arrow bytes of the columns the join
/// reads. The engine joins a small build in one partition
/// (`spilljoin::SMALL_BUILD_ROWS`) and sizes the bloom filters of spilled partitions
/// by the rows: an estimate too low costs speed (a build that turns out large is
/// split when it spills), one too high memory set aside for filters; neither changes
/// the answer.
fn rows_estimate(input: &Arc<dyn ExecutionPlan>, per_partition: bool) -> InputStatistics {
    let partitions = match per_partition {
        true => input.output_partitioning().partition_count().max(1),
        false => 1,
    };
    let rows = StatisticsContext::new()
        .compute(input.as_ref(), &StatisticsArgs::new())
        .ok()
        .and_then(|stats| stats.num_rows.get_value().copied())
        .and_then(|rows| u64::try_from(rows / partitions).ok());
    InputStatistics::new(None, rows)
}

/// The engine's join type and build side for DataFusion's `join_type`.
fn engine_join_type(join_type: DfJoinType, null_aware: bool) -> Result<(JoinType, Side)> {
    use DfJoinType as D;
    Ok(match (join_type, null_aware) {
        (D::LeftAnti, true) => (JoinType::LeftNotIn, Side::Right),
        (_, true) => {
            return Err(DataFusionError::NotImplemented(format!(
                "SpilljoinExec: a null-aware {join_type} join"
            )))
        }
        (D::Inner, _) => (JoinType::Inner, Side::Left),
        (D::Left, _) => (JoinType::Left, Side::Left),
        (D::Right, _) => (JoinType::Right, Side::Left),
        (D::Full, _) => (JoinType::Full, Side::Left),
        (D::LeftSemi, _) => (JoinType::LeftSemi, Side::Left),
        (D::RightSemi, _) => (JoinType::RightSemi, Side::Left),
        (D::LeftAnti, _) => (JoinType::LeftAnti, Side::Left),
        (D::RightAnti, _) => (JoinType::RightAnti, Side::Left),
        (D::LeftMark, _) => (JoinType::LeftMark, Side::Left),
        // Swapped inputs: the engine's right input is DataFusion's left.
        (D::RightMark, _) => (JoinType::LeftMark, Side::Right),
    })
}

/// The engine's view of an input with these key expressions, and the keys' names.
fn input_map<'a>(
    schema: &SchemaRef,
    keys: impl Iterator<Item = &'a PhysicalExprRef>,
) -> Result<(InputMap, Vec<String>)> {
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| f.as_ref().clone().with_name(i.to_string()))
        .collect();
    let mut computed = Vec::new();
    let mut names = Vec::new();
    for key in keys {
        match key.downcast_ref::<Column>() {
            Some(column) if column.index() < schema.fields().len() => {
                names.push(column.index().to_string())
            }
            _ => {
                let name = format!("k{}", computed.len());
                fields.push(Field::new(
                    &name,
                    key.data_type(schema)?,
                    key.nullable(schema)?,
                ));
                computed.push(Arc::clone(key));
                names.push(name);
            }
        }
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok((InputMap { schema, computed }, names))
}

/// DataFusion's residual filter as the engine's: the same columns, the same
/// expression, evaluated over the engine's intermediate batches.
fn engine_filter(filter: &DfJoinFilter, swapped: bool) -> JoinFilter {
    let columns = filter
        .column_indices()
        .iter()
        .map(|c| {
            let left = matches!(c.side, JoinSide::Left) != swapped;
            (if left { Side::Left } else { Side::Right }, c.index)
        })
        .collect();
    // Every field nullable: the engine's intermediate batch is nullable (outer rows),
    // and the expression reads columns by index, not by nullability.
    let schema = Arc::new(Schema::new(
        filter
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let expression = Arc::clone(filter.expression());
    JoinFilter::new(columns, move |batch: &RecordBatch| {
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&schema),
            batch.columns().to_vec(),
            &options,
        )?;
        let value = expression.evaluate(&batch).map_err(to_arrow)?;
        let array = value.into_array(batch.num_rows()).map_err(to_arrow)?;
        array.as_boolean_opt().cloned().ok_or_else(|| {
            ArrowError::InvalidArgumentError(format!(
                "the join filter {expression} returned {}, not booleans",
                array.data_type()
            ))
        })
    })
}

/// A DataFusion error inside an Arrow one, to travel through the engine (which hands
/// it back unchanged: see `crate::error`).
pub(crate) fn to_arrow(e: DataFusionError) -> ArrowError {
    ArrowError::ExternalError(Box::new(e))
}
