//! The console's JSON API (also what `cirro admin` reads) and the
//! Prometheus metrics. Each handler first asks who calls
//! ([`Console::caller`]) and then applies the rule SQL applies.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Response, StatusCode, Uri, header};
use cirro_catalog::NodeInfo;
use cirro_common::SqlState;
use cirro_engine::activity::QueryView;
use serde_json::{Value, json};

use super::monitor::{Sample, now_ms};
use super::{Caller, Console, error, failure, json};

/// The header that names the user a node acts for (with the secret).
pub(crate) const USER_HEADER: &str = "x-cirro-user";

/// Bail out with the refusal unless the caller may go on.
macro_rules! caller {
    ($console:expr, $headers:expr) => {
        match $console.caller(&$headers).await {
            Ok(caller) => caller,
            Err(refused) => return refused,
        }
    };
}

fn user_of(caller: &Caller) -> Option<&str> {
    match caller {
        Caller::User(user) => Some(user),
        Caller::Node => None,
    }
}

/// This node and the console's user.
pub(crate) async fn status(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    let caller = caller!(console, headers);
    let resources = console.shared.engine.node.resources();
    let counts = resources.admission().counts();
    let user = user_of(&caller);
    json(&json!({
        "node": console.node,
        "version": env!("CARGO_PKG_VERSION"),
        "cluster": console.cluster.is_some(),
        "user": user,
        "superuser": user.is_some_and(|u| console.shared.is_superuser(u)),
        "max_running": resources.admission().max_running(),
        "running": counts.running,
        "queued": counts.queued,
        "ever_queued": counts.ever_queued,
        "peak_queued": counts.peak_queued,
        "slow_query_ms": console.monitor.slow_threshold().as_millis() as u64,
        "sample": console.monitor.latest(),
    }))
}

/// The nodes of the cluster (this one alone on a single node), with the
/// load each last reported; this node's figures are current.
pub(crate) async fn nodes(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    caller!(console, headers);
    let latest = console.monitor.latest();
    let mut nodes = match &console.cluster {
        Some(cluster) => cirro_catalog::Coordination::nodes(cluster.as_ref()),
        None => {
            let (cores, memory_bytes) = cirro_catalog::coordination::local_capacity();
            vec![NodeInfo {
                id: console.node.clone(),
                version: env!("CARGO_PKG_VERSION").into(),
                cores,
                memory_bytes,
                state: "running".into(),
                ..NodeInfo::default()
            }]
        }
    };
    for node in nodes.iter_mut().filter(|n| n.id == console.node) {
        node.memory_used = latest.memory_used;
        node.cpu_permille = latest.cpu_permille;
        node.disk_bytes = latest.disk_bytes;
        node.disk_free = latest.disk_free;
        node.cache_bytes = latest.cache_bytes;
        node.queries = latest.running;
    }
    let rows: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "id": n.id,
                "number": n.number,
                "state": n.state,
                "version": n.version,
                "pg": n.pg,
                "http": n.http,
                "cores": n.cores,
                "memory_bytes": n.memory_bytes,
                "memory_used": n.memory_used,
                "cpu_percent": f64::from(n.cpu_permille) / 10.0,
                "disk_bytes": n.disk_bytes,
                "disk_free": n.disk_free,
                "cache_bytes": n.cache_bytes,
                "queries": n.queries,
                "tasks": n.tasks,
                "started_ms": n.started_ms,
                "this": n.id == console.node,
            })
        })
        .collect();
    json(&Value::Array(rows))
}

/// A statement as the console lists it (`plan`: with its plan).
fn query_json(view: &QueryView, plan: bool) -> Value {
    let mut value = json!({
        "id": view.id,
        "pid": view.pid,
        "node": view.node,
        "user": view.user,
        "state": view.state.as_str(),
        "query": view.query,
        "submitted_ms": view.submitted / 1000,
        "started_ms": view.started.map(|t| t / 1000),
        "ended_ms": view.ended.map(|t| t / 1000),
        "elapsed_ms": view.elapsed_micros() / 1000,
        "memory": view.memory,
        "peak_memory": view.peak_memory,
        "spilled_bytes": view.spilled_bytes,
        "rows": view.rows,
        "progress": view.progress,
        "error": view.error,
        "gpu": view.gpu,
    });
    if plan {
        value["plan"] = json!(view.plan);
    }
    value
}

/// The statements of the cluster, as `cirro.queries` shows them (without
/// plans: `/api/queries/ID` has one's plan).
pub(crate) async fn queries(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    let caller = caller!(console, headers);
    let views = console.shared.visible(
        &caller,
        console.shared.activity.cluster_queries_with(false).await,
    );
    json(&Value::Array(
        views.iter().map(|v| query_json(v, false)).collect(),
    ))
}

/// One statement with its plan and per-operator figures.
pub(crate) async fn query(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response<Body> {
    let caller = caller!(console, headers);
    let views = console
        .shared
        .visible(&caller, console.shared.activity.cluster_queries().await);
    match views.iter().find(|v| v.id == id) {
        Some(view) => json(&query_json(view, true)),
        None => error(
            StatusCode::NOT_FOUND,
            SqlState::UNDEFINED_OBJECT.0,
            &format!("query {id} is not in cirro.queries"),
        ),
    }
}

/// Cancel a statement, as `CANCEL QUERY id` would for the caller.
pub(crate) async fn cancel(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response<Body> {
    let caller = match console.actor(&headers).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let Caller::User(user) = caller else {
        return error(
            StatusCode::FORBIDDEN,
            SqlState::INSUFFICIENT_PRIVILEGE.0,
            "another node acts through /internal",
        );
    };
    let superuser = console.shared.is_superuser(&user);
    match console
        .shared
        .activity
        .cancel_cluster_query(id, Some(&user), superuser)
        .await
    {
        Ok(true) => json(&json!({ "cancelled": id })),
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            SqlState::UNDEFINED_OBJECT.0,
            &format!("query {id} is not queued or running (see cirro.queries)"),
        ),
        Err(e) => failure(&e),
    }
}

/// The worker RPC micro-benchmark from this node to every other live
/// node's worker (see [`cirro_cluster::rpc_bench`]): a superuser's action
/// (it loads the network for seconds); `?sizes=B,B,…` picks the message
/// sizes (default 1 KB to 16 MB). The nodes are measured one at a time.
pub(crate) async fn rpc_bench(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response<Body> {
    let caller = match console.actor(&headers).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    if !matches!(&caller, Caller::User(user) if console.shared.is_superuser(user)) {
        return error(
            StatusCode::FORBIDDEN,
            SqlState::INSUFFICIENT_PRIVILEGE.0,
            "the RPC benchmark is a superuser's action",
        );
    }
    let (Some(cluster), Some(secret)) = (&console.cluster, &console.secret) else {
        return error(
            StatusCode::BAD_REQUEST,
            SqlState::FEATURE_NOT_SUPPORTED.0,
            "the RPC benchmark measures the links between a cluster's nodes; this node is not in a cluster",
        );
    };
    let sizes = match uri
        .query()
        .into_iter()
        .flat_map(|q| url::form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == "sizes")
    {
        None => cirro_cluster::rpc_bench::SIZES.to_vec(),
        Some((_, list)) => match list.split(',').map(|s| s.trim().parse()).collect() {
            Ok(sizes) => sizes,
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    SqlState::INVALID_PARAMETER_VALUE.0,
                    &format!("sizes: a list of byte counts, not {list:?}"),
                );
            }
        },
    };
    let mut peers = Vec::new();
    for node in cirro_catalog::Coordination::nodes(cluster.as_ref()) {
        if node.id == console.node || node.worker.is_empty() {
            continue;
        }
        match cirro_cluster::rpc_bench::measure(&node.worker, secret, &sizes).await {
            Ok(figures) => peers.push(json!({
                "node": node.id,
                "worker": node.worker,
                "sizes": figures.iter().map(|f| json!({
                    "bytes": f.bytes,
                    "round_trip_us": f.round_trip_us,
                    "round_trips": f.round_trips,
                    "messages": f.messages,
                    "mb_per_s": f.mb_per_s,
                })).collect::<Vec<_>>(),
            })),
            Err(e) => return failure(&e),
        }
    }
    json(&json!({ "from": console.node, "to": peers }))
}

/// Storage figures of the tables the caller may SELECT from.
pub(crate) async fn tables(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    let caller = caller!(console, headers);
    let Caller::User(user) = caller else {
        return error(
            StatusCode::FORBIDDEN,
            SqlState::INSUFFICIENT_PRIVILEGE.0,
            "tables are listed for a user",
        );
    };
    let engine = cirro_engine::Engine::with_catalog(
        Arc::clone(&console.shared.catalog),
        console.shared.engine.clone(),
        Some(user),
    );
    match engine.table_storage().await {
        Ok(tables) => json(&Value::Array(
            tables
                .iter()
                .map(|t| {
                    let f = &t.footprint;
                    json!({
                        "database": t.database,
                        "schema": t.schema,
                        "table": t.table,
                        "version": t.version,
                        "files": f.files,
                        "bytes": f.bytes,
                        "rows": f.stored_rows.map(|r| r.saturating_sub(f.deleted_rows)),
                        "compression_ratio": f.compression_ratio,
                        "files_with_deletion_vectors": f.files_with_deletion_vectors,
                        "deleted_rows": f.deleted_rows,
                    })
                })
                .collect(),
        )),
        Err(e) => failure(&e),
    }
}

/// The monitor's samples (`?since=MS`: only later ones).
pub(crate) async fn history(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response<Body> {
    caller!(console, headers);
    let since = uri
        .query()
        .into_iter()
        .flat_map(|q| url::form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == "since")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    json(&json!({ "now": now_ms(), "samples": console.monitor.history(since) }))
}

/// Prometheus' text format (version 0.0.4).
pub(crate) async fn metrics(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    caller!(console, headers);
    let text = prometheus_text(
        &console.node,
        &console.monitor.latest(),
        &console.monitor.ended(),
        &console.shared.engine.node,
        console.shared.activity.backends().len(),
    );
    let mut response = Response::new(Body::from(text));
    if let Ok(kind) = "text/plain; version=0.0.4; charset=utf-8".parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, kind);
    }
    response
}

fn prometheus_text(
    node: &str,
    sample: &Sample,
    ended: &super::monitor::Ended,
    parts: &cirro_engine::Node,
    sessions: usize,
) -> String {
    let node = node.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in values {
            let sep = if labels.is_empty() { "" } else { "," };
            let _ = writeln!(out, "{name}{{node=\"{node}\"{sep}{labels}}} {value}");
        }
    };
    metric(
        "cirro_queries_ended_total",
        "counter",
        "Statements that ended, by how.",
        &[
            ("state=\"finished\"", ended.finished as f64),
            ("state=\"failed\"", ended.failed as f64),
            ("state=\"cancelled\"", ended.cancelled as f64),
        ],
    );
    for (name, kind, help, value) in single_metrics(sample, ended, parts, sessions) {
        metric(name, kind, help, &[("", value)]);
    }
    out
}

/// The metrics of one value each: name, type, help, value.
fn single_metrics(
    sample: &Sample,
    ended: &super::monitor::Ended,
    node: &cirro_engine::Node,
    sessions: usize,
) -> [(&'static str, &'static str, &'static str, f64); 16] {
    let cache = node.cache().totals();
    let admission = &node.resources().admission().counts();
    [
        (
            "cirro_queries_running",
            "gauge",
            "Statements running now.",
            f64::from(sample.running),
        ),
        (
            "cirro_queries_queued",
            "gauge",
            "Statements waiting for admission.",
            f64::from(sample.queued),
        ),
        (
            "cirro_queries_slow_total",
            "counter",
            "Statements slower than the slow-query threshold.",
            ended.slow as f64,
        ),
        (
            "cirro_queries_queued_total",
            "counter",
            "Statements that waited for admission.",
            admission.ever_queued as f64,
        ),
        (
            "cirro_spilled_bytes_total",
            "counter",
            "Bytes ended statements spilled to disk.",
            ended.spilled_bytes as f64,
        ),
        (
            "cirro_sessions",
            "gauge",
            "Client sessions open.",
            sessions as f64,
        ),
        (
            "cirro_query_memory_used_bytes",
            "gauge",
            "Bytes the statements hold.",
            sample.memory_used as f64,
        ),
        (
            "cirro_query_memory_limit_bytes",
            "gauge",
            "Bytes the statements may hold together.",
            sample.memory_limit as f64,
        ),
        (
            "cirro_admission_reserved_bytes",
            "gauge",
            "Memory reserved by admitted statements.",
            admission.reserved as f64,
        ),
        (
            "cirro_cache_bytes",
            "gauge",
            "Bytes the hot-data tier holds.",
            cache.bytes as f64,
        ),
        (
            "cirro_cache_hits_total",
            "counter",
            "Hot-data tier hits.",
            cache.hits as f64,
        ),
        (
            "cirro_cache_misses_total",
            "counter",
            "Hot-data tier misses.",
            cache.misses as f64,
        ),
        (
            "cirro_process_resident_memory_bytes",
            "gauge",
            "Resident memory of the process.",
            sample.rss as f64,
        ),
        (
            "cirro_process_cpu_ratio",
            "gauge",
            "CPU the process used over the last second, as a share of the machine.",
            f64::from(sample.cpu_permille) / 1000.0,
        ),
        (
            "cirro_spill_disk_free_bytes",
            "gauge",
            "Free bytes on the spill directory's file system.",
            sample.disk_free as f64,
        ),
        (
            "cirro_spill_disk_bytes",
            "gauge",
            "Size of the spill directory's file system.",
            sample.disk_bytes as f64,
        ),
    ]
}

/// Another node asks for this node's statements (with plans, unless
/// `?plans=false`).
pub(crate) async fn internal_queries(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response<Body> {
    if !matches!(caller!(console, headers), Caller::Node) {
        return only_nodes();
    }
    let plans = !uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "plans=false"));
    json(&serde_json::to_value(console.shared.activity.queries_with(plans)).unwrap_or(Value::Null))
}

/// Another node asks for this node's hot-data and disk tiers by data file
/// (its `cirro.cache` rows).
pub(crate) async fn internal_cache(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
) -> Response<Body> {
    if !matches!(caller!(console, headers), Caller::Node) {
        return only_nodes();
    }
    let shared = &console.shared;
    let me = match shared.catalog.coordination() {
        Some(cluster) => cluster.node_id(),
        None => "local".to_string(),
    };
    let rows = cirro_engine::system::cache_rows(&shared.engine.node, &me);
    json(&serde_json::to_value(rows).unwrap_or(Value::Null))
}

fn only_nodes() -> Response<Body> {
    error(
        StatusCode::FORBIDDEN,
        SqlState::INSUFFICIENT_PRIVILEGE.0,
        "only the cluster's nodes may call /internal",
    )
}

/// The user another node acts for, and whether a superuser.
fn acting_user(console: &Console, headers: &HeaderMap) -> (Option<String>, bool) {
    let user = headers
        .get(USER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let superuser = match &user {
        Some(user) => console.shared.is_superuser(user),
        None => true,
    };
    (user, superuser)
}

/// Another node cancels a statement of this node for its user.
pub(crate) async fn internal_cancel(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response<Body> {
    for_node(&console, &headers, |user, superuser| {
        console.shared.activity.cancel_query(id, user, superuser)
    })
    .await
}

/// Another node signals a backend of this node for its user.
pub(crate) async fn internal_signal(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path((pid, signal)): Path<(i32, String)>,
) -> Response<Body> {
    let terminate = signal == "terminate";
    for_node(&console, &headers, |user, superuser| {
        console
            .shared
            .activity
            .signal(pid, user, superuser, terminate)
    })
    .await
}

/// Do `act` (for the user another node names, and whether a superuser) if
/// the caller is a node; `{"done": …}` or the refusal.
async fn for_node(
    console: &Console,
    headers: &HeaderMap,
    act: impl FnOnce(Option<&str>, bool) -> cirro_common::Result<bool>,
) -> Response<Body> {
    if !matches!(caller!(console, headers), Caller::Node) {
        return only_nodes();
    }
    let (user, superuser) = acting_user(console, headers);
    match act(user.as_deref(), superuser) {
        Ok(done) => json(&json!({ "done": done })),
        Err(e) => failure(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_prometheus_text() {
        let sample = Sample {
            running: 2,
            queued: 1,
            ..Sample::default()
        };
        let ended = super::super::monitor::Ended {
            finished: 5,
            ..Default::default()
        };
        let text = prometheus_text("n\"1", &sample, &ended, &cirro_engine::Node::default(), 3);
        assert!(
            text.contains(
                "# TYPE cirro_queries_running gauge\ncirro_queries_running{node=\"n\\\"1\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("cirro_queries_ended_total{node=\"n\\\"1\",state=\"finished\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("cirro_sessions{node=\"n\\\"1\"} 3\n"),
            "{text}"
        );
        // Every sample line follows its HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split('{').next().expect("name");
            assert!(text.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }
}
