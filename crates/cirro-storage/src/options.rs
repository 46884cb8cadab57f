//! Per-table storage options: `CREATE TABLE … WITH (compression = 'zstd',
//! row_group_rows = N, cluster_by = 'a, b')`.
//!
//! They live in the Delta table's configuration (`cirro.compression`,
//! `cirro.rowGroupRows`, `cirro.clusterBy`), so they travel with the table and
//! every writer of any process applies them: the codec and row-group size of
//! every data file written, and the cluster key by which INSERT and CREATE
//! TABLE AS sort their rows and OPTIMIZE rewrites the table. Clustering keeps
//! each file's and row group's min/max range of the key narrow, so scans that
//! filter on the key skip most files and row groups.
//!
//! Indexes (`CREATE [UNIQUE] INDEX`) and constraints (PRIMARY KEY, UNIQUE,
//! CHECK) live there too, one entry each (`cirro.index.<name>`,
//! `cirro.constraint.<name>`, JSON values). An index is a key that every
//! data file is written sorted by (unless the table has a cluster key, which
//! wins) plus a Parquet bloom filter per row group on each key column: scans
//! with `key = v` or `key IN (…)` skip the files and row groups whose min/max
//! range or bloom filter excludes the values. A PRIMARY KEY or UNIQUE
//! constraint carries the same index on its columns.

use std::collections::HashMap;

use arrow::datatypes::Schema;
use cirro_common::limits::ROW_GROUP_ROWS_DEFAULT;
use cirro_common::{CirroError, Result, SqlState};
use parquet::basic::{Compression, ZstdLevel};

pub use crate::bucket::Distribution;

const COMPRESSION_KEY: &str = "cirro.compression";
const ROW_GROUP_ROWS_KEY: &str = "cirro.rowGroupRows";
const CLUSTER_BY_KEY: &str = "cirro.clusterBy";
const INDEX_PREFIX: &str = "cirro.index.";
const CONSTRAINT_PREFIX: &str = "cirro.constraint.";
const DISTRIBUTION_KEY: &str = "cirro.distribution";

/// Whether `key` is a Delta configuration entry that [`TableOptions`] owns
/// (and rewrites whole when the options change).
pub fn is_option_key(key: &str) -> bool {
    key == COMPRESSION_KEY
        || key == ROW_GROUP_ROWS_KEY
        || key == CLUSTER_BY_KEY
        || key == DISTRIBUTION_KEY
        || key.starts_with(INDEX_PREFIX)
        || key.starts_with(CONSTRAINT_PREFIX)
}

/// A key column of an index: its name and whether it sorts descending.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyColumn {
    pub name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub descending: bool,
}

/// `CREATE [UNIQUE] INDEX name ON table (columns)`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexDef {
    #[serde(skip)]
    pub name: String,
    pub columns: Vec<KeyColumn>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unique: bool,
    /// Creation order among the table's indexes (the first one created
    /// sets the write order of a table without cluster or primary key).
    #[serde(default)]
    pub seq: u64,
}

/// What a table constraint requires.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConstraintKind {
    /// The columns are NOT NULL and no two rows share their values.
    PrimaryKey(Vec<String>),
    /// No two rows whose columns are all non-NULL share their values.
    Unique(Vec<String>),
    /// The expression (SQL text over the table's columns) is not false for
    /// any row.
    Check(String),
}

/// A named table constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintDef {
    pub name: String,
    pub kind: ConstraintKind,
}

impl ConstraintDef {
    /// The key columns of a PRIMARY KEY or UNIQUE constraint.
    pub fn key(&self) -> Option<&[String]> {
        match &self.kind {
            ConstraintKind::PrimaryKey(c) | ConstraintKind::Unique(c) => Some(c),
            ConstraintKind::Check(_) => None,
        }
    }

    /// The constraint as PostgreSQL's `pg_get_constraintdef` shows it.
    pub fn definition(&self) -> String {
        match &self.kind {
            ConstraintKind::PrimaryKey(c) => format!("PRIMARY KEY ({})", c.join(", ")),
            ConstraintKind::Unique(c) => format!("UNIQUE ({})", c.join(", ")),
            ConstraintKind::Check(sql) => format!("CHECK ({sql})"),
        }
    }
}

impl IndexDef {
    /// `name ON table (a, b DESC)` as CREATE INDEX wrote it.
    pub fn definition(&self, table: &str) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if c.descending {
                    format!("{} DESC", c.name)
                } else {
                    c.name.clone()
                }
            })
            .collect();
        format!(
            "CREATE {}INDEX {} ON {table} ({})",
            if self.unique { "UNIQUE " } else { "" },
            self.name,
            columns.join(", ")
        )
    }
}

/// Largest row group a table may ask for.
const ROW_GROUP_ROWS_MAX: usize = 64 * 1024 * 1024;

/// Compression codecs a table may use.
pub const CODECS: [&str; 4] = ["zstd", "snappy", "lz4", "none"];

/// Per-table storage options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableOptions {
    pub comment: Option<String>,
    /// One of [`CODECS`]; zstd when unset.
    pub compression: Option<String>,
    /// Rows per Parquet row group; [`ROW_GROUP_ROWS_DEFAULT`] when unset.
    pub row_group_rows: Option<usize>,
    /// Columns rows are sorted by on write and by OPTIMIZE.
    pub cluster_by: Vec<String>,
    /// Indexes, in creation order.
    pub indexes: Vec<IndexDef>,
    /// Constraints, by name.
    pub constraints: Vec<ConstraintDef>,
    /// `DISTRIBUTED BY HASH (…) BUCKETS n` (see `bucket.rs`).
    pub distribution: Option<Distribution>,
}

fn invalid(message: impl Into<String>) -> CirroError {
    CirroError::new(SqlState::INVALID_PARAMETER_VALUE, message)
}

impl TableOptions {
    /// Options from `WITH (key = value, …)` of CREATE TABLE, checked against
    /// the table's columns.
    pub fn from_sql(pairs: &[(String, String)], schema: &Schema) -> Result<Self> {
        let mut options = TableOptions::default();
        for (key, value) in pairs {
            match key.to_ascii_lowercase().as_str() {
                "compression" => {
                    let codec = value.to_ascii_lowercase();
                    if !CODECS.contains(&codec.as_str()) {
                        return Err(invalid(format!(
                            "compression must be one of {}, not '{value}'",
                            CODECS.join(", ")
                        )));
                    }
                    options.compression = Some(codec);
                }
                "row_group_rows" => {
                    let rows: usize = value.trim().parse().map_err(|_| {
                        invalid(format!(
                            "row_group_rows must be a positive integer, not '{value}'"
                        ))
                    })?;
                    if rows == 0 || rows > ROW_GROUP_ROWS_MAX {
                        return Err(invalid(format!(
                            "row_group_rows must be between 1 and {ROW_GROUP_ROWS_MAX}, not {rows}"
                        )));
                    }
                    options.row_group_rows = Some(rows);
                }
                "cluster_by" => {
                    let columns: Vec<String> = value
                        .split(',')
                        .map(|c| c.trim().to_string())
                        .filter(|c| !c.is_empty())
                        .collect();
                    if columns.is_empty() {
                        return Err(invalid("cluster_by needs at least one column"));
                    }
                    for column in &columns {
                        if schema.field_with_name(column).is_err() {
                            return Err(CirroError::new(
                                SqlState::UNDEFINED_COLUMN,
                                format!("cluster_by column \"{column}\" does not exist"),
                            ));
                        }
                    }
                    options.cluster_by = columns;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown table option \"{other}\" (known: compression, row_group_rows, cluster_by)"
                    )));
                }
            }
        }
        Ok(options)
    }

    /// The Delta table configuration entries that hold these options.
    pub fn to_configuration(&self) -> HashMap<String, String> {
        let mut map = HashMap::new();
        if let Some(codec) = &self.compression {
            map.insert(COMPRESSION_KEY.to_string(), codec.clone());
        }
        if let Some(rows) = self.row_group_rows {
            map.insert(ROW_GROUP_ROWS_KEY.to_string(), rows.to_string());
        }
        if !self.cluster_by.is_empty() {
            map.insert(CLUSTER_BY_KEY.to_string(), self.cluster_by.join(","));
        }
        for index in &self.indexes {
            if let Ok(json) = serde_json::to_string(index) {
                map.insert(format!("{INDEX_PREFIX}{}", index.name), json);
            }
        }
        for constraint in &self.constraints {
            if let Ok(json) = serde_json::to_string(&constraint.kind) {
                map.insert(format!("{CONSTRAINT_PREFIX}{}", constraint.name), json);
            }
        }
        if let Some(json) = self
            .distribution
            .as_ref()
            .and_then(|d| serde_json::to_string(d).ok())
        {
            map.insert(DISTRIBUTION_KEY.to_string(), json);
        }
        map
    }

    /// The options a table's Delta configuration holds.
    pub fn from_configuration(map: &HashMap<String, String>) -> Self {
        TableOptions {
            comment: None,
            compression: map.get(COMPRESSION_KEY).cloned(),
            row_group_rows: map.get(ROW_GROUP_ROWS_KEY).and_then(|r| r.parse().ok()),
            cluster_by: map
                .get(CLUSTER_BY_KEY)
                .map(|c| c.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            indexes: {
                let mut indexes = entries(map, INDEX_PREFIX, |name, json| {
                    let mut index: IndexDef = serde_json::from_str(json).ok()?;
                    index.name = name.to_string();
                    Some(index)
                });
                indexes.sort_by_key(|i| i.seq);
                indexes
            },
            constraints: entries(map, CONSTRAINT_PREFIX, |name, json| {
                Some(ConstraintDef {
                    name: name.to_string(),
                    kind: serde_json::from_str(json).ok()?,
                })
            }),
            distribution: map
                .get(DISTRIBUTION_KEY)
                .and_then(|json| serde_json::from_str(json).ok()),
        }
    }

    /// The order new rows are written in: the cluster key if there is one,
    /// else the primary key, else the key of the first index created.
    pub fn write_order(&self) -> Vec<KeyColumn> {
        if !self.cluster_by.is_empty() {
            return self
                .cluster_by
                .iter()
                .map(|c| KeyColumn {
                    name: c.clone(),
                    descending: false,
                })
                .collect();
        }
        let primary = self.constraints.iter().find_map(|c| match &c.kind {
            ConstraintKind::PrimaryKey(columns) => Some(columns),
            _ => None,
        });
        if let Some(columns) = primary {
            return columns
                .iter()
                .map(|c| KeyColumn {
                    name: c.clone(),
                    descending: false,
                })
                .collect();
        }
        self.indexes
            .first()
            .map(|i| i.columns.clone())
            .unwrap_or_default()
    }

    /// Columns that get a bloom filter in every row group: the key columns
    /// of indexes, primary keys and unique constraints.
    pub fn bloom_filter_columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = self
            .indexes
            .iter()
            .flat_map(|i| i.columns.iter().map(|c| c.name.clone()))
            .chain(
                self.constraints
                    .iter()
                    .filter_map(|c| c.key())
                    .flat_map(|k| k.iter().cloned()),
            )
            .collect();
        columns.sort();
        columns.dedup();
        columns
    }

    /// Key column lists whose values must be unique: PRIMARY KEY, UNIQUE
    /// and unique indexes, each with its constraint or index name.
    pub fn unique_keys(&self) -> Vec<(String, Vec<String>, bool)> {
        let mut keys: Vec<(String, Vec<String>, bool)> = self
            .constraints
            .iter()
            .filter_map(|c| match &c.kind {
                ConstraintKind::PrimaryKey(k) => Some((c.name.clone(), k.clone(), true)),
                ConstraintKind::Unique(k) => Some((c.name.clone(), k.clone(), false)),
                ConstraintKind::Check(_) => None,
            })
            .collect();
        keys.extend(self.indexes.iter().filter(|i| i.unique).map(|i| {
            (
                i.name.clone(),
                i.columns.iter().map(|c| c.name.clone()).collect(),
                false,
            )
        }));
        keys
    }

    /// Whether any write to the table must be checked (CHECK, unique keys).
    pub fn has_checks(&self) -> bool {
        !self.constraints.is_empty() || self.indexes.iter().any(|i| i.unique)
    }

    /// The Parquet codec of the table's data files.
    pub fn codec(&self) -> Result<Compression> {
        Ok(match self.compression.as_deref().unwrap_or("zstd") {
            "snappy" => Compression::SNAPPY,
            "lz4" => Compression::LZ4_RAW,
            "none" => Compression::UNCOMPRESSED,
            _ => Compression::ZSTD(
                ZstdLevel::try_new(1).map_err(|e| CirroError::internal(e.to_string()))?,
            ),
        })
    }

    pub fn row_group_rows(&self) -> usize {
        self.row_group_rows.unwrap_or(ROW_GROUP_ROWS_DEFAULT)
    }
}

/// The entries of `map` whose keys start with `prefix`, parsed by `parse`
/// (name after the prefix, value), sorted by name; unreadable ones skipped.
fn entries<T>(
    map: &HashMap<String, String>,
    prefix: &str,
    parse: impl Fn(&str, &str) -> Option<T>,
) -> Vec<T> {
    let mut found: Vec<(&String, &String)> =
        map.iter().filter(|(k, _)| k.starts_with(prefix)).collect();
    found.sort();
    found
        .into_iter()
        .filter_map(|(k, v)| parse(&k[prefix.len()..], v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ])
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_round_trip_through_the_configuration() {
        let options = TableOptions::from_sql(
            &pairs(&[
                ("compression", "SNAPPY"),
                ("row_group_rows", "1000"),
                ("cluster_by", "b, a"),
            ]),
            &schema(),
        )
        .unwrap();
        assert_eq!(options.compression.as_deref(), Some("snappy"));
        assert_eq!(options.row_group_rows(), 1000);
        assert_eq!(options.cluster_by, vec!["b", "a"]);
        let mut options = options;
        options.distribution = Some(Distribution::new(vec!["a".into()], 8, &schema()).unwrap());
        assert_eq!(
            TableOptions::from_configuration(&options.to_configuration()),
            options
        );
    }

    #[test]
    fn indexes_and_constraints_round_trip_and_set_the_write_order() {
        let mut options = TableOptions::default();
        options.indexes.push(IndexDef {
            name: "t_b".into(),
            columns: vec![KeyColumn {
                name: "b".into(),
                descending: true,
            }],
            unique: true,
            seq: 1,
        });
        assert_eq!(options.write_order()[0].name, "b");
        options.constraints = vec![
            ConstraintDef {
                name: "t_a_check".into(),
                kind: ConstraintKind::Check("a > 0".into()),
            },
            ConstraintDef {
                name: "t_pkey".into(),
                kind: ConstraintKind::PrimaryKey(vec!["a".into()]),
            },
        ];
        let config = options.to_configuration();
        assert_eq!(TableOptions::from_configuration(&config), options);
        assert!(config.keys().all(|k| is_option_key(k)));
        // the primary key wins over an index, a cluster key over both
        assert_eq!(options.write_order()[0].name, "a");
        assert_eq!(options.bloom_filter_columns(), vec!["a", "b"]);
        assert_eq!(options.unique_keys().len(), 2);
        options.cluster_by = vec!["b".into()];
        assert!(!options.write_order()[0].descending);
    }

    #[test]
    fn tables_of_the_previous_release_have_no_indexes_or_constraints() {
        // The previous release wrote only these keys (and delta's own).
        let old: HashMap<String, String> = [
            ("cirro.compression", "snappy"),
            ("cirro.clusterBy", "a"),
            ("delta.enableDeletionVectors", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let options = TableOptions::from_configuration(&old);
        assert!(options.indexes.is_empty() && options.constraints.is_empty());
        assert!(
            options.distribution.is_none(),
            "old tables are not bucketed"
        );
        assert!(!options.has_checks());
        assert!(options.bloom_filter_columns().is_empty());
        assert_eq!(options.write_order()[0].name, "a");
        assert!(!is_option_key("delta.enableDeletionVectors"));
    }

    #[test]
    fn bad_options_are_refused() {
        let err = |list: &[(&str, &str)]| {
            TableOptions::from_sql(&pairs(list), &schema())
                .unwrap_err()
                .state
        };
        assert_eq!(
            err(&[("compression", "brotli")]),
            SqlState::INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            err(&[("row_group_rows", "0")]),
            SqlState::INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            err(&[("row_group_rows", "many")]),
            SqlState::INVALID_PARAMETER_VALUE
        );
        assert_eq!(err(&[("cluster_by", "c")]), SqlState::UNDEFINED_COLUMN);
        assert_eq!(
            err(&[("colour", "blue")]),
            SqlState::INVALID_PARAMETER_VALUE
        );
    }
}
