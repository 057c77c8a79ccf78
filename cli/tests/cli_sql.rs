//! `spilljoin sql` end to end: the binary runs queries over Parquet and CSV tables,
//! and its answers are checked against a nested loop over the fixture's rows and
//! against stock DataFusion (no spilljoin rule, no memory limit) run here in the
//! test.

mod cli_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use cli_support::*;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};

/// `spilljoin sql ARGS...`.
fn sql(args: &[&str]) -> Run {
    let mut all = vec!["sql"];
    all.extend_from_slice(args);
    spilljoin(&all)
}

/// `--table NAME=PATH`.
fn table(name: &str, path: &Path) -> [String; 2] {
    ["--table".into(), format!("{name}={}", path.display())]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The reference: stock DataFusion (no spilljoin rule, no memory limit) running
/// `query` over `tables` (Parquet or CSV files or directories).
fn stock(tables: &[(&str, &Path)], query: &str) -> Table {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let ctx = SessionContext::new();
        for (name, path) in tables {
            let location = path.to_str().unwrap();
            let csv = path.extension().is_some_and(|e| e == "csv")
                || std::fs::read_dir(path).is_ok_and(|mut d| {
                    d.any(|e| e.unwrap().path().extension().is_some_and(|e| e == "csv"))
                });
            if csv {
                ctx.register_csv(*name, location, CsvReadOptions::new())
                    .await
                    .unwrap();
            } else {
                ctx.register_parquet(*name, location, ParquetReadOptions::default())
                    .await
                    .unwrap();
            }
        }
        let frame = ctx.sql(query).await.unwrap();
        let schema = frame.schema().as_arrow().clone();
        let batches = frame.collect().await.unwrap();
        Table::from_batches(&schema, &batches)
    })
}

/// The fixture's inner join on `id`, by a nested loop over its rows: `(id, name,
/// lv, rv)` as text.
fn nested_loop_inner() -> Vec<Vec<Option<String>>> {
    let (left, right) = (Fixture::left_batch(), Fixture::right_batch());
    let ids = |b: &RecordBatch| {
        b.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .clone()
    };
    let (lid, rid) = (ids(&left), ids(&right));
    let text = |b: &RecordBatch, c: usize, r: usize| {
        arrow_cast::display::array_value_to_string(b.column(c), r).unwrap()
    };
    let mut rows = Vec::new();
    for l in 0..left.num_rows() {
        for r in 0..right.num_rows() {
            if lid.is_valid(l) && rid.is_valid(r) && lid.value(l) == rid.value(r) {
                rows.push(vec![
                    Some(lid.value(l).to_string()),
                    Some(text(&left, 1, l)),
                    Some(text(&left, 2, l)),
                    Some(text(&right, 2, r)),
                ]);
            }
        }
    }
    rows.sort();
    rows
}

const FIXTURE_JOIN: &str = "SELECT l.id, l.name, l.lv, r.rv FROM l JOIN r ON l.id = r.id";

#[test]
fn a_join_of_two_parquet_files_is_the_nested_loops_and_stock_datafusions() {
    let f = Fixture::new();
    let out = f.path("out.parquet");
    let mut args = vec![];
    args.extend(table("l", &f.left));
    args.extend(table("r", &f.right));
    args.extend(["--output".into(), out.display().to_string()]);
    args.push(FIXTURE_JOIN.into());
    assert_eq!(sql(&strs(&args)).rows(), 5);
    let got = Table::read_parquet(&out);
    assert_eq!(got.columns, ["id", "name", "lv", "rv"]);
    assert_eq!(got.rows, nested_loop_inner());
    assert_eq!(got, stock(&[("l", &f.left), ("r", &f.right)], FIXTURE_JOIN));
    // The output is atomic: complete under its name, no temporary file beside it.
    let names: Vec<String> = std::fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("spilljoin-"))
        .collect();
    assert!(names.is_empty(), "temporary files left: {names:?}");
}

/// A left outer join, through SQL, to stdout as CSV: the unmatched left rows with
/// nulls, as stock DataFusion has them.
#[test]
fn an_outer_join_to_stdout_is_stock_datafusions() {
    let f = Fixture::new();
    let query = "SELECT l.name, r.name AS rname FROM l LEFT JOIN r ON l.id = r.id AND r.rv > 100";
    let mut args = vec![];
    args.extend(table("l", &f.left));
    args.extend(table("r", &f.right));
    args.extend([
        "--output".into(),
        "-".into(),
        "--quiet".into(),
        query.into(),
    ]);
    let run = sql(&strs(&args));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stderr, "", "--quiet prints nothing");
    let mut lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.remove(0), "name,rname");
    lines.sort();
    let reference = stock(&[("l", &f.left), ("r", &f.right)], query);
    let mut expected: Vec<String> = reference
        .rows
        .iter()
        .map(|r| {
            format!(
                "{},{}",
                r[0].as_deref().unwrap(),
                r[1].as_deref().unwrap_or("")
            )
        })
        .collect();
    expected.sort();
    assert_eq!(lines, expected);
    assert_eq!(
        lines.len(),
        6,
        "b and c match y, d matches z; a e f match nothing"
    );
}

#[test]
fn csv_tables_and_a_glob_are_read_as_join_reads_them() {
    let f = Fixture::new();
    let parts = f.path("parts");
    std::fs::create_dir(&parts).unwrap();
    let left = Fixture::left_batch();
    // The left table in three files, found by a glob; a file the glob leaves out.
    for (i, (start, len)) in [(0, 2), (2, 3), (5, 1)].into_iter().enumerate() {
        write_csv(
            &parts.join(format!("part-{i}.csv")),
            &left.slice(start, len),
        );
    }
    write_csv(&parts.join("other.csv"), &left.slice(0, 1));
    let right_csv = f.path("right.csv");
    write_csv(&right_csv, &Fixture::right_batch());
    let glob = parts.join("part-*.csv");
    let out = f.path("out.arrow");
    let mut args = vec![];
    args.extend(table("l", &glob));
    args.extend(table("r", &right_csv));
    args.extend([
        "--output".into(),
        out.display().to_string(),
        FIXTURE_JOIN.into(),
    ]);
    assert_eq!(sql(&strs(&args)).rows(), 5);
    assert_eq!(Table::read_arrow(&out).rows, nested_loop_inner());

    // A format the extension does not tell, then named.
    let txt = f.path("right.txt");
    std::fs::copy(&right_csv, &txt).unwrap();
    let mut args = vec![];
    args.extend(table("l", &glob));
    args.extend(table("r", &txt));
    args.push(FIXTURE_JOIN.into());
    sql(&strs(&args)).error(
        INVALID_JOIN,
        &["cannot tell the format of table r", "--table r:FORMAT=PATH"],
    );
    args[3] = format!("r:csv={}", txt.display());
    assert_eq!(sql(&strs(&args)).rows(), 5);

    // A glob that matches nothing, as `join` says it.
    let mut args = vec![];
    args.extend(table("l", &parts.join("nothing-*.csv")));
    args.push("SELECT 1".into());
    sql(&strs(&args)).error(BAD_INPUT, &["no files match table l"]);
}

/// Wide tables for spilling: `facts(k, v, pad)` with 200 000 rows and
/// `dims(k, w, name)` with 100 000, each `k` of `dims` once, every fact matching.
fn wide_tables(dir: &Path) -> (PathBuf, PathBuf) {
    let facts = dir.join("facts.parquet");
    let dims = dir.join("dims.parquet");
    let n = 200_000i64;
    let m = 100_000i64;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new("pad", DataType::Utf8, false),
    ]));
    let keys: Vec<i64> = (0..n).map(|i| (i * 7919) % m).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())),
            Arc::new(StringArray::from(
                (0..n).map(|i| format!("fact-{i:036}")).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    write_parquet(&facts, &batch, 16_384);
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("w", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from((0..m).collect::<Vec<_>>())),
            Arc::new(Int64Array::from((0..m).map(|i| i * 3).collect::<Vec<_>>())),
            Arc::new(StringArray::from(
                (0..m)
                    .map(|i| format!("dimension-{i:038}"))
                    .collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    write_parquet(&dims, &batch, 16_384);
    (facts, dims)
}

const WIDE_JOIN: &str = "SELECT f.v, d.w, d.name FROM facts f JOIN dims d ON f.k = d.k";

#[test]
fn a_join_that_spills_under_the_limit_answers_as_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let (facts, dims) = wide_tables(dir.path());
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let run_with = |limit: Option<&str>, name: &str| {
        let out = dir.path().join(format!("{name}.parquet"));
        let metrics = dir.path().join(format!("{name}.json"));
        let mut args = vec![];
        args.extend(table("facts", &facts));
        args.extend(table("dims", &dims));
        args.extend(
            [
                "--threads",
                "2",
                "--spill-dir",
                spill.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--metrics",
                metrics.to_str().unwrap(),
            ]
            .map(String::from),
        );
        if let Some(limit) = limit {
            args.extend(["--memory-limit".into(), limit.into()]);
        }
        args.push(WIDE_JOIN.into());
        assert_eq!(sql(&strs(&args)).rows(), 200_000);
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
        (Table::read_parquet(&out), report)
    };
    let (unlimited, free) = run_with(None, "unlimited");
    let (limited, tight) = run_with(Some("8MiB"), "limited");
    // SPILLJOIN_FORCE_SPILL (the forced-spill run of the suite) spills without a limit too.
    if std::env::var_os("SPILLJOIN_FORCE_SPILL").is_none() {
        assert_eq!(free["joins"]["spilled_bytes"], 0, "{free}");
    }
    assert_eq!(tight["status"], "ok");
    assert_eq!(tight["output_rows"], 200_000);
    assert_eq!(tight["joins"]["count"], 1, "{tight}");
    assert!(
        tight["joins"]["spilled_bytes"].as_u64().unwrap() > 0,
        "the join did not spill under 8 MiB: {tight}"
    );
    assert!(tight["joins"]["build_rows_spilled"].as_u64().unwrap() > 0);
    let peak = tight["memory"]["peak_reserved_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 8 << 20, "peak {peak}");
    assert_eq!(limited, unlimited);
    assert_eq!(
        limited,
        stock(&[("facts", &facts), ("dims", &dims)], WIDE_JOIN)
    );
    assert_eq!(
        std::fs::read_dir(&spill).unwrap().count(),
        0,
        "spill files left"
    );
}

#[test]
fn explain_shows_spilljoin_and_explain_analyze_its_figures() {
    let f = Fixture::new();
    let mut args = vec![];
    args.extend(table("l", &f.left));
    args.extend(table("r", &f.right));
    let with = |extra: &[&str]| {
        let mut all = args.clone();
        all.extend(extra.iter().map(|s| s.to_string()));
        sql(&strs(&all))
    };
    let run = with(&["--explain", FIXTURE_JOIN]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("SpilljoinExec"), "{}", run.stdout);
    assert!(!run.stdout.contains("HashJoinExec"), "{}", run.stdout);
    // The rule off: DataFusion's own join.
    let off = format!("SET spilljoin.enabled = false; {FIXTURE_JOIN}");
    let run = with(&["--explain", &off]);
    assert!(run.stdout.contains("HashJoinExec"), "{}", run.stdout);
    assert!(!run.stdout.contains("SpilljoinExec"), "{}", run.stdout);
    // The settings show under their full keys.
    let show = "SET spilljoin.max_depth = 3; SHOW spilljoin.max_depth";
    let run = with(&["--output", "-", "--output-format", "csv", show]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("spilljoin.max_depth,3"),
        "{}",
        run.stdout
    );
    let run = with(&["--explain-analyze", FIXTURE_JOIN]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("SpilljoinExec"))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert!(
        line.contains("metrics=[") && line.contains("build_rows="),
        "{line}"
    );
    assert!(line.contains("output_rows=5"), "{line}");
}

#[test]
fn bad_queries_are_one_line_errors() {
    let f = Fixture::new();
    let mut args = vec![];
    args.extend(table("l", &f.left));
    let with = |query: &str| {
        let mut all = args.clone();
        all.push(query.into());
        sql(&strs(&all))
    };
    with("SELECT * FROM nosuch").error(INVALID_JOIN, &["the query is invalid", "nosuch"]);
    with("SELEKT 1").error(INVALID_JOIN, &["the query is invalid", "SELEKT"]);
    with("SELECT nosuch FROM l").error(INVALID_JOIN, &["the query is invalid", "nosuch"]);
    with("").error(INVALID_JOIN, &["no SQL statement"]);
    // A failure while it runs: the output is not created, no temporary is left.
    let out = f.path("out.csv");
    let mut all = args.clone();
    all.extend([
        "--output".into(),
        out.display().to_string(),
        "SELECT CAST(name AS INT) FROM l".into(),
    ]);
    sql(&strs(&all)).error(INVALID_JOIN, &["the query failed", "Cast"]);
    assert!(!out.exists());
    let names: Vec<String> = std::fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("spilljoin-"))
        .collect();
    assert!(names.is_empty(), "temporary files left: {names:?}");
    // The command line itself.
    let mut all = args.clone();
    all.extend(table("l", &f.right));
    all.push("SELECT 1".into());
    sql(&strs(&all)).error(INVALID_JOIN, &["--table l is given twice"]);
    sql(&["--table", "1x=a.parquet", "SELECT 1"]).usage_error(&["not a table name"]);
    sql(&["--table", "t:xml=a.xml", "SELECT 1"]).usage_error(&["\"xml\" is not a format"]);
    sql(&["--table", "t=/no/such.parquet", "SELECT 1"])
        .error(BAD_INPUT, &["cannot open table t /no/such.parquet"]);
    sql(&[]).usage_error(&["QUERY"]);
}

#[test]
fn a_sort_out_of_memory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (facts, _) = wide_tables(dir.path());
    let mut args = vec![];
    args.extend(table("facts", &facts));
    // A sort reserves 10 MiB to merge what it spilled (DataFusion's
    // sort_spill_reservation_bytes): under 4 MiB it cannot.
    args.extend(["--memory-limit", "4MiB", "--threads", "2"].map(String::from));
    args.push("SELECT * FROM facts ORDER BY pad".into());
    let line = sql(&strs(&args)).error(OUT_OF_MEMORY, &["a sort (SortExec)", "not a join"]);
    assert!(line.contains("--memory-limit 8MiB or more"), "{line}");
}

#[test]
fn an_aggregate_out_of_memory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (facts, _) = wide_tables(dir.path());
    let mut args = vec![];
    args.extend(table("facts", &facts));
    args.extend(["--memory-limit", "1MiB", "--threads", "1"].map(String::from));
    args.push("SELECT pad, count(*) FROM facts GROUP BY pad".into());
    sql(&strs(&args)).error(
        OUT_OF_MEMORY,
        &["an aggregate (AggregateExec)", "not a join"],
    );
}

/// The names under `dir`, recursively.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(list) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in list.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            found.push(path);
        }
    }
    found
}

/// A query stopped by SIGINT while its join spills: exit code 130, the spill
/// directory empty, no output and no temporary file, the report "interrupted".
#[cfg(unix)]
#[test]
fn sigint_stops_the_query_and_cleans_up() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let (facts, dims) = wide_tables(dir.path());
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let out = dir.path().join("out.parquet");
    let metrics = dir.path().join("m.json");
    let mut args = vec!["sql".to_string()];
    args.extend(table("facts", &facts));
    args.extend(table("dims", &dims));
    args.extend(
        [
            "--threads",
            "1",
            "--batch-size",
            "4",
            "--spill-dir",
            spill.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ]
        .map(String::from),
    );
    args.push(format!("SET spilljoin.force_spill = 1; {WIDE_JOIN}"));
    let child = Command::new(env!("CARGO_BIN_EXE_spilljoin"))
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Spill files of the join: then it is under way.
    let start = Instant::now();
    while !entries(&spill)
        .iter()
        .any(|e| e.extension().is_some_and(|x| x == "arrows"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no spill file after 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("stopped by SIGINT"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(entries(&spill), Vec::<PathBuf>::new(), "spill files left");
    assert!(!out.exists(), "an interrupted query left an output");
    let temporaries: Vec<PathBuf> = entries(dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".out.parquet.spilljoin-"))
        .collect();
    assert!(temporaries.is_empty(), "{temporaries:?}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(report["status"], "interrupted");
    assert_eq!(report["exit_code"], 130);
}
