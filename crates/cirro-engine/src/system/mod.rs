//! The `cirro` schema: Cirro's system tables, in every database.
//!
//! - `cirro.nodes`: the members of the cluster (one row, `local`, on a
//!   single node): id, addresses, state, cores, memory, running queries,
//!   and the load each node last reported (CPU, spill disk, cache).
//! - `cirro.cache`: the hot-data tier of this node, one row per data file it
//!   holds or was asked for: entries (column chunks), bytes, hits, misses,
//!   the best priority among its entries.
//! - `cirro.statistics`: what `ANALYZE` kept, one row per column of each
//!   analyzed table: rows, NULLs, estimated distinct values, the Delta
//!   version analyzed and when.
//! - `cirro.queries`: the statements of the cluster's sessions (every
//!   node's), queued, running and the last ended ones (see `queries.rs`);
//!   empty in a session without a server (`cirro sql`).
//! - `cirro.gpu`: the GPU operators' device on this node, one row: its
//!   name (NULL without one), its memory manager's budget, policy and
//!   counters, the kernels' dispatches and bytes moved, the statements the
//!   scheduler runs and keeps waiting (see `docs/gpu.md`).
//!
//! Beside them in this folder: the PostgreSQL catalog and views the tools
//! read (`pg_compat.rs`), the server's registry of sessions and statements
//! (`activity.rs`), which statements a user may see (`visibility.rs`) and
//! the statements' record and admission (`queries.rs`).

pub mod activity;
pub(crate) mod pg_compat;
pub(crate) mod queries;
pub mod visibility;

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, StringArray, TimestampMillisecondArray,
};
use async_trait::async_trait;
use cirro_catalog::{Catalog, NodeInfo};
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

use crate::system::pg_compat::memory_table;

/// The system schema's name (reserved: CREATE SCHEMA refuses it).
pub const SYSTEM_SCHEMA: &str = "cirro";

const TABLES: &[&str] = &[
    "nodes",
    "cache",
    "statistics",
    "queries",
    "gpu",
    "jit",
    "memory",
];

/// The `cirro` schema of a session.
#[derive(Debug)]
pub(crate) struct SystemSchema {
    pub(crate) catalog: Arc<Catalog>,
    /// The session's entry in the server's registry (for `queries`).
    pub(crate) backend: Arc<std::sync::OnceLock<crate::system::activity::Backend>>,
    /// What of other sessions' statements the session's user may see.
    pub(crate) viewer: crate::system::visibility::StatementViewer,
    /// The node whose tiers and GPU `cache` and `gpu` show.
    pub(crate) node: Arc<crate::node::Node>,
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|t| t.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        match name {
            "nodes" => Ok(Some(nodes_table(&self.nodes())?)),
            "cache" => {
                // This node's tiers, then (on a cluster) every other node's.
                let me = match self.catalog.coordination() {
                    Some(cluster) => cluster.node_id(),
                    None => "local".to_string(),
                };
                let mut rows = cache_rows(&self.node, &me);
                if let Some(backend) = self.backend.get() {
                    rows.extend(backend.activity().cluster_cache().await);
                }
                Ok(Some(cache_table(&rows)?))
            }
            "gpu" => Ok(Some(gpu_table(&self.node)?)),
            "jit" => Ok(Some(jit_table(&self.node)?)),
            "memory" => Ok(Some(memory_table_of(&self.node)?)),
            "statistics" => Ok(Some(statistics_table(&self.catalog)?)),
            "queries" => {
                let views = match self.backend.get() {
                    Some(backend) => self
                        .viewer
                        .queries(backend.activity().cluster_queries().await),
                    None => Vec::new(),
                };
                Ok(Some(crate::system::queries::queries_table(&views)?))
            }
            _ => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}

impl SystemSchema {
    fn nodes(&self) -> Vec<NodeInfo> {
        match self.catalog.coordination() {
            Some(cluster) => cluster.nodes(),
            None => {
                let (cores, memory_bytes) = cirro_catalog::coordination::local_capacity();
                vec![NodeInfo {
                    id: "local".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    cores,
                    memory_bytes,
                    state: "running".into(),
                    ..NodeInfo::default()
                }]
            }
        }
    }
}

fn nodes_table(nodes: &[NodeInfo]) -> DfResult<Arc<dyn TableProvider>> {
    let text = |f: &dyn Fn(&NodeInfo) -> &str| {
        let values: Vec<Option<&str>> = nodes
            .iter()
            .map(|n| Some(f(n)).filter(|s| !s.is_empty()))
            .collect();
        Arc::new(StringArray::from(values)) as ArrayRef
    };
    let int32 = |f: &dyn Fn(&NodeInfo) -> u32| {
        Arc::new(Int32Array::from_iter_values(
            nodes.iter().map(|n| f(n) as i32),
        )) as ArrayRef
    };
    let int64 = |f: &dyn Fn(&NodeInfo) -> u64| {
        Arc::new(Int64Array::from_iter_values(
            nodes.iter().map(|n| f(n) as i64),
        )) as ArrayRef
    };
    let started: Vec<Option<i64>> = nodes
        .iter()
        .map(|n| Some(n.started_ms).filter(|&t| t > 0))
        .collect();
    memory_table(vec![
        ("id", text(&|n| &n.id)),
        ("pg_address", text(&|n| &n.pg)),
        ("flight_address", text(&|n| &n.flight)),
        ("worker_address", text(&|n| &n.worker)),
        ("state", text(&|n| &n.state)),
        ("cores", int32(&|n| n.cores)),
        ("memory_bytes", int64(&|n| n.memory_bytes)),
        ("queries", int32(&|n| n.queries)),
        ("tasks", int32(&|n| n.tasks)),
        ("memory_used", int64(&|n| n.memory_used)),
        ("version", text(&|n| &n.version)),
        (
            "started",
            Arc::new(TimestampMillisecondArray::from(started).with_timezone("UTC")),
        ),
        ("http_address", text(&|n| &n.http)),
        (
            "cpu_percent",
            Arc::new(Float64Array::from_iter_values(
                nodes.iter().map(|n| f64::from(n.cpu_permille) / 10.0),
            )),
        ),
        ("disk_bytes", int64(&|n| n.disk_bytes)),
        ("disk_free", int64(&|n| n.disk_free)),
        ("cache_bytes", int64(&|n| n.cache_bytes)),
        ("number", int32(&|n| n.number)),
    ])
}

fn statistics_table(catalog: &Catalog) -> DfResult<Arc<dyn TableProvider>> {
    let snapshot = catalog.snapshot();
    let (mut dbs, mut schemas, mut tables, mut columns) = (vec![], vec![], vec![], vec![]);
    let (mut rows, mut nulls, mut distinct, mut versions, mut when) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (db, database) in &snapshot.databases {
        for (schema, entry) in &database.schemas {
            for (table, entry) in &entry.tables {
                let Some(stats) = &entry.statistics else {
                    continue;
                };
                for (column, c) in &stats.columns {
                    dbs.push(db.clone());
                    schemas.push(schema.clone());
                    tables.push(table.clone());
                    columns.push(column.clone());
                    rows.push(stats.rows as i64);
                    nulls.push(c.nulls as i64);
                    distinct.push(c.distinct.map(|d| d as i64));
                    versions.push(stats.version);
                    when.push(stats.analyzed_ms);
                }
            }
        }
    }
    memory_table(vec![
        ("database", Arc::new(StringArray::from(dbs)) as ArrayRef),
        ("schema", Arc::new(StringArray::from(schemas))),
        ("table", Arc::new(StringArray::from(tables))),
        ("column", Arc::new(StringArray::from(columns))),
        ("rows", Arc::new(Int64Array::from(rows))),
        ("nulls", Arc::new(Int64Array::from(nulls))),
        ("distinct", Arc::new(Int64Array::from(distinct))),
        ("version", Arc::new(Int64Array::from(versions))),
        (
            "analyzed_at",
            Arc::new(TimestampMillisecondArray::from(when).with_timezone("UTC")),
        ),
    ])
}

/// The counters of `cirro.gpu`, after its text columns.
const GPU_COUNTERS: [&str; 15] = [
    "memory_budget",
    "resident",
    "evictions",
    "written_back",
    "loaded",
    "cache_hits",
    "cache_misses",
    "dispatches",
    "kernels_compiled",
    "bytes_to_device",
    "bytes_from_device",
    "transfer_ms",
    "kernel_ms",
    "running",
    "waiting",
];

/// The device's name, whether it is a software one, the replacement
/// policy, and [`GPU_COUNTERS`]; all NULL without a device.
type GpuStatus = (
    Option<String>,
    Option<bool>,
    Option<String>,
    [Option<u64>; 15],
);

fn gpu_status(node: &crate::node::Node) -> GpuStatus {
    #[cfg(feature = "gpu")]
    if let (Some(gpu), Some(memory)) = (node.accelerator().device(), node.accelerator().memory()) {
        let m = memory.stats();
        let c = gpu.counters.values();
        let queries = node
            .accelerator()
            .scheduler()
            .map(|s| s.queries())
            .unwrap_or_default();
        let running = queries.iter().filter(|q| q.running).count() as u64;
        let policy = format!("{:?}", memory.policy()).to_ascii_lowercase();
        return (
            Some(gpu.name.clone()),
            Some(gpu.software),
            Some(policy),
            [
                memory.budget(),
                m.resident,
                m.evictions,
                m.written_back,
                m.loaded,
                m.hits,
                m.misses,
                c.dispatches,
                c.compiles,
                c.bytes_to_device,
                c.bytes_from_device,
                c.transfer_nanos / 1_000_000,
                c.kernel_nanos / 1_000_000,
                running,
                queries.len() as u64 - running,
            ]
            .map(Some),
        );
    }
    (None, None, None, [None; 15])
}

fn gpu_table(node: &crate::node::Node) -> DfResult<Arc<dyn TableProvider>> {
    let (device, software, policy, counters) = gpu_status(node);
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("device", Arc::new(StringArray::from(vec![device]))),
        (
            "software",
            Arc::new(arrow::array::BooleanArray::from(vec![software])),
        ),
        ("policy", Arc::new(StringArray::from(vec![policy]))),
    ];
    for (name, value) in GPU_COUNTERS.iter().zip(counters) {
        columns.push((
            name,
            Arc::new(Int64Array::from(vec![value.map(|v| v as i64)])),
        ));
    }
    memory_table(columns)
}

/// This node's runtime code generation: kernels compiled, found compiled
/// already, and expressions that could not be compiled (its own queries'
/// and the tasks of other nodes' queries it ran).
fn jit_table(node: &crate::node::Node) -> DfResult<Arc<dyn TableProvider>> {
    let stats = node.kernels().stats();
    let column = |v: u64| Arc::new(Int64Array::from(vec![v as i64])) as ArrayRef;
    memory_table(vec![
        ("compiled", column(stats.compiled)),
        ("cache_hits", column(stats.cache_hits)),
        ("failed", column(stats.failed)),
    ])
}

/// `cirro.memory`: this node's memory for queries (its budget, what its
/// queries hold now and at most: its own statements and the tasks of
/// other nodes' that run here), and the requests refused since it started:
/// to operators that spilled instead, and to the others.
fn memory_table_of(node: &crate::node::Node) -> DfResult<Arc<dyn TableProvider>> {
    let resources = node.resources();
    let budget = resources.budget();
    let (spilling, other) = budget.refusals();
    let column = |v: u64| Arc::new(Int64Array::from(vec![v as i64])) as ArrayRef;
    memory_table(vec![
        ("budget", column(budget.limit() as u64)),
        ("used", column(budget.used() as u64)),
        ("peak", column(budget.peak() as u64)),
        ("refused_spilling", column(spilling)),
        ("refused_other", column(other)),
    ])
}

/// A row of `cirro.cache`: one data file's entries in one tier of one node.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CacheRow {
    pub node: String,
    pub file: String,
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub priority: Option<String>,
    pub tier: String,
    pub repairs: u64,
}

/// `node`'s tiers by data file, as node `id`: the memory tier's files, then
/// the disk tier's (full URLs).
pub fn cache_rows(node: &crate::node::Node, id: &str) -> Vec<CacheRow> {
    let row = |file: String, c: cirro_storage::cache::FileCounts, tier: &str| CacheRow {
        node: id.to_string(),
        file,
        entries: c.entries,
        bytes: c.bytes,
        hits: c.hits,
        misses: c.misses,
        priority: c.priority.map(|p| p.name().to_string()),
        tier: tier.to_string(),
        repairs: c.repairs,
    };
    let mut rows: Vec<CacheRow> = node
        .cache()
        .by_file()
        .into_iter()
        .map(|(file, counts)| row(file, counts, "memory"))
        .collect();
    if let Some(disk) = node.disk() {
        rows.extend(
            disk.by_file()
                .into_iter()
                .map(|(file, counts)| row(file, counts, "disk")),
        );
    }
    rows
}

fn cache_table(rows: &[CacheRow]) -> DfResult<Arc<dyn TableProvider>> {
    let int64 = |f: &dyn Fn(&CacheRow) -> u64| {
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| f(r) as i64),
        )) as ArrayRef
    };
    let text = |f: &dyn Fn(&CacheRow) -> &str| {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f))) as ArrayRef
    };
    memory_table(vec![
        ("node", text(&|r| &r.node)),
        ("file", text(&|r| &r.file)),
        ("entries", int64(&|r| r.entries)),
        ("bytes", int64(&|r| r.bytes)),
        ("hits", int64(&|r| r.hits)),
        ("misses", int64(&|r| r.misses)),
        (
            "priority",
            Arc::new(StringArray::from(
                rows.iter()
                    .map(|r| r.priority.as_deref())
                    .collect::<Vec<_>>(),
            )),
        ),
        ("tier", text(&|r| &r.tier)),
        ("repairs", int64(&|r| r.repairs)),
    ])
}
