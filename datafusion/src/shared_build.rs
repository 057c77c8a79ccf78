//! The build of a `CollectLeft` join whose output keeps the probe's partitioning,
//! built once and probed by every output partition on its own.
//!
//! ```text
//!  left partition 0 ─► prepare thread: HashJoin::prepare ─► PreparedBuild (shared)
//!  right partition i ─► HashJoin::execute_prepared(build, partition i) ─► output i
//! ```
//!
//! `HashJoinExec` promises that output partition `i` holds the rows of probe
//! partition `i` when its join type outputs probe rows only (inner, right, right
//! semi, right anti, right mark), and the plan above may rely on it (a hash
//! aggregate in `SinglePartitioned` mode, say). One run over every probe partition
//! cannot keep that promise; a prepared build probed per partition does, and the
//! build still spills: it is the engine's own build, planned for the whole pool.
//!
//! The partitions' streams hold the build (here it is weak), so dropping every
//! stream stops the build, or frees it and its files, at once. A partition that
//! comes after the build is gone, or a second time, starts a new one.

use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use futures::future::{BoxFuture, FutureExt, Shared};
use spilljoin::{HashJoin, PreparedBuild};
use tokio::sync::{oneshot, watch};

use crate::error::to_datafusion;
use crate::metrics::Report;
use crate::run::forward;
use crate::translate::Definition;

type Prepared = Shared<BoxFuture<'static, Result<PreparedBuild, Arc<DataFusionError>>>>;

/// A build being prepared, or prepared, for the partitions attached to it.
pub(crate) struct BuildHandle {
    prepared: Prepared,
    stop: watch::Sender<bool>,
    input: Mutex<Option<SpawnedTask<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl BuildHandle {
    /// Starts preparing `join`'s build from `build`, the engine's view of the join's
    /// left input (`build_is_left`: the engine's left input). Call it from
    /// DataFusion's runtime: the input is driven by a task spawned on it.
    ///
    /// # Errors
    /// The prepare thread could not start.
    pub(crate) fn start(
        definition: Arc<Definition>,
        join: HashJoin,
        build: SendableRecordBatchStream,
        build_is_left: bool,
        report: Report,
    ) -> Result<Self> {
        let (stop, stopped) = watch::channel(false);
        let (task, input) = forward(build, stopped);
        let input = input.mapped(definition, build_is_left);
        let (sender, receiver) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("spilljoin-prepare".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let prepared = join.prepare(input).map_err(to_datafusion);
                if let Ok(prepared) = &prepared {
                    report.record(&prepared.metrics(), started.elapsed());
                }
                let _ = sender.send(prepared);
            })
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let prepared = async move {
            match receiver.await {
                Ok(prepared) => prepared.map_err(Arc::new),
                Err(_) => Err(Arc::new(DataFusionError::Internal(
                    "SpilljoinExec: the build's thread ended without a result".into(),
                ))),
            }
        }
        .boxed()
        .shared();
        Ok(Self {
            prepared,
            stop,
            input: Mutex::new(Some(task)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The prepared build, once it is built.
    ///
    /// # Errors
    /// The build failed (its error, shared by every partition).
    pub(crate) async fn prepared(&self) -> Result<PreparedBuild> {
        self.prepared.clone().await.map_err(DataFusionError::Shared)
    }
}

impl Drop for BuildHandle {
    fn drop(&mut self) {
        // A build still reading its input gets an error from it at once.
        let _ = self.stop.send(true);
        if let Ok(mut input) = self.input.lock() {
            input.take(); // aborts the input task
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The build that the output partitions of one `CollectLeft` join share.
#[derive(Default)]
pub(crate) struct SharedBuild {
    build: Weak<BuildHandle>,
    /// The partitions attached to the current build.
    attached: Vec<bool>,
}

/// The build for partition `partition` of `partitions`: the current one, or a new
/// one from `start` if there is none or this partition has used it already.
///
/// # Errors
/// `start`'s.
pub(crate) fn attach(
    shared: &Mutex<SharedBuild>,
    partition: usize,
    partitions: usize,
    start: impl FnOnce() -> Result<BuildHandle>,
) -> Result<Arc<BuildHandle>> {
    let mut slot = shared
        .lock()
        .map_err(|_| DataFusionError::Internal("SpilljoinExec: a poisoned lock".into()))?;
    let current = slot
        .build
        .upgrade()
        .filter(|_| slot.attached.len() == partitions && !slot.attached[partition]);
    if let Some(build) = current {
        slot.attached[partition] = true;
        return Ok(build);
    }
    let build = Arc::new(start()?);
    slot.build = Arc::downgrade(&build);
    slot.attached = vec![false; partitions];
    slot.attached[partition] = true;
    Ok(build)
}
