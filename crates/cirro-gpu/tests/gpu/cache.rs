//! The column cache fed by scans: a filter run again over the same input
//! batches (a scan of data the host holds feeds the same buffers to every
//! query) finds its columns on the device and uploads nothing, with the
//! same answer, also where the batches are gathered into other blocks (one
//! entry per input batch, put together on the device). On a device of its
//! own: it reads the device-memory counters.

use std::sync::Arc;

use arrow::array::RecordBatch;
use cirro_gpu::Accelerator;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::common::{batch, context_on, gpu_metric, run_sorted as run, schema};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_run_again_finds_its_columns_on_the_device() {
    let device = Arc::new(Accelerator::default());
    let memory = device.memory().expect("no Vulkan device");
    let context =
        |mode: &str, rows, schema, batches| context_on(&device, mode, rows, 2, schema, batches);
    let mut rng = StdRng::seed_from_u64(9);
    // Each batch fits a block of 2048 rows, none ends on a word of bits.
    let batches: Vec<RecordBatch> = [1500, 0, 1201, 1800].map(|n| batch(&mut rng, n)).to_vec();
    let gpu = context("force", 2048, schema(), batches.clone());
    let cpu = context("off", 2048, schema(), batches.clone());
    let sql = "SELECT * FROM t WHERE a > 3 AND d < 20.00 AND b > 0";
    let (want, _) = run(&cpu, sql).await;
    let before = memory.stats();
    let (first, plan) = run(&gpu, sql).await;
    assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0));
    let between = memory.stats();
    let (second, plan) = run(&gpu, sql).await;
    assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0));
    let after = memory.stats();
    assert!(first == want && second == want);
    assert!(between.loaded > before.loaded, "the first run uploads");
    assert!(between.cached > 0, "its columns stay on the device");
    assert_eq!(
        after.loaded, between.loaded,
        "the second run uploads nothing"
    );
    assert_eq!(after.misses, between.misses);
    assert!(after.hits > between.hits);
    // Another predicate over the same columns finds them too.
    let (_, plan) = run(&gpu, "SELECT a FROM t WHERE b < 0 OR a IS NULL").await;
    assert!(gpu_metric(&plan, "gpu_dispatches").unwrap_or(0) > 0);
    assert_eq!(memory.stats().loaded, after.loaded);
    // The same batches in blocks of several: each block's columns (and
    // their validity bits) are put together from the cached batches.
    let wide = context("force", 8192, schema(), batches);
    let before = memory.stats();
    let (third, plan) = run(&wide, sql).await;
    assert!(third == want);
    assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0));
    let blocks = gpu_metric(&plan, "gpu_blocks").unwrap_or(0);
    assert!(
        blocks > 0 && blocks < 3,
        "{blocks} blocks of several batches"
    );
    let after = memory.stats();
    assert_eq!(after.loaded, before.loaded, "nothing uploaded");
    assert_eq!(after.misses, before.misses);
    assert!(after.hits > before.hits);
}
