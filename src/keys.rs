//! Join keys: which columns, which types, and how rows are compared.
//!
//! Keys are *normalized* before they are hashed or compared, on both sides alike:
//! dictionary-encoded columns are decoded to their value type (so a dictionary of
//! strings joins with plain strings), `-0.0` becomes `+0.0` and every NaN the same NaN
//! (so `-0.0 = +0.0` and `NaN = NaN`, as in DataFusion). Otherwise the two sides of a
//! key pair must have the same type; timestamps must agree on unit and zone.
//!
//! Candidate pairs found through the hash table are checked for key equality before
//! they count. Two representations make that check cheap:
//! - `KeyRepr::Words`: one key column of a fixed-width type of at most 8 bytes
//!   (integers, floats, dates, times, timestamps, booleans) — each row's key is one
//!   `u64`, compared directly;
//! - `KeyRepr::Rows`: anything else (several columns, strings, binaries, decimals) —
//!   each row's key is encoded with `arrow-row` and compared as bytes.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer, ToByteSlice};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Schema};

use crate::error::{JoinError, Result, Side};

/// How null keys compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NullEquality {
    /// SQL: a null key equals nothing, not even another null (the default).
    #[default]
    NullEqualsNothing,
    /// A null key equals a null key (`IS NOT DISTINCT FROM`).
    NullEqualsNull,
}

/// The resolved key columns of a join, in build/probe terms.
#[derive(Debug, Clone)]
pub(crate) struct KeySpec {
    /// Key column indices in the build input.
    pub build_columns: Vec<usize>,
    /// Key column indices in the probe input, pairwise with `build_columns`.
    pub probe_columns: Vec<usize>,
    /// The normalized type of each key pair.
    pub types: Vec<DataType>,
    /// How nulls compare.
    pub null_equality: NullEquality,
    /// The row encoder for [`KeyRepr::Rows`]; `None` when keys are words.
    converter: Option<Arc<RowConverter>>,
}

/// One batch's keys: normalized columns, per-row hash inputs and the representation
/// used for equality checks.
#[derive(Debug)]
pub(crate) struct Keys {
    /// Normalized key columns.
    pub columns: Vec<ArrayRef>,
    /// Rows whose key has a null in any column; `None` when there are none.
    pub nulls: Option<NullBuffer>,
    /// The equality representation.
    pub repr: KeyRepr,
}

/// Key values in the form the equality check reads.
#[derive(Debug)]
pub(crate) enum KeyRepr {
    /// One fixed-width key column; `valid` is the column's validity.
    Words {
        /// Each row's key bits (for 8-byte types, the key column's own buffer).
        words: ScalarBuffer<u64>,
        /// The bytes `words` holds beyond the key column (0 when shared with it).
        owned_bytes: usize,
        /// Which rows are not null; `None` when all are valid.
        valid: Option<NullBuffer>,
    },
    /// `arrow-row` encoded keys.
    Rows(Rows),
}

impl KeyRepr {
    /// Bytes held by this representation.
    pub fn size(&self) -> usize {
        match self {
            KeyRepr::Words {
                owned_bytes, valid, ..
            } => *owned_bytes + valid.as_ref().map_or(0, |v| v.buffer().capacity()),
            KeyRepr::Rows(rows) => rows.size(),
        }
    }
}

impl KeySpec {
    /// Whether keys are single fixed-width words ([`KeyRepr::Words`]).
    pub fn is_word_key(&self) -> bool {
        self.converter.is_none()
    }

    /// Resolves `on` (pairs of left and right column names) against the two schemas.
    ///
    /// # Errors
    /// [`JoinError::NoSuchColumn`], [`JoinError::UnsupportedKeyType`],
    /// [`JoinError::KeyTypeMismatch`], or [`JoinError::InvalidJoin`] when `on` is empty.
    pub fn resolve(
        build: Side,
        left: &Schema,
        right: &Schema,
        on: &[(String, String)],
        null_equality: NullEquality,
    ) -> Result<Self> {
        if on.is_empty() {
            return Err(JoinError::InvalidJoin(
                "a join needs at least one key pair".into(),
            ));
        }
        let (mut left_columns, mut right_columns, mut types) = (vec![], vec![], vec![]);
        for (left_name, right_name) in on {
            let l = column_index(left, Side::Left, left_name)?;
            let r = column_index(right, Side::Right, right_name)?;
            let left_type = normalized_type(Side::Left, left_name, left.field(l).data_type())?;
            let right_type = normalized_type(Side::Right, right_name, right.field(r).data_type())?;
            if left_type != right_type {
                return Err(JoinError::KeyTypeMismatch {
                    left_column: left_name.clone(),
                    left_type: left.field(l).data_type().clone(),
                    right_column: right_name.clone(),
                    right_type: right.field(r).data_type().clone(),
                });
            }
            left_columns.push(l);
            right_columns.push(r);
            types.push(left_type);
        }
        let converter = if is_word_key(types.iter()) {
            None
        } else {
            let fields = types.iter().map(|t| SortField::new(t.clone())).collect();
            Some(Arc::new(RowConverter::new(fields)?))
        };
        let (build_columns, probe_columns) = match build {
            Side::Right => (right_columns, left_columns),
            Side::Left => (left_columns, right_columns),
        };
        Ok(Self {
            build_columns,
            probe_columns,
            types,
            null_equality,
            converter,
        })
    }

    /// Evaluates the keys of a build or probe batch.
    ///
    /// # Errors
    /// Arrow errors from decoding dictionaries or encoding rows.
    pub fn evaluate(&self, batch: &RecordBatch, build_side: bool) -> Result<Keys> {
        let (columns, nulls) = self.evaluate_columns(batch, build_side)?;
        self.keys_with_nulls(columns, nulls)
    }

    /// The normalized key columns of a batch and the rows with a null key, without
    /// the equality representation (enough to hash and partition).
    ///
    /// # Errors
    /// Arrow errors from decoding dictionaries.
    pub fn evaluate_columns(
        &self,
        batch: &RecordBatch,
        build_side: bool,
    ) -> Result<(Vec<ArrayRef>, Option<NullBuffer>)> {
        let indices = if build_side {
            &self.build_columns
        } else {
            &self.probe_columns
        };
        let columns = indices
            .iter()
            .map(|&i| normalize(batch.column(i)))
            .collect::<Result<Vec<_>>>()?;
        let nulls = null_rows(&columns);
        Ok((columns, nulls))
    }

    /// Builds [`Keys`] from normalized columns.
    pub fn keys_of(&self, columns: Vec<ArrayRef>) -> Result<Keys> {
        let nulls = null_rows(&columns);
        self.keys_with_nulls(columns, nulls)
    }

    fn keys_with_nulls(&self, columns: Vec<ArrayRef>, nulls: Option<NullBuffer>) -> Result<Keys> {
        let repr = match &self.converter {
            None => {
                let (words, owned_bytes) = words_of(columns[0].as_ref())?;
                KeyRepr::Words {
                    words,
                    owned_bytes,
                    valid: nulls.clone(),
                }
            }
            Some(converter) => KeyRepr::Rows(converter.convert_columns(&columns)?),
        };
        Ok(Keys {
            columns,
            nulls,
            repr,
        })
    }
}

/// The rows with a null in any of `columns`, or `None` when there are none.
pub(crate) fn null_rows(columns: &[ArrayRef]) -> Option<NullBuffer> {
    columns
        .iter()
        .fold(None, |acc: Option<NullBuffer>, c| {
            NullBuffer::union(acc.as_ref(), c.logical_nulls().as_ref())
        })
        .filter(|n| n.null_count() > 0)
}

impl Keys {
    /// Whether row `i` has a null in some key column.
    #[inline]
    pub fn is_null(&self, i: usize) -> bool {
        self.nulls.as_ref().is_some_and(|n| n.is_null(i))
    }

    /// The rows that neither `excluded` leaves out (its null rows) nor repeat the key
    /// of the row just before them, as a validity mask (rows of equal keys often
    /// come together: the line items of an order). `None` when no row repeats the
    /// one before it, found by one scan where no key is null; with null keys the
    /// mask is made whether or not a row repeats (nulls may repeat under different
    /// words). Null keys count as equal to each other, as under `NullEqualsNull`;
    /// where they never match, `excluded` leaves them out anyway.
    pub fn first_of_runs(&self, excluded: Option<&NullBuffer>) -> Option<NullBuffer> {
        let kept = |r: usize| excluded.is_none_or(|e| e.is_valid(r));
        let mask = match &self.repr {
            KeyRepr::Words { words, valid, .. } => {
                // A batch whose keys never repeat costs this one pass over its
                // words, and no mask.
                if !words.windows(2).any(|w| w[0] == w[1]) && valid.is_none() {
                    return None;
                }
                let is_valid = |r: usize| valid.as_ref().is_none_or(|v| v.is_valid(r));
                BooleanBuffer::collect_bool(words.len(), |r| {
                    let repeats = r > 0
                        && match (is_valid(r), is_valid(r - 1)) {
                            (true, true) => words[r] == words[r - 1],
                            (false, false) => true,
                            _ => false,
                        };
                    !repeats && kept(r)
                })
            }
            KeyRepr::Rows(rows) => {
                let n = rows.num_rows();
                if !(1..n).any(|r| rows.row(r) == rows.row(r - 1)) {
                    return None;
                }
                BooleanBuffer::collect_bool(n, |r| {
                    !(r > 0 && rows.row(r) == rows.row(r - 1)) && kept(r)
                })
            }
        };
        Some(NullBuffer::new(mask))
    }
}

fn column_index(schema: &Schema, side: Side, name: &str) -> Result<usize> {
    schema.index_of(name).map_err(|_| JoinError::NoSuchColumn {
        side,
        name: name.to_string(),
        available: schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The type a key column has after normalization, or an error if it cannot be a key.
fn normalized_type(side: Side, column: &str, data_type: &DataType) -> Result<DataType> {
    use DataType::*;
    let unsupported = || JoinError::UnsupportedKeyType {
        side,
        column: column.to_string(),
        data_type: data_type.clone(),
    };
    match data_type {
        Dictionary(_, values) => match normalized_type(side, column, values)? {
            Dictionary(..) => Err(unsupported()),
            t => Ok(t),
        },
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float32 | Float64
        | Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..) | Date32 | Date64
        | Time32(_) | Time64(_) | Timestamp(..) | Duration(_) | Boolean | Utf8 | LargeUtf8
        | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            Ok(data_type.clone())
        }
        _ => Err(unsupported()),
    }
}

/// Whether keys of these (normalized) types are one fixed-width word.
fn is_word_key<'a>(mut types: impl ExactSizeIterator<Item = &'a DataType>) -> bool {
    types.len() == 1
        && types
            .next()
            .is_some_and(|t| t == &DataType::Boolean || t.primitive_width().is_some_and(|w| w <= 8))
}

/// Decodes dictionaries and canonicalizes floats.
pub(crate) fn normalize(column: &ArrayRef) -> Result<ArrayRef> {
    Ok(match column.data_type() {
        DataType::Dictionary(_, values) => {
            normalize(&arrow_cast::cast(column.as_ref(), values.as_ref())?)?
        }
        DataType::Float32 => Arc::new(
            column
                .as_primitive::<Float32Type>()
                .unary::<_, Float32Type>(|v| {
                    if v.is_nan() {
                        f32::NAN
                    } else if v == 0.0 {
                        0.0
                    } else {
                        v
                    }
                }),
        ),
        DataType::Float64 => Arc::new(
            column
                .as_primitive::<Float64Type>()
                .unary::<_, Float64Type>(|v| {
                    if v.is_nan() {
                        f64::NAN
                    } else if v == 0.0 {
                        0.0
                    } else {
                        v
                    }
                }),
        ),
        _ => Arc::clone(column),
    })
}

/// One `u64` per row of a fixed-width column (null slots hold whatever is there).
/// One `u64` per row of a fixed-width column (null slots hold whatever is there),
/// and the bytes that takes beyond the column itself: 8-byte types are read in place
/// (their buffer reinterpreted, no copy), narrower ones widened into a new buffer.
///
/// # Errors
/// [`JoinError::InvalidJoin`] if the column is not of a fixed width (a bug).
pub(crate) fn words_of(column: &dyn Array) -> Result<(ScalarBuffer<u64>, usize)> {
    fn widen<T: ArrowPrimitiveType>(array: &PrimitiveArray<T>) -> ScalarBuffer<u64> {
        array
            .values()
            .iter()
            .map(|v| {
                let bytes = std::slice::from_ref(v).to_byte_slice();
                let mut word = [0u8; 8];
                word[..bytes.len()].copy_from_slice(bytes);
                u64::from_le_bytes(word)
            })
            .collect()
    }
    if let Some(b) = column.as_boolean_opt() {
        let words: ScalarBuffer<u64> = b.values().iter().map(u64::from).collect();
        let bytes = words.len() * 8;
        return Ok((words, bytes));
    }
    // Every fixed-width type of up to 8 bytes has the layout of the unsigned integer
    // of its width; read it as that.
    let as_type = match column.data_type().primitive_width() {
        Some(1) => DataType::UInt8,
        Some(2) => DataType::UInt16,
        Some(4) => DataType::UInt32,
        Some(8) => DataType::UInt64,
        _ => {
            return Err(JoinError::Internal(format!(
                "{} is not a word key",
                column.data_type()
            )))
        }
    };
    let data = column
        .to_data()
        .into_builder()
        .data_type(as_type.clone())
        .build()?;
    Ok(match as_type {
        DataType::UInt8 => widen(&PrimitiveArray::<UInt8Type>::from(data)),
        DataType::UInt16 => widen(&PrimitiveArray::<UInt16Type>::from(data)),
        DataType::UInt32 => widen(&PrimitiveArray::<UInt32Type>::from(data)),
        _ => return Ok((PrimitiveArray::<UInt64Type>::from(data).values().clone(), 0)),
    })
    .map(|words| {
        let bytes = words.len() * 8;
        (words, bytes)
    })
}

/// Checks whether probe key `p` equals build key `b`.
pub(crate) trait KeyEq {
    /// Whether a candidate's stored hash should be compared before its key: worth it
    /// only when comparing keys costs more than loading the hash (encoded rows).
    /// Word keys compare directly, which keeps one array out of the chain walk.
    const CHECK_HASH_FIRST: bool;

    /// Whether every row of a chain of a key-indexed table
    /// ([`ChainedTable::build_direct`](crate::table::ChainedTable::build_direct)) has
    /// the probe row's key, so that keys need not be compared: true for words whose
    /// nulls never reach the table or the lookup.
    const EXACT_IN_DIRECT: bool = false;

    /// Whether keys are single words, which key-indexed tables need.
    const WORDS: bool = false;

    /// Probe row `p`'s key word, for key-indexed tables; `None` for a null key (a
    /// key-indexed table has no null keys, so it matches nothing there: its word is
    /// not its key) and for keys that are not one word.
    #[inline(always)]
    fn probe_word(&self, _p: usize) -> Option<u64> {
        None
    }

    /// Hints that build row `b`'s key will be compared soon.
    #[inline(always)]
    fn prefetch_build(&self, _b: usize) {}

    /// Whether the keys are equal (both rows' keys are known to be comparable:
    /// under SQL null semantics, rows with null keys never get here).
    fn key_eq(&self, p: usize, b: usize) -> bool;
}

/// Equality of [`KeyRepr::Words`] without nulls.
pub(crate) struct WordEq<'a> {
    pub probe: &'a [u64],
    pub build: &'a [u64],
}

impl KeyEq for WordEq<'_> {
    const CHECK_HASH_FIRST: bool = false;
    const EXACT_IN_DIRECT: bool = true;
    const WORDS: bool = true;

    #[inline(always)]
    fn probe_word(&self, p: usize) -> Option<u64> {
        self.probe.get(p).copied()
    }

    #[inline(always)]
    fn prefetch_build(&self, b: usize) {
        if let Some(word) = self.build.get(b) {
            crate::table::prefetch(word);
        }
    }

    #[inline(always)]
    fn key_eq(&self, p: usize, b: usize) -> bool {
        self.probe[p] == self.build[b]
    }
}

/// Equality of [`KeyRepr::Words`] where nulls equal nulls.
pub(crate) struct NullableWordEq<'a> {
    pub probe: &'a [u64],
    pub build: &'a [u64],
    pub probe_valid: Option<&'a NullBuffer>,
    pub build_valid: Option<&'a NullBuffer>,
}

impl KeyEq for NullableWordEq<'_> {
    const CHECK_HASH_FIRST: bool = false;
    const WORDS: bool = true;

    #[inline(always)]
    fn probe_word(&self, p: usize) -> Option<u64> {
        if self.probe_valid.is_some_and(|v| v.is_null(p)) {
            return None;
        }
        self.probe.get(p).copied()
    }

    #[inline(always)]
    fn key_eq(&self, p: usize, b: usize) -> bool {
        let pv = self.probe_valid.is_none_or(|v| v.is_valid(p));
        let bv = self.build_valid.is_none_or(|v| v.is_valid(b));
        pv == bv && (!pv || self.probe[p] == self.build[b])
    }
}

/// Equality of [`KeyRepr::Rows`].
pub(crate) struct RowsEq<'a> {
    pub probe: &'a Rows,
    pub build: &'a Rows,
}

impl KeyEq for RowsEq<'_> {
    const CHECK_HASH_FIRST: bool = true;

    #[inline(always)]
    fn key_eq(&self, p: usize, b: usize) -> bool {
        self.probe.row(p) == self.build.row(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::Field;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// The first-of-runs mask of `column` as a key (joined with itself), as bools;
    /// `None` where `first_of_runs` found no repeat.
    fn runs(
        column: ArrayRef,
        excluded: Option<&NullBuffer>,
    ) -> std::result::Result<Option<Vec<bool>>, Box<dyn std::error::Error>> {
        let schema = Schema::new(vec![Field::new("k", column.data_type().clone(), true)]);
        let on = [("k".to_string(), "k".to_string())];
        let spec = KeySpec::resolve(
            Side::Right,
            &schema,
            &schema,
            &on,
            NullEquality::NullEqualsNull,
        )?;
        let batch = RecordBatch::try_new(Arc::new(schema), vec![column])?;
        let keys = spec.evaluate(&batch, false)?;
        Ok(keys
            .first_of_runs(excluded)
            .map(|m| (0..batch.num_rows()).map(|r| m.is_valid(r)).collect()))
    }

    #[test]
    fn first_of_runs_keeps_the_first_row_of_each_run_of_equal_keys() -> TestResult {
        let words = Arc::new(Int64Array::from(vec![1, 1, 2, 1, 3, 3, 3])) as ArrayRef;
        let expected = vec![true, false, true, true, true, false, false];
        assert_eq!(runs(Arc::clone(&words), None)?, Some(expected));
        // Rows left out stay out.
        let excluded = NullBuffer::from(vec![true, true, false, true, true, true, true]);
        let expected = vec![true, false, false, true, true, false, false];
        assert_eq!(runs(words, Some(&excluded))?, Some(expected));
        // Encoded rows (not words), the same.
        let strings = Arc::new(StringArray::from(vec!["a", "a", "b", "a"])) as ArrayRef;
        assert_eq!(runs(strings, None)?, Some(vec![true, false, true, true]));
        Ok(())
    }

    #[test]
    fn first_of_runs_counts_nulls_equal_and_apart_from_values() -> TestResult {
        let words =
            Arc::new(Int64Array::from(vec![None, None, Some(0), Some(0), None])) as ArrayRef;
        let expected = vec![true, false, true, false, true];
        assert_eq!(runs(words, None)?, Some(expected));
        let strings = Arc::new(StringArray::from(vec![None, None, Some(""), None])) as ArrayRef;
        assert_eq!(runs(strings, None)?, Some(vec![true, false, true, true]));
        Ok(())
    }

    #[test]
    fn first_of_runs_is_none_where_no_key_repeats() -> TestResult {
        let words = Arc::new(Int64Array::from(vec![1, 2, 1, 2])) as ArrayRef;
        assert_eq!(runs(words, None)?, None);
        let strings = Arc::new(StringArray::from(vec!["a", "b", "a"])) as ArrayRef;
        assert_eq!(runs(strings, None)?, None);
        Ok(())
    }
}
