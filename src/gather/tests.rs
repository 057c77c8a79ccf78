use std::sync::Arc;

use super::values::{HUGE_PAGE_BYTES, MAP_MIN_BYTES};
use super::*;
use arrow_array::{
    Array, ArrayRef, Decimal128Array, Int32Array, Int64Array, RecordBatch, UInt64Array,
};
use arrow_data::ArrayData;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use arrow_select::take::take;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

#[test]
fn gathers_what_take_and_concat_would() -> TestResult {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("d", DataType::Decimal128(15, 2), false),
        Field::new("h", DataType::UInt64, false),
        Field::new("s", DataType::Int32, true),
    ]));
    let widths = fixed_widths(&schema).ok_or("not fixed width")?;
    assert_eq!(widths, vec![8, 16, 8, 4]);
    let batch = |start: i64, nulls: bool| -> std::result::Result<Vec<ArrayRef>, ArrowError> {
        let a: Int64Array = (start..start + 10)
            .map(|v| (!nulls || v % 3 != 0).then_some(v))
            .collect();
        let d = Decimal128Array::from_iter_values((start..start + 10).map(|v| v as i128 * 100))
            .with_precision_and_scale(15, 2)?;
        let h = UInt64Array::from_iter_values((start..start + 10).map(|v| v as u64 * 7));
        let s: Int32Array = (start..start + 10).map(|v| Some(v as i32)).collect();
        Ok(vec![Arc::new(a), Arc::new(d), Arc::new(h), Arc::new(s)])
    };
    // A sliced input (offset 2), one without nulls first, then one with them.
    let first: Vec<ArrayRef> = batch(0, false)?.iter().map(|c| c.slice(2, 8)).collect();
    let second = batch(100, true)?;
    let data =
        |columns: &[ArrayRef]| -> Vec<ArrayData> { columns.iter().map(|c| c.to_data()).collect() };
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.append(&data(&first), &[0, 5, 7], None)?;
    rows.append(&data(&second), &[9, 0, 3, 3], None)?;
    assert_eq!(rows.len(), 7);
    let got = rows.finish()?;
    assert_eq!(rows.len(), 0);
    for (i, column) in got.columns().iter().enumerate() {
        let a = take(
            first[i].as_ref(),
            &arrow_array::UInt32Array::from(vec![0, 5, 7]),
            None,
        )?;
        let b = take(
            second[i].as_ref(),
            &arrow_array::UInt32Array::from(vec![9, 0, 3, 3]),
            None,
        )?;
        let want = arrow_select::concat::concat(&[a.as_ref(), b.as_ref()])?;
        assert_eq!(column.to_data(), want.to_data(), "column {i}");
    }
    // Reused after finish.
    rows.append(&data(&second), &[1], None)?;
    assert_eq!(rows.finish()?.num_rows(), 1);
    // The last column from hashes instead of an array.
    let hashes: Vec<u64> = (0..10).map(|i| i * 1000).collect();
    let with_hash: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("__hash", DataType::UInt64, false),
    ]));
    let mut rows = GatherBuffer::new(Arc::clone(&with_hash))?;
    rows.append(&data(&second[..1]), &[4, 2], Some(&hashes))?;
    let got = rows.finish()?;
    let h = got
        .column(1)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or("not a UInt64 column")?;
    assert_eq!(h.values().to_vec(), vec![4000, 2000]);
    Ok(())
}

#[test]
fn large_buffers_move_to_a_map_and_keep_every_value() -> TestResult {
    // 600Ki rows of 16 + 8 bytes: past MAP_MIN_BYTES, then grown several times.
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("d", DataType::Decimal128(20, 0), false),
        Field::new("a", DataType::Int64, true),
    ]));
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    let mut want_d = Vec::new();
    let mut want_a = Vec::new();
    let mut held = 0;
    for chunk in 0..150i64 {
        let base = chunk * 8192;
        let d = Decimal128Array::from_iter_values((base..base + 8192).map(i128::from))
            .with_precision_and_scale(20, 0)?;
        let a: Int64Array = (base..base + 8192)
            .map(|v| (v % 7 != 0).then_some(-v))
            .collect();
        // Every other row, backwards.
        let picked: Vec<u32> = (0..8192u32).rev().step_by(2).collect();
        let before = rows.capacity_after(&Growth::rows(picked.len()));
        rows.append(&[d.to_data(), a.to_data()], &picked, None)?;
        assert!(rows.held() <= before, "grew past what it said");
        held = held.max(rows.held());
        for &r in &picked {
            want_d.push(d.value(r as usize));
            want_a.push(a.is_valid(r as usize).then(|| a.value(r as usize)));
        }
    }
    let values = rows.len() * 24;
    assert!(values > 2 * MAP_MIN_BYTES);
    assert!(held >= values && held < values + 3 * HUGE_PAGE_BYTES + 4096);
    let got = rows.finish()?;
    let d = got
        .column(0)
        .as_any()
        .downcast_ref::<Decimal128Array>()
        .ok_or("not decimal")?;
    let a = got
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("not int64")?;
    assert_eq!(d.values().to_vec(), want_d);
    assert_eq!(a.iter().collect::<Vec<_>>(), want_a);
    // The batch outlives the gatherer, which starts over empty.
    drop(rows);
    assert_eq!(got.num_rows(), want_a.len());
    Ok(())
}

#[test]
fn buffers_expecting_rows_are_allocated_once_as_counted() -> TestResult {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("h", DataType::UInt64, false),
    ]));
    let a: Int64Array = (0..1000i64).map(|v| (v % 5 != 0).then_some(v)).collect();
    let hashes: Vec<u64> = (0..1000u64).map(|v| v * 3).collect();
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.expect_rows(3000);
    // Counted before anything is allocated: both value buffers at 3000 rows, and
    // the nullable column's validity.
    let said = rows.capacity_after(&Growth::rows(100));
    assert!(said >= 2 * 3000 * 8, "{said}");
    let mut sizes = vec![];
    for chunk in 0..30u32 {
        let picked: Vec<u32> = (chunk * 10..chunk * 10 + 100).collect();
        let before = rows.capacity_after(&Growth::rows(picked.len()));
        rows.append(&[a.to_data()], &picked, Some(&hashes))?;
        assert!(rows.held() <= before, "grew past what it said");
        sizes.push(rows.held());
    }
    // 3000 rows in: the values never grew past their first allocation (what
    // grows is the validity's count, a quarter byte a row); from nothing, by
    // doubling, they would have reached 32 KiB each.
    let validity = |rows: usize| rows.div_ceil(8) * 2 + 64;
    for (chunk, &size) in sizes.iter().enumerate() {
        assert_eq!(
            size - validity((chunk + 1) * 100),
            2 * 3000 * 8,
            "{sizes:?}"
        );
    }
    let got = rows.finish()?;
    assert_eq!(got.num_rows(), 3000);
    let column = got
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("not int64")?;
    assert_eq!(column.value(1), a.value(1));
    assert!(column.is_null(0));
    Ok(())
}

#[test]
fn buffers_expecting_more_than_a_map_takes_stay_in_one_heap_allocation() -> TestResult {
    // A spilled pair's build knows its rows: 100K of 8 bytes, past MAP_MIN_BYTES.
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
    let a: Int64Array = (0..1000i64).collect();
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.expect_rows(100_000);
    const { assert!(100_000 * 8 > MAP_MIN_BYTES) };
    let picked: Vec<u32> = (0..1000).collect();
    assert_eq!(rows.capacity_after(&Growth::rows(picked.len())), 800_000);
    for _ in 0..100 {
        rows.append(&[a.to_data()], &picked, None)?;
        // Counted as allocated at first, never grown, never moved to a map.
        assert_eq!(rows.held(), 800_000);
    }
    let got = rows.finish()?;
    assert_eq!(got.num_rows(), 100_000);
    let column = got
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("not int64")?;
    assert_eq!(column.value(99_999), 999);
    Ok(())
}

/// A spill file schema of a key, a decimal and a hash column, and its widths.
fn key_decimal_hash() -> std::result::Result<(SchemaRef, Vec<usize>), &'static str> {
    let logical: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("h", DataType::UInt64, false),
    ]));
    let schema = spilljoin_spill::file_schema(&logical);
    let widths = fixed_widths(&schema).ok_or("not fixed width")?;
    Ok((schema, widths))
}

#[test]
fn decimals_gather_narrowed_into_a_spill_file_schema() -> TestResult {
    let (schema, widths) = key_decimal_hash()?;
    assert_eq!(widths, vec![8, 8, 8]);
    let hashes = [11u64, 12, 13, 14];
    let k = Int64Array::from(vec![10, 20, 30, 40]);
    let d = Decimal128Array::from(vec![Some(-5), None, Some(999_999_999_999_999), Some(7)])
        .with_precision_and_scale(15, 2)?;
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.append(&[k.to_data(), d.to_data()], &[3, 1, 0, 2], Some(&hashes))?;
    // A value past 64 bits (arrow does not enforce precision) is refused, and
    // nothing of the rows is appended.
    let too_big = Decimal128Array::from(vec![Some(1), Some(i128::from(i64::MAX) + 1)])
        .with_precision_and_scale(15, 2)?;
    let k2 = Int64Array::from(vec![1, 2]);
    assert!(rows
        .append(&[k2.to_data(), too_big.to_data()], &[0, 1], Some(&[91, 92]))
        .is_err());
    assert_eq!(rows.len(), 4);
    // Every column, the hash column included, still holds 4 rows: the next row
    // lines up with its hash.
    rows.append(&[k2.to_data(), too_big.to_data()], &[0], Some(&[93, 94]))?;
    let got = rows.finish()?;
    let hash_column = got
        .column(2)
        .as_any()
        .downcast_ref::<arrow_array::UInt64Array>()
        .ok_or("not hashes")?;
    assert_eq!(hash_column.values().to_vec(), [14, 12, 11, 13, 93]);
    assert_eq!(got.schema(), schema);
    let narrow = got
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("not narrowed")?;
    assert_eq!(
        narrow.iter().collect::<Vec<_>>(),
        vec![Some(7), None, Some(-5), Some(999_999_999_999_999), Some(1)]
    );
    Ok(())
}

#[test]
fn halving_rows_gather_int32_while_their_batches_fit() -> TestResult {
    let (schema, _) = key_decimal_hash()?;
    let k = Int64Array::from(vec![10, -20, 30]);
    let d = Decimal128Array::from(vec![Some(-5), None, Some(i128::from(i32::MAX))])
        .with_precision_and_scale(15, 2)?;
    let columns = [k.to_data(), d.to_data()];
    let fits = [spilljoin_spill::fits_i32(&k), spilljoin_spill::fits_i32(&d)];
    assert_eq!(fits, [true, true]);
    let mut rows = GatherBuffer::halving(Arc::clone(&schema))?;
    rows.shape_for(&fits);
    assert_eq!(rows.row_bytes(), 4 + 4 + 8);
    rows.append(&columns, &[2, 0], Some(&[7, 8, 9]))?;
    rows.append(&columns, &[1], Some(&[7, 8, 9]))?;
    // A batch whose key does not fit is not admitted to these rows.
    assert!(!rows.admits(&[false, true], &Growth::default()));
    assert!(rows.admits(&fits, &Growth::default()));
    let got = rows.finish()?;
    assert_eq!(
        got.schema(),
        spilljoin_spill::segment_schema(&schema, &[0, 1])
    );
    let ints = |i: usize| -> std::result::Result<Vec<Option<i32>>, &str> {
        let c = got.column(i).as_any().downcast_ref::<Int32Array>();
        Ok(c.ok_or("not Int32")?.iter().collect())
    };
    assert_eq!(ints(0)?, [Some(30), Some(10), Some(-20)]);
    assert_eq!(ints(1)?, [Some(i32::MAX), Some(-5), None]);
    // Emptied, the buffers admit any batch and take its shape: the key wide.
    assert!(rows.admits(&[false, false], &Growth::default()));
    let big = Int64Array::from(vec![1 << 40]);
    let d1 = Decimal128Array::from(vec![Some(3)]).with_precision_and_scale(15, 2)?;
    rows.shape_for(&[false, true]);
    assert_eq!(rows.row_bytes(), 8 + 4 + 8);
    rows.append(&[big.to_data(), d1.to_data()], &[0], Some(&[5]))?;
    let got = rows.finish()?;
    assert_eq!(got.column(0).data_type(), &DataType::Int64);
    assert_eq!(got.column(1).data_type(), &DataType::Int32);
    let key = got.column(0).as_any().downcast_ref::<Int64Array>();
    assert_eq!(key.ok_or("not Int64")?.value(0), 1 << 40);
    // Rows that are not halving never halve.
    let mut plain = GatherBuffer::new(Arc::clone(&schema))?;
    plain.shape_for(&fits);
    assert_eq!(plain.row_bytes(), 24);
    Ok(())
}

#[test]
fn refuses_other_types_and_rows_past_the_end() -> TestResult {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
    assert!(rows.append(&[ints.to_data()], &[0], None).is_err());
    let longs: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    assert!(rows.append(&[longs.to_data()], &[2], None).is_err());
    assert_eq!(rows.len(), 0);
    assert!(fixed_widths(&Arc::new(Schema::new(vec![Field::new(
        "s",
        DataType::Utf8,
        false
    )])))
    .is_none());
    // Nested columns are not gathered.
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int32, true)));
    let nested: SchemaRef = Arc::new(Schema::new(vec![Field::new("l", list, true)]));
    assert!(!gatherable(&nested));
    assert!(GatherBuffer::new(nested).is_err());
    Ok(())
}

/// Arrays of every layout the gatherer holds, `n` rows from `seed`, with nulls
/// where `nulls`: short and long strings, views into shared buffers, dictionaries.
fn every_layout(
    n: usize,
    seed: u64,
    nulls: bool,
) -> std::result::Result<Vec<ArrayRef>, ArrowError> {
    use arrow_array::types::{Int8Type, UInt32Type};
    use arrow_array::{
        BinaryArray, BooleanArray, DictionaryArray, FixedSizeBinaryArray, LargeStringArray,
        NullArray, StringArray, StringViewArray,
    };
    let text = |i: usize| -> Option<String> {
        let v = (i as u64).wrapping_mul(2654435761).wrapping_add(seed);
        if nulls && v.is_multiple_of(5) {
            return None;
        }
        // Short (inline in a view) and long (40-120 bytes) strings, mixed.
        let len = if v.is_multiple_of(3) {
            (v % 12) as usize
        } else {
            40 + (v % 81) as usize
        };
        Some(
            (0..len)
                .map(|j| char::from(b'a' + ((v as usize + j) % 26) as u8))
                .collect(),
        )
    };
    let strings: Vec<Option<String>> = (0..n).map(text).collect();
    let utf8: StringArray = strings.iter().map(|s| s.as_deref()).collect();
    let large: LargeStringArray = strings.iter().map(|s| s.as_deref()).collect();
    let binary: BinaryArray = strings
        .iter()
        .map(|s| s.as_deref().map(str::as_bytes))
        .collect();
    // Views whose data lives in several small buffers, as a Parquet reader makes.
    let mut views = arrow_array::builder::StringViewBuilder::new().with_fixed_block_size(1024);
    for s in &strings {
        views.append_option(s.as_deref());
    }
    let views: StringViewArray = views.finish();
    let booleans: BooleanArray = (0..n)
        .map(|i| (!nulls || i % 7 != 0).then_some(i % 3 == 0))
        .collect();
    let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        (0..n).map(|i| (!nulls || i % 4 != 0).then_some([(i % 251) as u8, 7, 9])),
        3,
    )?;
    let words = ["red", "a colour rather longer than twelve", "blue", "green"];
    let dict: DictionaryArray<UInt32Type> = (0..n)
        .map(|i| (!nulls || i % 6 != 0).then(|| words[(i + seed as usize) % 4]))
        .collect();
    let names: Vec<String> = (0..n)
        .map(|i| format!("v{}", (i as u64 + seed) % 100))
        .collect();
    let small: DictionaryArray<Int8Type> = names.iter().map(|s| Some(s.as_str())).collect();
    Ok(vec![
        Arc::new(utf8),
        Arc::new(large),
        Arc::new(binary),
        Arc::new(views),
        Arc::new(booleans),
        Arc::new(fixed),
        Arc::new(dict),
        Arc::new(small),
        Arc::new(NullArray::new(n)),
    ])
}

#[test]
fn gathers_every_layout_as_take_and_concat_would() -> TestResult {
    let first = every_layout(300, 1, false)?;
    let second = every_layout(200, 2, true)?;
    // Sliced inputs: offsets, views and bitmaps that do not start at 0.
    let first: Vec<ArrayRef> = first.iter().map(|c| c.slice(20, 250)).collect();
    let fields: Vec<Field> = first
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    assert!(gatherable(&schema));
    let data =
        |columns: &[ArrayRef]| -> Vec<ArrayData> { columns.iter().map(|c| c.to_data()).collect() };
    let picks: [(&[ArrayRef], Vec<u32>); 3] = [
        (&first, (0..250).rev().step_by(3).collect()),
        (&second, (0..200).step_by(2).collect()),
        (&first, vec![5, 5, 249, 0]),
    ];
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    for (columns, picked) in &picks {
        let growth = Growth::of(&data(columns), picked);
        let said = rows.capacity_after(&growth);
        rows.append(&data(columns), picked, None)?;
        assert!(
            rows.held() <= said,
            "held {} over the {said} it said",
            rows.held()
        );
    }
    // The buffers' count of their rows' bytes (what the output sends batches with)
    // is the measure of the batch they make, within its per-column overhead.
    let counted = rows.bytes();
    let got = rows.finish()?;
    let measured = crate::batches::batch_bytes(&got);
    let slack = 64 * got.num_columns();
    assert!(
        counted.abs_diff(measured) <= slack,
        "counted {counted} bytes, the batch measures {measured}"
    );
    for (i, column) in got.columns().iter().enumerate() {
        let parts: Vec<ArrayRef> = picks
            .iter()
            .map(|(columns, picked)| {
                take(
                    columns[i].as_ref(),
                    &arrow_array::UInt32Array::from(picked.clone()),
                    None,
                )
            })
            .collect::<std::result::Result<_, _>>()?;
        let parts: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
        let want = arrow_select::concat::concat(&parts)?;
        column.to_data().validate_full()?;
        assert_eq!(column.len(), want.len(), "column {i}");
        // Logically equal (dictionaries are compared by their values).
        let (g, w) = match column.data_type() {
            DataType::Dictionary(_, v) => {
                (arrow_cast::cast(column, v)?, arrow_cast::cast(&want, v)?)
            }
            _ => (Arc::clone(column), want),
        };
        assert_eq!(
            g.as_ref(),
            w.as_ref(),
            "column {i} ({})",
            column.data_type()
        );
    }
    Ok(())
}

#[test]
fn gathered_views_hold_only_their_rows_bytes() -> TestResult {
    // A few rows of a view array whose buffer holds 10,000 long strings: what is
    // gathered, and what a batch of it holds, is those rows' bytes.
    let all: arrow_array::StringViewArray = (0..10_000)
        .map(|i| Some(format!("a string well past twelve bytes, number {i:06}")))
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)]));
    let picked: Vec<u32> = (0..10_000).step_by(100).collect();
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.append(&[all.to_data()], &picked, None)?;
    let row_bytes = 16 + "a string well past twelve bytes, number 000000".len();
    assert!(
        rows.data_bytes() == 100 * (row_bytes - 16),
        "{}",
        rows.data_bytes()
    );
    let got = rows.finish()?;
    let held = held_bytes(&got);
    assert!(held < 2 * 100 * row_bytes + 1024, "{held}");
    got.column(0).to_data().validate_full()?;
    Ok(())
}

#[test]
fn small_dictionary_keys_admit_rows_while_their_values_fit() -> TestResult {
    use arrow_array::types::Int8Type;
    use arrow_array::DictionaryArray;
    // Int8 keys address 128 values. Two sources share 100 values by content: both
    // fit one buffer. A third source of 100 new values does not.
    let dict = |names: Vec<String>| -> DictionaryArray<Int8Type> {
        names.iter().map(|s| Some(s.as_str())).collect()
    };
    let a = dict((0..100).map(|i| format!("v{i}")).collect());
    let b = dict((0..100).rev().map(|i| format!("v{i}")).collect());
    let c = dict((0..100).map(|i| format!("w{i}")).collect());
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(
        "d",
        a.data_type().clone(),
        true,
    )]));
    let all: Vec<u32> = (0..100).collect();
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.append(&[a.to_data()], &all, None)?;
    rows.append(&[b.to_data()], &all, None)?;
    let growth = Growth::of(&[c.to_data()], &all);
    assert!(!rows.admits(&[], &growth));
    // Appended anyway (a partition in memory is one batch), its keys overflow.
    assert!(rows.append(&[c.to_data()], &all, None).is_err());
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    rows.append(&[a.to_data()], &all, None)?;
    rows.append(&[b.to_data()], &all, None)?;
    let got = rows.finish()?;
    let d = arrow_array::cast::AsArray::as_dictionary::<Int8Type>(got.column(0));
    assert_eq!(d.values().len(), 100);
    // The emptied buffer takes the third source.
    assert!(rows.admits(&[], &growth));
    rows.append(&[c.to_data()], &all, None)?;
    assert_eq!(rows.finish()?.num_rows(), 100);
    Ok(())
}

#[test]
fn a_large_source_dictionary_is_mapped_by_the_values_gathered() -> TestResult {
    use arrow_array::types::{Int16Type, Int32Type};
    use arrow_array::DictionaryArray;
    // 100,000 distinct values, a few rows of them gathered at a time (as a probe batch
    // cut into hundreds of partitions is): the buffer counts a mapping of the values it
    // gathers, not of the whole dictionary (400 KB), and gathers the same as `take`.
    let names: Vec<String> = (0..100_000).map(|i| format!("value {i}")).collect();
    let source: DictionaryArray<Int32Type> = names.iter().map(|s| Some(s.as_str())).collect();
    // A single row first (the smallest table), then growing ones, repeats included.
    let many: Vec<u32> = (100..140).collect();
    let picks: [&[u32]; 5] = [
        &[7],
        &[5, 99_999, 70_000],
        &[5, 12],
        &[42_000, 42_000, 1, 2, 3, 4, 6, 8, 9],
        &many,
    ];
    let got = gather_small_pieces(&source, &picks)?;
    let d = arrow_array::cast::AsArray::as_dictionary::<Int32Type>(got.column(0));
    assert_eq!(d.values().len(), 53, "each value once");
    // Int16 keys (values interned by their bytes) over a 20,000-value dictionary.
    let small: DictionaryArray<Int16Type> =
        names[..20_000].iter().map(|s| Some(s.as_str())).collect();
    gather_small_pieces(&small, &[&[19_999, 3], &[3, 4]])?;
    Ok(())
}

/// Gathers `picks` of `source`, one append each, checking that each append's memory
/// is what `capacity_after` said and under 16 KiB, and that the rows gathered are
/// `take`'s; returns them.
fn gather_small_pieces(
    source: &dyn Array,
    picks: &[&[u32]],
) -> std::result::Result<RecordBatch, Box<dyn std::error::Error>> {
    let cast = |a: &dyn Array| arrow_cast::cast(a, &DataType::Utf8);
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(
        "d",
        source.data_type().clone(),
        true,
    )]));
    let mut rows = GatherBuffer::new(schema)?;
    for pick in picks {
        let growth = Growth::of(&[source.to_data()], pick);
        let said = rows.capacity_after(&growth);
        assert!(said < 16 << 10, "{said}");
        rows.append(&[source.to_data()], pick, None)?;
        assert!(rows.held() <= said, "held {} > said {said}", rows.held());
    }
    let got = rows.finish()?;
    let indices = arrow_array::UInt32Array::from(picks.concat());
    let expected = take(source, &indices, None)?;
    assert_eq!(
        cast(got.column(0))?.as_ref(),
        cast(expected.as_ref())?.as_ref()
    );
    Ok(got)
}

/// Bytes of memory a batch holds: every buffer its arrays reference, whole, each
/// counted once however many arrays share it.
fn held_bytes(batch: &RecordBatch) -> usize {
    fn add(data: &arrow_data::ArrayData, buffers: &mut Vec<(usize, usize)>) {
        let all = data
            .buffers()
            .iter()
            .chain(data.nulls().map(|n| n.buffer()));
        buffers.extend(all.map(|b| (b.data_ptr().as_ptr() as usize, b.capacity())));
        for child in data.child_data() {
            add(child, buffers);
        }
    }
    let mut buffers = Vec::new();
    for column in batch.columns() {
        add(&column.to_data(), &mut buffers);
    }
    buffers.sort_unstable();
    buffers.dedup_by_key(|b| b.0);
    buffers.iter().map(|b| b.1).sum()
}

#[test]
fn views_gather_as_offsets_into_a_spill_file_schema() -> TestResult {
    use arrow_array::cast::AsArray;
    use arrow_array::{BinaryViewArray, StringViewArray};
    let logical: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8View, true),
        Field::new("b", DataType::BinaryView, false),
    ]));
    let schema = spilljoin_spill::file_schema(&logical);
    assert_eq!(schema.field(0).data_type(), &DataType::Utf8);
    assert_eq!(schema.field(1).data_type(), &DataType::Binary);
    let strings: StringViewArray = [
        Some("short"),
        None,
        Some("a value well past the twelve bytes a view inlines"),
        Some(""),
        Some("twelve bytes"),
        Some("thirteen byte"),
    ]
    .into_iter()
    .collect();
    let binary: BinaryViewArray = (0..6u8)
        .map(|i| Some(vec![i; 4 * usize::from(i)]))
        .collect();
    // Sliced inputs: their views keep pointing into the whole arrays' buffers.
    let (s, b) = (strings.slice(1, 5), binary.slice(1, 5));
    let data = [s.to_data(), b.to_data()];
    let rows: [u32; 6] = [4, 0, 1, 3, 1, 2];
    let growth = Growth::of(&data, &rows);
    let mut gathered = GatherBuffer::new(Arc::clone(&schema))?;
    assert!(gathered.admits(&[], &growth));
    let before = gathered.capacity_after(&growth);
    gathered.append(&data, &rows, None)?;
    assert!(gathered.held() <= before, "{} > {before}", gathered.held());
    let got = gathered.finish()?;
    assert_eq!(got.schema(), schema);
    let want_s: Vec<Option<&str>> = rows
        .iter()
        .map(|&r| s.is_valid(r as usize).then(|| s.value(r as usize)))
        .collect();
    assert_eq!(
        got.column(0).as_string::<i32>().iter().collect::<Vec<_>>(),
        want_s
    );
    let want_b: Vec<&[u8]> = rows.iter().map(|&r| b.value(r as usize)).collect();
    let got_b: Vec<&[u8]> = got.column(1).as_binary::<i32>().iter().flatten().collect();
    assert_eq!(got_b, want_b);
    // Only the rows' own bytes: 13 + 49 + 12 + 49 strings, 20 + 4 + 8 + 16 + 8 + 12
    // bytes.
    assert_eq!(got.column(0).as_string::<i32>().values().len(), 123);
    assert_eq!(got.column(1).as_binary::<i32>().values().len(), 68);
    Ok(())
}

/// Rows that come to each column from a source of its own (a join's pairs) are
/// gathered as `take` of each column by its own rows, concatenated, would make them:
/// strings long and short, views, nulls, sliced sources; a row past a source's end
/// or a column of another type is refused with nothing appended.
#[test]
fn gathers_pairs_from_two_sources_as_take_would() -> TestResult {
    use arrow_array::{StringArray, StringViewArray};
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("p_id", DataType::Int64, true),
        Field::new("b_name", DataType::Utf8View, true),
        Field::new("p_text", DataType::Utf8, true),
        Field::new("b_id", DataType::Int32, false),
    ]));
    let text =
        |i: i64| (i % 5 != 2).then(|| format!("{i}-{}", "long text ".repeat((i % 4) as usize)));
    let probe: Vec<ArrayRef> = vec![
        Arc::new(
            (0..40)
                .map(|i| (i % 7 != 0).then_some(i))
                .collect::<Int64Array>(),
        ),
        Arc::new((0..40).map(text).collect::<StringArray>()),
    ];
    let probe: Vec<ArrayRef> = probe.iter().map(|c| c.slice(3, 30)).collect();
    let build: Vec<ArrayRef> = vec![
        Arc::new((100..120).map(text).collect::<StringViewArray>()),
        Arc::new(Int32Array::from_iter_values(100..120)),
    ];
    let (p, b): (Vec<u32>, Vec<u32>) = (0..45u32).map(|k| ((k * 7) % 30, (k * 3) % 20)).unzip();
    let (pd, bd) = (probe[0].to_data(), probe[1].to_data());
    let (nd, id) = (build[0].to_data(), build[1].to_data());
    let mut rows = GatherBuffer::new(Arc::clone(&schema))?;
    for (start, end) in [(0, 1), (1, 20), (20, 45)] {
        let (p, b) = (&p[start..end], &b[start..end]);
        rows.append_columns(&[(&pd, p), (&nd, b), (&bd, p), (&id, b)])?;
    }
    let got = rows.finish()?;
    let (p, b) = (
        arrow_array::UInt32Array::from(p),
        arrow_array::UInt32Array::from(b),
    );
    let want = [
        take(probe[0].as_ref(), &p, None)?,
        take(build[0].as_ref(), &b, None)?,
        take(probe[1].as_ref(), &p, None)?,
        take(build[1].as_ref(), &b, None)?,
    ];
    for (i, (got, want)) in got.columns().iter().zip(&want).enumerate() {
        assert_eq!(got.as_ref(), want.as_ref(), "column {i}");
    }
    // Refused: a row past the probe's end, a column of another type.
    let past = [0u32, 30];
    assert!(rows
        .append_columns(&[(&pd, &past), (&nd, &[0, 1]), (&bd, &past), (&id, &[0, 1])])
        .is_err());
    assert!(rows
        .append_columns(&[(&id, &[0]), (&nd, &[0]), (&bd, &[0]), (&id, &[0])])
        .is_err());
    assert_eq!(rows.len(), 0);
    Ok(())
}
