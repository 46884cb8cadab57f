//! `GpuFilterExec`, the twin of DataFusion's `FilterExec`: the input's
//! batches are gathered into blocks (large transfers pay, small ones do
//! not), the predicate's kernel flags each row and counts per workgroup,
//! a prefix sum gives each workgroup its offset, the flagged rows' indices
//! are compacted, copied back and the rows gathered on the host. A block
//! the device cannot take (its memory held by others) is filtered on the
//! CPU, as `FilterExec` would: the answer never depends on the device.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::buffer::Buffer;
use arrow::compute::{concat_batches, take_record_batch};
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder, batch_filter};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::codegen::PredicateKernel;
use crate::columns::{HostColumn, encode};
use crate::device::{Gpu, GpuError, GpuResult, Launch};
use crate::kernels;
use crate::memory::{Access, DeviceMemory, RegionId};
use crate::scheduler::Ticket;

/// A filter whose predicate runs on the device.
#[derive(Debug)]
pub struct GpuFilterExec {
    /// The CPU filter it replaces: its properties, and the fallback.
    twin: Arc<FilterExec>,
    kernel: Arc<PredicateKernel>,
    /// Rows per block (the device's limits and budget may lower it).
    block_rows: usize,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuFilterExec {
    pub fn new(twin: Arc<FilterExec>, kernel: PredicateKernel, block_rows: usize) -> Self {
        Self {
            twin,
            kernel: Arc::new(kernel),
            block_rows: block_rows.max(1),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for GpuFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        crate::fmt_twin(self.twin.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuFilterExec {
    fn name(&self) -> &str {
        "GpuFilterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.twin.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.twin.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        f(self.twin.predicate())
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [child] = children.as_slice() else {
            return Err(DataFusionError::Internal(
                "GpuFilterExec has one child".into(),
            ));
        };
        let twin = FilterExecBuilder::from(self.twin.as_ref())
            .with_input(Arc::clone(child))
            .build()?;
        Ok(Arc::new(Self {
            twin: Arc::new(twin),
            kernel: Arc::clone(&self.kernel),
            block_rows: self.block_rows,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.twin.input().execute(partition, Arc::clone(&context))?;
        let schema = self.twin.schema();
        let batch_size = context.session_config().batch_size().max(1);
        let partitions = self.partitions();
        let run = Arc::new(Run {
            partitions,
            kernel: Arc::clone(&self.kernel),
            predicate: Arc::clone(self.twin.predicate()),
            projection: self.twin.projection().as_ref().map(|p| p.to_vec()),
            metrics: Metrics::new(&self.metrics, partition),
        });
        let block_rows = self.kernel_block_rows();
        let input_schema = input.schema();
        let query = context.session_id();
        let state = Blocks {
            input,
            ended: false,
            carry: None,
            ticket: None,
        };
        let blocks = futures::stream::unfold(state, move |mut state| {
            let run = Arc::clone(&run);
            let input_schema = Arc::clone(&input_schema);
            let query = query.clone();
            async move {
                let block = match state.next_block(&input_schema, block_rows).await {
                    Ok(Some(block)) => block,
                    Ok(None) => return None,
                    Err(e) => {
                        state.ended = true;
                        state.carry = None;
                        return Some((Err(e), state));
                    }
                };
                let ticket = state.ticket.take();
                let work = tokio::task::spawn_blocking(move || {
                    let mut ticket = ticket;
                    let filtered = run.block(&block, &query, &mut ticket);
                    (filtered, ticket)
                })
                .await;
                match work {
                    Ok((filtered, ticket)) => {
                        // The last block ends the operator's turn on the device.
                        if !state.ended || state.carry.is_some() {
                            state.ticket = ticket;
                        }
                        Some((filtered, state))
                    }
                    Err(e) => {
                        state.ended = true;
                        state.carry = None;
                        Some((Err(DataFusionError::External(Box::new(e))), state))
                    }
                }
            }
        });
        // Blocks come back in the session's batch size.
        let out = blocks.flat_map(move |block| {
            let pieces: Vec<Result<RecordBatch>> = match block {
                Ok(b) => (0..b.num_rows())
                    .step_by(batch_size)
                    .map(|o| Ok(b.slice(o, batch_size.min(b.num_rows() - o))))
                    .collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(pieces)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out.boxed())))
    }
}

impl GpuFilterExec {
    /// Partitions that run at once.
    fn partitions(&self) -> usize {
        self.twin
            .input()
            .properties()
            .output_partitioning()
            .partition_count()
            .max(1)
    }

    /// Rows per block: the configured number, fewer where the blocks of
    /// all partitions would pass the device-memory budget or a buffer the
    /// device's largest binding.
    fn kernel_block_rows(&self) -> usize {
        let (Some(gpu), Some(memory)) = (crate::device(), crate::memory()) else {
            return self.block_rows;
        };
        // The partitions run at once; a tenth is left to the column cache
        // and rounding.
        let share = memory.budget() as f64 * 0.9 / self.partitions() as f64;
        let by_budget = (share / per_row(&self.kernel)) as usize;
        let by_binding = (gpu.max_binding / 8) as usize;
        self.block_rows.min(by_budget).min(by_binding).max(256)
    }
}

/// The input cut into blocks of at most `block_rows` rows.
struct Blocks {
    input: SendableRecordBatchStream,
    ended: bool,
    /// Rows of the last batch read that did not fit in the last block.
    carry: Option<RecordBatch>,
    /// The operator's turn on the device, from its first block to its last.
    ticket: Option<Ticket<'static>>,
}

impl Blocks {
    /// The next block: batches gathered until `block_rows`, the rest of the
    /// last one carried to the next block; None at the end.
    async fn next_block(
        &mut self,
        schema: &arrow::datatypes::SchemaRef,
        block_rows: usize,
    ) -> Result<Option<RecordBatch>> {
        let mut batches: Vec<RecordBatch> = self.carry.take().into_iter().collect();
        let mut rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        while rows < block_rows && !self.ended {
            match self.input.next().await {
                Some(batch) => {
                    let batch = batch?;
                    rows += batch.num_rows();
                    batches.push(batch);
                }
                None => self.ended = true,
            }
        }
        if batches.is_empty() {
            return Ok(None);
        }
        let block = concat_batches(schema, &batches)?;
        if block.num_rows() > block_rows {
            self.carry = Some(block.slice(block_rows, block.num_rows() - block_rows));
            return Ok(Some(block.slice(0, block_rows)));
        }
        Ok(Some(block))
    }
}

/// Device bytes per row of a block: flags, the compacted indices, each
/// column and its validity bit.
fn per_row(kernel: &PredicateKernel) -> f64 {
    let mut bytes = 8.0;
    for b in &kernel.bindings {
        bytes += b.repr.width() as f64 + if b.nullable { 0.125 } else { 0.0 };
    }
    bytes
}

/// The metrics EXPLAIN ANALYZE shows.
struct Metrics {
    dispatches: Count,
    gpu_blocks: Count,
    cpu_blocks: Count,
    transfer: Time,
    kernel: Time,
    wait: Time,
    /// 1 while a partition waits for the query's turn (`cirro.queries.gpu`).
    waiting: Gauge,
}

impl Metrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            dispatches: MetricBuilder::new(set).counter("gpu_dispatches", partition),
            gpu_blocks: MetricBuilder::new(set).counter("gpu_blocks", partition),
            cpu_blocks: MetricBuilder::new(set).counter("cpu_blocks", partition),
            transfer: MetricBuilder::new(set).subset_time("gpu_upload_time", partition),
            kernel: MetricBuilder::new(set).subset_time("gpu_kernel_time", partition),
            wait: MetricBuilder::new(set).subset_time("gpu_wait_time", partition),
            waiting: MetricBuilder::new(set).gauge("gpu_waiting", partition),
        }
    }
}

struct Run {
    /// Partitions of the operator (its demand is all of theirs).
    partitions: usize,
    kernel: Arc<PredicateKernel>,
    predicate: Arc<dyn PhysicalExpr>,
    projection: Option<Vec<usize>>,
    metrics: Metrics,
}

impl Run {
    /// One block filtered: on the device, else on the CPU.
    /// The first block on the device waits for the query's turn
    /// (`scheduler.rs`), with the block's device memory as its demand; the
    /// ticket is kept until the operator ends.
    fn block(
        &self,
        block: &RecordBatch,
        query: &str,
        ticket: &mut Option<Ticket<'static>>,
    ) -> Result<RecordBatch> {
        let on_device = match (crate::device(), crate::memory(), crate::scheduler()) {
            (Some(gpu), Some(memory), Some(scheduler)) if block.num_rows() > 0 => {
                if ticket.is_none() {
                    // The operator's demand: every partition's block.
                    let demand = self.block_bytes(block.num_rows()) * self.partitions as u64;
                    self.metrics.waiting.add(1);
                    let admitted = scheduler.enter(query, block.num_rows() as f64, demand);
                    self.metrics.waiting.sub(1);
                    self.metrics.wait.add_duration(admitted.waited);
                    *ticket = Some(admitted);
                }
                match self.on_device(gpu, memory, block) {
                    Ok(indices) => Some(indices),
                    Err(e) => {
                        log::debug!("{e}; the block is filtered on the CPU");
                        None
                    }
                }
            }
            _ => None,
        };
        let filtered = match on_device {
            Some(indices) => {
                self.metrics.gpu_blocks.add(1);
                take_record_batch(block, &UInt32Array::from(indices))?
            }
            None => {
                self.metrics.cpu_blocks.add(1);
                batch_filter(block, &self.predicate)?
            }
        };
        Ok(match &self.projection {
            Some(p) => filtered.project(p)?,
            None => filtered,
        })
    }

    /// Device memory a block of `rows` rows holds.
    fn block_bytes(&self, rows: usize) -> u64 {
        (per_row(&self.kernel) * rows as f64) as u64
    }

    /// The indices of the rows the predicate keeps.
    fn on_device(
        &self,
        gpu: &Gpu,
        memory: &DeviceMemory,
        block: &RecordBatch,
    ) -> GpuResult<Vec<u32>> {
        let rows = block.num_rows() as u64;
        if rows > u64::from(u32::MAX) / 2 {
            return Err(GpuError("block too large".into()));
        }
        let start = std::time::Instant::now();
        let mut regions: Vec<(RegionId, Access)> = Vec::new();
        let mut params: Vec<u32> = vec![rows as u32];
        let columns: Vec<HostColumn> = self
            .kernel
            .bindings
            .iter()
            .map(|b| {
                let array: &ArrayRef = block.column(b.column);
                encode(array).ok_or_else(|| GpuError("column type changed".into()))
            })
            .collect::<GpuResult<_>>()?;
        for test in &self.kernel.texts {
            let (lo, hi) = test.bound.range(&columns[test.binding].dictionary);
            params.extend([lo, hi]);
        }
        let all_valid = || Buffer::from_vec(vec![u32::MAX; rows.div_ceil(32) as usize]);
        let result = (|| {
            for (binding, column) in self.kernel.bindings.iter().zip(&columns) {
                regions.push((memory.region_with(column.values.clone())?, Access::Read));
                if binding.nullable {
                    let validity = column.validity.clone().unwrap_or_else(all_valid);
                    regions.push((memory.region_with(validity)?, Access::Read));
                }
            }
            let (flag_bytes, count_bytes) = kernels::flag_bytes(rows);
            let flags = memory.region(flag_bytes)?;
            let counts = memory.region(count_bytes)?;
            let offsets = memory.region(count_bytes)?;
            let out = memory.region(rows * 4)?;
            let scratch = [flags, counts, offsets, out];
            for r in scratch {
                regions.push((r, Access::Write));
            }
            let buffers = memory.acquire(gpu, &regions)?;
            let held: Vec<RegionId> = regions.iter().map(|(r, _)| *r).collect();
            let outcome = (|| {
                let params = gpu.upload(&Buffer::from_vec(params.clone()));
                let kernel = gpu.kernel(&self.kernel.source)?;
                let n = buffers.len();
                let (flags, counts, offsets, out) = (
                    &buffers[n - 4],
                    &buffers[n - 3],
                    &buffers[n - 2],
                    &buffers[n - 1],
                );
                let mut bound = vec![&params.buffer, &flags.buffer, &counts.buffer];
                bound.extend(buffers[..n - 4].iter().map(|b| &b.buffer));
                self.metrics.transfer.add_duration(start.elapsed());
                let kernel_start = std::time::Instant::now();
                gpu.run(&[Launch {
                    kernel: &kernel,
                    buffers: bound,
                    threads: rows,
                }])?;
                let indices = kernels::compact(gpu, rows, flags, counts, offsets, out);
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                self.metrics.dispatches.add(3);
                indices
            })();
            memory.release(&held);
            outcome
        })();
        memory.free(&regions.iter().map(|(r, _)| *r).collect::<Vec<_>>());
        result
    }
}
