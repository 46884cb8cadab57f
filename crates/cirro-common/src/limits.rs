//! Named limits, each with its unit last in the name: the bounds several
//! crates share (the node number a backend pid can carry) and those a user
//! meets in SQL (statement size and nesting, view nesting, data file and
//! row group sizes, catalog retries).
//!
//! Bounds that belong to one module's algorithm are named beside the code
//! they bound, where a reader of that code needs them:
//!
//! - storage (`cirro-storage`): `write.rs` (dictionary page size, bloom
//!   filter false-positive rate, bucket write buffer, blind-append commit
//!   attempts), `mutate.rs` (`REWRITE_FRACTION`), `cache/mod.rs` (the
//!   hot-data tier's piece size, default share, hot share and kept footers
//!   and ghosts), `cache/disk.rs`, `cache/scan.rs`, `cache/routed.rs`,
//!   `bucket.rs`, `options.rs`;
//! - execution (`cirro-exec`): `resources/mod.rs` (memory shares, a
//!   query's minimum memory), `spill_join/grace.rs`, `functions/sized.rs`
//!   (the largest scalar result), `functions/average.rs`,
//!   `functions/pg_datetime.rs`, `filtered_aggregate.rs` and the rules'
//!   thresholds (`rules/aggregation.rs`, `rules/build_sides.rs`,
//!   `rules/join_order.rs`);
//! - cluster (`cirro-cluster`): `lib.rs` (ZooKeeper session, request and
//!   lock timeouts, refresh interval), `distributed.rs` (connect, keepalive
//!   and probe timeouts, how long a node stays suspect), `locality.rs`;
//! - engine and server: `cirro-engine/src/system/activity.rs` (finished queries
//!   kept, query id bits), `history.rs` (VACUUM's default retention),
//!   `settings.rs` (the largest priority), `constraints.rs` (keys per
//!   checking IN list); `cirro-server`'s `console/mod.rs` (login lifetime,
//!   request body size), `http_client.rs` (call timeout, answer size),
//!   `lib.rs` (startup timeout), `flight/prepared.rs` (prepared statements
//!   per session); `cirro-sql`'s `types.rs` (CHAR/VARCHAR length, NUMERIC
//!   precision) and `shape.rs` (numeric literal digits).

/// Bits of a backend pid below the node number: a pid is
/// `node << PID_NODE_SHIFT_BITS | n`, unique across a cluster's nodes.
pub const PID_NODE_SHIFT_BITS: u32 = 22;

/// The highest node number: what a pid's bits above [`PID_NODE_SHIFT_BITS`]
/// can carry, the sign bit kept clear (pids are int4).
pub const NODE_NUMBER_MAX: u32 = (1 << (31 - PID_NODE_SHIFT_BITS)) - 1;

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

/// Bytes one SQL statement may have. The shapes that stress the planner (a
/// 3,000-term OR of ~40 KB) sit far below; this bounds the parser's memory.
pub const STATEMENT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// How deep the parser may recurse: parentheses, subqueries, function
/// arguments, unary operators (each level is one stack frame of the parser
/// and of every pass after it).
pub const STATEMENT_NESTING_DEPTH_MAX: usize = 200;

/// How deep subquery expressions (scalar `(SELECT …)`, `EXISTS`, `IN
/// (SELECT …)`) may nest inside one another. DataFusion 55's plan checks
/// visit every nested subquery again from each level above it, so planning
/// time doubles with each level: 16 levels plan in 0.3 s, 20 in 2.5 s, 40
/// would take days (found by the fuzz test). Derived tables (`FROM (SELECT
/// …)`) do not count.
pub const SUBQUERY_NESTING_DEPTH_MAX: usize = 16;

/// The environment variable that replaces [`STATEMENT_NESTING_DEPTH_MAX`]
/// for the fuzz test's self-test, which switches the limit off to show that
/// the fuzzer finds the crash the limit prevents. Never set it otherwise.
pub const NESTING_DEPTH_OVERRIDE_ENV: &str = "CIRRO_UNSAFE_NESTING_DEPTH_MAX";

/// The nesting limit in force: [`STATEMENT_NESTING_DEPTH_MAX`] unless
/// [`NESTING_DEPTH_OVERRIDE_ENV`] says otherwise (read once).
pub fn statement_nesting_depth_max() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var(NESTING_DEPTH_OVERRIDE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(STATEMENT_NESTING_DEPTH_MAX)
    })
}

/// Operators one chain of left-associative operators may hold (`1+1+…`,
/// `a || b || …`, `x::t::t…`): each is one level of the expression tree that
/// planning walks recursively. 10x the 2,000-term sums users were seen to send.
pub const EXPRESSION_CHAIN_LENGTH_MAX: usize = 20_000;

/// Levels of an operator chain between two `cirro_segment(…)` wrappers (see
/// `cirro-sql/src/shape.rs` and `cirro-exec/src/rules/chains.rs`): what one
/// "type of this subtree" or "name of this subtree" walks at most.
pub const CHAIN_SEGMENT_LEVELS: usize = 32;

/// The identity function that marks chain segments.
pub const CHAIN_SEGMENT_FUNCTION: &str = "cirro_segment";

/// Operators one statement may hold (`+`, `=`, `AND`, `IS`, `::`, …; commas
/// and unary signs do not count): 10x the 3,000-term ORs (6,000 operators)
/// users were seen to send, and a bound on how deep any expression tree the
/// parser builds can be, checked on the tokens before the tree exists.
/// (AND/OR chains are then rebuilt as balanced trees and `col = v OR col = w
/// …` as `col IN (v, w, …)`, so their depth stays small.)
pub const EXPRESSION_OPERATORS_MAX: usize = 100_000;

/// Stack of each thread that parses, plans or runs statements. Deep
/// expressions recurse in planning and in dropping plans; the chain limit
/// and operator limits above are sized so that the deepest statement they
/// allow fits with room to spare (the hardening tests run at the limits).
pub const STATEMENT_THREAD_STACK_BYTES: usize = 256 * 1024 * 1024;

/// A size as PostgreSQL writes memory settings: a number of bytes, or a
/// number with a unit (`B`, `kB`, `MB`, `GB`, `TB`, powers of 1024, case
/// ignored), or a percentage of `total` (`25%`).
pub fn parse_size(text: &str, total: u64) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || {
        format!("invalid size {text:?}: a number of bytes, with kB, MB, GB or TB, or a percentage")
    };
    let number: f64 = number.parse().map_err(|_| bad())?;
    let bytes = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => number,
        "kb" => number * 1024.0,
        "mb" => number * 1024.0 * 1024.0,
        "gb" => number * 1024.0 * 1024.0 * 1024.0,
        "tb" => number * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "%" if number <= 100.0 => total as f64 * number / 100.0,
        _ => return Err(bad()),
    };
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// This machine's memory in bytes (Linux), if known.
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_postgresql_units_and_percentages() {
        assert_eq!(parse_size("2GB", 0), Ok(2 << 30));
        assert_eq!(parse_size("64 MB", 0), Ok(64 << 20));
        assert_eq!(parse_size("512kB", 0), Ok(512 << 10));
        assert_eq!(parse_size("1000", 0), Ok(1000));
        assert_eq!(parse_size("25%", 400), Ok(100));
        assert!(parse_size("lots", 0).is_err());
        assert!(parse_size("5 XB", 0).is_err());
        assert!(parse_size("150%", 100).is_err());
    }
}
