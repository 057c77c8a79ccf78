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

/// A batch of `n` rows with one column per type, nulls in every nullable
/// column (and inside nested ones).
pub fn all_types_batch(n: usize, seed: u64) -> RecordBatch {
    let rng = &mut StdRng::seed_from_u64(seed);
    let mut columns: Vec<(&str, ArrayRef)> = Vec::new();
    macro_rules! col {
        ($name:expr, $array:expr) => {{
            let v = nulls(rng, n);
            #[allow(clippy::redundant_closure_call)]
            let a: ArrayRef = Arc::new(($array)(&v, &mut *rng));
            columns.push(($name, a));
        }};
    }
    col!("i8", |v: &[bool], r: &mut StdRng| prim::<Int8Type>(v, r, |r| r.random()));
    col!("i16", |v: &[bool], r: &mut StdRng| prim::<Int16Type>(v, r, |r| r.random()));
    col!("i32", |v: &[bool], r: &mut StdRng| prim::<Int32Type>(v, r, |r| r.random()));
    col!("i64", |v: &[bool], r: &mut StdRng| prim::<Int64Type>(v, r, |r| r.random()));
    col!("u8", |v: &[bool], r: &mut StdRng| prim::<UInt8Type>(v, r, |r| r.random()));
    col!("u16", |v: &[bool], r: &mut StdRng| prim::<UInt16Type>(v, r, |r| r.random()));
    col!("u32", |v: &[bool], r: &mut StdRng| prim::<UInt32Type>(v, r, |r| r.random()));
    col!("u64", |v: &[bool], r: &mut StdRng| prim::<UInt64Type>(v, r, |r| r.random()));
    col!("f16", |v: &[bool], r: &mut StdRng| {
        let f32s = prim::<Float32Type>(v, r, |r| r.random_range(-1e4..1e4));
        let f16 = arrow_cast::cast(&f32s, &DataType::Float16).unwrap();
        f16.as_any().downcast_ref::<Float16Array>().unwrap().clone()
    });
    col!("f32", |v: &[bool], r: &mut StdRng| prim::<Float32Type>(v, r, |r| r.random()));
    col!("f64", |v: &[bool], r: &mut StdRng| prim::<Float64Type>(v, r, |r| r.random::<f64>() * 1e300));
    col!("dec128", |v: &[bool], r: &mut StdRng| prim::<Decimal128Type>(v, r, |r| r.random_range(-(10i128.pow(37))..10i128.pow(37)))
        .with_precision_and_scale(38, 10)
        .unwrap());
    col!("dec256", |v: &[bool], r: &mut StdRng| prim::<Decimal256Type>(v, r, |r| i256::from_parts(r.random(), r.random_range(-1000..1000)))
        .with_precision_and_scale(76, 20)
        .unwrap());
    col!("date32", |v: &[bool], r: &mut StdRng| prim::<Date32Type>(v, r, |r| r.random_range(-100_000..100_000)));
    col!("date64", |v: &[bool], r: &mut StdRng| prim::<Date64Type>(v, r, |r| r.random_range(-100_000..100_000) * 86_400_000));
    col!("time32s", |v: &[bool], r: &mut StdRng| prim::<Time32SecondType>(v, r, |r| r.random_range(0..86_400)));
    col!("time32ms", |v: &[bool], r: &mut StdRng| prim::<Time32MillisecondType>(v, r, |r| r.random_range(0..86_400_000)));
    col!("time64us", |v: &[bool], r: &mut StdRng| prim::<Time64MicrosecondType>(v, r, |r| r.random_range(0..86_400_000_000)));
    col!("time64ns", |v: &[bool], r: &mut StdRng| prim::<Time64NanosecondType>(v, r, |r| r.random_range(0..86_400_000_000_000)));
    col!("ts_s", |v: &[bool], r: &mut StdRng| prim::<TimestampSecondType>(v, r, |r| r.random_range(0..4_000_000_000)));
    col!("ts_s_tz", |v: &[bool], r: &mut StdRng| prim::<TimestampSecondType>(v, r, |r| r.random_range(0..4_000_000_000))
        .with_timezone("-05:30"));
    col!("ts_ms", |v: &[bool], r: &mut StdRng| prim::<TimestampMillisecondType>(v, r, |r| r.random()));
    col!("ts_us", |v: &[bool], r: &mut StdRng| prim::<TimestampMicrosecondType>(v, r, |r| r.random()));
    col!("ts_ms_tz", |v: &[bool], r: &mut StdRng| prim::<TimestampMillisecondType>(v, r, |r| r.random())
        .with_timezone("+02:00"));
    col!("ts_us_utc", |v: &[bool], r: &mut StdRng| prim::<TimestampMicrosecondType>(v, r, |r| r.random())
        .with_timezone("UTC"));
    col!("ts_ns", |v: &[bool], r: &mut StdRng| prim::<TimestampNanosecondType>(v, r, |r| r.random()));
    col!("ts_ns_tz", |v: &[bool], r: &mut StdRng| prim::<TimestampNanosecondType>(v, r, |r| r.random())
        .with_timezone("America/New_York"));
    col!("dur_s", |v: &[bool], r: &mut StdRng| prim::<DurationSecondType>(v, r, |r| r.random()));
    col!("dur_ms", |v: &[bool], r: &mut StdRng| prim::<DurationMillisecondType>(v, r, |r| r.random()));
    col!("dur_us", |v: &[bool], r: &mut StdRng| prim::<DurationMicrosecondType>(v, r, |r| r.random()));
    col!("dur_ns", |v: &[bool], r: &mut StdRng| prim::<DurationNanosecondType>(v, r, |r| r.random()));
    col!("iv_ym", |v: &[bool], r: &mut StdRng| prim::<IntervalYearMonthType>(v, r, |r| r.random()));
    col!("iv_dt", |v: &[bool], r: &mut StdRng| prim::<IntervalDayTimeType>(v, r, |r| IntervalDayTime::new(r.random(), r.random())));
    col!("iv_mdn", |v: &[bool], r: &mut StdRng| prim::<IntervalMonthDayNanoType>(v, r, |r| IntervalMonthDayNano::new(r.random(), r.random(), r.random())));
    col!("bool", |v: &[bool], r: &mut StdRng| v.iter().map(|&v| v.then(|| r.random_bool(0.5))).collect::<BooleanArray>());
    col!("utf8", |v: &[bool], r: &mut StdRng| StringArray::from(strings(v, r, 30)));
    col!("large_utf8", |v: &[bool], r: &mut StdRng| LargeStringArray::from(strings(v, r, 30)));
    col!("utf8_view", |v: &[bool], r: &mut StdRng| {
        let mut b = StringViewBuilder::new();
        for s in strings(v, r, 40) {
            b.append_option(s); // both inline (<= 12 bytes) and out-of-line views
        }
        b.finish()
    });
    col!("binary", |v: &[bool], r: &mut StdRng| BinaryArray::from_iter(strings(v, r, 20).into_iter().map(|s| s.map(String::into_bytes))));
    col!("large_binary", |v: &[bool], r: &mut StdRng| LargeBinaryArray::from_iter(strings(v, r, 20).into_iter().map(|s| s.map(String::into_bytes))));
    col!("binary_view", |v: &[bool], r: &mut StdRng| {
        let mut b = BinaryViewBuilder::new();
        for s in strings(v, r, 40) {
            b.append_option(s.map(String::into_bytes));
        }
        b.finish()
    });
    col!("fixed_binary", |v: &[bool], r: &mut StdRng| {
        let mut b = FixedSizeBinaryBuilder::new(5);
        for &valid in v {
            let bytes: [u8; 5] = r.random();
            if valid {
                b.append_value(bytes).unwrap();
            } else {
                b.append_null();
            }
        }
        b.finish()
    });
    col!("dict", |v: &[bool], r: &mut StdRng| {
        let mut b = StringDictionaryBuilder::<Int32Type>::new();
        for &valid in v {
            let s = format!("category-{}", r.random_range(0..7));
            if valid {
                b.append_value(s);
            } else {
                b.append_null();
            }
        }
        b.finish()
    });
    col!("list", |v: &[bool], r: &mut StdRng| {
        let mut b = ListBuilder::new(Int32Builder::new());
        for &valid in v {
            for _ in 0..r.random_range(0..4) {
                b.values().append_option(r.random_bool(0.8).then(|| r.random()));
            }
            b.append(valid);
        }
        b.finish()
    });
    col!("large_list", |v: &[bool], r: &mut StdRng| {
        let mut b = LargeListBuilder::new(StringBuilder::new());
        for &valid in v {
            for s in strings(&[true, true, false][..r.random_range(0..3)], r, 8) {
                b.values().append_option(s);
            }
            b.append(valid);
        }
        b.finish()
    });
    col!("struct", |v: &[bool], r: &mut StdRng| nested_struct(v, r));
    col!("map", |v: &[bool], r: &mut StdRng| {
        let mut b = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        for &valid in v {
            for i in 0..r.random_range(0..3) {
                b.keys().append_value(format!("k{i}"));
                b.values().append_option(r.random_bool(0.7).then(|| r.random()));
            }
            b.append(valid).unwrap();
        }
        b.finish()
    });
    col!("null", |v: &[bool], _r: &mut StdRng| NullArray::new(v.len()));

    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields).with_metadata(
        [("origin".to_owned(), "spill test".to_owned())].into(),
    ));
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
