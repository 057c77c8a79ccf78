//! Arrow IPC inputs: the file format (random access, so its record batches are
//! split among workers) and the stream format (read front to back, one stream per
//! file). Both decode only the projected columns.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_schema::SchemaRef;

use std::sync::Arc;

use super::{BatchStream, CountingFile, Opener, ReadCounters};
use crate::failure::Kind;

/// The files of an Arrow IPC file-format input.
pub struct ArrowFileSource {
    /// Each file and its number of record batches.
    files: Vec<(PathBuf, usize)>,
    schema: SchemaRef,
}

impl ArrowFileSource {
    /// Reads every file's footer.
    ///
    /// # Errors
    /// Input failures: a file that cannot be opened, is not an Arrow IPC file, or
    /// whose schema differs from the first file's.
    pub fn open(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut schema: Option<SchemaRef> = None;
        for path in paths {
            let reader = FileReader::try_new(BufReader::new(open(path)?), None)
                .with_context(|| not_of_format(path, "Arrow IPC file"))?;
            let this = reader.schema();
            if let Some(first) = &schema {
                super::check_same_columns(&paths[0], first, path, &this)?;
            }
            schema.get_or_insert(this);
            files.push((path.clone(), reader.num_batches()));
        }
        let schema = schema.ok_or_else(|| Kind::Input.error("no Arrow files"))?;
        Ok(Self { files, schema })
    }

    /// The first file's schema.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Record batches in every file.
    pub fn batches(&self) -> usize {
        self.files.iter().map(|f| f.1).sum()
    }

    /// Up to `parts` chains, each over a contiguous run of record batches.
    pub(super) fn openers(
        &self,
        columns: &[usize],
        parts: usize,
        counters: &Arc<ReadCounters>,
    ) -> Vec<Vec<Opener>> {
        let per_part = self.batches().div_ceil(parts).max(1);
        let mut result: Vec<Vec<Opener>> = Vec::new();
        let mut in_part = per_part; // start a new part at once
        for (path, batches) in &self.files {
            let mut start = 0;
            while start < *batches {
                if in_part == per_part {
                    result.push(Vec::new());
                    in_part = 0;
                }
                let count = (per_part - in_part).min(batches - start);
                let (path, columns, counters) =
                    (path.clone(), columns.to_vec(), Arc::clone(counters));
                if let Some(part) = result.last_mut() {
                    part.push(Opener::new(&path.clone(), move || {
                        let mut reader = FileReader::try_new(
                            BufReader::new(CountingFile::open(&path, &counters)?),
                            Some(columns),
                        )?;
                        reader.set_index(start)?;
                        Ok(Box::new(reader.take(count)) as BatchStream)
                    }));
                }
                start += count;
                in_part += count;
            }
        }
        result
    }
}

/// The schema of an Arrow IPC stream-format input (from the first file; the others
/// are checked).
///
/// # Errors
/// As [`ArrowFileSource::open`].
pub fn stream_schema(paths: &[PathBuf]) -> Result<SchemaRef> {
    let mut schema: Option<SchemaRef> = None;
    for path in paths {
        let reader = StreamReader::try_new(BufReader::new(open(path)?), None)
            .with_context(|| not_of_format(path, "Arrow IPC stream"))?;
        let this = reader.schema();
        if let Some(first) = &schema {
            super::check_same_columns(&paths[0], first, path, &this)?;
        }
        schema.get_or_insert(this);
    }
    schema.ok_or_else(|| Kind::Input.error("no Arrow stream files"))
}

/// Opens one stream-format file with only `columns`.
pub(super) fn stream_opener(
    path: &Path,
    columns: Vec<usize>,
    counters: &Arc<ReadCounters>,
) -> Opener {
    let (owned, counters) = (path.to_path_buf(), Arc::clone(counters));
    Opener::new(path, move || {
        let file = CountingFile::open(&owned, &counters)?;
        let reader = StreamReader::try_new(BufReader::new(file), Some(columns))?;
        Ok(Box::new(reader) as BatchStream)
    })
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| Kind::Input.context(format!("cannot open {}", path.display())))
}

fn not_of_format(path: &Path, what: &str) -> crate::failure::Failure {
    Kind::Input.context(format!("{} is not a readable {what}", path.display()))
}
