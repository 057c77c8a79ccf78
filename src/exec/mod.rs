//! Executing a join: one *level* of the hybrid hash join, and what happens to the
//! partitions it spilled.
//!
//! ```text
//!  run_level(level 0: user inputs)
//!    build ─► BuiltSide: in-memory partitions + spilled partitions (files, blooms)
//!    probe ─► in-memory partitions: output now
//!             spilled partitions: rows that may match ─► probe spill file
//!                                 rows that cannot (bloom) ─► unmatched now
//!    emit unmatched/semi/anti/mark build rows of in-memory partitions
//!    for each spilled (build file, probe file) pair — side by side, one per thread,
//!    each in its own share of the free memory, when they fit one; else one at a
//!    time on all threads:
//!       split it? ─► run_level(level + 1: the two files, next hash bits)
//!       one key dominates (no split) or no hash bits left ─► fallback:
//!          probe file large? ─► split the dominant key off: its pair ─► chunked,
//!                                                         the rest ─► as any pair
//!          otherwise ─► chunked
//! ```
//!
//! Recursion writes each spilled byte once per level. Its depth is bounded by the
//! plan's (`with_max_depth`, at most [`MAX_DEPTH`](crate::MAX_DEPTH)) and by the hash
//! bits ([`crate::partition::MAX_TOTAL_PARTITION_BITS`]); a partition that does not
//! split (one key holds most of its rows) goes to the fallback. Chunked, the build
//! file is read in chunks that fit, each chunk is joined with the whole probe file,
//! and per-probe-row match bits carry outer, anti, semi and mark semantics across
//! chunks: a block nested loop with a hash table per block. When the probe file is
//! large, the dominant key is split off first, so that only its own probe rows are
//! read once per chunk — what a sort-merge join's grouping of equal keys would buy,
//! for one rewrite of each file instead of an external sort of both.
//!
//! The files, in the order of the diagram:
//!
//! - `level`: a level from its inputs to the files it spilled — [`run`] (level 0
//!   over the user's inputs), `run_level`, [`probe_level`] (the probe phase and the
//!   build rows output after it), releasing a level's tables; and a spill file read
//!   back as the input of the level below (`file_input`, `level_split`,
//!   `attach_back`).
//! - `pairs`: the spilled (build file, probe file) pairs of a level —
//!   [`join_spilled_pairs`] joins them side by side in shares of the memory or one
//!   at a time, either way round (the smaller side builds), each at the next level
//!   with its radix bits (`sub_level_bits`, `pair_bytes`), or in the fallback when it
//!   cannot split ([`LevelRows`]).
//! - `fallback`: a pair that its hash bits cannot split — whether splitting its
//!   dominant key off pays (`split_pays`), finding that key (`hot_hash`), and
//!   rewriting both files into the key's pair and the rest (`split_hot_key`).
//! - `chunked`: the fallback's join itself, the build file in chunks that fit, each
//!   joined with the whole probe file, with per-probe-row match bits across chunks.

mod chunked;
mod fallback;
mod level;
mod pairs;

pub(crate) use level::{probe_level, run};
pub(crate) use pairs::{join_spilled_pairs, LevelRows};
