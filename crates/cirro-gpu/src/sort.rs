//! `GpuSortExec`, the twin of DataFusion's `SortExec` (and its top-N, a
//! sort with `fetch`): a partition's rows are sorted on the device by a
//! stable LSD radix sort of a permutation, 8 bits a pass, keys from the
//! least significant to the most, each key's words from low to high and
//! then its NULL flag; the permutation (its first `fetch` entries for a
//! top-N) comes back and the rows are gathered on the host.
//!
//! Each pass: every workgroup counts the digits of its 256 rows; a prefix
//! sum over the counts laid out digit by digit, workgroup by workgroup,
//! gives each (digit, workgroup) its first place; each row goes to its
//! place plus the number of rows before it in its workgroup with the same
//! digit, which keeps the sort stable. All passes go in one submission.
//!
//! Keys are columns of the types `columns.rs` represents (text by its
//! codes in the chunk's sorted dictionary, which keep the order). A
//! partition larger than what the budget (shared by the partitions) or the
//! device's largest buffer takes at once is sorted in chunks, each on the
//! device (a top-N keeps each chunk's first `fetch` rows), and the sorted
//! chunks are merged on the host by their keys in Arrow's row format. Where
//! the device cannot take a chunk, the CPU sorts the whole partition.
//!
//! The rows it holds on the host count against the query's memory (the
//! input as read, then its sorted copy): when the budget cannot take them,
//! the rows read so far and the rest of the input go to DataFusion's
//! `SortExec`, which spills (`cpu_blocks` counts it).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::buffer::Buffer;
use arrow::compute::{concat_batches, interleave_record_batch, take_record_batch};
use arrow::row::{RowConverter, SortField};
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::sorts::sort::{SortExec, sort_batch};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::Accelerator;
use crate::columns::{HostColumn, Repr, encode_for_sort, repr_of};
use crate::device::{Gpu, GpuError, GpuResult, Launch, WORKGROUP, groups};
use crate::kernels::SCAN;
use crate::memory::{Access, DeviceMemory, RegionId};

/// Counts each workgroup's digits: `counts[digit * tiles + tile]`.
const COUNT: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> words: array<u32>;
@group(0) @binding(2) var<storage, read> perm: array<u32>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
var<workgroup> histogram: array<atomic<u32>, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let rows = params[0];
    let shift = params[1];
    let stride = params[2];
    let word = params[3];
    let tiles = nwg.x * nwg.y;
    let tile = wid.y * nwg.x + wid.x;
    let i = tile * 256u + lid;
    atomicStore(&histogram[lid], 0u);
    workgroupBarrier();
    if (i < rows) {
        let d = (words[perm[i] * stride + word] >> shift) & 255u;
        atomicAdd(&histogram[d], 1u);
    }
    workgroupBarrier();
    counts[lid * tiles + tile] = atomicLoad(&histogram[lid]);
}
"#;

/// Moves each row to its place: the (digit, workgroup)'s offset plus its
/// rank among the workgroup's rows with that digit.
const SCATTER: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> words: array<u32>;
@group(0) @binding(2) var<storage, read> perm: array<u32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
var<workgroup> digits: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let rows = params[0];
    let shift = params[1];
    let stride = params[2];
    let word = params[3];
    let tiles = nwg.x * nwg.y;
    let tile = wid.y * nwg.x + wid.x;
    let i = tile * 256u + lid;
    var d = 256u;
    if (i < rows) { d = (words[perm[i] * stride + word] >> shift) & 255u; }
    digits[lid] = d;
    workgroupBarrier();
    if (i < rows) {
        var rank = 0u;
        for (var j = 0u; j < lid; j++) {
            if (digits[j] == d) { rank += 1u; }
        }
        out[offsets[d * tiles + tile] + rank] = perm[i];
    }
}
"#;

/// A sort on the device.
#[derive(Debug)]
pub struct GpuSortExec {
    twin: Arc<SortExec>,
    /// The key columns, most significant first.
    keys: Vec<usize>,
    accelerator: Arc<Accelerator>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuSortExec {
    /// The twin of `sort`, where every key is a column the kernels read.
    pub fn try_new(sort: &SortExec, accelerator: &Arc<Accelerator>) -> Option<Self> {
        let schema = sort.input().schema();
        let mut keys = Vec::new();
        for key in sort.expr().iter() {
            let column = key.expr.downcast_ref::<Column>()?;
            repr_of(schema.field(column.index()).data_type())?;
            keys.push(column.index());
        }
        Some(Self {
            twin: Arc::new(sort.clone()),
            keys,
            accelerator: Arc::clone(accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

twin_plan!(
    GpuSortExec,
    SortExec,
    |this: &GpuSortExec, cpu: &SortExec| { GpuSortExec::try_new(cpu, &this.accelerator) }
);

impl GpuSortExec {
    /// The operator's stream for `partition` (`ExecutionPlan::execute`).
    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        // One partition of the input per output partition, or all of them.
        let inputs: Vec<usize> = if self.twin.preserve_partitioning() {
            vec![partition]
        } else {
            let n = self
                .twin
                .input()
                .properties()
                .output_partitioning()
                .partition_count();
            (0..n).collect()
        };
        let input = Arc::clone(self.twin.input());
        let schema = input.schema();
        let twin = Arc::clone(&self.twin);
        let keys = self.keys.clone();
        let accelerator = Arc::clone(&self.accelerator);
        let metrics = Metrics {
            dispatches: MetricBuilder::new(&self.metrics).counter("gpu_dispatches", partition),
            gpu_blocks: MetricBuilder::new(&self.metrics).counter("gpu_blocks", partition),
            cpu_blocks: MetricBuilder::new(&self.metrics).counter("cpu_blocks", partition),
            kernel: MetricBuilder::new(&self.metrics).subset_time("gpu_kernel_time", partition),
        };
        let batch_size = context.session_config().batch_size().max(1);
        let chunk_rows = self.chunk_rows();
        let sorted = futures::stream::once(async move {
            // All partitions read at once: one read alone could wait on the
            // others (a repartition's buffers).
            let streams = inputs
                .into_iter()
                .map(|p| input.execute(p, Arc::clone(&context)))
                .collect::<Result<Vec<_>>>()?;
            let mut rest = futures::stream::select_all(streams);
            let reservation = MemoryConsumer::new(format!("GpuSortExec[{partition}]"))
                .register(context.memory_pool());
            let mut batches: Vec<RecordBatch> = Vec::new();
            while let Some(batch) = rest.next().await {
                let batch = batch?;
                if reservation.try_grow(batch.get_array_memory_size()).is_err() {
                    batches.push(batch);
                    metrics.cpu_blocks.add(1);
                    return on_the_cpu(&twin, batches, rest.boxed(), reservation, context);
                }
                batches.push(batch);
            }
            // The sorted copy beside the input (the device's chunks, then
            // their merge).
            if reservation.try_grow(reservation.size()).is_err() {
                metrics.cpu_blocks.add(1);
                let none = futures::stream::empty().boxed();
                return on_the_cpu(&twin, batches, none, reservation, context);
            }
            let all = concat_batches(&input.schema(), &batches)?;
            drop(batches);
            let sorted = tokio::task::spawn_blocking(move || {
                sort(&accelerator, &twin, &keys, &metrics, all, chunk_rows)
            })
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))??;
            let pieces: Vec<Result<RecordBatch>> = (0..sorted.num_rows())
                .step_by(batch_size)
                .map(|o| Ok(sorted.slice(o, batch_size.min(sorted.num_rows() - o))))
                .collect();
            // The reservation goes with the last piece handed on.
            let held = futures::stream::iter(pieces).chain(
                futures::stream::once(async move {
                    drop(reservation);
                    None::<Result<RecordBatch>>
                })
                .filter_map(futures::future::ready),
            );
            Ok::<_, DataFusionError>(held.boxed())
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, sorted)))
    }
}

impl GpuSortExec {
    /// Rows the device sorts at once: what the budget, shared by the
    /// partitions that sort together, and the device's largest buffer
    /// take (device bytes a row: each key's words and NULL flag, the two
    /// permutations, the digit counts and their offsets).
    fn chunk_rows(&self) -> usize {
        let schema = self.twin.input().schema();
        let words: u64 = self
            .keys
            .iter()
            .map(|&k| match repr_of(schema.field(k).data_type()) {
                Some(Repr::I64) => 3,
                _ => 2,
            })
            .sum();
        let partitions = if self.twin.preserve_partitioning() {
            self.twin
                .input()
                .properties()
                .output_partitioning()
                .partition_count()
        } else {
            1
        };
        let per_row = (4 * words + 16) as f64;
        crate::blocks::block_rows(
            &self.accelerator,
            usize::MAX,
            partitions,
            per_row,
            4 * words,
        )
    }
}

struct Metrics {
    dispatches: Count,
    gpu_blocks: Count,
    cpu_blocks: Count,
    kernel: Time,
}

/// The rows read so far (`read`) and the rest of the input sorted by
/// DataFusion's `SortExec` as `twin` says, which spills where the memory
/// does not take them all; `reservation` (what `read` held) is given back
/// first.
fn on_the_cpu(
    twin: &SortExec,
    read: Vec<RecordBatch>,
    rest: BoxStream<'static, Result<RecordBatch>>,
    reservation: MemoryReservation,
    context: Arc<TaskContext>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    reservation.free();
    let schema = twin.input().schema();
    let rows = futures::stream::iter(read.into_iter().map(Ok)).chain(rest);
    let source = Arc::new(ReadOnce {
        schema: Arc::clone(&schema),
        stream: std::sync::Mutex::new(Some(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            rows,
        )))),
    });
    let input = StreamingTableExec::try_new(schema, vec![source], None, Vec::new(), false, None)?;
    let cpu = SortExec::new(twin.expr().clone(), Arc::new(input)).with_fetch(twin.fetch());
    Ok(cpu.execute(0, context)?.boxed())
}

/// A stream as a plan's one partition, read once (the CPU sort's input).
struct ReadOnce {
    schema: datafusion::arrow::datatypes::SchemaRef,
    stream: std::sync::Mutex<Option<SendableRecordBatchStream>>,
}

impl std::fmt::Debug for ReadOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadOnce")
    }
}

impl PartitionStream for ReadOnce {
    fn schema(&self) -> &datafusion::arrow::datatypes::SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self
            .stream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match taken {
            Some(stream) => stream,
            None => Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::once(async {
                    Err(DataFusionError::Internal(
                        "GpuSortExec's input was read already".into(),
                    ))
                }),
            )),
        }
    }
}

/// `all` sorted as `twin` says: on the device in chunks of `chunk_rows`
/// merged on the host, else on the CPU.
fn sort(
    accelerator: &Accelerator,
    twin: &SortExec,
    keys: &[usize],
    metrics: &Metrics,
    all: RecordBatch,
    chunk_rows: usize,
) -> Result<RecordBatch> {
    let fetch = twin.fetch();
    let rows = all.num_rows();
    if rows <= 1 {
        // Nothing to sort, on either side.
        return Ok(all.slice(0, fetch.map_or(rows, |f| f.min(rows))));
    }
    if let Some((gpu, memory)) = accelerator.both() {
        let chunk_rows = chunk_rows.max(1);
        let mut runs = Vec::with_capacity(rows.div_ceil(chunk_rows));
        for start in (0..rows).step_by(chunk_rows) {
            let chunk = all.slice(start, chunk_rows.min(rows - start));
            let timer = std::time::Instant::now();
            match permutation(gpu, memory, twin, keys, &chunk, metrics) {
                Ok(mut perm) => {
                    metrics.kernel.add_duration(timer.elapsed());
                    metrics.gpu_blocks.add(1);
                    if let Some(n) = fetch {
                        perm.truncate(n);
                    }
                    runs.push(take_record_batch(&chunk, &UInt32Array::from(perm))?);
                }
                Err(e) => {
                    log::debug!("{e}; the partition is sorted on the CPU");
                    runs.clear();
                    break;
                }
            }
        }
        if !runs.is_empty() {
            return merge(twin, runs, fetch);
        }
    }
    metrics.cpu_blocks.add(1);
    sort_batch(&all, twin.expr(), fetch)
}

/// Sorted runs merged by the sort's keys (in Arrow's row format, which
/// compares as the sort orders), the first `fetch` rows for a top-N; ties
/// keep the runs' order.
fn merge(twin: &SortExec, mut runs: Vec<RecordBatch>, fetch: Option<usize>) -> Result<RecordBatch> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    if runs.len() == 1 {
        return Ok(runs.remove(0));
    }
    let schema = runs[0].schema();
    let fields = twin
        .expr()
        .iter()
        .map(|e| {
            Ok(SortField::new_with_options(
                e.expr.data_type(&schema)?,
                e.options,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let converter = RowConverter::new(fields)?;
    let keyed = runs
        .iter()
        .map(|run| {
            let columns = twin
                .expr()
                .iter()
                .map(|e| e.expr.evaluate(run)?.into_array(run.num_rows()))
                .collect::<Result<Vec<_>>>()?;
            Ok(converter.convert_columns(&columns)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let total: usize = runs.iter().map(RecordBatch::num_rows).sum();
    let wanted = fetch.map_or(total, |f| f.min(total));
    let mut heap = BinaryHeap::new();
    for (r, rows) in keyed.iter().enumerate() {
        if rows.num_rows() > 0 {
            heap.push(Reverse((rows.row(0), r, 0usize)));
        }
    }
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(wanted);
    while order.len() < wanted {
        let Some(Reverse((_, r, i))) = heap.pop() else {
            break;
        };
        order.push((r, i));
        if i + 1 < keyed[r].num_rows() {
            heap.push(Reverse((keyed[r].row(i + 1), r, i + 1)));
        }
    }
    let runs: Vec<&RecordBatch> = runs.iter().collect();
    Ok(interleave_record_batch(&runs, &order)?)
}

/// The words of one key, `stride` a row, sorted by from word 0 up.
struct KeyWords {
    words: Buffer,
    stride: u32,
}

/// A key column as words whose unsigned order is the sort's order (the
/// direction applied), then its NULL flag as one more word.
fn key_words(
    column: &HostColumn,
    rows: usize,
    descending: bool,
    nulls_first: bool,
) -> [KeyWords; 2] {
    let flip = if descending { u32::MAX } else { 0 };
    let bytes = column.values.as_slice();
    let (stride, words): (u32, Vec<u32>) = match column.repr {
        Repr::I32 => (
            1,
            bytes
                .chunks_exact(4)
                .take(rows)
                .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ 0x8000_0000) ^ flip)
                .collect(),
        ),
        Repr::I64 => (
            2,
            bytes
                .chunks_exact(8)
                .take(rows)
                .flat_map(|c| {
                    let x = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        ^ (1 << 63);
                    [(x as u32) ^ flip, ((x >> 32) as u32) ^ flip]
                })
                .collect(),
        ),
        Repr::Code => (
            1,
            bytes
                .chunks_exact(4)
                .take(rows)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ flip)
                .collect(),
        ),
        Repr::Bits => (
            1,
            (0..rows)
                .map(|i| (u32::from((bytes[i / 8] >> (i % 8)) & 1)) ^ flip)
                .collect(),
        ),
    };
    let valid = |i: usize| {
        column
            .validity
            .as_ref()
            .is_none_or(|v| (v.as_slice()[i / 8] >> (i % 8)) & 1 == 1)
    };
    // NULLs first: a NULL's flag sorts before every value's.
    let nulls: Vec<u32> = (0..rows)
        .map(|i| u32::from(valid(i) == nulls_first))
        .collect();
    [
        KeyWords {
            words: Buffer::from_vec(words),
            stride,
        },
        KeyWords {
            words: Buffer::from_vec(nulls),
            stride: 1,
        },
    ]
}

/// The sorted order of `all`'s rows, from the device.
fn permutation(
    gpu: &Gpu,
    memory: &DeviceMemory,
    twin: &SortExec,
    keys: &[usize],
    all: &RecordBatch,
    metrics: &Metrics,
) -> GpuResult<Vec<u32>> {
    let rows = all.num_rows();
    if rows as u64 >= u64::from(u32::MAX) / 2 || (rows as u64) * 8 > gpu.max_binding {
        return Err(GpuError("too many rows for one chunk".into()));
    }
    let tiles = groups(rows as u64);
    // Least significant key first; per key its value words, then its flag.
    let mut passes: Vec<(usize, u32, u32)> = Vec::new();
    let mut words: Vec<KeyWords> = Vec::new();
    for (key, column) in twin.expr().iter().zip(keys).rev() {
        let array: &ArrayRef = all.column(*column);
        let host = encode_for_sort(array).ok_or_else(|| GpuError("key type changed".into()))?;
        let [values, nulls] =
            key_words(&host, rows, key.options.descending, key.options.nulls_first);
        let stride = values.stride;
        words.push(values);
        for word in 0..stride {
            for shift in [0, 8, 16, 24] {
                passes.push((words.len() - 1, stride, word * 32 + shift));
            }
        }
        if host.validity.is_some() {
            words.push(nulls);
            passes.push((words.len() - 1, 1, 0));
        }
    }
    let identity = Buffer::from_vec((0..rows as u32).collect::<Vec<u32>>());
    let mut regions: Vec<(RegionId, Access)> = Vec::new();
    let result = (|| {
        for w in &words {
            regions.push((memory.region_with(w.words.clone())?, Access::Read));
        }
        regions.push((memory.region_with(identity)?, Access::Write));
        regions.push((memory.region(rows as u64 * 4)?, Access::Write));
        let cells = 256 * tiles;
        regions.push((memory.region(cells * 4)?, Access::Write));
        regions.push((memory.region((cells + 1) * 4)?, Access::Write));
        memory.holding(gpu, &regions, |buffers| {
            let n = buffers.len();
            let (a, b, counts, offsets) = (
                &buffers[n - 4],
                &buffers[n - 3],
                &buffers[n - 2],
                &buffers[n - 1],
            );
            let count = gpu.kernel(COUNT)?;
            let scan = gpu.kernel(SCAN)?;
            let scatter = gpu.kernel(SCATTER)?;
            let scan_params = gpu.upload(&(cells as u32).to_le_bytes());
            let params: Vec<_> = passes
                .iter()
                .map(|&(_, stride, bit)| {
                    let p = [rows as u32, bit % 32, stride, bit / 32];
                    gpu.upload(&Buffer::from_vec(p.to_vec()))
                })
                .collect();
            let mut launches = Vec::with_capacity(passes.len() * 3);
            for (i, (&(w, _, _), p)) in passes.iter().zip(&params).enumerate() {
                let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
                let words = &buffers[w].buffer;
                launches.push(Launch {
                    kernel: &count,
                    buffers: vec![&p.buffer, words, &from.buffer, &counts.buffer],
                    threads: rows as u64,
                });
                launches.push(Launch {
                    kernel: &scan,
                    buffers: vec![&scan_params.buffer, &counts.buffer, &offsets.buffer],
                    threads: u64::from(WORKGROUP),
                });
                launches.push(Launch {
                    kernel: &scatter,
                    buffers: vec![&p.buffer, words, &from.buffer, &offsets.buffer, &to.buffer],
                    threads: rows as u64,
                });
            }
            gpu.run(&launches)?;
            metrics.dispatches.add(launches.len());
            let last = if passes.len() % 2 == 0 { a } else { b };
            let wanted = twin.fetch().map_or(rows, |f| f.min(rows));
            let bytes = gpu.download(&last.buffer, wanted as u64 * 4)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
    })();
    memory.free(&regions.iter().map(|(r, _)| *r).collect::<Vec<_>>());
    result
}
