//! `ALTER TABLE`: RENAME TO (a catalog commit), and column changes (one
//! Delta commit, see `cirro_storage::evolve`):
//!
//! | operation                              | commit                          |
//! |----------------------------------------|---------------------------------|
//! | `ADD [COLUMN] [IF NOT EXISTS] c type`  | metadata: old rows read NULL    |
//! | `ALTER [COLUMN] c DROP NOT NULL`       | metadata                        |
//! | `ALTER [COLUMN] c SET NOT NULL`        | metadata, after a NULL check    |
//! | `DROP [COLUMN] [IF EXISTS] c`          | metadata + rewrite              |
//! | `RENAME [COLUMN] a TO b`               | metadata + rewrite              |
//! | `ALTER [COLUMN] c [SET DATA] TYPE t [USING e]` | metadata + rewrite      |
//! | `ADD [CONSTRAINT c] PRIMARY KEY/UNIQUE/CHECK …` | metadata, after checking the rows |
//! | `DROP CONSTRAINT [IF EXISTS] c`        | metadata                        |
//!
//! Several column operations in one statement are applied in order to one
//! model of the columns and committed together. A value that does not fit a
//! new type fails the statement (22003/22P02) and nothing changes, as in
//! PostgreSQL. Inside a transaction block the change is staged until COMMIT
//! (see txn.rs).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use cirro_catalog::TableEntry;
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::options::{ConstraintDef, ConstraintKind};
use cirro_storage::schema::storage_type;
use cirro_storage::{CirroTable, TableOptions};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::logical_expr::{Expr, ExprSchemable, cast, col, lit};
use datafusion::prelude::DataFrame;
use datafusion::sql::sqlparser::ast::{
    AlterColumnOperation, AlterTable, AlterTableOperation, ColumnDef, ColumnOption,
    DataType as SqlType, Expr as SqlExpr, ExprWithAlias, Ident, MySQLColumnPosition, ObjectName,
    RenameTableNameKind, TableConstraint, Value,
};
use deltalake::kernel::StructField;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::protocol::{DeltaOperation, SaveMode};
use futures::StreamExt;

use crate::statement::time_travel::location_of;
use crate::{Engine, Outcome};

/// Where a column of the changed table gets its values.
#[derive(Clone, Debug)]
enum Source {
    /// The column of the old table with this name (cast if the type changed).
    Old(String),
    /// An expression over the old table's columns (`TYPE … USING e`).
    Using(Box<SqlExpr>),
    /// A new column: NULL in every existing row.
    Added,
}

#[derive(Clone, Debug)]
struct NewColumn {
    name: String,
    /// The stored type.
    data_type: DataType,
    nullable: bool,
    source: Source,
}

/// The table's columns as the statement's operations change them.
struct Model {
    columns: Vec<NewColumn>,
    /// Rows must be rewritten (a column dropped, renamed or retyped).
    rewrite: bool,
    /// Columns that must hold no NULL after the change (SET NOT NULL, ADD … NOT NULL).
    check_not_null: Vec<String>,
    /// What the commit is called in the table's history.
    operations: Vec<String>,
    notices: Vec<String>,
    cluster_by: Vec<String>,
    /// The distribution key (renamed with its columns; never dropped).
    distribution: Vec<String>,
    /// Columns renamed (old, new) and dropped, in order: indexes and
    /// constraints follow them.
    renamed: Vec<(String, String)>,
    dropped: Vec<String>,
    /// The table's constraints as the statement changes them, and those it
    /// adds (checked against the existing rows).
    constraints: Vec<ConstraintDef>,
    added_constraints: Vec<ConstraintDef>,
}

impl Model {
    fn position(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    fn column(&self, name: &str, table: &str) -> Result<usize> {
        self.position(name)
            .ok_or_else(|| undefined_column(name, table))
    }
}

fn undefined_column(name: &str, table: &str) -> CirroError {
    CirroError::new(
        SqlState::UNDEFINED_COLUMN,
        format!("column \"{name}\" of relation \"{table}\" does not exist"),
    )
}

/// An identifier as DataFusion resolves it: unquoted names fold to lower case.
pub(crate) fn ident_name(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

impl Model {
    /// The table's columns as they are, before any operation.
    fn of(table: &CirroTable) -> Model {
        Model {
            columns: table
                .stored_schema()
                .fields()
                .iter()
                .map(|f| NewColumn {
                    name: f.name().clone(),
                    data_type: f.data_type().clone(),
                    nullable: f.is_nullable(),
                    source: Source::Old(f.name().clone()),
                })
                .collect(),
            rewrite: false,
            check_not_null: Vec::new(),
            operations: Vec::new(),
            notices: Vec::new(),
            cluster_by: table.options().cluster_by.clone(),
            distribution: table
                .options()
                .distribution
                .as_ref()
                .map(|d| d.columns.clone())
                .unwrap_or_default(),
            renamed: Vec::new(),
            dropped: Vec::new(),
            constraints: table.options().constraints.clone(),
            added_constraints: Vec::new(),
        }
    }
}

pub(crate) async fn alter_table(engine: &Engine, alter: &AlterTable) -> Result<Outcome> {
    let reference = object_reference(&alter.name)?;
    let (db, schema, name) = engine.resolve(&reference);
    let snapshot = engine.snapshot();
    if snapshot.view(&db, &schema, &name).is_some() {
        return Err(CirroError::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("\"{name}\" is a view; ALTER TABLE changes tables only"),
        ));
    }
    if snapshot.table(&db, &schema, &name).is_none() {
        if alter.if_exists {
            return Ok(Outcome::with_notice(
                "ALTER TABLE",
                format!("relation \"{name}\" does not exist, skipping"),
            ));
        }
        return Err(CirroError::new(
            SqlState::UNDEFINED_TABLE,
            format!("relation \"{name}\" does not exist"),
        ));
    }
    engine.check_owner(&db, &schema, &name, "ALTER it")?;
    let relation = (db.clone(), schema.clone(), name.clone());
    if let [AlterTableOperation::RenameTable { table_name }] = alter.operations.as_slice() {
        let views = crate::statement::views::dependents(&snapshot, &relation);
        if !views.is_empty() {
            // A view keeps its query's text: it would lose the table.
            return Err(crate::statement::views::objects_depend(
                &format!("rename table {name}"),
                &format!("table {name}"),
                &views,
            ));
        }
        return rename_table(engine, (&db, &schema, &name), table_name).await;
    }
    if alter.operations.is_empty() {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "ALTER TABLE needs an operation",
        ));
    }
    let location = location_of(engine, &db, &schema, &name)?;
    // The row store's rows are in the files, and no small write lands
    // until the change is committed (then it would be missed, or written
    // under the old columns).
    let _alone = crate::statement::write::hold_alone(engine, &location, &name).await?;
    if engine.in_transaction() {
        crate::statement::point::repin_after_flush(engine, &location).await?;
    }
    let table = engine.table_to_alter(&location).await?;
    let mut model = Model::of(&table);
    for operation in &alter.operations {
        apply(engine, &mut model, operation, &name)?;
    }
    check_dependent_views(engine, &alter.operations, &model, &relation).await?;
    if model.operations.is_empty() {
        // Every operation was skipped (IF [NOT] EXISTS).
        return Ok(notice_outcome(model.notices));
    }
    let frame = engine.context().read_table(Arc::new(table.clone()))?;
    for column in &model.check_not_null {
        check_no_nulls(&frame, &model, column, &name).await?;
    }
    check_added_constraints(engine, &frame, &model, &name).await?;
    let new_schema = Schema::new(
        model
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
            .collect::<Vec<_>>(),
    );
    let options = new_options(&table, &model, &new_schema)?;
    let operation = delta_operation(&model, &table, &new_schema)?;
    let rows = if model.rewrite {
        let exprs = model
            .columns
            .iter()
            .map(|c| value_of(engine, &frame, c))
            .collect::<Result<Vec<_>>>()?;
        let stream = frame.select(exprs)?.execute_stream().await?;
        Some(stream.map(|b| b.map_err(CirroError::from)))
    } else {
        None
    };
    engine
        .change_table_schema(
            &location,
            &name,
            &table,
            &new_schema,
            &options,
            rows,
            operation,
        )
        .await?;
    Ok(notice_outcome(model.notices))
}

/// The constraints the statement adds, checked against the new columns
/// and the table's rows.
async fn check_added_constraints(
    engine: &Engine,
    frame: &DataFrame,
    model: &Model,
    name: &str,
) -> Result<()> {
    if model.added_constraints.is_empty() {
        return Ok(());
    }
    if model.rewrite {
        return Err(CirroError::unsupported(
            "ADD CONSTRAINT cannot be combined with dropping, renaming or retyping columns: use two ALTER TABLE statements",
        ));
    }
    let schema = Schema::new(
        model
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
            .collect::<Vec<_>>(),
    );
    crate::statement::constraints::validate(engine, name, &schema, &model.added_constraints)?;
    for def in &model.added_constraints {
        crate::statement::constraints::validate_rows(frame, name, def).await?;
    }
    Ok(())
}

/// The table's options after the statement: clustering, constraints,
/// indexes and distribution following the columns.
fn new_options(table: &CirroTable, model: &Model, new_schema: &Schema) -> Result<TableOptions> {
    let mut options = table.options().clone();
    options.cluster_by = model.cluster_by.clone();
    options.constraints = model.constraints.clone();
    follow_columns(&mut options, model);
    if let Some(old) = &options.distribution {
        // The key's columns must still have types with a stable hash.
        let checked = cirro_storage::options::Distribution::new(
            model.distribution.clone(),
            old.buckets as i64,
            new_schema,
        )?;
        // Rewritten rows are placed by this build's hash; kept files keep theirs.
        let hash = if model.rewrite {
            checked.hash.clone()
        } else {
            old.hash.clone()
        };
        options.distribution = Some(cirro_storage::options::Distribution { hash, ..checked });
    }
    Ok(options)
}

/// Indexes and constraints after the statement's column changes, as in
/// PostgreSQL: a renamed column is renamed in them (CHECK expressions
/// included); those involving a dropped column are dropped.
fn follow_columns(options: &mut cirro_storage::TableOptions, model: &Model) {
    use cirro_storage::options::ConstraintKind;
    for (old, new) in &model.renamed {
        for index in &mut options.indexes {
            for key in &mut index.columns {
                if key.name == *old {
                    key.name = new.clone();
                }
            }
        }
        for constraint in &mut options.constraints {
            match &mut constraint.kind {
                ConstraintKind::PrimaryKey(columns) | ConstraintKind::Unique(columns) => {
                    for c in columns.iter_mut() {
                        if c == old {
                            *c = new.clone();
                        }
                    }
                }
                ConstraintKind::Check(sql) => *sql = rename_in_sql(sql, old, new),
            }
        }
    }
    for dropped in &model.dropped {
        options
            .indexes
            .retain(|i| !i.columns.iter().any(|k| k.name == *dropped));
        options.constraints.retain(|c| match &c.kind {
            ConstraintKind::PrimaryKey(columns) | ConstraintKind::Unique(columns) => {
                !columns.contains(dropped)
            }
            ConstraintKind::Check(sql) => !sql_names_column(sql, dropped),
        });
    }
}

fn parse_sql_expr(sql: &str) -> Option<SqlExpr> {
    crate::statement::constraints::parse_check(sql).ok()
}

/// `sql` (an expression) with column `old` named `new`.
fn rename_in_sql(sql: &str, old: &str, new: &str) -> String {
    use cirro_sql::walk::WalkMut;
    let Some(mut expr) = parse_sql_expr(sql) else {
        return sql.to_string();
    };
    let _ = expr.walk_mut(&mut RenameColumn { old, new });
    expr.to_string()
}

struct RenameColumn<'a> {
    old: &'a str,
    new: &'a str,
}

impl cirro_sql::walk::WalkerMut for RenameColumn<'_> {
    fn pre_visit_expr(&mut self, expr: &mut SqlExpr) -> std::ops::ControlFlow<()> {
        if let SqlExpr::Identifier(ident) = expr
            && ident_name(ident) == self.old
        {
            *ident = Ident::with_quote('"', self.new);
        }
        std::ops::ControlFlow::Continue(())
    }
}

/// Whether expression `sql` names column `name`.
fn sql_names_column(sql: &str, name: &str) -> bool {
    use cirro_sql::walk::{Walk, Walker};
    struct Find<'a>(&'a str);
    impl Walker for Find<'_> {
        fn pre_visit_expr(&mut self, expr: &SqlExpr) -> std::ops::ControlFlow<()> {
            match expr {
                SqlExpr::Identifier(ident) if ident_name(ident) == self.0 => {
                    std::ops::ControlFlow::Break(())
                }
                _ => std::ops::ControlFlow::Continue(()),
            }
        }
    }
    parse_sql_expr(sql).is_none_or(|e| e.walk(&mut Find(name)).is_break())
}

fn notice_outcome(notices: Vec<String>) -> Outcome {
    if notices.is_empty() {
        Outcome::command("ALTER TABLE")
    } else {
        Outcome::with_notice("ALTER TABLE", notices.join("\n"))
    }
}

fn object_reference(name: &ObjectName) -> Result<TableReference> {
    Ok(datafusion::sql::planner::object_name_to_table_reference(
        name.clone(),
        true,
    )?)
}

/// Apply one operation to the model.
fn apply(
    engine: &Engine,
    model: &mut Model,
    operation: &AlterTableOperation,
    table: &str,
) -> Result<()> {
    match operation {
        AlterTableOperation::AddColumn {
            if_not_exists,
            column_def,
            column_position,
            ..
        } => add_column(
            engine,
            model,
            *if_not_exists,
            column_def,
            column_position.as_ref(),
            table,
        ),
        AlterTableOperation::DropColumn {
            column_names,
            if_exists,
            ..
        } => drop_columns(model, column_names, *if_exists, table),
        AlterTableOperation::RenameColumn {
            old_column_name,
            new_column_name,
        } => rename_column(model, old_column_name, new_column_name, table),
        AlterTableOperation::AlterColumn { column_name, op } => {
            alter_column(engine, model, column_name, op, table)
        }
        AlterTableOperation::RenameTable { .. } => Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "RENAME TO cannot be combined with other ALTER TABLE operations",
        )),
        AlterTableOperation::AddConstraint {
            constraint,
            not_valid,
        } => add_constraint(model, constraint, *not_valid, table),
        AlterTableOperation::DropConstraint {
            if_exists, name, ..
        } => drop_constraint(model, *if_exists, name, table),
        other => Err(CirroError::unsupported(format!(
            "ALTER TABLE … {other} is not supported"
        ))),
    }
}

/// ADD COLUMN.
fn add_column(
    engine: &Engine,
    model: &mut Model,
    if_not_exists: bool,
    column_def: &ColumnDef,
    column_position: Option<&MySQLColumnPosition>,
    table: &str,
) -> Result<()> {
    if column_position.is_some() {
        return Err(CirroError::unsupported(
            "FIRST/AFTER column positions are not supported: new columns go last",
        ));
    }
    let name = ident_name(&column_def.name);
    if model.position(&name).is_some() {
        if if_not_exists {
            model.notices.push(format!(
                "column \"{name}\" of relation \"{table}\" already exists, skipping"
            ));
            return Ok(());
        }
        return Err(CirroError::new(
            SqlState::DUPLICATE_COLUMN,
            format!("column \"{name}\" of relation \"{table}\" already exists"),
        ));
    }
    let mut nullable = true;
    for option in &column_def.options {
        match &option.option {
            ColumnOption::Null => nullable = true,
            ColumnOption::NotNull => nullable = false,
            ColumnOption::Default(_) => {
                // Refused, as in CREATE TABLE: an ignored DEFAULT would store NULLs.
                return Err(CirroError::unsupported(format!(
                    "column defaults are not supported yet (DEFAULT on \"{name}\")"
                )));
            }
            other => {
                return Err(CirroError::unsupported(format!(
                    "ADD COLUMN … {other} is not supported"
                )));
            }
        }
    }
    let data_type = sql_type(engine, &name, &column_def.data_type)?;
    if !nullable {
        // PostgreSQL allows it on an empty table only: check no row exists.
        model.check_not_null.push(name.clone());
    }
    model.columns.push(NewColumn {
        name: name.clone(),
        data_type,
        nullable,
        source: Source::Added,
    });
    model.operations.push(format!("ADD COLUMN {name}"));
    Ok(())
}

/// DROP COLUMN.
fn drop_columns(
    model: &mut Model,
    column_names: &[Ident],
    if_exists: bool,
    table: &str,
) -> Result<()> {
    for ident in column_names {
        let name = ident_name(ident);
        let Some(index) = model.position(&name) else {
            if if_exists {
                model.notices.push(format!(
                    "column \"{name}\" of relation \"{table}\" does not exist, skipping"
                ));
                continue;
            }
            return Err(undefined_column(&name, table));
        };
        if model.columns.len() == 1 {
            return Err(CirroError::unsupported(format!(
                "cannot drop column \"{name}\": it is the only column of \"{table}\", and tables need one"
            )));
        }
        if model.distribution.contains(&name) {
            return Err(CirroError::new(
                SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                format!(
                    "cannot drop column \"{name}\" of \"{table}\": the table is distributed by it"
                ),
            ));
        }
        model.columns.remove(index);
        model.cluster_by.retain(|c| c != &name);
        model.dropped.push(name.clone());
        model.rewrite = true;
        model.operations.push(format!("DROP COLUMN {name}"));
    }
    Ok(())
}

/// RENAME COLUMN.
fn rename_column(
    model: &mut Model,
    old_column_name: &Ident,
    new_column_name: &Ident,
    table: &str,
) -> Result<()> {
    let old = ident_name(old_column_name);
    let new = ident_name(new_column_name);
    let index = model.column(&old, table)?;
    if old == new {
        return Ok(());
    }
    if model.position(&new).is_some() {
        return Err(CirroError::new(
            SqlState::DUPLICATE_COLUMN,
            format!("column \"{new}\" of relation \"{table}\" already exists"),
        ));
    }
    model.columns[index].name = new.clone();
    model.renamed.push((old.clone(), new.clone()));
    for key in model.cluster_by.iter_mut().chain(&mut model.distribution) {
        if *key == old {
            *key = new.clone();
        }
    }
    model.rewrite = true;
    model
        .operations
        .push(format!("RENAME COLUMN {old} TO {new}"));
    Ok(())
}

/// ALTER COLUMN … SET/DROP NOT NULL, TYPE.
fn alter_column(
    engine: &Engine,
    model: &mut Model,
    column_name: &Ident,
    op: &AlterColumnOperation,
    table: &str,
) -> Result<()> {
    let name = ident_name(column_name);
    let index = model.column(&name, table)?;
    match op {
        AlterColumnOperation::SetNotNull => {
            if model.columns[index].nullable {
                model.columns[index].nullable = false;
                model.check_not_null.push(name.clone());
                model.operations.push(format!("SET NOT NULL {name}"));
            }
        }
        AlterColumnOperation::DropNotNull => {
            if !model.columns[index].nullable {
                model.columns[index].nullable = true;
                model.operations.push(format!("DROP NOT NULL {name}"));
            }
        }
        AlterColumnOperation::SetDataType {
            data_type, using, ..
        } => {
            let new_type = sql_type(engine, &name, data_type)?;
            let column = &mut model.columns[index];
            if let Some(using) = using {
                if !matches!(column.source, Source::Old(_)) {
                    return Err(CirroError::unsupported(format!(
                        "USING on column \"{name}\", which this statement already changed"
                    )));
                }
                column.source = Source::Using(Box::new(using.clone()));
            } else if new_type == column.data_type {
                return Ok(());
            }
            column.data_type = new_type;
            model.rewrite = true;
            model
                .operations
                .push(format!("ALTER COLUMN {name} TYPE {data_type}"));
        }
        other => {
            return Err(CirroError::unsupported(format!(
                "ALTER COLUMN … {other} is not supported"
            )));
        }
    }
    Ok(())
}

/// ADD CONSTRAINT.
fn add_constraint(
    model: &mut Model,
    constraint: &TableConstraint,
    not_valid: bool,
    table: &str,
) -> Result<()> {
    let Some((given, kind, check_column)) =
        crate::statement::constraints::from_table_constraint(constraint)?
    else {
        return Err(CirroError::unsupported(format!(
            "ALTER TABLE … ADD {constraint} is not supported"
        )));
    };
    if not_valid {
        return Err(CirroError::unsupported(
            "NOT VALID constraints are not supported: existing rows are always checked",
        ));
    }
    if let ConstraintKind::PrimaryKey(columns) = &kind {
        if model
            .constraints
            .iter()
            .any(|c| matches!(c.kind, ConstraintKind::PrimaryKey(_)))
        {
            return Err(CirroError::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!("multiple primary keys for table \"{table}\" are not allowed"),
            ));
        }
        // A primary key's columns become NOT NULL (checked below).
        for column in columns {
            let index = model.column(column, table)?;
            if model.columns[index].nullable {
                model.columns[index].nullable = false;
                model.check_not_null.push(column.clone());
            }
        }
    }
    let taken: Vec<String> = model.constraints.iter().map(|c| c.name.clone()).collect();
    let name = crate::statement::constraints::constraint_name(
        table,
        given,
        &kind,
        check_column.as_deref(),
        &taken,
    )?;
    let def = ConstraintDef { name, kind };
    model
        .operations
        .push(format!("ADD CONSTRAINT {}", def.name));
    model.constraints.push(def.clone());
    model.added_constraints.push(def);
    Ok(())
}

/// DROP CONSTRAINT.
fn drop_constraint(model: &mut Model, if_exists: bool, name: &Ident, table: &str) -> Result<()> {
    let name = ident_name(name);
    let before = model.constraints.len();
    model.constraints.retain(|c| c.name != name);
    if model.constraints.len() == before {
        if if_exists {
            model.notices.push(format!(
                "constraint \"{name}\" of relation \"{table}\" does not exist, skipping"
            ));
            return Ok(());
        }
        return Err(CirroError::new(
            SqlState::UNDEFINED_OBJECT,
            format!("constraint \"{name}\" of relation \"{table}\" does not exist"),
        ));
    }
    model.operations.push(format!("DROP CONSTRAINT {name}"));
    Ok(())
}

/// The stored type a SQL type names, as CAST resolves it.
fn sql_type(engine: &Engine, column: &str, data_type: &SqlType) -> Result<DataType> {
    let expr = SqlExpr::Cast {
        kind: datafusion::sql::sqlparser::ast::CastKind::Cast,
        expr: Box::new(SqlExpr::Value(Value::Null.into())),
        data_type: data_type.clone(),
        array: false,
        format: None,
    };
    let empty = DFSchema::empty();
    let state = engine.context().state();
    let planned = state.create_logical_expr_from_sql_expr(without_alias(expr), &empty)?;
    let arrow_type = planned.get_type(&empty)?;
    storage_type(column, &arrow_type)
}

fn without_alias(expr: SqlExpr) -> ExprWithAlias {
    ExprWithAlias { expr, alias: None }
}

/// The new value of a column, computed from the old table's row.
fn value_of(engine: &Engine, frame: &DataFrame, column: &NewColumn) -> Result<Expr> {
    let value = match &column.source {
        Source::Old(old) => col(Column::new_unqualified(old)),
        Source::Using(expr) => engine
            .context()
            .state()
            .create_logical_expr_from_sql_expr(without_alias((**expr).clone()), frame.schema())?,
        Source::Added => lit(datafusion::common::ScalarValue::Null),
    };
    Ok(cast(value, column.data_type.clone()).alias(&column.name))
}

/// 23502 if `column` (its new value) is NULL in any row.
async fn check_no_nulls(frame: &DataFrame, model: &Model, column: &str, table: &str) -> Result<()> {
    let index = model.column(column, table)?;
    let nulls = match &model.columns[index].source {
        Source::Old(old) => {
            frame
                .clone()
                .filter(col(Column::new_unqualified(old)).is_null())?
                .limit(0, Some(1))?
                .count()
                .await?
        }
        // A new column is NULL in every existing row.
        _ => frame.clone().limit(0, Some(1))?.count().await?,
    };
    if nulls > 0 {
        return Err(CirroError::new(
            SqlState::NOT_NULL_VIOLATION,
            format!("column \"{column}\" of relation \"{table}\" contains null values"),
        ));
    }
    Ok(())
}

/// How the commit is recorded in the table's history.
fn delta_operation(model: &Model, table: &CirroTable, schema: &Schema) -> Result<DeltaOperation> {
    let only_adds = model.operations.iter().all(|o| o.starts_with("ADD COLUMN"));
    if only_adds {
        let old = table.stored_schema().fields().len();
        let fields = schema.fields()[old..]
            .iter()
            .map(|f| {
                let stored = Field::new(
                    f.name(),
                    storage_type(f.name(), f.data_type())?,
                    f.is_nullable(),
                );
                (&stored).try_into_kernel().map_err(|e| {
                    CirroError::unsupported(format!("cannot store column \"{}\": {e}", f.name()))
                })
            })
            .collect::<Result<Vec<StructField>>>()?;
        return Ok(DeltaOperation::AddColumn { fields });
    }
    // The rest have no Delta operation of their own: a write that replaces
    // the table's schema (and its files when rewritten), its steps as the
    // predicate so DESCRIBE HISTORY shows them.
    Ok(DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: None,
        predicate: Some(format!("ALTER TABLE {}", model.operations.join(", "))),
    })
}

/// `ALTER TABLE a RENAME TO b`: the catalog entry moves; the data stays where it is.
async fn rename_table(
    engine: &Engine,
    (db, schema, name): (&str, &str, &str),
    target: &RenameTableNameKind,
) -> Result<Outcome> {
    let (RenameTableNameKind::To(new) | RenameTableNameKind::As(new)) = target;
    let reference = object_reference(new)?;
    if reference.catalog().is_some_and(|c| c != db)
        || reference.schema().is_some_and(|s| s != schema)
    {
        return Err(CirroError::unsupported(
            "RENAME TO cannot move a table to another schema or database",
        ));
    }
    let new = reference.table().to_string();
    engine
        .commit_catalog(|state| {
            let target = state.schema_mut(db, schema)?;
            if target.relation_exists(&new) {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{new}\" already exists"),
                ));
            }
            let entry: TableEntry = target.tables.remove(name).ok_or_else(|| {
                CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("relation \"{name}\" does not exist"),
                )
            })?;
            target.tables.insert(new.clone(), entry);
            Ok(())
        })
        .await?;
    Ok(Outcome::command("ALTER TABLE"))
}

/// Refuse (2BP01) to drop, rename or retype a column a view names, unless
/// `DROP COLUMN … CASCADE`, which drops those views first.
async fn check_dependent_views(
    engine: &Engine,
    operations: &[AlterTableOperation],
    model: &Model,
    relation: &crate::statement::views::Relation,
) -> Result<()> {
    let mut affected: Vec<String> = model.dropped.clone();
    affected.extend(model.renamed.iter().map(|(old, _)| old.clone()));
    for operation in operations {
        if let AlterTableOperation::AlterColumn {
            column_name,
            op: AlterColumnOperation::SetDataType { .. },
        } = operation
        {
            affected.push(ident_name(column_name));
        }
    }
    if affected.is_empty() {
        return Ok(());
    }
    let snapshot = engine.snapshot();
    let views = crate::statement::views::column_dependents(&snapshot, relation, &affected);
    if views.is_empty() {
        return Ok(());
    }
    let cascade = operations.iter().any(|o| {
        matches!(
            o,
            AlterTableOperation::DropColumn {
                drop_behavior: Some(datafusion::sql::sqlparser::ast::DropBehavior::Cascade),
                ..
            }
        )
    });
    let table = &relation.2;
    if !cascade || !model.renamed.is_empty() {
        let column = &affected[0];
        let verb = if model.dropped.contains(column) {
            "drop"
        } else {
            "alter"
        };
        return Err(crate::statement::views::objects_depend(
            &format!("{verb} column {column} of table {table}"),
            &format!("column {column} of table {table}"),
            &views,
        ));
    }
    engine
        .commit_catalog(|state| {
            let all: Vec<_> =
                crate::statement::views::column_dependents(state, relation, &affected)
                    .iter()
                    .flat_map(|v| {
                        let mut closure = crate::statement::views::dependents_closure(state, v);
                        closure.push(v.clone());
                        closure
                    })
                    .collect();
            crate::statement::views::remove_views(state, &all);
            Ok(())
        })
        .await?;
    Ok(())
}
