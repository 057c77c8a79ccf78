//! Writing a spill file: arrow's IPC stream encoder, then one vectored write
//! per message through a quota-checking counter.
//!
//! ```text
//!  batch ──► StreamEncoder ──► Vec<Buffer> ──► CountingWriter ──► File
//!            (IPC framing;     (the batch's    (reserves quota    (one writev(2)
//!             compression)      own buffers     for the whole      per message)
//!                               when not        message first)
//!                               compressed)    or SharedSink ───► end of a shared
//!                                              (the same, under    file; the extent
//!                                               the file's lock)   is noted
//! ```
//!
//! arrow's `StreamWriter` would do the same framing but issue one `write` per
//! buffer and per padding run; behind a `BufWriter` large enough to make
//! those cheap, every byte is copied once more. Encoding to buffers and
//! writing a message with one `writev` keeps uncompressed batches zero-copy
//! on the way to the kernel, and lets the quota refuse a whole message before
//! any of it reaches the file.
//!
//! No buffer sits in front of the file: a message is already one system call,
//! and a join keeps one writer open per spilled partition and side (hundreds
//! under a small limit), where a buffer per writer would take memory from the
//! rows being buffered for bigger messages. And it would not pay for itself: on
//! `benches/spill_io.rs` a `BufWriter` of any size from 8 KiB to 1 MiB wrote the
//! same messages slower than a plain `write_all` of their bytes (figures in
//! BENCHMARKS.md).

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_schema::{ArrowError, DataType, SchemaRef};

use crate::checksum::Written;
use crate::config::SpillCompression;
use crate::direct::DirectTail;
use crate::error::SpillError;
use crate::file::{Extent, FileGuard, SharedFile, SpillFile, Storage};
use crate::manager::ManagerInner;
use crate::parts::Segment;

/// Counts the bytes going to the file and reserves quota for them first.
pub(crate) struct CountingWriter {
    // Field order matters: the writes behind end, then the file is closed, before
    // the guard deletes it.
    /// The file's last partial block and writes in flight, when it is written with
    /// direct I/O.
    direct: Option<DirectTail>,
    inner: Arc<File>,
    guard: FileGuard,
}

impl CountingWriter {
    pub(crate) fn new(inner: File, guard: FileGuard) -> Self {
        let direct = guard.direct().then(DirectTail::default);
        Self {
            inner: Arc::new(inner),
            guard,
            direct,
        }
    }

    /// Writes one encoded message, reserving quota for all of it first: a
    /// refused message writes nothing.
    fn write_message(&mut self, buffers: &[Buffer]) -> Result<(), SpillError> {
        let bytes: u64 = buffers.iter().map(|b| b.len() as u64).sum();
        if let Err(denied) = self.guard.reserve(bytes) {
            return Err(SpillError::QuotaExceeded {
                path: self.guard.path().to_owned(),
                quota_bytes: denied.quota_bytes,
                used_bytes: denied.used_bytes,
                requested_bytes: denied.requested_bytes,
            });
        }
        self.guard
            .manager()
            .bytes_written
            .fetch_add(bytes, Ordering::Relaxed);
        // On failure the reservation stays: some of the bytes may be in the
        // file, which the failed writer deletes when it is dropped.
        let (manager, path) = (self.guard.manager(), self.guard.path());
        let written = match self.direct.as_mut() {
            Some(direct) => {
                direct.append(&self.inner, buffers, manager.config().direct_writes_behind)
            }
            None => write_out(manager, path, &self.inner, buffers),
        };
        written.map_err(|source| SpillError::Io {
            path: path.to_owned(),
            source,
        })
    }

    /// Closes the file (every message is in it already), handing back the guard
    /// that owns it. A direct file is first cut back to its logical end.
    fn into_guard(self) -> Result<FileGuard, SpillError> {
        let Self {
            inner,
            guard,
            direct,
        } = self;
        if let Some(mut direct) = direct {
            direct.finish(&inner).map_err(|source| SpillError::Io {
                path: guard.path().to_owned(),
                source,
            })?;
        }
        drop(inner);
        Ok(guard)
    }
}

/// Appends a writer's messages to a shared file and notes where they went.
pub(crate) struct SharedSink {
    file: Arc<SharedFile>,
    extents: Vec<Extent>,
    bytes: u64,
}

impl SharedSink {
    pub(crate) fn new(file: Arc<SharedFile>) -> Self {
        Self {
            file,
            extents: Vec::new(),
            bytes: 0,
        }
    }

    /// Appends one encoded message at the end of the shared file, reserving quota
    /// for all of it first: a refused message writes nothing.
    fn write_message(&mut self, buffers: &[Buffer]) -> Result<(), SpillError> {
        let bytes: u64 = buffers.iter().map(|b| b.len() as u64).sum();
        let path = || self.file.path().to_owned();
        let mut state = self.file.lock();
        if let Some((kind, cause)) = &state.failed {
            return Err(SpillError::Io {
                path: path(),
                source: io::Error::new(
                    *kind,
                    format!("an earlier write to this shared file failed: {cause}"),
                ),
            });
        }
        if let Err(denied) = state.guard.reserve(bytes) {
            return Err(SpillError::QuotaExceeded {
                path: path(),
                quota_bytes: denied.quota_bytes,
                used_bytes: denied.used_bytes,
                requested_bytes: denied.requested_bytes,
            });
        }
        self.file
            .manager()
            .bytes_written
            .fetch_add(bytes, Ordering::Relaxed);
        // Until the write has gone through, the file's end is not known (a panic
        // unwinding out of here leaves this set, and the lock poisoned).
        state.failed = Some((
            io::ErrorKind::Other,
            "a writer panicked while writing".to_owned(),
        ));
        let state_now = &mut *state;
        let written = match state_now.direct.as_mut() {
            Some(direct) => direct.append(
                &state_now.file,
                buffers,
                self.file.manager().config().direct_writes_behind,
            ),
            None => write_out(
                self.file.manager(),
                self.file.path(),
                &state_now.file,
                buffers,
            ),
        };
        if let Err(source) = written {
            state.failed = Some((source.kind(), source.to_string()));
            return Err(SpillError::Io {
                path: path(),
                source,
            });
        }
        state.failed = None;
        let offset = state.len;
        state.len += bytes;
        drop(state);
        self.bytes += bytes;
        match self.extents.last_mut() {
            Some(last) if last.offset + last.len == offset => last.len += bytes,
            _ => self.extents.push(Extent { offset, len: bytes }),
        }
        Ok(())
    }

    /// Makes this writer's messages readable (a direct file holds back its partial
    /// last block and writes in flight until then): its spill file is about to be.
    fn flush(&self) -> Result<(), SpillError> {
        let path = || self.file.path().to_owned();
        let mut state = self.file.lock();
        let state_now = &mut *state;
        let Some(direct) = state_now.direct.as_mut() else {
            return Ok(());
        };
        // A failed write may have been one of this writer's, gone behind.
        if let Some((kind, cause)) = &state_now.failed {
            return Err(SpillError::Io {
                path: path(),
                source: io::Error::new(
                    *kind,
                    format!("an earlier write to this shared file failed: {cause}"),
                ),
            });
        }
        direct.flush(&state_now.file).map_err(|source| {
            // What the writes in flight did to the file is not known.
            state.failed = Some((source.kind(), source.to_string()));
            SpillError::Io {
                path: path(),
                source,
            }
        })
    }
}

/// Where a writer's messages go.
pub(crate) enum Sink {
    /// A file of its own.
    Own(CountingWriter),
    /// The end of a shared file.
    Shared(SharedSink),
}

impl Sink {
    fn write_message(&mut self, buffers: &[Buffer]) -> Result<(), SpillError> {
        match self {
            Self::Own(writer) => writer.write_message(buffers),
            Self::Shared(sink) => sink.write_message(buffers),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Self::Own(writer) => writer.guard.path(),
            Self::Shared(sink) => sink.file.path(),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Self::Own(writer) => writer.guard.bytes(),
            Self::Shared(sink) => sink.bytes,
        }
    }

    fn manager(&self) -> &ManagerInner {
        match self {
            Self::Own(writer) => writer.guard.manager(),
            Self::Shared(sink) => sink.file.manager(),
        }
    }

    /// Where the finished file's bytes are.
    fn into_storage(self) -> Result<Storage, SpillError> {
        Ok(match self {
            Self::Own(writer) => Storage::Whole(writer.into_guard()?),
            Self::Shared(sink) => {
                sink.flush()?;
                Storage::Shared {
                    file: sink.file,
                    extents: sink.extents.into(),
                    bytes: sink.bytes,
                }
            }
        })
    }
}

/// Writes one message's buffers to `file`, at `path`, of `manager`: with
/// [`write_all_vectored`], or as the manager's fault plan says (tests).
#[cfg(feature = "fault-injection")]
fn write_out(
    manager: &ManagerInner,
    path: &Path,
    mut file: &File,
    buffers: &[Buffer],
) -> io::Result<()> {
    let write_all: fn(&mut dyn Write, &[Buffer]) -> io::Result<()> =
        |writer, buffers| write_all_vectored(writer, buffers);
    match &manager.config().faults {
        Some(faults) => faults.write_message(path, &mut file, buffers, write_all),
        None => write_all_vectored(&mut file, buffers),
    }
}

/// Writes one message's buffers to `file` with [`write_all_vectored`] (without the
/// feature `fault-injection`, nothing else).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
fn write_out(_: &ManagerInner, _: &Path, mut file: &File, buffers: &[Buffer]) -> io::Result<()> {
    write_all_vectored(&mut file, buffers)
}

/// `Write::write_all_vectored`, which is not stable yet.
fn write_all_vectored(writer: &mut (impl Write + ?Sized), buffers: &[Buffer]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = buffers
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| IoSlice::new(b.as_slice()))
        .collect();
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        match writer.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes record batches into a new spill file.
///
/// Created by [`crate::SpillManager::create_writer`]; [`SpillWriter::finish`]
/// consumes it and returns the [`SpillFile`]. Dropping a writer without
/// finishing it deletes the file and returns its bytes to the quota (a writer
/// of a [`crate::SpillGroup`] leaves its bytes in the shared file, which goes
/// with its last spill file).
///
/// The schema message goes out with the first batch (or at `finish`).
/// After any failed [`write`](SpillWriter::write) except a schema mismatch
/// (which writes nothing), the encoder's dictionary state and the file may
/// disagree, so every further call returns [`SpillError::WriterFailed`].
///
/// # Memory
///
/// An open writer holds no buffer of its own: each batch goes to the file in
/// one system call when it is written. While a batch is written with
/// compression, its compressed buffers are held too.
pub struct SpillWriter {
    /// The encoder of the current segment; `None` before the first batch.
    encoder: Option<StreamEncoder>,
    options: IpcWriteOptions,
    sink: Sink,
    schema: SchemaRef,
    /// The wide file schema (`schema` with narrow decimals as `Int64`; the same `Arc`
    /// when nothing narrows), which batches may also come in.
    file_schema: SchemaRef,
    /// The columns of `file_schema` that may be written as `Int32` (`narrow`).
    halvable: Vec<usize>,
    /// Those the current segment writes as `Int32`, and its schema.
    halved: Vec<usize>,
    segment_schema: SchemaRef,
    /// Whether `segment_schema` equals `schema` (a batch of `schema` is then written
    /// as it is).
    segment_is_schema: bool,
    /// The last batch schema taken, and whether it is `schema`: every batch of a
    /// buffer comes in the same `Arc`, and comparing whole schemas (their fields'
    /// metadata maps) for each batch was an eighth of the time of writing small
    /// batches.
    known: Option<(SchemaRef, bool)>,
    path: PathBuf,
    rows: u64,
    batches: u64,
    failed: bool,
    /// Each write so far, hashed (`checksum`), and where each segment begins.
    written: Vec<Written>,
    segments: Vec<Segment>,
}

impl std::fmt::Debug for SpillWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillWriter")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .field("batches", &self.batches)
            .field("bytes", &self.bytes_written())
            .field("failed", &self.failed)
            .finish()
    }
}

impl SpillWriter {
    /// Sets up the encoder; nothing is written yet.
    pub(crate) fn try_new(
        sink: Sink,
        schema: SchemaRef,
        compression: SpillCompression,
    ) -> Result<Self, SpillError> {
        let path = sink.path().to_owned();
        let options = IpcWriteOptions::default()
            .try_with_compression(compression.ipc_compression())
            .map_err(|source| SpillError::Arrow {
                path: path.clone(),
                source,
            })?;
        // Columns are written in as few bytes as they need (`narrow`).
        let file_schema = crate::narrow::file_schema(&schema);
        let halvable = crate::narrow::halvable(&file_schema);
        Ok(Self {
            encoder: None,
            options,
            sink,
            segment_schema: Arc::clone(&file_schema),
            segment_is_schema: Arc::ptr_eq(&file_schema, &schema) || file_schema == schema,
            known: None,
            schema,
            file_schema,
            halvable,
            halved: Vec::new(),
            path,
            rows: 0,
            batches: 0,
            failed: false,
            written: Vec::new(),
            segments: Vec::new(),
        })
    }

    /// Where the file is being written (a group writer's: its shared file).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema every batch must have.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Appends one batch. Empty batches are written too (as zero-row
    /// messages) and read back. A batch may also come in the file's schema
    /// ([`crate::file_schema`] of the writer's: decimals of at most 18 digits as
    /// `Int64`, view columns as offsets) or in a segment schema of it
    /// ([`crate::segment_schema`]: some of those `Int64` columns as `Int32`),
    /// gathered narrow by the caller; it is read back in the writer's schema like
    /// any other. `Int64` columns (decimals included) whose values fit in 32 bits
    /// are written as `Int32`, view columns as offsets with only their rows' bytes
    /// (see the crate's `narrow` module); a batch of more than 2 GiB of a view
    /// column's values is written in slices, as several batches.
    ///
    /// # Errors
    ///
    /// [`SpillError::SchemaMismatch`] if the batch's schema is not equal to
    /// the writer's or its file schema (field names, types, nullability and
    /// metadata all count), [`SpillError::Arrow`] if a decimal does not fit in 64
    /// bits or one view value exceeds 2 GiB: nothing is written and the writer
    /// stays usable (unless the batch was being written in slices: those written
    /// stay).
    /// [`SpillError::QuotaExceeded`] if the encoded batch does not fit in the
    /// quota (nothing of it is written), [`SpillError::Io`] if writing failed,
    /// [`SpillError::Arrow`] if arrow cannot encode or compress it; the writer
    /// is unusable afterwards ([`SpillError::WriterFailed`]).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), SpillError> {
        self.check_usable()?;
        let found = batch.schema_ref();
        let Some(is_schema) = self.accepts(found) else {
            return Err(SpillError::SchemaMismatch {
                path: self.path.clone(),
                expected: self.schema.clone(),
                found: found.clone(),
            });
        };
        // A view column is written as offsets (`crate::views`), which address 2 GiB
        // of values a batch: a batch of more is written in slices (only one value
        // of more cannot be, refused before anything is written).
        if batch.num_rows() > 1 && self.too_many_view_bytes(batch) {
            if let Some(source) = self.oversized_value(batch) {
                return Err(SpillError::Arrow {
                    path: self.path.clone(),
                    source,
                });
            }
            let half = batch.num_rows() / 2;
            self.write(&batch.slice(0, half))?;
            return self.write(&batch.slice(half, batch.num_rows() - half));
        }
        let new_segment = self.new_segment(batch);
        let (segment_schema, as_it_is) = match &new_segment {
            Some(halved) => (
                crate::narrow::segment_schema(&self.file_schema, halved),
                None,
            ),
            None => (
                Arc::clone(&self.segment_schema),
                is_schema.then_some(self.segment_is_schema),
            ),
        };
        let batch = self.shaped(batch, &segment_schema, as_it_is)?;
        // Whatever happens next may leave the encoder's dictionary tracker
        // ahead of the file; only success clears the flag again.
        self.failed = true;
        if let Some(halved) = new_segment {
            self.begin_segment(halved, segment_schema)?;
        }
        self.encode(&batch)?;
        self.failed = false;
        self.count(batch.num_rows() as u64);
        Ok(())
    }

    /// Whether a view column of `batch` that this file stores as offsets holds more
    /// bytes of values than 32-bit offsets address.
    fn too_many_view_bytes(&self, batch: &RecordBatch) -> bool {
        batch
            .columns()
            .iter()
            .zip(self.file_schema.fields())
            .any(|(c, f)| {
                c.data_type() != f.data_type() && crate::views::value_bytes(c) > i32::MAX as usize
            })
    }

    /// The error for a value of a view column of `batch` that 32-bit offsets cannot
    /// address on its own, if one is.
    fn oversized_value(&self, batch: &RecordBatch) -> Option<ArrowError> {
        let (column, bytes) = batch
            .columns()
            .iter()
            .zip(self.file_schema.fields())
            .filter(|(c, f)| c.data_type() != f.data_type())
            .map(|(c, f)| (f.name(), crate::views::largest_value(c.as_ref())))
            .find(|&(_, bytes)| bytes > i32::MAX as usize)?;
        Some(ArrowError::InvalidArgumentError(format!(
            "a value of {bytes} bytes in column {column} is more than a spill file addresses"
        )))
    }

    /// The columns a new segment that begins with `batch` writes as `Int32`, if one
    /// begins: with the first batch, and when the current segment writes a column
    /// as `Int32` that this batch's values do not fit (that segment ends, and the
    /// new one writes the column wide).
    fn new_segment(&self, batch: &RecordBatch) -> Option<Vec<usize>> {
        // The columns this batch could write as `Int32`.
        let fits: Vec<usize> = self
            .halvable
            .iter()
            .copied()
            .filter(|&c| crate::narrow::fits_i32(batch.column(c)))
            .collect();
        if self.encoder.is_none() {
            Some(fits)
        } else if self.halved.iter().all(|c| fits.contains(c)) {
            None
        } else {
            Some(
                self.halved
                    .iter()
                    .copied()
                    .filter(|c| fits.contains(c))
                    .collect(),
            )
        }
    }

    /// `batch` as it is written in `segment_schema`: narrowed unless it is in that
    /// schema already (a batch of the writer's schema is when nothing narrows).
    /// `as_it_is`, when known, says whether it is (the batch is of the writer's
    /// schema and the segment's is or is not that).
    ///
    /// # Errors
    /// [`SpillError::Arrow`] if a decimal does not fit in 64 bits (or arrow fails);
    /// nothing is written then and the writer stays usable.
    fn shaped<'b>(
        &self,
        batch: &'b RecordBatch,
        segment_schema: &SchemaRef,
        as_it_is: Option<bool>,
    ) -> Result<Cow<'b, RecordBatch>, SpillError> {
        let arrow_error = |source| SpillError::Arrow {
            path: self.path.clone(),
            source,
        };
        let found = batch.schema_ref();
        let same = as_it_is
            .unwrap_or_else(|| Arc::ptr_eq(segment_schema, found) || **found == **segment_schema);
        if same {
            return Ok(Cow::Borrowed(batch));
        }
        // View columns become offsets here, with only their rows' bytes however many
        // other rows' their buffers hold (`crate::views`): a file's bytes are bounded
        // by its rows'.
        crate::narrow::narrow(batch, segment_schema)
            .map(Cow::Owned)
            .map_err(arrow_error)
    }

    /// Starts a segment that writes columns `halved` as `Int32`: a new encoder, which
    /// writes the segment's schema message (and its dictionaries afresh) with the
    /// next batch.
    fn begin_segment(
        &mut self,
        halved: Vec<usize>,
        segment_schema: SchemaRef,
    ) -> Result<(), SpillError> {
        self.encoder = Some(
            StreamEncoder::try_new_with_options(&segment_schema, self.options.clone()).map_err(
                |source| SpillError::Arrow {
                    path: self.path.clone(),
                    source,
                },
            )?,
        );
        self.halved = halved;
        self.segments.push(Segment {
            first_write: self.written.len(),
            schema: Arc::clone(&segment_schema),
        });
        self.segment_is_schema =
            Arc::ptr_eq(&segment_schema, &self.schema) || segment_schema == self.schema;
        self.segment_schema = segment_schema;
        Ok(())
    }

    /// Encodes `batch` with the current segment's encoder and writes its message.
    fn encode(&mut self, batch: &RecordBatch) -> Result<(), SpillError> {
        let encoder = self
            .encoder
            .as_mut()
            .ok_or_else(|| SpillError::WriterFailed {
                path: self.path.clone(),
            })?;
        let buffers = encoder.encode(batch).map_err(|source| SpillError::Arrow {
            path: self.path.clone(),
            source,
        })?;
        let written = Written::of(&buffers);
        self.sink.write_message(&buffers)?;
        self.written.push(written);
        Ok(())
    }

    /// Counts a batch of `rows` rows written, here and in the manager's metrics.
    fn count(&mut self, rows: u64) {
        self.rows += rows;
        self.batches += 1;
        let manager = self.manager();
        manager.rows_written.fetch_add(rows, Ordering::Relaxed);
        manager.batches_written.fetch_add(1, Ordering::Relaxed);
    }

    /// `Some` if a batch of schema `found` may be written ([`takes`](Self::takes)),
    /// of whether it is the writer's own schema; the last `Arc` taken is remembered,
    /// so that its next batches are not compared again.
    fn accepts(&mut self, found: &SchemaRef) -> Option<bool> {
        if let Some((known, is_schema)) = &self.known {
            if Arc::ptr_eq(known, found) {
                return Some(*is_schema);
            }
        }
        let is_schema = Arc::ptr_eq(found, &self.schema) || **found == *self.schema;
        let taken = is_schema || self.takes(found);
        if taken {
            self.known = Some((Arc::clone(found), is_schema));
        }
        taken.then_some(is_schema)
    }

    /// Whether a batch of schema `found`, not the writer's schema, may be written:
    /// its wide file schema, or a segment schema of it (some `Int64` columns as
    /// `Int32`).
    fn takes(&self, found: &SchemaRef) -> bool {
        let same = |schema: &SchemaRef| Arc::ptr_eq(found, schema) || **found == **schema;
        if same(&self.file_schema) || same(&self.segment_schema) {
            return true;
        }
        let halved: Vec<usize> = self
            .halvable
            .iter()
            .copied()
            .filter(|&c| found.fields().get(c).map(|f| f.data_type()) == Some(&DataType::Int32))
            .collect();
        !halved.is_empty() && same(&crate::narrow::segment_schema(&self.file_schema, &halved))
    }

    /// Rows written so far.
    pub fn rows_written(&self) -> u64 {
        self.rows
    }

    /// Bytes written to the file so far, including the schema message and IPC
    /// framing.
    pub fn bytes_written(&self) -> u64 {
        self.sink.bytes()
    }

    /// Batches written so far.
    pub fn batches_written(&self) -> u64 {
        self.batches
    }

    /// Writes the end-of-stream marker (after the schema, if no batch was
    /// written), flushes and closes the file, and returns it as a read-only
    /// [`SpillFile`].
    ///
    /// # Errors
    ///
    /// [`SpillError::WriterFailed`] if an earlier write failed;
    /// [`SpillError::QuotaExceeded`] or [`SpillError::Io`] if the last bytes
    /// cannot be written; [`SpillError::Arrow`] if the schema cannot be
    /// encoded. In every error case the file is deleted (a group writer's bytes
    /// stay in its shared file until that is).
    pub fn finish(self) -> Result<SpillFile, SpillError> {
        self.check_usable()?;
        let Self {
            encoder,
            options,
            mut sink,
            schema,
            file_schema,
            path,
            rows,
            batches,
            mut written,
            segments,
            ..
        } = self;
        // A file without batches is its wide schema alone.
        let buffers = match encoder {
            Some(encoder) => encoder.finish(),
            None => StreamEncoder::try_new_with_options(&file_schema, options)
                .and_then(StreamEncoder::finish),
        }
        .map_err(|source| SpillError::Arrow { path, source })?;
        written.push(Written::of(&buffers));
        sink.write_message(&buffers)?;
        let storage = sink.into_storage()?;
        Ok(SpillFile::new(
            storage,
            schema,
            (rows, batches),
            (written.into(), segments.into()),
        ))
    }

    fn check_usable(&self) -> Result<(), SpillError> {
        if self.failed {
            return Err(SpillError::WriterFailed {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    fn manager(&self) -> &ManagerInner {
        self.sink.manager()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpillConfig, SpillManager};
    use arrow_array::Int32Array;
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;
    fn assert_send<T: Send>() {}

    #[test]
    fn writer_is_send() {
        assert_send::<SpillWriter>();
    }

    #[test]
    fn counters_and_metrics_add_up() {
        let m = SpillManager::new(SpillConfig::default()).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int32Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let mut w = m.create_writer(schema, "t").unwrap();
        assert_eq!(
            w.bytes_written(),
            0,
            "the schema goes out with the first batch"
        );
        w.write(&batch).unwrap();
        assert!(w.bytes_written() > 0);
        w.write(&batch.slice(0, 0)).unwrap();
        assert_eq!((w.rows_written(), w.batches_written()), (3, 2));
        let f = w.finish().unwrap();
        assert_eq!(f.bytes(), std::fs::metadata(f.path()).unwrap().len());
        assert_eq!((f.rows(), f.batches()), (3, 2));
        let metrics = m.metrics();
        assert_eq!(metrics.files_created, 1);
        assert_eq!(metrics.rows_written, 3);
        assert_eq!(metrics.batches_written, 2);
        assert_eq!(metrics.bytes_written, f.bytes());
        assert_eq!(m.disk_used_bytes(), f.bytes());
    }
}
