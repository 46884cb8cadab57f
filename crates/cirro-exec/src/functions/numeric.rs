//! PostgreSQL's numeric rules where DataFusion's differ (found by the
//! differential test against DuckDB, which follows PostgreSQL here):
//!
//! - a cast of a float or a NUMERIC to an integer rounds (floats to the
//!   nearest even, as PostgreSQL's `rint`; NUMERIC half away from zero);
//!   Arrow's cast truncates (`CAST(3.5::double AS INT)` gave 3, not 4);
//! - NUMERIC division rounds at PostgreSQL's scale (16 significant digits,
//!   `select_div_scale`); DataFusion's (Spark's rule) keeps 6 decimals and
//!   truncates (`1.25 / 3` gave 0.416666, PostgreSQL 0.41666666666666666667).
//!
//! The `checked_arithmetic` rule (`rules/checked.rs`) puts these functions
//! in place; they keep the names of the expressions they replace.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, PrimitiveArray};
use arrow::datatypes::{
    DECIMAL128_MAX_PRECISION, DataType, Decimal128Type, Field, FieldRef, Float32Type, Float64Type,
    i256,
};
use cirro_common::{CirroError, SqlState};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TypeSignature, Volatility,
};

/// The decimals of a NUMERIC quotient's type where its integer digits leave
/// room: PostgreSQL's scale for a quotient between 1 and 10000 (its 16
/// significant digits, `NUMERIC_MIN_SIG_DIGITS`). Not more: a product of
/// two quotients at 20 decimals each passes 38 (DataFusion then refused
/// `a / b * c / d`; found by the fuzz test). A quotient of two literals has
/// PostgreSQL's own scale.
const DIVISION_SCALE: i8 = 16;

#[derive(Debug, PartialEq, Eq, Hash)]
struct RoundToInteger {
    signature: Signature,
}

/// `v` (a decimal of `scale`) rounded half away from zero to a whole number,
/// at the same scale.
fn round_decimal(v: i128, scale: i8) -> i128 {
    if scale <= 0 {
        return v;
    }
    let unit = 10i128.pow(scale as u32);
    let (whole, rest) = (v / unit, v % unit);
    let whole = if rest.abs() * 2 >= unit {
        whole + v.signum()
    } else {
        whole
    };
    whole * unit
}

/// A float or NUMERIC value rounded to a whole number as PostgreSQL's cast
/// to an integer rounds it (floats to the nearest even, NUMERIC half away
/// from zero), in its own type; other values as they are. For values bound
/// to parameters, which are cast without a plan.
pub fn round_scalar_to_integer(value: ScalarValue) -> ScalarValue {
    match value {
        ScalarValue::Float64(Some(f)) => ScalarValue::Float64(Some(f.round_ties_even())),
        ScalarValue::Float32(Some(f)) => ScalarValue::Float32(Some(f.round_ties_even())),
        ScalarValue::Decimal128(Some(v), p, s) => {
            ScalarValue::Decimal128(Some(round_decimal(v, s)), p, s)
        }
        other => other,
    }
}

fn on_array(
    value: &ColumnarValue,
    f: impl Fn(&ArrayRef) -> Result<ArrayRef>,
) -> Result<ColumnarValue> {
    match value {
        ColumnarValue::Array(array) => f(array).map(ColumnarValue::Array),
        ColumnarValue::Scalar(scalar) => {
            let out = f(&scalar.to_array()?)?;
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        }
    }
}

impl ScalarUDFImpl for RoundToInteger {
    fn name(&self) -> &str {
        "round_to_integer"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(args
            .first()
            .map(|a| a.schema_name().to_string())
            .unwrap_or_default())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return Err(
                CirroError::internal("round_to_integer takes one argument").into_datafusion()
            );
        };
        on_array(value, |array| {
            Ok(match array.data_type() {
                DataType::Float64 => Arc::new(
                    array
                        .as_primitive::<Float64Type>()
                        .unary::<_, Float64Type>(f64::round_ties_even),
                ) as ArrayRef,
                DataType::Float32 => Arc::new(
                    array
                        .as_primitive::<Float32Type>()
                        .unary::<_, Float32Type>(f32::round_ties_even),
                ),
                DataType::Decimal128(p, s) => {
                    let scale = *s;
                    let rounded: Decimal128Array = array
                        .as_primitive::<Decimal128Type>()
                        .unary(|v| round_decimal(v, scale));
                    Arc::new(rounded.with_precision_and_scale(*p, *s)?)
                }
                _ => Arc::clone(array),
            })
        })
    }
}

/// The type of `l / r` for two NUMERICs: as many integer digits as the
/// quotient can have and [`DIVISION_SCALE`] decimals as far as 38 digits
/// allow, never fewer than the operands' scales nor 6. Each quotient is
/// rounded where PostgreSQL rounds it ([`pg_divide`]), so its value is
/// PostgreSQL's wherever that scale is within this type's; PostgreSQL's
/// NUMERIC has a scale per value, an Arrow column one for all, so the
/// zeros shown after the last digit can differ.
pub fn numeric_divide_type(l: &DataType, r: &DataType) -> Option<DataType> {
    let (DataType::Decimal128(p1, s1), DataType::Decimal128(_, s2)) = (l, r) else {
        return None;
    };
    let integer_digits = (*p1 as i16 - *s1 as i16 + *s2 as i16).max(1);
    // At least 6 decimals, as DataFusion's own division: a ratio of two
    // sums of DECIMAL(38, 4) (TPC-H Q8) would otherwise have none.
    let scale = (DIVISION_SCALE as i16)
        .min(DECIMAL128_MAX_PRECISION as i16 - integer_digits)
        .max(*s1.max(s2) as i16)
        .max(6)
        .min(DECIMAL128_MAX_PRECISION as i16);
    Some(DataType::Decimal128(DECIMAL128_MAX_PRECISION, scale as i8))
}

/// The scale PostgreSQL gives the quotient of the NUMERIC literals `l`
/// and `r` (value, scale), if it is within 38 digits: psql then shows
/// `5.0 / 2` as PostgreSQL's 2.5000000000000000.
pub fn literal_quotient_scale(l: (i128, i8), r: (i128, i8)) -> Option<i8> {
    let (l, s1, r, s2) = (i256::from_i128(l.0), l.1, i256::from_i128(r.0), r.1);
    if r == i256::ZERO {
        return None;
    }
    let scale = i8::try_from(pg_division_scale(l, s1, s1, r, s2)).ok()?;
    (scale <= DECIMAL128_MAX_PRECISION as i8 && pg_divide(l, s1, s1, r, s2, scale).is_some())
        .then_some(scale)
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct NumericDivide {
    signature: Signature,
}

fn ten_to(power: u32) -> i256 {
    i256::from_i128(10).wrapping_pow(power)
}

/// The weight of |`v`|·10^-`scale` in base-10000 digits and its first such
/// digit, as PostgreSQL's NUMERIC stores it; (0, 0) for zero.
fn weight_and_first_digit(v: i256, scale: i8) -> (i32, i32) {
    if v == i256::ZERO {
        return (0, 0);
    }
    // |v|'s digit count and its leading `k` digits: in 128 bits where it
    // fits (every operand of a division), else through its text (sums).
    let (len, leading): (i32, Box<dyn Fn(u32) -> i32>) = match v.wrapping_abs().to_i128() {
        Some(small) => {
            let u = small.unsigned_abs();
            let len = u.ilog10() as i32 + 1;
            (
                len,
                Box::new(move |k| (u / 10u128.pow((len as u32).saturating_sub(k))) as i32),
            )
        }
        None => {
            let digits = v.wrapping_abs().to_string();
            let len = digits.len() as i32;
            (
                len,
                Box::new(move |k| {
                    digits[..(k as usize).min(digits.len())]
                        .parse()
                        .unwrap_or(0)
                }),
            )
        }
    };
    let exponent = len - 1 - scale as i32;
    let weight = exponent.div_euclid(4);
    // The first base-10000 digit holds the `lead` digits from 10^exponent
    // down to 10^(4·weight).
    let lead = (exponent - 4 * weight + 1) as u32;
    let first = leading(lead) * 10i32.pow(lead.saturating_sub(len as u32));
    (weight, first)
}

/// The scale PostgreSQL gives `l / r` (numeric.c's `select_div_scale`): 16
/// significant digits (`NUMERIC_MIN_SIG_DIGITS`) by the estimated weight
/// of the quotient, never fewer decimals than either operand has.
fn pg_division_scale(l: i256, s1: i8, dscale1: i8, r: i256, s2: i8) -> i32 {
    let (w1, d1) = weight_and_first_digit(l, s1);
    let (w2, d2) = weight_and_first_digit(r, s2);
    let mut qweight = w1 - w2;
    if d1 <= d2 {
        qweight -= 1;
    }
    (16 - qweight * 4)
        .max(i32::from(dscale1))
        .max(i32::from(s2))
        .clamp(0, 1000)
}

/// `l / r` (decimals of scales `s1`, `s2`) rounded half away from zero at
/// PostgreSQL's scale for these values, or at `scale` where that is fewer,
/// given at `scale`; None if it needs more than 38 digits. `dscale1` is the
/// scale PostgreSQL's dividend would show (`s1`, or fewer where `l` was
/// widened: an average's sum of integers).
pub(crate) fn pg_divide(l: i256, s1: i8, dscale1: i8, r: i256, s2: i8, scale: i8) -> Option<i128> {
    let at = pg_division_scale(l, s1, dscale1, r, s2).min(i32::from(scale)) as i8;
    let q = divide(l, s1, r, s2, at)?;
    let q = i256::from_i128(q).checked_mul(ten_to((scale - at) as u32))?;
    (q.wrapping_abs() < ten_to(DECIMAL128_MAX_PRECISION as u32)).then(|| q.as_i128())
}

/// `l / r` at `scale`, rounded half away from zero, or None if it needs
/// more than 38 digits.
fn divide(l: i256, s1: i8, r: i256, s2: i8, scale: i8) -> Option<i128> {
    // l·10^-s1 / (r·10^-s2) = (l·10^(scale-s1+s2) / r)·10^-scale
    let shift = scale as i32 - s1 as i32 + s2 as i32;
    let (mut num, mut den) = (l, r);
    if shift >= 0 {
        num = num.checked_mul(ten_to(shift as u32))?;
    } else {
        den = den.checked_mul(ten_to((-shift) as u32))?;
    }
    let (q, rem) = (num.checked_div(den)?, num.checked_rem(den)?);
    let negative = (num < i256::ZERO) != (den < i256::ZERO);
    let q = if rem.wrapping_abs().wrapping_mul(i256::from_i128(2)) >= den.wrapping_abs() {
        if negative {
            q - i256::ONE
        } else {
            q + i256::ONE
        }
    } else {
        q
    };
    let limit = ten_to(DECIMAL128_MAX_PRECISION as u32);
    (q.wrapping_abs() < limit).then(|| q.as_i128())
}

impl ScalarUDFImpl for NumericDivide {
    fn name(&self) -> &str {
        "numeric_divide"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [l, r] | [l, r, _] => numeric_divide_type(l, r),
            _ => None,
        }
        .ok_or_else(|| CirroError::internal("numeric_divide takes two NUMERICs").into_datafusion())
    }

    /// A third argument, a literal, fixes the result's scale: PostgreSQL's
    /// for a quotient of two literals ([`literal_quotient_scale`]).
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let data_type = match args.scalar_arguments.get(2) {
            Some(Some(ScalarValue::Int64(Some(scale)))) => {
                DataType::Decimal128(DECIMAL128_MAX_PRECISION, *scale as i8)
            }
            _ => self.return_type(&types)?,
        };
        Ok(Arc::new(Field::new(self.name(), data_type, true)))
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(match args {
            [l, r] | [l, r, _] => format!("{} / {}", l.schema_name(), r.schema_name()),
            _ => self.name().to_string(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let DataType::Decimal128(_, scale) = *args.return_field.data_type() else {
            return Err(CirroError::internal("numeric_divide returns a NUMERIC").into_datafusion());
        };
        let scalars = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args[..2.min(args.args.len())])?;
        let [l, r] = arrays.as_slice() else {
            return Err(
                CirroError::internal("numeric_divide takes two arguments").into_datafusion()
            );
        };
        let (DataType::Decimal128(_, s1), DataType::Decimal128(_, s2)) =
            (l.data_type(), r.data_type())
        else {
            return Err(CirroError::internal("numeric_divide takes two NUMERICs").into_datafusion());
        };
        let (s1, s2) = (*s1, *s2);
        let (l, r) = (
            l.as_primitive::<Decimal128Type>(),
            r.as_primitive::<Decimal128Type>(),
        );
        let mut out = Vec::with_capacity(l.len());
        for i in 0..l.len() {
            if l.is_null(i) || r.is_null(i) {
                out.push(None);
                continue;
            }
            let divisor = r.value(i);
            if divisor == 0 {
                return Err(
                    CirroError::new(SqlState::DIVISION_BY_ZERO, "division by zero")
                        .into_datafusion(),
                );
            }
            let quotient = pg_divide(
                i256::from_i128(l.value(i)),
                s1,
                s1,
                i256::from_i128(divisor),
                s2,
                scale,
            )
            .ok_or_else(|| {
                CirroError::new(
                    SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                    "numeric field overflow",
                )
                .into_datafusion()
            })?;
            out.push(Some(quotient));
        }
        let result: ArrayRef = Arc::new(
            PrimitiveArray::<Decimal128Type>::from(out)
                .with_precision_and_scale(DECIMAL128_MAX_PRECISION, scale)?,
        );
        Ok(if scalars {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

/// `l / r` of floats, but 22012 where `r` is zero (PostgreSQL's float
/// division; Arrow's gives infinity or NaN).
#[derive(Debug, PartialEq, Eq, Hash)]
struct FloatDivide {
    signature: Signature,
}

impl ScalarUDFImpl for FloatDivide {
    fn name(&self) -> &str {
        "float_divide"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(match args {
            [l, r] => format!("{} / {}", l.schema_name(), r.schema_name()),
            _ => self.name().to_string(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalars = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [l, r] = arrays.as_slice() else {
            return Err(CirroError::internal("float_divide takes two arguments").into_datafusion());
        };
        let zero = match r.data_type() {
            DataType::Float64 => r
                .as_primitive::<Float64Type>()
                .iter()
                .any(|v| v == Some(0.0)),
            DataType::Float32 => r
                .as_primitive::<Float32Type>()
                .iter()
                .any(|v| v == Some(0.0)),
            _ => false,
        };
        if zero {
            // A row with a NULL operand is not divided (NULL, no error).
            let divides_by_zero = (0..r.len()).any(|i| {
                !l.is_null(i)
                    && !r.is_null(i)
                    && match r.data_type() {
                        DataType::Float64 => r.as_primitive::<Float64Type>().value(i) == 0.0,
                        _ => r.as_primitive::<Float32Type>().value(i) == 0.0,
                    }
            });
            if divides_by_zero {
                return Err(
                    CirroError::new(SqlState::DIVISION_BY_ZERO, "division by zero")
                        .into_datafusion(),
                );
            }
        }
        let result = arrow::compute::kernels::numeric::div(l, r)?;
        // PostgreSQL's float8div: an infinity from a finite dividend is an
        // overflow, a zero from a non-zero dividend and a finite divisor an
        // underflow (22003; `1e300::float8 / 1e-300`).
        let value = super::checked::float_at;
        for i in 0..result.len() {
            if result.is_null(i) {
                continue;
            }
            let (a, b, q) = (value(l, i), value(r, i), value(&result, i));
            let problem = if q.is_infinite() && a.is_finite() {
                Some("overflow")
            } else if q == 0.0 && a != 0.0 && b.is_finite() {
                Some("underflow")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(super::checked::float_out_of_range(problem));
            }
        }
        Ok(if scalars {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

/// The shared float division function.
pub fn float_divide_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(FloatDivide {
            signature: Signature::any(2, Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}

/// The shared cast-rounding function.
pub fn round_to_integer_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(RoundToInteger {
            signature: Signature::any(1, Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}

/// The shared NUMERIC division function: `numeric_divide(l, r[, scale])`.
pub fn numeric_divide_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(NumericDivide {
            signature: Signature::one_of(
                vec![TypeSignature::Any(2), TypeSignature::Any(3)],
                Volatility::Immutable,
            ),
        }))
    });
    Arc::clone(&UDF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotients_round_where_postgresql_rounds() {
        // (value, scale) ÷ (value, scale) → PostgreSQL's scale, as psql shows.
        let cases: [((i128, i8), (i128, i8), i32); 6] = [
            ((2_147_483_647, 0), (6, 2), 8),  // 35791394116.66666667
            ((-3_000_000_000, 0), (2, 1), 8), // -15000000000.00000000
            ((7, 0), (1, 6), 12),             // 7000000.000000000000
            ((125, 2), (3, 0), 20),           // 0.41666666666666666667
            ((-1005, 3), (25, 1), 20),        // -0.40200000000000000000
            ((1_234_567_890_123_456_789, 0), (-3, 0), 0),
        ];
        for ((l, s1), (r, s2), scale) in cases {
            assert_eq!(
                pg_division_scale(big(l), s1, s1, big(r), s2),
                scale,
                "{l}e-{s1} / {r}e-{s2}"
            );
        }
        assert_eq!(weight_and_first_digit(big(6), 2), (-1, 600));
        assert_eq!(weight_and_first_digit(big(2_147_483_647), 0), (2, 21));
        assert_eq!(weight_and_first_digit(big(1), 6), (-2, 100));
        assert_eq!(weight_and_first_digit(big(0), 3), (0, 0));
        // 1234567890123456789 / 7 = 176366841446208112.71…: PostgreSQL's
        // scale is 0, the type's 6: 176366841446208113.000000.
        assert_eq!(
            pg_divide(big(1_234_567_890_123_456_789), 0, 0, big(7), 0, 6),
            Some(176_366_841_446_208_113_000_000)
        );
        // 1.25 / 3 at a type of 16 decimals: rounded there.
        assert_eq!(
            pg_divide(big(125), 2, 2, big(3), 0, 16),
            Some(4_166_666_666_666_667)
        );
    }

    #[test]
    fn decimals_round_half_away_from_zero() {
        assert_eq!(round_decimal(250, 2), 300);
        assert_eq!(round_decimal(249, 2), 200);
        assert_eq!(round_decimal(-250, 2), -300);
        assert_eq!(round_decimal(-1_235_50, 2), -1_236_00);
        assert_eq!(round_decimal(7, 0), 7);
    }

    fn big(v: i128) -> i256 {
        i256::from_i128(v)
    }

    #[test]
    fn division_rounds_half_away_from_zero() {
        // 1.25 / 3 = 0.4166666666666666|67 → …667
        assert_eq!(
            divide(big(125), 2, big(3), 0, 16),
            Some(4_166_666_666_666_667)
        );
        assert_eq!(
            divide(big(-125), 2, big(3), 0, 16),
            Some(-4_166_666_666_666_667)
        );
        assert_eq!(divide(big(1), 0, big(8), 0, 3), Some(125));
        assert_eq!(divide(big(1), 0, big(16), 0, 3), Some(63));
        assert_eq!(divide(big(10i128.pow(37)), 0, big(1), 2, 0), None);
        assert_eq!(
            numeric_divide_type(&DataType::Decimal128(12, 2), &DataType::Decimal128(20, 0)),
            Some(DataType::Decimal128(38, 16))
        );
        assert_eq!(
            numeric_divide_type(&DataType::Decimal128(20, 0), &DataType::Decimal128(3, 2)),
            Some(DataType::Decimal128(38, 16))
        );
        assert_eq!(
            numeric_divide_type(&DataType::Decimal128(38, 4), &DataType::Decimal128(38, 4)),
            Some(DataType::Decimal128(38, 6))
        );
    }
}
