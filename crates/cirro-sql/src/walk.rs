//! Walks over sqlparser's syntax tree, all through one visitor.
//!
//! sqlparser's traversal (`Visit::visit<V>`) is generic over the visitor, so
//! every visitor type compiles the whole traversal again: about 500
//! functions, each behind a stack-growth guard. Release builds do not share
//! generic code between crates, so each crate that names a visitor compiles
//! its own copies. With a visitor type per walk (17 of them), that traversal
//! was 97 % of this crate's LLVM IR and 40 % of the engine's, minutes of a
//! cold build.
//!
//! Here the traversal is compiled once to read and once to change, for a
//! visitor that forwards to a [`Walker`] (or [`WalkerMut`]) trait object, in
//! this crate only: [`Walk::walk`] and [`WalkMut::walk_mut`] are not generic.
//! A walker implements the hooks it needs under sqlparser's names; a walk
//! that stops early returns `Break(())` and keeps what it found in itself.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, ObjectName, Query, Select, Statement, TableFactor, ValueWithSpan, Visit, VisitMut,
    Visitor, VisitorMut,
};

const GO_ON: ControlFlow<()> = ControlFlow::Continue(());

/// A walk that reads the tree: each hook runs before (`pre_`) or after
/// (`post_`) the node's children; `Break(())` ends the walk.
#[rustfmt::skip]
pub trait Walker {
    fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> { GO_ON }
    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> { GO_ON }
    fn pre_visit_select(&mut self, _: &Select) -> ControlFlow<()> { GO_ON }
    fn post_visit_select(&mut self, _: &Select) -> ControlFlow<()> { GO_ON }
    fn pre_visit_relation(&mut self, _: &ObjectName) -> ControlFlow<()> { GO_ON }
    fn post_visit_relation(&mut self, _: &ObjectName) -> ControlFlow<()> { GO_ON }
    fn pre_visit_table_factor(&mut self, _: &TableFactor) -> ControlFlow<()> { GO_ON }
    fn post_visit_table_factor(&mut self, _: &TableFactor) -> ControlFlow<()> { GO_ON }
    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> { GO_ON }
    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> { GO_ON }
    fn pre_visit_statement(&mut self, _: &Statement) -> ControlFlow<()> { GO_ON }
    fn post_visit_statement(&mut self, _: &Statement) -> ControlFlow<()> { GO_ON }
    fn pre_visit_value(&mut self, _: &ValueWithSpan) -> ControlFlow<()> { GO_ON }
    fn post_visit_value(&mut self, _: &ValueWithSpan) -> ControlFlow<()> { GO_ON }
}

/// A walk that may change the tree in place; hooks as in [`Walker`].
#[rustfmt::skip]
pub trait WalkerMut {
    fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> { GO_ON }
    fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> { GO_ON }
    fn pre_visit_select(&mut self, _: &mut Select) -> ControlFlow<()> { GO_ON }
    fn post_visit_select(&mut self, _: &mut Select) -> ControlFlow<()> { GO_ON }
    fn pre_visit_relation(&mut self, _: &mut ObjectName) -> ControlFlow<()> { GO_ON }
    fn post_visit_relation(&mut self, _: &mut ObjectName) -> ControlFlow<()> { GO_ON }
    fn pre_visit_table_factor(&mut self, _: &mut TableFactor) -> ControlFlow<()> { GO_ON }
    fn post_visit_table_factor(&mut self, _: &mut TableFactor) -> ControlFlow<()> { GO_ON }
    fn pre_visit_expr(&mut self, _: &mut Expr) -> ControlFlow<()> { GO_ON }
    fn post_visit_expr(&mut self, _: &mut Expr) -> ControlFlow<()> { GO_ON }
    fn pre_visit_statement(&mut self, _: &mut Statement) -> ControlFlow<()> { GO_ON }
    fn post_visit_statement(&mut self, _: &mut Statement) -> ControlFlow<()> { GO_ON }
    fn pre_visit_value(&mut self, _: &mut ValueWithSpan) -> ControlFlow<()> { GO_ON }
    fn post_visit_value(&mut self, _: &mut ValueWithSpan) -> ControlFlow<()> { GO_ON }
}

/// The one reading visitor sqlparser's traversal is compiled for.
struct Reading<'a>(&'a mut dyn Walker);

/// The one changing visitor sqlparser's traversal is compiled for.
struct Changing<'a>(&'a mut dyn WalkerMut);

/// Forward each named hook of sqlparser's visitor trait to the walker.
macro_rules! forward {
    ($($hook:ident: $node:ty),* $(,)?) => {
        impl Visitor for Reading<'_> {
            type Break = ();
            $(fn $hook(&mut self, node: &$node) -> ControlFlow<()> { self.0.$hook(node) })*
        }
        impl VisitorMut for Changing<'_> {
            type Break = ();
            $(fn $hook(&mut self, node: &mut $node) -> ControlFlow<()> { self.0.$hook(node) })*
        }
    };
}

forward!(
    pre_visit_query: Query,
    post_visit_query: Query,
    pre_visit_select: Select,
    post_visit_select: Select,
    pre_visit_relation: ObjectName,
    post_visit_relation: ObjectName,
    pre_visit_table_factor: TableFactor,
    post_visit_table_factor: TableFactor,
    pre_visit_expr: Expr,
    post_visit_expr: Expr,
    pre_visit_statement: Statement,
    post_visit_statement: Statement,
    pre_visit_value: ValueWithSpan,
    post_visit_value: ValueWithSpan,
);

/// A node a [`Walker`] can walk from.
pub trait Walk {
    fn walk(&self, walker: &mut dyn Walker) -> ControlFlow<()>;
}

/// A node a [`WalkerMut`] can walk from.
pub trait WalkMut {
    fn walk_mut(&mut self, walker: &mut dyn WalkerMut) -> ControlFlow<()>;
}

/// The node types walks start from (each a non-generic entry point, so the
/// traversal below it is compiled here).
macro_rules! roots {
    ($($root:ty),*) => {$(
        impl Walk for $root {
            fn walk(&self, walker: &mut dyn Walker) -> ControlFlow<()> {
                Visit::visit(self, &mut Reading(walker))
            }
        }
        impl WalkMut for $root {
            fn walk_mut(&mut self, walker: &mut dyn WalkerMut) -> ControlFlow<()> {
                VisitMut::visit(self, &mut Changing(walker))
            }
        }
    )*};
}

roots!(Statement, Query, Expr);

/// Call `f` with every relation (table or view name) `statement` names, in
/// the order sqlparser's `visit_relations` would.
pub fn each_relation(statement: &Statement, f: &mut dyn FnMut(&ObjectName)) {
    struct Relations<'a>(&'a mut dyn FnMut(&ObjectName));
    impl Walker for Relations<'_> {
        fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
            (self.0)(name);
            GO_ON
        }
    }
    let _ = statement.walk(&mut Relations(f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CirroDialect;
    use datafusion::sql::sqlparser::ast::Ident;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(sql: &str) -> Statement {
        Parser::parse_sql(&CirroDialect, sql)
            .unwrap()
            .pop()
            .unwrap()
    }

    #[test]
    fn relations_come_in_sqlparsers_order_from_every_depth() {
        let statement = parse(
            "SELECT * FROM a JOIN s.b ON true WHERE x IN (SELECT y FROM c) \
             AND EXISTS (SELECT 1 FROM (SELECT 1 FROM d) AS e)",
        );
        let mut ours = Vec::new();
        each_relation(&statement, &mut |name| ours.push(name.to_string()));
        let mut theirs = Vec::new();
        let _ = datafusion::sql::sqlparser::ast::visit_relations(&statement, |name| {
            theirs.push(name.to_string());
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(ours, ["a", "s.b", "c", "d"]);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn a_break_ends_the_walk_and_a_change_stays() {
        struct FirstTwo(Vec<String>);
        impl Walker for FirstTwo {
            fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
                if let Expr::Identifier(ident) = expr {
                    self.0.push(ident.value.clone());
                }
                if self.0.len() == 2 {
                    ControlFlow::Break(())
                } else {
                    GO_ON
                }
            }
        }
        let statement = parse("SELECT a + b + c FROM t");
        let mut first = FirstTwo(Vec::new());
        assert!(statement.walk(&mut first).is_break());
        assert_eq!(first.0, ["a", "b"]);

        struct Rename;
        impl WalkerMut for Rename {
            fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
                if let Expr::Identifier(ident) = expr {
                    *ident = Ident::new(ident.value.to_uppercase());
                }
                GO_ON
            }
        }
        let mut statement = parse("SELECT a + (SELECT max(b) FROM u) FROM t");
        assert!(statement.walk_mut(&mut Rename).is_continue());
        assert_eq!(
            statement.to_string(),
            "SELECT A + (SELECT max(B) FROM u) FROM t"
        );
    }
}
