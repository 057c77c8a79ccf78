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
//!
//! What the working set gives back, it keeps, up to a small part of the execution's
//! share ([`KEPT_SHARE_DIVISOR`]): that stays reserved in DataFusion's pool until the
//! join ends and serves the working set's next growth. A probe reserves each piece of
//! a batch and releases it after, and the build releases the probe's headroom just
//! before the probe starts; given back to a shared pool, those bytes went to
//! whichever consumer asked next (a fair pool hands spilling consumers a larger share
//! as soon as the unspillable part shrinks, and they hold it), and the probe then
//! failed to reserve a few KiB it had held a moment before. What is kept is small
//! because it is idle whenever the join does not need it: it is memory every other
//! operator of the query goes without (BENCHMARKS.md, SQL section).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::execution::memory_pool::{
    MemoryConsumer as DfConsumer, MemoryLimit as DfLimit, MemoryPool as DfPool,
    MemoryReservation as DfReservation,
};
use spilljoin::memory::{MemoryError, MemoryLimit, MemoryPool, MemoryReservation};

/// What share of its planned share a join execution's working set keeps of what it
/// gives back (see the module docs).
const KEPT_SHARE_DIVISOR: usize = 32;

/// The bytes of a [`DataFusionPool`]'s working-set reservation that are not the
/// working set's own.
#[derive(Debug, Default)]
struct Held {
    /// Bytes of spillable reservations, borrowed past the fair share of `spilling`.
    borrowed: usize,
    /// Bytes the working set gave back and keeps for its next growth, at most
    /// `DataFusionPool::kept_at_most`.
    kept: usize,
}

/// A spilljoin [`MemoryPool`] that reserves from a DataFusion pool.
///
/// Every byte one join execution reserves goes through one of its two DataFusion
/// reservations, chosen by the spilljoin consumer's `can_spill` (see the module
/// docs); dropping the pool (with the join) frees both.
pub struct DataFusionPool {
    spilling: DfReservation,
    working: DfReservation,
    limit: MemoryLimit,
    /// The most `held.kept` may be ([`KEPT_SHARE_DIVISOR`]).
    kept_at_most: usize,
    /// What `working` holds beyond the working set's reservations (see [`Held`]).
    /// Its lock is also held while bytes move between the two DataFusion
    /// reservations or in and out of what is kept.
    held: Mutex<Held>,
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
            kept_at_most: Self::kept_of(limit),
            limit,
            held: Mutex::new(Held::default()),
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
        self.kept_at_most = Self::kept_of(self.limit);
        self
    }

    /// The bytes DataFusion's reservations for this join hold now.
    pub fn datafusion_reserved(&self) -> usize {
        self.spilling.size() + self.working.size()
    }

    /// The most the working set keeps of what it gives back: a part of `limit`
    /// (nothing under an infinite limit, where nothing is refused).
    fn kept_of(limit: MemoryLimit) -> usize {
        match limit {
            MemoryLimit::Finite(share) => share / KEPT_SHARE_DIVISOR,
            MemoryLimit::Infinite => 0,
        }
    }

    /// Keeps at most `bytes` of what the working set gives back (tests).
    #[cfg(test)]
    fn keeping(mut self, bytes: usize) -> Self {
        self.kept_at_most = bytes;
        self
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Grows the working set's DataFusion reservation by `additional` bytes, the kept
    /// bytes first (taken from `held`); returns whether it did.
    fn grow_working(&self, held: &mut Held, additional: usize) -> bool {
        let kept = additional.min(held.kept);
        if kept < additional && self.working.try_grow(additional - kept).is_err() {
            return false;
        }
        held.kept -= kept;
        true
    }

    /// Shrinks the working set's DataFusion reservation by `shrink` bytes, but for
    /// what it keeps (up to `kept_at_most`).
    fn give_back_working(&self, held: &mut Held, shrink: usize) {
        let keep = shrink.min(self.kept_at_most.saturating_sub(held.kept));
        held.kept += keep;
        self.working.shrink(shrink - keep);
    }

    /// Grows the working set by `additional` bytes of a spillable reservation that
    /// the fair share refused, if the execution then holds at most its planned share
    /// (an infinite limit plans none: nothing is borrowed). Returns whether it did.
    fn borrow(&self, additional: usize) -> bool {
        let MemoryLimit::Finite(share) = self.limit else {
            return false;
        };
        let mut held = self.lock_held();
        let holds = self.spilling.size() + self.working.size() - held.kept;
        if holds.saturating_add(additional) > share || !self.grow_working(&mut held, additional) {
            return false;
        }
        held.borrowed += additional;
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
        if reservation.consumer().can_spill() {
            self.spilling.grow(additional);
        } else {
            let mut held = self.lock_held();
            let kept = additional.min(held.kept);
            held.kept -= kept;
            self.working.grow(additional - kept);
        }
        self.reserved.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        if reservation.consumer().can_spill() {
            // Borrowed bytes first: the working set's memory is what the pool serves
            // to everyone before spilling shares.
            let mut held = self.lock_held();
            let returned = shrink.min(held.borrowed);
            held.borrowed -= returned;
            self.give_back_working(&mut held, returned);
            self.spilling.shrink(shrink - returned);
        } else {
            self.give_back_working(&mut self.lock_held(), shrink);
        }
        self.reserved.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), MemoryError> {
        let target = self.of(reservation);
        let grown = match reservation.consumer().can_spill() {
            true => self.spilling.try_grow(additional).is_ok() || self.borrow(additional),
            false => self.grow_working(&mut self.lock_held(), additional),
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
        let pool = DataFusionPool::new("join", &df);
        assert_eq!(pool.kept_at_most, 1000 / KEPT_SHARE_DIVISOR);
        let pool: Arc<dyn MemoryPool> = Arc::new(pool.keeping(500));
        let mut a = MemoryConsumer::new("a").register(&pool);
        a.try_grow(600).unwrap();
        assert_eq!(df.reserved(), 600);
        let mut b = MemoryConsumer::new("b").register(&pool);
        assert!(b.try_grow(500).is_err(), "only 400 bytes are left");
        assert_eq!(df.reserved(), 600, "a refusal takes nothing");
        b.try_grow(400).unwrap();
        // Given back, kept for the working set (up to 500).
        a.shrink(100);
        assert_eq!((pool.reserved(), df.reserved()), (900, 1000));
        drop((a, b));
        assert_eq!((pool.reserved(), df.reserved()), (0, 500));
        drop(pool);
        assert_eq!(df.reserved(), 0);
    }

    #[test]
    fn what_the_working_set_gives_back_no_other_consumer_takes() {
        // A join planned for half a fair pool of 1000 bytes (keeping at most 250),
        // beside a sort that spills: the two spilling consumers share what the
        // unspillable ones leave.
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let join = DataFusionPool::new("join", &df).with_share(2);
        assert_eq!(join.kept_at_most, 500 / KEPT_SHARE_DIVISOR);
        let join: Arc<dyn MemoryPool> = Arc::new(join.keeping(250));
        let sort = DfConsumer::new("sort").with_can_spill(true).register(&df);
        let mut probe = MemoryConsumer::new("probe").register(&join);
        probe.try_grow(250).unwrap();
        sort.try_grow(375).unwrap();
        // A piece probed and released: the sort's share does not grow with it.
        probe.shrink(250);
        assert!(sort.try_grow(1).is_err(), "the 250 bytes kept are not free");
        assert_eq!(df.reserved(), 625);
        probe.try_grow(250).unwrap();
        assert_eq!(df.reserved(), 625, "served from what was kept");
        // Past what was kept, from the pool.
        probe.try_grow(100).unwrap();
        assert_eq!(df.reserved(), 725);
        // Spillable bytes borrow from what is kept, too: 500 bytes are past the
        // join's fair share ((1000 - 250) / 2 = 375 beside the 250 kept), not past
        // its planned 500.
        probe.shrink(350);
        let mut build = MemoryConsumer::new("build")
            .with_can_spill(true)
            .register(&join);
        build.try_grow(500).unwrap();
        assert_eq!(df.reserved(), 875);
        drop((probe, build));
        // What was borrowed goes back to what is kept, the rest to DataFusion.
        assert_eq!((join.reserved(), df.reserved()), (0, 625));
        drop(join);
        assert_eq!(df.reserved(), 375);
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
        drop((one, two));
        assert_eq!(df.reserved(), 0);
    }

    #[test]
    fn a_refused_fair_share_borrows_up_to_the_planned_share() {
        // Four spilling consumers share 1000 bytes (250 each); the join was planned
        // for half the pool.
        let df: Arc<dyn DfPool> = Arc::new(FairSpillPool::new(1000));
        let join: Arc<dyn MemoryPool> =
            Arc::new(DataFusionPool::new("join", &df).with_share(2).keeping(250));
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
        // Given back, the borrowed bytes stay kept for the join (up to 250); the
        // pool has no more.
        build.shrink(100);
        assert!(
            build.try_grow(150).is_err(),
            "100 bytes are kept, none free"
        );
        build.try_grow(100).unwrap();
        assert_eq!(df.reserved(), 1000);
        // Borrowed bytes go back first: the fair share is what stays held, and the
        // 200 borrowed are kept.
        build.shrink(300);
        assert_eq!(
            (build.size(), join.reserved(), df.reserved()),
            (150, 150, 900)
        );
        merge.free();
        build.try_grow(100).unwrap();
        assert_eq!(df.reserved(), 350, "borrowed from what was kept");
        drop(build);
        assert_eq!((join.reserved(), df.reserved()), (0, 200));
        drop(join);
        assert_eq!(df.reserved(), 0);
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
