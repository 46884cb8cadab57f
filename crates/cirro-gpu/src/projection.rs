//! `GpuProjectionExec`, the twin of DataFusion's `ProjectionExec`: the
//! projection's arithmetic (`+ - *` and casts of integers and decimals,
//! [`compile_projection`]) computed on the device, one kernel per
//! projection, a block of rows at a time; its plain columns pass through
//! on the host.
//!
//! The kernel reads the input columns from the column cache (as a
//! selection does), writes one 64-bit column per expression and sets a
//! flag where a row's value leaves its type's range. DataFusion's checked
//! arithmetic fails there, so such a block goes to the CPU, which answers
//! (or fails) as DataFusion does. A result is NULL exactly where one of
//! the columns it reads is (its constants are never NULL): the host
//! derives the validity from theirs.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Decimal128Array, Int64Array, RecordBatch};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};

use crate::Accelerator;
use crate::blocks::{self, Assembly, Block, Metrics, Turn};
use crate::codegen::{ProjectionKernel, compile_projection};
use crate::columns::words;
use crate::device::{Gpu, GpuError, GpuResult, Launch};
use crate::memory::{Access, DeviceMemory};

/// Where an output column comes from.
#[derive(Debug, Clone)]
enum Output {
    /// The input's column, passed through.
    Input(usize),
    /// The kernel's output `j`, NULL where one of `columns` is.
    Computed { j: usize, columns: Vec<usize> },
}

/// A projection with arithmetic on the device.
#[derive(Debug)]
pub struct GpuProjectionExec {
    twin: Arc<ProjectionExec>,
    kernel: Arc<ProjectionKernel>,
    outputs: Arc<Vec<Output>>,
    block_rows: usize,
    accelerator: Arc<Accelerator>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuProjectionExec {
    /// The twin of `projection` where the device can compute every
    /// expression that is not a plain column, and there is one.
    pub fn try_new(
        projection: &ProjectionExec,
        block_rows: usize,
        accelerator: &Arc<Accelerator>,
    ) -> Option<Self> {
        let schema = projection.input().schema();
        let mut outputs = Vec::new();
        let mut computed: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        for p in projection.expr() {
            if let Some(c) = p.expr.downcast_ref::<Column>() {
                outputs.push(Output::Input(c.index()));
                continue;
            }
            let mut columns: Vec<usize> =
                collect_columns(&p.expr).iter().map(Column::index).collect();
            columns.sort_unstable();
            outputs.push(Output::Computed {
                j: computed.len(),
                columns,
            });
            computed.push(Arc::clone(&p.expr));
        }
        if computed.is_empty() {
            return None;
        }
        let kernel = compile_projection(&computed, &schema)?;
        Some(Self {
            twin: Arc::new(projection.clone()),
            kernel: Arc::new(kernel),
            outputs: Arc::new(outputs),
            block_rows: block_rows.max(1),
            accelerator: Arc::clone(accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Buffers the kernel binds.
    pub fn buffers(&self) -> usize {
        self.kernel.buffers()
    }

    /// Blocks on the device at once: every partition's in flight.
    fn at_once(&self) -> usize {
        blocks::partitions(self.twin.input()) * blocks::IN_FLIGHT
    }
}

twin_plan!(
    GpuProjectionExec,
    ProjectionExec,
    |this: &GpuProjectionExec, cpu: &ProjectionExec| {
        GpuProjectionExec::try_new(cpu, this.block_rows, &this.accelerator)
    }
);

impl GpuProjectionExec {
    /// The operator's stream for `partition` (`ExecutionPlan::execute`).
    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.twin.input().execute(partition, Arc::clone(&context))?;
        let run = Run {
            twin: Arc::clone(&self.twin),
            kernel: Arc::clone(&self.kernel),
            outputs: Arc::clone(&self.outputs),
            at_once: self.at_once(),
            accelerator: Arc::clone(&self.accelerator),
            metrics: Metrics::new(&self.metrics, partition),
        };
        let query = context.session_id();
        let block_rows = blocks::block_rows(
            &self.accelerator,
            self.block_rows,
            self.at_once(),
            run.per_row(),
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

struct Run {
    twin: Arc<ProjectionExec>,
    kernel: Arc<ProjectionKernel>,
    outputs: Arc<Vec<Output>>,
    /// Blocks of the operator on the device at once.
    at_once: usize,
    accelerator: Arc<Accelerator>,
    metrics: Metrics,
}

impl Run {
    /// Device bytes a row: each bound column twice (cached pieces put
    /// together), its validity, and an 8-byte word per expression.
    fn per_row(&self) -> f64 {
        let inputs: f64 = self
            .kernel
            .bindings
            .iter()
            .map(|b| 2.0 * b.repr.width() as f64 + if b.nullable { 0.375 } else { 0.0 })
            .sum();
        inputs + 8.0 * self.kernel.types.len() as f64
    }

    /// One block projected: on the device, else on the CPU.
    fn block(&self, whole: &Block, query: &str, turn: &Turn) -> Result<RecordBatch> {
        let rows = whole.rows.num_rows();
        if let Some((gpu, memory)) = self.accelerator.both()
            && rows > 0
        {
            let demand = (self.per_row() * rows as f64) as u64 * self.at_once as u64;
            turn.admit(&self.metrics, query, rows, demand);
            let values = self.on_device(gpu, memory, whole, turn);
            turn.acquired();
            match values {
                Ok(Some(values)) => {
                    self.metrics.gpu_blocks.add(1);
                    return self.output(&whole.rows, values);
                }
                Ok(None) => {
                    log::debug!("a value passed its type; the block is projected on the CPU")
                }
                Err(e) => log::debug!("{e}; the block is projected on the CPU"),
            }
        }
        self.metrics.cpu_blocks.add(1);
        let columns = self
            .twin
            .expr()
            .iter()
            .map(|p| p.expr.evaluate(&whole.rows)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(self.twin.schema(), columns)?)
    }

    /// Each expression's values, or None where one left its type's range.
    fn on_device(
        &self,
        gpu: &Gpu,
        memory: &DeviceMemory,
        whole: &Block,
        turn: &Turn,
    ) -> GpuResult<Option<Vec<Vec<i64>>>> {
        let rows = whole.rows.num_rows() as u64;
        if rows > u64::from(u32::MAX) / 2 {
            return Err(GpuError("block too large".into()));
        }
        let start = std::time::Instant::now();
        let outputs = self.kernel.types.len();
        let mut inputs = Assembly::default();
        let result = (|| {
            for binding in &self.kernel.bindings {
                inputs.bind_column(memory, whole, binding)?;
            }
            let first_output = inputs.regions.len();
            inputs.regions.push((
                memory.region_with(Buffer::from_vec(vec![0u32]))?,
                Access::Write,
            ));
            for _ in 0..outputs {
                inputs
                    .regions
                    .push((memory.region(rows * 8)?, Access::Write));
            }
            memory.holding(gpu, &inputs.regions, |buffers| {
                turn.acquired();
                let params = gpu.upload(&Buffer::from_vec(vec![rows as u32]));
                let kernel = gpu.kernel(&self.kernel.source)?;
                let mut bindings = vec![&params.buffer];
                bindings.extend((0..=outputs).map(|i| &buffers[first_output + i].buffer));
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
                self.metrics.dispatches.add(dispatches as usize);
                let flag = gpu.download(&buffers[first_output].buffer, 4)?;
                let out = if words(&flag).any(|w| w != 0) {
                    None
                } else {
                    let mut values = Vec::with_capacity(outputs);
                    for i in 1..=outputs {
                        let bytes = gpu.download(&buffers[first_output + i].buffer, rows * 8)?;
                        values.push(
                            bytes
                                .chunks_exact(8)
                                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                                .collect(),
                        );
                    }
                    Some(values)
                };
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                Ok(out)
            })
        })();
        inputs.finish(memory);
        result
    }

    /// The output batch: plain columns from `block`, computed ones from
    /// the device's values with their columns' validity.
    fn output(&self, block: &RecordBatch, mut values: Vec<Vec<i64>>) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.outputs.len());
        for output in self.outputs.iter() {
            match output {
                Output::Input(i) => columns.push(Arc::clone(block.column(*i))),
                Output::Computed { j, columns: read } => {
                    let nulls = read.iter().fold(None, |acc: Option<NullBuffer>, c| {
                        NullBuffer::union(acc.as_ref(), block.column(*c).logical_nulls().as_ref())
                    });
                    let v = std::mem::take(&mut values[*j]);
                    columns.push(typed(v, nulls, &self.kernel.types[*j])?);
                }
            }
        }
        Ok(RecordBatch::try_new(self.twin.schema(), columns)?)
    }
}

/// 64-bit values (each within `data_type`'s range) as an array of it.
fn typed(values: Vec<i64>, nulls: Option<NullBuffer>, data_type: &DataType) -> Result<ArrayRef> {
    Ok(match data_type {
        DataType::Decimal128(p, s) => Arc::new(
            Decimal128Array::new(
                ScalarBuffer::from(values.into_iter().map(i128::from).collect::<Vec<_>>()),
                nulls,
            )
            .with_precision_and_scale(*p, *s)?,
        ),
        DataType::Int64 => Arc::new(Int64Array::new(ScalarBuffer::from(values), nulls)),
        // A NULL's word may be anything: zeroed before the narrowing cast.
        _ => {
            let values = match &nulls {
                Some(n) => values
                    .iter()
                    .enumerate()
                    .map(|(r, &v)| if n.is_valid(r) { v } else { 0 })
                    .collect(),
                None => values,
            };
            cast(
                &Int64Array::new(ScalarBuffer::from(values), nulls),
                data_type,
            )?
        }
    })
}
