//! Reading the join's inputs: which files, in which format, with what schema, and
//! how they are split into streams that several workers decode at once.
//!
//! ```text
//!  --left SPEC ─► paths (file │ directory, walked │ glob) ─► format (extension or flag)
//!                                                                │
//!      ┌──────────────┬──────────────┬─────────────┬────────────┘
//!   parquet         arrow          arrows       csv / ndjson
//!   footer: schema, footer: schema, schema       schema inferred from the first
//!   rows, sizes     batches         message      rows, then overridden
//!      │              │              │             │
//!      └──────────────┴─── streams(columns, batch size, parts) ─► counted batches
//! ```
//!
//! Nothing is read whole to learn its size: Parquet has its row counts and column
//! sizes in the footer; other formats give their file sizes ([`Input::statistics`]).
//! Only the columns the join needs are decoded (Parquet and Arrow IPC skip the rest
//! on disk; CSV and NDJSON parse only those fields into arrays).

mod ipc;
mod locate;
mod parquet;
mod text;

pub use locate::{locate, InputName};

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use spilljoin::{InputStatistics, Side};

use super::failure::Kind;
use super::format::{CsvOptions, Format};
use super::pushdown::ProbePushdown;

/// A stream of batches of one input.
pub type BatchStream = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send>;

/// How to read one input.
#[derive(Debug, Clone)]
pub struct InputOptions {
    /// The format, if the command line named it.
    pub format: Option<Format>,
    /// `NAME:TYPE,...` types replacing inferred ones (CSV and NDJSON only).
    pub schema_override: Option<String>,
    /// CSV settings.
    pub csv: CsvOptions,
    /// Rows read to infer a CSV or NDJSON schema.
    pub infer_rows: usize,
}

/// An opened input: its files, format and schema; nothing decoded yet.
pub struct Input {
    side: Side,
    spec: String,
    format: Format,
    files: Vec<PathBuf>,
    schema: SchemaRef,
    source: Source,
}

/// What each format keeps from opening its files.
enum Source {
    Parquet(parquet::ParquetSource),
    Arrow(ipc::ArrowFileSource),
    Arrows,
    Csv(CsvOptions),
    Ndjson,
}

/// Rows and decoded bytes an input has produced so far, and the bytes read from its
/// files where that is the measure of progress (for progress and metrics).
#[derive(Debug, Default)]
pub struct ReadCounters {
    rows: AtomicU64,
    bytes: AtomicU64,
    file_bytes: AtomicU64,
}

impl ReadCounters {
    /// Rows read so far.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Bytes of the batches read so far, as Arrow arrays.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Bytes read from the files so far (CSV, NDJSON and Arrow inputs; Parquet
    /// counts rows instead).
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes.load(Ordering::Relaxed)
    }
}

/// A file that counts the bytes read from it into [`ReadCounters::file_bytes`].
pub(crate) struct CountingFile {
    file: std::fs::File,
    counters: Arc<ReadCounters>,
}

impl CountingFile {
    /// Opens `path`.
    pub fn open(path: &Path, counters: &Arc<ReadCounters>) -> std::io::Result<Self> {
        Ok(Self {
            file: std::fs::File::open(path)?,
            counters: Arc::clone(counters),
        })
    }
}

impl std::io::Read for CountingFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.counters
            .file_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl std::io::Seek for CountingFile {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.file.seek(pos)
    }
}

impl Input {
    /// Finds the files of `spec` (a file, a directory or a glob), determines their
    /// format and reads their schema: Parquet and Arrow from the files' metadata, CSV
    /// and NDJSON by inference over the first `options.infer_rows` rows of the first
    /// file, with `options.schema_override` applied.
    ///
    /// # Errors
    /// Input failures (no such file, no files match, not of the format, files with
    /// different schemas) and definition failures (an unknown format, a schema
    /// override for a typed format or naming a column that does not exist).
    pub fn open(side: Side, spec: &str, options: &InputOptions) -> Result<Self> {
        let (files, format) = locate(InputName::Side(side), spec, options.format)?;
        if options.schema_override.is_some() && !format.is_text() {
            return Err(Kind::Definition.error(format!(
                "--{side}-schema sets the column types of CSV and NDJSON inputs; {spec} is {format}, which has its own"
            )));
        }
        let (schema, source) = match format {
            Format::Parquet => {
                let source = parquet::ParquetSource::open(&files)?;
                (source.schema(), Source::Parquet(source))
            }
            Format::Arrow => {
                let source = ipc::ArrowFileSource::open(&files)?;
                (source.schema(), Source::Arrow(source))
            }
            Format::Arrows => (ipc::stream_schema(&files)?, Source::Arrows),
            Format::Csv => (
                text::infer_csv(&files[0], &options.csv, options.infer_rows)?,
                Source::Csv(options.csv),
            ),
            Format::Ndjson => (
                text::infer_ndjson(&files[0], options.infer_rows)?,
                Source::Ndjson,
            ),
        };
        let mut schema = match &options.schema_override {
            Some(spec) => apply_override(side, &schema, spec)?,
            None => schema,
        };
        // Files may differ in nullability, and text formats never promise it.
        if files.len() > 1 || format.is_text() {
            schema = nullable(&schema);
        }
        Ok(Self {
            side,
            spec: spec.to_string(),
            format,
            files,
            schema,
            source,
        })
    }

    /// The input as the command line gave it.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// Left or right.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The files, in the order they are read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The full schema (every column, before projection).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows, where the format's metadata has them (Parquet).
    pub fn rows(&self) -> Option<u64> {
        match &self.source {
            Source::Parquet(p) => Some(p.rows()),
            _ => None,
        }
    }

    /// What is known of the size of `columns` (indices into the schema) without
    /// reading the data: Parquet's uncompressed column sizes and row counts; the
    /// file sizes of Arrow files scaled by the columns' share of a row; the file
    /// sizes of CSV and NDJSON (an estimate of the decoded size).
    ///
    /// # Errors
    /// A file whose size cannot be read.
    pub fn statistics(&self, columns: &[usize]) -> Result<InputStatistics> {
        Ok(match &self.source {
            Source::Parquet(p) => InputStatistics::new(Some(p.bytes(columns)), Some(p.rows())),
            Source::Arrow(_) | Source::Arrows => {
                let bytes = self.file_bytes()? as f64 * projected_share(&self.schema, columns);
                InputStatistics::new(Some(bytes as u64), None)
            }
            // Text: the file's size, scaled by the share of the columns read (as
            // for Arrow files).
            Source::Csv(_) | Source::Ndjson => {
                let bytes = self.file_bytes()? as f64 * projected_share(&self.schema, columns);
                InputStatistics::new(Some(bytes as u64), None)
            }
        })
    }

    /// The most bytes of decoded pages one reader of `columns` holds (Parquet; 0
    /// for other formats, which decode a batch at a time).
    pub fn page_bytes(&self, columns: &[usize]) -> u64 {
        match &self.source {
            Source::Parquet(p) => p.page_bytes(columns),
            _ => 0,
        }
    }

    /// Whether [`statistics`](Self::statistics) gives the bytes of `columns` as
    /// Arrow arrays, rather than a lower bound of them (see
    /// `ParquetSource::bytes_known`; the other formats' are file sizes, scaled).
    pub fn bytes_known(&self, columns: &[usize]) -> bool {
        match &self.source {
            Source::Parquet(p) => p.bytes_known(columns),
            _ => true,
        }
    }

    /// The files' total size on disk.
    ///
    /// # Errors
    /// A file whose size cannot be read.
    pub fn file_bytes(&self) -> Result<u64> {
        self.files.iter().try_fold(0u64, |total, path| {
            let meta = std::fs::metadata(path)
                .with_context(|| Kind::Input.context(format!("cannot open {}", path.display())))?;
            Ok(total + meta.len())
        })
    }

    /// A line for `--explain`: format, files, and what the metadata says.
    pub fn describe(&self) -> String {
        let files = match self.files.len() {
            1 => String::new(),
            n => format!(", {}", plural(n, "file")),
        };
        let detail = match &self.source {
            Source::Parquet(p) => format!(
                ", {}, {} rows",
                plural(p.row_groups(), "row group"),
                p.rows()
            ),
            Source::Arrow(a) => format!(", {}", plural(a.batches(), "record batch")),
            Source::Csv(csv) => format!(
                ", delimiter {:?}, {}",
                char::from(csv.delimiter_for(&self.files[0])),
                if csv.header { "header" } else { "no header" }
            ),
            Source::Arrows | Source::Ndjson => String::new(),
        };
        format!("{} ({}{files}{detail})", self.spec, self.format)
    }

    /// Up to `parts` streams of batches of only `columns` (indices into the schema,
    /// ascending), which together yield every row once; each batch is counted in
    /// `counters`. Parquet splits row groups and Arrow files record batches into
    /// runs of about the same rows; CSV, NDJSON and Arrow streams give one stream
    /// per file. A Parquet probe input given `pushdown` skips what the build rules
    /// out (other formats ignore it).
    ///
    /// # Errors
    /// A file that cannot be opened again. Errors while decoding come through the
    /// streams, each naming its file.
    pub fn streams(
        &self,
        columns: &[usize],
        batch_size: usize,
        parts: usize,
        counters: &Arc<ReadCounters>,
        pushdown: Option<&Arc<ProbePushdown>>,
    ) -> Result<Vec<BatchStream>> {
        let chains: Vec<Vec<Opener>> = match &self.source {
            Source::Parquet(p) => p.openers(columns, batch_size, parts.max(1), pushdown),
            Source::Arrow(a) => a.openers(columns, parts.max(1), counters),
            Source::Arrows => per_file(&self.files, |path| {
                ipc::stream_opener(path, columns.to_vec(), counters)
            }),
            Source::Csv(csv) => per_file(&self.files, |path| {
                text::csv_opener(
                    path,
                    &self.schema,
                    csv,
                    columns.to_vec(),
                    batch_size,
                    counters,
                )
            }),
            Source::Ndjson => per_file(&self.files, |path| {
                text::ndjson_opener(path, &self.schema, columns, batch_size, counters)
            }),
        };
        Ok(chains
            .into_iter()
            .map(|openers| {
                Box::new(Counted {
                    inner: Chain::new(openers),
                    counters: Arc::clone(counters),
                }) as BatchStream
            })
            .collect())
    }
}

/// `n` and `thing`, in the plural unless `n` is 1.
fn plural(n: usize, thing: &str) -> String {
    match (n, thing.ends_with('h')) {
        (1, _) => format!("1 {thing}"),
        (_, true) => format!("{n} {thing}es"),
        _ => format!("{n} {thing}s"),
    }
}

/// Opens one file (or a run of one file's row groups or batches) as a stream.
pub(crate) struct Opener {
    path: PathBuf,
    open: Box<dyn FnOnce() -> Result<BatchStream, ArrowError> + Send>,
}

impl Opener {
    fn new(
        path: &Path,
        open: impl FnOnce() -> Result<BatchStream, ArrowError> + Send + 'static,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            open: Box::new(open),
        }
    }
}

fn per_file(files: &[PathBuf], opener: impl Fn(&Path) -> Opener) -> Vec<Vec<Opener>> {
    files.iter().map(|p| vec![opener(p)]).collect()
}

/// Reads its openers' streams one after the other, opening each when the previous
/// one ends; an error names the file it came from and ends the chain.
struct Chain {
    pending: VecDeque<Opener>,
    current: Option<(PathBuf, BatchStream)>,
}

impl Chain {
    fn new(openers: Vec<Opener>) -> Self {
        Self {
            pending: openers.into(),
            current: None,
        }
    }

    fn fail(&mut self, path: &Path, e: ArrowError) -> Option<Result<RecordBatch, ArrowError>> {
        self.pending.clear();
        self.current = None;
        Some(Err(ArrowError::ExternalError(Box::new(FileError {
            path: path.to_path_buf(),
            source: e,
        }))))
    }
}

impl Iterator for Chain {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((path, stream)) = &mut self.current {
                match stream.next() {
                    Some(Ok(batch)) => return Some(Ok(batch)),
                    Some(Err(e)) => {
                        let path = path.clone();
                        return self.fail(&path, e);
                    }
                    None => self.current = None,
                }
            }
            let opener = self.pending.pop_front()?;
            match (opener.open)() {
                Ok(stream) => self.current = Some((opener.path, stream)),
                Err(e) => return self.fail(&opener.path, e),
            }
        }
    }
}

/// An error while reading one file of an input.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
struct FileError {
    path: PathBuf,
    source: ArrowError,
}

/// Counts what passes through.
struct Counted<I> {
    inner: I,
    counters: Arc<ReadCounters>,
}

impl<I: Iterator<Item = Result<RecordBatch, ArrowError>>> Iterator for Counted<I> {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next()?;
        if let Ok(batch) = &item {
            let c = &self.counters;
            c.rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            c.bytes
                .fetch_add(batch.get_array_memory_size() as u64, Ordering::Relaxed);
        }
        Some(item)
    }
}

/// `schema` with the types `spec` names.
fn apply_override(side: Side, schema: &Schema, spec: &str) -> Result<SchemaRef> {
    let pairs = super::format::parse_schema_override(spec)
        .map_err(|e| Kind::Definition.error(format!("--{side}-schema: {e}")))?;
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    for (name, data_type) in pairs {
        let Some(field) = fields.iter_mut().find(|f| f.name() == &name) else {
            return Err(super::suggest::no_such_column(side, &name, schema)
                .context(format!("--{side}-schema")));
        };
        *field = field.clone().with_data_type(data_type);
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// Fails unless the two files of one input have the same column names and types.
fn check_same_columns(first: &Path, a: &Schema, path: &Path, b: &Schema) -> Result<()> {
    let describe = |s: &Schema| -> Vec<String> {
        s.fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect()
    };
    let (a, b) = (describe(a), describe(b));
    if a != b {
        return Err(Kind::Input.error(format!(
            "{} has columns ({}) but {} has ({}): the files of one input must have the same columns",
            path.display(),
            b.join(", "),
            first.display(),
            a.join(", ")
        )));
    }
    Ok(())
}

fn nullable(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The share of a row's bytes that `columns` hold, by the types' widths (variable
/// width types count 16 bytes).
fn projected_share(schema: &Schema, columns: &[usize]) -> f64 {
    let width = |t: &DataType| -> f64 {
        match t.primitive_width() {
            Some(w) => w as f64,
            None if *t == DataType::Boolean => 0.125,
            None => 16.0,
        }
    };
    let total: f64 = schema.fields().iter().map(|f| width(f.data_type())).sum();
    if total == 0.0 {
        return 1.0;
    }
    let part: f64 = columns
        .iter()
        .filter_map(|&i| schema.fields().get(i))
        .map(|f| width(f.data_type()))
        .sum();
    part / total
}
