//! A spill file read by several readers at once (`SpillFile::readers`): the parts
//! together yield every batch once, in order, in files of their own and shared
//! ones, with every compression and read mode and with direct I/O, across segments
//! of the stream; a file with a dictionary column stays whole.

mod common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringViewArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use common::*;
use spilljoin_spill::{SpillConfig, SpillFile, SpillManager, SpillReader};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8View, true),
    ]))
}

/// `rows` rows from key `start`: keys past 32 bits open a new, wide segment
/// (`narrow`), and the view column is written as offsets.
fn batch(start: i64, rows: usize) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(start..start + rows as i64)),
            Arc::new(StringViewArray::from_iter((0..rows).map(|i| {
                (i % 5 != 0).then(|| format!("a value long enough to leave the view {start}-{i}"))
            }))),
        ],
    )
    .unwrap()
}

/// Batches that open three segments, with an empty batch among them.
fn batches() -> Vec<RecordBatch> {
    let mut out: Vec<RecordBatch> = (0..6).map(|i| batch(i * 100, 50 + i as usize)).collect();
    out.push(batch(1 << 40, 30));
    out.push(batch(7, 0));
    out.extend((0..5).map(|i| batch((1 << 41) + i * 10, 20)));
    out
}

/// What each reader yields, in the order of the readers.
fn read_parts(readers: Vec<SpillReader>) -> Vec<RecordBatch> {
    readers
        .into_iter()
        .flat_map(|r| r.map(Result::unwrap).collect::<Vec<_>>())
        .collect()
}

fn assert_parts_read_back(file: &SpillFile, want: &[RecordBatch], what: &str) {
    for parts in 1..=5 {
        let readers = file.readers(parts).unwrap();
        assert!(readers.len() <= parts, "{what}: {parts}");
        if parts > 1 {
            assert!(readers.len() > 1, "{what}: {parts} parts, one reader");
        }
        assert_eq!(read_parts(readers), want, "{what}: {parts} parts");
    }
}

#[test]
fn parts_read_back_every_batch_once_in_order() {
    let want = batches();
    for compression in COMPRESSIONS {
        for mode in READ_MODES {
            for direct in [false, true] {
                let m = SpillManager::new(
                    SpillConfig::default()
                        .with_compression(compression)
                        .with_read_mode(mode)
                        .with_direct_io(direct),
                )
                .unwrap();
                let what = format!("{compression}/{mode}/direct {direct}");
                let own = spill(&m, schema(), &want);
                assert_parts_read_back(&own, &want, &format!("own, {what}"));
                // Two streams interleaved in one shared file: each part's extents
                // skip the other stream's messages.
                let group = m.create_group("parts", 1);
                let mut a = group.create_writer(schema(), 0).unwrap();
                let mut b = group.create_writer(schema(), 0).unwrap();
                for x in &want {
                    a.write(x).unwrap();
                    b.write(&batch(-3, 4)).unwrap();
                }
                let (a, b) = (a.finish().unwrap(), b.finish().unwrap());
                assert_eq!(group.files_created(), 1);
                assert_parts_read_back(&a, &want, &format!("shared, {what}"));
                let other = read_parts(b.readers(3).unwrap());
                assert_eq!(other.len(), want.len());
            }
        }
    }
}

#[test]
fn parts_read_on_threads_at_once() {
    let m = manager(COMPRESSIONS[0], READ_MODES[0]);
    let want = batches();
    let file = spill(&m, schema(), &want);
    let readers = file.readers(4).unwrap();
    assert_eq!(readers.len(), 4);
    let got: Vec<Vec<RecordBatch>> = std::thread::scope(|s| {
        let handles: Vec<_> = readers
            .into_iter()
            .map(|r| s.spawn(move || r.map(Result::unwrap).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got.concat(), want);
    drop(file);
    assert_eq!(m.live_files(), 0);
}

#[test]
fn files_too_small_or_with_dictionaries_stay_whole() {
    let m = manager(COMPRESSIONS[0], READ_MODES[0]);
    let one = spill(&m, schema(), &[batch(0, 10)]);
    assert_eq!(one.readers(4).unwrap().len(), 1);
    let empty = spill(&m, schema(), &[]);
    let readers = empty.readers(4).unwrap();
    assert_eq!(readers.len(), 1);
    assert_eq!(read_parts(readers).len(), 0);
    let all = all_types_batch(100, 1);
    assert!(all
        .schema()
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Dictionary(..))));
    let want = vec![all.slice(0, 40), all.slice(40, 30), all.slice(70, 30)];
    let dict = spill(&m, all.schema(), &want);
    let readers = dict.readers(3).unwrap();
    assert_eq!(readers.len(), 1);
    assert_eq!(read_parts(readers), want);
}
