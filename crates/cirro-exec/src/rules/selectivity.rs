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
//!
//! Two more cases, which DataFusion's analysis takes only where the whole
//! predicate is made of them: a column of numbers or dates compared with a
//! constant keeps the share of its min/max range on that side (bounds of
//! one column in an `AND` together: `d >= x AND d < y` keeps the share of
//! [x, y), not the product of the two shares), and two columns compared
//! (`l_commitdate < l_receiptdate`) keep a third, PostgreSQL's default for
//! an inequality it cannot estimate. TPC-H Q12's lineitem filter (two
//! shipping modes, two such comparisons, a year of receipt dates) kept 20 %
//! of 6 M rows by DataFusion's guess at SF1, 1.2 M, where 31 K pass; now
//! 1 %, 60 K, so the 1.5 M orders no longer count as a smaller side.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::ScalarValue;
use datafusion::common::Statistics;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, InListExpr, Literal, NotExpr};
use datafusion::physical_expr::utils::split_conjunction;
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
            Operator::And => conjunction(predicate, input),
            Operator::Or => {
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
            Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => {
                if l.downcast_ref::<Column>().is_some() && r.downcast_ref::<Column>().is_some() {
                    Some(INEQUALITY)
                } else {
                    let (column, low, high) = bound(predicate)?;
                    range_share(input, column, low, high)
                }
            }
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

/// The share of rows two columns compared keep, where nothing tells more
/// (PostgreSQL's `DEFAULT_INEQ_SEL`).
const INEQUALITY: f64 = 1.0 / 3.0;

/// The share of rows an `AND` keeps: the product of its conjuncts' shares
/// (20 % for one nothing is known of), the bounds on one column taken
/// together as one range; None where nothing is known of any conjunct.
fn conjunction(predicate: &Arc<dyn PhysicalExpr>, input: &Statistics) -> Option<f64> {
    // Per column: the greatest lower bound and the least upper bound.
    let mut ranges: Vec<(usize, Option<f64>, Option<f64>)> = Vec::new();
    let mut shares = Vec::new();
    for conjunct in split_conjunction(predicate) {
        if let Some((column, low, high)) = bound(conjunct) {
            match ranges.iter_mut().find(|r| r.0 == column) {
                Some(range) => {
                    range.1 = tighter(range.1, low, f64::max);
                    range.2 = tighter(range.2, high, f64::min);
                }
                None => ranges.push((column, low, high)),
            }
        } else {
            shares.push(selectivity(conjunct, input));
        }
    }
    for (column, low, high) in ranges {
        shares.push(range_share(input, column, low, high));
    }
    if shares.iter().all(Option::is_none) {
        return None;
    }
    Some(shares.into_iter().map(|s| s.unwrap_or(DEFAULT)).product())
}

/// `a` and `b` combined by `pick` where both are bounds, else the one given.
fn tighter(a: Option<f64>, b: Option<f64>, pick: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
}

/// A column of numbers or dates compared with a constant: the column's
/// index and the bound the comparison sets (low, high).
fn bound(predicate: &Arc<dyn PhysicalExpr>) -> Option<(usize, Option<f64>, Option<f64>)> {
    let binary = predicate.downcast_ref::<BinaryExpr>()?;
    let (column, value, op) = match (
        binary.left().downcast_ref::<Column>(),
        binary.right().downcast_ref::<Literal>(),
        binary.left().downcast_ref::<Literal>(),
        binary.right().downcast_ref::<Column>(),
    ) {
        (Some(c), Some(v), _, _) => (c, v, *binary.op()),
        (_, _, Some(v), Some(c)) => (c, v, binary.op().swap()?),
        _ => return None,
    };
    let value = number(value.value())?;
    match op {
        Operator::Lt | Operator::LtEq => Some((column.index(), None, Some(value))),
        Operator::Gt | Operator::GtEq => Some((column.index(), Some(value), None)),
        _ => None,
    }
}

/// The share of `column`'s min/max range within [low, high] (either open);
/// None where the input has no numeric min and max for it.
fn range_share(
    input: &Statistics,
    column: usize,
    low: Option<f64>,
    high: Option<f64>,
) -> Option<f64> {
    let stats = input.column_statistics.get(column)?;
    let min = number(stats.min_value.get_value()?)?;
    let max = number(stats.max_value.get_value()?)?;
    if max <= min {
        return None;
    }
    let low = low.unwrap_or(min).max(min);
    let high = high.unwrap_or(max).min(max);
    Some(((high - low) / (max - min)).clamp(0.0, 1.0))
}

/// A number or date as a number on its own scale (dates in days).
fn number(value: &ScalarValue) -> Option<f64> {
    if let Some(integer) = super::integer_value(value) {
        return Some(integer);
    }
    Some(match value {
        ScalarValue::Float32(Some(v)) => f64::from(*v),
        ScalarValue::Float64(Some(v)) => *v,
        ScalarValue::Decimal128(Some(v), _, scale) => *v as f64 / 10f64.powi(i32::from(*scale)),
        ScalarValue::Date32(Some(v)) => f64::from(*v),
        ScalarValue::Date64(Some(v)) => *v as f64 / 86_400_000.0,
        _ => return None,
    })
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

    #[test]
    fn selectivities_from_ranges_and_compared_columns() {
        // Column 0: dates 0..=1000 (days); column 1: unknown.
        let s = Statistics {
            num_rows: Precision::Inexact(1000),
            total_byte_size: Precision::Absent,
            column_statistics: vec![
                ColumnStatistics {
                    min_value: Precision::Inexact(ScalarValue::Date32(Some(0))),
                    max_value: Precision::Inexact(ScalarValue::Date32(Some(1000))),
                    ..Default::default()
                },
                ColumnStatistics::default(),
            ],
        };
        let day = |d: i32| lit(ScalarValue::Date32(Some(d)));
        let close = |p: &Arc<dyn PhysicalExpr>, want: f64| {
            let got = selectivity(p, &s).unwrap();
            assert!((got - want).abs() < 1e-9, "{p}: {got}, not {want}");
        };
        close(&binary(col(0), Operator::Lt, day(250)), 0.25);
        close(&binary(day(250), Operator::Lt, col(0)), 0.75);
        close(&binary(col(0), Operator::GtEq, day(2000)), 0.0);
        // Both bounds of one column: the range between, not the product.
        let year = binary(
            binary(col(0), Operator::GtEq, day(200)),
            Operator::And,
            binary(col(0), Operator::Lt, day(300)),
        );
        close(&year, 0.1);
        // Two columns compared: a third; with the range, multiplied.
        let later = binary(col(1), Operator::Gt, col(0));
        close(&later, 1.0 / 3.0);
        close(&binary(year.clone(), Operator::And, later), 0.1 / 3.0);
        // An unknown conjunct counts DataFusion's 20 %.
        let unknown = binary(col(1), Operator::Lt, day(5));
        assert_eq!(selectivity(&unknown, &s), None);
        close(&binary(year, Operator::And, unknown), 0.1 * 0.2);
    }
}
