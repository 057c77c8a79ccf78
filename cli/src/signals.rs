//! Ctrl-C, SIGTERM and SIGHUP: stop the join (or the query), clean up, exit 128 +
//! the signal.
//!
//! ```text
//!  signal ──► watcher thread ──► remember the signal ──► CancelHandle::cancel()
//!                │                                             │ workers stop between
//!                │                                             ▼ batches
//!                │                   main thread: the stream ends with `Cancelled`;
//!                │                   dropping it removes the spill files, dropping
//!                │                   the output removes its temporary file; exit 128+N
//!                │
//!                └─ a second signal, or no exit within GRACE: remove the registered
//!                   paths (spill directory, temporary output) and exit at once
//! ```
//!
//! `sql` cancels differently: its canceller wakes the main thread, which stops
//! polling the query and drops its stream; DataFusion's tasks and the joins inside
//! it stop and remove their spill files as they are dropped.
//!
//! The forced path exists for a main thread blocked where it cannot see the cancel
//! (a read from a pipe that never ends, a write to a stdout nobody reads).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spilljoin::CancelHandle;

use super::failure::signal_exit_code;

/// How long the main thread has to stop after a signal before the watcher removes
/// what is registered and exits by itself.
const GRACE: Duration = Duration::from_secs(10);

/// What the watcher thread shares with the main thread.
#[derive(Default)]
struct Shared {
    /// The signal received, 0 if none.
    signal: AtomicI32,
    /// What stops the running work (a join's cancel handle, a query's stream).
    cancel: Mutex<Option<Canceller>>,
    /// Files and directories to remove if the process has to exit without unwinding.
    cleanup: Mutex<Vec<PathBuf>>,
}

/// Stops the running work; called once, from the watcher thread.
type Canceller = Box<dyn Fn() + Send>;

/// The process's interrupt state. Cheap to clone.
#[derive(Clone, Default)]
pub struct Interrupt {
    shared: Arc<Shared>,
}

impl Interrupt {
    /// Starts watching SIGINT, SIGTERM and SIGHUP (Unix; elsewhere a no-op).
    ///
    /// # Errors
    /// The handlers cannot be installed.
    pub fn install() -> anyhow::Result<Self> {
        let interrupt = Self::default();
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
            let shared = Arc::clone(&interrupt.shared);
            std::thread::Builder::new()
                .name("spilljoin-signals".into())
                .spawn(move || {
                    let mut received = false;
                    for signal in signals.forever() {
                        if received {
                            force_exit(&shared, signal);
                        }
                        received = true;
                        shared.signal.store(signal, Ordering::SeqCst);
                        if let Some(cancel) = lock(&shared.cancel).as_ref() {
                            cancel();
                        }
                        let shared = Arc::clone(&shared);
                        let _ = std::thread::Builder::new()
                            .name("spilljoin-grace".into())
                            .spawn(move || {
                                std::thread::sleep(GRACE);
                                force_exit(&shared, signal);
                            });
                    }
                })?;
        }
        Ok(interrupt)
    }

    /// The signal received, if any.
    pub fn signal(&self) -> Option<i32> {
        match self.shared.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Cancels the join through `cancel` when a signal comes (at once if one came
    /// already).
    pub fn watch(&self, cancel: CancelHandle) {
        self.on_signal(move || cancel.cancel());
    }

    /// Calls `cancel` when a signal comes (at once if one came already): it must
    /// make the main thread stop its work soon, without blocking.
    pub fn on_signal(&self, cancel: impl Fn() + Send + 'static) {
        let mut slot = lock(&self.shared.cancel);
        if self.signal().is_some() {
            cancel();
        }
        *slot = Some(Box::new(cancel));
    }

    /// Removes `path` (a file or a directory) if the process must exit without
    /// unwinding.
    pub fn remove_on_forced_exit(&self, path: PathBuf) {
        lock(&self.shared.cleanup).push(path);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes the registered paths and exits with the signal's code.
fn force_exit(shared: &Shared, signal: i32) -> ! {
    for path in lock(&shared.cleanup).iter() {
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
    }
    eprintln!(
        "spilljoin: stopped by {}; spill files and partial output removed",
        signal_name(signal)
    );
    std::process::exit(signal_exit_code(signal))
}

/// The name of a signal, for messages.
pub fn signal_name(signal: i32) -> String {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        match signal {
            SIGINT => return "SIGINT".into(),
            SIGTERM => return "SIGTERM".into(),
            SIGHUP => return "SIGHUP".into(),
            _ => {}
        }
    }
    format!("signal {signal}")
}
