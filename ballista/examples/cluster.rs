//! A Ballista cluster with spilljoin: a scheduler, executors each with its own memory
//! limit and spill directory, and SQL over files.
//!
//! ```sh
//! # Everything in one process: two executors of 256 MiB each, one query.
//! cargo run --release -p spilljoin-ballista --example cluster -- local \
//!     --executors 2 --executor-memory 256MiB --spill-dir /tmp \
//!     --table orders=data/orders.parquet --table lineitem=data/lineitem.parquet \
//!     "SELECT count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey"
//!
//! # Or one process each (its peak RSS is then its own):
//! cluster scheduler                                  # prints its address
//! cluster executor --scheduler 127.0.0.1:PORT --executor-memory 256MiB --spill-dir /tmp/e1
//! cluster sql --scheduler 127.0.0.1:PORT --table ... "SELECT ..."
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use spilljoin_ballista::{
    client, session_config, start_executor, start_scheduler, Cluster, ExecutorOptions,
};

#[derive(Parser)]
#[command(about = "A Ballista cluster whose joins spill (spilljoin)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A scheduler and executors in this process, and one query.
    Local {
        /// Executors to start.
        #[arg(long, default_value_t = 2)]
        executors: usize,
        #[command(flatten)]
        executor: ExecutorArgs,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// A scheduler; prints its address and runs until killed.
    Scheduler {
        /// Shuffle partitions of its sessions.
        #[arg(long, default_value_t = 2)]
        partitions: usize,
    },
    /// One executor, registered with a running scheduler; runs until killed.
    Executor {
        /// The scheduler's address, HOST:PORT.
        #[arg(long)]
        scheduler: SocketAddr,
        #[command(flatten)]
        executor: ExecutorArgs,
    },
    /// One query on a running scheduler.
    Sql {
        /// The scheduler's address, HOST:PORT.
        #[arg(long)]
        scheduler: SocketAddr,
        #[command(flatten)]
        query: QueryArgs,
    },
}

#[derive(Args)]
struct ExecutorArgs {
    /// Each executor's memory limit, e.g. 256MiB (its tasks share it) [default: none].
    #[arg(long, value_parser = parse_size)]
    executor_memory: Option<usize>,
    /// Directory under which each executor spills (executor-N below it).
    #[arg(long)]
    spill_dir: Option<PathBuf>,
    /// Tasks an executor runs at once; also the shuffle partitions.
    #[arg(long, default_value_t = 2)]
    partitions: usize,
}

#[derive(Args)]
struct QueryArgs {
    /// A Parquet table, NAME=PATH (a file or a directory of files).
    #[arg(long = "table", value_parser = parse_table)]
    tables: Vec<(String, String)>,
    /// A setting for the query's session, KEY=VALUE (datafusion.*, ballista.* or
    /// spilljoin.*: spilljoin.enabled=false runs stock hash joins).
    #[arg(long = "set", value_parser = parse_table)]
    settings: Vec<(String, String)>,
    /// The query.
    query: String,
}

fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let bytes = parse_size::parse_size(s).map_err(|e| e.to_string())?;
    usize::try_from(bytes).map_err(|e| e.to_string())
}

fn parse_table(s: &str) -> std::result::Result<(String, String), String> {
    let (name, path) = s.split_once('=').ok_or("expected NAME=VALUE")?;
    Ok((name.to_owned(), path.to_owned()))
}

impl ExecutorArgs {
    /// Executor `i`'s options (its own directory under --spill-dir).
    fn options(&self, i: usize) -> std::io::Result<ExecutorOptions> {
        let spill_dir = match &self.spill_dir {
            Some(root) => {
                let dir = root.join(format!("executor-{i}"));
                std::fs::create_dir_all(&dir)?;
                Some(dir)
            }
            None => None,
        };
        Ok(ExecutorOptions {
            memory_limit: self.executor_memory,
            spill_dir,
            concurrent_tasks: self.partitions,
        })
    }
}

async fn run_query(ctx: &SessionContext, query: &QueryArgs) -> Result<()> {
    for (name, path) in &query.tables {
        ctx.register_parquet(name, path, ParquetReadOptions::default())
            .await?;
    }
    let started = Instant::now();
    let batches = ctx.sql(&query.query).await?.collect().await?;
    println!("{}", pretty_format_batches(&batches)?);
    eprintln!("query took {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Local {
            executors,
            executor,
            query,
        } => {
            let options = (0..executors)
                .map(|i| executor.options(i))
                .collect::<std::io::Result<Vec<_>>>()?;
            let cluster = Cluster::start(&options, executor.partitions).await?;
            let mut config = session_config(executor.partitions);
            for (key, value) in &query.settings {
                config.options_mut().set(key, value)?;
            }
            run_query(&client(cluster.scheduler(), config).await?, &query).await
        }
        Command::Scheduler { partitions } => {
            let address = start_scheduler(partitions).await?;
            println!("{address}");
            std::future::pending::<()>().await;
            Ok(())
        }
        Command::Executor {
            scheduler,
            executor,
        } => {
            let options = executor.options(std::process::id() as usize)?;
            start_executor(scheduler, &options, executor.partitions).await?;
            std::future::pending::<()>().await;
            Ok(())
        }
        Command::Sql { scheduler, query } => {
            let mut config = session_config(2);
            for (key, value) in &query.settings {
                config.options_mut().set(key, value)?;
            }
            run_query(&client(scheduler, config).await?, &query).await
        }
    }
}
