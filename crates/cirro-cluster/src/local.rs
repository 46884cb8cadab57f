//! Cirro's engine on every node: the local half of the planner (the
//! hot-data tier over the scans, compiled expressions, adaptive
//! aggregation, spilling joins, the GPU twins, …) applied to the part of a
//! distributed plan that one node executes.
//!
//! The coordinator plans the query as a whole and cuts it into stages
//! with DataFusion's operators only (they are what the plan codec
//! carries). Then each node optimizes what it runs:
//!
//! - a worker, every task it receives, before it runs it
//!   ([`WorkerRules`], `datafusion-distributed`'s worker plan rewrite);
//! - the coordinator, the head of the plan that it runs itself
//!   ([`optimize_head`]).
//!
//! Both stop at the network boundaries: below one lies another stage,
//! which its own nodes optimize (or, on the coordinator, which is still to
//! be encoded and sent). The boundaries are swapped for leaves
//! ([`BoundaryLeaf`]) while the rules run, and put back after.
//!
//! A worker reports the metrics of its task's operators by their position
//! in the plan, which the coordinator maps onto its own copy of the stage.
//! Tasks send metrics only for `EXPLAIN ANALYZE`; in those, a rule that
//! changes the task's shape (a fused or a shared operator, a projection the
//! compiled arguments of an aggregation add) is left out, so that each
//! operator's metrics (cache hits, spills) show under the operator it
//! replaced. A rule that fails leaves the task as it was sent: a plan a
//! worker cannot optimize runs as sent, never fails for that reason.

use std::fmt;
use std::sync::Arc;

use datafusion::common::Statistics;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::{ConfigExtension, ConfigOptions};
use datafusion::error::Result as DfResult;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{
    DistributedConfig, DistributedExt, NetworkBoundaryExt, WorkerPlanRewriteEvent,
    WorkerPlanRewriteEventResponse, WorkerPlanRewriteHandler,
};
use tonic::codegen::http::HeaderMap;

use cirro_exec::distribution::{LocalRules, OptionList, OptionVisitor};
use cirro_exec::resources::{QueryOptions, Resources, set_query_options};

/// What a node applies to the plans it executes: its local rules, and
/// the session options they read (sent with every task).
#[derive(Clone)]
pub struct LocalPlanning {
    rules: Arc<LocalRules>,
    /// What the coordinator applies to a whole plan before it cuts it into
    /// stages (choices that depend on the rows crossing the network).
    cut: Arc<LocalRules>,
    propagate: fn(&mut SessionConfig),
    receive: fn(&mut SessionConfig, &HeaderMap) -> DfResult<()>,
    /// The node's memory and spill area, which its tasks count in.
    resources: Option<Arc<Resources>>,
}

impl fmt::Debug for LocalPlanning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.rules.iter().map(|r| r.name()).collect();
        write!(f, "LocalPlanning({names:?})")
    }
}

impl LocalPlanning {
    /// `rules` on every node, `cut` on a coordinator's plan before it is
    /// cut into stages, reading the options `O` lists.
    pub fn new<O: OptionList>(rules: LocalRules, cut: LocalRules) -> Self {
        Self {
            rules: Arc::new(rules),
            cut: Arc::new(cut),
            propagate: |config| O::visit(&mut Propagate(config)),
            receive: |config, headers| {
                let mut receive = Receive {
                    config,
                    headers,
                    result: Ok(()),
                };
                O::visit(&mut receive);
                receive.result
            },
            resources: None,
        }
    }

    /// Tasks count their memory in the pools of `resources` (one per
    /// query, see `QueryPools`) and spill into its spill area.
    pub fn with_resources(mut self, resources: Arc<Resources>) -> Self {
        self.resources = Some(resources);
        self
    }

    /// A task's session: counted in the memory pool of its query on this
    /// node (named `node` in its refusals), spilling into the node's spill
    /// area, with what depends on the query's limit set as its
    /// coordinator set it. As it was without the node's resources or the
    /// query's id (a task of an older coordinator).
    pub(crate) fn task_session(
        &self,
        mut builder: SessionStateBuilder,
        node: &str,
    ) -> SessionStateBuilder {
        let Some(resources) = &self.resources else {
            return builder;
        };
        let Some(base) = builder.runtime_env().clone() else {
            return builder;
        };
        let options = builder.config().get_or_insert_default().options_mut();
        let Some(query) = options.extensions.get::<QueryOptions>().cloned() else {
            return builder;
        };
        if query.id.is_empty() {
            return builder;
        }
        let pool = resources.task_pool(&query.id, query.memory_limit);
        pool.set_node(node);
        set_query_options(options, None, pool.limit());
        let mut runtime = RuntimeEnv::clone(&base);
        runtime.memory_pool = pool;
        match resources.spill() {
            Ok(area) => runtime.disk_manager = Arc::clone(area.disk_manager()),
            Err(e) => log::warn!("no spill area, tasks spill to DataFusion's default: {e}"),
        }
        builder.with_runtime_env(Arc::new(runtime))
    }

    /// A coordinating session's configuration sends the options' values
    /// with every task (the values when the task is sent: `SET` applies).
    pub(crate) fn propagate(&self, config: &mut SessionConfig) {
        (self.propagate)(config)
    }

    /// A worker's session takes the options its task came with.
    pub(crate) fn receive(&self, config: &mut SessionConfig, headers: &HeaderMap) -> DfResult<()> {
        (self.receive)(config, headers)
    }

    /// The handler a worker's session rewrites each task with; `runtime`,
    /// the worker's, reads the task's files (its object stores decode the
    /// task's own copy, see [`WorkerRules`]).
    pub(crate) fn worker_rules(&self, runtime: Option<Arc<RuntimeEnv>>) -> WorkerRules {
        WorkerRules(Arc::clone(&self.rules), runtime)
    }

    /// A plan about to be cut into stages, with the `cut` rules applied in
    /// order; a rule that fails is skipped (the plan is still right
    /// without it).
    pub(crate) fn before_cut(
        &self,
        mut plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
    ) -> Arc<dyn ExecutionPlan> {
        for rule in self.cut.iter() {
            match rule.optimize(Arc::clone(&plan), options) {
                Ok(optimized) => plan = optimized,
                Err(e) => log::warn!("{} left out: {e}", rule.name()),
            }
        }
        plan
    }

    /// The coordinator's part of a plan: everything above the network
    /// boundaries (all of it when the plan stays on this node). A plan
    /// that stays on this node is the statement's result, which may come
    /// in any number of partitions, as on a node alone (adaptive
    /// aggregation's radix partitions flow on to it); above boundaries
    /// the head keeps its partitions.
    pub(crate) fn optimize_head(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let keep_partitions = plan.exists(|node| Ok(node.is_network_boundary()))?;
        optimize(plan, &self.rules, options, false, keep_partitions)
    }
}

/// Registers each option extension in a coordinating session's
/// configuration for sending, with the values it has.
struct Propagate<'a>(&'a mut SessionConfig);

impl OptionVisitor for Propagate<'_> {
    fn visit<T: ConfigExtension + Default + Clone>(&mut self) {
        let current = self
            .0
            .options()
            .extensions
            .get::<T>()
            .cloned()
            .unwrap_or_default();
        self.0.set_distributed_option_extension(current);
    }
}

/// Registers each option extension in a worker's session configuration,
/// with the values its task came with.
struct Receive<'a> {
    config: &'a mut SessionConfig,
    headers: &'a HeaderMap,
    result: DfResult<()>,
}

impl OptionVisitor for Receive<'_> {
    fn visit<T: ConfigExtension + Default + Clone>(&mut self) {
        if self.result.is_ok() {
            self.result = self
                .config
                .set_distributed_option_extension_from_headers::<T>(self.headers)
                .map(|_| ());
        }
    }
}

/// A worker's rewrite of each task it receives (see the module docs).
#[derive(Clone)]
pub(crate) struct WorkerRules(Arc<LocalRules>, Option<Arc<RuntimeEnv>>);

impl WorkerPlanRewriteHandler for WorkerRules {
    fn rewrite_worker_plan(
        &self,
        ev: WorkerPlanRewriteEvent,
    ) -> DfResult<WorkerPlanRewriteEventResponse> {
        let options = ev.session_config.options();
        // Metrics are sent back (EXPLAIN ANALYZE) by position in the plan.
        let keep_shape = DistributedConfig::from_config_options(options)
            .map(|c| c.collect_metrics)
            .unwrap_or(true);
        // The task's own dynamic filters, not the plan objects it came as
        // (on the coordinator, those encoded for other nodes' tasks too).
        let sent = match crate::dynamic_filters::own_copy(
            Arc::clone(&ev.plan),
            ev.session_config,
            self.1.as_ref(),
        ) {
            Ok(copy) => copy,
            Err(e) => {
                log::warn!("a task runs on the plan it was given: it could not be copied: {e}");
                ev.plan
            }
        };
        let plan = match optimize(Arc::clone(&sent), &self.0, options, keep_shape, true) {
            Ok(plan) => plan,
            Err(e) => {
                log::warn!("a task runs as sent: its local optimization failed: {e}");
                sent
            }
        };
        Ok(WorkerPlanRewriteEventResponse::new(plan))
    }
}

/// `rules` applied in order to `plan` above its network boundaries; with
/// `keep_shape`, a rule that changes the plan's shape is left out.
fn optimize(
    plan: Arc<dyn ExecutionPlan>,
    rules: &LocalRules,
    options: &ConfigOptions,
    keep_shape: bool,
    keep_partitions: bool,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    if rules.is_empty() {
        return Ok(plan);
    }
    let mut cut = cut_boundaries(plan)?;
    let mut shape = keep_shape.then(|| shape_of(&cut));
    // What the node above the plan takes from it (a task's output goes to
    // the stage above, partition by partition) stays as it is.
    let partitions = cut.properties().output_partitioning().partition_count();
    let schema = cut.schema();
    for rule in rules.iter() {
        let next = rule.optimize(Arc::clone(&cut), options)?;
        if (keep_partitions
            && next.properties().output_partitioning().partition_count() != partitions)
            || next.schema() != schema
        {
            log::debug!("{} left out: it changes the plan's output", rule.name());
            continue;
        }
        if let Some(before) = &shape {
            let after = shape_of(&next);
            if after != *before {
                log::debug!(
                    "{} left out of a task: it changes the task's shape",
                    rule.name()
                );
                continue;
            }
            shape = Some(after);
        }
        cut = next;
    }
    restore_boundaries(cut)
}

/// A plan's shape: the number of children of each operator, in pre-order.
fn shape_of(plan: &Arc<dyn ExecutionPlan>) -> Vec<usize> {
    let mut shape = Vec::new();
    let _ = plan.apply(|node| {
        shape.push(node.children().len());
        Ok(TreeNodeRecursion::Continue)
    });
    shape
}

/// `plan` with each network boundary (and what lies below it) swapped for
/// a [`BoundaryLeaf`].
fn cut_boundaries(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        if node.is_network_boundary() {
            let leaf = Arc::new(BoundaryLeaf::new(node)) as Arc<dyn ExecutionPlan>;
            Ok(Transformed::new(leaf, true, TreeNodeRecursion::Jump))
        } else {
            Ok(Transformed::no(node))
        }
    })
    .map(|t| t.data)
}

/// The network boundaries back in place of their leaves.
fn restore_boundaries(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| match node.downcast_ref::<BoundaryLeaf>() {
        Some(leaf) => Ok(Transformed::yes(Arc::clone(&leaf.boundary))),
        None => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}

/// A network boundary while the local rules run: a leaf with the
/// boundary's properties, which never executes. It prints with the
/// boundary's identity, so that no rule takes two boundaries for the same
/// subplan.
#[derive(Debug)]
pub(crate) struct BoundaryLeaf {
    boundary: Arc<dyn ExecutionPlan>,
}

impl BoundaryLeaf {
    fn new(boundary: Arc<dyn ExecutionPlan>) -> Self {
        Self { boundary }
    }
}

impl DisplayAs for BoundaryLeaf {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "BoundaryLeaf: {} #{:p}",
            self.boundary.name(),
            Arc::as_ptr(&self.boundary)
        )
    }
}

impl ExecutionPlan for BoundaryLeaf {
    fn name(&self) -> &str {
        "BoundaryLeaf"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.boundary.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    /// The boundary's: what the stage below it is estimated to send.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        StatisticsContext::new().compute(self.boundary.as_ref(), args)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        datafusion::common::internal_err!(
            "a network boundary's placeholder was executed (local rules must restore it)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_optimizer::PhysicalOptimizerRule;
    use datafusion::physical_plan::coop::CooperativeExec;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::physical_plan::{ExecutionPlanProperties, Partitioning};

    /// A rule that puts a node over the plan (a new shape).
    #[derive(Debug)]
    struct Wrap;

    impl PhysicalOptimizerRule for Wrap {
        fn optimize(
            &self,
            plan: Arc<dyn ExecutionPlan>,
            _: &ConfigOptions,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            Ok(Arc::new(CooperativeExec::new(plan)))
        }
        fn name(&self) -> &str {
            "wrap"
        }
        fn schema_check(&self) -> bool {
            true
        }
    }

    /// A rule that spreads the plan's output over 4 partitions.
    #[derive(Debug)]
    struct Spread;

    impl PhysicalOptimizerRule for Spread {
        fn optimize(
            &self,
            plan: Arc<dyn ExecutionPlan>,
            _: &ConfigOptions,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            Ok(Arc::new(RepartitionExec::try_new(
                plan,
                Partitioning::RoundRobinBatch(4),
            )?))
        }
        fn name(&self) -> &str {
            "spread"
        }
        fn schema_check(&self) -> bool {
            true
        }
    }

    /// A rule that fails.
    #[derive(Debug)]
    struct Fail;

    impl PhysicalOptimizerRule for Fail {
        fn optimize(
            &self,
            _: Arc<dyn ExecutionPlan>,
            _: &ConfigOptions,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            datafusion::common::plan_err!("cannot")
        }
        fn name(&self) -> &str {
            "fail"
        }
        fn schema_check(&self) -> bool {
            true
        }
    }

    fn scan() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        Arc::new(EmptyExec::new(schema))
    }

    fn rules(rules: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>) -> LocalRules {
        rules
    }

    #[test]
    fn a_rule_that_changes_the_shape_is_left_out_only_where_the_shape_must_stay() {
        let options = ConfigOptions::default();
        let wrap = rules(vec![Arc::new(Wrap)]);
        let kept = optimize(scan(), &wrap, &options, true, true).expect("optimized");
        assert_eq!(kept.name(), "EmptyExec");
        let changed = optimize(scan(), &wrap, &options, false, true).expect("optimized");
        assert_eq!(changed.name(), "CooperativeExec");
        assert_eq!(shape_of(&changed), [1, 0]);
    }

    #[test]
    fn a_statements_result_may_change_its_partitions_a_tasks_output_not() {
        let options = ConfigOptions::default();
        let spread = rules(vec![Arc::new(Spread)]);
        let task = optimize(scan(), &spread, &options, false, true).expect("optimized");
        assert_eq!(task.name(), "EmptyExec");
        // A plan with no network boundary, as the head of a statement that
        // stays on this node: its result may come in 4 partitions.
        let planning = LocalPlanning {
            rules: Arc::new(spread),
            cut: Arc::new(Vec::new()),
            propagate: |_| {},
            receive: |_, _| Ok(()),
            resources: None,
        };
        let head = planning.optimize_head(scan(), &options).expect("optimized");
        assert_eq!(head.output_partitioning().partition_count(), 4);
    }

    #[test]
    fn a_task_whose_rules_fail_runs_as_sent() {
        let handler = WorkerRules(Arc::new(rules(vec![Arc::new(Wrap), Arc::new(Fail)])), None);
        let config = SessionConfig::new();
        let sent = scan();
        let response = handler
            .rewrite_worker_plan(WorkerPlanRewriteEvent {
                plan: Arc::clone(&sent),
                session_config: &config,
            })
            .expect("a plan");
        assert!(Arc::ptr_eq(&response.plan, &sent));
    }

    #[test]
    fn a_boundary_leaf_prints_as_its_own_boundary() {
        let (a, b) = (scan(), scan());
        let show = |p: &Arc<dyn ExecutionPlan>| {
            datafusion::physical_plan::displayable(&BoundaryLeaf::new(Arc::clone(p)))
                .one_line()
                .to_string()
        };
        assert_ne!(show(&a), show(&b));
        assert_eq!(show(&a), show(&a));
    }
}
