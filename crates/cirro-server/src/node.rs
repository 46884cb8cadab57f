//! This node as a member of a cluster: joining (its addresses in
//! ZooKeeper, the worker service other nodes' tasks run in), keeping its
//! load current in its registration, and leaving in order (drain).

use std::sync::Arc;
use std::time::Duration;

use cirro_common::Result;
use cirro_storage::StorageRoot;
use datafusion::execution::runtime_env::RuntimeEnv;

use crate::{ClusterOptions, Shared, console, listen};

/// A node's membership: the cluster, its secret, this node's distributed
/// execution and the tasks other nodes' queries run here.
pub(crate) struct Member {
    pub(crate) cluster: Arc<cirro_cluster::ZkCluster>,
    pub(crate) secret: String,
    pub(crate) distribution: Arc<dyn cirro_exec::distribution::Distribution>,
    pub(crate) worker_tasks: cirro_cluster::worker::InFlight,
}

/// The addresses the node's front ends got.
pub(crate) struct Addresses {
    pub(crate) listen: String,
    pub(crate) pg: std::net::SocketAddr,
    pub(crate) flight: std::net::SocketAddr,
    pub(crate) http: Option<std::net::SocketAddr>,
}

impl Member {
    /// Join the cluster: start the worker service (which runs other
    /// nodes' tasks with this node's engine: `node`'s local rules), register
    /// in ZooKeeper, take the cluster's secret.
    pub(crate) async fn join(
        options: &ClusterOptions,
        root: &StorageRoot,
        at: &Addresses,
        runtime: &Arc<RuntimeEnv>,
        node: &cirro_engine::Node,
    ) -> Result<Member> {
        let (worker_listener, worker_local) =
            listen(&at.listen, options.worker_port, " (worker)").await?;
        let cluster = join_cluster(
            options,
            root.url().as_str(),
            &at.listen,
            at.pg,
            at.flight,
            worker_local,
            at.http,
        )
        .await?;
        let secret = cluster.cluster_secret(options.secret.clone()).await?;
        // Workers read the data location through the node's store.
        if root.url().scheme() != "file" {
            runtime.register_object_store(root.url(), Arc::clone(root.store()));
        }
        let execution = cirro_cluster::distributed::ClusterExecution::new(
            Arc::clone(&cluster),
            &secret,
            Arc::clone(runtime),
            cirro_cluster::local::LocalPlanning::new::<cirro_engine::EngineOptions>(
                cirro_engine::local_rules(node),
                cirro_engine::cut_rules(),
            )
            .with_resources(Arc::clone(node.resources())),
        )?;
        let worker_tasks =
            cirro_cluster::worker::spawn_worker(worker_listener, &secret, execution.worker())?;
        Ok(Member {
            cluster,
            secret,
            distribution: execution,
            worker_tasks,
        })
    }

    /// Show the cluster's nodes in `cirro.queries` and the console, and
    /// keep this node's load in its registration current.
    pub(crate) fn start_reporting(
        &self,
        shared: &Arc<Shared>,
        tls_cert: Option<&str>,
        monitor: &Arc<console::monitor::Monitor>,
    ) -> Result<()> {
        shared
            .activity
            .set_cluster(Arc::new(console::peers::ClusterPeers {
                cluster: Arc::clone(&self.cluster),
                peers: console::peers::Peers::new(tls_cert, Some(self.secret.clone()))?,
            }));
        tokio::spawn(report_load(
            Arc::clone(&self.cluster),
            Arc::clone(shared),
            self.worker_tasks.clone(),
            Arc::clone(monitor),
        ));
        Ok(())
    }
}

/// The address this node is reached at: `--advertise`, else the listen
/// address unless it is a wildcard, else the host name.
fn advertised_host(options: &ClusterOptions, listen: &str) -> String {
    if let Some(host) = &options.advertise {
        return host.clone();
    }
    if listen != "0.0.0.0" && listen != "::" && !listen.is_empty() {
        return listen.to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// Join the cluster as the node serving `pg` and `flight`.
async fn join_cluster(
    options: &ClusterOptions,
    data: &str,
    listen: &str,
    pg: std::net::SocketAddr,
    flight: std::net::SocketAddr,
    worker: std::net::SocketAddr,
    http: Option<std::net::SocketAddr>,
) -> Result<Arc<cirro_cluster::ZkCluster>> {
    let host = advertised_host(options, listen);
    let pg = format!("{host}:{}", pg.port());
    let (cores, memory_bytes) = cirro_cluster::local_capacity();
    let me = cirro_catalog::NodeInfo {
        id: options.node_id.clone().unwrap_or_else(|| pg.clone()),
        // CIRRO_TEST_CLUSTER_VERSION: the tests' way to start a node that
        // claims another release (the refusal of mixed versions).
        version: std::env::var("CIRRO_TEST_CLUSTER_VERSION")
            .unwrap_or_else(|_| env!("CARGO_PKG_VERSION").to_string()),
        flight: format!("{host}:{}", flight.port()),
        pg,
        worker: format!("{host}:{}", worker.port()),
        http: http.map_or_else(String::new, |a| format!("{host}:{}", a.port())),
        cores,
        memory_bytes,
        started_ms: cirro_catalog::state::now_ms(),
        state: "running".to_string(),
        ..cirro_catalog::NodeInfo::default()
    };
    cirro_cluster::ZkCluster::join(&options.url, data, me).await
}

/// Keep this node's load in its registration current (`cirro.nodes`:
/// running statements, tasks of distributed queries, memory in use; task
/// placement weighs it): checked every second, written to ZooKeeper when a
/// count changed or the memory in use moved by 1/4096 of the node's memory
/// (at most one small write a second).
async fn report_load(
    cluster: Arc<cirro_cluster::ZkCluster>,
    shared: Arc<Shared>,
    tasks: cirro_cluster::worker::InFlight,
    monitor: Arc<console::monitor::Monitor>,
) {
    let step = cluster.me().memory_bytes / 4096;
    let mut reported = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let memory = shared
            .engine
            .runtime
            .as_ref()
            .map_or(0, |r| r.memory_pool.reserved() as u64);
        let sample = monitor.latest();
        let now = LoadReport {
            queries: shared.activity.running() as u32,
            tasks: tasks.count() as u32,
            memory: memory.max(sample.memory_used),
            cpu_permille: sample.cpu_permille,
            disk: (sample.disk_bytes, sample.disk_free),
            cache_bytes: sample.cache_bytes,
        };
        if reported.is_some_and(|r: LoadReport| !r.moved(&now, step)) {
            continue;
        }
        let written = cluster
            .update_me(|me| {
                me.queries = now.queries;
                me.tasks = now.tasks;
                me.memory_used = now.memory;
                me.cpu_permille = now.cpu_permille;
                (me.disk_bytes, me.disk_free) = now.disk;
                me.cache_bytes = now.cache_bytes;
            })
            .await;
        if written.is_ok() {
            reported = Some(now);
        }
    }
}

/// What a node last wrote of its load.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LoadReport {
    queries: u32,
    tasks: u32,
    memory: u64,
    cpu_permille: u32,
    disk: (u64, u64),
    cache_bytes: u64,
}

impl LoadReport {
    /// Whether `now` is worth a write: a count changed, memory or cache
    /// moved by more than `step`, CPU by 5 % of the machine, free disk by
    /// 1 % of the disk.
    fn moved(&self, now: &LoadReport, step: u64) -> bool {
        self.queries != now.queries
            || self.tasks != now.tasks
            || self.memory.abs_diff(now.memory) > step
            || self.cache_bytes.abs_diff(now.cache_bytes) > step
            || self.cpu_permille.abs_diff(now.cpu_permille) >= 50
            || self.disk.1.abs_diff(now.disk.1) > now.disk.0 / 100
    }
}

/// How long a draining node must have had nothing to do before it leaves.
/// A coordinator routes a query's tasks with its view of the members, which
/// a ZooKeeper watch and a re-read keep current; on a loaded machine that
/// view lagged "draining" by more than a second once (the tasks came after
/// the node had gone, and the query ran again), so three.
const DRAIN_QUIET: Duration = Duration::from_secs(3);

/// Leave the cluster in order: say "draining" (so that no new work is sent
/// here: coordinators leave draining nodes out of new plans), wait for the
/// running statements and for the tasks other nodes' queries run here (at
/// most `timeout`), then delete the node's registration. Idle means idle
/// for [`DRAIN_QUIET`] on end: a coordinator that planned a query with
/// this node just before it saw "draining" sends its tasks in that time
/// (they are then waited for; a task counts until its query ends).
pub(crate) async fn drain(
    cluster: &cirro_cluster::ZkCluster,
    shared: &Shared,
    worker_tasks: &cirro_cluster::worker::InFlight,
    timeout: Duration,
) {
    eprintln!("cirro: draining: no new connections; waiting for running statements and tasks");
    if let Err(e) = cluster.update_me(|me| me.state = "draining".into()).await {
        log::warn!("{e}");
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut idle_since = None;
    while tokio::time::Instant::now() < deadline {
        if shared.activity.running() == 0 && worker_tasks.count() == 0 {
            let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= DRAIN_QUIET {
                break;
            }
        } else {
            idle_since = None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.leave().await;
    eprintln!("cirro: left the cluster");
}
