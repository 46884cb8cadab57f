//! `FilteredAggregateExec`: the partial phase of a grouped aggregation fused
//! with the filter (and the projections) below it, for filters that keep
//! most rows.
//!
//! DataFusion's `FilterExec` copies every column of the rows it keeps into
//! new batches before the projections and the aggregation read them. Where
//! it keeps nearly every row (TPC-H Q1's `l_shipdate <= '1998-09-02'` keeps
//! 98.6 % of lineitem's 60 M rows, scattered) the copy is pure overhead: a
//! tenth of the query's time at SF10. Here the aggregates read every row,
//! and the rows the filter drops go to a group of their own, the trash,
//! which is never emitted (handing the mask to DataFusion's
//! `GroupsAccumulator`s as the `opt_filter` of `FILTER (WHERE …)` instead
//! takes each of them off its tight loop: Q1's eight aggregates then cost
//! more than the copy saved):
//!
//! ```text
//!  input batch ─► predicate ─► mask (NULL = false)
//!                   │ keeps ≥ FUSED_SHARE of the rows   │ keeps fewer
//!                   ▼                                   ▼
//!   projections, keys, arguments           copy the kept rows (as FilterExec),
//!   over every row; a dropped row's        then projections, keys, arguments
//!   group is the trash (index 0; a         over those
//!   group g is g + 1 in the aggregates)
//! ```
//!
//! Three things keep the answer the filtered plan's:
//! - a row the filter drops must not start a group: every group is marked
//!   live by the first kept row it gets, and groups never marked are left
//!   out of the output;
//! - a row the filter drops must not raise an error the filtered plan never
//!   meets (`WHERE x <> 0 … sum(10 / x)`, an overflow in a dropped row):
//!   the projections, keys and arguments are evaluated before anything
//!   changes, and if they fail over every row, the batch is filtered and
//!   evaluated again, failing only if the kept rows fail;
//! - nothing volatile is evaluated, and only aggregates whose update cannot
//!   fail take the trash's rows (`count`, `sum`, `avg`, `min`, `max`: their
//!   sums wrap, the trash's state is dropped unread).
//!
//! Memory: the groups held are emitted as partial rows (which the final
//! phase merges as it merges any) once more than [`GROUPS_HELD_MAX`] are
//! held; the planning rule ([`crate::rules::FuseFilterAggregate`]) takes
//! only aggregations expected to hold few groups.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::compute::{filter_record_batch, prep_null_mask_filter};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::EmitTo;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::projection::{ProjectionExprs, ProjectionRef, Projector};
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{AggregateExec, PhysicalGroupBy, evaluate_group_by};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use crate::operators::run_aggregate::{
    AggregateInputs, PartialAggregates, PartialPhase, PartialSpec, PartialStream,
    partial_properties, supported_partial, visit,
};
use datafusion::physical_expr_common::physical_expr::is_volatile;

/// The share of a batch's rows the filter must keep for the aggregates to
/// skip the dropped rows instead of a copy of the kept ones: evaluating the
/// projections over a dropped row costs about what copying a kept row does.
pub const FUSED_SHARE: f64 = 0.7;
/// The aggregates whose update never fails, whatever the values: they may
/// take the dropped rows into the trash group.
const TRASH_SAFE: [&str; 5] = ["count", "sum", "avg", "min", "max"];
/// Groups held before they are emitted as partial rows.
pub const GROUPS_HELD_MAX: usize = 1 << 16;

/// A filter, the projections above it, and a partial aggregation over them,
/// in one operator; see the module documentation.
#[derive(Debug)]
pub struct FilteredAggregateExec {
    predicate: Arc<dyn PhysicalExpr>,
    /// The columns the filter passes on (FilterExec's own projection).
    filter_projection: Option<ProjectionRef>,
    /// The projections between the filter and the aggregation, bottom first.
    projections: Vec<ProjectionExprs>,
    spec: PartialSpec,
    /// The filter's input.
    input: Arc<dyn ExecutionPlan>,
    /// The partial aggregation's output schema.
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl FilteredAggregateExec {
    /// `partial` (DataFusion's `mode=Partial`) fused with the filter below
    /// it (through projections), if it can be: an aggregation this crate's
    /// partial operators take ([`supported_partial`]), a filter without a
    /// row limit, nothing volatile.
    pub fn try_from_partial(partial: &AggregateExec) -> Option<Self> {
        if !supported_partial(partial)
            || !partial
                .aggr_expr()
                .iter()
                .all(|a| TRASH_SAFE.contains(&a.fun().name()))
        {
            return None;
        }
        let mut projections = Vec::new();
        let mut node = partial.input();
        let filter = loop {
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                projections.push(projection.projection_expr().clone());
                node = projection.input();
            } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
                break filter;
            } else {
                return None;
            }
        };
        projections.reverse();
        if filter.fetch().is_some() {
            return None;
        }
        let spec = PartialSpec::of(partial);
        let projected = projections.iter().flat_map(|p| p.iter().map(|e| &e.expr));
        if std::iter::once(filter.predicate())
            .chain(projected)
            .chain(&spec.expressions())
            .any(|e| is_volatile(e))
        {
            return None;
        }
        let input = Arc::clone(filter.input());
        let schema = partial.schema();
        // Incremental where more than GROUPS_HELD_MAX groups come.
        let properties = partial_properties(&schema, &input, EmissionType::Both);
        Some(Self {
            predicate: Arc::clone(filter.predicate()),
            filter_projection: filter.projection().clone(),
            projections,
            spec,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The filter's output schema and the projectors above it.
    fn projectors(&self) -> Result<Vec<Projector>> {
        let mut schema = self.input.schema();
        if let Some(columns) = &self.filter_projection {
            schema = Arc::new(schema.project(columns)?);
        }
        let mut projectors = Vec::with_capacity(self.projections.len());
        for projection in &self.projections {
            let projector = projection.make_projector(&schema)?;
            schema = Arc::clone(projector.output_schema());
            projectors.push(projector);
        }
        Ok(projectors)
    }
}

impl DisplayAs for FilteredAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "FilteredAggregateExec: mode=Partial, predicate={}, {}",
            self.predicate, self.spec
        )?;
        for projection in &self.projections {
            let exprs: Vec<String> = projection
                .iter()
                .map(|e| format!("{} as {}", e.expr, e.alias))
                .collect();
            write!(f, ", projection=[{}]", exprs.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for FilteredAggregateExec {
    fn name(&self) -> &str {
        "FilteredAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let projected = self
            .projections
            .iter()
            .flat_map(|p| p.iter().map(|e| Arc::clone(&e.expr)));
        let expressions = std::iter::once(Arc::clone(&self.predicate))
            .chain(projected)
            .chain(self.spec.expressions())
            .collect();
        visit(expressions, f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = children.as_slice() else {
            return Err(DataFusionError::Internal(
                "FilteredAggregateExec has one child".into(),
            ));
        };
        Ok(Arc::new(Self {
            predicate: Arc::clone(&self.predicate),
            filter_projection: self.filter_projection.clone(),
            projections: self.projections.clone(),
            spec: self.spec.clone(),
            input: Arc::clone(input),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let projectors = self.projectors()?;
        let projected = match projectors.last() {
            Some(last) => Arc::clone(last.output_schema()),
            None => match &self.filter_projection {
                Some(columns) => Arc::new(self.input.schema().project(columns)?),
                None => self.input.schema(),
            },
        };
        let group_schema = self.spec.group_by.group_schema(&projected)?;
        let phase = Fused {
            predicate: Arc::clone(&self.predicate),
            filter_projection: self.filter_projection.clone(),
            projectors,
            group_by: Arc::clone(&self.spec.group_by),
            groups: new_group_values(group_schema, &GroupOrdering::None)?,
            aggregates: self.spec.aggregates()?,
            live: Vec::new(),
            indices: Vec::new(),
            routed: Vec::new(),
            schema: Arc::clone(&self.schema),
            fused_batches: MetricBuilder::new(&self.metrics).counter("fused_batches", partition),
            copied_batches: MetricBuilder::new(&self.metrics).counter("copied_batches", partition),
        };
        Ok(Box::pin(PartialStream {
            input: self.input.execute(partition, context)?,
            phase,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            done: false,
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One partition's state.
struct Fused {
    predicate: Arc<dyn PhysicalExpr>,
    filter_projection: Option<ProjectionRef>,
    projectors: Vec<Projector>,
    group_by: Arc<PhysicalGroupBy>,
    groups: Box<dyn GroupValues>,
    aggregates: PartialAggregates,
    /// Whether each group has had a kept row.
    live: Vec<bool>,
    /// Each row's group (reused between batches).
    indices: Vec<usize>,
    /// Each row's group in the aggregates: 0 the trash, g + 1 group g.
    routed: Vec<usize>,
    schema: SchemaRef,
    /// Batches aggregated with the mask, and with a copy of the kept rows.
    fused_batches: Count,
    copied_batches: Count,
}

impl Fused {
    /// The filter's output columns of `batch`, projected.
    fn project(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut batch = match &self.filter_projection {
            Some(columns) => batch.project(columns)?,
            None => batch,
        };
        for projector in &self.projectors {
            batch = projector.project_batch(&batch)?;
        }
        Ok(batch)
    }

    /// The keys and the aggregates' inputs over `batch` (projected first).
    fn evaluate(&self, batch: RecordBatch) -> Result<(Vec<ArrayRef>, AggregateInputs)> {
        let batch = self.project(batch)?;
        let keys = evaluate_group_by(&self.group_by, &batch)?
            .pop()
            .ok_or_else(|| DataFusionError::Internal("FilteredAggregateExec: no keys".into()))?;
        Ok((keys, self.aggregates.evaluate(&batch)?))
    }

    /// Every group held as partial rows, less those no kept row reached.
    fn emit(&mut self) -> Result<RecordBatch> {
        let mut columns = self.groups.emit(EmitTo::All)?;
        // Without the trash, the first row of each state.
        let states = self.aggregates.state(EmitTo::All)?;
        columns.extend(states.iter().map(|state| state.slice(1, state.len() - 1)));
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        let live = BooleanArray::from(std::mem::take(&mut self.live));
        if live.true_count() < batch.num_rows() {
            return Ok(filter_record_batch(&batch, &live)?);
        }
        Ok(batch)
    }
}

impl PartialPhase for Fused {
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(None);
        }
        let mask = self.predicate.evaluate(batch)?.into_array(rows)?;
        let Some(mask) = mask.as_boolean_opt() else {
            return Err(DataFusionError::Internal(format!(
                "a filter's predicate gave {} rather than booleans",
                mask.data_type()
            )));
        };
        let mask = if mask.null_count() > 0 {
            prep_null_mask_filter(mask)
        } else {
            mask.clone()
        };
        let kept = mask.true_count();
        if kept == 0 {
            return Ok(None);
        }
        let fused = kept < rows && kept as f64 >= FUSED_SHARE * rows as f64;
        let evaluated = if fused {
            // Over every row; where that fails (a dropped row's error),
            // over the kept rows alone.
            match self.evaluate(batch.clone()) {
                Ok(evaluated) => Some(evaluated),
                Err(_) => None,
            }
        } else {
            None
        };
        let (keys, inputs, keep) = match evaluated {
            Some((keys, inputs)) => {
                self.fused_batches.add(1);
                (keys, inputs, Some(mask))
            }
            None => {
                let kept_rows = if kept == rows {
                    batch.clone()
                } else {
                    self.copied_batches.add(1);
                    filter_record_batch(batch, &mask)?
                };
                let (keys, inputs) = self.evaluate(kept_rows)?;
                (keys, inputs, None)
            }
        };
        self.groups.intern(&keys, &mut self.indices)?;
        let total = self.groups.len();
        self.live.resize(total, false);
        self.routed.clear();
        match &keep {
            Some(keep) => {
                for (&group, kept) in self.indices.iter().zip(keep.values().iter()) {
                    self.live[group] |= kept;
                    self.routed.push(if kept { group + 1 } else { 0 });
                }
            }
            None => {
                for &group in &self.indices {
                    self.live[group] = true;
                    self.routed.push(group + 1);
                }
            }
        }
        self.aggregates
            .update(inputs, &self.routed, total + 1, None)?;
        if total > GROUPS_HELD_MAX {
            return self.emit().map(Some);
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.groups.is_empty() {
            return Ok(None);
        }
        self.emit().map(Some)
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::run_aggregate::tests::{answer_with, partitions};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    fn fused(partial: &AggregateExec) -> Option<Arc<dyn ExecutionPlan>> {
        FilteredAggregateExec::try_from_partial(partial).map(|e| Arc::new(e) as _)
    }

    fn context(seed: u64) -> SessionContext {
        // Batches of 8: some keep every row, most some, a few none.
        let config = SessionConfig::new()
            .with_target_partitions(2)
            .with_batch_size(8);
        let ctx = SessionContext::new_with_config(config);
        let (schema, parts) = partitions(seed);
        let table = MemTable::try_new(schema, parts).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        ctx
    }

    #[tokio::test]
    async fn fused_filters_give_the_filtered_plans_answers() {
        for seed in 0..4 {
            let ctx = context(seed);
            for sql in [
                // Keeps most rows: the fused path.
                "SELECT s, count(*), sum(v), avg(v), min(f), max(f) FROM t \
                 WHERE v IS NULL OR v > -90 GROUP BY s",
                // Keys only some dropped rows have must not appear.
                "SELECT k % 7, s, count(*), sum(v) FILTER (WHERE v > 0) FROM t \
                 WHERE k IS NULL OR k % 5 <> 0 GROUP BY k % 7, s",
                // A projection between (v * 2 computed once).
                "SELECT s, sum(w), max(w) FROM (SELECT s, v * 2 AS w, f FROM t WHERE f > -900) \
                 GROUP BY s",
                // Keeps few rows: the copying path.
                "SELECT s, count(*), sum(v) FROM t WHERE v > 80 GROUP BY s",
                // NULLs in the predicate count as false.
                "SELECT s, count(*) FROM t WHERE v > -95 AND f > -990 GROUP BY s",
            ] {
                let (expected, _) = answer_with(&ctx, sql, |_| None).await.unwrap();
                let (rows, replaced) = answer_with(&ctx, sql, fused).await.unwrap();
                assert!(replaced >= 1, "{sql}: not fused");
                assert!(expected.len() > 4, "{sql}: {expected:?}");
                assert_eq!(rows, expected, "seed {seed}: {sql}");
            }
        }
    }

    #[tokio::test]
    async fn a_dropped_rows_error_is_not_raised() {
        let ctx = context(5);
        // 100 / v fails where v = 0, which the filter drops; over the kept
        // rows the answer is the filtered plan's.
        let sql = "SELECT s, sum(100 / v) FROM t WHERE v IS NULL OR v <> 0 GROUP BY s";
        let (expected, _) = answer_with(&ctx, sql, |_| None).await.unwrap();
        let (rows, replaced) = answer_with(&ctx, sql, fused).await.unwrap();
        assert_eq!(replaced, 1);
        assert_eq!(rows, expected);
        // An error of a kept row is still raised.
        let sql = "SELECT s, sum(100 / v) FROM t WHERE v IS NULL OR v <> 1 GROUP BY s";
        assert!(answer_with(&ctx, sql, |_| None).await.is_err());
        let error = answer_with(&ctx, sql, fused).await.unwrap_err();
        assert!(error.to_string().contains("Divide by zero"), "{error}");
    }

    #[tokio::test]
    async fn only_a_filter_below_and_nothing_volatile_is_fused() {
        let ctx = context(6);
        for (sql, fusable) in [
            ("SELECT s, sum(v) FROM t WHERE v > 0 GROUP BY s", true),
            ("SELECT s, sum(v) FROM t GROUP BY s", false),
            (
                "SELECT s, sum(v) FROM t WHERE random() > 0.5 GROUP BY s",
                false,
            ),
            (
                "SELECT s, sum(v + random()) FROM t WHERE v > 0 GROUP BY s",
                false,
            ),
            // An aggregate whose update might fail on a dropped row's value.
            (
                "SELECT s, bool_or(v > 0) FROM t WHERE v > 0 GROUP BY s",
                false,
            ),
        ] {
            let (_, replaced) = answer_with(&ctx, sql, fused).await.unwrap();
            assert_eq!(replaced == 1, fusable, "{sql}");
        }
    }
}
