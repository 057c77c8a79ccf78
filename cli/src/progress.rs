//! Progress on stderr while a join runs, when stderr is a terminal.
//!
//! A thread samples the join's [`MetricsHandle`] and the inputs' read counters ten
//! times a second and draws one line with indicatif:
//!
//! ```text
//! ⠙ probe    [#########>---------------]  38% probe 4.6M/12.0M rows · spilled 120.4 MiB (26 files) · mem 7.8 MiB/8.0 MiB · out 4.1M rows
//! ```
//!
//! The bar follows the phase's input (build rows against the build input's total,
//! then probe rows against the probe's); where rows are not known before reading
//! (CSV, NDJSON, Arrow) it follows the bytes read from the files against their
//! size, and the spilled partitions phase shows a spinner. The line is cleared when the join ends.
//!
//! `sql` draws its own line through [`Progress::start_with`] (a spinner: rows out,
//! memory, spill on disk).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use spilljoin::{JoinPhase, MetricsHandle};

use super::input::ReadCounters;

/// What one input has and has read.
pub struct SideProgress {
    /// Rows and bytes read so far.
    pub counters: Arc<ReadCounters>,
    /// Rows in the input, if known.
    pub rows_total: Option<u64>,
    /// The size of the input's files, the measure of progress when rows are not
    /// known (`None` for Parquet, whose rows are).
    pub file_bytes_total: Option<u64>,
}

/// A running progress display; [`Progress::finish`] clears it.
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts drawing a join's progress, unless `quiet` or stderr is not a terminal.
    pub fn start(
        quiet: bool,
        metrics: MetricsHandle,
        build: SideProgress,
        probe: SideProgress,
        limit_bytes: u64,
    ) -> Self {
        let styles = Styles::default();
        Self::start_with(quiet, move |bar| {
            join_tick(bar, &styles, &metrics, &build, &probe, limit_bytes)
        })
    }

    /// Starts drawing one line, unless `quiet` or stderr is not a terminal: `tick`
    /// sets the bar's style, position and message ten times a second, from a
    /// thread of its own.
    pub fn start_with(quiet: bool, mut tick: impl FnMut(&ProgressBar) + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if quiet || !std::io::stderr().is_terminal() {
            return Self { stop, thread: None };
        }
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("spilljoin-progress".into())
            .spawn(move || {
                let bar =
                    ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
                while !flag.load(Ordering::Relaxed) {
                    tick(&bar);
                    bar.tick();
                    std::thread::sleep(TICK);
                }
                bar.finish_and_clear();
            })
            .ok();
        Self { stop, thread }
    }

    /// Stops drawing and clears the line.
    pub fn finish(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

const TICK: Duration = Duration::from_millis(100);

/// The line's two looks: a bar while an input's share read is known, a spinner
/// otherwise.
pub struct Styles {
    with_bar: Option<ProgressStyle>,
    /// The spinner, with a prefix (the phase) and a message.
    pub spinner: Option<ProgressStyle>,
}

impl Default for Styles {
    /// The styles (`None` where a template does not parse: the line keeps the
    /// style it had).
    fn default() -> Self {
        let with_bar = ProgressStyle::with_template(
            "{spinner} {prefix:<8} [{bar:25}] {percent:>3}% {wide_msg}",
        )
        .map(|s| s.progress_chars("#>-"));
        let spinner = ProgressStyle::with_template("{spinner} {prefix:<8} {wide_msg}");
        Self {
            with_bar: with_bar.ok(),
            spinner: spinner.ok(),
        }
    }
}

/// One tick of a join's line: its phase, the share of the phase's input read, and
/// the figures of [`message`].
fn join_tick(
    bar: &ProgressBar,
    styles: &Styles,
    metrics: &MetricsHandle,
    build: &SideProgress,
    probe: &SideProgress,
    limit_bytes: u64,
) {
    let m = metrics.metrics();
    bar.set_prefix(m.phase.to_string());
    let side = match m.phase {
        JoinPhase::Build => Some(build),
        JoinPhase::Probe => Some(probe),
        _ => None,
    };
    let fraction = side.and_then(|s| {
        let (done, total) = match (s.rows_total, s.file_bytes_total) {
            (Some(total), _) => (s.counters.rows(), total),
            (None, Some(total)) => (s.counters.file_bytes(), total),
            (None, None) => return None,
        };
        Some((done.min(total), total.max(1)))
    });
    match (fraction, &styles.with_bar, &styles.spinner) {
        (Some((done, total)), Some(style), _) => {
            bar.set_style(style.clone());
            bar.set_length(total);
            bar.set_position(done);
        }
        (_, _, Some(style)) => bar.set_style(style.clone()),
        _ => {}
    }
    bar.set_message(message(&m, build, probe, limit_bytes));
}

fn message(
    m: &spilljoin::JoinMetrics,
    build: &SideProgress,
    probe: &SideProgress,
    limit_bytes: u64,
) -> String {
    let side = |name: &str, s: &SideProgress| -> String {
        let read = s.counters.rows();
        match (s.rows_total, s.file_bytes_total) {
            (Some(total), _) => format!("{name} {}/{} rows", count(read), count(total)),
            (None, Some(total)) => format!(
                "{name} {} rows ({}/{})",
                count(read),
                human_bytes(s.counters.file_bytes()),
                human_bytes(total)
            ),
            (None, None) => format!("{name} {} rows", count(read)),
        }
    };
    let mut parts = Vec::new();
    match m.phase {
        JoinPhase::Build => parts.push(side("build", build)),
        JoinPhase::Probe => parts.push(side("probe", probe)),
        _ => {}
    }
    let spilled = m.build_bytes_spilled + m.probe_bytes_spilled;
    if spilled > 0 {
        parts.push(format!(
            "spilled {} ({} files)",
            human_bytes(spilled),
            m.spill_files
        ));
    }
    parts.push(format!(
        "mem {}/{}",
        human_bytes(m.reserved_bytes),
        human_bytes(limit_bytes)
    ));
    parts.push(format!("out {} rows", count(m.output_rows)));
    parts.join(" · ")
}

/// A row count in K/M/G.
pub fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Bytes for a person: `512 bytes`, `10.0 KiB`, `7.2 MiB`, `12.5 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", b / 1024.0),
        1_048_576..10_737_418_240 => format!("{:.1} MiB", b / 1_048_576.0),
        _ => format!("{:.1} GiB", b / 1_073_741_824.0),
    }
}
