//! Writing a spilled partition's rows outside the collector's lock: the protocol by
//! which a full buffer is taken out under the lock, written after the lock is
//! released, and waited for by workers short of memory. Its own file so that the
//! protocol reads in one place (the probe's spill writes follow the same pattern).
//!
//! ```text
//!  worker, collector's lock held          worker, collector's lock released
//!  ─────────────────────────────          ─────────────────────────────────
//!  take_unwritten ─► Unwritten ─────────► write_unwritten: writer's lock only
//!   (bytes stay in the reservation,        └─ WriteEnded (on drop, panics too):
//!    counted in `Writes`)                     bytes shrunk, `Writes` counts one
//!                                             more ended, `written` notified
//!  short of memory, nothing to spill
//!  but writes under way ─► wait_for_a_write (until the next write ends, or the
//!                           join is cancelled; looks every WRITE_WAIT)
//! ```
//!
//! The interface, all on the collector and its state:
//! - [`CollectorState::take_unwritten`] (or [`PartitionBuffer::take_unwritten`] where
//!   the buffer is out of the collector) takes the rows out;
//! - [`BuildCollector::write_unwritten`] writes them, and [`BuildCollector::write_out`]
//!   does both for a partition under a given guard;
//! - [`Writes`] says whether writes are under way, and [`BuildCollector::wait_for_a_write`]
//!   waits for the next one to end;
//! - [`finish_shared`] closes a writer once no write holds it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;
use spilljoin_spill::{SpillFile, SpillWriter};

use super::collector::{BuildCollector, CollectorState, PartitionBuffer};
use crate::batches::lock;
use crate::error::{JoinError, Result};

/// How long a build worker waiting for a write to end sleeps before it looks again
/// whether the join was cancelled ([`BuildCollector::wait_for_a_write`]).
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A spilled partition's writer, shared between the collector and a worker writing
/// rows taken out of the partition's buffers. Lock order: the collector's state
/// first, then a writer; a worker holding a writer takes no other lock.
pub(super) type SharedWriter = Arc<Mutex<SpillWriter>>;

/// A spilled partition's buffered rows, taken out under the collector's lock to be
/// written without it ([`BuildCollector::write_unwritten`]). Their bytes stay in the
/// collector's reservation, counted in [`Writes`], until they are written: a worker
/// short of memory with nothing else to spill waits for them.
pub(super) struct Unwritten {
    pub(super) writer: SharedWriter,
    pub(super) gathered: Option<RecordBatch>,
    pub(super) fragments: Vec<(RecordBatch, Vec<u64>)>,
    pub(super) bytes: usize,
    /// The rows of a partition that has just spilled ([`Writes::mark_victim`]).
    victim: bool,
}

/// The writes under way of rows taken out of spilled partitions, kept in the
/// collector's state (`CollectorState::writes`).
#[derive(Debug, Default)]
pub(super) struct Writes {
    /// Bytes of rows taken out of spilled partitions and being written: still held in
    /// the collector's reservation, in no partition, and given back when written.
    unwritten_bytes: usize,
    /// How many such writes have ended (a worker waiting for memory waits for the
    /// next, not for all: others may keep taking rows out meanwhile).
    ended: u64,
    /// How many of them are of partitions that have just spilled: a worker short of
    /// memory waits for such a write to end before it spills one more partition,
    /// which might not have had to spill.
    victims: usize,
}

impl Writes {
    /// Whether rows taken out of some partition are being written (their memory
    /// comes back when that is done).
    pub(super) fn under_way(&self) -> bool {
        self.unwritten_bytes > 0
    }

    /// Whether the rows of a partition that has just spilled are being written.
    pub(super) fn victims_under_way(&self) -> bool {
        self.victims > 0
    }

    /// Marks `unwritten` as the rows of a partition that has just spilled, and counts
    /// it among the victims' writes until it ends.
    pub(super) fn mark_victim(&mut self, unwritten: Unwritten) -> Unwritten {
        self.victims += 1;
        Unwritten {
            victim: true,
            ..unwritten
        }
    }

    /// Counts the end of a write of `bytes` (`victim` if of a partition that had just
    /// spilled). Saturating: a panic here, while a panic unwinds, would abort.
    fn end(&mut self, bytes: usize, victim: bool) {
        self.unwritten_bytes = self.unwritten_bytes.saturating_sub(bytes);
        self.ended += 1;
        self.victims = self.victims.saturating_sub(usize::from(victim));
    }
}

/// The end of a write of rows taken out of a spilled partition
/// ([`BuildCollector::write_unwritten`]), when dropped: their memory goes back and the
/// workers waiting for a write to end are woken. (The writer's lock is released by
/// then, so the collector's may be taken.)
struct WriteEnded<'c, 'a> {
    collector: &'c BuildCollector<'a>,
    bytes: usize,
    victim: bool,
}

impl Drop for WriteEnded<'_, '_> {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.collector.state);
            // Saturating: a panic here, while a panic unwinds, would abort.
            let held = state.reservation.size();
            state.reservation.shrink(self.bytes.min(held));
            state.writes.end(self.bytes, self.victim);
        }
        self.collector.written.notify_all();
    }
}

/// Closes the file of a spilled partition whose buffers are all written: no worker
/// holds its writer any more.
pub(super) fn finish_shared(writer: SharedWriter) -> Result<SpillFile> {
    let writer = Arc::try_unwrap(writer)
        .map_err(|_| JoinError::Internal("a spill writer still in use".into()))?
        .into_inner()
        .map_err(|_| JoinError::Internal("a spill writer's lock was poisoned".into()))?;
    Ok(writer.finish()?)
}

impl PartitionBuffer {
    /// Takes a spilled partition's buffered rows out, to be written without the
    /// collector's lock; `None` when the partition is not spilled or holds nothing.
    ///
    /// The buffers that gather the next rows are allocated for as many rows as were
    /// taken, up to `batch_rows` (a partition is written when it holds that many):
    /// grown from nothing by doubling, they would copy what they hold once more in a
    /// dozen allocations for every batch written. (What `MutableBuffer::reallocate`
    /// still costs is the growth of partitions not yet spilled.)
    pub(super) fn take_unwritten(&mut self, batch_rows: usize) -> Result<Option<Unwritten>> {
        let Some(writer) = self.writer.as_ref() else {
            return Ok(None);
        };
        let mut cell = lock(&self.gathered);
        let gathered = match cell.as_mut() {
            Some(g) if !g.is_empty() => {
                g.expect_rows(g.len().min(g.rows_in_bytes_of(batch_rows)));
                Some(g.finish()?)
            }
            _ => None,
        };
        if gathered.is_none() && self.fragments.is_empty() {
            return Ok(None);
        }
        let unwritten = Unwritten {
            writer: Arc::clone(writer),
            gathered,
            fragments: std::mem::take(&mut self.fragments),
            bytes: self.bytes,
            victim: false,
        };
        self.bytes = 0;
        self.rows = 0;
        Ok(Some(unwritten))
    }
}

impl CollectorState {
    /// Takes spilled partition `p`'s buffered rows out, to be written without the
    /// collector's lock ([`BuildCollector::write_unwritten`]).
    pub(super) fn take_unwritten(
        &mut self,
        p: usize,
        batch_rows: usize,
    ) -> Result<Option<Unwritten>> {
        let unwritten = match self.partitions.get_mut(p) {
            Some(part) => part.take_unwritten(batch_rows)?,
            None => None,
        };
        if let Some(u) = &unwritten {
            self.writes.unwritten_bytes += u.bytes;
        }
        Ok(unwritten)
    }
}

impl BuildCollector<'_> {
    /// Takes spilled partition `p`'s buffered rows out under `guard` and writes them
    /// once it is released ([`write_unwritten`](Self::write_unwritten)).
    pub(super) fn write_out(
        &self,
        mut guard: MutexGuard<'_, CollectorState>,
        p: usize,
    ) -> Result<()> {
        let unwritten = guard.take_unwritten(p, self.plan().work_rows)?;
        drop(guard);
        unwritten.map_or(Ok(()), |u| self.write_unwritten(u))
    }

    /// Writes rows taken out of a spilled partition ([`PartitionBuffer::take_unwritten`])
    /// with only its writer locked, then gives their memory back.
    pub(super) fn write_unwritten(&self, unwritten: Unwritten) -> Result<()> {
        let Unwritten {
            writer,
            gathered,
            fragments,
            bytes,
            victim,
        } = unwritten;
        // Ends the write however `write_rows` returns, a panic included: workers
        // waiting for memory wait for this write to end.
        let _ended = WriteEnded {
            collector: self,
            bytes,
            victim,
        };
        self.write_rows(&writer, gathered, fragments, |_| {})
    }

    /// Counts rows taken out (`bytes` of them) that will not be written after all,
    /// as a write that ended, and wakes the waiting workers: no worker may wait for
    /// their write to end. (Their memory stays held: the join is failing.)
    pub(super) fn abandon_write(&self, writes: &mut Writes, bytes: usize) {
        writes.unwritten_bytes = writes.unwritten_bytes.saturating_sub(bytes);
        writes.ended += 1;
        self.written.notify_all();
    }

    /// Waits until the next write of rows taken out of a spilled partition ends (their
    /// memory is back), and says that something was freed. The wait gives up once the
    /// join is cancelled — another worker failed — and wakes every
    /// [`WRITE_WAIT`] to look: no worker waits for a write that will never end.
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] when the join was cancelled meanwhile.
    pub(super) fn wait_for_a_write(&self, guard: MutexGuard<'_, CollectorState>) -> Result<bool> {
        let seen = guard.writes.ended;
        let cancelled = || self.ctx.cancel.load(Ordering::Relaxed);
        let _written = self
            .written
            .wait_timeout_while(guard, WRITE_WAIT, |s| {
                s.writes.ended == seen && !cancelled()
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if cancelled() {
            return Err(JoinError::Cancelled);
        }
        Ok(true)
    }
}
