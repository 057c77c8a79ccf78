//! Any bytes, read as a spill file in both read modes: the reader must return
//! batches or a typed error, never crash, hang or allocate without bound.
//!
//! Run (stable toolchain):
//!
//! ```text
//! cd fuzz
//! RUSTC_BOOTSTRAP=1 cargo fuzz run spill_reader corpus/spill_reader seeds/spill_reader \
//!     -- -max_total_time=300 -timeout=10 -rss_limit_mb=2048
//! ```

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spilljoin_spill::{read_spill_file, SpillReadMode};

/// One scratch file per process, rewritten for every input.
fn scratch() -> &'static PathBuf {
    static SCRATCH: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &SCRATCH
        .get_or_init(|| {
            quiet_caught_arrow_panics();
            let dir = tempfile::tempdir().expect("temp dir for the fuzz input");
            let path = dir.path().join("input.arrows");
            (dir, path)
        })
        .1
}

/// libfuzzer-sys installs a panic hook that aborts on *every* panic, also
/// on the ones the reader deliberately catches inside arrow's IPC decoder
/// (see `spill/src/reader.rs`, `without_panics`). Replace it by a hook that
/// stays silent for panics raised inside arrow crates and prints all others.
/// A panic that escapes `read_spill_file` or the iterator still reaches
/// libfuzzer-sys's `catch_unwind` around this target, which aborts: a crash.
fn quiet_caught_arrow_panics() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_arrow = info
            .location()
            .is_some_and(|l| l.file().contains("/arrow-"));
        if !in_arrow {
            default_hook(info);
        }
    }));
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    // Unlink rather than truncate: ext4 flushes a file truncated to zero and
    // rewritten when it is closed (`auto_da_alloc`), which is slow.
    let _ = std::fs::remove_file(path);
    std::fs::write(path, data).expect("write the fuzz input");
    for mode in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
        let Ok(reader) = read_spill_file(path, None, mode) else {
            continue;
        };
        let mut errors = 0;
        for batch in reader {
            match batch {
                Ok(batch) => {
                    // A foreign file's batches are fully validated on the
                    // way in: anything returned must be valid Arrow data.
                    for c in batch.columns() {
                        assert_eq!(c.len(), batch.num_rows());
                        if let Err(e) = c.to_data().validate_full() {
                            panic!("the reader returned an invalid array: {e}");
                        }
                    }
                }
                Err(e) => {
                    errors += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
        }
        // The iterator ends right after the first error.
        assert!(errors <= 1);
    }
});
