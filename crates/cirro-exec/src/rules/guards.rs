//! A condition that can fail is evaluated only where the conditions written
//! before it let it matter, as PostgreSQL does: `WHERE qty <> 0 AND 100 /
//! qty > 3` and `WHERE s ~ '^[0-9]+$' AND s::int > 5` answer there, and
//! failed here with 22012 / 22P02: DataFusion evaluates both sides of `AND`
//! on whole batches (the right side on the selected rows only when the left
//! keeps under a fifth of them), and its optimizer moves "cheap" conjuncts
//! before "expensive" ones (the cast before the regex). Even the form
//! PostgreSQL's manual gives for this, `CASE WHEN qty <> 0 THEN 100 / qty > 3
//! ELSE false END`, failed: the simplifier turns a boolean CASE into AND/OR.
//!
//! So [`GuardFallibleConditions`], an analyzer rule after type coercion and
//! checked arithmetic, rewrites `l AND r` where `r` can fail (division,
//! casts from text or that narrow, NUMERIC arithmetic, functions) into
//! `l AND cirro_guard(l IS DISTINCT FROM false, r)` (`l OR r`: `… IS
//! DISTINCT FROM true`; `functions/guard.rs`): a conjunct that guards itself
//! wherever the optimizer moves it. The guard is made of the terms before
//! `r` over the tables `r` reads (not a join condition, not another table's
//! filter), so it goes where `r` would; only nodes over row values count
//! as able to fail (`CAST('1995-03-15' AS date)` is folded when planning). A boolean CASE's results that can fail
//! are guarded by the conditions that select them, before the simplifier
//! turns the CASE into AND/OR. The value is unchanged for every `l` and
//! `r`, NULLs included: where `l` is false the AND is false whatever the
//! guard gives; elsewhere the guard is `r`. [`LazyGuards`], the first
//! physical rule, turns each guard in filters and projections into `CASE
//! WHEN … THEN r END`, which computes `r` on the selected rows only; filter
//! pushdown then gives the scans the guarded conjuncts. `l` is evaluated
//! twice where this applies, only where `r` can fail, so the conditions most
//! queries filter by (comparisons of columns with constants) are planned as
//! before and still prune files and row groups.
//!
//! Guards are made lazy in filters, projections and the filters of hash and
//! nested-loop joins; elsewhere (an aggregate's FILTER clause, a sort-merge
//! join) the guard is evaluated as a function, both arguments first: the
//! same values, as long as the guarded condition does not fail.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result, TableReference};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{Case, Cast, ScalarFunction};
use datafusion::logical_expr::utils::split_binary;
use datafusion::logical_expr::{
    BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, binary_expr, lit,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::expressions::CaseExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{
    HashJoinExec, HashJoinExecBuilder, NestedLoopJoinExec, NestedLoopJoinExecBuilder,
};
use datafusion::physical_plan::projection::ProjectionExec;

use crate::functions::guard::{GUARD_NAME, guard_udf};

#[derive(Debug, Default)]
pub struct GuardFallibleConditions;

impl AnalyzerRule for GuardFallibleConditions {
    fn name(&self) -> &str {
        "cirro_guard_fallible_conditions"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let logical = |e: &Expr| match e {
                Expr::BinaryExpr(b) => matches!(b.op, Operator::And | Operator::Or),
                Expr::Case(_) => true,
                _ => false,
            };
            super::rewrite_expressions(plan, logical, |expr, schema| {
                expr.transform_up(|node| guard_expr(node, schema))
            })
        })
        .map(|transformed| transformed.data)
    }
}

fn guard_expr(node: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    if let Expr::Case(case) = node {
        return guard_case(case, schema);
    }
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &node else {
        return Ok(Transformed::no(node));
    };
    let short_circuit = match op {
        Operator::And => false,
        Operator::Or => true,
        _ => return Ok(Transformed::no(node)),
    };
    if !needs_guard(right, schema) {
        return Ok(Transformed::no(node));
    }
    // The guard is made of the terms before `right` (of the same AND or
    // OR chain) over the relations `right` reads, so that it goes wherever
    // the optimizer puts `right`: a join condition or another table's filter
    // in it would keep `right` above the join (TPC-H Q3's date filter).
    let relations = relations_of(right);
    let before = split_binary(left, *op)
        .into_iter()
        .filter(|term| {
            let own = relations_of(term);
            !own.is_empty() && own.is_subset(&relations)
        })
        .cloned()
        .reduce(|a, b| binary_expr(a, *op, b));
    let Some(before) = before else {
        return Ok(Transformed::no(node));
    };
    let needed = binary_expr(before, Operator::IsDistinctFrom, lit(short_circuit));
    let guard = guarded(needed, (**right).clone());
    Ok(Transformed::yes(binary_expr((**left).clone(), *op, guard)))
}

/// Whether `expr` can fail on row values and is not guarded yet.
fn needs_guard(expr: &Expr, schema: &DFSchema) -> bool {
    !matches!(expr, Expr::ScalarFunction(f) if f.name() == GUARD_NAME) && row_can_fail(expr, schema)
}

/// The relations (table qualifiers; `None` for unqualified columns) `expr`
/// reads.
fn relations_of(expr: &Expr) -> HashSet<Option<TableReference>> {
    expr.column_refs()
        .into_iter()
        .map(|c| c.relation.clone())
        .collect()
}

/// Whether `expr` can fail on some row: it has a node that can fail over
/// values of rows (one over constants only fails, or not, when planning
/// folds it: `CAST('1995-03-15' AS date)` is no reason to guard).
fn row_can_fail(expr: &Expr, schema: &DFSchema) -> bool {
    row_failure(expr, schema).1
}

/// (whether `expr` reads row values, whether it can fail on them)
fn row_failure(expr: &Expr, schema: &DFSchema) -> (bool, bool) {
    match expr {
        Expr::Column(_)
        | Expr::OuterReferenceColumn(..)
        | Expr::ScalarSubquery(_)
        | Expr::Exists(_)
        | Expr::InSubquery(_) => return (true, false),
        Expr::Literal(..) | Expr::Placeholder(_) => return (false, false),
        _ => {}
    }
    let (mut rows, mut fails) = (false, false);
    let _ = expr.apply_children(|child| {
        let (r, f) = row_failure(child, schema);
        rows |= r;
        fails |= f;
        Ok(if fails {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    (rows, fails || (rows && can_fail(expr, schema)))
}

fn guarded(condition: Expr, value: Expr) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(guard_udf(), vec![condition, value]))
}

/// A boolean `CASE WHEN c1 THEN r1 WHEN c2 THEN r2 ELSE e END`, which the
/// simplifier turns into `(c1 AND r1) OR (c2 AND NOT c1 AND r2) OR …`: each
/// result that can fail guarded by the condition that selects it.
fn guard_case(mut case: Case, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let boolean = matches!(
        case.when_then_expr
            .first()
            .map(|(_, then)| then.get_type(schema)),
        Some(Ok(DataType::Boolean))
    );
    if case.expr.is_some() || !boolean {
        return Ok(Transformed::no(Expr::Case(case)));
    }
    let mut changed = false;
    // Whether no earlier WHEN was true.
    let mut none_before: Option<Expr> = None;
    for (when, then) in case.when_then_expr.iter_mut() {
        let taken = Expr::IsTrue(when.clone());
        if needs_guard(then, schema) {
            let selects = match &none_before {
                Some(none) => none.clone().and(taken.clone()),
                None => taken.clone(),
            };
            **then = guarded(selects, (**then).clone());
            changed = true;
        }
        let not_taken = Expr::IsNotTrue(when.clone());
        none_before = Some(match none_before {
            Some(none) => none.and(not_taken),
            None => not_taken,
        });
    }
    if let (Some(otherwise), Some(none)) = (case.else_expr.as_mut(), none_before)
        && needs_guard(otherwise, schema)
    {
        **otherwise = guarded(none, (**otherwise).clone());
        changed = true;
    }
    Ok(Transformed::new_transformed(Expr::Case(case), changed))
}

/// Whether evaluating `expr` itself (not its children) can raise an error
/// for some row.
fn can_fail(expr: &Expr, schema: &DFSchema) -> bool {
    match expr {
        Expr::BinaryExpr(b) => match b.op {
            Operator::Divide | Operator::Modulo => true,
            // Integer `+ - *` are the checked functions (`checked.rs`) by
            // now; NUMERIC ones fail when the result outgrows its precision.
            Operator::Plus | Operator::Minus | Operator::Multiply => !matches!(
                expr.get_type(schema),
                Ok(DataType::Float16 | DataType::Float32 | DataType::Float64)
            ),
            _ => false,
        },
        Expr::Cast(Cast { expr, field }) => match expr.get_type(schema) {
            Ok(from) => cast_can_fail(&from, field.data_type()),
            Err(_) => true,
        },
        Expr::ScalarFunction(f) => !TOTAL_FUNCTIONS.contains(&f.name()),
        _ => false,
    }
}

/// Turns each `cirro_guard(condition, value)` of filters, projections and
/// join filters into `CASE WHEN condition THEN value END`, before
/// DataFusion's physical rules (whose filter pushdown hands the conjuncts to
/// the scans).
#[derive(Debug, Default)]
pub struct LazyGuards;

impl PhysicalOptimizerRule for LazyGuards {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if let Some(filter) = node.downcast_ref::<FilterExec>() {
                let lazy = lazy(Arc::clone(filter.predicate()))?;
                if !lazy.transformed {
                    return Ok(Transformed::no(node));
                }
                let rebuilt = FilterExecBuilder::from(filter)
                    .with_predicate(lazy.data)
                    .build()?;
                return Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>));
            }
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                return super::rewrite_projection(Arc::clone(&node), projection, |expr| {
                    lazy(Arc::clone(expr))
                });
            }
            if let Some(join) = node.downcast_ref::<HashJoinExec>()
                && let Some(filter) = lazy_join_filter(join.filter())?
            {
                let rebuilt = HashJoinExecBuilder::from(join)
                    .with_filter(Some(filter))
                    .build()?;
                return Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>));
            }
            if let Some(join) = node.downcast_ref::<NestedLoopJoinExec>()
                && let Some(filter) = lazy_join_filter(join.filter())?
            {
                let rebuilt = NestedLoopJoinExecBuilder::from(join)
                    .with_filter(Some(filter))
                    .build()?;
                return Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "cirro_lazy_guards"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A join's filter with its guards made lazy, or None if it has none.
fn lazy_join_filter(filter: Option<&JoinFilter>) -> Result<Option<JoinFilter>> {
    let Some(filter) = filter else {
        return Ok(None);
    };
    let lazy = lazy(Arc::clone(filter.expression()))?;
    Ok(lazy.transformed.then(|| {
        JoinFilter::new(
            lazy.data,
            filter.column_indices().to_vec(),
            Arc::clone(filter.schema()),
        )
    }))
}

/// `expr` with its guards lazy, as [`LazyGuards`] makes them in a plan: for
/// expressions evaluated outside one (a point read by key).
pub fn lazy_guards(expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(lazy(expr)?.data)
}

fn lazy(expr: Arc<dyn PhysicalExpr>) -> Result<Transformed<Arc<dyn PhysicalExpr>>> {
    expr.transform_up(|node| {
        let Some(function) = node.downcast_ref::<ScalarFunctionExpr>() else {
            return Ok(Transformed::no(node));
        };
        let [condition, value] = function.args() else {
            return Ok(Transformed::no(node));
        };
        if function.name() != GUARD_NAME {
            return Ok(Transformed::no(node));
        }
        let case = CaseExpr::try_new(None, vec![(Arc::clone(condition), Arc::clone(value))], None)?;
        Ok(Transformed::yes(Arc::new(case) as Arc<dyn PhysicalExpr>))
    })
}

/// Functions that cannot fail on any input of their types.
const TOTAL_FUNCTIONS: &[&str] = &[
    "lower",
    "upper",
    "btrim",
    "ltrim",
    "rtrim",
    "trim",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "bit_length",
    "coalesce",
    "nullif",
    "starts_with",
    "ends_with",
    "strpos",
    "concat",
    "concat_ws",
    "md5",
    "isnan",
    "iszero",
    "date_part",
    "date_trunc",
];

/// Whether a cast from `from` to `to` can fail for some value.
fn cast_can_fail(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    if from == to || matches!(to, Utf8 | LargeUtf8 | Utf8View) {
        return false;
    }
    if let Dictionary(_, values) = from {
        return cast_can_fail(values, to);
    }
    match (from, to) {
        (Null, _) => false,
        (f, t) if f.is_integer() && t.is_integer() => !integer_fits(f, t),
        (f, Float32 | Float64) if f.is_integer() || matches!(f, Float32 | Decimal128(..)) => false,
        (f, Decimal128(p, s)) if f.is_integer() => (*p as i16 - *s as i16) < integer_digits(f),
        (Decimal128(p1, s1), Decimal128(p2, s2)) => {
            (*p2 as i16 - *s2 as i16) < (*p1 as i16 - *s1 as i16)
        }
        (Date32, Date64) => false,
        (Timestamp(..), Date32 | Date64) => false,
        _ => true,
    }
}

/// Whether every value of the integer type `from` is one of `to`.
fn integer_fits(from: &DataType, to: &DataType) -> bool {
    let bits = |t: &DataType| t.primitive_width().unwrap_or(8) * 8;
    match (from.is_signed_integer(), to.is_signed_integer()) {
        (true, true) | (false, false) => bits(to) >= bits(from),
        (false, true) => bits(to) > bits(from),
        (true, false) => false,
    }
}

/// Decimal digits the largest value of an integer type has.
fn integer_digits(t: &DataType) -> i16 {
    match t.primitive_width() {
        Some(1) => 3,
        Some(2) => 5,
        Some(4) => 10,
        _ => 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_that_can_fail() {
        use DataType::*;
        assert!(!cast_can_fail(&Int32, &Int64));
        assert!(cast_can_fail(&Int64, &Int32));
        assert!(cast_can_fail(&Int32, &UInt32));
        assert!(!cast_can_fail(&UInt32, &Int64));
        assert!(cast_can_fail(&UInt64, &Int64));
        assert!(cast_can_fail(&Utf8, &Int32));
        assert!(!cast_can_fail(&Int32, &Utf8));
        assert!(!cast_can_fail(&Int32, &Decimal128(10, 0)));
        assert!(cast_can_fail(&Int32, &Decimal128(10, 2)));
        assert!(!cast_can_fail(&Decimal128(15, 2), &Decimal128(20, 4)));
        assert!(cast_can_fail(&Decimal128(15, 2), &Decimal128(12, 2)));
        assert!(!cast_can_fail(&Int64, &Float64));
        assert!(cast_can_fail(&Float64, &Int64));
        assert!(!cast_can_fail(
            &Dictionary(Box::new(Int32), Box::new(Utf8)),
            &Utf8
        ));
    }
}
