//! `RunAggregateExec`: the partial phase of a grouped aggregation whose input
//! arrives in runs of equal keys (data written in key order: a sorted load,
//! a time series, TPC-H's lineitem by `l_orderkey`).
//!
//! DataFusion's partial phase looks every row's key up in a hash table. When
//! each thread meets millions of keys the table outgrows the CPU caches and
//! every new key's insert misses them; skipping the phase instead sends every
//! row through the shuffle and the final hash tables (TPC-H SF10 Q18: 60 M
//! lineitem rows into 15 M orders). On clustered input neither is needed:
//!
//! ```text
//!  input batch   keys  1 1 1 2 2 5 5 5 5 | 5 7 7 …      (next batch)
//!  runs          [0..3) [3..5) [5..9)     | continues the open run
//!  groups        g0     g1     g2 (open)  | g2 g3 …
//!                emitted when the groups held pass a batch; the open
//!                (last) group waits for the next batch's first row
//! ```
//!
//! Consecutive rows with equal keys (arrow's `partition` kernel: one
//! comparison of each row with the next, NULLs equal) form one group; the
//! group indices rise with the runs, so DataFusion's `GroupsAccumulator`s
//! update them without any hashing; the run that ends a batch stays open
//! and takes the next batch's first rows if they share its key. Groups are
//! emitted as accumulator states (`EmitTo::First`) once more than a batch of
//! them are held: memory of about one batch, whatever the number of keys.
//!
//! The output is exactly DataFusion's partial output (the group keys, then
//! each aggregate's state fields), so the shuffle and the final phase above
//! are DataFusion's, unchanged. Any input order gives the right answer: a key
//! met in several runs (or in several threads) yields several partial rows,
//! which the final phase merges as it merges any partial rows. Clustered
//! input yields about one row per key and thread; where the input is not
//! clustered the output is about as large as the input, which is why the
//! planning rule ([`crate::rules::AdaptiveAggregation`]) puts this operator
//! only over scans of files holding disjoint ranges of a key.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::make_comparator;
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, UInt32Array};
use arrow::compute::{SortOptions, and, concat, partition, take};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::InputOrderMode;
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateMode, PhysicalGroupBy, evaluate_group_by, evaluate_many,
};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Stream, StreamExt};

/// The partial phase of a grouped aggregation over runs of equal keys; see
/// the module documentation.
#[derive(Debug)]
pub struct RunAggregateExec {
    spec: PartialSpec,
    input: Arc<dyn ExecutionPlan>,
    /// The partial aggregation's output schema.
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl RunAggregateExec {
    /// The same aggregation as `partial` (DataFusion's `mode=Partial`) over
    /// runs, if it can be: one grouping set (no ROLLUP/CUBE), keys of types
    /// whose equal neighbours arrow can find, aggregates with a
    /// `GroupsAccumulator` that are neither DISTINCT nor ordered.
    pub fn try_from_partial(partial: &AggregateExec) -> Option<Self> {
        if !supported_partial(partial) {
            return None;
        }
        let input_schema = partial.input().schema();
        for (expr, _) in partial.group_expr().expr() {
            if !run_key_type(&expr.data_type(&input_schema).ok()?) {
                return None;
            }
        }
        let input = Arc::clone(partial.input());
        let schema = partial.schema();
        let properties = partial_properties(&schema, &input, EmissionType::Incremental);
        Some(Self {
            spec: PartialSpec::of(partial),
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The grouping keys.
    pub fn group_expr(&self) -> &PhysicalGroupBy {
        &self.spec.group_by
    }

    /// DataFusion's partial phase of the same aggregation over `input`
    /// (what [`Self::try_from_partial`] takes): how the operator is sent to
    /// another node.
    pub fn partial_over(&self, input: Arc<dyn ExecutionPlan>) -> Result<AggregateExec> {
        let input_schema = input.schema();
        AggregateExec::try_new(
            AggregateMode::Partial,
            Arc::clone(&self.spec.group_by),
            self.spec.aggr_expr.clone(),
            self.spec.filter_expr.clone(),
            input,
            input_schema,
        )
    }
}

/// The grouping and the aggregates of a partial phase, as DataFusion's
/// `AggregateExec` held them (shared by this crate's partial operators).
#[derive(Debug, Clone)]
pub(crate) struct PartialSpec {
    pub(crate) group_by: Arc<PhysicalGroupBy>,
    pub(crate) aggr_expr: Vec<Arc<AggregateFunctionExpr>>,
    pub(crate) filter_expr: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

impl PartialSpec {
    pub(crate) fn of(partial: &AggregateExec) -> Self {
        Self {
            group_by: Arc::new(partial.group_expr().clone()),
            aggr_expr: partial.aggr_expr().to_vec(),
            filter_expr: partial.filter_expr().to_vec(),
        }
    }

    /// The keys, the aggregates' arguments, their FILTER clauses.
    pub(crate) fn expressions(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        let keys = self.group_by.expr().iter().map(|(e, _)| Arc::clone(e));
        let arguments = self.aggr_expr.iter().flat_map(|a| a.expressions());
        let filters = self.filter_expr.iter().flatten().cloned();
        keys.chain(arguments).chain(filters).collect()
    }

    /// Fresh accumulators of the aggregates.
    pub(crate) fn aggregates(&self) -> Result<PartialAggregates> {
        PartialAggregates::new(&self.aggr_expr, &self.filter_expr)
    }
}

impl std::fmt::Display for PartialSpec {
    /// `gby=[…], aggr=[…]`, as DataFusion's `AggregateExec` prints them.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let keys: Vec<String> = self
            .group_by
            .expr()
            .iter()
            .map(|(expr, alias)| format!("{expr} as {alias}"))
            .collect();
        let aggregates: Vec<&str> = self.aggr_expr.iter().map(|a| a.name()).collect();
        write!(
            f,
            "gby=[{}], aggr=[{}]",
            keys.join(", "),
            aggregates.join(", ")
        )
    }
}

/// The plan properties of a partial phase with output `schema` over
/// `input` (as many partitions, no order).
pub(crate) fn partial_properties(
    schema: &SchemaRef,
    input: &Arc<dyn ExecutionPlan>,
    emission: EmissionType,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        Partitioning::UnknownPartitioning(
            input.properties().output_partitioning().partition_count(),
        ),
        emission,
        input.properties().boundedness,
    ))
}

/// `f` over `expressions`, stopping where it says so (an operator's
/// `apply_expressions`).
pub(crate) fn visit(
    expressions: Vec<Arc<dyn PhysicalExpr>>,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    for expr in expressions {
        if f(&expr)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// Whether `partial` is a partial phase this crate's operators can take
/// over: DataFusion's `mode=Partial` with one grouping set (no ROLLUP/CUBE)
/// of at least one key, and aggregates with a `GroupsAccumulator` that are
/// neither DISTINCT nor ordered; over input in no order (a partial phase
/// over sorted input hands on its groups in order, and the final phase
/// above may count on it, emitting each group as the next begins).
pub(crate) fn supported_partial(partial: &AggregateExec) -> bool {
    *partial.mode() == AggregateMode::Partial
        && *partial.input_order_mode() == InputOrderMode::Linear
        && partial.group_expr().is_single()
        && !partial.group_expr().is_empty()
        && partial.aggr_expr().iter().all(|a| {
            a.groups_accumulator_supported() && !a.is_distinct() && a.order_bys().is_empty()
        })
}

/// Key types whose runs arrow's `partition` finds (no dictionaries or
/// nested types).
fn run_key_type(data_type: &DataType) -> bool {
    data_type.is_primitive()
        || matches!(
            data_type,
            DataType::Boolean
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        )
}

impl DisplayAs for RunAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "RunAggregateExec: mode=Partial, {}", self.spec)
    }
}

impl ExecutionPlan for RunAggregateExec {
    fn name(&self) -> &str {
        "RunAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// A round-robin repartition below would break the runs.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        visit(self.spec.expressions(), f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = children.as_slice() else {
            return Err(DataFusionError::Internal(
                "RunAggregateExec has one child".into(),
            ));
        };
        Ok(Arc::new(Self {
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
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let runs = Runs {
            group_by: Arc::clone(&self.spec.group_by),
            aggregates: self.spec.aggregates()?,
            keys: Vec::new(),
            groups: 0,
            indices: Vec::new(),
            schema: Arc::clone(&self.schema),
            batch_size: context.session_config().batch_size().max(1),
        };
        Ok(Box::pin(PartialStream {
            input,
            phase: runs,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            done: false,
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One partition's aggregation state.
struct Runs {
    group_by: Arc<PhysicalGroupBy>,
    aggregates: PartialAggregates,
    /// The keys of the groups held, in chunks (one array per key column);
    /// the last row of the last chunk is the open group's.
    keys: Vec<Vec<ArrayRef>>,
    /// Groups held; the last is open.
    groups: usize,
    /// Each row's group (reused between batches).
    indices: Vec<usize>,
    schema: SchemaRef,
    batch_size: usize,
}

impl Runs {
    /// Aggregate `batch`; a batch of finished groups' states once more than
    /// a batch of groups are held.
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        let keys = evaluate_group_by(&self.group_by, batch)?
            .pop()
            .ok_or_else(|| DataFusionError::Internal("RunAggregateExec: no keys".into()))?;
        let ranges = partition(&keys)?.ranges();
        let continues = match self.keys.last() {
            Some(open) => same_key(open, &keys)?,
            None => false,
        };
        // The first run's group: the open one, or a new one after it.
        let base = if continues {
            self.groups - 1
        } else {
            self.groups
        };
        self.indices.clear();
        for (i, range) in ranges.iter().enumerate() {
            self.indices
                .extend(std::iter::repeat_n(base + i, range.end - range.start));
        }
        let first_new = usize::from(continues);
        if ranges.len() > first_new {
            let starts: UInt32Array = ranges[first_new..].iter().map(|r| r.start as u32).collect();
            let chunk = keys
                .iter()
                .map(|k| take(k.as_ref(), &starts, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            self.keys.push(chunk);
        }
        self.groups = base + ranges.len();
        let inputs = self.aggregates.evaluate(batch)?;
        self.aggregates
            .update(inputs, &self.indices, self.groups, None)?;
        if self.groups > self.batch_size {
            return self.emit(EmitTo::First(self.groups - 1)).map(Some);
        }
        Ok(None)
    }

    /// The states (and keys) of the first groups held, or of all.
    fn emit(&mut self, to: EmitTo) -> Result<RecordBatch> {
        let count = match to {
            EmitTo::All => self.groups,
            EmitTo::First(n) => n,
        };
        let columns = self.keys.first().map(Vec::len).unwrap_or(0);
        let mut output = Vec::with_capacity(self.schema.fields().len());
        let mut kept = Vec::with_capacity(columns);
        for c in 0..columns {
            let parts: Vec<&dyn Array> = self.keys.iter().map(|chunk| chunk[c].as_ref()).collect();
            let all = if parts.len() == 1 {
                Arc::clone(&self.keys[0][c])
            } else {
                concat(&parts)?
            };
            if count < all.len() {
                kept.push(all.slice(count, all.len() - count));
            }
            output.push(all.slice(0, count));
        }
        self.keys = if kept.is_empty() {
            Vec::new()
        } else {
            vec![kept]
        };
        output.extend(self.aggregates.state(to)?);
        self.groups -= count;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), output)?)
    }
}

/// Whether the last row of the open group's keys equals the first of `keys`
/// (NULL equal to NULL, as grouping takes them).
fn same_key(open: &[ArrayRef], keys: &[ArrayRef]) -> Result<bool> {
    for (held, new) in open.iter().zip(keys) {
        let compare = make_comparator(held.as_ref(), new.as_ref(), SortOptions::default())?;
        if compare(held.len() - 1, 0).is_ne() {
            return Ok(false);
        }
    }
    Ok(true)
}

impl PartialPhase for Runs {
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        Runs::push(self, batch)
    }

    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.groups == 0 {
            return Ok(None);
        }
        self.emit(EmitTo::All).map(Some)
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// The aggregates of a partial phase: their arguments, their FILTER
/// clauses, their accumulators (shared by this crate's partial operators).
pub(crate) struct PartialAggregates {
    /// Each aggregate's argument expressions.
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
}

/// The arguments and FILTER masks of each aggregate over one batch.
pub(crate) struct AggregateInputs {
    values: Vec<Vec<ArrayRef>>,
    filters: Vec<Option<BooleanArray>>,
}

impl PartialAggregates {
    pub(crate) fn new(
        aggr_expr: &[Arc<AggregateFunctionExpr>],
        filter_expr: &[Option<Arc<dyn PhysicalExpr>>],
    ) -> Result<Self> {
        Ok(Self {
            arguments: aggr_expr.iter().map(|a| a.expressions()).collect(),
            filters: filter_expr.to_vec(),
            accumulators: aggr_expr
                .iter()
                .map(|a| a.create_groups_accumulator())
                .collect::<Result<Vec<_>>>()?,
        })
    }

    /// Every aggregate's arguments and FILTER over `batch` (no state changes:
    /// an error here leaves the aggregation as it was).
    pub(crate) fn evaluate(&self, batch: &RecordBatch) -> Result<AggregateInputs> {
        let values = evaluate_many(&self.arguments, batch)?;
        let filters = self
            .filters
            .iter()
            .map(|filter| match filter {
                Some(expr) => {
                    let mask = expr.evaluate(batch)?.into_array(batch.num_rows())?;
                    Ok(Some(mask.as_boolean().clone()))
                }
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AggregateInputs { values, filters })
    }

    /// Add `inputs`' rows to `groups` (each row's group), of `total` groups;
    /// only the rows `keep` is true for, where given.
    pub(crate) fn update(
        &mut self,
        inputs: AggregateInputs,
        groups: &[usize],
        total: usize,
        keep: Option<&BooleanArray>,
    ) -> Result<()> {
        let filters = inputs.filters.into_iter();
        for ((accumulator, values), filter) in self
            .accumulators
            .iter_mut()
            .zip(&inputs.values)
            .zip(filters)
        {
            let filter = match (filter, keep) {
                (Some(filter), Some(keep)) => Some(and(&filter, keep)?),
                (filter, None) => filter,
                (None, Some(keep)) => Some(keep.clone()),
            };
            accumulator.update_batch(values, groups, filter.as_ref(), total)?;
        }
        Ok(())
    }

    /// The states of the groups `to` names (one array per state field).
    pub(crate) fn state(&mut self, to: EmitTo) -> Result<Vec<ArrayRef>> {
        let mut output = Vec::new();
        for accumulator in &mut self.accumulators {
            output.extend(accumulator.state(to)?);
        }
        Ok(output)
    }
}

/// A partial phase fed batch by batch (see [`PartialStream`]).
pub(crate) trait PartialPhase: Send + Unpin + 'static {
    /// Aggregate `batch`; a batch of partial rows when some are ready.
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>>;
    /// The partial rows still held at the end of the input.
    fn finish(&mut self) -> Result<Option<RecordBatch>>;
    fn schema(&self) -> SchemaRef;
}

/// The stream of a partial phase over its input's stream.
pub(crate) struct PartialStream<P> {
    pub(crate) input: SendableRecordBatchStream,
    pub(crate) phase: P,
    pub(crate) baseline: BaselineMetrics,
    pub(crate) done: bool,
}

impl<P: PartialPhase> Stream for PartialStream<P> {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let polled = match self.input.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(polled) => polled,
            };
            let this = &mut *self;
            let timer = this.baseline.elapsed_compute().timer();
            let output = match polled {
                Some(Ok(batch)) => this.phase.push(&batch),
                Some(Err(e)) => Err(e),
                None => {
                    this.done = true;
                    this.phase.finish()
                }
            };
            timer.done();
            match output {
                Ok(Some(batch)) => {
                    this.baseline.record_output(batch.num_rows());
                    return Poll::Ready(Some(Ok(batch)));
                }
                Ok(None) if this.done => return Poll::Ready(None),
                Ok(None) => continue,
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

impl<P: PartialPhase> RecordBatchStream for PartialStream<P> {
    fn schema(&self) -> SchemaRef {
        self.phase.schema()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::datasource::MemTable;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Two partitions of batches of 0 to 20 rows: `k` in runs of 1 to 5
    /// rows, rising but now and then jumping back (a key met again later),
    /// NULL now and then; `s` one of three texts or NULL, mostly constant
    /// within a run of `k`; `v`, `f` values with NULLs.
    pub(crate) fn partitions(seed: u64) -> (SchemaRef, Vec<Vec<RecordBatch>>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let mut rng = StdRng::seed_from_u64(seed);
        let mut key = 0i64;
        let mut left = 0;
        let mut text = None;
        let mut parts = Vec::new();
        for _ in 0..2 {
            let mut batches = Vec::new();
            for _ in 0..40 {
                let rows = rng.random_range(0..=20);
                let (mut k, mut s, mut v, mut f) = (vec![], vec![], vec![], vec![]);
                for _ in 0..rows {
                    if left == 0 {
                        key = if rng.random_bool(0.1) {
                            key - rng.random_range(0..30)
                        } else {
                            key + rng.random_range(1..3)
                        };
                        left = rng.random_range(1..=5);
                        text = [None, Some("a"), Some("b"), Some("c")][rng.random_range(0..4)];
                    }
                    left -= 1;
                    k.push((!rng.random_bool(0.05)).then_some(key));
                    s.push(if rng.random_bool(0.2) { None } else { text });
                    v.push((!rng.random_bool(0.1)).then(|| rng.random_range(-100..100)));
                    f.push((!rng.random_bool(0.1)).then(|| rng.random_range(-1e3..1e3)));
                }
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(k)),
                    Arc::new(StringArray::from(s)),
                    Arc::new(Int64Array::from(v)),
                    Arc::new(Float64Array::from(f)),
                ];
                batches.push(RecordBatch::try_new(Arc::clone(&schema), columns).unwrap());
            }
            parts.push(batches);
        }
        (schema, parts)
    }

    pub(crate) async fn physical(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        let frame = ctx.sql(sql).await.unwrap();
        frame.create_physical_plan().await.unwrap()
    }

    /// The sorted rows of `sql`, with every partial aggregation replaced
    /// by a [`RunAggregateExec`] if `runs`; and how many were.
    async fn answer(ctx: &SessionContext, sql: &str, runs: bool) -> (Vec<String>, usize) {
        answer_with(ctx, sql, |partial| {
            runs.then(|| {
                let exec = RunAggregateExec::try_from_partial(partial).expect(sql);
                Arc::new(exec) as Arc<dyn ExecutionPlan>
            })
        })
        .await
        .unwrap()
    }

    /// The sorted rows of `sql` (or its error), with each partial
    /// aggregation replaced by what `replace` gives; and how many were.
    pub(crate) async fn answer_with(
        ctx: &SessionContext,
        sql: &str,
        replace: impl Fn(&AggregateExec) -> Option<Arc<dyn ExecutionPlan>>,
    ) -> Result<(Vec<String>, usize)> {
        let plan = physical(ctx, sql).await;
        let mut replaced = 0;
        let plan = plan
            .transform_up(|node| {
                if let Some(partial) = node.downcast_ref::<AggregateExec>()
                    && *partial.mode() == AggregateMode::Partial
                    && let Some(exec) = replace(partial)
                {
                    replaced += 1;
                    return Ok(Transformed::yes(exec));
                }
                Ok(Transformed::no(node))
            })
            .unwrap()
            .data;
        let batches = collect(plan, ctx.task_ctx()).await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
        rows.sort();
        Ok((rows, replaced))
    }

    #[tokio::test]
    async fn runs_give_the_hash_aggregations_answers() {
        for seed in 0..4 {
            // Batches of 8: groups are emitted every few input batches.
            let config = SessionConfig::new()
                .with_target_partitions(2)
                .with_batch_size(8);
            let ctx = SessionContext::new_with_config(config);
            let (schema, parts) = partitions(seed);
            let table = MemTable::try_new(schema, parts).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            for sql in [
                "SELECT k, count(*), sum(v), avg(v), min(f), max(f), count(v) FROM t GROUP BY k",
                "SELECT k, s, count(*), sum(v) FILTER (WHERE v > 0), max(s) FROM t GROUP BY k, s",
                "SELECT s, k + 1, min(v), bool_or(v > 50) FROM t GROUP BY s, k + 1",
                "SELECT k, count(*) FROM t WHERE v IS NOT NULL GROUP BY k HAVING count(*) > 2",
            ] {
                let (expected, _) = answer(&ctx, sql, false).await;
                let (rows, replaced) = answer(&ctx, sql, true).await;
                assert!(replaced >= 1, "{sql}: no partial aggregation");
                assert!(expected.len() > 10, "{sql}: {expected:?}");
                assert_eq!(rows, expected, "seed {seed}: {sql}");
            }
        }
    }

    #[test]
    fn distinct_and_ordered_aggregates_stay_with_datafusion() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ctx = SessionContext::new();
            let (schema, parts) = partitions(9);
            ctx.register_table(
                "t",
                Arc::new(MemTable::try_new(Arc::clone(&schema), parts.clone()).unwrap()),
            )
            .unwrap();
            // Declared sorted by k: DataFusion's phases count on the order.
            let sorted = MemTable::try_new(schema, parts)
                .unwrap()
                .with_sort_order(vec![vec![datafusion::prelude::col("k").sort(true, false)]]);
            ctx.register_table("sorted", Arc::new(sorted)).unwrap();
            for (sql, supported) in [
                ("SELECT k, sum(v) FROM t GROUP BY k", true),
                ("SELECT k, sum(v) FROM sorted GROUP BY k", false),
                ("SELECT k, array_agg(v ORDER BY f) FROM t GROUP BY k", false),
                ("SELECT k, s, sum(v) FROM t GROUP BY ROLLUP (k, s)", false),
            ] {
                let plan = physical(&ctx, sql).await;
                let mut found = None;
                plan.apply(|node| {
                    if let Some(partial) = node.downcast_ref::<AggregateExec>()
                        && *partial.mode() == AggregateMode::Partial
                    {
                        found = Some(RunAggregateExec::try_from_partial(partial).is_some());
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
                .unwrap();
                assert_eq!(found, Some(supported), "{sql}");
            }
        });
    }
}
