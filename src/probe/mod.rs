//! The probe phase: stream the probe input past the built tables.
//!
//! ```text
//!  probe batch ─► keys ─► hash ─► group rows by partition
//!     for each partition: walk the chain of each row's bucket
//!        hash equal? key equal? ─► candidate pair (probe row, build row)
//!     candidate pairs, at most one output batch at a time:
//!        residual filter ─► passing pairs ─► mark probe row matched / build row visited
//!                                         └► gather output (pair joins)
//!     end of batch: unmatched / semi / anti / mark / not-in probe rows
//!  end of input (all workers): unmatched / semi / anti / mark / not-in build rows
//! ```
//!
//! The built side is shared read-only by every worker; the mutable state of one
//! execution lives in [`ProbeState`] (visited bits per build row, and the facts of the
//! probe side that `NOT IN` with the build on the outer side needs). Each worker has
//! a [`Prober`], its buffers reused from batch to batch.
//!
//! What each file holds:
//! - `route.rs`: the [`Prober`] and the first steps of a batch: keys hashed, rows
//!   grouped by partition, and each partition's rows routed to a lookup (in memory)
//!   or to its probe spill file (spilled);
//! - `lookup.rs`: the lookups of an in-memory partition, one loop per key
//!   representation and table mode, and the candidate pairs they collect, filtered
//!   and output a batch at a time;
//! - `visited.rs`: [`VisitedBits`], the build rows some probe row matched;
//! - `state.rs`: [`ProbeState`], what the workers of one execution share;
//! - `spill.rs`: probe rows of spilled partitions on their way to disk: buffered per
//!   partition, written when full or when memory is short, and the tally that
//!   decides whether the partitions' bloom filters are worth consulting;
//! - `in_flight.rs`: buffers taken out of their partition to be written outside its
//!   lock (the protocol itself, shared with the build, is [`crate::write_out`]);
//! - `emit.rs`: the rows a join type outputs without a partner: probe rows after
//!   each batch, build rows once every worker is done, and build rows whose key can
//!   never match.

mod emit;
mod in_flight;
mod lookup;
mod route;
mod spill;
mod state;
mod visited;

pub(crate) use emit::{emit_build_rows, emit_unmatchable};
pub(crate) use route::Prober;
pub(crate) use state::ProbeState;
pub(crate) use visited::VisitedBits;
