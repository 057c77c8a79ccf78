//! `--filter`: a SQL boolean expression over columns of both inputs, run as the
//! join's residual filter.
//!
//! ```text
//!  "left.price > right.cap * 1.1 AND day >= DATE '2024-01-01'"
//!        │ sqlparser (GenericDialect): parse one expression, nothing after it
//!        ▼
//!  SQL AST ──► lower: resolve names to (side, column), check and unify types,
//!        │     fold constants                                    [lower, coerce]
//!        ▼
//!  typed Expr over a batch of the columns it reads                [eval]
//!        │ evaluated before the join runs on an empty batch (a type check with
//!        │ Arrow's own kernels), then per batch of candidate pairs
//!        ▼
//!  JoinFilter(columns by input and index, predicate)
//! ```
//!
//! The filter belongs to the join condition, as in `ON l.k = r.k AND <filter>`: an
//! inner or semi join keeps only pairs for which it is true; an outer, anti or mark
//! join counts a row as matched only if some pair with it passed (so a left join
//! still outputs every left row). Every error — a parse error, an unknown column, a
//! type mismatch — says where in the text it is (line and column, and the text
//! there).

mod coerce;
mod eval;
mod lower;

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema};
use spilljoin::{JoinFilter, Side};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Span, Token};

use super::failure::Kind;

/// A filter that parsed and type-checked against both inputs.
#[derive(Debug, Clone)]
pub struct Filter {
    text: String,
    columns: Vec<(Side, String, DataType)>,
    expr: Arc<eval::Expr>,
}

/// A filter that does not parse or type-check, and where.
#[derive(Debug, Clone)]
pub struct FilterError {
    message: String,
    /// Line and column (from 1) of the offending text, and the text.
    at: Option<(u64, u64, String)>,
}

impl FilterError {
    /// An error about the part of `text` that `span` covers.
    fn at(text: &str, span: Span, message: impl Into<String>) -> Self {
        let at = (span.start.line > 0)
            .then(|| (span.start.line, span.start.column, excerpt(text, span)));
        Self {
            message: message.into(),
            at,
        }
    }
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some((line, column, text)) = &self.at {
            write!(f, " (at line {line}, column {column}: {text:?})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FilterError {}

/// The text `span` covers (at most 60 characters).
fn excerpt(text: &str, span: Span) -> String {
    let offset = |line: u64, column: u64| -> Option<usize> {
        let mut chars = 0usize;
        for (i, l) in text.split('\n').enumerate() {
            if i as u64 + 1 == line {
                let byte = l
                    .char_indices()
                    .nth(column.saturating_sub(1) as usize)
                    .map_or(l.len(), |(b, _)| b);
                return Some(chars + byte);
            }
            chars += l.len() + 1;
        }
        None
    };
    let start = offset(span.start.line, span.start.column).unwrap_or(0);
    let end = offset(span.end.line, span.end.column)
        .unwrap_or(text.len())
        .max(start);
    let piece = text.get(start..end).unwrap_or("").trim();
    let piece = if piece.is_empty() {
        text.get(start..).unwrap_or("").trim()
    } else {
        piece
    };
    if piece.chars().count() > 60 {
        let cut: String = piece.chars().take(57).collect();
        format!("{cut}...")
    } else {
        piece.to_string()
    }
}

impl Filter {
    /// Parses `text` and checks it against the inputs' full schemas.
    ///
    /// # Errors
    /// A definition failure carrying a [`FilterError`]: the text does not parse, names
    /// a column that does not exist (or exists on both sides unqualified), or mixes
    /// types that do not go together, or is not boolean.
    pub fn parse(text: &str, left: &Schema, right: &Schema) -> anyhow::Result<Self> {
        Self::parse_inner(text, left, right)
            .map_err(|e| anyhow::Error::new(e).context(Kind::Definition.context("--filter")))
    }

    fn parse_inner(text: &str, left: &Schema, right: &Schema) -> Result<Self, FilterError> {
        let dialect = GenericDialect {};
        let parse_error = |e: sqlparser::parser::ParserError| {
            let message = e.to_string();
            let message = message.trim_start_matches("sql parser error: ");
            let message = if message.ends_with("found: EOF") {
                format!("{message} at the end of the filter")
            } else {
                message.to_string()
            };
            FilterError { message, at: None }
        };
        let mut parser = Parser::new(&dialect)
            .try_with_sql(text)
            .map_err(parse_error)?;
        let sql = parser.parse_expr().map_err(parse_error)?;
        let next = parser.peek_token();
        if next.token != Token::EOF {
            return Err(FilterError::at(
                text,
                next.span,
                format!("unexpected {} after the expression", next.token),
            ));
        }
        let mut lowering = lower::Lowering::new(text, left, right);
        let expr = lowering.predicate(&sql)?;
        if lowering.columns.is_empty() {
            // A constant filter still reads a column: the join gathers a batch of the
            // filter's columns, and a batch has a length only through its columns.
            if let Some(first) = left.fields().first() {
                lowering.columns.push((
                    Side::Left,
                    first.name().clone(),
                    first.data_type().clone(),
                ));
            }
        }
        let filter = Self {
            text: text.to_string(),
            columns: lowering.columns,
            expr: Arc::new(expr),
        };
        // A last check with Arrow's kernels themselves, on no rows.
        let empty = RecordBatch::new_empty(filter.intermediate_schema());
        filter.expr.predicate(&empty).map_err(|e| FilterError {
            message: format!("{text}: {e}"),
            at: None,
        })?;
        Ok(filter)
    }

    /// The text as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The columns the filter reads: input and name.
    pub fn columns(&self) -> impl Iterator<Item = (Side, &str)> {
        self.columns.iter().map(|(s, n, _)| (*s, n.as_str()))
    }

    fn intermediate_schema(&self) -> Arc<Schema> {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|(_, n, t)| Field::new(n, t.clone(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// The join's residual filter, with columns as indices into the schemas the
    /// join is defined with (`left` and `right`, projected).
    ///
    /// # Errors
    /// A column that the projected schemas do not have (a bug in the projection).
    pub fn join_filter(&self, left: &Schema, right: &Schema) -> anyhow::Result<JoinFilter> {
        let columns = self
            .columns
            .iter()
            .map(|(side, name, _)| {
                let schema = if *side == Side::Left { left } else { right };
                Ok((*side, schema.index_of(name)?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let expr = Arc::clone(&self.expr);
        Ok(JoinFilter::new(columns, move |batch: &RecordBatch| {
            expr.predicate(batch)
        }))
    }
}

#[cfg(test)]
mod tests;
