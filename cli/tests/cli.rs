//! End-to-end tests of the `spilljoin` binary over Parquet: join types, `--select`,
//! keys and null equality, errors, the demo, threads and batch sizes, `--metrics`.
//! Formats, `--filter`, signals and the other errors have their own files
//! (`tests/cli_*.rs`).

mod cli_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Int32Array, Int64Array};
use arrow_schema::{DataType, Field, Schema};
use cli_support::*;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------
// 1. Join types

#[test]
fn every_join_type_counts_the_expected_rows() {
    let f = Fixture::new();
    // Inner: id 2 (2 x 2) and id 3 (1 x 1); unmatched left ids 1, null, 5; unmatched
    // right ids 4, null, null.
    let expected = [
        ("inner", 5),
        ("left", 8),
        ("right", 8),
        ("full", 11),
        ("semi", 3),
        ("anti", 3),
        ("right-semi", 3),
        ("right-anti", 3),
        ("mark", 6),
        // A null right key makes NOT IN unknown for every left row ...
        ("not-in", 0),
        // ... and a null left key for every right row.
        ("right-not-in", 0),
        // Aliases.
        ("left-outer", 8),
        ("FULL_OUTER", 11),
    ];
    for (join_type, rows) in expected {
        let run = f.join(&["--type", join_type]);
        assert_eq!(run.rows(), rows, "--type {join_type}");
    }
    // The default is inner.
    assert_eq!(f.join(&[]).rows(), 5);
}

#[test]
fn not_in_without_null_keys_and_with_an_empty_side() {
    let f = Fixture::new();
    // Right keys {2, 3, 4}, no nulls: left ids 1 and 5 are NOT IN; the null id is not.
    let run = f.join_files(&f.left, &f.right_no_nulls, &["--type", "not-in"]);
    assert_eq!(run.rows(), 2);
    // The mirror: right rows whose key is NOT IN the (null-free) left keys.
    let run = f.join_files(&f.right_no_nulls, &f.left, &["--type", "right-not-in"]);
    assert_eq!(run.rows(), 2);
    // NOT IN an empty set is true for every row, a null key included.
    let run = f.join_files(&f.left, &f.empty, &["--type", "not-in"]);
    assert_eq!(run.rows(), 6);
    let out = f.path("not_in.csv");
    let run = f.join_files(
        &f.left,
        &f.right_no_nulls,
        &["--type", "not-in", "--output", out.to_str().unwrap()],
    );
    assert_eq!(run.rows(), 2);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&["id", "name", "lv", "tag"]));
    assert_eq!(table.rows, rows(&["1,a,10,p", "5,f,60,p"]));
}

#[test]
fn inner_join_to_parquet() {
    let f = Fixture::new();
    let out = f.path("inner.parquet");
    let run = f.join(&["--output", out.to_str().unwrap()]);
    assert_eq!(run.rows(), 5);
    let table = Table::read_parquet(&out);
    assert_eq!(table.columns, names(&FULL_COLUMNS));
    assert_eq!(table.rows, rows(&INNER_ROWS));
}

#[test]
fn left_join_to_arrow_pads_with_nulls() {
    let f = Fixture::new();
    let out = f.path("left.arrow");
    let run = f.join(&["--type", "left", "--output", out.to_str().unwrap()]);
    assert_eq!(run.rows(), 8);
    let table = Table::read_arrow(&out);
    assert_eq!(table.columns, names(&FULL_COLUMNS));
    let mut expected: Vec<&str> = INNER_ROWS.to_vec();
    expected.extend(["1,a,10,p,,,,", ",e,50,p,,,,", "5,f,60,p,,,,"]);
    assert_eq!(table.rows, rows(&expected));
}

#[test]
fn full_join_to_csv() {
    let f = Fixture::new();
    let out = f.path("full.csv");
    let run = f.join(&["--type", "full", "--output", out.to_str().unwrap()]);
    assert_eq!(run.rows(), 11);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&FULL_COLUMNS));
    let mut expected: Vec<&str> = INNER_ROWS.to_vec();
    expected.extend([
        "1,a,10,p,,,,",
        ",e,50,p,,,,",
        "5,f,60,p,,,,",
        ",,,,4,w,400,p",
        ",,,,,v,500,p",
        ",,,,,u,600,",
    ]);
    assert_eq!(table.rows, rows(&expected));
}

#[test]
fn mark_join_to_csv_adds_a_mark_column() {
    let f = Fixture::new();
    let out = f.path("mark.csv");
    let run = f.join(&["--type", "mark", "--output", out.to_str().unwrap()]);
    assert_eq!(run.rows(), 6);
    let table = Table::read_csv(&out);
    // One side only: no left./right. prefixes.
    assert_eq!(table.columns, names(&["id", "name", "lv", "tag", "mark"]));
    assert_eq!(
        table.rows,
        rows(&[
            "1,a,10,p,false",
            "2,b,20,p,true",
            "2,c,30,q,true",
            "3,d,40,,true",
            ",e,50,p,false",
            "5,f,60,p,false",
        ])
    );
}

#[test]
fn semi_and_anti_joins_to_parquet() {
    let f = Fixture::new();
    let cases: [(&str, &[&str], &[&str]); 4] = [
        (
            "semi",
            &["id", "name", "lv", "tag"],
            &["2,b,20,p", "2,c,30,q", "3,d,40,"],
        ),
        (
            "anti",
            &["id", "name", "lv", "tag"],
            &["1,a,10,p", ",e,50,p", "5,f,60,p"],
        ),
        (
            "right-semi",
            &["id", "name", "rv", "label"],
            &["2,x,100,p", "2,y,200,q", "3,z,300,"],
        ),
        (
            "right-anti",
            &["id", "name", "rv", "label"],
            &["4,w,400,p", ",v,500,p", ",u,600,"],
        ),
    ];
    for (join_type, columns, expected) in cases {
        let out = f.path(&format!("{join_type}.parquet"));
        let run = f.join(&["--type", join_type, "--output", out.to_str().unwrap()]);
        assert_eq!(run.rows(), expected.len() as u64, "{join_type}");
        let table = Table::read_parquet(&out);
        assert_eq!(table.columns, names(columns), "{join_type}");
        assert_eq!(table.rows, rows(expected), "{join_type}");
    }
}

#[test]
fn an_output_without_rows_still_has_its_columns() {
    let f = Fixture::new();
    for ext in ["csv", "parquet", "arrow"] {
        let out = f.path(&format!("no_rows.{ext}"));
        let run = f.join_files(&f.left, &f.empty, &["--output", out.to_str().unwrap()]);
        assert_eq!(run.rows(), 0, "{ext}");
        let table = match ext {
            "csv" => Table::read_csv(&out),
            "parquet" => Table::read_parquet(&out),
            _ => Table::read_arrow(&out),
        };
        assert_eq!(table.columns, names(&FULL_COLUMNS), "{ext}");
        assert!(table.rows.is_empty(), "{ext}");
    }
}

// ---------------------------------------------------------------------------------
// 2. --select

#[test]
fn select_picks_and_orders_columns() {
    let f = Fixture::new();
    let out = f.path("select.parquet");
    let run = f.join(&[
        "--select",
        "rv,left.name,right.id,lv",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.rows(), 5);
    let table = Table::read_parquet(&out);
    // Names as in the full output, whatever else is selected.
    assert_eq!(table.columns, names(&["rv", "left.name", "right.id", "lv"]));
    assert_eq!(
        table.rows,
        rows(&[
            "100,b,2,20",
            "200,b,2,20",
            "100,c,2,30",
            "200,c,2,30",
            "300,d,3,40"
        ])
    );

    // A qualified name both inputs have, alone, keeps its qualifier.
    let out = f.path("select_one.csv");
    let run = f.join(&["--select", "right.name", "--output", out.to_str().unwrap()]);
    assert_eq!(run.rows(), 5);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&["right.name"]));
    assert_eq!(table.rows, rows(&["x", "x", "y", "y", "z"]));

    // A join with one output side: plain names are not ambiguous.
    let out = f.path("select_semi.csv");
    let run = f.join(&[
        "--type",
        "semi",
        "--select",
        "name,id",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.rows(), 3);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&["name", "id"]));
    assert_eq!(table.rows, rows(&["b,2", "c,2", "d,3"]));

    // The mark column can be selected by name.
    let out = f.path("select_mark.csv");
    let run = f.join(&[
        "--type",
        "mark",
        "--select",
        "mark,name",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.rows(), 6);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&["mark", "name"]));
    assert_eq!(
        table.rows,
        rows(&["false,a", "true,b", "true,c", "true,d", "false,e", "false,f"])
    );
}

#[test]
fn select_errors() {
    let f = Fixture::new();
    f.join(&["--select", "name"]).error(
        INVALID_JOIN,
        &["--select name", "both sides", "left.name", "right.name"],
    );
    f.join(&["--select", "lv,nope"])
        .error(INVALID_JOIN, &["--select nope", "no such output column"]);
    f.join(&["--select", "right.nope"]).error(
        INVALID_JOIN,
        &["\"nope\"", "right input", "id, name, rv, label"],
    );
    f.join(&["--select", "left.rv"])
        .error(INVALID_JOIN, &["\"rv\"", "left input", "id, name, lv, tag"]);
    f.join(&["--type", "semi", "--select", "right.rv"])
        .error(INVALID_JOIN, &["right.rv", "outputs no right columns"]);
    // `mark` is a column only of mark joins.
    f.join(&["--type", "semi", "--select", "mark"])
        .error(INVALID_JOIN, &["--select mark", "no such output column"]);
}

// ---------------------------------------------------------------------------------
// 3. Several keys, null equality

#[test]
fn several_keys_and_null_equality() {
    let f = Fixture::new();
    // (id, tag) = (id, label): (2, p) and (2, q) match; (3, null) does not under SQL.
    assert_eq!(f.join(&["--on", "id=id,tag=label"]).rows(), 2);
    assert_eq!(f.join(&["--on", "id=id", "--on", "tag=label"]).rows(), 2);
    assert_eq!(f.join(&["--on", " id = id , tag = label "]).rows(), 2);
    // With nulls equal: (3, null) and (null, p) match too.
    let out = f.path("nulls.csv");
    let run = f.join(&[
        "--on",
        "id=id,tag=label",
        "--null-equals-null",
        "--select",
        "left.name,right.name",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.rows(), 4);
    let table = Table::read_csv(&out);
    assert_eq!(table.columns, names(&["left.name", "right.name"]));
    assert_eq!(table.rows, rows(&["b,x", "c,y", "d,z", "e,v"]));

    // One key: the null left id now matches both null right ids.
    let expected = [
        ("inner", 7),
        ("left", 9),
        ("right", 8),
        ("full", 10),
        ("semi", 4),
        ("anti", 2),
        ("right-semi", 5),
        ("right-anti", 1),
        ("mark", 6),
    ];
    for (join_type, rows) in expected {
        let run = f.join(&["--type", join_type, "--null-equals-null"]);
        assert_eq!(run.rows(), rows, "--type {join_type} --null-equals-null");
    }
    // NOT IN is null-aware by definition.
    f.join(&["--type", "not-in", "--null-equals-null"])
        .error(INVALID_JOIN, &["not-in", "null-aware"]);
    f.join(&["--type", "not-in", "--on", "id=id,tag=label"])
        .error(INVALID_JOIN, &["not-in", "exactly one key"]);
}

// ---------------------------------------------------------------------------------
// 4. Errors

#[test]
fn input_errors() {
    let f = Fixture::new();
    let missing = f.path("missing.parquet");
    f.join_files(&missing, &f.right, &[])
        .error(BAD_INPUT, &["cannot open", "missing.parquet"]);
    f.join_files(&f.left, &missing, &[])
        .error(BAD_INPUT, &["cannot open", "missing.parquet"]);

    let text = f.path("text.parquet");
    std::fs::write(&text, "id,name\n1,a\n").unwrap();
    f.join_files(&text, &f.right, &[])
        .error(BAD_INPUT, &["text.parquet", "not a readable Parquet file"]);
    let empty_file = f.path("zero.parquet");
    std::fs::write(&empty_file, "").unwrap();
    f.join_files(&f.left, &empty_file, &[])
        .error(BAD_INPUT, &["zero.parquet", "not a readable Parquet file"]);
}

#[test]
fn key_errors() {
    let f = Fixture::new();
    f.join(&["--on", "nope=id"]).error(
        INVALID_JOIN,
        &["\"nope\"", "left input", "id, name, lv, tag"],
    );
    f.join(&["--on", "id=nope"]).error(
        INVALID_JOIN,
        &["\"nope\"", "right input", "id, name, rv, label"],
    );
    f.join(&["--on", "id=name"])
        .error(INVALID_JOIN, &["key types differ", "Int64", "Utf8"]);
    f.join(&["--on", "name=rv"])
        .error(INVALID_JOIN, &["key types differ", "Utf8", "Int32"]);
}

#[test]
fn memory_limit_too_small_is_resources_exhausted() {
    let f = Fixture::new();
    let out = f.path("oom.parquet");
    let line = f
        .join(&["--memory-limit", "1KiB", "--output", out.to_str().unwrap()])
        .error(OUT_OF_MEMORY, &["resources exhausted"]);
    assert!(line.contains("1024"), "{line}");
    // No partial output is left behind.
    assert!(!out.exists(), "a partial output was left behind");
    // Sizes are human: a decimal one, enough for these inputs, works.
    assert_eq!(f.join(&["--memory-limit", "64MB"]).rows(), 5);
    assert_eq!(f.join(&["--memory-limit", "1.5GiB"]).rows(), 5);
}

#[test]
fn usage_errors() {
    let f = Fixture::new();
    f.join(&["--memory-limit", "abc"])
        .usage_error(&["--memory-limit", "abc"]);
    f.join(&["--type", "sideways"]).usage_error(&["sideways"]);
    f.join(&["--on", "id"]).usage_error(&["--on", "LCOL=RCOL"]);
    f.join(&["--on", "id="]).usage_error(&["--on"]);
    f.join(&["--batch-size", "0"])
        .usage_error(&["--batch-size"]);
    f.join(&["--threads", "0"]).usage_error(&["--threads"]);
    f.join(&["--threads", "many"]).usage_error(&["--threads"]);
    f.join(&["--frobnicate"]).usage_error(&["--frobnicate"]);
    // --on is required.
    spilljoin(&[
        "join",
        "--left",
        f.left.to_str().unwrap(),
        "--right",
        f.right.to_str().unwrap(),
    ])
    .usage_error(&["--on"]);
    spilljoin(&["explode"]).usage_error(&["explode"]);
    // No subcommand: usage on stderr, code 2.
    let run = spilljoin::<&str>(&[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    run.assert_no_panic();

    // Help and version are not errors.
    let run = spilljoin(&["--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("join") && run.stdout.contains("demo"),
        "{}",
        run.stdout
    );
    let run = spilljoin(&["join", "--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("--memory-limit"), "{}", run.stdout);
    let run = spilljoin(&["--version"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("spilljoin "), "{}", run.stdout);
}

#[test]
fn output_errors() {
    let f = Fixture::new();
    let out = f.path("out.txt");
    f.join(&["--output", out.to_str().unwrap()]).error(
        INVALID_JOIN,
        &["out.txt", "cannot tell the output format", ".parquet"],
    );
    assert!(!out.exists());
    let out = f.path("no_extension");
    f.join(&["--output", out.to_str().unwrap()])
        .error(INVALID_JOIN, &["cannot tell the output format"]);
    let out = f.path("no/such/dir/out.csv");
    f.join(&["--output", out.to_str().unwrap()])
        .error(BAD_OUTPUT, &["cannot create", "out.csv"]);
    // Writing over an input would destroy it before it is read.
    let left = f.left.to_str().unwrap().to_string();
    f.join(&["--output", &left])
        .error(INVALID_JOIN, &["--output", "left.parquet", "input"]);
    assert_eq!(f.join(&[]).rows(), 5, "the input was damaged");
    // Upper-case extensions are fine.
    let out = f.path("OUT.CSV");
    assert_eq!(f.join(&["--output", out.to_str().unwrap()]).rows(), 5);
    assert_eq!(Table::read_csv(&out).rows, rows(&INNER_ROWS));
}

#[test]
fn spill_dir_errors_are_one_line_without_repeats() {
    let f = Fixture::new();
    let dir = f.path("no/such/dir");
    let line = f
        .join(&["--spill-dir", dir.to_str().unwrap()])
        .error(SPILL_FAILED, &["spill", "no/such/dir"]);
    assert_eq!(
        line.matches("os error 2").count(),
        1,
        "the cause is repeated: {line}"
    );
    // An existing directory works.
    let dir = f.path("spill");
    std::fs::create_dir(&dir).unwrap();
    assert_eq!(f.join(&["--spill-dir", dir.to_str().unwrap()]).rows(), 5);
}

// ---------------------------------------------------------------------------------
// 5. demo

#[test]
fn demo_joins_every_line_item_with_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = spilljoin(&[
        "demo",
        "--orders",
        "2000",
        "--dir",
        data.to_str().unwrap(),
        "--threads",
        "2",
    ]);
    let rows = run.rows();
    // "demo: 2000 orders and N line items in DIR"
    let line = run
        .stderr
        .lines()
        .find(|l| l.starts_with("demo: 2000 orders and "))
        .unwrap_or_else(|| panic!("no demo line:\n{}", run.stderr));
    let line_items: u64 = line["demo: 2000 orders and ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // One to seven line items per order, each joined with exactly its order.
    assert!((2000..=14_000).contains(&line_items), "{line}");
    assert_eq!(rows, line_items);
    assert!(data.join("orders.parquet").exists());
    assert!(data.join("lineitem.parquet").exists());
    // The files it leaves join the same way with `spilljoin join`.
    let run = spilljoin(&[
        "join",
        "--left",
        data.join("lineitem.parquet").to_str().unwrap(),
        "--right",
        data.join("orders.parquet").to_str().unwrap(),
        "--on",
        "l_orderkey=o_orderkey",
        "--type",
        "semi",
    ]);
    assert_eq!(run.rows(), line_items);

    // Without --dir it cleans up after itself; the data is deterministic.
    let run = spilljoin(&["demo", "--orders", "2000"]);
    assert_eq!(run.rows(), line_items);
}

// ---------------------------------------------------------------------------------
// 6. Threads and batch sizes

/// Inputs big enough for many batches and row groups: `left(k, v)` and `right(k, w)`,
/// keys drawn from 0..300 with about 5% nulls. Returns the expected inner join rows.
fn random_inputs(dir: &Path) -> (PathBuf, PathBuf, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let key = |rng: &mut rand::rngs::StdRng| {
        (!rng.random_bool(0.05)).then(|| rng.random_range(0..300i64))
    };
    let left_keys: Vec<Option<i64>> = (0..4000).map(|_| key(&mut rng)).collect();
    let right_keys: Vec<Option<i64>> = (0..1500).map(|_| key(&mut rng)).collect();
    let mut expected = 0u64;
    let mut right_count = std::collections::HashMap::new();
    for k in right_keys.iter().flatten() {
        *right_count.entry(*k).or_insert(0u64) += 1;
    }
    for k in left_keys.iter().flatten() {
        expected += right_count.get(k).copied().unwrap_or(0);
    }
    let write = |name: &str, value: &str, keys: Vec<Option<i64>>| {
        let n = keys.len();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new(value, DataType::Int32, false),
        ]));
        let b = batch(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int32Array::from_iter_values(0..n as i32)),
            ],
        );
        let path = dir.join(name);
        write_parquet(&path, &b, 333);
        path
    };
    let left = write("big_left.parquet", "v", left_keys);
    let right = write("big_right.parquet", "w", right_keys);
    (left, right, expected)
}

#[test]
fn threads_and_batch_sizes_do_not_change_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let (left, right, expected) = random_inputs(dir.path());
    let mut tables = Vec::new();
    for (i, extra) in [
        &["--threads", "1"][..],
        &["--threads", "3"],
        &["--batch-size", "7"],
        &["--threads", "3", "--batch-size", "7"],
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.path().join(format!("out{i}.parquet"));
        let mut args = vec![
            "join",
            "--left",
            left.to_str().unwrap(),
            "--right",
            right.to_str().unwrap(),
            "--on",
            "k=k",
            "--type",
            "full",
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let run = spilljoin(&args);
        let table = Table::read_parquet(&out);
        assert_eq!(run.rows(), table.rows.len() as u64, "{extra:?}");
        tables.push(table);
    }
    let first = &tables[0];
    assert_eq!(first.columns, names(&["left.k", "v", "right.k", "w"]));
    let matched = first
        .rows
        .iter()
        .filter(|r| r[1].is_some() && r[3].is_some())
        .count();
    assert_eq!(matched as u64, expected);
    for t in &tables[1..] {
        assert!(t == first, "the output depends on --threads / --batch-size");
    }
    // Counting only gives the same numbers.
    for extra in [
        &["--threads", "1"][..],
        &["--threads", "3", "--batch-size", "7"],
    ] {
        let mut args = vec![
            "join",
            "--left",
            left.to_str().unwrap(),
            "--right",
            right.to_str().unwrap(),
            "--on",
            "k=k",
        ];
        args.extend_from_slice(extra);
        assert_eq!(spilljoin(&args).rows(), expected, "{extra:?}");
    }
}

// ---------------------------------------------------------------------------------
// 7. --metrics

/// The value of `"key": NUMBER` in a flat JSON object.
fn json_number(json: &str, key: &str) -> f64 {
    let needle = format!("\"{key}\":");
    let start = json
        .find(&needle)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + needle.len();
    let value: String = json[start..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-' || *c == 'e')
        .collect();
    value
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

#[test]
fn metrics_file_matches_the_printed_rows() {
    let f = Fixture::new();
    for (join_type, rows) in [("full", 11u64), ("right-anti", 3)] {
        let metrics = f.path(&format!("{join_type}.json"));
        let run = f.join(&[
            "--type",
            join_type,
            "--memory-limit",
            "32MiB",
            "--metrics",
            metrics.to_str().unwrap(),
        ]);
        assert_eq!(run.rows(), rows);
        let json = std::fs::read_to_string(&metrics).unwrap();
        let trimmed = json.trim();
        assert!(trimmed.starts_with('{') && trimmed.ends_with('}'), "{json}");
        assert_eq!(json_number(&json, "output_rows"), rows as f64, "{json}");
        assert_eq!(json_number(&json, "build_rows"), 6.0, "{json}");
        assert_eq!(json_number(&json, "probe_rows"), 6.0, "{json}");
        assert_eq!(
            json_number(&json, "memory_limit_bytes"),
            (32u64 << 20) as f64,
            "{json}"
        );
        assert!(json_number(&json, "peak_reserved_bytes") > 0.0, "{json}");
        assert!(json_number(&json, "elapsed_seconds") >= 0.0, "{json}");
    }
    let metrics = f.path("nowhere/m.json");
    f.join(&["--metrics", metrics.to_str().unwrap()])
        .error(BAD_OUTPUT, &["cannot write metrics", "m.json"]);
}

#[test]
fn spill_direct_io_is_auto_unless_asked_and_reported_with_its_reason() {
    let f = Fixture::new();
    let expected = f.join(&["--memory-limit", "256MiB"]).rows();
    // Six-row inputs spill nothing, so `auto` reads buffered; the flag alone is `on`.
    // Under 32 MiB, `auto` leaves the direct buffers' 5 MiB a thread out of the limit.
    for (limit, flag, direct, reason) in [
        ("256MiB", None, false, "not over a quarter"),
        (
            "256MiB",
            Some("--spill-direct-io"),
            true,
            "--spill-direct-io on",
        ),
        (
            "256MiB",
            Some("--spill-direct-io=on"),
            true,
            "--spill-direct-io on",
        ),
        (
            "256MiB",
            Some("--spill-direct-io=off"),
            false,
            "--spill-direct-io off",
        ),
        (
            "256MiB",
            Some("--spill-direct-io=auto"),
            false,
            "not over a quarter",
        ),
        (
            "32MiB",
            Some("--spill-direct-io=auto"),
            false,
            "more than an eighth",
        ),
    ] {
        let metrics = f.path("direct.json");
        let mut args = vec!["--threads", "2", "--memory-limit", limit, "--metrics"];
        args.push(metrics.to_str().unwrap());
        args.extend(flag);
        assert_eq!(f.join(&args).rows(), expected, "{flag:?}");
        let json: String = std::fs::read_to_string(&metrics)
            .unwrap()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        assert!(
            json.contains(&format!("\"direct_io\":{direct}")),
            "{flag:?}: {json}"
        );
        let reason = reason.replace(' ', "");
        assert!(json.contains(&reason), "{flag:?}: {json}");
        // Direct, its buffers (two threads' worth) come out of the join's limit.
        let in_limit = json_number(&json, "direct_io_buffers_in_limit_bytes");
        assert_eq!(in_limit > 0.0, direct, "{flag:?}: {json}");
    }
    // Direct readers read six runs ahead and threads keep four writes in flight
    // where two threads' 12 MiB fit in a sixteenth of the limit; under 64 MiB
    // readers read three ahead and writers wait for their writes.
    for (limit, ahead, behind) in [("1GiB", 6.0, 4.0), ("64MiB", 3.0, 0.0)] {
        let metrics = f.path("ahead.json");
        let path = metrics.to_str().unwrap();
        let args = [
            "--threads",
            "2",
            "--memory-limit",
            limit,
            "--spill-direct-io",
        ];
        assert_eq!(
            f.join(&[&args[..], &["--metrics", path]].concat()).rows(),
            expected
        );
        let json = std::fs::read_to_string(&metrics).unwrap();
        assert_eq!(
            json_number(&json, "direct_read_ahead"),
            ahead,
            "{limit}: {json}"
        );
        let writes = json_number(&json, "direct_writes_behind");
        assert_eq!(writes, behind, "{limit}: {json}");
    }
    f.join(&["--spill-direct-io=sometimes"])
        .usage_error(&["sometimes", "auto, on or off"]);
}
