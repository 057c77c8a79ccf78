//! What one execution takes from its `TaskContext`: the memory pool (through
//! [`DataFusionPool`]), the spill directory and temp-space
//! limit of the runtime's `DiskManager`, the batch size, and the `spilljoin.*`
//! settings; and the run that all partitions of a `CollectLeft` join share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::HashJoin;

use crate::config::SpilljoinConfig;
use crate::error::to_datafusion;
use crate::run::Run;
use crate::translate::Definition;
use crate::DataFusionPool;

/// The engine's join for one execution (`partition`, run on `default_threads`
/// unless the settings say otherwise) of `definition` in `context`, planned for
/// `1 / pool_share` of the pool's limit, with `fixed` settings or else the
/// session's.
///
/// # Errors
/// A `spilljoin.*` setting out of range; the spill directory cannot be created.
pub(crate) fn engine_join(
    definition: &Definition,
    context: &TaskContext,
    (partition, default_threads, pool_share): (usize, usize, usize),
    fixed: Option<&SpilljoinConfig>,
) -> Result<HashJoin> {
    let settings = match fixed {
        Some(settings) => settings.clone(),
        None => SpilljoinConfig::from_session(context.session_config().options()),
    };
    settings.validate()?;
    let pool = Arc::new(
        DataFusionPool::new(format!("SpilljoinExec[{partition}]"), context.memory_pool())
            .with_share(pool_share),
    );
    let spill = spill_manager(context, &settings)?;
    let threads = match settings.threads {
        0 => default_threads.max(1),
        n => n,
    };
    let mut builder = definition
        .builder
        .clone()
        .with_memory_pool(pool)
        .with_spill_manager(spill)
        .with_threads(threads)
        .with_batch_size(
            context
                .session_config()
                .batch_size()
                .clamp(1, spilljoin::MAX_BATCH_SIZE_ROWS),
        )
        .with_max_depth(settings.max_depth);
    if settings.force_spill > 0.0 {
        builder = builder
            .with_force_spill(settings.force_spill)
            .with_force_spill_depth(settings.force_spill_depth);
    }
    builder.build().map_err(to_datafusion)
}

/// A spill manager under the runtime's temp directory, limited to the temp space
/// the `DiskManager` has left.
fn spill_manager(context: &TaskContext, settings: &SpilljoinConfig) -> Result<SpillManager> {
    let disk = &context.runtime_env().disk_manager;
    let (root, quota) = if disk.tmp_files_enabled() {
        let left = disk
            .max_temp_directory_size()
            .saturating_sub(disk.used_disk_space());
        (temp_dir(disk)?, Some(left))
    } else {
        // DataFusion may not write temp files: neither may the join.
        (std::env::temp_dir(), Some(0))
    };
    let config = SpillConfig::default()
        .with_root_dir(root)
        .with_compression(settings.compression()?)
        .with_direct_io(settings.spill_direct_io)
        .with_disk_quota_bytes(quota);
    SpillManager::new(config).map_err(|e| DataFusionError::External(Box::new(e)))
}

/// The runtime's first temp directory. The `DiskManager` creates its directories
/// with its first file, so one is made (and removed at once) if there is none yet.
fn temp_dir(disk: &Arc<datafusion::execution::disk_manager::DiskManager>) -> Result<PathBuf> {
    if let Some(dir) = disk.temp_dir_paths().into_iter().next() {
        return Ok(dir);
    }
    let probe = disk.create_tmp_file("spilljoin: find the temp directory")?;
    let dir = probe.path().and_then(|p| p.parent()).map(PathBuf::from);
    drop(probe);
    // A temp file factory that is not a directory (memory, object store) has no path:
    // the join then spills under the system's temp directory.
    Ok(dir.unwrap_or_else(std::env::temp_dir))
}

/// The run of a `CollectLeft` join, shared by its output partitions.
///
/// The first partition to attach starts it; the others attach to the same run while
/// it lives. Only the partitions' streams hold it (here it is weak), so when every
/// stream that attached has been dropped the join stops and frees its memory and
/// files at once, even if some partitions never started. A partition that attaches
/// after the run has ended gets no rows if the run delivered all its output (other
/// partitions took it) and an error if it stopped early; a partition that attaches
/// a second time starts a new execution.
#[derive(Default)]
pub(crate) struct Shared {
    run: Weak<Run>,
    /// Whether the current run delivered all of its output.
    completed: Option<Arc<AtomicBool>>,
    /// The partitions attached to the current run.
    attached: Vec<bool>,
}

/// Partition `partition`'s share of the run, started by `start` if this is the
/// first partition of an execution; `None` when the run has delivered all of its
/// output to other partitions.
///
/// # Errors
/// `start`'s; the run stopped early (a dropped stream, an error) before this
/// partition attached.
pub(crate) fn attach(
    shared: &Mutex<Shared>,
    partition: usize,
    partitions: usize,
    start: impl FnOnce() -> Result<Arc<Run>>,
) -> Result<Option<Arc<Run>>> {
    let mut slot = shared
        .lock()
        .map_err(|_| DataFusionError::Internal("SpilljoinExec: a poisoned lock".into()))?;
    let new_execution = slot.attached.len() != partitions || slot.attached[partition];
    if new_execution {
        let run = start()?;
        slot.attached = vec![false; partitions];
        slot.attached[partition] = true;
        slot.run = Arc::downgrade(&run);
        slot.completed = Some(run.completed());
        return Ok(Some(run));
    }
    slot.attached[partition] = true;
    if let Some(run) = slot.run.upgrade() {
        return Ok(Some(run));
    }
    match slot
        .completed
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Acquire))
    {
        true => Ok(None),
        false => Err(DataFusionError::Execution(format!(
            "SpilljoinExec: the CollectLeft join that partition {partition} shares stopped \
             before the partition started (its other partitions' streams were dropped or \
             failed)"
        ))),
    }
}
