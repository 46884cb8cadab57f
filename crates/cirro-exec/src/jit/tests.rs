//! Every compiled expression against its interpreted twin on random batches:
//! NULLs, sliced arrays, lengths around the 64-row words, empty batches,
//! values that overflow.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int16Array,
    Int32Array, Int64Array,
};
use arrow::compute::prep_null_mask_filter;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{JitExpr, Kernels};
use crate::functions::checked::{CheckedOp, checked_udf};

type Expr = Arc<dyn PhysicalExpr>;

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int32, true),
        Field::new("c", DataType::Int64, true),
        Field::new("price", DataType::Decimal128(15, 2), true),
        Field::new("disc", DataType::Decimal128(15, 2), true),
        Field::new("rate", DataType::Decimal128(12, 4), true),
        Field::new("f", DataType::Float64, true),
        Field::new("day", DataType::Date32, true),
        Field::new("h", DataType::Int16, true),
    ])
}

/// `rows` random rows; a fraction `nulls` of each column NULL; `big` puts
/// values that overflow 32-bit sums and 64-bit decimal factors in.
fn batch(rng: &mut StdRng, rows: usize, nulls: f64, big: bool) -> RecordBatch {
    let null = |rng: &mut StdRng| rng.random_bool(nulls);
    let a: Int32Array = (0..rows)
        .map(|_| {
            (!null(rng)).then(|| {
                if big && rng.random_bool(0.01) {
                    i32::MAX - rng.random_range(0..10)
                } else {
                    rng.random_range(-1000..1000)
                }
            })
        })
        .collect();
    let b: Int32Array = (0..rows)
        .map(|_| (!null(rng)).then(|| rng.random_range(-50..50)))
        .collect();
    let c: Int64Array = (0..rows)
        .map(|_| (!null(rng)).then(|| rng.random_range(-1_000_000..1_000_000)))
        .collect();
    let decimal = |rng: &mut StdRng, range: std::ops::Range<i128>, p: u8, s: i8| {
        (0..rows)
            .map(|_| {
                (!rng.random_bool(nulls)).then(|| {
                    if big && rng.random_bool(0.01) {
                        i64::MAX as i128 * 1000
                    } else {
                        rng.random_range(range.clone())
                    }
                })
            })
            .collect::<Decimal128Array>()
            .with_precision_and_scale(p, s)
            .unwrap()
    };
    let price = decimal(rng, 90_000..10_500_000, 15, 2);
    let disc = decimal(rng, 0..11, 15, 2);
    let rate = decimal(rng, -20_000..20_000, 12, 4);
    let f: Float64Array = (0..rows)
        .map(|_| (!null(rng)).then(|| rng.random_range(-1e6..1e6)))
        .collect();
    let day: Date32Array = (0..rows)
        .map(|_| (!null(rng)).then(|| rng.random_range(8000..10600)))
        .collect();
    let h: Int16Array = (0..rows)
        .map(|_| (!null(rng)).then(|| rng.random_range(-300..300)))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(a),
        Arc::new(b),
        Arc::new(c),
        Arc::new(price),
        Arc::new(disc),
        Arc::new(rate),
        Arc::new(f),
        Arc::new(day),
        Arc::new(h),
    ];
    RecordBatch::try_new(Arc::new(schema()), columns).unwrap()
}

fn col(name: &str) -> Expr {
    let schema = schema();
    Arc::new(Column::new(name, schema.index_of(name).unwrap()))
}

fn lit(value: ScalarValue) -> Expr {
    Arc::new(Literal::new(value))
}

fn bin(left: Expr, op: Operator, right: Expr) -> Expr {
    Arc::new(BinaryExpr::new(left, op, right))
}

fn checked(op: CheckedOp, left: Expr, right: Expr) -> Expr {
    Arc::new(
        ScalarFunctionExpr::try_new(
            checked_udf(op),
            vec![left, right],
            &schema(),
            Arc::new(ConfigOptions::default()),
        )
        .unwrap(),
    )
}

fn dec(value: i128, scale: i8) -> Expr {
    lit(ScalarValue::Decimal128(Some(value), 15, scale))
}

/// Expressions of values (projections, aggregate arguments).
fn values() -> Vec<Expr> {
    use Operator::*;
    vec![
        // TPC-H Q1's charge: price * (1 - disc) * (1 + tax).
        bin(
            bin(col("price"), Multiply, bin(dec(100, 2), Minus, col("disc"))),
            Multiply,
            bin(dec(100, 2), Plus, col("disc")),
        ),
        // Decimals of different scales: the sum at the larger.
        bin(bin(col("price"), Plus, col("rate")), Minus, col("disc")),
        bin(col("rate"), Multiply, col("disc")),
        // PostgreSQL's integer operators: 22003 on overflow.
        checked(
            CheckedOp::Add,
            checked(CheckedOp::Multiply, col("a"), col("b")),
            col("a"),
        ),
        checked(
            CheckedOp::Subtract,
            col("c"),
            checked(
                CheckedOp::Multiply,
                col("c"),
                lit(ScalarValue::Int64(Some(3))),
            ),
        ),
        // DataFusion's own integer operators wrap.
        bin(bin(col("a"), Multiply, col("a")), Plus, col("b")),
        bin(
            col("f"),
            Multiply,
            bin(col("f"), Minus, lit(ScalarValue::Float64(Some(0.5)))),
        ),
        // Widening casts.
        checked(
            CheckedOp::Multiply,
            Arc::new(CastExpr::new(col("a"), DataType::Int64, None)),
            col("c"),
        ),
        bin(
            Arc::new(CastExpr::new(col("h"), DataType::Float64, None)),
            Plus,
            col("f"),
        ),
        checked(
            CheckedOp::Add,
            Arc::new(CastExpr::new(col("h"), DataType::Int32, None)),
            col("b"),
        ),
        // A comparison as a value: NULL where an input is NULL.
        bin(
            bin(col("a"), Plus, col("b")),
            Lt,
            lit(ScalarValue::Int32(Some(10))),
        ),
    ]
}

/// Filter predicates (AND/OR compile here only).
fn predicates() -> Vec<Expr> {
    use Operator::*;
    let day = |d| lit(ScalarValue::Date32(Some(d)));
    vec![
        // TPC-H Q6's.
        bin(
            bin(
                bin(col("day"), GtEq, day(8766)),
                And,
                bin(col("day"), Lt, day(9131)),
            ),
            And,
            bin(
                bin(
                    bin(col("disc"), GtEq, dec(5, 2)),
                    And,
                    bin(col("disc"), LtEq, dec(7, 2)),
                ),
                And,
                bin(col("b"), Lt, lit(ScalarValue::Int32(Some(24)))),
            ),
        ),
        bin(
            bin(col("a"), Eq, col("b")),
            Or,
            bin(
                bin(col("c"), NotEq, lit(ScalarValue::Int64(Some(7)))),
                And,
                bin(col("h"), Gt, lit(ScalarValue::Int16(Some(0)))),
            ),
        ),
        bin(
            checked(CheckedOp::Add, col("a"), col("b")),
            LtEq,
            lit(ScalarValue::Int32(Some(0))),
        ),
    ]
}

/// Batches of awkward shapes: empty, shorter and longer than a word, sliced.
fn batches(big: bool) -> Vec<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(18);
    let mut out = Vec::new();
    for rows in [0, 1, 63, 64, 65, 1000] {
        for nulls in [0.0, 0.2] {
            out.push(batch(&mut rng, rows, nulls, big));
        }
    }
    let long = batch(&mut rng, 3000, 0.1, big);
    out.push(long.slice(7, 2000));
    let long = batch(&mut rng, 3000, 0.0, big);
    out.push(long.slice(130, 1500));
    out
}

/// The rows a filter keeps: NULL as false.
fn kept(array: &ArrayRef) -> BooleanArray {
    let bools = array
        .as_any()
        .downcast_ref::<BooleanArray>()
        .expect("booleans");
    if bools.null_count() == 0 {
        bools.clone()
    } else {
        prep_null_mask_filter(bools)
    }
}

fn same(jit: &JitExpr, batch: &RecordBatch, filter: bool) {
    let expected = jit
        .inner()
        .evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()));
    let got = jit
        .evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()));
    match (expected, got) {
        (Ok(expected), Ok(got)) => {
            if filter {
                assert_eq!(
                    kept(&expected),
                    kept(&got),
                    "{jit} on {} rows",
                    batch.num_rows()
                );
            } else {
                assert_eq!(expected.data_type(), got.data_type(), "{jit}");
                assert_eq!(
                    expected.to_data(),
                    got.to_data(),
                    "{jit} on {} rows",
                    batch.num_rows()
                );
            }
        }
        (Err(expected), Err(got)) => assert_eq!(expected.to_string(), got.to_string()),
        (expected, got) => panic!("{jit}: interpreted {expected:?}, compiled {got:?}"),
    }
}

#[test]
fn compiled_values_equal_interpreted() {
    let schema = schema();
    for expr in values() {
        let jit = JitExpr::try_new(&expr, &schema, false, &Arc::default())
            .unwrap_or_else(|| panic!("{expr} should compile"));
        for batch in batches(false) {
            same(&jit, &batch, false);
        }
        let (compiled, interpreted) = jit.batches();
        assert!(compiled > 0, "{jit}: the kernel never ran");
        assert_eq!(interpreted, 0, "{jit}: no input overflows");
    }
}

#[test]
fn compiled_predicates_equal_interpreted() {
    let schema = schema();
    for expr in predicates() {
        let jit = JitExpr::try_new(&expr, &schema, true, &Arc::default())
            .unwrap_or_else(|| panic!("{expr} should compile"));
        for batch in batches(false) {
            same(&jit, &batch, true);
        }
        let (compiled, _) = jit.batches();
        assert!(compiled > 0, "{jit}: the kernel never ran");
    }
    // Batches with NULLs under AND/OR are interpreted; without, compiled.
    let jit = JitExpr::try_new(&predicates()[0], &schema, true, &Arc::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(6);
    same(&jit, &batch(&mut rng, 500, 0.3, false), true);
    assert_eq!(jit.batches(), (0, 1));
    same(&jit, &batch(&mut rng, 500, 0.0, false), true);
    assert_eq!(jit.batches(), (1, 1));
}

#[test]
fn overflow_gives_the_interpreted_value_or_error() {
    let schema = schema();
    let mut interpreted = 0;
    for expr in values() {
        let jit = JitExpr::try_new(&expr, &schema, false, &Arc::default()).unwrap();
        for batch in batches(true) {
            same(&jit, &batch, false);
        }
        interpreted += jit.batches().1;
    }
    assert!(interpreted > 0, "some batch must have overflowed");
    // 22003 from the checked operator, not a wrapped value.
    let sum = checked(CheckedOp::Add, col("a"), col("a"));
    let jit = JitExpr::try_new(&sum, &schema, false, &Arc::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let rows = batch(&mut rng, 2000, 0.0, true);
    let error = jit.evaluate(&rows).unwrap_err().to_string();
    assert!(error.contains("integer out of range"), "{error}");
}

#[test]
fn what_does_not_compile_is_refused() {
    use Operator::*;
    let schema = schema();
    let float_cmp = bin(col("f"), Lt, lit(ScalarValue::Float64(Some(1.0))));
    let and_in_value = bin(
        bin(col("a"), Lt, col("b")),
        And,
        bin(col("a"), Gt, col("b")),
    );
    let division = bin(col("c"), Divide, lit(ScalarValue::Int64(Some(2))));
    let null_literal = bin(col("c"), Plus, lit(ScalarValue::Int64(None)));
    let bare_column = col("c");
    for expr in [float_cmp, division, null_literal, bare_column] {
        assert!(
            JitExpr::try_new(&expr, &schema, true, &Arc::default()).is_none(),
            "{expr}"
        );
    }
    assert!(JitExpr::try_new(&and_in_value, &schema, false, &Arc::default()).is_none());
    assert!(JitExpr::try_new(&and_in_value, &schema, true, &Arc::default()).is_some());
}

#[test]
fn kernels_are_cached_by_tree_in_their_own_cache() {
    use Operator::*;
    let schema = schema();
    let expr = bin(
        bin(col("h"), Multiply, lit(ScalarValue::Int16(Some(3)))),
        Minus,
        col("h"),
    );
    let mut rng = StdRng::seed_from_u64(9);
    let rows = batch(&mut rng, 100, 0.1, false);
    let cache: Arc<Kernels> = Arc::default();
    let first = JitExpr::try_new(&expr, &schema, false, &cache).unwrap();
    first.evaluate(&rows).unwrap();
    let before = cache.stats();
    assert_eq!((before.compiled, before.cache_hits), (1, 0));
    let second = JitExpr::try_new(&expr, &schema, false, &cache).unwrap();
    second.evaluate(&rows).unwrap();
    let after = cache.stats();
    assert_eq!((after.compiled, after.cache_hits), (1, 1));
    assert!(
        second
            .to_string()
            .contains("[cached, batches=1, interpreted=0]"),
        "{second}"
    );
    // Another node's cache holds none of this one's kernels.
    let other: Arc<Kernels> = Arc::default();
    let third = JitExpr::try_new(&expr, &schema, false, &other).unwrap();
    third.evaluate(&rows).unwrap();
    assert_eq!((other.stats().compiled, other.stats().cache_hits), (1, 0));
    assert!(third.to_string().contains("[compiled,"), "{third}");
    assert_eq!(cache.stats(), after);
}
