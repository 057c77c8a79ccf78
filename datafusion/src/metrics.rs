//! The engine's figures in DataFusion's metrics set, for `EXPLAIN ANALYZE`.
//!
//! DataFusion's own spill metrics (`spill_count`, `spilled_bytes`, `spilled_rows`)
//! carry the totals, so tools that read them see the join spill like a sort; the
//! per-side figures, partitions, depth, fallbacks and time per phase follow under
//! the engine's names. The baseline figures (`output_rows`, `output_batches`,
//! `output_bytes`) are recorded as each output stream returns a batch
//! (`SpilljoinExec::execute`). `elapsed_compute` stays near zero: the engine joins on
//! threads of its own, outside the streams' polls; its time is in `build_time`,
//! `probe_time`, `spilled_time` and `join_time` (wall time of each phase).

use std::time::Duration;

use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use spilljoin::JoinMetrics;

/// The metrics of one execution (one output partition, or the one run that all
/// partitions of a `CollectLeft` join share).
pub(crate) struct Report {
    spill_count: Count,
    spilled_bytes: Count,
    spilled_rows: Count,
    counts: Vec<(&'static str, Count)>,
    gauges: Vec<(&'static str, Gauge)>,
    times: Vec<(&'static str, Time)>,
}

const COUNTS: [&str; 10] = [
    "build_rows",
    "probe_rows",
    "build_rows_spilled",
    "build_bytes_spilled",
    "probe_rows_spilled",
    "probe_bytes_spilled",
    "probe_rows_skipped",
    "partitions_spilled",
    "fallbacks",
    "hot_key_splits",
];
const GAUGES: [&str; 2] = ["max_depth", "peak_reserved_bytes"];
const TIMES: [&str; 4] = ["build_time", "probe_time", "spilled_time", "join_time"];

impl Report {
    /// The metrics of `partition` in `set`.
    pub(crate) fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            spill_count: MetricBuilder::new(set).spill_count(partition),
            spilled_bytes: MetricBuilder::new(set).spilled_bytes(partition),
            spilled_rows: MetricBuilder::new(set).spilled_rows(partition),
            counts: COUNTS
                .iter()
                .map(|&name| (name, MetricBuilder::new(set).counter(name, partition)))
                .collect(),
            gauges: GAUGES
                .iter()
                .map(|&name| (name, MetricBuilder::new(set).gauge(name, partition)))
                .collect(),
            times: TIMES
                .iter()
                .map(|&name| (name, MetricBuilder::new(set).subset_time(name, partition)))
                .collect(),
        }
    }

    /// Records the final figures of an execution that took `elapsed`.
    pub(crate) fn record(&self, m: &JoinMetrics, elapsed: Duration) {
        self.spill_count.add(m.spill_files as usize);
        self.spilled_bytes
            .add((m.build_bytes_spilled + m.probe_bytes_spilled) as usize);
        self.spilled_rows
            .add((m.build_rows_spilled + m.probe_rows_spilled) as usize);
        let counts = [
            m.build_rows,
            m.probe_rows,
            m.build_rows_spilled,
            m.build_bytes_spilled,
            m.probe_rows_spilled,
            m.probe_bytes_spilled,
            m.probe_rows_skipped,
            m.partitions_spilled,
            m.fallbacks,
            m.hot_key_splits,
        ];
        for ((_, count), value) in self.counts.iter().zip(counts) {
            count.add(value as usize);
        }
        for ((_, gauge), value) in self.gauges.iter().zip([m.max_depth, m.peak_reserved_bytes]) {
            gauge.set_max(value as usize);
        }
        let times = [m.build_time, m.probe_time, m.spilled_time, elapsed];
        for ((_, time), value) in self.times.iter().zip(times) {
            time.add_duration(value);
        }
    }
}
