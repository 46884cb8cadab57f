//! Hash-distributed tables: `DISTRIBUTED BY HASH (k, …) BUCKETS n`.
//!
//! Every row of such a table belongs to bucket `hash(k, …) mod n`, and every
//! data file holds the rows of one bucket (its `add` action carries the
//! bucket number as the tag [`BUCKET_TAG`]). A scan groups the files by
//! bucket and tells the planner that its output is hash-partitioned on the
//! key; joins and aggregations on the key then need no exchange of rows.
//!
//! ```text
//!  row ──► key columns ──► hash (u64) ──► mod n ──► bucket b ──► files tagged b
//!  scan with p partitions (p divides n): partition j = buckets b with b mod p = j
//! ```
//!
//! **The hash** is DataFusion's repartitioning hash, so that a scan's
//! declared partitioning and a hash repartition of another input
//! (`RepartitionExec`) put equal keys in the same partition: foldhash 0.2's
//! fast hasher with the fixed seed 0 over each value (integers, dates and
//! timestamps as their integer, decimals as their 128-bit integer, text and
//! binary as scans read them, string views: a value of up to 12 bytes as
//! its 16-byte view, length and bytes, a longer one as its bytes), several
//! columns combined left to right by
//! DataFusion's `combine_hashes`; a NULL contributes nothing, so a key of
//! NULLs lands in bucket 0. `mod n` is the plain remainder. The function is
//! pinned: [`HASH_FINGERPRINT`] is recorded with every bucketed table, a test
//! pins the buckets of sample values, and a table whose recorded fingerprint
//! differs from this build's (a future DataFusion changing its hash) is
//! scanned as unbucketed and refuses writes until it is rewritten.
//!
//! Since `hash mod p = (hash mod n) mod p` whenever p divides n, a scan may
//! declare fewer partitions than buckets; two tables with different bucket
//! counts still line up when both are scanned with the same p.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Schema};
use cirro_common::{CirroError, Result, SqlState};
use deltalake::kernel::Add;

/// The most buckets a table may have.
pub const BUCKETS_MAX: u32 = 4096;

/// The tag of a data file's `add` action that holds its bucket number.
pub const BUCKET_TAG: &str = "cirro.bucket";

/// A table's hash distribution.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Distribution {
    /// The key columns, in hash order.
    pub columns: Vec<String>,
    pub buckets: u32,
    /// The fingerprint of the hash function the table was written with
    /// ([`HASH_FINGERPRINT`] of the build that created it).
    pub hash: String,
}

impl Distribution {
    /// A new distribution on `columns` of `schema`, checked: the columns
    /// exist (42703), appear once and have a type with a stable hash, and
    /// the bucket count is within 1..=[`BUCKETS_MAX`] (22023).
    pub fn new(columns: Vec<String>, buckets: i64, schema: &Schema) -> Result<Self> {
        if !(1..=BUCKETS_MAX as i64).contains(&buckets) {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("BUCKETS must be between 1 and {BUCKETS_MAX}, not {buckets}"),
            ));
        }
        if columns.is_empty() {
            return Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                "DISTRIBUTED BY HASH needs at least one column",
            ));
        }
        for (i, column) in columns.iter().enumerate() {
            let field = schema.field_with_name(column).map_err(|_| {
                CirroError::new(
                    SqlState::UNDEFINED_COLUMN,
                    format!("distribution column \"{column}\" does not exist"),
                )
            })?;
            if columns[..i].contains(column) {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_COLUMN,
                    format!("distribution column \"{column}\" appears twice"),
                ));
            }
            if !hashable(field.data_type()) {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!(
                        "column \"{column}\" of type {} cannot be a distribution key: \
                         use integer, numeric, text, binary, boolean, date, time or timestamp columns",
                        crate::schema::sql_type_name(field.data_type())
                    ),
                ));
            }
        }
        Ok(Self {
            columns,
            buckets: buckets as u32,
            hash: HASH_FINGERPRINT.clone(),
        })
    }

    /// `DISTRIBUTED BY HASH (a, b) BUCKETS 8`.
    pub fn definition(&self) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| quote_ident(c)).collect();
        format!(
            "DISTRIBUTED BY HASH ({}) BUCKETS {}",
            columns.join(", "),
            self.buckets
        )
    }

    /// Whether this build hashes as the table's writer did.
    pub fn hash_matches(&self) -> bool {
        self.hash == *HASH_FINGERPRINT
    }

    /// 55000 for a write to a table whose rows were placed by another hash.
    pub fn check_writable(&self) -> Result<()> {
        if self.hash_matches() {
            return Ok(());
        }
        Err(CirroError::new(
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "the table's rows were placed in buckets by another hash function ({}; this build: {}); \
                 rewrite it with CREATE TABLE … {} AS SELECT before writing to it",
                self.hash,
                *HASH_FINGERPRINT,
                self.definition()
            ),
        ))
    }

    /// Positions of the key columns in `schema`.
    pub fn key_indices(&self, schema: &Schema) -> Result<Vec<usize>> {
        self.columns
            .iter()
            .map(|c| {
                schema.index_of(c).map_err(|_| {
                    CirroError::internal(format!("distribution column \"{c}\" is missing"))
                })
            })
            .collect()
    }
}

/// An identifier as SQL needs it written: bare if it is lower case letters,
/// digits and underscores, else double-quoted.
pub fn quote_ident(name: &str) -> String {
    let bare = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Types whose values hash the same wherever they are equal: not floats
/// (equal values with different bits, NaNs) nor nested types.
fn hashable(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Decimal32(_, _)
            | Decimal64(_, _)
            | Decimal128(_, _)
            | Decimal256(_, _)
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
            | FixedSizeBinary(_)
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
    )
}

/// The bucket of every row, given the key columns: their hash slot (see
/// `cirro_exec::functions::slot`; text and binary hashed as scans read
/// them, as string views).
pub fn bucket_ids(keys: &[ArrayRef], buckets: u32) -> Result<Vec<u32>> {
    Ok(cirro_exec::functions::slot::hash_slots(
        keys,
        buckets as u64,
    )?)
}

/// The bucket of a data file in a scan of a bucketed table (an extension
/// of its `PartitionedFile`): which file groups and, on a cluster, which
/// tasks it may go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileBucket {
    pub bucket: u32,
    /// The table's bucket count.
    pub buckets: u32,
}

/// The rows of `batch` by bucket: (bucket, rows of that bucket), buckets
/// in ascending order, empty ones left out.
pub fn split_by_bucket(
    batch: &RecordBatch,
    key: &[usize],
    buckets: u32,
) -> Result<Vec<(u32, RecordBatch)>> {
    let keys: Vec<ArrayRef> = key.iter().map(|&i| Arc::clone(batch.column(i))).collect();
    let ids = bucket_ids(&keys, buckets)?;
    let mut rows: HashMap<u32, Vec<u32>> = HashMap::new();
    for (row, id) in ids.into_iter().enumerate() {
        rows.entry(id).or_default().push(row as u32);
    }
    let mut split: Vec<(u32, RecordBatch)> = rows
        .into_iter()
        .map(|(bucket, rows)| {
            let batch = if rows.len() == batch.num_rows() {
                batch.clone()
            } else {
                arrow::compute::take_record_batch(batch, &UInt32Array::from(rows))?
            };
            Ok((bucket, batch))
        })
        .collect::<Result<_>>()?;
    split.sort_by_key(|(bucket, _)| *bucket);
    Ok(split)
}

/// The bucket a data file holds, from its `add` action's tags.
pub fn bucket_of(add: &Add) -> Option<u32> {
    add.tags.as_ref()?.get(BUCKET_TAG)?.as_deref()?.parse().ok()
}

/// Tag `add` as holding the rows of `bucket`.
pub fn tag_bucket(add: &mut Add, bucket: u32) {
    add.tags
        .get_or_insert_with(Default::default)
        .insert(BUCKET_TAG.to_string(), Some(bucket.to_string()));
}

/// How many partitions a scan of a table with `buckets` buckets declares for
/// `target` partitions wanted: the smallest divisor of `buckets` that is at
/// least `target` (all buckets if none is).
pub fn scan_partitions(buckets: u32, target: usize) -> usize {
    let buckets = buckets.max(1) as usize;
    (1..=buckets)
        .find(|p| buckets % p == 0 && *p >= target)
        .unwrap_or(buckets)
}

/// The hash function's fingerprint: `foldhash-df:` and the buckets (of 4096)
/// of fixed sample values of each kind of type, hashed as a scan would.
pub static HASH_FINGERPRINT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let probes = probe_columns();
    let mut ids = Vec::new();
    for column in &probes {
        ids.extend(bucket_ids(std::slice::from_ref(column), BUCKETS_MAX).unwrap_or_default());
    }
    ids.extend(bucket_ids(&probes[..2], BUCKETS_MAX).unwrap_or_default());
    // FNV-1a over the bucket numbers.
    let mut print: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        print = (print ^ id as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("foldhash-df:{print:016x}")
});

/// Sample values for [`HASH_FINGERPRINT`]: four rows of each kind.
fn probe_columns() -> Vec<ArrayRef> {
    use arrow::array::*;
    vec![
        Arc::new(Int64Array::from(vec![Some(0), Some(1), Some(-7), None])),
        Arc::new(StringArray::from(vec![
            Some(""),
            Some("a"),
            Some("Cirro"),
            None,
        ])),
        Arc::new(Int32Array::from(vec![1, 2, 3, i32::MAX])),
        Arc::new(
            Decimal128Array::from(vec![0, 1, -100, 123456789])
                .with_precision_and_scale(15, 2)
                .expect("decimal"),
        ),
        Arc::new(Date32Array::from(vec![0, 9000, 10000, -1])),
        Arc::new(BooleanArray::from(vec![true, false, true, false])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::*;
    use arrow::datatypes::Field;

    fn buckets_of(array: ArrayRef, n: u32) -> Vec<u32> {
        bucket_ids(&[array], n).unwrap()
    }

    /// The documented hash: these buckets must never change, or every
    /// bucketed table written before would be misread.
    #[test]
    fn the_hash_is_pinned() {
        let ints = Arc::new(Int64Array::from(vec![1, 2, 3, 42, -1])) as ArrayRef;
        let pinned_ints = buckets_of(ints, 16);
        let text = Arc::new(StringArray::from(vec!["a", "b", "Cirro"])) as ArrayRef;
        let pinned_text = buckets_of(text, 16);
        assert_eq!(
            (pinned_ints.clone(), pinned_text.clone()),
            (PINNED_INTS.to_vec(), PINNED_TEXT.to_vec()),
            "the bucket hash changed: {pinned_ints:?} {pinned_text:?}"
        );
        assert_eq!(*HASH_FINGERPRINT, PINNED_FINGERPRINT);
    }

    const PINNED_INTS: [u32; 5] = [1, 4, 9, 10, 15];
    const PINNED_TEXT: [u32; 3] = [4, 12, 1];
    const PINNED_FINGERPRINT: &str = "foldhash-df:e462159ce582bde4";

    #[test]
    fn text_hashes_alike_in_every_string_layout() {
        let values = vec![Some("x"), None, Some("lineitem"), Some("")];
        let plain = buckets_of(Arc::new(StringArray::from(values.clone())), 64);
        let view = buckets_of(Arc::new(StringViewArray::from(values.clone())), 64);
        let large = buckets_of(Arc::new(LargeStringArray::from(values)), 64);
        assert_eq!(plain, view);
        assert_eq!(plain, large);
        assert_eq!(plain[1], 0, "NULL keys go to bucket 0");
    }

    #[test]
    fn fewer_partitions_than_buckets_stay_a_hash_partitioning() {
        let array = Arc::new(Int32Array::from((0..500).collect::<Vec<_>>())) as ArrayRef;
        let by_16 = buckets_of(Arc::clone(&array), 16);
        let by_4 = buckets_of(array, 4);
        for (b16, b4) in by_16.into_iter().zip(by_4) {
            assert_eq!(b16 % 4, b4);
        }
        assert_eq!(scan_partitions(16, 2), 2);
        assert_eq!(scan_partitions(16, 3), 4);
        assert_eq!(scan_partitions(9, 2), 3);
        assert_eq!(scan_partitions(7, 2), 7);
        assert_eq!(scan_partitions(4, 8), 4);
    }

    #[test]
    fn bad_distributions_are_refused() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
        ]);
        let state = |columns: &[&str], n: i64| {
            Distribution::new(columns.iter().map(|c| c.to_string()).collect(), n, &schema)
                .unwrap_err()
                .state
        };
        assert_eq!(state(&["a"], 0), SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(state(&["a"], 4097), SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(state(&["zz"], 4), SqlState::UNDEFINED_COLUMN);
        assert_eq!(state(&["f"], 4), SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(state(&["a", "a"], 4), SqlState::DUPLICATE_COLUMN);
        let ok = Distribution::new(vec!["a".into()], 4096, &schema).unwrap();
        assert!(ok.hash_matches());
        assert_eq!(ok.definition(), "DISTRIBUTED BY HASH (a) BUCKETS 4096");
    }

    /// Every file of a bucketed table holds the rows of the bucket its tag
    /// names, across several writes, and the tags outlive a checkpoint.
    #[tokio::test]
    async fn every_file_holds_one_bucket() {
        use crate::options::TableOptions;
        use crate::table::{CirroTable, create_delta_table};
        let dir = std::env::temp_dir().join(format!("cirro-bucket-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = url::Url::from_directory_path(&dir).unwrap();
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]);
        let options = TableOptions {
            distribution: Some(Distribution::new(vec!["k".into()], 6, &schema).unwrap()),
            ..Default::default()
        };
        let delta = create_delta_table(&url, &schema, &options).await.unwrap();
        let stored = Arc::new(schema.clone());
        for round in 0..2i64 {
            let keys: Vec<Option<i64>> = (0..500)
                .map(|i| (i % 50 != 0).then_some(i * 7 + round))
                .collect();
            let values: Vec<String> = (0..500).map(|i| format!("v{i}")).collect();
            let batch = RecordBatch::try_new(
                Arc::clone(&stored),
                vec![
                    Arc::new(Int64Array::from(keys)),
                    Arc::new(StringArray::from(values)),
                ],
            )
            .unwrap();
            let table = CirroTable::open(&url).await.unwrap();
            crate::write::write_stream(
                table.delta(),
                Arc::clone(&stored),
                futures::stream::iter(vec![Ok(batch)]),
                deltalake::protocol::SaveMode::Append,
            )
            .await
            .unwrap();
        }
        let table = CirroTable::open(&url).await.unwrap();
        deltalake::checkpoints::create_checkpoint(table.delta(), None)
            .await
            .unwrap();
        let table = CirroTable::open(&url).await.unwrap();
        assert!(table.scan_distribution().is_some());
        let mut rows = 0;
        let mut buckets = std::collections::BTreeSet::new();
        for file in table.files() {
            let bucket = bucket_of(&file.add).expect("every file is tagged");
            buckets.insert(bucket);
            let path = url::Url::parse(&file.url).unwrap().to_file_path().unwrap();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
                std::fs::File::open(path).unwrap(),
                1024,
            )
            .unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                rows += batch.num_rows();
                let ids = bucket_ids(&[Arc::clone(batch.column(0))], 6).unwrap();
                assert!(
                    ids.iter().all(|id| *id == bucket),
                    "a row outside its bucket"
                );
            }
        }
        assert_eq!(rows, 1000);
        assert_eq!(buckets.len(), 6, "{buckets:?}");
        drop(delta);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rows_split_by_bucket() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from((0..100).collect::<Vec<_>>()))],
        )
        .unwrap();
        let split = split_by_bucket(&batch, &[0], 8).unwrap();
        assert_eq!(split.iter().map(|(_, b)| b.num_rows()).sum::<usize>(), 100);
        for (bucket, part) in &split {
            let ids = bucket_ids(&[Arc::clone(part.column(0))], 8).unwrap();
            assert!(ids.iter().all(|id| id == bucket));
        }
    }
}
