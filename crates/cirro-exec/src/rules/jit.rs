//! Where expressions are compiled ([`crate::jit`]): in filters' predicates,
//! projections and the arguments of aggregations that read rows (partial and
//! single modes; a projection below computes them), the largest subtrees
//! that compile. It runs last among the physical rules (the JIT node keeps
//! the interpreted expression as its child, so a later rewrite would fall
//! back to it), in single-node plans: a cluster's plans are serialized, and
//! DataFusion's codec does not know the node.
//!
//! `SET jit = off | on | force`: `on` (the default) compiles arithmetic,
//! and conditions of at least [`JitOptions::min_comparisons`] comparisons
//! (3), where one pass over the rows replaces several: TPC-H Q6's five,
//! SSB Q1's three or four. Arrow's comparison kernels are vectorized, the
//! kernel's loop is scalar: one or two comparisons are about even or slower
//! compiled (over TPC-H SF1 lineitem, `l_quantity < 24`: 7.2–10.4 ms
//! interpreted, 7.5–10.3 compiled; `l_shipdate >= DATE …`: 4.8–6.8 against
//! 6.5–8.7; Q14's two date comparisons: 17.9 against 19.0–23.9 for the
//! query). Arithmetic compiled beats Arrow's checked kernels even alone
//! (`sum(l_extendedprice * l_discount)`: 16.0 → 13.3 ms). `force` compiles
//! every subtree with an operation.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use crate::jit::{JitExpr, Kernels};

datafusion::common::extensions_options! {
    /// The session's switches of runtime code generation.
    pub struct JitOptions {
        /// `off`, `on` or `force` (`SET jit`).
        pub mode: String, default = "on".to_string()
        /// Comparisons from which `on` compiles a condition without
        /// arithmetic (arithmetic always compiles).
        pub min_comparisons: usize, default = 3
        /// Whether filters evaluate their cheap conjuncts first
        /// ([`super::conjuncts`]), where compiled filters find them together.
        pub order_conjuncts: bool, default = true
        /// Whether filters evaluate each conjunct on the rows the ones
        /// before it kept, reading only its columns ([`crate::conjunction`]).
        pub selective_conjuncts: bool, default = true
    }
}

impl datafusion::common::config::ConfigExtension for JitOptions {
    const PREFIX: &'static str = "cirro_jit";
}

/// The rule, compiling into one node's kernel cache.
#[derive(Debug, Default)]
pub struct CompileExpressions {
    kernels: Arc<Kernels>,
}

impl CompileExpressions {
    pub fn new(kernels: Arc<Kernels>) -> Self {
        Self { kernels }
    }
}

impl PhysicalOptimizerRule for CompileExpressions {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = config.extensions.get::<JitOptions>();
        let min_comparisons = match options.map(|o| o.mode.as_str()) {
            Some("off") => return Ok(plan),
            Some("force") => 1,
            _ => options.map_or(3, |o| o.min_comparisons.max(1)),
        };
        plan.transform_up(|node| compile_plan(node, min_comparisons, &self.kernels))
            .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "cirro_compile_expressions"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn compile_plan(
    node: Arc<dyn ExecutionPlan>,
    min_comparisons: usize,
    kernels: &Arc<Kernels>,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    if let Some(filter) = node.downcast_ref::<FilterExec>() {
        let schema = filter.input().schema();
        let compiled = compile(filter.predicate(), &schema, true, min_comparisons, kernels)?;
        if !compiled.transformed {
            return Ok(Transformed::no(node));
        }
        let rebuilt = FilterExecBuilder::from(filter)
            .with_predicate(compiled.data)
            .build()?;
        return Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>));
    }
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        let schema = projection.input().schema();
        return super::rewrite_projection(Arc::clone(&node), projection, |expr| {
            compile(expr, &schema, false, min_comparisons, kernels)
        });
    }
    if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
        return compile_aggregate(aggregate, min_comparisons, kernels)
            .map(|rebuilt| rebuilt.map_or_else(|| Transformed::no(node), Transformed::yes));
    }
    Ok(Transformed::no(node))
}

/// An aggregation whose arguments compile, rebuilt over a projection that
/// computes them (`jit(…) as __jit_arg_N`, the input's columns passed on
/// beside them): EXPLAIN ANALYZE shows the kernels' counters there (an
/// aggregation shows only its functions' names), and the aggregation reads
/// the arguments as columns. None where nothing compiles.
fn compile_aggregate(
    aggregate: &AggregateExec,
    min_comparisons: usize,
    kernels: &Arc<Kernels>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    // The final modes read partial states, not the arguments.
    if !matches!(
        aggregate.mode(),
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
    ) {
        return Ok(None);
    }
    let input = aggregate.input();
    let schema = input.schema();
    // The pass-through columns keep their names, which must be unique.
    let names: HashSet<&String> = schema.fields().iter().map(|f| f.name()).collect();
    if names.len() != schema.fields().len() || schema != aggregate.input_schema() {
        return Ok(None);
    }
    let mut hoisted: Vec<ProjectionExpr> = Vec::new();
    let mut aggregates = Vec::with_capacity(aggregate.aggr_expr().len());
    for function in aggregate.aggr_expr() {
        let mark = hoisted.len();
        let mut args = Vec::new();
        for arg in function.expressions() {
            let compiled = compile(&arg, &schema, false, min_comparisons, kernels)?;
            if !compiled.transformed {
                args.push(arg);
                continue;
            }
            let name = format!("__jit_arg_{}", hoisted.len());
            let index = schema.fields().len() + hoisted.len();
            args.push(Arc::new(Column::new(&name, index)) as Arc<dyn PhysicalExpr>);
            hoisted.push(ProjectionExpr {
                expr: compiled.data,
                alias: name,
            });
        }
        let order_by = function
            .order_bys()
            .iter()
            .map(|sort| Arc::clone(&sort.expr))
            .collect();
        match (hoisted.len() > mark)
            .then(|| function.with_new_expressions(args, order_by))
            .flatten()
        {
            Some(rewritten) => aggregates.push(Arc::new(rewritten)),
            None => {
                hoisted.truncate(mark);
                aggregates.push(Arc::clone(function));
            }
        }
    }
    if hoisted.is_empty() {
        return Ok(None);
    }
    let mut exprs: Vec<ProjectionExpr> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| ProjectionExpr {
            expr: Arc::new(Column::new(field.name(), i)) as Arc<dyn PhysicalExpr>,
            alias: field.name().clone(),
        })
        .collect();
    exprs.extend(hoisted);
    let projection: Arc<dyn ExecutionPlan> =
        Arc::new(ProjectionExec::try_new(exprs, Arc::clone(input))?);
    let rebuilt = AggregateExec::try_new(
        *aggregate.mode(),
        aggregate.group_expr().clone(),
        aggregates,
        aggregate.filter_expr().to_vec(),
        Arc::clone(&projection),
        projection.schema(),
    )?
    .with_new_limit_options(aggregate.limit_options());
    Ok(Some(Arc::new(rebuilt)))
}

/// `expr` with its largest compilable subtrees compiled. `logic`: `expr` is
/// reached from a filter's root through AND/OR only.
fn compile(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    logic: bool,
    min_comparisons: usize,
    kernels: &Arc<Kernels>,
) -> Result<Transformed<Arc<dyn PhysicalExpr>>> {
    if expr.downcast_ref::<JitExpr>().is_some() {
        return Ok(Transformed::no(Arc::clone(expr)));
    }
    if let Some(jit) = JitExpr::try_new(expr, schema, logic, kernels)
        && jit.comparisons_only().is_none_or(|n| n >= min_comparisons)
    {
        return Ok(Transformed::yes(Arc::new(jit) as Arc<dyn PhysicalExpr>));
    }
    let children_logic = logic
        && expr
            .downcast_ref::<BinaryExpr>()
            .is_some_and(|b| matches!(b.op(), Operator::And | Operator::Or));
    let mut changed = false;
    let mut children = Vec::new();
    for child in expr.children() {
        let compiled = compile(child, schema, children_logic, min_comparisons, kernels)?;
        changed |= compiled.transformed;
        children.push(compiled.data);
    }
    if !changed {
        return Ok(Transformed::no(Arc::clone(expr)));
    }
    Arc::clone(expr)
        .with_new_children(children)
        .map(Transformed::yes)
}
