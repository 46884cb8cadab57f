//! The plan pipeline: every rule Cirro adds to DataFusion's analyzer,
//! logical optimizer and physical optimizer, in order, each with the reason
//! it sits where it does, and the session state a session plans with.
//!
//! ```text
//!  SQL ─► analyzer ─► logical optimizer ─► physical optimizer
//!         ANALYZER    DataFusion's, then     COORDINATOR: DataFusion's with
//!                     LOGICAL                Cirro's placed among them
//!                                            LOCAL: what one node applies to
//!                                            the plan it executes
//! ```
//!
//! Cirro's rules are placed among DataFusion's default rules ([`Place`]):
//! `planner_order_is_pinned` pins the resulting lists, so an upgrade of
//! DataFusion that adds, drops or renames a rule fails that test rather
//! than moving Cirro's rules silently.
//!
//! The physical rules come in two halves. The coordinator's half plans the
//! query as a whole (join sides, partitioning, what a cluster sends to
//! other nodes). The local half ([`local_rules`]) turns the operators one
//! node runs into Cirro's own (adaptive aggregation, the GPU operators,
//! the hot-data tier, compiled expressions, spilling joins, shared
//! subplans); its operators are not carried by DataFusion's plan codec, so
//! a cluster session plans without it and each node applies it to the part
//! of the plan it runs (`cirro_cluster::local`, given [`local_rules`] and
//! [`EngineOptions`] when the node joins).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cirro_catalog::{CirroCatalogList, DEFAULT_DATABASE, DEFAULT_SCHEMA};
use cirro_common::Result;
use cirro_exec::distribution::{OptionList, OptionVisitor};
use cirro_exec::rules as cirro;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::{AnalyzerRule, OptimizerRule};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::Statement as DfStatement;

use crate::Engine;
use crate::node::Node;
use crate::session::EngineConfig;
use crate::system::queries;

pub(crate) type Analyzer = Arc<dyn AnalyzerRule + Send + Sync>;
pub(crate) type Logical = Arc<dyn OptimizerRule + Send + Sync>;
pub(crate) type Physical = Arc<dyn PhysicalOptimizerRule + Send + Sync>;

/// Where one of Cirro's rules goes among DataFusion's, by the name
/// DataFusion's rule reports.
#[derive(Clone, Copy, Debug)]
enum Place {
    First,
    Before(&'static str),
    After(&'static str),
    Last,
}

/// One of Cirro's rules: where it goes, the rule, and why there.
struct Entry<R> {
    place: Place,
    rule: R,
    #[allow(dead_code)] // read by people; `every_entry_says_why` checks it
    why: &'static str,
}

fn entry<R>(place: Place, rule: R, why: &'static str) -> Entry<R> {
    Entry { place, rule, why }
}

/// DataFusion's rules with `cirro`'s put in their places (in list order
/// among entries of one place). `name` is a rule's name.
fn place<R: Clone>(defaults: Vec<R>, cirro: Vec<Entry<R>>, name: impl Fn(&R) -> String) -> Vec<R> {
    let at = |wanted: fn(&Place) -> Option<&'static str>, rule: &R| -> Vec<R> {
        cirro
            .iter()
            .filter(|e| wanted(&e.place).is_some_and(|n| n == name(rule)))
            .map(|e| e.rule.clone())
            .collect()
    };
    let mut rules: Vec<R> = cirro
        .iter()
        .filter(|e| matches!(e.place, Place::First))
        .map(|e| e.rule.clone())
        .collect();
    for rule in defaults {
        rules.extend(at(
            |p| match p {
                Place::Before(n) => Some(*n),
                _ => None,
            },
            &rule,
        ));
        let after = at(
            |p| match p {
                Place::After(n) => Some(*n),
                _ => None,
            },
            &rule,
        );
        rules.push(rule);
        rules.extend(after);
    }
    rules.extend(
        cirro
            .iter()
            .filter(|e| matches!(e.place, Place::Last))
            .map(|e| e.rule.clone()),
    );
    rules
}

/// The analyzer: DataFusion's with Cirro's PostgreSQL typing around type
/// coercion.
pub(crate) fn analyzer_rules() -> Vec<Analyzer> {
    place(
        datafusion::optimizer::analyzer::Analyzer::new().rules,
        analyzer_entries(),
        |r| r.name().to_string(),
    )
}

/// Cirro's analyzer rules and their places.
fn analyzer_entries() -> Vec<Entry<Analyzer>> {
    use Place::*;
    vec![
        entry(
            Before("type_coercion"),
            Arc::new(cirro::TypeChainSegments) as Analyzer,
            "splits long chains of one operator before coercion types every link",
        ),
        entry(
            Before("type_coercion"),
            Arc::new(cirro::PgOperators) as Analyzer,
            "PostgreSQL's operators (||, ^, …) as functions, for coercion to type",
        ),
        entry(
            After("type_coercion"),
            Arc::new(cirro::CheckedArithmetic) as Analyzer,
            "overflow-checked arithmetic needs the coerced types (22003)",
        ),
        entry(
            After("type_coercion"),
            Arc::new(cirro::GuardFallibleConditions) as Analyzer,
            "guards what can fail behind its condition (CASE, AND), once typed",
        ),
        entry(
            After("type_coercion"),
            Arc::new(cirro::InlineLateralProjections) as Analyzer,
            "a LATERAL subquery without FROM computed over the outer row (pgbench)",
        ),
    ]
}

/// The logical optimizer's rules Cirro adds after DataFusion's, on a single
/// node and on a cluster alike: the join order the tables' statistics give
/// (the smallest estimated join first, which on a cluster also keeps the
/// rows every later join shuffles fewest), then the co-located joins first.
pub(crate) fn logical_rules(distributed: bool) -> Vec<Logical> {
    let estimates = || cirro::ReorderJoins::new(scan_rows, scan_keys, scan_range, scan_buckets);
    vec![
        // After DataFusion's rewrites, which leave an uncorrelated scalar
        // subquery in its filter: one over the filter's own input reads a
        // window over it instead of computing it again (TPC-H Q15; on a
        // cluster the two copies would run in stages that share nothing).
        Arc::new(cirro::SubqueryWindows),
        // After DataFusion's rewrites: orders the joins it leaves, by the
        // tables' statistics (groups of two or more bucketed tables are
        // left to the next rule).
        Arc::new(estimates()),
        // After the join order is settled: joins of tables bucketed alike
        // run first, without a shuffle.
        Arc::new(cirro::CoLocatedJoinsFirst::new(scan_buckets)),
        // Semi joins go below inner joins that do not filter, and
        // aggregations joined on their group keys aggregate the groups the
        // join keeps (both by default on a cluster, where a join's dynamic
        // filter does not reach another stage).
        Arc::new(cirro::PushSemiJoins::new(estimates(), distributed)),
        Arc::new(cirro::ReduceGroups::new(estimates(), distributed)),
    ]
}

/// The coordinator's physical rules: DataFusion's with Cirro's among them.
pub(crate) fn coordinator_rules() -> Vec<Physical> {
    place(
        datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules,
        coordinator_entries(),
        |r| r.name().to_string(),
    )
}

/// Cirro's coordinator rules and their places.
fn coordinator_entries() -> Vec<Entry<Physical>> {
    use Place::*;
    vec![
        entry(
            First,
            Arc::new(cirro::LazyGuards) as Physical,
            "before any rule moves a guarded expression away from its guard",
        ),
        entry(
            Before("join_selection"),
            Arc::new(cirro::JoinOnGroupKeys) as Physical,
            "a join's keys decide partitioning before the join's mode is chosen",
        ),
        entry(
            Before("join_selection"),
            Arc::new(cirro::FilterEstimates) as Physical,
            "filters' estimates decide the join's sides",
        ),
        entry(
            After("join_selection"),
            Arc::new(cirro::BuildSides) as Physical,
            "corrects the sides join selection picked, by Cirro's estimates",
        ),
        entry(
            Last,
            Arc::new(cirro::OrderConjuncts) as Physical,
            "orders each filter's conjuncts once the filters stop moving",
        ),
        entry(
            Last,
            Arc::new(cirro::YieldAfterJoins) as Physical,
            "after every rewrite of the joins it yields after",
        ),
    ]
}

/// The physical rules one node applies to the plan it executes, after the
/// coordinator's, in this order; those that keep state (the hot-data tier,
/// the kernels, the GPU) hold `node`'s.
pub fn local_rules(node: &Node) -> Vec<Physical> {
    let mut rules: Vec<Physical> = Vec::new();
    // Radix partitions are planned for one node's threads.
    rules.push(Arc::new(cirro::AdaptiveAggregation));
    // GPU twins of the operators (`SET gpu`), before the rules that rewrite
    // filters for the CPU (compiled and selective conjuncts), and before
    // the tier's: a scan under a GPU filter drops no rows (the device's
    // column cache is keyed by the tier's batches).
    #[cfg(feature = "gpu")]
    rules.push(Arc::new(cirro_gpu::GpuOperators::new(Arc::clone(
        node.accelerator(),
    ))));
    // The hot-data tier over the scans the rules before have settled.
    let tier = cirro_storage::cache::CacheScans::new(Arc::clone(node.cache()));
    #[cfg(feature = "gpu")]
    let tier = tier.with_roles(Arc::new(GpuRoles));
    rules.push(Arc::new(tier));
    // The compiled expressions keep their interpreted ones as children only.
    rules.push(Arc::new(cirro::CompileExpressions::new(Arc::clone(
        node.kernels(),
    ))));
    // Over the compiled conjuncts.
    rules.push(Arc::new(cirro::SelectiveConjuncts));
    // Over the compiled expressions and the ordered conjuncts.
    rules.push(Arc::new(cirro::FuseFilterAggregate));
    // Hash joins that spill; after the rules that rewrite hash joins.
    rules.push(Arc::new(cirro::SpillingJoins));
    // After every rewrite: it shares subtrees that print alike.
    rules.push(Arc::new(cirro::SharedSubplans));
    rules
}

/// The physical rules a cluster's coordinator applies to a whole plan
/// after the coordinator's, just before it cuts the plan into stages: the
/// choices that depend on what crosses the network.
pub fn cut_rules() -> Vec<Physical> {
    vec![
        // Whether each grouped aggregation pre-aggregates before its shuffle
        // or shuffles its rows (on a single node, adaptive aggregation above
        // chooses instead, for one node's threads).
        Arc::new(cirro::AggregationExchange),
        // The probe sides of joins that cannot broadcast their build side
        // (semi, anti, left) filtered by its keys before their shuffle.
        Arc::new(cirro::PrefilterProbes),
    ]
}

/// The GPU's operators as the hot-data tier's rule sees them (by their
/// types, which `cirro-gpu` knows).
#[cfg(feature = "gpu")]
#[derive(Debug)]
struct GpuRoles;

#[cfg(feature = "gpu")]
impl cirro_storage::cache::OperatorRoles for GpuRoles {
    fn is_join(&self, plan: &dyn datafusion::physical_plan::ExecutionPlan) -> bool {
        cirro_gpu::is_gpu_join(plan)
    }

    fn is_row_wise(&self, plan: &dyn datafusion::physical_plan::ExecutionPlan) -> bool {
        cirro_gpu::is_gpu_row_wise(plan)
    }
}

/// The option extensions of Cirro's rules, which every session has (and a
/// cluster sends with every task, see [`OptionList`]).
pub struct EngineOptions;

impl OptionList for EngineOptions {
    fn visit<V: OptionVisitor>(visitor: &mut V) {
        visitor.visit::<cirro_storage::cache::CacheOptions>();
        visitor.visit::<cirro::AggregationOptions>();
        visitor.visit::<cirro::JitOptions>();
        visitor.visit::<cirro::JoinOrderOptions>();
        visitor.visit::<cirro_exec::resources::QueryOptions>();
        #[cfg(feature = "gpu")]
        visitor.visit::<cirro_gpu::GpuOptions>();
    }
}

/// Registers each option extension (its defaults) in a configuration.
struct Register<'a>(&'a mut SessionConfig);

impl OptionVisitor for Register<'_> {
    fn visit<T: datafusion::config::ConfigExtension + Default + Clone>(&mut self) {
        self.0.options_mut().extensions.insert(T::default());
    }
}

/// A session's configuration: PostgreSQL's NUMERIC literals and the
/// switches of Cirro's rules (`SET cache`, `SET adaptive_aggregation`, …).
fn session_config(config: &EngineConfig) -> SessionConfig {
    let mut session_config = SessionConfig::new()
        .with_information_schema(true)
        .with_default_catalog_and_schema(
            config.database.as_deref().unwrap_or(DEFAULT_DATABASE),
            DEFAULT_SCHEMA,
        )
        .with_create_default_catalog_and_schema(false);
    // Numbers with a decimal point or an exponent are NUMERIC, as in
    // PostgreSQL (`0.1 + 0.2 = 0.3`), not binary floats.
    session_config
        .options_mut()
        .sql_parser
        .parse_float_as_decimal = true;
    EngineOptions::visit(&mut Register(&mut session_config));
    if let Some(partitions) = config.target_partitions {
        session_config = session_config.with_target_partitions(partitions.max(1));
    }
    session_config
}

/// The DataFusion session state of a session over `catalogs`: the rules
/// above, PostgreSQL's types and aggregates, the cluster's planner on a
/// cluster node, and last the rule that records each plan for
/// `cirro.queries` (`current_query`).
pub(crate) fn session_state(
    config: &EngineConfig,
    catalogs: &Arc<CirroCatalogList>,
    runtime: Arc<RuntimeEnv>,
    current_query: &queries::QuerySlot,
) -> SessionState {
    let distributed = config.distribution.is_some();
    let mut builder = SessionStateBuilder::new()
        .with_config(session_config(config))
        .with_default_features()
        .with_type_planner(Arc::new(cirro_sql::PgTypes))
        .with_analyzer_rules(analyzer_rules());
    if let Some(functions) = builder.aggregate_functions() {
        cirro_exec::functions::replace_udafs(functions);
    }
    for rule in logical_rules(distributed) {
        builder = builder.with_optimizer_rule(rule);
    }
    let mut physical = coordinator_rules();
    if !distributed {
        physical.extend(local_rules(&config.node));
    }
    builder = builder
        .with_physical_optimizer_rules(physical)
        .with_catalog_list(catalogs.clone())
        .with_runtime_env(runtime);
    if let Some(distribution) = &config.distribution {
        builder = distribution.configure(builder);
    }
    builder
        .with_physical_optimizer_rule(Arc::new(queries::RecordPlan(Arc::clone(current_query))))
        .build()
}

/// The bucketing of a scan of a Cirro table, for the planning rule that
/// joins co-located tables first ([`cirro::CoLocatedJoinsFirst`]).
fn scan_buckets(scan: &datafusion::logical_expr::TableScan) -> Option<(Vec<String>, u32)> {
    scanned_table(scan, |table| {
        let distribution = table.scan_distribution()?;
        Some((distribution.columns.clone(), distribution.buckets))
    })
}

/// The rows of a scanned Cirro table (deleted rows left out), for join ordering.
fn scan_rows(scan: &datafusion::logical_expr::TableScan) -> Option<u64> {
    scanned_table(scan, |table| table.row_count())
}

/// The value range of an integer column of a scanned Cirro table, for the
/// selectivities of join ordering.
fn scan_range(scan: &datafusion::logical_expr::TableScan, column: &str) -> Option<(i64, i64)> {
    scanned_table(scan, |table| table.value_range(column))
}

/// The estimated distinct values of a column of a scanned Cirro table, for
/// join ordering.
fn scan_keys(scan: &datafusion::logical_expr::TableScan, column: &str) -> Option<u64> {
    scanned_table(scan, |table| table.distinct_estimate(column))
}

fn scanned_table<T>(
    scan: &datafusion::logical_expr::TableScan,
    f: impl FnOnce(&cirro_storage::CirroTable) -> Option<T>,
) -> Option<T> {
    let provider = datafusion::datasource::source_as_provider(&scan.source).ok()?;
    f((provider.as_ref() as &dyn std::any::Any).downcast_ref::<cirro_storage::CirroTable>()?)
}

impl Engine {
    /// Plan a statement: SQL to a logical plan (counted, see `SHOW
    /// cirro.plans`). A SELECT list whose names DataFusion cannot tell
    /// apart (`SELECT 1, 1`, `SELECT x, x::text`) is planned again with
    /// PostgreSQL's names made unique (see `cirro_sql::names`). VALUES
    /// lists nested in an INSERT's query are typed by their own values
    /// (see `cirro_sql::values`).
    pub(crate) async fn plan(&self, mut statement: DfStatement) -> Result<LogicalPlan> {
        self.counters.plans.fetch_add(1, Ordering::Relaxed);
        cirro_sql::values::detach_insert_values(&mut statement);
        // A query's columns are named as PostgreSQL names them (`?column?`).
        cirro_sql::names::name_outputs(&mut statement);
        // `generate_series(…) AS g` names its column `g`.
        cirro_sql::names::name_function_columns(&mut statement);
        let state = self.ctx.state();
        match state.statement_to_plan(statement.clone()).await {
            Err(e)
                if e.to_string()
                    .contains(cirro_sql::names::DUPLICATE_PROJECTION_NAMES) =>
            {
                let mut named = statement;
                cirro_sql::names::name_projections(&mut named);
                Ok(state.statement_to_plan(named).await?)
            }
            planned => Ok(planned?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(rules: &[Physical]) -> Vec<&str> {
        rules.iter().map(|r| r.name()).collect()
    }

    /// The order of every phase, pinned: a change of DataFusion's defaults
    /// or of Cirro's places shows here.
    #[test]
    fn planner_order_is_pinned() {
        let analyzer: Vec<String> = analyzer_rules()
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(
            analyzer,
            [
                "resolve_grouping_function",
                "cirro_type_chain_segments",
                "cirro_pg_operators",
                "type_coercion",
                "cirro_checked_arithmetic",
                "cirro_guard_fallible_conditions",
                "cirro_inline_lateral_projections",
            ]
        );
        let logical: Vec<String> = logical_rules(false)
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(
            logical,
            [
                "subquery_windows",
                "reorder_joins",
                "co_located_joins_first",
                "push_semi_joins",
                "reduce_groups"
            ]
        );
        assert_eq!(
            names(&coordinator_rules()),
            [
                "cirro_lazy_guards",
                "OutputRequirements",
                "aggregate_statistics",
                "cirro_join_on_group_keys",
                "cirro_filter_estimates",
                "join_selection",
                "cirro_build_sides",
                "LimitedDistinctAggregation",
                "FilterPushdown",
                "WindowTopN",
                "EnsureRequirements",
                "CombinePartialFinalAggregate",
                "OptimizeAggregateOrder",
                "ProjectionPushdown",
                "OutputRequirements",
                "LimitAggregation",
                "LimitPushPastWindows",
                "HashJoinBuffering",
                "LimitPushdown",
                "TopKRepartition",
                "ProjectionPushdown",
                "PushdownSort",
                "EnsureCooperative",
                "FilterPushdown(Post)",
                "SanityCheckPlan",
                "cirro_order_conjuncts",
                "cirro_yield_after_joins",
            ]
        );
        let mut local = vec!["cirro_adaptive_aggregation"];
        if cfg!(feature = "gpu") {
            local.push("cirro_gpu_operators");
        }
        local.extend([
            "cirro_cache_scans",
            "cirro_compile_expressions",
            "cirro_selective_conjuncts",
            "cirro_fuse_filter_aggregate",
            "spilling_joins",
            "cirro_shared_subplans",
        ]);
        assert_eq!(names(&local_rules(&Node::default())), local);
        assert_eq!(
            names(&cut_rules()),
            ["cirro_aggregation_exchange", "cirro_prefilter_probes"]
        );
    }

    /// Every place names a rule DataFusion has: a rule placed before or
    /// after a name that no longer exists would be dropped.
    /// Every rule Cirro places says why it sits there, and lands in the
    /// list once.
    #[test]
    fn every_entry_says_why() {
        /// Each entry's reason is a phrase; its rule is in `placed` once.
        fn check<R>(entries: Vec<Entry<R>>, name: impl Fn(&R) -> String, placed: &[String]) {
            for e in entries {
                let name = name(&e.rule);
                assert!(e.why.split_whitespace().count() >= 3, "{name}: {:?}", e.why);
                assert_eq!(placed.iter().filter(|n| **n == name).count(), 1, "{name}");
            }
        }
        let analyzer: Vec<String> = analyzer_rules()
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        check(analyzer_entries(), |r| r.name().to_string(), &analyzer);
        let coordinator: Vec<String> = coordinator_rules()
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        check(
            coordinator_entries(),
            |r| r.name().to_string(),
            &coordinator,
        );
    }

    #[test]
    fn every_place_exists() {
        let analyzer = analyzer_rules().len();
        assert_eq!(
            analyzer,
            datafusion::optimizer::analyzer::Analyzer::new().rules.len() + 5
        );
        let physical = coordinator_rules().len();
        assert_eq!(
            physical,
            datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new()
                .rules
                .len()
                + 6
        );
    }
}
