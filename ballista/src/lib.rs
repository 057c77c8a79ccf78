//! spilljoin on Ballista: a cluster whose scheduler plans the spilling join and
//! whose executors run it, each inside a memory limit and a spill directory of its
//! own.
//!
//! ```text
//!  client ── SQL ──► scheduler: Ballista's session + SpilljoinRule (HashJoinExec
//!                    becomes SpilljoinExec), stages cut at the shuffles, each stage
//!                    encoded with SpilljoinCodec composed with Ballista's codec
//!                      │ tasks                       │ tasks
//!                      ▼                             ▼
//!        executor 1: its FairSpillPool,     executor 2: its pool,
//!        its DiskManager directory          its directory
//! ```
//!
//! Four settings make Ballista plan joins that spilljoin replaces: hash joins
//! (Ballista prefers sort-merge joins, which spill through their sorts), its static
//! planner (the adaptive one plans joins with rules of its own, at run time),
//! `spilljoin.*` registered on every session (the scheduler rebuilds the client's
//! session from its key-value settings), and the codec on both scheduler and
//! executors. [`session_config`] carries them all, [`session_state`] is the
//! scheduler's session builder, and [`Cluster`] starts a scheduler and executors
//! in this process (tests, single-machine runs); [`start_executor`] connects one
//! executor of this process to a scheduler elsewhere.
//!
//! `NOT IN`: Ballista runs DataFusion's null-aware anti join in one task (its
//! probe-side facts are per process). spilljoin's `NOT IN` builds on the subquery
//! side and needs only facts of its build (a NULL in it, whether it is empty), so the
//! outer table stays partitioned: [`session_config`] turns off Ballista's rewrite of
//! `NOT IN`, which exists to avoid that single task.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::{BallistaCodec, BallistaPhysicalExtensionCodec};
use ballista_core::utils::default_session_builder;
use ballista_core::{ConfigProducer, RuntimeProducer};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, UnboundedMemoryPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use spilljoin_datafusion::{
    with_spilljoin, with_spilljoin_config, SpilljoinCodec, SpilljoinConfig,
};

/// Ballista's adaptive query planner (see [`session_config`]).
const BALLISTA_ADAPTIVE_PLANNER_ENABLED: &str =
    ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED;

/// Ballista's rewrite of `NOT IN` into a join that is not null-aware.
const BALLISTA_NOT_IN_REWRITE: &str = ballista_core::config::BALLISTA_NOT_IN_SUBQUERY_REWRITE;

/// The physical codec of every node of the cluster: spilljoin's, then Ballista's own
/// (its shuffle readers and writers), then DataFusion's.
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    SpilljoinCodec::composed_with(Arc::new(BallistaPhysicalExtensionCodec::default()))
}

/// Ballista's codec with [`physical_codec`], for the scheduler and executors.
fn codec() -> BallistaCodec {
    BallistaCodec::new(
        Arc::new(ballista_core::serde::BallistaLogicalExtensionCodec::default()),
        physical_codec(),
    )
}

/// A Ballista session configuration with spilljoin: the `spilljoin.*` settings, the
/// codec, hash joins preferred, the static planner, and `NOT IN` left as a
/// null-aware anti join (see the module docs), and `target_partitions` partitions per
/// shuffle.
pub fn session_config(target_partitions: usize) -> SessionConfig {
    let mut config = with_spilljoin_config(SessionConfig::new_with_ballista())
        .with_ballista_physical_extension_codec(physical_codec())
        .with_target_partitions(target_partitions.max(1));
    let options = config.options_mut();
    // A stage's partitions are tasks, perhaps on different executors.
    if let Some(spilljoin) = options.extensions.get_mut::<SpilljoinConfig>() {
        spilljoin.distributed = true;
    }
    options.optimizer.prefer_hash_join = true;
    // Ballista's adaptive planner (on by default) plans joins with physical rules of
    // its own and makes its hash joins while the job runs: no session rule sees them.
    // The static planner plans with the session's rules, so SpilljoinRule's. (Both
    // keys are Ballista's own, registered by `new_with_ballista`: the test below
    // checks that they took.)
    let _ = options.set(BALLISTA_ADAPTIVE_PLANNER_ENABLED, "false");
    let _ = options.set(BALLISTA_NOT_IN_REWRITE, "false");
    config
}

/// The scheduler's session for a client's `config`: Ballista's (its functions and
/// logical rules) with [`SpilljoinRule`](spilljoin_datafusion::SpilljoinRule) among
/// the physical rules.
///
/// # Errors
/// DataFusion's, building the session.
pub fn session_state(config: SessionConfig) -> Result<SessionState> {
    let state = default_session_builder(config)?;
    Ok(with_spilljoin(SessionStateBuilder::new_from_existing(state)).build())
}

/// One executor's resources.
#[derive(Debug, Clone, Default)]
pub struct ExecutorOptions {
    /// The executor's memory limit in bytes, shared by its tasks (a DataFusion
    /// `FairSpillPool`); `None`: unbounded.
    pub memory_limit: Option<usize>,
    /// Where its spill files go (its `DiskManager`'s directory); `None`: the
    /// system temp dir.
    pub spill_dir: Option<PathBuf>,
    /// Tasks it runs at once (at least 1).
    pub concurrent_tasks: usize,
}

impl ExecutorOptions {
    /// The runtime every task of the executor shares: one pool, one disk manager.
    ///
    /// # Errors
    /// DataFusion's, creating the disk manager.
    pub fn runtime(&self) -> Result<Arc<RuntimeEnv>> {
        let pool: Arc<dyn MemoryPool> = match self.memory_limit {
            Some(limit) => Arc::new(FairSpillPool::new(limit)),
            None => Arc::new(UnboundedMemoryPool::default()),
        };
        let mode = match &self.spill_dir {
            Some(dir) => DiskManagerMode::Directories(vec![dir.clone()]),
            None => DiskManagerMode::OsTmpDirectory,
        };
        RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(mode))
            .build_arc()
    }
}

/// A scheduler and executors running in this process, on loopback ports the
/// operating system picked.
#[derive(Debug)]
pub struct Cluster {
    scheduler: SocketAddr,
    target_partitions: usize,
}

impl Cluster {
    /// Starts a scheduler and one executor per entry of `executors`; the sessions of
    /// [`Cluster::context`] shuffle into `target_partitions` partitions.
    ///
    /// # Errors
    /// Ballista's, binding a port or registering an executor.
    pub async fn start(executors: &[ExecutorOptions], target_partitions: usize) -> Result<Self> {
        let scheduler = start_scheduler(target_partitions).await?;
        for options in executors {
            start_executor(scheduler, options, target_partitions).await?;
        }
        Ok(Self {
            scheduler,
            target_partitions,
        })
    }

    /// The scheduler's address.
    pub fn scheduler(&self) -> SocketAddr {
        self.scheduler
    }

    /// A client session on this cluster, with [`session_config`].
    ///
    /// # Errors
    /// Ballista's, connecting to the scheduler.
    pub async fn context(&self) -> Result<SessionContext> {
        client(self.scheduler, session_config(self.target_partitions)).await
    }
}

fn scheduler_url(scheduler: SocketAddr) -> String {
    format!("df://{}:{}", scheduler.ip(), scheduler.port())
}

/// A client session on the scheduler at `scheduler` with `config` (normally
/// [`session_config`], changed as the job needs: `spilljoin.force_spill`,
/// `spilljoin.enabled = false` for stock joins; `SET` works as well): each job
/// carries the session's settings to the scheduler.
///
/// # Errors
/// Ballista's, connecting to the scheduler.
pub async fn client(scheduler: SocketAddr, config: SessionConfig) -> Result<SessionContext> {
    let state = session_state(config)?;
    SessionContext::remote_with_state(&scheduler_url(scheduler), state).await
}

/// Starts a scheduler in this process whose sessions are [`session_state`]'s, and
/// returns its address.
///
/// # Errors
/// Ballista's, binding a port.
pub async fn start_scheduler(target_partitions: usize) -> Result<SocketAddr> {
    let config_producer: ConfigProducer = Arc::new(move || session_config(target_partitions));
    ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(session_state),
        config_producer,
        codec(),
    )
    .await
    .map_err(ballista_error)
}

/// Starts an executor in this process with `options`, registered with the scheduler
/// at `scheduler`.
///
/// # Errors
/// Ballista's, connecting to the scheduler (retried for five seconds) or binding a
/// port; DataFusion's, creating the executor's runtime.
pub async fn start_executor(
    scheduler: SocketAddr,
    options: &ExecutorOptions,
    target_partitions: usize,
) -> Result<()> {
    let runtime = options.runtime()?;
    let runtime_producer: RuntimeProducer = Arc::new(move |_| Ok(Arc::clone(&runtime)));
    let config_producer: ConfigProducer = Arc::new(move || session_config(target_partitions));
    let client = connect(scheduler).await?;
    ballista_executor::new_standalone_executor_from_builder(
        client,
        options.concurrent_tasks.max(1),
        config_producer,
        runtime_producer,
        codec(),
        Default::default(),
    )
    .await
    .map_err(ballista_error)
}

/// A gRPC client of the scheduler at `scheduler`: it may still be starting, so the
/// connection is retried every 100 ms for five seconds.
async fn connect(scheduler: SocketAddr) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
    let url = format!("http://{}:{}", scheduler.ip(), scheduler.port());
    let mut last = None;
    for _ in 0..50 {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(DataFusionError::External(
        format!("cannot connect to the scheduler at {url}: {last:?}").into(),
    ))
}

fn ballista_error(e: ballista_core::error::BallistaError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_plans_spilling_hash_joins_with_the_static_planner() {
        let config = session_config(3);
        let options = config.options();
        // Ballista's entries carry their full keys.
        let entry = |key: &str| {
            options
                .entries()
                .into_iter()
                .find(|e| e.key == key)
                .and_then(|e| e.value)
        };
        assert_eq!(
            entry(BALLISTA_ADAPTIVE_PLANNER_ENABLED).as_deref(),
            Some("false")
        );
        assert_eq!(entry(BALLISTA_NOT_IN_REWRITE).as_deref(), Some("false"));
        let spilljoin = options.extensions.get::<SpilljoinConfig>();
        assert!(spilljoin.is_some_and(|s| s.enabled && s.distributed));
        assert!(options.optimizer.prefer_hash_join);
        assert_eq!(options.execution.target_partitions, 3);
    }
}
