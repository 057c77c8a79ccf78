//! View columns are written as offsets and data, and read back as views.
//!
//! A `Utf8View` or `BinaryView` value takes a 16-byte view, plus its bytes when it
//! is longer than 12; as `Utf8` or `Binary` it takes a 4-byte offset plus its bytes.
//! The second is never larger (`4 + len` against `16`, or `16 + len`), and for the
//! short columns of real tables (flags, codes, modes) it is as little as a third:
//! TPC-H's line items spill about 50 bytes less a row. So a spill file holds a view
//! column of the caller's schema as offsets ([`crate::file_schema`] marks it with
//! [`VIEW_KEY`]), the writer copies each row's bytes once into one data buffer
//! (only the rows' own bytes, whatever buffers the input's views share), and the
//! reader makes views that point into the data buffer it read: long values are not
//! copied again, short ones are inlined in their views.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{ByteViewType, GenericBinaryType, GenericStringType};
use arrow_array::{
    Array, ArrayRef, BinaryViewArray, GenericByteArray, GenericByteViewArray, StringViewArray,
};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType};

/// The field metadata key that marks a view column stored as offsets (`Utf8` for
/// `Utf8View`, `Binary` for `BinaryView`).
pub const VIEW_KEY: &str = "spilljoin.spill.view";

/// The type a view column of type `data_type` is stored as, if it is one.
pub(crate) fn stored_type(data_type: &DataType) -> Option<DataType> {
    match data_type {
        DataType::Utf8View => Some(DataType::Utf8),
        DataType::BinaryView => Some(DataType::Binary),
        _ => None,
    }
}

/// The view type a column stored as `stored` (marked with [`VIEW_KEY`]) is read
/// back as.
pub(crate) fn view_type(stored: &DataType) -> Option<DataType> {
    match stored {
        DataType::Utf8 => Some(DataType::Utf8View),
        DataType::Binary => Some(DataType::BinaryView),
        _ => None,
    }
}

/// The bytes of `array`'s valid values (a view array; 0 for any other): what its
/// offsets form takes past its offsets (a null slot's view may have a length, as
/// after `nullif`; its offsets form is empty).
pub(crate) fn value_bytes(array: &dyn Array) -> usize {
    let lens = |views: &[u128]| match array.nulls() {
        None => views.iter().map(|&v| v as u32 as usize).sum(),
        Some(nulls) => views
            .iter()
            .zip(nulls.iter())
            .filter(|(_, valid)| *valid)
            .map(|(&v, _)| v as u32 as usize)
            .sum(),
    };
    match array.data_type() {
        DataType::Utf8View => lens(array.as_string_view().views()),
        DataType::BinaryView => lens(array.as_binary_view().views()),
        _ => 0,
    }
}

/// The bytes of `array`'s longest value (a view array; 0 for any other).
pub(crate) fn largest_value(array: &dyn Array) -> usize {
    let longest = |views: &[u128]| views.iter().map(|&v| v as u32 as usize).max();
    match array.data_type() {
        DataType::Utf8View => longest(array.as_string_view().views()),
        DataType::BinaryView => longest(array.as_binary_view().views()),
        _ => None,
    }
    .unwrap_or(0)
}

/// `column` (a view array) as its stored type: every row's bytes copied once into
/// one data buffer.
///
/// # Errors
/// Values of more bytes than 32-bit offsets address (the writer writes such a
/// batch in slices first), or a column that is not a view array.
pub(crate) fn to_offsets(column: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    match column.data_type() {
        DataType::Utf8View => {
            let views = column.as_string_view();
            let (offsets, data) = offsets_and_data(views)?;
            // SAFETY: every value is the bytes of a value of a `StringViewArray`,
            // which are valid UTF-8, copied whole, with offsets at their ends.
            let array = unsafe {
                GenericByteArray::<GenericStringType<i32>>::new_unchecked(
                    offsets,
                    data,
                    views.nulls().cloned(),
                )
            };
            Ok(Arc::new(array))
        }
        DataType::BinaryView => {
            let views = column.as_binary_view();
            let (offsets, data) = offsets_and_data(views)?;
            Ok(Arc::new(
                GenericByteArray::<GenericBinaryType<i32>>::try_new(
                    offsets,
                    data,
                    views.nulls().cloned(),
                )?,
            ))
        }
        other => Err(ArrowError::InvalidArgumentError(format!(
            "a {other} column is not a view column"
        ))),
    }
}

/// The offsets and data of a view array's values (null slots empty).
fn offsets_and_data<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
) -> Result<(OffsetBuffer<i32>, Buffer), ArrowError> {
    let total = value_bytes(array);
    if i32::try_from(total).is_err() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{total} bytes of values in one batch exceed 32-bit offsets"
        )));
    }
    let mut data: Vec<u8> = Vec::with_capacity(total);
    let mut offsets: Vec<i32> = Vec::with_capacity(array.len() + 1);
    offsets.push(0);
    for i in 0..array.len() {
        if array.is_valid(i) {
            // SAFETY: `i` is below the array's length.
            data.extend_from_slice(unsafe { array.value_unchecked(i) }.as_ref());
        }
        // (The total fits an `i32`: checked above.)
        offsets.push(data.len() as i32);
    }
    // SAFETY: the offsets start at 0 and never decrease.
    let offsets = unsafe { OffsetBuffer::new_unchecked(ScalarBuffer::from(offsets)) };
    Ok((offsets, Buffer::from_vec(data)))
}

/// `column` (stored as offsets, read from a file) as the view array of `view`'s
/// type: views that point into its data buffer, short values inlined.
///
/// # Errors
/// A column of another type (a file altered behind our back).
pub(crate) fn to_views(column: &ArrayRef, view: &DataType) -> Result<ArrayRef, ArrowError> {
    match (view, column.data_type()) {
        (DataType::Utf8View, DataType::Utf8) => {
            let strings = column.as_string::<i32>();
            let (views, data) = views_and_data(strings.offsets(), strings.values())?;
            // SAFETY: every view is made by `view_of` from a whole value of a
            // `StringArray` (valid UTF-8) in `data`, the array's one data buffer.
            let array = unsafe {
                StringViewArray::new_unchecked(views, vec![data], strings.nulls().cloned())
            };
            Ok(Arc::new(array))
        }
        (DataType::BinaryView, DataType::Binary) => {
            let bytes = column.as_binary::<i32>();
            let (views, data) = views_and_data(bytes.offsets(), bytes.values())?;
            // SAFETY: as above; binary values need no more.
            let array = unsafe {
                BinaryViewArray::new_unchecked(views, vec![data], bytes.nulls().cloned())
            };
            Ok(Arc::new(array))
        }
        (view, stored) => Err(ArrowError::IpcError(format!(
            "a {stored} column cannot be read as {view}"
        ))),
    }
}

/// Views of the values at `offsets` in `data`, and the data buffer they point into.
fn views_and_data(
    offsets: &OffsetBuffer<i32>,
    data: &Buffer,
) -> Result<(ScalarBuffer<u128>, Buffer), ArrowError> {
    let bytes = data.as_slice();
    let mut views: Vec<u128> = Vec::with_capacity(offsets.len().saturating_sub(1));
    for w in offsets.windows(2) {
        // (Offsets are `i32`s: a `start` fits a `u32`.)
        let (start, end) = (w[0] as usize, w[1] as usize);
        if start > end || end > bytes.len() {
            return Err(ArrowError::IpcError(
                "a string's offsets are past its data".into(),
            ));
        }
        views.push(view_at(bytes, start, end - start));
    }
    Ok((ScalarBuffer::from(views), data.clone()))
}

/// The view of the `len` bytes at `start` of `bytes` (data block 0; checked to be
/// there): its length and, up to 12 bytes, the value itself, or its first 4 bytes,
/// the block and the offset (Arrow's view layout, little-endian). Where 16 bytes
/// can be read from `start`, one unaligned load of them gives both the prefix and
/// the inline bytes (masked to the value's length), instead of a copy of as many
/// bytes as the value has: written out rather than arrow's `make_view`, which checks
/// more a value (reading a file of views went from 5.5 to 10.6 GiB/s for long
/// strings and from 1.4 to 2.0 GiB/s for short ones, `cargo bench --bench
/// payloads`), and with the load from 1.7 to 4.2 GiB/s for short ones (long ones
/// unchanged).
#[inline]
fn view_at(bytes: &[u8], start: usize, len: usize) -> u128 {
    let word = bytes
        .get(start..start + 16)
        .and_then(|w| <[u8; 16]>::try_from(w).ok());
    match word {
        Some(word) => {
            let word = u128::from_le_bytes(word);
            if len > 12 {
                let prefix = word as u32;
                len as u128 | u128::from(prefix) << 32 | (start as u128) << 96
            } else {
                // (`len * 8` is at most 96: the mask keeps the value's bytes.)
                let value = word & ((1u128 << (len * 8)) - 1);
                value << 32 | len as u128
            }
        }
        None => view_of(&bytes[start..start + len], start as u32),
    }
}

/// The view of `value`, found at `offset` of data block 0 (see [`view_at`]).
#[inline]
fn view_of(value: &[u8], offset: u32) -> u128 {
    let len = value.len();
    if len > 12 {
        let prefix = u32::from_le_bytes([value[0], value[1], value[2], value[3]]);
        return len as u128 | u128::from(prefix) << 32 | u128::from(offset) << 96;
    }
    let mut inline = [0u8; 16];
    inline[4..4 + len].copy_from_slice(value);
    u128::from_le_bytes(inline) | len as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryViewArray, StringViewArray};

    /// The view made with one load of 16 bytes is the one made from the value's own
    /// bytes, for every length up to past the inline limit, at every offset of a
    /// buffer, the last bytes (where 16 cannot be read) included.
    #[test]
    fn views_from_a_load_are_those_from_the_value() {
        let bytes: Vec<u8> = (0..64u8)
            .map(|b| b.wrapping_mul(37).wrapping_add(11))
            .collect();
        for len in 0..=20 {
            for start in 0..=bytes.len() - len {
                let want = view_of(&bytes[start..start + len], start as u32);
                assert_eq!(view_at(&bytes, start, len), want, "{len} bytes at {start}");
            }
        }
    }

    #[test]
    fn views_round_trip_through_offsets_with_nulls_and_slices() -> Result<(), ArrowError> {
        let strings: StringViewArray = [
            Some("a"),
            None,
            Some(""),
            Some("exactly twelv"),
            Some("a value longer than twelve bytes"),
            Some("twelve bytes"),
        ]
        .into_iter()
        .collect();
        let sliced: ArrayRef = Arc::new(strings.slice(1, 5));
        let stored = to_offsets(&sliced)?;
        assert_eq!(stored.data_type(), &DataType::Utf8);
        assert_eq!(
            stored.as_string::<i32>().values().len(),
            value_bytes(&*sliced)
        );
        let back = to_views(&stored, &DataType::Utf8View)?;
        assert_eq!(back.as_string_view(), sliced.as_string_view());

        let binary: ArrayRef = Arc::new(BinaryViewArray::from_iter(vec![
            Some(&b"\xff\x00"[..]),
            None,
            Some(&[7u8; 40][..]),
        ]));
        let back = to_views(&to_offsets(&binary)?, &DataType::BinaryView)?;
        assert_eq!(back.as_binary_view(), binary.as_binary_view());
        // A column of another type is refused, not misread.
        assert!(to_views(&binary, &DataType::Utf8View).is_err());
        Ok(())
    }

    #[test]
    fn a_file_holds_its_rows_bytes_not_the_buffers_their_views_share(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use crate::{SpillConfig, SpillManager};
        use arrow_array::{RecordBatch, UInt32Array};
        use arrow_schema::{Field, Schema};
        let long: StringViewArray = (0..1000)
            .map(|i| Some(format!("a string longer than twelve bytes {i:04}")))
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)]));
        let whole = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(long)])?;
        // Ten rows taken share all 1000 rows' bytes (38 000 of them).
        let idx = UInt32Array::from_iter_values((0..10).map(|i| i * 100));
        let taken = arrow_select::take::take_record_batch(&whole, &idx)?;
        let manager = SpillManager::new(SpillConfig::default())?;
        let mut writer = manager.create_writer(schema, "views")?;
        writer.write(&taken)?;
        let file = writer.finish()?;
        // The schema message and the batch's framing, and the ten rows' 380 bytes.
        assert!(file.bytes() < 2_000, "{} bytes", file.bytes());
        let back: Vec<RecordBatch> = file.reader()?.collect::<Result<_, _>>()?;
        assert_eq!(back, vec![taken]);
        Ok(())
    }
}
