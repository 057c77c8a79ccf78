//! Implicit type rules of `--filter`: which type two operands are brought to before
//! a comparison or arithmetic, and the SQL type names of `CAST`.
//!
//! The rules are the usual SQL ones, kept small:
//!
//! | operands | common type |
//! |---|---|
//! | integers | the wider; signed and unsigned: a signed type wide enough, else Int64 |
//! | a float and a number | Float64 (Float32 with Float32 stays Float32) |
//! | decimals, or a decimal and an integer | comparisons: Decimal128(38, the larger scale); arithmetic: each keeps its precision and scale (an integer is a decimal of scale 0) and the kernel combines them |
//! | strings | Utf8, or LargeUtf8 if either is |
//! | a string and a date or timestamp | the date or timestamp (the string is parsed) |
//! | dates / timestamps | Date64 for two dates of different units; a timestamp and a date: the timestamp's type; timestamps: the finer unit |
//!
//! A literal is cast to the other operand's type when that loses nothing
//! (`int32_col > 5` compares Int32s, `day = '2024-01-31'` compares dates), so that a
//! column is not converted batch after batch for a constant.

use arrow_schema::{DataType, TimeUnit};

/// The type both sides of a comparison are cast to, or `None` if the types cannot
/// be compared.
pub fn comparison_type(l: &DataType, r: &DataType) -> Option<DataType> {
    use DataType::*;
    if l == r {
        return Some(l.clone());
    }
    if l.is_numeric() && r.is_numeric() {
        return numeric_type(l, r);
    }
    match (l, r) {
        (Null, t) | (t, Null) => Some(t.clone()),
        (a, b) if is_string(a) && is_string(b) => Some(if *a == LargeUtf8 || *b == LargeUtf8 {
            LargeUtf8
        } else {
            Utf8
        }),
        (a, b) if is_binary(a) && is_binary(b) => Some(if *a == LargeBinary || *b == LargeBinary {
            LargeBinary
        } else {
            Binary
        }),
        (Date32, Date64) | (Date64, Date32) => Some(Date64),
        // A string compared with a date or a timestamp is read as one (CSV and JSON
        // inputs often carry dates as text).
        (s, t @ (Date32 | Date64 | Timestamp(..))) | (t @ (Date32 | Date64 | Timestamp(..)), s)
            if is_string(s) =>
        {
            Some(t.clone())
        }
        (Timestamp(u, tz), Date32 | Date64) | (Date32 | Date64, Timestamp(u, tz)) => {
            Some(Timestamp(*u, tz.clone()))
        }
        (Timestamp(u1, tz1), Timestamp(u2, tz2)) => {
            let unit = finer(*u1, *u2);
            Some(Timestamp(unit, tz1.clone().or_else(|| tz2.clone())))
        }
        _ => None,
    }
}

/// The type both operands of a comparison of two numbers are cast to; `None`
/// unless both are numbers.
fn numeric_type(l: &DataType, r: &DataType) -> Option<DataType> {
    use DataType::*;
    if !(l.is_numeric() && r.is_numeric()) {
        return None;
    }
    if l == r {
        return Some(l.clone());
    }
    Some(match (l, r) {
        (a, b) if a.is_floating() || b.is_floating() => float_type(a, b),
        (a, b) if is_decimal(a) || is_decimal(b) => {
            let scale = decimal_scale(a).max(decimal_scale(b));
            if matches!(a, Decimal256(..)) || matches!(b, Decimal256(..)) {
                Decimal256(76, scale)
            } else {
                Decimal128(38, scale)
            }
        }
        (a, b) => integer_type(a, b)?,
    })
}

/// The types the operands of numeric arithmetic are cast to, or `None` unless both
/// are numbers. Decimals keep their precision and scale (the kernels combine them);
/// an integer with a decimal becomes a decimal of scale 0.
pub fn arithmetic_types(l: &DataType, r: &DataType) -> Option<(DataType, DataType)> {
    if !(l.is_numeric() && r.is_numeric()) {
        return None;
    }
    if l.is_floating() || r.is_floating() {
        let t = float_type(l, r);
        return Some((t.clone(), t));
    }
    match (is_decimal(l), is_decimal(r)) {
        (false, false) => integer_type(l, r).map(|t| (t.clone(), t)),
        (true, true) => {
            let wide =
                matches!(l, DataType::Decimal256(..)) || matches!(r, DataType::Decimal256(..));
            Some((widen_decimal(l, wide), widen_decimal(r, wide)))
        }
        (true, false) => Some((widen_decimal(l, false), integer_as_decimal(r, l))),
        (false, true) => Some((integer_as_decimal(l, r), widen_decimal(r, false))),
    }
}

fn float_type(a: &DataType, b: &DataType) -> DataType {
    if *a == DataType::Float32 && *b == DataType::Float32 {
        DataType::Float32
    } else {
        DataType::Float64
    }
}

fn is_decimal(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
    )
}

/// A decimal as Decimal128, or Decimal256 if `wide` (the kernels need both
/// operands of one width).
fn widen_decimal(t: &DataType, wide: bool) -> DataType {
    match t {
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s) => {
            if wide {
                DataType::Decimal256(*p, *s)
            } else {
                DataType::Decimal128(*p, *s)
            }
        }
        other => other.clone(),
    }
}

/// The decimal type an integer is cast to for arithmetic with `decimal`: scale 0,
/// precision enough for every value, and the decimal's width.
fn integer_as_decimal(integer: &DataType, decimal: &DataType) -> DataType {
    use DataType::*;
    let digits = match integer {
        Int8 | UInt8 => 3,
        Int16 | UInt16 => 5,
        Int32 | UInt32 => 10,
        Int64 => 19,
        _ => 20,
    };
    match decimal {
        Decimal256(..) => Decimal256(digits, 0),
        _ => Decimal128(digits, 0),
    }
}

fn decimal_scale(t: &DataType) -> i8 {
    match t {
        DataType::Decimal32(_, s)
        | DataType::Decimal64(_, s)
        | DataType::Decimal128(_, s)
        | DataType::Decimal256(_, s) => *s,
        _ => 0,
    }
}

/// The width in bytes and signedness of an integer type.
fn integer_shape(t: &DataType) -> Option<(u8, bool)> {
    use DataType::*;
    Some(match t {
        Int8 => (1, true),
        Int16 => (2, true),
        Int32 => (4, true),
        Int64 => (8, true),
        UInt8 => (1, false),
        UInt16 => (2, false),
        UInt32 => (4, false),
        UInt64 => (8, false),
        _ => return None,
    })
}

/// The common type of two integer types.
fn integer_type(l: &DataType, r: &DataType) -> Option<DataType> {
    use DataType::*;
    let ((w1, s1), (w2, s2)) = (integer_shape(l)?, integer_shape(r)?);
    let (width, signed) = if s1 == s2 {
        (w1.max(w2), s1)
    } else {
        let (signed_width, unsigned_width) = if s1 { (w1, w2) } else { (w2, w1) };
        if signed_width > unsigned_width {
            (signed_width, true)
        } else {
            ((unsigned_width * 2).min(8), true)
        }
    };
    Some(match (width, signed) {
        (1, true) => Int8,
        (2, true) => Int16,
        (4, true) => Int32,
        (_, true) => Int64,
        (1, false) => UInt8,
        (2, false) => UInt16,
        (4, false) => UInt32,
        (_, false) => UInt64,
    })
}

fn finer(a: TimeUnit, b: TimeUnit) -> TimeUnit {
    let rank = |u: TimeUnit| match u {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    };
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}

/// Whether `t` is a string type.
pub fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// The Arrow type of a SQL type name in `CAST(x AS type)`.
pub fn sql_type(t: &sqlparser::ast::DataType) -> Option<DataType> {
    use sqlparser::ast::{DataType as S, ExactNumberInfo};
    Some(match t {
        S::TinyInt(_) => DataType::Int8,
        S::SmallInt(_) | S::Int2(_) => DataType::Int16,
        S::Int(_) | S::Integer(_) | S::Int4(_) => DataType::Int32,
        S::BigInt(_) | S::Int8(_) => DataType::Int64,
        S::Real | S::Float4 => DataType::Float32,
        S::Float(_) | S::Double(_) | S::DoublePrecision | S::Float8 | S::Float64 => {
            DataType::Float64
        }
        S::Boolean | S::Bool => DataType::Boolean,
        S::Varchar(_) | S::Char(_) | S::Text | S::String(_) | S::CharVarying(_) => DataType::Utf8,
        S::Date => DataType::Date32,
        S::Timestamp(_, _) | S::Datetime(_) => DataType::Timestamp(TimeUnit::Microsecond, None),
        S::Decimal(info) | S::Numeric(info) | S::Dec(info) => match info {
            ExactNumberInfo::None => DataType::Decimal128(38, 10),
            ExactNumberInfo::Precision(p) => DataType::Decimal128((*p).min(38) as u8, 0),
            ExactNumberInfo::PrecisionAndScale(p, s) => {
                DataType::Decimal128((*p).min(38) as u8, (*s).clamp(0, 38) as i8)
            }
        },
        S::Custom(name, args) if args.is_empty() => {
            return crate::format::parse_type(&name.to_string()).ok();
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;

    #[test]
    fn numbers_widen() {
        assert_eq!(comparison_type(&Int32, &Int64), Some(Int64));
        assert_eq!(comparison_type(&UInt8, &Int8), Some(Int16));
        assert_eq!(comparison_type(&UInt64, &Int64), Some(Int64));
        assert_eq!(comparison_type(&Float32, &Int64), Some(Float64));
        assert_eq!(comparison_type(&Float32, &Float32), Some(Float32));
        assert_eq!(
            comparison_type(&Decimal128(10, 2), &Int32),
            Some(Decimal128(38, 2))
        );
        assert_eq!(
            arithmetic_types(&Decimal128(10, 2), &Int32),
            Some((Decimal128(10, 2), Decimal128(10, 0)))
        );
        assert_eq!(arithmetic_types(&Int8, &UInt32), Some((Int64, Int64)));
        assert_eq!(comparison_type(&Utf8, &Int32), None);
    }

    #[test]
    fn times_meet_at_the_finer_unit() {
        let ts = |u| Timestamp(u, None);
        assert_eq!(
            comparison_type(&ts(TimeUnit::Second), &ts(TimeUnit::Nanosecond)),
            Some(ts(TimeUnit::Nanosecond))
        );
        assert_eq!(
            comparison_type(&Date32, &ts(TimeUnit::Millisecond)),
            Some(ts(TimeUnit::Millisecond))
        );
        assert_eq!(comparison_type(&Utf8, &LargeUtf8), Some(LargeUtf8));
    }
}
