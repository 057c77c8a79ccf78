//! Behaviour of the pools and reservations, single- and multi-threaded.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use spilljoin_memory::{
    FairSpillPool, GreedyMemoryPool, MemoryConsumer, MemoryError, MemoryLimit, MemoryPool,
    TrackConsumersPool, UnboundedMemoryPool,
};

fn pools(limit: usize) -> Vec<Arc<dyn MemoryPool>> {
    vec![
        Arc::new(GreedyMemoryPool::new(limit)),
        Arc::new(FairSpillPool::new(limit)),
        tracking_pool(limit, 3),
    ]
}

/// A tracking pool over a greedy pool of `limit` bytes, naming `top` consumers.
fn tracking_pool(limit: usize, top: usize) -> Arc<TrackConsumersPool<GreedyMemoryPool>> {
    Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(limit),
        NonZeroUsize::new(top).unwrap(),
    ))
}

#[test]
fn greedy_error_carries_the_numbers() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(100));
    let mut a = MemoryConsumer::new("build partitions").register(&pool);
    a.try_grow(70).unwrap();
    let err = a.try_grow(40).unwrap_err();
    let MemoryError::ResourcesExhausted {
        consumer,
        requested_bytes,
        available_bytes,
        limit_bytes,
        top_consumers,
    } = err.clone()
    else {
        unreachable!()
    };
    assert_eq!(consumer, "build partitions");
    assert_eq!(
        (requested_bytes, available_bytes, limit_bytes),
        (40, 30, 100)
    );
    assert!(top_consumers.is_empty());
    assert_eq!(
        err.to_string(),
        "resources exhausted: build partitions failed to reserve 40 bytes, 30 of 100 bytes available"
    );
    assert_eq!(
        a.size(),
        70,
        "a refused grow leaves the reservation unchanged"
    );
    assert_eq!(pool.reserved(), 70);
}

#[test]
fn tracking_pool_names_the_largest_consumers() {
    let tracking = tracking_pool(1000, 2);
    let pool: Arc<dyn MemoryPool> = tracking.clone();
    let mut small = MemoryConsumer::new("small").register(&pool);
    let mut big = MemoryConsumer::new("big").register(&pool);
    let mut mid = MemoryConsumer::new("mid").register(&pool);
    small.try_grow(100).unwrap();
    big.try_grow(500).unwrap();
    mid.try_grow(300).unwrap();
    let err = small.try_grow(200).unwrap_err();
    let MemoryError::ResourcesExhausted { top_consumers, .. } = &err else {
        unreachable!()
    };
    let names: Vec<&str> = top_consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["big", "mid"]);
    let message = err.to_string();
    assert!(message.contains("largest consumers: big#"), "{message}");
    assert!(message.contains("500 bytes"), "{message}");
    assert_eq!(tracking.peak_reserved(), 900);
    big.shrink(400);
    assert_eq!(tracking.peak_of(big.consumer().id()), Some(500));
    drop((small, big, mid));
    assert_eq!(pool.reserved(), 0);
    assert!(
        tracking.top_consumers().is_empty(),
        "dropped consumers are unregistered"
    );
    assert_eq!(tracking.peak_reserved(), 900);
}

#[test]
fn fair_pool_gives_spillable_consumers_equal_shares() {
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(1000));
    let mut fixed = MemoryConsumer::new("unspillable").register(&pool);
    fixed.try_grow(200).unwrap();
    let mut a = MemoryConsumer::new("a")
        .with_can_spill(true)
        .register(&pool);
    let mut b = MemoryConsumer::new("b")
        .with_can_spill(true)
        .register(&pool);
    // (1000 - 200) / 2 = 400 each.
    a.try_grow(400).unwrap();
    let err = a.try_grow(1).unwrap_err();
    assert_eq!(err.requested_bytes(), 1);
    let MemoryError::ResourcesExhausted {
        available_bytes, ..
    } = err
    else {
        unreachable!()
    };
    assert_eq!(available_bytes, 0);
    // b finds its share even though a asked first.
    b.try_grow(400).unwrap();
    assert!(b.try_grow(1).is_err());
    // When b goes away, a may take the whole spillable part.
    drop(b);
    a.try_grow(400).unwrap();
    assert_eq!(pool.reserved(), 1000);
    // Unspillable consumers are refused only by the total.
    assert!(fixed.try_grow(1).is_err());
    a.shrink(100);
    fixed.try_grow(100).unwrap();
}

#[test]
fn reservation_split_take_merge_resize() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(100));
    let mut r = MemoryConsumer::new("r").register(&pool);
    r.try_resize(60).unwrap();
    assert_eq!(r.size(), 60);
    let mut part = r.split(20);
    assert_eq!((r.size(), part.size(), pool.reserved()), (40, 20, 60));
    let all = part.take();
    assert_eq!((part.size(), all.size()), (0, 20));
    r.merge(all);
    assert_eq!(r.size(), 60);
    assert!(r.try_resize(101).is_err());
    assert_eq!(r.size(), 60);
    r.try_resize(10).unwrap();
    assert_eq!(pool.reserved(), 10);
    assert_eq!(r.free(), 10);
    assert_eq!(pool.reserved(), 0);
    // grow ignores the limit, for memory that exists already.
    r.grow(150);
    assert_eq!(pool.reserved(), 150);
    drop(r);
    assert_eq!(pool.reserved(), 0);
}

#[test]
#[should_panic(expected = "cannot shrink")]
fn shrinking_more_than_held_is_a_bug() {
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::new());
    let mut r = MemoryConsumer::new("r").register(&pool);
    r.try_grow(5).unwrap();
    r.shrink(6);
}

#[test]
fn unbounded_pool_counts() {
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::new());
    assert_eq!(pool.limit(), MemoryLimit::Infinite);
    let mut r = MemoryConsumer::new("r").register(&pool);
    r.try_grow(usize::MAX / 2).unwrap();
    assert_eq!(pool.reserved(), usize::MAX / 2);
    drop(r);
    assert_eq!(pool.reserved(), 0);
}

/// Eight threads grow and shrink reservations of one pool as fast as they can; a
/// watcher thread checks the total never exceeds the limit, and everything returns to
/// zero at the end.
#[test]
fn concurrent_threads_never_exceed_the_limit() {
    const LIMIT: usize = 10_000;
    for pool in pools(LIMIT) {
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (pool, done) = (Arc::clone(&pool), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut max_seen = 0;
                while !done.load(Ordering::Relaxed) {
                    max_seen = max_seen.max(pool.reserved());
                }
                max_seen
            })
        };
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let mut r = MemoryConsumer::new(format!("worker {t}"))
                        .with_can_spill(t % 2 == 0)
                        .register(&pool);
                    let (mut granted, mut refused) = (0u32, 0u32);
                    for i in 0..20_000usize {
                        let bytes = (i * 7919 + t * 31) % 997 + 1;
                        if r.try_grow(bytes).is_ok() {
                            granted += 1;
                            assert!(pool.reserved() <= LIMIT);
                        } else {
                            refused += 1;
                            r.shrink(r.size() / 2);
                        }
                    }
                    (granted, refused)
                })
            })
            .collect();
        let mut refused_total = 0;
        for w in workers {
            let (granted, refused) = w.join().unwrap();
            assert!(granted > 0);
            refused_total += refused;
        }
        done.store(true, Ordering::Relaxed);
        let max_seen = watcher.join().unwrap();
        assert!(refused_total > 0, "the test must actually hit the limit");
        assert!(max_seen <= LIMIT, "{pool:?} went to {max_seen}");
        assert_eq!(pool.reserved(), 0, "{pool:?} did not return to zero");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Grow(usize, usize),
    Shrink(usize, usize),
    Free(usize),
    Resize(usize, usize),
    Drop(usize),
    Register(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4usize, 0..400usize).prop_map(|(r, b)| Op::Grow(r, b)),
        (0..4usize, 0..400usize).prop_map(|(r, b)| Op::Shrink(r, b)),
        (0..4usize).prop_map(Op::Free),
        (0..4usize, 0..600usize).prop_map(|(r, b)| Op::Resize(r, b)),
        (0..4usize).prop_map(Op::Drop),
        any::<bool>().prop_map(Op::Register),
    ]
}

proptest! {
    /// Random sequences of operations on several reservations: the pool's total is
    /// always the sum of the reservations, never above the limit, and the greedy pool
    /// refuses exactly when the model says the limit would be passed.
    #[test]
    fn random_grow_shrink_sequences_keep_the_books(ops in proptest::collection::vec(op(), 1..200), limit in 0..2000usize) {
        for (kind, pool) in pools(limit).into_iter().enumerate() {
            let mut reservations = Vec::new();
            for op in &ops {
                match *op {
                    Op::Register(can_spill) => reservations.push(
                        MemoryConsumer::new("c").with_can_spill(can_spill).register(&pool)),
                    Op::Grow(i, bytes) => if let Some(r) = reservations.get_mut(i) {
                        let before = pool.reserved();
                        let fits = before + bytes <= limit;
                        match r.try_grow(bytes) {
                            Ok(()) => prop_assert!(fits),
                            // The greedy pools refuse only when it does not fit; the
                            // fair pool may refuse earlier, to keep shares.
                            Err(_) => prop_assert!(!fits || kind == 1),
                        }
                    },
                    Op::Shrink(i, bytes) => if let Some(r) = reservations.get_mut(i) {
                        r.shrink(bytes.min(r.size()));
                    },
                    Op::Free(i) => if let Some(r) = reservations.get_mut(i) { r.free(); },
                    Op::Resize(i, bytes) => if let Some(r) = reservations.get_mut(i) {
                        let old = r.size();
                        if r.try_resize(bytes).is_ok() {
                            prop_assert_eq!(r.size(), bytes);
                        } else {
                            prop_assert_eq!(r.size(), old);
                        }
                    },
                    Op::Drop(i) => if i < reservations.len() { reservations.remove(i); },
                }
                let sum: usize = reservations.iter().map(|r| r.size()).sum();
                prop_assert_eq!(pool.reserved(), sum);
                prop_assert!(sum <= limit);
            }
            drop(reservations);
            prop_assert_eq!(pool.reserved(), 0);
        }
    }
}

/// Asking for no bytes always succeeds and changes nothing, even while a forced
/// `grow` has taken the pool past its limit.
#[test]
fn growing_by_nothing_always_succeeds() {
    for pool in pools(100) {
        let mut r = MemoryConsumer::new("r").register(&pool);
        r.grow(150);
        assert!(r.try_grow(1).is_err(), "{pool:?}");
        r.try_grow(0).unwrap();
        r.grow(0);
        r.shrink(0);
        assert_eq!((r.size(), pool.reserved()), (150, 150), "{pool:?}");
        r.shrink(150);
        assert_eq!(pool.reserved(), 0, "{pool:?}");
    }
}

/// Threads grow and shrink reservations of one consumer and of their own at once
/// through a tracking pool: every consumer's count returns to zero, the peaks are
/// what was held at once at the most, and an error taken on the way names sizes that
/// were really held.
#[test]
fn tracking_pool_counts_concurrent_reservations_exactly() {
    const THREADS: usize = 4;
    const HELD: usize = 100;
    let tracking = tracking_pool(THREADS * 2 * HELD, 8);
    let pool: Arc<dyn MemoryPool> = tracking.clone();
    let shared = MemoryConsumer::new("shared").register(&pool);
    let shared_id = shared.consumer().id();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (pool, mut mine) = (&pool, shared.new_empty());
            scope.spawn(move || {
                let mut own = MemoryConsumer::new(format!("own {t}")).register(pool);
                for i in 0..20_000usize {
                    let bytes = (i * 7919 + t * 31) % HELD + 1;
                    mine.try_grow(bytes).unwrap();
                    own.try_grow(bytes).unwrap();
                    mine.shrink(bytes);
                    own.shrink(bytes);
                }
            });
        }
    });
    assert_eq!(pool.reserved(), 0);
    let peak = tracking.peak_reserved();
    assert!(
        (2 * HELD..=THREADS * 2 * HELD).contains(&peak),
        "peak {peak}"
    );
    let shared_peak = tracking.peak_of(shared_id).unwrap();
    assert!(
        (HELD..=THREADS * HELD).contains(&shared_peak),
        "{shared_peak}"
    );
    let mut big = shared.new_empty();
    big.try_grow(THREADS * 2 * HELD).unwrap();
    let MemoryError::ResourcesExhausted { top_consumers, .. } = MemoryConsumer::new("late")
        .register(&pool)
        .try_grow(1)
        .unwrap_err()
    else {
        unreachable!()
    };
    let held: Vec<(&str, usize)> = top_consumers
        .iter()
        .map(|c| (c.name.as_str(), c.reserved_bytes))
        .collect();
    assert_eq!(held[0], ("shared", THREADS * 2 * HELD), "{held:?}");
    assert!(held[1..].iter().all(|&(_, bytes)| bytes == 0), "{held:?}");
    assert_eq!(tracking.peak_reserved(), THREADS * 2 * HELD);
}

/// A consumer registered twice (a clone, the same id) counts once, and its count
/// never wraps below zero, whichever registration grows or shrinks first.
#[test]
fn tracking_pool_counts_a_consumer_registered_twice() {
    let tracking = tracking_pool(1000, 4);
    let pool: Arc<dyn MemoryPool> = tracking.clone();
    let consumer = MemoryConsumer::new("twice");
    let mut first = consumer.clone().register(&pool);
    first.try_grow(100).unwrap();
    let mut second = consumer.register(&pool);
    second.try_grow(50).unwrap();
    assert_eq!(tracking.top_consumers()[0].reserved_bytes, 150);
    first.shrink(100);
    assert_eq!(tracking.top_consumers()[0].reserved_bytes, 50);
    drop(first);
    second.shrink(50);
    let held: Vec<usize> = tracking
        .top_consumers()
        .iter()
        .map(|c| c.reserved_bytes)
        .collect();
    assert!(held.iter().all(|&bytes| bytes == 0), "{held:?}");
    assert_eq!(pool.reserved(), 0);
}
