//! `CREATE [UNIQUE] INDEX` and `DROP INDEX`.
//!
//! An index on a Cirro table is a key (columns, each ASC or DESC) that the
//! table's data files are sorted by, plus a Parquet bloom filter on each key
//! column in every row group (see `cirro_storage::options`). CREATE INDEX
//! rewrites the table's live rows sorted by the key, with the bloom filters,
//! in one exclusive commit together with the index's definition; every later
//! write sorts its new files by the key and adds the filters. A lookup by
//! `key = v` or `key IN (…)` then reads only the files and row groups whose
//! min/max range and bloom filter admit a value: EXPLAIN ANALYZE shows them
//! (`files_ranges_pruned_statistics`, `row_groups_pruned_statistics`,
//! `row_groups_pruned_bloom_filter`: total → matched). A UNIQUE index also
//! refuses duplicate keys on every write (23505, see constraints.rs).
//!
//! A table's write order is its cluster key if it has one, else its primary
//! key, else its first index created; other indexes add bloom filters only.
//! Index names share the namespace of the schema's tables and views, as in
//! PostgreSQL. DROP INDEX changes the table's metadata only: files keep
//! their bloom filters, which nothing reads without the index.

use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::CirroTable;
use cirro_storage::options::{ConstraintDef, ConstraintKind, IndexDef, KeyColumn};
use datafusion::common::{Column, TableReference};
use datafusion::logical_expr::Expr;
use datafusion::sql::sqlparser::ast::{CreateIndex, Expr as SqlExpr, IndexType, ObjectName};
use deltalake::protocol::{DeltaOperation, SaveMode};
use futures::StreamExt;

use crate::statement::alter::ident_name;
use crate::statement::constraints::{free_name, validate_rows};
use crate::statement::time_travel::location_of;
use crate::{Engine, Outcome};

fn reference(name: &ObjectName) -> Result<TableReference> {
    Ok(datafusion::sql::planner::object_name_to_table_reference(
        name.clone(),
        true,
    )?)
}

/// The tables of schema `db.schema`, opened: (name, location, table).
async fn schema_tables(
    engine: &Engine,
    db: &str,
    schema: &str,
) -> Result<Vec<(String, String, CirroTable)>> {
    let snapshot = engine.snapshot();
    let entries: Vec<(String, String)> = snapshot
        .schema(db, schema)?
        .tables
        .iter()
        .map(|(name, entry)| (name.clone(), entry.location.clone()))
        .collect();
    let mut tables = Vec::new();
    for (name, location) in entries {
        let table = engine.table_to_alter(&location).await?;
        tables.push((name, location, table));
    }
    Ok(tables)
}

/// Names an index could clash with in a schema: its relations, indexes and
/// key constraints (which PostgreSQL backs by indexes of the same name).
fn taken_names(
    engine: &Engine,
    db: &str,
    schema: &str,
    tables: &[(String, String, CirroTable)],
) -> Result<Vec<String>> {
    let snapshot = engine.snapshot();
    let entry = snapshot.schema(db, schema)?;
    let mut names: Vec<String> = entry
        .tables
        .keys()
        .chain(entry.views.keys())
        .cloned()
        .collect();
    for (_, _, table) in tables {
        names.extend(table.options().indexes.iter().map(|i| i.name.clone()));
        names.extend(
            table
                .options()
                .constraints
                .iter()
                .filter(|c| c.key().is_some())
                .map(|c| c.name.clone()),
        );
    }
    Ok(names)
}

/// What Cirro's indexes (sorted keys with bloom filters) do not have.
fn refuse_unsupported(create: &CreateIndex) -> Result<()> {
    if !create.include.is_empty() {
        return Err(CirroError::unsupported(
            "INCLUDE columns are not supported: an index holds its key columns only",
        ));
    }
    if create.predicate.is_some() {
        return Err(CirroError::unsupported(
            "partial indexes (WHERE) are not supported",
        ));
    }
    if create.nulls_distinct == Some(false) {
        return Err(CirroError::unsupported(
            "NULLS NOT DISTINCT is not supported",
        ));
    }
    if let Some(using) = &create.using
        && !matches!(
            using,
            IndexType::BTree | IndexType::Hash | IndexType::BRIN | IndexType::Bloom
        )
    {
        return Err(CirroError::unsupported(format!(
            "index method {using} is not supported (Cirro's indexes are sorted keys with bloom filters: btree, hash, brin, bloom)"
        )));
    }
    Ok(())
}

/// The index's key: columns of the table, each ascending or descending.
fn key_columns(create: &CreateIndex, table: &CirroTable) -> Result<Vec<KeyColumn>> {
    let mut columns = Vec::new();
    for column in &create.columns {
        let SqlExpr::Identifier(ident) = &column.column.expr else {
            return Err(CirroError::unsupported(format!(
                "indexes on expressions are not supported (\"{}\"): index columns",
                column.column.expr
            )));
        };
        let name = ident_name(ident);
        if table.table_schema().field_with_name(&name).is_err() {
            return Err(CirroError::new(
                SqlState::UNDEFINED_COLUMN,
                format!("column \"{name}\" does not exist"),
            ));
        }
        columns.push(KeyColumn {
            name,
            descending: column.column.options.asc == Some(false),
        });
    }
    if columns.is_empty() {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "an index needs at least one column",
        ));
    }
    Ok(columns)
}

/// `CREATE [UNIQUE] INDEX`: the table's rows rewritten in the index's
/// order, in one commit with the index's definition.
pub(crate) async fn create_index(engine: &Engine, create: &CreateIndex) -> Result<Outcome> {
    refuse_unsupported(create)?;
    let table_ref = reference(&create.table_name)?;
    let (db, schema, table_name) = engine.resolve(&table_ref);
    let snapshot = engine.snapshot();
    if snapshot.view(&db, &schema, &table_name).is_some() {
        return Err(CirroError::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("\"{table_name}\" is a view; indexes are on tables only"),
        ));
    }
    let location = location_of(engine, &db, &schema, &table_name)?;
    engine.check_owner(&db, &schema, &table_name, "index it")?;
    let table = engine.table_to_alter(&location).await?;
    let columns = key_columns(create, &table)?;
    let tables = schema_tables(engine, &db, &schema).await?;
    let taken = taken_names(engine, &db, &schema, &tables)?;
    let name = match &create.name {
        Some(given) => {
            let name = reference(given)?.table().to_string();
            if taken.contains(&name) {
                if create.if_not_exists {
                    return Ok(Outcome::with_notice(
                        "CREATE INDEX",
                        format!("relation \"{name}\" already exists, skipping"),
                    ));
                }
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{name}\" already exists"),
                ));
            }
            name
        }
        None => {
            let stem = format!(
                "{table_name}_{}_idx",
                columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join("_")
            );
            free_name(&stem, |n| taken.iter().any(|t| t == n))
        }
    };
    let index = IndexDef {
        name: name.clone(),
        columns,
        unique: create.unique,
        seq: table
            .options()
            .indexes
            .iter()
            .map(|i| i.seq + 1)
            .max()
            .unwrap_or(0),
    };
    let frame = engine
        .context()
        .read_table(std::sync::Arc::new(table.clone()))?;
    if index.unique {
        let key = index.columns.iter().map(|c| c.name.clone()).collect();
        let as_constraint = ConstraintDef {
            name: index.name.clone(),
            kind: ConstraintKind::Unique(key),
        };
        validate_rows(&frame, &table_name, &as_constraint).await?;
    }
    let mut options = table.options().clone();
    options.indexes.push(index.clone());
    // The live rows, sorted by the table's (possibly new) write order.
    let order: Vec<_> = options
        .write_order()
        .iter()
        .map(|k| Expr::Column(Column::from_name(&k.name)).sort(!k.descending, k.descending))
        .collect();
    let rows = frame
        .sort(order)?
        .execute_stream()
        .await?
        .map(|b| b.map_err(CirroError::from));
    let operation = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: None,
        predicate: Some(index.definition(&table_name)),
    };
    engine
        .change_table_schema(
            &location,
            &table_name,
            &table,
            table.stored_schema(),
            &options,
            Some(rows),
            operation,
        )
        .await?;
    Ok(Outcome::command("CREATE INDEX"))
}

pub(crate) async fn drop_index(
    engine: &Engine,
    names: &[ObjectName],
    if_exists: bool,
) -> Result<Outcome> {
    let mut notices = Vec::new();
    for name in names {
        let index_ref = reference(name)?;
        // An index lives in its table's schema: resolve as a relation.
        let (db, schema, index_name) = engine.resolve(&index_ref);
        let tables = schema_tables(engine, &db, &schema).await?;
        let owner = tables
            .iter()
            .find(|(_, _, t)| t.options().indexes.iter().any(|i| i.name == index_name));
        let Some((table_name, location, table)) = owner else {
            if let Some((table_name, _, _)) = tables.iter().find(|(_, _, t)| {
                t.options()
                    .constraints
                    .iter()
                    .any(|c| c.key().is_some() && c.name == index_name)
            }) {
                return Err(CirroError::new(
                    SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                    format!(
                        "cannot drop index {index_name} because constraint {index_name} on table {table_name} requires it (use ALTER TABLE {table_name} DROP CONSTRAINT {index_name})"
                    ),
                ));
            }
            if if_exists {
                notices.push(format!("index \"{index_name}\" does not exist, skipping"));
                continue;
            }
            return Err(CirroError::new(
                SqlState::UNDEFINED_OBJECT,
                format!("index \"{index_name}\" does not exist"),
            ));
        };
        engine.check_owner(&db, &schema, table_name, "drop its index")?;
        let table = table.without_row_ids();
        let mut options = table.options().clone();
        options.indexes.retain(|i| i.name != index_name);
        let operation = DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: None,
            predicate: Some(format!("DROP INDEX {index_name}")),
        };
        engine
            .change_table_schema::<futures::stream::Empty<Result<_>>>(
                location,
                table_name,
                &table,
                table.stored_schema(),
                &options,
                None,
                operation,
            )
            .await?;
    }
    Ok(if notices.is_empty() {
        Outcome::command("DROP INDEX")
    } else {
        Outcome::with_notice("DROP INDEX", notices.join("\n"))
    })
}

impl Engine {
    /// What psql's `\d table` prints under the columns: the table's indexes
    /// (with the keys of its PRIMARY KEY and UNIQUE constraints) and CHECK
    /// constraints. Empty for a view, or a table with neither.
    pub async fn describe_footer(&self, table: &str) -> Result<Vec<String>> {
        use cirro_storage::options::ConstraintKind;
        let (db, schema, name) = self.resolve(&TableReference::from(table));
        let Ok(location) = location_of(self, &db, &schema, &name) else {
            return Ok(Vec::new());
        };
        let options = self
            .catalog()
            .open_table(&location)
            .await?
            .options()
            .clone();
        let mut indexes: Vec<String> = options
            .constraints
            .iter()
            .filter(|c| c.key().is_some())
            .map(|c| format!("    \"{}\" {}", c.name, c.definition()))
            .collect();
        indexes.extend(options.indexes.iter().map(|i| {
            let columns: Vec<String> = i
                .columns
                .iter()
                .map(|c| format!("{}{}", c.name, if c.descending { " DESC" } else { "" }))
                .collect();
            let unique = if i.unique { " UNIQUE," } else { "" };
            format!("    \"{}\"{unique} ({})", i.name, columns.join(", "))
        }));
        let checks: Vec<String> = options
            .constraints
            .iter()
            .filter(|c| matches!(c.kind, ConstraintKind::Check(_)))
            .map(|c| format!("    \"{}\" {}", c.name, c.definition()))
            .collect();
        let mut lines = Vec::new();
        if !indexes.is_empty() {
            lines.push("Indexes:".to_string());
            lines.extend(indexes);
        }
        if !checks.is_empty() {
            lines.push("Check constraints:".to_string());
            lines.extend(checks);
        }
        Ok(lines)
    }
}
