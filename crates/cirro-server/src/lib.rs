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
//!
//! [`serve`] builds the node (TLS once in `tls.rs`, listeners, cluster
//! membership in `node.rs`, the catalog) and starts each front end from its
//! folder: `pg/` (the accept loop in `pg/server.rs`), `flight/`,
//! `console/`.

mod admin;
mod console;
mod flight;
mod http_client;
mod node;
mod pg;
mod session;
mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cirro_catalog::Catalog;
use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::EngineConfig;
use cirro_storage::StorageRoot;
use datafusion::execution::runtime_env::RuntimeEnv;
use pgwire::api::RandomPidSecretKeyGenerator;
use pgwire::api::auth::DefaultServerParameterProvider;
use tokio::net::TcpListener;

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
    /// Keep small writes in row stores behind a write-ahead log (None:
    /// every write commits to the table's files).
    pub row_store: Option<cirro_catalog::rows::RowStoreConfig>,
    /// Start without row stores where another process holds the log
    /// (`--row-store auto`) rather than fail.
    pub row_store_optional: bool,
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
    /// The state every connection of the node shares.
    fn new(
        catalog: Arc<Catalog>,
        config: &ServerConfig,
        runtime: Arc<RuntimeEnv>,
        member: Option<&node::Member>,
    ) -> Result<Shared> {
        let mut parameters = DefaultServerParameterProvider::default();
        parameters.server_version = cirro_engine::SERVER_VERSION.to_string();
        parameters.time_zone = "UTC".to_string();
        parameters.date_style = "ISO, MDY".to_string();
        Ok(Shared {
            catalog,
            engine: EngineConfig {
                // One runtime for all sessions: shared Parquet metadata and
                // statistics caches (bounded once, not per connection) and
                // one memory pool.
                runtime: Some(runtime),
                distribution: member.map(|m| Arc::clone(&m.distribution)),
                ..config.engine.clone()
            },
            require_tls: config.require_tls,
            parameters: Arc::new(parameters),
            pids: RandomPidSecretKeyGenerator::default(),
            // Pids and query ids carry the node's number in the cluster.
            activity: cirro_engine::activity::Activity::new(
                member.map_or(0, |m| m.cluster.me().number),
            )?,
            sessions: Mutex::new(HashMap::new()),
        })
    }

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

/// Bind `host:port` (port 0 picks a free one); returns the listener and the
/// address it got.
pub(crate) async fn listen(
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

/// Run the server until interrupted (Ctrl-C or SIGTERM): build the node
/// (TLS, listeners, cluster membership, catalog), start each front end
/// (console, Flight SQL), announce the addresses, take PostgreSQL
/// connections, then drain.
pub async fn serve(config: ServerConfig) -> Result<()> {
    let root = StorageRoot::open_with(&config.data, config.engine.node.disk())?;
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls::Tls::load(cert, key)?),
        None => None,
    };
    if config.require_tls && tls.is_none() {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "--require-tls needs --tls-cert and --tls-key",
        ));
    }
    let (listener, pg_local) = listen(&config.listen, config.pg_port, "").await?;
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
    let member = match &config.cluster {
        Some(options) => {
            let at = node::Addresses {
                listen: config.listen.clone(),
                pg: pg_local,
                flight: flight_local,
                http: http.as_ref().map(|(_, a)| *a),
            };
            Some(node::Member::join(options, &root, &at, &runtime, &config.engine.node).await?)
        }
        None => None,
    };
    let catalog = match &member {
        Some(member) => Catalog::open_in_cluster(root, Arc::clone(&member.cluster) as _).await?,
        None => Catalog::open(root).await?,
    };
    bootstrap(&catalog).await?;
    let flusher = match &config.row_store {
        Some(rows) => match catalog.enable_row_store(rows).await {
            Ok(()) => Some(cirro_engine::rows::spawn_flusher(Arc::downgrade(&catalog))),
            // `--row-store auto` beside a server that holds the log.
            Err(e) if config.row_store_optional && e.state == SqlState::LOCK_NOT_AVAILABLE => {
                eprintln!(
                    "cirro: {}; this server writes every statement through the tables' files \
                     (--row-store off), and sees the other's small writes once it flushes them",
                    e.message
                );
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let shared = Arc::new(Shared::new(catalog, &config, runtime, member.as_ref())?);
    let monitor = console::monitor::Monitor::start(
        Arc::clone(&shared.activity),
        Arc::clone(&config.engine.node),
        console::monitor::SlowLog {
            threshold: config.slow_query,
            file: config.slow_query_log.clone(),
        },
    );
    if let Some(member) = &member {
        member.start_reporting(
            &shared,
            tls.as_ref().map(|t| t.cert_path.as_str()),
            &monitor,
        )?;
    }
    let http_local = match http {
        Some((listener, local)) => {
            console::spawn(
                Arc::clone(&shared),
                console::ConsoleSetup {
                    listener,
                    tls: tls.as_ref().map(|t| t.acceptor.clone()),
                    cluster: member.as_ref().map(|m| Arc::clone(&m.cluster)),
                    secret: member.as_ref().map(|m| m.secret.clone()),
                    monitor,
                },
            )?;
            Some(local)
        }
        None => None,
    };
    flight::spawn(flight_listener, Arc::clone(&shared), tls.as_ref())?;
    announce(pg_local, flight_local, http_local, tls.is_some());
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CirroError::io(e.to_string()))?;
    if let Some(member) = &member {
        use std::io::Write as _;
        println!(
            "cirro: node \"{}\" joined the cluster at {}",
            cirro_catalog::Coordination::node_id(member.cluster.as_ref()),
            member.cluster.servers()
        );
        let _ = std::io::stdout().flush();
    }
    pg::server::accept(
        listener,
        Arc::clone(&shared),
        tls.map(|t| t.acceptor),
        terminate,
    )
    .await;
    if let (Some(member), Some(options)) = (&member, &config.cluster) {
        node::drain(
            &member.cluster,
            &shared,
            &member.worker_tasks,
            options.drain_timeout,
        )
        .await;
    }
    if let Some(flusher) = flusher {
        flusher.abort();
        // What the row stores hold goes into the tables' files, so that
        // other engines see it; the log keeps it either way.
        cirro_engine::rows::flush_now(&shared.catalog).await;
    }
    eprintln!("cirro: shutting down");
    Ok(())
}

/// Print the addresses the front ends listen on. All listen before any is
/// announced (the tests read these lines), and the lines go out in one
/// write: a reader that stops after the first two cannot make a later line
/// fail.
fn announce(
    pg: std::net::SocketAddr,
    flight: std::net::SocketAddr,
    http: Option<std::net::SocketAddr>,
    tls: bool,
) {
    use std::io::Write as _;
    let tls_note = if tls { " (TLS)" } else { "" };
    let mut announce = format!(
        "cirro: PostgreSQL protocol on {pg}{tls_note}\ncirro: Arrow Flight SQL on {flight}{tls_note}\n"
    );
    if let Some(http) = http {
        let scheme = if tls { "https" } else { "http" };
        announce.push_str(&format!("cirro: web console on {scheme}://{http}/\n"));
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(announce.as_bytes());
    let _ = stdout.flush();
}
