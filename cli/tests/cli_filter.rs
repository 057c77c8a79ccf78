//! End-to-end tests of `--filter`: its results on the fixture against hand-computed
//! answers for every kind of join (the filter is part of the join condition), and
//! its errors. The expression language itself is tested in `cli/src/filter/tests.rs`.
//!
//! ```text
//!  left                       right                 inner pairs on id:
//!  id    name lv  tag         id    name rv   label   b-x b-y c-x c-y d-z
//!  1     a    10  p           2     x    100  p
//!  2     b    20  p           2     y    200  q
//!  2     c    30  q           3     z    300  null
//!  3     d    40  null        4     w    400  p
//!  null  e    50  p           null  v    500  p
//!  5     f    60  p           null  u    600  null
//! ```

mod cli_support;

use cli_support::*;

/// The join's `left.name,right.name` pairs (an unmatched side empty) with `extra`.
fn pairs(f: &Fixture, extra: &[&str]) -> Vec<Vec<Option<String>>> {
    let mut args = extra.to_vec();
    args.extend(["--output", "-", "--select", "left.name,right.name"]);
    let run = f.join(&args);
    let table = Table::from_csv(&run.stdout);
    assert_eq!(run.rows(), table.rows.len() as u64, "{extra:?}");
    assert_eq!(table.columns, names(&["left.name", "right.name"]));
    table.rows
}

#[test]
fn an_inner_join_keeps_the_pairs_that_pass() {
    let f = Fixture::new();
    // tag = label: b-x (p = p) and c-y (q = q); d-z compares a null: not a match.
    assert_eq!(
        pairs(&f, &["--filter", "tag = label"]),
        rows(&["b,x", "c,y"])
    );
    // rv > lv * 5: b-y (200 > 100), c-y (200 > 150), d-z (300 > 200).
    assert_eq!(
        pairs(&f, &["--filter", "rv > lv * 5"]),
        rows(&["b,y", "c,y", "d,z"])
    );
    assert_eq!(
        pairs(
            &f,
            &["--filter", "left.name = 'b' OR rv BETWEEN 250 AND 350"]
        ),
        rows(&["b,x", "b,y", "d,z"])
    );
    assert_eq!(
        pairs(
            &f,
            &[
                "--filter",
                "right.name IN ('y', 'z') AND left.name LIKE '_'"
            ]
        ),
        rows(&["b,y", "c,y", "d,z"])
    );
    assert_eq!(
        pairs(&f, &["--filter", "tag IS NULL OR label IS NULL"]),
        rows(&["d,z"])
    );
    assert_eq!(
        pairs(&f, &["--filter", "NOT (lv < 30)"]),
        rows(&["c,x", "c,y", "d,z"])
    );
    assert!(pairs(&f, &["--filter", "1 = 0"]).is_empty());
    assert_eq!(pairs(&f, &["--filter", "TRUE"]).len(), 5);
}

#[test]
fn outer_semi_anti_and_mark_joins_count_only_passing_matches() {
    let f = Fixture::new();
    // Left: every left row once at least; d's only candidate fails, so d is unmatched.
    assert_eq!(
        pairs(&f, &["--type", "left", "--filter", "tag = label"]),
        rows(&["b,x", "c,y", "a,", "d,", "e,", "f,"])
    );
    // Right: lv >= 30 passes c-x, c-y, d-z; w, v, u unmatched.
    assert_eq!(
        pairs(&f, &["--type", "right", "--filter", "lv >= 30"]),
        rows(&["c,x", "c,y", "d,z", ",w", ",v", ",u"])
    );
    // Full: both.
    assert_eq!(
        pairs(&f, &["--type", "full", "--filter", "tag = label"]).len(),
        2 + 4 + 4
    );
    // Semi and anti: left rows with / without a passing match.
    let names_of = |join_type: &str| -> Vec<Vec<Option<String>>> {
        let run = f.join(&[
            "--type",
            join_type,
            "--filter",
            "tag = label",
            "--select",
            "name",
            "--output",
            "-",
        ]);
        Table::from_csv(&run.stdout).rows
    };
    assert_eq!(names_of("semi"), rows(&["b", "c"]));
    assert_eq!(names_of("anti"), rows(&["a", "d", "e", "f"]));
    assert_eq!(names_of("right-semi"), rows(&["x", "y"]));
    assert_eq!(names_of("right-anti"), rows(&["z", "w", "v", "u"]));
    let run = f.join(&[
        "--type",
        "mark",
        "--filter",
        "tag = label",
        "--select",
        "name,mark",
        "--output",
        "-",
    ]);
    assert_eq!(
        Table::from_csv(&run.stdout).rows,
        rows(&["a,false", "b,true", "c,true", "d,false", "e,false", "f,false"])
    );
}

#[test]
fn the_filter_is_the_same_under_spilling_and_side_swaps() {
    let f = Fixture::new();
    let expected = pairs(&f, &["--type", "left", "--filter", "rv > lv * 5"]);
    for extra in [
        &["--no-swap"][..],
        &["--threads", "1", "--batch-size", "1"],
        &["--memory-limit", "4MiB"],
    ] {
        let mut args = vec!["--type", "left", "--filter", "rv > lv * 5"];
        args.extend_from_slice(extra);
        assert_eq!(pairs(&f, &args), expected, "{extra:?}");
    }
    let mut args = vec!["--type", "left", "--filter", "rv > lv * 5"];
    args.extend(["--output", "-", "--select", "left.name,right.name"]);
    let run = spilljoin_env(
        &[
            &["join", "--left", f.left.to_str().unwrap(), "--right"][..],
            &[f.right.to_str().unwrap(), "--on", "id=id"],
            &args,
        ]
        .concat(),
        &[("SPILLJOIN_FORCE_SPILL", "all")],
    );
    assert!(run.stderr.contains("spilled: "), "{}", run.stderr);
    assert_eq!(Table::from_csv(&run.stdout).rows, expected);
}

#[test]
fn filter_errors_say_where() {
    let f = Fixture::new();
    f.join(&["--filter", "lv > 1 AND nmae = 'x'"]).error(
        INVALID_JOIN,
        &[
            "--filter",
            "no column \"nmae\"",
            "did you mean \"name\"",
            "column 12",
        ],
    );
    f.join(&["--filter", "name = 'x'"])
        .error(INVALID_JOIN, &["both inputs", "left.name or right.name"]);
    f.join(&["--filter", "tag > 5"])
        .error(INVALID_JOIN, &["cannot compare tag (Utf8) with 5 (Int64)"]);
    f.join(&["--filter", "lv >"]).error(
        INVALID_JOIN,
        &["Expected: an expression", "end of the filter"],
    );
    f.join(&["--filter", "lv > 1 lv"])
        .error(INVALID_JOIN, &["unexpected lv", "column 8"]);
    f.join(&["--filter", "lv + rv"])
        .error(INVALID_JOIN, &["must be true or false", "Int32"]);
    // NOT IN joins take no filter.
    f.join(&["--type", "not-in", "--filter", "lv > 1"])
        .error(INVALID_JOIN, &["not-in", "residual filter"]);
    // A CAST that fails on a value stops the join with the value.
    f.join(&["--filter", "CAST(tag AS INT) > 1"])
        .error(INVALID_JOIN, &["filter failed", "Int32"]);
    assert_eq!(
        pairs(&f, &["--filter", "TRY_CAST(tag AS INT) IS NULL"]).len(),
        5
    );
}
