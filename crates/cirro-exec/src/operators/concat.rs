//! The partitions of a plan one after another, in their order: what a
//! table written from a query stores, so that rows read from files in key
//! order are written in key order.
//!
//! DataFusion merges a plan's partitions into one stream as their batches
//! come (`CoalescePartitionsExec`), so a `CREATE TABLE … AS SELECT * FROM
//! read_parquet(…)` over files written in key order, read by two threads
//! (each a contiguous half of the bytes), wrote files whose key ranges
//! overlapped, differently at every run: TPC-H SF 10's lineitem came out
//! as 1–7.3 M, 2.6–10 M, 9.9–17 M … by order key. Pruning by the files'
//! min/max and the aggregation over runs of equal keys
//! (`RunAggregateExec`, which needs files of disjoint ranges) then lost
//! what the source's order gave them: TPC-H Q18's subquery took 6.3 s in
//! place of 3.0 s. DuckDB keeps the insertion order the same way by
//! default (`preserve_insertion_order`).
//!
//! [`ConcatPartitionsExec`] runs every partition at once, each ahead of
//! the output by at most [`AHEAD`] batches, and passes partition 0's
//! batches, then partition 1's, and so on. Only over partitions that run
//! on their own ([`in_partition_order`]: scans, filters, projections): a
//! partition fed by an exchange (a repartition: round robin, hash) has no
//! order of its own to keep, and one held back could make the exchange
//! buffer the rows of the others.

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
#[allow(deprecated)] // recognised in plans that still hold one
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, replace_children_if_necessary,
};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{SinkExt, StreamExt};

/// How many batches each partition may compute ahead of the output.
pub const AHEAD: usize = 2;

/// The partitions of its input, one after another (see the module docs).
#[derive(Debug)]
pub struct ConcatPartitionsExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl ConcatPartitionsExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            input,
            properties: Arc::new(properties),
        }
    }
}

tokio::task_local! {
    /// Set while a table is written from a query ([`planned_in_order`]).
    static ORDER_WANTED: ();
}

/// Plans `planning` as a table is written from it: a cluster's planner asks
/// [`order_wanted`] and keeps a plan whose partitions hold their rows in
/// their own order ([`keeps_partition_order`]) on the coordinating node.
/// Cut into tasks on several nodes, its rows would come back merged as
/// they arrived over the network: a table copied through a cluster from
/// files written in key order got files of overlapping ranges (TPC-H
/// lineitem's order keys 1–6 M and 2.4–3.1 M at SF 1), which lost the
/// pruning and the aggregation over runs that the order gave. The rows
/// cross to the writing node either way; read there, they keep it.
pub async fn planned_in_order<F: std::future::Future>(planning: F) -> F::Output {
    ORDER_WANTED.scope((), planning).await
}

/// Whether the plan being made is that of rows a table is written from
/// (see [`planned_in_order`]).
pub fn order_wanted() -> bool {
    ORDER_WANTED.try_with(|_| ()).is_ok()
}

/// Whether [`in_partition_order`] concatenates `plan`'s partitions (each
/// runs on its own from its own files), so that the rows keep their order.
pub fn keeps_partition_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    own_order(plan)
}

/// `plan` with its partitions read in their order where that order is the
/// rows' own (see the module docs): as one partition, or under a sink
/// (`INSERT`) that merged them as they came. Otherwise `plan` as it is.
pub fn in_partition_order(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    if own_order(&plan) {
        return Ok(Arc::new(ConcatPartitionsExec::new(own_files(plan)?)));
    }
    if !plan.is::<DataSinkExec>() {
        return Ok(plan);
    }
    let merged = match plan.children().as_slice() {
        [child] => match child.downcast_ref::<CoalescePartitionsExec>() {
            Some(merged) if merged.fetch().is_none() && own_order(merged.input()) => {
                Arc::clone(merged.input())
            }
            _ => return Ok(plan),
        },
        _ => return Ok(plan),
    };
    let concat = ConcatPartitionsExec::new(own_files(merged)?);
    replace_children_if_necessary(plan, vec![Arc::new(concat)])
}

/// `plan` with each file scan reading its partitions' own files, in their
/// order: DataFusion lets a partition that runs out of files read those
/// of another (`enable_file_stream_work_stealing`), which a partition held
/// back here would give away (TPC-H lineitem's second file came last).
fn own_files(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(config) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            .filter(|config| !config.preserve_order)
        else {
            return Ok(Transformed::no(node));
        };
        let config = FileScanConfigBuilder::from(config.clone())
            .with_preserve_order(true)
            .build();
        let scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        Ok(Transformed::yes(scan))
    })
    .map(|t| t.data)
}

/// Whether `plan` has several partitions, each computed on its own from
/// its own part of the scans: only scans, filters and projections (an
/// operator not known here may couple its partitions).
fn own_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    #[allow(deprecated)] // a plan may still hold one
    fn per_partition(node: &Arc<dyn ExecutionPlan>) -> bool {
        node.is::<DataSourceExec>()
            || node.is::<FilterExec>()
            || node.is::<ProjectionExec>()
            || node.is::<CooperativeExec>()
            || node.is::<CoalesceBatchesExec>()
    }
    plan.output_partitioning().partition_count() > 1
        && !plan.exists(|node| Ok(!per_partition(node))).unwrap_or(true)
}

impl DisplayAs for ConcatPartitionsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ConcatPartitionsExec")
    }
}

impl ExecutionPlan for ConcatPartitionsExec {
    fn name(&self) -> &str {
        "ConcatPartitionsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            1 => Ok(Arc::new(Self::new(children.remove(0)))),
            _ => Err(DataFusionError::Internal(
                "ConcatPartitionsExec has one child".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "ConcatPartitionsExec has one partition, not {partition}"
            )));
        }
        let count = self.input.output_partitioning().partition_count();
        // Each partition runs on a task of its own, aborted when the
        // output is dropped.
        let mut tasks = Vec::with_capacity(count);
        let mut outputs = Vec::with_capacity(count);
        for i in 0..count {
            let mut batches = self.input.execute(i, Arc::clone(&context))?;
            let (mut sender, receiver) = futures::channel::mpsc::channel(AHEAD);
            tasks.push(SpawnedTask::spawn(async move {
                while let Some(batch) = batches.next().await {
                    let failed = batch.is_err();
                    if sender.send(batch).await.is_err() || failed {
                        break;
                    }
                }
            }));
            outputs.push(receiver);
        }
        let batches = futures::stream::iter(outputs).flatten().map(move |batch| {
            let _running = &tasks;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            batches,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::repartition::RepartitionExec;

    /// Three partitions of four batches of 1,000 keys each, partition p
    /// holding keys p·4,000 … in order.
    fn partitions() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let partitions: Vec<Vec<RecordBatch>> = (0..3)
            .map(|p| {
                (0..4)
                    .map(|b| {
                        let first = p * 4_000 + b * 1_000;
                        let keys = Int64Array::from_iter_values(first..first + 1_000);
                        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)]).unwrap()
                    })
                    .collect()
            })
            .collect();
        MemorySourceConfig::try_new_exec(&partitions, schema, None).unwrap()
    }

    #[tokio::test]
    async fn the_partitions_come_one_after_another_in_their_order() {
        let plan = in_partition_order(partitions()).unwrap();
        assert!(plan.is::<ConcatPartitionsExec>());
        assert_eq!(plan.output_partitioning().partition_count(), 1);
        let batches = collect(plan, Arc::new(TaskContext::default()))
            .await
            .unwrap();
        let keys: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let keys = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..keys.len()).map(|i| keys.value(i)).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(keys, (0..12_000).collect::<Vec<i64>>());
    }

    #[test]
    fn partitions_fed_by_an_exchange_are_merged_as_before() {
        let shuffled: Arc<dyn ExecutionPlan> = Arc::new(
            RepartitionExec::try_new(partitions(), Partitioning::RoundRobinBatch(3)).unwrap(),
        );
        let plan = in_partition_order(Arc::clone(&shuffled)).unwrap();
        assert!(Arc::ptr_eq(&plan, &shuffled));
        // One partition: nothing to order.
        let one: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(partitions()));
        assert!(Arc::ptr_eq(
            &in_partition_order(Arc::clone(&one)).unwrap(),
            &one
        ));
    }
}
