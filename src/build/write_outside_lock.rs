//! Writing a spilled partition's rows outside the collector's lock: the build's
//! side of the protocol in [`crate::write_out`] (the probe follows the same one). A
//! full buffer is taken out under the lock, written after the lock is released, and
//! waited for by workers short of memory.
//!
//! ```text
//!  worker, collector's lock held          worker, collector's lock released
//!  ─────────────────────────────          ─────────────────────────────────
//!  take_unwritten ─► Unwritten ─────────► write_unwritten: writer's lock only
//!   (bytes stay in the reservation,        └─ WriteEnded (on drop, panics too):
//!    counted in `Writes`; a WriteOut         bytes shrunk and `Writes` told,
//!    started)                                 then the WriteOut ends: waiters wake
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
//! - [`Writes`] says whether writes are under way (and how many bytes, and whether
//!   of victims: the build's victim choice needs that), and
//!   [`BuildCollector::wait_for_a_write`] waits for the next one to end
//!   ([`WritesOut::wait_since`]);
//! - [`finish_shared`] closes a writer once no write holds it.

use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;
use spilljoin_spill::{SpillFile, SpillWriter};

use super::collector::{BuildCollector, CollectorState, PartitionBuffer};
use crate::batches::lock;
use crate::error::{JoinError, Result};
use crate::write_out::{WriteOut, WritesOut};

/// A spilled partition's writer, shared between the collector and a worker writing
/// rows taken out of the partition's buffers. Lock order: the collector's state
/// first, then a writer; a worker holding a writer takes no other lock.
pub(super) type SharedWriter = Arc<Mutex<SpillWriter>>;

/// A spilled partition's buffered rows, taken out under the collector's lock to be
/// written without it ([`BuildCollector::write_unwritten`]). Their bytes stay in the
/// collector's reservation, counted in [`Writes`], until they are written: a worker
/// short of memory with nothing else to spill waits for them.
pub(super) struct Unwritten<'w> {
    pub(super) writer: SharedWriter,
    pub(super) gathered: Option<RecordBatch>,
    pub(super) fragments: Vec<(RecordBatch, Vec<u64>)>,
    pub(super) bytes: usize,
    /// The rows of a partition that has just spilled ([`Writes::mark_victim`]).
    victim: bool,
    /// The write, counted out until it ends; none for rows taken out of a buffer
    /// that is no longer the collector's (at the end of the build), which no worker
    /// waits for.
    out: Option<WriteOut<'w>>,
}

/// The writes under way of rows taken out of spilled partitions, kept in the
/// collector's state (`CollectorState::writes`).
#[derive(Debug, Default)]
pub(super) struct Writes {
    /// Bytes of rows taken out of spilled partitions and being written: still held in
    /// the collector's reservation, in no partition, and given back when written.
    unwritten_bytes: usize,
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
    pub(super) fn mark_victim<'w>(&mut self, unwritten: Unwritten<'w>) -> Unwritten<'w> {
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
        self.victims = self.victims.saturating_sub(usize::from(victim));
    }
}

/// The end of a write of rows taken out of a spilled partition
/// ([`BuildCollector::write_unwritten`]), when dropped: their memory goes back, and
/// then (its field dropped after `drop`) the write ends, which wakes the workers
/// waiting for it. (The writer's lock is released by then, so the collector's may
/// be taken.)
struct WriteEnded<'c, 'a> {
    collector: &'c BuildCollector<'a>,
    bytes: usize,
    victim: bool,
    _out: Option<WriteOut<'c>>,
}

impl Drop for WriteEnded<'_, '_> {
    fn drop(&mut self) {
        let mut state = lock(&self.collector.state);
        // Saturating: a panic here, while a panic unwinds, would abort.
        let held = state.reservation.size();
        state.reservation.shrink(self.bytes.min(held));
        state.writes.end(self.bytes, self.victim);
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
    pub(super) fn take_unwritten(
        &mut self,
        batch_rows: usize,
    ) -> Result<Option<Unwritten<'static>>> {
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
            out: None,
        };
        self.bytes = 0;
        self.rows = 0;
        Ok(Some(unwritten))
    }
}

impl CollectorState {
    /// Takes spilled partition `p`'s buffered rows out, to be written without the
    /// collector's lock ([`BuildCollector::write_unwritten`]), and counts their write
    /// as out in `writes_out` from now (the lock is held) until it ends.
    pub(super) fn take_unwritten<'w>(
        &mut self,
        p: usize,
        batch_rows: usize,
        writes_out: &'w WritesOut,
    ) -> Result<Option<Unwritten<'w>>> {
        let Some(u) = self
            .partitions
            .get_mut(p)
            .map(|part| part.take_unwritten(batch_rows))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        self.writes.unwritten_bytes += u.bytes;
        Ok(Some(Unwritten {
            writer: u.writer,
            gathered: u.gathered,
            fragments: u.fragments,
            bytes: u.bytes,
            victim: u.victim,
            out: Some(writes_out.start()),
        }))
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
        let unwritten = guard.take_unwritten(p, self.plan().work_rows, &self.writes_out)?;
        drop(guard);
        unwritten.map_or(Ok(()), |u| self.write_unwritten(u))
    }

    /// Writes rows taken out of a spilled partition ([`PartitionBuffer::take_unwritten`])
    /// with only its writer locked, then gives their memory back.
    pub(super) fn write_unwritten<'c>(&'c self, unwritten: Unwritten<'c>) -> Result<()> {
        let Unwritten {
            writer,
            gathered,
            fragments,
            bytes,
            victim,
            out,
        } = unwritten;
        // Ends the write however `write_rows` returns, a panic included: workers
        // waiting for memory wait for this write to end.
        let _ended = WriteEnded {
            collector: self,
            bytes,
            victim,
            _out: out,
        };
        self.write_rows(&writer, gathered, fragments, |_| {})
    }

    /// Gives up on writing rows taken out: their bytes are no longer counted as
    /// being written, and dropping `unwritten` ends its write, which wakes the
    /// waiting workers: no worker may wait for it. (Their memory stays held: the
    /// join is failing.)
    pub(super) fn abandon_write(&self, writes: &mut Writes, unwritten: Unwritten<'_>) {
        writes.unwritten_bytes = writes.unwritten_bytes.saturating_sub(unwritten.bytes);
    }

    /// Waits until the next write of rows taken out of a spilled partition ends (their
    /// memory is back), and says that something was freed. The wait gives up once the
    /// join is cancelled — another worker failed — and wakes every
    /// [`WRITE_WAIT`](crate::write_out::WRITE_WAIT) to look: no worker waits for a write that will never end.
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] when the join was cancelled meanwhile.
    pub(super) fn wait_for_a_write(&self, guard: MutexGuard<'_, CollectorState>) -> Result<bool> {
        // The mark is taken under the collector's lock, which every write's end
        // takes before it counts as ended: a write the guard saw under way cannot
        // end unseen.
        let mark = self.writes_out.mark();
        drop(guard);
        self.writes_out.wait_since(mark, self.ctx.cancel)?;
        Ok(true)
    }
}
