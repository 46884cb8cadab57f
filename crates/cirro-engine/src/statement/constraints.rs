//! Table constraints: PRIMARY KEY, UNIQUE (and unique indexes) and CHECK,
//! declared in CREATE TABLE and enforced on every write (INSERT, COPY,
//! UPDATE, MERGE), as PostgreSQL does.
//!
//! They are stored with the table (`cirro_storage::options`). A write is
//! checked after its files are written and before its commit, against the
//! table as the commit would leave it:
//!
//! ```text
//!   write files ──► lock the table ──► latest snapshot + this change = post
//!                                           │
//!        CHECK: no row of the new files makes an expression false (23514)
//!        keys:  no key of the new files occurs twice in post          (23505)
//!                                           │
//!                                     commit ──► unlock
//! ```
//!
//! The lock (`Catalog::write_lock`) makes check-then-commit atomic against
//! the other writers of the table in this process; without it two INSERTs of
//! the same new key would both pass. Inside a transaction each statement is
//! checked against the transaction's view, and COMMIT checks again under the
//! lock if other writers committed since. The check is at the end of the
//! statement (PostgreSQL checks row by row, so `UPDATE t SET id = id + 1`
//! may fail there and passes here).
//!
//! Finding duplicates reads the new keys (few for the usual INSERT) and
//! looks them up in the table: with up to [`IN_LIST_KEYS_MAX`] distinct keys
//! as `IN (…)` lists, which skip files and row groups by min/max and by the
//! bloom filters every key column has; with more by a semi join.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::walk::{Walk, Walker};
use cirro_storage::CirroTable;
use cirro_storage::options::{ConstraintDef, ConstraintKind};
use datafusion::common::{Column, DFSchema, JoinType, ScalarValue};
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{Expr, ExprSchemable, lit};
use datafusion::prelude::DataFrame;
use datafusion::sql::sqlparser::ast::{
    ColumnOption, ColumnOptionDef, CreateTable, Expr as SqlExpr, IndexColumn, TableConstraint,
};
use object_store::path::Path;

use crate::Engine;
use crate::statement::alter::ident_name;

/// Most distinct new keys looked up as literal `IN` lists.
pub(crate) const IN_LIST_KEYS_MAX: usize = 1000;

fn column(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// Take the PRIMARY KEY, UNIQUE and CHECK constraints out of a CREATE
/// TABLE (column and table constraints), naming them as PostgreSQL does
/// (`t_pkey`, `t_a_key`, `t_a_check`). Primary key columns become NOT NULL.
pub(crate) fn take_from_create(
    create: &mut CreateTable,
    table: &str,
) -> Result<Vec<ConstraintDef>> {
    let mut found: Vec<(Option<String>, ConstraintKind, Option<String>)> = Vec::new();
    let mut primary: Vec<String> = Vec::new();
    for column_def in &mut create.columns {
        let name = ident_name(&column_def.name);
        let mut kept: Vec<ColumnOptionDef> = Vec::new();
        for option in column_def.options.drain(..) {
            let given = option.name.as_ref().map(ident_name);
            match &option.option {
                ColumnOption::PrimaryKey(_) => {
                    found.push((given, ConstraintKind::PrimaryKey(vec![name.clone()]), None));
                    primary.push(name.clone());
                }
                ColumnOption::Unique(_) => {
                    found.push((given, ConstraintKind::Unique(vec![name.clone()]), None));
                }
                ColumnOption::Check(check) => {
                    found.push((
                        given,
                        ConstraintKind::Check(check.expr.to_string()),
                        Some(name.clone()),
                    ));
                }
                _ => kept.push(option),
            }
        }
        column_def.options = kept;
    }
    let mut kept = Vec::new();
    for constraint in create.constraints.drain(..) {
        match from_table_constraint(&constraint)? {
            Some(found_one) => {
                if let (_, ConstraintKind::PrimaryKey(columns), _) = &found_one {
                    primary.extend(columns.iter().cloned());
                }
                found.push(found_one);
            }
            None => kept.push(constraint),
        }
    }
    create.constraints = kept;
    if found
        .iter()
        .filter(|(_, k, _)| matches!(k, ConstraintKind::PrimaryKey(_)))
        .count()
        > 1
    {
        return Err(CirroError::new(
            SqlState::INVALID_TABLE_DEFINITION,
            format!("multiple primary keys for table \"{table}\" are not allowed"),
        ));
    }
    for column_def in &mut create.columns {
        if primary.contains(&ident_name(&column_def.name))
            && !column_def
                .options
                .iter()
                .any(|o| matches!(o.option, ColumnOption::NotNull))
        {
            column_def
                .options
                .retain(|o| !matches!(o.option, ColumnOption::Null));
            column_def.options.push(ColumnOptionDef {
                name: None,
                option: ColumnOption::NotNull,
            });
        }
    }
    let mut defs: Vec<ConstraintDef> = Vec::new();
    for (given, kind, check_column) in found {
        let taken: Vec<String> = defs.iter().map(|d| d.name.clone()).collect();
        let name = constraint_name(table, given, &kind, check_column.as_deref(), &taken)?;
        defs.push(ConstraintDef { name, kind });
    }
    Ok(defs)
}

/// A constraint found in SQL: its given name, what it requires, and for a
/// CHECK the column PostgreSQL names it after.
pub(crate) type FoundConstraint = (Option<String>, ConstraintKind, Option<String>);

/// A table constraint (`CONSTRAINT c UNIQUE (a)`, …) as Cirro keeps it;
/// None for kinds Cirro leaves to DataFusion (foreign keys, …).
pub(crate) fn from_table_constraint(
    constraint: &TableConstraint,
) -> Result<Option<FoundConstraint>> {
    Ok(match constraint {
        TableConstraint::PrimaryKey(pk) => Some((
            pk.name.as_ref().map(ident_name),
            ConstraintKind::PrimaryKey(key_columns(&pk.columns)?),
            None,
        )),
        TableConstraint::Unique(unique) => Some((
            unique.name.as_ref().map(ident_name),
            ConstraintKind::Unique(key_columns(&unique.columns)?),
            None,
        )),
        TableConstraint::Check(check) => Some((
            check.name.as_ref().map(ident_name),
            ConstraintKind::Check(check.expr.to_string()),
            first_column(&check.expr),
        )),
        _ => None,
    })
}

/// The name of a new constraint of `table`: the given one (42710 if
/// `taken`), else PostgreSQL's (`t_pkey`, `t_a_b_key`, `t_a_check`), made
/// free of `taken` with a number.
pub(crate) fn constraint_name(
    table: &str,
    given: Option<String>,
    kind: &ConstraintKind,
    check_column: Option<&str>,
    taken: &[String],
) -> Result<String> {
    if let Some(name) = given {
        if taken.contains(&name) {
            return Err(CirroError::new(
                SqlState::DUPLICATE_OBJECT,
                format!("constraint \"{name}\" for relation \"{table}\" already exists"),
            ));
        }
        return Ok(name);
    }
    let stem = match kind {
        ConstraintKind::PrimaryKey(_) => format!("{table}_pkey"),
        ConstraintKind::Unique(c) => format!("{table}_{}_key", c.join("_")),
        ConstraintKind::Check(_) => match check_column {
            Some(c) => format!("{table}_{c}_check"),
            None => format!("{table}_check"),
        },
    };
    Ok(free_name(&stem, |n| taken.iter().any(|t| t == n)))
}

/// A CHECK expression (SQL text) parsed as PostgreSQL writes it.
pub(crate) fn parse_check(sql: &str) -> Result<SqlExpr> {
    datafusion::sql::sqlparser::parser::Parser::new(
        &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
    )
    .try_with_sql(sql)
    .and_then(|mut p| p.parse_expr())
    .map_err(|e| CirroError::new(SqlState::SYNTAX_ERROR, e.to_string()))
}

/// The first row of `rows` that makes CHECK expression `sql` false, as
/// `(1, abc)`; None when every row passes (true or NULL).
async fn first_failing(rows: &DataFrame, sql: &str) -> Result<Option<String>> {
    let expr = rows.parse_sql_expr(sql)?;
    let failing = rows
        .clone()
        .filter(expr.is_false())?
        .limit(0, Some(1))?
        .collect()
        .await?;
    Ok(first_row(&failing).map(|(batch, row)| row_text(batch, row)))
}

/// 23514/23505 unless every row of `rows` (a table's) satisfies `def`, a
/// constraint being added to it.
pub(crate) async fn validate_rows(
    rows: &DataFrame,
    table: &str,
    def: &ConstraintDef,
) -> Result<()> {
    match &def.kind {
        ConstraintKind::Check(sql) => {
            if first_failing(rows, sql).await?.is_some() {
                return Err(CirroError::new(
                    SqlState::CHECK_VIOLATION,
                    format!(
                        "check constraint \"{}\" of relation \"{table}\" is violated by some row",
                        def.name
                    ),
                ));
            }
        }
        ConstraintKind::PrimaryKey(key) | ConstraintKind::Unique(key) => {
            if let Some(values) = first_duplicate(rows.clone(), key).await? {
                return Err(CirroError::new(
                    SqlState::UNIQUE_VIOLATION,
                    format!(
                        "could not create unique index \"{}\": key ({})={values} is duplicated",
                        def.name,
                        key.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `stem`, or `stem1`, `stem2`, … : the first that `taken` says is free.
pub(crate) fn free_name(stem: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(stem) {
        return stem.to_string();
    }
    (1..)
        .map(|i| format!("{stem}{i}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| stem.to_string())
}

/// The column names of a key: plain columns only.
fn key_columns(columns: &[IndexColumn]) -> Result<Vec<String>> {
    columns
        .iter()
        .map(|c| match &c.column.expr {
            SqlExpr::Identifier(ident) => Ok(ident_name(ident)),
            other => Err(CirroError::unsupported(format!(
                "keys on expressions are not supported (\"{other}\"): name columns"
            ))),
        })
        .collect()
}

/// The first column an expression names (PostgreSQL names a table CHECK
/// constraint after it).
fn first_column(expr: &SqlExpr) -> Option<String> {
    struct First(Option<String>);
    impl Walker for First {
        fn pre_visit_expr(&mut self, expr: &SqlExpr) -> std::ops::ControlFlow<()> {
            if let SqlExpr::Identifier(ident) = expr {
                self.0 = Some(ident_name(ident));
                return std::ops::ControlFlow::Break(());
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let mut first = First(None);
    let _ = expr.walk(&mut first);
    first.0
}

/// Whether an expression holds a subquery.
fn has_subquery(expr: &SqlExpr) -> bool {
    struct Find;
    impl Walker for Find {
        fn pre_visit_expr(&mut self, expr: &SqlExpr) -> std::ops::ControlFlow<()> {
            match expr {
                SqlExpr::Subquery(_) | SqlExpr::Exists { .. } | SqlExpr::InSubquery { .. } => {
                    std::ops::ControlFlow::Break(())
                }
                _ => std::ops::ControlFlow::Continue(()),
            }
        }
    }
    expr.walk(&mut Find).is_break()
}

/// Check constraint definitions against the table's columns: key columns
/// exist, CHECK expressions are boolean, name only the table's columns and
/// hold no subquery or aggregate.
pub(crate) fn validate(
    engine: &Engine,
    table: &str,
    schema: &Schema,
    defs: &[ConstraintDef],
) -> Result<()> {
    let df_schema = DFSchema::try_from(schema.clone())?;
    for def in defs {
        match &def.kind {
            ConstraintKind::PrimaryKey(columns) | ConstraintKind::Unique(columns) => {
                for c in columns {
                    if schema.field_with_name(c).is_err() {
                        return Err(CirroError::new(
                            SqlState::UNDEFINED_COLUMN,
                            format!("column \"{c}\" named in key does not exist"),
                        ));
                    }
                }
            }
            ConstraintKind::Check(sql) => {
                if has_subquery(&parse_check(sql)?) {
                    return Err(CirroError::unsupported(
                        "cannot use subquery in check constraint",
                    ));
                }
                let expr = engine.context().parse_sql_expr(sql, &df_schema)?;
                if has_aggregate(&expr) {
                    return Err(CirroError::new(
                        SqlState::GROUPING_ERROR,
                        format!(
                            "aggregate functions are not allowed in check constraints (\"{table}\")"
                        ),
                    ));
                }
                let data_type = expr.get_type(&df_schema)?;
                if data_type != arrow::datatypes::DataType::Boolean {
                    return Err(CirroError::new(
                        SqlState::DATATYPE_MISMATCH,
                        format!(
                            "argument of CHECK must be type boolean, not type {}",
                            cirro_storage::schema::sql_type_name(&data_type)
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn has_aggregate(expr: &Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    let mut found = false;
    let _ = expr.apply(|e| {
        if matches!(e, Expr::AggregateFunction(_) | Expr::WindowFunction(_)) {
            found = true;
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// The values of row `row` of `batch`, as `(1, abc)`.
fn row_text(batch: &RecordBatch, row: usize) -> String {
    let values: Vec<String> = batch
        .columns()
        .iter()
        .map(|c| {
            if c.is_null(row) {
                "null".to_string()
            } else {
                arrow::util::display::array_value_to_string(c, row).unwrap_or_default()
            }
        })
        .collect();
    format!("({})", values.join(", "))
}

fn first_row(batches: &[RecordBatch]) -> Option<(&RecordBatch, usize)> {
    batches.iter().find(|b| b.num_rows() > 0).map(|b| (b, 0))
}

/// Check the rows a write added (the data files `new_files` of `post`, the
/// table as the write would leave it) against the table's constraints.
pub(crate) async fn check(
    engine: &Engine,
    table: &str,
    post: &CirroTable,
    new_files: &[Path],
) -> Result<()> {
    let options = post.options().clone();
    if !options.has_checks() {
        return Ok(());
    }
    let post = post.without_row_ids();
    let added = post.with_only_files(new_files);
    if added.files().is_empty() {
        return Ok(());
    }
    let ctx = engine.context();
    let new_rows = ctx.read_table(Arc::new(added))?;
    for constraint in &options.constraints {
        let ConstraintKind::Check(sql) = &constraint.kind else {
            continue;
        };
        if let Some(row) = first_failing(&new_rows, sql).await? {
            return Err(CirroError::new(
                SqlState::CHECK_VIOLATION,
                format!(
                    "new row for relation \"{table}\" violates check constraint \"{}\": failing row contains {row}",
                    constraint.name,
                ),
            ));
        }
    }
    for (name, key, _) in options.unique_keys() {
        let (columns, not_null) = key_columns_not_null(&key);
        let new_keys = new_rows
            .clone()
            .filter(not_null.clone())?
            .select(columns)?
            .distinct()?;
        let sample = new_keys
            .clone()
            .limit(0, Some(IN_LIST_KEYS_MAX + 1))?
            .collect()
            .await?;
        let count_new: usize = sample.iter().map(|b| b.num_rows()).sum();
        if count_new == 0 {
            continue;
        }
        let all = ctx.read_table(Arc::new(post.clone()))?;
        let candidates = if count_new <= IN_LIST_KEYS_MAX {
            all.filter(in_lists(&key, &sample)?)?
        } else {
            semi_join(all, new_keys, &key)?
        };
        if let Some(values) = first_duplicate(candidates, &key).await? {
            return Err(CirroError::new(
                SqlState::UNIQUE_VIOLATION,
                format!(
                    "duplicate key value violates unique constraint \"{name}\": key ({})={values} already exists",
                    key.join(", "),
                ),
            ));
        }
    }
    Ok(())
}

/// The key's columns, and the condition that none is NULL.
fn key_columns_not_null(key: &[String]) -> (Vec<Expr>, Expr) {
    let columns: Vec<Expr> = key.iter().map(|c| column(c)).collect();
    let not_null = columns
        .iter()
        .cloned()
        .map(Expr::is_not_null)
        .reduce(Expr::and)
        .unwrap_or(lit(true));
    (columns, not_null)
}

/// The values, as `(1, abc)`, of a key that two rows of `rows` share (rows
/// with a NULL in the key do not count: NULLs are distinct).
pub(crate) async fn first_duplicate(rows: DataFrame, key: &[String]) -> Result<Option<String>> {
    let (columns, not_null) = key_columns_not_null(key);
    let duplicates = rows
        .filter(not_null)?
        .aggregate(columns.clone(), vec![count(lit(1)).alias("__cirro_n")])?
        .filter(column("__cirro_n").gt(lit(1i64)))?
        .select(columns)?
        .limit(0, Some(1))?
        .collect()
        .await?;
    Ok(first_row(&duplicates).map(|(batch, row)| row_text(batch, row)))
}

/// `k1 IN (…) AND k2 IN (…)`: each key column in the values it has in
/// `keys` (a superset of the rows with one of the keys; the grouping after
/// it is exact).
fn in_lists(key: &[String], keys: &[RecordBatch]) -> Result<Expr> {
    let mut filter: Option<Expr> = None;
    for (i, name) in key.iter().enumerate() {
        let mut values: HashSet<ScalarValue> = HashSet::new();
        for batch in keys {
            for row in 0..batch.num_rows() {
                values.insert(ScalarValue::try_from_array(batch.column(i), row)?);
            }
        }
        let list = column(name).in_list(values.into_iter().map(|v| lit(v)).collect(), false);
        filter = Some(match filter {
            Some(f) => f.and(list),
            None => list,
        });
    }
    filter.ok_or_else(|| CirroError::internal("a key without columns"))
}

/// The rows of `all` whose key is one of `keys`' (a DataFrame of the key
/// columns).
fn semi_join(all: DataFrame, keys: DataFrame, key: &[String]) -> Result<DataFrame> {
    let renamed: Vec<String> = (0..key.len()).map(|i| format!("__cirro_k{i}")).collect();
    let keys = keys.select(
        key.iter()
            .zip(&renamed)
            .map(|(c, r)| column(c).alias(r))
            .collect::<Vec<_>>(),
    )?;
    let left: Vec<&str> = key.iter().map(String::as_str).collect();
    let right: Vec<&str> = renamed.iter().map(String::as_str).collect();
    Ok(all.join(keys, JoinType::LeftSemi, &left, &right, None)?)
}
