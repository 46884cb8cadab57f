//! Cirro's plan nodes on the wire: what `datafusion-distributed` sends a
//! worker is DataFusion's plan protobuf, which carries DataFusion's own
//! operators; [`CirroCodec`] carries Cirro's that a coordinator's plan
//! holds when it is cut into stages.
//!
//! - [`DeletionVectorsExec`]: the row selections of a scan's files (see
//!   `deletion_vectors.rs`), in JSON;
//! - [`RunAggregateExec`]: the partial phase over runs of equal keys that
//!   the coordinator chose (`cirro_exec::rules::AggregationExchange`), as
//!   the protobuf of DataFusion's partial `AggregateExec` of the same
//!   aggregates over an empty input of the same schema, behind [`RUNS`].
//!
//! A node of another release is refused before it gets a task, so both
//! ends read the same format.

use std::sync::Arc;

use cirro_exec::operators::run_aggregate::RunAggregateExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::replace_children_if_necessary;
use datafusion_proto::physical_plan::{
    AsExecutionPlan, PhysicalExtensionCodec, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalPlanNode;

use crate::deletion_vectors::DeletionVectorsExec;

/// The first bytes of an encoded [`RunAggregateExec`] (a deletion vector
/// selection is a JSON object, `{…`).
const RUNS: &[u8] = b"RUNS";

#[derive(Debug)]
pub struct CirroCodec;

impl PhysicalExtensionCodec for CirroCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = inputs else {
            return Err(DataFusionError::Internal(
                "Cirro's operators on the wire take one input".to_string(),
            ));
        };
        match buf.strip_prefix(RUNS) {
            Some(partial) => {
                let partial = replace_children_if_necessary(
                    PhysicalPlanNode::try_decode(partial)?.try_into_physical_plan(ctx, self)?,
                    vec![Arc::clone(input)],
                )?;
                let runs = partial
                    .downcast_ref::<AggregateExec>()
                    .and_then(RunAggregateExec::try_from_partial)
                    .ok_or_else(|| {
                        DataFusionError::Internal(
                            "RunAggregateExec: not a partial aggregation over runs".to_string(),
                        )
                    })?;
                Ok(Arc::new(runs))
            }
            None => Ok(Arc::new(DeletionVectorsExec::decode(buf, input)?)),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(exec) = node.downcast_ref::<DeletionVectorsExec>() {
            return exec.encode(buf);
        }
        if let Some(runs) = node.downcast_ref::<RunAggregateExec>() {
            let input = runs.children()[0].schema();
            let partial = runs.partial_over(Arc::new(EmptyExec::new(input)))?;
            buf.extend_from_slice(RUNS);
            return PhysicalPlanNode::try_from_physical_plan(Arc::new(partial), self)?
                .try_encode(buf);
        }
        Err(DataFusionError::NotImplemented(format!(
            "{} cannot be sent to another node",
            node.name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::aggregates::{AggregateMode, PhysicalGroupBy};
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    #[test]
    fn a_partial_phase_over_runs_crosses_the_wire_whole() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::clone(&schema)));
        let sum = AggregateExprBuilder::new(sum_udaf(), vec![col("v", &schema).unwrap()])
            .schema(Arc::clone(&schema))
            .alias("sum(v)")
            .build()
            .unwrap();
        let partial = AggregateExec::try_new(
            AggregateMode::Partial,
            PhysicalGroupBy::new_single(vec![(col("k", &schema).unwrap(), "k".to_string())]),
            vec![Arc::new(sum)],
            vec![None],
            Arc::clone(&input),
            Arc::clone(&schema),
        )
        .unwrap();
        let runs: Arc<dyn ExecutionPlan> =
            Arc::new(RunAggregateExec::try_from_partial(&partial).unwrap());
        let mut buf = Vec::new();
        let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        CirroCodec
            .try_encode(Arc::clone(&runs), &mut buf, &converter)
            .unwrap();
        assert!(buf.starts_with(RUNS));
        let ctx = SessionContext::new().task_ctx();
        let decoded = CirroCodec
            .try_decode(&buf, &[input], &ctx, &converter)
            .unwrap();
        assert!(decoded.is::<RunAggregateExec>());
        let line = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).one_line().to_string();
        assert_eq!(line(&decoded), line(&runs));
        assert_eq!(decoded.schema(), runs.schema());
        // Anything else is refused by name, not sent half.
        let err = CirroCodec
            .try_encode(Arc::new(partial), &mut Vec::new(), &converter)
            .unwrap_err();
        assert!(
            err.to_string().contains("AggregateExec cannot be sent"),
            "{err}"
        );
    }
}
