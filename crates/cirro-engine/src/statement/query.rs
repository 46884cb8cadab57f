//! Statements DataFusion plans: a query, EXPLAIN, DML, TRUNCATE, SHOW and
//! DataFusion's own settings and COPY. The statement is planned once (AS OF
//! resolved first, see `time_travel.rs`), the plan's privileges checked,
//! and the plan run: row changes through `dml.rs`, queries as streams (on a
//! cluster, with one retry when a node fails before the first row).

use std::sync::Arc;

use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::Statement;
use datafusion::logical_expr::{LogicalPlan, Statement as PlanStatement};
use futures::StreamExt;

use crate::Engine;
use crate::statement::{
    Outcome, by_key, describe, dml, explain, point, prerun, time_travel, write,
};

/// 08006 for a query a node failed (see [`Engine::query`]).
fn node_failure(e: &datafusion::error::DataFusionError) -> CirroError {
    CirroError::new(
        SqlState::CONNECTION_FAILURE,
        format!("a node of the cluster failed during the query; try again: {e}"),
    )
}

impl Engine {
    /// How an error of a write's input (CREATE TABLE AS, INSERT … SELECT)
    /// reads: 08006 where a node of the cluster failed (the write commits
    /// nothing, so it can be run again), else as any error.
    pub(crate) fn input_error(
        &self,
    ) -> impl Fn(datafusion::error::DataFusionError) -> CirroError + Send + Sync + 'static {
        let distribution = self.distribution.clone();
        move |e| match &distribution {
            Some(d) if d.is_node_failure(&e) => node_failure(&e),
            _ => CirroError::from(e),
        }
    }
}

impl Engine {
    /// `plan` as a DataFrame planned as this node plans statements now: on
    /// a cluster, for as many tasks per stage as it has live nodes (a join
    /// counts a build side it would broadcast once per task, see
    /// `JoinOrderOptions::stage_tasks`).
    pub(crate) async fn frame(
        &self,
        plan: LogicalPlan,
    ) -> datafusion::error::Result<datafusion::dataframe::DataFrame> {
        let frame = self.ctx.execute_logical_plan(plan).await?;
        if self.distribution.is_none() {
            return Ok(frame);
        }
        let (mut state, plan) = frame.into_parts();
        self.plan_for_stages(&mut state);
        Ok(datafusion::dataframe::DataFrame::new(state, plan))
    }

    /// `state` set up to plan as [`Self::frame`] plans.
    fn plan_for_stages(&self, state: &mut datafusion::execution::SessionState) {
        let Some(distribution) = &self.distribution else {
            return;
        };
        if let Some(options) = state
            .config_mut()
            .options_mut()
            .extensions
            .get_mut::<cirro_exec::rules::JoinOrderOptions>()
        {
            options.stage_tasks = distribution.stage_tasks();
        }
    }
}

/// One more row of EXPLAIN output (`plan_type`, `plan`).
fn explain_row(
    schema: &arrow::datatypes::SchemaRef,
    text: &str,
) -> Result<arrow::array::RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let value = if i == 0 { "nodes" } else { text };
            arrow::compute::cast(
                &arrow::array::StringArray::from(vec![value]),
                field.data_type(),
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(arrow::array::RecordBatch::try_new(
        Arc::clone(schema),
        columns,
    )?)
}

impl Engine {
    /// Plan a statement of a kind DataFusion plans and run the plan.
    pub(crate) async fn run_planned(&self, statement: &Statement) -> Result<Outcome> {
        let Some(mut statement) = statement.to_datafusion() else {
            return Err(CirroError::internal("a statement DataFusion does not plan"));
        };
        time_travel::resolve_time_travel(self, &mut statement).await?;
        let plan = self.plan(statement.clone()).await?;
        self.check_plan(&plan)?;
        match self.execute_plan(plan).await {
            // A write that waited for an ALTER TABLE of its table, planned
            // over the old columns and having written nothing: planned
            // again over the new ones.
            Err(e) if point::plan_again(self, &e) => {
                let plan = self.plan(statement).await?;
                self.check_plan(&plan)?;
                self.execute_plan(plan).await
            }
            outcome => outcome,
        }
    }

    /// Run a checked plan (a prepared statement's too): EXPLAIN of a row
    /// change shows the query Cirro runs for it; DML through `dml.rs`;
    /// DataFusion's SET/RESET; a query.
    pub(crate) async fn execute_plan(&self, plan: LogicalPlan) -> Result<Outcome> {
        // EXPLAIN ANALYZE would change the table.
        let explained = match &plan {
            LogicalPlan::Explain(explain) => Some((explain.plan.as_ref(), explain.verbose, false)),
            LogicalPlan::Analyze(analyze) => Some((analyze.input.as_ref(), analyze.verbose, true)),
            _ => None,
        };
        if let Some((LogicalPlan::Dml(dml), verbose, analyze)) = explained
            && let Some(tag) = dml::row_change_tag(&dml.op)
        {
            if analyze {
                return Err(CirroError::unsupported(format!(
                    "EXPLAIN ANALYZE {tag} is not supported (it would change the table); use EXPLAIN {tag}"
                )));
            }
            let plan = dml::explain_plan(dml, verbose, tag)?;
            let frame = self.ctx.execute_logical_plan(plan).await?;
            return Ok(Outcome::Rows(frame.execute_stream().await?));
        }
        match plan {
            LogicalPlan::Dml(dml) => write::execute(self, dml).await,
            LogicalPlan::Ddl(ddl) => Err(CirroError::unsupported(format!(
                "{} is not supported",
                ddl.name()
            ))),
            // `DESCRIBE SELECT …`.
            LogicalPlan::DescribeTable(describe) => {
                let batch = describe::describe_batch(&describe, None)?;
                self.batch_rows(batch).await
            }
            LogicalPlan::Copy(_) => {
                let count = self.run_for_count(plan).await?;
                Ok(Outcome::command(format!("COPY {count}")))
            }
            LogicalPlan::Statement(
                statement @ (PlanStatement::SetVariable(_) | PlanStatement::ResetVariable(_)),
            ) => {
                let tag = match statement {
                    PlanStatement::ResetVariable(_) => "RESET",
                    _ => "SET",
                };
                let frame = self
                    .ctx
                    .execute_logical_plan(LogicalPlan::Statement(statement))
                    .await?;
                frame.collect().await?;
                Ok(Outcome::command(tag))
            }
            plan => {
                if let Some(rows) = by_key::select(self, &plan).await? {
                    return Ok(rows);
                }
                self.query(plan).await
            }
        }
    }

    /// Run a query, its uncorrelated `IN` subqueries picked by `HAVING`
    /// first where they return few values (`prerun.rs`). On a cluster node
    /// a query that runs on several nodes
    /// and fails because a node failed before it returned a row is planned
    /// and run once more, on the nodes that answer (its rows are then
    /// whole: none was sent); a failure after that, or after rows went
    /// out, is 08006. `EXPLAIN ANALYZE` of such a query says which nodes
    /// ran each stage.
    async fn query(&self, plan: LogicalPlan) -> Result<Outcome> {
        if let LogicalPlan::Explain(explain) = &plan {
            return self.explain(explain.plan.as_ref(), plan.clone()).await;
        }
        let Some(distribution) = &self.distribution else {
            let plan = prerun::in_subqueries(self, plan).await?;
            let frame = self.ctx.execute_logical_plan(plan).await?;
            return Ok(Outcome::Rows(frame.execute_stream().await?));
        };
        let analyze = matches!(plan, LogicalPlan::Analyze(_));
        let mut retried = false;
        // Whether a node's failure (`e`) is answered by running the query
        // again (once, before it returned a row), else its error.
        let retry = |e: &datafusion::error::DataFusionError, retried: &mut bool| {
            if !distribution.is_node_failure(e) {
                return None;
            }
            if *retried {
                return Some(Err(node_failure(e)));
            }
            log::warn!("a node failed during a query; running it again: {e}");
            *retried = true;
            // Counted in cirro.queries.
            let record = self
                .current_query
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(record) = record {
                record.retried();
            }
            Some(Ok(()))
        };
        loop {
            let planned = match prerun::in_subqueries(self, plan.clone()).await {
                Ok(planned) => planned,
                Err(e) => match retry(&e, &mut retried) {
                    Some(Ok(())) => {
                        distribution.forget_failed_nodes().await;
                        continue;
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(e.into()),
                },
            };
            let mut frame = self.frame(planned).await?;
            if analyze {
                let (mut state, plan) = frame.into_parts();
                distribution.for_analyze(state.config_mut())?;
                frame = datafusion::dataframe::DataFrame::new(state, plan);
            }
            let task_ctx = Arc::new(frame.task_ctx());
            // Forget where earlier statements' (or a failed run's) tasks ran
            // and what their planning sampled.
            distribution.take_task_placement(task_ctx.session_config());
            let physical = frame.create_physical_plan().await?;
            let distributed = distribution.is_distributed(&physical);
            let mut stream =
                datafusion::physical_plan::execute_stream(physical, Arc::clone(&task_ctx))?;
            if !distributed {
                return Ok(Outcome::Rows(stream));
            }
            let schema = stream.schema();
            let first = stream.next().await;
            if let Some(Err(e)) = &first {
                match retry(e, &mut retried) {
                    Some(Ok(())) => {
                        distribution.forget_failed_nodes().await;
                        continue;
                    }
                    Some(Err(e)) => return Err(e),
                    None => {}
                }
            }
            if analyze {
                let placement = distribution.take_task_placement(task_ctx.session_config());
                let mut batches: Vec<_> = first.into_iter().collect::<Result<_, _>>()?;
                while let Some(batch) = stream.next().await {
                    batches.push(batch?);
                }
                if !placement.is_empty() {
                    batches.push(explain_row(&schema, &placement.join("\n"))?);
                }
                let batch = arrow::compute::concat_batches(&schema, &batches)?;
                return self.batch_rows(batch).await;
            }
            let failover = Arc::clone(distribution);
            let rest = stream.map(move |item| {
                item.map_err(|e| {
                    if failover.is_node_failure(&e) {
                        node_failure(&e).into_datafusion()
                    } else {
                        e
                    }
                })
            });
            let stream = futures::stream::iter(first).chain(rest);
            return Ok(Outcome::Rows(Box::pin(
                datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream),
            )));
        }
    }

    /// EXPLAIN (`plan`) of `explained`, with every join's strategy on its
    /// line, and on a cluster every aggregation's exchange (see
    /// `explain.rs`).
    async fn explain(&self, explained: &LogicalPlan, plan: LogicalPlan) -> Result<Outcome> {
        let mut state = self.ctx.state();
        self.plan_for_stages(&mut state);
        let marks = match state.create_physical_plan(explained).await {
            Ok(physical) => explain::line_marks(&physical, self.distribution.as_deref()),
            Err(_) => Vec::new(), // EXPLAIN itself reports what fails
        };
        let frame = self.frame(plan).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let mut batches = frame.collect().await?;
        if !marks.is_empty() {
            for batch in &mut batches {
                let Some(text) = batch
                    .column(1)
                    .as_any()
                    .downcast_ref::<arrow::array::StringArray>()
                else {
                    continue;
                };
                let marked: arrow::array::StringArray = text
                    .iter()
                    .map(|t| t.map(|t| explain::mark_lines(t, &marks)))
                    .collect();
                let mut columns = batch.columns().to_vec();
                columns[1] = Arc::new(marked);
                *batch = arrow::array::RecordBatch::try_new(batch.schema(), columns)?;
            }
        }
        let batch = arrow::compute::concat_batches(&schema, &batches)?;
        self.batch_rows(batch).await
    }

    /// Run a plan whose result is one `count` row, and return the count.
    pub(crate) async fn run_for_count(&self, plan: LogicalPlan) -> Result<u64> {
        let frame = self.ctx.execute_logical_plan(plan).await?;
        let mut stream = rows_in_order(frame).await?;
        let mut count = 0u64;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if batch.num_columns() == 1 {
                if let Some(array) = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::UInt64Array>()
                {
                    count += array.iter().flatten().sum::<u64>();
                }
            }
        }
        Ok(count)
    }

    /// Rows of a batch computed by the engine (SHOW, maintenance results).
    pub(crate) async fn batch_rows(&self, batch: arrow::array::RecordBatch) -> Result<Outcome> {
        let frame = self.ctx.read_batch(batch)?;
        Ok(Outcome::Rows(frame.execute_stream().await?))
    }
}

/// The rows of `frame` as a table is written from them: its partitions one
/// after another where each holds its rows in their own order (a scan of
/// files written in key order), not merged as their batches come
/// (`cirro_exec::operators::concat`).
pub(crate) async fn rows_in_order(
    frame: datafusion::dataframe::DataFrame,
) -> datafusion::error::Result<datafusion::physical_plan::SendableRecordBatchStream> {
    let task = Arc::new(frame.task_ctx());
    let plan =
        cirro_exec::operators::concat::planned_in_order(frame.create_physical_plan()).await?;
    let plan = cirro_exec::operators::concat::in_partition_order(plan)?;
    datafusion::physical_plan::execute_stream(plan, task)
}
