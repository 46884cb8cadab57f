//! String functions whose result can be far larger than their arguments
//! (`repeat`, `lpad`, `rpad`), with the result's size checked before it is
//! built: a value over PostgreSQL's 1 GB is 54000 ("requested length too
//! large"), and results over what the statement's memory limit has left are
//! 53200. DataFusion's own would build them first (`repeat('x', 2e9)` held
//! 2 GB for 26 s under a 100 MB limit). Each session registers them over
//! DataFusion's, with its memory pool.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use cirro_common::{CirroError, SqlState};
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

use crate::resources::{SessionMemory, format_bytes};

/// PostgreSQL's largest value (MaxAllocSize, 1 GB - 1).
pub const VALUE_BYTES_MAX: u64 = (1 << 30) - 1;

/// Bytes a character of a padded result takes at most (UTF-8).
const CHAR_BYTES_MAX: u64 = 4;

#[derive(Debug)]
struct Sized {
    inner: Arc<ScalarUDF>,
    memory: Arc<SessionMemory>,
}

impl PartialEq for Sized {
    fn eq(&self, other: &Self) -> bool {
        self.inner.name() == other.inner.name() && Arc::ptr_eq(&self.memory, &other.memory)
    }
}

impl Eq for Sized {}

impl Hash for Sized {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.name().hash(state);
    }
}

/// The bytes each row's result will take at most, by the function's
/// arguments (None: a NULL argument, no result).
fn result_bytes(name: &str, args: &[arrow::array::ArrayRef]) -> Result<Vec<Option<u64>>> {
    let (Some(text), Some(count)) = (args.first(), args.get(1)) else {
        return Ok(Vec::new());
    };
    let text = arrow::compute::cast(text, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    let count = arrow::compute::cast(count, &DataType::Int64)?;
    let count = count.as_primitive::<Int64Type>();
    Ok((0..text.len())
        .map(|i| {
            if text.is_null(i) || count.is_null(i) {
                return None;
            }
            let count = count.value(i).max(0) as u64;
            Some(match name {
                "repeat" => (text.value(i).len() as u64).saturating_mul(count),
                // lpad/rpad: `count` characters of the text and the fill.
                _ => count.saturating_mul(CHAR_BYTES_MAX),
            })
        })
        .collect())
}

impl ScalarUDFImpl for Sized {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.inner.return_type(args)
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let mut total: u64 = 0;
        for bytes in result_bytes(self.name(), &arrays)?.into_iter().flatten() {
            if bytes > VALUE_BYTES_MAX {
                return Err(CirroError::new(
                    SqlState::PROGRAM_LIMIT_EXCEEDED,
                    "requested length too large",
                )
                .into_datafusion());
            }
            total = total.saturating_add(bytes);
        }
        let query = self.memory.current();
        let left = query.limit().saturating_sub(query.used()) as u64;
        if total > left {
            return Err(CirroError::new(
                SqlState::OUT_OF_MEMORY,
                format!(
                    "out of memory: the results of {} need {}, more than the {} the statement's memory limit ({}) has left (SET memory_limit)",
                    self.name(),
                    format_bytes(total as usize),
                    format_bytes(left as usize),
                    format_bytes(query.limit())
                ),
            )
            .into_datafusion());
        }
        self.inner.invoke_with_args(args)
    }
}

/// `repeat`, `lpad` and `rpad` checked against `memory` (see the module docs).
pub fn sized_udfs(memory: &Arc<SessionMemory>) -> Vec<ScalarUDF> {
    [
        datafusion::functions::string::repeat(),
        datafusion::functions::unicode::lpad(),
        datafusion::functions::unicode::rpad(),
    ]
    .into_iter()
    .map(|inner| {
        ScalarUDF::new_from_impl(Sized {
            inner,
            memory: Arc::clone(memory),
        })
    })
    .collect()
}
