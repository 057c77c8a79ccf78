//! Decimals of at most 18 digits are written as 8-byte integers.
//!
//! A `Decimal128(p, s)` value takes 16 bytes in Arrow, but with `p <= 18` it fits
//! an `i64`: TPC-H's prices, for one, would fill half of every spilled row with
//! zeros. A spill file's schema gives such a column as `Int64`, with the original
//! type in the field's metadata ([`NARROWED_KEY`]); the writer narrows each batch
//! and the reader widens it back, so callers only ever see their own schema. A value
//! that does not fit in 64 bits (arrow does not enforce a decimal's precision on its
//! values) is refused with an error rather than written wrongly.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::{ArrayRef, Decimal128Array, Int64Array, RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

/// The field metadata key that marks a narrowed decimal; its value is
/// `precision,scale`.
pub const NARROWED_KEY: &str = "spilljoin.spill.decimal128";

/// The schema a file of batches of `logical` is written in (`logical` itself when
/// nothing narrows): a writer also takes batches already in it
/// ([`crate::SpillWriter::write`]), gathered narrow by the caller.
pub fn file_schema(logical: &SchemaRef) -> SchemaRef {
    if !logical.fields().iter().any(|f| narrows(f.data_type())) {
        return Arc::clone(logical);
    }
    let fields: Vec<Field> = logical
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Decimal128(p, s) if narrows(f.data_type()) => {
                let mut metadata = f.metadata().clone();
                metadata.insert(NARROWED_KEY.to_owned(), format!("{p},{s}"));
                Field::new(f.name(), DataType::Int64, f.is_nullable()).with_metadata(metadata)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        logical.metadata().clone(),
    ))
}

/// The schema of the batches a file written in `file` holds (`file` itself when
/// nothing was narrowed).
///
/// # Errors
/// A malformed [`NARROWED_KEY`] value.
pub(crate) fn logical_schema(file: &SchemaRef) -> Result<SchemaRef, ArrowError> {
    if !file
        .fields()
        .iter()
        .any(|f| f.metadata().contains_key(NARROWED_KEY))
    {
        return Ok(Arc::clone(file));
    }
    let fields = file
        .fields()
        .iter()
        .map(|f| match f.metadata().get(NARROWED_KEY) {
            Some(value) => {
                let (p, s) = value
                    .split_once(',')
                    .and_then(|(p, s)| Some((p.parse::<u8>().ok()?, s.parse::<i8>().ok()?)))
                    .ok_or_else(|| {
                        ArrowError::IpcError(format!("bad {NARROWED_KEY} metadata: {value}"))
                    })?;
                let metadata: HashMap<String, String> = f
                    .metadata()
                    .iter()
                    .filter(|(k, _)| k.as_str() != NARROWED_KEY)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                Ok(
                    Field::new(f.name(), DataType::Decimal128(p, s), f.is_nullable())
                        .with_metadata(metadata),
                )
            }
            None => Ok(f.as_ref().clone()),
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        file.metadata().clone(),
    )))
}

/// Whether a column of this type is written narrower.
fn narrows(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Decimal128(p, _) if *p <= 18)
}

/// `batch` (of the logical schema) in the `file` schema.
///
/// # Errors
/// A decimal value that does not fit in 64 bits.
pub(crate) fn narrow(batch: &RecordBatch, file: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    convert(batch, file, |column, field| {
        if field.data_type() != &DataType::Int64 || column.data_type() == &DataType::Int64 {
            return Ok(Arc::clone(column));
        }
        let decimals = column.as_primitive_opt::<Decimal128Type>().ok_or_else(|| {
            ArrowError::SchemaError(format!("{} is not a decimal", column.data_type()))
        })?;
        let narrowed: Int64Array = decimals.try_unary(|v| {
            i64::try_from(v).map_err(|_| {
                ArrowError::InvalidArgumentError(format!(
                    "decimal value {v} of column {} exceeds its precision",
                    field.name()
                ))
            })
        })?;
        Ok(Arc::new(narrowed))
    })
}

/// `batch` (of a file's schema) in the `logical` schema.
///
/// # Errors
/// Types that do not match (a bug, or a file altered behind our back).
pub(crate) fn widen(batch: &RecordBatch, logical: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    convert(batch, logical, |column, field| {
        let DataType::Decimal128(p, s) = field.data_type() else {
            return Ok(Arc::clone(column));
        };
        if column.data_type() != &DataType::Int64 {
            return Ok(Arc::clone(column));
        }
        let ints = column.as_primitive::<Int64Type>();
        let widened: Decimal128Array = ints.unary(i128::from);
        Ok(Arc::new(widened.with_precision_and_scale(*p, *s)?))
    })
}

/// `batch` in `schema`, each column passed through `column` with its field there.
fn convert(
    batch: &RecordBatch,
    schema: &SchemaRef,
    column: impl Fn(&ArrayRef, &Field) -> Result<ArrayRef, ArrowError>,
) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, field)| column(c, field))
        .collect::<Result<Vec<_>, ArrowError>>()?;
    RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    #[test]
    fn narrow_decimals_round_trip_and_others_stay() -> Result<(), ArrowError> {
        let logical: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("wide", DataType::Decimal128(38, 4), false),
            Field::new("k", DataType::Int64, false),
        ]));
        let file = file_schema(&logical);
        assert_eq!(file.field(0).data_type(), &DataType::Int64);
        assert_eq!(file.field(1).data_type(), &DataType::Decimal128(38, 4));
        assert_eq!(logical_schema(&file)?, logical);
        let price = Decimal128Array::from(vec![Some(12345), None, Some(-999_999_999_999_999)])
            .with_precision_and_scale(15, 2)?;
        let wide =
            Decimal128Array::from(vec![i128::MAX / 3, 0, -1]).with_precision_and_scale(38, 4)?;
        let k = Int64Array::from(vec![1, 2, 3]);
        let batch = RecordBatch::try_new(
            Arc::clone(&logical),
            vec![Arc::new(price), Arc::new(wide), Arc::new(k)],
        )?;
        let narrowed = narrow(&batch, &file)?;
        assert_eq!(narrowed.column(0).data_type(), &DataType::Int64);
        assert_eq!(narrowed.column(0).null_count(), 1);
        assert_eq!(widen(&narrowed, &logical)?, batch);
        // A value past 64 bits is refused, not truncated.
        let too_big = Decimal128Array::from(vec![i128::from(i64::MAX) + 1])
            .with_precision_and_scale(15, 2)?;
        let bad = RecordBatch::try_new(
            Arc::new(Schema::new(vec![logical.field(0).clone()])),
            vec![Arc::new(too_big)],
        )?;
        let bad_file = file_schema(&bad.schema());
        assert!(narrow(&bad, &bad_file).is_err());
        // Nothing to narrow: the same schema.
        let plain: SchemaRef = Arc::new(Schema::new(vec![logical.field(2).clone()]));
        assert!(Arc::ptr_eq(&file_schema(&plain), &plain));
        Ok(())
    }
}
