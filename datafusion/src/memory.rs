//! One budget for the whole query: spilljoin's memory pool trait on top of the
//! `TaskContext`'s DataFusion `MemoryPool`.
//!
//! ```text
//!  spilljoin reservations (tables, partition buffers, output pieces, ...)
//!        │ try_grow / grow / shrink
//!        ▼
//!  DataFusionPool ── two DataFusion MemoryReservations per join execution: what can
//!        │           spill, and the working set (below)
//!        ▼
//!  the session's DataFusion pool (greedy, fair spill, tracked, ...), shared with
//!  sorts, aggregates and every other join of the plan
//! ```
//!
//! A join's own consumers are many (one per partition buffer, table, output gate);
//! DataFusion sees two per execution, as it sees a sort's (`ExternalSorter` and
//! `ExternalSorterMerge`):
//! - `SpilljoinExec[p]`, registered with `can_spill = true`, holds what the join can
//!   write to disk when refused: the build side's partitions and the fallback's
//!   chunks. A fair spill pool gives it a fair share beside sorts and aggregates that
//!   spill.
//! - `SpilljoinExec[p] working set`, with `can_spill = false`, holds what the join
//!   needs to make progress at all: probe workers' batches and buffers, output
//!   batches, spilled pairs being read. A fair pool serves it before any spilling
//!   consumer's share, as it serves a sort's merge buffers.
//!
//! Without the split, a plan of many joins under a fair pool left each join a share
//! smaller than its working set, and joins failed that spilling would have saved.
//! When DataFusion refuses, the join spills: a refusal is the only signal it uses.
//!
//! A fair pool divides what spills among every spilling consumer registered, and
//! DataFusion registers many (each `RepartitionExec` partition, aggregates, sorts):
//! TPC-H Q9 at 16 MiB gave each consumer 0.7 MiB, while the join was planned for
//! its share of the pool (`with_share`: 2.7 MiB) and one partition's buffer took
//! 0.8 MiB. So a spillable reservation the fair share refuses may *borrow* from the
//! working set, while the execution holds less than its planned share in all and the
//! pool as a whole has the memory; borrowed bytes are given back first.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::execution::memory_pool::{
    MemoryConsumer as DfConsumer, MemoryLimit as DfLimit, MemoryPool as DfPool,
    MemoryReservation as DfReservation,
};
use spilljoin::memory::{MemoryError, MemoryLimit, MemoryPool, MemoryReservation};

/// A spilljoin [`MemoryPool`] that reserves from a DataFusion pool.
///
/// Every byte one join execution reserves goes through one of its two DataFusion
/// reservations, chosen by the spilljoin consumer's `can_spill` (see the module
/// docs); dropping the pool (with the join) frees both.
pub struct DataFusionPool {
    spilling: DfReservation,
    working: DfReservation,
    limit: MemoryLimit,
    /// Bytes of spillable reservations held in `working`, borrowed past the fair
    /// share of `spilling` (see the module docs). Its lock is also held while
    /// spillable bytes move between the two.
    borrowed: Mutex<usize>,
    /// The bytes spilljoin's reservations hold now (the DataFusion reservation holds
    /// the same number; kept apart so that `reserved` needs no lock).
    reserved: AtomicUsize,
}

impl DataFusionPool {
    /// A pool for one join execution named `name` (DataFusion's error messages and
    /// consumer listings show it), reserving from `pool`.
    pub fn new(name: impl Into<String>, pool: &Arc<dyn DfPool>) -> Self {
        let name = name.into();
        let working = DfConsumer::new(format!("{name} working set")).register(pool);
        let spilling = DfConsumer::new(name).with_can_spill(true).register(pool);
        let limit = match pool.memory_limit() {
            DfLimit::Finite(bytes) => MemoryLimit::Finite(bytes),
            DfLimit::Infinite | DfLimit::Unknown => MemoryLimit::Infinite,
        };
        Self {
            spilling,
            working,
            limit,
            borrowed: Mutex::new(0),
            reserved: AtomicUsize::new(0),
        }
    }

    /// Reports `1 / executions` of the DataFusion pool's limit as this pool's limit,
    /// for a join whose plan runs `executions` join executions side by side: the
    /// engine sizes what it sets aside by its limit, and the executions would
    /// otherwise each set aside a share of the whole pool. Reservations still go to
    /// the DataFusion pool, which alone refuses; the share also bounds what spilling
    /// reservations may borrow from the working set (see the module docs).
    pub fn with_share(mut self, executions: usize) -> Self {
        if let MemoryLimit::Finite(bytes) = self.limit {
            self.limit = MemoryLimit::Finite(bytes / executions.max(1));
        }
        self
    }

    /// The bytes DataFusion's reservations for this join hold now.
    pub fn datafusion_reserved(&self) -> usize {
        self.spilling.size() + self.working.size()
    }

    /// Grows the working set by `additional` bytes of a spillable reservation that
    /// the fair share refused, if the execution then holds at most its planned share
    /// (an infinite limit plans none: nothing is borrowed). Returns whether it did.
    fn borrow(&self, additional: usize) -> bool {
        let MemoryLimit::Finite(share) = self.limit else {
            return false;
        };
        let mut borrowed = self.borrowed.lock().unwrap_or_else(PoisonError::into_inner);
        let held = self.spilling.size() + self.working.size();
        if held.saturating_add(additional) > share || self.working.try_grow(additional).is_err() {
            return false;
        }
        *borrowed += additional;
        true
    }

    /// The DataFusion reservation that `reservation`'s bytes go to.
    fn of(&self, reservation: &MemoryReservation) -> &DfReservation {
        match reservation.consumer().can_spill() {
            true => &self.spilling,
            false => &self.working,
        }
    }
}

impl fmt::Debug for DataFusionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataFusionPool")
            .field("consumer", &self.spilling.consumer().name())
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("limit", &self.limit)
            .finish()
    }
}

impl MemoryPool for DataFusionPool {
    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.of(reservation).grow(additional);
        self.reserved.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        if reservation.consumer().can_spill() {
            // Borrowed bytes first: the working set's memory is what the pool serves
            // to everyone before spilling shares.
            let mut borrowed = self.borrowed.lock().unwrap_or_else(PoisonError::into_inner);
            let returned = shrink.min(*borrowed);
            *borrowed -= returned;
            self.working.shrink(returned);
            self.spilling.shrink(shrink - returned);
        } else {
            self.working.shrink(shrink);
        }
        self.reserved.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        let target = self.of(reservation);
        let grown = match target.try_grow(additional) {
            Ok(()) => true,
            Err(_) if reservation.consumer().can_spill() => self.borrow(additional),
            Err(_) => false,
        };
        if grown {
            self.reserved.fetch_add(additional, Ordering::Relaxed);
            return Ok(());
        }
        Err(MemoryError::ResourcesExhausted {
            consumer: format!(
                "{} ({})",
                reservation.consumer().name(),
                target.consumer().name()
            ),
            requested_bytes: additional,
            available_bytes: 0,
            limit_bytes: self.limit.bytes(),
            top_consumers: Vec::new(),
        })
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
        let one: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("one", &df).with_share(2));
        let two: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("two", &df).with_share(2));
        let spilling = |name| MemoryConsumer::new(name).with_can_spill(true);
        let mut a = spilling("a").register(&one);
        let mut b = spilling("b").register(&two);
        // Two spilling consumers, each planned for half: each may have half.
        assert!(a.try_grow(600).is_err());
        a.try_grow(500).unwrap();
        b.try_grow(500).unwrap();
        assert!(b.try_grow(1).is_err());
        assert_eq!(one.limit(), MemoryLimit::Finite(500));
    }

    #[test]
    fn the_working_set_is_served_before_spilling_shares() {
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let one: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("one", &df).with_share(2));
        let two: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("two", &df).with_share(2));
        let mut probe = MemoryConsumer::new("probe").register(&one);
        let mut build = MemoryConsumer::new("build")
            .with_can_spill(true)
            .register(&one);
        let mut other = MemoryConsumer::new("build")
            .with_can_spill(true)
            .register(&two);
        // The working set takes what no spilling consumer holds, past a fair share.
        probe.try_grow(700).unwrap();
        // The spilling consumers share what is left: 150 bytes each.
        assert!(build.try_grow(151).is_err());
        build.try_grow(150).unwrap();
        other.try_grow(150).unwrap();
        assert_eq!(
            (one.reserved(), two.reserved(), df.reserved()),
            (850, 150, 1000)
        );
        drop((probe, build, other));
        assert_eq!(df.reserved(), 0);
    }

    #[test]
    fn a_refused_fair_share_borrows_up_to_the_planned_share() {
        // Four spilling consumers share 1000 bytes (250 each); the join was planned
        // for half the pool.
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let join: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("join", &df).with_share(2));
        let _others: Vec<_> = (0..3)
            .map(|i| {
                DfConsumer::new(format!("spilling {i}"))
                    .with_can_spill(true)
                    .register(&df)
            })
            .collect();
        let merge = DfConsumer::new("merge").register(&df);
        let mut build = MemoryConsumer::new("build")
            .with_can_spill(true)
            .register(&join);
        build.try_grow(250).unwrap();
        // Past the fair share: borrowed from the working set, up to the planned 500.
        build.try_grow(200).unwrap();
        assert_eq!(df.reserved(), 450);
        assert!(build.try_grow(51).is_err(), "past the planned share");
        // Not past what the pool has.
        merge.try_grow(550).unwrap();
        build.shrink(100);
        assert!(build.try_grow(150).is_err(), "the pool has 100 bytes left");
        build.try_grow(100).unwrap();
        assert_eq!(df.reserved(), 1000);
        // Borrowed bytes go back first: the fair share is what stays held.
        build.shrink(300);
        assert_eq!(
            (build.size(), join.reserved(), df.reserved()),
            (150, 150, 700)
        );
        merge.free();
        build.try_grow(100).unwrap();
        assert_eq!(df.reserved(), 250);
        drop(build);
        assert_eq!((join.reserved(), df.reserved()), (0, 0));
    }

    #[test]
    fn without_a_share_a_join_may_borrow_up_to_the_whole_pool() {
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let join: Arc<dyn MemoryPool> = Arc::new(DataFusionPool::new("join", &df));
        let _other = DfConsumer::new("other").with_can_spill(true).register(&df);
        let mut build = MemoryConsumer::new("build")
            .with_can_spill(true)
            .register(&join);
        build.try_grow(500).unwrap();
        build.try_grow(500).unwrap();
        assert!(build.try_grow(1).is_err());
        assert_eq!(df.reserved(), 1000);
    }
}
