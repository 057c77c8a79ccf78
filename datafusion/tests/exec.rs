//! The operator inside DataFusion plans: the rule changes nothing but the join's
//! name, dropping a stream frees everything before the drop returns, and several
//! joins of one plan spill inside one small pool.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::{collect, ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use spilljoin_datafusion::SpilljoinExec;

struct Session {
    ctx: SessionContext,
    pool: Arc<dyn MemoryPool>,
}

/// A session of 2 partitions over `pool`, spilling under `dir`, with or without the
/// rule, with tables `a` (100,000 rows) and `b`, `c` (20,000 rows).
async fn session(rule: bool, pool: Arc<dyn MemoryPool>, dir: &Path, force: bool) -> Session {
    let mut config =
        spilljoin_datafusion::with_spilljoin_config(SessionConfig::new().with_target_partitions(2));
    let options = config.options_mut();
    // Dynamic filters would differ between the plans compared below.
    options
        .set(
            "datafusion.optimizer.enable_join_dynamic_filter_pushdown",
            "false",
        )
        .unwrap();
    if force {
        options.set("spilljoin.force_spill", "1").unwrap();
    }
    // Joins whose output keeps the probe's partitioning are replaced however small
    // their build (`collect_left_keeps_the_probe_partitioning` tests them; the
    // default size rule is `a_small_collect_left_build_stays_a_hash_join`).
    // (A registered option and a valid value: cannot fail.)
    options
        .set("spilljoin.prepared_collect_left_min_bytes", "0")
        .unwrap();
    let disk = DiskManagerBuilder::default()
        .with_mode(DiskManagerMode::Directories(vec![dir.to_path_buf()]));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool))
        .with_disk_manager_builder(disk)
        .build_arc()
        .unwrap();
    let mut state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime);
    if rule {
        state = spilljoin_datafusion::with_spilljoin(state);
    }
    let ctx = SessionContext::new_with_state(state.build());
    for sql in [
        "CREATE TABLE a AS SELECT value % 5000 AS k, value AS v, 'payload-' || value AS s FROM generate_series(1, 100000)",
        "CREATE TABLE b AS SELECT value % 7000 AS k, value * 2 AS w, value % 300 AS j FROM generate_series(1, 20000)",
        "CREATE TABLE c AS SELECT value % 300 AS j, 'c-' || value AS t FROM generate_series(1, 20000)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    Session { ctx, pool }
}

/// Sessions with the rule: with no limit, forced to spill, and in a fair pool of
/// `pool_bytes` (labelled "pool").
async fn three_sessions(dir: &Path, pool_bytes: usize) -> [(&'static str, Session); 3] {
    let pool = Arc::new(FairSpillPool::new(pool_bytes));
    [
        ("no limit", session(true, unbounded(), dir, false).await),
        ("forced spill", session(true, unbounded(), dir, true).await),
        ("small pool", session(true, pool, dir, false).await),
    ]
}

fn unbounded() -> Arc<dyn MemoryPool> {
    Arc::new(GreedyMemoryPool::new(usize::MAX / 2))
}

async fn plan(s: &Session, sql: &str) -> Arc<dyn ExecutionPlan> {
    s.ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap()
}

fn count_nodes(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let here = usize::from(plan.name() == name);
    here + plan
        .children()
        .iter()
        .map(|c| count_nodes(c, name))
        .sum::<usize>()
}

/// The rows of `sql` run in `s`, sorted.
async fn query_rows(s: &Session, sql: &str) -> Vec<String> {
    sorted_rows(&s.ctx.sql(sql).await.unwrap().collect().await.unwrap())
}

fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut rows: Vec<String> = text.lines().skip(3).map(str::to_owned).collect();
    rows.sort();
    rows
}

const TWO_JOINS: &str =
    "SELECT a.k, a.s, b.w, c.t FROM a JOIN b ON a.k = b.k JOIN c ON b.j = c.j WHERE a.v % 10 = 0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_changes_only_the_joins_name() {
    let dir = tempfile::tempdir().unwrap();
    let queries = [
        TWO_JOINS,
        "SELECT * FROM a LEFT JOIN b ON a.k = b.k AND a.v > b.w",
        "SELECT * FROM b WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.k = b.k)",
        "SELECT * FROM b WHERE k NOT IN (SELECT k FROM a)",
        "SELECT b.k, count(*) FROM a FULL JOIN b ON a.k = b.k GROUP BY b.k",
    ];
    let with = session(true, unbounded(), dir.path(), false).await;
    let without = session(false, unbounded(), dir.path(), false).await;
    for sql in queries {
        let ours = plan(&with, sql).await;
        let stock = plan(&without, sql).await;
        assert!(count_nodes(&ours, "SpilljoinExec") > 0, "{sql}");
        assert_eq!(
            count_nodes(&ours, "SpilljoinExec"),
            count_nodes(&stock, "HashJoinExec"),
            "{sql}: every hash join is replaced"
        );
        let ours_text = datafusion::physical_plan::displayable(ours.as_ref())
            .indent(true)
            .to_string()
            .replace("SpilljoinExec", "HashJoinExec");
        let stock_text = datafusion::physical_plan::displayable(stock.as_ref())
            .indent(true)
            .to_string();
        assert_eq!(ours_text, stock_text, "{sql}");
        assert_eq!(ours.schema(), stock.schema(), "{sql}");
        let joins = spilling_joins(&ours);
        let executions: usize = joins.iter().map(|j| j.executions()).sum();
        assert!(
            joins.iter().all(|j| j.pool_share() == executions),
            "{sql}: every join plans for its share of the pool, 1/{executions}"
        );
        assert_eq!(
            format!("{:?}", ours.properties()),
            format!("{:?}", stock.properties()),
            "{sql}"
        );
    }
}

/// Dropping a join's output streams frees its reservation and removes its spill
/// files before the drop returns. The streams are the join's own: a stream from
/// `execute_stream` over several partitions is a `CoalescePartitionsExec`'s, whose
/// tasks (and the join streams they hold) tokio drops later, on its own threads.
/// The operators feeding the join (repartitions) end the same way, so the whole pool
/// is only required to reach zero soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_frees_memory_and_files_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let tracked = Arc::new(TrackConsumersPool::new(
        FairSpillPool::new(64 << 20),
        NonZeroUsize::new(8).unwrap(),
    ));
    let pool: Arc<dyn MemoryPool> = Arc::clone(&tracked) as _;
    let s = session(true, pool, dir.path(), true).await;
    let join = "SELECT a.s, b.w FROM a JOIN b ON a.k = b.k";
    // CollectLeft over a hash-partitioned probe: one prepared build, a probe each.
    let keeping = "SELECT c.t, g.j FROM c JOIN \
                   (SELECT k % 400 AS j, count(*) AS n FROM a GROUP BY k % 400) g ON c.j = g.j";
    for (mode, round, sql) in [
        ("CollectLeft", 0, join),
        ("CollectLeft", 1, join),
        ("CollectLeft", 2, keeping),
        ("CollectLeft", 3, keeping),
        ("Partitioned", 0, join),
        ("Partitioned", 1, join),
    ] {
        if mode == "Partitioned" && round == 0 {
            partitioned_by_key(&s.ctx, false).await;
        }
        let plan = plan(&s, sql).await;
        let join = find_join(&plan).expect("a SpilljoinExec");
        let shown = datafusion::physical_plan::displayable(join.as_ref())
            .one_line()
            .to_string();
        assert!(shown.contains(&format!("mode={mode}")), "{shown}");
        let partitioning = join.properties().output_partitioning();
        assert_eq!(
            matches!(
                partitioning,
                datafusion::physical_plan::Partitioning::Hash(..)
            ),
            sql == keeping || mode == "Partitioned",
            "{mode} {round}: {partitioning:?}"
        );
        let partitions = partitioning.partition_count();
        let mut streams: Vec<_> = (0..partitions)
            .map(|p| join.execute(p, s.ctx.task_ctx()).unwrap())
            .collect();
        let first = streams[0].next().await.unwrap().unwrap();
        assert!(first.num_rows() > 0);
        // The join's consumer is registered while it runs (its reservation may be
        // empty for a moment, between two spilled pairs) and has held memory.
        let (consumers, _, peak) = join_consumers(&tracked);
        assert!(
            consumers > 0 && peak > 0,
            "{mode} {round}: {}",
            tracked.report_top(8)
        );
        assert!(
            spill_files(dir.path()) > 0,
            "{mode} {round}: the join spilled (forced)"
        );
        drop(streams);
        assert_eq!(
            join_consumers(&tracked),
            (0, 0, 0),
            "{mode} {round}: the drop freed the join's memory"
        );
        assert_eq!(
            spill_files(dir.path()),
            0,
            "the drop removed the spill files"
        );
        drop((join, plan));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while s.pool.reserved() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(s.pool.reserved(), 0, "{}", tracked.report_top(8));
    }
}

/// Makes DataFusion's `JoinSelection` partition every join by key, and says whether
/// `CollectLeftRule` then plans them as `CollectLeft` (`collect_left`).
async fn partitioned_by_key(ctx: &SessionContext, collect_left: bool) {
    for set in [
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 0".to_owned(),
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0".to_owned(),
        format!("SET spilljoin.collect_left = {collect_left}"),
    ] {
        ctx.sql(&set).await.unwrap().collect().await.unwrap();
    }
}

/// Joins DataFusion partitions by key run as one `CollectLeft` execution each
/// (`spilljoin.collect_left`): no `RepartitionExec` hashes their inputs, and every
/// join type answers as stock DataFusion's partitioned hash join does, with no limit,
/// forced to spill, and in a pool small enough that the builds spill; with the
/// setting off they stay `Partitioned`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_partitioned_by_key_run_as_one_collect_left_execution() {
    let dir = tempfile::tempdir().unwrap();
    let queries = [
        TWO_JOINS,
        "SELECT a.k, a.s, b.w FROM a LEFT JOIN b ON a.k = b.k AND a.v > b.w",
        "SELECT a.v, b.w FROM a RIGHT JOIN b ON a.k = b.k WHERE b.w % 7 = 0",
        "SELECT b.k, count(*), count(a.v) FROM a FULL JOIN b ON a.k = b.k GROUP BY b.k",
        "SELECT * FROM b WHERE EXISTS (SELECT 1 FROM a WHERE a.k = b.k AND a.v > b.w)",
        "SELECT * FROM b WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.k = b.k)",
        "SELECT * FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE a.k = b.k AND b.w < 1000)",
        "SELECT * FROM b WHERE k NOT IN (SELECT k FROM a WHERE v > 500)",
    ];
    let stock = session(false, unbounded(), dir.path(), false).await;
    partitioned_by_key(&stock.ctx, false).await;
    let sessions = three_sessions(dir.path(), 2 << 20).await;
    for (label, s) in &sessions {
        partitioned_by_key(&s.ctx, true).await;
        for sql in queries {
            let expected = query_rows(&stock, sql).await;
            assert!(!expected.is_empty(), "{sql}");
            let plan = plan(s, sql).await;
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(
                count_nodes(&plan, "SpilljoinExec") > 0,
                "{label} {sql}:\n{shown}"
            );
            let joins = spilling_joins(&plan);
            assert!(
                joins.iter().all(|j| {
                    j.hash_join().mode
                        == datafusion::physical_plan::joins::PartitionMode::CollectLeft
                        && j.children().iter().all(|c| {
                            c.name() != "RepartitionExec"
                                || !matches!(
                                    c.output_partitioning(),
                                    datafusion::physical_plan::Partitioning::Hash(..)
                                )
                        })
                }),
                "{label} {sql}:\n{shown}"
            );
            assert_eq!(query_rows(s, sql).await, expected, "{label} {sql}");
            assert_eq!(s.pool.reserved(), 0, "{label} {sql}");
        }
    }
    let (_, s) = &sessions[0];
    partitioned_by_key(&s.ctx, false).await;
    let plan = plan(s, TWO_JOINS).await;
    let joins = spilling_joins(&plan);
    assert_eq!(joins.len(), 2);
    assert!(joins.iter().all(
        |j| j.hash_join().mode == datafusion::physical_plan::joins::PartitionMode::Partitioned
    ));
}

/// Every `SpilljoinExec` in `plan`.
fn spilling_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&SpilljoinExec> {
    let mut joins: Vec<&SpilljoinExec> = plan.downcast_ref::<SpilljoinExec>().into_iter().collect();
    for child in plan.children() {
        joins.extend(spilling_joins(child));
    }
    joins
}

/// A join's baseline metrics are its output's, as any DataFusion operator's are
/// (`EXPLAIN ANALYZE` showed no batches and no bytes): the rows, batches and bytes of
/// the batches its streams returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_reports_its_output_rows_batches_and_bytes() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = tempfile::tempdir()?;
    let s = session(true, unbounded(), dir.path(), false).await;
    let plan = plan(&s, "SELECT a.k, a.s, b.w FROM a JOIN b ON a.k = b.k").await;
    let join = find_join(&plan).ok_or("no SpilljoinExec in the plan")?;
    let out = collect(Arc::clone(&join), s.ctx.task_ctx()).await?;
    let rows: usize = out.iter().map(|b| b.num_rows()).sum();
    assert!(rows > 0);
    let metrics = join.metrics().ok_or("the join has no metrics")?;
    assert_eq!(metrics.output_rows(), Some(rows));
    // (Baseline metrics are summed by kind: `sum_by_name` skips them.)
    let named = |name: &str| {
        metrics
            .sum(|m| m.value().name() == name)
            .map(|v| v.as_usize())
    };
    assert_eq!(named("output_batches"), Some(out.len()));
    let bytes: usize = out
        .iter()
        .map(datafusion::common::utils::memory::get_record_batch_memory_size)
        .sum();
    assert_eq!(named("output_bytes"), Some(bytes));
    Ok(())
}

/// The first `SpilljoinExec` in `plan`, depth first.
fn find_join(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.downcast_ref::<SpilljoinExec>().is_some() {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find_join)
}

/// The session's spilljoin consumers now: how many, their bytes, their peak bytes.
fn join_consumers(pool: &TrackConsumersPool<FairSpillPool>) -> (usize, usize, usize) {
    pool.metrics()
        .iter()
        .filter(|c| c.name.starts_with("SpilljoinExec"))
        .fold((0, 0, 0), |(n, bytes, peak), c| {
            (n + 1, bytes + c.reserved, peak.max(c.peak))
        })
}

/// Files under `dir` (DataFusion's temp directories hold spilljoin's).
fn spill_files(dir: &Path) -> usize {
    walk(dir)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "owner.lock"))
        .count()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_joins_spill_inside_one_small_pool() {
    let dir = tempfile::tempdir().unwrap();
    let reference = session(false, unbounded(), dir.path(), false).await;
    let expected = query_rows(&reference, TWO_JOINS).await;
    assert!(expected.len() > 1000);
    let limit = 1 << 20;
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(limit));
    let s = session(true, Arc::clone(&pool), dir.path(), false).await;
    let plan = plan(&s, TWO_JOINS).await;
    assert_eq!(count_nodes(&plan, "SpilljoinExec"), 2);
    let out = collect(Arc::clone(&plan), s.ctx.task_ctx()).await.unwrap();
    assert_eq!(sorted_rows(&out), expected);
    let spilled = joins_spilled(&plan);
    assert_eq!(spilled.len(), 2);
    assert!(
        spilled.iter().all(|&b| b > 0),
        "both joins spilled: {spilled:?}"
    );
    assert_eq!(pool.reserved(), 0);
    assert_eq!(spill_files(dir.path()), 0);
}

/// DataFusion registers a spilling consumer for every partition of many operators
/// (repartitions, aggregates, sorts), and a fair pool divides what spills among all
/// of them: with forty registered, a 2 MiB pool gives each 50 KiB, less than one of
/// the join's partition buffers. The joins still answer, borrowing up to their
/// planned share of the pool, and spill; everything is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_answer_when_a_fair_pool_splits_among_many_spilling_consumers() {
    const LIMIT: usize = 4 << 20;
    const WIDE_JOIN: &str = "SELECT a.k, a.v, b.w, length(b.pad) FROM a JOIN \
        (SELECT *, repeat('p', 300 + j) AS pad FROM b) b ON a.k = b.k";
    use datafusion::execution::memory_pool::MemoryConsumer;
    let dir = tempfile::tempdir().unwrap();
    let reference = session(false, unbounded(), dir.path(), false).await;
    let expected = query_rows(&reference, WIDE_JOIN).await;
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(LIMIT));
    let idle: Vec<_> = (0..40)
        .map(|i| {
            MemoryConsumer::new(format!("idle spilling consumer {i}"))
                .with_can_spill(true)
                .register(&pool)
        })
        .collect();
    let s = session(true, Arc::clone(&pool), dir.path(), false).await;
    let plan = plan(&s, WIDE_JOIN).await;
    let out = collect(Arc::clone(&plan), s.ctx.task_ctx()).await.unwrap();
    assert_eq!(sorted_rows(&out), expected);
    let spilled = joins_spilled(&plan);
    assert!(
        spilled.iter().all(|&b| b > 0),
        "the join spilled: {spilled:?}"
    );
    drop(idle);
    assert_eq!(pool.reserved(), 0);
    assert_eq!(spill_files(dir.path()), 0);
}

/// Spilled bytes of every `SpilljoinExec` in `plan`.
fn joins_spilled(plan: &Arc<dyn ExecutionPlan>) -> Vec<usize> {
    let mut out = Vec::new();
    if plan.downcast_ref::<SpilljoinExec>().is_some() {
        out.push(plan.metrics().and_then(|m| m.spilled_bytes()).unwrap_or(0));
    }
    for child in plan.children() {
        out.extend(joins_spilled(child));
    }
    out
}

/// Under the default `spilljoin.prepared_collect_left_min_bytes`, a `CollectLeft` join
/// that keeps its probe's partitioning and whose build DataFusion's statistics put
/// under 1 MiB stays a `HashJoinExec` (preparing a build of a few rows cost more
/// than it could save); with 0 it is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_collect_left_build_stays_a_hash_join() -> datafusion::error::Result<()> {
    let dir = tempfile::tempdir()?;
    let s = session(true, unbounded(), dir.path(), false).await;
    let sql = "SELECT g.j, sum(g.n), count(c.t) FROM c JOIN \
               (SELECT k % 400 AS j, count(*) AS n FROM a GROUP BY k % 400) g \
               ON c.j = g.j GROUP BY g.j";
    for set in [
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 1000000000000",
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 1000000000000",
    ] {
        s.ctx.sql(set).await?.collect().await?;
    }
    let mut kept = Vec::new();
    for min_bytes in ["1048576", "0"] {
        let set = format!("SET spilljoin.prepared_collect_left_min_bytes = {min_bytes}");
        s.ctx.sql(&set).await?.collect().await?;
        let plan = plan(&s, sql).await;
        kept.push(count_nodes(&plan, "HashJoinExec"));
    }
    assert_eq!(kept, vec![1, 0], "HashJoinExecs at 1 MiB and at 0");
    Ok(())
}

/// A `CollectLeft` join whose output keeps its hash-partitioned probe's partitioning
/// (the probe is an aggregate's output) is replaced, and the plan above that relies
/// on the partitioning (an aggregate grouping by the key without repartitioning)
/// gets the same answer as stock DataFusion: each output partition probes the one
/// prepared build with its own probe partition. With and without forced spilling,
/// and in a pool where the build must spill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_left_keeps_the_probe_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let g = "(SELECT k % 400 AS j, count(*) AS n, sum(v) AS sw FROM a GROUP BY k % 400)";
    let queries = [
        format!("SELECT c.t, g.j, g.n FROM c JOIN {g} g ON c.j = g.j"),
        format!("SELECT g.j, sum(g.n), count(c.t) FROM c JOIN {g} g ON c.j = g.j GROUP BY g.j"),
        format!("SELECT c.t, g.j, g.sw FROM c RIGHT JOIN {g} g ON c.j = g.j AND g.n > 250"),
        format!("SELECT g.j, g.n FROM {g} g WHERE g.j IN (SELECT j FROM c WHERE t > 'c-5')"),
        format!("SELECT g.j, g.n FROM {g} g WHERE NOT EXISTS (SELECT 1 FROM c WHERE c.j = g.j)"),
        format!(
            "SELECT g.j FROM {g} g WHERE EXISTS (SELECT 1 FROM c WHERE c.j = g.j) OR g.n > 255"
        ),
    ];
    let collect_left = |s: &Session| {
        let sets = [
            "SET datafusion.optimizer.hash_join_single_partition_threshold = 1000000000000",
            "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 1000000000000",
        ];
        let ctx = s.ctx.clone();
        async move {
            for set in sets {
                ctx.sql(set).await.unwrap().collect().await.unwrap();
            }
        }
    };
    let stock = session(false, unbounded(), dir.path(), false).await;
    collect_left(&stock).await;
    let sessions = three_sessions(dir.path(), 512 << 10).await;
    let mut join_types = std::collections::BTreeSet::new();
    let mut spilled_in_pool = false;
    for (label, s) in &sessions {
        collect_left(s).await;
        for sql in &queries {
            let expected = query_rows(&stock, sql).await;
            assert!(!expected.is_empty(), "{sql}");
            let plan = plan(s, sql).await;
            let joins = spilling_joins(&plan);
            assert_eq!(count_nodes(&plan, "HashJoinExec"), 0, "{label} {sql}");
            let keeping: Vec<_> = joins
                .iter()
                .filter(|j| {
                    let hash = j.hash_join();
                    hash.mode == datafusion::physical_plan::joins::PartitionMode::CollectLeft
                        && matches!(
                            hash.properties().output_partitioning(),
                            datafusion::physical_plan::Partitioning::Hash(..)
                        )
                })
                .collect();
            assert!(
                !keeping.is_empty(),
                "{label} {sql}: no CollectLeft join keeps the probe's partitioning:\n{}",
                datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
            );
            join_types.extend(
                keeping
                    .iter()
                    .map(|j| format!("{:?}", j.hash_join().join_type())),
            );
            let out = collect(Arc::clone(&plan), s.ctx.task_ctx()).await.unwrap();
            assert_eq!(sorted_rows(&out), expected, "{label} {sql}");
            let spilled = joins_spilled(&plan).iter().any(|&b| b > 0);
            assert!(
                spilled || *label != "forced spill",
                "{label} {sql}: the build spilled"
            );
            spilled_in_pool |= spilled && label.ends_with("pool");
            assert_eq!(s.pool.reserved(), 0, "{label} {sql}");
        }
    }
    // The pool is small enough that builds spill (the semi join's filtered build
    // fits in it).
    assert!(spilled_in_pool, "a build spilled in the small pool");
    let want = ["Inner", "Right", "RightSemi", "RightAnti", "RightMark"];
    assert_eq!(
        join_types,
        want.iter().map(|t| t.to_string()).collect(),
        "join types that output probe rows only"
    );
    assert_eq!(spill_files(dir.path()), 0);
}
