//! Reading a spill file back: framing (see [`crate::message`]), then arrow's
//! decoder for each message, with the checks that make any byte sequence
//! safe to read.
//!
//! Defences against a garbled file, in the order they apply:
//!
//! 1. Framing checks every length against the bytes left in the file and
//!    verifies each message's flatbuffer before anything is decoded, so
//!    nothing is allocated for bytes that are not there.
//! 2. [`check_body`] checks that every buffer a message points to lies inside
//!    its body (arrow would panic slicing past the end) and, for files not
//!    written by this process, that compressed buffers do not declare more
//!    than [`UNTRUSTED_DECODED_BYTES_MAX`] decompressed bytes per message
//!    (arrow allocates the declared size before decompressing).
//! 3. Arrays of files not written by this process are fully validated by
//!    arrow while they are built (`ArrayData::validate_data` on every array
//!    and child: buffer sizes, offsets, UTF-8, dictionary keys). Our own files
//!    skip that ([`Trust::WrittenByUs`]): on string-heavy batches validation
//!    takes longer than the rest of an uncompressed read (`benches/spill_io.rs`,
//!    figures in BENCHMARKS.md).
//! 4. Last line of defence: arrow-ipc 59 still panics, instead of returning
//!    an error, on some malformed input that passes the checks above. The
//!    tests and the fuzzer found 28 distinct panic sites (one input for each
//!    is replayed from `tests/data/`):
//!    - `convert::fb_to_schema`: `unwrap()` on missing fields, children,
//!      type tables or dictionary index types, and `panic!`/`unimplemented!`
//!      on unknown type ids, integer bit widths, float precisions,
//!      date/time/timestamp/interval/duration units, list and map child counts,
//!      decimal precisions and widths, and union modes;
//!    - `RecordBatchDecoder`: indexing `buffers[0]` of a view column whose
//!      variadic buffer count is negative, and
//!      `assert!(variadic_counts.is_empty())` when a message declares more
//!      view-buffer counts than it has view columns;
//!    - arrow-buffer, reached while arrays are built and before validation
//!      could report the problem: `BooleanBuffer::new` (a null bitmap shorter
//!      than its array), `Buffer::slice_with_length` (a slice past the end
//!      of a decoded buffer) and `Buffer::typed_data` (a buffer whose length is not
//!      a multiple of its element width).
//!
//!    Each call into arrow's decoder therefore runs under `catch_unwind`
//!    ([`without_panics`]) and a panic becomes [`SpillError::Corrupt`]. The
//!    reader is finished after any error, so state a panic may have left half
//!    updated (the dictionary map) is never looked at again. The default
//!    panic hook still prints the panic message to stderr. This does not help
//!    a binary built with `panic = "abort"`.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::UnsafeFlag;
use arrow_ipc::reader::{read_dictionary_impl, RecordBatchDecoder};
use arrow_ipc::MessageHeader;
use arrow_schema::{ArrowError, SchemaRef};

use crate::config::SpillReadMode;
use crate::error::SpillError;
use crate::file::{Extent, SpillFile};
use crate::message::{FrameError, MessageSource, RawMessage};
use crate::parts::Part;

/// The most decompressed bytes one message of a file *not* written by this
/// process may declare. arrow allocates the declared size of each
/// compressed buffer up front, and zstd reaches ratios above 30 000:1, so
/// without a cap a few kilobytes of garbage could demand gigabytes. Spill
/// batches are a few thousand rows; 256 MiB per message is far above any
/// of them. Our own files are not capped: we wrote the sizes.
pub const UNTRUSTED_DECODED_BYTES_MAX: u64 = 256 << 20;

/// Prefix of every compressed IPC buffer: its decompressed length as i64 LE,
/// or -1 if the buffer was stored uncompressed.
const COMPRESSED_LENGTH_PREFIX_BYTES: usize = 8;

/// Whether the file was written by this process.
pub(crate) enum Trust {
    /// Written by our [`crate::SpillWriter`] into our private directory and
    /// read-only since: arrays are not validated again. Holds the file so it
    /// is not deleted while being read.
    WrittenByUs(SpillFile),
    /// Any other path: every array is fully validated.
    Foreign,
}

/// Streams the record batches of a spill file in the order they were written.
///
/// Yields `Ok(batch)` for each batch (zero-row batches included), then `None`
/// once the end-of-stream marker has been read. After an `Err` it yields
/// `None` forever. Every error is typed and names the file. For files opened
/// with [`read_spill_file`] no input makes it panic, loop, or allocate more
/// than the file's size plus [`UNTRUSTED_DECODED_BYTES_MAX`] per message.
///
/// # Trust
///
/// A reader from [`crate::SpillFile::reader`] does not validate the decoded
/// arrays again, since this process wrote them (see the module docs for the
/// measured cost). Framing, truncation and buffer bounds are still checked, and
/// every byte read is checked against the checksum of its write before any
/// batch of that write is decoded (the opening schema message, which makes no
/// arrays, is decoded first: a changed byte there is a schema mismatch or a
/// framing error). In [`SpillReadMode::Mmap`] the arrays point into the mapped
/// pages, which are read again later: a file changed behind the manager's back
/// after the check could still yield invalid arrays. Use [`read_spill_file`]
/// for anything else.
///
/// # Memory
///
/// All arrays of one batch share one allocation (buffered mode) or one
/// mapped range (mmap mode): the batch's message body, about the batch's
/// in-memory size (compressed files decode into fresh buffers instead).
/// `RecordBatch::get_array_memory_size` counts that shared body once per
/// buffer, so account for a read batch with `ArrayData::get_slice_memory_size`
/// or with the body size, not with `get_array_memory_size`.
pub struct SpillReader {
    path: PathBuf,
    /// The schema the batches carry: the expected one if given.
    schema: SchemaRef,
    /// The schema of the current segment as written in the file: `schema` with
    /// some columns narrower, or equal to it; only this one carries the dictionary
    /// ids the segment's dictionary messages use.
    file_schema: SchemaRef,
    source: MessageSource,
    dictionaries: HashMap<i64, ArrayRef>,
    /// Record batches returned so far: the `batch_index` of errors.
    batches_read: u64,
    trusted: bool,
    skip_validation: UnsafeFlag,
    finished: bool,
    /// The current segment stores some column narrower than `schema` (`narrow`).
    narrowed: bool,
    /// Messages read ahead to the end of their write, so that none is decoded before
    /// its write's checksum is checked (`None`: the end-of-stream marker).
    ahead: VecDeque<Option<RawMessage>>,
    /// Keeps our own file from being deleted while it is read.
    _file: Option<SpillFile>,
    /// Reads to cut short (tests).
    #[cfg(feature = "fault-injection")]
    faults: Option<crate::FaultPlan>,
}

impl std::fmt::Debug for SpillReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillReader")
            .field("path", &self.path)
            .field("batches_read", &self.batches_read)
            .field("trusted", &self.trusted)
            .field("finished", &self.finished)
            .finish()
    }
}

/// Opens any file holding an Arrow IPC stream (a spill file or not) for
/// reading, validating everything in it.
///
/// `expected_schema`, if given, must equal the schema in the file; the
/// batches then carry that very `SchemaRef`. Unlike
/// [`crate::SpillFile::reader`], this fully validates every decoded array,
/// since nothing is known about who wrote the file.
///
/// ```
/// # use std::sync::Arc;
/// use arrow_array::{Int64Array, RecordBatch};
/// use arrow_schema::{DataType, Field, Schema};
/// use spilljoin_spill::{read_spill_file, SpillConfig, SpillManager, SpillReadMode};
///
/// let manager = SpillManager::new(SpillConfig::default())?;
/// let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
/// let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))])?;
/// let mut writer = manager.create_writer(schema.clone(), "example")?;
/// writer.write(&batch)?;
/// let file = writer.finish()?;
///
/// let batches = read_spill_file(file.path(), Some(schema), SpillReadMode::Mmap)?
///     .collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(batches, vec![batch]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`SpillError::Io`] if the file cannot be opened, read or mapped,
/// [`SpillError::Corrupt`] if its schema message is missing or does not
/// decode, [`SpillError::SchemaMismatch`] if it differs from
/// `expected_schema`. Errors in later messages come from the iterator.
pub fn read_spill_file(
    path: &Path,
    expected_schema: Option<SchemaRef>,
    mode: SpillReadMode,
) -> Result<SpillReader, SpillError> {
    SpillReader::open(path, None, expected_schema, mode, None, Trust::Foreign)
}

impl SpillReader {
    /// Opens the file (or only its `extents`, in order; with direct I/O, reading
    /// `direct` runs ahead, if it was written so) and reads its schema message.
    pub(crate) fn open(
        path: &Path,
        extents: Option<Arc<[Extent]>>,
        expected_schema: Option<SchemaRef>,
        mode: SpillReadMode,
        direct: Option<usize>,
        trust: Trust,
    ) -> Result<Self, SpillError> {
        let written = match &trust {
            Trust::WrittenByUs(file) => Some(file.written()),
            Trust::Foreign => None,
        };
        let mut source = MessageSource::open(path, extents, mode, direct, (written, false))
            .map_err(|e| frame_error(path, 0, e))?;
        let schemas = read_schemas(&mut source, path)?;
        Self::over(path, source, schemas, expected_schema, trust)
    }

    /// Opens one part of our own `file` (`crate::parts`), read with `mode` (and
    /// `direct` as in [`Self::open`]).
    pub(crate) fn open_part(
        file: &SpillFile,
        part: Part,
        mode: SpillReadMode,
        direct: Option<usize>,
    ) -> Result<Self, SpillError> {
        let path = file.path();
        let mut source = MessageSource::open(
            path,
            Some(part.extents),
            mode,
            direct,
            (Some(part.written), part.open_ended),
        )
        .map_err(|e| frame_error(path, part.first_batch, e))?;
        let schemas = match part.segment {
            None => read_schemas(&mut source, path)?,
            Some(segment) => {
                let logical = crate::narrow::logical_schema(&segment).map_err(|source| {
                    SpillError::Corrupt {
                        path: path.to_owned(),
                        batch_index: part.first_batch,
                        source,
                    }
                })?;
                (segment, logical)
            }
        };
        let trust = Trust::WrittenByUs(file.clone());
        let mut reader = Self::over(path, source, schemas, Some(file.schema()), trust)?;
        reader.batches_read = part.first_batch;
        Ok(reader)
    }

    /// A reader of `source`, whose current segment is stored in `file_schema` and
    /// read back in `found`, checked against `expected_schema`.
    fn over(
        path: &Path,
        source: MessageSource,
        (file_schema, found): (SchemaRef, SchemaRef),
        expected_schema: Option<SchemaRef>,
        trust: Trust,
    ) -> Result<Self, SpillError> {
        let narrowed = !std::sync::Arc::ptr_eq(&found, &file_schema);
        let schema = match expected_schema {
            Some(expected) if *expected != *found => {
                return Err(SpillError::SchemaMismatch {
                    path: path.to_owned(),
                    expected,
                    found,
                })
            }
            Some(expected) => expected,
            None => found,
        };
        let (trusted, file) = match trust {
            Trust::WrittenByUs(file) => (true, Some(file)),
            Trust::Foreign => (false, None),
        };
        Ok(Self {
            path: path.to_owned(),
            schema,
            file_schema,
            source,
            dictionaries: HashMap::new(),
            batches_read: 0,
            trusted,
            skip_validation: skip_validation(trusted),
            finished: false,
            narrowed,
            ahead: VecDeque::new(),
            _file: file,
            #[cfg(feature = "fault-injection")]
            faults: None,
        })
    }

    /// This reader, cutting short the reads `faults` says (tests).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn with_faults(mut self, faults: Option<crate::FaultPlan>) -> Self {
        self.faults = faults;
        self
    }

    /// The next message of the file, its write read to the end first: a write (one
    /// or more whole messages) is checked against its checksum once its last byte is
    /// read (`checksum`), and no message of it is decoded before that (but for the
    /// opening schema message, which `read_schemas` decodes first; it makes no
    /// arrays).
    fn next_message(&mut self) -> Result<Option<RawMessage>, FrameError> {
        if let Some(message) = self.ahead.pop_front() {
            return Ok(message);
        }
        let next = self.read_message()?;
        while next.is_some() && self.source.inside_write() {
            let more = self.read_message()?;
            let end = more.is_none();
            self.ahead.push_back(more);
            if end {
                break;
            }
        }
        Ok(next)
    }

    /// The next message as framed (cut short, or failed, if the fault plan says so:
    /// tests).
    fn read_message(&mut self) -> Result<Option<RawMessage>, FrameError> {
        #[cfg(feature = "fault-injection")]
        if let Some(faults) = &self.faults {
            match faults.read_fault(&self.path) {
                Some(crate::FaultKind::ShortRead) => {
                    return self.source.next_message_cut_short();
                }
                Some(crate::FaultKind::ReadError) => {
                    return Err(FrameError::Io(crate::fault::read_error()));
                }
                _ => {}
            }
        }
        self.source.next_message()
    }

    /// The schema of every batch this reader yields.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Decodes messages until the next record batch or the end of the stream.
    fn read_next(&mut self) -> Result<Option<RecordBatch>, SpillError> {
        loop {
            let message = match self.next_message() {
                Ok(Some(message)) => message,
                Ok(None) => return Ok(None),
                Err(e) => return Err(frame_error(&self.path, self.batches_read, e)),
            };
            let decoded = self
                .decode(&message)
                .map_err(|source| SpillError::Corrupt {
                    path: self.path.clone(),
                    batch_index: self.batches_read,
                    source,
                })?;
            if let Some(batch) = decoded {
                return Ok(Some(batch));
            }
        }
    }

    /// Decodes one message: a record batch, or `None` after storing a
    /// dictionary or starting a segment.
    fn decode(&mut self, raw: &RawMessage) -> Result<Option<RecordBatch>, ArrowError> {
        let message = raw.metadata.as_ref();
        match message.header_type() {
            MessageHeader::RecordBatch => self.decode_batch(raw).map(Some),
            MessageHeader::DictionaryBatch => {
                self.store_dictionary(raw)?;
                Ok(None)
            }
            MessageHeader::Schema => {
                self.begin_segment(raw)?;
                Ok(None)
            }
            other => Err(ipc_error(&format!(
                "unexpected {other:?} message after the schema"
            ))),
        }
    }

    /// Decodes a record batch message, as a batch of the reader's schema.
    fn decode_batch(&self, raw: &RawMessage) -> Result<RecordBatch, ArrowError> {
        let message = raw.metadata.as_ref();
        let version = message.version();
        let body = &raw.body;
        let batch = message
            .header_as_record_batch()
            .ok_or_else(|| ipc_error("record batch message without a header"))?;
        check_body(batch, body, self.trusted)?;
        let decoder = RecordBatchDecoder::try_new(
            body,
            batch,
            self.file_schema.clone(),
            &self.dictionaries,
            &version,
        )?
        .with_require_alignment(false)
        .with_skip_validation(self.skip_validation.clone());
        let batch = without_panics("record batch", || decoder.read_record_batch())?;
        if self.narrowed {
            crate::narrow::widen(&batch, &self.schema)
        } else if std::sync::Arc::ptr_eq(&self.schema, &self.file_schema) {
            Ok(batch)
        } else {
            // Equal schemas (checked at open): only the `Arc` changes.
            batch.with_schema(self.schema.clone())
        }
    }

    /// Decodes a dictionary message into the dictionaries later batches use.
    fn store_dictionary(&mut self, raw: &RawMessage) -> Result<(), ArrowError> {
        let message = raw.metadata.as_ref();
        let version = message.version();
        let body = &raw.body;
        let dictionary = message
            .header_as_dictionary_batch()
            .ok_or_else(|| ipc_error("dictionary message without a header"))?;
        let data = dictionary
            .data()
            .ok_or_else(|| ipc_error("dictionary message without data"))?;
        check_body(data, body, self.trusted)?;
        let (schema, dictionaries) = (&*self.file_schema, &mut self.dictionaries);
        let skip_validation = self.skip_validation.clone();
        without_panics("dictionary batch", || {
            read_dictionary_impl(
                body,
                dictionary,
                schema,
                dictionaries,
                &version,
                false,
                skip_validation,
            )
        })
    }

    /// Starts a new segment (see `narrow`) at a later schema message: the same
    /// logical schema, columns stored wider, dictionaries sent afresh.
    fn begin_segment(&mut self, raw: &RawMessage) -> Result<(), ArrowError> {
        let file_schema = decode_schema(raw)?;
        let logical = crate::narrow::logical_schema(&file_schema)?;
        if *logical != *self.schema {
            return Err(ipc_error(&format!(
                "a later segment's schema {logical:?} differs from the file's {:?}",
                self.schema
            )));
        }
        self.narrowed = !std::sync::Arc::ptr_eq(&logical, &file_schema);
        self.file_schema = file_schema;
        self.dictionaries.clear();
        Ok(())
    }
}

/// Reads the schema message that opens the stream of `source`: the schema as
/// written, and the logical one it reads back in (narrowed decimals as decimals,
/// see `narrow`; the same `Arc` when nothing narrows).
///
/// # Errors
/// [`SpillError::Corrupt`] if the message is missing or does not decode,
/// [`SpillError::Io`] if it cannot be read.
fn read_schemas(
    source: &mut MessageSource,
    path: &Path,
) -> Result<(SchemaRef, SchemaRef), SpillError> {
    let corrupt = |source: ArrowError| SpillError::Corrupt {
        path: path.to_owned(),
        batch_index: 0,
        source,
    };
    let message = match source.next_message() {
        Ok(Some(message)) => message,
        Ok(None) => {
            return Err(corrupt(ArrowError::IpcError(
                "no schema message".to_owned(),
            )))
        }
        Err(e) => return Err(frame_error(path, 0, e)),
    };
    let file_schema = decode_schema(&message).map_err(corrupt)?;
    let logical = crate::narrow::logical_schema(&file_schema).map_err(corrupt)?;
    Ok((file_schema, logical))
}

/// The decoder's flag to skip validating arrays: set for a `trusted` file only.
fn skip_validation(trusted: bool) -> UnsafeFlag {
    let mut skip_validation = UnsafeFlag::new();
    if trusted {
        // SAFETY: a trusted file was encoded by arrow's IPC writer from
        // valid arrays (every `RecordBatch` is), in this process, into a
        // file created with `create_new` in our 0o700 directory, whose
        // bytes nothing rewrites after `finish` (a shared file only grows
        // past a finished stream's extents); decoding those bytes yields the
        // same valid arrays. DataFusion skips validation of its own spill
        // files on the same argument. Truncation and buffer bounds are
        // still checked, and every byte of a trusted file is checked against
        // the checksum of its write before any batch of that write is decoded
        // (`checksum`, `next_message`): bytes garbled on disk or in the page
        // cache before the read are an error, not invalid arrays. (Mapped
        // arrays read their pages again later; only a file altered behind our
        // back after the check, by someone with our uid, could then produce
        // invalid arrays.)
        unsafe { skip_validation.set(true) };
    }
    skip_validation
}

impl Iterator for SpillReader {
    type Item = Result<RecordBatch, SpillError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        match self.read_next() {
            Ok(Some(batch)) => {
                self.batches_read += 1;
                Some(Ok(batch))
            }
            Ok(None) => {
                self.finished = true;
                None
            }
            Err(e) => {
                self.finished = true;
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for SpillReader {}

/// Decodes the schema message that opens every stream.
fn decode_schema(raw: &RawMessage) -> Result<SchemaRef, ArrowError> {
    let message = raw.metadata.as_ref();
    if message.header_type() != MessageHeader::Schema {
        return Err(ipc_error(&format!(
            "expected a schema message first, found {:?}",
            message.header_type()
        )));
    }
    let schema = message
        .header_as_schema()
        .ok_or_else(|| ipc_error("schema message without a header"))?;
    let schema = without_panics("schema", || Ok(arrow_ipc::convert::fb_to_schema(schema)))?;
    Ok(std::sync::Arc::new(schema))
}

/// Checks that every buffer of `batch` lies inside `body` and, for foreign
/// files, that the decompressed sizes it declares stay under
/// [`UNTRUSTED_DECODED_BYTES_MAX`].
fn check_body(
    batch: arrow_ipc::RecordBatch<'_>,
    body: &Buffer,
    trusted: bool,
) -> Result<(), ArrowError> {
    let Some(buffers) = batch.buffers() else {
        return Ok(()); // arrow reports the missing buffers itself
    };
    let compressed = batch.compression().is_some();
    let mut decoded_bytes: u64 = 0;
    for (i, buffer) in buffers.iter().enumerate() {
        let (offset, length) = (buffer.offset(), buffer.length());
        let range = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(length).ok())
            .and_then(|(offset, length)| Some(offset..offset.checked_add(length)?))
            .filter(|range| range.end <= body.len())
            .ok_or_else(|| {
                ipc_error(&format!(
                    "buffer {i} (offset {offset}, length {length}) lies outside \
                     the message body of {} bytes",
                    body.len()
                ))
            })?;
        if compressed && !trusted && range.len() >= COMPRESSED_LENGTH_PREFIX_BYTES {
            let mut prefix = [0; COMPRESSED_LENGTH_PREFIX_BYTES];
            prefix
                .copy_from_slice(&body[range.start..range.start + COMPRESSED_LENGTH_PREFIX_BYTES]);
            // -1 means "stored uncompressed": its size is the range itself.
            let declared = u64::try_from(i64::from_le_bytes(prefix)).unwrap_or(0);
            decoded_bytes = decoded_bytes.saturating_add(declared);
            if decoded_bytes > UNTRUSTED_DECODED_BYTES_MAX {
                return Err(ipc_error(&format!(
                    "compressed buffers declare more than {UNTRUSTED_DECODED_BYTES_MAX} \
                     decompressed bytes in one message"
                )));
            }
        }
    }
    Ok(())
}

/// Runs one call into arrow's decoder, turning a panic into an error.
///
/// The module documentation lists the panics of arrow-ipc 59 this catches
/// and why catching them is sound here.
fn without_panics<T>(
    what: &str,
    decode: impl FnOnce() -> Result<T, ArrowError>,
) -> Result<T, ArrowError> {
    match catch_unwind(AssertUnwindSafe(decode)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(ipc_error(&format!(
                "arrow's decoder panicked on this {what}: {detail}"
            )))
        }
    }
}

fn ipc_error(message: &str) -> ArrowError {
    ArrowError::IpcError(message.to_owned())
}

fn frame_error(path: &Path, batch_index: u64, error: FrameError) -> SpillError {
    match error {
        FrameError::Io(source) => SpillError::Io {
            path: path.to_owned(),
            source,
        },
        FrameError::Corrupt(message) => SpillError::Corrupt {
            path: path.to_owned(),
            batch_index,
            source: ArrowError::IpcError(message),
        },
    }
}
