//! GpuHashJoinExec against DataFusion's HashJoinExec on random batches:
//! integer, bigint, decimal, date and skewed text keys with NULLs and
//! duplicates (many-to-many), several keys, a residual filter, every join
//! type but the mark joins (the build side's rows emitted once, after the
//! last probe stream), an empty build side, the build side collected once
//! or per partition, and a budget so small that the pairs come back in
//! ranges; the kernels must have run, no block on the CPU.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use rand::SeedableRng;
use rand::rngs::StdRng;

use cirro_gpu::Accelerator;

use crate::common::{batch, context_on, plan_text, run_sorted as run, schema};

/// A budget of 1 MiB: the text join's pairs (about half the rows share
/// one value on each side) pass a quarter of it and are copied back in
/// ranges of probe rows.
const BUDGET: u64 = 1 << 20;

/// The tests share one device of [`BUDGET`], and the first asserts what is
/// left resident after its joins: they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn accelerator() -> &'static Arc<Accelerator> {
    static JOINS: std::sync::OnceLock<Arc<Accelerator>> = std::sync::OnceLock::new();
    JOINS.get_or_init(|| Arc::new(Accelerator::new(BUDGET, cirro_gpu::Policy::Cdr)))
}

/// Each query, and the join type DataFusion's plan gives it.
const JOINS: &[(&str, &str)] = &[
    (
        "SELECT t.a, t.b, u.b, u.s FROM t JOIN u ON t.a = u.a",
        "Inner",
    ),
    (
        "SELECT t.s, count(*), sum(t.a), min(u.b), max(u.dt) FROM t JOIN u ON t.s = u.s GROUP BY t.s",
        "Inner",
    ),
    (
        "SELECT t.a, t.dt, u.d FROM t JOIN u ON t.a = u.a AND t.dt = u.dt",
        "Inner",
    ),
    ("SELECT t.d, u.a FROM t JOIN u ON t.d = u.d", "Inner"),
    ("SELECT t.b, u.s FROM t JOIN u ON t.b = u.b", "Inner"),
    (
        "SELECT t.a, t.b, u.b FROM t JOIN u ON t.a = u.a AND t.b < u.b",
        "Inner",
    ),
    (
        "SELECT u.a, u.s, t.b FROM t RIGHT JOIN u ON t.a = u.a AND t.s = u.s",
        "Left",
    ),
    (
        "SELECT t.a, t.s, u.b FROM t LEFT JOIN u ON t.a = u.a AND t.b < u.b",
        "Right",
    ),
    (
        "SELECT t.a, u.a, t.dt, u.dt FROM t FULL JOIN u ON t.dt = u.dt AND t.a < u.a",
        "Full",
    ),
    (
        "SELECT t.a, t.s FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.s = t.s AND u.a > t.a)",
        "LeftSemi",
    ),
    (
        "SELECT t.a, t.d FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.d = t.d)",
        "LeftAnti",
    ),
    (
        "SELECT u.a, u.b FROM u WHERE EXISTS (SELECT 1 FROM t WHERE t.a = u.a AND t.b > u.b)",
        "RightSemi",
    ),
    (
        "SELECT u.a, u.s FROM u WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.s = u.s AND t.a = u.a)",
        "RightAnti",
    ),
    (
        "SELECT x.a, u.b FROM (SELECT * FROM t WHERE b > 2000000000000000) x RIGHT JOIN u ON x.a = u.a",
        "Right",
    ),
    (
        "SELECT x.a, u.b FROM (SELECT * FROM t WHERE b > 2000000000000000) x JOIN u ON x.a = u.a",
        "Inner",
    ),
];

/// `t` (700 rows) as `common::context` makes it, and `u` (1100 rows): the
/// same columns, other values, `b` drawn so that some match `t`'s.
fn tables(mode: &str, t: &[RecordBatch], u: &[RecordBatch]) -> SessionContext {
    let ctx = context_on(accelerator(), mode, 256, 2, schema(), t.to_vec());
    let table = MemTable::try_new(schema(), vec![u.to_vec()]).expect("table");
    ctx.register_table("u", Arc::new(table)).expect("register");
    ctx
}

fn data() -> (Vec<RecordBatch>, Vec<RecordBatch>) {
    let mut rng = StdRng::seed_from_u64(71);
    let t = [0, 300, 1, 399].map(|n| batch(&mut rng, n)).to_vec();
    let u = [500, 0, 600].map(|n| batch(&mut rng, n)).to_vec();
    (t, u)
}

/// The sum of a metric over the plan's nodes named `name`; None where
/// there is none.
fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str, metric_name: &str) -> Option<usize> {
    let mut found = (plan.name() == name).then(|| {
        plan.metrics()
            .and_then(|m| m.sum_by_name(metric_name))
            .map_or(0, |v| v.as_usize())
    });
    for child in plan.children() {
        if let Some(n) = metric(child, name, metric_name) {
            found = Some(found.unwrap_or(0) + n);
        }
    }
    found
}

async fn check(gpu: &SessionContext, cpu: &SessionContext, sql: &str, join_type: &str) {
    let (want, _) = run(cpu, sql).await;
    let (got, plan) = run(gpu, sql).await;
    assert!(got == want, "{sql}:\ngot\n{got}\nwant\n{want}");
    let text = plan_text(&plan);
    assert!(
        text.contains("GpuHashJoinExec: mode=")
            && text.contains(&format!("join_type={join_type},")),
        "{sql}:\n{text}"
    );
    assert_eq!(
        metric(&plan, "GpuHashJoinExec", "cpu_blocks"),
        Some(0),
        "{sql}"
    );
    // The empty build side needs no kernel; every other join runs them.
    if !sql.contains("2000000000000000") {
        let dispatches = metric(&plan, "GpuHashJoinExec", "gpu_dispatches").unwrap_or(0);
        assert!(dispatches > 0, "{sql}: no kernel ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_hash_joins_answer_as_datafusion_does() {
    let _serial = SERIAL.lock().await;
    assert!(accelerator().device().is_some(), "no Vulkan device");
    let (t, u) = data();
    let gpu = tables("force", &t, &u);
    let cpu = tables("off", &t, &u);
    for (sql, join_type) in JOINS {
        check(&gpu, &cpu, sql, join_type).await;
    }
    // The text join's blocks came back in more ranges than blocks.
    let (_, plan) = run(&gpu, JOINS[1].0).await;
    let blocks = metric(&plan, "GpuHashJoinExec", "gpu_blocks").unwrap_or(0);
    let ranges = metric(&plan, "GpuHashJoinExec", "gpu_pair_ranges").unwrap_or(0);
    assert!(ranges > blocks, "{ranges} ranges, {blocks} blocks");
    let stats = accelerator().memory().expect("memory").stats();
    // What stays is the filters' cached input columns.
    assert_eq!(
        stats.resident, stats.cached,
        "the joins' tables were freed: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_builds_answer_as_datafusion_does() {
    let _serial = SERIAL.lock().await;
    let (t, u) = data();
    let gpu = tables("force", &t, &u);
    let cpu = tables("off", &t, &u);
    for ctx in [&gpu, &cpu] {
        for option in [
            "hash_join_single_partition_threshold",
            "hash_join_single_partition_threshold_rows",
        ] {
            ctx.sql(&format!("SET datafusion.optimizer.{option} = 0"))
                .await
                .expect("set");
        }
    }
    for (sql, join_type) in &JOINS[..3] {
        check(&gpu, &cpu, sql, join_type).await;
        let (_, plan) = run(&gpu, sql).await;
        let text = plan_text(&plan);
        assert!(
            text.contains("GpuHashJoinExec: mode=Partitioned"),
            "{sql}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_the_kernels_cannot_run_stay_on_the_cpu() {
    let _serial = SERIAL.lock().await;
    let (t, u) = data();
    let gpu = tables("force", &t, &u);
    for sql in [
        // Float keys compare by value, not by bits.
        "SELECT t.a FROM t JOIN u ON t.f = u.f",
        // NULLs equal: the words of a NULL key are not its value's.
        "SELECT t.a FROM t JOIN u ON t.a IS NOT DISTINCT FROM u.a",
    ] {
        let (_, plan) = run(&gpu, sql).await;
        let text = plan_text(&plan);
        assert!(!text.contains("GpuHashJoinExec"), "{sql}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outer_joins_keep_the_probe_sides_order() {
    let _serial = SERIAL.lock().await;
    let (t, u) = data();
    let gpu = tables("force", &t, &u);
    // The probe side comes sorted and the join keeps its order (as
    // DataFusion's does): the plan has no sort above the join.
    let sql = "SELECT x.b, t.a FROM t RIGHT JOIN (SELECT * FROM u ORDER BY b) x \
               ON t.a = x.a AND t.s = x.s ORDER BY x.b";
    let (batches, plan) = crate::common::execute(&gpu, sql).await;
    let text = plan_text(&plan);
    let join = text.find("GpuHashJoinExec").expect("GpuHashJoinExec");
    assert!(
        !text[..join].contains("SortExec"),
        "a sort above the join would order its output anyway:\n{text}"
    );
    let b: Vec<i64> = batches
        .iter()
        .flat_map(|batch| {
            batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("b")
                .values()
                .to_vec()
        })
        .collect();
    assert!(b.len() >= 1100, "every probe row at least once");
    assert!(b.windows(2).all(|w| w[0] <= w[1]), "out of order:\n{text}");
}
