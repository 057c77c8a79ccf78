//! `--spill-direct-io auto|on|off`: whether spill files bypass the page cache.
//!
//! Buffered spill files go through the page cache: a spill it can hold is read back
//! from memory, which is what makes small spills cheap. A spill far larger than the
//! memory the machine has free cannot stay there: every page is written to the disk
//! anyway, after a copy into a page-cache page, and on its way it evicts the cache of
//! everything else on the machine (and, in a container, counts against the
//! container's memory). On the virtual machines we measure on, filling fresh
//! page-cache pages is also slow (BENCHMARKS.md, "Direct I/O": 201 MB/s buffered
//! against 1.2 GB/s direct). So `auto`, the default, writes a join's spill past the
//! page cache when the spill expected from the inputs' sizes and the limit is more
//! than [`AUTO_SHARE`] of the memory available, and through it otherwise.

use std::fmt;

use spilljoin::spill::{
    DEFAULT_DIRECT_READ_AHEAD, DEFAULT_DIRECT_WRITES_BEHIND, MAX_DIRECT_WRITES_BEHIND,
};
use spilljoin::{InputStatistics, Side};

use crate::progress::human_bytes;

/// Above this share of the available memory an expected spill is written with
/// direct I/O under `auto`: the page cache then holds at most a few such spills
/// beside everything else (BENCHMARKS.md, "Direct I/O", for the joins on either side).
pub const AUTO_SHARE: f64 = 0.25;

/// The `--spill-direct-io` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIoMode {
    /// Direct when the expected spill is large ([`decide`]).
    #[default]
    Auto,
    /// Always direct (where the file system takes it).
    On,
    /// Never direct.
    Off,
}

impl std::str::FromStr for DirectIoMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" | "true" | "yes" => Ok(Self::On),
            "off" | "false" | "no" => Ok(Self::Off),
            _ => Err(format!("`{s}` is not auto, on or off")),
        }
    }
}

impl fmt::Display for DirectIoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Whether a join spills with direct I/O, and why (for `--explain` and `--metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectIoChoice {
    /// Whether spill files are opened with direct I/O.
    pub direct: bool,
    /// Why, in a few words.
    pub reason: String,
    /// Runs of 1 MiB a direct reader reads ahead, and direct writes a thread keeps
    /// in flight ([`depth`]).
    pub depth: Depth,
}

/// How far direct I/O works ahead of a thread: runs of 1 MiB a reader reads ahead,
/// writes of up to 1 MiB a thread keeps in flight behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    /// `SpillConfig::direct_read_ahead`.
    pub read_ahead: usize,
    /// `SpillConfig::direct_writes_behind`.
    pub writes_behind: usize,
}

/// The least depth: where the limit has no room for more, a writer waits for its
/// writes, as every writer did before writes behind.
pub const SHALLOW: Depth = Depth {
    read_ahead: DEFAULT_DIRECT_READ_AHEAD,
    writes_behind: 0,
};

/// What a join is expected to spill, in bytes: none when the build's estimate fits
/// under the join's limit; otherwise the share of both inputs that the build's
/// partitions over the limit take (the hybrid hash join spills build partitions until
/// the rest fits, and the probe rows of the same partitions with them). `None` when
/// an input's size is unknown.
pub fn expected_spill_bytes(
    build: InputStatistics,
    probe: InputStatistics,
    join_limit: u64,
) -> Option<u64> {
    let (build, probe) = (build.bytes?, probe.bytes?);
    if build <= join_limit {
        return Some(0);
    }
    let spilled_share = 1.0 - join_limit as f64 / build as f64;
    Some((spilled_share * (build as f64 + probe as f64)) as u64)
}

/// What `auto` weighs: the spill expected, the memory available now (either unknown:
/// buffered, the file system's ordinary path), and whether the direct I/O buffers fit
/// in the limit's share for them ([`buffers_in_pool`]).
#[derive(Debug, Clone, Copy)]
pub struct Situation {
    /// [`expected_spill_bytes`].
    pub expected_spill: Option<u64>,
    /// The memory available to the process now.
    pub available: Option<u64>,
    /// The direct I/O buffers of the join's threads ([`buffer_bytes`]).
    pub buffers: u64,
    /// The join's limit in bytes.
    pub join_limit: u64,
}

/// The choice for `mode` in `situation`.
pub fn decide(mode: DirectIoMode, situation: Situation) -> DirectIoChoice {
    let choice = |direct, reason: String| DirectIoChoice {
        direct,
        reason,
        depth: SHALLOW,
    };
    let Situation {
        expected_spill,
        available,
        buffers,
        join_limit,
    } = situation;
    match (mode, expected_spill, available) {
        (DirectIoMode::On, ..) => choice(true, "--spill-direct-io on".into()),
        (DirectIoMode::Off, ..) => choice(false, "--spill-direct-io off".into()),
        (DirectIoMode::Auto, ..) if buffers > join_limit / BUFFERS_SHARE => choice(
            false,
            format!(
                "auto: its buffers ({}) would take more than an eighth of the limit",
                human_bytes(buffers)
            ),
        ),
        (DirectIoMode::Auto, Some(spill), Some(available)) => {
            let large = spill as f64 > AUTO_SHARE * available as f64;
            let reason = format!(
                "auto: about {} expected to spill, {} a quarter of the {} available",
                human_bytes(spill),
                if large { "over" } else { "not over" },
                human_bytes(available)
            );
            choice(large, reason)
        }
        (DirectIoMode::Auto, None, _) => choice(false, "auto: input sizes unknown".into()),
        (DirectIoMode::Auto, _, None) => choice(false, "auto: available memory unknown".into()),
    }
}

/// The direct I/O buffers take at most 1/this of a join's limit: with more, the pool
/// left moved SF10's every-column join at 64 MiB across a partitioning cliff (its
/// pairs joined in chunks, 45–50 s against 40), and left outside the pool they took
/// its peak RSS to its bound (BENCHMARKS.md, "Direct I/O").
const BUFFERS_SHARE: u64 = 8;

/// The direct I/O buffers of `threads` workers at most, at `depth`
/// ([`spilljoin::spill::direct_io_bytes_per_thread`] each; outside the pool).
pub fn buffer_bytes(threads: usize, depth: Depth) -> u64 {
    let per_thread =
        spilljoin::spill::direct_io_bytes_per_thread(depth.read_ahead, depth.writes_behind);
    threads.saturating_mul(per_thread) as u64
}

/// Runs a direct reader reads ahead where the limit has room for them: with six
/// against three, SF10's every-column join at 25% took 0.95× the time (BENCHMARKS.md,
/// the choices table); the 3 MiB a thread more come out of the limit.
pub const DEEP_READ_AHEAD: usize = 6;

/// The depths tried, deepest first, where the limit has room for them
/// ([`DEEP_SHARE`]); else [`SHALLOW`]. Writes behind come first: they gained more
/// than reading further ahead did, and four more than two (BENCHMARKS.md, the
/// choices table, has the paired ratios).
const DEPTHS: [Depth; 2] = [
    Depth {
        read_ahead: DEEP_READ_AHEAD,
        writes_behind: MAX_DIRECT_WRITES_BEHIND,
    },
    Depth {
        read_ahead: DEFAULT_DIRECT_READ_AHEAD,
        writes_behind: DEFAULT_DIRECT_WRITES_BEHIND,
    },
];

/// Direct I/O works deeper than [`SHALLOW`] where the buffers that takes are at most
/// 1/this of the join's limit: the same 6% of a limit or less as the shallow
/// buffers' at the smallest limit `auto` goes direct under ([`BUFFERS_SHARE`]).
const DEEP_SHARE: u64 = 16;

/// How far direct I/O works ahead: the deepest of [`DEPTHS`] whose buffers fit in
/// the join's limit ([`DEEP_SHARE`]), else [`SHALLOW`].
pub fn depth(direct: bool, threads: usize, join_limit: u64) -> Depth {
    let fits = |d: &&Depth| buffer_bytes(threads, **d) <= join_limit / DEEP_SHARE;
    match direct {
        true => DEPTHS.iter().find(fits).copied().unwrap_or(SHALLOW),
        false => SHALLOW,
    }
}

/// What of the join's limit `join_limit` the direct I/O buffers take when the limit
/// was given: the join's pool gets the rest, so that the pool and the buffers stay
/// inside the RSS bound together. At most [`BUFFERS_SHARE`]'s share of the limit
/// (`auto` goes direct only when they fit in it; with `on` and a small limit the
/// process's RSS is far below its bound anyway).
pub fn buffers_in_pool(
    choice: &DirectIoChoice,
    limit_given: bool,
    threads: usize,
    join_limit: u64,
) -> u64 {
    if !choice.direct || !limit_given {
        return 0;
    }
    buffer_bytes(threads, choice.depth).min(join_limit / BUFFERS_SHARE)
}

/// The build and probe inputs' statistics of a join whose build is `build_side`.
pub fn build_and_probe(
    build_side: Side,
    left: InputStatistics,
    right: InputStatistics,
) -> (InputStatistics, InputStatistics) {
    match build_side {
        Side::Left => (left, right),
        Side::Right => (right, left),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(bytes: u64) -> InputStatistics {
        InputStatistics {
            bytes: Some(bytes),
            ..InputStatistics::default()
        }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_build_that_fits_spills_nothing() {
        assert_eq!(
            expected_spill_bytes(stats(GIB), stats(10 * GIB), GIB),
            Some(0)
        );
        assert_eq!(
            expected_spill_bytes(InputStatistics::default(), stats(GIB), GIB),
            None
        );
    }

    #[test]
    fn a_build_four_times_the_limit_spills_three_quarters_of_both_inputs() {
        let spill = expected_spill_bytes(stats(4 * GIB), stats(12 * GIB), GIB);
        assert_eq!(spill, Some(12 * GIB));
    }

    #[test]
    fn auto_is_direct_only_for_spills_over_a_quarter_of_what_is_available() {
        let auto = |spill, available| {
            let room = Situation {
                expected_spill: spill,
                available,
                buffers: 10 << 20,
                join_limit: GIB,
            };
            decide(DirectIoMode::Auto, room).direct
        };
        assert!(auto(Some(6 * GIB), Some(20 * GIB)));
        assert!(!auto(Some(5 * GIB), Some(20 * GIB)));
        assert!(!auto(Some(0), Some(GIB)));
        assert!(!auto(None, Some(GIB)));
        assert!(!auto(Some(6 * GIB), None));
    }

    #[test]
    fn auto_is_buffered_where_the_buffers_would_take_over_an_eighth_of_the_limit() {
        let situation = |join_limit| Situation {
            expected_spill: Some(100 * GIB),
            available: Some(GIB),
            buffers: 10 << 20,
            join_limit,
        };
        assert!(!decide(DirectIoMode::Auto, situation(64 << 20)).direct);
        assert!(decide(DirectIoMode::Auto, situation(80 << 20)).direct);
        assert!(decide(DirectIoMode::On, situation(64 << 20)).direct);
        assert!(!decide(DirectIoMode::Off, situation(GIB)).direct);
    }

    #[test]
    fn direct_buffers_come_out_of_a_given_limit_only() {
        let choice = |direct, depth| DirectIoChoice {
            direct,
            reason: String::new(),
            depth,
        };
        let (shallow, deep) = (choice(true, SHALLOW), choice(true, DEPTHS[0]));
        assert_eq!(buffers_in_pool(&shallow, true, 2, GIB), 2 * (5 << 20));
        assert_eq!(buffers_in_pool(&deep, true, 2, GIB), 2 * (12 << 20));
        assert_eq!(buffers_in_pool(&shallow, true, 64, 64 << 20), 8 << 20);
        assert_eq!(buffers_in_pool(&choice(false, SHALLOW), true, 2, GIB), 0);
        assert_eq!(buffers_in_pool(&shallow, false, 2, GIB), 0);
    }

    /// Writers keep writes in flight, then readers read further ahead, where the
    /// limit has room for their buffers, and only with direct I/O.
    #[test]
    fn depth_grows_with_room_in_the_limit() {
        assert_eq!(depth(true, 2, 384 << 20), DEPTHS[0]);
        assert_eq!(depth(true, 2, 383 << 20), DEPTHS[1]);
        assert_eq!(depth(true, 2, 224 << 20), DEPTHS[1]);
        assert_eq!(depth(true, 2, 223 << 20), SHALLOW);
        assert_eq!(depth(true, 8, 384 << 20), SHALLOW);
        assert_eq!(depth(false, 2, GIB), SHALLOW);
        assert_eq!(DEPTHS[1].read_ahead, SHALLOW.read_ahead);
    }

    #[test]
    fn modes_parse_and_print() {
        for mode in [DirectIoMode::Auto, DirectIoMode::On, DirectIoMode::Off] {
            assert_eq!(mode.to_string().parse::<DirectIoMode>(), Ok(mode));
        }
        assert!("sometimes".parse::<DirectIoMode>().is_err());
    }
}
