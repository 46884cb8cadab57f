//! Integer arithmetic that fails on overflow (22003) instead of wrapping.
//!
//! DataFusion evaluates `+`, `-`, `*` and negation of integers with Arrow's
//! wrapping kernels (`9223372036854775807 + 1` is `-9223372036854775808`),
//! and its binary operator cannot be told otherwise from a plan. PostgreSQL
//! raises "bigint out of range". So the `checked_arithmetic` rule
//! (`rules/checked.rs`) puts these functions in place of the integer
//! operators; they run Arrow's checked kernels. Their column names are the
//! operator's (`a + b`), so no output name changes.
//!
//! Floats too: PostgreSQL's `float8pl`, `float8mi` and `float8mul` fail
//! with 22003 "value out of range: overflow" where finite operands give an
//! infinity (`1e300::float8 * 1e300`), and a product of two non-zero
//! values that comes out zero is "underflow"; Arrow's kernels give
//! infinity and zero. (The compiled kernels of `jit` leave these to the
//! interpreted path.)

use std::fmt;
use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Datum};
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use arrow::error::ArrowError;
use cirro_common::{CirroError, SqlState};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::physical_expr_common::datum::apply;

/// Which operation a checked function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckedOp {
    Add,
    Subtract,
    Multiply,
    Negate,
}

impl CheckedOp {
    pub fn of(op: Operator) -> Option<Self> {
        match op {
            Operator::Plus => Some(Self::Add),
            Operator::Minus => Some(Self::Subtract),
            Operator::Multiply => Some(Self::Multiply),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Add => "checked_add",
            Self::Subtract => "checked_subtract",
            Self::Multiply => "checked_multiply",
            Self::Negate => "checked_negate",
        }
    }

    fn operator(self) -> &'static str {
        match self {
            Self::Add => "+",
            Self::Subtract | Self::Negate => "-",
            Self::Multiply => "*",
        }
    }
}

impl fmt::Display for CheckedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    op: CheckedOp,
    signature: Signature,
}

impl ScalarUDFImpl for Checked {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The rule calls these with operands already coerced to one integer type.
    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    /// The operator's own name (`a + b`, `(- a)`), so that output columns are
    /// named as before the rewrite.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(match (self.op, args) {
            (CheckedOp::Negate, [arg]) => format!("(- {})", arg.schema_name()),
            (op, [left, right]) => format!(
                "{} {} {}",
                left.schema_name(),
                op.operator(),
                right.schema_name()
            ),
            (op, _) => op.name().to_string(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let type_name = pg_type_name(&args.return_field.data_type().clone());
        let out_of_range = |e: ArrowError| match e {
            ArrowError::ArithmeticOverflow(_) => CirroError::new(
                SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                format!("{type_name} out of range"),
            )
            .into_datafusion(),
            other => other.into(),
        };
        match (self.op, args.args.as_slice()) {
            (CheckedOp::Negate, [value]) => match value {
                ColumnarValue::Array(array) => numeric::neg(array.as_ref())
                    .map(ColumnarValue::Array)
                    .map_err(out_of_range),
                ColumnarValue::Scalar(scalar) => {
                    let array = scalar.to_array()?;
                    let negated = numeric::neg(array.as_ref()).map_err(out_of_range)?;
                    Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                        &negated, 0,
                    )?))
                }
            },
            (op, [left, right]) => {
                let kernel = match op {
                    CheckedOp::Add => numeric::add,
                    CheckedOp::Subtract => numeric::sub,
                    _ => numeric::mul,
                };
                let result = apply(left, right, |l: &dyn Datum, r: &dyn Datum| kernel(l, r))
                    .map_err(|e| match e {
                        datafusion::error::DataFusionError::ArrowError(inner, _) => {
                            out_of_range(*inner)
                        }
                        other => other,
                    })?;
                if args.return_field.data_type().is_floating() {
                    check_float_range(op, left, right, &result)?;
                }
                Ok(result)
            }
            (op, args) => Err(CirroError::internal(format!(
                "{op} takes {} arguments, got {}",
                if op == CheckedOp::Negate { 1 } else { 2 },
                args.len()
            ))
            .into_datafusion()),
        }
    }
}

/// The float rows of `l op r` as PostgreSQL's float operators check them:
/// an infinity from finite operands is an overflow, a zero product of
/// non-zero operands an underflow (both 22003).
pub(crate) fn check_float_range(
    op: CheckedOp,
    l: &ColumnarValue,
    r: &ColumnarValue,
    result: &ColumnarValue,
) -> Result<()> {
    let rows = match result {
        ColumnarValue::Array(a) => a.len(),
        ColumnarValue::Scalar(_) => 1,
    };
    let [l, r, out] = [l, r, result].map(|v| v.to_array(rows));
    let (l, r, out) = (l?, r?, out?);
    let value = float_at;
    for i in 0..rows {
        if out.is_null(i) {
            continue;
        }
        let (a, b, v) = (value(&l, i), value(&r, i), value(&out, i));
        let problem = if v.is_infinite() && a.is_finite() && b.is_finite() {
            Some("overflow")
        } else if op == CheckedOp::Multiply && v == 0.0 && a != 0.0 && b != 0.0 {
            Some("underflow")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(float_out_of_range(problem));
        }
    }
    Ok(())
}

/// Row `i` of a float array as a double.
pub(crate) fn float_at(a: &ArrayRef, i: usize) -> f64 {
    match a.data_type() {
        DataType::Float32 => f64::from(a.as_primitive::<Float32Type>().value(i)),
        _ => a.as_primitive::<Float64Type>().value(i),
    }
}

/// PostgreSQL's error for a float result out of range (`problem`:
/// "overflow" or "underflow").
pub(crate) fn float_out_of_range(problem: &str) -> datafusion::error::DataFusionError {
    CirroError::new(
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        format!("value out of range: {problem}"),
    )
    .into_datafusion()
}

/// PostgreSQL's name for an integer type, for "bigint out of range".
fn pg_type_name(data_type: &DataType) -> &'static str {
    match data_type {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint",
        DataType::Int32 | DataType::UInt16 => "integer",
        _ => "bigint",
    }
}

/// The shared function for `op`.
pub fn checked_udf(op: CheckedOp) -> Arc<ScalarUDF> {
    static UDFS: LazyLock<[Arc<ScalarUDF>; 4]> = LazyLock::new(|| {
        [
            CheckedOp::Add,
            CheckedOp::Subtract,
            CheckedOp::Multiply,
            CheckedOp::Negate,
        ]
        .map(|op| {
            let arity = if op == CheckedOp::Negate { 1 } else { 2 };
            Arc::new(ScalarUDF::new_from_impl(Checked {
                op,
                signature: Signature::any(arity, Volatility::Immutable),
            }))
        })
    });
    let index = match op {
        CheckedOp::Add => 0,
        CheckedOp::Subtract => 1,
        CheckedOp::Multiply => 2,
        CheckedOp::Negate => 3,
    };
    Arc::clone(&UDFS[index])
}
