//! The 22 TPC-H queries through DataFusion SQL with `SpilljoinRule`, against stock
//! DataFusion without the rule and without a memory limit (the reference).
//!
//! The data is generated in memory by `tpchgen-arrow` at scale factor [`SF`], each
//! table in 2 partitions; the query texts (tests/tpch/q*.sql) are the benchmark's
//! with its validation parameters. Runs:
//! - the rule, no limit;
//! - the rule, forced spilling (every build partition spills, two levels down);
//! - the rule under a `FairSpillPool` of [`FAIR_LIMIT`] bytes, a limit at which stock
//!   DataFusion fails with "Resources exhausted" in its hash join for some queries
//!   (checked here); spilljoin must answer those, and where any query fails, the
//!   failing consumer must be another operator (a sort, an aggregate, a repartition),
//!   never a join;
//! - the same under a `GreedyMemoryPool` of [`GREEDY_LIMIT`] bytes.
//!
//! Every run also checks that the plan that ran has a `SpilljoinExec` for each
//! `HashJoinExec` of the reference plan and no `HashJoinExec` left, so no answer
//! can come from the stock join.

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use common::{
    difference, failing_consumer, is_join_consumer, run, Outcome, Pool, Setup, Table, TPCH_ORDERED,
    TPCH_QUERIES,
};

/// The scale factor: lineitem has about 60,000 rows.
const SF: f64 = 0.01;

/// A fair spill pool at which stock DataFusion's hash join runs out of memory on
/// some queries at [`SF`] (asserted by `fair_pool_limit`: Q18 when this was
/// written). Smaller limits fail now and then in other operators, and in joins
/// whose working set another operator took first.
const FAIR_LIMIT: usize = 8 << 20;

/// The greedy pool's limit (stock's joins failed on Q7 and Q18 when this was written).
const GREEDY_LIMIT: usize = 4 << 20;

fn tables() -> &'static [Table] {
    static TABLES: OnceLock<Vec<Table>> = OnceLock::new();
    TABLES.get_or_init(|| common::tpch_tables(SF, 2))
}

/// Stock DataFusion's answers and plans, no limit, computed once for all tests.
async fn reference() -> &'static [Outcome] {
    static REFERENCE: tokio::sync::OnceCell<Vec<Outcome>> = tokio::sync::OnceCell::const_new();
    REFERENCE
        .get_or_init(|| async {
            let ctx = Setup::stock().context(tables());
            let mut outcomes = Vec::new();
            for (i, sql) in TPCH_QUERIES.iter().enumerate() {
                let outcome = run(&ctx, sql).await;
                outcomes.push(outcome.unwrap_or_else(|e| panic!("reference Q{}: {e}", i + 1)));
            }
            outcomes
        })
        .await
}

/// Why query `q`'s `outcome` is wrong against the reference, if it is. Every
/// `HashJoinExec` of the reference is replaced (Q15's join of `supplier` with the
/// revenue view, `CollectLeft` with an output that keeps its hash-partitioned
/// probe's partitioning, too: `spilljoin.prepared_collect_left`).
fn check(q: usize, reference: &Outcome, outcome: &Outcome) -> Option<String> {
    let joins = &outcome.joins;
    if !joins.hash.is_empty() || joins.spilljoin.len() != reference.joins.hash.len() {
        return Some(format!(
            "Q{q}: the reference plan has {} HashJoinExec, this one {} SpilljoinExec and {} \
             HashJoinExec: {:#?}",
            reference.joins.hash.len(),
            joins.spilljoin.len(),
            joins.hash.len(),
            joins.all()
        ));
    }
    let ordered = TPCH_ORDERED.contains(&q);
    difference(&reference.rows, &outcome.rows, ordered).map(|d| format!("Q{q}: {d}"))
}

/// Runs all 22 queries under `setup`; every one must succeed with the reference's
/// answer and a plan of spilling joins.
async fn all_queries_match(label: &str, setup: Setup) {
    let reference = reference().await;
    let ctx = setup.context(tables());
    let started = Instant::now();
    let mut wrong = Vec::new();
    for (i, sql) in TPCH_QUERIES.iter().enumerate() {
        match run(&ctx, sql).await {
            Ok(outcome) => wrong.extend(check(i + 1, &reference[i], &outcome)),
            Err(e) => wrong.push(format!("Q{}: failed: {e}", i + 1)),
        }
    }
    println!("{label}: 22 queries in {:?}", started.elapsed());
    assert!(wrong.is_empty(), "{label}:\n{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_rule() {
    all_queries_match("spilljoin, no limit", Setup::spilljoin()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forced_spilling() {
    all_queries_match(
        "spilljoin, forced spilling",
        Setup::spilljoin().force_spill(),
    )
    .await;
}

/// How each query of one run under a limit ended.
#[derive(Default)]
struct LimitedRun {
    /// Queries answered (and checked against the reference).
    answered: Vec<usize>,
    /// Queries that failed because a join ran out of memory, with the error.
    join_failures: Vec<(usize, String)>,
    /// Queries that failed because another operator did, with its consumer.
    other_failures: Vec<(usize, String)>,
    /// Wrong answers, plans without spilling joins, and errors that are not
    /// "Resources exhausted" for a named consumer.
    wrong: Vec<String>,
}

/// Runs all 22 queries under `setup`, sorting the outcomes into a [`LimitedRun`].
async fn run_limited(setup: &Setup) -> LimitedRun {
    let reference = reference().await;
    let ctx = setup.context(tables());
    let mut result = LimitedRun::default();
    for (i, sql) in TPCH_QUERIES.iter().enumerate() {
        let q = i + 1;
        match run(&ctx, sql).await {
            Ok(outcome) if !setup.rule => {
                if let Some(d) = difference(&reference[i].rows, &outcome.rows, false) {
                    result.wrong.push(format!("stock Q{q}: {d}"));
                }
                result.answered.push(q);
            }
            Ok(outcome) => {
                result.wrong.extend(check(q, &reference[i], &outcome));
                result.answered.push(q);
            }
            Err(e) => match failing_consumer(&e) {
                Some(consumer) if is_join_consumer(&consumer) => {
                    result.join_failures.push((q, e.to_string()))
                }
                Some(consumer) => result.other_failures.push((q, consumer)),
                None => result.wrong.push(format!("Q{q}: failed: {e}")),
            },
        }
    }
    result
}

/// Stock DataFusion and spilljoin under the same `pool`: stock's hash join must run
/// out of memory on some query that spilljoin answers; spilljoin's joins never run
/// out, and every answer it gives is the reference's.
async fn under_limit(label: &str, pool: Pool) {
    // SPILLJOIN_FORCE_SPILL spills every partition whatever the memory, so the
    // probe buffers all of them: what a join needs is then no longer what the limit
    // tests. `with_forced_spilling` covers that mode's answers.
    if std::env::var_os("SPILLJOIN_FORCE_SPILL").is_some() {
        println!("{label}: skipped under SPILLJOIN_FORCE_SPILL");
        return;
    }
    let started = Instant::now();
    // DataFusion's sorts set 10 MiB aside for merging by default, more than the
    // limit: with that, every sort fails before a join is reached.
    let small_sorts = |setup: Setup| {
        setup.pool(pool).set(
            "datafusion.execution.sort_spill_reservation_bytes",
            "262144",
        )
    };
    let stock = run_limited(&small_sorts(Setup::stock())).await;
    let ours = run_limited(&small_sorts(Setup::spilljoin())).await;
    println!(
        "{label}: stock answered {:?}, its joins failed on {:?}, other operators on {:?}",
        stock.answered,
        stock.join_failures.iter().map(|f| f.0).collect::<Vec<_>>(),
        stock.other_failures
    );
    println!(
        "{label}: spilljoin answered {:?}; other operators failed on {:?} ({:?})",
        ours.answered,
        ours.other_failures,
        started.elapsed()
    );
    assert!(
        stock.wrong.is_empty(),
        "{label}, stock:\n{}",
        stock.wrong.join("\n")
    );
    assert!(
        ours.wrong.is_empty(),
        "{label}, spilljoin:\n{}",
        ours.wrong.join("\n")
    );
    assert!(
        ours.join_failures.is_empty(),
        "{label}: spilljoin's joins ran out of memory: {:#?}",
        ours.join_failures
    );
    let rescued: Vec<usize> = stock
        .join_failures
        .iter()
        .map(|f| f.0)
        .filter(|q| ours.answered.contains(q))
        .collect();
    assert!(
        !rescued.is_empty(),
        "{label}: no query where stock's hash join runs out of memory and spilljoin answers \
         (stock join failures: {:?}); the limit does not test what stock cannot do",
        stock.join_failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_pool_limit() {
    under_limit("fair spill pool", Pool::Fair(limit("FAIR", FAIR_LIMIT))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_pool_limit() {
    under_limit("greedy pool", Pool::Greedy(limit("GREEDY", GREEDY_LIMIT))).await;
}

/// `default`, or `SPILLJOIN_TPCH_{pool}_LIMIT` bytes when that is set (to try other
/// limits by hand).
fn limit(pool: &str, default: usize) -> usize {
    std::env::var(format!("SPILLJOIN_TPCH_{pool}_LIMIT"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
