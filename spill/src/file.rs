//! A finished spill file, the guard that deletes a file when nobody needs it
//! any more, and the shared files that many spill files live in as segments.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_schema::SchemaRef;

use crate::checksum::Written;
use crate::direct::DirectTail;
use crate::error::SpillError;
use crate::manager::ManagerInner;
use crate::parts::Segment;
use crate::quota::QuotaDenied;
use crate::reader::{SpillReader, Trust};

/// Owns one file on disk: counts it as live, holds its quota bytes, and
/// deletes it when dropped.
///
/// A writer holds the guard while it writes; `finish` moves it into the
/// [`SpillFile`]. A shared file's guard is held by the file itself
/// ([`SharedFile`]), which its group, writers and spill files share. Dropping it anywhere — an unfinished writer, the last
/// `SpillFile` clone, an unwinding panic — deletes the file and gives its
/// bytes back to the quota. It also keeps the manager (and so the directory)
/// alive.
pub(crate) struct FileGuard {
    path: PathBuf,
    manager: Arc<ManagerInner>,
    /// Bytes reserved in the quota for this file: everything written so far.
    bytes: u64,
    /// Whether the file was opened with direct I/O (`crate::direct`).
    direct: bool,
}

impl FileGuard {
    /// Takes ownership of the file just created at `path` (with direct I/O, if
    /// `direct`).
    pub(crate) fn new(manager: Arc<ManagerInner>, path: PathBuf, direct: bool) -> Self {
        manager.live_files.fetch_add(1, Ordering::Relaxed);
        Self {
            path,
            manager,
            bytes: 0,
            direct,
        }
    }

    /// Whether the file is written and read with direct I/O.
    pub(crate) fn direct(&self) -> bool {
        self.direct
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

/// A run of bytes of a file: where one or more whole messages of a spill
/// file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// One file on disk that the spill files of a [`crate::SpillGroup`] slot are
/// appended to, message by message, each spill file keeping the list of its
/// [`Extent`]s. Deleted (and its bytes returned to the quota) when the last
/// writer and the last spill file in it are gone.
pub(crate) struct SharedFile {
    path: PathBuf,
    manager: Arc<ManagerInner>,
    direct: bool,
    state: Mutex<SharedState>,
}

pub(crate) struct SharedState {
    // Field order matters: the writes behind end, then the file is closed, before
    // the guard deletes it.
    /// The file's last partial block and writes in flight, when it is written with
    /// direct I/O.
    pub(crate) direct: Option<DirectTail>,
    pub(crate) file: Arc<File>,
    pub(crate) guard: FileGuard,
    /// Bytes in the file: where the next message goes.
    pub(crate) len: u64,
    /// Why a write failed partway: the end of the file is not known to be `len`
    /// any more, so nothing more is appended.
    /// (The kind of the failure's error and its message: the writes refused after it
    /// carry its kind, so that they too say "the disk is full".)
    pub(crate) failed: Option<(std::io::ErrorKind, String)>,
}

impl SharedFile {
    pub(crate) fn new(file: File, guard: FileGuard) -> Self {
        Self {
            path: guard.path().to_owned(),
            manager: Arc::clone(&guard.manager),
            direct: guard.direct,
            state: Mutex::new(SharedState {
                direct: guard.direct.then(DirectTail::default),
                file: Arc::new(file),
                guard,
                len: 0,
                failed: None,
            }),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's state for one append. A writer that panicked while holding the
    /// lock set `failed` first (see `SharedSink::write_message`), so the state of a
    /// poisoned lock is still consistent.
    pub(crate) fn lock(&self) -> MutexGuard<'_, SharedState> {
        lock(&self.state)
    }

    pub(crate) fn manager(&self) -> &ManagerInner {
        &self.manager
    }

    /// Whether the file is written and read with direct I/O.
    pub(crate) fn direct(&self) -> bool {
        self.direct
    }
}

/// `mutex`'s guard, also when a thread panicked while holding it: every lock of
/// this crate keeps its state consistent at every point a panic could leave it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A finished, read-only spill file: an Arrow IPC stream on disk, in a file of
/// its own or as segments of a shared file ([`crate::SpillGroup`]).
///
/// Cheap to clone (one `Arc`); all clones are the same file, which is deleted
/// when the last clone is dropped (a shared file: when the last spill file in
/// it, its last writer and its [`crate::SpillGroup`] are). It can be read any number of times, also from several threads at once,
/// each with its own [`SpillReader`].
#[derive(Clone)]
pub struct SpillFile {
    inner: Arc<FileInner>,
}

struct FileInner {
    storage: Storage,
    schema: SchemaRef,
    rows: u64,
    batches: u64,
    /// Each write of the file, hashed (`checksum`): what its readers check.
    written: Arc<[Written]>,
    /// Where each segment begins (`parts`).
    segments: Arc<[Segment]>,
}

/// Where a spill file's bytes are.
pub(crate) enum Storage {
    /// A file of its own, all of it.
    Whole(FileGuard),
    /// Segments of a shared file.
    Shared {
        file: Arc<SharedFile>,
        extents: Arc<[Extent]>,
        bytes: u64,
    },
}

impl Storage {
    fn path(&self) -> &Path {
        match self {
            Self::Whole(guard) => guard.path(),
            Self::Shared { file, .. } => file.path(),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Self::Whole(guard) => guard.bytes(),
            Self::Shared { bytes, .. } => *bytes,
        }
    }
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
    pub(crate) fn new(
        storage: Storage,
        schema: SchemaRef,
        (rows, batches): (u64, u64),
        (written, segments): (Arc<[Written]>, Arc<[Segment]>),
    ) -> Self {
        Self {
            inner: Arc::new(FileInner {
                storage,
                schema,
                rows,
                batches,
                written,
                segments,
            }),
        }
    }

    /// Each write of the file, hashed.
    pub(crate) fn written(&self) -> Arc<[Written]> {
        Arc::clone(&self.inner.written)
    }

    /// Where the file is: for a spill file of a [`crate::SpillGroup`], the shared
    /// file that holds it among others (so [`crate::read_spill_file`] on this path
    /// does not read it).
    pub fn path(&self) -> &Path {
        self.inner.storage.path()
    }

    /// The schema of every batch in the file.
    pub fn schema(&self) -> SchemaRef {
        self.inner.schema.clone()
    }

    /// Rows in the file.
    pub fn rows(&self) -> u64 {
        self.inner.rows
    }

    /// Size of the file in bytes (of its segments, in a shared file).
    pub fn bytes(&self) -> u64 {
        self.inner.storage.bytes()
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
        let (config, extents, direct) = self.read_setup();
        let reader = SpillReader::open(
            self.path(),
            extents,
            Some(self.schema()),
            config.read_mode,
            direct.then_some(config.direct_read_ahead),
            Trust::WrittenByUs(self.clone()),
        )?;
        #[cfg(feature = "fault-injection")]
        let reader = reader.with_faults(config.faults.clone());
        Ok(reader)
    }

    /// Opens up to `parts` readers over consecutive runs of the file's batches,
    /// which between them yield every batch once (the first reader the first
    /// batches), so that several threads read the file at once. A file of one
    /// batch, or with a dictionary column (whose dictionaries any batch may
    /// change), gets one reader. Each is a [`Self::reader`] in all else.
    ///
    /// # Errors
    ///
    /// As for [`Self::reader`].
    pub fn readers(&self, parts: usize) -> Result<Vec<SpillReader>, SpillError> {
        let (config, extents, direct) = self.read_setup();
        let whole = [Extent {
            offset: 0,
            len: self.bytes(),
        }];
        let extents = extents.as_deref().unwrap_or(&whole);
        let cut = match parts > 1 && crate::parts::splittable(&self.inner.schema) {
            true => crate::parts::cut(extents, &self.inner.written, &self.inner.segments, parts),
            false => None,
        };
        let Some(cut) = cut else {
            return Ok(vec![self.reader()?]);
        };
        cut.into_iter()
            .map(|part| {
                let direct = direct.then_some(config.direct_read_ahead);
                let reader = SpillReader::open_part(self, part, config.read_mode, direct)?;
                #[cfg(feature = "fault-injection")]
                let reader = reader.with_faults(config.faults.clone());
                Ok(reader)
            })
            .collect()
    }

    /// How the file is read: its manager's configuration, its extents (none: all
    /// of a file of its own) and whether it was written with direct I/O.
    fn read_setup(&self) -> (&crate::SpillConfig, Option<Arc<[Extent]>>, bool) {
        match &self.inner.storage {
            Storage::Whole(guard) => (guard.manager().config(), None, guard.direct()),
            Storage::Shared { file, extents, .. } => (
                file.manager().config(),
                Some(Arc::clone(extents)),
                file.direct(),
            ),
        }
    }
}
