//! What one session reads of the row stores: the snapshot its statement
//! (or REPEATABLE READ transaction) reads at, and its open transaction's
//! changes, which only it sees until COMMIT; and the scan that merges a
//! table's files with both ([`RowReader::plan`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use cirro_common::{CirroError, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DfResult;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::union::UnionExec;

use super::{Key, RowStore, Snapshot, Snapshots, StoreView, TableChange, without_hidden};
use crate::wal::Lsn;

/// A transaction's changes of one table, not yet committed.
#[derive(Debug, Default, Clone)]
pub struct Pending {
    /// Key → its new row (one-row batch), or None: deleted.
    pub keyed: BTreeMap<Key, Option<RecordBatch>>,
    /// Rows appended to a table without a key.
    pub appends: Vec<RecordBatch>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.appends.is_empty()
    }

    /// The change COMMIT logs: upserts and deletes.
    pub fn change(&self, store: &RowStore) -> Result<TableChange> {
        let schema = Arc::clone(store.schema());
        let mut rows: Vec<RecordBatch> = self.appends.clone();
        let mut deleted_rows: Vec<RecordBatch> = Vec::new();
        rows.extend(self.keyed.values().flatten().cloned());
        // Deleted keys: their key columns, decoded from the key bytes.
        let deleted_keys: Vec<&Key> = self
            .keyed
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(k, _)| k)
            .collect();
        if !deleted_keys.is_empty() {
            deleted_rows.push(store.decode_keys(deleted_keys.into_iter())?);
        }
        let concat =
            |schema: &SchemaRef, batches: Vec<RecordBatch>| -> Result<Option<RecordBatch>> {
                if batches.is_empty() {
                    return Ok(None);
                }
                Ok(Some(arrow::compute::concat_batches(schema, &batches)?))
            };
        let deletes = match deleted_rows.first() {
            Some(first) => {
                let schema = first.schema();
                concat(&schema, deleted_rows)?
            }
            None => None,
        };
        Ok(TableChange {
            upserts: concat(&schema, rows)?,
            deletes,
        })
    }
}

/// A session's snapshot and pending changes (see the module docs).
#[derive(Debug, Default)]
pub struct SessionRows {
    snapshot: Mutex<Option<Snapshot>>,
    pending: Mutex<HashMap<String, Pending>>,
}

impl SessionRows {
    /// Read at a new snapshot of `snapshots` from now on (a statement
    /// starts; a REPEATABLE READ transaction keeps its first).
    pub fn take_snapshot(&self, snapshots: &Arc<Snapshots>) {
        let snapshot = snapshots.take();
        if let Ok(mut s) = self.snapshot.lock() {
            *s = Some(snapshot);
        }
    }

    /// Stop holding a snapshot (the statement or transaction ended).
    pub fn release_snapshot(&self) {
        if let Ok(mut s) = self.snapshot.lock() {
            *s = None;
        }
    }

    /// The snapshot read at (None: none held, read the newest).
    pub fn snapshot(&self) -> Option<Lsn> {
        self.snapshot.lock().ok()?.as_ref().map(|s| s.lsn())
    }

    /// The transaction's changes of `location` so far.
    pub fn pending(&self, location: &str) -> Option<Pending> {
        self.pending.lock().ok()?.get(location).cloned()
    }

    /// The transaction's pending change of `key` in `location`: None if it
    /// changed nothing there; Some(None): deleted.
    pub fn pending_row(&self, location: &str, key: &[u8]) -> Option<Option<RecordBatch>> {
        self.pending
            .lock()
            .ok()?
            .get(location)?
            .keyed
            .get(key)
            .cloned()
    }

    /// Change the transaction's pending changes of `location`.
    pub fn update_pending<T>(
        &self,
        location: &str,
        f: impl FnOnce(&mut Pending) -> T,
    ) -> Result<T> {
        let mut pending = self
            .pending
            .lock()
            .map_err(|e| CirroError::internal(format!("pending rows: {e}")))?;
        Ok(f(pending.entry(location.to_string()).or_default()))
    }

    /// Every pending change (a SAVEPOINT keeps them).
    pub fn all_pending(&self) -> HashMap<String, Pending> {
        self.pending.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Put back the pending changes a SAVEPOINT kept (ROLLBACK TO).
    pub fn set_pending(&self, pending: HashMap<String, Pending>) {
        if let Ok(mut p) = self.pending.lock() {
            *p = pending;
        }
    }

    /// Take every pending change (COMMIT), leaving none.
    pub fn take_pending(&self) -> HashMap<String, Pending> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    pub fn has_pending(&self) -> bool {
        self.pending
            .lock()
            .map(|p| p.values().any(|t| !t.is_empty()))
            .unwrap_or(false)
    }
}

/// How a table's scans reach its row store: attached to a `CirroTable` by
/// the catalog when the process keeps row stores.
#[derive(Clone)]
pub struct RowReader {
    pub store: Arc<RowStore>,
    pub session: Arc<SessionRows>,
    pub snapshots: Arc<Snapshots>,
    pub location: String,
}

impl fmt::Debug for RowReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowReader")
            .field("location", &self.location)
            .finish()
    }
}

impl RowReader {
    /// What a scan of the table version `version` merges: the store's rows
    /// after the version's flushed position, at the session's snapshot,
    /// with the transaction's pending changes over them.
    pub fn view(&self, version: i64) -> Result<StoreView> {
        let snapshot = self
            .session
            .snapshot()
            .unwrap_or_else(|| self.snapshots.visible());
        let view = self.store.view(snapshot, self.store.flushed_at(version))?;
        match self.session.pending(&self.location) {
            Some(pending) if !pending.is_empty() => overlay(&self.store, view, &pending),
            _ => Ok(view),
        }
    }

    /// The version of `key` the session sees over the files of table
    /// version `version`: its transaction's pending change, else the
    /// store's version at its snapshot; None where the files answer,
    /// Some(None): deleted.
    pub fn lookup(&self, key: &[u8], version: i64) -> Option<Option<RecordBatch>> {
        if let Some(mine) = self.session.pending_row(&self.location, key) {
            return Some(mine);
        }
        let snapshot = self
            .session
            .snapshot()
            .unwrap_or_else(|| self.snapshots.visible());
        self.store
            .lookup(key, snapshot, self.store.flushed_at(version))
    }

    /// `files` (a scan of the table's files producing `projection` of its
    /// columns, or all of them, without the rows `view` hides) merged with
    /// `view`'s rows.
    pub fn plan(
        &self,
        view: &StoreView,
        files: Arc<dyn ExecutionPlan>,
        projection: Option<&[usize]>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let Some(rows) = &view.rows else {
            return Ok(files);
        };
        let schema = Arc::clone(self.store.schema());
        let wanted: Vec<usize> = match projection {
            Some(p) => p.to_vec(),
            None => (0..schema.fields().len()).collect(),
        };
        let memory = MemorySourceConfig::try_new_exec(&[vec![rows.clone()]], schema, Some(wanted))?;
        UnionExec::try_new(vec![files, memory as Arc<dyn ExecutionPlan>])
    }
}

/// `view` with a transaction's pending changes over it.
fn overlay(store: &RowStore, view: StoreView, pending: &Pending) -> Result<StoreView> {
    let mut hidden: HashSet<Key> = view.hidden.as_ref().clone();
    let mut batches: Vec<RecordBatch> = Vec::new();
    if let Some(rows) = &view.rows {
        match store.key_columns() {
            Some(_) if !pending.keyed.is_empty() => {
                let mine: HashSet<Key> = pending.keyed.keys().cloned().collect();
                if let Some(kept) =
                    without_hidden(store, &mine, rows, store.key_columns().unwrap_or(&[]))?
                {
                    batches.push(kept);
                }
            }
            _ => batches.push(rows.clone()),
        }
    }
    for (key, row) in &pending.keyed {
        hidden.insert(key.clone());
        if let Some(row) = row {
            batches.push(row.clone());
        }
    }
    batches.extend(pending.appends.iter().cloned());
    let rows = if batches.is_empty() {
        None
    } else {
        Some(arrow::compute::concat_batches(store.schema(), &batches)?)
    };
    Ok(StoreView::new(rows, Arc::new(hidden)))
}
