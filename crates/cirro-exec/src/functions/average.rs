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

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::Result;
use datafusion::functions_aggregate::average::Avg;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, ReversedUDAF,
    Signature,
};

/// The scale averages are computed at before DataFusion's 4 more: PostgreSQL
/// gives 16 decimals, fewer where the integer digits would not fit the wire's
/// 28 (see [`super::numeric::WIRE_DIGITS_MAX`]).
const AVG_SCALE: i16 = 12;

/// The scale an average of values with `digits` integer digits and `scale`
/// decimals is summed at (its result has 4 more), or None where the input's
/// own scale is as wide.
pub fn summed_scale(digits: i16, scale: i16) -> Option<i8> {
    let wanted = AVG_SCALE.min(super::numeric::WIRE_DIGITS_MAX - 4 - digits);
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
        self.inner.accumulator(args)
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
        self.inner.create_groups_accumulator(args)
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
}
