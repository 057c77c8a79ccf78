//! File formats: which one a path is, and the CSV and schema options of text formats.
//!
//! A format comes from the file's extension unless a `--*-format` flag names it.
//! CSV and NDJSON carry no types, so their schema is inferred from the first rows
//! and can be overridden column by column with `NAME:TYPE` pairs
//! ([`parse_schema_override`]).

use std::fmt;
use std::path::Path;

use anyhow::{bail, Result};
use arrow_schema::{DataType, TimeUnit};
use clap::ValueEnum;

/// A file format spilljoin reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Format {
    /// Apache Parquet.
    Parquet,
    /// Arrow IPC file format (Feather v2): `.arrow`, `.feather`, `.ipc`.
    #[value(alias = "ipc", alias = "feather")]
    Arrow,
    /// Arrow IPC stream format: `.arrows`.
    #[value(alias = "ipc-stream")]
    Arrows,
    /// Comma-separated values with a header line: `.csv`, `.tsv`.
    #[value(alias = "tsv")]
    Csv,
    /// Newline-delimited JSON, one object per line: `.json`, `.jsonl`, `.ndjson`.
    #[value(alias = "json", alias = "jsonl")]
    Ndjson,
}

impl Format {
    /// The format a file name says, by its extension (ASCII case-insensitive).
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "parquet" | "parq" | "pq" => Format::Parquet,
            "arrow" | "feather" | "ipc" => Format::Arrow,
            "arrows" => Format::Arrows,
            "csv" | "tsv" => Format::Csv,
            "json" | "jsonl" | "ndjson" => Format::Ndjson,
            _ => return None,
        })
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
            Format::Arrows => "arrows",
            Format::Csv => "csv",
            Format::Ndjson => "ndjson",
        }
    }

    /// Whether the format stores no types, so that they are inferred.
    pub fn is_text(self) -> bool {
        matches!(self, Format::Csv | Format::Ndjson)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The extensions the README and errors list.
pub const EXTENSIONS: &str =
    ".parquet, .arrow/.feather/.ipc, .arrows, .csv/.tsv or .json/.jsonl/.ndjson";

/// How CSV is read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvOptions {
    /// The field delimiter; `None`: `,`, or tab for a `.tsv` file.
    pub delimiter: Option<u8>,
    /// Whether the first line names the columns.
    pub header: bool,
}

impl CsvOptions {
    /// The delimiter for `path`.
    pub fn delimiter_for(&self, path: &Path) -> u8 {
        self.delimiter.unwrap_or_else(|| {
            let tsv = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
            if tsv {
                b'\t'
            } else {
                b','
            }
        })
    }
}

/// Parses `NAME:TYPE[,NAME:TYPE...]` (see [`parse_type`]). Commas inside
/// parentheses belong to the type: `price:decimal(12,2),id:int64`.
///
/// # Errors
/// A pair without `:`, an empty name or an unknown type.
pub fn parse_schema_override(spec: &str) -> Result<Vec<(String, DataType)>> {
    let mut pairs = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut pieces = Vec::new();
    for (i, c) in spec.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                pieces.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&spec[start..]);
    for piece in pieces {
        let Some((name, ty)) = piece.rsplit_once(':') else {
            bail!("{piece:?} is not NAME:TYPE");
        };
        let name = name.trim();
        if name.is_empty() {
            bail!("{piece:?} has no column name");
        }
        pairs.push((name.to_string(), parse_type(ty)?));
    }
    Ok(pairs)
}

/// Parses a type name: `int8`..`int64`, `uint8`..`uint64`, `float32`, `float64`
/// (`double`), `bool`, `utf8` (`string`, `text`), `large_utf8`, `binary`, `date`
/// (`date32`), `date64`, `timestamp` (microseconds) or `timestamp_s`/`_ms`/`_us`/`_ns`,
/// `decimal(P,S)`.
///
/// # Errors
/// An unknown name, or a decimal precision or scale out of range.
pub fn parse_type(name: &str) -> Result<DataType> {
    let lower = name.trim().to_ascii_lowercase();
    Ok(match lower.as_str() {
        "int8" | "tinyint" => DataType::Int8,
        "int16" | "smallint" => DataType::Int16,
        "int32" | "int" | "integer" => DataType::Int32,
        "int64" | "bigint" | "long" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float32" | "float" | "real" => DataType::Float32,
        "float64" | "double" => DataType::Float64,
        "bool" | "boolean" => DataType::Boolean,
        "utf8" | "string" | "text" | "str" | "varchar" => DataType::Utf8,
        "large_utf8" | "large_string" => DataType::LargeUtf8,
        "binary" | "bytes" => DataType::Binary,
        "date" | "date32" => DataType::Date32,
        "date64" => DataType::Date64,
        "timestamp" | "timestamp_us" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamp_s" => DataType::Timestamp(TimeUnit::Second, None),
        "timestamp_ms" => DataType::Timestamp(TimeUnit::Millisecond, None),
        "timestamp_ns" => DataType::Timestamp(TimeUnit::Nanosecond, None),
        _ => return parse_decimal(&lower).ok_or_else(|| unknown_type(name))?,
    })
}

fn unknown_type(name: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "unknown type {:?} (types: int8-int64, uint8-uint64, float32, float64, bool, utf8, \
         large_utf8, binary, date, date64, timestamp[_s|_ms|_us|_ns], decimal(P,S))",
        name.trim()
    )
}

/// `decimal(P,S)` or `decimal(P)`, as Decimal128 (precision up to 38).
fn parse_decimal(lower: &str) -> Option<Result<DataType>> {
    let inner = lower
        .strip_prefix("decimal(")
        .or_else(|| lower.strip_prefix("numeric("))?
        .strip_suffix(')')?;
    let (p, s) = match inner.split_once(',') {
        Some((p, s)) => (p.trim(), s.trim()),
        None => (inner.trim(), "0"),
    };
    let (Ok(precision), Ok(scale)) = (p.parse::<u8>(), s.parse::<i8>()) else {
        return None;
    };
    if precision == 0 || precision > 38 || scale < 0 || scale as u8 > precision {
        return Some(Err(anyhow::anyhow!(
            "decimal({precision},{scale}) is out of range: precision 1 to 38, scale 0 to the precision"
        )));
    }
    Some(Ok(DataType::Decimal128(precision, scale)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_extensions() {
        assert_eq!(
            Format::from_path(Path::new("a.PARQUET")),
            Some(Format::Parquet)
        );
        assert_eq!(
            Format::from_path(Path::new("a.feather")),
            Some(Format::Arrow)
        );
        assert_eq!(
            Format::from_path(Path::new("a.arrows")),
            Some(Format::Arrows)
        );
        assert_eq!(Format::from_path(Path::new("a.tsv")), Some(Format::Csv));
        assert_eq!(
            Format::from_path(Path::new("a.jsonl")),
            Some(Format::Ndjson)
        );
        assert_eq!(Format::from_path(Path::new("a.txt")), None);
        assert_eq!(Format::from_path(Path::new("a")), None);
    }

    #[test]
    fn schema_overrides_parse() {
        let pairs = parse_schema_override("id:int64, price:decimal(12,2),day:date").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("id".to_string(), DataType::Int64),
                ("price".to_string(), DataType::Decimal128(12, 2)),
                ("day".to_string(), DataType::Date32),
            ]
        );
        assert!(parse_schema_override("id").is_err());
        assert!(parse_schema_override(":int64").is_err());
        let e = parse_schema_override("id:int65").unwrap_err().to_string();
        assert!(e.contains("unknown type \"int65\""), "{e}");
        assert!(parse_type("decimal(40,2)").is_err());
        assert_eq!(
            parse_type("TIMESTAMP_NS").unwrap(),
            DataType::Timestamp(TimeUnit::Nanosecond, None)
        );
    }
}
