//! Bulk loading for `cirro load` and `cirro tpch`: a whole table from a
//! stream of batches, all rows or nothing.

use cirro_common::{CirroError, Result, SqlState};
use futures::StreamExt;

use crate::Engine;
use crate::statement::{analyze, copy, ddl};

impl Engine {
    /// Load `batches` into a new table `schema_name.name` of the current
    /// database: all rows or nothing. With `replace`, an existing table of that
    /// name is replaced atomically; without it, an existing table gives 42P07.
    /// The loaded table is then analyzed (`ANALYZE`).
    pub async fn load_table<S>(
        &self,
        schema_name: &str,
        name: &str,
        table_schema: &arrow::datatypes::Schema,
        batches: S,
        replace: bool,
    ) -> Result<u64>
    where
        S: futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin,
    {
        self.catalog.refresh().await?;
        let db = self.default_database();
        let rows = ddl::create_with_data(
            self,
            &db,
            schema_name,
            name,
            table_schema,
            &cirro_storage::TableOptions::default(),
            Some(batches),
            replace,
        )
        .await?;
        // The planner's estimates (join order) read the statistics; the
        // table is loaded whether or not they could be taken.
        if let Err(e) = analyze::analyze_table(self, &db, schema_name, name).await {
            log::warn!("ANALYZE {schema_name}.{name} after loading it failed: {e}");
        }
        Ok(rows)
    }

    /// Fail with 42P07 if any of `names` exists in `schema_name` (and 3F000 if
    /// the schema does not exist), unless `replace`.
    pub async fn check_new_tables(
        &self,
        schema_name: &str,
        names: &[&str],
        replace: bool,
    ) -> Result<()> {
        let snapshot = self.catalog.refresh().await?;
        let schema = snapshot.schema(&self.default_database(), schema_name)?;
        for name in names {
            if schema.views.contains_key(*name) || schema.tables.contains_key(*name) && !replace {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{name}\" already exists (use --replace to replace it)"),
                ));
            }
        }
        Ok(())
    }

    /// Stream the rows of a delimited text file with the given column types
    /// (dbgen `.tbl` files with a trailing delimiter included).
    pub async fn read_delimited(
        &self,
        path: &str,
        table_schema: &arrow::datatypes::Schema,
        delimiter: u8,
        header: bool,
    ) -> Result<impl futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin + use<>>
    {
        let frame = copy::read_delimited(self, path, table_schema, delimiter, header).await?;
        Ok(frame
            .execute_stream()
            .await?
            .map(|b| b.map_err(CirroError::from)))
    }
}
