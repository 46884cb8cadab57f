//! PostgreSQL's numeric rules where DataFusion's differ (found by the
//! differential test against DuckDB, which follows PostgreSQL here):
//!
//! - a cast of a float or a NUMERIC to an integer rounds (floats to the
//!   nearest even, as PostgreSQL's `rint`; NUMERIC half away from zero);
//!   Arrow's cast truncates (`CAST(3.5::double AS INT)` gave 3, not 4);
//! - NUMERIC division keeps at least 16 significant digits and rounds the
//!   last; DataFusion's (Spark's rule) keeps 6 decimals and truncates
//!   (`1.25 / 3` gave 0.416666, PostgreSQL 0.41666666666666666667).
//!
//! The `checked_arithmetic` rule (`rules/checked.rs`) puts these functions
//! in place; they keep the names of the expressions they replace.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, PrimitiveArray};
use arrow::datatypes::{
    DECIMAL128_MAX_PRECISION, DataType, Decimal128Type, Float32Type, Float64Type, i256,
};
use cirro_common::{CirroError, SqlState};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Decimal digits PostgreSQL's NUMERIC division keeps at least
/// (`NUMERIC_MIN_SIG_DIGITS`); here the result's scale.
const DIVISION_SCALE_MIN: i8 = 16;

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
/// quotient can have, and [`DIVISION_SCALE_MIN`] decimals as far as
/// [`WIRE_DIGITS_MAX`] allows, never fewer than the operands' scale, as far
/// as 38 digits allow.
pub fn numeric_divide_type(l: &DataType, r: &DataType) -> Option<DataType> {
    let (DataType::Decimal128(p1, s1), DataType::Decimal128(_, s2)) = (l, r) else {
        return None;
    };
    let integer_digits = (*p1 as i16 - *s1 as i16 + *s2 as i16).max(1);
    // At least 6 decimals, as DataFusion's own division: a ratio of two
    // sums of DECIMAL(38, 4) (TPC-H Q8) would otherwise have none.
    let scale = (DIVISION_SCALE_MIN as i16)
        .min(WIRE_DIGITS_MAX - integer_digits)
        .max(*s1.max(s2) as i16)
        .max(6)
        .min(DECIMAL128_MAX_PRECISION as i16);
    Some(DataType::Decimal128(DECIMAL128_MAX_PRECISION, scale as i8))
}

/// Digits of a NUMERIC the PostgreSQL wire can carry: arrow-pg encodes
/// NUMERIC through rust_decimal, which holds 28. A quotient or an average
/// gets fewer than 16 decimals where its integer digits would push it past
/// that.
pub const WIRE_DIGITS_MAX: i16 = 28;

#[derive(Debug, PartialEq, Eq, Hash)]
struct NumericDivide {
    signature: Signature,
}

fn ten_to(power: u32) -> i256 {
    i256::from_i128(10).wrapping_pow(power)
}

/// `l / r` at `scale`, rounded half away from zero, or None if it needs
/// more than 38 digits.
fn divide(l: i128, s1: i8, r: i128, s2: i8, scale: i8) -> Option<i128> {
    // l·10^-s1 / (r·10^-s2) = (l·10^(scale-s1+s2) / r)·10^-scale
    let shift = scale as i32 - s1 as i32 + s2 as i32;
    let (mut num, mut den) = (i256::from_i128(l), i256::from_i128(r));
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
            [l, r] => numeric_divide_type(l, r),
            _ => None,
        }
        .ok_or_else(|| CirroError::internal("numeric_divide takes two NUMERICs").into_datafusion())
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(match args {
            [l, r] => format!("{} / {}", l.schema_name(), r.schema_name()),
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
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
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
            let quotient = divide(l.value(i), s1, divisor, s2, scale).ok_or_else(|| {
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

/// The shared NUMERIC division function.
pub fn numeric_divide_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(NumericDivide {
            signature: Signature::any(2, Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_round_half_away_from_zero() {
        assert_eq!(round_decimal(250, 2), 300);
        assert_eq!(round_decimal(249, 2), 200);
        assert_eq!(round_decimal(-250, 2), -300);
        assert_eq!(round_decimal(-1_235_50, 2), -1_236_00);
        assert_eq!(round_decimal(7, 0), 7);
    }

    #[test]
    fn division_keeps_sixteen_decimals_and_rounds() {
        // 1.25 / 3 = 0.4166666666666666|67 → …667
        assert_eq!(divide(125, 2, 3, 0, 16), Some(4_166_666_666_666_667));
        assert_eq!(divide(-125, 2, 3, 0, 16), Some(-4_166_666_666_666_667));
        assert_eq!(divide(1, 0, 8, 0, 3), Some(125));
        assert_eq!(divide(1, 0, 16, 0, 3), Some(63));
        assert_eq!(divide(10i128.pow(37), 0, 1, 2, 0), None);
        assert_eq!(
            numeric_divide_type(&DataType::Decimal128(12, 2), &DataType::Decimal128(20, 0)),
            Some(DataType::Decimal128(38, 16))
        );
        assert_eq!(
            numeric_divide_type(&DataType::Decimal128(38, 4), &DataType::Decimal128(38, 4)),
            Some(DataType::Decimal128(38, 6))
        );
    }
}
