//! The join under fuzzer-chosen data, join types, filters, memory limits, batch sizes,
//! fan-outs and threads, checked against the nested-loop reference join of the tests
//! (`tests/common`). Under a limit of at least 4 MiB the answers must be equal; below,
//! the join may also stop with `ResourcesExhausted`. Nothing may be left reserved.
//!
//! Run (stable toolchain):
//!
//! ```text
//! cd fuzz
//! RUSTC_BOOTSTRAP=1 cargo fuzz run join -- -max_total_time=300 -timeout=30
//! ```

#![no_main]

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use libfuzzer_sys::fuzz_target;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoinBuilder, JoinError, JoinType, NullEquality};

#[path = "../../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;

const FLOOR_BYTES: usize = 4 << 20;
const LIMITS: [usize; 6] = [32 << 10, 128 << 10, 512 << 10, FLOOR_BYTES, 16 << 20, usize::MAX];

/// Reads bytes one at a time, zero when they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

fn side(bytes: &mut Bytes, prefix: &str, rows: usize, domain: u8) -> RecordBatch {
    let (mut k, mut v) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for _ in 0..rows {
        let b = bytes.next();
        k.push((b < 240).then_some((b % domain.max(1)) as i64));
        let c = bytes.next();
        v.push((c < 230).then_some((c % 16) as i64));
    }
    RecordBatch::try_from_iter(vec![
        (format!("{prefix}k"), Arc::new(Int64Array::from(k)) as ArrayRef),
        (format!("{prefix}v"), Arc::new(Int64Array::from(v)) as ArrayRef),
    ])
    .expect("two int64 columns")
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let join_type = JoinType::ALL[bytes.next() as usize % JoinType::ALL.len()];
    let flags = bytes.next();
    let null_aware = join_type.is_null_aware();
    let filter = !null_aware && flags & 1 != 0;
    let null_equality = if !null_aware && flags & 2 != 0 {
        NullEquality::NullEqualsNull
    } else {
        NullEquality::NullEqualsNothing
    };
    let threads = 1 + (flags >> 2) as usize % 3;
    let force = [0.0, 0.0, 0.5, 1.0][(flags >> 4) as usize % 4];
    let force_depth = [0, 0, 1, spilljoin::MAX_DEPTH][(flags >> 6) as usize];
    let limit = LIMITS[bytes.next() as usize % LIMITS.len()];
    // At least 8 rows a batch, and sides of at most 255 rows: a hot key at batch size
    // 1 made units of 300k one-row batches, too slow to fuzz (a size, not a bug).
    let batch_size = 8 + bytes.next() as usize % 64;
    let bits = bytes.next() as u32 % 7;
    let domain = 1 + bytes.next() % 32;
    let (ln, rn) = (bytes.next() as usize, bytes.next() as usize);
    let left = side(&mut bytes, "l", ln, domain);
    let right = side(&mut bytes, "r", rn, domain);

    let expected = common::reference_join(&left, &right, &[(0, 0)], join_type, filter, null_equality);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
    let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(join_type)
        .with_null_equality(null_equality)
        .with_memory_pool(Arc::clone(&pool))
        .with_batch_size(batch_size)
        .with_threads(threads)
        .with_partition_bits(bits)
        .with_force_spill(force)
        .with_force_spill_depth(force_depth);
    if filter {
        builder = builder.with_filter(common::less_than_filter(&left.schema(), &right.schema()));
    }
    let join = builder.build().expect("a valid join");
    let slices = |b: &RecordBatch| -> Vec<Result<RecordBatch, arrow_schema::ArrowError>> {
        (0..b.num_rows()).step_by(37).map(|o| Ok(b.slice(o, 37.min(b.num_rows() - o)))).collect()
    };
    let result: Result<Vec<RecordBatch>, JoinError> =
        join.execute(slices(&left), slices(&right)).expect("the join starts").collect();
    match result {
        Ok(batches) => assert_eq!(common::rendered_rows(&batches), expected),
        Err(JoinError::ResourcesExhausted { .. }) if limit < FLOOR_BYTES => {}
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(pool.reserved(), 0);
});
