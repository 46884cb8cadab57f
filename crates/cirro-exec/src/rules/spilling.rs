//! Hash joins that spill: every hash join of a single node's plan becomes a
//! [`SpillingHashJoinExec`], DataFusion's join until its build side does not
//! fit the query's memory, a grace hash join on disk after that (see
//! `spill_join`). `SET spill_join = off` leaves DataFusion's joins as they
//! are (they fail with 53200 when memory runs out).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;

use super::JoinOrderOptions;
use crate::operators::spill_join::SpillingHashJoinExec;

/// The rule; see the module documentation.
#[derive(Debug, Default)]
pub struct SpillingJoins;

impl PhysicalOptimizerRule for SpillingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !JoinOrderOptions::switch_on(config, |o| &o.spill) {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            if let Some(join) = node.downcast_ref::<HashJoinExec>()
                && let Some(spilling) = SpillingHashJoinExec::try_new(join)?
            {
                return Ok(Transformed::yes(
                    Arc::new(spilling) as Arc<dyn ExecutionPlan>
                ));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "spilling_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
