//! A pool decorator that knows what each consumer holds.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};

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
    tracked: Mutex<Tracked>,
}

#[derive(Debug, Default)]
struct Tracked {
    consumers: HashMap<usize, TrackedConsumer>,
    reserved_bytes: usize,
    peak_reserved_bytes: usize,
}

#[derive(Debug)]
struct TrackedConsumer {
    name: String,
    can_spill: bool,
    reserved_bytes: usize,
    peak_bytes: usize,
}

impl<I: MemoryPool> TrackConsumersPool<I> {
    /// Wraps `inner`; errors name the `top` largest consumers.
    pub fn new(inner: I, top: NonZeroUsize) -> Self {
        Self {
            inner,
            top,
            tracked: Mutex::new(Tracked::default()),
        }
    }

    /// The wrapped pool.
    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// The largest consumers now, largest first, at most `top` of them.
    pub fn top_consumers(&self) -> Vec<ConsumerUsage> {
        let tracked = self.tracked();
        let mut usage: Vec<ConsumerUsage> = tracked
            .consumers
            .iter()
            .map(|(&id, c)| ConsumerUsage {
                name: c.name.clone(),
                id,
                can_spill: c.can_spill,
                reserved_bytes: c.reserved_bytes,
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
        self.tracked()
            .consumers
            .get(&consumer_id)
            .map(|c| c.peak_bytes)
    }

    /// The most this pool ever had reserved at once.
    pub fn peak_reserved(&self) -> usize {
        self.tracked().peak_reserved_bytes
    }

    fn tracked(&self) -> MutexGuard<'_, Tracked> {
        // Counters only, each updated in one step: usable after a panic elsewhere.
        self.tracked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record_grow(&self, reservation: &MemoryReservation, additional: usize) {
        let mut tracked = self.tracked();
        tracked.reserved_bytes += additional;
        tracked.peak_reserved_bytes = tracked.peak_reserved_bytes.max(tracked.reserved_bytes);
        if let Some(c) = tracked.consumers.get_mut(&reservation.consumer().id()) {
            c.reserved_bytes += additional;
            c.peak_bytes = c.peak_bytes.max(c.reserved_bytes);
        }
    }
}

impl<I: MemoryPool> MemoryPool for TrackConsumersPool<I> {
    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
        self.tracked().consumers.insert(
            consumer.id(),
            TrackedConsumer {
                name: consumer.name().to_string(),
                can_spill: consumer.can_spill(),
                reserved_bytes: 0,
                peak_bytes: 0,
            },
        );
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
        self.tracked().consumers.remove(&consumer.id());
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
        self.record_grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
        let mut tracked = self.tracked();
        tracked.reserved_bytes = tracked.reserved_bytes.saturating_sub(shrink);
        if let Some(c) = tracked.consumers.get_mut(&reservation.consumer().id()) {
            c.reserved_bytes = c.reserved_bytes.saturating_sub(shrink);
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
