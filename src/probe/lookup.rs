//! The lookups of an in-memory partition's probe rows.
//!
//! ```text
//!  probe_partition: key representation ─► one KeyEq type (words, nullable words, rows)
//!  lookup::<E>:  first entries, by the table's mode (one match per partition):
//!                  Hashed      ─► by hash         (chains compare keys)
//!                  KeyIndexed  ─► by key word     (chains hold only that key)
//!                  Ranged      ─► by key word     (chains compare keys)
//!                prefetch the first links and keys (unless the walks go in row order)
//!                walk the chains: existence only ─► matched / visited bits
//!                                 pairs          ─► pair buffers ─► flush_pairs
//! ```
//!
//! Everything from the first entries down is generic over the key equality `E`, so
//! each combination of key representation and walk is its own loop, with the
//! equality and the chain walk inlined. Its own file because it is the probe's hot
//! path.

use std::ops::ControlFlow;

use arrow_array::{Array, RecordBatch, UInt32Array};

use super::route::Prober;
use crate::build::{BuiltPartition, Partition};
use crate::error::{JoinError, Result};
use crate::keys::{KeyEq, KeyRepr, Keys, NullEquality, NullableWordEq, RowsEq, WordEq};
use crate::output::OutputSink;
use crate::table::{ChainedTable, TableMode};

/// The walks along one partition's chains for the probe rows of one batch: what the
/// two kinds of walk ([`Prober::mark_matches`], [`Prober::collect_pairs`]) share.
struct Walks<'w, E> {
    part: &'w BuiltPartition,
    /// The partition.
    p: usize,
    eq: &'w E,
    /// The partition's probe rows, and the first entry of each one's chain.
    rows: &'w [u32],
    firsts: &'w [u32],
    /// Whether every row of a chain has the key looked up, so that no key is
    /// compared (a key-indexed table of plain words).
    skip_eq: bool,
}

impl Prober<'_> {
    /// Looks up partition `p`'s probe rows, with the key equality their keys'
    /// representation calls for.
    pub(super) fn probe_partition(
        &mut self,
        batch: &RecordBatch,
        keys: &Keys,
        p: usize,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let Partition::InMemory(part) = &self.built.partitions[p] else {
            return Err(JoinError::Internal("probing a spilled partition".into()));
        };
        match (&keys.repr, &part.keys) {
            (
                KeyRepr::Words {
                    words: pw,
                    valid: pv,
                    ..
                },
                KeyRepr::Words {
                    words: bw,
                    valid: bv,
                    ..
                },
            ) => {
                if self.plan.keys.null_equality == NullEquality::NullEqualsNull
                    && (pv.is_some() || bv.is_some())
                {
                    let eq = NullableWordEq {
                        probe: pw,
                        build: bw,
                        probe_valid: pv.as_ref(),
                        build_valid: bv.as_ref(),
                    };
                    self.lookup(batch, part, p, &eq, sink)
                } else {
                    self.lookup(
                        batch,
                        part,
                        p,
                        &WordEq {
                            probe: pw,
                            build: bw,
                        },
                        sink,
                    )
                }
            }
            (KeyRepr::Rows(pr), KeyRepr::Rows(br)) => self.lookup(
                batch,
                part,
                p,
                &RowsEq {
                    probe: pr,
                    build: br,
                },
                sink,
            ),
            _ => Err(JoinError::Internal(
                "build and probe keys differ in representation".into(),
            )),
        }
    }

    /// Finds the candidates of partition `p`'s probe rows.
    fn lookup<E: KeyEq>(
        &mut self,
        batch: &RecordBatch,
        part: &BuiltPartition,
        p: usize,
        eq: &E,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let resolved = self.plan.resolved;
        let has_filter = self.plan.filter.is_some();
        let rows = std::mem::take(&mut self.grouped.rows);
        let range = self.grouped.offsets[p]..self.grouped.offsets[p + 1];
        let mut firsts = std::mem::take(&mut self.firsts);
        let result = (|| {
            let rows = &rows[range];
            let skip_eq = self.first_entries(&part.table, eq, rows, &mut firsts)?;
            prefetch_firsts(&part.table, eq, &firsts, skip_eq);
            let walks = Walks {
                part,
                p,
                eq,
                rows,
                firsts: &firsts,
                skip_eq,
            };
            if !has_filter && !resolved.emits_pairs() {
                // Existence only: no pair is ever materialized.
                self.mark_matches(walks);
                return Ok(());
            }
            self.collect_pairs(batch, walks, sink)
        })();
        self.grouped.rows = rows;
        self.firsts = firsts;
        result
    }

    /// Puts the first entry of each of `rows`' chains in `firsts`, looked up as
    /// `table`'s mode says, and returns whether the rows along the chains have the key
    /// looked up (no key is compared).
    ///
    /// A key-indexed table (dense keys) is looked up by the key itself, and its
    /// chains hold only that key: no key is compared where keys are plain words. A
    /// table bucketed by key value is looked up by the key too; its chains hold
    /// neighbouring keys, compared as in a hashed table.
    #[inline]
    fn first_entries<E: KeyEq>(
        &self,
        table: &ChainedTable,
        eq: &E,
        rows: &[u32],
        firsts: &mut Vec<u32>,
    ) -> Result<bool> {
        match table.mode() {
            TableMode::Hashed => {
                table.first_entries(rows.iter().map(|&r| self.hashes[r as usize]), firsts);
                Ok(false)
            }
            TableMode::KeyIndexed => {
                firsts_by_key(eq, rows, firsts, |word| table.first_direct(word))?;
                Ok(E::EXACT_IN_DIRECT)
            }
            TableMode::Ranged => {
                firsts_by_key(eq, rows, firsts, |word| table.first_ranged(word))?;
                Ok(false)
            }
        }
    }

    /// Walks the chains for a join that only asks whether a row has a partner:
    /// marks probe rows matched (or build rows visited), no pair materialized.
    #[inline]
    fn mark_matches<E: KeyEq>(&mut self, walks: Walks<'_, E>) {
        let Walks {
            part,
            p,
            eq,
            rows,
            firsts,
            skip_eq,
        } = walks;
        let stop_at_first = self.plan.resolved.probe_stops_at_first_match();
        for (&r, &first) in rows.iter().zip(firsts) {
            let r = r as usize;
            let hash = self.hashes[r];
            part.table.for_each_candidate_from(
                first,
                hash,
                &part.hashes,
                E::CHECK_HASH_FIRST,
                |b| {
                    if !(skip_eq || eq.key_eq(r, b)) {
                        return ControlFlow::Continue(());
                    }
                    if stop_at_first {
                        self.matched[r] = true;
                        ControlFlow::Break(())
                    } else if self.state.visited[p].test_and_set(b) {
                        // Another probe row with this key is marking (or has
                        // marked) every build row of it: a hot key costs one
                        // chain walk, not one per probe row.
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            );
        }
    }

    /// Walks the chains collecting candidate pairs, filtered and output a buffer at
    /// a time ([`flush_pairs`](Self::flush_pairs)).
    #[inline]
    fn collect_pairs<E: KeyEq>(
        &mut self,
        batch: &RecordBatch,
        walks: Walks<'_, E>,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let Walks {
            part,
            p,
            eq,
            rows,
            firsts,
            skip_eq,
        } = walks;
        let batch_size = self.plan.work_rows;
        for (&r, &first) in rows.iter().zip(firsts) {
            let r = r as usize;
            let hash = self.hashes[r];
            let mut from = first;
            // A hot key's chain may hold millions of rows: the walk stops when
            // the pair buffers are full (their reservation is for `batch_size`
            // pairs), and goes on from where it stopped once they are emptied.
            loop {
                let mut full = false;
                let rest = part.table.for_each_candidate_from(
                    from,
                    hash,
                    &part.hashes,
                    E::CHECK_HASH_FIRST,
                    |b| {
                        if skip_eq || eq.key_eq(r, b) {
                            self.pair_probe.push(r as u32);
                            self.pair_build.push(b as u32);
                            if self.pair_probe.len() >= batch_size {
                                full = true;
                                return ControlFlow::Break(());
                            }
                        }
                        ControlFlow::Continue(())
                    },
                );
                if full {
                    self.flush_pairs(batch, part, p, sink)?;
                }
                match rest {
                    Some(rest) => from = rest,
                    None => break,
                }
            }
        }
        self.flush_pairs(batch, part, p, sink)
    }

    /// Filters the pending candidate pairs, records matches and outputs pairs, in
    /// slices of at most one batch.
    fn flush_pairs(
        &mut self,
        batch: &RecordBatch,
        part: &BuiltPartition,
        p: usize,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let batch_size = self.plan.work_rows;
        let mut start = 0;
        while start < self.pair_probe.len() {
            let end = (start + batch_size).min(self.pair_probe.len());
            let probe_rows = UInt32Array::from(self.pair_probe[start..end].to_vec());
            let build_rows = UInt32Array::from(self.pair_build[start..end].to_vec());
            start = end;
            let (probe_rows, build_rows) = match &self.plan.filter {
                None => (probe_rows, build_rows),
                Some(filter) => {
                    let passed = filter.evaluate(batch, &probe_rows, &part.batch, &build_rows)?;
                    if passed.true_count() == 0 {
                        continue;
                    }
                    let keep = |a: &UInt32Array| -> Result<UInt32Array> {
                        let filtered = arrow_select::filter::filter(a, &passed)?;
                        Ok(filtered
                            .as_any()
                            .downcast_ref::<UInt32Array>()
                            .cloned()
                            .unwrap_or_else(|| UInt32Array::from(Vec::<u32>::new())))
                    };
                    (keep(&probe_rows)?, keep(&build_rows)?)
                }
            };
            if self.plan.resolved.tracks_matched_probe_rows() {
                for &r in probe_rows.values() {
                    self.matched[r as usize] = true;
                }
            }
            if self.plan.resolved.tracks_visited_build_rows() {
                for &b in build_rows.values() {
                    self.state.visited[p].set(b as usize);
                }
            }
            if self.plan.resolved.emits_pairs() {
                sink.push_pairs(
                    &self.plan.output,
                    (batch, &probe_rows),
                    (&part.batch, &build_rows),
                )?;
            }
        }
        self.pair_probe.clear();
        self.pair_build.clear();
        Ok(())
    }
}

/// Puts the first entry of each of `rows`' chains in `firsts`, found by the probe
/// row's key word with `first` (0 for a null key, which matches nothing in a table
/// looked up by key).
///
/// # Errors
/// [`JoinError::Internal`] when keys are not words: tables are looked up by key only
/// for one-word keys.
#[inline(always)]
fn firsts_by_key<E: KeyEq>(
    eq: &E,
    rows: &[u32],
    firsts: &mut Vec<u32>,
    first: impl Fn(u64) -> u32,
) -> Result<()> {
    if !E::WORDS {
        return Err(JoinError::Internal(
            "a key-indexed table for keys that are not words".into(),
        ));
    }
    firsts.clear();
    firsts.extend(
        rows.iter()
            .map(|&r| eq.probe_word(r as usize).map_or(0, &first)),
    );
    Ok(())
}

/// Starts loading the first candidates' links and keys, so that the walks find them
/// in cache (the lookups of the first entries already overlapped) — unless the walks
/// go through the build rows in order, which the processor reads ahead by itself
/// (as the spilled pairs of tables sorted by their join key do, with one-row chains
/// flagged as well).
#[inline]
fn prefetch_firsts<E: KeyEq>(table: &ChainedTable, eq: &E, firsts: &[u32], skip_eq: bool) {
    if !table.walks_in_row_order(firsts) {
        for &first in firsts {
            table.prefetch_link(first);
            if !skip_eq {
                if let Some(b) = table.first_row(first) {
                    eq.prefetch_build(b);
                }
            }
        }
    }
}
