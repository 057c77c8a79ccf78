//! The rows a join type outputs without a partner, or with a mark: probe rows once
//! their batch is probed ([`Prober::emit_probe_rows`]: outer, semi, anti, mark,
//! not-in on the probe side), build rows once every probe worker is done
//! ([`emit_build_rows`], from the visited bits), and build rows whose key can never
//! match ([`emit_unmatchable`]). Its own file because it is where the join types
//! differ, after the lookups that are the same for all of them.

use std::ops::Range;

use arrow_array::{BooleanArray, RecordBatch, UInt32Array};
use arrow_buffer::BooleanBuffer;

use super::route::Prober;
use super::state::ProbeState;
use crate::build::{BuiltSide, Partition, Unmatchable};
use crate::context::Facts;
use crate::error::Result;
use crate::join_type::BuildJoinType;
use crate::keys::Keys;
use crate::output::OutputSink;
use crate::plan::JoinPlan;

impl Prober<'_> {
    /// Outputs the probe rows that the join type keeps once the whole batch is probed.
    pub(super) fn emit_probe_rows(
        &self,
        batch: &RecordBatch,
        keys: &Keys,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let n = batch.num_rows();
        let output = &self.plan.output;
        let deferred = &self.deferred;
        // Generic, not `&dyn Fn`: the test of every row inlines.
        fn select(n: usize, deferred: &[bool], keep: impl Fn(usize) -> bool) -> UInt32Array {
            crate::batches::select_rows(0..n as u32, |r| !deferred[r] & keep(r))
        }
        let rows = match self.plan.resolved {
            BuildJoinType::ProbeOuter | BuildJoinType::Full | BuildJoinType::ProbeAnti => {
                select(n, deferred, |r| !self.matched[r])
            }
            BuildJoinType::ProbeSemi => select(n, deferred, |r| self.matched[r]),
            BuildJoinType::ProbeNotIn => {
                if self.built.num_rows == 0 {
                    select(n, deferred, |_| true)
                } else if self.built.has_null_key {
                    return Ok(());
                } else {
                    select(n, deferred, |r| !self.matched[r] && !keys.is_null(r))
                }
            }
            BuildJoinType::ProbeMark => {
                let rows = select(n, deferred, |_| true);
                let marks: Vec<bool> = rows
                    .values()
                    .iter()
                    .map(|&r| self.matched[r as usize])
                    .collect();
                let mark = BooleanArray::new(BooleanBuffer::from(marks), None);
                let out = output.gather(rows.len(), Some((batch, &rows)), None, Some(&mark))?;
                return sink.push(out);
            }
            _ => return Ok(()),
        };
        if rows.is_empty() {
            return Ok(());
        }
        for start in (0..rows.len()).step_by(self.plan.batch_size) {
            let slice = rows.slice(start, self.plan.batch_size.min(rows.len() - start));
            let out = output.gather(slice.len(), Some((batch, &slice)), None, None)?;
            sink.push(out)?;
        }
        Ok(())
    }
}

/// Outputs the build rows `rows` (all when `None`) of in-memory partition `p` that
/// the join type keeps, once every probe worker is done. Spilled partitions are
/// output by their own level.
pub(crate) fn emit_build_rows(
    plan: &JoinPlan,
    built: &BuiltSide,
    state: &ProbeState,
    p: usize,
    rows: Option<Range<usize>>,
    sink: &mut OutputSink,
) -> Result<()> {
    let Partition::InMemory(part) = &built.partitions[p] else {
        return Ok(());
    };
    let rows = rows.unwrap_or(0..part.batch.num_rows());
    let visited = |row: usize| state.visited[p].get(row);
    let facts = state.facts();
    let keep: Box<dyn Fn(usize) -> bool> = match plan.resolved {
        BuildJoinType::BuildOuter | BuildJoinType::Full | BuildJoinType::BuildAnti => {
            Box::new(|r| !visited(r))
        }
        BuildJoinType::BuildSemi => Box::new(visited),
        BuildJoinType::BuildMark => Box::new(|_| true),
        BuildJoinType::BuildNotIn if !facts.probe_non_empty => Box::new(|_| true),
        BuildJoinType::BuildNotIn if facts.probe_has_null => return Ok(()),
        BuildJoinType::BuildNotIn => Box::new(|r| !visited(r)),
        _ => return Ok(()),
    };
    emit_rows(plan, &part.batch, rows, keep, visited, sink)
}

/// Outputs the build rows whose key can never match (unmatched by definition), from
/// memory and from their spill file.
pub(crate) fn emit_unmatchable(
    plan: &JoinPlan,
    unmatchable: &Unmatchable,
    facts: Facts,
    sink: &mut OutputSink,
) -> Result<()> {
    let keep = match plan.resolved {
        BuildJoinType::BuildNotIn => !facts.probe_non_empty,
        other => other.keeps_unmatchable_build_rows(),
    };
    if !keep {
        return Ok(());
    }
    for batch in &unmatchable.batches {
        emit_rows(plan, batch, 0..batch.num_rows(), |_| true, |_| false, sink)?;
    }
    if let Some(file) = &unmatchable.file {
        for batch in file.reader()? {
            let batch = batch?;
            emit_rows(plan, &batch, 0..batch.num_rows(), |_| true, |_| false, sink)?;
        }
    }
    Ok(())
}

/// Outputs the rows `rows` of `batch` that `keep`, a batch at a time (with their
/// `mark` for a mark join).
fn emit_rows(
    plan: &JoinPlan,
    batch: &RecordBatch,
    rows: Range<usize>,
    keep: impl Fn(usize) -> bool,
    mark: impl Fn(usize) -> bool,
    sink: &mut OutputSink,
) -> Result<()> {
    let n = rows.end.min(batch.num_rows());
    let batch_size = plan.batch_size;
    for start in (rows.start..n).step_by(batch_size.max(1)) {
        let end = (start + batch_size).min(n);
        let rows = crate::batches::select_rows(start as u32..end as u32, &keep);
        if rows.is_empty() {
            continue;
        }
        let marks = (plan.resolved == BuildJoinType::BuildMark).then(|| {
            BooleanArray::from(
                rows.values()
                    .iter()
                    .map(|&r| mark(r as usize))
                    .collect::<Vec<_>>(),
            )
        });
        let out = plan
            .output
            .gather(rows.len(), None, Some((batch, &rows)), marks.as_ref())?;
        sink.push(out)?;
    }
    Ok(())
}
