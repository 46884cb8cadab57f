//! The seam between the catalog and a cluster: what the catalog needs from
//! the cluster's coordination service (ZooKeeper, in `cirro-cluster`).
//!
//! A single node has none: the catalog's versions are listed on the storage
//! and locks are local (a mutex, plus an OS file lock on a local directory).
//! In a cluster, [`Coordination`] holds the number of the current catalog
//! version (one small read per statement instead of listing `_catalog/`),
//! serializes catalog changes with a cluster-wide lock, and gives every
//! table a cluster-wide write lock. The snapshots themselves stay on the
//! shared storage: a data location opens the same with or without a cluster.

use std::any::Any;

use async_trait::async_trait;
use cirro_common::Result;
use serde::{Deserialize, Serialize};

/// A held cluster-wide lock; dropping it releases the lock.
pub type HeldLock = Box<dyn Any + Send + Sync>;

// The highest node number (defined in `cirro_common::limits`).
pub use cirro_common::limits::NODE_NUMBER_MAX;

/// One member of the cluster, as it registered itself.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeInfo {
    /// The node's name (`--node-id`), unique in the cluster.
    pub id: String,
    /// The Cirro version the node runs.
    pub version: String,
    /// `host:port` of the PostgreSQL protocol.
    pub pg: String,
    /// `host:port` of Arrow Flight SQL.
    pub flight: String,
    /// `host:port` of the worker service (distributed tasks).
    pub worker: String,
    pub cores: u32,
    pub memory_bytes: u64,
    pub started_ms: i64,
    /// `running`, or `draining` after SIGTERM.
    pub state: String,
    /// Queries the node runs now (updated as it changes, best effort).
    #[serde(default)]
    pub queries: u32,
    /// Tasks of distributed queries it runs now (same).
    #[serde(default)]
    pub tasks: u32,
    /// Bytes of its memory pool in use (same).
    #[serde(default)]
    pub memory_used: u64,
    /// `host:port` of the web console and HTTP API (empty: none).
    #[serde(default)]
    pub http: String,
    /// The node's number in the cluster (the high bits of its backend pids
    /// and query ids; unique among live nodes).
    #[serde(default)]
    pub number: u32,
    /// CPU the node's process used over the last seconds, in thousandths
    /// of the machine (same best-effort updates as `queries`).
    #[serde(default)]
    pub cpu_permille: u32,
    /// Size and free bytes of the file system of its spill directory.
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub disk_free: u64,
    /// Bytes its hot-data cache holds (memory tier).
    #[serde(default)]
    pub cache_bytes: u64,
}

/// This machine's cores and memory, for the node's registration.
pub fn local_capacity() -> (u32, u64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0);
    (cores, memory)
}

/// The catalog's view of the cluster (see the module docs).
#[async_trait]
pub trait Coordination: Send + Sync + std::fmt::Debug {
    /// The catalog version last published, or None when none was published
    /// yet (the catalog then lists the storage). Fails when the
    /// coordination service cannot be reached: the catalog then serves its
    /// last snapshot.
    async fn catalog_version(&self) -> Result<Option<u64>>;
    /// Publish `version` as current (after its snapshot was written).
    async fn publish_catalog_version(&self, version: u64) -> Result<()>;
    /// Take the cluster-wide lock `name` (`catalog`, or a table's location):
    /// waits while another node holds it; fails when the service cannot be
    /// reached.
    async fn lock(&self, name: &str) -> Result<HeldLock>;
    /// The members of the cluster as last seen (this node included).
    fn nodes(&self) -> Vec<NodeInfo>;
    /// This node's id.
    fn node_id(&self) -> String;
}
