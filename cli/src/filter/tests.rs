//! `--filter` over hand-made pairs: row i of `left` paired with row i of `right`,
//! each expression's result checked against a hand-computed answer (SQL NULL
//! counts as false, as in the join).

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};

use super::Filter;

/// `left(id, name, price, qty, day, ts, amount)`, `right(id, cap, label, day)`; four
/// pairs.
fn inputs() -> (RecordBatch, RecordBatch) {
    let left = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
        Field::new("qty", DataType::Int32, true),
        Field::new("day", DataType::Date32, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("amount", DataType::Decimal128(10, 2), true),
    ]);
    let right = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("cap", DataType::Int64, true),
        Field::new("label", DataType::Utf8, true),
        Field::new("Day", DataType::Date32, true),
    ]);
    // 2024-01-01 is day 19723.
    let left_columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![Some(1), Some(2), Some(3), None])),
        Arc::new(StringArray::from(vec![
            Some("apple"),
            Some("Banana"),
            None,
            Some("cherry"),
        ])),
        Arc::new(Float64Array::from(vec![
            Some(1.5),
            Some(20.0),
            Some(7.25),
            None,
        ])),
        Arc::new(Int32Array::from(vec![Some(10), Some(0), Some(-3), Some(4)])),
        Arc::new(Date32Array::from(vec![
            Some(19723),
            Some(19754),
            None,
            Some(19722),
        ])),
        Arc::new(TimestampMicrosecondArray::from(vec![
            Some(1_704_067_200_000_000), // 2024-01-01 00:00:00
            Some(1_704_110_400_000_000), // 2024-01-01 12:00:00
            None,
            Some(1_703_980_800_000_000), // 2023-12-31 00:00:00
        ])),
        Arc::new(
            Decimal128Array::from(vec![Some(1050), Some(99), None, Some(-250)])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        ),
    ];
    let right_columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![Some(1), Some(2), Some(3), None])),
        Arc::new(Int64Array::from(vec![Some(5), Some(30), None, Some(0)])),
        Arc::new(StringArray::from(vec![
            Some("x"),
            None,
            Some("z"),
            Some("w"),
        ])),
        Arc::new(Date32Array::from(vec![
            Some(19723),
            Some(19723),
            Some(19723),
            Some(19723),
        ])),
    ];
    (
        RecordBatch::try_new(Arc::new(left), left_columns).unwrap(),
        RecordBatch::try_new(Arc::new(right), right_columns).unwrap(),
    )
}

/// The filter's verdict on each of the four pairs.
fn eval(text: &str) -> Vec<bool> {
    let (left, right) = inputs();
    let filter = Filter::parse(text, &left.schema(), &right.schema())
        .unwrap_or_else(|e| panic!("{text}: {e:#}"));
    let join_filter = filter.join_filter(&left.schema(), &right.schema()).unwrap();
    let columns: Vec<ArrayRef> = join_filter
        .columns()
        .iter()
        .map(|&(side, i)| match side {
            spilljoin::Side::Left => Arc::clone(left.column(i)),
            spilljoin::Side::Right => Arc::clone(right.column(i)),
        })
        .collect();
    let schema = join_filter
        .intermediate_schema(&left.schema(), &right.schema())
        .unwrap();
    let batch = RecordBatch::try_new(schema, columns).unwrap();
    let result = filter.expr.predicate(&batch).unwrap();
    (0..4)
        .map(|i| result.is_valid(i) && result.value(i))
        .collect()
}

/// The error for `text`, on one line as the command line prints it.
fn error(text: &str) -> String {
    let (left, right) = inputs();
    let e = Filter::parse(text, &left.schema(), &right.schema()).unwrap_err();
    crate::failure::one_line(&e)
}

#[test]
fn comparisons_and_arithmetic() {
    assert_eq!(eval("qty > 0"), [true, false, false, true]);
    assert_eq!(eval("left.price > right.cap"), [false, false, false, false]);
    assert_eq!(eval("price * 2 >= cap"), [false, true, false, false]);
    assert_eq!(eval("qty + cap = 15"), [true, false, false, false]);
    assert_eq!(eval("qty - 1 <> 9"), [false, true, true, true]);
    assert_eq!(eval("-qty = 3"), [false, false, true, false]);
    assert_eq!(eval("qty % 3 = 1"), [true, false, false, true]);
    // Division by zero is NULL, never an error.
    assert_eq!(eval("cap / qty IS NULL"), [false, true, true, false]);
    assert_eq!(eval("price / 0 IS NULL"), [true, true, true, true]);
    // Decimals against integers and floats.
    assert_eq!(eval("amount > 1"), [true, false, false, false]);
    assert_eq!(eval("amount = 10.5"), [true, false, false, false]);
    assert_eq!(eval("amount * 2 < 0"), [false, false, false, true]);
    assert_eq!(eval("left.id = right.id"), [true, true, true, false]);
}

#[test]
fn three_valued_logic() {
    // NULL AND false is false, NULL OR true is true; NOT NULL is NULL.
    assert_eq!(eval("cap > 1 OR qty = 4"), [true, true, false, true]);
    assert_eq!(eval("NOT (cap > 1)"), [false, false, false, true]);
    assert_eq!(eval("cap IS NULL"), [false, false, true, false]);
    assert_eq!(
        eval("label IS NOT NULL AND name IS NOT NULL"),
        [true, false, false, true]
    );
    assert_eq!(eval("(qty > 0) IS NOT TRUE"), [false, true, true, false]);
    assert_eq!(eval("(cap > 1) IS FALSE"), [false, false, false, true]);
    assert_eq!(
        eval("left.id IS DISTINCT FROM right.cap"),
        [true, true, true, true]
    );
    assert_eq!(
        eval("cap IS NOT DISTINCT FROM NULL"),
        [false, false, true, false]
    );
    assert_eq!(eval("NULL"), [false, false, false, false]);
    assert_eq!(eval("1 = 1"), [true, true, true, true]);
}

#[test]
fn between_in_and_like() {
    assert_eq!(eval("qty BETWEEN 0 AND 4"), [false, true, false, true]);
    assert_eq!(eval("qty NOT BETWEEN 0 AND 4"), [true, false, true, false]);
    assert_eq!(eval("left.id IN (1, 3, 5)"), [true, false, true, false]);
    // NOT IN with a NULL in the list is never true.
    assert_eq!(
        eval("left.id NOT IN (1, NULL)"),
        [false, false, false, false]
    );
    assert_eq!(eval("left.id NOT IN (1, 2)"), [false, false, true, false]);
    assert_eq!(eval("label IN ('x', 'w')"), [true, false, false, true]);
    assert_eq!(eval("name LIKE '%an%'"), [false, true, false, false]);
    assert_eq!(eval("name NOT LIKE 'a%'"), [false, true, false, true]);
    assert_eq!(eval("name ILIKE 'b%'"), [false, true, false, false]);
    assert_eq!(eval("name LIKE '_pple'"), [true, false, false, false]);
}

#[test]
fn dates_timestamps_intervals_and_casts() {
    assert_eq!(
        eval("left.day = DATE '2024-01-01'"),
        [true, false, false, false]
    );
    // A string compared with a date is read as a date.
    assert_eq!(eval("left.day >= '2024-01-01'"), [true, true, false, false]);
    assert_eq!(eval("left.day > right.Day"), [false, true, false, false]);
    assert_eq!(
        eval("left.day + INTERVAL '1 day' > right.Day"),
        [true, true, false, false]
    );
    assert_eq!(
        eval("left.day < DATE '2024-01-15' - INTERVAL 1 DAY"),
        [true, false, false, true]
    );
    assert_eq!(
        eval("ts >= TIMESTAMP '2024-01-01 06:00:00'"),
        [false, true, false, false]
    );
    assert_eq!(eval("ts < DATE '2024-01-01'"), [false, false, false, true]);
    assert_eq!(eval("ts > right.Day"), [false, true, false, false]);
    assert_eq!(eval("CAST(price AS INT) = 7"), [false, false, true, false]);
    assert_eq!(
        eval("CAST(qty AS VARCHAR) = '10'"),
        [true, false, false, false]
    );
    assert_eq!(
        eval("TRY_CAST(name AS BIGINT) IS NULL"),
        [true, true, true, true]
    );
    assert_eq!(eval("CAST('5' AS INT) < qty"), [true, false, false, false]);
}

#[test]
fn names_resolve_like_sql() {
    // Unquoted names match case-insensitively when that is unambiguous; `Day` is
    // only a right column, `day` only a left one.
    assert_eq!(eval("QTY > 0"), [true, false, false, true]);
    assert_eq!(
        eval("\"Day\" = DATE '2024-01-01'"),
        [true, true, true, true]
    );
    assert_eq!(
        eval("r.cap = 30 AND l.qty = 0"),
        [false, true, false, false]
    );
    // Columns read once each, whatever the number of mentions.
    let (left, right) = inputs();
    let f = Filter::parse(
        "qty > 1 AND qty < 9 OR right.cap = qty",
        &left.schema(),
        &right.schema(),
    )
    .unwrap();
    let columns: Vec<_> = f.columns().map(|(s, n)| (s, n.to_string())).collect();
    assert_eq!(
        columns,
        vec![
            (spilljoin::Side::Left, "qty".into()),
            (spilljoin::Side::Right, "cap".into())
        ]
    );
}

#[test]
fn errors_point_at_the_offending_text() {
    let e = error("qty > 1 AND nmae = 'x'");
    assert!(
        e.contains("no column \"nmae\" in either input; did you mean \"name\"?"),
        "{e}"
    );
    assert!(e.contains("line 1, column 13: \"nmae\""), "{e}");
    let e = error("id = 1");
    assert!(e.contains("both inputs: write left.id or right.id"), "{e}");
    let e = error("left.cap > 1");
    assert!(e.contains("no column \"cap\" in the left input"), "{e}");
    let e = error("middle.id > 1");
    assert!(e.contains("\"middle\" is not an input"), "{e}");
    let e = error("name > 5");
    assert!(
        e.contains("cannot compare name (Utf8) with 5 (Int64)"),
        "{e}"
    );
    assert!(e.contains("column 1: \"name > 5\""), "{e}");
    let e = error("qty + 1");
    assert!(e.contains("must be true or false"), "{e}");
    let e = error("qty > 1\n  AND label + 1 > 2");
    assert!(e.contains("line 2, column 7"), "{e}");
    let e = error("qty > ");
    assert!(
        e.contains("Expected: an expression") && e.contains("end of the filter"),
        "{e}"
    );
    let e = error("qty > 1 garbage");
    assert!(
        e.contains("unexpected garbage") && e.contains("column 9"),
        "{e}"
    );
    let e = error("qty > (1");
    assert!(e.contains("Expected: )"), "{e}");
    let e = error("day = DATE '2024-02-30'");
    assert!(e.contains("\"2024-02-30\" is not a valid Date32"), "{e}");
    let e = error("upper(name) = 'A'");
    assert!(
        e.contains("functions such as upper are not supported"),
        "{e}"
    );
    let e = error("name LIKE 1");
    assert!(e.contains("LIKE takes strings"), "{e}");
    let e = error("day * 2 > 1");
    assert!(
        e.contains("multiplication of Date32 and Int64 is not defined"),
        "{e}"
    );
    assert!(error("qty IN (SELECT 1)").contains("not a subquery"));
    assert!(error("NOT qty").contains("the operand of NOT must be true or false"));
    assert!(error("").contains("Expected: an expression"));
    for e in [error("qty > 1 garbage"), error("name > 5")] {
        assert!(e.starts_with("--filter: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
