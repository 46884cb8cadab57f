//! What the block-at-a-time GPU operators share: their input gathered into
//! blocks (large transfers pay, small ones do not), each block worked on a
//! blocking thread while the next is gathered, the operator's turn on the device (`scheduler.rs`) held
//! from its first block to its last, and the metrics EXPLAIN ANALYZE shows.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::buffer::Buffer;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::device::{Copy, DeviceBuffer, Gpu, GpuResult, Launch};
use crate::kernels;
use crate::memory::{Access, DeviceMemory, RegionId};
use crate::scheduler::Ticket;

/// A block of rows, and the input batches it was made of, in order: the
/// column cache names a column of each by its buffers. A block ends before
/// an input batch that would not fit; only a batch larger than a block is
/// cut, so the batches a scan hands every query stay whole, whichever
/// partition reads them and whatever came before them.
pub(crate) struct Block {
    pub rows: RecordBatch,
    pub pieces: Vec<RecordBatch>,
}

impl Block {
    /// The column cache's key of column `i` of piece `p`, and the host
    /// buffers it names: the piece's buffers (address and length), offset
    /// and length. Arrow buffers never change, and the cache keeps the
    /// named ones alive, so a key names one content for as long as it
    /// exists.
    pub fn piece_key(&self, p: usize, i: usize) -> (String, Vec<Buffer>) {
        use std::fmt::Write;
        let data = self.pieces[p].column(i).to_data();
        let mut key = format!("{}:{}+{}", data.data_type(), data.offset(), data.len());
        let mut pins = Vec::new();
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
        (key, pins)
    }
}

/// How a column lies in device memory: words of so many bytes a row, or
/// one bit a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Words(u64),
    Bits,
}

/// A kernel's input columns on the device: the regions to acquire, in
/// order, those the kernel binds, and how a block's column is put together
/// from the column cache's entries, one per input batch: copies on the
/// device, and for bitmaps (whose batches do not meet at word boundaries)
/// a kernel that packs the copied words' bits ([`kernels::PACK_BITS`]).
#[derive(Default)]
pub(crate) struct Assembly {
    pub regions: Vec<(RegionId, Access)>,
    /// Indices into `regions` of the bound ones, in binding order.
    pub bound: Vec<usize>,
    /// Regions of the column cache: released at the end, not freed.
    cached: Vec<RegionId>,
    /// (from, to, at byte, bytes), indices into `regions`.
    copies: Vec<(usize, usize, u64, u64)>,
    /// (the packing kernel's parameters, staged, dense, words).
    packs: Vec<(Vec<u32>, usize, usize, u64)>,
}

impl Assembly {
    /// Bind a new region holding `data` (freed at the end).
    pub fn bind(&mut self, memory: &DeviceMemory, data: Buffer) -> GpuResult<()> {
        self.bound.push(self.regions.len());
        self.regions.push((memory.region_with(data)?, Access::Read));
        Ok(())
    }

    /// Bind column `column` of `block`, each input batch's part cached
    /// under its key (after `prefix`), `load`ed where the cache lacks it.
    pub fn bind_cached(
        &mut self,
        memory: &DeviceMemory,
        block: &Block,
        column: usize,
        prefix: &str,
        shape: Shape,
        load: impl Fn(&ArrayRef) -> Buffer,
    ) -> GpuResult<()> {
        let mut parts: Vec<(usize, u64)> = Vec::new();
        for (p, piece) in block.pieces.iter().enumerate() {
            if piece.num_rows() == 0 {
                continue;
            }
            let (key, pins) = block.piece_key(p, column);
            let id = memory.cached(&format!("{prefix}{key}"), pins, || {
                load(piece.column(column))
            })?;
            self.cached.push(id);
            parts.push((self.regions.len(), piece.num_rows() as u64));
            self.regions.push((id, Access::Read));
        }
        if let [(only, _)] = parts.as_slice() {
            self.bound.push(*only);
            return Ok(());
        }
        let rows: u64 = parts.iter().map(|(_, n)| n).sum();
        match shape {
            Shape::Words(width) => {
                let target = self.regions.len();
                self.regions
                    .push((memory.region(rows * width)?, Access::Write));
                let mut at = 0;
                for (from, n) in parts {
                    self.copies.push((from, target, at, n * width));
                    at += n * width;
                }
                self.bound.push(target);
            }
            Shape::Bits => {
                // Each part's words copied to a word boundary, then packed.
                let words: u64 = parts.iter().map(|(_, n)| n.div_ceil(32)).sum();
                let staged = self.regions.len();
                self.regions
                    .push((memory.region(words * 4)?, Access::Write));
                let dense = self.regions.len();
                self.regions
                    .push((memory.region(rows.div_ceil(32) * 4)?, Access::Write));
                let mut params = vec![rows as u32, parts.len() as u32];
                let (mut start, mut word) = (0u64, 0u64);
                for (from, n) in parts {
                    self.copies
                        .push((from, staged, word * 4, n.div_ceil(32) * 4));
                    params.extend([start as u32, word as u32]);
                    start += n;
                    word += n.div_ceil(32);
                }
                self.packs.push((params, staged, dense, rows.div_ceil(32)));
                self.bound.push(dense);
            }
        }
        Ok(())
    }

    /// The copies and the packing, then `launch`, in one submission over
    /// `buffers` (those of `regions`, acquired); the dispatches it ran.
    pub fn run(
        &self,
        gpu: &Gpu,
        buffers: &[Arc<DeviceBuffer>],
        launch: Launch<'_>,
    ) -> GpuResult<u64> {
        let pack = match self.packs.is_empty() {
            true => None,
            false => Some(gpu.kernel(kernels::PACK_BITS)?),
        };
        let params: Vec<DeviceBuffer> = self
            .packs
            .iter()
            .map(|(p, ..)| gpu.upload(&Buffer::from_vec(p.clone())))
            .collect();
        let copies: Vec<Copy<'_>> = self
            .copies
            .iter()
            .map(|(from, to, at, bytes)| Copy {
                from: &buffers[*from].buffer,
                to: &buffers[*to].buffer,
                at: *at,
                bytes: *bytes,
            })
            .collect();
        let mut launches = Vec::new();
        if let Some(pack) = &pack {
            for ((_, staged, dense, words), params) in self.packs.iter().zip(&params) {
                launches.push(Launch {
                    kernel: pack,
                    buffers: vec![
                        &params.buffer,
                        &buffers[*staged].buffer,
                        &buffers[*dense].buffer,
                    ],
                    threads: *words,
                });
            }
        }
        launches.push(launch);
        gpu.run_after(&copies, &launches)?;
        Ok(launches.len() as u64)
    }

    /// Bind a column of `block` that is not text, as `binding` says: its
    /// values, and its validity where nullable, both from the column cache.
    pub fn bind_column(
        &mut self,
        memory: &DeviceMemory,
        block: &Block,
        binding: &crate::codegen::Binding,
    ) -> GpuResult<()> {
        let values = |array: &ArrayRef| {
            crate::columns::encode(array)
                .map_or_else(|| Buffer::from_vec(Vec::<u32>::new()), |c| c.values)
        };
        let shape = match binding.repr {
            crate::columns::Repr::Bits => Shape::Bits,
            repr => Shape::Words(repr.width()),
        };
        self.bind_cached(memory, block, binding.column, "", shape, values)?;
        if binding.nullable {
            let valid = |array: &ArrayRef| {
                crate::columns::validity(array)
                    .unwrap_or_else(|| Buffer::from_vec(vec![u32::MAX; array.len().div_ceil(32)]))
            };
            self.bind_cached(memory, block, binding.column, "valid:", Shape::Bits, valid)?;
        }
        Ok(())
    }

    /// Release the cached regions, free the others.
    pub fn finish(&self, memory: &DeviceMemory) {
        memory.release(&self.cached);
        let scratch: Vec<RegionId> = self
            .regions
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| !self.cached.contains(r))
            .collect();
        memory.free(&scratch);
    }
}

/// The input cut into blocks of at most `block_rows` rows.
struct Blocks {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    block_rows: usize,
    ended: bool,
    /// Rows of the last batch read that did not fit in the last block.
    carry: Option<RecordBatch>,
}

impl Blocks {
    /// The next block: batches gathered until `block_rows` (a batch that
    /// does not fit starts the next block), None at the end.
    async fn next_block(&mut self) -> Result<Option<Block>> {
        let block_rows = self.block_rows;
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
            if batch.num_rows() > wanted && rows > 0 {
                // Whole batches keep their cache keys: this one starts the
                // next block.
                self.carry = Some(batch);
                break;
            }
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
        let rows = concat_batches(&self.schema, &pieces)?;
        Ok(Some(Block { rows, pieces }))
    }

    /// Whether the last block read was the input's last.
    fn done(&self) -> bool {
        self.ended && self.carry.is_none()
    }
}

/// The next block gathered on a task of its own, with the reader.
type Gathering = SpawnedTask<(Blocks, Result<Option<Block>>)>;

fn gather(mut blocks: Blocks) -> Gathering {
    SpawnedTask::spawn(async move {
        let block = blocks.next_block().await;
        (blocks, block)
    })
}

/// The blocks in flight: the next one gathered while the device works on
/// this one.
struct Pipeline {
    /// The reader until the first block is asked for (nothing is spawned
    /// before the stream is polled).
    start: Option<Blocks>,
    next: Option<Gathering>,
    /// The operator's turn on the device, from its first block to its last.
    ticket: Option<Ticket<'static>>,
}

/// What one block becomes: `work(block, ticket)`, on a blocking thread;
/// `ticket` is the operator's turn on the device, None until its first
/// block takes it (see [`admit`]).
pub(crate) type Work =
    dyn Fn(&Block, &mut Option<Ticket<'static>>) -> Result<RecordBatch> + Send + Sync;

/// `input` in blocks of `block_rows`, each passed through `work`, the
/// results cut to the session's `batch_size` and typed `schema`. While a
/// block is worked on, the next is read from the input and gathered (the
/// input's own work, a scan's decoding, overlaps the device's).
pub(crate) fn blockwise(
    input: SendableRecordBatchStream,
    block_rows: usize,
    batch_size: usize,
    schema: SchemaRef,
    work: Arc<Work>,
) -> SendableRecordBatchStream {
    let reader = Blocks {
        schema: input.schema(),
        input,
        block_rows,
        ended: false,
        carry: None,
    };
    let pipeline = Pipeline {
        start: Some(reader),
        next: None,
        ticket: None,
    };
    let blocks = futures::stream::unfold(pipeline, move |mut state| {
        let work = Arc::clone(&work);
        async move {
            if let Some(reader) = state.start.take() {
                state.next = Some(gather(reader));
            }
            let (reader, block) = match state.next.take()?.join().await {
                Ok(done) => done,
                Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), state)),
            };
            let block = match block {
                Ok(Some(block)) => block,
                Ok(None) => return None,
                Err(e) => return Some((Err(e), state)),
            };
            let last = reader.done();
            if !last {
                state.next = Some(gather(reader));
            }
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
                    if !last {
                        state.ticket = ticket;
                    }
                    Some((out, state))
                }
                Err(e) => {
                    state.next = None;
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

/// The partitions of `input` (an operator's input: they run at once, and
/// the operator's device-memory demand is all of theirs), at least one.
pub(crate) fn partitions(input: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> usize {
    input
        .properties()
        .output_partitioning()
        .partition_count()
        .max(1)
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
