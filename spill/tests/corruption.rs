//! Truncated, bit-flipped and garbage files: always a typed error (or, for a
//! flip inside plain data bytes, possibly different values), never a panic,
//! a hang or a huge allocation; and the iterator stops after the error.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::*;
use spilljoin_spill::{
    read_spill_file, SpillCompression, SpillConfig, SpillError, SpillManager, SpillReadMode,
};

fn small_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn small_batch(rows: usize, seed: i64) -> RecordBatch {
    RecordBatch::try_new(
        small_schema(),
        vec![
            Arc::new(Int64Array::from_iter(
                (0..rows as i64).map(|i| (i % 7 != 3).then_some(i * seed)),
            )),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 5 != 1).then(|| format!("v{i}-{seed}"))),
            )),
        ],
    )
    .unwrap()
}

/// What reading a file produced.
#[derive(Debug)]
enum Outcome {
    /// All batches, and the end-of-stream marker.
    Complete(Vec<RecordBatch>),
    /// A typed error, at open or after some batches.
    Failed(SpillError),
}

/// Reads `path` to the end, checking that nothing follows an error.
fn read_outcome(path: &Path, schema: Option<SchemaRef>, mode: SpillReadMode) -> Outcome {
    let mut reader = match read_spill_file(path, schema, mode) {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e),
    };
    let mut batches = Vec::new();
    loop {
        match reader.next() {
            Some(Ok(b)) => {
                for c in b.columns() {
                    c.to_data()
                        .validate_full()
                        .expect("a batch that was returned is valid");
                }
                batches.push(b);
            }
            Some(Err(e)) => {
                assert!(reader.next().is_none(), "nothing after an error");
                assert!(reader.next().is_none());
                return Outcome::Failed(e);
            }
            None => {
                assert!(reader.next().is_none());
                return Outcome::Complete(batches);
            }
        }
    }
}

fn write_copy(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    // Unlink rather than truncate: ext4 flushes a file truncated to zero
    // and rewritten when it is closed (`auto_da_alloc`), which is slow.
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn is_corrupt_with_path(e: &SpillError, path: &Path) -> bool {
    matches!(e, SpillError::Corrupt { path: p, .. } if p == path)
}

fn spilled_bytes(compression: SpillCompression, batches: &[RecordBatch]) -> Vec<u8> {
    let m = manager(compression, SpillReadMode::Buffered);
    let file = spill(&m, batches[0].schema(), batches);
    std::fs::read(file.path()).unwrap()
}

#[test]
fn every_truncation_of_a_small_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let batches = [small_batch(10, 1), small_batch(0, 2), small_batch(25, 3)];
    for compression in COMPRESSIONS {
        let bytes = spilled_bytes(compression, &batches);
        for cut in 0..bytes.len() {
            let path = write_copy(dir.path(), "cut.arrows", &bytes[..cut]);
            for mode in READ_MODES {
                match read_outcome(&path, Some(small_schema()), mode) {
                    Outcome::Failed(e) => assert!(
                        is_corrupt_with_path(&e, &path),
                        "{compression}/{mode} cut {cut}: {e:?}"
                    ),
                    Outcome::Complete(b) => panic!(
                        "{compression}/{mode} cut {cut}/{}: read {} batches without error",
                        bytes.len(),
                        b.len()
                    ),
                }
            }
        }
        // And the uncut file is fine.
        let path = write_copy(dir.path(), "whole.arrows", &bytes);
        assert!(matches!(
            read_outcome(&path, None, SpillReadMode::Buffered),
            Outcome::Complete(b) if b == batches
        ));
    }
}

#[test]
fn truncations_of_an_all_types_file_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let batches = [all_types_batch(30, 1), all_types_batch(5, 2)];
    for compression in COMPRESSIONS {
        let bytes = spilled_bytes(compression, &batches);
        let step = (bytes.len() / 150).max(1);
        for cut in (0..bytes.len())
            .step_by(step)
            .chain(bytes.len() - 9..bytes.len())
        {
            let path = write_copy(dir.path(), "cut.arrows", &bytes[..cut]);
            for mode in READ_MODES {
                match read_outcome(&path, None, mode) {
                    Outcome::Failed(e) => {
                        assert!(is_corrupt_with_path(&e, &path), "cut {cut}: {e:?}")
                    }
                    Outcome::Complete(_) => panic!("{compression}/{mode} cut {cut} read fine"),
                }
            }
        }
    }
}

#[test]
fn the_batch_index_of_a_truncation_counts_the_good_batches() {
    let dir = tempfile::tempdir().unwrap();
    let batches = [small_batch(10, 1), small_batch(10, 2), small_batch(10, 3)];
    let bytes = spilled_bytes(SpillCompression::None, &batches);
    // Cutting off the end-of-stream marker loses no batch but is still an error.
    let path = write_copy(dir.path(), "no-eos.arrows", &bytes[..bytes.len() - 8]);
    for mode in READ_MODES {
        let mut reader = read_spill_file(&path, None, mode).unwrap();
        for want in &batches {
            assert_eq!(&reader.next().unwrap().unwrap(), want);
        }
        match reader.next() {
            Some(Err(SpillError::Corrupt {
                batch_index,
                source,
                ..
            })) => {
                assert_eq!(batch_index, 3);
                assert!(source.to_string().contains("end-of-stream"), "{source}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(reader.next().is_none());
    }
}

#[test]
fn trailing_bytes_after_the_end_marker_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = spilled_bytes(SpillCompression::None, &[small_batch(3, 1)]);
    bytes.extend_from_slice(&[0; 8]);
    let path = write_copy(dir.path(), "trailing.arrows", &bytes);
    for mode in READ_MODES {
        match read_outcome(&path, None, mode) {
            Outcome::Failed(e) => assert!(e.to_string().contains("after the end-of-stream")),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn bit_flips_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rng = &mut StdRng::seed_from_u64(0x5b111);
    let batches = [small_batch(12, 1), small_batch(30, 2)];
    for compression in COMPRESSIONS {
        let bytes = spilled_bytes(compression, &batches);
        let (mut errors, mut same, mut different) = (0, 0, 0);
        for pos in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[pos] ^= 1 << rng.random_range(0..8);
            let path = write_copy(dir.path(), "flip.arrows", &flipped);
            for mode in READ_MODES {
                match read_outcome(&path, None, mode) {
                    Outcome::Failed(e) => {
                        assert_eq!(e.path(), path);
                        errors += 1;
                    }
                    Outcome::Complete(b) if b == batches => same += 1,
                    Outcome::Complete(_) => different += 1,
                }
            }
        }
        // Flips in value bytes go unnoticed (the IPC stream format carries
        // no checksum); flips in framing and metadata are caught.
        println!("{compression}: {errors} errors, {same} unchanged, {different} changed values");
        assert!(errors > 0);
    }
}

#[test]
fn bit_flips_in_an_all_types_file_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rng = &mut StdRng::seed_from_u64(0xf11b);
    let batches = [all_types_batch(20, 4)];
    for compression in COMPRESSIONS {
        let bytes = spilled_bytes(compression, &batches);
        for _ in 0..300 {
            let mut flipped = bytes.clone();
            let pos = rng.random_range(0..bytes.len());
            flipped[pos] ^= 1 << rng.random_range(0..8);
            let path = write_copy(dir.path(), "flip.arrows", &flipped);
            for mode in READ_MODES {
                if let Outcome::Failed(e) = read_outcome(&path, None, mode) {
                    assert_eq!(e.path(), path);
                }
            }
        }
    }
}

#[test]
fn garbage_and_degenerate_files_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let rng = &mut StdRng::seed_from_u64(42);
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("eos only".into(), vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
        ("legacy eos only".into(), vec![0, 0, 0, 0]),
        ("continuation only".into(), vec![0xff; 4]),
        (
            "huge metadata length".into(),
            vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        ),
        (
            "negative metadata length".into(),
            vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0x80],
        ),
        (
            "short metadata".into(),
            vec![0xff, 0xff, 0xff, 0xff, 16, 0, 0, 0, 1, 2, 3],
        ),
    ];
    for i in 0..200 {
        let len: usize = rng.random_range(0..600);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if i % 2 == 0 && len >= 8 {
            bytes[..4].copy_from_slice(&[0xff; 4]);
            let meta = rng.random_range(0..len as i32);
            bytes[4..8].copy_from_slice(&meta.to_le_bytes());
        }
        cases.push((format!("random {i}"), bytes));
    }
    for (name, bytes) in cases {
        let path = write_copy(dir.path(), "garbage.arrows", &bytes);
        for mode in READ_MODES {
            match read_outcome(&path, None, mode) {
                Outcome::Failed(e) => {
                    assert!(is_corrupt_with_path(&e, &path), "{name}: {e:?}")
                }
                Outcome::Complete(b) => panic!("{name}: read {} batches", b.len()),
            }
        }
    }
}

/// Offsets of the messages of an uncompressed or compressed stream:
/// `(metadata_start, metadata_len, body_start, body_len)`.
fn messages(bytes: &[u8]) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        assert_eq!(bytes[pos..pos + 4], [0xff; 4]);
        let len = i32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        if len == 0 {
            return out;
        }
        let meta = pos + 8;
        let message = arrow_ipc::root_as_message(&bytes[meta..meta + len]).unwrap();
        let body_len = message.bodyLength() as usize;
        out.push((meta, len, meta + len, body_len));
        pos = meta + len + body_len;
    }
}

#[test]
fn a_decompression_bomb_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    for compression in [SpillCompression::Lz4, SpillCompression::Zstd] {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            // Values past 32 bits, so that they are written 8 bytes wide.
            vec![Arc::new(Int64Array::from_iter_values(
                (0..1000).map(|i| i64::MAX - i),
            ))],
        )
        .unwrap();
        let mut bytes = spilled_bytes(compression, &[batch]);
        let (_, _, body, _) = messages(&bytes)[1];
        // The values buffer is the second buffer; the validity buffer is
        // empty, so the values start the body with their 8-byte length prefix.
        let declared = i64::from_le_bytes(bytes[body..body + 8].try_into().unwrap());
        assert_eq!(declared, 8000);
        bytes[body..body + 8].copy_from_slice(&(1i64 << 45).to_le_bytes());
        let path = write_copy(dir.path(), "bomb.arrows", &bytes);
        for mode in READ_MODES {
            match read_outcome(&path, None, mode) {
                Outcome::Failed(SpillError::Corrupt {
                    batch_index: 0,
                    source,
                    ..
                }) => {
                    assert!(
                        source.to_string().contains("decompressed bytes"),
                        "{source}"
                    )
                }
                other => panic!("{compression}/{mode}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_buffer_outside_its_body_is_corrupt_not_a_panic() {
    // Grow the body length of the first batch message so framing passes,
    // then point nowhere: achieved by shrinking the recorded body instead.
    let dir = tempfile::tempdir().unwrap();
    let bytes = spilled_bytes(SpillCompression::None, &[small_batch(50, 1)]);
    let (meta, len, _body, body_len) = messages(&bytes)[1];
    // Find the bodyLength field (i64 LE) inside the metadata flatbuffer and
    // halve it, keeping the file otherwise identical.
    let needle = (body_len as i64).to_le_bytes();
    let at = bytes[meta..meta + len]
        .windows(8)
        .position(|w| w == needle)
        .expect("bodyLength is stored in the metadata")
        + meta;
    let mut patched = bytes.clone();
    patched[at..at + 8].copy_from_slice(&((body_len / 2) as i64).to_le_bytes());
    let path = write_copy(dir.path(), "short-body.arrows", &patched);
    for mode in READ_MODES {
        match read_outcome(&path, None, mode) {
            Outcome::Failed(e) => assert!(is_corrupt_with_path(&e, &path), "{e:?}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn our_own_files_are_checked_for_truncation_too() {
    // Something outside truncates a finished spill file: the join gets an
    // error, not fewer rows.
    for mode in READ_MODES {
        let m = SpillManager::new(SpillConfig::default().with_read_mode(mode)).unwrap();
        let file = spill(
            &m,
            small_schema(),
            &[small_batch(10, 1), small_batch(10, 2)],
        );
        let len = std::fs::metadata(file.path()).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap();
        f.set_len(len - 8).unwrap();
        drop(f);
        let result: Result<Vec<_>, _> = file.reader().unwrap().collect();
        assert!(matches!(
            result,
            Err(SpillError::Corrupt { batch_index: 2, .. })
        ));
    }
}

/// Inputs from the fuzzer's corpus (`fuzz/fuzz_targets/spill_reader.rs`) on
/// which arrow-ipc 59 panics inside its decoder, one per panic site, named
/// after it (`panic-<crate>-<file>-line<N>.arrows`). The reader catches those
/// panics (see `without_panics` in `src/reader.rs`); each must come out as
/// `Corrupt`, in both modes, with nothing after it.
#[test]
fn inputs_that_make_arrow_panic_are_corrupt() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        files += 1;
        for mode in READ_MODES {
            match read_outcome(&path, None, mode) {
                Outcome::Failed(e) => assert!(is_corrupt_with_path(&e, &path), "{e:?}"),
                Outcome::Complete(b) => panic!("{}: read {} batches", path.display(), b.len()),
            }
        }
    }
    assert!(
        files >= 20,
        "only {files} regression inputs in {}",
        dir.display()
    );
}
