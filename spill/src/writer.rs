//! Writing a spill file: an Arrow IPC stream through a quota-checking counter.
//!
//! ```text
//! StreamWriter ──► CountingWriter ──► BufWriter (1 MiB) ──► File
//!  (encodes)       (reserves quota     (coalesces the
//!                   before each write)  small writes)
//! ```

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use arrow_array::RecordBatch;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{ArrowError, SchemaRef};

use crate::config::SpillCompression;
use crate::error::SpillError;
use crate::file::{FileGuard, SpillFile};
use crate::quota::QuotaDenied;

impl std::fmt::Display for QuotaDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spill disk quota of {} bytes exceeded ({} used, {} requested)",
            self.quota_bytes, self.used_bytes, self.requested_bytes
        )
    }
}

/// Carried inside the `io::Error` a refused write returns, so that the
/// numbers survive the trip through arrow's `ArrowError::IoError`.
impl std::error::Error for QuotaDenied {}

/// Counts the bytes going to the file and reserves quota for them first.
pub(crate) struct CountingWriter {
    // Field order matters: the file is closed before the guard deletes it.
    inner: BufWriter<File>,
    guard: FileGuard,
}

impl CountingWriter {
    pub(crate) fn new(inner: BufWriter<File>, guard: FileGuard) -> Self {
        Self { inner, guard }
    }

    /// Flushes and closes the file, handing back the guard that owns it.
    fn into_guard(self) -> Result<FileGuard, SpillError> {
        let Self { inner, guard } = self;
        match inner.into_inner() {
            Ok(file) => {
                drop(file);
                Ok(guard)
            }
            Err(e) => Err(SpillError::Io {
                path: guard.path().to_owned(),
                source: e.into_error(),
            }),
        }
    }
}

impl Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let requested = buf.len() as u64;
        self.guard.reserve(requested).map_err(io::Error::other)?;
        match self.inner.write(buf) {
            Ok(written) => {
                self.guard.unreserve(requested - written as u64);
                Ok(written)
            }
            Err(e) => {
                self.guard.unreserve(requested);
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes record batches into a new spill file.
///
/// Created by [`crate::SpillManager::create_writer`]; [`SpillWriter::finish`]
/// consumes it and returns the [`SpillFile`]. Dropping a writer without
/// finishing it deletes the file and returns its bytes to the quota.
///
/// After any failed [`write`](SpillWriter::write) except a schema mismatch
/// (which writes nothing), the file may end inside a message, so every
/// further call returns [`SpillError::WriterFailed`].
pub struct SpillWriter {
    ipc: StreamWriter<CountingWriter>,
    schema: SchemaRef,
    path: PathBuf,
    rows: u64,
    batches: u64,
    failed: bool,
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
    /// Writes the schema message and returns the writer.
    pub(crate) fn try_new(
        sink: CountingWriter,
        schema: SchemaRef,
        compression: SpillCompression,
    ) -> Result<Self, SpillError> {
        let path = sink.guard.path().to_owned();
        debug_assert_eq!(sink.guard.bytes(), 0);
        let options = IpcWriteOptions::default()
            .try_with_compression(compression.ipc_compression())
            .map_err(|source| SpillError::Arrow {
                path: path.clone(),
                source,
            })?;
        let ipc = StreamWriter::try_new_with_options(sink, &schema, options)
            .map_err(|e| map_write_error(&path, e))?;
        let writer = Self {
            ipc,
            schema,
            path,
            rows: 0,
            batches: 0,
            failed: false,
        };
        writer.add_bytes_metric(writer.bytes_written());
        Ok(writer)
    }

    /// Where the file is being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema every batch must have.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Appends one batch. Empty batches are written too (as zero-row
    /// messages) and read back.
    ///
    /// # Errors
    ///
    /// [`SpillError::SchemaMismatch`] if the batch's schema is not equal to
    /// the writer's (field names, types, nullability and metadata all count);
    /// nothing is written and the writer stays usable.
    /// [`SpillError::QuotaExceeded`], [`SpillError::Io`] or
    /// [`SpillError::Arrow`] if encoding or writing failed; the writer is
    /// unusable afterwards ([`SpillError::WriterFailed`]).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), SpillError> {
        if self.failed {
            return Err(SpillError::WriterFailed {
                path: self.path.clone(),
            });
        }
        let found = batch.schema_ref();
        if !std::sync::Arc::ptr_eq(found, &self.schema) && **found != *self.schema {
            return Err(SpillError::SchemaMismatch {
                path: self.path.clone(),
                expected: self.schema.clone(),
                found: found.clone(),
            });
        }
        let bytes_before = self.bytes_written();
        let result = self.ipc.write(batch);
        self.add_bytes_metric(self.bytes_written() - bytes_before);
        if let Err(e) = result {
            self.failed = true;
            return Err(map_write_error(&self.path, e));
        }
        let rows = batch.num_rows() as u64;
        self.rows += rows;
        self.batches += 1;
        let manager = self.ipc.get_ref().guard.manager();
        manager.rows_written.fetch_add(rows, Ordering::Relaxed);
        manager.batches_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Rows written so far.
    pub fn rows_written(&self) -> u64 {
        self.rows
    }

    /// Bytes written to the file so far (handed to the file's buffer),
    /// including the schema message and IPC framing.
    pub fn bytes_written(&self) -> u64 {
        self.ipc.get_ref().guard.bytes()
    }

    /// Batches written so far.
    pub fn batches_written(&self) -> u64 {
        self.batches
    }

    /// Writes the end-of-stream marker, flushes and closes the file, and
    /// returns it as a read-only [`SpillFile`].
    ///
    /// # Errors
    ///
    /// [`SpillError::WriterFailed`] if an earlier write failed;
    /// [`SpillError::QuotaExceeded`] or [`SpillError::Io`] if the last bytes
    /// cannot be written. In every error case the file is deleted.
    pub fn finish(mut self) -> Result<SpillFile, SpillError> {
        if self.failed {
            return Err(SpillError::WriterFailed { path: self.path });
        }
        let bytes_before = self.bytes_written();
        let result = self.ipc.finish();
        self.add_bytes_metric(self.bytes_written() - bytes_before);
        result.map_err(|e| map_write_error(&self.path, e))?;
        let sink = self
            .ipc
            .into_inner()
            .map_err(|e| map_write_error(&self.path, e))?;
        let guard = sink.into_guard()?;
        Ok(SpillFile::new(guard, self.schema, self.rows, self.batches))
    }

    fn add_bytes_metric(&self, bytes: u64) {
        let manager = self.ipc.get_ref().guard.manager();
        manager.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Turns an error of the IPC writer into ours, recovering a quota refusal
/// and the operating system's error from inside `ArrowError::IoError`.
fn map_write_error(path: &Path, error: ArrowError) -> SpillError {
    match error {
        ArrowError::IoError(_, source) => {
            if let Some(denied) = source
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<QuotaDenied>())
            {
                return SpillError::QuotaExceeded {
                    path: path.to_owned(),
                    quota_bytes: denied.quota_bytes,
                    used_bytes: denied.used_bytes,
                    requested_bytes: denied.requested_bytes,
                };
            }
            SpillError::Io {
                path: path.to_owned(),
                source,
            }
        }
        source => SpillError::Arrow {
            path: path.to_owned(),
            source,
        },
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
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(vec![1, 2, 3]))])
                .unwrap();
        let mut w = m.create_writer(schema, "t").unwrap();
        let schema_bytes = w.bytes_written();
        assert!(schema_bytes > 0);
        w.write(&batch).unwrap();
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
