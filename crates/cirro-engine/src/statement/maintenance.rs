//! `OPTIMIZE t` and `VACUUM t [RETAIN n HOURS]` (see
//! `cirro_storage::maintenance`), and the dispatch of every maintenance
//! statement.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array};
use cirro_common::Result;
use cirro_sql::Maintenance;

use crate::statement::history::{
    VACUUM_RETAIN_HOURS_DEFAULT, describe_history, result_schema, rows,
};
use crate::statement::time_travel::location_of;
use crate::{Engine, Outcome};

/// Run a maintenance statement.
pub(crate) async fn run_maintenance(engine: &Engine, statement: Maintenance) -> Result<Outcome> {
    match &statement {
        Maintenance::Analyze(tables) => {
            crate::statement::analyze::run_analyze(engine, tables).await
        }
        Maintenance::CancelQuery(id) => crate::system::queries::cancel_query(engine, *id).await,
        Maintenance::History(reference) => {
            let (db, schema, name) = engine.resolve(&reference);
            engine.check_table(&db, &schema, &name, cirro_catalog::Privilege::Select)?;
            describe_history(engine, reference).await
        }
        Maintenance::Optimize(reference) => {
            engine.check_transaction_allows("OPTIMIZE")?;
            let (db, schema, name) = engine.resolve(reference);
            engine.check_owner(&db, &schema, &name, "OPTIMIZE it")?;
            let location = location_of(engine, &db, &schema, &name)?;
            let table = engine.catalog.open_table(&location).await?;
            let state = engine.context().state();
            let summary = cirro_storage::maintenance::optimize(&table, &state).await?;
            engine.node.cache().forget_files(&summary.replaced);
            let schema = result_schema(&statement);
            let columns: Vec<ArrayRef> = [
                summary.files_removed,
                summary.files_added,
                summary.deletion_vectors_removed,
                summary.rows_written,
            ]
            .into_iter()
            .map(|v| Arc::new(Int64Array::from(vec![v as i64])) as ArrayRef)
            .collect();
            rows(engine, schema, columns).await
        }
        Maintenance::Vacuum(reference, hours) => {
            engine.check_transaction_allows("VACUUM")?;
            let (db, schema, name) = engine.resolve(reference);
            engine.check_owner(&db, &schema, &name, "VACUUM it")?;
            let deleted = vacuum_table(
                engine,
                &db,
                &schema,
                &name,
                hours.unwrap_or(VACUUM_RETAIN_HOURS_DEFAULT),
            )
            .await?;
            let schema = result_schema(&statement);
            let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![deleted as i64]))];
            rows(engine, schema, columns).await
        }
        Maintenance::VacuumTables { tables, analyze } => {
            // PostgreSQL's statement, PostgreSQL's error (25001).
            crate::statement::ddl::refuse_in_transaction(engine, "VACUUM")?;
            let targets = crate::statement::analyze::owned_tables(engine, tables, "VACUUM it")?;
            for (db, schema, name) in &targets {
                vacuum_table(engine, db, schema, name, VACUUM_RETAIN_HOURS_DEFAULT).await?;
                if *analyze {
                    crate::statement::analyze::analyze_table(engine, db, schema, name).await?;
                }
            }
            Ok(Outcome::command("VACUUM"))
        }
    }
}

/// `VACUUM` of one table: the files no version of the last `hours` reads
/// deleted (and forgotten by this node's disk tier); how many.
async fn vacuum_table(
    engine: &Engine,
    db: &str,
    schema: &str,
    name: &str,
    hours: u64,
) -> Result<u64> {
    let location = location_of(engine, db, schema, name)?;
    let table = engine.catalog.open_table(&location).await?;
    let vacuumed = cirro_storage::maintenance::vacuum(&table, hours).await?;
    if let Some(disk) = engine.node.disk() {
        for file in &vacuumed.removed {
            disk.forget(file);
        }
    }
    Ok(vacuumed.deleted as u64)
}
