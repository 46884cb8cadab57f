//! The row stores of a data location's tables (see
//! `cirro_storage::rowstore`), kept by the process that serves the location
//! (`cirro serve --row-store on`): the write-ahead log, each table's store,
//! the snapshots readers hold, row locks, and the background flush.
//!
//! ```text
//!  small write ─► row locks ─► COMMIT: one log record (every table it changed)
//!        ─► fsync (group commit) ─► applied to each table's store ─► acknowledged
//!  scan ─► files of the table version ⊕ the store's rows after that version's flush
//!  flush (every FLUSH_EVERY, or when the stores pass their budget)
//!        ─► one Delta commit per table, recording the log position ─► log truncated
//! ```
//!
//! On opening, the log's records after each table's flushed position (the
//! `txn` action of its newest flush) are applied again, exactly once; a
//! record naming a table that no longer exists is skipped.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::CirroTable;
use cirro_storage::rowstore::{
    self, Changes, Owner, RowLocks, RowReader, RowStore, RowStores, SessionRows, Snapshots,
};
use cirro_storage::wal::{Lsn, Wal, WalOptions};
use datafusion::catalog::Session;

use crate::Catalog;

/// How often the background flush writes the stores into their tables, by
/// default.
pub const FLUSH_EVERY: Duration = Duration::from_secs(10);

/// How a process keeps row stores.
#[derive(Clone, Debug)]
pub struct RowStoreConfig {
    /// The write-ahead log's directory.
    pub wal_dir: std::path::PathBuf,
    /// Bytes the stores may hold together before writers wait for a flush.
    pub budget: usize,
    /// How often the background flush runs (`--row-store-flush`).
    pub flush_every: Duration,
}

/// The row stores of one data location (see the module docs).
pub struct RowService {
    wal: Wal,
    stores: RowStores,
    snapshots: Arc<Snapshots>,
    locks: Arc<RowLocks>,
    next_owner: AtomicU64,
    budget: usize,
    flush_every: Duration,
    /// Tables' gates: small writers hold one shared until they commit, a
    /// change through the table's files (a flush, UPDATE of many rows,
    /// ALTER TABLE) holds it alone.
    gates: std::sync::Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Woken after each flush (writers waiting for room).
    flushed: tokio::sync::Notify,
}

impl std::fmt::Debug for RowService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowService")
            .field("wal", &self.wal)
            .finish()
    }
}

impl RowService {
    pub fn snapshots(&self) -> &Arc<Snapshots> {
        &self.snapshots
    }

    pub fn locks(&self) -> &Arc<RowLocks> {
        &self.locks
    }

    pub fn stores(&self) -> &RowStores {
        &self.stores
    }

    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// A new lock owner (a transaction, or a statement outside one).
    pub fn owner(&self) -> Owner {
        self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    /// The gate of the table at `location` (see [`RowService`]).
    pub fn gate(&self, location: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(gates.entry(location.to_string()).or_default())
    }

    /// Log `changes` as one record and apply them: durable (and seen by
    /// every later statement) when this returns. With `sync` false the
    /// record is acknowledged before its fsync (`synchronous_commit = off`).
    pub async fn commit(&self, changes: Changes, sync: bool) -> Result<Lsn> {
        let mut stores = Vec::with_capacity(changes.len());
        for (location, _) in &changes {
            let store = self.stores.get(location).ok_or_else(|| {
                CirroError::internal(format!("no row store for table {location}"))
            })?;
            stores.push(store);
        }
        self.wait_for_room().await;
        let payload = rowstore::encode(&changes)?;
        let lsn = self.wal.append(payload, sync).await?;
        let oldest = self.snapshots.oldest();
        for ((_, change), store) in changes.iter().zip(&stores) {
            // The record is durable: a change that cannot be applied now
            // would be applied by the next start, so the store and the log
            // would disagree until then. It decodes what it just encoded;
            // failing here is a bug.
            store.apply(lsn, change, oldest)?;
        }
        self.snapshots.applied(lsn).await;
        Ok(lsn)
    }

    /// How often the background flush runs.
    pub fn flush_every(&self) -> Duration {
        self.flush_every
    }

    /// Whether the stores hold more than their budget.
    pub fn over_budget(&self) -> bool {
        self.stores.bytes() > self.budget
    }

    /// Wait (bounded) while the stores hold more than their budget: the
    /// flush frees them (back-pressure).
    async fn wait_for_room(&self) {
        for _ in 0..600 {
            if self.stores.bytes() <= self.budget {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), self.flushed.notified()).await;
        }
    }

    /// Attach the table's store (made now for a table with a primary key or
    /// none; None for a table whose store cannot be kept) to `table`, for
    /// `session`.
    pub async fn reader(
        &self,
        location: &str,
        table: &CirroTable,
        session: &Arc<SessionRows>,
    ) -> Result<Option<RowReader>> {
        let Some(store) = self.store_for(location, table).await? else {
            return Ok(None);
        };
        Ok(Some(RowReader {
            store,
            session: Arc::clone(session),
            snapshots: Arc::clone(&self.snapshots),
            location: location.to_string(),
        }))
    }

    /// The store of `table` at `location`, made if new. None for a table the
    /// row store does not take: one whose schema is a transaction's staged
    /// ALTER, or whose columns the row format cannot hold.
    pub async fn store_for(
        &self,
        location: &str,
        table: &CirroTable,
    ) -> Result<Option<Arc<RowStore>>> {
        let schema = std::sync::Arc::clone(table.table_schema());
        let key = match table
            .options()
            .unique_keys()
            .into_iter()
            .find(|(_, _, primary)| *primary)
        {
            Some((_, columns, _)) => {
                let indices = columns
                    .iter()
                    .map(|c| schema.index_of(c))
                    .collect::<std::result::Result<Vec<_>, _>>();
                match indices {
                    Ok(indices) => Some(indices),
                    Err(_) => return Ok(None),
                }
            }
            None => None,
        };
        if let Some(store) = self.stores.get(location) {
            if store.schema() == table.table_schema() && store.key_columns() == key.as_deref() {
                return Ok(Some(store));
            }
            // The table's columns or primary key changed (ALTER TABLE, which
            // flushed it first: `pgbench -i` adds the key after its load).
            if !store.is_empty() {
                return Ok(None);
            }
            self.stores.remove(location);
        }
        if table.schema_staged() {
            return Ok(None);
        }
        let flushed = rowstore::flushed_position(table).await?;
        let next = self.wal.stats().next_lsn;
        if flushed >= next {
            return Err(behind_the_log(self.wal.dir(), next, location, flushed));
        }
        let version = table.version();
        let store = match self
            .stores
            .get_or_insert(location, || RowStore::new(schema, key))
        {
            Ok(store) => store,
            Err(_) => return Ok(None),
        };
        store.record_flush(version, flushed);
        Ok(Some(store))
    }

    /// Write `location`'s store into its table (under the table's gate,
    /// alone); nothing if it is empty.
    pub async fn flush_table(
        &self,
        catalog: &Catalog,
        location: &str,
        state: &dyn Session,
    ) -> Result<()> {
        let Some(store) = self.stores.get(location) else {
            return Ok(());
        };
        if !store.has_unflushed() {
            return Ok(());
        }
        let gate = self.gate(location);
        let _alone = gate.write().await;
        self.flush_locked(catalog, location, &store, state).await
    }

    /// Write `location`'s store into its table, for a caller that holds the
    /// table's gate alone.
    pub async fn flush_table_alone(
        &self,
        catalog: &Catalog,
        location: &str,
        state: &dyn Session,
    ) -> Result<()> {
        match self.stores.get(location) {
            Some(store) if store.has_unflushed() => {
                self.flush_locked(catalog, location, &store, state).await
            }
            _ => Ok(()),
        }
    }

    /// Flush with the table's gate held alone.
    async fn flush_locked(
        &self,
        catalog: &Catalog,
        location: &str,
        store: &Arc<RowStore>,
        state: &dyn Session,
    ) -> Result<()> {
        let upto = self.snapshots.visible();
        let table = match catalog.open_table(location).await {
            Ok(table) => table,
            Err(e) if e.state == SqlState::UNDEFINED_TABLE => {
                // Dropped: its rows went with it.
                self.stores.remove(location);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let after = store.flushed_at(table.version());
        let view = store.view(upto, after)?;
        if !view.is_empty() {
            let committed = rowstore::flush_view(&table, state, store, &view, upto).await?;
            if let Some(committed) = committed {
                store.record_flush(committed.version, upto);
            }
        } else {
            store.record_flush(table.version(), upto.max(after));
        }
        if !self.snapshots.held_below(upto + 1) {
            store.forget_flushed();
        }
        self.flushed.notify_waiters();
        Ok(())
    }

    /// Flush every store, then remove the log's segments no table needs.
    pub async fn flush_all(&self, catalog: &Catalog, state: &dyn Session) -> Result<()> {
        let mut first_error = None;
        for (location, _) in self.stores.all() {
            if let Err(e) = self.flush_table(catalog, &location, state).await {
                log::warn!("row store of {location}: flush failed: {e}");
                first_error.get_or_insert(e);
            }
        }
        let needed = self
            .stores
            .all()
            .iter()
            .map(|(_, s)| s.flushed() + 1)
            .min()
            .unwrap_or(self.snapshots.visible() + 1);
        self.wal.remove_before(needed).await?;
        first_error.map_or(Ok(()), Err)
    }

    /// Open the log in `config.wal_dir` and apply its records after each
    /// table's flushed position.
    ///
    /// The tables' flushed positions must lie inside the log: a log made
    /// again (its directory deleted, or another `--wal-dir`) starts after the
    /// highest of them, since a record numbered at or below a table's
    /// flushed position would never be seen there; a log that ends before
    /// one (an older copy, another location's) is refused.
    pub async fn open(catalog: &Catalog, config: &RowStoreConfig) -> Result<Arc<Self>> {
        let locations = location_index(catalog);
        let mut highest: Option<(Lsn, String)> = None;
        for location in &locations {
            // A table that does not open now is checked when its store is
            // first made (`store_for`).
            let flushed = match catalog.open_table(location).await {
                Ok(table) => rowstore::flushed_position(&table).await,
                Err(e) => Err(e),
            };
            let flushed = match flushed {
                Ok(flushed) => flushed,
                Err(e) => {
                    log::warn!("row store: table {location}: {e}");
                    continue;
                }
            };
            if flushed > highest.as_ref().map_or(0, |(lsn, _)| *lsn) {
                highest = Some((flushed, location.clone()));
            }
        }
        let flushed = highest.as_ref().map_or(0, |(lsn, _)| *lsn);
        let dir = config.wal_dir.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let options = WalOptions {
                start: flushed + 1,
                ..WalOptions::default()
            };
            Wal::open(Path::new(&dir), 1, options)
        })
        .await
        .map_err(|e| CirroError::internal(format!("write-ahead log: {e}")))??;
        let last = opened.records.last().map_or(0, |r| r.lsn);
        let next = opened.wal.stats().next_lsn;
        if let Some((position, location)) = &highest {
            if next <= *position {
                return Err(behind_the_log(&config.wal_dir, next, location, *position));
            }
            if opened.new {
                log::warn!(
                    "row store: the write-ahead log in {} is new; the tables' files hold \
                     the row stores' changes up to position {position}, and the log goes \
                     on from there",
                    config.wal_dir.display()
                );
            }
        }
        let service = Arc::new(Self {
            wal: opened.wal,
            stores: RowStores::default(),
            snapshots: Snapshots::new(next.saturating_sub(1).max(last)),
            locks: Arc::default(),
            next_owner: AtomicU64::new(1),
            budget: config.budget,
            flush_every: config.flush_every,
            gates: Default::default(),
            flushed: tokio::sync::Notify::new(),
        });
        let mut replayed = 0usize;
        for record in opened.records {
            for (location, change) in rowstore::decode(&record.payload)? {
                if !locations.contains(&location) {
                    continue; // the table was dropped
                }
                let table = catalog.open_table(&location).await?;
                let Some(store) = service.store_for(&location, &table).await? else {
                    return Err(CirroError::new(
                        SqlState::DATA_CORRUPTED,
                        format!(
                            "write-ahead log record {} changes table {location}, whose \
                             columns no longer match it",
                            record.lsn
                        ),
                    ));
                };
                if record.lsn > store.flushed() {
                    store.apply(record.lsn, &change, record.lsn)?;
                    replayed += 1;
                }
            }
        }
        if replayed > 0 {
            log::info!(
                "row store: applied {replayed} table changes from the write-ahead log in {}",
                config.wal_dir.display()
            );
        }
        Ok(service)
    }
}

/// A table whose files hold the row store's changes up to `flushed`, past
/// the log's end (the next record would be `next`).
fn behind_the_log(dir: &Path, next: Lsn, location: &str, flushed: Lsn) -> CirroError {
    CirroError::new(
        SqlState::DATA_CORRUPTED,
        format!(
            "the write-ahead log in {} ends at position {}, but table {location} holds the \
             row store's changes up to position {flushed}: the log is not this data \
             location's (or an older copy of it); move it away to start a new one",
            dir.display(),
            next - 1
        ),
    )
}

/// Every table location of the catalog now.
fn location_index(catalog: &Catalog) -> std::collections::HashSet<String> {
    let state = catalog.snapshot();
    state
        .databases
        .values()
        .flat_map(|d| d.schemas.values())
        .flat_map(|s| s.tables.values())
        .map(|t| t.location.clone())
        .collect()
}
