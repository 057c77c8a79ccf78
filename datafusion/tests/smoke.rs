//! The smallest use of the crate: a session from `with_spilljoin`, one join.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

async fn ctx(spill: bool, limit: Option<usize>) -> SessionContext {
    let mut config = SessionConfig::new().with_target_partitions(2);
    config = spilljoin_datafusion::with_spilljoin_config(config);
    if spill {
        config
            .options_mut()
            .set("spilljoin.force_spill", "1")
            .unwrap();
    }
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(l) = limit {
        runtime = runtime.with_memory_pool(Arc::new(FairSpillPool::new(l)));
    }
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime.build_arc().unwrap());
    let ctx = SessionContext::new_with_state(spilljoin_datafusion::with_spilljoin(state).build());
    ctx.sql("CREATE TABLE a AS SELECT value % 1000 AS k, value AS v, 'x' || value AS s FROM generate_series(1, 100000)").await.unwrap().collect().await.unwrap();
    ctx.sql(
        "CREATE TABLE b AS SELECT value % 1500 AS k, value * 2 AS w FROM generate_series(1, 20000)",
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    ctx
}

/// The one-call setup end to end: under a 4 MiB fair pool with forced spilling, a
/// join of duplicate keys plans a `SpilljoinExec`, answers what stock DataFusion
/// (`SET spilljoin.enabled = false`, no limit) answers, and `EXPLAIN ANALYZE` shows
/// it spilled and what it output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() -> datafusion::error::Result<()> {
    let c = ctx(true, Some(4 << 20)).await;
    let q = "SELECT count(*), sum(v), sum(w), max(s) FROM a JOIN b ON a.k = b.k";
    let text = |batches: &[datafusion::arrow::array::RecordBatch]| {
        pretty_format_batches(batches).map(|t| t.to_string())
    };
    let explain = text(&c.sql(&format!("EXPLAIN {q}")).await?.collect().await?)?;
    assert!(explain.contains("SpilljoinExec"), "{explain}");
    let ours = text(&c.sql(q).await?.collect().await?)?;
    let stock_ctx = ctx(false, None).await;
    stock_ctx
        .sql("SET spilljoin.enabled = false")
        .await?
        .collect()
        .await?;
    let stock = text(&stock_ctx.sql(q).await?.collect().await?)?;
    assert_eq!(ours, stock);
    let analyzed = c.sql(&format!("EXPLAIN ANALYZE {q}")).await?;
    let analyzed = text(&analyzed.collect().await?)?;
    let join = analyzed
        .lines()
        .find(|l| l.contains("SpilljoinExec"))
        .unwrap_or_default();
    assert!(
        join.contains("spill_count=") && !join.contains("spill_count=0"),
        "{join}"
    );
    assert!(
        join.contains("output_batches=") && !join.contains("output_batches=0"),
        "{join}"
    );
    Ok(())
}

/// `SHOW` finds a `spilljoin.*` setting by its full key, as `SET` does.
#[tokio::test]
async fn show_lists_the_settings_by_their_full_keys() -> datafusion::error::Result<()> {
    let config = spilljoin_datafusion::with_spilljoin_config(
        SessionConfig::new().with_information_schema(true),
    );
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config);
    let ctx = SessionContext::new_with_state(spilljoin_datafusion::with_spilljoin(state).build());
    ctx.sql("SET spilljoin.max_depth = 3")
        .await?
        .collect()
        .await?;
    let shown = ctx.sql("SHOW spilljoin.max_depth").await?.collect().await?;
    let text = pretty_format_batches(&shown)?.to_string();
    assert!(text.contains("| spilljoin.max_depth | 3 "), "{text}");
    Ok(())
}
