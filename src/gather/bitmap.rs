//! The bitmaps of a gathered column, one bit a row: its validity (which appears
//! with the first null, so that a column without nulls keeps none) and the values
//! of a `Boolean` column.

use arrow_buffer::{bit_util, BooleanBufferBuilder, NullBuffer};
use arrow_data::ArrayData;

use super::column::short_column;
use crate::error::Result;

/// A bitmap's bytes once it holds `rows` bits (it doubles as it grows).
#[inline]
pub(super) fn bitmap_bytes(rows: usize) -> usize {
    rows.div_ceil(8) * 2 + 64
}

/// Appends the validity of rows `rows` of `data` to the `validity` of a column
/// holding `len` rows: a validity buffer appears with the first null.
#[inline]
pub(super) fn append_validity(
    validity: &mut Option<BooleanBufferBuilder>,
    data: &ArrayData,
    rows: &[u32],
    len: usize,
) {
    match (data.nulls(), validity.as_mut()) {
        (Some(nulls), _) if nulls.null_count() > 0 => {
            let validity = validity.get_or_insert_with(|| {
                let mut all_valid = BooleanBufferBuilder::new(len + rows.len());
                all_valid.append_n(len, true);
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

/// The validity gathered, if a null arrived; empties it.
pub(super) fn finish_validity(validity: &mut Option<BooleanBufferBuilder>) -> Option<NullBuffer> {
    validity.take().map(|mut v| NullBuffer::new(v.finish()))
}

/// Appends the values of rows `rows` of `Boolean` array `data` to `bits`.
///
/// # Errors
/// [`crate::JoinError::Internal`] if `data`'s bitmap is shorter than its rows.
#[inline]
pub(super) fn append_bools(
    bits: &mut BooleanBufferBuilder,
    data: &ArrayData,
    rows: &[u32],
) -> Result<()> {
    let source = data
        .buffers()
        .first()
        .map(|b| b.as_slice())
        .unwrap_or_default();
    let offset = data.offset();
    if source.len() * 8 < offset + data.len() {
        return Err(short_column());
    }
    for &r in rows {
        bits.append(bit_util::get_bit(source, offset + r as usize));
    }
    Ok(())
}
