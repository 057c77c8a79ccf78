//! `spilljoin clean`: removes, or with `--dry-run` lists, what joins killed outright
//! left behind: stale spill directories in `--spill-dir` and orphaned temporary
//! outputs in `--output-dir`, each with its bytes, then the total.
//!
//! Every join already does this when it starts, in its own spill directory's root
//! and beside its own output; `clean` is for directories no join will use soon.
//! What is stale is decided as a join decides it (the spill crate's
//! `remove_stale_dirs`, and [`super::stale`]): an item whose owner still holds its
//! lock, or that spilljoin did not make, is never touched.
//!
//! ```text
//! removed spill directory /tmp/spilljoin-Ab12Cd: 1610612736 bytes (1.5 GiB; pid 4242, started 2025-06-01T12:34:56Z)
//! removed temporary output out/.joined.parquet.spilljoin-Xy12Zz.tmp: 0 bytes (0 bytes)
//! removed 2 stale items: 1610612736 bytes (1.5 GiB)
//! ```
//!
//! An item that cannot be removed is a warning, and the run then fails with the
//! exit code of its kind (6 for spill directories, 5 for outputs) once everything
//! else is done. A directory that cannot be read fails at once, the same way.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use spilljoin::spill::{find_stale_dirs, remove_stale_dirs, StaleDir, StaleDirCleanup};

use super::args::CleanArgs;
use super::failure::Kind;
use super::progress::human_bytes;
use super::stale::{self, Cleanup, Orphan};

/// One item found stale.
struct Item {
    /// `spill directory` or `temporary output`.
    what: &'static str,
    path: PathBuf,
    bytes: u64,
    /// Who left it, if known.
    owner: Option<String>,
}

impl Item {
    fn dir(d: StaleDir) -> Self {
        Self {
            what: "spill directory",
            owner: Some(d.owner.to_string()),
            path: d.path,
            bytes: d.bytes,
        }
    }

    fn output(o: Orphan) -> Self {
        Self {
            what: "temporary output",
            path: o.path,
            bytes: o.bytes,
            owner: None,
        }
    }
}

/// What was found, and what could not be removed (with its kind).
#[derive(Default)]
struct Found {
    items: Vec<Item>,
    failures: Vec<(Kind, String)>,
}

/// Runs `spilljoin clean`.
///
/// # Errors
/// A spill failure if `--spill-dir` cannot be read, an output failure if
/// `--output-dir` cannot; after printing everything, the kind of the first item
/// that could not be removed.
pub fn run(args: &CleanArgs) -> Result<()> {
    let root = args.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut found = Found::default();
    spill_dirs(&root, args.dry_run, &mut found)?;
    if let Some(dir) = &args.output_dir {
        outputs(dir, args.dry_run, &mut found)?;
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for item in &found.items {
        let owner = item
            .owner
            .as_ref()
            .map_or(String::new(), |o| format!("; {o}"));
        println!(
            "{verb} {} {}: {} bytes ({}{owner})",
            item.what,
            item.path.display(),
            item.bytes,
            human_bytes(item.bytes)
        );
    }
    let total: u64 = found.items.iter().map(|i| i.bytes).sum();
    let count = found.items.len();
    let items = if count == 1 { "item" } else { "items" };
    println!(
        "{verb} {count} stale {items}: {total} bytes ({})",
        human_bytes(total)
    );
    for (_, warning) in &found.failures {
        eprintln!("spilljoin: warning: {warning}");
    }
    match found.failures.first() {
        None => Ok(()),
        Some((kind, _)) => Err(kind.error(format!(
            "{} stale {} could not be removed (see the warnings above)",
            found.failures.len(),
            if found.failures.len() == 1 {
                "item"
            } else {
                "items"
            }
        ))),
    }
}

/// The stale spill directories in `root`, removed unless `dry_run`.
fn spill_dirs(root: &Path, dry_run: bool, found: &mut Found) -> Result<()> {
    let unreadable = || {
        Kind::Spill.context(format!(
            "cannot look for stale spill directories in {}",
            root.display()
        ))
    };
    if dry_run {
        let dirs = find_stale_dirs(root).with_context(unreadable)?;
        found.items.extend(dirs.into_iter().map(Item::dir));
        return Ok(());
    }
    let StaleDirCleanup {
        removed, failures, ..
    } = remove_stale_dirs(root).with_context(unreadable)?;
    found.items.extend(removed.into_iter().map(Item::dir));
    found.failures.extend(failures.into_iter().map(|f| {
        (
            Kind::Spill,
            format!("cannot remove stale spill directory {f}"),
        )
    }));
    Ok(())
}

/// The orphaned temporary outputs in `dir`, removed unless `dry_run`.
fn outputs(dir: &Path, dry_run: bool, found: &mut Found) -> Result<()> {
    let unreadable = || {
        Kind::Output.context(format!(
            "cannot look for temporary outputs in {}",
            dir.display()
        ))
    };
    if dry_run {
        let files = stale::find_orphans(dir, None).with_context(unreadable)?;
        found.items.extend(files.into_iter().map(Item::output));
        return Ok(());
    }
    let Cleanup { removed, failures } =
        stale::remove_orphans(dir, None).with_context(unreadable)?;
    found.items.extend(removed.into_iter().map(Item::output));
    found.failures.extend(failures.into_iter().map(|(path, e)| {
        (
            Kind::Output,
            format!(
                "cannot remove orphaned temporary output {}: {e}",
                path.display()
            ),
        )
    }));
    Ok(())
}
