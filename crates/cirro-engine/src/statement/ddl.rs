//! CREATE/DROP of databases, schemas and tables: each one catalog commit.

use std::sync::Arc;

use arrow::datatypes::{Field, Schema};
use cirro_catalog::state::{DatabaseEntry, SchemaEntry, now_ms};
use cirro_catalog::{Catalog, TableEntry};
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::table::create_delta_table;
use cirro_storage::write::write_stream;
use cirro_storage::{CirroTable, TableOptions};
use datafusion::common::SchemaReference;
use datafusion::common::TableReference;
use datafusion::logical_expr::{CreateMemoryTable, DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, ObjectName, ObjectType, Statement as SqlStatement,
};
use deltalake::protocol::SaveMode;
use futures::StreamExt;

use crate::{Engine, Outcome};

fn duplicate_relation(name: &str) -> CirroError {
    CirroError::new(
        SqlState::DUPLICATE_TABLE,
        format!("relation \"{name}\" already exists"),
    )
}

pub(crate) async fn create_table(
    engine: &Engine,
    cmd: CreateMemoryTable,
    options: &[(String, String)],
    constraints: Vec<cirro_storage::options::ConstraintDef>,
    distributed_by: Option<cirro_sql::DistributedBy>,
) -> Result<Outcome> {
    let (db, schema, name) = engine.resolve(&cmd.name);
    let snapshot = engine.snapshot();
    let existing = snapshot.schema(&db, &schema)?;
    if existing.relation_exists(&name) {
        if cmd.if_not_exists {
            return Ok(Outcome::with_notice(
                "CREATE TABLE",
                format!("relation \"{name}\" already exists, skipping"),
            ));
        }
        if !cmd.or_replace || existing.views.contains_key(&name) {
            return Err(duplicate_relation(&name));
        }
    }
    if cmd.temporary {
        return Err(CirroError::unsupported(
            "temporary tables are not supported",
        ));
    }
    if let Some((column, _)) = cmd.column_defaults.first() {
        // Refused rather than ignored: an ignored DEFAULT would store NULLs.
        return Err(CirroError::unsupported(format!(
            "column defaults are not supported yet (DEFAULT on \"{column}\")"
        )));
    }
    let is_query =
        !matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(e) if !e.produce_one_row);
    let planned = cmd.input.schema().as_arrow().clone();
    // Columns of CREATE TABLE AS take the query's types but are nullable, as in PostgreSQL.
    let columns: Vec<Field> = planned
        .fields()
        .iter()
        .map(|f| {
            let field = Field::new(f.name(), f.data_type().clone(), is_query || f.is_nullable());
            // A declared VARCHAR(n)/CHAR(n) length (cirro_common::char_length).
            if is_query {
                field
            } else {
                field.with_metadata(f.metadata().clone())
            }
        })
        .collect();
    let table_schema = Schema::new(columns);
    let mut options = TableOptions::from_sql(options, &table_schema)?;
    crate::statement::constraints::validate(engine, &name, &table_schema, &constraints)?;
    if is_query && !constraints.is_empty() {
        return Err(CirroError::unsupported(
            "constraints in CREATE TABLE … AS are not supported: create the table, then INSERT … SELECT",
        ));
    }
    options.constraints = constraints;
    if let Some(by) = distributed_by {
        options.distribution = Some(cirro_storage::options::Distribution::new(
            by.columns,
            by.buckets,
            &table_schema,
        )?);
    }
    let data = if is_query {
        let mut input = cmd.input.as_ref().clone();
        if !options.cluster_by.is_empty() {
            // CREATE TABLE AS writes its rows in cluster-key order.
            let keys = options
                .cluster_by
                .iter()
                .map(|c| datafusion::logical_expr::col(format!("\"{c}\"")).sort(true, false))
                .collect::<Vec<_>>();
            input = datafusion::logical_expr::LogicalPlanBuilder::from(input)
                .sort(keys)?
                .build()?;
        }
        let frame = engine.context().execute_logical_plan(input).await?;
        let error = engine.input_error();
        Some(
            crate::statement::query::rows_in_order(frame)
                .await?
                .map(move |b| b.map_err(&error)),
        )
    } else {
        None
    };
    let rows = create_with_data(
        engine,
        &db,
        &schema,
        &name,
        &table_schema,
        &options,
        data,
        cmd.or_replace,
    )
    .await?;
    let tag = if is_query {
        format!("SELECT {rows}")
    } else {
        "CREATE TABLE".to_string()
    };
    Ok(Outcome::Command {
        tag,
        notice: None,
        reports: vec![],
    })
}

/// Create table `db.schema.name` holding the rows of `data` (if any), as one
/// catalog commit: the data is written into a new directory first, then the
/// catalog names it. With `or_replace`, an existing table is swapped out in the
/// same commit and its directory removed afterwards.
pub(crate) async fn create_with_data<S>(
    engine: &Engine,
    db: &str,
    schema: &str,
    name: &str,
    table_schema: &Schema,
    options: &TableOptions,
    data: Option<S>,
    or_replace: bool,
) -> Result<u64>
where
    S: futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin,
{
    let catalog = engine.catalog();
    engine.snapshot().schema(db, schema)?;
    if or_replace {
        engine.check_owner(db, schema, name, "replace it")?;
    }
    let location = Catalog::new_table_location(db, schema, name);
    let root = catalog.root().clone();
    let url = root.dir_url(&location)?;
    let created = async {
        let delta = create_delta_table(&url, table_schema, options).await?;
        let mut rows = 0;
        if let Some(stream) = data {
            let table = CirroTable::from_delta(delta.clone(), url.clone())?;
            rows = write_stream(
                &delta,
                Arc::clone(table.stored_schema()),
                stream,
                SaveMode::Append,
            )
            .await?;
        }
        let mut replaced = None;
        engine
            .commit_catalog(|state| {
                let target = state.schema_mut(db, schema)?;
                if target.views.contains_key(name)
                    || target.tables.contains_key(name) && !or_replace
                {
                    return Err(duplicate_relation(name));
                }
                replaced = target.tables.insert(
                    name.to_string(),
                    TableEntry {
                        location: location.clone(),
                        created_ms: now_ms(),
                        owner: engine.user().map(str::to_string),
                        grants: Default::default(),
                        statistics: None,
                    },
                );
                Ok(())
            })
            .await?;
        Ok::<_, CirroError>((rows, replaced))
    }
    .await;
    match created {
        Ok((rows, replaced)) => {
            engine.note_created(&location);
            if let Some(old) = replaced {
                engine.remove_table_dir(&old.location).await;
            }
            Ok(rows)
        }
        Err(e) => {
            let _ = root.remove_dir(&location).await;
            Err(e)
        }
    }
}

pub(crate) async fn drop_table(
    engine: &Engine,
    name: &TableReference,
    if_exists: bool,
    cascade: bool,
) -> Result<Outcome> {
    let (db, schema, table) = engine.resolve(name);
    let mut removed = None;
    let mut cascaded = Vec::new();
    engine
        .commit_catalog(|state| {
            removed = None;
            let relation = (db.clone(), schema.clone(), table.clone());
            cascaded = if state.table(&db, &schema, &table).is_some() {
                crate::statement::views::dependents_closure(state, &relation)
            } else {
                Vec::new()
            };
            if !cascaded.is_empty() && !cascade {
                return Err(crate::statement::views::objects_depend(
                    &format!("drop table {table}"),
                    &format!("table {table}"),
                    &crate::statement::views::dependents(state, &relation),
                ));
            }
            crate::statement::views::remove_views(state, &cascaded);
            let target = match state.schema_mut(&db, &schema) {
                Ok(target) => target,
                Err(_) if if_exists => return Ok(()),
                Err(e) => return Err(e),
            };
            if target.views.contains_key(&table) {
                return Err(CirroError::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("\"{table}\" is a view; use DROP VIEW"),
                ));
            }
            removed = target.tables.remove(&table);
            if removed.is_none() && !if_exists {
                return Err(CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("table \"{table}\" does not exist"),
                ));
            }
            Ok(())
        })
        .await?;
    match removed {
        Some(entry) => {
            engine.remove_table_dir(&entry.location).await;
            Ok(match crate::statement::views::cascade_notice(&cascaded) {
                Some(notice) => Outcome::with_notice("DROP TABLE", notice),
                None => Outcome::command("DROP TABLE"),
            })
        }
        None => Ok(Outcome::with_notice(
            "DROP TABLE",
            format!("table \"{table}\" does not exist, skipping"),
        )),
    }
}

fn split_schema_name(engine: &Engine, name: &str) -> Result<(String, String)> {
    let parts: Vec<&str> = name.split('.').collect();
    match parts.as_slice() {
        [schema] => Ok((engine.default_database(), schema.to_string())),
        [db, schema] => Ok((db.to_string(), schema.to_string())),
        _ => Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            format!("bad schema name \"{name}\""),
        )),
    }
}

pub(crate) async fn create_schema(
    engine: &Engine,
    name: &str,
    if_not_exists: bool,
) -> Result<Outcome> {
    let (db, schema) = split_schema_name(engine, name)?;
    if schema == crate::system::SYSTEM_SCHEMA {
        return Err(CirroError::new(
            SqlState::RESERVED_NAME,
            format!(
                "unacceptable schema name \"{schema}\": it is reserved for Cirro's system tables"
            ),
        ));
    }
    let mut existed = false;
    engine
        .commit_catalog(|state| {
            let database = state.databases.get_mut(&db).ok_or_else(|| {
                CirroError::new(
                    SqlState::INVALID_CATALOG_NAME,
                    format!("database \"{db}\" does not exist"),
                )
            })?;
            existed = database.schemas.contains_key(&schema);
            if existed && !if_not_exists {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_SCHEMA,
                    format!("schema \"{schema}\" already exists"),
                ));
            }
            database.schemas.entry(schema.clone()).or_default();
            Ok(())
        })
        .await?;
    Ok(Outcome::skipped_if(
        "CREATE SCHEMA",
        existed,
        format!("schema \"{schema}\" already exists, skipping"),
    ))
}

fn has_relations(schema: &SchemaEntry) -> bool {
    !schema.tables.is_empty() || !schema.views.is_empty()
}

async fn remove_table_dirs(engine: &Engine, locations: Vec<String>) {
    for location in locations {
        engine.remove_table_dir(&location).await;
    }
}

pub(crate) async fn drop_schema(
    engine: &Engine,
    name: &SchemaReference,
    if_exists: bool,
    cascade: bool,
) -> Result<Outcome> {
    let (db, schema) = match name {
        SchemaReference::Bare { schema } => (engine.default_database(), schema.to_string()),
        SchemaReference::Full { schema, catalog } => (catalog.to_string(), schema.to_string()),
    };
    let mut removed: Option<SchemaEntry> = None;
    engine
        .commit_catalog(|state| {
            removed = None;
            let Some(database) = state.databases.get_mut(&db) else {
                return if if_exists { Ok(()) } else {
                    Err(CirroError::new(SqlState::INVALID_CATALOG_NAME, format!("database \"{db}\" does not exist")))
                };
            };
            match database.schemas.get(&schema) {
                None if if_exists => Ok(()),
                None => Err(CirroError::new(
                    SqlState::INVALID_SCHEMA_NAME,
                    format!("schema \"{schema}\" does not exist"),
                )),
                Some(entry) if has_relations(entry) && !cascade => Err(CirroError::new(
                    SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                    format!("cannot drop schema \"{schema}\" because it holds tables or views (use CASCADE)"),
                )),
                Some(_) => {
                    removed = database.schemas.remove(&schema);
                    Ok(())
                }
            }
        })
        .await?;
    match removed {
        Some(entry) => {
            remove_table_dirs(
                engine,
                entry.tables.into_values().map(|t| t.location).collect(),
            )
            .await;
            Ok(Outcome::command("DROP SCHEMA"))
        }
        None => Ok(Outcome::with_notice(
            "DROP SCHEMA",
            format!("schema \"{schema}\" does not exist, skipping"),
        )),
    }
}

pub(crate) async fn create_database(
    engine: &Engine,
    name: &str,
    if_not_exists: bool,
) -> Result<Outcome> {
    let name = normalize_ident(name);
    let mut existed = false;
    engine
        .catalog()
        .commit(|state| {
            existed = state.databases.contains_key(&name);
            if existed && !if_not_exists {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_DATABASE,
                    format!("database \"{name}\" already exists"),
                ));
            }
            state
                .databases
                .entry(name.clone())
                .or_insert_with(DatabaseEntry::with_public);
            Ok(())
        })
        .await?;
    Ok(Outcome::skipped_if(
        "CREATE DATABASE",
        existed,
        format!("database \"{name}\" already exists, skipping"),
    ))
}

/// Unquoted identifiers fold to lower case; quoted ones keep their case.
fn normalize_ident(name: &str) -> String {
    if name.len() >= 2 && name.starts_with('"') && name.ends_with('"') {
        name[1..name.len() - 1].replace("\"\"", "\"")
    } else {
        name.to_ascii_lowercase()
    }
}

pub(crate) async fn drop_database(
    engine: &Engine,
    names: &[ObjectName],
    if_exists: bool,
    cascade: bool,
) -> Result<Outcome> {
    let [name] = names else {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "DROP DATABASE takes one name",
        ));
    };
    let name = normalize_ident(&name.to_string());
    if name == engine.default_database() {
        return Err(CirroError::new(
            SqlState("55006"),
            format!("cannot drop the currently open database \"{name}\""),
        ));
    }
    let mut removed: Option<DatabaseEntry> = None;
    engine
        .catalog()
        .commit(|state| {
            removed = None;
            match state.databases.get(&name) {
                None if if_exists => Ok(()),
                None => Err(CirroError::new(
                    SqlState::INVALID_CATALOG_NAME,
                    format!("database \"{name}\" does not exist"),
                )),
                Some(db) if db.schemas.values().any(has_relations) && !cascade => Err(CirroError::new(
                    SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                    format!("cannot drop database \"{name}\" because it holds tables or views (use CASCADE)"),
                )),
                Some(_) => {
                    removed = state.databases.remove(&name);
                    Ok(())
                }
            }
        })
        .await?;
    match removed {
        Some(db) => {
            let locations = db
                .schemas
                .into_values()
                .flat_map(|s| s.tables.into_values().map(|t| t.location))
                .collect();
            remove_table_dirs(engine, locations).await;
            Ok(Outcome::command("DROP DATABASE"))
        }
        None => Ok(Outcome::with_notice(
            "DROP DATABASE",
            format!("database \"{name}\" does not exist, skipping"),
        )),
    }
}

/// The `key = value` pairs of `WITH (…)` in CREATE TABLE.
pub(crate) fn table_options(
    options: &datafusion::sql::sqlparser::ast::CreateTableOptions,
) -> Result<Vec<(String, String)>> {
    use datafusion::sql::sqlparser::ast::{CreateTableOptions, Expr, SqlOption, Value};
    let list = match options {
        CreateTableOptions::With(list) => list,
        CreateTableOptions::None => return Ok(Vec::new()),
        other => {
            return Err(CirroError::unsupported(format!(
                "table options {other} are not supported: use WITH (compression = …, row_group_rows = …, cluster_by = …)"
            )));
        }
    };
    list.iter()
        .map(|option| match option {
            SqlOption::KeyValue { key, value } => {
                let text = match value {
                    Expr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                        other => other.to_string(),
                    },
                    other => other.to_string(),
                };
                Ok((key.value.clone(), text))
            }
            other => Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                format!("table option {other} must be written key = value"),
            )),
        })
        .collect()
}

/// `options` without PostgreSQL's storage parameters of a table (heap
/// fill and TOAST tuning, autovacuum), and the names of those taken out.
/// They tune a heap that Cirro's Parquet files do not have, and tools write
/// them (pgbench: `WITH (fillfactor = 100)`; pg_dump: autovacuum settings),
/// so they are accepted and ignored, with their values checked as
/// PostgreSQL checks them (22023).
fn without_pg_storage_parameters(
    options: Vec<(String, String)>,
) -> Result<(Vec<(String, String)>, Vec<String>)> {
    let mut kept = Vec::new();
    let mut ignored = Vec::new();
    for (key, value) in options {
        let name = key.to_ascii_lowercase();
        let integer = |low: i64, high: i64| -> Result<()> {
            let n = value.trim().parse::<i64>().map_err(|_| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("invalid value for integer option \"{name}\": {value}"),
                )
            })?;
            if n < low || n > high {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!(
                        "value {n} out of bounds for option \"{name}\" (valid values are between \"{low}\" and \"{high}\")"
                    ),
                ));
            }
            Ok(())
        };
        let boolean = || -> Result<()> {
            match value.trim().to_ascii_lowercase().as_str() {
                "true" | "false" | "on" | "off" | "yes" | "no" | "1" | "0" | "t" | "f" => Ok(()),
                _ => Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("invalid value for boolean option \"{name}\": {value}"),
                )),
            }
        };
        let number = || -> Result<()> {
            value.trim().parse::<f64>().map(|_| ()).map_err(|_| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("invalid value for option \"{name}\": {value}"),
                )
            })
        };
        match name.as_str() {
            "fillfactor" => integer(10, 100)?,
            "toast_tuple_target" => integer(128, 8160)?,
            "parallel_workers" => integer(0, 1024)?,
            "autovacuum_enabled" | "vacuum_truncate" | "user_catalog_table" => boolean()?,
            "vacuum_index_cleanup" => {
                if !value.trim().eq_ignore_ascii_case("auto") {
                    boolean()?
                }
            }
            other if other.starts_with("autovacuum_") || other == "log_autovacuum_min_duration" => {
                number()?
            }
            _ => {
                kept.push((key, value));
                continue;
            }
        }
        ignored.push(name);
    }
    Ok((kept, ignored))
}

/// The table named `reference` opened at its latest version.
pub(crate) async fn open_named_table(
    engine: &Engine,
    reference: &TableReference,
) -> Result<(String, CirroTable)> {
    let (db, schema, name) = engine.resolve(reference);
    let location = crate::statement::time_travel::location_of(engine, &db, &schema, &name)?;
    let table = engine.catalog().open_table(&location).await?;
    Ok((name, table))
}

/// 25001 for what PostgreSQL does not run inside a transaction block.
pub(crate) fn refuse_in_transaction(engine: &Engine, what: &str) -> Result<()> {
    if engine.in_transaction() {
        return Err(CirroError::new(
            SqlState::ACTIVE_SQL_TRANSACTION,
            format!("{what} cannot run inside a transaction block"),
        ));
    }
    Ok(())
}

/// `CREATE DATABASE name [IF NOT EXISTS]` (superusers, outside a transaction).
pub(crate) async fn create_database_sql(
    engine: &Engine,
    name: &ObjectName,
    if_not_exists: bool,
) -> Result<Outcome> {
    refuse_in_transaction(engine, "CREATE DATABASE")?;
    engine.require_superuser("CREATE DATABASE")?;
    create_database(engine, &name.to_string(), if_not_exists).await
}

/// `CREATE SCHEMA` (superusers), as DataFusion names the schema.
pub(crate) async fn create_schema_sql(
    engine: &Engine,
    statement: &cirro_sql::Statement,
) -> Result<Outcome> {
    match planned(engine, statement).await? {
        LogicalPlan::Ddl(DdlStatement::CreateCatalogSchema(cmd)) => {
            engine.require_superuser("CREATE SCHEMA")?;
            create_schema(engine, &cmd.schema_name, cmd.if_not_exists).await
        }
        _ => Err(CirroError::internal(
            "CREATE SCHEMA planned as something else",
        )),
    }
}

/// DataFusion's plan of a DDL statement, privileges checked.
async fn planned(engine: &Engine, statement: &cirro_sql::Statement) -> Result<LogicalPlan> {
    let Some(statement) = statement.to_datafusion() else {
        return Err(CirroError::internal("a statement DataFusion does not plan"));
    };
    let plan = engine.plan(statement).await?;
    engine.check_plan(&plan)?;
    Ok(plan)
}

/// `DROP kind names`: databases, tables, views and indexes as Cirro drops
/// them; schemas (and what DataFusion refuses) as DataFusion plans them.
pub(crate) async fn drop_objects(engine: &Engine, drop: &cirro_sql::Drop) -> Result<Outcome> {
    match drop.object_type {
        ObjectType::Database => {
            refuse_in_transaction(engine, "DROP DATABASE")?;
            engine.require_superuser("DROP DATABASE")?;
            drop_database(engine, &drop.names, drop.if_exists, drop.cascade).await
        }
        ObjectType::Table | ObjectType::View => {
            drop_relations(
                engine,
                drop.object_type == ObjectType::View,
                &drop.names,
                drop.if_exists,
                drop.cascade,
            )
            .await
        }
        ObjectType::Index => {
            crate::statement::indexes::drop_index(engine, &drop.names, drop.if_exists).await
        }
        _ => {
            let statement = cirro_sql::Statement::Drop(drop.clone());
            match planned(engine, &statement).await? {
                LogicalPlan::Ddl(DdlStatement::DropCatalogSchema(cmd)) => {
                    engine.require_superuser("DROP SCHEMA")?;
                    drop_schema(engine, &cmd.name, cmd.if_exists, cmd.cascade).await
                }
                other => Err(CirroError::unsupported(format!(
                    "{} is not supported",
                    other.display()
                ))),
            }
        }
    }
}

/// `DROP TABLE|VIEW names [CASCADE]`, one relation after the other; the
/// notices of all of them.
async fn drop_relations(
    engine: &Engine,
    views: bool,
    names: &[datafusion::sql::sqlparser::ast::ObjectName],
    if_exists: bool,
    cascade: bool,
) -> Result<Outcome> {
    let mut notices = Vec::new();
    let tag = if views { "DROP VIEW" } else { "DROP TABLE" };
    for name in names {
        let reference =
            datafusion::sql::planner::object_name_to_table_reference(name.clone(), true)?;
        let outcome = if views {
            crate::statement::views::drop_view(engine, &reference, if_exists, cascade).await?
        } else {
            let (db, schema, table) = engine.resolve(&reference);
            engine.check_owner(&db, &schema, &table, "DROP it")?;
            drop_table(engine, &reference, if_exists, cascade).await?
        };
        if let Outcome::Command {
            notice: Some(notice),
            ..
        } = outcome
        {
            notices.push(notice);
        }
    }
    Ok(if notices.is_empty() {
        Outcome::command(tag)
    } else {
        Outcome::with_notice(tag, notices.join("\n"))
    })
}

/// CREATE TABLE: DataFusion refuses WITH (…) and does not enforce
/// constraints: take both out, plan the rest, and create the table with
/// them (and its distribution, if it has one).
pub(crate) async fn create_table_sql(
    engine: &Engine,
    create: &datafusion::sql::sqlparser::ast::CreateTable,
    distributed_by: Option<cirro_sql::DistributedBy>,
) -> Result<Outcome> {
    let (options, ignored) = without_pg_storage_parameters(table_options(&create.table_options)?)?;
    let mut stripped = create.clone();
    stripped.table_options = CreateTableOptions::None;
    let table_name = create
        .name
        .0
        .last()
        .and_then(|part| part.as_ident())
        .map(crate::statement::alter::ident_name)
        .unwrap_or_default();
    let constraints = crate::statement::constraints::take_from_create(&mut stripped, &table_name)?;
    let plan = engine
        .plan(DfStatement::Statement(Box::new(SqlStatement::CreateTable(
            stripped,
        ))))
        .await?;
    engine.check_plan(&plan)?;
    match plan {
        LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) => {
            let outcome = create_table(engine, cmd, &options, constraints, distributed_by).await?;
            if ignored.is_empty() {
                return Ok(outcome);
            }
            let names = ignored
                .iter()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let (noun, verb) = match ignored.len() {
                1 => ("parameter", "has"),
                _ => ("parameters", "have"),
            };
            Ok(outcome.and_notice(format!(
                "storage {noun} {names} {verb} no effect on Cirro's tables (Parquet files): ignored"
            )))
        }
        _ => Err(CirroError::internal(
            "CREATE TABLE planned as something else",
        )),
    }
}
