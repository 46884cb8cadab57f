//! Queries across the cluster: the coordinating side of
//! `datafusion-distributed`, and what the worker side needs to run Cirro's
//! plans.
//!
//! Every node coordinates the queries its clients send. A session of a
//! cluster node plans a query as a single node does, then, when the plan
//! can run elsewhere (see [`distributable`]), hands it to
//! `datafusion-distributed`'s planner, which cuts it into stages at its
//! shuffles and sends each stage's tasks to the live nodes:
//!
//! - **Who works**: the [`ClusterWorkers`] resolver lists the running
//!   members of the cluster (ZooKeeper's member list, which a background
//!   watch keeps current), less those that just failed to answer.
//! - **Where tasks go**: a stage of one task runs on the coordinator itself;
//!   the tasks of a larger stage go round the members from a random one.
//!   The session records where, for `EXPLAIN ANALYZE`.
//! - **How they talk**: [`ClusterChannels`] opens one gRPC channel per
//!   worker, with every request carrying the cluster secret, and HTTP/2
//!   keep-alives so that a node cut off mid-query is noticed in seconds.
//! - **What travels**: plans go as DataFusion's protobuf, which drops what a
//!   Parquet scan's files carry besides their names: Cirro's deletion
//!   vectors (a row selection per file). [`DeletionVectorsExec`] sits above
//!   such a scan and carries them; [`CirroCodec`] encodes it and puts the
//!   selections back onto the files on the worker. Cirro's own functions
//!   (checked arithmetic, …) are registered on every worker.
//!
//! Writes, system tables and plans with session-bound functions stay on the
//! coordinator.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cirro_catalog::{Coordination, NodeInfo};
use cirro_exec::distribution::{Distribution, Exchange};
use datafusion::catalog::Session;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{LogicalPlan, PlanType, StringifiedPlan};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::explain::ExplainExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::grpc::{BoxCloneSyncChannel, create_worker_client};
use datafusion_distributed::{
    ChannelResolver, DistributedExec, DistributedExt, DistributedLeafExec, NetworkBoundaryExt,
    NetworkBroadcastExec, NetworkShuffleExec, RouteTasksEvent, RouteTasksEventResponse,
    SessionStateBuilderExt, Worker, WorkerChannel, WorkerQueryContext, WorkerResolver,
    WorkerSessionBuilder, display_plan_ascii,
};
use futures::future::BoxFuture;
use tonic::codegen::http;

pub use crate::codec::CirroCodec;
pub use crate::deletion_vectors::DeletionVectorsExec;
use url::Url;

use crate::ZkCluster;
use crate::local::LocalPlanning;
use crate::locality::Located;
use crate::placement::TaskNode;
use crate::worker::SECRET_HEADER;

/// How long a new connection to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on every worker connection, and how long one may go
/// unanswered: a node cut off mid-query fails the query within about 12 s.
/// A busy node answers late: with 2 s, three nodes sharing two cores while
/// a 20 M-row join spilled dropped each other's connections (the slow
/// tier), and a failed query runs once more on fewer nodes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 on worker connections, both ways (the worker's server and the
/// stages' channels). A shuffle's batches are up to megabytes; with h2's
/// default 16 KB frames each is cut into tens to hundreds of frames, each
/// read, checked and copied on its own. `cirro admin rpc-bench` on 3 nodes
/// of one 2-core machine: 1–4 MB messages at 0.67–1.0 GB/s with 16 KB
/// frames, 1.7–2.0 GB/s with 1 MB ones. The windows (how much a peer may
/// send unread) are what a receiver may buffer outside the memory pool,
/// per stream and per connection: a little above hyper's (1–2 MB per
/// stream, 1–5 MB per connection), so that a frame or two of a stream can
/// be in flight.
pub(crate) const H2_MAX_FRAME: u32 = 1 << 20;
pub(crate) const H2_STREAM_WINDOW: u32 = 4 << 20;
pub(crate) const H2_CONNECTION_WINDOW: u32 = 16 << 20;
/// How long a probe of a node that failed a query may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a node that failed to answer is left out of new plans (unless it
/// registers again, restarted, before that).
const SUSPECT_FOR: Duration = Duration::from_secs(30);

/// Scan columns that only DML scans carry (`cirro_storage::table`): such
/// plans change tables and stay on the coordinator.
const ROW_ID_COLUMNS: [&str; 2] = ["__cirro_file", "__cirro_row"];

/// A node's cluster execution: the worker service it runs and the setup of
/// its sessions to coordinate queries (see the module docs).
#[derive(Debug)]
pub struct ClusterExecution {
    cluster: Arc<ZkCluster>,
    channels: ClusterChannels,
    suspects: Arc<Suspects>,
    worker: WorkerHandle,
    me: Url,
    locator: Arc<crate::locality::BlockLocator>,
    local: LocalPlanning,
}

/// The node's own worker (tasks routed to the coordinator run in process).
#[derive(Clone)]
struct WorkerHandle(Worker);

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Worker")
    }
}

impl ClusterExecution {
    /// The execution of the node `cluster.me()`, whose worker service
    /// answers requests carrying `secret`, reads through `runtime` and
    /// optimizes each task with `local` (as the coordinator does the part
    /// of its queries it runs itself).
    pub fn new(
        cluster: Arc<ZkCluster>,
        secret: &str,
        runtime: Arc<RuntimeEnv>,
        local: LocalPlanning,
    ) -> Result<Arc<Self>, cirro_common::CirroError> {
        let channels = ClusterChannels::new(secret)?;
        let worker = Worker::from_session_builder(WorkerSessions {
            channels: channels.clone(),
            local: local.clone(),
            node: cluster.me().id.clone(),
        })
        .with_runtime_env(runtime)
        .with_version(env!("CARGO_PKG_VERSION"));
        let me = worker_url(&cluster.me().worker)
            .map_err(|e| crate::worker::bad_secret(&e.to_string()))?;
        Ok(Arc::new(Self {
            cluster,
            channels,
            suspects: Arc::default(),
            worker: WorkerHandle(worker),
            me,
            locator: Arc::default(),
            local,
        }))
    }

    /// The worker service this node runs.
    pub fn worker(&self) -> Worker {
        self.worker.0.clone()
    }

    fn workers(&self) -> ClusterWorkers {
        ClusterWorkers {
            cluster: Arc::clone(&self.cluster),
            suspects: Arc::clone(&self.suspects),
            me: self.me.clone(),
        }
    }
}

/// The id of the node whose worker is at `url`, for people.
fn node_name(url: &Url, nodes: &[NodeInfo]) -> String {
    let address = format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port().unwrap_or_default()
    );
    nodes
        .iter()
        .find(|n| n.worker == address)
        .map(|n| n.id.clone())
        .unwrap_or(address)
}

fn worker_url(address: &str) -> DfResult<Url> {
    Url::parse(&format!("http://{address}"))
        .map_err(|e| DataFusionError::Configuration(format!("worker address {address}: {e}")))
}

impl Distribution for ClusterExecution {
    fn configure(&self, builder: SessionStateBuilder) -> SessionStateBuilder {
        let mut builder = builder
            .with_query_planner(Arc::new(Handoff))
            .with_distributed_planner()
            .with_distributed_worker_resolver(self.workers())
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_user_codec(CirroCodec)
            .with_distributed_local_worker_context(
                self.worker.0.to_local_worker_context(self.me.clone()),
            )
            .with_distributed_route_tasks_handler(Routing {
                workers: self.workers(),
            })
            // Scans of bucketed tables are split into tasks by bucket (the
            // default takes files round-robin, which breaks their
            // partitioning), HDFS scans by where their blocks are.
            .with_distributed_scale_up_leaf_node_handler(crate::placement::ScanPlacement {
                workers: self.workers(),
            });
        let distributed = builder
            .query_planner()
            .take()
            .expect("with_distributed_planner sets a query planner");
        let config = builder.config().get_or_insert_default();
        config.set_extension(Arc::new(PlacementLog::default()));
        // Shuffled batches go uncompressed by default (Trino's default
        // too): lz4 costs more CPU per byte than a link of 10 Gb/s or a
        // node's own loopback takes to carry it. TPC-H SF 10 on 3 nodes of
        // one 2-core machine: Q21 11.4 → 7.1 s, Q5 8.0 → 5.8 s. On slower
        // links, `SET distributed.compression = 'lz4'` (or 'zstd').
        if let Some(distributed) = config
            .options_mut()
            .extensions
            .get_mut::<datafusion_distributed::DistributedConfig>()
        {
            distributed.compression = "none".to_string();
        }
        // The settings of the local rules go with every task.
        self.local.propagate(config);
        // Tasks send their metrics back for EXPLAIN ANALYZE only (see
        // `for_analyze`): a worker keeps a task's shape only then.
        if let Err(e) = config.set_distributed_metrics_collection(false) {
            log::warn!("tasks' metrics: {e}");
        }
        builder.with_query_planner(Arc::new(ClusterPlanner {
            distributed,
            workers: self.workers(),
            locator: Arc::clone(&self.locator),
            local: self.local.clone(),
        }))
    }

    fn stage_tasks(&self) -> usize {
        self.workers()
            .get_urls()
            .map_or(1, |urls| urls.len().max(1))
    }

    fn is_distributed(&self, plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.exists(|p| Ok(p.is::<DistributedExec>()))
            .unwrap_or(false)
    }

    fn exchange(&self, plan: &dyn ExecutionPlan) -> Option<Exchange> {
        if plan.is::<NetworkShuffleExec>() {
            Some(Exchange::Shuffle)
        } else if plan.is::<NetworkBroadcastExec>() {
            Some(Exchange::Broadcast)
        } else {
            None
        }
    }

    fn is_node_failure(&self, error: &DataFusionError) -> bool {
        is_node_failure(&error.to_string())
    }

    fn forget_failed_nodes(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let nodes = self.cluster.nodes();
            let probes = nodes.iter().map(|node| async move {
                let answered = tokio::time::timeout(
                    PROBE_TIMEOUT,
                    tokio::net::TcpStream::connect(node.worker.as_str()),
                )
                .await;
                (node, matches!(answered, Ok(Ok(_))))
            });
            for (node, answered) in futures::future::join_all(probes).await {
                if !answered {
                    log::warn!(
                        "node {} ({}) does not answer: left out of new plans",
                        node.id,
                        node.worker
                    );
                    self.suspects.add(node);
                }
            }
        })
    }

    fn for_analyze(&self, config: &mut SessionConfig) -> DfResult<()> {
        config.set_distributed_metrics_collection(true)
    }

    fn take_task_placement(&self, config: &SessionConfig) -> Vec<String> {
        let Some(log) = config.get_extension::<PlacementLog>() else {
            return Vec::new();
        };
        let stages = std::mem::take(&mut *log.0.lock().unwrap_or_else(|e| e.into_inner()));
        let nodes = self.cluster.nodes();
        let mut lines = std::mem::take(&mut *log.1.lock().unwrap_or_else(|e| e.into_inner()));
        let (mut local, mut remote) = (0u64, 0u64);
        for stage in stages {
            let names: Vec<String> = stage.urls.iter().map(|u| node_name(u, &nodes)).collect();
            let mut line = format!(
                "stage ({}): {} task{} on {}",
                stage.head,
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            );
            if let Some(bytes) = &stage.bytes {
                // Per node, in the order the nodes first appear.
                let mut per_node: Vec<(&str, u64, u64)> = Vec::new();
                for (name, (l, r)) in names.iter().zip(bytes) {
                    match per_node.iter_mut().find(|(n, _, _)| n == name) {
                        Some(entry) => {
                            entry.1 += l;
                            entry.2 += r;
                        }
                        None => per_node.push((name, *l, *r)),
                    }
                    local += l;
                    remote += r;
                }
                let parts: Vec<String> = per_node
                    .iter()
                    .map(|(n, l, r)| format!("{n} {l} local, {r} remote"))
                    .collect();
                line.push_str(&format!("; HDFS bytes scanned: {}", parts.join("; ")));
            }
            lines.push(line);
        }
        if local + remote > 0 {
            lines.push(format!(
                "HDFS bytes scanned: {} local, {} remote ({:.1} % local)",
                local,
                remote,
                100.0 * local as f64 / (local + remote) as f64
            ));
        }
        lines
    }
}

/// Whether an error's text says a node failed or could not be reached.
fn is_node_failure(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "error connecting to distributed datafusion worker",
        "transport error",
        "tcp connect error",
        "connection refused",
        "connection reset",
        "broken pipe",
        "keep-alive timed out",
        "keepalive",
        "h2 protocol error",
        "status: unavailable",
        "code: unavailable",
        "error trying to connect",
        "stream closed because of a broken pipe",
        "operation was canceled",
        "no route to host",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Nodes that failed to answer, left out of plans for a while.
#[derive(Debug, Default)]
struct Suspects(Mutex<HashMap<String, (i64, Instant)>>);

impl Suspects {
    fn add(&self, node: &NodeInfo) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.worker.clone(), (node.started_ms, Instant::now()));
    }

    /// Whether `node` is left out: it failed, has not restarted since, and
    /// failed recently.
    fn excludes(&self, node: &NodeInfo) -> bool {
        let mut suspects = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match suspects.get(&node.worker) {
            Some((started, when))
                if *started == node.started_ms && when.elapsed() < SUSPECT_FOR =>
            {
                true
            }
            Some(_) => {
                suspects.remove(&node.worker);
                false
            }
            None => false,
        }
    }
}

/// The workers of the cluster, from ZooKeeper's member list (kept current by
/// a background watch; `WorkerResolver` is synchronous).
#[derive(Clone)]
pub(crate) struct ClusterWorkers {
    cluster: Arc<ZkCluster>,
    suspects: Arc<Suspects>,
    me: Url,
}

impl WorkerResolver for ClusterWorkers {
    fn get_urls(&self) -> DfResult<Vec<Url>> {
        let version = self.cluster.me().version;
        let mut urls: Vec<Url> = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| n.state == "running" && n.version == version && !self.suspects.excludes(n))
            .filter_map(|n| worker_url(&n.worker).ok())
            .collect();
        if urls.is_empty() {
            // ZooKeeper unreachable, or this node draining: run here.
            urls.push(self.me.clone());
        }
        urls.sort();
        urls.dedup();
        Ok(urls)
    }
}

/// A node that can take tasks, and how busy it is.
pub(crate) struct LiveNode {
    pub(crate) url: Url,
    /// Its address (matched to data nodes' addresses and host names).
    pub(crate) host: String,
    /// Running statements and tasks per core, plus the share of its memory
    /// in use (as it last reported to ZooKeeper, every second at most).
    pub(crate) load: f64,
    pub(crate) cores: f64,
}

impl ClusterWorkers {
    /// The nodes that can take tasks now (this node alone when none is
    /// listed), in the order of their worker URLs.
    pub(crate) fn live(&self) -> Vec<LiveNode> {
        let nodes = self.cluster.nodes();
        let urls = self.get_urls().unwrap_or_else(|_| vec![self.me.clone()]);
        urls.into_iter()
            .map(|url| {
                let host = url.host_str().unwrap_or_default().to_string();
                let info = nodes
                    .iter()
                    .find(|n| worker_url(&n.worker).ok().as_ref() == Some(&url));
                LiveNode {
                    url,
                    host,
                    load: info.map_or(0.0, node_load),
                    cores: info.map_or(1.0, |n| n.cores.max(1) as f64),
                }
            })
            .collect()
    }

    /// Where tasks would go now, for EXPLAIN.
    fn describe(&self) -> String {
        let nodes = self.cluster.nodes();
        let name = |url: &Url| node_name(url, &nodes);
        let all: Vec<String> = self
            .get_urls()
            .unwrap_or_default()
            .iter()
            .map(&name)
            .collect();
        format!(
            "the tasks of a stage go round {}; a stage of one task runs on {} (this node)",
            all.join(", "),
            name(&self.me)
        )
    }
}

/// A node's load as placement weighs it (see [`LiveNode::load`]).
fn node_load(node: &NodeInfo) -> f64 {
    (node.queries + node.tasks) as f64 / node.cores.max(1) as f64
        + node.memory_used as f64 / node.memory_bytes.max(1) as f64
}

/// Where the tasks of each stage went, per session (`EXPLAIN ANALYZE`),
/// and what the sampling runs of the statement's planning found.
#[derive(Debug, Default)]
struct PlacementLog(Mutex<Vec<StagePlacement>>, Mutex<Vec<String>>);

#[derive(Debug)]
struct StagePlacement {
    head: String,
    urls: Vec<Url>,
    /// Per task, the bytes of HDFS file ranges it scans that are stored on
    /// its node and elsewhere (None: the stage scans no located files).
    bytes: Option<Vec<(u64, u64)>>,
}

/// Task placement (see `placement.rs` for the scans' side), at most
/// ⌈tasks / nodes⌉ tasks of a stage on a node. A stage whose tasks scan files
/// with known blocks: each task to the node it was split for, or holding most
/// of its bytes. Other tasks (and those whose node is full) go to the
/// least-loaded node, counting the tasks of this stage already placed; ties
/// go round from a random node. A stage of one task scanning nothing runs on the
/// coordinator itself.
struct Routing {
    workers: ClusterWorkers,
}

impl datafusion_distributed::RouteTasksHandler for Routing {
    fn handle(&self, ev: RouteTasksEvent) -> Option<DfResult<RouteTasksEventResponse>> {
        let tasks = ev.task_count;
        let nodes = self.workers.live();
        let scans = stage_scans(ev.plan, tasks);
        // Per task, the bytes each node is preferred for.
        let wants: Vec<Vec<u64>> = scans
            .iter()
            .map(|files| {
                let mut want = vec![0u64; nodes.len()];
                for file in files {
                    let (range, size) = crate::locality::file_range(file);
                    if let Some(TaskNode(url)) = file.extension::<TaskNode>() {
                        if let Some(n) = nodes.iter().position(|n| &n.url == url) {
                            want[n] += size;
                        }
                    } else if let Some(located) = file.extension::<Located>() {
                        for (n, node) in nodes.iter().enumerate() {
                            want[n] += located.0.bytes_on(&node.host, range);
                        }
                    }
                }
                want
            })
            .collect();
        let located = wants.iter().any(|w| w.iter().any(|b| *b > 0));
        let urls = if tasks == 1 && !located {
            vec![self.workers.me.clone()]
        } else {
            let chosen = route(&wants, &nodes, tasks);
            chosen.into_iter().map(|n| nodes[n].url.clone()).collect()
        };
        if let Some(log) = ev.task_ctx.session_config().get_extension::<PlacementLog>() {
            let bytes = scans
                .iter()
                .any(|files| files.iter().any(|f| f.extension::<Located>().is_some()))
                .then(|| {
                    scans
                        .iter()
                        .zip(&urls)
                        .map(|(files, url)| local_and_remote(files, url))
                        .collect()
                });
            log.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(StagePlacement {
                    head: ev.plan.name().to_string(),
                    urls: urls.clone(),
                    bytes,
                });
        }
        Some(Ok(RouteTasksEventResponse::new(urls)))
    }
}

/// For each task, the node it goes to (indices into `nodes`), from the
/// bytes each node is preferred for (see [`Routing`]).
fn route(wants: &[Vec<u64>], nodes: &[LiveNode], tasks: usize) -> Vec<usize> {
    let capacity = tasks.div_ceil(nodes.len().max(1));
    let mut given = vec![0usize; nodes.len()];
    let mut chosen = vec![usize::MAX; tasks];
    // Tasks with the most bytes at stake choose first.
    let mut order: Vec<usize> = (0..tasks).collect();
    order.sort_by_key(|t| {
        std::cmp::Reverse(
            wants
                .get(*t)
                .map_or(0, |w| w.iter().copied().max().unwrap_or(0)),
        )
    });
    let start = rand::random_range(0..nodes.len().max(1));
    for t in order {
        let want = wants.get(t);
        let preferred = want.and_then(|want| {
            (0..nodes.len())
                .filter(|n| want[*n] > 0 && given[*n] < capacity)
                .max_by_key(|n| (want[*n], std::cmp::Reverse(*n)))
        });
        // Within the share too: datafusion-distributed runs two tasks of a
        // stage on one worker wrongly ("stream … already consumed"), and by
        // default a stage has at most as many tasks as there are workers.
        let n = preferred.unwrap_or_else(|| {
            (0..nodes.len())
                .map(|i| (start + i) % nodes.len())
                .filter(|n| given[*n] < capacity)
                .min_by(|a, b| {
                    let busy = |n: usize| given[n] as f64 / nodes[n].cores + nodes[n].load;
                    busy(*a).total_cmp(&busy(*b))
                })
                .unwrap_or(0)
        });
        given[n] += 1;
        chosen[t] = n;
    }
    chosen
}

/// The files each task of the stage headed by `head` scans (the variants
/// of its split scans; scans not split are read whole by every task).
fn stage_scans(head: &Arc<dyn ExecutionPlan>, tasks: usize) -> Vec<Vec<PartitionedFile>> {
    let mut per_task: Vec<Vec<PartitionedFile>> = vec![Vec::new(); tasks];
    let files_of = |plan: &Arc<dyn ExecutionPlan>| {
        let mut files = Vec::new();
        let _ = plan.apply(|node| {
            if let Some(scan) = node
                .downcast_ref::<DataSourceExec>()
                .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
            {
                files.extend(scan.file_groups.iter().flat_map(|g| g.iter()).cloned());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        files
    };
    let _ = head.apply(|node| {
        if node.as_network_boundary().is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        if let Some(leaf) = node.downcast_ref::<DistributedLeafExec>() {
            for (t, variant) in leaf.variants().iter().enumerate().take(tasks) {
                per_task[t].extend(files_of(variant));
            }
            return Ok(TreeNodeRecursion::Jump);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    per_task
}

/// The bytes of `files`' ranges stored on `url`'s host, and elsewhere.
fn local_and_remote(files: &[PartitionedFile], url: &Url) -> (u64, u64) {
    let host = url.host_str().unwrap_or_default();
    files
        .iter()
        .filter_map(|file| {
            let located = file.extension::<Located>()?;
            let (range, size) = crate::locality::file_range(file);
            let local = located.0.bytes_on(host, range).min(size);
            Some((local, size - local))
        })
        .fold((0, 0), |(l, r), (a, b)| (l + a, r + b))
}

/// gRPC channels to the workers: one per worker, each request carrying the
/// cluster secret; connect and keep-alive timeouts bound how long a dead or
/// cut-off node can hold a query.
#[derive(Clone)]
pub struct ClusterChannels {
    secret: http::HeaderValue,
    channels: Arc<Mutex<HashMap<Url, BoxCloneSyncChannel>>>,
}

impl std::fmt::Debug for ClusterChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterChannels")
    }
}

impl ClusterChannels {
    pub(crate) fn new(secret: &str) -> Result<Self, cirro_common::CirroError> {
        let secret = http::HeaderValue::from_str(secret)
            .map_err(|_| crate::worker::bad_secret("it must be printable ASCII"))?;
        Ok(Self {
            secret,
            channels: Arc::default(),
        })
    }

    pub(crate) fn channel(&self, url: &Url) -> DfResult<BoxCloneSyncChannel> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(url) {
            return Ok(channel.clone());
        }
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| DataFusionError::Configuration(format!("worker {url}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .max_frame_size(H2_MAX_FRAME)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .tcp_nodelay(true);
        let secret = self.secret.clone();
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut request: http::Request<tonic::body::Body>| {
                request.headers_mut().insert(SECRET_HEADER, secret.clone());
                request
            })
            .service(endpoint.connect_lazy());
        let channel = BoxCloneSyncChannel::new(service);
        channels.insert(url.clone(), channel.clone());
        Ok(channel)
    }
}

#[async_trait]
impl ChannelResolver for ClusterChannels {
    async fn get_worker_client_for_url(&self, url: &Url) -> DfResult<Box<dyn WorkerChannel>> {
        Ok(create_worker_client(self.channel(url)?))
    }
}

/// The sessions the worker service runs tasks in: Cirro's functions and
/// codec, and the same channels (a stage reads the stages below it from
/// other workers).
#[derive(Clone)]
struct WorkerSessions {
    channels: ClusterChannels,
    local: LocalPlanning,
    /// This node's id (memory refusals name it).
    node: String,
}

#[async_trait]
impl WorkerSessionBuilder for WorkerSessions {
    async fn build_session_state(&self, mut ctx: WorkerQueryContext) -> DfResult<SessionState> {
        let runtime = ctx.builder.runtime_env().clone();
        let mut builder = ctx
            .builder
            .with_distributed_user_codec(CirroCodec)
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_worker_plan_rewrite_handler(self.local.worker_rules(runtime));
        self.local
            .receive(builder.config().get_or_insert_default(), &ctx.headers)?;
        // The task counts in its query's pool on this node, within the
        // node's budget, beside the query's other tasks here (the
        // coordinator's own ones included). Tasks are not queued for
        // admission: a task waiting on this node while its query holds
        // another node's slot, and the other way round, would wait for
        // each other forever; the budget refuses (spill or 53200) instead.
        builder = self.local.task_session(builder, &self.node);
        if let Some(functions) = builder.scalar_functions() {
            functions.extend(cirro_exec::functions::portable_udfs());
        }
        if let Some(functions) = builder.aggregate_functions() {
            cirro_exec::functions::replace_udafs(functions);
        }
        Ok(builder.build())
    }
}

/// The functions a worker knows, by name, with their implementation's type:
/// a plan whose functions are all among these runs on any node.
static WORKER_FUNCTIONS: LazyLock<HashMap<String, TypeId>> = LazyLock::new(|| {
    let mut builder = SessionStateBuilder::new().with_default_features();
    if let Some(functions) = builder.scalar_functions() {
        functions.extend(cirro_exec::functions::portable_udfs());
    }
    let state = builder.build();
    state
        .scalar_functions()
        .values()
        .map(|f| {
            let inner: &dyn Any = f.inner().as_ref();
            (f.name().to_string(), inner.type_id())
        })
        .collect()
});

/// Whether `plan` can run on other nodes: it reads only files (Cirro's
/// tables, `read_parquet`) and computes only with functions every worker
/// has. Writes, DML scans (row ids), system tables, `VALUES` and
/// session-bound functions (`current_user`, `pg_backend_pid`) stay home.
fn distributable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut ok = true;
    let _ = plan.apply(|node| {
        let fine = if node.is::<DataSinkExec>() {
            false
        } else if node.children().is_empty() {
            leaf_travels(node)
        } else {
            true
        } && expressions_travel(node.as_ref());
        if !fine {
            ok = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    ok
}

fn leaf_travels(node: &Arc<dyn ExecutionPlan>) -> bool {
    if node.is::<EmptyExec>() || node.is::<PlaceholderRowExec>() {
        return true;
    }
    let Some(source) = node.downcast_ref::<DataSourceExec>() else {
        return false;
    };
    source
        .data_source()
        .downcast_ref::<FileScanConfig>()
        .is_some()
        && !node
            .schema()
            .fields()
            .iter()
            .any(|f| ROW_ID_COLUMNS.contains(&f.name().as_str()))
}

fn expressions_travel(node: &dyn ExecutionPlan) -> bool {
    let mut ok = true;
    let _ = node.apply_expressions(&mut |expr: &Arc<dyn PhysicalExpr>| {
        expr.apply(|e| {
            if let Some(function) = e.downcast_ref::<ScalarFunctionExpr>() {
                let inner: &dyn Any = function.fun().inner().as_ref();
                if WORKER_FUNCTIONS.get(function.name()) != Some(&inner.type_id()) {
                    ok = false;
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(if ok {
            TreeNodeRecursion::Continue
        } else {
            TreeNodeRecursion::Stop
        })
    });
    ok
}

tokio::task_local! {
    /// The plan [`ClusterPlanner`] made, for [`Handoff`] to give to the
    /// distributed planner (which would otherwise plan the query again).
    static PLANNED: RefCell<Option<Arc<dyn ExecutionPlan>>>;
}

/// The planner `datafusion-distributed`'s planner starts from: the plan
/// [`ClusterPlanner`] already made.
#[derive(Debug)]
struct Handoff;

#[async_trait]
impl QueryPlanner for Handoff {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Ok(Some(plan)) = PLANNED.try_with(|planned| planned.borrow_mut().take()) {
            return Ok(plan);
        }
        DefaultPhysicalPlanner::default()
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// A cluster session's planner: plan as one node does; distribute what can
/// run elsewhere (see [`distributable`]).
struct ClusterPlanner {
    distributed: Arc<dyn QueryPlanner + Send + Sync>,
    workers: ClusterWorkers,
    locator: Arc<crate::locality::BlockLocator>,
    local: LocalPlanning,
}

impl std::fmt::Debug for ClusterPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterPlanner")
    }
}

impl ClusterPlanner {
    /// `plan` (made for `logical_plan`) cut into stages, if it can be.
    async fn distribute(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let inner = match plan.downcast_ref::<datafusion::physical_plan::analyze::AnalyzeExec>() {
            Some(analyze) => analyze.input(),
            None => &plan,
        };
        // One live node (this one): nothing would cross a network, so the
        // plan runs as on a node alone, without the sampling run, the
        // exchange choices and the stages that only a shuffle pays for.
        let alone = self.workers.get_urls().map_or(true, |urls| urls.len() <= 1);
        // Rows a table is written from, each partition in its files' order:
        // read here, where they are written, they keep that order
        // (`cirro_exec::operators::concat::planned_in_order`).
        let in_order = cirro_exec::operators::concat::order_wanted()
            && cirro_exec::operators::concat::keeps_partition_order(inner);
        if alone || in_order || !distributable(inner) {
            return self.local.optimize_head(plan, session.config_options());
        }
        let whole = Arc::clone(&plan);
        // Group keys without statistics: a sampling run estimates them.
        let plan = sample_group_keys(plan, session).await;
        // Choices that depend on what crosses the network (how each grouped
        // aggregation meets its shuffle), before the stages are cut.
        let plan = self.local.before_cut(plan, session.config_options());
        // Where the blocks of HDFS scans are, for task placement.
        let plan = self.locator.locate(plan).await;
        let plan = DeletionVectorsExec::wrap_scans(plan)?;
        let plan = PLANNED
            .scope(
                RefCell::new(Some(plan)),
                self.distributed.create_physical_plan(logical_plan, session),
            )
            .await?;
        // A join's dynamic filter is read only in the stage that fills it.
        let plan = match crate::dynamic_filters::keep_within_stages(plan) {
            Ok(plan) => plan,
            Err(e) => {
                log::warn!("the query runs on this node alone: {e}");
                return self.local.optimize_head(whole, session.config_options());
            }
        };
        // The part above the stages runs here: this node's rules.
        let plan = self.local.optimize_head(plan, session.config_options())?;
        // EXPLAIN ANALYZE must not wait forever for tasks that never ran.
        crate::analyze::bound_metrics_wait(plan)
    }
}

/// `plan` with the distinct counts of the group keys that no statistics
/// estimate, from a sampling run (`cirro_exec::rules::sample_group_keys`),
/// each run's cost noted for EXPLAIN ANALYZE; `plan` as it is where the
/// run fails (the choice it informs is then made without it).
async fn sample_group_keys(
    plan: Arc<dyn ExecutionPlan>,
    session: &dyn Session,
) -> Arc<dyn ExecutionPlan> {
    let sampled = cirro_exec::rules::sample_group_keys(
        Arc::clone(&plan),
        session.config_options(),
        session.task_ctx(),
    )
    .await;
    match sampled {
        Ok((sampled, samples)) => {
            if let Some(log) = session.config().get_extension::<PlacementLog>() {
                log.1
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(samples.iter().map(|s| s.to_string()));
            }
            sampled
        }
        Err(e) => {
            log::warn!("group keys not sampled: {e}");
            plan
        }
    }
}

#[async_trait]
impl QueryPlanner for ClusterPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let planner = DefaultPhysicalPlanner::default();
        let plan = planner.create_physical_plan(logical_plan, session).await?;
        if let LogicalPlan::Explain(explain) = logical_plan {
            // DataFusion plans EXPLAIN's input itself; show the stages.
            let Some(exec) = plan.downcast_ref::<ExplainExec>() else {
                return Ok(plan);
            };
            let input = planner.create_physical_plan(&explain.plan, session).await?;
            let distributed = self.distribute(input, &explain.plan, session).await?;
            // The plan that runs: its stages, or, where it stays on this
            // node (one live node, or a plan that cannot travel), the plan
            // with this node's rules applied (DataFusion's own EXPLAIN
            // shows it before them).
            let text = if distributed.is::<DistributedExec>() {
                format!(
                    "{}nodes: {}",
                    display_plan_ascii(distributed.as_ref(), false),
                    self.workers.describe()
                )
            } else {
                datafusion::physical_plan::displayable(distributed.as_ref())
                    .indent(exec.verbose())
                    .to_string()
            };
            let plans = exec
                .stringified_plans()
                .iter()
                .map(|p| match p.plan_type {
                    PlanType::FinalPhysicalPlan => {
                        StringifiedPlan::new(PlanType::FinalPhysicalPlan, text.clone())
                    }
                    _ => p.clone(),
                })
                .collect();
            return Ok(Arc::new(ExplainExec::new(
                exec.schema(),
                plans,
                exec.verbose(),
            )));
        }
        self.distribute(plan, logical_plan, session).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_failures_are_told_from_query_errors() {
        assert!(is_node_failure(
            "Error connecting to Distributed DataFusion worker on 'http://10.77.0.12:50052/': tcp connect error"
        ));
        assert!(is_node_failure(
            "status: Unavailable, message: \"h2 protocol error\""
        ));
        assert!(!is_node_failure("Divide by zero error"));
        assert!(!is_node_failure("bigint out of range"));
    }

    fn live(host: &str, load: f64) -> LiveNode {
        LiveNode {
            url: Url::parse(&format!("http://{host}:7000")).unwrap(),
            host: host.to_string(),
            load,
            cores: 1.0,
        }
    }

    #[test]
    fn tasks_go_where_their_bytes_are_within_a_fair_share_then_by_load() {
        let nodes = [live("a", 0.0), live("b", 5.0), live("c", 0.0)];
        // Tasks 0 and 1 want a; 1 wants it less, and a takes at most 2 of 4;
        // task 2 wants b; task 3 wants nothing: the idle c, not the busy b.
        let wants = vec![
            vec![900, 0, 0],
            vec![500, 0, 10],
            vec![0, 700, 0],
            vec![0, 0, 0],
        ];
        assert_eq!(route(&wants, &nodes, 4), [0, 0, 1, 2]);
        // Three tasks wanting a, one each at most: the weaker go elsewhere,
        // where they have bytes, else to the one node left, busy or not.
        let wants = vec![vec![900, 0, 0], vec![800, 0, 5], vec![700, 0, 0]];
        assert_eq!(route(&wants, &nodes, 3), [0, 2, 1]);
        // Nothing located: the idle nodes first.
        let chosen = route(&[vec![0, 0, 0], vec![0, 0, 0]], &nodes, 2);
        let mut sorted = chosen.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 2], "{chosen:?}");
    }
}
