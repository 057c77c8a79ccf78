//! What a join killed outright (SIGKILL, as the kernel's OOM killer sends it)
//! leaves behind, end to end: its spill directory and temporary output stay, the
//! next join in the same directories removes them and says so, a running join's
//! are never touched, and `spilljoin clean` removes (or lists) them on demand.
//!
//! No timing is asserted: a join is "running" because its output goes to a pipe the
//! test does not read until the end (it cannot finish before that), and one is
//! killed "mid-spill" once its spill files are on disk, as polling sees them.
#![cfg(unix)]

mod cli_support;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::*;

/// The lock file in every spill directory.
const OWNER_FILE: &str = "owner.lock";

/// The columns every join here outputs: integers, exact in every format.
const SELECT: &str = "l_orderkey,l_linenumber,o_custkey";

/// The demo's data: 100 000 orders and about 400 000 line items, enough for a
/// join to spill for seconds under a 1 MiB limit with batches of 16 rows.
struct Data {
    dir: tempfile::TempDir,
    lineitem: PathBuf,
    orders: PathBuf,
    spill: PathBuf,
    out: PathBuf,
}

impl Data {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let run = spilljoin(&[
            "demo",
            "--orders",
            "100000",
            "--dir",
            data.to_str().unwrap(),
            "--memory-limit",
            "1GiB",
        ]);
        run.rows();
        let (spill, out) = (dir.path().join("spill"), dir.path().join("out"));
        std::fs::create_dir(&spill).unwrap();
        std::fs::create_dir(&out).unwrap();
        Self {
            lineitem: data.join("lineitem.parquet"),
            orders: data.join("orders.parquet"),
            spill,
            out,
            dir,
        }
    }

    /// `spilljoin join` of line items with their orders, spilling to `self.spill`,
    /// with `extra` arguments.
    fn join(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "join",
            "--left",
            self.lineitem.to_str().unwrap(),
            "--right",
            self.orders.to_str().unwrap(),
            "--on",
            "l_orderkey=o_orderkey",
            "--spill-dir",
            self.spill.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// A slow join (1 MiB, one thread, batches of 16 rows: it spills for seconds).
    fn slow_join(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_spilljoin"));
        command
            .args(self.join(&[
                "--memory-limit",
                "1MiB",
                "--threads",
                "1",
                "--batch-size",
                "16",
                "--quiet",
            ]))
            .args(extra);
        command
    }

    /// A join that cannot finish until its stdout (CSV) is read, waited for until
    /// its spill directory is there. Returns it and its directory.
    fn start_live_join(&self) -> (Child, PathBuf) {
        let before = spill_dirs(&self.spill);
        let child = self
            .slow_join(&["--select", SELECT, "--output", "-"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let dir = wait_for_new_dir(&self.spill, &before, |dir| {
            std::fs::read(dir.join(OWNER_FILE)).is_ok_and(|r| !r.is_empty())
        });
        (child, dir)
    }

    /// Starts a join writing `output`, waits until it has spill files, and kills it
    /// with SIGKILL. Returns its spill directory and its temporary output, both
    /// still there.
    fn kill_a_join_mid_spill(&self, output: &Path) -> (PathBuf, PathBuf) {
        let before = spill_dirs(&self.spill);
        let mut child = self
            .slow_join(&["--output", output.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let dir = wait_for_new_dir(&self.spill, &before, |dir| {
            files_in(dir)
                .iter()
                .any(|(name, _)| name.ends_with(".arrows"))
        });
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "not killed: {status:?}");
        assert!(dir.is_dir(), "a killed join's spill directory stays");
        let name = output.file_name().unwrap().to_str().unwrap();
        let temporaries = temporaries_of(output.parent().unwrap(), name);
        assert_eq!(temporaries.len(), 1, "{temporaries:?}");
        (dir, temporaries[0].clone())
    }

    /// The inner join of line items with their orders, on [`SELECT`], as a table.
    fn expected(&self) -> Table {
        let lineitem = Table::read_parquet(&self.lineitem);
        let orders = Table::read_parquet(&self.orders);
        let column = |t: &Table, name: &str| t.columns.iter().position(|c| c == name).unwrap();
        let (key, custkey) = (column(&orders, "o_orderkey"), column(&orders, "o_custkey"));
        let custkeys: HashMap<&Option<String>, &Option<String>> =
            orders.rows.iter().map(|r| (&r[key], &r[custkey])).collect();
        let (l_key, l_line) = (
            column(&lineitem, "l_orderkey"),
            column(&lineitem, "l_linenumber"),
        );
        let mut rows: Vec<Vec<Option<String>>> = lineitem
            .rows
            .iter()
            .map(|r| {
                vec![
                    r[l_key].clone(),
                    r[l_line].clone(),
                    custkeys[&r[l_key]].clone(),
                ]
            })
            .collect();
        rows.sort();
        Table {
            columns: names(&SELECT.split(',').collect::<Vec<_>>()),
            rows,
        }
    }
}

/// The `spilljoin-*` directories in `spill`.
fn spill_dirs(spill: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(spill)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("spilljoin-")
        })
        .collect();
    dirs.sort();
    dirs
}

/// The names and lengths of the files in `dir` (none if it is gone).
fn files_in(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, u64)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.file_name().into_string().ok()?, e.metadata().ok()?.len()))
        })
        .collect();
    files.sort();
    files
}

/// The temporary outputs of `name` in `dir`: `.NAME.spilljoin-XXXXXX.tmp`.
fn temporaries_of(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!(".{name}.spilljoin-");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let file_name = p.file_name().unwrap().to_string_lossy();
            file_name.starts_with(&prefix) && file_name.ends_with(".tmp")
        })
        .collect();
    found.sort();
    found
}

/// Polls until a spill directory not in `before` appears in `spill` and `ready`
/// holds for it. The deadline only turns a hang into a failure.
fn wait_for_new_dir(spill: &Path, before: &[PathBuf], ready: impl Fn(&Path) -> bool) -> PathBuf {
    let start = Instant::now();
    loop {
        let new: Vec<PathBuf> = spill_dirs(spill)
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect();
        if let [dir] = new.as_slice() {
            if ready(dir) {
                return dir.clone();
            }
        }
        assert!(new.len() <= 1, "more than one new spill directory: {new:?}");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no ready spill directory after 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reads the live join's output to the end and checks it, and that it cleaned up.
fn finish_live_join(data: &Data, live: Child, live_dir: &Path) {
    let output = live.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the live join failed: {stderr}");
    let table = Table::from_csv(&String::from_utf8(output.stdout).unwrap());
    assert!(table == data.expected(), "the live join's output is wrong");
    assert!(!live_dir.exists(), "the live join left its spill directory");
}

#[test]
fn a_killed_joins_leftovers_go_with_the_next_join_and_a_running_ones_stay() {
    let data = Data::new();
    // The third join, running throughout, and then the one that is killed.
    let (live, live_dir) = data.start_live_join();
    let live_record = std::fs::read(live_dir.join(OWNER_FILE)).unwrap();
    let output = data.out.join("joined.parquet");
    let (stale_dir, stale_temp) = data.kill_a_join_mid_spill(&output);
    let stale_bytes: u64 = files_in(&stale_dir).iter().map(|(_, b)| b).sum();
    assert!(stale_bytes > 0);
    let temp_bytes = std::fs::metadata(&stale_temp).unwrap().len();

    // The second join, in the same spill directory and to the same output.
    let metrics = data.dir.path().join("m.json");
    let run = spilljoin(&data.join(&[
        "--select",
        SELECT,
        "--memory-limit",
        "4MiB",
        "--output",
        output.to_str().unwrap(),
        "--metrics",
        metrics.to_str().unwrap(),
    ]));
    let expected = data.expected();
    assert_eq!(run.rows(), expected.rows.len() as u64);
    assert!(
        !stale_dir.exists(),
        "the killed join's spill directory stays"
    );
    assert!(
        !stale_temp.exists(),
        "the killed join's temporary output stays"
    );
    assert!(
        run.stderr.contains(
            "removed what killed joins left behind: 1 spill directory (" // bytes follow
        ) && run.stderr.contains(", 1 temporary output ("),
        "{}",
        run.stderr
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    let removed = &report["stale_removed"];
    assert_eq!(removed["spill_dirs"], 1, "{removed}");
    assert_eq!(removed["spill_dir_bytes"], stale_bytes, "{removed}");
    assert_eq!(removed["temporary_outputs"], 1, "{removed}");
    assert_eq!(removed["temporary_output_bytes"], temp_bytes, "{removed}");
    assert_eq!(removed["failures"], 0, "{removed}");
    assert!(Table::read_parquet(&output) == expected, "wrong output");
    assert!(temporaries_of(&data.out, "joined.parquet").is_empty());

    // The running join was not touched, and finishes correctly.
    let mut live = live;
    assert!(
        live.try_wait().unwrap().is_none(),
        "the live join ended early"
    );
    assert!(
        live_dir.is_dir(),
        "the live join's spill directory was removed"
    );
    assert_eq!(
        std::fs::read(live_dir.join(OWNER_FILE)).unwrap(),
        live_record
    );
    assert_eq!(spill_dirs(&data.spill), vec![live_dir.clone()]);
    finish_live_join(&data, live, &live_dir);
    assert_eq!(spill_dirs(&data.spill), Vec::<PathBuf>::new());
}

#[test]
fn clean_lists_and_removes_what_killed_joins_left_and_keeps_a_running_ones() {
    let data = Data::new();
    let (live, live_dir) = data.start_live_join();
    let (stale_dir, stale_temp) = data.kill_a_join_mid_spill(&data.out.join("a.csv"));
    let stale_bytes: u64 = files_in(&stale_dir).iter().map(|(_, b)| b).sum();
    let temp_bytes = std::fs::metadata(&stale_temp).unwrap().len();
    let args = [
        "clean",
        "--spill-dir",
        data.spill.to_str().unwrap(),
        "--output-dir",
        data.out.to_str().unwrap(),
    ];
    let expected_lines = |verb: &str| {
        vec![
            format!(
                "{verb} spill directory {}: {stale_bytes} bytes (",
                stale_dir.display()
            ),
            format!(
                "{verb} temporary output {}: {temp_bytes} bytes (",
                stale_temp.display()
            ),
            format!("{verb} 2 stale items: {} bytes (", stale_bytes + temp_bytes),
        ]
    };
    let check = |run: &Run, verb: &str| {
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.stderr, "");
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{}", run.stdout);
        for (line, start) in lines.iter().zip(expected_lines(verb)) {
            assert!(
                line.starts_with(&start),
                "{line:?} does not start {start:?}"
            );
        }
        assert!(lines[0].contains("; pid "), "{}", lines[0]);
    };

    let dry = spilljoin(&[&args[..], &["--dry-run"]].concat());
    check(&dry, "would remove");
    assert!(
        stale_dir.is_dir() && stale_temp.is_file(),
        "--dry-run removed"
    );

    let run = spilljoin(&args);
    check(&run, "removed");
    assert!(!stale_dir.exists() && !stale_temp.exists());
    assert!(
        live_dir.is_dir(),
        "the live join's spill directory was removed"
    );

    // Nothing left to remove: a total of nothing.
    let again = spilljoin(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.stdout, "removed 0 stale items: 0 bytes (0 bytes)\n");
    finish_live_join(&data, live, &live_dir);

    // Directories that cannot be read: the exit code of their kind.
    let missing = data.dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    spilljoin(&["clean", "--spill-dir", missing])
        .error(SPILL_FAILED, &["stale spill directories", "missing"]);
    spilljoin(&[
        "clean",
        "--spill-dir",
        data.spill.to_str().unwrap(),
        "--output-dir",
        missing,
    ])
    .error(BAD_OUTPUT, &["temporary outputs", "missing"]);
}
