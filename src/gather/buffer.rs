//! The buffer itself: rows of a schema gathered from many batches, column by
//! column, until [`GatherBuffer::finish`] makes them one batch, and what rows will
//! add measured before they are appended ([`Growth`]).

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::ToByteSlice;
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use super::column::{self, Column, ColumnGrowth, Kind};
use super::offsets::Bytes;
use crate::error::{JoinError, Result};

/// What rows about to be appended to a [`GatherBuffer`] add beyond their fixed
/// widths: each column's bytes of variable-width data (an upper bound for a
/// dictionary's new values). Measured from the rows alone, before any lock is taken.
#[derive(Debug, Default)]
pub struct Growth {
    rows: usize,
    /// Per column (the hash column excepted); empty when no column has variable
    /// width.
    columns: Vec<ColumnGrowth>,
}

impl Growth {
    /// What rows `rows` of `columns` add.
    pub fn of(columns: &[ArrayData], rows: &[u32]) -> Self {
        let columns = if columns.iter().any(|c| column::has_data(c.data_type())) {
            columns.iter().map(|c| ColumnGrowth::of(c, rows)).collect()
        } else {
            Vec::new()
        };
        Self {
            rows: rows.len(),
            columns,
        }
    }

    /// What rows add that come to each column from a source of its own: column `i`
    /// gets rows `parts[i].1` of `parts[i].0` (as many rows for every column).
    pub fn of_columns(parts: &[(&ArrayData, &[u32])]) -> Self {
        let columns = if parts.iter().any(|(c, _)| column::has_data(c.data_type())) {
            parts
                .iter()
                .map(|(c, rows)| ColumnGrowth::of(c, rows))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            rows: parts.first().map_or(0, |(_, rows)| rows.len()),
            columns,
        }
    }

    /// Growth by `rows` rows of fixed-width columns only.
    #[cfg(test)]
    pub fn rows(rows: usize) -> Self {
        Self {
            rows,
            columns: Vec::new(),
        }
    }

    fn column(&self, i: usize) -> &ColumnGrowth {
        const NONE: &ColumnGrowth = &ColumnGrowth {
            data: 0,
            inline: 0,
            values: 0,
            value_data: 0,
            source: None,
        };
        self.columns.get(i).unwrap_or(NONE)
    }
}

/// The 16-byte decimal at row `r` of `source` (0 past its end; rows are checked to be
/// in it).
#[inline(always)]
fn decimal_at(source: &[u8], r: u32) -> i128 {
    let at = r as usize * 16;
    source
        .get(at..at + 16)
        .and_then(|v| v.try_into().ok())
        .map_or(0, i128::from_ne_bytes)
}

/// Rows of a schema gathered from many batches, each value copied once.
#[derive(Debug)]
pub struct GatherBuffer {
    schema: SchemaRef,
    columns: Vec<Column>,
    len: usize,
    /// The rows the buffers are first allocated for ([`GatherBuffer::expect_rows`]).
    expected_rows: usize,
    /// The segment schema of the last halved columns ([`GatherBuffer::halving`]).
    halved_schema: Option<(Vec<usize>, SchemaRef)>,
    /// The fixed widths it was made with, summed.
    wide_row_bytes: usize,
}

impl GatherBuffer {
    /// No rows yet of `schema`.
    ///
    /// # Errors
    /// [`JoinError::Internal`] if a column's type cannot be gathered (a nested
    /// type: a bug in the caller, which asks `gatherable` first).
    pub fn new(schema: SchemaRef) -> Result<Self> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| Column::for_field(f))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| JoinError::Internal("gathering a nested column".into()))?;
        let wide_row_bytes = columns.iter().map(Column::width).sum();
        Ok(Self {
            schema,
            columns,
            len: 0,
            expected_rows: 0,
            halved_schema: None,
            wide_row_bytes,
        })
    }

    /// Like [`new`](Self::new) for rows that are only ever written to a spill file
    /// (`schema` is its [`spilljoin_spill::file_schema`]): a buffer gathers the
    /// `Int64` columns (narrowed decimals included) of the batches it holds as `Int32`
    /// when the first batch's values all fit ([`shape_for`](Self::shape_for)), and
    /// [`finish`](Self::finish) gives them in that file's segment schema.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn halving(schema: SchemaRef) -> Result<Self> {
        let mut rows = Self::new(schema)?;
        for (column, field) in rows.columns.iter_mut().zip(rows.schema.fields()) {
            if let Some(fixed) = column.fixed_mut() {
                fixed.halvable = field.data_type() == &DataType::Int64;
            }
        }
        Ok(rows)
    }

    /// The schema the buffer gathers rows of (a halved column's type aside).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether these rows were made by [`halving`](Self::halving) (and have a column
    /// that may halve).
    pub fn is_halving(&self) -> bool {
        self.columns
            .iter()
            .any(|c| c.fixed().is_some_and(|f| f.halvable))
    }

    /// Whether rows of a batch whose columns fit in 32 bits where `fits` says so
    /// ([`spilljoin_spill::fits_i32`], one per column, the hash column excepted), and
    /// that add `growth`, can join the buffered ones: not if a column gathered halved
    /// would not fit, a dictionary's keys could not address its new values, or 32-bit
    /// offsets would overflow.
    pub fn admits(&self, fits: &[bool], growth: &Growth) -> bool {
        // Empty buffers take the next batch's shape ([`shape_for`](Self::shape_for)).
        self.len == 0
            || self
                .columns
                .iter()
                .zip(fits.iter().copied().chain(std::iter::repeat(false)))
                .enumerate()
                .all(|(i, (c, fits))| {
                    c.fixed().is_none_or(|f| !f.halved || fits)
                        && c.admits(self.len, growth.column(i))
                })
    }

    /// While the buffers are empty, gathers halvable columns as `Int32` where `fits`
    /// says so (see [`admits`](Self::admits)); a no-op once rows are buffered.
    pub fn shape_for(&mut self, fits: &[bool]) {
        if self.len > 0 {
            return;
        }
        for (column, fits) in self
            .columns
            .iter_mut()
            .zip(fits.iter().copied().chain(std::iter::repeat(false)))
        {
            if let Some(f) = column.fixed_mut().filter(|f| f.halvable) {
                f.halved = fits;
                f.width = if fits { 4 } else { 8 };
            }
        }
    }

    /// The bytes a row takes in the fixed part of the buffers (their columns' widths
    /// as gathered now).
    pub fn row_bytes(&self) -> usize {
        self.columns.iter().map(Column::width).sum()
    }

    /// The rows that take the bytes of `rows` wide rows as gathered now.
    pub fn rows_in_bytes_of(&self, rows: usize) -> usize {
        rows * self.wide_row_bytes / self.row_bytes().max(1)
    }

    /// Whether the buffers hold a batch to write: the fixed bytes of `rows` wide
    /// rows, or `bytes` of memory (variable-width data counts here).
    pub fn is_full(&self, rows: usize, bytes: usize) -> bool {
        self.len > 0
            && (self.len >= self.rows_in_bytes_of(rows)
                || self.len * self.row_bytes() + self.data_bytes() >= bytes)
    }

    /// Bytes of variable-width data held.
    pub fn data_bytes(&self) -> usize {
        self.columns.iter().map(Column::data_bytes).sum()
    }

    /// The bytes of the rows held, as `crate::batches::batch_bytes` counts the batch
    /// they make (fixed widths, variable-width data, a validity bitmap a column)
    /// without its pass over a view column's views.
    pub fn bytes(&self) -> usize {
        let validity = self.len.div_ceil(8) * self.columns.len();
        self.len * self.row_bytes() + self.data_bytes() + validity
    }

    /// Allocates the buffers, when they are next empty, for `rows` rows at once (the
    /// rows a batch that was written when full held), rather than growing them from
    /// nothing; [`capacity_after`](Self::capacity_after) counts that.
    pub fn expect_rows(&mut self, rows: usize) {
        self.expected_rows = rows;
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes the buffers hold in memory now.
    pub fn held(&self) -> usize {
        self.capacity_after(&Growth::default())
    }

    /// The bytes the buffers may hold in memory once rows that add `growth` are
    /// added: their capacity then, given that a heap buffer that grows doubles, and a
    /// mapped one in whole huge pages (and a nullable column's validity bits, which
    /// appear with its first null).
    pub fn capacity_after(&self, growth: &Growth) -> usize {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.capacity_after(self.len, growth.rows, growth.column(i), self.expected_rows)
            })
            .sum()
    }

    /// Appends rows `rows` of `columns` (arrays of this schema's types, in order).
    /// With `hashes`, the schema's last column (`UInt64`, not in `columns`) takes
    /// `hashes[row]` of each row.
    ///
    /// # Errors
    /// [`JoinError::Internal`] if a column's type is not the schema's or a row is
    /// past the end of the columns (bugs in the caller), [`JoinError::InvalidJoin`]
    /// if a decimal exceeds its precision; nothing is appended then.
    pub fn append(
        &mut self,
        columns: &[ArrayData],
        rows: &[u32],
        hashes: Option<&[u64]>,
    ) -> Result<()> {
        self.check(columns, rows, hashes)?;
        self.append_narrowed(columns, rows)?;
        let expected_rows = self.expected_rows;
        if let (Some(hashes), Some(column)) = (hashes, self.columns.last_mut()) {
            if let Some(fixed) = column.fixed_mut() {
                fixed.values.gather::<8>(
                    hashes.to_byte_slice(),
                    rows,
                    expected_rows.saturating_mul(8),
                )?;
            }
            if let Some(validity) = column.validity.as_mut() {
                validity.append_n(rows.len(), true);
            }
        }
        let len = self.len;
        for (column, data) in self.columns.iter_mut().zip(columns) {
            column.append(data, rows, len, expected_rows)?;
        }
        self.len += rows.len();
        Ok(())
    }

    /// Appends rows that come to each column from a source of its own (a join's
    /// matched pairs: the probe's columns from a probe batch, the build's from the
    /// build's): column `i` gets rows `parts[i].1` of `parts[i].0`, of the schema's
    /// type (or a view type its offsets column takes), as many rows for every
    /// column. Not for a buffer made by [`halving`](Self::halving).
    ///
    /// # Errors
    /// As [`append`](Self::append). Nothing is appended when the columns or rows do
    /// not fit; a failure while appending (offsets or a map that cannot grow) may
    /// leave some columns longer than the others, so the buffer must be dropped
    /// then, as the join does with its sink.
    pub fn append_columns(&mut self, parts: &[(&ArrayData, &[u32])]) -> Result<()> {
        let rows = parts.first().map_or(0, |(_, rows)| rows.len());
        let fits = parts.len() == self.columns.len() && self.fit_columns(parts, rows);
        if !fits {
            return Err(JoinError::Internal(
                "gathering pairs of another schema or past their sources' end".into(),
            ));
        }
        let (len, expected_rows) = (self.len, self.expected_rows);
        for (column, (data, r)) in self.columns.iter_mut().zip(parts) {
            column.append(data, r, len, expected_rows)?;
        }
        self.len += rows;
        Ok(())
    }

    /// Whether `parts` ([`append_columns`](Self::append_columns)) are of this
    /// schema's types, `rows` rows each, all in their sources. The largest row of
    /// a list of rows is found once however many columns share it (a side's do).
    fn fit_columns(&self, parts: &[(&ArrayData, &[u32])], rows: usize) -> bool {
        // Each list of rows met so far, by address, with its largest row.
        let mut largest: Vec<(*const u32, usize)> = Vec::with_capacity(2);
        for (((data, r), column), field) in
            parts.iter().zip(&self.columns).zip(self.schema.fields())
        {
            let top = match largest.iter().find(|(at, _)| *at == r.as_ptr()) {
                Some(&(_, top)) => top,
                None => {
                    let top = r.iter().fold(0, |m, &x| m.max(x)) as usize;
                    largest.push((r.as_ptr(), top));
                    top
                }
            };
            let fits = r.len() == rows
                && (r.is_empty() || top < data.len())
                && (data.data_type() == field.data_type()
                    || (matches!(column.kind, Kind::Bytes(_))
                        && Bytes::takes(data.data_type(), field.data_type())))
                && column
                    .fixed()
                    .is_none_or(|f| !f.narrowing(data) && !f.halved && f.source_of(data).is_some());
            if !fits {
                return false;
            }
        }
        true
    }

    /// Checks that `columns` are this schema's (hashes the last column's, if given)
    /// and `rows` are in them.
    fn check(&self, columns: &[ArrayData], rows: &[u32], hashes: Option<&[u64]>) -> Result<()> {
        let with_hashes = usize::from(hashes.is_some());
        let num_rows = columns.first().map_or(0, |c| c.len());
        let fits = columns.len() + with_hashes == self.columns.len()
            && columns.iter().all(|c| c.len() == num_rows)
            && hashes.is_none_or(|h| h.len() == num_rows)
            // The largest row, without a branch a row.
            && (rows.is_empty() || (rows.iter().fold(0, |m, &r| m.max(r)) as usize) < num_rows)
            && columns
                .iter()
                .zip(&self.columns)
                .zip(self.schema.fields())
                .all(|((c, column), f)| {
                    c.data_type() == f.data_type()
                        || column.fixed().is_some_and(|fixed| fixed.narrowing(c))
                        || (matches!(column.kind, Kind::Bytes(_))
                            && Bytes::takes(c.data_type(), f.data_type()))
                });
        if !fits {
            return Err(JoinError::Internal(
                "gathering rows of another schema or past its end".into(),
            ));
        }
        // Every fixed column's source bytes are checked before anything is appended
        // (they are found again as they are gathered: a few rows a call are common,
        // so nothing here allocates).
        if columns.iter().zip(&self.columns).any(|(data, column)| {
            column
                .fixed()
                .is_some_and(|fixed| fixed.source_of(data).is_none())
        }) {
            return Err(JoinError::Internal(
                "a column shorter than its length".into(),
            ));
        }
        Ok(())
    }

    /// Gathers narrowed decimals first: one that does not fit in 64 bits (arrow does
    /// not enforce a decimal's precision on its values) is refused with nothing
    /// appended, as the spill writer refuses it.
    fn append_narrowed(&mut self, columns: &[ArrayData], rows: &[u32]) -> Result<()> {
        let expected_rows = self.expected_rows;
        for (i, data) in columns.iter().enumerate() {
            let Some(fixed) = self.columns[i].fixed_mut() else {
                continue;
            };
            if !fixed.narrowing(data) || fixed.halved {
                continue;
            }
            let source = fixed.source_of(data).unwrap_or_default();
            let first = expected_rows.saturating_mul(fixed.width);
            if !fixed.values.gather_narrowed(source, rows, first)? {
                // Every column held `len` rows before this call.
                let len = self.len;
                for column in self.columns.iter_mut().take(i + 1) {
                    if let Some(f) = column.fixed_mut() {
                        f.values.truncate(len * f.width);
                    }
                }
                let v = rows
                    .iter()
                    .map(|&r| decimal_at(source, r))
                    .find(|&v| i64::try_from(v).is_err())
                    .unwrap_or_default();
                return Err(JoinError::InvalidJoin(format!(
                    "decimal value {v} of column {} exceeds its precision",
                    self.schema.field(i).name()
                )));
            }
        }
        Ok(())
    }

    /// The rows gathered so far as one batch; empties the buffers.
    ///
    /// # Errors
    /// An arrow error if the arrays cannot be made (a bug: their types are checked).
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let len = std::mem::take(&mut self.len);
        // Halved columns make the batch one of a spill file segment's schema.
        let halved: Vec<usize> = (0..self.columns.len())
            .filter(|&i| self.columns[i].fixed().is_some_and(|f| f.halved))
            .collect();
        let schema = match &self.halved_schema {
            _ if halved.is_empty() => Arc::clone(&self.schema),
            Some((cached, schema)) if *cached == halved => Arc::clone(schema),
            _ => {
                let schema = spilljoin_spill::segment_schema(&self.schema, &halved);
                self.halved_schema = Some((halved, Arc::clone(&schema)));
                schema
            }
        };
        let arrays = self
            .columns
            .iter_mut()
            .zip(schema.fields())
            .map(|(column, field)| column.finish(field.data_type(), len))
            .collect::<Result<Vec<ArrayRef>>>()?;
        Ok(RecordBatch::try_new_with_options(
            schema,
            arrays,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(len)),
        )?)
    }
}
