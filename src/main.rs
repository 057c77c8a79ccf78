//! The `spilljoin` command line. See `spilljoin --help` and the README.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
