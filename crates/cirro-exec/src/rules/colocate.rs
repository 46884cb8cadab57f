//! Co-located joins first: in a chain of inner joins, a join of two tables
//! bucketed alike on its keys (same distribution columns, same bucket count)
//! runs before a join that would need a shuffle anyway.
//!
//! DataFusion joins the tables of `FROM a, b, c` in the order written. In
//! TPC-H Q10 (`FROM customer, orders, lineitem`) that joins customer to
//! orders first; the result is partitioned by neither side's buckets, so the
//! join with lineitem (bucketed like orders, on orderkey) has to move the
//! wide customer rows between nodes. Joined the other way round,
//! `customer ⋈ (orders ⋈ lineitem)`, the inner join runs bucket by bucket
//! without an exchange and only its narrow result meets customer.
//!
//! The rewrite is the associativity of inner joins, applied only when it
//! turns a join whose sides are not co-located into one whose sides are,
//! the table it moves up (A below) is read whole, and both tables of the
//! co-located pair (B, C) are read with filters. Without statistics of the
//! join results (to come with ANALYZE) the rule stays on the safe side:
//! - A whole: joined on a foreign key it removes no rows, so the co-located
//!   join handles no more rows for going first; a filtered A may be
//!   selective, and small enough to be broadcast, which keeps B's buckets
//!   anyway (TPC-H Q3).
//! - B and C filtered: their join is then a reduced set that is cheap to
//!   move to A; whole, it can be far larger than A ⋈ B was (TPC-H Q18, every
//!   order with its lines: 53 → 87 MB exchanged on 2 nodes at SF1 when
//!   rotated; Q5: 2.5 → 8.6 MB).
//!
//! ```text
//!   (A ⋈₁ B) ⋈₂ C  →  A ⋈₁ (B ⋈₂ C)            ⋈₂'s left keys from B
//!   (A ⋈₁ B) ⋈₂ C  →  π[A,B,C] ((A ⋈₂ C) ⋈₁ B)   ⋈₂'s left keys from A
//! ```
//!
//! (and their mirror images when the join chain leans right; a projection
//! that only picks columns may sit between the two joins). A
//! non-equality filter of ⋈₂ that reads the third table moves to the outer
//! join, where every column is present; the answer is the same for inner
//! joins. Which scans are bucketed comes from the storage layer through
//! [`ScanBuckets`].

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, NullEquality, Result};
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, TableScan};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// How a scan's rows are bucketed: its distribution columns (names in the
/// scanned table, in hash order) and bucket count; None if not bucketed.
pub type ScanBuckets = fn(&TableScan) -> Option<(Vec<String>, u32)>;

/// The rule; see the module documentation.
#[derive(Debug)]
pub struct CoLocatedJoinsFirst {
    buckets: ScanBuckets,
}

impl CoLocatedJoinsFirst {
    pub fn new(buckets: ScanBuckets) -> Self {
        Self { buckets }
    }

    /// Where output column `index` of `plan` comes from unchanged: a
    /// bucketed scan (by address, unique within the plan) and the column's
    /// name in its table, with the scan's distribution.
    fn origin(&self, plan: &LogicalPlan, index: usize) -> Option<Origin> {
        match plan {
            LogicalPlan::TableScan(scan) => {
                let (columns, buckets) = (self.buckets)(scan)?;
                let name = scan.projected_schema.field(index).name().clone();
                Some(Origin {
                    scan: scan as *const TableScan as usize,
                    name,
                    columns,
                    buckets,
                })
            }
            LogicalPlan::Filter(f) => self.origin(&f.input, index),
            LogicalPlan::SubqueryAlias(a) => self.origin(&a.input, index),
            LogicalPlan::Projection(p) => match p.expr.get(index)?.clone().unalias_nested().data {
                Expr::Column(c) => {
                    self.origin(&p.input, p.input.schema().index_of_column(&c).ok()?)
                }
                _ => None,
            },
            // A join's output keeps the buckets of its sides only if it
            // is itself co-located (both sides partitioned on its keys).
            LogicalPlan::Join(j)
                if j.join_type == JoinType::Inner && self.co_located(&j.left, &j.right, &j.on) =>
            {
                let left = j.left.schema().fields().len();
                if index < left {
                    self.origin(&j.left, index)
                } else {
                    self.origin(&j.right, index - left)
                }
            }
            _ => None,
        }
    }

    fn key_origin(&self, plan: &LogicalPlan, key: &Expr) -> Option<Origin> {
        let Expr::Column(c) = key else { return None };
        self.origin(plan, plan.schema().index_of_column(c).ok()?)
    }

    /// Whether joining `left` and `right` on `on` pairs bucket with bucket:
    /// one table on each side, both bucketed into as many buckets, each
    /// distribution column matched by a key with the other's column in the
    /// same position.
    fn co_located(&self, left: &LogicalPlan, right: &LogicalPlan, on: &[(Expr, Expr)]) -> bool {
        let pairs: Option<Vec<(Origin, Origin)>> = on
            .iter()
            .map(|(l, r)| Some((self.key_origin(left, l)?, self.key_origin(right, r)?)))
            .collect();
        let Some(pairs) = pairs else { return false };
        let Some((l0, r0)) = pairs.first() else {
            return false;
        };
        if l0.buckets != r0.buckets || l0.columns.len() != r0.columns.len() {
            return false;
        }
        let same_tables = pairs
            .iter()
            .all(|(l, r)| l.scan == l0.scan && r.scan == r0.scan);
        same_tables
            && l0
                .columns
                .iter()
                .zip(&r0.columns)
                .all(|(lc, rc)| pairs.iter().any(|(l, r)| &l.name == lc && &r.name == rc))
    }
}

/// See [`CoLocatedJoinsFirst::origin`].
struct Origin {
    scan: usize,
    name: String,
    columns: Vec<String>,
    buckets: u32,
}

fn inner_join(plan: &LogicalPlan) -> Option<&Join> {
    match plan {
        LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => Some(j),
        _ => None,
    }
}

/// An inner join, or one under a projection that only picks its columns
/// (as DataFusion's projection pruning leaves between joins).
fn inner_join_below(plan: &LogicalPlan) -> Option<&Join> {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
            inner_join(&p.input)
        }
        _ => inner_join(plan),
    }
}

/// Whether `plan` is a whole table (a scan without filters, renamed or
/// projected). Joined on a foreign key, such a table keeps every row of the
/// other side, so joining it after the co-located pair costs no more join
/// work than before it; a filtered one may cut the rows the co-located join
/// would have to handle (and is small enough to be broadcast without moving
/// the other side, which then keeps its buckets), so it stays first.
fn unfiltered(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => scan.filters.is_empty() && scan.fetch.is_none(),
        LogicalPlan::SubqueryAlias(a) => unfiltered(&a.input),
        LogicalPlan::Projection(p) => unfiltered(&p.input),
        _ => false,
    }
}

/// Whether `plan` is a table read with a filter (in the scan or above it,
/// renamed or projected).
fn filtered(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => !scan.filters.is_empty(),
        LogicalPlan::Filter(f) => matches!(
            f.input.as_ref(),
            LogicalPlan::TableScan(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Projection(_)
        ),
        LogicalPlan::SubqueryAlias(a) => filtered(&a.input),
        LogicalPlan::Projection(p) => filtered(&p.input),
        _ => false,
    }
}

/// Whether every column `expr` reads is in `plan`'s output.
fn reads_only(expr: &Expr, plan: &LogicalPlan) -> bool {
    expr.column_refs()
        .iter()
        .all(|c| plan.schema().has_column(c))
}

/// A new inner join of `left` and `right` on `on` with the conjuncts of
/// `filter` that read only these two; the rest are returned for the join
/// above.
fn join(
    left: Arc<LogicalPlan>,
    right: Arc<LogicalPlan>,
    on: Vec<(Expr, Expr)>,
    filter: Option<Expr>,
    null_equality: NullEquality,
) -> Result<(LogicalPlan, Vec<Expr>)> {
    let (mut here, mut above) = (Vec::new(), Vec::new());
    for conjunct in filter.map(split_conjunction_owned).unwrap_or_default() {
        let refs: HashSet<&Column> = conjunct.column_refs();
        let readable = refs
            .iter()
            .all(|c| left.schema().has_column(c) || right.schema().has_column(c));
        if readable { &mut here } else { &mut above }.push(conjunct);
    }
    let join = Join::try_new(
        left,
        right,
        on,
        conjunction(here),
        JoinType::Inner,
        datafusion::common::JoinConstraint::On,
        null_equality,
        false,
    )?;
    Ok((LogicalPlan::Join(join), above))
}

impl OptimizerRule for CoLocatedJoinsFirst {
    fn name(&self) -> &str {
        "co_located_joins_first"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let Some(outer) = inner_join(&plan) else {
            return Ok(Transformed::no(plan));
        };
        if outer.on.is_empty() {
            return Ok(Transformed::no(plan));
        }
        // The chain leaning left, (A ⋈₁ B) ⋈₂ C, or right, C ⋈₂ (A ⋈₁ B).
        // The plan's shape is checked first; the co-location checks, which
        // trace keys down to the scans and ask the storage layer, only for
        // a shape that fits.
        for pair_on_left in [true, false] {
            let (pair, third) = if pair_on_left {
                (&outer.left, &outer.right)
            } else {
                (&outer.right, &outer.left)
            };
            let Some(inner) = inner_join_below(pair) else {
                continue;
            };
            if inner.on.is_empty() || !filtered(third) {
                continue;
            }
            // ⋈₂'s keys on the pair's side.
            let pair_keys: Vec<&Expr> = outer
                .on
                .iter()
                .map(|(l, r)| if pair_on_left { l } else { r })
                .collect();
            for partner_is_right in [true, false] {
                let (partner, other) = if partner_is_right {
                    (&inner.right, &inner.left)
                } else {
                    (&inner.left, &inner.right)
                };
                if !unfiltered(other)
                    || !filtered(partner)
                    || !pair_keys.iter().all(|k| reads_only(k, partner))
                {
                    continue;
                }
                let partner_meets_third = if pair_on_left {
                    self.co_located(partner, third, &outer.on)
                } else {
                    self.co_located(third, partner, &outer.on)
                };
                if !partner_meets_third
                    || self.co_located(&inner.left, &inner.right, &inner.on)
                    || self.co_located(&outer.left, &outer.right, &outer.on)
                {
                    continue;
                }
                let rewritten = self.rotate(
                    outer,
                    inner,
                    pair_on_left,
                    partner_is_right,
                    Arc::clone(partner),
                    Arc::clone(other),
                    Arc::clone(third),
                )?;
                return Ok(Transformed::yes(rewritten));
            }
        }
        Ok(Transformed::no(plan))
    }
}

impl CoLocatedJoinsFirst {
    /// Join `partner` with `third` first (keeping ⋈₂'s sides in their
    /// order), then `other` with that (keeping ⋈₁'s), then restore the
    /// original column order if it changed.
    #[allow(clippy::too_many_arguments)]
    fn rotate(
        &self,
        outer: &Join,
        inner: &Join,
        pair_on_left: bool,
        partner_is_right: bool,
        partner: Arc<LogicalPlan>,
        other: Arc<LogicalPlan>,
        third: Arc<LogicalPlan>,
    ) -> Result<LogicalPlan> {
        // ⋈₂'s keys keep their sides too.
        let (left, right) = if pair_on_left {
            (partner, third)
        } else {
            (third, partner)
        };
        let (first, mut above) = join(
            left,
            right,
            outer.on.clone(),
            outer.filter.clone(),
            outer.null_equality,
        )?;
        let first = Arc::new(first);
        // ⋈₁'s keys keep their sides: the partner's now come from `first`.
        let (left, right) = if partner_is_right {
            (other, first)
        } else {
            (first, other)
        };
        above.extend(
            inner
                .filter
                .clone()
                .map(split_conjunction_owned)
                .unwrap_or_default(),
        );
        let (second, rest) = join(
            left,
            right,
            inner.on.clone(),
            conjunction(above),
            inner.null_equality,
        )?;
        debug_assert!(rest.is_empty());
        let original = &outer.schema;
        if second.schema().columns() == original.columns() {
            return Ok(second);
        }
        let columns: Vec<Expr> = original
            .iter()
            .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
            .collect();
        LogicalPlanBuilder::from(second).project(columns)?.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::{LogicalTableSource, col, lit};
    use datafusion::optimizer::{Optimizer, OptimizerContext};

    /// orders and lineitem bucketed alike on their order keys; customer
    /// not bucketed; lineitem8 into another count.
    fn buckets(scan: &TableScan) -> Option<(Vec<String>, u32)> {
        match scan.table_name.table() {
            "orders" => Some((vec!["o_orderkey".into()], 4)),
            "lineitem" => Some((vec!["l_orderkey".into()], 4)),
            "lineitem_whole" => Some((vec!["l_orderkey".into()], 4)),
            "lineitem8" => Some((vec!["l_orderkey".into()], 8)),
            _ => None,
        }
    }

    fn scan(name: &str, columns: &[&str]) -> LogicalPlanBuilder {
        let schema = Schema::new(
            columns
                .iter()
                .map(|c| Field::new(*c, DataType::Int64, true))
                .collect::<Vec<_>>(),
        );
        let source = Arc::new(LogicalTableSource::new(Arc::new(schema)));
        LogicalPlanBuilder::scan(name, source, None).unwrap()
    }

    fn customer() -> LogicalPlanBuilder {
        scan("customer", &["c_custkey", "c_name"])
    }

    /// orders with a filter (as Q10's date range).
    fn orders() -> LogicalPlanBuilder {
        scan("orders", &["o_orderkey", "o_custkey"])
            .filter(col("o_custkey").gt(lit(0_i64)))
            .unwrap()
    }

    /// `left` joined to `right` on customer key (`customer` on either side).
    fn on_custkey(left: LogicalPlanBuilder, right: LogicalPlanBuilder) -> LogicalPlanBuilder {
        let right = right.build().unwrap();
        let keys = if right.schema().has_column_with_unqualified_name("o_custkey") {
            (vec!["c_custkey"], vec!["o_custkey"])
        } else {
            (vec!["o_custkey"], vec!["c_custkey"])
        };
        left.join(right, JoinType::Inner, keys, None).unwrap()
    }

    /// `first` joined to the lineitem table `name` on the order key (and
    /// `filter`), optimized: the plan's lines, trimmed. The table is read
    /// with a filter (as Q10's return flag) unless it is lineitem_whole.
    fn then_lineitem(first: LogicalPlanBuilder, name: &str, filter: Option<Expr>) -> Vec<String> {
        let mut lineitem = scan(name, &["l_orderkey", "l_price"]);
        if name != "lineitem_whole" {
            lineitem = lineitem.filter(col("l_price").gt(lit(0_i64))).unwrap();
        }
        let lineitem = lineitem.build().unwrap();
        let plan = first
            .join(
                lineitem,
                JoinType::Inner,
                (vec!["o_orderkey"], vec!["l_orderkey"]),
                filter,
            )
            .unwrap()
            .build()
            .unwrap();
        let rule = Arc::new(CoLocatedJoinsFirst::new(buckets));
        let optimized = Optimizer::with_rules(vec![rule])
            .optimize(plan.clone(), &OptimizerContext::new(), |_, _| {})
            .unwrap();
        // Same columns, in the same order, under the same names.
        assert_eq!(
            optimized.schema().columns(),
            plan.schema().columns(),
            "{optimized}"
        );
        let text = optimized.display_indent().to_string();
        println!("{text}");
        text.lines().map(|l| l.trim().to_string()).collect()
    }

    #[test]
    fn the_co_located_pair_is_joined_first() {
        // customer ⋈ orders ⋈ lineitem, as `FROM customer, orders,
        // lineitem` plans it: the customer join goes on top.
        let lines = then_lineitem(on_custkey(customer(), orders()), "lineitem", None);
        assert!(lines[0].contains("customer.c_custkey = orders.o_custkey"));
        assert!(lines[2].contains("orders.o_orderkey = lineitem.l_orderkey"));
    }

    #[test]
    fn a_projection_between_the_joins_is_seen_through() {
        // As DataFusion's projection pruning leaves `FROM c, o, l`.
        let first = on_custkey(customer(), orders())
            .project([col("c_name"), col("o_orderkey")])
            .unwrap();
        let lines = then_lineitem(first, "lineitem", None);
        assert!(
            lines[0]
                .starts_with("Projection: customer.c_name, orders.o_orderkey, lineitem.l_orderkey")
        );
        assert!(lines[1].contains("customer.c_custkey = orders.o_custkey"));
        assert!(lines[3].contains("orders.o_orderkey = lineitem.l_orderkey"));
    }

    #[test]
    fn a_filtered_table_stays_first() {
        // As in TPC-H Q3: a selective, broadcastable customer keeps its place.
        let filtered = customer().filter(col("c_name").eq(lit(7_i64))).unwrap();
        let lines = then_lineitem(on_custkey(filtered, orders()), "lineitem", None);
        assert!(lines[0].contains("orders.o_orderkey = lineitem.l_orderkey"));
    }

    #[test]
    fn a_pair_read_whole_stays_second() {
        // As in TPC-H Q18: orders ⋈ lineitem unfiltered would be larger
        // than what it saves.
        let lines = then_lineitem(on_custkey(customer(), orders()), "lineitem_whole", None);
        assert!(lines[0].contains("orders.o_orderkey = lineitem_whole.l_orderkey"));
    }

    #[test]
    fn a_pair_bucketed_differently_stays_where_it_was() {
        let lines = then_lineitem(on_custkey(customer(), orders()), "lineitem8", None);
        assert!(lines[0].contains("orders.o_orderkey = lineitem8.l_orderkey"));
    }

    #[test]
    fn the_first_table_as_partner_keeps_the_column_order() {
        // (orders ⋈ customer) ⋈ lineitem: orders, the partner, is on the
        // left of the first join; the rewrite projects the columns back.
        let lines = then_lineitem(on_custkey(orders(), customer()), "lineitem", None);
        assert!(lines[0].starts_with("Projection:"));
        assert!(lines[1].contains("customer.c_custkey"));
        assert!(lines[2].contains("orders.o_orderkey = lineitem.l_orderkey"));
    }

    #[test]
    fn a_filter_reading_the_third_table_moves_up() {
        let filter = col("c_name").lt(col("l_price"));
        let lines = then_lineitem(on_custkey(customer(), orders()), "lineitem", Some(filter));
        assert!(lines[0].contains("customer.c_name < lineitem.l_price"));
        assert!(!lines[2].contains("c_name"));
    }
}
