//! Everything written comes back identical: every type, every compression,
//! both read modes, sliced and empty batches, files without batches.

mod common;

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, Int64Array, ListArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use proptest::prelude::*;

use common::*;
use spilljoin_spill::{read_spill_file, SpillCompression, SpillReadMode};

#[test]
fn every_type_round_trips_in_every_compression_and_read_mode() {
    let full = all_types_batch(300, 7);
    let batches = vec![
        all_types_batch(100, 1),
        full.slice(37, 150), // sliced: non-zero offsets everywhere
        full.slice(299, 1),
        full.slice(10, 0), // empty
        all_types_batch(1, 2),
    ];
    let schema = full.schema();
    for compression in COMPRESSIONS {
        for mode in READ_MODES {
            let m = manager(compression, mode);
            let file = spill(&m, schema.clone(), &batches);
            assert_eq!(file.rows(), 252);
            assert_eq!(file.batches(), 5);
            let read = read_all(&file).unwrap();
            assert_eq!(read.len(), batches.len(), "{compression}/{mode}");
            for (i, (got, want)) in read.iter().zip(&batches).enumerate() {
                assert_eq!(got.schema(), schema, "{compression}/{mode} batch {i}");
                for (c, (g, w)) in got.columns().iter().zip(want.columns()).enumerate() {
                    assert_eq!(
                        g.to_data(),
                        w.to_data(),
                        "{compression}/{mode} batch {i} column {}",
                        schema.field(c).name()
                    );
                }
                got.columns()
                    .iter()
                    .for_each(|a| a.to_data().validate_full().unwrap());
            }
            // The foreign-file path (full validation) agrees.
            let foreign: Vec<_> = read_spill_file(file.path(), Some(schema.clone()), mode)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(foreign, batches, "{compression}/{mode} via read_spill_file");
        }
    }
}

#[test]
fn compression_shrinks_the_file() {
    let batch = all_types_batch(2000, 3);
    let size = |c| {
        let m = manager(c, SpillReadMode::Buffered);
        spill(&m, batch.schema(), std::slice::from_ref(&batch)).bytes()
    };
    let none = size(SpillCompression::None);
    assert!(size(SpillCompression::Lz4) < none);
    assert!(size(SpillCompression::Zstd) < none);
}

#[test]
fn a_file_without_batches_reads_as_empty() {
    let schema = all_types_batch(0, 0).schema();
    for compression in COMPRESSIONS {
        for mode in READ_MODES {
            let m = manager(compression, mode);
            let file = spill(&m, schema.clone(), &[]);
            assert_eq!((file.rows(), file.batches()), (0, 0));
            let mut reader = file.reader().unwrap();
            assert_eq!(reader.schema(), schema);
            assert!(reader.next().is_none());
            assert!(reader.next().is_none());
        }
    }
}

#[test]
fn empty_batches_are_kept() {
    let batch = all_types_batch(0, 5);
    for mode in READ_MODES {
        let m = manager(SpillCompression::Lz4, mode);
        let file = spill(&m, batch.schema(), &[batch.clone(), batch.clone()]);
        let read = read_all(&file).unwrap();
        assert_eq!(read, vec![batch.clone(), batch.clone()]);
    }
}

#[test]
fn batches_carry_the_expected_schema_arc() {
    let batch = all_types_batch(10, 9);
    let schema = batch.schema();
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let file = spill(&m, schema.clone(), std::slice::from_ref(&batch));
    for b in file.reader().unwrap() {
        assert!(Arc::ptr_eq(b.unwrap().schema_ref(), &schema));
    }
    // Without an expected schema, the file's own (equal) schema is used.
    let mut r = read_spill_file(file.path(), None, SpillReadMode::Mmap).unwrap();
    assert_eq!(r.schema(), schema);
    assert_eq!(r.next().unwrap().unwrap(), batch);
    assert!(r.next().is_none());
}

#[test]
fn a_file_can_be_read_many_times() {
    let batch = all_types_batch(50, 11);
    let m = manager(SpillCompression::Zstd, SpillReadMode::Mmap);
    let file = spill(&m, batch.schema(), std::slice::from_ref(&batch));
    let readers: Vec<_> = (0..3).map(|_| file.reader().unwrap()).collect();
    for r in readers {
        assert_eq!(
            r.collect::<Result<Vec<_>, _>>().unwrap(),
            vec![batch.clone()]
        );
    }
}

#[test]
fn dictionaries_that_change_between_batches() {
    // Each batch has its own dictionary: the stream re-sends it.
    let a = all_types_batch(40, 20);
    let b = all_types_batch(40, 21);
    for mode in READ_MODES {
        let m = manager(SpillCompression::None, mode);
        let file = spill(&m, a.schema(), &[a.clone(), b.clone(), a.clone()]);
        assert_eq!(
            read_all(&file).unwrap(),
            vec![a.clone(), b.clone(), a.clone()]
        );
    }
}

fn random_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("l", DataType::new_list(DataType::Int32, true), true),
    ]))
}

prop_compose! {
    fn random_batch()(rows in prop::collection::vec(
        (
            prop::option::weighted(0.8, any::<i64>()),
            prop::option::weighted(0.8, ".{0,40}"),
            prop::option::weighted(0.8, prop::collection::vec(prop::option::of(any::<i32>()), 0..5)),
        ),
        0..200,
    ), offset in 0usize..20) -> RecordBatch {
        let k: Int64Array = rows.iter().map(|r| r.0).collect();
        let s: StringArray = rows.iter().map(|r| r.1.clone()).collect();
        let l = ListArray::from_iter_primitive::<Int32Type, _, _>(rows.iter().map(|r| r.2.clone()));
        let columns: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(s), Arc::new(l)];
        let batch = RecordBatch::try_new(random_schema(), columns).unwrap();
        let offset = offset.min(batch.num_rows());
        batch.slice(offset, batch.num_rows() - offset)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_batches_round_trip(
        batches in prop::collection::vec(random_batch(), 0..5),
        compression in prop::sample::select(COMPRESSIONS.to_vec()),
        mode in prop::sample::select(READ_MODES.to_vec()),
    ) {
        let m = manager(compression, mode);
        let file = spill(&m, random_schema(), &batches);
        prop_assert_eq!(file.rows(), batches.iter().map(|b| b.num_rows() as u64).sum::<u64>());
        let read = read_all(&file).unwrap();
        prop_assert_eq!(&read, &batches);
        for b in &read {
            for c in b.columns() {
                prop_assert!(c.to_data().validate_full().is_ok());
                prop_assert_eq!(c.len(), b.num_rows());
            }
        }
    }
}

#[test]
fn a_read_batch_holds_its_own_message_not_the_whole_file() {
    // arrow counts a buffer's capacity as memory; an mmap-backed batch must
    // not claim the whole mapping.
    let batches: Vec<_> = (0..20).map(|i| all_types_batch(200, i)).collect();
    for mode in READ_MODES {
        let m = manager(SpillCompression::None, mode);
        let file = spill(&m, batches[0].schema(), &batches);
        for batch in file.reader().unwrap() {
            let batch = batch.unwrap();
            let largest_buffer = batch
                .columns()
                .iter()
                .flat_map(|c| c.to_data().buffers().to_vec())
                .map(|b| b.capacity())
                .max()
                .unwrap();
            assert!(
                (largest_buffer as u64) < file.bytes() / 10,
                "{mode}: a buffer of {largest_buffer} bytes in a file of {}",
                file.bytes()
            );
        }
    }
}

/// A batch gathered narrow by the caller (in the file schema: decimals of at most 18
/// digits as Int64) is written as it is and read back in the writer's schema, the
/// same as the wide batch it stands for.
#[test]
fn batches_already_in_the_file_schema_read_back_wide() -> Result<(), Box<dyn std::error::Error>> {
    use arrow_array::Decimal128Array;
    let logical = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("price", DataType::Decimal128(15, 2), true),
    ]));
    let file_schema = spilljoin_spill::file_schema(&logical);
    assert_eq!(file_schema.field(1).data_type(), &DataType::Int64);
    let keys: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
    let wide = RecordBatch::try_new(
        logical.clone(),
        vec![
            keys.clone(),
            Arc::new(
                Decimal128Array::from(vec![Some(12_345), None, Some(-99_999_999_999_999)])
                    .with_precision_and_scale(15, 2)?,
            ),
        ],
    )?;
    let narrow = RecordBatch::try_new(
        file_schema.clone(),
        vec![
            keys,
            Arc::new(Int64Array::from(vec![
                Some(12_345),
                None,
                Some(-99_999_999_999_999),
            ])),
        ],
    )?;
    for mode in READ_MODES {
        let m = manager(SpillCompression::None, mode);
        let mut writer = m.create_writer(logical.clone(), "narrow")?;
        writer.write(&narrow)?;
        writer.write(&wide)?;
        // Any other schema is still refused.
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )?;
        assert!(writer.write(&other).is_err());
        let file = writer.finish()?;
        assert_eq!(read_all(&file)?, vec![wide.clone(), wide.clone()]);
    }
    Ok(())
}

/// A batch of an `Int64` key, a narrow decimal and a dictionary column.
fn segment_batch(
    schema: &Arc<Schema>,
    keys: Vec<i64>,
    prices: Vec<Option<i128>>,
) -> Result<RecordBatch, Box<dyn std::error::Error>> {
    use arrow_array::{Decimal128Array, DictionaryArray};
    let n = keys.len() as i32;
    let names: DictionaryArray<Int32Type> =
        (0..n).map(|i| ["a", "b", "c"][i as usize % 3]).collect();
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Decimal128Array::from(prices).with_precision_and_scale(15, 2)?),
            Arc::new(names),
        ],
    )?)
}

#[test]
fn columns_written_in_32_bits_widen_when_a_batch_needs_it() -> Result<(), Box<dyn std::error::Error>>
{
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("price", DataType::Decimal128(15, 2), true),
        Field::new(
            "name",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
    ]));
    let big = 1_i64 << 40;
    let small = segment_batch(&schema, vec![1, -2, 3], vec![Some(5), None, Some(-7)])?;
    // The key needs 64 bits: a second segment writes it wide.
    let wide_key = segment_batch(&schema, vec![4, big, 6], vec![Some(1), Some(2), None])?;
    // Then the price: a third.
    let wide_price = segment_batch(&schema, vec![7], vec![Some(i128::from(big))])?;
    let batches = [
        small.clone(),
        wide_key,
        small.clone(),
        wide_price,
        small.clone(),
    ];
    for compression in [SpillCompression::None, SpillCompression::Lz4] {
        for mode in READ_MODES {
            let m = manager(compression, mode);
            let file = spill(&m, schema.clone(), &batches);
            assert_eq!(read_all(&file)?, batches.to_vec());
        }
    }
    // Written in 32 bits: 1000 rows of small values take less than 1000 of large.
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let rows = |v: i64| segment_batch(&schema, vec![v; 1000], vec![Some(i128::from(v)); 1000]);
    let narrow = spill(&m, schema.clone(), &[rows(1)?]);
    let wide = spill(&m, schema.clone(), &[rows(big)?]);
    assert!(
        narrow.bytes() + 7000 < wide.bytes(),
        "{} vs {}",
        narrow.bytes(),
        wide.bytes()
    );
    assert_eq!(read_all(&narrow)?, vec![rows(1)?]);
    Ok(())
}

#[test]
fn batches_gathered_halved_read_back_wide_in_any_order() -> Result<(), Box<dyn std::error::Error>> {
    use arrow_array::{Decimal128Array, Int32Array};
    let logical = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("price", DataType::Decimal128(15, 2), true),
    ]));
    let wide = spilljoin_spill::file_schema(&logical);
    let logical_batch = |k: Vec<i64>, p: Vec<Option<i128>>| {
        RecordBatch::try_new(
            logical.clone(),
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(Decimal128Array::from(p).with_precision_and_scale(15, 2)?),
            ],
        )
    };
    // Both columns halved; only the price; the same rows in the logical schema.
    let both = RecordBatch::try_new(
        spilljoin_spill::segment_schema(&wide, &[0, 1]),
        vec![
            Arc::new(Int32Array::from(vec![1, -2])),
            Arc::new(Int32Array::from(vec![Some(5), None])),
        ],
    )?;
    let price_only = RecordBatch::try_new(
        spilljoin_spill::segment_schema(&wide, &[1]),
        vec![
            Arc::new(Int64Array::from(vec![1 << 40])),
            Arc::new(Int32Array::from(vec![Some(-7)])),
        ],
    )?;
    let both_read = logical_batch(vec![1, -2], vec![Some(5), None])?;
    let price_only_read = logical_batch(vec![1 << 40], vec![Some(-7)])?;
    // Halved, then a key that needs 64 bits (a new segment), then halved again
    // (widened by the writer into that segment).
    for mode in READ_MODES {
        let m = manager(SpillCompression::None, mode);
        let mut writer = m.create_writer(logical.clone(), "halved")?;
        writer.write(&both)?;
        writer.write(&price_only)?;
        writer.write(&both)?;
        // Int32 where the file has no Int64 column is still refused.
        let bad = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int32, false),
                Field::new("price", DataType::Int32, true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![1])),
                Arc::new(Int32Array::from(vec![1])),
            ],
        )?;
        assert!(writer.write(&bad).is_err());
        let file = writer.finish()?;
        assert_eq!(
            read_all(&file)?,
            vec![
                both_read.clone(),
                price_only_read.clone(),
                both_read.clone()
            ]
        );
    }
    Ok(())
}
