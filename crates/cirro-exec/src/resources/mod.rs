//! Resource control: the server's memory budget, each query's pool in it,
//! the admission queue in front of execution, and the spill area (see
//! `docs/resources.md`).
//!
//! A node owns one [`Resources`] (built from `cirro serve`'s and `cirro
//! sql`'s flags, or [`Resources::with_defaults`] for tests and embedding)
//! and hands it to its sessions; nothing here is process-wide. Dropping it
//! removes its spill folder.

pub mod admission;
pub mod memory;
pub mod spill;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cirro_common::{CirroError, Result, SqlState};

pub use admission::{Admission, AdmissionCounts, Ticket};
pub use memory::{MemoryBudget, QueryMemory, QueryPools, SessionMemory, format_bytes};
pub use spill::SpillArea;

/// The share of the machine's memory a server uses unless `--memory-limit`
/// says otherwise.
pub const DEFAULT_MEMORY_SHARE: f64 = 0.8;

/// The share of the queries' memory one query may use unless `SET
/// memory_limit` (or `--query-memory`) says otherwise.
pub const DEFAULT_QUERY_SHARE: f64 = 0.25;

/// Statements that run at once unless `--max-running-queries` says
/// otherwise: twice the cores, at least four.
pub fn default_max_running() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(4)
        .max(4)
}

/// The least memory a query may be given.
pub const QUERY_MEMORY_MIN_BYTES: usize = 1 << 20;

/// What a sort sets aside for merging its spill files in a query of
/// `limit` bytes: DataFusion's 10 MB, at most a sixteenth of the limit.
pub fn sort_merge_reservation(limit: usize) -> usize {
    (limit / 16).min(10 << 20)
}

datafusion::common::extensions_options! {
    /// The statement a session runs, as its tasks carry it to the nodes
    /// that run them (the engine sets it as each statement starts).
    pub struct QueryOptions {
        /// The statement's id, unique across the cluster: a node counts
        /// all its tasks in one pool ([`QueryPools`]).
        pub id: String, default = String::new()
        /// Its memory limit in bytes on each node (0: the node's default).
        pub memory_limit: usize, default = 0
    }
}

impl datafusion::common::config::ConfigExtension for QueryOptions {
    const PREFIX: &'static str = "cirro_query";
}

/// Set what depends on a statement's memory limit in its `options`: its
/// id and limit for the nodes its tasks reach ([`QueryOptions`], `id`
/// None keeps the one there), what a sort keeps for merging its spill
/// files (DataFusion's default, 10 MB, is more than a small limit holds),
/// and the room adaptive aggregation plans its radix partitions for.
pub fn set_query_options(
    options: &mut datafusion::config::ConfigOptions,
    id: Option<&str>,
    limit: usize,
) {
    options.execution.sort_spill_reservation_bytes = sort_merge_reservation(limit);
    if let Some(aggregation) = options
        .extensions
        .get_mut::<crate::rules::AggregationOptions>()
    {
        aggregation.memory_limit = limit;
    }
    if let Some(query) = options.extensions.get_mut::<QueryOptions>() {
        if let Some(id) = id {
            query.id = id.to_string();
        }
        query.memory_limit = limit;
    }
}

/// A new statement id, unique across the nodes of a cluster: the
/// process's random hash keys over its pid, the time and a count, twice
/// (128 bits, in hex).
pub fn new_query_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // With the pid, asked once (each `process::id()` is a system call).
    static KEYS: std::sync::LazyLock<(std::collections::hash_map::RandomState, u32)> =
        std::sync::LazyLock::new(|| (Default::default(), std::process::id()));
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u8| {
        let mut hasher = KEYS.0.build_hasher();
        hasher.write_u8(salt);
        hasher.write_u32(KEYS.1);
        hasher.write_u128(nanos);
        hasher.write_u64(count);
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

/// How a node's resources are set up.
#[derive(Clone, Debug)]
pub struct ResourceConfig {
    /// Everything the server may hold: the queries and the hot-data tier.
    pub memory_limit: usize,
    /// The part of it the hot-data tier keeps.
    pub cache_bytes: usize,
    /// A query's memory unless `SET memory_limit` says otherwise.
    pub query_memory: usize,
    /// The spill area's folder.
    pub spill_dir: PathBuf,
    /// Statements that may run at once (the rest wait in the admission
    /// queue).
    pub max_running: usize,
}

impl ResourceConfig {
    /// The defaults on this machine with a hot-data tier of `cache_bytes`.
    pub fn defaults(cache_bytes: usize) -> Self {
        let memory = cirro_common::limits::physical_memory().unwrap_or(4 << 30) as f64;
        let memory_limit = (memory * DEFAULT_MEMORY_SHARE) as usize;
        let queries = memory_limit.saturating_sub(cache_bytes);
        Self {
            memory_limit,
            cache_bytes,
            query_memory: ((queries as f64 * DEFAULT_QUERY_SHARE) as usize)
                .max(QUERY_MEMORY_MIN_BYTES),
            spill_dir: std::env::temp_dir().join("cirro-spill"),
            max_running: default_max_running(),
        }
    }
}

/// One node's resources.
#[derive(Debug)]
pub struct Resources {
    config: ResourceConfig,
    budget: Arc<MemoryBudget>,
    pools: Arc<QueryPools>,
    admission: Arc<Admission>,
    spill: OnceLock<std::result::Result<Arc<SpillArea>, CirroError>>,
}

impl Resources {
    /// The resources `config` describes; 22023 where its memory leaves
    /// too little for queries.
    pub fn new(config: ResourceConfig) -> Result<Self> {
        let queries = config
            .memory_limit
            .checked_sub(config.cache_bytes)
            .filter(|&q| q >= QUERY_MEMORY_MIN_BYTES);
        let Some(queries) = queries else {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!(
                    "the memory limit ({}) leaves less than {} for queries beside the hot-data tier's {} (lower --cache-memory or raise --memory-limit)",
                    format_bytes(config.memory_limit),
                    format_bytes(QUERY_MEMORY_MIN_BYTES),
                    format_bytes(config.cache_bytes)
                ),
            ));
        };
        let budget = Arc::new(MemoryBudget::new(queries));
        Ok(Self {
            pools: Arc::new(QueryPools::new(Arc::clone(&budget))),
            budget,
            admission: Admission::new(config.max_running, queries),
            config,
            spill: OnceLock::new(),
        })
    }

    /// The defaults on this machine, with the hot-data tier's default share
    /// of memory (none where that leaves too little for queries).
    pub fn with_defaults() -> Self {
        let cache = cirro_common::limits::physical_memory().unwrap_or(4 << 30) as f64 * 0.25;
        let config = ResourceConfig::defaults(cache as usize);
        Resources::new(config.clone()).unwrap_or_else(|_| {
            Resources::new(ResourceConfig {
                cache_bytes: 0,
                ..config
            })
            .expect("defaults fit")
        })
    }

    pub fn config(&self) -> &ResourceConfig {
        &self.config
    }

    /// What the queries may hold together.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// The pools of the queries running on the node, by query id.
    pub fn pools(&self) -> &Arc<QueryPools> {
        &self.pools
    }

    /// The pool of the query `id`'s tasks on this node (see
    /// [`QueryPools::join`]): of `limit` bytes, or the node's default
    /// where 0.
    pub fn task_pool(&self, id: &str, limit: usize) -> Arc<QueryMemory> {
        let limit = match limit {
            0 => self.query_memory(),
            n => n,
        };
        self.pools.join(id, limit)
    }

    /// The admission queue: statements reserve their memory limit in it.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// A query's memory unless the session says otherwise: the configured
    /// default, at most the whole budget.
    pub fn query_memory(&self) -> usize {
        self.config.query_memory.min(self.budget.limit())
    }

    /// Remove the spill folder if it was made (at exit: a session may
    /// still hold the resources, so they may not be dropped in time).
    pub fn close(&self) {
        if let Some(Ok(area)) = self.spill.get() {
            area.remove();
        }
    }

    /// The spill area, opened on first use.
    pub fn spill(&self) -> Result<&Arc<SpillArea>> {
        self.spill
            .get_or_init(|| SpillArea::open(&self.config.spill_dir).map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A query memory limit from a setting's text (`64MB`, `512kB`, `1GB`;
    /// a bare number is kilobytes, as PostgreSQL's memory settings are; `0`
    /// or `default` is the server's default), refused past the budget.
    pub fn parse_query_memory(&self, text: &str) -> Result<usize> {
        let t = text.trim();
        let bad = |why: String| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"memory_limit\": \"{text}\": {why}"),
            )
        };
        if t.eq_ignore_ascii_case("default") {
            return Ok(self.query_memory());
        }
        let bytes = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse::<u64>()
                .ok()
                .and_then(|kb| kb.checked_mul(1024))
                .ok_or_else(|| bad("too large".into()))?
        } else {
            cirro_common::limits::parse_size(t, self.budget.limit() as u64).map_err(bad)?
        };
        if bytes == 0 {
            return Ok(self.query_memory());
        }
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        if bytes < QUERY_MEMORY_MIN_BYTES {
            return Err(bad(format!(
                "at least {}",
                format_bytes(QUERY_MEMORY_MIN_BYTES)
            )));
        }
        if bytes > self.budget.limit() {
            return Err(bad(format!(
                "more than the server's memory for queries ({})",
                format_bytes(self.budget.limit())
            )));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(limit: usize, cache: usize) -> Result<Resources> {
        Resources::new(ResourceConfig {
            memory_limit: limit,
            cache_bytes: cache,
            query_memory: 256 << 20,
            spill_dir: std::env::temp_dir(),
            max_running: 4,
        })
    }

    #[test]
    fn query_limits_take_postgresql_units_within_the_budget() {
        let r = resources(2 << 30, 512 << 20).unwrap();
        assert_eq!(r.budget().limit(), 1536 << 20);
        assert_eq!(r.parse_query_memory("64MB").unwrap(), 64 << 20);
        assert_eq!(
            r.parse_query_memory("65536").unwrap(),
            64 << 20,
            "bare numbers are kB"
        );
        assert_eq!(r.parse_query_memory("default").unwrap(), 256 << 20);
        assert_eq!(r.parse_query_memory("0").unwrap(), 256 << 20);
        assert_eq!(r.parse_query_memory("50%").unwrap(), 768 << 20);
        for bad in ["2GB", "1kB", "lots", "-5MB"] {
            let e = r.parse_query_memory(bad).unwrap_err();
            assert_eq!(e.state, SqlState::INVALID_PARAMETER_VALUE, "{bad}");
        }
        assert!(
            resources(100 << 20, 100 << 20).is_err(),
            "nothing left for queries"
        );
    }
}
