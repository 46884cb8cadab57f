//! Cirro's own scalar functions that planning rules put into plans.

pub mod average;
pub mod checked;
pub mod guard;
pub mod numeric;
pub mod pg_datetime;
pub mod sized;
pub mod slot;

/// Cirro's functions that planning rules put into plans, which every node
/// of a cluster registers so that plans with them run on any node.
pub fn portable_udfs() -> Vec<std::sync::Arc<datafusion::logical_expr::ScalarUDF>> {
    vec![
        checked::checked_udf(checked::CheckedOp::Add),
        checked::checked_udf(checked::CheckedOp::Subtract),
        checked::checked_udf(checked::CheckedOp::Multiply),
        checked::checked_udf(checked::CheckedOp::Negate),
        guard::guard_udf(),
        numeric::numeric_divide_udf(),
        numeric::float_divide_udf(),
        numeric::round_to_integer_udf(),
        std::sync::Arc::new(pg_datetime::to_char_udf()),
        std::sync::Arc::new(pg_datetime::to_date_udf()),
        std::sync::Arc::new(pg_datetime::to_timestamp_udf()),
        crate::rules::segment_udf(),
        slot::hash_slot_udf(),
    ]
}

/// Cirro's aggregate functions, which replace DataFusion's of the same name
/// in every session (and every node's).
pub fn portable_udafs() -> Vec<std::sync::Arc<datafusion::logical_expr::AggregateUDF>> {
    vec![average::avg_udaf()]
}

/// `functions` with Cirro's aggregate functions in place of DataFusion's of
/// the same names.
pub fn replace_udafs(functions: &mut Vec<std::sync::Arc<datafusion::logical_expr::AggregateUDF>>) {
    let ours = portable_udafs();
    functions.retain(|f| ours.iter().all(|o| o.name() != f.name()));
    functions.extend(ours);
}
