//! Output column names for projections DataFusion cannot name apart.
//!
//! PostgreSQL lets a SELECT list hold two columns of the same name
//! (`SELECT 1, 1`, `SELECT x, x::text`); DataFusion names an unaliased
//! expression by its text and refuses a projection whose names repeat. When
//! planning fails for that reason the engine plans again after
//! [`name_projections`], which gives every unaliased expression of every
//! SELECT list PostgreSQL's name for it (a function's name, a cast column's
//! name, else `?column?`), with `_1`, `_2`, … added where a name repeats.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, Query, SelectItem, SetExpr, Statement, VisitMut, VisitorMut,
};

/// The message of DataFusion's error for a projection whose names repeat.
pub const DUPLICATE_PROJECTION_NAMES: &str = "Projections require unique expression names";

/// Alias the unaliased expressions of every SELECT list in `statement`.
pub fn name_projections(statement: &mut DFStatement) {
    let mut namer = Namer;
    match statement {
        DFStatement::Statement(inner) => {
            let _ = inner.visit(&mut namer);
        }
        DFStatement::Explain(explain) => name_projections(&mut explain.statement),
        _ => {}
    }
}

struct Namer;

impl VisitorMut for Namer {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        name_set_expr(&mut query.body);
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, _statement: &mut Statement) -> ControlFlow<()> {
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
                seen.insert(alias.value.clone());
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

/// PostgreSQL's name for an expression in a SELECT list (FigureColname, in
/// part): a function's name, a cast's operand's name, `case`, else `?column?`.
fn postgres_name(expr: &Expr) -> String {
    match expr {
        Expr::Function(function) => function
            .name
            .0
            .last()
            .and_then(|part| part.as_ident())
            .map(normalized)
            .unwrap_or_else(|| "?column?".to_string()),
        Expr::Cast { expr, .. } | Expr::Nested(expr) => {
            column_name(expr).unwrap_or_else(|| postgres_name(expr))
        }
        Expr::Case { .. } => "case".to_string(),
        _ => column_name(expr).unwrap_or_else(|| "?column?".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Statement as Cirro, parse};

    fn named(sql: &str) -> String {
        let Cirro::Sql(mut statement) = parse(sql).expect("parse").statement else {
            panic!("not SQL");
        };
        name_projections(&mut statement);
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
            named("SELECT x FROM (SELECT 1 AS x UNION SELECT sum(y) FROM u) s"),
            "SELECT x FROM (SELECT 1 AS x UNION SELECT sum(y) AS \"sum\" FROM u) s"
        );
    }
}
