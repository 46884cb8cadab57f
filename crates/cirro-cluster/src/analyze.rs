//! `EXPLAIN ANALYZE` of a distributed query, with a bounded wait for the
//! tasks' metrics.
//!
//! datafusion-distributed's `DistributedAnalyzeExec` runs the query, then
//! waits for the metrics of every task it planned. A task that never runs
//! never sends any: the probe side of a hash join whose build side came out
//! empty, or the rest of a scan under a satisfied LIMIT (upstream issue
//! datafusion-contrib/datafusion-distributed#739). The wait then never ends
//! and the statement hangs. [`BoundedAnalyzeExec`] takes its place: the same
//! rows, but after the query's rows are in it waits [`METRICS_GRACE`] at
//! most, then shows the plan with the metrics that came (the tasks that ran
//! report theirs as they finish, well within that).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, StringBuilder};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_distributed::{DistributedMetricsFormat, display_plan_ascii, explain_analyze};
use futures::StreamExt;

/// How long the metrics of a distributed query's tasks are waited for once
/// its rows are all in.
const METRICS_GRACE: Duration = Duration::from_secs(5);

/// `plan` with every `DistributedAnalyzeExec` replaced by a
/// [`BoundedAnalyzeExec`] (the former is private to its crate: found by name,
/// its `verbose` flag read from its display).
pub(crate) fn bound_metrics_wait(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if node.name() != "DistributedAnalyzeExec" || node.children().len() != 1 {
            return Ok(Transformed::no(node));
        }
        let shown = datafusion::physical_plan::displayable(node.as_ref())
            .one_line()
            .to_string();
        Ok(Transformed::yes(Arc::new(BoundedAnalyzeExec {
            input: Arc::clone(node.children()[0]),
            verbose: shown.contains("verbose=true"),
            properties: Arc::clone(node.properties()),
        }) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// The one child of a plan node that takes one (`with_new_children`).
pub(crate) fn only_child(
    mut children: Vec<Arc<dyn ExecutionPlan>>,
    node: &str,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    match children.pop().filter(|_| children.is_empty()) {
        Some(child) => Ok(child),
        None => Err(DataFusionError::Internal(format!("{node} takes one input"))),
    }
}

#[derive(Debug)]
pub(crate) struct BoundedAnalyzeExec {
    input: Arc<dyn ExecutionPlan>,
    verbose: bool,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for BoundedAnalyzeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "BoundedAnalyzeExec verbose={}", self.verbose)
    }
}

/// The plan with metrics, or, when some never come, with those that did.
async fn rendered(
    input: Arc<dyn ExecutionPlan>,
    format: DistributedMetricsFormat,
) -> DfResult<String> {
    match tokio::time::timeout(METRICS_GRACE, explain_analyze(Arc::clone(&input), format)).await {
        Ok(text) => text,
        Err(_) => Ok(format!(
            "{}(metrics of tasks that never ran are missing: their input was not needed)",
            display_plan_ascii(input.as_ref(), true)
        )),
    }
}

impl ExecutionPlan for BoundedAnalyzeExec {
    fn name(&self) -> &str {
        "BoundedAnalyzeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            input: only_child(children, self.name())?,
            verbose: self.verbose,
            properties: Arc::clone(&self.properties),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "BoundedAnalyzeExec has one partition, not {partition}"
            )));
        }
        let mut rows = self.input.execute(0, context)?;
        let input = Arc::clone(&self.input);
        let schema = self.schema();
        let verbose = self.verbose;
        let output = async move {
            let start = Instant::now();
            let mut total = 0;
            while let Some(batch) = rows.next().await.transpose()? {
                total += batch.num_rows();
            }
            let mut kinds = StringBuilder::new();
            let mut plans = StringBuilder::new();
            kinds.append_value("Plan with Metrics");
            plans.append_value(
                rendered(Arc::clone(&input), DistributedMetricsFormat::Aggregated).await?,
            );
            if verbose {
                kinds.append_value("Plan with Full Metrics");
                plans.append_value(rendered(input, DistributedMetricsFormat::PerTask).await?);
                kinds.append_value("Output Rows");
                plans.append_value(total.to_string());
                kinds.append_value("Duration");
                plans.append_value(format!("{:?}", start.elapsed()));
            }
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(kinds.finish()), Arc::new(plans.finish())],
            )
            .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            futures::stream::once(output),
        )))
    }
}
