//! Every DataFusion join type through SQL with `SpilljoinRule`, against stock
//! DataFusion without the rule (the reference), on seeded random tables with NULL
//! keys, duplicate keys and one hot key, both sides in several partitions:
//!
//! - `big` (3,000 rows, keys 0..300, 10 % key 0, 5 % NULL) and `small` (800 rows,
//!   keys 0..600, 10 % key 0, 5 % NULL), in 3 partitions of odd batch sizes;
//! - inner and outer joins with ON-clause filters, two keys, an expression key, a
//!   string key; EXISTS / NOT EXISTS (semi, anti); IN / NOT IN with and without
//!   NULLs on either side (null-aware anti); correlated subqueries under OR (mark
//!   joins); with the small and with the big table outside, so that DataFusion's
//!   join selection plans both orientations (`LeftSemi` and `RightSemi`, ...);
//! - each in both partition modes (`CollectLeft`, forced by high single-partition
//!   thresholds, and `Partitioned`, by thresholds of 0 and `spilljoin.collect_left`
//!   off; with it on, as by default, those joins are planned `CollectLeft` by
//!   `CollectLeftRule`, a third mode), with and without forced
//!   spilling; each run checks that the plan that ran has `SpilljoinExec`s of the
//!   expected join type and mode and no `HashJoinExec`;
//! - empty inputs on either side; `SET spilljoin.enabled = false`.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{
    canonical_rows, difference, explain, random_table, run, Joins, Keys, Outcome, Setup, Table,
};
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;
use spilljoin_datafusion::{SpilljoinCodec, SpilljoinExec};

/// What the reference's answer must look like, so that no case passes on an empty
/// answer by accident.
#[derive(Debug, Clone, Copy)]
enum Rows {
    /// At least one row.
    Some,
    /// No row (NOT IN a subquery that has a NULL).
    None,
    /// Exactly this many.
    Exactly(usize),
}

/// One query.
struct Case {
    name: &'static str,
    sql: &'static str,
    /// The join type DataFusion plans for it (after join selection swapped the
    /// inputs where the left one is the larger).
    join_type: &'static str,
    rows: Rows,
}

const fn case(name: &'static str, sql: &'static str, join_type: &'static str) -> Case {
    Case {
        name,
        sql,
        join_type,
        rows: Rows::Some,
    }
}

/// The cases over `big` and `small`.
const CASES: &[Case] = &[
    case(
        "inner",
        "SELECT a.id, b.id, a.v, b.v FROM big a JOIN small b ON a.k = b.k",
        "Inner",
    ),
    case(
        "inner, ON filter",
        "SELECT a.id, b.id FROM big a JOIN small b ON a.k = b.k AND a.v > b.v",
        "Inner",
    ),
    case(
        "left, ON filter, big outside",
        "SELECT a.id, b.id FROM big a LEFT JOIN small b ON a.k = b.k AND a.v > b.v",
        "Right",
    ),
    // The ON filter on `big` alone goes below the join: `big` filtered is estimated
    // smaller than `small`, so join selection swaps the sides.
    case(
        "left, ON filter, small outside",
        "SELECT a.id, b.id FROM small a LEFT JOIN big b ON a.k = b.k AND b.k2 = 1",
        "Right",
    ),
    case(
        "right, ON filter",
        "SELECT a.id, b.id FROM big a RIGHT JOIN small b ON a.k = b.k AND a.v < b.v",
        "Left",
    ),
    case(
        "right, small outside",
        "SELECT a.id, b.id FROM big a RIGHT JOIN small b ON a.k = b.k",
        "Left",
    ),
    case(
        "full, ON filter",
        "SELECT a.id, b.id FROM big a FULL JOIN small b ON a.k = b.k AND a.v + b.v > 100",
        "Full",
    ),
    case(
        "full",
        "SELECT a.id, b.id FROM small a FULL JOIN big b ON a.k = b.k",
        "Full",
    ),
    case(
        "two keys",
        "SELECT a.id, b.id FROM big a JOIN small b ON a.k = b.k AND a.k2 = b.k2",
        "Inner",
    ),
    case(
        "two keys, left",
        "SELECT a.id, b.id FROM small a LEFT JOIN big b ON a.k = b.k AND a.k2 = b.k2",
        "Left",
    ),
    case(
        "expression key",
        "SELECT a.id, b.id FROM big a JOIN small b ON a.k + 1 = b.k",
        "Inner",
    ),
    case(
        "string key",
        "SELECT a.id, b.id FROM big a JOIN small b ON a.s = b.s AND a.k2 = b.k2",
        "Inner",
    ),
    case(
        "aggregate over a skewed join",
        "SELECT a.k, count(*), sum(a.v), sum(b.v) FROM big a JOIN small b ON a.k = b.k \
         GROUP BY a.k",
        "Inner",
    ),
    case(
        "exists, big outside",
        "SELECT a.id FROM big a WHERE EXISTS (SELECT 1 FROM small b WHERE b.k = a.k)",
        "RightSemi",
    ),
    case(
        "exists, small outside",
        "SELECT a.id FROM small a WHERE EXISTS (SELECT 1 FROM big b WHERE b.k = a.k)",
        "LeftSemi",
    ),
    case(
        "exists with a correlated filter",
        "SELECT a.id FROM big a WHERE EXISTS \
         (SELECT 1 FROM small b WHERE b.k = a.k AND b.v > a.v)",
        "RightSemi",
    ),
    case(
        "not exists, big outside",
        "SELECT a.id FROM big a WHERE NOT EXISTS (SELECT 1 FROM small b WHERE b.k = a.k)",
        "RightAnti",
    ),
    case(
        "not exists with a correlated filter, small outside",
        "SELECT a.id FROM small a WHERE NOT EXISTS \
         (SELECT 1 FROM big b WHERE b.k = a.k AND b.v < a.v)",
        "LeftAnti",
    ),
    case(
        "in, NULLs in both",
        "SELECT a.id FROM big a WHERE a.k IN (SELECT k FROM small)",
        "RightSemi",
    ),
    case(
        "in, small outside",
        "SELECT a.id FROM small a WHERE a.k IN (SELECT k FROM big WHERE v > 50)",
        // `big` filtered is estimated the smaller side: join selection swaps.
        "RightSemi",
    ),
    Case {
        rows: Rows::None,
        ..case(
            "not in, NULL in the subquery",
            "SELECT a.id FROM big a WHERE a.k NOT IN (SELECT k FROM small)",
            "LeftAnti",
        )
    },
    case(
        "not in, NULLs outside only",
        "SELECT a.id FROM big a WHERE a.k NOT IN (SELECT k FROM small WHERE k IS NOT NULL)",
        "LeftAnti",
    ),
    case(
        "not in, small outside",
        "SELECT a.id FROM small a WHERE a.k NOT IN (SELECT k FROM big WHERE k IS NOT NULL)",
        "LeftAnti",
    ),
    Case {
        rows: Rows::Exactly(3000),
        ..case(
            "not in an empty subquery keeps NULL keys",
            "SELECT a.id FROM big a WHERE a.k NOT IN (SELECT k FROM small WHERE v > 1000)",
            "LeftAnti",
        )
    },
    Case {
        rows: Rows::None,
        ..case(
            "not in, only NULL keys outside",
            "SELECT a.id FROM big a WHERE a.k IS NULL AND a.k NOT IN \
             (SELECT k FROM small WHERE k IS NOT NULL)",
            "LeftAnti",
        )
    },
    case(
        "not in, no NULLs anywhere",
        "SELECT a.id FROM big a WHERE a.k IS NOT NULL AND a.k NOT IN \
         (SELECT k FROM small WHERE k IS NOT NULL)",
        "LeftAnti",
    ),
    case(
        "exists or, big outside (mark)",
        "SELECT a.id FROM big a WHERE EXISTS (SELECT 1 FROM small b WHERE b.k = a.k) \
         OR a.v > 90",
        "RightMark",
    ),
    case(
        "exists or, small outside (mark)",
        "SELECT a.id FROM small a WHERE EXISTS (SELECT 1 FROM big b WHERE b.k = a.k) \
         OR a.v > 90",
        "LeftMark",
    ),
    case(
        "not exists or (mark)",
        "SELECT a.id FROM small a WHERE NOT EXISTS \
         (SELECT 1 FROM big b WHERE b.k = a.k AND b.v > a.v) OR a.v < 10",
        "LeftMark",
    ),
    case(
        "in or (mark)",
        "SELECT a.id FROM big a WHERE a.k IN (SELECT k FROM small) OR a.v > 90",
        "RightMark",
    ),
    case(
        "not in or (mark)",
        "SELECT a.id FROM small a WHERE a.k NOT IN (SELECT k FROM big WHERE k IS NOT NULL) \
         OR a.v > 90",
        // `big` filtered is estimated the smaller side: join selection swaps.
        "RightMark",
    ),
    case(
        "correlated scalar subquery",
        "SELECT a.id, (SELECT count(*) FROM small b WHERE b.k = a.k) FROM big a",
        // The subquery's aggregate (one row a key) is the smaller side: swapped.
        "Right",
    ),
];

/// The tables of [`CASES`].
fn tables() -> Vec<Table> {
    let big = Keys {
        first: 0,
        distinct: 300,
        hot: 0.1,
        nulls: 0.05,
    };
    let small = Keys {
        distinct: 600,
        ..big
    };
    vec![
        random_table("big", 3000, 3, 29, big),
        random_table("small", 800, 3, 30, small),
        common::empty_table("empty"),
    ]
}

/// A partition mode and the settings that make DataFusion plan it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    CollectLeft,
    /// Partitioned by DataFusion, and kept so (`spilljoin.collect_left = false`).
    Partitioned,
    /// Partitioned by DataFusion, and planned `CollectLeft` by `CollectLeftRule`
    /// (but where the plan is for a distributed engine).
    PartitionedToCollectLeft,
}

impl Mode {
    fn setup(self, setup: Setup) -> Setup {
        let threshold = match self {
            Mode::CollectLeft => "1000000000000",
            Mode::Partitioned | Mode::PartitionedToCollectLeft => "0",
        };
        let collect_left = self != Mode::Partitioned;
        setup
            .set("spilljoin.collect_left", &collect_left.to_string())
            .set(
                "datafusion.optimizer.hash_join_single_partition_threshold",
                threshold,
            )
            .set(
                "datafusion.optimizer.hash_join_single_partition_threshold_rows",
                threshold,
            )
    }

    fn shown(self) -> &'static str {
        match self {
            Mode::CollectLeft | Mode::PartitionedToCollectLeft => "mode=CollectLeft",
            Mode::Partitioned => "mode=Partitioned",
        }
    }

    /// The mode a plan for a distributed engine has: `CollectLeftRule` keeps
    /// DataFusion's.
    fn distributed(self) -> Mode {
        match self {
            Mode::PartitionedToCollectLeft => Mode::Partitioned,
            other => other,
        }
    }
}

/// Why `outcome` of `case` in `mode` is wrong against `reference`, if it is.
fn check(case: &Case, mode: Mode, reference: &Outcome, outcome: &Outcome) -> Vec<String> {
    let mut wrong = Vec::new();
    let joins = &outcome.joins;
    if joins.spilljoin.is_empty() || !joins.hash.is_empty() {
        wrong.push(format!(
            "no SpilljoinExec, or a HashJoinExec left: {:#?}",
            joins.all()
        ));
    }
    let join_type = format!("join_type={}", case.join_type);
    if !joins.spilljoin.iter().any(|line| line.contains(&join_type)) {
        wrong.push(format!(
            "no SpilljoinExec with {join_type}: {:#?}",
            joins.spilljoin
        ));
    }
    for line in &joins.spilljoin {
        // A null-aware anti join (NOT IN) is always CollectLeft.
        if !line.contains(mode.shown()) && !line.contains("null_aware") {
            wrong.push(format!("not {}: {line}", mode.shown()));
        }
    }
    wrong.extend(difference(&reference.rows, &outcome.rows, false));
    wrong
}

/// Asserts that the reference's answer to `case` is as the case says.
fn check_reference(case: &Case, reference: &Outcome) {
    let n = reference.rows.len();
    let fits = match case.rows {
        Rows::Some => n > 0,
        Rows::None => n == 0,
        Rows::Exactly(want) => n == want,
    };
    assert!(
        fits,
        "{}: the reference has {n} rows, expected {:?}",
        case.name, case.rows
    );
}

/// Runs every case in `mode`, with and without forced spilling, planned for one
/// process and for a distributed engine, against the reference; returns the join
/// types the plans had.
async fn all_cases(mode: Mode) -> BTreeSet<String> {
    let tables = tables();
    let reference = Setup::stock().context(&tables);
    let plain = mode.setup(Setup::spilljoin()).context(&tables);
    let spilling = mode
        .setup(Setup::spilljoin().force_spill())
        .context(&tables);
    // As planned for a distributed engine: no join coordinates its partitions, and
    // `NOT IN` joins each outer partition with the whole subquery.
    let distributed = mode
        .setup(Setup::spilljoin().set("spilljoin.distributed", "true"))
        .context(&tables);
    let distributed_spilling = mode
        .setup(
            Setup::spilljoin()
                .force_spill()
                .set("spilljoin.distributed", "true"),
        )
        .context(&tables);
    let mut wrong = Vec::new();
    let mut join_types = BTreeSet::new();
    for case in CASES {
        let want = run(&reference, case.sql).await.unwrap();
        check_reference(case, &want);
        for (label, ctx) in [
            ("no spill", &plain),
            ("forced spill", &spilling),
            ("distributed", &distributed),
            ("distributed, forced spill", &distributed_spilling),
        ] {
            match run(ctx, case.sql).await {
                Ok(got) => {
                    for line in &got.joins.spilljoin {
                        join_types.extend(join_type_of(line));
                    }
                    let planned = match label.starts_with("distributed") {
                        true => mode.distributed(),
                        false => mode,
                    };
                    for why in check(case, planned, &want, &got) {
                        wrong.push(format!("{} ({mode:?}, {label}): {why}", case.name));
                    }
                    let per_outer = |line: &&String| line.contains("per outer partition");
                    let not_in = got
                        .joins
                        .spilljoin
                        .iter()
                        .filter(|l| l.contains("null_aware"));
                    if label.starts_with("distributed") && !not_in.clone().all(|l| per_outer(&l)) {
                        wrong.push(format!("{}: NOT IN not per outer partition", case.name));
                    }
                }
                Err(e) => wrong.push(format!("{} ({mode:?}, {label}): failed: {e}", case.name)),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    join_types
}

/// The join type a plan line shows.
fn join_type_of(line: &str) -> Option<String> {
    let rest = &line[line.find("join_type=")? + "join_type=".len()..];
    Some(rest.split(',').next()?.trim().to_owned())
}

const ALL_JOIN_TYPES: [&str; 10] = [
    "Inner",
    "Left",
    "Right",
    "Full",
    "LeftSemi",
    "RightSemi",
    "LeftAnti",
    "RightAnti",
    "LeftMark",
    "RightMark",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_join_type_collect_left() {
    let seen = all_cases(Mode::CollectLeft).await;
    let all: BTreeSet<String> = ALL_JOIN_TYPES.iter().map(|t| t.to_string()).collect();
    assert_eq!(seen, all, "join types planned in CollectLeft mode");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_join_type_partitioned() {
    let seen = all_cases(Mode::Partitioned).await;
    let all: BTreeSet<String> = ALL_JOIN_TYPES.iter().map(|t| t.to_string()).collect();
    assert_eq!(seen, all, "join types planned in Partitioned mode");
}

/// Joins DataFusion partitions by key, planned `CollectLeft` by `CollectLeftRule`:
/// every join type answers as stock's partitioned hash join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_join_type_partitioned_by_datafusion_runs_collect_left() {
    let seen = all_cases(Mode::PartitionedToCollectLeft).await;
    let all: BTreeSet<String> = ALL_JOIN_TYPES.iter().map(|t| t.to_string()).collect();
    assert_eq!(seen, all, "join types planned Partitioned, run CollectLeft");
}

/// Mark joins show as such in `EXPLAIN`, in both orientations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correlated_subqueries_under_or_plan_mark_joins() {
    let ctx = Setup::spilljoin().context(&tables());
    for (sql, mark) in [
        (
            "SELECT a.id FROM small a WHERE EXISTS (SELECT 1 FROM big b WHERE b.k = a.k) \
             OR a.v > 90",
            "join_type=LeftMark",
        ),
        (
            "SELECT a.id FROM big a WHERE EXISTS (SELECT 1 FROM small b WHERE b.k = a.k) \
             OR a.v > 90",
            "join_type=RightMark",
        ),
    ] {
        let plan = explain(&ctx, sql).await;
        assert!(
            plan.lines()
                .any(|line| line.contains("SpilljoinExec") && line.contains(mark)),
            "{mark} expected:\n{plan}"
        );
    }
}

/// `SET spilljoin.enabled = false` plans DataFusion's own join again, and `true`
/// brings the spilling one back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_enabled_false_plans_hash_join() {
    let ctx = Setup::spilljoin().context(&tables());
    let sql = "SELECT a.id, b.id FROM big a JOIN small b ON a.k = b.k";
    let plan = explain(&ctx, sql).await;
    assert!(
        plan.contains("SpilljoinExec") && !plan.contains("HashJoinExec"),
        "{plan}"
    );
    ctx.sql("SET spilljoin.enabled = false").await.unwrap();
    let plan = explain(&ctx, sql).await;
    assert!(
        plan.contains("HashJoinExec") && !plan.contains("SpilljoinExec"),
        "{plan}"
    );
    let reference = run(&Setup::stock().context(&tables()), sql).await.unwrap();
    let stock = run(&ctx, sql).await.unwrap();
    assert!(stock.joins.spilljoin.is_empty() && !stock.joins.hash.is_empty());
    assert_eq!(difference(&reference.rows, &stock.rows, false), None);
    ctx.sql("SET spilljoin.enabled = true").await.unwrap();
    let plan = explain(&ctx, sql).await;
    assert!(
        plan.contains("SpilljoinExec") && !plan.contains("HashJoinExec"),
        "{plan}"
    );
}

/// Joins with an empty table on either side, in both modes, with and without forced
/// spilling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_inputs() {
    let queries = [
        (
            "SELECT a.id, b.id FROM big a JOIN empty b ON a.k = b.k",
            Rows::None,
        ),
        (
            "SELECT a.id, b.id FROM empty a JOIN big b ON a.k = b.k",
            Rows::None,
        ),
        (
            "SELECT a.id, b.id FROM big a LEFT JOIN empty b ON a.k = b.k",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id, b.id FROM empty a LEFT JOIN big b ON a.k = b.k",
            Rows::None,
        ),
        (
            "SELECT a.id, b.id FROM big a RIGHT JOIN empty b ON a.k = b.k",
            Rows::None,
        ),
        (
            "SELECT a.id, b.id FROM empty a RIGHT JOIN big b ON a.k = b.k",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id, b.id FROM big a FULL JOIN empty b ON a.k = b.k",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id, b.id FROM empty a FULL JOIN big b ON a.k = b.k",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id FROM big a WHERE EXISTS (SELECT 1 FROM empty b WHERE b.k = a.k)",
            Rows::None,
        ),
        (
            "SELECT a.id FROM big a WHERE NOT EXISTS (SELECT 1 FROM empty b WHERE b.k = a.k)",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id FROM big a WHERE a.k NOT IN (SELECT k FROM empty)",
            Rows::Exactly(3000),
        ),
        (
            "SELECT a.id FROM empty a WHERE a.k NOT IN (SELECT k FROM big)",
            Rows::None,
        ),
        (
            "SELECT a.id FROM big a WHERE EXISTS (SELECT 1 FROM empty b WHERE b.k = a.k) \
             OR a.v > 90",
            Rows::Some,
        ),
    ];
    let tables = tables();
    let reference = Setup::stock().context(&tables);
    let mut wrong = Vec::new();
    for mode in [Mode::CollectLeft, Mode::Partitioned] {
        for spill in [false, true] {
            let setup = match spill {
                true => Setup::spilljoin().force_spill(),
                false => Setup::spilljoin(),
            };
            let ctx = mode.setup(setup).context(&tables);
            for (sql, rows) in queries {
                let want = run(&reference, sql).await.unwrap();
                let fits = match rows {
                    Rows::Some => !want.rows.is_empty(),
                    Rows::None => want.rows.is_empty(),
                    Rows::Exactly(n) => want.rows.len() == n,
                };
                assert!(fits, "{sql}: the reference has {} rows", want.rows.len());
                match run(&ctx, sql).await {
                    Ok(got) if got.joins.spilljoin.is_empty() || !got.joins.hash.is_empty() => {
                        wrong.push(format!("{sql} ({mode:?}): joins {:#?}", got.joins.all()))
                    }
                    Ok(got) => wrong.extend(
                        difference(&want.rows, &got.rows, false)
                            .map(|d| format!("{sql} ({mode:?}, spill {spill}): {d}")),
                    ),
                    Err(e) => wrong.push(format!("{sql} ({mode:?}, spill {spill}): {e}")),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every case, planned with forced spilling in both partition modes, encoded with
/// `SpilljoinCodec` (composed with DataFusion's default codec) and decoded in a
/// stock session (no rule, no `spilljoin` settings), as a distributed engine's
/// executor would: the same joins (as `EXPLAIN` shows them, a `NOT IN` per outer
/// partition included) with the planner's settings and pool share, and the
/// reference's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_round_trips_through_the_codec() {
    let tables = tables();
    let executor = Setup::stock().context(&tables);
    let codec = SpilljoinCodec::composed_with(Arc::new(DefaultPhysicalExtensionCodec {}));
    let mut wrong = Vec::new();
    // (Planned for a distributed engine too: a NOT IN per outer partition must
    // decode as one.)
    for (mode, distributed) in [
        (Mode::CollectLeft, false),
        (Mode::Partitioned, false),
        (Mode::CollectLeft, true),
    ] {
        let planner = mode
            .setup(
                Setup::spilljoin()
                    .force_spill()
                    .set("spilljoin.distributed", &distributed.to_string()),
            )
            .context(&tables);
        for case in CASES {
            let want = run(&executor, case.sql).await.unwrap();
            let plan = planner.sql(case.sql).await.unwrap();
            let plan = plan.create_physical_plan().await.unwrap();
            let bytes =
                physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), codec.as_ref())
                    .unwrap();
            let decoded = physical_plan_from_bytes_with_extension_codec(
                &bytes,
                &executor.task_ctx(),
                codec.as_ref(),
            )
            .unwrap();
            let (before, after) = (Joins::of(&plan), Joins::of(&decoded));
            let name = format!("{} ({mode:?}, distributed {distributed})", case.name);
            if before.spilljoin.is_empty() || before.spilljoin != after.spilljoin {
                wrong.push(format!("{name}: joins {before:#?} decoded as {after:#?}"));
            }
            for (was, is) in spilling_joins(&plan).iter().zip(spilling_joins(&decoded)) {
                let forced = is.settings().map(|s| (s.force_spill, s.force_spill_depth));
                if forced != Some((1.0, 2)) || is.pool_share() != was.pool_share() {
                    wrong.push(format!(
                        "{name}: settings {forced:?}, share {}",
                        is.pool_share()
                    ));
                }
            }
            match collect(decoded, executor.task_ctx()).await {
                Ok(batches) => {
                    let got = canonical_rows(&batches);
                    wrong.extend(
                        difference(&want.rows, &got, false).map(|d| format!("{name}: {d}")),
                    );
                }
                Err(e) => wrong.push(format!("{name}: the decoded plan failed: {e}")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The `SpilljoinExec`s of `plan`, top down.
fn spilling_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&SpilljoinExec> {
    let mut joins: Vec<&SpilljoinExec> = plan.downcast_ref::<SpilljoinExec>().into_iter().collect();
    for child in plan.children() {
        joins.extend(spilling_joins(child));
    }
    joins
}

/// What is not an encoded `SpilljoinExec` (another node's bytes, a cut-off or
/// altered encoding) is refused with an error when decoded.
#[tokio::test]
async fn the_codec_refuses_what_it_did_not_encode() {
    use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};
    let tables = tables();
    let ctx = Mode::Partitioned.setup(Setup::spilljoin()).context(&tables);
    let plan = ctx.sql(CASES[0].sql).await.unwrap();
    let plan = plan.create_physical_plan().await.unwrap();
    let join = spilling_joins(&plan)[0];
    let inputs: Vec<Arc<dyn ExecutionPlan>> = join.children().into_iter().cloned().collect();
    let converter = DefaultPhysicalProtoConverter {};
    let mut encoded = Vec::new();
    let node: Arc<dyn ExecutionPlan> =
        Arc::new(SpilljoinExec::try_new(Arc::clone(join.hash_join())).unwrap());
    SpilljoinCodec
        .try_encode(node, &mut encoded, &converter)
        .unwrap();
    let decode = |buf: &[u8]| SpilljoinCodec.try_decode(buf, &inputs, &ctx.task_ctx(), &converter);
    assert!(decode(&encoded).is_ok());
    for cut in [0, 4, 8, 11, 12, 20, encoded.len() - 1] {
        assert!(
            decode(&encoded[..cut]).is_err(),
            "cut at {cut} of {}",
            encoded.len()
        );
    }
    let mut altered = encoded.clone();
    altered[0] = b'X';
    assert!(decode(&altered).is_err());
    let other = Arc::clone(&inputs[0]);
    assert!(SpilljoinCodec
        .try_encode(other, &mut Vec::new(), &converter)
        .is_err());
}

/// `NOT IN` planned for a distributed engine, in one process with more partitions
/// than the tables: a subquery that is itself repartitioned (`DISTINCT`) is prepared
/// once for every outer partition (executing it once per partition would run its
/// repartition twice), and limits keep their meaning: on the outer query (pushed
/// into the coalesce the rule would remove) and on the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_not_in_prepares_the_subquery_once_and_keeps_limits() {
    let tables = tables();
    let mut reference = Setup::stock();
    reference.target_partitions = 4;
    let reference = reference.context(&tables);
    let mut ours = Setup::spilljoin().set("spilljoin.distributed", "true");
    ours.target_partitions = 4;
    let ours = ours.context(&tables);
    let distinct = "SELECT a.id FROM big a WHERE a.k NOT IN (SELECT DISTINCT k FROM small \
                    WHERE k IS NOT NULL AND v > 500)";
    let want = run(&reference, distinct).await.unwrap();
    assert!(!want.rows.is_empty());
    let got = run(&ours, distinct).await.unwrap();
    let per_outer = got
        .joins
        .spilljoin
        .iter()
        .any(|l| l.contains("per outer partition"));
    assert!(per_outer, "{:#?}", got.joins.all());
    assert_eq!(difference(&want.rows, &got.rows, false), None);

    // Which rows a LIMIT without ORDER BY keeps is not defined; how many is.
    for (sql, rows) in [
        (format!("{distinct} LIMIT 7"), 7),
        (
            "SELECT count(*) FROM (SELECT * FROM big LIMIT 100) a WHERE a.k NOT IN \
             (SELECT k FROM small WHERE k IS NOT NULL)"
                .to_owned(),
            1,
        ),
    ] {
        let got = run(&ours, &sql).await.unwrap();
        assert_eq!(got.rows.len(), rows, "{sql}: {:?}", got.rows);
    }
    let counted = run(
        &ours,
        "SELECT count(*) FROM (SELECT * FROM big LIMIT 100) a WHERE a.k NOT IN \
         (SELECT k FROM small WHERE k IS NOT NULL AND k < 0)",
    )
    .await
    .unwrap();
    // An empty subquery keeps every outer row, NULL keys too: all 100.
    assert_eq!(counted.rows, vec!["100".to_owned()], "{counted:?}");
}
