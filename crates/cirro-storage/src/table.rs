//! [`CirroTable`]: a Delta table as a DataFusion `TableProvider`.
//!
//! A scan reads exactly the data files of the table's current Delta snapshot. It
//! hands that file list to DataFusion's own `ListingTable` (one URL per file),
//! so that Cirro's tables are planned and read exactly as DataFusion plans and
//! reads plain Parquet files: the same statistics, the same file-group splitting,
//! the same Parquet options and caches. Files on disk that the log does not
//! reference (left by a crashed writer) are never read.
//!
//! INSERT goes through [`crate::write::TableSink`], which writes new data files
//! and commits them in one Delta commit.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use cirro_common::{CirroError, Result, SqlState};
use datafusion::catalog::Session;
use datafusion::catalog::{ScanArgs, ScanResult};
use datafusion::datasource::TableProvider;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use deltalake::DeltaTable;
use deltalake::kernel::StructType;
use deltalake::kernel::engine::arrow_conversion::{TryIntoArrow, TryIntoKernel};
use deltalake::protocol::SaveMode;
use url::Url;

use crate::schema::{scan_schema, storage_schema};
use crate::write::TableSink;

/// Per-table storage options, kept in the Delta table's configuration.
#[derive(Clone, Debug, Default)]
pub struct TableOptions {
    pub comment: Option<String>,
}

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
        .with_save_mode(SaveMode::ErrorIfExists);
    if let Some(comment) = &options.comment {
        builder = builder.with_comment(comment.clone());
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

/// A Cirro table: one Delta snapshot, scanned and appended to through DataFusion.
#[derive(Debug, Clone)]
pub struct CirroTable {
    table: DeltaTable,
    url: Url,
    /// The schema as stored in Delta (Utf8 strings, non-null flags).
    stored_schema: SchemaRef,
    /// The schema scans produce (Utf8View strings).
    schema: SchemaRef,
    /// URLs of the snapshot's data files, with their sizes.
    files: Arc<Vec<DataFile>>,
}

#[derive(Debug, Clone)]
pub struct DataFile {
    pub url: String,
    pub size: u64,
    pub num_records: Option<usize>,
}

impl CirroTable {
    /// Open the table stored at `url`.
    pub async fn open(url: &Url) -> Result<Self> {
        let table = open_delta_table(url).await?;
        Self::from_delta(table, url.clone())
    }

    pub fn from_delta(table: DeltaTable, url: Url) -> Result<Self> {
        let snapshot = table.snapshot()?;
        let kernel_schema = snapshot.schema();
        let stored: Schema = kernel_schema
            .as_ref()
            .try_into_arrow()
            .map_err(|e| CirroError::internal(format!("bad table schema at {url}: {e}")))?;
        let stored_schema = Arc::new(stored);
        let files = snapshot
            .log_data()
            .iter()
            .map(|file| {
                let relative = file.object_store_path();
                Ok(DataFile {
                    url: url
                        .join(relative.as_ref())
                        .map_err(|e| CirroError::internal(format!("bad data file path: {e}")))?
                        .to_string(),
                    size: file.size().max(0) as u64,
                    num_records: file.num_records(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            schema: scan_schema(&stored_schema),
            stored_schema,
            table,
            url,
            files: Arc::new(files),
        })
    }

    pub fn delta(&self) -> &DeltaTable {
        &self.table
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    pub fn stored_schema(&self) -> &SchemaRef {
        &self.stored_schema
    }

    pub fn files(&self) -> &[DataFile] {
        &self.files
    }

    pub fn version(&self) -> i64 {
        self.table.version().map(|v| v as i64).unwrap_or(-1)
    }

    fn listing_table(&self, state: &dyn Session) -> DfResult<ListingTable> {
        let urls = self
            .files
            .iter()
            .map(|f| ListingTableUrl::parse(&f.url))
            .collect::<DfResult<Vec<_>>>()?;
        let format = ParquetFormat::default().with_options(state.table_options().parquet.clone());
        let options = ListingOptions::new(Arc::new(format)).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(options)
            .with_schema(Arc::clone(&self.schema));
        Ok(ListingTable::try_new(config)?
            .with_cache(state.runtime_env().cache_manager.get_file_statistic_cache()))
    }
}

#[async_trait]
impl TableProvider for CirroTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        if self.files.is_empty() {
            let schema = match args.projection() {
                Some(indices) => Arc::new(self.schema.project(indices)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(ScanResult::new(Arc::new(EmptyExec::new(schema))));
        }
        self.listing_table(state)?.scan_with_args(state, args).await
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
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}
