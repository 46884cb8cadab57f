//! `GpuFilterExec`, the twin of DataFusion's `FilterExec`: the input's
//! batches are gathered into blocks (large transfers pay, small ones do
//! not), the predicate's kernel flags each row and counts per workgroup,
//! a prefix sum gives each workgroup its offset, the flagged rows' indices
//! are compacted, copied back and the rows gathered on the host. Columns
//! other than text come from the column cache (`memory.rs`), one entry per
//! input batch, when the same batch was filtered before: a scan of data
//! the host's cache holds feeds the same buffers to every query (the scan
//! drops no rows under a GPU filter, see `CacheScans`), and the device
//! keeps them between queries; a block's column is put together from its
//! batches' entries by copies on the device. A block
//! the device cannot take (its memory held by others) is filtered on the
//! CPU, as `FilterExec` would: the answer never depends on the device.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::buffer::Buffer;
use arrow::compute::take_record_batch;
use datafusion::common::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::{FilterExec, batch_filter};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};

use crate::Accelerator;
use crate::blocks::{self, Assembly, Block, Metrics, Turn};
use crate::codegen::PredicateKernel;
use crate::columns::{HostColumn, Repr, encode, repr_of};
use crate::device::{Gpu, GpuError, GpuResult, Launch};
use crate::kernels;
use crate::memory::{Access, DeviceMemory};

/// A filter whose predicate runs on the device.
#[derive(Debug)]
pub struct GpuFilterExec {
    /// The CPU filter it replaces: its properties, and the fallback.
    twin: Arc<FilterExec>,
    kernel: Arc<PredicateKernel>,
    /// Rows per block (the device's limits and budget may lower it).
    block_rows: usize,
    accelerator: Arc<Accelerator>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuFilterExec {
    pub fn new(
        twin: Arc<FilterExec>,
        kernel: PredicateKernel,
        block_rows: usize,
        accelerator: &Arc<Accelerator>,
    ) -> Self {
        Self {
            twin,
            kernel: Arc::new(kernel),
            block_rows: block_rows.max(1),
            accelerator: Arc::clone(accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

twin_plan!(
    GpuFilterExec,
    FilterExec,
    |this: &GpuFilterExec, cpu: &FilterExec| {
        // The predicate is the twin's: its kernel stays.
        Some(GpuFilterExec {
            twin: Arc::new(cpu.clone()),
            kernel: Arc::clone(&this.kernel),
            block_rows: this.block_rows,
            accelerator: Arc::clone(&this.accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
);

impl GpuFilterExec {
    /// The operator's stream for `partition` (`ExecutionPlan::execute`).
    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.twin.input().execute(partition, Arc::clone(&context))?;
        let run = Run {
            at_once: self.at_once(),
            kernel: Arc::clone(&self.kernel),
            predicate: Arc::clone(self.twin.predicate()),
            projection: self.twin.projection().as_ref().map(|p| p.to_vec()),
            accelerator: Arc::clone(&self.accelerator),
            metrics: Metrics::new(&self.metrics, partition),
        };
        let query = context.session_id();
        let block_rows = blocks::block_rows(
            &self.accelerator,
            self.block_rows,
            self.at_once(),
            per_row(&self.kernel),
            8,
        );
        Ok(blocks::blockwise(
            input,
            block_rows,
            context.session_config().batch_size(),
            self.twin.schema(),
            &self.accelerator,
            Arc::new(move |block, turn| run.block(block, &query, turn)),
        ))
    }
}

impl GpuFilterExec {
    /// Blocks on the device at once: every partition's in flight.
    fn at_once(&self) -> usize {
        blocks::partitions(self.twin.input()) * blocks::IN_FLIGHT
    }
}

/// Device bytes per row of a block: flags, the compacted indices, each
/// column (twice where cached pieces are put together into the block's)
/// and its validity bits (three times: cached, staged and packed).
fn per_row(kernel: &PredicateKernel) -> f64 {
    let mut bytes = 8.0;
    for b in &kernel.bindings {
        let copies = if b.repr == Repr::Code { 1.0 } else { 2.0 };
        bytes += copies * b.repr.width() as f64 + if b.nullable { 0.375 } else { 0.0 };
    }
    bytes
}

struct Run {
    /// Blocks of the operator on the device at once (its demand is all of
    /// theirs).
    at_once: usize,
    kernel: Arc<PredicateKernel>,
    predicate: Arc<dyn PhysicalExpr>,
    projection: Option<Vec<usize>>,
    accelerator: Arc<Accelerator>,
    metrics: Metrics,
}

impl Run {
    /// One block filtered: on the device, else on the CPU.
    /// The first block on the device waits for the query's turn
    /// (`scheduler.rs`), with the block's device memory as its demand; the
    /// ticket is kept until the operator ends.
    fn block(&self, whole: &Block, query: &str, turn: &Turn) -> Result<RecordBatch> {
        let block = &whole.rows;
        let on_device = match self.accelerator.both() {
            Some((gpu, memory)) if block.num_rows() > 0 => {
                // The operator's demand: every block on the device at once.
                let demand = self.block_bytes(block.num_rows()) * self.at_once as u64;
                turn.admit(&self.metrics, query, block.num_rows(), demand);
                let indices = self.on_device(gpu, memory, whole, turn);
                turn.acquired();
                match indices {
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
        whole: &Block,
        turn: &Turn,
    ) -> GpuResult<Vec<u32>> {
        let block = &whole.rows;
        let rows = block.num_rows() as u64;
        if rows > u64::from(u32::MAX) / 2 {
            return Err(GpuError("block too large".into()));
        }
        let start = std::time::Instant::now();
        let mut params: Vec<u32> = vec![rows as u32];
        // Text is coded per block, and its dictionary gives the kernel's
        // bounds; the other columns come from the column cache.
        let mut texts: Vec<Option<HostColumn>> = Vec::new();
        for b in &self.kernel.bindings {
            let array: &ArrayRef = block.column(b.column);
            if repr_of(array.data_type()) != Some(b.repr) {
                return Err(GpuError("column type changed".into()));
            }
            texts.push(if b.repr == Repr::Code {
                encode(array)
            } else {
                None
            });
        }
        for test in &self.kernel.texts {
            let dictionary = texts[test.binding]
                .as_ref()
                .map(|c| c.dictionary.as_slice());
            let (lo, hi) = test.bound.range(dictionary.unwrap_or_default());
            params.extend([lo, hi]);
        }
        let mut inputs = Assembly::default();
        let result = (|| {
            for (binding, text) in self.kernel.bindings.iter().zip(&texts) {
                if let Some(column) = text {
                    inputs.bind(memory, column.values.clone())?;
                    if binding.nullable {
                        let validity = column
                            .validity
                            .clone()
                            .unwrap_or_else(|| all_valid(rows as usize));
                        inputs.bind(memory, validity)?;
                    }
                    continue;
                }
                inputs.bind_column(memory, whole, binding)?;
            }
            let (flag_bytes, count_bytes) = kernels::flag_bytes(rows);
            let scratch = [
                memory.region(flag_bytes)?,
                memory.region(count_bytes)?,
                memory.region(count_bytes)?,
                memory.region(rows * 4)?,
            ];
            let first_scratch = inputs.regions.len();
            for r in scratch {
                inputs.regions.push((r, Access::Write));
            }
            memory.holding(gpu, &inputs.regions, |buffers| {
                turn.acquired();
                let params = gpu.upload(&Buffer::from_vec(params.clone()));
                let kernel = gpu.kernel(&self.kernel.source)?;
                let [flags, counts, offsets, out] =
                    [0, 1, 2, 3].map(|i| &buffers[first_scratch + i]);
                let mut bindings = vec![&params.buffer, &flags.buffer, &counts.buffer];
                bindings.extend(inputs.bound.iter().map(|i| &buffers[*i].buffer));
                self.metrics.transfer.add_duration(start.elapsed());
                let kernel_start = std::time::Instant::now();
                let dispatches = inputs.run(
                    gpu,
                    &buffers,
                    Launch {
                        kernel: &kernel,
                        buffers: bindings,
                        threads: rows,
                    },
                )?;
                let indices = kernels::compact(gpu, rows, flags, counts, offsets, out);
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                self.metrics.dispatches.add(dispatches as usize + 2);
                indices
            })
        })();
        inputs.finish(memory);
        result
    }
}

/// All-valid bits of `rows` rows.
fn all_valid(rows: usize) -> Buffer {
    Buffer::from_vec(vec![u32::MAX; rows.div_ceil(32)])
}
