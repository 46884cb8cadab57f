//! The spilling join against DataFusion's hash join: every join type, both
//! partition modes, with and without a join filter, on uniform, skewed and
//! single-key build sides with NULL keys, under a memory limit that makes
//! it spill.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::{JoinSide, JoinType, NullEquality, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::joins::{HashJoinExecBuilder, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, collect};

use super::SpillingHashJoinExec;
use crate::resources::{MemoryBudget, QueryMemory};

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Keys spread over many values.
    Uniform,
    /// Half the build rows share one key.
    Skewed,
    /// Every build row has the same key.
    OneKey,
}

fn schema(prefix: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(format!("{prefix}_k"), DataType::Int64, true),
        Field::new(format!("{prefix}_v"), DataType::Int64, false),
        Field::new(format!("{prefix}_s"), DataType::Utf8, false),
    ]))
}

/// `rows` rows in batches of 4,096: keys by `shape` (every 97th NULL), a
/// value, a string.
fn table(prefix: &str, rows: usize, shape: Shape, seed: u64) -> Vec<RecordBatch> {
    let schema = schema(prefix);
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut batches = Vec::new();
    let mut start = 0;
    while start < rows {
        let n = (rows - start).min(4096);
        let keys: Int64Array = (0..n)
            .map(|i| {
                let r = next();
                if (start + i) % 97 == 0 {
                    return None;
                }
                Some(match shape {
                    Shape::Uniform => (r % 5_000) as i64,
                    Shape::Skewed if r % 2 == 0 => 7,
                    Shape::Skewed => (r % 5_000) as i64,
                    Shape::OneKey => 7,
                })
            })
            .collect();
        let values = Int64Array::from_iter_values((0..n).map(|_| (next() % 1000) as i64));
        let strings =
            StringArray::from_iter_values((0..n).map(|i| format!("{prefix}-row-{}", start + i)));
        let columns: Vec<ArrayRef> = vec![Arc::new(keys), Arc::new(values), Arc::new(strings)];
        batches.push(RecordBatch::try_new(Arc::clone(&schema), columns).unwrap());
        start += n;
    }
    batches
}

/// Probe rows: uniform keys, and a few rows of the hot key 7.
fn probe_table(rows: usize) -> Vec<RecordBatch> {
    table("r", rows, Shape::Uniform, 99)
}

fn source(
    batches: Vec<RecordBatch>,
    schema: SchemaRef,
    partitions: usize,
) -> Arc<dyn ExecutionPlan> {
    // Rows dealt round-robin to the partitions.
    let mut parts = vec![Vec::new(); partitions];
    for (i, b) in batches.into_iter().enumerate() {
        parts[i % partitions].push(b);
    }
    MemorySourceConfig::try_new_exec(&parts, schema, None).unwrap()
}

fn column(name: &str, index: usize) -> Arc<dyn datafusion::physical_expr::PhysicalExpr> {
    Arc::new(Column::new(name, index))
}

/// `l_v < r_v + 100`: most key matches pass, some do not.
fn filter() -> JoinFilter {
    let schema = Arc::new(Schema::new(vec![
        Field::new("l_v", DataType::Int64, false),
        Field::new("r_v", DataType::Int64, false),
    ]));
    let plus = Arc::new(BinaryExpr::new(
        column("r_v", 1),
        Operator::Plus,
        Arc::new(Literal::new(datafusion::common::ScalarValue::Int64(Some(
            100,
        )))),
    ));
    let expression = Arc::new(BinaryExpr::new(column("l_v", 0), Operator::Lt, plus));
    JoinFilter::new(
        expression,
        vec![
            ColumnIndex {
                index: 1,
                side: JoinSide::Left,
            },
            ColumnIndex {
                index: 1,
                side: JoinSide::Right,
            },
        ],
        schema,
    )
}

fn join(
    build: &[RecordBatch],
    probe: &[RecordBatch],
    join_type: JoinType,
    mode: PartitionMode,
    filtered: bool,
) -> datafusion::physical_plan::joins::HashJoinExec {
    let (left, right) = match mode {
        PartitionMode::Partitioned => {
            let hash = |plan: Arc<dyn ExecutionPlan>, key: &str| -> Arc<dyn ExecutionPlan> {
                Arc::new(
                    RepartitionExec::try_new(plan, Partitioning::Hash(vec![column(key, 0)], 2))
                        .unwrap(),
                )
            };
            (
                hash(source(build.to_vec(), schema("l"), 2), "l_k"),
                hash(source(probe.to_vec(), schema("r"), 2), "r_k"),
            )
        }
        _ => (
            source(build.to_vec(), schema("l"), 1),
            source(probe.to_vec(), schema("r"), 2),
        ),
    };
    HashJoinExecBuilder::new(
        left,
        right,
        vec![(column("l_k", 0), column("r_k", 0))],
        join_type,
    )
    .with_filter(filtered.then(filter))
    .with_partition_mode(mode)
    .with_null_equality(NullEquality::NullEqualsNothing)
    .build()
    .unwrap()
}

fn context(limit: Option<usize>) -> Arc<TaskContext> {
    let mut runtime = RuntimeEnv::default();
    if let Some(limit) = limit {
        runtime.memory_pool = Arc::new(QueryMemory::new(
            limit,
            Arc::new(MemoryBudget::new(1 << 40)),
        ));
    }
    let config = datafusion::prelude::SessionConfig::new().with_batch_size(4096);
    Arc::new(
        TaskContext::default()
            .with_session_config(config)
            .with_runtime(Arc::new(runtime)),
    )
}

/// Every row as text, sorted.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            out.push(cells.join("|"));
        }
    }
    out.sort();
    out
}

fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    plan.metrics()
        .map(|m| {
            m.iter()
                .filter(|metric| metric.value().name() == name)
                .map(|metric| metric.value().as_usize())
                .sum()
        })
        .unwrap_or(0)
}

/// Check every join type; `path` is the counter of the spilled path the
/// shape must take ("spilled_parts", "spilled_splits", "spilled_chunks").
async fn check(
    shape: Shape,
    build_rows: usize,
    probe_rows: usize,
    limit: usize,
    path: &str,
) -> Result<()> {
    check_types(shape, build_rows, probe_rows, limit, path, &ALL_TYPES).await
}

const ALL_TYPES: [JoinType; 10] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::RightSemi,
    JoinType::LeftAnti,
    JoinType::RightAnti,
    JoinType::LeftMark,
    JoinType::RightMark,
];

async fn check_types(
    shape: Shape,
    build_rows: usize,
    probe_rows: usize,
    limit: usize,
    path: &str,
    types: &[JoinType],
) -> Result<()> {
    let build = table("l", build_rows, shape, 7);
    let probe = probe_table(probe_rows);
    for mode in [PartitionMode::CollectLeft, PartitionMode::Partitioned] {
        for &join_type in types {
            if mode == PartitionMode::Partitioned
                && matches!(join_type, JoinType::LeftMark | JoinType::RightMark)
            {
                continue; // DataFusion's mark joins collect their left side
            }
            for filtered in [false, true] {
                let plain: Arc<dyn ExecutionPlan> =
                    Arc::new(join(&build, &probe, join_type, mode, filtered));
                let expected = rows(&collect(plain, context(None)).await?);
                let spilling: Arc<dyn ExecutionPlan> = Arc::new(
                    SpillingHashJoinExec::try_new(&join(
                        &build, &probe, join_type, mode, filtered,
                    ))?
                    .expect("wrapped"),
                );
                let got = collect(Arc::clone(&spilling), context(Some(limit)))
                    .await
                    .map_err(|e| {
                        e.context(format!(
                            "{shape:?} {mode:?} {join_type} filtered {filtered}"
                        ))
                    })?;
                let what = format!("{shape:?} {mode:?} {join_type} filtered {filtered}");
                assert!(metric(&spilling, "spill_count") > 0, "{what}: it spilled");
                assert_eq!(rows(&got), expected, "{what}");
                assert!(metric(&spilling, path) > 0, "{what}: {path}");
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_joins_equal_in_memory_joins_on_uniform_keys() -> Result<()> {
    check(Shape::Uniform, 60_000, 20_000, 1 << 20, "spilled_parts").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_parts_too_big_for_memory_are_split_again() -> Result<()> {
    // Splitting does not depend on the join type: a few of them.
    let types = [
        JoinType::Inner,
        JoinType::Full,
        JoinType::LeftAnti,
        JoinType::RightSemi,
    ];
    check_types(
        Shape::Uniform,
        150_000,
        20_000,
        256 << 10,
        "spilled_splits",
        &types,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_joins_equal_in_memory_joins_on_skewed_keys() -> Result<()> {
    check(Shape::Skewed, 60_000, 20_000, 1 << 20, "spilled_chunks").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_joins_of_one_key_go_in_chunks() -> Result<()> {
    // 5,000 build rows of key 7 against ~4 probe rows of it.
    check(Shape::OneKey, 20_000, 20_000, 512 << 10, "spilled_chunks").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_fits_does_not_spill() -> Result<()> {
    let build = table("l", 10_000, Shape::Uniform, 3);
    let probe = probe_table(10_000);
    let plain: Arc<dyn ExecutionPlan> = Arc::new(join(
        &build,
        &probe,
        JoinType::Inner,
        PartitionMode::CollectLeft,
        true,
    ));
    let expected = rows(&collect(plain, context(None)).await?);
    let spilling: Arc<dyn ExecutionPlan> = Arc::new(
        SpillingHashJoinExec::try_new(&join(
            &build,
            &probe,
            JoinType::Inner,
            PartitionMode::CollectLeft,
            true,
        ))?
        .expect("wrapped"),
    );
    let got = collect(Arc::clone(&spilling), context(Some(64 << 20))).await?;
    assert_eq!(rows(&got), expected);
    assert_eq!(metric(&spilling, "spill_count"), 0);
    Ok(())
}
