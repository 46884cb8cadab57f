//! The in-memory row store: a table's small writes between the write-ahead
//! log and the table's files (the Kudu idea, see `wal.rs`).
//!
//! A committed small write is a log record ([`encode`]) holding, for each
//! table it changes, the new versions of rows (upserts) and the keys it
//! deleted ([`TableChange`]). Once the record is durable it is applied to
//! each table's [`RowStore`] under the record's LSN, and readers merge the
//! store with the table's files ([`RowStore::view`]): a key in the store
//! hides the file rows with that key, and its newest visible version (a row,
//! or nothing for a delete) stands in for them. A table without a key takes
//! only appends: each appended row is its own entry.
//!
//! **Versions.** Each key keeps its versions in LSN order. A reader takes a
//! snapshot LSN S once per statement (a transaction under REPEATABLE READ:
//! once) and sees, per key, the newest version at or below S; so a write
//! applied after S, or one of several tables' changes of one record, is seen
//! whole or not at all. The registry of readers ([`Snapshots`]) says which
//! old versions someone may still read; the others are dropped as newer ones
//! come.
//!
//! **Flush.** A background flush writes the rows of every key up to a
//! position F into the table's files in one Delta commit (deleting the file
//! rows they replace) that records F. A reader of a table version whose files
//! hold everything up to F merges only the versions after F
//! ([`RowStore::flushed_at`]); the flushed versions stay while a reader that
//! pinned an older table version may still need them.
//!
//! Rows are kept in Arrow's row format (`arrow::row`), which compares and
//! hashes keys as bytes and converts back to columns in one call; the log
//! keeps them as Arrow IPC, which does not change between Arrow versions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Cursor;
use std::sync::{Arc, Mutex, RwLock};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::row::{RowConverter, SortField};
use cirro_common::{CirroError, Result, SqlState};

use crate::wal::Lsn;

mod flush;
mod located;
mod locks;
mod session;
pub use flush::{FLUSH_APP_ID, flush_view, flushed_position, without_hidden};
pub use located::{Hidden, RowAt, by_index, hidden_positions};
pub use locks::{Owner, RowLock, RowLocks};
pub use session::{Pending, RowReader, SessionRows, StoreRows};

/// A key in the row format (an appended row's own id in a table without one).
pub type Key = Box<[u8]>;

/// One table's part of a committed write: new row versions and deleted keys.
#[derive(Clone, Debug, Default)]
pub struct TableChange {
    /// Whole rows (the table's scan schema): each replaces its key's row.
    pub upserts: Option<RecordBatch>,
    /// The key columns of deleted rows.
    pub deletes: Option<RecordBatch>,
}

impl TableChange {
    pub fn is_empty(&self) -> bool {
        self.upserts.as_ref().is_none_or(|b| b.num_rows() == 0)
            && self.deletes.as_ref().is_none_or(|b| b.num_rows() == 0)
    }
}

/// A committed write: each table's change (by table location).
pub type Changes = Vec<(String, TableChange)>;

#[derive(Clone, Debug)]
struct Version {
    lsn: Lsn,
    /// The row, or None: deleted.
    row: Option<Box<[u8]>>,
}

#[derive(Debug, Default)]
struct State {
    keys: BTreeMap<Key, Vec<Version>>,
    /// Bytes held by keys and versions (approximately).
    bytes: usize,
    /// Table versions written by flushes, with the LSN each covers.
    flushes: Vec<(i64, Lsn)>,
    /// The next id of an appended row (tables without a key).
    next_append: u64,
    /// Counts changes of `keys` (a kept view is good while it holds).
    generation: u64,
    /// The highest LSN applied.
    newest: Lsn,
}

/// Bytes a version costs beyond its row.
const VERSION_OVERHEAD: usize = 48;

/// The row store of one table.
pub struct RowStore {
    schema: SchemaRef,
    /// Indices of the key columns in `schema` (None: appends only).
    key: Option<Vec<usize>>,
    rows: RowConverter,
    keys: Option<RowConverter>,
    state: RwLock<State>,
    /// Where the files hold the keys (see `located.rs`).
    notes: Mutex<located::Notes>,
    /// The last view made for a snapshot that sees every version (see
    /// [`RowStore::view`]).
    kept: Mutex<Option<KeptView>>,
    /// Scans of the key columns run to find hidden rows nobody noted.
    located_by_scan: std::sync::atomic::AtomicU64,
}

/// A view kept for the scans after it: good while the store's keys have
/// not changed (`generation`) for readers of the same files (`after`) at a
/// snapshot that sees every version.
#[derive(Debug)]
struct KeptView {
    after: Lsn,
    generation: u64,
    view: StoreView,
}

impl std::fmt::Debug for RowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowStore")
            .field("key", &self.key)
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// What a reader merges with a table version's files.
#[derive(Debug, Clone)]
pub struct StoreView {
    /// The rows that stand in for the hidden keys, and appended rows.
    pub rows: Option<RecordBatch>,
    /// Keys whose file rows are replaced (by a row in `rows` or by nothing).
    pub hidden: Arc<HashSet<Key>>,
    /// Where those file rows are in a table version, once found, and the
    /// files' deletion vectors widened by them (shared by the clones of a
    /// kept view).
    positions: Arc<Mutex<Option<Kept>>>,
    /// The range of each column of `rows`, once asked for.
    ranges: Arc<std::sync::OnceLock<Arc<[session::ColumnRange]>>>,
}

impl StoreView {
    pub fn new(rows: Option<RecordBatch>, hidden: Arc<HashSet<Key>>) -> Self {
        Self {
            rows,
            hidden,
            positions: Arc::default(),
            ranges: Arc::default(),
        }
    }

    /// The range of each column of `rows` (computed once per view).
    fn ranges(&self) -> Arc<[session::ColumnRange]> {
        Arc::clone(self.ranges.get_or_init(|| match &self.rows {
            Some(rows) => session::ColumnRange::of(rows).into(),
            None => Arc::from(Vec::new()),
        }))
    }

    pub fn is_empty(&self) -> bool {
        self.hidden.is_empty() && self.rows.as_ref().is_none_or(|r| r.num_rows() == 0)
    }

    /// The hidden rows' positions in table version `version`, if found.
    fn positions(&self, version: i64) -> Option<Arc<Hidden>> {
        let kept = self.positions.lock().ok()?;
        kept.as_ref()
            .filter(|k| k.version == version)
            .map(|k| Arc::clone(&k.hidden))
    }

    /// Keep `positions` as the hidden rows' in table version `version`.
    fn keep_positions(&self, version: i64, positions: Arc<Hidden>) -> Arc<Hidden> {
        if let Ok(mut kept) = self.positions.lock() {
            *kept = Some(Kept {
                version,
                hidden: Arc::clone(&positions),
                widened: HashMap::new(),
            });
        }
        positions
    }

    /// The rows a scan of table version `version` leaves out of its file
    /// `index`: `make`'s (the file's deletion vector widened by the hidden
    /// rows there), made once per view and version.
    pub fn widened(
        &self,
        version: i64,
        index: usize,
        make: impl FnOnce() -> crate::dv::Deleted,
    ) -> Arc<crate::dv::Deleted> {
        let Ok(mut kept) = self.positions.lock() else {
            return Arc::new(make());
        };
        match kept.as_mut().filter(|k| k.version == version) {
            Some(kept) => Arc::clone(
                kept.widened
                    .entry(index)
                    .or_insert_with(|| Arc::new(make())),
            ),
            None => Arc::new(make()),
        }
    }
}

/// A view's positions in one table version (see [`StoreView::widened`]).
#[derive(Debug)]
struct Kept {
    version: i64,
    hidden: Arc<Hidden>,
    /// By file index.
    widened: HashMap<usize, Arc<crate::dv::Deleted>>,
}

fn internal(what: &str, e: impl std::fmt::Display) -> CirroError {
    CirroError::internal(format!("row store: {what}: {e}"))
}

impl RowStore {
    /// A store for rows of `schema` keyed by the columns `key` (indices), or
    /// taking appends only.
    pub fn new(schema: SchemaRef, key: Option<Vec<usize>>) -> Result<Self> {
        let fields = |indices: &mut dyn Iterator<Item = usize>| {
            indices
                .map(|i| SortField::new(schema.field(i).data_type().clone()))
                .collect::<Vec<_>>()
        };
        let rows = RowConverter::new(fields(&mut (0..schema.fields().len())))
            .map_err(|e| internal("row format", e))?;
        let keys = match &key {
            Some(k) => Some(
                RowConverter::new(fields(&mut k.iter().copied()))
                    .map_err(|e| internal("key format", e))?,
            ),
            None => None,
        };
        Ok(Self {
            schema,
            key,
            rows,
            keys,
            state: RwLock::default(),
            notes: Mutex::default(),
            kept: Mutex::default(),
            located_by_scan: Default::default(),
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The key columns' indices (None: a table without a key).
    pub fn key_columns(&self) -> Option<&[usize]> {
        self.key.as_deref()
    }

    /// Bytes the store holds (approximately).
    pub fn bytes(&self) -> usize {
        let notes = self.notes.lock().map(|n| n.bytes()).unwrap_or(0);
        self.state.read().map(|s| s.bytes).unwrap_or(0) + notes
    }

    /// Keys held (with at least one version).
    pub fn len(&self) -> usize {
        self.state.read().map(|s| s.keys.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys of `columns` (the key columns, in key order).
    pub fn encode_keys(&self, columns: &[ArrayRef]) -> Result<Vec<Key>> {
        let converter = self
            .keys
            .as_ref()
            .ok_or_else(|| internal("keys", "the table has no key"))?;
        let rows = converter
            .convert_columns(columns)
            .map_err(|e| internal("encode keys", e))?;
        Ok(rows.iter().map(|r| r.as_ref().into()).collect())
    }

    /// The keys of whole rows of the table.
    pub fn keys_of_rows(&self, batch: &RecordBatch) -> Result<Vec<Key>> {
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| internal("keys", "the table has no key"))?;
        let columns: Vec<ArrayRef> = key.iter().map(|&i| Arc::clone(batch.column(i))).collect();
        self.encode_keys(&columns)
    }

    /// Keys back as columns (a batch of the key columns).
    pub fn decode_keys<'a>(&self, keys: impl Iterator<Item = &'a Key>) -> Result<RecordBatch> {
        let (converter, key) = match (&self.keys, &self.key) {
            (Some(c), Some(k)) => (c, k),
            _ => return Err(internal("keys", "the table has no key")),
        };
        let parser = converter.parser();
        let parsed: Vec<_> = keys.map(|k| parser.parse(k)).collect();
        let columns = converter
            .convert_rows(parsed)
            .map_err(|e| internal("decode keys", e))?;
        let schema = Arc::new(self.schema.project(key).map_err(|e| internal("keys", e))?);
        RecordBatch::try_new(schema, columns).map_err(|e| internal("decode keys", e))
    }

    fn encode_rows(&self, batch: &RecordBatch) -> Result<Vec<Box<[u8]>>> {
        let rows = self
            .rows
            .convert_columns(batch.columns())
            .map_err(|e| internal("encode rows", e))?;
        Ok(rows.iter().map(|r| r.as_ref().into()).collect())
    }

    /// Rows in the row format back as a batch of the table's schema.
    fn decode_rows<'a>(&self, rows: impl Iterator<Item = &'a [u8]>) -> Result<RecordBatch> {
        let parser = self.rows.parser();
        let parsed: Vec<_> = rows.map(|r| parser.parse(r)).collect();
        let columns = self
            .rows
            .convert_rows(parsed)
            .map_err(|e| internal("decode rows", e))?;
        RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| internal("decode rows", e))
    }

    /// Apply one table's part of the record at `lsn`; `oldest` is the
    /// oldest snapshot a reader holds (versions no snapshot from it on can
    /// see are dropped).
    pub fn apply(&self, lsn: Lsn, change: &TableChange, oldest: Lsn) -> Result<()> {
        let mut entries: Vec<(Key, Option<Box<[u8]>>)> = Vec::new();
        if let Some(deletes) = change.deletes.as_ref().filter(|b| b.num_rows() > 0) {
            for key in self.encode_keys(deletes.columns())? {
                entries.push((key, None));
            }
        }
        let mut state = self.state.write().map_err(|e| internal("lock", e))?;
        state.generation += 1;
        state.newest = state.newest.max(lsn);
        if let Some(upserts) = change.upserts.as_ref().filter(|b| b.num_rows() > 0) {
            let rows = self.encode_rows(upserts)?;
            let keys = match &self.key {
                Some(_) => self.keys_of_rows(upserts)?,
                None => (0..rows.len())
                    .map(|_| {
                        state.next_append += 1;
                        state.next_append.to_be_bytes().to_vec().into_boxed_slice()
                    })
                    .collect(),
            };
            entries.extend(keys.into_iter().zip(rows.into_iter().map(Some)));
        }
        for (key, row) in entries {
            let added = VERSION_OVERHEAD + row.as_ref().map_or(0, |r| r.len());
            let key_bytes = key.len();
            let versions = state.keys.entry(key).or_default();
            let fresh = versions.is_empty();
            versions.push(Version { lsn, row });
            let dropped = prune(versions, oldest);
            state.bytes =
                (state.bytes + added + if fresh { key_bytes } else { 0 }).saturating_sub(dropped);
        }
        Ok(())
    }

    /// The newest version of `key` applied so far (whatever any snapshot
    /// sees): a writer that holds the key's lock reads it. None: not in the
    /// store; Some((lsn, None)): deleted.
    pub fn latest(&self, key: &[u8]) -> Option<(Lsn, Option<RecordBatch>)> {
        let state = self.state.read().ok()?;
        let version = state.keys.get(key)?.last()?;
        let row = match &version.row {
            Some(r) => Some(self.decode_rows(std::iter::once(r.as_ref())).ok()?),
            None => None,
        };
        Some((version.lsn, row))
    }

    /// The version of `key` a reader at `snapshot` of files that hold
    /// everything up to `after` sees: None where the files answer (the key
    /// is not in the store for it), Some(None) deleted, Some(row).
    pub fn lookup(&self, key: &[u8], snapshot: Lsn, after: Lsn) -> Option<Option<RecordBatch>> {
        let state = self.state.read().ok()?;
        let version = visible(state.keys.get(key)?, snapshot)?;
        if version.lsn <= after {
            return None;
        }
        Some(match &version.row {
            Some(r) => Some(self.decode_rows(std::iter::once(r.as_ref())).ok()?),
            None => None,
        })
    }

    /// What a reader at `snapshot` of a table version whose files hold
    /// everything up to `after` merges with those files.
    ///
    /// A view for a snapshot that sees every version applied is kept, and
    /// given again while no version is applied or dropped: scans between
    /// writes share it (and the positions found for it) instead of
    /// decoding the store each.
    pub fn view(&self, snapshot: Lsn, after: Lsn) -> Result<StoreView> {
        let state = self.state.read().map_err(|e| internal("lock", e))?;
        let sees_all = snapshot >= state.newest;
        if sees_all
            && let Ok(kept) = self.kept.lock()
            && let Some(kept) = kept
                .as_ref()
                .filter(|k| k.after == after && k.generation == state.generation)
        {
            return Ok(kept.view.clone());
        }
        let mut hidden = HashSet::new();
        let mut rows: Vec<&[u8]> = Vec::new();
        for (key, versions) in &state.keys {
            let Some(version) = visible(versions, snapshot) else {
                continue;
            };
            if version.lsn <= after {
                continue;
            }
            if self.key.is_some() {
                hidden.insert(key.clone());
            }
            if let Some(row) = &version.row {
                rows.push(row);
            }
        }
        let rows = if rows.is_empty() {
            None
        } else {
            Some(self.decode_rows(rows.into_iter())?)
        };
        let view = StoreView::new(rows, Arc::new(hidden));
        if sees_all && let Ok(mut kept) = self.kept.lock() {
            *kept = Some(KeptView {
                after,
                generation: state.generation,
                view: view.clone(),
            });
        }
        Ok(view)
    }

    /// The LSN up to which the files of table version `version` hold the
    /// store's rows (0: none flushed, or not known to this process).
    pub fn flushed_at(&self, version: i64) -> Lsn {
        let Ok(state) = self.state.read() else {
            return 0;
        };
        state
            .flushes
            .iter()
            .rev()
            .find(|(v, _)| *v <= version)
            .map_or(0, |(_, lsn)| *lsn)
    }

    /// The newest LSN flushed into the files (0: none).
    pub fn flushed(&self) -> Lsn {
        self.state
            .read()
            .ok()
            .and_then(|s| s.flushes.last().map(|(_, l)| *l))
            .unwrap_or(0)
    }

    /// Record that table version `version` holds everything up to `lsn`
    /// (a flush committed it, or the table was opened at it).
    pub fn record_flush(&self, version: i64, lsn: Lsn) {
        if let Ok(mut state) = self.state.write() {
            if state
                .flushes
                .last()
                .is_none_or(|(v, l)| *v < version && *l <= lsn)
            {
                state.flushes.push((version, lsn));
            }
        }
    }

    /// Whether some version is newer than the newest flush.
    pub fn has_unflushed(&self) -> bool {
        let flushed = self.flushed();
        let Ok(state) = self.state.read() else {
            return true;
        };
        state
            .keys
            .values()
            .any(|versions| versions.last().is_some_and(|v| v.lsn > flushed))
    }

    /// Whether every table version in (`from`, `to`] was written by a flush
    /// of this store (so the two versions hold the same rows, given the
    /// store's versions up to the flushes' positions).
    pub fn only_flushes_between(&self, from: i64, to: i64) -> bool {
        let Ok(state) = self.state.read() else {
            return false;
        };
        (from + 1..=to).all(|v| state.flushes.iter().any(|(f, _)| *f == v))
    }

    /// Whether a version of some key has a position in (`after`, `upto`].
    pub fn changed_between(&self, after: Lsn, upto: Lsn) -> bool {
        let Ok(state) = self.state.read() else {
            return true;
        };
        state
            .keys
            .values()
            .any(|versions| versions.iter().any(|v| v.lsn > after && v.lsn <= upto))
    }

    /// Drop every version at or below the newest flushed LSN, for a table
    /// no reader reads below its newest flush any more (see [`Snapshots`]).
    pub fn forget_flushed(&self) {
        let Ok(mut state) = self.state.write() else {
            return;
        };
        let Some(&(version, flushed)) = state.flushes.last() else {
            return;
        };
        let mut freed = 0;
        state.generation += 1;
        state.keys.retain(|key, versions| {
            let before = versions.len();
            let bytes: usize = versions
                .iter()
                .filter(|v| v.lsn <= flushed)
                .map(|v| VERSION_OVERHEAD + v.row.as_ref().map_or(0, |r| r.len()))
                .sum();
            versions.retain(|v| v.lsn > flushed);
            if versions.len() < before {
                freed += bytes;
            }
            if versions.is_empty() {
                freed += key.len();
                false
            } else {
                true
            }
        });
        state.bytes = state.bytes.saturating_sub(freed);
        state.flushes = vec![(version, flushed)];
    }
}

/// The newest version at or below `snapshot`.
fn visible(versions: &[Version], snapshot: Lsn) -> Option<&Version> {
    versions.iter().rev().find(|v| v.lsn <= snapshot)
}

/// Drop the versions of one key that no snapshot from `oldest` on sees
/// (those before the newest at or below it); the bytes freed.
fn prune(versions: &mut Vec<Version>, oldest: Lsn) -> usize {
    let Some(keep_from) = versions.iter().rposition(|v| v.lsn <= oldest) else {
        return 0;
    };
    let freed = versions[..keep_from]
        .iter()
        .map(|v| VERSION_OVERHEAD + v.row.as_ref().map_or(0, |r| r.len()))
        .sum();
    versions.drain(..keep_from);
    freed
}

/// The snapshots readers hold, and the applied position they are taken at.
///
/// Records are applied in any order (each committer applies its own once
/// its record is durable); the *visible* position is the highest LSN below
/// which every record is applied, so a snapshot never sees a later record
/// without an earlier one. A committer waits until the visible position
/// reaches its record before it acknowledges, so a client sees its own
/// write in its next statement.
#[derive(Debug, Default)]
pub struct Snapshots {
    state: Mutex<SnapshotState>,
    visible_tx: Option<tokio::sync::watch::Sender<Lsn>>,
}

#[derive(Debug, Default)]
struct SnapshotState {
    visible: Lsn,
    /// Applied records above `visible` (waiting for a lower one).
    applied: std::collections::BTreeSet<Lsn>,
    /// Held snapshots and how many hold each.
    held: BTreeMap<Lsn, usize>,
}

/// A held snapshot; released on drop.
#[derive(Debug)]
pub struct Snapshot {
    lsn: Lsn,
    owner: Arc<Snapshots>,
}

impl Snapshot {
    pub fn lsn(&self) -> Lsn {
        self.lsn
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        if let Ok(mut state) = self.owner.state.lock()
            && let Some(count) = state.held.get_mut(&self.lsn)
        {
            *count -= 1;
            if *count == 0 {
                state.held.remove(&self.lsn);
            }
        }
    }
}

impl Snapshots {
    /// Snapshots over a log whose records up to `start` are applied.
    pub fn new(start: Lsn) -> Arc<Self> {
        let (tx, _) = tokio::sync::watch::channel(start);
        Arc::new(Self {
            state: Mutex::new(SnapshotState {
                visible: start,
                ..Default::default()
            }),
            visible_tx: Some(tx),
        })
    }

    /// The visible position.
    pub fn visible(&self) -> Lsn {
        self.state.lock().map(|s| s.visible).unwrap_or(0)
    }

    /// Take a snapshot at the visible position.
    pub fn take(self: &Arc<Self>) -> Snapshot {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let lsn = state.visible;
        *state.held.entry(lsn).or_default() += 1;
        Snapshot {
            lsn,
            owner: Arc::clone(self),
        }
    }

    /// The oldest snapshot held, or the visible position if none: versions
    /// no snapshot from it on sees may be dropped.
    pub fn oldest(&self) -> Lsn {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .held
            .keys()
            .next()
            .copied()
            .unwrap_or(state.visible)
            .min(state.visible)
    }

    /// Whether a snapshot below `lsn` is held.
    pub fn held_below(&self, lsn: Lsn) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.held.keys().next().is_some_and(|&l| l < lsn)
    }

    /// Record `lsn` as applied, then wait until every record up to it is.
    pub async fn applied(&self, lsn: Lsn) {
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.applied.insert(lsn);
            let mut visible = state.visible;
            while state.applied.remove(&(visible + 1)) {
                visible += 1;
            }
            // A record at or below the visible position (LSNs of a failed
            // write, given again) moves nothing.
            state.applied.retain(|&l| l > visible);
            state.visible = visible;
            if let Some(tx) = &self.visible_tx {
                tx.send_replace(visible);
            }
        }
        if let Some(tx) = &self.visible_tx {
            let mut rx = tx.subscribe();
            let _ = rx.wait_for(|&v| v >= lsn).await;
        }
    }
}

/// Encode a committed write as a log record's payload:
///
/// ```text
/// tables: u32 | per table: location length: u32 | location | upserts: u32 length | IPC stream
///                                                           | deletes: u32 length | IPC stream
/// ```
///
/// (little-endian; a length of 0: none).
pub fn encode(changes: &[(String, TableChange)]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for (location, change) in changes {
        out.extend_from_slice(&(location.len() as u32).to_le_bytes());
        out.extend_from_slice(location.as_bytes());
        for batch in [&change.upserts, &change.deletes] {
            match batch {
                Some(batch) => {
                    // A change's rows are one-row slices of its statements'
                    // batches, concatenated: their view columns still hold
                    // every slice's whole buffers.
                    let batch = &cirro_common::batch::own_view_data(batch.clone(), 4096)
                        .map_err(|e| internal("encode", e))?;
                    let mut bytes = Vec::new();
                    {
                        let mut writer = StreamWriter::try_new(&mut bytes, batch.schema_ref())
                            .map_err(|e| internal("encode", e))?;
                        writer.write(batch).map_err(|e| internal("encode", e))?;
                        writer.finish().map_err(|e| internal("encode", e))?;
                    }
                    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    out.extend_from_slice(&bytes);
                }
                None => out.extend_from_slice(&0u32.to_le_bytes()),
            }
        }
    }
    Ok(out)
}

/// Decode a record's payload (see [`encode`]); XX001 if it does not parse
/// (its checksum held, so the writer wrote it so: a bug or another format).
pub fn decode(payload: &[u8]) -> Result<Changes> {
    let bad = |what: &str| {
        CirroError::new(
            SqlState::DATA_CORRUPTED,
            format!("write-ahead log record does not decode: {what}"),
        )
    };
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let end = at.checked_add(n).filter(|&e| e <= payload.len());
        let end = end.ok_or_else(|| bad("truncated"))?;
        let slice = &payload[at..end];
        at = end;
        Ok(slice)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let tables = u32_of(take(4)?);
    let mut changes = Vec::with_capacity(tables.min(1024));
    for _ in 0..tables {
        let len = u32_of(take(4)?);
        let location = std::str::from_utf8(take(len)?)
            .map_err(|_| bad("location is not UTF-8"))?
            .to_string();
        let mut batches = [None, None];
        for slot in &mut batches {
            let len = u32_of(take(4)?);
            if len == 0 {
                continue;
            }
            let bytes = take(len)?;
            let reader =
                StreamReader::try_new(Cursor::new(bytes), None).map_err(|e| bad(&e.to_string()))?;
            let mut read: Vec<RecordBatch> = Vec::new();
            for batch in reader {
                read.push(batch.map_err(|e| bad(&e.to_string()))?);
            }
            *slot = match read.len() {
                0 => None,
                1 => read.pop(),
                _ => {
                    let schema = read[0].schema();
                    Some(
                        arrow::compute::concat_batches(&schema, &read)
                            .map_err(|e| bad(&e.to_string()))?,
                    )
                }
            };
        }
        let [upserts, deletes] = batches;
        changes.push((location, TableChange { upserts, deletes }));
    }
    Ok(changes)
}

/// The row stores of one process's tables, by table location.
#[derive(Debug, Default)]
pub struct RowStores {
    tables: Mutex<HashMap<String, Arc<RowStore>>>,
}

impl RowStores {
    pub fn get(&self, location: &str) -> Option<Arc<RowStore>> {
        self.tables.lock().ok()?.get(location).cloned()
    }

    /// The store of `location`, made by `make` if there is none.
    pub fn get_or_insert(
        &self,
        location: &str,
        make: impl FnOnce() -> Result<RowStore>,
    ) -> Result<Arc<RowStore>> {
        let mut tables = self.tables.lock().map_err(|e| internal("lock", e))?;
        if let Some(store) = tables.get(location) {
            return Ok(Arc::clone(store));
        }
        let store = Arc::new(make()?);
        tables.insert(location.to_string(), Arc::clone(&store));
        Ok(store)
    }

    /// Forget the store of a dropped or rewritten table.
    pub fn remove(&self, location: &str) -> Option<Arc<RowStore>> {
        self.tables.lock().ok()?.remove(location)
    }

    /// Every table's store.
    pub fn all(&self) -> Vec<(String, Arc<RowStore>)> {
        self.tables
            .lock()
            .map(|t| t.iter().map(|(l, s)| (l.clone(), Arc::clone(s))).collect())
            .unwrap_or_default()
    }

    /// Bytes held by every store.
    pub fn bytes(&self) -> usize {
        self.all().iter().map(|(_, s)| s.bytes()).sum()
    }
}

#[cfg(test)]
mod tests;
