//! The spill manager: one private directory, one quota, many files.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_schema::SchemaRef;

use crate::config::SpillConfig;
use crate::error::SpillError;
use crate::file::FileGuard;
use crate::quota::DiskQuota;
use crate::writer::{CountingWriter, SpillWriter};

/// Longest part of a file name taken from a writer's label.
const LABEL_MAX_CHARS: usize = 48;

/// Cumulative counters of a [`SpillManager`] since it was created.
///
/// They only grow: deleting a file does not subtract from them (see
/// [`SpillManager::disk_used_bytes`] for what is on disk now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpillMetrics {
    /// Writers created (each creates one file).
    pub files_created: u64,
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
    /// Removed recursively when dropped.
    dir: tempfile::TempDir,
    config: SpillConfig,
    pub(crate) quota: DiskQuota,
    pub(crate) live_files: AtomicUsize,
    next_file_id: AtomicU64,
    pub(crate) files_created: AtomicU64,
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
    /// # Errors
    ///
    /// [`SpillError::CreateDir`] if the directory cannot be created, for
    /// example because the root does not exist or is not writable.
    pub fn new(config: SpillConfig) -> Result<Self, SpillError> {
        let root = config.root_dir.clone().unwrap_or_else(std::env::temp_dir);
        let create_dir_error = |source| SpillError::CreateDir {
            root: root.clone(),
            source,
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix("spilljoin-");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o700));
        }
        let dir = builder.tempdir_in(&root).map_err(create_dir_error)?;
        #[cfg(unix)]
        {
            // The mode given to mkdir is filtered by the umask; make sure.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
                .map_err(create_dir_error)?;
        }
        Ok(Self {
            inner: Arc::new(ManagerInner {
                dir,
                quota: DiskQuota::new(config.disk_quota_bytes),
                config,
                live_files: AtomicUsize::new(0),
                next_file_id: AtomicU64::new(0),
                files_created: AtomicU64::new(0),
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
        let id = self.inner.next_file_id.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir()
            .join(format!("{id:06}-{}.arrows", sanitize_label(label)));
        let file = create_file(&path).map_err(|source| SpillError::Io {
            path: path.clone(),
            source,
        })?;
        self.inner.files_created.fetch_add(1, Ordering::Relaxed);
        let guard = FileGuard::new(self.inner.clone(), path);
        let sink = CountingWriter::new(file, guard);
        SpillWriter::try_new(sink, schema, self.inner.config.compression)
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
            bytes_written: i.bytes_written.load(Ordering::Relaxed),
            rows_written: i.rows_written.load(Ordering::Relaxed),
            batches_written: i.batches_written.load(Ordering::Relaxed),
        }
    }

    /// Files not yet deleted: unfinished writers plus finished files with a
    /// live [`crate::SpillFile`] handle.
    pub fn live_files(&self) -> usize {
        self.inner.live_files.load(Ordering::Relaxed)
    }
}

fn create_file(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
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
