//! The disk quota shared by all files of one manager.
//!
//! Bytes are reserved *before* they are handed to the file (so the quota is
//! never exceeded, not even by one write) and released when the file that
//! holds them is deleted. Reservation is one compare-and-swap loop on an
//! atomic counter, cheap enough to run on every `write` call the IPC encoder
//! makes (a few dozen per batch).

use std::sync::atomic::{AtomicU64, Ordering};

/// A reservation refused by [`DiskQuota::try_reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaDenied {
    pub(crate) quota_bytes: u64,
    pub(crate) used_bytes: u64,
    pub(crate) requested_bytes: u64,
}

/// Bytes held by live spill files, against an optional limit.
#[derive(Debug)]
pub(crate) struct DiskQuota {
    limit_bytes: Option<u64>,
    used_bytes: AtomicU64,
}

impl DiskQuota {
    pub(crate) fn new(limit_bytes: Option<u64>) -> Self {
        Self {
            limit_bytes,
            used_bytes: AtomicU64::new(0),
        }
    }

    /// Bytes currently reserved.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or refuses without reserving anything if that would
    /// take the total past the limit.
    pub(crate) fn try_reserve(&self, bytes: u64) -> Result<(), QuotaDenied> {
        let Some(limit) = self.limit_bytes else {
            self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        };
        let mut used = self.used_bytes.load(Ordering::Relaxed);
        loop {
            let new = used
                .checked_add(bytes)
                .filter(|&new| new <= limit)
                .ok_or(QuotaDenied {
                    quota_bytes: limit,
                    used_bytes: used,
                    requested_bytes: bytes,
                })?;
            match self.used_bytes.compare_exchange_weak(
                used,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => used = actual,
            }
        }
    }

    /// Returns `bytes` earlier reserved.
    pub(crate) fn release(&self, bytes: u64) {
        let before = self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        assert!(
            before >= bytes,
            "released {bytes} spill bytes but only {before} were reserved"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_limit_and_no_further() {
        let q = DiskQuota::new(Some(100));
        q.try_reserve(60).unwrap();
        q.try_reserve(40).unwrap();
        assert_eq!(
            q.try_reserve(1),
            Err(QuotaDenied {
                quota_bytes: 100,
                used_bytes: 100,
                requested_bytes: 1
            })
        );
        q.release(50);
        assert_eq!(q.used_bytes(), 50);
        q.try_reserve(50).unwrap();
        assert!(q.try_reserve(u64::MAX).is_err());
    }

    #[test]
    fn unlimited_counts_only() {
        let q = DiskQuota::new(None);
        q.try_reserve(1 << 40).unwrap();
        assert_eq!(q.used_bytes(), 1 << 40);
        q.release(1 << 40);
        assert_eq!(q.used_bytes(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let q = std::sync::Arc::new(DiskQuota::new(Some(1000)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || (0..1000).filter(|_| q.try_reserve(1).is_ok()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 1000);
        assert_eq!(q.used_bytes(), 1000);
    }
}
