//! Kernels every operator shares: the prefix sum of per-workgroup counts
//! and the compaction of flagged rows into their indices (the second and
//! third steps of a selection).

use crate::device::{DeviceBuffer, Gpu, GpuResult, Launch, WORKGROUP, groups};

/// Exclusive prefix sum of `counts[0..n]` into `offsets[0..n]`, the total
/// into `offsets[n]`; one workgroup, each thread a contiguous run.
pub(crate) const SCAN: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> counts: array<u32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>;
var<workgroup> sums: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let n = params[0];
    let per = (n + 255u) / 256u;
    let start = min(lid * per, n);
    let end = min(start + per, n);
    var s = 0u;
    for (var i = start; i < end; i++) { s += counts[i]; }
    sums[lid] = s;
    workgroupBarrier();
    for (var d = 1u; d < 256u; d = d * 2u) {
        var add = 0u;
        if (lid >= d) { add = sums[lid - d]; }
        workgroupBarrier();
        sums[lid] += add;
        workgroupBarrier();
    }
    var offset = 0u;
    if (lid > 0u) { offset = sums[lid - 1u]; }
    for (var i = start; i < end; i++) { offsets[i] = offset; offset += counts[i]; }
    if (lid == 255u) { offsets[n] = sums[255]; }
}
"#;

/// Each flagged row's index written at its workgroup's offset plus its
/// rank among the workgroup's flagged rows (rows stay in order).
const COMPACT: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> flags: array<u32>;
@group(0) @binding(2) var<storage, read> offsets: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
var<workgroup> ranks: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let group = wid.y * nwg.x + wid.x;
    let row = group * 256u + lid;
    let f = flags[row];
    ranks[lid] = f;
    workgroupBarrier();
    for (var d = 1u; d < 256u; d = d * 2u) {
        var add = 0u;
        if (lid >= d) { add = ranks[lid - d]; }
        workgroupBarrier();
        ranks[lid] += add;
        workgroupBarrier();
    }
    if (f == 1u && row < params[0]) { out[offsets[group] + ranks[lid] - 1u] = row; }
}
"#;

/// A block's bitmap packed from its input batches' bitmaps, each copied to
/// a word boundary of `staged`: params are the rows, the parts, then each
/// part's first row and first word. One thread per word of `dense`.
pub(crate) const PACK_BITS: &str = r#"
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> staged: array<u32>;
@group(0) @binding(2) var<storage, read_write> dense: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = (wid.y * nwg.x + wid.x) * 256u + lid;
    let rows = params[0];
    let parts = params[1];
    if (w * 32u >= rows) { return; }
    var out = 0u;
    for (var b = 0u; b < 32u; b++) {
        let i = w * 32u + b;
        if (i >= rows) { break; }
        var lo = 0u;
        var hi = parts;
        while (hi - lo > 1u) {
            let mid = (lo + hi) / 2u;
            if (params[2u + 2u * mid] <= i) { lo = mid; } else { hi = mid; }
        }
        let src = params[3u + 2u * lo] * 32u + (i - params[2u + 2u * lo]);
        out |= ((staged[src / 32u] >> (src % 32u)) & 1u) << b;
    }
    dense[w] = out;
}
"#;

/// Bytes of the flags and counts buffers a kernel over `rows` rows writes
/// for [`compact`].
pub fn flag_bytes(rows: u64) -> (u64, u64) {
    let g = groups(rows);
    (g * u64::from(WORKGROUP) * 4, (g + 1) * 4)
}

/// The indices of the flagged rows among `rows`, in order, from the flags
/// and per-workgroup counts a predicate kernel wrote; `offsets` (as large
/// as `counts`) and `out` (4 bytes a row) are its scratch.
pub fn compact(
    gpu: &Gpu,
    rows: u64,
    flags: &DeviceBuffer,
    counts: &DeviceBuffer,
    offsets: &DeviceBuffer,
    out: &DeviceBuffer,
) -> GpuResult<Vec<u32>> {
    let g = groups(rows);
    let scan = gpu.kernel(SCAN)?;
    let compact = gpu.kernel(COMPACT)?;
    let scan_params = gpu.upload(&(g as u32).to_le_bytes());
    let params = gpu.upload(&(rows as u32).to_le_bytes());
    gpu.run(&[
        Launch {
            kernel: &scan,
            buffers: vec![&scan_params.buffer, &counts.buffer, &offsets.buffer],
            threads: u64::from(WORKGROUP),
        },
        Launch {
            kernel: &compact,
            buffers: vec![&params.buffer, &flags.buffer, &offsets.buffer, &out.buffer],
            threads: rows,
        },
    ])?;
    let total_bytes = gpu.download_at(&offsets.buffer, g * 4, 4)?;
    let total = u32::from_le_bytes(total_bytes[..4].try_into().unwrap_or([0; 4]));
    let bytes = gpu.download(&out.buffer, u64::from(total) * 4)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// WGSL `fn hash_<array>(r: u32) -> u32`: row `r`'s `KW` key words of
/// `array` hashed (FNV-1a, then a finaliser that spreads the low bits the
/// hash tables' masks keep). The build and the probe of a join and the
/// groups of an aggregation hash alike.
pub(crate) fn hash_source(array: &str) -> String {
    format!(
        r#"
fn hash_{array}(r: u32) -> u32 {{
    var h = 2166136261u;
    for (var j = 0u; j < KW; j++) {{ h = (h ^ {array}[r * KW + j]) * 16777619u; }}
    h ^= h >> 16u;
    h *= 0x7feb352du;
    h ^= h >> 15u;
    h *= 0x846ca68bu;
    h ^= h >> 16u;
    return h;
}}
"#
    )
}

/// WGSL `fn same(a: u32, b: u32) -> bool`: whether row `a`'s `KW` key
/// words of `left` equal row `b`'s of `right` (a hash table's probe).
pub(crate) fn same_source(left: &str, right: &str) -> String {
    format!(
        r#"
fn same(a: u32, b: u32) -> bool {{
    for (var j = 0u; j < KW; j++) {{
        if ({left}[a * KW + j] != {right}[b * KW + j]) {{ return false; }}
    }}
    return true;
}}
"#
    )
}
