//! The spill manager: one private directory, one quota, many files.
//!
//! Creating a manager also removes the stale spill directories beside its own,
//! those of joins killed outright ([`crate::owner`] says how a directory's owner is
//! told apart from a live one); [`SpillManager::stale_dirs_removed`] says what went.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;

use crate::config::SpillConfig;
use crate::error::SpillError;
use crate::file::{lock, FileGuard, SharedFile};
use crate::owner::{remove_stale_dirs_except, OwnedDir, StaleDirCleanup, StaleDirFailure};
use crate::quota::DiskQuota;
use crate::writer::{CountingWriter, SharedSink, Sink, SpillWriter};

/// Longest part of a file name taken from a writer's label.
const LABEL_MAX_CHARS: usize = 48;

/// Cumulative counters of a [`SpillManager`] since it was created.
///
/// They only grow: deleting a file does not subtract from them (see
/// [`SpillManager::disk_used_bytes`] for what is on disk now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpillMetrics {
    /// Files created: one per [`SpillManager::create_writer`], one per shared
    /// file of a [`SpillGroup`].
    pub files_created: u64,
    /// Of those, the files written with direct I/O ([`crate::SpillConfig::direct_io`]:
    /// fewer when the file system refused it).
    pub direct_files_created: u64,
    /// Bytes written to spill files, IPC framing included.
    pub bytes_written: u64,
    /// Rows written.
    pub rows_written: u64,
    /// Record batches written.
    pub batches_written: u64,
}

/// Creates spill files in a private temporary directory and keeps the books:
/// disk quota, live files, cumulative metrics.
///
/// Cloning is cheap (one `Arc`) and every clone is the same manager. The
/// directory lives until the last clone *and* the last [`crate::SpillFile`]
/// of the manager are dropped; then it is removed with everything in it.
#[derive(Clone)]
pub struct SpillManager {
    inner: Arc<ManagerInner>,
}

/// The state shared by a manager's clones, writers and files.
pub(crate) struct ManagerInner {
    /// Removed, with everything in it, when dropped; its lock file held until then.
    dir: OwnedDir,
    /// The stale directories removed when the manager was created.
    stale: StaleDirCleanup,
    config: SpillConfig,
    pub(crate) quota: DiskQuota,
    pub(crate) live_files: AtomicUsize,
    next_file_id: AtomicU64,
    pub(crate) files_created: AtomicU64,
    direct_files_created: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) rows_written: AtomicU64,
    pub(crate) batches_written: AtomicU64,
}

impl ManagerInner {
    pub(crate) fn config(&self) -> &SpillConfig {
        &self.config
    }
}

impl std::fmt::Debug for SpillManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillManager")
            .field("dir", &self.dir())
            .field("config", &self.inner.config)
            .field("disk_used_bytes", &self.disk_used_bytes())
            .field("live_files", &self.live_files())
            .finish()
    }
}

impl SpillManager {
    /// Creates the manager and its private directory, named `spilljoin-XXXXXX`,
    /// inside [`SpillConfig::root_dir`] (or [`std::env::temp_dir`]). On Unix
    /// the directory is readable and writable by the owner only (`0o700`).
    ///
    /// The directory holds a lock file, locked for the manager's lifetime
    /// ([`crate::OWNER_FILE_NAME`]), that proves to other processes that its owner
    /// is alive. Then the stale `spilljoin-XXXXXX` directories in the same root
    /// (those of processes killed outright) are removed, as by
    /// [`crate::remove_stale_dirs`]: what went, and what could not, is in
    /// [`SpillManager::stale_dirs_removed`]; it is never an error.
    ///
    /// # Errors
    ///
    /// [`SpillError::CreateDir`] if the directory or its lock file cannot be
    /// created, for example because the root does not exist or is not writable.
    pub fn new(config: SpillConfig) -> Result<Self, SpillError> {
        let root = config.root_dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = OwnedDir::create(&root).map_err(|source| SpillError::CreateDir {
            root: root.clone(),
            source,
        })?;
        let stale = remove_stale_dirs_except(&root, Some(dir.path())).unwrap_or_else(|error| {
            StaleDirCleanup {
                removed: Vec::new(),
                failures: vec![StaleDirFailure {
                    path: root.clone(),
                    error: Arc::new(error),
                }],
            }
        });
        Ok(Self {
            inner: Arc::new(ManagerInner {
                dir,
                stale,
                quota: DiskQuota::new(config.disk_quota_bytes),
                config,
                live_files: AtomicUsize::new(0),
                next_file_id: AtomicU64::new(0),
                files_created: AtomicU64::new(0),
                direct_files_created: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                rows_written: AtomicU64::new(0),
                batches_written: AtomicU64::new(0),
            }),
        })
    }

    /// The private spill directory.
    pub fn dir(&self) -> &Path {
        self.inner.dir.path()
    }

    /// The stale spill directories (of processes killed outright) that creating
    /// this manager removed from its root, with their bytes, and those it could
    /// not remove. Every clone reports the same.
    pub fn stale_dirs_removed(&self) -> &StaleDirCleanup {
        &self.inner.stale
    }

    /// The configuration the manager was created with.
    pub fn config(&self) -> &SpillConfig {
        &self.inner.config
    }

    /// Creates a new spill file for batches of `schema` and returns its writer.
    ///
    /// `label` only goes into the file name (sanitised to `[A-Za-z0-9_-]`,
    /// at most 48 characters), to tell files apart when debugging; names stay
    /// unique whatever the label. The file is created empty; the schema
    /// message is written with the first batch, or by `finish`.
    ///
    /// # Errors
    ///
    /// [`SpillError::Io`] if the file cannot be created,
    /// [`SpillError::Arrow`] if the IPC format cannot carry the schema.
    pub fn create_writer(&self, schema: SchemaRef, label: &str) -> Result<SpillWriter, SpillError> {
        let (file, guard) = self.create_file(label)?;
        let sink = Sink::Own(CountingWriter::new(file, guard));
        SpillWriter::try_new(sink, schema, self.inner.config.compression)
    }

    /// A group of at most `files` shared files (at least one) that spill files are
    /// written into as segments, instead of each into a file of its own
    /// ([`SpillGroup`]). No file is created until a writer needs it.
    pub fn create_group(&self, label: &str, files: usize) -> SpillGroup {
        SpillGroup {
            manager: self.clone(),
            label: label.to_owned(),
            slots: (0..files.max(1)).map(|_| Mutex::new(None)).collect(),
            created: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Creates a new, empty file named after `label`, and its guard.
    fn create_file(&self, label: &str) -> Result<(File, FileGuard), SpillError> {
        let id = self.inner.next_file_id.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir()
            .join(format!("{id:06}-{}.arrows", sanitize_label(label)));
        let direct = self.inner.config.direct_io;
        // Injected faults act on buffered writes (`writer::write_out`).
        #[cfg(feature = "fault-injection")]
        let direct = direct && self.inner.config.faults.is_none();
        let (file, direct) = create_file(&path, direct).map_err(|source| SpillError::Io {
            path: path.clone(),
            source,
        })?;
        self.inner.files_created.fetch_add(1, Ordering::Relaxed);
        if direct {
            self.inner
                .direct_files_created
                .fetch_add(1, Ordering::Relaxed);
        }
        let guard = FileGuard::new(self.inner.clone(), path, direct);
        Ok((file, guard))
    }

    /// Bytes held by the manager's live files (finished or still being
    /// written): the figure the quota is checked against.
    pub fn disk_used_bytes(&self) -> u64 {
        self.inner.quota.used_bytes()
    }

    /// Cumulative counters since the manager was created.
    pub fn metrics(&self) -> SpillMetrics {
        let i = &self.inner;
        SpillMetrics {
            files_created: i.files_created.load(Ordering::Relaxed),
            direct_files_created: i.direct_files_created.load(Ordering::Relaxed),
            bytes_written: i.bytes_written.load(Ordering::Relaxed),
            rows_written: i.rows_written.load(Ordering::Relaxed),
            batches_written: i.batches_written.load(Ordering::Relaxed),
        }
    }

    /// Files not yet deleted: those of unfinished writers and of finished files
    /// with a live [`crate::SpillFile`] handle, and the shared files of
    /// [`SpillGroup`]s that a group, a writer or a spill file still holds.
    pub fn live_files(&self) -> usize {
        self.inner.live_files.load(Ordering::Relaxed)
    }
}

/// Spill files written as segments of a few shared files, rather than each into a
/// file of its own.
///
/// A join that spills many partitions at once (hundreds under a small limit, on
/// each side) would otherwise create and delete as many files per level. On ext4
/// without a journal, each creation scans past every inode deleted in the last
/// minutes (`recently_deleted` in the kernel's inode allocator), so a run of
/// joins got slower with every run before it, until creating its files took
/// much of a join's CPU time.
///
/// A writer of the group ([`SpillGroup::create_writer`]) appends each message to
/// the end of the shared file of its slot (the slot number modulo the group's
/// files), under that file's lock, and its [`SpillFile`](crate::SpillFile) keeps
/// the list of where its messages are (its *extents*); it reads back like any
/// other, over its extents only. Writers of different files write at the same
/// time; writers of one file take turns, one message at a time.
///
/// A write that fails partway leaves the end of its shared file unknown: every
/// later write to that file fails too, naming the first failure.
///
/// A shared file is deleted, and its bytes returned to the quota, when the last
/// writer and the last spill file in it are dropped (and the group, which keeps
/// it for new writers). Until then it keeps the bytes of spill files already
/// dropped: a shared file's disk space is given back all at once.
///
/// Cheap to clone; every clone is the same group.
#[derive(Clone)]
pub struct SpillGroup {
    manager: SpillManager,
    label: String,
    slots: Arc<[Mutex<Option<Arc<SharedFile>>>]>,
    /// Shared files created so far.
    created: Arc<AtomicUsize>,
}

impl std::fmt::Debug for SpillGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillGroup")
            .field("label", &self.label)
            .field("slots", &self.slots.len())
            .field("files_created", &self.files_created())
            .finish()
    }
}

impl SpillGroup {
    /// A writer for batches of `schema` that appends to the shared file of slot
    /// `slot` (modulo the group's files), which is created if it does not exist
    /// yet. Spill files of any schemas may share a file.
    ///
    /// # Errors
    ///
    /// [`SpillError::Io`] if the shared file cannot be created,
    /// [`SpillError::Arrow`] if the IPC format cannot carry the schema.
    pub fn create_writer(&self, schema: SchemaRef, slot: usize) -> Result<SpillWriter, SpillError> {
        let file = self.shared_file(slot)?;
        let sink = Sink::Shared(SharedSink::new(file));
        SpillWriter::try_new(sink, schema, self.manager.inner.config.compression)
    }

    /// The shared files this group has created so far.
    pub fn files_created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// The paths of the group's shared files so far.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.slots
            .iter()
            .filter_map(|slot| lock(slot).as_ref().map(|f| f.path().to_owned()))
            .collect()
    }

    fn shared_file(&self, slot: usize) -> Result<Arc<SharedFile>, SpillError> {
        // (A group has at least one slot.)
        let mut held = lock(&self.slots[slot % self.slots.len()]);
        if let Some(file) = held.as_ref() {
            return Ok(Arc::clone(file));
        }
        let (file, guard) = self.manager.create_file(&self.label)?;
        let file = Arc::new(SharedFile::new(file, guard));
        *held = Some(Arc::clone(&file));
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(file)
    }
}

/// Creates the file at `path` (with direct I/O if `direct` asks for it and the file
/// system takes it): the file, and whether it is direct.
fn create_file(path: &Path, direct: bool) -> std::io::Result<(File, bool)> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    crate::direct::create(&mut options, path, direct)
}

fn sanitize_label(label: &str) -> String {
    let label: String = label
        .chars()
        .take(LABEL_MAX_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if label.is_empty() {
        "spill".to_owned()
    } else {
        label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_sanitised() {
        assert_eq!(sanitize_label("build p3/r1"), "build_p3_r1");
        assert_eq!(sanitize_label(""), "spill");
        assert_eq!(sanitize_label("../../etc"), "______etc");
        assert_eq!(sanitize_label(&"x".repeat(100)).len(), LABEL_MAX_CHARS);
    }

    #[test]
    fn file_names_carry_id_and_label() {
        let m = SpillManager::new(SpillConfig::default()).unwrap();
        let schema = Arc::new(arrow_schema::Schema::empty());
        let w = m.create_writer(schema, "probe p7").unwrap();
        assert_eq!(
            w.path().file_name().unwrap().to_str(),
            Some("000000-probe_p7.arrows")
        );
        assert_eq!(w.path().parent(), Some(m.dir()));
    }
}
