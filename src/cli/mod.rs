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
    let cli = args::Cli::parse();
    let result = match cli.command {
        args::Command::Join(join) => run::join(&join),
        args::Command::Demo(demo) => demo::run(&demo),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("spilljoin: error: {}", chain.join(": "));
            EXIT_FAILURE
        }
    }
}
