//! What a query did: the joins' figures summed over the executed plan, and the
//! `--metrics` JSON of a `sql` run.
//!
//! DataFusion keeps each operator's figures in its plan node (`metrics()`), one
//! value per partition. A walk over the executed plan sums the `SpilljoinExec`
//! nodes' (rows and bytes spilled per side, partitions, fallbacks, time per phase;
//! the deepest recursion and the largest reservation are maxima, not sums) and,
//! apart, what every other operator spilled, so that a sort that spilled is told
//! from a join that did.
//!
//! ```json
//! {
//!   "status": "ok", "exit_code": 0, "error": null,
//!   "elapsed_seconds": 1.84, "output_rows": 1199001, "threads": 2, "batch_size": 8192,
//!   "tables": [{"name", "path", "format", "files"}],
//!   "memory": {"limit_bytes", "peak_reserved_bytes", "peak_rss_bytes"},
//!   "spill": {"dir", "compression", "max_bytes"},
//!   "joins": {"count", "spilled_bytes", "build_rows", "build_bytes_spilled", ...,
//!             "max_depth", "peak_reserved_bytes", "build_time_seconds", ...},
//!   "other_operators": {"spill_count", "spilled_bytes", "spilled_rows"},
//!   "stale_removed": {...}
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::ExecutionPlan;
use serde_json::{json, Map, Value};
use spilljoin_datafusion::SpilljoinExec;

use super::session::{Settings, Table};
use crate::metrics::{peak_rss_bytes, seconds, stale_removed, Outcome};
use crate::stale::StaleRemoved;

/// The figures of a plan's operators after (or while) it ran.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PlanFigures {
    /// `SpilljoinExec` nodes in the plan.
    pub joins: u64,
    /// Their figures by metric name, summed over nodes and partitions (gauges:
    /// the largest; times: seconds).
    pub join: BTreeMap<String, f64>,
    /// What the other operators spilled, by DataFusion's metric names
    /// (`spill_count`, `spilled_bytes`, `spilled_rows`).
    pub others: BTreeMap<String, f64>,
}

impl PlanFigures {
    /// The figures of `plan` and the nodes under it.
    pub fn of(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut figures = Self::default();
        let mut pending = vec![Arc::clone(plan)];
        while let Some(node) = pending.pop() {
            pending.extend(node.children().into_iter().cloned());
            let is_join = node.downcast_ref::<SpilljoinExec>().is_some();
            figures.joins += u64::from(is_join);
            let Some(metrics) = node.metrics() else {
                continue;
            };
            for metric in metrics.iter() {
                let value = metric.value();
                if is_join {
                    // (DataFusion's baseline figures the join does not keep.)
                    let unkept = ["elapsed_compute", "output_batches", "output_bytes"];
                    if !unkept.contains(&value.name()) {
                        add(&mut figures.join, value);
                    }
                } else if matches!(
                    value,
                    MetricValue::SpillCount(_)
                        | MetricValue::SpilledBytes(_)
                        | MetricValue::SpilledRows(_)
                ) {
                    add(&mut figures.others, value);
                }
            }
        }
        figures
    }

    /// A summed join figure (0 if no join reported it).
    pub fn join(&self, name: &str) -> f64 {
        self.join.get(name).copied().unwrap_or(0.0)
    }

    /// What the other operators spilled, in bytes.
    pub fn others_spilled_bytes(&self) -> f64 {
        self.others.get("spilled_bytes").copied().unwrap_or(0.0)
    }
}

/// Adds `value` to its figure in `into`: times in seconds, gauges by their
/// largest value, everything else summed.
fn add(into: &mut BTreeMap<String, f64>, value: &MetricValue) {
    let n = value.as_usize() as f64;
    match value {
        MetricValue::Time { .. } | MetricValue::ElapsedCompute(_) => {
            let key = format!("{}_seconds", value.name());
            *into.entry(key).or_default() += n / 1e9;
        }
        MetricValue::Gauge { .. } | MetricValue::PeakMemoryUsage { .. } => {
            let entry = into.entry(value.name().to_string()).or_default();
            *entry = entry.max(n);
        }
        MetricValue::StartTimestamp(_)
        | MetricValue::EndTimestamp(_)
        | MetricValue::PruningMetrics { .. }
        | MetricValue::Ratio { .. }
        | MetricValue::Custom { .. } => {}
        _ => *into.entry(value.name().to_string()).or_default() += n,
    }
}

/// What a `sql` run counts, filled in however it ends.
#[derive(Default)]
pub struct Counts {
    /// Result rows written (or counted).
    pub rows: u64,
    /// The executed plan's figures.
    pub figures: PlanFigures,
    /// The most the memory pool held at once.
    pub peak_reserved_bytes: u64,
    /// What killed runs left, removed at the start.
    pub stale: StaleRemoved,
}

/// What the report says of the run's setup.
pub struct Setup<'a> {
    /// The resolved settings.
    pub settings: &'a Settings,
    /// The tables.
    pub tables: &'a [Table],
    /// `--spill-dir` as given.
    pub spill_dir: Option<&'a std::path::Path>,
}

/// The `--metrics` JSON of a `sql` run.
pub fn report(setup: &Setup, counts: &Counts, outcome: &Outcome) -> Value {
    let s = setup.settings;
    let tables: Vec<Value> = setup
        .tables
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "path": t.spec,
                "format": t.format.name(),
                "files": t.files.len(),
            })
        })
        .collect();
    let mut joins = Map::new();
    joins.insert("count".into(), json!(counts.figures.joins));
    for (name, value) in &counts.figures.join {
        joins.insert(name.clone(), number(name, *value));
    }
    let others: Map<String, Value> = counts
        .figures
        .others
        .iter()
        .map(|(name, value)| (name.clone(), number(name, *value)))
        .collect();
    let spill_dir = setup
        .spill_dir
        .map_or_else(std::env::temp_dir, |p| p.to_path_buf());
    json!({
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "error": outcome.error,
        "elapsed_seconds": seconds(outcome.elapsed),
        "output_rows": outcome.output_rows,
        "threads": s.threads,
        "batch_size": s.batch_size,
        "tables": tables,
        "memory": {
            "limit_bytes": s.limit_bytes,
            "peak_reserved_bytes": counts.peak_reserved_bytes,
            "peak_rss_bytes": peak_rss_bytes(),
        },
        "spill": {
            "dir": spill_dir.display().to_string(),
            "compression": s.compression.to_string(),
            "max_bytes": s.max_spill_bytes,
        },
        "joins": joins,
        "other_operators": others,
        "stale_removed": stale_removed(&counts.stale),
    })
}

/// A figure as JSON: seconds as they are (to the microsecond), counts as integers.
fn number(name: &str, value: f64) -> Value {
    if name.ends_with("_seconds") {
        json!(seconds(Duration::from_secs_f64(value.max(0.0))))
    } else {
        json!(value as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::metrics::{Count, Gauge, Time};
    use std::borrow::Cow;

    #[test]
    fn figures_add_up_by_their_nature() {
        let mut into = BTreeMap::new();
        for (rows, depth, nanos) in [(3, 1, 500_000_000), (4, 2, 250_000_000)] {
            let count = Count::new();
            count.add(rows);
            add(
                &mut into,
                &MetricValue::Count {
                    name: Cow::Borrowed("build_rows"),
                    count,
                },
            );
            let gauge = Gauge::new();
            gauge.set(depth);
            add(
                &mut into,
                &MetricValue::Gauge {
                    name: Cow::Borrowed("max_depth"),
                    gauge,
                },
            );
            let time = Time::new();
            time.add_duration(Duration::from_nanos(nanos));
            add(
                &mut into,
                &MetricValue::Time {
                    name: Cow::Borrowed("build_time"),
                    time,
                },
            );
        }
        assert_eq!(into["build_rows"], 7.0);
        assert_eq!(into["max_depth"], 2.0);
        assert_eq!(into["build_time_seconds"], 0.75);
        assert_eq!(number("build_time_seconds", 0.75), json!(0.75));
        assert_eq!(number("build_rows", 7.0), json!(7));
    }
}
