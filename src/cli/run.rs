//! `spilljoin join`: resolve columns, run the join, write or count the output.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema, SchemaRef};
use spilljoin::memory::{
    default_memory_limit_bytes, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinStream, JoinType, NullEquality, Side, MARK_COLUMN};

use super::args::{JoinArgs, RunArgs};
use super::io::{OutputWriter, ParquetInput};

/// A column the user named for the output.
enum Selected {
    /// A column of one input.
    Column { side: Side, name: String },
    /// The `mark` column of a mark join.
    Mark,
}

/// Runs `spilljoin join`.
pub fn join(args: &JoinArgs) -> Result<()> {
    let left = ParquetInput::open(&args.left)?;
    let right = ParquetInput::open(&args.right)?;
    let on: Vec<(String, String)> = args.on.iter().flatten().cloned().collect();
    let null_equality = if args.null_equals_null {
        NullEquality::NullEqualsNull
    } else {
        NullEquality::NullEqualsNothing
    };
    run_join(
        &left,
        &right,
        &on,
        args.join_type,
        null_equality,
        args.select.as_deref(),
        args.output.as_deref(),
        &args.run,
    )
}

/// Runs a join of two Parquet inputs and reports rows and time on stderr.
#[allow(clippy::too_many_arguments)]
pub fn run_join(
    left: &ParquetInput,
    right: &ParquetInput,
    on: &[(String, String)],
    join_type: JoinType,
    null_equality: NullEquality,
    select: Option<&[String]>,
    output: Option<&Path>,
    run: &RunArgs,
) -> Result<()> {
    let start = Instant::now();
    let sides = join_type.output_sides();
    let selected = select
        .map(|names| resolve_select(names, join_type, left.schema(), right.schema()))
        .transpose()?;
    // Columns each side must decode: its keys, then what the output needs.
    let needed = |side: Side, schema: &SchemaRef, keys: Vec<&String>| -> Result<Vec<usize>> {
        let mut names: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
        match &selected {
            Some(sel) => names.extend(sel.iter().filter_map(|s| match s {
                Selected::Column { side: s, name } if *s == side => Some(name.as_str()),
                _ => None,
            })),
            None if sides.contains(&side) => {
                names.extend(schema.fields().iter().map(|f| f.name().as_str()))
            }
            None => {}
        }
        let mut indices = Vec::new();
        for name in names {
            let i = schema
                .index_of(name)
                .map_err(|_| no_such_column(side, name, schema))?;
            if !indices.contains(&i) {
                indices.push(i);
            }
        }
        indices.sort_unstable();
        Ok(indices)
    };
    let left_cols = needed(
        Side::Left,
        left.schema(),
        on.iter().map(|(l, _)| l).collect(),
    )?;
    let right_cols = needed(
        Side::Right,
        right.schema(),
        on.iter().map(|(_, r)| r).collect(),
    )?;
    let left_schema = Arc::new(left.schema().project(&left_cols)?);
    let right_schema = Arc::new(right.schema().project(&right_cols)?);

    let limit = run.memory_limit.unwrap_or_else(default_memory_limit_bytes);
    let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(usize::try_from(limit).unwrap_or(usize::MAX)),
        NonZeroUsize::MIN.saturating_add(4),
    ));
    let spill = SpillManager::new(SpillConfig {
        root_dir: run.spill_dir.clone(),
        ..SpillConfig::default()
    })
    .context("cannot create the spill directory")?;
    let threads = run
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut builder = HashJoinBuilder::new(
        Arc::clone(&left_schema),
        Arc::clone(&right_schema),
        on.to_vec(),
    )
    .with_join_type(join_type)
    .with_null_equality(null_equality)
    .with_memory_pool(Arc::clone(&pool))
    .with_spill_manager(spill)
    .with_batch_size(run.batch_size)
    .with_threads(threads)
    .with_build_size_hint(right.uncompressed_bytes(&right_cols)?);
    if let Some(selected) = &selected {
        builder = builder.with_projection(project(selected, &left_schema, &right_schema, sides)?);
    }
    let join = builder.build()?;
    // The join names columns by what was decoded; selected columns keep the names they
    // have in the full output (`left.NAME` for a name both inputs have).
    let renamed = selected.as_ref().map(|selected| {
        Arc::new(output_schema(
            &join.schema(),
            selected,
            sides,
            left.schema(),
            right.schema(),
        ))
    });
    let schema = renamed.clone().unwrap_or_else(|| join.schema());

    if let Some(path) = output {
        refuse_to_overwrite(path, &[left, right])?;
    }
    let left_reader = left.read(&left_cols, run.batch_size, threads)?;
    let right_reader = right.read(&right_cols, run.batch_size, threads)?;
    let writer = OutputWriter::create(output, &schema)?;
    let mut stream = join.execute_partitioned(left_reader, right_reader)?;
    let rows = match write_all(&mut stream, writer, renamed.as_ref()) {
        Ok(rows) => rows,
        Err(e) => {
            // Leave no partial output behind.
            if let Some(path) = output {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
    };
    let metrics = stream.metrics();
    let elapsed = start.elapsed();
    if let Some(path) = &run.metrics {
        write_metrics(path, rows, elapsed, &metrics, limit)?;
    }
    eprintln!(
        "rows: {rows} elapsed: {:.3} s (build {:.3} s, probe {:.3} s; build rows {}, probe rows {}; peak reserved {:.1} MiB of {:.1} MiB)",
        elapsed.as_secs_f64(),
        metrics.build_time.as_secs_f64(),
        metrics.probe_time.as_secs_f64(),
        metrics.build_rows,
        metrics.probe_rows,
        metrics.peak_reserved_bytes as f64 / (1 << 20) as f64,
        limit as f64 / (1 << 20) as f64,
    );
    if let Some(summary) = spill_summary(&metrics) {
        eprintln!("{summary}");
    }
    Ok(())
}

/// Writes (or counts) every output batch, under `schema`'s column names if given,
/// and finishes the file. Returns the rows.
fn write_all(
    stream: &mut JoinStream,
    mut writer: OutputWriter,
    schema: Option<&SchemaRef>,
) -> Result<u64> {
    let mut rows = 0u64;
    for batch in stream.by_ref() {
        let mut batch = batch?;
        if let Some(schema) = schema {
            batch = RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())?;
        }
        rows += batch.num_rows() as u64;
        writer.write(&batch).context("cannot write the output")?;
    }
    writer.finish().context("cannot write the output")?;
    Ok(rows)
}

/// Fails if `output` is one of the inputs: creating it would truncate the input
/// before it is read.
fn refuse_to_overwrite(output: &Path, inputs: &[&ParquetInput]) -> Result<()> {
    let Ok(output_path) = std::fs::canonicalize(output) else {
        return Ok(()); // It does not exist yet.
    };
    for input in inputs {
        if std::fs::canonicalize(input.path()).is_ok_and(|p| p == output_path) {
            bail!(
                "--output {} is an input of the join: writing it would destroy the input",
                output.display()
            );
        }
    }
    Ok(())
}

/// The process's peak resident set size in bytes (Linux: `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Writes the figures of a finished join as a JSON object.
fn write_metrics(
    path: &std::path::Path,
    output_rows: u64,
    elapsed: std::time::Duration,
    m: &spilljoin::JoinMetrics,
    limit_bytes: u64,
) -> Result<()> {
    // A flat object of numbers: no serializer needed.
    let fields: [(&str, String); 19] = [
        ("output_rows", output_rows.to_string()),
        ("elapsed_seconds", format!("{:.6}", elapsed.as_secs_f64())),
        (
            "build_seconds",
            format!("{:.6}", m.build_time.as_secs_f64()),
        ),
        (
            "probe_seconds",
            format!("{:.6}", m.probe_time.as_secs_f64()),
        ),
        (
            "spilled_partitions_seconds",
            format!("{:.6}", m.spilled_time.as_secs_f64()),
        ),
        ("build_rows", m.build_rows.to_string()),
        ("probe_rows", m.probe_rows.to_string()),
        ("build_rows_spilled", m.build_rows_spilled.to_string()),
        ("build_bytes_spilled", m.build_bytes_spilled.to_string()),
        ("probe_rows_spilled", m.probe_rows_spilled.to_string()),
        ("probe_bytes_spilled", m.probe_bytes_spilled.to_string()),
        (
            "probe_rows_skipped_by_bloom",
            m.probe_rows_skipped.to_string(),
        ),
        ("spill_files", m.spill_files.to_string()),
        ("partitions_spilled", m.partitions_spilled.to_string()),
        ("max_recursion_depth", m.max_depth.to_string()),
        ("fallbacks", m.fallbacks.to_string()),
        ("peak_reserved_bytes", m.peak_reserved_bytes.to_string()),
        ("memory_limit_bytes", limit_bytes.to_string()),
        (
            "peak_rss_bytes",
            peak_rss_bytes().map_or("null".into(), |b| b.to_string()),
        ),
    ];
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("  \"{k}\": {v}"))
        .collect();
    let json = format!("{{\n{}\n}}\n", body.join(",\n"));
    std::fs::write(path, json)
        .with_context(|| format!("cannot write metrics to {}", path.display()))
}

/// The stderr summary of what was spilled, if anything.
fn spill_summary(m: &spilljoin::JoinMetrics) -> Option<String> {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    (m.spill_files > 0).then(|| {
        format!(
            "spilled: build {} rows ({:.1} MiB), probe {} rows ({:.1} MiB) in {} files; {} partitions, depth {}, {} fallbacks; {} probe rows skipped by bloom filters; spilled pairs took {:.3} s",
            m.build_rows_spilled,
            mib(m.build_bytes_spilled),
            m.probe_rows_spilled,
            mib(m.probe_bytes_spilled),
            m.spill_files,
            m.partitions_spilled,
            m.max_depth,
            m.fallbacks,
            m.probe_rows_skipped,
            m.spilled_time.as_secs_f64(),
        )
    })
}

fn no_such_column(side: Side, name: &str, schema: &Schema) -> anyhow::Error {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    anyhow::anyhow!(
        "no column {name:?} in the {side} input (it has: {})",
        names.join(", ")
    )
}

fn resolve_select(
    names: &[String],
    join_type: JoinType,
    left: &Schema,
    right: &Schema,
) -> Result<Vec<Selected>> {
    let sides = join_type.output_sides();
    names
        .iter()
        .map(|raw| {
            let (side, name) = match raw.split_once('.') {
                Some(("left", name)) => (Some(Side::Left), name),
                Some(("right", name)) => (Some(Side::Right), name),
                _ => (None, raw.as_str()),
            };
            // In a mark join, `mark` is the mark column (`left.mark` a left column).
            if side.is_none() && name == MARK_COLUMN && join_type == JoinType::LeftMark {
                return Ok(Selected::Mark);
            }
            let in_left = left.index_of(name).is_ok() && sides.contains(&Side::Left);
            let in_right = right.index_of(name).is_ok() && sides.contains(&Side::Right);
            let side = match (side, in_left, in_right) {
                (Some(s), _, _) if !sides.contains(&s) => {
                    bail!("--select {raw}: this join type outputs no {s} columns")
                }
                (Some(Side::Left), false, _) => {
                    return Err(no_such_column(Side::Left, name, left))
                        .with_context(|| format!("--select {raw}"));
                }
                (Some(Side::Right), _, false) => {
                    return Err(no_such_column(Side::Right, name, right))
                        .with_context(|| format!("--select {raw}"));
                }
                (Some(s), _, _) => s,
                (None, true, true) => {
                    bail!("--select {raw} is on both sides: write left.{name} or right.{name}")
                }
                (None, true, false) => Side::Left,
                (None, false, true) => Side::Right,
                (None, false, false) => bail!("--select {raw}: no such output column"),
            };
            Ok(Selected::Column {
                side,
                name: name.to_string(),
            })
        })
        .collect()
}

/// The output projection (indices into the join's full output) for the selection.
fn project(
    selected: &[Selected],
    left: &Schema,
    right: &Schema,
    sides: &[Side],
) -> Result<Vec<usize>> {
    selected
        .iter()
        .map(|s| {
            let mut offset = 0;
            for &side in sides {
                let schema = if side == Side::Left { left } else { right };
                match s {
                    Selected::Column { side: s, name } if *s == side => {
                        return Ok(offset + schema.index_of(name)?);
                    }
                    _ => offset += schema.fields().len(),
                }
            }
            match s {
                // The mark column comes after every input column.
                Selected::Mark => Ok(offset),
                Selected::Column { name, .. } => bail!("--select {name}: not an output column"),
            }
        })
        .collect()
}

/// The schema of a selected output: the join's, with each column named as in the
/// full output of `left` and `right` (`side.NAME` if both inputs have NAME and the
/// output carries both sides).
fn output_schema(
    joined: &Schema,
    selected: &[Selected],
    sides: &[Side],
    left: &Schema,
    right: &Schema,
) -> Schema {
    let fields: Vec<Field> = joined
        .fields()
        .iter()
        .zip(selected)
        .map(|(field, s)| {
            let name = match s {
                Selected::Mark => MARK_COLUMN.to_string(),
                Selected::Column { side, name } => {
                    let shared = sides.len() == 2
                        && left.index_of(name).is_ok()
                        && right.index_of(name).is_ok();
                    if shared {
                        format!("{side}.{name}")
                    } else {
                        name.clone()
                    }
                }
            };
            field.as_ref().clone().with_name(name)
        })
        .collect();
    Schema::new_with_metadata(fields, joined.metadata().clone())
}
