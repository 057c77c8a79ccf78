//! One column of a [`GatherBuffer`](super::GatherBuffer): which layout gathers it,
//! and the column-wide steps every layout shares (what rows add, what that takes in
//! memory, validity, the array made at the end). Each layout's own gathering is in
//! its file:
//!
//! | layout | file | gathered into | a row costs |
//! |---|---|---|---|
//! | fixed width (primitives, decimals, temporal, `FixedSizeBinary`) | `fixed` | one values buffer | its width |
//! | `Boolean` | `bitmap` | a bitmap | a bit |
//! | `Utf8`, `Binary`, `LargeUtf8`, `LargeBinary` (from those or from views: a spill file's form of a view column) | `offsets` | offsets + one data buffer | an offset + its bytes |
//! | `Utf8View`, `BinaryView` | `views` | views + data blocks of our own | 16 bytes + its bytes past 12 |
//! | `Dictionary` of any of the above | `dict` | keys + values gathered as above | a key (+ its value, the first time) |
//!
//! Every value is copied once, and only the bytes of the rows gathered: a view that
//! points into a page-sized buffer of its input is copied with its bytes, never with
//! the buffer, so what is gathered (and written to a spill file) is bounded by the
//! rows' own bytes, whatever the input's buffers share.

use arrow_array::{make_array, ArrayRef};
use arrow_buffer::BooleanBufferBuilder;
use arrow_data::{ArrayData, ArrayDataBuilder};
use arrow_schema::{DataType, Field};

use super::bitmap::{append_bools, append_validity, bitmap_bytes, finish_validity};
use super::dict::{self, Dict};
use super::fixed::Fixed;
use super::offsets::{offset_bytes, Bytes};
use super::views::{view_bytes, Views};
use crate::error::{JoinError, Result};

/// What rows about to be appended add beyond their fixed widths, per column
/// ([`super::Growth`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct ColumnGrowth {
    /// Bytes of variable-width data (offset and view columns; a view column's
    /// values of over 12 bytes, those kept outside their views).
    pub data: usize,
    /// Bytes of a view column's values of 12 bytes or fewer (kept inside their
    /// views): what gathering it as offsets ([`Bytes`]) adds to `data`.
    pub inline: usize,
    /// At most this many new dictionary values,
    pub values: usize,
    /// taking at most this many bytes of variable-width data,
    pub value_data: usize,
    /// from this source dictionary (whose mapping takes memory unless it is held
    /// already).
    pub source: Option<ArrayData>,
}

impl ColumnGrowth {
    /// What rows `rows` of `data` add to a column that gathers them.
    pub fn of(data: &ArrayData, rows: &[u32]) -> Self {
        match data.data_type() {
            DataType::Utf8 | DataType::Binary => Self {
                data: offset_bytes::<i32>(data, rows),
                ..Self::default()
            },
            DataType::LargeUtf8 | DataType::LargeBinary => Self {
                data: offset_bytes::<i64>(data, rows),
                ..Self::default()
            },
            DataType::Utf8View | DataType::BinaryView => {
                let (outside, all) = view_bytes(data, rows);
                Self {
                    data: outside,
                    inline: all - outside,
                    ..Self::default()
                }
            }
            DataType::Dictionary(key, _) => dict::growth(data, key, rows),
            _ => Self::default(),
        }
    }
}

/// Whether a column of `data_type` may have variable-width data to measure.
pub(crate) fn has_data(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::Binary
            | DataType::LargeUtf8
            | DataType::LargeBinary
            | DataType::Utf8View
            | DataType::BinaryView
            | DataType::Dictionary(..)
    )
}

/// The error for an input array whose buffers are shorter than its rows need.
pub(super) fn short_column() -> JoinError {
    JoinError::Internal("a column shorter than its length".into())
}

/// How a column's rows are held.
#[derive(Debug)]
pub(crate) enum Kind {
    Fixed(Fixed),
    Bool(BooleanBufferBuilder),
    Null,
    Bytes(Bytes),
    Views(Views),
    Dict(Dict),
}

impl Kind {
    fn for_type(data_type: &DataType, field: &Field) -> Option<Self> {
        let kind = match data_type {
            DataType::Boolean => Kind::Bool(BooleanBufferBuilder::new(0)),
            DataType::Null => Kind::Null,
            DataType::Utf8 | DataType::Binary => Kind::Bytes(Bytes::new(false)),
            DataType::LargeUtf8 | DataType::LargeBinary => Kind::Bytes(Bytes::new(true)),
            DataType::Utf8View | DataType::BinaryView => Kind::Views(Views::new()),
            DataType::FixedSizeBinary(n) => Kind::Fixed(Fixed::new(usize::try_from(*n).ok()?)),
            DataType::Dictionary(key, value) => Kind::Dict(Dict::for_types(key, value)?),
            t => {
                let mut fixed = Fixed::new(t.primitive_width()?);
                fixed.narrowed = t == &DataType::Int64
                    && field.metadata().contains_key(spilljoin_spill::NARROWED_KEY);
                Kind::Fixed(fixed)
            }
        };
        Some(kind)
    }
}

/// One column's gathered rows and, once a null arrives, its validity.
#[derive(Debug)]
pub(crate) struct Column {
    pub kind: Kind,
    pub validity: Option<BooleanBufferBuilder>,
    /// Whether the column may get a validity buffer (its field is nullable).
    pub nullable: bool,
}

impl Column {
    /// A column gathering rows of `field`; `None` for a type it cannot gather
    /// (nested types).
    pub fn for_field(field: &Field) -> Option<Self> {
        let kind = Kind::for_type(field.data_type(), field)?;
        Some(Self {
            kind,
            validity: None,
            nullable: field.is_nullable() && field.data_type() != &DataType::Null,
        })
    }

    /// The bytes a row takes in the fixed part of the buffers, as gathered now.
    pub fn width(&self) -> usize {
        match &self.kind {
            Kind::Fixed(f) => f.width,
            Kind::Bool(_) | Kind::Null => 0,
            Kind::Bytes(b) => b.width(),
            Kind::Views(_) => 16,
            Kind::Dict(d) => d.width(),
        }
    }

    /// The bytes of variable-width data held (dictionary values included).
    pub fn data_bytes(&self) -> usize {
        match &self.kind {
            Kind::Bytes(b) => b.data_bytes(),
            Kind::Views(v) => v.data_bytes(),
            Kind::Dict(d) => d.data_bytes(),
            _ => 0,
        }
    }

    /// The fixed-width part, if the column is of a fixed width.
    pub fn fixed(&self) -> Option<&Fixed> {
        match &self.kind {
            Kind::Fixed(f) => Some(f),
            _ => None,
        }
    }

    /// The fixed-width part, mutably.
    pub fn fixed_mut(&mut self) -> Option<&mut Fixed> {
        match &mut self.kind {
            Kind::Fixed(f) => Some(f),
            _ => None,
        }
    }

    /// Whether `more` rows growing its data by `growth` can join the `len` rows held:
    /// not if a dictionary's keys could not address the new values, or an offsets
    /// column's offsets would overflow. Empty columns admit any one batch's rows.
    pub fn admits(&self, len: usize, growth: &ColumnGrowth) -> bool {
        if len == 0 {
            return true;
        }
        match &self.kind {
            Kind::Bytes(b) => b.admits(growth),
            Kind::Dict(d) => d.admits(growth),
            _ => true,
        }
    }

    /// The bytes this column may hold in memory once `more` rows (of `growth` more
    /// data) join the `len` it holds, if its buffers are first allocated for
    /// `expected` rows.
    pub fn capacity_after(
        &self,
        len: usize,
        more: usize,
        growth: &ColumnGrowth,
        expected: usize,
    ) -> usize {
        let rows = len + more;
        let validity = if self.validity.is_some() || self.nullable {
            bitmap_bytes(rows)
        } else {
            0
        };
        let body = match &self.kind {
            Kind::Fixed(f) => f.capacity_after(more, expected),
            Kind::Bool(_) => bitmap_bytes(rows),
            Kind::Null => 0,
            Kind::Bytes(b) => b.capacity_after(len, more, growth, expected),
            Kind::Views(v) => v.capacity_after(more, growth, expected),
            Kind::Dict(d) => d.capacity_after(more, growth, expected),
        };
        body + validity
    }

    /// Appends rows `rows` of `data` (their validity included) to the `len` rows
    /// held; buffers first allocated for `expected` rows. A narrowed decimal's
    /// values were gathered before ([`Fixed::narrowing`]); only its validity is
    /// added here.
    ///
    /// # Errors
    /// [`JoinError::Internal`] if `data` is not all there (a bug in the caller),
    /// [`JoinError::InvalidJoin`] if strings outgrow 32-bit offsets or a dictionary
    /// key is past its values or cannot address them, [`JoinError::Io`] if a memory
    /// map cannot grow.
    pub fn append(
        &mut self,
        data: &ArrayData,
        rows: &[u32],
        len: usize,
        expected: usize,
    ) -> Result<()> {
        match &mut self.kind {
            Kind::Fixed(f) => f.append(data, rows, expected.saturating_mul(f.width))?,
            Kind::Bool(bits) => append_bools(bits, data, rows)?,
            Kind::Null => {}
            Kind::Bytes(b) => b.append(data, rows, expected)?,
            Kind::Views(v) => v.append(data, rows, expected)?,
            Kind::Dict(d) => d.append(data, rows, expected)?,
        }
        append_validity(&mut self.validity, data, rows, len);
        Ok(())
    }

    /// The `len` rows gathered as an array of `field`'s type; empties the buffers
    /// (which remember what a row took, for the next first allocation).
    ///
    /// # Errors
    /// An arrow error if the array cannot be made (a bug: types and rows are
    /// checked as they are appended).
    pub fn finish(&mut self, data_type: &DataType, len: usize) -> Result<ArrayRef> {
        let nulls = finish_validity(&mut self.validity);
        let builder = ArrayData::builder(data_type.clone()).len(len).nulls(nulls);
        let data = match &mut self.kind {
            Kind::Fixed(f) => builder.add_buffer(std::mem::take(&mut f.values).into_buffer()),
            Kind::Bool(bits) => builder.add_buffer(bits.finish().into_inner()),
            Kind::Null => ArrayData::builder(DataType::Null).len(len),
            Kind::Bytes(b) => b.finish(builder, len)?,
            Kind::Views(v) => v.finish(builder, len),
            Kind::Dict(d) => d.finish(builder, data_type)?,
        };
        Ok(make_array(build(data)?))
    }
}

/// The array data of buffers gathered ([`Column::finish`]'s builder), checked in
/// debug builds only.
///
/// # Errors
/// An arrow error if a debug build finds the data invalid (a bug).
fn build(data: ArrayDataBuilder) -> Result<ArrayData> {
    // Full validation would check every string's UTF-8 again and every view's
    // prefix, a share of the CPU time of a wide spill that matters; debug builds
    // still do it.
    #[cfg(debug_assertions)]
    let data = data.build()?;
    // SAFETY: the buffers are what the builder's type needs for its rows, and their
    // values are valid: every value is a whole value of a valid source array
    // of this type (or, for an offsets column, of its view type), copied as it
    // was (a string is a whole UTF-8 string, a view keeps its length and prefix
    // and points at the bytes copied for it, offsets end where each copied value
    // ends), and a dictionary key is the index of a value gathered for it
    // (`Dict::append`). Widths and lengths are
    // checked as rows are appended; the debug build above validates it all.
    #[cfg(not(debug_assertions))]
    let data = unsafe { data.build_unchecked() };
    Ok(data)
}
