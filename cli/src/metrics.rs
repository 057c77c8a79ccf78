//! The `--metrics` report: what a run did, as JSON, written also when it fails.
//!
//! ```json
//! {
//!   "status": "ok",                       // or "failed" / "interrupted", with "error"
//!   "exit_code": 0,
//!   "elapsed_seconds": 1.84,
//!   "output_rows": 1199001,
//!   "build_side": "right", "build_side_reason": "...",
//!   "phases": { "build": {"seconds": ..}, "probe": {..}, "spilled_partitions": {..} },
//!   "inputs": { "left": {"path", "format", "files", "rows_read", "bytes_read", "file_bytes_read",
//!                        "estimated_bytes", "rows_in_metadata"}, "right": {..} },
//!   "build": { "rows", "rows_spilled", "bytes_spilled" },
//!   "probe": { "rows", "rows_spilled", "bytes_spilled", "rows_skipped_by_bloom" },
//!   "spill": { "files", "partitions_spilled", "max_recursion_depth", "fallbacks", "hot_key_splits", "swapped_pairs", "dir", "compression",
//!              "max_bytes", "direct_io", "direct_read_ahead", "direct_writes_behind",
//!              "direct_io_reason" },
//!   "memory": { "limit_bytes", "reader_pages_in_limit_bytes" (a reader's pages
//!     beyond 32 MiB, taken out of the join's pool), "direct_io_buffers_in_limit_bytes"
//!     (likewise, the direct I/O buffers), "peak_reserved_bytes", "peak_rss_bytes" },
//!   "stale_removed": { "spill_dirs", "spill_dir_bytes", "temporary_outputs",
//!                      "temporary_output_bytes", "failures" },  // left by killed joins
//!   ...the same figures flat, as earlier versions wrote them
//! }
//! ```
//!
//! The README's memory-limit section says what each figure means.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use spilljoin::JoinMetrics;

use super::failure::Kind;
use super::format::Format;
use super::input::{Input, ReadCounters};
use super::plan::Plan;
use super::pushdown::PushdownCounters;
use super::stale::StaleRemoved;

/// How a run ended.
pub struct Outcome<'a> {
    /// `ok`, `failed` or `interrupted`.
    pub status: &'a str,
    /// The process's exit code.
    pub exit_code: i32,
    /// The error line, if it failed.
    pub error: Option<String>,
    /// Rows written (or counted).
    pub output_rows: u64,
    /// Wall time from the start.
    pub elapsed: Duration,
}

/// What each input read.
pub struct Reads<'a> {
    /// Left input counters.
    pub left: &'a ReadCounters,
    /// Right input counters.
    pub right: &'a ReadCounters,
    /// What the probe scan skipped.
    pub pushdown: &'a PushdownCounters,
}

/// The process's peak resident set size in bytes (Linux: `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The report as JSON: the outcome and the plan's choices, then a section per part
/// of the run, then the same figures flat.
pub fn report(
    plan: &Plan,
    m: &JoinMetrics,
    reads: &Reads,
    outcome: &Outcome,
    stale: &StaleRemoved,
) -> Value {
    let r = &plan.request;
    let peak_rss = peak_rss_bytes();
    let mut report = json!({
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "error": outcome.error,
        "elapsed_seconds": seconds(outcome.elapsed),
        "join_type": r.join_type.to_string(),
        "output_rows": outcome.output_rows,
        "build_side": plan.join.build_side().to_string(),
        "build_side_reason": plan.join.build_side_reason(),
        "partition_bits": plan.join.partition_bits(),
        "threads": plan.threads,
        "batch_size": r.run.batch_size,
        "phases": {
            "build": {"seconds": seconds(m.build_time)},
            "probe": {"seconds": seconds(m.probe_time)},
            "spilled_partitions": {"seconds": seconds(m.spilled_time)},
        },
        "inputs": {
            "left": input(&r.left, reads.left, plan.left_stats.bytes),
            "right": input(&r.right, reads.right, plan.right_stats.bytes),
        },
        "build": {
            "rows": m.build_rows,
            "rows_spilled": m.build_rows_spilled,
            "bytes_spilled": m.build_bytes_spilled,
            "batches_spilled": m.build_batches_spilled,
        },
        "probe": {
            "rows": m.probe_rows,
            "rows_spilled": m.probe_rows_spilled,
            "bytes_spilled": m.probe_bytes_spilled,
            "batches_spilled": m.probe_batches_spilled,
            "rows_skipped_by_bloom": m.probe_rows_skipped,
        },
        "spill": spill(plan, m),
        "pushdown": pushdown(plan, reads.pushdown),
        "memory": {
            "limit_bytes": plan.limit_bytes,
            "reader_pages_in_limit_bytes": plan.reader_pages_in_pool,
            "direct_io_buffers_in_limit_bytes": plan.direct_io_in_pool,
            "peak_reserved_bytes": m.peak_reserved_bytes,
            "peak_rss_bytes": peak_rss,
        },
        "stale_removed": stale_removed(stale),
    });
    if let (Value::Object(report), Value::Object(flat)) = (&mut report, flat(plan, m, peak_rss)) {
        // (The map keeps insertion order: the flat figures come last.)
        report.extend(flat);
    }
    report
}

/// A duration in seconds, to the microsecond.
pub fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e6
}

/// What one input is and what was read of it.
fn input(input: &Input, counters: &ReadCounters, estimate: Option<u64>) -> Value {
    json!({
        "path": input.spec(),
        "format": input.format().name(),
        "files": input.files().len(),
        "rows_read": counters.rows(),
        "bytes_read": counters.bytes(),
        "file_bytes_read": (input.format() != Format::Parquet).then(|| counters.file_bytes()),
        "estimated_bytes": estimate,
        "rows_in_metadata": input.rows(),
    })
}

/// The spill files, the partitions they held, and the spill settings.
fn spill(plan: &Plan, m: &JoinMetrics) -> Value {
    let spill_dir = plan
        .spill
        .root_dir
        .clone()
        .unwrap_or_else(std::env::temp_dir);
    json!({
        "files": m.spill_files,
        "build_files": m.build_spill_files,
        "probe_files": m.probe_spill_files,
        "partitions_spilled": m.partitions_spilled,
        "max_recursion_depth": m.max_depth,
        "fallbacks": m.fallbacks,
        "hot_key_splits": m.hot_key_splits,
        "swapped_pairs": m.swapped_pairs,
        "dir": spill_dir.display().to_string(),
        "compression": plan.spill.compression.to_string(),
        "max_bytes": plan.spill.disk_quota_bytes,
        "direct_io": plan.spill.direct_io,
        "direct_read_ahead": plan.spill.direct_read_ahead,
        "direct_writes_behind": plan.spill.direct_writes_behind,
        "direct_io_reason": plan.direct_io_reason,
    })
}

/// What killed joins left behind, removed when this one started.
pub fn stale_removed(stale: &StaleRemoved) -> Value {
    json!({
        "spill_dirs": stale.spill_dirs,
        "spill_dir_bytes": stale.spill_dir_bytes,
        "temporary_outputs": stale.temporary_outputs,
        "temporary_output_bytes": stale.temporary_output_bytes,
        "failures": stale.failures,
    })
}

/// What the probe scan skipped.
fn pushdown(plan: &Plan, p: &PushdownCounters) -> Value {
    let get = PushdownCounters::get;
    json!({
        "mode": format!("{:?}", plan.request.pushdown).to_lowercase(),
        "applies": plan.pushdown_applies(),
        "row_groups": get(&p.row_groups),
        "row_groups_skipped": get(&p.row_groups_skipped),
        "pages_skipped": get(&p.pages_skipped),
        "rows_skipped_by_bounds": get(&p.rows_skipped_by_bounds),
        "bytes_skipped": get(&p.bytes_skipped),
        "rows_tested_by_membership": get(&p.rows_tested),
        "rows_dropped_by_membership": get(&p.rows_dropped_by_membership),
    })
}

/// Flat figures, as the first CLI wrote them.
fn flat(plan: &Plan, m: &JoinMetrics, peak_rss: Option<u64>) -> Value {
    json!({
        "build_seconds": seconds(m.build_time),
        "probe_seconds": seconds(m.probe_time),
        "spilled_partitions_seconds": seconds(m.spilled_time),
        "build_rows": m.build_rows,
        "probe_rows": m.probe_rows,
        "build_rows_spilled": m.build_rows_spilled,
        "build_bytes_spilled": m.build_bytes_spilled,
        "probe_rows_spilled": m.probe_rows_spilled,
        "probe_bytes_spilled": m.probe_bytes_spilled,
        "build_batches_spilled": m.build_batches_spilled,
        "probe_batches_spilled": m.probe_batches_spilled,
        "probe_rows_skipped_by_bloom": m.probe_rows_skipped,
        "spill_files": m.spill_files,
        "partitions_spilled": m.partitions_spilled,
        "max_recursion_depth": m.max_depth,
        "fallbacks": m.fallbacks,
        "peak_reserved_bytes": m.peak_reserved_bytes,
        "memory_limit_bytes": plan.limit_bytes,
        "peak_rss_bytes": peak_rss,
    })
}

/// Fails unless a metrics file can be created beside `path` (its directory exists and
/// is writable).
///
/// # Errors
/// An output failure naming the file.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::NamedTempFile::new_in(dir).with_context(|| {
        Kind::Output.context(format!("cannot write metrics to {}", path.display()))
    })?;
    Ok(())
}

/// Writes `report` to `path` (atomically: a temporary file renamed).
///
/// # Errors
/// An output failure naming the file.
pub fn write(path: &Path, report: &Value) -> Result<()> {
    let failure = || Kind::Output.context(format!("cannot write metrics to {}", path.display()));
    let text = serde_json::to_string_pretty(report).with_context(failure)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut temp = tempfile::NamedTempFile::new_in(dir).with_context(failure)?;
    std::io::Write::write_all(&mut temp, format!("{text}\n").as_bytes()).with_context(failure)?;
    #[cfg(unix)]
    {
        // Temporary files are private (0600); a report is an ordinary file.
        use std::os::unix::fs::PermissionsExt;
        let _ = temp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    temp.persist(path)
        .map_err(|e| e.error)
        .with_context(failure)?;
    Ok(())
}
