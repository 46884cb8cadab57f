//! `SharedExec`: one copy of a subtree that a plan holds several times,
//! each output partition run once on a task of its own and its batches
//! handed to every occurrence (placed by `rules/shared.rs`). The batches
//! kept count against the query's memory while they are kept; a partition
//! that outgrows it fails the query with 53200 naming `SharedExec` (the
//! occurrences read one copy, so none can run it again alone).

use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};

type Output = std::result::Result<Arc<Kept>, Arc<DataFusionError>>;

/// A partition's batches and the memory they hold.
#[derive(Debug)]
struct Kept {
    batches: Vec<RecordBatch>,
    reservation: MemoryReservation,
}

/// The one copy of a shared subtree and its output partitions, each
/// started once.
#[derive(Debug)]
pub(crate) struct SharedState {
    input: Arc<dyn ExecutionPlan>,
    partitions: Vec<Mutex<Option<Shared<BoxFuture<'static, Output>>>>>,
}

impl SharedState {
    /// The one copy of `input`, whose `partitions` are not started yet.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, partitions: usize) -> Self {
        SharedState {
            input,
            partitions: (0..partitions).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Output partition `partition`, started on its own task by the first
    /// caller.
    fn output(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<Shared<BoxFuture<'static, Output>>> {
        let slot = self.partitions.get(partition).ok_or_else(|| {
            DataFusionError::Internal(format!("SharedExec has no partition {partition}"))
        })?;
        let mut slot = slot
            .lock()
            .map_err(|_| DataFusionError::Internal("SharedExec: a poisoned lock".into()))?;
        if let Some(output) = slot.as_ref() {
            return Ok(output.clone());
        }
        let reservation =
            MemoryConsumer::new(format!("SharedExec[{partition}]")).register(context.memory_pool());
        let mut stream = self.input.execute(partition, context)?;
        let task = SpawnedTask::spawn(async move {
            let mut kept = Kept {
                batches: Vec::new(),
                reservation,
            };
            while let Some(batch) = stream.try_next().await.map_err(Arc::new)? {
                kept.reservation
                    .try_grow(batch.get_array_memory_size())
                    .map_err(Arc::new)?;
                kept.batches.push(batch);
            }
            Ok(Arc::new(kept))
        });
        let output = async move {
            match task.join().await {
                Ok(output) => output,
                Err(e) => Err(Arc::new(DataFusionError::ExecutionJoin(Box::new(e)))),
            }
        }
        .boxed()
        .shared();
        *slot = Some(output.clone());
        Ok(output)
    }
}

/// One occurrence of a shared subtree (see the rule `SharedSubplans`,
/// `rules/shared.rs`): every occurrence reads the one copy's output.
#[derive(Debug)]
pub struct SharedExec {
    state: Arc<SharedState>,
    /// The one copy, as this node's child (for EXPLAIN and the tree walks).
    input: Arc<dyn ExecutionPlan>,
}

impl SharedExec {
    pub(crate) fn new(state: Arc<SharedState>) -> Self {
        Self {
            input: Arc::clone(&state.input),
            state,
        }
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "SharedExec: id={:p}", Arc::as_ptr(&self.state))
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
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
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.as_slice() {
            [child] if Arc::ptr_eq(child, &self.input) => Ok(self),
            // A new child is no longer the shared copy: run it on its own.
            [child] => Ok(Arc::clone(child)),
            _ => Err(DataFusionError::Internal("SharedExec has one child".into())),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let output = self.state.output(partition, context)?;
        let batches = futures::stream::once(async move {
            let batches = output.await.map_err(DataFusionError::Shared)?;
            let replay: Vec<Result<RecordBatch>> =
                batches.batches.iter().cloned().map(Ok).collect();
            Ok::<_, DataFusionError>(futures::stream::iter(replay))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            batches.boxed(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{MemoryBudget, QueryMemory};
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::runtime_env::RuntimeEnv;

    /// Two occurrences of a shared scan of 200,000 rows under a query
    /// memory of `limit` bytes: the rows each occurrence reads.
    async fn read_twice(limit: usize) -> Result<Vec<usize>> {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..100_000))],
        )?;
        let input = MemorySourceConfig::try_new_exec(&[vec![batch.clone(), batch]], schema, None)?;
        let state = Arc::new(SharedState::new(input, 1));
        let mut runtime = RuntimeEnv::default();
        runtime.memory_pool = Arc::new(QueryMemory::new(
            limit,
            Arc::new(MemoryBudget::new(1 << 40)),
        ));
        let context = Arc::new(TaskContext::default().with_runtime(Arc::new(runtime)));
        let mut rows = Vec::new();
        for _ in 0..2 {
            let occurrence = SharedExec::new(Arc::clone(&state));
            let batches: Vec<RecordBatch> = occurrence
                .execute(0, Arc::clone(&context))?
                .try_collect()
                .await?;
            rows.push(batches.iter().map(RecordBatch::num_rows).sum());
        }
        Ok(rows)
    }

    #[tokio::test]
    async fn the_kept_batches_count_against_the_querys_memory() {
        assert_eq!(
            read_twice(64 << 20).await.expect("fits"),
            [200_000, 200_000]
        );
        // 1.6 MB of rows kept: more than 1 MB holds.
        let err = read_twice(1 << 20).await.expect_err("over the limit");
        assert!(err.to_string().contains("SharedExec[0]"), "{err}");
    }
}
