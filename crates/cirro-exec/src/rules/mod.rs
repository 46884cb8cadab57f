//! Cirro's planning rules. Where each runs among DataFusion's is listed in
//! one place, the engine's planner (`cirro-engine/src/planner.rs`).

mod aggregation;
mod build_sides;
mod chains;
mod checked;
mod colocate;
mod conjuncts;
mod group_keys;
mod guards;
mod jit;
mod join_order;
mod lateral;
mod prefilter;
mod reduce_groups;
mod sample;
mod segment;
mod selectivity;
mod semi_joins;
mod shared;
mod spilling;
mod subquery_windows;
mod yields;

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

pub use crate::operators::shared::SharedExec;
pub use aggregation::{
    AdaptiveAggregation, AggregationExchange, AggregationOptions, FuseFilterAggregate,
    estimated_groups,
};
pub use build_sides::BuildSides;
pub use chains::TypeChainSegments;
pub use checked::{CheckedArithmetic, PgOperators};
pub use colocate::{CoLocatedJoinsFirst, ScanBuckets};
pub use conjuncts::{OrderConjuncts, SelectiveConjuncts};
pub use group_keys::JoinOnGroupKeys;
pub use guards::{GuardFallibleConditions, LazyGuards, lazy_guards};
pub use jit::{CompileExpressions, JitOptions};
pub use join_order::{JoinOrderOptions, ReorderJoins, ScanKeys, ScanRange, ScanRows};
pub use lateral::InlineLateralProjections;
pub use prefilter::PrefilterProbes;
pub use reduce_groups::ReduceGroups;
pub use sample::{KeySample, SAMPLE_ROWS, sample_group_keys};
pub use segment::segment_udf;
pub use selectivity::FilterEstimates;
pub use semi_joins::PushSemiJoins;
pub use shared::SharedSubplans;
pub use spilling::SpillingJoins;
pub use subquery_windows::SubqueryWindows;
pub use yields::YieldAfterJoins;

/// An integer constant or statistic as a float; None for other values.
pub(crate) fn integer_value(value: &datafusion::common::ScalarValue) -> Option<f64> {
    use datafusion::common::ScalarValue as V;
    match value {
        V::Int8(Some(x)) => Some(f64::from(*x)),
        V::Int16(Some(x)) => Some(f64::from(*x)),
        V::Int32(Some(x)) => Some(f64::from(*x)),
        V::Int64(Some(x)) => Some(*x as f64),
        V::UInt8(Some(x)) => Some(f64::from(*x)),
        V::UInt16(Some(x)) => Some(f64::from(*x)),
        V::UInt32(Some(x)) => Some(f64::from(*x)),
        V::UInt64(Some(x)) => Some(*x as f64),
        _ => None,
    }
}

/// `plan` with each hash join that `rewrite` rewrites (bottom up) replaced.
pub(crate) fn rewrite_hash_joins(
    plan: Arc<dyn ExecutionPlan>,
    rewrite: impl Fn(&HashJoinExec) -> Result<Option<Arc<dyn ExecutionPlan>>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    rewrite_each(plan, rewrite)
}

/// Rewrite each node of type `T` in `plan`, bottom up, with `rewrite`
/// (None: left as it is).
pub(crate) fn rewrite_each<T: ExecutionPlan + 'static>(
    plan: Arc<dyn ExecutionPlan>,
    rewrite: impl Fn(&T) -> Result<Option<Arc<dyn ExecutionPlan>>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(found) = node.downcast_ref::<T>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match rewrite(found)? {
            Some(new) => Transformed::yes(new),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// Rewrite each expression of `plan` that has a node `wanted` picks with
/// `rewrite` (which gets the schema the expressions are typed against: the
/// inputs', and a scan's source), keeping the expressions' names.
pub(crate) fn rewrite_expressions(
    plan: LogicalPlan,
    wanted: impl Fn(&Expr) -> bool,
    rewrite: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    let has = |expr: &Expr| expr.exists(|e| Ok(wanted(e)));
    if !plan.expressions().iter().any(|e| has(e).unwrap_or(false)) {
        return Ok(Transformed::no(plan));
    }
    let mut schema = merge_schema(&plan.inputs());
    if let LogicalPlan::TableScan(scan) = &plan {
        schema.merge(&DFSchema::try_from_qualified_schema(
            scan.table_name.clone(),
            &scan.source.schema(),
        )?);
    }
    let names = NamePreserver::new(&plan);
    plan.map_expressions(|expr| {
        if !has(&expr)? {
            return Ok(Transformed::no(expr));
        }
        let name = names.save(&expr);
        rewrite(expr, &schema).map(|t| t.update_data(|e| name.restore(e)))
    })
}

/// `projection` with each expression passed through `rewrite`, the names
/// kept; the node unchanged where no expression changed.
pub(crate) fn rewrite_projection(
    node: Arc<dyn ExecutionPlan>,
    projection: &ProjectionExec,
    mut rewrite: impl FnMut(&Arc<dyn PhysicalExpr>) -> Result<Transformed<Arc<dyn PhysicalExpr>>>,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let mut changed = false;
    let mut exprs = Vec::with_capacity(projection.expr().len());
    for item in projection.expr() {
        let rewritten = rewrite(&item.expr)?;
        changed |= rewritten.transformed;
        exprs.push(ProjectionExpr {
            expr: rewritten.data,
            alias: item.alias.clone(),
        });
    }
    if !changed {
        return Ok(Transformed::no(node));
    }
    let rebuilt = ProjectionExec::try_new(exprs, Arc::clone(projection.input()))?;
    Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
}
