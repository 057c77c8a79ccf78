//! The one error type of this crate.

use std::path::PathBuf;

use arrow_schema::{ArrowError, SchemaRef};

/// Everything that can go wrong while creating, writing or reading spill files.
///
/// Every variant names the file (or directory) it is about. Messages are
/// lowercase and the underlying error, where there is one, is chained through
/// [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// The operating system failed a read, write, open or delete.
    #[error("i/o error on spill file {}: {source}", path.display())]
    Io {
        /// The spill file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A write would have taken the manager's files past its disk quota.
    ///
    /// Nothing of the refused message was written; the writer that hit the
    /// limit is unusable afterwards (see [`SpillError::WriterFailed`]) and
    /// should be dropped, which deletes its file and returns its bytes to the
    /// quota.
    #[error(
        "spill disk quota exceeded writing {}: quota {quota_bytes} bytes, \
         {used_bytes} bytes used, {requested_bytes} bytes requested",
        path.display()
    )]
    QuotaExceeded {
        /// The spill file being written.
        path: PathBuf,
        /// The manager's quota ([`crate::SpillConfig::disk_quota_bytes`]).
        quota_bytes: u64,
        /// Bytes held by all live files of the manager at the time of the write.
        used_bytes: u64,
        /// Size of the refused message: an encoded batch with its
        /// dictionaries, or the schema and end-of-stream marker at `finish`.
        requested_bytes: u64,
    },

    /// The file is truncated or garbled: it is not a complete Arrow IPC stream,
    /// or a message in it does not decode.
    #[error("corrupt spill file {} at batch {batch_index}: {source}", path.display())]
    Corrupt {
        /// The spill file.
        path: PathBuf,
        /// Zero-based index of the record batch being decoded (the number of
        /// batches successfully read before the corruption was found).
        batch_index: u64,
        /// The decoding error.
        #[source]
        source: ArrowError,
    },

    /// A batch written, or a file read, does not have the expected schema.
    #[error(
        "schema mismatch on spill file {}: expected {expected}, found {found}",
        path.display()
    )]
    SchemaMismatch {
        /// The spill file.
        path: PathBuf,
        /// The schema of the writer, or the schema the reader was asked for.
        expected: SchemaRef,
        /// The schema of the batch written, or of the file read.
        found: SchemaRef,
    },

    /// The private spill directory could not be created.
    #[error("cannot create spill directory under {}: {source}", root.display())]
    CreateDir {
        /// The directory the spill directory was to be created in.
        root: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// Arrow refused to encode a batch (for example a type the IPC format
    /// cannot carry) or to set up compression.
    #[error("arrow error on spill file {}: {source}", path.display())]
    Arrow {
        /// The spill file.
        path: PathBuf,
        /// Arrow's error.
        #[source]
        source: ArrowError,
    },

    /// An earlier write or finish on this writer failed, so the file may end
    /// in the middle of a message; the writer refuses further use.
    #[error("spill writer for {} failed earlier; the file is incomplete", path.display())]
    WriterFailed {
        /// The spill file.
        path: PathBuf,
    },
}

impl SpillError {
    /// The file or directory this error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            SpillError::Io { path, .. }
            | SpillError::QuotaExceeded { path, .. }
            | SpillError::Corrupt { path, .. }
            | SpillError::SchemaMismatch { path, .. }
            | SpillError::Arrow { path, .. }
            | SpillError::WriterFailed { path } => path,
            SpillError::CreateDir { root, .. } => root,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn messages_are_lowercase_and_chain_their_source() {
        let err = SpillError::Io {
            path: PathBuf::from("/tmp/x.arrows"),
            source: std::io::Error::other("disk on fire"),
        };
        assert_eq!(
            err.to_string(),
            "i/o error on spill file /tmp/x.arrows: disk on fire"
        );
        assert_eq!(
            err.source().map(|s| s.to_string()).as_deref(),
            Some("disk on fire")
        );
        assert_eq!(err.path(), std::path::Path::new("/tmp/x.arrows"));

        let err = SpillError::QuotaExceeded {
            path: PathBuf::from("f"),
            quota_bytes: 10,
            used_bytes: 8,
            requested_bytes: 4,
        };
        assert_eq!(
            err.to_string(),
            "spill disk quota exceeded writing f: quota 10 bytes, 8 bytes used, 4 bytes requested"
        );
        assert!(err.source().is_none());

        let err = SpillError::Corrupt {
            path: PathBuf::from("f"),
            batch_index: 3,
            source: ArrowError::IpcError("bad".into()),
        };
        assert!(err
            .to_string()
            .starts_with("corrupt spill file f at batch 3: "));
        assert!(err.source().is_some());
    }
}
