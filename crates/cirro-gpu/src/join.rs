//! `GpuHashJoinExec`, the twin of DataFusion's `HashJoinExec`: INNER,
//! LEFT, RIGHT, FULL, SEMI and ANTI joins on integer, date, decimal
//! (≤ 18 digits), timestamp and text keys, with or without a residual
//! filter, the build side collected once (`CollectLeft`) or per partition
//! (`Partitioned`).
//!
//! The build side's keys are packed on the host into 32-bit words (text
//! as codes numbered in the build side's order of first appearance; a
//! probe value the build side lacks cannot match), and one kernel inserts
//! its rows into an open-addressing table of at least twice its rows:
//! a compare-exchange claims an empty slot for the first row of a key, or
//! finds the slot of the same key words (linear probing); every row is then
//! pushed on its slot's chain (an atomic exchange of the chain's head). The
//! table stays in device memory, in regions the memory manager may swap
//! out between blocks, until the join ends.
//!
//! Per block of probe rows: a kernel finds each row's slot and counts its
//! chain (rows with a NULL key count 0: NULL matches nothing), the shared
//! prefix sum gives each row its first output position, and a second
//! kernel writes the (build row, probe row) pairs there. Pairs past what
//! one buffer or the budget holds are written and copied back in ranges of
//! probe rows. The host then applies the residual filter to the pairs and
//! gathers the output rows; the build rows that matched are marked, and
//! the last probe stream to end emits what the join type wants of the build
//! side (LEFT, FULL: the unmatched rows; LEFT SEMI, LEFT ANTI: the matched
//! or unmatched ones). A block the device cannot take gets its pairs from a
//! hash map of the same key words on the host: the answer never depends on
//! the device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::array::{UInt32Array, new_null_array};
use arrow::buffer::Buffer;
use arrow::compute::{cast, concat_batches, filter as filter_array, take};
use arrow::datatypes::{DataType, SchemaRef, UInt32Type};
use datafusion::common::{JoinSide, JoinType, NullEquality, Result};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryFutureExt, TryStreamExt};

use crate::Accelerator;
use crate::blocks::{self, Metrics, Turn};
use crate::columns::{Repr, encode, repr_of, words};
use crate::device::{Gpu, GpuError, GpuResult, Launch, WORKGROUP};
use crate::memory::{Access, DeviceMemory, RegionId};

/// How a key's values become words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    /// Integers, dates, decimals, timestamps: their 32- or 64-bit values.
    Fixed(Repr),
    /// Text: a code the build side numbers.
    Text,
}

impl KeyKind {
    fn of(data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(KeyKind::Text),
            // Floats compare by value (-0 = 0, NaN ≠ NaN): not by words.
            DataType::Float32 | DataType::Float64 => None,
            other => match repr_of(other)? {
                repr @ (Repr::I32 | Repr::I64) => Some(KeyKind::Fixed(repr)),
                Repr::Bits | Repr::Code => None,
            },
        }
    }

    fn words(self) -> usize {
        match self {
            KeyKind::Fixed(Repr::I64) => 2,
            _ => 1,
        }
    }
}

/// The join's keys and the kernels that read them.
#[derive(Debug)]
struct Layout {
    kinds: Vec<KeyKind>,
    /// Key words a row.
    words: usize,
    build: String,
    count: String,
    write: &'static str,
}

impl Layout {
    /// Slots of the table over `rows` build rows: a power of two, at least
    /// twice the rows.
    fn slots(rows: usize) -> usize {
        (rows * 2).next_power_of_two().max(256)
    }

    /// Device bytes a probe row holds (its words, validity, count, slot
    /// and offset, and two output pairs).
    fn per_row(&self) -> f64 {
        (4 * (self.words + 4) + 16) as f64
    }
}

/// A hash join on the device.
#[derive(Debug)]
pub struct GpuHashJoinExec {
    twin: Arc<HashJoinExec>,
    layout: Arc<Layout>,
    block_rows: usize,
    accelerator: Arc<Accelerator>,
    metrics: ExecutionPlanMetricsSet,
    /// `CollectLeft`: the build side shared by the partitions of one run.
    shared: Arc<Mutex<SharedBuild>>,
}

type BuildFuture =
    Shared<BoxFuture<'static, std::result::Result<Arc<Build>, Arc<DataFusionError>>>>;

#[derive(Default)]
struct SharedBuild {
    build: Option<BuildFuture>,
    /// Partitions that took `build`; when all have, the next run builds
    /// again (its input may have changed).
    taken: usize,
}

impl std::fmt::Debug for SharedBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBuild({} taken)", self.taken)
    }
}

impl GpuHashJoinExec {
    /// The twin of `join` where the device can run it: the join types
    /// above (not the mark joins), NULLs never equal, no null-aware anti join, no limit, keys of
    /// the same type on both sides.
    pub fn try_new(
        join: &HashJoinExec,
        block_rows: usize,
        accelerator: &Arc<Accelerator>,
    ) -> Option<Self> {
        if matches!(join.join_type(), JoinType::LeftMark | JoinType::RightMark)
            || join.null_equality() != NullEquality::NullEqualsNothing
            || join.null_aware
            || join.fetch().is_some()
            || !matches!(
                join.partition_mode(),
                PartitionMode::CollectLeft | PartitionMode::Partitioned
            )
            || join.on().is_empty()
        {
            return None;
        }
        let (left, right) = (join.left().schema(), join.right().schema());
        let mut kinds = Vec::new();
        for (l, r) in join.on() {
            let data_type = l.data_type(&left).ok()?;
            if r.data_type(&right).ok()? != data_type {
                return None;
            }
            kinds.push(KeyKind::of(&data_type)?);
        }
        let words = kinds.iter().map(|k| k.words()).sum();
        Some(Self {
            twin: Arc::new(join.builder().build().ok()?),
            layout: Arc::new(Layout {
                kinds,
                words,
                build: build_source(words),
                count: count_source(words),
                write: WRITE,
            }),
            block_rows: block_rows.max(1),
            accelerator: Arc::clone(accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
            shared: Arc::default(),
        })
    }

    fn partitions(&self) -> usize {
        blocks::partitions(self.twin.right())
    }

    /// The build side of `partition` (`CollectLeft`: the one all share).
    fn build(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> BoxFuture<'static, Result<Arc<Build>>> {
        let collect = {
            let left = Arc::clone(self.twin.left());
            let layout = Arc::clone(&self.layout);
            let keys: Vec<Arc<dyn PhysicalExpr>> =
                self.twin.on().iter().map(|(l, _)| Arc::clone(l)).collect();
            let context = Arc::clone(context);
            let accelerator = Arc::clone(&self.accelerator);
            move |partition: usize, probes: usize| {
                Build::collect(left, partition, context, layout, keys, probes, accelerator)
            }
        };
        if *self.twin.partition_mode() != PartitionMode::CollectLeft {
            return collect(partition, 1).boxed();
        }
        let Ok(mut shared) = self.shared.lock() else {
            return futures::future::ready(Err(DataFusionError::Internal(
                "GpuHashJoinExec: a lock was poisoned".into(),
            )))
            .boxed();
        };
        let build = shared
            .build
            .get_or_insert_with(|| {
                collect(0, self.partitions())
                    .map_err(Arc::new)
                    .boxed()
                    .shared()
            })
            .clone();
        shared.taken += 1;
        if shared.taken >= self.partitions() {
            *shared = SharedBuild::default();
        }
        build.map_err(DataFusionError::Shared).boxed()
    }
}

/// The build side: its rows on the host, their key words, and the table
/// on the device once the first probe block has built it.
struct Build {
    batch: RecordBatch,
    words: Vec<u32>,
    /// 0 where a key is NULL (the row matches nothing).
    valid: Vec<u32>,
    valid_rows: usize,
    /// Per key: the codes of the build side's text values.
    codes: Vec<Option<HashMap<String, u32>>>,
    /// The table on the device; None where it could not be built (the
    /// blocks are joined on the CPU).
    table: OnceLock<Option<Table>>,
    /// The same on the host, for blocks the device cannot take.
    map: OnceLock<HashMap<Vec<u32>, Vec<u32>>>,
    /// The build rows that matched, and the probe streams still running
    /// (the last to end emits the build side's rows).
    visited: Mutex<(Vec<bool>, usize)>,
    /// Whose device memory holds the table.
    accelerator: Arc<Accelerator>,
    _reservation: MemoryReservation,
}

/// The build side's table in device memory.
struct Table {
    /// The build rows' key words.
    keys: RegionId,
    /// Two words a slot: its first row + 1 (0: free), its chain's head + 1.
    slots: RegionId,
    /// Each row's next on its chain + 1 (0: the end).
    next: RegionId,
    mask: u32,
}

impl Drop for Build {
    fn drop(&mut self) {
        if let (Some(Some(table)), Some(memory)) = (self.table.get(), self.accelerator.memory()) {
            memory.free(&[table.keys, table.slots, table.next]);
        }
    }
}

impl Build {
    async fn collect(
        left: Arc<dyn ExecutionPlan>,
        partition: usize,
        context: Arc<TaskContext>,
        layout: Arc<Layout>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        probes: usize,
        accelerator: Arc<Accelerator>,
    ) -> Result<Arc<Build>> {
        let schema = left.schema();
        let stream = left.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("GpuHashJoinExec[{partition}] build"))
            .register(context.memory_pool());
        let batches: Vec<RecordBatch> = stream.try_collect().await?;
        let batch = concat_batches(&schema, &batches)?;
        drop(batches);
        reservation.try_grow(batch.get_array_memory_size())?;
        let arrays = keys
            .iter()
            .map(|k| k.evaluate(&batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<_>>>()?;
        let mut codes: Vec<Option<HashMap<String, u32>>> = layout
            .kinds
            .iter()
            .map(|k| (*k == KeyKind::Text).then(HashMap::new))
            .collect();
        let (words, valid) = pack(&layout, &arrays, |key, text| {
            let codes = codes[key].as_mut()?;
            if let Some(code) = codes.get(text) {
                return Some(*code);
            }
            let code = codes.len() as u32;
            codes.insert(text.to_string(), code);
            Some(code)
        })?;
        reservation.try_grow((words.len() + valid.len()) * 4)?;
        let valid_rows = valid.iter().filter(|&&v| v != 0).count();
        let rows = batch.num_rows();
        Ok(Arc::new(Build {
            batch,
            words,
            valid,
            valid_rows,
            codes,
            table: OnceLock::new(),
            map: OnceLock::new(),
            visited: Mutex::new((vec![false; rows], probes)),
            accelerator,
            _reservation: reservation,
        }))
    }

    /// The pairs of a block's rows on the host, from a hash map of the
    /// build rows' key words.
    fn pairs_on_host(&self, width: usize, words: &[u32], valid: &[u32]) -> Vec<(u32, u32)> {
        let map = self.map.get_or_init(|| {
            let mut map: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
            for (r, v) in self.valid.iter().enumerate() {
                if *v != 0 {
                    let key = self.words[r * width..(r + 1) * width].to_vec();
                    map.entry(key).or_default().push(r as u32);
                }
            }
            map
        });
        let mut pairs = Vec::new();
        for (r, v) in valid.iter().enumerate() {
            if *v == 0 {
                continue;
            }
            if let Some(rows) = map.get(&words[r * width..(r + 1) * width]) {
                pairs.extend(rows.iter().map(|&b| (b, r as u32)));
            }
        }
        pairs
    }
}

/// The rows' key words (`layout.words` a row) and validity (0 where a key
/// is NULL or its text has no code); `code(key, text)` numbers text.
fn pack(
    layout: &Layout,
    arrays: &[ArrayRef],
    mut code: impl FnMut(usize, &str) -> Option<u32>,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let rows = arrays.first().map_or(0, |a| a.len());
    let width = layout.words;
    let mut packed = vec![0u32; rows * width];
    let mut valid = vec![1u32; rows];
    let mut at = 0;
    for (key, (kind, array)) in layout.kinds.iter().zip(arrays).enumerate() {
        let nulls = array.logical_nulls();
        let is_valid = |r: usize| nulls.as_ref().is_none_or(|n| n.is_valid(r));
        match kind {
            KeyKind::Text => {
                let text = cast(array, &DataType::Utf8)?;
                let text = text.as_string::<i32>();
                for r in 0..rows {
                    if !is_valid(r) {
                        valid[r] = 0;
                        continue;
                    }
                    match code(key, text.value(r)) {
                        Some(c) => packed[r * width + at] = c,
                        None => valid[r] = 0,
                    }
                }
            }
            KeyKind::Fixed(_) => {
                let host = encode(array).ok_or_else(|| {
                    DataFusionError::Internal(format!("GPU: join key type {}", array.data_type()))
                })?;
                for r in 0..rows {
                    if !is_valid(r) {
                        valid[r] = 0;
                        continue;
                    }
                    let row = &mut packed[r * width + at..];
                    for (slot, value) in row.iter_mut().zip(words(host.key_words(r))) {
                        *slot = value;
                    }
                }
            }
        }
        at += kind.words();
    }
    Ok((packed, valid))
}

/// The kernel that inserts the build rows: params [rows, mask].
fn build_source(key_words: usize) -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> keys: array<u32>;
@group(0) @binding(2) var<storage, read> valid: array<u32>;
@group(0) @binding(3) var<storage, read_write> table: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> next: array<u32>;
const KW: u32 = {key_words}u;
{}{}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (r >= params[0] || valid[r] == 0u) {{ return; }}
    let mask = params[1];
    var slot = hash_keys(r) & mask;
    var probes = 0u;
    loop {{
        let seen = atomicCompareExchangeWeak(&table[2u * slot], 0u, r + 1u);
        if (seen.exchanged) {{ break; }}
        // 0: a spurious failure of the weak exchange; try the slot again.
        if (seen.old_value != 0u) {{
            if (same(seen.old_value - 1u, r)) {{ break; }}
            slot = (slot + 1u) & mask;
            probes += 1u;
            // Twice the rows: never full.
            if (probes > mask) {{ return; }}
        }}
    }}
    next[r] = atomicExchange(&table[2u * slot + 1u], r + 1u);
}}
"#,
        crate::kernels::hash_source("keys"),
        crate::kernels::same_source("keys", "keys")
    )
}

/// The kernel that finds each probe row's slot and counts its matches:
/// params [rows, mask]; `found` holds the counts, then the slots + 1.
fn count_source(key_words: usize) -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> keys: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> next: array<u32>;
@group(0) @binding(4) var<storage, read> probe: array<u32>;
@group(0) @binding(5) var<storage, read> valid: array<u32>;
@group(0) @binding(6) var<storage, read_write> found: array<u32>;
const KW: u32 = {key_words}u;
{}{}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
    let rows = params[0];
    if (r >= rows) {{ return; }}
    found[r] = 0u;
    found[rows + r] = 0u;
    if (valid[r] == 0u) {{ return; }}
    let mask = params[1];
    var slot = hash_probe(r) & mask;
    for (var probes = 0u; probes <= mask; probes++) {{
        let first = table[2u * slot];
        if (first == 0u) {{ return; }}
        if (same(first - 1u, r)) {{
            var count = 0u;
            var at = table[2u * slot + 1u];
            while (at != 0u) {{
                count += 1u;
                at = next[at - 1u];
            }}
            found[r] = count;
            found[rows + r] = slot + 1u;
            return;
        }}
        slot = (slot + 1u) & mask;
    }}
}}
"#,
        crate::kernels::hash_source("probe"),
        crate::kernels::same_source("keys", "probe")
    )
}

/// The kernel that writes the pairs of probe rows [lo, hi): params [rows,
/// lo, hi, base]; a row's pairs start at its offset less `base`.
const WRITE: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> found: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> next: array<u32>;
@group(0) @binding(4) var<storage, read> offsets: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = params[1] + (wid.y * nwg.x + wid.x) * 256u + lid;
    if (r >= params[2]) { return; }
    let slot = found[params[0] + r];
    if (slot == 0u) { return; }
    var at = offsets[r] - params[3];
    var row = table[2u * (slot - 1u) + 1u];
    while (row != 0u) {
        out[2u * at] = row - 1u;
        out[2u * at + 1u] = r;
        at += 1u;
        row = next[row - 1u];
    }
}
"#;

twin_plan!(
    GpuHashJoinExec,
    HashJoinExec,
    |this: &GpuHashJoinExec, cpu: &HashJoinExec| {
        GpuHashJoinExec::try_new(cpu, this.block_rows, &this.accelerator)
    }
);

impl GpuHashJoinExec {
    /// The operator's stream for `partition` (`ExecutionPlan::execute`).
    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let build = self.build(partition, &context);
        let probe = self.twin.right().execute(partition, Arc::clone(&context))?;
        let run = Arc::new(Run {
            twin: Arc::clone(&self.twin),
            layout: Arc::clone(&self.layout),
            at_once: self.partitions() * blocks::IN_FLIGHT,
            schema: self.twin.schema(),
            accelerator: Arc::clone(&self.accelerator),
            metrics: Metrics::new(&self.metrics, partition),
            ranges: MetricBuilder::new(&self.metrics).counter("gpu_pair_ranges", partition),
        });
        let query = context.session_id();
        let widest = 4 * self.layout.words.max(2) as u64;
        let block_rows = blocks::block_rows(
            &self.accelerator,
            self.block_rows,
            self.partitions() * blocks::IN_FLIGHT,
            self.layout.per_row(),
            widest,
        );
        let batch_size = context.session_config().batch_size();
        let schema = self.twin.schema();
        let accelerator = Arc::clone(&self.accelerator);
        let joined = futures::stream::once(async move {
            let build = build.await?;
            let (last, last_build) = (Arc::clone(&run), Arc::clone(&build));
            let work = move |block: &blocks::Block, turn: &Turn| {
                run.block(&build, &block.rows, &query, turn)
            };
            let blocks = blocks::blockwise(
                probe,
                block_rows,
                batch_size,
                schema,
                &accelerator,
                Arc::new(work),
            );
            // After the last block: the build side's rows, from the last
            // probe stream to end.
            let rest = futures::stream::once(async move { last.finish(&last_build) })
                .filter_map(|batch| futures::future::ready(batch.transpose()));
            Ok::<_, DataFusionError>(blocks.chain(rest))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.twin.schema(),
            joined.boxed(),
        )))
    }
}

struct Run {
    twin: Arc<HashJoinExec>,
    layout: Arc<Layout>,
    /// Probe blocks of the operator on the device at once.
    at_once: usize,
    schema: SchemaRef,
    accelerator: Arc<Accelerator>,
    metrics: Metrics,
    /// Copies of pairs back from the device (more than the blocks where a
    /// block's pairs pass what one copy holds).
    ranges: Count,
}

impl Run {
    /// One block of probe rows joined: its pairs from the device, else
    /// from the host.
    fn block(
        &self,
        build: &Build,
        block: &RecordBatch,
        query: &str,
        turn: &Turn,
    ) -> Result<RecordBatch> {
        let rows = block.num_rows();
        if rows == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let arrays = self
            .twin
            .on()
            .iter()
            .map(|(_, r)| r.evaluate(block)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let (words, valid) = pack(&self.layout, &arrays, |key, text| {
            build.codes[key].as_ref()?.get(text).copied()
        })?;
        if build.valid_rows == 0 {
            // Nothing can match: no kernel to run.
            self.metrics.gpu_blocks.add(1);
            return self.output(build, block, Vec::new());
        }
        let pairs = self.pairs_on_device(build, rows, &words, &valid, query, turn);
        // The block's pairs are back (and its write ranges, which it
        // acquires while holding its probe's regions, done): the next
        // block may take its device memory.
        turn.acquired();
        if let Some(pairs) = pairs {
            self.metrics.gpu_blocks.add(1);
            return self.output(build, block, pairs);
        }
        self.metrics.cpu_blocks.add(1);
        let pairs = build.pairs_on_host(self.layout.words, &words, &valid);
        self.output(build, block, pairs)
    }

    /// A block's pairs from the device; None where it cannot take them.
    fn pairs_on_device(
        &self,
        build: &Build,
        rows: usize,
        words: &[u32],
        valid: &[u32],
        query: &str,
        turn: &Turn,
    ) -> Option<Vec<(u32, u32)>> {
        let (gpu, memory) = self.accelerator.both()?;
        let block_bytes = (self.layout.per_row() * rows as f64) as u64;
        let table_bytes =
            (build.words.len() * 4 + Layout::slots(build.batch.num_rows()) * 8) as u64;
        turn.admit(
            &self.metrics,
            query,
            rows,
            table_bytes + block_bytes * self.at_once as u64,
        );
        let table = build
            .table
            .get_or_init(|| match self.build_table(gpu, memory, build) {
                Ok(table) => Some(table),
                Err(e) => {
                    log::debug!("{e}; the join's blocks are joined on the CPU");
                    None
                }
            })
            .as_ref()?;
        match self.probe(gpu, memory, table, rows, words, valid) {
            Ok(pairs) => Some(pairs),
            Err(e) => {
                log::debug!("{e}; the block is joined on the CPU");
                None
            }
        }
    }

    /// The build side's table, built on the device.
    fn build_table(&self, gpu: &Gpu, memory: &DeviceMemory, build: &Build) -> GpuResult<Table> {
        let rows = build.batch.num_rows();
        let slots = Layout::slots(rows);
        if (slots as u64 * 8).max(build.words.len() as u64 * 4) > gpu.max_binding
            || rows as u64 >= u64::from(u32::MAX) / 2
        {
            return Err(GpuError(
                "the build side passes the device's largest binding".into(),
            ));
        }
        let start = std::time::Instant::now();
        let mut regions: Vec<RegionId> = Vec::new();
        let made = (|| {
            regions.push(memory.region_with(Buffer::from_slice_ref(&build.words))?);
            regions.push(memory.region(slots as u64 * 8)?);
            regions.push(memory.region(rows as u64 * 4)?);
            regions.push(memory.region_with(Buffer::from_slice_ref(&build.valid))?);
            let [keys, table, next, valid] = [regions[0], regions[1], regions[2], regions[3]];
            let declared = [
                (keys, Access::Read),
                (table, Access::Write),
                (next, Access::Write),
                (valid, Access::Read),
            ];
            memory.holding(gpu, &declared, |buffers| {
                let params = gpu.upload(&Buffer::from_vec(vec![rows as u32, (slots - 1) as u32]));
                let kernel = gpu.kernel(&self.layout.build)?;
                self.metrics.transfer.add_duration(start.elapsed());
                let kernel_start = std::time::Instant::now();
                gpu.run(&[Launch {
                    kernel: &kernel,
                    buffers: vec![
                        &params.buffer,
                        &buffers[0].buffer,
                        &buffers[3].buffer,
                        &buffers[1].buffer,
                        &buffers[2].buffer,
                    ],
                    threads: rows as u64,
                }])?;
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                self.metrics.dispatches.add(1);
                Ok(())
            })?;
            // The validity was for the build only.
            memory.free(&[valid]);
            Ok(Table {
                keys,
                slots: table,
                next,
                mask: (slots - 1) as u32,
            })
        })();
        if made.is_err() {
            memory.free(&regions);
        }
        made
    }

    /// The (build row, probe row) pairs of a block whose rows' key words
    /// and validity are `words` and `valid`.
    fn probe(
        &self,
        gpu: &Gpu,
        memory: &DeviceMemory,
        table: &Table,
        rows: usize,
        words: &[u32],
        valid: &[u32],
    ) -> GpuResult<Vec<(u32, u32)>> {
        if rows as u64 >= u64::from(u32::MAX) / 4 {
            return Err(GpuError("block too large".into()));
        }
        let start = std::time::Instant::now();
        let mut regions: Vec<RegionId> = Vec::new();
        let result = (|| {
            regions.push(memory.region_with(Buffer::from_slice_ref(words))?);
            regions.push(memory.region_with(Buffer::from_slice_ref(valid))?);
            regions.push(memory.region(rows as u64 * 8)?);
            regions.push(memory.region((rows as u64 + 1) * 4)?);
            let [probe, probe_valid, found, offsets] =
                [regions[0], regions[1], regions[2], regions[3]];
            let declared = [
                (table.keys, Access::Read),
                (table.slots, Access::Read),
                (table.next, Access::Read),
                (probe, Access::Read),
                (probe_valid, Access::Read),
                (found, Access::Write),
                (offsets, Access::Write),
            ];
            memory.holding(gpu, &declared, |buffers| {
                let [keys, slots, next, probe, probe_valid, found, offsets] =
                    [0, 1, 2, 3, 4, 5, 6].map(|i| &buffers[i].buffer);
                let params = gpu.upload(&Buffer::from_vec(vec![rows as u32, table.mask]));
                let scan_params = gpu.upload(&Buffer::from_vec(vec![rows as u32]));
                let count = gpu.kernel(&self.layout.count)?;
                let scan = gpu.kernel(crate::kernels::SCAN)?;
                let write = gpu.kernel(self.layout.write)?;
                self.metrics.transfer.add_duration(start.elapsed());
                let kernel_start = std::time::Instant::now();
                gpu.run(&[
                    Launch {
                        kernel: &count,
                        buffers: vec![&params.buffer, keys, slots, next, probe, probe_valid, found],
                        threads: rows as u64,
                    },
                    Launch {
                        kernel: &scan,
                        buffers: vec![&scan_params.buffer, found, offsets],
                        threads: u64::from(WORKGROUP),
                    },
                ])?;
                self.metrics.dispatches.add(2);
                let total = words_of(&gpu.download_at(offsets, rows as u64 * 4, 4)?)[0] as u64;
                let mut pairs = Vec::with_capacity(total as usize);
                if total > 0 {
                    // Pairs a copy holds: one binding, a quarter of the budget.
                    let most = (gpu.max_binding.min(memory.budget() / 4) / 8).max(1);
                    let ranges = if total <= most {
                        vec![(0, rows, 0)]
                    } else {
                        let starts = words_of(&gpu.download(offsets, (rows as u64 + 1) * 4)?);
                        ranges(&starts, most)?
                    };
                    for (lo, hi, base) in ranges {
                        self.write_range(
                            gpu,
                            memory,
                            write.as_ref(),
                            [found, slots, next, offsets],
                            [rows as u32, lo as u32, hi as u32, base],
                            &mut pairs,
                        )?;
                    }
                }
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                if pairs.len() as u64 != total {
                    return Err(GpuError("the join's pairs were miscounted".into()));
                }
                Ok(pairs)
            })
        })();
        memory.free(&regions);
        result
    }

    /// The pairs of probe rows `params[1]..params[2]`, appended to `pairs`.
    fn write_range(
        &self,
        gpu: &Gpu,
        memory: &DeviceMemory,
        write: &wgpu::ComputePipeline,
        [found, slots, next, offsets]: [&wgpu::Buffer; 4],
        params: [u32; 4],
        pairs: &mut Vec<(u32, u32)>,
    ) -> GpuResult<()> {
        let [_, lo, hi, base] = params;
        let starts = words_of(&gpu.download_at(offsets, u64::from(hi) * 4, 4)?);
        let count = u64::from(starts[0] - base);
        let out = memory.region(count * 8)?;
        let result = (|| {
            memory.holding(gpu, &[(out, Access::Write)], |buffers| {
                let params = gpu.upload(&Buffer::from_vec(params.to_vec()));
                gpu.run(&[Launch {
                    kernel: write,
                    buffers: vec![
                        &params.buffer,
                        found,
                        slots,
                        next,
                        offsets,
                        &buffers[0].buffer,
                    ],
                    threads: u64::from(hi - lo),
                }])?;
                self.metrics.dispatches.add(1);
                self.ranges.add(1);
                let written = words_of(&gpu.download(&buffers[0].buffer, count * 8)?);
                pairs.extend(written.chunks_exact(2).map(|p| (p[0], p[1])));
                Ok(())
            })
        })();
        memory.free(&[out]);
        result
    }

    /// The output rows of a block from its (build row, probe row) pairs,
    /// grouped by probe row in order: the residual filter applied, the
    /// matched build rows marked, then the join type's rows, in the probe
    /// side's order (the twin's properties promise it).
    fn output(
        &self,
        build: &Build,
        block: &RecordBatch,
        pairs: Vec<(u32, u32)>,
    ) -> Result<RecordBatch> {
        let (mut left, mut right): (Vec<u32>, Vec<u32>) = pairs.into_iter().unzip();
        if let Some(filter) = self.twin.filter() {
            let (l, r) = (
                UInt32Array::from(left.clone()),
                UInt32Array::from(right.clone()),
            );
            let columns = filter
                .column_indices()
                .iter()
                .map(|c| match c.side {
                    JoinSide::Left => take(build.batch.column(c.index), &l, None),
                    _ => take(block.column(c.index), &r, None),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(left.len()));
            let candidates =
                RecordBatch::try_new_with_options(Arc::clone(filter.schema()), columns, &options)?;
            let keep = filter
                .expression()
                .evaluate(&candidates)?
                .into_array(left.len())?;
            let keep: &BooleanArray = keep.as_boolean();
            let kept = |v: Vec<u32>| -> Result<Vec<u32>> {
                let kept = filter_array(&UInt32Array::from(v), keep)?;
                Ok(kept.as_primitive::<UInt32Type>().values().to_vec())
            };
            left = kept(left)?;
            right = kept(right)?;
        }
        let join_type = *self.twin.join_type();
        if matches!(
            join_type,
            JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti
        ) {
            let mut visited = build
                .visited
                .lock()
                .map_err(|_| DataFusionError::Internal("a lock was poisoned".into()))?;
            for &b in &left {
                visited.0[b as usize] = true;
            }
        }
        let rows = block.num_rows();
        let unmatched = |right: &[u32]| {
            let mut matched = vec![false; rows];
            for &r in right {
                matched[r as usize] = true;
            }
            (0..rows as u32).filter(move |&r| !matched[r as usize])
        };
        // The probe rows in the output, and their build rows (None: NULLs).
        let (build_rows, probe_rows): (Vec<Option<u32>>, Vec<u32>) = match join_type {
            JoinType::Inner | JoinType::Left => (left.into_iter().map(Some).collect(), right),
            JoinType::Right | JoinType::Full => {
                // In probe order, as the twin keeps it (the pairs come
                // grouped by probe row, in order): each row's pairs, or the
                // row with NULLs for the build side.
                let mut build_rows = Vec::with_capacity(left.len() + rows);
                let mut probe_rows = Vec::with_capacity(left.len() + rows);
                let mut k = 0;
                for r in 0..rows as u32 {
                    let first = k;
                    while k < right.len() && right[k] == r {
                        build_rows.push(Some(left[k]));
                        probe_rows.push(r);
                        k += 1;
                    }
                    if k == first {
                        build_rows.push(None);
                        probe_rows.push(r);
                    }
                }
                (build_rows, probe_rows)
            }
            JoinType::RightAnti => (Vec::new(), unmatched(&right).collect()),
            JoinType::RightSemi => {
                right.sort_unstable();
                right.dedup();
                (Vec::new(), right)
            }
            // The build side's rows come at the end (`finish`).
            _ => (Vec::new(), Vec::new()),
        };
        self.gather(build, Some(block), build_rows.into(), probe_rows.into())
    }

    /// After this stream's last block: when no other probe stream of the
    /// build side still runs, the build rows the join type wants (LEFT,
    /// FULL, ANTI: the unmatched ones; SEMI: the matched ones).
    fn finish(&self, build: &Build) -> Result<Option<RecordBatch>> {
        let join_type = *self.twin.join_type();
        let want_matched = match join_type {
            JoinType::Left | JoinType::Full | JoinType::LeftAnti => false,
            JoinType::LeftSemi => true,
            _ => return Ok(None),
        };
        let mut visited = build
            .visited
            .lock()
            .map_err(|_| DataFusionError::Internal("a lock was poisoned".into()))?;
        visited.1 = visited.1.saturating_sub(1);
        if visited.1 > 0 {
            return Ok(None);
        }
        let rows: Vec<u32> = (0..visited.0.len() as u32)
            .filter(|&b| visited.0[b as usize] == want_matched)
            .collect();
        drop(visited);
        let probe_rows = UInt32Array::new_null(rows.len());
        self.gather(build, None, rows.into(), probe_rows).map(Some)
    }

    /// The output columns: each taken from the build rows or the probe
    /// rows (a NULL index, or no probe block, gives NULLs), projected.
    fn gather(
        &self,
        build: &Build,
        block: Option<&RecordBatch>,
        build_rows: UInt32Array,
        probe_rows: UInt32Array,
    ) -> Result<RecordBatch> {
        let (left_columns, right_columns) = match self.twin.join_type() {
            JoinType::LeftSemi | JoinType::LeftAnti => (build.batch.num_columns(), 0),
            JoinType::RightSemi | JoinType::RightAnti => {
                (0, self.twin.right().schema().fields().len())
            }
            _ => (
                build.batch.num_columns(),
                self.twin.right().schema().fields().len(),
            ),
        };
        let rows = if left_columns > 0 && right_columns == 0 {
            build_rows.len()
        } else {
            probe_rows.len()
        };
        let joined: Vec<usize> = match &self.twin.projection {
            Some(p) => p.to_vec(),
            None => (0..left_columns + right_columns).collect(),
        };
        let right_schema = self.twin.right().schema();
        let columns = joined
            .iter()
            .map(|&c| {
                if c < left_columns {
                    let column = build.batch.column(c);
                    if build.batch.num_rows() == 0 {
                        return Ok(new_null_array(column.data_type(), rows));
                    }
                    take(column, &build_rows, None)
                } else {
                    match block {
                        Some(block) => take(block.column(c - left_columns), &probe_rows, None),
                        None => Ok(new_null_array(
                            right_schema.field(c - left_columns).data_type(),
                            rows,
                        )),
                    }
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}

/// Ranges of probe rows `(lo, hi, base)` whose pairs number at most
/// `most` each, from the rows' first positions `starts` (one more than the
/// rows: the last is the total).
fn ranges(starts: &[u32], most: u64) -> GpuResult<Vec<(usize, usize, u32)>> {
    let rows = starts.len() - 1;
    let mut out = Vec::new();
    let mut lo = 0;
    while lo < rows {
        let base = starts[lo];
        let mut hi = lo;
        while hi < rows && u64::from(starts[hi + 1] - base) <= most {
            hi += 1;
        }
        if hi == lo {
            return Err(GpuError(format!(
                "one probe row has more than {most} matches"
            )));
        }
        out.push((lo, hi, base));
        lo = hi;
    }
    Ok(out)
}

fn words_of(bytes: &[u8]) -> Vec<u32> {
    words(bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn ranges_hold_at_most_the_pairs_a_copy_holds() {
        // Rows with 3, 0, 2, 4, 1 pairs.
        let starts = [0, 3, 3, 5, 9, 10];
        assert_eq!(ranges(&starts, 5).unwrap(), vec![(0, 3, 0), (3, 5, 5)]);
        assert_eq!(ranges(&starts, 10).unwrap(), vec![(0, 5, 0)]);
        assert_eq!(
            ranges(&starts, 4).unwrap(),
            vec![(0, 2, 0), (2, 3, 3), (3, 4, 5), (4, 5, 9)]
        );
        assert!(ranges(&starts, 3).is_err(), "a row with 4 pairs");
    }
}
