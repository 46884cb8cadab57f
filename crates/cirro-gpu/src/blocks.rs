//! What the block-at-a-time GPU operators share: their input gathered into
//! blocks (large transfers pay, small ones do not), two blocks worked on at
//! once on blocking threads (one's uploads and host work overlap the
//! other's kernels) while the next is gathered, the operator's turn on the
//! device (`scheduler.rs`) held from its first block to its last, and the
//! metrics EXPLAIN ANALYZE shows.

use std::sync::{Arc, Condvar, Mutex};

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

use crate::Accelerator;
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

/// The blocks read: the next one gathered while this one is worked on.
struct Reading {
    /// The reader until the first block is asked for (nothing is spawned
    /// before the stream is polled).
    start: Option<Blocks>,
    next: Option<Gathering>,
}

/// Blocks of one partition of an operator worked on at once: while one
/// block's kernels run, the next block's columns are encoded and uploaded
/// (its regions acquired), and the host gathers the rows of the one before.
/// The operators size their blocks and their demand for all of them.
pub(crate) const IN_FLIGHT: usize = 2;

/// What a block tells the next block of its partition: that it holds its
/// device memory (the next may take its own), and that its work ended.
#[derive(Default)]
struct Gate {
    /// (acquired, ended)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn set(&self, ended: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 = true;
        state.1 |= ended;
        self.changed.notify_all();
    }

    /// Wait until the block has acquired its memory; whether its work had
    /// ended by then.
    fn wait(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while !state.0 {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.1
    }
}

/// One block's turn on the device: the operator's turn (`scheduler.rs`),
/// taken by its first block and kept until its last ends, and the block's
/// place after the one before it. Of two blocks in flight the earlier
/// acquires its device memory first: were each to hold a part of what it
/// needs, both would wait for the other (up to `HELD_WAIT`) and fall back.
pub(crate) struct Turn {
    ticket: Arc<Mutex<Option<Ticket>>>,
    accelerator: Arc<Accelerator>,
    previous: Arc<Gate>,
    mine: Arc<Gate>,
}

impl Turn {
    /// Before the block takes device memory: the first block waits for the
    /// query's turn (`scheduler.rs`) with `demand` bytes of device memory
    /// (all the operator's blocks in flight) over `rows` rows; then the
    /// block waits until the one before it has acquired its memory.
    pub fn admit(&self, metrics: &Metrics, query: &str, rows: usize, demand: u64) {
        if let Some(scheduler) = self.accelerator.scheduler() {
            let mut ticket = self.ticket.lock().unwrap_or_else(|p| p.into_inner());
            if ticket.is_none() {
                metrics.waiting.add(1);
                let admitted = scheduler.enter(query, rows as f64, demand);
                metrics.waiting.sub(1);
                metrics.wait.add_duration(admitted.waited);
                *ticket = Some(admitted);
            }
        }
        if !self.previous.wait() {
            metrics.overlapped.add(1);
        }
    }

    /// The block holds what it needs of device memory, or gave up on the
    /// device: the next block may take its own. Called again, nothing.
    pub fn acquired(&self) {
        self.mine.set(false);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.mine.set(true);
    }
}

/// What one block becomes: `work(block, turn)`, on a blocking thread.
pub(crate) type Work = dyn Fn(&Block, &Turn) -> Result<RecordBatch> + Send + Sync;

/// `input` in blocks of `block_rows`, each passed through `work`, the
/// results in the input's order, cut to the session's `batch_size` and
/// typed `schema`. [`IN_FLIGHT`] blocks are worked on at once, and while
/// they are, the next is read from the input and gathered (the input's own
/// work, a scan's decoding, overlaps the device's).
pub(crate) fn blockwise(
    input: SendableRecordBatchStream,
    block_rows: usize,
    batch_size: usize,
    schema: SchemaRef,
    accelerator: &Arc<Accelerator>,
    work: Arc<Work>,
) -> SendableRecordBatchStream {
    let accelerator = Arc::clone(accelerator);
    let reader = Blocks {
        schema: input.schema(),
        input,
        block_rows,
        ended: false,
        carry: None,
    };
    let reading = Reading {
        start: Some(reader),
        next: None,
    };
    let blocks = futures::stream::unfold(reading, |mut state| async move {
        if let Some(reader) = state.start.take() {
            state.next = Some(gather(reader));
        }
        let (reader, block) = match state.next.take()?.join().await {
            Ok(done) => done,
            Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), state)),
        };
        match block {
            Ok(Some(block)) => {
                let last = reader.done();
                if !last {
                    state.next = Some(gather(reader));
                }
                Some((Ok((block, last)), state))
            }
            Ok(None) => None,
            Err(e) => Some((Err(e), state)),
        }
    });
    let ticket: Arc<Mutex<Option<Ticket>>> = Arc::default();
    let ended = Arc::clone(&ticket);
    // The first block has no block before it.
    let mut previous = Arc::new(Gate::default());
    previous.set(true);
    let worked = blocks
        .map(move |read| {
            let gate = Arc::new(Gate::default());
            let turn = Turn {
                ticket: Arc::clone(&ticket),
                accelerator: Arc::clone(&accelerator),
                previous: std::mem::replace(&mut previous, Arc::clone(&gate)),
                mine: gate,
            };
            let work = Arc::clone(&work);
            async move {
                let (block, last) = read?;
                let out = tokio::task::spawn_blocking(move || work(&block, &turn))
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                Ok::<_, DataFusionError>((out?, last))
            }
        })
        .buffered(IN_FLIGHT)
        .map(move |done| {
            let (out, last) = done?;
            if last {
                // The last block ends the operator's turn on the device.
                drop(ended.lock().unwrap_or_else(|p| p.into_inner()).take());
            }
            Ok(out)
        });
    let batch_size = batch_size.max(1);
    let out = worked.flat_map(move |block: Result<RecordBatch>| {
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
    /// Blocks that took their device memory while the block before them
    /// was still worked on ([`IN_FLIGHT`]).
    pub overlapped: Count,
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
            overlapped: MetricBuilder::new(set).counter("gpu_overlapped_blocks", partition),
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

/// Rows per block: `wanted`, fewer where `at_once` blocks (all partitions',
/// [`IN_FLIGHT`] each for [`blockwise`]) would pass the device-memory
/// budget at `per_row` bytes a row, or one buffer of `widest` bytes a row
/// the device's largest binding.
pub(crate) fn block_rows(
    accelerator: &Accelerator,
    wanted: usize,
    at_once: usize,
    per_row: f64,
    widest: u64,
) -> usize {
    let Some((gpu, memory)) = accelerator.both() else {
        return wanted;
    };
    // A tenth is left to the column cache and rounding.
    let share = memory.budget() as f64 * 0.9 / at_once.max(1) as f64;
    let by_budget = (share / per_row) as usize;
    let by_binding = (gpu.max_binding / widest.max(1)) as usize;
    wanted.min(by_budget).min(by_binding).max(256)
}
