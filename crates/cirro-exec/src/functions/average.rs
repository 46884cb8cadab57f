//! `avg` with PostgreSQL's decimals: the average of a NUMERIC of few
//! decimals has up to 16 (`avg` of 1.00, 2.00, 2.00 is 1.6666666666666667,
//! where DataFusion's adds 4 to the input's scale: 1.666666).
//!
//! The `avg` of DataFusion scales its decimal result from the sum's scale
//! only when it divides, so the wider result needs no wider input: this
//! function is DataFusion's `avg` with a wider return type for DECIMAL
//! input, and it replaces `avg` in Cirro's sessions. Before it, the
//! `pg_operators` rule cast the argument to DECIMAL(38, 11) instead, which
//! multiplied every row by 10⁹ before summing (an eighth of TPC-H Q1's
//! time). The sums and the overflow bound are the same: the sum times
//! 10^(result scale − input scale) must fit 38 digits either way.
//!
//! The average itself is PostgreSQL's: the sum divided by the count at
//! `select_div_scale`, rounded half away from zero (`avg` of a BIGINT
//! column summing to 9223372027854775904 over 5 rows is
//! 1844674405570955181; DataFusion's truncates at its type's 8 decimals,
//! 1844674405570955180.8).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Decimal128Array};
use arrow::datatypes::{DataType, Decimal128Type, Decimal256Type, FieldRef, UInt64Type, i256};
use cirro_common::{CirroError, SqlState};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::average::Avg;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator,
    ReversedUDAF, Signature,
};

use datafusion::physical_expr::expressions::CastExpr;

use super::numeric::pg_divide;

/// The scale averages are computed at before DataFusion's 4 more: PostgreSQL
/// gives 16 decimals, fewer where the integer digits would pass
/// [`AVERAGE_DIGITS_MAX`].
const AVG_SCALE: i16 = 12;

/// The digits of an average's type: 28, the NUMERIC digits the wire held
/// when averages got their types (rust_decimal's); kept since, so that the
/// sums (and TPC-H's answers and speed) stay. Each average is rounded
/// where PostgreSQL rounds it ([`RoundedAverage`]).
const AVERAGE_DIGITS_MAX: i16 = 28;

/// The scale an average of values with `digits` integer digits and `scale`
/// decimals is summed at (its result has 4 more), or None where the input's
/// own scale is as wide.
pub fn summed_scale(digits: i16, scale: i16) -> Option<i8> {
    let wanted = AVG_SCALE.min(AVERAGE_DIGITS_MAX - 4 - digits);
    (scale < wanted).then_some(wanted as i8)
}

/// The `avg` UDAF of Cirro's sessions.
pub fn avg_udaf() -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::new_from_impl(PgAvg::default()))
}

/// DataFusion's `avg` returning [`summed_scale`] + 4 decimals for a
/// DECIMAL; everything else is DataFusion's.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct PgAvg {
    inner: Avg,
}

impl AggregateUDFImpl for PgAvg {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if let [DataType::Decimal128(precision, scale)] = arg_types
            && let Some(summed) =
                summed_scale(i16::from(*precision) - i16::from(*scale), i16::from(*scale))
        {
            // DataFusion's average of a DECIMAL(38, summed).
            return self.inner.return_type(&[DataType::Decimal128(38, summed)]);
        }
        self.inner.return_type(arg_types)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        // DataFusion's accumulators take the result's type from `args`.
        let result = rounded_result(&args);
        let inner = self.inner.accumulator(args)?;
        Ok(match result {
            Some(result) => Box::new(RoundedAverage { inner, result }),
            None => inner,
        })
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        let result = rounded_result(&args);
        let inner = self.inner.create_groups_accumulator(args)?;
        Ok(match result {
            Some(result) => Box::new(RoundedGroupsAverage { inner, result }),
            None => inner,
        })
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_expr()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// A NUMERIC average's result type and the scale PostgreSQL's sum would
/// show.
#[derive(Debug, Clone, Copy)]
struct Averaged {
    precision: u8,
    scale: i8,
    /// The values' own scale: 0 for integers (which the plan widens to a
    /// NUMERIC of more decimals before they are averaged), else the input's.
    dscale: i8,
}

/// How a NUMERIC average's result is made, None for other averages.
fn rounded_result(args: &AccumulatorArgs) -> Option<Averaged> {
    let (DataType::Decimal128(precision, scale), [input]) =
        (args.return_field.data_type(), args.exprs)
    else {
        return None;
    };
    if args.is_distinct {
        return None;
    }
    let dscale = match input.data_type(args.schema).ok()? {
        DataType::Decimal128(_, s) => {
            let widened_integer = input
                .downcast_ref::<CastExpr>()
                .and_then(|cast| cast.expr().data_type(args.schema).ok())
                .is_some_and(|t| t.is_integer());
            if widened_integer { 0 } else { s }
        }
        _ => 0,
    };
    Some(Averaged {
        precision: *precision,
        scale: *scale,
        dscale,
    })
}

/// The averages of DataFusion's average state (`counts`, `sums`) as
/// PostgreSQL's `numeric_avg` gives them: each sum divided by its count at
/// `select_div_scale` ([`pg_divide`]), NULL without rows.
fn averages(counts: &ArrayRef, sums: &ArrayRef, result: Averaged) -> Result<ArrayRef> {
    let counts = counts.as_primitive::<UInt64Type>();
    let (sum_scale, sum): (i8, Box<dyn Fn(usize) -> i256>) = match sums.data_type() {
        DataType::Decimal128(_, s) => {
            let a = sums.as_primitive::<Decimal128Type>();
            (*s, Box::new(move |i| i256::from_i128(a.value(i))))
        }
        DataType::Decimal256(_, s) => {
            let a = sums.as_primitive::<Decimal256Type>();
            (*s, Box::new(move |i| a.value(i)))
        }
        other => {
            return Err(
                CirroError::internal(format!("an average's sum of type {other}")).into_datafusion(),
            );
        }
    };
    let dscale = result.dscale.min(sum_scale);
    let mut out = Vec::with_capacity(counts.len());
    for i in 0..counts.len() {
        if counts.is_null(i) || sums.is_null(i) || counts.value(i) == 0 {
            out.push(None);
            continue;
        }
        let count = i256::from_i128(i128::from(counts.value(i)));
        let average =
            pg_divide(sum(i), sum_scale, dscale, count, 0, result.scale).ok_or_else(|| {
                CirroError::new(
                    SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                    "numeric field overflow",
                )
                .into_datafusion()
            })?;
        out.push(Some(average));
    }
    Ok(Arc::new(
        Decimal128Array::from(out).with_precision_and_scale(result.precision, result.scale)?,
    ))
}

/// DataFusion's NUMERIC average accumulator, its result from
/// [`averages`].
#[derive(Debug)]
struct RoundedAverage {
    inner: Box<dyn Accumulator>,
    result: Averaged,
}

impl Accumulator for RoundedAverage {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.update_batch(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let state = self.inner.state()?;
        let [count, sum] = state.as_slice() else {
            return Err(
                CirroError::internal("an average's state is a count and a sum").into_datafusion(),
            );
        };
        let out = averages(&count.to_array()?, &sum.to_array()?, self.result)?;
        ScalarValue::try_from_array(&out, 0)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.inner.merge_batch(states)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.retract_batch(values)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }
}

/// DataFusion's NUMERIC average groups accumulator, its results from
/// [`averages`].
struct RoundedGroupsAverage {
    inner: Box<dyn GroupsAccumulator>,
    result: Averaged,
}

impl GroupsAccumulator for RoundedGroupsAverage {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner
            .update_batch(values, group_indices, opt_filter, total_num_groups)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let state = self.inner.state(emit_to)?;
        let [counts, sums] = state.as_slice() else {
            return Err(
                CirroError::internal("an average's state is counts and sums").into_datafusion(),
            );
        };
        averages(counts, sums, self.result)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.inner.state(emit_to)
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner
            .merge_batch(values, group_indices, total_num_groups)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        self.inner.convert_to_state(values, opt_filter)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray, Decimal128Array};
    use arrow::datatypes::{Decimal128Type, Field, Schema};
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;

    #[test]
    fn decimals_get_postgresql_scale() {
        let avg = PgAvg::default();
        // DECIMAL(15,2): 13 integer digits leave 11 decimals, 15 returned.
        assert_eq!(
            avg.return_type(&[DataType::Decimal128(15, 2)]).unwrap(),
            DataType::Decimal128(38, 15)
        );
        // Already as many decimals: DataFusion's +4.
        assert_eq!(
            avg.return_type(&[DataType::Decimal128(20, 12)]).unwrap(),
            DataType::Decimal128(24, 16)
        );
        assert_eq!(
            avg.return_type(&[DataType::Float64]).unwrap(),
            DataType::Float64
        );
    }

    /// The average over the input as written equals the average over the
    /// input cast to the wider scale (what the plan computed before).
    #[test]
    fn same_answers_as_averaging_the_cast_input() {
        let values = Decimal128Array::from(vec![Some(100), Some(200), None, Some(200), Some(-7)])
            .with_precision_and_scale(15, 2)
            .unwrap();
        let wide = arrow::compute::cast(&values, &DataType::Decimal128(38, 11)).unwrap();
        let run = |function: Arc<AggregateUDF>, array: arrow::array::ArrayRef| {
            let schema = Schema::new(vec![Field::new("x", array.data_type().clone(), true)]);
            let expr = AggregateExprBuilder::new(function, vec![col("x", &schema).unwrap()])
                .schema(Arc::new(schema))
                .alias("a")
                .build()
                .unwrap();
            let mut acc = expr.create_accumulator().unwrap();
            acc.update_batch(&[array]).unwrap();
            (expr.field().data_type().clone(), acc.evaluate().unwrap())
        };
        let (ours_type, ours) = run(avg_udaf(), Arc::new(values));
        let datafusion = datafusion::functions_aggregate::average::avg_udaf();
        let (theirs_type, theirs) = run(datafusion, wide);
        assert_eq!(ours_type, DataType::Decimal128(38, 15));
        assert_eq!(ours_type, theirs_type);
        assert_eq!(ours, theirs);
        // (1 + 2 + 2 - 0.07) / 4 = 1.2325
        let array = ours.to_array().unwrap();
        let value = array.as_primitive::<Decimal128Type>().value(0);
        assert_eq!(value, 1_232_500_000_000_000);
        assert!(!array.is_null(0));
    }

    /// The average is rounded where PostgreSQL rounds it, not truncated at
    /// the type's scale: a BIGINT column summing to 9223372027854775904
    /// over 5 rows (cast to DECIMAL(38,4) by the plan) averages to
    /// 1844674405570955181.
    #[test]
    fn averages_round_as_postgresql_divides() {
        use arrow::array::Int64Array;
        let values = Int64Array::from(vec![9_223_372_036_854_775_807, 100, -9_000_000_000, 0, -3]);
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, true)]);
        let widened = Arc::new(CastExpr::new(
            col("x", &schema).unwrap(),
            DataType::Decimal128(38, 4),
            None,
        ));
        let expr = AggregateExprBuilder::new(avg_udaf(), vec![widened])
            .schema(Arc::new(schema))
            .alias("a")
            .build()
            .unwrap();
        let DataType::Decimal128(_, scale) = *expr.field().data_type() else {
            panic!("not a decimal: {}", expr.field().data_type());
        };
        let expected = 1_844_674_405_570_955_181i128 * 10i128.pow(scale as u32);
        let wide = arrow::compute::cast(&values, &DataType::Decimal128(38, 4)).unwrap();
        let mut acc = expr.create_accumulator().unwrap();
        acc.update_batch(&[Arc::clone(&wide)]).unwrap();
        let one = acc.evaluate().unwrap().to_array().unwrap();
        assert_eq!(one.as_primitive::<Decimal128Type>().value(0), expected);
        // The groups accumulator too: two groups, the second empty.
        let mut groups = expr.create_groups_accumulator().unwrap();
        groups
            .update_batch(&[wide], &[0, 0, 0, 0, 0], None, 2)
            .unwrap();
        let all = groups.evaluate(EmitTo::All).unwrap();
        let all = all.as_primitive::<Decimal128Type>();
        assert_eq!(all.value(0), expected);
        assert!(all.is_null(1));
    }
}
