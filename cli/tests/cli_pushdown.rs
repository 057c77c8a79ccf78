//! The probe scan skips what the build rules out (`--pushdown`): the output is the
//! same with and without it, for every join type, swapped or not, spilling or not;
//! the metrics show row groups, pages and rows skipped where the join type allows it,
//! and none where it does not.

mod cli_support;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::{DataType, Field, Schema};
use cli_support::*;

/// A probe (`left`) of 4000 rows with keys 0..4000 in order, in row groups of 500
/// (small pages), and a build (`right`) holding some keys of 1000..1400 (two per
/// key) and a null key.
fn inputs(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let left = batch(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("payload", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int64Array::from_iter(
                (0..4000).map(|i| (i % 97 != 0).then_some(i)),
            )) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                (0..4000).map(|i| format!("p{i}")),
            )),
        ],
    );
    let keys: Vec<Option<i64>> = (1000..1400)
        .filter(|i| i % 3 != 0)
        .flat_map(|i| [Some(i), Some(i)])
        .chain([None])
        .collect();
    let n = keys.len();
    let right = batch(
        Arc::new(Schema::new(vec![
            Field::new("rk", DataType::Int64, true),
            Field::new("tag", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int64Array::from(keys)) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("t{i}")),
            )),
        ],
    );
    let (l, r) = (dir.join("probe.parquet"), dir.join("build.parquet"));
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(500))
        .set_data_page_row_count_limit(50)
        .set_write_batch_size(50)
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&l).unwrap(),
        left.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&left).unwrap();
    w.close().unwrap();
    write_parquet(&r, &right, 100);
    (l, r)
}

fn run(
    l: &std::path::Path,
    r: &std::path::Path,
    dir: &std::path::Path,
    extra: &[&str],
) -> (Table, serde_json::Value) {
    let metrics = dir.join("metrics.json");
    let mut args: Vec<String> = vec![
        "join".into(),
        "--left".into(),
        l.display().to_string(),
        "--right".into(),
        r.display().to_string(),
        "--output".into(),
        "-".into(),
        "--metrics".into(),
        metrics.display().to_string(),
        "--threads".into(),
        "2".into(),
    ];
    if !extra.contains(&"--on") {
        args.extend(["--on".into(), "k=rk".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = spilljoin(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    (Table::from_csv(&out.stdout), m)
}

#[test]
fn pushdown_skips_only_what_cannot_matter() {
    let dir = tempfile::tempdir().unwrap();
    let (l, r) = inputs(dir.path());
    // (type, whether the probe may skip unmatchable rows when the right builds)
    let types = [
        ("inner", true),
        ("left", false),
        ("right", true),
        ("full", false),
        ("semi", true),
        ("anti", false),
        ("right-semi", true),
        ("right-anti", true),
        ("mark", false),
        ("not-in", false),
        ("right-not-in", false),
    ];
    for (join_type, skips) in types {
        for extra in [&[][..], &["--memory-limit", "2MiB"][..]] {
            let mut base = vec!["--type", join_type, "--no-swap"];
            base.extend_from_slice(extra);
            let (reference, _) = run(
                &l,
                &r,
                dir.path(),
                &[&base[..], &["--pushdown", "none"]].concat(),
            );
            for mode in ["bounds", "all"] {
                let (table, m) = run(
                    &l,
                    &r,
                    dir.path(),
                    &[&base[..], &["--pushdown", mode]].concat(),
                );
                assert_eq!(table, reference, "{join_type} --pushdown {mode} {extra:?}");
                let p = &m["pushdown"];
                assert_eq!(
                    p["applies"],
                    serde_json::Value::Bool(skips),
                    "{join_type}: {p}"
                );
                let skipped = p["row_groups_skipped"].as_u64().unwrap();
                if skips {
                    // Keys 1000..1400 live in row groups 2 (1000..1500) only.
                    assert_eq!(skipped, 7, "{join_type} {mode}: {p}");
                    assert!(
                        p["pages_skipped"].as_u64().unwrap() > 0,
                        "{join_type} {mode}: {p}"
                    );
                    assert!(p["bytes_skipped"].as_u64().unwrap() > 0);
                    if mode == "all" {
                        // Keys divisible by 3 are not in the build: dropped by
                        // membership (bloom filter: nearly all of them).
                        assert!(
                            p["rows_dropped_by_membership"].as_u64().unwrap() > 50,
                            "{join_type}: {p}"
                        );
                    }
                } else {
                    assert_eq!(skipped, 0, "{join_type}: {p}");
                }
            }
        }
    }
}

#[test]
fn explain_says_what_the_probe_scan_skips() {
    let dir = tempfile::tempdir().unwrap();
    let (l, r) = inputs(dir.path());
    let explain = |extra: &[&str]| {
        let mut args = vec![
            "join".to_string(),
            "--left".into(),
            l.display().to_string(),
            "--right".into(),
            r.display().to_string(),
            "--on".into(),
            "k=rk".into(),
            "--explain".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = spilljoin(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    assert!(explain(&[]).contains("skips row groups and pages outside the build's key bounds\n"));
    assert!(explain(&["--pushdown", "all"])
        .contains("skips row groups and pages outside the build's key bounds, and rows"));
    assert!(explain(&["--type", "left"]).contains("a left join needs every probe row"));
    assert!(explain(&["--pushdown", "none"]).contains("none (--pushdown none)"));
}

/// The same with the roles swapped: the small input on the left builds (the planner
/// swaps), so the join types that may skip probe rows are the mirrored ones.
#[test]
fn pushdown_on_a_swapped_join() {
    let dir = tempfile::tempdir().unwrap();
    let (probe, build) = inputs(dir.path());
    let types = [
        ("inner", true),
        ("left", true),
        ("right", false),
        ("full", false),
        ("semi", true),
        ("anti", true),
        ("right-semi", true),
        ("right-anti", false),
        ("mark", true),
        ("not-in", false),
        ("right-not-in", false),
    ];
    for (join_type, skips) in types {
        let args = |mode: &str| {
            vec![
                "--type",
                join_type,
                "--on",
                "rk=k",
                "--pushdown",
                mode,
                "--memory-limit",
                "4MiB",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
        };
        let go = |mode: &str| {
            let a = args(mode);
            let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
            run(&build, &probe, dir.path(), &a)
        };
        let (reference, m) = go("none");
        assert_eq!(m["build_side"], "left", "{join_type}");
        for mode in ["bounds", "all"] {
            let (table, m) = go(mode);
            assert_eq!(table, reference, "{join_type} --pushdown {mode}");
            let p = &m["pushdown"];
            assert_eq!(
                p["applies"],
                serde_json::Value::Bool(skips),
                "{join_type}: {p}"
            );
            assert_eq!(
                p["row_groups_skipped"].as_u64().unwrap() > 0,
                skips,
                "{join_type}: {p}"
            );
        }
    }
}

/// With nulls equal to nulls, row groups and pages holding null keys are kept (the
/// build has a null key, which they match): the same output as without pushdown.
#[test]
fn pushdown_keeps_null_keys_when_nulls_match() {
    let dir = tempfile::tempdir().unwrap();
    let (l, r) = inputs(dir.path());
    for join_type in ["inner", "right", "semi", "right-anti"] {
        let base = ["--type", join_type, "--null-equals-null", "--no-swap"];
        let (reference, _) = run(
            &l,
            &r,
            dir.path(),
            &[&base[..], &["--pushdown", "none"]].concat(),
        );
        assert!(!reference.rows.is_empty());
        for mode in ["bounds", "all"] {
            let (table, m) = run(
                &l,
                &r,
                dir.path(),
                &[&base[..], &["--pushdown", mode]].concat(),
            );
            assert_eq!(table, reference, "{join_type} {mode}: {}", m["pushdown"]);
        }
    }
}
