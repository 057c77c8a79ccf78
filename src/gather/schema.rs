//! What a schema's columns allow a [`GatherBuffer`](super::GatherBuffer): whether
//! it can gather them at all, whether their rows have a size known from their count,
//! and which of a spill file's columns may be gathered halved.
//!
//! Its own file because these are asked of a schema before any buffer exists (by
//! the build and probe sides as they plan their spills).

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};

use super::column::Column;

/// Per column of a spill file's wide schema ([`spilljoin_spill::file_schema`]):
/// whether [`GatherBuffer::halving`](super::GatherBuffer::halving) may gather it as
/// `Int32` (its `Int64` columns).
pub(crate) fn halvable(schema: &SchemaRef) -> Vec<bool> {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type() == &DataType::Int64)
        .collect()
}

/// Per column of `batch` (the columns a [`halvable`] mask is over, a hash column
/// excepted): halvable, and every value fits in 32 bits
/// ([`spilljoin_spill::fits_i32`]): what
/// [`GatherBuffer::shape_for`](super::GatherBuffer::shape_for) and
/// [`GatherBuffer::admits`](super::GatherBuffer::admits) take.
pub(crate) fn halvable_fits(batch: &RecordBatch, halvable: &[bool]) -> Vec<bool> {
    batch
        .columns()
        .iter()
        .zip(halvable.iter().copied().chain(std::iter::repeat(false)))
        .map(|(c, halvable)| halvable && spilljoin_spill::fits_i32(c))
        .collect()
}

/// The byte width of each column of `schema`, if every column has a fixed width
/// (primitive types, decimals, dates, times, timestamps, durations and intervals):
/// rows whose size is known from their count.
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

/// Whether a [`GatherBuffer`](super::GatherBuffer) can gather rows of `schema`:
/// every column of a type in the table of `column` (not nested).
pub(crate) fn gatherable(schema: &SchemaRef) -> bool {
    schema
        .fields()
        .iter()
        .all(|f| Column::for_field(f).is_some())
}
