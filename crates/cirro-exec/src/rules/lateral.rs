//! A lateral subquery without FROM, `CROSS JOIN LATERAL (SELECT e1, …) AS
//! o(c1, …)`, yields one row per row of its outer side, computed from that
//! row. pgbench's start-up query is one (`cross join lateral (select
//! array_position(current_schemas(true), n.nspname)) as o(n)`). DataFusion
//! 55 plans it as a join with a correlated subquery that its decorrelation
//! leaves in place, and then cannot run it ("Physical plan does not support
//! logical expression OuterReferenceColumn").
//!
//! [`InlineLateralProjections`] computes the subquery's expressions over the
//! outer row instead: the join becomes a projection of the outer side's
//! columns and `e1 AS o.c1, …`, with the same schema. Only an inner join
//! without a condition (or `ON true`) whose subquery is projections over one
//! empty row is rewritten: no filter, aggregation, window, limit or nested
//! subquery, so each outer row still gives exactly one row with the same
//! values.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{Expr, Join, JoinType, LogicalPlan, Projection};
use datafusion::optimizer::AnalyzerRule;

#[derive(Debug, Default)]
pub struct InlineLateralProjections;

impl AnalyzerRule for InlineLateralProjections {
    fn name(&self) -> &str {
        "cirro_inline_lateral_projections"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(inline)
            .map(|transformed| transformed.data)
    }
}

fn inline(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = &plan else {
        return Ok(Transformed::no(plan));
    };
    let Some(exprs) = lateral_row(join) else {
        return Ok(Transformed::no(plan));
    };
    let left = join.left.schema();
    let mut projection: Vec<Expr> = left.columns().into_iter().map(Expr::Column).collect();
    for ((qualifier, field), expr) in join.right.schema().iter().zip(exprs) {
        // The outer side's columns, read through the subquery's outer
        // references, are plain columns here.
        let expr = expr
            .transform(|e| match e {
                Expr::OuterReferenceColumn(_, column) if left.has_column(&column) => {
                    Ok(Transformed::yes(Expr::Column(column)))
                }
                other => Ok(Transformed::no(other)),
            })?
            .data;
        projection.push(expr.alias_qualified(qualifier.cloned(), field.name()));
    }
    let projected = Projection::try_new(projection, Arc::clone(&join.left))?;
    Ok(Transformed::yes(LogicalPlan::Projection(projected)))
}

/// The expressions of `join`'s right side, one per column, where it is a
/// lateral subquery that yields one row from projections alone and the
/// join keeps every pair.
fn lateral_row(join: &Join) -> Option<Vec<Expr>> {
    let unconditional = match &join.filter {
        None => true,
        Some(Expr::Literal(ScalarValue::Boolean(Some(true)), _)) => true,
        Some(_) => false,
    };
    if join.join_type != JoinType::Inner || !join.on.is_empty() || !unconditional {
        return None;
    }
    let mut node = join.right.as_ref();
    if let LogicalPlan::SubqueryAlias(alias) = node {
        node = alias.input.as_ref();
    }
    let LogicalPlan::Subquery(subquery) = node else {
        return None;
    };
    // The projections from the top down to the one empty row.
    let mut projections = Vec::new();
    let mut node = subquery.subquery.as_ref();
    loop {
        match node {
            LogicalPlan::Projection(projection) => {
                projections.push(projection);
                node = projection.input.as_ref();
            }
            LogicalPlan::SubqueryAlias(alias) => node = alias.input.as_ref(),
            LogicalPlan::EmptyRelation(empty) if empty.produce_one_row => break,
            _ => return None,
        }
    }
    // Composed from the bottom up: each projection's columns replaced by
    // the expressions of the one below.
    let mut below: Option<(Vec<Expr>, &DFSchema)> = None;
    for projection in projections.iter().rev() {
        let mut exprs = Vec::with_capacity(projection.expr.len());
        for expr in &projection.expr {
            let computed_per_row = !expr
                .exists(|e| {
                    Ok(matches!(
                        e,
                        Expr::ScalarSubquery(_)
                            | Expr::Exists(_)
                            | Expr::InSubquery(_)
                            | Expr::AggregateFunction(_)
                            | Expr::WindowFunction(_)
                            | Expr::Placeholder(_)
                    ))
                })
                .unwrap_or(true);
            if !computed_per_row {
                return None;
            }
            let expr = match &below {
                None => expr.clone().unalias_nested().data,
                Some((inner, schema)) => {
                    let mut missing = false;
                    let replaced = expr
                        .clone()
                        .unalias_nested()
                        .data
                        .transform(|e| match e {
                            Expr::Column(column) => match schema.index_of_column(&column) {
                                Ok(i) => Ok(Transformed::yes(inner[i].clone())),
                                Err(_) => {
                                    missing = true;
                                    Ok(Transformed::no(Expr::Column(column)))
                                }
                            },
                            other => Ok(Transformed::no(other)),
                        })
                        .ok()?
                        .data;
                    if missing {
                        return None;
                    }
                    replaced
                }
            };
            exprs.push(expr);
        }
        below = Some((exprs, projection.schema.as_ref()));
    }
    let (exprs, _) = below?;
    (exprs.len() == join.right.schema().fields().len()).then_some(exprs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn answer(ctx: &SessionContext, sql: &str) -> Vec<String> {
        let batches = ctx
            .sql(sql)
            .await
            .expect("plan")
            .collect()
            .await
            .expect("run");
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn context() -> SessionContext {
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_default_features()
            .with_analyzer_rule(Arc::new(InlineLateralProjections))
            .build();
        SessionContext::new_with_state(state)
    }

    #[tokio::test]
    async fn a_lateral_projection_is_computed_from_the_outer_row() {
        let ctx = context();
        ctx.sql("CREATE TABLE t (a INT, b VARCHAR) AS VALUES (1, 'x'), (2, 'y'), (3, NULL)")
            .await
            .expect("create")
            .collect()
            .await
            .expect("run");
        let rows = answer(
            &ctx,
            "SELECT t.a, o.n, o.m FROM t CROSS JOIN LATERAL \
             (SELECT t.a * 2, upper(t.b)) AS o(n, m) ORDER BY t.a",
        )
        .await;
        assert_eq!(
            rows[3..6],
            [
                "| 1 | 2 | X |".to_string(),
                "| 2 | 4 | Y |".to_string(),
                "| 3 | 6 |   |".to_string(),
            ]
        );
        // Used in the WHERE clause and the grouping, as pgbench does.
        let rows = answer(
            &ctx,
            "SELECT o.n, count(*) FROM t, LATERAL (SELECT t.a % 2 AS n) AS o \
             WHERE o.n IS NOT NULL GROUP BY 1 ORDER BY 1",
        )
        .await;
        assert_eq!(rows[3..5], ["| 0 | 1        |", "| 1 | 2        |"]);
    }

    /// The plan of `sql` after this rule alone.
    async fn analyzed(ctx: &SessionContext, sql: &str) -> String {
        let plan = ctx.sql(sql).await.expect("plan").into_unoptimized_plan();
        InlineLateralProjections
            .analyze(plan, &ConfigOptions::default())
            .expect("analyze")
            .display_indent()
            .to_string()
    }

    #[tokio::test]
    async fn only_a_lateral_row_of_projections_is_inlined() {
        let ctx = context();
        ctx.sql("CREATE TABLE t (a INT) AS VALUES (1), (2)")
            .await
            .expect("create")
            .collect()
            .await
            .expect("run");
        let inlined = analyzed(
            &ctx,
            "SELECT t.a, o.c FROM t CROSS JOIN LATERAL (SELECT t.a + 1 AS c) AS o",
        )
        .await;
        assert!(!inlined.contains("Subquery"), "{inlined}");
        for kept in [
            "SELECT t.a, o.c FROM t CROSS JOIN LATERAL (SELECT count(t.a) AS c) AS o",
            "SELECT t.a, o.c FROM t CROSS JOIN LATERAL (SELECT t.a AS c WHERE t.a > 1) AS o",
            "SELECT t.a, o.c FROM t LEFT JOIN LATERAL (SELECT t.a AS c) AS o ON true",
        ] {
            let plan = analyzed(&ctx, kept).await;
            assert!(plan.contains("Subquery"), "{kept}: {plan}");
        }
    }
}
