//! The `spilljoin` command line: `spilljoin join` over Parquet, Arrow IPC, CSV and
//! NDJSON, `spilljoin sql` (SQL over the same files in DataFusion, its joins
//! spilling), `spilljoin demo`, and `spilljoin clean`. See `spilljoin --help` and
//! the README.
//!
//! It is a crate of its own so that the library carries none of its dependencies
//! (argument parsing, file formats, the filter's SQL parser, progress bars, signals):
//! an engine that embeds `spilljoin` gets the join and nothing else.
//!
//! Modules, one concept each: [`args`] (flags and help), [`format`] (file formats,
//! CSV and schema options), [`input`] (files, schemas, statistics, streams),
//! [`filter`] (`--filter` parsed, typed and evaluated), [`select`] (`--select`),
//! [`plan`] (everything resolved before a row is read; `--explain`), [`run`]
//! (executing a plan), [`sql`] (a query in DataFusion), [`output`] (writers and atomic files), [`progress`],
//! [`metrics`] (`--metrics` JSON), [`signals`] (Ctrl-C and SIGTERM), [`stale`] (what
//! killed joins leave behind, told from what live ones hold), [`clean`] (removing
//! it on demand), [`failure`] (exit codes and one-line errors), [`suggest`] ("did
//! you mean"), [`demo`].

mod allocator;
mod args;
mod clean;
mod demo;
mod direct_io;
mod failure;
mod filter;
mod format;
mod input;
mod metrics;
mod output;
mod plan;
mod progress;
mod pushdown;
mod run;
mod select;
mod signals;
mod sql;
mod stale;
mod suggest;

use clap::Parser;

use failure::{kind_of, one_line, signal_exit_code, EXIT_USAGE};
use signals::{signal_name, Interrupt};

/// The message of the last panic, for the one-line report of a bug.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

#[global_allocator]
static ALLOCATOR: allocator::HugePageAlloc = allocator::HugePageAlloc;

fn main() {
    std::process::exit(run_cli());
}

/// Parses the arguments, runs the command, prints errors as one line, and returns
/// the exit code (see [`failure`]).
fn run_cli() -> i32 {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; the rest are usage errors.
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    // A panic is a bug; it is reported on one line like any error, without a
    // backtrace: the hook only keeps its message. (The join reports a panic of one of
    // its workers as an error of its own.)
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string().replace(['\n', '\r'], " ");
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
    }));
    let interrupt = match Interrupt::install() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("spilljoin: warning: cannot watch for Ctrl-C: {e}");
            Interrupt::default()
        }
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match cli.command {
        args::Command::Join(join) => run::join(*join, &interrupt),
        args::Command::Sql(sql) => sql::run(*sql, &interrupt),
        args::Command::Demo(demo) => demo::run(&demo, &interrupt),
        args::Command::Clean(clean) => clean::run(&clean),
    }));
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => match interrupt.signal() {
            Some(signal) => {
                eprintln!(
                    "spilljoin: stopped by {}; spill files and partial output removed",
                    signal_name(signal)
                );
                signal_exit_code(signal)
            }
            None => {
                eprintln!("spilljoin: error: {}", one_line(&e));
                kind_of(&e).exit_code()
            }
        },
        Err(_) => {
            let text = LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).take();
            eprintln!(
                "spilljoin: error: internal error (a bug in spilljoin): {}",
                text.unwrap_or_default()
            );
            failure::Kind::Internal.exit_code()
        }
    }
}
