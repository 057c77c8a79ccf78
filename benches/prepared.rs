//! One dimension table joined by ten fact-table probes: prepared once
//! ([`HashJoin::prepare`] + ten [`HashJoin::execute_prepared`]) versus rebuilt for each
//! probe (ten [`HashJoin::execute`]), in one run.
//!
//! The dimension (build, right input): 1M rows of `u64` key, `i64`, `f64` and a
//! 8-24 byte string. Each fact probe (left input): 1M rows of `u64` key (uniform over
//! the dimension's keys) and an `i64`. Inner join, two threads, 8192-row batches;
//! each output stream is drained and its rows summed. Throughput is probe rows.
//!
//! Run: `cargo bench --bench prepared`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::ArrowError;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spilljoin::{HashJoin, HashJoinBuilder, JoinType};

const DIM_ROWS: usize = 1 << 20;
const FACT_ROWS: usize = 1 << 20;
const PROBES: usize = 10;
const BATCH_ROWS: usize = 8192;

fn key_of(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn batches(columns: Vec<(&str, ArrayRef)>) -> Vec<RecordBatch> {
    let whole = RecordBatch::try_from_iter(columns).expect("batch");
    (0..whole.num_rows())
        .step_by(BATCH_ROWS)
        .map(|o| whole.slice(o, BATCH_ROWS.min(whole.num_rows() - o)))
        .collect()
}

fn dimension() -> Vec<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(1);
    let text = |rng: &mut StdRng| -> String {
        let len = rng.random_range(8..=24);
        (0..len)
            .map(|_| rng.random_range(b'a'..=b'z') as char)
            .collect()
    };
    batches(vec![
        (
            "d_key",
            Arc::new(UInt64Array::from_iter_values((0..DIM_ROWS).map(key_of))) as ArrayRef,
        ),
        (
            "d_i",
            Arc::new(Int64Array::from_iter_values(0..DIM_ROWS as i64)),
        ),
        (
            "d_f",
            Arc::new(Float64Array::from_iter_values(
                (0..DIM_ROWS).map(|i| i as f64 * 0.5),
            )),
        ),
        (
            "d_s",
            Arc::new(StringArray::from_iter_values(
                (0..DIM_ROWS).map(|_| text(&mut rng)),
            )),
        ),
    ])
}

fn fact(seed: u64) -> Vec<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let keys: Vec<u64> = (0..FACT_ROWS)
        .map(|_| key_of(rng.random_range(0..DIM_ROWS)))
        .collect();
    batches(vec![
        ("f_key", Arc::new(UInt64Array::from(keys)) as ArrayRef),
        (
            "f_v",
            Arc::new(Int64Array::from_iter_values(0..FACT_ROWS as i64)),
        ),
    ])
}

fn input(batches: &[RecordBatch]) -> Vec<Result<RecordBatch, ArrowError>> {
    batches.iter().cloned().map(Ok).collect()
}

fn drain(stream: spilljoin::JoinStream) -> usize {
    stream.map(|b| b.expect("output").num_rows()).sum()
}

fn prepared(c: &mut Criterion) {
    let dim = dimension();
    let facts: Vec<Vec<RecordBatch>> = (0..PROBES as u64).map(|s| fact(100 + s)).collect();
    let join: HashJoin =
        HashJoinBuilder::new(facts[0][0].schema(), dim[0].schema(), [("f_key", "d_key")])
            .with_join_type(JoinType::Inner)
            .with_threads(2)
            .build()
            .expect("join");
    let mut group = c.benchmark_group("dimension 1M x 10 fact probes of 1M");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements((PROBES * FACT_ROWS) as u64));
    group.bench_function("rebuilt for each probe", |b| {
        b.iter(|| {
            let rows: usize = facts
                .iter()
                .map(|f| drain(join.execute(input(f), input(&dim)).expect("execute")))
                .sum();
            black_box(rows)
        })
    });
    group.bench_function("prepared once", |b| {
        b.iter(|| {
            let build = join.prepare(input(&dim)).expect("prepare");
            let rows: usize = facts
                .iter()
                .map(|f| {
                    drain(
                        join.execute_prepared(build.clone(), input(f))
                            .expect("execute"),
                    )
                })
                .sum();
            black_box(rows)
        })
    });
    group.finish();
}

criterion_group!(benches, prepared);
criterion_main!(benches);
