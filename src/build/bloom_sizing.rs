//! How large the bloom filters of spilled partitions are when the build's rows are
//! known before it is read, and the memory set aside for them before the pool fills.
//! Its own file because the sizing is a formula of the limit, the statistics and the
//! fan-out that the rest of the build only reads (`BuildCollector::blooms`).

use spilljoin_memory::MemoryReservation;

use crate::bloom::Bloom;
use crate::context::Level;
use crate::plan::JoinPlan;

/// The filters' share of the memory limit, at most: a filter skips writing, reading
/// and probing again the probe rows without a partner, and is switched off by the
/// probe where it skips too few.
const BLOOM_LIMIT_SHARE: usize = 4;

/// The fewest bits per expected row worth a filter: with fewer, the filters skip
/// almost no probe rows, while every spilled build row is still inserted and the
/// probe's trial still looks rows up. Below this, no partition gets one.
const MIN_BLOOM_BITS_PER_ROW: usize = 1;

/// How large the bloom filter of each spilled partition of level 0 is, when the
/// build's rows are known before it is read (statistics,
/// [`JoinPlan::build_rows_hint`]): sized for the rows a
/// partition will hold in the end, not for twice those it holds when it spills (a
/// partition may spill holding a small part of its rows), and
/// reserved before the pool fills for the partitions expected to spill.
#[derive(Debug, Clone, Copy)]
pub(super) struct BloomSizing {
    /// Each filter's bytes: [`BITS_PER_ROW`](crate::bloom::BITS_PER_ROW) bits for
    /// each of a partition's expected rows, or the limit's share divided among the
    /// partitions expected to spill (all of it when none is expected), whichever is
    /// smaller; at least 1 KiB, at most 1 MiB. 0 when the limit's share gives fewer
    /// than [`MIN_BLOOM_BITS_PER_ROW`] bits a row: no partition gets a filter.
    pub(super) bytes: usize,
    /// Partitions expected to spill: those that a quarter of the limit (the rest is
    /// for tables, buffers and the probe's headroom) cannot hold.
    pub(super) prepaid: usize,
}

impl BloomSizing {
    pub(super) fn new(plan: &JoinPlan, level: &Level, widths: Option<&[usize]>) -> Option<Self> {
        let limit = plan.pool.limit().bytes();
        if limit == usize::MAX || limit == 0 {
            return None;
        }
        // Level 0 only: below it, a pair that did not split (one key holds most of
        // it) would keep a quarter of the limit from the chunks of its fallback,
        // which then take several times longer.
        if level.depth > 0 {
            return None;
        }
        let rows = plan.build_rows_hint?;
        let fan_out = level.bits.fan_out();
        if rows == 0 || fan_out < 2 {
            return None;
        }
        let row_bytes = widths.map_or(32, |widths| widths.iter().sum::<usize>()) as u64;
        let bytes = plan
            .build_bytes_hint
            .unwrap_or(rows.saturating_mul(row_bytes));
        let kept = (limit / 4) as f64 / bytes.max(1) as f64;
        let prepaid = ((1.0 - kept).max(0.0) * fan_out as f64).ceil() as usize;
        let budget = limit / BLOOM_LIMIT_SHARE / prepaid.max(1);
        let rows_each = usize::try_from(rows.div_ceil(fan_out as u64)).unwrap_or(usize::MAX);
        let bytes = Bloom::bytes_within(rows_each, budget);
        // (The limit's share, not the filter's bytes, which a partition of more than
        // 8Mi rows finds capped at 1 MiB whatever the limit.)
        if budget.max(bytes).saturating_mul(8) < rows_each.saturating_mul(MIN_BLOOM_BITS_PER_ROW) {
            // Too few bits to skip much: no filters at all.
            return Some(Self {
                bytes: 0,
                prepaid: 0,
            });
        }
        Some(Self { bytes, prepaid })
    }

    /// The memory set aside for the filters of the partitions expected to spill
    /// (`CollectorState::bloom_reserve`), from `base`'s consumer: as many whole
    /// filters as the pool grants (a limit shared with other pairs may grant fewer);
    /// the others are reserved when their partitions spill, if memory allows then.
    pub(super) fn set_aside(sizing: Option<Self>, base: &MemoryReservation) -> MemoryReservation {
        let mut bloom_reserve = base.new_empty();
        if let Some(sizing) = sizing {
            let mut count = sizing.prepaid;
            while count > 0 && bloom_reserve.try_grow(sizing.bytes * count).is_err() {
                count /= 2;
            }
        }
        bloom_reserve
    }
}
