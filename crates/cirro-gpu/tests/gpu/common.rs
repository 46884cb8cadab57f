//! What the GPU tests share: a device, a DataFusion session with the GPU
//! rule over one in-memory table `t` of random rows, and the GPU
//! operators' metrics of a plan.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int32Array,
    Int64Array, StringArray,
};
use arrow::datatypes::{DataType, Field};
use rand::Rng;
use rand::rngs::StdRng;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use cirro_gpu::{Accelerator, GpuOperators, GpuOptions};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

/// The device of the tests that set no device-memory budget of their own
/// (the default, 1 GiB); a test that needs another builds its own
/// [`Accelerator`] and passes it to [`context_on`].
pub fn accelerator() -> &'static Arc<Accelerator> {
    static SHARED: std::sync::OnceLock<Arc<Accelerator>> = std::sync::OnceLock::new();
    SHARED.get_or_init(Arc::default)
}

/// Two partitions, `SET gpu = mode`, blocks of `block_rows`, table `t`.
pub fn context(
    mode: &str,
    block_rows: usize,
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
) -> SessionContext {
    context_in(mode, block_rows, 2, schema, batches)
}

/// [`context`] with `partitions` partitions.
pub fn context_in(
    mode: &str,
    block_rows: usize,
    partitions: usize,
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
) -> SessionContext {
    context_on(accelerator(), mode, block_rows, partitions, schema, batches)
}

/// [`context_in`] over the device of `accelerator`.
pub fn context_on(
    accelerator: &Arc<Accelerator>,
    mode: &str,
    block_rows: usize,
    partitions: usize,
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
) -> SessionContext {
    let mut options = GpuOptions::default();
    options.mode = mode.to_string();
    options.block_rows = block_rows;
    let config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_option_extension(options);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(GpuOperators::new(Arc::clone(accelerator))))
        .build();
    let ctx = SessionContext::new_with_state(state);
    let table = MemTable::try_new(schema, vec![batches]).expect("table");
    ctx.register_table("t", Arc::new(table)).expect("register");
    ctx
}

/// `sql` planned and run: its batches and its plan (with its metrics).
pub async fn execute(
    ctx: &SessionContext,
    sql: &str,
) -> (Vec<RecordBatch>, Arc<dyn ExecutionPlan>) {
    let frame = ctx.sql(sql).await.expect("plan");
    let plan = frame.create_physical_plan().await.expect("physical plan");
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
        .await
        .expect("run");
    (batches, plan)
}

/// `sql` run: its result's lines sorted (two partitions, or groups, give
/// rows in any order), and its plan.
pub async fn run_sorted(ctx: &SessionContext, sql: &str) -> (String, Arc<dyn ExecutionPlan>) {
    let (batches, plan) = execute(ctx, sql).await;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string();
    let mut rows: Vec<&str> = text.lines().collect();
    rows.sort();
    (rows.join("\n"), plan)
}

/// The plan as EXPLAIN prints it, one operator a line.
pub fn plan_text(plan: &Arc<dyn ExecutionPlan>) -> String {
    datafusion::physical_plan::displayable(plan.as_ref())
        .indent(false)
        .to_string()
}

/// The sum of a metric over the plan's GPU operators; None where there is
/// none.
pub fn gpu_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Option<usize> {
    let mut found = plan.name().starts_with("Gpu").then(|| {
        plan.metrics()
            .and_then(|m| m.sum_by_name(name))
            .map_or(0, |v| v.as_usize())
    });
    for child in plan.children() {
        if let Some(n) = gpu_metric(child, name) {
            found = Some(found.unwrap_or(0) + n);
        }
    }
    found
}

/// Columns of every type the kernels read, NULLs, NaN, -0, extremes, a
/// skewed text column.
pub fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int64, false),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("f", DataType::Float64, true),
        Field::new("r", DataType::Float32, false),
        Field::new("dt", DataType::Date32, false),
        Field::new("s", DataType::Utf8, true),
        Field::new("flag", DataType::Boolean, true),
    ]))
}

pub fn batch(rng: &mut StdRng, rows: usize) -> RecordBatch {
    let words = ["AAA", "AB", "B", "BA", "BZ", "M", "MFGR#12", "Q", "ZZZ", ""];
    let a: Int32Array = (0..rows)
        .map(|_| match rng.random_range(0..20) {
            0 => None,
            1 => Some(i32::MIN),
            2 => Some(i32::MAX),
            _ => Some(rng.random_range(-10..20)),
        })
        .collect();
    let b: Int64Array = (0..rows)
        .map(|_| Some(rng.random_range(-1_000i64..1_000) * 1_000_000_007))
        .collect();
    let d = Decimal128Array::from(
        (0..rows)
            .map(|_| (rng.random_range(0..10) > 0).then(|| rng.random_range(0i128..6000)))
            .collect::<Vec<_>>(),
    )
    .with_precision_and_scale(15, 2)
    .unwrap();
    let f: Float64Array = (0..rows)
        .map(|_| match rng.random_range(0..12) {
            0 => None,
            1 => Some(f64::NAN),
            2 => Some(-0.0),
            3 => Some(f64::NEG_INFINITY),
            4 => Some(-f64::NAN),
            _ => Some(rng.random_range(-2.0..2.0)),
        })
        .collect();
    let r: Float32Array = (0..rows)
        .map(|_| Some(rng.random_range(-3.0f32..3.0)))
        .collect();
    let dt: Date32Array = (0..rows)
        .map(|_| Some(rng.random_range(8_000..11_000)))
        .collect();
    // Skewed: most rows are one value.
    let s: StringArray = (0..rows)
        .map(|_| match rng.random_range(0..10) {
            0 => None,
            1..=5 => Some("AAA"),
            _ => Some(words[rng.random_range(0..words.len())]),
        })
        .collect();
    let flag: BooleanArray = (0..rows)
        .map(|_| match rng.random_range(0..5) {
            0 => None,
            x => Some(x % 2 == 0),
        })
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(a),
        Arc::new(b),
        Arc::new(d),
        Arc::new(f),
        Arc::new(r),
        Arc::new(dt),
        Arc::new(s),
        Arc::new(flag),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}
