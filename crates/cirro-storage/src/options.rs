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

use std::collections::HashMap;

use arrow::datatypes::Schema;
use cirro_common::limits::ROW_GROUP_ROWS_DEFAULT;
use cirro_common::{CirroError, Result, SqlState};
use parquet::basic::{Compression, ZstdLevel};

const COMPRESSION_KEY: &str = "cirro.compression";
const ROW_GROUP_ROWS_KEY: &str = "cirro.rowGroupRows";
const CLUSTER_BY_KEY: &str = "cirro.clusterBy";

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
        }
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
        assert_eq!(
            TableOptions::from_configuration(&options.to_configuration()),
            options
        );
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
