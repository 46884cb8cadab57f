//! Batches that own the bytes they hold.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch};
use arrow::datatypes::{ByteViewType, DataType};
use arrow::error::ArrowError;

/// `batch` with each string or binary view column that holds more than
/// `small` bytes of data buffers, and over twice what its rows use, copied
/// into buffers of its own (`gc`). Views point into the buffers they were
/// read or built from, and neither a slice, a concatenation nor a copy
/// (`MutableArrayData`) drops those buffers, while Arrow's IPC writer writes
/// all of them:
/// - a Flight reply of TPC-H Q10 at SF10 (20 rows of customers' names,
///   addresses and comments left by the top-k) became one 99 MB message
///   that the client refused (gRPC's 16 MB limit);
/// - a write-ahead log record of an INSERT of 1,000 rows of VALUES (each
///   row a one-row slice of the statement's batch, concatenated) held the
///   statement's strings 1,000 times: 7 MB instead of 30 KB.
pub fn own_view_data(batch: RecordBatch, small: usize) -> Result<RecordBatch, ArrowError> {
    fn wasteful<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>, small: usize) -> bool {
        let held: usize = array.data_buffers().iter().map(|b| b.len()).sum();
        held > small && held > 2 * array.total_buffer_bytes_used()
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    let mut changed = false;
    for column in batch.columns() {
        let collected: Option<ArrayRef> = match column.data_type() {
            DataType::Utf8View => {
                let array = column.as_string_view();
                wasteful(array, small).then(|| Arc::new(array.gc()) as ArrayRef)
            }
            DataType::BinaryView => {
                let array = column.as_binary_view();
                wasteful(array, small).then(|| Arc::new(array.gc()) as ArrayRef)
            }
            _ => None,
        };
        changed |= collected.is_some();
        columns.push(collected.unwrap_or_else(|| Arc::clone(column)));
    }
    if !changed {
        return Ok(batch);
    }
    RecordBatch::try_new(batch.schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::datatypes::{Field, Schema};

    fn held(batch: &RecordBatch) -> usize {
        batch
            .column(0)
            .as_string_view()
            .data_buffers()
            .iter()
            .map(|b| b.len())
            .sum()
    }

    #[test]
    fn slices_concatenated_keep_only_their_own_strings() {
        let values: Vec<String> = (0..1000)
            .map(|i| format!("a string longer than twelve {i}"))
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let array: ArrayRef = Arc::new(StringViewArray::from_iter_values(values.iter()));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![array]).unwrap();
        let slices: Vec<RecordBatch> = (0..1000).map(|i| batch.slice(i, 1)).collect();
        let joined = arrow::compute::concat_batches(&schema, &slices).unwrap();
        let whole = held(&batch);
        assert!(
            held(&joined) >= 100 * whole,
            "the case this is for: every slice's buffer"
        );
        let owned = own_view_data(joined.clone(), 0).unwrap();
        assert!(held(&owned) <= whole, "{} > {whole}", held(&owned));
        assert_eq!(owned, joined);
        // Under the threshold, or not wasteful: the same batch.
        let kept = own_view_data(batch.clone(), 0).unwrap();
        assert!(Arc::ptr_eq(kept.column(0), batch.column(0)));
        let small = own_view_data(batch.slice(0, 2), whole).unwrap();
        assert_eq!(held(&small), whole);
    }
}
