//! What the block-at-a-time GPU operators share: their input gathered into
//! blocks (large transfers pay, small ones do not), each block worked on a
//! blocking thread, the operator's turn on the device (`scheduler.rs`) held
//! from its first block to its last, and the metrics EXPLAIN ANALYZE shows.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
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

/// A block of rows, and the input batches (or parts of them) it was cut
/// from, in order: the column cache names a column by them.
pub(crate) struct Block {
    pub rows: RecordBatch,
    pieces: Vec<RecordBatch>,
}

impl Block {
    /// The column cache's key of column `i`, and the host buffers it
    /// names: each piece's buffers (address and length), offset and length.
    /// Arrow buffers never change, and the cache keeps the named ones
    /// alive, so a key names one content for as long as it exists.
    pub fn column_key(&self, i: usize) -> (String, Vec<Buffer>) {
        use std::fmt::Write;
        let mut key = String::new();
        let mut pins = Vec::new();
        for piece in &self.pieces {
            let data = piece.column(i).to_data();
            let _ = write!(key, "{}+{}", data.offset(), data.len());
            for b in data.buffers() {
                let _ = write!(key, ",{:x}/{}", b.as_ptr() as usize, b.len());
                pins.push(b.clone());
            }
            if let Some(n) = data.nulls() {
                let b = n.buffer();
                let _ = write!(
                    key,
                    ",n{:x}/{}+{}",
                    b.as_ptr() as usize,
                    n.offset(),
                    n.len()
                );
                pins.push(b.clone());
            }
            key.push(';');
        }
        (key, pins)
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
    async fn next_block(&mut self, schema: &SchemaRef, block_rows: usize) -> Result<Option<Block>> {
        let mut pieces: Vec<RecordBatch> = Vec::new();
        let mut rows = 0;
        while rows < block_rows {
            let batch = match self.carry.take() {
                Some(batch) => batch,
                None if self.ended => break,
                None => match self.input.next().await {
                    Some(batch) => batch?,
                    None => {
                        self.ended = true;
                        break;
                    }
                },
            };
            let wanted = block_rows - rows;
            if batch.num_rows() > wanted {
                self.carry = Some(batch.slice(wanted, batch.num_rows() - wanted));
                pieces.push(batch.slice(0, wanted));
                rows += wanted;
            } else {
                rows += batch.num_rows();
                pieces.push(batch);
            }
        }
        if pieces.is_empty() {
            return Ok(None);
        }
        let rows = concat_batches(schema, &pieces)?;
        Ok(Some(Block { rows, pieces }))
    }
}

/// What one block becomes: `work(block, ticket)`, on a blocking thread;
/// `ticket` is the operator's turn on the device, None until its first
/// block takes it (see [`admit`]).
pub(crate) type Work =
    dyn Fn(&Block, &mut Option<Ticket<'static>>) -> Result<RecordBatch> + Send + Sync;

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
