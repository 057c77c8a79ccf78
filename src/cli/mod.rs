//! The command line: `spilljoin join` over Parquet files, and `spilljoin demo`.

mod args;
mod demo;
mod io;
mod run;

use clap::Parser;

/// Exit code of a join that failed at run time (bad input, out of memory, i/o).
pub const EXIT_FAILURE: i32 = 1;
/// Exit code of a command line that could not be understood (clap's own code).
pub const EXIT_USAGE: i32 = 2;

/// Parses the arguments, runs the command, prints errors as one line.
pub fn main() -> i32 {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; the rest are usage errors.
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    let result = match cli.command {
        args::Command::Join(join) => run::join(&join),
        args::Command::Demo(demo) => demo::run(&demo),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spilljoin: error: {}", one_line(&e));
            EXIT_FAILURE
        }
    }
}

/// The error and its causes on one line, outermost first. A cause whose text its
/// parent already includes is left out, and line breaks become spaces.
fn one_line(e: &anyhow::Error) -> String {
    let mut message = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !previous.is_empty() && previous.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
        previous = text;
    }
    message.replace(['\n', '\r'], " ")
}
