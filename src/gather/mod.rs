//! Rows gathered straight into the batch they end in, for columns of every type the
//! engine spills.
//!
//! Rows bound for a spill file arrive a few at a time (a probe batch's rows of one
//! partition: a hundred or so when a build has a hundred spilled partitions) and are
//! written a batch at a time. Taking each arrival into a small batch of its own and
//! concatenating them before the write copies every value twice and allocates a few
//! buffers per arrival — and for strings it does worse: `take` of a view array
//! copies only the views, so each small batch shares its input's data buffers, a
//! concatenation of them lists those buffers once per small batch, and an IPC
//! message carries every buffer an array has (many times the rows' own bytes, for
//! rows of a wide string payload). [`GatherBuffer`] copies each value once, offsets and views
//! rewritten to point into data buffers of its own, into buffers that grow until the
//! batch is written: what it holds, and what a spill file gets, is the rows' own
//! bytes.
//!
//! The build side gathers each partition's rows the same way, into buffers that become
//! the partition's batch when the input ends: every build value is copied once, from
//! the input batch to where the probe reads it (no fragments, and no concatenation of
//! them). Those buffers grow large, so past a threshold (`MAP_MIN_BYTES`) a buffer
//! lives in an anonymous memory map that grows with `mremap` (`values`).
//!
//! ```text
//!  probe batch ─ rows [3, 17, 40] ─► GatherBuffer: per column its values (offsets +
//!  probe batch ─ rows [1, 9] ───────►   data, views + blocks, keys + values) + validity,
//!                                       until it is full ─► finish() ─► RecordBatch
//! ```
//!
//! What rows will add is measured before they are appended ([`Growth::of`], with no
//! lock held), so that it is reserved first ([`GatherBuffer::capacity_after`]).
//! Nested types (lists, structs, maps, unions) are not gathered: the join takes and
//! compacts them instead (`output::owned_batch`).
//!
//! # Files
//!
//! | file | holds |
//! |---|---|
//! | `buffer` | [`GatherBuffer`] (the rows, column by column, and the batch they make) and [`Growth`] |
//! | `schema` | what a schema allows: gatherable, fixed widths, halvable columns |
//! | `column` | one column: the layout that gathers it, and what every layout shares |
//! | `fixed` | fixed-width values, narrowed decimals, halved `Int64`s |
//! | `offsets` | variable-width values behind offsets (`Utf8`, `Binary`, large forms) |
//! | `views` | view values (`Utf8View`, `BinaryView`) and their data blocks |
//! | `dict` | dictionaries: keys remapped, values gathered once |
//! | `bitmap` | validity bits and `Boolean` values |
//! | `values` | the growing byte buffer under them all: heap, then an `mremap`ed anonymous map |

mod bitmap;
mod buffer;
mod column;
mod dict;
mod fixed;
mod offsets;
mod schema;
mod values;
mod views;

pub use buffer::{GatherBuffer, Growth};
pub(crate) use schema::{fixed_widths, gatherable, halvable, halvable_fits};

#[cfg(test)]
mod tests;
