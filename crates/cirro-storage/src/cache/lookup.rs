//! Point reads of a table's files by key: the row whose key columns equal
//! given values, found without a scan.
//!
//! A table's files are written sorted by its primary key (see the engine's
//! `indexes.rs`), so the key's row groups have narrow min/max ranges: the
//! footer's statistics leave the one row group that can hold the key (more
//! where files overlap, as after several flushes of a row store). The key
//! columns of that row group, then the rest of its columns once a row
//! matches, come from the hot-data tier, or are decoded and kept there as
//! a scan keeps them; the deletion vector of the file drops a deleted row.
//! A lookup that finds the key's chunks cached touches no file: a hash
//! probe per chunk and a comparison of the key column.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
};
use arrow::compute::kernels::cmp::eq;
use arrow::datatypes::{Schema, SchemaRef};
use cirro_common::{CirroError, Result};
use datafusion::common::ScalarValue;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::datasource::physical_plan::ParquetFileReaderFactory;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, apply_file_schema_type_coercions,
};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_datasource::PartitionedFile;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;

use super::scan::decode_row_group;
use super::{ChunkKey, ColumnCache, PIECE_ROWS, Priority};
use crate::CirroTable;
use crate::rowstore::RowAt;

/// Footers as lookups read them (with the table schema they were read
/// for), by file: a data file never changes.
#[allow(clippy::type_complexity)]
static FOOTERS: LazyLock<Mutex<HashMap<(Arc<str>, u64), (SchemaRef, Arc<Footer>)>>> =
    LazyLock::new(Default::default);
const FOOTER_ENTRIES: usize = 4096;

/// The seed of the key indexes' hashes (any fixed one: they live in this
/// process only).
const INDEX_SEED: u64 = 0x6369_7272_6f6b_6579;

/// The live row of `table`'s files whose columns `key` (index in the
/// table's schema, value of that column's type) hold those values, as a
/// one-row batch of the table's columns (NOT NULL relaxed: a file written
/// before a column was added reads it as NULL); None if no file holds it.
/// `cache`: the hot-data tier (None: decode every time).
pub async fn find_row(
    table: &CirroTable,
    runtime: &RuntimeEnv,
    cache: Option<&ColumnCache>,
    key: &[(usize, ScalarValue)],
) -> Result<Option<Found>> {
    let schema = table.table_schema();
    // The key's hash as the key indexes hold it, found once for every file.
    let hash = key_hash(key, schema)?;
    let epoch = cache.map(|c| c.epoch()).unwrap_or(0);
    for (index, file) in table.files().iter().enumerate() {
        let (store, path) = file.location()?;
        let kept = file
            .lookup
            .get()
            .filter(|kept| same_schema(&kept.schema, schema));
        let lookup = FileLookup {
            runtime,
            store,
            path: kept.map_or_else(
                || Arc::from(path.as_ref()),
                |kept| Arc::clone(&kept.footer.path),
            ),
            size: file.size,
            cache,
            schema,
            epoch,
        };
        let footer = match kept {
            Some(kept) => Arc::clone(&kept.footer),
            None => {
                let footer = lookup.footer().await?;
                let _ = file.lookup.set(KeptFooter {
                    schema: Arc::clone(schema),
                    footer: Arc::clone(&footer),
                });
                footer
            }
        };
        for (group, row, first_row) in lookup.find(&footer, key, hash).await? {
            if table
                .deleted(index)
                .await?
                .is_some_and(|d| d.rows.contains((first_row + row) as u64))
            {
                continue;
            }
            let columns = lookup.row_of(&footer, group, row).await?;
            // The index finds rows by the key's hash: the row's own key decides.
            let same = key.iter().all(|(c, value)| {
                ScalarValue::try_from_array(&columns[*c], 0).is_ok_and(|found| {
                    found.cast_to(&value.data_type()).ok().as_ref() == Some(value)
                })
            });
            if !same {
                continue;
            }
            let relaxed: SchemaRef = Arc::new(Schema::new(
                schema
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone().with_nullable(true))
                    .collect::<Vec<_>>(),
            ));
            let options = RecordBatchOptions::new().with_row_count(Some(1));
            return Ok(Some(Found {
                row: RecordBatch::try_new_with_options(relaxed, columns, &options)?,
                at: RowAt {
                    file: Arc::from(file.url.as_str()),
                    row: (first_row + row) as u64,
                },
            }));
        }
    }
    Ok(None)
}

/// A row [`find_row`] found, and where.
#[derive(Debug)]
pub struct Found {
    pub row: RecordBatch,
    pub at: RowAt,
}

/// The hash of `key` (table columns and their values) in the key indexes.
fn key_hash(key: &[(usize, ScalarValue)], schema: &SchemaRef) -> Result<u64> {
    let arrays = key
        .iter()
        .map(|(c, value)| value.cast_to(schema.field(*c).data_type())?.to_array())
        .collect::<datafusion::common::Result<Vec<ArrayRef>>>()?;
    let mut hash = [0u64; 1];
    create_hashes(
        arrays.iter().map(|a| a.as_ref()),
        &RandomState::with_seed(INDEX_SEED),
        &mut hash,
    )?;
    Ok(hash[0])
}

fn same_schema(a: &SchemaRef, b: &SchemaRef) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// A data file's footer as lookups read it, kept with the file (see
/// [`crate::table::DataFile`]) for the table schema it was read for.
#[derive(Clone)]
pub(crate) struct KeptFooter {
    schema: SchemaRef,
    footer: Arc<Footer>,
}

impl std::fmt::Debug for KeptFooter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptFooter")
    }
}

fn parquet_error(e: ParquetError) -> CirroError {
    CirroError::from(datafusion::error::DataFusionError::from(e))
}

/// One data file, read for a lookup.
struct FileLookup<'a> {
    runtime: &'a RuntimeEnv,
    /// The file's object store (asked of `runtime` only to read the file).
    store: &'a ObjectStoreUrl,
    path: Arc<str>,
    size: u64,
    cache: Option<&'a ColumnCache>,
    /// The table's columns (as scans produce them).
    schema: &'a SchemaRef,
    /// The hot-data tier's epoch of this lookup.
    epoch: u64,
}

/// What a lookup needs of a file's footer.
struct Footer {
    /// The file's path in its object store.
    path: Arc<str>,
    reader_metadata: ArrowReaderMetadata,
    /// For each table column, its index in the file (None: the file
    /// predates it).
    sources: Vec<Option<usize>>,
    /// For each table column, each row group's minimum and maximum (None:
    /// the file has no statistics of it), found at the first lookup by it.
    bounds: Vec<std::sync::OnceLock<Option<Vec<Bounds>>>>,
}

impl FileLookup<'_> {
    /// A reader of the file, as DataFusion's scan makes one.
    fn reader(&self) -> Result<Box<dyn AsyncFileReader>> {
        let file = PartitionedFile::new(self.path.to_string(), self.size);
        Ok(
            DefaultParquetFileReaderFactory::new(self.runtime.object_store(self.store)?)
                .create_reader(0, file, None, &ExecutionPlanMetricsSet::new())?,
        )
    }

    /// The file's footer as the table reads it, kept between lookups.
    async fn footer(&self) -> Result<Arc<Footer>> {
        let id = (Arc::clone(&self.path), self.size);
        if let Some((schema, footer)) = FOOTERS.lock().ok().and_then(|f| f.get(&id).cloned())
            && same_schema(&schema, self.schema)
        {
            return Ok(footer);
        }
        let footer = Arc::new(self.read_footer().await?);
        if let Ok(mut kept) = FOOTERS.lock() {
            if kept.len() >= FOOTER_ENTRIES {
                kept.clear();
            }
            kept.insert(id, (Arc::clone(self.schema), Arc::clone(&footer)));
        }
        Ok(footer)
    }

    async fn read_footer(&self) -> Result<Footer> {
        let cached = self.cache.and_then(|c| c.footer(&self.path, self.size));
        let footer: Arc<ParquetMetaData> = match cached {
            Some(footer) => footer,
            None => {
                let mut reader = self.reader()?;
                let loaded =
                    ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
                        .await
                        .map_err(parquet_error)?
                        .metadata()
                        .clone();
                if let Some(cache) = self.cache {
                    cache.keep_footer(Arc::clone(&self.path), self.size, Arc::clone(&loaded));
                }
                loaded
            }
        };
        // The file's columns as the table reads them (Utf8View strings, …),
        // as the cached scan reads them.
        let natural = ArrowReaderMetadata::try_new(Arc::clone(&footer), ArrowReaderOptions::new())
            .map_err(parquet_error)?;
        let mut physical = Arc::clone(natural.schema());
        if let Some(coerced) = apply_file_schema_type_coercions(self.schema, &physical) {
            physical = Arc::new(coerced);
        }
        let reader_metadata = ArrowReaderMetadata::try_new(
            footer,
            ArrowReaderOptions::new().with_schema(Arc::clone(&physical)),
        )
        .map_err(parquet_error)?;
        let sources = self
            .schema
            .fields()
            .iter()
            .map(|f| physical.index_of(f.name()).ok())
            .collect();
        let bounds = self
            .schema
            .fields()
            .iter()
            .map(|_| Default::default())
            .collect();
        Ok(Footer {
            path: Arc::clone(&self.path),
            reader_metadata,
            sources,
            bounds,
        })
    }

    /// The rows holding `key`: (row group, row in it, the group's first
    /// row in the file), deleted or not.
    async fn find(
        &self,
        footer: &Footer,
        key: &[(usize, ScalarValue)],
        hash: u64,
    ) -> Result<Vec<(usize, usize, usize)>> {
        let metadata = footer.reader_metadata.metadata();
        let groups = metadata.row_groups();
        let mut candidates: Vec<bool> = vec![true; groups.len()];
        for (column, value) in key {
            if footer.sources[*column].is_none() {
                // The file predates a key column: no row of it has the key.
                return Ok(Vec::new());
            }
            let bounds = footer.bounds[*column].get_or_init(|| {
                let name = self.schema.field(*column).name();
                let converter = StatisticsConverter::try_new(
                    name,
                    footer.reader_metadata.schema(),
                    footer.reader_metadata.parquet_schema(),
                )
                .ok()?;
                let mins = converter.row_group_mins(groups.iter()).ok()?;
                let maxes = converter.row_group_maxes(groups.iter()).ok()?;
                Some(
                    (0..groups.len())
                        .map(|group| Bounds::of(&mins, &maxes, group))
                        .collect(),
                )
            });
            // Without statistics every row group may hold the key.
            let Some(bounds) = bounds else {
                continue;
            };
            for (candidate, bounds) in candidates.iter_mut().zip(bounds) {
                if *candidate {
                    *candidate = bounds.may_hold(value);
                }
            }
        }
        let columns: Vec<usize> = key.iter().map(|(c, _)| *c).collect();
        let index_column = index_column(&columns, &footer.sources);
        let mut found = Vec::new();
        let mut first_row = 0usize;
        for (group, meta) in groups.iter().enumerate() {
            let rows = meta.num_rows().max(0) as usize;
            if candidates[group] {
                let rows_found = match index_column {
                    Some(index_column) => {
                        let index = self
                            .key_index(footer, group, rows, &columns, index_column)
                            .await?;
                        probe(&index, hash)?
                    }
                    None => {
                        let chunks = self.chunks(footer, group, rows, &columns).await?;
                        matching_rows(&chunks, key)?
                    }
                };
                found.extend(rows_found.into_iter().map(|row| (group, row, first_row)));
            }
            first_row += rows;
        }
        Ok(found)
    }

    /// Row group `group`'s index of the key columns `columns`: the hashes
    /// of their values, sorted, the rows they are in, and the hashes'
    /// [`directory`] (three arrays), kept
    /// in the hot-data tier as chunk `index_column` (evicted and forgotten
    /// with the file's columns).
    async fn key_index(
        &self,
        footer: &Footer,
        group: usize,
        rows: usize,
        columns: &[usize],
        index_column: u32,
    ) -> Result<Arc<Vec<ArrayRef>>> {
        let chunk_key = ChunkKey {
            file: Arc::clone(&self.path),
            size: self.size,
            row_group: group as u32,
            column: index_column,
            live: 0,
        };
        let epoch = self.epoch;
        if let Some(index) = self
            .cache
            .and_then(|c| c.get(&chunk_key, Priority::Normal, epoch))
        {
            return Ok(index);
        }
        let chunks = self.chunks(footer, group, rows, columns).await?;
        let state = RandomState::with_seed(INDEX_SEED);
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(rows);
        for piece in 0..chunks.first().map(|c| c.len()).unwrap_or(0) {
            let arrays: Vec<&ArrayRef> = chunks.iter().map(|c| &c[piece]).collect();
            let mut hashes = vec![0u64; arrays[0].len()];
            create_hashes(arrays.iter().map(|a| a.as_ref()), &state, &mut hashes)?;
            let base = (piece * PIECE_ROWS) as u32;
            pairs.extend(
                hashes
                    .into_iter()
                    .enumerate()
                    .map(|(i, h)| (h, base + i as u32)),
            );
        }
        pairs.sort_unstable();
        let hashes: UInt64Array = pairs.iter().map(|(h, _)| *h).collect();
        let positions: UInt32Array = pairs.iter().map(|(_, r)| *r).collect();
        let directory = directory(hashes.values());
        let index: Arc<Vec<ArrayRef>> = Arc::new(vec![
            Arc::new(hashes),
            Arc::new(positions),
            Arc::new(directory),
        ]);
        if let Some(cache) = self.cache {
            cache.insert(chunk_key, Arc::clone(&index), Priority::Normal, epoch);
        }
        Ok(index)
    }

    /// Every table column's value at `row` of row group `group`.
    async fn row_of(&self, footer: &Footer, group: usize, row: usize) -> Result<Vec<ArrayRef>> {
        let rows = footer
            .reader_metadata
            .metadata()
            .row_group(group)
            .num_rows() as usize;
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let chunks = self.chunks(footer, group, rows, &all).await?;
        Ok(chunks
            .iter()
            .map(|pieces| pieces[row / PIECE_ROWS].slice(row % PIECE_ROWS, 1))
            .collect())
    }

    /// Table columns `columns` of row group `group` (of `rows` rows) in
    /// pieces of [`PIECE_ROWS`], from the hot-data tier or decoded (and
    /// kept there); a column the file lacks is NULL.
    async fn chunks(
        &self,
        footer: &Footer,
        group: usize,
        rows: usize,
        columns: &[usize],
    ) -> Result<Vec<Arc<Vec<ArrayRef>>>> {
        let key = |source: usize| ChunkKey {
            file: Arc::clone(&self.path),
            size: self.size,
            row_group: group as u32,
            column: source as u32,
            live: 0,
        };
        let epoch = self.epoch;
        let mut found: HashMap<usize, Arc<Vec<ArrayRef>>> = HashMap::new();
        let mut missing: Vec<usize> = Vec::new();
        for &column in columns {
            let Some(source) = footer.sources[column] else {
                continue;
            };
            match self
                .cache
                .and_then(|c| c.get(&key(source), Priority::Normal, epoch))
            {
                Some(chunk) => {
                    found.insert(source, chunk);
                }
                None if !missing.contains(&source) => missing.push(source),
                None => {}
            }
        }
        if !missing.is_empty() {
            let decoded = decode_row_group(
                self.reader()?,
                &footer.reader_metadata,
                &self.path,
                (group, rows),
                &missing,
                |source| {
                    footer
                        .sources
                        .iter()
                        .position(|s| *s == Some(source))
                        .map(|c| self.schema.field(c).data_type().clone())
                },
            )
            .await
            .map_err(CirroError::from)?;
            for (source, chunk) in decoded {
                if let Some(cache) = self.cache {
                    cache.insert(key(source), Arc::clone(&chunk), Priority::Normal, epoch);
                }
                found.insert(source, chunk);
            }
        }
        Ok(columns
            .iter()
            .map(|&column| match footer.sources[column] {
                Some(source) => Arc::clone(&found[&source]),
                None => {
                    let data_type = self.schema.field(column).data_type();
                    let pieces = (0..rows.div_ceil(PIECE_ROWS))
                        .map(|i| {
                            arrow::array::new_null_array(
                                data_type,
                                PIECE_ROWS.min(rows - i * PIECE_ROWS),
                            )
                        })
                        .collect();
                    Arc::new(pieces)
                }
            })
            .collect())
    }
}

/// The chunk id of the key index over the file's columns of `columns`
/// (table columns): above every column's, the file's column indices
/// packed (up to three of under 1023; otherwise None: no index, the key
/// columns are compared).
fn index_column(columns: &[usize], sources: &[Option<usize>]) -> Option<u32> {
    if columns.len() > 3 {
        return None;
    }
    let mut id: u32 = 0x8000_0000;
    for (i, &column) in columns.iter().enumerate() {
        let source = sources[column]?;
        if source >= 1022 {
            return None;
        }
        id |= ((source as u32) + 1) << (10 * i);
    }
    Some(id)
}

/// The rows whose key hash equals `hash` in `index` (a row whose key only
/// shares the hash is told apart by the caller).
fn probe(index: &[ArrayRef], hash: u64) -> Result<Vec<usize>> {
    let (Some(hashes), Some(rows), Some(directory)) = (
        index[0].as_any().downcast_ref::<UInt64Array>(),
        index[1].as_any().downcast_ref::<UInt32Array>(),
        index
            .get(2)
            .and_then(|d| d.as_any().downcast_ref::<UInt32Array>()),
    ) else {
        return Err(CirroError::internal("a key index of the wrong types"));
    };
    let (from, to) = directory_range(directory.values(), hash);
    let values = &hashes.values()[from..to];
    let start = from + values.partition_point(|h| *h < hash);
    Ok(hashes.values()[start..]
        .iter()
        .take_while(|h| **h == hash)
        .enumerate()
        .map(|(i, _)| rows.value(start + i) as usize)
        .collect())
}

/// Rows of a key index per entry of its directory, about: a probe searches
/// that many hashes, in a cache line or two, rather than all of them.
const DIRECTORY_SPAN: usize = 8;

/// The directory of sorted `hashes`: for each value of their top bits
/// (2^bits of them, enough for about [`DIRECTORY_SPAN`] hashes each), the
/// first hash with at least that value; then the count of hashes. A binary
/// search of a large index misses the processor's caches at every step.
fn directory(hashes: &[u64]) -> UInt32Array {
    let bits = (hashes.len() / DIRECTORY_SPAN).max(1).ilog2().min(24);
    let mut directory = Vec::with_capacity((1usize << bits) + 1);
    let mut at = 0usize;
    for bucket in 0..(1u64 << bits) {
        while at < hashes.len() && top_bits(hashes[at], bits) < bucket {
            at += 1;
        }
        directory.push(at as u32);
    }
    directory.push(hashes.len() as u32);
    UInt32Array::from(directory)
}

/// The range of the index's hashes that may equal `hash`, by `directory`.
fn directory_range(directory: &[u32], hash: u64) -> (usize, usize) {
    let bits = (directory.len().saturating_sub(1)).max(1).ilog2();
    let bucket = top_bits(hash, bits) as usize;
    (directory[bucket] as usize, directory[bucket + 1] as usize)
}

fn top_bits(hash: u64, bits: u32) -> u64 {
    if bits == 0 { 0 } else { hash >> (64 - bits) }
}

/// A row group's minimum and maximum of a column (None: not known).
#[derive(Debug)]
struct Bounds {
    min: Option<ScalarValue>,
    max: Option<ScalarValue>,
}

impl Bounds {
    fn of(mins: &ArrayRef, maxes: &ArrayRef, group: usize) -> Self {
        let bound = |array: &ArrayRef| {
            if array.is_null(group) {
                return None;
            }
            ScalarValue::try_from_array(array, group).ok()
        };
        Self {
            min: bound(mins),
            max: bound(maxes),
        }
    }

    /// Whether the row group may hold `value` (no statistics: it may).
    fn may_hold(&self, value: &ScalarValue) -> bool {
        let below = self
            .min
            .as_ref()
            .is_some_and(|min| matches!(value.partial_cmp(min), Some(std::cmp::Ordering::Less)));
        let above = self
            .max
            .as_ref()
            .is_some_and(|max| matches!(value.partial_cmp(max), Some(std::cmp::Ordering::Greater)));
        !below && !above
    }
}

/// The rows where every key column (`chunks`, in `key`'s order) equals its
/// value.
fn matching_rows(
    chunks: &[Arc<Vec<ArrayRef>>],
    key: &[(usize, ScalarValue)],
) -> Result<Vec<usize>> {
    let pieces = chunks.first().map(|c| c.len()).unwrap_or(0);
    let mut rows = Vec::new();
    for piece in 0..pieces {
        let mut all: Option<BooleanArray> = None;
        for (chunk, (_, value)) in chunks.iter().zip(key) {
            let array = &chunk[piece];
            let scalar = value.cast_to(array.data_type())?.to_scalar()?;
            let same = eq(array, &scalar)?;
            all = Some(match all {
                Some(a) => arrow::compute::and(&a, &same)?,
                None => same,
            });
        }
        if let Some(mask) = all
            && mask.true_count() > 0
        {
            rows.extend(
                mask.iter()
                    .enumerate()
                    .filter(|(_, m)| *m == Some(true))
                    .map(|(i, _)| piece * PIECE_ROWS + i),
            );
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of `hashes` as `key_index` builds one.
    fn index_of(mut hashes: Vec<u64>) -> Vec<ArrayRef> {
        let mut pairs: Vec<(u64, u32)> = hashes.drain(..).zip(0u32..).collect();
        pairs.sort_unstable();
        let sorted: Vec<u64> = pairs.iter().map(|(h, _)| *h).collect();
        vec![
            Arc::new(UInt64Array::from(sorted.clone())),
            Arc::new(UInt32Array::from(
                pairs.iter().map(|(_, r)| *r).collect::<Vec<_>>(),
            )),
            Arc::new(directory(&sorted)),
        ]
    }

    #[test]
    fn a_probe_finds_every_row_of_a_hash_through_the_directory() {
        // Hashes spread over the whole range, with repeats, at sizes that
        // give directories of 1 up to 2^10 entries; and the extremes.
        for rows in [1usize, 7, 8, 100, 5_000, 10_000] {
            let mut hashes: Vec<u64> = (0..rows as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i >> 3))
                .collect();
            hashes[rows / 2] = hashes[0];
            hashes.push(0);
            hashes.push(u64::MAX);
            let index = index_of(hashes.clone());
            for (row, hash) in hashes.iter().enumerate() {
                let mut found = probe(&index, *hash).expect("probe");
                found.sort_unstable();
                let mut expected: Vec<usize> = hashes
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| *h == hash)
                    .map(|(r, _)| r)
                    .collect();
                expected.sort_unstable();
                assert_eq!(found, expected, "rows {rows}, row {row}");
            }
            for absent in [1u64, u64::MAX - 1, 0x8000_0000_0000_0000] {
                if !hashes.contains(&absent) {
                    assert!(probe(&index, absent).expect("probe").is_empty());
                }
            }
        }
    }

    #[test]
    fn a_directory_splits_the_hashes_by_their_top_bits() {
        let sorted: Vec<u64> = (0..64u64).map(|i| i << 58).collect();
        let directory = directory(&sorted);
        // 64 hashes, 8 per entry: 8 entries (3 bits) and the count.
        assert_eq!(directory.len(), 9);
        assert_eq!(directory.values()[..], [0, 8, 16, 24, 32, 40, 48, 56, 64]);
        assert_eq!(directory_range(directory.values(), 3 << 61), (24, 32));
    }
}
