//! spilljoin inside DataFusion: a hash join that spills instead of failing with
//! "Resources exhausted".
//!
//! - [`SpilljoinExec`]: an `ExecutionPlan` that runs a `HashJoinExec`'s definition
//!   (every join type, null equality, `NOT IN`, the residual filter, the projection,
//!   `CollectLeft` and `Partitioned`) with spilljoin's hybrid hash join, reporting
//!   the same plan properties and statistics.
//! - [`SpilljoinRule`]: the `PhysicalOptimizerRule` that swaps it in;
//!   [`CollectLeftRule`], which plans the joins DataFusion would partition by key as
//!   `CollectLeft` (one execution that partitions and spills by itself); and
//!   [`with_spilljoin`], which installs both and the settings on a
//!   `SessionStateBuilder`.
//! - [`DataFusionPool`]: one memory budget for the whole query. The join reserves
//!   from the `TaskContext`'s DataFusion pool as a consumer that can spill, so sorts,
//!   aggregates and every join of a plan share the session's limit; spill files go
//!   under the runtime's `DiskManager` directory and within its temp-space limit.
//! - [`SpilljoinConfig`]: the `spilljoin.*` settings (`SET spilljoin.enabled = false`).
//! - [`SpilljoinCodec`]: a `datafusion-proto` codec for plans that contain the
//!   join, for engines that ship plans to other processes (Ballista).
//!
//! ```no_run
//! use datafusion::execution::session_state::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//!
//! # async fn run() -> datafusion::error::Result<()> {
//! let state = SessionStateBuilder::new().with_default_features();
//! let ctx = SessionContext::new_with_state(spilljoin_datafusion::with_spilljoin(state).build());
//! ctx.sql("SELECT 1").await?.show().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod codec;
mod config;
mod error;
mod exec;
mod execution;
mod memory;
mod metrics;
mod rule;
mod run;
mod shared_build;
mod translate;

pub use codec::SpilljoinCodec;
pub use config::{with_spilljoin_config, SpilljoinConfig};
pub use exec::SpilljoinExec;
pub use memory::DataFusionPool;
pub use rule::{physical_optimizer_rules, with_spilljoin, CollectLeftRule, SpilljoinRule};
