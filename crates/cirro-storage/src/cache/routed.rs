//! A partitioned hash join's dynamic filter evaluated branch by branch on
//! the rows each branch reads.
//!
//! A hash join whose inputs are both repartitioned by the key builds one
//! hash table per partition, and DataFusion gives the probe side's scan the
//! filter `CASE hash_repartition(keys) % n WHEN 0 THEN f0 WHEN 1 THEN f1 …
//! ELSE e END`, each `fᵢ` the key bounds and a lookup in partition i's
//! table. DataFusion's `CASE` filters every column of the batch for each
//! branch and merges the branches' results through Arrow's generic
//! interleaving: in TPC-H Q17 at SF10 (the scan under the aggregation of
//! `avg(l_quantity)` by part, 60 M rows of which the filter keeps 61 K),
//! 2.1 s of the query's 2.7 s of CPU time went there, ten times what the
//! join's own probe of 60 M rows cost. [`Routed`] computes the route once,
//! gathers for each branch only its rows of the columns the branch reads,
//! and sets the mask's bits of the rows its branch keeps.

use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::buffer::{BooleanBuffer, MutableBuffer};
use arrow::compute::take;
use arrow::datatypes::{DataType, SchemaRef, UInt64Type};
use arrow::util::bit_util;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CaseExpr, Literal};
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};

/// The most routes (partitions) a [`Routed`] takes; a `CASE` with a WHEN
/// value above it is evaluated by DataFusion.
const ROUTES_MAX: u64 = 4096;

/// One branch of the `CASE`: its condition over the columns it reads.
#[derive(Debug)]
enum Branch {
    /// A literal condition (an empty partition's `false`).
    Constant(bool),
    /// `expr` over `schema`, the batch's `columns` (by index) it reads.
    Rows {
        columns: Vec<usize>,
        schema: SchemaRef,
        expr: Arc<dyn PhysicalExpr>,
    },
}

/// A `CASE route WHEN v THEN … ELSE … END` of boolean branches and `UInt64`
/// literal WHEN values, prepared for batches of one schema.
#[derive(Debug)]
pub(super) struct Routed {
    route: Arc<dyn PhysicalExpr>,
    /// `route` as `hash % divisor` (how DataFusion writes it): the hash
    /// evaluated, the remainder taken here (Arrow's checked remainder
    /// divides each row: a tenth of Q17's CPU time), by a mask where the
    /// divisor is a power of two.
    modulo: Option<(Arc<dyn PhysicalExpr>, u64)>,
    /// The branch (index into `branches`) of each route value; values past
    /// its end take the last branch, the ELSE.
    by_route: Vec<usize>,
    branches: Vec<Branch>,
}

impl Routed {
    /// `expr` prepared for batches of `schema`, if it is such a `CASE`.
    pub(super) fn prepare(expr: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Option<Self> {
        let case = expr.downcast_ref::<CaseExpr>()?;
        let route = Arc::clone(case.expr()?);
        if route.data_type(schema).ok()? != DataType::UInt64 {
            return None;
        }
        let mut whens = Vec::with_capacity(case.when_then_expr().len());
        for (when, then) in case.when_then_expr() {
            let ScalarValue::UInt64(Some(value)) = when.downcast_ref::<Literal>()?.value() else {
                return None;
            };
            if *value >= ROUTES_MAX || then.data_type(schema).ok()? != DataType::Boolean {
                return None;
            }
            whens.push((*value as usize, then));
        }
        let mut branches = Vec::with_capacity(whens.len() + 1);
        let routes = whens.iter().map(|(v, _)| v + 1).max().unwrap_or(0);
        let otherwise = whens.len();
        let mut by_route = vec![otherwise; routes];
        for (value, then) in whens {
            // The first WHEN that matches decides, as in SQL.
            if by_route[value] == otherwise {
                by_route[value] = branches.len();
            }
            branches.push(Branch::new(then, schema)?);
        }
        // No ELSE: NULL, which a filter reads as false.
        branches.push(match case.else_expr() {
            Some(e) if e.data_type(schema).ok()? == DataType::Boolean => Branch::new(e, schema)?,
            Some(_) => return None,
            None => Branch::Constant(false),
        });
        let modulo = route.downcast_ref::<BinaryExpr>().and_then(|b| {
            let ScalarValue::UInt64(Some(divisor)) = b.right().downcast_ref::<Literal>()?.value()
            else {
                return None;
            };
            (*b.op() == Operator::Modulo
                && *divisor > 0
                && b.left().data_type(schema).ok()? == DataType::UInt64)
                .then(|| (Arc::clone(b.left()), *divisor))
        });
        Some(Self {
            route,
            modulo,
            by_route,
            branches,
        })
    }

    /// The rows of `batch` the filter keeps.
    pub(super) fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let rows = batch.num_rows();
        let (expr, divisor) = match &self.modulo {
            Some((hash, divisor)) => (hash, *divisor),
            None => (&self.route, 0),
        };
        let route = expr.evaluate(batch)?.into_array(rows)?;
        let route = route.as_primitive_opt::<UInt64Type>().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "a join filter's route gave {}, not UInt64",
                route.data_type()
            ))
        })?;
        let otherwise = self.branches.len() - 1;
        let branch_of = |value: u64| {
            let value = match divisor {
                0 => value,
                d if d.is_power_of_two() => value & (d - 1),
                d => value % d,
            };
            self.by_route
                .get(value as usize)
                .copied()
                .unwrap_or(otherwise)
        };
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); self.branches.len()];
        if route.null_count() == 0 {
            for (row, value) in route.values().iter().enumerate() {
                members[branch_of(*value)].push(row as u32);
            }
        } else {
            for (row, value) in route.iter().enumerate() {
                members[value.map_or(otherwise, branch_of)].push(row as u32);
            }
        }
        let mut bits = MutableBuffer::from_len_zeroed(bit_util::ceil(rows, 8));
        let slice = bits.as_slice_mut();
        for (branch, rows_of) in self.branches.iter().zip(members) {
            if rows_of.is_empty() {
                continue;
            }
            match branch {
                Branch::Constant(false) => {}
                Branch::Constant(true) => {
                    for row in rows_of {
                        bit_util::set_bit(slice, row as usize);
                    }
                }
                Branch::Rows {
                    columns,
                    schema,
                    expr,
                } => {
                    let count = rows_of.len();
                    let indices = UInt32Array::from(rows_of);
                    let gathered = columns
                        .iter()
                        .map(|&c| take(batch.column(c), &indices, None))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    let options = RecordBatchOptions::new().with_row_count(Some(count));
                    let part =
                        RecordBatch::try_new_with_options(Arc::clone(schema), gathered, &options)?;
                    let kept = expr.evaluate(&part)?.into_array(count)?;
                    let kept = kept.as_boolean_opt().ok_or_else(|| {
                        DataFusionError::Internal(format!(
                            "a join filter's branch {expr} gave {}",
                            kept.data_type()
                        ))
                    })?;
                    let rows_of = indices.values();
                    for k in kept.values().set_indices() {
                        if kept.is_valid(k) {
                            bit_util::set_bit(slice, rows_of[k] as usize);
                        }
                    }
                }
            }
        }
        Ok(BooleanArray::new(
            BooleanBuffer::new(bits.into(), 0, rows),
            None,
        ))
    }
}

impl Branch {
    fn new(expr: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Option<Self> {
        if let Some(literal) = expr.downcast_ref::<Literal>() {
            return match literal.value() {
                ScalarValue::Boolean(Some(b)) => Some(Self::Constant(*b)),
                ScalarValue::Boolean(None) => Some(Self::Constant(false)),
                _ => None,
            };
        }
        let mut columns: Vec<usize> = collect_columns(expr).iter().map(|c| c.index()).collect();
        columns.sort_unstable();
        columns.dedup();
        if columns.iter().any(|&c| c >= schema.fields().len()) {
            return None;
        }
        let projected = Arc::new(schema.project(&columns).ok()?);
        let expr = reassign_expr_columns(Arc::clone(expr), &projected).ok()?;
        Some(Self::Rows {
            columns,
            schema: projected,
            expr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, col, lit};

    /// The same answers as DataFusion's own evaluation of the CASE, over
    /// routes with several branches, a literal branch, a NULL route, a
    /// route past every WHEN (the ELSE) and a repeated WHEN value.
    #[test]
    fn routed_case_keeps_what_datafusion_keeps() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("k", DataType::Int64, true),
        ]));
        let rows = 1000;
        let k: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..rows).map(|i| (i % 17 != 0).then_some((i * 7919) % 1000)),
        ));
        let s: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("r{i}")),
        ));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![s, k]).unwrap();
        let key = col("k", &schema).unwrap();
        let bin = |l, op, r| Arc::new(BinaryExpr::new(l, op, r)) as Arc<dyn PhysicalExpr>;
        // route = CAST(k AS UInt64) % d, NULL where k is NULL (the
        // remainder taken by the evaluator itself: by a mask for 4)
        for divisor in [4u64, 5] {
            let route = bin(
                Arc::new(datafusion::physical_expr::expressions::CastExpr::new(
                    Arc::clone(&key),
                    DataType::UInt64,
                    None,
                )),
                Operator::Modulo,
                lit(ScalarValue::UInt64(Some(divisor))),
            );
            let when = |v: u64| lit(ScalarValue::UInt64(Some(v)));
            let case = Arc::new(
                CaseExpr::try_new(
                    Some(route),
                    vec![
                        (when(0), bin(Arc::clone(&key), Operator::Lt, lit(500i64))),
                        (when(1), lit(false)),
                        (when(2), bin(Arc::clone(&key), Operator::Gt, lit(100i64))),
                        (when(0), lit(true)),
                        (when(3), lit(true)),
                    ],
                    Some(bin(Arc::clone(&key), Operator::GtEq, lit(900i64))),
                )
                .unwrap(),
            ) as Arc<dyn PhysicalExpr>;
            let expected = case
                .evaluate(&batch)
                .unwrap()
                .into_array(rows as usize)
                .unwrap();
            let expected: Vec<bool> = expected
                .as_boolean()
                .iter()
                .map(|v| v.unwrap_or(false))
                .collect();
            let routed = Routed::prepare(&case, &schema).expect("a routed CASE");
            assert!(routed.modulo.is_some());
            let got = routed.evaluate(&batch).unwrap();
            assert_eq!(got.iter().map(|v| v.unwrap()).collect::<Vec<_>>(), expected);
            assert!(expected.iter().any(|v| *v) && expected.iter().any(|v| !*v));
        }
        // A CASE that routes by anything but UInt64 is left to DataFusion.
        let by_int = Arc::new(
            CaseExpr::try_new(Some(Arc::clone(&key)), vec![(lit(1i64), lit(true))], None).unwrap(),
        ) as Arc<dyn PhysicalExpr>;
        assert!(Routed::prepare(&by_int, &schema).is_none());
    }
}
