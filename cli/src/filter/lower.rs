//! From sqlparser's AST to the typed [`Expr`]: names resolved to the two inputs'
//! columns, types checked and brought together (see [`super::coerce`]), constant
//! parts folded. Every error points at the part of the text it is about.

use std::sync::Arc;

use arrow_array::{
    new_null_array, Array, ArrayRef, BooleanArray, Float64Array, Int64Array,
    IntervalMonthDayNanoArray, RecordBatch, StringArray,
};
use arrow_cast::{can_cast_types, cast_with_options, CastOptions};
use arrow_schema::{DataType, Schema};
use spilljoin::Side;
use sqlparser::ast::{
    BinaryOperator, CastKind, Expr as Sql, InTarget, Spanned, UnaryOperator, Value as SqlValue,
};
use sqlparser::tokenizer::Span;

use super::coerce::{arithmetic_types, comparison_type, is_string, sql_type};
use super::eval::{arith, ArithOp, CmpOp, Expr};
use super::FilterError;
use crate::suggest::did_you_mean;

/// Lowers one expression against the two inputs' schemas, collecting the columns it
/// reads.
pub struct Lowering<'a> {
    text: &'a str,
    left: &'a Schema,
    right: &'a Schema,
    /// The columns read, in the order the predicate sees them.
    pub columns: Vec<(Side, String, DataType)>,
}

type Result<T> = std::result::Result<T, FilterError>;

impl<'a> Lowering<'a> {
    /// A lowering of `text` over `left` and `right`.
    pub fn new(text: &'a str, left: &'a Schema, right: &'a Schema) -> Self {
        Self {
            text,
            left,
            right,
            columns: Vec::new(),
        }
    }

    fn error(&self, span: Span, message: impl Into<String>) -> FilterError {
        FilterError::at(self.text, span, message)
    }

    /// Lowers a predicate: an expression that must be boolean.
    pub fn predicate(&mut self, e: &Sql) -> Result<Expr> {
        let expr = self.lower(e)?;
        self.boolean(expr, e, "the filter")
    }

    /// `expr` (lowered from `e`) as a boolean: a NULL literal becomes a boolean
    /// NULL; anything else not boolean is an error.
    fn boolean(&self, expr: Expr, e: &Sql, what: &str) -> Result<Expr> {
        match expr.data_type() {
            DataType::Boolean => Ok(expr),
            DataType::Null => Ok(Expr::Literal(new_null_array(&DataType::Boolean, 1))),
            other => Err(self.error(
                e.span(),
                format!("{what} must be true or false, but {e} is {other}"),
            )),
        }
    }

    fn lower(&mut self, e: &Sql) -> Result<Expr> {
        let expr = self.lower_inner(e)?;
        // Fold constant parts, so that literals stay literals for coercion.
        if expr.is_constant() && !matches!(expr, Expr::Literal(_)) {
            return self.fold(&expr, e.span());
        }
        Ok(expr)
    }

    fn fold(&self, expr: &Expr, span: Span) -> Result<Expr> {
        let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
        let value = expr
            .evaluate(&empty)
            .map_err(|err| self.error(span, err.to_string()))?;
        match value {
            super::eval::Value::Scalar(a) => Ok(Expr::Literal(a)),
            super::eval::Value::Array(_) => Ok(expr.clone()),
        }
    }

    /// Lowers one node; the forms with more to check have their own methods.
    fn lower_inner(&mut self, e: &Sql) -> Result<Expr> {
        match e {
            Sql::Identifier(ident) => {
                self.column(None, &ident.value, ident.quote_style.is_some(), e.span())
            }
            Sql::CompoundIdentifier(parts) => self.qualified(parts, e),
            Sql::Nested(inner) => self.lower(inner),
            Sql::Value(v) => self.literal(&v.value, v.span),
            Sql::TypedString(ts) => self.typed_string(ts, e),
            Sql::Interval(interval) => self.interval(interval, e.span()),
            Sql::UnaryOp { op, expr } => self.unary(*op, expr, e),
            Sql::BinaryOp { left, op, right } => self.binary(left, op, right, e),
            Sql::IsNull(inner) => Ok(Expr::IsNull(Box::new(self.lower(inner)?), false)),
            Sql::IsNotNull(inner) => Ok(Expr::IsNull(Box::new(self.lower(inner)?), true)),
            Sql::IsTrue(inner) => self.is_bool(inner, true, false),
            Sql::IsFalse(inner) => self.is_bool(inner, false, false),
            Sql::IsNotTrue(inner) => self.is_bool(inner, true, true),
            Sql::IsNotFalse(inner) => self.is_bool(inner, false, true),
            Sql::IsDistinctFrom(a, b) => self.compare(CmpOp::Distinct, a, b, e),
            Sql::IsNotDistinctFrom(a, b) => self.compare(CmpOp::NotDistinct, a, b, e),
            Sql::Between {
                expr,
                negated,
                low,
                high,
            } => Ok(not_if(*negated, self.between(expr, low, high, e)?)),
            Sql::In {
                expr,
                target,
                negated,
                ..
            } => Ok(not_if(*negated, self.in_list(expr, target, e)?)),
            Sql::Like {
                negated,
                any,
                expr,
                pattern,
                escape_char,
            }
            | Sql::ILike {
                negated,
                any,
                expr,
                pattern,
                escape_char,
            } => {
                self.check_like(*any, escape_char.as_deref(), e)?;
                self.like(expr, pattern, *negated, matches!(e, Sql::ILike { .. }), e)
            }
            Sql::Cast {
                kind,
                expr,
                data_type,
                ..
            } => self.cast(kind, expr, data_type, e),
            other => Err(self.unsupported(other)),
        }
    }

    /// The error for a form `--filter` does not take: functions, subqueries, and
    /// the rest of SQL.
    fn unsupported(&self, e: &Sql) -> FilterError {
        match e {
            Sql::Function(f) => self.error(
                e.span(),
                format!("functions such as {} are not supported in --filter", f.name),
            ),
            Sql::Subquery(_) | Sql::Exists { .. } => {
                self.error(e.span(), "subqueries are not supported in --filter")
            }
            other => self.error(
                other.span(),
                format!("{other} is not supported in --filter"),
            ),
        }
    }

    /// `inner IS [NOT] TRUE` (`value` true) or `IS [NOT] FALSE`: the operand must
    /// be boolean.
    fn is_bool(&mut self, inner: &Sql, value: bool, negated: bool) -> Result<Expr> {
        let lowered = self.lower(inner)?;
        let b = self.boolean(lowered, inner, "the operand of IS TRUE/FALSE")?;
        Ok(not_if(negated, Expr::IsBool(Box::new(b), value)))
    }

    /// `expr BETWEEN low AND high` as `expr >= low AND expr <= high`.
    fn between(&mut self, expr: &Sql, low: &Sql, high: &Sql, e: &Sql) -> Result<Expr> {
        let low = self.compare(CmpOp::GtEq, expr, low, e)?;
        let high = self.compare(CmpOp::LtEq, expr, high, e)?;
        Ok(Expr::And(Box::new(low), Box::new(high)))
    }

    /// `left.NAME` or `right.NAME` (also `l.` and `r.`).
    fn qualified(&mut self, parts: &[sqlparser::ast::Ident], e: &Sql) -> Result<Expr> {
        let [qualifier, name] = parts else {
            return Err(self.error(
                e.span(),
                format!("{e} is not a column: write left.NAME or right.NAME"),
            ));
        };
        let side = match qualifier.value.to_ascii_lowercase().as_str() {
            "left" | "l" => Side::Left,
            "right" | "r" => Side::Right,
            _ => {
                return Err(self.error(
                    qualifier.span,
                    format!(
                        "{:?} is not an input: write left.{} or right.{}",
                        qualifier.value, name.value, name.value
                    ),
                ))
            }
        };
        self.column(
            Some(side),
            &name.value,
            name.quote_style.is_some(),
            e.span(),
        )
    }

    /// `DATE '...'`, `TIMESTAMP '...'`.
    fn typed_string(&self, ts: &sqlparser::ast::TypedString, e: &Sql) -> Result<Expr> {
        let text = match &ts.value.value {
            SqlValue::SingleQuotedString(s) => s.clone(),
            other => return Err(self.error(ts.value.span, format!("{other} is not a string"))),
        };
        let to = sql_type(&ts.data_type)
            .ok_or_else(|| self.error(e.span(), format!("unknown type {}", ts.data_type)))?;
        self.cast_literal(&text, &to, e.span())
    }

    /// `expr IN (a, b, ...)` as `expr = a OR expr = b OR ...` (SQL's NULL rules come
    /// with the Kleene OR).
    fn in_list(&mut self, expr: &Sql, target: &InTarget, e: &Sql) -> Result<Expr> {
        let InTarget::List(list) = target else {
            return Err(self.error(e.span(), "IN takes a list of values here, not a subquery"));
        };
        let mut any: Option<Expr> = None;
        for item in list {
            let eq = self.compare(CmpOp::Eq, expr, item, e)?;
            any = Some(match any {
                None => eq,
                Some(prev) => Expr::Or(Box::new(prev), Box::new(eq)),
            });
        }
        any.ok_or_else(|| self.error(e.span(), "IN () needs at least one value"))
    }

    /// What a LIKE may not have: `ANY`, or an `ESCAPE` character other than the
    /// backslash (LIKE escapes with a backslash, Arrow's rule; `ESCAPE '\'` says so).
    fn check_like(&self, any: bool, escape: Option<&Sql>, e: &Sql) -> Result<()> {
        if any {
            return Err(self.error(e.span(), "LIKE ANY is not supported"));
        }
        let Some(escape) = escape else {
            return Ok(());
        };
        let backslash = matches!(escape, Sql::Value(v)
            if matches!(&v.value, SqlValue::SingleQuotedString(s) if s == "\\"));
        if backslash {
            Ok(())
        } else {
            Err(self.error(
                escape.span(),
                "LIKE escapes with a backslash; no other ESCAPE character is supported",
            ))
        }
    }

    /// `CAST(expr AS type)`; `TRY_CAST` gives NULL where a value does not convert.
    fn cast(
        &mut self,
        kind: &CastKind,
        expr: &Sql,
        data_type: &sqlparser::ast::DataType,
        e: &Sql,
    ) -> Result<Expr> {
        let to = sql_type(data_type)
            .ok_or_else(|| self.error(e.span(), format!("CAST to {data_type} is not supported")))?;
        let inner = self.lower(expr)?;
        let from = inner.data_type();
        if !can_cast_types(&from, &to) {
            return Err(self.error(e.span(), format!("cannot cast {expr} ({from}) to {to}")));
        }
        Ok(Expr::Cast {
            expr: Box::new(inner),
            to,
            safe: !matches!(kind, CastKind::Cast | CastKind::DoubleColon),
        })
    }

    /// A column by name, `qualifier` saying which input if given. A quoted name
    /// matches exactly; an unquoted one exactly, else (SQL names being
    /// case-insensitive) by a unique case-insensitive match.
    fn column(
        &mut self,
        qualifier: Option<Side>,
        name: &str,
        quoted: bool,
        span: Span,
    ) -> Result<Expr> {
        let (side, found) = self.resolve_column(qualifier, name, quoted, span)?;
        let schema = if side == Side::Left {
            self.left
        } else {
            self.right
        };
        let data_type = schema
            .field_with_name(&found)
            .map(|f| f.data_type().clone())
            .map_err(|e| self.error(span, e.to_string()))?;
        let index = self.read_column(side, found, &data_type);
        let column = Expr::Column {
            index,
            data_type: data_type.clone(),
        };
        // Dictionaries are compared and computed by value.
        Ok(match data_type {
            DataType::Dictionary(_, value) => Expr::Cast {
                expr: Box::new(column),
                to: *value,
                safe: false,
            },
            _ => column,
        })
    }

    /// The input and the exact name of the one column `name` means (see
    /// [`Self::column`]); an error if none or both inputs have it.
    fn resolve_column(
        &self,
        qualifier: Option<Side>,
        name: &str,
        quoted: bool,
        span: Span,
    ) -> Result<(Side, String)> {
        let exact = |schema: &Schema| schema.index_of(name).ok().map(|_| name.to_string());
        let folded = |schema: &Schema| -> Option<String> {
            let mut matches = schema
                .fields()
                .iter()
                .filter(|f| f.name().eq_ignore_ascii_case(name));
            match (matches.next(), matches.next()) {
                (Some(f), None) if !quoted => Some(f.name().clone()),
                _ => None,
            }
        };
        let sides: Vec<(Side, &Schema)> = match qualifier {
            Some(Side::Left) => vec![(Side::Left, self.left)],
            Some(Side::Right) => vec![(Side::Right, self.right)],
            None => vec![(Side::Left, self.left), (Side::Right, self.right)],
        };
        let mut found: Vec<(Side, String)> = sides
            .iter()
            .filter_map(|(side, schema)| exact(schema).map(|n| (*side, n)))
            .collect();
        if found.is_empty() {
            found = sides
                .iter()
                .filter_map(|(side, schema)| folded(schema).map(|n| (*side, n)))
                .collect();
        }
        match found.as_slice() {
            [one] => Ok(one.clone()),
            [] => {
                let names = sides
                    .iter()
                    .flat_map(|(_, schema)| schema.fields().iter().map(|f| f.name().as_str()));
                let place = match qualifier {
                    Some(side) => format!("the {side} input"),
                    None => "either input".into(),
                };
                Err(self.error(
                    span,
                    format!("no column {name:?} in {place}{}", did_you_mean(name, names)),
                ))
            }
            _ => Err(self.error(
                span,
                format!("{name:?} is a column of both inputs: write left.{name} or right.{name}"),
            )),
        }
    }

    /// The index of column `name` of `side` in the predicate's batch: where it
    /// was, if the filter already reads it, else the next.
    fn read_column(&mut self, side: Side, name: String, data_type: &DataType) -> usize {
        match self
            .columns
            .iter()
            .position(|(s, n, _)| *s == side && *n == name)
        {
            Some(i) => i,
            None => {
                self.columns.push((side, name, data_type.clone()));
                self.columns.len() - 1
            }
        }
    }

    fn literal(&self, v: &SqlValue, span: Span) -> Result<Expr> {
        let array: ArrayRef = match v {
            SqlValue::Number(text, _) => match text.parse::<i64>() {
                Ok(i) => Arc::new(Int64Array::from(vec![i])),
                Err(_) => match text.parse::<f64>() {
                    Ok(f) => Arc::new(Float64Array::from(vec![f])),
                    Err(_) => return Err(self.error(span, format!("{text} is not a number"))),
                },
            },
            SqlValue::SingleQuotedString(s) => Arc::new(StringArray::from(vec![s.as_str()])),
            SqlValue::Boolean(b) => Arc::new(BooleanArray::from(vec![*b])),
            SqlValue::Null => new_null_array(&DataType::Null, 1),
            other => return Err(self.error(span, format!("{other} is not a supported literal"))),
        };
        Ok(Expr::Literal(array))
    }

    /// A string literal read as type `to` (`DATE '2024-01-31'`).
    fn cast_literal(&self, text: &str, to: &DataType, span: Span) -> Result<Expr> {
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let array = cast_with_options(&StringArray::from(vec![text]), to, &options)
            .map_err(|_| self.error(span, format!("{text:?} is not a valid {to}")))?;
        Ok(Expr::Literal(array))
    }

    fn interval(&self, interval: &sqlparser::ast::Interval, span: Span) -> Result<Expr> {
        let value = match interval.value.as_ref() {
            Sql::Value(v) => match &v.value {
                SqlValue::SingleQuotedString(s) | SqlValue::Number(s, _) => s.clone(),
                other => {
                    return Err(self.error(span, format!("INTERVAL {other} is not an interval")))
                }
            },
            other => return Err(self.error(span, format!("INTERVAL {other} is not an interval"))),
        };
        let text = match &interval.leading_field {
            Some(field) => format!("{value} {field}"),
            None => value,
        };
        let parsed = arrow_cast::parse::parse_interval_month_day_nano(&text)
            .map_err(|e| self.error(span, format!("INTERVAL '{text}': {e}")))?;
        Ok(Expr::Literal(Arc::new(IntervalMonthDayNanoArray::from(
            vec![parsed],
        ))))
    }

    fn unary(&mut self, op: UnaryOperator, inner: &Sql, e: &Sql) -> Result<Expr> {
        let lowered = self.lower(inner)?;
        match op {
            UnaryOperator::Not => Ok(Expr::Not(Box::new(self.boolean(
                lowered,
                inner,
                "the operand of NOT",
            )?))),
            UnaryOperator::Plus => Ok(lowered),
            UnaryOperator::Minus => {
                let t = lowered.data_type();
                if !(t.is_numeric() || matches!(t, DataType::Interval(_) | DataType::Duration(_))) {
                    return Err(self.error(e.span(), format!("cannot negate {inner} ({t})")));
                }
                Ok(Expr::Negate(Box::new(lowered)))
            }
            other => Err(self.error(e.span(), format!("operator {other} is not supported"))),
        }
    }

    fn binary(&mut self, l: &Sql, op: &BinaryOperator, r: &Sql, e: &Sql) -> Result<Expr> {
        use BinaryOperator as B;
        let cmp = |op: CmpOp| Some(op);
        let compare = match op {
            B::Eq => cmp(CmpOp::Eq),
            B::NotEq => cmp(CmpOp::NotEq),
            B::Lt => cmp(CmpOp::Lt),
            B::LtEq => cmp(CmpOp::LtEq),
            B::Gt => cmp(CmpOp::Gt),
            B::GtEq => cmp(CmpOp::GtEq),
            _ => None,
        };
        if let Some(c) = compare {
            return self.compare(c, l, r, e);
        }
        let arith = match op {
            B::Plus => Some(ArithOp::Add),
            B::Minus => Some(ArithOp::Sub),
            B::Multiply => Some(ArithOp::Mul),
            B::Divide => Some(ArithOp::Div),
            B::Modulo => Some(ArithOp::Rem),
            _ => None,
        };
        if let Some(a) = arith {
            return self.arithmetic(a, l, r, e);
        }
        match op {
            B::And | B::Or => {
                let left = self.lower(l)?;
                let left = self.boolean(left, l, &format!("the operand of {op}"))?;
                let right = self.lower(r)?;
                let right = self.boolean(right, r, &format!("the operand of {op}"))?;
                let (left, right) = (Box::new(left), Box::new(right));
                Ok(if *op == B::And {
                    Expr::And(left, right)
                } else {
                    Expr::Or(left, right)
                })
            }
            other => Err(self.error(
                e.span(),
                format!("operator {other} is not supported in --filter"),
            )),
        }
    }

    /// `l op r` with both sides brought to one type.
    fn compare(&mut self, op: CmpOp, l: &Sql, r: &Sql, e: &Sql) -> Result<Expr> {
        let (left, right) = (self.lower(l)?, self.lower(r)?);
        let (left, right) = self.adapt_literals(left, right, e)?;
        let (lt, rt) = (left.data_type(), right.data_type());
        let Some(common) = comparison_type(&lt, &rt) else {
            return Err(self.error(
                e.span(),
                format!("cannot compare {l} ({lt}) with {r} ({rt})"),
            ));
        };
        let (left, right) = (
            self.cast_to(left, &common, l)?,
            self.cast_to(right, &common, r)?,
        );
        Ok(Expr::Compare(op, Box::new(left), Box::new(right)))
    }

    /// `l LIKE r`: a string and a pattern of its type.
    fn like(
        &mut self,
        l: &Sql,
        r: &Sql,
        negated: bool,
        case_insensitive: bool,
        e: &Sql,
    ) -> Result<Expr> {
        let (left, right) = (self.lower(l)?, self.lower(r)?);
        let (lt, rt) = (left.data_type(), right.data_type());
        if !is_string(&lt) || !(is_string(&rt) || rt == DataType::Null) {
            return Err(self.error(
                e.span(),
                format!("LIKE takes strings, but {l} is {lt} and {r} is {rt}"),
            ));
        }
        let right = self.cast_to(right, &lt, r)?;
        Ok(Expr::Like {
            expr: Box::new(left),
            pattern: Box::new(right),
            negated,
            case_insensitive,
        })
    }

    /// `l op r` for + - * / %: numbers brought to a common type; dates,
    /// timestamps and intervals as Arrow's kernels take them.
    fn arithmetic(&mut self, op: ArithOp, l: &Sql, r: &Sql, e: &Sql) -> Result<Expr> {
        let (left, right) = (self.lower(l)?, self.lower(r)?);
        let (mut left, mut right) = self.adapt_literals(left, right, e)?;
        let (lt, rt) = (left.data_type(), right.data_type());
        if let Some((lt2, rt2)) = arithmetic_types(&lt, &rt) {
            left = self.cast_to(left, &lt2, l)?;
            right = self.cast_to(right, &rt2, r)?;
        }
        // The kernel itself says whether it takes these types, and what it returns.
        let (lt, rt) = (left.data_type(), right.data_type());
        let data_type = arith(
            op,
            &arrow_array::new_empty_array(&lt),
            &arrow_array::new_empty_array(&rt),
        )
        .map(|a| a.data_type().clone())
        .map_err(|_| {
            self.error(
                e.span(),
                format!(
                    "cannot compute {e}: {} of {lt} and {rt} is not defined",
                    op_name(op)
                ),
            )
        })?;
        Ok(Expr::Arith {
            op,
            left: Box::new(left),
            right: Box::new(right),
            data_type,
        })
    }

    /// When one side is a literal and the other is not, the literal takes the other
    /// side's type if it converts without loss: a number to a number, a string to a
    /// string, a date or a timestamp, NULL to anything.
    fn adapt_literals(&self, left: Expr, right: Expr, e: &Sql) -> Result<(Expr, Expr)> {
        match (&left, &right) {
            (Expr::Literal(_), Expr::Literal(_)) => Ok((left, right)),
            (Expr::Literal(lit), other) => {
                let adapted = self.adapt(lit, &other.data_type(), e)?;
                Ok((adapted.map(Expr::Literal).unwrap_or(left), right))
            }
            (other, Expr::Literal(lit)) => {
                let adapted = self.adapt(lit, &other.data_type(), e)?;
                Ok((left, adapted.map(Expr::Literal).unwrap_or(right)))
            }
            _ => Ok((left, right)),
        }
    }

    fn adapt(&self, lit: &ArrayRef, target: &DataType, e: &Sql) -> Result<Option<ArrayRef>> {
        let from = lit.data_type();
        if from == target {
            return Ok(None);
        }
        let strict = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let temporal = matches!(
            target,
            DataType::Date32
                | DataType::Date64
                | DataType::Timestamp(..)
                | DataType::Time32(_)
                | DataType::Time64(_)
        );
        match from {
            DataType::Null => Ok(Some(new_null_array(target, 1))),
            f if f.is_numeric() && target.is_numeric() => {
                let Ok(cast) = cast_with_options(lit, target, &strict) else {
                    return Ok(None);
                };
                // Lossless only: the value must come back unchanged.
                let back = cast_with_options(&cast, from, &strict).ok();
                Ok(back.filter(|b| b.as_ref() == lit.as_ref()).map(|_| cast))
            }
            f if is_string(f) && (is_string(target) || temporal) => {
                match cast_with_options(lit, target, &strict) {
                    Ok(cast) => Ok(Some(cast)),
                    Err(_) => Err(self.error(
                        e.span(),
                        format!("{} is not a valid {target}", literal_text(lit)),
                    )),
                }
            }
            DataType::Timestamp(..) | DataType::Date32 if temporal => {
                let cast = cast_with_options(lit, target, &strict).ok();
                let back = cast
                    .as_ref()
                    .and_then(|c| cast_with_options(c, from, &strict).ok());
                Ok(back.filter(|b| b.as_ref() == lit.as_ref()).and(cast))
            }
            _ => Ok(None),
        }
    }

    /// `expr` cast to `to` (a literal is cast now).
    fn cast_to(&self, expr: Expr, to: &DataType, e: &Sql) -> Result<Expr> {
        let from = expr.data_type();
        if from == *to {
            return Ok(expr);
        }
        if !can_cast_types(&from, to) {
            return Err(self.error(e.span(), format!("cannot use {e} ({from}) as {to}")));
        }
        let cast = Expr::Cast {
            expr: Box::new(expr),
            to: to.clone(),
            safe: false,
        };
        if cast.is_constant() {
            return self.fold(&cast, e.span());
        }
        Ok(cast)
    }
}

/// `NOT expr` if `negated`, else `expr`.
fn not_if(negated: bool, expr: Expr) -> Expr {
    if negated {
        Expr::Not(Box::new(expr))
    } else {
        expr
    }
}

fn op_name(op: ArithOp) -> &'static str {
    match op {
        ArithOp::Add => "addition",
        ArithOp::Sub => "subtraction",
        ArithOp::Mul => "multiplication",
        ArithOp::Div => "division",
        ArithOp::Rem => "remainder",
    }
}

fn literal_text(lit: &ArrayRef) -> String {
    match lit.as_any().downcast_ref::<StringArray>() {
        Some(s) if s.len() == 1 => format!("'{}'", s.value(0)),
        _ => format!("{lit:?}"),
    }
}
