//! What the block-at-a-time GPU operators share: their input gathered into
//! blocks (large transfers pay, small ones do not), each block worked on a
//! blocking thread, the operator's turn on the device (`scheduler.rs`) held
//! from its first block to its last, and the metrics EXPLAIN ANALYZE shows.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::scheduler::Ticket;

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
        schema: &SchemaRef,
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

/// What one block becomes: `work(block, ticket)`, on a blocking thread;
/// `ticket` is the operator's turn on the device, None until its first
/// block takes it (see [`admit`]).
pub(crate) type Work =
    dyn Fn(&RecordBatch, &mut Option<Ticket<'static>>) -> Result<RecordBatch> + Send + Sync;

/// `input` in blocks of `block_rows`, each passed through `work`, the
/// results cut to the session's `batch_size` and typed `schema`.
pub(crate) fn blockwise(
    input: SendableRecordBatchStream,
    block_rows: usize,
    batch_size: usize,
    schema: SchemaRef,
    work: Arc<Work>,
) -> SendableRecordBatchStream {
    let input_schema = input.schema();
    let state = Blocks {
        input,
        ended: false,
        carry: None,
        ticket: None,
    };
    let blocks = futures::stream::unfold(state, move |mut state| {
        let work = Arc::clone(&work);
        let input_schema = Arc::clone(&input_schema);
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
            let done = tokio::task::spawn_blocking(move || {
                let mut ticket = ticket;
                let out = work(&block, &mut ticket);
                (out, ticket)
            })
            .await;
            match done {
                Ok((out, ticket)) => {
                    // The last block ends the operator's turn on the device.
                    if !state.ended || state.carry.is_some() {
                        state.ticket = ticket;
                    }
                    Some((out, state))
                }
                Err(e) => {
                    state.ended = true;
                    state.carry = None;
                    Some((Err(DataFusionError::External(Box::new(e))), state))
                }
            }
        }
    });
    let batch_size = batch_size.max(1);
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
    Box::pin(RecordBatchStreamAdapter::new(schema, out.boxed()))
}

/// The metrics EXPLAIN ANALYZE shows.
pub(crate) struct Metrics {
    pub dispatches: Count,
    pub gpu_blocks: Count,
    pub cpu_blocks: Count,
    pub transfer: Time,
    pub kernel: Time,
    pub wait: Time,
    /// 1 while a partition waits for the query's turn (`cirro.queries.gpu`).
    pub waiting: Gauge,
}

impl Metrics {
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
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

    /// The operator's turn on the device: the first block waits for the
    /// query's turn (`scheduler.rs`) with `demand` bytes of device memory
    /// over `rows` rows; the ticket is kept until the operator ends.
    pub fn admit(
        &self,
        ticket: &mut Option<Ticket<'static>>,
        query: &str,
        rows: usize,
        demand: u64,
    ) {
        let Some(scheduler) = crate::scheduler() else {
            return;
        };
        if ticket.is_none() {
            self.waiting.add(1);
            let admitted = scheduler.enter(query, rows as f64, demand);
            self.waiting.sub(1);
            self.wait.add_duration(admitted.waited);
            *ticket = Some(admitted);
        }
    }
}

/// Rows per block: `wanted`, fewer where the blocks of all `partitions`
/// would pass the device-memory budget at `per_row` bytes a row, or one
/// buffer of `widest` bytes a row the device's largest binding.
pub(crate) fn block_rows(wanted: usize, partitions: usize, per_row: f64, widest: u64) -> usize {
    let (Some(gpu), Some(memory)) = (crate::device(), crate::memory()) else {
        return wanted;
    };
    // The partitions run at once; a tenth is left to the column cache and
    // rounding.
    let share = memory.budget() as f64 * 0.9 / partitions.max(1) as f64;
    let by_budget = (share / per_row) as usize;
    let by_binding = (gpu.max_binding / widest.max(1)) as usize;
    wanted.min(by_budget).min(by_binding).max(256)
}
