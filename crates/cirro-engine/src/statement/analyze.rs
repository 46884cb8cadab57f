//! `ANALYZE [t, …]`: collect a table's statistics (rows; per column, NULLs
//! and the estimated distinct values) and keep them in its catalog entry
//! (see `cirro_storage::stats`), from where its scans report them to the
//! planner. `ANALYZE` alone analyzes every table of the session's database
//! that the user owns (PostgreSQL's: those it may analyze); naming a table
//! the user does not own is 42501. `SELECT * FROM cirro.statistics` shows
//! what is kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type, UInt64Type};
use cirro_catalog::state::now_ms;
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::stats::{ColumnStatistics, TableStatistics};
use datafusion::common::{Column, TableReference};
use datafusion::functions_aggregate::expr_fn::{approx_distinct, count};
use datafusion::logical_expr::{Expr, lit};

use crate::statement::time_travel::location_of;
use crate::{Engine, Outcome};

/// Run `ANALYZE` over `tables` (none: every table of the database the user
/// owns).
pub(crate) async fn run_analyze(engine: &Engine, tables: &[TableReference]) -> Result<Outcome> {
    engine.check_transaction_allows("ANALYZE")?;
    for (db, schema, name) in owned_tables(engine, tables, "ANALYZE it")? {
        analyze_table(engine, &db, &schema, &name).await?;
    }
    Ok(Outcome::command("ANALYZE"))
}

/// The tables a maintenance statement names, each checked to exist and to
/// be the user's (`what` for the error: "ANALYZE it"); no names: every
/// table of the session's database that the user owns.
pub(crate) fn owned_tables(
    engine: &Engine,
    tables: &[TableReference],
    what: &str,
) -> Result<Vec<(String, String, String)>> {
    Ok(if tables.is_empty() {
        let db = engine.default_database();
        let snapshot = engine.snapshot();
        let database = snapshot.database(&db)?;
        database
            .schemas
            .iter()
            .flat_map(|(schema, entry)| {
                entry
                    .tables
                    .keys()
                    .map(|name| (db.clone(), schema.clone(), name.clone()))
            })
            .filter(|(db, schema, name)| engine.check_owner(db, schema, name, "").is_ok())
            .collect()
    } else {
        let mut targets = Vec::with_capacity(tables.len());
        for table in tables {
            let (db, schema, name) = engine.resolve(table);
            location_of(engine, &db, &schema, &name)?;
            engine.check_owner(&db, &schema, &name, what)?;
            targets.push((db, schema, name));
        }
        targets
    })
}

/// Whether DataFusion's `approx_distinct` takes values of this type.
fn estimable(data_type: &DataType) -> bool {
    !matches!(
        data_type,
        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Null
    ) && !data_type.is_nested()
}

pub(crate) async fn analyze_table(
    engine: &Engine,
    db: &str,
    schema: &str,
    name: &str,
) -> Result<()> {
    let location = location_of(engine, db, schema, name)?;
    let table = engine.catalog.open_table(&location).await?;
    let version = table.version();
    let fields = table.table_schema().fields().clone();
    // ANALYZE reads every column once: through the hot-data tier it would
    // fill the tier with columns no query asked for (and `cirro load`, which
    // analyzes what it loads, would hold a table's decoded columns).
    let mut state = engine.context().state();
    state
        .config_mut()
        .options_mut()
        .set("cirro_cache.enabled", "false")?;
    let frame =
        datafusion::prelude::SessionContext::new_with_state(state).read_table(Arc::new(table))?;
    let mut aggregates = vec![count(lit(1)).alias("rows")];
    for (i, field) in fields.iter().enumerate() {
        let column = Expr::Column(Column::from_name(field.name()));
        aggregates.push(count(column.clone()).alias(format!("n{i}")));
        if estimable(field.data_type()) {
            aggregates.push(approx_distinct(column).alias(format!("d{i}")));
        }
    }
    let batches = frame.aggregate(vec![], aggregates)?.collect().await?;
    let batch = batches
        .iter()
        .find(|b| b.num_rows() == 1)
        .ok_or_else(|| CirroError::internal("ANALYZE's aggregation returned no row"))?;
    let int = |name: &str| -> Option<u64> {
        let column = batch.column_by_name(name)?;
        if column.is_null(0) {
            return None;
        }
        match column.data_type() {
            DataType::Int64 => Some(column.as_primitive::<Int64Type>().value(0).max(0) as u64),
            DataType::UInt64 => Some(column.as_primitive::<UInt64Type>().value(0)),
            _ => None,
        }
    };
    let rows = int("rows").unwrap_or(0);
    let columns: BTreeMap<String, ColumnStatistics> = fields
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let non_null = int(&format!("n{i}")).unwrap_or(0);
            let statistics = ColumnStatistics {
                nulls: rows.saturating_sub(non_null),
                // the estimate never above the non-NULL values
                distinct: int(&format!("d{i}")).map(|d| d.min(non_null)),
            };
            (field.name().to_string(), statistics)
        })
        .collect();
    let statistics = TableStatistics {
        version,
        analyzed_ms: now_ms(),
        rows,
        columns,
    };
    engine
        .catalog
        .commit(
            |state| match state.schema_mut(db, schema)?.tables.get_mut(name) {
                Some(entry) if entry.location == location => {
                    entry.statistics = Some(statistics.clone());
                    Ok(())
                }
                _ => Err(CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("relation \"{name}\" was dropped or replaced while ANALYZE ran"),
                )),
            },
        )
        .await?;
    Ok(())
}
