//! Hand-written SQL corner cases, each with its expected rows spelled out, and the
//! join's behaviour at its edges: errors, cancellation, memory.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoinBuilder, JoinError, JoinFilter, JoinType, NullEquality, Side};

mod common;
use common::rendered_rows;

fn schema(prefix: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(format!("{prefix}k"), DataType::Int64, true),
        Field::new(format!("{prefix}v"), DataType::Int64, true),
    ]))
}

fn batch(prefix: &str, rows: &[(Option<i64>, Option<i64>)]) -> RecordBatch {
    let k: Int64Array = rows.iter().map(|r| r.0).collect();
    let v: Int64Array = rows.iter().map(|r| r.1).collect();
    RecordBatch::try_new(schema(prefix), vec![Arc::new(k) as ArrayRef, Arc::new(v)]).unwrap()
}

fn run(
    join_type: JoinType,
    left: &[(Option<i64>, Option<i64>)],
    right: &[(Option<i64>, Option<i64>)],
    filter: bool,
) -> Vec<String> {
    let mut builder = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
        .with_join_type(join_type)
        .with_threads(2)
        .with_batch_size(3);
    if filter {
        builder = builder.with_filter(JoinFilter::new(
            vec![(Side::Left, 1), (Side::Right, 1)],
            |b: &RecordBatch| arrow_ord::cmp::lt(b.column(0), b.column(1)),
        ));
    }
    let out: Vec<RecordBatch> = builder
        .build()
        .unwrap()
        .execute(vec![Ok(batch("l", left))], vec![Ok(batch("r", right))])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rendered_rows(&out)
}

fn rows(expected: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

const N: Option<i64> = None;

#[test]
fn not_in_with_a_null_in_the_subquery_returns_nothing() {
    let left = [(Some(1), Some(10)), (Some(2), Some(20)), (N, Some(30))];
    let right = [(Some(1), N), (N, N)];
    assert_eq!(run(JoinType::LeftNotIn, &left, &right, false), rows(&[]));
    // The mirror orientation: the subquery on the probe side.
    assert_eq!(run(JoinType::RightNotIn, &right, &left, false), rows(&[]));
}

#[test]
fn not_in_against_an_empty_subquery_keeps_every_row_even_null_keys() {
    let left = [(Some(1), Some(10)), (N, Some(30))];
    assert_eq!(
        run(JoinType::LeftNotIn, &left, &[], false),
        rows(&["1|10", "∅|30"])
    );
    assert_eq!(
        run(JoinType::RightNotIn, &[], &left, false),
        rows(&["1|10", "∅|30"])
    );
}

#[test]
fn not_in_drops_null_outer_keys_and_matches() {
    let left = [
        (Some(1), Some(10)),
        (Some(2), Some(20)),
        (N, Some(30)),
        (Some(3), N),
    ];
    let right = [(Some(1), N), (Some(5), N)];
    assert_eq!(
        run(JoinType::LeftNotIn, &left, &right, false),
        rows(&["2|20", "3|∅"])
    );
    assert_eq!(
        run(JoinType::RightNotIn, &right, &left, false),
        rows(&["2|20", "3|∅"])
    );
}

#[test]
fn anti_join_keeps_null_probe_keys() {
    // NOT EXISTS: a null key matches nothing, so the row has no match and is kept —
    // unlike NOT IN.
    let left = [(Some(1), Some(10)), (N, Some(30))];
    let right = [(Some(1), N), (N, N)];
    assert_eq!(
        run(JoinType::LeftAnti, &left, &right, false),
        rows(&["∅|30"])
    );
    assert_eq!(
        run(JoinType::RightAnti, &right, &left, false),
        rows(&["∅|30"])
    );
}

#[test]
fn full_join_where_the_filter_rejects_every_candidate() {
    let left = [(Some(1), Some(50)), (Some(2), Some(60))];
    let right = [(Some(1), Some(5)), (Some(2), Some(6)), (Some(3), Some(7))];
    // Keys match, but left.v < right.v never holds: every row comes out unmatched.
    assert_eq!(
        run(JoinType::Full, &left, &right, true),
        rows(&["1|50|∅|∅", "2|60|∅|∅", "∅|∅|1|5", "∅|∅|2|6", "∅|∅|3|7"])
    );
    assert_eq!(run(JoinType::Inner, &left, &right, true), rows(&[]));
    assert_eq!(run(JoinType::LeftSemi, &left, &right, true), rows(&[]));
    assert_eq!(
        run(JoinType::LeftAnti, &left, &right, true),
        rows(&["1|50", "2|60"])
    );
}

#[test]
fn filter_decides_matched_for_outer_rows() {
    let left = [(Some(1), Some(5))];
    let right = [(Some(1), Some(1)), (Some(1), Some(9))];
    // One candidate passes (5 < 9), one fails: the left row matched once, and the
    // right row that failed is unmatched in a full join.
    assert_eq!(
        run(JoinType::Full, &left, &right, true),
        rows(&["1|5|1|9", "∅|∅|1|1"])
    );
    assert_eq!(run(JoinType::Left, &left, &right, true), rows(&["1|5|1|9"]));
}

#[test]
fn mark_join_with_nulls() {
    let left = [(Some(1), Some(10)), (N, Some(20)), (Some(3), Some(30))];
    let right = [(Some(1), N), (N, N)];
    assert_eq!(
        run(JoinType::LeftMark, &left, &right, false),
        rows(&["1|10|true", "∅|20|false", "3|30|false"])
    );
}

#[test]
fn nulls_equal_nulls_when_asked() {
    let left = [(N, Some(1)), (Some(2), Some(2))];
    let right = [(N, Some(3)), (Some(2), Some(4))];
    let join = |ne: NullEquality| {
        let out: Vec<RecordBatch> = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
            .with_null_equality(ne)
            .build()
            .unwrap()
            .execute(vec![Ok(batch("l", &left))], vec![Ok(batch("r", &right))])
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        rendered_rows(&out)
    };
    assert_eq!(join(NullEquality::NullEqualsNothing), rows(&["2|2|2|4"]));
    assert_eq!(
        join(NullEquality::NullEqualsNull),
        rows(&["2|2|2|4", "∅|1|∅|3"])
    );
}

#[test]
fn duplicate_column_names_are_qualified() {
    let s = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let b = RecordBatch::try_new(s.clone(), vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
    let join = HashJoinBuilder::new(s.clone(), s.clone(), [("k", "k")])
        .build()
        .unwrap();
    let names: Vec<String> = join
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["left.k", "right.k"]);
    let out: Vec<RecordBatch> = join
        .execute(vec![Ok(b.clone())], vec![Ok(b)])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(out.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
}

#[test]
fn definition_errors_are_typed() {
    let err = HashJoinBuilder::new(schema("l"), schema("r"), [("nope", "rk")])
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, JoinError::NoSuchColumn { side: Side::Left, name, .. } if name == "nope"),
        "{err}"
    );
    let strings = Arc::new(Schema::new(vec![Field::new("rk", DataType::Utf8, true)]));
    let err = HashJoinBuilder::new(schema("l"), strings, [("lk", "rk")])
        .build()
        .unwrap_err();
    assert!(matches!(err, JoinError::KeyTypeMismatch { .. }), "{err}");
    let lists = Arc::new(Schema::new(vec![Field::new(
        "rk",
        DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        true,
    )]));
    let err = HashJoinBuilder::new(lists.clone(), lists, [("rk", "rk")])
        .build()
        .unwrap_err();
    assert!(matches!(err, JoinError::UnsupportedKeyType { .. }), "{err}");
    let err = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk"), ("lv", "rv")])
        .with_join_type(JoinType::LeftNotIn)
        .build()
        .unwrap_err();
    assert!(matches!(err, JoinError::InvalidJoin(_)), "{err}");
    let err = HashJoinBuilder::new(schema("l"), schema("r"), Vec::<(String, String)>::new())
        .build()
        .unwrap_err();
    assert!(matches!(err, JoinError::InvalidJoin(_)), "{err}");
}

#[test]
fn input_errors_and_schema_mismatches_end_the_stream_with_an_error() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
    let join = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
        .with_memory_pool(pool.clone())
        .build()
        .unwrap();
    let bad: Vec<Result<RecordBatch, ArrowError>> = vec![Err(ArrowError::IoError(
        "disk on fire".into(),
        std::io::Error::other("x"),
    ))];
    let results: Vec<_> = join
        .execute(vec![Ok(batch("l", &[(Some(1), N)]))], bad)
        .unwrap()
        .collect();
    assert_eq!(results.len(), 1);
    assert!(
        matches!(
            &results[0],
            Err(JoinError::Input {
                side: Side::Right,
                ..
            })
        ),
        "{:?}",
        results[0]
    );

    let strings = Arc::new(Schema::new(vec![
        Field::new("x", DataType::Utf8, true),
        Field::new("y", DataType::Int64, true),
    ]));
    let wrong = RecordBatch::try_new(
        strings,
        vec![
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    let results: Vec<_> = join
        .execute(vec![Ok(wrong)], vec![Ok(batch("r", &[(Some(1), N)]))])
        .unwrap()
        .collect();
    assert!(
        matches!(
            results.last(),
            Some(Err(JoinError::SchemaMismatch {
                side: Side::Left,
                ..
            }))
        ),
        "{results:?}"
    );
    assert_eq!(pool.reserved(), 0);
}

#[test]
fn a_build_that_does_not_fit_is_resources_exhausted_naming_the_consumer() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1024));
    let big: Vec<(Option<i64>, Option<i64>)> = (0..10_000).map(|i| (Some(i), Some(i))).collect();
    let results: Vec<_> = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
        .with_memory_pool(pool.clone())
        .build()
        .unwrap()
        .execute(vec![Ok(batch("l", &big))], vec![Ok(batch("r", &big))])
        .unwrap()
        .collect();
    match results.last() {
        Some(Err(JoinError::ResourcesExhausted {
            consumer,
            requested_bytes,
            ..
        })) => {
            assert!(consumer.starts_with("spilljoin"), "{consumer}");
            assert!(*requested_bytes > 0);
        }
        other => panic!("expected ResourcesExhausted, got {other:?}"),
    }
    assert_eq!(pool.reserved(), 0);
}

#[test]
fn dropping_the_stream_halfway_releases_everything() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
    let keys: Vec<(Option<i64>, Option<i64>)> =
        (0..20_000).map(|i| (Some(i % 100), Some(i))).collect();
    let join = HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
        .with_memory_pool(pool.clone())
        .with_batch_size(10)
        .with_threads(3)
        .build()
        .unwrap();
    let probe: Vec<_> = (0..50).map(|_| Ok(batch("l", &keys[..1000]))).collect();
    let mut stream = join.execute(probe, vec![Ok(batch("r", &keys))]).unwrap();
    for _ in 0..5 {
        assert!(stream.next().unwrap().is_ok());
    }
    assert!(pool.reserved() > 0, "the join holds memory while it runs");
    drop(stream);
    assert_eq!(
        pool.reserved(),
        0,
        "dropping the stream must release every reservation"
    );
}

#[test]
fn output_does_not_depend_on_threads_or_partitions() {
    let left: Vec<(Option<i64>, Option<i64>)> =
        (0..3000).map(|i| (Some(i % 97), Some(i % 13))).collect();
    let right: Vec<(Option<i64>, Option<i64>)> = (0..500)
        .map(|i| (if i % 10 == 0 { None } else { Some(i % 89) }, Some(i % 7)))
        .collect();
    for join_type in JoinType::ALL {
        let mut results = Vec::new();
        for (threads, bits) in [(1, 0), (2, 4), (4, 8)] {
            let out: Vec<RecordBatch> =
                HashJoinBuilder::new(schema("l"), schema("r"), [("lk", "rk")])
                    .with_join_type(join_type)
                    .with_threads(threads)
                    .with_partition_bits(bits)
                    .build()
                    .unwrap()
                    .execute_partitioned(
                        left.chunks(700)
                            .map(|c| vec![Ok(batch("l", c))].into_iter())
                            .collect(),
                        right
                            .chunks(90)
                            .map(|c| vec![Ok(batch("r", c))].into_iter())
                            .collect(),
                    )
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
            results.push(rendered_rows(&out));
        }
        assert_eq!(results[0], results[1], "{join_type}");
        assert_eq!(results[0], results[2], "{join_type}");
    }
}

#[test]
fn nested_and_dictionary_payloads_are_gathered() {
    use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::StructArray;
    let mut list = ListBuilder::new(arrow_array::builder::Int64Builder::new());
    let mut dict = StringDictionaryBuilder::<Int32Type>::new();
    for i in 0..4i64 {
        list.values().append_value(i);
        list.values().append_value(i * 10);
        list.append(i != 2);
        dict.append_value(format!("d{}", i % 2));
    }
    let list = Arc::new(list.finish()) as ArrayRef;
    let dict = Arc::new(dict.finish()) as ArrayRef;
    let keys = Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef;
    let structs = Arc::new(StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Int64, false)),
            Arc::clone(&keys),
        ),
        (
            Arc::new(Field::new("b", DataType::Utf8, false)),
            Arc::new(StringArray::from(vec!["w", "x", "y", "z"])) as ArrayRef,
        ),
    ])) as ArrayRef;
    let right = RecordBatch::try_from_iter(vec![
        ("rk", Arc::clone(&keys)),
        ("l", list),
        ("d", dict),
        ("s", structs),
    ])
    .unwrap();
    let left = RecordBatch::try_from_iter(vec![(
        "lk",
        Arc::new(Int64Array::from(vec![4, 2, 9])) as ArrayRef,
    )])
    .unwrap();
    let out: Vec<RecordBatch> = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(JoinType::Left)
        .build()
        .unwrap()
        .execute(vec![Ok(left)], vec![Ok(right)])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rendered_rows(&out),
        rows(&[
            "2|2|[1, 10]|d1|{a: 2, b: x}",
            "4|4|[3, 30]|d1|{a: 4, b: z}",
            "9|∅|∅|∅|∅"
        ])
    );
    assert!(out
        .iter()
        .all(|b| matches!(b.column(3).data_type(), DataType::Dictionary(..))));
}
