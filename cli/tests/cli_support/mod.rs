//! What the end-to-end tests of the `spilljoin` binary share (`tests/cli*.rs`):
//! running the binary and checking its exit code and stderr, a small fixture of
//! two inputs, and reading outputs back in every format.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Int32Array, Int64Array, RecordBatch, RecordBatchReader, StringArray,
};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------
// Running the binary

/// Exit codes, as `spilljoin --help` documents them.
pub const INVALID_JOIN: i32 = 3;
/// An input cannot be read.
pub const BAD_INPUT: i32 = 4;
/// The output cannot be written.
pub const BAD_OUTPUT: i32 = 5;
/// Spilling failed.
pub const SPILL_FAILED: i32 = 6;
/// The memory limit is too small.
pub const OUT_OF_MEMORY: i32 = 7;

/// What one run of the binary did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub args: Vec<String>,
}

impl Run {
    /// The row count of the `rows: N elapsed: ...` line; panics on any other outcome.
    pub fn rows(&self) -> u64 {
        assert_eq!(
            self.code, 0,
            "spilljoin {:?} failed:\n{}",
            self.args, self.stderr
        );
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("rows: "))
            .collect();
        assert_eq!(lines.len(), 1, "one rows line expected:\n{}", self.stderr);
        let rest = &lines[0]["rows: ".len()..];
        let (n, rest) = rest.split_once(' ').expect("rows line");
        assert!(rest.starts_with("elapsed: "), "{}", lines[0]);
        n.parse().expect("row count")
    }

    /// Asserts a failure with exit code `code` and exactly one line on stderr, the
    /// error, which contains every one of `needles`. Returns the line.
    pub fn error(&self, code: i32, needles: &[&str]) -> String {
        assert_eq!(
            self.code, code,
            "spilljoin {:?}: expected exit code {code}\nstderr:\n{}",
            self.args, self.stderr
        );
        self.assert_no_panic();
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "spilljoin {:?}: expected one line on stderr, got:\n{}",
            self.args,
            self.stderr
        );
        let line = lines[0];
        assert!(line.starts_with("spilljoin: error: "), "{line}");
        for needle in needles {
            assert!(line.contains(needle), "{needle:?} not in {line:?}");
        }
        line.to_string()
    }

    /// Asserts a usage error (clap's exit code 2) that mentions every one of `needles`.
    pub fn usage_error(&self, needles: &[&str]) {
        assert_eq!(
            self.code, 2,
            "spilljoin {:?}: expected exit code 2\nstderr:\n{}",
            self.args, self.stderr
        );
        self.assert_no_panic();
        assert!(self.stderr.starts_with("error: "), "{}", self.stderr);
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "{needle:?} not in {}",
                self.stderr
            );
        }
    }

    pub fn assert_no_panic(&self) {
        for text in [&self.stderr, &self.stdout] {
            assert!(!text.contains("panicked"), "panic:\n{text}");
            assert!(
                !text.to_lowercase().contains("backtrace"),
                "backtrace:\n{text}"
            );
        }
    }
}

/// Runs `spilljoin ARGS...`.
pub fn spilljoin<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    spilljoin_env(args, &[])
}

/// Runs `spilljoin ARGS...` with environment variables set.
pub fn spilljoin_env<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spilljoin"));
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("cannot run the spilljoin binary");
    Run {
        code: output.status.code().expect("killed by a signal"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        args: args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect(),
    }
}

// ---------------------------------------------------------------------------------
// Inputs

/// Writes `batch` as Parquet, `rows_per_group` rows to a row group.
pub fn write_parquet(path: &Path, batch: &RecordBatch, rows_per_group: usize) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .build();
    let mut writer =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

/// Writes `batch` as CSV with a header (a null is an empty field), split in `parts`
/// writes.
pub fn write_csv(path: &Path, batch: &RecordBatch) {
    let mut writer = arrow_csv::WriterBuilder::new()
        .with_header(true)
        .build(File::create(path).unwrap());
    writer.write(batch).unwrap();
}

/// Writes `batch` as NDJSON (nulls left out of each object).
pub fn write_ndjson(path: &Path, batch: &RecordBatch) {
    let mut writer = arrow_json::LineDelimitedWriter::new(File::create(path).unwrap());
    writer.write(batch).unwrap();
    writer.finish().unwrap();
}

/// Writes `batch` as an Arrow IPC file, `rows_per_batch` rows to a record batch.
pub fn write_arrow(path: &Path, batch: &RecordBatch, rows_per_batch: usize) {
    let mut writer =
        arrow_ipc::writer::FileWriter::try_new(File::create(path).unwrap(), &batch.schema())
            .unwrap();
    for start in (0..batch.num_rows()).step_by(rows_per_batch) {
        let len = rows_per_batch.min(batch.num_rows() - start);
        writer.write(&batch.slice(start, len)).unwrap();
    }
    writer.finish().unwrap();
}

/// Writes `batch` as an Arrow IPC stream, `rows_per_batch` rows to a record batch.
pub fn write_arrows(path: &Path, batch: &RecordBatch, rows_per_batch: usize) {
    let mut writer =
        arrow_ipc::writer::StreamWriter::try_new(File::create(path).unwrap(), &batch.schema())
            .unwrap();
    for start in (0..batch.num_rows()).step_by(rows_per_batch) {
        let len = rows_per_batch.min(batch.num_rows() - start);
        writer.write(&batch.slice(start, len)).unwrap();
    }
    writer.finish().unwrap();
}

/// Writes `batch` in `format` (an extension) to `path`.
pub fn write_as(path: &Path, batch: &RecordBatch) {
    match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => write_parquet(path, batch, 2),
        Some("arrow") => write_arrow(path, batch, 2),
        Some("arrows") => write_arrows(path, batch, 2),
        Some("csv") => write_csv(path, batch),
        Some("ndjson") => write_ndjson(path, batch),
        other => panic!("no writer for {other:?}"),
    }
}

pub fn batch(schema: SchemaRef, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(schema, columns).unwrap()
}

pub fn left_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
        Field::new("lv", DataType::Int32, false),
        Field::new("tag", DataType::Utf8, true),
    ]))
}

pub fn right_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
        Field::new("rv", DataType::Int32, false),
        Field::new("label", DataType::Utf8, true),
    ]))
}

/// `left(id, name, lv, tag)` and `right(id, name, rv, label)`: `id` and `name` on
/// both sides, null and duplicate keys on both.
///
/// ```text
///  left                       right
///  id    name lv  tag         id    name rv   label
///  1     a    10  p           2     x    100  p
///  2     b    20  p           2     y    200  q
///  2     c    30  q           3     z    300  null
///  3     d    40  null        4     w    400  p
///  null  e    50  p           null  v    500  p
///  5     f    60  p           null  u    600  null
/// ```
pub struct Fixture {
    pub dir: TempDir,
    pub left: PathBuf,
    pub right: PathBuf,
    /// `right` without its null-key rows (ids 2, 2, 3, 4).
    pub right_no_nulls: PathBuf,
    /// `right`'s schema, no rows.
    pub empty: PathBuf,
}

impl Fixture {
    /// The left table.
    pub fn left_batch() -> RecordBatch {
        batch(
            left_schema(),
            vec![
                Arc::new(Int64Array::from(vec![
                    Some(1),
                    Some(2),
                    Some(2),
                    Some(3),
                    None,
                    Some(5),
                ])),
                Arc::new(StringArray::from(vec!["a", "b", "c", "d", "e", "f"])),
                Arc::new(Int32Array::from(vec![10, 20, 30, 40, 50, 60])),
                Arc::new(StringArray::from(vec![
                    Some("p"),
                    Some("p"),
                    Some("q"),
                    None,
                    Some("p"),
                    Some("p"),
                ])),
            ],
        )
    }

    /// The right table.
    pub fn right_batch() -> RecordBatch {
        batch(
            right_schema(),
            vec![
                Arc::new(Int64Array::from(vec![
                    Some(2),
                    Some(2),
                    Some(3),
                    Some(4),
                    None,
                    None,
                ])),
                Arc::new(StringArray::from(vec!["x", "y", "z", "w", "v", "u"])),
                Arc::new(Int32Array::from(vec![100, 200, 300, 400, 500, 600])),
                Arc::new(StringArray::from(vec![
                    Some("p"),
                    Some("q"),
                    None,
                    Some("p"),
                    Some("p"),
                    None,
                ])),
            ],
        )
    }

    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (left, right) = (Self::left_batch(), Self::right_batch());
        let fixture = Self {
            left: dir.path().join("left.parquet"),
            right: dir.path().join("right.parquet"),
            right_no_nulls: dir.path().join("right_no_nulls.parquet"),
            empty: dir.path().join("empty.parquet"),
            dir,
        };
        // Several row groups, so that inputs are read in several parts.
        write_parquet(&fixture.left, &left, 2);
        write_parquet(&fixture.right, &right, 2);
        write_parquet(&fixture.right_no_nulls, &right.slice(0, 4), 3);
        write_parquet(&fixture.empty, &right.slice(0, 0), 2);
        fixture
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `join --left LEFT --right RIGHT --on id=id EXTRA...`.
    pub fn join(&self, extra: &[&str]) -> Run {
        self.join_files(&self.left, &self.right, extra)
    }

    pub fn join_files(&self, left: &Path, right: &Path, extra: &[&str]) -> Run {
        let mut args: Vec<String> = vec![
            "join".into(),
            "--left".into(),
            left.display().to_string(),
            "--right".into(),
            right.display().to_string(),
        ];
        if !extra.contains(&"--on") {
            args.extend(["--on".into(), "id=id".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        spilljoin(&args)
    }
}

// ---------------------------------------------------------------------------------
// Outputs

/// A table read back: column names and rows of values as text (null: `None`).
#[derive(Debug, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

impl Table {
    pub fn from_batches(schema: &Schema, batches: &[RecordBatch]) -> Self {
        let options = FormatOptions::default();
        let mut rows = Vec::new();
        for b in batches {
            let formatters: Vec<ArrayFormatter> = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
                .collect();
            for r in 0..b.num_rows() {
                rows.push(
                    b.columns()
                        .iter()
                        .zip(&formatters)
                        .map(|(c, f)| (!c.is_null(r)).then(|| f.value(r).to_string()))
                        .collect(),
                );
            }
        }
        rows.sort();
        Self {
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            rows,
        }
    }

    pub fn read_parquet(path: &Path) -> Self {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let schema = reader.schema();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        Self::from_batches(&schema, &batches)
    }

    pub fn read_arrow(path: &Path) -> Self {
        let reader =
            arrow_ipc::reader::FileReader::try_new(File::open(path).unwrap(), None).unwrap();
        let schema = reader.schema();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        Self::from_batches(&schema, &batches)
    }

    /// An Arrow IPC stream file.
    pub fn read_arrows(path: &Path) -> Self {
        let reader =
            arrow_ipc::reader::StreamReader::try_new(File::open(path).unwrap(), None).unwrap();
        let schema = reader.schema();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        Self::from_batches(&schema, &batches)
    }

    /// NDJSON as the binary writes it: every column in every object, nulls explicit,
    /// in column order. Values are rendered as JSON scalars (strings unquoted).
    pub fn read_ndjson(path: &Path) -> Self {
        Self::from_ndjson(&std::fs::read_to_string(path).unwrap())
    }

    /// NDJSON text.
    pub fn from_ndjson(text: &str) -> Self {
        let mut columns: Vec<String> = Vec::new();
        let mut rows = Vec::new();
        for line in text.lines() {
            let object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(line).unwrap();
            if columns.is_empty() {
                columns = object.keys().cloned().collect();
            }
            assert_eq!(
                object.keys().cloned().collect::<Vec<_>>(),
                columns,
                "{line}"
            );
            rows.push(
                object
                    .values()
                    .map(|v| match v {
                        serde_json::Value::Null => None,
                        serde_json::Value::String(s) => Some(s.clone()),
                        other => Some(other.to_string()),
                    })
                    .collect(),
            );
        }
        rows.sort();
        Self { columns, rows }
    }

    /// An output of any format, by its extension.
    pub fn read(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("parquet") => Self::read_parquet(path),
            Some("arrow") => Self::read_arrow(path),
            Some("arrows") => Self::read_arrows(path),
            Some("csv") => Self::read_csv(path),
            Some("ndjson") | Some("jsonl") | Some("json") => Self::read_ndjson(path),
            other => panic!("no reader for {other:?}"),
        }
    }

    /// CSV as the binary writes it: a header, then rows; an empty field is a null
    /// (no value in these tests contains a comma, a quote or is empty).
    pub fn read_csv(path: &Path) -> Self {
        Self::from_csv(&std::fs::read_to_string(path).unwrap())
    }

    /// CSV text.
    pub fn from_csv(text: &str) -> Self {
        let mut lines = text.lines();
        let columns = lines
            .next()
            .expect("a header line")
            .split(',')
            .map(String::from)
            .collect();
        let mut rows: Vec<Vec<Option<String>>> = lines
            .map(|l| {
                l.split(',')
                    .map(|v| (!v.is_empty()).then(|| v.to_string()))
                    .collect()
            })
            .collect();
        rows.sort();
        Self { columns, rows }
    }
}

/// Rows written compactly: `"2,b,20,p"`, an empty field a null.
pub fn rows(rows: &[&str]) -> Vec<Vec<Option<String>>> {
    let mut rows: Vec<Vec<Option<String>>> = rows
        .iter()
        .map(|r| {
            r.split(',')
                .map(|v| (!v.is_empty()).then(|| v.to_string()))
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

pub fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

pub const INNER_ROWS: [&str; 5] = [
    "2,b,20,p,2,x,100,p",
    "2,b,20,p,2,y,200,q",
    "2,c,30,q,2,x,100,p",
    "2,c,30,q,2,y,200,q",
    "3,d,40,,3,z,300,",
];

pub const FULL_COLUMNS: [&str; 8] = [
    "left.id",
    "left.name",
    "lv",
    "tag",
    "right.id",
    "right.name",
    "rv",
    "label",
];
