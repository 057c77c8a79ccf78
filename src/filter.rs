//! Residual (non-equi) join filters.
//!
//! A [`JoinFilter`] is a predicate over some columns of both inputs, such as
//! `left.price > right.limit`. It runs after the hash lookup: candidate pairs whose
//! keys are equal are gathered into an intermediate batch (only the columns the filter
//! names, at most one output batch of pairs at a time, so that a key with a huge
//! fan-out never materializes an unbounded batch), the predicate is evaluated over the
//! whole batch at once, and a pair counts only where it returned `true` (null counts
//! as false).
//!
//! For outer, semi, anti and mark joins "matched" means *matched and passed*: a left
//! row of a left join whose only candidates fail the filter is output once, with nulls
//! on the right, exactly as SQL's `ON a.k = b.k AND <filter>` does.

use std::fmt;
use std::sync::Arc;

use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array};
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};
use arrow_select::take::take;

use crate::error::{JoinError, Result, Side};

/// A vectorized predicate over the intermediate batch of a [`JoinFilter`].
pub trait FilterPredicate: Send + Sync {
    /// Evaluates the predicate over every row of `batch`, whose columns are the
    /// filter's columns in order.
    ///
    /// # Errors
    /// Whatever the predicate reports; the join fails with [`JoinError::Filter`].
    fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError>;
}

impl<F> FilterPredicate for F
where
    F: Fn(&RecordBatch) -> Result<BooleanArray, ArrowError> + Send + Sync,
{
    fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
        self(batch)
    }
}

/// A residual filter: the columns it reads and the predicate over them.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use arrow_array::{cast::AsArray, types::Int64Type};
/// use arrow_ord::cmp::gt;
/// use spilljoin::{JoinFilter, Side};
///
/// // left column 1 > right column 2
/// let filter = JoinFilter::new(vec![(Side::Left, 1), (Side::Right, 2)], |batch: &arrow_array::RecordBatch| {
///     gt(batch.column(0), batch.column(1))
/// });
/// assert_eq!(filter.columns().len(), 2);
/// ```
#[derive(Clone)]
pub struct JoinFilter {
    columns: Vec<(Side, usize)>,
    predicate: Arc<dyn FilterPredicate>,
}

impl fmt::Debug for JoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinFilter")
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl JoinFilter {
    /// A filter reading `columns` (input side and column index in that input), in the
    /// order the predicate sees them.
    pub fn new(columns: Vec<(Side, usize)>, predicate: impl FilterPredicate + 'static) -> Self {
        Self {
            columns,
            predicate: Arc::new(predicate),
        }
    }

    /// The columns the filter reads.
    pub fn columns(&self) -> &[(Side, usize)] {
        &self.columns
    }

    /// The schema of the intermediate batch the predicate sees: the named columns,
    /// nullable.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] when a column index is out of range.
    pub fn intermediate_schema(&self, left: &Schema, right: &Schema) -> Result<SchemaRef> {
        let fields = self
            .columns
            .iter()
            .map(|&(side, index)| {
                let schema = if side == Side::Left { left } else { right };
                schema
                    .fields()
                    .get(index)
                    .map(|f| Field::new(f.name(), f.data_type().clone(), true))
                    .ok_or_else(|| {
                        JoinError::InvalidJoin(format!(
                            "the filter reads column {index} of the {side} input, which has {} columns",
                            schema.fields().len()
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// A [`JoinFilter`] resolved to build and probe columns.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedFilter {
    /// `(is_build, column)` per filter column.
    columns: Vec<(bool, usize)>,
    schema: SchemaRef,
    filter: JoinFilter,
}

impl ResolvedFilter {
    pub fn new(filter: JoinFilter, build: Side, left: &Schema, right: &Schema) -> Result<Self> {
        let schema = filter.intermediate_schema(left, right)?;
        let columns = filter
            .columns
            .iter()
            .map(|&(side, index)| (side == build, index))
            .collect();
        Ok(Self {
            columns,
            schema,
            filter,
        })
    }

    /// Evaluates the filter over the candidate pairs `(probe_rows[i], build_rows[i])`
    /// and returns, per pair, whether it passed (nulls are false).
    pub fn evaluate(
        &self,
        probe: &RecordBatch,
        probe_rows: &UInt32Array,
        build: &RecordBatch,
        build_rows: &UInt32Array,
    ) -> Result<BooleanArray> {
        let columns = self
            .columns
            .iter()
            .zip(self.schema.fields())
            .map(|(&(is_build, index), field)| {
                let taken = if is_build {
                    take(build.column(index), build_rows, None)?
                } else {
                    take(probe.column(index), probe_rows, None)?
                };
                // (A build partition may be held in the spill files' form.)
                spilljoin_spill::widen_column(&taken, field.data_type())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        let result = self
            .filter
            .predicate
            .evaluate(&batch)
            .map_err(|e| JoinError::Filter {
                message: e.to_string(),
                source: Some(e),
            })?;
        if result.len() != probe_rows.len() {
            return Err(JoinError::Filter {
                message: format!(
                    "the predicate returned {} values for {} rows",
                    result.len(),
                    probe_rows.len()
                ),
                source: None,
            });
        }
        Ok(match result.nulls() {
            Some(nulls) if nulls.null_count() > 0 => {
                BooleanArray::new(result.values() & nulls.inner(), None)
            }
            _ => result,
        })
    }
}
