//! GpuProjectionExec against DataFusion's ProjectionExec on random
//! batches: `+ - *` and casts of integers and decimals, with NULLs,
//! `i32::MIN`/`MAX`, large products, decimal rescaling, plain columns
//! (text too) passed through, blocks smaller than the input; the kernels
//! must have run. A block where a value passes its type goes to the CPU
//! and answers (or fails) as DataFusion does.

use std::sync::Arc;

use arrow::array::RecordBatch;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::common::{batch, context, gpu_metric, plan_text, run_sorted as run, schema};

const PROJECTIONS: &[&str] = &[
    "SELECT a, b - 5, d * d, s FROM t",
    "SELECT CAST(a AS BIGINT) * 1000, b * 3 + CAST(a AS BIGINT), d FROM t",
    "SELECT d * CAST(b AS DECIMAL(18, 0)), d - CAST(7 AS DECIMAL(5, 1)), CAST(a AS DECIMAL(12, 2)) FROM t",
    "SELECT a * 2, b FROM t WHERE a > 3",
    "SELECT CAST(a AS BIGINT) - b, -3 * b FROM t",
    // TPC-H's `l_extendedprice * (1 - l_discount)`: 1 is DECIMAL(20, 0).
    "SELECT d * (1 - d), s FROM t",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_projections_answer_as_datafusion_does() {
    assert!(
        crate::common::accelerator().device().is_some(),
        "no Vulkan device"
    );
    let mut rng = StdRng::seed_from_u64(71);
    let sizes = [0, 1, 3000, 9000, 0, 5000, 1234];
    let batches: Vec<RecordBatch> = sizes.iter().map(|&n| batch(&mut rng, n)).collect();
    let gpu = context("force", 2048, schema(), batches.clone());
    let cpu = context("off", 2048, schema(), batches);
    for sql in PROJECTIONS {
        let (want, _) = run(&cpu, sql).await;
        let (got, plan) = run(&gpu, sql).await;
        assert!(got == want, "{sql}:\ngot\n{got}\nwant\n{want}");
        let text = plan_text(&plan);
        assert!(text.contains("GpuProjectionExec"), "{sql}:\n{text}");
        assert!(
            gpu_metric(&plan, "gpu_dispatches").unwrap_or(0) > 0,
            "{sql}: no kernel ran"
        );
        assert_eq!(gpu_metric(&plan, "cpu_blocks"), Some(0), "{sql}");
    }
    // Only plain columns: nothing for the device.
    let (_, plan) = run(&gpu, "SELECT s, a FROM t").await;
    assert!(!plan_text(&plan).contains("GpuProjectionExec"));
}

/// A value past its type: the block goes to the CPU, which answers as
/// DataFusion does (its integer `+ - *` wrap, unless the expression says
/// to fail, as Cirro's do; a cast to a NUMERIC too narrow fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_past_their_type_go_to_the_cpu() {
    let mut rng = StdRng::seed_from_u64(72);
    let batches = vec![batch(&mut rng, 3000)];
    let gpu = context("force", 1024, schema(), batches.clone());
    let cpu = context("off", 1024, schema(), batches);
    for (sql, fails) in [
        // a holds i32::MAX: INTEGER + INTEGER passes 32 bits.
        ("SELECT a + a FROM t", false),
        // b * b passes 64 bits.
        ("SELECT b * b, b FROM t", false),
        // i32::MAX with two decimals has 12 digits.
        ("SELECT CAST(a AS DECIMAL(11, 2)) FROM t", true),
    ] {
        let outcome = |ctx: &datafusion::prelude::SessionContext| {
            let ctx = ctx.clone();
            async move {
                let frame = ctx.sql(sql).await.expect("plan");
                let plan = frame.create_physical_plan().await.expect("physical plan");
                let run = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
                    .await
                    .map(|batches| {
                        let text = arrow::util::pretty::pretty_format_batches(&batches)
                            .expect("format")
                            .to_string();
                        let mut rows: Vec<&str> = text.lines().collect();
                        rows.sort();
                        rows.join("\n")
                    })
                    .map_err(|e| e.to_string());
                (plan, run)
            }
        };
        let (_, want) = outcome(&cpu).await;
        let (plan, got) = outcome(&gpu).await;
        assert!(
            plan_text(&plan).contains("GpuProjectionExec"),
            "{sql}:\n{}",
            plan_text(&plan)
        );
        match (&want, &got) {
            (Ok(w), Ok(g)) => assert!(w == g && !fails, "{sql}:\ngot\n{g}\nwant\n{w}"),
            (Err(w), Err(g)) => assert!(fails && w == g, "{sql}:\n{g}\n{w}"),
            _ => panic!("{sql}: {want:?} vs {got:?}"),
        }
        assert!(
            gpu_metric(&plan, "cpu_blocks").unwrap_or(0) > 0,
            "{sql}: no block went to the CPU"
        );
    }
}
