//! CSV and NDJSON inputs: schemas inferred from the first rows of the first file,
//! then one stream per file that parses only the projected fields into arrays.
//!
//! A value that does not parse as its column's type (inferred or overridden) is an
//! error of the input, naming the file and the line.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_schema::{DataType, Schema, SchemaRef};

use super::{BatchStream, CountingFile, Opener, ReadCounters};
use crate::failure::Kind;
use crate::format::CsvOptions;

/// Infers the schema of a CSV file from its first `rows` rows.
///
/// # Errors
/// Input failures: the file cannot be opened or is not CSV.
pub fn infer_csv(path: &Path, csv: &CsvOptions, rows: usize) -> Result<SchemaRef> {
    let file = open(path)?;
    let (schema, _) = arrow_csv::reader::Format::default()
        .with_header(csv.header)
        .with_delimiter(csv.delimiter_for(path))
        .infer_schema(BufReader::new(file), Some(rows))
        .with_context(|| Kind::Input.context(format!("cannot read {} as CSV", path.display())))?;
    if schema.fields().is_empty() {
        return Err(Kind::Input.error(format!("{} is empty: no CSV header", path.display())));
    }
    Ok(without_null_types(&schema))
}

/// Infers the schema of an NDJSON file from its first `rows` lines.
///
/// # Errors
/// Input failures: the file cannot be opened or is not newline-delimited JSON.
pub fn infer_ndjson(path: &Path, rows: usize) -> Result<SchemaRef> {
    let file = open(path)?;
    let (schema, _) =
        arrow_json::reader::infer_json_schema_from_seekable(BufReader::new(file), Some(rows))
            .with_context(|| {
                Kind::Input.context(format!(
                    "cannot read {} as newline-delimited JSON",
                    path.display()
                ))
            })?;
    if schema.fields().is_empty() {
        return Err(Kind::Input.error(format!(
            "{} has no JSON objects to take columns from",
            path.display()
        )));
    }
    Ok(without_null_types(&schema))
}

/// `schema` with the columns whose type could not be inferred (no values in the
/// rows read) as strings.
fn without_null_types(schema: &Schema) -> SchemaRef {
    let fields: Vec<arrow_schema::Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Null => f.as_ref().clone().with_data_type(DataType::Utf8),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Opens one CSV file, parsing only `columns` of `schema`.
pub(super) fn csv_opener(
    path: &Path,
    schema: &SchemaRef,
    csv: &CsvOptions,
    columns: Vec<usize>,
    batch_size: usize,
    counters: &Arc<ReadCounters>,
) -> Opener {
    let reader = arrow_csv::ReaderBuilder::new(Arc::clone(schema))
        .with_header(csv.header)
        .with_delimiter(csv.delimiter_for(path))
        .with_batch_size(batch_size)
        .with_projection(columns);
    let (owned, counters) = (path.to_path_buf(), Arc::clone(counters));
    Opener::new(path, move || {
        let file = BufReader::new(CountingFile::open(&owned, &counters)?);
        Ok(Box::new(reader.build(file)?) as BatchStream)
    })
}

/// Opens one NDJSON file, decoding only `columns` of `schema` (other fields of each
/// object are skipped).
pub(super) fn ndjson_opener(
    path: &Path,
    schema: &Schema,
    columns: &[usize],
    batch_size: usize,
    counters: &Arc<ReadCounters>,
) -> Opener {
    let projected = schema.project(columns).map(Arc::new);
    let (owned, counters) = (path.to_path_buf(), Arc::clone(counters));
    Opener::new(path, move || {
        let reader = arrow_json::ReaderBuilder::new(projected?).with_batch_size(batch_size);
        let file = BufReader::new(CountingFile::open(&owned, &counters)?);
        Ok(Box::new(reader.build(file)?) as BatchStream)
    })
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| Kind::Input.context(format!("cannot open {}", path.display())))
}
