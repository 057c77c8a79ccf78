//! Columns are written in as few bytes as their values need.
//!
//! A `Decimal128(p, s)` value takes 16 bytes in Arrow, but with `p <= 18` it fits
//! an `i64`, and an `Int64` column often holds values that fit an `i32`: TPC-H's
//! order keys and prices, for two, would fill three quarters of every spilled row
//! with zeros. So a spill file stores
//!
//! - a decimal of at most 18 digits as `Int64` ([`file_schema`], the *wide* file
//!   schema, which callers may also gather into directly), with the original type in
//!   the field's metadata ([`NARROWED_KEY`]);
//! - a view column (`Utf8View`, `BinaryView`) as offsets and data (`Utf8`,
//!   `Binary`), marked with [`VIEW_KEY`] (see `crate::views`);
//! - any column that is `Int64` in the wide file schema (an `Int64` input or such a
//!   decimal) as `Int32` while every value of the batches written so far fits one.
//!
//! The last choice is made batch by batch, and an IPC stream has one schema: a file
//! is therefore one or more *segments*, each opened by its own schema message, in
//! which a column may only widen (so a file of `n` such columns has at most `n + 1`
//! segments; the end-of-stream marker closes the last). The reader widens every
//! batch back, so callers only ever see their own schema. A decimal value that does
//! not fit in 64 bits (arrow does not enforce a decimal's precision on its values) is
//! refused with an error rather than written wrongly.
//!
//! Field metadata keys of the caller's that begin with our prefix
//! (`spilljoin.spill.`) are escaped in the file and unescaped when read, so an input
//! field can never be taken for one of ours.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int32Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, Decimal128Array, Int32Array, Int64Array, RecordBatch, RecordBatchOptions,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

use crate::views::VIEW_KEY;

/// The field metadata key that marks a narrowed decimal (stored as `Int64` or
/// `Int32`); its value is `precision,scale`.
pub const NARROWED_KEY: &str = "spilljoin.spill.decimal128";

/// The field metadata key that marks an `Int64` column stored as `Int32`.
const INT64_KEY: &str = "spilljoin.spill.int64";

/// The prefix of every metadata key of ours.
const PREFIX: &str = "spilljoin.spill.";

/// Put before a caller's metadata key that begins with [`PREFIX`].
const ESCAPED: &str = "spilljoin.spill.escaped.";

/// The schema a file of batches of `logical` is written in, as wide as it gets
/// (`logical` itself when nothing narrows): decimals of at most 18 digits as
/// `Int64`, view columns as offsets (`Utf8`, `Binary`). A writer also takes batches already in it ([`crate::SpillWriter::write`]),
/// gathered narrow by the caller; it may write their `Int64` columns narrower still.
pub fn file_schema(logical: &SchemaRef) -> SchemaRef {
    let escapes = |f: &Field| f.metadata().keys().any(|k| k.starts_with(PREFIX));
    if !logical
        .fields()
        .iter()
        .any(|f| narrows(f.data_type()) || escapes(f))
    {
        return Arc::clone(logical);
    }
    let fields: Vec<Field> = logical
        .fields()
        .iter()
        .map(|f| {
            let mut metadata: HashMap<String, String> = f
                .metadata()
                .iter()
                .map(|(k, v)| {
                    let k = if k.starts_with(PREFIX) {
                        format!("{ESCAPED}{k}")
                    } else {
                        k.clone()
                    };
                    (k, v.clone())
                })
                .collect();
            let data_type = match f.data_type() {
                DataType::Decimal128(p, s) if narrows(f.data_type()) => {
                    metadata.insert(NARROWED_KEY.to_owned(), format!("{p},{s}"));
                    DataType::Int64
                }
                view => match crate::views::stored_type(view) {
                    Some(stored) => {
                        metadata.insert(VIEW_KEY.to_owned(), String::new());
                        stored
                    }
                    None => view.clone(),
                },
            };
            Field::new(f.name(), data_type, f.is_nullable()).with_metadata(metadata)
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        logical.metadata().clone(),
    ))
}

/// The columns of a wide file schema that may be written as `Int32`: its `Int64`
/// columns.
pub(crate) fn halvable(wide: &Schema) -> Vec<usize> {
    wide.fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.data_type() == &DataType::Int64)
        .map(|(i, _)| i)
        .collect()
}

/// The schema of a segment of a file whose wide schema ([`file_schema`]) is `wide`:
/// `wide` with the columns `halved` (`Int64` columns of it) as `Int32`. A writer
/// also takes batches already in such a schema, gathered halved by the caller.
pub fn segment_schema(wide: &SchemaRef, halved: &[usize]) -> SchemaRef {
    if halved.is_empty() {
        return Arc::clone(wide);
    }
    let fields: Vec<Field> = wide
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if !halved.contains(&i) {
                return f.as_ref().clone();
            }
            let mut metadata = f.metadata().clone();
            if !metadata.contains_key(NARROWED_KEY) {
                metadata.insert(INT64_KEY.to_owned(), String::new());
            }
            Field::new(f.name(), DataType::Int32, f.is_nullable()).with_metadata(metadata)
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, wide.metadata().clone()))
}

/// Whether every value of `column` (an `Int64` or `Decimal128` column; null slots
/// included, whatever they hold) fits an `i32`; `true` for an `Int32` column, `false`
/// for any other.
pub fn fits_i32(column: &dyn Array) -> bool {
    if column.data_type() == &DataType::Int32 {
        return true;
    }
    // `v` fits iff `v + 2^31` lies in `0..2^32`: one add and one OR a value, which
    // vectorise without 64-bit comparisons (absent from baseline x86-64).
    const BIAS: i64 = 1 << 31;
    if let Some(ints) = column.as_primitive_opt::<Int64Type>() {
        let high = ints
            .values()
            .iter()
            .fold(0_u64, |acc, &v| acc | v.wrapping_add(BIAS) as u64);
        return high >> 32 == 0;
    }
    if let Some(decimals) = column.as_primitive_opt::<Decimal128Type>() {
        let high = decimals.values().iter().fold(0_u128, |acc, &v| {
            acc | v.wrapping_add(i128::from(BIAS)) as u128
        });
        return high >> 32 == 0;
    }
    false
}

/// The schema of the batches a file holds, from the schema of any of its segments
/// (`file` itself when it carries no key of ours).
///
/// # Errors
/// A malformed [`NARROWED_KEY`] value, or a key of ours on a column of a type it
/// cannot mark.
pub(crate) fn logical_schema(file: &SchemaRef) -> Result<SchemaRef, ArrowError> {
    if !file
        .fields()
        .iter()
        .any(|f| f.metadata().keys().any(|k| k.starts_with(PREFIX)))
    {
        return Ok(Arc::clone(file));
    }
    let fields = file
        .fields()
        .iter()
        .map(|f| {
            let stored = f.data_type();
            let data_type = if let Some(value) = f.metadata().get(NARROWED_KEY) {
                let (p, s) = value
                    .split_once(',')
                    .and_then(|(p, s)| Some((p.parse::<u8>().ok()?, s.parse::<i8>().ok()?)))
                    .filter(|_| matches!(stored, DataType::Int64 | DataType::Int32))
                    .ok_or_else(|| {
                        ArrowError::IpcError(format!(
                            "bad {NARROWED_KEY} metadata {value:?} on a {stored} column"
                        ))
                    })?;
                DataType::Decimal128(p, s)
            } else if f.metadata().contains_key(VIEW_KEY) {
                crate::views::view_type(stored).ok_or_else(|| {
                    ArrowError::IpcError(format!("{VIEW_KEY} metadata on a {stored} column"))
                })?
            } else if f.metadata().contains_key(INT64_KEY) {
                if stored != &DataType::Int32 {
                    return Err(ArrowError::IpcError(format!(
                        "{INT64_KEY} metadata on a {stored} column"
                    )));
                }
                DataType::Int64
            } else {
                stored.clone()
            };
            let metadata: HashMap<String, String> = f
                .metadata()
                .iter()
                .filter(|(k, _)| ![NARROWED_KEY, INT64_KEY, VIEW_KEY].contains(&k.as_str()))
                .map(|(k, v)| {
                    let k = k.strip_prefix(ESCAPED).unwrap_or(k);
                    (k.to_owned(), v.clone())
                })
                .collect();
            Ok(Field::new(f.name(), data_type, f.is_nullable()).with_metadata(metadata))
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        file.metadata().clone(),
    )))
}

/// Whether a column of this type is written narrower in the wide file schema: a
/// decimal of at most 18 digits, or a view column (as offsets, `crate::views`).
fn narrows(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Decimal128(p, _) if *p <= 18)
        || crate::views::stored_type(data_type).is_some()
}

/// `batch` (of the logical or the wide file schema, or of another segment's) in
/// `segment`, a schema from [`segment_schema`] whose `Int32` columns the caller has
/// checked with [`fits_i32`].
///
/// # Errors
/// A decimal value that does not fit in 64 bits.
pub(crate) fn narrow(batch: &RecordBatch, segment: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    convert(batch, segment, |column, field| {
        match (field.data_type(), column.data_type()) {
            (DataType::Int32, DataType::Int64) => {
                let ints = column.as_primitive::<Int64Type>();
                debug_assert!(fits_i32(ints));
                let halved: Int32Array = ints.unary(|v| v as i32);
                Ok(Arc::new(halved))
            }
            (DataType::Int32, DataType::Decimal128(..)) => {
                let decimals = column.as_primitive::<Decimal128Type>();
                debug_assert!(fits_i32(decimals));
                let halved: Int32Array = decimals.unary(|v| v as i32);
                Ok(Arc::new(halved))
            }
            (DataType::Int64, DataType::Int32) => {
                // Gathered halved by the caller, written wide in this segment.
                let ints = column.as_primitive::<Int32Type>();
                let widened: Int64Array = ints.unary(i64::from);
                Ok(Arc::new(widened))
            }
            (DataType::Utf8, DataType::Utf8View) | (DataType::Binary, DataType::BinaryView) => {
                crate::views::to_offsets(column)
            }
            (DataType::Int64, DataType::Decimal128(..)) => {
                let decimals = column.as_primitive::<Decimal128Type>();
                let narrowed: Int64Array = decimals.try_unary(|v| {
                    i64::try_from(v).map_err(|_| {
                        ArrowError::InvalidArgumentError(format!(
                            "decimal value {v} of column {} exceeds its precision",
                            field.name()
                        ))
                    })
                })?;
                Ok(Arc::new(narrowed))
            }
            _ => Ok(Arc::clone(column)),
        }
    })
}

/// `batch` (of a segment's schema) in the `logical` schema.
///
/// # Errors
/// Types that do not match (a bug, or a file altered behind our back).
pub(crate) fn widen(batch: &RecordBatch, logical: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    convert(batch, logical, |column, field| {
        widen_column(column, field.data_type())
    })
}

/// `column`, of a type a file stores (a narrowed decimal, a halved `Int64`, a view
/// column's offsets), as `logical`: the type it was narrowed from. A column already
/// of another type is returned as it is. Views made from offsets point into the
/// column's data buffer, so the values are not copied again.
///
/// # Errors
/// A decimal precision and scale that the values do not allow.
pub fn widen_column(column: &ArrayRef, logical: &DataType) -> Result<ArrayRef, ArrowError> {
    match (logical, column.data_type()) {
        (DataType::Decimal128(p, s), DataType::Int64) => {
            let ints = column.as_primitive::<Int64Type>();
            let widened: Decimal128Array = ints.unary(i128::from);
            Ok(Arc::new(widened.with_precision_and_scale(*p, *s)?))
        }
        (DataType::Decimal128(p, s), DataType::Int32) => {
            let ints = column.as_primitive::<Int32Type>();
            let widened: Decimal128Array = ints.unary(i128::from);
            Ok(Arc::new(widened.with_precision_and_scale(*p, *s)?))
        }
        (DataType::Int64, DataType::Int32) => {
            let ints = column.as_primitive::<Int32Type>();
            let widened: Int64Array = ints.unary(i64::from);
            Ok(Arc::new(widened))
        }
        (view @ DataType::Utf8View, DataType::Utf8)
        | (view @ DataType::BinaryView, DataType::Binary) => crate::views::to_views(column, view),
        _ => Ok(Arc::clone(column)),
    }
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

    fn logical() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("wide", DataType::Decimal128(38, 4), false),
            Field::new("k", DataType::Int64, false),
        ]))
    }

    fn batch(price: Vec<Option<i128>>, k: Vec<i64>) -> Result<RecordBatch, ArrowError> {
        let n = k.len();
        let price = Decimal128Array::from(price).with_precision_and_scale(15, 2)?;
        let wide = Decimal128Array::from(vec![i128::MAX / 3; n]).with_precision_and_scale(38, 4)?;
        RecordBatch::try_new(
            logical(),
            vec![
                Arc::new(price),
                Arc::new(wide),
                Arc::new(Int64Array::from(k)),
            ],
        )
    }

    #[test]
    fn narrow_decimals_round_trip_and_others_stay() -> Result<(), ArrowError> {
        let logical = logical();
        let file = file_schema(&logical);
        assert_eq!(file.field(0).data_type(), &DataType::Int64);
        assert_eq!(file.field(1).data_type(), &DataType::Decimal128(38, 4));
        assert_eq!(logical_schema(&file)?, logical);
        let batch = batch(
            vec![Some(12345), None, Some(-999_999_999_999_999)],
            vec![1, 2, 3],
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

    #[test]
    fn int64_columns_halve_while_their_values_fit() -> Result<(), ArrowError> {
        let logical = logical();
        let wide = file_schema(&logical);
        assert_eq!(halvable(&wide), vec![0, 2]);
        let small = batch(
            vec![Some(i128::from(i32::MAX)), None],
            vec![i64::from(i32::MIN), 7],
        )?;
        assert!(fits_i32(small.column(0)) && fits_i32(small.column(2)));
        let segment = segment_schema(&wide, &[0, 2]);
        assert_eq!(segment.field(0).data_type(), &DataType::Int32);
        assert_eq!(segment.field(2).data_type(), &DataType::Int32);
        assert_eq!(logical_schema(&segment)?, logical);
        let halved = narrow(&small, &segment)?;
        assert_eq!(halved.column(0).data_type(), &DataType::Int32);
        assert_eq!(halved.column(0).null_count(), 1);
        assert_eq!(widen(&halved, &logical)?, small);
        // From the wide file schema too (a batch gathered narrow by the caller).
        assert_eq!(
            widen(&narrow(&narrow(&small, &wide)?, &segment)?, &logical)?,
            small
        );
        // One value past 32 bits, in either direction, and the column does not fit.
        let big = batch(
            vec![Some(i128::from(i32::MAX) + 1)],
            vec![i64::from(i32::MIN) - 1],
        )?;
        assert!(!fits_i32(big.column(0)) && !fits_i32(big.column(2)));
        Ok(())
    }

    #[test]
    fn our_metadata_keys_on_input_fields_are_escaped() -> Result<(), ArrowError> {
        let mine = HashMap::from([
            (NARROWED_KEY.to_owned(), "1,0".to_owned()),
            (INT64_KEY.to_owned(), String::new()),
            (format!("{ESCAPED}x"), "y".to_owned()),
            ("other".to_owned(), "z".to_owned()),
        ]);
        let logical: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false).with_metadata(mine.clone()),
            Field::new("s", DataType::Utf8, false).with_metadata(mine),
        ]));
        let wide = file_schema(&logical);
        assert!(!wide.field(0).metadata().contains_key(NARROWED_KEY));
        assert_eq!(logical_schema(&wide)?, logical);
        let segment = segment_schema(&wide, &halvable(&wide));
        assert_eq!(segment.field(0).data_type(), &DataType::Int32);
        assert_eq!(logical_schema(&segment)?, logical);
        Ok(())
    }
}
