//! Shared test support: random inputs and an obviously-correct reference join.
//!
//! The reference join is a nested loop over rows rendered as strings: no hashing, no
//! partitioning, no Arrow kernels beyond formatting. It is slow and plainly right.
//! [`hash_reference_join`] finds the same matching pairs through a `HashMap`, for
//! inputs too large for the nested loop, and is checked against it. [`spill_case`] is
//! the case of the `join_spill` fuzz target, shared so that tests replay its inputs.
#![allow(dead_code, clippy::needless_range_loop)]

pub mod spill_case;

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

use arrow_array::builder::*;
use arrow_array::types::Int32Type;
use arrow_array::*;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spilljoin::{JoinFilter, JoinType, NullEquality, Side};

/// A key type the generator can make.
#[derive(Debug, Clone)]
pub struct KeyKind(pub DataType);

/// The key types the random tests draw from.
pub fn key_types() -> Vec<DataType> {
    vec![
        DataType::Int64,
        DataType::Int32,
        DataType::Int8,
        DataType::UInt16,
        DataType::UInt64,
        DataType::Float64,
        DataType::Float32,
        DataType::Decimal128(20, 2),
        // At most 18 digits: spill files hold it as an 8-byte integer.
        DataType::Decimal128(15, 2),
        DataType::Decimal256(40, 3),
        DataType::Date32,
        DataType::Date64,
        DataType::Time64(TimeUnit::Nanosecond),
        DataType::Timestamp(TimeUnit::Millisecond, Some("+02:00".into())),
        DataType::Boolean,
        DataType::Utf8,
        DataType::LargeUtf8,
        DataType::Utf8View,
        DataType::Binary,
        DataType::BinaryView,
        DataType::FixedSizeBinary(3),
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    ]
}

/// A column of `n` values drawn from a domain of `domain` distinct values (so keys
/// repeat), with nulls at rate `null_rate`.
pub fn key_column(
    rng: &mut StdRng,
    data_type: &DataType,
    n: usize,
    domain: u64,
    null_rate: f64,
) -> ArrayRef {
    let vals: Vec<Option<u64>> = (0..n)
        .map(|_| (!rng.random_bool(null_rate)).then(|| rng.random_range(0..domain.max(1))))
        .collect();
    key_column_of(data_type, &vals)
}

/// A key column of `data_type` with one value per number of `vals` (`None`: null):
/// equal numbers give equal keys. Numbers below 2 million give distinct keys in every
/// type but `Int8`, `UInt16`, `Boolean` and `FixedSizeBinary` (which wrap) and
/// `Float64` (where 1 and 2 are both NaN).
pub fn key_column_of(data_type: &DataType, vals: &[Option<u64>]) -> ArrayRef {
    // Strings long enough to exceed the 12-byte inline part of views sometimes.
    let text = |v: u64| {
        if v.is_multiple_of(3) {
            format!("key-{v}-with-a-long-tail")
        } else {
            format!("k{v}")
        }
    };
    let fsb = |v: u64| [(v % 251) as u8, (v / 251 % 251) as u8, 7];
    match data_type {
        DataType::Int64 => Arc::new(Int64Array::from_iter(
            vals.iter().map(|v| v.map(|v| v as i64 - 3)),
        )),
        DataType::Int32 => Arc::new(Int32Array::from_iter(
            vals.iter().map(|v| v.map(|v| v as i32 * 1000)),
        )),
        DataType::Int8 => Arc::new(Int8Array::from_iter(
            vals.iter().map(|v| v.map(|v| (v % 120) as i8 - 60)),
        )),
        DataType::UInt16 => Arc::new(UInt16Array::from_iter(
            vals.iter().map(|v| v.map(|v| v as u16)),
        )),
        DataType::UInt64 => Arc::new(UInt64Array::from_iter(
            vals.iter().map(|v| v.map(|v| u64::MAX - v)),
        )),
        DataType::Float64 => Arc::new(Float64Array::from_iter(vals.iter().map(|v| {
            // Domain value 0 is -0.0 or +0.0, 1 is one of two NaNs: they must match.
            v.map(|v| match v {
                0 => {
                    if v % 2 == 0 {
                        -0.0
                    } else {
                        0.0
                    }
                }
                1 => f64::from_bits(0x7ff8_0000_0000_0001),
                2 => f64::NAN,
                v => v as f64 / 4.0,
            })
        }))),
        DataType::Float32 => Arc::new(Float32Array::from_iter(vals.iter().map(|v| {
            v.map(|v| match v {
                0 => -0.0,
                1 => f32::NAN,
                v => v as f32 * 1.5,
            })
        }))),
        DataType::Decimal128(p, s) => Arc::new(
            Decimal128Array::from_iter(vals.iter().map(|v| v.map(|v| v as i128 * 12345 - 99)))
                .with_precision_and_scale(*p, *s)
                .unwrap(),
        ),
        DataType::Decimal256(p, s) => Arc::new(
            Decimal256Array::from_iter(
                vals.iter()
                    .map(|v| v.map(|v| arrow_buffer::i256::from_i128(v as i128 * 7 - 5))),
            )
            .with_precision_and_scale(*p, *s)
            .unwrap(),
        ),
        DataType::Date32 => Arc::new(Date32Array::from_iter(
            vals.iter().map(|v| v.map(|v| v as i32 + 18000)),
        )),
        DataType::Date64 => Arc::new(Date64Array::from_iter(
            vals.iter().map(|v| v.map(|v| v as i64 * 86_400_000)),
        )),
        DataType::Time64(TimeUnit::Nanosecond) => Arc::new(Time64NanosecondArray::from_iter(
            vals.iter().map(|v| v.map(|v| v as i64 * 1_000_000_007)),
        )),
        DataType::Timestamp(TimeUnit::Millisecond, tz) => Arc::new(
            TimestampMillisecondArray::from_iter(
                vals.iter()
                    .map(|v| v.map(|v| v as i64 * 1000 + 1_600_000_000_000)),
            )
            .with_timezone_opt(tz.clone()),
        ),
        DataType::Boolean => Arc::new(BooleanArray::from_iter(
            vals.iter().map(|v| v.map(|v| v % 2 == 0)),
        )),
        DataType::Utf8 => Arc::new(StringArray::from_iter(vals.iter().map(|v| v.map(text)))),
        DataType::LargeUtf8 => Arc::new(LargeStringArray::from_iter(
            vals.iter().map(|v| v.map(text)),
        )),
        DataType::Utf8View => {
            Arc::new(StringViewArray::from_iter(vals.iter().map(|v| v.map(text))))
        }
        DataType::Binary => Arc::new(BinaryArray::from_iter(
            vals.iter().map(|v| v.map(|v| text(v).into_bytes())),
        )),
        DataType::BinaryView => Arc::new(BinaryViewArray::from_iter(
            vals.iter().map(|v| v.map(|v| text(v).into_bytes())),
        )),
        DataType::FixedSizeBinary(3) => Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vals.iter().map(|v| v.map(fsb)),
                3,
            )
            .unwrap(),
        ),
        DataType::Dictionary(_, _) => {
            let mut b = StringDictionaryBuilder::<Int32Type>::new();
            for v in vals {
                match v {
                    Some(v) => {
                        b.append_value(text(*v));
                    }
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        other => panic!("no generator for {other}"),
    }
}

/// One side of a random join: key columns, an int payload `v` (nullable), a string
/// payload `s`.
pub fn side(
    rng: &mut StdRng,
    prefix: &str,
    key_types: &[DataType],
    n: usize,
    domain: u64,
    null_rate: f64,
) -> RecordBatch {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (i, t) in key_types.iter().enumerate() {
        fields.push(Field::new(format!("{prefix}k{i}"), t.clone(), true));
        columns.push(key_column(rng, t, n, domain, null_rate));
    }
    fields.push(Field::new(format!("{prefix}v"), DataType::Int64, true));
    columns.push(Arc::new(Int64Array::from_iter(
        (0..n).map(|_| (!rng.random_bool(0.1)).then(|| rng.random_range(0..20))),
    )));
    fields.push(Field::new(format!("{prefix}s"), DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from_iter_values(
        (0..n).map(|i| format!("{prefix}row{i}")),
    )));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Splits a batch into random-sized batches, some empty.
pub fn split(rng: &mut StdRng, batch: &RecordBatch, max_rows: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        if rng.random_bool(0.1) {
            out.push(batch.slice(offset, 0));
        }
        if offset >= batch.num_rows() {
            break;
        }
        let len = rng
            .random_range(1..=max_rows.max(1))
            .min(batch.num_rows() - offset);
        out.push(batch.slice(offset, len));
        offset += len;
    }
    out
}

/// The test filter: `left.v < right.v` (null is false).
pub fn less_than_filter(left: &Schema, right: &Schema) -> JoinFilter {
    let l = left
        .index_of(
            &left
                .fields()
                .iter()
                .find(|f| f.name().ends_with('v') && f.name().len() == 2)
                .unwrap()
                .name()
                .clone(),
        )
        .unwrap();
    let r = right
        .index_of(
            &right
                .fields()
                .iter()
                .find(|f| f.name().ends_with('v') && f.name().len() == 2)
                .unwrap()
                .name()
                .clone(),
        )
        .unwrap();
    JoinFilter::new(
        vec![(Side::Left, l), (Side::Right, r)],
        |b: &RecordBatch| arrow_ord::cmp::lt(b.column(0), b.column(1)),
    )
}

/// Renders every value of a batch: `rows[r][c]`, `None` for null.
pub fn render(batch: &RecordBatch) -> Vec<Vec<Option<String>>> {
    let options = FormatOptions::default();
    let formatters: Vec<_> = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
        .collect();
    (0..batch.num_rows())
        .map(|r| {
            batch
                .columns()
                .iter()
                .zip(&formatters)
                .map(|(c, f)| c.is_valid(r).then(|| f.value(r).to_string()))
                .collect()
        })
        .collect()
}

/// Every row of a batch as its rendered values joined by `|`, `∅` for null: what
/// [`render`] gives, one string a row.
pub fn render_rows(batch: &RecordBatch) -> Vec<String> {
    let options = FormatOptions::default();
    let formatters: Vec<_> = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
        .collect();
    (0..batch.num_rows())
        .map(|r| {
            let mut row = String::new();
            for (i, (c, f)) in batch.columns().iter().zip(&formatters).enumerate() {
                if i > 0 {
                    row.push('|');
                }
                if c.is_valid(r) {
                    write!(row, "{}", f.value(r)).unwrap();
                } else {
                    row.push('∅');
                }
            }
            row
        })
        .collect()
}

/// A key value as the reference compares it: floats canonical (`-0 = 0`, NaN = NaN).
fn canonical_key(
    data_type: &DataType,
    rendered: &Option<String>,
    array: &ArrayRef,
    row: usize,
) -> Option<String> {
    let rendered = rendered.as_ref()?;
    Some(match data_type {
        DataType::Float64 | DataType::Float32 => {
            let v = if let Some(a) = array.as_any().downcast_ref::<Float64Array>() {
                a.value(row)
            } else {
                array
                    .as_any()
                    .downcast_ref::<Float32Array>()
                    .unwrap()
                    .value(row) as f64
            };
            if v.is_nan() {
                "NaN".into()
            } else if v == 0.0 {
                "0".into()
            } else {
                format!("{v:?}")
            }
        }
        _ => rendered.clone(),
    })
}

/// The canonical key values of each row of an input.
type RowKeys = Vec<Vec<Option<String>>>;

/// Both inputs as the reference joins compare them: every row rendered
/// ([`render_rows`]), the keys canonical, and the filter's `v` column.
struct Rendered {
    left: Vec<String>,
    right: Vec<String>,
    left_keys: RowKeys,
    right_keys: RowKeys,
    left_v: Vec<Option<i64>>,
    right_v: Vec<Option<i64>>,
    /// A row of the left or right columns all null, rendered.
    left_nulls: String,
    right_nulls: String,
}

/// The canonical keys of every row of `batch`: `columns` rendered.
fn rendered_keys(batch: &RecordBatch, columns: &[usize]) -> RowKeys {
    let rows = render(&batch.project(columns).unwrap());
    (0..batch.num_rows())
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    let data_type = batch.schema().field(c).data_type().clone();
                    canonical_key(&data_type, &rows[r][i], batch.column(c), r)
                })
                .collect()
        })
        .collect()
}

/// The `v` column (the one the test filter reads) of every row of `batch`; nothing if
/// it has none (then the filter cannot be used).
fn v_column(batch: &RecordBatch) -> Vec<Option<i64>> {
    let Some(c) = batch
        .schema()
        .fields()
        .iter()
        .position(|f| f.name().ends_with('v') && f.name().len() == 2)
    else {
        return Vec::new();
    };
    let a = batch
        .column(c)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    (0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r)))
        .collect()
}

impl Rendered {
    fn new(left: &RecordBatch, right: &RecordBatch, keys: &[(usize, usize)]) -> Self {
        let lcols: Vec<usize> = keys.iter().map(|k| k.0).collect();
        let rcols: Vec<usize> = keys.iter().map(|k| k.1).collect();
        let nulls = |n: usize| vec!["∅"; n].join("|");
        Self {
            left: render_rows(left),
            right: render_rows(right),
            left_keys: rendered_keys(left, &lcols),
            right_keys: rendered_keys(right, &rcols),
            left_v: v_column(left),
            right_v: v_column(right),
            left_nulls: nulls(left.num_columns()),
            right_nulls: nulls(right.num_columns()),
        }
    }

    /// Whether left row `l` and right row `r` have equal keys.
    fn keys_equal(&self, l: usize, r: usize, null_equality: NullEquality) -> bool {
        let (a, b) = (&self.left_keys[l], &self.right_keys[r]);
        a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => x == y,
            (None, None) => null_equality == NullEquality::NullEqualsNull,
            _ => false,
        })
    }

    /// The test filter, `left.v < right.v` (null is false).
    fn filter_passes(&self, l: usize, r: usize) -> bool {
        matches!((self.left_v[l], self.right_v[r]), (Some(a), Some(b)) if a < b)
    }

    /// The outer and the subquery keys of a `NOT IN` join.
    fn not_in_sides(&self, join_type: JoinType) -> (&RowKeys, &RowKeys) {
        if join_type == JoinType::LeftNotIn {
            (&self.left_keys, &self.right_keys)
        } else {
            (&self.right_keys, &self.left_keys)
        }
    }

    /// The output of `join_type`, sorted, from every (left, right) pair that matches
    /// and, for `NOT IN`, whether each outer row is kept.
    fn output(
        &self,
        join_type: JoinType,
        pairs: &[(usize, usize)],
        not_in_kept: &[bool],
    ) -> Vec<String> {
        let (lr, rr) = (&self.left, &self.right);
        let mut l_matched = vec![false; lr.len()];
        let mut r_matched = vec![false; rr.len()];
        for &(l, r) in pairs {
            l_matched[l] = true;
            r_matched[r] = true;
        }
        // A row of both sides is the left row's values then the right row's.
        let cat = |a: &str, b: &str| format!("{a}|{b}");
        let mut out = Vec::new();
        match join_type {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                out.extend(pairs.iter().map(|&(l, r)| cat(&lr[l], &rr[r])));
                if matches!(join_type, JoinType::Left | JoinType::Full) {
                    for l in (0..lr.len()).filter(|&l| !l_matched[l]) {
                        out.push(cat(&lr[l], &self.right_nulls));
                    }
                }
                if matches!(join_type, JoinType::Right | JoinType::Full) {
                    for r in (0..rr.len()).filter(|&r| !r_matched[r]) {
                        out.push(cat(&self.left_nulls, &rr[r]));
                    }
                }
            }
            JoinType::LeftSemi | JoinType::LeftAnti => {
                let semi = join_type == JoinType::LeftSemi;
                out.extend(
                    (0..lr.len())
                        .filter(|&l| l_matched[l] == semi)
                        .map(|l| lr[l].clone()),
                )
            }
            JoinType::RightSemi | JoinType::RightAnti => {
                let semi = join_type == JoinType::RightSemi;
                out.extend(
                    (0..rr.len())
                        .filter(|&r| r_matched[r] == semi)
                        .map(|r| rr[r].clone()),
                )
            }
            JoinType::LeftMark => {
                out.extend((0..lr.len()).map(|l| cat(&lr[l], &l_matched[l].to_string())))
            }
            JoinType::LeftNotIn | JoinType::RightNotIn => {
                let outer_rows = if join_type == JoinType::LeftNotIn {
                    lr
                } else {
                    rr
                };
                for (o, _) in not_in_kept.iter().enumerate().filter(|(_, &kept)| kept) {
                    out.push(outer_rows[o].clone());
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// The reference join: nested loops, rows as strings, output as sorted rendered rows.
pub fn reference_join(
    left: &RecordBatch,
    right: &RecordBatch,
    keys: &[(usize, usize)],
    join_type: JoinType,
    filter: bool,
    null_equality: NullEquality,
) -> Vec<String> {
    let rendered = Rendered::new(left, right, keys);
    let matches = |l: usize, r: usize| {
        rendered.keys_equal(l, r, null_equality) && (!filter || rendered.filter_passes(l, r))
    };
    let mut pairs = Vec::new();
    for l in 0..left.num_rows() {
        for r in 0..right.num_rows() {
            if matches(l, r) {
                pairs.push((l, r));
            }
        }
    }
    let mut not_in_kept = Vec::new();
    if join_type.is_null_aware() {
        // x NOT IN (subquery): true iff for every y in the subquery, x <> y is TRUE.
        let (outer, sub) = rendered.not_in_sides(join_type);
        not_in_kept = outer
            .iter()
            .map(|x| {
                sub.iter().all(|y| match (&x[0], &y[0]) {
                    (Some(x), Some(y)) => x != y,
                    _ => false, // NULL <> anything is unknown
                })
            })
            .collect();
    }
    rendered.output(join_type, &pairs, &not_in_kept)
}

/// The reference join's answer for inputs too large for nested loops: the same rows
/// and keys, the same output, but the matching pairs found through a `HashMap` from
/// key to right rows (and `NOT IN` through a `HashSet`). `tests/join_reference.rs`
/// checks it against [`reference_join`], which stays the ground truth.
pub fn hash_reference_join(
    left: &RecordBatch,
    right: &RecordBatch,
    keys: &[(usize, usize)],
    join_type: JoinType,
    filter: bool,
    null_equality: NullEquality,
) -> Vec<String> {
    let rendered = Rendered::new(left, right, keys);
    // A key with a null equals nothing unless nulls equal nulls; then `None == None`,
    // which is how the map compares them.
    let matchable = |key: &[Option<String>]| {
        null_equality == NullEquality::NullEqualsNull || key.iter().all(Option::is_some)
    };
    let mut index: HashMap<&[Option<String>], Vec<usize>> = HashMap::new();
    for (r, key) in rendered.right_keys.iter().enumerate() {
        if matchable(key) {
            index.entry(key.as_slice()).or_default().push(r);
        }
    }
    let mut pairs = Vec::new();
    for (l, key) in rendered.left_keys.iter().enumerate() {
        if !matchable(key) {
            continue;
        }
        for &r in index.get(key.as_slice()).into_iter().flatten() {
            if !filter || rendered.filter_passes(l, r) {
                pairs.push((l, r));
            }
        }
    }
    let mut not_in_kept = Vec::new();
    if join_type.is_null_aware() {
        // Kept iff the subquery is empty, or it holds no null and not x, a non-null key.
        let (outer, sub) = rendered.not_in_sides(join_type);
        let sub_has_null = sub.iter().any(|y| y[0].is_none());
        let sub_set: HashSet<&str> = sub.iter().filter_map(|y| y[0].as_deref()).collect();
        not_in_kept = outer
            .iter()
            .map(|x| {
                sub.is_empty()
                    || (!sub_has_null && x[0].as_deref().is_some_and(|x| !sub_set.contains(x)))
            })
            .collect();
    }
    rendered.output(join_type, &pairs, &not_in_kept)
}

/// Renders engine output the same way as the reference, sorted.
pub fn rendered_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out: Vec<String> = batches.iter().flat_map(render_rows).collect();
    out.sort_unstable();
    out
}

/// `SPILLJOIN_SEED=N ` when that variable is set (else nothing): the start of a
/// replay command, so that a case of a run with another seed replays as it ran.
pub fn seed_prefix() -> String {
    std::env::var("SPILLJOIN_SEED")
        .map(|s| format!("SPILLJOIN_SEED={s} "))
        .unwrap_or_default()
}

/// A seeded rng; the seed comes from `SPILLJOIN_SEED` when set.
pub fn rng_for(case: u64) -> (u64, StdRng) {
    let base: u64 = std::env::var("SPILLJOIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED);
    let seed = base.wrapping_add(case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (seed, StdRng::seed_from_u64(seed))
}

/// A schema's reference.
pub fn schema_of(batch: &RecordBatch) -> SchemaRef {
    batch.schema()
}

/// Runs `join` over `left` and `right` to the end and returns its output as sorted
/// rendered rows ([`rendered_rows`]) and its metrics, having checked that it left
/// nothing reserved in `pool` and no file in `spill`.
pub fn run_to_end(
    join: spilljoin::HashJoin,
    left: Vec<Result<RecordBatch, arrow_schema::ArrowError>>,
    right: Vec<Result<RecordBatch, arrow_schema::ArrowError>>,
    pool: &Arc<dyn spilljoin::memory::MemoryPool>,
    spill: &spilljoin::spill::SpillManager,
) -> (Vec<String>, spilljoin::JoinMetrics) {
    let mut stream = join.execute(left, right).unwrap();
    let output: Vec<RecordBatch> = stream.by_ref().collect::<Result<_, _>>().unwrap();
    let metrics = stream.metrics();
    drop(stream);
    assert_eq!(pool.reserved(), 0, "reservations left");
    assert_eq!(spill.live_files(), 0, "spill files left");
    (rendered_rows(&output), metrics)
}

/// A random string of `len` characters from a 64-letter alphabet (so that it does
/// not compress away whatever a spill file's encoding).
pub fn random_text(rng: &mut StdRng, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
