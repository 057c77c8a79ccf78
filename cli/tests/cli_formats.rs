//! End-to-end tests of the `spilljoin` binary's formats: every input format, every
//! output format and compression, stdout, directories and globs, CSV options and
//! schema overrides, and atomic output files.

mod cli_support;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use cli_support::*;
use parquet::file::reader::{FileReader, SerializedFileReader};

const FORMATS: [&str; 5] = ["parquet", "arrow", "arrows", "csv", "ndjson"];

#[test]
fn every_input_format_joins_like_parquet() {
    let f = Fixture::new();
    for (left_format, right_format) in FORMATS.iter().map(|x| (*x, *x)).chain([
        ("csv", "parquet"),
        ("ndjson", "arrow"),
        ("arrows", "csv"),
    ]) {
        let left = f.path(&format!("in_left.{left_format}"));
        let right = f.path(&format!("in_right.{right_format}"));
        write_as(&left, &Fixture::left_batch());
        write_as(&right, &Fixture::right_batch());
        let out = f.path(&format!("out_{left_format}_{right_format}.csv"));
        let run = f.join_files(&left, &right, &["--output", out.to_str().unwrap()]);
        let what = format!("{left_format} ⋈ {right_format}");
        assert_eq!(run.rows(), 5, "{what}");
        let table = Table::read_csv(&out);
        // NDJSON readers order the columns by name.
        if left_format != "ndjson" {
            assert_eq!(table.columns[..4], names(&FULL_COLUMNS)[..4], "{what}");
        }
        let mut expected = Table::from_csv(&format!(
            "{}\n{}",
            FULL_COLUMNS.join(","),
            INNER_ROWS.join("\n")
        ));
        if left_format == "ndjson" || right_format == "ndjson" {
            // Compare by column name, whatever the order.
            expected = reorder(&expected, &table.columns);
        }
        assert_eq!(table.rows, expected.rows, "{what}");
        // Every format joins the other way round too, and left joins keep nulls.
        let run = f.join_files(&left, &right, &["--type", "full"]);
        assert_eq!(run.rows(), 11, "{what} full");
    }
}

/// `table` with its columns in `order` (by name).
fn reorder(table: &Table, order: &[String]) -> Table {
    let index: Vec<usize> = order
        .iter()
        .map(|c| table.columns.iter().position(|t| t == c).unwrap())
        .collect();
    let mut rows: Vec<Vec<Option<String>>> = table
        .rows
        .iter()
        .map(|r| index.iter().map(|&i| r[i].clone()).collect())
        .collect();
    rows.sort();
    Table {
        columns: order.to_vec(),
        rows,
    }
}

#[test]
fn every_output_format_round_trips() {
    let f = Fixture::new();
    for format in FORMATS {
        let out = f.path(&format!("out.{format}"));
        let run = f.join(&["--type", "left", "--output", out.to_str().unwrap()]);
        assert_eq!(run.rows(), 8, "{format}");
        let table = Table::read(&out);
        assert_eq!(table.columns, names(&FULL_COLUMNS), "{format}");
        let mut expected: Vec<&str> = INNER_ROWS.to_vec();
        expected.extend(["1,a,10,p,,,,", ",e,50,p,,,,", "5,f,60,p,,,,"]);
        assert_eq!(table.rows, rows(&expected), "{format}");
    }
    // --output-format wins over the extension.
    let out = f.path("out.dat");
    let run = f.join(&[
        "--output",
        out.to_str().unwrap(),
        "--output-format",
        "arrows",
    ]);
    assert_eq!(run.rows(), 5);
    assert_eq!(Table::read_arrows(&out).rows, rows(&INNER_ROWS));
}

#[test]
fn compression_options() {
    let f = Fixture::new();
    let codec = |path: &Path| -> String {
        let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        reader
            .metadata()
            .row_group(0)
            .column(0)
            .compression()
            .to_string()
    };
    let out = f.path("default.parquet");
    f.join(&["--output", out.to_str().unwrap()]).rows();
    assert!(codec(&out).starts_with("ZSTD"), "{}", codec(&out));
    for (flag, expected) in [
        ("none", "UNCOMPRESSED"),
        ("snappy", "SNAPPY"),
        ("lz4", "LZ4_RAW"),
        ("zstd:9", "ZSTD"),
    ] {
        let out = f.path(&format!("c_{}.parquet", flag.replace(':', "_")));
        let run = f.join(&["--output", out.to_str().unwrap(), "--compression", flag]);
        assert_eq!(run.rows(), 5, "{flag}");
        assert!(codec(&out).starts_with(expected), "{flag}: {}", codec(&out));
        assert_eq!(Table::read_parquet(&out).rows, rows(&INNER_ROWS), "{flag}");
    }
    for flag in ["lz4", "zstd"] {
        let out = f.path(&format!("c_{flag}.arrow"));
        f.join(&["--output", out.to_str().unwrap(), "--compression", flag])
            .rows();
        assert_eq!(Table::read_arrow(&out).rows, rows(&INNER_ROWS), "{flag}");
    }
    let out = f.path("bad.csv");
    f.join(&["--output", out.to_str().unwrap(), "--compression", "zstd"])
        .error(INVALID_JOIN, &["--compression zstd", "csv", "none"]);
    let out = f.path("bad.parquet");
    f.join(&[
        "--output",
        out.to_str().unwrap(),
        "--compression",
        "zstd:99",
    ])
    .error(INVALID_JOIN, &["zstd:99", "zstd:LEVEL"]);
    assert!(!out.exists());
}

#[test]
fn stdout_gets_only_the_data() {
    let f = Fixture::new();
    // CSV by default.
    let run = f.join(&["--output", "-"]);
    assert_eq!(run.rows(), 5);
    let table = Table::from_csv(&run.stdout);
    assert_eq!(table.columns, names(&FULL_COLUMNS));
    assert_eq!(table.rows, rows(&INNER_ROWS));
    // NDJSON.
    let run = f.join(&[
        "--output",
        "-",
        "--output-format",
        "ndjson",
        "--type",
        "semi",
    ]);
    assert_eq!(run.rows(), 3);
    let table = Table::from_ndjson(&run.stdout);
    assert_eq!(table.columns, names(&["id", "name", "lv", "tag"]));
    assert_eq!(table.rows, rows(&["2,b,20,p", "2,c,30,q", "3,d,40,"]));
    // Binary formats too: Parquet to a pipe.
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
            "--output-format",
            "parquet",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(output.stderr.is_empty(), "--quiet printed something");
    let piped = f.path("piped.parquet");
    std::fs::write(&piped, &output.stdout).unwrap();
    assert_eq!(Table::read_parquet(&piped).rows, rows(&INNER_ROWS));
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let f = Fixture::new();
    // `spilljoin ... | head -c 10`: the pipe closes after the first bytes.
    let mut child = Command::new(env!("CARGO_BIN_EXE_spilljoin"))
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
            "--batch-size",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

#[test]
fn directories_and_globs_read_every_file() {
    let f = Fixture::new();
    let left = Fixture::left_batch();
    let dir = f.path("parts");
    std::fs::create_dir_all(dir.join("more")).unwrap();
    write_parquet(&dir.join("part-0.parquet"), &left.slice(0, 2), 1);
    write_parquet(&dir.join("part-1.parquet"), &left.slice(2, 3), 2);
    write_parquet(&dir.join("more/part-2.parquet"), &left.slice(5, 1), 1);
    // Markers and hidden files are skipped.
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    std::fs::write(dir.join(".part-0.parquet.crc"), "garbage").unwrap();
    for spec in [
        dir.to_str().unwrap().to_string(),
        format!("{}/**/part-*.parquet", dir.display()),
    ] {
        let out = f.path("dir.csv");
        let run = f.join_files(
            Path::new(&spec),
            &f.right,
            &["--output", out.to_str().unwrap()],
        );
        assert_eq!(run.rows(), 5, "{spec}");
        assert_eq!(Table::read_csv(&out).rows, rows(&INNER_ROWS), "{spec}");
    }
    // A directory of CSV files.
    let csv = f.path("csv_parts");
    std::fs::create_dir(&csv).unwrap();
    write_csv(&csv.join("a.csv"), &left.slice(0, 3));
    write_csv(&csv.join("b.csv"), &left.slice(3, 3));
    let run = f.join_files(&csv, &f.right, &["--type", "anti"]);
    assert_eq!(run.rows(), 3);
    // --explain lists what it found.
    let run = f.join_files(&dir, &f.right, &["--explain"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("(parquet, 3 files, 5 row groups, 6 rows)"),
        "{}",
        run.stdout
    );

    // Files of one input must agree.
    write_parquet(&dir.join("part-3.parquet"), &Fixture::right_batch(), 2);
    f.join_files(&dir, &f.right, &[])
        .error(BAD_INPUT, &["part-3.parquet", "must have the same columns"]);
    let pattern = format!("{}/nothing-*.parquet", dir.display());
    f.join_files(Path::new(&pattern), &f.right, &[])
        .error(BAD_INPUT, &["no files match", "nothing-*.parquet"]);
    let empty = f.path("empty_dir");
    std::fs::create_dir(&empty).unwrap();
    f.join_files(&empty, &f.right, &[])
        .error(BAD_INPUT, &["empty_dir", "without data files"]);
    let mixed = f.path("mixed");
    std::fs::create_dir(&mixed).unwrap();
    write_csv(&mixed.join("a.csv"), &left);
    write_parquet(&mixed.join("b.parquet"), &left, 3);
    f.join_files(&mixed, &f.right, &[])
        .error(INVALID_JOIN, &["mixes formats", "--left-format"]);
    let run = f.join_files(&mixed, &f.right, &["--left-format", "csv"]);
    assert_eq!(run.rows(), 5);
}

#[test]
fn csv_options_and_schema_overrides() {
    let f = Fixture::new();
    // Tab-separated by extension, semicolons by flag, no header by flag.
    let tsv = f.path("left.tsv");
    std::fs::write(&tsv, "id\tname\n2\tb\n3\td\n7\tq\n").unwrap();
    assert_eq!(f.join_files(&tsv, &f.right, &[]).rows(), 3);
    let semi = f.path("left_semi.csv");
    std::fs::write(&semi, "id;name\n2;b\n3;d\n").unwrap();
    assert_eq!(
        f.join_files(&semi, &f.right, &["--csv-delimiter", ";"])
            .rows(),
        3
    );
    let bare = f.path("bare.csv");
    std::fs::write(&bare, "2,b\n3,d\n").unwrap();
    let run = f.join_files(
        &bare,
        &f.right,
        &[
            "--csv-no-header",
            "--on",
            "column_1=id",
            "--select",
            "column_2,rv",
        ],
    );
    assert_eq!(run.rows(), 3);

    // Codes with leading zeros: inferred as numbers unless the schema says text.
    let codes = f.path("codes.csv");
    std::fs::write(&codes, "code,v\n007,1\n42,2\n").unwrap();
    let names_csv = f.path("names.csv");
    std::fs::write(&names_csv, "code,who\n007,bond\n7,other\n").unwrap();
    let join = |extra: &[&str]| {
        let mut args = vec![
            "join",
            "--left",
            codes.to_str().unwrap(),
            "--right",
            names_csv.to_str().unwrap(),
            "--on",
            "code=code",
        ];
        args.extend_from_slice(extra);
        spilljoin(&args)
    };
    // As numbers, 007 = 7 and 007: two matches.
    assert_eq!(join(&[]).rows(), 2);
    let out = f.path("codes_out.csv");
    let run = join(&[
        "--left-schema",
        "code:utf8",
        "--right-schema",
        "code:string,who:utf8",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.rows(), 1);
    let table = Table::read_csv(&out);
    assert_eq!(table.rows, rows(&["007,1,007,bond"]));
    // A key whose types then differ says how to fix it.
    join(&["--left-schema", "code:utf8"]).error(
        INVALID_JOIN,
        &[
            "key types differ",
            "--left-schema code:TYPE",
            "--right-schema code:TYPE",
        ],
    );
    join(&["--left-schema", "cod:utf8"]).error(
        INVALID_JOIN,
        &[
            "--left-schema",
            "no column \"cod\"",
            "did you mean \"code\"",
        ],
    );
    join(&["--left-schema", "code:text16"]).error(INVALID_JOIN, &["unknown type \"text16\""]);
    f.join(&["--left-schema", "id:utf8"]).error(
        INVALID_JOIN,
        &["--left-schema", "CSV and NDJSON", "parquet"],
    );
    // Decimal overrides keep their commas.
    let prices = f.path("prices.csv");
    std::fs::write(&prices, "id,price\n2,1.50\n3,2.25\n").unwrap();
    let out = f.path("prices_out.csv");
    let run = f.join_files(
        &prices,
        &f.right,
        &[
            "--left-schema",
            "price:decimal(10,2),id:int64",
            "--filter",
            "price > 2",
            "--select",
            "price,rv",
            "--output",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(run.rows(), 1);
    assert_eq!(Table::read_csv(&out).rows, rows(&["2.25,300"]));
}

/// Files in `dir` whose names start with `.` (temporary outputs).
fn hidden_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn a_failed_join_leaves_the_output_untouched() {
    let f = Fixture::new();
    let out = f.path("atomic.parquet");
    std::fs::write(&out, "the previous output").unwrap();
    // Out of memory.
    f.join(&["--memory-limit", "1KiB", "--output", out.to_str().unwrap()])
        .error(OUT_OF_MEMORY, &["too small"]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "the previous output"
    );
    // An input that turns out corrupt in the middle.
    let bad = f.path("bad.csv");
    std::fs::write(
        &bad,
        "id,name\n".to_string() + &"2,b\n3,d\n".repeat(10) + "x,oops\n",
    )
    .unwrap();
    f.join_files(
        &bad,
        &f.right,
        &[
            "--infer-rows",
            "5",
            "--output",
            out.to_str().unwrap(),
            "--batch-size",
            "2",
        ],
    )
    .error(BAD_INPUT, &["bad.csv", "left input"]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "the previous output"
    );
    assert!(
        hidden_files(f.dir.path()).is_empty(),
        "{:?}",
        hidden_files(f.dir.path())
    );
    // A join that succeeds replaces it, and leaves no temporary file.
    assert_eq!(f.join(&["--output", out.to_str().unwrap()]).rows(), 5);
    assert_eq!(Table::read_parquet(&out).rows, rows(&INNER_ROWS));
    assert!(
        hidden_files(f.dir.path()).is_empty(),
        "{:?}",
        hidden_files(f.dir.path())
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "{mode:o}");
    }
}
