//! One column of a [`GatherBuffer`](super::GatherBuffer): how rows of each Arrow
//! layout are copied in, and how much memory that takes before it is done.
//!
//! | layout | gathered into | a row costs |
//! |---|---|---|
//! | fixed width (primitives, decimals, temporal, `FixedSizeBinary`) | one values buffer | its width |
//! | `Boolean` | a bitmap | a bit |
//! | `Utf8`, `Binary`, `LargeUtf8`, `LargeBinary` | offsets + one data buffer | an offset + its bytes |
//! | `Utf8View`, `BinaryView` | views + data blocks of our own | 16 bytes + its bytes past 12 |
//! | `Dictionary` of any of the above | keys + values gathered as above | a key (+ its value, the first time) |
//!
//! Every value is copied once, and only the bytes of the rows gathered: a view that
//! points into a page-sized buffer of its input is copied with its bytes, never with
//! the buffer, so what is gathered (and written to a spill file) is bounded by the
//! rows' own bytes, whatever the input's buffers share.

use arrow_array::{make_array, ArrayRef};
use arrow_buffer::{bit_util, BooleanBufferBuilder, Buffer, NullBuffer};
use arrow_data::{ArrayData, ByteView, MAX_INLINE_VIEW_LEN};
use arrow_schema::{DataType, Field};

use super::values::Values;
use crate::error::{JoinError, Result};

/// The largest data block of a view column: views address a block by a 32-bit
/// offset; past this a new block begins. (Kept below `i32::MAX` for readers that
/// take the offset as signed.)
const VIEW_BLOCK_MAX_BYTES: usize = i32::MAX as usize;

/// A column's dictionary keeps the mapping of at most this many source dictionaries
/// (the last ones seen): a buffer fed by a few workers, each reading its own row
/// group's dictionary, finds its rows' values again instead of copying them anew.
const DICTIONARY_SOURCES: usize = 4;

/// What rows about to be appended add beyond their fixed widths, per column
/// ([`super::Growth`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct ColumnGrowth {
    /// Bytes of variable-width data (offset and view columns).
    pub data: usize,
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
            DataType::Utf8View | DataType::BinaryView => Self {
                data: view_bytes(data, rows),
                ..Self::default()
            },
            DataType::Dictionary(key, _) => {
                let Some(values) = data.child_data().first() else {
                    return Self::default();
                };
                let width = key.primitive_width().unwrap_or(8);
                let signed = key.is_signed_integer();
                let keys = key_bytes(data, width);
                let value_rows: Vec<u32> = rows
                    .iter()
                    .map(|&r| key_at(keys, width, signed, r as usize))
                    .filter(|&k| k < values.len() as u64)
                    .map(|k| k as u32)
                    .collect();
                // At most every row a new value, and never more than the whole
                // dictionary.
                let all: Vec<u32> = (0..values.len() as u32).collect();
                let rows_data = Self::of(values, &value_rows).data;
                let all_data = Self::of(values, &all).data;
                Self {
                    data: 0,
                    values: rows.len().min(values.len()),
                    value_data: rows_data.min(all_data),
                    source: Some(values.clone()),
                }
            }
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

/// The bytes of rows `rows` of an offsets array (`Utf8`, `Binary` and their large
/// forms).
fn offset_bytes<O: OffsetValue>(data: &ArrayData, rows: &[u32]) -> usize {
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

/// The bytes of rows `rows` of a view array kept outside their views.
fn view_bytes(data: &ArrayData, rows: &[u32]) -> usize {
    let views = views_of(data);
    rows.iter()
        .map(|&r| {
            let len = views.get(r as usize).map_or(0, |&v| v as u32);
            if len > MAX_INLINE_VIEW_LEN {
                len as usize
            } else {
                0
            }
        })
        .sum()
}

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
fn offsets_of<O: OffsetValue>(data: &ArrayData) -> &[O] {
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

/// The `len` views of a view array (empty if they are not all there).
fn views_of(data: &ArrayData) -> &[u128] {
    let Some(buffer) = data.buffers().first() else {
        return &[];
    };
    // SAFETY: as in `offsets_of`; any bit pattern is a valid `u128`.
    let (prefix, views, _) = unsafe { buffer.as_slice().align_to::<u128>() };
    if !prefix.is_empty() {
        return &[];
    }
    views
        .get(data.offset()..data.offset() + data.len())
        .unwrap_or_default()
}

/// The key bytes of a dictionary array's `len` rows, `width` bytes each.
fn key_bytes(data: &ArrayData, width: usize) -> &[u8] {
    let bytes = data
        .buffers()
        .first()
        .map(|b| b.as_slice())
        .unwrap_or_default();
    let start = data.offset() * width;
    bytes
        .get(start..start + data.len() * width)
        .unwrap_or_default()
}

/// The key at row `r` of `keys` (`width` bytes each, little-endian as Arrow's
/// buffers are); a negative key of a `signed` type reads as `u64::MAX`, past any
/// dictionary.
#[inline]
fn key_at(keys: &[u8], width: usize, signed: bool, r: usize) -> u64 {
    let Some(bytes) = keys.get(r * width..(r + 1) * width) else {
        return u64::MAX;
    };
    let mut word = [0u8; 8];
    word[..width].copy_from_slice(bytes);
    let v = u64::from_le_bytes(word);
    if signed && (v >> (8 * width - 1)) & 1 == 1 {
        u64::MAX
    } else {
        v
    }
}

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

    /// Appends rows `rows` of `data` (not a narrowed decimal's: those are gathered
    /// first, by the buffer).
    fn append(&mut self, data: &ArrayData, rows: &[u32], first: usize) -> Result<()> {
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

/// A dictionary column: its keys, and the values the keys use, gathered.
#[derive(Debug)]
pub(crate) struct Dict {
    key_width: usize,
    signed: bool,
    /// The largest key the key type holds.
    key_max: u64,
    keys: Values,
    values: Box<Column>,
    values_len: usize,
    /// Source dictionaries seen lately, each with the key its values have here
    /// (`u32::MAX`: not gathered yet). Held, so that one is never mistaken for a
    /// later array at the same address.
    sources: Vec<(ArrayData, Vec<u32>)>,
    /// For keys of at most 16 bits, the values gathered by their bytes: values that
    /// several source dictionaries share take one key, so that what fits the key
    /// type in one dictionary fits it here too.
    interned: Option<std::collections::HashMap<Box<[u8]>, u32>>,
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

/// One column's gathered rows and, once a null arrives, its validity.
#[derive(Debug)]
pub(crate) struct Column {
    pub kind: Kind,
    pub validity: Option<BooleanBufferBuilder>,
    /// Whether the column may get a validity buffer (its field is nullable).
    pub nullable: bool,
}

/// A bitmap's bytes once it holds `rows` bits (it doubles as it grows).
fn bitmap_bytes(rows: usize) -> usize {
    rows.div_ceil(8) * 2 + 64
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
            Kind::Bytes(b) => {
                if b.large {
                    8
                } else {
                    4
                }
            }
            Kind::Views(_) => 16,
            Kind::Dict(d) => d.key_width,
        }
    }

    /// The bytes of variable-width data held (dictionary values included).
    pub fn data_bytes(&self) -> usize {
        match &self.kind {
            Kind::Bytes(b) => b.data.len(),
            Kind::Views(v) => v.sealed_bytes + v.block.len(),
            Kind::Dict(d) => d.values.data_bytes() + d.values_len * d.values.width(),
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
            Kind::Bytes(b) if !b.large => b.data.len() + growth.data <= i32::MAX as usize,
            Kind::Dict(d) => {
                (d.values_len + growth.values) as u64 <= d.key_max.saturating_add(1)
                    && d.values.admits(
                        d.values_len,
                        &ColumnGrowth {
                            data: growth.value_data,
                            ..ColumnGrowth::default()
                        },
                    )
            }
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
            Kind::Fixed(f) => f
                .values
                .resident_after(more * f.width, expected.saturating_mul(f.width)),
            Kind::Bool(_) => bitmap_bytes(rows),
            Kind::Null => 0,
            Kind::Bytes(b) => {
                let w = if b.large { 8 } else { 4 };
                b.offsets
                    .resident_after((more + usize::from(len == 0)) * w, (expected + 1) * w)
                    + b.data
                        .resident_after(growth.data, expected.saturating_mul(b.row_bytes))
            }
            Kind::Views(v) => {
                v.views
                    .resident_after(more * 16, expected.saturating_mul(16))
                    + v.sealed_bytes
                    + v.block
                        .resident_after(growth.data, expected.saturating_mul(v.row_bytes))
            }
            Kind::Dict(d) => {
                let value_growth = ColumnGrowth {
                    data: growth.value_data,
                    ..ColumnGrowth::default()
                };
                // A source not held yet gets a mapping (an evicted one is freed
                // once the new one exists).
                let new_source = growth
                    .source
                    .as_ref()
                    .filter(|s| !d.sources.iter().any(|(held, _)| held.ptr_eq(s)))
                    .map_or(0, |s| s.len() * 4);
                d.keys
                    .resident_after(more * d.key_width, expected.saturating_mul(d.key_width))
                    + d.values
                        .capacity_after(d.values_len, growth.values, &value_growth, 0)
                    + d.sources
                        .iter()
                        .map(|(_, map)| map.capacity() * 4)
                        .sum::<usize>()
                    + new_source
            }
        };
        body + validity
    }

    /// Appends the validity of rows `rows` of `data` to a column holding `len` rows:
    /// a validity buffer appears with the first null.
    pub fn append_validity(&mut self, data: &ArrayData, rows: &[u32], len: usize) {
        match (data.nulls(), self.validity.as_mut()) {
            (Some(nulls), _) if nulls.null_count() > 0 => {
                let validity = self.validity.get_or_insert_with(|| {
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

    /// Appends rows `rows` of `data` (their validity included) to the `len` rows
    /// held; buffers first allocated for `expected` rows. A narrowed decimal's
    /// values were gathered before ([`Fixed::narrowing`]); only its validity is
    /// added here.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if `data` is not all there (a bug in the caller),
    /// [`JoinError::Io`] if a memory map cannot grow.
    pub fn append(
        &mut self,
        data: &ArrayData,
        rows: &[u32],
        len: usize,
        expected: usize,
    ) -> Result<()> {
        match &mut self.kind {
            Kind::Fixed(f) => f.append(data, rows, expected.saturating_mul(f.width))?,
            Kind::Bool(bits) => {
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
            }
            Kind::Null => {}
            Kind::Bytes(b) if b.large => b.append::<i64>(data, rows, expected)?,
            Kind::Bytes(b) => b.append::<i32>(data, rows, expected)?,
            Kind::Views(v) => v.append(data, rows, expected)?,
            Kind::Dict(d) => d.append(data, rows, expected)?,
        }
        self.append_validity(data, rows, len);
        Ok(())
    }

    /// The `len` rows gathered as an array of `field`'s type; empties the buffers
    /// (which remember what a row took, for the next first allocation).
    ///
    /// # Errors
    /// An arrow error if the array cannot be made (a bug: types and rows are
    /// checked as they are appended).
    pub fn finish(&mut self, data_type: &DataType, len: usize) -> Result<ArrayRef> {
        let nulls = self
            .validity
            .take()
            .map(|mut v| NullBuffer::new(v.finish()));
        let builder = ArrayData::builder(data_type.clone()).len(len).nulls(nulls);
        let data = match &mut self.kind {
            Kind::Fixed(f) => builder.add_buffer(std::mem::take(&mut f.values).into_buffer()),
            Kind::Bool(bits) => builder.add_buffer(bits.finish().into_inner()),
            Kind::Null => ArrayData::builder(DataType::Null).len(len),
            Kind::Bytes(b) => {
                let w = if b.large { 8 } else { 4 };
                b.row_bytes = b.data.len() / len.max(1);
                let mut offsets = std::mem::take(&mut b.offsets);
                if offsets.len() == 0 {
                    offsets.extend(w, 0)?;
                }
                builder
                    .add_buffer(offsets.into_buffer())
                    .add_buffer(std::mem::take(&mut b.data).into_buffer())
            }
            Kind::Views(v) => {
                v.row_bytes = (v.sealed_bytes + v.block.len()) / len.max(1);
                let mut builder = builder.add_buffer(std::mem::take(&mut v.views).into_buffer());
                for block in v.sealed.drain(..) {
                    builder = builder.add_buffer(block);
                }
                v.sealed_bytes = 0;
                let block = std::mem::take(&mut v.block);
                if block.len() > 0 {
                    builder = builder.add_buffer(block.into_buffer());
                }
                builder
            }
            Kind::Dict(d) => {
                let DataType::Dictionary(_, value_type) = data_type else {
                    return Err(JoinError::Internal(
                        "a dictionary column of another type".into(),
                    ));
                };
                let values = d.values.finish(value_type, d.values_len)?;
                d.values_len = 0;
                // The values start over: no source's mapping holds any more.
                d.sources.clear();
                if let Some(interned) = d.interned.as_mut() {
                    interned.clear();
                }
                builder
                    .add_buffer(std::mem::take(&mut d.keys).into_buffer())
                    .child_data(vec![values.to_data()])
            }
        };
        // Full validation would check every string's UTF-8 again and every view's
        // prefix (8% of the CPU of an SF1 lineitem ⋈ orders of every column under
        // 64 MiB); debug builds still do it.
        #[cfg(debug_assertions)]
        let data = data.build()?;
        // SAFETY: the buffers are what `data_type` needs for `len` rows, and their
        // values are valid: every value is a whole value of a valid source array
        // of this type, copied as it was (a string is a whole UTF-8 string, a view
        // keeps its length and prefix and points at the bytes copied for it,
        // offsets end where each copied value ends), and a dictionary key is the
        // index of a value gathered for it (`Dict::append`). Widths and lengths are
        // checked as rows are appended; the debug build above validates it all.
        #[cfg(not(debug_assertions))]
        let data = unsafe { data.build_unchecked() };
        Ok(make_array(data))
    }
}

impl Kind {
    fn for_type(data_type: &DataType, field: &Field) -> Option<Self> {
        let kind = match data_type {
            DataType::Boolean => Kind::Bool(BooleanBufferBuilder::new(0)),
            DataType::Null => Kind::Null,
            DataType::Utf8 | DataType::Binary => Kind::Bytes(Bytes::new(false)),
            DataType::LargeUtf8 | DataType::LargeBinary => Kind::Bytes(Bytes::new(true)),
            DataType::Utf8View | DataType::BinaryView => Kind::Views(Views {
                views: Values::default(),
                block: Values::default(),
                sealed: Vec::new(),
                sealed_bytes: 0,
                row_bytes: 0,
            }),
            DataType::FixedSizeBinary(n) => Kind::Fixed(Fixed::new(usize::try_from(*n).ok()?)),
            DataType::Dictionary(key, value) => {
                if !key.is_dictionary_key_type() || matches!(**value, DataType::Dictionary(..)) {
                    return None;
                }
                let key_width = key.primitive_width()?;
                let signed = key.is_signed_integer();
                let bits = 8 * key_width as u32 - u32::from(signed);
                let values_field = Field::new("values", (**value).clone(), true);
                Kind::Dict(Dict {
                    key_width,
                    signed,
                    key_max: if bits >= 64 {
                        u64::MAX
                    } else {
                        (1 << bits) - 1
                    },
                    keys: Values::default(),
                    values: Box::new(Column::for_field(&values_field)?),
                    values_len: 0,
                    sources: Vec::new(),
                    interned: (key_width <= 2).then(Default::default),
                })
            }
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

impl Fixed {
    fn new(width: usize) -> Self {
        Self {
            width,
            narrowed: false,
            halvable: false,
            halved: false,
            values: Values::default(),
        }
    }
}

fn short_column() -> JoinError {
    JoinError::Internal("a column shorter than its length".into())
}

impl Bytes {
    fn new(large: bool) -> Self {
        Self {
            large,
            offsets: Values::default(),
            data: Values::default(),
            row_bytes: 0,
        }
    }

    fn append<O: OffsetValue>(
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
        let mut end = self.data.len();
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
        let out = self.offsets.extend(rows.len() * w, (expected + 1) * w)?;
        for (to, &r) in out.chunks_exact_mut(w).zip(rows) {
            let r = r as usize;
            let (s, e) = (offsets[r].offset_usize(), offsets[r + 1].offset_usize());
            let value = source.get(s..e).ok_or_else(short_column)?;
            self.data.push_slice(value)?;
            end += value.len();
            // (Checked above: the whole append fits.)
            let offset = O::from_offset(end).unwrap_or_default();
            to.copy_from_slice(arrow_buffer::ToByteSlice::to_byte_slice(&offset));
        }
        Ok(())
    }
}

impl Views {
    fn append(&mut self, data: &ArrayData, rows: &[u32], expected: usize) -> Result<()> {
        let views = views_of(data);
        if views.len() != data.len() {
            return Err(short_column());
        }
        let blocks = data.buffers().get(1..).unwrap_or_default();
        let total = view_bytes(data, rows);
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
}

impl Dict {
    /// Where the mapping of source dictionary `values` is in `sources` (the most
    /// recent first).
    fn source_of(&mut self, values: &ArrayData) -> usize {
        let found = self.sources.iter().position(|(v, _)| v.ptr_eq(values));
        match found {
            Some(at) => at,
            None => {
                if self.sources.len() == DICTIONARY_SOURCES {
                    self.sources.pop();
                }
                self.sources
                    .insert(0, (values.clone(), vec![u32::MAX; values.len()]));
                0
            }
        }
    }

    fn append(&mut self, data: &ArrayData, rows: &[u32], expected: usize) -> Result<()> {
        let Some(values) = data.child_data().first() else {
            return Err(short_column());
        };
        let (width, signed) = (self.key_width, self.signed);
        let keys = key_bytes(data, width);
        if keys.len() != data.len() * width {
            return Err(short_column());
        }
        let nulls = data.nulls().cloned();
        let mut next = self.values_len as u32;
        let key_max = self.key_max;
        let mut new_rows = Vec::new();
        let found = self.source_of(values);
        let mapping = &mut self.sources[found].1;
        let mut new_keys = Vec::with_capacity(rows.len());
        for &r in rows {
            let r = r as usize;
            if nulls.as_ref().is_some_and(|n| n.is_null(r)) {
                new_keys.push(0);
                continue;
            }
            let k = key_at(keys, width, signed, r);
            let slot = usize::try_from(k)
                .ok()
                .and_then(|k| mapping.get_mut(k))
                .ok_or_else(|| {
                    JoinError::InvalidJoin(format!("dictionary key {k} past its values"))
                })?;
            if *slot == u32::MAX {
                let bytes = self
                    .interned
                    .as_ref()
                    .and_then(|_| value_bytes(values, k as usize));
                let known = bytes.and_then(|b| self.interned.as_ref()?.get(b).copied());
                if let Some(key) = known {
                    *slot = key;
                } else {
                    if u64::from(next) > key_max {
                        return Err(JoinError::InvalidJoin(format!(
                            "a dictionary column has more distinct values than its \
                             {}-bit keys address",
                            8 * width
                        )));
                    }
                    if let (Some(b), Some(interned)) = (bytes, self.interned.as_mut()) {
                        interned.insert(b.into(), next);
                    }
                    *slot = next;
                    new_rows.push(k as u32);
                    next += 1;
                }
            }
            new_keys.push(u64::from(*slot));
        }
        self.values.append(values, &new_rows, self.values_len, 0)?;
        self.values_len = next as usize;
        let out = self
            .keys
            .extend(rows.len() * width, expected.saturating_mul(width))?;
        for (to, key) in out.chunks_exact_mut(width).zip(new_keys) {
            to.copy_from_slice(&key.to_le_bytes()[..width]);
        }
        Ok(())
    }
}

/// The bytes of value `i` of a dictionary's `values` (of a fixed width, offsets or
/// views); `None` for a null value or another layout.
fn value_bytes(values: &ArrayData, i: usize) -> Option<&[u8]> {
    if values.is_null(i) {
        return None;
    }
    match values.data_type() {
        DataType::Utf8 | DataType::Binary => {
            let o = offsets_of::<i32>(values);
            let (s, e) = (o.get(i)?.offset_usize(), o.get(i + 1)?.offset_usize());
            values.buffers().get(1)?.as_slice().get(s..e)
        }
        DataType::LargeUtf8 | DataType::LargeBinary => {
            let o = offsets_of::<i64>(values);
            let (s, e) = (o.get(i)?.offset_usize(), o.get(i + 1)?.offset_usize());
            values.buffers().get(1)?.as_slice().get(s..e)
        }
        DataType::Utf8View | DataType::BinaryView => {
            let view = views_of(values).get(i)?;
            let len = *view as u32;
            if len <= MAX_INLINE_VIEW_LEN {
                // (Its bytes are its view's, past the length.)
                let bytes: &[u8; 16] = arrow_buffer::ToByteSlice::to_byte_slice(view)
                    .try_into()
                    .ok()?;
                return bytes.get(4..4 + len as usize);
            }
            let v = ByteView::from(*view);
            let start = v.offset as usize;
            values
                .buffers()
                .get(1 + v.buffer_index as usize)?
                .as_slice()
                .get(start..start + len as usize)
        }
        t => {
            let w = t.primitive_width()?;
            let bytes = values.buffers().first()?.as_slice();
            let at = (values.offset() + i) * w;
            bytes.get(at..at + w)
        }
    }
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
pub(crate) fn slice_compact(array: &ArrayRef, start: usize, len: usize) -> Result<ArrayRef> {
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
