//! GpuSortExec (radix sort and top-N) against DataFusion's SortExec on
//! random batches: every key type, both directions, NULLS FIRST/LAST,
//! several keys, LIMIT; the kernels must have run. The device-memory
//! budget is small: each partition is sorted in chunks merged on the host.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use rand::SeedableRng;
use rand::rngs::StdRng;

use cirro_gpu::Accelerator;

use crate::common::{batch, context_on, execute, gpu_metric, schema};

async fn run(ctx: &SessionContext, sql: &str) -> (String, Arc<dyn ExecutionPlan>) {
    let (batches, plan) = execute(ctx, sql).await;
    (pretty_format_batches(&batches).unwrap().to_string(), plan)
}

/// Only the keys are selected: rows with equal keys print alike, so any
/// order of ties gives the same text.
const SORTS: &[&str] = &[
    "SELECT a FROM t ORDER BY a",
    "SELECT a FROM t ORDER BY a DESC",
    "SELECT a FROM t ORDER BY a NULLS FIRST",
    "SELECT a FROM t ORDER BY a DESC NULLS LAST",
    "SELECT b FROM t ORDER BY b DESC",
    "SELECT s, b FROM t ORDER BY s, b",
    "SELECT s, a FROM t ORDER BY s DESC NULLS LAST, a",
    "SELECT f FROM t ORDER BY f",
    "SELECT f, r FROM t ORDER BY f DESC NULLS FIRST, r",
    "SELECT d, dt FROM t ORDER BY d, dt DESC",
    "SELECT flag, a FROM t ORDER BY flag, a DESC",
    "SELECT b FROM t ORDER BY b LIMIT 17",
    "SELECT s, dt FROM t ORDER BY s DESC, dt LIMIT 100",
    "SELECT a, b FROM t ORDER BY a, b LIMIT 1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_sorts_answer_as_datafusion_does() {
    // 256 KiB: a few thousand rows a chunk.
    let device = Arc::new(Accelerator::new(256 << 10, cirro_gpu::Policy::Cdr));
    assert!(device.device().is_some(), "no Vulkan device");
    let context =
        |mode: &str, schema, batches| context_on(&device, mode, 1 << 20, 2, schema, batches);
    let mut rng = StdRng::seed_from_u64(42);
    let sizes = [0, 1, 3000, 9000, 0, 5000];
    let batches: Vec<RecordBatch> = sizes.iter().map(|&n| batch(&mut rng, n)).collect();
    let gpu = context("force", schema(), batches.clone());
    let cpu = context("off", schema(), batches);
    for sql in SORTS {
        let (want, _) = run(&cpu, sql).await;
        let (got, plan) = run(&gpu, sql).await;
        assert!(got == want, "{sql}: the GPU's order differs");
        let dispatches =
            gpu_metric(&plan, "gpu_dispatches").unwrap_or_else(|| panic!("{sql}: no GpuSortExec"));
        assert!(dispatches > 0, "{sql}: no kernel ran");
        assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{sql}");
        // 17,000 rows in chunks of at most a few thousand.
        let chunks = gpu_metric(&plan, "gpu_blocks").unwrap_or(0);
        assert!(chunks >= 3, "{sql}: {chunks} chunks");
    }
    // Empty input: nothing to sort, no failure.
    let empty = context("force", schema(), vec![batch(&mut rng, 0)]);
    let cpu = context("off", schema(), vec![batch(&mut rng, 0)]);
    let sql = "SELECT a FROM t ORDER BY a";
    assert_eq!(run(&empty, sql).await.0, run(&cpu, sql).await.0);
}
