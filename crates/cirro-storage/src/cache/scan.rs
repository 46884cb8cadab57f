//! Scans through the hot-data tier: [`CachedParquetSource`] wraps
//! DataFusion's `ParquetSource` (everything but reading is the wrapped
//! source's: filter and projection pushdown, statistics, EXPLAIN) and
//! reads row groups from the [`ColumnCache`], decoding from the file only
//! the column chunks the cache lacks; [`CacheScans`], the last physical
//! optimizer rule, puts it in place with the priority the plan gives.
//!
//! What the cached reader does as DataFusion's does: row groups outside the
//! file's byte range (a file split across partitions) are skipped, and so are
//! those the scan's predicate (dynamic join/TopK filters included, as they
//! stand when the file is opened) rules out by their statistics and then by
//! their bloom filters (Cirro's indexes write them); rows a
//! deletion vector removes (the [`Deleted`] rows Cirro attaches, or a
//! `ParquetRowSelection`) are dropped; the limit stops the scan. Beyond
//! DataFusion's reader without `pushdown_filters`, the dynamic parts of the
//! predicate (a hash join's build-side keys, a TopK's bound) also drop
//! rows, batch by batch as
//! they stand then (see [`DynamicRowFilter`]): the rows that reach a join
//! or an aggregation under it are those that can matter. What it leaves to the wrapped reader
//! (so scans using it bypass the cache): partition or virtual columns (DML
//! scans with row ids), projections of expressions rather than columns, row
//! filters evaluated inside the reader (`pushdown_filters`). A cached scan
//! does not use page indexes: whole row groups are decoded once and then
//! read from memory.

use std::collections::HashMap;
use std::fmt::Formatter;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBufferBuilder, RecordBatch, RecordBatchOptions,
    new_null_array,
};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::physical_plan::parquet::{
    BloomFilterStatistics, DefaultParquetFileReaderFactory, ParquetAccessPlan, ParquetFileMetrics,
    ParquetFileReaderFactory, ParquetRowSelection, RowGroupAccessPlanFilter,
    apply_file_schema_type_coercions,
};
use datafusion::datasource::physical_plan::{
    FileOpener, FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, DynamicFilterPhysicalExpr, Literal};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns, split_conjunction};
use datafusion::physical_expr_common::physical_expr::{
    is_volatile, snapshot_generation, snapshot_physical_expr,
};
use datafusion::physical_expr_common::sort_expr::PhysicalSortExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::pruning::{
    FilePruner, PruningPredicate, PruningPredicateBuilder,
};
use datafusion::physical_plan::DisplayFormatType;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::filter_pushdown::FilterPushdownPropagation;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sort_pushdown::SortOrderPushdownResult;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion_datasource::PartitionedFile;
use datafusion_datasource::morsel::{Morsel, MorselPlan, MorselPlanner, Morselizer};
use futures::FutureExt;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::{ProjectionMask, parquet_column};
use parquet::file::metadata::ParquetMetaData;

use cirro_exec::conjunction::{kept, scatter};
use datafusion::logical_expr::ColumnarValue;

use super::routed::Routed;
use super::{Chunk, ChunkKey, ColumnCache, PIECE_ROWS, Priority};
use crate::dv::Deleted;

/// DataFusion's Parquet source, reading through the hot-data tier.
#[derive(Clone)]
pub struct CachedParquetSource {
    inner: ParquetSource,
    cache: Arc<ColumnCache>,
    priority: Priority,
    /// The dynamic filters (by expression id) of the joins above the scan,
    /// by what lies between (see [`CacheScans`] and [`DynamicRowFilter`]).
    above: Arc<Above>,
}

impl CachedParquetSource {
    pub fn new(inner: ParquetSource, cache: Arc<ColumnCache>, priority: Priority) -> Self {
        Self {
            inner,
            cache,
            priority,
            above: Arc::new(Above::default()),
        }
    }

    /// The source, knowing the dynamic filters (their expression ids) to
    /// come from the joins above (see [`Above`]).
    fn with_filters_above(mut self, above: &Above) -> Self {
        self.above = Arc::new(above.clone());
        self
    }

    /// `source` (what the wrapped source returned) wrapped again.
    fn wrap(&self, source: Arc<dyn FileSource>) -> Arc<dyn FileSource> {
        match source.downcast_ref::<ParquetSource>() {
            Some(parquet) => Arc::new(Self {
                inner: parquet.clone(),
                ..self.clone()
            }),
            None => source,
        }
    }

    /// The file columns a cached read produces, in output order; None when
    /// the scan needs the wrapped reader (see the module docs).
    fn cached_columns(&self) -> Option<Vec<usize>> {
        let schema: &TableSchema = self.inner.table_schema();
        if !schema.table_partition_cols().is_empty()
            || !schema.virtual_columns().is_empty()
            || self.inner.table_parquet_options().global.pushdown_filters
        {
            return None;
        }
        let files = schema.file_schema().fields().len();
        match self.inner.projection() {
            None => Some((0..files).collect()),
            Some(projection) => projection
                .iter()
                .map(|p| {
                    let column = p.expr.downcast_ref::<Column>()?;
                    (column.index() < files && p.alias == column.name()).then_some(column.index())
                })
                .collect(),
        }
    }
}

impl std::fmt::Debug for CachedParquetSource {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedParquetSource")
            .field("priority", &self.priority)
            .finish()
    }
}

impl FileSource for CachedParquetSource {
    fn create_file_opener(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> Result<Arc<dyn FileOpener>> {
        self.inner
            .create_file_opener(object_store, base_config, partition)
    }

    fn create_morselizer(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> Result<Box<dyn Morselizer>> {
        let Some(columns) = self.cached_columns() else {
            return self
                .inner
                .create_morselizer(object_store, base_config, partition);
        };
        let file_schema = Arc::clone(self.inner.table_schema().file_schema());
        let output = Arc::new(file_schema.project(&columns)?);
        let metrics = self.inner.metrics().clone();
        let dynamic = DynamicRowFilter::new(self.inner.filter(), &output, &self.above);
        let opener = CachedOpener {
            cache: Arc::clone(&self.cache),
            readers: self
                .inner
                .parquet_file_reader_factory()
                .cloned()
                .unwrap_or_else(|| Arc::new(DefaultParquetFileReaderFactory::new(object_store))),
            file_schema,
            columns,
            output,
            dynamic,
            predicate: self.inner.filter(),
            pruning: self.inner.table_parquet_options().global.pruning,
            bloom_filters: self
                .inner
                .table_parquet_options()
                .global
                .bloom_filter_on_read,
            limit: base_config.limit,
            priority: self.priority,
            epoch: self.cache.epoch(),
            partition,
            hits: MetricBuilder::new(&metrics).counter("cache_hits", partition),
            misses: MetricBuilder::new(&metrics).counter("cache_misses", partition),
            rejected: MetricBuilder::new(&metrics).counter("cache_rejected", partition),
            dynamic_filtered: MetricBuilder::new(&metrics)
                .counter("dynamic_filter_rows_dropped", partition),
            dynamic_filter_time: MetricBuilder::new(&metrics)
                .subset_time("dynamic_filter_time", partition),
            metrics,
        };
        Ok(Box::new(CachedMorselizer(Arc::new(opener))))
    }

    fn table_schema(&self) -> &TableSchema {
        self.inner.table_schema()
    }

    /// The wrapped reader's batch size; a cached scan hands on the pieces
    /// the cache holds ([`PIECE_ROWS`] rows, DataFusion's default batch size).
    fn with_batch_size(&self, batch_size: usize) -> Arc<dyn FileSource> {
        self.wrap(self.inner.with_batch_size(batch_size))
    }

    fn filter(&self) -> Option<Arc<dyn PhysicalExpr>> {
        self.inner.filter()
    }

    fn projection(&self) -> Option<&ProjectionExprs> {
        self.inner.projection()
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        self.inner.metrics()
    }

    fn file_type(&self) -> &str {
        self.inner.file_type()
    }

    fn fmt_extra(&self, t: DisplayFormatType, f: &mut Formatter) -> std::fmt::Result {
        self.inner.fmt_extra(t, f)?;
        write!(f, ", cache={}", self.priority.name())
    }

    fn supports_repartitioning(&self) -> bool {
        self.inner.supports_repartitioning()
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        repartition_file_min_size: usize,
        output_ordering: Option<datafusion::physical_expr::LexOrdering>,
        config: &FileScanConfig,
    ) -> Result<Option<FileScanConfig>> {
        self.inner.repartitioned(
            target_partitions,
            repartition_file_min_size,
            output_ordering,
            config,
        )
    }

    fn try_pushdown_filters(
        &self,
        filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn FileSource>>> {
        let mut result = self.inner.try_pushdown_filters(filters, config)?;
        result.updated_node = result.updated_node.map(|node| self.wrap(node));
        Ok(result)
    }

    fn try_pushdown_sort(
        &self,
        order: &[PhysicalSortExpr],
        eq_properties: &EquivalenceProperties,
    ) -> Result<SortOrderPushdownResult<Arc<dyn FileSource>>> {
        Ok(self
            .inner
            .try_pushdown_sort(order, eq_properties)?
            .map(|inner| self.wrap(inner)))
    }

    fn reorder_files(&self, files: Vec<PartitionedFile>) -> Vec<PartitionedFile> {
        self.inner.reorder_files(files)
    }

    fn try_pushdown_projection(
        &self,
        projection: &ProjectionExprs,
    ) -> Result<Option<Arc<dyn FileSource>>> {
        Ok(self
            .inner
            .try_pushdown_projection(projection)?
            .map(|s| self.wrap(s)))
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.inner.apply_expressions(f)
    }
}

/// Opens one file of a cached scan (see the module docs).
struct CachedOpener {
    cache: Arc<ColumnCache>,
    /// DataFusion's reader of the scan's files (it counts bytes_scanned).
    readers: Arc<dyn ParquetFileReaderFactory>,
    /// The table's columns (the scan's file schema).
    file_schema: SchemaRef,
    /// Indices into `file_schema` of the columns produced, in order.
    columns: Vec<usize>,
    output: SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    /// The row filter of `predicate`'s dynamic parts, over `output`'s columns.
    dynamic: DynamicRowFilter,
    pruning: bool,
    /// Whether row groups are pruned by their bloom filters (Cirro's
    /// indexes write them).
    bloom_filters: bool,
    limit: Option<usize>,
    priority: Priority,
    epoch: u64,
    partition: usize,
    metrics: ExecutionPlanMetricsSet,
    hits: Count,
    misses: Count,
    rejected: Count,
    dynamic_filtered: Count,
    dynamic_filter_time: Time,
}

impl std::fmt::Debug for CachedOpener {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedOpener")
            .field("columns", &self.columns)
            .field("priority", &self.priority)
            .finish()
    }
}

/// The morsel API over [`CachedOpener`]: one morsel per file, its stream
/// (as DataFusion adapts a `FileOpener`, which it does not export).
#[derive(Debug)]
struct CachedMorselizer(Arc<CachedOpener>);

impl Morselizer for CachedMorselizer {
    fn plan_file(&self, file: PartitionedFile) -> Result<Box<dyn MorselPlanner>> {
        Ok(Box::new(CachedPlanner::Unopened(
            Arc::clone(&self.0),
            Box::new(file),
        )))
    }
}

enum CachedPlanner {
    Unopened(Arc<CachedOpener>, Box<PartitionedFile>),
    Ready(BoxStream<'static, Result<RecordBatch>>),
}

impl std::fmt::Debug for CachedPlanner {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        f.write_str("CachedPlanner")
    }
}

impl MorselPlanner for CachedPlanner {
    fn plan(self: Box<Self>) -> Result<Option<MorselPlan>> {
        match *self {
            Self::Unopened(opener, file) => {
                let priority = opener.priority;
                let opening = super::SCAN_PRIORITY
                    .scope(priority, async move {
                        let stream = opener.open_file(*file).await?;
                        Ok(Box::new(Self::Ready(stream)) as Box<dyn MorselPlanner>)
                    })
                    .boxed();
                Ok(Some(MorselPlan::new().with_pending_planner(opening)))
            }
            Self::Ready(stream) => Ok(Some(
                MorselPlan::new().with_morsels(vec![Box::new(FileMorsel(stream))]),
            )),
        }
    }
}

struct FileMorsel(BoxStream<'static, Result<RecordBatch>>);

impl std::fmt::Debug for FileMorsel {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileMorsel")
    }
}

impl Morsel for FileMorsel {
    fn into_stream(self: Box<Self>) -> BoxStream<'static, Result<RecordBatch>> {
        self.0
    }
}

impl CachedOpener {
    async fn footer(
        &self,
        path: &Arc<str>,
        file: &PartitionedFile,
    ) -> Result<Arc<ParquetMetaData>> {
        let size = file.object_meta.size;
        if let Some(footer) = self.cache.footer(path, size) {
            return Ok(footer);
        }
        let mut reader: Box<dyn AsyncFileReader> =
            self.readers
                .create_reader(self.partition, file.clone(), None, &self.metrics)?;
        let loaded = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
            .await?
            .metadata()
            .clone();
        self.cache
            .keep_footer(Arc::clone(path), size, Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The bloom filters of the row groups `plan` still reads, for the
    /// columns `pruning` compares with literals (as DataFusion's reader
    /// loads them; a filter that cannot be read prunes nothing).
    async fn bloom_filters(
        &self,
        file: &PartitionedFile,
        reader_metadata: &ArrowReaderMetadata,
        physical: &SchemaRef,
        pruning: &PruningPredicate,
        plan: &RowGroupAccessPlanFilter,
    ) -> Result<Vec<BloomFilterStatistics>> {
        let groups = reader_metadata.metadata().num_row_groups();
        let mut filters = vec![BloomFilterStatistics::new(); groups];
        let reader: Box<dyn AsyncFileReader> =
            self.readers
                .create_reader(self.partition, file.clone(), None, &self.metrics)?;
        let mut builder =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, reader_metadata.clone());
        let columns: Vec<(String, usize)> = pruning
            .literal_columns()
            .into_iter()
            .filter_map(|name| {
                let (index, _) = parquet_column(builder.parquet_schema(), physical, &name)?;
                Some((name, index))
            })
            .collect();
        if columns.is_empty() {
            return Ok(filters);
        }
        for group in plan.row_group_indexes() {
            let mut found = BloomFilterStatistics::with_capacity(columns.len());
            for (name, index) in &columns {
                let descriptor = builder.parquet_schema().column(*index);
                let (kind, length) = (descriptor.physical_type(), descriptor.type_length());
                if let Ok(Some(filter)) = builder
                    .get_row_group_column_bloom_filter(group, *index)
                    .await
                {
                    found.insert(name, filter, kind, length);
                }
            }
            filters[group] = found;
        }
        Ok(filters)
    }

    async fn open_file(
        self: Arc<Self>,
        file: PartitionedFile,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let path: Arc<str> = Arc::from(file.object_meta.location.as_ref());
        let size = file.object_meta.size;
        // The file as a whole first, by its statistics (as DataFusion's reader).
        // A predicate the pruner cannot read prunes nothing, and the
        // filters above drop the rows anyway. (A join's dynamic filter in
        // the join's column indices once reached cluster workers' scans,
        // TPC-H Q7's o_custkey at index 10 over orders' 9 columns: a filled
        // filter sent to another node, which cirro-cluster's
        // dynamic_filters.rs now prevents.)
        let file_metrics = ParquetFileMetrics::new(self.partition, path.as_ref(), &self.metrics);
        if let Some(predicate) = &self.predicate
            && let Some(mut pruner) = FilePruner::try_new(
                Arc::clone(predicate),
                &self.file_schema,
                &file,
                Count::new(),
            )
            && pruner.should_prune().unwrap_or_else(|e| {
                log::debug!("{path}: not pruned, its predicate does not fit: {e}");
                false
            })
        {
            file_metrics.files_ranges_pruned_statistics.add_pruned(1);
            return Ok(futures::stream::empty().boxed());
        }
        file_metrics.files_ranges_pruned_statistics.add_matched(1);
        let footer = self.footer(&path, &file).await?;
        // The file's columns as the table reads them (Utf8View strings, …).
        let natural = ArrowReaderMetadata::try_new(Arc::clone(&footer), ArrowReaderOptions::new())?;
        let mut physical = Arc::clone(natural.schema());
        if let Some(coerced) = apply_file_schema_type_coercions(&self.file_schema, &physical) {
            physical = Arc::new(coerced);
        }
        let reader_metadata = ArrowReaderMetadata::try_new(
            Arc::clone(&footer),
            ArrowReaderOptions::new().with_schema(Arc::clone(&physical)),
        )?;
        // Output column i: the file's column sources[i] (None: the file
        // predates the column, which reads as NULL).
        let sources: Vec<Option<usize>> = self
            .columns
            .iter()
            .map(|&c| physical.index_of(self.file_schema.field(c).name()).ok())
            .collect();

        let groups = footer.row_groups();
        let mut plan = RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(groups.len()));
        if let Some(range) = &file.range {
            plan.prune_by_range(groups, range);
        }
        let same_columns = physical.fields().len() == self.file_schema.fields().len()
            && physical
                .fields()
                .iter()
                .zip(self.file_schema.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        let pruning = match &self.predicate {
            Some(predicate) if same_columns => PruningPredicateBuilder::new()
                .with_file_schema(Arc::clone(&physical))
                .build(snapshot_physical_expr(Arc::clone(predicate))?),
            _ => None,
        };
        if let Some(pruning) = &pruning {
            if self.pruning {
                plan.prune_by_statistics(
                    &physical,
                    reader_metadata.parquet_schema(),
                    groups,
                    pruning,
                    &file_metrics,
                );
            }
            if self.bloom_filters && plan.remaining_row_group_count() > 0 {
                let filters = self
                    .bloom_filters(&file, &reader_metadata, &physical, pruning, &plan)
                    .await?;
                plan.prune_by_bloom_filters(pruning, &file_metrics, &filters);
            }
        }
        let wanted: Vec<usize> = plan.build().row_group_indexes();
        // Cirro's tables attach the deleted rows; a file that came with a
        // selection only (a task from another node) has them made here.
        let deleted: Option<Arc<Deleted>> = file.extensions.get_arc::<Deleted>().or_else(|| {
            file.extensions
                .get::<ParquetRowSelection>()
                .map(|s| Arc::new(Deleted::skipped_by(s.selection())))
        });

        // Each kept row group: its first row in the file and its rows.
        let mut first_rows = Vec::with_capacity(groups.len());
        let mut at = 0usize;
        for group in groups {
            first_rows.push(at);
            at += group.num_rows().max(0) as usize;
        }
        let state = FileState {
            opener: Arc::clone(&self),
            file: file.clone(),
            path,
            size,
            reader_metadata,
            sources,
            row_groups: wanted
                .iter()
                .map(|&g| (g, first_rows[g], groups[g].num_rows().max(0) as usize))
                .collect(),
            deleted,
            next: 0,
            left: self.limit,
            dynamic: self.dynamic.clone(),
        };
        let stream = futures::stream::try_unfold(state, |mut state| {
            // The disk tier below the store reads with the scan's priority.
            super::SCAN_PRIORITY.scope(state.opener.priority, async move {
                loop {
                    if state.next >= state.row_groups.len() || state.left == Some(0) {
                        return Ok::<_, DataFusionError>(None);
                    }
                    let batches = state.next_row_group().await?;
                    if !batches.is_empty() {
                        return Ok(Some((
                            futures::stream::iter(batches.into_iter().map(Ok)),
                            state,
                        )));
                    }
                }
            })
        })
        .try_flatten();
        Ok(stream.boxed())
    }
}

/// A cached read of one file in progress.
struct FileState {
    opener: Arc<CachedOpener>,
    file: PartitionedFile,
    path: Arc<str>,
    size: u64,
    reader_metadata: ArrowReaderMetadata,
    sources: Vec<Option<usize>>,
    /// (row group, first row in the file, rows), in file order.
    row_groups: Vec<(usize, usize, usize)>,
    /// The rows of the file its deletion vector (and a row store) deletes.
    deleted: Option<Arc<Deleted>>,
    next: usize,
    left: Option<usize>,
    dynamic: DynamicRowFilter,
}

impl FileState {
    /// The batches of the next kept row group.
    ///
    /// Where a deletion vector drops rows of the row group, the chunks are
    /// kept filtered (the rows it keeps, under a fingerprint of the rows it
    /// deletes, see [`ChunkKey::live`]): a scan then hands on cached pieces
    /// as it does for a table without deletions, instead of copying every
    /// column of every batch again (TPC-H SF1 Q1 with 25,000 lines deleted
    /// by a row store: 0.14 → 0.27 s, the copies' fresh pages a third of it
    /// in the kernel). A new deletion in the row group makes a new
    /// fingerprint, whose chunks are filtered once from the whole ones.
    async fn next_row_group(&mut self) -> Result<Vec<RecordBatch>> {
        let (group, first, rows) = self.row_groups[self.next];
        self.next += 1;
        let opener = Arc::clone(&self.opener);
        let keep = self.selection_of(first, rows);
        let live = keep.as_ref().map_or(0, fingerprint);
        let key = |column: usize, live: u64| ChunkKey {
            file: Arc::clone(&self.path),
            size: self.size,
            row_group: group as u32,
            column: column as u32,
            live,
        };
        let mut found: HashMap<usize, Chunk> = HashMap::new();
        let mut missing = Vec::new();
        for source in self.sources.iter().flatten() {
            if found.contains_key(source) || missing.contains(source) {
                continue;
            }
            match opener
                .cache
                .get(&key(*source, live), opener.priority, opener.epoch)
            {
                Some(chunk) => {
                    opener.hits.add(1);
                    found.insert(*source, chunk);
                }
                None => {
                    opener.misses.add(1);
                    missing.push(*source);
                }
            }
        }
        if !missing.is_empty() {
            // The whole chunks of the columns missing: kept, or decoded.
            let mut whole: HashMap<usize, Chunk> = HashMap::new();
            let mut undecoded = Vec::new();
            for &column in &missing {
                let kept = (live != 0)
                    .then(|| {
                        opener
                            .cache
                            .get(&key(column, 0), opener.priority, opener.epoch)
                    })
                    .flatten();
                match kept {
                    Some(chunk) => {
                        whole.insert(column, chunk);
                    }
                    None => undecoded.push(column),
                }
            }
            if !undecoded.is_empty() {
                for (column, chunk) in self.decode(group, rows, &undecoded).await? {
                    if !opener.cache.insert(
                        key(column, 0),
                        Arc::clone(&chunk),
                        opener.priority,
                        opener.epoch,
                    ) {
                        opener.rejected.add(1);
                    }
                    whole.insert(column, chunk);
                }
            }
            for column in missing {
                let chunk = whole.remove(&column).ok_or_else(|| {
                    DataFusionError::Internal(format!("column {column} was not decoded"))
                })?;
                let chunk = match &keep {
                    Some(keep) => {
                        let filtered = filter_chunk(&chunk, keep)?;
                        if !opener.cache.insert(
                            key(column, live),
                            Arc::clone(&filtered),
                            opener.priority,
                            opener.epoch,
                        ) {
                            opener.rejected.add(1);
                        }
                        filtered
                    }
                    None => chunk,
                };
                found.insert(column, chunk);
            }
        }
        let mut batches = Vec::new();
        let mut offset = 0;
        for piece in 0..rows.div_ceil(PIECE_ROWS) {
            let whole = PIECE_ROWS.min(rows - offset);
            let length = keep
                .as_ref()
                .map_or(whole, |keep| keep.slice(offset, whole).true_count());
            offset += whole;
            if length == 0 {
                continue;
            }
            let columns = self
                .sources
                .iter()
                .zip(opener.output.fields())
                .map(|(source, field)| match source {
                    Some(c) => Arc::clone(&found[c][piece]),
                    None => new_null_array(field.data_type(), length),
                })
                .collect::<Vec<ArrayRef>>();
            let options = RecordBatchOptions::new().with_row_count(Some(length));
            let mut batch =
                RecordBatch::try_new_with_options(Arc::clone(&opener.output), columns, &options)?;
            let before = batch.num_rows();
            let timer = opener.dynamic_filter_time.timer();
            batch = self.dynamic.apply(batch)?;
            timer.done();
            opener.dynamic_filtered.add(before - batch.num_rows());
            if let Some(left) = self.left.as_mut() {
                if batch.num_rows() > *left {
                    batch = batch.slice(0, *left);
                }
                *left -= batch.num_rows();
            }
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
            if self.left == Some(0) {
                break;
            }
        }
        Ok(batches)
    }

    /// The rows of `rows` rows starting at file row `first` that the
    /// deletion vector keeps, as a filter (None: all of them).
    fn selection_of(&self, first: usize, rows: usize) -> Option<BooleanArray> {
        kept_rows(&self.deleted.as_ref()?.rows, first, rows)
    }

    /// Decode `columns` (indices in the file's schema) of row group
    /// `group`, cast to the table's types, in pieces of [`PIECE_ROWS`].
    async fn decode(
        &self,
        group: usize,
        rows: usize,
        columns: &[usize],
    ) -> Result<Vec<(usize, Chunk)>> {
        let opener = &self.opener;
        let reader: Box<dyn AsyncFileReader> = opener.readers.create_reader(
            opener.partition,
            self.file.clone(),
            None,
            &opener.metrics,
        )?;
        decode_row_group(
            reader,
            &self.reader_metadata,
            &self.path,
            (group, rows),
            columns,
            |column| {
                opener
                    .output
                    .fields()
                    .iter()
                    .zip(&self.sources)
                    .find(|(_, s)| **s == Some(column))
                    .map(|(f, _)| f.data_type().clone())
            },
        )
        .await
    }
}

/// Of the `rows` rows starting at file row `first`, those `deleted` leaves,
/// as a filter (None: all of them).
fn kept_rows(deleted: &roaring::RoaringTreemap, first: usize, rows: usize) -> Option<BooleanArray> {
    let (first, end) = (first as u64, (first + rows) as u64);
    if deleted.range_cardinality(first..end) == 0 {
        return None;
    }
    // Every bit set, then the deleted rows' cleared (a `Vec<bool>`
    // packed afterwards took a sixth of TPC-H Q6 with 50,000 lines'
    // rows hidden).
    let mut mask = BooleanBufferBuilder::new(rows);
    mask.append_n(rows, true);
    let mut gone = deleted.iter();
    gone.advance_to(first);
    for row in gone.take_while(|&row| row < end) {
        mask.set_bit((row - first) as usize, false);
    }
    Some(BooleanArray::new(mask.finish(), None))
}

/// Decode `columns` (indices in the file's schema) of row group `group`
/// (of `rows` rows) of the file at `path`, each cast to the type
/// `table_type` gives it (None: as decoded), in pieces of [`PIECE_ROWS`]:
/// the hot-data tier's chunks.
pub(super) async fn decode_row_group(
    reader: Box<dyn AsyncFileReader>,
    reader_metadata: &ArrowReaderMetadata,
    path: &str,
    (group, rows): (usize, usize),
    columns: &[usize],
    table_type: impl Fn(usize) -> Option<arrow::datatypes::DataType>,
) -> Result<Vec<(usize, Chunk)>> {
    let mask = ProjectionMask::roots(reader_metadata.parquet_schema(), columns.to_vec());
    let stream =
        ParquetRecordBatchStreamBuilder::new_with_metadata(reader, reader_metadata.clone())
            .with_projection(mask)
            .with_row_groups(vec![group])
            .with_batch_size(PIECE_ROWS)
            .build()?;
    let batches: Vec<RecordBatch> = stream.try_collect().await?;
    // Pieces of PIECE_ROWS rows, the last one shorter, as the scan
    // hands them on.
    let expected: Vec<usize> = (0..rows.div_ceil(PIECE_ROWS))
        .map(|i| PIECE_ROWS.min(rows - i * PIECE_ROWS))
        .collect();
    let lengths: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    let total: usize = lengths.iter().sum();
    if total != rows {
        return Err(DataFusionError::Internal(format!(
            "row group {group} of {path} decoded {total} rows, its footer says {rows}"
        )));
    }
    // The reader cuts a row group at the batch size; should it ever cut
    // otherwise, re-cut (the pieces then share one array's buffers).
    let batches = if lengths == expected {
        batches
    } else {
        let whole = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
        let mut offset = 0;
        expected
            .iter()
            .map(|&n| {
                let piece = whole.slice(offset, n);
                offset += n;
                piece
            })
            .collect()
    };
    // The stream's columns are `columns` in file order.
    let mut sorted = columns.to_vec();
    sorted.sort_unstable();
    let mut out = Vec::with_capacity(columns.len());
    for (position, &column) in sorted.iter().enumerate() {
        let wanted = table_type(column);
        let pieces = batches
            .iter()
            .map(|b| {
                let array = Arc::clone(b.column(position));
                match &wanted {
                    Some(t) if t != array.data_type() => Ok(cast(&array, t)?),
                    _ => Ok(array),
                }
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        out.push((column, Arc::new(pieces)));
    }
    Ok(out)
}

/// A fingerprint of the rows `keep` drops (never 0, which names a whole
/// chunk): the key of a row group's chunks filtered by it.
fn fingerprint(keep: &BooleanArray) -> u64 {
    use std::hash::{Hash, Hasher};
    let bits = keep.values();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bits.len().hash(&mut hasher);
    let chunks = bits.inner().bit_chunks(bits.offset(), bits.len());
    for word in chunks.iter() {
        word.hash(&mut hasher);
    }
    chunks.remainder_bits().hash(&mut hasher);
    hasher.finish().max(1)
}

/// `chunk`'s pieces without the rows `keep` (over the whole row group)
/// drops; a piece that loses none is shared.
fn filter_chunk(chunk: &Chunk, keep: &BooleanArray) -> Result<Chunk> {
    let mut offset = 0;
    let mut pieces = Vec::with_capacity(chunk.len());
    for piece in chunk.iter() {
        let length = piece.len();
        let mask = keep.slice(offset, length);
        offset += length;
        pieces.push(if mask.true_count() == length {
            Arc::clone(piece)
        } else {
            arrow::compute::filter(piece.as_ref(), &mask)?
        });
    }
    Ok(Arc::new(pieces))
}

/// The dynamic filters of a scan's predicate applied to its rows. A hash
/// join fills its filter with the build side's keys once that side is
/// read, a TopK tightens its bound as it goes; DataFusion's reader uses
/// them to prune row groups, and to drop rows only with `pushdown_filters`,
/// which evaluates every predicate inside the Parquet decoder. A cached
/// scan has its columns decoded already, so it evaluates the dynamic parts
/// on each batch, re-reading each filter's current expression every batch.
///
/// What it costs and saves: a join's filter is a hash lookup of the key,
/// about what a join's probe of the row costs. Dropping a row early saves
/// what lies between the scan and that join: nothing much if only joins'
/// probes and row-wise operators lie there (a `direct` filter, see
/// [`CacheScans`]), but a hash table's build, an aggregation or a sort
/// across one. So:
/// - direct filters are left to their joins;
/// - a join's filter with a `FilterExec` between (`screened`) is evaluated
///   while it pays: a dropped row saves the filter's copy of the row (by
///   the width of its columns, [`Above::copy_nanos`]) and the join's probe
///   that would miss ([`Self::PROBE_MISS_NANOS`]), where that copy is
///   worth it ([`Self::SCREENED_COPY_NANOS`]; otherwise it is `direct`).
///   TPC-H Q7's 8 K French and German suppliers drop 92 % of the lines
///   shipped in 1995-96 before the filter copies their five columns;
///   Q21's Saudi suppliers, behind a filter that copies two keys, are left
///   to their join;
/// - a join's filter across another join's probe (`stacked`) is evaluated
///   while it pays: a dropped row saves that probe, whose cost grows with
///   the size of the hash table it looks rows up in ([`Above::probe_nanos`]:
///   TPC-H Q5: the 20 K Asian suppliers drop four fifths of lineitem before
///   its probe of 2.3 M orders, 30 ns a row; Q7: the French and German
///   customers drop 92 % of orders, at 17 ns a row, before their probe of
///   1.5 M lines, 38 ns a row);
/// - a join's filter across a hash repartition (`shuffled`) is evaluated
///   while it pays: a dropped row saves the repartition's hashing and
///   copying, about [`Self::SHUFFLED_ROW_NANOS`]; once the filter has
///   cost more per row it dropped over [`Self::SAMPLE_ROWS`] rows, it is
///   left to its join (until it changes). TPC-H Q18's join of 624 orders
///   drops all but 4 K of lineitem's 60 M rows at 13 ns a row; Q21's of
///   7 M orders looks its rows up in a table far larger than the caches
///   and drops a fraction, behind a cheaper join that drops most;
/// - while another dynamic filter is active, the static conjuncts join it
///   (the `FilterExec` above evaluates them again, on the rows left), and
///   all are evaluated in the order of their measured cost per dropped row
///   (time per row / share dropped, the classic rank of predicates):
///   a hash lookup before a string comparison that keeps half the rows, a
///   date comparison that drops most before a lookup; unmeasured ones go
///   first, static before dynamic; the static ones keep their written
///   order among themselves, so a guard (`x <> 0`) still runs before what
///   it guards (`10 / x > 1`) and each sees only the rows kept before it;
/// - a partitioned join's filter (a `CASE` over the partitions' hash
///   tables) is evaluated branch by branch ([`Routed`]), each expression
///   prepared once per generation of its filter;
/// - a filter that has kept over [`Self::KEEP_ALL`] of the
///   [`Self::SAMPLE_ROWS`] rows it saw is not evaluated in this file again
///   (a dynamic one until it changes: its generation; a static one with
///   the static ones written after it).
#[derive(Clone, Default)]
struct DynamicRowFilter {
    parts: Vec<FilterPart>,
}

#[derive(Clone)]
struct FilterPart {
    expr: Arc<dyn PhysicalExpr>,
    dynamic: bool,
    /// A join's across a hash repartition: evaluated while it pays.
    shuffled: bool,
    /// A join's across another join's probe: evaluated while it pays, that
    /// is while it costs less per dropped row than the probe (ns a row; 0:
    /// not stacked).
    stacked: f64,
    /// The generation the counts below are of (dynamic filters).
    generation: u64,
    seen: usize,
    kept: usize,
    nanos: u64,
    /// Its expression (a dynamic filter's as it stood at `generation`) as
    /// evaluated ([`Routed`] where it is a partitioned join's).
    prepared: Option<Prepared>,
}

/// How a filter's current expression is evaluated.
#[derive(Clone)]
enum Evaluation {
    /// By DataFusion.
    Expr(Arc<dyn PhysicalExpr>),
    /// A partitioned join's `CASE`, branch by branch.
    Routed(Arc<Routed>),
    /// Not at all: it keeps every row (`true`).
    All,
}

impl FilterPart {
    /// Whether it has kept nearly all of enough rows to stop evaluating it.
    fn keeps_all(&self) -> bool {
        self.seen >= DynamicRowFilter::SAMPLE_ROWS
            && self.kept as f64 > DynamicRowFilter::KEEP_ALL * self.seen as f64
    }

    /// Whether it is a `shuffled` filter that costs more per dropped row
    /// than the repartition it saves, measured over enough rows.
    fn costs_more_than_it_saves(&self) -> bool {
        if !(self.shuffled || self.stacked > 0.0) || self.seen < DynamicRowFilter::SAMPLE_ROWS {
            return false;
        }
        let mut saves = 0.0;
        if self.shuffled {
            saves += DynamicRowFilter::SHUFFLED_ROW_NANOS;
        }
        saves += self.stacked;
        self.rank() > saves
    }

    /// Its cost per dropped row as measured (lower goes first).
    fn rank(&self) -> f64 {
        // Unmeasured ones first, static before dynamic: each is then
        // measured on whole batches (a filter behind a selective one sees
        // a few rows at a time, and its per-row cost looks inflated).
        if self.seen == 0 {
            return if self.dynamic { -1.0 } else { -2.0 };
        }
        let per_row = self.nanos as f64 / self.seen as f64;
        let dropped = 1.0 - self.kept as f64 / self.seen as f64;
        per_row / dropped.max(1e-3)
    }
}

impl DynamicRowFilter {
    const SAMPLE_ROWS: usize = 65_536;
    const KEEP_ALL: f64 = 0.95;
    /// What a hash repartition costs per row (hashing, copying into the
    /// partitions' batches, the channel): a `shuffled` filter's budget per
    /// dropped row. Q18 at SF10: 1.36 s for 60 M rows over two threads.
    const SHUFFLED_ROW_NANOS: f64 = 20.0;
    /// What another join's probe costs per row where the size of its hash
    /// table is not known: a `stacked` filter's budget per dropped row.
    const STACKED_ROW_NANOS: f64 = 15.0;
    /// What copying the columns a filter reads costs per selected row
    /// (and setting its bit back): a filter behind others that dropped
    /// rows is evaluated over every row while that costs less.
    const NARROW_ROW_NANOS: f64 = 2.0;
    /// What a join's probe of a row that finds nothing costs (hashing the
    /// key, one look into the table): TPC-H SF10 Q4's semi join of 574 K
    /// orders, 6.4 ns.
    const PROBE_MISS_NANOS: f64 = 6.0;
    /// The least a `FilterExec`'s copy of a row must cost for a join's
    /// filter below it to be `screened`: evaluating a join's filter in the
    /// scan costs more than its join's probe (copying the selected keys,
    /// setting their bits back), which a narrow row's copy does not repay
    /// (TPC-H SF10 Q21: 80 ms lost where the filter copies two keys, 16
    /// bytes a row; Q4 likewise with one).
    const SCREENED_COPY_NANOS: f64 = 10.0;

    /// The conjuncts of `predicate` (over the table's columns) re-pointed
    /// at the columns of `output`; those that read a column the scan does
    /// not produce are left out (the filter is only a shortcut: the
    /// operators above drop the rows anyway), and so are the `direct`
    /// filters (their expression ids); the `shuffled` ones are marked.
    fn new(predicate: Option<Arc<dyn PhysicalExpr>>, output: &SchemaRef, above: &Above) -> Self {
        let mut filter = Self::default();
        let Some(predicate) = predicate else {
            return filter;
        };
        for part in split_conjunction(&predicate) {
            if is_volatile(part) {
                continue;
            }
            let Ok(expr) = reassign_expr_columns(Arc::clone(part), output) else {
                continue;
            };
            let dynamic = part.downcast_ref::<DynamicFilterPhysicalExpr>().is_some();
            let listed =
                |ids: &[u64]| dynamic && part.expression_id().is_some_and(|id| ids.contains(&id));
            if listed(&above.direct) {
                continue;
            }
            let stacked = if listed(&above.stacked) {
                above.probe_nanos
            } else if listed(&above.screened) {
                above.screened_nanos
            } else {
                0.0
            };
            filter.parts.push(FilterPart {
                expr,
                dynamic,
                shuffled: listed(&above.shuffled),
                stacked,
                generation: 0,
                seen: 0,
                kept: 0,
                nanos: 0,
                prepared: None,
            });
        }
        if !filter.parts.iter().any(|p| p.dynamic) {
            filter.parts.clear();
        }
        filter
    }

    /// `batch` without the rows the filters, as they stand now, rule out.
    /// The filters narrow a selection of the rows: each is evaluated over
    /// the columns it reads, of the rows still selected where evaluating
    /// the rest would cost more than copying those (a hash lookup behind a
    /// date comparison that dropped most), and the batch is copied once,
    /// at the end.
    fn apply(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        if self.parts.is_empty() || batch.num_rows() == 0 {
            return Ok(batch);
        }
        let schema = batch.schema();
        let mut active = Vec::with_capacity(self.parts.len());
        // Once a static conjunct is skipped, so are the static ones after
        // it (it may guard them); the `FilterExec` above evaluates them all.
        let mut statics_stopped = false;
        for (i, part) in self.parts.iter_mut().enumerate() {
            if part.dynamic {
                let generation = snapshot_generation(&part.expr);
                if generation != part.generation {
                    (part.generation, part.seen, part.kept, part.nanos) = (generation, 0, 0, 0);
                    part.prepared = None;
                }
                if part.keeps_all() || part.costs_more_than_it_saves() {
                    continue;
                }
            } else {
                statics_stopped |= part.keeps_all();
                if statics_stopped {
                    continue;
                }
            }
            let prepared = match &part.prepared {
                Some(prepared) => prepared.clone(),
                None => {
                    let prepared = if part.dynamic {
                        // A join fills its filter with the columns of its
                        // own input; where they do not fit the scan's (once
                        // seen in cluster workers' tasks, TPC-H Q10's
                        // c_nationkey at the join's index 8 over customer's
                        // 8 columns, before cirro-cluster's
                        // dynamic_filters.rs), they are found by name, as
                        // DataFusion's Parquet reader finds them. One that
                        // still does not fit is only a shortcut (its join
                        // drops the rows): left out until it changes.
                        let current = snapshot_physical_expr(Arc::clone(&part.expr))?;
                        by_name(current, &schema)
                            .and_then(|current| Prepared::new(current, &schema).ok())
                            .unwrap_or_else(Prepared::keep_all)
                    } else {
                        Prepared::new(Arc::clone(&part.expr), &schema)?
                    };
                    part.prepared = Some(prepared.clone());
                    prepared
                }
            };
            if matches!(prepared.evaluation, Evaluation::All) {
                continue;
            }
            active.push((i, prepared));
        }
        if !active.iter().any(|(i, _)| self.parts[*i].dynamic) {
            return Ok(batch);
        }
        // By rank, but the static conjuncts keep their written order among
        // themselves: a guard (`x <> 0`) stays before what it guards
        // (`10 / x > 1`), and each sees only the rows the earlier ones kept.
        active.sort_by(|(a, _), (b, _)| self.parts[*a].rank().total_cmp(&self.parts[*b].rank()));
        let slots: Vec<usize> = (0..active.len())
            .filter(|&slot| !self.parts[active[slot].0].dynamic)
            .collect();
        let mut statics: Vec<_> = slots.iter().map(|&slot| active[slot].clone()).collect();
        statics.sort_by_key(|(i, _)| *i);
        for (slot, entry) in slots.into_iter().zip(statics) {
            active[slot] = entry;
        }
        let rows = batch.num_rows();
        let mut selection: Option<BooleanBuffer> = None;
        let mut selected = rows;
        // The filters that dropped rows of this batch: the copy at the end
        // is theirs (what one costs is its evaluation and that copy, as
        // when each filter copied what it kept).
        let mut dropping = Vec::with_capacity(active.len());
        for (i, prepared) in &active {
            if selected == 0 {
                break;
            }
            let part = &mut self.parts[*i];
            let started = std::time::Instant::now();
            // Over every row while the rows dropped already cost less to
            // evaluate than copying the selected ones would.
            let whole = selected == rows
                || (part.seen > 0
                    && part.nanos as f64 / part.seen as f64 * ((rows - selected) as f64)
                        <= Self::NARROW_ROW_NANOS * selected as f64);
            let (seen, kept, next) = match selection.as_ref().filter(|_| !whole) {
                Some(current) => {
                    let mask = prepared.evaluate(&batch, Some(current))?;
                    (selected, mask.count_set_bits(), scatter(current, &mask))
                }
                None => {
                    let mask = prepared.evaluate(&batch, None)?;
                    let kept = mask.count_set_bits();
                    let next = match &selection {
                        Some(selection) => selection & &mask,
                        None => mask,
                    };
                    (rows, kept, next)
                }
            };
            part.nanos += started.elapsed().as_nanos() as u64;
            part.seen += seen;
            part.kept += kept;
            let now = next.count_set_bits();
            if now < selected {
                dropping.push(*i);
            }
            selected = now;
            selection = Some(next);
        }
        let Some(selection) = selection.filter(|_| selected < rows) else {
            return Ok(batch);
        };
        let started = std::time::Instant::now();
        let batch = filter_record_batch(&batch, &BooleanArray::new(selection, None))?;
        let share = started.elapsed().as_nanos() as u64 / dropping.len().max(1) as u64;
        for i in dropping {
            self.parts[i].nanos += share;
        }
        Ok(batch)
    }
}

/// A filter's expression as evaluated, over the columns it reads.
#[derive(Clone)]
struct Prepared {
    /// The batch's columns the expression reads, and their schema.
    columns: Arc<[usize]>,
    schema: SchemaRef,
    evaluation: Evaluation,
}

/// `expr` with each column that does not name `schema`'s column at its
/// index re-pointed at the column of its name; None where `schema` has no
/// column of that name.
fn by_name(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Option<Arc<dyn PhysicalExpr>> {
    expr.transform_up(|node| {
        let Some(column) = node.downcast_ref::<Column>() else {
            return Ok(Transformed::no(node));
        };
        let fits = schema
            .fields()
            .get(column.index())
            .is_some_and(|f| f.name() == column.name());
        if fits {
            return Ok(Transformed::no(node));
        }
        let index = schema.index_of(column.name())?;
        Ok(Transformed::yes(
            Arc::new(Column::new(column.name(), index)) as Arc<dyn PhysicalExpr>,
        ))
    })
    .ok()
    .map(|t| t.data)
}

impl Prepared {
    /// A filter that keeps every row.
    fn keep_all() -> Self {
        Self {
            columns: Arc::from(Vec::new()),
            schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            evaluation: Evaluation::All,
        }
    }

    fn new(expr: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Self> {
        let always = expr
            .downcast_ref::<Literal>()
            .is_some_and(|l| l.value() == &ScalarValue::Boolean(Some(true)));
        let mut columns: Vec<usize> = collect_columns(&expr).iter().map(Column::index).collect();
        columns.sort_unstable();
        columns.dedup();
        let narrow = Arc::new(schema.project(&columns)?);
        let evaluation = if always {
            Evaluation::All
        } else {
            let expr = reassign_expr_columns(expr, &narrow)?;
            match Routed::prepare(&expr, &narrow) {
                Some(routed) => Evaluation::Routed(Arc::new(routed)),
                None => Evaluation::Expr(expr),
            }
        };
        Ok(Self {
            columns: columns.into(),
            schema: narrow,
            evaluation,
        })
    }

    /// Which of `batch`'s rows the filter keeps (NULL: not kept): of all of
    /// them, or of those `selection` holds (one bit per selected row).
    fn evaluate(
        &self,
        batch: &RecordBatch,
        selection: Option<&BooleanBuffer>,
    ) -> Result<BooleanBuffer> {
        let columns = self
            .columns
            .iter()
            .map(|&c| Arc::clone(batch.column(c)))
            .collect();
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let mut narrow =
            RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        if let Some(selection) = selection {
            narrow = filter_record_batch(&narrow, &BooleanArray::new(selection.clone(), None))?;
        }
        let rows = narrow.num_rows();
        match &self.evaluation {
            Evaluation::All => Ok(BooleanBuffer::new_set(rows)),
            Evaluation::Routed(routed) => kept(
                ColumnarValue::Array(Arc::new(routed.evaluate(&narrow)?)),
                rows,
            ),
            Evaluation::Expr(filter) => kept(filter.evaluate(&narrow)?, rows),
        }
    }
}

/// The dynamic filters (expression ids) of the joins whose probe sides a
/// plan feeds, by what lies between (see [`DynamicRowFilter`]).
#[derive(Clone, Debug)]
struct Above {
    /// The join right above (row-wise operators between: filters,
    /// projections, round-robin repartitions): evaluating its filter in the
    /// scan costs about what the probe it saves costs.
    direct: Vec<u64>,
    /// Those across a hash repartition, evaluated while they pay.
    shuffled: Vec<u64>,
    /// Those across another join's probe, evaluated while they pay.
    stacked: Vec<u64>,
    /// What the probe of the join right above costs per row, the budget of
    /// a stacked filter per row it drops.
    probe_nanos: f64,
    /// Those of the joins right above with a `FilterExec` between,
    /// evaluated while they pay.
    screened: Vec<u64>,
    /// What a screened filter saves per row it drops: the filter's copy of
    /// the row and the join's probe that misses.
    screened_nanos: f64,
}

impl Default for Above {
    fn default() -> Self {
        Self {
            direct: Vec::new(),
            shuffled: Vec::new(),
            stacked: Vec::new(),
            probe_nanos: DynamicRowFilter::STACKED_ROW_NANOS,
            screened: Vec::new(),
            screened_nanos: 0.0,
        }
    }
}

impl Above {
    /// What a `FilterExec` with output `schema` spends copying a row it
    /// keeps: 0.3 ns a byte (16 a variable-width value's view), as
    /// measured at TPC-H SF10 (Q7's five columns, 52 bytes, about 15 ns).
    fn copy_nanos(schema: &SchemaRef) -> f64 {
        let bytes: usize = schema
            .fields()
            .iter()
            .map(|f| f.data_type().primitive_width().unwrap_or(16))
            .sum();
        0.3 * bytes as f64
    }

    /// What a probe into a hash table of `rows` build rows costs per row:
    /// about 10 ns at 64 K rows, 8 ns more each time the table doubles
    /// beyond, at most 40 ns; 2.5 ns less each time it halves below, at
    /// least 5 ns (16 K rows and fewer: a probe that misses a table in the
    /// first-level caches costs its hash and one look). Measured at SF10:
    /// TPC-H Q7's probe of 1.5 M lines 38 ns, Q5's of 2.3 M orders 30 ns,
    /// Q7's of 120 K customers about 15 ns; SSB Q3.2's of 12 K customers
    /// costs less than evaluating the suppliers' filter in the scan (about
    /// 10 ns a row). Unknown: 15 ns.
    fn probe_nanos(rows: Option<usize>) -> f64 {
        let Some(rows) = rows else {
            return DynamicRowFilter::STACKED_ROW_NANOS;
        };
        let doublings = (rows.max(1) as f64 / 65_536.0).log2();
        if doublings >= 0.0 {
            (10.0 + 8.0 * doublings).min(40.0)
        } else {
            (10.0 + 2.5 * doublings).max(5.0)
        }
    }
}

/// The physical optimizer rule that reads Parquet scans through the
/// hot-data tier, with a priority from the plan: a scan whose decoded
/// columns would fill a large part of the budget `Scan`, wherever it is;
/// the build side of a join otherwise `Hot`; others `Normal`. (A large
/// build side, such as TPC-H Q18's aggregation of lineitem, made `Hot`
/// froze the cache: nothing else may evict hot data.) Off with
/// `SET cache = off`.
#[derive(Debug)]
pub struct CacheScans {
    cache: Arc<ColumnCache>,
    others: Vec<Arc<dyn OperatorRoles>>,
}

/// What the tier's rule needs to know of operators other crates define
/// (the GPU's twins of DataFusion's): the crate that defines them answers
/// by their types, and the node hands the answers to [`CacheScans`].
pub trait OperatorRoles: std::fmt::Debug + Send + Sync {
    /// A join whose left input is its build side (and that fills no
    /// dynamic filter).
    fn is_join(&self, plan: &dyn ExecutionPlan) -> bool;
    /// An operator that works row by row, as a projection does.
    fn is_row_wise(&self, plan: &dyn ExecutionPlan) -> bool;
}

impl CacheScans {
    pub fn new(cache: Arc<ColumnCache>) -> Self {
        Self {
            cache,
            others: Vec::new(),
        }
    }

    /// Also know the operators `roles` describes.
    pub fn with_roles(mut self, roles: Arc<dyn OperatorRoles>) -> Self {
        self.others.push(roles);
        self
    }

    /// `build_side`: whether `plan` feeds the build side of a join.
    /// `direct`: the dynamic filters (expression ids) of the joins whose
    /// probe sides `plan` feeds with nothing but row-wise operators
    /// (filters, projections, round-robin repartitions) and other joins'
    /// probes between: evaluating such a filter in the scan costs about
    /// what the probes it saves cost, while the filters of joins across a
    /// hash table's build side, an aggregation or a sort save that work
    /// ([`DynamicRowFilter`]). `shuffled`: those with a hash repartition
    /// between too, which the scan evaluates while it pays.
    ///
    /// The GPU twins (`cirro-gpu`, placed before this rule) are known by
    /// their [`OperatorRoles`]: a GPU hash join is a join (its build side
    /// `Hot`) that fills no dynamic filter, a GPU projection works row by
    /// row as a `ProjectionExec` does; under a GPU filter the scan drops no rows,
    /// so the filter gets the batches the cache holds, the same buffers
    /// every query, which its device-side column cache is keyed by.
    fn rewrite(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        build_side: bool,
        above: &Above,
        statistics: &StatisticsContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(scan) = plan.downcast_ref::<DataSourceExec>()
            && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
            && let Some(parquet) = config.file_source().downcast_ref::<ParquetSource>()
        {
            let priority = if self.is_large(config) {
                Priority::Scan
            } else if build_side {
                Priority::Hot
            } else {
                Priority::Normal
            };
            let source =
                CachedParquetSource::new(parquet.clone(), Arc::clone(&self.cache), priority)
                    .with_filters_above(above);
            let config = FileScanConfigBuilder::from(config.clone())
                .with_source(Arc::new(source))
                .build();
            return Ok(DataSourceExec::from_data_source(config));
        }
        let children = plan.children();
        if children.is_empty() {
            return Ok(plan);
        }
        // The build side of a join: its left input.
        let hash_join = plan.downcast_ref::<HashJoinExec>().is_some();
        let joins = hash_join
            || self.others.iter().any(|o| o.is_join(plan.as_ref()))
            || plan.downcast_ref::<NestedLoopJoinExec>().is_some()
            || plan.downcast_ref::<CrossJoinExec>().is_some();
        let hash_shuffle = plan
            .downcast_ref::<RepartitionExec>()
            .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..)));
        let filters = plan.downcast_ref::<FilterExec>().is_some();
        let copy = if filters {
            Above::copy_nanos(&plan.schema())
        } else {
            0.0
        };
        let row_wise = filters
            || plan.downcast_ref::<ProjectionExec>().is_some()
            || self.others.iter().any(|o| o.is_row_wise(plan.as_ref()))
            || (plan.downcast_ref::<RepartitionExec>().is_some() && !hash_shuffle)
            || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
            || plan.downcast_ref::<CooperativeExec>().is_some()
            // A row store's rows after the files' (they pass the joins'
            // filters up to the joins, as the scan's do).
            || plan.downcast_ref::<crate::rowstore::StoreRows>().is_some();
        let probe_filter: Vec<u64> = if hash_join {
            plan.dynamic_expressions_produced()
                .iter()
                .filter_map(|filter| filter.expression_id())
                .collect()
        } else {
            Vec::new()
        };
        // The rows of the join's build side, as estimated.
        let build_rows = if hash_join {
            statistics
                .compute(children[0].as_ref(), &StatisticsArgs::new())
                .ok()
                .and_then(|s| s.num_rows.get_value().copied())
        } else {
            None
        };
        let new_children = children
            .into_iter()
            .enumerate()
            .map(|(i, child)| {
                let below = match (joins, i) {
                    // This join's filter is direct below it; those of the
                    // joins above are stacked on its probe.
                    (true, 1) if hash_join => Above {
                        direct: probe_filter.clone(),
                        shuffled: above.shuffled.clone(),
                        stacked: [&above.direct, &above.stacked, &above.screened]
                            .into_iter()
                            .flatten()
                            .copied()
                            .collect(),
                        probe_nanos: Above::probe_nanos(build_rows),
                        ..Above::default()
                    },
                    // A filter between that copies wide rows: a join's
                    // filter that drops a row in the scan saves that copy.
                    (false, _) if filters && copy >= DynamicRowFilter::SCREENED_COPY_NANOS => {
                        Above {
                            direct: Vec::new(),
                            shuffled: above.shuffled.clone(),
                            stacked: above.stacked.clone(),
                            probe_nanos: above.probe_nanos + copy,
                            screened: above
                                .direct
                                .iter()
                                .chain(&above.screened)
                                .copied()
                                .collect(),
                            screened_nanos: DynamicRowFilter::PROBE_MISS_NANOS + copy,
                        }
                    }
                    (false, _) if row_wise => above.clone(),
                    (false, _) if hash_shuffle => Above {
                        shuffled: [
                            &above.direct,
                            &above.shuffled,
                            &above.stacked,
                            &above.screened,
                        ]
                        .into_iter()
                        .flatten()
                        .copied()
                        .collect(),
                        stacked: above.stacked.clone(),
                        probe_nanos: above.probe_nanos,
                        ..Above::default()
                    },
                    _ => Above::default(),
                };
                let build_side = build_side || (joins && i == 0);
                self.rewrite(Arc::clone(child), build_side, &below, statistics)
            })
            .collect::<Result<Vec<_>>>()?;
        datafusion::physical_plan::execution_plan::replace_children_if_necessary(plan, new_children)
    }

    /// Whether the scan's columns, decoded, would take more than a quarter
    /// of the budget (decoded data estimated at 3× the compressed bytes of
    /// the columns read).
    fn is_large(&self, config: &FileScanConfig) -> bool {
        let bytes: u64 = config
            .file_groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|f| f.object_meta.size)
            .sum();
        let columns = config
            .file_source()
            .table_schema()
            .file_schema()
            .fields()
            .len()
            .max(1) as u64;
        let read = config
            .file_source()
            .projection()
            .map_or(columns, |p| p.iter().count() as u64);
        let decoded = bytes.saturating_mul(3).saturating_mul(read.min(columns)) / columns;
        decoded > self.cache.budget() / 4
    }
}

impl PhysicalOptimizerRule for CacheScans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = config
            .extensions
            .get::<CacheOptions>()
            .is_none_or(|o| o.enabled);
        if !enabled || self.cache.budget() == 0 {
            return Ok(plan);
        }
        self.rewrite(plan, false, &Above::default(), &StatisticsContext::new())
    }

    fn name(&self) -> &str {
        "cirro_cache_scans"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

datafusion::common::extensions_options! {
    /// The session's switch for the hot-data tier (`SET cache = on|off`).
    pub struct CacheOptions {
        /// Read Parquet scans through the hot-data tier.
        pub enabled: bool, default = true
    }
}

impl datafusion::common::config::ConfigExtension for CacheOptions {
    const PREFIX: &'static str = "cirro_cache";
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_expr::expressions::lit;

    fn part(shuffled: bool, seen: usize, kept: usize, nanos: u64) -> FilterPart {
        FilterPart {
            expr: lit(true),
            dynamic: true,
            shuffled,
            stacked: 0.0,
            generation: 0,
            seen,
            kept,
            nanos,
            prepared: None,
        }
    }

    #[test]
    fn a_shuffled_filter_stops_once_it_costs_more_than_the_repartition() {
        let rows = DynamicRowFilter::SAMPLE_ROWS;
        let ns = |per_row: f64| (per_row * rows as f64) as u64;
        // Q18's: 13 ns a row, drops nearly every row: it pays.
        assert!(!part(true, rows, rows / 10_000, ns(13.0)).costs_more_than_it_saves());
        // Q21's: 40 ns a row for a third of the rows dropped: it does not.
        assert!(part(true, rows, rows * 2 / 3, ns(40.0)).costs_more_than_it_saves());
        // Cheap but it drops one row in a hundred: 1 ns / 0.01 > 20 ns.
        assert!(part(true, rows, rows - rows / 100, ns(1.0)).costs_more_than_it_saves());
        // Not measured enough yet, or not across a repartition: it runs.
        assert!(!part(true, rows - 1, 0, ns(1000.0)).costs_more_than_it_saves());
        assert!(!part(false, rows, rows * 2 / 3, ns(40.0)).costs_more_than_it_saves());
    }

    #[test]
    fn a_stacked_filter_stops_once_it_costs_more_than_the_probe_below() {
        let rows = DynamicRowFilter::SAMPLE_ROWS;
        let ns = |per_row: f64| (per_row * rows as f64) as u64;
        let stacked = |kept: usize, per_row: f64| FilterPart {
            stacked: 15.0,
            ..part(false, rows, kept, ns(per_row))
        };
        // Q5's: 6 ns a row dropping four fifths: 7.5 ns a dropped row.
        assert!(!stacked(rows / 5, 6.0).costs_more_than_it_saves());
        // Q7's customers over orders: 20 ns a row dropping 2 %.
        assert!(stacked(rows * 98 / 100, 20.0).costs_more_than_it_saves());
        // Across a repartition too, both savings count: 30 ns dropping
        // 90 % (33 ns a dropped row) pays for neither alone.
        let both = FilterPart {
            shuffled: true,
            ..stacked(rows / 10, 30.0)
        };
        assert!(!both.costs_more_than_it_saves());
        assert!(stacked(rows / 10, 30.0).costs_more_than_it_saves());
        // Q7's customers over orders: 17 ns a row dropping 92 %: more than
        // a probe into a table the caches hold, less than one into the
        // 1.5 M lines' table below.
        let q7 = |probe_rows: usize| FilterPart {
            stacked: Above::probe_nanos(Some(probe_rows)),
            ..stacked(rows * 8 / 100, 17.0)
        };
        assert!(q7(50_000).costs_more_than_it_saves());
        assert!(!q7(1_500_000).costs_more_than_it_saves());
    }

    #[test]
    fn scatter_keeps_the_selected_rows_the_mask_keeps() {
        // Lengths around word edges, selections dense and sparse.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        for len in [0, 1, 63, 64, 65, 130, 1_000] {
            for density in [0, 1, 50, 99, 100] {
                let selection = BooleanBuffer::from_iter((0..len).map(|_| next() % 100 < density));
                let selected = selection.count_set_bits();
                let mask = BooleanBuffer::from_iter((0..selected).map(|_| next() % 2 == 0));
                // A selection that starts inside a byte.
                let shifted =
                    BooleanBuffer::from_iter(std::iter::once(true).chain(selection.iter()))
                        .slice(1, len);
                let mut taken = mask.iter();
                let expected: Vec<bool> = selection
                    .iter()
                    .map(|s| s && taken.next().unwrap_or(false))
                    .collect();
                for selection in [&selection, &shifted] {
                    let got: Vec<bool> = scatter(selection, &mask).iter().collect();
                    assert_eq!(got, expected, "len {len}, density {density}");
                }
            }
        }
    }

    #[test]
    fn the_filters_keep_the_rows_their_conjunction_keeps() {
        use arrow::array::Int64Array;
        use arrow::datatypes::{DataType, Field, Schema};
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{binary, col};

        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, false),
        ]));
        let rows = 10_000i64;
        let a = Int64Array::from_iter((0..rows).map(|i| (i % 7 != 3).then_some(i % 100)));
        let b = Int64Array::from_iter_values((0..rows).map(|i| (i * 37) % 1_000));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(a) as ArrayRef, Arc::new(b)],
        )
        .unwrap();
        let cmp = |column: &str, op, value: i64| {
            binary(col(column, &schema).unwrap(), op, lit(value), &schema).unwrap()
        };
        // A static conjunct that keeps half, one that keeps most, and a
        // join's filter (b < 100, over the columns it reads only).
        let statics = binary(
            cmp("a", Operator::Lt, 50),
            Operator::And,
            cmp("b", Operator::Gt, 5),
            &schema,
        )
        .unwrap();
        let join = Arc::new(DynamicFilterPhysicalExpr::new(
            vec![col("b", &schema).unwrap()],
            cmp("b", Operator::Lt, 100),
        )) as Arc<dyn PhysicalExpr>;
        let predicate = binary(statics, Operator::And, Arc::clone(&join), &schema).unwrap();
        let expected = {
            let mask = predicate
                .evaluate(&batch)
                .unwrap()
                .into_array(batch.num_rows())
                .unwrap();
            filter_record_batch(
                &batch,
                mask.as_any().downcast_ref::<BooleanArray>().unwrap(),
            )
            .unwrap()
        };
        let mut filter = DynamicRowFilter::new(Some(predicate), &schema, &Above::default());
        assert_eq!(filter.parts.len(), 3);
        // Batch after batch: the costs measured change the order and
        // whether a filter reads every row or only the selected ones.
        for _ in 0..20 {
            let kept = filter.apply(batch.clone()).unwrap();
            assert_eq!(kept, expected);
        }
        assert!(filter.parts.iter().all(|p| p.seen > 0), "every filter ran");
    }

    /// A row group's filter holds exactly the rows of its range the
    /// deletion vector leaves, whatever lies before and after the range.
    #[test]
    fn a_row_groups_filter_drops_its_deleted_rows_only() {
        let deleted: roaring::RoaringTreemap =
            [3u64, 99, 100, 101, 250, 1 << 33].into_iter().collect();
        assert!(
            kept_rows(&deleted, 4, 95).is_none(),
            "nothing deleted in 4..99"
        );
        let mask = kept_rows(&deleted, 50, 201).unwrap();
        let expected: Vec<bool> = (50u64..251).map(|row| !deleted.contains(row)).collect();
        assert_eq!(
            mask.iter().map(|b| b.unwrap()).collect::<Vec<_>>(),
            expected
        );
        assert_eq!(mask.false_count(), 4);
    }

    /// A row group's chunks filtered by a deletion vector are keyed by a
    /// fingerprint of the rows it deletes: the same rows, the same key;
    /// one more deleted row, another; never 0 (the whole chunk's). The
    /// filtered chunk shares the pieces that lose no row.
    #[test]
    fn filtered_chunks_are_keyed_by_the_rows_deleted() {
        use arrow::array::Int64Array;

        let rows = 3 * PIECE_ROWS + 5;
        let mask = |deleted: &[usize]| {
            BooleanArray::from((0..rows).map(|i| !deleted.contains(&i)).collect::<Vec<_>>())
        };
        let one = fingerprint(&mask(&[7]));
        assert_eq!(one, fingerprint(&mask(&[7])));
        assert_ne!(one, fingerprint(&mask(&[8])));
        assert_ne!(one, fingerprint(&mask(&[7, 3 * PIECE_ROWS + 4])));
        assert!([one, fingerprint(&mask(&[]))].iter().all(|&f| f != 0));

        let chunk: Chunk = Arc::new(
            (0..rows)
                .step_by(PIECE_ROWS)
                .map(|at| {
                    Arc::new(Int64Array::from_iter_values(
                        (at..rows.min(at + PIECE_ROWS)).map(|i| i as i64),
                    )) as ArrayRef
                })
                .collect(),
        );
        let deleted = [7, PIECE_ROWS + 1, PIECE_ROWS + 2, 3 * PIECE_ROWS + 4];
        let filtered = filter_chunk(&chunk, &mask(&deleted)).unwrap();
        assert_eq!(filtered.len(), chunk.len());
        assert!(
            Arc::ptr_eq(&filtered[2], &chunk[2]),
            "an untouched piece is shared"
        );
        let values: Vec<i64> = filtered
            .iter()
            .flat_map(|p| {
                p.as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        let wanted: Vec<i64> = (0..rows)
            .filter(|i| !deleted.contains(i))
            .map(|i| i as i64)
            .collect();
        assert_eq!(values, wanted);
    }

    #[test]
    fn a_join_filter_at_its_joins_index_is_read_by_name_or_left_out() {
        use arrow::array::Int64Array;
        use arrow::datatypes::{DataType, Field, Schema};
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::col;

        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef,
                Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i % 10))),
            ],
        )
        .unwrap();
        // The rows a scan's row filter keeps once its join's filter says
        // `column@8 < 3` (the join's index, not the scan's).
        let kept = |column: &str| {
            let join = Arc::new(DynamicFilterPhysicalExpr::new(
                vec![col("b", &schema).unwrap()],
                lit(true),
            ));
            let mut filter = DynamicRowFilter::new(
                Some(Arc::clone(&join) as Arc<dyn PhysicalExpr>),
                &schema,
                &Above::default(),
            );
            join.update(Arc::new(
                datafusion::physical_expr::expressions::BinaryExpr::new(
                    Arc::new(Column::new(column, 8)),
                    Operator::Lt,
                    lit(3i64),
                ),
            ))
            .unwrap();
            filter.apply(batch.clone()).unwrap().num_rows()
        };
        assert_eq!(kept("b"), 300, "b < 3 read by name");
        // A column the scan does not have: the filter keeps every row.
        assert_eq!(kept("c_nationkey"), 1000);
    }

    #[test]
    fn a_probe_costs_more_the_larger_its_table() {
        let costs: Vec<f64> = [1, 65_536, 262_144, 1_500_000, 100_000_000]
            .into_iter()
            .map(|rows| Above::probe_nanos(Some(rows)))
            .collect();
        assert_eq!(costs[0], 5.0);
        assert_eq!(costs[1], 10.0);
        assert_eq!(Above::probe_nanos(Some(16_384)), 5.0);
        assert_eq!(Above::probe_nanos(Some(32_768)), 7.5);
        assert_eq!(costs[2], 26.0);
        assert!(costs[3] > 35.0 && costs[3] <= 40.0, "{costs:?}");
        assert_eq!(costs[4], 40.0);
        assert_eq!(
            Above::probe_nanos(None),
            DynamicRowFilter::STACKED_ROW_NANOS
        );
    }
}
