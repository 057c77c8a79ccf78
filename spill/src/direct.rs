//! Direct I/O ([`crate::SpillConfig::direct_io`]): spill files written and read
//! with `O_DIRECT`, past the page cache.
//!
//! ```text
//!  message ─► an aligned 1 MiB buffer (the file's last partial block first,
//!             then the message) ─► pwrite of its whole blocks at the block where
//!             the file's logical end was, on a thread of its own while the writer
//!             goes on (a few writes a thread); the new partial block
//!             is kept for the next message, or written padded where the file must
//!             be readable (a spill file finished)
//!  reader  ─► runs of whole blocks (up to 1 MiB, not past the extent they hold),
//!             each read on a thread of its own while the one before is copied
//!             out as asked
//! ```
//!
//! Why: a buffered write copies every byte into page-cache pages the kernel has
//! just allocated. On virtual machines whose host takes back the guest's free
//! memory (virtio free page reporting), that first touch of each page is a fault
//! in the host (so it seems: the copy is where the time goes), and buffered
//! writes ran at a sixth of the disk's direct speed (BENCHMARKS.md, "Direct I/O"). `O_DIRECT` moves the bytes between the
//! disk and our own buffers, which are reused and stay mapped.
//!
//! `O_DIRECT` wants the memory, the file offset and the length of every transfer
//! aligned to the device's logical block: here [`BLOCK`] bytes, which covers
//! every common device. Messages are not aligned, so a writer keeps the file's
//! last partial block in memory and writes it again, completed, with the next
//! message; the file's length is cut back to its logical end when the writer
//! finishes (a shared file needs no cut: its readers read only their extents).
//! Where the file system refuses `O_DIRECT` (tmpfs on older kernels, some
//! network file systems), or on systems other than Linux, files are written and
//! read through the page cache as usual.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use arrow_buffer::Buffer;

use crate::file::Extent;

/// The alignment of every direct transfer: memory address, file offset and length.
pub(crate) const BLOCK: usize = 4096;

/// Bytes moved by one direct transfer at most: a writer's buffer, a reader's run.
pub(crate) const TRANSFER_BYTES: usize = 1 << 20;

/// Runs a reader reads ahead of the one it hands out from by default
/// ([`crate::SpillConfig::direct_read_ahead`]): a reader that reads a run only when
/// it needs it waits for the device at every run, its CPU idle (BENCHMARKS.md, the
/// choices table).
pub const DEFAULT_DIRECT_READ_AHEAD: usize = 3;

/// The most runs a reader reads ahead.
pub const MAX_DIRECT_READ_AHEAD: usize = 8;

/// The direct I/O buffers one thread uses at once, at most, with the default read
/// ahead and writes behind ([`direct_io_bytes_per_thread`]).
pub const DIRECT_IO_BYTES_PER_THREAD: usize =
    direct_io_bytes_per_thread(DEFAULT_DIRECT_READ_AHEAD, DEFAULT_DIRECT_WRITES_BEHIND);

/// The direct I/O buffers one thread uses at once, at most, where readers read
/// `read_ahead` runs ahead and writers keep `writes_behind` writes in flight: an
/// open reader's run and the runs it reads ahead, a writer's buffer and its writes
/// behind. They are outside the memory pool (a fixed few MiB, not growing
/// with the input); a caller that bounds its process's memory counts this much a
/// thread in its limit (the command line does).
pub const fn direct_io_bytes_per_thread(read_ahead: usize, writes_behind: usize) -> usize {
    (runs_ahead(read_ahead) + 2 + writes_behind_at_most(writes_behind)) * TRANSFER_BYTES
}

/// The runs a reader asked to read `read_ahead` runs ahead does read ahead: at least
/// one, at most [`MAX_DIRECT_READ_AHEAD`].
const fn runs_ahead(read_ahead: usize) -> usize {
    match read_ahead {
        0 => 1,
        n if n > MAX_DIRECT_READ_AHEAD => MAX_DIRECT_READ_AHEAD,
        n => n,
    }
}

/// The writes behind a writer asked for `writes_behind` keeps in flight: at most
/// [`MAX_DIRECT_WRITES_BEHIND`].
const fn writes_behind_at_most(writes_behind: usize) -> usize {
    match writes_behind > MAX_DIRECT_WRITES_BEHIND {
        true => MAX_DIRECT_WRITES_BEHIND,
        false => writes_behind,
    }
}

/// A heap buffer of `len` bytes whose start is [`BLOCK`]-aligned.
struct Aligned {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let bytes = vec![0u8; len + BLOCK];
        let start = bytes.as_ptr().align_offset(BLOCK).min(BLOCK);
        Self { bytes, start, len }
    }

    fn get(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

/// Buffers of [`TRANSFER_BYTES`] not in use, for the next direct write or reader:
/// a buffer allocated anew is memory the process touches for the first time, which
/// is what direct I/O is there to avoid. At most [`IDLE_BUFFERS`] are kept.
static IDLE: Mutex<Vec<Aligned>> = Mutex::new(Vec::new());

/// The most idle buffers kept: a reader holds one more than it reads ahead and a
/// writer one while it writes and those of its writes behind, so this is two
/// threads reading (as far ahead as a reader may) and writing. Only buffers that were in use at once come back here,
/// so this holds no more than the most the threads took together.
const IDLE_BUFFERS: usize = 2 * (MAX_DIRECT_READ_AHEAD + 2 + MAX_DIRECT_WRITES_BEHIND);

/// A buffer of [`TRANSFER_BYTES`]: an idle one, or a new one.
fn take_buffer() -> Aligned {
    let idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner).pop();
    idle.unwrap_or_else(|| Aligned::new(TRANSFER_BYTES))
}

/// Hands `buffer` back for the next direct write or reader.
fn give_back(buffer: Aligned) {
    let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
    if idle.len() < IDLE_BUFFERS {
        idle.push(buffer);
    }
}

/// Creates `options`' file at `path`, with `O_DIRECT` when `direct` asks for it and
/// the file system takes it. Returns the file and whether it is direct.
pub(crate) fn create(
    options: &mut OpenOptions,
    path: &Path,
    direct: bool,
) -> io::Result<(File, bool)> {
    #[cfg(target_os = "linux")]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        let mut with_direct = options.clone();
        with_direct.custom_flags(libc::O_DIRECT);
        match with_direct.open(path) {
            Ok(file) => return Ok((file, true)),
            // The file system does not do direct I/O. Linux may have created the
            // file before it found that out: the name is ours alone (a private
            // directory, a fresh number), so it goes before it is created again.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let _ = std::fs::remove_file(path);
            }
            Err(e) => return Err(e),
        }
    }
    let _ = direct;
    Ok((options.open(path)?, false))
}

/// Opens the file at `path` for reading, with `O_DIRECT` when it was written so.
pub(crate) fn open_for_reading(path: &Path, direct: bool) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        return OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
    }
    let _ = direct;
    File::open(path)
}

/// Direct writes a thread keeps in flight behind it by default
/// ([`crate::SpillConfig::direct_writes_behind`]; [`DirectTail`]): each holds a
/// buffer of [`TRANSFER_BYTES`] until the device has it. Two cover a probe
/// message of a large spill, which is a little over one transfer on average
/// (BENCHMARKS.md, the choices table, has what one and two measured).
pub const DEFAULT_DIRECT_WRITES_BEHIND: usize = 2;

/// The most writes a thread keeps in flight behind it.
pub const MAX_DIRECT_WRITES_BEHIND: usize = 4;

thread_local! {
    /// This thread's direct writes in flight (each write's permit holds a clone and
    /// gives its count back when the write is done, on the thread that did it).
    static WRITES_BEHIND: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

/// A write behind counted against the thread that issued it.
struct WritePermit(Arc<AtomicUsize>);

impl WritePermit {
    /// A permit, when the calling thread has fewer than `at_most` writes in flight.
    fn take(at_most: usize) -> Option<Self> {
        let at_most = writes_behind_at_most(at_most);
        WRITES_BEHIND.with(|count| {
            let taken = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < at_most).then_some(n + 1)
            });
            taken.ok().map(|_| Self(Arc::clone(count)))
        })
    }
}

impl Drop for WritePermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A write of whole blocks on a thread of its own, which hands its buffer back when
/// done (a write that ended holds no buffer until it is collected).
type Behind = JoinHandle<io::Result<()>>;

/// The logical end of a file written with `O_DIRECT`, the bytes of its last, partial
/// block (held here until a later message completes it, or [`flush`](Self::flush)
/// writes it padded), and the writes of whole blocks still in flight.
///
/// Why writes go behind: a thread that waits for every `pwrite` leaves its core
/// idle while the device works (16–19% of the time in the probe phase of a large
/// spill, BENCHMARKS.md). Only whole blocks that no later write touches go behind,
/// so writes in flight never overlap and their order does not matter; the partial
/// block is written only where the file must be readable: [`flush`](Self::flush).
#[derive(Debug, Default)]
pub(crate) struct DirectTail {
    len: u64,
    tail: Vec<u8>,
    behind: VecDeque<Behind>,
}

impl DirectTail {
    /// Appends `buffers` at the file's logical end: the partial last block and the
    /// message go out in whole blocks, behind when the thread has fewer than
    /// `writes_behind` writes in flight; the new partial block stays here.
    ///
    /// # Errors
    ///
    /// Also the error of a write behind that has ended since the last call.
    pub(crate) fn append(
        &mut self,
        file: &Arc<File>,
        buffers: &[Buffer],
        writes_behind: usize,
    ) -> io::Result<()> {
        self.reap(false)?;
        let mut scratch = take_buffer();
        let mut offset = self.len - self.tail.len() as u64;
        let mut filled = self.tail.len();
        scratch.get_mut()[..filled].copy_from_slice(&self.tail);
        let mut len = self.len;
        for buffer in buffers {
            let mut bytes = buffer.as_slice();
            while !bytes.is_empty() {
                let room = &mut scratch.get_mut()[filled..];
                let n = bytes.len().min(room.len());
                room[..n].copy_from_slice(&bytes[..n]);
                (filled, bytes, len) = (filled + n, &bytes[n..], len + n as u64);
                if filled == TRANSFER_BYTES {
                    scratch = self.write(file, scratch, (offset, filled), writes_behind)?;
                    (offset, filled) = (offset + filled as u64, 0);
                }
            }
        }
        let whole = filled / BLOCK * BLOCK;
        self.tail.clear();
        self.tail.extend_from_slice(&scratch.get()[whole..filled]);
        self.len = len;
        if whole > 0 {
            scratch = self.write(file, scratch, (offset, whole), writes_behind)?;
        }
        give_back(scratch);
        Ok(())
    }

    /// Writes `buffer`'s first `len` bytes at `offset`: behind when this thread has
    /// a write to spare (then returns a fresh buffer), else now (then `buffer`).
    fn write(
        &mut self,
        file: &Arc<File>,
        buffer: Aligned,
        (offset, len): (u64, usize),
        writes_behind: usize,
    ) -> io::Result<Aligned> {
        let Some(permit) = WritePermit::take(writes_behind) else {
            write_all_at(file, &buffer.get()[..len], offset)?;
            return Ok(buffer);
        };
        // The buffer comes back from a thread that could not be started.
        let handed = Arc::new(Mutex::new(Some(buffer)));
        let (theirs, file_there) = (Arc::clone(&handed), Arc::clone(file));
        let spawned = std::thread::Builder::new()
            .name("spill-write-behind".into())
            .spawn(move || {
                let _permit = permit;
                let taken = theirs.lock().unwrap_or_else(PoisonError::into_inner).take();
                let buffer = taken.ok_or_else(|| io::Error::other("write-behind buffer gone"))?;
                let written = write_all_at(&file_there, &buffer.get()[..len], offset);
                give_back(buffer);
                written
            });
        match spawned {
            Ok(handle) => {
                self.behind.push_back(handle);
                Ok(take_buffer())
            }
            Err(_) => {
                let taken = handed.lock().unwrap_or_else(PoisonError::into_inner).take();
                let buffer = taken.ok_or_else(|| io::Error::other("write-behind buffer gone"))?;
                write_all_at(file, &buffer.get()[..len], offset)?;
                Ok(buffer)
            }
        }
    }

    /// Collects the writes behind that have ended (all of them, waiting, if `all`).
    /// Returns the first failure.
    fn reap(&mut self, all: bool) -> io::Result<()> {
        let mut failed = Ok(());
        while self.behind.front().is_some_and(|w| all || w.is_finished()) {
            let Some(write) = self.behind.pop_front() else {
                break;
            };
            match write.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = failed.and(Err(e)),
                Err(_) => {
                    let panicked = io::Error::other("a spill write-behind thread panicked");
                    failed = failed.and(Err(panicked));
                }
            }
        }
        failed
    }

    /// Makes every byte appended so far readable from the file: waits for the writes
    /// behind, then writes the partial last block padded with zeros (overwritten by
    /// the next append, cut off by [`finish`](Self::finish)).
    pub(crate) fn flush(&mut self, file: &File) -> io::Result<()> {
        self.reap(true)?;
        if self.tail.is_empty() {
            return Ok(());
        }
        let mut scratch = take_buffer();
        let padded = self.tail.len().div_ceil(BLOCK) * BLOCK;
        let bytes = &mut scratch.get_mut()[..padded];
        bytes[..self.tail.len()].copy_from_slice(&self.tail);
        bytes[self.tail.len()..].fill(0);
        let written = write_all_at(file, bytes, self.len - self.tail.len() as u64);
        give_back(scratch);
        written
    }

    /// Flushes, then cuts the file back to its logical end.
    pub(crate) fn finish(&mut self, file: &File) -> io::Result<()> {
        self.flush(file)?;
        file.set_len(self.len)
    }
}

impl Drop for DirectTail {
    /// Waits for the writes behind (no thread outlives its writer; the file they
    /// write to is being deleted or was flushed).
    fn drop(&mut self) {
        let _ = self.reap(true);
    }
}

/// `pwrite(2)` of all of `bytes` at `offset`.
fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
    }
    #[cfg(windows)]
    {
        // (Direct files are only created on Linux.)
        let _ = (file, bytes, offset);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// One run of whole blocks of a file, read (or being read) into a buffer of its own.
struct Chunk {
    buffer: Aligned,
    /// Where the run starts in the file, and the bytes of it read (fewer than asked
    /// only at the end of the file).
    start: u64,
    len: usize,
}

impl Chunk {
    fn covers(&self, offset: u64) -> bool {
        offset >= self.start && offset < self.start + self.len as u64
    }
}

/// Reads `(start, len)` of `file` into `buffer`'s first `len` bytes: whole blocks,
/// short only at the end of the file.
fn read_chunk(file: &File, mut buffer: Aligned, (start, len): (u64, usize)) -> io::Result<Chunk> {
    let bytes = &mut buffer.get_mut()[..len];
    let mut got = 0;
    while got < len {
        match read_at(file, &mut bytes[got..], start + got as u64) {
            Ok(0) => break,
            // A read that ends off a block boundary ended at the file's end.
            Ok(n) if n % BLOCK != 0 => {
                got += n;
                break;
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Chunk {
        buffer,
        start,
        len: got,
    })
}

/// The reading side of direct I/O: the blocks that hold a file's extents, read in
/// runs of at most [`TRANSFER_BYTES`], each run read on a thread of its own while
/// the one before is consumed (a direct read waits for the device; without the
/// run ahead, joining spilled pairs waited for every run in turn).
///
/// Holds the buffers of the run handed out from and of [`RUNS_AHEAD`] more while
/// it reads.
pub(crate) struct DirectReader {
    file: Arc<File>,
    /// Every run to read, in order; the next to ask for.
    runs: Vec<(u64, usize)>,
    next: usize,
    /// The run handed out from, and the ones being read ahead.
    current: Option<Chunk>,
    ahead: VecDeque<JoinHandle<io::Result<Chunk>>>,
    /// How many runs are read ahead.
    runs_ahead: usize,
    /// The buffer of the next run to start.
    spare: Option<Aligned>,
}

impl std::fmt::Debug for DirectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectReader")
            .field("runs", &self.runs.len())
            .field("next", &self.next)
            .finish()
    }
}

impl DirectReader {
    /// A reader of `extents` of `file`, which was opened with `O_DIRECT`, reading
    /// `runs_ahead` runs ahead (1 to [`MAX_DIRECT_READ_AHEAD`]).
    pub(crate) fn new(file: Arc<File>, extents: &[Extent], runs_ahead: usize) -> Self {
        let block = BLOCK as u64;
        let mut runs = Vec::new();
        for extent in extents.iter().filter(|e| e.len > 0) {
            let mut start = extent.offset / block * block;
            let end = (extent.offset + extent.len).div_ceil(block) * block;
            while start < end {
                let len = (end - start).min(TRANSFER_BYTES as u64);
                runs.push((start, len as usize));
                start += len;
            }
        }
        Self {
            file,
            runs,
            next: 0,
            current: None,
            ahead: VecDeque::new(),
            runs_ahead: self::runs_ahead(runs_ahead),
            spare: None,
        }
    }

    /// Reads into `buf` from `offset` (at or past every offset read before, inside
    /// one of the extents). Returns the bytes read: 0 when the file ended before
    /// `offset`.
    pub(crate) fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        while !self.current.as_ref().is_some_and(|c| c.covers(offset)) {
            if !self.advance()? {
                return Ok(0);
            }
        }
        let Some(chunk) = self.current.as_ref() else {
            return Ok(0);
        };
        let skip = usize::try_from(offset - chunk.start).unwrap_or(usize::MAX);
        let n = (chunk.len - skip).min(buf.len());
        buf[..n].copy_from_slice(&chunk.buffer.get()[skip..skip + n]);
        Ok(n)
    }

    /// Moves to the next run (the one read ahead, or read now) and starts reading
    /// the one after it. Returns false when there is none.
    fn advance(&mut self) -> io::Result<bool> {
        let done = self.current.take().map(|c| c.buffer);
        let chunk = match self.ahead.pop_front() {
            Some(ahead) => ahead
                .join()
                .map_err(|_| io::Error::other("a spill read-ahead thread panicked"))??,
            None => {
                let Some(&run) = self.runs.get(self.next) else {
                    return Ok(false);
                };
                self.next += 1;
                let buffer = self.spare.take().unwrap_or_else(take_buffer);
                read_chunk(&self.file, buffer, run)?
            }
        };
        self.spare = done;
        self.current = Some(chunk);
        while self.ahead.len() < self.runs_ahead {
            let Some(&run) = self.runs.get(self.next) else {
                break;
            };
            let file = Arc::clone(&self.file);
            let buffer = self.spare.take().unwrap_or_else(take_buffer);
            // (No thread to be had: the run is read when it is needed.)
            let Ok(ahead) = std::thread::Builder::new()
                .name("spill-read-ahead".into())
                .spawn(move || read_chunk(&file, buffer, run))
            else {
                break;
            };
            self.ahead.push_back(ahead);
            self.next += 1;
        }
        Ok(true)
    }
}

impl Drop for DirectReader {
    /// Waits for the run being read ahead (no thread outlives its reader) and
    /// hands the buffers back.
    fn drop(&mut self) {
        for ahead in self.ahead.drain(..) {
            if let Ok(Ok(chunk)) = ahead.join() {
                give_back(chunk.buffer);
            }
        }
        if let Some(chunk) = self.current.take() {
            give_back(chunk.buffer);
        }
        if let Some(buffer) = self.spare.take() {
            give_back(buffer);
        }
    }
}

/// `pread(2)`.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
}
