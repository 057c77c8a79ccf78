//! Shared test data: a batch holding every Arrow type a join payload may carry.
#![allow(dead_code)]

use std::sync::Arc;

use arrow_array::builder::{
    BinaryViewBuilder, FixedSizeBinaryBuilder, Int32Builder, Int64Builder, LargeListBuilder,
    ListBuilder, MapBuilder, StringBuilder, StringDictionaryBuilder, StringViewBuilder,
};
use arrow_array::types::*;
use arrow_array::*;
use arrow_buffer::{i256, IntervalDayTime, IntervalMonthDayNano, NullBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use spilljoin_spill::{
    SpillCompression, SpillConfig, SpillError, SpillFile, SpillManager, SpillReadMode,
};

pub const COMPRESSIONS: [SpillCompression; 3] = [
    SpillCompression::None,
    SpillCompression::Lz4,
    SpillCompression::Zstd,
];
pub const READ_MODES: [SpillReadMode; 2] = [SpillReadMode::Buffered, SpillReadMode::Mmap];

pub fn manager(compression: SpillCompression, mode: SpillReadMode) -> SpillManager {
    SpillManager::new(
        SpillConfig::default()
            .with_compression(compression)
            .with_read_mode(mode),
    )
    .unwrap()
}

/// Writes `batches` into a new file of `manager`.
pub fn spill(manager: &SpillManager, schema: SchemaRef, batches: &[RecordBatch]) -> SpillFile {
    let mut writer = manager.create_writer(schema, "test").unwrap();
    for b in batches {
        writer.write(b).unwrap();
    }
    writer.finish().unwrap()
}

pub fn read_all(file: &SpillFile) -> Result<Vec<RecordBatch>, SpillError> {
    file.reader()?.collect()
}

/// Null roughly every third row, in a seeded pattern.
fn nulls(rng: &mut StdRng, n: usize) -> Vec<bool> {
    (0..n).map(|_| rng.random_bool(0.66)).collect()
}

fn prim<T: ArrowPrimitiveType>(
    valid: &[bool],
    rng: &mut StdRng,
    mut value: impl FnMut(&mut StdRng) -> T::Native,
) -> PrimitiveArray<T> {
    valid
        .iter()
        .map(|&v| {
            let x = value(rng);
            v.then_some(x)
        })
        .collect()
}

fn word(rng: &mut StdRng, max_len: usize) -> String {
    let len = rng.random_range(0..=max_len);
    (0..len)
        .map(|_| char::from(rng.random_range(b'a'..=b'z')))
        .collect()
}

fn strings(valid: &[bool], rng: &mut StdRng, max_len: usize) -> Vec<Option<String>> {
    valid
        .iter()
        .map(|&v| {
            let s = if rng.random_bool(0.1) {
                format!("ünïcødé {}", word(rng, max_len))
            } else {
                word(rng, max_len)
            };
            v.then_some(s)
        })
        .collect()
}

/// `n` random values of `T`, about a third of them null.
fn p<T: ArrowPrimitiveType>(
    n: usize,
    rng: &mut StdRng,
    value: impl FnMut(&mut StdRng) -> T::Native,
) -> PrimitiveArray<T> {
    let valid = nulls(rng, n);
    prim(&valid, rng, value)
}

fn f16s(n: usize, rng: &mut StdRng) -> ArrayRef {
    let f32s = p::<Float32Type>(n, rng, |r| r.random_range(-1e4..1e4));
    arrow_cast::cast(&f32s, &DataType::Float16).unwrap()
}

fn utf8_views(n: usize, rng: &mut StdRng) -> StringViewArray {
    let mut b = StringViewBuilder::new();
    let valid = nulls(rng, n);
    for s in strings(&valid, rng, 40) {
        b.append_option(s); // both inline (<= 12 bytes) and out-of-line views
    }
    b.finish()
}

fn binary_views(n: usize, rng: &mut StdRng) -> BinaryViewArray {
    let mut b = BinaryViewBuilder::new();
    let valid = nulls(rng, n);
    for s in strings(&valid, rng, 40) {
        b.append_option(s.map(String::into_bytes));
    }
    b.finish()
}

fn fixed_binaries(n: usize, rng: &mut StdRng) -> FixedSizeBinaryArray {
    let mut b = FixedSizeBinaryBuilder::new(5);
    for valid in nulls(rng, n) {
        let bytes: [u8; 5] = rng.random();
        if valid {
            b.append_value(bytes).unwrap();
        } else {
            b.append_null();
        }
    }
    b.finish()
}

fn dictionary(n: usize, rng: &mut StdRng) -> DictionaryArray<Int32Type> {
    let mut b = StringDictionaryBuilder::<Int32Type>::new();
    for valid in nulls(rng, n) {
        let s = format!("category-{}", rng.random_range(0..7));
        if valid {
            b.append_value(s);
        } else {
            b.append_null();
        }
    }
    b.finish()
}

fn list(n: usize, rng: &mut StdRng) -> ListArray {
    let mut b = ListBuilder::new(Int32Builder::new());
    for valid in nulls(rng, n) {
        for _ in 0..rng.random_range(0..4) {
            let v = rng.random_bool(0.8).then(|| rng.random());
            b.values().append_option(v);
        }
        b.append(valid);
    }
    b.finish()
}

fn large_list(n: usize, rng: &mut StdRng) -> LargeListArray {
    let mut b = LargeListBuilder::new(StringBuilder::new());
    for valid in nulls(rng, n) {
        let len = rng.random_range(0..3);
        for s in strings(&[true, true, false][..len], rng, 8) {
            b.values().append_option(s);
        }
        b.append(valid);
    }
    b.finish()
}

fn map(n: usize, rng: &mut StdRng) -> MapArray {
    let mut b = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    for valid in nulls(rng, n) {
        for i in 0..rng.random_range(0..3) {
            b.keys().append_value(format!("k{i}"));
            let v = rng.random_bool(0.7).then(|| rng.random());
            b.values().append_option(v);
        }
        b.append(valid).unwrap();
    }
    b.finish()
}

fn text<A: From<Vec<Option<String>>>>(n: usize, rng: &mut StdRng, max_len: usize) -> A {
    let valid = nulls(rng, n);
    A::from(strings(&valid, rng, max_len))
}

fn bytes<A: FromIterator<Option<Vec<u8>>>>(n: usize, rng: &mut StdRng) -> A {
    let valid = nulls(rng, n);
    strings(&valid, rng, 20)
        .into_iter()
        .map(|s| s.map(String::into_bytes))
        .collect()
}

/// A batch of `n` rows with one column per type a join payload may carry,
/// nulls in every column (and inside nested ones).
pub fn all_types_batch(n: usize, seed: u64) -> RecordBatch {
    let rng = &mut StdRng::seed_from_u64(seed);
    let day_ms = 86_400_000;
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("i8", Arc::new(p::<Int8Type>(n, rng, |r| r.random()))),
        ("i16", Arc::new(p::<Int16Type>(n, rng, |r| r.random()))),
        ("i32", Arc::new(p::<Int32Type>(n, rng, |r| r.random()))),
        ("i64", Arc::new(p::<Int64Type>(n, rng, |r| r.random()))),
        ("u8", Arc::new(p::<UInt8Type>(n, rng, |r| r.random()))),
        ("u16", Arc::new(p::<UInt16Type>(n, rng, |r| r.random()))),
        ("u32", Arc::new(p::<UInt32Type>(n, rng, |r| r.random()))),
        ("u64", Arc::new(p::<UInt64Type>(n, rng, |r| r.random()))),
        ("f16", f16s(n, rng)),
        ("f32", Arc::new(p::<Float32Type>(n, rng, |r| r.random()))),
        (
            "f64",
            Arc::new(p::<Float64Type>(n, rng, |r| r.random::<f64>() * 1e300)),
        ),
        (
            "dec128",
            Arc::new(
                p::<Decimal128Type>(n, rng, |r| {
                    r.random_range(-(10i128.pow(37))..10i128.pow(37))
                })
                .with_precision_and_scale(38, 10)
                .unwrap(),
            ),
        ),
        (
            "dec256",
            Arc::new(
                p::<Decimal256Type>(n, rng, |r| {
                    i256::from_parts(r.random(), r.random_range(-1000..1000))
                })
                .with_precision_and_scale(76, 20)
                .unwrap(),
            ),
        ),
        (
            "date32",
            Arc::new(p::<Date32Type>(n, rng, |r| {
                r.random_range(-100_000..100_000)
            })),
        ),
        (
            "date64",
            Arc::new(p::<Date64Type>(n, rng, |r| {
                r.random_range(-100_000..100_000) * day_ms
            })),
        ),
        (
            "time32s",
            Arc::new(p::<Time32SecondType>(n, rng, |r| r.random_range(0..86_400))),
        ),
        (
            "time32ms",
            Arc::new(p::<Time32MillisecondType>(n, rng, |r| {
                r.random_range(0..86_400_000)
            })),
        ),
        (
            "time64us",
            Arc::new(p::<Time64MicrosecondType>(n, rng, |r| {
                r.random_range(0..day_ms * 1000)
            })),
        ),
        (
            "time64ns",
            Arc::new(p::<Time64NanosecondType>(n, rng, |r| {
                r.random_range(0..day_ms * 1_000_000)
            })),
        ),
        (
            "ts_s",
            Arc::new(p::<TimestampSecondType>(n, rng, |r| {
                r.random_range(0..4_000_000_000)
            })),
        ),
        (
            "ts_s_tz",
            Arc::new(
                p::<TimestampSecondType>(n, rng, |r| r.random_range(0..4_000_000_000))
                    .with_timezone("-05:30"),
            ),
        ),
        (
            "ts_ms",
            Arc::new(p::<TimestampMillisecondType>(n, rng, |r| r.random())),
        ),
        (
            "ts_ms_tz",
            Arc::new(p::<TimestampMillisecondType>(n, rng, |r| r.random()).with_timezone("+02:00")),
        ),
        (
            "ts_us",
            Arc::new(p::<TimestampMicrosecondType>(n, rng, |r| r.random())),
        ),
        (
            "ts_us_utc",
            Arc::new(p::<TimestampMicrosecondType>(n, rng, |r| r.random()).with_timezone("UTC")),
        ),
        (
            "ts_ns",
            Arc::new(p::<TimestampNanosecondType>(n, rng, |r| r.random())),
        ),
        (
            "ts_ns_tz",
            Arc::new(
                p::<TimestampNanosecondType>(n, rng, |r| r.random())
                    .with_timezone("America/New_York"),
            ),
        ),
        (
            "dur_s",
            Arc::new(p::<DurationSecondType>(n, rng, |r| r.random())),
        ),
        (
            "dur_ms",
            Arc::new(p::<DurationMillisecondType>(n, rng, |r| r.random())),
        ),
        (
            "dur_us",
            Arc::new(p::<DurationMicrosecondType>(n, rng, |r| r.random())),
        ),
        (
            "dur_ns",
            Arc::new(p::<DurationNanosecondType>(n, rng, |r| r.random())),
        ),
        (
            "iv_ym",
            Arc::new(p::<IntervalYearMonthType>(n, rng, |r| r.random())),
        ),
        (
            "iv_dt",
            Arc::new(p::<IntervalDayTimeType>(n, rng, |r| {
                IntervalDayTime::new(r.random(), r.random())
            })),
        ),
        (
            "iv_mdn",
            Arc::new(p::<IntervalMonthDayNanoType>(n, rng, |r| {
                IntervalMonthDayNano::new(r.random(), r.random(), r.random())
            })),
        ),
        (
            "bool",
            Arc::new(
                nulls(rng, n)
                    .into_iter()
                    .map(|v| v.then(|| rng.random_bool(0.5)))
                    .collect::<BooleanArray>(),
            ),
        ),
        ("utf8", Arc::new(text::<StringArray>(n, rng, 30))),
        ("large_utf8", Arc::new(text::<LargeStringArray>(n, rng, 30))),
        ("utf8_view", Arc::new(utf8_views(n, rng))),
        ("binary", Arc::new(bytes::<BinaryArray>(n, rng))),
        ("large_binary", Arc::new(bytes::<LargeBinaryArray>(n, rng))),
        ("binary_view", Arc::new(binary_views(n, rng))),
        ("fixed_binary", Arc::new(fixed_binaries(n, rng))),
        ("dict", Arc::new(dictionary(n, rng))),
        ("list", Arc::new(list(n, rng))),
        ("large_list", Arc::new(large_list(n, rng))),
        ("struct", Arc::new(nested_struct(&nulls(rng, n), rng))),
        ("map", Arc::new(map(n, rng))),
        ("null", Arc::new(NullArray::new(n))),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(
        Schema::new(fields).with_metadata([("origin".to_owned(), "spill test".to_owned())].into()),
    );
    RecordBatch::try_new(schema, columns.into_iter().map(|(_, a)| a).collect()).unwrap()
}

/// struct<id: int64, inner: struct<name: utf8, tags: list<utf8>>>, nulls at
/// both levels.
fn nested_struct(valid: &[bool], rng: &mut StdRng) -> StructArray {
    let n = valid.len();
    let inner_valid = nulls(rng, n);
    let name = StringArray::from(strings(&nulls(rng, n), rng, 10));
    let mut tags = ListBuilder::new(StringBuilder::new());
    for &v in &nulls(rng, n) {
        for s in strings(&[true, false, true][..rng.random_range(0..3)], rng, 6) {
            tags.values().append_option(s);
        }
        tags.append(v);
    }
    let tags = tags.finish();
    let inner_fields = Fields::from(vec![
        Field::new("name", DataType::Utf8, true),
        Field::new("tags", tags.data_type().clone(), true),
    ]);
    let inner = StructArray::new(
        inner_fields,
        vec![Arc::new(name), Arc::new(tags)],
        Some(NullBuffer::from(inner_valid)),
    );
    let id = prim::<Int64Type>(&nulls(rng, n), rng, |r| r.random());
    let fields = Fields::from(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("inner", inner.data_type().clone(), true),
    ]);
    // Children of a null struct slot must be null too where not nullable;
    // all children here are nullable, so any validity works.
    StructArray::new(
        fields,
        vec![Arc::new(id), Arc::new(inner)],
        Some(NullBuffer::from(valid.to_vec())),
    )
}
