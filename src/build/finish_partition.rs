//! One in-memory partition made ready to probe: its rows as one batch (gathered
//! buffers become the batch uncopied; fragments are concatenated), its keys encoded,
//! its table built, and its reservation corrected to what it really holds. Its own
//! file because the fallback builds its chunks' tables with it too
//! (`crate::build::finish_partition`), from a buffer it filled itself.

use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Schema};
use arrow_select::concat::concat_batches;
use spilljoin_memory::MemoryReservation;

use super::built::BuiltPartition;
use super::collector::PartitionBuffer;
use super::spill::hash_column;
use crate::batches::{batch_bytes, lock};
use crate::error::{JoinError, Result};
use crate::gather::GatherBuffer;
use crate::keys::KeyRepr;
use crate::plan::JoinPlan;
use crate::table::{ChainedTable, MAX_TABLE_ROWS};

/// Concatenates a partition's fragments and builds its table. `held` bytes were
/// reserved for it in `reservation` (its fragments and what `finish_bytes` asked
/// for), which is corrected to what the partition really holds.
///
/// Without `index` the partition gets an empty table, and the bytes of the table it
/// would have had stay reserved: a key index shared by all partitions replaces it
/// (`share_key_index`).
pub(crate) fn finish_partition(
    plan: &JoinPlan,
    buffer: PartitionBuffer,
    held: usize,
    reservation: &Mutex<MemoryReservation>,
    index: bool,
) -> Result<BuiltPartition> {
    if buffer.rows > MAX_TABLE_ROWS {
        return Err(JoinError::InvalidJoin(format!(
            "a build partition has {} rows; at most {MAX_TABLE_ROWS} fit one table",
            buffer.rows
        )));
    }
    let PartitionRows {
        batch,
        hashes,
        gathered_bytes,
    } = partition_rows(plan, buffer)?;
    let key_columns = plan
        .keys
        .build_columns
        .iter()
        .map(|&i| crate::keys::normalize(batch.column(i)))
        .collect::<Result<Vec<_>>>()?;
    let keys = plan.keys.keys_of(key_columns.clone())?;
    let rows = batch.num_rows();
    let (table, hashes) = build_table(&keys.repr, &key_columns, hashes, rows, index)?;
    // Word keys are compared directly, never by their hash (`KeyEq::CHECK_HASH_FIRST`):
    // their hashes are not kept past the table (a third of a partition's overhead).
    let hashes = if plan.keys.is_word_key() {
        ScalarBuffer::from(Vec::new())
    } else {
        hashes
    };
    let table_bytes = if index {
        table.size()
    } else {
        ChainedTable::size_for(rows)
    };
    let actual = gathered_bytes.unwrap_or_else(|| batch_bytes(&batch) + hashes.len() * 8)
        + keys.repr.size()
        + table_bytes
        + normalized_copy_bytes(plan, rows);
    {
        let mut res = lock(reservation);
        let size = res.size();
        res.shrink(held.min(size));
        res.grow(actual);
    }
    Ok(BuiltPartition {
        batch,
        hashes,
        keys: keys.repr,
        table,
    })
}

/// A partition's rows as one batch in the build schema, with their hashes (none for
/// word keys).
struct PartitionRows {
    batch: RecordBatch,
    hashes: ScalarBuffer<u64>,
    /// What gathered buffers hold in memory (their arrays count only their lengths),
    /// where the rows were gathered.
    gathered_bytes: Option<usize>,
}

/// The rows of `buffer` as one batch: its gathered rows, else its fragments.
fn partition_rows(plan: &JoinPlan, buffer: PartitionBuffer) -> Result<PartitionRows> {
    let gathered = lock(&buffer.gathered).take();
    match gathered {
        Some(gathered) if !gathered.is_empty() => gathered_rows(plan, gathered),
        _ => {
            let (batch, hashes) = fragment_rows(plan, buffer.fragments, buffer.rows)?;
            Ok(PartitionRows {
                batch,
                hashes,
                gathered_bytes: None,
            })
        }
    }
}

/// Gathered in place: the buffers become the batch, uncopied; a hash column, if any,
/// is split off.
fn gathered_rows(plan: &JoinPlan, mut gathered: GatherBuffer) -> Result<PartitionRows> {
    let gathered_bytes = Some(gathered.held());
    let batch = gathered.finish()?;
    let (batch, hashes) = if plan.spills_hashes() {
        let hashes = hash_column(&batch)?.clone();
        let mut columns = batch.columns().to_vec();
        columns.pop();
        // The build's schema, or the held form's where the rows were gathered narrow
        // (`held_schema`).
        let fields = &batch.schema_ref().fields()[..columns.len()];
        let schema = if fields == &plan.build_schema.fields()[..] {
            Arc::clone(&plan.build_schema)
        } else {
            Arc::new(Schema::new(fields.to_vec()))
        };
        let batch = RecordBatch::try_new(schema, columns)?;
        (batch, hashes)
    } else {
        (batch, ScalarBuffer::from(Vec::new()))
    };
    Ok(PartitionRows {
        batch,
        hashes,
        gathered_bytes,
    })
}

/// `fragments` (of `rows` rows in all) as one batch and their hashes: a single
/// fragment as it is, more concatenated.
fn fragment_rows(
    plan: &JoinPlan,
    fragments: Vec<(RecordBatch, Vec<u64>)>,
    rows: usize,
) -> Result<(RecordBatch, ScalarBuffer<u64>)> {
    let empty = || {
        (
            RecordBatch::new_empty(Arc::clone(&plan.build_schema)),
            ScalarBuffer::from(Vec::new()),
        )
    };
    Ok(match fragments.len() {
        0 => empty(),
        1 => fragments
            .into_iter()
            .next()
            .map(|(batch, hashes)| (batch, ScalarBuffer::from(hashes)))
            .unwrap_or_else(empty),
        _ => {
            let batch = concat_batches(&plan.build_schema, fragments.iter().map(|(b, _)| b))?;
            let mut hashes = Vec::with_capacity(rows);
            for (_, h) in &fragments {
                hashes.extend_from_slice(h);
            }
            (batch, ScalarBuffer::from(hashes))
        }
    })
}

/// The table over a partition's `rows` rows, and their hashes (computed again where
/// the rows kept none and the table is hashed).
///
/// Dense one-word keys without nulls index the table by key (no hashes needed),
/// where that takes no more than the hashed table reserved for it; evenly spread
/// ones bucket it by value (never more than a hashed table). The probe's
/// headroom is no longer held here, so nothing more is reserved. Without `index`,
/// an empty table until the shared index replaces it.
fn build_table(
    keys: &KeyRepr,
    key_columns: &[ArrayRef],
    hashes: ScalarBuffer<u64>,
    rows: usize,
    index: bool,
) -> Result<(ChainedTable, ScalarBuffer<u64>)> {
    let keyed = match keys {
        _ if !index => Some(ChainedTable::build(&[], |_| true)),
        KeyRepr::Words {
            words, valid: None, ..
        } => ChainedTable::build_by_key(words),
        _ => None,
    };
    if let Some(table) = keyed {
        return Ok((table, hashes));
    }
    let hashes = if hashes.len() == rows {
        hashes
    } else {
        // Word-key fragments keep no hashes: hash the keys again, once.
        let mut again = Vec::new();
        crate::hash::hash_keys(key_columns, rows, &mut again)?;
        ScalarBuffer::from(again)
    };
    Ok((ChainedTable::build(&hashes, |_| true), hashes))
}

/// The bytes of a word key normalized into a new buffer (floats, dictionaries), held
/// too. (Narrower keys are widened into words that `keys.repr.size()` counts.)
fn normalized_copy_bytes(plan: &JoinPlan, rows: usize) -> usize {
    if plan.keys.is_word_key()
        && plan.keys.types[0].primitive_width() == Some(8)
        && !keys_in_place(plan)
    {
        rows * 8
    } else {
        0
    }
}

/// Whether a word key is read from the build column itself: an 8-byte column that
/// normalization leaves as it is (not a float, which is canonicalized into a new
/// buffer, nor a dictionary, which is decoded).
pub(super) fn keys_in_place(plan: &JoinPlan) -> bool {
    let key_type = &plan.keys.types[0];
    let column_type = plan
        .build_schema
        .field(plan.keys.build_columns[0])
        .data_type();
    key_type.primitive_width() == Some(8)
        && column_type == key_type
        && !matches!(key_type, DataType::Float64)
}
