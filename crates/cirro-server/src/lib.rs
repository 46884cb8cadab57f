//! `cirro serve`: Cirro behind the PostgreSQL wire protocol and Arrow
//! Flight SQL.
//!
//! ```text
//!  TCP (TLS optional) ─► pgwire codec ─► per connection:
//!     ScramStartup   SCRAM-SHA-256 against the catalog's verifiers → Session
//!     QueryHandler   simple/extended queries → Session's Engine
//!  CancelRequest ─► the registry of running sessions (pid + secret)
//!  gRPC (TLS optional) ─► tonic ─► FlightSql: basic login → Session under a
//!     bearer token; statements through the same path as simple queries
//! ```
//!
//! Sessions share one [`Catalog`]; each has its own engine (settings,
//! transaction, pinned tables), so connections never block each other.

mod admin;
mod console;
mod flight;
mod http_client;
mod pg;
mod session;

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use cirro_catalog::Catalog;
use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::EngineConfig;
use cirro_storage::StorageRoot;
use datafusion::execution::runtime_env::RuntimeEnv;
use pgwire::api::auth::DefaultServerParameterProvider;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ClientInfo, ErrorHandler, PgWireServerHandlers, RandomPidSecretKeyGenerator};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::cancel::CancelRequest;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig as TlsConfig;

use crate::session::Canceller;

pub use admin::{AdminCall, AdminTarget, admin};

/// How `cirro serve` runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The data location (as for every command).
    pub data: String,
    /// Address to listen on.
    pub listen: String,
    /// PostgreSQL protocol port.
    pub pg_port: u16,
    /// Arrow Flight SQL port.
    pub flight_port: u16,
    /// Port of the web console and HTTP API (None: none).
    pub http_port: Option<u16>,
    /// Statements that take at least this long go to the slow-query log.
    pub slow_query: Duration,
    /// The slow-query log's file (None: standard error).
    pub slow_query_log: Option<std::path::PathBuf>,
    /// TLS certificate chain and private key (PEM).
    pub tls: Option<(String, String)>,
    /// Refuse connections without TLS.
    pub require_tls: bool,
    pub engine: EngineConfig,
    /// Run as a member of a cluster (None: a single node).
    pub cluster: Option<ClusterOptions>,
}

/// How a node joins a cluster (`cirro serve --cluster …`).
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// `zk://host:port[,…]/path`.
    pub url: String,
    /// The node's name (default: its PostgreSQL address).
    pub node_id: Option<String>,
    /// The host other nodes and clients reach this node at (default: the
    /// listen address, or the host name when listening on all addresses).
    pub advertise: Option<String>,
    /// How long SIGTERM waits for running queries before leaving.
    pub drain_timeout: Duration,
    /// Port of the worker service (0: a free one).
    pub worker_port: u16,
    /// The secret workers require (None: the one kept in ZooKeeper).
    pub secret: Option<String>,
}

/// State shared by all connections.
pub(crate) struct Shared {
    catalog: Arc<Catalog>,
    engine: EngineConfig,
    require_tls: bool,
    parameters: Arc<DefaultServerParameterProvider>,
    pids: RandomPidSecretKeyGenerator,
    /// The registry of backends (pg_stat_activity, pids, signals).
    activity: Arc<cirro_engine::activity::Activity>,
    /// Running sessions by backend pid, for CancelRequest.
    sessions: Mutex<HashMap<i32, (Vec<u8>, Weak<Canceller>)>>,
}

impl Shared {
    /// Check `user`'s password against the catalog's SCRAM verifier (for
    /// the logins that carry a password: Flight SQL, the console): 28000
    /// for an unknown user, 28P01 for a wrong password.
    pub(crate) async fn check_password(&self, user: &str, password: &str) -> Result<()> {
        let snapshot = self.catalog.refresh().await?;
        let Some(entry) = snapshot.users.get(user) else {
            return Err(CirroError::new(
                SqlState::INVALID_AUTHORIZATION,
                format!("role \"{user}\" does not exist"),
            ));
        };
        let verifier = cirro_catalog::ScramVerifier::parse(&entry.verifier)?;
        let password = password.to_string();
        // PBKDF2 takes milliseconds: off the async threads.
        let matches = tokio::task::spawn_blocking(move || verifier.matches_password(&password))
            .await
            .map_err(|e| CirroError::internal(e.to_string()))?;
        if !matches {
            return Err(CirroError::new(
                SqlState::INVALID_PASSWORD,
                format!("password authentication failed for user \"{user}\""),
            ));
        }
        Ok(())
    }

    /// Whether `user` is a superuser now.
    pub(crate) fn is_superuser(&self, user: &str) -> bool {
        self.catalog
            .snapshot()
            .users
            .get(user)
            .is_some_and(|u| u.superuser)
    }

    /// The statements `caller` may see of `views` (texts of other users'
    /// sessions hidden; see cirro_engine::visibility). Another node sees them
    /// whole: it shows them to its own callers through the same filter.
    pub(crate) fn visible(
        &self,
        caller: &console::Caller,
        views: Vec<cirro_engine::activity::QueryView>,
    ) -> Vec<cirro_engine::activity::QueryView> {
        match caller {
            console::Caller::Node => views,
            console::Caller::User(user) => cirro_engine::visibility::StatementViewer::new(
                Arc::clone(&self.catalog),
                Some(user.clone()),
            )
            .queries(views),
        }
    }
}

/// Unregisters a session from the cancel registry when its connection ends.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    pid: i32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut sessions) = self.shared.sessions.lock() {
            sessions.remove(&self.pid);
        }
    }
}

impl Shared {
    pub(crate) fn register(
        self: &Arc<Self>,
        pid: i32,
        secret: Vec<u8>,
        canceller: &Arc<Canceller>,
    ) -> Registration {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(pid, (secret, Arc::downgrade(canceller)));
        }
        Registration {
            shared: Arc::clone(self),
            pid,
        }
    }
}

/// The handlers of one connection.
struct Connection {
    shared: Arc<Shared>,
    canceller: Arc<Canceller>,
    query: Arc<pg::QueryHandler>,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        Arc::clone(&self.query)
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        Arc::clone(&self.query)
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::new(pg::auth::ScramStartup::new(
            Arc::clone(&self.shared),
            Arc::clone(&self.canceller),
        ))
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        Arc::clone(&self.query)
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(CancelBySecret(Arc::clone(&self.shared)))
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }
}

struct CancelBySecret(Arc<Shared>);

#[async_trait]
impl CancelHandler for CancelBySecret {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let canceller = self.0.sessions.lock().ok().and_then(|sessions| {
            sessions
                .get(&request.pid)
                .filter(|(secret, _)| *secret == request.secret_key.to_bytes().to_vec())
                .and_then(|(_, canceller)| canceller.upgrade())
        });
        if let Some(canceller) = canceller {
            canceller.cancel();
        }
    }
}

struct LogErrors;

impl ErrorHandler for LogErrors {
    fn on_error<C: ClientInfo>(&self, client: &C, error: &mut PgWireError) {
        log::debug!("{}: {error}", client.socket_addr());
    }
}

fn tls_acceptor(cert: &str, key: &str) -> Result<TlsAcceptor> {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("TLS {what}: {e}"),
        )
    };
    let certs = rustls_pemfile::certs(&mut BufReader::new(
        File::open(cert).map_err(|e| bad(&format!("certificate {cert}"), &e))?,
    ))
    .collect::<std::result::Result<Vec<_>, _>>()
    .map_err(|e| bad("certificate", &e))?;
    if certs.is_empty() {
        return Err(bad("certificate", &format!("no certificate in {cert}")));
    }
    let key = rustls_pemfile::private_key(&mut BufReader::new(
        File::open(key).map_err(|e| bad(&format!("key {key}"), &e))?,
    ))
    .map_err(|e| bad("key", &e))?
    .ok_or_else(|| bad("key", &format!("no private key in {key}")))?;
    let config = TlsConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("configuration", &e))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Create the first superuser if the data location has none: `CIRRO_USER`
/// (default `cirro`) with `CIRRO_PASSWORD`, or a generated password printed
/// once. An existing user is never changed.
async fn bootstrap(catalog: &Catalog) -> Result<()> {
    if !catalog.refresh().await?.users.is_empty() {
        return Ok(());
    }
    let user = std::env::var("CIRRO_USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "cirro".to_string());
    let (password, generated) = match std::env::var("CIRRO_PASSWORD") {
        Ok(p) if !p.is_empty() => (p, false),
        _ => {
            use base64::Engine as _;
            let bytes: [u8; 15] = rand::random();
            (
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
                true,
            )
        }
    };
    if cirro_engine::bootstrap_superuser(catalog, &user, &password).await? {
        if generated {
            eprintln!(
                "cirro: created superuser \"{user}\" with password {password}\n\
                 cirro: (shown once; set CIRRO_PASSWORD before the first start to choose it)"
            );
        } else {
            eprintln!("cirro: created superuser \"{user}\" (password from CIRRO_PASSWORD)");
        }
    }
    Ok(())
}

/// Bind `host:port` (port 0 picks a free one); returns the listener and the
/// address it got.
async fn listen(
    host: &str,
    port: u16,
    what: &str,
) -> Result<(TcpListener, std::net::SocketAddr), CirroError> {
    let address = format!("{host}:{port}");
    let listener = TcpListener::bind(&address).await.map_err(|e| {
        CirroError::new(
            SqlState::IO_ERROR,
            format!("cannot listen on {address}{what}: {e}"),
        )
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| CirroError::io(e.to_string()))?;
    Ok((listener, local))
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

/// Run the server until interrupted (Ctrl-C or SIGTERM).
pub async fn serve(config: ServerConfig) -> Result<()> {
    let root = StorageRoot::open(&config.data)?;
    let (listener, local) = listen(&config.listen, config.pg_port, "").await?;
    let (flight_listener, flight_local) =
        listen(&config.listen, config.flight_port, " (Flight SQL)").await?;
    let http = match config.http_port {
        Some(port) => Some(listen(&config.listen, port, " (web console)").await?),
        None => None,
    };
    let runtime = match &config.engine.runtime {
        Some(runtime) => Arc::clone(runtime),
        None => Arc::new(RuntimeEnv::default()),
    };
    let (cluster, distribution, worker_tasks) = match &config.cluster {
        Some(options) => {
            let (worker_listener, worker_local) =
                listen(&config.listen, options.worker_port, " (worker)").await?;
            let cluster = join_cluster(
                options,
                root.url().as_str(),
                &config.listen,
                local,
                flight_local,
                worker_local,
                http.as_ref().map(|(_, a)| *a),
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
                Arc::clone(&runtime),
            )?;
            let tasks =
                cirro_cluster::worker::spawn_worker(worker_listener, &secret, execution.worker())?;
            let execution: Arc<dyn cirro_exec::distribution::Distribution> = execution;
            (Some((cluster, secret)), Some(execution), tasks)
        }
        None => (None, None, Default::default()),
    };
    let (cluster, secret) = match cluster {
        Some((cluster, secret)) => (Some(cluster), Some(secret)),
        None => (None, None),
    };
    let catalog = match &cluster {
        Some(cluster) => Catalog::open_in_cluster(root, Arc::clone(cluster) as _).await?,
        None => Catalog::open(root).await?,
    };
    bootstrap(&catalog).await?;
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls_acceptor(cert, key)?),
        None => None,
    };
    if config.require_tls && tls.is_none() {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "--require-tls needs --tls-cert and --tls-key",
        ));
    }
    let mut parameters = DefaultServerParameterProvider::default();
    parameters.server_version = cirro_engine::SERVER_VERSION.to_string();
    parameters.time_zone = "UTC".to_string();
    parameters.date_style = "ISO, MDY".to_string();
    let shared = Arc::new(Shared {
        catalog,
        engine: EngineConfig {
            // One runtime for all sessions: shared Parquet metadata and
            // statistics caches (bounded once, not per connection) and one
            // memory pool.
            runtime: Some(runtime),
            distribution,
            ..config.engine.clone()
        },
        require_tls: config.require_tls,
        parameters: Arc::new(parameters),
        pids: RandomPidSecretKeyGenerator::default(),
        // Pids and query ids carry the node's number in the cluster.
        activity: cirro_engine::activity::Activity::new(
            cluster.as_ref().map_or(0, |c| c.me().number),
        )?,
        sessions: Mutex::new(HashMap::new()),
    });
    let monitor = console::monitor::Monitor::start(
        Arc::clone(&shared.activity),
        console::monitor::SlowLog {
            threshold: config.slow_query,
            file: config.slow_query_log.clone(),
        },
    );
    let tls_cert = config.tls.as_ref().map(|(cert, _)| cert.clone());
    if let Some(cluster) = &cluster {
        shared
            .activity
            .set_cluster(Arc::new(console::peers::ClusterPeers {
                cluster: Arc::clone(cluster),
                peers: console::peers::Peers::new(tls_cert.as_deref(), secret.clone())?,
            }));
        tokio::spawn(report_load(
            Arc::clone(cluster),
            Arc::clone(&shared),
            worker_tasks.clone(),
            Arc::clone(&monitor),
        ));
    }
    let http_local = match http {
        Some((listener, local)) => {
            console::spawn(
                Arc::clone(&shared),
                console::ConsoleSetup {
                    listener,
                    tls: tls.clone(),
                    cluster: cluster.clone(),
                    secret: secret.clone(),
                    monitor,
                },
            )?;
            Some(local)
        }
        None => None,
    };
    let mut flight = tonic::transport::Server::builder();
    if let Some((cert, key)) = &config.tls {
        let read = |path: &str| {
            std::fs::read(path).map_err(|e| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("TLS {path}: {e}"),
                )
            })
        };
        let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
        flight = flight
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("TLS configuration (Flight SQL): {e}"),
                )
            })?;
    }
    let flight = flight
        .add_service(flight::FlightSql::service(Arc::clone(&shared))?)
        // Without TCP_NODELAY each small reply waits out the client's delayed
        // ACK: ~45 ms per Flight SQL query (GetFlightInfo, then DoGet).
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(flight_listener).with_nodelay(Some(true)),
        );
    tokio::spawn(async move {
        if let Err(e) = flight.await {
            eprintln!("cirro: Flight SQL stopped: {e}");
        }
    });
    // All listen before any is announced (the tests read these lines), and
    // the lines go out in one write: a reader that stops after the first
    // two cannot make a later line fail.
    let tls_note = if tls.is_some() { " (TLS)" } else { "" };
    let mut announce = format!(
        "cirro: PostgreSQL protocol on {local}{tls_note}\ncirro: Arrow Flight SQL on {flight_local}{tls_note}\n"
    );
    if let Some(http) = http_local {
        let scheme = if tls.is_some() { "https" } else { "http" };
        announce.push_str(&format!("cirro: web console on {scheme}://{http}/\n"));
    }
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(announce.as_bytes());
    let _ = stdout.flush();
    drop(stdout);
    let query = Arc::new(pg::QueryHandler::new());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CirroError::io(e.to_string()))?;
    if let Some(cluster) = &cluster {
        println!(
            "cirro: node \"{}\" joined the cluster at {}",
            cirro_catalog::Coordination::node_id(cluster.as_ref()),
            cluster.servers()
        );
        let _ = std::io::stdout().flush();
    }
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        };
        let (socket, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                log::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let canceller = Arc::new(Canceller::default());
        let handlers = Connection {
            shared: Arc::clone(&shared),
            canceller: Arc::clone(&canceller),
            query: Arc::clone(&query),
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            let (socket, watcher) = match watch_disconnect(socket, Arc::clone(&canceller)) {
                Ok(pair) => pair,
                Err(e) => {
                    log::warn!("{peer}: {e}");
                    return;
                }
            };
            // pg_terminate_backend ends the connection.
            tokio::select! {
                processed = process_connection(socket, tls, handlers) => {
                    if let Err(e) = processed {
                        log::debug!("{peer}: {e}");
                    }
                }
                _ = canceller.terminated() => log::debug!("{peer}: terminated"),
            }
            watcher.abort();
            // The connection is gone: stop whatever it was running.
            canceller.cancel();
        });
    }
    if let (Some(cluster), Some(options)) = (&cluster, &config.cluster) {
        drain(cluster, &shared, &worker_tasks, options.drain_timeout).await;
    }
    eprintln!("cirro: shutting down");
    Ok(())
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

/// Leave the cluster in order: say "draining" (so that no new work is sent
/// here: coordinators leave draining nodes out of new plans), wait for the
/// running statements and for the tasks other nodes' queries run here (at
/// most `timeout`), then delete the node's registration.
async fn drain(
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
    while tokio::time::Instant::now() < deadline {
        if shared.activity.running() == 0 && worker_tasks.count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.leave().await;
    eprintln!("cirro: left the cluster");
}

/// How long a client may take to log in.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One client connection: pgwire's message loop (as in
/// `pgwire::tokio::process_socket`), except that a message that cannot be
/// decoded (truncated, an impossible length, an unknown type) gets a FATAL
/// 08P01 ErrorResponse before the connection closes; pgwire's own loop
/// closes without a word.
async fn process_connection<H: PgWireServerHandlers>(
    socket: TcpStream,
    tls: Option<TlsAcceptor>,
    handlers: H,
) -> std::io::Result<()> {
    use futures::{SinkExt, StreamExt};
    use pgwire::api::PgWireConnectionState as State;
    use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
    use pgwire::tokio::server::{negotiate_tls, process_error, process_message};

    let startup_timeout = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_timeout);
    let negotiated = tokio::select! {
        _ = &mut startup_timeout => return Ok(()),
        socket = negotiate_tls(socket, tls) => socket?,
    };
    // None: direct TLS without a certificate configured.
    let Some(mut socket) = negotiated else {
        return Ok(());
    };
    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    loop {
        let logging_in = matches!(
            socket.state(),
            State::AwaitingStartup | State::AuthenticationInProgress
        );
        let next = if logging_in {
            tokio::select! {
                _ = &mut startup_timeout => None,
                next = socket.next() => next,
            }
        } else {
            socket.next().await
        };
        let message = match next {
            Some(Ok(PgWireFrontendMessage::Terminate(_))) | None => break,
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                let info = ErrorInfo::new(
                    "FATAL".to_owned(),
                    SqlState::PROTOCOL_VIOLATION.0.to_owned(),
                    format!("invalid protocol message: {e}"),
                );
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await;
                break;
            }
        };
        let is_extended = match socket.state() {
            State::CopyInProgress(is_extended) => is_extended,
            _ => message.is_extended_query(),
        };
        if let Err(mut e) = process_message(
            message,
            &mut socket,
            Arc::clone(&startup),
            Arc::clone(&simple),
            Arc::clone(&extended),
            Arc::clone(&copy),
            Arc::clone(&cancel),
        )
        .await
        {
            errors.on_error(&socket, &mut e);
            process_error(&mut socket, e, is_extended).await?;
            if logging_in {
                // A failed login never leaves a connection open.
                break;
            }
        }
    }
    Ok(())
}

/// Watch a connection for the client going away while a statement runs (the
/// protocol reads nothing then), and cancel the statement if it does.
fn watch_disconnect(
    socket: TcpStream,
    canceller: Arc<Canceller>,
) -> std::io::Result<(TcpStream, tokio::task::JoinHandle<()>)> {
    let std_socket = socket.into_std()?;
    let watch = TcpStream::from_std(std_socket.try_clone()?)?;
    let socket = TcpStream::from_std(std_socket)?;
    let watcher = tokio::spawn(async move {
        let mut probe = [0u8; 1];
        loop {
            if watch.readable().await.is_err() {
                break;
            }
            match watch.peek(&mut probe).await {
                Ok(0) | Err(_) => {
                    canceller.cancel();
                    break;
                }
                // Data waiting for the protocol to read: look again later.
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok((socket, watcher))
}
