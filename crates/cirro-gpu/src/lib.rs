//! GPU operators (Hetero-DB's heterogeneous engine, ported to portable
//! compute shaders): kernels in WGSL run through `wgpu` on Vulkan (NVIDIA,
//! AMD, Intel; Metal on Apple) or Mesa's lavapipe software device in tests.
//!
//! - `device`: the device, its kernel cache and counters (a node's
//!   [`Accelerator`] opens it and owns its memory manager and scheduler);
//! - `columns`: Arrow columns as kernels read them;
//! - `codegen`: predicates compiled into WGSL at runtime;
//! - `kernels`: the prefix sum and compaction every operator shares;
//! - `memory`: the device-memory manager (budget, pages, CDR eviction,
//!   column cache);
//! - `scheduler`: admission of concurrent GPU queries by their weighted
//!   device-memory demand;
//! - `filter`: `GpuFilterExec`;
//! - `sort`: `GpuSortExec` (radix sort, top-N);
//! - `aggregate`: `GpuAggregateExec` (hash aggregation, partial);
//! - `join`: `GpuHashJoinExec` (hash join, probe-side join types);
//! - `projection`: `GpuProjectionExec` (arithmetic compiled into WGSL);
//! - `blocks`: the input in blocks, the device's turn, the metrics;
//! - `rule`: the physical optimizer rule that puts operators on the device
//!   (`SET gpu = off | on | force`);
//! - `twin`: what every operator shares with its CPU twin (EXPLAIN, the
//!   plan's methods).

#[macro_use]
mod twin;

pub mod aggregate;
mod blocks;
pub mod codegen;
pub mod columns;
pub mod device;
pub mod filter;
pub mod join;
pub mod kernels;
pub mod memory;
pub mod projection;
pub mod rule;
pub mod scheduler;
pub mod sort;

use std::sync::{Arc, OnceLock};

pub use aggregate::GpuAggregateExec;
pub use device::{Gpu, GpuError};
pub use filter::GpuFilterExec;
pub use join::GpuHashJoinExec;
pub use memory::{DeviceMemory, Policy};
pub use projection::GpuProjectionExec;
pub use rule::{GpuOperators, GpuOptions};
pub use sort::GpuSortExec;

/// Whether `plan` is one of this crate's operators (for the engine's view
/// of a statement: `cirro.queries` shows where its GPU work stands).
pub fn is_gpu_operator(plan: &dyn datafusion::physical_plan::ExecutionPlan) -> bool {
    plan.is::<GpuFilterExec>()
        || plan.is::<GpuSortExec>()
        || plan.is::<GpuAggregateExec>()
        || plan.is::<GpuHashJoinExec>()
        || plan.is::<GpuProjectionExec>()
}

/// Whether `plan` is this crate's hash join (its left input the build side).
pub fn is_gpu_join(plan: &dyn datafusion::physical_plan::ExecutionPlan) -> bool {
    plan.is::<GpuHashJoinExec>()
}

/// Whether `plan` works row by row (the projection).
pub fn is_gpu_row_wise(plan: &dyn datafusion::physical_plan::ExecutionPlan) -> bool {
    plan.is::<GpuProjectionExec>()
}

/// Device memory when `--gpu-memory` does not say: 1 GiB.
pub const DEFAULT_MEMORY: u64 = 1 << 30;

/// CDR's latency factor f.
pub const DEFAULT_LATENCY: f64 = 0.5;

/// One node's GPU: its device (opened on first use; none where the machine
/// has none), the device-memory manager and the scheduler that admits
/// queries to it. The node builds one and hands it to the rule, which hands
/// it to every operator it places: nothing about the device is process-wide.
#[derive(Debug)]
pub struct Accelerator {
    device: OnceLock<Option<Arc<Gpu>>>,
    memory: DeviceMemory,
    scheduler: scheduler::Scheduler,
}

impl Accelerator {
    /// A device-memory budget of `budget` bytes under `policy`.
    pub fn new(budget: u64, policy: Policy) -> Self {
        Self {
            device: OnceLock::new(),
            memory: DeviceMemory::new(budget, policy, DEFAULT_LATENCY),
            scheduler: scheduler::Scheduler::new(budget),
        }
    }

    /// The device, opened on the first call; None where there is none.
    pub fn device(&self) -> Option<&Arc<Gpu>> {
        self.device
            .get_or_init(|| match Gpu::open() {
                Ok(gpu) => {
                    log::info!("GPU: {}", gpu.name);
                    Some(Arc::new(gpu))
                }
                Err(e) => {
                    log::info!("no GPU device: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// The device's memory manager; None without a device.
    pub fn memory(&self) -> Option<&DeviceMemory> {
        self.device()?;
        Some(&self.memory)
    }

    /// The device's scheduler (its capacity the device-memory budget); None
    /// without a device.
    pub fn scheduler(&self) -> Option<&scheduler::Scheduler> {
        self.device()?;
        Some(&self.scheduler)
    }

    /// The device and its memory, where there is a device.
    pub(crate) fn both(&self) -> Option<(&Arc<Gpu>, &DeviceMemory)> {
        Some((self.device()?, self.memory()?))
    }
}

impl Default for Accelerator {
    /// [`DEFAULT_MEMORY`] under CDR.
    fn default() -> Self {
        Self::new(DEFAULT_MEMORY, Policy::Cdr)
    }
}
