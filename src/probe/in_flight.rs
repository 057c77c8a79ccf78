//! Writing outside the lock: a full buffer is taken out of its partition under the
//! partition's lock (a [`Full`] buffer), written once the lock is released, and
//! counted as in flight ([`InFlight`]) until it is written and its memory is freed.
//! A worker short of memory with nothing of its own left to write waits for such a
//! buffer to come back ([`InFlight::wait`]) rather than call the limit too small.
//!
//! ```text
//!  worker A: lock ─ take the buffer: Full, started() ─ unlock ─ write ─ drop: freed, ended()
//!  worker B:     reservation fails, nothing to write ─ wait() ──────────────► Ended: try again
//! ```
//!
//! Its own file because it is a protocol rather than probe logic: what is taken out,
//! and how long a wait lasts, not what is written (the build side writes its
//! partitions the same way).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use arrow_array::RecordBatch;
use spilljoin_memory::MemoryReservation;

use crate::batches::lock;
use crate::error::{JoinError, Result};

/// A buffer taken out of a partition to be written outside its lock, holding the
/// memory it takes until then; counted in [`InFlight`] until dropped.
pub(super) struct Full<'s> {
    pub(super) rows: FullRows,
    pub(super) reservation: MemoryReservation,
    pub(super) in_flight: &'s InFlight,
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
        self.in_flight.ended();
    }
}

/// Full buffers taken out under a partition's lock, written once it is released.
pub(super) type ToWrite<'s> = Vec<Full<'s>>;

/// The [`Full`] buffers out of their partitions, not yet written. Their memory is
/// held, but no worker can free it by writing them: a worker short of memory with
/// nothing left to write waits for them ([`InFlight::wait`]) rather than call the
/// limit too small (as it waited, before, for the lock of a partition being
/// written).
#[derive(Debug, Default)]
pub(super) struct InFlight {
    state: Mutex<InFlightState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct InFlightState {
    /// Buffers out.
    count: usize,
    /// Buffers out and back (written, or dropped on an error) so far.
    ended: u64,
}

/// What [`InFlight::wait`] saw.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// No buffer was out.
    Nothing,
    /// A buffer's memory came back.
    Ended,
    /// Buffers were out and none came back within [`WRITE_WAIT`].
    TimedOut,
}

impl InFlight {
    pub(super) fn started(&self) {
        lock(&self.state).count += 1;
    }

    pub(super) fn ended(&self) {
        let mut state = lock(&self.state);
        debug_assert!(state.count > 0, "a buffer ended that never started");
        state.count = state.count.saturating_sub(1);
        state.ended += 1;
        self.done.notify_all();
    }

    /// Waits until a buffer out of its partition comes back (or [`WRITE_WAIT`] has
    /// passed), then says which; [`JoinError::Cancelled`] if the join was cancelled.
    pub(super) fn wait(&self, cancel: &AtomicBool) -> Result<Waited> {
        let mut state = lock(&self.state);
        if state.count == 0 {
            return Ok(Waited::Nothing);
        }
        let before = state.ended;
        let deadline = std::time::Instant::now() + WRITE_WAIT;
        while state.ended == before && state.count > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .done
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        let ended = state.ended != before;
        drop(state);
        if cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        Ok(if ended {
            Waited::Ended
        } else {
            Waited::TimedOut
        })
    }
}

/// How long a probe worker waits for a buffer out of its partition to come back
/// before it counts the wait as one of its [`RESERVE_RETRIES`](super::spill::RESERVE_RETRIES)
/// ([`InFlight::wait`]).
pub(super) const WRITE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_buffers_out_says_whether_one_came_back() -> Result<()> {
        let in_flight = InFlight::default();
        let cancel = AtomicBool::new(false);
        assert_eq!(in_flight.wait(&cancel)?, Waited::Nothing);
        in_flight.started();
        assert_eq!(in_flight.wait(&cancel)?, Waited::TimedOut);
        // Buffers coming back while a worker waits: it sees one come back (however
        // the two threads are scheduled, as buffers keep coming back until it does).
        for _ in 0..100_000 {
            in_flight.started();
        }
        let waiting = AtomicBool::new(true);
        std::thread::scope(|scope| -> Result<()> {
            let waiter = scope.spawn(|| {
                let waited = (0..100)
                    .map(|_| in_flight.wait(&cancel))
                    .find(|w| !matches!(w, Ok(Waited::TimedOut)));
                waiting.store(false, Ordering::Relaxed);
                waited
            });
            while waiting.load(Ordering::Relaxed) {
                in_flight.ended();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let waited = waiter
                .join()
                .map_err(|_| JoinError::InvalidJoin("the waiter panicked".into()))?;
            assert!(matches!(waited, Some(Ok(Waited::Ended))), "{waited:?}");
            Ok(())
        })?;
        while lock(&in_flight.state).count > 1 {
            in_flight.ended();
        }
        // One is still out; a cancelled join stops waiting for it.
        cancel.store(true, Ordering::Relaxed);
        assert!(matches!(in_flight.wait(&cancel), Err(JoinError::Cancelled)));
        in_flight.ended();
        assert_eq!(in_flight.wait(&cancel)?, Waited::Nothing);
        Ok(())
    }
}
