//! `cirro_guard(condition, value)`: `value` where `condition` is true, NULL
//! elsewhere — and `value` computed only on those rows. The guard rule
//! (`rules/guards.rs`) puts it around a condition that can fail, so that
//! `qty <> 0 AND 100 / qty > 3` never divides by zero; it survives
//! DataFusion's logical rewrites as it is (a boolean CASE would be turned
//! into AND/OR by the simplifier, and the conjuncts reordered), and the
//! physical rule [`crate::rules::LazyGuards`] turns it into a CASE, which
//! evaluates its THEN on the selected rows only. Where it is not turned
//! (a join's filter), it is evaluated as written here, both arguments first:
//! the right values, as long as `value` does not fail.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::datatypes::DataType;
use cirro_common::CirroError;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

pub const GUARD_NAME: &str = "cirro_guard";

#[derive(Debug, PartialEq, Eq, Hash)]
struct Guard {
    signature: Signature,
}

impl ScalarUDFImpl for Guard {
    fn name(&self) -> &str {
        GUARD_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    /// Named after the guarded value, which it stands for.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(args
            .get(1)
            .map(|a| a.schema_name().to_string())
            .unwrap_or_default())
    }

    /// The value is not computed everywhere: common subexpressions are not
    /// hoisted out of it.
    fn short_circuits(&self) -> bool {
        true
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [condition, value] = args.args.as_slice() else {
            return Err(CirroError::internal("cirro_guard takes two arguments").into_datafusion());
        };
        let rows = args.number_rows;
        let condition = condition.to_array(rows)?;
        let value = value.to_array(rows)?;
        let (condition, value) = (condition.as_boolean(), value.as_boolean());
        let guarded: BooleanArray = (0..rows)
            .map(|i| {
                (condition.is_valid(i) && condition.value(i) && value.is_valid(i))
                    .then(|| value.value(i))
            })
            .collect();
        if rows == 1
            && args
                .args
                .iter()
                .all(|a| matches!(a, ColumnarValue::Scalar(_)))
        {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &guarded, 0,
            )?));
        }
        Ok(ColumnarValue::Array(Arc::new(guarded)))
    }
}

static GUARD: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
    Arc::new(ScalarUDF::new_from_impl(Guard {
        signature: Signature::exact(
            vec![DataType::Boolean, DataType::Boolean],
            Volatility::Immutable,
        ),
    }))
});

pub fn guard_udf() -> Arc<ScalarUDF> {
    Arc::clone(&GUARD)
}
