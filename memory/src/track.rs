//! A pool decorator that knows what each consumer holds.
//!
//! Every grow and shrink of every reservation passes through it, from every thread,
//! so it counts without a lock: the pool's total and peak are atomics, and each
//! consumer's counters are atomics found through a map that only registering and
//! unregistering a consumer writes. (Under one lock, with a SipHash lookup per call,
//! it showed in the profile of a join under a tiny limit, much of it the threads
//! waiting for each other.)

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{
    ConsumerUsage, MemoryConsumer, MemoryError, MemoryLimit, MemoryPool, MemoryReservation,
};

/// Wraps a pool and remembers, per consumer, the bytes it holds now and the most it
/// ever held. When the inner pool refuses a reservation, the error names the
/// `top` largest consumers, which is what a person needs to see to understand an
/// out-of-memory failure.
///
/// It also records the pool's peak reservation ([`peak_reserved`](Self::peak_reserved)),
/// which joins report in their metrics.
#[derive(Debug)]
pub struct TrackConsumersPool<I> {
    inner: I,
    top: NonZeroUsize,
    /// Bytes reserved through this pool now, and the most ever at once. (Not the
    /// inner pool's `reserved()` read after a grow: by then another thread may have
    /// shrunk, and the peak would be missed.)
    reserved_bytes: AtomicUsize,
    peak_reserved_bytes: AtomicUsize,
    /// The registered consumers by id.
    consumers: RwLock<Consumers>,
}

type Consumers = HashMap<usize, Arc<TrackedConsumer>, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
struct TrackedConsumer {
    name: String,
    can_spill: bool,
    reserved_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
}

/// Hashes a consumer id (a counter) with one multiplication, which spreads it over
/// the high bits the map's control bytes take.
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_usize(&mut self, id: usize) {
        self.0 = (id as u64).wrapping_mul(FIBONACCI);
    }
}

/// 2^64 divided by the golden ratio.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

impl<I: MemoryPool> TrackConsumersPool<I> {
    /// Wraps `inner`; errors name the `top` largest consumers.
    pub fn new(inner: I, top: NonZeroUsize) -> Self {
        Self {
            inner,
            top,
            reserved_bytes: AtomicUsize::new(0),
            peak_reserved_bytes: AtomicUsize::new(0),
            consumers: RwLock::new(Consumers::default()),
        }
    }

    /// The wrapped pool.
    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// The largest consumers now, largest first, at most `top` of them.
    pub fn top_consumers(&self) -> Vec<ConsumerUsage> {
        let mut usage: Vec<ConsumerUsage> = self
            .consumers()
            .iter()
            .map(|(&id, c)| ConsumerUsage {
                name: c.name.clone(),
                id,
                can_spill: c.can_spill,
                reserved_bytes: c.reserved_bytes.load(Ordering::Relaxed),
            })
            .collect();
        usage.sort_by(|a, b| {
            b.reserved_bytes
                .cmp(&a.reserved_bytes)
                .then(a.id.cmp(&b.id))
        });
        usage.truncate(self.top.get());
        usage
    }

    /// The most the consumer with this id ever held, if it is still registered.
    pub fn peak_of(&self, consumer_id: usize) -> Option<usize> {
        self.consumers()
            .get(&consumer_id)
            .map(|c| c.peak_bytes.load(Ordering::Relaxed))
    }

    /// The most this pool ever had reserved at once.
    pub fn peak_reserved(&self) -> usize {
        self.peak_reserved_bytes.load(Ordering::Relaxed)
    }

    // The map is only inserted into and removed from, each in one step: usable
    // after a panic elsewhere.
    fn consumers(&self) -> RwLockReadGuard<'_, Consumers> {
        self.consumers
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn consumers_mut(&self) -> RwLockWriteGuard<'_, Consumers> {
        self.consumers
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record_grow(&self, reservation: &MemoryReservation, additional: usize) {
        let now = self.reserved_bytes.fetch_add(additional, Ordering::Relaxed) + additional;
        self.peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
        if let Some(c) = self.consumers().get(&reservation.consumer().id()) {
            let now = c.reserved_bytes.fetch_add(additional, Ordering::Relaxed) + additional;
            c.peak_bytes.fetch_max(now, Ordering::Relaxed);
        }
    }
}

impl<I: MemoryPool> MemoryPool for TrackConsumersPool<I> {
    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
        // A clone of a registered consumer (the same id) registered again counts
        // with it.
        self.consumers_mut()
            .entry(consumer.id())
            .or_insert_with(|| {
                Arc::new(TrackedConsumer {
                    name: consumer.name().to_string(),
                    can_spill: consumer.can_spill(),
                    reserved_bytes: AtomicUsize::new(0),
                    peak_bytes: AtomicUsize::new(0),
                })
            });
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
        self.consumers_mut().remove(&consumer.id());
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
        self.record_grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
        // A reservation never shrinks by more than it holds, so the pool's count
        // cannot fall below zero. A consumer's can, where a registration of the same
        // id came and went before this one shrinks (its count was dropped with it):
        // saturating, as before.
        self.reserved_bytes.fetch_sub(shrink, Ordering::Relaxed);
        if let Some(c) = self.consumers().get(&reservation.consumer().id()) {
            let _ = c
                .reserved_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    Some(held.saturating_sub(shrink))
                });
        }
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        match self.inner.try_grow(reservation, additional) {
            Ok(()) => {
                self.record_grow(reservation, additional);
                Ok(())
            }
            Err(MemoryError::ResourcesExhausted {
                consumer,
                requested_bytes,
                available_bytes,
                limit_bytes,
                ..
            }) => Err(MemoryError::ResourcesExhausted {
                consumer,
                requested_bytes,
                available_bytes,
                limit_bytes,
                top_consumers: self.top_consumers(),
            }),
        }
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn limit(&self) -> MemoryLimit {
        self.inner.limit()
    }
}
