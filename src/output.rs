//! Output: which columns a join produces, gathering them, and batching them.
//!
//! Output rows are gathered column by column with Arrow's `take` kernel from index
//! arrays (a null index makes a null value, which is how outer joins pad the side that
//! did not match), never row by row. Gathered pieces are coalesced into batches of
//! the configured size before they are handed to the caller; a piece of half a batch
//! or more is passed on as it is (cut into equal slices of at most a batch) rather
//! than copied again, and a worker's last batch may be smaller.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{
    new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::coalesce::BatchCoalescer;
use arrow_select::take::take;

use crate::channel::OutputChannel;
use crate::error::{JoinError, Result, Side};
use crate::gather::{GatherBuffer, Growth};
use crate::join_type::JoinType;

/// Where one output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A column of the build input.
    Build(usize),
    /// A column of the probe input.
    Probe(usize),
    /// The mark column of a mark join.
    Mark,
}

/// The output columns of a join and where each comes from.
#[derive(Debug, Clone)]
pub(crate) struct OutputLayout {
    pub schema: SchemaRef,
    pub sources: Vec<Source>,
}

/// The name of the mark join's boolean column.
pub const MARK_COLUMN: &str = "mark";

impl OutputLayout {
    /// The output of `join_type` over `left` and `right` with `build` as the build
    /// side: left columns, then right columns (as the join type keeps them), then
    /// `mark`. A name present on both sides is written `left.NAME` / `right.NAME`.
    /// `projection` picks and orders columns of that full output.
    pub fn new(
        join_type: JoinType,
        build: Side,
        left: &Schema,
        right: &Schema,
        projection: Option<&[usize]>,
    ) -> Result<Self> {
        let resolved = join_type.resolve(build);
        let (fields, sources) = Self::full(join_type, build, left, right);
        debug_assert_eq!(resolved.emits_pairs(), join_type.output_sides().len() == 2);
        let (fields, sources) = match projection {
            Some(projection) => Self::project(&fields, &sources, projection)?,
            None => (fields, sources),
        };
        Ok(Self {
            schema: Arc::new(Schema::new(fields)),
            sources,
        })
    }

    /// Every output column of `join_type` (before a projection) and where each
    /// comes from: the sides' columns as [`new`](Self::new) names them, a side
    /// padded with nulls nullable, then `mark`.
    fn full(
        join_type: JoinType,
        build: Side,
        left: &Schema,
        right: &Schema,
    ) -> (Vec<Field>, Vec<Source>) {
        let sides = join_type.output_sides();
        let shared = Self::shared_names(sides.len() == 2, left, right);
        let mut fields = Vec::new();
        let mut sources = Vec::new();
        for &side in sides {
            let schema = if side == Side::Left { left } else { right };
            // A side's columns are null-padded when the other side's unmatched rows
            // are output.
            let padded = matches!(
                (join_type, side),
                (JoinType::Full, _) | (JoinType::Left, Side::Right) | (JoinType::Right, Side::Left)
            );
            for (i, f) in schema.fields().iter().enumerate() {
                let name = if shared.contains(f.name()) {
                    format!("{side}.{}", f.name())
                } else {
                    f.name().clone()
                };
                fields.push(Field::new(
                    name,
                    f.data_type().clone(),
                    f.is_nullable() || padded,
                ));
                sources.push(if side == build {
                    Source::Build(i)
                } else {
                    Source::Probe(i)
                });
            }
        }
        if join_type == JoinType::LeftMark {
            fields.push(Field::new(MARK_COLUMN, DataType::Boolean, false));
            sources.push(Source::Mark);
        }
        (fields, sources)
    }

    /// The column names both sides have, when both are output (`both`): those are
    /// written with their side's name in front.
    fn shared_names(both: bool, left: &Schema, right: &Schema) -> HashSet<String> {
        let names = |s: &Schema| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<HashSet<_>>()
        };
        if both {
            names(left).intersection(&names(right)).cloned().collect()
        } else {
            HashSet::new()
        }
    }

    /// The columns `projection` picks of `fields` (and their `sources`), in its
    /// order.
    ///
    /// # Errors
    /// [`JoinError::InvalidJoin`] if an index is past the columns.
    fn project(
        fields: &[Field],
        sources: &[Source],
        projection: &[usize],
    ) -> Result<(Vec<Field>, Vec<Source>)> {
        let (mut picked_fields, mut picked_sources) = (vec![], vec![]);
        for &i in projection {
            if i >= fields.len() {
                return Err(JoinError::InvalidJoin(format!(
                    "projection index {i} is out of range: the join has {} output columns",
                    fields.len()
                )));
            }
            picked_fields.push(fields[i].clone());
            picked_sources.push(sources[i]);
        }
        Ok((picked_fields, picked_sources))
    }

    /// Gathers `num_rows` output rows: probe columns by `probe` indices, build columns
    /// by `build` indices (`None`: all null), the mark column from `mark`.
    pub fn gather(
        &self,
        num_rows: usize,
        probe: Option<(&RecordBatch, &UInt32Array)>,
        build: Option<(&RecordBatch, &UInt32Array)>,
        mark: Option<&BooleanArray>,
    ) -> Result<RecordBatch> {
        let columns = self
            .sources
            .iter()
            .zip(self.schema.fields())
            .map(|(source, field)| -> Result<ArrayRef> {
                let from = match source {
                    Source::Probe(i) => probe.map(|(b, idx)| (b.column(*i), idx)),
                    Source::Build(i) => build.map(|(b, idx)| (b.column(*i), idx)),
                    Source::Mark => {
                        return mark
                            .map(|m| Arc::new(m.clone()) as ArrayRef)
                            .ok_or_else(|| JoinError::Internal("mark column without marks".into()))
                    }
                };
                Ok(match from {
                    // (A build partition held in the spill files' form is widened
                    // back to the output's type: `build::collector::held_schema`.)
                    Some((column, indices)) => spilljoin_spill::widen_column(
                        &take(column, indices, None)?,
                        field.data_type(),
                    )?,
                    None => new_null_array(field.data_type(), num_rows),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(num_rows)),
        )?)
    }
}

/// One worker's output: coalesces gathered pieces into full batches and sends them to
/// the caller, every byte of them reserved ([`crate::channel`]): pieces from the
/// moment they are pushed, batches until the caller takes them.
///
/// A batch holds at most `max_batch_bytes` (a piece of the limit): with wide rows
/// the sink makes batches of fewer rows than the batch size, so that what waits for
/// the caller stays a small part of the limit.
pub(crate) struct OutputSink {
    coalescer: BatchCoalescer,
    schema: SchemaRef,
    /// Rows a batch gets: the batch size, or fewer for wide rows.
    target_rows: usize,
    max_batch_bytes: usize,
    channel: OutputChannel,
    /// Bytes reserved for the pieces in the coalescer, and their rows.
    assembled: usize,
    assembled_rows: usize,
    rows: u64,
    owned_buffers: bool,
    /// Where matched pairs are gathered, if they can be ([`OutputSink::with_pairs`]).
    pairs: Option<PairBuffer>,
}

/// Matched pairs gathered straight into the batch they are sent in
/// ([`OutputSink::push_pairs`]): each value copied once. Taking each column of a
/// piece's pairs and then copying the taken piece into a batch in the coalescer
/// copied every value twice and allocated a buffer a column a piece, a cost per
/// piece that dominates under a small limit, where pieces are a few hundred rows.
#[derive(Debug)]
struct PairBuffer {
    rows: GatherBuffer,
    sources: Vec<Source>,
    /// What the rows are reserved for in the output gate.
    reserved: usize,
    /// The bytes a row of the last batch sent took (0 before the first).
    row_bytes: usize,
}

impl OutputSink {
    pub fn new(
        schema: SchemaRef,
        batch_size: usize,
        max_batch_bytes: usize,
        channel: OutputChannel,
    ) -> Self {
        Self {
            coalescer: coalescer(&schema, batch_size),
            schema,
            target_rows: batch_size.max(1),
            max_batch_bytes: max_batch_bytes.max(1),
            channel,
            assembled: 0,
            assembled_rows: 0,
            rows: 0,
            owned_buffers: false,
            pairs: None,
        }
    }

    /// Gathers matched pairs ([`push_pairs`](Self::push_pairs)) straight into the
    /// batches sent, when every column of `layout` comes from a side (no mark) and
    /// can be gathered.
    pub fn with_pairs(mut self, layout: &OutputLayout) -> Self {
        // (Rows of no columns are counted by a batch's row count, which only the
        // `take` path sets.)
        let direct = crate::gather::gatherable(&layout.schema)
            && !layout.sources.is_empty()
            && !layout.sources.contains(&Source::Mark);
        self.pairs = direct
            .then(|| GatherBuffer::new(Arc::clone(&layout.schema)).ok())
            .flatten()
            .map(|rows| PairBuffer {
                rows,
                sources: layout.sources.clone(),
                reserved: 0,
                row_bytes: 0,
            });
        self
    }

    /// Adds the output rows of matched pairs of `layout`: probe row `probe_rows[k]`
    /// of `probe` with build row `build_rows[k]` of `build`. Gathered straight into
    /// the batch being made ([`with_pairs`](Self::with_pairs)), or taken and pushed
    /// when a piece of half a batch or more would pass the coalescer as it is (a
    /// `take` copies a view column's views, not its values), a column's type is not
    /// the output's, or an index is null (a null row, which only `take` makes). Half a
    /// batch of rows as wide as those gathered before, whatever the pair buffer holds
    /// (its rows wait for the next pairs): under a small limit, a batch of wide rows
    /// is a few hundred rows, and comparing with half the batch size sent every piece
    /// to be copied, strings and all.
    ///
    /// # Errors
    /// As [`push`](Self::push); an arrow error if the rows are not in the batches.
    pub fn push_pairs(
        &mut self,
        layout: &OutputLayout,
        probe: (&RecordBatch, &UInt32Array),
        build: (&RecordBatch, &UInt32Array),
    ) -> Result<()> {
        let n = probe.1.len();
        if build.1.len() != n {
            return Err(JoinError::Internal("pairs of unequal sides".into()));
        }
        let columns = self.pairs.as_ref().and_then(|pairs| {
            let whole = n >= self.batch_rows(pairs.row_bytes) / 2;
            let nulls = probe.1.null_count() + build.1.null_count() > 0;
            (!whole && !nulls)
                .then(|| pair_columns(&pairs.sources, &self.schema, probe.0, build.0))?
        });
        let Some(columns) = columns else {
            return self.push(layout.gather(n, Some(probe), Some(build), None)?);
        };
        let (probe_rows, build_rows) = (probe.1.values(), build.1.values());
        let mut start = 0;
        while start < n {
            let end = self.append_pairs(&columns, (probe_rows, build_rows), start)?;
            start = end;
        }
        Ok(())
    }

    /// Appends pairs from `start` on (of `rows`, probe's and build's) to the pair
    /// buffer, as many as fit in the batch being made; sends it when full. Returns
    /// where it stopped.
    fn append_pairs(
        &mut self,
        columns: &[(ArrayData, bool)],
        rows: (&[u32], &[u32]),
        start: usize,
    ) -> Result<usize> {
        // Wide rows: as many as the last batch's rows say fit in a batch's bytes.
        let batch_rows = self.batch_rows(self.pairs.as_ref().map_or(0, |p| p.row_bytes));
        let Some(pairs) = self.pairs.as_mut() else {
            return Err(JoinError::Internal("pairs without a pair buffer".into()));
        };
        let parts = |end: usize| -> Vec<(&ArrayData, &[u32])> {
            let side = |probe: bool| {
                if probe {
                    &rows.0[start..end]
                } else {
                    &rows.1[start..end]
                }
            };
            columns
                .iter()
                .map(|(data, probe)| (data, side(*probe)))
                .collect()
        };
        let held = pairs.rows.len();
        let room = batch_rows.saturating_sub(held);
        if room == 0 && held > 0 {
            self.send_pairs()?;
            return Ok(start);
        }
        let mut end = (start + room.max(1)).min(rows.0.len());
        let mut growth = Growth::of_columns(&parts(end));
        if !pairs.rows.admits(&[], &growth) {
            self.send_pairs()?;
            return Ok(start);
        }
        let mut need = pairs.rows.capacity_after(&growth);
        if need > self.max_batch_bytes && end - start > 1 && pairs.row_bytes == 0 {
            // The first batch of wide rows: as many as fit with those held (a row at
            // least, into an empty buffer).
            let per_row = need / (held + end - start);
            let fit = (self.max_batch_bytes / per_row.max(1)).saturating_sub(held);
            if fit == 0 && held > 0 {
                self.send_pairs()?;
                return Ok(start);
            }
            end = start + fit.clamp(1, end - start);
            growth = Growth::of_columns(&parts(end));
            need = pairs.rows.capacity_after(&growth);
        }
        // (Nothing more to reserve is no reason to wait for the caller.)
        if need > pairs.reserved {
            self.channel
                .gate
                .reserve_assembling(need - pairs.reserved)?;
            pairs.reserved = need;
        }
        pairs.rows.append_columns(&parts(end))?;
        if pairs.rows.len() >= self.target_rows || need >= self.max_batch_bytes {
            self.send_pairs()?;
        }
        Ok(end)
    }

    /// Sends the pairs gathered, if any.
    fn send_pairs(&mut self) -> Result<()> {
        let Some(pairs) = self.pairs.as_mut().filter(|p| !p.rows.is_empty()) else {
            return Ok(());
        };
        let len = pairs.rows.len();
        // The next batch will likely be as full: its buffers made that size at once.
        pairs.rows.expect_rows(len);
        // The rows' bytes as the buffers count them: measuring the finished batch was
        // a pass over every view (2% of an unlimited join of every TPC-H column).
        let bytes = pairs.rows.bytes();
        let batch = pairs.rows.finish()?;
        let reserved = std::mem::take(&mut pairs.reserved);
        self.rows += len as u64;
        pairs.row_bytes = (bytes / len).max(1);
        self.channel.gate.to_channel(reserved, bytes);
        self.channel
            .sender
            .send(Ok((batch, bytes)))
            .map_err(|_| JoinError::Cancelled)
    }

    /// Makes every batch sent own all its buffers (see [`owned_batch`]).
    pub fn with_owned_buffers(mut self, owned: bool) -> Self {
        self.owned_buffers = owned;
        self
    }

    /// Adds output rows; sends every batch that is complete.
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] when the caller dropped the output.
    pub fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let bytes = crate::batches::batch_bytes(&batch);
        // (A row's width without the per-column overhead `batch_bytes` adds: a piece
        // of one row would look several times wider than its rows are, and shrink
        // every later batch.)
        let row_bytes = bytes.saturating_sub(batch.num_columns() * 64) / rows;
        let fitting = (self.max_batch_bytes / row_bytes.max(1)).max(1);
        if fitting < self.target_rows {
            // Wide rows: batches of fewer rows from now on.
            self.coalescer.finish_buffered_batch()?;
            self.send_completed()?;
            self.coalescer = coalescer(&self.schema, fitting);
            self.target_rows = fitting;
        }
        self.channel.gate.reserve_assembling(bytes)?;
        self.assembled += bytes;
        self.assembled_rows += rows;
        // Pieces of half a batch or more bypass the coalescer. A larger piece is cut
        // into equal slices of at most a batch, each then at least half of one: cut
        // into full batches and a remainder, the remainder was copied into the
        // coalescer, and again into the batch it completed (with wide rows, whose
        // batches are a few thousand rows, about a third of all output rows).
        let slices = rows.div_ceil(self.target_rows.max(1));
        let mut offset = 0;
        for k in 0..slices {
            let end = rows * (k + 1) / slices;
            self.coalescer
                .push_batch(batch.slice(offset, end - offset))?;
            self.send_completed()?;
            offset = end;
        }
        Ok(())
    }

    /// The rows of a batch of rows `row_bytes` wide as gathered (0 before the first
    /// batch of pairs is sent): the batch size, or as many as fit in a batch's bytes.
    fn batch_rows(&self, row_bytes: usize) -> usize {
        self.max_batch_bytes
            .checked_div(row_bytes)
            .map_or(self.target_rows, |fit| fit.clamp(1, self.target_rows))
    }

    /// Sends what is buffered.
    pub fn finish(&mut self) -> Result<()> {
        // Pairs short of a batch join the coalescer's rows (so that a worker sends
        // one batch short of the batch size, its last).
        if let Some(pairs) = self.pairs.as_mut().filter(|p| !p.rows.is_empty()) {
            let batch = pairs.rows.finish()?;
            self.channel
                .gate
                .unassemble(std::mem::take(&mut pairs.reserved));
            self.push(batch)?;
        }
        self.coalescer.finish_buffered_batch()?;
        self.send_completed()?;
        // What the pieces were reserved for beyond the batches made of them.
        self.channel
            .gate
            .unassemble(std::mem::take(&mut self.assembled));
        self.assembled_rows = 0;
        Ok(())
    }

    /// Rows sent so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    fn send_completed(&mut self) -> Result<()> {
        while let Some(batch) = self.coalescer.next_completed_batch() {
            let batch = if self.owned_buffers {
                owned_batch(batch)?
            } else {
                batch
            };
            self.rows += batch.num_rows() as u64;
            let bytes = crate::batches::batch_bytes(&batch);
            // The batch's share of what its pieces were reserved for, by rows: pieces
            // count more than the batch made of them (each its columns' overhead, a
            // dictionary's values), and what is left over would stay reserved until
            // the sink finishes (under a small limit, pieces of a few rows each
            // left over held a large share of it, which starved the probe).
            let rows = batch.num_rows();
            let assembled = if rows >= self.assembled_rows {
                self.assembled
            } else {
                self.assembled * rows / self.assembled_rows
            };
            self.assembled -= assembled;
            self.assembled_rows = self.assembled_rows.saturating_sub(rows);
            self.channel.gate.to_channel(assembled, bytes);
            self.channel
                .sender
                .send(Ok((batch, bytes)))
                .map_err(|_| JoinError::Cancelled)?;
        }
        Ok(())
    }
}

impl Drop for OutputSink {
    fn drop(&mut self) {
        let pairs = self.pairs.as_ref().map_or(0, |p| p.reserved);
        self.channel.gate.unassemble(self.assembled + pairs);
    }
}

/// The columns matched pairs are gathered from, in the output's order, each with
/// whether it is the probe's; `None` if one is not of its output column's type.
fn pair_columns(
    sources: &[Source],
    schema: &SchemaRef,
    probe: &RecordBatch,
    build: &RecordBatch,
) -> Option<Vec<(ArrayData, bool)>> {
    sources
        .iter()
        .zip(schema.fields())
        .map(|(source, field)| {
            let (column, probe) = match source {
                Source::Probe(i) => (probe.columns().get(*i)?, true),
                Source::Build(i) => (build.columns().get(*i)?, false),
                Source::Mark => return None,
            };
            (column.data_type() == field.data_type()).then(|| (column.to_data(), probe))
        })
        .collect()
}

/// A coalescer into batches of `rows`: pieces of at least half a batch are passed
/// on as they are rather than copied again (pair output is gathered in slices of a
/// whole batch).
fn coalescer(schema: &SchemaRef, rows: usize) -> BatchCoalescer {
    BatchCoalescer::new(Arc::clone(schema), rows.max(1))
        .with_biggest_coalesce_batch_size(Some(rows / 2))
}

/// `batch` with every buffer its own: a gather (`take`) copies values, except the data
/// buffers of view arrays (only the views are copied) and the values of dictionaries
/// (only the keys are), which it shares with its source. Those are copied here, at any
/// depth, so that an output batch never keeps a shared build alive.
pub(crate) fn owned_batch(batch: RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| may_share(f.data_type()))
    {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(owned_array)
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

/// Whether a gathered array of this type may share buffers with its source.
fn may_share(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8View | DataType::BinaryView | DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => may_share(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| may_share(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| may_share(f.data_type())),
        DataType::RunEndEncoded(_, values) => may_share(values.data_type()),
        _ => false,
    }
}

fn owned_array(array: &ArrayRef) -> Result<ArrayRef> {
    use arrow_array::cast::AsArray;
    if !may_share(array.data_type()) {
        return Ok(Arc::clone(array));
    }
    Ok(match array.data_type() {
        DataType::Utf8View => Arc::new(array.as_string_view().gc()),
        DataType::BinaryView => Arc::new(array.as_binary_view().gc()),
        DataType::Dictionary(..) => {
            // A gather's keys are new; its values are the source's. Keep only the
            // values the keys use (a batch of a big dictionary uses few), copied.
            let compact = arrow_select::dictionary::garbage_collect_any_dictionary(
                array.as_any_dictionary(),
            )?;
            let dictionary = compact.as_any_dictionary();
            let values = dictionary.values();
            let all = arrow_array::UInt32Array::from_iter_values(0..values.len() as u32);
            let values = owned_array(&arrow_select::take::take(values.as_ref(), &all, None)?)?;
            dictionary.with_values(values)
        }
        _ => {
            // Nested: rebuild with owned children.
            let data = array.to_data();
            let children = data
                .child_data()
                .iter()
                .map(|c| owned_array(&arrow_array::make_array(c.clone())).map(|a| a.to_data()))
                .collect::<Result<Vec<_>>>()?;
            let data = data.into_builder().child_data(children).build()?;
            arrow_array::make_array(data)
        }
    })
}
