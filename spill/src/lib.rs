//! Spill files for spilljoin: Arrow IPC streams in a private temporary
//! directory, under a disk quota, deleted as soon as nobody needs them.
//!
//! When the join runs out of memory it writes partitions out here and reads
//! them back later. This crate owns everything about those files: where they
//! live, what is in them, how much disk they may take, and that they are gone
//! when the join is — finished, failed, dropped or unwound by a panic.
//!
//! # Lifecycle
//!
//! ```text
//! SpillManager::new(config)          creates  $root/spilljoin-XXXXXX/  (0o700)
//!   │                                  with owner.lock (locked while it lives),
//!   │                                  and removes stale spilljoin-XXXXXX/ beside it
//!   │
//!   ├─ create_writer(schema, label) ─► SpillWriter        000042-<label>.arrows
//!   │                                    │  write(&batch)*   (quota checked on
//!   │                                    │                    every write)
//!   │                                    │  drop ──────────► file deleted
//!   │                                    ▼
//!   │                                  finish()  ──► SpillFile  (read-only, Clone)
//!   │                                                   │
//!   │                                                   ├─ reader() ─► SpillReader
//!   │                                                   │               Iterator<Item =
//!   │                                                   │               Result<RecordBatch>>
//!   │                                                   └─ last clone dropped
//!   │                                                        (readers hold one) ─► file deleted
//!   ▼
//! last SpillManager clone and last SpillFile dropped ─► directory removed
//! ```
//!
//! # Files
//!
//! A spill file is an Arrow IPC *stream* (schema message, then one
//! dictionary message per dictionary column and batch and one record batch
//! message per batch, then the end-of-stream marker), optionally with
//! per-buffer LZ4 or Zstd compression ([`SpillCompression`]). Columns are
//! written as narrow as their values allow ([`file_schema`], [`segment_schema`]:
//! decimals as integers, integers in 32 bits where they fit, view columns as
//! offsets, marked in the fields' metadata): when a batch needs a column wider than the file has
//! held it so far, a new schema message opens a new *segment* of the stream.
//! Any Arrow implementation reads the first segment of a file of its own
//! (`pyarrow.ipc.open_stream`, for instance), which helps when debugging (the
//! streams of a shared file interleave); files are named
//! `<sequence>-<label>.arrows`.
//!
//! Reading is strict where arrow's stream reader is lenient: every length is
//! checked against the bytes that exist before anything is allocated, and a
//! file must end with the end-of-stream marker and nothing after it, so a
//! truncated file is an error ([`SpillError::Corrupt`]) instead of fewer
//! batches. A [`SpillFile`] keeps a checksum (xxh3) of each of its writes, and its
//! readers check every byte they take against them before decoding: a byte
//! changed on disk is [`SpillError::Corrupt`] too, not another value. A file without
//! dictionary columns can be read by several threads at once
//! ([`SpillFile::readers`]), each a run of its batches. See
//! [`SpillReader`] for the defences against garbled files, and [`SpillReadMode`]
//! for the two ways of getting the bytes.
//!
//! # Deletion
//!
//! A file is deleted when its last owner goes: the unfinished
//! [`SpillWriter`], or the last clone of its [`SpillFile`] (each open
//! [`SpillReader`] holds one); a shared file when its [`SpillGroup`], its last
//! writer and its last spill file are gone. Every file also holds the manager's shared
//! state, so the directory outlives every file in it and is removed,
//! recursively, when the last [`SpillManager`] clone and the last file are
//! gone. All of this happens in `Drop`, so it also happens while a panic
//! unwinds. A process killed outright runs no code and leaves its directory
//! behind; the directory's lock file ([`OWNER_FILE_NAME`], locked while its owner
//! lives) lets the next manager in the same root tell it from a live join's and
//! remove it ([`SpillManager::stale_dirs_removed`], [`remove_stale_dirs`]; the
//! `owner` module's documentation has the protocol and its races).
//!
//! # Shared files
//!
//! A [`SpillGroup`] ([`SpillManager::create_group`]) writes many spill files
//! into a few shared files instead: each message goes to the end of its slot's
//! file, and the [`SpillFile`] keeps the list of where its messages are (its
//! *extents*). It reads back like a file of its own (the same framing and
//! checks, over its extents only; no message may cross from one extent into
//! the next). A shared file is deleted when its group, its last writer and
//! its last spill file are gone, and keeps the bytes of the spill files dropped
//! before then: its space comes back all at once. A join spilling hundreds of
//! partitions at a time creates a few files instead of hundreds.
//!
//! # Disk quota
//!
//! [`SpillConfig::disk_quota_bytes`] bounds the bytes held by all live files
//! of one manager together. Each encoded message (a batch with its
//! dictionaries, or the end-of-stream marker) reserves its bytes before any
//! of it reaches the file, so the quota is never overshot; a refused message
//! writes nothing, fails with [`SpillError::QuotaExceeded`] carrying the
//! numbers, and leaves that writer unusable. Deleting a file returns its
//! bytes. [`SpillManager::disk_used_bytes`]
//! is the figure the quota is checked against, [`SpillManager::metrics`] the
//! cumulative totals.
//!
//! # Fault injection
//!
//! With the cargo feature `fault-injection` (off by default; the engine's own tests
//! turn it on), a [`SpillConfig`] can carry a `FaultPlan`: the nth write of a
//! message to the manager's files of some label fails with `ENOSPC` or is written
//! garbled, or the nth read is cut short, so that tests reach each phase of a join
//! that spills with a full disk or a damaged file (see the `fault` module). Without
//! the feature the hook does not exist.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use spilljoin_spill::{SpillCompression, SpillConfig, SpillError, SpillManager};
//!
//! let manager = SpillManager::new(
//!     SpillConfig::default()
//!         .with_compression(SpillCompression::Lz4)
//!         .with_disk_quota_bytes(1 << 30),
//! )?;
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("key", DataType::Int64, false),
//!     Field::new("name", DataType::Utf8, true),
//! ]));
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Int64Array::from(vec![1, 2, 3])),
//!         Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
//!     ],
//! )?;
//!
//! let mut writer = manager.create_writer(schema, "build-partition-3")?;
//! writer.write(&batch)?;
//! writer.write(&batch.slice(1, 2))?;
//! let file = writer.finish()?;
//! assert_eq!((file.rows(), file.batches()), (5, 2));
//! assert_eq!(manager.disk_used_bytes(), file.bytes());
//!
//! let read: Vec<RecordBatch> = file.reader()?.collect::<Result<_, SpillError>>()?;
//! assert_eq!(read, vec![batch.clone(), batch.slice(1, 2)]);
//!
//! drop(file);
//! assert_eq!(manager.live_files(), 0);
//! assert_eq!(manager.disk_used_bytes(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod checksum;
mod config;
mod direct;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod file;
mod manager;
mod message;
mod narrow;
mod owner;
mod parts;
mod quota;
mod reader;
mod views;
mod writer;

pub use config::{ParseSpillOptionError, SpillCompression, SpillConfig, SpillReadMode};
pub use direct::{
    direct_io_bytes_per_thread, DEFAULT_DIRECT_READ_AHEAD, DEFAULT_DIRECT_WRITES_BEHIND,
    DIRECT_IO_BYTES_PER_THREAD, MAX_DIRECT_READ_AHEAD, MAX_DIRECT_WRITES_BEHIND,
};
pub use error::SpillError;
#[cfg(feature = "fault-injection")]
pub use fault::{FaultKind, FaultPlan};
pub use file::SpillFile;
pub use manager::{SpillGroup, SpillManager, SpillMetrics};
pub use narrow::{file_schema, fits_i32, segment_schema, widen_column, NARROWED_KEY};
pub use owner::{
    find_stale_dirs, remove_stale_dirs, OwnerRecord, StaleDir, StaleDirCleanup, StaleDirFailure,
    OWNER_FILE_NAME,
};
pub use reader::{read_spill_file, SpillReader, UNTRUSTED_DECODED_BYTES_MAX};
pub use views::VIEW_KEY;
pub use writer::SpillWriter;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn thread_safety_of_public_types() {
        assert_send_sync::<SpillManager>();
        assert_send_sync::<SpillFile>();
        assert_send::<SpillWriter>();
        assert_send::<SpillReader>();
        assert_send_sync::<SpillError>();
    }
}
