//! Which files an input names, and in which format: the first step of reading an
//! input, shared by `join` (its `--left` and `--right`) and `sql` (each `--table`).
//!
//! ```text
//!  SPEC ─► a file: itself
//!       ─► a directory: every data file under it (hidden and `_` names skipped)
//!       ─► a glob ('data/part-*.parquet'): the files it matches
//!             └─► sorted ─► the one format their extensions say (or the flag's)
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use spilljoin::Side;

use crate::failure::Kind;
use crate::format::{Format, EXTENSIONS};

/// Which input an error message is about: a side of `join`, or a table of `sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputName<'a> {
    /// `join --left` or `--right`.
    Side(Side),
    /// `sql --table NAME[:FORMAT]=PATH`.
    Table(&'a str),
}

impl InputName<'_> {
    /// The flag that gives this input `spec`, as the user typed it.
    fn flag(&self, spec: &str) -> String {
        match self {
            InputName::Side(side) => format!("--{side} {spec}"),
            InputName::Table(name) => format!("--table {name}={spec}"),
        }
    }

    /// How to name the format of this input when its extensions do not tell.
    fn format_hint(&self) -> String {
        match self {
            InputName::Side(side) => format!("or --{side}-format"),
            InputName::Table(name) => format!("or --table {name}:FORMAT=PATH"),
        }
    }
}

impl fmt::Display for InputName<'_> {
    /// `the left input`, `table orders`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputName::Side(side) => write!(f, "the {side} input"),
            InputName::Table(name) => write!(f, "table {name}"),
        }
    }
}

/// The files `spec` names and their format (`format` if given, else the one
/// their extensions say).
///
/// # Errors
/// Input failures (no such file, an empty directory, a glob that matches nothing)
/// and definition failures (a bad glob, no format or several formats told by the
/// extensions).
pub fn locate(
    name: InputName,
    spec: &str,
    format: Option<Format>,
) -> Result<(Vec<PathBuf>, Format)> {
    let files = resolve_paths(name, spec, format)?;
    let format = match format {
        Some(f) => f,
        None => detect_format(name, spec, &files)?,
    };
    Ok((files, format))
}

/// The files `spec` names: itself if it is a file; the data files under it if it
/// is a directory (hidden and `_`-prefixed names skipped, sorted); the files a glob
/// matches, sorted.
fn resolve_paths(name: InputName, spec: &str, format: Option<Format>) -> Result<Vec<PathBuf>> {
    let path = Path::new(spec);
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            let mut files = Vec::new();
            walk(path, &mut files)
                .with_context(|| Kind::Input.context(format!("cannot list {spec}")))?;
            let wanted = |p: &PathBuf| match format {
                Some(f) => Format::from_path(p).is_none_or(|g| g == f),
                None => Format::from_path(p).is_some(),
            };
            files.retain(wanted);
            files.sort();
            if files.is_empty() {
                return Err(Kind::Input.error(format!(
                    "{name} {spec} is a directory without data files ({EXTENSIONS})"
                )));
            }
            Ok(files)
        }
        Ok(_) => Ok(vec![path.to_path_buf()]),
        Err(_) if spec.contains(['*', '?', '[']) => {
            let paths = glob::glob(spec)
                .map_err(|e| Kind::Definition.error(format!("{}: {e}", name.flag(spec))))?;
            let mut files: Vec<PathBuf> = paths
                .filter_map(|p| p.ok())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Kind::Input.error(format!("no files match {name} {spec}")));
            }
            Ok(files)
        }
        Err(e) => Err(anyhow::Error::new(e)
            .context(Kind::Input.context(format!("cannot open {name} {spec}")))),
    }
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// The one format of `files`, from their extensions.
fn detect_format(name: InputName, spec: &str, files: &[PathBuf]) -> Result<Format> {
    let mut found: Vec<Format> = files.iter().filter_map(|p| Format::from_path(p)).collect();
    found.sort_by_key(|f| f.name());
    found.dedup();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Kind::Definition.error(format!(
            "cannot tell the format of {name} {spec} from its extension: use {EXTENSIONS}, {}",
            name.format_hint()
        ))),
        several => {
            let names: Vec<&str> = several.iter().map(|f| f.name()).collect();
            let hint = match name {
                InputName::Side(side) => format!("choose one with --{side}-format"),
                InputName::Table(_) => "register each format as a table of its own".into(),
            };
            Err(Kind::Definition.error(format!(
                "{name} {spec} mixes formats ({}): {hint}",
                names.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_input_as_the_user_gave_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("nothing-*.parquet");
        let spec = spec.to_str().unwrap();
        let e = locate(InputName::Table("t"), spec, None).unwrap_err();
        assert_eq!(e.to_string(), format!("no files match table t {spec}"));
        let e = locate(InputName::Side(Side::Left), spec, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("no files match the left input {spec}")
        );
        for f in ["a.csv", "b.parquet", "c.csv"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let spec = dir.path().to_str().unwrap();
        let e = locate(InputName::Table("t"), spec, None).unwrap_err();
        assert!(
            e.to_string().contains("mixes formats (csv, parquet)"),
            "{e}"
        );
        let (files, format) = locate(InputName::Table("t"), spec, Some(Format::Csv)).unwrap();
        assert_eq!((files.len(), format), (2, Format::Csv));
    }
}
