//! Who owns a spill directory, and removing the directories whose owner is gone.
//!
//! A manager removes its directory when it is dropped, even while a panic unwinds,
//! but a process killed outright (`SIGKILL`, the kernel's OOM killer) runs no
//! code: its `spilljoin-XXXXXX` directory stays, with every spill file in it. So
//! each directory carries proof of its owner that outlives a crash and that any
//! other process can check without racing the owner: a lock file, `owner.lock`
//! ([`OWNER_FILE_NAME`]), on which the owner holds an exclusive advisory lock
//! (`flock`) for as long as the directory exists. The kernel drops the lock when
//! the owner's process ends, however it ends; a lock that can be taken means the
//! owner is gone. The file also says, for people, which process made it and when
//! ([`OwnerRecord`]).
//!
//! # The protocol
//!
//! ```text
//!  owner (SpillManager::new)               cleaner (any later manager, `spilljoin clean`)
//!  ─────────────────────────               ──────────────────────────────────────────────
//!  mkdir spilljoin-XXXXXX (0700)           for each spilljoin-XXXXXX directory in the root:
//!  create owner.lock (empty, O_EXCL)         open owner.lock ─── none: not ours, keep
//!  lock() — blocks while a cleaner           try_lock() ──────── held: a live join, keep
//!           holds it                         the path still names the file locked?
//!  write "pid, started" into it                                  ─── no: gone or replaced, keep
//!  … the join runs, holding the lock …       read it ─────────── empty: an owner between
//!  drop: remove the files, owner.lock                            create and write, keep
//!        last, the directory; then close     not our record ──── not ours, keep
//!        the lock file (releases the lock)   our own process ─── keep (see below)
//!                                            else stale: remove the files, owner.lock
//!                                            last, the directory; then unlock
//! ```
//!
//! The races, and why each is harmless:
//!
//! - **A directory being created.** Between `mkdir` and the lock file there is no
//!   lock file, so the directory is not ours to judge. Between creating the lock
//!   file and locking it, a cleaner may take the lock; it then finds the file
//!   empty (the owner writes only once it holds the lock) and leaves it. The
//!   owner's blocking `lock()` waits the moment the cleaner holds it.
//! - **A directory being removed by its owner.** The owner deletes everything while
//!   still holding the lock, and closes the lock file last. A cleaner that opened
//!   `owner.lock` before it was deleted may take the lock once it is closed, but
//!   then the path no longer names the file it locked, and it leaves it. The same
//!   check keeps a cleaner off a directory that another cleaner removed and a new
//!   owner created again under the same name.
//! - **Two cleaners.** Only one holds a lock at a time; the other sees it held, or,
//!   once the first is done, finds the path gone.
//! - **Non-empty content means an owner that held the lock and let it go**: only
//!   the owner writes, and only while it holds the lock. A cleaner that holds the
//!   lock and reads a record reads a finished (or cut short) one, because the
//!   owner cannot be writing.
//! - **One process, several joins.** `flock` locks belong to the open file, so a
//!   second descriptor in the owner's own process cannot take the lock either.
//!   Where `flock` is emulated with `fcntl` locks (NFS on Linux), locks belong to
//!   the process instead and another join of the same process could take it: so a
//!   record naming this process's PID is never called stale.
//!
//! What this does not remove: directories that hold no lock file (made by another
//! program, by an older spilljoin, or by a join killed between `mkdir` and creating
//! its lock file), and those whose lock file is empty (a join killed in the
//! microseconds between creating and writing it, or a record lost with the page
//! cache in a power failure). Those are left for a person. A removal that fails
//! partway leaves the lock file, so the directory is still ours and still stale,
//! and the next cleaner tries again; a failure is reported, never an error of the
//! join that found it.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The name of the lock file inside each spill directory.
pub const OWNER_FILE_NAME: &str = "owner.lock";

/// What every spill directory's name starts with.
const DIR_PREFIX: &str = "spilljoin-";

/// Random letters and digits after [`DIR_PREFIX`] (`tempfile`'s default, pinned so
/// that the pattern a cleaner matches is the one the owner made).
const DIR_RANDOM_CHARS: usize = 6;

/// The first line of an owner record.
const RECORD_HEADER: &str = "spilljoin spill directory owner";

/// The most bytes of a lock file read: a record takes under 150.
const RECORD_BYTES_MAX: u64 = 4096;

/// Who created a spill directory, as its lock file says: for people, and to keep
/// a process from calling its own directories stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnerRecord {
    /// The owner's process ID (none if the record was cut short).
    pub pid: Option<u32>,
    /// When the directory was created, in seconds since the Unix epoch (none if
    /// the record was cut short).
    pub started_unix_seconds: Option<u64>,
}

impl OwnerRecord {
    /// This process, now.
    fn now() -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            pid: Some(std::process::id()),
            started_unix_seconds: Some(started),
        }
    }

    /// The record as written into the lock file.
    fn to_text(self) -> String {
        let mut text = format!("{RECORD_HEADER}\n");
        if let Some(pid) = self.pid {
            text.push_str(&format!("pid: {pid}\n"));
        }
        if let Some(started) = self.started_unix_seconds {
            text.push_str(&format!(
                "started: {}\nstarted_unix_seconds: {started}\n",
                utc_time(started)
            ));
        }
        text
    }

    /// The record in `text`, if `text` is one (or the start of one: a write cut
    /// short by a crash).
    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let header = lines.next()?;
        let cut_short = text == header && RECORD_HEADER.starts_with(header);
        if header != RECORD_HEADER && !cut_short {
            return None;
        }
        let mut record = Self {
            pid: None,
            started_unix_seconds: None,
        };
        for line in lines {
            if let Some(pid) = line.strip_prefix("pid: ") {
                record.pid = pid.trim().parse().ok();
            } else if let Some(s) = line.strip_prefix("started_unix_seconds: ") {
                record.started_unix_seconds = s.trim().parse().ok();
            }
        }
        Some(record)
    }
}

impl std::fmt::Display for OwnerRecord {
    /// `pid 4242, started 2025-06-01T12:34:56Z`, leaving out what is not known.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pid, self.started_unix_seconds) {
            (Some(pid), Some(s)) => write!(f, "pid {pid}, started {}", utc_time(s)),
            (Some(pid), None) => write!(f, "pid {pid}"),
            (None, Some(s)) => write!(f, "started {}", utc_time(s)),
            (None, None) => f.write_str("owner unknown"),
        }
    }
}

/// A spill directory whose owner is gone: removed, or found by
/// [`find_stale_dirs`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleDir {
    /// The directory.
    pub path: PathBuf,
    /// The bytes of the files in it (their lengths, the lock file's included).
    pub bytes: u64,
    /// Who made it, as its lock file says.
    pub owner: OwnerRecord,
}

/// A stale spill directory that could not be removed, or a root that could not be
/// searched.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StaleDirFailure {
    /// The directory.
    pub path: PathBuf,
    /// What the operating system said.
    pub error: Arc<io::Error>,
}

impl std::fmt::Display for StaleDirFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

/// What a search for stale spill directories removed, and what it could not.
///
/// Failures are reported here rather than as errors: a join is never stopped by
/// what another one left behind.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StaleDirCleanup {
    /// The stale directories removed, in name order.
    pub removed: Vec<StaleDir>,
    /// Stale directories that could not be removed (and, for a manager, a root
    /// that could not be searched).
    pub failures: Vec<StaleDirFailure>,
}

impl StaleDirCleanup {
    /// How many directories were removed.
    pub fn dirs_removed(&self) -> u64 {
        self.removed.len() as u64
    }

    /// The bytes of the directories removed.
    pub fn bytes_removed(&self) -> u64 {
        self.removed.iter().map(|d| d.bytes).sum()
    }
}

/// Lists the stale spill directories in `root`, removing nothing: those whose
/// owner is gone, as [`remove_stale_dirs`] tells them. Between the listing and
/// anything done with it, a directory's state may change only from stale to gone.
///
/// # Errors
///
/// `root` cannot be read.
pub fn find_stale_dirs(root: &Path) -> io::Result<Vec<StaleDir>> {
    let mut found = Vec::new();
    for path in spill_dirs_in(root)? {
        if let Some((lock, owner)) = examine(&path) {
            let bytes = bytes_under(&path);
            drop(lock);
            found.push(StaleDir { path, bytes, owner });
        }
    }
    Ok(found)
}

/// Removes the stale spill directories in `root`: every `spilljoin-XXXXXX`
/// directory (not a link) whose lock file ([`OWNER_FILE_NAME`]) is there, can be
/// locked (so its owner's process has ended: the owner holds the lock for the
/// directory's whole life), is still at its path once locked, and holds an
/// [`OwnerRecord`] of another process. Never a live join's directory, nor anything
/// that is not ours, nor one whose lock file is still empty (an owner between
/// creating and writing it). Each is removed with its lock held, the lock file
/// last, so a removal that fails partway can be tried again.
///
/// # Errors
///
/// `root` cannot be read. A directory that cannot be removed is a
/// [`StaleDirFailure`] in the result, not an error.
pub fn remove_stale_dirs(root: &Path) -> io::Result<StaleDirCleanup> {
    remove_stale_dirs_except(root, None)
}

/// [`remove_stale_dirs`], passing over `except` (the caller's own directory).
pub(crate) fn remove_stale_dirs_except(
    root: &Path,
    except: Option<&Path>,
) -> io::Result<StaleDirCleanup> {
    let mut cleanup = StaleDirCleanup::default();
    for path in spill_dirs_in(root)? {
        if Some(path.as_path()) == except {
            continue;
        }
        let Some((lock, owner)) = examine(&path) else {
            continue;
        };
        let bytes = bytes_under(&path);
        let removed = remove_owned_dir(&path);
        // Unlocked only now: until the lock file is deleted, the lock keeps every
        // other cleaner out.
        drop(lock);
        match removed {
            Ok(()) => cleanup.removed.push(StaleDir { path, bytes, owner }),
            Err(error) => cleanup.failures.push(StaleDirFailure {
                path,
                error: Arc::new(error),
            }),
        }
    }
    Ok(cleanup)
}

/// A manager's private directory, with its lock held: removed (lock file last,
/// lock released after) when dropped.
pub(crate) struct OwnedDir {
    /// Removes what [`OwnedDir`]'s own `Drop` left, if that failed partway.
    dir: tempfile::TempDir,
    /// Declared after `dir`, so dropped after it: the lock is let go last.
    _lock: File,
}

impl OwnedDir {
    /// Creates `spilljoin-XXXXXX` in `root`, owner-only on Unix, with its lock file
    /// written and held.
    pub(crate) fn create(root: &Path) -> io::Result<Self> {
        let mut builder = tempfile::Builder::new();
        builder.prefix(DIR_PREFIX).rand_bytes(DIR_RANDOM_CHARS);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(fs::Permissions::from_mode(0o700));
        }
        let dir = builder.tempdir_in(root)?;
        #[cfg(unix)]
        {
            // The mode given to mkdir is filtered by the umask; make sure.
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))?;
        }
        let lock = lock_as_owner(&dir.path().join(OWNER_FILE_NAME))?;
        Ok(Self { dir, _lock: lock })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        // Errors are left to the `TempDir`, which tries again and ignores them.
        let _ = remove_owned_dir(self.dir.path());
    }
}

/// Creates the lock file at `path`, locks it, then writes this process's record.
fn lock_as_owner(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    // Blocking: a cleaner that took the lock of the empty file lets it go at once.
    file.lock()?;
    file.write_all(OwnerRecord::now().to_text().as_bytes())?;
    Ok(file)
}

/// The `spilljoin-XXXXXX` directories directly in `root` (not through symbolic
/// links), in name order.
fn spill_dirs_in(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(is_spill_dir_name);
        if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Whether `name` is `spilljoin-` and six letters or digits.
fn is_spill_dir_name(name: &str) -> bool {
    name.strip_prefix(DIR_PREFIX).is_some_and(|rest| {
        rest.len() == DIR_RANDOM_CHARS && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The lock file of `dir`, locked, and its record, if `dir` is stale: its lock file
/// is there, unlocked, still at its path, and holds one of our records that does
/// not name this process. `None` keeps the directory, whatever the reason.
fn examine(dir: &Path) -> Option<(File, OwnerRecord)> {
    let path = dir.join(OWNER_FILE_NAME);
    // Writable: `flock` emulated over NFS wants a descriptor open for writing.
    let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
    match file.try_lock() {
        Ok(()) => {}
        // A live owner; or a lock we cannot take, so nothing we can prove.
        Err(TryLockError::WouldBlock | TryLockError::Error(_)) => return None,
    }
    if !names(&path, &file) {
        return None;
    }
    let mut text = String::new();
    (&file)
        .take(RECORD_BYTES_MAX)
        .read_to_string(&mut text)
        .ok()?;
    // Empty: an owner between creating the file and writing it.
    if text.is_empty() {
        return None;
    }
    let owner = OwnerRecord::parse(&text)?;
    if owner.pid == Some(std::process::id()) {
        return None;
    }
    Some((file, owner))
}

/// Whether `path` names `file` (the same inode), so that what was locked is what
/// is at the path.
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

/// Removes a directory whose lock the caller holds: the other entries first, the
/// lock file last, so that a removal failing partway leaves a directory that is
/// still ours (and, once unlocked, stale).
fn remove_owned_dir(dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    if tests::REFUSED.with(|refused| refused.borrow().as_deref() == Some(dir)) {
        // A removal the operating system refuses (which running as root, as the
        // tests may, cannot be arranged with permissions).
        return Err(io::Error::from(io::ErrorKind::PermissionDenied));
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == OWNER_FILE_NAME {
            continue;
        }
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    fs::remove_file(dir.join(OWNER_FILE_NAME))?;
    fs::remove_dir(dir)
}

/// The lengths of the files under `dir`, not following symbolic links; what
/// cannot be read counts nothing.
fn bytes_under(dir: &Path) -> u64 {
    let mut bytes = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => bytes = bytes.saturating_add(m.len()),
                Err(_) => {}
            }
        }
    }
    bytes
}

/// `2025-06-01T12:34:56Z` for seconds since the Unix epoch (proleptic Gregorian,
/// UTC: Howard Hinnant's `civil_from_days`).
fn utc_time(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let secs = unix_seconds % 86_400;
    // Days since 0000-03-01, in 400-year eras of 146 097 days.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SpillConfig, SpillManager};

    /// A process ID that is not this process's (and not a real one: above Linux's
    /// largest, 2^22).
    const OTHER_PID: u32 = 4_000_000_000;

    fn manager_in(root: &Path) -> SpillManager {
        SpillManager::new(SpillConfig::default().with_root_dir(root)).unwrap()
    }

    /// A directory as a killed join leaves it: an unlocked lock file with another
    /// process's record, and a spill file of `bytes` bytes. Returns its bytes.
    fn left_by_a_killed_join(dir: &Path, bytes: usize) -> u64 {
        fs::create_dir(dir).unwrap();
        let record = OwnerRecord {
            pid: Some(OTHER_PID),
            started_unix_seconds: Some(1_700_000_000),
        };
        fs::write(dir.join(OWNER_FILE_NAME), record.to_text()).unwrap();
        fs::write(dir.join("000000-build_p3.arrows"), vec![7u8; bytes]).unwrap();
        (record.to_text().len() + bytes) as u64
    }

    #[test]
    fn a_killed_joins_directory_is_removed_and_reported() {
        let root = tempfile::tempdir().unwrap();
        let stale = root.path().join("spilljoin-Ab12Cd");
        let bytes = left_by_a_killed_join(&stale, 10_000);
        let m = manager_in(root.path());
        assert!(!stale.exists());
        let report = m.stale_dirs_removed();
        assert_eq!((report.dirs_removed(), report.bytes_removed()), (1, bytes));
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let removed = &report.removed[0];
        assert_eq!(removed.path, stale);
        assert_eq!(removed.owner.pid, Some(OTHER_PID));
        assert_eq!(
            removed.owner.to_string(),
            format!("pid {OTHER_PID}, started 2023-11-14T22:13:20Z")
        );
        // The new manager's own directory is there, with its lock file.
        assert!(m.dir().join(OWNER_FILE_NAME).is_file());
    }

    thread_local! {
        /// A directory whose removal `remove_owned_dir` fails on this thread.
        pub(super) static REFUSED: std::cell::RefCell<Option<PathBuf>> =
            const { std::cell::RefCell::new(None) };
    }

    #[test]
    fn a_stale_directory_that_cannot_be_removed_is_reported_not_an_error() {
        let root = tempfile::tempdir().unwrap();
        let stale = root.path().join("spilljoin-Ef34Gh");
        let bytes = left_by_a_killed_join(&stale, 1_000);
        REFUSED.with(|refused| *refused.borrow_mut() = Some(stale.clone()));
        let m = manager_in(root.path());
        REFUSED.with(|refused| *refused.borrow_mut() = None);
        let report = m.stale_dirs_removed();
        assert_eq!(report.dirs_removed(), 0);
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert_eq!(report.failures[0].path, stale);
        assert_eq!(
            report.failures[0].error.kind(),
            io::ErrorKind::PermissionDenied
        );
        assert!(stale.join(OWNER_FILE_NAME).is_file(), "left as it was");
        // Its lock was let go: the next manager removes it.
        let next = manager_in(root.path());
        let report = next.stale_dirs_removed();
        assert_eq!((report.dirs_removed(), report.bytes_removed()), (1, bytes));
        assert!(!stale.exists());
    }

    #[test]
    fn a_live_managers_directory_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let live = manager_in(root.path());
        let record = fs::read_to_string(live.dir().join(OWNER_FILE_NAME)).unwrap();
        // Another process's record, so that only the lock keeps it.
        let other = record.replace(
            &format!("pid: {}", std::process::id()),
            &format!("pid: {OTHER_PID}"),
        );
        assert_ne!(record, other);
        fs::write(live.dir().join(OWNER_FILE_NAME), &other).unwrap();
        let second = manager_in(root.path());
        assert!(live.dir().is_dir());
        assert_eq!(second.stale_dirs_removed().dirs_removed(), 0);
        assert!(find_stale_dirs(root.path()).unwrap().is_empty());
        // Once the live one is gone, nothing of it is left to find.
        let dir = live.dir().to_owned();
        drop(live);
        assert!(!dir.exists());
        assert_eq!(remove_stale_dirs(root.path()).unwrap().dirs_removed(), 0);
    }

    #[test]
    fn what_is_not_ours_or_not_finished_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mut kept = Vec::new();
        // No lock file: another program's, or an older spilljoin's.
        kept.push(r.join("spilljoin-NoLock"));
        fs::create_dir(&kept[0]).unwrap();
        fs::write(kept[0].join("000000-x.arrows"), b"data").unwrap();
        // An empty lock file: an owner between creating it and writing its record.
        kept.push(r.join("spilljoin-Empty1"));
        fs::create_dir(&kept[1]).unwrap();
        fs::write(kept[1].join(OWNER_FILE_NAME), b"").unwrap();
        // A lock file that is not one of ours.
        kept.push(r.join("spilljoin-Other1"));
        fs::create_dir(&kept[2]).unwrap();
        fs::write(kept[2].join(OWNER_FILE_NAME), b"held by someone else\n").unwrap();
        // Names of another pattern, a file, and a link to a stale directory.
        for name in ["spilljoin-toolong1", "spilljoin-ab_12c", "other-Ab12Cd"] {
            kept.push(r.join(name));
            left_by_a_killed_join(kept.last().unwrap(), 10);
        }
        kept.push(r.join("spilljoin-File12"));
        fs::write(kept.last().unwrap(), b"a file").unwrap();
        #[cfg(unix)]
        {
            let target = r.join("elsewhere");
            left_by_a_killed_join(&target, 10);
            kept.push(r.join("spilljoin-Link12"));
            std::os::unix::fs::symlink(&target, kept.last().unwrap()).unwrap();
            kept.push(target);
        }
        // This process's own record, unlocked (NFS's per-process locks).
        kept.push(r.join("spilljoin-Mine12"));
        fs::create_dir(kept.last().unwrap()).unwrap();
        fs::write(
            kept.last().unwrap().join(OWNER_FILE_NAME),
            OwnerRecord::now().to_text(),
        )
        .unwrap();

        let m = manager_in(r);
        assert_eq!(m.stale_dirs_removed().dirs_removed(), 0);
        assert!(m.stale_dirs_removed().failures.is_empty());
        for path in &kept {
            assert!(path.exists(), "{} was removed", path.display());
        }
        assert!(find_stale_dirs(r).unwrap().is_empty());
    }

    #[test]
    fn a_lock_held_through_another_descriptor_keeps_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spilljoin-Held12");
        left_by_a_killed_join(&dir, 100);
        let held = File::open(dir.join(OWNER_FILE_NAME)).unwrap();
        held.lock().unwrap();
        assert_eq!(remove_stale_dirs(root.path()).unwrap().dirs_removed(), 0);
        assert!(dir.exists());
        held.unlock().unwrap();
        let report = remove_stale_dirs(root.path()).unwrap();
        assert_eq!(report.dirs_removed(), 1);
        assert!(!dir.exists());
    }

    #[test]
    fn finding_lists_without_removing() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (
            root.path().join("spilljoin-aaaaaa"),
            root.path().join("spilljoin-bbbbbb"),
        );
        let bytes = [left_by_a_killed_join(&b, 5), left_by_a_killed_join(&a, 50)];
        let found = find_stale_dirs(root.path()).unwrap();
        let listed: Vec<(&Path, u64)> = found.iter().map(|d| (d.path.as_path(), d.bytes)).collect();
        assert_eq!(
            listed,
            vec![(a.as_path(), bytes[1]), (b.as_path(), bytes[0])]
        );
        assert!(a.exists() && b.exists());
        let report = remove_stale_dirs(root.path()).unwrap();
        assert_eq!(report.bytes_removed(), bytes[0] + bytes[1]);
        assert!(!a.exists() && !b.exists());
    }

    #[test]
    fn a_missing_root_is_an_error_for_a_search() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("nope");
        assert!(find_stale_dirs(&missing).is_err());
        assert!(remove_stale_dirs(&missing).is_err());
    }

    #[test]
    fn a_replaced_lock_file_is_not_the_one_locked() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join(OWNER_FILE_NAME);
        fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        assert!(names(&path, &file));
        fs::remove_file(&path).unwrap();
        assert!(!names(&path, &file));
        fs::write(&path, b"x").unwrap();
        assert!(!names(&path, &file), "a new file at the same path");
    }

    #[test]
    fn records_read_back_even_cut_short() {
        let record = OwnerRecord::now();
        assert_eq!(OwnerRecord::parse(&record.to_text()), Some(record));
        let text = record.to_text();
        let cut = OwnerRecord::parse(&text[..RECORD_HEADER.len() - 3]).unwrap();
        assert_eq!((cut.pid, cut.started_unix_seconds), (None, None));
        assert_eq!(cut.to_string(), "owner unknown");
        assert_eq!(OwnerRecord::parse("spill\nsomething else"), None);
        assert_eq!(OwnerRecord::parse("#!/bin/sh\n"), None);
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_748_781_296), "2025-06-01T12:34:56Z");
        assert_eq!(utc_time(4_107_542_399), "2100-02-28T23:59:59Z");
    }
}
