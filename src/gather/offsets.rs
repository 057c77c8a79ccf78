//! Gathering a variable-width column of offsets and data (`Utf8`, `Binary` and their
//! large forms): each row's bytes copied into one data buffer of the column's own,
//! its offset rewritten to where they end there. A spill file holds a view column
//! (`Utf8View`, `BinaryView`) in this form (`spilljoin_spill::VIEW_KEY`), so rows of
//! view arrays are gathered into it too, each value's bytes copied from wherever
//! its view keeps them.
//!
//! Its own file because the offset type is a parameter ([`OffsetValue`]) and the
//! helpers that read an input's offsets are shared with dictionaries' values.

use arrow_data::{ArrayData, ArrayDataBuilder, ByteView, MAX_INLINE_VIEW_LEN};
use arrow_schema::DataType;

use super::column::{short_column, ColumnGrowth};
use super::values::Values;
use super::views::{view_bytes, views_of};
use crate::error::{JoinError, Result};

/// An offset type of a variable-width array.
pub(crate) trait OffsetValue: arrow_buffer::ArrowNativeType + Copy {
    fn offset_usize(self) -> usize;
    fn from_offset(v: usize) -> Option<Self>;
}

impl OffsetValue for i32 {
    fn offset_usize(self) -> usize {
        usize::try_from(self).unwrap_or(0)
    }
    fn from_offset(v: usize) -> Option<Self> {
        i32::try_from(v).ok()
    }
}

impl OffsetValue for i64 {
    fn offset_usize(self) -> usize {
        usize::try_from(self).unwrap_or(0)
    }
    fn from_offset(v: usize) -> Option<Self> {
        i64::try_from(v).ok()
    }
}

/// The `len + 1` offsets of an offsets array (empty if they are not all there).
pub(super) fn offsets_of<O: OffsetValue>(data: &ArrayData) -> &[O] {
    let Some(buffer) = data.buffers().first() else {
        return &[];
    };
    // SAFETY: `align_to` only reinterprets the aligned middle of the bytes as `O`s,
    // which are plain integers (any bit pattern is valid); an unaligned buffer
    // gives an empty middle whose prefix is not, and is then refused below.
    let (prefix, offsets, _) = unsafe { buffer.as_slice().align_to::<O>() };
    if !prefix.is_empty() || data.len() == usize::MAX {
        return &[];
    }
    offsets
        .get(data.offset()..data.offset() + data.len() + 1)
        .unwrap_or_default()
}

/// The bytes of rows `rows` of an offsets array (`Utf8`, `Binary` and their large
/// forms).
pub(super) fn offset_bytes<O: OffsetValue>(data: &ArrayData, rows: &[u32]) -> usize {
    let offsets = offsets_of::<O>(data);
    rows.iter()
        .map(|&r| {
            let r = r as usize;
            match (offsets.get(r), offsets.get(r + 1)) {
                (Some(s), Some(e)) => e.offset_usize().saturating_sub(s.offset_usize()),
                _ => 0,
            }
        })
        .sum()
}

/// The bytes of value `i` of an offsets array (`O` its offset type), if it has them.
pub(super) fn offset_value<O: OffsetValue>(values: &ArrayData, i: usize) -> Option<&[u8]> {
    let o = offsets_of::<O>(values);
    let (s, e) = (o.get(i)?.offset_usize(), o.get(i + 1)?.offset_usize());
    values.buffers().get(1)?.as_slice().get(s..e)
}

/// An offsets column's offsets (`O`) and data.
#[derive(Debug)]
pub(crate) struct Bytes {
    large: bool,
    offsets: Values,
    data: Values,
    /// Bytes of data a row took in the last batch finished: what a buffer expecting
    /// rows allocates for their data.
    row_bytes: usize,
}

impl Bytes {
    pub(super) fn new(large: bool) -> Self {
        Self {
            large,
            offsets: Values::default(),
            data: Values::default(),
            row_bytes: 0,
        }
    }

    /// The bytes an offset takes.
    #[inline]
    pub(super) fn width(&self) -> usize {
        if self.large {
            8
        } else {
            4
        }
    }

    /// Bytes of data held.
    #[inline]
    pub(super) fn data_bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether data growing by `growth` keeps 32-bit offsets addressable (large
    /// offsets always do).
    #[inline]
    pub(super) fn admits(&self, growth: &ColumnGrowth) -> bool {
        self.large || self.data.len() + growth.data + growth.inline <= i32::MAX as usize
    }

    /// The bytes its offsets and data may hold once `more` rows of `growth` join the
    /// `len` held (the first row brings the leading offset), if first allocated for
    /// `expected` rows.
    #[inline]
    pub(super) fn capacity_after(
        &self,
        len: usize,
        more: usize,
        growth: &ColumnGrowth,
        expected: usize,
    ) -> usize {
        let w = self.width();
        self.offsets
            .resident_after((more + usize::from(len == 0)) * w, (expected + 1) * w)
            + self.data.resident_after(
                growth.data + growth.inline,
                expected.saturating_mul(self.row_bytes),
            )
    }

    /// Whether a column of `target` type (an offsets type) gathers arrays of
    /// `source` type: its own, or the view type a spill file holds as it.
    pub(super) fn takes(source: &DataType, target: &DataType) -> bool {
        source == target
            || matches!(
                (source, target),
                (DataType::Utf8View, DataType::Utf8) | (DataType::BinaryView, DataType::Binary)
            )
    }

    /// Appends rows `rows` of `data` (of this column's type, or a view type it
    /// [`takes`](Self::takes)), buffers first allocated for `expected` rows.
    #[inline]
    pub(super) fn append(&mut self, data: &ArrayData, rows: &[u32], expected: usize) -> Result<()> {
        let views = matches!(data.data_type(), DataType::Utf8View | DataType::BinaryView);
        match (self.large, views) {
            (false, false) => self.append_as::<i32>(data, rows, expected),
            (true, false) => self.append_as::<i64>(data, rows, expected),
            (false, true) => self.append_views::<i32>(data, rows, expected),
            (true, true) => self.append_views::<i64>(data, rows, expected),
        }
    }

    /// Makes room for `total` more bytes of data (and writes the leading offset
    /// before the first rows), and returns where the data ends now.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if the data would outgrow offsets of type `O`,
    /// [`JoinError::Io`] if a memory map cannot grow.
    fn room<O: OffsetValue>(&mut self, total: usize, expected: usize) -> Result<usize> {
        let w = std::mem::size_of::<O>();
        let end = self.data.len();
        if O::from_offset(end + total).is_none() {
            return Err(JoinError::InvalidJoin(format!(
                "a partition's {} bytes of strings exceed what 32-bit offsets address; \
                 use a large string type",
                end + total
            )));
        }
        self.data
            .make_room(total, expected.saturating_mul(self.row_bytes))?;
        if self.offsets.len() == 0 {
            self.offsets.extend(w, (expected + 1) * w)?.fill(0);
        }
        Ok(end)
    }

    /// [`append`](Self::append) from a view array: each value's bytes (a short
    /// one's from its view) copied into the data, its offset where they end. The
    /// data are extended once by the rows' bytes and written in place, a short value
    /// as its view's twelve bytes (what lies past its length is overwritten by the
    /// values after it): per row a fixed copy, not a call that grows a buffer.
    fn append_views<O: OffsetValue>(
        &mut self,
        data: &ArrayData,
        rows: &[u32],
        expected: usize,
    ) -> Result<()> {
        let views = views_of(data);
        if views.len() != data.len() {
            return Err(short_column());
        }
        let blocks = data.buffers().get(1..).unwrap_or_default();
        let (_, total) = view_bytes(data, rows);
        let start = self.room::<O>(total, expected)?;
        let w = std::mem::size_of::<O>();
        let out = self.offsets.extend(rows.len() * w, (expected + 1) * w)?;
        let bytes = self
            .data
            .extend(total, expected.saturating_mul(self.row_bytes))?;
        let mut at = 0;
        for (to, &r) in out.chunks_exact_mut(w).zip(rows) {
            let view = *views.get(r as usize).ok_or_else(short_column)?;
            let len = view as u32 as usize;
            if len <= MAX_INLINE_VIEW_LEN as usize {
                let inline = view.to_le_bytes();
                match bytes.get_mut(at..at + 12) {
                    Some(to) => to.copy_from_slice(&inline[4..]),
                    None => bytes
                        .get_mut(at..at + len)
                        .ok_or_else(short_column)?
                        .copy_from_slice(&inline[4..4 + len]),
                }
            } else {
                let v = ByteView::from(view);
                let s = v.offset as usize;
                let value = blocks
                    .get(v.buffer_index as usize)
                    .and_then(|b| b.as_slice().get(s..s + len))
                    .ok_or_else(short_column)?;
                bytes
                    .get_mut(at..at + len)
                    .ok_or_else(short_column)?
                    .copy_from_slice(value);
            }
            at += len;
            // (Checked by `room`: the whole append fits.)
            let offset = O::from_offset(start + at).unwrap_or_default();
            to.copy_from_slice(arrow_buffer::ToByteSlice::to_byte_slice(&offset));
        }
        Ok(())
    }

    /// [`append`](Self::append) from an offsets array, its data extended once by
    /// the rows' bytes and written in place.
    fn append_as<O: OffsetValue>(
        &mut self,
        data: &ArrayData,
        rows: &[u32],
        expected: usize,
    ) -> Result<()> {
        let offsets = offsets_of::<O>(data);
        let source = data
            .buffers()
            .get(1)
            .map(|b| b.as_slice())
            .unwrap_or_default();
        if offsets.len() != data.len() + 1 {
            return Err(short_column());
        }
        let w = std::mem::size_of::<O>();
        let total = offset_bytes::<O>(data, rows);
        let start = self.room::<O>(total, expected)?;
        let out = self.offsets.extend(rows.len() * w, (expected + 1) * w)?;
        let bytes = self
            .data
            .extend(total, expected.saturating_mul(self.row_bytes))?;
        let mut at = 0;
        for (to, &r) in out.chunks_exact_mut(w).zip(rows) {
            let r = r as usize;
            let (s, e) = (offsets[r].offset_usize(), offsets[r + 1].offset_usize());
            let value = source.get(s..e).ok_or_else(short_column)?;
            bytes
                .get_mut(at..at + value.len())
                .ok_or_else(short_column)?
                .copy_from_slice(value);
            at += value.len();
            // (Checked above: the whole append fits.)
            let offset = O::from_offset(start + at).unwrap_or_default();
            to.copy_from_slice(arrow_buffer::ToByteSlice::to_byte_slice(&offset));
        }
        Ok(())
    }

    /// Adds the `len` rows' offsets and data to `builder`; empties the buffers,
    /// remembering what a row took.
    ///
    /// # Errors
    /// [`JoinError::Io`] if the leading offset of no rows cannot be written.
    pub(super) fn finish(
        &mut self,
        builder: ArrayDataBuilder,
        len: usize,
    ) -> Result<ArrayDataBuilder> {
        let w = self.width();
        self.row_bytes = self.data.len() / len.max(1);
        let mut offsets = std::mem::take(&mut self.offsets);
        if offsets.len() == 0 {
            offsets.extend(w, 0)?;
        }
        Ok(builder
            .add_buffer(offsets.into_buffer())
            .add_buffer(std::mem::take(&mut self.data).into_buffer()))
    }
}
