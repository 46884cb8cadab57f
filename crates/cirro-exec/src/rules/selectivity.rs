//! Filter estimates from distinct counts, for DataFusion's join selection.
//!
//! DataFusion estimates a filter's rows by interval analysis of its
//! predicate over its input's min/max statistics; a predicate that analysis
//! cannot take, such as an equality of a text column with a constant, keeps
//! the filter's default selectivity, a fixed 20 %, though the scan knows the
//! column's distinct count (`ANALYZE`'s, see `CirroTable`'s statistics).
//! TPC-H Q21's `n_name = 'SAUDI ARABIA'` kept 5 of 25 nations, so the join
//! of that nation's late lines with orders looked 4× larger than the
//! orders of status `'F'` (20 % of orders by the same guess), and the 7.3 M
//! orders built the hash table that the 1.5 M lines probed.
//!
//! This rule, right before join selection, sets each filter's default
//! selectivity (what DataFusion uses only where its analysis does not
//! apply) from the predicate: `column = constant` keeps 1/distinct,
//! `column <> constant` the rest, `column IN (n constants)` n/distinct,
//! where the input knows the column's distinct count; `AND` multiplies,
//! `OR` adds less the overlap, `NOT` complements; anything else keeps
//! DataFusion's 20 %. Percent, at least 1. A predicate it knows nothing of
//! is left alone. Off with `SET cirro_join_order.filter_estimates = off`.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::Statistics;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, InListExpr, Literal, NotExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

/// DataFusion's default filter selectivity.
const DEFAULT: f64 = 0.2;

#[derive(Debug, Default)]
pub struct FilterEstimates;

/// The fraction of rows `predicate` keeps, where a distinct count tells
/// something of it (see the module docs); None where nothing does.
fn selectivity(predicate: &Arc<dyn PhysicalExpr>, input: &Statistics) -> Option<f64> {
    let distinct = |column: &Arc<dyn PhysicalExpr>| -> Option<f64> {
        let column = column.downcast_ref::<Column>()?;
        let stats = input.column_statistics.get(column.index())?;
        let distinct = *stats.distinct_count.get_value()?;
        (distinct > 0).then_some(distinct as f64)
    };
    let constant = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Literal>().is_some();
    // A column compared with a constant, either way round: its count.
    let compared = |l: &Arc<dyn PhysicalExpr>, r: &Arc<dyn PhysicalExpr>| {
        if constant(r) {
            distinct(l)
        } else if constant(l) {
            distinct(r)
        } else {
            None
        }
    };
    if let Some(binary) = predicate.downcast_ref::<BinaryExpr>() {
        let (l, r) = (binary.left(), binary.right());
        return match binary.op() {
            Operator::And | Operator::Or => {
                let (a, b) = (selectivity(l, input), selectivity(r, input));
                if a.is_none() && b.is_none() {
                    return None;
                }
                let (a, b) = (a.unwrap_or(DEFAULT), b.unwrap_or(DEFAULT));
                Some(if *binary.op() == Operator::And {
                    a * b
                } else {
                    a + b - a * b
                })
            }
            Operator::Eq => compared(l, r).map(|d| 1.0 / d),
            Operator::NotEq => compared(l, r).map(|d| 1.0 - 1.0 / d),
            _ => None,
        };
    }
    if let Some(list) = predicate.downcast_ref::<InListExpr>() {
        if !list.list().iter().all(constant) {
            return None;
        }
        let share = (list.list().len() as f64 / distinct(list.expr())?).min(1.0);
        return Some(if list.negated() { 1.0 - share } else { share });
    }
    if let Some(not) = predicate.downcast_ref::<NotExpr>() {
        return selectivity(not.arg(), input).map(|s| 1.0 - s);
    }
    None
}

/// `filter` with its default selectivity from [`selectivity`], if that
/// tells something and differs.
fn rewrite(filter: &FilterExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Ok(input) =
        StatisticsContext::new().compute(filter.input().as_ref(), &StatisticsArgs::new())
    else {
        return Ok(None);
    };
    let Some(kept) = selectivity(filter.predicate(), &input) else {
        return Ok(None);
    };
    let percent = (kept * 100.0).round().clamp(1.0, 100.0) as u8;
    if percent == filter.default_selectivity() {
        return Ok(None);
    }
    let estimated = FilterExecBuilder::from(filter)
        .with_default_selectivity(percent)
        .build()?;
    Ok(Some(Arc::new(estimated)))
}

impl PhysicalOptimizerRule for FilterEstimates {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let on = super::JoinOrderOptions::switch_on(config, |o| &o.filter_estimates);
        if !on {
            return Ok(plan);
        }
        super::rewrite_each::<FilterExec>(plan, rewrite)
    }

    fn name(&self) -> &str {
        "cirro_filter_estimates"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::ScalarValue;
    use datafusion::common::stats::{ColumnStatistics, Precision};
    use datafusion::physical_expr::expressions::{in_list, lit};

    fn stats() -> Statistics {
        // Column 0: 25 distinct values; column 1: unknown.
        Statistics {
            num_rows: Precision::Inexact(1000),
            total_byte_size: Precision::Absent,
            column_statistics: vec![
                ColumnStatistics {
                    distinct_count: Precision::Inexact(25),
                    ..Default::default()
                },
                ColumnStatistics::default(),
            ],
        }
    }

    fn col(i: usize) -> Arc<dyn PhysicalExpr> {
        Arc::new(Column::new(&format!("c{i}"), i))
    }

    fn binary(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }

    #[test]
    fn selectivities_from_distinct_counts() {
        let s = stats();
        let name = || lit(ScalarValue::Utf8View(Some("SAUDI ARABIA".into())));
        let eq = binary(col(0), Operator::Eq, name());
        assert_eq!(selectivity(&eq, &s), Some(1.0 / 25.0));
        let flipped = binary(name(), Operator::Eq, col(0));
        assert_eq!(selectivity(&flipped, &s), Some(1.0 / 25.0));
        let ne = binary(col(0), Operator::NotEq, name());
        assert_eq!(selectivity(&ne, &s), Some(24.0 / 25.0));
        // Nothing known of column 1: left alone, alone or in an OR with
        // nothing known; the known part counts in an AND.
        let unknown = binary(col(1), Operator::Eq, name());
        assert_eq!(selectivity(&unknown, &s), None);
        let both = binary(eq.clone(), Operator::And, unknown.clone());
        assert!((selectivity(&both, &s).unwrap() - 0.2 / 25.0).abs() < 1e-12);
        let either = binary(eq.clone(), Operator::Or, eq.clone());
        let p = 1.0 / 25.0;
        assert!((selectivity(&either, &s).unwrap() - (2.0 * p - p * p)).abs() < 1e-12);
        let schema = arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("c0", arrow::datatypes::DataType::Utf8View, true),
            arrow::datatypes::Field::new("c1", arrow::datatypes::DataType::Utf8View, true),
        ]);
        let list = in_list(col(0), vec![name(), name(), name()], &false, &schema).unwrap();
        assert_eq!(selectivity(&list, &s), Some(3.0 / 25.0));
        let not_in = in_list(col(0), vec![name()], &true, &schema).unwrap();
        assert_eq!(selectivity(&not_in, &s), Some(24.0 / 25.0));
    }
}
