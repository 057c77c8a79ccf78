//! The `spilljoin` command line. See `spilljoin --help` and the README.

mod cli;

#[global_allocator]
static ALLOCATOR: cli::hugepages::HugePageAlloc = cli::hugepages::HugePageAlloc;

fn main() {
    std::process::exit(cli::main());
}
