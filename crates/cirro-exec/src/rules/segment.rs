//! `cirro_segment(x)`: the identity, with a short name. See `chains.rs`.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use cirro_common::limits::CHAIN_SEGMENT_FUNCTION as SEGMENT_FUNCTION;

#[derive(Debug, PartialEq, Eq, Hash)]
struct Segment {
    signature: Signature,
}

impl ScalarUDFImpl for Segment {
    fn name(&self) -> &str {
        SEGMENT_FUNCTION
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    /// Short on purpose: naming the level above must not print everything below.
    fn schema_name(&self, _args: &[Expr]) -> Result<String> {
        Ok("cirro_segment(...)".to_string())
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(args.args.swap_remove(0))
    }
}

/// The shared instance (one per process; the UDF holds no state).
pub fn segment_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(Segment {
            signature: Signature::any(1, Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}
