//! Adaptive aggregation: the strategy of each grouped aggregation chosen from
//! the number of groups its input is expected to hold.
//!
//! DataFusion aggregates in two phases: a partial aggregation per thread, a
//! hash repartition of its output by the group keys into one partition per
//! thread, and a final aggregation per partition. That is right for few
//! groups (the partial phase shrinks the data to a few rows per thread). With
//! many groups each thread's hash table outgrows the CPU caches: 600,000
//! groups of four keys over 40 M rows took 3.2 s, and DataFusion's own
//! adaptivity (skipping the partial phase once it sees it does not shrink the
//! data) helps little, because the final tables are as large.
//!
//! For many groups this rule takes the high-cardinality path (CirroData's):
//! no partial phase; the input is hash-partitioned by the group keys into
//! more partitions than threads ("radix" partitions, each about
//! [`AggregationOptions::partition_groups`] groups, a power of two, at most
//! 256) and each partition is aggregated alone (`AggregateExec:
//! mode=SinglePartitioned` under `RepartitionExec: partitioning=Hash(…, P)`
//! in EXPLAIN). Every hash table is then small enough to stay in cache; the
//! threads work through the partitions. The same query: 3.2 s → 1.6 s.
//!
//! The number of groups is estimated from the input's statistics: the
//! product, over the group keys, of each key's distinct count (what `ANALYZE`
//! kept, reported by the scans) or, for integer and date keys, its value
//! range (the min/max of the Parquet footers), plus one for NULL, capped by
//! the row count.
//! When a key has neither, the plan stays DataFusion's.
//!
//! Where the data files hold disjoint ranges of a key (data written in key
//! order, see [`clustered`]), each thread meets a key's rows together: the
//! partial phase aggregates those runs of equal keys without a hash table
//! ([`RunAggregateExec`]), shrinking the data to about one row per key
//! before the shuffle into the radix partitions and the final phase (TPC-H
//! SF10 Q18: 60 M lineitem rows to 15 M). With `SET cirro_aggregation.runs
//! = false` the earlier choice stays: DataFusion's hashed partial phase
//! while each thread's share of the groups is at most
//! [`AggregationOptions::clustered_groups_max`], the high-cardinality path
//! beyond.
//!
//! `SET adaptive_aggregation = off | on | force`: `off` leaves DataFusion's
//! plan; `on` (the default) takes the high-cardinality path when the estimate
//! reaches [`AggregationOptions::min_groups`]; `force` takes it for every
//! grouped two-phase aggregation whose radix partitions would outnumber the
//! threads (an estimate above `threads × partition_groups`, or none: 64
//! partitions), whatever the threshold and the key order.
//!
//! Where the operator above needs the aggregation's output partitioned as
//! DataFusion planned it (a partitioned join on the group keys, whose other
//! input has the original count of partitions), the output is
//! hash-partitioned back to that count; elsewhere (projections, filters,
//! sorts, the statement's result) the radix partitions flow on.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::common::stats::Statistics;
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{Distribution, Partitioning, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::union::InterleaveExec;

use crate::operators::filtered_aggregate::{FilteredAggregateExec, GROUPS_HELD_MAX};
use crate::operators::run_aggregate::RunAggregateExec;

datafusion::common::extensions_options! {
    /// The session's switches of adaptive aggregation.
    pub struct AggregationOptions {
        /// `off`, `on` or `force` (`SET adaptive_aggregation`).
        pub mode: String, default = "on".to_string()
        /// Estimated groups from which `on` takes the high-cardinality path.
        pub min_groups: usize, default = 131072
        /// Groups per radix partition the high-cardinality path aims at.
        pub partition_groups: usize, default = 8192
        /// On data written in key order the partial phase stays while each
        /// thread's share of the groups is at most this many (see
        /// [`clustered`]).
        pub clustered_groups_max: usize, default = 2097152
        /// On data written in key order, aggregate runs of equal keys in
        /// the partial phase ([`RunAggregateExec`]) instead of hashing.
        pub runs: bool, default = true
        /// Fuse a partial phase expected to hold few groups with the filter
        /// below it ([`FilteredAggregateExec`]).
        pub fused_filter: bool, default = true
        /// Keep the partial phase on the high-cardinality path (for
        /// measuring; the partial tables are the ones that outgrow the
        /// caches, so it is off).
        pub keep_partial: bool, default = false
        /// On a cluster, how a grouped aggregation's rows cross the network
        /// ([`AggregationExchange`], `SET aggregation_exchange`): `auto`
        /// (from the estimated groups), `partial` (pre-aggregated on every
        /// node before the shuffle) or `rows` (the input rows shuffled to
        /// a single-phase aggregation).
        pub exchange: String, default = "auto".to_string()
        /// The statement's memory limit in bytes (0: none), set by the
        /// engine: radix partitions all run at once and each needs room to
        /// start, so there are at most one per
        /// [`RADIX_PARTITION_BYTES_MIN`] of it.
        pub memory_limit: usize, default = 0
    }
}

impl AggregationOptions {
    /// The session's settings (the defaults where it has none).
    pub(super) fn of(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<AggregationOptions>()
            .cloned()
            .unwrap_or_default()
    }
}

impl datafusion::common::config::ConfigExtension for AggregationOptions {
    const PREFIX: &'static str = "cirro_aggregation";
}

/// The partial phase of an aggregation expected to hold few groups (at
/// most [`GROUPS_HELD_MAX`]) over a filter, fused with that filter and the
/// projections between ([`FilteredAggregateExec`]): the aggregates skip the
/// rows the filter drops instead of reading a copy of the rows it keeps.
/// Placed after the expressions are compiled (the fused operator evaluates
/// the compiled ones). Off with `SET cirro_aggregation.fused_filter =
/// false` or `SET adaptive_aggregation = off`.
#[derive(Debug, Default)]
pub struct FuseFilterAggregate;

impl PhysicalOptimizerRule for FuseFilterAggregate {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = AggregationOptions::of(config);
        if options.mode == "off" || !options.fused_filter {
            return Ok(plan);
        }
        super::rewrite_each(plan, |partial: &AggregateExec| {
            if *partial.mode() != AggregateMode::Partial
                || estimate_groups(partial).is_none_or(|groups| groups > GROUPS_HELD_MAX as f64)
            {
                return Ok(None);
            }
            Ok(FilteredAggregateExec::try_from_partial(partial)
                .map(|fused| Arc::new(fused) as Arc<dyn ExecutionPlan>))
        })
    }

    fn name(&self) -> &str {
        "cirro_fuse_filter_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The most radix partitions one aggregation gets.
const MAX_PARTITIONS: usize = 256;
/// The memory limit a statement needs per radix partition: all run at once,
/// and one that cannot get room for its first batch of groups has nothing to
/// spill and fails the statement.
pub const RADIX_PARTITION_BYTES_MIN: usize = 2 << 20;
/// Radix partitions of a forced aggregation whose groups cannot be estimated.
const UNESTIMATED_PARTITIONS: usize = 64;

#[derive(Debug, Default)]
pub struct AdaptiveAggregation;

impl PhysicalOptimizerRule for AdaptiveAggregation {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = &AggregationOptions::of(config);
        let force = match options.mode.as_str() {
            "off" => return Ok(plan),
            "force" => true,
            _ => false,
        };
        let choice = Choice {
            force,
            options,
            threads: config.execution.target_partitions.max(1),
        };
        choice.rewrite(plan, true, false)
    }

    fn name(&self) -> &str {
        "cirro_adaptive_aggregation"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

struct Choice<'a> {
    force: bool,
    options: &'a AggregationOptions,
    threads: usize,
}

impl Choice<'_> {
    /// Rewrite `plan`'s aggregations; `merged`: the operator above takes
    /// `plan`'s output however it is partitioned (it does not require a hash
    /// partitioning that another input must match); `paired`: `plan` is,
    /// or leads to, the partial phase of a final phase above it in this
    /// plan.
    fn rewrite(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        merged: bool,
        paired: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let interleave = plan.is::<InterleaveExec>();
        let repartition = plan.is::<RepartitionExec>();
        let pairs = paired && repartition
            || plan
                .downcast_ref::<AggregateExec>()
                .is_some_and(|last| two_phases(last).is_some());
        let required = plan.input_distribution_requirements();
        let count = plan.properties().output_partitioning().partition_count();
        let children = plan.children();
        let mut changed = false;
        let mut new_children = Vec::with_capacity(children.len());
        for (i, child) in children.into_iter().enumerate() {
            #[expect(deprecated, reason = "DataFusion 55 still plans HashPartitioned")]
            let hashed = matches!(
                required.child_distribution(i),
                Some(Distribution::HashPartitioned(_) | Distribution::KeyPartitioned(_))
            );
            // An operator whose output has its input's partitions (a
            // projection, a filter, a join's probe side) passes the
            // requirement above it down.
            let passes =
                !repartition && child.properties().output_partitioning().partition_count() == count;
            let child_merged = !(interleave || hashed) && (merged || !passes);
            let new = self.rewrite(Arc::clone(child), child_merged, pairs)?;
            changed |= !Arc::ptr_eq(&new, child);
            new_children.push(new);
        }
        let plan = if changed {
            replace_children_if_necessary(plan, new_children)?
        } else {
            plan
        };
        if !paired && let Some(runs) = self.lone_runs(&plan) {
            return Ok(runs);
        }
        Ok(self.high_cardinality(&plan, merged)?.unwrap_or(plan))
    }

    /// `plan` as [`RunAggregateExec`], if it is a partial phase whose final
    /// phase is not in this plan (a cluster's stage that ends in a shuffle
    /// to another stage's final phase, chosen by [`AggregationExchange`]),
    /// over data written in key order, expected to hold many groups: there
    /// the hashed partial phase misses the caches on every new key, and the
    /// runs shrink the rows the network carries just as well.
    fn lone_runs(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        let partial = plan.downcast_ref::<AggregateExec>()?;
        if self.force
            || !self.options.runs
            || *partial.mode() != AggregateMode::Partial
            || partial.group_expr().is_empty()
            || !partial.group_expr().is_single()
            || estimate_groups(partial).is_none_or(|g| g < self.options.min_groups as f64)
            || !clustered(partial)
        {
            return None;
        }
        let runs = RunAggregateExec::try_from_partial(partial)?;
        Some(Arc::new(runs))
    }

    /// `plan` on the high-cardinality path, if it is a two-phase grouped
    /// aggregation that should take it.
    fn high_cardinality(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        merged: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(last) = plan.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        let Some((shuffle, partial)) = two_phases(last) else {
            return Ok(None);
        };
        let Partitioning::Hash(keys, _) = shuffle.partitioning() else {
            return Ok(None);
        };
        let estimate = estimate_groups(partial);
        let many = estimate.is_some_and(|groups| groups >= self.options.min_groups as f64);
        let clustered = !self.force && many && clustered(partial);
        let runs = if clustered && self.options.runs {
            RunAggregateExec::try_from_partial(partial)
        } else {
            None
        };
        let partitions = match estimate {
            Some(groups)
                if self.force
                    || runs.is_some()
                    || (many
                        && !(clustered
                            && groups / self.threads as f64
                                <= self.options.clustered_groups_max as f64)) =>
            {
                self.partitions(groups)
            }
            None if self.force => UNESTIMATED_PARTITIONS,
            _ => return Ok(None),
        };
        let original = last.properties().output_partitioning().clone();
        if let Some(runs) = runs {
            // Clustered keys: the partial phase over runs, its rows (about
            // one per key and thread) shuffled into the radix partitions.
            let partitions = partitions.max(shuffle.partitioning().partition_count());
            let shuffle = Arc::new(RepartitionExec::try_new(
                Arc::new(runs),
                Partitioning::Hash(keys.clone(), partitions),
            )?);
            let aggregated = replace_children_if_necessary(Arc::clone(plan), vec![shuffle])?;
            if merged || partitions == original.partition_count() {
                return Ok(Some(aggregated));
            }
            return match original {
                Partitioning::Hash(..) => Ok(Some(Arc::new(RepartitionExec::try_new(
                    aggregated, original,
                )?))),
                _ => Ok(None),
            };
        }
        if partitions <= shuffle.partitioning().partition_count() {
            return Ok(None);
        }
        let aggregated: Arc<dyn ExecutionPlan> = if self.options.keep_partial {
            let shuffle = Arc::new(RepartitionExec::try_new(
                Arc::clone(shuffle.input()),
                Partitioning::Hash(keys.clone(), partitions),
            )?);
            replace_children_if_necessary(Arc::clone(plan), vec![shuffle])?
        } else {
            match single_phase(last, partial, partitions)? {
                Some(single) => single,
                None => return Ok(None),
            }
        };
        if merged {
            return Ok(Some(aggregated));
        }
        match original {
            Partitioning::Hash(..) => Ok(Some(Arc::new(RepartitionExec::try_new(
                aggregated, original,
            )?))),
            _ => Ok(None),
        }
    }

    /// Radix partitions for `groups` groups: a power of two, at least the
    /// threads, at most [`MAX_PARTITIONS`].
    fn partitions(&self, groups: f64) -> usize {
        let wanted = (groups / self.options.partition_groups.max(1) as f64).ceil() as usize;
        let cap = match self.options.memory_limit {
            0 => MAX_PARTITIONS,
            // Rounded down: every partition keeps its share.
            limit => {
                let fit = (limit / RADIX_PARTITION_BYTES_MIN).max(1);
                (1usize << fit.ilog2()).min(MAX_PARTITIONS)
            }
        };
        wanted
            .max(self.threads)
            .next_power_of_two()
            .min(MAX_PARTITIONS)
            .min(cap.max(self.threads))
    }
}

/// `last` (a final aggregation over `partial`) as one phase: `partial`'s
/// input hash-partitioned by the group keys into `partitions`, each
/// partition aggregated alone (`SinglePartitioned`); None where the output
/// would differ from `last`'s.
fn single_phase(
    last: &AggregateExec,
    partial: &AggregateExec,
    partitions: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let shuffle = Arc::new(RepartitionExec::try_new(
        Arc::clone(partial.input()),
        Partitioning::Hash(partial.group_expr().input_exprs(), partitions),
    )?);
    let single = AggregateExec::try_new(
        AggregateMode::SinglePartitioned,
        partial.group_expr().clone(),
        partial.aggr_expr().to_vec(),
        partial.filter_expr().to_vec(),
        shuffle,
        partial.input_schema(),
    )?
    .with_limit_options(last.limit_options());
    if single.schema().fields() != last.schema().fields() {
        return Ok(None);
    }
    Ok(Some(Arc::new(single)))
}

/// How a cluster's grouped aggregation meets the network, chosen on the
/// coordinator before the network boundaries are placed (a coordinator
/// rule; on a single node [`AdaptiveAggregation`] chooses, per node).
/// DataFusion's plan aggregates in two phases: a partial aggregation in
/// every partition of every node, its rows shuffled by the group keys,
/// a final aggregation per partition. With few groups the partial phase
/// shrinks what crosses the network to a few rows per partition; with
/// about as many groups as rows it emits nearly what it reads, in its
/// wider state columns, after hashing every row once more. So:
///
/// - `partial` (pre-aggregate) when the groups estimated from the
///   statistics ([`estimated_groups`]: `ANALYZE`'s distinct counts, or the
///   value ranges of integer and date keys), times the input's partitions
///   (times one where the data files hold disjoint ranges of a key, see
///   [`clustered`]: each partition meets its own groups; the nodes then
///   aggregate runs of equal keys, [`RunAggregateExec`]), are at most half
///   the input's rows (the partial phase at least halves the rows
///   shuffled), or when the groups cannot be estimated (then
///   DataFusion's own probe still skips the partial phase at run time once
///   its first 100,000 rows made ≥ 80 % as many groups);
/// - `partial` over runs of equal keys ([`RunAggregateExec`]) where the
///   groups estimated reach [`AggregationOptions::min_groups`] (below, the
///   hashed partial phase is cheap) and the data files hold disjoint
///   ranges of a key, whatever the estimate against the rows: that
///   phase hashes nothing and emits at most a row per run, so it never
///   costs more than the shuffle it shrinks (TPC-H Q18's subquery at SF1
///   on 3 nodes: 6 M lineitem rows shuffled as 1.5 M, as the value range
///   of the sparse `l_orderkey` estimated 6 M groups);
/// - `rows` otherwise: the input rows are shuffled by the group keys into
///   the final aggregation's partitions and aggregated there in one phase
///   (`AggregateExec: mode=SinglePartitioned` above the shuffle).
///
/// `SET aggregation_exchange = partial | rows` forces either (`auto` is the
/// default); `SET adaptive_aggregation = off` leaves DataFusion's plan.
/// EXPLAIN on a cluster ends each such aggregation's line with the choice
/// and its estimate (the engine's `explain.rs`).
#[derive(Debug, Default)]
pub struct AggregationExchange;

impl PhysicalOptimizerRule for AggregationExchange {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = AggregationOptions::of(config);
        let forced = match options.exchange.to_ascii_lowercase().as_str() {
            "partial" => return Ok(plan),
            "rows" => true,
            _ if options.mode == "off" => return Ok(plan),
            _ => false,
        };
        super::rewrite_each(plan, |last: &AggregateExec| {
            let Some((shuffle, partial)) = two_phases(last) else {
                return Ok(None);
            };
            if !forced
                && options.runs
                && estimate_groups(partial).is_some_and(|g| g >= options.min_groups as f64)
                && clustered(partial)
            {
                return over_runs(last, shuffle, partial);
            }
            if !forced && !shuffle_rows(partial) {
                return Ok(None);
            }
            single_phase(last, partial, shuffle.partitioning().partition_count())
        })
    }

    fn name(&self) -> &str {
        "cirro_aggregation_exchange"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `last` with its partial phase over runs of equal keys
/// ([`RunAggregateExec`]), which the nodes then run as they are sent it
/// (their own rule cannot tell that a task's part of one file is in key
/// order); None where the aggregates cannot be.
fn over_runs(
    last: &AggregateExec,
    shuffle: &RepartitionExec,
    partial: &AggregateExec,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(runs) = RunAggregateExec::try_from_partial(partial) else {
        return Ok(None);
    };
    let shuffle = Arc::new(RepartitionExec::try_new(
        Arc::new(runs),
        shuffle.partitioning().clone(),
    )?);
    let last: Arc<dyn ExecutionPlan> = Arc::new(last.clone());
    Ok(Some(replace_children_if_necessary(last, vec![shuffle])?))
}

/// The hash shuffle and the partial aggregation below `last`, when `last`
/// is the final phase of a grouped two-phase aggregation (no grouping sets).
pub(super) fn two_phases(last: &AggregateExec) -> Option<(&RepartitionExec, &AggregateExec)> {
    if *last.mode() != AggregateMode::FinalPartitioned || last.group_expr().is_empty() {
        return None;
    }
    let shuffle = last.input().downcast_ref::<RepartitionExec>()?;
    if !matches!(shuffle.partitioning(), Partitioning::Hash(..)) {
        return None;
    }
    let partial = shuffle.input().downcast_ref::<AggregateExec>()?;
    (*partial.mode() == AggregateMode::Partial && partial.group_expr().is_single())
        .then_some((shuffle, partial))
}

/// Whether `partial`'s input is better shuffled as rows than pre-aggregated
/// (see [`AggregationExchange`]): its partial phase would not halve them.
/// Each partition's partial phase emits a row per group it meets: every
/// group in every partition at worst, but each group once where the data
/// files hold disjoint ranges of a key ([`clustered`]: the partitions read
/// disjoint files; TPC-H's lineitem by `l_orderkey`, 4 rows a group).
fn shuffle_rows(partial: &AggregateExec) -> bool {
    let Some((groups, rows)) = estimated_groups(partial.group_expr(), partial.input()) else {
        return false;
    };
    let spread = if clustered(partial) {
        1
    } else {
        partial
            .input()
            .properties()
            .output_partitioning()
            .partition_count()
            .max(1)
    };
    groups * spread as f64 * 2.0 > rows
}

/// Groups `partial`'s input is expected to hold (see [`estimated_groups`]).
fn estimate_groups(partial: &AggregateExec) -> Option<f64> {
    estimated_groups(partial.group_expr(), partial.input()).map(|(groups, _)| groups)
}

/// The groups of `group_by` that `input`'s rows are expected to hold, and
/// those rows: the product of the keys' distinct counts (a distinct count
/// from the statistics, or the value range of an integer or date key),
/// capped by the rows; None when a key has neither or the rows are unknown.
pub fn estimated_groups(
    group_by: &PhysicalGroupBy,
    input: &Arc<dyn ExecutionPlan>,
) -> Option<(f64, f64)> {
    let stats = StatisticsContext::new()
        .compute(input.as_ref(), &StatisticsArgs::new())
        .ok()?;
    let rows = *stats.num_rows.get_value()? as f64;
    let mut groups = 1f64;
    for (expr, _) in group_by.expr() {
        groups *= distinct_values(&stats, expr)?;
        if groups >= rows {
            return Some((rows, rows));
        }
    }
    Some((groups.min(rows), rows))
}

/// Whether the data files under `partial` hold disjoint ranges of one of
/// its integer or date keys (two files or more, by their footers' min/max):
/// data written in key order (a sorted load, a cluster key, a time series),
/// where each thread meets a key's rows together and its partial hash
/// table is touched where it is hot. The partial phase is then cheap and
/// shrinks the data before the shuffle (TPC-H SF1 Q18 over lineitem by
/// l_orderkey, 750 K groups a thread: 210 ms with it, 308 without) while
/// the table is small enough: at SF10 (7.5 M groups a thread) each new
/// key's insert misses the caches, and the query took 9.2 s of CPU with
/// it, 7.0 s without (hence [`AggregationOptions::clustered_groups_max`]).
/// Keys are matched
/// to the scan's columns by name, through the single-input operators
/// between (a renamed key is not recognised).
fn clustered(partial: &AggregateExec) -> bool {
    let mut node = Arc::clone(partial.input());
    let config = loop {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>() {
            match scan.data_source().downcast_ref::<FileScanConfig>() {
                Some(config) => break config.clone(),
                None => return false,
            }
        }
        let children = node.children();
        if children.len() != 1 {
            return false;
        }
        node = Arc::clone(children[0]);
    };
    let schema = config.file_schema();
    let input_schema = partial.input_schema();
    partial.group_expr().expr().iter().any(|(expr, _)| {
        let Some(column) = expr.downcast_ref::<Column>() else {
            return false;
        };
        let Some(field) = input_schema.fields().get(column.index()) else {
            return false;
        };
        let Ok(index) = schema.index_of(field.name()) else {
            return false;
        };
        let mut seen = std::collections::HashSet::new();
        let mut ranges = Vec::new();
        for file in config.file_groups.iter().flat_map(|g| g.files()) {
            if !seen.insert(file.object_meta.location.clone()) {
                continue; // another byte range of a file already counted
            }
            let stats = file
                .statistics
                .as_ref()
                .and_then(|s| s.column_statistics.get(index));
            match stats.map(|c| (c.min_value.get_value(), c.max_value.get_value())) {
                Some((Some(min), Some(max))) if countable(&min.data_type()) => {
                    ranges.push((min.clone(), max.clone()))
                }
                _ => return false,
            }
        }
        ranges.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        // A key's rows may straddle two files (a sorted write split by size).
        ranges.len() >= 2 && ranges.windows(2).all(|w| w[0].1 <= w[1].0)
    })
}

/// Distinct values of a key (NULL counts as one).
pub(super) fn distinct_values(stats: &Statistics, expr: &Arc<dyn PhysicalExpr>) -> Option<f64> {
    let column = expr.downcast_ref::<Column>()?;
    let column = stats.column_statistics.get(column.index())?;
    let nulls = match column.null_count.get_value() {
        Some(0) => 0.0,
        _ => 1.0,
    };
    if let Some(distinct) = column.distinct_count.get_value() {
        return Some(*distinct as f64 + nulls);
    }
    let (min, max) = (column.min_value.get_value()?, column.max_value.get_value()?);
    if !countable(&min.data_type()) {
        return None;
    }
    Some(max.distance_u64(min)? as f64 + 1.0 + nulls)
}

/// Whether a type's values in a range [min, max] number max - min + 1 at most.
fn countable(data_type: &DataType) -> bool {
    data_type.is_integer() || *data_type == DataType::Date32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_powers_of_two_between_threads_and_the_cap() {
        let options = AggregationOptions::default();
        let choice = Choice {
            force: false,
            options: &options,
            threads: 2,
        };
        assert_eq!(choice.partitions(10.0), 2);
        assert_eq!(choice.partitions(600_000.0), 128);
        assert_eq!(choice.partitions(40e6), MAX_PARTITIONS);
        let limited = AggregationOptions {
            memory_limit: 64 << 20,
            ..AggregationOptions::default()
        };
        let choice = Choice {
            options: &limited,
            ..choice
        };
        assert_eq!(choice.partitions(40e6), 32, "one per 2 MB of a 64 MB limit");
        let limited = AggregationOptions {
            memory_limit: 100 << 20,
            ..AggregationOptions::default()
        };
        let choice = Choice {
            options: &limited,
            ..choice
        };
        assert_eq!(choice.partitions(40e6), 32, "rounded down at 100 MB");
        assert_eq!(choice.partitions(10.0), 2);
    }
}
