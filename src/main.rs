//! The `spilljoin` command line. See `spilljoin --help` and the README.

mod cli;

#[global_allocator]
static ALLOCATOR: cli::allocator::HugePageAlloc = cli::allocator::HugePageAlloc;

fn main() {
    std::process::exit(cli::main());
}
