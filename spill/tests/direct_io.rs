//! Direct I/O (`SpillConfig::direct_io`): files written past the page cache read
//! back identical, in files of their own and in shared files, whatever the sizes
//! of the messages against the blocks and the writer's 1 MiB scratch; and a file
//! of its own ends at its last message, not at the padded block. Writes of many
//! MiB go behind the writer (`DIRECT_WRITES_BEHIND`): a spill file reads back
//! whole as soon as it is finished, also while other writers go on appending to
//! its shared file, and a writer dropped with writes in flight leaves nothing.

mod common;

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;

use common::*;
use spilljoin_spill::{
    read_spill_file, SpillCompression, SpillConfig, SpillFile, SpillManager, SpillReadMode,
};

fn direct_manager(compression: SpillCompression, mode: SpillReadMode) -> SpillManager {
    let defaults = SpillConfig::default();
    let depth = (defaults.direct_read_ahead, defaults.direct_writes_behind);
    direct_manager_at_depth(compression, mode, depth)
}

/// A direct manager whose readers read `read_ahead` runs ahead and whose threads
/// keep `writes_behind` writes in flight.
fn direct_manager_at_depth(
    compression: SpillCompression,
    mode: SpillReadMode,
    (read_ahead, writes_behind): (usize, usize),
) -> SpillManager {
    SpillManager::new(
        SpillConfig::default()
            .with_compression(compression)
            .with_read_mode(mode)
            .with_direct_io(true)
            .with_direct_read_ahead(read_ahead)
            .with_direct_writes_behind(writes_behind),
    )
    .unwrap()
}

/// Whether the file system of `dir` opens files with `O_DIRECT`: what a direct
/// manager's files there must then be.
fn takes_direct_io(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("probe-direct");
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let _ = std::fs::remove_file(&path);
        opened.is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// `rows` rows whose strings are `width` bytes: messages of any size, from a few
/// hundred bytes to past the writer's 1 MiB scratch.
fn batch(start: i64, rows: usize, width: usize) -> RecordBatch {
    let k: Int64Array = (start..start + rows as i64).collect();
    let s: StringArray = (0..rows)
        .map(|i| (i % 7 != 0).then(|| format!("{i:0width$}")))
        .collect();
    let columns: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(s)];
    RecordBatch::try_new(schema(), columns).unwrap()
}

#[test]
fn files_of_their_own_read_back_and_end_at_their_last_message() {
    let batches = vec![
        batch(0, 3, 1),
        batch(10, 4_000, 300), // 1.2 MB: more than one scratch
        batch(-5, 1, 4_000),
        batch(7, 0, 1),
        batch(99, 1_000, 5),
    ];
    let full = all_types_batch(300, 7);
    for compression in COMPRESSIONS {
        for mode in READ_MODES {
            let m = direct_manager(compression, mode);
            let file = spill(&m, schema(), &batches);
            let typed = spill(&m, full.schema(), &[full.slice(3, 200), full.clone()]);
            let direct = if takes_direct_io(m.dir()) { 2 } else { 0 };
            assert_eq!(m.metrics().direct_files_created, direct);
            for (file, want) in [
                (&file, batches.clone()),
                (&typed, vec![full.slice(3, 200), full.clone()]),
            ] {
                let on_disk = std::fs::metadata(file.path()).unwrap().len();
                assert_eq!(on_disk, file.bytes(), "{compression}/{mode}");
                assert_eq!(read_all(file).unwrap(), want, "{compression}/{mode}");
                // Read through the page cache, as another process would.
                let foreign: Vec<_> = read_spill_file(file.path(), Some(want[0].schema()), mode)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert_eq!(foreign, want, "{compression}/{mode} via read_spill_file");
            }
        }
    }
}

#[test]
fn streams_sharing_a_file_read_back_apart() {
    for mode in READ_MODES {
        let m = direct_manager(SpillCompression::None, mode);
        let group = m.create_group("direct", 2);
        let per_stream: Vec<Vec<RecordBatch>> = vec![
            vec![batch(0, 10, 3), batch(1 << 40, 5, 2_000), batch(3, 100, 9)],
            vec![batch(5, 5_000, 250), batch(6, 1, 1)],
            vec![batch(8, 2, 4_093), batch(9, 3, 4_096), batch(10, 17, 5)],
        ];
        let mut writers: Vec<_> = (0..per_stream.len())
            .map(|s| group.create_writer(schema(), s).unwrap())
            .collect();
        for i in 0..3 {
            for (w, batches) in writers.iter_mut().zip(&per_stream) {
                if let Some(b) = batches.get(i) {
                    w.write(b).unwrap();
                }
            }
        }
        let files: Vec<SpillFile> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
        for (s, (file, want)) in files.iter().zip(&per_stream).enumerate() {
            assert_eq!(&read_all(file).unwrap(), want, "{mode} stream {s}");
        }
        let expected = if takes_direct_io(m.dir()) { 2 } else { 0 };
        assert_eq!(m.metrics().direct_files_created, expected);
    }
}

/// Messages of several MiB, so that most of their blocks are written behind.
fn large(start: i64) -> RecordBatch {
    batch(start, 12_000, 400)
}

#[test]
fn a_finished_file_reads_back_while_its_shared_file_grows() {
    for mode in READ_MODES {
        let m = direct_manager(SpillCompression::None, mode);
        let group = m.create_group("behind", 1);
        let mut first = group.create_writer(schema(), 0).unwrap();
        let mut second = group.create_writer(schema(), 0).unwrap();
        let (a, b) = (vec![large(0), batch(1, 3, 7)], vec![large(2), large(3)]);
        first.write(&a[0]).unwrap();
        second.write(&b[0]).unwrap();
        first.write(&a[1]).unwrap();
        // The first's last message ends in a partial block still held by the file.
        let first = first.finish().unwrap();
        assert_eq!(read_all(&first).unwrap(), a, "{mode}");
        // The second's writes rewrite that block and go on past it.
        second.write(&b[1]).unwrap();
        assert_eq!(read_all(&first).unwrap(), a, "{mode}, after more writes");
        let second = second.finish().unwrap();
        assert_eq!(read_all(&second).unwrap(), b, "{mode}");
        assert_eq!(read_all(&first).unwrap(), a, "{mode}, at the end");
    }
}

#[test]
fn writers_dropped_with_writes_in_flight_leave_nothing() {
    let m = direct_manager(SpillCompression::None, SpillReadMode::Buffered);
    let group = m.create_group("dropped", 1);
    let mut own = m.create_writer(schema(), "own").unwrap();
    let mut shared = group.create_writer(schema(), 0).unwrap();
    for i in 0..3 {
        own.write(&large(i)).unwrap();
        shared.write(&large(i)).unwrap();
    }
    drop((own, shared, group));
    assert_eq!(m.live_files(), 0);
    assert_eq!(m.disk_used_bytes(), 0);
    let left: Vec<_> = std::fs::read_dir(m.dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != spilljoin_spill::OWNER_FILE_NAME)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random message sizes in random files, read with any read ahead (0 and past
    /// the most are taken as 1 and the most) and written with any number of writes
    /// behind: each stream reads back as written.
    #[test]
    fn random_streams_round_trip(
        sizes in prop::collection::vec((0usize..3, 0usize..3_000, 0usize..600), 1..16),
        compression in prop::sample::select(COMPRESSIONS.to_vec()),
        read_ahead in 0usize..=spilljoin_spill::MAX_DIRECT_READ_AHEAD + 1,
        writes_behind in 0usize..=spilljoin_spill::MAX_DIRECT_WRITES_BEHIND + 1,
    ) {
        let depth = (read_ahead, writes_behind);
        let m = direct_manager_at_depth(compression, SpillReadMode::Buffered, depth);
        let group = m.create_group("random", 2);
        let mut writers: Vec<_> = (0..3)
            .map(|s| group.create_writer(schema(), s).unwrap())
            .collect();
        let mut own = m.create_writer(schema(), "own").unwrap();
        let mut want = vec![Vec::new(); 3];
        for (i, &(stream, rows, width)) in sizes.iter().enumerate() {
            let b = batch(i as i64, rows, width);
            writers[stream].write(&b).unwrap();
            own.write(&b).unwrap();
            want[stream].push(b);
        }
        let own = own.finish().unwrap();
        let every: Vec<RecordBatch> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(_, rows, width))| batch(i as i64, rows, width))
            .collect();
        prop_assert_eq!(read_all(&own).unwrap(), every);
        for (w, want) in writers.into_iter().zip(&want) {
            let file = w.finish().unwrap();
            prop_assert_eq!(&read_all(&file).unwrap(), want);
        }
    }
}
