//! Arithmetic as PostgreSQL does it: integer `+ - *` and negation fail with
//! 22003 on overflow (through the functions of `functions/checked.rs`), and
//! sums and averages widen ([`PgOperators`], before type coercion): `sum` of
//! a BIGINT is NUMERIC (DECIMAL(38,0)) where DataFusion's wraps, `avg` of an
//! integer is NUMERIC where DataFusion's is a float. (`sum` of SMALLINT/INTEGER is BIGINT in both.) NUMERIC division
//! and casts of floats and NUMERICs to integers round as PostgreSQL's do,
//! and float division by zero is 22012 (`functions/numeric.rs`).
//!
//! Runs after type coercion, so both operands of an operator have one type.
//! It walks top-down: the type of an operand is then asked of the original,
//! coerced subtree, whose chain segments (`chains.rs`) keep that walk short.

use arrow::datatypes::{DECIMAL128_MAX_PRECISION, DataType};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{Cast, ScalarFunction};
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

use crate::functions::average::summed_scale;
use crate::functions::checked::{CheckedOp, checked_udf};
use crate::functions::numeric::{
    float_divide_udf, literal_quotient_scale, numeric_divide_udf, round_to_integer_udf,
};

/// The NUMERIC an integer divided with a NUMERIC is read as.
const INTEGER_AS_DECIMAL: DataType = DataType::Decimal128(20, 0);

/// NUMERIC for sums of integers.
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
        Expr::BinaryExpr(b) => CheckedOp::of(b.op).is_some() || b.op == Operator::Divide,
        Expr::Negative(_) => true,
        Expr::Cast(Cast { field, .. }) => field.data_type().is_integer(),
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

fn check_expr(node: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match node {
        Expr::Cast(Cast { expr, field }) if field.data_type().is_integer() => {
            let rounds = matches!(
                expr.get_type(schema),
                Ok(DataType::Float32 | DataType::Float64 | DataType::Decimal128(..))
            );
            let expr = if rounds {
                Box::new(Expr::ScalarFunction(ScalarFunction::new_udf(
                    round_to_integer_udf(),
                    vec![*expr],
                )))
            } else {
                expr
            };
            Ok(Transformed::new_transformed(
                Expr::Cast(Cast { expr, field }),
                rounds,
            ))
        }
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Divide,
            right,
        }) if matches!(
            (left.get_type(schema), right.get_type(schema)),
            (Ok(l), Ok(r)) if matches!(l, DataType::Float32 | DataType::Float64) && l == r
        ) =>
        {
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(float_divide_udf(), vec![*left, *right]),
            )))
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let Some(checked) = CheckedOp::of(op) else {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr {
                    left,
                    op,
                    right,
                })));
            };
            // Floats too: their overflow is 22003 as well
            // (`functions/checked.rs`).
            let checked_type = matches!(
                (left.get_type(schema), right.get_type(schema)),
                (Ok(l), Ok(r)) if (is_integer(&l) || l.is_floating()) && l == r
            );
            if !checked_type {
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
        other => Ok(Transformed::no(other)),
    }
}

/// Operators typed as PostgreSQL types them, before type coercion (so that
/// what is built on them, a UNION's column, a sum, gets their real type):
/// NUMERIC division (`functions/numeric.rs`; a NUMERIC divided by an
/// integer or the other way round counts, with a float it stays a float),
/// and `date - date`, an integer count of days (DataFusion's is a duration,
/// which nothing else accepts: `(d1 - d2) < 3` failed).
#[derive(Debug, Default)]
pub struct PgOperators;

impl AnalyzerRule for PgOperators {
    fn name(&self) -> &str {
        "cirro_pg_operators"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let divides = |e: &Expr| match e {
                Expr::BinaryExpr(b) => is_arithmetic(b.op) || is_comparison(b.op),
                Expr::ScalarFunction(f) => {
                    DOUBLE_ONLY.contains(&f.func.name()) || matches!(f.func.name(), "round")
                }
                Expr::AggregateFunction(a) => matches!(a.func.name(), "avg" | "sum"),
                _ => false,
            };
            super::rewrite_expressions(plan, divides, |expr, schema| {
                expr.transform_up(|node| divide_expr(node, schema))
            })?
            .map_data(|plan| plan.recompute_schema())
        })
        .map(|transformed| transformed.data)
    }
}

/// A NUMERIC or integer literal's (value, scale).
fn literal_decimal(e: &Expr) -> Option<(i128, i8)> {
    match e {
        Expr::Literal(ScalarValue::Decimal128(Some(v), _, s), _) => Some((*v, *s)),
        Expr::Literal(v, _) if v.data_type().is_integer() => {
            let v = v.cast_to(&DataType::Int64).ok()?;
            match v {
                ScalarValue::Int64(Some(v)) => Some((i128::from(v), 0)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `operand` as a NUMERIC for division, or None if it is neither a NUMERIC
/// nor an integer.
fn as_numeric(operand: Expr, data_type: &DataType) -> Option<Expr> {
    match data_type {
        DataType::Decimal128(..) => Some(operand),
        t if is_integer(t) => Some(Expr::Cast(Cast::new(Box::new(operand), INTEGER_AS_DECIMAL))),
        _ => None,
    }
}

/// Functions PostgreSQL has for `double precision` (and NUMERIC) but not
/// `real`: a real argument is widened first, so `cbrt(real)` is a double
/// as in PostgreSQL, not a real.
const DOUBLE_ONLY: &[&str] = &[
    "sqrt", "cbrt", "exp", "ln", "log", "log10", "log2", "power", "pow", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "degrees",
    "radians", "ceil", "ceiling", "floor", "round", "trunc", "sign", "signum",
];

/// `+ - * / %`.
fn is_arithmetic(op: Operator) -> bool {
    op.is_numerical_operators()
}

/// `= <> < <= > >=`, `IS [NOT] DISTINCT FROM` (and the regex matches, which
/// take no numbers).
fn is_comparison(op: Operator) -> bool {
    op.supports_propagation()
}

/// Whether `l op r` is computed in double precision in PostgreSQL where
/// DataFusion would not: a `real` with an integer or a NUMERIC (operator
/// resolution prefers float8, the numeric category's preferred type:
/// `real * numeric`, `real / int` are doubles), and a NUMERIC compared with
/// a float (DataFusion compares as a NUMERIC, which fails for `1e300`).
fn in_double(op: Operator, l: &DataType, r: &DataType) -> bool {
    let exact = |t: &DataType| t.is_integer() || matches!(t, DataType::Decimal128(..));
    let real_and_exact =
        (*l == DataType::Float32 && exact(r)) || (exact(l) && *r == DataType::Float32);
    let numeric_and_float = (matches!(l, DataType::Decimal128(..)) && r.is_floating())
        || (l.is_floating() && matches!(r, DataType::Decimal128(..)));
    real_and_exact || (is_comparison(op) && numeric_and_float)
}

fn as_double(e: &Expr, t: &DataType) -> Expr {
    if *t == DataType::Float64 {
        e.clone()
    } else {
        Expr::Cast(Cast::new(Box::new(e.clone()), DataType::Float64))
    }
}

/// `e` as an INTEGER literal if it is a BIGINT literal that fits 32 bits
/// and `other`, the operand beside it, is an INTEGER or a SMALLINT.
fn narrowed_literal(e: &Expr, other: &DataType) -> Option<Expr> {
    match e {
        Expr::Literal(ScalarValue::Int64(Some(v)), meta)
            if matches!(other, DataType::Int32 | DataType::Int16) =>
        {
            i32::try_from(*v)
                .ok()
                .map(|v| Expr::Literal(ScalarValue::Int32(Some(v)), meta.clone()))
        }
        _ => None,
    }
}

fn divide_expr(node: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    // An integer literal beside an INTEGER (or a SMALLINT) in arithmetic is
    // an INTEGER, as PostgreSQL types a literal that fits 32 bits: `i4 + 7`
    // overflows past 2147483647 there (22003, through the checked
    // operators); DataFusion's literal is a BIGINT, which widened the sum.
    if let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &node
        && op.is_numerical_operators()
        && let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema))
    {
        if let Some(narrow) = narrowed_literal(left, &r) {
            return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                Box::new(narrow),
                *op,
                right.clone(),
            ))));
        }
        if let Some(narrow) = narrowed_literal(right, &l) {
            return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                left.clone(),
                *op,
                Box::new(narrow),
            ))));
        }
    }
    if let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &node
        && (is_arithmetic(*op) || is_comparison(*op))
        && let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema))
        && in_double(*op, &l, &r)
    {
        return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
            Box::new(as_double(left, &l)),
            *op,
            Box::new(as_double(right, &r)),
        ))));
    }
    // `avg` of an integer is a NUMERIC summed at PostgreSQL's decimals
    // (`functions/average.rs`, whose `avg` gives a NUMERIC's average those
    // decimals itself); `sum` of a BIGINT is NUMERIC. Before type coercion,
    // so that what compares with an average (TPC-H Q22's `c_acctbal >
    // (SELECT avg(c_acctbal) …)`) is coerced to its real type.
    if let Expr::AggregateFunction(mut aggregate) = node {
        let wide = match (aggregate.func.name(), aggregate.params.args.as_slice()) {
            ("avg", [arg]) => {
                let digits = match arg.get_type(schema) {
                    Ok(DataType::Int8 | DataType::Int16 | DataType::UInt8) => Some(5),
                    Ok(DataType::Int32 | DataType::UInt16) => Some(10),
                    Ok(t) if is_integer(&t) => Some(20),
                    _ => None,
                };
                digits
                    .and_then(|digits| summed_scale(digits, 0))
                    .map(|scale| DataType::Decimal128(38, scale))
            }
            // `sum` of a BIGINT is NUMERIC. Before type coercion too, so
            // that what is built on the sum (`sum(b) > 0`, `coalesce(sum(b),
            // 0)`) is coerced to NUMERIC: widened after it, such expressions
            // failed ("Invalid comparison operation: Decimal128(38, 0) >
            // Int64").
            ("sum", [arg]) => match arg.get_type(schema) {
                Ok(DataType::Int64 | DataType::UInt64) => Some(WIDE_DECIMAL),
                _ => None,
            },
            _ => None,
        };
        let changed = wide.is_some();
        if let Some(wide) = wide {
            let arg = aggregate.params.args.remove(0);
            aggregate
                .params
                .args
                .push(Expr::Cast(Cast::new(Box::new(arg), wide)));
        }
        return Ok(Transformed::new_transformed(
            Expr::AggregateFunction(aggregate),
            changed,
        ));
    }
    // DataFusion 55's `round(numeric, places)` takes its result's scale from
    // `places` only while that is a literal; type coercion wraps an INT8
    // literal in a cast to INT4, and the type declared before and the one
    // computed after differ (`round(n, 1) >= n`: "Invalid comparison
    // operation: Decimal128(12, 1) >= Decimal128(13, 2)"). An INT4 literal
    // needs no cast.
    if let Expr::ScalarFunction(mut f) = node {
        let mut changed = false;
        if DOUBLE_ONLY.contains(&f.func.name()) {
            for arg in f.args.iter_mut() {
                if arg.get_type(schema).ok() == Some(DataType::Float32) {
                    *arg = as_double(arg, &DataType::Float32);
                    changed = true;
                }
            }
        }
        // `ceil`/`floor` of a NUMERIC may need one more integer digit than
        // it has (`ceil(0.07)` of NUMERIC(2,2) is 1); DataFusion keeps the
        // argument's type and failed with 22003.
        if matches!(f.func.name(), "ceil" | "ceiling" | "floor")
            && let [arg] = f.args.as_mut_slice()
            && let Ok(DataType::Decimal128(p, s)) = arg.get_type(schema)
            && s > 0
            && p < DECIMAL128_MAX_PRECISION
        {
            *arg = Expr::Cast(Cast::new(
                Box::new(arg.clone()),
                DataType::Decimal128(p + 1, s),
            ));
            changed = true;
        }
        let narrowed = match f.args.get(1) {
            Some(Expr::Literal(ScalarValue::Int64(Some(places)), meta))
                if f.func.name() == "round" =>
            {
                i32::try_from(*places)
                    .ok()
                    .map(|p| Expr::Literal(ScalarValue::Int32(Some(p)), meta.clone()))
            }
            _ => None,
        };
        let changed = changed || narrowed.is_some();
        if let Some(places) = narrowed {
            f.args[1] = places;
        }
        return Ok(Transformed::new_transformed(
            Expr::ScalarFunction(f),
            changed,
        ));
    }
    if let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Minus,
        right,
    }) = &node
        && matches!(
            (left.get_type(schema), right.get_type(schema)),
            (Ok(DataType::Date32), Ok(DataType::Date32))
        )
    {
        let days = |e: &Expr| Expr::Cast(Cast::new(Box::new(e.clone()), DataType::Int32));
        return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
            Box::new(days(left)),
            Operator::Minus,
            Box::new(days(right)),
        ))));
    }
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Divide,
        right,
    }) = node
    else {
        return Ok(Transformed::no(node));
    };
    let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema)) else {
        return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
            left,
            Operator::Divide,
            right,
        ))));
    };
    let decimal = |t: &DataType| matches!(t, DataType::Decimal128(..));
    if !(decimal(&l) || decimal(&r)) {
        return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
            left,
            Operator::Divide,
            right,
        ))));
    }
    match (
        as_numeric((*left).clone(), &l),
        as_numeric((*right).clone(), &r),
    ) {
        (Some(l_num), Some(r_num)) => {
            // Two literals: the quotient's scale is PostgreSQL's for them.
            let mut args = vec![l_num, r_num];
            if let (Some(lv), Some(rv)) = (literal_decimal(&left), literal_decimal(&right))
                && let Some(scale) = literal_quotient_scale(lv, rv)
            {
                args.push(Expr::Literal(
                    ScalarValue::Int64(Some(i64::from(scale))),
                    None,
                ));
            }
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(numeric_divide_udf(), args),
            )))
        }
        _ => Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
            left,
            Operator::Divide,
            right,
        )))),
    }
}
