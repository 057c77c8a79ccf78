//! Configuration: where spill files go, how they are compressed and read, and
//! how much disk they may take.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Compression of the buffers inside a spill file.
///
/// Compression is per buffer (the Arrow IPC `BodyCompression` scheme), so a
/// compressed spill file is still a standard Arrow IPC stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpillCompression {
    /// Buffers are written as they are in memory. Fastest on a local disk.
    #[default]
    None,
    /// LZ4 frame compression: cheap, usually halves string-heavy data.
    Lz4,
    /// Zstandard (arrow's default level): smallest files, slowest to write.
    Zstd,
}

impl SpillCompression {
    /// The name accepted by [`FromStr`] and printed by [`fmt::Display`].
    pub fn as_str(self) -> &'static str {
        match self {
            SpillCompression::None => "none",
            SpillCompression::Lz4 => "lz4",
            SpillCompression::Zstd => "zstd",
        }
    }

    pub(crate) fn ipc_compression(self) -> Option<arrow_ipc::CompressionType> {
        match self {
            SpillCompression::None => None,
            SpillCompression::Lz4 => Some(arrow_ipc::CompressionType::LZ4_FRAME),
            SpillCompression::Zstd => Some(arrow_ipc::CompressionType::ZSTD),
        }
    }
}

impl fmt::Display for SpillCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpillCompression {
    type Err = ParseSpillOptionError;

    /// Parses `none`, `lz4` or `zstd` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            SpillCompression::None,
            SpillCompression::Lz4,
            SpillCompression::Zstd,
        ]
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| ParseSpillOptionError {
            option: "spill compression",
            input: s.to_owned(),
            expected: "none, lz4 or zstd",
        })
    }
}

/// How a [`crate::SpillReader`] gets the bytes of a file.
///
/// Both modes decode the same bytes with the same checks and yield the same
/// batches; they differ in speed, in where the batches' memory lives, and in
/// what a concurrent truncation of the file does (see [`SpillReadMode::Mmap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpillReadMode {
    /// `read(2)` each message into a freshly allocated buffer that the
    /// decoded arrays then share: one copy, out of the page cache, into
    /// ordinary heap memory.
    ///
    /// The default. Only decoding an uncompressed file is faster with
    /// [`SpillReadMode::Mmap`] (no copy; `benches/spill_io.rs`). Compressed
    /// files decode as fast or faster this way, and a consumer that reads every
    /// byte of the batches, as a join does, was faster with this mode in most
    /// runs (`read_scan`; see `BENCHMARKS.md`): the copy lands in cache-hot heap pages,
    /// while the mapping is read page by page from the page cache. The
    /// batches are also ordinary heap memory, and nothing another process
    /// does to the file can crash the reader.
    #[default]
    Buffered,
    /// Map the file and decode arrays that point straight into the mapping
    /// (zero-copy for uncompressed, aligned buffers).
    ///
    /// Pages are faulted in when the arrays are first touched. If another
    /// process truncates the file while it is mapped, touching the lost pages
    /// raises `SIGBUS`; the private spill directory rules that out for the
    /// manager's own files, so only use this mode with
    /// [`crate::read_spill_file`] on files nobody else modifies.
    Mmap,
}

impl SpillReadMode {
    /// The name accepted by [`FromStr`] and printed by [`fmt::Display`].
    pub fn as_str(self) -> &'static str {
        match self {
            SpillReadMode::Buffered => "buffered",
            SpillReadMode::Mmap => "mmap",
        }
    }
}

impl fmt::Display for SpillReadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpillReadMode {
    type Err = ParseSpillOptionError;

    /// Parses `buffered` or `mmap` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [SpillReadMode::Buffered, SpillReadMode::Mmap]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseSpillOptionError {
                option: "spill read mode",
                input: s.to_owned(),
                expected: "buffered or mmap",
            })
    }
}

/// The error of parsing a [`SpillCompression`] or [`SpillReadMode`] from a string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {option} {input:?}: expected {expected}")]
pub struct ParseSpillOptionError {
    option: &'static str,
    input: String,
    expected: &'static str,
}

/// Configuration of a [`crate::SpillManager`].
///
/// ```
/// use spilljoin_spill::{SpillCompression, SpillConfig, SpillReadMode};
///
/// let config = SpillConfig::default()
///     .with_compression("lz4".parse()?)
///     .with_disk_quota_bytes(10 << 30)
///     .with_read_mode(SpillReadMode::Buffered);
/// assert_eq!(config.compression, SpillCompression::Lz4);
/// assert_eq!(config.disk_quota_bytes, Some(10 << 30));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillConfig {
    /// The directory in which the manager creates its private spill directory;
    /// `None` means [`std::env::temp_dir`]. It must exist.
    pub root_dir: Option<PathBuf>,
    /// Compression of newly written files.
    pub compression: SpillCompression,
    /// The most bytes all live files of one manager may hold together;
    /// `None` means unlimited.
    pub disk_quota_bytes: Option<u64>,
    /// How files are read back.
    pub read_mode: SpillReadMode,
    /// Whether files are written and read with direct I/O (`O_DIRECT`, Linux),
    /// past the page cache, where the file system takes it. Off by default: a
    /// spill that fits the page cache is read back from memory when buffered,
    /// from the disk when direct. On virtual machines whose host takes back the
    /// guest's free memory, buffered writes are slowed by the host's faults on
    /// fresh page-cache pages, and direct I/O paid (BENCHMARKS.md, "Direct I/O").
    /// A writer takes a 1 MiB block-aligned buffer while it writes a message, and
    /// one for each of its thread's writes in flight
    /// ([`direct_writes_behind`](Self::direct_writes_behind)), an
    /// open reader one more than [`direct_read_ahead`](Self::direct_read_ahead)
    /// (the run it reads from and those read ahead), from a pool of idle ones; none
    /// of them is reserved in the join's memory pool
    /// ([`direct_io_bytes_per_thread`](crate::direct_io_bytes_per_thread) says how
    /// much a thread takes). Reads in [`SpillReadMode::Mmap`] go through the page
    /// cache all the same.
    pub direct_io: bool,
    /// Runs of 1 MiB a direct reader reads ahead of the one it hands out from, 1 to
    /// [`MAX_DIRECT_READ_AHEAD`](crate::MAX_DIRECT_READ_AHEAD) (more is taken as
    /// that). The virtual disks we measure on read faster the more is in flight
    /// (BENCHMARKS.md, the choices table): more read ahead is faster where the
    /// memory for it is there.
    pub direct_read_ahead: usize,
    /// Direct writes a thread keeps in flight while it goes on, 0 to
    /// [`MAX_DIRECT_WRITES_BEHIND`](crate::MAX_DIRECT_WRITES_BEHIND) (more is taken
    /// as that; 0 waits for every write). A thread that waits for each write of a
    /// large spill leaves its core idle while the device works.
    pub direct_writes_behind: usize,
    /// Faults to inject into the manager's files (tests; feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub faults: Option<crate::FaultPlan>,
}

impl Default for SpillConfig {
    fn default() -> Self {
        Self {
            root_dir: None,
            compression: SpillCompression::default(),
            disk_quota_bytes: None,
            read_mode: SpillReadMode::default(),
            direct_io: false,
            direct_read_ahead: crate::direct::DEFAULT_DIRECT_READ_AHEAD,
            direct_writes_behind: crate::direct::DEFAULT_DIRECT_WRITES_BEHIND,
            #[cfg(feature = "fault-injection")]
            faults: None,
        }
    }
}

impl SpillConfig {
    /// Sets [`SpillConfig::root_dir`].
    pub fn with_root_dir(mut self, root_dir: impl Into<PathBuf>) -> Self {
        self.root_dir = Some(root_dir.into());
        self
    }

    /// Sets [`SpillConfig::compression`].
    pub fn with_compression(mut self, compression: SpillCompression) -> Self {
        self.compression = compression;
        self
    }

    /// Sets [`SpillConfig::disk_quota_bytes`]; takes a `u64` or an `Option<u64>`.
    pub fn with_disk_quota_bytes(mut self, disk_quota_bytes: impl Into<Option<u64>>) -> Self {
        self.disk_quota_bytes = disk_quota_bytes.into();
        self
    }

    /// Sets [`SpillConfig::read_mode`].
    pub fn with_read_mode(mut self, read_mode: SpillReadMode) -> Self {
        self.read_mode = read_mode;
        self
    }

    /// Sets [`SpillConfig::direct_io`].
    pub fn with_direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }

    /// Sets [`SpillConfig::direct_writes_behind`].
    pub fn with_direct_writes_behind(mut self, writes: usize) -> Self {
        self.direct_writes_behind = writes;
        self
    }

    /// Sets [`SpillConfig::direct_read_ahead`].
    pub fn with_direct_read_ahead(mut self, runs: usize) -> Self {
        self.direct_read_ahead = runs;
        self
    }

    /// Sets [`SpillConfig::faults`]: the writes and reads of the manager's files that
    /// fail (tests; feature `fault-injection`, see [`crate::FaultPlan`]).
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(mut self, faults: crate::FaultPlan) -> Self {
        self.faults = Some(faults);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_parses_and_prints() {
        for c in [
            SpillCompression::None,
            SpillCompression::Lz4,
            SpillCompression::Zstd,
        ] {
            assert_eq!(c.to_string().parse::<SpillCompression>(), Ok(c));
        }
        assert_eq!(
            "ZSTD".parse::<SpillCompression>(),
            Ok(SpillCompression::Zstd)
        );
        let err = "gzip".parse::<SpillCompression>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown spill compression \"gzip\": expected none, lz4 or zstd"
        );
        assert_eq!(SpillCompression::default(), SpillCompression::None);
    }

    #[test]
    fn read_mode_parses_and_prints() {
        for m in [SpillReadMode::Buffered, SpillReadMode::Mmap] {
            assert_eq!(m.to_string().parse::<SpillReadMode>(), Ok(m));
        }
        assert!("mapped".parse::<SpillReadMode>().is_err());
    }

    #[test]
    fn builders_set_fields() {
        let c = SpillConfig::default()
            .with_root_dir("/x")
            .with_compression(SpillCompression::Zstd)
            .with_disk_quota_bytes(5)
            .with_read_mode(SpillReadMode::Mmap)
            .with_direct_io(true);
        assert!(c.direct_io);
        assert_eq!(c.root_dir.as_deref(), Some(std::path::Path::new("/x")));
        assert_eq!(c.compression, SpillCompression::Zstd);
        assert_eq!(c.disk_quota_bytes, Some(5));
        assert_eq!(c.read_mode, SpillReadMode::Mmap);
        assert_eq!(c.with_disk_quota_bytes(None).disk_quota_bytes, None);
    }
}
