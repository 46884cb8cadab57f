//! Two GPU queries that together need more device memory than the budget:
//! both finish with the right answers, one waited for the other, nothing
//! fell back or aborted. The two sessions share a device of their own,
//! with the small budget.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use cirro_gpu::{Accelerator, Policy};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::common::{context_on, execute, gpu_metric};

fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    gpu_metric(plan, name).unwrap_or(0)
}

/// 256 kB of device memory: the blocks of this filter's two partitions,
/// two in flight each (16 bytes a row: the column, a flag, an index), hold
/// 90 % of it, ~3,500 rows each; two queries cannot run at once.
const BUDGET: u64 = 256 * 1024;

async fn count(ctx: &SessionContext, sql: &str) -> (i64, Arc<dyn ExecutionPlan>) {
    let (batches, plan) = execute(ctx, sql).await;
    let n = batches
        .iter()
        .map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .map_or(0, |c| c.value(0))
        })
        .sum();
    (n, plan)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversubscribed_queries_take_turns_and_both_finish() {
    let device = Arc::new(Accelerator::new(BUDGET, Policy::Cdr));
    assert!(device.device().is_some(), "no Vulkan device");
    let context = |mode: &str, schema: Arc<Schema>, batches: Vec<RecordBatch>| {
        context_on(&device, mode, 1 << 20, 2, schema, batches)
    };
    let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
    let batches: Vec<RecordBatch> = (0..100)
        .map(|b| {
            let values: Int64Array = (0..8192i64).map(|i| (b * 8192 + i) % 1000).collect();
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).unwrap()
        })
        .collect();
    let sql = "SELECT count(*) FROM t WHERE a < 250";
    let cpu = context("off", Arc::clone(&schema), batches.clone());
    let (want, _) = count(&cpu, sql).await;
    assert!(want > 0);
    let one = context("force", Arc::clone(&schema), batches.clone());
    let two = context("force", schema, batches);
    let ((a, plan_a), (b, plan_b)) = tokio::join!(count(&one, sql), count(&two, sql));
    assert_eq!((a, b), (want, want));
    for plan in [&plan_a, &plan_b] {
        assert!(metric(plan, "gpu_blocks") > 10, "several blocks each");
        assert_eq!(metric(plan, "cpu_blocks"), 0, "nothing fell back");
    }
    // One waited for the other's turn (its whole scan: many blocks).
    let waited = metric(&plan_a, "gpu_wait_time").max(metric(&plan_b, "gpu_wait_time"));
    assert!(waited > 1_000_000, "no query waited: {waited} ns");
    let memory = device.memory().unwrap();
    assert_eq!(memory.budget(), BUDGET);
    // What stays is the column cache: the filter's input column.
    let stats = memory.stats();
    assert_eq!(stats.resident, stats.cached, "every other region freed");
    assert!(device.scheduler().unwrap().queries().is_empty());
}
