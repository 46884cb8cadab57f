//! Writing rows into a Cirro table: one statement, one Delta commit.
//!
//! ```text
//!  batches ──► cast to stored types ──► NOT NULL check ──► Parquet files (zstd)
//!                                                             │ all written
//!                                                             ▼
//!                               Delta commit: add (+ remove for OVERWRITE)
//! ```
//!
//! Files are complete on storage before the commit names them; a statement that
//! fails (bad value, NULL in a NOT NULL column, I/O error, lost commit race)
//! removes the files it wrote and leaves the table at its previous version. A
//! process killed at any point leaves unreferenced files only.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::compute::CastOptions;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use cirro_common::char_length::CharLength;
use cirro_common::limits::DATA_FILE_BYTES_TARGET;
use cirro_common::limits::DATA_PAGE_ROWS_MAX;
use cirro_common::{CirroError, Result, SqlState};
use datafusion::datasource::sink::DataSink;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use delta_kernel::table_properties::TableProperties;
use deltalake::DeltaTable;
use deltalake::kernel::transaction::{
    CommitBuilder, CommitProperties, TableReference, TransactionError,
};
use deltalake::kernel::{Action, Add, EagerSnapshot, Metadata, Protocol, StructTypeExt};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::table::state::DeltaTableState;
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::failpoint;
use crate::options::TableOptions;
use crate::table::CirroTable;

/// Environment override of the data file size, for tests that need many files.
const DATA_FILE_BYTES_ENV: &str = "CIRRO_DATA_FILE_BYTES";

/// The size data files are cut at (`CIRRO_DATA_FILE_BYTES` overrides it).
pub fn data_file_bytes_target() -> u64 {
    std::env::var(DATA_FILE_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DATA_FILE_BYTES_TARGET)
}

/// A column's dictionary grows to this size before its values are written
/// plainly. Reading any page of a column chunk decodes its dictionary first:
/// with parquet-rs's 1 MiB, a lookup of one row by a unique string column
/// decompressed and decoded a 1 MiB dictionary (a third of its time, by
/// perf). Low-cardinality columns, where dictionaries pay, fit in 128 KiB.
const DICTIONARY_PAGE_BYTES_MAX: usize = 128 * 1024;

/// Parquet writer settings of a table: its codec and row-group size (see
/// [`TableOptions`]; zstd level 1 and 1 Mi rows by default), and pages of at
/// most [`DATA_PAGE_ROWS_MAX`] rows.
///
/// Key columns of indexes and of PRIMARY KEY/UNIQUE constraints get a bloom
/// filter in every row group, sized for a row group of distinct values and
/// folded down by the writer to what the values need (1 % false positives).
fn writer_properties(options: &TableOptions) -> Result<WriterProperties> {
    let mut builder = WriterProperties::builder()
        .set_compression(options.codec()?)
        .set_max_row_group_row_count(Some(options.row_group_rows()))
        .set_data_page_row_count_limit(DATA_PAGE_ROWS_MAX)
        .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES_MAX);
    for column in options.bloom_filter_columns() {
        let path = ColumnPath::from(column);
        builder = builder
            .set_column_bloom_filter_enabled(path.clone(), true)
            .set_column_bloom_filter_fpp(path.clone(), BLOOM_FILTER_FPP)
            .set_column_bloom_filter_max_ndv(path, options.row_group_rows() as u64);
    }
    Ok(builder.build())
}

/// False-positive rate of the bloom filters of key columns.
const BLOOM_FILTER_FPP: f64 = 0.01;

/// Streams batches into new data files of one table and commits them at once.
///
/// A bucketed table's rows go to one writer per bucket (created when the
/// bucket gets its first row), so every file holds one bucket; the files'
/// `add` actions are tagged with it. Writers of buckets hold their open
/// files' row groups in memory: past [`BUCKET_BUFFER_BYTES`] in all, the
/// largest is finished early (a smaller file, bounded memory).
pub struct TableWriter {
    table: DeltaTable,
    stored_schema: SchemaRef,
    /// The writer of the whole table, or of each bucket.
    writers: Vec<Option<RecordBatchWriter>>,
    /// How to make another writer (the schema to write, the options).
    template: WriterTemplate,
    /// The key columns and bucket count of a bucketed table.
    bucketing: Option<(Vec<usize>, u32)>,
    /// Files finished before the end (see [`BUCKET_BUFFER_BYTES`]).
    finished: Vec<Add>,
    mode: SaveMode,
    rows: u64,
    batches: u64,
}

/// What every writer of one [`TableWriter`] is made from.
struct WriterTemplate {
    /// Some: files of this schema instead of the table's (ALTER TABLE).
    new_schema: Option<SchemaRef>,
    properties: WriterProperties,
}

/// In-memory bytes of a bucketed write's open files before the largest is
/// finished early.
const BUCKET_BUFFER_BYTES: usize = 256 * 1024 * 1024;

impl TableWriter {
    /// `mode` is `Append` (INSERT) or `Overwrite` (replace all rows).
    pub fn new(table: &DeltaTable, stored_schema: SchemaRef, mode: SaveMode) -> Result<Self> {
        Self::build(table, stored_schema, mode, None)
    }

    /// A writer of new files of `table` as its reader sees it: with the
    /// schema and options of a transaction's staged ALTER TABLE where it has
    /// one, else as the Delta snapshot has them.
    pub fn for_view(table: &CirroTable, mode: SaveMode) -> Result<Self> {
        let stored = Arc::clone(table.stored_schema());
        if table.schema_staged() {
            Self::build(table.delta(), stored, mode, Some(table.options()))
        } else {
            Self::new(table.delta(), stored, mode)
        }
    }

    /// A writer of files with `stored_schema` instead of the table's current
    /// schema, for a commit that changes the schema (ALTER TABLE): delta-rs's
    /// `for_table` takes the schema from the snapshot, `try_new` from us.
    /// The options (indexes, codec, distribution) are the new ones too.
    pub fn with_new_schema(
        table: &DeltaTable,
        stored_schema: SchemaRef,
        options: &TableOptions,
    ) -> Result<Self> {
        Self::build(table, stored_schema, SaveMode::Append, Some(options))
    }

    fn build(
        table: &DeltaTable,
        stored_schema: SchemaRef,
        mode: SaveMode,
        options: Option<&TableOptions>,
    ) -> Result<Self> {
        let new_schema = options.map(|_| Arc::clone(&stored_schema));
        let options = match options {
            Some(options) => options.clone(),
            None => TableOptions::from_configuration(table.snapshot()?.metadata().configuration()),
        };
        let bucketing = match &options.distribution {
            Some(distribution) => {
                distribution.check_writable()?;
                Some((
                    distribution.key_indices(&stored_schema)?,
                    distribution.buckets,
                ))
            }
            None => None,
        };
        let count = bucketing.as_ref().map(|(_, n)| *n as usize).unwrap_or(1);
        let mut writers = Vec::with_capacity(count);
        writers.resize_with(count, || None);
        Ok(Self {
            table: table.clone(),
            stored_schema,
            writers,
            template: WriterTemplate {
                new_schema,
                properties: writer_properties(&options)?,
            },
            bucketing,
            finished: Vec::new(),
            mode,
            rows: 0,
            batches: 0,
        })
    }

    /// The writer of slot `slot` (bucket, or 0), made on first use.
    fn writer(&mut self, slot: usize) -> Result<&mut RecordBatchWriter> {
        if self.writers[slot].is_none() {
            let writer = match &self.template.new_schema {
                Some(schema) => RecordBatchWriter::try_new(
                    self.table.table_url().as_str(),
                    Arc::clone(schema),
                    None,
                    None,
                )?,
                None => RecordBatchWriter::for_table(&self.table)?,
            };
            self.writers[slot] = Some(
                writer
                    .with_writer_properties(self.template.properties.clone())
                    .with_target_file_size(data_file_bytes_target()),
            );
        }
        Ok(self.writers[slot].as_mut().expect("made above"))
    }

    /// Finish the files of slot `slot` so far (tagged with its bucket).
    async fn flush_slot(&mut self, slot: usize) -> Result<Vec<Add>> {
        let Some(writer) = self.writers[slot].as_mut() else {
            return Ok(Vec::new());
        };
        let mut adds = writer.flush().await?;
        if self.bucketing.is_some() {
            for add in &mut adds {
                crate::bucket::tag_bucket(add, slot as u32);
            }
        }
        Ok(adds)
    }

    /// Finish every open file; with those finished early.
    async fn flush_all(&mut self) -> Result<Vec<Add>> {
        let mut adds = std::mem::take(&mut self.finished);
        for slot in 0..self.writers.len() {
            adds.extend(self.flush_slot(slot).await?);
        }
        Ok(adds)
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Write one batch whose columns are, by position, the table's columns.
    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = conform(&batch, &self.stored_schema)?;
        let rows = batch.num_rows() as u64;
        match self.bucketing.clone() {
            None => self.writer(0)?.write(batch).await?,
            Some((key, buckets)) => {
                for (bucket, rows) in crate::bucket::split_by_bucket(&batch, &key, buckets)? {
                    self.writer(bucket as usize)?.write(rows).await?;
                }
                self.limit_buffers().await?;
            }
        }
        self.rows += rows;
        self.batches += 1;
        failpoint::reach("write.batch", self.batches);
        Ok(())
    }

    /// Finish the largest bucket's files while the open ones hold more than
    /// [`BUCKET_BUFFER_BYTES`].
    async fn limit_buffers(&mut self) -> Result<()> {
        loop {
            let sizes: Vec<(usize, usize)> = self
                .writers
                .iter()
                .enumerate()
                .filter_map(|(slot, w)| w.as_ref().map(|w| (w.buffer_len(), slot)))
                .collect();
            let total: usize = sizes.iter().map(|(size, _)| size).sum();
            if total <= BUCKET_BUFFER_BYTES {
                return Ok(());
            }
            let Some(&(_, largest)) = sizes.iter().max() else {
                return Ok(());
            };
            let adds = self.flush_slot(largest).await?;
            self.finished.extend(adds);
        }
    }

    /// Finish the data files without committing them: the caller commits the
    /// returned actions together with others (DELETE/UPDATE/MERGE) and removes
    /// the files with [`remove_files`] if that commit does not happen.
    pub async fn finish(mut self) -> Result<Vec<Add>> {
        self.flush_all().await
    }

    /// Finish the data files and commit them; returns the rows written.
    pub async fn commit(mut self) -> Result<u64> {
        let adds = self.flush_all().await?;
        failpoint::reach("write.before_commit", 1);
        if adds.is_empty() && self.mode == SaveMode::Append {
            return Ok(0);
        }
        let mut actions: Vec<Action> = adds.iter().cloned().map(Action::Add).collect();
        if self.mode == SaveMode::Overwrite {
            let snapshot = self.table.snapshot()?;
            actions.extend(
                snapshot
                    .log_data()
                    .iter()
                    .map(|f| Action::Remove(f.remove_action(true))),
            );
        }
        if actions.is_empty() {
            return Ok(0); // overwriting an empty table with nothing: no new version
        }
        let operation = DeltaOperation::Write {
            mode: self.mode,
            partition_by: None,
            predicate: None,
        };
        match commit_actions(&self.table, actions, operation).await {
            Ok(_) => {
                failpoint::reach("write.after_commit", 1);
                Ok(self.rows)
            }
            Err(err) => {
                remove_files(&self.table, &adds).await;
                Err(err)
            }
        }
    }

    /// Give up: remove every file written so far. The table is unchanged.
    pub async fn abort(&mut self) {
        remove_files(&self.table, &std::mem::take(&mut self.finished)).await;
        for slot in 0..self.writers.len() {
            if let Ok(adds) = self.flush_slot(slot).await {
                remove_files(&self.table, &adds).await;
            }
        }
    }
}

/// Each table's commit gate, by the table's URL: every commit of this
/// process passes through its table's gate, and a commit over several
/// tables holds the gates of all of them from its first table's commit to
/// its last ([`with_gates_held`]), so that no commit of the process lands
/// above a version its readers skip (see `cirro_catalog::commits`).
static GATES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
> = std::sync::LazyLock::new(Default::default);

/// Told of each commit this process makes to a table, before it lands and
/// once it has: the catalog's registry of what readers may see
/// (`cirro_catalog::commits`) keeps a transaction's snapshot, taken at its
/// BEGIN, from taking in a commit that lands after it.
pub trait CommitWatch: Send + Sync + fmt::Debug {
    /// A commit of the table whose directory URL is `url` will land above
    /// version `after` (the table's gate is held); the guard returned is
    /// told when it has.
    fn landing(&self, url: &str, after: i64) -> Option<Box<dyn Landing>>;
}

/// A commit on its way (see [`CommitWatch`]).
pub trait Landing: Send {
    /// The commit landed as `version`, or (None) did not land.
    fn landed(self: Box<Self>, version: Option<i64>);
}

/// The watches of this process's commits (one a data location it opened).
static WATCHES: std::sync::LazyLock<std::sync::Mutex<Vec<std::sync::Weak<dyn CommitWatch>>>> =
    std::sync::LazyLock::new(Default::default);

/// Tell `watch` of every commit this process makes from now on, while it
/// lives.
pub fn watch_commits(watch: std::sync::Weak<dyn CommitWatch>) {
    let mut watches = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
    watches.retain(|w| w.strong_count() > 0);
    watches.push(watch);
}

/// The commit of `table` above version `after` is on its way: the watches
/// that follow it.
fn landing(table: &DeltaTable, after: i64) -> Vec<Box<dyn Landing>> {
    let url = table.table_url().as_str();
    let watches: Vec<Arc<dyn CommitWatch>> = WATCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|w| w.upgrade())
        .collect();
    watches
        .iter()
        .filter_map(|w| w.landing(url, after))
        .collect()
}

/// Tell `landings` how their commit ended.
fn landed<T>(landings: Vec<Box<dyn Landing>>, outcome: &Result<T>, version: impl Fn(&T) -> i64) {
    let version = outcome.as_ref().ok().map(version);
    for landing in landings {
        landing.landed(version);
    }
}

tokio::task_local! {
    /// The gates the running task holds (by table URL).
    static HELD: std::collections::HashSet<String>;
    /// The transaction the running task's commits belong to, recorded in
    /// each commit's `commitInfo` as [`TRANSACTION_KEY`].
    static TRANSACTION: String;
}

/// The `commitInfo` key that names the multi-table transaction a commit
/// belongs to (recovery looks for it, see `cirro_catalog::commits`).
pub const TRANSACTION_KEY: &str = "cirroTransaction";

/// Run `work` with its commits recorded as transaction `id`'s.
pub async fn with_transaction_id<F: std::future::Future>(id: &str, work: F) -> F::Output {
    TRANSACTION.scope(id.to_string(), work).await
}

/// Whether a commit of `table` above version `after` belongs to
/// transaction `id` (its `commitInfo` names it, see [`TRANSACTION_KEY`]).
pub async fn committed_by(table: &DeltaTable, after: i64, id: &str) -> Result<bool> {
    let log_store = table.log_store();
    let latest = log_store.get_latest_version(after.max(0) as u64).await? as i64;
    for version in after + 1..=latest {
        let Some(entry) = log_store.read_commit_entry(version as u64).await? else {
            continue;
        };
        for line in entry.split(|b| *b == b'\n') {
            let Ok(action) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            if action
                .get("commitInfo")
                .and_then(|info| info.get(TRANSACTION_KEY))
                .and_then(|v| v.as_str())
                == Some(id)
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The commit's app metadata: the transaction it belongs to, if any.
fn transaction_metadata() -> Option<(String, serde_json::Value)> {
    TRANSACTION
        .try_with(|id| {
            (
                TRANSACTION_KEY.to_string(),
                serde_json::Value::String(id.clone()),
            )
        })
        .ok()
}

fn gate_of(url: &str) -> Arc<tokio::sync::Mutex<()>> {
    let mut gates = GATES.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(gates.entry(url.to_string()).or_default())
}

/// Pass `table`'s gate: a guard to hold through the commit, or None where
/// the task already holds it.
async fn pass_gate(table: &DeltaTable) -> Option<tokio::sync::OwnedMutexGuard<()>> {
    let url = table.table_url().as_str();
    if HELD.try_with(|held| held.contains(url)).unwrap_or(false) {
        return None;
    }
    Some(gate_of(url).lock_owned().await)
}

/// Run `work` holding the commit gates of `tables` (taken in the order of
/// their URLs, so two such holders never wait on each other): the commits
/// it makes to them pass, every other commit of the process to them waits.
pub async fn with_gates_held<F: std::future::Future>(tables: &[&DeltaTable], work: F) -> F::Output {
    let mut urls: Vec<String> = tables
        .iter()
        .map(|t| t.table_url().as_str().to_string())
        .collect();
    urls.sort();
    urls.dedup();
    let mut guards = Vec::with_capacity(urls.len());
    for url in &urls {
        guards.push(gate_of(url).lock_owned().await);
    }
    let output = HELD.scope(urls.into_iter().collect(), work).await;
    drop(guards);
    output
}

/// Commit attempts of an append before it gives up (see `commit_actions`).
const BLIND_APPEND_COMMIT_ATTEMPTS: usize = 1000;

/// A commit that is in: the table's new version, and the object-store paths
/// of the data files it removed without adding back, whose entries the
/// committing node's hot-data tier drops ([`crate::cache::ColumnCache::forget_files`]).
#[derive(Debug)]
pub struct Committed {
    pub version: i64,
    pub replaced: Vec<String>,
}

/// Commit `actions` to `table` as one new version, read at the table's
/// snapshot. A concurrent commit that conflicts with this one (it removed a
/// file this one read or removes) fails it with 40001; one that does not is
/// committed after it. An append is checked by [`commit_append`]; every
/// other change by delta-rs's conflict checker (see `docs/architecture.md`).
pub async fn commit_actions(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
) -> Result<Committed> {
    let replaced = replaced_files(table, &actions);
    if let DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by,
        predicate: None,
    } = operation
    {
        return commit_append(table, actions, partition_by, replaced).await;
    }
    commit_rows(table, actions, operation, replaced).await
}

/// Commit attempts of a change of rows before it gives up (see
/// [`commit_rows`]): each lost one means that another writer committed in
/// between, so this bounds a change among writers that keep winning.
const ROW_CHANGE_COMMIT_ATTEMPTS: usize = 100;

/// Commit a change of rows (UPDATE, DELETE, MERGE, OPTIMIZE, a
/// transaction's changes of a table): row-level conflicts.
///
/// Such a change removes each file it touches as the snapshot held it and
/// adds it back with a larger deletion vector (or rewrites or drops it),
/// and adds files of new rows. A commit that came after its snapshot
/// conflicts with it only where both changed the same file:
/// - both only deleted rows of it (a deletion vector each, the old one
///   kept): the rows they deleted must differ, and then the file gets the
///   union of both; a row deleted by both (two UPDATEs or DELETEs of one
///   row) fails the change with 40001;
/// - otherwise (the file removed, rewritten, its rows brought back): 40001.
///
/// Files the change read but did not change, and files others added,
/// conflict with nothing: a statement sees the snapshot it started with
/// (snapshot isolation, PostgreSQL's REPEATABLE READ), so two writers of
/// different rows both commit. A change of the schema or protocol since
/// the snapshot fails it (40001). Cirro checks this itself, as for appends
/// ([`commit_append`]): delta-rs's checker, without its DataFusion feature,
/// counts every file of the snapshot as read, so any two UPDATEs of a
/// table conflicted.
async fn commit_rows(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
    replaced: Vec<String>,
) -> Result<Committed> {
    let log_store = table.log_store();
    let store = table.object_store();
    let mut base = table.clone();
    let read = base.snapshot()?.version();
    let _gate = pass_gate(table).await;
    let landings = landing(table, read as i64);
    // Deletion-vector files written for merges (those that the commit
    // which lands does not name are removed at the end).
    let mut merged: Vec<object_store::path::Path> = Vec::new();
    let outcome = async {
        let mut current = actions;
        let mut seen = read;
        for _ in 0..ROW_CHANGE_COMMIT_ATTEMPTS {
            refuse_schema_changes(&log_store, seen, base.snapshot()?.version()).await?;
            seen = base.snapshot()?.version();
            if let Some((rebased, written)) = rebase(&store, base.snapshot()?, &current).await? {
                current = rebased;
                merged.push(written);
            }
            // CommitProperties' defaults include the post-commit hook that
            // writes a checkpoint every `delta.checkpointInterval` versions;
            // without it every reader replays the whole JSON log, and each
            // statement on a table with many small commits gets slower and
            // holds more memory.
            let builder = CommitBuilder::from(
                CommitProperties::default().with_metadata(transaction_metadata()),
            );
            if let Some(version) = try_commit(builder, current.clone(), &base, &operation).await? {
                return Ok((version, current));
            }
            let latest = log_store.get_latest_version(seen).await?;
            base.update_incremental(Some(latest)).await?;
        }
        Err(conflict(format!(
            "the change lost the race for the next version {ROW_CHANGE_COMMIT_ATTEMPTS} times"
        )))
    }
    .await;
    // A merge of one attempt may stand in the next (which merged other
    // files): the files the commit names stay, the others are garbage.
    let named: std::collections::HashSet<object_store::path::Path> = match &outcome {
        Ok((_, committed)) => committed
            .iter()
            .filter_map(|action| match action {
                Action::Add(add) => add.deletion_vector.as_ref(),
                _ => None,
            })
            .filter_map(|descriptor| crate::dv::file_path(descriptor).ok())
            .collect(),
        Err(_) => Default::default(),
    };
    for path in merged.into_iter().filter(|p| !named.contains(p)) {
        if let Err(e) = store.delete(&path).await {
            log::warn!("an unused deletion vector file {path} was not removed: {e}");
        }
    }
    landed(landings, &outcome, |(v, _)| *v);
    Ok(Committed {
        version: outcome?.0,
        replaced,
    })
}

/// 40001 for a change of rows that a later commit conflicts with.
fn conflict(why: String) -> CirroError {
    CirroError::new(
        SqlState::SERIALIZATION_FAILURE,
        format!(
            "could not serialize access due to a concurrent update ({why}); nothing was \
             changed, retry the statement or transaction"
        ),
    )
}

/// `actions` (a change of rows read at an older snapshot) made to apply to
/// `latest` (see [`commit_rows`]): None where every file they remove is in
/// `latest` as they read it; else the actions with each such file's
/// deletion vector merged with the one another writer gave it, and the
/// deletion-vector file written for the merged ones. 40001 where the two
/// changes of a file cannot both stand.
async fn rebase(
    store: &Arc<dyn object_store::ObjectStore>,
    latest: &DeltaTableState,
    actions: &[Action],
) -> Result<Option<(Vec<Action>, object_store::path::Path)>> {
    use deltalake::kernel::DeletionVectorDescriptor;
    let Some((changed, unions)) = merges(store, latest, actions).await? else {
        return Ok(None);
    };
    let written = crate::dv::write_file(store, &unions.iter().collect::<Vec<_>>()).await?;
    let merged: std::collections::HashMap<
        &str,
        (&DeletionVectorDescriptor, DeletionVectorDescriptor),
    > = changed
        .iter()
        .zip(&written.descriptors)
        .map(|((path, _, theirs, _), union)| (*path, (theirs, union.clone())))
        .collect();
    let rebased = actions
        .iter()
        .map(|action| match action {
            Action::Remove(r) if merged.contains_key(r.path.as_str()) => {
                let mut r = r.clone();
                r.deletion_vector = Some(merged[r.path.as_str()].0.clone());
                Action::Remove(r)
            }
            Action::Add(a) if merged.contains_key(a.path.as_str()) => {
                let mut a = a.clone();
                a.deletion_vector = Some(merged[a.path.as_str()].1.clone());
                Action::Add(a)
            }
            other => other.clone(),
        })
        .collect();
    Ok(Some((rebased, written.path)))
}

/// A file that both a change (read at an older snapshot) and a later
/// commit changed: (path, its deletion vector as read, as now, the change's
/// re-added file).
type Changed<'a> = (
    &'a str,
    Option<deltalake::kernel::DeletionVectorDescriptor>,
    deltalake::kernel::DeletionVectorDescriptor,
    Add,
);

/// What [`rebase`] merges, worked out without writing anything: None where
/// every file `actions` remove is in `latest` as they read it; else the
/// files both changed, each with the union of the rows both deleted. 40001
/// where the two changes of a file cannot both stand.
async fn merges<'a>(
    store: &Arc<dyn object_store::ObjectStore>,
    latest: &DeltaTableState,
    actions: &'a [Action],
) -> Result<Option<(Vec<Changed<'a>>, Vec<roaring::RoaringTreemap>)>> {
    use deltalake::kernel::DeletionVectorDescriptor;
    let removed: std::collections::HashMap<&str, &Option<DeletionVectorDescriptor>> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Remove(r) => Some((r.path.as_str(), &r.deletion_vector)),
            _ => None,
        })
        .collect();
    if removed.is_empty() {
        return Ok(None);
    }
    // The files of `latest` that the change removes, as `latest` has them.
    let mut now: std::collections::HashMap<String, Add> = std::collections::HashMap::new();
    for file in latest.log_data().iter() {
        #[allow(deprecated)] // the one way to get the whole action back
        let add = file.add_action();
        if removed.contains_key(add.path.as_str()) {
            now.insert(add.path.clone(), add);
        }
    }
    let readded: std::collections::HashMap<&str, &Add> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Add(add) if removed.contains_key(add.path.as_str()) => {
                Some((add.path.as_str(), add))
            }
            _ => None,
        })
        .collect();
    // Files another writer changed: (path, as read, as now, as this change has it).
    let mut changed = Vec::new();
    for (path, read) in &removed {
        let Some(current) = now.get(*path) else {
            return Err(conflict(format!(
                "data file {path} that it changes was removed by another writer"
            )));
        };
        if current.deletion_vector == **read {
            continue;
        }
        match (readded.get(path), &current.deletion_vector) {
            (Some(ours), Some(theirs)) if ours.deletion_vector.is_some() => {
                changed.push((*path, (*read).clone(), theirs.clone(), (*ours).clone()))
            }
            _ => {
                return Err(conflict(format!(
                    "data file {path} that it changes was rewritten by another writer"
                )));
            }
        }
    }
    if changed.is_empty() {
        return Ok(None);
    }
    let mut descriptors: Vec<&DeletionVectorDescriptor> = Vec::new();
    for (_, read, theirs, ours) in &changed {
        descriptors.extend(read.iter());
        descriptors.push(theirs);
        descriptors.extend(ours.deletion_vector.iter());
    }
    let mut bitmaps = crate::dv::read_all(store, &descriptors).await?.into_iter();
    let mut unions = Vec::with_capacity(changed.len());
    for (path, read, _, _) in &changed {
        let read = match read {
            Some(_) => bitmaps.next(),
            None => None,
        }
        .unwrap_or_default();
        let (Some(theirs), Some(ours)) = (bitmaps.next(), bitmaps.next()) else {
            return Err(CirroError::internal("deletion vectors not read"));
        };
        // Rows brought back by either (an undo) cannot be merged.
        if !read.is_subset(&theirs) || !read.is_subset(&ours) {
            return Err(conflict(format!(
                "data file {path} had deleted rows restored by another writer"
            )));
        }
        let mine = &ours - &read;
        if !mine.is_disjoint(&theirs) {
            return Err(conflict(format!(
                "a row of data file {path} that it changes was changed by another writer"
            )));
        }
        unions.push(theirs | mine);
    }
    Ok(Some((changed, unions)))
}

/// 40001 where `actions`, a change of rows of `table` read at an older
/// version, cannot apply to `table`'s newest version because another
/// writer changed the same rows since (as its commit would find): for a
/// check that must not report the two writes' rows as one another's
/// duplicates first (23505).
pub async fn check_applies(table: &DeltaTable, actions: &[Action]) -> Result<()> {
    merges(&table.object_store(), table.snapshot()?, actions)
        .await
        .map(|_| ())
}

/// Commit a log entry without data actions (VACUUM START and END), with
/// `metrics` as its `operationMetrics`; returns the new version.
pub async fn commit_logged(
    table: &DeltaTable,
    operation: DeltaOperation,
    metrics: serde_json::Value,
) -> Result<i64> {
    let metadata = vec![("operationMetrics".to_string(), metrics)];
    commit_checked(table, Vec::new(), operation, metadata).await
}

/// One commit that delta-rs's conflict checker retries or fails.
async fn commit_checked(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
    metadata: Vec<(String, serde_json::Value)>,
) -> Result<i64> {
    let _gate = pass_gate(table).await;
    let landings = landing(table, table.snapshot()?.version() as i64);
    let properties = CommitProperties::default()
        .with_metadata(metadata.into_iter().chain(transaction_metadata()));
    let outcome = async {
        let finalized = CommitBuilder::from(properties)
            .with_actions(actions)
            .build(
                Some(&CommitBase::of(table.snapshot()?)?),
                table.log_store(),
                operation,
            )
            .await?;
        Ok(finalized.version() as i64)
    }
    .await;
    landed(landings, &outcome, |v| *v);
    outcome
}

/// Commit an append (INSERT, COPY, CREATE TABLE … AS). It reads no existing
/// file and changes none, so it can neither lose an update nor invalidate
/// another writer's reads: only a commit that changed the table's schema or
/// protocol since its snapshot conflicts with it (40001; its files were
/// written for the old schema). Losing the race for the next version to
/// other writers only means trying the one after.
///
/// Cirro checks this itself, each attempt one delta-rs commit that may not
/// retry: delta-rs's checker, built without its DataFusion feature (a fifth
/// of the cold build), counts every file of the snapshot as read, so an
/// INSERT would fail against a concurrent DELETE.
async fn commit_append(
    table: &DeltaTable,
    actions: Vec<Action>,
    partition_by: Option<Vec<String>>,
    replaced: Vec<String>,
) -> Result<Committed> {
    // Others' conflict checks skip a blind append's files; the predicate
    // that matches no file says in the table's history that it read none.
    let operation = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by,
        predicate: Some("false".to_string()),
    };
    let log_store = table.log_store();
    let mut base = table.clone();
    let _gate = pass_gate(table).await;
    let landings = landing(table, base.snapshot()?.version() as i64);
    let outcome = async {
        for _ in 0..BLIND_APPEND_COMMIT_ATTEMPTS {
            let read = base.snapshot()?.version();
            let builder = CommitBuilder::from(CommitProperties::default()).with_app_metadata(
                std::iter::once(("isBlindAppend".to_string(), serde_json::Value::Bool(true)))
                    .chain(transaction_metadata())
                    .collect::<std::collections::HashMap<_, _>>(),
            );
            if let Some(version) = try_commit(builder, actions.clone(), &base, &operation).await? {
                return Ok(version);
            }
            let latest = log_store.get_latest_version(read).await?;
            refuse_schema_changes(&log_store, read, latest).await?;
            base.update_incremental(Some(latest)).await?;
        }
        Err(conflict(format!(
            "the append lost the race for the next version {BLIND_APPEND_COMMIT_ATTEMPTS} times"
        )))
    }
    .await;
    landed(landings, &outcome, |v| *v);
    Ok(Committed {
        version: outcome?,
        replaced,
    })
}

/// One attempt to commit `actions` at `base`'s snapshot, which may not
/// retry: the version it made, or None where another commit took that
/// version first.
async fn try_commit(
    builder: CommitBuilder,
    actions: Vec<Action>,
    base: &DeltaTable,
    operation: &DeltaOperation,
) -> Result<Option<i64>> {
    let attempt = builder
        .with_actions(actions)
        .with_max_retries(0)
        .build(
            Some(&CommitBase::of(base.snapshot()?)?),
            base.log_store(),
            operation.clone(),
        )
        .await;
    match attempt {
        Ok(finalized) => Ok(Some(finalized.version() as i64)),
        Err(deltalake::DeltaTableError::Transaction {
            source: TransactionError::MaxCommitAttempts(_),
        }) => Ok(None),
        Err(other) => Err(other.into()),
    }
}

/// 40001 if a version after `read`, up to `latest`, changed the table's
/// schema or protocol (a change read at `read` was written for the old one).
async fn refuse_schema_changes(
    log_store: &deltalake::logstore::LogStoreRef,
    read: u64,
    latest: u64,
) -> Result<()> {
    for version in read + 1..=latest {
        if let Some(entry) = log_store.read_commit_entry(version).await?
            && changes_schema(&entry)?
        {
            return Err(conflict(format!(
                "version {version} changed the table's schema or protocol"
            )));
        }
    }
    Ok(())
}

/// Whether a commit's log entry (one JSON action per line) changes the
/// table's metadata or protocol.
fn changes_schema(entry: &[u8]) -> Result<bool> {
    for line in entry.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let action: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(line)?;
        if action.contains_key("metaData") || action.contains_key("protocol") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The snapshot a commit is read at, as delta-rs's commit sees it: with the
/// `invariants` writer feature left out of its protocol.
///
/// Every table Cirro creates names that feature (delta-rs makes a table's
/// implied legacy features explicit when deletion vectors raise it to writer
/// version 7). A writer must then enforce the columns' `delta.invariants`
/// expressions; no Cirro column has one, and delta-rs would reject the
/// commit unless built with its DataFusion feature, which costs the cold
/// build about six minutes of compiler time. So Cirro checks the
/// expressions itself: a table whose columns carry one (written by another
/// engine) is refused with 0A000 rather than written unchecked.
struct CommitBase<'a> {
    snapshot: &'a DeltaTableState,
    protocol: Protocol,
}

impl<'a> CommitBase<'a> {
    fn of(snapshot: &'a DeltaTableState) -> Result<Self> {
        // Writer versions 2 to 6 imply the feature; 7 names it.
        let invariants = snapshot.schema().get_invariants().map_err(|e| {
            CirroError::new(
                SqlState::DATA_CORRUPTED,
                format!("the table's column invariants cannot be read: {e}"),
            )
        })?;
        if let Some(invariant) = invariants.first() {
            return Err(CirroError::unsupported(format!(
                "the table has a column invariant ({}: {}), which Cirro does not enforce; \
                 it can be read but not written",
                invariant.field_name, invariant.invariant_sql
            )));
        }
        let protocol = snapshot.protocol();
        let names_invariants = protocol
            .writer_features()
            .is_some_and(|features| features.iter().any(|f| f.as_ref() == "invariants"));
        if !names_invariants {
            return Ok(Self {
                snapshot,
                protocol: protocol.clone(),
            });
        }
        // The kernel's Protocol has no public constructor: rebuild it from
        // its log form, which names the features.
        let mut form = serde_json::to_value(protocol)?;
        if let Some(serde_json::Value::Array(features)) = form.get_mut("writerFeatures") {
            features.retain(|f| f.as_str() != Some("invariants"));
        }
        let protocol = serde_json::from_value(form)?;
        Ok(Self { snapshot, protocol })
    }
}

impl TableReference for CommitBase<'_> {
    fn config(&self) -> &TableProperties {
        self.snapshot.config()
    }

    fn protocol(&self) -> &Protocol {
        &self.protocol
    }

    fn metadata(&self) -> &Metadata {
        self.snapshot.metadata()
    }

    fn eager_snapshot(&self) -> &EagerSnapshot {
        TableReference::eager_snapshot(self.snapshot)
    }
}

/// The object-store paths of the data files a commit of `actions` removes
/// without adding them back (a changed deletion vector re-adds its file):
/// the hot-data tier drops their entries once the commit is in.
fn replaced_files(table: &DeltaTable, actions: &[Action]) -> Vec<String> {
    let added: std::collections::HashSet<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Add(add) => Some(add.path.as_str()),
            _ => None,
        })
        .collect();
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Remove(remove) if !added.contains(remove.path.as_str()) => {
                let url = table.table_url().join(&remove.path).ok()?;
                let url =
                    datafusion::datasource::listing::ListingTableUrl::parse(url.as_str()).ok()?;
                Some(url.prefix().to_string())
            }
            _ => None,
        })
        .collect()
}

/// Commit `actions` to `table` only if no other commit came after the
/// table's snapshot (else 40001, and nothing is committed): for changes
/// that read the whole table and its schema (ALTER TABLE), which delta-rs's
/// conflict checker would let a concurrent append slip past.
pub async fn commit_exclusive(
    table: &DeltaTable,
    actions: Vec<Action>,
    operation: DeltaOperation,
) -> Result<Committed> {
    let snapshot = table.snapshot()?;
    let replaced = replaced_files(table, &actions);
    let _gate = pass_gate(table).await;
    let landings = landing(table, snapshot.version() as i64);
    let outcome = async {
        let finalized =
            CommitBuilder::from(CommitProperties::default().with_metadata(transaction_metadata()))
                .with_actions(actions)
                .with_max_retries(0)
                .build(
                    Some(&CommitBase::of(snapshot)?),
                    table.log_store(),
                    operation,
                )
                .await?;
        Ok(finalized.version() as i64)
    }
    .await;
    landed(landings, &outcome, |v| *v);
    Ok(Committed {
        version: outcome?,
        replaced,
    })
}

/// Remove data files written for a commit that did not happen.
pub async fn remove_files(table: &DeltaTable, adds: &[Add]) {
    let store = table.object_store();
    for add in adds {
        let path = deltalake::Path::from(add.path.as_str());
        match store.delete(&path).await {
            // Already gone (removed by an earlier try): nothing to do.
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => log::warn!("could not remove unreferenced data file {}: {e}", add.path),
        }
    }
}

/// Cast `batch` to the stored schema by column position, and check NOT NULL.
pub fn conform(batch: &RecordBatch, stored: &SchemaRef) -> Result<RecordBatch> {
    if batch.num_columns() != stored.fields().len() {
        return Err(CirroError::new(
            SqlState::DATATYPE_MISMATCH,
            format!(
                "got {} columns but the table has {}",
                batch.num_columns(),
                stored.fields().len()
            ),
        ));
    }
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let columns = batch
        .columns()
        .iter()
        .zip(stored.fields())
        .map(|(column, field)| {
            if !field.is_nullable() && column.null_count() > 0 {
                return Err(CirroError::new(
                    SqlState::NOT_NULL_VIOLATION,
                    format!(
                        "null value in column \"{}\" violates not-null constraint",
                        field.name()
                    ),
                ));
            }
            let cast = if column.data_type() == field.data_type() {
                Arc::clone(column)
            } else {
                arrow::compute::cast_with_options(column, field.data_type(), &options).map_err(
                    |e| {
                        let err = CirroError::from(e);
                        CirroError::new(
                            err.state,
                            format!("column \"{}\": {}", field.name(), err.message),
                        )
                    },
                )?
            };
            match CharLength::of(field) {
                Some(length) => fit_length(&cast, length),
                None => Ok(cast),
            }
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(Arc::clone(stored), columns).map_err(CirroError::from)
}

/// A string column's values fitted to its declared length (cut where only
/// spaces are past it; 22001 where more is).
fn fit_length(column: &ArrayRef, length: CharLength) -> Result<ArrayRef> {
    let Some(strings) = column.as_string_opt::<i32>() else {
        return Ok(Arc::clone(column));
    };
    let mut cut = false;
    for value in strings.iter().flatten() {
        if length.fit(value)?.len() != value.len() {
            cut = true;
        }
    }
    if !cut {
        return Ok(Arc::clone(column));
    }
    let fitted: arrow::array::StringArray = strings
        .iter()
        .map(|v| v.map(|v| length.fit(v)).transpose())
        .collect::<Result<_>>()?;
    Ok(Arc::new(fitted))
}

/// The DataFusion sink behind `INSERT INTO` / `INSERT OVERWRITE` on a Cirro table.
pub struct TableSink {
    table: DeltaTable,
    stored_schema: SchemaRef,
    schema: SchemaRef,
    mode: SaveMode,
}

impl TableSink {
    pub fn new(
        table: DeltaTable,
        stored_schema: SchemaRef,
        schema: SchemaRef,
        mode: SaveMode,
    ) -> Self {
        Self {
            table,
            stored_schema,
            schema,
            mode,
        }
    }
}

impl fmt::Debug for TableSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableSink")
            .field("mode", &self.mode)
            .finish()
    }
}

impl DisplayAs for TableSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CirroTableSink: mode={:?}", self.mode)
    }
}

#[async_trait]
impl DataSink for TableSink {
    fn metrics(&self) -> Option<MetricsSet> {
        None
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DfResult<u64> {
        let batches = data.map(|batch| batch.map_err(CirroError::from));
        write_stream(
            &self.table,
            Arc::clone(&self.stored_schema),
            batches,
            self.mode,
        )
        .await
        .map_err(CirroError::into_datafusion)
    }
}

/// Write all batches of `batches` into `table` as one commit (`Append` adds the
/// rows, `Overwrite` replaces the table's rows). On any error the written files
/// are removed and the table is unchanged.
pub async fn write_stream<S>(
    table: &DeltaTable,
    stored_schema: SchemaRef,
    mut batches: S,
    mode: SaveMode,
) -> Result<u64>
where
    S: futures::Stream<Item = Result<RecordBatch>> + Unpin,
{
    let mut writer = TableWriter::new(table, stored_schema, mode)?;
    fill(&mut writer, &mut batches).await?;
    writer.commit().await
}

/// Write all of `batches` with `writer`; on an error, remove what it wrote.
pub(crate) async fn fill<S>(writer: &mut TableWriter, batches: &mut S) -> Result<()>
where
    S: futures::Stream<Item = Result<RecordBatch>> + Unpin,
{
    while let Some(batch) = batches.next().await {
        let step = match batch {
            Ok(batch) => writer.write(batch).await,
            Err(e) => Err(e),
        };
        if let Err(e) = step {
            writer.abort().await;
            return Err(e);
        }
    }
    Ok(())
}

/// Write all of `batches` into new data files of `table` without committing
/// them (the caller commits them with other actions, or removes them).
/// Returns the files and the number of rows. On an error nothing is left.
pub async fn write_files<S>(table: &CirroTable, mut batches: S) -> Result<(Vec<Add>, u64)>
where
    S: futures::Stream<Item = Result<RecordBatch>> + Unpin,
{
    let mut writer = TableWriter::for_view(table, SaveMode::Append)?;
    fill(&mut writer, &mut batches).await?;
    let rows = writer.rows();
    Ok((writer.finish().await?, rows))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use deltalake::kernel::{DataType as DeltaType, StructField};
    use url::Url;

    use super::*;
    use crate::table::{create_delta_table, open_delta_table};

    /// A new directory and its URL; the directory goes when the first is
    /// dropped.
    fn fresh_url(name: &str) -> (tempfile::TempDir, Url) {
        let dir = tempfile::Builder::new()
            .prefix(&format!("cirro-{name}-"))
            .tempdir()
            .unwrap();
        let url = Url::from_directory_path(dir.path()).unwrap();
        (dir, url)
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]))
    }

    async fn append(table: &DeltaTable, keys: Vec<i64>) -> Result<u64> {
        let batch = RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(keys))]).unwrap();
        write_stream(
            table,
            schema(),
            futures::stream::iter(vec![Ok(batch)]),
            SaveMode::Append,
        )
        .await
    }

    fn metadata_of(table: &DeltaTable) -> Action {
        Action::Metadata(table.snapshot().unwrap().metadata().clone())
    }

    #[tokio::test]
    async fn an_append_behind_others_commits_after_them_unless_the_schema_changed() {
        let (_dir, url) = fresh_url("append-race");
        create_delta_table(&url, &schema(), &Default::default())
            .await
            .unwrap();
        // Three writers read version 0.
        let (first, second, third) = (
            open_delta_table(&url).await.unwrap(),
            open_delta_table(&url).await.unwrap(),
            open_delta_table(&url).await.unwrap(),
        );
        // The table's protocol names `invariants`, which delta-rs alone
        // would refuse to write without its DataFusion feature.
        let protocol = first.snapshot().unwrap().protocol().clone();
        assert!(
            protocol
                .writer_features()
                .is_some_and(|f| f.iter().any(|f| f.as_ref() == "invariants")),
            "{protocol:?}"
        );
        append(&first, vec![1, 2]).await.unwrap();
        // Behind by one blind append: retried at version 2.
        append(&second, vec![3]).await.unwrap();
        let latest = open_delta_table(&url).await.unwrap();
        assert_eq!(latest.version(), Some(2));
        // A change of metadata since its snapshot fails the third: 40001,
        // and the table keeps its version.
        let changed = commit_actions(
            &latest,
            vec![metadata_of(&latest)],
            DeltaOperation::SetTableProperties {
                properties: HashMap::new(),
            },
        )
        .await
        .unwrap();
        assert_eq!(changed.version, 3);
        let err = append(&third, vec![4]).await.unwrap_err();
        assert_eq!(err.code(), "40001", "{err}");
        let table = open_delta_table(&url).await.unwrap();
        assert_eq!(table.version(), Some(3));
        assert_eq!(table.snapshot().unwrap().log_data().num_files(), 2);
    }

    #[tokio::test]
    async fn a_table_with_a_feature_cirro_does_not_write_is_refused_with_0a000() {
        let (_dir, url) = fresh_url("cdf");
        let table = deltalake::operations::create::CreateBuilder::new()
            .with_location(url.as_str())
            .with_columns([StructField::new("k", DeltaType::LONG, true)])
            .with_configuration_property(
                deltalake::TableProperty::EnableDeletionVectors,
                Some("true"),
            )
            .with_configuration_property(
                deltalake::TableProperty::EnableChangeDataFeed,
                Some("true"),
            )
            .await
            .unwrap();
        let err = append(&table, vec![1]).await.unwrap_err();
        assert_eq!(err.code(), "0A000", "{err}");
        assert!(
            err.to_string().to_lowercase().contains("changedatafeed"),
            "{err}"
        );
        let table = open_delta_table(&url).await.unwrap();
        assert_eq!(table.snapshot().unwrap().log_data().num_files(), 0);
    }

    #[tokio::test]
    async fn a_table_with_a_column_invariant_is_not_written() {
        let (_dir, url) = fresh_url("invariant");
        let field = StructField::new("k", DeltaType::LONG, true).with_metadata([(
            "delta.invariants",
            r#"{"expression": {"expression": "k > 0"}}"#.to_string(),
        )]);
        let table = deltalake::operations::create::CreateBuilder::new()
            .with_location(url.as_str())
            .with_columns([field])
            .with_configuration_property(
                deltalake::TableProperty::EnableDeletionVectors,
                Some("true"),
            )
            .await
            .unwrap();
        let err = append(&table, vec![-1]).await.unwrap_err();
        assert_eq!(err.code(), "0A000", "{err}");
        assert!(err.to_string().contains("k > 0"), "{err}");
        let table = open_delta_table(&url).await.unwrap();
        assert_eq!(table.snapshot().unwrap().log_data().num_files(), 0);
    }
}
