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
//!
//! Null-aware anti joins (`NOT IN`) keep their sides and mode. A probe side
//! already hash-partitioned (a bucketed table: the join is co-located, no
//! repartition to save) is not collected against, and neither is anything
//! where the session set DataFusion's `hash_join_single_partition_threshold`
//! or `…_rows` to 0 (collect nothing). Off with
//! `SET cirro_join_order.build_sides = off`.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::JoinType;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::JoinOrderOptions;

/// A semi or anti join swaps its inputs where the build side is estimated
/// at more than this many times the probe side's rows.
pub const SWAP_RATIO: f64 = 4.0;

/// The most estimated rows of a build side that one task collects.
pub const COLLECT_ROWS_MAX: f64 = 4_000_000.0;

/// A build side is collected only under a probe side this many times larger.
pub const COLLECT_RATIO: f64 = 8.0;

#[derive(Debug, Default)]
pub struct BuildSides;

/// The estimated rows of `plan`'s output, where DataFusion has an estimate
/// (computed from the leaves up, as its join selection does: an operator's
/// own `partition_statistics` no longer derives them from its inputs).
fn rows(plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
    let statistics = StatisticsContext::new()
        .compute(plan.as_ref(), &StatisticsArgs::new())
        .ok()?;
    statistics.num_rows.get_value().map(|n| *n as f64)
}

/// What the rule does to one join (see the module docs), if anything;
/// `collect`: whether the session lets joins collect their build sides.
fn rewrite(join: &HashJoinExec, collect: bool) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if join.null_aware {
        return Ok(None);
    }
    let (Some(build), Some(probe)) = (rows(join.left()), rows(join.right())) else {
        return Ok(None);
    };
    let semi_or_anti = matches!(
        join.join_type(),
        JoinType::LeftSemi | JoinType::RightSemi | JoinType::LeftAnti | JoinType::RightAnti
    );
    let mode = *join.partition_mode();
    let collects = |build: f64, probe: f64, probe_side: &Arc<dyn ExecutionPlan>| {
        collect
            && mode == PartitionMode::Partitioned
            && !matches!(probe_side.output_partitioning(), Partitioning::Hash(..))
            && sizes_collect(build, probe)
    };
    if semi_or_anti && join.join_type().supports_swap() && build > SWAP_RATIO * probe {
        let swapped_mode = if collects(probe, build, join.left()) {
            PartitionMode::CollectLeft
        } else {
            mode
        };
        return join.swap_inputs(swapped_mode).map(Some);
    }
    if collects(build, probe, join.right()) {
        let collected = join
            .builder()
            .with_partition_mode(PartitionMode::CollectLeft)
            .build()?;
        return Ok(Some(Arc::new(collected)));
    }
    Ok(None)
}

/// Whether a build side of `build` rows against `probe` rows is collected.
fn sizes_collect(build: f64, probe: f64) -> bool {
    build <= COLLECT_ROWS_MAX && probe >= COLLECT_RATIO * build
}

impl PhysicalOptimizerRule for BuildSides {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let on = config
            .extensions
            .get::<JoinOrderOptions>()
            .is_none_or(|o| !o.build_sides.eq_ignore_ascii_case("off"));
        if !on || !config.optimizer.join_reordering {
            return Ok(plan);
        }
        let collect = config.optimizer.hash_join_single_partition_threshold > 0
            && config.optimizer.hash_join_single_partition_threshold_rows > 0;
        super::rewrite_hash_joins(plan, |join| rewrite(join, collect))
    }

    fn name(&self) -> &str {
        "cirro_build_sides"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
