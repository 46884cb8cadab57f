//! `GpuAggregateExec`, the twin of DataFusion's partial `AggregateExec`:
//! `count`, `sum`, `avg`, `min` and `max` of integers, dates, decimals (as
//! scaled integers) and floats, grouped by integer, date, decimal, float
//! or text keys, a block of rows at a time. The final aggregation stays on
//! the CPU: it merges few rows.
//!
//! Floats: a key is `total_cmp`'s key with -0 made +0 (DataFusion groups
//! -0 with +0 and each NaN by its bits; a group's first row names it, and
//! the final aggregation, which groups again, names it +0); a `min`/`max` compares
//! `total_cmp`'s keys, and a block where one meets a NaN or a -0 goes to
//! the CPU (DataFusion's grouped extremes compare with `partial_cmp`, so
//! there its answer depends on the rows' order). A float `sum`/`avg`: the
//! device groups and counts, and the host adds the values by the slot the
//! device gave each row, in row order as DataFusion's accumulator adds
//! them (float atomics would add in a different order on every run, and
//! WGSL has no 64-bit floats).
//!
//! Per block, the host evaluates the keys and arguments (`PhysicalExpr`s)
//! and packs them row by row into 32-bit words; a NULL key's words are 0
//! after a 0 validity word, so two rows are in one group exactly when
//! their words are equal. One kernel then:
//! 1. hashes a row's key words and inserts the row into an open-addressing
//!    table of at least twice the block's rows: a compare-exchange claims
//!    an empty slot for the row, or finds the slot of the first row with
//!    the same key words (linear probing);
//! 2. adds the row's arguments into the slot's state with atomics: counts;
//!    sums into three 32-bit limbs (96 bits, carries propagated from the
//!    old values the atomic adds return: exact for any block); min and max
//!    of the high words (order-preserving unsigned encodings, a minimum as
//!    the maximum of the complement).
//!
//! A second kernel (only for `min`/`max`) takes, among a slot's rows whose
//! high word won, the maximum of the low words: 64-bit extremes from 32-bit
//! atomics, which every device has (64-bit atomics are optional).
//!
//! The table and states come back; each claimed slot is a group, its first
//! row gives the key values, and its states become the partial
//! aggregation's state columns (the types DataFusion's accumulators use,
//! by their state fields), so the final aggregation cannot tell. A block
//! the device cannot take, or whose decimals do not fit 64 bits, is
//! aggregated by the twin on the CPU.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, Float32Array, Float64Array, Int64Array, RecordBatch,
    UInt32Array, UInt64Array,
};
use arrow::buffer::Buffer;
use arrow::compute::{CastOptions, cast, cast_with_options, take};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int64Type, SchemaRef,
};
use datafusion::common::Result;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode, SendableRecordBatchStream};

use crate::Accelerator;
use crate::blocks::{self, Metrics, Turn};
use crate::columns::{
    Repr, encode, from_total_key32, from_total_key64, repr_of, total_key32, total_key64, words,
};
use crate::device::{Gpu, GpuError, GpuResult, Launch};
use crate::memory::{Access, DeviceMemory, RegionId};

/// What an aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Count,
    Sum,
    Avg,
    Min,
    Max,
}

impl Func {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            "count" => Func::Count,
            "sum" => Func::Sum,
            "avg" => Func::Avg,
            "min" => Func::Min,
            "max" => Func::Max,
            _ => return None,
        })
    }

    /// State words per group: the count of non-NULL arguments, then three
    /// limbs of a sum or the high and low words of an extreme.
    fn state_words(self) -> usize {
        match self {
            Func::Count => 1,
            Func::Sum | Func::Avg => 4,
            Func::Min | Func::Max => 3,
        }
    }

    fn reads_value(self) -> bool {
        self != Func::Count
    }
}

/// One aggregate: its function, argument and where its words sit.
#[derive(Debug)]
struct Aggregate {
    func: Func,
    arg: Arc<dyn PhysicalExpr>,
    /// The argument's type (its scale for sums).
    arg_type: DataType,
    /// The word in a row of `args` that says the argument is not NULL.
    valid_word: Option<usize>,
    /// The argument's low and high words in a row of `args`.
    value_word: Option<usize>,
    /// The first of its words in a slot's state.
    state_word: usize,
    /// The types of its state columns.
    state_types: Vec<DataType>,
    /// A sum or average of floats: the device counts the group's values
    /// and the host adds them, in row order, by the slot the device gave
    /// each row (float atomics would add in a different order every run,
    /// and WGSL has no 64-bit floats).
    host_sum: bool,
}

/// One group key.
#[derive(Debug)]
struct Key {
    expr: Arc<dyn PhysicalExpr>,
    repr: Repr,
    nullable: bool,
}

impl Key {
    fn words(&self) -> usize {
        usize::from(self.nullable) + if self.repr == Repr::I64 { 2 } else { 1 }
    }
}

/// The layout of a block on the device and the kernels that read it.
#[derive(Debug)]
struct Layout {
    keys: Vec<Key>,
    key_words: usize,
    aggregates: Vec<Aggregate>,
    arg_words: usize,
    state_words: usize,
    /// Insert and accumulate.
    accumulate: String,
    /// The low words of extremes (None without `min`/`max`).
    extremes: Option<String>,
}

/// A partial aggregation on the device.
#[derive(Debug)]
pub struct GpuAggregateExec {
    twin: Arc<AggregateExec>,
    layout: Arc<Layout>,
    block_rows: usize,
    accelerator: Arc<Accelerator>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuAggregateExec {
    /// The twin of `aggregate` where the device can compute it: a partial
    /// aggregation without grouping sets, DISTINCT, FILTER, order or limit,
    /// of the functions and types above.
    pub fn try_new(
        aggregate: &AggregateExec,
        block_rows: usize,
        accelerator: &Arc<Accelerator>,
    ) -> Option<Self> {
        if *aggregate.mode() != AggregateMode::Partial
            || !aggregate.group_expr().is_single()
            || aggregate.limit_options().is_some()
            || *aggregate.input_order_mode() != InputOrderMode::Linear
            || aggregate.filter_expr().iter().any(Option::is_some)
        {
            return None;
        }
        let schema = aggregate.input_schema();
        let mut keys = Vec::new();
        for (expr, _) in aggregate.group_expr().expr() {
            let data_type = expr.data_type(&schema).ok()?;
            // Float keys group as DataFusion's do: -0 with +0, each NaN
            // by its bits (`encode`'s key).
            let repr = match repr_of(&data_type)? {
                Repr::Bits => return None,
                repr => repr,
            };
            keys.push(Key {
                expr: Arc::clone(expr),
                repr,
                nullable: expr.nullable(&schema).ok()?,
            });
        }
        let mut aggregates = Vec::new();
        // State word 0 of a slot counts its rows (every binding is read).
        let (mut arg_words, mut state_words) = (0, 1);
        for aggr in aggregate.aggr_expr() {
            let func = Func::of(aggr.fun().name())?;
            let [arg] = aggr.expressions().try_into().ok()?;
            if aggr.is_distinct() {
                return None;
            }
            let arg_type = arg.data_type(&schema).ok()?;
            let state_types: Vec<DataType> = aggr
                .state_fields()
                .ok()?
                .iter()
                .map(|f| f.data_type().clone())
                .collect();
            let float = matches!(arg_type, DataType::Float32 | DataType::Float64);
            if func.reads_value() && !is_integral(&arg_type) && !float {
                return None;
            }
            let host_sum = float && matches!(func, Func::Sum | Func::Avg);
            let states_fit = match (func, state_types.as_slice()) {
                (Func::Count, [DataType::Int64]) => true,
                (Func::Sum, [DataType::Float64]) => float,
                (Func::Sum, [t]) => matches!(t, DataType::Int64 | DataType::Decimal128(..)),
                (Func::Avg, [DataType::UInt64, DataType::Float64]) => float,
                (Func::Avg, [DataType::UInt64, DataType::Decimal128(..)]) => !float,
                (Func::Min | Func::Max, [t]) => *t == arg_type,
                _ => false,
            };
            if !states_fit {
                return None;
            }
            let valid_word = arg.nullable(&schema).ok()?.then(|| {
                arg_words += 1;
                arg_words - 1
            });
            let value_word = (func.reads_value() && !host_sum).then(|| {
                arg_words += 2;
                arg_words - 2
            });
            aggregates.push(Aggregate {
                func,
                arg,
                arg_type,
                valid_word,
                value_word,
                state_word: state_words,
                state_types,
                host_sum,
            });
            // A host sum's state on the device is its count.
            state_words += if host_sum { 1 } else { func.state_words() };
        }
        let key_words = keys.iter().map(Key::words).sum();
        let accumulate = accumulate_source(key_words, arg_words, state_words, &aggregates);
        let extremes = extremes_source(key_words, arg_words, state_words, &aggregates);
        Some(Self {
            twin: Arc::new(aggregate.clone()),
            layout: Arc::new(Layout {
                keys,
                key_words,
                aggregates,
                arg_words,
                state_words,
                accumulate,
                extremes,
            }),
            block_rows: block_rows.max(1),
            accelerator: Arc::clone(accelerator),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Blocks on the device at once: every partition's in flight.
    fn at_once(&self) -> usize {
        blocks::partitions(self.twin.input()) * blocks::IN_FLIGHT
    }
}

/// Types whose values the kernels sum and compare as 64-bit integers.
fn is_integral(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Date32
            | DataType::Decimal128(..)
    )
}

/// One row's updates of the states in `array` (`state`, or a workgroup's
/// `local` copy), at the slot whose first word is `base`.
fn row_updates(aggregates: &[Aggregate], array: &str) -> String {
    let mut updates = String::new();
    for a in aggregates {
        let s = a.state_word;
        let mut body = format!("        atomicAdd(&{array}[base + {s}u], 1u);\n");
        if let Some(v) = a.value_word {
            body.push_str(&format!(
                "        let lo{s} = args[r * AW + {v}u];\n        let hi{s} = args[r * AW + {}u];\n",
                v + 1
            ));
            match a.func {
                Func::Sum | Func::Avg => body.push_str(&format!(
                    "        add96_{array}(base + {}u, lo{s}, hi{s}, select(0u, 0xffffffffu, (hi{s} & 0x80000000u) != 0u));\n",
                    s + 1
                )),
                Func::Min => body.push_str(&format!(
                    "        atomicMax(&{array}[base + {}u], ~(hi{s} ^ 0x80000000u));\n",
                    s + 1
                )),
                Func::Max => body.push_str(&format!(
                    "        atomicMax(&{array}[base + {}u], hi{s} ^ 0x80000000u);\n",
                    s + 1
                )),
                Func::Count => {}
            }
        }
        match a.valid_word {
            Some(w) => updates.push_str(&format!(
                "    if (args[r * AW + {w}u] != 0u) {{\n{body}    }}\n"
            )),
            None => updates.push_str(&format!("    {{\n{body}    }}\n")),
        }
    }
    updates
}

/// `add96_<array>(at, lo, hi, top)`: adds the 96-bit value `top:hi:lo` to
/// the sum in three limbs at `at` of `array`; each limb's carry comes from
/// the old value its atomic add returns.
fn add96(array: &str) -> String {
    format!(
        r#"
fn add96_{array}(at: u32, lo: u32, hi: u32, top: u32) {{
    let old0 = atomicAdd(&{array}[at], lo);
    let c0 = select(0u, 1u, old0 + lo < old0);
    let mid = hi + c0;
    let c1 = select(0u, 1u, mid < hi);
    let old1 = atomicAdd(&{array}[at + 1u], mid);
    let c2 = select(0u, 1u, old1 + mid < old1);
    atomicAdd(&{array}[at + 2u], top + c1 + c2);
}}
"#
    )
}

/// Zeroes a workgroup's `local` states (before its first barrier).
const LOCAL_ZERO: &str =
    "    for (var w = lid; w < SW; w += 256u) { atomicStore(&local[w], 0u); }\n";

/// The kernel that inserts each row into the table and accumulates it.
/// Without group keys every row is in slot 0: each workgroup accumulates
/// its rows in workgroup memory first and adds that to the slot once
/// (every row's atomic on one address serialises them).
fn accumulate_source(
    key_words: usize,
    arg_words: usize,
    state_words: usize,
    aggregates: &[Aggregate],
) -> String {
    // A binding the kernel never reads is left out of its layout: `args`
    // is bound only where an aggregate reads it.
    let args_binding = if arg_words > 0 {
        "@group(0) @binding(5) var<storage, read> args: array<u32>;\n"
    } else {
        ""
    };
    let header = format!(
        r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> keys: array<u32>;
@group(0) @binding(2) var<storage, read_write> owner: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: array<atomic<u32>>;
{args_binding}const KW: u32 = {key_words}u;
const AW: u32 = {arg_words}u;
const SW: u32 = {state_words}u;
{}"#,
        add96("state")
    );
    if key_words == 0 {
        let mut merge = String::from("        atomicAdd(&state[0], atomicLoad(&local[0]));\n");
        for a in aggregates {
            let s = a.state_word;
            merge.push_str(&format!(
                "        atomicAdd(&state[{s}u], atomicLoad(&local[{s}u]));\n"
            ));
            if a.value_word.is_none() {
                continue;
            }
            match a.func {
                Func::Sum | Func::Avg => merge.push_str(&format!(
                    "        add96_state({}u, atomicLoad(&local[{}u]), atomicLoad(&local[{}u]), atomicLoad(&local[{}u]));\n",
                    s + 1,
                    s + 1,
                    s + 2,
                    s + 3
                )),
                Func::Min | Func::Max => merge.push_str(&format!(
                    "        atomicMax(&state[{}u], atomicLoad(&local[{}u]));\n",
                    s + 1,
                    s + 1
                )),
                Func::Count => {}
            }
        }
        return format!(
            r#"{header}
var<workgroup> local: array<atomic<u32>, SW>;
{}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
{LOCAL_ZERO}    workgroupBarrier();
    // No key words: `keys` is read only to stay in the kernel's layout.
    _ = arrayLength(&keys);
    if (r < params[0]) {{
        if (r == 0u) {{ atomicStore(&owner[0], 1u); }}
        slots[r] = 0u;
        let base = 0u;
        atomicAdd(&local[0], 1u);
{}    }}
    workgroupBarrier();
    if (lid == 0u) {{
{merge}    }}
}}
"#,
            add96("local"),
            row_updates(aggregates, "local")
        );
    }
    format!(
        r#"{header}
{}{}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (r >= params[0]) {{ return; }}
    let mask = params[1];
    var slot = hash_keys(r) & mask;
    var probes = 0u;
    loop {{
        let seen = atomicCompareExchangeWeak(&owner[slot], 0u, r + 1u);
        if (seen.exchanged) {{ break; }}
        // 0: a spurious failure of the weak exchange; try the slot again.
        if (seen.old_value != 0u) {{
            if (same(seen.old_value - 1u, r)) {{ break; }}
            slot = (slot + 1u) & mask;
            probes += 1u;
            // The table has twice the rows: never full.
            if (probes > mask) {{ break; }}
        }}
    }}
    slots[r] = slot;
    let base = slot * SW;
    atomicAdd(&state[base], 1u);
{}}}
"#,
        crate::kernels::hash_source("keys"),
        crate::kernels::same_source("keys", "keys"),
        row_updates(aggregates, "state")
    )
}

/// The kernel that finishes `min`/`max`: the low words of the rows whose
/// high word won (without group keys, through workgroup memory as above).
fn extremes_source(
    key_words: usize,
    arg_words: usize,
    state_words: usize,
    aggregates: &[Aggregate],
) -> Option<String> {
    let grouped = key_words > 0;
    let target = if grouped { "state" } else { "local" };
    let mut updates = String::new();
    let mut merge = String::new();
    for a in aggregates {
        let (Some(v), s) = (a.value_word, a.state_word) else {
            continue;
        };
        let (hi, lo) = match a.func {
            Func::Min => (
                format!("~(args[r * AW + {}u] ^ 0x80000000u)", v + 1),
                format!("~args[r * AW + {v}u]"),
            ),
            Func::Max => (
                format!("(args[r * AW + {}u] ^ 0x80000000u)", v + 1),
                format!("args[r * AW + {v}u]"),
            ),
            _ => continue,
        };
        let valid = a
            .valid_word
            .map_or("true".to_string(), |w| format!("args[r * AW + {w}u] != 0u"));
        updates.push_str(&format!(
            "        if ({valid} && {hi} == atomicLoad(&state[base + {}u])) {{\n            atomicMax(&{target}[base + {}u], {lo});\n        }}\n",
            s + 1,
            s + 2
        ));
        merge.push_str(&format!(
            "        atomicMax(&state[{}u], atomicLoad(&local[{}u]));\n",
            s + 2,
            s + 2
        ));
    }
    if updates.is_empty() {
        return None;
    }
    let header = format!(
        r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> args: array<u32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;
const AW: u32 = {arg_words}u;
const SW: u32 = {state_words}u;
"#
    );
    if grouped {
        return Some(format!(
            r#"{header}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (r >= params[0]) {{ return; }}
    let base = slots[r] * SW;
{updates}}}
"#
        ));
    }
    Some(format!(
        r#"{header}
var<workgroup> local: array<atomic<u32>, SW>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let r = (wid.y * nwg.x + wid.x) * 256u + lid;
{LOCAL_ZERO}    workgroupBarrier();
    if (r < params[0]) {{
        let base = slots[r] * SW;
{updates}    }}
    workgroupBarrier();
    if (lid == 0u) {{
{merge}    }}
}}
"#
    ))
}

twin_plan!(
    GpuAggregateExec,
    AggregateExec,
    |this: &GpuAggregateExec, cpu: &AggregateExec| {
        GpuAggregateExec::try_new(cpu, this.block_rows, &this.accelerator)
    }
);

impl GpuAggregateExec {
    /// The operator's stream for `partition` (`ExecutionPlan::execute`).
    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.twin.input().execute(partition, Arc::clone(&context))?;
        let run = Run {
            twin: Arc::clone(&self.twin),
            layout: Arc::clone(&self.layout),
            at_once: self.at_once(),
            accelerator: Arc::clone(&self.accelerator),
            schema: self.twin.schema(),
            context: Arc::clone(&context),
            metrics: Metrics::new(&self.metrics, partition),
        };
        let query = context.session_id();
        let per_row = self.layout.per_row();
        let widest = 4 * (self.layout.state_words as u64 * 4).max(self.layout.key_words as u64);
        let block_rows = blocks::block_rows(
            &self.accelerator,
            self.block_rows,
            self.at_once(),
            per_row,
            widest,
        );
        Ok(blocks::blockwise(
            input,
            block_rows,
            context.session_config().batch_size(),
            self.twin.schema(),
            &self.accelerator,
            Arc::new(move |block, turn| run.block(&block.rows, &query, turn)),
        ))
    }
}

impl Layout {
    /// Slots of the table for `rows` rows: a power of two, at least twice.
    fn slots(rows: usize) -> usize {
        (rows * 2).next_power_of_two().max(256)
    }

    /// Device bytes per row of a block (the table at its largest, four
    /// slots a row).
    fn per_row(&self) -> f64 {
        (4 * (self.key_words + self.arg_words + 1) + 4 * 4 * (self.state_words + 1)) as f64
    }
}

struct Run {
    twin: Arc<AggregateExec>,
    layout: Arc<Layout>,
    /// Blocks of the operator on the device at once.
    at_once: usize,
    accelerator: Arc<Accelerator>,
    schema: SchemaRef,
    context: Arc<TaskContext>,
    metrics: Metrics,
}

/// A block's columns packed for the device.
struct Packed {
    keys: Vec<ArrayRef>,
    key_words: Vec<u32>,
    arg_words: Vec<u32>,
    /// Per aggregate, a host sum's argument as Float64 (None otherwise).
    floats: Vec<Option<ArrayRef>>,
}

/// What comes back from the device: the table (each slot's first row + 1,
/// 0 if free), the states, and each row's slot where the host adds floats.
struct Computed {
    table: Vec<u32>,
    states: Vec<u32>,
    row_slots: Option<Vec<u32>>,
}

impl Run {
    /// One block aggregated: on the device, else on the CPU.
    fn block(&self, block: &RecordBatch, query: &str, turn: &Turn) -> Result<RecordBatch> {
        let rows = block.num_rows();
        if rows == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        if let Some((gpu, memory)) = self.accelerator.both() {
            // Packed before the block's turn: the host's work overlaps the
            // kernels of the block before.
            match self.pack(block)? {
                Some(packed) => {
                    let demand = (self.layout.per_row() * rows as f64) as u64 * self.at_once as u64;
                    turn.admit(&self.metrics, query, rows, demand);
                    let computed = self.on_device(gpu, memory, rows, &packed, turn);
                    turn.acquired();
                    match computed {
                        Ok(computed) => {
                            self.metrics.gpu_blocks.add(1);
                            return self.output(&packed, computed);
                        }
                        Err(e) => log::debug!("{e}; the block is aggregated on the CPU"),
                    }
                }
                None => log::debug!(
                    "a decimal past 64 bits or a NaN or -0 to compare; the block is aggregated on the CPU"
                ),
            }
        }
        // On the CPU the block holds no device memory: the next may go on.
        turn.acquired();
        self.metrics.cpu_blocks.add(1);
        self.on_cpu(block)
    }

    /// The twin over the block alone.
    fn on_cpu(&self, block: &RecordBatch) -> Result<RecordBatch> {
        let source =
            MemorySourceConfig::try_new_exec(&[vec![block.clone()]], block.schema(), None)?;
        let twin = AggregateExec::try_new(
            AggregateMode::Partial,
            self.twin.group_expr().clone(),
            self.twin.aggr_expr().to_vec(),
            self.twin.filter_expr().to_vec(),
            source,
            block.schema(),
        )?;
        let context = Arc::clone(&self.context);
        let batches = tokio::runtime::Handle::current()
            .block_on(datafusion::physical_plan::collect(Arc::new(twin), context))?;
        Ok(arrow::compute::concat_batches(&self.schema, &batches)?)
    }

    /// The block's keys and arguments as words; None where a decimal does
    /// not fit 64 bits, or a float `min`/`max` meets a NaN or -0 (there
    /// DataFusion's answer depends on the rows' order: it compares with
    /// `partial_cmp`, and a NaN or the first of two equal zeros wins).
    fn pack(&self, block: &RecordBatch) -> Result<Option<Packed>> {
        let rows = block.num_rows();
        let layout = &self.layout;
        let mut keys = Vec::with_capacity(layout.keys.len());
        let mut key_words = vec![0u32; rows * layout.key_words];
        let mut at = 0;
        for key in &layout.keys {
            let array = key.expr.evaluate(block)?.into_array(rows)?;
            let host = encode(&array).ok_or_else(|| {
                DataFusionError::Internal(format!("GPU: group key type {}", array.data_type()))
            })?;
            let nulls = array.logical_nulls();
            for r in 0..rows {
                let row = &mut key_words[r * layout.key_words + at..];
                let valid = nulls.as_ref().is_none_or(|n| n.is_valid(r));
                let mut w = 0;
                if key.nullable {
                    row[0] = u32::from(valid);
                    w = 1;
                }
                if !valid {
                    continue;
                }
                for (slot, value) in row[w..].iter_mut().zip(words(host.key_words(r))) {
                    *slot = value;
                }
            }
            at += key.words();
            keys.push(array);
        }
        let mut arg_words = vec![0u32; rows * layout.arg_words];
        let mut floats = Vec::with_capacity(layout.aggregates.len());
        for a in &layout.aggregates {
            floats.push(None);
            if a.valid_word.is_none() && a.value_word.is_none() && !a.host_sum {
                continue;
            }
            let array = a.arg.evaluate(block)?.into_array(rows)?;
            if a.host_sum {
                if let Some(last) = floats.last_mut() {
                    *last = Some(cast(&array, &DataType::Float64)?);
                }
            }
            let nulls = array.logical_nulls();
            if let Some(w) = a.valid_word {
                for r in 0..rows {
                    arg_words[r * layout.arg_words + w] =
                        u32::from(nulls.as_ref().is_none_or(|n| n.is_valid(r)));
                }
            }
            if let Some(w) = a.value_word {
                let Some(values) = as_i64(&array)? else {
                    return Ok(None);
                };
                for (r, v) in values.iter().enumerate() {
                    arg_words[r * layout.arg_words + w] = *v as u32;
                    arg_words[r * layout.arg_words + w + 1] = (*v >> 32) as u32;
                }
            }
        }
        Ok(Some(Packed {
            keys,
            key_words,
            arg_words,
            floats,
        }))
    }

    /// The table, the states and, where the host adds floats, each row's
    /// slot.
    fn on_device(
        &self,
        gpu: &Gpu,
        memory: &DeviceMemory,
        rows: usize,
        packed: &Packed,
        turn: &Turn,
    ) -> GpuResult<Computed> {
        if rows as u64 >= u64::from(u32::MAX) / 4 {
            return Err(GpuError("block too large".into()));
        }
        let layout = &self.layout;
        let slots = Layout::slots(rows);
        let state_bytes = (slots * layout.state_words * 4) as u64;
        if state_bytes.max((rows * layout.key_words * 4) as u64) > gpu.max_binding {
            return Err(GpuError(
                "a buffer would pass the device's largest binding".into(),
            ));
        }
        let start = std::time::Instant::now();
        let mut regions: Vec<(RegionId, Access)> = Vec::new();
        let result = (|| {
            regions.push((
                memory.region_with(Buffer::from_slice_ref(&packed.key_words))?,
                Access::Read,
            ));
            regions.push((
                memory.region_with(Buffer::from_slice_ref(&packed.arg_words))?,
                Access::Read,
            ));
            regions.push((memory.region(slots as u64 * 4)?, Access::Write));
            regions.push((memory.region(rows as u64 * 4)?, Access::Write));
            regions.push((memory.region(state_bytes)?, Access::Write));
            memory.holding(gpu, &regions, |buffers| {
                turn.acquired();
                let params = gpu.upload(&Buffer::from_vec(vec![rows as u32, (slots - 1) as u32]));
                let accumulate = gpu.kernel(&layout.accumulate)?;
                let extremes = match &layout.extremes {
                    Some(source) => Some(gpu.kernel(source)?),
                    None => None,
                };
                let [keys, args, owner, row_slots, state] =
                    [0, 1, 2, 3, 4].map(|i| &buffers[i].buffer);
                self.metrics.transfer.add_duration(start.elapsed());
                let kernel_start = std::time::Instant::now();
                let mut bound = vec![&params.buffer, keys, owner, row_slots, state];
                if layout.arg_words > 0 {
                    bound.push(args);
                }
                let mut launches = vec![Launch {
                    kernel: &accumulate,
                    buffers: bound,
                    threads: rows as u64,
                }];
                if let Some(extremes) = &extremes {
                    launches.push(Launch {
                        kernel: extremes,
                        buffers: vec![&params.buffer, args, row_slots, state],
                        threads: rows as u64,
                    });
                }
                gpu.run(&launches)?;
                self.metrics.dispatches.add(launches.len());
                let table = words(&gpu.download(owner, slots as u64 * 4)?).collect();
                let states = words(&gpu.download(state, state_bytes)?).collect();
                let row_slots = match layout.aggregates.iter().any(|a| a.host_sum) {
                    true => Some(words(&gpu.download(row_slots, rows as u64 * 4)?).collect()),
                    false => None,
                };
                self.metrics.kernel.add_duration(kernel_start.elapsed());
                Ok(Computed {
                    table,
                    states,
                    row_slots,
                })
            })
        })();
        memory.free(&regions.iter().map(|(r, _)| *r).collect::<Vec<_>>());
        result
    }

    /// The partial aggregation's rows: one per claimed slot.
    fn output(&self, packed: &Packed, computed: Computed) -> Result<RecordBatch> {
        let layout = &self.layout;
        let Computed {
            table,
            states,
            row_slots,
        } = computed;
        let claimed: Vec<usize> = (0..table.len()).filter(|&s| table[s] != 0).collect();
        let firsts = UInt32Array::from(claimed.iter().map(|&s| table[s] - 1).collect::<Vec<u32>>());
        let mut columns: Vec<ArrayRef> = Vec::new();
        for key in &packed.keys {
            columns.push(take(key.as_ref(), &firsts, None)?);
        }
        let strict = CastOptions {
            safe: false,
            ..Default::default()
        };
        for (a, floats) in layout.aggregates.iter().zip(&packed.floats) {
            let at =
                |slot: usize, word: usize| states[slot * layout.state_words + a.state_word + word];
            let counts: Vec<u32> = claimed.iter().map(|&s| at(s, 0)).collect();
            match a.func {
                Func::Count => columns.push(Arc::new(Int64Array::from_iter_values(
                    counts.iter().map(|&c| i64::from(c)),
                ))),
                Func::Sum | Func::Avg if a.host_sum => {
                    let (Some(floats), Some(row_slots)) = (floats, &row_slots) else {
                        return Err(DataFusionError::Internal(
                            "GPU: a float sum without its values".into(),
                        ));
                    };
                    let sums = host_sums(&claimed, table.len(), row_slots, floats);
                    if a.func == Func::Avg {
                        columns.push(Arc::new(UInt64Array::from_iter_values(
                            counts.iter().map(|&c| u64::from(c)),
                        )));
                    }
                    columns.push(Arc::new(Float64Array::from(
                        sums.into_iter()
                            .zip(&counts)
                            .map(|(sum, &c)| (c > 0).then_some(sum))
                            .collect::<Vec<_>>(),
                    )));
                }
                Func::Sum | Func::Avg => {
                    let scale = match a.arg_type {
                        DataType::Decimal128(_, s) => s,
                        _ => 0,
                    };
                    let sums = Decimal128Array::from(
                        claimed
                            .iter()
                            .zip(&counts)
                            .map(|(&s, &c)| (c > 0).then(|| limbs(at(s, 1), at(s, 2), at(s, 3))))
                            .collect::<Vec<_>>(),
                    )
                    .with_precision_and_scale(38, scale)?;
                    let sum_type = a.state_types.last().unwrap_or(&DataType::Int64);
                    let sums = cast_with_options(&sums, sum_type, &strict)?;
                    if a.func == Func::Avg {
                        columns.push(Arc::new(UInt64Array::from_iter_values(
                            counts.iter().map(|&c| u64::from(c)),
                        )));
                    }
                    columns.push(sums);
                }
                Func::Min | Func::Max => {
                    let values: Vec<Option<i64>> = claimed
                        .iter()
                        .zip(&counts)
                        .map(|(&s, &c)| {
                            let (mut hi, mut lo) = (at(s, 1), at(s, 2));
                            if a.func == Func::Min {
                                (hi, lo) = (!hi, !lo);
                            }
                            (c > 0).then(|| {
                                ((u64::from(hi ^ 0x8000_0000) << 32) | u64::from(lo)) as i64
                            })
                        })
                        .collect();
                    columns.push(from_i64(values, &a.arg_type)?);
                }
            }
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

/// Each claimed slot's sum of `values` (Float64), added in row order as
/// DataFusion's accumulator adds them; NULLs skipped.
fn host_sums(claimed: &[usize], slots: usize, row_slots: &[u32], values: &ArrayRef) -> Vec<f64> {
    let mut index = vec![usize::MAX; slots];
    for (i, &s) in claimed.iter().enumerate() {
        index[s] = i;
    }
    let mut sums = vec![0.0f64; claimed.len()];
    let values = values.as_primitive::<Float64Type>();
    let nulls = values.logical_nulls();
    for (r, (&slot, &v)) in row_slots.iter().zip(values.values().iter()).enumerate() {
        if nulls.as_ref().is_none_or(|n| n.is_valid(r)) {
            sums[index[slot as usize]] += v;
        }
    }
    sums
}

/// A 96-bit two's complement sum from its limbs, low first.
fn limbs(l0: u32, l1: u32, l2: u32) -> i128 {
    let v = u128::from(l0) | (u128::from(l1) << 32) | (u128::from(l2) << 64);
    ((v << 32) as i128) >> 32
}

/// An argument's values as 64-bit integers (a NULL's value is
/// unspecified): floats as `total_cmp`'s keys; None where a decimal does
/// not fit, or a float is NaN or -0.
fn as_i64(array: &ArrayRef) -> Result<Option<Vec<i64>>> {
    let nulls = array.logical_nulls();
    let valid = |r: usize| nulls.as_ref().is_none_or(|n| n.is_valid(r));
    let unordered = |x: f64| x.is_nan() || (x == 0.0 && x.is_sign_negative());
    Ok(Some(match array.data_type() {
        DataType::Float64 => {
            let values = array.as_primitive::<Float64Type>().values();
            if (0..values.len()).any(|r| valid(r) && unordered(values[r])) {
                return Ok(None);
            }
            values.iter().map(|&x| total_key64(x)).collect()
        }
        DataType::Float32 => {
            let values = array.as_primitive::<Float32Type>().values();
            if (0..values.len()).any(|r| valid(r) && unordered(f64::from(values[r]))) {
                return Ok(None);
            }
            values.iter().map(|&x| i64::from(total_key32(x))).collect()
        }
        DataType::Decimal128(..) => {
            let mut out = Vec::with_capacity(array.len());
            for v in array.as_primitive::<Decimal128Type>().values().iter() {
                match i64::try_from(*v) {
                    Ok(v) => out.push(v),
                    Err(_) => return Ok(None),
                }
            }
            out
        }
        DataType::Date32 => array
            .as_primitive::<Date32Type>()
            .values()
            .iter()
            .map(|&d| i64::from(d))
            .collect(),
        _ => cast(array, &DataType::Int64)?
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
    }))
}

/// 64-bit integers as an array of `data_type` (a min or max of it).
fn from_i64(values: Vec<Option<i64>>, data_type: &DataType) -> Result<ArrayRef> {
    Ok(match data_type {
        DataType::Decimal128(p, s) => Arc::new(
            Decimal128Array::from(
                values
                    .into_iter()
                    .map(|v| v.map(i128::from))
                    .collect::<Vec<_>>(),
            )
            .with_precision_and_scale(*p, *s)?,
        ),
        DataType::Date32 => cast(
            &cast(&Int64Array::from(values), &DataType::Int32)?,
            data_type,
        )?,
        DataType::Float64 => Arc::new(Float64Array::from(
            values
                .into_iter()
                .map(|v| v.map(from_total_key64))
                .collect::<Vec<_>>(),
        )),
        DataType::Float32 => Arc::new(Float32Array::from(
            values
                .into_iter()
                .map(|v| v.map(|k| from_total_key32(k as i32)))
                .collect::<Vec<_>>(),
        )),
        _ => cast(&Int64Array::from(values), data_type)?,
    })
}
