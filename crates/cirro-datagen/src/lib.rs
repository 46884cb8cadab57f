//! Benchmark data generators: TPC-H (through the `tpchgen` crates, identical to
//! the official dbgen) and the Star Schema Benchmark (our own generator, after
//! the SSB specification). Each table comes as a schema, a row-count estimate
//! for progress reporting, and a lazily started iterator of record batches, so
//! loaders stream without holding a table in memory.

pub mod ssb;
pub mod tpch;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;

/// Batches of one generated table.
pub type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send>;

/// One table of a generated data set.
pub struct GeneratedTable {
    pub name: &'static str,
    pub schema: SchemaRef,
    /// Rows the generator will produce (exact or, for TPC-H lineitem, close).
    pub rows_estimate: u64,
    /// Start generating.
    pub batches: Box<dyn FnOnce() -> BatchIter + Send>,
}

impl std::fmt::Debug for GeneratedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedTable")
            .field("name", &self.name)
            .field("rows", &self.rows_estimate)
            .finish()
    }
}

/// Refuse scale factors that make no sense.
pub fn check_scale_factor(sf: f64) -> Result<(), String> {
    if !(sf.is_finite() && sf > 0.0 && sf <= 100_000.0) {
        return Err(format!(
            "scale factor must be a positive number up to 100000, got {sf}"
        ));
    }
    Ok(())
}
