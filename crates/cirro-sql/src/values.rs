//! VALUES lists nested inside the query of an INSERT.
//!
//! DataFusion plans `INSERT INTO t <query>` with t's columns as the "table
//! schema" of the whole query, and gives that schema to every VALUES list in
//! it: meant for `INSERT INTO t VALUES …`, it also hits a VALUES in a FROM
//! clause or CTE of `INSERT INTO t SELECT 1, x FROM (VALUES (1), (2)) v(x)`,
//! which then fails ("Inconsistent data length across values list") or has
//! its values cast to t's column types before the query computes with them.
//! PostgreSQL types such a VALUES list from its own values.
//!
//! [`detach_insert_values`] rewrites each nested VALUES list of an INSERT's
//! query (not a top-level one) into the `SELECT … UNION ALL SELECT …` it
//! means, with VALUES' column names (`column1`, `column2`, …) and the union's
//! type coercion (VALUES coerces its rows the same way). The unions form a
//! balanced tree, so a list of n rows is log2(n) deep, not n.

use std::ops::ControlFlow;
use std::sync::OnceLock;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, Query, Select, SelectItem, SetExpr, SetOperator, SetQuantifier, Statement, Values,
};
use datafusion::sql::sqlparser::parser::Parser;

use crate::walk::{WalkMut, WalkerMut};

use crate::CirroDialect;

/// Rewrite the VALUES lists nested in an INSERT's query (see the module docs).
/// Returns whether anything changed.
pub fn detach_insert_values(statement: &mut DFStatement) -> bool {
    let inner = match statement {
        DFStatement::Statement(inner) => inner,
        DFStatement::Explain(explain) => return detach_insert_values(&mut explain.statement),
        _ => return false,
    };
    let Statement::Insert(insert) = inner.as_mut() else {
        return false;
    };
    let Some(source) = insert.source.as_mut() else {
        return false;
    };
    if matches!(source.body.as_ref(), SetExpr::Values(_)) {
        return false; // the list the table's schema is meant for
    }
    let Some(template) = select_template() else {
        return false;
    };
    let mut rewriter = ValuesToUnion {
        template,
        changed: false,
    };
    let _ = source.walk_mut(&mut rewriter);
    rewriter.changed
}

/// An empty `SELECT` to fill in (sqlparser's `Select` has many fields),
/// parsed once per process.
fn select_template() -> Option<Select> {
    static TEMPLATE: OnceLock<Option<Select>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let mut statements = Parser::parse_sql(&CirroDialect, "SELECT 1").ok()?;
            match statements.pop()? {
                Statement::Query(query) => match *query.body {
                    SetExpr::Select(select) => Some(*select),
                    _ => None,
                },
                _ => None,
            }
        })
        .clone()
}

struct ValuesToUnion {
    template: Select,
    changed: bool,
}

impl WalkerMut for ValuesToUnion {
    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        self.rewrite(&mut query.body);
        ControlFlow::Continue(())
    }
}

impl ValuesToUnion {
    fn rewrite(&mut self, body: &mut SetExpr) {
        match body {
            SetExpr::Values(values) if !values.rows.is_empty() => {
                *body = self.union_of(values);
                self.changed = true;
            }
            SetExpr::SetOperation { left, right, .. } => {
                self.rewrite(left);
                self.rewrite(right);
            }
            _ => {}
        }
    }

    fn union_of(&self, values: &Values) -> SetExpr {
        let selects: Vec<SetExpr> = values
            .rows
            .iter()
            .map(|row| self.select_of(&row.content))
            .collect();
        balanced_union(selects)
    }

    fn select_of(&self, row: &[Expr]) -> SetExpr {
        let mut select = self.template.clone();
        select.projection = row
            .iter()
            .enumerate()
            .map(|(i, expr)| SelectItem::ExprWithAlias {
                expr: expr.clone(),
                alias: Ident::new(format!("column{}", i + 1)),
            })
            .collect();
        SetExpr::Select(Box::new(select))
    }
}

/// `a UNION ALL b UNION ALL …` as a balanced tree, in row order.
fn balanced_union(mut parts: Vec<SetExpr>) -> SetExpr {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let right = parts.split_off(parts.len() / 2);
    SetExpr::SetOperation {
        left: Box::new(balanced_union(parts)),
        op: SetOperator::Union,
        set_quantifier: SetQuantifier::All,
        right: Box::new(balanced_union(right)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParserBuilder;

    fn rewritten(sql: &str) -> String {
        let dialect = CirroDialect;
        let mut statement = DFParserBuilder::new(sql)
            .with_dialect(&dialect)
            .build()
            .expect("parser")
            .parse_statement()
            .expect("parses");
        detach_insert_values(&mut statement);
        statement.to_string()
    }

    #[test]
    fn nested_values_become_a_union() {
        assert_eq!(
            rewritten("INSERT INTO t SELECT 1, x FROM (VALUES (1), (2), (3)) AS v (x)"),
            "INSERT INTO t SELECT 1, x FROM (SELECT 1 AS column1 UNION ALL SELECT 2 AS column1 UNION ALL SELECT 3 AS column1) AS v (x)"
        );
    }

    #[test]
    fn top_level_values_and_other_statements_stay() {
        for sql in [
            "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
            "SELECT * FROM (VALUES (1), (2)) AS v (x)",
        ] {
            assert_eq!(rewritten(sql), sql);
        }
    }

    #[test]
    fn a_long_list_is_a_shallow_tree() {
        fn depth(body: &SetExpr) -> usize {
            match body {
                SetExpr::SetOperation { left, right, .. } => 1 + depth(left).max(depth(right)),
                _ => 0,
            }
        }
        let rows: Vec<String> = (0..1024).map(|i| format!("({i})")).collect();
        let values = Values {
            explicit_row: false,
            value_keyword: false,
            rows: Parser::parse_sql(&CirroDialect, &format!("VALUES {}", rows.join(",")))
                .ok()
                .and_then(|mut s| match s.pop()? {
                    Statement::Query(q) => match *q.body {
                        SetExpr::Values(v) => Some(v.rows),
                        _ => None,
                    },
                    _ => None,
                })
                .expect("rows"),
        };
        let rewriter = ValuesToUnion {
            template: select_template().expect("template"),
            changed: false,
        };
        assert_eq!(depth(&rewriter.union_of(&values)), 10);
    }
}
