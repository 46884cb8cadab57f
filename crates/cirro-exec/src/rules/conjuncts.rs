//! The conjuncts of filters, cheapest first.
//!
//! DataFusion evaluates `a AND b` on every row for `a`, and for `b` on
//! every row too unless at most a fifth of the rows passed `a` (then only
//! on those: its pre-selection); a filter's conjuncts run in the order the
//! query wrote them. TPC-H Q12 writes `l_shipmode IN ('MAIL', 'SHIP')`
//! before four date comparisons: the string comparisons ran on all 60 M
//! rows of lineitem at SF10 (1.5 s of CPU), and the date comparisons,
//! split by it, did not compile into one pass ([`super::jit`] compiles the
//! largest subtrees, here each lone comparison). Cheap conjuncts first, the
//! dates compile into one pass and keep 0.5 % of the rows, and the string
//! comparisons see only those.
//!
//! The order: a conjunct's cost is the comparisons it makes, a comparison
//! of strings counting [`STRING_COST`], `LIKE` [`LIKE_COST`]; a stable sort
//! keeps the written order among equals. Only conjuncts that cannot fail
//! move ahead (comparisons, `IN` lists, `IS NULL`, `LIKE`, `NOT`, `AND`/`OR`
//! of those, over columns and literals); the others (arithmetic, casts,
//! functions, guarded conditions: `rules/guards.rs`) keep their order
//! behind them, so a conjunct that can fail sees no row it would not have
//! seen. Off with `SET cirro_jit.order_conjuncts = false`.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NotExpr,
};
use datafusion::physical_expr::utils::{conjunction, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};

use super::JitOptions;
use crate::conjunction::Conjunction;

/// What a comparison of strings costs, against one of numbers or dates.
pub const STRING_COST: u32 = 8;

/// What a `LIKE` costs, against a comparison of numbers.
pub const LIKE_COST: u32 = 24;

#[derive(Debug, Default)]
pub struct OrderConjuncts;

impl PhysicalOptimizerRule for OrderConjuncts {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        rewrite_filters(
            plan,
            config,
            |o| o.order_conjuncts,
            |filter| ordered(filter.predicate(), &filter.input().schema()),
        )
    }

    fn name(&self) -> &str {
        "cirro_order_conjuncts"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Filters' predicates as [`Conjunction`]s: each conjunct evaluated on the
/// rows the ones before it kept, reading only its own columns (see
/// [`crate::conjunction`]). It runs after the expressions are compiled, in
/// single-node plans (DataFusion's codec cannot send the node). Off with
/// `SET cirro_jit.selective_conjuncts = false`.
#[derive(Debug, Default)]
pub struct SelectiveConjuncts;

impl PhysicalOptimizerRule for SelectiveConjuncts {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        rewrite_filters(
            plan,
            config,
            |o| o.selective_conjuncts,
            |filter| {
                if filter.predicate().downcast_ref::<Conjunction>().is_some() {
                    return None;
                }
                let conjuncts = split_conjunction(filter.predicate())
                    .into_iter()
                    .cloned()
                    .collect();
                Conjunction::try_new(conjuncts, &filter.input().schema())
                    .map(|c| Arc::new(c) as Arc<dyn PhysicalExpr>)
            },
        )
    }

    fn name(&self) -> &str {
        "cirro_selective_conjuncts"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with each filter's predicate replaced by what `rewrite` gives
/// (None: kept), unless `enabled` says the session switched it off.
fn rewrite_filters(
    plan: Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
    enabled: impl Fn(&JitOptions) -> bool,
    rewrite: impl Fn(&FilterExec) -> Option<Arc<dyn PhysicalExpr>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if config
        .extensions
        .get::<JitOptions>()
        .is_some_and(|o| !enabled(o))
    {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(filter) = node.downcast_ref::<FilterExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(predicate) = rewrite(filter) else {
            return Ok(Transformed::no(node));
        };
        let rebuilt = FilterExecBuilder::from(filter)
            .with_predicate(predicate)
            .build()?;
        Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// `predicate` with its conjuncts cheapest first; None where that is the
/// order they have.
pub fn ordered(
    predicate: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
) -> Option<Arc<dyn PhysicalExpr>> {
    let conjuncts = split_conjunction(predicate);
    if conjuncts.len() < 2 {
        return None;
    }
    let mut costed: Vec<(u32, &Arc<dyn PhysicalExpr>)> = conjuncts
        .into_iter()
        .map(|c| (cost(c, schema).unwrap_or(u32::MAX), c))
        .collect();
    if costed.is_sorted_by_key(|(cost, _)| *cost) {
        return None;
    }
    costed.sort_by_key(|(cost, _)| *cost);
    Some(conjunction(costed.into_iter().map(|(_, c)| Arc::clone(c))))
}

/// What evaluating `expr` costs, in comparisons of numbers; None where it
/// may fail (or is not known not to).
fn cost(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<u32> {
    if expr.downcast_ref::<Column>().is_some() || expr.downcast_ref::<Literal>().is_some() {
        return Some(0);
    }
    let string = |e: &Arc<dyn PhysicalExpr>| {
        e.data_type(schema).is_ok_and(|t| {
            matches!(
                t,
                DataType::Utf8
                    | DataType::Utf8View
                    | DataType::LargeUtf8
                    | DataType::Binary
                    | DataType::BinaryView
                    | DataType::LargeBinary
                    | DataType::Dictionary(..)
            )
        })
    };
    let compare = |e: &Arc<dyn PhysicalExpr>| if string(e) { STRING_COST } else { 1 };
    if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
        let operands = cost(binary.left(), schema)? + cost(binary.right(), schema)?;
        return match binary.op() {
            Operator::And | Operator::Or => Some(operands),
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom => Some(operands + compare(binary.left())),
            _ => None,
        };
    }
    if let Some(in_list) = expr.downcast_ref::<InListExpr>() {
        if !in_list
            .list()
            .iter()
            .all(|e| e.downcast_ref::<Literal>().is_some())
        {
            return None;
        }
        // A set lookup: a hash and a comparison.
        return Some(cost(in_list.expr(), schema)? + 2 * compare(in_list.expr()));
    }
    if let Some(like) = expr.downcast_ref::<LikeExpr>() {
        return Some(cost(like.expr(), schema)? + cost(like.pattern(), schema)? + LIKE_COST);
    }
    if let Some(not) = expr.downcast_ref::<NotExpr>() {
        return cost(not.arg(), schema);
    }
    if let Some(is_null) = expr.downcast_ref::<IsNullExpr>() {
        return Some(cost(is_null.arg(), schema)? + 1);
    }
    if let Some(is_not_null) = expr.downcast_ref::<IsNotNullExpr>() {
        return Some(cost(is_not_null.arg(), schema)? + 1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{col, lit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("mode", DataType::Utf8View, true),
            Field::new("day", DataType::Int32, true),
            Field::new("x", DataType::Int64, true),
        ])
    }

    fn binary(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }

    #[test]
    fn numbers_go_before_strings_and_what_may_fail_stays_behind() {
        let s = schema();
        let mode = binary(col("mode", &s).unwrap(), Operator::Eq, lit("MAIL"));
        let day = binary(col("day", &s).unwrap(), Operator::GtEq, lit(5i32));
        let division = binary(
            binary(lit(10i64), Operator::Divide, col("x", &s).unwrap()),
            Operator::Gt,
            lit(1i64),
        );
        let nonzero = binary(col("x", &s).unwrap(), Operator::NotEq, lit(0i64));
        // mode AND division AND nonzero AND day
        let predicate = conjunction([
            Arc::clone(&mode),
            Arc::clone(&division),
            Arc::clone(&nonzero),
            Arc::clone(&day),
        ]);
        let ordered = ordered(&predicate, &s).expect("reordered");
        let order: Vec<String> = split_conjunction(&ordered)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            order,
            [
                nonzero.to_string(),
                day.to_string(),
                mode.to_string(),
                division.to_string()
            ]
        );
        // Already cheapest first: left alone.
        assert!(super::ordered(&ordered, &s).is_none());
    }

    #[test]
    fn filters_get_a_conjunction_unless_switched_off() {
        use datafusion::physical_plan::empty::EmptyExec;
        let s = Arc::new(schema());
        let day = binary(col("day", &s).unwrap(), Operator::GtEq, lit(5i32));
        let x = binary(col("x", &s).unwrap(), Operator::NotEq, lit(0i64));
        let filter = |predicate| -> Arc<dyn ExecutionPlan> {
            Arc::new(
                FilterExec::try_new(predicate, Arc::new(EmptyExec::new(Arc::clone(&s)))).unwrap(),
            )
        };
        let predicate_of = |plan: &Arc<dyn ExecutionPlan>| {
            Arc::clone(plan.downcast_ref::<FilterExec>().unwrap().predicate())
        };
        let mut config = ConfigOptions::new();
        config.extensions.insert(JitOptions::default());
        let two = filter(conjunction([Arc::clone(&day), Arc::clone(&x)]));
        let planned = SelectiveConjuncts
            .optimize(Arc::clone(&two), &config)
            .unwrap();
        let predicate = predicate_of(&planned);
        let conjunction = predicate
            .downcast_ref::<Conjunction>()
            .expect("a Conjunction");
        assert_eq!(conjunction.conjuncts().len(), 2);
        assert_eq!(predicate.to_string(), predicate_of(&two).to_string());
        // One conjunct: nothing to select by.
        let one = SelectiveConjuncts
            .optimize(filter(Arc::clone(&day)), &config)
            .unwrap();
        assert!(predicate_of(&one).downcast_ref::<Conjunction>().is_none());
        // Switched off.
        config
            .extensions
            .get_mut::<JitOptions>()
            .unwrap()
            .selective_conjuncts = false;
        let off = SelectiveConjuncts.optimize(two, &config).unwrap();
        assert!(predicate_of(&off).downcast_ref::<Conjunction>().is_none());
    }
}
