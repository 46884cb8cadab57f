//! A join's (or a TopK's) dynamic filter on a cluster: filled only where
//! it is read, by the operator that fills it, in the task that runs both.
//!
//! DataFusion plans a join's dynamic filter as one shared object: the join
//! fills it once its build side is in, and the scans below its probe side
//! (to which the filter was pushed) read it. On a cluster this goes wrong
//! in two ways, both seen as intermittent failures and a possible wrong
//! answer:
//!
//! - The coordinator runs its own tasks of a stage on the plan objects it
//!   also encodes for the other nodes' tasks of that stage. When its own
//!   task's join has filled the filter before another task's plan is
//!   encoded, the filled filter travels: its expression is in the join's
//!   columns, which the decoder reads against the scan's (TPC-H Q10:
//!   "column 'c_nationkey' at index 8 … input schema only has 8 columns",
//!   Q8: "the data type inlist should be same"), and a partitioned join's
//!   filter holds only that task's partitions, so another task's scan would
//!   drop rows its own join needs. [`own_copy`] gives every task a copy of
//!   its plan that shares nothing with the coordinator's.
//! - A filter pushed across a shuffle reads in one stage what a join in
//!   another fills: on another node it is never filled, and on the same
//!   node it was the wrong task's (as above). [`keep_within_stages`] drops
//!   such filters from the scans that read them; the join still filters.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_expr::expressions::{DynamicFilterPhysicalExpr, lit};
use datafusion::physical_expr::utils::split_conjunction;
use datafusion::physical_expr::{PhysicalExpr, conjunction};
use datafusion::physical_plan::{ExecutionPlan, replace_children_if_necessary};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{DistributedCodec, DistributedLeafExec, NetworkBoundaryExt};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_proto_converter, physical_plan_to_bytes_with_proto_converter,
};
use datafusion_proto::physical_plan::DeduplicatingProtoConverter;

/// The ids of the dynamic filters `expr` reads.
fn filters_in(expr: &Arc<dyn PhysicalExpr>, ids: &mut HashSet<u64>) {
    let _ = expr.apply(|e| {
        if e.downcast_ref::<DynamicFilterPhysicalExpr>().is_some()
            && let Some(id) = e.expression_id()
        {
            ids.insert(id);
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

/// The ids of the dynamic filters the operator `node` reads (a
/// [`DistributedLeafExec`]'s: its original scan's).
fn read_by(node: &dyn ExecutionPlan) -> HashSet<u64> {
    let mut ids = HashSet::new();
    let _ = node.apply_expressions(&mut |expr| {
        filters_in(expr, &mut ids);
        Ok(TreeNodeRecursion::Continue)
    });
    ids
}

/// Whether `plan` reads a dynamic filter anywhere.
fn reads_filters(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.exists(|node| {
        Ok(!read_by(node.as_ref()).is_empty()
            || node
                .downcast_ref::<DistributedLeafExec>()
                .is_some_and(|leaf| leaf.variants().iter().any(reads_filters)))
    })
    .unwrap_or(true)
}

/// `plan` with every dynamic filter read in one stage but filled in
/// another dropped from the scans that read it (see the module docs).
/// Stages meet at `datafusion-distributed`'s network boundaries. An error
/// where such a filter is read by something other than a Parquet scan:
/// the plan is then not to be distributed.
pub(crate) fn keep_within_stages(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    within_stages(plan, &|node| node.is_network_boundary())
}

/// [`keep_within_stages`] with the stage boundaries that `is_boundary`
/// tells.
fn within_stages(
    stage: Arc<dyn ExecutionPlan>,
    is_boundary: &dyn Fn(&Arc<dyn ExecutionPlan>) -> bool,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    // What this stage's own operators fill.
    let mut filled = HashSet::new();
    stage.apply(|node| {
        if is_boundary(node) {
            return Ok(TreeNodeRecursion::Jump);
        }
        filled.extend(
            node.dynamic_expressions_produced()
                .iter()
                .filter_map(|e| e.expression_id()),
        );
        Ok(TreeNodeRecursion::Continue)
    })?;
    stage
        .transform_down(|node| {
            if is_boundary(&node) {
                let children = node
                    .children()
                    .into_iter()
                    .map(|child| within_stages(Arc::clone(child), is_boundary))
                    .collect::<DfResult<Vec<_>>>()?;
                let changed = children
                    .iter()
                    .zip(node.children())
                    .any(|(new, old)| !Arc::ptr_eq(new, old));
                let node = replace_children_if_necessary(node, children)?;
                return Ok(Transformed::new(node, changed, TreeNodeRecursion::Jump));
            }
            match without_foreign(&node, &filled)? {
                Some(scan) => Ok(Transformed::yes(scan)),
                None => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
}

/// `node` without the dynamic filters outside `filled` that it reads
/// (None: it reads none); an error where it is not a scan that can drop
/// them.
fn without_foreign(
    node: &Arc<dyn ExecutionPlan>,
    filled: &HashSet<u64>,
) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(leaf) = node.downcast_ref::<DistributedLeafExec>() {
        let original = without_foreign(leaf.original(), filled)?;
        let mut variants = Vec::with_capacity(leaf.variants().len());
        let mut changed = original.is_some();
        for variant in leaf.variants() {
            let new = without_foreign(variant, filled)?;
            changed |= new.is_some();
            variants.push(new.unwrap_or_else(|| Arc::clone(variant)));
        }
        if !changed {
            return Ok(None);
        }
        let original = original.unwrap_or_else(|| Arc::clone(leaf.original()));
        return Ok(Some(Arc::new(DistributedLeafExec::try_new(
            original, variants,
        )?)));
    }
    let foreign: HashSet<u64> = read_by(node.as_ref()).difference(filled).copied().collect();
    if foreign.is_empty() {
        return Ok(None);
    }
    let parquet = node
        .downcast_ref::<DataSourceExec>()
        .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
        .and_then(|config| {
            let source = config.file_source().downcast_ref::<ParquetSource>()?;
            Some((config, source, source.filter()?))
        });
    let Some((config, source, predicate)) = parquet else {
        return Err(datafusion::error::DataFusionError::Plan(format!(
            "{} reads a dynamic filter filled in another stage",
            node.name()
        )));
    };
    let kept: Vec<Arc<dyn PhysicalExpr>> = split_conjunction(&predicate)
        .into_iter()
        .filter(|part| {
            let mut ids = HashSet::new();
            filters_in(part, &mut ids);
            ids.is_disjoint(&foreign)
        })
        .cloned()
        .collect();
    let predicate = if kept.is_empty() {
        lit(true)
    } else {
        conjunction(kept)
    };
    let config = FileScanConfigBuilder::from(config.clone())
        .with_source(Arc::new(source.with_predicate(predicate)))
        .build();
    Ok(Some(DataSourceExec::from_data_source(config)))
}

/// The functions a task's plan may name (a worker's, see
/// `distributed::WorkerSessions`), to decode [`own_copy`]'s copies.
static FUNCTIONS: LazyLock<Arc<TaskContext>> = LazyLock::new(|| {
    let mut builder = SessionStateBuilder::new().with_default_features();
    if let Some(functions) = builder.scalar_functions() {
        functions.extend(cirro_exec::functions::portable_udfs());
    }
    if let Some(functions) = builder.aggregate_functions() {
        cirro_exec::functions::replace_udafs(functions);
    }
    builder.build().task_ctx()
});

/// A task's own copy of `plan` (decoded from its encoding, as on any other
/// node), where it reads a dynamic filter: the task's operators fill and
/// read their own filters, not those of the plan it was given (on the
/// coordinator, the plan that is also encoded for other nodes' tasks; see
/// the module docs). `plan` as it is where it reads none. `runtime` (the
/// worker's) has the object stores the scans' files are decoded against:
/// without it an HDFS scan's copy failed ("No suitable object store"), the
/// task ran on the plan it was given, and TPC-H Q10 on 3 HDFS nodes again
/// failed now and then with the error above.
pub(crate) fn own_copy(
    plan: Arc<dyn ExecutionPlan>,
    config: &SessionConfig,
    runtime: Option<&Arc<RuntimeEnv>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if !reads_filters(&plan) {
        return Ok(plan);
    }
    let codec = DistributedCodec::new_combined_with_user(config);
    let converter = DeduplicatingProtoConverter::default();
    let bytes = physical_plan_to_bytes_with_proto_converter(plan, &codec, &converter)?;
    let ctx = TaskContext::new(
        None,
        String::new(),
        config.clone(),
        FUNCTIONS.scalar_functions().clone(),
        FUNCTIONS.higher_order_functions().clone(),
        FUNCTIONS.aggregate_functions().clone(),
        FUNCTIONS.window_functions().clone(),
        runtime.map_or_else(|| FUNCTIONS.runtime_env(), Arc::clone),
    );
    physical_plan_from_bytes_with_proto_converter(&bytes, &ctx, &codec, &converter)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::NullEquality;
    use datafusion::config::ConfigOptions;
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::FileGroup;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::logical_expr::JoinType;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_optimizer::PhysicalOptimizerRule;
    use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
    use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::physical_plan::{Partitioning, displayable};

    use super::*;

    fn scan(name: &str, columns: &[&str]) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(*c, DataType::Int64, false))
                .collect::<Vec<_>>(),
        ));
        let config = FileScanConfigBuilder::new(
            ObjectStoreUrl::local_filesystem(),
            Arc::new(ParquetSource::new(schema)),
        )
        .with_file_groups(vec![FileGroup::new(vec![PartitionedFile::new(
            format!("{name}.parquet"),
            1000,
        )])])
        .build();
        DataSourceExec::from_data_source(config)
    }

    /// `b ⋈ a` on `b.k = a.k` (b builds), `a` probes through `shuffle`,
    /// with the join's dynamic filter pushed down as DataFusion does.
    fn join(shuffle: bool) -> Arc<dyn ExecutionPlan> {
        let build = scan("b", &["k", "w"]);
        let mut probe = scan("a", &["x", "k"]);
        if shuffle {
            probe = Arc::new(
                RepartitionExec::try_new(
                    probe,
                    Partitioning::Hash(vec![Arc::new(Column::new("k", 1))], 1),
                )
                .expect("repartition"),
            );
        }
        let join = HashJoinExec::try_new(
            build,
            probe,
            vec![(
                Arc::new(Column::new("k", 0)) as _,
                Arc::new(Column::new("k", 1)) as _,
            )],
            None,
            &JoinType::Inner,
            None,
            PartitionMode::CollectLeft,
            NullEquality::NullEqualsNothing,
            false,
        )
        .expect("join");
        FilterPushdown::new_post_optimization()
            .optimize(Arc::new(join), &ConfigOptions::default())
            .expect("pushdown")
    }

    fn text(plan: &Arc<dyn ExecutionPlan>) -> String {
        displayable(plan.as_ref()).indent(true).to_string()
    }

    #[test]
    fn a_filter_read_across_a_stage_boundary_is_dropped_from_its_scan() {
        let is_repartition = |node: &Arc<dyn ExecutionPlan>| node.is::<RepartitionExec>();
        // Join and scan in one stage: kept.
        let together = join(false);
        assert!(
            text(&together).contains("DynamicFilter"),
            "{}",
            text(&together)
        );
        let kept = within_stages(Arc::clone(&together), &is_repartition).expect("kept");
        assert!(Arc::ptr_eq(&kept, &together), "{}", text(&kept));
        // The scan below a shuffle: another stage, dropped there.
        let apart = join(true);
        assert!(text(&apart).contains("DynamicFilter"), "{}", text(&apart));
        let dropped = within_stages(apart, &is_repartition).expect("dropped");
        assert!(
            !text(&dropped).contains("DynamicFilter"),
            "{}",
            text(&dropped)
        );
        // Without boundaries, one stage: kept.
        let whole = within_stages(join(true), &|_| false).expect("kept");
        assert!(text(&whole).contains("DynamicFilter"), "{}", text(&whole));
    }

    /// The join's filter and the filter its probe scan reads.
    fn filters(plan: &Arc<dyn ExecutionPlan>) -> (Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>) {
        let join = plan.downcast_ref::<HashJoinExec>().expect("join");
        let filled = join.dynamic_expressions_produced()[0].clone();
        let source = join
            .right()
            .downcast_ref::<DataSourceExec>()
            .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
            .and_then(|c| c.file_source().downcast_ref::<ParquetSource>())
            .expect("parquet");
        (filled, source.filter().expect("predicate"))
    }

    #[test]
    fn a_tasks_copy_fills_its_own_filters_not_the_plans_it_was_given() {
        let given = join(false);
        let copy = own_copy(Arc::clone(&given), &SessionConfig::new(), None).expect("copy");
        assert!(!Arc::ptr_eq(&given, &copy));
        let (copy_filled, copy_read) = filters(&copy);
        let (given_filled, given_read) = filters(&given);
        let fill = lit(false);
        copy_filled
            .downcast_ref::<DynamicFilterPhysicalExpr>()
            .expect("dynamic")
            .update(fill)
            .expect("update");
        // The copy's scan reads what the copy's join filled …
        assert_eq!(
            copy_read.snapshot_generation(),
            copy_filled.snapshot_generation()
        );
        assert!(
            text(&copy).contains("DynamicFilter [ false ]"),
            "{}",
            text(&copy)
        );
        // … and the given plan, encoded for other tasks, stays empty.
        assert_ne!(
            given_read.snapshot_generation(),
            copy_read.snapshot_generation()
        );
        assert_eq!(
            given_filled.snapshot_generation(),
            given_read.snapshot_generation()
        );
        assert!(
            text(&given).contains("DynamicFilter [ empty ]"),
            "{}",
            text(&given)
        );
        // A plan without dynamic filters is not copied.
        let plain = scan("c", &["k"]);
        let same = own_copy(Arc::clone(&plain), &SessionConfig::new(), None).expect("same");
        assert!(Arc::ptr_eq(&plain, &same));
    }
}
