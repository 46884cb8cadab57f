//! Arithmetic as PostgreSQL does it: integer `+ - *` and negation fail with
//! 22003 on overflow (through the functions of `functions/checked.rs`), and
//! sums and averages widen: `sum` of a BIGINT is NUMERIC (DECIMAL(38,0)) where
//! DataFusion's wraps, `avg` of an integer is NUMERIC where DataFusion's is a
//! float. (`sum` of SMALLINT/INTEGER is BIGINT in both.)
//!
//! Runs after type coercion, so both operands of an operator have one type.
//! It walks top-down: the type of an operand is then asked of the original,
//! coerced subtree, whose chain segments (`chains.rs`) keep that walk short.

use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{AggregateFunction, Cast, ScalarFunction};
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::functions::checked::{CheckedOp, checked_udf};

/// NUMERIC for sums and averages of integers.
const WIDE_DECIMAL: DataType = DataType::Decimal128(38, 0);

#[derive(Debug, Default)]
pub struct CheckedArithmetic;

impl AnalyzerRule for CheckedArithmetic {
    fn name(&self) -> &str {
        "cirro_checked_arithmetic"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(check_plan)
            .map(|transformed| transformed.data)
    }
}

fn candidate(expr: &Expr) -> bool {
    match expr {
        Expr::BinaryExpr(b) => CheckedOp::of(b.op).is_some(),
        Expr::Negative(_) => true,
        Expr::AggregateFunction(a) => matches!(a.func.name(), "sum" | "avg"),
        _ => false,
    }
}

fn check_plan(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    // Every plan's schema is recomputed: one above a changed one gets its
    // input's new types.
    super::rewrite_expressions(plan, candidate, |expr, schema| {
        expr.transform_down(|node| check_expr(node, schema))
    })?
    .map_data(|plan| plan.recompute_schema())
}

fn is_integer(data_type: &DataType) -> bool {
    data_type.is_integer()
}

/// What a coercion cast was put around.
fn uncast(expr: &Expr) -> &Expr {
    match expr {
        Expr::Cast(Cast { expr, .. }) => expr,
        other => other,
    }
}

fn check_expr(node: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match node {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let Some(checked) = CheckedOp::of(op) else {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr {
                    left,
                    op,
                    right,
                })));
            };
            let integers = matches!(
                (left.get_type(schema), right.get_type(schema)),
                (Ok(l), Ok(r)) if is_integer(&l) && l == r
            );
            if !integers {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr {
                    left,
                    op,
                    right,
                })));
            }
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(checked_udf(checked), vec![*left, *right]),
            )))
        }
        Expr::Negative(inner) => match inner.get_type(schema) {
            Ok(t) if is_integer(&t) => Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(checked_udf(CheckedOp::Negate), vec![*inner]),
            ))),
            _ => Ok(Transformed::no(Expr::Negative(inner))),
        },
        Expr::AggregateFunction(mut aggregate) => {
            // Type coercion has cast the argument to what DataFusion's
            // function takes (`avg`: a float, `sum`: BIGINT): look at the
            // type the user's expression had.
            let widen = match (aggregate.func.name(), aggregate.params.args.as_slice()) {
                ("sum", [arg]) => matches!(
                    uncast(arg).get_type(schema),
                    Ok(DataType::Int64 | DataType::UInt64)
                ),
                ("avg", [arg]) => {
                    matches!(uncast(arg).get_type(schema), Ok(t) if is_integer(&t))
                }
                _ => false,
            };
            if !widen {
                return Ok(Transformed::no(Expr::AggregateFunction(aggregate)));
            }
            let AggregateFunction { params, .. } = &mut aggregate;
            let arg = match params.args.remove(0) {
                Expr::Cast(Cast { expr, .. }) => *expr,
                other => other,
            };
            params
                .args
                .push(Expr::Cast(Cast::new(Box::new(arg), WIDE_DECIMAL)));
            Ok(Transformed::yes(Expr::AggregateFunction(aggregate)))
        }
        other => Ok(Transformed::no(other)),
    }
}
