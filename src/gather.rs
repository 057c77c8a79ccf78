//! Rows of fixed-width columns gathered straight into the batch they end in.
//!
//! Rows bound for a spill file arrive a few at a time (a probe batch's rows of one
//! partition: a hundred or so when a build has a hundred spilled partitions) and are
//! written a batch at a time. Taking each arrival into a small batch of its own and
//! concatenating them before the write copies every value twice and allocates a few
//! buffers per arrival; when every column has a fixed width, [`FixedRows`] copies each
//! value once, into buffers that grow until the batch is written.
//!
//! The build side gathers each partition's rows the same way, into buffers that become
//! the partition's batch when the input ends: every build value is copied once, from
//! the input batch to where the probe reads it (no fragments, and no concatenation of
//! them). Those buffers grow large, so past [`MAP_MIN_BYTES`] a buffer lives in an
//! anonymous memory map that grows with `mremap`: its pages move, they are neither
//! copied nor faulted in again.
//!
//! ```text
//!  probe batch ─ rows [3, 17, 40] ─► FixedRows: one values buffer (+ validity) per column
//!  probe batch ─ rows [1, 9] ───────►   ... until `len()` reaches a batch ─► finish()
//!                                                                      ─► RecordBatch
//! ```

use std::sync::Arc;

use arrow_array::{make_array, ArrayRef, RecordBatch};
use arrow_buffer::{
    ArrowNativeType, BooleanBufferBuilder, Buffer, MutableBuffer, NullBuffer, ToByteSlice,
};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::error::{JoinError, Result};

/// Per column of a spill file's wide schema ([`spilljoin_spill::file_schema`]):
/// whether [`FixedRows::halving`] may gather it as `Int32` (its `Int64` columns).
pub(crate) fn halvable(schema: &SchemaRef) -> Vec<bool> {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type() == &DataType::Int64)
        .collect()
}

/// Per column of `batch` (the columns a [`halvable`] mask is over, a hash column
/// excepted): halvable, and every value fits in 32 bits
/// ([`spilljoin_spill::fits_i32`]): what [`FixedRows::shape_for`] and
/// [`FixedRows::admits`] take.
pub(crate) fn halvable_fits(batch: &RecordBatch, halvable: &[bool]) -> Vec<bool> {
    batch
        .columns()
        .iter()
        .zip(halvable.iter().copied().chain(std::iter::repeat(false)))
        .map(|(c, halvable)| halvable && spilljoin_spill::fits_i32(c))
        .collect()
}

/// The byte width of each column of `schema`, if every column has a fixed width that
/// [`FixedRows`] can gather (primitive types, decimals, dates, times, timestamps,
/// durations and intervals).
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

/// Writes the `W`-byte values at `rows` of `source` into `out` (`rows.len() * W`
/// bytes; rows are checked to be in `source`).
#[inline]
fn gather_fixed<const W: usize>(out: &mut [u8], source: &[u8], rows: &[u32]) {
    for (to, &r) in out.chunks_exact_mut(W).zip(rows) {
        let at = r as usize * W;
        if let Some(value) = source.get(at..at + W) {
            to.copy_from_slice(value);
        }
    }
}

/// `value`'s first bytes as an array of `B` (the same when `A == B`, what every
/// caller passes: a generic width matched against a literal one).
#[inline(always)]
fn resize<const A: usize, const B: usize>(value: [u8; A]) -> [u8; B] {
    let mut out = [0u8; B];
    let n = A.min(B);
    out[..n].copy_from_slice(&value[..n]);
    out
}

/// The smallest values buffer kept in an anonymous memory map rather than on the
/// heap (Linux): below it, a buffer that doubles copies little. A spill buffer (a
/// work batch's rows of one partition, tens of KiB a column) stays on the heap, where
/// its memory is reused batch after batch; a build partition that grows past it
/// stops copying itself at every doubling (SF10 orders ⋈ lineitem at a 25% limit:
/// 64 partitions growing to ~1 MiB a column before they spill or stay).
pub(crate) const MAP_MIN_BYTES: usize = 512 << 10;

/// The smallest mapped buffer asked to be backed by transparent huge pages: one read
/// at random by the probe (a table's build rows) spares most TLB misses in 2 MiB
/// pages.
#[cfg(target_os = "linux")]
pub(crate) const HUGE_MIN_BYTES: usize = 4 << 20;

/// What a mapped buffer advised to use huge pages may hold in memory is counted in
/// whole transparent huge pages: the kernel may back any aligned 2 MiB of the map
/// with one.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A smaller mapped buffer grows in steps of this many bytes, and what it holds is
/// counted in them.
#[cfg(target_os = "linux")]
const MAP_STEP_BYTES: usize = 64 << 10;

/// The bytes a mapped buffer of `need` bytes takes.
#[cfg(target_os = "linux")]
fn map_bytes(need: usize) -> usize {
    if need >= HUGE_MIN_BYTES {
        need.next_multiple_of(HUGE_PAGE_BYTES)
    } else {
        need.next_multiple_of(MAP_STEP_BYTES)
    }
}

/// A column's values: on the heap while small, then in an anonymous memory map.
#[derive(Debug)]
enum Values {
    Heap(MutableBuffer),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        len: usize,
        /// Advised to use huge pages ([`HUGE_MIN_BYTES`]).
        huge: bool,
    },
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Heap(buffer) => buffer.len(),
            #[cfg(target_os = "linux")]
            Values::Mapped { len, .. } => *len,
        }
    }

    /// The bytes this buffer may hold in memory once `more` bytes are added, if its
    /// first allocation takes at least `first` bytes ([`extend`](Self::extend)).
    fn resident_after(&self, more: usize, first: usize) -> usize {
        let need = self.len() + more;
        // Pages of a map not yet written are not held: a map counts what it holds,
        // in huge pages once it is advised to use them.
        #[cfg(target_os = "linux")]
        let mapped = |capacity: usize| match capacity >= HUGE_MIN_BYTES {
            true => need.next_multiple_of(HUGE_PAGE_BYTES),
            false => need.next_multiple_of(MAP_STEP_BYTES),
        };
        match self {
            Values::Heap(buffer) if need <= buffer.capacity() => buffer.capacity(),
            Values::Heap(buffer) if buffer.capacity() == 0 && need <= MAP_MIN_BYTES.max(first) => {
                need.max(first).next_multiple_of(64)
            }
            #[cfg(target_os = "linux")]
            Values::Heap(_) if need > MAP_MIN_BYTES => mapped(map_bytes(need)),
            // MutableBuffer rounds to 64 bytes and at least doubles.
            Values::Heap(buffer) => need.max(buffer.capacity() * 2).next_multiple_of(64),
            #[cfg(target_os = "linux")]
            Values::Mapped { map, huge, .. } => match *huge {
                true => need.next_multiple_of(HUGE_PAGE_BYTES),
                false if need > map.len() => mapped(map_bytes(need.max(map.len() / 2 * 3))),
                false => mapped(map.len()),
            },
        }
    }

    /// The next `n` bytes, counted in the length: the caller writes every one. A
    /// buffer's first allocation takes at least `first` bytes: one that grows from
    /// nothing by doubling copies all it holds once more, in a dozen allocations.
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    fn extend(&mut self, n: usize, first: usize) -> Result<&mut [u8]> {
        let start = self.len();
        let need = start + n;
        self.make_room(n, first)?;
        match self {
            Values::Heap(buffer) => {
                buffer.extend_zeros(n);
                Ok(&mut buffer.as_slice_mut()[start..need])
            }
            #[cfg(target_os = "linux")]
            Values::Mapped { map, len, .. } => {
                *len = need;
                Ok(&mut map[start..need])
            }
        }
    }

    /// Appends the `W`-byte values at `rows` of `source` (rows are checked to be in
    /// `source`), allocating as [`extend`](Self::extend) does. On the heap the values
    /// are written straight into the buffer's spare capacity, not over zeros written
    /// first (a memory map is zeroed by the kernel anyway).
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    fn gather<const W: usize>(&mut self, source: &[u8], rows: &[u32], first: usize) -> Result<()> {
        self.make_room(rows.len() * W, first)?;
        let value = |r: &u32| -> [u8; W] {
            let at = *r as usize * W;
            source
                .get(at..at + W)
                .and_then(|v| v.try_into().ok())
                .unwrap_or([0; W])
        };
        match self {
            // Through the widths' native types: `MutableBuffer::extend` writes into
            // reserved capacity in a tight loop.
            Values::Heap(buffer) => match W {
                1 => buffer.extend(rows.iter().map(|r| value(r)[0])),
                2 => buffer.extend(rows.iter().map(|r| u16::from_ne_bytes(resize(value(r))))),
                4 => buffer.extend(rows.iter().map(|r| u32::from_ne_bytes(resize(value(r))))),
                8 => buffer.extend(rows.iter().map(|r| u64::from_ne_bytes(resize(value(r))))),
                16 => buffer.extend(rows.iter().map(|r| i128::from_ne_bytes(resize(value(r))))),
                _ => {
                    for r in rows {
                        buffer.extend_from_slice(&value(r));
                    }
                }
            },
            #[cfg(target_os = "linux")]
            Values::Mapped { map, len, .. } => {
                let start = *len;
                *len += rows.len() * W;
                gather_fixed::<W>(&mut map[start..*len], source, rows);
            }
        }
        Ok(())
    }

    /// Appends the 16-byte decimals at `rows` of `source` as 8-byte integers,
    /// allocating as [`extend`](Self::extend) does; `false` if one did not fit (and
    /// was cut: the caller truncates them away again).
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    fn gather_narrowed(&mut self, source: &[u8], rows: &[u32], first: usize) -> Result<bool> {
        // `v` fits iff `v + 2^63` lies in `0..2^64`: the high halves, ORed, are zero.
        let mut high = 0_u64;
        self.gather_as::<16, i64>(source, rows, first, |v| {
            let v = i128::from_ne_bytes(v);
            high |= (v.wrapping_add(1 << 63) >> 64) as u64;
            v as i64
        })?;
        Ok(high == 0)
    }

    /// Appends the `W`-byte values at `rows` of `source` as the `T`s `convert` makes
    /// of them, allocating as [`extend`](Self::extend) does.
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    fn gather_as<const W: usize, T: ArrowNativeType>(
        &mut self,
        source: &[u8],
        rows: &[u32],
        first: usize,
        mut convert: impl FnMut([u8; W]) -> T,
    ) -> Result<()> {
        let width = std::mem::size_of::<T>();
        self.make_room(rows.len() * width, first)?;
        let mut value = |r: &u32| -> T {
            let at = *r as usize * W;
            convert(
                source
                    .get(at..at + W)
                    .and_then(|v| v.try_into().ok())
                    .unwrap_or([0; W]),
            )
        };
        match self {
            Values::Heap(buffer) => buffer.extend(rows.iter().map(value)),
            #[cfg(target_os = "linux")]
            Values::Mapped { map, len, .. } => {
                let start = *len;
                *len += rows.len() * width;
                for (to, r) in map[start..*len].chunks_exact_mut(width).zip(rows) {
                    to.copy_from_slice(value(r).to_byte_slice());
                }
            }
        }
        Ok(())
    }

    /// Forgets the bytes past `len`.
    fn truncate(&mut self, len: usize) {
        match self {
            Values::Heap(buffer) => buffer.truncate(len),
            #[cfg(target_os = "linux")]
            Values::Mapped { len: held, .. } => *held = len.min(*held),
        }
    }

    /// Makes room for `n` more bytes: a heap buffer's first allocation takes at least
    /// `first` bytes (all the buffer will hold, when its caller knows: the heap
    /// reuses what the last such buffer freed); a heap buffer that must grow past
    /// [`MAP_MIN_BYTES`] moves to a memory map, which grows by half at a time without
    /// copying, asked to use huge pages once it reaches [`HUGE_MIN_BYTES`].
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    fn make_room(&mut self, n: usize, first: usize) -> Result<()> {
        let start = self.len();
        let need = start + n;
        if let Values::Heap(buffer) = self {
            if buffer.capacity() == 0 && need <= MAP_MIN_BYTES.max(first) {
                buffer.reserve(need.max(first));
            }
        }
        #[cfg(target_os = "linux")]
        if let Values::Heap(buffer) = self {
            if need > buffer.capacity() && need > MAP_MIN_BYTES {
                let mut map = memmap2::MmapOptions::new()
                    .len(map_bytes(need))
                    .map_anon()
                    .map_err(map_error)?;
                let huge = advise_huge(&map);
                map[..start].copy_from_slice(buffer.as_slice());
                *self = Values::Mapped {
                    map,
                    len: start,
                    huge,
                };
            }
        }
        match self {
            Values::Heap(buffer) => {
                buffer.reserve(n);
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Values::Mapped { map, huge, .. } => {
                if need > map.len() {
                    let capacity = map_bytes(need.max(map.len() / 2 * 3));
                    // SAFETY: the map is anonymous (nothing beyond a file's end to
                    // touch) and borrowed mutably here, so nothing points into it
                    // while it moves.
                    unsafe { map.remap(capacity, memmap2::RemapOptions::new().may_move(true)) }
                        .map_err(map_error)?;
                    *huge = *huge || advise_huge(map);
                }
                Ok(())
            }
        }
    }

    /// The values as an arrow buffer, without copying them.
    fn into_buffer(self) -> Buffer {
        match self {
            Values::Heap(buffer) => buffer.into(),
            #[cfg(target_os = "linux")]
            Values::Mapped { map, len, .. } => {
                match std::ptr::NonNull::new(map.as_ptr().cast_mut()) {
                    // SAFETY: the map holds at least `len` initialized bytes (every
                    // byte `extend` counted was written), and the `Arc` that owns it
                    // keeps it mapped, unmoved and unwritten, for as long as the
                    // buffer lives.
                    Some(ptr) => unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(map)) },
                    None => Buffer::from(MutableBuffer::new(0)),
                }
            }
        }
    }
}

/// Asks for huge pages for a map of at least [`HUGE_MIN_BYTES`]: read at random by
/// the probe, 2 MiB pages spare most TLB misses (what it may then hold is counted in
/// them: `resident_after`). Only advice, so a kernel without it changes nothing.
#[cfg(target_os = "linux")]
fn advise_huge(map: &memmap2::MmapMut) -> bool {
    if map.len() < HUGE_MIN_BYTES {
        return false;
    }
    let _ = map.advise(memmap2::Advice::HugePage);
    true
}

#[cfg(target_os = "linux")]
fn map_error(source: std::io::Error) -> JoinError {
    JoinError::Io {
        path: "anonymous memory map".into(),
        source,
    }
}

/// One column's gathered values and, once a null arrives, its validity.
#[derive(Debug)]
struct Column {
    width: usize,
    /// A decimal of at most 18 digits gathered as the `Int64` its spill file holds
    /// ([`spilljoin_spill::file_schema`]): read from 16-byte values, written as 8.
    narrowed: bool,
    /// An `Int64` column (a narrowed decimal's included) that may be gathered as
    /// `Int32` ([`FixedRows::halving`]).
    halvable: bool,
    /// Gathered as `Int32` (`width` 4) into the present buffer.
    halved: bool,
    values: Values,
    validity: Option<BooleanBufferBuilder>,
    /// Whether the column may get a validity buffer (its field is nullable).
    nullable: bool,
}

impl Column {
    /// Appends the validity of rows `rows` of `data` to a column holding `len` rows:
    /// a validity buffer appears with the first null.
    fn append_validity(&mut self, data: &ArrayData, rows: &[u32], len: usize) {
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
}

/// Whether `column` gathers `data` narrowed: a decimal into a narrowed field (an `Int64`
/// source, even with that field's metadata, is copied as it is).
fn narrowing(data: &ArrayData, column: &Column) -> bool {
    column.narrowed && matches!(data.data_type(), DataType::Decimal128(..))
}

/// The bytes of `data`'s values that `column` gathers from (a narrowed decimal's are 16
/// a value, a halved column's 8), if they are all there.
fn source_of<'d>(data: &'d ArrayData, column: &Column) -> Option<&'d [u8]> {
    let width = if narrowing(data, column) {
        16
    } else if column.halved {
        8
    } else {
        column.width
    };
    let values = data
        .buffers()
        .first()
        .map(|b| b.as_slice())
        .unwrap_or_default();
    let start = data.offset() * width;
    values.get(start..start + data.len() * width)
}

/// The 16-byte decimal at row `r` of `source` (0 past its end; rows are checked to be
/// in it).
#[inline(always)]
fn decimal_at(source: &[u8], r: u32) -> i128 {
    let at = r as usize * 16;
    source
        .get(at..at + 16)
        .and_then(|v| v.try_into().ok())
        .map_or(0, i128::from_ne_bytes)
}

/// Rows of a schema whose columns all have a fixed width, gathered from many batches.
#[derive(Debug)]
pub(crate) struct FixedRows {
    schema: SchemaRef,
    columns: Vec<Column>,
    len: usize,
    /// The rows the buffers are first allocated for ([`FixedRows::expect_rows`]).
    expected_rows: usize,
    /// The segment schema of the last halved columns ([`FixedRows::halving`]).
    halved_schema: Option<(Vec<usize>, SchemaRef)>,
    /// The widths it was made with, summed.
    wide_row_bytes: usize,
}

impl FixedRows {
    /// No rows yet of `schema`, whose columns have the byte `widths`
    /// ([`fixed_widths`]).
    pub fn new(schema: SchemaRef, widths: &[usize]) -> Self {
        let columns = widths
            .iter()
            .zip(schema.fields())
            .map(|(&width, field)| Column {
                width,
                narrowed: field.data_type() == &DataType::Int64
                    && field.metadata().contains_key(spilljoin_spill::NARROWED_KEY),
                halvable: false,
                halved: false,
                values: Values::Heap(MutableBuffer::new(0)),
                validity: None,
                nullable: field.is_nullable(),
            })
            .collect();
        Self {
            schema,
            columns,
            len: 0,
            expected_rows: 0,
            halved_schema: None,
            wide_row_bytes: widths.iter().sum(),
        }
    }

    /// Like [`new`](Self::new) for rows that are only ever written to a spill file
    /// (`schema` is its [`spilljoin_spill::file_schema`]): a buffer gathers the
    /// `Int64` columns (narrowed decimals included) of the batches it holds as `Int32`
    /// when the first batch's values all fit ([`shape_for`](Self::shape_for)), and
    /// [`finish`](Self::finish) gives them in that file's segment schema.
    pub fn halving(schema: SchemaRef, widths: &[usize]) -> Self {
        let mut rows = Self::new(schema, widths);
        for (column, field) in rows.columns.iter_mut().zip(rows.schema.fields()) {
            column.halvable = field.data_type() == &DataType::Int64;
        }
        rows
    }

    /// Whether these rows were made by [`halving`](Self::halving) (and have a column
    /// that may halve).
    pub fn is_halving(&self) -> bool {
        self.columns.iter().any(|c| c.halvable)
    }

    /// Whether rows of a batch whose columns fit in 32 bits where `fits` says so
    /// ([`spilljoin_spill::fits_i32`], one per column, the hash column excepted) can
    /// join the buffered ones: not if a column gathered halved would not fit.
    pub fn admits(&self, fits: &[bool]) -> bool {
        // Empty buffers take the next batch's shape ([`shape_for`](Self::shape_for)).
        self.len == 0
            || self
                .columns
                .iter()
                .zip(fits.iter().copied().chain(std::iter::repeat(false)))
                .all(|(c, fits)| !c.halved || fits)
    }

    /// While the buffers are empty, gathers halvable columns as `Int32` where `fits`
    /// says so (see [`admits`](Self::admits)); a no-op once rows are buffered.
    pub fn shape_for(&mut self, fits: &[bool]) {
        if self.len > 0 {
            return;
        }
        for (column, fits) in self
            .columns
            .iter_mut()
            .zip(fits.iter().copied().chain(std::iter::repeat(false)))
        {
            if column.halvable {
                column.halved = fits;
                column.width = if fits { 4 } else { 8 };
            }
        }
    }

    /// The bytes a row takes in the buffers (their columns' widths as gathered now).
    pub fn row_bytes(&self) -> usize {
        self.columns.iter().map(|c| c.width).sum()
    }

    /// The rows that take the bytes of `rows` wide rows as gathered now.
    pub fn rows_in_bytes_of(&self, rows: usize) -> usize {
        rows * self.wide_row_bytes / self.row_bytes().max(1)
    }

    /// Allocates the buffers, when they are next empty, for `rows` rows at once (the
    /// rows a batch that was written when full held), rather than growing them from
    /// nothing; [`capacity_after`](Self::capacity_after) counts that.
    pub fn expect_rows(&mut self, rows: usize) {
        self.expected_rows = rows;
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes the buffers may hold in memory once `more` rows are added: their
    /// capacity then, given that a heap buffer that grows doubles, and a mapped one
    /// in whole huge pages (and a nullable column's validity bits, which appear with
    /// its first null).
    pub fn capacity_after(&self, more: usize) -> usize {
        let rows = self.len + more;
        self.columns
            .iter()
            .map(|c| {
                c.values
                    .resident_after(more * c.width, self.expected_rows.saturating_mul(c.width))
                    // A validity buffer, if the column has one or may get one.
                    + if c.validity.is_some() || c.nullable {
                        rows.div_ceil(8) * 2 + 64
                    } else {
                        0
                    }
            })
            .sum()
    }

    /// Appends rows `rows` of `columns` (arrays of this schema's types, in order).
    /// With `hashes`, the schema's last column (`UInt64`, not in `columns`) takes
    /// `hashes[row]` of each row.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if a column's type is not the schema's or a row is
    /// past the end of the columns (bugs in the caller); nothing is appended then.
    pub fn append(
        &mut self,
        columns: &[ArrayData],
        rows: &[u32],
        hashes: Option<&[u64]>,
    ) -> Result<()> {
        let with_hashes = usize::from(hashes.is_some());
        let num_rows = columns.first().map_or(0, |c| c.len());
        let fits = columns.len() + with_hashes == self.columns.len()
            && columns.iter().all(|c| c.len() == num_rows)
            && hashes.is_none_or(|h| h.len() == num_rows)
            // The largest row, without a branch a row.
            && (rows.is_empty() || (rows.iter().fold(0, |m, &r| m.max(r)) as usize) < num_rows)
            && columns
                .iter()
                .zip(&self.columns)
                .zip(self.schema.fields())
                .all(|((c, column), f)| {
                    c.data_type() == f.data_type()
                        || (column.narrowed && matches!(c.data_type(), DataType::Decimal128(..)))
                });
        if !fits {
            return Err(JoinError::InvalidJoin(
                "internal: gathering rows of another schema or past its end".into(),
            ));
        }
        // Every column's source bytes are checked before anything is appended (they
        // are found again below: a few rows a call are common, so nothing here
        // allocates).
        if columns
            .iter()
            .zip(&self.columns)
            .any(|(data, column)| source_of(data, column).is_none())
        {
            return Err(JoinError::InvalidJoin(
                "internal: a column shorter than its length".into(),
            ));
        }
        // Narrowed decimals first: one that does not fit in 64 bits (arrow does not
        // enforce a decimal's precision on its values) is refused with nothing
        // appended, as the spill writer refuses it.
        let expected_rows = self.expected_rows;
        for (i, data) in columns.iter().enumerate() {
            let column = &self.columns[i];
            if !narrowing(data, column) || column.halved {
                continue;
            }
            let source = source_of(data, column).unwrap_or_default();
            let first = expected_rows.saturating_mul(column.width);
            if !self.columns[i]
                .values
                .gather_narrowed(source, rows, first)?
            {
                // Every column held `len` rows before this call.
                let len = self.len;
                for column in self.columns.iter_mut().take(i + 1) {
                    column.values.truncate(len * column.width);
                }
                let v = rows
                    .iter()
                    .map(|&r| decimal_at(source, r))
                    .find(|&v| i64::try_from(v).is_err())
                    .unwrap_or_default();
                return Err(JoinError::InvalidJoin(format!(
                    "decimal value {v} of column {} exceeds its precision",
                    self.schema.field(i).name()
                )));
            }
        }
        if let (Some(hashes), Some(column)) = (hashes, self.columns.last_mut()) {
            column.values.gather::<8>(
                hashes.to_byte_slice(),
                rows,
                expected_rows.saturating_mul(8),
            )?;
            if let Some(validity) = column.validity.as_mut() {
                validity.append_n(rows.len(), true);
            }
        }
        for (column, data) in self.columns.iter_mut().zip(columns) {
            let source = source_of(data, column).unwrap_or_default();
            let narrowing = narrowing(data, column);
            let width = column.width;
            let first = expected_rows.saturating_mul(width);
            if column.halved {
                // Every value fits (`shape_for`, `admits`).
                if narrowing {
                    column
                        .values
                        .gather_as::<16, i32>(source, rows, first, |v| {
                            i128::from_ne_bytes(v) as i32
                        })?;
                } else {
                    column
                        .values
                        .gather_as::<8, i32>(source, rows, first, |v| {
                            i64::from_ne_bytes(v) as i32
                        })?;
                }
                column.append_validity(data, rows, self.len);
                continue;
            }
            if narrowing {
                column.append_validity(data, rows, self.len);
                continue;
            }
            // Fixed-size copies for the common widths: a copy of a length known only
            // at run time is a call to memmove per value.
            match width {
                1 => column.values.gather::<1>(source, rows, first)?,
                2 => column.values.gather::<2>(source, rows, first)?,
                4 => column.values.gather::<4>(source, rows, first)?,
                8 => column.values.gather::<8>(source, rows, first)?,
                16 => column.values.gather::<16>(source, rows, first)?,
                32 => column.values.gather::<32>(source, rows, first)?,
                _ => {
                    let out = column.values.extend(rows.len() * width, first)?;
                    for (to, &r) in out.chunks_exact_mut(width).zip(rows) {
                        let at = r as usize * width;
                        if let Some(value) = source.get(at..at + width) {
                            to.copy_from_slice(value);
                        }
                    }
                }
            }
            column.append_validity(data, rows, self.len);
        }
        self.len += rows.len();
        Ok(())
    }

    /// The rows gathered so far as one batch; empties the buffers.
    ///
    /// # Errors
    /// An arrow error if the arrays cannot be made (a bug: their types are checked).
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let len = std::mem::take(&mut self.len);
        // Halved columns make the batch one of a spill file segment's schema.
        let halved: Vec<usize> = (0..self.columns.len())
            .filter(|&i| self.columns[i].halved)
            .collect();
        let schema = match &self.halved_schema {
            _ if halved.is_empty() => Arc::clone(&self.schema),
            Some((cached, schema)) if *cached == halved => Arc::clone(schema),
            _ => {
                let schema = spilljoin_spill::segment_schema(&self.schema, &halved);
                self.halved_schema = Some((halved, Arc::clone(&schema)));
                schema
            }
        };
        let arrays = self
            .columns
            .iter_mut()
            .zip(schema.fields())
            .map(|(column, field)| -> Result<ArrayRef> {
                let values =
                    std::mem::replace(&mut column.values, Values::Heap(MutableBuffer::new(0)));
                let nulls = column
                    .validity
                    .take()
                    .map(|mut v| NullBuffer::new(v.finish()));
                let data = ArrayData::builder(field.data_type().clone())
                    .len(len)
                    .add_buffer(values.into_buffer())
                    .nulls(nulls)
                    .build()?;
                Ok(make_array(data))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(schema, arrays)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Decimal128Array, Int32Array, Int64Array, UInt64Array};
    use arrow_schema::{ArrowError, Field, Schema};
    use arrow_select::take::take;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn gathers_what_take_and_concat_would() -> TestResult {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(15, 2), false),
            Field::new("h", DataType::UInt64, false),
            Field::new("s", DataType::Int32, true),
        ]));
        let widths = fixed_widths(&schema).ok_or("not fixed width")?;
        assert_eq!(widths, vec![8, 16, 8, 4]);
        let batch = |start: i64, nulls: bool| -> std::result::Result<Vec<ArrayRef>, ArrowError> {
            let a: Int64Array = (start..start + 10)
                .map(|v| (!nulls || v % 3 != 0).then_some(v))
                .collect();
            let d = Decimal128Array::from_iter_values((start..start + 10).map(|v| v as i128 * 100))
                .with_precision_and_scale(15, 2)?;
            let h = UInt64Array::from_iter_values((start..start + 10).map(|v| v as u64 * 7));
            let s: Int32Array = (start..start + 10).map(|v| Some(v as i32)).collect();
            Ok(vec![Arc::new(a), Arc::new(d), Arc::new(h), Arc::new(s)])
        };
        // A sliced input (offset 2), one without nulls first, then one with them.
        let first: Vec<ArrayRef> = batch(0, false)?.iter().map(|c| c.slice(2, 8)).collect();
        let second = batch(100, true)?;
        let data = |columns: &[ArrayRef]| -> Vec<ArrayData> {
            columns.iter().map(|c| c.to_data()).collect()
        };
        let mut rows = FixedRows::new(Arc::clone(&schema), &widths);
        rows.append(&data(&first), &[0, 5, 7], None)?;
        rows.append(&data(&second), &[9, 0, 3, 3], None)?;
        assert_eq!(rows.len(), 7);
        let got = rows.finish()?;
        assert_eq!(rows.len(), 0);
        for (i, column) in got.columns().iter().enumerate() {
            let a = take(
                first[i].as_ref(),
                &arrow_array::UInt32Array::from(vec![0, 5, 7]),
                None,
            )?;
            let b = take(
                second[i].as_ref(),
                &arrow_array::UInt32Array::from(vec![9, 0, 3, 3]),
                None,
            )?;
            let want = arrow_select::concat::concat(&[a.as_ref(), b.as_ref()])?;
            assert_eq!(column.to_data(), want.to_data(), "column {i}");
        }
        // Reused after finish.
        rows.append(&data(&second), &[1], None)?;
        assert_eq!(rows.finish()?.num_rows(), 1);
        // The last column from hashes instead of an array.
        let hashes: Vec<u64> = (0..10).map(|i| i * 1000).collect();
        let with_hash: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("__hash", DataType::UInt64, false),
        ]));
        let mut rows = FixedRows::new(Arc::clone(&with_hash), &[8, 8]);
        rows.append(&data(&second[..1]), &[4, 2], Some(&hashes))?;
        let got = rows.finish()?;
        let h = got
            .column(1)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or("not a UInt64 column")?;
        assert_eq!(h.values().to_vec(), vec![4000, 2000]);
        Ok(())
    }

    #[test]
    fn large_buffers_move_to_a_map_and_keep_every_value() -> TestResult {
        // 600Ki rows of 16 + 8 bytes: past MAP_MIN_BYTES, then grown several times.
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Decimal128(20, 0), false),
            Field::new("a", DataType::Int64, true),
        ]));
        let mut rows = FixedRows::new(Arc::clone(&schema), &[16, 8]);
        let mut want_d = Vec::new();
        let mut want_a = Vec::new();
        let mut held = 0;
        for chunk in 0..150i64 {
            let base = chunk * 8192;
            let d = Decimal128Array::from_iter_values((base..base + 8192).map(i128::from))
                .with_precision_and_scale(20, 0)?;
            let a: Int64Array = (base..base + 8192)
                .map(|v| (v % 7 != 0).then_some(-v))
                .collect();
            // Every other row, backwards.
            let picked: Vec<u32> = (0..8192u32).rev().step_by(2).collect();
            let before = rows.capacity_after(picked.len());
            rows.append(&[d.to_data(), a.to_data()], &picked, None)?;
            assert!(rows.capacity_after(0) <= before, "grew past what it said");
            held = held.max(rows.capacity_after(0));
            for &r in &picked {
                want_d.push(d.value(r as usize));
                want_a.push(a.is_valid(r as usize).then(|| a.value(r as usize)));
            }
        }
        let values = rows.len() * 24;
        assert!(values > 2 * MAP_MIN_BYTES);
        assert!(held >= values && held < values + 3 * HUGE_PAGE_BYTES + 4096);
        let got = rows.finish()?;
        let d = got
            .column(0)
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .ok_or("not decimal")?;
        let a = got
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not int64")?;
        assert_eq!(d.values().to_vec(), want_d);
        assert_eq!(a.iter().collect::<Vec<_>>(), want_a);
        // The batch outlives the gatherer, which starts over empty.
        drop(rows);
        assert_eq!(got.num_rows(), want_a.len());
        Ok(())
    }

    #[test]
    fn buffers_expecting_rows_are_allocated_once_as_counted() -> TestResult {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("h", DataType::UInt64, false),
        ]));
        let a: Int64Array = (0..1000i64).map(|v| (v % 5 != 0).then_some(v)).collect();
        let hashes: Vec<u64> = (0..1000u64).map(|v| v * 3).collect();
        let mut rows = FixedRows::new(Arc::clone(&schema), &[8, 8]);
        rows.expect_rows(3000);
        // Counted before anything is allocated: both value buffers at 3000 rows, and
        // the nullable column's validity.
        let said = rows.capacity_after(100);
        assert!(said >= 2 * 3000 * 8, "{said}");
        let mut sizes = vec![];
        for chunk in 0..30u32 {
            let picked: Vec<u32> = (chunk * 10..chunk * 10 + 100).collect();
            let before = rows.capacity_after(picked.len());
            rows.append(&[a.to_data()], &picked, Some(&hashes))?;
            assert!(rows.capacity_after(0) <= before, "grew past what it said");
            sizes.push(rows.capacity_after(0));
        }
        // 3000 rows in: the values never grew past their first allocation (what
        // grows is the validity's count, a quarter byte a row); from nothing, by
        // doubling, they would have reached 32 KiB each.
        let validity = |rows: usize| rows.div_ceil(8) * 2 + 64;
        for (chunk, &size) in sizes.iter().enumerate() {
            assert_eq!(
                size - validity((chunk + 1) * 100),
                2 * 3000 * 8,
                "{sizes:?}"
            );
        }
        let got = rows.finish()?;
        assert_eq!(got.num_rows(), 3000);
        let column = got
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not int64")?;
        assert_eq!(column.value(1), a.value(1));
        assert!(column.is_null(0));
        Ok(())
    }

    #[test]
    fn buffers_expecting_more_than_a_map_takes_stay_in_one_heap_allocation() -> TestResult {
        // A spilled pair's build knows its rows: 100K of 8 bytes, past MAP_MIN_BYTES.
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let a: Int64Array = (0..1000i64).collect();
        let mut rows = FixedRows::new(Arc::clone(&schema), &[8]);
        rows.expect_rows(100_000);
        const { assert!(100_000 * 8 > MAP_MIN_BYTES) };
        let picked: Vec<u32> = (0..1000).collect();
        assert_eq!(rows.capacity_after(picked.len()), 800_000);
        for _ in 0..100 {
            rows.append(&[a.to_data()], &picked, None)?;
            // Counted as allocated at first, never grown, never moved to a map.
            assert_eq!(rows.capacity_after(0), 800_000);
        }
        let got = rows.finish()?;
        assert_eq!(got.num_rows(), 100_000);
        let column = got
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not int64")?;
        assert_eq!(column.value(99_999), 999);
        Ok(())
    }

    /// A spill file schema of a key, a decimal and a hash column, and its widths.
    fn key_decimal_hash() -> std::result::Result<(SchemaRef, Vec<usize>), &'static str> {
        let logical: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("h", DataType::UInt64, false),
        ]));
        let schema = spilljoin_spill::file_schema(&logical);
        let widths = fixed_widths(&schema).ok_or("not fixed width")?;
        Ok((schema, widths))
    }

    #[test]
    fn decimals_gather_narrowed_into_a_spill_file_schema() -> TestResult {
        let (schema, widths) = key_decimal_hash()?;
        assert_eq!(widths, vec![8, 8, 8]);
        let hashes = [11u64, 12, 13, 14];
        let k = Int64Array::from(vec![10, 20, 30, 40]);
        let d = Decimal128Array::from(vec![Some(-5), None, Some(999_999_999_999_999), Some(7)])
            .with_precision_and_scale(15, 2)?;
        let mut rows = FixedRows::new(Arc::clone(&schema), &widths);
        rows.append(&[k.to_data(), d.to_data()], &[3, 1, 0, 2], Some(&hashes))?;
        // A value past 64 bits (arrow does not enforce precision) is refused, and
        // nothing of the rows is appended.
        let too_big = Decimal128Array::from(vec![Some(1), Some(i128::from(i64::MAX) + 1)])
            .with_precision_and_scale(15, 2)?;
        let k2 = Int64Array::from(vec![1, 2]);
        assert!(rows
            .append(&[k2.to_data(), too_big.to_data()], &[0, 1], Some(&[91, 92]))
            .is_err());
        assert_eq!(rows.len(), 4);
        // Every column, the hash column included, still holds 4 rows: the next row
        // lines up with its hash.
        rows.append(&[k2.to_data(), too_big.to_data()], &[0], Some(&[93, 94]))?;
        let got = rows.finish()?;
        let hash_column = got
            .column(2)
            .as_any()
            .downcast_ref::<arrow_array::UInt64Array>()
            .ok_or("not hashes")?;
        assert_eq!(hash_column.values().to_vec(), [14, 12, 11, 13, 93]);
        assert_eq!(got.schema(), schema);
        let narrow = got
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not narrowed")?;
        assert_eq!(
            narrow.iter().collect::<Vec<_>>(),
            vec![Some(7), None, Some(-5), Some(999_999_999_999_999), Some(1)]
        );
        Ok(())
    }

    #[test]
    fn halving_rows_gather_int32_while_their_batches_fit() -> TestResult {
        let (schema, widths) = key_decimal_hash()?;
        let k = Int64Array::from(vec![10, -20, 30]);
        let d = Decimal128Array::from(vec![Some(-5), None, Some(i128::from(i32::MAX))])
            .with_precision_and_scale(15, 2)?;
        let columns = [k.to_data(), d.to_data()];
        let fits = [spilljoin_spill::fits_i32(&k), spilljoin_spill::fits_i32(&d)];
        assert_eq!(fits, [true, true]);
        let mut rows = FixedRows::halving(Arc::clone(&schema), &widths);
        rows.shape_for(&fits);
        assert_eq!(rows.row_bytes(), 4 + 4 + 8);
        rows.append(&columns, &[2, 0], Some(&[7, 8, 9]))?;
        rows.append(&columns, &[1], Some(&[7, 8, 9]))?;
        // A batch whose key does not fit is not admitted to these rows.
        assert!(!rows.admits(&[false, true]));
        assert!(rows.admits(&fits));
        let got = rows.finish()?;
        assert_eq!(
            got.schema(),
            spilljoin_spill::segment_schema(&schema, &[0, 1])
        );
        let ints = |i: usize| -> std::result::Result<Vec<Option<i32>>, &str> {
            let c = got.column(i).as_any().downcast_ref::<Int32Array>();
            Ok(c.ok_or("not Int32")?.iter().collect())
        };
        assert_eq!(ints(0)?, [Some(30), Some(10), Some(-20)]);
        assert_eq!(ints(1)?, [Some(i32::MAX), Some(-5), None]);
        // Emptied, the buffers admit any batch and take its shape: the key wide.
        assert!(rows.admits(&[false, false]));
        let big = Int64Array::from(vec![1 << 40]);
        let d1 = Decimal128Array::from(vec![Some(3)]).with_precision_and_scale(15, 2)?;
        rows.shape_for(&[false, true]);
        assert_eq!(rows.row_bytes(), 8 + 4 + 8);
        rows.append(&[big.to_data(), d1.to_data()], &[0], Some(&[5]))?;
        let got = rows.finish()?;
        assert_eq!(got.column(0).data_type(), &DataType::Int64);
        assert_eq!(got.column(1).data_type(), &DataType::Int32);
        let key = got.column(0).as_any().downcast_ref::<Int64Array>();
        assert_eq!(key.ok_or("not Int64")?.value(0), 1 << 40);
        // Rows that are not halving never halve.
        let mut plain = FixedRows::new(Arc::clone(&schema), &widths);
        plain.shape_for(&fits);
        assert_eq!(plain.row_bytes(), 24);
        Ok(())
    }

    #[test]
    fn refuses_other_types_and_rows_past_the_end() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let mut rows = FixedRows::new(Arc::clone(&schema), &[8]);
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        assert!(rows.append(&[ints.to_data()], &[0], None).is_err());
        let longs: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        assert!(rows.append(&[longs.to_data()], &[2], None).is_err());
        assert_eq!(rows.len(), 0);
        assert!(fixed_widths(&Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8,
            false
        )])))
        .is_none());
    }
}
