//! Memory pools and reservations for spilljoin.
//!
//! Every buffer of a join whose size grows with its input is paid for *before* it is
//! allocated, by growing a [`MemoryReservation`] against a shared [`MemoryPool`]. A
//! failed reservation is the only signal a join uses to decide that it must spill;
//! nothing is guessed from statistics.
//!
//! ```text
//!   MemoryConsumer ──register──► MemoryReservation ──try_grow/shrink──► dyn MemoryPool
//!   (a name, can_spill)          (RAII: bytes held by one consumer;     (the budget shared by
//!                                 freed and unregistered on drop)         every consumer)
//! ```
//!
//! The shape follows DataFusion's `memory_pool` module closely so that an engine that
//! already has a pool can plug it in: implement [`MemoryPool`] for it (or wrap it) and
//! hand spilljoin an `Arc<dyn MemoryPool>`.
//!
//! Pools provided here:
//! - [`UnboundedMemoryPool`]: counts, never refuses.
//! - [`GreedyMemoryPool`]: first come, first served up to a limit.
//! - [`FairSpillPool`]: consumers that cannot spill take first; consumers that can
//!   spill share what is left equally, so one spilling operator cannot starve another.
//! - [`TrackConsumersPool`]: a decorator that remembers what each consumer holds and,
//!   when a reservation fails, names the largest consumers in the error.
//! - [`PoolShare`]: one of several joins run side by side on one pool (the partitions
//!   of a shuffle), planning for its part of the limit.
//!
//! The default limit for a process that was not given one is
//! [`default_memory_limit_bytes`]: a fraction of the memory the machine (or its cgroup)
//! has available.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use spilljoin_memory::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
//!
//! # fn main() -> Result<(), spilljoin_memory::MemoryError> {
//! let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1024));
//! let mut reservation = MemoryConsumer::new("hash table").with_can_spill(true).register(&pool);
//! reservation.try_grow(1000)?;
//! assert!(reservation.try_grow(100).is_err()); // only 24 bytes left
//! drop(reservation);
//! assert_eq!(pool.reserved(), 0);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod consumer;
mod error;
mod limit;
mod pool;
mod share;
mod track;

pub use consumer::{MemoryConsumer, MemoryReservation};
pub use error::{ConsumerUsage, MemoryError};
pub use limit::{available_memory_bytes, default_memory_limit_bytes, DEFAULT_MEMORY_FRACTION};
pub use pool::{FairSpillPool, GreedyMemoryPool, MemoryLimit, MemoryPool, UnboundedMemoryPool};
pub use share::PoolShare;
pub use track::TrackConsumersPool;
