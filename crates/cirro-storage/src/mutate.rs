//! DELETE, UPDATE and MERGE on a Cirro table: merge-on-read with deletion
//! vectors, one Delta commit per statement.
//!
//! ```text
//!  plan rows ──► (file index, row position) of each changed row ──► new DVs
//!            └─► new versions of updated / inserted rows ──► new data files
//!
//!  commit:  per touched file  remove(old DV) + add(same file, old ∪ new DV)
//!                         or  remove (every row deleted)
//!                         or  remove + survivors rewritten (mostly deleted,
//!                                        or merged: `rewrite_file`)
//!           + add(new data files)
//! ```
//!
//! A file keeps its data and gets a deletion vector unless, after the
//! statement, more than [`REWRITE_FRACTION`] of its rows are deleted: then its
//! surviving rows are copied into new files and the file is removed
//! (copy-on-write), because every later scan would read mostly dead rows. A
//! file with no surviving row is simply removed. Tables whose protocol lacks the
//! `deletionVectors` feature (none that Cirro creates) always take the
//! copy-on-write path.
//!
//! Nothing is visible before the commit; if the statement fails or the commit
//! loses against a conflicting writer, the new data and DV files are removed
//! and the table stays at the version it was read at.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type};
use cirro_common::{CirroError, Result, SqlState};
use datafusion::catalog::Session;
use datafusion::physical_plan::execute_stream;
use deltalake::kernel::Action;
use deltalake::protocol::{DeltaOperation, SaveMode};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use roaring::RoaringTreemap;

use crate::dv;
use crate::failpoint;
use crate::table::CirroTable;
use crate::write::{Committed, TableWriter, commit_actions, commit_exclusive};

/// Share of a file's rows that may be deleted before the file is rewritten
/// instead of carrying a deletion vector.
pub const REWRITE_FRACTION: f64 = 0.5;

/// The changes of one DELETE/UPDATE/MERGE, gathered while its plan runs.
pub struct Mutation {
    table: CirroTable,
    /// Newly deleted rows by file index.
    deleted: BTreeMap<usize, RoaringTreemap>,
    /// Files whose surviving rows are copied into new files whatever share
    /// of their rows is deleted (see [`Mutation::rewrite_file`]).
    rewritten: BTreeSet<usize>,
    writer: TableWriter,
}

impl Mutation {
    pub fn new(table: &CirroTable) -> Result<Self> {
        let writer = TableWriter::for_view(table, SaveMode::Append)?;
        Ok(Self {
            table: table.without_row_ids(),
            deleted: BTreeMap::new(),
            rewritten: BTreeSet::new(),
            writer,
        })
    }

    pub fn table(&self) -> &CirroTable {
        &self.table
    }

    /// Mark rows as deleted, given a file-index column and a row-position
    /// column (the scan's row ids). A row marked twice means that several
    /// source rows matched one target row: 21000.
    pub fn delete_rows(&mut self, files: &dyn Array, rows: &dyn Array) -> Result<u64> {
        let files = files
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| CirroError::internal("row ids: file index is not UInt32"))?;
        let rows = rows
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| CirroError::internal("row ids: row position is not Int64"))?;
        let mut count = 0;
        for (file, row) in files.iter().zip(rows.iter()) {
            let (Some(file), Some(row)) = (file, row) else {
                continue; // no target row (an INSERT of MERGE)
            };
            let file = file as usize;
            if file >= self.table.files().len() || row < 0 {
                return Err(CirroError::internal("row id out of range"));
            }
            if !self.deleted.entry(file).or_default().insert(row as u64) {
                return Err(CirroError::new(
                    SqlState::CARDINALITY_VIOLATION,
                    "a target row was matched by more than one source row; \
                     make the join condition match at most one source row per target row",
                ));
            }
            count += 1;
        }
        Ok(count)
    }

    /// Copy the surviving rows of file `index` into the change's new files
    /// and remove it, whatever share of its rows is deleted: merges small
    /// files into the change's own (see `rowstore::flush`).
    pub fn rewrite_file(&mut self, index: usize) -> Result<()> {
        if index >= self.table.files().len() {
            return Err(CirroError::internal("rewrite: file index out of range"));
        }
        self.deleted.entry(index).or_default();
        self.rewritten.insert(index);
        Ok(())
    }

    /// Add rows (new versions of updated rows, or inserted rows); their columns
    /// are, by position, the table's columns.
    pub async fn insert(&mut self, batch: RecordBatch) -> Result<()> {
        self.writer.write(batch).await
    }

    /// Write everything the change needs (new data files, the DV file) and
    /// return the actions that would commit it, without committing.
    pub async fn prepare(self, state: &dyn Session) -> Result<Change> {
        let Mutation {
            table,
            deleted,
            rewritten,
            mut writer,
        } = self;
        let indices: Vec<usize> = deleted.keys().copied().collect();
        let logged = match table.deletion_vectors(&indices).await {
            Ok(logged) => logged,
            Err(e) => {
                writer.abort().await;
                return Err(e);
            }
        };
        let use_dvs = table.supports_deletion_vectors();
        let mut actions: Vec<Action> = Vec::new();
        let mut keep_dv: Vec<(usize, RoaringTreemap)> = Vec::new();
        let mut rewrite: Vec<(usize, RoaringTreemap)> = Vec::new();
        for ((index, new), old) in deleted.into_iter().zip(logged) {
            let file = &table.files()[index];
            let mut all = old.unwrap_or_default();
            all |= new;
            let total = file.num_records.map(|n| n as u64);
            actions.push(Action::Remove(remove_of(file)));
            if total == Some(all.len()) {
                continue; // no row survives: the remove alone
            }
            if !use_dvs
                || rewritten.contains(&index)
                || total.is_none()
                || all.len() as f64 > REWRITE_FRACTION * total.unwrap_or(0) as f64
            {
                rewrite.push((index, all));
            } else {
                keep_dv.push((index, all));
            }
        }
        // Copy-on-write: the survivors of mostly deleted files go to new files.
        if !rewrite.is_empty()
            && let Err(e) = copy_survivors(&table, state, rewrite, &mut writer).await
        {
            writer.abort().await;
            return Err(e);
        }
        let adds = writer.finish().await?;
        let mut new_files: Vec<Path> = adds.iter().map(|a| Path::from(a.path.as_str())).collect();
        if !keep_dv.is_empty() {
            let bitmaps: Vec<&RoaringTreemap> = keep_dv.iter().map(|(_, dv)| dv).collect();
            match dv::write_file(&table.delta().object_store(), &bitmaps).await {
                Ok(written) => {
                    for ((index, _), descriptor) in keep_dv.iter().zip(&written.descriptors) {
                        let mut add = table.files()[*index].add.clone();
                        add.deletion_vector = Some(descriptor.clone());
                        add.data_change = true;
                        add.modification_time = chrono::Utc::now().timestamp_millis();
                        add.stats = add.stats.as_deref().map(loose_bounds);
                        actions.push(Action::Add(add));
                    }
                    new_files.push(written.path);
                }
                Err(e) => {
                    remove_paths(&table, &new_files).await;
                    return Err(e);
                }
            }
        }
        actions.extend(adds.into_iter().map(Action::Add));
        Ok(Change {
            table,
            actions,
            new_files,
        })
    }

    /// Give up: remove the files written so far. The table is unchanged.
    pub async fn abort(mut self) {
        self.writer.abort().await;
    }
}

/// A change to one table, written but not committed: the actions that commit
/// it and the files it wrote (removed again if it is discarded).
#[derive(Debug, Clone)]
pub struct Change {
    table: CirroTable,
    actions: Vec<Action>,
    new_files: Vec<Path>,
}

impl Change {
    /// A change of `table` made of `actions`, which wrote the data files
    /// `adds`.
    pub(crate) fn new(
        table: &CirroTable,
        actions: Vec<Action>,
        adds: &[deltalake::kernel::Add],
    ) -> Self {
        Self {
            table: table.without_row_ids(),
            actions,
            new_files: adds.iter().map(|a| Path::from(a.path.as_str())).collect(),
        }
    }

    /// The table's new metadata (schema and options), if the change sets one
    /// (ALTER TABLE).
    pub fn metadata(&self) -> Option<&deltalake::kernel::Metadata> {
        self.actions.iter().find_map(|a| match a {
            Action::Metadata(m) => Some(m),
            _ => None,
        })
    }

    /// A change that adds the data files `adds` (an INSERT), and with
    /// `replace_all` removes every file the table had (INSERT OVERWRITE,
    /// TRUNCATE).
    pub fn append(
        table: &CirroTable,
        adds: Vec<deltalake::kernel::Add>,
        replace_all: bool,
    ) -> Self {
        let new_files = adds.iter().map(|a| Path::from(a.path.as_str())).collect();
        let mut actions: Vec<Action> = Vec::new();
        if replace_all {
            actions.extend(table.files().iter().map(|f| Action::Remove(remove_of(f))));
        }
        actions.extend(adds.into_iter().map(Action::Add));
        Self {
            table: table.without_row_ids(),
            actions,
            new_files,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// The change with one more action committed with it (a row store
    /// flush's `txn` action).
    pub fn with_action(mut self, action: Action) -> Self {
        self.actions.push(action);
        self
    }

    pub fn table(&self) -> &CirroTable {
        &self.table
    }

    /// Files (relative to the table directory) this change wrote.
    pub fn new_files(&self) -> &[Path] {
        &self.new_files
    }

    /// The table as it is after this change (not committed).
    pub fn apply(&self) -> Result<CirroTable> {
        self.table.with_changes(&self.actions)
    }

    /// `latest` (a newer snapshot of the same table) with this change
    /// applied: what the table will hold if the change commits now.
    pub fn apply_to(&self, latest: &CirroTable) -> Result<CirroTable> {
        latest.with_changes(&self.actions)
    }

    /// Commit the change as one new version (see [`Committed`]). If the
    /// commit fails (conflict, I/O), the change's files are removed. A change
    /// of the schema commits exclusively: it fails with 40001 if any writer
    /// committed after the snapshot it read.
    pub async fn commit(self, operation: DeltaOperation) -> Result<Committed> {
        failpoint::reach("mutate.before_commit", 1);
        let committed = if self.metadata().is_some() {
            commit_exclusive(self.table.delta(), self.actions, operation).await
        } else {
            commit_actions(self.table.delta(), self.actions, operation).await
        };
        match committed {
            Ok(committed) => {
                failpoint::reach("mutate.after_commit", 1);
                Ok(committed)
            }
            Err(e) => {
                remove_paths(&self.table, &self.new_files).await;
                Err(e)
            }
        }
    }

    /// Drop the change: remove the files it wrote.
    pub async fn discard(self) {
        remove_paths(&self.table, &self.new_files).await;
    }
}

/// The actions that take snapshot `base` to the view `current`: removes for
/// files that are gone or whose deletion vector changed, adds for files that
/// are new or changed.
pub fn difference(base: &CirroTable, current: &CirroTable) -> Vec<Action> {
    let key = |f: &crate::table::DataFile| {
        let dv = f.add.deletion_vector.as_ref();
        (
            f.add.path.clone(),
            dv.map(|d| (d.path_or_inline_dv.clone(), d.offset)),
        )
    };
    let before: std::collections::HashSet<_> = base.files().iter().map(key).collect();
    let after: std::collections::HashSet<_> = current.files().iter().map(key).collect();
    let mut actions: Vec<Action> = base
        .files()
        .iter()
        .filter(|f| !after.contains(&key(f)))
        .map(|f| Action::Remove(remove_of(f)))
        .collect();
    actions.extend(
        current
            .files()
            .iter()
            .filter(|f| !before.contains(&key(f)))
            .map(|f| Action::Add(f.add.clone())),
    );
    actions
}

/// Remove files of `table` (paths relative to its directory); failures are
/// logged, the files are garbage either way.
pub async fn remove_paths(table: &CirroTable, paths: &[Path]) {
    let store = table.delta().object_store();
    for path in paths {
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => log::warn!("could not remove unreferenced file {path}: {e}"),
        }
    }
}

/// The `remove` action for a data file as the snapshot holds it (with its
/// current deletion vector, as the protocol requires).
pub(crate) fn remove_of(file: &crate::table::DataFile) -> deltalake::kernel::Remove {
    let add = &file.add;
    deltalake::kernel::Remove {
        path: add.path.clone(),
        data_change: true,
        deletion_timestamp: Some(chrono::Utc::now().timestamp_millis()),
        extended_file_metadata: Some(true),
        size: Some(add.size),
        partition_values: Some(add.partition_values.clone()),
        deletion_vector: add.deletion_vector.clone(),
        tags: None,
        base_row_id: add.base_row_id,
        default_row_commit_version: add.default_row_commit_version,
    }
}

/// File statistics of a file with a deletion vector: the min/max values still
/// bound the live rows but are no longer tight (Delta `tightBounds`).
fn loose_bounds(stats: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(stats) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.insert("tightBounds".into(), serde_json::Value::Bool(false));
            serde_json::Value::Object(map).to_string()
        }
        _ => stats.to_string(),
    }
}

/// Write the rows of `files` that survive their deletion vectors into
/// `writer` (copy-on-write).
async fn copy_survivors(
    table: &CirroTable,
    state: &dyn Session,
    files: Vec<(usize, RoaringTreemap)>,
    writer: &mut TableWriter,
) -> Result<()> {
    let files = files
        .into_iter()
        .map(|(i, dv)| (i, Some(std::sync::Arc::new(crate::dv::Deleted::new(dv)))))
        .collect();
    let plan = table.scan_files(state, files, None, None).await?;
    let mut stream = execute_stream(plan, state.task_ctx())?;
    while let Some(batch) = stream.next().await {
        writer.write(batch?).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_bounds_marks_stats() {
        let out = loose_bounds(r#"{"numRecords":3,"minValues":{"a":1}}"#);
        let value: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["tightBounds"], serde_json::Value::Bool(false));
        assert_eq!(value["numRecords"], 3);
    }
}
