//! The error a pool returns when it refuses a reservation.

use std::fmt;

/// What one consumer held when a reservation failed (see [`TrackConsumersPool`]).
///
/// [`TrackConsumersPool`]: crate::TrackConsumersPool
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerUsage {
    /// The consumer's name.
    pub name: String,
    /// The consumer's id, unique within the process.
    pub id: usize,
    /// Whether the consumer can spill.
    pub can_spill: bool,
    /// Bytes the consumer held when the error was made.
    pub reserved_bytes: usize,
}

/// Errors of the memory pools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A pool refused to grow a reservation.
    #[error(
        "resources exhausted: {consumer} failed to reserve {requested_bytes} bytes, \
         {available_bytes} of {limit_bytes} bytes available{}",
        TopConsumers(top_consumers)
    )]
    ResourcesExhausted {
        /// Name of the consumer whose reservation failed.
        consumer: String,
        /// The additional bytes that were asked for.
        requested_bytes: usize,
        /// The bytes that consumer could still have obtained.
        available_bytes: usize,
        /// The pool's limit in bytes.
        limit_bytes: usize,
        /// The largest consumers at the time, largest first; empty unless the pool
        /// tracks consumers ([`TrackConsumersPool`](crate::TrackConsumersPool)).
        top_consumers: Vec<ConsumerUsage>,
    },
}

impl MemoryError {
    /// The additional bytes that were asked for.
    pub fn requested_bytes(&self) -> usize {
        match self {
            MemoryError::ResourcesExhausted {
                requested_bytes, ..
            } => *requested_bytes,
        }
    }

    /// The name of the consumer whose reservation failed.
    pub fn consumer(&self) -> &str {
        match self {
            MemoryError::ResourcesExhausted { consumer, .. } => consumer,
        }
    }
}

struct TopConsumers<'a>(&'a [ConsumerUsage]);

impl fmt::Display for TopConsumers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        f.write_str("; largest consumers: ")?;
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}#{} {} bytes", c.name, c.id, c.reserved_bytes)?;
        }
        Ok(())
    }
}
