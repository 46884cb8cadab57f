//! GpuFilterExec against DataFusion's FilterExec on random batches (NULLs,
//! duplicates, skew, NaN, empty batches, blocks across batch boundaries),
//! on the Vulkan device present: lavapipe in CI. The kernels really run:
//! each query's operator must report dispatches.

use arrow::array::RecordBatch;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::common::{batch, context, context_in, execute, gpu_metric, run_sorted as run, schema};

/// The first line where two sorted results differ, and their row counts.
fn difference(got: &str, want: &str) -> String {
    let first = got
        .lines()
        .zip(want.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("got {a}\nwant {b}"))
        .unwrap_or_default();
    format!(
        "{} rows, want {}; {first}",
        got.lines().count(),
        want.lines().count()
    )
}

const PREDICATES: &[&str] = &[
    "a > 10",
    "a <= -5 AND b > 100",
    "a IS NULL OR s = 'AAA'",
    "NOT (a = 3)",
    "a = 2147483647 OR a = -2147483648",
    "d >= 12.50 AND d < 40.00",
    "d IS NULL",
    "f > 0.5",
    "f < 0",
    "f = 'NaN'::double",
    "f >= '-0'::double AND f <= 0",
    "f = 0 OR f = 'NaN'::double",
    "f < '-1e300'::double",
    "r > 1.5 OR r < -2.5",
    "dt BETWEEN DATE '1993-01-01' AND DATE '1996-12-31'",
    "s < 'M'",
    "s >= 'AB' AND s <= 'BZ'",
    "s > 'ZZZ' OR s = ''",
    "s = 'nowhere'",
    "s LIKE 'B%'",
    "s NOT LIKE 'MFGR#1%'",
    "s IN ('AAA', 'ZZZ', 'Q')",
    "s NOT IN ('AAA')",
    "flag",
    "NOT flag",
    "flag IS NOT NULL AND a IN (1, 2, 3)",
    "b <> 7000000049 OR a < 0",
    "(a > 0 OR flag) AND (s <> 'AAA' OR d > 30.00)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_filters_answer_as_datafusion_does() {
    assert!(
        crate::common::accelerator().device().is_some(),
        "no Vulkan device: install mesa-vulkan-drivers (lavapipe) and libvulkan1"
    );
    let mut rng = StdRng::seed_from_u64(20);
    // Empty batches, a single row, and blocks of 2048 rows across batches.
    let sizes = [0, 1, 1000, 5000, 0, 3000, 777];
    let batches: Vec<RecordBatch> = sizes.iter().map(|&n| batch(&mut rng, n)).collect();
    let gpu = context("force", 2048, schema(), batches.clone());
    let cpu = context("off", 2048, schema(), batches);
    for predicate in PREDICATES {
        let sql = format!("SELECT * FROM t WHERE {predicate}");
        let (want, cpu_plan) = run(&cpu, &sql).await;
        assert!(gpu_metric(&cpu_plan, "gpu_dispatches").is_none());
        let (got, plan) = run(&gpu, &sql).await;
        assert!(got == want, "{predicate}: {}", difference(&got, &want));
        let dispatches = gpu_metric(&plan, "gpu_dispatches")
            .unwrap_or_else(|| panic!("{predicate}: no GpuFilterExec in the plan"));
        assert!(dispatches > 0, "{predicate}: no kernel ran");
        assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{predicate}");
    }
    let counters = crate::common::accelerator()
        .device()
        .unwrap()
        .counters
        .values();
    assert!(counters.dispatches > 0 && counters.bytes_to_device > 0);
    assert!(
        counters.cache_hits > 0,
        "each predicate's kernel is compiled once and found again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicates_the_kernels_cannot_run_stay_on_the_cpu() {
    let mut rng = StdRng::seed_from_u64(7);
    let gpu = context("force", 1024, schema(), vec![batch(&mut rng, 500)]);
    for predicate in ["a + 1 > 3", "upper(s) = 'AAA'", "s LIKE '%A'", "f * 2 > 1"] {
        let sql = format!("SELECT * FROM t WHERE {predicate}");
        let (_, plan) = run(&gpu, &sql).await;
        assert!(gpu_metric(&plan, "gpu_dispatches").is_none(), "{predicate}");
    }
    // `on` keeps a software device out, and small inputs on any device.
    let on = context("on", 1024, schema(), vec![batch(&mut rng, 500)]);
    let (_, plan) = run(&on, "SELECT * FROM t WHERE a > 1").await;
    assert!(gpu_metric(&plan, "gpu_dispatches").is_none());
}

/// Two blocks of a partition worked on at once (one's columns uploaded
/// while the other's kernels run): the rows still come out in the input's
/// order, and blocks took their device memory while the block before them
/// was still worked on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_in_flight_keep_the_input_order() {
    let mut rng = StdRng::seed_from_u64(23);
    // 40 batches of 1000 rows: 20 blocks of 2048 rows in one partition.
    let batches: Vec<RecordBatch> = (0..40).map(|_| batch(&mut rng, 1000)).collect();
    let gpu = context_in("force", 2048, 1, schema(), batches.clone());
    let cpu = context_in("off", 2048, 1, schema(), batches.clone());
    let text = |batches: &[RecordBatch]| {
        arrow::util::pretty::pretty_format_batches(batches)
            .expect("format")
            .to_string()
    };
    for sql in [
        "SELECT * FROM t WHERE a > 10 OR s = 'AAA'",
        "SELECT a, d * d, s FROM t WHERE d IS NOT NULL",
    ] {
        let (want, _) = execute(&cpu, sql).await;
        let (got, plan) = execute(&gpu, sql).await;
        let (got, want) = (text(&got), text(&want));
        assert!(got == want, "{sql}: {}", difference(&got, &want));
        assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{sql}");
        assert!(gpu_metric(&plan, "gpu_blocks").unwrap_or(0) >= 20, "{sql}");
        let overlapped = gpu_metric(&plan, "gpu_overlapped_blocks").unwrap_or(0);
        assert!(overlapped > 0, "{sql}: no block overlapped the one before");
    }
    // The aggregation's blocks too (in two partitions: with one, DataFusion
    // aggregates in a single step, which stays on the CPU; its groups come
    // in any order).
    let gpu = context("force", 2048, schema(), batches.clone());
    let cpu = context("off", 2048, schema(), batches);
    let sql = "SELECT s, count(*), sum(a), min(b) FROM t GROUP BY s";
    let (want, _) = run(&cpu, sql).await;
    let (got, plan) = run(&gpu, sql).await;
    assert!(got == want, "{sql}: {}", difference(&got, &want));
    assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{sql}");
    assert!(
        gpu_metric(&plan, "gpu_overlapped_blocks").unwrap_or(0) > 0,
        "{sql}"
    );
}
