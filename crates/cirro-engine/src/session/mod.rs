//! One session: the [`Engine`] value a front end holds per connection, its
//! DataFusion session over the Cirro catalog, its settings
//! (`settings.rs`), its transaction (`txn.rs`), its prepared statements
//! (`prepared.rs`) and the SQL functions it registers (`functions.rs`).

pub(crate) mod functions;
pub(crate) mod prepared;
pub(crate) mod settings;
pub(crate) mod txn;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cirro_catalog::{Catalog, CirroCatalogList, DEFAULT_DATABASE, SessionTables};
use cirro_common::Result;
use cirro_exec::resources::SessionMemory;
use cirro_sql::Parsed;
use cirro_storage::StorageRoot;
use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;

use crate::node::Node;
use crate::system::{self, activity, queries, visibility};
use crate::{planner, statement};

/// How a process's engine is set up.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// Parallelism of query execution (DataFusion `target_partitions`); all
    /// cores when unset.
    pub target_partitions: Option<usize>,
    /// The database names resolve in (default `cirro`).
    pub database: Option<String>,
    /// The DataFusion runtime (memory pool, Parquet metadata and statistics
    /// caches) to share with other sessions of the process; a new one when
    /// unset. A server shares one: each runtime's caches may hold ~70 MB.
    pub runtime: Option<Arc<RuntimeEnv>>,
    /// How the process was started (`--data`, `--pg-port`, …): shown by
    /// `SHOW cirro.<name>` and `SHOW ALL`, read-only.
    pub flags: Arc<Vec<Flag>>,
    /// A cluster node's distributed execution (none on a single node).
    pub distribution: Option<Arc<dyn cirro_exec::distribution::Distribution>>,
    /// The node the session runs on: its memory, tiers, kernels and GPU
    /// (see `node.rs`); a new default node when unset.
    pub node: Arc<Node>,
}

/// One command-line flag of the process, as a read-only setting.
#[derive(Clone, Debug)]
pub struct Flag {
    /// The setting's name (`cirro.pg_port`).
    pub name: &'static str,
    pub value: String,
    pub description: &'static str,
}

/// A session's counts of parser runs and plannings (`SHOW cirro.parses`,
/// `SHOW cirro.plans`): tests assert with them that a statement is parsed
/// once and a prepared statement planned once.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) parses: AtomicU64,
    pub(crate) plans: AtomicU64,
    /// Rows computed by key or from VALUES without the planner
    /// (`statement/by_key.rs`).
    pub(crate) by_key: AtomicU64,
    /// Executions of prepared statements run from their compiled form
    /// (`by_key::Compiled`).
    pub(crate) compiled: AtomicU64,
}

/// The engine of one session: one catalog, one DataFusion session.
pub struct Engine {
    pub(crate) catalog: Arc<Catalog>,
    /// The session's view of the databases (DataFusion's catalog list).
    pub(crate) catalogs: Arc<CirroCatalogList>,
    pub(crate) ctx: SessionContext,
    /// Tables pinned by the open transaction, if any.
    pub(crate) session: Arc<SessionTables>,
    /// The transaction (see `txn.rs`).
    pub(crate) txn: std::sync::Mutex<txn::TxnState>,
    /// The user the session runs as; None for the local shell (see `access`).
    pub(crate) user: Option<String>,
    /// The session's changes to the PostgreSQL settings.
    pub(crate) settings: settings::Settings,
    pub(crate) counters: Counters,
    pub(crate) flags: Arc<Vec<Flag>>,
    /// The cluster's distributed execution, on a cluster node.
    pub(crate) distribution: Option<Arc<dyn cirro_exec::distribution::Distribution>>,
    /// Statements PREPAREd in SQL, by name.
    pub(crate) sql_prepared:
        std::sync::Mutex<std::collections::HashMap<String, Arc<prepared::Prepared>>>,
    /// The session's entry in the server's registry (none in the shell).
    pub(crate) backend: Arc<std::sync::OnceLock<activity::Backend>>,
    /// The session's memory pool: each statement's own pool in the
    /// server's budget (see `cirro_exec::resources`).
    pub(crate) memory: Arc<SessionMemory>,
    /// The record of the statement it runs (see `queries`).
    pub(crate) current_query: queries::QuerySlot,
    /// The running statement's admission ticket, which a wait for a lock
    /// gives up (`Engine::wait_for`).
    pub(crate) admitted: std::sync::Mutex<Option<cirro_exec::resources::Ticket>>,
    /// The node the session runs on.
    pub(crate) node: Arc<Node>,
    /// The session's DataFusion options as it started: what `RESET` of a
    /// dotted setting returns to.
    pub(crate) initial_options: Arc<datafusion::config::ConfigOptions>,
}

/// A session's DataFusion runtime: `shared`'s caches and object stores (a
/// new runtime's without one) and the node's spill area, with a memory pool
/// of the session's own in the node's budget.
fn session_runtime(
    shared: Option<&Arc<RuntimeEnv>>,
    node: &Node,
) -> (Arc<RuntimeEnv>, Arc<SessionMemory>) {
    let resources = node.resources();
    let memory = Arc::new(SessionMemory::new(Arc::clone(resources.budget())));
    let mut runtime = match shared {
        Some(runtime) => RuntimeEnv::clone(runtime),
        None => RuntimeEnv::default(),
    };
    runtime.memory_pool = Arc::clone(&memory) as _;
    match resources.spill() {
        Ok(area) => runtime.disk_manager = Arc::clone(area.disk_manager()),
        Err(e) => log::warn!("no spill area, queries spill to DataFusion's default: {e}"),
    }
    (Arc::new(runtime), memory)
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.catalogs.clear_system_schemas();
    }
}

impl Engine {
    /// Open the data location `data` (a path or URL), creating it if new.
    pub async fn open(data: &str, config: EngineConfig) -> Result<Self> {
        let root = StorageRoot::open_with(data, config.node.disk())?;
        let catalog = Catalog::open(root).await?;
        Ok(Self::with_catalog(catalog, config, None))
    }

    /// A session over an open catalog (shared by the sessions of a server),
    /// running as `user` (None: unrestricted, see `access`).
    pub fn with_catalog(catalog: Arc<Catalog>, config: EngineConfig, user: Option<String>) -> Self {
        let session = Arc::new(SessionTables::default());
        let list = Arc::new(CirroCatalogList::new(
            Arc::clone(&catalog),
            Arc::clone(&session),
        ));
        let (runtime, memory) = session_runtime(config.runtime.as_ref(), &config.node);
        let current_query = queries::QuerySlot::default();
        let state = planner::session_state(&config, &list, runtime, &current_query);
        let superuser = statement::access::SuperuserCheck::new(Arc::clone(&catalog), user.clone());
        let ctx =
            functions::enable_url_tables(SessionContext::new_with_state(state), superuser.clone());
        // Data files are read through the data location's store (a bucket's
        // for s3://; local files are known to DataFusion already).
        let root = catalog.root();
        if root.url().scheme() != "file" {
            ctx.register_object_store(root.url(), Arc::clone(root.store()));
        }
        functions::register(&ctx, &superuser);
        for udf in cirro_exec::functions::sized::sized_udfs(&memory) {
            ctx.register_udf(udf);
        }
        functions::register_identity(
            &ctx,
            &functions::session_user_name(user.as_deref()),
            config.database.as_deref().unwrap_or(DEFAULT_DATABASE),
        );
        list.set_view_planner(Arc::new(statement::views::SessionViewPlanner::for_context(
            &ctx,
        )));
        let backend: Arc<std::sync::OnceLock<activity::Backend>> = Default::default();
        // The system schemas are shared by every database of the session.
        let any_database = catalog.snapshot().databases.keys().next().cloned();
        if let Some(provider) = any_database.and_then(|db| ctx.catalog(&db)) {
            let _ = provider.register_schema(
                system::SYSTEM_SCHEMA,
                Arc::new(system::SystemSchema {
                    catalog: Arc::clone(&catalog),
                    backend: Arc::clone(&backend),
                    viewer: visibility::StatementViewer::new(Arc::clone(&catalog), user.clone()),
                    node: Arc::clone(&config.node),
                }),
            );
        }
        let initial_options = Arc::clone(ctx.state_ref().read().config().options());
        let engine = Self {
            catalog,
            catalogs: list,
            ctx,
            session,
            txn: std::sync::Mutex::new(txn::TxnState::Idle),
            user,
            settings: settings::Settings::default(),
            counters: Counters::default(),
            flags: Arc::clone(&config.flags),
            distribution: config.distribution.clone(),
            sql_prepared: Default::default(),
            backend,
            memory,
            current_query,
            admitted: Default::default(),
            node: Arc::clone(&config.node),
            initial_options,
        };
        engine.apply_user_settings();
        engine
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The node the session runs on.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Parse one statement (see `cirro_sql::parse`); the session counts the
    /// parser runs.
    /// A statement that does not parse fails the open transaction when its
    /// error is reported (by the caller, or by [`Engine::execute`]).
    pub fn parse(&self, sql: &str) -> Result<Parsed> {
        let parsed = cirro_sql::parse(sql)?;
        self.counters
            .parses
            .fetch_add(parsed.parses, Ordering::Relaxed);
        Ok(parsed)
    }

    /// Resolve a (possibly qualified) name against the session defaults.
    pub(crate) fn resolve(
        &self,
        name: &datafusion::common::TableReference,
    ) -> (String, String, String) {
        // A read of the state, not a copy of it (`state()` clones every
        // registry: a tenth of a prepared point read's time).
        let state = self.ctx.state_ref();
        let state = state.read();
        let options = state.config().options();
        let resolved = name.clone().resolve(
            &options.catalog.default_catalog,
            &options.catalog.default_schema,
        );
        (
            resolved.catalog.to_string(),
            resolved.schema.to_string(),
            resolved.table.to_string(),
        )
    }

    pub(crate) fn default_database(&self) -> String {
        self.ctx
            .state_ref()
            .read()
            .config()
            .options()
            .catalog
            .default_catalog
            .clone()
    }
}
