//! Gathering a fixed-width column (primitives, decimals, temporal types,
//! `FixedSizeBinary`): each row's value copied into one values buffer, by a copy of
//! the width's own size, and the two ways a spill file's `Int64` columns shrink as
//! they are gathered (a narrowed decimal, a halved column).
//!
//! Its own file because it is the hot loop of every gather: the width is matched
//! once a call, never once a row.

use arrow_data::ArrayData;
use arrow_schema::DataType;

use super::values::Values;
use crate::error::Result;

/// A fixed-width column's values.
#[derive(Debug)]
pub(crate) struct Fixed {
    pub width: usize,
    /// A decimal of at most 18 digits gathered as the `Int64` its spill file holds
    /// ([`spilljoin_spill::file_schema`]): read from 16-byte values, written as 8.
    pub narrowed: bool,
    /// An `Int64` column (a narrowed decimal's included) that may be gathered as
    /// `Int32` ([`super::GatherBuffer::halving`]).
    pub halvable: bool,
    /// Gathered as `Int32` (`width` 4) into the present buffer.
    pub halved: bool,
    pub values: Values,
}

impl Fixed {
    pub(super) fn new(width: usize) -> Self {
        Self {
            width,
            narrowed: false,
            halvable: false,
            halved: false,
            values: Values::default(),
        }
    }

    /// Whether it gathers `data` narrowed: a decimal into a narrowed field (an `Int64`
    /// source, even with that field's metadata, is copied as it is).
    pub fn narrowing(&self, data: &ArrayData) -> bool {
        self.narrowed && matches!(data.data_type(), DataType::Decimal128(..))
    }

    /// The bytes of `data`'s values it gathers from (a narrowed decimal's are 16 a
    /// value, a halved column's 8), if they are all there.
    pub fn source_of<'d>(&self, data: &'d ArrayData) -> Option<&'d [u8]> {
        let width = if self.narrowing(data) {
            16
        } else if self.halved {
            8
        } else {
            self.width
        };
        let values = data
            .buffers()
            .first()
            .map(|b| b.as_slice())
            .unwrap_or_default();
        let start = data.offset() * width;
        values.get(start..start + data.len() * width)
    }

    /// The bytes its values may hold once `more` rows are added, if first allocated
    /// for `expected` rows.
    #[inline]
    pub(super) fn capacity_after(&self, more: usize, expected: usize) -> usize {
        self.values
            .resident_after(more * self.width, expected.saturating_mul(self.width))
    }

    /// Appends rows `rows` of `data` (not a narrowed decimal's: those are gathered
    /// first, by the buffer).
    #[inline]
    pub(super) fn append(&mut self, data: &ArrayData, rows: &[u32], first: usize) -> Result<()> {
        let source = self.source_of(data).unwrap_or_default();
        if self.halved {
            // Every value fits (`shape_for`, `admits`).
            return if self.narrowing(data) {
                self.values
                    .gather_as::<16, i32>(source, rows, first, |v| i128::from_ne_bytes(v) as i32)
            } else {
                self.values
                    .gather_as::<8, i32>(source, rows, first, |v| i64::from_ne_bytes(v) as i32)
            };
        }
        if self.narrowing(data) {
            return Ok(());
        }
        // Fixed-size copies for the common widths: a copy of a length known only at
        // run time is a call to memmove per value.
        let width = self.width;
        match width {
            1 => self.values.gather::<1>(source, rows, first),
            2 => self.values.gather::<2>(source, rows, first),
            4 => self.values.gather::<4>(source, rows, first),
            8 => self.values.gather::<8>(source, rows, first),
            16 => self.values.gather::<16>(source, rows, first),
            32 => self.values.gather::<32>(source, rows, first),
            _ => {
                let out = self.values.extend(rows.len() * width, first)?;
                for (to, &r) in out.chunks_exact_mut(width).zip(rows) {
                    let at = r as usize * width;
                    if let Some(value) = source.get(at..at + width) {
                        to.copy_from_slice(value);
                    }
                }
                Ok(())
            }
        }
    }
}
