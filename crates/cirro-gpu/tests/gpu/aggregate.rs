//! GpuAggregateExec against DataFusion's partial AggregateExec on random
//! batches: every key type the kernels group by (text, integers, dates,
//! decimals, floats with NaN and -0, NULLs, several keys, none),
//! count/sum/avg/min/max of integers, decimals and floats with NULLs,
//! extremes and negative sums, skew, empty batches, groups spread over
//! many blocks; the kernels must have run. Values past 64 bits, and float
//! extremes meeting -0, go to the CPU block by block, with the same
//! answers.

use arrow::array::RecordBatch;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::common::{batch, context, gpu_metric, plan_text, run_sorted as run, schema};

const AGGREGATIONS: &[&str] = &[
    "SELECT s, count(*), sum(a), min(b), max(dt) FROM t GROUP BY s",
    "SELECT a, sum(b), avg(d), count(d) FROM t GROUP BY a",
    "SELECT dt, min(d), max(d), min(a), max(a) FROM t GROUP BY dt",
    "SELECT s, a, count(f), sum(d), min(b) FROM t GROUP BY s, a",
    "SELECT count(*), sum(b), min(a), max(b), avg(d), count(s) FROM t",
    "SELECT d, count(*), max(b) FROM t GROUP BY d",
    "SELECT b, count(a) FROM t GROUP BY b",
    "SELECT a, min(b), max(b) FROM t WHERE s = 'AAA' GROUP BY a",
    "SELECT s, sum(b * 3), min(b - 5) FROM t GROUP BY s",
    "SELECT dt, s, sum(a), count(*) FROM t WHERE a > 1000 GROUP BY dt, s",
    // Two levels of grouping: DISTINCT becomes a group key.
    "SELECT s, count(DISTINCT a) FROM t GROUP BY s",
    // Float keys: NaN, -NaN, -0 (one group with +0, named +0), NULL.
    "SELECT f, count(*), sum(a) FROM t GROUP BY f",
    "SELECT r, min(b), count(f) FROM t GROUP BY r",
    // Float sums (of values whose sums are exact in any order: the blocks'
    // partial sums are added by the final aggregation), with NaN, -0, -inf
    // and NULLs; float extremes without NaN or -0.
    "SELECT s, sum(floor(f * 64) / 64), avg(floor(f * 64) / 64), min(r), max(r) FROM t GROUP BY s",
    // NULLs whose slots keep a value (nullif keeps the values buffer).
    "SELECT s, sum(nullif(floor(r * 4) / 4, 0.5)), avg(nullif(floor(r * 4) / 4, 0.5)) FROM t GROUP BY s",
    "SELECT sum(floor(f * 64) / 64), min(f + 1), max(f + 1), avg(floor(r * 16) / 16) FROM t WHERE NOT isnan(f)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_aggregations_answer_as_datafusion_does() {
    assert!(
        crate::common::accelerator().device().is_some(),
        "no Vulkan device"
    );
    let mut rng = StdRng::seed_from_u64(33);
    let sizes = [0, 1, 3000, 9000, 0, 5000, 1234];
    let batches: Vec<RecordBatch> = sizes.iter().map(|&n| batch(&mut rng, n)).collect();
    // Blocks of 2048 rows: each group's partial states come from several
    // blocks and the final aggregation merges them.
    let gpu = context("force", 2048, schema(), batches.clone());
    let cpu = context("off", 2048, schema(), batches);
    for sql in AGGREGATIONS {
        let (want, _) = run(&cpu, sql).await;
        let (got, plan) = run(&gpu, sql).await;
        assert!(got == want, "{sql}:\ngot\n{got}\nwant\n{want}");
        let text = plan_text(&plan);
        assert!(
            text.contains("GpuAggregateExec: mode=Partial"),
            "{sql}:\n{text}"
        );
        let dispatches = gpu_metric(&plan, "gpu_dispatches").unwrap_or(0);
        assert!(dispatches > 0, "{sql}: no kernel ran");
        assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_past_64_bits_are_aggregated_on_the_cpu() {
    let mut rng = StdRng::seed_from_u64(5);
    let batches = vec![batch(&mut rng, 3000)];
    let gpu = context("force", 1024, schema(), batches.clone());
    let cpu = context("off", 1024, schema(), batches);
    let sql = "SELECT s, sum(CAST(b AS DECIMAL(38, 0)) * 100000000000) FROM t GROUP BY s";
    let (want, _) = run(&cpu, sql).await;
    let (got, plan) = run(&gpu, sql).await;
    assert_eq!(got, want);
    assert!(
        gpu_metric(&plan, "cpu_blocks").unwrap_or(0) > 0,
        "no block fell back"
    );
    // A float extreme meeting a -0 (or a NaN) goes to the CPU: there
    // DataFusion's answer depends on the rows' order.
    let sql = "SELECT s, min(f), max(f) FROM t WHERE NOT isnan(f) GROUP BY s";
    let (want, _) = run(&cpu, sql).await;
    let (got, plan) = run(&gpu, sql).await;
    assert_eq!(got, want);
    assert!(
        gpu_metric(&plan, "cpu_blocks").unwrap_or(0) > 0,
        "no block with -0 fell back"
    );
    // What the kernels cannot compute stays DataFusion's.
    for sql in [
        "SELECT s, stddev(f) FROM t GROUP BY s",
        "SELECT flag, count(*) FROM t GROUP BY flag",
    ] {
        let (_, plan) = run(&gpu, sql).await;
        let text = plan_text(&plan);
        assert!(!text.contains("GpuAggregateExec"), "{sql}:\n{text}");
    }
}
