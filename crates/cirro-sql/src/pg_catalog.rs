//! Queries over PostgreSQL's catalogs (`pg_catalog`, `information_schema`,
//! `::regclass`, …), as psql's `\d`, JDBC's metadata and SQLAlchemy's
//! reflection send them: parsed by datafusion-pg-catalog's compatibility
//! parser (PostgreSQL dialect, its token-level substitutions and AST rewrite
//! rules) instead of the default one, then rewritten further here where
//! DataFusion cannot plan them as written.
//!
//! SQLAlchemy's column reflection (and similar driver queries) looks up
//! defaults, identity options and collations with correlated scalar
//! subqueries over `pg_catalog` tables, such as
//!
//! ```sql
//! CASE WHEN a.atthasdef THEN
//!   (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
//!    WHERE a.atthasdef AND d.adrelid = a.attrelid AND d.adnum = a.attnum)
//! END
//! ```
//!
//! DataFusion 55 decorrelates a scalar subquery only when it aggregates, and
//! not when its WHERE has a condition on the outer row alone (`a.atthasdef`):
//! planning fails with "Physical plan does not support logical expression
//! ScalarSubquery". For a correlated subquery that reads only `pg_catalog`
//! tables, [`rewrite_catalog_query`] aggregates the single selected value with
//! `max` (a catalog lookup by key finds at most one row, where PostgreSQL
//! would have raised an error for more) and moves the outer-only conditions
//! out: `CASE WHEN outer_conditions THEN (subquery) END`, which is NULL
//! exactly when the original found no row. Queries over user tables are left
//! alone: there `max` could hide a subquery that returns several rows.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident,
    ObjectNamePart, Query, SelectItem, SetExpr, Statement, TableFactor, TableWithJoins,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use crate::walk::{Walk, WalkMut, Walker, WalkerMut};

/// Whether a statement (its tokens, whitespace dropped) is a query that
/// reads PostgreSQL's catalogs or uses PostgreSQL-only syntax the
/// compatibility parser rewrites. Decided on tokens, so text inside string
/// literals never counts.
pub(crate) fn is_catalog_query(solid: &[Token]) -> bool {
    let word = |i: usize| match solid.get(i) {
        Some(Token::Word(w)) if w.quote_style.is_none() => Some(w.value.to_ascii_lowercase()),
        Some(Token::Word(w)) => Some(w.value.clone()),
        _ => None,
    };
    let starts_query = matches!(word(0).as_deref(), Some("select" | "with"))
        || matches!(solid.first(), Some(Token::LParen));
    if !starts_query {
        return false;
    }
    (0..solid.len()).any(|i| {
        let next_is_paren = matches!(solid.get(i + 1), Some(Token::LParen));
        match (&solid[i], word(i).as_deref()) {
            (Token::DoubleColon, _) => word(i + 1).is_some_and(|w| w.starts_with("reg")),
            (_, Some(w)) => {
                w.starts_with("pg_")
                    || w == "information_schema"
                    || (w.starts_with("current_") && !matches!(w, "current_user" | "current_role"))
                    || w == "collate"
                    || (matches!(w, "operator" | "any" | "all") && next_is_paren)
            }
            _ => false,
        }
    })
}

/// Parse a catalog query (see [`is_catalog_query`]) with the compatibility
/// parser and rewrite it. None when that parser cannot parse it or it is not
/// one query: the caller parses it the usual way.
pub(crate) fn parse_catalog_query(sql: &str) -> Option<Statement> {
    static PARSER: std::sync::OnceLock<PostgresCompatibilityParser> = std::sync::OnceLock::new();
    let parser = PARSER.get_or_init(PostgresCompatibilityParser::new);
    let mut statements = parser.parse(sql).ok()?;
    if statements.len() != 1 || !matches!(statements[0], Statement::Query(_)) {
        return None;
    }
    let mut statement = statements.pop()?;
    rewrite_catalog_query(&mut statement);
    Some(statement)
}

/// Rewrite what DataFusion cannot plan in a catalog query: correlated
/// scalar subqueries over `pg_catalog` tables (see the module docs), and the
/// vector and missing columns of [`CatalogColumns`].
pub(crate) fn rewrite_catalog_query(statement: &mut Statement) {
    let mut pg_class = HashSet::from(["pg_class".to_string()]);
    let _ = statement.walk(&mut PgClassAliases(&mut pg_class));
    let _ = statement.walk_mut(&mut CatalogColumns(pg_class));
    let _ = statement.walk_mut(&mut CatalogSubqueries);
    let _ = statement.walk_mut(&mut QualifyCirroViews);
}

/// The catalog views Cirro adds to `pg_catalog` (which the compatibility
/// parser does not know), qualified where a query names them alone.
struct QualifyCirroViews;

impl WalkerMut for QualifyCirroViews {
    fn pre_visit_table_factor(&mut self, table: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, .. } = table
            && name.0.len() == 1
            && name.0[0].as_ident().is_some_and(|i| {
                i.quote_style.is_none() && i.value.eq_ignore_ascii_case("pg_stat_activity")
            })
        {
            name.0
                .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
        }
        ControlFlow::Continue(())
    }
}

/// The `int2vector`/`oidvector` columns of pg_index (datafusion-pg-catalog
/// keeps PostgreSQL's text form, `1 2`) as arrays where a query unnests them,
/// and `pg_class.reloptions`, which its pg_class lacks, as a NULL array (no
/// Cirro table has storage options). SQLAlchemy's primary key, unique
/// constraint and index reflection need these. Holds the lower-case names
/// pg_class goes by in the statement.
struct CatalogColumns(HashSet<String>);

/// Collects the aliases given to pg_class.
struct PgClassAliases<'a>(&'a mut HashSet<String>);

impl Walker for PgClassAliases<'_> {
    fn pre_visit_table_factor(&mut self, table: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name,
            alias: Some(alias),
            ..
        } = table
            && name
                .0
                .last()
                .is_some_and(|p| p.to_string().eq_ignore_ascii_case("pg_class"))
        {
            self.0.insert(alias.name.value.to_ascii_lowercase());
        }
        ControlFlow::Continue(())
    }
}

const TEXT_VECTORS: [&str; 4] = ["indkey", "indclass", "indcollation", "indoption"];

impl WalkerMut for CatalogColumns {
    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let replacement = match expr {
            Expr::CompoundIdentifier(parts)
                if parts.len() >= 2
                    && self
                        .0
                        .contains(&parts[parts.len() - 2].value.to_ascii_lowercase())
                    && parts[parts.len() - 1]
                        .value
                        .eq_ignore_ascii_case("reloptions") =>
            {
                parse_expr("CAST(NULL AS TEXT[])")
            }
            Expr::Function(f) => {
                let name = f.name.0.last().map(|p| p.to_string().to_ascii_lowercase());
                let FunctionArguments::List(list) = &f.args else {
                    return ControlFlow::Continue(());
                };
                let first = match list.args.first() {
                    Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(first))) => first,
                    _ => return ControlFlow::Continue(()),
                };
                let is_vector = match first {
                    Expr::Identifier(column) => Some(column),
                    Expr::CompoundIdentifier(parts) => parts.last(),
                    _ => None,
                }
                .is_some_and(|column| {
                    TEXT_VECTORS.contains(&column.value.to_ascii_lowercase().as_str())
                });
                let elements = format!("string_to_array({first}, ' ')");
                match name.as_deref() {
                    Some("unnest") if is_vector && list.args.len() == 1 => {
                        parse_expr(&format!("unnest(CAST({elements} AS BIGINT[]))"))
                    }
                    Some("generate_subscripts") if is_vector && list.args.len() == 2 => parse_expr(
                        &format!("unnest(range(1, CAST(array_length({elements}) AS BIGINT) + 1))"),
                    ),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(replacement) = replacement {
            *expr = replacement;
        }
        ControlFlow::Continue(())
    }
}

struct CatalogSubqueries;

impl WalkerMut for CatalogSubqueries {
    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Subquery(query) = expr
            && let Some(rewritten) = rewrite(query)
        {
            *expr = rewritten;
        }
        ControlFlow::Continue(())
    }
}

const AGGREGATES: [&str; 9] = [
    "max",
    "min",
    "count",
    "sum",
    "avg",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
];

fn rewrite(query: &Query) -> Option<Expr> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    if query.with.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
        || select.projection.len() != 1
        || select.having.is_some()
        || !matches!(&select.group_by, GroupByExpr::Expressions(keys, _) if keys.is_empty())
    {
        return None;
    }
    let local = catalog_tables(&select.from)?;
    let is_outer = |qualifier: &str| !local.contains(&qualifier.to_ascii_lowercase());
    let mut correlated = false;
    let _ = query.walk(&mut Qualifiers(|q| correlated |= is_outer(q)));
    if !correlated {
        return None;
    }

    let mut inner = query.clone();
    let SetExpr::Select(select) = inner.body.as_mut() else {
        return None;
    };
    let value = match &select.projection[0] {
        SelectItem::UnnamedExpr(value) | SelectItem::ExprWithAlias { expr: value, .. } => {
            value.clone()
        }
        _ => return None,
    };
    let aggregate = aggregate_name(&value);
    // count is 0, not NULL, over no rows: its conditions stay where they are.
    if aggregate.as_deref() == Some("count") {
        return None;
    }
    let mut hoisted = vec![];
    if let Some(selection) = select.selection.take() {
        let mut kept = vec![];
        for conjunct in conjuncts(selection) {
            if outer_only(&conjunct, &is_outer) {
                hoisted.push(format!("({conjunct})"));
            } else {
                kept.push(conjunct);
            }
        }
        select.selection = kept.into_iter().reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::And,
            right: Box::new(b),
        });
    }
    // `inner` selecting `expr` instead of its value, as an expression.
    let selecting = |expr: &str| -> Option<Expr> {
        let mut query = inner.clone();
        if let SetExpr::Select(select) = query.body.as_mut() {
            select.projection = vec![SelectItem::UnnamedExpr(parse_expr(expr)?)];
        }
        Some(Expr::Subquery(Box::new(query)))
    };
    let mut outer_in_value = false;
    let _ = value.walk(&mut Qualifiers(|q| outer_in_value |= is_outer(q)));
    let result = if !outer_in_value {
        match aggregate {
            Some(_) => Expr::Subquery(Box::new(inner.clone())),
            None => selecting(&format!("max({value})"))?,
        }
    } else if aggregate.is_some() {
        return None;
    } else {
        // DataFusion does not decorrelate outer columns in the selected
        // value either: compute the value outside, each column of the
        // subquery's tables fetched by its own subquery, when a row exists.
        let mut failed = false;
        let mut computed = value;
        let mut fetch = InnerColumns(
            |column: &Expr| {
                let fetched = selecting(&format!("max({column})"));
                failed |= fetched.is_none();
                fetched
            },
            &is_outer,
        );
        let _ = computed.walk_mut(&mut fetch);
        if failed {
            return None;
        }
        hoisted.push(format!("{} > 0", selecting("count(*)")?));
        computed
    };
    if hoisted.is_empty() {
        return Some(result);
    }
    parse_expr(&format!(
        "CASE WHEN {} THEN {result} END",
        hoisted.join(" AND ")
    ))
}

/// Replaces every column of the subquery's own tables (qualified by one of
/// them, or unqualified) with what its function returns.
struct InnerColumns<'a, F: FnMut(&Expr) -> Option<Expr>>(F, &'a dyn Fn(&str) -> bool);

impl<F: FnMut(&Expr) -> Option<Expr>> WalkerMut for InnerColumns<'_, F> {
    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let inner = match expr {
            Expr::Identifier(_) => true,
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                !(self.1)(&parts[parts.len() - 2].value)
            }
            _ => false,
        };
        if inner && let Some(replacement) = (self.0)(expr) {
            *expr = replacement;
        }
        ControlFlow::Continue(())
    }
}

/// The lower-case names and aliases of the tables in `from`, when every one
/// is a `pg_catalog` table; None otherwise.
fn catalog_tables(from: &[TableWithJoins]) -> Option<HashSet<String>> {
    let mut names = HashSet::new();
    let relations = from
        .iter()
        .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)));
    for relation in relations {
        let TableFactor::Table { name, alias, .. } = relation else {
            return None;
        };
        let parts: Vec<String> = name
            .0
            .iter()
            .map(|p| p.to_string().to_ascii_lowercase())
            .collect();
        let table = parts.last()?;
        let in_catalog = match parts.len() {
            1 => table.starts_with("pg_"),
            _ => parts[parts.len() - 2] == "pg_catalog",
        };
        if !in_catalog {
            return None;
        }
        names.insert(table.clone());
        if let Some(alias) = alias {
            names.insert(alias.name.value.to_ascii_lowercase());
        }
    }
    (!names.is_empty()).then_some(names)
}

/// Calls its function with the table qualifier of every qualified column
/// reference (`t.c`, `s.t.c`).
struct Qualifiers<F: FnMut(&str)>(F);

impl<F: FnMut(&str)> Walker for Qualifiers<F> {
    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::CompoundIdentifier(parts) = expr
            && parts.len() >= 2
        {
            (self.0)(&parts[parts.len() - 2].value);
        }
        ControlFlow::Continue(())
    }
}

/// Whether `expr` refers only to the outer query: it names columns, all of
/// them qualified by an outer table, and has no subquery or unqualified name.
fn outer_only(expr: &Expr, is_outer: &dyn Fn(&str) -> bool) -> bool {
    struct Check<'a> {
        is_outer: &'a dyn Fn(&str) -> bool,
        columns: usize,
    }
    impl Walker for Check<'_> {
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::CompoundIdentifier(parts)
                    if parts.len() >= 2 && (self.is_outer)(&parts[parts.len() - 2].value) =>
                {
                    self.columns += 1;
                    ControlFlow::Continue(())
                }
                Expr::CompoundIdentifier(_)
                | Expr::Identifier(_)
                | Expr::Subquery(_)
                | Expr::Exists { .. }
                | Expr::InSubquery { .. } => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        }
    }
    let mut check = Check {
        is_outer,
        columns: 0,
    };
    expr.walk(&mut check).is_continue() && check.columns > 0
}

fn conjuncts(expr: Expr) -> Vec<Expr> {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let mut all = conjuncts(*left);
            all.extend(conjuncts(*right));
            all
        }
        Expr::Nested(inner)
            if matches!(
                *inner,
                Expr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                }
            ) =>
        {
            conjuncts(*inner)
        }
        other => vec![other],
    }
}

/// The lower-case name of the aggregate `expr` calls at its top, if any.
fn aggregate_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Function(f) => f
            .name
            .0
            .last()
            .map(|p| p.to_string().to_ascii_lowercase())
            .filter(|name| AGGREGATES.contains(&name.as_str())),
        Expr::Nested(inner) => aggregate_name(inner),
        _ => None,
    }
}

fn parse_expr(sql: &str) -> Option<Expr> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .ok()?
        .parse_expr()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let mut statement = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .expect("parse")
            .remove(0);
        rewrite_catalog_query(&mut statement);
        statement.to_string()
    }

    #[test]
    fn aggregates_and_hoists_outer_conditions_of_catalog_subqueries() {
        let got = rewritten(
            "SELECT CASE WHEN a.atthasdef THEN (SELECT pg_get_expr(d.adbin, d.adrelid) \
             FROM pg_catalog.pg_attrdef d WHERE a.atthasdef AND d.adrelid = a.attrelid) END \
             FROM pg_catalog.pg_attribute a",
        );
        assert_eq!(
            got,
            "SELECT CASE WHEN a.atthasdef THEN CASE WHEN (a.atthasdef) THEN (SELECT \
             max(pg_get_expr(d.adbin, d.adrelid)) FROM pg_catalog.pg_attrdef d WHERE \
             d.adrelid = a.attrelid) END END FROM pg_catalog.pg_attribute a"
        );
    }

    #[test]
    fn computes_values_with_outer_columns_outside_the_subquery() {
        let got = rewritten(
            "SELECT (SELECT json_build_object('always', a.attidentity = 'a', 'start', s.seqstart) \
             FROM pg_catalog.pg_sequence s WHERE a.attidentity <> '' AND s.seqrelid = a.attrelid) \
             FROM pg_catalog.pg_attribute a",
        );
        assert_eq!(
            got,
            "SELECT CASE WHEN (a.attidentity <> '') AND (SELECT count(*) FROM \
             pg_catalog.pg_sequence s WHERE s.seqrelid = a.attrelid) > 0 THEN \
             json_build_object('always', a.attidentity = 'a', 'start', (SELECT max(s.seqstart) \
             FROM pg_catalog.pg_sequence s WHERE s.seqrelid = a.attrelid)) END \
             FROM pg_catalog.pg_attribute a"
        );
    }

    #[test]
    fn unnests_text_vectors_and_nulls_missing_reloptions() {
        assert_eq!(
            rewritten(
                "SELECT unnest(i.indkey), generate_subscripts(i.indkey, 1), c.reloptions, \
                 pg_catalog.pg_class.reloptions FROM pg_catalog.pg_index i, pg_catalog.pg_class c"
            ),
            "SELECT unnest(CAST(string_to_array(i.indkey, ' ') AS BIGINT[])), \
             unnest(range(1, CAST(array_length(string_to_array(i.indkey, ' ')) AS BIGINT) + 1)), \
             CAST(NULL AS TEXT[]), CAST(NULL AS TEXT[]) FROM pg_catalog.pg_index i, pg_catalog.pg_class c"
        );
    }

    #[test]
    fn leaves_user_tables_uncorrelated_and_aggregated_subqueries_alone() {
        for sql in [
            "SELECT (SELECT t2.c FROM t2 WHERE t2.a = t1.a) FROM t1",
            "SELECT (SELECT typname FROM pg_catalog.pg_type WHERE oid = 23) FROM t1",
            "SELECT (SELECT count(*) FROM pg_catalog.pg_type t WHERE t1.b AND t.oid = t1.a) FROM t1",
        ] {
            let unchanged =
                Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parse")[0].to_string();
            assert_eq!(rewritten(sql), unchanged, "{sql}");
        }
    }
}
