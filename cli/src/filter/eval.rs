//! The typed expression tree of `--filter` and its vectorised evaluation with
//! Arrow's compute kernels.
//!
//! Every node knows its type (fixed when the filter is lowered, before the join
//! runs); evaluation over a batch of candidate pairs returns an array, or a
//! one-row "scalar" for a constant part, which kernels take as a [`Scalar`] datum
//! without repeating it per row. SQL's three-valued logic comes from the Kleene
//! kernels: `NULL AND false` is false, `NULL OR true` is true, `x IN (1, NULL)` is
//! true or NULL. Division and remainder by zero are NULL, as in DuckDB, rather than
//! an error that would stop the join.

use std::sync::Arc;

use arrow_arith::boolean::{and_kleene, is_not_null, is_null, not, or_kleene};
use arrow_array::{
    cast::AsArray, Array, ArrayRef, BooleanArray, Datum, RecordBatch, Scalar, UInt32Array,
};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::{ArrowError, DataType};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `<>`, `!=`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
    /// `IS DISTINCT FROM`
    Distinct,
    /// `IS NOT DISTINCT FROM`
    NotDistinct,
}

/// An arithmetic operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
}

/// A typed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    /// Column `index` of the filter's batch.
    Column {
        /// Index into the batch the predicate sees.
        index: usize,
        /// Its type.
        data_type: DataType,
    },
    /// A constant: a one-row array.
    Literal(ArrayRef),
    /// A comparison; both sides have one type.
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// Arithmetic of two operands (cast as needed); `data_type` is the result's.
    Arith {
        /// The operator.
        op: ArithOp,
        /// Left operand.
        left: Box<Expr>,
        /// Right operand.
        right: Box<Expr>,
        /// The result type.
        data_type: DataType,
    },
    /// `a AND b`
    And(Box<Expr>, Box<Expr>),
    /// `a OR b`
    Or(Box<Expr>, Box<Expr>),
    /// `NOT a`
    Not(Box<Expr>),
    /// `-a`
    Negate(Box<Expr>),
    /// `a IS NULL`, or `IS NOT NULL` if negated.
    IsNull(Box<Expr>, bool),
    /// `a IS TRUE` (`value` true) or `IS FALSE`: never null.
    IsBool(Box<Expr>, bool),
    /// `a LIKE p` (`ILIKE` if case-insensitive; `NOT` if negated).
    Like {
        /// The string.
        expr: Box<Expr>,
        /// The pattern, of the string's type.
        pattern: Box<Expr>,
        /// `NOT LIKE`.
        negated: bool,
        /// `ILIKE`.
        case_insensitive: bool,
    },
    /// `CAST(a AS t)`; `safe` gives null where a value does not convert (`TRY_CAST`).
    Cast {
        /// The value.
        expr: Box<Expr>,
        /// The target type.
        to: DataType,
        /// Null instead of an error for values that do not convert.
        safe: bool,
    },
}

/// The result of evaluating an expression: an array of the batch's length, or a
/// single value that holds for every row.
#[derive(Debug, Clone)]
pub enum Value {
    /// One value per row.
    Array(ArrayRef),
    /// One value for all rows (a one-row array).
    Scalar(ArrayRef),
}

impl Value {
    fn array(&self) -> &ArrayRef {
        match self {
            Value::Array(a) | Value::Scalar(a) => a,
        }
    }

    /// An array of `rows` values.
    fn into_array(self, rows: usize) -> Result<ArrayRef, ArrowError> {
        match self {
            Value::Array(a) => Ok(a),
            Value::Scalar(s) => {
                let indices = UInt32Array::from(vec![0u32; rows]);
                arrow_select::take::take(&s, &indices, None)
            }
        }
    }

    fn is_scalar(&self) -> bool {
        matches!(self, Value::Scalar(_))
    }
}

/// Applies a kernel over two values, passing constants as scalars.
fn binary(
    l: &Value,
    r: &Value,
    kernel: impl Fn(&dyn Datum, &dyn Datum) -> Result<ArrayRef, ArrowError>,
) -> Result<Value, ArrowError> {
    let result = match (l, r) {
        (Value::Array(a), Value::Array(b)) => kernel(a, b)?,
        (Value::Array(a), Value::Scalar(b)) => kernel(a, &Scalar::new(Arc::clone(b)))?,
        (Value::Scalar(a), Value::Array(b)) => kernel(&Scalar::new(Arc::clone(a)), b)?,
        (Value::Scalar(a), Value::Scalar(b)) => return Ok(Value::Scalar(kernel(a, b)?)),
    };
    Ok(Value::Array(result))
}

/// Applies a kernel over one value.
fn unary(
    v: &Value,
    kernel: impl Fn(&dyn Array) -> Result<ArrayRef, ArrowError>,
) -> Result<Value, ArrowError> {
    Ok(match v {
        Value::Array(a) => Value::Array(kernel(a.as_ref())?),
        Value::Scalar(a) => Value::Scalar(kernel(a.as_ref())?),
    })
}

fn boolean(a: BooleanArray) -> ArrayRef {
    Arc::new(a)
}

impl Expr {
    /// The type of the expression's values.
    pub fn data_type(&self) -> DataType {
        match self {
            Expr::Column { data_type, .. } | Expr::Arith { data_type, .. } => data_type.clone(),
            Expr::Literal(a) => a.data_type().clone(),
            Expr::Negate(e) => e.data_type(),
            Expr::Cast { to, .. } => to.clone(),
            Expr::Compare(..)
            | Expr::And(..)
            | Expr::Or(..)
            | Expr::Not(_)
            | Expr::IsNull(..)
            | Expr::IsBool(..)
            | Expr::Like { .. } => DataType::Boolean,
        }
    }

    /// Whether the expression reads no column.
    pub fn is_constant(&self) -> bool {
        match self {
            Expr::Column { .. } => false,
            Expr::Literal(_) => true,
            Expr::Compare(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
                a.is_constant() && b.is_constant()
            }
            Expr::Arith { left, right, .. } => left.is_constant() && right.is_constant(),
            Expr::Like { expr, pattern, .. } => expr.is_constant() && pattern.is_constant(),
            Expr::Not(e) | Expr::Negate(e) | Expr::IsNull(e, _) | Expr::IsBool(e, _) => {
                e.is_constant()
            }
            Expr::Cast { expr, .. } => expr.is_constant(),
        }
    }

    /// Evaluates the predicate over `batch`: one boolean per row (null counts as
    /// false for the join).
    ///
    /// # Errors
    /// A kernel's error: an overflow, a value `CAST` cannot convert.
    pub fn predicate(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
        let array = self.evaluate(batch)?.into_array(batch.num_rows())?;
        Ok(array.as_boolean().clone())
    }

    /// Evaluates the expression over `batch`.
    ///
    /// # Errors
    /// As [`Expr::predicate`].
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<Value, ArrowError> {
        match self {
            Expr::Column { index, .. } => Ok(Value::Array(Arc::clone(batch.column(*index)))),
            Expr::Literal(a) => Ok(Value::Scalar(Arc::clone(a))),
            Expr::Compare(op, a, b) => {
                let (a, b) = (a.evaluate(batch)?, b.evaluate(batch)?);
                binary(&a, &b, |l, r| compare(*op, l, r).map(boolean))
            }
            Expr::Arith {
                op, left, right, ..
            } => {
                let (l, mut r) = (left.evaluate(batch)?, right.evaluate(batch)?);
                if matches!(op, ArithOp::Div | ArithOp::Rem) {
                    r = null_zeros(r)?;
                }
                binary(&l, &r, |l, r| arith(*op, l, r))
            }
            Expr::And(a, b) => kleene(a.evaluate(batch)?, b.evaluate(batch)?, batch, and_kleene),
            Expr::Or(a, b) => kleene(a.evaluate(batch)?, b.evaluate(batch)?, batch, or_kleene),
            Expr::Not(e) => unary(&e.evaluate(batch)?, |a| not(a.as_boolean()).map(boolean)),
            Expr::Negate(e) => unary(&e.evaluate(batch)?, arrow_arith::numeric::neg),
            Expr::IsNull(e, negated) => unary(&e.evaluate(batch)?, |a| {
                if *negated {
                    is_not_null(a).map(boolean)
                } else {
                    is_null(a).map(boolean)
                }
            }),
            Expr::IsBool(e, value) => unary(&e.evaluate(batch)?, |a| {
                let b = a.as_boolean();
                Ok(boolean(b.iter().map(|v| Some(v == Some(*value))).collect()))
            }),
            Expr::Like {
                expr,
                pattern,
                negated,
                case_insensitive,
            } => {
                let (e, p) = (expr.evaluate(batch)?, pattern.evaluate(batch)?);
                binary(&e, &p, |l, r| {
                    like(l, r, *negated, *case_insensitive).map(boolean)
                })
            }
            Expr::Cast { expr, to, safe } => {
                let options = CastOptions {
                    safe: *safe,
                    ..CastOptions::default()
                };
                unary(&expr.evaluate(batch)?, |a| {
                    cast_with_options(a, to, &options)
                })
            }
        }
    }
}

/// `a AND b` or `a OR b` (`kernel`) by SQL's three-valued logic; a scalar if both
/// operands are.
fn kleene(
    a: Value,
    b: Value,
    batch: &RecordBatch,
    kernel: fn(&BooleanArray, &BooleanArray) -> Result<BooleanArray, ArrowError>,
) -> Result<Value, ArrowError> {
    let scalar = a.is_scalar() && b.is_scalar();
    let n = if scalar { 1 } else { batch.num_rows() };
    let (a, b) = (a.into_array(n)?, b.into_array(n)?);
    let result = boolean(kernel(a.as_boolean(), b.as_boolean())?);
    Ok(if scalar {
        Value::Scalar(result)
    } else {
        Value::Array(result)
    })
}

/// `LIKE`, `NOT LIKE`, `ILIKE` or `NOT ILIKE`.
fn like(
    l: &dyn Datum,
    r: &dyn Datum,
    negated: bool,
    case_insensitive: bool,
) -> Result<BooleanArray, ArrowError> {
    use arrow_string::like;
    match (case_insensitive, negated) {
        (false, false) => like::like(l, r),
        (false, true) => like::nlike(l, r),
        (true, false) => like::ilike(l, r),
        (true, true) => like::nilike(l, r),
    }
}

fn compare(op: CmpOp, l: &dyn Datum, r: &dyn Datum) -> Result<BooleanArray, ArrowError> {
    use arrow_ord::cmp;
    match op {
        CmpOp::Eq => cmp::eq(l, r),
        CmpOp::NotEq => cmp::neq(l, r),
        CmpOp::Lt => cmp::lt(l, r),
        CmpOp::LtEq => cmp::lt_eq(l, r),
        CmpOp::Gt => cmp::gt(l, r),
        CmpOp::GtEq => cmp::gt_eq(l, r),
        CmpOp::Distinct => cmp::distinct(l, r),
        CmpOp::NotDistinct => cmp::not_distinct(l, r),
    }
}

/// Applies an arithmetic kernel (checked: an overflow is an error).
pub fn arith(op: ArithOp, l: &dyn Datum, r: &dyn Datum) -> Result<ArrayRef, ArrowError> {
    use arrow_arith::numeric;
    match op {
        ArithOp::Add => numeric::add(l, r),
        ArithOp::Sub => numeric::sub(l, r),
        ArithOp::Mul => numeric::mul(l, r),
        ArithOp::Div => numeric::div(l, r),
        ArithOp::Rem => numeric::rem(l, r),
    }
}

/// `divisor` with its zeros made null, so that `x / 0` is NULL.
fn null_zeros(divisor: Value) -> Result<Value, ArrowError> {
    let array = divisor.array();
    if !array.data_type().is_numeric() {
        return Ok(divisor);
    }
    let zero = cast_with_options(
        &arrow_array::Int8Array::from(vec![0]),
        array.data_type(),
        &CastOptions::default(),
    )?;
    let is_zero = arrow_ord::cmp::eq(array, &Scalar::new(zero))?;
    if is_zero.true_count() == 0 {
        return Ok(divisor);
    }
    let nulled = arrow_select::nullif::nullif(array, &is_zero)?;
    Ok(match divisor {
        Value::Array(_) => Value::Array(nulled),
        Value::Scalar(_) => Value::Scalar(nulled),
    })
}
