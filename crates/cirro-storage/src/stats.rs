//! Table statistics collected by `ANALYZE`: the row count and, per column,
//! the NULL count and an estimate of the distinct values (HyperLogLog,
//! DataFusion's `approx_distinct`). They are kept with the table's catalog
//! entry (not in the Delta log: a metadata commit would fail the writers
//! committing beside it). Join order reads them from the table
//! (`CirroTable::distinct_estimate`); the counts of columns without a value
//! range (text) are handed to DataFusion as the scans' column statistics
//! (`distinct_count`) for adaptive aggregation's group estimates (see
//! `CirroTable::scan` for why not the others). Min/max are not kept: every
//! data file's footer has them, exact for that file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What `ANALYZE t` found, as of one Delta version of the table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TableStatistics {
    /// The Delta version analyzed.
    pub version: i64,
    /// When, in milliseconds since the epoch.
    pub analyzed_ms: i64,
    pub rows: u64,
    /// By column name.
    #[serde(default)]
    pub columns: BTreeMap<String, ColumnStatistics>,
}

/// One column's statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnStatistics {
    pub nulls: u64,
    /// Distinct non-NULL values, estimated (None: a type the estimator
    /// does not take, such as floating point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct: Option<u64>,
}

impl TableStatistics {
    /// The distinct values of `column` for a table that now holds `rows`
    /// rows: the analyzed estimate, at most the rows.
    pub fn distinct(&self, column: &str, rows: Option<usize>) -> Option<usize> {
        let distinct = self.columns.get(column)?.distinct? as usize;
        Some(rows.map_or(distinct, |r| distinct.min(r)))
    }
}
