//! GPU operators (Hetero-DB's heterogeneous engine, ported to portable
//! compute shaders): kernels in WGSL run through `wgpu` on Vulkan (NVIDIA,
//! AMD, Intel; Metal on Apple) or Mesa's lavapipe software device in tests.
//!
//! - `device`: the device, its kernel cache and counters;
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

use std::sync::OnceLock;

pub use aggregate::GpuAggregateExec;
pub use device::{Gpu, GpuError, device};
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

static MEMORY: OnceLock<DeviceMemory> = OnceLock::new();

/// Set the device-memory budget and replacement policy; only before the
/// first use of the device (false after it).
pub fn configure(budget: u64, policy: Policy) -> bool {
    MEMORY
        .set(DeviceMemory::new(budget, policy, DEFAULT_LATENCY))
        .is_ok()
}

/// The device's memory manager; None without a device.
pub fn memory() -> Option<&'static DeviceMemory> {
    device()?;
    Some(MEMORY.get_or_init(|| DeviceMemory::new(DEFAULT_MEMORY, Policy::Cdr, DEFAULT_LATENCY)))
}

/// The device's scheduler (its capacity the device-memory budget); None
/// without a device.
pub fn scheduler() -> Option<&'static scheduler::Scheduler> {
    static SCHEDULER: OnceLock<scheduler::Scheduler> = OnceLock::new();
    let memory = memory()?;
    Some(SCHEDULER.get_or_init(|| scheduler::Scheduler::new(memory.budget())))
}
