//! Where the file rows a row store hides are, so that scans drop them by
//! position, as deletion vectors drop rows, instead of looking up the key
//! of every file row they read.
//!
//! A key the store holds (newer than the files' flushed position) hides
//! the one live row with that key in the files of the table version read
//! (a primary key: at most one). Its position there — the file and the
//! row's index in it — is a fact about that table version, which never
//! changes: it is noted once per version and key, by whoever finds it.
//! A write by key looks its row up through the key index before it
//! changes it, and an INSERT checks that its key is not in the files:
//! both note what they found ([`RowStore::note`]), so the scans after
//! them know every position without reading anything. Keys nobody noted
//! for the version read (after a flush made a new version, after a
//! restart replayed the log, or a write that took a scan) are found by one
//! scan of the key columns with row ids ([`locate`]), and noted.
//!
//! A scan of a table version then reads its files with their deletion
//! vectors widened by the hidden positions ([`hidden_positions`]), and a
//! flush deletes the same positions. The positions of one view (the
//! store's rows at a snapshot) are kept with it, for the scans that share
//! it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{Int64Type, UInt32Type};
use cirro_common::{CirroError, Result};
use datafusion::catalog::Session;
use datafusion::datasource::TableProvider;
use datafusion::physical_plan::execute_stream;
use futures::StreamExt;
use roaring::RoaringTreemap;

use super::{Key, RowStore, StoreView};
use crate::table::{CirroTable, FILE_INDEX_COLUMN, ROW_INDEX_COLUMN};

/// A row of a table version's files: the file (its URL, as
/// [`crate::table::DataFile::url`]) and the row's index in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowAt {
    pub file: Arc<str>,
    pub row: u64,
}

/// Rows hidden by a store, by file URL.
pub type Hidden = HashMap<Arc<str>, RoaringTreemap>;

/// Table versions whose positions are kept (a scan of a pinned older
/// version and one of the newest go on side by side).
const VERSIONS: usize = 2;

/// Notes kept beyond twice the store's keys before the notes of keys the
/// store no longer holds (lookups of point reads note too) are dropped.
const SPARE_NOTES: usize = 4096;

/// Positions noted per table version: key → its live file row, or None:
/// no file row has the key.
#[derive(Debug, Default)]
pub(super) struct Notes {
    versions: VecDeque<(i64, HashMap<Key, Option<RowAt>>)>,
    /// Bytes held (approximately), kept as notes come and go: the
    /// stores' size is asked before every small write's commit.
    bytes: usize,
}

/// Bytes a note costs beyond its key.
const NOTE_OVERHEAD: usize = 48;

fn bytes_of(notes: &HashMap<Key, Option<RowAt>>) -> usize {
    notes.keys().map(|k| k.len() + NOTE_OVERHEAD).sum()
}

impl Notes {
    fn of(&mut self, version: i64) -> &mut HashMap<Key, Option<RowAt>> {
        let at = match self.versions.iter().position(|(v, _)| *v == version) {
            Some(at) => at,
            None => {
                // A newer version replaces the oldest; an older one than
                // every kept version is noted, then dropped first.
                if self.versions.len() == VERSIONS {
                    let oldest = (0..self.versions.len())
                        .min_by_key(|&i| self.versions[i].0)
                        .unwrap_or(0);
                    if let Some((_, gone)) = self.versions.remove(oldest) {
                        self.bytes = self.bytes.saturating_sub(bytes_of(&gone));
                    }
                }
                self.versions.push_back((version, HashMap::new()));
                self.versions.len() - 1
            }
        };
        &mut self.versions[at].1
    }

    fn get(&self, version: i64, key: &[u8]) -> Option<&Option<RowAt>> {
        self.versions
            .iter()
            .find(|(v, _)| *v == version)
            .and_then(|(_, notes)| notes.get(key))
    }

    /// Bytes held (approximately).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl RowStore {
    /// Note where the files of table version `version` hold `key`'s live
    /// row (None: nowhere), as a lookup by key found it.
    pub fn note(&self, version: i64, key: Key, at: Option<RowAt>) {
        let held = self.len();
        let Ok(mut notes) = self.notes.lock() else {
            return;
        };
        let added = key.len() + NOTE_OVERHEAD;
        let noted = notes.of(version);
        let fresh = noted.insert(key, at).is_none();
        let mut pruned = None;
        if noted.len() > 2 * held + SPARE_NOTES {
            if let Ok(state) = self.state.read() {
                let before = bytes_of(noted);
                noted.retain(|k, _| state.keys.contains_key(k));
                pruned = Some(before - bytes_of(noted));
            }
        }
        if fresh {
            notes.bytes += added;
        }
        if let Some(freed) = pruned {
            notes.bytes = notes.bytes.saturating_sub(freed);
        }
    }

    /// How many scans of the key columns found hidden rows nobody had
    /// noted (see the module docs).
    pub fn located_by_scan(&self) -> u64 {
        self.located_by_scan
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The positions noted for `keys` in table version `version`, and the
    /// keys not noted.
    pub(super) fn noted<'a>(
        &self,
        version: i64,
        keys: impl Iterator<Item = &'a Key>,
    ) -> (Hidden, Vec<Key>) {
        let mut hidden = Hidden::new();
        let mut missing = Vec::new();
        let Ok(notes) = self.notes.lock() else {
            return (hidden, keys.cloned().collect());
        };
        for key in keys {
            match notes.get(version, key) {
                Some(Some(at)) => {
                    hidden
                        .entry(Arc::clone(&at.file))
                        .or_default()
                        .insert(at.row);
                }
                Some(None) => {}
                None => missing.push(key.clone()),
            }
        }
        (hidden, missing)
    }
}

/// The rows of `table`'s files (its version, as scanned) that `view`
/// hides: kept with the view once found.
pub async fn hidden_positions(
    table: &CirroTable,
    state: &dyn Session,
    store: &RowStore,
    view: &StoreView,
) -> Result<Arc<Hidden>> {
    let version = table.version();
    if let Some(kept) = view.positions(version) {
        return Ok(kept);
    }
    let (mut hidden, missing) = store.noted(version, view.hidden.iter());
    if !missing.is_empty() {
        store
            .located_by_scan
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let missing: HashSet<Key> = missing.into_iter().collect();
        let mut found = HashSet::new();
        for (key, at) in locate(table, state, store, &missing).await? {
            hidden
                .entry(Arc::clone(&at.file))
                .or_default()
                .insert(at.row);
            found.insert(key.clone());
            store.note(version, key, Some(at));
        }
        for key in missing {
            if !found.contains(&key) {
                store.note(version, key, None);
            }
        }
    }
    Ok(view.keep_positions(version, Arc::new(hidden)))
}

/// The live rows of `table`'s files whose key is one of `keys`: one scan
/// of the key columns with row ids.
async fn locate(
    table: &CirroTable,
    state: &dyn Session,
    store: &RowStore,
    keys: &HashSet<Key>,
) -> Result<Vec<(Key, RowAt)>> {
    let key = store
        .key_columns()
        .ok_or_else(|| CirroError::internal("row store: hidden keys without a key"))?;
    let scanned = table.with_row_ids();
    let schema = scanned.schema();
    let position = |name: &str| {
        schema
            .index_of(name)
            .map_err(|e| CirroError::internal(format!("row store: locating keys: {e}")))
    };
    let mut projection: Vec<usize> = key.to_vec();
    projection.push(position(FILE_INDEX_COLUMN)?);
    projection.push(position(ROW_INDEX_COLUMN)?);
    let plan = scanned.scan(state, Some(&projection), &[], None).await?;
    let mut stream = execute_stream(plan, state.task_ctx())?;
    let width = key.len();
    let urls: Vec<Arc<str>> = table
        .files()
        .iter()
        .map(|f| Arc::from(f.url.as_str()))
        .collect();
    let mut found = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let columns: Vec<ArrayRef> = batch.columns()[..width].to_vec();
        let encoded = store.encode_keys(&columns)?;
        let indices = batch
            .column(width)
            .as_any()
            .downcast_ref::<arrow::array::PrimitiveArray<UInt32Type>>()
            .ok_or_else(|| CirroError::internal("row ids: file index is not UInt32"))?;
        let rows = batch
            .column(width + 1)
            .as_any()
            .downcast_ref::<arrow::array::PrimitiveArray<Int64Type>>()
            .ok_or_else(|| CirroError::internal("row ids: row position is not Int64"))?;
        for (i, key) in encoded.into_iter().enumerate() {
            if !keys.contains(&key) || indices.is_null(i) || rows.is_null(i) {
                continue;
            }
            let file = urls
                .get(indices.value(i) as usize)
                .ok_or_else(|| CirroError::internal("row id out of range"))?;
            found.push((
                key,
                RowAt {
                    file: Arc::clone(file),
                    row: rows.value(i).max(0) as u64,
                },
            ));
        }
    }
    Ok(found)
}

/// `hidden` by the index of each file in `table.files()` (files the table
/// version does not have are left out: nothing of theirs is read).
pub fn by_index(table: &CirroTable, hidden: &Hidden) -> HashMap<usize, RoaringTreemap> {
    if hidden.is_empty() {
        return HashMap::new();
    }
    table
        .files()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| hidden.get(f.url.as_str()).map(|rows| (i, rows.clone())))
        .collect()
}
