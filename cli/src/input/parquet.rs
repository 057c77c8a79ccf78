//! Parquet inputs: one or more files read row group by row group, only the columns
//! the join needs decoded.
//!
//! Each file's footer is read once, when the input is opened, and kept
//! ([`ArrowReaderMetadata`]); every reader is built from it by
//! [`ParquetSource::reader`], the one place where Parquet readers are constructed —
//! so that a row-group selection or a row filter (for example from the build side's
//! keys) is added there and applies everywhere.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_schema::{ArrowError, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{ColumnChunkMetaData, PageIndexPolicy};
use parquet::file::page_index::offset_index::OffsetIndexMetaData;

use super::{BatchStream, Opener};
use crate::failure::Kind;
use crate::pushdown::{ProbePushdown, PushdownMode, ScanPlan};

/// The files of a Parquet input and their footers.
pub struct ParquetSource {
    files: Vec<ParquetFile>,
}

struct ParquetFile {
    path: PathBuf,
    metadata: ArrowReaderMetadata,
}

/// What a reader holds of one column chunk's pages at most, uncompressed: its
/// dictionary page and two of its largest data page (see
/// [`ParquetSource::page_bytes`]); without a page index, a data page is taken to be
/// the chunk or [`PAGE_BYTES_UNINDEXED`], whichever is smaller.
fn chunk_page_bytes(chunk: &ColumnChunkMetaData, index: Option<&OffsetIndexMetaData>) -> u64 {
    let compressed = u64::try_from(chunk.compressed_size()).unwrap_or(0).max(1);
    let uncompressed = u64::try_from(chunk.uncompressed_size()).unwrap_or(0);
    // Compressed bytes of the chunk, as uncompressed ones (its average ratio).
    let scale = |bytes: u64| {
        u64::try_from(u128::from(bytes) * u128::from(uncompressed) / u128::from(compressed))
            .unwrap_or(u64::MAX)
    };
    let dictionary = chunk.dictionary_page_offset().map_or(0, |start| {
        scale(u64::try_from(chunk.data_page_offset().saturating_sub(start)).unwrap_or(0))
    });
    let page = match index {
        Some(index) => scale(
            index
                .page_locations()
                .iter()
                .map(|p| u64::try_from(p.compressed_page_size).unwrap_or(0))
                .max()
                .unwrap_or(0),
        ),
        None => uncompressed.min(PAGE_BYTES_UNINDEXED),
    };
    dictionary.saturating_add(page.saturating_mul(2))
}

/// A data page's size where a file has no page index: the 1 MiB most writers cut
/// pages at (pyarrow and arrow-rs by default).
const PAGE_BYTES_UNINDEXED: u64 = 1 << 20;

/// A run of row groups of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    file: usize,
    row_groups: Vec<usize>,
}

impl ParquetSource {
    /// Reads the footer of every file and checks that their schemas agree.
    ///
    /// # Errors
    /// Input failures: a file that cannot be opened, is not Parquet, or whose columns
    /// differ from the first file's.
    pub fn open(paths: &[PathBuf]) -> Result<Self> {
        let mut files: Vec<ParquetFile> = Vec::with_capacity(paths.len());
        for path in paths {
            let file = File::open(path)
                .with_context(|| Kind::Input.context(format!("cannot open {}", path.display())))?;
            // The page index lets a probe scan skip pages (see `cli::pushdown`).
            let metadata = ArrowReaderMetadata::load(
                &file,
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
            )
            .with_context(|| {
                Kind::Input.context(format!("{} is not a readable Parquet file", path.display()))
            })?;
            if let Some(first) = files.first() {
                super::check_same_columns(
                    &first.path,
                    first.metadata.schema(),
                    path,
                    metadata.schema(),
                )?;
            }
            files.push(ParquetFile {
                path: path.clone(),
                metadata,
            });
        }
        Ok(Self { files })
    }

    /// The first file's Arrow schema.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(self.files[0].metadata.schema())
    }

    /// Rows in every file, from the footers.
    pub fn rows(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| f.metadata.metadata().row_groups())
            .map(|g| g.num_rows().max(0) as u64)
            .sum()
    }

    /// Row groups in every file.
    pub fn row_groups(&self) -> usize {
        self.files
            .iter()
            .map(|f| f.metadata.metadata().num_row_groups())
            .sum()
    }

    /// Whether [`bytes`](Self::bytes) is more than a lower bound for `columns`: not
    /// when a variable-width column has dictionary-encoded chunks, whose encoded
    /// size says little of the strings' own (a thousand distinct values repeated over
    /// a row group take a few KiB encoded and tens of MiB as Arrow).
    pub fn bytes_known(&self, columns: &[usize]) -> bool {
        self.files.iter().all(|file| {
            let descr = file.metadata.parquet_schema();
            let schema = file.metadata.schema();
            file.metadata.metadata().row_groups().iter().all(|group| {
                group.columns().iter().enumerate().all(|(leaf, chunk)| {
                    let root = descr.get_column_root_idx(leaf);
                    let fixed = schema
                        .fields()
                        .get(root)
                        .and_then(|f| f.data_type().primitive_width())
                        .is_some();
                    fixed || !columns.contains(&root) || chunk.dictionary_page_offset().is_none()
                })
            })
        })
    }

    /// The most bytes of decoded pages one reader of `columns` holds, from the
    /// footers: per column chunk its dictionary page and twice its largest data
    /// page (the page being decoded and the one before it, which a batch that
    /// began there still points into: a view column's values stay in their page),
    /// uncompressed, summed over a row group's columns; the largest row group's.
    pub fn page_bytes(&self, columns: &[usize]) -> u64 {
        self.files
            .iter()
            .flat_map(|file| {
                let descr = file.metadata.parquet_schema();
                let metadata = file.metadata.metadata();
                let offsets = metadata.offset_index();
                metadata
                    .row_groups()
                    .iter()
                    .enumerate()
                    .map(move |(g, group)| {
                        group
                            .columns()
                            .iter()
                            .enumerate()
                            .filter(|(leaf, _)| columns.contains(&descr.get_column_root_idx(*leaf)))
                            .map(|(leaf, chunk)| {
                                let index = offsets.and_then(|o| o.get(g)?.get(leaf));
                                chunk_page_bytes(chunk, index)
                            })
                            .sum::<u64>()
                    })
            })
            .max()
            .unwrap_or(0)
    }

    /// An estimate of the size of `columns` (indices into the schema) as Arrow arrays,
    /// from the footers: a fixed-width column takes rows × its width (and a validity
    /// bit); any other its uncompressed size (after Parquet's encodings, which for
    /// dictionary-encoded strings is less than Arrow's) plus 4-byte offsets, or
    /// 16-byte views for a view column (Utf8View, BinaryView: what TPC-H files from
    /// `tpchgen-cli` hold; counted as offsets, SF10 orders was taken at 1.71 GB where
    /// its rows take 2.9 GB in the join, and its fan-out at 5% two levels deep).
    pub fn bytes(&self, columns: &[usize]) -> u64 {
        let mut total = 0u64;
        for file in &self.files {
            let descr = file.metadata.parquet_schema();
            let schema = file.metadata.schema();
            for group in file.metadata.metadata().row_groups() {
                let rows = group.num_rows().max(0) as u64;
                for &c in columns {
                    let width = schema
                        .fields()
                        .get(c)
                        .and_then(|f| f.data_type().primitive_width());
                    total += match width {
                        Some(w) => rows * w as u64 + rows.div_ceil(8),
                        None => {
                            let encoded: u64 = group
                                .columns()
                                .iter()
                                .enumerate()
                                .filter(|(leaf, _)| descr.get_column_root_idx(*leaf) == c)
                                .map(|(_, chunk)| chunk.uncompressed_size().max(0) as u64)
                                .sum();
                            encoded + offset_width(schema.fields().get(c)) * rows
                        }
                    };
                }
            }
        }
        total
    }

    /// Up to `parts` chains of openers, each over a contiguous run of row groups
    /// (across files) with about the same number of rows.
    pub(super) fn openers(
        &self,
        columns: &[usize],
        batch_size: usize,
        parts: usize,
        pushdown: Option<&Arc<ProbePushdown>>,
    ) -> Vec<Vec<Opener>> {
        // With a membership filter each row group gets its own reader, so the scan
        // can stop filtering once it learns that filtering does not pay.
        let per_group = pushdown.is_some_and(|p| p.mode == PushdownMode::All);
        self.split(parts)
            .into_iter()
            .map(|runs| {
                runs.into_iter()
                    .flat_map(|run| -> Vec<Run> {
                        if per_group {
                            run.row_groups
                                .iter()
                                .map(|&g| Run {
                                    file: run.file,
                                    row_groups: vec![g],
                                })
                                .collect()
                        } else {
                            vec![run]
                        }
                    })
                    .map(|run| {
                        let file = &self.files[run.file];
                        let (path, metadata) = (file.path.clone(), file.metadata.clone());
                        let columns = columns.to_vec();
                        let pushdown = pushdown.cloned();
                        Opener::new(&file.path, move || {
                            let reader = Self::reader(
                                &path,
                                metadata,
                                run.row_groups,
                                &columns,
                                batch_size,
                                pushdown.as_deref(),
                            )?;
                            Ok(Box::new(reader) as BatchStream)
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// The reader of `row_groups` of one file, decoding only `columns`, and skipping
    /// what the build side's facts rule out (`pushdown`; the reader is opened after the
    /// build).
    ///
    /// This is the one place Parquet readers are built.
    fn reader(
        path: &Path,
        metadata: ArrowReaderMetadata,
        row_groups: Vec<usize>,
        columns: &[usize],
        batch_size: usize,
        pushdown: Option<&ProbePushdown>,
    ) -> Result<ParquetRecordBatchReader, ArrowError> {
        let scan = match pushdown {
            Some(pushdown) => pushdown.plan(&metadata, row_groups, columns)?,
            None => ScanPlan {
                row_groups,
                selection: None,
                row_filter: None,
            },
        };
        let file = File::open(path)?;
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata);
        let mask = ProjectionMask::roots(builder.parquet_schema(), columns.iter().copied());
        let mut builder = builder
            .with_projection(mask)
            .with_row_groups(scan.row_groups)
            .with_batch_size(batch_size);
        if let Some(selection) = scan.selection {
            builder = builder.with_row_selection(selection);
        }
        if let Some(filter) = scan.row_filter {
            builder = builder.with_row_filter(filter);
        }
        Ok(builder.build()?)
    }

    /// Splits every row group of every file into at most `parts` groups of runs,
    /// contiguous and of about the same rows.
    fn split(&self, parts: usize) -> Vec<Vec<Run>> {
        let groups: Vec<(usize, usize, i64)> = self
            .files
            .iter()
            .enumerate()
            .flat_map(|(f, file)| {
                file.metadata
                    .metadata()
                    .row_groups()
                    .iter()
                    .enumerate()
                    .map(move |(g, meta)| (f, g, meta.num_rows()))
            })
            .collect();
        let total: i64 = groups.iter().map(|g| g.2).sum();
        let target = (total / parts.max(1) as i64).max(1);
        let mut result: Vec<Vec<Run>> = vec![Vec::new()];
        let mut rows_in_last = 0;
        for (file, group, rows) in groups {
            if rows_in_last >= target && result.len() < parts {
                result.push(Vec::new());
                rows_in_last = 0;
            }
            let Some(part) = result.last_mut() else { break };
            match part.last_mut() {
                Some(run) if run.file == file => run.row_groups.push(group),
                _ => part.push(Run {
                    file,
                    row_groups: vec![group],
                }),
            }
            rows_in_last += rows;
        }
        result
    }
}

/// What a row of a variable-width column takes in Arrow besides its bytes: a
/// 16-byte view, an 8-byte offset (large types) or a 4-byte one.
fn offset_width(field: Option<&Arc<arrow_schema::Field>>) -> u64 {
    use arrow_schema::DataType;
    match field.map(|f| f.data_type()) {
        Some(DataType::Utf8View | DataType::BinaryView) => 16,
        Some(DataType::LargeUtf8 | DataType::LargeBinary) => 8,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, RecordBatch, StringViewArray};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::ParquetSource;

    #[test]
    fn page_bytes_are_a_row_groups_dictionary_and_two_largest_pages_a_column(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.parquet");
        // Two columns of distinct 100-byte strings (no dictionary pays), pages cut
        // at 64 KiB, uncompressed: every data page about 64 KiB.
        let column = |c: char| -> ArrayRef {
            Arc::new(StringViewArray::from_iter_values(
                (0..20_000).map(|i| format!("{c}{i:099}")),
            ))
        };
        let batch = RecordBatch::try_from_iter([("a", column('a')), ("b", column('b'))])?;
        let props = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_data_page_size_limit(64 << 10)
            .set_write_batch_size(256)
            .build();
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), Some(props))?;
        writer.write(&batch)?;
        writer.close()?;
        let source = ParquetSource::open(&[path])?;
        let one = source.page_bytes(&[0]);
        assert!((120 << 10..=180 << 10).contains(&one), "{one}");
        let both = source.page_bytes(&[0, 1]);
        assert!(
            both >= 2 * one - 8192 && both <= 2 * one + 8192,
            "{both} {one}"
        );
        assert_eq!(source.page_bytes(&[]), 0);
        Ok(())
    }

    /// A view column is estimated at 16 bytes a row besides its values, an offsets
    /// column at 4: the same strings, written from either, differ by 12 bytes a row.
    #[test]
    fn view_columns_are_sized_with_their_views() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let values = || (0..5_000).map(|i| format!("{i:040}"));
        let mut estimates = Vec::new();
        for (name, column) in [
            (
                "views",
                Arc::new(StringViewArray::from_iter_values(values())) as ArrayRef,
            ),
            (
                "offsets",
                Arc::new(arrow_array::StringArray::from_iter_values(values())),
            ),
        ] {
            let path = dir.path().join(format!("{name}.parquet"));
            let batch = RecordBatch::try_from_iter([("s", column)])?;
            let mut writer =
                ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), None)?;
            writer.write(&batch)?;
            writer.close()?;
            estimates.push(ParquetSource::open(&[path])?.bytes(&[0]));
        }
        assert_eq!(estimates[0], estimates[1] + 12 * 5_000, "{estimates:?}");
        Ok(())
    }
}
