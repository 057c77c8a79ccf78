//! A finished spill file, and the guard that deletes a file when nobody
//! needs it any more.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_schema::SchemaRef;

use crate::error::SpillError;
use crate::manager::ManagerInner;
use crate::quota::QuotaDenied;
use crate::reader::{SpillReader, Trust};

/// Owns one file on disk: counts it as live, holds its quota bytes, and
/// deletes it when dropped.
///
/// A writer holds the guard while it writes; `finish` moves it into the
/// [`SpillFile`]. Dropping it anywhere — an unfinished writer, the last
/// `SpillFile` clone, an unwinding panic — deletes the file and gives its
/// bytes back to the quota. It also keeps the manager (and so the directory)
/// alive.
pub(crate) struct FileGuard {
    path: PathBuf,
    manager: Arc<ManagerInner>,
    /// Bytes reserved in the quota for this file: everything written so far.
    bytes: u64,
}

impl FileGuard {
    /// Takes ownership of the file just created at `path`.
    pub(crate) fn new(manager: Arc<ManagerInner>, path: PathBuf) -> Self {
        manager.live_files.fetch_add(1, Ordering::Relaxed);
        Self {
            path,
            manager,
            bytes: 0,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn manager(&self) -> &ManagerInner {
        &self.manager
    }

    /// Reserves quota for `bytes` more bytes of this file.
    pub(crate) fn reserve(&mut self, bytes: u64) -> Result<(), QuotaDenied> {
        self.manager.quota.try_reserve(bytes)?;
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for FileGuard {
    fn drop(&mut self) {
        // Nothing to do about a failure here: the directory removal at the end
        // of the manager's life is the second chance.
        let _ = std::fs::remove_file(&self.path);
        self.manager.quota.release(self.bytes);
        self.manager.live_files.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A finished, read-only spill file: an Arrow IPC stream on disk.
///
/// Cheap to clone (one `Arc`); all clones are the same file, which is deleted
/// when the last clone is dropped. It can be read any number of times, also
/// from several threads at once, each with its own [`SpillReader`].
#[derive(Clone)]
pub struct SpillFile {
    inner: Arc<FileInner>,
}

struct FileInner {
    guard: FileGuard,
    schema: SchemaRef,
    rows: u64,
    batches: u64,
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillFile")
            .field("path", &self.path())
            .field("rows", &self.rows())
            .field("batches", &self.batches())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl SpillFile {
    pub(crate) fn new(guard: FileGuard, schema: SchemaRef, rows: u64, batches: u64) -> Self {
        Self {
            inner: Arc::new(FileInner {
                guard,
                schema,
                rows,
                batches,
            }),
        }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        self.inner.guard.path()
    }

    /// The schema of every batch in the file.
    pub fn schema(&self) -> SchemaRef {
        self.inner.schema.clone()
    }

    /// Rows in the file.
    pub fn rows(&self) -> u64 {
        self.inner.rows
    }

    /// Size of the file in bytes.
    pub fn bytes(&self) -> u64 {
        self.inner.guard.bytes()
    }

    /// Record batches in the file (empty batches included).
    pub fn batches(&self) -> u64 {
        self.inner.batches
    }

    /// Opens a reader that yields the batches in the order they were written,
    /// using the manager's [`crate::SpillConfig::read_mode`]. The reader keeps
    /// the file alive while it exists.
    ///
    /// The file was written by this process, so its arrays are not validated
    /// again after decoding (the IPC framing and buffer bounds still are).
    ///
    /// # Errors
    ///
    /// [`SpillError::Io`] if the file cannot be opened or mapped,
    /// [`SpillError::Corrupt`] if its schema message does not decode,
    /// [`SpillError::SchemaMismatch`] if it holds another schema than the one
    /// it was written with (something rewrote the file).
    pub fn reader(&self) -> Result<SpillReader, SpillError> {
        let mode = self.inner.guard.manager().config().read_mode;
        SpillReader::open(
            self.path(),
            Some(self.schema()),
            mode,
            Trust::WrittenByUs(self.clone()),
        )
    }
}
