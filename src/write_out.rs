//! Writes done outside the lock of what they write: the protocol that both the
//! build's and the probe's spilling follow.
//!
//! A spilled partition's rows are buffered under a lock, and written to its file
//! without it: a worker takes a full buffer out under the lock (its memory stays
//! reserved), releases the lock, writes, and then gives the memory back. Meanwhile
//! other workers go on appending to the partition. While buffers are out, their
//! memory is held but no other worker can free it by writing them; a worker short
//! of memory with nothing left to write must wait for one to come back rather than
//! call the limit too small.
//!
//! ```text
//!  under the partition's lock            after the lock is released
//!  ──────────────────────────            ──────────────────────────
//!  take the buffer out ─► WriteOut ────► write it ─► drop the WriteOut: the write
//!  (WritesOut::start)                     (a panic or an error too)  has ended,
//!                                                                    waiters wake
//!  short of memory, nothing to write ─► WritesOut::wait_since(mark): until the
//!                                       next write ends, WRITE_WAIT passes or
//!                                       the join is cancelled
//! ```
//!
//! What a side does with the memory that comes back (shrinking a shared
//! reservation, freeing a buffer's own) is its own; this module only counts the
//! writes out and lets workers wait for the next to end. A write ends when its
//! [`WriteOut`] is dropped, so no worker waits for a write that failed or panicked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::batches::lock;
use crate::error::{JoinError, Result};

/// How long a worker waiting for a write to end sleeps before it looks again
/// whether the join was cancelled. A write that takes longer is waited for again.
pub(crate) const WRITE_WAIT: Duration = Duration::from_millis(50);

/// The writes of one side of a level that are out of their partitions' locks.
#[derive(Debug, Default)]
pub(crate) struct WritesOut {
    counts: Mutex<Counts>,
    ended: Condvar,
}

#[derive(Debug, Default)]
struct Counts {
    /// Writes started and not yet ended.
    out: usize,
    /// Writes ended so far: a worker waits for this to move past what it saw.
    ended: u64,
}

/// What [`WritesOut::wait_since`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// No write was out, and none had ended since the mark.
    Nothing,
    /// A write ended since the mark: its memory is back.
    Ended,
    /// Writes were out and none ended within [`WRITE_WAIT`].
    TimedOut,
}

/// One write out of its partition's lock; it ends when dropped.
#[derive(Debug)]
pub(crate) struct WriteOut<'w> {
    writes: &'w WritesOut,
}

impl Drop for WriteOut<'_> {
    fn drop(&mut self) {
        let mut counts = lock(&self.writes.counts);
        // Saturating: a panic here, while a panic unwinds, would abort.
        counts.out = counts.out.saturating_sub(1);
        counts.ended += 1;
        drop(counts);
        self.writes.ended.notify_all();
    }
}

impl WritesOut {
    /// Counts a write as out until the returned guard is dropped. Call it while the
    /// lock of what is taken out is still held, so that a worker that saw the
    /// partition's memory held also sees the write that will free it.
    pub fn start(&self) -> WriteOut<'_> {
        lock(&self.counts).out += 1;
        WriteOut { writes: self }
    }

    /// A mark for [`wait_since`](Self::wait_since): the writes ended so far.
    pub fn mark(&self) -> u64 {
        lock(&self.counts).ended
    }

    /// Waits until a write ends after `mark` (at once if one has), or until
    /// [`WRITE_WAIT`] has passed with writes out; says which. Returns
    /// [`Waited::Nothing`] at once when no write is out and none has ended since
    /// (whether or not the join was cancelled).
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] when the join was cancelled (another worker failed).
    pub fn wait_since(&self, mark: u64, cancel: &AtomicBool) -> Result<Waited> {
        let mut counts = lock(&self.counts);
        if counts.out == 0 && counts.ended == mark {
            // Nothing to wait for: the caller decides what to do, cancelled or not.
            return Ok(Waited::Nothing);
        }
        let deadline = Instant::now() + WRITE_WAIT;
        while counts.ended == mark && counts.out > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || cancel.load(Ordering::Relaxed) {
                break;
            }
            counts = self
                .ended
                .wait_timeout(counts, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let waited = if counts.ended != mark {
            Waited::Ended
        } else if counts.out == 0 {
            Waited::Nothing
        } else {
            Waited::TimedOut
        };
        drop(counts);
        if cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        Ok(waited)
    }

    /// [`wait_since`](Self::wait_since) from now: until the next write ends.
    pub fn wait(&self, cancel: &AtomicBool) -> Result<Waited> {
        let mark = self.mark();
        self.wait_since(mark, cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_writes_out_says_whether_one_ended() -> Result<()> {
        let writes = WritesOut::default();
        let cancel = AtomicBool::new(false);
        assert_eq!(writes.wait(&cancel)?, Waited::Nothing);
        let first = writes.start();
        assert_eq!(writes.wait(&cancel)?, Waited::TimedOut);
        // Writes ending while a worker waits: it sees one end (however the two
        // threads are scheduled, as writes keep ending until it does).
        let mut out: Vec<WriteOut<'_>> = (0..100_000).map(|_| writes.start()).collect();
        let waiting = AtomicBool::new(true);
        std::thread::scope(|scope| -> Result<()> {
            let waiter = scope.spawn(|| {
                let waited = (0..100)
                    .map(|_| writes.wait(&cancel))
                    .find(|w| !matches!(w, Ok(Waited::TimedOut)));
                waiting.store(false, Ordering::Relaxed);
                waited
            });
            while waiting.load(Ordering::Relaxed) {
                drop(out.pop());
                std::thread::sleep(Duration::from_millis(1));
            }
            let waited = waiter
                .join()
                .map_err(|_| JoinError::Internal("the waiter panicked".into()))?;
            assert!(matches!(waited, Some(Ok(Waited::Ended))), "{waited:?}");
            Ok(())
        })?;
        drop(out);
        // One is still out; a cancelled join stops waiting for it.
        cancel.store(true, Ordering::Relaxed);
        assert!(matches!(writes.wait(&cancel), Err(JoinError::Cancelled)));
        drop(first);
        assert_eq!(writes.wait(&cancel)?, Waited::Nothing);
        Ok(())
    }

    #[test]
    fn a_write_that_ended_after_the_mark_is_seen() -> Result<()> {
        let writes = WritesOut::default();
        let cancel = AtomicBool::new(false);
        let mark = writes.mark();
        drop(writes.start());
        assert_eq!(writes.wait_since(mark, &cancel)?, Waited::Ended);
        assert_eq!(writes.wait(&cancel)?, Waited::Nothing);
        Ok(())
    }
}
