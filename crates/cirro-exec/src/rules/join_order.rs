//! Join order from estimated sizes: the inner joins of a query are put in
//! the order that keeps the intermediate results smallest, instead of the
//! order of the `FROM` list.
//!
//! DataFusion joins `FROM a, b, c` in the order written and only swaps the
//! two sides of each join (the smaller one builds the hash table). In TPC-H
//! Q21 (`FROM supplier, lineitem l1, orders, nation`) that joins every
//! supplier's late lines to their orders (tens of millions of rows at SF10,
//! shuffled across threads) before the filter on `nation` keeps one
//! twenty-fifth of them; joined nation → supplier → lineitem → orders, the
//! filter acts first.
//!
//! # The rewrite
//! A *group* is a maximal tree of inner joins (a projection that only picks
//! columns may sit between them); its *leaves* are the inputs that are not
//! such joins (scans with their filters, subqueries, outer or semi joins),
//! each reordered inside on its own. The equality conditions of the group's
//! joins are its edges (an edge joins the two leaves whose columns its two
//! sides read); the other conditions are filters, placed on the lowest join
//! that reads everything they read. Greedily, the two connected parts whose
//! join is estimated smallest are joined next, the smaller part on the left
//! (DataFusion builds the hash table from the left), until one part is
//! left; each join built passes on only the columns read above it (see
//! [`keep_needed`]), and a projection restores the group's columns in
//! their order.
//! Subqueries in the plan's expressions are ordered too. A group
//! whose parts are not all connected by edges (a cross join) is left as
//! written, and so is one of fewer than three leaves, one that is already
//! in the chosen order (a later optimizer pass: its pruned columns stay
//! pruned), and one that joins two or more hash-distributed tables (the
//! co-located rule, [`super::CoLocatedJoinsFirst`], orders those).
//!
//! # The estimates (no statistics of join results yet)
//! - a table: its rows, from the storage (the snapshot's row counts);
//! - a filter: the rows below it times its selectivity: a column compared
//!   with a constant keeps 1/distinct of the rows (`<>` the rest, `IN` of n
//!   constants n/distinct) where the column's distinct count is known (see
//!   the key counts below); a comparison of an integer column with a
//!   constant keeps its share of the column's value range (the data files'
//!   min/max), `BETWEEN` the overlap; else `=` 0.1, `<>` 0.9,
//!   `<` `<=` `>` `>=` 1/3, `BETWEEN` 1/4, `LIKE` 0.1, `IN (n values)`
//!   0.1·n (at most 1/2), `IS NULL` 0.1; `AND` multiplies, `OR` adds (less
//!   the overlap), `NOT` complements;
//! - an aggregation: a tenth of its input (one row without `GROUP BY`);
//! - a join of parts A and B on edges E: |A|·|B| / max over E of the
//!   smaller of the two sides' *key counts*. A side's key count is the
//!   distinct values of its column before filters: `ANALYZE`'s estimate if
//!   the table was analyzed, else for an integer column the width of its
//!   value range from the data files' min/max statistics (at most the rows),
//!   else the rows of its table. That is exact for a join of a foreign key
//!   with the key of a table (each row of A finds its one row of B if B kept
//!   it), the common case in star and snowflake schemas, and right in size
//!   for a join on a column of few values: TPC-H Q5 joins customer and
//!   supplier on `nationkey` (25 values, 6·10⁹ rows at SF10). Counted as
//!   table rows, that join looked small and went first: 68 s instead of
//!   1.1 s.
//!
//! `SET join_order = off` keeps the order written.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, NullEquality, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::utils::{conjunction, split_conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    BinaryExpr, Expr, Join, JoinConstraint, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
    TableScan,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// The rows of a scanned table (before the scan's filters), if known.
pub type ScanRows = fn(&TableScan) -> Option<u64>;

/// The estimated distinct values of a column of a scanned table (before the
/// scan's filters), if known.
pub type ScanKeys = fn(&TableScan, &str) -> Option<u64>;

/// The smallest and largest value of an integer column of a scanned table,
/// if known.
pub type ScanRange = fn(&TableScan, &str) -> Option<(i64, i64)>;

datafusion::common::extensions_options! {
    /// The session's switch of join ordering (`SET join_order`).
    pub struct JoinOrderOptions {
        /// `on` (order by estimated sizes, the default) or `off` (the order
        /// written).
        pub mode: String, default = "on".to_string()
        /// `on` (build sides and partition modes of hash joins from row
        /// estimates, [`super::BuildSides`], the default) or `off`
        /// (DataFusion's choice).
        pub build_sides: String, default = "on".to_string()
        /// The most estimated rows of a build side that one task collects
        /// into one hash table ([`super::BuildSides`]).
        pub collect_rows_max: usize, default = super::build_sides::COLLECT_ROWS_MAX
        /// The tasks each stage of a statement runs as: 1 on one node; a
        /// cluster node sets it for each statement it plans to its live
        /// nodes. A build side that a join collects is then built by every
        /// task (broadcast), so [`super::BuildSides`] counts its rows that
        /// many times (see there).
        pub stage_tasks: usize, default = 1
        /// `on` (a hash join with a grouped aggregation keys on its group
        /// keys only, [`super::JoinOnGroupKeys`], the default) or `off`.
        pub group_keys: String, default = "on".to_string()
        /// `on` (filters' default selectivities from distinct counts,
        /// [`super::FilterEstimates`], the default) or `off`.
        pub filter_estimates: String, default = "on".to_string()
        /// `on` (columns that equalities make equal join the tables they
        /// belong to even where the query wrote no such equality, the
        /// default) or `off`.
        pub implied_edges: String, default = "on".to_string()
        /// `auto` (on a cluster of more than one live node only, the
        /// default), `on` or `off`: an aggregation joined on its group keys aggregates only the groups
        /// the join can keep ([`super::ReduceGroups`]).
        pub reduce_groups: String, default = "auto".to_string()
        /// `auto` (on a cluster of more than one live node only, the
        /// default), `on` or `off`: a semi join over an inner join goes below it, to the input its keys
        /// come from ([`super::PushSemiJoins`]).
        pub push_semi_joins: String, default = "auto".to_string()
        /// `auto` (on a cluster of more than one live node only, the
        /// default), `on` or `off`: a join that emits its build side's rows
        /// (semi, anti, left) filters its probe side by the build side's
        /// keys, broadcast, before the probe side is shuffled
        /// ([`super::PrefilterProbes`]).
        pub prefilter_probes: String, default = "auto".to_string()
        /// `on` (hash joins spill to disk when their build side does not
        /// fit the query's memory, [`super::SpillingJoins`], the default)
        /// or `off` (DataFusion's joins, 53200 when memory runs out).
        pub spill: String, default = "on".to_string()
        /// The most distinct values an uncorrelated `IN` subquery whose
        /// rows a `HAVING` predicate picks may return to run before its
        /// query and stand in it as a list of constants (`cirro-engine`'s
        /// `statement/prerun.rs`); 0 never runs one first.
        pub prerun_keys: usize, default = 10_000
    }
}

impl JoinOrderOptions {
    /// Whether the switch `pick` chooses is on in `config` (anything but
    /// `off`; on where the session has no such options).
    pub(crate) fn switch_on(config: &ConfigOptions, pick: impl Fn(&Self) -> &String) -> bool {
        config
            .extensions
            .get::<Self>()
            .is_none_or(|o| !pick(o).eq_ignore_ascii_case("off"))
    }

    /// Whether the `auto|on|off` switch `pick` chooses is on in `config`:
    /// `auto` (and a session without these options) means on exactly where
    /// sessions run on a cluster (`distributed`) whose statement's stages
    /// run as more than one task (`stage_tasks`): with one live node
    /// nothing crosses a network, and the plan is run as on a node alone.
    pub(crate) fn auto_switch_on(
        config: &ConfigOptions,
        pick: impl Fn(&Self) -> &String,
        distributed: bool,
    ) -> bool {
        let options = config.extensions.get::<Self>();
        let mode = options.map(|o| pick(o).to_ascii_lowercase());
        match mode.as_deref() {
            Some("on") => true,
            Some("off") => false,
            _ => distributed && options.is_none_or(|o| o.stage_tasks > 1),
        }
    }
}

/// `join` with new inputs (the same schema).
pub(crate) fn rebuilt(
    join: &Join,
    left: Arc<LogicalPlan>,
    right: Arc<LogicalPlan>,
) -> Result<Join> {
    Join::try_new(
        left,
        right,
        join.on.clone(),
        join.filter.clone(),
        join.join_type,
        join.join_constraint,
        join.null_equality,
        join.null_aware,
    )
}

/// `plan` with each join (those in subqueries too) that `rewrite` replaces
/// replaced, from the top down: the walk of the rules that rewrite one join
/// at a time.
pub(crate) fn rewrite_joins(
    plan: LogicalPlan,
    mut rewrite: impl FnMut(&Join) -> Result<Option<LogicalPlan>>,
) -> Result<Transformed<LogicalPlan>> {
    plan.transform_down_with_subqueries(|plan| match &plan {
        LogicalPlan::Join(join) => match rewrite(join)? {
            Some(rewritten) => Ok(Transformed::yes(rewritten)),
            None => Ok(Transformed::no(plan)),
        },
        _ => Ok(Transformed::no(plan)),
    })
}

impl datafusion::common::config::ConfigExtension for JoinOrderOptions {
    const PREFIX: &'static str = "cirro_join_order";
}

/// Rows assumed for an input whose size nothing tells.
const UNKNOWN_ROWS: f64 = 1_000_000.0;

/// The rule; see the module documentation.
/// How a statement's groups are ordered.
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// Whether joins take the edges equalities imply
    /// ([`with_implied_edges`]).
    implied: bool,
    /// The tasks each stage runs as (`stage_tasks`): above 1, a join also
    /// costs the bytes it moves between tasks (see [`greedy`]).
    tasks: usize,
}

#[derive(Debug)]
pub struct ReorderJoins {
    rows: ScanRows,
    keys: ScanKeys,
    range: ScanRange,
    buckets: super::ScanBuckets,
}

impl ReorderJoins {
    pub fn new(
        rows: ScanRows,
        keys: ScanKeys,
        range: ScanRange,
        buckets: super::ScanBuckets,
    ) -> Self {
        Self {
            rows,
            keys,
            range,
            buckets,
        }
    }

    /// Whether `leaf` reads a hash-distributed (bucketed) table.
    fn bucketed(&self, leaf: &LogicalPlan) -> bool {
        match leaf {
            LogicalPlan::TableScan(scan) => (self.buckets)(scan).is_some(),
            LogicalPlan::Filter(f) => self.bucketed(&f.input),
            LogicalPlan::SubqueryAlias(a) => self.bucketed(&a.input),
            LogicalPlan::Projection(p) => self.bucketed(&p.input),
            _ => false,
        }
    }

    fn rewrite_plan(&self, plan: LogicalPlan, how: Settings) -> Result<Transformed<LogicalPlan>> {
        if let LogicalPlan::Join(join) = &plan
            && groupable(join)
        {
            return self.reorder(plan, how);
        }
        // The rule walks the plan itself (no `apply_order`), so it walks
        // the subqueries of its expressions too: TPC-H Q11's HAVING.
        plan.map_subqueries(|subquery| self.rewrite_plan(subquery, how))?
            .transform_sibling(|plan| plan.map_children(|child| self.rewrite_plan(child, how)))
    }

    /// Reorder the group whose root is `root` (an inner join).
    fn reorder(&self, root: LogicalPlan, how: Settings) -> Result<Transformed<LogicalPlan>> {
        let mut group = Group::default();
        collect(&root, &mut group);
        // Each leaf reordered inside first.
        let mut changed = false;
        let mut leaves = Vec::with_capacity(group.leaves.len());
        for leaf in std::mem::take(&mut group.leaves) {
            let rewritten = self.rewrite_plan(leaf, how)?;
            changed |= rewritten.transformed;
            leaves.push(rewritten.data);
        }
        let unchanged = |changed: bool, root: LogicalPlan, leaves: Vec<LogicalPlan>| {
            if !changed {
                return Ok(Transformed::no(root));
            }
            // Put the rewritten leaves back in place.
            let mut leaves = leaves.into_iter();
            replace_leaves(root, &mut leaves).map(Transformed::yes)
        };
        // Joins of hash-distributed tables keep the co-located rule's order.
        let bucketed = leaves.iter().filter(|l| self.bucketed(l)).count();
        if leaves.len() < 3 || bucketed >= 2 {
            return unchanged(changed, root, leaves);
        }
        let parts: Vec<Part> = leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| Part {
                leaves: vec![i],
                rows: self.rows(leaf),
                width: row_width(leaf),
            })
            .collect();
        // Edges: (leaf, expr, leaf, expr); the rest are filters. An edge's
        // key count is the smaller of its two sides'.
        let mut edges = Vec::new();
        let mut filters = std::mem::take(&mut group.filters);
        for (l, r) in std::mem::take(&mut group.on) {
            match (leaf_of(&leaves, &l), leaf_of(&leaves, &r)) {
                (Some(a), Some(b)) if a != b => edges.push((a, l, b, r)),
                _ => filters.push(l.eq(r)),
            }
        }
        let (edges, classes) = if how.implied {
            with_implied_edges(edges)
        } else {
            let classes = vec![None; edges.len()];
            (edges, classes)
        };
        let keys: Vec<f64> = edges
            .iter()
            .map(|(a, l, b, r)| {
                self.key_count(&leaves[*a], l)
                    .min(self.key_count(&leaves[*b], r))
            })
            .collect();
        let caps: Vec<f64> = leaves.iter().map(|leaf| self.table_rows(leaf)).collect();
        log::debug!(
            "join order: leaves {:?}, key counts {keys:?}",
            parts.iter().map(|p| p.rows).collect::<Vec<_>>()
        );
        let Some(order) = greedy(parts, &edges, &keys, &caps, how.tasks) else {
            return unchanged(changed, root, leaves);
        };
        // Already in this order (a later optimizer pass): leave it, so
        // that the pruning of columns between the joins stays.
        let mut shapes: Vec<String> = (0..leaves.len()).map(|i| i.to_string()).collect();
        for &(left, right) in &order {
            shapes[left] = format!("({},{})", shapes[left], shapes[right]);
        }
        let last_part = order.last().map_or(0, |&(left, _)| left);
        let mut next = 0;
        if shapes[last_part] == shape(&root, &mut next) {
            return unchanged(changed, root, leaves);
        }
        // Build the joins in the chosen order.
        let mut built: Vec<Option<(LogicalPlan, Vec<usize>)>> = leaves
            .into_iter()
            .enumerate()
            .map(|(i, leaf)| Some((leaf, vec![i])))
            .collect();
        let mut filters: Vec<Option<Expr>> = filters.into_iter().map(Some).collect();
        // The group's columns, in the group's order.
        let columns: Vec<Column> = root
            .schema()
            .iter()
            .map(|(qualifier, field)| Column::new(qualifier.cloned(), field.name().clone()))
            .collect();
        let mut last = 0;
        for (left, right) in order {
            let (Some((lplan, lleaves)), Some((rplan, rleaves))) =
                (built[left].take(), built[right].take())
            else {
                return Err(datafusion::common::DataFusionError::Internal(
                    "join order: a part used twice".into(),
                ));
            };
            // One equality per class of equal columns: inside each part
            // the columns of a class are already equal.
            let mut on = Vec::new();
            let mut joined_classes = HashSet::new();
            for ((a, ea, b, eb), class) in edges.iter().zip(&classes) {
                let pair = if lleaves.contains(a) && rleaves.contains(b) {
                    (ea.clone(), eb.clone())
                } else if lleaves.contains(b) && rleaves.contains(a) {
                    (eb.clone(), ea.clone())
                } else {
                    continue;
                };
                if class.is_none_or(|c| joined_classes.insert(c)) {
                    on.push(pair);
                }
            }
            let mut here = Vec::new();
            for slot in filters.iter_mut() {
                let readable = slot.as_ref().is_some_and(|f| {
                    f.column_refs()
                        .iter()
                        .all(|c| lplan.schema().has_column(c) || rplan.schema().has_column(c))
                });
                if readable && let Some(f) = slot.take() {
                    here.push(f);
                }
            }
            let join = Join::try_new(
                Arc::new(lplan),
                Arc::new(rplan),
                on,
                conjunction(here),
                JoinType::Inner,
                JoinConstraint::On,
                NullEquality::NullEqualsNothing,
                false,
            )?;
            let mut leaves = lleaves;
            leaves.extend(rleaves);
            let join = keep_needed(LogicalPlan::Join(join), &leaves, &columns, &edges, &filters)?;
            built[left] = Some((join, leaves));
            last = left;
        }
        let Some((mut plan, _)) = built[last].take() else {
            return Err(datafusion::common::DataFusionError::Internal(
                "join order: no plan".into(),
            ));
        };
        let rest: Vec<Expr> = filters.into_iter().flatten().collect();
        if let Some(rest) = conjunction(rest) {
            plan = LogicalPlanBuilder::from(plan).filter(rest)?.build()?;
        }
        let columns = columns.into_iter().map(Expr::Column);
        let plan = LogicalPlanBuilder::from(plan).project(columns)?.build()?;
        Ok(Transformed::yes(plan))
    }

    /// The estimated rows of `plan` (see the module docs).
    /// The estimated rows of `plan` (see the module docs).
    pub(crate) fn estimated_rows(&self, plan: &LogicalPlan) -> f64 {
        self.rows(plan)
    }

    fn rows(&self, plan: &LogicalPlan) -> f64 {
        match plan {
            LogicalPlan::TableScan(scan) => {
                let base = (self.rows)(scan).map_or(UNKNOWN_ROWS, |n| n as f64);
                let distinct = self.distinct_of(Some(scan));
                let range = self.range_of(Some(scan));
                let selectivity: f64 = scan
                    .filters
                    .iter()
                    .map(|f| selectivity_with(f, &distinct, &range))
                    .product();
                let rows = base * selectivity;
                scan.fetch.map_or(rows, |f| rows.min(f as f64))
            }
            LogicalPlan::Filter(filter) => {
                // Conjuncts the scan below already applies count once.
                let scan = match filter.input.as_ref() {
                    LogicalPlan::TableScan(scan) => Some(scan),
                    _ => None,
                };
                let pushed: &[Expr] = scan.map_or(&[], |s| &s.filters);
                let distinct = self.distinct_of(scan);
                let range = self.range_of(scan);
                let selectivity: f64 = split_conjunction(&filter.predicate)
                    .into_iter()
                    .filter(|c| !pushed.contains(c))
                    .map(|c| selectivity_with(c, &distinct, &range))
                    .product();
                self.rows(&filter.input) * selectivity
            }
            LogicalPlan::Aggregate(aggregate) => {
                if aggregate.group_expr.is_empty() {
                    1.0
                } else {
                    (self.rows(&aggregate.input) / 10.0).max(1.0)
                }
            }
            LogicalPlan::Limit(limit) => match limit.get_fetch_type() {
                Ok(datafusion::logical_expr::logical_plan::FetchType::Literal(Some(n))) => {
                    self.rows(&limit.input).min(n as f64)
                }
                _ => self.rows(&limit.input),
            },
            LogicalPlan::Join(join) => {
                let (l, r) = (self.rows(&join.left), self.rows(&join.right));
                match join.join_type {
                    JoinType::Inner => l.max(r),
                    JoinType::Left | JoinType::LeftMark => l,
                    JoinType::Right | JoinType::RightMark => r,
                    JoinType::Full => l + r,
                    JoinType::LeftSemi | JoinType::LeftAnti => l / 2.0,
                    JoinType::RightSemi | JoinType::RightAnti => r / 2.0,
                }
            }
            LogicalPlan::Union(union) => union.inputs.iter().map(|i| self.rows(i)).sum(),
            LogicalPlan::Values(values) => values.values.len() as f64,
            LogicalPlan::EmptyRelation(_) => 1.0,
            other => match other.inputs().as_slice() {
                [only] => self.rows(only),
                _ => UNKNOWN_ROWS,
            },
        }
    }

    /// The rows of the table `leaf` scans, before its filters (the most
    /// distinct values any key of it can hold); else its estimated rows.
    fn table_rows(&self, leaf: &LogicalPlan) -> f64 {
        match leaf {
            LogicalPlan::TableScan(scan) => (self.rows)(scan).map_or(UNKNOWN_ROWS, |n| n as f64),
            LogicalPlan::Filter(f) => self.table_rows(&f.input),
            LogicalPlan::SubqueryAlias(a) => self.table_rows(&a.input),
            LogicalPlan::Projection(p) => self.table_rows(&p.input),
            other => self.rows(other),
        }
        .max(1.0)
    }

    /// The distinct values of a column of `scan`'s table, where known.
    fn distinct_of<'a>(
        &'a self,
        scan: Option<&'a TableScan>,
    ) -> impl Fn(&Column) -> Option<f64> + 'a {
        move |column: &Column| {
            let scan = scan?;
            (self.keys)(scan, &column.name).map(|d| d as f64)
        }
    }

    /// The value range of an integer column of `scan`'s table, where known.
    fn range_of<'a>(
        &'a self,
        scan: Option<&'a TableScan>,
    ) -> impl Fn(&Column) -> Option<(f64, f64)> + 'a {
        move |column: &Column| {
            let scan = scan?;
            (self.range)(scan, &column.name).map(|(lo, hi)| (lo as f64, hi as f64))
        }
    }

    /// How many distinct values the key `key` of `leaf` may hold, before
    /// the leaf's filters: the column's distinct estimate (ANALYZE's, or the
    /// range of an integer column), else the rows of its table.
    fn key_count(&self, leaf: &LogicalPlan, key: &Expr) -> f64 {
        let column = match key {
            Expr::Column(c) => Some(c.name.as_str()),
            Expr::Cast(cast) => match cast.expr.as_ref() {
                Expr::Column(c) => Some(c.name.as_str()),
                _ => None,
            },
            _ => None,
        };
        match (leaf, column) {
            (LogicalPlan::TableScan(scan), column) => column
                .and_then(|c| (self.keys)(scan, c))
                .or_else(|| (self.rows)(scan))
                .map_or(UNKNOWN_ROWS, |n| n as f64),
            (LogicalPlan::Filter(f), _) => self.key_count(&f.input, key),
            (LogicalPlan::SubqueryAlias(a), Some(c)) => {
                self.key_count(&a.input, &Expr::Column(Column::from_name(c)))
            }
            (LogicalPlan::Projection(p), Some(c)) => {
                // The expression the projection names `c`, if a column.
                let source = p.expr.iter().find_map(|e| match e {
                    Expr::Column(inner) if inner.name == c => Some(e.clone()),
                    Expr::Alias(alias) if alias.name == c => match alias.expr.as_ref() {
                        inner @ Expr::Column(_) => Some(inner.clone()),
                        _ => None,
                    },
                    _ => None,
                });
                match source {
                    Some(source) => self.key_count(&p.input, &source),
                    None => self.rows(leaf),
                }
            }
            (other, _) => self.rows(other),
        }
        .max(1.0)
    }
}

impl OptimizerRule for ReorderJoins {
    fn name(&self) -> &str {
        "reorder_joins"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        // The rule walks the plan itself: a reordered group is not
        // reordered again piece by piece.
        None
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let config = config.options();
        let options = config.extensions.get::<JoinOrderOptions>();
        let on = options.is_some_and(|o| o.mode.eq_ignore_ascii_case("on"));
        if !on {
            return Ok(Transformed::no(plan));
        }
        let implied = JoinOrderOptions::switch_on(&config, |o| &o.implied_edges);
        let tasks = options.map_or(1, |o| o.stage_tasks.max(1));
        self.rewrite_plan(plan, Settings { implied, tasks })
    }
}

/// Whether `join` belongs in a group: an inner join on equalities (and
/// perhaps other conditions) where NULL keys match nothing.
fn groupable(join: &Join) -> bool {
    join.join_type == JoinType::Inner
        && join.null_equality == NullEquality::NullEqualsNothing
        && !join.on.is_empty()
}

/// `join` (of the group's leaves `leaves`) with only the columns read above
/// it: the group's own (`columns`), the keys of the edges that join it to
/// leaves outside it, and those of the filters not yet placed. Without
/// this, each join built passes on every column of its inputs: DataFusion's
/// `eliminate_cross_join` flattens a tree of inner joins in the next
/// optimizer pass (undoing the pruning `optimize_projections` did between
/// them), so the order built in the last pass kept them all. On a cluster
/// they all crossed the network: TPC-H Q5 at SF10 shuffled 12 M rows of
/// ten columns where five were read.
fn keep_needed(
    join: LogicalPlan,
    leaves: &[usize],
    columns: &[Column],
    edges: &[(usize, Expr, usize, Expr)],
    filters: &[Option<Expr>],
) -> Result<LogicalPlan> {
    let mut needed: HashSet<&Column> = columns.iter().collect();
    for (a, ea, b, eb) in edges {
        match (leaves.contains(a), leaves.contains(b)) {
            (true, false) => needed.extend(ea.column_refs()),
            (false, true) => needed.extend(eb.column_refs()),
            _ => {}
        }
    }
    for filter in filters.iter().flatten() {
        needed.extend(filter.column_refs());
    }
    let kept: Vec<Expr> = join
        .schema()
        .columns()
        .into_iter()
        .filter(|c| needed.contains(c))
        .map(Expr::Column)
        .collect();
    if kept.is_empty() || kept.len() == join.schema().fields().len() {
        return Ok(join);
    }
    LogicalPlanBuilder::from(join).project(kept)?.build()
}

/// A projection that only picks columns, over a groupable join.
fn picks_columns_of_join(plan: &LogicalPlan) -> Option<&LogicalPlan> {
    let LogicalPlan::Projection(projection) = plan else {
        return None;
    };
    let plain = projection.expr.iter().all(|e| matches!(e, Expr::Column(_)));
    match projection.input.as_ref() {
        LogicalPlan::Join(join) if plain && groupable(join) => Some(projection.input.as_ref()),
        _ => None,
    }
}

#[derive(Default)]
struct Group {
    leaves: Vec<LogicalPlan>,
    on: Vec<(Expr, Expr)>,
    filters: Vec<Expr>,
}

fn collect(plan: &LogicalPlan, group: &mut Group) {
    if let LogicalPlan::Join(join) = plan
        && groupable(join)
    {
        collect(&join.left, group);
        collect(&join.right, group);
        group.on.extend(join.on.iter().cloned());
        group.filters.extend(
            join.filter
                .clone()
                .map(split_conjunction_owned)
                .unwrap_or_default(),
        );
        return;
    }
    if let Some(join) = picks_columns_of_join(plan) {
        return collect(join, group);
    }
    group.leaves.push(plan.clone());
}

/// The shape of a group as written: `(a,b)` for a join of `a` and `b`,
/// leaves numbered in the order [`collect`] finds them.
fn shape(plan: &LogicalPlan, next: &mut usize) -> String {
    if let LogicalPlan::Join(join) = plan
        && groupable(join)
    {
        let left = shape(&join.left, next);
        let right = shape(&join.right, next);
        return format!("({left},{right})");
    }
    if let Some(join) = picks_columns_of_join(plan) {
        return shape(join, next);
    }
    *next += 1;
    (*next - 1).to_string()
}

/// `plan` with its group's leaves replaced, in the order [`collect`] found them.
fn replace_leaves(
    plan: LogicalPlan,
    leaves: &mut impl Iterator<Item = LogicalPlan>,
) -> Result<LogicalPlan> {
    let is_inner = match &plan {
        LogicalPlan::Join(join) => groupable(join),
        other => picks_columns_of_join(other).is_some(),
    };
    if !is_inner {
        return leaves.next().ok_or_else(|| {
            datafusion::common::DataFusionError::Internal("join order: too few leaves".into())
        });
    }
    let replaced =
        plan.map_children(|child| replace_leaves(child, leaves).map(Transformed::yes))?;
    replaced.data.recompute_schema()
}

/// The one leaf that has every column `expr` reads.
fn leaf_of(leaves: &[LogicalPlan], expr: &Expr) -> Option<usize> {
    let columns: HashSet<&Column> = expr.column_refs();
    if columns.is_empty() {
        return None;
    }
    let mut found = leaves
        .iter()
        .enumerate()
        .filter(|(_, leaf)| columns.iter().all(|c| leaf.schema().has_column(c)))
        .map(|(i, _)| i);
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

struct Part {
    leaves: Vec<usize>,
    rows: f64,
    /// The estimated bytes of a row: the sum of its leaves' (see
    /// [`row_width`]).
    width: f64,
}

/// On a cluster, a row of a join's result costs what moving this many
/// bytes between tasks costs (see [`greedy`]): its probe and copy against
/// a key's width encoded, sent and decoded. Counted at each row's full
/// width, results outweighed the network, and TPC-H Q21 joined 7 M orders
/// (estimated 1.5 M), broadcast, with 38 M late lines before one nation's
/// suppliers cut those to 1.5 M: 3.8 s → 6.3 s on 3 nodes.
const RESULT_ROW_BYTES: f64 = 8.0;

/// The width a string or other variable-width value is estimated at, in
/// bytes.
const VARIABLE_WIDTH: f64 = 24.0;

/// The estimated bytes of a row of `plan`'s output: each column's fixed
/// width, [`VARIABLE_WIDTH`] for strings and other variable widths.
fn row_width(plan: &LogicalPlan) -> f64 {
    plan.schema()
        .fields()
        .iter()
        .map(|field| match field.data_type() {
            DataType::Boolean => 1.0,
            other => other
                .primitive_width()
                .map_or(VARIABLE_WIDTH, |width| width as f64),
        })
        .sum::<f64>()
        .max(1.0)
}

type Edge = (usize, Expr, usize, Expr);

/// `edges` with the equalities they imply: the plain columns that edges
/// make equal form classes (`a = b`, `b = c`: {a, b, c}), and two leaves
/// with columns of one class are joined by an edge even where the query
/// wrote none. TPC-H Q9 writes `p_partkey = l_partkey` and `ps_partkey =
/// l_partkey`; the implied `p_partkey = ps_partkey` lets the few parts
/// named like '%green%' join partsupp before lineitem does, so that 5 % of
/// partsupp is hashed instead of all of it. Returns the edges, the written
/// ones first, and each edge's class (None where a side is not a plain
/// column, or where one leaf has two columns of the class: those stay as
/// written).
fn with_implied_edges(edges: Vec<Edge>) -> (Vec<Edge>, Vec<Option<usize>>) {
    // Union-find over the columns of plain-column edges.
    let mut ids: Vec<Column> = Vec::new();
    let mut parent: Vec<usize> = Vec::new();
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let id_of = |c: &Column, ids: &mut Vec<Column>, parent: &mut Vec<usize>| {
        ids.iter().position(|known| known == c).unwrap_or_else(|| {
            ids.push(c.clone());
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    let mut members: Vec<Option<(usize, usize)>> = Vec::with_capacity(edges.len());
    for (_, l, _, r) in &edges {
        members.push(match (l, r) {
            (Expr::Column(l), Expr::Column(r)) => {
                let (x, y) = (
                    id_of(l, &mut ids, &mut parent),
                    id_of(r, &mut ids, &mut parent),
                );
                let (rx, ry) = (find(&mut parent, x), find(&mut parent, y));
                parent[rx] = ry;
                Some((x, y))
            }
            _ => None,
        });
    }
    // Each class's columns with their leaves.
    let mut column_leaf: Vec<Option<usize>> = vec![None; ids.len()];
    for ((a, _, b, _), m) in edges.iter().zip(&members) {
        if let Some((x, y)) = m {
            column_leaf[*x] = Some(*a);
            column_leaf[*y] = Some(*b);
        }
    }
    let roots: Vec<usize> = (0..ids.len()).map(|i| find(&mut parent, i)).collect();
    // A class where one leaf has two of its columns keeps its edges as
    // written (that equality is a filter inside the leaf).
    let usable = |root: usize| {
        let mut seen = HashSet::new();
        (0..ids.len())
            .filter(|&i| roots[i] == root)
            .all(|i| column_leaf[i].is_none_or(|leaf| seen.insert(leaf)))
    };
    let mut classes: Vec<Option<usize>> = members
        .iter()
        .map(|m| m.and_then(|(x, _)| Some(roots[x]).filter(|&root| usable(root))))
        .collect();
    let mut edges = edges;
    let mut linked: HashSet<(usize, usize, usize)> = HashSet::new();
    for ((a, _, b, _), class) in edges.iter().zip(&classes) {
        if let Some(class) = class {
            linked.insert((*class, *a.min(b), *a.max(b)));
        }
    }
    for x in 0..ids.len() {
        for y in x + 1..ids.len() {
            let root = roots[x];
            if roots[y] != root || !usable(root) {
                continue;
            }
            let (Some(a), Some(b)) = (column_leaf[x], column_leaf[y]) else {
                continue;
            };
            if linked.insert((root, a.min(b), a.max(b))) {
                edges.push((
                    a,
                    Expr::Column(ids[x].clone()),
                    b,
                    Expr::Column(ids[y].clone()),
                ));
                classes.push(Some(root));
            }
        }
    }
    (edges, classes)
}

/// The joins, as pairs of part indices (the merged part takes the left
/// index), that join the parts cheapest first; None if the parts are not
/// all connected. On one node (`tasks` 1) a join costs its estimated
/// result's rows. Where each stage runs as several tasks (a cluster), it
/// costs bytes: [`RESULT_ROW_BYTES`] a result row, and those it moves
/// between the tasks (both inputs shuffled, or the smaller one broadcast
/// to every task, whichever is less), by [`row_width`]s. TPC-H Q7 on 3
/// nodes joined 1.5 M lines of two nations' suppliers with all 15 M
/// orders first (a result smaller than the 1.2 M orders of two nations'
/// customers, but 16.5 M rows shuffled), then the customers; orders
/// joined with the broadcast customers first shuffle 2.7 M rows.
///
/// A join of two parts is estimated as |A|·|B| / d, d the largest, over
/// the pairs of leaves (one in each part) that edges join, of the distinct
/// values of the pair's key: the product of its edges' key counts, at most
/// the rows of either leaf's table (`caps`). A join on several columns of
/// one table (lineitem with partsupp on partkey and suppkey) is then
/// counted as finding one row per key, not one per partkey.
fn greedy(
    mut parts: Vec<Part>,
    edges: &[Edge],
    keys: &[f64],
    caps: &[f64],
    tasks: usize,
) -> Option<Vec<(usize, usize)>> {
    let tasks = tasks as f64;
    let mut alive: Vec<usize> = (0..parts.len()).collect();
    let mut order = Vec::new();
    while alive.len() > 1 {
        let mut best: Option<(f64, f64, f64, usize, usize)> = None;
        for (x, &i) in alive.iter().enumerate() {
            for &j in &alive[x + 1..] {
                let (a, b) = (&parts[i], &parts[j]);
                // The key of each pair of leaves the edges join.
                let mut pairs: Vec<((usize, usize), f64)> = Vec::new();
                for ((la, _, lb, _), &d) in edges.iter().zip(keys) {
                    let crosses = (a.leaves.contains(la) && b.leaves.contains(lb))
                        || (a.leaves.contains(lb) && b.leaves.contains(la));
                    if !crosses {
                        continue;
                    }
                    let pair = (*la.min(lb), *la.max(lb));
                    match pairs.iter_mut().find(|(p, _)| *p == pair) {
                        Some((_, product)) => *product *= d,
                        None => pairs.push((pair, d)),
                    }
                }
                let Some(divisor) = pairs
                    .iter()
                    .map(|&((x, y), product)| product.min(caps[x]).min(caps[y]))
                    .reduce(f64::max)
                else {
                    continue;
                };
                let size = a.rows * b.rows / divisor;
                let inputs = a.rows + b.rows;
                let cost = if tasks > 1.0 {
                    // Wide rows (a customer's name, address and comment)
                    // cost more to move: TPC-H Q10.
                    let (a_bytes, b_bytes) = (a.rows * a.width, b.rows * b.width);
                    let moved = (a_bytes + b_bytes).min(tasks * a_bytes.min(b_bytes));
                    size * RESULT_ROW_BYTES + moved
                } else {
                    size
                };
                // Costs within a millionth are a tie (rounding must not
                // decide); then the smaller inputs go first.
                let better = best.is_none_or(|(c, n, _, _, _)| {
                    cost < c * (1.0 - 1e-6) || (cost <= c * (1.0 + 1e-6) && inputs < n)
                });
                if better {
                    best = Some((cost, inputs, size, i, j));
                }
            }
        }
        let (_, _, size, i, j) = best?;
        // The smaller part on the left: it builds the hash table.
        let (left, right) = if parts[i].rows <= parts[j].rows {
            (i, j)
        } else {
            (j, i)
        };
        let moved = std::mem::take(&mut parts[right].leaves);
        parts[left].leaves.extend(moved);
        parts[left].rows = size.max(1.0);
        parts[left].width += parts[right].width;
        alive.retain(|&p| p != right);
        order.push((left, right));
    }
    Some(order)
}

/// The column `e` reads, if it is one (or a cast of one).
fn column_of(e: &Expr) -> Option<Column> {
    match e {
        Expr::Column(c) => Some(c.clone()),
        Expr::Cast(cast) => match cast.expr.as_ref() {
            Expr::Column(c) => Some(c.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The value of an integer constant.
fn integer_of(e: &Expr) -> Option<f64> {
    match e {
        Expr::Literal(value, _) => super::integer_value(value),
        Expr::Cast(cast) => integer_of(&cast.expr),
        _ => None,
    }
}

/// The fraction of rows `predicate` keeps (see the module docs), without
/// distinct counts.
#[cfg(test)]
fn selectivity(predicate: &Expr) -> f64 {
    selectivity_with(predicate, &|_| None, &|_| None)
}

/// The fraction of rows `predicate` keeps (see the module docs); `distinct`
/// gives the distinct values of a column, where known: a comparison of it
/// with a constant keeps 1/distinct of the rows (`IN` of n constants
/// n/distinct), as if the values were equally frequent.
fn selectivity_with(
    predicate: &Expr,
    distinct: &dyn Fn(&Column) -> Option<f64>,
    range: &dyn Fn(&Column) -> Option<(f64, f64)>,
) -> f64 {
    let recurse = |e: &Expr| selectivity_with(e, distinct, range);
    // The share of an integer column's range [lo, hi] that `column op v`
    // keeps, with `v` an integer constant (`flipped`: `v op column`).
    let ranged = |left: &Expr, op: &Operator, right: &Expr| -> Option<f64> {
        let (c, v, op) = match (column_of(left), integer_of(right)) {
            (Some(c), Some(v)) => (c, v, *op),
            _ => (column_of(right)?, integer_of(left)?, op.swap()?),
        };
        let (lo, hi) = range(&c)?;
        let width = hi - lo + 1.0;
        let kept = match op {
            Operator::Lt => v - lo,
            Operator::LtEq => v - lo + 1.0,
            Operator::Gt => hi - v,
            Operator::GtEq => hi - v + 1.0,
            _ => return None,
        };
        Some((kept / width).clamp(0.0, 1.0))
    };
    let ranged_of = |e: &Expr| match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => ranged(left, op, right),
        _ => None,
    };
    // The distinct values of a column compared with a constant.
    let compared = |a: &Expr, b: &Expr| -> Option<f64> {
        let (c, other) = match (column_of(a), column_of(b)) {
            (Some(c), None) => (c, b),
            (None, Some(c)) => (c, a),
            _ => return None,
        };
        matches!(other, Expr::Literal(..))
            .then(|| distinct(&c))
            .flatten()
            .filter(|d| *d >= 1.0)
    };
    let s = match predicate {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => recurse(left) * recurse(right),
            Operator::Or => {
                let (l, r) = (recurse(left), recurse(right));
                l + r - l * r
            }
            Operator::Eq | Operator::IsNotDistinctFrom => {
                compared(left, right).map_or(0.1, |d| 1.0 / d)
            }
            Operator::NotEq | Operator::IsDistinctFrom => {
                compared(left, right).map_or(0.9, |d| 1.0 - 1.0 / d)
            }
            Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => {
                ranged(left, op, right).unwrap_or(1.0 / 3.0)
            }
            Operator::LikeMatch | Operator::ILikeMatch => 0.1,
            Operator::NotLikeMatch | Operator::NotILikeMatch => 0.9,
            _ => 0.5,
        },
        Expr::Between(between) => {
            let low = Expr::BinaryExpr(BinaryExpr::new(
                between.expr.clone(),
                Operator::GtEq,
                between.low.clone(),
            ));
            let high = Expr::BinaryExpr(BinaryExpr::new(
                between.expr.clone(),
                Operator::LtEq,
                between.high.clone(),
            ));
            let kept = match (ranged_of(&low), ranged_of(&high)) {
                (Some(a), Some(b)) => (a + b - 1.0).max(0.0),
                _ => 0.25,
            };
            if between.negated { 1.0 - kept } else { kept }
        }
        Expr::Like(like) | Expr::SimilarTo(like) if like.negated => 0.9,
        Expr::Like(_) | Expr::SimilarTo(_) => 0.1,
        Expr::InList(list) => {
            let n = list.list.len() as f64;
            let constants = list.list.iter().all(|e| matches!(e, Expr::Literal(..)));
            let first = list
                .list
                .first()
                .cloned()
                .unwrap_or(Expr::Literal(datafusion::common::ScalarValue::Null, None));
            let s = match compared(&list.expr, &first) {
                Some(d) if constants => (n / d).min(1.0),
                _ => (0.1 * n).min(0.5),
            };
            if list.negated { 1.0 - s } else { s }
        }
        Expr::IsNull(_) => 0.1,
        Expr::IsNotNull(_) => 0.9,
        Expr::Not(inner) => 1.0 - recurse(inner),
        Expr::Alias(alias) => recurse(&alias.expr),
        _ => 0.5,
    };
    s.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(leaf: usize, rows: f64) -> Part {
        wide_part(leaf, rows, 8.0)
    }

    fn wide_part(leaf: usize, rows: f64, width: f64) -> Part {
        Part {
            leaves: vec![leaf],
            rows,
            width,
        }
    }

    fn edge(a: usize, b: usize) -> (usize, Expr, usize, Expr) {
        let c = |n: usize| Expr::Column(Column::from_name(format!("c{n}")));
        (a, c(a), b, c(b))
    }

    #[test]
    fn a_join_built_passes_on_only_what_is_read_above_it() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::logical_expr::logical_plan::builder::table_scan;
        let scan = |name: &str| {
            let fields: Vec<Field> = ["k", "fk", "payload", "unused"]
                .iter()
                .map(|c| Field::new(*c, DataType::Int64, false))
                .collect();
            table_scan(Some(name), &Schema::new(fields), None)
                .and_then(|b| b.build())
                .expect("scan")
        };
        let col = |t: &str, c: &str| Column::new(Some(t), c);
        // a ⋈ b on a.fk = b.k, then c on b.fk = c.k; the group returns
        // a.payload and c.payload; a filter on b.payload is not placed yet.
        let edges = vec![
            (
                0,
                Expr::Column(col("a", "fk")),
                1,
                Expr::Column(col("b", "k")),
            ),
            (
                1,
                Expr::Column(col("b", "fk")),
                2,
                Expr::Column(col("c", "k")),
            ),
        ];
        let filters = vec![Some(
            Expr::Column(col("b", "payload")).gt(datafusion::prelude::lit(1)),
        )];
        let columns = vec![col("a", "payload"), col("c", "payload")];
        let ab = LogicalPlanBuilder::from(scan("a"))
            .join_on(
                scan("b"),
                JoinType::Inner,
                [edges[0].1.clone().eq(edges[0].3.clone())],
            )
            .and_then(|b| b.build())
            .expect("join");
        let kept = keep_needed(ab, &[0, 1], &columns, &edges, &filters).expect("pruned");
        let names: Vec<String> = kept
            .schema()
            .columns()
            .iter()
            .map(|c| c.flat_name())
            .collect();
        // a.fk and b.k joined already; the unused columns go.
        assert_eq!(names, ["a.payload", "b.fk", "b.payload"]);
        // Nothing to drop: the join is left as it is.
        let narrow = LogicalPlanBuilder::from(scan("a"))
            .project([Expr::Column(col("a", "payload"))])
            .and_then(|b| b.build())
            .expect("projection");
        let left = keep_needed(narrow.clone(), &[0], &columns, &edges, &[]).expect("kept");
        assert_eq!(left, narrow);
    }

    #[test]
    fn the_selective_dimension_joins_first() {
        // Q21 at SF10: supplier, lineitem (late lines), orders ('F'), nation
        // (one of 25).
        let parts = vec![
            part(0, 100_000.0),
            part(1, 19_995_350.666_666_664),
            part(2, 1_500_000.0),
            part(3, 2.5),
        ];
        let edges = [edge(0, 1), edge(2, 1), edge(0, 3)];
        let keys = [100_000.0, 15_000_000.0, 25.0];
        let order = greedy(parts, &edges, &keys, &[f64::INFINITY; 6], 1).expect("connected");
        // nation ⋈ supplier, then lineitem, then orders (the smaller side
        // on the left).
        assert_eq!(order, vec![(3, 0), (3, 1), (2, 3)]);
    }

    /// The leaves of the part that `leaf` first joins with, in `order`.
    fn first_partner(order: &[(usize, usize)], leaves: usize, leaf: usize) -> Vec<usize> {
        let mut parts: Vec<Vec<usize>> = (0..leaves).map(|i| vec![i]).collect();
        for &(left, right) in order {
            let moved = std::mem::take(&mut parts[right]);
            if parts[left].contains(&leaf) {
                return moved;
            }
            if moved.contains(&leaf) {
                return parts[left].clone();
            }
            parts[left].extend(moved);
        }
        Vec::new()
    }

    /// The leaves, sorted, that `leaf` first joins with in the order
    /// [`greedy`] picks for `tasks` tasks.
    fn partner(
        parts: Vec<Part>,
        edges: &[Edge],
        keys: &[f64],
        tasks: usize,
        leaf: usize,
    ) -> Vec<usize> {
        let leaves = parts.len();
        let caps = vec![f64::INFINITY; leaves];
        let order = greedy(parts, edges, keys, &caps, tasks).expect("connected");
        let mut partner = first_partner(&order, leaves, leaf);
        partner.sort();
        partner
    }

    #[test]
    fn on_a_cluster_a_join_also_costs_the_rows_it_moves() {
        // Q7 at SF10, as estimated: supplier, lineitem (two years),
        // orders, customer, and the two nations (two of 25 each).
        let parts = || {
            vec![
                wide_part(0, 100_000.0, 16.0),
                wide_part(1, 6_665_117.0, 52.0),
                wide_part(2, 15_000_000.0, 16.0),
                wide_part(3, 1_500_000.0, 16.0),
                wide_part(4, 4.75, 32.0),
                wide_part(5, 4.75, 32.0),
            ]
        };
        let edges = [
            edge(0, 1), // s_suppkey = l_suppkey
            edge(1, 2), // l_orderkey = o_orderkey
            edge(3, 2), // c_custkey = o_custkey
            edge(4, 0), // n1 = s_nationkey
            edge(5, 3), // n2 = c_nationkey
        ];
        let keys = [100_000.0, 15_000_000.0, 1_500_000.0, 25.0, 25.0];
        // On one node the lines (the smaller result) meet all the orders.
        assert_eq!(partner(parts(), &edges, &keys, 1, 2), [0, 1, 4]);
        // On three, the orders meet the customers, broadcast, first: 15 M
        // orders are not shuffled.
        assert_eq!(partner(parts(), &edges, &keys, 3, 2), [3, 5]);
    }

    #[test]
    fn on_a_cluster_the_selective_dimension_still_joins_first() {
        // Q21 at SF10, as estimated (orders 'F' at a tenth, late lines at a
        // third): nation, supplier, orders, lineitem, each projected to
        // what is read.
        let parts = vec![
            wide_part(0, 2.5, 8.0),
            wide_part(1, 100_000.0, 40.0),
            wide_part(2, 1_500_000.0, 8.0),
            wide_part(3, 19_995_350.0, 16.0),
        ];
        let edges = [
            edge(0, 1), // n_nationkey = s_nationkey
            edge(2, 3), // o_orderkey = l_orderkey
            edge(1, 3), // s_suppkey = l_suppkey
        ];
        let keys = [25.0, 15_000_000.0, 100_000.0];
        // The orders join last, not broadcast to meet every late line.
        assert_eq!(partner(parts, &edges, &keys, 3, 2), [0, 1, 3]);
    }

    #[test]
    fn on_a_cluster_wide_rows_are_not_broadcast_before_narrow_ones_meet() {
        // Q10 at SF10, as estimated: customer (name, address, phone,
        // comment…), orders (one quarter), lineitem (returned), nation.
        // Counted in rows, the customers joined their orders first (4.8 M
        // rows moved against 5.7 M), and 1.7 M wide rows were broadcast to
        // meet the lines: 1.8 s → 6.9 s on 3 nodes.
        let parts = vec![
            wide_part(0, 1_500_000.0, 128.0),
            wide_part(1, 1_666_667.0, 20.0),
            wide_part(2, 5_998_605.0, 64.0),
            wide_part(3, 25.0, 32.0),
        ];
        let edges = [
            edge(0, 1), // c_custkey = o_custkey
            edge(2, 1), // l_orderkey = o_orderkey
            edge(0, 3), // c_nationkey = n_nationkey
        ];
        let keys = [1_500_000.0, 15_000_000.0, 25.0];
        // The orders meet their lines before the customers' wide rows.
        assert_eq!(partner(parts, &edges, &keys, 3, 1), [2]);
    }

    #[test]
    fn parts_not_connected_are_left_alone() {
        let parts = vec![part(0, 10.0), part(1, 20.0), part(2, 30.0)];
        assert!(greedy(parts, &[edge(0, 1)], &[10.0], &[f64::INFINITY; 3], 1).is_none());
    }

    #[test]
    fn a_join_on_few_keys_waits() {
        // Q5 at SF10: customer, orders (one year), lineitem, supplier,
        // nation, region ('ASIA'); customer and supplier also join on
        // nationkey, 25 values: that join makes 6·10⁹ rows and must not go
        // first.
        let parts = vec![
            part(0, 1_500_000.0),
            part(1, 2_500_000.0),
            part(2, 59_986_052.0),
            part(3, 100_000.0),
            part(4, 25.0),
            part(5, 0.5),
        ];
        let edges = [
            edge(0, 1), // c_custkey = o_custkey
            edge(2, 1), // l_orderkey = o_orderkey
            edge(2, 3), // l_suppkey = s_suppkey
            edge(0, 3), // c_nationkey = s_nationkey
            edge(3, 4), // s_nationkey = n_nationkey
            edge(4, 5), // n_regionkey = r_regionkey
        ];
        let keys = [1_500_000.0, 15_000_000.0, 100_000.0, 25.0, 25.0, 5.0];
        let order = greedy(parts, &edges, &keys, &[f64::INFINITY; 6], 1).expect("connected");
        // region ⋈ nation first, then supplier; customer joins no earlier
        // than orders.
        assert_eq!(order[0], (5, 4));
        assert_eq!(order[1], (5, 3));
        let customer = order.iter().position(|&(l, r)| l == 0 || r == 0);
        let orders = order.iter().position(|&(l, r)| l == 1 || r == 1);
        assert!(customer >= orders, "{order:?}");
    }

    fn qualified(table: &str, column: &str) -> Expr {
        Expr::Column(Column::new(Some(table), column))
    }

    #[test]
    fn equal_columns_imply_edges() {
        // TPC-H Q9: part 0, partsupp 1, lineitem 2.
        let edges = vec![
            (
                0,
                qualified("part", "p_partkey"),
                2,
                qualified("lineitem", "l_partkey"),
            ),
            (
                1,
                qualified("partsupp", "ps_partkey"),
                2,
                qualified("lineitem", "l_partkey"),
            ),
            (
                1,
                qualified("partsupp", "ps_suppkey"),
                2,
                qualified("lineitem", "l_suppkey"),
            ),
        ];
        let (edges, classes) = with_implied_edges(edges);
        assert_eq!(edges.len(), 4, "{edges:?}");
        let (a, ea, b, eb) = &edges[3];
        assert_eq!((*a, *b), (0, 1));
        assert_eq!(ea, &qualified("part", "p_partkey"));
        assert_eq!(eb, &qualified("partsupp", "ps_partkey"));
        // The partkeys are one class, the suppkeys another.
        assert!(classes.iter().all(Option::is_some));
        assert_eq!(classes[0], classes[1]);
        assert_eq!(classes[0], classes[3]);
        assert_ne!(classes[0], classes[2]);
    }

    #[test]
    fn a_leaf_with_two_columns_of_a_class_implies_nothing() {
        // a.x = b.y and b.y = a.z: a.x = a.z is a filter inside a; nothing
        // is implied and the edges keep no class (both stay in the joins).
        let edges = vec![
            (0, qualified("a", "x"), 1, qualified("b", "y")),
            (1, qualified("b", "y"), 0, qualified("a", "z")),
            (
                1,
                qualified("b", "w"),
                2,
                Expr::Cast(datafusion::logical_expr::Cast::new(
                    Box::new(qualified("c", "v")),
                    arrow::datatypes::DataType::Int64,
                )),
            ),
        ];
        let (edges, classes) = with_implied_edges(edges);
        assert_eq!(edges.len(), 3);
        assert_eq!(classes, vec![None, None, None]);
    }

    /// Q9 at SF10: nation 0, supplier 1, part ('%green%') 2, partsupp 3,
    /// lineitem 4, orders 5.
    fn q9_parts() -> Vec<Part> {
        vec![
            part(0, 25.0),
            part(1, 100_000.0),
            part(2, 200_000.0),
            part(3, 8_000_000.0),
            part(4, 60_000_000.0),
            part(5, 15_000_000.0),
        ]
    }

    #[test]
    fn the_filtered_dimension_joins_its_other_fact_first() {
        // Q9 at SF10: nation 0, supplier 1, part ('%green%') 2, partsupp
        // 3, lineitem 4, orders 5.
        let parts = q9_parts();
        let caps = [
            25.0,
            100_000.0,
            2_000_000.0,
            8_000_000.0,
            60_000_000.0,
            15_000_000.0,
        ];
        let c = |leaf: usize, name: &str| qualified(&format!("t{leaf}"), name);
        let written = vec![
            (1, c(1, "suppkey"), 4, c(4, "suppkey")),
            (3, c(3, "suppkey"), 4, c(4, "suppkey")),
            (3, c(3, "partkey"), 4, c(4, "partkey")),
            (2, c(2, "partkey"), 4, c(4, "partkey")),
            (5, c(5, "orderkey"), 4, c(4, "orderkey")),
            (1, c(1, "nationkey"), 0, c(0, "nationkey")),
        ];
        let count = |e: &Expr| -> f64 {
            match e {
                Expr::Column(col) if col.name == "suppkey" => 100_000.0,
                Expr::Column(col) if col.name == "partkey" => 2_000_000.0,
                Expr::Column(col) if col.name == "orderkey" => 15_000_000.0,
                _ => 25.0,
            }
        };
        let (edges, _) = with_implied_edges(written.clone());
        let keys: Vec<f64> = edges
            .iter()
            .map(|(_, l, _, r)| count(l).min(count(r)))
            .collect();
        let order = greedy(parts, &edges, &keys, &caps, 1).expect("connected");
        // nation ⋈ supplier, then part ⋈ partsupp (an implied edge), and
        // lineitem only after both.
        assert_eq!(order[0], (0, 1));
        assert_eq!(order[1], (2, 3));
        let lineitem = order.iter().position(|&(l, r)| l == 4 || r == 4);
        assert!(lineitem >= Some(3), "{order:?}");
        // Without the implied edges partsupp joins after lineitem.
        let parts = q9_parts();
        let keys: Vec<f64> = written
            .iter()
            .map(|(_, l, _, r)| count(l).min(count(r)))
            .collect();
        let order = greedy(parts, &written, &keys, &caps, 1).expect("connected");
        let first = |leaf: usize| order.iter().position(|&(l, r)| l == leaf || r == leaf);
        assert!(first(3) > first(4), "{order:?}");
    }

    #[test]
    fn a_key_of_several_columns_finds_one_row() {
        // lineitem (60 M) ⋈ partsupp (8 M) on partkey (2 M values) and
        // suppkey (100 K): one partsupp row per line, so 60 M rows, not 60
        // M · 8 M / 2 M = 240 M; it goes before the join with the third
        // part (60 M · 24 M / 10 M = 144 M).
        let parts = vec![
            part(0, 60_000_000.0),
            part(1, 8_000_000.0),
            part(2, 24_000_000.0),
        ];
        let caps = [60_000_000.0, 8_000_000.0, 24_000_000.0];
        let c = |leaf: usize, name: &str| qualified(&format!("t{leaf}"), name);
        let edges = vec![
            (0, c(0, "partkey"), 1, c(1, "partkey")),
            (0, c(0, "suppkey"), 1, c(1, "suppkey")),
            (0, c(0, "orderkey"), 2, c(2, "orderkey")),
        ];
        let keys = [2_000_000.0, 100_000.0, 10_000_000.0];
        let order = greedy(parts, &edges, &keys, &caps, 1).expect("connected");
        assert_eq!(order[0], (1, 0));
    }

    #[test]
    fn selectivities() {
        use datafusion::logical_expr::{col, lit};
        let eq = col("a").eq(lit(1));
        assert!((selectivity(&eq) - 0.1).abs() < 1e-9);
        let both = eq.clone().and(col("b").lt(lit(3)));
        assert!((selectivity(&both) - 0.1 / 3.0).abs() < 1e-9);
        let either = eq.clone().or(col("c").eq(lit(2)));
        assert!((selectivity(&either) - 0.19).abs() < 1e-9);
        assert!((selectivity(&Expr::Not(Box::new(eq))) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn selectivities_from_value_ranges() {
        use datafusion::logical_expr::{col, lit};
        // SSB's d_year: 1992 to 1998.
        let range = |c: &Column| (c.name == "d_year").then_some((1992.0, 1998.0));
        let none = |_: &Column| None;
        let s = |e: &Expr| selectivity_with(e, &none, &range);
        let years = col("d_year")
            .gt_eq(lit(1992))
            .and(col("d_year").lt_eq(lit(1997)));
        assert!((s(&years) - 6.0 / 7.0).abs() < 1e-12);
        assert!((s(&col("d_year").lt(lit(1994))) - 2.0 / 7.0).abs() < 1e-12);
        assert!((s(&lit(1994).gt(col("d_year"))) - 2.0 / 7.0).abs() < 1e-12);
        assert!((s(&col("d_year").gt(lit(2000)))).abs() < 1e-12);
        let between = col("d_year").between(lit(1993), lit(1994));
        assert!((s(&between) - 2.0 / 7.0).abs() < 1e-12);
        let outside = col("d_year").not_between(lit(1993), lit(1994));
        assert!((s(&outside) - 5.0 / 7.0).abs() < 1e-12);
        // Without a range, the fixed guesses.
        assert!((s(&col("x").lt(lit(3))) - 1.0 / 3.0).abs() < 1e-12);
        assert!((s(&col("x").between(lit(1), lit(2))) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn selectivities_from_distinct_counts() {
        use datafusion::logical_expr::{col, lit};
        // p_type: 150 values.
        let distinct = |c: &Column| (c.name == "p_type").then_some(150.0);
        let no_range = |_: &Column| None;
        let eq = col("p_type").eq(lit("ECONOMY ANODIZED STEEL"));
        assert!((selectivity_with(&eq, &distinct, &no_range) - 1.0 / 150.0).abs() < 1e-12);
        let flipped = lit("X").eq(col("p_type"));
        assert!((selectivity_with(&flipped, &distinct, &no_range) - 1.0 / 150.0).abs() < 1e-12);
        let ne = col("p_type").not_eq(lit("X"));
        assert!((selectivity_with(&ne, &distinct, &no_range) - 149.0 / 150.0).abs() < 1e-12);
        let list = col("p_type").in_list(vec![lit("A"), lit("B"), lit("C")], false);
        assert!((selectivity_with(&list, &distinct, &no_range) - 3.0 / 150.0).abs() < 1e-12);
        // Columns without a count, and comparisons of two columns, keep the
        // fixed guesses.
        let other = col("p_size").eq(lit(15));
        assert!((selectivity_with(&other, &distinct, &no_range) - 0.1).abs() < 1e-12);
        let columns = col("p_type").eq(col("p_brand"));
        assert!((selectivity_with(&columns, &distinct, &no_range) - 0.1).abs() < 1e-12);
    }
}
