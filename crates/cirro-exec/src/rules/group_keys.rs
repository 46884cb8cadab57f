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
//! and build sides are chosen for the keys that remain. Off with `SET
//! cirro_join_order.group_keys = off`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::{JoinSide, NullEquality, Result};
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
        let (kept, moved): (Vec<_>, Vec<_>) = pairs
            .iter()
            .zip(&grouped)
            .partition(|(_, grouped)| **grouped);
        let on = kept
            .iter()
            .map(|((l, r), _)| {
                (
                    Arc::new(l.clone()) as Arc<dyn PhysicalExpr>,
                    Arc::new(r.clone()) as Arc<dyn PhysicalExpr>,
                )
            })
            .collect();
        // The filter: the join's own, and an equality per moved key over
        // columns appended to its intermediate schema.
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
                Arc::new(Column::new(&format!("{}#{at}", field.name()), at))
                    as Arc<dyn PhysicalExpr>
            };
            let left = append(l, &left_schema, JoinSide::Left);
            let right = append(r, &right_schema, JoinSide::Right);
            let equal: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(left, Operator::Eq, right));
            condition = Some(match condition {
                Some(c) => Arc::new(BinaryExpr::new(c, Operator::And, equal)),
                None => equal,
            });
        }
        let Some(condition) = condition else {
            return Ok(None);
        };
        let filter = JoinFilter::new(condition, indices, Arc::new(Schema::new(fields)));
        return join
            .builder()
            .with_on(on)
            .with_filter(Some(filter))
            .build_exec()
            .map(Some);
    }
    Ok(None)
}

impl PhysicalOptimizerRule for JoinOnGroupKeys {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let on = config
            .extensions
            .get::<super::JoinOrderOptions>()
            .is_none_or(|o| !o.group_keys.eq_ignore_ascii_case("off"));
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
