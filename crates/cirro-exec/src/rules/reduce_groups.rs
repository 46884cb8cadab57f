//! An aggregation joined on its group keys aggregates only the groups the
//! join can keep: its input is semi-joined, before it is aggregated, with
//! the small table that bounds the join's keys.
//!
//! A decorrelated subquery aggregates per key and then joins on it: TPC-H
//! Q17's `l_quantity < (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE
//! l_partkey = p_partkey)` aggregates all of lineitem by `l_partkey` (200 K
//! groups at SF 1) and then joins the groups with the 204 parts the query
//! asks about. On a single node the join's dynamic filter (the parts' keys,
//! given to the scans of the join's probe side) reaches the aggregation's
//! scan, which then reads the parts' rows only. On a cluster the
//! aggregation runs in a stage below the join's, which a dynamic filter
//! cannot cross (`cirro-cluster`'s `dynamic_filters`): every node
//! aggregated all its lineitem rows. This rule writes the reduction into
//! the plan instead:
//!
//! ```text
//! Join(Y, Aggregate(I) by g) on y = g     (inner or semi)
//!   ─► Join(Y, Aggregate(I ⋉ π_k(S) on g = k) by g) on y = g
//! ```
//!
//! where `S` is the subtree of `Y` with the fewest estimated rows whose
//! column `k` holds every value `y` can take: `Y` itself, or an input of an
//! inner or semi join inside `Y` that `y` is equal to through the join's
//! keys (Q17: the filtered `part`, below `lineitem ⋈ part`). The answer is
//! the same: the join reads a group only where its key is among `Y`'s
//! values, hence among `S`'s, and a group's rows are kept or dropped whole
//! (a NULL key matches nothing either way). Outer and anti joins, which
//! keep rows without a match, are left alone.
//!
//! Only where it pays and costs little: `S` reads one table through
//! filters, projections and aliases (it is computed twice, so nothing in it
//! may give other rows the second time: no `random()`, no row limit), its estimated
//! rows are at most [`REDUCTION`] of the aggregation's input, and the
//! aggregation groups by plain columns without grouping sets. The join's
//! build side is then small, so a cluster broadcasts it into the stage that
//! scans the aggregation's input. `SET cirro_join_order.reduce_groups =
//! auto` (the default: on a cluster only, where dynamic filters stop at a
//! stage), `on` or `off`.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, NullEquality, Result};
use datafusion::logical_expr::{
    Aggregate, Expr, Filter, Join, JoinConstraint, JoinType, LogicalPlan, Projection, SubqueryAlias,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::join_order::{rebuilt, rewrite_joins};
use super::{JoinOrderOptions, ReorderJoins};

/// The largest share of the aggregation's input rows that the bounding
/// subtree may have: above it the semi join saves too little.
pub const REDUCTION: f64 = 0.1;

/// The alias of the keys an aggregation's input is semi-joined with (also
/// how the rule knows an input it reduced already), and their column's
/// name (EXPLAIN shows it).
const KEYS: &str = "__cirro_group_keys";
const KEY: &str = "__cirro_group_key";

#[derive(Debug)]
pub struct ReduceGroups {
    /// The row estimates of join ordering.
    estimates: ReorderJoins,
    /// Whether sessions run on a cluster (`auto` is on there).
    distributed: bool,
}

impl ReduceGroups {
    pub fn new(estimates: ReorderJoins, distributed: bool) -> Self {
        Self {
            estimates,
            distributed,
        }
    }

    /// Reduce the aggregation on either side of `join`, if one qualifies.
    fn reduce(&self, join: &Join) -> Result<Option<Join>> {
        // Joins whose answer reads a row of either side only where its
        // keys are among the other side's: inner and semi joins (DataFusion
        // makes a semi join of a scalar subquery's in a later pass). Not
        // outer or anti joins, which keep rows without a match.
        if !matches!(
            join.join_type,
            JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi
        ) || join.null_equality != NullEquality::NullEqualsNothing
        {
            return Ok(None);
        }
        for (l_key, r_key) in &join.on {
            let (Expr::Column(l), Expr::Column(r)) = (l_key, r_key) else {
                continue;
            };
            // The aggregation on the right, the bound from the left; then
            // the other way round.
            if let Some(side) = self.reduce_side(&join.right, r, &join.left, l)? {
                return rebuilt(join, Arc::clone(&join.left), Arc::new(side)).map(Some);
            }
            if let Some(side) = self.reduce_side(&join.left, l, &join.right, r)? {
                return rebuilt(join, Arc::new(side), Arc::clone(&join.right)).map(Some);
            }
        }
        Ok(None)
    }

    /// `side` with its aggregation's input reduced, where `column` of `side`
    /// is a group key and `bound_column` of `other` bounds it.
    fn reduce_side(
        &self,
        side: &LogicalPlan,
        column: &Column,
        other: &LogicalPlan,
        bound_column: &Column,
    ) -> Result<Option<LogicalPlan>> {
        match side {
            LogicalPlan::SubqueryAlias(alias) => {
                let Some(inner) = column_below(&alias.schema, &alias.input, column) else {
                    return Ok(None);
                };
                let Some(input) = self.reduce_side(&alias.input, &inner, other, bound_column)?
                else {
                    return Ok(None);
                };
                SubqueryAlias::try_new(Arc::new(input), alias.alias.clone())
                    .map(|a| Some(LogicalPlan::SubqueryAlias(a)))
            }
            LogicalPlan::Projection(projection) => {
                let Some(inner) = projected_column(projection, column) else {
                    return Ok(None);
                };
                let Some(input) =
                    self.reduce_side(&projection.input, &inner, other, bound_column)?
                else {
                    return Ok(None);
                };
                Projection::try_new(projection.expr.clone(), Arc::new(input))
                    .map(|p| Some(LogicalPlan::Projection(p)))
            }
            LogicalPlan::Filter(filter) => {
                let Some(input) = self.reduce_side(&filter.input, column, other, bound_column)?
                else {
                    return Ok(None);
                };
                Filter::try_new(filter.predicate.clone(), Arc::new(input))
                    .map(|f| Some(LogicalPlan::Filter(f)))
            }
            LogicalPlan::Aggregate(aggregate) => {
                self.reduce_aggregate(aggregate, column, other, bound_column)
            }
            _ => Ok(None),
        }
    }

    fn reduce_aggregate(
        &self,
        aggregate: &Aggregate,
        column: &Column,
        other: &LogicalPlan,
        bound_column: &Column,
    ) -> Result<Option<LogicalPlan>> {
        if aggregate.group_expr.is_empty()
            || aggregate
                .group_expr
                .iter()
                .any(|e| !matches!(e, Expr::Column(_)))
            || reduced_already(&aggregate.input)
        {
            return Ok(None);
        }
        let Ok(index) = aggregate.schema.index_of_column(column) else {
            return Ok(None);
        };
        let Some(Expr::Column(group)) = aggregate.group_expr.get(index) else {
            return Ok(None);
        };
        let input_rows = self.estimates.estimated_rows(&aggregate.input);
        let mut bounds = Vec::new();
        bounds_of(other, bound_column, &mut bounds);
        let best = bounds
            .into_iter()
            .filter(|(plan, _)| reads_one_table(plan))
            .map(|(plan, key)| (self.estimates.estimated_rows(plan), plan, key))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((rows, bound, key)) = best else {
            return Ok(None);
        };
        let same_type = match (
            aggregate.input.schema().qualified_field_from_column(group),
            bound.schema().qualified_field_from_column(&key),
        ) {
            (Ok((_, a)), Ok((_, b))) => a.data_type() == b.data_type(),
            _ => false,
        };
        if !same_type || rows > input_rows * REDUCTION {
            return Ok(None);
        }
        log::debug!(
            "reduce groups: {group} of ≈{input_rows:.0} rows semi-joined with ≈{rows:.0} keys of {key}"
        );
        let keys =
            Projection::try_new(vec![Expr::Column(key).alias(KEY)], Arc::new(bound.clone()))?;
        let keys = SubqueryAlias::try_new(Arc::new(LogicalPlan::Projection(keys)), KEYS)?;
        let semi = Join::try_new(
            Arc::clone(&aggregate.input),
            Arc::new(LogicalPlan::SubqueryAlias(keys)),
            vec![(
                Expr::Column(group.clone()),
                Expr::Column(Column::new(Some(KEYS), KEY)),
            )],
            None,
            JoinType::LeftSemi,
            JoinConstraint::On,
            NullEquality::NullEqualsNothing,
            false,
        )?;
        Aggregate::try_new(
            Arc::new(LogicalPlan::Join(semi)),
            aggregate.group_expr.clone(),
            aggregate.aggr_expr.clone(),
        )
        .map(|a| Some(LogicalPlan::Aggregate(a)))
    }
}

/// The column of `input` that an alias's `column` (of `schema`) renames.
fn column_below(
    schema: &datafusion::common::DFSchema,
    input: &LogicalPlan,
    column: &Column,
) -> Option<Column> {
    let index = schema.index_of_column(column).ok()?;
    let (qualifier, field) = input.schema().qualified_field(index);
    Some(Column::new(qualifier.cloned(), field.name()))
}

/// The input column a projection passes on as `column`, if it only passes
/// it on (perhaps renamed).
fn projected_column(projection: &Projection, column: &Column) -> Option<Column> {
    let index = projection.schema.index_of_column(column).ok()?;
    match projection.expr.get(index)? {
        Expr::Column(inner) => Some(inner.clone()),
        Expr::Alias(alias) => match alias.expr.as_ref() {
            Expr::Column(inner) => Some(inner.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `input` (through projections and filters) is a semi join with
/// keys this rule made.
fn reduced_already(input: &LogicalPlan) -> bool {
    match input {
        LogicalPlan::Join(join) => {
            join.join_type == JoinType::LeftSemi
                && matches!(join.right.as_ref(), LogicalPlan::SubqueryAlias(a) if a.alias.table() == KEYS)
        }
        LogicalPlan::Projection(p) => reduced_already(&p.input),
        LogicalPlan::Filter(f) => reduced_already(&f.input),
        _ => false,
    }
}

/// The subtrees of `plan` (itself included) whose column holds every value
/// `column` of `plan` takes, with that column.
fn bounds_of<'a>(plan: &'a LogicalPlan, column: &Column, out: &mut Vec<(&'a LogicalPlan, Column)>) {
    out.push((plan, column.clone()));
    match plan {
        LogicalPlan::Filter(filter) => bounds_of(&filter.input, column, out),
        LogicalPlan::Projection(projection) => {
            if let Some(inner) = projected_column(projection, column) {
                bounds_of(&projection.input, &inner, out);
            }
        }
        LogicalPlan::SubqueryAlias(alias) => {
            if let Some(inner) = column_below(&alias.schema, &alias.input, column) {
                bounds_of(&alias.input, &inner, out);
            }
        }
        LogicalPlan::Join(join)
            if matches!(join.join_type, JoinType::Inner | JoinType::LeftSemi)
                && join.null_equality == NullEquality::NullEqualsNothing =>
        {
            // The side `column` comes from (a semi join's output is its
            // left side's rows), and the other side through an equality of
            // the join's keys.
            let from_left = join.left.schema().has_column(column);
            let (this, that) = if from_left {
                (&join.left, &join.right)
            } else {
                (&join.right, &join.left)
            };
            if !this.schema().has_column(column) {
                return;
            }
            bounds_of(this, column, out);
            for (l, r) in &join.on {
                let (Expr::Column(l), Expr::Column(r)) = (l, r) else {
                    continue;
                };
                let (mine, theirs) = if from_left { (l, r) } else { (r, l) };
                if mine == column {
                    bounds_of(that, theirs, out);
                }
            }
        }
        _ => {}
    }
}

/// Whether `plan` reads one table through filters, projections and
/// aliases only, and gives the same rows when it runs again: no subquery
/// or volatile function (`random()`) in its expressions, no row limit.
fn reads_one_table(plan: &LogicalPlan) -> bool {
    let plain = !plan.expressions().iter().any(|e| {
        e.is_volatile()
            || e.exists(|e| {
                Ok(matches!(
                    e,
                    Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
                ))
            })
            .unwrap_or(true)
    });
    plain
        && match plan {
            LogicalPlan::TableScan(scan) => scan.fetch.is_none(),
            LogicalPlan::Filter(f) => reads_one_table(&f.input),
            LogicalPlan::Projection(p) => reads_one_table(&p.input),
            LogicalPlan::SubqueryAlias(a) => reads_one_table(&a.input),
            _ => false,
        }
}

impl OptimizerRule for ReduceGroups {
    fn name(&self) -> &str {
        "reduce_groups"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        None
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let options = config.options();
        if !JoinOrderOptions::auto_switch_on(&options, |o| &o.reduce_groups, self.distributed) {
            return Ok(Transformed::no(plan));
        }
        rewrite_joins(plan, |join| Ok(self.reduce(join)?.map(LogicalPlan::Join)))
    }
}
