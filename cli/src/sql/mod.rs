//! `spilljoin sql`: a SQL query over files, run by DataFusion with spilljoin's
//! joins, its result written as `join` writes its output.
//!
//! ```text
//!  --table NAME=PATH ─► files, format (as `join` finds them)
//!  spill manager (private dir under --spill-dir; stale ones removed) ─► tokio
//!  runtime (N workers) ─► session (fair spill pool, DiskManager in the spill dir,
//!  SpilljoinRule) ─► tables registered ─► statements planned, all but the last run
//!      ─► physical plan of the last ─► --explain? print, stop
//!      ─► output's temporary file ─► execute_stream ─► each batch written as it
//!         comes (a signal ends the wait for the next one) ─► rename output
//!      └─ the end, in any way: stream dropped (the operators' spill files gone),
//!         runtime shut down, spill dir removed, summary, --metrics report
//! ```
//!
//! Modules: [`session`] (the session and its tables), [`diagnose`] (DataFusion's
//! errors as exit codes; which operator ran out of memory), [`report`] (the plan's
//! figures and the `--metrics` JSON).

mod diagnose;
mod report;
mod session;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{execute_stream, ExecutionPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::DFParser;
use futures::StreamExt;
use spilljoin::spill::SpillConfig;
use tokio::runtime::Runtime;
use tokio::sync::watch;

use crate::args::SqlArgs;
use crate::failure::Kind;
use crate::format::CsvOptions;
use crate::metrics::{self, Outcome};
use crate::output::OutputSpec;
use crate::progress::{count, human_bytes, Progress, Styles};
use crate::run::{check_outputs, ending, interrupted, spill_manager, stdout_closed, write_all};
use crate::signals::Interrupt;
use diagnose::{diagnose, Limits};
use report::{Counts, PlanFigures, Setup};
use session::{Settings, Table};

/// How long the runtime's tasks get to stop when the query has ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs `spilljoin sql`.
///
/// # Errors
/// Whatever stops it, tagged with its kind (see [`crate::failure`] and
/// [`diagnose`]).
pub fn run(args: SqlArgs, interrupt: &Interrupt) -> Result<()> {
    let query = query_text(&args)?;
    let tables = session::locate_tables(&args.tables)?;
    let csv = CsvOptions {
        delimiter: args.csv_delimiter,
        header: !args.csv_no_header,
    };
    let output = OutputSpec::new(
        args.output.as_deref(),
        args.output_format,
        args.compression.as_deref(),
        csv,
    )?;
    if args.explain_analyze && output.is_stdout() {
        return Err(Kind::Definition.error(
            "--explain-analyze prints the plan on stdout: write the result with --output PATH, or leave --output out",
        ));
    }
    let settings = Settings::of(&args.run);
    let limits = Limits {
        limit_bytes: settings.limit_bytes,
        max_spill_bytes: settings.max_spill_bytes,
    };
    let query = Query {
        args: &args,
        text: &query,
        tables: &tables,
        csv,
        output: &output,
        settings: &settings,
    };
    let start = Instant::now();
    let mut counts = Counts::default();
    let result = match execute(&query, interrupt, &mut counts) {
        // The reader of stdout has all it wanted (`spilljoin sql ... | head`).
        Err(e) if stdout_closed(&e, &output) => Ok(()),
        other => other.map_err(|e| diagnose(e, limits)),
    };
    let elapsed = start.elapsed();
    if let (Some(path), false) = (&args.run.metrics, args.explain) {
        let (status, exit_code, error) = ending(&result, interrupt);
        let outcome = Outcome {
            status,
            exit_code,
            error,
            output_rows: counts.rows,
            elapsed,
        };
        let setup = Setup {
            settings: &settings,
            tables: &tables,
            spill_dir: args.run.spill_dir.as_deref(),
        };
        let written = metrics::write(path, &report::report(&setup, &counts, &outcome));
        // The query's own error matters more than the report's.
        if result.is_ok() {
            written?;
        }
    }
    result?;
    if !args.run.quiet && !args.explain {
        summary(&counts, elapsed, settings.limit_bytes);
    }
    Ok(())
}

/// Everything a run needs, resolved from the command line.
struct Query<'a> {
    args: &'a SqlArgs,
    text: &'a str,
    tables: &'a [Table],
    csv: CsvOptions,
    output: &'a OutputSpec,
    settings: &'a Settings,
}

/// The query, from the command line or `--file`.
fn query_text(args: &SqlArgs) -> Result<String> {
    match (&args.query, &args.file) {
        (Some(text), _) => Ok(text.clone()),
        (None, Some(path)) => std::fs::read_to_string(path).with_context(|| {
            Kind::Input.context(format!("cannot read the query from {}", path.display()))
        }),
        // clap requires one of them.
        (None, None) => Err(Kind::Definition.error("give a QUERY or --file FILE")),
    }
}

/// The run: the spill directory, the runtime, then the query on it; the runtime
/// is shut down before the spill directory goes.
fn execute(query: &Query, interrupt: &Interrupt, counts: &mut Counts) -> Result<()> {
    let files: Vec<&Path> = query
        .tables
        .iter()
        .flat_map(|t| t.files.iter().map(|p| p.as_path()))
        .collect();
    if !query.args.explain {
        check_outputs(query.output, &files, query.args.run.metrics.as_deref())?;
    }
    let spill_config = SpillConfig {
        root_dir: query.args.run.spill_dir.clone(),
        ..SpillConfig::default()
    };
    let quiet = query.args.run.quiet;
    let spill = spill_manager(
        &spill_config,
        query.output,
        interrupt,
        quiet,
        &mut counts.stale,
    )?;
    let runtime = session::runtime(query.settings.threads)?;
    let result = run_on(&runtime, spill.dir(), query, interrupt, counts);
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    // Only now: nothing writes into the directory any more.
    drop(spill);
    result
}

/// The query on `runtime`, spilling under `spill_dir`.
fn run_on(
    runtime: &Runtime,
    spill_dir: &Path,
    query: &Query,
    interrupt: &Interrupt,
    counts: &mut Counts,
) -> Result<()> {
    let _entered = runtime.enter();
    let session = session::session(query.settings, spill_dir)?;
    let ctx = &session.ctx;
    for table in query.tables {
        runtime.block_on(session::register(ctx, table, query.csv))?;
    }
    let frame = runtime.block_on(last_statement(ctx, query.text))?;
    let plan = runtime.block_on(frame.create_physical_plan())?;
    if query.args.explain {
        print!(
            "{}",
            DisplayableExecutionPlan::new(plan.as_ref()).indent(true)
        );
        return Ok(());
    }
    let result = stream_to_output(runtime, &plan, ctx, &session, query, interrupt, counts);
    counts.figures = PlanFigures::of(&plan);
    counts.peak_reserved_bytes = session.pool.peak_bytes() as u64;
    result?;
    if query.args.explain_analyze {
        let analyzed = DisplayableExecutionPlan::with_metrics(plan.as_ref()).indent(true);
        print!("{analyzed}");
    }
    Ok(())
}

/// Plans every statement of `text` in order and runs all but the last (`SET`,
/// `CREATE VIEW`, ...); the last one's frame, not yet run.
///
/// # Errors
/// A definition failure if `text` holds no statement; DataFusion's errors.
async fn last_statement(ctx: &SessionContext, text: &str) -> Result<DataFrame> {
    let mut statements = DFParser::parse_sql(text)?;
    let Some(last) = statements.pop_back() else {
        return Err(Kind::Definition.error("the query has no SQL statement"));
    };
    for statement in statements {
        let plan = ctx.state().statement_to_plan(statement).await?;
        ctx.execute_logical_plan(plan).await?.collect().await?;
    }
    let plan = ctx.state().statement_to_plan(last).await?;
    Ok(ctx.execute_logical_plan(plan).await?)
}

/// Executes `plan` and writes its batches as they come; a signal stops the wait.
fn stream_to_output(
    runtime: &Runtime,
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &SessionContext,
    session: &session::Session,
    query: &Query,
    interrupt: &Interrupt,
    counts: &mut Counts,
) -> Result<()> {
    let schema = plan.schema();
    let mut writer = query.output.create(&schema)?;
    if let Some(temp) = writer.temporary_path() {
        interrupt.remove_on_forced_exit(temp.to_path_buf());
    }
    let (stop, stopped) = watch::channel(false);
    interrupt.on_signal(move || {
        let _ = stop.send(true);
    });
    let rows = Arc::new(AtomicU64::new(0));
    let progress = query_progress(query, session, &rows);
    let stream = execute_stream(Arc::clone(plan), ctx.task_ctx())?;
    let batches = Batches {
        runtime,
        stream,
        stopped,
        rows,
    };
    let written = write_all(batches, &mut writer, Some(&schema), &mut counts.rows);
    progress.finish();
    written?;
    interrupted(interrupt)?;
    writer.finish()
}

/// The query's batches, one at a time: waits on `runtime` for the next, or for a
/// signal. Dropping it drops the stream, and with it the query's tasks.
struct Batches<'a> {
    runtime: &'a Runtime,
    stream: SendableRecordBatchStream,
    stopped: watch::Receiver<bool>,
    rows: Arc<AtomicU64>,
}

impl Iterator for Batches<'_> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let (stream, stopped) = (&mut self.stream, &mut self.stopped);
        let next = self.runtime.block_on(async {
            tokio::select! {
                biased;
                // (An error: the sender is gone, no signal can come any more.)
                Ok(_) = stopped.wait_for(|stop| *stop) => {
                    Some(Err(anyhow::anyhow!("stopped by a signal")))
                }
                next = stream.next() => next.map(|b| b.map_err(anyhow::Error::from)),
            }
        });
        if let Some(Ok(batch)) = &next {
            self.rows
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        }
        next
    }
}

/// The progress line of a query: result rows, memory reserved, spill on disk.
fn query_progress(query: &Query, session: &session::Session, rows: &Arc<AtomicU64>) -> Progress {
    let styles = Styles::default();
    let (rows, pool) = (Arc::clone(rows), Arc::clone(&session.pool));
    let spill_dir = session.spill_dir.clone();
    let limit_bytes = query.settings.limit_bytes;
    let start = Instant::now();
    let mut ticks = 0u64;
    let mut on_disk = 0u64;
    Progress::start_with(query.args.run.quiet, move |bar| {
        if let Some(style) = &styles.spinner {
            bar.set_style(style.clone());
        }
        // The spill directory is walked twice a second, not at every tick.
        if ticks.is_multiple_of(5) {
            on_disk = bytes_under(&spill_dir);
        }
        ticks += 1;
        bar.set_prefix("query");
        bar.set_message(format!(
            "{:.1} s · out {} rows · mem {}/{} · spill {} on disk",
            start.elapsed().as_secs_f64(),
            count(rows.load(Ordering::Relaxed)),
            human_bytes(pool.reserved() as u64),
            human_bytes(limit_bytes),
            human_bytes(on_disk),
        ));
    })
}

/// The bytes of the files under `dir`; what cannot be read counts nothing.
fn bytes_under(dir: &Path) -> u64 {
    let mut bytes = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => bytes = bytes.saturating_add(m.len()),
                Err(_) => {}
            }
        }
    }
    bytes
}

/// The lines on stderr after a query: rows, time, memory, spilling.
fn summary(counts: &Counts, elapsed: Duration, limit_bytes: u64) {
    let f = &counts.figures;
    eprintln!(
        "rows: {} elapsed: {:.3} s (peak reserved {} of {}; {} SpilljoinExec)",
        counts.rows,
        elapsed.as_secs_f64(),
        human_bytes(counts.peak_reserved_bytes),
        human_bytes(limit_bytes),
        match f.joins {
            1 => "1 join by".to_string(),
            n => format!("{n} joins by"),
        },
    );
    let joined = f.join("spilled_bytes") as u64;
    let others = f.others_spilled_bytes() as u64;
    if joined > 0 || others > 0 {
        eprintln!(
            "spilled: joins {} ({} build rows, {} probe rows; {} partitions, depth {}, {} fallbacks), other operators {}",
            human_bytes(joined),
            f.join("build_rows_spilled") as u64,
            f.join("probe_rows_spilled") as u64,
            f.join("partitions_spilled") as u64,
            f.join("max_depth") as u64,
            f.join("fallbacks") as u64,
            human_bytes(others),
        );
    }
}
