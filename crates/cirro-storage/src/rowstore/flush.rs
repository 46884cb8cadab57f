//! Flushing a row store into its table's files: one Delta commit that
//! deletes the file rows of every key the store holds up to a log position
//! (deletion vectors), adds the store's rows as new files, and records the
//! position as the table's `txn` action for [`FLUSH_APP_ID`] — so that a
//! process that opens the table after a crash replays exactly the records
//! after it, and other engines reading the Delta log see the flushed rows.
//!
//! Each flush adds a file, and keys written at random land in every one of
//! them, so a point read would probe a number of files that grows with the
//! table's age. A flush therefore also merges small files into its own,
//! by tiers of size (as size-tiered compaction in LSM stores): when a tier
//! holds [`MERGE_FANIN`] files, their live rows go into the flush's new
//! file in the same commit. A table keeps a few files per tier, and a row
//! is copied once per tier it climbs.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray};
use cirro_common::{CirroError, Result};
use datafusion::catalog::Session;
use deltalake::kernel::{Action, Transaction};
use deltalake::protocol::DeltaOperation;

use super::{RowStore, StoreView};
use crate::mutate::Mutation;
use crate::table::CirroTable;
use crate::wal::Lsn;
use crate::write::{Committed, data_file_bytes_target};

/// The Delta application id under which a table's flushes record the log
/// position they cover.
pub const FLUSH_APP_ID: &str = "cirro-row-store";

/// A tier's files are merged when it holds this many (the flush's own new
/// file included, for the lowest tier).
pub const MERGE_FANIN: usize = 4;

/// Files under this size form the lowest tier; each tier above spans a
/// factor of [`MERGE_FANIN`] in size.
const FIRST_TIER_BYTES: u64 = 1 << 20;

/// The tier of a file of `bytes`: 0 under [`FIRST_TIER_BYTES`], then one
/// per factor of [`MERGE_FANIN`].
fn tier(bytes: u64) -> u32 {
    let mut tier = 0;
    let mut bound = FIRST_TIER_BYTES;
    while bytes >= bound {
        tier += 1;
        bound = bound.saturating_mul(MERGE_FANIN as u64);
    }
    tier
}

/// Indices of the files of `sizes` (bytes, by file index) a flush merges
/// into its new file: those of the lowest tier that is full, counting the
/// flush's new file in tier 0. Files of at least `large` bytes (half the
/// target file size) are never merged.
pub(crate) fn files_to_merge(sizes: &[u64], large: u64) -> Vec<usize> {
    let mut tiers: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (index, &bytes) in sizes.iter().enumerate() {
        if bytes < large {
            tiers.entry(tier(bytes)).or_default().push(index);
        }
    }
    tiers
        .into_iter()
        .find(|(tier, files)| files.len() + usize::from(*tier == 0) >= MERGE_FANIN)
        .map(|(_, files)| files)
        .unwrap_or_default()
}

/// The log position the files of `table` hold the row store's rows up to
/// (the newest flush's `txn` action; 0 if none).
pub async fn flushed_position(table: &CirroTable) -> Result<Lsn> {
    let delta = table.delta();
    let version = delta
        .snapshot()?
        .transaction_version(delta.log_store().as_ref(), FLUSH_APP_ID)
        .await?;
    Ok(version.unwrap_or(0).max(0) as Lsn)
}

/// Write `view` (the store's rows up to `upto`, over the files of `table`,
/// the table's latest snapshot) into the table: one commit, recording
/// `upto`. None if there was nothing to write.
pub async fn flush_view(
    table: &CirroTable,
    state: &dyn Session,
    store: &RowStore,
    view: &StoreView,
    upto: Lsn,
) -> Result<Option<Committed>> {
    if view.is_empty() {
        return Ok(None);
    }
    let mut mutation = Mutation::new(table)?;
    let sizes: Vec<u64> = table.files().iter().map(|f| f.size).collect();
    for index in files_to_merge(&sizes, data_file_bytes_target() / 2) {
        mutation.rewrite_file(index)?;
    }
    let outcome = async {
        if !view.hidden.is_empty() {
            delete_hidden(table, state, store, view, &mut mutation).await?;
        }
        if let Some(rows) = &view.rows {
            mutation.insert(rows.clone()).await?;
        }
        Ok::<_, CirroError>(())
    }
    .await;
    if let Err(e) = outcome {
        mutation.abort().await;
        return Err(e);
    }
    let change = mutation
        .prepare(state)
        .await?
        .with_action(Action::Txn(Transaction {
            app_id: FLUSH_APP_ID.to_string(),
            version: upto as i64,
            last_updated: Some(chrono::Utc::now().timestamp_millis()),
        }));
    let committed = change
        .commit(DeltaOperation::Update { predicate: None })
        .await?;
    Ok(Some(committed))
}

/// Mark the file rows whose key `view` hides as deleted (their positions,
/// as scans of the view found or writers noted them).
async fn delete_hidden(
    table: &CirroTable,
    state: &dyn Session,
    store: &RowStore,
    view: &StoreView,
    mutation: &mut Mutation,
) -> Result<()> {
    let hidden = super::hidden_positions(table, state, store, view).await?;
    let mut files: Vec<u32> = Vec::new();
    let mut rows: Vec<i64> = Vec::new();
    for (index, positions) in super::by_index(table, &hidden) {
        for row in positions.iter() {
            files.push(index as u32);
            rows.push(row as i64);
        }
    }
    let files = arrow::array::UInt32Array::from(files);
    let rows = arrow::array::Int64Array::from(rows);
    mutation.delete_rows(&files, &rows)?;
    Ok(())
}

/// Rows of `batch` whose key is not hidden by `view` (for merging a
/// table's file rows with its store); `key` are the key columns' indices.
pub fn without_hidden(
    store: &RowStore,
    hidden: &std::collections::HashSet<super::Key>,
    batch: &arrow::array::RecordBatch,
    key: &[usize],
) -> Result<Option<arrow::array::RecordBatch>> {
    if hidden.is_empty() || batch.num_rows() == 0 {
        return Ok(Some(batch.clone()));
    }
    let columns: Vec<ArrayRef> = key.iter().map(|&i| Arc::clone(batch.column(i))).collect();
    let encoded = store.encode_keys(&columns)?;
    let keep: BooleanArray = encoded.iter().map(|k| Some(!hidden.contains(k))).collect();
    if keep.true_count() == batch.num_rows() {
        return Ok(Some(batch.clone()));
    }
    if keep.true_count() == 0 {
        return Ok(None);
    }
    Ok(Some(arrow::compute::filter_record_batch(batch, &keep)?))
}
