//! What joins killed outright leave behind, and telling it from what live joins
//! hold: the lock on a temporary output, finding and removing the temporary
//! outputs nobody holds, and reporting what a join removed at its start (the
//! spill directories' side of it is the spill crate's: `spilljoin::spill`'s
//! `remove_stale_dirs`).
//!
//! An output is written to `.NAME.spilljoin-XXXXXX.tmp` beside NAME and renamed
//! when complete ([`super::output`]). A join killed outright leaves that file; so
//! the file carries the proof of its owner itself: the join holds an exclusive
//! advisory lock (`flock`) on it from just after creating it until it is renamed or
//! deleted, and the kernel drops the lock when the process ends. The `spilljoin-`
//! in the name says it is ours: only files of that pattern are ever considered, so
//! another program's temporary files are never touched, locked or not.
//!
//! ```text
//!  owner (a join's output)                   cleaner (a later join, `spilljoin clean`)
//!  ───────────────────────                   ─────────────────────────────────────────
//!  create .NAME.spilljoin-XXXXXX.tmp         for each file of our pattern:
//!    (O_EXCL, empty)                           open it (not through a link)
//!  lock() — blocks while a cleaner holds it    try_lock() ────── held: a live join, keep
//!  the name still names the file?              the name still names the file locked?
//!    no: a cleaner removed it; forget it,                        ─── no: renamed or gone, keep
//!        try a new name                        remove it, then unlock
//!  … write, holding the lock …
//!  rename to NAME (or delete), then close
//! ```
//!
//! Unlike a spill directory's lock file, the file has no content of ours to wait
//! for: an empty file is the usual orphan, since the output's first 256 KiB stay
//! in a buffer, and a join killed while it builds has written nothing. So an empty,
//! unlocked file is removed, and the owner, not the cleaner, handles the moment
//! between creating its file and locking it: once it holds the lock it checks that
//! its name still names its file, and if a cleaner removed it in between, it leaves
//! that name alone (it may be anyone's now) and creates another.
//!
//! A cleaner removes a file only while it holds the file's lock and the name
//! still names it, so never a file whose owner holds its lock, and never a name
//! that was renamed to the finished output (the finished output has another name).
//! What is left is a race of two cleaners and a third join that draws the same
//! random name within microseconds: one chance in 56 billion per collision window.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use spilljoin::spill::StaleDirCleanup;
use tempfile::TempPath;

use super::progress::human_bytes;

/// Between an output's name and the random part of its temporary file's name: what
/// makes the file ours.
const MARK: &str = ".spilljoin-";

/// The temporary file's name ends with this.
const SUFFIX: &str = ".tmp";

/// Random letters and digits in a temporary file's name.
const RANDOM_CHARS: usize = 6;

/// Temporary files created, each removed by a cleaner before it could be locked,
/// before giving up. One in a row is already a rare race.
const CREATE_ATTEMPTS: usize = 8;

/// A temporary output nobody holds: removed, or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The file.
    pub path: PathBuf,
    /// Its length.
    pub bytes: u64,
}

/// What a search for orphaned temporary outputs removed, and what it could not.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Removed, in name order.
    pub removed: Vec<Orphan>,
    /// Files that could not be removed, or a directory that could not be read.
    pub failures: Vec<(PathBuf, io::Error)>,
}

/// Creates `.NAME.spilljoin-XXXXXX.tmp` in `dir` for the output `name`, locked for
/// as long as the file is open. Dropping the [`TempPath`] deletes it.
///
/// # Errors
/// The file cannot be created or locked.
pub fn create_temporary(dir: &Path, name: &str) -> io::Result<(File, TempPath)> {
    let prefix = format!(".{name}{MARK}");
    for _ in 0..CREATE_ATTEMPTS {
        let (file, temp) = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(SUFFIX)
            .rand_bytes(RANDOM_CHARS)
            .tempfile_in(dir)?
            .into_parts();
        // Blocking: a cleaner that holds it removes it or lets it go at once.
        file.lock()?;
        if names(&temp, &file) {
            return Ok((file, temp));
        }
        // A cleaner removed it before it was locked: the name may be anyone's now.
        let _ = temp.keep();
    }
    Err(io::Error::other(format!(
        "{CREATE_ATTEMPTS} temporary files in a row were removed before they could be locked"
    )))
}

/// The temporary outputs in `dir` that nobody holds, for the output `name` (or for
/// any output), removing nothing.
///
/// # Errors
/// `dir` cannot be read.
pub fn find_orphans(dir: &Path, name: Option<&str>) -> io::Result<Vec<Orphan>> {
    let mut found = Vec::new();
    for path in candidates(dir, name)? {
        if let Some((lock, bytes)) = examine(&path) {
            drop(lock);
            found.push(Orphan { path, bytes });
        }
    }
    Ok(found)
}

/// Removes the temporary outputs in `dir` that nobody holds, for the output `name`
/// (or for any output).
///
/// # Errors
/// `dir` cannot be read. A file that cannot be removed is a failure in the result.
pub fn remove_orphans(dir: &Path, name: Option<&str>) -> io::Result<Cleanup> {
    let mut cleanup = Cleanup::default();
    for path in candidates(dir, name)? {
        let Some((lock, bytes)) = examine(&path) else {
            continue;
        };
        let removed = fs::remove_file(&path);
        drop(lock);
        match removed {
            Ok(()) => cleanup.removed.push(Orphan { path, bytes }),
            // Someone else removed it first.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => cleanup.failures.push((path, e)),
        }
    }
    Ok(cleanup)
}

/// The regular files in `dir` named as temporary outputs of `name` (or of any
/// output), in name order.
fn candidates(dir: &Path, name: Option<&str>) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(output) = file_name.to_str().and_then(output_name_of) else {
            continue;
        };
        if name.is_none_or(|n| n == output) && entry.file_type().is_ok_and(|t| t.is_file()) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// The output name in a temporary output's file name, `.NAME.spilljoin-XXXXXX.tmp`.
fn output_name_of(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix('.')?.strip_suffix(SUFFIX)?;
    let (name, random) = rest.rsplit_once(MARK)?;
    let random_ok =
        random.len() == RANDOM_CHARS && random.bytes().all(|b| b.is_ascii_alphanumeric());
    (random_ok && !name.is_empty()).then_some(name)
}

/// The file at `path`, locked, and its length, if nobody holds it and the path
/// still names it. `None` keeps it, whatever the reason.
fn examine(path: &Path) -> Option<(File, u64)> {
    let mut options = OpenOptions::new();
    // Writable: `flock` emulated over NFS wants a descriptor open for writing.
    options.read(true).write(true);
    #[cfg(unix)]
    {
        // Never through a link, and never waiting on a FIFO put in its place.
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path).ok()?;
    file.try_lock().ok()?;
    let metadata = file.metadata().ok()?;
    (metadata.is_file() && names(path, &file)).then_some((file, metadata.len()))
}

/// Whether `path` names `file` (the same inode).
fn names(path: &Path, file: &File) -> bool {
    match (fs::symlink_metadata(path), file.metadata()) {
        (Ok(at_path), Ok(open)) => same_file(&at_path, &open),
        _ => false,
    }
}

#[cfg(unix)]
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Without inode numbers, the lengths and modification times must agree (a weaker
/// check; spilljoin is developed and tested on Linux).
#[cfg(not(unix))]
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    a.len() == b.len() && a.modified().ok() == b.modified().ok()
}

/// What a join removed when it started, for `--metrics` and its line on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StaleRemoved {
    /// Stale spill directories removed from `--spill-dir`.
    pub spill_dirs: u64,
    /// Their bytes.
    pub spill_dir_bytes: u64,
    /// Orphaned temporary outputs removed beside `--output`.
    pub temporary_outputs: u64,
    /// Their bytes.
    pub temporary_output_bytes: u64,
    /// What could not be removed (each also a warning).
    pub failures: u64,
}

impl StaleRemoved {
    /// The figures of `spill` and `outputs`.
    pub fn of(spill: &StaleDirCleanup, outputs: &Cleanup) -> Self {
        Self {
            spill_dirs: spill.dirs_removed(),
            spill_dir_bytes: spill.bytes_removed(),
            temporary_outputs: outputs.removed.len() as u64,
            temporary_output_bytes: outputs.removed.iter().map(|o| o.bytes).sum(),
            failures: (spill.failures.len() + outputs.failures.len()) as u64,
        }
    }

    /// The line on stderr, if anything was removed: `removed what killed joins left
    /// behind: 1 spill directory (1.5 GiB), 1 temporary output (0 bytes)`.
    pub fn line(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.spill_dirs > 0 {
            let what = match self.spill_dirs {
                1 => "spill directory",
                _ => "spill directories",
            };
            let bytes = human_bytes(self.spill_dir_bytes);
            parts.push(format!("{} {what} ({bytes})", self.spill_dirs));
        }
        if self.temporary_outputs > 0 {
            let what = match self.temporary_outputs {
                1 => "temporary output",
                _ => "temporary outputs",
            };
            let bytes = human_bytes(self.temporary_output_bytes);
            parts.push(format!("{} {what} ({bytes})", self.temporary_outputs));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "removed what killed joins left behind: {}",
                parts.join(", ")
            )
        })
    }
}

/// Prints a warning for each stale item that could not be removed, and for a
/// spill root (`root`) that could not be searched.
pub fn warn_failures(spill: &StaleDirCleanup, root: Option<&Path>, outputs: &Cleanup) {
    let spill: Vec<(&Path, String)> = spill
        .failures
        .iter()
        .map(|f| (f.path.as_path(), f.error.to_string()))
        .collect();
    eprint!("{}", failure_warnings(&spill, root, outputs));
}

/// The warnings of [`warn_failures`], a line each: for each spill directory (or the
/// root searched) that failed, its path and the error.
fn failure_warnings(spill: &[(&Path, String)], root: Option<&Path>, outputs: &Cleanup) -> String {
    let mut lines = String::new();
    for (path, error) in spill {
        let line = if Some(*path) == root {
            format!(
                "cannot look for stale spill directories in {}",
                path.display()
            )
        } else {
            format!("cannot remove stale spill directory {}", path.display())
        };
        lines += &format!("spilljoin: warning: {line}: {error}\n");
    }
    for (path, error) in &outputs.failures {
        lines += &format!(
            "spilljoin: warning: cannot remove orphaned temporary output {}: {error}\n",
            path.display()
        );
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_that_fail_are_warnings_a_line_each() {
        let spill = [
            (Path::new("/spill"), "denied".to_string()),
            (Path::new("/spill/spilljoin-Ab12Cd"), "denied".to_string()),
        ];
        let outputs = Cleanup {
            removed: Vec::new(),
            failures: vec![(
                PathBuf::from("/out/.a.csv.spilljoin-Xy12Zw.tmp"),
                io::Error::from(io::ErrorKind::PermissionDenied),
            )],
        };
        let text = failure_warnings(&spill, Some(Path::new("/spill")), &outputs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with(
            "spilljoin: warning: cannot look for stale spill directories in /spill: denied"
        ));
        assert!(lines[1].starts_with(
            "spilljoin: warning: cannot remove stale spill directory /spill/spilljoin-Ab12Cd: denied"
        ));
        assert!(lines[2].starts_with(
            "spilljoin: warning: cannot remove orphaned temporary output /out/.a.csv.spilljoin-Xy12Zw.tmp: "
        ));
        assert!(failure_warnings(&[], None, &Cleanup::default()).is_empty());
    }

    #[test]
    fn only_our_pattern_is_an_output_name() {
        assert_eq!(
            output_name_of(".out.parquet.spilljoin-Ab12Cd.tmp"),
            Some("out.parquet")
        );
        assert_eq!(
            output_name_of(".a.spilljoin-x.spilljoin-Ab12Cd.tmp"),
            Some("a.spilljoin-x")
        );
        for other in [
            ".out.parquet.Ab12Cd.tmp",
            ".out.parquet.spilljoin-Ab12C.tmp",
            ".out.parquet.spilljoin-Ab_2Cd.tmp",
            "out.parquet.spilljoin-Ab12Cd.tmp",
            ".out.parquet.spilljoin-Ab12Cd",
            "..spilljoin-Ab12Cd.tmp",
        ] {
            assert_eq!(output_name_of(other), None, "{other}");
        }
    }

    #[test]
    fn a_held_temporary_output_is_kept_and_an_orphan_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (file, held) = create_temporary(dir.path(), "out.csv").unwrap();
        std::io::Write::write_all(&mut &file, b"a,b\n").unwrap();
        // Orphans: one empty (killed before its first write), one written.
        let empty = dir.path().join(".out.csv.spilljoin-Empty1.tmp");
        fs::write(&empty, b"").unwrap();
        let written = dir.path().join(".out.csv.spilljoin-Full12.tmp");
        fs::write(&written, b"x".repeat(100)).unwrap();
        // Another output's, and another program's.
        let other = dir.path().join(".other.csv.spilljoin-Other1.tmp");
        fs::write(&other, b"").unwrap();
        let foreign = dir.path().join(".out.csv.Ab12Cd.tmp");
        fs::write(&foreign, b"").unwrap();

        let found = find_orphans(dir.path(), Some("out.csv")).unwrap();
        let expected = vec![
            Orphan {
                path: empty.clone(),
                bytes: 0,
            },
            Orphan {
                path: written.clone(),
                bytes: 100,
            },
        ];
        assert_eq!(found, expected);
        let cleanup = remove_orphans(dir.path(), Some("out.csv")).unwrap();
        assert_eq!(cleanup.removed, expected);
        assert!(cleanup.failures.is_empty());
        assert!(!empty.exists() && !written.exists());
        assert!(held.exists() && other.exists() && foreign.exists());
        // Any output's: the other one too, never the held one or the foreign one.
        let cleanup = remove_orphans(dir.path(), None).unwrap();
        assert_eq!(cleanup.removed.len(), 1);
        assert!(!other.exists() && held.exists() && foreign.exists());
        // Once its owner is done, nothing is left of it.
        drop(file);
        drop(held);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_owner_sees_a_removal_between_creating_and_locking() {
        let dir = tempfile::tempdir().unwrap();
        let (file, temp) = create_temporary(dir.path(), "o.csv").unwrap();
        // What the owner checks once it holds the lock, after a cleaner's removal.
        assert!(names(&temp, &file));
        fs::remove_file(&temp).unwrap();
        assert!(!names(&temp, &file));
    }

    #[test]
    fn the_line_counts_what_was_removed() {
        assert_eq!(StaleRemoved::default().line(), None);
        let removed = StaleRemoved {
            spill_dirs: 2,
            spill_dir_bytes: 3 << 20,
            temporary_outputs: 1,
            temporary_output_bytes: 0,
            failures: 0,
        };
        assert_eq!(
            removed.line().unwrap(),
            "removed what killed joins left behind: 2 spill directories (3.0 MiB), 1 temporary output (0 bytes)"
        );
    }
}
