//! Spill files written as segments of shared files ([`SpillGroup`]): they read
//! back like files of their own, whatever was written between their messages,
//! and the shared files go when the last of their spill files does.

mod common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;

use common::*;
use spilljoin_spill::{
    SpillCompression, SpillConfig, SpillError, SpillFile, SpillManager, SpillReadMode, SpillWriter,
};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]))
}

/// `rows` rows whose keys start at `start`: keys past 32 bits make the writer open
/// a new, wide segment of the stream (`narrow`).
fn batch(start: i64, rows: usize) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(start..start + rows as i64)),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then(|| format!("v{start}-{i}"))),
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

/// Writes `per_stream[s]` into writer `s`, one batch of each stream in turn, so
/// that the messages of streams sharing a file interleave.
fn write_interleaved(
    writers: &mut [SpillWriter],
    per_stream: &[Vec<RecordBatch>],
) -> Result<(), SpillError> {
    let most = per_stream.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..most {
        for (w, batches) in writers.iter_mut().zip(per_stream) {
            if let Some(b) = batches.get(i) {
                w.write(b)?;
            }
        }
    }
    Ok(())
}

#[test]
fn interleaved_streams_read_back_in_every_compression_and_read_mode() {
    let all = all_types_batch(200, 3);
    for compression in COMPRESSIONS {
        for mode in READ_MODES {
            let m = manager(compression, mode);
            let group = m.create_group("test", 2);
            let per_stream = vec![
                vec![batch(0, 10), batch(1 << 40, 5), batch(7, 0), batch(3, 100)],
                vec![all.slice(0, 50), all.slice(50, 1), all.slice(120, 80)],
                vec![],
                vec![batch(-5, 3)],
                vec![all.slice(10, 0), all.slice(0, 200)],
            ];
            let mut writers: Vec<SpillWriter> = per_stream
                .iter()
                .enumerate()
                .map(|(s, batches)| {
                    let schema = batches.first().map_or_else(schema, RecordBatch::schema);
                    group.create_writer(schema, s).unwrap()
                })
                .collect();
            write_interleaved(&mut writers, &per_stream).unwrap();
            let files: Vec<SpillFile> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
            assert_eq!(group.files_created(), 2, "{compression}/{mode}");
            assert_eq!(m.metrics().files_created, 2);
            assert_eq!(dir_entries(&m), 2);
            let total: u64 = files.iter().map(SpillFile::bytes).sum();
            assert_eq!(m.disk_used_bytes(), total, "{compression}/{mode}");
            let on_disk: u64 = group
                .paths()
                .iter()
                .map(|p| std::fs::metadata(p).unwrap().len())
                .sum();
            assert_eq!(on_disk, total);
            for (s, (file, want)) in files.iter().zip(&per_stream).enumerate() {
                let rows: usize = want.iter().map(RecordBatch::num_rows).sum();
                assert_eq!(file.rows(), rows as u64);
                assert_eq!(file.batches(), want.len() as u64);
                let got = read_all(file).unwrap();
                assert_eq!(&got, want, "{compression}/{mode} stream {s}");
                for b in &got {
                    b.columns()
                        .iter()
                        .for_each(|a| a.to_data().validate_full().unwrap());
                }
                // Read again, while another stream of the same file is being read.
                let mut a = file.reader().unwrap();
                let mut b = files[(s + 2) % files.len()].reader().unwrap();
                assert_eq!(a.by_ref().count(), want.len());
                assert_eq!(b.by_ref().count(), per_stream[(s + 2) % files.len()].len());
            }
        }
    }
}

#[test]
fn a_shared_file_goes_with_the_last_of_its_spill_files() {
    let m = manager(SpillCompression::None, SpillReadMode::Buffered);
    let group = m.create_group("life", 1);
    assert_eq!(
        (group.files_created(), dir_entries(&m)),
        (0, 0),
        "nothing is created before a writer"
    );
    let mut a = group.create_writer(schema(), 0).unwrap();
    let mut b = group.create_writer(schema(), 7).unwrap();
    let mut unfinished = group.create_writer(schema(), 3).unwrap();
    a.write(&batch(0, 10)).unwrap();
    unfinished.write(&batch(100, 10)).unwrap();
    b.write(&batch(50, 20)).unwrap();
    let path = a.path().to_owned();
    assert_eq!((b.path(), unfinished.path()), (&*path, &*path));
    let (a, b) = (a.finish().unwrap(), b.finish().unwrap());
    drop(unfinished);
    assert_eq!(m.live_files(), 1);
    assert!(path.exists());
    let held = m.disk_used_bytes();
    assert!(
        held > a.bytes() + b.bytes(),
        "the dropped writer's bytes stay"
    );
    assert_eq!(read_all(&a).unwrap(), vec![batch(0, 10)]);

    drop(group);
    drop(a);
    assert!(path.exists(), "b is still in it");
    assert_eq!(m.disk_used_bytes(), held, "space comes back all at once");
    let reader = b.reader().unwrap();
    drop(b);
    assert!(path.exists(), "the reader holds it");
    assert_eq!(
        reader.collect::<Result<Vec<_>, _>>().unwrap(),
        vec![batch(50, 20)]
    );
    assert!(!path.exists());
    assert_eq!(
        (m.live_files(), m.disk_used_bytes(), dir_entries(&m)),
        (0, 0, 0)
    );
}

#[test]
fn threads_writing_to_one_shared_file_keep_their_streams_apart() {
    for mode in READ_MODES {
        let m = manager(SpillCompression::Lz4, mode);
        let group = m.create_group("threads", 1);
        let files: Vec<(i64, SpillFile)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4i64)
                .map(|t| {
                    let group = group.clone();
                    scope.spawn(move || {
                        let mut w = group.create_writer(schema(), t as usize).unwrap();
                        for i in 0..50 {
                            w.write(&batch(t * 1_000_000 + i * 10, 10)).unwrap();
                        }
                        (t, w.finish().unwrap())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(group.files_created(), 1);
        for (t, file) in &files {
            let want: Vec<RecordBatch> =
                (0..50).map(|i| batch(t * 1_000_000 + i * 10, 10)).collect();
            assert_eq!(read_all(file).unwrap(), want, "{mode} thread {t}");
        }
    }
}

#[test]
fn a_refused_message_writes_nothing_and_the_others_go_on() {
    let quota = 32 * 1024;
    let m = SpillManager::new(SpillConfig::default().with_disk_quota_bytes(quota)).unwrap();
    let group = m.create_group("quota", 1);
    let mut small = group.create_writer(schema(), 0).unwrap();
    small.write(&batch(0, 10)).unwrap();
    let mut big = group.create_writer(schema(), 0).unwrap();
    let err = loop {
        match big.write(&batch(0, 400)) {
            Ok(()) => assert!(m.disk_used_bytes() <= quota),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SpillError::QuotaExceeded { .. }), "{err}");
    assert!(m.disk_used_bytes() <= quota);
    drop(big);
    small.write(&batch(10, 10)).unwrap();
    let small = small.finish().unwrap();
    assert_eq!(read_all(&small).unwrap(), vec![batch(0, 10), batch(10, 10)]);
}

#[test]
fn a_truncated_shared_file_is_corrupt_not_a_panic() {
    for mode in READ_MODES {
        let m = manager(SpillCompression::None, mode);
        let group = m.create_group("cut", 1);
        let mut writers = vec![
            group.create_writer(schema(), 0).unwrap(),
            group.create_writer(schema(), 0).unwrap(),
        ];
        let per_stream = vec![
            vec![batch(0, 30), batch(30, 30)],
            vec![batch(1, 30), batch(31, 30)],
        ];
        write_interleaved(&mut writers, &per_stream).unwrap();
        let files: Vec<SpillFile> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
        let len = std::fs::metadata(files[0].path()).unwrap().len();
        for cut in [len - 1, len / 2, 9, 0] {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(files[0].path())
                .unwrap();
            f.set_len(cut).unwrap();
            drop(f);
            // The stream that ends last loses its end marker; one that ends before
            // the cut still reads whole.
            let mut corrupt = 0;
            for (file, want) in files.iter().zip(&per_stream) {
                match file.reader().and_then(|r| r.collect::<Result<Vec<_>, _>>()) {
                    Ok(got) => assert_eq!(&got, want, "{mode}, cut at {cut} of {len}"),
                    Err(SpillError::Corrupt { .. }) => corrupt += 1,
                    Err(e) => panic!("{mode}, cut at {cut} of {len}: {e}"),
                }
            }
            assert!(corrupt >= 1, "{mode}, cut at {cut} of {len}");
            if cut < len / 2 {
                assert_eq!(corrupt, 2, "{mode}, cut at {cut} of {len}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random streams, random slots, random order of writes: each reads back as
    /// written.
    #[test]
    fn random_interleavings_round_trip(
        streams in prop::collection::vec(
            (0usize..3, prop::collection::vec((any::<i32>(), 0usize..40), 0..6)),
            1..6,
        ),
        slots in 1usize..4,
        order_seed in any::<u64>(),
        compression in prop::sample::select(COMPRESSIONS.to_vec()),
        mode in prop::sample::select(READ_MODES.to_vec()),
    ) {
        let m = manager(compression, mode);
        let group = m.create_group("prop", slots);
        let per_stream: Vec<Vec<RecordBatch>> = streams
            .iter()
            .map(|(_, batches)| {
                batches.iter().map(|&(start, rows)| batch(i64::from(start), rows)).collect()
            })
            .collect();
        let mut writers: Vec<SpillWriter> = streams
            .iter()
            .map(|(slot, _)| group.create_writer(schema(), *slot).unwrap())
            .collect();
        // A deterministic shuffle of which stream writes next.
        let mut next = vec![0usize; writers.len()];
        let mut state = order_seed | 1;
        loop {
            let open: Vec<usize> =
                (0..writers.len()).filter(|&s| next[s] < per_stream[s].len()).collect();
            if open.is_empty() {
                break;
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let s = open[(state % open.len() as u64) as usize];
            writers[s].write(&per_stream[s][next[s]]).unwrap();
            next[s] += 1;
        }
        let files: Vec<SpillFile> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
        prop_assert!(group.files_created() <= slots);
        for (file, want) in files.iter().zip(&per_stream) {
            prop_assert_eq!(&read_all(file).unwrap(), want);
        }
        drop(files);
        drop(group);
        prop_assert_eq!((m.live_files(), m.disk_used_bytes()), (0, 0));
    }
}
