//! The spill path's kernels per payload layout, in bytes per second.
//!
//! Every payload a join spills goes through the same three steps: its rows are
//! gathered, a partition's at a time, into compact buffers ([`GatherBuffer`]); the
//! gathered batches are written to a spill file; the file is read back. Each is
//! measured here for one column of each layout beside an `Int64` key (2^18 rows,
//! seeded):
//!
//! - `utf8 short` (0-12 bytes), `utf8 long` (40-120), `utf8view short` (inline in
//!   their views), `utf8view long`, `largeutf8` (20-80), `binary` (10-60),
//!   `dict utf8` (`Dictionary<Int32, Utf8>` of 1,000 values of 20-40 bytes),
//!   `utf8 nullable` (20-80, a fifth null), `int64` (for scale), and `wide` (24
//!   columns: eight each of `Int64`, `Utf8` 8-24 and `Utf8View` 30-60).
//!
//! Kernels:
//! - `gather/{layout}`: the rows in 16 partitions by `key % 16`, gathered into
//!   16 buffers a 4096-row input batch at a time, then finished into batches;
//! - `spill gather/{layout}`: as the probe gathers the rows of spilled partitions:
//!   64 partitions by `key % 64`, 8192-row input batches, into buffers of a spill
//!   file's schema (`spilljoin::spill::file_schema`: view columns as offsets) that
//!   are finished every 1,024 rows and then expect that many (the partitioning is
//!   done before the clock starts);
//! - `write/{layout}`: 8192-row batches written to a spill file (uncompressed);
//!   the batches are `take`s from the whole column in random order, as a join's
//!   partition fragments were: their view and dictionary columns share the whole
//!   column's buffers, which the writer compacts;
//! - `read/{layout}`: that file read back as the join does (`SpillFile::reader`,
//!   not validated again), every batch decoded.
//!
//! Throughput is the rows' compact Arrow bytes (offsets or views, the value bytes
//! views do not inline, dictionary keys and values once, validity).
//!
//! Run: `cargo bench --bench payloads`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::StringViewBuilder;
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, DictionaryArray, Int64Array, LargeStringArray, RecordBatch,
    StringArray, UInt32Array,
};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use spilljoin::gather::GatherBuffer;
use spilljoin::spill::{SpillConfig, SpillManager};

const ROWS: usize = 1 << 18;

fn text(rng: &mut StdRng, min: usize, max: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let len = rng.random_range(min..=max);
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn utf8(rng: &mut StdRng, min: usize, max: usize, nulls: f64) -> ArrayRef {
    let a: StringArray = (0..ROWS)
        .map(|_| (!rng.random_bool(nulls)).then(|| text(rng, min, max)))
        .collect();
    Arc::new(a)
}

fn view(rng: &mut StdRng, min: usize, max: usize) -> ArrayRef {
    let mut b = StringViewBuilder::new();
    for _ in 0..ROWS {
        b.append_value(text(rng, min, max));
    }
    Arc::new(b.finish())
}

/// The payload columns of a layout (a key column is added in front).
fn payload(name: &str, rng: &mut StdRng) -> Vec<ArrayRef> {
    match name {
        "int64" => vec![Arc::new(Int64Array::from_iter_values(
            (0..ROWS as i64).map(|i| i * 7),
        ))],
        "utf8 short" => vec![utf8(rng, 0, 12, 0.0)],
        "utf8 long" => vec![utf8(rng, 40, 120, 0.0)],
        "utf8view short" => vec![view(rng, 0, 12)],
        "utf8view long" => vec![view(rng, 40, 120)],
        "largeutf8" => {
            let a: LargeStringArray = (0..ROWS).map(|_| Some(text(rng, 20, 80))).collect();
            vec![Arc::new(a)]
        }
        "binary" => {
            let a: BinaryArray = (0..ROWS)
                .map(|_| Some(text(rng, 10, 60).into_bytes()))
                .collect();
            vec![Arc::new(a)]
        }
        "dict utf8" => {
            let words: Vec<String> = (0..1000).map(|_| text(rng, 20, 40)).collect();
            let a: DictionaryArray<Int32Type> = (0..ROWS)
                .map(|_| words[rng.random_range(0..words.len())].as_str())
                .collect();
            vec![Arc::new(a)]
        }
        "utf8 nullable" => vec![utf8(rng, 20, 80, 0.2)],
        "wide" => (0..8)
            .flat_map(|i| {
                let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(
                    (0..ROWS as i64).map(|r| r * 31 + i),
                ));
                [ints, utf8(rng, 8, 24, 0.0), view(rng, 30, 60)]
            })
            .collect(),
        other => panic!("no layout {other}"),
    }
}

const LAYOUTS: &[&str] = &[
    "int64",
    "utf8 short",
    "utf8 long",
    "utf8view short",
    "utf8view long",
    "largeutf8",
    "binary",
    "dict utf8",
    "utf8 nullable",
    "wide",
];

fn layout_batch(name: &str) -> RecordBatch {
    let mut rng = StdRng::seed_from_u64(0x9A7_0AD5);
    let mut keys: Vec<i64> = (0..ROWS as i64).collect();
    keys.shuffle(&mut rng);
    let mut columns: Vec<(String, ArrayRef)> =
        vec![("k".into(), Arc::new(Int64Array::from(keys)) as ArrayRef)];
    for (i, c) in payload(name, &mut rng).into_iter().enumerate() {
        columns.push((format!("c{i}"), c));
    }
    RecordBatch::try_from_iter(columns).expect("a batch")
}

/// The compact Arrow bytes of `batch` (see the module docs).
fn compact_bytes(batch: &RecordBatch) -> u64 {
    let n = batch.num_rows();
    let column = |c: &ArrayRef| -> usize {
        let data = c.to_data();
        let nulls = if c.null_count() > 0 { n.div_ceil(8) } else { 0 };
        nulls
            + match c.data_type() {
                DataType::Utf8 | DataType::Binary => 4 * (n + 1) + data.buffers()[1].len(),
                DataType::LargeUtf8 => 8 * (n + 1) + data.buffers()[1].len(),
                DataType::Utf8View => {
                    let views = data.buffers()[0].typed_data::<u128>();
                    let outside: usize = views
                        .iter()
                        .map(|v| *v as u32 as usize)
                        .filter(|&len| len > 12)
                        .sum();
                    16 * n + outside
                }
                DataType::Dictionary(_, _) => 4 * n + data.child_data()[0].buffers()[1].len(),
                _ => data.get_slice_memory_size().unwrap_or(0),
            }
    };
    batch.columns().iter().map(column).sum::<usize>() as u64
}

fn gather(batch: &RecordBatch) -> Vec<RecordBatch> {
    let keys = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("an Int64 key");
    let mut parts: Vec<GatherBuffer> = (0..16)
        .map(|_| GatherBuffer::new(batch.schema()).expect("gatherable"))
        .collect();
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); 16];
    for start in (0..batch.num_rows()).step_by(4096) {
        let len = 4096.min(batch.num_rows() - start);
        let piece = batch.slice(start, len);
        let data: Vec<ArrayData> = piece.columns().iter().map(|c| c.to_data()).collect();
        rows.iter_mut().for_each(Vec::clear);
        for r in 0..len {
            rows[(keys.value(start + r) % 16) as usize].push(r as u32);
        }
        for (part, rows) in parts.iter_mut().zip(&rows) {
            part.append(&data, rows, None).expect("appended");
        }
    }
    parts
        .iter_mut()
        .map(|p| p.finish().expect("finished"))
        .collect()
}

/// `batch` in 8192-row pieces, each with its rows' partitions (`key % 64`).
type Pieces = Vec<(Vec<ArrayData>, Vec<Vec<u32>>)>;

fn pieces(batch: &RecordBatch) -> Pieces {
    let keys = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("an Int64 key");
    (0..batch.num_rows())
        .step_by(8192)
        .map(|start| {
            let len = 8192.min(batch.num_rows() - start);
            let piece = batch.slice(start, len);
            let mut rows = vec![Vec::new(); 64];
            for r in 0..len {
                rows[(keys.value(start + r) % 64) as usize].push(r as u32);
            }
            (piece.columns().iter().map(|c| c.to_data()).collect(), rows)
        })
        .collect()
}

/// The rows of `pieces` gathered as a spilling probe does; the rows finished.
fn spill_gather(schema: &arrow_schema::SchemaRef, pieces: &Pieces) -> usize {
    let file_schema = spilljoin::spill::file_schema(schema);
    let mut parts: Vec<GatherBuffer> = (0..64)
        .map(|_| GatherBuffer::new(Arc::clone(&file_schema)).expect("gatherable"))
        .collect();
    let mut finished = 0;
    for (data, rows) in pieces {
        for (part, rows) in parts.iter_mut().zip(rows) {
            part.append(data, rows, None).expect("appended");
            if part.len() >= 1024 {
                let len = part.len();
                part.expect_rows(len);
                finished += black_box(part.finish().expect("finished")).num_rows();
            }
        }
    }
    finished
}

/// 8192-row batches taken from `batch` in random order.
fn taken(batch: &RecordBatch) -> Vec<RecordBatch> {
    let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    order
        .chunks(8192)
        .map(|chunk| {
            arrow_select::take::take_record_batch(batch, &UInt32Array::from(chunk.to_vec()))
                .expect("taken")
        })
        .collect()
}

fn write(manager: &SpillManager, batches: &[RecordBatch]) -> spilljoin::spill::SpillFile {
    let mut writer = manager
        .create_writer(batches[0].schema(), "bench")
        .expect("a writer");
    for b in batches {
        writer.write(b).expect("written");
    }
    writer.finish().expect("finished")
}

fn bench_payloads(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let manager =
        SpillManager::new(SpillConfig::default().with_root_dir(dir.path())).expect("a manager");
    for &name in LAYOUTS {
        let batch = layout_batch(name);
        let bytes = compact_bytes(&batch);
        let batches = taken(&batch);
        let mut group = c.benchmark_group(name);
        group
            .throughput(Throughput::Bytes(bytes))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        group.bench_function("gather", |b| b.iter(|| black_box(gather(&batch))));
        let pieces = pieces(&batch);
        let schema = batch.schema();
        group.bench_function("spill gather", |b| {
            b.iter(|| black_box(spill_gather(&schema, &pieces)))
        });
        group.bench_function("write", |b| {
            b.iter(|| black_box(write(&manager, &batches).rows()))
        });
        let file = write(&manager, &batches);
        group.bench_function("read", |b| {
            b.iter(|| {
                let reader = file.reader().expect("a reader");
                let rows: usize = reader.map(|b| b.expect("a batch").num_rows()).sum();
                black_box(rows)
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench_payloads);
criterion_main!(benches);
