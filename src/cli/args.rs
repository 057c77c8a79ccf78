//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use spilljoin::JoinType;

/// Join Arrow data of any size inside a fixed memory budget.
#[derive(Debug, Parser)]
#[command(name = "spilljoin", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Join two Parquet files on equal keys.
    Join(JoinArgs),
    /// Generate TPC-H-shaped orders and lineitem tables and join them.
    Demo(DemoArgs),
}

/// Settings shared by every command that runs a join.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Memory budget for the join, e.g. 512MiB, 2GB, 1.5GiB; what does not fit is
    /// spilled to --spill-dir [default: 75% of the memory available now; 8MiB for the
    /// demo].
    #[arg(long, value_parser = parse_size)]
    pub memory_limit: Option<u64>,
    /// Directory for spill files [default: the system temp dir].
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Worker threads, at least 1 [default: all cores].
    #[arg(long, value_parser = parse_positive)]
    pub threads: Option<usize>,
    /// Write the join's figures (rows, times, memory) here as JSON.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Rows per batch, read and written (at least 1).
    #[arg(long, default_value_t = spilljoin::DEFAULT_BATCH_SIZE_ROWS, value_parser = parse_positive)]
    pub batch_size: usize,
}

/// `spilljoin join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The left input (Parquet).
    #[arg(long)]
    pub left: PathBuf,
    /// The right input (Parquet); it is the build side.
    #[arg(long)]
    pub right: PathBuf,
    /// Key pairs: LCOL=RCOL[,LCOL=RCOL...].
    #[arg(long, value_parser = parse_on, required = true)]
    pub on: Vec<Vec<(String, String)>>,
    /// Join type: inner, left, right, full, semi, anti, right-semi, right-anti, mark,
    /// not-in, right-not-in.
    #[arg(long = "type", default_value = "inner")]
    pub join_type: JoinType,
    /// Let null keys equal each other (default: SQL, nulls equal nothing).
    #[arg(long)]
    pub null_equals_null: bool,
    /// Output columns, in order: NAME, left.NAME or right.NAME, comma-separated
    /// [default: every column].
    #[arg(long, value_delimiter = ',')]
    pub select: Option<Vec<String>>,
    /// Write the output here: .parquet, .arrow or .csv. Without it the output is
    /// produced in full and counted.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Run settings.
    #[command(flatten)]
    pub run: RunArgs,
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

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
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
