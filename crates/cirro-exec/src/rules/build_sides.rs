//! Build sides and partition modes of hash joins from row estimates, after
//! DataFusion's `JoinSelection` and before the repartitions go in.
//!
//! DataFusion picks a hash join's build side by the inputs' estimated bytes
//! where both are known, and a join's output is estimated at its inputs'
//! bytes, so the estimate of a semi join's output is as large as its
//! inputs together. TPC-H Q21's `NOT EXISTS` became a right anti join that
//! built a hash table of 38 M lineitem rows (1.2 GB, 3 s) to probe it with
//! 0.7 M rows. And it collects a build side into one hash table
//! (`CollectLeft`) only under 1 MB or 128 K rows; above that both inputs are
//! repartitioned by the key (`Partitioned`), so a join with 0.7 M rows on
//! its build side repartitions its 60 M-row probe side, which costs more
//! than the join itself on two cores.
//!
//! This rule, per hash join, from the inputs' estimated rows:
//! 1. a semi or anti join builds the smaller input: where the build side's
//!    rows exceed [`SWAP_RATIO`] × the probe side's, the inputs swap (a
//!    right anti join becomes a left anti join: same rows);
//! 2. a partitioned join whose build side has at most [`COLLECT_ROWS_MAX`]
//!    rows and whose probe side has [`COLLECT_RATIO`] × as many or more
//!    collects its build side instead: one hash table, built once, probed
//!    by every partition of the probe side as it comes, unrepartitioned.
//!    On a cluster every task of the probe side's stage builds that table
//!    from the whole build side, sent to each (a broadcast). So there the
//!    copies together (`stage_tasks` times the build side) must also stay
//!    within the bound, or the probe side be 8× their bytes (rows times the
//!    estimated width of a row, [`row_width`]): TPC-H Q9 at SF 10 broadcast
//!    3.3 M wide lines (eight columns) to each of 3 nodes, whose hash tables
//!    (0.8 GB each) spilled, where a shuffle of those lines and the 15 M
//!    narrow orders builds them once; Q3's 1.4 M orders (key, date,
//!    priority) against 32 M lines (key, price, discount) stay broadcast, as
//!    a shuffle would move the lines. Bytes, not rows, as what a broadcast
//!    costs is the bytes sent and held per copy. And on a cluster of t
//!    tasks a build side B is broadcast under a probe side P of fewer than
//!    [`COLLECT_RATIO`] × its rows where P ≥ (2t − 1)·B in rows and in
//!    bytes: a shuffle sends (t − 1)/t of both sides over the network and
//!    hashes B once, a broadcast sends t − 1 copies of B and hashes it t
//!    times, which costs less past that ratio, a row sent counted as a row
//!    hashed. (At P ≥ t·B, TPC-H Q21 at SF1 on 3 nodes broadcast its
//!    0.7 M orders of status 'F' to the 3 tasks: 307 ms → 390 ms; Q12, its
//!    filtered lineitem, 31 K rows, against 1.5 M orders shuffled whole:
//!    78 ms → 40 ms.) (Small build sides stay
//!    broadcast whatever the ratio: asking 8× the copies of every join
//!    turned TPC-H Q2's and Q20's small broadcasts into shuffles, 0.5 s more
//!    each at SF 10.)
//!
//! Null-aware anti joins (`NOT IN`) keep their sides and mode. A probe side
//! already hash-partitioned (a bucketed table: the join is co-located, no
//! repartition to save) is not collected against, and neither is anything
//! where the session set DataFusion's `hash_join_single_partition_threshold`
//! or `…_rows` to 0 (collect nothing). Off with
//! `SET cirro_join_order.build_sides = off`.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::JoinSide;
use datafusion::common::Result;
use datafusion::common::stats::Statistics;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::JoinType;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr::utils::split_conjunction;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use super::aggregation::distinct_values;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::JoinOrderOptions;

/// A semi or anti join swaps its inputs where the build side is estimated
/// at more than this many times the probe side's rows.
pub const SWAP_RATIO: f64 = 4.0;

/// The most estimated rows of a build side that one task collects, by
/// default (`SET cirro_join_order.collect_rows_max`).
pub const COLLECT_ROWS_MAX: usize = 4_000_000;

/// A build side is collected only under a probe side this many times larger.
pub const COLLECT_RATIO: f64 = 8.0;

#[derive(Debug, Default)]
pub struct BuildSides;

/// DataFusion's statistics of `plan`'s output (computed from the leaves up,
/// as its join selection does: an operator's own `partition_statistics` no
/// longer derives them from its inputs). One `context` serves all the
/// estimates of one join: it keeps each node's statistics once computed.
pub(super) fn statistics(
    context: &StatisticsContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<Arc<Statistics>> {
    context.compute(plan.as_ref(), &StatisticsArgs::new()).ok()
}

/// DataFusion's estimated rows of `plan`'s output, where it has one.
pub(super) fn estimated_rows(
    context: &StatisticsContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<f64> {
    statistics(context, plan)?
        .num_rows
        .get_value()
        .map(|n| *n as f64)
}

/// The estimated rows of `plan`'s output, and whether they differ from
/// DataFusion's estimate.
///
/// DataFusion estimates an inner join on several keys from its most
/// selective key alone (Spark's conservative rule): TPC-H Q9's lineitem
/// joined to partsupp (and the green parts) on partkey and suppkey counts
/// as finding every part's 30 lines, 48 M rows, not the 3.3 M that match
/// the pairs, and the join above it then builds its hash table on all 15 M
/// orders instead of those lines. Here such a join divides the product of
/// its inputs' rows by the larger side's distinct key combinations: the
/// product of its keys' distinct counts, at most that side's rows. The
/// corrected count carries up through the operators that keep their input's
/// rows, filters (by DataFusion's selectivity) and inner joins (in
/// proportion to their inputs); elsewhere DataFusion's estimate stands.
pub(super) fn rows(
    context: &StatisticsContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<(f64, bool)> {
    let estimate = estimated_rows(context, plan);
    if let Some(join) = plan.downcast_ref::<HashJoinExec>()
        && *join.join_type() == JoinType::Inner
    {
        let ((left, l_fixed), (right, r_fixed)) =
            (rows(context, join.left())?, rows(context, join.right())?);
        if let Some(pairs) = key_distincts(context, join)
            && pairs.len() >= 2
        {
            // The distinct combinations of each side's keys.
            let l = pairs
                .iter()
                .map(|p| p.0)
                .product::<f64>()
                .min(left)
                .max(1.0);
            let r = pairs
                .iter()
                .map(|p| p.1)
                .product::<f64>()
                .min(right)
                .max(1.0);
            let own = left * right / l.max(r);
            return Some((own, estimate.is_none_or(|e| (e - own).abs() > 0.5)));
        }
        if l_fixed || r_fixed {
            let (dl, dr) = (
                estimated_rows(context, join.left())?,
                estimated_rows(context, join.right())?,
            );
            let scale = (left / dl.max(1.0)) * (right / dr.max(1.0));
            return Some((estimate? * scale, true));
        }
        return Some((estimate?, false));
    }
    let keeps_rows = plan.is::<ProjectionExec>()
        || plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<CooperativeExec>()
        || plan.is::<FilterExec>();
    if keeps_rows && let [child] = plan.children().as_slice() {
        let (child_rows, fixed) = rows(context, child)?;
        if fixed {
            let ratio = estimate? / estimated_rows(context, child)?.max(1.0);
            return Some((child_rows * ratio, true));
        }
    }
    Some((estimate?, false))
}

/// The estimated bytes of one row of `plan`'s output: fixed-width columns
/// by their type, others by DataFusion's estimated byte size of the column
/// per row where it has one, else [`VARIABLE_WIDTH`].
fn row_width(context: &StatisticsContext, plan: &Arc<dyn ExecutionPlan>) -> f64 {
    let stats = statistics(context, plan);
    let rows = stats
        .as_ref()
        .and_then(|s| s.num_rows.get_value().copied())
        .filter(|rows| *rows > 0);
    let schema = plan.schema();
    let width = |(index, field): (usize, &FieldRef)| -> f64 {
        if let Some(width) = field.data_type().primitive_width() {
            return width as f64;
        }
        if *field.data_type() == DataType::Boolean {
            return 1.0;
        }
        let bytes = stats
            .as_ref()
            .and_then(|s| s.column_statistics.get(index))
            .and_then(|c| c.byte_size.get_value().copied());
        match (bytes, rows) {
            (Some(bytes), Some(rows)) => bytes as f64 / rows as f64,
            _ => VARIABLE_WIDTH,
        }
    };
    schema
        .fields()
        .iter()
        .enumerate()
        .map(width)
        .sum::<f64>()
        .max(1.0)
}

/// The bytes a row's value of a variable-width column is taken to hold where
/// the statistics do not say.
const VARIABLE_WIDTH: f64 = 24.0;

/// The distinct values of each pair of columns an inner join makes equal
/// (left's, right's): its keys and the equalities of its filter (where
/// [`super::JoinOnGroupKeys`] put all keys but one); None where a count is
/// unknown.
fn key_distincts(context: &StatisticsContext, join: &HashJoinExec) -> Option<Vec<(f64, f64)>> {
    let (left, right) = (
        statistics(context, join.left())?,
        statistics(context, join.right())?,
    );
    let mut pairs = Vec::new();
    for (l, r) in join.on() {
        pairs.push((distinct_values(&left, l)?, distinct_values(&right, r)?));
    }
    let column = |index: usize| -> Arc<dyn PhysicalExpr> { Arc::new(Column::new("key", index)) };
    if let Some(filter) = join.filter() {
        for conjunct in split_conjunction(filter.expression()) {
            let Some(equal) = conjunct.downcast_ref::<BinaryExpr>() else {
                continue;
            };
            let (Some(a), Some(b)) = (
                equal.left().downcast_ref::<Column>(),
                equal.right().downcast_ref::<Column>(),
            ) else {
                continue;
            };
            if *equal.op() != Operator::Eq {
                continue;
            }
            let indices = filter.column_indices();
            let (a, b) = (indices.get(a.index())?, indices.get(b.index())?);
            let (l, r) = match (a.side, b.side) {
                (JoinSide::Left, JoinSide::Right) => (a.index, b.index),
                (JoinSide::Right, JoinSide::Left) => (b.index, a.index),
                _ => continue,
            };
            pairs.push((
                distinct_values(&left, &column(l))?,
                distinct_values(&right, &column(r))?,
            ));
        }
    }
    Some(pairs)
}

/// What the rule does to one join (see the module docs), if anything;
/// `collect`: the most rows of a build side one task collects (0: the
/// session lets no join collect its build side); `tasks`: the tasks that
/// each build a collected side (the stage's, see the module docs).
fn rewrite(
    join: &HashJoinExec,
    collect: f64,
    tasks: f64,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if join.null_aware {
        return Ok(None);
    }
    let context = StatisticsContext::new();
    let (Some((build, build_fixed)), Some((probe, probe_fixed))) =
        (rows(&context, join.left()), rows(&context, join.right()))
    else {
        return Ok(None);
    };
    let semi_or_anti = matches!(
        join.join_type(),
        JoinType::LeftSemi | JoinType::RightSemi | JoinType::LeftAnti | JoinType::RightAnti
    );
    let mode = *join.partition_mode();
    let (left_width, right_width) = (
        row_width(&context, join.left()),
        row_width(&context, join.right()),
    );
    // A build side of `build` rows (`build_width` bytes each) is collected
    // and broadcast to the tasks of `probe_side`.
    let collects = |build: f64,
                    build_width: f64,
                    probe: f64,
                    probe_width: f64,
                    probe_side: &Arc<dyn ExecutionPlan>| {
        let (build_bytes, probe_bytes) = (build * build_width, probe * probe_width);
        mode == PartitionMode::Partitioned
            && !matches!(probe_side.output_partitioning(), Partitioning::Hash(..))
            && build <= collect
            && (probe >= COLLECT_RATIO * build
                // On a cluster: the copies cost less than the shuffle, in
                // rows hashed and in bytes sent (see the module docs).
                || (tasks > 1.0
                    && probe >= (2.0 * tasks - 1.0) * build
                    && probe_bytes >= (2.0 * tasks - 1.0) * build_bytes))
            && (build * tasks <= collect || probe_bytes >= COLLECT_RATIO * build_bytes * tasks)
    };
    // An inner join's sides are DataFusion's choice (by bytes) unless a
    // multi-key join below was misjudged (see [`rows`]).
    let misjudged = *join.join_type() == JoinType::Inner && (build_fixed || probe_fixed);
    if (semi_or_anti || misjudged) && join.join_type().supports_swap() && build > SWAP_RATIO * probe
    {
        let swapped_mode = if collects(probe, right_width, build, left_width, join.left()) {
            PartitionMode::CollectLeft
        } else {
            mode
        };
        return join.swap_inputs(swapped_mode).map(Some);
    }
    if collects(build, left_width, probe, right_width, join.right()) {
        let collected = join
            .builder()
            .with_partition_mode(PartitionMode::CollectLeft)
            .build()?;
        return Ok(Some(Arc::new(collected)));
    }
    Ok(None)
}

impl PhysicalOptimizerRule for BuildSides {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = config.extensions.get::<JoinOrderOptions>();
        let on = JoinOrderOptions::switch_on(config, |o| &o.build_sides);
        if !on || !config.optimizer.join_reordering {
            return Ok(plan);
        }
        let collect = if config.optimizer.hash_join_single_partition_threshold > 0
            && config.optimizer.hash_join_single_partition_threshold_rows > 0
        {
            options.map_or(COLLECT_ROWS_MAX, |o| o.collect_rows_max) as f64
        } else {
            0.0
        };
        let tasks = options.map_or(1, |o| o.stage_tasks.max(1)) as f64;
        super::rewrite_hash_joins(plan, |join| rewrite(join, collect, tasks))
    }

    fn name(&self) -> &str {
        "cirro_build_sides"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
