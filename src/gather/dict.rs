//! Gathering a dictionary column: its keys rewritten to index values of its own,
//! and only the values its rows use gathered (as a [`Column`] of the value type),
//! each once however many rows and source dictionaries use it.
//!
//! Its own file because a dictionary keeps state across appends: the mapping from
//! each recent source dictionary to the keys its values have here, and for small key
//! types the values by their bytes.

use std::collections::HashMap;

use arrow_array::Array;
use arrow_data::{ArrayData, ArrayDataBuilder};
use arrow_schema::{DataType, Field};

use super::column::{short_column, Column, ColumnGrowth};
use super::offsets::offset_value;
use super::values::Values;
use super::views::view_value;
use crate::error::{JoinError, Result};

/// A column's dictionary keeps the mapping of at most this many source dictionaries
/// (the last ones seen): a buffer fed by a few workers, each reading its own row
/// group's dictionary, finds its rows' values again instead of copying them anew.
const DICTIONARY_SOURCES: usize = 4;

/// A source dictionary of more values than this is mapped sparsely ([`Mapping`]):
/// its dense mapping would take over 64 KiB in every buffer that sees it.
const DENSE_MAPPING_MAX_VALUES: usize = 16 << 10;

/// Bytes a sparse mapping is counted at per bucket of its table (a `u32` key and
/// value and a control byte, with the table's trailing control bytes, rounded up:
/// at least 4 buckets, so at least 52 bytes for 64 counted).
const SPARSE_BUCKET_BYTES: usize = 16;

/// The buckets of a hash table that holds `n` entries (std's `HashMap`: none for
/// none, at least 4, a power of two at most 7/8 full from 8 on).
fn buckets_for(n: usize) -> usize {
    match n {
        0 => 0,
        1..=3 => 4,
        4..=7 => 8,
        _ => (n * 8 / 7).next_power_of_two(),
    }
}

/// The key here of each value of one source dictionary gathered so far.
#[derive(Debug)]
enum Mapping {
    /// A slot per source value (`u32::MAX`: not gathered yet).
    Dense(Vec<u32>),
    /// Only the values gathered, for a large source dictionary: a probe batch cut
    /// into hundreds of partitions appends a few of its rows to each buffer, and a
    /// dense mapping in each would take the dictionary's length four times over.
    Sparse(HashMap<u32, u32>),
}

impl Mapping {
    /// An empty mapping of a source of `len` values.
    fn for_len(len: usize) -> Self {
        if len > DENSE_MAPPING_MAX_VALUES {
            Mapping::Sparse(HashMap::new())
        } else {
            Mapping::Dense(vec![u32::MAX; len])
        }
    }

    /// The bytes a mapping of a source of `len` values takes once it maps `more`
    /// values more than it does (`self` when it is held, else a new one).
    fn bytes_after(held: Option<&Self>, len: usize, more: usize) -> usize {
        match held {
            Some(Mapping::Dense(map)) => map.capacity() * 4,
            Some(Mapping::Sparse(map)) => {
                // (A table's capacity is one less than its buckets below 8, and 7/8
                // of them from 8 on.)
                let now = buckets_for(map.capacity());
                let need = map.len() + more;
                // While it grows, the old table and the new one are both held.
                let grown = if need > map.capacity() {
                    buckets_for(need)
                } else {
                    0
                };
                (now + grown) * SPARSE_BUCKET_BYTES
            }
            None if len > DENSE_MAPPING_MAX_VALUES => buckets_for(more) * SPARSE_BUCKET_BYTES,
            None => len * 4,
        }
    }

    /// The key here of source value `k` (of a source of `len` values), `u32::MAX` if
    /// not gathered yet; `None` past the source's values.
    fn get(&self, k: u64, len: usize) -> Option<u32> {
        let k = usize::try_from(k).ok().filter(|&k| k < len)?;
        match self {
            Mapping::Dense(map) => map.get(k).copied(),
            Mapping::Sparse(map) => {
                let k = u32::try_from(k).ok()?;
                Some(map.get(&k).copied().unwrap_or(u32::MAX))
            }
        }
    }

    /// Maps source value `k` (checked by [`get`](Self::get)) to key `key` here.
    fn set(&mut self, k: u64, key: u32) {
        match self {
            Mapping::Dense(map) => {
                if let Some(slot) = map.get_mut(k as usize) {
                    *slot = key;
                }
            }
            Mapping::Sparse(map) => {
                if let Ok(k) = u32::try_from(k) {
                    map.insert(k, key);
                }
            }
        }
    }
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

/// The bytes of value `i` of a dictionary's `values` (of a fixed width, offsets or
/// views); `None` for a null value or another layout.
fn value_bytes(values: &ArrayData, i: usize) -> Option<&[u8]> {
    if values.is_null(i) {
        return None;
    }
    match values.data_type() {
        DataType::Utf8 | DataType::Binary => offset_value::<i32>(values, i),
        DataType::LargeUtf8 | DataType::LargeBinary => offset_value::<i64>(values, i),
        DataType::Utf8View | DataType::BinaryView => view_value(values, i),
        t => {
            let w = t.primitive_width()?;
            let bytes = values.buffers().first()?.as_slice();
            let at = (values.offset() + i) * w;
            bytes.get(at..at + w)
        }
    }
}

/// What rows `rows` of dictionary array `data` (keys of type `key`) add: at most a
/// new value a row, and never more than the whole dictionary.
pub(super) fn growth(data: &ArrayData, key: &DataType, rows: &[u32]) -> ColumnGrowth {
    let Some(values) = data.child_data().first() else {
        return ColumnGrowth::default();
    };
    let width = key.primitive_width().unwrap_or(8);
    let signed = key.is_signed_integer();
    let keys = key_bytes(data, width);
    let mut value_rows: Vec<u32> = rows
        .iter()
        .map(|&r| key_at(keys, width, signed, r as usize))
        .filter(|&k| k < values.len() as u64)
        .map(|k| k as u32)
        .collect();
    // Each value once, however many rows use it (equal keys share a partition).
    value_rows.sort_unstable();
    value_rows.dedup();
    // At most every row a new value, and never more than the whole dictionary:
    // measured only when the dictionary has no more values than there are rows, so
    // that an append costs its rows, not its dictionary (a probe batch cut into
    // hundreds of partitions appends a few rows of a large dictionary to each).
    let rows_data = ColumnGrowth::of(values, &value_rows).data;
    let value_data = if values.len() <= rows.len() {
        let all: Vec<u32> = (0..values.len() as u32).collect();
        rows_data.min(ColumnGrowth::of(values, &all).data)
    } else {
        rows_data
    };
    ColumnGrowth {
        data: 0,
        inline: 0,
        values: value_rows.len(),
        value_data,
        source: Some(values.clone()),
    }
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
    sources: Vec<(ArrayData, Mapping)>,
    /// For keys of at most 16 bits, the values gathered by their bytes: values that
    /// several source dictionaries share take one key, so that what fits the key
    /// type in one dictionary fits it here too.
    interned: Option<HashMap<Box<[u8]>, u32>>,
}

impl Dict {
    /// A dictionary of `key`s into `value`s; `None` for a key type that is not a
    /// dictionary's, a dictionary of dictionaries, or values that cannot be gathered.
    pub(super) fn for_types(key: &DataType, value: &DataType) -> Option<Self> {
        if !key.is_dictionary_key_type() || matches!(value, DataType::Dictionary(..)) {
            return None;
        }
        let key_width = key.primitive_width()?;
        let signed = key.is_signed_integer();
        let bits = 8 * key_width as u32 - u32::from(signed);
        let values_field = Field::new("values", value.clone(), true);
        Some(Dict {
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

    /// The bytes a key takes.
    #[inline]
    pub(super) fn width(&self) -> usize {
        self.key_width
    }

    /// The bytes of the values gathered.
    #[inline]
    pub(super) fn data_bytes(&self) -> usize {
        self.values.data_bytes() + self.values_len * self.values.width()
    }

    /// Whether the keys can address the new values `growth` may bring, and the
    /// values column admits their data.
    #[inline]
    pub(super) fn admits(&self, growth: &ColumnGrowth) -> bool {
        (self.values_len + growth.values) as u64 <= self.key_max.saturating_add(1)
            && self.values.admits(
                self.values_len,
                &ColumnGrowth {
                    data: growth.value_data,
                    ..ColumnGrowth::default()
                },
            )
    }

    /// The bytes its keys, values and source mappings may hold once `more` rows of
    /// `growth` are added, if the keys are first allocated for `expected` rows.
    #[inline]
    pub(super) fn capacity_after(
        &self,
        more: usize,
        growth: &ColumnGrowth,
        expected: usize,
    ) -> usize {
        let value_growth = ColumnGrowth {
            data: growth.value_data,
            ..ColumnGrowth::default()
        };
        // A source not held yet gets a mapping (an evicted one is freed once the
        // new one exists); a sparse one grows by the values it may map.
        let source = growth.source.as_ref();
        let is_source = |values: &ArrayData| source.is_some_and(|s| values.ptr_eq(s));
        let held: usize = self
            .sources
            .iter()
            .map(|(values, map)| {
                let more = if is_source(values) { growth.values } else { 0 };
                Mapping::bytes_after(Some(map), values.len(), more)
            })
            .sum();
        let new_source = match source {
            Some(s) if !self.sources.iter().any(|(v, _)| v.ptr_eq(s)) => {
                Mapping::bytes_after(None, s.len(), growth.values)
            }
            _ => 0,
        };
        self.keys.resident_after(
            more * self.key_width,
            expected.saturating_mul(self.key_width),
        ) + self
            .values
            .capacity_after(self.values_len, growth.values, &value_growth, 0)
            + held
            + new_source
    }

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
                    .insert(0, (values.clone(), Mapping::for_len(values.len())));
                0
            }
        }
    }

    /// Appends rows `rows` of `data`: their keys mapped to keys of its own, the
    /// values first used gathered; keys first allocated for `expected` rows.
    #[inline]
    pub(super) fn append(&mut self, data: &ArrayData, rows: &[u32], expected: usize) -> Result<()> {
        let Some(values) = data.child_data().first() else {
            return Err(short_column());
        };
        let width = self.key_width;
        let (new_keys, new_rows, values_len) = self.map_keys(data, values, rows)?;
        self.values.append(values, &new_rows, self.values_len, 0)?;
        self.values_len = values_len;
        let out = self
            .keys
            .extend(rows.len() * width, expected.saturating_mul(width))?;
        for (to, key) in out.chunks_exact_mut(width).zip(new_keys) {
            to.copy_from_slice(&key.to_le_bytes()[..width]);
        }
        Ok(())
    }

    /// The key here of each of rows `rows` of `data` (0 for a null), the rows of
    /// source dictionary `values` whose values are new here (for the caller to
    /// gather), and the values there will be then.
    fn map_keys(
        &mut self,
        data: &ArrayData,
        values: &ArrayData,
        rows: &[u32],
    ) -> Result<(Vec<u64>, Vec<u32>, usize)> {
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
            let mut slot = mapping.get(k, values.len()).ok_or_else(|| {
                JoinError::InvalidJoin(format!("dictionary key {k} past its values"))
            })?;
            if slot == u32::MAX {
                let bytes = self
                    .interned
                    .as_ref()
                    .and_then(|_| value_bytes(values, k as usize));
                let known = bytes.and_then(|b| self.interned.as_ref()?.get(b).copied());
                if let Some(key) = known {
                    slot = key;
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
                    slot = next;
                    new_rows.push(k as u32);
                    next += 1;
                }
                mapping.set(k, slot);
            }
            new_keys.push(u64::from(slot));
        }
        Ok((new_keys, new_rows, next as usize))
    }

    /// Adds the keys and the values gathered (an array of `data_type`'s value type)
    /// to `builder`; empties the buffers and forgets every source's mapping.
    ///
    /// # Errors
    /// [`JoinError::Internal`] if `data_type` is not a dictionary type, an arrow
    /// error if the values cannot be made.
    pub(super) fn finish(
        &mut self,
        builder: ArrayDataBuilder,
        data_type: &DataType,
    ) -> Result<ArrayDataBuilder> {
        let DataType::Dictionary(_, value_type) = data_type else {
            return Err(JoinError::Internal(
                "a dictionary column of another type".into(),
            ));
        };
        let values = self.values.finish(value_type, self.values_len)?;
        self.values_len = 0;
        // The values start over: no source's mapping holds any more.
        self.sources.clear();
        if let Some(interned) = self.interned.as_mut() {
            interned.clear();
        }
        Ok(builder
            .add_buffer(std::mem::take(&mut self.keys).into_buffer())
            .child_data(vec![values.to_data()]))
    }
}
