//! What EXPLAIN says about joins: every join's line ends with how its
//! inputs meet —
//!
//! - `join=broadcast`: one side is collected whole and given to every
//!   partition (and task) of the other (`CollectLeft` hash joins, nested
//!   loop and cross joins);
//! - `join=co-located`: both sides arrive partitioned on the join key
//!   without an exchange for this join (bucketed tables scanned bucket by
//!   bucket, or inputs an earlier aggregation or join already partitioned);
//! - `join=shuffle`: rows of at least one side are exchanged by the hash of
//!   the key (`RepartitionExec`, across nodes `NetworkShuffleExec`).
//!
//! On a cluster, every grouped aggregation whose rows cross the network
//! ends its line with what crosses (the coordinator's choice, see
//! `cirro_exec::rules::AggregationExchange`) and the estimate behind it —
//!
//! - `aggregation=pre-aggregated (≈G groups of R rows)`: each partition of
//!   every node aggregates first, only its groups are shuffled;
//! - `aggregation=pre-aggregated over runs of equal keys (≈G groups of R
//!   rows)`: the same, the first phase aggregating runs of equal keys of
//!   data written in key order, without hashing;
//! - `aggregation=rows shuffled (≈G groups of R rows)`: the input rows are
//!   shuffled to one aggregation per partition;
//!
//! (`groups unknown` where the statistics do not tell).
//!
//! The plan is the one the statement would run; its operators are matched
//! to the EXPLAIN text by their one-line display, which is what both the
//! single-node and the distributed (staged) formats print for a node.

use std::sync::Arc;

use cirro_exec::distribution::{Distribution, Exchange};
use cirro_exec::operators::run_aggregate::RunAggregateExec;
use cirro_exec::operators::spill_join::SpillingHashJoinExec;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
#[allow(deprecated)] // recognised in plans that still hold one
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode, SortMergeJoinExec,
    SymmetricHashJoinExec,
};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, displayable};

/// Whether `plan` is one of DataFusion's joins.
fn is_join(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<HashJoinExec>()
        || plan.is::<SortMergeJoinExec>()
        || plan.is::<NestedLoopJoinExec>()
        || plan.is::<CrossJoinExec>()
        || plan.is::<SymmetricHashJoinExec>()
}

/// Each join and each aggregation across the network of `plan` (its
/// one-line display) with what EXPLAIN adds to its line (`join=…`,
/// `aggregation=…`), in plan order (the distributed planner's stages
/// included).
/// `cluster` tells the exchanges between nodes (None on a single node).
pub(crate) fn line_marks(
    plan: &Arc<dyn ExecutionPlan>,
    cluster: Option<&dyn Distribution>,
) -> Vec<(String, String)> {
    let mut found = Vec::new();
    collect(plan, cluster, &mut found);
    found
}

fn collect(
    plan: &Arc<dyn ExecutionPlan>,
    cluster: Option<&dyn Distribution>,
    found: &mut Vec<(String, String)>,
) {
    let exchange = |p: &dyn ExecutionPlan| cluster.and_then(|c| c.exchange(p));
    let mark = match strategy(plan, &exchange) {
        Some(strategy) => Some(format!("join={strategy}")),
        None => aggregation_exchange(plan, &exchange),
    };
    if let Some(mark) = mark {
        let line = displayable(plan.as_ref()).one_line().to_string();
        found.push((line.trim_end().to_string(), mark));
    }
    for child in plan.children() {
        collect(child, cluster, found);
    }
}

/// What crosses the network below a grouped aggregation of a cluster's
/// plan: None where nothing does (a single node's plan, or a stage that
/// aggregates what it has).
fn aggregation_exchange(
    plan: &Arc<dyn ExecutionPlan>,
    exchange: &dyn Fn(&dyn ExecutionPlan) -> Option<Exchange>,
) -> Option<String> {
    let last = plan.downcast_ref::<AggregateExec>()?;
    if last.group_expr().is_empty() {
        return None;
    }
    // Down through the exchanges to what feeds them.
    let mut networked = false;
    let mut below = last.input();
    loop {
        let shuffled = exchange(below.as_ref()) == Some(Exchange::Shuffle);
        #[allow(deprecated)] // a plan may still hold one
        let passes = shuffled
            || below.is::<RepartitionExec>()
            || below.is::<CoalesceBatchesExec>()
            || below.is::<CooperativeExec>();
        if !passes {
            break;
        }
        networked |= shuffled;
        below = below.children().into_iter().next()?;
    }
    if !networked {
        return None;
    }
    let (choice, estimate) = match last.mode() {
        AggregateMode::FinalPartitioned => {
            if let Some(runs) = below.downcast_ref::<RunAggregateExec>() {
                let estimate =
                    cirro_exec::rules::estimated_groups(runs.group_expr(), runs.children()[0]);
                ("pre-aggregated over runs of equal keys", estimate)
            } else {
                let partial = below.downcast_ref::<AggregateExec>()?;
                let estimate = (*partial.mode() == AggregateMode::Partial)
                    .then(|| {
                        cirro_exec::rules::estimated_groups(partial.group_expr(), partial.input())
                    })
                    .flatten();
                ("pre-aggregated", estimate)
            }
        }
        AggregateMode::SinglePartitioned => (
            "rows shuffled",
            cirro_exec::rules::estimated_groups(last.group_expr(), below),
        ),
        _ => return None,
    };
    Some(match estimate {
        Some((groups, rows)) => {
            format!("aggregation={choice} (≈{groups:.0} groups of {rows:.0} rows)")
        }
        None => format!("aggregation={choice} (groups unknown)"),
    })
}

fn strategy(
    plan: &Arc<dyn ExecutionPlan>,
    exchange: &dyn Fn(&dyn ExecutionPlan) -> Option<Exchange>,
) -> Option<&'static str> {
    let partitioned = if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        join.mode == PartitionMode::Partitioned
    } else if let Some(join) = plan.downcast_ref::<SpillingHashJoinExec>() {
        join.hash_join().mode == PartitionMode::Partitioned
    } else if plan.is::<SortMergeJoinExec>() || plan.is::<SymmetricHashJoinExec>() {
        true
    } else if is_join(plan.as_ref()) {
        false
    } else {
        return None;
    };
    if !partitioned {
        return Some("broadcast");
    }
    if plan
        .children()
        .iter()
        .any(|child| exchanged(child, exchange))
    {
        Some("shuffle")
    } else {
        Some("co-located")
    }
}

/// Whether rows reach this input of a join through a hash exchange made
/// for the join: one below it before any operator that partitions its own
/// output by key (an aggregation or join, whose exchange is its own).
fn exchanged(
    plan: &Arc<dyn ExecutionPlan>,
    exchange: &dyn Fn(&dyn ExecutionPlan) -> Option<Exchange>,
) -> bool {
    if let Some(repartition) = plan.downcast_ref::<RepartitionExec>()
        && matches!(repartition.partitioning(), Partitioning::Hash(_, _))
    {
        return true;
    }
    match exchange(plan.as_ref()) {
        Some(Exchange::Shuffle) => return true,
        Some(Exchange::Broadcast) => return false,
        None if plan.is::<AggregateExec>() || is_join(plan.as_ref()) => return false,
        None => {}
    }
    plan.children()
        .iter()
        .any(|child| exchanged(child, exchange))
}

/// `text` (EXPLAIN's plan column) with `, <mark>` at the end of every line
/// that shows one of `marks`' operators.
pub(crate) fn mark_lines(text: &str, marks: &[(String, String)]) -> String {
    let mut left: Vec<Option<&(String, String)>> = marks.iter().map(Some).collect();
    let mut lines: Vec<String> = Vec::new();
    for line in text.split('\n') {
        let shown = line.trim_end();
        let found = left.iter_mut().find(|s| {
            s.is_some_and(|(join, _)| {
                shown.ends_with(join.as_str())
                    && shown[..shown.len() - join.len()]
                        .chars()
                        .all(|c| c.is_whitespace() || !c.is_alphanumeric())
            })
        });
        match found.and_then(Option::take) {
            Some((_, mark)) => lines.push(format!("{shown}, {mark}")),
            None => lines.push(line.to_string()),
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_each_join_once() {
        let strategies = vec![
            (
                "HashJoinExec: mode=Partitioned, join_type=Inner, on=[(a@0, b@0)]".to_string(),
                "join=co-located".to_string(),
            ),
            (
                "HashJoinExec: mode=CollectLeft, join_type=Inner, on=[(c@0, d@0)]".to_string(),
                "join=broadcast".to_string(),
            ),
        ];
        let text = "ProjectionExec: expr=[a@0 as a]\n  HashJoinExec: mode=Partitioned, join_type=Inner, on=[(a@0, b@0)]\n  │ HashJoinExec: mode=CollectLeft, join_type=Inner, on=[(c@0, d@0)]\n    DataSourceExec: x";
        let marked = mark_lines(text, &strategies);
        assert!(
            marked.contains("on=[(a@0, b@0)], join=co-located"),
            "{marked}"
        );
        assert!(
            marked.contains(
                "│ HashJoinExec: mode=CollectLeft, join_type=Inner, on=[(c@0, d@0)], join=broadcast"
            ),
            "{marked}"
        );
        assert!(marked.ends_with("DataSourceExec: x"));
        // A line shown twice but planned once is marked once.
        let twice = format!("{}\n{}", strategies[0].0, strategies[0].0);
        assert_eq!(
            mark_lines(&twice, &strategies[..1])
                .matches("join=")
                .count(),
            1
        );
    }
}
