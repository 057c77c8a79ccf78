//! End-to-end tests of how the `spilljoin` binary fails and reports: one line on
//! stderr and a documented exit code for every kind of failure, `--explain`, the
//! build side choice, `--metrics` on failure, Ctrl-C/SIGTERM, and the progress
//! line on a terminal.

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::*;

#[test]
fn unreadable_and_corrupt_inputs_exit_4() {
    let f = Fixture::new();
    let missing = f.path("missing.csv");
    f.join_files(&missing, &f.right, &[]).error(
        BAD_INPUT,
        &["cannot open the left input", "missing.csv", "No such file"],
    );
    // A Parquet file cut short has no footer.
    let bytes = std::fs::read(&f.left).unwrap();
    let cut = f.path("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    f.join_files(&f.left, &cut, &[])
        .error(BAD_INPUT, &["cut.parquet", "not a readable Parquet file"]);
    // An Arrow stream cut short fails while it is read, naming the file.
    let stream = f.path("left.arrows");
    write_arrows(&stream, &Fixture::left_batch(), 1);
    let bytes = std::fs::read(&stream).unwrap();
    let cut = f.path("cut.arrows");
    std::fs::write(&cut, &bytes[..bytes.len() - 200]).unwrap();
    f.join_files(&cut, &f.right, &[])
        .error(BAD_INPUT, &["reading the left input failed", "cut.arrows"]);
    // A Parquet file whose footer is fine but whose data is not.
    let generated = f.path("generated");
    std::fs::create_dir(&generated).unwrap();
    let (good, _, _) = random_inputs(&generated);
    let snappy = f.path("snappy.parquet");
    {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&good).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&snappy).unwrap(),
            arrow_array::RecordBatchReader::schema(&reader),
            Some(props),
        )
        .unwrap();
        for b in reader {
            writer.write(&b.unwrap()).unwrap();
        }
        writer.close().unwrap();
    }
    let mut bytes_snappy = std::fs::read(&snappy).unwrap();
    assert!(bytes_snappy.len() > 2000, "{}", bytes_snappy.len());
    for b in &mut bytes_snappy[200..1200] {
        *b = 0x5a;
    }
    std::fs::write(&snappy, &bytes_snappy).unwrap();
    let run = spilljoin(&[
        "join",
        "--left",
        snappy.to_str().unwrap(),
        "--right",
        good.to_str().unwrap(),
        "--on",
        "k=k",
    ]);
    run.error(
        BAD_INPUT,
        &["reading the left input failed", "snappy.parquet"],
    );
    let arrow = f.path("text.arrow");
    std::fs::write(&arrow, "not arrow").unwrap();
    f.join_files(&arrow, &f.right, &[])
        .error(BAD_INPUT, &["text.arrow", "not a readable Arrow IPC file"]);
    // A CSV value that does not parse as its column's type.
    let csv = f.path("late.csv");
    std::fs::write(&csv, "id,name\n2,b\n3,d\nthree,x\n").unwrap();
    f.join_files(&csv, &f.right, &["--infer-rows", "2"])
        .error(BAD_INPUT, &["late.csv", "three", "Int64"]);
    let json = f.path("broken.ndjson");
    std::fs::write(
        &json,
        "{\"id\": 2, \"name\": \"b\"}\n{\"id\": 3, \"name\":\n",
    )
    .unwrap();
    f.join_files(&json, &f.right, &[])
        .error(BAD_INPUT, &["broken.ndjson"]);
    let unknown = f.path("data.txt");
    std::fs::write(&unknown, "x").unwrap();
    f.join_files(&unknown, &f.right, &[]).error(
        INVALID_JOIN,
        &["cannot tell the format", "data.txt", "--left-format"],
    );
}

#[test]
fn definition_errors_exit_3_and_suggest_names() {
    let f = Fixture::new();
    f.join(&["--on", "idd=id"]).error(
        INVALID_JOIN,
        &[
            "no column \"idd\" in the left input",
            "did you mean \"id\"?",
        ],
    );
    f.join(&["--select", "left.nmae"]).error(
        INVALID_JOIN,
        &["no column \"nmae\"", "did you mean \"name\"?"],
    );
    f.join(&["--select", "labl"]).error(
        INVALID_JOIN,
        &["no such output column", "did you mean \"label\"?"],
    );
    f.join(&["--on", "id=label"]).error(
        INVALID_JOIN,
        &[
            "key types differ",
            "left id is Int64",
            "right label is Utf8",
        ],
    );
    f.join(&["--filter", "rv > 'x'"])
        .error(INVALID_JOIN, &["--filter", "cannot compare"]);
}

#[test]
fn unwritable_outputs_exit_5_and_spill_dirs_exit_6() {
    let f = Fixture::new();
    // A regular file where a directory should be.
    let file = f.path("plain_file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("out.parquet");
    f.join(&["--output", out.to_str().unwrap()])
        .error(BAD_OUTPUT, &["cannot create the output", "out.parquet"]);
    f.join(&["--spill-dir", file.to_str().unwrap()])
        .error(SPILL_FAILED, &["spill directory", "plain_file"]);
    let metrics = file.join("m.json");
    f.join(&["--metrics", metrics.to_str().unwrap()])
        .error(BAD_OUTPUT, &["cannot write metrics", "m.json"]);
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_exits_5_for_the_output() {
    let f = Fixture::new();
    // /dev/full fails every write with ENOSPC.
    let output = Command::new(env!("CARGO_BIN_EXE_spilljoin"))
        .args([
            "join",
            "--left",
            f.left.to_str().unwrap(),
            "--right",
            f.right.to_str().unwrap(),
            "--on",
            "id=id",
            "--output",
            "-",
        ])
        .stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(BAD_OUTPUT), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_spill_quota_reached_exits_6_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (left, right, _) = random_inputs(dir.path());
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let out = dir.path().join("out.parquet");
    let run = spilljoin_env(
        &[
            "join",
            "--left",
            left.to_str().unwrap(),
            "--right",
            right.to_str().unwrap(),
            "--on",
            "k=k",
            "--max-spill-size",
            "10KiB",
            "--spill-dir",
            spill.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ],
        &[("SPILLJOIN_FORCE_SPILL", "all")],
    );
    run.error(
        SPILL_FAILED,
        &[
            "spill disk quota exceeded",
            "--max-spill-size 10.0 KiB",
            "raise it",
        ],
    );
    assert_eq!(entries(&spill), Vec::<String>::new());
    assert!(!out.exists());
    // With room, the same join spills and succeeds.
    let run = spilljoin_env(
        &[
            "join",
            "--left",
            left.to_str().unwrap(),
            "--right",
            right.to_str().unwrap(),
            "--on",
            "k=k",
            "--max-spill-size",
            "1GiB",
            "--spill-compression",
            "zstd",
            "--spill-dir",
            spill.to_str().unwrap(),
        ],
        &[("SPILLJOIN_FORCE_SPILL", "all")],
    );
    assert!(run.rows() > 0);
    assert!(run.stderr.contains("spilled: "), "{}", run.stderr);
    assert_eq!(entries(&spill), Vec::<String>::new());
}

#[test]
fn a_limit_below_the_floor_exits_7_and_says_the_floor() {
    let f = Fixture::new();
    let metrics = f.path("m.json");
    let line = f
        .join(&[
            "--memory-limit",
            "16KiB",
            "--metrics",
            metrics.to_str().unwrap(),
        ])
        .error(
            OUT_OF_MEMORY,
            &[
                "memory limit 16.0 KiB is too small for this join",
                "resources exhausted",
                "finish from 4.0 MiB",
                "--memory-limit 4MiB",
            ],
        );
    assert!(line.contains("largest consumers"), "{line}");
    // The floor grows with the batch size.
    f.join(&["--memory-limit", "16KiB", "--batch-size", "20000"])
        .error(
            OUT_OF_MEMORY,
            &["finish from 12.0 MiB", "--batch-size 20000"],
        );
    // The metrics report says how it ended.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(report["status"], "failed");
    assert_eq!(report["exit_code"], OUT_OF_MEMORY);
    assert!(report["error"].as_str().unwrap().contains("too small"));
    assert_eq!(report["memory"]["limit_bytes"], 16 * 1024);
    // At the floor, it runs.
    assert_eq!(f.join(&["--memory-limit", "4MiB"]).rows(), 5);
}

#[test]
fn explain_prints_the_plan_and_runs_nothing() {
    let f = Fixture::new();
    let spill = f.path("spill");
    std::fs::create_dir(&spill).unwrap();
    let out = f.path("explained.parquet");
    let run = f.join(&[
        "--explain",
        "--filter",
        "lv < rv",
        "--select",
        "left.name,rv",
        "--memory-limit",
        "64MiB",
        "--spill-dir",
        spill.to_str().unwrap(),
        "--spill-compression",
        "lz4",
        "--threads",
        "3",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    for needle in [
        "join         inner",
        "left.parquet (parquet, 3 row groups, 6 rows)",
        "reads id, name, lv",
        "build side   right — the right input builds: it is not larger",
        "keys         left.id = right.id (Int64)",
        "filter       lv < rv",
        "partitions   ",
        "memory limit 64.0 MiB (--memory-limit)",
        "compression lz4",
        "threads      3",
        "output       left.name, rv → ",
        "explained.parquet (parquet, zstd",
    ] {
        assert!(
            run.stdout.contains(needle),
            "{needle:?} not in\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout.contains(spill.to_str().unwrap()),
        "{}",
        run.stdout
    );
    assert!(!out.exists(), "--explain wrote the output");
    assert_eq!(entries(&spill), Vec::<String>::new(), "--explain spilled");
}

#[test]
fn the_smaller_input_builds_unless_no_swap() {
    let f = Fixture::new();
    // right_no_nulls (4 rows) is smaller than left (6 rows): as --left it builds.
    let explain = |extra: &[&str]| {
        let mut args = vec!["--explain"];
        args.extend_from_slice(extra);
        let run = f.join_files(&f.right_no_nulls, &f.left, &args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        run.stdout
    };
    let plan = explain(&[]);
    assert!(
        plan.contains("build side   left — the left input builds: it is smaller"),
        "{plan}"
    );
    let plan = explain(&["--no-swap"]);
    assert!(
        plan.contains("build side   right — the right input builds: side swapping is off"),
        "{plan}"
    );
    // The output is the same either way, columns and rows.
    let out_swapped = f.path("swapped.csv");
    let out_fixed = f.path("fixed.csv");
    for (out, extra) in [(&out_swapped, &[][..]), (&out_fixed, &["--no-swap"][..])] {
        let mut args = vec!["--type", "full", "--output", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        assert_eq!(f.join_files(&f.right_no_nulls, &f.left, &args).rows(), 9);
    }
    assert_eq!(Table::read_csv(&out_swapped), Table::read_csv(&out_fixed));
    // The metrics report says which side built and why.
    let metrics = f.path("m.json");
    f.join_files(
        &f.right_no_nulls,
        &f.left,
        // Every probe row read (the probe scan would skip a row group outside the
        // build's keys).
        &["--metrics", metrics.to_str().unwrap(), "--pushdown", "none"],
    )
    .rows();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(report["build_side"], "left");
    assert_eq!(report["status"], "ok");
    assert_eq!(report["inputs"]["left"]["rows_read"], 4);
    assert_eq!(report["inputs"]["right"]["rows_read"], 6);
    assert_eq!(report["build"]["rows"], 4);
    assert_eq!(report["probe"]["rows"], 6);
}

/// The names in `dir`, recursively, relative to it.
fn entries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Generates the demo's data in `dir`: 20 000 orders and about 80 000 line items.
fn demo_data(dir: &Path) -> (PathBuf, PathBuf) {
    let run = spilljoin(&["demo", "--orders", "20000", "--dir", dir.to_str().unwrap()]);
    run.rows();
    (dir.join("lineitem.parquet"), dir.join("orders.parquet"))
}

/// Starts a join that runs for seconds (one row per batch, one thread, every
/// partition spilled), waits until it has spill files, sends `signal`, and checks
/// that it exits with `code`, leaving no spill file and no output.
#[cfg(unix)]
fn interrupt_with(signal: &str, code: i32) {
    let dir = tempfile::tempdir().unwrap();
    let (lineitem, orders) = demo_data(&dir.path().join("data"));
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let out = dir.path().join("out.parquet");
    let metrics = dir.path().join("m.json");
    let child = Command::new(env!("CARGO_BIN_EXE_spilljoin"))
        .args([
            "join",
            "--left",
            lineitem.to_str().unwrap(),
            "--right",
            orders.to_str().unwrap(),
            "--on",
            "l_orderkey=o_orderkey",
            "--batch-size",
            "1",
            "--threads",
            "1",
            "--spill-dir",
            spill.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ])
        .env("SPILLJOIN_FORCE_SPILL", "all")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for spill files: then the join is under way.
    let start = Instant::now();
    while !entries(&spill).iter().any(|e| e.ends_with(".arrows")) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no spill file after 20 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = Command::new("kill")
        .args(["-s", signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains(&format!("stopped by SIG{signal}")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(entries(&spill), Vec::<String>::new(), "spill files left");
    assert!(!out.exists(), "an interrupted join left an output");
    let leftovers: Vec<String> = entries(dir.path())
        .into_iter()
        .filter(|e| e.starts_with(".out.parquet"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(report["status"], "interrupted");
    assert_eq!(report["exit_code"], code);
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_join_and_cleans_up() {
    interrupt_with("TERM", 143);
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_join_and_cleans_up() {
    interrupt_with("INT", 130);
}

/// The progress line appears on a terminal (a pseudo-terminal from `script`) and
/// never when stderr is a pipe.
#[cfg(target_os = "linux")]
#[test]
fn progress_shows_on_a_terminal_only() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` to give the binary a terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (lineitem, orders) = demo_data(dir.path());
    let command = format!(
        "SPILLJOIN_FORCE_SPILL=all {} join --left {} --right {} --on l_orderkey=o_orderkey --batch-size 4 --threads 1",
        env!("CARGO_BIN_EXE_spilljoin"),
        lineitem.display(),
        orders.display()
    );
    let tty = |extra: &str| -> String {
        let output = Command::new("script")
            .args(["-q", "-e", "-c", &format!("{command} {extra}"), "/dev/null"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let screen = tty("");
    for needle in ["build", "probe", "rows", "mem ", "spilled "] {
        assert!(screen.contains(needle), "{needle:?} not in {screen:?}");
    }
    assert!(screen.contains("rows: "), "{screen:?}");
    // --quiet: nothing at all.
    let screen = tty("--quiet");
    assert!(screen.trim().is_empty(), "{screen:?}");
    // Not a terminal: the summary only.
    let run = spilljoin_env(
        &[
            "join",
            "--left",
            lineitem.to_str().unwrap(),
            "--right",
            orders.to_str().unwrap(),
            "--on",
            "l_orderkey=o_orderkey",
        ],
        &[("SPILLJOIN_FORCE_SPILL", "all")],
    );
    run.rows();
    assert!(!run.stderr.contains("mem "), "{}", run.stderr);
    assert!(
        run.stderr.lines().all(|l| l.starts_with("rows: ")
            || l.starts_with("spilled: ")
            || l.starts_with("pushdown: ")),
        "{}",
        run.stderr
    );
}

/// Inputs big enough for many batches: `left(k, v)` and `right(k, w)` with keys
/// from 0..300. Returns the expected inner join rows.
fn random_inputs(dir: &Path) -> (PathBuf, PathBuf, u64) {
    use arrow_array::{Int32Array, Int64Array};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;
    let write = |name: &str, value: &str, n: i64, modulo: i64| {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new(value, DataType::Int32, false),
        ]));
        let b = batch(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * 7 % modulo))),
                Arc::new(Int32Array::from_iter_values(0..n as i32)),
            ],
        );
        let path = dir.join(name);
        write_parquet(&path, &b, 500);
        path
    };
    let left = write("left.parquet", "v", 4000, 300);
    let right = write("right.parquet", "w", 1500, 300);
    (left, right, 4000 * 5)
}

/// Found in review: limits on sizes, a metrics path that fails before the output is in
/// place, and `.tsv` output with tabs.
#[test]
fn review_findings_stay_fixed() {
    let f = Fixture::new();
    // Sizes the command line cannot honour are usage errors, not aborts.
    f.join(&["--batch-size", "1000000000000"])
        .usage_error(&["--batch-size", "at most 1048576"]);
    f.join(&["--threads", "100000"])
        .usage_error(&["--threads", "at most 1024"]);
    // An unwritable metrics path fails before anything is written.
    let out = f.path("never.parquet");
    f.join(&[
        "--output",
        out.to_str().unwrap(),
        "--metrics",
        "/nonexistent-dir/m.json",
    ])
    .error(
        BAD_OUTPUT,
        &["cannot write metrics to /nonexistent-dir/m.json"],
    );
    assert!(
        !out.exists(),
        "the output was written before the metrics failed"
    );
    // `.tsv` means tabs, for output as for input.
    let tsv = f.path("out.tsv");
    f.join(&[
        "--output",
        tsv.to_str().unwrap(),
        "--select",
        "left.name,right.name",
    ])
    .rows();
    let text = std::fs::read_to_string(&tsv).unwrap();
    assert!(text.starts_with("left.name\tright.name\n"), "{text:?}");
}

/// `spilljoin --help` is complete on its own: it names every flag of `join` and the
/// exit codes.
#[test]
fn top_level_help_names_every_join_flag() {
    let top = spilljoin(&["--help"]);
    assert_eq!(top.code, 0);
    let join = spilljoin(&["join", "--help"]);
    assert_eq!(join.code, 0);
    let flags: Vec<String> = join
        .stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|rest| rest.split([' ', '<']).next())
        .map(|name| format!("--{name}"))
        .filter(|f| f != "--help")
        .collect();
    assert!(flags.len() >= 25, "{flags:?}");
    for flag in flags {
        let short = flag.replace("--right-", "--left-");
        assert!(
            top.stdout.contains(&flag) || top.stdout.contains(&short),
            "{flag} is not in `spilljoin --help`"
        );
    }
    for code in ["Exit codes", "128+N", "7 the memory limit is too small"] {
        assert!(
            top.stdout.contains(code),
            "{code:?} not in `spilljoin --help`"
        );
    }
}

#[test]
fn max_depth_bounds_recursion_and_is_checked() {
    let f = Fixture::new();
    // Forced to spill at every level, a join allowed no repartitioning joins its
    // spilled pairs in chunks, with the same rows.
    let metrics = f.path("m.json");
    let mut args = vec![
        "join".to_string(),
        "--left".into(),
        f.left.display().to_string(),
        "--right".into(),
        f.right.display().to_string(),
        "--on".into(),
        "id=id".into(),
        "--metrics".into(),
        metrics.display().to_string(),
    ];
    let forced = [
        ("SPILLJOIN_FORCE_SPILL", "all"),
        ("SPILLJOIN_FORCE_SPILL_DEPTH", "4"),
    ];
    let deep = spilljoin_env(&args, &forced);
    args.extend(["--max-depth".into(), "0".into()]);
    let shallow = spilljoin_env(&args, &forced);
    assert_eq!(shallow.rows(), deep.rows());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    assert_eq!(report["spill"]["max_recursion_depth"], 0, "{report}");
    assert!(
        report["spill"]["fallbacks"].as_u64().unwrap() >= 1,
        "{report}"
    );
    // The plan says it; more levels than the hash bits give is refused.
    let explained = f.join(&["--max-depth", "2", "--explain"]);
    assert!(
        explained.stdout.contains("up to 2 levels"),
        "{}",
        explained.stdout
    );
    let refused = f.join(&["--max-depth", "5"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("--max-depth"), "{}", refused.stderr);
}
