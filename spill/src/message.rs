//! Framing: cutting a spill file into IPC messages, with every length checked
//! against the bytes that are really there before anything is allocated.
//!
//! An Arrow IPC stream is a sequence of encapsulated messages:
//!
//! ```text
//! ┌────────────┬──────────────┬───────────────────────┬─────────────────────┐
//! │ 0xFFFFFFFF │ metadata len │ metadata (flatbuffer, │ body (buffers, each │
//! │ (optional) │ i32 LE       │ padded to 8)          │ padded to 8/64)     │
//! └────────────┴──────────────┴───────────────────────┴─────────────────────┘
//!   … repeated: schema, then dictionary and record batch messages …
//! ┌────────────┬────────────┐
//! │ 0xFFFFFFFF │ 0x00000000 │  end-of-stream marker
//! └────────────┴────────────┘
//! ```
//!
//! arrow's own `StreamReader` trusts the lengths: it allocates the body length
//! written in the metadata before reading it, so a garbled length asks for
//! gigabytes, and it treats a file that stops between two messages as
//! complete. Spill files are read with this framing instead, which refuses
//! both: a length larger than the rest of the file is corruption, and a file
//! must end with the end-of-stream marker and nothing after it, so a
//! truncated spill file can never silently lose its last batches.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_ipc::convert::MessageBuffer;

use crate::checksum::{Verifier, Written};
use crate::config::SpillReadMode;
use crate::direct::DirectReader;
use crate::file::Extent;

/// The first four bytes of every message in the current IPC format.
const CONTINUATION_MARKER: [u8; 4] = [0xff; 4];

/// Capacity of the `BufReader` in [`SpillReadMode::Buffered`]. Message
/// headers and metadata (a few hundred bytes) come out of it; bodies at least
/// this large are read straight into their own buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// One message: its verified flatbuffer metadata and its body.
pub(crate) struct RawMessage {
    pub(crate) metadata: MessageBuffer,
    pub(crate) body: Buffer,
}

/// Why a message could not be framed.
pub(crate) enum FrameError {
    /// The operating system failed a read.
    Io(io::Error),
    /// The bytes are not a well-formed, complete IPC stream.
    Corrupt(String),
}

/// The bytes of a spill file, read either way.
pub(crate) enum MessageSource {
    Buffered(Buffered),
    Mapped(Mapped),
}

pub(crate) struct Buffered {
    reader: BufReader<ExtentReader>,
    /// Bytes not yet read, of the file's (or its extents') length when it was
    /// opened.
    remaining: u64,
    /// Where each extent ends in the bytes read one after the other, and the
    /// extent being read: no message may cross from one into the next, as in
    /// [`Mapped`].
    ends: Vec<u64>,
    index: usize,
    /// Checks every byte taken against the file's writes, when they are known.
    verifier: Option<Verifier>,
    /// The bytes end after a write, not at the end-of-stream marker (`parts`).
    open_ended: bool,
}

impl Buffered {
    /// Checks that the next `len` bytes lie in one extent (the caller checked that
    /// they are left).
    fn within_extent(&mut self, len: usize) -> Result<(), FrameError> {
        let position = self.ends.last().copied().unwrap_or(0) - self.remaining;
        while self.index + 1 < self.ends.len() && self.ends[self.index] == position {
            self.index += 1;
        }
        let end = self.ends.get(self.index).copied().unwrap_or(0);
        if position + len as u64 > end {
            return Err(FrameError::Corrupt(format!(
                "{len} bytes at {position} cross the end of an extent at {end}"
            )));
        }
        Ok(())
    }
}

pub(crate) struct Mapped {
    /// `None` for an empty file, which cannot be mapped.
    map: Option<Arc<memmap2::Mmap>>,
    /// The ranges of the mapping that are read, in order.
    extents: Arc<[Extent]>,
    /// The extent being read, and where in the mapping: `position` up to `end`.
    index: usize,
    position: usize,
    end: usize,
    /// Bytes not yet read in this extent and the ones after it.
    remaining: u64,
    /// As in [`Buffered`].
    verifier: Option<Verifier>,
    open_ended: bool,
}

/// Reads the extents of a file one after the other, with positioned reads.
struct ExtentReader {
    file: Arc<File>,
    extents: Arc<[Extent]>,
    index: usize,
    /// Bytes of `extents[index]` read so far.
    done: u64,
    /// With direct I/O, what reads `file` instead.
    direct: Option<Box<DirectReader>>,
}

impl Read for ExtentReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let Some(extent) = self.extents.get(self.index) else {
                return Ok(0);
            };
            if self.done == extent.len {
                self.index += 1;
                self.done = 0;
                continue;
            }
            let want = usize::try_from(extent.len - self.done)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let at = extent.offset + self.done;
            let read = match self.direct.as_mut() {
                Some(direct) => direct.read_at(&mut buf[..want], at)?,
                None => read_at(&self.file, &mut buf[..want], at)?,
            };
            self.done += read as u64;
            return Ok(read);
        }
    }
}

/// `extents` of a file of `len` bytes (all of it if `None`), checked to lie in it.
fn within(extents: Option<Arc<[Extent]>>, len: u64) -> Result<Arc<[Extent]>, FrameError> {
    let Some(extents) = extents else {
        return Ok(Arc::new([Extent { offset: 0, len }]));
    };
    match extents
        .iter()
        .find(|e| e.offset.saturating_add(e.len) > len)
    {
        Some(past) => Err(FrameError::Corrupt(format!(
            "file shrank: {} bytes at {} are past its end at {len}",
            past.len, past.offset
        ))),
        None => Ok(extents),
    }
}

/// `pread(2)`: reads at `offset` without moving the file's cursor (on Windows it
/// does move it, which nothing here uses).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
}

impl MessageSource {
    /// Opens `path` for reading in `mode`: all of it, or only `extents` (which
    /// must lie inside the file), in order; in [`SpillReadMode::Buffered`] with
    /// direct I/O if `direct` gives the runs to read ahead (the file was written
    /// so: `crate::direct`). Bytes that are a part of a file (`crate::parts`) may
    /// end after a message instead of at the end-of-stream marker (`open_ended`).
    pub(crate) fn open(
        path: &Path,
        extents: Option<Arc<[Extent]>>,
        mode: SpillReadMode,
        direct: Option<usize>,
        (written, open_ended): (Option<Arc<[Written]>>, bool),
    ) -> Result<Self, FrameError> {
        let verifier = written.map(Verifier::new);
        // (Runs read ahead, where the file is read with direct I/O.)
        let direct = direct.filter(|_| mode == SpillReadMode::Buffered);
        let file =
            crate::direct::open_for_reading(path, direct.is_some()).map_err(FrameError::Io)?;
        let whole = extents.is_none();
        // In mmap mode the mapping's length is the file's: every range read below
        // lies inside it, even if the file changed since its size was asked.
        let (map, len) = match mode {
            SpillReadMode::Buffered => (None, file.metadata().map_err(FrameError::Io)?.len()),
            SpillReadMode::Mmap => {
                let map = map_file(&file, whole).map_err(FrameError::Io)?;
                let len = map.as_ref().map_or(0, |map| map.len() as u64);
                (map, len)
            }
        };
        let extents = within(extents, len)?;
        let total = extents.iter().map(|e| e.len).sum();
        let file = Arc::new(file);
        let direct =
            direct.map(|ahead| Box::new(DirectReader::new(Arc::clone(&file), &extents, ahead)));
        match mode {
            SpillReadMode::Buffered => Ok(Self::Buffered(Buffered {
                ends: extents
                    .iter()
                    .scan(0, |end, e| {
                        *end += e.len;
                        Some(*end)
                    })
                    .collect(),
                index: 0,
                verifier,
                open_ended,
                reader: BufReader::with_capacity(
                    READ_BUFFER_BYTES,
                    ExtentReader {
                        file,
                        extents,
                        index: 0,
                        done: 0,
                        direct,
                    },
                ),
                remaining: total,
            })),
            SpillReadMode::Mmap => Ok(Self::Mapped(
                Mapped::new(map, extents, total, (verifier, open_ended)).map_err(FrameError::Io)?,
            )),
        }
    }

    /// The next message, `Ok(None)` at the end-of-stream marker.
    pub(crate) fn next_message(&mut self) -> Result<Option<RawMessage>, FrameError> {
        let Some((metadata, body_len)) = self.next_header()? else {
            return Ok(None);
        };
        let body = self.take(body_len, "message body")?;
        Ok(Some(RawMessage { metadata, body }))
    }

    /// The next message as though the file ended halfway through its body (fault
    /// injection, see [`crate::FaultKind::ShortRead`]): its header and half of its
    /// body are read, then the error of a file that shrank while being read (of one
    /// that ends inside the end-of-stream marker, at the marker).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn next_message_cut_short(&mut self) -> Result<Option<RawMessage>, FrameError> {
        let Some((_, body_len)) = self.next_header()? else {
            return Err(FrameError::Corrupt(
                "file ends inside a message header".to_owned(),
            ));
        };
        let read = body_len / 2;
        self.take(read, "message body")?;
        Err(shrank("message body", body_len - read))
    }

    /// The next message's verified metadata and the length of its body, `Ok(None)`
    /// at the end-of-stream marker.
    fn next_header(&mut self) -> Result<Option<(MessageBuffer, usize)>, FrameError> {
        let Some(metadata_len) = self.read_prefix()? else {
            let trailing = self.remaining();
            if trailing != 0 {
                return Err(FrameError::Corrupt(format!(
                    "{trailing} bytes after the end-of-stream marker"
                )));
            }
            return Ok(None);
        };
        let metadata = self.take(metadata_len, "message metadata")?;
        let metadata =
            MessageBuffer::try_new(metadata).map_err(|e| FrameError::Corrupt(e.to_string()))?;
        let body_len = metadata.as_ref().bodyLength();
        let body_len = usize::try_from(body_len)
            .map_err(|_| FrameError::Corrupt(format!("negative message body length {body_len}")))?;
        Ok(Some((metadata, body_len)))
    }

    /// Reads the continuation marker (if any) and the metadata length;
    /// `None` for the end-of-stream marker.
    fn read_prefix(&mut self) -> Result<Option<usize>, FrameError> {
        if self.remaining() == 0 {
            if self.open_ended() {
                return Ok(None);
            }
            return Err(FrameError::Corrupt(
                "file ends without the end-of-stream marker".to_owned(),
            ));
        }
        let mut word = self.read_word()?;
        if word == CONTINUATION_MARKER {
            word = self.read_word()?;
        }
        let len = i32::from_le_bytes(word);
        if len == 0 {
            return Ok(None);
        }
        let len = usize::try_from(len)
            .map_err(|_| FrameError::Corrupt(format!("negative message metadata length {len}")))?;
        Ok(Some(len))
    }

    fn read_word(&mut self) -> Result<[u8; 4], FrameError> {
        if self.remaining() < 4 {
            return Err(FrameError::Corrupt(
                "file ends inside a message header".to_owned(),
            ));
        }
        let mut word = [0; 4];
        match self {
            Self::Buffered(b) => {
                b.within_extent(4)?;
                b.reader.read_exact(&mut word).map_err(eof_is_corrupt)?;
                b.remaining -= 4;
                check(&mut b.verifier, &word)?;
            }
            Self::Mapped(m) => {
                word.copy_from_slice(m.next_bytes(4)?);
            }
        }
        Ok(word)
    }

    /// The next `len` bytes as a buffer: a zero-copy slice of the mapping, or
    /// a fresh allocation filled by one read.
    fn take(&mut self, len: usize, what: &str) -> Result<Buffer, FrameError> {
        let remaining = self.remaining();
        if len as u64 > remaining {
            return Err(FrameError::Corrupt(format!(
                "{what} of {len} bytes overruns the {remaining} bytes left in the file"
            )));
        }
        match self {
            Self::Buffered(b) => {
                b.within_extent(len)?;
                // The capacity is exact, so `read_to_end` never reallocates. It zeroes
                // the capacity before reading into it (std's `read_buf` is unstable);
                // reading into it uninitialized with pread(2) made spilled pairs no
                // faster (the first touch of fresh pages moves into the copy).
                let mut bytes = Vec::with_capacity(len);
                (&mut b.reader)
                    .take(len as u64)
                    .read_to_end(&mut bytes)
                    .map_err(FrameError::Io)?;
                if bytes.len() != len {
                    return Err(shrank(what, len - bytes.len()));
                }
                b.remaining -= len as u64;
                check(&mut b.verifier, &bytes)?;
                Ok(Buffer::from_vec(bytes))
            }
            Self::Mapped(m) => m.buffer(len),
        }
    }

    /// Whether the bytes read so far end inside one of the file's writes (whose
    /// checksum is then not checked yet). Always false when the writes are not known.
    pub(crate) fn inside_write(&self) -> bool {
        let verifier = match self {
            Self::Buffered(b) => &b.verifier,
            Self::Mapped(m) => &m.verifier,
        };
        verifier.as_ref().is_some_and(Verifier::inside_write)
    }

    fn open_ended(&self) -> bool {
        match self {
            Self::Buffered(b) => b.open_ended,
            Self::Mapped(m) => m.open_ended,
        }
    }

    fn remaining(&self) -> u64 {
        match self {
            Self::Buffered(b) => b.remaining,
            Self::Mapped(m) => m.remaining,
        }
    }
}

impl Mapped {
    /// Reads `extents` (of `total` bytes, all inside `map`) of a mapping.
    fn new(
        map: Option<memmap2::Mmap>,
        extents: Arc<[Extent]>,
        total: u64,
        (verifier, open_ended): (Option<Verifier>, bool),
    ) -> io::Result<Self> {
        let first = extents
            .first()
            .copied()
            .unwrap_or(Extent { offset: 0, len: 0 });
        let position = usize::try_from(first.offset).map_err(io::Error::other)?;
        let end = usize::try_from(first.offset + first.len).map_err(io::Error::other)?;
        Ok(Self {
            map: map.map(Arc::new),
            extents,
            index: 0,
            position,
            end,
            remaining: total,
            verifier,
            open_ended,
        })
    }

    /// Moves to the next extent with bytes left once this one is read, and checks
    /// that the next `len` bytes are in it: a message never crosses from one
    /// extent into the next (each is written whole), and the caller checked that
    /// `len` bytes are left in all of them.
    fn advance_to(&mut self, len: usize) -> Result<(), FrameError> {
        while self.position == self.end && self.index + 1 < self.extents.len() {
            self.index += 1;
            let extent = self.extents[self.index];
            // (Inside the mapping, checked at open, so within `usize`.)
            self.position = extent.offset as usize;
            self.end = (extent.offset + extent.len) as usize;
        }
        if self.end - self.position < len {
            return Err(FrameError::Corrupt(format!(
                "{len} bytes at {} cross the end of an extent at {}",
                self.position, self.end
            )));
        }
        Ok(())
    }

    /// The next `len` bytes, which the caller has checked are left.
    fn next_bytes(&mut self, len: usize) -> Result<&[u8], FrameError> {
        self.advance_to(len)?;
        let start = self.position;
        self.position += len;
        self.remaining -= len as u64;
        let map = self.map.as_deref().map_or(&[][..], |map| &map[..]);
        let bytes = &map[start..start + len];
        check(&mut self.verifier, bytes)?;
        Ok(bytes)
    }

    /// A zero-copy buffer over the next `len` bytes, which the caller has
    /// checked are left.
    ///
    /// Each message gets its own `Buffer` rather than a slice of one buffer
    /// over the whole file, because a buffer's capacity is what arrow counts
    /// as an array's memory (`get_array_memory_size`): a slice of a
    /// whole-file buffer would claim the whole file for every array.
    fn buffer(&mut self, len: usize) -> Result<Buffer, FrameError> {
        let Some(map) = self.map.clone() else {
            return Ok(Buffer::from_vec(Vec::<u8>::new()));
        };
        let bytes = self.next_bytes(len)?;
        let ptr = NonNull::from(bytes).cast::<u8>();
        // SAFETY: `ptr` points to `len` initialised, readable bytes inside
        // the mapping (the slice above is bounds-checked), and the buffer
        // owns an `Arc` of the mapping, so the bytes stay mapped until the
        // last slice of the buffer is dropped. Nothing writes through it.
        Ok(unsafe { Buffer::from_custom_allocation(ptr, len, map) })
    }
}

/// Hashes `bytes`, the next a reader took, with `verifier` (if the file's writes are
/// known): a write that reads back otherwise than it was written is corruption.
fn check(verifier: &mut Option<Verifier>, bytes: &[u8]) -> Result<(), FrameError> {
    match verifier {
        Some(v) => v.consumed(bytes).map_err(FrameError::Corrupt),
        None => Ok(()),
    }
}

/// Maps all of `file`; `None` for an empty file, which cannot be mapped on some
/// platforms. A file read `whole` is read front to back: the kernel is told so.
fn map_file(file: &File, whole: bool) -> io::Result<Option<memmap2::Mmap>> {
    if file.metadata()?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: the mapping is valid for as long as the `Mmap` lives, and
    // every `Buffer` made from it owns it through the `Arc`. Its contents
    // may only change (or its pages vanish, raising SIGBUS) if another
    // process writes or truncates the file while it is mapped. Spill files
    // live in a 0o700 directory of this process, and the bytes of a finished
    // spill file are never written again (a shared file only grows past
    // them); `SpillReadMode::Mmap` documents the risk for other paths.
    let map = unsafe { memmap2::MmapOptions::new().map(file)? };
    // Readahead hint only; failure changes nothing but speed. (A spill file of a
    // shared file reads its extents only, among other files' bytes.)
    #[cfg(unix)]
    if whole {
        let _ = map.advise(memmap2::Advice::Sequential);
    }
    Ok(Some(map))
}

/// The error of a file that ended `short_by` bytes before the end of `what`.
fn shrank(what: &str, short_by: usize) -> FrameError {
    FrameError::Corrupt(format!(
        "file shrank while being read: {what} short by {short_by} bytes"
    ))
}

fn eof_is_corrupt(e: io::Error) -> FrameError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        FrameError::Corrupt("file shrank while being read".to_owned())
    } else {
        FrameError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpillConfig, SpillManager};
    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    /// The messages of `source` until the end marker, or the first error.
    fn count(mut source: MessageSource) -> Result<usize, String> {
        let mut n = 0;
        loop {
            match source.next_message() {
                Ok(Some(_)) => n += 1,
                Ok(None) => return Ok(n),
                Err(FrameError::Corrupt(e)) => return Err(e),
                Err(FrameError::Io(e)) => return Err(e.to_string()),
            }
        }
    }

    #[test]
    fn no_message_may_cross_from_one_extent_into_the_next() {
        let m = SpillManager::new(SpillConfig::default()).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))])
                .unwrap();
        let mut w = m.create_writer(schema, "t").unwrap();
        w.write(&batch).unwrap();
        w.write(&batch).unwrap();
        let file = w.finish().unwrap();
        let len = file.bytes();
        for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
            let open = |extents: Vec<Extent>| {
                MessageSource::open(file.path(), Some(extents.into()), mode, None, (None, false))
                    .map_err(|_| "open failed".to_owned())
                    .and_then(count)
            };
            // Schema, two batches: the same as one extent, or cut at message ends.
            assert_eq!(open(vec![Extent { offset: 0, len }]), Ok(3), "{mode}");
            let whole = MessageSource::open(file.path(), None, mode, None, (None, false))
                .map_err(|_| "open failed".to_owned())
                .and_then(count);
            assert_eq!(whole, Ok(3), "{mode}");
            // Cut inside the schema message: both modes refuse it.
            let cut = vec![
                Extent { offset: 0, len: 10 },
                Extent {
                    offset: 10,
                    len: len - 10,
                },
            ];
            let err = open(cut).unwrap_err();
            assert!(err.contains("cross the end of an extent"), "{mode}: {err}");
            // Extents past the end of the file.
            let past = vec![Extent {
                offset: 0,
                len: len + 1,
            }];
            assert!(open(past).is_err(), "{mode}");
        }
    }
}
