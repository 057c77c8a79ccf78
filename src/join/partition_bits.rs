//! The fan-out of the first partitioning level: [`partition_bits_for`], the rule
//! that turns the build's expected size and the memory limit into radix bits, and
//! the constants it is calibrated with.
//!
//! Its own file because the rule is a model of the join's memory and cost of its
//! own (what one level below can take, what a spilled partition buffers), apart
//! from the builder that applies it.

use crate::partition::MAX_PARTITION_BITS;
use crate::plan::{work_rows_for, ProbeShape};

/// The default radix bits of the first partitioning level (16 partitions): enough
/// partitions for every thread to build tables in parallel, few enough that the
/// per-partition fragments of a batch stay hundreds of rows long.
pub const DEFAULT_PARTITION_BITS: u32 = 4;

/// The most build rows joined in one partition, with no radix bits, when the build is
/// expected to fit its limit eight times over (or there is no limit): partitions would
/// only cut every probe batch into fragments, each row hashed and grouped, to build
/// tables of a few thousand rows each in parallel. (TPC-H Q11 at SF1 through
/// DataFusion: joins of 1 and 10,000 build rows against 800,000 probe rows.)
pub const SMALL_BUILD_ROWS: u64 = 1 << 16;

/// The radix bits of the first partitioning level, from the build's expected size
/// (bytes in memory and, when known, rows), the memory limit, the threads and the
/// batch size (what the probe's batches take).
///
/// Partitions that spill are joined one at a time at the next level, so the fewest
/// partitions that can each be joined there in one piece are best: every further
/// partition cuts each build and probe batch into one more fragment, one more
/// buffer to fill and write, and one more file. Fewer than that, and the
/// partitions spill again one level down, which costs more than the fragments: every
/// row is written once more.
///
/// With the build's rows known, a partition of `r` rows and `n` bytes is taken to
/// need `n + 8r` (its rows and their hashes) plus its table
/// ([`ChainedTable::size_for`](crate::table::ChainedTable::size_for)), and one
/// level to hold it with a quarter to spare for the probe's batches:
/// `b` is the smallest number of bits, at least [`DEFAULT_PARTITION_BITS`], for
/// which `1.25 ×` that need fits the limit, or [`MAX_PARTITION_BITS`] when none
/// does (the partitions are split again one level down). The `1.25` is calibrated
/// on TPC-H joins (partitions of orders and of `NOT IN`'s one-column lineitem keys):
/// it lies between the limit-over-need ratios of those that went two levels deep
/// and of those that stayed in one. The need must also fit beside the probe's
/// headroom one level down (`ProbeShape::workers_headroom`, for probe batches
/// taken as wide as build rows): negligible for narrow rows, up to half the limit
/// for wide ones (SF1 orders with every column under 5%: 32 partitions passed the
/// slack and were each split again one level down; 64 are joined in one).
/// With only the bytes known, a partition is taken to need three times its bytes
/// and `b = ceil(log2(8 × build / limit))` (the rule before rows were known,
/// conservative for the wide rows that need less).
///
/// Either way, no more than a quarter of the limit can buffer (about 32 KiB per
/// spilled partition), or half when only that many partitions can each be joined in
/// one level (a 34 MiB build under a 3.4 MiB limit: 16 partitions too large for one
/// level, every row written twice; 32 that fit), or as many as each keep 16 KiB of
/// the whole limit when only that many can (the same build under 1.7 MiB: 64
/// partitions, not 8 split again). A build that fits eight times over gets two
/// partitions per thread (at most [`DEFAULT_PARTITION_BITS`] bits), and one of at most
/// [`SMALL_BUILD_ROWS`] rows one partition. Otherwise unknown sizes or no limit give
/// the default; a partition that still does not fit is split again at the next level.
pub fn partition_bits_for(
    build_size_hint_bytes: Option<u64>,
    build_rows_hint: Option<u64>,
    limit_bytes: usize,
    threads: usize,
    batch_size: usize,
) -> u32 {
    let unlimited = limit_bytes == usize::MAX || limit_bytes == 0;
    let fits_eight_times = |build: u64| build.saturating_mul(8) <= limit_bytes as u64;
    if build_rows_hint.is_some_and(|rows| rows > 0 && rows <= SMALL_BUILD_ROWS)
        && (unlimited || build_size_hint_bytes.is_some_and(fits_eight_times))
    {
        return 0;
    }
    let Some(build) = build_size_hint_bytes else {
        return DEFAULT_PARTITION_BITS;
    };
    if unlimited {
        return DEFAULT_PARTITION_BITS;
    }
    let ratio = 8.0 * build as f64 / limit_bytes as f64;
    if ratio <= 1.0 {
        // The build fits eight times over: partitions only need to keep every thread
        // busy building tables. Fewer, larger fragments cut the scatter's
        // per-fragment overhead.
        return (threads.max(1).next_power_of_two().ilog2() + 1).min(DEFAULT_PARTITION_BITS);
    }
    // (No rows at all beside some bytes is not a count to size by.)
    let build_rows_hint = build_rows_hint.filter(|&rows| rows > 0);
    // What the probe one level below leaves its partition's rows and table.
    let room = match build_rows_hint {
        Some(rows) => limit_bytes.saturating_sub(probe_headroom(
            build / rows,
            limit_bytes,
            threads,
            batch_size,
        )) as u64,
        None => 0,
    };
    // Whether a partition of the build fits one level below.
    let one_level = |bits: u32| match build_rows_hint {
        Some(rows) => one_level_need(build >> bits, rows >> bits).is_some_and(|need| {
            need as f64 * ONE_LEVEL_SLACK <= limit_bytes as f64 && need <= room
        }),
        None => (build >> bits) as f64 * 3.0 <= limit_bytes as f64,
    };
    let wanted = match build_rows_hint {
        Some(_) => (DEFAULT_PARTITION_BITS..MAX_PARTITION_BITS)
            .find(|&bits| one_level(bits))
            .unwrap_or(MAX_PARTITION_BITS),
        None => (ratio.log2().ceil() as u32).clamp(DEFAULT_PARTITION_BITS, MAX_PARTITION_BITS),
    };
    // Every spilled partition keeps a few pieces per side in memory; under a tiny
    // limit, fewer partitions (split again at the next level) beat many that cannot
    // all be buffered — a quarter of the limit buys buffers. More where that is what
    // lets the partitions be joined in one level: half of the limit, or all of it
    // while each partition still gets `MIN_ONE_LEVEL_SHARE`, since writing every row
    // once more costs more than writing it in smaller pieces.
    let affordable = |share: usize| {
        (limit_bytes / (share * PER_PARTITION_SPILL_BYTES))
            .max(4)
            .ilog2()
    };
    let quarter = wanted.min(affordable(4));
    let whole = wanted.min((limit_bytes / MIN_ONE_LEVEL_SHARE).max(4).ilog2());
    [quarter, wanted.min(affordable(2)), whole]
        .into_iter()
        .find(|&bits| one_level(bits))
        .unwrap_or(quarter)
}

/// The probe's headroom ([`ProbeShape::workers_headroom`]) one level below, for
/// build rows of `row_bytes` (probe rows taken as a variable-width spill row, as the
/// build takes them before it has seen them): what the build leaves free there.
fn probe_headroom(row_bytes: u64, limit_bytes: usize, threads: usize, batch_size: usize) -> usize {
    let row_bytes = usize::try_from(row_bytes).unwrap_or(usize::MAX);
    let work_rows = work_rows_for(batch_size, limit_bytes, threads);
    let shape = ProbeShape {
        limit: limit_bytes,
        threads,
        work_rows,
        batch_size,
    };
    shape.workers_headroom(work_rows.saturating_mul(row_bytes), row_bytes, 32)
}

/// What joining a partition of `rows` rows and `bytes` bytes in one piece is taken to
/// need, before [`ONE_LEVEL_SLACK`]: its rows, their hashes and its table; `None`
/// when one table cannot index that many rows.
pub(super) fn one_level_need(bytes: u64, rows: u64) -> Option<u64> {
    let rows_each = usize::try_from(rows)
        .ok()
        .filter(|&r| r <= crate::table::MAX_TABLE_ROWS)?;
    Some(
        bytes
            .saturating_add(rows.saturating_mul(8))
            .saturating_add(crate::table::ChainedTable::size_for(rows_each) as u64),
    )
}

/// How much more than a partition's rows, hashes and table the level below is taken
/// to need to join it in one piece (the probe's batches, the output): see
/// [`partition_bits_for`].
pub(super) const ONE_LEVEL_SLACK: f64 = 1.25;

/// What one spilled partition holds in memory while it is written, at most: the
/// pieces of its build and probe rows waiting to be written.
const PER_PARTITION_SPILL_BYTES: usize = 32 * 1024;

/// The least of the limit each partition is left when more partitions are what
/// lets a build be joined in one level.
const MIN_ONE_LEVEL_SHARE: usize = 16 * 1024;
