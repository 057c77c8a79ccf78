//! The shape of the source, checked so that it stays as docs/ARCHITECTURE.md says:
//! the engine's modules import each other one way (no cycle), no file holds more
//! than [`MAX_FILE_LINES`] lines of code before its tests, and no function is longer
//! than [`MAX_FN_LINES`]. A file or a function past the limit is a sign that it holds
//! two concepts; split it rather than raise the limit.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Lines of non-test code a source file may hold.
const MAX_FILE_LINES: usize = 800;

/// Lines a function of non-test code may span, its signature and braces included.
const MAX_FN_LINES: usize = 70;

/// The workspace's library and binary sources (not tests, benches or examples).
const SOURCE_DIRS: [&str; 5] = [
    "src",
    "memory/src",
    "spill/src",
    "cli/src",
    "datafusion/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files of `dirs` (relative to the workspace root) that are not test suites,
/// each with its text up to its inline test module.
fn sources(dirs: &[&str]) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter(|p| p.file_name().is_none_or(|n| n != "tests.rs"))
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap_or_default();
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            (path, code)
        })
        .collect()
}

/// The top-level module of the library that `path` belongs to (`build` for
/// `src/build/spill.rs`, `plan` for `src/plan.rs`).
fn top_module(path: &Path) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rel = path.strip_prefix(root).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// The `crate::x` modules a piece of code names outside comments.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for (at, _) in line.match_indices("crate::") {
            let name: String = line[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// A cycle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_engines_modules_import_each_other_one_way() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, code) in sources(&["src"]) {
        let Some(module) = top_module(&path) else {
            continue;
        };
        if module == "lib" {
            continue;
        }
        let uses: BTreeSet<String> = imports(&code)
            .into_iter()
            .filter(|m| *m != module)
            .collect();
        graph.entry(module).or_default().extend(uses);
    }
    assert!(graph.len() > 10, "no modules found: {graph:?}");
    assert!(
        graph.get("exec").is_some_and(|uses| uses.contains("build")),
        "the import scan finds nothing: {graph:?}"
    );
    assert_eq!(
        find_cycle(&graph),
        None,
        "modules import each other in a loop"
    );
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn no_source_file_holds_more_than_its_share_of_code() {
    let files = sources(&SOURCE_DIRS);
    assert!(files.len() > 50, "only {} files found", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|(path, code)| (path, code.lines().count()))
        .filter(|&(_, lines)| lines > MAX_FILE_LINES)
        .map(|(path, lines)| format!("{}: {lines} lines", path.display()))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:#?}"
    );
}

/// Functions of `code` longer than [`MAX_FN_LINES`], by name: from a line that
/// starts a `fn` to the first line after it that closes a brace at the same indent.
fn long_functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut long = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let signature = ["pub(crate) ", "pub(super) ", "pub ", "const ", "unsafe "]
            .iter()
            .fold(body, |rest, prefix| {
                rest.strip_prefix(prefix).unwrap_or(rest)
            });
        let Some(name) = signature.strip_prefix("fn ") else {
            continue;
        };
        let close = format!("{indent}}}");
        let Some(end) = lines[start..].iter().position(|l| *l == close) else {
            continue;
        };
        if end + 1 > MAX_FN_LINES {
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            long.push((name, end + 1));
        }
    }
    long
}

#[test]
fn no_function_is_longer_than_a_screen() {
    let long: Vec<String> = sources(&SOURCE_DIRS)
        .iter()
        .flat_map(|(path, code)| {
            long_functions(code)
                .into_iter()
                .map(move |(name, lines)| format!("{}: {name}, {lines} lines", path.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

#[test]
fn a_long_function_is_found() {
    let body = "    x += 1;\n".repeat(MAX_FN_LINES);
    let code = format!("fn short() {{\n}}\n\npub(crate) fn long(x: &mut u32) {{\n{body}}}\n");
    assert_eq!(
        long_functions(&code),
        vec![("long".to_string(), MAX_FN_LINES + 2)]
    );
}
