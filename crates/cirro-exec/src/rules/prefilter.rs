//! Probe sides filtered by the build side's keys before a shuffle, on a
//! cluster.
//!
//! A hash join that emits its build side's rows (a semi, anti, left outer
//! or mark join: `EXISTS`, `NOT EXISTS`, `LEFT JOIN`) cannot broadcast its
//! build side, however small: every task of the probe side would emit the
//! build rows it saw matched or unmatched, so each would come out once per
//! task. `datafusion-distributed` therefore joins such a join by a shuffle
//! of both inputs (its `normalize_collect_joins`), and the probe side, often
//! a large table, crosses the network whole: TPC-H Q4 at SF 10 shuffles
//! 38 M lines to meet 0.6 M orders.
//!
//! Only probe rows whose keys the build side holds can change such a join's
//! result: a probe row that matches no build row's key neither marks a
//! build row matched nor is emitted. So this rule, before the plan is cut
//! into stages, puts a right semi join below the probe side's shuffle: the
//! build side's keys, collected and broadcast (a right semi join emits
//! probe rows only, so `datafusion-distributed` broadcasts its build side),
//! keep the probe rows that can match, and only those are shuffled. The
//! join above is unchanged and decides with its own filter and null
//! semantics. The build side is computed twice (once for its keys, by
//! operators of its own), so the
//! rule acts only where that is cheap beside the shuffle it saves, by the
//! estimates of [`super::build_sides`]:
//!
//! - the build side has at most the collect bound's rows
//!   (`collect_rows_max`): each task of the probe side builds a hash table
//!   of its keys (only the keys are broadcast, a few bytes a row, so the
//!   copies are not bounded together as a broadcast build side's are);
//! - the probe side has at least [`COLLECT_RATIO`] times the build side's
//!   rows;
//! - computing the build side shuffles nothing (no partitioned join or
//!   aggregation below it, nor a join that emits its build side's rows:
//!   computed again, it would shuffle again);
//! - the scans under the build side read at most [`RECOMPUTE_RATIO`] times
//!   the probe side's rows (a row read again from the hot-data tier and
//!   filtered costs a fraction of a shuffled row: hashed, copied into its
//!   partition's batch, encoded, sent and decoded);
//! - the build side's keys are estimated to keep at most [`KEPT_MAX`] of
//!   the probe side's rows (by the keys' distinct values: TPC-H Q13's
//!   customers hold every customer key its orders have, so a filter there
//!   would drop nothing).
//!
//! Null-aware anti joins (`NOT IN`) are left alone: a NULL among the probe
//! side's keys changes their result. A probe side already partitioned by
//! hash (a bucketed table, a co-located join) has no shuffle to save.
//!
//! A cut rule (the engine's `planner.rs`): it runs on a cluster's
//! coordinator whose statement's stages run as more than one task. `SET
//! cirro_join_order.prefilter_probes = on | off` forces it (`auto` is the
//! default).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::TreeNode;
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::StatisticsContext;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::JoinOrderOptions;
use super::aggregation::distinct_values;
use super::build_sides::{COLLECT_RATIO, COLLECT_ROWS_MAX, estimated_rows, rows, statistics};

/// The scans under a build side may read at most this many times the
/// probe side's rows for its keys to be computed a second time.
pub const RECOMPUTE_RATIO: f64 = 8.0;

/// The most of the probe side's rows (by the keys' distinct values) the
/// build side's keys may keep for the filter to be worth its work.
pub const KEPT_MAX: f64 = 0.5;

#[derive(Debug, Default)]
pub struct PrefilterProbes;

impl PhysicalOptimizerRule for PrefilterProbes {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !JoinOrderOptions::auto_switch_on(config, |o| &o.prefilter_probes, true) {
            return Ok(plan);
        }
        let options = config.extensions.get::<JoinOrderOptions>();
        let collect = options.map_or(COLLECT_ROWS_MAX, |o| o.collect_rows_max) as f64;
        super::rewrite_hash_joins(plan, |join| prefilter(join, collect))
    }

    fn name(&self) -> &str {
        "cirro_prefilter_probes"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` without a hash repartition on top, and that repartition's
/// partitioning (None where there is none).
fn below_shuffle(
    plan: &Arc<dyn ExecutionPlan>,
) -> (&Arc<dyn ExecutionPlan>, Option<&Partitioning>) {
    match plan.downcast_ref::<RepartitionExec>() {
        Some(shuffle) if matches!(shuffle.partitioning(), Partitioning::Hash(..)) => {
            (shuffle.input(), Some(shuffle.partitioning()))
        }
        _ => (plan, None),
    }
}

/// Whether a join emits its build side's rows (a semi, anti, left outer,
/// full or mark join): on a cluster it cannot broadcast its build side.
fn emits_build_rows(join: &HashJoinExec) -> bool {
    matches!(
        join.join_type(),
        JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::Left
            | JoinType::LeftMark
            | JoinType::Full
    )
}

/// Whether computing `plan` shuffles rows: a hash repartition (a
/// partitioned join or aggregation below), or a join that emits its
/// build side's rows and collects it, which `datafusion-distributed` turns
/// into a join by a shuffle of both inputs. Computed again for its keys,
/// it would shuffle them again (TPC-H Q21's build side joins its lines
/// with 7 M orders by a shuffle; its anti join's build side holds the semi
/// join, and with it every copy below).
fn shuffles(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.exists(|node| {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            return Ok(emits_build_rows(join)
                && *join.partition_mode() == PartitionMode::CollectLeft
                && !runs_as_one_task(join));
        }
        Ok(node
            .downcast_ref::<RepartitionExec>()
            .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..))))
    })
    .unwrap_or(true)
}

/// Whether a collecting join reads its inputs in one partition each (one
/// task: nothing of it is shuffled).
fn runs_as_one_task(join: &HashJoinExec) -> bool {
    join.left().output_partitioning().partition_count() <= 1
        && below_shuffle(join.right())
            .0
            .output_partitioning()
            .partition_count()
            <= 1
}

/// The rows the scans (the leaves) under `plan` read, by DataFusion's
/// estimates; None where one is unknown.
fn scanned_rows(context: &StatisticsContext, plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
    let children = plan.children();
    if children.is_empty() {
        return estimated_rows(context, plan);
    }
    children
        .into_iter()
        .map(|child| scanned_rows(context, child))
        .sum()
}

/// The share of the probe side's rows whose keys the build side holds, by
/// the distinct values of each pair of keys (integer keys without a
/// distinct count by their range; a side's rows where neither is known,
/// the build side's rows at most): the least of each key's build distincts
/// over its probe distincts, at most 1. None where the statistics are
/// unknown (the rule then leaves the join).
fn kept_share(
    context: &StatisticsContext,
    join: &HashJoinExec,
    build: &Arc<dyn ExecutionPlan>,
    probe: &Arc<dyn ExecutionPlan>,
    build_rows: f64,
    probe_rows: f64,
) -> Option<f64> {
    let (build_stats, probe_stats) = (statistics(context, build)?, statistics(context, probe)?);
    let mut share = 1.0_f64;
    for (build_key, probe_key) in join.on() {
        let b = distinct_values(&build_stats, build_key).map_or(build_rows, |d| d.min(build_rows));
        let p = distinct_values(&probe_stats, probe_key).unwrap_or(probe_rows);
        share = share.min(b / p.max(1.0));
    }
    Some(share.min(1.0))
}

/// `join` with its probe side filtered by its build side's keys (see the
/// module docs), or None where the rule leaves it.
fn prefilter(join: &HashJoinExec, collect: f64) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    // A full join's probe rows are emitted matched or not: all must stay.
    let mode = *join.partition_mode();
    if !emits_build_rows(join)
        || *join.join_type() == JoinType::Full
        || join.null_aware
        || !matches!(
            mode,
            PartitionMode::Partitioned | PartitionMode::CollectLeft
        )
    {
        return Ok(None);
    }
    let (probe, shuffle) = below_shuffle(join.right());
    if mode == PartitionMode::CollectLeft && runs_as_one_task(join) {
        return Ok(None); // nothing is shuffled
    }
    if shuffle.is_none() && matches!(probe.output_partitioning(), Partitioning::Hash(..)) {
        return Ok(None); // co-located: nothing is shuffled
    }
    let build = match join.left().downcast_ref::<CoalescePartitionsExec>() {
        Some(collected) if collected.fetch().is_none() => collected.input(),
        _ => below_shuffle(join.left()).0,
    };
    let context = StatisticsContext::new();
    let (Some((build_rows, _)), Some((probe_rows, _)), Some(scanned)) = (
        rows(&context, build),
        rows(&context, probe),
        scanned_rows(&context, build),
    ) else {
        return Ok(None);
    };
    let kept = kept_share(&context, join, build, probe, build_rows, probe_rows);
    log::debug!(
        "prefilter of a {} join: build {build_rows:.0} rows (scans {scanned:.0}), probe \
         {probe_rows:.0} rows, {kept:?} kept",
        join.join_type()
    );
    if build_rows > collect
        || shuffles(build)
        || probe_rows < COLLECT_RATIO * build_rows
        || scanned > RECOMPUTE_RATIO * probe_rows
        || kept.is_none_or(|share| share > KEPT_MAX)
    {
        return Ok(None);
    }
    // The build side's keys only, as `k0`, `k1`, …: what is broadcast.
    // Computed by operators of their own: one operator executed from two
    // places shares its run's state between them (a collecting join's
    // build side, the rows a semi join has matched, a repartition's
    // channels), which a plan that stays on one node would run as it is.
    let build = reset_plan_states(Arc::clone(build))?;
    let keys: Vec<ProjectionExpr> = join
        .on()
        .iter()
        .enumerate()
        .map(|(i, (key, _))| ProjectionExpr::new(Arc::clone(key), format!("k{i}")))
        .collect();
    let keys: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(keys, build)?);
    let on = join
        .on()
        .iter()
        .enumerate()
        .map(|(i, (_, probe_key))| {
            (
                Arc::new(Column::new(&format!("k{i}"), i)) as Arc<dyn PhysicalExpr>,
                Arc::clone(probe_key),
            )
        })
        .collect();
    let filtered: Arc<dyn ExecutionPlan> = Arc::new(HashJoinExec::try_new(
        Arc::new(CoalescePartitionsExec::new(keys)),
        Arc::clone(probe),
        on,
        None,
        &JoinType::RightSemi,
        None,
        PartitionMode::CollectLeft,
        join.null_equality(),
        false,
    )?);
    let probe_side = match shuffle {
        Some(partitioning) => Arc::new(RepartitionExec::try_new(filtered, partitioning.clone())?),
        None => filtered,
    };
    join.builder()
        .with_new_children(vec![Arc::clone(join.left()), probe_side])?
        .build_exec()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::{collect, displayable};
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::collections::HashSet;

    /// Orders (200) joined with their customers (40) and kept where a line
    /// (4,000) of another supplier exists: a semi join whose build side is a
    /// collecting inner join and whose probe side is 20 times its size.
    async fn context() -> SessionContext {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        for sql in [
            "CREATE TABLE c AS SELECT value AS ck FROM generate_series(1, 40)",
            "CREATE TABLE o AS SELECT value AS ok, value % 50 AS ck, value % 7 AS s \
             FROM generate_series(1, 200)",
            "CREATE TABLE l AS SELECT value % 400 AS ok, value % 5 AS s \
             FROM generate_series(1, 4000)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        ctx
    }

    const QUERY: &str = "SELECT count(*), sum(o.ok) FROM o JOIN c ON o.ck = c.ck \
                         WHERE EXISTS (SELECT 1 FROM l WHERE l.ok = o.ok AND l.s <> o.s)";

    async fn plan(ctx: &SessionContext) -> Arc<dyn ExecutionPlan> {
        ctx.sql(QUERY)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap()
    }

    /// Every operator that has inputs, once per place it runs in.
    fn operators(plan: &Arc<dyn ExecutionPlan>, seen: &mut HashSet<usize>) -> bool {
        let children = plan.children();
        if !children.is_empty() && !seen.insert(Arc::as_ptr(plan) as *const () as usize) {
            return false;
        }
        children.into_iter().all(|child| operators(child, seen))
    }

    #[tokio::test]
    async fn the_build_sides_keys_are_computed_by_operators_of_their_own() {
        let ctx = context().await;
        let plain = plan(&ctx).await;
        let filtered = PrefilterProbes
            .optimize(plan(&ctx).await, ctx.state().config_options())
            .unwrap();
        let text = displayable(filtered.as_ref()).indent(false).to_string();
        assert!(text.contains("join_type=RightSemi"), "{text}");
        assert!(text.contains("join_type=LeftSemi"), "{text}");
        // One operator run from two places would share its state (the
        // collecting join's build side, a repartition's channels).
        assert!(operators(&filtered, &mut HashSet::new()), "{text}");
        let answer = |plan| async {
            let batches = collect(plan, ctx.task_ctx()).await.unwrap();
            datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string()
        };
        let (expected, got) = (answer(plain).await, answer(filtered).await);
        assert_eq!(got, expected);
        assert!(!expected.contains("| 0 "), "{expected}");
    }
}
