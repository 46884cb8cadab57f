//! What every GPU operator shares with its CPU twin: its line in EXPLAIN,
//! and the `ExecutionPlan` methods it answers as the twin does.

/// How a GPU operator shows in EXPLAIN: its CPU twin's line with `Gpu`
/// before the name (the tree view: the twin's).
pub(crate) fn fmt_twin(
    twin: &dyn datafusion::physical_plan::ExecutionPlan,
    t: datafusion::physical_plan::DisplayFormatType,
    f: &mut std::fmt::Formatter,
) -> std::fmt::Result {
    use datafusion::physical_plan::DisplayFormatType;
    match t {
        DisplayFormatType::TreeRender => twin.fmt_as(t, f),
        _ => {
            let line = datafusion::physical_plan::displayable(twin)
                .one_line()
                .to_string();
            write!(f, "Gpu{}", line.trim_end())
        }
    }
}

/// `DisplayAs` and `ExecutionPlan` for the GPU operator `$gpu`, the twin
/// of `$cpu` (in its field `twin: Arc<$cpu>`; its own metrics in
/// `metrics`): it computes the twin's rows, so its children, expressions,
/// properties, input requirements and statistics are the twin's.
/// `with_new_children` gives the twin the new children and makes it a GPU
/// operator again with `$rebuild(&self, &twin)` where that says the device
/// still can (None: the CPU twin itself). `execute` is the operator's
/// inherent `start`.
macro_rules! twin_plan {
    ($gpu:ident, $cpu:ty, $rebuild:expr) => {
        impl datafusion::physical_plan::DisplayAs for $gpu {
            fn fmt_as(
                &self,
                t: datafusion::physical_plan::DisplayFormatType,
                f: &mut std::fmt::Formatter,
            ) -> std::fmt::Result {
                $crate::twin::fmt_twin(self.twin.as_ref(), t, f)
            }
        }

        impl datafusion::physical_plan::ExecutionPlan for $gpu {
            fn name(&self) -> &str {
                stringify!($gpu)
            }

            fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
                self.twin.properties()
            }

            fn children(
                &self,
            ) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
                self.twin.children()
            }

            fn input_distribution_requirements(
                &self,
            ) -> datafusion::physical_plan::InputDistributionRequirements {
                self.twin.input_distribution_requirements()
            }

            fn required_input_ordering(
                &self,
            ) -> Vec<Option<datafusion::physical_expr::OrderingRequirements>> {
                self.twin.required_input_ordering()
            }

            fn maintains_input_order(&self) -> Vec<bool> {
                self.twin.maintains_input_order()
            }

            fn benefits_from_input_partitioning(&self) -> Vec<bool> {
                self.twin.benefits_from_input_partitioning()
            }

            fn child_stats_requests(
                &self,
                partition: Option<usize>,
            ) -> Vec<datafusion::physical_plan::statistics::ChildStats> {
                self.twin.child_stats_requests(partition)
            }

            fn statistics_from_inputs(
                &self,
                input_stats: &[std::sync::Arc<datafusion::common::Statistics>],
                args: &datafusion::physical_plan::statistics::StatisticsArgs,
            ) -> datafusion::common::Result<std::sync::Arc<datafusion::common::Statistics>> {
                self.twin.statistics_from_inputs(input_stats, args)
            }

            fn apply_expressions(
                &self,
                f: &mut dyn FnMut(
                    &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
                ) -> datafusion::common::Result<
                    datafusion::common::tree_node::TreeNodeRecursion,
                >,
            ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
                self.twin.apply_expressions(f)
            }

            fn with_new_children(
                self: std::sync::Arc<Self>,
                children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
            ) -> datafusion::common::Result<
                std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
            > {
                let twin: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> =
                    std::sync::Arc::clone(&self.twin) as _;
                let twin =
                    datafusion::physical_plan::execution_plan::replace_children_if_necessary(
                        twin, children,
                    )?;
                let rebuild: fn(&$gpu, &$cpu) -> Option<$gpu> = $rebuild;
                Ok(
                    match twin
                        .downcast_ref::<$cpu>()
                        .and_then(|cpu| rebuild(&self, cpu))
                    {
                        Some(gpu) => std::sync::Arc::new(gpu),
                        None => twin,
                    },
                )
            }

            fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
                Some(self.metrics.clone_inner())
            }

            fn execute(
                &self,
                partition: usize,
                context: std::sync::Arc<datafusion::execution::TaskContext>,
            ) -> datafusion::common::Result<datafusion::physical_plan::SendableRecordBatchStream>
            {
                self.start(partition, context)
            }
        }
    };
}
