//! Writing the output: Parquet, Arrow IPC (file or stream), CSV or NDJSON, to a file
//! or stdout — or nowhere, only counted.
//!
//! A file is never written in place. The output goes to a hidden temporary file in
//! the destination's directory (`.NAME.spilljoin-XXXXXX.tmp`), which is synced and
//! renamed over NAME only when the join has finished and the writer closed the
//! format. A join that fails, or is interrupted, drops the temporary file, and NAME
//! is untouched: nothing that looks like a finished output is ever partial. The
//! join holds a lock on the temporary file while it lives, so that one left by a
//! join killed outright is told apart and removed by the next join writing NAME
//! ([`OutputSpec::remove_stale_temporaries`]; the protocol is [`super::stale`]'s).
//!
//! The temporary file is created before the join starts, so an unwritable
//! destination is reported before any work is done.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
use arrow_ipc::CompressionType;
use arrow_json::writer::LineDelimited;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use tempfile::TempPath;

use super::failure::Kind;
use super::format::{CsvOptions, Format, EXTENSIONS};
use super::stale;

/// Where the output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Nowhere: batches are counted and dropped.
    Count,
    /// Standard output.
    Stdout,
    /// A file, replaced atomically.
    File(PathBuf),
}

/// The compression of an output, per format.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Codec {
    None,
    Parquet(Compression),
    Ipc(CompressionType),
}

/// What to write and where, validated before the join starts.
#[derive(Debug, Clone)]
pub struct OutputSpec {
    destination: Destination,
    format: Format,
    codec: Codec,
    csv: CsvOptions,
}

impl OutputSpec {
    /// The output of `--output PATH|-`, `--output-format`, `--compression` and the
    /// CSV options.
    ///
    /// # Errors
    /// Definition failures: a format that cannot be told from the extension, a
    /// compression the format does not have.
    pub fn new(
        output: Option<&str>,
        format: Option<Format>,
        compression: Option<&str>,
        csv: CsvOptions,
    ) -> Result<Self> {
        let destination = match output {
            None => Destination::Count,
            Some("-") => Destination::Stdout,
            Some(path) => Destination::File(PathBuf::from(path)),
        };
        let format = match (&destination, format) {
            (_, Some(f)) => f,
            (Destination::File(path), None) => Format::from_path(path).ok_or_else(|| {
                Kind::Definition.error(format!(
                    "cannot tell the output format of {} from its extension: use {EXTENSIONS}, or --output-format",
                    path.display()
                ))
            })?,
            (Destination::Stdout | Destination::Count, None) => Format::Csv,
        };
        let codec = parse_codec(format, compression)?;
        Ok(Self {
            destination,
            format,
            codec,
            csv,
        })
    }

    /// Whether the output goes to stdout.
    pub fn is_stdout(&self) -> bool {
        self.destination == Destination::Stdout
    }

    /// A line for `--explain`.
    pub fn describe(&self) -> String {
        let codec = match self.codec {
            Codec::None => String::new(),
            Codec::Parquet(Compression::ZSTD(level)) => {
                format!(", zstd level {}", level.compression_level())
            }
            Codec::Parquet(c) => format!(", {c}").to_lowercase(),
            Codec::Ipc(c) => format!(", {}", c.variant_name().unwrap_or("?")).to_lowercase(),
        };
        match &self.destination {
            Destination::Count => "counted, not written (no --output)".into(),
            Destination::Stdout => format!("stdout ({}{codec})", self.format),
            Destination::File(p) => format!(
                "{} ({}{codec}; written to a temporary file and renamed when complete)",
                p.display(),
                self.format
            ),
        }
    }

    /// Fails if the output file is one of `inputs`: replacing it would destroy an
    /// input of the join.
    ///
    /// # Errors
    /// A definition failure naming the file.
    pub fn refuse_to_overwrite(&self, inputs: &[&Path]) -> Result<()> {
        let Destination::File(output) = &self.destination else {
            return Ok(());
        };
        let Ok(output_path) = std::fs::canonicalize(output) else {
            return Ok(()); // It does not exist yet.
        };
        if inputs
            .iter()
            .any(|input| std::fs::canonicalize(input).is_ok_and(|p| p == output_path))
        {
            return Err(Kind::Definition.error(format!(
                "--output {} is an input of the join: writing it would destroy the input",
                output.display()
            )));
        }
        Ok(())
    }

    /// Removes the orphaned temporary files of this output (a file destination's
    /// `.NAME.spilljoin-XXXXXX.tmp` beside it, left by joins killed outright):
    /// those nobody holds the lock of. Nothing to do for other destinations, nor
    /// when the directory cannot be read: [`OutputSpec::create`] says next what is
    /// wrong with it, if anything is.
    pub fn remove_stale_temporaries(&self) -> stale::Cleanup {
        let Destination::File(path) = &self.destination else {
            return stale::Cleanup::default();
        };
        let Ok((dir, name)) = dir_and_name(path) else {
            return stale::Cleanup::default();
        };
        stale::remove_orphans(dir, Some(&name)).unwrap_or_default()
    }

    /// Starts writing batches of `schema`: creates the temporary file (for a file
    /// destination) and writes the format's header.
    ///
    /// # Errors
    /// Output failures: the directory does not exist or is not writable.
    pub fn create(&self, schema: &SchemaRef) -> Result<OutputWriter> {
        let (sink, target): (Box<dyn Write + Send>, Target) = match &self.destination {
            Destination::Count => {
                return Ok(OutputWriter {
                    writer: FormatWriter::Count,
                    target: Target::Count,
                })
            }
            Destination::Stdout => (
                Box::new(BufWriter::with_capacity(BUFFER_BYTES, std::io::stdout())),
                Target::Stdout,
            ),
            Destination::File(path) => {
                let (file, temp) = temporary_file(path)?;
                let sync = file.try_clone().with_context(|| create_failure(path))?;
                (
                    Box::new(BufWriter::with_capacity(BUFFER_BYTES, file)),
                    Target::File {
                        temp,
                        sync,
                        path: path.clone(),
                    },
                )
            }
        };
        let writer = self
            .format_writer(sink, schema)
            .context(Kind::Output.context("cannot write the output"))?;
        Ok(OutputWriter { writer, target })
    }

    fn format_writer(
        &self,
        sink: Box<dyn Write + Send>,
        schema: &SchemaRef,
    ) -> Result<FormatWriter> {
        let ipc_options = || -> Result<IpcWriteOptions> {
            let compression = match self.codec {
                Codec::Ipc(c) => Some(c),
                _ => None,
            };
            Ok(IpcWriteOptions::default().try_with_compression(compression)?)
        };
        Ok(match self.format {
            Format::Parquet => {
                let compression = match self.codec {
                    Codec::Parquet(c) => c,
                    _ => Compression::UNCOMPRESSED,
                };
                // Row groups of 64Ki rows: the writer buffers a whole row group,
                // which is memory outside the join's limit (1Mi rows by default).
                let props = WriterProperties::builder()
                    .set_compression(compression)
                    .set_max_row_group_row_count(Some(PARQUET_ROW_GROUP_ROWS))
                    .build();
                FormatWriter::Parquet(ArrowWriter::try_new(sink, Arc::clone(schema), Some(props))?)
            }
            Format::Arrow => FormatWriter::Arrow(FileWriter::try_new_with_options(
                sink,
                schema,
                ipc_options()?,
            )?),
            Format::Arrows => FormatWriter::Arrows(StreamWriter::try_new_with_options(
                sink,
                schema,
                ipc_options()?,
            )?),
            Format::Csv => {
                let mut w = arrow_csv::WriterBuilder::new()
                    .with_header(self.csv.header)
                    .with_delimiter(match &self.destination {
                        // `.tsv` means tabs, as for inputs.
                        Destination::File(path) => self.csv.delimiter_for(path),
                        _ => self.csv.delimiter.unwrap_or(b','),
                    })
                    .build(sink);
                // The header goes out with the first batch: write an empty one, so
                // that an output without rows still names its columns.
                w.write(&RecordBatch::new_empty(Arc::clone(schema)))?;
                FormatWriter::Csv(w)
            }
            Format::Ndjson => FormatWriter::Ndjson(
                arrow_json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, LineDelimited>(sink),
            ),
        })
    }
}

/// Bytes buffered before a write to the file or stdout.
const BUFFER_BYTES: usize = 256 << 10;

/// Parses `--compression` for `format`.
fn parse_codec(format: Format, compression: Option<&str>) -> Result<Codec> {
    let bad = |what: &str, allowed: &str| {
        Kind::Definition.error(format!(
            "--compression {what} is not a {format} compression: use {allowed}"
        ))
    };
    let lower = compression.map(|c| c.trim().to_ascii_lowercase());
    Ok(match (format, lower.as_deref()) {
        (Format::Parquet, None) => Codec::Parquet(Compression::ZSTD(ZstdLevel::default())),
        (Format::Parquet, Some(c)) => Codec::Parquet(match c {
            "none" | "uncompressed" => Compression::UNCOMPRESSED,
            "snappy" => Compression::SNAPPY,
            "lz4" => Compression::LZ4_RAW,
            "zstd" => Compression::ZSTD(ZstdLevel::default()),
            _ => {
                let level = c
                    .strip_prefix("zstd:")
                    .and_then(|l| l.parse::<i32>().ok())
                    .and_then(|l| ZstdLevel::try_new(l).ok());
                match level {
                    Some(level) => Compression::ZSTD(level),
                    None => return Err(bad(c, "none, snappy, lz4, zstd or zstd:LEVEL (1-22)")),
                }
            }
        }),
        (Format::Arrow | Format::Arrows, None | Some("none")) => Codec::None,
        (Format::Arrow | Format::Arrows, Some("lz4")) => Codec::Ipc(CompressionType::LZ4_FRAME),
        (Format::Arrow | Format::Arrows, Some("zstd")) => Codec::Ipc(CompressionType::ZSTD),
        (Format::Arrow | Format::Arrows, Some(c)) => return Err(bad(c, "none, lz4 or zstd")),
        (Format::Csv | Format::Ndjson, None | Some("none")) => Codec::None,
        (Format::Csv | Format::Ndjson, Some(c)) => return Err(bad(c, "none")),
    })
}

/// Rows per row group of a Parquet output.
const PARQUET_ROW_GROUP_ROWS: usize = 64 * 1024;

fn create_failure(path: &Path) -> super::failure::Failure {
    Kind::Output.context(format!("cannot create the output {}", path.display()))
}

/// The directory of the output file `path` and its file name.
///
/// # Errors
/// A definition failure if `path` has no file name.
fn dir_and_name(path: &Path) -> Result<(&Path, String)> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            Kind::Definition.error(format!("--output {} is not a file name", path.display()))
        })?;
    Ok((dir, name))
}

/// A hidden temporary file beside `path`, locked while it is open, removed when
/// its [`TempPath`] drops.
fn temporary_file(path: &Path) -> Result<(File, TempPath)> {
    let (dir, name) = dir_and_name(path)?;
    stale::create_temporary(dir, &name).with_context(|| create_failure(path))
}

/// The format's writer over the destination.
enum FormatWriter {
    Count,
    Parquet(ArrowWriter<Box<dyn Write + Send>>),
    Arrow(FileWriter<Box<dyn Write + Send>>),
    Arrows(StreamWriter<Box<dyn Write + Send>>),
    Csv(arrow_csv::Writer<Box<dyn Write + Send>>),
    Ndjson(arrow_json::Writer<Box<dyn Write + Send>, LineDelimited>),
}

/// Where the bytes go, and what finishing means there.
enum Target {
    Count,
    Stdout,
    /// A temporary file, renamed to `path` by [`OutputWriter::finish`]; dropping the
    /// `TempPath` deletes it. `sync` shares the writer's open file, and with it the
    /// file's lock: the lock goes with the last of the two, after the rename or the
    /// deletion (fields drop in order).
    File {
        temp: TempPath,
        sync: File,
        path: PathBuf,
    },
}

/// An output being written.
pub struct OutputWriter {
    writer: FormatWriter,
    target: Target,
}

impl OutputWriter {
    /// The temporary file being written, if the output is a file.
    pub fn temporary_path(&self) -> Option<&Path> {
        match &self.target {
            Target::File { temp, .. } => Some(temp),
            _ => None,
        }
    }

    /// Writes one batch.
    ///
    /// # Errors
    /// An output failure (a full disk, a closed stdout).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let result = match &mut self.writer {
            FormatWriter::Count => Ok(()),
            FormatWriter::Parquet(w) => w.write(batch).map_err(anyhow::Error::from),
            FormatWriter::Arrow(w) => w.write(batch).map_err(anyhow::Error::from),
            FormatWriter::Arrows(w) => w.write(batch).map_err(anyhow::Error::from),
            FormatWriter::Csv(w) => w.write(batch).map_err(anyhow::Error::from),
            FormatWriter::Ndjson(w) => w.write(batch).map_err(anyhow::Error::from),
        };
        result.context(self.failure())
    }

    /// Finishes the format (footers), flushes, and for a file syncs it and renames
    /// it to its name.
    ///
    /// # Errors
    /// An output failure; the temporary file is then removed.
    pub fn finish(self) -> Result<()> {
        let failure = self.failure();
        let mut sink: Box<dyn Write + Send> = match self.writer {
            FormatWriter::Count => return Ok(()),
            FormatWriter::Parquet(w) => w.into_inner().context(failure.clone())?,
            FormatWriter::Arrow(mut w) => {
                w.finish().context(failure.clone())?;
                w.into_inner().context(failure.clone())?
            }
            FormatWriter::Arrows(mut w) => {
                w.finish().context(failure.clone())?;
                w.into_inner().context(failure.clone())?
            }
            FormatWriter::Csv(w) => w.into_inner(),
            FormatWriter::Ndjson(mut w) => {
                w.finish().context(failure.clone())?;
                w.into_inner()
            }
        };
        sink.flush().context(failure.clone())?;
        drop(sink);
        if let Target::File { temp, sync, path } = self.target {
            sync.sync_all().context(failure.clone())?;
            #[cfg(unix)]
            {
                // Temporary files are private (0600); an output is an ordinary file.
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o644));
            }
            temp.persist(&path).map_err(|e| e.error).with_context(|| {
                Kind::Output.context(format!("cannot rename the output to {}", path.display()))
            })?;
        }
        Ok(())
    }

    fn failure(&self) -> super::failure::Failure {
        match &self.target {
            Target::File { path, .. } => {
                Kind::Output.context(format!("cannot write the output {}", path.display()))
            }
            Target::Stdout => Kind::Output.context("cannot write the output to stdout"),
            Target::Count => Kind::Output.context("cannot write the output"),
        }
    }
}
