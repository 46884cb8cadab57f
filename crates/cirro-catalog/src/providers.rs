//! The catalog seen through DataFusion's catalog traits: databases are
//! DataFusion catalogs, schemas are schemas, and a name resolves to a
//! [`CirroTable`](cirro_storage::CirroTable) or to a view planned from its SQL.
//!
//! DDL does not go through these traits (their `register_*` methods refuse);
//! the engine changes the catalog with [`Catalog::commit`] instead, so every
//! change is persisted and atomic. The one exception is a *system schema*
//! (`pg_catalog` for PostgreSQL clients): registered on any database, it is
//! kept in memory by the session and seen in every database.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use async_trait::async_trait;
use cirro_common::CirroError;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::datasource::ViewTable;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{LogicalPlan, TableType};

use cirro_storage::CirroTable;

use crate::state::{Catalog, CatalogState, ViewEntry};

/// The tables a session has pinned while a transaction is open. Under
/// REPEATABLE READ every table is read at the version the transaction first
/// saw (snapshot isolation), with the transaction's own uncommitted changes
/// applied. Under READ COMMITTED each statement starts from the latest
/// versions, except of the tables the transaction changed through their
/// files (staged), which keep its own view; outside a transaction nothing
/// is pinned and every statement reads the latest version.
#[derive(Debug, Default)]
pub struct SessionTables {
    pinned: Mutex<Option<HashMap<String, CirroTable>>>,
    /// The pinned tables that hold the transaction's own staged changes.
    staged: Mutex<std::collections::HashSet<String>>,
    /// Whether the open transaction reads committed data per statement.
    read_committed: std::sync::atomic::AtomicBool,
    /// Past versions of tables one statement reads (time travel), by the
    /// temporary name the statement's text was rewritten to use.
    versions: Mutex<HashMap<String, CirroTable>>,
    /// The catalog as an open transaction's DDL left it (None: no DDL, the
    /// shared catalog's current state): what this session sees until
    /// COMMIT publishes it.
    overlay: Mutex<Option<Arc<CatalogState>>>,
    /// Where the running statement (in a transaction: the transaction,
    /// from its BEGIN) stands among the process's commits over several
    /// tables, which it sees whole or not at all (see `commits.rs`).
    reader: Mutex<Option<crate::commits::Reader>>,
    /// Its snapshot of the row stores and its transaction's small writes.
    pub rows: Arc<cirro_storage::rowstore::SessionRows>,
}

/// A stored view whose query no longer plans (a table or column it reads is
/// gone, as a release without dependency checks allowed): it has no columns,
/// and reading it fails with 42P17 saying why, so that it never breaks the
/// listing of the other relations.
#[derive(Debug)]
struct InvalidView {
    name: String,
    reason: String,
}

#[async_trait]
impl TableProvider for InvalidView {
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        Arc::new(arrow::datatypes::Schema::empty())
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn datafusion::catalog::Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        Err(CirroError::new(
            cirro_common::SqlState::INVALID_OBJECT_DEFINITION,
            format!(
                "view \"{}\" is invalid: {} (drop it, or create it again)",
                self.name, self.reason
            ),
        )
        .into_datafusion())
    }
}

/// Prefix of the temporary names under which past table versions are read.
pub const PAST_VERSION_PREFIX: &str = "__cirro_version_";

impl SessionTables {
    /// The catalog state this session sees: its transaction's DDL applied,
    /// or `catalog`'s current one.
    pub fn state(&self, catalog: &Catalog) -> Arc<CatalogState> {
        match self.overlay.lock().ok().and_then(|o| o.clone()) {
            Some(state) => state,
            None => catalog.snapshot(),
        }
    }

    /// Set (or with None, end) what the session's transaction's DDL made.
    pub fn set_overlay(&self, state: Option<Arc<CatalogState>>) {
        if let Ok(mut overlay) = self.overlay.lock() {
            *overlay = state;
        }
    }

    /// Make a past version of a table readable under `name` (which starts
    /// with [`PAST_VERSION_PREFIX`]) until [`Self::clear_versions`].
    pub fn add_version(&self, name: &str, table: CirroTable) {
        if let Ok(mut versions) = self.versions.lock() {
            versions.insert(name.to_string(), table);
        }
    }

    pub fn clear_versions(&self) {
        if let Ok(mut versions) = self.versions.lock() {
            versions.clear();
        }
    }

    fn version(&self, name: &str) -> Option<CirroTable> {
        self.versions.lock().ok().and_then(|v| v.get(name).cloned())
    }

    /// A statement starts: outside a transaction, and in a READ COMMITTED
    /// one, it reads the commits finished by now (there, tables not staged
    /// are pinned again as the statement first reads them); in a REPEATABLE
    /// READ one, those finished by its BEGIN.
    pub fn start_statement(&self, catalog: &Catalog) {
        if self.active() {
            if self.read_committed() {
                self.unpin_unstaged();
                self.start_reading(catalog);
            }
            return;
        }
        self.start_reading(catalog);
    }

    /// Forget the pinned tables that hold no staged change.
    fn unpin_unstaged(&self) {
        let staged = self.staged.lock().map(|s| s.clone()).unwrap_or_default();
        if let Ok(mut pinned) = self.pinned.lock()
            && let Some(map) = pinned.as_mut()
        {
            map.retain(|location, _| staged.contains(location));
        }
    }

    /// Whether a transaction is open and reads committed data per
    /// statement (READ COMMITTED).
    pub fn read_committed(&self) -> bool {
        self.active()
            && self
                .read_committed
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Change the open transaction's level before it read anything (`SET
    /// TRANSACTION ISOLATION LEVEL`): it reads the commits finished by now.
    pub fn set_read_committed(&self, catalog: &Catalog, read_committed: bool) {
        self.read_committed
            .store(read_committed, std::sync::atomic::Ordering::Relaxed);
        if self.active() {
            self.start_reading(catalog);
        }
    }

    /// A statement ended: outside a transaction it stops reading, so that
    /// an idle session does not hold back the forgetting of the commits
    /// that finished since (see `commits.rs`).
    pub fn end_statement(&self) {
        if self.active() {
            return;
        }
        if let Ok(mut current) = self.reader.lock() {
            *current = None;
        }
        self.rows.release_snapshot();
    }

    fn start_reading(&self, catalog: &Catalog) {
        let reader = catalog.multi_commits().reader();
        if let Ok(mut current) = self.reader.lock() {
            *current = Some(reader);
        }
        if let Some(service) = catalog.row_service() {
            self.rows.take_snapshot(service.snapshots());
        }
    }

    /// The epoch the session reads at (see [`Self::start_statement`]).
    pub fn epoch(&self) -> Option<u64> {
        self.reader
            .lock()
            .ok()
            .and_then(|r| r.as_ref().map(|r| r.epoch()))
    }

    /// Start pinning, and reading the commits finished by now (BEGIN), at
    /// READ COMMITTED or (`read_committed` false) REPEATABLE READ.
    pub fn begin(&self, catalog: &Catalog, read_committed: bool) {
        if let Ok(mut pinned) = self.pinned.lock() {
            *pinned = Some(HashMap::new());
        }
        if let Ok(mut staged) = self.staged.lock() {
            staged.clear();
        }
        self.read_committed
            .store(read_committed, std::sync::atomic::Ordering::Relaxed);
        self.start_reading(catalog);
    }

    /// Stop pinning and forget the pinned tables (COMMIT, ROLLBACK).
    pub fn end(&self) {
        if let Ok(mut pinned) = self.pinned.lock() {
            *pinned = None;
        }
        if let Ok(mut staged) = self.staged.lock() {
            staged.clear();
        }
        self.rows.release_snapshot();
    }

    /// Whether the transaction has read or written any table yet.
    pub fn touched_tables(&self) -> bool {
        self.pinned
            .lock()
            .map(|p| p.as_ref().is_some_and(|m| !m.is_empty()))
            .unwrap_or(false)
            || self.rows.has_pending()
    }

    pub fn active(&self) -> bool {
        self.pinned.lock().map(|p| p.is_some()).unwrap_or(false)
    }

    /// The pinned table at `location`, if any.
    /// The locations of the tables pinned now.
    pub fn pinned_locations(&self) -> Vec<String> {
        self.pinned
            .lock()
            .ok()
            .and_then(|p| p.as_ref().map(|m| m.keys().cloned().collect()))
            .unwrap_or_default()
    }

    pub fn get(&self, location: &str) -> Option<CirroTable> {
        self.pinned
            .lock()
            .ok()
            .and_then(|p| p.as_ref().and_then(|m| m.get(location).cloned()))
    }

    /// Pin `table` at `location` (replacing a pinned one) while a transaction
    /// is open; does nothing otherwise.
    pub fn set(&self, location: &str, table: CirroTable) {
        if let Ok(mut pinned) = self.pinned.lock() {
            if let Some(map) = pinned.as_mut() {
                map.insert(location.to_string(), table);
            }
        }
    }

    /// Pin `table`, the transaction's view of the table at `location` with
    /// its staged changes, for the rest of the transaction (at every
    /// isolation level).
    pub fn stage(&self, location: &str, table: CirroTable) {
        if !self.active() {
            return;
        }
        if let Ok(mut staged) = self.staged.lock() {
            staged.insert(location.to_string());
        }
        self.set(location, table);
    }
}

/// Plans the SQL of a stored view. The engine provides it (it owns the session
/// state that planning needs).
#[async_trait]
pub trait ViewPlanner: Send + Sync + std::fmt::Debug {
    async fn plan_view(&self, db: &str, schema: &str, view: &ViewEntry) -> DfResult<LogicalPlan>;
}

/// All databases of a data location.
#[derive(Debug)]
pub struct CirroCatalogList {
    catalog: Arc<Catalog>,
    planner: Arc<OnceLock<Arc<dyn ViewPlanner>>>,
    session: Arc<SessionTables>,
    system: SystemSchemas,
}

/// Schemas registered in memory (see the module docs), by name.
type SystemSchemas = Arc<RwLock<BTreeMap<String, Arc<dyn SchemaProvider>>>>;

impl CirroCatalogList {
    pub fn new(catalog: Arc<Catalog>, session: Arc<SessionTables>) -> Self {
        Self {
            catalog,
            planner: Arc::new(OnceLock::new()),
            session,
            system: Arc::default(),
        }
    }

    /// Set the view planner (once, after the session state exists).
    /// Forget the system schemas (pg_catalog, …) registered by the session.
    /// Their providers often hold the session's catalog list, which holds
    /// them: the session calls this when it ends so that the cycle does not
    /// keep both alive.
    pub fn clear_system_schemas(&self) {
        if let Ok(mut system) = self.system.write() {
            system.clear();
        }
    }

    pub fn set_view_planner(&self, planner: Arc<dyn ViewPlanner>) {
        let _ = self.planner.set(planner);
    }
}

impl CatalogProviderList for CirroCatalogList {
    fn register_catalog(
        &self,
        _name: String,
        _catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        None
    }

    fn catalog_names(&self) -> Vec<String> {
        self.session
            .state(&self.catalog)
            .databases
            .keys()
            .cloned()
            .collect()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        if !self
            .session
            .state(&self.catalog)
            .databases
            .contains_key(name)
        {
            return None;
        }
        Some(Arc::new(DatabaseProvider {
            catalog: Arc::clone(&self.catalog),
            planner: Arc::clone(&self.planner),
            session: Arc::clone(&self.session),
            system: Arc::clone(&self.system),
            db: name.to_string(),
        }))
    }
}

#[derive(Debug)]
struct DatabaseProvider {
    catalog: Arc<Catalog>,
    planner: Arc<OnceLock<Arc<dyn ViewPlanner>>>,
    session: Arc<SessionTables>,
    system: SystemSchemas,
    db: String,
}

impl CatalogProvider for DatabaseProvider {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .session
            .state(&self.catalog)
            .databases
            .get(&self.db)
            .map(|d| d.schemas.keys().cloned().collect())
            .unwrap_or_default();
        if let Ok(system) = self.system.read() {
            names.extend(system.keys().cloned());
        }
        names
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        let mut system = self
            .system
            .write()
            .map_err(|_| DataFusionError::Internal("system schemas poisoned".into()))?;
        Ok(system.insert(name.to_string(), schema))
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(schema) = self.system.read().ok().and_then(|s| s.get(name).cloned()) {
            return Some(schema);
        }
        let exists = self
            .session
            .state(&self.catalog)
            .databases
            .get(&self.db)
            .is_some_and(|d| d.schemas.contains_key(name));
        exists.then(|| {
            Arc::new(CirroSchemaProvider {
                catalog: Arc::clone(&self.catalog),
                planner: Arc::clone(&self.planner),
                session: Arc::clone(&self.session),
                db: self.db.clone(),
                schema: name.to_string(),
            }) as Arc<dyn SchemaProvider>
        })
    }
}

/// Tables and views of one schema.
#[derive(Debug)]
pub struct CirroSchemaProvider {
    catalog: Arc<Catalog>,
    planner: Arc<OnceLock<Arc<dyn ViewPlanner>>>,
    session: Arc<SessionTables>,
    db: String,
    schema: String,
}

impl CirroSchemaProvider {
    /// `table` with its row store attached, where the process keeps them.
    async fn with_rows(&self, location: &str, table: CirroTable) -> DfResult<CirroTable> {
        let Some(service) = self.catalog.row_service() else {
            return Ok(table);
        };
        let reader = service
            .reader(location, &table, &self.session.rows)
            .await
            .map_err(CirroError::into_datafusion)?;
        Ok(table.with_rows(reader))
    }
}

#[async_trait]
impl SchemaProvider for CirroSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        let snapshot = self.session.state(&self.catalog);
        match snapshot.schema(&self.db, &self.schema) {
            Ok(s) => s.tables.keys().chain(s.views.keys()).cloned().collect(),
            Err(_) => Vec::new(),
        }
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if name.starts_with(PAST_VERSION_PREFIX) {
            return Ok(self
                .session
                .version(name)
                .map(|t| Arc::new(t) as Arc<dyn TableProvider>));
        }
        let mut snapshot = self.session.state(&self.catalog);
        if snapshot.table(&self.db, &self.schema, name).is_none()
            && snapshot.view(&self.db, &self.schema, name).is_none()
            && self
                .catalog
                .refresh_from_storage()
                .await
                .map_err(CirroError::into_datafusion)?
        {
            // Written by another process; a transaction keeps its own snapshot.
            snapshot = self.session.state(&self.catalog);
        }
        if let Some(entry) = snapshot.table(&self.db, &self.schema, name) {
            if let Some(pinned) = self.session.get(&entry.location) {
                let pinned = self.with_rows(&entry.location, pinned).await?;
                return Ok(Some(Arc::new(pinned)));
            }
            let table = self
                .catalog
                .open_table_seen_at(&entry.location, self.session.epoch())
                .await
                .map_err(CirroError::into_datafusion)?
                .with_analyzed(entry.statistics.clone().map(Arc::new));
            self.session.set(&entry.location, table.clone());
            let table = self.with_rows(&entry.location, table).await?;
            return Ok(Some(Arc::new(table)));
        }
        if let Some(view) = snapshot.view(&self.db, &self.schema, name) {
            let planner = self.planner.get().ok_or_else(|| {
                DataFusionError::Internal(
                    "views cannot be planned before the session exists".into(),
                )
            })?;
            return Ok(Some(
                match planner.plan_view(&self.db, &self.schema, view).await {
                    Ok(plan) => Arc::new(ViewTable::new(plan, Some(view.sql.clone()))),
                    // Listed (information_schema, \dt) without columns; read, it
                    // says why. Dependency checks keep new views from this.
                    Err(e) => Arc::new(InvalidView {
                        name: name.to_string(),
                        reason: CirroError::from(e).message,
                    }),
                },
            ));
        }
        Ok(None)
    }

    async fn table_type(&self, name: &str) -> DfResult<Option<TableType>> {
        let snapshot = self.session.state(&self.catalog);
        if snapshot.table(&self.db, &self.schema, name).is_some() {
            Ok(Some(TableType::Base))
        } else if snapshot.view(&self.db, &self.schema, name).is_some() {
            Ok(Some(TableType::View))
        } else {
            Ok(None)
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        if name.starts_with(PAST_VERSION_PREFIX) {
            return self.session.version(name).is_some();
        }
        let snapshot = self.session.state(&self.catalog);
        snapshot.table(&self.db, &self.schema, name).is_some()
            || snapshot.view(&self.db, &self.schema, name).is_some()
    }
}
