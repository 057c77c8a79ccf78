//! Rows of fixed-width columns gathered straight into the batch they are written in.
//!
//! Rows bound for a spill file arrive a few at a time (a probe batch's rows of one
//! partition: a hundred or so when a build has a hundred spilled partitions) and are
//! written a batch at a time. Taking each arrival into a small batch of its own and
//! concatenating them before the write copies every value twice and allocates a few
//! buffers per arrival; when every column has a fixed width, [`FixedRows`] copies each
//! value once, into buffers that grow until the batch is written.
//!
//! ```text
//!  probe batch ─ rows [3, 17, 40] ─► FixedRows: one values buffer (+ validity) per column
//!  probe batch ─ rows [1, 9] ───────►   ... until `len()` reaches a batch ─► finish()
//!                                                                      ─► RecordBatch
//! ```

use std::sync::Arc;

use arrow_array::{make_array, ArrayRef, RecordBatch};
use arrow_buffer::{BooleanBufferBuilder, MutableBuffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::error::{JoinError, Result};

/// The byte width of each column of `schema`, if every column has a fixed width that
/// [`FixedRows`] can gather (primitive types, decimals, dates, times, timestamps,
/// durations and intervals).
pub(crate) fn fixed_widths(schema: &SchemaRef) -> Option<Vec<usize>> {
    schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Dictionary(..) => None,
            t => t.primitive_width(),
        })
        .collect()
}

/// Appends the `W`-byte values at `rows` of `source` (rows are checked to be in it).
#[inline]
fn gather_fixed<const W: usize>(out: &mut MutableBuffer, source: &[u8], rows: &[u32]) {
    for &r in rows {
        let at = r as usize * W;
        if let Some(value) = source.get(at..at + W) {
            out.extend_from_slice(value);
        }
    }
}

/// One column's gathered values and, once a null arrives, its validity.
#[derive(Debug)]
struct Column {
    width: usize,
    values: MutableBuffer,
    validity: Option<BooleanBufferBuilder>,
}

/// Rows of a schema whose columns all have a fixed width, gathered from many batches.
#[derive(Debug)]
pub(crate) struct FixedRows {
    schema: SchemaRef,
    columns: Vec<Column>,
    len: usize,
}

impl FixedRows {
    /// No rows yet of `schema`, whose columns have the byte `widths`
    /// ([`fixed_widths`]).
    pub fn new(schema: SchemaRef, widths: &[usize]) -> Self {
        Self {
            schema,
            columns: widths
                .iter()
                .map(|&width| Column {
                    width,
                    values: MutableBuffer::new(0),
                    validity: None,
                })
                .collect(),
            len: 0,
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes the buffers will hold once `more` rows are added: their capacity
    /// then, given that a buffer that grows doubles.
    pub fn capacity_after(&self, more: usize) -> usize {
        let rows = self.len + more;
        self.columns
            .iter()
            .map(|c| {
                let need = rows * c.width;
                let values = if need <= c.values.capacity() {
                    c.values.capacity()
                } else {
                    // MutableBuffer rounds to 64 bytes and at least doubles.
                    need.max(c.values.capacity() * 2).next_multiple_of(64)
                };
                values + c.validity.as_ref().map_or(0, |_| rows.div_ceil(8) * 2 + 64)
            })
            .sum()
    }

    /// Appends rows `rows` of `columns` (arrays of this schema's types, in order).
    /// With `hashes`, the schema's last column (`UInt64`, not in `columns`) takes
    /// `hashes[row]` of each row.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if a column's type is not the schema's or a row is
    /// past the end of the columns (bugs in the caller); nothing is appended then.
    pub fn append(
        &mut self,
        columns: &[ArrayData],
        rows: &[u32],
        hashes: Option<&[u64]>,
    ) -> Result<()> {
        let with_hashes = usize::from(hashes.is_some());
        let num_rows = columns.first().map_or(0, |c| c.len());
        let fits = columns.len() + with_hashes == self.columns.len()
            && columns.iter().all(|c| c.len() == num_rows)
            && hashes.is_none_or(|h| h.len() == num_rows)
            && rows.iter().all(|&r| (r as usize) < num_rows)
            && columns
                .iter()
                .zip(self.schema.fields())
                .all(|(c, f)| c.data_type() == f.data_type());
        if !fits {
            return Err(JoinError::InvalidJoin(
                "internal: gathering rows of another schema or past its end".into(),
            ));
        }
        if let (Some(hashes), Some(column)) = (hashes, self.columns.last_mut()) {
            column.values.reserve(rows.len() * 8);
            for &r in rows {
                column.values.push(hashes[r as usize]);
            }
            if let Some(validity) = column.validity.as_mut() {
                validity.append_n(rows.len(), true);
            }
        }
        for (column, data) in self.columns.iter_mut().zip(columns) {
            let width = column.width;
            let values = data
                .buffers()
                .first()
                .map(|b| b.as_slice())
                .unwrap_or_default();
            let start = data.offset() * width;
            let source = values
                .get(start..start + data.len() * width)
                .ok_or_else(|| {
                    JoinError::InvalidJoin("internal: a column shorter than its length".into())
                })?;
            column.values.reserve(rows.len() * width);
            // Fixed-size copies for the common widths: a copy of a length known only
            // at run time is a call to memmove per value.
            match width {
                1 => gather_fixed::<1>(&mut column.values, source, rows),
                2 => gather_fixed::<2>(&mut column.values, source, rows),
                4 => gather_fixed::<4>(&mut column.values, source, rows),
                8 => gather_fixed::<8>(&mut column.values, source, rows),
                16 => gather_fixed::<16>(&mut column.values, source, rows),
                32 => gather_fixed::<32>(&mut column.values, source, rows),
                _ => {
                    for &r in rows {
                        let at = r as usize * width;
                        if let Some(value) = source.get(at..at + width) {
                            column.values.extend_from_slice(value);
                        }
                    }
                }
            }
            match (data.nulls(), column.validity.as_mut()) {
                (Some(nulls), _) if nulls.null_count() > 0 => {
                    let validity = column.validity.get_or_insert_with(|| {
                        let mut all_valid = BooleanBufferBuilder::new(self.len + rows.len());
                        all_valid.append_n(self.len, true);
                        all_valid
                    });
                    for &r in rows {
                        validity.append(nulls.is_valid(r as usize));
                    }
                }
                (_, Some(validity)) => validity.append_n(rows.len(), true),
                _ => {}
            }
        }
        self.len += rows.len();
        Ok(())
    }

    /// The rows gathered so far as one batch; empties the buffers.
    ///
    /// # Errors
    /// An arrow error if the arrays cannot be made (a bug: their types are checked).
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let len = std::mem::take(&mut self.len);
        let arrays = self
            .columns
            .iter_mut()
            .zip(self.schema.fields())
            .map(|(column, field)| -> Result<ArrayRef> {
                let values = std::mem::replace(&mut column.values, MutableBuffer::new(0));
                let nulls = column
                    .validity
                    .take()
                    .map(|mut v| NullBuffer::new(v.finish()));
                let data = ArrayData::builder(field.data_type().clone())
                    .len(len)
                    .add_buffer(values.into())
                    .nulls(nulls)
                    .build()?;
                Ok(make_array(data))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), arrays)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Decimal128Array, Int32Array, Int64Array, UInt64Array};
    use arrow_schema::{ArrowError, Field, Schema};
    use arrow_select::take::take;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn gathers_what_take_and_concat_would() -> TestResult {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(15, 2), false),
            Field::new("h", DataType::UInt64, false),
            Field::new("s", DataType::Int32, true),
        ]));
        let widths = fixed_widths(&schema).ok_or("not fixed width")?;
        assert_eq!(widths, vec![8, 16, 8, 4]);
        let batch = |start: i64, nulls: bool| -> std::result::Result<Vec<ArrayRef>, ArrowError> {
            let a: Int64Array = (start..start + 10)
                .map(|v| (!nulls || v % 3 != 0).then_some(v))
                .collect();
            let d = Decimal128Array::from_iter_values((start..start + 10).map(|v| v as i128 * 100))
                .with_precision_and_scale(15, 2)?;
            let h = UInt64Array::from_iter_values((start..start + 10).map(|v| v as u64 * 7));
            let s: Int32Array = (start..start + 10).map(|v| Some(v as i32)).collect();
            Ok(vec![Arc::new(a), Arc::new(d), Arc::new(h), Arc::new(s)])
        };
        // A sliced input (offset 2), one without nulls first, then one with them.
        let first: Vec<ArrayRef> = batch(0, false)?.iter().map(|c| c.slice(2, 8)).collect();
        let second = batch(100, true)?;
        let data = |columns: &[ArrayRef]| -> Vec<ArrayData> {
            columns.iter().map(|c| c.to_data()).collect()
        };
        let mut rows = FixedRows::new(Arc::clone(&schema), &widths);
        rows.append(&data(&first), &[0, 5, 7], None)?;
        rows.append(&data(&second), &[9, 0, 3, 3], None)?;
        assert_eq!(rows.len(), 7);
        let got = rows.finish()?;
        assert_eq!(rows.len(), 0);
        for (i, column) in got.columns().iter().enumerate() {
            let a = take(
                first[i].as_ref(),
                &arrow_array::UInt32Array::from(vec![0, 5, 7]),
                None,
            )?;
            let b = take(
                second[i].as_ref(),
                &arrow_array::UInt32Array::from(vec![9, 0, 3, 3]),
                None,
            )?;
            let want = arrow_select::concat::concat(&[a.as_ref(), b.as_ref()])?;
            assert_eq!(column.to_data(), want.to_data(), "column {i}");
        }
        // Reused after finish.
        rows.append(&data(&second), &[1], None)?;
        assert_eq!(rows.finish()?.num_rows(), 1);
        // The last column from hashes instead of an array.
        let hashes: Vec<u64> = (0..10).map(|i| i * 1000).collect();
        let with_hash: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("__hash", DataType::UInt64, false),
        ]));
        let mut rows = FixedRows::new(Arc::clone(&with_hash), &[8, 8]);
        rows.append(&data(&second[..1]), &[4, 2], Some(&hashes))?;
        let got = rows.finish()?;
        let h = got
            .column(1)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or("not a UInt64 column")?;
        assert_eq!(h.values().to_vec(), vec![4000, 2000]);
        Ok(())
    }

    #[test]
    fn refuses_other_types_and_rows_past_the_end() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let mut rows = FixedRows::new(Arc::clone(&schema), &[8]);
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        assert!(rows.append(&[ints.to_data()], &[0], None).is_err());
        let longs: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        assert!(rows.append(&[longs.to_data()], &[2], None).is_err());
        assert_eq!(rows.len(), 0);
        assert!(fixed_widths(&Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8,
            false
        )])))
        .is_none());
    }
}
