//! Cutting a gathered batch into the pieces a spill file writes, each view column's
//! data cut to what the piece's rows use.
//!
//! Its own file because it works on finished arrays, not on the buffers being
//! gathered.

use arrow_array::{make_array, ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::{ArrayData, ByteView, MAX_INLINE_VIEW_LEN};
use arrow_schema::DataType;

use super::views::views_of;
use crate::error::Result;

/// `batch`'s rows `start..start + len`, each view column's data cut to what those
/// rows use ([`slice_compact`]): a spill file writes every buffer an array has.
///
/// # Errors
/// An arrow error if the batch cannot be made.
pub(crate) fn slice_batch(batch: &RecordBatch, start: usize, len: usize) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .map(|c| slice_compact(c, start, len))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(len)),
    )?)
}

/// An array of `data`'s rows `start..start + len` whose view data, if any, is only
/// what those rows use: a slice of a gathered view array shares blocks it mostly
/// does not use, and a spill file writes every block an array has. The rows of a
/// gathered buffer take their blocks in order, so their bytes are one range of
/// them, sliced (views rewritten, data uncopied); other arrays are sliced as they
/// are (a slice of offsets is written as only its bytes).
///
/// # Errors
/// An arrow error if the array cannot be made.
fn slice_compact(array: &ArrayRef, start: usize, len: usize) -> Result<ArrayRef> {
    if !matches!(array.data_type(), DataType::Utf8View | DataType::BinaryView) {
        return Ok(array.slice(start, len));
    }
    let data = array.to_data().slice(start, len);
    let views = views_of(&data);
    let blocks = data.buffers().get(1..).unwrap_or_default();
    // The range each block's used bytes take.
    let mut ranges: Vec<(usize, usize)> = vec![(usize::MAX, 0); blocks.len()];
    for &view in views {
        if view as u32 > MAX_INLINE_VIEW_LEN {
            let v = ByteView::from(view);
            if let Some(range) = ranges.get_mut(v.buffer_index as usize) {
                range.0 = range.0.min(v.offset as usize);
                range.1 = range.1.max(v.offset as usize + v.length as usize);
            }
        }
    }
    let used: Vec<usize> = (0..blocks.len())
        .filter(|&b| ranges[b].0 < ranges[b].1)
        .collect();
    let mut index = vec![0u32; blocks.len()];
    for (new, &b) in used.iter().enumerate() {
        index[b] = new as u32;
    }
    let rebased: Vec<u128> = views
        .iter()
        .map(|&view| {
            if view as u32 <= MAX_INLINE_VIEW_LEN {
                return view;
            }
            let mut v = ByteView::from(view);
            let b = v.buffer_index as usize;
            v.offset -= ranges[b].0 as u32;
            v.buffer_index = index[b];
            v.as_u128()
        })
        .collect();
    let mut builder = ArrayData::builder(data.data_type().clone())
        .len(len)
        .nulls(data.nulls().cloned())
        .add_buffer(Buffer::from_vec(rebased));
    for &b in &used {
        let (s, e) = ranges[b];
        builder = builder.add_buffer(blocks[b].slice_with_length(s, e - s));
    }
    Ok(make_array(builder.build()?))
}
