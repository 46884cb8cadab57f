//! One node: what a process running Cirro builds once from its flags and
//! shares with every session — the memory budget, admission queue and spill
//! area ([`Resources`]), the hot-data tier, the local-disk tier, the
//! compiled-expression cache and the GPU (device, device memory,
//! scheduler). Sessions reach them through their [`EngineConfig`]
//! (`config.node`); the planner hands them to the rules and operators that
//! use them. Nothing of this is process-wide: two nodes in one process (a
//! test's) each see only their own.
//!
//! [`EngineConfig`]: crate::EngineConfig

use std::sync::Arc;

use cirro_common::{CirroError, Result, SqlState};
use cirro_exec::jit::Kernels;
use cirro_exec::resources::{ResourceConfig, Resources};
use cirro_storage::cache::disk::DiskTier;
use cirro_storage::cache::{ColumnCache, Policy};

/// How a node is set up (the process's flags).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The memory limit, the queries' share, spill folder, admission;
    /// `cache_bytes` is the hot-data tier's budget.
    pub resources: ResourceConfig,
    /// What leaves the hot-data tier first (`--cache-policy`).
    pub cache_policy: Policy,
    /// The local-disk tier (`--cache-dir`), opened.
    pub disk: Option<Arc<DiskTier>>,
    /// The GPU's device memory (`--gpu-memory`).
    pub gpu_memory: u64,
    /// What leaves device memory first (`--gpu-policy`: cdr, lru, mru, lfu
    /// or random).
    pub gpu_policy: String,
}

/// What one node owns (see the module docs).
#[derive(Debug)]
pub struct Node {
    resources: Arc<Resources>,
    cache: Arc<ColumnCache>,
    disk: Option<Arc<DiskTier>>,
    kernels: Arc<Kernels>,
    #[cfg(feature = "gpu")]
    accelerator: Arc<cirro_gpu::Accelerator>,
}

/// The GPU's replacement policies by name.
#[cfg(not(feature = "gpu"))]
const GPU_POLICIES: &[&str] = &["cdr", "lru", "mru", "lfu", "random"];

impl Node {
    /// The node `config` describes: 22023 for a memory limit that leaves
    /// too little for queries or an unknown GPU policy. The GPU device is
    /// opened on its first use, not here.
    pub fn new(config: NodeConfig) -> Result<Self> {
        let bad = |e: String| CirroError::new(SqlState::INVALID_PARAMETER_VALUE, e);
        // Without the GPU operators only the policy's name is checked.
        #[cfg(not(feature = "gpu"))]
        if !GPU_POLICIES.contains(&config.gpu_policy.to_ascii_lowercase().as_str()) {
            return Err(bad(format!(
                "unknown replacement policy {:?}",
                config.gpu_policy
            )));
        }
        #[cfg(feature = "gpu")]
        let accelerator = {
            let policy: cirro_gpu::Policy = config.gpu_policy.parse().map_err(bad)?;
            Arc::new(cirro_gpu::Accelerator::new(config.gpu_memory, policy))
        };
        let cache = Arc::new(ColumnCache::new(
            config.resources.cache_bytes as u64,
            config.cache_policy,
        ));
        Ok(Self {
            resources: Arc::new(Resources::new(config.resources)?),
            cache,
            disk: config.disk,
            kernels: Arc::default(),
            #[cfg(feature = "gpu")]
            accelerator,
        })
    }

    /// The memory budget, the admission queue and the spill area.
    pub fn resources(&self) -> &Arc<Resources> {
        &self.resources
    }

    /// The hot-data tier.
    pub fn cache(&self) -> &Arc<ColumnCache> {
        &self.cache
    }

    /// The local-disk tier, if `--cache-dir` named one.
    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// The compiled expressions' kernels.
    pub fn kernels(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// The GPU: device, device memory, scheduler.
    #[cfg(feature = "gpu")]
    pub fn accelerator(&self) -> &Arc<cirro_gpu::Accelerator> {
        &self.accelerator
    }

    /// Remove the node's spill folder (its files are gone with their
    /// queries): at exit, where a session may still hold the node.
    pub fn close(&self) {
        self.resources.close();
    }
}

impl Default for Node {
    /// The defaults on this machine: the memory shares of
    /// [`Resources::with_defaults`], the plan policy, no disk tier, 1 GiB
    /// of device memory under CDR.
    fn default() -> Self {
        let resources = Resources::with_defaults();
        let cache = Arc::new(ColumnCache::new(
            resources.config().cache_bytes as u64,
            Policy::Plan,
        ));
        Self {
            resources: Arc::new(resources),
            cache,
            disk: None,
            kernels: Arc::default(),
            #[cfg(feature = "gpu")]
            accelerator: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow::array::{Array, AsArray};
    use futures::TryStreamExt;

    use super::*;
    use crate::{Engine, EngineConfig, Outcome};

    fn node(memory: usize, cache: usize, query: usize, spill: &Path, running: usize) -> Arc<Node> {
        let resources = ResourceConfig {
            memory_limit: memory,
            cache_bytes: cache,
            query_memory: query,
            spill_dir: spill.to_path_buf(),
            max_running: running,
        };
        Arc::new(
            Node::new(NodeConfig {
                resources,
                cache_policy: Policy::Plan,
                disk: None,
                gpu_memory: (cache / 2) as u64,
                gpu_policy: "lru".into(),
            })
            .expect("node"),
        )
    }

    async fn open(dir: &Path, node: &Arc<Node>) -> Engine {
        let config = EngineConfig {
            node: Arc::clone(node),
            ..EngineConfig::default()
        };
        Engine::open(dir.to_str().expect("utf8"), config)
            .await
            .expect("open")
    }

    async fn strings(engine: &Engine, sql: &str) -> Vec<String> {
        let Outcome::Rows(stream) = engine.execute(sql).await.expect(sql) else {
            panic!("{sql}: no rows");
        };
        let batches: Vec<_> = stream.try_collect().await.expect(sql);
        batches
            .iter()
            .flat_map(|b| {
                let column = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)
                    .expect("text");
                let column = column.as_string::<i32>().clone();
                (0..column.len())
                    .map(move |i| column.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Two nodes in one process, with their own limits: each session sees
    /// its own node's memory budget, admission, hot-data tier, kernels,
    /// spill folder and GPU, and nothing of the other's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_nodes_in_one_process_each_see_only_their_own() {
        let spill = tempfile::tempdir().expect("spill");
        let (a_dir, b_dir) = (
            tempfile::tempdir().expect("a"),
            tempfile::tempdir().expect("b"),
        );
        let a = node(512 << 20, 64 << 20, 32 << 20, spill.path(), 3);
        let b = node(1 << 30, 128 << 20, 48 << 20, spill.path(), 5);
        let (ea, eb) = (open(a_dir.path(), &a).await, open(b_dir.path(), &b).await);
        // Memory: the budget is the limit less the tier's; a session's
        // statements get the node's query memory; admission is the node's.
        assert_eq!(a.resources().budget().limit(), (512 - 64) << 20);
        assert_eq!(b.resources().budget().limit(), (1024 - 128) << 20);
        assert_eq!(ea.memory_limit(), 32 << 20);
        assert_eq!(eb.memory_limit(), 48 << 20);
        assert_eq!(strings(&ea, "SHOW memory_limit").await, ["32MB"]);
        assert_eq!(strings(&eb, "SHOW memory_limit").await, ["48MB"]);
        assert_eq!(a.resources().admission().max_running(), 3);
        assert_eq!(b.resources().admission().max_running(), 5);
        // The hot-data tier: each holds the files its own session read.
        assert_eq!(
            (a.cache().budget(), b.cache().budget()),
            (64 << 20, 128 << 20)
        );
        ea.execute("SET jit = force").await.expect("jit");
        eb.execute("SET jit = off").await.expect("jit");
        for engine in [&ea, &eb] {
            for sql in [
                "CREATE TABLE t (id BIGINT, v BIGINT)",
                "INSERT INTO t SELECT value, value * 7 FROM generate_series(1, 5000) AS g(value)",
            ] {
                engine.execute(sql).await.expect(sql);
            }
        }
        let query = "SELECT sum(v * 3 + id) FROM t WHERE id > 10";
        for _ in 0..2 {
            assert_eq!(strings(&ea, query).await, strings(&eb, query).await);
        }
        let a_files = strings(&ea, "SELECT file FROM cirro.cache").await;
        let b_files = strings(&eb, "SELECT file FROM cirro.cache").await;
        let (a_name, b_name) = (
            a_dir
                .path()
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string(),
            b_dir
                .path()
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string(),
        );
        assert!(
            !a_files.is_empty() && !b_files.is_empty(),
            "{a_files:?} {b_files:?}"
        );
        assert!(
            a_files
                .iter()
                .all(|f| f.contains(&a_name) && !f.contains(&b_name)),
            "{a_files:?}"
        );
        assert!(
            b_files
                .iter()
                .all(|f| f.contains(&b_name) && !f.contains(&a_name)),
            "{b_files:?}"
        );
        assert!(a.cache().totals().bytes > 0 && b.cache().totals().bytes > 0);
        // The kernels: only the node whose session compiled has any.
        assert!(
            a.kernels().stats().compiled > 0,
            "{:?}",
            a.kernels().stats()
        );
        assert_eq!(b.kernels().stats(), cirro_exec::jit::JitStats::default());
        // The spill area: one folder each under the shared root; closing
        // one node removes only its own.
        let (a_spill, b_spill) = (
            a.resources().spill().expect("a spill").dir().to_path_buf(),
            b.resources().spill().expect("b spill").dir().to_path_buf(),
        );
        assert_ne!(a_spill, b_spill);
        a.close();
        assert!(!a_spill.exists() && b_spill.exists());
        // The GPU: each node's device memory has its own budget and policy.
        #[cfg(feature = "gpu")]
        {
            let memory = |n: &Node| n.accelerator().memory().map(|m| m.budget());
            assert_eq!(memory(&a), Some(32 << 20), "no Vulkan device");
            assert_eq!(memory(&b), Some(64 << 20));
            assert_eq!(
                strings(&ea, "SELECT memory_budget FROM cirro.gpu").await,
                ["33554432"]
            );
            assert_eq!(
                strings(&eb, "SELECT memory_budget FROM cirro.gpu").await,
                ["67108864"]
            );
        }
    }
}
