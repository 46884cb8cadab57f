//! A hash join with a grouped aggregation joins on the aggregation's group
//! keys only; its equalities with aggregated values are checked as the
//! join's filter.
//!
//! A decorrelated scalar subquery compares a value with an aggregate per
//! key: TPC-H Q2's `ps_supplycost = (SELECT min(ps_supplycost) … WHERE
//! p_partkey = ps_partkey …)` becomes a semi join on `p_partkey =
//! ps_partkey AND ps_supplycost = min(ps_supplycost)` with an aggregation
//! of partsupp by `ps_partkey`. The join's dynamic filter (the build side's
//! keys, given to the probe side's scans) then reads the aggregated value
//! too, so it cannot pass below the aggregation, and all 1.6 M European
//! partsupp rows were aggregated into 1.2 M groups for the 7.9 K parts the
//! query asks about. Keyed on the group keys only, the filter reads only
//! group columns, DataFusion pushes it through the aggregation into the
//! partsupp scan, and the aggregation sees the rows of those parts only.
//!
//! The join finds the same rows: a group's keys are unique among the
//! aggregation's rows, so each row of the other side still meets at most
//! one candidate per group, which the filter then checks. Only joins where
//! NULL keys match nothing are rewritten (a filter's `=` never matches
//! NULLs), of the types whose filter means the same as their keys (inner
//! and semi joins), and only where some keys are group keys and some are
//! not. It runs before DataFusion's join selection, so that partitioning
//! and build sides are chosen for the keys that remain.
//!
//! Likewise an inner join on several keys where one key alone tells the
//! rows of the smaller side apart (`distinctive_key`) keys on that one:
//! TPC-H Q5's supplier join then filters lineitem by `l_suppkey` below the
//! join with orders. Off, both, with `SET cirro_join_order.group_keys =
//! off`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::{JoinSide, NullEquality, Result, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{JoinType, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

#[derive(Debug, Default)]
pub struct JoinOnGroupKeys;

/// Whether output column `index` of `plan` is a group key of a grouped
/// aggregation (reached through projections that pass columns on).
fn is_group_key(plan: &Arc<dyn ExecutionPlan>, index: usize) -> bool {
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        return projection
            .expr()
            .get(index)
            .and_then(|e| e.expr.downcast_ref::<Column>())
            .is_some_and(|c| is_group_key(projection.input(), c.index()));
    }
    if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
        let group_by = aggregate.group_expr();
        return group_by.is_single()
            && !group_by.expr().is_empty()
            && index < group_by.expr().len();
    }
    false
}

/// The rewritten join, if `join` has keys of both kinds on one side.
fn rewrite(join: &HashJoinExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if join.null_aware
        || join.null_equality() != NullEquality::NullEqualsNothing
        || !matches!(
            join.join_type(),
            JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi
        )
    {
        return Ok(None);
    }
    let columns = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().cloned();
    let mut pairs = Vec::with_capacity(join.on().len());
    for (l, r) in join.on() {
        let (Some(l), Some(r)) = (columns(l), columns(r)) else {
            return Ok(None);
        };
        pairs.push((l, r));
    }
    for right in [true, false] {
        let input = if right { join.right() } else { join.left() };
        let grouped: Vec<bool> = pairs
            .iter()
            .map(|(l, r)| is_group_key(input, if right { r.index() } else { l.index() }))
            .collect();
        if !grouped.iter().any(|g| *g) || grouped.iter().all(|g| *g) {
            continue;
        }
        return key_on(join, &pairs, &grouped).map(Some);
    }
    if join.join_type() == &JoinType::Inner
        && let Some(kept) = distinctive_key(join, &pairs)
    {
        return key_on(join, &pairs, &kept).map(Some);
    }
    Ok(None)
}

/// The join keyed on the pairs `kept` marks; the others' equalities go into
/// its filter, over columns appended to the filter's intermediate schema.
fn key_on(
    join: &HashJoinExec,
    pairs: &[(Column, Column)],
    kept: &[bool],
) -> Result<Arc<dyn ExecutionPlan>> {
    let (kept, moved): (Vec<_>, Vec<_>) = pairs.iter().zip(kept).partition(|(_, kept)| **kept);
    let on = kept
        .iter()
        .map(|((l, r), _)| {
            (
                Arc::new(l.clone()) as Arc<dyn PhysicalExpr>,
                Arc::new(r.clone()) as Arc<dyn PhysicalExpr>,
            )
        })
        .collect();
    let (mut fields, mut indices, mut condition) = match join.filter() {
        Some(f) => (
            f.schema().fields().iter().cloned().collect::<Vec<_>>(),
            f.column_indices().to_vec(),
            Some(Arc::clone(f.expression())),
        ),
        None => (Vec::new(), Vec::new(), None),
    };
    let (left_schema, right_schema) = (join.left().schema(), join.right().schema());
    for ((l, r), _) in moved {
        let mut append = |column: &Column, schema: &Schema, side: JoinSide| {
            let field = schema.field(column.index());
            let at = fields.len();
            fields.push(Arc::new(Field::new(
                format!("{}#{at}", field.name()),
                field.data_type().clone(),
                field.is_nullable(),
            )));
            indices.push(ColumnIndex {
                index: column.index(),
                side,
            });
            Arc::new(Column::new(&format!("{}#{at}", field.name()), at)) as Arc<dyn PhysicalExpr>
        };
        let left = append(l, &left_schema, JoinSide::Left);
        let right = append(r, &right_schema, JoinSide::Right);
        let equal: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(left, Operator::Eq, right));
        condition = Some(match condition {
            Some(c) => Arc::new(BinaryExpr::new(c, Operator::And, equal)),
            None => equal,
        });
    }
    let filter = condition
        .map(|condition| JoinFilter::new(condition, indices, Arc::new(Schema::new(fields))));
    join.builder().with_on(on).with_filter(filter).build_exec()
}

/// Of an inner join on several keys, the one key that alone tells the
/// rows of its smaller side apart (its distinct values, from the data's
/// statistics, at least 90 % of that side's estimated rows), where the
/// others tell next to nothing more: TPC-H Q5's supplier joins on
/// `s_suppkey = l_suppkey AND s_nationkey = c_nationkey`; keyed on the
/// supplier alone, each line still meets one supplier, whose nation the
/// filter then checks, and the join's dynamic filter reads `l_suppkey`
/// only, which the lineitem scan below the join with orders can evaluate.
fn distinctive_key(join: &HashJoinExec, pairs: &[(Column, Column)]) -> Option<Vec<bool>> {
    if pairs.len() < 2 {
        return None;
    }
    let stats = |plan: &Arc<dyn ExecutionPlan>| {
        StatisticsContext::new()
            .compute(plan.as_ref(), &StatisticsArgs::new())
            .ok()
    };
    let (left, right) = (stats(join.left())?, stats(join.right())?);
    let rows = |s: &Statistics| s.num_rows.get_value().map(|n| *n as f64);
    let (left_rows, right_rows) = (rows(&left)?, rows(&right)?);
    let (small, small_rows, left_small) = if left_rows <= right_rows {
        (&left, left_rows, true)
    } else {
        (&right, right_rows, false)
    };
    let distinct = |column: &Column| -> Option<f64> {
        let c = small.column_statistics.get(column.index())?;
        let counted = c.distinct_count.get_value().map(|d| *d as f64);
        let ranged = match (c.min_value.get_value(), c.max_value.get_value()) {
            (Some(lo), Some(hi)) => super::integer_value(hi)
                .zip(super::integer_value(lo))
                .map(|(hi, lo)| hi - lo + 1.0),
            _ => None,
        };
        counted.or(ranged).map(|d| d.min(small_rows))
    };
    let counts: Vec<f64> = pairs
        .iter()
        .map(|(l, r)| distinct(if left_small { l } else { r }).unwrap_or(0.0))
        .collect();
    let (best, &most) = counts
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    if small_rows < 1.0 || most < 0.9 * small_rows {
        return None;
    }
    Some((0..pairs.len()).map(|i| i == best).collect())
}

impl PhysicalOptimizerRule for JoinOnGroupKeys {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let on = super::JoinOrderOptions::switch_on(config, |o| &o.group_keys);
        if !on {
            return Ok(plan);
        }
        super::rewrite_hash_joins(plan, rewrite)
    }

    fn name(&self) -> &str {
        "cirro_join_on_group_keys"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
