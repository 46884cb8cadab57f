//! `SharedExec`: one copy of a subtree that a plan holds several times,
//! each output partition run once on a task of its own and its batches
//! handed to every occurrence (placed by `rules/shared.rs`).

use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};

type Output = std::result::Result<Arc<Vec<RecordBatch>>, Arc<DataFusionError>>;

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
        let stream = self.input.execute(partition, context)?;
        let task = SpawnedTask::spawn(async move {
            stream
                .try_collect::<Vec<_>>()
                .await
                .map(Arc::new)
                .map_err(Arc::new)
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
            let replay: Vec<Result<RecordBatch>> = batches.iter().cloned().map(Ok).collect();
            Ok::<_, DataFusionError>(futures::stream::iter(replay))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            batches.boxed(),
        )))
    }
}
