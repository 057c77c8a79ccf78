//! Spill file throughput against plain file I/O of the same size.
//!
//! Data: ~64 MiB of batches of 8192 rows shaped like a join payload
//! (`int64 key, int64, int32, float64, utf8 5-25 chars, utf8 20-80 chars`,
//! 5% nulls outside the key), seeded. Throughput is the batches' in-memory
//! size (sum of their buffers) for the spill benches and the raw byte count
//! for the plain ones; the plain files are as large as the uncompressed
//! spill file, so `spill / plain` throughput is the cost of the format.
//!
//! - `write/{none,lz4,zstd}`: create a writer, write all batches, finish.
//! - `read/{buffered,mmap}/{none,lz4,zstd}`: open a reader, decode every
//!   batch and touch one byte of every 4 KiB of every buffer, so that mmap's
//!   deferred page faults are paid inside the measurement.
//! - `read_scan/{buffered,mmap}/none`: the same, reading every byte.
//! - `plain/write`: `BufWriter::write_all` of the same bytes in 1 MiB chunks.
//! - `plain/read`: `std::fs::read` of the uncompressed spill file (one
//!   fresh `Vec`, as a program that loads a file would).
//! - `plain/read_1MiB_chunks`: the same file streamed through one reused
//!   1 MiB buffer: the floor of any reader that copies.
//!
//! - `partitions/{own_files,group_of_2}`: what a join's level does under a small
//!   limit: 64 partitions, each written as its own stream in 2048-row batches,
//!   one batch of each in turn, then each read back and dropped; each stream in a
//!   file of its own (created and deleted) or all in a [`spilljoin_spill::SpillGroup`]
//!   of two shared files. Creating and deleting the files is measured here.
//!
//! Deleting the files is not measured elsewhere. Nothing is fsynced.
//!
//! Run: `cargo bench -p spilljoin-spill --bench spill_io`

use std::hint::black_box;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{
    Array, ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use spilljoin_spill::{
    SpillCompression, SpillConfig, SpillFile, SpillManager, SpillReadMode, SpillWriter,
};

const BATCH_ROWS: usize = 8192;
const TOTAL_BYTES: usize = 64 << 20;
const SEED: u64 = 0x5_9111;
const COMPRESSIONS: [SpillCompression; 3] = [
    SpillCompression::None,
    SpillCompression::Lz4,
    SpillCompression::Zstd,
];

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, false),
        Field::new("amount", DataType::Int64, true),
        Field::new("quantity", DataType::Int32, true),
        Field::new("price", DataType::Float64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("comment", DataType::Utf8, true),
    ]))
}

fn text(rng: &mut StdRng, min: usize, max: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "carefully",
        "final",
        "deposits",
        "sleep",
        "furiously",
        "pending",
        "requests",
        "ironic",
        "packages",
    ];
    let len = rng.random_range(min..=max);
    let mut s = String::with_capacity(len + 10);
    while s.len() < len {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        s.push(' ');
    }
    s.truncate(len);
    s
}

fn batch(rng: &mut StdRng) -> RecordBatch {
    let valid = |rng: &mut StdRng| rng.random_bool(0.95);
    let key = Int64Array::from_iter_values((0..BATCH_ROWS).map(|_| rng.random_range(0..1 << 40)));
    let amount: Int64Array = (0..BATCH_ROWS)
        .map(|_| valid(rng).then(|| rng.random()))
        .collect();
    let quantity: Int32Array = (0..BATCH_ROWS)
        .map(|_| valid(rng).then(|| rng.random_range(1..100)))
        .collect();
    let price: Float64Array = (0..BATCH_ROWS)
        .map(|_| valid(rng).then(|| rng.random_range(0.0..1e5)))
        .collect();
    let name: StringArray = (0..BATCH_ROWS)
        .map(|_| valid(rng).then(|| text(rng, 5, 25)))
        .collect();
    let comment: StringArray = (0..BATCH_ROWS)
        .map(|_| valid(rng).then(|| text(rng, 20, 80)))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(key),
        Arc::new(amount),
        Arc::new(quantity),
        Arc::new(price),
        Arc::new(name),
        Arc::new(comment),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}

fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            data.buffers().iter().map(|b| b.len()).sum::<usize>()
                + data.nulls().map_or(0, |n| n.buffer().len())
        })
        .sum()
}

fn batches() -> (Vec<RecordBatch>, u64) {
    let rng = &mut StdRng::seed_from_u64(SEED);
    let (mut out, mut bytes) = (Vec::new(), 0);
    while bytes < TOTAL_BYTES {
        let b = batch(rng);
        bytes += batch_bytes(&b);
        out.push(b);
    }
    (out, bytes as u64)
}

fn write_file(manager: &SpillManager, batches: &[RecordBatch]) -> SpillFile {
    let mut w = manager.create_writer(schema(), "bench").unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap()
}

/// Reads one byte per 4 KiB page (`step = 4096`) or every byte (`step = 1`)
/// of every buffer of the batch.
fn touch(batch: &RecordBatch, step: usize) -> u64 {
    let mut sum = 0u64;
    for c in batch.columns() {
        let data = c.to_data();
        for b in data
            .buffers()
            .iter()
            .chain(data.nulls().map(|n| n.buffer()))
        {
            sum += b
                .as_slice()
                .iter()
                .step_by(step)
                .map(|&x| x as u64)
                .sum::<u64>();
        }
    }
    sum
}

fn manager(compression: SpillCompression, mode: SpillReadMode) -> SpillManager {
    SpillManager::new(
        SpillConfig::default()
            .with_compression(compression)
            .with_read_mode(mode),
    )
    .unwrap()
}

fn bench_spill_io(c: &mut Criterion) {
    let (batches, in_memory_bytes) = batches();
    let plain_bytes = {
        let m = manager(SpillCompression::None, SpillReadMode::Buffered);
        let f = write_file(&m, &batches);
        for c in COMPRESSIONS {
            let m = manager(c, SpillReadMode::Buffered);
            let size = write_file(&m, &batches).bytes();
            eprintln!(
                "spill_io: {} batches, {in_memory_bytes} bytes in memory, {c}: file {size} bytes ({:.3}x)",
                batches.len(),
                size as f64 / in_memory_bytes as f64
            );
        }
        f.bytes()
    };

    let mut group = c.benchmark_group("write");
    group.throughput(Throughput::Bytes(in_memory_bytes));
    for compression in COMPRESSIONS {
        let m = manager(compression, SpillReadMode::Buffered);
        group.bench_function(compression.as_str(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let file = write_file(&m, &batches);
                    total += start.elapsed();
                    drop(file); // deletion not measured
                }
                total
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Bytes(in_memory_bytes));
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        for compression in COMPRESSIONS {
            let m = manager(compression, mode);
            let file = write_file(&m, &batches);
            group.bench_function(BenchmarkId::new(mode.as_str(), compression), |b| {
                b.iter(|| {
                    let mut sum = 0;
                    for batch in file.reader().unwrap() {
                        sum += touch(&batch.unwrap(), 4096);
                    }
                    black_box(sum)
                })
            });
        }
    }
    group.finish();

    // A consumer that reads every byte (hashing, gathering): mmap saves the
    // copy but reads from the page cache instead of a cache-hot copy.
    let mut group = c.benchmark_group("read_scan");
    group.throughput(Throughput::Bytes(in_memory_bytes));
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        let m = manager(SpillCompression::None, mode);
        let file = write_file(&m, &batches);
        group.bench_function(BenchmarkId::new(mode.as_str(), "none"), |b| {
            b.iter(|| {
                let mut sum = 0;
                for batch in file.reader().unwrap() {
                    sum += touch(&batch.unwrap(), 1);
                }
                black_box(sum)
            })
        });
    }
    group.finish();

    // A level's partitions: many streams of small batches, interleaved.
    let mut group = c.benchmark_group("partitions");
    const PARTITIONS: usize = 64;
    const PARTITION_ROWS: usize = 2048;
    let small: Vec<RecordBatch> = batches
        .iter()
        .flat_map(|b| {
            (0..b.num_rows() / PARTITION_ROWS)
                .map(move |i| b.slice(i * PARTITION_ROWS, PARTITION_ROWS))
        })
        .collect();
    group.throughput(Throughput::Bytes(in_memory_bytes));
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let level = |writers: Vec<SpillWriter>| {
        let mut writers = writers;
        for (i, b) in small.iter().enumerate() {
            writers[i % PARTITIONS].write(b).unwrap();
        }
        let files: Vec<SpillFile> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
        let mut sum = 0;
        for file in files {
            for batch in file.reader().unwrap() {
                sum += touch(&batch.unwrap(), 4096);
            }
        }
        black_box(sum)
    };
    group.bench_function("own_files", |b| {
        b.iter(|| {
            level(
                (0..PARTITIONS)
                    .map(|p| m.create_writer(schema(), &format!("p{p}")).unwrap())
                    .collect(),
            )
        })
    });
    group.bench_function("group_of_2", |b| {
        b.iter(|| {
            let files = m.create_group("level", 2);
            level(
                (0..PARTITIONS)
                    .map(|p| files.create_writer(schema(), p).unwrap())
                    .collect(),
            )
        })
    });
    group.finish();

    let mut group = c.benchmark_group("plain");
    group.throughput(Throughput::Bytes(plain_bytes));
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = {
        let rng = &mut StdRng::seed_from_u64(SEED);
        (0..plain_bytes).map(|_| rng.random()).collect()
    };
    let path = dir.path().join("plain.bin");
    group.bench_function("write", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
                for chunk in bytes.chunks(1 << 20) {
                    w.write_all(chunk).unwrap();
                }
                w.into_inner().unwrap();
                total += start.elapsed();
                std::fs::remove_file(&path).unwrap();
            }
            total
        })
    });
    std::fs::write(&path, &bytes).unwrap();
    group.bench_function("read", |b| {
        b.iter(|| black_box(std::fs::read(&path).unwrap().len()))
    });
    let mut chunk = vec![0u8; 1 << 20];
    group.bench_function("read_1MiB_chunks", |b| {
        b.iter(|| {
            let mut f = std::fs::File::open(&path).unwrap();
            let mut total = 0;
            loop {
                let n = std::io::Read::read(&mut f, &mut chunk).unwrap();
                if n == 0 {
                    break black_box(total);
                }
                total += n;
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_spill_io
}
criterion_main!(benches);
