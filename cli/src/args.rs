//! Command-line arguments: every flag, its default and its help text.
//!
//! `spilljoin --help` and `spilljoin join --help` must be complete on their own, so
//! the long help here is the reference; the README repeats it with examples.

use std::path::PathBuf;

use crate::direct_io::DirectIoMode;
use crate::pushdown::PushdownMode;
use clap::{Args, Parser, Subcommand};
use spilljoin::spill::SpillCompression;
use spilljoin::JoinType;

use super::format::Format;

/// Join Arrow data of any size inside a fixed memory budget.
///
/// spilljoin joins two inputs (Parquet, Arrow IPC, CSV or NDJSON) on equal keys,
/// spilling to disk what does not fit in --memory-limit, and writes the result as
/// Parquet, Arrow IPC, CSV or NDJSON.
#[derive(Debug, Parser)]
#[command(name = "spilljoin", version, about, after_long_help = TOP_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Join two inputs on equal keys.
    #[command(after_long_help = JOIN_EXAMPLES)]
    Join(Box<JoinArgs>),
    /// Run a SQL query over files with DataFusion, its joins spilling with
    /// spilljoin.
    #[command(after_long_help = SQL_HELP)]
    Sql(Box<SqlArgs>),
    /// Generate TPC-H-shaped orders and lineitem tables and join them.
    Demo(DemoArgs),
    /// Remove what joins killed outright (SIGKILL, the OOM killer) left behind:
    /// stale spill directories and temporary outputs.
    #[command(after_long_help = CLEAN_HELP)]
    Clean(CleanArgs),
}

/// The exit codes, as both helps end with them (a macro: `concat!` takes literals).
macro_rules! exit_codes_help {
    () => {
        "Exit codes:
  0 success; 1 internal error; 2 bad command line; 3 the join or query is invalid
  (unknown column or table, key types, filter, selection, SQL); 4 an input cannot
  be read; 5 the output cannot be written; 6 spilling failed (spill dir, full disk,
  --max-spill-size); 7 the memory limit is too small; 128+N stopped by signal N
  (129 SIGHUP, 130 Ctrl-C, 143 SIGTERM)."
    };
}

/// The top-level help after the commands: what `join` takes, in short, with examples
/// (`spilljoin join --help` has every flag).
const TOP_HELP: &str = concat!(
    "\
spilljoin join: the flags, in short (`spilljoin join --help` explains each):
  inputs   --left PATH --right PATH (file, directory or quoted glob) --on L=R[,L=R...]
           [--left-format/--right-format F] [--left-schema/--right-schema NAME:TYPE,...]
           [--csv-delimiter C] [--csv-no-header] [--infer-rows N]
  join     [--type inner|left|right|full|semi|anti|right-semi|right-anti|mark|not-in|right-not-in]
           [--null-equals-null] [--filter SQL] [--select COLS] [--no-swap]
           [--pushdown none|bounds|all] [--explain]
  output   [--output PATH|-] [--output-format F] [--compression C]
  running  [--memory-limit SIZE] [--spill-dir DIR] [--spill-compression none|lz4|zstd]
           [--spill-direct-io[=auto|on|off]] [--max-spill-size SIZE] [--max-depth N] [--threads N]
           [--batch-size N] [--metrics PATH] [-q]

spilljoin sql [--table NAME=PATH]... [running and output flags as above]
  [--explain | --explain-analyze] (QUERY | --file FILE): SQL over files with
  DataFusion, its joins spilling (`spilljoin sql --help`).

spilljoin clean [--spill-dir DIR] [--output-dir DIR] [--dry-run]: remove what joins
  killed outright left behind (every join also does it when it starts).

Examples:
  spilljoin demo                       generate TPC-H-shaped data and join it in 8 MiB
  spilljoin join --left lineitem.parquet --right orders.parquet \\
      --on l_orderkey=o_orderkey --memory-limit 512MiB --output joined.parquet
  spilljoin join --left a.csv --right b.parquet --on id=id --type anti --explain
  spilljoin sql --table o=orders.parquet --table l='lineitem/*.parquet' \\
      'SELECT o_orderkey, sum(l_quantity) FROM o JOIN l ON l_orderkey = o_orderkey GROUP BY 1'

",
    exit_codes_help!()
);

/// `spilljoin join --help` after the flags: examples, inputs, exit codes.
const JOIN_EXAMPLES: &str = concat!(
    "\
Examples:
  spilljoin join --left lineitem.parquet --right orders.parquet \\
      --on l_orderkey=o_orderkey --output joined.parquet
  spilljoin join --left 'events/*.parquet' --right users.csv --on user_id=id \\
      --type left --filter \"left.ts >= right.signup + INTERVAL '7 days'\" \\
      --select user_id,right.country,ts --output - --output-format ndjson
  spilljoin join --left a.arrow --right b.arrow --on k=k --explain

Inputs are a file, a directory (every data file under it) or a quoted glob. The
format comes from the extension (.parquet, .arrow/.feather/.ipc, .arrows, .csv/.tsv,
.json/.jsonl/.ndjson) unless --left-format/--right-format say otherwise.

",
    exit_codes_help!()
);

/// Settings shared by every command that runs a join.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Running")]
pub struct RunArgs {
    /// Memory budget for the join (for `sql`, the whole query), e.g. 512MiB, 2GB,
    /// 1.5GiB; what does not fit is spilled to --spill-dir [default: 75% of the
    /// memory available now, cgroup aware; 8MiB for the demo].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub memory_limit: Option<u64>,
    /// Directory in which spill files are written, in a private subdirectory that is
    /// removed when the join (or query) ends [default: the system temp dir].
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Compression of spill files: none (fastest on a local disk), lz4 (about half
    /// the disk for strings) or zstd (smallest).
    #[arg(long, default_value = "none", value_parser = parse_spill_compression, value_name = "CODEC")]
    pub spill_compression: SpillCompression,
    /// Write and read spill files with direct I/O (O_DIRECT, Linux), past the page
    /// cache: `=auto` (`join`: when the spill expected from the inputs' sizes is more
    /// than a quarter of the memory available; `sql`: off), `=on` (the flag alone)
    /// or `=off`. Faster where the spill is larger than the page cache can keep or fresh
    /// page-cache pages are slow to fill (virtual machines), slower where the spill
    /// would have stayed in the page cache (BENCHMARKS.md, "Direct I/O").
    #[arg(long, value_name = "WHEN", default_value = "auto", num_args = 0..=1,
          default_missing_value = "on", require_equals = true)]
    pub spill_direct_io: DirectIoMode,
    /// The most disk all spill files may take at once, e.g. 50GiB; a join (or query)
    /// that needs more stops with exit code 6 [default: unlimited].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_spill_size: Option<u64>,
    /// Worker threads, 1 to 1024 (for `sql`, also DataFusion's target partitions)
    /// [default: all cores].
    #[arg(long, value_parser = parse_threads, value_name = "N")]
    pub threads: Option<usize>,
    /// Rows per batch, read and written (1 to 1048576).
    #[arg(long, default_value_t = spilljoin::DEFAULT_BATCH_SIZE_ROWS, value_parser = parse_batch_size, value_name = "ROWS")]
    pub batch_size: usize,
    /// How many times a spilled partition still too big may be split again, 0 to 4;
    /// below that it is joined in chunks (the output is the same).
    #[arg(long, default_value_t = spilljoin::MAX_DEPTH, value_parser = clap::value_parser!(u32).range(0..=spilljoin::MAX_DEPTH as i64), value_name = "N")]
    pub max_depth: u32,
    /// Write the run's figures (phases, rows, spilling, memory) here as JSON, also
    /// when the join fails.
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,
    /// Print nothing but errors: no progress, no summary.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `spilljoin join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The left input: a file, a directory or a quoted glob such as 'data/*.parquet'.
    #[arg(long, value_name = "PATH", help_heading = "Inputs")]
    pub left: String,
    /// The right input, as --left. The smaller input (by Parquet metadata or file
    /// size) builds the hash table unless --no-swap.
    #[arg(long, value_name = "PATH", help_heading = "Inputs")]
    pub right: String,
    /// Key pairs, left column = right column: LCOL=RCOL[,LCOL=RCOL...]; repeatable.
    #[arg(long, value_parser = parse_on, required = true, value_name = "L=R", help_heading = "Join")]
    pub on: Vec<Vec<(String, String)>>,
    /// Join type: inner, left, right, full, semi, anti, right-semi, right-anti, mark,
    /// not-in, right-not-in.
    #[arg(
        long = "type",
        default_value = "inner",
        value_name = "TYPE",
        help_heading = "Join"
    )]
    pub join_type: JoinType,
    /// Let null keys equal each other (default: SQL, nulls equal nothing).
    #[arg(long, help_heading = "Join")]
    pub null_equals_null: bool,
    /// A SQL boolean expression over columns of both inputs, applied with the keys
    /// (like `ON l.k = r.k AND <expr>`): name columns `left.NAME`, `right.NAME` or
    /// `NAME` if only one input has it. Comparisons, + - * / %, AND/OR/NOT, IS [NOT]
    /// NULL, BETWEEN, IN (...), LIKE/ILIKE, CAST, DATE '...', TIMESTAMP '...',
    /// INTERVAL '...'. A pair counts as a match only where it is true.
    #[arg(long, value_name = "EXPR", help_heading = "Join")]
    pub filter: Option<String>,
    /// Output columns, in order: NAME, left.NAME or right.NAME, comma-separated
    /// [default: every column of the sides the join type outputs].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "COLS",
        help_heading = "Join"
    )]
    pub select: Option<Vec<String>>,
    /// Write the output here (`-` for stdout), written to a temporary name and
    /// renamed when complete. Without it the output is produced in full and counted.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    pub output: Option<String>,
    /// Output format [default: from --output's extension; csv for stdout].
    #[arg(long, value_name = "FORMAT", help_heading = "Output")]
    pub output_format: Option<Format>,
    /// Output compression: for Parquet none, snappy, lz4, zstd or zstd:LEVEL (1-22)
    /// [default: zstd]; for Arrow IPC none, lz4 or zstd [default: none].
    #[arg(long, value_name = "CODEC", help_heading = "Output")]
    pub compression: Option<String>,
    /// Format of --left: parquet, arrow, arrows, csv or ndjson [default: from its
    /// extension].
    #[arg(
        long,
        value_name = "FORMAT",
        hide_possible_values = true,
        help_heading = "Inputs"
    )]
    pub left_format: Option<Format>,
    /// Format of --right: parquet, arrow, arrows, csv or ndjson [default: from its
    /// extension].
    #[arg(
        long,
        value_name = "FORMAT",
        hide_possible_values = true,
        help_heading = "Inputs"
    )]
    pub right_format: Option<Format>,
    /// Column types of a CSV or NDJSON --left, replacing the inferred ones:
    /// NAME:TYPE[,NAME:TYPE...], e.g. `id:int64,price:decimal(12,2),day:date`.
    /// Types: int8-int64, uint8-uint64, float32, float64, bool, utf8, large_utf8,
    /// binary, date, date64, timestamp[_s|_ms|_us|_ns], decimal(P,S).
    #[arg(long, value_name = "SCHEMA", help_heading = "Inputs")]
    pub left_schema: Option<String>,
    /// Column types of a CSV or NDJSON --right, as --left-schema.
    #[arg(long, value_name = "SCHEMA", help_heading = "Inputs")]
    pub right_schema: Option<String>,
    /// Field delimiter of CSV inputs and output: one character, or `tab`
    /// [default: `,`; tab for .tsv].
    #[arg(long, value_parser = parse_delimiter, value_name = "CHAR", help_heading = "Inputs")]
    pub csv_delimiter: Option<u8>,
    /// CSV inputs have no header line (columns are named column_1, column_2, ...),
    /// and CSV output gets none.
    #[arg(long, help_heading = "Inputs")]
    pub csv_no_header: bool,
    /// Rows of a CSV or NDJSON input read to infer its column types.
    #[arg(long, default_value_t = 10_000, value_parser = parse_positive, value_name = "ROWS", help_heading = "Inputs")]
    pub infer_rows: usize,
    /// Always build on --right, whatever the inputs' sizes.
    #[arg(long, help_heading = "Join")]
    pub no_swap: bool,
    /// What the Parquet probe scan skips once the build is known, for joins that do
    /// not output unmatched probe rows: `bounds` skips row groups and pages whose key
    /// statistics lie outside the build's key range; `all` also drops rows whose key
    /// is not in the build (a bloom filter) before decoding their other columns;
    /// `none` reads everything.
    #[arg(long, value_enum, default_value_t = PushdownMode::Bounds, help_heading = "Join")]
    pub pushdown: PushdownMode,
    /// Print the plan (build side and why, key types, partitions, memory limit,
    /// spill dir, filter, output) and exit without joining.
    #[arg(long, help_heading = "Join")]
    pub explain: bool,
    /// Run settings.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `spilljoin sql --help` after the flags.
const SQL_HELP: &str = concat!(
    "\
Each --table NAME=PATH registers a table: PATH is a file, a directory (every data
file under it) or a quoted glob, in one format told by the extension (.parquet,
.arrow/.feather/.ipc, .arrows, .csv/.tsv, .json/.jsonl/.ndjson), as for `join`,
or named: --table NAME:csv=data.txt.

The query runs in DataFusion with one memory budget (--memory-limit, a fair spill
pool) shared by every operator; its hash joins are spilljoin's, so they spill
instead of failing. When another operator (a sort, an aggregate) runs out of
memory, the error names it. SET spilljoin.enabled = false and the other
spilljoin.* settings work in the query's session (SHOW ALL lists them); `--explain`
shows SpilljoinExec where a join runs.

Examples:
  spilljoin sql --table orders=orders.parquet --table lineitem='lineitem/*.parquet' \\
      --memory-limit 256MiB --output revenue.parquet \\
      'SELECT o_orderpriority, sum(l_extendedprice) AS revenue
       FROM orders JOIN lineitem ON l_orderkey = o_orderkey GROUP BY o_orderpriority'
  spilljoin sql --table t=events.csv --file report.sql --output - --output-format ndjson
  spilljoin sql --table a=a.parquet --table b=b.parquet --explain 'SELECT * FROM a JOIN b USING (k)'

",
    exit_codes_help!()
);

/// `spilljoin sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The query, one SQL statement (or give --file).
    #[arg(
        value_name = "QUERY",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub query: Option<String>,
    /// Read the query from this file.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// A table for the query: NAME=PATH, PATH a file, a directory or a quoted glob
    /// such as 'data/*.parquet'; NAME:FORMAT=PATH names the format (parquet, arrow,
    /// arrows, csv, ndjson) when the extension does not; repeatable.
    #[arg(long = "table", value_parser = parse_table, value_name = "NAME=PATH", help_heading = "Inputs")]
    pub tables: Vec<TableArg>,
    /// Field delimiter of CSV tables and output: one character, or `tab`
    /// [default: `,`; tab for .tsv].
    #[arg(long, value_parser = parse_delimiter, value_name = "CHAR", help_heading = "Inputs")]
    pub csv_delimiter: Option<u8>,
    /// CSV tables have no header line (columns are named column_1, column_2, ...),
    /// and CSV output gets none.
    #[arg(long, help_heading = "Inputs")]
    pub csv_no_header: bool,
    /// Write the result here (`-` for stdout), written to a temporary name and
    /// renamed when complete. Without it the result is produced in full and counted.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    pub output: Option<String>,
    /// Output format [default: from --output's extension; csv for stdout].
    #[arg(long, value_name = "FORMAT", help_heading = "Output")]
    pub output_format: Option<Format>,
    /// Output compression, as for `join` [default: zstd for Parquet, none otherwise].
    #[arg(long, value_name = "CODEC", help_heading = "Output")]
    pub compression: Option<String>,
    /// Print the physical plan (SpilljoinExec where a join runs) and exit without
    /// running the query.
    #[arg(long, conflicts_with = "explain_analyze", help_heading = "Query")]
    pub explain: bool,
    /// Run the query (writing --output, if given), then print the physical plan
    /// with each operator's figures (rows, time, memory, spilling).
    #[arg(long, help_heading = "Query")]
    pub explain_analyze: bool,
    /// Run settings.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `spilljoin clean --help` after the flags.
const CLEAN_HELP: &str = concat!(
    "\
Every join does this by itself when it starts, in its --spill-dir and for its
--output; `clean` is for directories no join will use again soon. A directory or
file is stale when no running process holds its lock: a running join's are never
touched, nor anything spilljoin did not make. It prints each item removed with its
bytes, then the total. An item that cannot be removed is a warning, and the exit
code is then 6 (a spill directory) or 5 (an output).

Examples:
  spilljoin clean --spill-dir /mnt/scratch --dry-run
  spilljoin clean --spill-dir /mnt/scratch --output-dir results/

",
    exit_codes_help!()
);

/// `spilljoin clean`.
#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Where joins spilled (their --spill-dir): stale `spilljoin-XXXXXX`
    /// directories in it are removed [default: the system temp dir].
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Where joins wrote their output (the directory of their --output): orphaned
    /// temporary outputs `.NAME.spilljoin-XXXXXX.tmp` in it are removed.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// List what would be removed, with its bytes, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `spilljoin demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orders to generate (lineitem gets about four times as many rows).
    #[arg(long, default_value_t = 300_000)]
    pub orders: usize,
    /// Where to write the generated Parquet files [default: a temp dir, removed after].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run settings.
    #[command(flatten)]
    pub run: RunArgs,
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::parse_size(s).map_err(|e| format!("{e} (try 512MiB, 2GB or 1.5GiB)"))
}

fn parse_at_most(s: &str, most: usize) -> Result<usize, String> {
    let n = parse_positive(s)?;
    if n > most {
        return Err(format!("must be at most {most}"));
    }
    Ok(n)
}

fn parse_threads(s: &str) -> Result<usize, String> {
    parse_at_most(s, MAX_THREADS)
}

fn parse_batch_size(s: &str) -> Result<usize, String> {
    parse_at_most(s, spilljoin::MAX_BATCH_SIZE_ROWS)
}

/// The most worker threads the command line accepts.
const MAX_THREADS: usize = 1024;

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_spill_compression(s: &str) -> Result<SpillCompression, String> {
    s.parse().map_err(|e| format!("{e}"))
}

fn parse_delimiter(s: &str) -> Result<u8, String> {
    match s {
        "tab" | "\\t" | "\t" => Ok(b'\t'),
        _ if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
        _ => Err("must be one ASCII character or `tab`".into()),
    }
}

/// `--table NAME[:FORMAT]=PATH`.
#[derive(Debug, Clone)]
pub struct TableArg {
    /// The table's name in SQL, in lower case.
    pub name: String,
    /// The format, if given.
    pub format: Option<Format>,
    /// PATH as given.
    pub path: String,
}

fn parse_table(s: &str) -> Result<TableArg, String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=PATH"))?;
    let (name, format) = match name.split_once(':') {
        Some((name, format)) => {
            let format =
                <Format as clap::ValueEnum>::from_str(format.trim(), true).map_err(|_| {
                    format!("{format:?} is not a format: use parquet, arrow, arrows, csv or ndjson")
                })?;
            (name, Some(format))
        }
        None => (name, None),
    };
    let name = name.trim();
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "{name:?} is not a table name: use letters, digits and _, starting with a letter or _"
        ));
    }
    if path.is_empty() {
        return Err(format!("{s:?} has no path after ="));
    }
    // SQL folds unquoted names to lower case: so does the table's name.
    Ok(TableArg {
        name: name.to_ascii_lowercase(),
        format,
        path: path.to_string(),
    })
}

fn parse_on(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(|pair| {
            pair.split_once('=')
                .map(|(l, r)| (l.trim().to_string(), r.trim().to_string()))
                .filter(|(l, r)| !l.is_empty() && !r.is_empty())
                .ok_or_else(|| format!("{pair:?} is not LCOL=RCOL"))
        })
        .collect()
}
