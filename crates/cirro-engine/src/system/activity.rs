//! The server's registry of backends: one entry per client session, with
//! what it runs (PostgreSQL's states), shown by `pg_stat_activity` and
//! signalled by `pg_cancel_backend` / `pg_terminate_backend`. The resources
//! and GPU work extend this one list.
//!
//! Backend pids are unique within a cluster: the node id sits in the high
//! bits (`node << 22 | n`), so a pid names one session on one node.
//!
//! Beside the backends it keeps the statements (`cirro.queries`): each
//! statement a backend runs is a [`QueryRecord`], `queued` while it waits for
//! admission, `running`, then `finished`, `failed` or `cancelled`; the last
//! [`FINISHED_KEPT`] ended ones stay, with their figures and plan. Query ids
//! carry the node like pids (`node << 40 | n`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cirro_common::{CirroError, Result, SqlState};
use cirro_exec::resources::QueryMemory;
use datafusion::physical_plan::ExecutionPlan;

// Bits of a pid below the node number; the highest node number a pid can
// carry (one definition for the cluster's numbering and the pids).
use cirro_common::limits::{NODE_NUMBER_MAX, PID_NODE_SHIFT_BITS as PID_NODE_SHIFT};

/// What a backend is doing (`pg_stat_activity.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendState {
    Idle,
    Active,
    IdleInTransaction,
    IdleInTransactionAborted,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Active => "active",
            Self::IdleInTransaction => "idle in transaction",
            Self::IdleInTransactionAborted => "idle in transaction (aborted)",
        }
    }
}

/// How a front end stops one of its sessions.
pub trait BackendSignal: Send + Sync {
    /// Cancel the running statement (57014), as a CancelRequest does.
    fn cancel(&self);
    /// Close the session's connection (and cancel what it runs).
    fn terminate(&self);
}

/// One row of `pg_stat_activity`.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    pub pid: i32,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub client_addr: Option<String>,
    /// Microseconds since the epoch.
    pub backend_start: i64,
    pub state: BackendState,
    /// The last statement (the running one while active).
    pub query: String,
    pub query_start: Option<i64>,
    pub state_change: i64,
    pub backend_type: &'static str,
    /// What an active backend waits for (`AdmissionQueue` while its
    /// statement is queued).
    pub wait_event: Option<&'static str>,
}

struct Entry {
    info: BackendInfo,
    signal: Weak<dyn BackendSignal>,
}

/// The backends of this node.
pub struct Activity {
    node: u32,
    next: AtomicU32,
    backends: Mutex<BTreeMap<i32, Entry>>,
    next_query: AtomicU64,
    queries: Mutex<Queries>,
    /// The other nodes of the cluster (set by a clustered server).
    cluster: std::sync::OnceLock<Arc<dyn ClusterActivity>>,
}

/// The other nodes' registries, reached over the network: what makes
/// `cirro.queries`, `CANCEL QUERY` and `pg_cancel_backend` cluster-wide.
#[async_trait::async_trait]
pub trait ClusterActivity: Send + Sync {
    /// The statements of every other live node (an unreachable node is left
    /// out, with a warning: a dead node runs nothing); the ended ones with
    /// their plans when `plans`.
    async fn queries(&self, plans: bool) -> Vec<QueryView>;
    /// Cancel statement `id` on node `node` for `user` (the node checks the
    /// user's rights as its own `CANCEL QUERY` does). Ok(false): none.
    async fn cancel_query(&self, node: u32, id: i64, user: Option<&str>) -> Result<bool>;
    /// The hot-data and disk tiers of every other live node, by data file
    /// (an unreachable node is left out, with a warning).
    async fn cache(&self) -> Vec<crate::system::CacheRow>;
    /// Signal backend `pid` on node `node` for `user`. Ok(false): none.
    async fn signal(
        &self,
        node: u32,
        pid: i32,
        user: Option<&str>,
        terminate: bool,
    ) -> Result<bool>;
}

/// The node a query id names.
pub fn query_node(id: i64) -> u32 {
    (id >> QUERY_NODE_SHIFT) as u32
}

/// The node a backend pid names.
pub fn pid_node(pid: i32) -> u32 {
    (pid as u32) >> PID_NODE_SHIFT
}

/// Ended statements kept for `cirro.queries` and the console.
pub const FINISHED_KEPT: usize = 1000;

/// Bits of a query id below the node id.
const QUERY_NODE_SHIFT: u32 = 40;

#[derive(Default)]
struct Queries {
    live: BTreeMap<i64, Arc<QueryRecord>>,
    finished: VecDeque<QueryView>,
    /// Statements that ended since the node started.
    ended_total: u64,
}

/// Where a statement is (`cirro.queries.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryState {
    Queued,
    Running,
    Finished,
    Failed,
    Cancelled,
}

impl QueryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn is_live(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }
}

/// One statement of a backend, while it runs.
pub struct QueryRecord {
    pub id: i64,
    pub pid: i32,
    pub user: String,
    /// The database the session names tables in.
    pub database: String,
    /// Its text, passwords redacted.
    pub query: String,
    /// Microseconds since the epoch.
    pub submitted: i64,
    activity: Weak<Activity>,
    progress: Mutex<Progress>,
    /// Set by the first [`QueryRecord::end`].
    ended: AtomicBool,
}

struct Progress {
    state: QueryState,
    started: Option<i64>,
    memory: Option<Arc<QueryMemory>>,
    plan: Option<Arc<dyn ExecutionPlan>>,
    rows: u64,
    retries: u32,
}

/// What `cirro.queries` shows of a statement.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct QueryView {
    pub id: i64,
    pub pid: i32,
    pub node: u32,
    pub user: String,
    /// The database the session names tables in.
    #[serde(default)]
    pub database: String,
    pub query: String,
    pub state: QueryState,
    pub submitted: i64,
    pub started: Option<i64>,
    pub ended: Option<i64>,
    /// Bytes its pool holds now (0 once ended).
    pub memory: u64,
    pub peak_memory: u64,
    pub spilled_bytes: u64,
    /// Rows it returned or changed so far.
    pub rows: u64,
    /// The share of its work done, where known (0 to 1): 0 while queued,
    /// estimated from its scans while it runs, 1 once finished.
    pub progress: Option<f64>,
    pub error: Option<String>,
    /// Its plan with each operator's figures (kept once it ended).
    pub plan: Option<String>,
    /// Its GPU operators: `waiting` for the device, `running`, `used` once
    /// ended; None without any (see docs/gpu.md).
    #[serde(default)]
    pub gpu: Option<String>,
    /// Times it was run again on the remaining nodes after a node failed
    /// during it (a cluster's read-only queries).
    #[serde(default)]
    pub retries: u32,
}

impl QueryView {
    /// Microseconds from submission to its end (or to now).
    pub fn elapsed_micros(&self) -> i64 {
        self.ended.unwrap_or_else(now_micros) - self.submitted
    }
}

/// Sum of one metric over every operator of `plan`.
fn plan_metric(plan: &dyn ExecutionPlan, name: &str) -> u64 {
    let own = plan
        .metrics()
        .and_then(|m| m.sum_by_name(name))
        .map(|v| v.as_usize() as u64)
        .unwrap_or(0);
    own + plan
        .children()
        .iter()
        .map(|c| plan_metric(c.as_ref(), name))
        .sum::<u64>()
}

/// Where a plan's GPU operators are: `waiting` while one waits for its
/// turn on the device (its `gpu_waiting` gauge), `running` otherwise; None
/// without any (always, in a build without the `gpu` feature).
fn gpu_state(plan: &dyn ExecutionPlan, state: QueryState) -> Option<String> {
    #[cfg(feature = "gpu")]
    fn has_gpu(plan: &dyn ExecutionPlan) -> bool {
        cirro_gpu::is_gpu_operator(plan) || plan.children().iter().any(|c| has_gpu(c.as_ref()))
    }
    #[cfg(not(feature = "gpu"))]
    fn has_gpu(_: &dyn ExecutionPlan) -> bool {
        false
    }
    if !has_gpu(plan) {
        return None;
    }
    Some(
        if !state.is_live() {
            "used"
        } else if plan_metric(plan, "gpu_waiting") > 0 {
            "waiting"
        } else {
            "running"
        }
        .to_string(),
    )
}

/// How far a running plan has got, estimated from its leaves (the scans):
/// rows they produced over the rows their statistics say they hold. None
/// when no leaf knows its size. At most 0.99: what comes after the scans
/// (the last merge, the client reading) is not counted.
fn plan_progress(plan: &dyn ExecutionPlan) -> Option<f64> {
    fn leaves(plan: &dyn ExecutionPlan, done: &mut u64, total: &mut u64) {
        if plan.children().is_empty() {
            use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
            let rows = StatisticsContext::new()
                .compute(plan, &StatisticsArgs::new())
                .ok()
                .and_then(|s| s.num_rows.get_value().copied());
            if let Some(rows) = rows {
                *total += rows as u64;
                *done += plan
                    .metrics()
                    .and_then(|m| m.output_rows())
                    .map_or(0, |r| r as u64)
                    .min(rows as u64);
            }
        }
        for child in plan.children() {
            leaves(child.as_ref(), done, total);
        }
    }
    let (mut done, mut total) = (0, 0);
    leaves(plan, &mut done, &mut total);
    (total > 0).then(|| (done as f64 / total as f64).min(0.99))
}

impl QueryRecord {
    fn view(&self, node: u32) -> QueryView {
        let progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let (memory, peak) = progress
            .memory
            .as_ref()
            .map(|m| (m.used() as u64, m.peak() as u64))
            .unwrap_or((0, 0));
        let plan = progress.plan.as_deref();
        QueryView {
            id: self.id,
            pid: self.pid,
            node,
            user: self.user.clone(),
            database: self.database.clone(),
            query: self.query.clone(),
            state: progress.state,
            submitted: self.submitted,
            started: progress.started,
            ended: None,
            memory,
            peak_memory: peak,
            spilled_bytes: plan.map(|p| plan_metric(p, "spilled_bytes")).unwrap_or(0),
            rows: progress.rows,
            progress: match progress.state {
                QueryState::Running => plan.and_then(plan_progress),
                QueryState::Queued => Some(0.0),
                _ => None,
            },
            error: None,
            plan: None,
            gpu: plan.and_then(|p| gpu_state(p, progress.state)),
            retries: progress.retries,
        }
    }

    /// It waits for admission.
    pub fn queued(&self) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.state = QueryState::Queued;
        progress.started = None;
    }

    /// It runs (admitted).
    pub fn running(&self) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.state = QueryState::Running;
        progress.started = Some(now_micros());
    }

    /// The pool its operators reserve from.
    pub fn set_memory(&self, memory: Arc<QueryMemory>) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .memory = Some(memory);
    }

    /// The physical plan it runs (the last one planned, for statements that
    /// run several).
    pub fn set_plan(&self, plan: Arc<dyn ExecutionPlan>) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).plan = Some(plan);
    }

    /// It is run again after a node failed during it.
    pub fn retried(&self) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retries += 1;
    }

    /// Rows it returned or changed.
    pub fn add_rows(&self, rows: u64) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).rows += rows;
    }

    /// It ended in `state` (`error`: why it failed): it moves to the
    /// finished list with its figures and plan. Once only.
    pub fn end(&self, state: QueryState, error: Option<String>) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(activity) = self.activity.upgrade() else {
            return;
        };
        // The view, its plan's text above all, is made before the lock that
        // every statement's start and end takes.
        let mut view = self.view(activity.node);
        view.state = state;
        view.ended = Some(now_micros());
        view.memory = 0;
        if view.gpu.is_some() {
            view.gpu = Some("used".to_string());
        }
        view.error = error;
        view.progress = (state == QueryState::Finished).then_some(1.0);
        let plan = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .plan
            .take();
        view.plan = plan.map(|p| {
            datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(p.as_ref())
                .indent(true)
                .to_string()
        });
        let mut queries = activity.queries.lock().unwrap_or_else(|e| e.into_inner());
        if queries.live.remove(&self.id).is_none() {
            return;
        }
        if queries.finished.len() == FINISHED_KEPT {
            queries.finished.pop_front();
        }
        queries.finished.push_back(view);
        queries.ended_total += 1;
    }
}

/// A statement's hold on its record: dropped before the statement ended
/// it (its future or result stream was dropped: a cancel, a timeout, a
/// client gone), the statement counts as cancelled.
pub struct QueryHandle(Arc<QueryRecord>);

impl std::ops::Deref for QueryHandle {
    type Target = QueryRecord;
    fn deref(&self) -> &QueryRecord {
        &self.0
    }
}

impl QueryHandle {
    /// The record, for what must reach it from elsewhere (the plan).
    pub fn record(&self) -> &Arc<QueryRecord> {
        &self.0
    }
}

impl Drop for QueryHandle {
    fn drop(&mut self) {
        self.0.end(QueryState::Cancelled, None);
    }
}

/// An ended statement's view without its plan, the largest part.
fn without_plan(view: &QueryView) -> QueryView {
    QueryView {
        id: view.id,
        pid: view.pid,
        node: view.node,
        user: view.user.clone(),
        database: view.database.clone(),
        query: view.query.clone(),
        state: view.state,
        submitted: view.submitted,
        started: view.started,
        ended: view.ended,
        memory: view.memory,
        peak_memory: view.peak_memory,
        spilled_bytes: view.spilled_bytes,
        rows: view.rows,
        progress: view.progress,
        error: view.error.clone(),
        plan: None,
        gpu: view.gpu.clone(),
        retries: view.retries,
    }
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

impl Activity {
    /// The registry of node `node` (0 on a single node).
    pub fn new(node: u32) -> Result<Arc<Self>> {
        if node > NODE_NUMBER_MAX {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("node id {node} is above the largest, {NODE_NUMBER_MAX}"),
            ));
        }
        Ok(Arc::new(Self {
            node,
            next: AtomicU32::new(1),
            backends: Mutex::new(BTreeMap::new()),
            next_query: AtomicU64::new(1),
            queries: Mutex::new(Queries::default()),
            cluster: std::sync::OnceLock::new(),
        }))
    }

    pub fn node(&self) -> u32 {
        self.node
    }

    /// Reach the other nodes through `cluster` (once, at start).
    pub fn set_cluster(&self, cluster: Arc<dyn ClusterActivity>) {
        let _ = self.cluster.set(cluster);
    }

    /// Whether other nodes are reached (a clustered server).
    pub fn in_cluster(&self) -> bool {
        self.cluster.get().is_some()
    }

    /// The statements of the whole cluster: this node's, then the other
    /// nodes' (only this node's on a single node).
    pub async fn cluster_queries(&self) -> Vec<QueryView> {
        self.cluster_queries_with(true).await
    }

    /// [`Activity::cluster_queries`], the ended ones with their plans when
    /// `plans` (a list that shows none need not carry them).
    pub async fn cluster_queries_with(&self, plans: bool) -> Vec<QueryView> {
        let mut views = self.queries_with(plans);
        if let Some(cluster) = self.cluster.get() {
            views.extend(cluster.queries(plans).await);
        }
        views
    }

    /// The other nodes' tiers by data file (none on a single node).
    pub async fn cluster_cache(&self) -> Vec<crate::system::CacheRow> {
        match self.cluster.get() {
            Some(cluster) => cluster.cache().await,
            None => Vec::new(),
        }
    }

    /// [`Activity::cancel_query`] for a statement of any node.
    pub async fn cancel_cluster_query(
        &self,
        id: i64,
        user: Option<&str>,
        superuser: bool,
    ) -> Result<bool> {
        match self.cluster.get() {
            Some(cluster) if query_node(id) != self.node => {
                cluster.cancel_query(query_node(id), id, user).await
            }
            _ => self.cancel_query(id, user, superuser),
        }
    }

    /// [`Activity::signal`] for a backend of any node.
    pub async fn signal_cluster(
        &self,
        pid: i32,
        user: Option<&str>,
        superuser: bool,
        terminate: bool,
    ) -> Result<bool> {
        match self.cluster.get() {
            Some(cluster) if pid_node(pid) != self.node => {
                cluster.signal(pid_node(pid), pid, user, terminate).await
            }
            _ => self.signal(pid, user, superuser, terminate),
        }
    }

    /// The statements of this node: queued and running ones, then the ended
    /// ones kept, oldest first.
    pub fn queries(&self) -> Vec<QueryView> {
        self.queries_with(true)
    }

    /// [`Activity::queries`], the ended ones with their plans when `plans`.
    pub fn queries_with(&self, plans: bool) -> Vec<QueryView> {
        let queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let mut views: Vec<QueryView> = queries
            .finished
            .iter()
            .map(|v| if plans { v.clone() } else { without_plan(v) })
            .collect();
        views.extend(queries.live.values().map(|q| q.view(self.node)));
        views
    }

    /// How many statements ended since the node started, and those of them
    /// that ended after the first `seen` and are still kept (at most
    /// [`FINISHED_KEPT`]), oldest first, without their plans: what a
    /// watcher of endings needs, at the cost of the new ones only.
    pub fn ended_since(&self, seen: u64) -> (u64, Vec<QueryView>) {
        let queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let new = queries.ended_total.saturating_sub(seen) as usize;
        let skip = queries.finished.len().saturating_sub(new);
        let views = queries
            .finished
            .iter()
            .skip(skip)
            .map(without_plan)
            .collect();
        (queries.ended_total, views)
    }

    /// Cancel the statement `id` on behalf of `user` (None: unrestricted),
    /// who must be a superuser or the statement's own user. Ok(false): no
    /// such statement is queued or running here.
    pub fn cancel_query(&self, id: i64, user: Option<&str>, superuser: bool) -> Result<bool> {
        let pid = {
            let queries = self.queries.lock().unwrap_or_else(|e| e.into_inner());
            queries.live.get(&id).map(|q| q.pid)
        };
        match pid {
            Some(pid) => self.signal(pid, user, superuser, false),
            None => Ok(false),
        }
    }

    /// Register a new session; it leaves the registry when the handle drops.
    pub fn register(
        self: &Arc<Self>,
        user: &str,
        database: &str,
        application_name: &str,
        client_addr: Option<String>,
        signal: Weak<dyn BackendSignal>,
    ) -> Backend {
        let mut backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let pid = loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << PID_NODE_SHIFT) - 1);
            let pid = ((self.node << PID_NODE_SHIFT) | n) as i32;
            if n != 0 && !backends.contains_key(&pid) {
                break pid;
            }
        };
        let now = now_micros();
        backends.insert(
            pid,
            Entry {
                info: BackendInfo {
                    pid,
                    user: user.to_string(),
                    database: database.to_string(),
                    application_name: application_name.to_string(),
                    client_addr,
                    backend_start: now,
                    state: BackendState::Idle,
                    query: String::new(),
                    query_start: None,
                    state_change: now,
                    backend_type: "client backend",
                    wait_event: None,
                },
                signal,
            },
        );
        Backend {
            activity: Arc::clone(self),
            pid,
        }
    }

    /// Every backend, by pid.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        backends.values().map(|e| e.info.clone()).collect()
    }

    /// How many backends are running a statement now.
    pub fn running(&self) -> usize {
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        backends
            .values()
            .filter(|e| e.info.state == BackendState::Active)
            .count()
    }

    fn update(&self, pid: i32, change: impl FnOnce(&mut BackendInfo)) {
        let mut backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = backends.get_mut(&pid) {
            change(&mut entry.info);
        }
    }

    /// Signal backend `pid` on behalf of `user` (None: unrestricted), who
    /// must be a superuser or the backend's own user. Ok(false): no such
    /// backend.
    pub fn signal(
        &self,
        pid: i32,
        user: Option<&str>,
        superuser: bool,
        terminate: bool,
    ) -> Result<bool> {
        let found = {
            let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
            backends
                .get(&pid)
                .map(|e| (e.info.user.clone(), e.signal.upgrade()))
        };
        let Some((owner, signal)) = found else {
            return Ok(false);
        };
        if !superuser && user.is_some_and(|u| u != owner) {
            let what = if terminate {
                "terminate process"
            } else {
                "cancel query"
            };
            return Err(CirroError::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied to {what}: only a superuser or the role \"{owner}\" may signal backend {pid}"
                ),
            ));
        }
        let Some(signal) = signal else {
            return Ok(false);
        };
        if terminate {
            signal.terminate();
        } else {
            signal.cancel();
        }
        Ok(true)
    }
}

/// A session's place in the registry.
pub struct Backend {
    activity: Arc<Activity>,
    pub pid: i32,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("pid", &self.pid).finish()
    }
}

impl Backend {
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Enter a statement of this session in `cirro.queries` (running until
    /// told otherwise); it ends when [`QueryRecord::end`] is called or the
    /// handle drops (then as cancelled).
    pub fn start_query(&self) -> QueryHandle {
        let activity = &self.activity;
        let n = activity.next_query.fetch_add(1, Ordering::Relaxed) & ((1 << QUERY_NODE_SHIFT) - 1);
        let id = ((activity.node as i64) << QUERY_NODE_SHIFT) | n as i64;
        // The text the client sent (as pg_stat_activity shows it).
        let (user, database, query) = {
            let backends = activity.backends.lock().unwrap_or_else(|e| e.into_inner());
            backends
                .get(&self.pid)
                .map(|e| {
                    (
                        e.info.user.clone(),
                        e.info.database.clone(),
                        e.info.query.clone(),
                    )
                })
                .unwrap_or_default()
        };
        let now = now_micros();
        let record = Arc::new(QueryRecord {
            id,
            pid: self.pid,
            user,
            database,
            query,
            submitted: now,
            activity: Arc::downgrade(activity),
            ended: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                state: QueryState::Running,
                started: Some(now),
                memory: None,
                plan: None,
                rows: 0,
                retries: 0,
            }),
        });
        let mut queries = activity.queries.lock().unwrap_or_else(|e| e.into_inner());
        queries.live.insert(id, Arc::clone(&record));
        QueryHandle(record)
    }

    /// The session starts running `query`: active until the guard drops,
    /// then `after()`'s state.
    pub fn running<'a>(
        &'a self,
        query: &str,
        after: impl Fn() -> BackendState + Send + Sync + 'a,
    ) -> Running<'a> {
        self.mark_active(query);
        Running {
            backend: self,
            after: Box::new(after),
        }
    }

    /// Like [`Backend::running`], for work that outlives a borrow of the
    /// session (a Flight SQL result streamed by DoGet): active until the
    /// guard drops, then `after`.
    pub fn running_owned(&self, query: &str, after: BackendState) -> RunningOwned {
        self.mark_active(query);
        RunningOwned {
            activity: Arc::clone(&self.activity),
            pid: self.pid,
            after,
        }
    }

    /// What the session's statement waits for (None: nothing).
    pub fn set_waiting(&self, event: Option<&'static str>) {
        self.activity
            .update(self.pid, |info| info.wait_event = event);
    }

    fn mark_active(&self, query: &str) {
        let now = now_micros();
        // No password is ever kept in a text (see visibility.rs).
        let query = cirro_sql::redact_passwords(query).into_owned();
        self.activity.update(self.pid, |info| {
            info.state = BackendState::Active;
            info.query = query;
            info.query_start = Some(now);
            info.state_change = now;
        });
    }

    fn finished(&self, state: BackendState) {
        let now = now_micros();
        self.activity.update(self.pid, |info| {
            info.state = state;
            info.state_change = now;
            info.wait_event = None;
        });
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let mut backends = self
            .activity
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        backends.remove(&self.pid);
    }
}

/// Marks a backend active while it lives (see [`Backend::running_owned`]).
pub struct RunningOwned {
    activity: Arc<Activity>,
    pid: i32,
    after: BackendState,
}

impl Drop for RunningOwned {
    fn drop(&mut self) {
        let now = now_micros();
        let after = self.after;
        self.activity.update(self.pid, |info| {
            info.state = after;
            info.state_change = now;
            info.wait_event = None;
        });
    }
}

/// Marks a backend active while it lives (see [`Backend::running`]).
pub struct Running<'a> {
    backend: &'a Backend,
    after: Box<dyn Fn() -> BackendState + Send + Sync + 'a>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.backend.finished((self.after)());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flags(Mutex<Vec<&'static str>>);

    impl BackendSignal for Flags {
        fn cancel(&self) {
            self.0.lock().expect("lock").push("cancel");
        }
        fn terminate(&self) {
            self.0.lock().expect("lock").push("terminate");
        }
    }

    #[test]
    fn pids_carry_the_node_and_states_follow_statements() {
        let activity = Activity::new(3).expect("node");
        let flags = Arc::new(Flags(Mutex::new(vec![])));
        let signal: Arc<dyn BackendSignal> = flags.clone();
        let a = activity.register("alice", "cirro", "psql", None, Arc::downgrade(&signal));
        let b = activity.register("bob", "cirro", "", None, Arc::downgrade(&signal));
        assert_ne!(a.pid, b.pid);
        assert_eq!(a.pid >> PID_NODE_SHIFT, 3);
        {
            let _running = a.running("SELECT 1", || BackendState::IdleInTransaction);
            let rows = activity.backends();
            assert_eq!(rows[0].state, BackendState::Active);
            assert_eq!(rows[0].query, "SELECT 1");
        }
        assert_eq!(
            activity.backends()[0].state,
            BackendState::IdleInTransaction
        );
        let err = activity
            .signal(a.pid, Some("bob"), false, false)
            .expect_err("bob may not cancel alice");
        assert_eq!(err.state, SqlState::INSUFFICIENT_PRIVILEGE);
        assert!(
            activity
                .signal(a.pid, Some("alice"), false, true)
                .expect("own")
        );
        assert!(
            activity
                .signal(b.pid, Some("alice"), true, false)
                .expect("superuser")
        );
        assert!(
            !activity
                .signal(12345, None, true, false)
                .expect("no such pid")
        );
        assert_eq!(*flags.0.lock().expect("lock"), ["terminate", "cancel"]);
        drop(a);
        assert_eq!(activity.backends().len(), 1);
        assert!(Activity::new(NODE_NUMBER_MAX + 1).is_err());
    }

    #[test]
    fn endings_are_read_since_the_last_look_without_plans() {
        let activity = Activity::new(0).expect("node");
        let signal: Arc<dyn BackendSignal> = Arc::new(Flags(Mutex::new(vec![])));
        let backend = activity.register("alice", "cirro", "", None, Arc::downgrade(&signal));
        let end = |state| backend.start_query().end(state, None);
        end(QueryState::Finished);
        end(QueryState::Failed);
        let (seen, views) = activity.ended_since(0);
        assert_eq!(seen, 2);
        assert_eq!(
            views.iter().map(|v| v.state).collect::<Vec<_>>(),
            [QueryState::Finished, QueryState::Failed]
        );
        let running = backend.start_query();
        assert!(activity.ended_since(seen).1.is_empty(), "none ended since");
        drop(running); // cancelled
        let (total, views) = activity.ended_since(seen);
        assert_eq!((total, views.len()), (3, 1));
        assert_eq!(views[0].state, QueryState::Cancelled);
        // Only the kept ones come back when more ended than are kept.
        for _ in 0..FINISHED_KEPT + 5 {
            end(QueryState::Finished);
        }
        let (total, views) = activity.ended_since(total);
        assert_eq!(
            (total, views.len()),
            (3 + FINISHED_KEPT as u64 + 5, FINISHED_KEPT)
        );
        assert_eq!(activity.queries_with(false).len(), FINISHED_KEPT);
    }
}
