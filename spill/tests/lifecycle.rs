//! Files, directory and quota: what exists when, and what it costs.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use common::*;
use spilljoin_spill::{
    read_spill_file, SpillCompression, SpillConfig, SpillError, SpillManager, SpillReadMode,
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
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 5 != 0).then(|| format!("value-{i}"))),
            )),
        ],
    )
    .unwrap()
}

/// The files in the manager's directory besides its lock file.
fn dir_entries(m: &SpillManager) -> usize {
    std::fs::read_dir(m.dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != spilljoin_spill::OWNER_FILE_NAME)
        .count()
}

#[test]
fn quota_exceeded_carries_the_numbers_and_drops_free_the_quota() {
    let quota = 64 * 1024;
    let m = SpillManager::new(SpillConfig::default().with_disk_quota_bytes(quota)).unwrap();
    let a = spill(&m, schema(), &[batch(100)]);
    assert_eq!(m.disk_used_bytes(), a.bytes());

    let mut w = m.create_writer(schema(), "b").unwrap();
    let err = loop {
        match w.write(&batch(500)) {
            Ok(()) => assert!(m.disk_used_bytes() <= quota),
            Err(e) => break e,
        }
    };
    match &err {
        SpillError::QuotaExceeded {
            path,
            quota_bytes,
            used_bytes,
            requested_bytes,
        } => {
            assert_eq!(path, w.path());
            assert_eq!(*quota_bytes, quota);
            assert!(*used_bytes <= quota);
            assert!(used_bytes + requested_bytes > quota);
            assert!(*requested_bytes > 0);
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert!(err.to_string().contains("quota"), "{err}");
    assert!(m.disk_used_bytes() <= quota);
    assert!(matches!(
        w.write(&batch(1)),
        Err(SpillError::WriterFailed { .. })
    ));
    let b_path = w.path().to_owned();
    assert!(matches!(w.finish(), Err(SpillError::WriterFailed { .. })));
    assert!(!b_path.exists(), "the failed file is deleted");

    assert_eq!(m.disk_used_bytes(), a.bytes(), "b's bytes are back");
    assert_eq!(m.live_files(), 1);
    drop(a);
    assert_eq!(m.disk_used_bytes(), 0);
    assert_eq!(m.live_files(), 0);

    // With the quota free again, the same amount fits.
    let mut w = m.create_writer(schema(), "c").unwrap();
    w.write(&batch(500)).unwrap();
    let c = w.finish().unwrap();
    assert_eq!(read_all(&c).unwrap(), vec![batch(500)]);
}

#[test]
fn a_quota_too_small_for_the_first_message_writes_nothing() {
    let m = SpillManager::new(SpillConfig::default().with_disk_quota_bytes(16)).unwrap();
    // Creating the file costs nothing; the schema goes with the first batch.
    let mut w = m.create_writer(schema(), "tiny").unwrap();
    assert_eq!(m.live_files(), 1);
    match w.write(&batch(1)) {
        Err(SpillError::QuotaExceeded {
            quota_bytes: 16,
            used_bytes: 0,
            requested_bytes,
            ..
        }) => assert!(requested_bytes > 16),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert_eq!(
        std::fs::metadata(w.path()).unwrap().len(),
        0,
        "nothing written"
    );
    drop(w);
    // A file with no batch needs the schema message at `finish`.
    let w = m.create_writer(schema(), "empty").unwrap();
    assert!(matches!(w.finish(), Err(SpillError::QuotaExceeded { .. })));
    assert_eq!(m.live_files(), 0);
    assert_eq!(m.disk_used_bytes(), 0);
    assert_eq!(dir_entries(&m), 0);
}

#[test]
fn the_quota_is_shared_by_all_files_and_threads() {
    let quota = 256 * 1024;
    let m = SpillManager::new(SpillConfig::default().with_disk_quota_bytes(quota)).unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| m.create_writer(schema(), &format!("t{t}")).unwrap())
        .collect();
    let files: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = writers
            .into_iter()
            .map(|mut w| {
                s.spawn(move || {
                    while w.write(&batch(100)).is_ok() {}
                    w
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(m.disk_used_bytes() <= quota);
    // Less than one more batch of room is left.
    assert!(m.disk_used_bytes() + 4096 > quota);
    drop(files);
    assert_eq!(m.disk_used_bytes(), 0);
}

#[test]
fn metrics_are_cumulative() {
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let f1 = spill(&m, schema(), &[batch(10), batch(0)]);
    let f2 = spill(&m, schema(), &[batch(5)]);
    let metrics = m.metrics();
    assert_eq!(metrics.files_created, 2);
    assert_eq!(metrics.rows_written, 15);
    assert_eq!(metrics.batches_written, 3);
    assert_eq!(metrics.bytes_written, f1.bytes() + f2.bytes());
    drop((f1, f2));
    assert_eq!(
        m.metrics(),
        metrics,
        "deleting files does not rewrite history"
    );
    assert_eq!(m.disk_used_bytes(), 0);
}

#[test]
fn files_are_deleted_when_their_last_owner_drops() {
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);

    let mut w = m.create_writer(schema(), "unfinished").unwrap();
    w.write(&batch(10)).unwrap();
    let path = w.path().to_owned();
    assert!(path.exists());
    assert_eq!(m.live_files(), 1);
    drop(w);
    assert!(!path.exists());
    assert_eq!(m.live_files(), 0);

    let file = spill(&m, schema(), &[batch(10)]);
    let path = file.path().to_owned();
    let clone = file.clone();
    drop(file);
    assert!(path.exists(), "a clone still owns it");
    let reader = clone.reader().unwrap();
    drop(clone);
    assert!(path.exists(), "the reader still owns it");
    assert_eq!(
        reader.collect::<Result<Vec<_>, _>>().unwrap(),
        vec![batch(10)]
    );
    assert!(!path.exists());
    assert_eq!(
        (m.live_files(), m.disk_used_bytes(), dir_entries(&m)),
        (0, 0, 0)
    );
}

#[test]
fn the_directory_lives_until_the_manager_and_all_files_are_gone() {
    let m = manager(SpillCompression::Lz4, SpillReadMode::Mmap);
    let dir = m.dir().to_owned();
    let file = spill(&m, schema(), &[batch(3)]);
    let clone = m.clone();
    drop(m);
    assert!(dir.exists());
    drop(clone);
    assert!(dir.exists(), "the file keeps the directory");
    assert_eq!(read_all(&file).unwrap(), vec![batch(3)]);
    drop(file);
    assert!(!dir.exists());
}

#[test]
fn everything_is_removed_when_a_panic_unwinds() {
    let mut seen = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let m = manager(SpillCompression::Zstd, SpillReadMode::Buffered);
        let file = spill(&m, schema(), &[batch(10)]);
        let mut w = m.create_writer(schema(), "in-flight").unwrap();
        w.write(&batch(10)).unwrap();
        seen = Some((
            m.dir().to_owned(),
            file.path().to_owned(),
            w.path().to_owned(),
        ));
        panic!("join failed midway");
    }));
    assert!(result.is_err());
    let (dir, file, unfinished) = seen.unwrap();
    assert!(!file.exists());
    assert!(!unfinished.exists());
    assert!(!dir.exists());

    // A manager that survives the panic gets its quota back.
    let m = SpillManager::new(SpillConfig::default().with_disk_quota_bytes(1 << 20)).unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let _file = spill(&m, schema(), &[batch(10)]);
        let _w = m.create_writer(schema(), "x").unwrap();
        panic!("boom");
    }));
    assert!(result.is_err());
    assert_eq!(
        (m.live_files(), m.disk_used_bytes(), dir_entries(&m)),
        (0, 0, 0)
    );
}

#[test]
fn two_threads_read_one_file_concurrently() {
    let batches: Vec<_> = (0..20).map(|i| all_types_batch(64, i)).collect();
    for mode in READ_MODES {
        let m = manager(SpillCompression::Lz4, mode);
        let file = spill(&m, batches[0].schema(), &batches);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let file = file.clone();
                    s.spawn(move || read_all(&file).unwrap())
                })
                .collect();
            for r in readers {
                assert_eq!(r.join().unwrap(), batches);
            }
        });
    }
}

#[cfg(unix)]
#[test]
fn the_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let mode = std::fs::metadata(m.dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let name = m.dir().file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("spilljoin-"), "{name}");
    let file = spill(&m, schema(), &[batch(1)]);
    let mode = std::fs::metadata(file.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "files are owner-only too");
}

#[test]
fn root_dir_is_honoured_and_a_missing_root_is_a_typed_error() {
    let root = tempfile::tempdir().unwrap();
    let m = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    assert_eq!(m.dir().parent(), Some(root.path()));
    assert_eq!(m.config().root_dir.as_deref(), Some(root.path()));

    let missing = root.path().join("does/not/exist");
    match SpillManager::new(SpillConfig::default().with_root_dir(&missing)) {
        Err(e @ SpillError::CreateDir { .. }) => {
            assert_eq!(e.path(), missing);
            assert!(std::error::Error::source(&e).is_some());
        }
        other => panic!("expected CreateDir, got {other:?}"),
    }
}

#[test]
fn writing_a_batch_of_another_schema_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let mut w = m.create_writer(schema(), "s")?;
    let other = all_types_batch(3, 1);
    match w.write(&other) {
        Err(SpillError::SchemaMismatch {
            path,
            expected,
            found,
        }) => {
            assert_eq!(path, w.path());
            assert_eq!(expected, schema());
            assert_eq!(found, other.schema());
        }
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
    // Same fields, different nullability: also a mismatch.
    let nullable = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    let b = RecordBatch::try_new(nullable, batch(2).columns().to_vec())?;
    assert!(matches!(
        w.write(&b),
        Err(SpillError::SchemaMismatch { .. })
    ));
    // Nothing was written; the writer is still good.
    w.write(&batch(4))?;
    // The writer remembers the equal schema of another `Arc` it just took: another
    // schema is still refused after it, and the equal one still taken.
    assert!(matches!(
        w.write(&b),
        Err(SpillError::SchemaMismatch { .. })
    ));
    w.write(&batch(4))?;
    let file = w.finish()?;
    assert_eq!(read_all(&file)?, vec![batch(4), batch(4)]);
    Ok(())
}

#[test]
fn reading_with_another_expected_schema_is_refused() {
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let file = spill(&m, schema(), &[batch(4)]);
    let other = all_types_batch(0, 0).schema();
    for mode in READ_MODES {
        match read_spill_file(file.path(), Some(other.clone()), mode) {
            Err(SpillError::SchemaMismatch {
                expected, found, ..
            }) => {
                assert_eq!(expected, other);
                assert_eq!(found, schema());
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_missing_file_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.arrows");
    for mode in READ_MODES {
        match read_spill_file(&path, None, mode) {
            Err(SpillError::Io { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }
}
