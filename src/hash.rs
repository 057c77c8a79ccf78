//! Hashing join keys: xxh3 (64 bit), one pass per key column.
//!
//! Each row's hash starts at [`HASH_SEED`]; every key column then replaces it with the
//! xxh3 of that column's value seeded with the hash so far. A row is hashed once, when
//! it enters the join, and the hash travels with the row (through partitioning and
//! spilling) so it is never computed again.
//!
//! Keys are normalized before hashing (see [`crate::keys`]): dictionaries are decoded,
//! `-0.0` becomes `+0.0` and every NaN the same NaN, so equal keys hash equally.
//!
//! Which bits of the hash pick the partition and which the bucket is decided by
//! [`crate::partition::HashBits`]; this module only makes the 64 bits.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, BooleanArray, GenericByteArray};
use arrow_buffer::ArrowNativeType;
use arrow_buffer::ToByteSlice;
use arrow_schema::DataType;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{JoinError, Result};

/// The hash every row starts from before its first key column.
pub const HASH_SEED: u64 = 0x5EED_5011_1701_0A7A;

/// What a null key value hashes as (combined with the hash so far). Nulls matter only
/// when nulls equal nulls; otherwise rows with a null key never reach a hash table.
const NULL_MARKER: &[u8] = b"\xFFspilljoin-null";

/// Hashes the normalized key columns of `num_rows` rows into `hashes` (cleared first).
///
/// # Errors
/// [`JoinError::InvalidJoin`] if a column has a type that [`crate::keys`] should have
/// rejected (a bug in the caller).
pub fn hash_keys(columns: &[ArrayRef], num_rows: usize, hashes: &mut Vec<u64>) -> Result<()> {
    hashes.clear();
    hashes.resize(num_rows, HASH_SEED);
    for column in columns {
        debug_assert_eq!(column.len(), num_rows);
        hash_column(column.as_ref(), hashes)?;
    }
    Ok(())
}

fn hash_column(column: &dyn Array, hashes: &mut [u64]) -> Result<()> {
    // A null must hash the same whatever value sits under it: keep the hashes from
    // before this column for the null slots.
    let nulls = column.logical_nulls().filter(|n| n.null_count() > 0);
    let before = nulls.as_ref().map(|_| hashes.to_vec());
    hash_values(column, hashes)?;
    if let (Some(nulls), Some(before)) = (nulls, before) {
        for i in (0..hashes.len()).filter(|&i| nulls.is_null(i)) {
            hashes[i] = xxh3_64_with_seed(NULL_MARKER, before[i]);
        }
    }
    Ok(())
}

/// Hashes every slot's value, nulls included (they are fixed up by the caller).
fn hash_values(column: &dyn Array, hashes: &mut [u64]) -> Result<()> {
    macro_rules! primitive {
        ($t:ty) => {
            hash_primitive(column.as_primitive::<$t>(), hashes)
        };
    }
    match column.data_type() {
        DataType::Int8 => primitive!(Int8Type),
        DataType::Int16 => primitive!(Int16Type),
        DataType::Int32 => primitive!(Int32Type),
        DataType::Int64 => primitive!(Int64Type),
        DataType::UInt8 => primitive!(UInt8Type),
        DataType::UInt16 => primitive!(UInt16Type),
        DataType::UInt32 => primitive!(UInt32Type),
        DataType::UInt64 => primitive!(UInt64Type),
        DataType::Float32 => primitive!(Float32Type),
        DataType::Float64 => primitive!(Float64Type),
        DataType::Decimal32(..) => primitive!(Decimal32Type),
        DataType::Decimal64(..) => primitive!(Decimal64Type),
        DataType::Decimal128(..) => primitive!(Decimal128Type),
        DataType::Decimal256(..) => primitive!(Decimal256Type),
        DataType::Date32 => primitive!(Date32Type),
        DataType::Date64 => primitive!(Date64Type),
        DataType::Time32(arrow_schema::TimeUnit::Second) => primitive!(Time32SecondType),
        DataType::Time32(_) => primitive!(Time32MillisecondType),
        DataType::Time64(arrow_schema::TimeUnit::Microsecond) => primitive!(Time64MicrosecondType),
        DataType::Time64(_) => primitive!(Time64NanosecondType),
        DataType::Timestamp(..) | DataType::Duration(_) => {
            // Every unit is an i64 underneath; the unit and zone are equal on both
            // sides (checked when the join is defined).
            let values = column.to_data();
            let array = arrow_array::PrimitiveArray::<Int64Type>::from(
                values.into_builder().data_type(DataType::Int64).build()?,
            );
            hash_primitive(&array, hashes)
        }
        DataType::Boolean => hash_boolean(column.as_boolean(), hashes),
        DataType::Utf8 => hash_bytes(column.as_string::<i32>(), hashes),
        DataType::LargeUtf8 => hash_bytes(column.as_string::<i64>(), hashes),
        DataType::Binary => hash_bytes(column.as_binary::<i32>(), hashes),
        DataType::LargeBinary => hash_bytes(column.as_binary::<i64>(), hashes),
        DataType::Utf8View => {
            let array = column.as_string_view();
            hash_each(hashes, |i| array.value(i).as_bytes())
        }
        DataType::BinaryView => {
            let array = column.as_binary_view();
            hash_each(hashes, |i| array.value(i))
        }
        DataType::FixedSizeBinary(_) => {
            let array = column.as_fixed_size_binary();
            hash_each(hashes, |i| array.value(i))
        }
        other => return Err(JoinError::Internal(format!("cannot hash key type {other}"))),
    }
    Ok(())
}

fn hash_primitive<T: ArrowPrimitiveType>(
    array: &arrow_array::PrimitiveArray<T>,
    hashes: &mut [u64],
) {
    for (hash, value) in hashes.iter_mut().zip(array.values().iter()) {
        *hash = xxh3_64_with_seed(std::slice::from_ref(value).to_byte_slice(), *hash);
    }
}

fn hash_boolean(array: &BooleanArray, hashes: &mut [u64]) {
    for (i, hash) in hashes.iter_mut().enumerate() {
        *hash = xxh3_64_with_seed(&[array.values().value(i) as u8], *hash);
    }
}

fn hash_bytes<T: arrow_array::types::ByteArrayType>(
    array: &GenericByteArray<T>,
    hashes: &mut [u64],
) {
    let offsets = array.value_offsets();
    let data = array.value_data();
    for (i, hash) in hashes.iter_mut().enumerate() {
        let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
        *hash = xxh3_64_with_seed(&data[start..end], *hash);
    }
}

fn hash_each<'a>(hashes: &mut [u64], value: impl Fn(usize) -> &'a [u8]) {
    for (i, hash) in hashes.iter_mut().enumerate() {
        *hash = xxh3_64_with_seed(value(i), *hash);
    }
}
