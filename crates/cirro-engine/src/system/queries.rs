//! Statements as the server sees them: admission (the queue in front of
//! execution, see `cirro_exec::resources::admission`), their records in
//! `cirro.queries` (see `activity`), and `CANCEL QUERY id`.
//!
//! Each statement a session with a backend runs gets a record when it
//! starts; one that reads or writes tables first waits for admission
//! (`queued`), with the session's memory limit as its reservation and its
//! user's priority. The record follows the statement to its end: for a
//! query, until its result stream ends or is dropped.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use cirro_common::{CirroError, Result, SqlState};
use cirro_exec::resources::Ticket;
use cirro_sql::Statement as CirroStatement;
use datafusion::catalog::TableProvider;
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result as DfResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::{ExecutionPlan, RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;

use crate::system::activity::{QueryHandle, QueryRecord, QueryState, QueryView};
use crate::system::pg_compat::memory_table;
use crate::{Engine, Outcome};

/// The record of the statement a session runs now, for [`RecordPlan`].
pub(crate) type QuerySlot = Arc<Mutex<Option<Arc<QueryRecord>>>>;

/// The last physical optimizer rule: it hands each plan the session builds
/// to the running statement's record (its figures come from the plan's
/// metrics). It changes nothing.
pub(crate) struct RecordPlan(pub(crate) QuerySlot);

impl std::fmt::Debug for RecordPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordPlan")
    }
}

impl PhysicalOptimizerRule for RecordPlan {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(record) = self.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            record.set_plan(Arc::clone(&plan));
        }
        Ok(plan)
    }

    fn name(&self) -> &str {
        "record_plan"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Schemas whose tables are the server's own: statements that read only
/// them (and statements that read no table) skip the admission queue, so
/// that an operator can always look at a full queue.
const SYSTEM_SCHEMAS: &[&str] = &[
    crate::system::SYSTEM_SCHEMA,
    "pg_catalog",
    "information_schema",
];

/// Whether `statement` waits for admission: a statement that runs work
/// (see [`CirroStatement::takes_admission`]) and touches a table outside
/// the system schemas. COPY and maintenance always wait.
pub(crate) fn needs_admission(engine: &Engine, statement: &CirroStatement) -> bool {
    if !statement.takes_admission() {
        return false;
    }
    let Some(sql) = statement.to_datafusion() else {
        return true;
    };
    let tables = engine
        .context()
        .state_ref()
        .read()
        .resolve_table_references(&sql);
    let Ok(tables) = tables else {
        return true;
    };
    tables.iter().any(|t| {
        let system = match t.schema() {
            Some(schema) => SYSTEM_SCHEMAS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(schema)),
            None => t.table().eq_ignore_ascii_case("pg_stat_activity"),
        };
        !system
    })
}

/// The rows a command's tag reports (`UPDATE 3`, `INSERT 0 5`).
fn tag_rows(tag: &str) -> u64 {
    tag.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Engine {
    /// Run `work`, a statement, as the server sees it: in `cirro.queries`,
    /// after admission if `admit` (see [`needs_admission`]).
    pub(crate) async fn tracked<F>(&self, admit: bool, work: F) -> Result<Outcome>
    where
        F: std::future::Future<Output = Result<Outcome>>,
    {
        let memory = self.begin_query();
        let handle = self.backend().map(|b| b.start_query());
        if let Some(handle) = &handle {
            handle.set_memory(memory);
            *self.current_query.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Arc::clone(handle.record()));
        }
        let ticket = if admit {
            let admission = self.node.resources().admission();
            let on_queued = || {
                if let Some(handle) = &handle {
                    handle.queued();
                }
                if let Some(backend) = self.backend() {
                    backend.set_waiting(Some("AdmissionQueue"));
                }
            };
            let ticket = admission
                .admit(self.memory_limit(), self.priority(), on_queued)
                .await;
            if let Some(handle) = &handle {
                handle.running();
            }
            if let Some(backend) = self.backend() {
                backend.set_waiting(None);
            }
            Some(ticket)
        } else {
            None
        };
        // The ticket waits in the session's slot while the statement runs,
        // so that a wait for a lock can give it up (`wait_for`).
        let stored = match ticket {
            Some(ticket) => {
                let mut slot = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    *slot = Some(ticket);
                    None
                } else {
                    Some(ticket)
                }
            }
            None => None,
        };
        let in_slot = admit && stored.is_none();
        let result = work.await;
        let ticket = if in_slot {
            self.admitted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
        } else {
            stored
        };
        let Some(handle) = handle else {
            return result.map(|outcome| hold(outcome, ticket));
        };
        match result {
            Ok(Outcome::Rows(stream)) => Ok(Outcome::Rows(Box::pin(Tracked {
                inner: stream,
                handle: Some(handle),
                _ticket: ticket,
            }))),
            Ok(outcome) => {
                if let Outcome::Command { tag, .. } = &outcome {
                    handle.add_rows(tag_rows(tag));
                }
                handle.end(QueryState::Finished, None);
                Ok(outcome)
            }
            Err(e) => {
                let state = if e.state == SqlState::QUERY_CANCELED {
                    QueryState::Cancelled
                } else {
                    QueryState::Failed
                };
                handle.end(state, Some(e.message.clone()));
                Err(e)
            }
        }
    }

    /// Wait for `wait` (another transaction's lock) without holding the
    /// statement's place in admission: the transaction holding the lock may
    /// need a place for its next statement before it ends, and waiters that
    /// held every place would wait for it forever. Admitted again, in the
    /// queue, once `wait` is done. `event` is the wait pg_stat_activity
    /// shows (PostgreSQL's names: `transactionid` for a row, `relation`).
    pub(crate) async fn wait_for<T>(
        &self,
        event: &'static str,
        wait: impl std::future::Future<Output = T>,
    ) -> T {
        let mut wait = std::pin::pin!(wait);
        if let std::task::Poll::Ready(done) = futures::poll!(wait.as_mut()) {
            return done;
        }
        let given_up = self
            .admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        let backend = self.backend();
        if let Some(backend) = backend {
            backend.set_waiting(Some(event));
        }
        let done = wait.await;
        if given_up {
            let on_queued = || {
                if let Some(backend) = backend {
                    backend.set_waiting(Some("AdmissionQueue"));
                }
            };
            let ticket = self
                .node
                .resources()
                .admission()
                .admit(self.memory_limit(), self.priority(), on_queued)
                .await;
            *self.admitted.lock().unwrap_or_else(|e| e.into_inner()) = Some(ticket);
        }
        if let Some(backend) = backend {
            backend.set_waiting(None);
        }
        done
    }

    /// The session's priority in the admission queue (`priority`).
    fn priority(&self) -> i32 {
        self.settings.get("priority").parse().unwrap_or(0)
    }
}

/// A query's rows with its admission ticket held until they end.
fn hold(outcome: Outcome, ticket: Option<Ticket>) -> Outcome {
    match (outcome, ticket) {
        (Outcome::Rows(stream), Some(ticket)) => Outcome::Rows(Box::pin(Tracked {
            inner: stream,
            handle: None,
            _ticket: Some(ticket),
        })),
        (outcome, _) => outcome,
    }
}

/// A query's result stream that counts its rows into its record, ends the
/// record with the stream, and holds its admission ticket until dropped.
struct Tracked {
    inner: SendableRecordBatchStream,
    handle: Option<QueryHandle>,
    _ticket: Option<Ticket>,
}

impl Stream for Tracked {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.as_mut().poll_next(cx);
        if let Some(handle) = &self.handle {
            match &polled {
                Poll::Ready(Some(Ok(batch))) => handle.add_rows(batch.num_rows() as u64),
                Poll::Ready(Some(Err(e))) => handle.end(QueryState::Failed, Some(e.to_string())),
                Poll::Ready(None) => handle.end(QueryState::Finished, None),
                Poll::Pending => {}
            }
        }
        polled
    }
}

impl RecordBatchStream for Tracked {
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        self.inner.schema()
    }
}

/// `CANCEL QUERY id`: cancel a queued or running statement of any node;
/// 42501 unless a superuser or the statement's own user, 42704 when there
/// is no such statement.
pub(crate) async fn cancel_query(engine: &Engine, id: i64) -> Result<Outcome> {
    let Some(backend) = engine.backend() else {
        return Err(CirroError::unsupported(
            "CANCEL QUERY needs a server session (cirro serve): this session runs alone",
        ));
    };
    let superuser = engine.superuser_check();
    let cancelled = backend
        .activity()
        .cancel_cluster_query(id, superuser.user(), superuser.holds())
        .await?;
    if !cancelled {
        return Err(CirroError::new(
            SqlState::UNDEFINED_OBJECT,
            format!("query {id} is not queued or running (see cirro.queries)"),
        ));
    }
    Ok(Outcome::command("CANCEL QUERY"))
}

/// `cirro.queries` over `views`.
pub(crate) fn queries_table(views: &[QueryView]) -> DfResult<Arc<dyn TableProvider>> {
    let time = |f: &dyn Fn(&QueryView) -> Option<i64>| {
        let values: Vec<Option<i64>> = views.iter().map(f).collect();
        Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC")) as ArrayRef
    };
    let int64 = |f: &dyn Fn(&QueryView) -> i64| {
        Arc::new(Int64Array::from_iter_values(views.iter().map(f))) as ArrayRef
    };
    let text = |f: &dyn Fn(&QueryView) -> Option<String>| {
        Arc::new(StringArray::from(views.iter().map(f).collect::<Vec<_>>())) as ArrayRef
    };
    memory_table(vec![
        ("query_id", int64(&|v| v.id)),
        (
            "pid",
            Arc::new(Int32Array::from_iter_values(views.iter().map(|v| v.pid))),
        ),
        ("node", int64(&|v| v.node as i64)),
        ("usename", text(&|v| Some(v.user.clone()))),
        ("state", text(&|v| Some(v.state.as_str().to_string()))),
        ("query", text(&|v| Some(v.query.clone()))),
        ("submitted", time(&|v| Some(v.submitted))),
        ("started", time(&|v| v.started)),
        ("ended", time(&|v| v.ended)),
        (
            "elapsed_ms",
            Arc::new(Float64Array::from_iter_values(
                views.iter().map(|v| v.elapsed_micros() as f64 / 1000.0),
            )),
        ),
        ("memory", int64(&|v| v.memory as i64)),
        ("peak_memory", int64(&|v| v.peak_memory as i64)),
        ("spilled_bytes", int64(&|v| v.spilled_bytes as i64)),
        ("rows", int64(&|v| v.rows as i64)),
        ("retries", int64(&|v| v.retries as i64)),
        (
            "progress",
            Arc::new(Float64Array::from(
                views.iter().map(|v| v.progress).collect::<Vec<_>>(),
            )),
        ),
        ("error", text(&|v| v.error.clone())),
        ("plan", text(&|v| v.plan.clone())),
        ("gpu", text(&|v| v.gpu.clone())),
    ])
}
