//! Consumers and their RAII reservations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{MemoryError, MemoryPool};

static NEXT_CONSUMER_ID: AtomicUsize = AtomicUsize::new(0);

/// One user of a memory pool: a name for error messages, and whether it can free
/// memory by spilling when asked (pools such as [`FairSpillPool`] treat the two kinds
/// differently).
///
/// A consumer is registered with a pool by [`MemoryConsumer::register`], which returns
/// the [`MemoryReservation`] through which it grows and shrinks.
///
/// [`FairSpillPool`]: crate::FairSpillPool
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemoryConsumer {
    name: String,
    can_spill: bool,
    id: usize,
}

impl MemoryConsumer {
    /// A consumer that cannot spill, with a process-unique id.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            can_spill: false,
            id: NEXT_CONSUMER_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Sets whether this consumer can spill.
    pub fn with_can_spill(self, can_spill: bool) -> Self {
        Self { can_spill, ..self }
    }

    /// A new consumer with the same name and spill flag but its own id.
    pub fn clone_with_new_id(&self) -> Self {
        Self::new(self.name.clone()).with_can_spill(self.can_spill)
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the consumer can spill.
    pub fn can_spill(&self) -> bool {
        self.can_spill
    }

    /// The consumer's process-unique id.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Registers this consumer with `pool` and returns an empty reservation for it.
    /// The consumer is unregistered when the reservation (and every reservation split
    /// from it) has been dropped.
    pub fn register(self, pool: &Arc<dyn MemoryPool>) -> MemoryReservation {
        pool.register(&self);
        MemoryReservation {
            registration: Arc::new(Registration {
                pool: Arc::clone(pool),
                consumer: self,
            }),
            size: 0,
        }
    }
}

/// A consumer's registration with a pool, shared by the reservations split from one
/// another; unregisters on drop.
#[derive(Debug)]
struct Registration {
    pool: Arc<dyn MemoryPool>,
    consumer: MemoryConsumer,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.pool.unregister(&self.consumer);
    }
}

/// Bytes held from a [`MemoryPool`] by one [`MemoryConsumer`].
///
/// A reservation is RAII: whatever it holds goes back to the pool when it is dropped.
/// Grow it *before* allocating the memory it accounts for, and shrink it after the
/// memory is freed.
#[derive(Debug)]
pub struct MemoryReservation {
    registration: Arc<Registration>,
    size: usize,
}

impl MemoryReservation {
    /// The bytes this reservation holds.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The consumer this reservation belongs to.
    pub fn consumer(&self) -> &MemoryConsumer {
        &self.registration.consumer
    }

    /// The pool this reservation draws from.
    pub fn pool(&self) -> &Arc<dyn MemoryPool> {
        &self.registration.pool
    }

    /// Returns every byte to the pool and reports how many that was.
    pub fn free(&mut self) -> usize {
        let size = std::mem::take(&mut self.size);
        if size != 0 {
            self.registration.pool.shrink(self, size);
        }
        size
    }

    /// Returns `bytes` to the pool.
    ///
    /// # Panics
    /// If `bytes` is more than the reservation holds: that is a bookkeeping bug.
    pub fn shrink(&mut self, bytes: usize) {
        let new_size = self.size.checked_sub(bytes).unwrap_or_else(|| {
            panic!(
                "cannot shrink reservation of {} by {bytes} bytes: it holds {}",
                self.consumer().name(),
                self.size
            )
        });
        if bytes != 0 {
            self.registration.pool.shrink(self, bytes);
        }
        self.size = new_size;
    }

    /// Asks the pool for `bytes` more. Asking for none always succeeds, without
    /// calling the pool (a join asks for the growth of a buffer after every batch it
    /// adds to it, which is mostly none).
    ///
    /// # Errors
    /// [`MemoryError::ResourcesExhausted`] when the pool refuses; the reservation is
    /// then unchanged.
    pub fn try_grow(&mut self, bytes: usize) -> Result<(), MemoryError> {
        if bytes == 0 {
            return Ok(());
        }
        self.registration.pool.try_grow(self, bytes)?;
        self.size += bytes;
        Ok(())
    }

    /// Takes `bytes` more from the pool even if that exceeds its limit.
    ///
    /// Only for memory that is already allocated and cannot be given back (for
    /// example, a batch a caller handed over); everything else uses
    /// [`try_grow`](Self::try_grow).
    pub fn grow(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.registration.pool.grow(self, bytes);
        self.size += bytes;
    }

    /// Grows or shrinks the reservation to exactly `capacity` bytes.
    ///
    /// # Errors
    /// [`MemoryError::ResourcesExhausted`] when growing is refused; the reservation is
    /// then unchanged.
    pub fn try_resize(&mut self, capacity: usize) -> Result<(), MemoryError> {
        match capacity.cmp(&self.size) {
            std::cmp::Ordering::Greater => self.try_grow(capacity - self.size),
            std::cmp::Ordering::Less => {
                self.shrink(self.size - capacity);
                Ok(())
            }
            std::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// Moves `capacity` bytes of this reservation into a new reservation of the same
    /// consumer; the pool's total is unchanged.
    ///
    /// # Panics
    /// If `capacity` is more than the reservation holds.
    pub fn split(&mut self, capacity: usize) -> MemoryReservation {
        self.size = self.size.checked_sub(capacity).unwrap_or_else(|| {
            panic!(
                "cannot split {capacity} bytes from reservation of {}: it holds {}",
                self.consumer().name(),
                self.size
            )
        });
        MemoryReservation {
            registration: Arc::clone(&self.registration),
            size: capacity,
        }
    }

    /// An empty reservation of the same consumer.
    pub fn new_empty(&self) -> MemoryReservation {
        MemoryReservation {
            registration: Arc::clone(&self.registration),
            size: 0,
        }
    }

    /// Moves everything this reservation holds into a new reservation of the same
    /// consumer, leaving this one empty.
    pub fn take(&mut self) -> MemoryReservation {
        self.split(self.size)
    }

    /// Moves everything `other` holds into this reservation. `other` must have been
    /// split from this one (or this one from it): both are the same registration of
    /// the same consumer.
    ///
    /// # Panics
    /// If the two reservations belong to different registrations.
    pub fn merge(&mut self, mut other: MemoryReservation) {
        assert!(
            Arc::ptr_eq(&self.registration, &other.registration),
            "cannot merge reservations of different consumers"
        );
        self.size += std::mem::take(&mut other.size);
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        self.free();
    }
}
