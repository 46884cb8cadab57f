//! A filter's conjuncts evaluated one after another, each on the rows the
//! ones before it kept, reading only its own columns.
//!
//! DataFusion evaluates `a AND b` by evaluating `a`, then `b` on every row,
//! unless at most a fifth of the rows passed `a`: then (its pre-selection)
//! it filters the whole batch by `a`, every column of it, evaluates `b` on
//! that, and scatters the answers back row run by row run. TPC-H Q19's
//! lineitem filter keeps 15 % of the rows after its first two conjuncts;
//! the third, `l_shipmode IN ('AIR', 'AIR REG')`, reads one column, but the
//! pre-selection copied six (decimals and strings of 16 bytes each) and
//! the scatter appended one value at a time: together about a third of the
//! query's time.
//!
//! [`Conjunction`] does the same with the columns the conjunct reads
//! (each conjunct is kept renumbered over those), and scatters by setting
//! the bits of the selected rows. It is the whole predicate of a
//! `FilterExec` (the rule [`crate::rules::SelectiveConjuncts`] puts it
//! there) and answers as a filter reads: a row is kept or not, never NULL
//! (where `a AND b` would be NULL the answer is false, which a filter
//! reads the same).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::compute::FilterBuilder;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::conjunction;

use crate::jit::JitExpr;

/// At most this share of a batch's rows kept so far, a conjunct is
/// evaluated on those rows alone (DataFusion's threshold for its AND).
pub const PRESELECT_SHARE: f64 = 0.2;

/// A filter's predicate: its conjuncts, in order.
#[derive(Debug)]
pub struct Conjunction {
    conjuncts: Vec<Arc<dyn PhysicalExpr>>,
    /// For each conjunct, where it can be evaluated on some rows alone:
    /// the input columns it reads and itself over those columns only (never
    /// the first: it sees every row).
    narrow: Vec<Option<Narrow>>,
    /// The conjuncts as DataFusion's AND (display, equality).
    whole: Arc<dyn PhysicalExpr>,
}

#[derive(Debug)]
struct Narrow {
    columns: Vec<usize>,
    schema: SchemaRef,
    expr: Arc<dyn PhysicalExpr>,
}

impl Conjunction {
    /// The conjunction of `conjuncts` over `schema`; None where there are
    /// fewer than two.
    pub fn try_new(conjuncts: Vec<Arc<dyn PhysicalExpr>>, schema: &Schema) -> Option<Self> {
        if conjuncts.len() < 2 {
            return None;
        }
        // The first conjunct always reads the whole batch.
        let narrow = std::iter::once(None)
            .chain(conjuncts[1..].iter().map(|c| narrow(c, schema)))
            .collect();
        let whole = conjunction(conjuncts.iter().cloned());
        Some(Self {
            conjuncts,
            narrow,
            whole,
        })
    }

    pub fn conjuncts(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.conjuncts
    }
}

/// `expr` over only the columns of `schema` it reads (renumbered in the
/// order of the input); None where it reads none, or is compiled (a
/// compiled expression rewritten falls back to its interpreted form).
fn narrow(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<Narrow> {
    let mut compiled = false;
    let mut columns = Vec::new();
    expr.apply(|e| {
        compiled |= e.downcast_ref::<JitExpr>().is_some();
        if let Some(column) = e.downcast_ref::<Column>() {
            columns.push(column.index());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })
    .ok()?;
    columns.sort_unstable();
    columns.dedup();
    if compiled || columns.is_empty() || columns.iter().any(|&c| c >= schema.fields().len()) {
        return None;
    }
    let fields: Vec<_> = columns
        .iter()
        .map(|&c| Arc::clone(&schema.fields()[c]))
        .collect();
    let narrowed = Arc::clone(expr)
        .transform_up(|e| {
            let Some(column) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            let index = columns
                .binary_search(&column.index())
                .map_err(|_| DataFusionError::Internal("a column not collected".into()))?;
            Ok(Transformed::yes(
                Arc::new(Column::new(column.name(), index)) as Arc<dyn PhysicalExpr>,
            ))
        })
        .ok()?
        .data;
    Some(Narrow {
        columns,
        schema: Arc::new(Schema::new(fields)),
        expr: narrowed,
    })
}

/// `selection` with the selected rows that `mask` (one bit per selected
/// row) drops unselected: word by word, each selected row's bit taken in
/// turn from `mask`.
pub fn scatter(selection: &BooleanBuffer, mask: &BooleanBuffer) -> BooleanBuffer {
    let mut source = mask.bit_chunks().iter_padded();
    let (mut bits, mut left) = (0u64, 0u32);
    let mut words = Vec::with_capacity(selection.len().div_ceil(64));
    for mut word in selection.bit_chunks().iter_padded() {
        let mut out = 0u64;
        while word != 0 {
            if left == 0 {
                bits = source.next().unwrap_or(0);
                left = 64;
            }
            out |= (bits & 1) << word.trailing_zeros();
            bits >>= 1;
            left -= 1;
            word &= word - 1;
        }
        words.push(out);
    }
    BooleanBuffer::new(Buffer::from_vec(words), 0, selection.len())
}

/// The rows where `value` is true (NULL counts as false), `rows` long.
pub fn kept(value: ColumnarValue, rows: usize) -> Result<BooleanBuffer> {
    let array = value.into_array(rows)?;
    let Some(array) = array.as_boolean_opt() else {
        return Err(DataFusionError::Internal(format!(
            "a filter's conjunct gave {} rather than booleans",
            array.data_type()
        )));
    };
    Ok(match array.nulls() {
        Some(nulls) => array.values() & nulls.inner(),
        None => array.values().clone(),
    })
}

impl Narrow {
    /// `expr` on the rows of `batch` that `mask` keeps: the rows it keeps
    /// of those, as a mask over all of `batch`'s rows.
    fn evaluate(
        &self,
        batch: &RecordBatch,
        mask: &BooleanBuffer,
        selected: usize,
    ) -> Result<BooleanBuffer> {
        let filter = FilterBuilder::new(&BooleanArray::new(mask.clone(), None))
            .optimize()
            .build();
        let arrays = self
            .columns
            .iter()
            .map(|&c| filter.filter(batch.column(c)))
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(selected));
        let narrow = RecordBatch::try_new_with_options(Arc::clone(&self.schema), arrays, &options)?;
        let answer = kept(self.expr.evaluate(&narrow)?, selected)?;
        Ok(scatter(mask, &answer))
    }
}

impl PhysicalExpr for Conjunction {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _input_schema: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let rows = batch.num_rows();
        let mut mask = kept(self.conjuncts[0].evaluate(batch)?, rows)?;
        for (conjunct, narrow) in self.conjuncts.iter().zip(&self.narrow).skip(1) {
            let selected = mask.count_set_bits();
            if selected == 0 {
                break;
            }
            mask = match narrow {
                Some(narrow) if (selected as f64) <= rows as f64 * PRESELECT_SHARE => {
                    narrow.evaluate(batch, &mask, selected)?
                }
                _ => &mask & &kept(conjunct.evaluate(batch)?, rows)?,
            };
        }
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(
            mask, None,
        ))))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.conjuncts.iter().collect()
    }

    /// New conjuncts (columns renumbered by a rewrite) are DataFusion's
    /// AND of them: the schema they are over is not known here.
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(conjunction(children))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.whole.fmt_sql(f)
    }
}

impl fmt::Display for Conjunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.whole)
    }
}

impl PartialEq for Conjunction {
    fn eq(&self, other: &Self) -> bool {
        self.whole.as_ref() == other.whole.as_ref()
    }
}

impl Eq for Conjunction {}

impl Hash for Conjunction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.whole.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringViewArray};
    use arrow::datatypes::Field;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, col, lit};

    /// Rows of (a, s, b): a 0..n with NULLs, s a few strings with NULLs, b
    /// a column no conjunct reads.
    fn batch(n: usize) -> RecordBatch {
        let a: Int32Array = (0..n as i32)
            .map(|i| (i % 13 != 0).then_some(i % 100))
            .collect();
        let s: StringViewArray = (0..n)
            .map(|i| (i % 7 != 0).then(|| ["AIR", "AIR REG", "DELIVER IN PERSON", "MAIL"][i % 4]))
            .collect();
        let b: Int32Array = (0..n as i32).collect();
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("s", DataType::Utf8View, true),
            Field::new("b", DataType::Int32, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(a), Arc::new(s), Arc::new(b)],
        )
        .unwrap()
    }

    /// The rows DataFusion's AND keeps (true, not NULL).
    fn reference(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<bool> {
        let answer = expr
            .evaluate(batch)
            .unwrap()
            .into_array(batch.num_rows())
            .unwrap();
        answer
            .as_boolean()
            .iter()
            .map(|v| v == Some(true))
            .collect()
    }

    #[test]
    fn keeps_the_rows_datafusions_and_keeps() {
        let batch = batch(5_000);
        let schema = batch.schema();
        let s = |value: &str| {
            binary(
                col("s", &schema).unwrap(),
                Operator::Eq,
                lit(datafusion::common::ScalarValue::Utf8View(Some(
                    value.into(),
                ))),
                &schema,
            )
            .unwrap()
        };
        let a_below =
            |n: i32| binary(col("a", &schema).unwrap(), Operator::Lt, lit(n), &schema).unwrap();
        let either = binary(s("AIR"), Operator::Or, s("AIR REG"), &schema).unwrap();
        // Selective first (10 %, pre-selection), then broad (70 %), then
        // nothing left, then a literal conjunct that reads no column.
        for conjuncts in [
            vec![a_below(10), Arc::clone(&either)],
            vec![a_below(70), Arc::clone(&either), s("AIR")],
            vec![a_below(10), s("MAIL"), s("AIR")],
            vec![Arc::clone(&either), a_below(15), lit(true)],
            vec![a_below(15), lit(false), Arc::clone(&either)],
        ] {
            let and = conjunction(conjuncts.iter().cloned());
            let ours = Conjunction::try_new(conjuncts, &schema).unwrap();
            let answer = ours
                .evaluate(&batch)
                .unwrap()
                .into_array(batch.num_rows())
                .unwrap();
            let answer = answer.as_boolean();
            assert_eq!(answer.null_count(), 0);
            let got: Vec<bool> = answer.iter().map(|v| v == Some(true)).collect();
            assert_eq!(got, reference(&and, &batch), "{and}");
            assert_eq!(ours.to_string(), and.to_string());
        }
        // An empty batch.
        let empty = batch.slice(0, 0);
        let ours = Conjunction::try_new(vec![a_below(10), Arc::clone(&either)], &schema).unwrap();
        assert_eq!(
            ours.evaluate(&empty).unwrap().into_array(0).unwrap().len(),
            0
        );
    }

    #[test]
    fn a_conjunct_reads_only_its_columns_renumbered() {
        let batch = batch(10);
        let schema = batch.schema();
        let s = col("s", &schema).unwrap();
        let narrowed = narrow(&s, &schema).unwrap();
        assert_eq!(narrowed.columns, vec![1]);
        assert_eq!(narrowed.expr.downcast_ref::<Column>().unwrap().index(), 0);
        assert!(narrow(&lit(true), &schema).is_none());
    }
}
