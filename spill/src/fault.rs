//! Fault injection for tests (feature `fault-injection`, off by default): a
//! [`FaultPlan`] given to a manager
//! ([`SpillConfig::with_faults`](crate::SpillConfig::with_faults)) makes chosen writes
//! and reads of its files fail the way a full disk, a file cut short or a garbled
//! file would, so that a test can reach every phase of a join that writes or reads
//! spill files and check what it does then.
//!
//! ```text
//!  SpillWriter::write / finish ─► one message ─► rules on writes of files whose
//!                                               name holds the rule's label:
//!                                   the nth  ─► NoSpace: half the bytes written,
//!                                               then ENOSPC
//!                                            ─► CorruptMessage: written with a
//!                                               garbled header
//!                                            ─► FlippedByte: one byte of its
//!                                               last quarter changed
//!  SpillReader::next ─► one message ─► rules on reads of files whose name holds
//!                                      the rule's label:
//!                                   the nth  ─► ShortRead: half its body read,
//!                                               then the file ends
//!                                            ─► ReadError: EIO
//! ```
//!
//! Each rule counts the operations of its own kind on the files it names, and fires
//! once, at its `nth`. File names are `<sequence>-<label>.arrows` with the writer's
//! or group's label (a join's are `build-d0`, `probe-d1`, `build-hot`, ...), so a
//! rule on `"probe-d1"` reaches the probe side's files of the levels at depth 1.
//! A plan belongs to the managers created with it (the test's own), so tests with
//! plans of their own run side by side. [`FaultPlan::fired`] tells a test whether
//! its fault was reached at all.
//!
//! Without the feature none of this exists: the writer and the reader do no more
//! than they would otherwise, not even a branch per message.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use arrow_schema::{DataType, Field, Schema};
//! use spilljoin_spill::{FaultPlan, SpillConfig, SpillError, SpillManager};
//!
//! let faults = FaultPlan::new().no_space_on_write("partition", 2);
//! let manager = SpillManager::new(SpillConfig::default().with_faults(faults.clone()))?;
//! let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
//! let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))])?;
//! let mut writer = manager.create_writer(schema, "partition-3")?;
//! writer.write(&batch)?;
//! let err = writer.write(&batch).unwrap_err();
//! assert!(matches!(
//!     err,
//!     SpillError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::StorageFull
//! ));
//! assert_eq!(faults.fired(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, IoSlice, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow_buffer::Buffer;

/// `ENOSPC`, "no space left on device", on Linux, macOS and the BSDs.
#[cfg(unix)]
const ENOSPC: i32 = 28;

/// `EIO`, "input/output error", on Linux, macOS and the BSDs.
#[cfg(unix)]
const EIO: i32 = 5;

/// What a rule of a [`FaultPlan`] does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A write of a message fails with `ENOSPC` (an `io::Error` of kind
    /// `StorageFull`, raw OS error 28 on Unix) after half of the message's bytes
    /// reached the file, as on a disk that fills up: the writer returns
    /// [`crate::SpillError::Io`]. Counts writes (one a batch, with the schema and
    /// dictionaries that go with it, and one at `finish`).
    NoSpace,
    /// A message is written with its header garbled (its metadata length made
    /// larger than any file), so that the reader of the file refuses it with
    /// [`crate::SpillError::Corrupt`] when it gets there (by its framing, before
    /// any checksum). Counts writes.
    CorruptMessage,
    /// A read of a message ends halfway through its body, as though the file ended
    /// there: the reader returns [`crate::SpillError::Corrupt`]. Counts the messages
    /// read after the schema message that opens a reader's file (the end-of-stream
    /// marker included), by every reader of the manager's files.
    ShortRead,
    /// A message is written with one byte of its last quarter (its body, for a
    /// batch) changed, as a disk or a page cache that garbles data would: a
    /// batch's lengths still frame, and the reader refuses it with
    /// [`crate::SpillError::Corrupt`] by its checksum (`checksum`). (In a small
    /// write whose last quarter is framing, such as the end-of-stream marker, the
    /// framing refuses it first, also as `Corrupt`.) Counts writes.
    FlippedByte,
    /// A read of a message fails with `EIO` (an `io::Error` with raw OS error 5 on
    /// Unix), as on a disk whose sector cannot be read: the reader returns
    /// [`crate::SpillError::Io`]. Counts reads as [`FaultKind::ShortRead`] does.
    ReadError,
}

impl FaultKind {
    /// Whether rules of this kind count writes (else reads).
    fn on_write(self) -> bool {
        matches!(
            self,
            FaultKind::NoSpace | FaultKind::CorruptMessage | FaultKind::FlippedByte
        )
    }
}

/// One fault: its kind, the files it counts operations on, when it fires.
#[derive(Debug)]
struct Rule {
    kind: FaultKind,
    /// Counts the files whose name contains this.
    label: String,
    /// Fires at this operation (1: the first).
    nth: u64,
    /// Operations counted so far.
    seen: u64,
}

impl Rule {
    /// Counts one operation on `path` (a write if `write`, else a read) if it is one
    /// of the rule's; whether the rule fires at it.
    fn count(&mut self, write: bool, path: &Path) -> bool {
        let name = path.file_name().map(|n| n.to_string_lossy());
        if self.kind.on_write() != write || !name.is_some_and(|n| n.contains(&self.label)) {
            return false;
        }
        self.seen += 1;
        self.seen == self.nth
    }
}

/// Faults to inject into the spill files of the managers created with it (feature
/// `fault-injection`; see the [module docs](self)).
///
/// Built with [`FaultPlan::no_space_on_write`], [`FaultPlan::corrupt_write`],
/// [`FaultPlan::flip_byte`], [`FaultPlan::short_read`] and
/// [`FaultPlan::read_error`] (or [`FaultPlan::with_rule`]); cheap to clone, and every clone is the same plan, so
/// that a test keeps one to ask [`FaultPlan::fired`] after handing one to
/// [`SpillConfig::with_faults`](crate::SpillConfig::with_faults). Two plans are
/// equal when they are the same plan.
#[derive(Clone, Default)]
pub struct FaultPlan {
    rules: Arc<Mutex<Vec<Rule>>>,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

impl PartialEq for FaultPlan {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rules, &other.rules)
    }
}

impl Eq for FaultPlan {}

impl FaultPlan {
    /// A plan without faults: the files are written and read as without one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fails the `nth` write (1: the first) of a message to a file whose name
    /// contains `label` with `ENOSPC` ([`FaultKind::NoSpace`]).
    ///
    /// # Panics
    ///
    /// If `nth` is 0.
    pub fn no_space_on_write(self, label: &str, nth: u64) -> Self {
        self.with_rule(FaultKind::NoSpace, label, nth)
    }

    /// Garbles the header of the `nth` message (1: the first) written to a file
    /// whose name contains `label` ([`FaultKind::CorruptMessage`]).
    ///
    /// # Panics
    ///
    /// If `nth` is 0.
    pub fn corrupt_write(self, label: &str, nth: u64) -> Self {
        self.with_rule(FaultKind::CorruptMessage, label, nth)
    }

    /// Changes a byte of the `nth` write (1: the first) to a file whose name contains
    /// `label` ([`FaultKind::FlippedByte`]).
    ///
    /// # Panics
    ///
    /// If `nth` is 0.
    pub fn flip_byte(self, label: &str, nth: u64) -> Self {
        self.with_rule(FaultKind::FlippedByte, label, nth)
    }

    /// Cuts short the `nth` read of a message (1: the first after each reader's
    /// schema message) of a file whose name contains `label`
    /// ([`FaultKind::ShortRead`]).
    ///
    /// # Panics
    ///
    /// If `nth` is 0.
    pub fn short_read(self, label: &str, nth: u64) -> Self {
        self.with_rule(FaultKind::ShortRead, label, nth)
    }

    /// Fails the `nth` read of a message (1: the first after each reader's schema
    /// message) of a file whose name contains `label` with `EIO`
    /// ([`FaultKind::ReadError`]).
    ///
    /// # Panics
    ///
    /// If `nth` is 0.
    pub fn read_error(self, label: &str, nth: u64) -> Self {
        self.with_rule(FaultKind::ReadError, label, nth)
    }

    /// Adds a rule.
    ///
    /// # Panics
    ///
    /// If `nth` is 0 (operations are counted from 1).
    pub fn with_rule(self, kind: FaultKind, label: &str, nth: u64) -> Self {
        assert!(nth > 0, "faults are counted from 1");
        self.lock().push(Rule {
            kind,
            label: label.to_owned(),
            nth,
            seen: 0,
        });
        self
    }

    /// The rules that have fired so far.
    pub fn fired(&self) -> usize {
        self.lock().iter().filter(|r| r.seen >= r.nth).count()
    }

    /// The operations each rule has counted so far, in the order the rules were
    /// added: how far a test got towards a fault that did not fire.
    pub fn seen(&self) -> Vec<u64> {
        self.lock().iter().map(|r| r.seen).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        crate::file::lock(&self.rules)
    }

    /// Counts one operation (`write` or a read) on `path` with every rule; the kind
    /// of the first rule that fires at it.
    fn count(&self, write: bool, path: &Path) -> Option<FaultKind> {
        let mut fired = None;
        for rule in self.lock().iter_mut() {
            if rule.count(write, path) {
                fired = fired.or(Some(rule.kind));
            }
        }
        fired
    }

    /// Writes one encoded message to `file` at `path` with `write_all`, unless a rule
    /// fails or garbles it.
    pub(crate) fn write_message(
        &self,
        path: &Path,
        file: &mut dyn Write,
        buffers: &[Buffer],
        write_all: fn(&mut dyn Write, &[Buffer]) -> io::Result<()>,
    ) -> io::Result<()> {
        match self.count(true, path) {
            None | Some(FaultKind::ShortRead | FaultKind::ReadError) => write_all(file, buffers),
            Some(FaultKind::NoSpace) => {
                let bytes: usize = buffers.iter().map(|b| b.len()).sum();
                let mut full = FillsUp {
                    inner: file,
                    left: bytes / 2,
                };
                write_all(&mut full, buffers)
            }
            Some(FaultKind::CorruptMessage) => file.write_all(&garbled(buffers)),
            Some(FaultKind::FlippedByte) => file.write_all(&flipped(buffers)),
        }
    }

    /// What happens to the next message read from `path`: `Some` of
    /// [`FaultKind::ShortRead`] or [`FaultKind::ReadError`] when a rule fires.
    pub(crate) fn read_fault(&self, path: &Path) -> Option<FaultKind> {
        self.count(false, path)
    }
}

/// The bytes of a message with its metadata length (the word after the
/// continuation marker) made `i32::MAX`, which the reader's framing refuses as
/// longer than the rest of the file.
fn garbled(buffers: &[Buffer]) -> Vec<u8> {
    let mut bytes: Vec<u8> = buffers.iter().flat_map(|b| b.as_slice()).copied().collect();
    assert!(
        bytes.len() >= 8 && bytes[..4] == [0xff; 4],
        "every message the writer encodes opens with the continuation marker"
    );
    bytes[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
    bytes
}

/// The bytes of a write with one byte of its last quarter changed.
fn flipped(buffers: &[Buffer]) -> Vec<u8> {
    let mut bytes: Vec<u8> = buffers.iter().flat_map(|b| b.as_slice()).copied().collect();
    let at = bytes.len() - bytes.len() / 4 - 1;
    bytes[at] ^= 0x5a;
    bytes
}

/// A disk that fills up: takes `left` more bytes, then fails every write with
/// `ENOSPC`.
struct FillsUp<'a> {
    inner: &'a mut dyn Write,
    left: usize,
}

impl Write for FillsUp<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(no_space());
        }
        // The slices up to `left` bytes, the last one cut.
        let mut taken = Vec::new();
        let mut room = self.left;
        for buf in bufs {
            if room == 0 {
                break;
            }
            let n = buf.len().min(room);
            taken.push(IoSlice::new(&buf[..n]));
            room -= n;
        }
        let written = self.inner.write_vectored(&taken)?;
        self.left -= written;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The error of a read of an unreadable sector.
pub(crate) fn read_error() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(EIO)
    }
    #[cfg(not(unix))]
    {
        io::Error::other("input/output error")
    }
}

/// The error of a write to a full disk.
fn no_space() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(ENOSPC)
    }
    #[cfg(not(unix))]
    {
        io::Error::from(io::ErrorKind::StorageFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_takes_half_the_bytes_then_fails_with_enospc() {
        let plan = FaultPlan::new().no_space_on_write("build", 2);
        let path = Path::new("/x/000001-build-d0.arrows");
        let buffers = [
            Buffer::from_vec(vec![1u8; 10]),
            Buffer::from_vec(vec![2u8; 6]),
        ];
        let mut file = Vec::new();
        let write_all: fn(&mut dyn Write, &[Buffer]) -> io::Result<()> =
            |w, b| b.iter().try_for_each(|b| w.write_all(b.as_slice()));
        plan.write_message(path, &mut file, &buffers, write_all)
            .unwrap();
        assert_eq!((file.len(), plan.fired()), (16, 0));
        let err = plan
            .write_message(path, &mut file, &buffers, write_all)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        #[cfg(unix)]
        assert_eq!(err.raw_os_error(), Some(ENOSPC));
        assert_eq!((file.len(), plan.fired()), (16 + 8, 1));
        // It fired once: the third write goes through.
        plan.write_message(path, &mut file, &buffers, write_all)
            .unwrap();
        assert_eq!(plan.seen(), vec![3]);
    }

    #[test]
    fn rules_count_their_own_files_and_operations() {
        let plan = FaultPlan::new()
            .short_read("probe-d1", 1)
            .corrupt_write("probe-d1", 1);
        let build = Path::new("/x/000001-build-d1.arrows");
        let probe = Path::new("/x/000002-probe-d1.arrows");
        assert_eq!(plan.read_fault(build), None);
        assert_eq!(plan.seen(), vec![0, 0]);
        assert_eq!(plan.read_fault(probe), Some(FaultKind::ShortRead));
        assert_eq!(plan.read_fault(probe), None, "a rule fires once");
        assert_eq!((plan.seen(), plan.fired()), (vec![2, 0], 1));
        let marker = Buffer::from_vec(vec![0xffu8, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let mut file = Vec::new();
        plan.write_message(probe, &mut file, &[marker], |_, _| unreachable!())
            .unwrap();
        assert_eq!(file[4..8], i32::MAX.to_le_bytes());
        assert_eq!(plan.fired(), 2);
    }

    #[test]
    #[should_panic(expected = "counted from 1")]
    fn the_zeroth_operation_is_refused() {
        let _ = FaultPlan::new().short_read("x", 0);
    }
}
