//! Typing deep operator chains in linear time.
//!
//! DataFusion's type coercion asks every binary operator for the types of its
//! operands, and the type of an operand that is itself an operator is worked
//! out by walking its whole subtree; working out its field (`to_field`, for
//! every plan schema) also prints the name of every level below it. A chain of
//! n operators (`1+1+…`, which the statement limits allow up to
//! `EXPRESSION_CHAIN_LENGTH_MAX`) cost n²/2 steps: 21 s at n = 5,000.
//!
//! So the parser's shape pass (`cirro-sql/src/shape.rs`) wraps every
//! `CHAIN_SEGMENT_LEVELS`-th level of a long chain in `cirro_segment(…)`, the
//! identity with a short name (naming a level prints at most
//! `CHAIN_SEGMENT_LEVELS` levels; its physical function stores its type, which
//! bounds the physical planner's walks). This rule, before type coercion,
//! casts each segment to the type it has anyway, bottom-up: a cast knows its
//! type without looking below it, so every "type of this subtree" stops
//! within `CHAIN_SEGMENT_LEVELS` levels. No value changes.

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{Cast, ScalarFunction};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use cirro_common::limits::CHAIN_SEGMENT_FUNCTION as SEGMENT_FUNCTION;

#[derive(Debug, Default)]
pub struct TypeChainSegments;

impl AnalyzerRule for TypeChainSegments {
    fn name(&self) -> &str {
        "cirro_type_chain_segments"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(type_segments)
            .map(|transformed| transformed.data)
    }
}

fn is_segment(expr: &Expr) -> bool {
    matches!(expr, Expr::ScalarFunction(f) if f.func.name() == SEGMENT_FUNCTION)
}

fn type_segments(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    super::rewrite_expressions(plan, is_segment, |expr, schema| {
        expr.transform_up(|node| cast_segment(node, schema))
    })
}

/// `cirro_segment(x)` → `CAST(cirro_segment(x) AS type of x)`; the segments
/// below are cast already, so the type of `x` is found within a segment.
fn cast_segment(node: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match node {
        Expr::ScalarFunction(ScalarFunction { ref func, ref args })
            if func.name() == SEGMENT_FUNCTION && args.len() == 1 =>
        {
            match args[0].get_type(schema) {
                Ok(data_type) => Ok(Transformed::yes(Expr::Cast(Cast::new(
                    Box::new(node),
                    data_type,
                )))),
                // Not typeable (type coercion will say why): leave it.
                Err(_) => Ok(Transformed::no(node)),
            }
        }
        // A plan analyzed twice: one cast is enough.
        Expr::Cast(Cast { expr, field })
            if matches!(expr.as_ref(), Expr::Cast(inner)
                if inner.field.data_type() == field.data_type() && is_segment(&inner.expr)) =>
        {
            Ok(Transformed::yes(*expr))
        }
        other => Ok(Transformed::no(other)),
    }
}
