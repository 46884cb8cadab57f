//! Named limits. Every bound in Cirro lives here, with its unit last in the name.

/// Rows a Parquet row group holds unless the table says otherwise.
pub const ROW_GROUP_ROWS_DEFAULT: usize = 1024 * 1024;

/// Rows a Parquet data page holds at most. Pages are the unit the page index
/// prunes and the reader decompresses: a point lookup reads one page per
/// column, so pages of 8 Ki rows (parquet-rs's default is 20 Ki) cut what it
/// decompresses by 2.5 while an int64 page stays 64 KiB.
pub const DATA_PAGE_ROWS_MAX: usize = 8 * 1024;

/// A data file is closed and a new one started once it reaches this size.
pub const DATA_FILE_BYTES_TARGET: u64 = 128 * 1024 * 1024;

/// Rows per record batch produced by the data generators and loaders.
pub const LOAD_BATCH_ROWS: usize = 64 * 1024;

/// How many times a catalog change is retried when another process committed first.
pub const CATALOG_COMMIT_RETRIES_MAX: usize = 16;

/// Catalog snapshot files kept on storage; older ones are removed after a commit.
pub const CATALOG_VERSIONS_KEPT: u64 = 32;

/// Nesting depth of views referring to views, to stop cycles.
pub const VIEW_NESTING_DEPTH_MAX: usize = 24;
