//! Where operators run: `GpuOperators` replaces each operator that has a
//! GPU twin with it, when the session's `SET gpu` says so:
//! - `off`: none;
//! - `on` (the default): the cost model chooses. A transfer to the device
//!   costs about what evaluating the predicate on the CPU does, so only
//!   inputs of at least `min_rows` estimated rows go, and never to a
//!   software device (lavapipe runs on the CPU's cores: it cannot win);
//! - `force`: every operator whose twin applies, whatever the cost (tests,
//!   `cirro bench gpu`).
//!
//! Twins apply where their kernels can read the types and compile the
//! expressions; without a device nothing changes, `force` included.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::Accelerator;
use crate::aggregate::GpuAggregateExec;
use crate::codegen::compile_predicate;
use crate::filter::GpuFilterExec;
use crate::join::GpuHashJoinExec;
use crate::projection::GpuProjectionExec;
use crate::sort::GpuSortExec;

datafusion::common::extensions_options! {
    /// The session's GPU switches.
    pub struct GpuOptions {
        /// `off`, `on` or `force` (`SET gpu`).
        pub mode: String, default = "on".to_string()
        /// Estimated input rows from which `on` uses the device.
        pub min_rows: usize, default = 4_000_000
        /// Rows gathered into one block for the device.
        pub block_rows: usize, default = 1 << 20
        /// Estimated build rows up to which `on` puts a hash join on the
        /// device: its build side is held in memory and does not spill.
        pub join_build_rows_max: usize, default = 4_000_000
    }
}

impl datafusion::common::config::ConfigExtension for GpuOptions {
    const PREFIX: &'static str = "cirro_gpu";
}

/// The rule, over one node's device.
#[derive(Debug, Default)]
pub struct GpuOperators {
    accelerator: Arc<Accelerator>,
}

impl GpuOperators {
    pub fn new(accelerator: Arc<Accelerator>) -> Self {
        Self { accelerator }
    }
}

impl PhysicalOptimizerRule for GpuOperators {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = config
            .extensions
            .get::<GpuOptions>()
            .cloned()
            .unwrap_or_default();
        let force = match options.mode.as_str() {
            "off" => return Ok(plan),
            "force" => true,
            _ => false,
        };
        // The device is opened only for a plan with a candidate: most
        // statements never pay for it.
        let accelerator = &self.accelerator;
        let usable = || match accelerator.device() {
            Some(gpu) if force || !gpu.software => Some(gpu),
            _ => None,
        };
        plan.transform_up(|node| {
            if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
                if !force && !large(aggregate.input(), options.min_rows) {
                    return Ok(Transformed::no(node));
                }
                let (Some(gpu), Some(_)) = (
                    GpuAggregateExec::try_new(aggregate, options.block_rows, accelerator),
                    usable(),
                ) else {
                    return Ok(Transformed::no(node));
                };
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if let Some(join) = node.downcast_ref::<HashJoinExec>() {
                // The probe side decides the work; the build side is read
                // once.
                if !force
                    && (!large(join.right(), options.min_rows)
                        || large(join.left(), options.join_build_rows_max.saturating_add(1)))
                {
                    return Ok(Transformed::no(node));
                }
                let (Some(gpu), Some(_)) = (
                    GpuHashJoinExec::try_new(join, options.block_rows, accelerator),
                    usable(),
                ) else {
                    return Ok(Transformed::no(node));
                };
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                if !force && !large(projection.input(), options.min_rows) {
                    return Ok(Transformed::no(node));
                }
                let (Some(gpu), Some(device)) = (
                    GpuProjectionExec::try_new(projection, options.block_rows, accelerator),
                    usable(),
                ) else {
                    return Ok(Transformed::no(node));
                };
                if gpu.buffers() > device.max_bindings as usize {
                    return Ok(Transformed::no(node));
                }
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if let Some(sort) = node.downcast_ref::<SortExec>() {
                if !force && !large(sort.input(), options.min_rows) {
                    return Ok(Transformed::no(node));
                }
                let (Some(gpu), Some(_)) = (GpuSortExec::try_new(sort, accelerator), usable())
                else {
                    return Ok(Transformed::no(node));
                };
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            let Some(filter) = node.downcast_ref::<FilterExec>() else {
                return Ok(Transformed::no(node));
            };
            if filter.fetch().is_some() || (!force && !large(filter.input(), options.min_rows)) {
                return Ok(Transformed::no(node));
            }
            let Some(kernel) = compile_predicate(filter.predicate(), &filter.input().schema())
            else {
                return Ok(Transformed::no(node));
            };
            let Some(gpu) = usable() else {
                return Ok(Transformed::no(node));
            };
            if kernel.buffers() > gpu.max_bindings as usize {
                return Ok(Transformed::no(node));
            }
            // A round-robin repartition under the filter only spreads its
            // rows over the CPU's threads, and coalesces small batches (a
            // table's or a row group's last piece) into new ones, whose
            // buffers differ every query: the device needs no spread, and
            // its column cache is keyed by the scan's buffers. The filter
            // goes below it (a filter commutes with a round-robin spread).
            if let Some(spread) = filter.input().downcast_ref::<RepartitionExec>()
                && matches!(spread.partitioning(), Partitioning::RoundRobinBatch(_))
            {
                let twin = FilterExecBuilder::from(filter)
                    .with_input(Arc::clone(spread.input()))
                    .build()?;
                let gpu =
                    GpuFilterExec::new(Arc::new(twin), kernel, options.block_rows, accelerator);
                let mut above =
                    RepartitionExec::try_new(Arc::new(gpu), spread.partitioning().clone())?;
                if spread.preserve_order() {
                    above = above.with_preserve_order();
                }
                return Ok(Transformed::yes(Arc::new(above) as Arc<dyn ExecutionPlan>));
            }
            let twin = Arc::new(filter.clone());
            Ok(Transformed::yes(Arc::new(GpuFilterExec::new(
                twin,
                kernel,
                options.block_rows,
                accelerator,
            )) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "cirro_gpu_operators"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `plan`'s estimated output reaches `min_rows`.
fn large(plan: &Arc<dyn ExecutionPlan>, min_rows: usize) -> bool {
    let stats = StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new());
    match stats.map(|s| s.num_rows.clone()) {
        Ok(Precision::Exact(n) | Precision::Inexact(n)) => n >= min_rows,
        _ => false,
    }
}
