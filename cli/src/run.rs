//! `spilljoin join`: open the inputs, plan, then run — or only explain.
//!
//! ```text
//!  open inputs ─► plan (columns, filter, statistics, build side) ─► --explain? print, stop
//!      │
//!      ▼
//!  spill manager (private dir under --spill-dir; stale ones removed) ─► output's
//!  temporary file (orphaned ones removed)
//!      ─► input streams (counted) ─► JoinStream ──► write each batch ─► rename output
//!             │                         │ cancel handle ─► signal watcher
//!             │                         └ metrics handle ─► progress line
//!             └─ the end, in any way: stream dropped (spill files gone), summary,
//!                --metrics report
//! ```

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::Result;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use spilljoin::spill::{SpillConfig, SpillError, SpillManager};
use spilljoin::{HashJoin, InputStatistics, JoinError, JoinMetrics, NullEquality, Side};

use super::args::JoinArgs;
use super::failure::{kind_of, one_line, signal_exit_code, Kind};
use super::format::CsvOptions;
use super::input::{BatchStream, Input, InputOptions, ReadCounters};
use super::metrics::{self, Outcome, Reads};
use super::output::{OutputSpec, OutputWriter};
use super::plan::{JoinRequest, Plan};
use super::progress::{human_bytes, Progress, SideProgress};
use super::pushdown::{ProbePushdown, PushdownCounters};
use super::signals::{signal_name, Interrupt};
use super::stale::StaleRemoved;

/// Runs `spilljoin join`.
///
/// # Errors
/// Whatever stops it, tagged with its kind (see [`super::failure`]).
pub fn join(args: JoinArgs, interrupt: &Interrupt) -> Result<()> {
    let csv = CsvOptions {
        delimiter: args.csv_delimiter,
        header: !args.csv_no_header,
    };
    let options = |format, schema_override: &Option<String>| InputOptions {
        format,
        schema_override: schema_override.clone(),
        csv,
        infer_rows: args.infer_rows,
    };
    let left = Input::open(
        Side::Left,
        &args.left,
        &options(args.left_format, &args.left_schema),
    )?;
    let right = Input::open(
        Side::Right,
        &args.right,
        &options(args.right_format, &args.right_schema),
    )?;
    let output = OutputSpec::new(
        args.output.as_deref(),
        args.output_format,
        args.compression.as_deref(),
        csv,
    )?;
    let plan = Plan::new(JoinRequest {
        left,
        right,
        on: args.on.iter().flatten().cloned().collect(),
        join_type: args.join_type,
        null_equality: if args.null_equals_null {
            NullEquality::NullEqualsNull
        } else {
            NullEquality::NullEqualsNothing
        },
        select: args.select,
        filter: args.filter,
        output,
        swap: !args.no_swap,
        pushdown: args.pushdown,
        run: args.run,
    })?;
    if args.explain {
        print!("{}", plan.explain());
        return Ok(());
    }
    execute(&plan, interrupt)
}

/// Runs a planned join: writes its output, prints the summary, writes the metrics.
///
/// # Errors
/// As [`join`].
pub fn execute(plan: &Plan, interrupt: &Interrupt) -> Result<()> {
    let start = Instant::now();
    let counters = (
        Arc::new(ReadCounters::default()),
        Arc::new(ReadCounters::default()),
    );
    let mut counts = Counts::default();
    let pushed = Arc::new(PushdownCounters::default());
    let result = run(plan, interrupt, &counters, &pushed, &mut counts);
    let result = match result {
        // The reader of stdout has all it wanted (`spilljoin ... | head`).
        Err(e) if stdout_closed(&e, &plan.request.output) => Ok(()),
        other => other.map_err(|e| with_hints(e, plan)),
    };
    let (status, exit_code, error) = ending(&result, interrupt);
    let elapsed = start.elapsed();
    if let Some(path) = &plan.request.run.metrics {
        let outcome = Outcome {
            status,
            exit_code,
            error,
            output_rows: counts.rows,
            elapsed,
        };
        let reads = Reads {
            left: &counters.0,
            right: &counters.1,
            pushdown: &pushed,
        };
        let report = metrics::report(plan, &counts.metrics, &reads, &outcome, &counts.stale);
        let written = metrics::write(path, &report);
        // The join's own error matters more than the report's.
        if result.is_ok() {
            written?;
        }
    }
    result?;
    if !plan.request.run.quiet {
        summary(plan, counts.rows, elapsed, &counts.metrics, &pushed);
    }
    Ok(())
}

/// How a run ended, for `--metrics`: its status (`ok`, `interrupted`, `failed`),
/// exit code, and error line.
pub fn ending(result: &Result<()>, interrupt: &Interrupt) -> (&'static str, i32, Option<String>) {
    match (result, interrupt.signal()) {
        (Ok(()), _) => ("ok", 0, None),
        (Err(_), Some(signal)) => (
            "interrupted",
            signal_exit_code(signal),
            Some(format!("stopped by {}", signal_name(signal))),
        ),
        (Err(e), None) => ("failed", kind_of(e).exit_code(), Some(one_line(e))),
    }
}

/// What a run counts, filled in however it ends.
#[derive(Default)]
struct Counts {
    /// Output rows written (or counted).
    rows: u64,
    /// The join's figures.
    metrics: JoinMetrics,
    /// What killed joins left, removed at the start.
    stale: StaleRemoved,
}

/// The run itself; `counts` are filled in however it ends.
fn run(
    plan: &Plan,
    interrupt: &Interrupt,
    counters: &(Arc<ReadCounters>, Arc<ReadCounters>),
    pushed: &Arc<PushdownCounters>,
    counts: &mut Counts,
) -> Result<()> {
    check_before_writing(plan)?;
    if !plan.limit_given {
        super::allocator::keep_freed_memory();
    }
    let (join, mut writer) = create_join_and_output(plan, interrupt, &mut counts.stale)?;
    let pushdown = probe_pushdown(plan, &join, pushed);
    let (left, right) = open_streams(plan, &join, counters, pushdown.as_ref())?;
    interrupted(interrupt)?;
    let mut stream = match pushdown {
        Some(pushdown) => {
            // Only the probe readers keep the build's handle, so its memory goes when
            // they are done.
            let slot = Arc::clone(&pushdown.build);
            drop(pushdown);
            join.execute_partitioned_observed(left, right, move |build| {
                let _ = slot.set(build.clone());
            })?
        }
        None => join.execute_partitioned(left, right)?,
    };
    interrupt.watch(stream.cancel_handle());

    let (build, probe) = side_progress(plan, &join, counters);
    let _trim =
        super::allocator::ReleaseOnPhaseChange::start(stream.metrics_handle(), plan.limit_bytes);
    let progress = Progress::start(
        plan.request.run.quiet,
        stream.metrics_handle(),
        build,
        probe,
        plan.limit_bytes,
    );
    let schema = plan.rename.then_some(&plan.schema);
    let written = write_all(stream.by_ref(), &mut writer, schema, &mut counts.rows);
    progress.finish();
    counts.metrics = stream.metrics();
    // Dropping the stream ends the join and removes its spill files.
    drop(stream);
    written?;
    interrupted(interrupt)?;
    writer.finish()
}

/// What must fail before anything is written: an output that would overwrite an
/// input, and a metrics file that cannot be written (now, not after the output is in
/// place).
fn check_before_writing(plan: &Plan) -> Result<()> {
    let r = &plan.request;
    let inputs: Vec<&std::path::Path> = r
        .left
        .files()
        .iter()
        .chain(r.right.files())
        .map(|p| p.as_path())
        .collect();
    check_outputs(&r.output, &inputs, r.run.metrics.as_deref())
}

/// Fails if `output` is one of `inputs`, or if the `metrics` file cannot be written.
///
/// # Errors
/// A definition failure (the output is an input) or an output failure (metrics).
pub fn check_outputs(
    output: &OutputSpec,
    inputs: &[&std::path::Path],
    metrics: Option<&std::path::Path>,
) -> Result<()> {
    output.refuse_to_overwrite(inputs)?;
    if let Some(path) = metrics {
        super::metrics::check_writable(path)?;
    }
    Ok(())
}

/// The join with its spill manager, and the output's writer; both the spill
/// directory and the output's temporary file are removed if a signal forces an exit.
/// What killed joins left in the spill directory (removed by the spill manager) and
/// beside the output (removed here) goes into `stale`, and is told on stderr.
fn create_join_and_output(
    plan: &Plan,
    interrupt: &Interrupt,
    stale: &mut StaleRemoved,
) -> Result<(HashJoin, OutputWriter)> {
    let spill = spill_manager(
        &plan.spill,
        &plan.request.output,
        interrupt,
        plan.request.run.quiet,
        stale,
    )?;
    let join = plan.builder.clone().with_spill_manager(spill).build()?;
    let writer = plan.request.output.create(&plan.schema)?;
    if let Some(temp) = writer.temporary_path() {
        interrupt.remove_on_forced_exit(temp.to_path_buf());
    }
    Ok((join, writer))
}

/// A spill manager: its private directory under `config`'s root (removed if a
/// signal forces an exit), with the stale directories of killed runs there
/// removed, and the orphaned temporary files of `output` removed; what was removed
/// goes into `stale` and, unless `quiet`, is told on stderr.
///
/// # Errors
/// The spill directory cannot be created.
pub fn spill_manager(
    config: &SpillConfig,
    output: &OutputSpec,
    interrupt: &Interrupt,
    quiet: bool,
    stale: &mut StaleRemoved,
) -> Result<SpillManager> {
    let spill = SpillManager::new(config.clone())?;
    interrupt.remove_on_forced_exit(spill.dir().to_path_buf());
    let outputs = output.remove_stale_temporaries();
    *stale = StaleRemoved::of(spill.stale_dirs_removed(), &outputs);
    super::stale::warn_failures(spill.stale_dirs_removed(), spill.dir().parent(), &outputs);
    if let Some(line) = stale.line().filter(|_| !quiet) {
        eprintln!("{line}");
    }
    Ok(spill)
}

/// What the probe scan is to skip, if pushdown applies: it learns the build's facts
/// when the build is done (its readers open after that).
fn probe_pushdown(
    plan: &Plan,
    join: &HashJoin,
    pushed: &Arc<PushdownCounters>,
) -> Option<Arc<ProbePushdown>> {
    let r = &plan.request;
    plan.pushdown_applies().then(|| {
        let probe_keys =
            r.on.iter()
                .map(|(l, rr)| match join.build_side() {
                    Side::Right => l.clone(),
                    Side::Left => rr.clone(),
                })
                .collect();
        Arc::new(ProbePushdown {
            build: Arc::new(OnceLock::new()),
            keys: probe_keys,
            mode: r.pushdown,
            null_equality: r.null_equality,
            counters: Arc::clone(pushed),
        })
    })
}

/// The left and right inputs' batch streams, the probe side's with `pushdown`.
fn open_streams(
    plan: &Plan,
    join: &HashJoin,
    counters: &(Arc<ReadCounters>, Arc<ReadCounters>),
    pushdown: Option<&Arc<ProbePushdown>>,
) -> Result<(Vec<BatchStream>, Vec<BatchStream>)> {
    let r = &plan.request;
    let (batch_size, threads) = (r.run.batch_size, plan.threads);
    let for_side = |side: Side| pushdown.filter(|_| join.build_side() != side);
    // The build input is read in larger batches when memory allows (the join
    // partitions a batch at a time), and when its size is known; wide rows on
    // either side in smaller ones (`read_rows`).
    let read_rows = |side: Side, stats: InputStatistics, known: bool| {
        let larger = join.build_side() == side && known;
        read_rows(batch_size, plan.limit_bytes, threads, stats, larger)
    };
    let left_known = r.left.bytes_known(&plan.left_columns);
    let right_known = r.right.bytes_known(&plan.right_columns);
    let readers = |pages: u64| super::plan::readers(threads, plan.limit_given, pages);
    let left = r.left.streams(
        &plan.left_columns,
        read_rows(Side::Left, plan.left_stats, left_known),
        readers(r.left.page_bytes(&plan.left_columns)),
        &counters.0,
        for_side(Side::Left),
    )?;
    let right = r.right.streams(
        &plan.right_columns,
        read_rows(Side::Right, plan.right_stats, right_known),
        readers(r.right.page_bytes(&plan.right_columns)),
        &counters.1,
        for_side(Side::Right),
    )?;
    Ok((left, right))
}

/// What the progress line shows of the build and the probe input.
fn side_progress(
    plan: &Plan,
    join: &HashJoin,
    counters: &(Arc<ReadCounters>, Arc<ReadCounters>),
) -> (SideProgress, SideProgress) {
    let side = |input: &Input, counters: &Arc<ReadCounters>| SideProgress {
        counters: Arc::clone(counters),
        rows_total: input.rows(),
        file_bytes_total: input.file_bytes().ok(),
    };
    let left = side(&plan.request.left, &counters.0);
    let right = side(&plan.request.right, &counters.1);
    match join.build_side() {
        Side::Left => (left, right),
        Side::Right => (right, left),
    }
}

/// Rows per batch of an input. A decoded batch is held whole while the join works
/// through it in pieces, and the join reserves only the piece: so `threads` batches
/// are kept to about a sixteenth of the limit, with fewer rows than the batch size
/// when rows are wide (8192 rows of 2 KB are 16 MiB: under a small limit, a few
/// readers' batches of them alone take the peak RSS past its bound), and, when
/// `larger` (the build side, whose size is known), with up to 64Ki rows when they
/// are narrow.
fn read_rows(
    batch_size: usize,
    limit_bytes: u64,
    threads: usize,
    stats: InputStatistics,
    larger: bool,
) -> usize {
    let (Some(bytes), Some(rows)) = (stats.bytes, stats.rows) else {
        return batch_size;
    };
    let row_bytes = (bytes / rows.max(1)).max(1);
    // (Saturating: `row_bytes` comes from a file's footer.)
    let by_memory = limit_bytes / (16 * threads.max(1) as u64).saturating_mul(row_bytes);
    let by_memory = by_memory.min(usize::MAX as u64) as usize;
    let most = if larger {
        BUILD_READ_ROWS.max(batch_size)
    } else {
        batch_size
    };
    by_memory.clamp(MIN_READ_ROWS.min(batch_size), most)
}

/// The fewest rows per batch of an input, however wide (unless the batch size is
/// smaller): below this a reader's per-batch work outweighs the bytes saved.
const MIN_READ_ROWS: usize = 128;

/// The most rows per batch of the build input.
const BUILD_READ_ROWS: usize = 64 * 1024;

/// Fails if a signal came.
pub fn interrupted(interrupt: &Interrupt) -> Result<()> {
    match interrupt.signal() {
        Some(signal) => Err(anyhow::anyhow!("stopped by {}", signal_name(signal))),
        None => Ok(()),
    }
}

/// Writes (or counts) every output batch of `batches`, under `schema` (its column
/// names, its nullability) if given and the batch's differs.
pub fn write_all<E>(
    batches: impl Iterator<Item = Result<RecordBatch, E>>,
    writer: &mut OutputWriter,
    schema: Option<&SchemaRef>,
    rows: &mut u64,
) -> Result<()>
where
    anyhow::Error: From<E>,
{
    for batch in batches {
        let mut batch = batch?;
        if let Some(schema) = schema.filter(|s| **s != batch.schema()) {
            batch = RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())?;
        }
        writer.write(&batch)?;
        *rows += batch.num_rows() as u64;
    }
    Ok(())
}

/// Whether `e` is a write to a stdout whose reader has gone (`spilljoin ... | head`):
/// not a failure, only the end of the output.
pub fn stdout_closed(e: &anyhow::Error, output: &OutputSpec) -> bool {
    output.is_stdout()
        && e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                || c.to_string().contains("Broken pipe")
        })
}

/// The limit at which every join is tested to finish (the library's
/// `tests/spill_harness.rs`),
/// with batches of up to [`spilljoin::DEFAULT_BATCH_SIZE_ROWS`] rows and up to
/// [`FLOOR_THREADS`] threads; larger batches and more threads need proportionally
/// more.
const FLOOR_BYTES: u64 = 4 << 20;

/// The most threads [`FLOOR_BYTES`] is tested with.
const FLOOR_THREADS: usize = 4;

/// The floor of a join with `batch_size` rows per batch and `threads` threads.
fn floor_bytes(batch_size: usize, threads: usize) -> u64 {
    let batches = batch_size
        .div_ceil(spilljoin::DEFAULT_BATCH_SIZE_ROWS)
        .max(1) as u64;
    let threads = threads.div_ceil(FLOOR_THREADS).max(1) as u64;
    FLOOR_BYTES * batches * threads
}

/// Errors a person can act on, with what to do: a join out of memory is told as
/// the limit being below its floor (and says the floor); a full spill quota or
/// disk says which flag to change.
fn with_hints(e: anyhow::Error, plan: &Plan) -> anyhow::Error {
    let join_error = e.chain().find_map(|c| c.downcast_ref::<JoinError>());
    if let Some(JoinError::ResourcesExhausted { .. }) = join_error {
        let floor = floor_bytes(plan.request.run.batch_size, plan.threads);
        // The pool's own words: what was refused, and the largest consumers.
        let refused = e
            .chain()
            .last()
            .map_or_else(|| e.to_string(), |c| c.to_string());
        // The floor is what joins of ordinary rows are tested to finish in (the
        // library's tests/spill_harness.rs); joins of wide rows are tested to finish
        // from twice their largest batch (its tests/floor.rs).
        let suggest = floor.max(plan.limit_bytes.saturating_mul(2));
        return Kind::Memory.error(format!(
            "memory limit {} is too small for this join: {refused}; joins with --batch-size {} and {} threads \
             finish from {} (and from twice their largest batch when rows are wide): rerun with \
             --memory-limit {}MiB or more",
            human_bytes(plan.limit_bytes),
            plan.request.run.batch_size,
            plan.threads,
            human_bytes(floor),
            suggest.div_ceil(1 << 20),
        ));
    }
    let spill_error = e.chain().find_map(|c| c.downcast_ref::<SpillError>());
    let hint = match spill_error {
        Some(SpillError::QuotaExceeded { quota_bytes, .. }) => Some(format!(
            "the spill files need more than --max-spill-size {}: raise it, or --memory-limit to spill less",
            human_bytes(*quota_bytes)
        )),
        Some(SpillError::Io { source, .. }) if source.kind() == std::io::ErrorKind::StorageFull => {
            Some("the disk of --spill-dir is full: free space, or point --spill-dir at a larger disk".into())
        }
        _ => None,
    };
    match hint {
        Some(hint) => Kind::Spill.error(format!("{}; {hint}", one_line(&e))),
        None => e,
    }
}

/// The lines on stderr after a join: rows, time, phases, memory, spilling.
fn summary(
    plan: &Plan,
    rows: u64,
    elapsed: std::time::Duration,
    m: &JoinMetrics,
    pushed: &PushdownCounters,
) {
    eprintln!(
        "rows: {rows} elapsed: {:.3} s (build {:.3} s, probe {:.3} s; build rows {}, probe rows {}; peak reserved {} of {})",
        elapsed.as_secs_f64(),
        m.build_time.as_secs_f64(),
        m.probe_time.as_secs_f64(),
        m.build_rows,
        m.probe_rows,
        human_bytes(m.peak_reserved_bytes),
        human_bytes(plan.limit_bytes),
    );
    if plan.pushdown_applies() {
        let get = PushdownCounters::get;
        eprintln!(
            "pushdown: probe scan skipped {} of {} row groups, {} pages, {} rows ({}) by key bounds; {} of {} rows dropped by build membership",
            get(&pushed.row_groups_skipped),
            get(&pushed.row_groups),
            get(&pushed.pages_skipped),
            get(&pushed.rows_skipped_by_bounds),
            human_bytes(get(&pushed.bytes_skipped)),
            get(&pushed.rows_dropped_by_membership),
            get(&pushed.rows_tested),
        );
    }
    if m.spill_files > 0 {
        eprintln!(
            "spilled: build {} rows ({}, {} writes), probe {} rows ({}, {} writes) in {} files; {} partitions, depth {}, {} fallbacks; {} probe rows skipped by bloom filters; spilled pairs took {:.3} s",
            m.build_rows_spilled,
            human_bytes(m.build_bytes_spilled),
            m.build_batches_spilled,
            m.probe_rows_spilled,
            human_bytes(m.probe_bytes_spilled),
            m.probe_batches_spilled,
            m.spill_files,
            m.partitions_spilled,
            m.max_depth,
            m.fallbacks,
            m.probe_rows_skipped,
            m.spilled_time.as_secs_f64(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rows: u64, row_bytes: u64) -> InputStatistics {
        InputStatistics {
            bytes: Some(rows * row_bytes),
            rows: Some(rows),
        }
    }

    #[test]
    fn wide_rows_are_read_in_fewer_rows_and_narrow_builds_in_more() {
        let limit = 64 << 20;
        // 2 KB rows: two threads' batches within a sixteenth of the limit.
        let wide = read_rows(8192, limit, 2, stats(400_000, 2048), false);
        assert_eq!(wide, (limit / (16 * 2 * 2048)) as usize);
        assert!(2 * wide * 2048 <= (limit / 16) as usize);
        // The same as the build: as few, whether or not it could be read larger.
        assert_eq!(read_rows(8192, limit, 2, stats(400_000, 2048), true), wide);
        // Narrow rows: the batch size, or up to 64Ki rows for the build.
        assert_eq!(read_rows(8192, limit, 2, stats(1 << 20, 16), false), 8192);
        assert_eq!(
            read_rows(8192, limit, 2, stats(1 << 20, 16), true),
            BUILD_READ_ROWS
        );
        // However wide, at least MIN_READ_ROWS (unless the batch size is smaller);
        // nothing known, the batch size.
        let huge = stats(1000, 64 << 20);
        assert_eq!(read_rows(8192, limit, 2, huge, false), MIN_READ_ROWS);
        assert_eq!(read_rows(100, limit, 2, huge, false), 100);
        assert_eq!(
            read_rows(8192, limit, 2, InputStatistics::default(), true),
            8192
        );
        // A footer's absurd size does not overflow (found in review).
        let absurd = stats(1, 1 << 60);
        assert_eq!(read_rows(8192, limit, 1, absurd, false), MIN_READ_ROWS);
    }
}
