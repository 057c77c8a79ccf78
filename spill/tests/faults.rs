//! The fault hook (feature `fault-injection`) on real files: a full disk, a garbled
//! message and a read cut short each give the typed error at the operation aimed at,
//! in files of their own and in shared files, in both read modes; and leave nothing
//! behind once the files are dropped.
#![cfg(feature = "fault-injection")]

use std::io::ErrorKind;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use spilljoin_spill::{
    FaultPlan, SpillConfig, SpillError, SpillFile, SpillManager, SpillReadMode, SpillWriter,
};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn batch(rows: usize) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows as i64)),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("value-{i}")),
            )),
        ],
    )
    .unwrap()
}

fn manager(faults: &FaultPlan, mode: SpillReadMode) -> SpillManager {
    SpillManager::new(
        SpillConfig::default()
            .with_read_mode(mode)
            .with_faults(faults.clone()),
    )
    .unwrap()
}

/// A finished file of `batches` batches of 100 rows.
fn written(mut writer: SpillWriter, batches: usize) -> SpillFile {
    for _ in 0..batches {
        writer.write(&batch(100)).unwrap();
    }
    writer.finish().unwrap()
}

/// The batches read before the first error, and the error.
fn read_until_error(file: &SpillFile) -> (usize, SpillError) {
    let mut reader = file.reader().unwrap();
    let mut batches = 0;
    for result in reader.by_ref() {
        match result {
            Ok(_) => batches += 1,
            Err(e) => {
                assert!(reader.next().is_none(), "nothing after an error");
                return (batches, e);
            }
        }
    }
    panic!("read {batches} batches without an error");
}

fn is_no_space(e: &SpillError) -> bool {
    matches!(e, SpillError::Io { source, .. } if source.kind() == ErrorKind::StorageFull)
}

fn assert_clean(m: &SpillManager) {
    assert_eq!(m.live_files(), 0);
    assert_eq!(m.disk_used_bytes(), 0);
    // The directory's owner lock (see `OWNER_FILE_NAME`) stays until the manager goes.
    let left = std::fs::read_dir(m.dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != spilljoin_spill::OWNER_FILE_NAME)
        .count();
    assert_eq!(left, 0);
}

#[test]
fn a_full_disk_fails_the_write_aimed_at_and_the_file_goes_with_its_writer() {
    let faults = FaultPlan::new().no_space_on_write("build", 3);
    let m = manager(&faults, SpillReadMode::Buffered);
    // Another label's writes are not counted.
    let other = written(m.create_writer(schema(), "probe-d0").unwrap(), 4);
    let mut w = m.create_writer(schema(), "build-d0").unwrap();
    w.write(&batch(100)).unwrap();
    w.write(&batch(100)).unwrap();
    let err = w.write(&batch(100)).unwrap_err();
    assert!(is_no_space(&err), "{err:?}");
    #[cfg(unix)]
    assert!(matches!(&err, SpillError::Io { source, .. } if source.raw_os_error() == Some(28)));
    assert_eq!(faults.fired(), 1);
    assert!(matches!(
        w.write(&batch(1)),
        Err(SpillError::WriterFailed { .. })
    ));
    drop(w);
    assert_eq!(other.reader().unwrap().count(), 4);
    drop(other);
    assert_clean(&m);
}

#[test]
fn after_a_full_disk_every_write_to_the_shared_file_says_so() {
    let faults = FaultPlan::new().no_space_on_write("build-d0", 2);
    let m = manager(&faults, SpillReadMode::Buffered);
    let group = m.create_group("build-d0", 1);
    let mut first = group.create_writer(schema(), 0).unwrap();
    let mut second = group.create_writer(schema(), 1).unwrap();
    first.write(&batch(10)).unwrap();
    assert!(is_no_space(&first.write(&batch(10)).unwrap_err()));
    // The other writer of the same shared file: its end is unknown now, and the
    // refusal keeps the kind of the failure (a caller tells a full disk by it).
    let err = second.write(&batch(10)).unwrap_err();
    assert!(is_no_space(&err), "{err:?}");
    drop((first, second, group));
    assert_clean(&m);
}

#[test]
fn a_garbled_message_is_found_where_it_is_read_in_both_modes() {
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        // The second write: the file's second batch.
        let faults = FaultPlan::new().corrupt_write("p", 2);
        let m = manager(&faults, mode);
        let file = written(m.create_writer(schema(), "p").unwrap(), 3);
        assert_eq!(faults.fired(), 1);
        let (read, err) = read_until_error(&file);
        assert_eq!(read, 1, "{mode}");
        assert!(
            matches!(err, SpillError::Corrupt { batch_index: 1, .. }),
            "{mode}: {err:?}"
        );
        // The first message, with the schema: the file does not open.
        let faults = FaultPlan::new().corrupt_write("p", 1);
        let m2 = manager(&faults, mode);
        let file2 = written(m2.create_writer(schema(), "p").unwrap(), 2);
        let err = file2.reader().unwrap_err();
        assert!(matches!(err, SpillError::Corrupt { .. }), "{mode}: {err:?}");
        drop((file, file2));
        assert_clean(&m);
        assert_clean(&m2);
    }
}

/// A changed byte of data still frames: only the write's checksum finds it, in
/// files of their own and in shared ones, in both read modes. The batches of the
/// writes before it are read; none of the write that changed is decoded.
#[test]
fn a_changed_byte_is_found_by_its_writes_checksum() {
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        let faults = FaultPlan::new().flip_byte("own", 2).flip_byte("shared", 3);
        let m = manager(&faults, mode);
        let own = written(m.create_writer(schema(), "own").unwrap(), 4);
        let group = m.create_group("shared", 1);
        let shared = written(group.create_writer(schema(), 0).unwrap(), 4);
        assert_eq!(faults.fired(), 2);
        for (file, before) in [(&own, 1), (&shared, 2)] {
            let (read, err) = read_until_error(file);
            assert_eq!(read, before, "{mode}");
            match &err {
                SpillError::Corrupt { source, .. } => assert!(
                    source.to_string().contains("checksum mismatch"),
                    "{mode}: {err}"
                ),
                other => panic!("{mode}: {other:?}"),
            }
        }
        drop((own, shared, group));
        assert_clean(&m);
    }
}

/// A changed byte in one part of a file read in parts fails only that part's
/// reader, at the batch of the whole file where it is; the other parts read whole.
/// (Three parts of six batches: 0-1, 2-3, 4-5; batch 4 changed, so 5 is not read.)
#[test]
fn a_changed_byte_fails_only_the_part_it_is_in() {
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        let faults = FaultPlan::new().flip_byte("parts", 5);
        let m = manager(&faults, mode);
        let file = written(m.create_writer(schema(), "parts").unwrap(), 6);
        assert_eq!(faults.fired(), 1);
        let mut errors = Vec::new();
        let mut batches = 0;
        let readers = file.readers(3).unwrap();
        assert_eq!(readers.len(), 3);
        for reader in readers {
            for result in reader {
                match result {
                    Ok(_) => batches += 1,
                    Err(e) => errors.push(e),
                }
            }
        }
        assert_eq!(batches, 4, "{mode}");
        match &errors[..] {
            [SpillError::Corrupt {
                source,
                batch_index,
                ..
            }] => {
                assert!(source.to_string().contains("checksum mismatch"), "{mode}");
                assert_eq!(*batch_index, 4, "{mode}");
            }
            other => panic!("{mode}: {other:?}"),
        }
        drop(file);
        assert_clean(&m);
    }
}

#[test]
fn a_read_cut_short_is_corrupt_in_files_of_their_own_and_shared_ones() {
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        // Batch 3 of the first file read, and the end-of-stream marker of a shared
        // one's (the fifth message read of "shared" files: 4 batches, the marker).
        let faults = FaultPlan::new()
            .short_read("own", 3)
            .short_read("shared", 5);
        let m = manager(&faults, mode);
        let own = written(m.create_writer(schema(), "own").unwrap(), 4);
        let group = m.create_group("shared", 1);
        let shared = written(group.create_writer(schema(), 0).unwrap(), 4);
        let (read, err) = read_until_error(&own);
        assert_eq!(read, 2, "{mode}");
        assert!(
            matches!(err, SpillError::Corrupt { batch_index: 2, .. }),
            "{mode}"
        );
        let (read, err) = read_until_error(&shared);
        assert_eq!(read, 4, "{mode}");
        assert!(matches!(err, SpillError::Corrupt { .. }), "{mode}: {err:?}");
        assert_eq!(faults.fired(), 2);
        // Each rule fired once: the files read whole now.
        assert_eq!(own.reader().unwrap().count(), 4);
        assert_eq!(shared.reader().unwrap().count(), 4);
        drop((own, shared, group));
        assert_clean(&m);
    }
}

#[test]
fn a_plan_belongs_to_the_managers_created_with_it() {
    let faults = FaultPlan::new().no_space_on_write("p", 1);
    let with = manager(&faults, SpillReadMode::Buffered);
    let without = SpillManager::new(SpillConfig::default()).unwrap();
    let file = written(without.create_writer(schema(), "p").unwrap(), 2);
    assert_eq!((faults.fired(), faults.seen()), (0, vec![0]));
    let mut w = with.create_writer(schema(), "p").unwrap();
    assert!(is_no_space(&w.write(&batch(1)).unwrap_err()));
    assert_eq!(with.config().faults.as_ref(), Some(&faults));
    drop((w, file));
    assert_clean(&with);
    assert_clean(&without);
}
