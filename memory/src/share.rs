//! [`PoolShare`]: one of several joins that run side by side on one pool.
//!
//! A join sizes what it sets aside before any row arrives (its probe's headroom, the
//! pieces its workers take, the output in flight) by its pool's limit. A shuffle
//! engine's executor that joins several hash partitions at once, each with its own
//! join, on one pool, would otherwise have each join set aside a part of the whole
//! limit, and the last to start would find nothing left. A `PoolShare` is `1 /
//! parts` of the pool: it reports that as its limit, so each join plans for it,
//! and refuses what would take it past that, as a pool of its own would; every
//! reservation also goes to the shared pool, which refuses too when it is full
//! (other operators may reserve from it).
//!
//! What a join does not use of its share stays unused: letting a join take more
//! than its share while the pool has room made the joins that started later fail.
//! A build that came first kept its whole partition in memory, and the next join
//! could not reserve its probe's headroom even after spilling everything it had
//! (`tests/partitions.rs` failed so).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{MemoryConsumer, MemoryError, MemoryLimit, MemoryPool, MemoryReservation};

/// A [`MemoryPool`] of `1 / parts` of `pool`'s limit that reserves from `pool`
/// (see the module docs).
///
/// ```
/// use std::sync::Arc;
/// use spilljoin_memory::{FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, PoolShare};
///
/// let executor: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(1000));
/// // Four partitions joined side by side.
/// let share: Arc<dyn MemoryPool> = Arc::new(PoolShare::new(Arc::clone(&executor), 4));
/// assert_eq!(share.limit(), MemoryLimit::Finite(250));
/// let mut build = MemoryConsumer::new("build").with_can_spill(true).register(&share);
/// assert!(build.try_grow(251).is_err()); // past the share: spill
/// build.try_grow(250)?;
/// let mut other = MemoryConsumer::new("sort").register(&executor);
/// other.try_grow(700)?; // the executor's pool is shared with others
/// let mut probe = MemoryConsumer::new("probe").register(&share);
/// assert!(probe.try_grow(1).is_err(), "the executor's pool is full");
/// assert_eq!((share.reserved(), executor.reserved()), (250, 950));
/// # Ok::<(), spilljoin_memory::MemoryError>(())
/// ```
pub struct PoolShare {
    pool: Arc<dyn MemoryPool>,
    parts: usize,
    /// Bytes reserved through this share.
    reserved: AtomicUsize,
}

impl PoolShare {
    /// One of `parts` (at least 1) shares of `pool`.
    pub fn new(pool: Arc<dyn MemoryPool>, parts: usize) -> Self {
        Self {
            pool,
            parts: parts.max(1),
            reserved: AtomicUsize::new(0),
        }
    }
}

impl fmt::Debug for PoolShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolShare")
            .field("parts", &self.parts)
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("pool", &self.pool)
            .finish()
    }
}

impl MemoryPool for PoolShare {
    fn register(&self, consumer: &MemoryConsumer) {
        self.pool.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.pool.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.pool.grow(reservation, additional);
        self.reserved.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.pool.shrink(reservation, shrink);
        self.reserved.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        let share = self.limit().bytes();
        let reserved = self.reserved();
        if reserved.saturating_add(additional) > share {
            return Err(MemoryError::ResourcesExhausted {
                consumer: reservation.consumer().name().to_owned(),
                requested_bytes: additional,
                available_bytes: share.saturating_sub(reserved),
                limit_bytes: share,
                top_consumers: Vec::new(),
            });
        }
        self.pool.try_grow(reservation, additional)?;
        self.reserved.fetch_add(additional, Ordering::Relaxed);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    fn limit(&self) -> MemoryLimit {
        match self.pool.limit() {
            MemoryLimit::Finite(bytes) => MemoryLimit::Finite(bytes / self.parts),
            MemoryLimit::Infinite => MemoryLimit::Infinite,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GreedyMemoryPool;

    #[test]
    fn a_share_refuses_past_its_part_and_the_pool_past_the_whole() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let one: Arc<dyn MemoryPool> = Arc::new(PoolShare::new(Arc::clone(&pool), 3));
        let two: Arc<dyn MemoryPool> = Arc::new(PoolShare::new(Arc::clone(&pool), 3));
        assert_eq!(one.limit(), MemoryLimit::Finite(333));
        let mut a = MemoryConsumer::new("a").with_can_spill(true).register(&one);
        let mut b = MemoryConsumer::new("b").register(&two);
        let mut c = MemoryConsumer::new("c").register(&pool);
        assert!(a.try_grow(334).is_err(), "past the share");
        a.try_grow(333).unwrap();
        assert!(
            b.try_grow(334).is_err(),
            "past the share, whatever the consumer"
        );
        c.try_grow(600).unwrap();
        assert!(b.try_grow(68).is_err(), "the pool has 67 bytes left");
        b.try_grow(67).unwrap();
        assert_eq!(
            (one.reserved(), two.reserved(), pool.reserved()),
            (333, 67, 1000)
        );
        a.shrink(200);
        b.grow(50);
        assert_eq!(
            (one.reserved(), two.reserved(), pool.reserved()),
            (133, 117, 850)
        );
        drop((a, b, c));
        assert_eq!((one.reserved(), two.reserved(), pool.reserved()), (0, 0, 0));
        let zero = PoolShare::new(Arc::clone(&pool), 0);
        assert_eq!(zero.limit(), MemoryLimit::Finite(1000), "0 parts is one");
    }
}
