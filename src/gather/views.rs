//! Gathering a view column (`Utf8View`, `BinaryView`): each row's view copied, and
//! the bytes of a long value copied into data blocks of the column's own, its view
//! rewritten to point there.
//!
//! Its own file because views are where gathering pays most: `take` of a view array
//! copies only the views, sharing every data buffer of its input. (A spill file
//! holds view columns as offsets: see `offsets`, which gathers them so too.)

use arrow_buffer::Buffer;
use arrow_data::{ArrayData, ArrayDataBuilder, ByteView, MAX_INLINE_VIEW_LEN};

use super::column::{short_column, ColumnGrowth};
use super::values::Values;
use crate::error::Result;

/// The largest data block of a view column: views address a block by a 32-bit
/// offset; past this a new block begins. (Kept below `i32::MAX` for readers that
/// take the offset as signed.)
const VIEW_BLOCK_MAX_BYTES: usize = i32::MAX as usize;

/// The `len` views of a view array (empty if they are not all there).
pub(super) fn views_of(data: &ArrayData) -> &[u128] {
    let Some(buffer) = data.buffers().first() else {
        return &[];
    };
    // SAFETY: `align_to` only reinterprets the aligned middle of the bytes as
    // `u128`s (any bit pattern is a valid one); an unaligned buffer gives an empty
    // middle whose prefix is not, and is then refused below.
    let (prefix, views, _) = unsafe { buffer.as_slice().align_to::<u128>() };
    if !prefix.is_empty() {
        return &[];
    }
    views
        .get(data.offset()..data.offset() + data.len())
        .unwrap_or_default()
}

/// The bytes of rows `rows` of a view array kept outside their views, and those of
/// all their values.
pub(super) fn view_bytes(data: &ArrayData, rows: &[u32]) -> (usize, usize) {
    let views = views_of(data);
    rows.iter().fold((0, 0), |(outside, all), &r| {
        let len = views.get(r as usize).map_or(0, |&v| v as u32);
        let long = if len > MAX_INLINE_VIEW_LEN { len } else { 0 };
        (outside + long as usize, all + len as usize)
    })
}

/// The bytes of a value of `blocks` (a view array's data buffers) that `view`
/// describes: a short value's are the view's own, past the length.
#[inline]
pub(super) fn value_at<'a>(view: &'a u128, blocks: &'a [Buffer]) -> Option<&'a [u8]> {
    let len = *view as u32;
    if len <= MAX_INLINE_VIEW_LEN {
        let bytes: &[u8; 16] = arrow_buffer::ToByteSlice::to_byte_slice(view)
            .try_into()
            .ok()?;
        return bytes.get(4..4 + len as usize);
    }
    let v = ByteView::from(*view);
    let start = v.offset as usize;
    blocks
        .get(v.buffer_index as usize)?
        .as_slice()
        .get(start..start + len as usize)
}

/// The bytes of value `i` of a view array, if it has them (a short value's are its
/// view's, past the length).
pub(super) fn view_value(values: &ArrayData, i: usize) -> Option<&[u8]> {
    let view = views_of(values).get(i)?;
    value_at(view, values.buffers().get(1..).unwrap_or_default())
}

/// A view column's views and the data blocks they point into.
#[derive(Debug)]
pub(crate) struct Views {
    views: Values,
    block: Values,
    /// Blocks filled up to [`VIEW_BLOCK_MAX_BYTES`].
    sealed: Vec<Buffer>,
    sealed_bytes: usize,
    row_bytes: usize,
}

impl Views {
    pub(super) fn new() -> Self {
        Self {
            views: Values::default(),
            block: Values::default(),
            sealed: Vec::new(),
            sealed_bytes: 0,
            row_bytes: 0,
        }
    }

    /// Bytes of data held, in blocks sealed and the one being filled.
    #[inline]
    pub(super) fn data_bytes(&self) -> usize {
        self.sealed_bytes + self.block.len()
    }

    /// The bytes its views and blocks may hold once `more` rows of `growth` are
    /// added, if first allocated for `expected` rows.
    #[inline]
    pub(super) fn capacity_after(
        &self,
        more: usize,
        growth: &ColumnGrowth,
        expected: usize,
    ) -> usize {
        self.views
            .resident_after(more * 16, expected.saturating_mul(16))
            + self.sealed_bytes
            + self
                .block
                .resident_after(growth.data, expected.saturating_mul(self.row_bytes))
    }

    /// Appends rows `rows` of `data`, buffers first allocated for `expected` rows.
    #[inline]
    pub(super) fn append(&mut self, data: &ArrayData, rows: &[u32], expected: usize) -> Result<()> {
        let views = views_of(data);
        if views.len() != data.len() {
            return Err(short_column());
        }
        let blocks = data.buffers().get(1..).unwrap_or_default();
        let (total, _) = view_bytes(data, rows);
        self.block.make_room(
            total.min(VIEW_BLOCK_MAX_BYTES - self.block.len().min(VIEW_BLOCK_MAX_BYTES)),
            expected.saturating_mul(self.row_bytes),
        )?;
        let out = self
            .views
            .extend(rows.len() * 16, expected.saturating_mul(16))?;
        for (to, &r) in out.chunks_exact_mut(16).zip(rows) {
            let view = views[r as usize];
            let len = view as u32;
            let view = if len <= MAX_INLINE_VIEW_LEN {
                view
            } else {
                let mut v = ByteView::from(view);
                let start = v.offset as usize;
                let value = blocks
                    .get(v.buffer_index as usize)
                    .and_then(|b| b.as_slice().get(start..start + len as usize))
                    .ok_or_else(short_column)?;
                if self.block.len() + value.len() > VIEW_BLOCK_MAX_BYTES {
                    let full = std::mem::take(&mut self.block).into_buffer();
                    self.sealed_bytes += full.len();
                    self.sealed.push(full);
                }
                v.buffer_index = self.sealed.len() as u32;
                v.offset = self.block.len() as u32;
                self.block.push_slice(value)?;
                v.as_u128()
            };
            to.copy_from_slice(&view.to_ne_bytes());
        }
        Ok(())
    }

    /// Adds the `len` rows' views and blocks to `builder`; empties the buffers,
    /// remembering what a row took.
    pub(super) fn finish(&mut self, builder: ArrayDataBuilder, len: usize) -> ArrayDataBuilder {
        self.row_bytes = (self.sealed_bytes + self.block.len()) / len.max(1);
        let mut builder = builder.add_buffer(std::mem::take(&mut self.views).into_buffer());
        for block in self.sealed.drain(..) {
            builder = builder.add_buffer(block);
        }
        self.sealed_bytes = 0;
        let block = std::mem::take(&mut self.block);
        if block.len() > 0 {
            builder = builder.add_buffer(block.into_buffer());
        }
        builder
    }
}
