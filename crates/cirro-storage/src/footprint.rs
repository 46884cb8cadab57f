//! What a table occupies on storage: data files, bytes, deletion vectors,
//! and how well Parquet compressed it (the console's storage view).

use std::sync::Arc;

use cirro_common::{CirroError, Result};
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::table::CirroTable;

/// Bytes read from a file's end at first: most footers fit.
const FOOTER_GUESS: u64 = 64 * 1024;

/// Footers read per table for the compression ratio: enough for a stable
/// ratio, few enough that the view stays cheap on tables of many files.
const FOOTERS_SAMPLED: usize = 32;

/// One table's storage figures (its current snapshot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Footprint {
    pub files: u64,
    /// Bytes of its data files.
    pub bytes: u64,
    /// Rows stored, deleted ones included (None: a file without statistics).
    pub stored_rows: Option<u64>,
    /// Files with a deletion vector, and the rows those delete.
    pub files_with_deletion_vectors: u64,
    pub deleted_rows: u64,
    /// Uncompressed over compressed bytes of the column chunks, from the
    /// footers of up to [`FOOTERS_SAMPLED`] files (None: no files).
    pub compression_ratio: Option<f64>,
}

impl CirroTable {
    /// The table's storage figures; reads a sample of Parquet footers.
    pub async fn footprint(&self) -> Result<Footprint> {
        let files = self.files();
        let mut figures = Footprint {
            files: files.len() as u64,
            bytes: files.iter().map(|f| f.size).sum(),
            stored_rows: files
                .iter()
                .try_fold(0u64, |sum, f| Some(sum + f.num_records? as u64)),
            files_with_deletion_vectors: files
                .iter()
                .filter(|f| f.deletion_vector().is_some())
                .count() as u64,
            deleted_rows: files.iter().map(|f| f.deleted_rows()).sum(),
            compression_ratio: None,
        };
        let store = self.delta().log_store().object_store(None);
        // Owned: the futures must not borrow the snapshot's files.
        let sample: Vec<(String, u64, String)> = files
            .iter()
            .take(FOOTERS_SAMPLED)
            .map(|f| (f.add.path.clone(), f.size, f.url.clone()))
            .collect();
        let sampled = futures::stream::iter(sample)
            .map(|(path, size, url)| {
                let store = Arc::clone(&store);
                async move {
                    let metadata = read_footer(store.as_ref(), &path, size)
                        .await
                        .map_err(|e| {
                            CirroError::io(format!("cannot read the footer of {url}: {e}"))
                        })?;
                    let (mut compressed, mut uncompressed) = (0u64, 0u64);
                    for group in metadata.row_groups() {
                        for column in group.columns() {
                            compressed += column.compressed_size().max(0) as u64;
                            uncompressed += column.uncompressed_size().max(0) as u64;
                        }
                    }
                    Ok::<_, CirroError>((compressed, uncompressed))
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        let (mut compressed, mut uncompressed) = (0u64, 0u64);
        for sample in sampled {
            let (c, u) = sample?;
            compressed += c;
            uncompressed += u;
        }
        if compressed > 0 {
            figures.compression_ratio = Some(uncompressed as f64 / compressed as f64);
        }
        Ok(figures)
    }
}

/// The Parquet footer of the file at `path` (`size` bytes): its last
/// [`FOOTER_GUESS`] bytes, then more if the footer is larger.
async fn read_footer(
    store: &dyn ObjectStore,
    path: &str,
    size: u64,
) -> std::result::Result<ParquetMetaData, String> {
    let path = object_store::path::Path::from_url_path(path).map_err(|e| e.to_string())?;
    let mut want = FOOTER_GUESS.min(size);
    loop {
        let bytes = store
            .get_range(&path, size - want..size)
            .await
            .map_err(|e| e.to_string())?;
        let mut reader = ParquetMetaDataReader::new();
        match reader.try_parse_sized(&bytes, size) {
            Ok(()) => return reader.finish().map_err(|e| e.to_string()),
            Err(ParquetError::NeedMoreData(needed))
                if (needed as u64) > want && (needed as u64) <= size =>
            {
                want = needed as u64;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
