//! Tests of the builder's validation and of the first level's fan-out
//! ([`partition_bits_for`]), on the figures of TPC-H inputs.

use std::sync::Arc;

use super::partition_bits::{one_level_need, ONE_LEVEL_SLACK};
use super::{
    partition_bits_for, HashJoinBuilder, InputStatistics, DEFAULT_PARTITION_BITS, SMALL_BUILD_ROWS,
};
use crate::context::MAX_DEPTH;
use crate::error::JoinError;
use crate::partition::MAX_PARTITION_BITS;

const MIB: usize = 1 << 20;

#[test]
fn a_max_depth_beyond_the_hash_bits_is_refused() {
    let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "k",
        arrow_schema::DataType::Int64,
        true,
    )]));
    let join = |depth| {
        HashJoinBuilder::new(Arc::clone(&schema), Arc::clone(&schema), [("k", "k")])
            .with_max_depth(depth)
            .build()
    };
    assert_eq!(join(0).map(|j| j.max_depth()).ok(), Some(0));
    assert_eq!(join(MAX_DEPTH).map(|j| j.max_depth()).ok(), Some(MAX_DEPTH));
    assert!(matches!(
        join(MAX_DEPTH + 1),
        Err(JoinError::InvalidJoin(_))
    ));
}

#[test]
fn a_small_build_known_by_its_rows_alone_is_one_partition() -> Result<(), JoinError> {
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("k", arrow_schema::DataType::Int64, true),
        arrow_schema::Field::new("s", arrow_schema::DataType::Utf8, true),
    ]));
    let join = |rows: u64, limit: Option<usize>, forced: bool| {
        let rows = InputStatistics::new(None, Some(rows));
        let mut builder =
            HashJoinBuilder::new(Arc::clone(&schema), Arc::clone(&schema), [("k", "k")])
                .with_statistics(rows, rows)
                .with_threads(2);
        if let Some(limit) = limit {
            builder =
                builder.with_memory_pool(Arc::new(spilljoin_memory::GreedyMemoryPool::new(limit)));
        }
        // (Not forced: also when the environment forces spilling.)
        builder = builder.with_force_spill(if forced { 0.5 } else { 0.0 });
        builder.build().map(|j| j.partition_bits())
    };
    // 10,000 rows are taken at 72 bytes: 720,000, which fits 8 MiB eight times over.
    assert_eq!(join(10_000, None, false)?, 0);
    assert_eq!(join(10_000, Some(8 * MIB), false)?, 0);
    assert_ne!(join(10_000, Some(4 * MIB), false)?, 0);
    assert_ne!(join(SMALL_BUILD_ROWS + 1, None, false)?, 0);
    // Forced spilling keeps partitions, some of which stay in memory.
    assert_eq!(join(10_000, None, true)?, DEFAULT_PARTITION_BITS);
    Ok(())
}

#[test]
fn partitions_are_as_many_as_one_level_needs_while_they_can_be_buffered() {
    // SF1 orders (34.7 MiB in memory) under 50%, 25%, 10%, 5% and 2.5%.
    let build = Some(36_375_008);
    let bits: Vec<u32> = [17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584]
        .iter()
        .map(|&limit| partition_bits_for(build, None, limit, 2, 8192))
        .collect();
    // 25%: a quarter of the limit buys the 64 partitions one level needs; 10%: half
    // of it buys 32; 5%: only 64 fit one level, each keeping 27 KiB of the limit;
    // 2.5%: 128 would be needed, with 7 KiB each: 4 partitions, split again.
    assert_eq!(bits, [5, 6, 5, 6, 2]);
    for (&b, limit) in bits.iter().zip([18.0, 9.0, 3.6, 1.8]) {
        let part = (36_375_008u64 >> b) as f64 * 3.0;
        assert!(part <= limit * 1e6, "{b} bits: {part} bytes at {limit} MB");
    }
    // No limit, or no size: the default.
    assert_eq!(
        partition_bits_for(build, Some(1_500_000), usize::MAX, 2, 8192),
        DEFAULT_PARTITION_BITS
    );
    assert_eq!(
        partition_bits_for(None, None, MIB, 2, 8192),
        DEFAULT_PARTITION_BITS
    );
    assert_eq!(
        partition_bits_for(None, Some(1_500_000), MIB, 2, 8192),
        DEFAULT_PARTITION_BITS
    );
    // A small build: one partition with no limit or a limit it fits eight times over,
    // the usual rule otherwise (and with only its rows known under a limit).
    let small = Some(SMALL_BUILD_ROWS);
    assert_eq!(partition_bits_for(None, small, usize::MAX, 2, 8192), 0);
    assert_eq!(
        partition_bits_for(Some(MIB as u64), small, 8 * MIB, 2, 8192),
        0
    );
    assert_ne!(
        partition_bits_for(Some(MIB as u64), small, 4 * MIB, 2, 8192),
        0
    );
    assert_ne!(partition_bits_for(None, small, 8 * MIB, 2, 8192), 0);
    let more = Some(SMALL_BUILD_ROWS + 1);
    assert_ne!(
        partition_bits_for(Some(MIB as u64), more, usize::MAX, 2, 8192),
        0
    );
    // Zero rows beside some bytes: sized by the bytes alone.
    let limits = [17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584];
    for limit in limits {
        assert_eq!(
            partition_bits_for(build, Some(0), limit, 2, 8192),
            partition_bits_for(build, None, limit, 2, 8192)
        );
    }
    // Absurd statistics do not overflow: no fan-out fits, the most is asked for
    // and then capped by what the limit can buffer.
    for limit in [1, 64 * 1024, MIB, 1 << 30] {
        let bits = partition_bits_for(Some(u64::MAX), Some(u64::MAX), limit, 2, 8192);
        assert!(bits <= MAX_PARTITION_BITS);
    }
    assert_eq!(
        partition_bits_for(Some(u64::MAX), Some(u64::MAX), 1 << 30, 2, 8192),
        MAX_PARTITION_BITS
    );
}

#[test]
fn known_rows_give_the_fewest_partitions_that_each_join_in_one_level() -> Result<(), String> {
    // (bytes, rows, limits, bits): SF1 orders (o_orderkey, o_totalprice) under
    // 50%, 25%, 10%, 5%, 2.5% of its Arrow bytes; SF10 orders under 25%, 10%, 5%;
    // SF10 `NOT IN`'s lineitem keys (one Int64 column) under 25%, 10%, 5%. Each
    // choice is the one measured fastest (BENCHMARKS.md), except SF1 at 2.5%, below
    // what one level can take at any fan-out the limit can buffer (as without rows).
    let cases: [(u64, u64, &[usize], &[u32]); 3] = [
        (
            36_375_008,
            1_500_000,
            &[17_991_680, 8_996_864, 3_599_360, 1_799_168, 899_584],
            &[4, 4, 5, 6, 2],
        ),
        (
            363_750_230,
            15_000_000,
            &[89_967_616, 35_986_432, 17_993_728],
            &[4, 5, 6],
        ),
        (
            68_529_312,
            8_566_164,
            &[17_131_520, 6_852_608, 3_426_304],
            &[5, 6, 7],
        ),
    ];
    for (bytes, rows, limits, want) in cases {
        let bits: Vec<u32> = limits
            .iter()
            .map(|&limit| partition_bits_for(Some(bytes), Some(rows), limit, 2, 8192))
            .collect();
        assert_eq!(bits, want, "{bytes} bytes, {rows} rows");
        // One fewer bit would not fit one level (where the limit allowed more).
        for (&b, &limit) in bits.iter().zip(limits) {
            if b > DEFAULT_PARTITION_BITS {
                let need = one_level_need(bytes >> (b - 1), rows >> (b - 1))
                    .ok_or_else(|| format!("{rows} rows in {b} bits fit no table"))?;
                assert!(need as f64 * ONE_LEVEL_SLACK > limit as f64);
            }
        }
    }
    Ok(())
}

#[test]
fn wide_rows_leave_the_probe_its_headroom_one_level_down() {
    // SF1 orders with every column (9 columns, four of them strings: 167 MB by its
    // Parquet statistics, 1.5M rows) under 25%, 10% and 5% of its Arrow bytes.
    // A level below takes up to half its limit for the probe's batches of these
    // wide rows; sized by the rows and table alone (the rule for narrow rows), 32
    // partitions looked joinable in one level at 5%, and each was split again: every
    // row written twice.
    let (bytes, rows) = (167_443_200, 1_500_000);
    let bits: Vec<u32> = [48_338_944, 19_334_144, 9_667_584]
        .iter()
        .map(|&limit| partition_bits_for(Some(bytes), Some(rows), limit, 2, 8192))
        .collect();
    assert_eq!(bits, [4, 5, 6]);
    let need = one_level_need(bytes >> 5, rows >> 5).unwrap_or(u64::MAX);
    assert!(need as f64 * ONE_LEVEL_SLACK <= 9_667_584.0);
    assert!(need > 9_667_584 / 2);
}
