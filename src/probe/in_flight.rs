//! Writing outside the lock, the probe's side of [`crate::write_out`]: a full buffer
//! is taken out of its partition under the partition's lock (a [`Full`] buffer),
//! written once the lock is released, and counted as out
//! ([`WritesOut`](crate::write_out::WritesOut)) until it is written and its memory
//! is freed. A worker short of memory with nothing of its own left to write waits
//! for such a buffer to come back rather than call the limit too small.
//!
//! ```text
//!  worker A: lock ─ take the buffer: Full, start() ─ unlock ─ write ─ drop: freed, ended
//!  worker B:     reservation fails, nothing to write ─ wait() ────────────► Ended: try again
//! ```

use arrow_array::RecordBatch;
use spilljoin_memory::MemoryReservation;

use crate::write_out::WriteOut;

/// A buffer taken out of a partition to be written outside its lock, holding the
/// memory it takes until then; its write is out until it is dropped.
pub(super) struct Full<'s> {
    pub(super) rows: FullRows,
    pub(super) reservation: MemoryReservation,
    /// Dropped after `drop` has freed the memory: then the write ends.
    pub(super) _out: WriteOut<'s>,
}

/// The rows of a [`Full`] buffer.
pub(super) enum FullRows {
    /// Gathered into one batch ([`GatherBuffer`](crate::gather::GatherBuffer)).
    Gathered(RecordBatch),
    /// Batches of nested columns, concatenated when written if there is memory for
    /// the copy.
    Pending(Vec<RecordBatch>),
}

impl Drop for Full<'_> {
    fn drop(&mut self) {
        self.reservation.free();
    }
}

/// Full buffers taken out under a partition's lock, written once it is released.
pub(super) type ToWrite<'s> = Vec<Full<'s>>;
