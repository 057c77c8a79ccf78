//! The DataFusion session a query runs in, built from the command line.
//!
//! ```text
//!  --threads N ───────► tokio runtime with N workers; target_partitions = N
//!  --memory-limit ────► PeakPool ─► TrackConsumersPool ─► FairSpillPool(limit)
//!                        (the peak)  (errors name the      (one budget: every
//!                                     top consumers)        operator, every join)
//!  --spill-dir ───────► a private spilljoin-XXXXXX directory (locked while the
//!                        query runs; stale ones of killed runs removed) ─► the
//!                        DiskManager's one directory (DiskManagerMode::Directories)
//!  --max-spill-size ──► the DiskManager's max_temp_directory_size (the joins'
//!                        spill files count against what is left of it)
//!  --batch-size, --max-depth, --spill-compression ─► datafusion.execution.* and
//!                        spilljoin.* settings
//!  SessionStateBuilder::with_default_features() ─► with_spilljoin ─► SessionContext
//!  --table NAME=PATH ─► files and format (as `join` finds them) ─► a ListingTable
//!                        over exactly those files
//! ```

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use datafusion::common::config::SpillCompression as DfSpillCompression;
use datafusion::datasource::file_format::arrow::ArrowFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use spilljoin::spill::SpillCompression;

use crate::args::{RunArgs, TableArg};
use crate::direct_io::DirectIoMode;
use crate::failure::Kind;
use crate::format::{CsvOptions, Format};
use crate::input::{locate, InputName};

/// Consumers that a "Resources exhausted" error lists, largest first.
const TOP_CONSUMERS: usize = 5;

/// What the command line asks of the session, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The memory budget of the whole query.
    pub limit_bytes: u64,
    /// Tokio workers and DataFusion's target partitions.
    pub threads: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// How deep the joins repartition spilled pairs.
    pub max_depth: u32,
    /// Compression of spill files, the joins' and DataFusion's.
    pub compression: SpillCompression,
    /// The most bytes all spill files may take (`None`: unlimited).
    pub max_spill_bytes: Option<u64>,
    /// Whether the joins' spill files are written and read with direct I/O (`auto`
    /// is off here: a query's joins' spills are not estimated before it runs).
    pub direct_io: bool,
}

impl Settings {
    /// The settings of `run`: the limit and threads default as for `join`.
    pub fn of(run: &RunArgs) -> Self {
        Self {
            limit_bytes: run
                .memory_limit
                .unwrap_or_else(spilljoin::memory::default_memory_limit_bytes),
            threads: run
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            batch_size: run.batch_size,
            max_depth: run.max_depth,
            compression: run.spill_compression,
            max_spill_bytes: run.max_spill_size,
            direct_io: run.spill_direct_io == DirectIoMode::On,
        }
    }
}

/// A session ready for queries, and the handles the run reads while it goes.
pub struct Session {
    /// The context, its tables registered.
    pub ctx: SessionContext,
    /// The session's memory pool (its reservation now, and its peak).
    pub pool: Arc<PeakPool>,
    /// Where it spills.
    pub spill_dir: PathBuf,
}

/// The tokio runtime queries run on: `threads` workers.
///
/// # Errors
/// The runtime's threads cannot be started.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("spilljoin-sql")
        .enable_all()
        .build()
        .context("cannot start the query's threads")
}

/// A session with `settings`, spilling under `spill_dir` (a directory of its own,
/// created for this query).
///
/// # Errors
/// The spill directory cannot be used; a setting DataFusion refuses.
pub fn session(settings: &Settings, spill_dir: &Path) -> Result<Session> {
    let limit = usize::try_from(settings.limit_bytes).unwrap_or(usize::MAX);
    let top = NonZeroUsize::new(TOP_CONSUMERS).unwrap_or(NonZeroUsize::MIN);
    let pool = Arc::new(PeakPool::new(TrackConsumersPool::new(
        FairSpillPool::new(limit),
        top,
    )));
    let disk = DiskManagerBuilder::default()
        .with_mode(DiskManagerMode::Directories(vec![spill_dir.to_path_buf()]))
        .with_max_temp_directory_size(settings.max_spill_bytes.unwrap_or(u64::MAX));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool) as Arc<dyn MemoryPool>)
        .with_disk_manager_builder(disk)
        .build_arc()
        .with_context(|| {
            Kind::Spill.context(format!(
                "cannot spill under {}",
                spill_dir.parent().unwrap_or(spill_dir).display()
            ))
        })?;
    let config = config(settings)?;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime);
    let ctx = SessionContext::new_with_state(spilljoin_datafusion::with_spilljoin(state).build());
    Ok(Session {
        ctx,
        pool,
        spill_dir: spill_dir.to_path_buf(),
    })
}

/// The session's settings: partitions, batch size, and both engines' spilling.
fn config(settings: &Settings) -> Result<SessionConfig> {
    let mut config = spilljoin_datafusion::with_spilljoin_config(
        SessionConfig::new()
            .with_target_partitions(settings.threads.max(1))
            .with_batch_size(settings.batch_size)
            // `SHOW spilljoin.max_depth`, `SHOW ALL`.
            .with_information_schema(true),
    );
    let options = config.options_mut();
    options.execution.spill_compression = match settings.compression {
        SpillCompression::None => DfSpillCompression::Uncompressed,
        SpillCompression::Lz4 => DfSpillCompression::Lz4Frame,
        SpillCompression::Zstd => DfSpillCompression::Zstd,
    };
    let spilljoin_settings = [
        ("spilljoin.max_depth", settings.max_depth.to_string()),
        (
            "spilljoin.spill_compression",
            settings.compression.to_string(),
        ),
        ("spilljoin.spill_direct_io", settings.direct_io.to_string()),
    ];
    for (key, value) in spilljoin_settings {
        options
            .set(key, &value)
            .with_context(|| format!("cannot set {key} to {value}"))?;
    }
    Ok(config)
}

/// A `--table`: its name, what the user gave, and the files that names.
#[derive(Debug, Clone)]
pub struct Table {
    /// The table's name in SQL.
    pub name: String,
    /// PATH as given.
    pub spec: String,
    /// The files' format.
    pub format: Format,
    /// The files, sorted.
    pub files: Vec<PathBuf>,
}

/// The files and format of each `--table NAME[:FORMAT]=PATH`, found as `join`
/// finds its inputs'.
///
/// # Errors
/// A name given twice (a definition failure); the failures of [`locate`].
pub fn locate_tables(tables: &[TableArg]) -> Result<Vec<Table>> {
    let mut located: Vec<Table> = Vec::with_capacity(tables.len());
    for TableArg {
        name,
        format,
        path: spec,
    } in tables
    {
        if located.iter().any(|t| &t.name == name) {
            return Err(Kind::Definition.error(format!(
                "--table {name} is given twice: each table needs a name of its own"
            )));
        }
        let (files, format) = locate(InputName::Table(name), spec, *format)?;
        located.push(Table {
            name: name.clone(),
            spec: spec.clone(),
            format,
            files,
        });
    }
    Ok(located)
}

/// Registers `table` in `ctx`: a listing table over exactly its files, its schema
/// inferred by DataFusion (from the footer, or the first rows of the first file).
///
/// # Errors
/// An input failure naming the table: a file that cannot be read as its format.
pub async fn register(ctx: &SessionContext, table: &Table, csv: CsvOptions) -> Result<()> {
    let failure =
        || Kind::Input.context(format!("cannot read table {} ({})", table.name, table.spec));
    let urls = table
        .files
        .iter()
        .map(|path| file_url(path))
        .collect::<Result<Vec<_>>>()?;
    let format: Arc<dyn FileFormat> = match table.format {
        Format::Parquet => Arc::new(ParquetFormat::default()),
        // DataFusion's Arrow format reads both the file and the stream format.
        Format::Arrow | Format::Arrows => Arc::new(ArrowFormat),
        Format::Csv => {
            let first = table.files.first().map_or(Path::new(""), |p| p.as_path());
            Arc::new(
                CsvFormat::default()
                    .with_has_header(csv.header)
                    .with_delimiter(csv.delimiter_for(first)),
            )
        }
        Format::Ndjson => Arc::new(JsonFormat::default()),
    };
    // Every file given counts, whatever its extension (`.parq`, `.jsonl`, none with
    // a format flag): the files are listed already.
    let options = ListingOptions::new(format).with_file_extension("");
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .infer_schema(&ctx.state())
        .await
        .with_context(failure)?;
    let provider = ListingTable::try_new(config).with_context(failure)?;
    ctx.register_table(table.name.as_str(), Arc::new(provider))
        .with_context(failure)?;
    Ok(())
}

/// The `file://` URL of `path`, never read as a glob (a file's name may hold `*`).
fn file_url(path: &Path) -> Result<ListingTableUrl> {
    let bad = || Kind::Input.error(format!("cannot open {}", path.display()));
    let absolute = std::path::absolute(path).map_err(|_| bad())?;
    let url = url::Url::from_file_path(&absolute).map_err(|()| bad())?;
    ListingTableUrl::try_new(url, None).map_err(|_| bad())
}

/// A memory pool that remembers the most it held at once, over the pool the query
/// reserves from.
#[derive(Debug)]
pub struct PeakPool {
    inner: TrackConsumersPool<FairSpillPool>,
    peak: AtomicUsize,
}

impl PeakPool {
    fn new(inner: TrackConsumersPool<FairSpillPool>) -> Self {
        Self {
            inner,
            peak: AtomicUsize::new(0),
        }
    }

    /// The most bytes reserved at once so far.
    pub fn peak_bytes(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn note(&self) {
        self.peak
            .fetch_max(self.inner.reserved(), Ordering::Relaxed);
    }
}

impl std::fmt::Display for PeakPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peak({})", self.inner)
    }
}

impl MemoryPool for PeakPool {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
        self.note();
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> datafusion::common::Result<()> {
        self.inner.try_grow(reservation, additional)?;
        self.note();
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_its_peak() {
        let pool: Arc<dyn MemoryPool> = Arc::new(PeakPool::new(TrackConsumersPool::new(
            FairSpillPool::new(1000),
            NonZeroUsize::MIN,
        )));
        let a = MemoryConsumer::new("a").register(&pool);
        a.try_grow(600).unwrap();
        a.shrink(500);
        a.grow(50);
        assert!(a.try_grow(2000).is_err());
        let peak = pool.downcast_ref::<PeakPool>().map(PeakPool::peak_bytes);
        assert_eq!((peak, pool.reserved()), (Some(600), 150));
    }
}
