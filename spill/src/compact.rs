//! View arrays cut to the bytes their rows use before they are written.
//!
//! A view array (`Utf8View`, `BinaryView`) points into data buffers it may share
//! with many other arrays: a `take` or `filter` of a large batch copies the views
//! and keeps every buffer, and a Parquet reader hands out views into whole
//! decompressed pages. An IPC record batch carries every buffer an array has, so
//! written as it is, a filtered hundredth of a batch writes all of the batch's
//! string bytes. [`compact`] copies the bytes the rows use into fresh buffers when
//! the buffers hold more than [`SLACK_NUM`]/[`SLACK_DEN`] of them, so that a spill
//! file's bytes are bounded by its rows' bytes whatever their input shared.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_data::{ArrayData, MAX_INLINE_VIEW_LEN};
use arrow_schema::{ArrowError, DataType};

/// A view array is compacted when its data buffers hold more than
/// `SLACK_NUM / SLACK_DEN` times the bytes its rows use (plus
/// [`SLACK_BYTES`]): gathered arrays, whose buffers hold only their rows'
/// bytes, are written as they are.
const SLACK_NUM: usize = 9;
const SLACK_DEN: usize = 8;

/// Buffers of up to this many unused bytes are not worth a copy.
const SLACK_BYTES: usize = 4096;

/// The bytes of `array`'s rows that lie outside their views, and the bytes of its
/// data buffers.
fn used_and_held(array: &dyn Array) -> (usize, usize) {
    let data = array.to_data();
    let held = data.buffers().iter().skip(1).map(|b| b.len()).sum();
    (view_data_bytes(&data), held)
}

/// The bytes of a view array's rows (`Utf8View`, `BinaryView`) kept outside their
/// views: what its rows use of its data buffers, however many other arrays share
/// them.
pub fn view_data_bytes(data: &ArrayData) -> usize {
    let views = data
        .buffers()
        .first()
        .map_or(&[][..], |b| b.typed_data::<u128>());
    let start = data.offset().min(views.len());
    let end = (data.offset() + data.len()).min(views.len());
    views[start..end]
        .iter()
        .map(|&v| v as u32)
        .filter(|&len| len > MAX_INLINE_VIEW_LEN)
        .map(|len| len as usize)
        .sum()
}

/// `column`, its view data copied out if it wastes more than the slack allows.
fn compact_column(column: &ArrayRef) -> Option<ArrayRef> {
    let compact = |array: &dyn Array| {
        let (used, held) = used_and_held(array);
        held > used / SLACK_DEN * SLACK_NUM + SLACK_BYTES
    };
    match column.data_type() {
        DataType::Utf8View if compact(column.as_ref()) => {
            Some(Arc::new(column.as_string_view().gc()))
        }
        DataType::BinaryView if compact(column.as_ref()) => {
            Some(Arc::new(column.as_binary_view().gc()))
        }
        _ => None,
    }
}

/// `batch` with every view column that holds buffers mostly of other rows' bytes
/// copied out ([`gc`](arrow_array::GenericByteViewArray::gc)); the batch itself
/// when none does.
///
/// # Errors
/// An arrow error if the batch cannot be made again (it cannot: the columns keep
/// their types and lengths).
pub(crate) fn compact(batch: &RecordBatch) -> Result<Option<RecordBatch>, ArrowError> {
    let compacted: Vec<Option<ArrayRef>> = batch.columns().iter().map(compact_column).collect();
    if compacted.iter().all(Option::is_none) {
        return Ok(None);
    }
    let columns = compacted
        .into_iter()
        .zip(batch.columns())
        .map(|(c, original)| c.unwrap_or_else(|| Arc::clone(original)))
        .collect();
    RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{StringViewArray, UInt32Array};
    use arrow_schema::{Field, Schema};

    #[test]
    fn a_few_rows_of_a_shared_buffer_are_copied_out_and_gathered_ones_are_not(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let long: StringViewArray = (0..1000)
            .map(|i| Some(format!("a string longer than twelve bytes {i:04}")))
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)]));
        let whole = RecordBatch::try_new(schema, vec![Arc::new(long)])?;
        // Written whole, nothing to compact.
        assert!(compact(&whole)?.is_none());
        // Ten rows taken share all 1000 rows' bytes: copied out.
        let idx = UInt32Array::from_iter_values((0..10).map(|i| i * 100));
        let taken = arrow_select::take::take_record_batch(&whole, &idx)?;
        let (used, held) = used_and_held(taken.column(0).as_ref());
        assert!(held > 50 * used, "{used} {held}");
        let compacted = compact(&taken)?.ok_or("not compacted")?;
        let (used, held) = used_and_held(compacted.column(0).as_ref());
        assert!(held <= used, "{used} {held}");
        assert_eq!(compacted.column(0).to_data().len(), 10);
        assert_eq!(
            compacted.column(0).as_string_view().value(3),
            taken.column(0).as_string_view().value(3)
        );
        Ok(())
    }
}
