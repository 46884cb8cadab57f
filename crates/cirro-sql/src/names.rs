//! Output column names as PostgreSQL gives them.
//!
//! DataFusion names an unaliased expression by its text (`Int64(1) +
//! Int64(2)`, `Utf8("x")`); PostgreSQL by FigureColname: a column's name, a
//! function's name, a cast's type name (`int4`, `numeric`) unless its
//! operand has a better one, `case`, `bool` for TRUE/FALSE, else
//! `?column?`. [`name_outputs`] gives the outermost SELECT list of a query
//! those names as aliases, so every front end shows them.
//!
//! PostgreSQL lets a SELECT list hold two columns of the same name
//! (`SELECT 1, 1`, `SELECT x, x::text`); DataFusion refuses a projection whose
//! names repeat. Repeats get `_1`, `_2`, … added (a difference from
//! PostgreSQL, in the differential test's allowlist). When planning fails for
//! that reason in an inner SELECT list, the engine plans again after
//! [`name_projections`], which names every SELECT list that way.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, Query, SelectItem, SetExpr, Statement, TableAliasColumnDef, TableFactor,
};

use crate::walk::{WalkMut, WalkerMut};

/// The message of DataFusion's error for a projection whose names repeat.
pub const DUPLICATE_PROJECTION_NAMES: &str = "Projections require unique expression names";

/// Alias the unaliased expressions of the outermost SELECT list(s) of a
/// query (both sides of a UNION) with PostgreSQL's names; other statements
/// are left as they are.
pub fn name_outputs(statement: &mut DFStatement) {
    if let DFStatement::Statement(inner) = statement
        && let Statement::Query(query) = inner.as_mut()
    {
        name_set_expr(&mut query.body);
    }
}

/// Alias the unaliased expressions of every SELECT list in `statement`.
pub fn name_projections(statement: &mut DFStatement) {
    walk_sql(statement, &mut Namer);
}

/// `walker` over the SQL statement of `statement` (EXPLAIN's too).
fn walk_sql(statement: &mut DFStatement, walker: &mut dyn WalkerMut) {
    match statement {
        DFStatement::Statement(inner) => {
            let _ = inner.walk_mut(walker);
        }
        DFStatement::Explain(explain) => walk_sql(&mut explain.statement, walker),
        _ => {}
    }
}

/// Name the column of a set-returning function aliased in FROM without
/// column names as PostgreSQL does: `generate_series(1, n) AS aid` (as
/// pgbench writes it) or `unnest(a) AS x` returns one value per row, and
/// PostgreSQL names that column by the alias (`aid`); DataFusion keeps its
/// own name (`value`, so only `aid.value` would do). Such an alias gets
/// its own name as the column's: `AS aid(aid)`.
pub fn name_function_columns(statement: &mut DFStatement) {
    walk_sql(statement, &mut FunctionColumns);
}

struct FunctionColumns;

/// The table functions that return one column (DataFusion's `value`).
const ONE_COLUMN_FUNCTIONS: [&str; 2] = ["generate_series", "range"];

impl WalkerMut for FunctionColumns {
    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let alias = match factor {
            TableFactor::Table {
                name,
                args: Some(_),
                alias: Some(alias),
                ..
            } if name
                .0
                .last()
                .and_then(|part| part.as_ident())
                .is_some_and(|f| {
                    ONE_COLUMN_FUNCTIONS
                        .iter()
                        .any(|one| f.value.eq_ignore_ascii_case(one))
                }) =>
            {
                alias
            }
            TableFactor::UNNEST {
                alias: Some(alias),
                array_exprs,
                with_offset: false,
                with_ordinality: false,
                ..
            } if array_exprs.len() == 1 => alias,
            _ => return ControlFlow::Continue(()),
        };
        if alias.columns.is_empty() {
            alias.columns.push(TableAliasColumnDef {
                name: alias.name.clone(),
                data_type: None,
            });
        }
        ControlFlow::Continue(())
    }
}

struct Namer;

impl WalkerMut for Namer {
    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        name_set_expr(&mut query.body);
        ControlFlow::Continue(())
    }
}

fn name_set_expr(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => name_items(&mut select.projection),
        SetExpr::SetOperation { left, right, .. } => {
            name_set_expr(left);
            name_set_expr(right);
        }
        _ => {}
    }
}

fn name_items(items: &mut [SelectItem]) {
    let mut taken: HashSet<String> = items
        .iter()
        .filter_map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            SelectItem::UnnamedExpr(expr) => column_name(expr),
            _ => None,
        })
        .collect();
    let mut seen: HashSet<String> = HashSet::new();
    for item in items.iter_mut() {
        let name = match item {
            SelectItem::UnnamedExpr(expr) => match column_name(expr) {
                // A plain column keeps its name unless it repeats.
                Some(name) if seen.insert(name.clone()) => continue,
                Some(name) => name,
                None => postgres_name(expr),
            },
            SelectItem::ExprWithAlias { alias, .. } => {
                if seen.insert(alias.value.clone()) {
                    continue;
                }
                // `SELECT 1 AS a, 2 AS a`: a repeated alias is made unique.
                let name = alias.value.clone();
                let mut unique = format!("{name}_1");
                let mut n = 2;
                while seen.contains(&unique) || taken.contains(&unique) {
                    unique = format!("{name}_{n}");
                    n += 1;
                }
                seen.insert(unique.clone());
                taken.insert(unique.clone());
                *alias = Ident::with_quote('"', unique);
                continue;
            }
            _ => continue,
        };
        let mut unique = name.clone();
        let mut n = 1;
        while seen.contains(&unique) || (unique != name && taken.contains(&unique)) {
            unique = format!("{name}_{n}");
            n += 1;
        }
        seen.insert(unique.clone());
        taken.insert(unique.clone());
        let SelectItem::UnnamedExpr(expr) = item else {
            continue;
        };
        let expr = std::mem::replace(
            expr,
            Expr::value(datafusion::sql::sqlparser::ast::Value::Null),
        );
        *item = SelectItem::ExprWithAlias {
            expr,
            alias: Ident::with_quote('"', unique),
        };
    }
}

/// The name of a plain column reference.
fn column_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Identifier(ident) => Some(normalized(ident)),
        Expr::CompoundIdentifier(parts) => parts.last().map(normalized),
        _ => None,
    }
}

fn normalized(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// PostgreSQL's name for an expression in a SELECT list (FigureColname).
fn postgres_name(expr: &Expr) -> String {
    figure(expr)
        .map(|(name, _)| name)
        .unwrap_or_else(|| "?column?".to_string())
}

/// FigureColnameInternal: a name and its strength (2: a column's or
/// function's, 1: a type's guess), or None.
/// The length a string type declares (`VARCHAR(3)`: 3).
pub(crate) fn declared_length(
    data_type: &datafusion::sql::sqlparser::ast::DataType,
) -> Option<u64> {
    use datafusion::sql::sqlparser::ast::{CharacterLength, DataType as SqlType};
    match data_type {
        SqlType::Varchar(Some(CharacterLength::IntegerLength { length, .. }))
        | SqlType::CharacterVarying(Some(CharacterLength::IntegerLength { length, .. }))
        | SqlType::CharVarying(Some(CharacterLength::IntegerLength { length, .. }))
        | SqlType::Char(Some(CharacterLength::IntegerLength { length, .. }))
        | SqlType::Character(Some(CharacterLength::IntegerLength { length, .. })) => Some(*length),
        _ => None,
    }
}

fn figure(expr: &Expr) -> Option<(String, u8)> {
    use datafusion::sql::sqlparser::ast::Value;
    let named = |name: &str| Some((name.to_string(), 2));
    match expr {
        Expr::Identifier(_) | Expr::CompoundIdentifier(_) => column_name(expr).map(|n| (n, 2)),
        Expr::Function(function) => {
            let name = function
                .name
                .0
                .last()
                .and_then(|part| part.as_ident())
                .map(normalized)?;
            // `x::varchar(3)`, shaped as `left(CAST(x AS VARCHAR(3)), 3)`
            // (a cast to a string type of a length, cut at that length; a
            // `left(NULL::text, 2)` of the user's is `left`).
            if let ("left", datafusion::sql::sqlparser::ast::FunctionArguments::List(list)) =
                (name.as_str(), &function.args)
                && let [
                    datafusion::sql::sqlparser::ast::FunctionArg::Unnamed(
                        datafusion::sql::sqlparser::ast::FunctionArgExpr::Expr(
                            cast @ Expr::Cast { data_type, .. },
                        ),
                    ),
                    datafusion::sql::sqlparser::ast::FunctionArg::Unnamed(
                        datafusion::sql::sqlparser::ast::FunctionArgExpr::Expr(Expr::Value(cut)),
                    ),
                ] = list.args.as_slice()
                && matches!(&cut.value, Value::Number(n, _) if Some(n.clone()) == declared_length(data_type).map(|l| l.to_string()))
            {
                return figure(cast);
            }
            Some((name, 2))
        }
        Expr::Cast {
            expr: inner,
            data_type,
            ..
        } => match figure(inner) {
            Some((name, 2)) => Some((name, 2)),
            _ => Some((pg_type_name(data_type), 1)),
        },
        Expr::TypedString(typed) => Some((pg_type_name(&typed.data_type), 1)),
        Expr::Value(value) => match value.value {
            Value::Boolean(_) => Some(("bool".to_string(), 1)),
            _ => None,
        },
        // `mod(a, b)`, shaped as `((a) % (b))` (see shape.rs).
        Expr::Nested(inner)
            if matches!(inner.as_ref(), Expr::BinaryOp {
                op: datafusion::sql::sqlparser::ast::BinaryOperator::Modulo,
                left,
                right,
            } if matches!(left.as_ref(), Expr::Nested(_)) && matches!(right.as_ref(), Expr::Nested(_))) =>
        {
            named("mod")
        }
        Expr::Nested(inner) => figure(inner),
        // The ELSE result's name if it has a strong one (PostgreSQL's rule).
        Expr::Case { else_result, .. } => match else_result.as_deref().and_then(figure) {
            Some((name, 2)) => Some((name, 2)),
            _ => Some(("case".to_string(), 1)),
        },
        Expr::Extract { .. } => named("extract"),
        Expr::Substring {
            shorthand: true, ..
        } => named("substr"),
        Expr::Substring { .. } => named("substring"),
        Expr::Position { .. } => named("position"),
        Expr::Overlay { .. } => named("overlay"),
        Expr::Trim { .. } => named("btrim"),
        Expr::Ceil { .. } => named("ceil"),
        Expr::Floor { .. } => named("floor"),
        Expr::Exists { .. } => named("exists"),
        Expr::Array(_) => named("array"),
        Expr::Tuple(_) => named("row"),
        Expr::Subquery(query) => match query.body.as_ref() {
            SetExpr::Select(select) => match select.projection.first() {
                Some(SelectItem::ExprWithAlias { alias, .. }) => Some((alias.value.clone(), 2)),
                Some(SelectItem::UnnamedExpr(inner)) => figure(inner),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// The name PostgreSQL's catalog gives a SQL type (`integer` is `int4`).
fn pg_type_name(data_type: &datafusion::sql::sqlparser::ast::DataType) -> String {
    use datafusion::sql::sqlparser::ast::{DataType as T, ExactNumberInfo};
    match data_type {
        T::SmallInt(_) | T::Int2(_) => "int2",
        T::Int(_) | T::Integer(_) | T::Int4(_) => "int4",
        T::BigInt(_) | T::Int8(_) => "int8",
        T::Real | T::Float4 => "float4",
        T::Float(ExactNumberInfo::Precision(p)) if *p <= 24 => "float4",
        T::Float(_) | T::Double(_) | T::DoublePrecision | T::Float8 => "float8",
        T::Numeric(_) | T::Decimal(_) | T::Dec(_) => "numeric",
        T::Varchar(_) | T::CharacterVarying(_) | T::CharVarying(_) => "varchar",
        T::Char(_) | T::Character(_) => "bpchar",
        T::Text | T::String(_) => "text",
        T::Boolean | T::Bool => "bool",
        T::Date => "date",
        T::Timestamp(_, datafusion::sql::sqlparser::ast::TimezoneInfo::WithTimeZone)
        | T::Timestamp(_, datafusion::sql::sqlparser::ast::TimezoneInfo::Tz) => "timestamptz",
        T::Timestamp(..) | T::Datetime(_) => "timestamp",
        T::Time(..) => "time",
        T::Interval { .. } => "interval",
        T::Bytea => "bytea",
        other => return other.to_string().to_lowercase(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;

    fn named(sql: &str) -> String {
        let Some(mut statement) = parse(sql).expect("parse").statement.to_datafusion() else {
            panic!("not SQL");
        };
        name_projections(&mut statement);
        statement.to_string()
    }

    fn outputs(sql: &str) -> String {
        let Some(mut statement) = parse(sql).expect("parse").statement.to_datafusion() else {
            panic!("not SQL");
        };
        name_outputs(&mut statement);
        statement.to_string()
    }

    #[test]
    fn repeated_names_get_postgres_names_made_unique() {
        assert_eq!(
            named("SELECT 1, 1, a, a, a::text, count(*), CASE WHEN a THEN 1 END FROM t"),
            "SELECT 1 AS \"?column?\", 1 AS \"?column?_1\", a, a AS \"a_1\", a::TEXT AS \"a_2\", \
             count(*) AS \"count\", CASE WHEN a THEN 1 END AS \"case\" FROM t"
        );
        assert_eq!(
            outputs(
                "SELECT 1 + 2, a, a::int, 1::integer, '1'::numeric(5,2), TRUE, DATE '2024-01-01', \
                     upper(b), trim(b), -a, (SELECT max(c) FROM u) FROM t"
            ),
            "SELECT 1 + 2 AS \"?column?\", a, a::INT AS \"a_1\", 1::INTEGER AS \"int4\", \
             '1'::NUMERIC(5,2) AS \"numeric\", true AS \"bool\", DATE '2024-01-01' AS \"date\", \
             upper(b) AS \"upper\", TRIM(b) AS \"btrim\", -a AS \"?column?_1\", \
             (SELECT max(c) FROM u) AS \"max\" FROM t"
        );
        // Only the outermost list, and only of a query.
        assert_eq!(
            outputs("SELECT s.x FROM (SELECT 1 + 1 AS x, 2 + 2) s"),
            "SELECT s.x FROM (SELECT 1 + 1 AS x, 2 + 2) s"
        );
        assert_eq!(
            outputs("INSERT INTO t SELECT 1 + 1"),
            "INSERT INTO t SELECT 1 + 1"
        );
        assert_eq!(
            named("SELECT x FROM (SELECT 1 AS x UNION SELECT sum(y) FROM u) s"),
            "SELECT x FROM (SELECT 1 AS x UNION SELECT sum(y) AS \"sum\" FROM u) s"
        );
    }
}
