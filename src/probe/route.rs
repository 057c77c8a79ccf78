//! A probe worker ([`Prober`]) and the first steps of each batch: its keys evaluated
//! and hashed (or the hashes a spill file kept read back), its rows grouped by
//! partition, and each partition's rows sent on: to a lookup where the partition is
//! in memory (`lookup.rs`), to the partition's probe spill file where it spilled,
//! less the rows its bloom filter rules out (`spill.rs`). Its own file because it is
//! the one place that decides, per batch, where each row goes.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_data::ArrayData;
use arrow_select::take::take_record_batch;

use super::spill::BloomTally;
use super::state::ProbeState;
use crate::bloom::Bloom;
use crate::build::{BuiltSide, Partition};
use crate::context::Ctx;
use crate::error::Result;
use crate::hash::hash_keys;
use crate::join_type::BuildJoinType;
use crate::output::OutputSink;
use crate::partition::{HashBits, PartitionedRows};
use crate::plan::JoinPlan;

/// One probe worker's buffers, reused from batch to batch.
pub(crate) struct Prober<'a> {
    pub(super) plan: &'a JoinPlan,
    ctx: &'a Ctx<'a>,
    bits: HashBits,
    pub(super) built: &'a BuiltSide,
    pub(super) state: &'a ProbeState,
    /// Whether probe rows (unmatched, semi, anti, mark, not-in) are output per batch.
    output_probe_rows: bool,
    /// Whether a probe row that repeats the key of the row before it is dropped:
    /// where only the probe's key set counts and some partition spilled, so that a
    /// run of equal keys (the line items of an order) is written once. (Not where
    /// every partition is in memory: the repeated lookups find their buckets in
    /// cache, and finding the runs cost more than it saved.)
    spills_key_runs_once: bool,
    /// Per probe row of the current batch: sent to a spill file, decided later?
    pub(super) deferred: Vec<bool>,
    pub(super) hashes: Vec<u64>,
    pub(super) grouped: PartitionedRows,
    /// Per probe row of the current batch: matched (and passed the filter)?
    pub(super) matched: Vec<bool>,
    /// First table entries of the rows being looked up.
    pub(super) firsts: Vec<u32>,
    /// Candidate pairs not yet filtered/output.
    pub(super) pair_probe: Vec<u32>,
    pub(super) pair_build: Vec<u32>,
    /// What the spilled partitions' bloom filters have done for this worker, all
    /// together: keys are hash-partitioned, so a filter that rules out few probe rows
    /// of one partition rules out few of any. (By the trial schedule, a tally per
    /// partition would run a trial in every spilled partition, testing a large share
    /// of the rows where a hundred or so spilled; one per worker runs one.)
    bloom_tally: BloomTally,
    /// The current batch's columns as `ArrayData`, made by the first partition that
    /// gathers rows from it ([`crate::gather`]); cleared for every batch.
    batch_data: Vec<ArrayData>,
    /// Per column of `batch_data`: gathered for a spill file as `Int32`, if it may
    /// be and all its values fit
    /// ([`GatherBuffer::halving`](crate::gather::GatherBuffer::halving)).
    batch_fits: Vec<bool>,
}

impl<'a> Prober<'a> {
    pub fn new(
        ctx: &'a Ctx<'a>,
        bits: HashBits,
        built: &'a BuiltSide,
        state: &'a ProbeState,
    ) -> Self {
        Self {
            plan: ctx.plan,
            ctx,
            bits,
            built,
            state,
            output_probe_rows: true,
            spills_key_runs_once: ctx.plan.filter.is_none()
                && ctx.plan.resolved.probe_keys_suffice()
                && built
                    .partitions
                    .iter()
                    .any(|p| matches!(p, Partition::Spilled(_))),
            deferred: Vec::new(),
            firsts: Vec::new(),
            hashes: Vec::new(),
            grouped: PartitionedRows::default(),
            matched: Vec::new(),
            pair_probe: Vec::with_capacity(ctx.plan.work_rows),
            pair_build: Vec::with_capacity(ctx.plan.work_rows),
            bloom_tally: BloomTally::default(),
            batch_data: Vec::new(),
            batch_fits: Vec::new(),
        }
    }

    /// Leaves probe rows to the caller, who reads [`matched`](Self::matched) after each
    /// batch (the chunked fallback, where a row's fate depends on every chunk).
    pub fn without_probe_row_output(mut self) -> Self {
        self.output_probe_rows = false;
        self
    }

    /// Per row of the last probed batch: matched (and passed the filter)?
    pub fn matched(&self) -> &[bool] {
        &self.matched
    }

    /// Probes one batch and sends its output.
    pub fn probe(
        &mut self,
        batch: &RecordBatch,
        stored_hashes: Option<&[u64]>,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let plan = self.plan;
        let n = batch.num_rows();
        self.matched.clear();
        self.matched.resize(n, false);
        if n == 0 {
            return Ok(());
        }
        self.state.probe_non_empty.store(true, Ordering::Relaxed);
        let keys = plan.keys.evaluate(batch, false)?;
        if keys.nulls.is_some() {
            self.state.probe_has_null.store(true, Ordering::Relaxed);
        }
        let resolved = plan.resolved;
        self.matched.clear();
        self.matched.resize(n, false);
        self.deferred.clear();
        self.deferred.resize(n, false);

        // NOT IN with the subquery on the build side: two facts decide most rows.
        let skip_lookup = resolved == BuildJoinType::ProbeNotIn
            && (self.built.num_rows == 0 || self.built.has_null_key);
        if !skip_lookup {
            // One partition whose table is looked up by key (a spilled pair joined
            // whole): no hash is ever read.
            let unhashed = self.bits.fan_out() == 1
                && matches!(&self.built.partitions[..], [Partition::InMemory(part)] if part.table.by_key());
            match stored_hashes {
                Some(stored) => {
                    self.hashes.clear();
                    self.hashes.extend_from_slice(stored);
                }
                None if unhashed => {
                    self.hashes.clear();
                    self.hashes.resize(n, 0);
                }
                None => hash_keys(&keys.columns, n, &mut self.hashes)?,
            }
            let never_matches = plan.nulls_never_match();
            let excluded = keys.nulls.as_ref().filter(|_| never_matches);
            let first_of_runs = self
                .spills_key_runs_once
                .then(|| keys.first_of_runs(excluded))
                .flatten();
            self.grouped
                .group(self.bits, &self.hashes, first_of_runs.as_ref().or(excluded));
            self.batch_data.clear();
            for p in 0..self.bits.fan_out() {
                if self.grouped.partition(p).is_empty() {
                    continue;
                }
                match &self.built.partitions[p] {
                    Partition::InMemory(_) => self.probe_partition(batch, &keys, p, sink)?,
                    Partition::Spilled(spilled) => self.route(batch, p, spilled.bloom.as_ref())?,
                }
            }
        }
        if self.output_probe_rows {
            self.emit_probe_rows(batch, &keys, sink)?;
        }
        Ok(())
    }

    /// Sends the rows of spilled partition `p` that may match to its probe spill file;
    /// the others cannot match and stay unmatched in this batch.
    fn route(&mut self, batch: &RecordBatch, p: usize, bloom: Option<&Bloom>) -> Result<()> {
        let bloom = bloom.filter(|_| self.bloom_tally.consults());
        let candidates = self.grouped.partition(p);
        // Without a filter to consult, the partition's rows as grouped, not a copy.
        let rows: Cow<'_, [u32]> = match bloom {
            Some(bloom) => Cow::Owned(bloom.select(candidates, |r| self.hashes[r])),
            None => Cow::Borrowed(candidates),
        };
        let ctx = self.ctx;
        let skipped = candidates.len() - rows.len();
        self.bloom_tally
            .count(bloom.is_some(), candidates.len(), skipped);
        ctx.metrics
            .probe_rows_skipped
            .fetch_add(skipped as u64, Ordering::Relaxed);
        if rows.is_empty() {
            return Ok(());
        }
        for &r in rows.iter() {
            self.deferred[r as usize] = true;
        }
        if self.state.gathers {
            // The batch's columns as ArrayData, once per batch (not per partition).
            if self.batch_data.is_empty() {
                self.batch_data = batch.columns().iter().map(|c| c.to_data()).collect();
                self.batch_fits = crate::gather::halvable_fits(batch, &self.state.halvable);
            }
            let hashes = ctx.plan.spills_hashes().then_some(&self.hashes[..]);
            return self.state.spill_gathered(
                ctx,
                p,
                &self.batch_data,
                &self.batch_fits,
                &rows,
                hashes,
            );
        }
        let hashes: Vec<u64> = if ctx.plan.spills_hashes() {
            rows.iter().map(|&r| self.hashes[r as usize]).collect()
        } else {
            Vec::new()
        };
        // (Compacted: a take of a nested column of views or dictionaries shares its
        // input's buffers, which the file would get whole.)
        let fragment = crate::output::owned_batch(take_record_batch(
            batch,
            &UInt32Array::from(rows.into_owned()),
        )?)?;
        self.state.spill_rows(ctx, p, fragment, hashes)
    }
}
