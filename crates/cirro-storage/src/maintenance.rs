//! Table maintenance: OPTIMIZE (compaction, deletion vectors folded back in,
//! clustering) and VACUUM (removing files no version needs any more).
//!
//! OPTIMIZE rewrites, in one commit:
//! - a clustered or indexed table (`cluster_by`, an index or primary key):
//!   every file, when there is more than one
//!   or any has deletion vectors, into files sorted by its key;
//! - any other table: the files that carry deletion vectors, and the small
//!   files (under half the target file size) when there are at least two.
//!
//! The rewritten rows are the files' live rows (deletion vectors applied), so
//! the new files carry none. The old files are removed with `dataChange`
//! set: a concurrent DELETE/UPDATE/MERGE that read them then fails its commit
//! with 40001 instead of resurrecting them. The old files stay on storage for
//! time travel until VACUUM removes them.

use std::sync::Arc;

use cirro_common::{CirroError, Result};
use datafusion::catalog::Session;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execute_stream;
use datafusion::physical_plan::sorts::sort::SortExec;
use deltalake::kernel::Action;
use deltalake::operations::vacuum::VacuumMode;
use deltalake::protocol::DeltaOperation;
use deltalake::table::config::TablePropertiesExt as _;
use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::failpoint;
use crate::mutate::{remove_of, remove_paths};
use crate::table::CirroTable;
use crate::write::{commit_actions, commit_logged, data_file_bytes_target, write_files};

/// What OPTIMIZE did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OptimizeSummary {
    pub files_removed: u64,
    pub files_added: u64,
    /// Deletion vectors folded into rewritten files.
    pub deletion_vectors_removed: u64,
    pub rows_written: u64,
    /// The new version, if there was anything to do.
    pub version: Option<i64>,
    /// The files it replaced (see [`crate::write::Committed`]).
    pub replaced: Vec<String>,
}

/// Indices of the files OPTIMIZE rewrites.
fn files_to_rewrite(table: &CirroTable) -> Vec<usize> {
    let files = table.files();
    let with_dv = files.iter().any(|f| f.deletion_vector().is_some());
    if !table.options().write_order().is_empty() {
        return if files.len() > 1 || with_dv {
            (0..files.len()).collect()
        } else {
            Vec::new()
        };
    }
    let small = data_file_bytes_target() / 2;
    let small_files: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].size < small)
        .collect();
    let mut chosen: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].deletion_vector().is_some())
        .collect();
    if small_files.len() >= 2 {
        chosen.extend(small_files);
        chosen.sort_unstable();
        chosen.dedup();
    }
    chosen
}

/// OPTIMIZE `table` (at the snapshot it holds).
pub async fn optimize(table: &CirroTable, state: &dyn Session) -> Result<OptimizeSummary> {
    let table = table.without_row_ids();
    let chosen = files_to_rewrite(&table);
    if chosen.is_empty() {
        return Ok(OptimizeSummary::default());
    }
    let deleted = table.deleted_all(&chosen).await?;
    let deletion_vectors_removed = deleted.iter().filter(|d| d.is_some()).count() as u64;
    let files: Vec<_> = chosen.iter().copied().zip(deleted).collect();
    let mut plan = table.scan_files(state, files, None, None).await?;
    let order = table.options().write_order();
    if !order.is_empty() {
        let schema = plan.schema();
        let mut keys = Vec::new();
        for key in &order {
            keys.push(PhysicalSortExpr::new(
                datafusion::physical_expr::expressions::col(&key.name, &schema)?,
                arrow::compute::SortOptions {
                    descending: key.descending,
                    nulls_first: key.descending,
                },
            ));
        }
        if let Some(ordering) = LexOrdering::new(keys) {
            let single = Arc::new(CoalescePartitionsExec::new(plan));
            plan = Arc::new(SortExec::new(ordering, single));
        }
    }
    let stream = execute_stream(plan, state.task_ctx())?.map(|b| b.map_err(CirroError::from));
    let (adds, rows_written) = write_files(&table, stream).await?;
    let new_files: Vec<object_store::path::Path> = adds
        .iter()
        .map(|a| object_store::path::Path::from(a.path.as_str()))
        .collect();
    let mut actions: Vec<Action> = chosen
        .iter()
        .map(|&i| Action::Remove(remove_of(&table.files()[i])))
        .collect();
    let files_added = adds.len() as u64;
    actions.extend(adds.into_iter().map(Action::Add));
    failpoint::reach("optimize.before_commit", 1);
    let operation = DeltaOperation::Optimize {
        predicate: None,
        target_size: data_file_bytes_target() as i64,
    };
    match commit_actions(table.delta(), actions, operation).await {
        Ok(committed) => {
            failpoint::reach("optimize.after_commit", 1);
            Ok(OptimizeSummary {
                files_removed: chosen.len() as u64,
                files_added,
                deletion_vectors_removed,
                rows_written,
                version: Some(committed.version),
                replaced: committed.replaced,
            })
        }
        Err(e) => {
            remove_paths(&table, &new_files).await;
            Err(e)
        }
    }
}

/// VACUUM: delete the files of `table` that no version newer than
/// `retain_hours` ago references — files OPTIMIZE, DELETE, UPDATE, MERGE,
/// TRUNCATE and INSERT OVERWRITE replaced, old deletion vectors, and files a
/// crashed or failed writer left behind. Versions older than that can no
/// longer be read (time travel).
///
/// Files younger than the retention are always kept, so a writer that is
/// still writing is safe unless the retention is 0 hours. On a local
/// directory the staging files of killed writers (`part-….parquet#1`) go too.
pub async fn vacuum(table: &CirroTable, retain_hours: u64) -> Result<Vacuumed> {
    let retention = chrono::Duration::hours(retain_hours.min(i64::MAX as u64 / 3_600_000) as i64);
    // delta-rs plans which files go; Cirro deletes them and logs VACUUM
    // START and END itself, through its own commit path (`write.rs`,
    // `CommitBase`), which delta-rs's VACUUM would bypass.
    let (_, planned) = table
        .delta()
        .clone()
        .vacuum()
        .with_retention_period(retention)
        .with_enforce_retention_duration(false)
        .with_mode(VacuumMode::Full)
        .with_dry_run(true)
        .await?;
    let files = planned.files_deleted;
    if !files.is_empty() {
        let default_retention = table
            .delta()
            .snapshot()?
            .table_config()
            .deleted_file_retention_duration();
        let start = DeltaOperation::VacuumStart {
            retention_check_enabled: false,
            specified_retention_millis: Some(retention.num_milliseconds()),
            default_retention_millis: default_retention.as_millis() as i64,
        };
        let metrics = serde_json::json!({ "numFilesToDelete": files.len() });
        commit_logged(table.delta(), start, metrics).await?;
        let store = table.delta().object_store();
        for file in &files {
            match store.delete(&deltalake::Path::from(file.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let end = DeltaOperation::VacuumEnd {
            status: "COMPLETED".to_string(),
        };
        let metrics = serde_json::json!({
            "numDeletedFiles": files.len(),
            "numVacuumedDirectories": 0,
        });
        commit_logged(table.delta(), end, metrics).await?;
    }
    let metrics = deltalake::operations::vacuum::VacuumMetrics {
        files_deleted: files,
        dry_run: false,
    };
    let mut deleted = metrics.files_deleted.len() as u64;
    let removed = metrics
        .files_deleted
        .iter()
        .filter_map(|file| table.url().join(file).ok())
        .map(|url| url.to_string())
        .collect();
    if table.url().scheme() == "file"
        && let Ok(dir) = table.url().to_file_path()
    {
        let cutoff = std::time::SystemTime::now()
            .checked_sub(std::time::Duration::from_secs(
                retain_hours.saturating_mul(3600),
            ))
            .unwrap_or(std::time::UNIX_EPOCH);
        deleted += remove_staging_files(&dir, cutoff)?;
    }
    Ok(Vacuumed { deleted, removed })
}

/// What VACUUM did.
#[derive(Debug)]
pub struct Vacuumed {
    /// Files deleted.
    pub deleted: u64,
    /// The URLs of the data files it deleted through delta-rs (whose
    /// stores do not pass the node's disk tier): the tier drops their
    /// blocks ([`crate::cache::disk::DiskTier::forget`]).
    pub removed: Vec<String>,
}

/// object_store's local store writes a file as `name#n` and renames it to
/// `name` once complete. A writer killed midway leaves the staging file, which
/// no listing shows (so it is never read, and delta-rs's VACUUM never sees
/// it): remove those under `dir` last modified before `cutoff`. Returns how
/// many.
fn remove_staging_files(dir: &std::path::Path, cutoff: std::time::SystemTime) -> Result<u64> {
    let is_staging = |name: &str| {
        name.rsplit_once('#')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut removed = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let name = entry.file_name();
            if meta.is_dir() {
                if name != "_delta_log" {
                    pending.push(path);
                }
            } else if is_staging(&name.to_string_lossy())
                && meta.modified().is_ok_and(|m| m <= cutoff)
            {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}
