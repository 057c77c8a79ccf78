//! Key bounds: the smallest and largest value of each build key column, computed while
//! building, so that a probe scan can skip data that cannot match (Parquet row groups
//! whose statistics lie outside them).
//!
//! Bounds are over the normalized key values (dictionaries decoded) and ignore nulls.
//! Float keys have none (NaN and -0.0 make ranges treacherous, and they are rare keys).

use std::cmp::Ordering;

use arrow_array::{downcast_primitive_array, Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_ord::ord::make_comparator;
use arrow_schema::{DataType, SortOptions};

use crate::error::Result;

/// The smallest and largest non-null value of one key column.
#[derive(Debug, Clone)]
pub struct KeyBounds {
    /// A one-element array holding the smallest value.
    pub min: ArrayRef,
    /// A one-element array holding the largest value.
    pub max: ArrayRef,
}

/// Whether bounds are kept for keys of this type.
pub(crate) fn has_bounds(data_type: &DataType) -> bool {
    !matches!(
        data_type,
        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Boolean
    )
}

impl KeyBounds {
    /// The bounds of `column`; `None` when it has no non-null value or its type keeps
    /// none.
    pub(crate) fn of(column: &ArrayRef) -> Result<Option<Self>> {
        if column.null_count() == column.len() || !has_bounds(column.data_type()) {
            return Ok(None);
        }
        if column.null_count() == 0 {
            let fast = downcast_primitive_array!(
                column => Some(primitive_bounds(column)),
                _ => None
            );
            if let Some(bounds) = fast {
                return Ok(bounds);
            }
        }
        let cmp = make_comparator(column.as_ref(), column.as_ref(), SortOptions::default())?;
        let mut valid = (0..column.len()).filter(|&i| column.is_valid(i));
        let Some(first) = valid.next() else {
            return Ok(None);
        };
        let (mut lo, mut hi) = (first, first);
        for i in valid {
            if cmp(i, lo) == Ordering::Less {
                lo = i;
            } else if cmp(i, hi) == Ordering::Greater {
                hi = i;
            }
        }
        Ok(Some(
            Self {
                min: column.slice(lo, 1),
                max: column.slice(hi, 1),
            }
            .owned(),
        ))
    }

    /// Widens these bounds to cover `other`'s.
    pub(crate) fn merge(&mut self, other: &KeyBounds) -> Result<()> {
        let lt = make_comparator(
            other.min.as_ref(),
            self.min.as_ref(),
            SortOptions::default(),
        )?;
        if lt(0, 0) == Ordering::Less {
            self.min = other.min.clone();
        }
        let gt = make_comparator(
            other.max.as_ref(),
            self.max.as_ref(),
            SortOptions::default(),
        )?;
        if gt(0, 0) == Ordering::Greater {
            self.max = other.max.clone();
        }
        Ok(())
    }

    /// Copies the one-element arrays out of the column they were sliced from, so they
    /// keep nothing else alive (view arrays: their data buffers too).
    fn owned(self) -> Self {
        use arrow_array::cast::AsArray;
        let copy = |a: &ArrayRef| -> ArrayRef {
            let indices = arrow_array::UInt32Array::from(vec![0u32]);
            let taken =
                arrow_select::take::take(a.as_ref(), &indices, None).unwrap_or_else(|_| a.clone());
            match taken.data_type() {
                DataType::Utf8View => std::sync::Arc::new(taken.as_string_view().gc()),
                DataType::BinaryView => std::sync::Arc::new(taken.as_binary_view().gc()),
                _ => taken,
            }
        };
        Self {
            min: copy(&self.min),
            max: copy(&self.max),
        }
    }
}

fn primitive_bounds<T: ArrowPrimitiveType>(column: &PrimitiveArray<T>) -> Option<KeyBounds>
where
    T::Native: PartialOrd,
{
    let values = column.values();
    let first = *values.first()?;
    let (mut lo, mut hi) = (first, first);
    for &v in values.iter() {
        if v < lo {
            lo = v;
        }
        if v > hi {
            hi = v;
        }
    }
    let one = |v: T::Native| -> ArrayRef {
        std::sync::Arc::new(
            PrimitiveArray::<T>::from_iter_values([v]).with_data_type(column.data_type().clone()),
        )
    };
    Some(KeyBounds {
        min: one(lo),
        max: one(hi),
    })
}

/// Bounds of several key columns, merged from many batches.
#[derive(Debug, Clone, Default)]
pub(crate) struct BoundsAccumulator {
    /// Per key column; `None` until a non-null value is seen (or never, for types
    /// without bounds).
    pub columns: Vec<Option<KeyBounds>>,
}

impl BoundsAccumulator {
    /// Widens the bounds by those of a batch's key columns.
    pub fn add(&mut self, batch_bounds: Vec<Option<KeyBounds>>) -> Result<()> {
        if self.columns.is_empty() {
            self.columns = vec![None; batch_bounds.len()];
        }
        for (mine, theirs) in self.columns.iter_mut().zip(batch_bounds) {
            match (mine.as_mut(), theirs) {
                (_, None) => {}
                (None, Some(b)) => *mine = Some(b),
                (Some(m), Some(b)) => m.merge(&b)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};

    use super::*;

    #[test]
    fn bounds_ignore_nulls_and_merge() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), None, Some(-3), Some(9)]));
        let b = KeyBounds::of(&a).unwrap().unwrap();
        assert_eq!(b.min.as_ref(), &Int64Array::from(vec![-3]) as &dyn Array);
        assert_eq!(b.max.as_ref(), &Int64Array::from(vec![9]) as &dyn Array);
        let s: ArrayRef = Arc::new(StringArray::from(vec![
            Some("m"),
            Some("b"),
            None,
            Some("x"),
        ]));
        let mut acc = BoundsAccumulator::default();
        acc.add(vec![KeyBounds::of(&s).unwrap()]).unwrap();
        let s2: ArrayRef = Arc::new(StringArray::from(vec!["a", "c"]));
        acc.add(vec![KeyBounds::of(&s2).unwrap()]).unwrap();
        let got = acc.columns[0].as_ref().unwrap();
        assert_eq!(
            got.min.as_ref(),
            &StringArray::from(vec!["a"]) as &dyn Array
        );
        assert_eq!(
            got.max.as_ref(),
            &StringArray::from(vec!["x"]) as &dyn Array
        );
        let nulls: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>, None]));
        assert!(KeyBounds::of(&nulls).unwrap().is_none());
    }
}
