//! The pool trait and the pools that count bytes.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::{MemoryConsumer, MemoryError, MemoryReservation};

/// A pool's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    /// The pool never refuses.
    Infinite,
    /// The pool refuses reservations past this many bytes.
    Finite(usize),
}

impl MemoryLimit {
    /// The limit in bytes, `usize::MAX` when infinite.
    pub fn bytes(self) -> usize {
        match self {
            MemoryLimit::Infinite => usize::MAX,
            MemoryLimit::Finite(bytes) => bytes,
        }
    }
}

/// The budget that every [`MemoryReservation`] of a process (or of one query) draws
/// from.
///
/// Implementations must be thread safe: reservations on many threads grow and shrink
/// the same pool. Implementations count bytes; they never allocate on behalf of the
/// caller.
///
/// The methods taking a reservation are called *by* the reservation, before it updates
/// its own size: `reservation.size()` is the size before the change.
pub trait MemoryPool: Send + Sync + Debug {
    /// Called once when a consumer is registered, before any reservation of it grows.
    fn register(&self, _consumer: &MemoryConsumer) {}

    /// Called once when the last reservation of a consumer is dropped.
    fn unregister(&self, _consumer: &MemoryConsumer) {}

    /// Takes `additional` bytes whatever the limit (see [`MemoryReservation::grow`]).
    fn grow(&self, reservation: &MemoryReservation, additional: usize);

    /// Returns `shrink` bytes that `reservation` held.
    fn shrink(&self, reservation: &MemoryReservation, shrink: usize);

    /// Takes `additional` bytes for `reservation`, or refuses.
    ///
    /// # Errors
    /// [`MemoryError::ResourcesExhausted`] when the bytes are not available to this
    /// reservation; nothing is taken then.
    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError>;

    /// The bytes reserved from this pool now.
    fn reserved(&self) -> usize;

    /// The pool's limit.
    fn limit(&self) -> MemoryLimit;
}

/// A pool that counts but never refuses.
#[derive(Debug, Default)]
pub struct UnboundedMemoryPool {
    used: AtomicUsize,
}

impl UnboundedMemoryPool {
    /// A new, empty pool.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MemoryPool for UnboundedMemoryPool {
    fn grow(&self, _reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, _reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        self.grow(reservation, additional);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn limit(&self) -> MemoryLimit {
        MemoryLimit::Infinite
    }
}

/// A pool that hands out bytes first come, first served, up to a limit.
#[derive(Debug)]
pub struct GreedyMemoryPool {
    limit_bytes: usize,
    used: AtomicUsize,
}

impl GreedyMemoryPool {
    /// A new pool that refuses reservations past `limit_bytes` in total.
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            limit_bytes,
            used: AtomicUsize::new(0),
        }
    }
}

impl MemoryPool for GreedyMemoryPool {
    fn grow(&self, _reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, _reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional)
                    .filter(|&new_used| new_used <= self.limit_bytes)
            })
            .map(|_| ())
            .map_err(|used| {
                exhausted(
                    reservation,
                    additional,
                    self.limit_bytes.saturating_sub(used),
                    self.limit_bytes,
                )
            })
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit_bytes)
    }
}

/// A pool that is fair to consumers that can spill.
///
/// Consumers that cannot spill take bytes first come, first served from the whole
/// pool. Consumers that can spill share what the unspillable ones leave equally: with
/// `n` of them registered, each may hold at most `(limit - unspillable) / n`. A
/// spillable consumer that reaches its share is refused and is expected to spill, even
/// if bytes are free, so that a consumer registered later still finds its share.
///
/// The bookkeeping is one mutex; reservations are expected to grow in chunks (a batch,
/// a partition buffer), not per row.
#[derive(Debug)]
pub struct FairSpillPool {
    limit_bytes: usize,
    state: Mutex<FairSpillPoolState>,
}

#[derive(Debug, Default)]
struct FairSpillPoolState {
    /// Spillable consumers registered.
    spillable_consumers: usize,
    /// Bytes held by spillable consumers.
    spillable_bytes: usize,
    /// Bytes held by unspillable consumers.
    unspillable_bytes: usize,
}

impl FairSpillPool {
    /// A new pool with a total limit of `limit_bytes`.
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            limit_bytes,
            state: Mutex::new(FairSpillPoolState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FairSpillPoolState> {
        // The state is a few counters updated atomically under the lock; a panic in
        // another thread cannot leave them half-updated, so a poisoned lock is usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl MemoryPool for FairSpillPool {
    fn register(&self, consumer: &MemoryConsumer) {
        if consumer.can_spill() {
            self.state().spillable_consumers += 1;
        }
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        if consumer.can_spill() {
            let mut state = self.state();
            state.spillable_consumers = state.spillable_consumers.saturating_sub(1);
        }
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        let mut state = self.state();
        if reservation.consumer().can_spill() {
            state.spillable_bytes += additional;
        } else {
            state.unspillable_bytes += additional;
        }
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        let mut state = self.state();
        if reservation.consumer().can_spill() {
            state.spillable_bytes -= shrink;
        } else {
            state.unspillable_bytes -= shrink;
        }
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        let mut state = self.state();
        if reservation.consumer().can_spill() {
            let share = self
                .limit_bytes
                .saturating_sub(state.unspillable_bytes)
                .checked_div(state.spillable_consumers)
                .unwrap_or(0);
            // The pool as a whole may also be full: unspillable bytes granted after
            // the spillable ones grew can push the total to the limit.
            let total_free = self
                .limit_bytes
                .saturating_sub(state.unspillable_bytes + state.spillable_bytes);
            let available = share.saturating_sub(reservation.size()).min(total_free);
            if additional > available {
                return Err(exhausted(
                    reservation,
                    additional,
                    available,
                    self.limit_bytes,
                ));
            }
            state.spillable_bytes += additional;
        } else {
            let available = self
                .limit_bytes
                .saturating_sub(state.unspillable_bytes + state.spillable_bytes);
            if additional > available {
                return Err(exhausted(
                    reservation,
                    additional,
                    available,
                    self.limit_bytes,
                ));
            }
            state.unspillable_bytes += additional;
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        let state = self.state();
        state.spillable_bytes + state.unspillable_bytes
    }

    fn limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit_bytes)
    }
}

/// The error every pool returns when it refuses `reservation`.
pub(crate) fn exhausted(
    reservation: &MemoryReservation,
    requested_bytes: usize,
    available_bytes: usize,
    limit_bytes: usize,
) -> MemoryError {
    MemoryError::ResourcesExhausted {
        consumer: reservation.consumer().name().to_string(),
        requested_bytes,
        available_bytes,
        limit_bytes,
        top_consumers: Vec::new(),
    }
}
