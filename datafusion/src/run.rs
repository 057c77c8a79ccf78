//! One execution of the engine inside DataFusion: async input streams in, blocking
//! engine threads in the middle, async output streams out.
//!
//! ```text
//!  DataFusion input stream ─► task on DataFusion's runtime ─► channel (1 batch)
//!        ─► BlockingInput (an engine worker thread waits here) ─► engine
//!  engine ─► JoinStream ─► pump thread ─► channel (2 batches) ─► output stream(s)
//! ```
//!
//! The engine's threads never run on DataFusion's runtime, so a join that waits for
//! memory or disk cannot stall the runtime's workers, and the runtime keeps driving
//! the inputs (scans, repartitions) the engine reads.
//!
//! Stopping: dropping a [`Run`] (its last output stream went away: a `LIMIT` above,
//! an error elsewhere, a cancelled query) cancels the engine, wakes every engine
//! thread waiting for input, and waits for the pump thread, which drops the engine's
//! stream last. When the drop returns the join's reservation is freed and its spill
//! files are gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::Result;
use datafusion::execution::SendableRecordBatchStream;
use futures::future::{select, Either};
use futures::StreamExt;
use spilljoin::{CancelHandle, HashJoin, JoinMetrics, PreparedBuild};
use tokio::sync::{mpsc, oneshot, watch, Mutex};

use crate::error::to_datafusion;
use crate::metrics::Report;
use crate::shared_build::BuildHandle;
use crate::translate::{to_arrow, Definition, InputMap};

/// Output batches in flight between the pump thread and the output streams.
const OUTPUT_CHANNEL_BATCHES: usize = 2;

/// A running join. Shared by the output streams that take its batches.
pub(crate) struct Run {
    output: Mutex<Option<mpsc::Receiver<Result<RecordBatch>>>>,
    cancel: CancelHandle,
    stop: watch::Sender<bool>,
    inputs: std::sync::Mutex<Vec<SpawnedTask<()>>>,
    pump: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Set when the engine's stream has ended and every batch went into the channel.
    completed: Arc<AtomicBool>,
    /// The prepared build this run probes, kept for the other partitions while the
    /// run lives (dropped after the pump: see [`crate::shared_build`]).
    _build: Option<Arc<BuildHandle>>,
}

/// What a run's input side is made of, besides the engine's stream.
struct Wiring {
    stop: watch::Sender<bool>,
    tasks: Vec<SpawnedTask<()>>,
    build: Option<Arc<BuildHandle>>,
}

/// Where the pump thread puts the engine's output and figures.
struct Output {
    definition: Arc<Definition>,
    sender: mpsc::Sender<Result<RecordBatch>>,
    report: Report,
    /// A probe of a prepared build: the build's figures are the build's report's.
    probe_only: bool,
}

/// The input streams of one execution, in the engine's terms (left and right).
pub(crate) struct Inputs {
    /// The engine's left input, one stream per DataFusion partition read.
    pub left: Vec<SendableRecordBatchStream>,
    /// The engine's right input.
    pub right: Vec<SendableRecordBatchStream>,
}

impl Run {
    /// Starts `join` over `inputs`. Call it from DataFusion's runtime (a stream's
    /// poll): the inputs are driven by tasks spawned on it.
    ///
    /// # Errors
    /// The engine's thread could not start.
    pub(crate) fn start(
        definition: Arc<Definition>,
        join: HashJoin,
        inputs: Inputs,
        report: Report,
    ) -> Result<Arc<Run>> {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut side = |streams: Vec<SendableRecordBatchStream>, left: bool| {
            streams
                .into_iter()
                .map(|stream| {
                    let (task, input) = forward(stream, stopped.clone());
                    tasks.push(task);
                    input.mapped(Arc::clone(&definition), left)
                })
                .collect::<Vec<_>>()
        };
        let left = side(inputs.left, true);
        let right = side(inputs.right, false);
        let stream = join
            .execute_partitioned(left, right)
            .map_err(to_datafusion)?;
        let wiring = Wiring {
            stop,
            tasks,
            build: None,
        };
        Self::pumping(definition, join, stream, wiring, report)
    }

    /// Starts probing `prepared` with `probe`, one partition of the join's probe
    /// input (`probe_is_left`: the engine's left input), holding `build` while it
    /// runs. Call it from DataFusion's runtime.
    ///
    /// # Errors
    /// The engine's thread could not start.
    pub(crate) fn start_probe(
        definition: Arc<Definition>,
        join: HashJoin,
        prepared: PreparedBuild,
        probe: SendableRecordBatchStream,
        probe_is_left: bool,
        build: Arc<BuildHandle>,
        report: Report,
    ) -> Result<Arc<Run>> {
        let (stop, stopped) = watch::channel(false);
        let (task, input) = forward(probe, stopped);
        let input = input.mapped(Arc::clone(&definition), probe_is_left);
        let stream = join
            .execute_prepared(prepared, input)
            .map_err(to_datafusion)?;
        let wiring = Wiring {
            stop,
            tasks: vec![task],
            build: Some(build),
        };
        Self::pumping(definition, join, stream, wiring, report)
    }

    /// The run of `stream`: its output pumped into the channel by a thread.
    fn pumping(
        definition: Arc<Definition>,
        join: HashJoin,
        stream: spilljoin::JoinStream,
        wiring: Wiring,
        report: Report,
    ) -> Result<Arc<Run>> {
        let cancel = stream.cancel_handle();
        let (sender, receiver) = mpsc::channel(OUTPUT_CHANNEL_BATCHES);
        let completed = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&completed);
        let probe_only = wiring.build.is_some();
        let pump = std::thread::Builder::new()
            .name("spilljoin-output".into())
            .spawn(move || {
                let output = Output {
                    definition,
                    sender,
                    report,
                    probe_only,
                };
                pump(stream, join, output, &done)
            })
            .map_err(|e| datafusion::common::DataFusionError::External(Box::new(e)))?;
        Ok(Arc::new(Run {
            output: Mutex::new(Some(receiver)),
            cancel,
            stop: wiring.stop,
            inputs: std::sync::Mutex::new(wiring.tasks),
            pump: std::sync::Mutex::new(Some(pump)),
            completed,
            _build: wiring.build,
        }))
    }

    /// Set once the join has put all of its output into the channel.
    pub(crate) fn completed(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.completed)
    }

    /// The next output batch; `None` when the join has ended (or is ending).
    pub(crate) async fn next(&self) -> Option<Result<RecordBatch>> {
        let mut output = self.output.lock().await;
        output.as_mut()?.recv().await
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.cancel.cancel();
        let _ = self.stop.send(true);
        // With the receiver gone, a pump waiting to send gives up at once.
        self.output.get_mut().take();
        if let Ok(mut inputs) = self.inputs.lock() {
            inputs.clear(); // aborts the input tasks
        }
        let pump = self.pump.lock().ok().and_then(|mut p| p.take());
        if let Some(pump) = pump {
            // Nothing can be reported from a drop; the pump has dropped the engine's
            // stream (its memory and files) whether it ended normally or not.
            let _ = pump.join();
        }
    }
}

/// The pump thread: the engine's output into the channel, then the final figures;
/// the engine's stream is dropped (threads joined, files removed) before the
/// channel closes, so a consumer that saw the end sees the cleanup done.
fn pump(mut stream: spilljoin::JoinStream, join: HashJoin, output: Output, completed: &AtomicBool) {
    let started = std::time::Instant::now();
    let mut all_sent = true;
    for item in stream.by_ref() {
        let item = item
            .map_err(to_datafusion)
            .and_then(|batch| output.definition.output_batch(batch));
        let failed = item.is_err();
        if output.sender.blocking_send(item).is_err() || failed {
            all_sent = false;
            break;
        }
    }
    // Before the channel closes: a partition that attaches once the run is gone
    // must know whether its output is all out.
    completed.store(all_sent, Ordering::Release);
    let mut metrics: JoinMetrics = stream.metrics();
    drop(stream);
    drop(join);
    if output.probe_only {
        metrics.build_rows = 0;
        metrics.build_time = std::time::Duration::ZERO;
    }
    output.report.record(&metrics, started.elapsed());
    drop(output.sender);
}

/// A DataFusion stream driven by a task on the runtime, read by an engine thread.
pub(crate) struct BlockingInput {
    batches: mpsc::Receiver<Result<RecordBatch>>,
    stopped: watch::Receiver<bool>,
    /// Tells the task to start polling, at the first read.
    start: Option<oneshot::Sender<()>>,
    done: bool,
}

/// Spawns the task that forwards `stream`'s batches, and returns its reading end.
/// The task polls `stream` only once the engine first asks for a batch: a probe
/// input polled from the start held a batch and its scan's fetched column chunks
/// (a row group's, outside the pool) through the whole build, as
/// DataFusion's own hash join, which polls its probe only after its build, does not
/// (BENCHMARKS.md, "SQL through DataFusion").
pub(crate) fn forward(
    mut stream: SendableRecordBatchStream,
    stopped: watch::Receiver<bool>,
) -> (SpawnedTask<()>, BlockingInput) {
    // One batch ahead: the engine reserves what it keeps, and this bounds what it
    // does not yet hold to one batch per input stream.
    let (sender, batches) = mpsc::channel(1);
    let (start, started) = oneshot::channel::<()>();
    let task = SpawnedTask::spawn(async move {
        // (Dropped unsent: the engine never read this input.)
        if started.await.is_err() {
            return;
        }
        while let Some(item) = stream.next().await {
            let failed = item.is_err();
            if sender.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    let input = BlockingInput {
        batches,
        stopped,
        start: Some(start),
        done: false,
    };
    (task, input)
}

impl BlockingInput {
    /// The engine's view of these batches (renamed columns, computed keys).
    pub(crate) fn mapped(
        self,
        definition: Arc<Definition>,
        left: bool,
    ) -> impl Iterator<Item = Result<RecordBatch, ArrowError>> + Send + 'static {
        self.map(move |item| {
            let map: &InputMap = if left {
                &definition.left
            } else {
                &definition.right
            };
            item.and_then(|batch| map.apply(batch))
        })
    }
}

impl Iterator for BlockingInput {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(start) = self.start.take() {
            // (The task is gone only if the run is being dropped: see below.)
            let _ = start.send(());
        }
        let Self {
            batches, stopped, ..
        } = self;
        let received = futures::executor::block_on(async {
            let stop = std::pin::pin!(stopped.wait_for(|stop| *stop));
            let batch = std::pin::pin!(batches.recv());
            match select(batch, stop).await {
                Either::Left((batch, _)) => Some(batch),
                Either::Right(_) => None,
            }
        });
        match received {
            Some(Some(Ok(batch))) => Some(Ok(batch)),
            Some(Some(Err(e))) => {
                self.done = true;
                Some(Err(to_arrow(e)))
            }
            Some(None) => {
                self.done = true;
                None
            }
            None => {
                self.done = true;
                Some(Err(ArrowError::ExternalError(
                    "the query was cancelled".into(),
                )))
            }
        }
    }
}
