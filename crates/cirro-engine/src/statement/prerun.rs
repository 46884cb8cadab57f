//! Uncorrelated `IN` subqueries whose size no statistic can tell run
//! before their query, and their values stand in it as a list of
//! constants: `x IN (SELECT k FROM t GROUP BY k HAVING sum(v) > 300)`
//! becomes `x IN (k₁, k₂, …)`.
//!
//! Why: the rows a `HAVING` predicate keeps of an aggregation cannot be
//! estimated from anything `ANALYZE` keeps, and the planner's guess (a
//! fifth of the groups) is millions of rows where the truth is often a few
//! hundred. TPC-H Q18 keeps 624 orders of 15 M at SF 10. Planned on the
//! guess, a cluster shuffles orders and all of lineitem (75 M rows) to
//! join them with the subquery's keys; with the keys as constants, the
//! filter reaches the scans of orders and, through the join on the order
//! key, of lineitem (DataFusion infers it across the equality), and a
//! handful of rows cross the network. PostgreSQL runs an uncorrelated
//! subquery once too (an "InitPlan"); this also hands its result to the
//! planner.
//!
//! A list means the same as the subquery in every case: `x IN (…)` and
//! `x NOT IN (…)` over the same values (NULLs kept) follow the same
//! three-valued logic, and an empty subquery makes `IN` false and `NOT IN`
//! true whatever `x` is. The subquery reads the same table snapshots as
//! its query (the plan's tables are resolved once), inside the same
//! statement: cancel, `statement_timeout` and `memory_limit` hold for it.
//!
//! Only a subquery whose rows a `HAVING` predicate picks is run first (the
//! case the estimates cannot judge; a plain filtered scan is estimated
//! from statistics), and only at the top level of the statement (not
//! inside another subquery). It is given up, and planned as written, when
//! it returns more distinct values than `SET cirro_join_order.prerun_keys`
//! (10,000 by default; 0: never): the work spent until then is lost, which
//! is why the case is kept narrow. EXPLAIN shows the plan as written;
//! EXPLAIN ANALYZE, which runs the statement, shows the list.

use std::collections::HashSet;

use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::logical_expr::expr::{InList, InSubquery};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, lit};
use futures::StreamExt;

use crate::Engine;

/// `plan` with each uncorrelated `IN` subquery picked by `HAVING` (at the
/// top level) replaced by the list of its values, where it returns at most
/// the session's `prerun_keys` distinct values.
pub(crate) async fn in_subqueries(engine: &Engine, plan: LogicalPlan) -> Result<LogicalPlan> {
    let most = engine
        .ctx
        .state()
        .config_options()
        .extensions
        .get::<cirro_exec::rules::JoinOrderOptions>()
        .map_or(0, |o| o.prerun_keys);
    if most == 0 {
        return Ok(plan);
    }
    let mut candidates: Vec<LogicalPlan> = Vec::new();
    plan.apply(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::InSubquery(InSubquery { subquery, .. }) = e
                    && subquery.outer_ref_columns.is_empty()
                    && !subquery.subquery.contains_outer_reference()
                    && picked_by_having(&subquery.subquery)
                    && !candidates.contains(&subquery.subquery)
                {
                    candidates.push(subquery.subquery.as_ref().clone());
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if candidates.is_empty() {
        return Ok(plan);
    }
    let mut lists: Vec<(LogicalPlan, Vec<ScalarValue>)> = Vec::new();
    for subquery in candidates {
        if let Some(values) = values_of(engine, &subquery, most).await? {
            lists.push((subquery, values));
        }
    }
    if lists.is_empty() {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        // An output column keeps its name (`x IN (<subquery>)`), as
        // DataFusion's own rewrites keep it.
        let names = NamePreserver::new(&node);
        node.map_expressions(|expr| {
            let name = names.save(&expr);
            let rewritten = expr.transform_up(|e| {
                let Expr::InSubquery(InSubquery {
                    expr,
                    subquery,
                    negated,
                }) = &e
                else {
                    return Ok(Transformed::no(e));
                };
                let Some((_, values)) = lists.iter().find(|(p, _)| p == subquery.subquery.as_ref())
                else {
                    return Ok(Transformed::no(e));
                };
                if values.is_empty() {
                    return Ok(Transformed::yes(lit(*negated)));
                }
                let list = values.iter().cloned().map(lit).collect();
                Ok(Transformed::yes(Expr::InList(InList::new(
                    expr.clone(),
                    list,
                    *negated,
                ))))
            })?;
            Ok(rewritten.update_data(|e| name.restore(e)))
        })
    })
    .map(|t| t.data)
}

/// Whether `plan` (a subquery) returns rows that a predicate over an
/// aggregation's results picks, under projections, aliases, sorts and
/// DISTINCT.
fn picked_by_having(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => picked_by_having(&p.input),
        LogicalPlan::SubqueryAlias(a) => picked_by_having(&a.input),
        LogicalPlan::Sort(s) => picked_by_having(&s.input),
        LogicalPlan::Distinct(d) => picked_by_having(d.input()),
        LogicalPlan::Filter(f) => grouped(&f.input),
        _ => false,
    }
}

/// Whether `plan` is a grouped aggregation, under projections.
fn grouped(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => grouped(&p.input),
        LogicalPlan::Aggregate(Aggregate { group_expr, .. }) => !group_expr.is_empty(),
        _ => false,
    }
}

/// The distinct values of `subquery`'s one column, in the order they came,
/// or None past `most` of them (the run is stopped there).
async fn values_of(
    engine: &Engine,
    subquery: &LogicalPlan,
    most: usize,
) -> Result<Option<Vec<ScalarValue>>> {
    if subquery.schema().fields().len() != 1 {
        return Ok(None); // the planner reports it
    }
    let frame = engine.frame(subquery.clone()).await?;
    let mut stream = frame.execute_stream().await?;
    let mut seen = HashSet::new();
    let mut values = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = batch.column(0);
        for row in 0..batch.num_rows() {
            let value = ScalarValue::try_from_array(column, row)?;
            if seen.insert(value.clone()) {
                if values.len() == most {
                    return Ok(None);
                }
                values.push(value);
            }
        }
    }
    Ok(Some(values))
}
