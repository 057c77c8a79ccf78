//! A cache of prepared builds for embedders that probe the same build input many
//! times (a dimension table joined by every query).
//!
//! ```text
//!  get_or_prepare(key) ─► cached?          ─► a handle to it (now most recently used)
//!                      ─► being built?     ─► wait for that build, share its result
//!                      ─► neither          ─► build it here; waiters wake with the
//!                                             build or its error
//!  after each insert: over budget? ─► drop least recently used builds nobody holds
//! ```
//!
//! The key is the caller's: an identity for the data and a version. A new version of
//! an identity replaces the older ones in the cache (handles to them stay valid until
//! dropped). The cache cannot know whether the data changed; bump the version when it
//! does.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use crate::batches::lock;
use crate::error::{JoinError, Result};
use crate::prepared::PreparedBuild;

/// What a cached build is: the caller's identity for the build input and its version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BuildKey {
    /// The caller's name for the data (a table, a file, a query fragment).
    pub identity: String,
    /// The data's version; a higher one replaces lower ones.
    pub version: u64,
}

impl BuildKey {
    /// The key of `identity` at `version`.
    pub fn new(identity: impl Into<String>, version: u64) -> Self {
        Self {
            identity: identity.into(),
            version,
        }
    }
}

/// A cache of [`PreparedBuild`]s, single-flight and bounded by the memory its builds
/// hold (see the module docs).
#[derive(Debug)]
pub struct BuildCache {
    budget_bytes: usize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    entries: HashMap<BuildKey, Entry>,
    clock: u64,
}

#[derive(Debug)]
enum Entry {
    Building(Arc<Flight>),
    Ready {
        build: PreparedBuild,
        last_used: u64,
    },
}

/// One build in progress, which waiters wait for.
#[derive(Debug, Default)]
struct Flight {
    result: Mutex<Option<Result<PreparedBuild, Arc<JoinError>>>>,
    done: Condvar,
}

impl Flight {
    fn complete(&self, result: Result<PreparedBuild, Arc<JoinError>>) {
        *lock(&self.result) = Some(result);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<PreparedBuild> {
        let mut result = lock(&self.result);
        loop {
            match &*result {
                Some(Ok(build)) => return Ok(build.clone()),
                Some(Err(e)) => return Err(JoinError::SharedBuildFailed(Arc::clone(e))),
                None => {
                    result = self
                        .done
                        .wait(result)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                }
            }
        }
    }
}

/// Ends a flight that its builder left without a result (a panic in the build).
struct FlightGuard<'a> {
    cache: &'a BuildCache,
    key: &'a BuildKey,
    flight: &'a Arc<Flight>,
    completed: bool,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        if !self.completed {
            self.cache.forget_flight(self.key, self.flight);
            self.flight.complete(Err(Arc::new(JoinError::WorkerPanicked(
                "the shared build panicked".into(),
            ))));
        }
    }
}

/// What a request finds in the cache ([`BuildCache::claim`]).
enum Claim {
    /// A ready build.
    Ready(PreparedBuild),
    /// Another request's build in progress.
    Building(Arc<Flight>),
    /// Nothing: this request builds, as this flight.
    Ours(Arc<Flight>),
}

impl BuildCache {
    /// A cache whose builds may hold up to `budget_bytes` of memory (their
    /// [`PreparedBuild::memory_bytes`]) while nobody uses them. Builds in use are never
    /// evicted, so the cache may exceed its budget while they are.
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            state: Mutex::default(),
        }
    }

    /// The build for `key`: from the cache, from a build in progress (waiting for it),
    /// or from `prepare`, called here when neither exists. Concurrent requests for a
    /// missing key call `prepare` once.
    ///
    /// # Errors
    /// [`JoinError::SharedBuildFailed`] with the build's error, for the request that
    /// built and for every request that waited; nothing is cached then.
    pub fn get_or_prepare<F>(&self, key: BuildKey, prepare: F) -> Result<PreparedBuild>
    where
        F: FnOnce() -> Result<PreparedBuild>,
    {
        let flight = match self.claim(&key) {
            Claim::Ready(build) => return Ok(build),
            Claim::Building(flight) => return flight.wait(),
            Claim::Ours(flight) => flight,
        };
        let mut guard = FlightGuard {
            cache: self,
            key: &key,
            flight: &flight,
            completed: false,
        };
        let result = prepare();
        guard.completed = true;
        match result {
            Ok(build) => {
                self.settle(&key, &flight, &build);
                flight.complete(Ok(build.clone()));
                Ok(build)
            }
            Err(e) => {
                self.forget_flight(&key, &flight);
                let shared = Arc::new(e);
                flight.complete(Err(Arc::clone(&shared)));
                Err(JoinError::SharedBuildFailed(shared))
            }
        }
    }

    /// What the cache has for `key`: a ready build (now most recently used), a build
    /// in progress to wait for, or neither, in which case a flight of the caller's
    /// own is entered for it. The lock is released before it returns.
    fn claim(&self, key: &BuildKey) -> Claim {
        let mut state = lock(&self.state);
        state.clock += 1;
        let now = state.clock;
        match state.entries.get_mut(key) {
            Some(Entry::Ready { build, last_used }) => {
                *last_used = now;
                Claim::Ready(build.clone())
            }
            Some(Entry::Building(flight)) => Claim::Building(Arc::clone(flight)),
            None => {
                let flight = Arc::new(Flight::default());
                state
                    .entries
                    .insert(key.clone(), Entry::Building(Arc::clone(&flight)));
                Claim::Ours(flight)
            }
        }
    }

    /// Caches `build`, made by `flight` for `key`, in place of the flight, and drops
    /// the older versions of its identity; unless the flight was invalidated while
    /// building or a newer version is cached already, when the build is only handed
    /// out.
    fn settle(&self, key: &BuildKey, flight: &Arc<Flight>, build: &PreparedBuild) {
        let mut state = lock(&self.state);
        state.clock += 1;
        let now = state.clock;
        // A newer version replaces the older ones; an older one that
        // finishes after a newer is cached is handed out, not cached.
        let newer_cached = state.entries.iter().any(|(k, e)| {
            k.identity == key.identity
                && k.version > key.version
                && matches!(e, Entry::Ready { .. })
        });
        let still_ours = matches!(
            state.entries.get(key),
            Some(Entry::Building(f)) if Arc::ptr_eq(f, flight)
        );
        if newer_cached || !still_ours {
            // Invalidated while building, or superseded: hand it out,
            // do not cache it.
            if still_ours {
                state.entries.remove(key);
            }
            return;
        }
        state.entries.retain(|k, e| {
            k.identity != key.identity
                || k.version >= key.version
                || matches!(e, Entry::Building(_))
        });
        state.entries.insert(
            key.clone(),
            Entry::Ready {
                build: build.clone(),
                last_used: now,
            },
        );
        self.evict(&mut state);
    }

    /// The cached build for `key`, if it is ready (marks it used).
    pub fn get(&self, key: &BuildKey) -> Option<PreparedBuild> {
        let mut state = lock(&self.state);
        state.clock += 1;
        let now = state.clock;
        match state.entries.get_mut(key) {
            Some(Entry::Ready { build, last_used }) => {
                *last_used = now;
                Some(build.clone())
            }
            _ => None,
        }
    }

    /// Drops every cached version of `identity` (handles to them stay valid). A build
    /// of it in progress still answers the requests waiting for it, but is not
    /// cached.
    pub fn invalidate(&self, identity: &str) {
        lock(&self.state)
            .entries
            .retain(|k, _| k.identity != identity);
    }

    /// Evicts least recently used builds that nobody holds until the cache is within
    /// its budget (also done after every insert). Call it after dropping handles to
    /// return memory early.
    pub fn trim(&self) {
        self.evict(&mut lock(&self.state));
    }

    /// Builds cached (ready ones).
    pub fn len(&self) -> usize {
        lock(&self.state)
            .entries
            .values()
            .filter(|e| matches!(e, Entry::Ready { .. }))
            .count()
    }

    /// Whether no build is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a ready build for `key` is cached.
    pub fn contains(&self, key: &BuildKey) -> bool {
        matches!(
            lock(&self.state).entries.get(key),
            Some(Entry::Ready { .. })
        )
    }

    /// Memory held by the cached builds.
    pub fn cached_bytes(&self) -> usize {
        Self::bytes(&lock(&self.state))
    }

    fn bytes(state: &CacheState) -> usize {
        state
            .entries
            .values()
            .map(|e| match e {
                Entry::Ready { build, .. } => build.memory_bytes(),
                Entry::Building(_) => 0,
            })
            .sum()
    }

    fn evict(&self, state: &mut CacheState) {
        let mut total = Self::bytes(state);
        while total > self.budget_bytes {
            // The least recently used build that only the cache holds.
            let victim = state
                .entries
                .iter()
                .filter_map(|(k, e)| match e {
                    Entry::Ready { build, last_used } if build.handles() == 1 => {
                        Some((*last_used, k.clone(), build.memory_bytes()))
                    }
                    _ => None,
                })
                .min_by_key(|(used, _, _)| *used);
            let Some((_, key, bytes)) = victim else {
                return; // everything over the budget is in use
            };
            state.entries.remove(&key);
            total -= bytes;
        }
    }

    /// Removes `key`'s entry if it is still `flight`.
    fn forget_flight(&self, key: &BuildKey, flight: &Arc<Flight>) {
        let mut state = lock(&self.state);
        if matches!(state.entries.get(key), Some(Entry::Building(f)) if Arc::ptr_eq(f, flight)) {
            state.entries.remove(key);
        }
    }
}
