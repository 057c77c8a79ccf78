//! [`ProbeState`]: what the probe workers of one execution against a built side
//! share, and write at once: the visited bits, the probe facts `NOT IN` needs, and
//! the buffers and files of the probe rows of spilled partitions (written by
//! `spill.rs`). Its own file so that the state and its sizing read apart from the
//! code that writes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use spilljoin_memory::MemoryReservation;

use super::spill::SpillSlot;
use super::VisitedBits;
use crate::build::{BuiltSide, Partition};
use crate::context::{Ctx, Facts, Level, LevelFiles};
use crate::error::Result;
use crate::gather::gatherable;
use crate::write_out::WritesOut;

/// The mutable state of one execution against a built side.
#[derive(Debug)]
pub(crate) struct ProbeState {
    /// Visited bits per partition, for joins that output build rows at the end.
    pub visited: Vec<VisitedBits>,
    /// Whether the probe input had any row (this level's, or inherited).
    pub probe_non_empty: AtomicBool,
    /// Whether some probe row had a null key (this level's, or inherited).
    pub probe_has_null: AtomicBool,
    /// Per partition: where probe rows of spilled partitions go.
    pub(super) spills: Vec<Option<SpillSlot>>,
    /// Buffers taken out of `spills`, being written.
    pub(super) writes_out: WritesOut,
    pub(super) spill_schema: SchemaRef,
    /// The schema its files hold ([`spilljoin_spill::file_schema`]: decimals of at
    /// most 18 digits as `Int64`, view columns as offsets), in which rows are
    /// gathered: narrowed once, as
    /// they are copied, rather than copied wide and narrowed again by the writer.
    pub(super) gather_schema: SchemaRef,
    /// Whether every column of the gather schema can be gathered ([`crate::gather`]).
    pub(super) gathers: bool,
    /// Per column of the gather schema: `Int64`, so gathered as `Int32` when a
    /// batch's values fit
    /// ([`GatherBuffer::halving`](crate::gather::GatherBuffer::halving)).
    pub(super) halvable: Vec<bool>,
    /// Where spilled partitions' probe rows are written.
    pub(super) files: LevelFiles,
    _reservation: MemoryReservation,
}

impl ProbeState {
    /// Fresh state for probing `built`; visited bits are reserved in `reservation`.
    pub fn new(
        ctx: &Ctx<'_>,
        level: Level,
        built: &BuiltSide,
        mut reservation: MemoryReservation,
        facts: Facts,
    ) -> Result<Self> {
        let plan = ctx.plan;
        let rows_of = |p: &Partition| match p {
            Partition::InMemory(part) => part.batch.num_rows(),
            Partition::Spilled(_) => 0,
        };
        let visited = if plan.resolved.tracks_visited_build_rows() {
            let bytes = built
                .partitions
                .iter()
                .map(|p| VisitedBits::bytes_for(rows_of(p)))
                .sum();
            reservation.try_grow(bytes)?;
            built
                .partitions
                .iter()
                .map(|p| VisitedBits::new(rows_of(p)))
                .collect()
        } else {
            Vec::new()
        };
        let spills = built
            .partitions
            .iter()
            .map(|part| {
                matches!(part, Partition::Spilled(_))
                    .then(|| SpillSlot::new(reservation.new_empty()))
            })
            .collect();
        let gather_schema = spilljoin_spill::file_schema(&plan.spill_schema(false));
        Ok(Self {
            visited,
            probe_non_empty: AtomicBool::new(facts.probe_non_empty),
            probe_has_null: AtomicBool::new(facts.probe_has_null),
            spills,
            writes_out: WritesOut::default(),
            spill_schema: plan.spill_schema(false),
            gather_schema: Arc::clone(&gather_schema),
            gathers: gatherable(&gather_schema),
            halvable: crate::gather::halvable(&gather_schema),
            files: LevelFiles::new(ctx, level.depth, false),
            _reservation: reservation,
        })
    }

    /// The probe facts seen so far.
    pub fn facts(&self) -> Facts {
        Facts {
            probe_non_empty: self.probe_non_empty.load(Ordering::Relaxed),
            probe_has_null: self.probe_has_null.load(Ordering::Relaxed),
        }
    }
}
