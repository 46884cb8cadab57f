//! Storage figures of the tables a session may read (the console's storage
//! view): the same privilege check as `SELECT`, then each table's files,
//! bytes, deletion vectors and compression ratio.

use cirro_catalog::users::Privilege;
use cirro_common::Result;
use cirro_storage::footprint::Footprint;

use crate::Engine;

/// One table's storage figures.
#[derive(Clone, Debug)]
pub struct TableStorage {
    pub database: String,
    pub schema: String,
    pub table: String,
    pub version: i64,
    pub footprint: Footprint,
}

impl Engine {
    /// Storage figures of every table the session may `SELECT` from, in
    /// name order (tables it may not read are left out, as
    /// `information_schema` leaves them out in PostgreSQL).
    pub async fn table_storage(&self) -> Result<Vec<TableStorage>> {
        let snapshot = self.catalog.refresh().await?;
        let mut out = Vec::new();
        for (db, database) in &snapshot.databases {
            for (schema, entry) in &database.schemas {
                for (name, table) in &entry.tables {
                    if !self.holds(table, Privilege::Select) {
                        continue;
                    }
                    let opened = self.catalog.open_table(&table.location).await?;
                    out.push(TableStorage {
                        database: db.clone(),
                        schema: schema.clone(),
                        table: name.clone(),
                        version: opened.version(),
                        footprint: opened.footprint().await?,
                    });
                }
            }
        }
        Ok(out)
    }
}
