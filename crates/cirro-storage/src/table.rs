//! [`CirroTable`]: a Delta table as a DataFusion `TableProvider`.
//!
//! A scan reads exactly the data files of the table's current Delta snapshot,
//! through DataFusion's own Parquet reader (`ParquetSource` in a
//! `DataSourceExec`), set up as DataFusion's `ListingTable` sets it up: per-file
//! statistics from the Parquet footers (cached), files split into
//! `target_partitions` groups, the session's Parquet options. Two things are
//! Cirro's own: rows deleted by a deletion vector are handed to the reader as a
//! row selection, so they are never decoded; and DML scans add two hidden
//! columns, the file index and the row's position in the file
//! ([`FILE_INDEX_COLUMN`], [`ROW_INDEX_COLUMN`], the latter DataFusion's Parquet
//! `row_number` virtual column), from which deletion vectors are built. Files on
//! disk that the log does not reference (left by a crashed writer) are never
//! read.
//!
//! INSERT goes through [`crate::write::TableSink`], which writes new data files
//! and commits them in one Delta commit.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef};
use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use cirro_common::{CirroError, Result, SqlState};
use datafusion::catalog::Session;
use datafusion::catalog::{ScanArgs, ScanResult};
use datafusion::common::ScalarValue;
use datafusion::common::stats::{ColumnStatistics, Precision, Statistics};
use datafusion::datasource::TableProvider;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingTableUrl, PartitionedFile};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::table_schema::TableSchemaBuilder;
use datafusion::error::Result as DfResult;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_expr::{LexRequirement, Partitioning, PhysicalSortRequirement};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use deltalake::kernel::StructType;
use deltalake::kernel::engine::arrow_conversion::{TryIntoArrow, TryIntoKernel};
use deltalake::kernel::{Action, Add, DeletionVectorDescriptor};
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, TableProperty};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;
use parquet::arrow::RowNumber;
use roaring::RoaringTreemap;
use url::Url;

use crate::dv;
use crate::schema::{scan_schema, storage_schema};
use crate::stats::TableStatistics;
use crate::write::TableSink;

pub use crate::options::TableOptions;

/// Create an empty Delta table at `url` with the given schema. Fails with 42P07
/// if a table already exists there.
pub async fn create_delta_table(
    url: &Url,
    schema: &Schema,
    options: &TableOptions,
) -> Result<DeltaTable> {
    let stored = storage_schema(schema)?;
    let struct_type: StructType = stored.as_ref().try_into_kernel().map_err(|e| {
        CirroError::unsupported(format!("cannot store this schema as a Delta table: {e}"))
    })?;
    let mut builder = deltalake::operations::create::CreateBuilder::new()
        .with_location(url.as_str())
        .with_columns(struct_type.fields().cloned())
        .with_save_mode(SaveMode::ErrorIfExists)
        // DELETE and UPDATE mark rows in deletion vectors (merge-on-read).
        .with_configuration_property(TableProperty::EnableDeletionVectors, Some("true"));
    if let Some(comment) = &options.comment {
        builder = builder.with_comment(comment.clone());
    }
    let configuration = options.to_configuration();
    if !configuration.is_empty() {
        // Cirro's own keys are not Delta properties: let delta-rs keep them.
        builder = builder
            .with_raise_if_key_not_exists(false)
            .with_configuration(configuration.into_iter().map(|(k, v)| (k, Some(v))));
    }
    builder.await.map_err(|e| match e {
        deltalake::DeltaTableError::Generic(msg) if msg.contains("already exists") => {
            CirroError::new(SqlState::DUPLICATE_TABLE, msg)
        }
        other => CirroError::from(other),
    })
}

/// Open the Delta table at `url` at its latest version.
pub async fn open_delta_table(url: &Url) -> Result<DeltaTable> {
    deltalake::open_table(url.clone())
        .await
        .map_err(|e| match e {
            deltalake::DeltaTableError::NotATable(msg) => CirroError::new(
                SqlState::UNDEFINED_TABLE,
                format!("table storage at {url} is missing or damaged: {msg}"),
            ),
            other => CirroError::from(other),
        })
}

/// Name of the hidden column that identifies a row's data file in a scan
/// with row ids (an index into [`CirroTable::files`]).
pub const FILE_INDEX_COLUMN: &str = "__cirro_file";
/// Name of the hidden column holding a row's position in its data file.
pub const ROW_INDEX_COLUMN: &str = "__cirro_row";

/// A Cirro table: one Delta snapshot, scanned and appended to through DataFusion.
#[derive(Debug, Clone)]
pub struct CirroTable {
    table: DeltaTable,
    url: Url,
    /// `url` as a local directory (a `file:` URL), found once.
    local: Option<Arc<std::path::Path>>,
    /// The schema as stored in Delta (Utf8 strings, non-null flags).
    stored_schema: SchemaRef,
    /// The schema scans produce (Utf8View strings), without row ids.
    schema: SchemaRef,
    /// The snapshot's data files.
    files: Arc<Vec<DataFile>>,
    /// Storage options from the table's configuration.
    options: TableOptions,
    /// Whether scans add the row-id columns ([`FILE_INDEX_COLUMN`],
    /// [`ROW_INDEX_COLUMN`]), for DELETE, UPDATE and MERGE.
    row_ids: bool,
    /// What the last `ANALYZE` found (kept in the catalog).
    analyzed: Option<Arc<TableStatistics>>,
    /// The schema and options are a transaction's staged ALTER TABLE, not
    /// the Delta snapshot's: writers must use them (see [`Self::with_changes`]).
    schema_staged: bool,
    /// The table's row store, which scans merge with the files (see
    /// `crate::rowstore`); None where the process keeps none.
    rows: Option<crate::rowstore::RowReader>,
}

/// Deletion vectors read by scans and lookups, by descriptor (see
/// [`CirroTable::deleted`]).
static DELETED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, Arc<dv::Deleted>>>,
> = std::sync::LazyLock::new(Default::default);
const DELETED_ENTRIES: usize = 4096;

/// One data file of a snapshot.
#[derive(Debug, Clone)]
pub struct DataFile {
    pub url: String,
    pub size: u64,
    /// Rows stored in the file, deleted ones included.
    pub num_records: Option<usize>,
    /// The `add` action that made the file part of the table.
    pub add: Add,
    /// Where `url` is: its object store and its path in it, parsed once
    /// (lookups by key ask for it on every statement).
    located: std::sync::OnceLock<(ObjectStoreUrl, object_store::path::Path)>,
    /// The file's footer as point reads by key read it, kept after the
    /// first (see `cache::lookup`).
    pub(crate) lookup: std::sync::OnceLock<crate::cache::lookup::KeptFooter>,
    /// The rows the file's deletion vector deletes, kept after the first
    /// scan or point read that read them ([`CirroTable::deleted`]).
    deleted: std::sync::OnceLock<Arc<dv::Deleted>>,
}

impl DataFile {
    /// The data file an `add` action names, in the table at `table_url`.
    pub fn from_add(table_url: &Url, add: Add) -> Result<Self> {
        let num_records = records_of(&add);
        Ok(Self {
            url: table_url
                .join(&add.path)
                .map_err(|e| CirroError::internal(format!("bad data file path: {e}")))?
                .to_string(),
            size: add.size.max(0) as u64,
            num_records,
            add,
            located: Default::default(),
            lookup: Default::default(),
            deleted: Default::default(),
        })
    }

    /// The file's object store and its path there.
    pub fn location(&self) -> DfResult<&(ObjectStoreUrl, object_store::path::Path)> {
        if let Some(located) = self.located.get() {
            return Ok(located);
        }
        let url = ListingTableUrl::parse(&self.url)?;
        Ok(self
            .located
            .get_or_init(|| (url.object_store(), url.prefix().clone())))
    }

    pub fn deletion_vector(&self) -> Option<&DeletionVectorDescriptor> {
        self.add.deletion_vector.as_ref()
    }

    /// Rows deleted by the file's deletion vector.
    pub fn deleted_rows(&self) -> u64 {
        self.deletion_vector()
            .map(|dv| dv.cardinality.max(0) as u64)
            .unwrap_or(0)
    }
}

/// The row count an `add` action's statistics give.
fn records_of(add: &Add) -> Option<usize> {
    add.stats
        .as_deref()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
        .and_then(|v| v.get("numRecords").and_then(|n| n.as_u64()))
        .map(|n| n as usize)
}

impl CirroTable {
    /// Open the table stored at `url`.
    pub async fn open(url: &Url) -> Result<Self> {
        let table = open_delta_table(url).await?;
        Self::from_delta(table, url.clone())
    }

    /// The same table at an older `version` (its analyzed statistics kept).
    pub async fn at_version(&self, version: i64) -> Result<Self> {
        let mut delta = self.table.clone();
        delta.load_version(version.max(0) as u64).await?;
        let mut table = Self::from_delta(delta, self.url.clone())?;
        table.analyzed = self.analyzed.clone();
        Ok(table)
    }

    pub fn from_delta(table: DeltaTable, url: Url) -> Result<Self> {
        let snapshot = table.snapshot()?;
        let kernel_schema = snapshot.schema();
        let stored: Schema = kernel_schema
            .as_ref()
            .try_into_arrow()
            .map_err(|e| CirroError::internal(format!("bad table schema at {url}: {e}")))?;
        let stored_schema = Arc::new(stored);
        let mut files = snapshot
            .log_data()
            .iter()
            .map(|file| {
                let relative = file.object_store_path();
                #[allow(deprecated)] // the one way to get the whole action back
                let add = file.add_action();
                Ok(DataFile {
                    url: url
                        .join(relative.as_ref())
                        .map_err(|e| CirroError::internal(format!("bad data file path: {e}")))?
                        .to_string(),
                    size: file.size().max(0) as u64,
                    num_records: file.num_records().or_else(|| records_of(&add)),
                    add,
                    located: Default::default(),
                    lookup: Default::default(),
                    deleted: Default::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // In the order they were written (the log's replay gives no order:
        // a table filled by three INSERTs listed them 1, 3, 2): scans read
        // them so, and a table copied from this one in partition order
        // (`cirro_exec::operators::concat`) keeps its rows' order. A file's
        // name (`part-<n>-<write id>`) orders the files of one write.
        files.sort_by(|a, b| {
            (a.add.modification_time, &a.add.path).cmp(&(b.add.modification_time, &b.add.path))
        });
        let options = TableOptions::from_configuration(snapshot.metadata().configuration());
        Ok(Self {
            schema: scan_schema(&stored_schema),
            stored_schema,
            table,
            local: crate::root::local_dir(&url),
            url,
            files: Arc::new(files),
            options,
            row_ids: false,
            analyzed: None,
            schema_staged: false,
            rows: None,
        })
    }

    /// The rows of the snapshot (deleted rows left out), if every data
    /// file's statistics give its row count.
    pub fn row_count(&self) -> Option<u64> {
        self.files.iter().try_fold(0u64, |sum, file| {
            let rows = file.num_records? as u64;
            Some(sum + rows.saturating_sub(file.deleted_rows()))
        })
    }

    /// An estimate of the distinct non-NULL values of `column`, for join
    /// ordering: `ANALYZE`'s count where the table was analyzed, else for an
    /// integer column the width of its value range (the data files' min/max
    /// statistics), at most the rows; None when neither tells.
    pub fn distinct_estimate(&self, column: &str) -> Option<u64> {
        let rows = self.row_count();
        if let Some(analyzed) = &self.analyzed
            && let Some(distinct) = analyzed.distinct(column, rows.map(|r| r as usize))
        {
            return Some(distinct as u64);
        }
        let (low, high) = self.value_range(column)?;
        let width = (i128::from(high) - i128::from(low) + 1).clamp(0, u64::MAX as i128) as u64;
        Some(rows.map_or(width, |r| width.min(r)))
    }

    /// The smallest and largest value of an integer column over the data
    /// files' min/max statistics (files of NULLs only left out); None for
    /// other types, or when a file's statistics lack the column.
    pub fn value_range(&self, column: &str) -> Option<(i64, i64)> {
        let field = self.stored_schema.field_with_name(column).ok()?;
        if !field.data_type().is_integer() {
            return None;
        }
        let (mut low, mut high) = (i64::MAX, i64::MIN);
        for file in self.files.iter() {
            let stats: serde_json::Value = serde_json::from_str(file.add.stats.as_deref()?).ok()?;
            let bound = |key: &str| stats.get(key)?.get(column)?.as_i64();
            match (bound("minValues"), bound("maxValues")) {
                (Some(min), Some(max)) => {
                    low = low.min(min);
                    high = high.max(max);
                }
                // A file of NULLs only (or none at all) adds no values.
                _ if file.num_records == Some(0) => {}
                _ if stats
                    .get("nullCount")
                    .and_then(|n| n.get(column))
                    .and_then(|n| n.as_u64())
                    == file.num_records.map(|n| n as u64) => {}
                _ => return None,
            }
        }
        (low <= high).then_some((low, high))
    }

    /// The table with `ANALYZE`'s statistics, which scans report to the
    /// planner as their columns' distinct counts.
    pub fn with_analyzed(mut self, statistics: Option<Arc<TableStatistics>>) -> Self {
        self.analyzed = statistics;
        self
    }

    /// The table as `actions` (adds, removes and a new metadata, in order)
    /// would leave it: the view a transaction has of a table it changed but
    /// has not committed. A metadata action (a staged ALTER TABLE) gives the
    /// view its schema and options.
    pub fn with_changes(&self, actions: &[Action]) -> Result<Self> {
        let mut files: Vec<DataFile> = self.files.as_ref().clone();
        let mut changed = self.clone();
        for action in actions {
            match action {
                Action::Remove(remove) => files.retain(|f| f.add.path != remove.path),
                Action::Add(add) => files.push(DataFile::from_add(&self.url, add.clone())?),
                Action::Metadata(metadata) => {
                    let kernel = metadata.parse_schema().map_err(|e| {
                        CirroError::internal(format!("bad staged table schema: {e}"))
                    })?;
                    let stored: Schema = (&kernel).try_into_arrow().map_err(|e| {
                        CirroError::internal(format!("bad staged table schema: {e}"))
                    })?;
                    changed.stored_schema = Arc::new(stored);
                    changed.schema = scan_schema(&changed.stored_schema);
                    changed.options = TableOptions::from_configuration(metadata.configuration());
                    changed.schema_staged = true;
                }
                _ => {}
            }
        }
        changed.files = Arc::new(files);
        Ok(changed)
    }

    /// Whether the schema and options are a transaction's staged ALTER
    /// TABLE (not yet in the Delta log).
    pub fn schema_staged(&self) -> bool {
        self.schema_staged
    }

    /// The same snapshot restricted to the data files named in `paths`
    /// (relative to the table directory), e.g. the files one write added.
    pub fn with_only_files(&self, paths: &[object_store::path::Path]) -> Self {
        let wanted: std::collections::HashSet<&str> = paths.iter().map(|p| p.as_ref()).collect();
        let files = self
            .files
            .iter()
            .filter(|f| wanted.contains(f.add.path.as_str()))
            .cloned()
            .collect();
        Self {
            files: Arc::new(files),
            ..self.clone()
        }
    }

    /// The same snapshot, its scans merged with the table's row store.
    pub fn with_rows(mut self, rows: Option<crate::rowstore::RowReader>) -> Self {
        self.rows = rows;
        self
    }

    /// The table's row store, if scans merge one.
    pub fn rows(&self) -> Option<&crate::rowstore::RowReader> {
        self.rows.as_ref()
    }

    /// The same snapshot, scanned with the row-id columns appended.
    pub fn with_row_ids(&self) -> Self {
        Self {
            row_ids: true,
            ..self.clone()
        }
    }

    /// The same snapshot, scanned without row ids.
    pub fn without_row_ids(&self) -> Self {
        Self {
            row_ids: false,
            ..self.clone()
        }
    }

    pub fn options(&self) -> &TableOptions {
        &self.options
    }

    /// The ordering new rows must have: the table's write order (cluster
    /// key, primary key or index key), if it has one.
    fn write_requirement(&self) -> DfResult<Option<LexRequirement>> {
        let mut requirements = Vec::new();
        for key in self.options.write_order() {
            let expr = datafusion::physical_expr::expressions::col(&key.name, &self.schema)?;
            requirements.push(PhysicalSortRequirement::new(
                expr,
                Some(arrow::compute::SortOptions {
                    descending: key.descending,
                    nulls_first: key.descending,
                }),
            ));
        }
        Ok(LexRequirement::new(requirements))
    }

    pub fn delta(&self) -> &DeltaTable {
        &self.table
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Whether `relative` exists under the table's directory, for a local
    /// one (None: ask the object store).
    pub fn local_exists(&self, relative: &str) -> Option<bool> {
        crate::root::local_exists(self.local.as_deref(), relative)
    }

    pub fn stored_schema(&self) -> &SchemaRef {
        &self.stored_schema
    }

    /// The table's columns as scans produce them (without row ids).
    pub fn table_schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub fn files(&self) -> &[DataFile] {
        &self.files
    }

    pub fn version(&self) -> i64 {
        self.table.version().map(|v| v as i64).unwrap_or(-1)
    }

    /// Whether the table's protocol allows deletion vectors.
    pub fn supports_deletion_vectors(&self) -> bool {
        self.table.snapshot().is_ok_and(|snapshot| {
            snapshot
                .protocol()
                .writer_features()
                .is_some_and(|features| features.iter().any(|f| f.as_ref() == "deletionVectors"))
        })
    }

    /// The deletion vectors of the given files (by index), as logged.
    pub async fn deletion_vectors(&self, indices: &[usize]) -> Result<Vec<Option<RoaringTreemap>>> {
        let with_dv: Vec<(usize, &DeletionVectorDescriptor)> = indices
            .iter()
            .filter_map(|&i| self.files[i].deletion_vector().map(|d| (i, d)))
            .collect();
        let descriptors: Vec<&DeletionVectorDescriptor> = with_dv.iter().map(|(_, d)| *d).collect();
        let mut read = dv::read_all(&self.table.object_store(), &descriptors)
            .await?
            .into_iter();
        Ok(indices
            .iter()
            .map(|&i| {
                if self.files[i].deletion_vector().is_some() {
                    read.next()
                } else {
                    None
                }
            })
            .collect())
    }

    /// The rows the deletion vector of file `index` deletes (None: it has
    /// none); see [`Self::deleted_all`].
    pub async fn deleted(&self, index: usize) -> Result<Option<Arc<dv::Deleted>>> {
        Ok(self.deleted_all(&[index]).await?.pop().flatten())
    }

    /// The rows the deletion vectors of files `indices` delete (None: no
    /// vector), each read once per table version and kept with its file;
    /// a table version read again finds them in the process's map by the
    /// vector's descriptor (which names an immutable file, or holds the
    /// vector inline). The vectors not kept are read together.
    pub async fn deleted_all(&self, indices: &[usize]) -> Result<Vec<Option<Arc<dv::Deleted>>>> {
        let id = |descriptor: &DeletionVectorDescriptor| {
            format!(
                "{}|{:?}|{}|{:?}",
                self.url, descriptor.storage_type, descriptor.path_or_inline_dv, descriptor.offset
            )
        };
        let mut missing = Vec::new();
        for &index in indices {
            let file = &self.files[index];
            let Some(descriptor) = file.deletion_vector() else {
                continue;
            };
            if file.deleted.get().is_some() {
                continue;
            }
            let known = DELETED
                .lock()
                .ok()
                .and_then(|d| d.get(&id(descriptor)).cloned());
            match known {
                Some(found) => {
                    let _ = file.deleted.set(found);
                }
                None => missing.push(index),
            }
        }
        if !missing.is_empty() {
            let read = self.deletion_vectors(&missing).await?;
            for (index, rows) in missing.into_iter().zip(read) {
                let file = &self.files[index];
                let (Some(rows), Some(descriptor)) = (rows, file.deletion_vector()) else {
                    continue;
                };
                let read = Arc::new(dv::Deleted::new(rows));
                if let Ok(mut kept) = DELETED.lock() {
                    if kept.len() >= DELETED_ENTRIES {
                        kept.clear();
                    }
                    kept.insert(id(descriptor), Arc::clone(&read));
                }
                let _ = file.deleted.set(read);
            }
        }
        Ok(indices
            .iter()
            .map(|&i| self.files[i].deleted.get().cloned())
            .collect())
    }

    /// The schema of a scan: the table's columns, then the row ids if asked.
    fn output_schema(&self) -> SchemaRef {
        if !self.row_ids {
            return Arc::clone(&self.schema);
        }
        let mut fields: Vec<FieldRef> = self.schema.fields().iter().cloned().collect();
        fields.push(file_index_field());
        fields.push(row_index_field());
        Arc::new(Schema::new(fields))
    }

    /// One data file as DataFusion's scan takes it: its metadata and
    /// statistics, the rows its deletion vector leaves (a selection, so
    /// that deleted rows are never decoded), its index as the file-index
    /// column with row ids.
    #[allow(clippy::too_many_arguments)]
    async fn partitioned_file(
        &self,
        state: &dyn Session,
        format: &ParquetFormat,
        store: &Arc<dyn object_store::ObjectStore>,
        file_schema: &SchemaRef,
        collect_statistics: bool,
        index: usize,
        deleted: Option<Arc<dv::Deleted>>,
    ) -> DfResult<PartitionedFile> {
        let file = &self.files[index];
        let location = file.location()?.1.clone();
        let meta = ObjectMeta {
            location,
            last_modified: chrono::DateTime::from_timestamp_millis(file.add.modification_time)
                .unwrap_or_default(),
            size: file.size,
            e_tag: None,
            version: None,
        };
        let mut statistics = if collect_statistics {
            format
                .infer_stats_and_ordering(state, store, Arc::clone(file_schema), &meta)
                .await?
                .statistics
        } else {
            Statistics::new_unknown(file_schema)
        };
        let mut part = PartitionedFile::new_from_meta(meta);
        if let Some(deleted) = deleted.filter(|d| !d.rows.is_empty()) {
            // Rows a deletion vector removes are never decoded:
            // the reader gets the surviving rows as a selection.
            let rows = match (file.num_records, &statistics.num_rows) {
                (Some(n), _) => n as u64,
                (None, Precision::Exact(n)) => *n as u64,
                _ => {
                    return Err(CirroError::internal(format!(
                        "data file {} has a deletion vector but no row count",
                        file.url
                    ))
                    .into_datafusion());
                }
            };
            statistics = statistics.to_inexact();
            statistics.num_rows =
                Precision::Inexact(rows.saturating_sub(deleted.rows.len()) as usize);
            // The hot-data tier reads the rows, DataFusion's reader the selection.
            part.extensions.insert_arc(deleted.selection(rows));
            part.extensions.insert_arc(deleted);
        }
        if self.row_ids {
            part = part.with_partition_values(vec![ScalarValue::UInt32(Some(index as u32))]);
        }
        let mut part = part.with_statistics(Arc::new(statistics));
        if self.row_ids {
            if let Some(stats) = part.statistics.as_mut() {
                Arc::make_mut(stats)
                    .column_statistics
                    .push(ColumnStatistics::new_unknown());
            }
        }
        Ok(part)
    }

    /// The distinct counts ANALYZE kept, into a scan's statistics.
    fn apply_analyzed(&self, statistics: &mut Statistics) {
        if let Some(analyzed) = &self.analyzed {
            let rows = statistics.num_rows.get_value().copied();
            for (field, column) in self
                .schema
                .fields()
                .iter()
                .zip(statistics.column_statistics.iter_mut())
            {
                // Only where no value range bounds the column (text keys),
                // for adaptive aggregation's group estimates: DataFusion's
                // join selection takes an aggregation's output from the
                // distinct counts but a filter's from a fixed 20 %, and
                // with l_partkey's count TPC-H Q17 built its semi join from
                // 2 M aggregated rows instead of the 61 K that part ⋈
                // lineitem gives: 2.4 s instead of 1.2 s at SF10. Integer
                // and date keys have their ranges; join order reads the
                // counts itself ([`Self::distinct_estimate`]).
                let ranged =
                    field.data_type().is_integer() || *field.data_type() == DataType::Date32;
                if !ranged && let Some(distinct) = analyzed.distinct(field.name(), rows) {
                    column.distinct_count = Precision::Inexact(distinct);
                }
            }
        }
    }

    /// A physical scan of the files `files` (indices into [`Self::files`]),
    /// each paired with the rows to skip. With `self.row_ids`, every row also
    /// carries its file index and its position in the file.
    pub async fn scan_files(
        &self,
        state: &dyn Session,
        files: Vec<(usize, Option<Arc<dv::Deleted>>)>,
        projection: Option<&[usize]>,
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let files: Vec<_> = files
            .into_iter()
            .filter(|(i, deleted)| {
                let rows = self.files[*i].num_records.map(|n| n as u64);
                !(rows.is_some() && deleted.as_ref().map(|d| d.rows.len()) == rows)
            })
            .collect();
        if files.is_empty() {
            let schema = self.output_schema();
            let schema = match projection {
                Some(indices) => Arc::new(schema.project(indices)?),
                None => schema,
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        }
        let format = ParquetFormat::default().with_options(state.table_options().parquet.clone());
        let object_store_url = self.files[files[0].0].location()?.0.clone();
        let store = state.runtime_env().object_store(&object_store_url)?;
        let file_schema = Arc::clone(&self.schema);
        let collect_statistics = state.config().collect_statistics();
        let concurrency = state
            .config_options()
            .execution
            .meta_fetch_concurrency
            .get();
        let row_ids = self.row_ids;
        let buckets: Vec<Option<u32>> = files
            .iter()
            .map(|(i, _)| crate::bucket::bucket_of(&self.files[*i].add))
            .collect();
        let partitioned = futures::stream::iter(files)
            .map(|(index, deleted)| {
                self.partitioned_file(
                    state,
                    &format,
                    &store,
                    &file_schema,
                    collect_statistics,
                    index,
                    deleted,
                )
            })
            .buffered(concurrency)
            .try_collect::<Vec<_>>()
            .await?;

        let mut builder = TableSchemaBuilder::new(Arc::clone(&self.schema));
        if row_ids {
            builder = builder
                .with_table_partition_cols(vec![file_index_field()])
                .with_virtual_columns(vec![row_index_field()]);
        }
        let table_schema = builder.build();
        let full_schema = Arc::clone(table_schema.table_schema());
        let mut statistics = Statistics::try_merge_iter(
            partitioned.iter().filter_map(|p| p.statistics.as_deref()),
            &full_schema,
        )?;
        self.apply_analyzed(&mut statistics);
        let target = state.config().target_partitions().max(1);
        let (groups, partitioning) = match self.bucketed_groups(&partitioned, &buckets, target)? {
            Some((groups, partitioning)) => (groups, Some(partitioning)),
            None => (split_in_order(partitioned, target), None),
        };
        let groups: Vec<FileGroup> = groups
            .into_iter()
            .map(|group| {
                let stats = Statistics::try_merge_iter(
                    group.iter().filter_map(|p| p.statistics.as_deref()),
                    &full_schema,
                );
                match stats {
                    Ok(stats) => group.with_statistics(Arc::new(stats)),
                    Err(_) => group,
                }
            })
            .collect();
        let source = Arc::new(ParquetSource::new(table_schema));
        let config = FileScanConfigBuilder::new(object_store_url, source)
            .with_file_groups(groups)
            .with_statistics(statistics)
            .with_projection_indices(projection.map(|p| p.to_vec()))?
            .with_limit(limit)
            .with_output_partitioning(partitioning)
            .build();
        format.create_physical_plan(state, config).await
    }
}

/// `files` in at most `n` groups of consecutive files, in their order:
/// DataFusion's `FileGroup::split_files` sorts them by path first, which
/// for files named by their write's id is a random order across writes
/// (a table filled by three INSERTs was read 3, 2, 1 as often as 1, 2, 3).
fn split_in_order(files: Vec<PartitionedFile>, n: usize) -> Vec<FileGroup> {
    let chunk = files.len().div_ceil(n.max(1)).max(1);
    let mut files = files.into_iter().peekable();
    let mut groups = Vec::new();
    while files.peek().is_some() {
        groups.push(FileGroup::new(files.by_ref().take(chunk).collect()));
    }
    groups
}

impl CirroTable {
    /// The distribution scans of this snapshot can declare: the table's,
    /// if this build hashes as its writer did and every file is tagged with
    /// its bucket (files written otherwise, e.g. by another Delta writer,
    /// make the table scan as unbucketed).
    pub fn scan_distribution(&self) -> Option<&crate::bucket::Distribution> {
        let distribution = self.options.distribution.as_ref()?;
        let tagged = self
            .files
            .iter()
            .all(|f| crate::bucket::bucket_of(&f.add).is_some_and(|b| b < distribution.buckets));
        (distribution.hash_matches() && tagged).then_some(distribution)
    }

    /// The files of a bucketed scan grouped into partitions by bucket
    /// (partition j: the buckets b with b mod p = j, p a divisor of the
    /// bucket count, see `bucket.rs`; `buckets` pairs with `files`; each
    /// file carries its [`crate::bucket::FileBucket`]) and the hash
    /// partitioning that makes true; None to scan as unbucketed (not
    /// bucketed, or a scan with row ids).
    fn bucketed_groups(
        &self,
        files: &[PartitionedFile],
        buckets: &[Option<u32>],
        target: usize,
    ) -> DfResult<Option<(Vec<FileGroup>, Partitioning)>> {
        if self.row_ids {
            return Ok(None);
        }
        let Some(distribution) = self.scan_distribution() else {
            return Ok(None);
        };
        let partitions = crate::bucket::scan_partitions(distribution.buckets, target);
        let mut groups = vec![Vec::new(); partitions];
        for (file, bucket) in files.iter().zip(buckets) {
            let Some(bucket) = bucket else {
                return Ok(None);
            };
            groups[*bucket as usize % partitions].push(file.clone().with_extension(
                crate::bucket::FileBucket {
                    bucket: *bucket,
                    buckets: distribution.buckets,
                },
            ));
        }
        let keys = distribution
            .columns
            .iter()
            .map(|c| datafusion::physical_expr::expressions::col(c, &self.schema))
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Some((
            groups.into_iter().map(FileGroup::new).collect(),
            Partitioning::Hash(keys, partitions),
        )))
    }
}

fn file_index_field() -> FieldRef {
    Arc::new(Field::new(FILE_INDEX_COLUMN, DataType::UInt32, false))
}

fn row_index_field() -> FieldRef {
    Arc::new(Field::new(ROW_INDEX_COLUMN, DataType::Int64, false).with_extension_type(RowNumber))
}

impl CirroTable {
    /// A scan of `files` merged with the row store's `view`: the file rows
    /// the view hides are dropped by position, with the deletion vectors
    /// (see `rowstore/located.rs`), and the view's rows added.
    async fn merged_scan(
        &self,
        state: &dyn Session,
        files: Vec<(usize, Option<Arc<dv::Deleted>>)>,
        reader: &crate::rowstore::RowReader,
        view: &crate::rowstore::StoreView,
        projection: Option<&[usize]>,
        limit: Option<usize>,
    ) -> DfResult<ScanResult> {
        let hidden = crate::rowstore::hidden_positions(self, state, &reader.store, view)
            .await
            .map_err(CirroError::into_datafusion)?;
        let version = self.version();
        let files = files
            .into_iter()
            .map(
                |(index, deleted)| match hidden.get(self.files[index].url.as_str()) {
                    Some(more) => {
                        let widened = view.widened(version, index, || {
                            dv::Deleted::new(match &deleted {
                                Some(deleted) => &deleted.rows | more,
                                None => more.clone(),
                            })
                        });
                        (index, Some(widened))
                    }
                    None => (index, deleted),
                },
            )
            .collect();
        let plan = self.scan_files(state, files, projection, limit).await?;
        let plan = reader.plan(view, plan, projection)?;
        Ok(ScanResult::new(plan))
    }
}

#[async_trait]
impl TableProvider for CirroTable {
    fn schema(&self) -> SchemaRef {
        self.output_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let args = ScanArgs::default()
            .with_projection(projection.map(|p| p.as_slice()))
            .with_filters(Some(filters))
            .with_limit(limit);
        Ok(self.scan_with_args(state, args).await?.into_inner())
    }

    async fn scan_with_args<'a>(
        &self,
        state: &dyn Session,
        args: ScanArgs<'a>,
    ) -> DfResult<ScanResult> {
        let indices: Vec<usize> = (0..self.files.len()).collect();
        let deleted = self
            .deleted_all(&indices)
            .await
            .map_err(CirroError::into_datafusion)?;
        let files = indices.into_iter().zip(deleted).collect();
        if let Some(reader) = self.rows.as_ref().filter(|_| !self.row_ids) {
            let view = reader
                .view(self.version())
                .map_err(CirroError::into_datafusion)?;
            if !view.is_empty() {
                return self
                    .merged_scan(state, files, reader, &view, args.projection(), args.limit())
                    .await;
            }
        }
        let plan = self
            .scan_files(state, files, args.projection(), args.limit())
            .await?;
        Ok(ScanResult::new(plan))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    /// TRUNCATE: one commit that removes every data file (an OVERWRITE with no
    /// rows). It runs when the plan executes, so EXPLAIN TRUNCATE changes nothing.
    async fn truncate(&self, _state: &dyn Session) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sink = TableSink::new(
            self.table.clone(),
            Arc::clone(&self.stored_schema),
            Arc::clone(&self.schema),
            SaveMode::Overwrite,
        );
        let nothing = Arc::new(EmptyExec::new(Arc::clone(&self.schema)));
        Ok(Arc::new(DataSinkExec::new(nothing, Arc::new(sink), None)))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mode = match insert_op {
            InsertOp::Append => SaveMode::Append,
            InsertOp::Overwrite => SaveMode::Overwrite,
            InsertOp::Replace => {
                return Err(
                    CirroError::unsupported("REPLACE INTO is not supported").into_datafusion()
                );
            }
        };
        let sink = TableSink::new(
            self.table.clone(),
            Arc::clone(&self.stored_schema),
            Arc::clone(&self.schema),
            mode,
        );
        // Rows of a clustered or indexed table are written sorted by its key.
        let order = self.write_requirement()?;
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), order)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Int32Array, Int64Array, RecordBatch, StringArray};

    use super::*;
    use crate::stats::ColumnStatistics;

    /// Scans read a table's files in the order they were written: the
    /// groups keep the order they are given (not sorted by name).
    #[test]
    fn files_are_grouped_in_their_order() {
        let names = [
            "part-00000-f",
            "part-00000-a",
            "part-00000-c",
            "part-00001-c",
            "part-00000-b",
        ];
        let files: Vec<PartitionedFile> = names
            .iter()
            .map(|n| PartitionedFile::new(n.to_string(), 10))
            .collect();
        let groups = split_in_order(files, 2);
        let listed: Vec<Vec<String>> = groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| f.object_meta.location.to_string())
                    .collect()
            })
            .collect();
        assert_eq!(
            listed,
            vec![
                vec!["part-00000-f", "part-00000-a", "part-00000-c"],
                vec!["part-00001-c", "part-00000-b"],
            ]
        );
        assert_eq!(split_in_order(Vec::new(), 4).len(), 0);
        let one = split_in_order(vec![PartitionedFile::new("x".to_string(), 1)], 4);
        assert_eq!(one.len(), 1);
    }

    #[tokio::test]
    async fn distinct_estimates_from_ranges_and_analyze() {
        let dir = std::env::temp_dir().join(format!("cirro-distinct-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = Url::from_directory_path(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("n", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        create_delta_table(&url, &schema, &Default::default())
            .await
            .unwrap();
        // Three files: n in 0..10, n in 5..25, n all NULL; k 1..=300 with
        // gaps of 10 (3,000 wide, 300 rows).
        let files: [(i64, Box<dyn Fn(i64) -> Option<i32>>); 3] = [
            (0, Box::new(|i| Some((i % 10) as i32))),
            (100, Box::new(|i| Some((5 + i % 20) as i32))),
            (200, Box::new(|_| None)),
        ];
        for (base, n) in files {
            let rows: Vec<i64> = (base..base + 100).collect();
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(
                        rows.iter().map(|i| i * 10 + 1),
                    )),
                    Arc::new(Int32Array::from_iter(rows.iter().map(|&i| n(i)))),
                    Arc::new(StringArray::from_iter_values(
                        rows.iter().map(|i| format!("s{}", i % 3)),
                    )),
                ],
            )
            .unwrap();
            let table = CirroTable::open(&url).await.unwrap();
            crate::write::write_stream(
                table.delta(),
                Arc::clone(&schema),
                futures::stream::iter(vec![Ok(batch)]),
                SaveMode::Append,
            )
            .await
            .unwrap();
        }
        let table = CirroTable::open(&url).await.unwrap();
        assert_eq!(table.row_count(), Some(300));
        // The range 0..=24, whatever the NULL file says.
        assert_eq!(table.distinct_estimate("n"), Some(25));
        // 1..=2,991 is wider than the rows: the rows.
        assert_eq!(table.distinct_estimate("k"), Some(300));
        // Strings have no range; an unknown column nothing.
        assert_eq!(table.distinct_estimate("s"), None);
        assert_eq!(table.distinct_estimate("missing"), None);
        assert_eq!(table.value_range("n"), Some((0, 24)));
        assert_eq!(table.value_range("k"), Some((1, 2991)));
        assert_eq!(table.value_range("s"), None);
        // ANALYZE's counts come first.
        let mut columns = BTreeMap::new();
        for (name, distinct) in [("s", 3), ("n", 20)] {
            let stats = ColumnStatistics {
                nulls: 0,
                distinct: Some(distinct),
            };
            columns.insert(name.to_string(), stats);
        }
        let analyzed = TableStatistics {
            version: table.version(),
            analyzed_ms: 0,
            rows: 300,
            columns,
        };
        let table = table.with_analyzed(Some(Arc::new(analyzed)));
        assert_eq!(table.distinct_estimate("s"), Some(3));
        assert_eq!(table.distinct_estimate("n"), Some(20));
        assert_eq!(table.distinct_estimate("k"), Some(300));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
