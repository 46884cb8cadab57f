//! Catalog snapshots and the commit protocol (see the crate docs).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use cirro_common::limits::{CATALOG_COMMIT_RETRIES_MAX, CATALOG_VERSIONS_KEPT};
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::{CirroTable, StorageRoot};
use serde::{Deserialize, Serialize};

use crate::coordination::{Coordination, HeldLock};
use crate::users::{Grants, UserEntry};
use crate::versions::{FileVersions, VersionStore};

pub const DEFAULT_DATABASE: &str = "cirro";
pub const DEFAULT_SCHEMA: &str = "public";
const FORMAT_VERSION: u32 = 1;

/// One immutable version of the catalog.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CatalogState {
    pub format: u32,
    pub version: u64,
    pub databases: BTreeMap<String, DatabaseEntry>,
    /// Users of the server (`cirro serve`), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub users: BTreeMap<String, UserEntry>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DatabaseEntry {
    pub schemas: BTreeMap<String, SchemaEntry>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SchemaEntry {
    pub tables: BTreeMap<String, TableEntry>,
    pub views: BTreeMap<String, ViewEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TableEntry {
    /// Directory of the Delta table, relative to the data location.
    pub location: String,
    pub created_ms: i64,
    /// The user who created the table (None: created without a user, by
    /// the local shell). The owner holds every privilege on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Privileges granted to other users.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: Grants,
    /// What the last `ANALYZE` of the table found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<cirro_storage::stats::TableStatistics>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ViewEntry {
    /// The view's query, as SQL text.
    pub sql: String,
    /// Column names given in `CREATE VIEW v (a, b) AS …`, if any.
    #[serde(default)]
    pub columns: Vec<String>,
    pub created_ms: i64,
    /// The user who created the view (None: the local shell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl CatalogState {
    fn initial() -> Self {
        let mut databases = BTreeMap::new();
        databases.insert(DEFAULT_DATABASE.to_string(), DatabaseEntry::with_public());
        Self {
            format: FORMAT_VERSION,
            version: 0,
            databases,
            users: BTreeMap::new(),
        }
    }

    pub fn database(&self, db: &str) -> Result<&DatabaseEntry> {
        self.databases.get(db).ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_CATALOG_NAME,
                format!("database \"{db}\" does not exist"),
            )
        })
    }

    pub fn schema(&self, db: &str, schema: &str) -> Result<&SchemaEntry> {
        self.database(db)?.schemas.get(schema).ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_SCHEMA_NAME,
                format!("schema \"{db}.{schema}\" does not exist"),
            )
        })
    }

    pub fn schema_mut(&mut self, db: &str, schema: &str) -> Result<&mut SchemaEntry> {
        let database = self.databases.get_mut(db).ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_CATALOG_NAME,
                format!("database \"{db}\" does not exist"),
            )
        })?;
        database.schemas.get_mut(schema).ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_SCHEMA_NAME,
                format!("schema \"{db}.{schema}\" does not exist"),
            )
        })
    }

    pub fn table(&self, db: &str, schema: &str, name: &str) -> Option<&TableEntry> {
        self.databases
            .get(db)?
            .schemas
            .get(schema)?
            .tables
            .get(name)
    }

    pub fn view(&self, db: &str, schema: &str, name: &str) -> Option<&ViewEntry> {
        self.databases.get(db)?.schemas.get(schema)?.views.get(name)
    }
}

impl DatabaseEntry {
    pub fn with_public() -> Self {
        let mut schemas = BTreeMap::new();
        schemas.insert(DEFAULT_SCHEMA.to_string(), SchemaEntry::default());
        Self { schemas }
    }
}

impl SchemaEntry {
    /// Whether `name` is taken by a table or a view.
    pub fn relation_exists(&self, name: &str) -> bool {
        self.tables.contains_key(name) || self.views.contains_key(name)
    }
}

/// The catalog of one data location, shared by all sessions of a process.
#[derive(Debug)]
pub struct Catalog {
    root: StorageRoot,
    /// The catalog's versions and which is current (files on `root` today).
    versions: Arc<dyn VersionStore>,
    current: RwLock<Arc<CatalogState>>,
    /// Opened tables by location, reused while their Delta version is unchanged.
    open_tables: Mutex<HashMap<String, CirroTable>>,
    /// Write locks by table location (see [`Catalog::write_lock`]).
    write_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The cluster's coordination service (None: a single node).
    coordination: Option<Arc<dyn Coordination>>,
    /// Whether the last refresh could not reach the coordination service
    /// (the snapshot may be behind the cluster's).
    stale: std::sync::atomic::AtomicBool,
    /// When this cluster member last listed the catalog's versions on the
    /// storage itself (see [`Catalog::refresh`]).
    listed: Mutex<Option<std::time::Instant>>,
    /// This process's commits and their readers.
    multi: crate::commits::MultiCommits,
    /// Registers this process's commits to the location's tables in `multi`
    /// while the catalog lives.
    _watch: Arc<dyn cirro_storage::write::CommitWatch>,
    /// The tables' row stores, where this process keeps them (see `rows.rs`).
    rows: std::sync::OnceLock<Arc<crate::rows::RowService>>,
}

/// This process's commits to the tables of one data location, registered
/// in its catalog's [`crate::commits::MultiCommits`] as they land.
#[derive(Debug)]
struct WatchedLocation {
    /// The data location's URL (a table's directory URL starts with it).
    root: String,
    multi: crate::commits::MultiCommits,
}

impl cirro_storage::write::CommitWatch for WatchedLocation {
    fn landing(&self, url: &str, after: i64) -> Option<Box<dyn cirro_storage::write::Landing>> {
        let location = url.strip_prefix(&self.root)?.trim_matches('/').to_string();
        let ticket = self.multi.landing(&location, after);
        Some(Box::new(LandingCommit {
            ticket,
            location,
            multi: self.multi.clone(),
        }))
    }
}

struct LandingCommit {
    ticket: crate::commits::CommitTicket,
    location: String,
    multi: crate::commits::MultiCommits,
}

impl cirro_storage::write::Landing for LandingCommit {
    fn landed(self: Box<Self>, version: Option<i64>) {
        let LandingCommit {
            ticket,
            location,
            multi,
        } = *self;
        multi.landed(ticket, &location, version);
    }
}

/// How often a cluster member lists the catalog's versions on the storage
/// beside reading the published number (versions another process wrote
/// into the data location are not published).
const LIST_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Directory (under a local data root) of the tables' write-lock files.
const LOCK_DIR: &str = "_cirro_locks";

/// A held table write lock (see [`Catalog::lock_table_writes`]); dropping
/// it releases the lock.
pub struct TableWriteGuard {
    _cluster: Option<HeldLock>,
    _file: Option<std::fs::File>,
    _local: tokio::sync::OwnedMutexGuard<()>,
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Catalog {
    /// Open the catalog of `root`, creating the initial version (database
    /// `cirro`, schema `public`) on a new data location.
    pub async fn open(root: StorageRoot) -> Result<Arc<Self>> {
        let versions = Arc::new(FileVersions::new(root.clone()));
        Self::open_with(root, versions).await
    }

    /// Open the catalog of `root` whose versions `versions` keeps.
    pub async fn open_with(
        root: StorageRoot,
        versions: Arc<dyn VersionStore>,
    ) -> Result<Arc<Self>> {
        Self::open_inner(root, versions, None).await
    }

    /// Open the catalog of `root` as a member of a cluster: the current
    /// version's number comes from `coordination`, changes take its lock.
    pub async fn open_in_cluster(
        root: StorageRoot,
        coordination: Arc<dyn Coordination>,
    ) -> Result<Arc<Self>> {
        let versions = Arc::new(FileVersions::new(root.clone()));
        let stored = versions.latest().await?;
        // A location written by a single node (or a change whose publication
        // was lost with its node) has versions newer than the published one.
        if coordination.catalog_version().await?.unwrap_or(0) < stored {
            coordination.publish_catalog_version(stored).await?;
        }
        Self::open_inner(root, versions, Some(coordination)).await
    }

    async fn open_inner(
        root: StorageRoot,
        versions: Arc<dyn VersionStore>,
        coordination: Option<Arc<dyn Coordination>>,
    ) -> Result<Arc<Self>> {
        let multi = crate::commits::MultiCommits::default();
        let watch: Arc<dyn cirro_storage::write::CommitWatch> = Arc::new(WatchedLocation {
            root: root.url().as_str().to_string(),
            multi: multi.clone(),
        });
        cirro_storage::write::watch_commits(Arc::downgrade(&watch));
        let catalog = Arc::new(Self {
            root,
            versions,
            current: RwLock::new(Arc::new(CatalogState::initial())),
            open_tables: Mutex::new(HashMap::new()),
            write_locks: Mutex::new(HashMap::new()),
            coordination,
            stale: Default::default(),
            listed: Mutex::new(None),
            multi,
            _watch: watch,
            rows: std::sync::OnceLock::new(),
        });
        catalog.refresh().await?;
        catalog.recover_transactions().await?;
        if catalog.snapshot().version == 0 {
            // First start on this location: write version 1. Losing the race to
            // another process is fine; its version 1 is the same.
            catalog.commit(|_| Ok(())).await?;
        }
        Ok(catalog)
    }

    pub fn root(&self) -> &StorageRoot {
        &self.root
    }

    /// Keep the tables' small writes in row stores behind a write-ahead log
    /// (see `rows.rs`): opens the log and applies what it holds. 0A000 on a
    /// cluster member (its writes go through the table files).
    pub async fn enable_row_store(&self, config: &crate::rows::RowStoreConfig) -> Result<()> {
        if self.coordination.is_some() {
            return Err(CirroError::unsupported(
                "row stores are not kept on a cluster yet; start without --row-store",
            ));
        }
        if self.rows.get().is_some() {
            return Ok(());
        }
        let service = crate::rows::RowService::open(self, config).await?;
        let _ = self.rows.set(service);
        Ok(())
    }

    /// The row stores, if this process keeps them.
    pub fn row_service(&self) -> Option<&Arc<crate::rows::RowService>> {
        self.rows.get()
    }

    /// The cluster's coordination service (None on a single node).
    pub fn coordination(&self) -> Option<&Arc<dyn Coordination>> {
        self.coordination.as_ref()
    }

    /// Whether the last refresh could not reach the cluster's coordination
    /// service, so that the snapshot may miss the newest changes.
    pub fn is_stale(&self) -> bool {
        self.stale.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The catalog as last read.
    pub fn snapshot(&self) -> Arc<CatalogState> {
        match self.current.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn set_current(&self, state: CatalogState) {
        let mut guard = match self.current.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if state.version >= guard.version {
            *guard = Arc::new(state);
        }
    }

    async fn read_version(&self, version: u64) -> Result<CatalogState> {
        let bytes = self.versions.read(version).await?;
        let state: CatalogState = serde_json::from_slice(&bytes)?;
        if state.format > FORMAT_VERSION {
            return Err(CirroError::unsupported(format!(
                "the catalog was written by a newer Cirro (format {})",
                state.format
            )));
        }
        if state.version != version {
            return Err(CirroError::internal(format!(
                "catalog version {version} holds version {}",
                state.version
            )));
        }
        Ok(state)
    }

    /// Read the latest catalog version if another process committed one. In
    /// a cluster whose coordination service cannot be reached, the newest on
    /// the storage (see [`Catalog::is_stale`]).
    pub async fn refresh(&self) -> Result<Arc<CatalogState>> {
        let latest = match &self.coordination {
            None => self.versions.latest_after(self.snapshot().version).await?,
            Some(coordination) => match coordination.catalog_version().await {
                Ok(published) => {
                    self.stale
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    match published {
                        Some(version) if !self.list_due() => version,
                        Some(version) => {
                            // Another process (`cirro load --data`, `cirro sql
                            // --data`) may have written a newer version without
                            // publishing it: a replaced table's old files are
                            // gone, and its cached chunks must not answer.
                            let stored = self.versions.latest().await?;
                            if stored > version
                                && let Err(e) = coordination.publish_catalog_version(stored).await
                            {
                                log::warn!(
                                    "catalog version {stored} found on the storage but not published: {e}"
                                );
                            }
                            stored.max(version)
                        }
                        None => self.versions.latest().await?,
                    }
                }
                Err(e) => {
                    // The snapshots on the storage are authoritative (the
                    // published number only saves listing them): read the
                    // newest there, or keep the last one read.
                    if !self.stale.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        log::warn!("reading the catalog from the storage: {e}");
                    }
                    match self.versions.latest().await {
                        Ok(latest) => latest,
                        Err(_) => return Ok(self.snapshot()),
                    }
                }
            },
        };
        self.read_latest(latest).await
    }

    /// Whether a cluster member lists the storage's versions now (at most
    /// once per [`LIST_EVERY`]).
    fn list_due(&self) -> bool {
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        let due = listed.is_none_or(|at| at.elapsed() >= LIST_EVERY);
        if due {
            *listed = Some(std::time::Instant::now());
        }
        due
    }

    /// Read the newest catalog version on the storage itself. In a cluster
    /// [`Catalog::refresh`] reads only the number the members published, so
    /// versions that another process wrote into the data location (`cirro
    /// load --data`, `cirro sql --data` beside a running cluster) stay unseen
    /// until a member's next DDL; a name that is not found comes here before
    /// it is an error. A newer version found is published for the other
    /// members (best effort: they find it the same way). Whether the
    /// snapshot moved.
    pub async fn refresh_from_storage(&self) -> Result<bool> {
        let before = self.snapshot().version;
        let latest = self.versions.latest().await?;
        if latest <= before {
            return Ok(false);
        }
        self.read_latest(latest).await?;
        if let Some(coordination) = &self.coordination
            && let Err(e) = coordination.publish_catalog_version(latest).await
        {
            log::warn!("catalog version {latest} found on the storage but not published: {e}");
        }
        Ok(self.snapshot().version > before)
    }

    async fn read_latest(&self, latest: u64) -> Result<Arc<CatalogState>> {
        if latest > self.snapshot().version {
            let state = self.read_version(latest).await?;
            self.set_current(state);
        }
        Ok(self.snapshot())
    }

    /// Apply `change` to the latest catalog and commit it as the next version.
    /// `change` may run several times (after losing a race); it must be pure.
    pub async fn commit<F>(&self, mut change: F) -> Result<Arc<CatalogState>>
    where
        F: FnMut(&mut CatalogState) -> Result<()>,
    {
        // In a cluster, changes are serialized by the cluster's lock and
        // read the newest version from the storage (authoritative: the
        // published number may lag a change whose node died publishing).
        let _held = match &self.coordination {
            Some(coordination) => Some(coordination.lock("catalog").await?),
            None => None,
        };
        for _ in 0..CATALOG_COMMIT_RETRIES_MAX {
            let base = self.read_latest(self.versions.latest().await?).await?;
            let mut next = (*base).clone();
            change(&mut next)?;
            next.version = base.version + 1;
            let body = serde_json::to_vec_pretty(&next)?;
            if self.versions.create(next.version, body.into()).await? {
                let version = next.version;
                self.set_current(next);
                if let Some(coordination) = &self.coordination {
                    // The change is durable; if publishing fails the other
                    // nodes see it with the next change (or restart).
                    if let Err(e) = coordination.publish_catalog_version(version).await {
                        log::warn!("catalog version {version} written but not published: {e}");
                    }
                }
                self.remove_old_versions(version).await;
                return Ok(self.snapshot());
            }
        }
        Err(CirroError::new(
            SqlState::SERIALIZATION_FAILURE,
            "the catalog is changing too fast; try the statement again",
        ))
    }

    async fn remove_old_versions(&self, latest: u64) {
        if latest <= CATALOG_VERSIONS_KEPT {
            return;
        }
        // Best effort: one old version per commit keeps the store bounded.
        self.versions.remove(latest - CATALOG_VERSIONS_KEPT).await;
    }

    /// A new directory for table `name`, relative to the data location.
    pub fn new_table_location(db: &str, schema: &str, name: &str) -> String {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let id = uuid::Uuid::new_v4().simple().to_string();
        format!(
            "data/{}/{}/{}-{}",
            sanitize(db),
            sanitize(schema),
            safe,
            &id[..12]
        )
    }

    /// Open the table stored at `location`, reusing an open snapshot while the
    /// table's Delta version is unchanged.
    pub async fn open_table(&self, location: &str) -> Result<CirroTable> {
        let cached = self
            .open_tables
            .lock()
            .ok()
            .and_then(|m| m.get(location).cloned());
        if let Some(table) = cached
            && is_latest(&table).await
        {
            return Ok(table);
        }
        let table = CirroTable::open(&self.root.dir_url(location)?).await?;
        if let Ok(mut map) = self.open_tables.lock() {
            map.insert(location.to_string(), table.clone());
        }
        Ok(table)
    }

    fn write_lock(&self, location: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .write_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(location.to_string()).or_default())
    }

    fn intent_path(&self, id: &str) -> object_store::path::Path {
        self.root
            .path(&format!("{}/{id}.json", crate::commits::INTENT_DIR))
    }

    /// Write `intent` (see `commits.rs`) before its first table's commit.
    pub async fn write_intent(&self, intent: &crate::commits::Intent) -> Result<()> {
        use object_store::ObjectStoreExt;
        let path = self.intent_path(&intent.id);
        let body = serde_json::to_vec(intent)?;
        self.root
            .store()
            .put(&path, body.into())
            .await
            .map_err(|e| CirroError::io(format!("cannot write {path}: {e}")))?;
        Ok(())
    }

    /// Remove the intent of transaction `id`: it is all in, or all out.
    pub async fn remove_intent(&self, id: &str) {
        use object_store::ObjectStoreExt;
        let path = self.intent_path(id);
        if let Err(e) = self.root.store().delete(&path).await {
            log::warn!("the intent {path} stays (recovery finds it done): {e}");
        }
    }

    /// Finish the commits over several tables that a crash left part-way
    /// (see `commits.rs`). Run when a process opens the data location.
    pub async fn recover_transactions(&self) -> Result<()> {
        use futures::TryStreamExt;
        use object_store::ObjectStoreExt;
        let dir = self.root.path(crate::commits::INTENT_DIR);
        let listed: Vec<object_store::ObjectMeta> =
            match self.root.store().list(Some(&dir)).try_collect().await {
                Ok(listed) => listed,
                Err(object_store::Error::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(CirroError::io(format!("cannot list {dir}: {e}"))),
            };
        for meta in listed {
            let body = self
                .root
                .store()
                .get(&meta.location)
                .await
                .map_err(|e| CirroError::io(format!("cannot read {}: {e}", meta.location)))?
                .bytes()
                .await
                .map_err(|e| CirroError::io(format!("cannot read {}: {e}", meta.location)))?;
            let intent: crate::commits::Intent = match serde_json::from_slice(&body) {
                Ok(intent) => intent,
                Err(e) => {
                    // Written whole before any commit: a torn one never
                    // had a commit of its own.
                    log::warn!("{} is not an intent ({e}): removed", meta.location);
                    let _ = self.root.store().delete(&meta.location).await;
                    continue;
                }
            };
            match self.recover_transaction(&intent).await {
                Ok(()) => {
                    let _ = self.root.store().delete(&meta.location).await;
                }
                // Kept: the next process to open the location tries again.
                Err(e) => log::error!(
                    "a transaction over several tables left part-way by a crash \
                     ({}) is neither finished nor undone: {e}",
                    meta.location
                ),
            }
        }
        Ok(())
    }

    async fn recover_transaction(&self, intent: &crate::commits::Intent) -> Result<()> {
        let mut locations: Vec<&str> = intent.tables.iter().map(|t| t.location.as_str()).collect();
        locations.sort();
        let mut held = Vec::with_capacity(locations.len());
        for location in locations {
            held.push(self.lock_table_writes(location).await?);
        }
        // A live committer holds these locks from before its intent to
        // after its removal: an intent gone by now was finished there.
        {
            use object_store::ObjectStoreExt;
            let path = self.intent_path(&intent.id);
            if let Err(object_store::Error::NotFound { .. }) = self.root.store().head(&path).await {
                return Ok(());
            }
        }
        let mut tables = Vec::with_capacity(intent.tables.len());
        for table in &intent.tables {
            let open = CirroTable::open(&self.root.dir_url(&table.location)?).await?;
            let done =
                cirro_storage::write::committed_by(open.delta(), table.after, &intent.id).await?;
            tables.push((table, open, done));
        }
        let mut failure = None;
        let mut landed = Vec::new();
        for (table, open, done) in &tables {
            if *done {
                landed.push((*table, open));
                continue;
            }
            let committed = cirro_storage::write::with_transaction_id(
                &intent.id,
                cirro_storage::write::commit_actions(
                    open.delta(),
                    table.actions.clone(),
                    deltalake::protocol::DeltaOperation::Update { predicate: None },
                ),
            )
            .await;
            match committed {
                Ok(_) => landed.push((*table, open)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        match failure {
            None => log::warn!(
                "a transaction over {} tables left part-way by a crash is now committed",
                intent.tables.len()
            ),
            Some(e) => {
                log::warn!(
                    "a transaction over {} tables left part-way by a crash could not be \
                     finished ({e}): undone",
                    intent.tables.len()
                );
                for (table, _) in landed {
                    let latest = CirroTable::open(&self.root.dir_url(&table.location)?).await?;
                    cirro_storage::write::with_transaction_id(
                        &intent.id,
                        cirro_storage::write::commit_actions(
                            latest.delta(),
                            table.inverse.clone(),
                            deltalake::protocol::DeltaOperation::Update { predicate: None },
                        ),
                    )
                    .await?;
                }
            }
        }
        drop(held);
        Ok(())
    }

    /// Whether this catalog is a cluster member's (shared through the
    /// coordination service).
    pub fn in_cluster(&self) -> bool {
        self.coordination.is_some()
    }

    /// This process's commits over several tables (see `commits.rs`).
    pub fn multi_commits(&self) -> &crate::commits::MultiCommits {
        &self.multi
    }

    /// The table at `location` as a reader that started at `epoch` (see
    /// [`crate::commits::MultiCommits::reader`]) sees it: the newest
    /// version, or the one before a commit over several tables that had not
    /// finished when the reader started. None: the newest.
    pub async fn open_table_seen_at(
        &self,
        location: &str,
        epoch: Option<u64>,
    ) -> Result<CirroTable> {
        let latest = self.open_table(location).await?;
        let Some(epoch) = epoch else {
            return Ok(latest);
        };
        match self.multi.visible(location, latest.version(), epoch) {
            None => Ok(latest),
            Some(version) => latest.at_version(version).await,
        }
    }

    /// Take the write lock of the table at `location`: writers of a table
    /// with constraints hold it from their constraint check to their commit,
    /// so that no other such writer commits in between (two INSERTs of one
    /// new key would otherwise both pass). Within the process it is a mutex;
    /// on a local data directory also an OS file lock
    /// (`_cirro_locks/<table>.lock`), so that `cirro` processes sharing the
    /// directory exclude one another too. In a cluster, also the cluster's
    /// lock of the table, so that writers on other nodes are excluded.
    pub async fn lock_table_writes(&self, location: &str) -> Result<TableWriteGuard> {
        let local = self.write_lock(location).lock_owned().await;
        let cluster = match &self.coordination {
            Some(coordination) => Some(
                coordination
                    .lock(&format!("table-{}", location.replace('/', "_")))
                    .await?,
            ),
            None => None,
        };
        let file = match self.root.url().to_file_path() {
            Ok(root) if self.root.url().scheme() == "file" => {
                let dir = root.join(LOCK_DIR);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| CirroError::io(format!("cannot create {}: {e}", dir.display())))?;
                let path = dir.join(format!("{}.lock", location.replace('/', "_")));
                let file = std::fs::File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(|e| CirroError::io(format!("cannot open {}: {e}", path.display())))?;
                let locked = tokio::task::spawn_blocking(move || file.lock().map(|()| file))
                    .await
                    .map_err(|e| CirroError::internal(format!("lock task failed: {e}")))?
                    .map_err(|e| CirroError::io(format!("cannot lock {}: {e}", path.display())))?;
                Some(locked)
            }
            _ => None,
        };
        Ok(TableWriteGuard {
            _cluster: cluster,
            _file: file,
            _local: local,
        })
    }

    /// Forget a cached table (after it was dropped or replaced).
    pub fn forget_table(&self, location: &str) {
        if let Ok(mut map) = self.open_tables.lock() {
            map.remove(location);
        }
    }
}

/// Whether `table` is the newest version of its Delta table: commit files
/// are numbered without gaps, so it is when the next one does not exist.
/// One metadata lookup (a `stat` on local disk) instead of listing the log,
/// which took a third of a millisecond on every statement that names it.
async fn is_latest(table: &CirroTable) -> bool {
    use object_store::ObjectStoreExt;
    let relative = format!("_delta_log/{:020}.json", table.version() + 1);
    if let Some(exists) = table.local_exists(&relative) {
        return !exists;
    }
    let next = object_store::path::Path::from(relative);
    matches!(
        table.delta().object_store().head(&next).await,
        Err(object_store::Error::NotFound { .. })
    )
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_root(tag: &str) -> (StorageRoot, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("cirro-cat-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (
            StorageRoot::open(dir.to_str().expect("utf8")).expect("root"),
            dir,
        )
    }

    /// A coordination service that only keeps the published version.
    #[derive(Debug, Default)]
    struct Published(Mutex<Option<u64>>);

    #[async_trait::async_trait]
    impl Coordination for Published {
        async fn catalog_version(&self) -> Result<Option<u64>> {
            Ok(*self.0.lock().unwrap())
        }
        async fn publish_catalog_version(&self, version: u64) -> Result<()> {
            *self.0.lock().unwrap() = Some(version);
            Ok(())
        }
        async fn lock(&self, _: &str) -> Result<HeldLock> {
            Err(CirroError::internal("no locks in this test"))
        }
        fn nodes(&self) -> Vec<crate::coordination::NodeInfo> {
            Vec::new()
        }
        fn node_id(&self) -> String {
            "test".into()
        }
    }

    #[tokio::test]
    async fn a_member_sees_versions_another_process_wrote_without_publishing() {
        let (root, dir) = temp_root("unpublished");
        let outside = Catalog::open(root.clone()).await.expect("open");
        let published = Arc::new(Published::default());
        let member = Catalog::open_in_cluster(root, published.clone())
            .await
            .expect("member");
        assert_eq!(*published.0.lock().unwrap(), Some(1));
        // `cirro load --data` beside the cluster: a new version, unpublished.
        outside
            .commit(|s| {
                s.databases
                    .insert("sales".into(), DatabaseEntry::with_public());
                Ok(())
            })
            .await
            .expect("commit");
        tokio::time::sleep(LIST_EVERY + std::time::Duration::from_millis(100)).await;
        let seen = member.refresh().await.expect("refresh");
        assert!(seen.databases.contains_key("sales"), "{:?}", seen.version);
        // … and published for the other members.
        assert_eq!(*published.0.lock().unwrap(), Some(2));
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn commits_survive_reopen_and_races_are_serialized() {
        let (root, dir) = temp_root("reopen");
        let a = Catalog::open(root.clone()).await.expect("open a");
        let b = Catalog::open(root.clone()).await.expect("open b");
        a.commit(|s| {
            s.databases
                .insert("sales".into(), DatabaseEntry::with_public());
            Ok(())
        })
        .await
        .expect("a commits");
        // b has a stale snapshot; its commit must re-read and keep a's change.
        b.commit(|s| {
            s.databases
                .insert("hr".into(), DatabaseEntry::with_public());
            Ok(())
        })
        .await
        .expect("b commits");
        let c = Catalog::open(root).await.expect("reopen");
        let state = c.snapshot();
        assert!(state.databases.contains_key("sales"));
        assert!(state.databases.contains_key("hr"));
        assert!(state.databases.contains_key(DEFAULT_DATABASE));
        assert_eq!(state.version, 3);
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn failed_change_commits_nothing() {
        let (root, dir) = temp_root("fail");
        let cat = Catalog::open(root).await.expect("open");
        let before = cat.snapshot();
        let err = cat
            .commit(|_| Err(CirroError::new(SqlState::DUPLICATE_TABLE, "exists")))
            .await
            .expect_err("refused");
        assert_eq!(err.state, SqlState::DUPLICATE_TABLE);
        assert_eq!(
            cat.refresh().await.expect("refresh").version,
            before.version
        );
        std::fs::remove_dir_all(dir).ok();
    }

    /// A data location written by the previous release (catalog snapshots as
    /// `_catalog/v<20 digits>.json`, read before the `VersionStore` seam
    /// existed) opens, and its next commit continues its numbering.
    #[tokio::test]
    async fn opens_a_catalog_written_by_the_previous_release() {
        let (root, dir) = temp_root("previous");
        let mut state = CatalogState::initial();
        state.version = 7;
        state
            .databases
            .insert("old".into(), DatabaseEntry::with_public());
        let catalog_dir = dir.join("_catalog");
        std::fs::create_dir_all(&catalog_dir).expect("mkdir");
        std::fs::write(
            catalog_dir.join("v00000000000000000007.json"),
            serde_json::to_vec_pretty(&state).expect("json"),
        )
        .expect("write");
        let catalog = Catalog::open(root).await.expect("open");
        assert_eq!(catalog.snapshot().version, 7);
        assert!(catalog.snapshot().databases.contains_key("old"));
        catalog.commit(|_| Ok(())).await.expect("commit");
        assert!(catalog_dir.join("v00000000000000000008.json").is_file());
        std::fs::remove_dir_all(dir).ok();
    }
}
