//! A filter that compares its rows with an aggregate of those same rows
//! reads the aggregate from a window over them, instead of computing its
//! input a second time for a scalar subquery.
//!
//! TPC-H Q15 keeps the suppliers whose revenue equals the largest revenue:
//! after DataFusion's rewrites its plan is
//!
//! ```text
//! Filter: total = (<subquery>)            Projection: (X's columns)
//!   X (lineitem's revenue per supplier)     Filter: total = __cirro_window_0
//! <subquery>: Aggregate: max(r.total) ─►      Window: max(total) OVER () AS __cirro_window_0
//!               SubqueryAlias: r                X
//!                 Projection: … AS total
//!                   X (the same plan)
//! ```
//!
//! On one node `SharedSubplans` computes X once for both; on a cluster the
//! two copies of X run in different stages, which share nothing, and X (a
//! scan of a quarter of lineitem) ran twice. The window computes the same
//! value from the one X: an aggregate over a whole partition with no
//! `PARTITION BY`, `ORDER BY` or frame is the aggregate over every row, the
//! subquery's value, on every row (an empty X has no row to filter, as
//! before).
//!
//! Only an uncorrelated scalar subquery that is exactly one aggregate
//! (no `DISTINCT`, `FILTER` or ordering, no `GROUP BY`) over aliases and
//! projections of a plan equal to the filter's input, only where that
//! input is a grouped aggregation's output (the window holds it whole in
//! one partition) and calls no volatile function (two runs of it could
//! differ).
//! The aggregate's argument is carried through the aliases and projections
//! down to the input's columns.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, NullEquality, Result};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{
    Expr, Filter, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Subquery, Window,
    WindowFunctionDefinition,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// The window column's name; a number follows.
const WINDOW_COLUMN: &str = "__cirro_window_";

#[derive(Debug, Default)]
pub struct SubqueryWindows;

impl OptimizerRule for SubqueryWindows {
    fn name(&self) -> &str {
        "subquery_windows"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let rewritten = match &plan {
            LogicalPlan::Filter(filter) => windowed(filter)?,
            LogicalPlan::Join(join) => windowed_join(join)?,
            _ => None,
        };
        Ok(match rewritten {
            Some(rewritten) => Transformed::yes(rewritten),
            None => Transformed::no(plan),
        })
    }
}

/// `filter` with its scalar subqueries over its own input read from
/// windows over that input, if it has any.
fn windowed(filter: &Filter) -> Result<Option<LogicalPlan>> {
    let input = filter.input.as_ref();
    let mut windows: Vec<(Subquery, Expr)> = Vec::new();
    filter.predicate.apply(|expr| {
        if let Expr::ScalarSubquery(subquery) = expr
            && !windows.iter().any(|(s, _)| s == subquery)
            && let Some(window) = window_for(subquery, input)
        {
            windows.push((subquery.clone(), window));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if windows.is_empty() || is_volatile(input)? {
        return Ok(None);
    }
    // The names of the window columns, unused by the input.
    let mut names: Vec<String> = Vec::with_capacity(windows.len());
    let mut next = 0;
    for _ in 0..windows.len() {
        let n = window_number(input, next);
        names.push(format!("{WINDOW_COLUMN}{n}"));
        next = n + 1;
    }
    let predicate = filter
        .predicate
        .clone()
        .transform(|expr| match &expr {
            Expr::ScalarSubquery(subquery) => {
                match windows.iter().position(|(s, _)| s == subquery) {
                    Some(i) => Ok(Transformed::yes(Expr::Column(Column::from_name(&names[i])))),
                    None => Ok(Transformed::no(expr)),
                }
            }
            _ => Ok(Transformed::no(expr)),
        })?
        .data;
    let window_exprs = windows
        .into_iter()
        .zip(&names)
        .map(|((_, window), name)| window.alias(name))
        .collect();
    filtered_over_windows(Arc::clone(&filter.input), window_exprs, predicate).map(Some)
}

/// `input` with `windows` (aliased window expressions) added, filtered by
/// `predicate` (which may read them), and projected back to its columns.
fn filtered_over_windows(
    input: Arc<LogicalPlan>,
    windows: Vec<Expr>,
    predicate: Expr,
) -> Result<LogicalPlan> {
    let columns = input.schema().columns().into_iter().map(Expr::Column);
    LogicalPlanBuilder::from(LogicalPlan::Window(Window::try_new(windows, input)?))
        .filter(predicate)?
        .project(columns)?
        .build()
}

/// The window (over `input`) that gives `subquery`'s value, if `subquery`
/// is one aggregate over `input` itself (see the module docs).
fn window_for(subquery: &Subquery, input: &LogicalPlan) -> Option<Expr> {
    if !subquery.outer_ref_columns.is_empty() {
        return None;
    }
    let aggregate = Aggregated::of(subquery.subquery.as_ref())?;
    let args = aggregate.args_over(input)?;
    groups_of(input).then(|| aggregate.window(args))
}

/// One aggregate without `GROUP BY` (under aliases): its function, and
/// the plans below it down through aliases and projections, each with the
/// aggregate's arguments in that plan's columns.
struct Aggregated<'a> {
    func: Arc<datafusion::logical_expr::AggregateUDF>,
    levels: Vec<(&'a LogicalPlan, Vec<Expr>)>,
}

impl<'a> Aggregated<'a> {
    fn of(mut plan: &'a LogicalPlan) -> Option<Self> {
        while let LogicalPlan::SubqueryAlias(alias) = plan {
            plan = alias.input.as_ref();
        }
        let LogicalPlan::Aggregate(aggregate) = plan else {
            return None;
        };
        if !aggregate.group_expr.is_empty() || aggregate.aggr_expr.len() != 1 {
            return None;
        }
        let Expr::AggregateFunction(AggregateFunction { func, params }) =
            unalias(&aggregate.aggr_expr[0])
        else {
            return None;
        };
        if params.distinct
            || params.filter.is_some()
            || !params.order_by.is_empty()
            || params.null_treatment.is_some()
        {
            return None;
        }
        // Down through aliases and projections, the arguments rewritten at
        // each step in the columns of the next.
        let mut args = params.args.clone();
        let mut below = aggregate.input.as_ref();
        let mut levels = Vec::new();
        loop {
            levels.push((below, args.clone()));
            match below {
                LogicalPlan::SubqueryAlias(alias) => {
                    let inner = alias.input.schema();
                    let Some(next) = rewrite_columns(args, |column| {
                        let i = alias.schema.index_of_column(column).ok()?;
                        Some(Expr::Column(Column::from(inner.qualified_field(i))))
                    }) else {
                        break;
                    };
                    args = next;
                    below = alias.input.as_ref();
                }
                LogicalPlan::Projection(projection) => {
                    let Some(next) = rewrite_columns(args, |column| {
                        let i = projection.schema.index_of_column(column).ok()?;
                        Some(unalias(&projection.expr[i]).clone())
                    }) else {
                        break;
                    };
                    args = next;
                    below = projection.input.as_ref();
                }
                _ => break,
            }
        }
        Some(Self {
            func: Arc::clone(func),
            levels,
        })
    }

    /// The arguments in the columns of `plan`, if it is one of the levels.
    fn args_over(&self, plan: &LogicalPlan) -> Option<Vec<Expr>> {
        self.levels
            .iter()
            .find(|(level, _)| *level == plan)
            .map(|(_, args)| args.clone())
    }

    /// The aggregate over a whole partition, as a window function.
    fn window(&self, args: Vec<Expr>) -> Expr {
        let function = WindowFunctionDefinition::AggregateUDF(Arc::clone(&self.func));
        Expr::from(WindowFunction::new(function, args))
    }
}

/// `join` (an inner join of a plan with an aggregate over part of that
/// same plan, on one of the plan's columns equal to the aggregate, the form
/// DataFusion decorrelates a scalar subquery into when it does not keep it
/// in the filter) with the aggregate read from a window where the plan
/// holds that part, and the comparison made there.
fn windowed_join(join: &Join) -> Result<Option<LogicalPlan>> {
    if join.join_type != JoinType::Inner
        || join.filter.is_some()
        || join.on.len() != 1
        || join.null_equality != NullEquality::NullEqualsNothing
    {
        return Ok(None);
    }
    let (left_key, right_key) = &join.on[0];
    let (Expr::Column(left_key), Expr::Column(right_key)) = (left_key, right_key) else {
        return Ok(None);
    };
    // The one-row side: an aggregate of one column.
    let sides = [
        (join.left.as_ref(), left_key, join.right.as_ref()),
        (join.right.as_ref(), right_key, join.left.as_ref()),
    ];
    let Some((rows, column, scalar, aggregate)) =
        sides.into_iter().find_map(|(rows, column, scalar)| {
            if scalar.schema().fields().len() != 1 {
                return None;
            }
            Aggregated::of(scalar).map(|a| (rows, column, scalar, a))
        })
    else {
        return Ok(None);
    };
    let Some(rows) = with_window(rows, column, &aggregate)? else {
        return Ok(None);
    };
    // The join's columns: the aggregate's equals the compared column on
    // every row that is left.
    let scalar_field = scalar.schema().qualified_field(0);
    let scalar_column = Column::from(scalar_field);
    let columns = join
        .schema
        .columns()
        .into_iter()
        .map(|c| {
            if c == scalar_column {
                Expr::Column(column.clone()).alias_qualified(c.relation.clone(), c.name.clone())
            } else {
                Expr::Column(c)
            }
        })
        .collect::<Vec<_>>();
    LogicalPlanBuilder::from(rows)
        .project(columns)?
        .build()
        .map(Some)
}

/// `plan` with the rows whose `column` is not the aggregate's value left
/// out where `column` comes from a level of the aggregate (see
/// [`windowed_join`]); the path there may only pass projections that
/// rename the column, aliases, filters and inner joins, through all of
/// which a filter on the column's rows moves unchanged.
fn with_window(
    plan: &LogicalPlan,
    column: &Column,
    aggregate: &Aggregated,
) -> Result<Option<LogicalPlan>> {
    if let Some(args) = aggregate.args_over(plan) {
        if !groups_of(plan) || is_volatile(plan)? {
            return Ok(None);
        }
        let name = format!("{WINDOW_COLUMN}{}", window_number(plan, 0));
        let predicate = Expr::Column(column.clone()).eq(Expr::Column(Column::from_name(&name)));
        let window = aggregate.window(args).alias(name);
        return filtered_over_windows(Arc::new(plan.clone()), vec![window], predicate).map(Some);
    }
    // The input the column comes from, and its name there.
    let (index, inner) = match plan {
        LogicalPlan::Projection(projection) => {
            let Ok(i) = projection.schema.index_of_column(column) else {
                return Ok(None);
            };
            let Expr::Column(inner) = unalias(&projection.expr[i]) else {
                return Ok(None);
            };
            (0, inner.clone())
        }
        LogicalPlan::SubqueryAlias(alias) => {
            let Ok(i) = alias.schema.index_of_column(column) else {
                return Ok(None);
            };
            (0, Column::from(alias.input.schema().qualified_field(i)))
        }
        LogicalPlan::Filter(_) => (0, column.clone()),
        LogicalPlan::Join(join) if join.join_type == JoinType::Inner => {
            let Ok(i) = join.schema.index_of_column(column) else {
                return Ok(None);
            };
            let left = join.left.schema().fields().len();
            if i < left {
                (0, Column::from(join.left.schema().qualified_field(i)))
            } else {
                (
                    1,
                    Column::from(join.right.schema().qualified_field(i - left)),
                )
            }
        }
        _ => return Ok(None),
    };
    let inputs = plan.inputs();
    let Some(rewritten) = with_window(inputs[index], &inner, aggregate)? else {
        return Ok(None);
    };
    let mut inputs: Vec<LogicalPlan> = inputs.into_iter().cloned().collect();
    inputs[index] = rewritten;
    plan.with_new_exprs(plan.expressions(), inputs).map(Some)
}

/// The first number from `first` on that makes a window column's name
/// `plan` does not use.
fn window_number(plan: &LogicalPlan, first: usize) -> usize {
    let columns = plan.schema().columns();
    (first..)
        .find(|n| {
            let name = format!("{WINDOW_COLUMN}{n}");
            !columns.iter().any(|c| c.name == name)
        })
        .unwrap_or(first)
}

/// `args` with each column replaced by what `map` gives (None if any has
/// no replacement).
fn rewrite_columns(args: Vec<Expr>, map: impl Fn(&Column) -> Option<Expr>) -> Option<Vec<Expr>> {
    let mut complete = true;
    let args = args
        .into_iter()
        .map(|arg| {
            arg.transform(|expr| match &expr {
                Expr::Column(column) => match map(column) {
                    Some(replacement) => Ok(Transformed::yes(replacement)),
                    None => {
                        complete = false;
                        Ok(Transformed::no(expr))
                    }
                },
                _ => Ok(Transformed::no(expr)),
            })
            .map(|t| t.data)
        })
        .collect::<Result<Vec<_>>>()
        .ok()?;
    complete.then_some(args)
}

/// Whether `plan` is a grouped aggregation's output (under projections,
/// aliases and filters). The window holds its input whole in one
/// partition: the groups are few beside the rows they came from (and one
/// node's shared subplans held them too), a table's rows may not be.
fn groups_of(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => groups_of(&p.input),
        LogicalPlan::SubqueryAlias(a) => groups_of(&a.input),
        LogicalPlan::Filter(f) => groups_of(&f.input),
        LogicalPlan::Aggregate(a) => !a.group_expr.is_empty(),
        _ => false,
    }
}

fn unalias(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(alias) => unalias(&alias.expr),
        other => other,
    }
}

/// Whether any expression of `plan` calls a volatile function.
fn is_volatile(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        let mut volatile = false;
        node.apply_expressions(|expr| {
            volatile |= expr.is_volatile();
            Ok(if volatile {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        Ok(volatile)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn optimized(ctx: &SessionContext, sql: &str) -> LogicalPlan {
        let state = ctx.state();
        let plan = state.create_logical_plan(sql).await.unwrap();
        state.optimize(&plan).unwrap()
    }

    fn context() -> SessionContext {
        let ctx = SessionContext::new();
        ctx.add_optimizer_rule(Arc::new(SubqueryWindows));
        ctx
    }

    async fn answer(ctx: &SessionContext, sql: &str) -> Vec<String> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        text.lines().map(str::to_string).collect()
    }

    const SETUP: &str = "CREATE TABLE t AS VALUES (1, 10), (1, 20), (2, 40), (3, 40), (4, NULL)";

    #[tokio::test]
    async fn a_filter_on_an_aggregate_of_its_own_rows_reads_a_window() {
        let ctx = context();
        ctx.sql(SETUP).await.unwrap();
        let q = "WITH r AS (SELECT column1 AS k, sum(column2) AS total FROM t GROUP BY column1) \
                 SELECT k, total FROM r WHERE total = (SELECT max(total) FROM r) ORDER BY k";
        let plan = optimized(&ctx, q).await.to_string();
        assert!(plan.contains("WindowAggr"), "{plan}");
        assert!(!plan.contains("<subquery>"), "{plan}");
        // The same answer as without the rule.
        let plain = SessionContext::new();
        plain.sql(SETUP).await.unwrap();
        assert_eq!(answer(&ctx, q).await, answer(&plain, q).await);
        assert_eq!(
            answer(&ctx, q).await[3..5],
            ["| 2 | 40    |", "| 3 | 40    |"]
        );

        // Any comparison and aggregate; NULLs as a subquery's.
        let q = "WITH r AS (SELECT column1 AS k, sum(column2) AS total FROM t GROUP BY column1) \
                 SELECT k FROM r WHERE total * 2 > (SELECT avg(total) FROM r) + 1 ORDER BY k";
        assert!(optimized(&ctx, q).await.to_string().contains("WindowAggr"));
        assert_eq!(answer(&ctx, q).await, answer(&plain, q).await);
    }

    #[tokio::test]
    async fn a_subquery_decorrelated_into_a_join_reads_a_window_below_the_join() {
        // How a cluster plans (datafusion-distributed turns the physical
        // scalar subquery off): the subquery is joined to the rows, above
        // the join of the view with another table.
        const OFF: &str =
            "SET datafusion.optimizer.enable_physical_uncorrelated_scalar_subquery = false";
        let ctx = context();
        let plain = SessionContext::new();
        for c in [&ctx, &plain] {
            c.sql(OFF).await.unwrap();
            c.sql(SETUP).await.unwrap();
            c.sql("CREATE TABLE s AS VALUES (1, 'a'), (2, 'b'), (3, 'c'), (5, 'e')")
                .await
                .unwrap();
        }
        let q = "WITH r AS (SELECT column1 AS k, sum(column2) AS total FROM t GROUP BY column1) \
                 SELECT s.column2, total FROM s, r WHERE s.column1 = k \
                 AND total = (SELECT max(total) FROM r) ORDER BY 1";
        let before = plain
            .state()
            .optimize(&plain.state().create_logical_plan(q).await.unwrap());
        assert!(before.unwrap().to_string().contains("__scalar_sq"));
        let plan = optimized(&ctx, q).await.to_string();
        assert!(plan.contains("WindowAggr"), "{plan}");
        assert_eq!(plan.matches("TableScan: t").count(), 1, "{plan}");
        assert_eq!(answer(&ctx, q).await, answer(&plain, q).await);
        assert_eq!(
            answer(&ctx, q).await[3..5],
            ["| b       | 40    |", "| c       | 40    |"]
        );
    }

    #[tokio::test]
    async fn other_subqueries_stay() {
        let ctx = context();
        ctx.sql(SETUP).await.unwrap();
        for q in [
            // Over another plan.
            "SELECT column1 FROM t WHERE column2 = (SELECT max(column2) FROM t WHERE column1 > 1)",
            // Over a table's rows, not groups (the window would hold them
            // all in one partition).
            "SELECT column1 FROM t WHERE column2 = (SELECT max(column2) FROM t)",
            // Grouped, distinct, or not an aggregate.
            "SELECT column1 FROM t WHERE column2 = (SELECT count(DISTINCT column2) FROM t)",
            "SELECT column1 FROM t WHERE column2 = (SELECT column2 FROM t LIMIT 1)",
            // Volatile input.
            "SELECT a FROM (SELECT random() AS a FROM t) AS v \
             WHERE a = (SELECT max(a) FROM (SELECT random() AS a FROM t) AS w)",
        ] {
            let plan = optimized(&ctx, q).await.to_string();
            assert!(!plan.contains("WindowAggr"), "{q}\n{plan}");
        }
    }
}
