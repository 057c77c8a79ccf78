//! Reading inputs and writing outputs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

/// A Parquet input: its full Arrow schema, read lazily.
pub struct ParquetInput {
    path: PathBuf,
    schema: SchemaRef,
}

impl ParquetInput {
    /// Opens `path` and reads its schema from the footer.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .with_context(|| format!("{} is not a readable Parquet file", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            schema: Arc::clone(builder.schema()),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The uncompressed size of `columns` (indices into the schema) from the Parquet
    /// footer: an estimate of their size in memory, read without decoding anything.
    pub fn uncompressed_bytes(&self, columns: &[usize]) -> Result<u64> {
        let file = File::open(&self.path)
            .with_context(|| format!("cannot open {}", self.path.display()))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
        let descr = builder.parquet_schema();
        let mut total = 0u64;
        for group in builder.metadata().row_groups() {
            for (leaf, chunk) in group.columns().iter().enumerate() {
                if columns.contains(&descr.get_column_root_idx(leaf)) {
                    total += chunk.uncompressed_size().max(0) as u64;
                }
            }
        }
        Ok(total)
    }

    /// Up to `parts` streams of batches of only `columns` (indices into the schema,
    /// in order), each over a contiguous run of row groups with about the same number
    /// of rows, so that several threads can decode at once. Parquet decodes nothing
    /// but those columns.
    pub fn read(
        &self,
        columns: &[usize],
        batch_size: usize,
        parts: usize,
    ) -> Result<Vec<ParquetRecordBatchReader>> {
        let open = || -> Result<ParquetRecordBatchReaderBuilder<File>> {
            let file = File::open(&self.path)
                .with_context(|| format!("cannot open {}", self.path.display()))?;
            Ok(ParquetRecordBatchReaderBuilder::try_new(file)?)
        };
        let builder = open()?;
        let row_groups = builder.metadata().row_groups();
        let total: i64 = row_groups.iter().map(|g| g.num_rows()).sum();
        let target = (total / parts.max(1) as i64).max(1);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
        let mut rows_in_last = 0;
        for (i, g) in row_groups.iter().enumerate() {
            if rows_in_last >= target && groups.len() < parts {
                groups.push(Vec::new());
                rows_in_last = 0;
            }
            if let Some(last) = groups.last_mut() {
                last.push(i);
            }
            rows_in_last += g.num_rows();
        }
        groups
            .into_iter()
            .map(|row_groups| {
                let builder = open()?;
                let mask = ProjectionMask::roots(builder.parquet_schema(), columns.iter().copied());
                Ok(builder
                    .with_projection(mask)
                    .with_row_groups(row_groups)
                    .with_batch_size(batch_size)
                    .build()?)
            })
            .collect()
    }
}

/// Where output goes.
pub enum OutputWriter {
    /// Nowhere: batches are counted and dropped.
    Count,
    /// A Parquet file (zstd).
    Parquet(ArrowWriter<File>),
    /// An Arrow IPC file.
    Arrow(arrow_ipc::writer::FileWriter<File>),
    /// A CSV file with a header.
    Csv(arrow_csv::Writer<File>),
}

impl OutputWriter {
    /// A writer for `path` by its extension, or [`OutputWriter::Count`].
    pub fn create(path: Option<&Path>, schema: &SchemaRef) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self::Count);
        };
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let open =
            || File::create(path).with_context(|| format!("cannot create {}", path.display()));
        Ok(match ext.as_str() {
            "parquet" => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .build();
                Self::Parquet(ArrowWriter::try_new(
                    open()?,
                    Arc::clone(schema),
                    Some(props),
                )?)
            }
            "arrow" | "ipc" | "feather" => {
                Self::Arrow(arrow_ipc::writer::FileWriter::try_new(open()?, schema)?)
            }
            "csv" => {
                let mut w = arrow_csv::WriterBuilder::new()
                    .with_header(true)
                    .build(open()?);
                // The header goes out with the first batch: write an empty one, so
                // that an output without rows still names its columns.
                w.write(&RecordBatch::new_empty(Arc::clone(schema)))?;
                Self::Csv(w)
            }
            other => bail!(
                "cannot tell the output format of {} from {other:?}: use .parquet, .arrow or .csv",
                path.display()
            ),
        })
    }

    /// Writes one batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), ArrowError> {
        match self {
            Self::Count => Ok(()),
            Self::Parquet(w) => w
                .write(batch)
                .map_err(|e| ArrowError::ExternalError(Box::new(e))),
            Self::Arrow(w) => w.write(batch),
            Self::Csv(w) => w.write(batch),
        }
    }

    /// Finishes the file.
    pub fn finish(self) -> Result<()> {
        match self {
            Self::Count | Self::Csv(_) => {}
            Self::Parquet(w) => {
                w.close()?;
            }
            Self::Arrow(mut w) => w.finish()?,
        }
        Ok(())
    }
}
