//! Schema changes (ALTER TABLE): one Delta commit that replaces the table's
//! metadata, and for changes old files cannot be read under, its files.
//!
//! ```text
//!  ADD COLUMN (nullable), SET/DROP NOT NULL  ──► metadata          (old files read as they are)
//!  DROP/RENAME COLUMN, ALTER COLUMN TYPE     ──► metadata + remove every file + add rewritten files
//! ```
//!
//! A column added to the metadata only is NULL in the files written before it
//! (every Delta reader fills a column a file lacks with NULLs). Dropping,
//! renaming or retyping a column would need Delta's column mapping or type
//! widening features, which DuckDB's delta extension and older `deltalake`
//! readers lack, so the table's live rows are rewritten under the new schema
//! instead, in the same commit (deletion vectors are applied on the way, so
//! the rewritten table carries none). Old files stay for time travel until
//! VACUUM.
//!
//! The commit is exclusive ([`crate::write::commit_exclusive`]): if any
//! writer committed after the snapshot the change read, it fails with 40001
//! and changes nothing, so no row written under the old schema slips in
//! unconverted. In a transaction the change is staged instead
//! ([`prepare_schema_change`]): the transaction's view of the table takes
//! the new schema, and COMMIT makes the one exclusive commit.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use cirro_common::{CirroError, Result};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::{Action, MetadataExt, StructType};
use deltalake::protocol::DeltaOperation;
use futures::Stream;

use crate::failpoint;
use crate::mutate::{Change, remove_of};
use crate::options::TableOptions;
use crate::schema::storage_schema;
use crate::table::CirroTable;
use crate::write::{Committed, TableWriter, fill};

/// Change `table` (at the snapshot it holds) to `schema` and `options` in one
/// commit. `rows`, if given, are the table's rows under the new schema (by
/// position), and replace all of its files; without them only the metadata
/// changes.
pub async fn change_schema<S>(
    table: &CirroTable,
    schema: &Schema,
    options: &TableOptions,
    rows: Option<S>,
    operation: DeltaOperation,
) -> Result<Committed>
where
    S: Stream<Item = Result<RecordBatch>> + Unpin,
{
    let change = prepare_schema_change(table, schema, options, rows).await?;
    failpoint::reach("alter.before_commit", 1);
    change.commit(operation).await
}

/// Write what changing `table` (a snapshot, or a transaction's view of it)
/// to `schema` and `options` needs (see [`change_schema`]) and return the
/// change, uncommitted: a metadata action, and with `rows` the removes of
/// every file and the adds of the rewritten ones. Its commit is exclusive
/// ([`Change::commit`]).
pub async fn prepare_schema_change<S>(
    table: &CirroTable,
    schema: &Schema,
    options: &TableOptions,
    rows: Option<S>,
) -> Result<Change>
where
    S: Stream<Item = Result<RecordBatch>> + Unpin,
{
    let stored = storage_schema(schema)?;
    let kernel: StructType = stored.as_ref().try_into_kernel().map_err(|e| {
        CirroError::unsupported(format!("cannot store this schema as a Delta table: {e}"))
    })?;
    let mut metadata = table
        .delta()
        .snapshot()?
        .metadata()
        .clone()
        .with_schema(&kernel)
        .map_err(bad_metadata)?;
    // The entries TableOptions owns are replaced whole; others are kept.
    let old_keys: Vec<String> = metadata
        .configuration()
        .keys()
        .filter(|k| crate::options::is_option_key(k))
        .cloned()
        .collect();
    for key in old_keys {
        metadata = metadata.remove_config_key(&key).map_err(bad_metadata)?;
    }
    for (key, value) in options.to_configuration() {
        metadata = metadata.add_config_key(key, value).map_err(bad_metadata)?;
    }
    let mut actions = vec![Action::Metadata(metadata)];
    let mut adds = Vec::new();
    if let Some(mut rows) = rows {
        let mut writer = TableWriter::with_new_schema(table.delta(), Arc::clone(&stored), options)?;
        fill(&mut writer, &mut rows).await?;
        adds = writer.finish().await?;
        actions.extend(table.files().iter().map(|f| Action::Remove(remove_of(f))));
        actions.extend(adds.iter().cloned().map(Action::Add));
    }
    Ok(Change::new(table, actions, &adds))
}

fn bad_metadata(e: deltalake::kernel::Error) -> CirroError {
    CirroError::internal(format!("cannot build the table's new metadata: {e}"))
}
