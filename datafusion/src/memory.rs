//! One budget for the whole query: spilljoin's memory pool trait on top of the
//! `TaskContext`'s DataFusion `MemoryPool`.
//!
//! ```text
//!  spilljoin reservations (tables, partition buffers, output pieces, ...)
//!        │ try_grow / grow / shrink
//!        ▼
//!  DataFusionPool ── one DataFusion MemoryReservation per join execution,
//!        │           registered as "SpilljoinExec[partition]" with can_spill = true
//!        ▼
//!  the session's DataFusion pool (greedy, fair spill, tracked, ...), shared with
//!  sorts, aggregates and every other join of the plan
//! ```
//!
//! A join's own consumers are many (one per partition buffer, table, output gate);
//! DataFusion sees them as one spilling consumer per execution. That is what its fair
//! pool needs to share fairly: a join that spills gets the same share as a sort that
//! spills, whatever number of buffers it keeps inside. When DataFusion refuses, the
//! join spills — a refusal is the only signal it uses.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::execution::memory_pool::{
    MemoryConsumer as DfConsumer, MemoryLimit as DfLimit, MemoryPool as DfPool,
    MemoryReservation as DfReservation,
};
use spilljoin::memory::{MemoryError, MemoryLimit, MemoryPool, MemoryReservation};

/// A spilljoin [`MemoryPool`] that reserves from a DataFusion pool.
///
/// Every byte one join execution reserves goes through a single DataFusion
/// reservation that can spill; dropping the pool (with the join) frees it.
pub struct DataFusionPool {
    reservation: DfReservation,
    limit: MemoryLimit,
    /// The bytes spilljoin's reservations hold now (the DataFusion reservation holds
    /// the same number; kept apart so that `reserved` needs no lock).
    reserved: AtomicUsize,
}

impl DataFusionPool {
    /// A pool for one join execution named `name` (DataFusion's error messages and
    /// consumer listings show it), reserving from `pool`.
    pub fn new(name: impl Into<String>, pool: &Arc<dyn DfPool>) -> Self {
        let reservation = DfConsumer::new(name).with_can_spill(true).register(pool);
        let limit = match pool.memory_limit() {
            DfLimit::Finite(bytes) => MemoryLimit::Finite(bytes),
            DfLimit::Infinite | DfLimit::Unknown => MemoryLimit::Infinite,
        };
        Self {
            reservation,
            limit,
            reserved: AtomicUsize::new(0),
        }
    }

    /// The bytes DataFusion's reservation for this join holds now.
    pub fn datafusion_reserved(&self) -> usize {
        self.reservation.size()
    }
}

impl fmt::Debug for DataFusionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataFusionPool")
            .field("consumer", &self.reservation.consumer().name())
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("limit", &self.limit)
            .finish()
    }
}

impl MemoryPool for DataFusionPool {
    fn grow(&self, _reservation: &MemoryReservation, additional: usize) {
        self.reservation.grow(additional);
        self.reserved.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, _reservation: &MemoryReservation, shrink: usize) {
        self.reservation.shrink(shrink);
        self.reserved.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        match self.reservation.try_grow(additional) {
            Ok(()) => {
                self.reserved.fetch_add(additional, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => Err(MemoryError::ResourcesExhausted {
                consumer: format!(
                    "{} ({})",
                    reservation.consumer().name(),
                    self.reservation.consumer().name()
                ),
                requested_bytes: additional,
                available_bytes: 0,
                limit_bytes: self.limit.bytes(),
                top_consumers: Vec::new(),
            }),
        }
    }

    fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    fn limit(&self) -> MemoryLimit {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::{FairSpillPool, GreedyMemoryPool};
    use spilljoin::memory::MemoryConsumer;

    #[test]
    fn reservations_reach_the_datafusion_pool_and_are_freed() {
        let df: Arc<dyn DfPool> = Arc::new(GreedyMemoryPool::new(1000));
        let pool: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("join", &df));
        let mut a = MemoryConsumer::new("a").register(&pool);
        a.try_grow(600).unwrap();
        assert_eq!(df.reserved(), 600);
        let mut b = MemoryConsumer::new("b").register(&pool);
        assert!(b.try_grow(500).is_err(), "only 400 bytes are left");
        assert_eq!(df.reserved(), 600, "a refusal takes nothing");
        b.try_grow(400).unwrap();
        a.shrink(100);
        assert_eq!((pool.reserved(), df.reserved()), (900, 900));
        drop((a, b));
        assert_eq!((pool.reserved(), df.reserved()), (0, 0));
        drop(pool);
        assert_eq!(df.reserved(), 0);
    }

    #[test]
    fn a_fair_pool_shares_between_two_joins() {
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let one: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("one", &df));
        let two: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("two", &df));
        let mut a = MemoryConsumer::new("a").register(&one);
        let mut b = MemoryConsumer::new("b").register(&two);
        // Two spilling consumers: each may have half.
        assert!(a.try_grow(600).is_err());
        a.try_grow(500).unwrap();
        b.try_grow(500).unwrap();
        assert!(b.try_grow(1).is_err());
        assert_eq!(one.limit(), MemoryLimit::Finite(1000));
    }
}
