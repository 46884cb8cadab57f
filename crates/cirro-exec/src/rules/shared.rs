//! Subplans that a query computes twice, computed once: a view or CTE
//! read in two places (an aggregated CTE joined with itself). DataFusion
//! inlines it into both places and runs it twice. (TPC-H Q15, which reads
//! its `revenue` view in the join and in the subquery over its maximum, was
//! the first such query; its subquery now reads a window over the view,
//! `subquery_windows.rs`, which works on a cluster too.)
//!
//! [`SharedSubplans`], a physical optimizer rule that runs last, finds the
//! aggregations whose whole subtrees print the same (operators, expressions,
//! files) and replaces each occurrence with a [`SharedExec`] over one copy.
//! The first consumer of an output partition starts it on a task of its own
//! and keeps its batches; every consumer, that one included, reads them
//! from there. The task runs whoever polls first (no consumer waits on
//! another that is not polled: a hash join that collects its build side
//! before it reads the probe side cannot stall it), and stops when the
//! query is dropped.
//!
//! The hot-data tier's priorities do not count (the build side's copy is
//! `cache=hot`, the subquery's `normal`; the data is the same). A subtree
//! is shared only when it is made of DataFusion's deterministic operators
//! (scans, filters, projections, aggregations, hash joins, repartitions,
//! sorts) and calls no volatile function (`random()`). Dynamic filters (a
//! hash join's build-side keys, a TopK's bound, pushed into the scans
//! below) do not count either, but the copy that runs is one that none
//! reaches: such a filter only drops rows its operator would drop anyway,
//! so the unfiltered answer serves a filtered copy too, while a filtered
//! answer would be wrong for the others (Q15's join pushes its supplier
//! keys into its copy of the view; the subquery's copy must see every
//! supplier). Without an unfiltered copy nothing is shared. The output is
//! kept in memory for the query's duration, outside the memory pool:
//! aggregations only, whose results are small beside their inputs.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Volatility;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
#[allow(deprecated)] // recognised in plans that still hold one
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, displayable};

use crate::operators::filtered_aggregate::FilteredAggregateExec;
use crate::operators::run_aggregate::RunAggregateExec;
use crate::operators::shared::{SharedExec, SharedState};
use crate::operators::spill_join::SpillingHashJoinExec;

/// Whether a shared subtree may hold `plan`'s operator: DataFusion's
/// scans, filters, projections, joins, sorts, aggregations and exchanges
/// within a node, and Cirro's partial aggregations and spilling join.
fn shareable(plan: &dyn ExecutionPlan) -> bool {
    #[allow(deprecated)] // a plan may still hold one
    let coalesce_batches = plan.is::<CoalesceBatchesExec>();
    coalesce_batches
        || plan.is::<AggregateExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<CooperativeExec>()
        || plan.is::<DataSourceExec>()
        || plan.is::<FilterExec>()
        || plan.is::<FilteredAggregateExec>()
        || plan.is::<HashJoinExec>()
        || plan.is::<ProjectionExec>()
        || plan.is::<RepartitionExec>()
        || plan.is::<RunAggregateExec>()
        || plan.is::<SortExec>()
        || plan.is::<SortPreservingMergeExec>()
        || plan.is::<SpillingHashJoinExec>()
}

/// The rule; see the module documentation.
#[derive(Debug, Default)]
pub struct SharedSubplans;

impl PhysicalOptimizerRule for SharedSubplans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Each candidate's text, how often it occurs, and its first copy
        // that no dynamic filter reaches (the one that runs).
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut unfiltered: HashMap<String, Arc<dyn ExecutionPlan>> = HashMap::new();
        plan.apply(|node| {
            if let Some((text, filtered)) = candidate(node) {
                if !filtered {
                    unfiltered
                        .entry(text.clone())
                        .or_insert_with(|| Arc::clone(node));
                }
                *counts.entry(text).or_default() += 1;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        counts.retain(|text, n| *n >= 2 && unfiltered.contains_key(text));
        log::debug!("shared subplans: {} repeated", counts.len());
        if counts.is_empty() {
            return Ok(plan);
        }
        // The outermost repeated subtrees, each replaced by a SharedExec over
        // the unfiltered copy.
        let mut shared: HashMap<String, Arc<SharedState>> = HashMap::new();
        let rewritten = plan.transform_down(|node| {
            let Some((text, _)) = candidate(&node).filter(|(t, _)| counts.contains_key(t)) else {
                return Ok(Transformed::no(node));
            };
            let Some(input) = unfiltered.get(&text) else {
                return Ok(Transformed::no(node));
            };
            let state = shared.entry(text).or_insert_with(|| {
                let partitions = input.properties().output_partitioning().partition_count();
                Arc::new(SharedState::new(Arc::clone(input), partitions))
            });
            let exec = SharedExec::new(Arc::clone(state));
            Ok(Transformed::new(
                Arc::new(exec) as Arc<dyn ExecutionPlan>,
                true,
                TreeNodeRecursion::Jump,
            ))
        })?;
        Ok(rewritten.data)
    }

    fn name(&self) -> &str {
        "cirro_shared_subplans"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The text of `node`'s subtree without its dynamic filters, and whether
/// it has any, if it may be shared: an aggregation's final phase over
/// shareable operators only.
fn candidate(node: &Arc<dyn ExecutionPlan>) -> Option<(String, bool)> {
    let aggregate = node.downcast_ref::<AggregateExec>()?;
    if matches!(
        aggregate.mode(),
        AggregateMode::Partial | AggregateMode::PartialReduce
    ) {
        return None;
    }
    let mut ok = true;
    node.apply(|n| {
        if !shareable(n.as_ref()) || volatile(n.as_ref()) {
            ok = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .ok()?;
    if !ok {
        return None;
    }
    let text = displayable(node.as_ref()).indent(true).to_string();
    let filtered = text.contains("DynamicFilter");
    let text = without_dynamic_filters(&without_cache_priorities(&text));
    // A dynamic filter that does not print as planned (`[ empty ]`) is
    // not recognised: no sharing.
    (!text.contains("DynamicFilter")).then_some((text, filtered))
}

/// `text` without the dynamic filters the planner put in scans' predicates
/// (`… AND DynamicFilter [ empty ]`), as planned, before they are filled.
fn without_dynamic_filters(text: &str) -> String {
    text.replace(" AND DynamicFilter [ empty ]", "")
        .replace("predicate=DynamicFilter [ empty ], ", "")
        .replace(", dynamic_rg_pruning=eligible", "")
}

/// `text` without the hot-data tier's priorities (`, cache=hot`): the
/// copies read the same data whatever priority each would give it.
fn without_cache_priorities(text: &str) -> String {
    const MARK: &str = ", cache=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let after = &rest[at + MARK.len()..];
        let end = after
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Whether an expression of `node` calls a volatile function.
fn volatile(node: &dyn ExecutionPlan) -> bool {
    let mut found = false;
    let _ = node.apply_expressions(&mut |expr: &Arc<dyn PhysicalExpr>| {
        expr.apply(|e| {
            if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>()
                && f.fun().signature().volatility == Volatility::Volatile
            {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_priorities_do_not_count() {
        let hot = "DataSourceExec: projection=[a], cache=hot\n  FilterExec: a > 1, cache=lookup_2";
        let normal = "DataSourceExec: projection=[a], cache=normal\n  FilterExec: a > 1";
        assert_eq!(
            without_cache_priorities(hot),
            "DataSourceExec: projection=[a]\n  FilterExec: a > 1"
        );
        assert_eq!(
            without_cache_priorities(hot),
            without_cache_priorities(normal)
        );
        assert_eq!(without_cache_priorities("no mark"), "no mark");
    }

    #[test]
    fn dynamic_filters_do_not_count() {
        let filtered = "DataSourceExec: projection=[a], predicate=a@0 > 1 AND DynamicFilter [ empty ], \
                        dynamic_rg_pruning=eligible, pruning_predicate=a_max@0 > 1\n\
                        DataSourceExec: projection=[b], predicate=DynamicFilter [ empty ], \
                        dynamic_rg_pruning=eligible";
        let plain = "DataSourceExec: projection=[a], predicate=a@0 > 1, pruning_predicate=a_max@0 > 1\n\
                     DataSourceExec: projection=[b]";
        assert_eq!(without_dynamic_filters(filtered), plain);
    }
}
