//! Joins that spill: sides of thousands to hundreds of thousands of rows, generated
//! from a seed and shape parameters in the fuzzer's bytes, under memory limits from
//! unlimited through the floor down to a few KiB, for every join type, checked against
//! the reference join. The case, its decoding and its check are shared with the main
//! workspace's tests (`tests/common/spill_case.rs`, whose docs list what each byte
//! chooses), so `tests/fuzz_replay.rs` replays an input exactly as it ran here.
//!
//! A wrong answer, an error other than `ResourcesExhausted` below the case's floor
//! (4 MiB, or twice its largest batch), an oversized batch, a reservation or a spill
//! file left behind panics, and libFuzzer records the input.
//!
//! Without AddressSanitizer and comparison tracing it runs about 8 times faster (most
//! of an execution is the reference's string work); run the corpus under the sanitizer
//! afterwards (`fuzz/README.md`):
//!
//! ```text
//! cd fuzz
//! cargo +nightly fuzz run -s none --no-trace-compares join_spill corpus/join_spill \
//!     seeds/join_spill -- -max_total_time=600 -timeout=60 -rss_limit_mb=4096
//! ```

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;

fuzz_target!(|data: &[u8]| {
    common::spill_case::SpillCase::decode(data).check();
});
