//! Running a join on its own threads and handing its output over: starting the
//! coordinating thread ([`HashJoin::spawn`]), the [`JoinStream`] that receives its
//! batches over a bounded channel, and the [`CancelHandle`] that stops it.
//!
//! Its own file because it is where the join's threads meet the caller's: the
//! channel, cancellation, panics and the release of everything when the stream is
//! dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use crossbeam::channel::Receiver;
use spilljoin_memory::MemoryPool;
use spilljoin_spill::{SpillConfig, SpillManager};

use super::{HashJoin, JoinMetrics, MetricsHandle};
use crate::batches::panic_message;
use crate::context::{Ctx, JoinPhase, SharedMetrics};
use crate::error::{JoinError, Result};
use crate::plan::ForceSpill;

impl HashJoin {
    /// Runs `job` on the join's coordinating thread and returns the stream of its
    /// output. `owned_output`: output batches must own their buffers.
    pub(crate) fn spawn<F>(&self, owned_output: bool, job: F) -> Result<JoinStream>
    where
        F: FnOnce(&Ctx<'_>) -> Result<()> + Send + 'static,
    {
        let plan = Arc::clone(&self.plan);
        let spill = match &plan.spill {
            Some(spill) => spill.clone(),
            None => SpillManager::new(SpillConfig::default())?,
        };
        let force = ForceSpill::of(&plan);
        let cancel = Arc::new(AtomicBool::new(false));
        let (sender, receiver) =
            crate::channel::output_channel(plan.threads * 2, &plan.pool, Arc::clone(&cancel));
        let gate = Arc::clone(&sender.gate);
        let metrics = Arc::new(SharedMetrics::default());
        let handle = {
            let (cancel, metrics) = (Arc::clone(&cancel), Arc::clone(&metrics));
            std::thread::Builder::new()
                .name("spilljoin".into())
                .spawn(move || {
                    let ctx = Ctx {
                        plan: &plan,
                        spill,
                        sender: &sender,
                        cancel: &cancel,
                        metrics: &metrics,
                        owned_output,
                        force,
                    };
                    // A panic here (the coordinating thread runs the spilled pairs and
                    // the fallback) must end the stream with an error, never as if
                    // the join had finished.
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&ctx)))
                            .unwrap_or_else(|panic| {
                                Err(JoinError::WorkerPanicked(panic_message(&panic)))
                            });
                    metrics.set_phase(JoinPhase::Done);
                    // After a cancel from a `CancelHandle` the stream ends with the
                    // error; after a drop nobody receives it.
                    if let Err(e) = result {
                        let _ = sender.sender.send(Err(e));
                    }
                })
                .map_err(|source| JoinError::Io {
                    path: "<thread>".into(),
                    source,
                })?
        };
        Ok(JoinStream {
            schema: self.schema(),
            pool: Arc::clone(&self.plan.pool),
            receiver: Some(receiver),
            gate,
            cancel,
            handle: Some(handle),
            metrics,
            failed: false,
        })
    }
}

/// The output of an executing join: an iterator of batches of at most the configured
/// batch size. After an error it ends.
///
/// Dropping it before the end cancels the join and waits for its threads; every
/// reservation of the join is released when the drop returns.
#[derive(Debug)]
pub struct JoinStream {
    schema: SchemaRef,
    pool: Arc<dyn MemoryPool>,
    receiver: Option<Receiver<crate::channel::Sent>>,
    /// Counts the batches in the channel; each is released as it is taken.
    gate: Arc<crate::channel::OutputGate>,
    cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    metrics: Arc<SharedMetrics>,
    failed: bool,
}

impl JoinStream {
    /// The schema of the output batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// A handle that stops the join from another thread (a signal handler, a
    /// timeout).
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(Arc::clone(&self.cancel))
    }

    /// The figures so far (final once the stream has ended). Cheap: it reads
    /// counters, so a progress display may call it often.
    pub fn metrics(&self) -> JoinMetrics {
        self.metrics_handle().metrics()
    }

    /// A handle that reads the figures from another thread (a progress display)
    /// while this one consumes the stream.
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle {
            metrics: Arc::clone(&self.metrics),
            pool: Arc::clone(&self.pool),
        }
    }

    /// Stops the join and waits for its thread. Returns an error if the thread
    /// ended by a panic that it could not report through the channel.
    fn stop(&mut self) -> Option<JoinError> {
        self.cancel.store(true, Ordering::Relaxed);
        // Dropping the receiver unblocks workers waiting to send.
        self.receiver = None;
        let handle = self.handle.take()?;
        let panicked = handle
            .join()
            .err()
            .map(|panic| JoinError::WorkerPanicked(panic_message(&panic)));
        // Every worker is done: the batches the channel held are gone with it.
        self.gate.clear_channel();
        panicked
    }
}

impl Iterator for JoinStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let received = self.receiver.as_ref()?.recv();
        match received {
            Ok(Ok((batch, bytes))) => {
                self.gate.release(bytes);
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                self.failed = true;
                self.stop();
                Some(Err(e))
            }
            Err(_) => {
                // Every sender is gone: the join finished — unless its thread died.
                self.failed = true;
                self.stop().map(Err)
            }
        }
    }
}

impl Drop for JoinStream {
    fn drop(&mut self) {
        // Nothing can be reported from a drop; the join's memory and files are
        // released either way.
        let _ = self.stop();
    }
}

/// Stops a running join from any thread: its stream then ends with
/// [`JoinError::Cancelled`], and, as after any end, its reservations are released and
/// its spill files removed once the stream is dropped or has ended.
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Asks the join to stop. Workers notice between batches.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
