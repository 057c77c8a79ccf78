//! A join that spills, described by twenty bytes: the case of the `join_spill` fuzz
//! target (`fuzz/fuzz_targets/join_spill.rs`), replayed from its seeds and crash
//! inputs by `tests/fuzz_replay.rs`.
//!
//! The bytes hold no rows. They hold a seed and the shape of the case, and the rows
//! come from the seed (a seeded `StdRng`), so twenty bytes describe sides of up to a
//! few hundred thousand rows, and a mutation changes the shape rather than a row.
//! Byte by byte (bytes past the end read as 0):
//!
//! | byte | chooses |
//! |------|---------|
//! | 0–7  | the seed (little-endian) |
//! | 8, 9 | left and right rows: 0, 1, 10, 100 or 500 below 8, else 1,000 to 300,000 on a log scale |
//! | 10   | the key: `Int64`, `Int32`, `Utf8`, `Utf8View`, `Float64`, `Decimal128`, a dictionary, `Date32`, or two or three columns |
//! | 11   | the keys' shape: unique, duplicates (×2 to ×100), a hot key (10–100% of a side's rows, on the left, the right or both), zipf |
//! | 12   | the share of null keys (0 to 100%) |
//! | 13   | the payload: narrow, strings, nullable columns, wide strings |
//! | 14   | the join type (every [`JoinType`]) |
//! | 15   | bit 0 filter, 1 nulls equal nulls, 2 two threads, 3–4 statistics, 5 no swapping of spilled pairs |
//! | 16   | output and input batch rows |
//! | 17   | the memory limit (see [`limit_bytes`]) |
//! | 18   | partition bits (0–8 or the planner's), the hot key split |
//! | 19   | forced spilling: the fraction and the depth |
//!
//! Inputs are cut so that a case stays well under a second: a side holds at most
//! [`MAX_SIDE_BYTES`], the join at most [`MAX_PAIRS`] key matches, and batches are
//! not so small that they number more than a few thousand.
//!
//! [`SpillCase::check`] runs the join and panics (so that libFuzzer records the
//! input) on a wrong answer, an error other than `ResourcesExhausted` below the
//! case's floor ([`floor_bytes`]), an output batch over the batch size, or a
//! reservation, spill file or directory left after the join. The answer is compared,
//! as a multiset, with the nested-loop reference join ([`reference_join`]) when the
//! sides are small enough and with [`hash_reference_join`] when they are not.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch};
use arrow_array::{StringArray, StringViewArray};
use arrow_schema::{ArrowError, DataType, Field, Schema};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use spilljoin::memory::{GreedyMemoryPool, MemoryPool, TrackConsumersPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoin, HashJoinBuilder, HotKeySplit, InputStatistics, JoinError};
use spilljoin::{JoinMetrics, JoinType, NullEquality};

use super::rendered_rows;
use super::{hash_reference_join, key_column_of, less_than_filter, reference_join};

/// The floor the join documents for batches of up to 8192 rows and up to 4 threads
/// (README, "The floor"); a case's floor is this or twice its largest input batch
/// ([`floor_bytes`]).
pub const FLOOR_BYTES: usize = 4 << 20;

/// The most bytes of rows a side holds (it decides the rows of wide payloads).
pub const MAX_SIDE_BYTES: usize = 24 << 20;

/// The most pairs of rows with equal keys a case joins: sides are cut until their
/// keys match fewer times (a hot key on both sides would otherwise make billions).
pub const MAX_PAIRS: u64 = 300_000;

/// Up to this many (left rows × right rows), the answer is checked against the
/// nested-loop reference, the ground truth; above, against the hash reference.
pub const NESTED_LOOP_MAX_PAIRS: usize = 2_000_000;

/// The most batches of a side or of the output a case makes: smaller batches are
/// raised to this share of the rows.
const MAX_BATCHES: usize = 2000;

/// What the key columns are.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyType {
    /// One column of this type.
    Single(DataType),
    /// `Int32` and `Utf8`.
    Two,
    /// `Int64`, `Utf8View` and `Date32`.
    Three,
}

impl KeyType {
    fn decode(b: u8) -> Self {
        let single = [
            DataType::Int64,
            DataType::Int32,
            DataType::Utf8,
            DataType::Utf8View,
            DataType::Float64,
            DataType::Decimal128(15, 2),
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            DataType::Date32,
        ];
        match b % 10 {
            8 => KeyType::Two,
            9 => KeyType::Three,
            i => KeyType::Single(single[i as usize].clone()),
        }
    }

    fn data_types(&self) -> Vec<DataType> {
        match self {
            KeyType::Single(data_type) => vec![data_type.clone()],
            KeyType::Two => vec![DataType::Int32, DataType::Utf8],
            KeyType::Three => vec![DataType::Int64, DataType::Utf8View, DataType::Date32],
        }
    }

    /// The number of column `c` for key number `id`: distinct ids, distinct tuples.
    fn part(&self, id: u64, c: usize) -> u64 {
        match (self, c) {
            (KeyType::Single(_), _) => id,
            (KeyType::Two, 0) => id % 1024,
            (KeyType::Two, _) => id / 1024,
            (KeyType::Three, c) => (id >> (6 * c)) & if c < 2 { 63 } else { u64::MAX },
        }
    }
}

/// Which side a hot key is hot on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HotSides {
    /// The left side only (the right has it as often as any key).
    Left,
    /// The right side only.
    Right,
    /// Both.
    Both,
}

/// How key numbers are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyShape {
    /// Each key at most once a side; about half the keys of the smaller side on both.
    Unique,
    /// Keys drawn uniformly from (larger side's rows / this factor) values.
    Duplicates(u64),
    /// This share of the hot side's rows has key 0; the rest are about unique.
    Hot(f64, HotSides),
    /// `domain^u` for a uniform `u`: few keys hold most rows.
    Zipf(u64),
}

impl KeyShape {
    fn decode(b: u8) -> Self {
        let (low, mid) = ((b & 3), (b >> 2 & 3) as usize);
        match low {
            0 => KeyShape::Unique,
            1 => KeyShape::Duplicates([2, 4, 16, 100][mid]),
            2 => {
                let sides =
                    [HotSides::Left, HotSides::Right, HotSides::Both][(b >> 4) as usize % 3];
                KeyShape::Hot([0.1, 0.5, 0.9, 1.0][mid], sides)
            }
            _ => KeyShape::Zipf([1, 10, 100, 1][mid]),
        }
    }
}

/// What the non-key columns are. Every side has the filter's `v` (nullable `Int64`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Payload {
    /// `v` only.
    Narrow,
    /// `v` and a string of up to 40 bytes.
    Strings,
    /// `v`, a nullable string, a nullable `Float64` and a nullable `Boolean`.
    Nullable,
    /// `v`, a string of 60 to 250 bytes and a nullable `Utf8View`.
    Wide,
}

impl Payload {
    /// About how many bytes a row's payload takes, for [`MAX_SIDE_BYTES`].
    fn row_bytes(self) -> usize {
        match self {
            Payload::Narrow => 24,
            Payload::Strings => 48,
            Payload::Nullable => 48,
            Payload::Wide => 200,
        }
    }
}

/// Which side builds, as the planner decides from the statistics the case gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Statistics {
    /// None: the right side builds.
    None,
    /// The sides' true sizes: the smaller builds.
    Exact,
    /// A thousand times the true sizes.
    TooLarge,
}

/// A case decoded from the fuzzer's bytes; see the module's docs.
#[derive(Debug, Clone)]
pub struct SpillCase {
    /// The rows' seed.
    pub seed: u64,
    /// Rows asked for (before [`MAX_PAIRS`] cuts them), left and right.
    pub rows: [usize; 2],
    pub key_type: KeyType,
    pub key_shape: KeyShape,
    pub null_share: f64,
    pub payload: Payload,
    pub join_type: JoinType,
    pub filter: bool,
    pub null_equality: NullEquality,
    pub threads: usize,
    pub statistics: Statistics,
    pub swap_spilled_pairs: bool,
    pub batch_rows: usize,
    pub input_rows: usize,
    /// The byte that chooses the limit (see [`limit_bytes`]).
    pub limit_code: u8,
    pub partition_bits: Option<u32>,
    pub hot_key_split: HotKeySplit,
    pub force_spill: f64,
    pub force_spill_depth: u32,
}

/// Reads bytes one at a time, zero when they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

/// Rows of a side from a byte: a few small sizes, else 1,000 to 300,000 (log scale).
fn rows_of(b: u8) -> usize {
    match b {
        0..=7 => [0, 1, 10, 100, 500, 0, 1, 10][b as usize],
        _ => (1000.0 * 300f64.powf(f64::from(b - 8) / 247.0)) as usize,
    }
}

/// The memory limit a case's byte chooses, from the bytes of the side that builds
/// and the case's floor: unlimited; a fraction of the build (2× down to 1/16) but at
/// least the floor; the floor and a little above; below the floor, 2 MiB down to
/// 8 KiB.
pub fn limit_bytes(code: u8, build_bytes: usize, floor_bytes: usize) -> usize {
    match code % 16 {
        0 => usize::MAX,
        c @ 1..=6 => {
            let fraction = [2.0, 1.0, 0.5, 0.25, 0.125, 0.0625][c as usize - 1];
            floor_bytes.max((build_bytes as f64 * fraction) as usize)
        }
        7 | 8 => floor_bytes,
        9 => floor_bytes + floor_bytes / 4,
        c => [2 << 20, 1 << 20, 256 << 10, 64 << 10, 32 << 10, 8 << 10][c as usize - 10],
    }
}

/// The bytes of a batch's rows: what they use of each column's buffers, a view
/// column's strings kept outside the views, and a dictionary's keys with the rows'
/// share of its values (every batch of a side shares its dictionary).
pub fn counted_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(column_bytes).sum::<usize>() + batch.num_columns() * 64
}

/// [`counted_bytes`] of one column.
fn column_bytes(c: &ArrayRef) -> usize {
    if let Some(dictionary) = c.as_any_dictionary_opt() {
        let keys = dictionary.keys().to_data().get_slice_memory_size().unwrap();
        let (values, rows) = (dictionary.values(), c.len());
        let share = column_bytes(values) * rows.min(values.len()) / values.len().max(1);
        return keys + share;
    }
    let outside_views = match c.as_any().downcast_ref::<StringViewArray>() {
        Some(views) => views
            .views()
            .iter()
            .map(|&v| v as u32 as usize)
            .filter(|&len| len > 12)
            .sum(),
        None => 0,
    };
    c.to_data().get_slice_memory_size().unwrap() + outside_views
}

/// The least memory a case must finish in: [`FLOOR_BYTES`], or twice its largest
/// input batch ([`counted_bytes`]) when that is more (README: a join of wide rows
/// "finishes under twice its largest batch"; 8192 wide rows here are about 2 MB).
/// Below it, `ResourcesExhausted` is accepted.
pub fn floor_bytes<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    let largest = batches.into_iter().map(counted_bytes).max().unwrap_or(0);
    FLOOR_BYTES.max(2 * largest)
}

impl SpillCase {
    /// The case `bytes` describe; any bytes describe one.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut b = Bytes(bytes);
        let seed = u64::from_le_bytes(std::array::from_fn(|_| b.next()));
        let rows = [rows_of(b.next()), rows_of(b.next())];
        let mut key_type = KeyType::decode(b.next());
        let key_shape = KeyShape::decode(b.next());
        let null_share = [0.0, 0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 0.0][b.next() as usize % 8];
        let payload = [
            Payload::Narrow,
            Payload::Strings,
            Payload::Nullable,
            Payload::Wide,
        ][b.next() as usize % 4];
        let join_type = JoinType::ALL[b.next() as usize % JoinType::ALL.len()];
        let flags = b.next();
        let null_aware = join_type.is_null_aware();
        if null_aware && key_type == KeyType::Two {
            key_type = KeyType::Single(DataType::Int32); // NOT IN takes one key
        } else if null_aware && key_type == KeyType::Three {
            key_type = KeyType::Single(DataType::Int64);
        }
        let sizes = b.next();
        let limit_code = b.next();
        let plan = b.next();
        let force = b.next();
        let force_spill = [0.0, 0.0, 0.5, 1.0][force as usize % 4];
        Self {
            seed,
            rows,
            key_type,
            key_shape,
            null_share,
            payload,
            join_type,
            filter: !null_aware && flags & 1 != 0,
            null_equality: if !null_aware && flags & 2 != 0 {
                NullEquality::NullEqualsNull
            } else {
                NullEquality::NullEqualsNothing
            },
            threads: 1 + (flags >> 2 & 1) as usize,
            statistics: [
                Statistics::None,
                Statistics::Exact,
                Statistics::TooLarge,
                Statistics::None,
            ][(flags >> 3 & 3) as usize],
            swap_spilled_pairs: flags & 32 == 0,
            batch_rows: [7, 50, 1000, 4096, 8192, 8192, 1024, 100][sizes as usize % 8],
            input_rows: [13, 100, 1024, 8192][(sizes >> 3) as usize % 4],
            limit_code,
            partition_bits: Some(u32::from(plan & 15)).filter(|&bits| bits <= 8),
            hot_key_split: [
                HotKeySplit::Auto,
                HotKeySplit::Always,
                HotKeySplit::Never,
                HotKeySplit::Auto,
            ][(plan >> 4 & 3) as usize],
            force_spill,
            force_spill_depth: if force_spill > 0.0 {
                [0, 0, 1, spilljoin::MAX_DEPTH][(force >> 2) as usize % 4]
            } else {
                0
            },
        }
    }
}

/// How a case ended, for tests that look at what it exercised.
#[derive(Debug)]
pub struct Outcome {
    /// The memory limit it ran under.
    pub limit_bytes: usize,
    /// Its floor ([`floor_bytes`]).
    pub floor_bytes: usize,
    /// The most bytes reserved at once.
    pub peak_reserved_bytes: usize,
    /// Left and right rows, after the cuts.
    pub rows: [usize; 2],
    /// Whether it stopped with `ResourcesExhausted` (below the floor).
    pub exhausted: bool,
    /// The join's figures.
    pub metrics: JoinMetrics,
}

/// The number of (left, right) row pairs with equal key numbers.
fn matching_pairs(ids: &[Vec<Option<u64>>; 2], null_equality: NullEquality) -> u64 {
    let nulls_match = null_equality == NullEquality::NullEqualsNull;
    let mut left: HashMap<Option<u64>, u64> = HashMap::new();
    for id in ids[0].iter().filter(|id| id.is_some() || nulls_match) {
        *left.entry(*id).or_default() += 1;
    }
    ids[1]
        .iter()
        .map(|id| left.get(id).copied().unwrap_or(0))
        .sum()
}

impl SpillCase {
    /// The key numbers of the left and the right rows (`None`: a null key), cut to at
    /// most [`MAX_PAIRS`] matches.
    fn key_ids(&self, rng: &mut StdRng) -> [Vec<Option<u64>>; 2] {
        let row_bytes = self.payload.row_bytes() + 8 * self.key_type.data_types().len();
        let [nl, nr] = self.rows.map(|n| n.min(MAX_SIDE_BYTES / row_bytes));
        let larger = nl.max(nr) as u64 + 1;
        let mut draw = |side: usize, n: usize| -> Vec<u64> {
            match self.key_shape {
                KeyShape::Unique => {
                    let start = if side == 0 { 0 } else { nl as u64 / 2 };
                    let mut ids: Vec<u64> = (start..start + n as u64).collect();
                    ids.shuffle(rng);
                    ids
                }
                KeyShape::Duplicates(factor) => {
                    let domain = larger / factor + 1;
                    (0..n).map(|_| rng.random_range(0..domain)).collect()
                }
                KeyShape::Hot(share, sides) => {
                    let hot = match sides {
                        HotSides::Left => side == 0,
                        HotSides::Right => side == 1,
                        HotSides::Both => true,
                    };
                    (0..n)
                        .map(|_| match hot && rng.random_bool(share) {
                            true => 0,
                            false => rng.random_range(u64::from(hot)..larger),
                        })
                        .collect()
                }
                KeyShape::Zipf(divisor) => {
                    let domain = (larger / divisor + 2) as f64;
                    (0..n)
                        .map(|_| domain.powf(rng.random::<f64>()) as u64)
                        .collect()
                }
            }
        };
        let drawn = [draw(0, nl), draw(1, nr)];
        let mut ids = drawn.map(|side| {
            side.into_iter()
                .map(|id| (!rng.random_bool(self.null_share)).then_some(id))
                .collect::<Vec<_>>()
        });
        loop {
            let pairs = matching_pairs(&ids, self.null_equality);
            if pairs <= MAX_PAIRS {
                return ids;
            }
            let keep = (MAX_PAIRS as f64 / pairs as f64).sqrt();
            for side in &mut ids {
                side.truncate((side.len() as f64 * keep) as usize);
            }
        }
    }

    /// One side's batch: key columns `{prefix}k0..`, then the payload.
    fn side(&self, rng: &mut StdRng, prefix: &str, ids: &[Option<u64>]) -> RecordBatch {
        let types = self.key_type.data_types();
        // A null key row has nulls in some of the key columns (all of one), and
        // values from an arbitrary number in the others.
        let all_null = (1u8 << types.len()) - 1;
        let rows: Vec<(u64, u8)> = ids
            .iter()
            .map(|id| match id {
                Some(id) => (*id, 0),
                None => (rng.random_range(0..1000), rng.random_range(1..=all_null)),
            })
            .collect();
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (c, data_type) in types.iter().enumerate() {
            let vals: Vec<Option<u64>> = rows
                .iter()
                .map(|&(id, nulls)| (nulls >> c & 1 == 0).then(|| self.key_type.part(id, c)))
                .collect();
            fields.push(Field::new(format!("{prefix}k{c}"), data_type.clone(), true));
            columns.push(key_column_of(data_type, &vals));
        }
        let n = ids.len();
        for (name, column) in self.payload_columns(rng, prefix, n) {
            fields.push(Field::new(name, column.data_type().clone(), true));
            columns.push(column);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("a valid batch")
    }

    /// The payload's columns and their names for `n` rows.
    fn payload_columns(&self, rng: &mut StdRng, prefix: &str, n: usize) -> Vec<(String, ArrayRef)> {
        let v: Int64Array = (0..n)
            .map(|_| (!rng.random_bool(0.1)).then(|| rng.random_range(0..20)))
            .collect();
        let mut columns: Vec<(String, ArrayRef)> = vec![(format!("{prefix}v"), Arc::new(v))];
        let text = |rng: &mut StdRng, lengths: std::ops::Range<usize>, null_share: f64| {
            (0..n)
                .map(|i| {
                    let len = rng.random_range(lengths.clone());
                    (!rng.random_bool(null_share))
                        .then(|| format!("{prefix}{i}:{}", "x".repeat(len)))
                })
                .collect::<Vec<_>>()
        };
        match self.payload {
            Payload::Narrow => {}
            Payload::Strings => {
                let s = StringArray::from(text(rng, 0..41, 0.0));
                columns.push((format!("{prefix}s"), Arc::new(s)));
            }
            Payload::Nullable => {
                let s = StringArray::from(text(rng, 0..21, 0.3));
                let f: Float64Array = (0..n)
                    .map(|_| (!rng.random_bool(0.2)).then(|| rng.random_range(-1e3..1e3)))
                    .collect();
                let b: BooleanArray = (0..n)
                    .map(|_| (!rng.random_bool(0.25)).then(|| rng.random_bool(0.5)))
                    .collect();
                columns.push((format!("{prefix}s"), Arc::new(s)));
                columns.push((format!("{prefix}f"), Arc::new(f)));
                columns.push((format!("{prefix}b"), Arc::new(b)));
            }
            Payload::Wide => {
                let s = StringArray::from(text(rng, 60..251, 0.0));
                let t = StringViewArray::from(text(rng, 0..31, 0.1));
                columns.push((format!("{prefix}s"), Arc::new(s)));
                columns.push((format!("{prefix}t"), Arc::new(t)));
            }
        }
        columns
    }

    /// The left and the right input, from the seed.
    pub fn inputs(&self) -> (RecordBatch, RecordBatch) {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let [left, right] = self.key_ids(&mut rng);
        let left = self.side(&mut rng, "l", &left);
        let right = self.side(&mut rng, "r", &right);
        (left, right)
    }

    /// The bytes of the side that builds, as the planner picks it from the statistics
    /// the case gives (the smaller input builds; without statistics, the right).
    fn build_bytes(&self, left: &RecordBatch, right: &RecordBatch) -> usize {
        let (l, r) = (left.get_array_memory_size(), right.get_array_memory_size());
        match self.statistics {
            Statistics::None => r,
            Statistics::Exact | Statistics::TooLarge => {
                if l < r {
                    l
                } else {
                    r
                }
            }
        }
    }

    /// Batches are raised to this many rows at least, so that there are at most
    /// [`MAX_BATCHES`] of them.
    fn min_batch_rows(left: &RecordBatch, right: &RecordBatch) -> usize {
        (left.num_rows() + right.num_rows()) / MAX_BATCHES
    }

    /// The join of the case, reserving from `pool` and spilling to `spill`.
    fn join(
        &self,
        left: &RecordBatch,
        right: &RecordBatch,
        pool: &Arc<dyn MemoryPool>,
        spill: &SpillManager,
    ) -> HashJoin {
        let (ls, rs) = (left.schema(), right.schema());
        let on: Vec<(String, String)> = (0..self.key_type.data_types().len())
            .map(|c| (format!("lk{c}"), format!("rk{c}")))
            .collect();
        let mut builder = HashJoinBuilder::new(ls.clone(), rs.clone(), on)
            .with_join_type(self.join_type)
            .with_null_equality(self.null_equality)
            .with_memory_pool(Arc::clone(pool))
            .with_spill_manager(spill.clone())
            .with_batch_size(self.batch_rows.max(Self::min_batch_rows(left, right)))
            .with_threads(self.threads)
            .with_swap_spilled_pairs(self.swap_spilled_pairs)
            .with_hot_key_split(self.hot_key_split)
            // Set also when 0, so that `SPILLJOIN_FORCE_SPILL` does not change a replay.
            .with_force_spill(self.force_spill)
            .with_force_spill_depth(self.force_spill_depth);
        if let Some(bits) = self.partition_bits {
            builder = builder.with_partition_bits(bits);
        }
        if self.filter {
            builder = builder.with_filter(less_than_filter(&ls, &rs));
        }
        if self.statistics != Statistics::None {
            let scale = if self.statistics == Statistics::Exact {
                1
            } else {
                1000
            };
            let of = |b: &RecordBatch| {
                InputStatistics::new(
                    Some(b.get_array_memory_size() as u64 * scale),
                    Some(b.num_rows() as u64 * scale),
                )
            };
            builder = builder.with_statistics(of(left), of(right));
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("an invalid join: {e}\n{self:?}"))
    }

    /// A side's batches of `input_rows` rows (or at least `min_rows`), dealt out to
    /// one stream per thread.
    fn streams(&self, batch: &RecordBatch, min_rows: usize) -> Vec<Vec<RecordBatch>> {
        let rows = self.input_rows.max(min_rows);
        let mut streams: Vec<Vec<_>> = (0..self.threads).map(|_| Vec::new()).collect();
        for (i, offset) in (0..batch.num_rows()).step_by(rows).enumerate() {
            let slice = batch.slice(offset, rows.min(batch.num_rows() - offset));
            streams[i % self.threads].push(slice);
        }
        streams
    }

    /// Runs the case's join and checks it; see the module's docs.
    ///
    /// # Panics
    /// On a wrong answer, an unexpected error, an oversized batch, or a reservation
    /// or spill file left behind: whatever the fuzzer should record.
    pub fn check(&self) -> Outcome {
        let (left, right) = self.inputs();
        let rows = [left.num_rows(), right.num_rows()];
        let min_rows = Self::min_batch_rows(&left, &right);
        let (left_streams, right_streams) = (
            self.streams(&left, min_rows),
            self.streams(&right, min_rows),
        );
        let floor = floor_bytes(left_streams.iter().chain(&right_streams).flatten());
        let limit = limit_bytes(self.limit_code, self.build_bytes(&left, &right), floor);
        // (Tracking consumers, so that a `ResourcesExhausted` names the largest.)
        let tracked = Arc::new(TrackConsumersPool::new(
            GreedyMemoryPool::new(limit),
            NonZeroUsize::new(5).unwrap(),
        ));
        let pool: Arc<dyn MemoryPool> = tracked.clone();
        let root = tempfile::tempdir().expect("a temporary directory");
        let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path()))
            .expect("a spill directory");
        let join = self.join(&left, &right, &pool, &spill);
        let batch_rows = self.batch_rows.max(min_rows);
        let ok = |streams: Vec<Vec<RecordBatch>>| -> Vec<_> {
            let ok = |b| Ok::<_, ArrowError>(b);
            streams.into_iter().map(|s| s.into_iter().map(ok)).collect()
        };
        let mut stream = join
            .execute_partitioned(ok(left_streams), ok(right_streams))
            .expect("the join starts");
        let (mut output, mut failure) = (Vec::new(), None);
        for batch in stream.by_ref() {
            match batch {
                Ok(b) => output.push(b),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        let metrics = stream.metrics();
        drop((stream, join));
        let context =
            format!("{self:?}\nrows {rows:?}, limit {limit} (floor {floor})\nmetrics: {metrics:?}");
        if let Some(b) = output.iter().find(|b| b.num_rows() > batch_rows) {
            panic!(
                "a batch of {} rows, over {batch_rows}\n{context}",
                b.num_rows()
            );
        }
        let exhausted = match failure {
            None => {
                self.compare(&left, &right, &output, &context);
                false
            }
            Some(JoinError::ResourcesExhausted { .. }) if limit < floor => true,
            Some(e) => panic!("{e} ({e:?})\n{context}"),
        };
        assert_eq!(pool.reserved(), 0, "reservations left\n{context}");
        assert_eq!(spill.live_files(), 0, "spill files left\n{context}");
        drop(spill);
        let left_behind: Vec<_> = std::fs::read_dir(root.path())
            .expect("the spill root")
            .map(|entry| entry.map(|e| e.path()))
            .collect();
        assert!(
            left_behind.is_empty(),
            "left in the spill root: {left_behind:?}\n{context}"
        );
        Outcome {
            limit_bytes: limit,
            floor_bytes: floor,
            peak_reserved_bytes: tracked.peak_reserved(),
            rows,
            exhausted,
            metrics,
        }
    }

    /// Compares the join's output with the reference's as multisets of rendered rows.
    fn compare(
        &self,
        left: &RecordBatch,
        right: &RecordBatch,
        output: &[RecordBatch],
        context: &str,
    ) {
        let keys: Vec<(usize, usize)> = (0..self.key_type.data_types().len())
            .map(|c| (c, c))
            .collect();
        let (join_type, filter, nulls) = (self.join_type, self.filter, self.null_equality);
        let expected = if left.num_rows() * right.num_rows() <= NESTED_LOOP_MAX_PAIRS {
            reference_join(left, right, &keys, join_type, filter, nulls)
        } else {
            hash_reference_join(left, right, &keys, join_type, filter, nulls)
        };
        let actual = rendered_rows(output);
        if actual != expected {
            let (missing, extra) = first_differences(&expected, &actual, 3);
            panic!(
                "{} rows, expected {}\nmissing: {missing:?}\nextra: {extra:?}\n{context}",
                actual.len(),
                expected.len()
            );
        }
    }
}

/// Up to `n` rows of sorted `expected` missing from sorted `actual`, and up to `n`
/// rows of `actual` not expected (counting repeats).
fn first_differences<'a>(
    expected: &'a [String],
    actual: &'a [String],
    n: usize,
) -> (Vec<&'a str>, Vec<&'a str>) {
    let (mut missing, mut extra) = (Vec::new(), Vec::new());
    let (mut e, mut a) = (expected.iter().peekable(), actual.iter().peekable());
    loop {
        match (e.peek(), a.peek()) {
            (Some(x), Some(y)) if x == y => {
                e.next();
                a.next();
            }
            (Some(x), Some(y)) if x < y => missing.push(e.next().unwrap().as_str()),
            (Some(_), Some(_)) | (None, Some(_)) => extra.push(a.next().unwrap().as_str()),
            (Some(_), None) => missing.push(e.next().unwrap().as_str()),
            (None, None) => break,
        }
        if missing.len() >= n && extra.len() >= n {
            break;
        }
    }
    missing.truncate(n);
    extra.truncate(n);
    (missing, extra)
}
