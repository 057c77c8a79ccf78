//! A growing buffer of gathered bytes: on the heap while small, then in an anonymous
//! memory map that grows with `mremap`, so that a large buffer's pages move instead
//! of being copied at every doubling, and what it holds can be counted before it
//! grows ([`Values::resident_after`]).

use std::sync::Arc;

use arrow_buffer::{ArrowNativeType, Buffer, MutableBuffer, ToByteSlice};

use crate::error::{JoinError, Result};

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
/// stops copying itself at every doubling (the partitions of a large build grow
/// past it, column by column, before they spill or stay).
pub(crate) const MAP_MIN_BYTES: usize = 512 << 10;

/// The smallest mapped buffer asked to be backed by transparent huge pages: one read
/// at random by the probe (a table's build rows) spares most TLB misses in 2 MiB
/// pages.
#[cfg(target_os = "linux")]
pub(crate) const HUGE_MIN_BYTES: usize = 4 << 20;

/// What a mapped buffer advised to use huge pages may hold in memory is counted in
/// whole transparent huge pages: the kernel may back any aligned 2 MiB of the map
/// with one.
pub(crate) const HUGE_PAGE_BYTES: usize = 2 << 20;

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
pub(crate) enum Values {
    Heap(MutableBuffer),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        len: usize,
        /// Advised to use huge pages ([`HUGE_MIN_BYTES`]).
        huge: bool,
    },
}

impl Default for Values {
    fn default() -> Self {
        Values::Heap(MutableBuffer::new(0))
    }
}

impl Values {
    /// Appends `bytes`, making room if [`make_room`](Self::make_room) did not.
    ///
    /// # Errors
    /// [`JoinError::Io`] if the memory map cannot be made or grown.
    #[inline]
    pub(crate) fn push_slice(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Values::Heap(buffer) => buffer.extend_from_slice(bytes),
            #[cfg(target_os = "linux")]
            Values::Mapped { map, len, .. } if *len + bytes.len() <= map.len() => {
                map[*len..*len + bytes.len()].copy_from_slice(bytes);
                *len += bytes.len();
            }
            #[cfg(target_os = "linux")]
            Values::Mapped { .. } => {
                self.make_room(bytes.len(), 0)?;
                return self.push_slice(bytes);
            }
        }
        Ok(())
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            Values::Heap(buffer) => buffer.len(),
            #[cfg(target_os = "linux")]
            Values::Mapped { len, .. } => *len,
        }
    }

    /// The bytes this buffer may hold in memory once `more` bytes are added, if its
    /// first allocation takes at least `first` bytes ([`extend`](Self::extend)).
    pub(crate) fn resident_after(&self, more: usize, first: usize) -> usize {
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
    pub(crate) fn extend(&mut self, n: usize, first: usize) -> Result<&mut [u8]> {
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
    pub(crate) fn gather<const W: usize>(
        &mut self,
        source: &[u8],
        rows: &[u32],
        first: usize,
    ) -> Result<()> {
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
    pub(crate) fn gather_narrowed(
        &mut self,
        source: &[u8],
        rows: &[u32],
        first: usize,
    ) -> Result<bool> {
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
    pub(crate) fn gather_as<const W: usize, T: ArrowNativeType>(
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
    pub(crate) fn truncate(&mut self, len: usize) {
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
    pub(crate) fn make_room(&mut self, n: usize, first: usize) -> Result<()> {
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
    pub(crate) fn into_buffer(self) -> Buffer {
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
