//! Running a DML plan: committed at once (under the table's write lock
//! when constraints are checked), or taken into the open transaction, whose
//! COMMIT writes it. The rows a statement changes are worked out by
//! `dml.rs`.

use std::sync::Arc;

use cirro_common::{CirroError, Result, SqlState};
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};

use crate::Engine;
use crate::statement::{Outcome, constraints, dml, point, time_travel};

/// Run a DML plan: plain INSERTs commit in their sink; row changes,
/// INSERTs into tables with constraints and anything inside a transaction
/// go through [`execute_dml`].
pub(crate) async fn execute(engine: &Engine, dml: DmlStatement) -> Result<Outcome> {
    let (db, schema, name) = engine.resolve(&dml.table_name);
    if engine.snapshot().view(&db, &schema, &name).is_some() {
        return Err(CirroError::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("cannot change view \"{name}\": views are read-only"),
        ));
    }
    let tag = match dml.op {
        WriteOp::Insert(_) => "INSERT 0",
        WriteOp::Delete => "DELETE",
        WriteOp::Update => "UPDATE",
        WriteOp::MergeInto(_) => "MERGE",
        WriteOp::Truncate => "TRUNCATE TABLE",
        _ => "DML",
    };
    let in_txn = engine.in_transaction();
    // Small writes go to the row store (see point.rs).
    let mut dml = dml;
    let mut _alone = None;
    if engine.catalog.row_service().is_some()
        && let Ok(location) = time_travel::location_of(engine, &db, &schema, &name)
    {
        if let Some(outcome) = point::try_run(engine, &dml, tag, &location).await? {
            return Ok(outcome);
        }
        // Through the files: the table's row store is written into them
        // first, and no small write lands until this statement is done.
        let appends = if engine.session.rows.has_pending() {
            point::take_pending_appends(engine, &name)?
        } else {
            Vec::new()
        };
        if !appends_without_key(&dml, tag)
            && let Alone::Taken(held) = hold_alone(engine, &location, &name).await?
        {
            dml = retarget(engine, dml, &location).await?;
            _alone = held;
        }
        if in_txn {
            point::stage_appends(engine, appends).await?;
            dml = to_view(engine, dml, &location)?;
        }
    }
    // Plain INSERTs commit in their sink, unless the table has
    // constraints to check before the commit.
    let constrained = matches!(dml.op, WriteOp::Insert(_))
        && dml::target_table(&dml, tag)
            .map(|t| t.options().has_checks())
            .unwrap_or(false);
    if in_txn || constrained || dml::row_change_tag(&dml.op).is_some() {
        let input = Arc::clone(&dml.input);
        let mut retries = 0;
        loop {
            let names = (db.clone(), schema.clone(), name.clone());
            let error = match execute_dml(engine, &dml, tag, names, in_txn).await {
                Ok(outcome) => return Ok(outcome),
                Err(e) => e,
            };
            // READ COMMITTED outside a transaction: a change that lost a
            // row to a concurrent one (40001, nothing committed) runs again
            // over the table as that one left it, as PostgreSQL re-applies
            // an UPDATE or DELETE to the row's committed version.
            let again = !in_txn
                && error.state == SqlState::SERIALIZATION_FAILURE
                && dml::row_change_tag(&dml.op).is_some()
                && retries < RC_RETRIES
                && crate::session::txn::reads_committed(engine.transaction_isolation());
            if !again {
                return Err(name_not_null_column(error, &input, &name));
            }
            let Some(latest) = at_latest(engine, &dml, &db, &schema, &name).await? else {
                return Err(error);
            };
            retries += 1;
            dml = latest;
        }
    }
    let input = Arc::clone(&dml.input);
    let count = engine
        .run_for_count(LogicalPlan::Dml(dml))
        .await
        .map_err(|e| name_not_null_column(e, &input, &name))?;
    Ok(Outcome::command(if tag == "TRUNCATE TABLE" {
        tag.to_string()
    } else {
        format!("{tag} {count}")
    }))
}

/// How many times a READ COMMITTED change through the files runs again
/// after losing rows to concurrent changes (see [`execute`]).
const RC_RETRIES: usize = 20;

/// `dml` over the newest version of its target table, None if the table's
/// columns changed since the statement was planned (it cannot run again).
async fn at_latest(
    engine: &Engine,
    dml: &DmlStatement,
    db: &str,
    schema: &str,
    name: &str,
) -> Result<Option<DmlStatement>> {
    let Ok(current) = dml::target_table(dml, "DML") else {
        return Ok(None);
    };
    let location = time_travel::location_of(engine, db, schema, name)?;
    let latest = engine.catalog.open_table(&location).await?;
    use datafusion::datasource::TableProvider;
    if latest.schema() != current.schema() {
        return Ok(None);
    }
    over_table(dml, latest.with_rows(current.rows().cloned())).map(Some)
}

/// How long a statement through a table's files waits for the open
/// transactions with small writes to the table.
const GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `dml` appends rows to a table without a key (no primary key,
/// unique constraint or unique index): they conflict with no small write,
/// and the store's appends with none of them, so it need not hold the
/// table alone for its whole run (a COPY from a slow client would hold off
/// every writer of the table).
fn appends_without_key(dml: &DmlStatement, tag: &str) -> bool {
    matches!(
        dml.op,
        WriteOp::Insert(datafusion::logical_expr::dml::InsertOp::Append)
    ) && dml::target_table(dml, tag).is_ok_and(|table| table.options().unique_keys().is_empty())
}

/// What [`hold_alone`] did.
pub(crate) enum Alone {
    /// The transaction held the table's gate already: nothing done.
    Already,
    /// Taken, and the table's row store written into its files. In a
    /// transaction the transaction holds the gate until it ends; outside
    /// one the guard does, for the caller to keep until its change is
    /// committed.
    Taken(Option<tokio::sync::OwnedRwLockWriteGuard<()>>),
}

/// Take the gate of table `name` at `location` alone (waiting, at most
/// [`GATE_WAIT`], for the open transactions with small writes to it) and
/// write its row store into its files: a change through the files (a
/// write, ALTER TABLE) then sees every small write, and none lands until it
/// is committed. Where the process keeps no row stores: `Already`.
pub(crate) async fn hold_alone(engine: &Engine, location: &str, name: &str) -> Result<Alone> {
    let Some(service) = engine.catalog.row_service() else {
        return Ok(Alone::Already);
    };
    let in_txn = engine.in_transaction();
    let already = in_txn
        && engine
            .peek_transaction(|t| t.points.alone.iter().any(|(l, _)| l == location))
            .unwrap_or(false);
    if already {
        return Ok(Alone::Already);
    }
    let gate = service.gate(location);
    let held = engine
        .wait_for(
            "relation",
            tokio::time::timeout(GATE_WAIT, gate.write_owned()),
        )
        .await
        .map_err(|_| {
            CirroError::new(
                SqlState::LOCK_NOT_AVAILABLE,
                format!(
                    "could not lock table \"{name}\": open transactions with small \
                     writes to it did not end within {} s",
                    GATE_WAIT.as_secs()
                ),
            )
        })?;
    let state = engine.context().state();
    service
        .flush_table_alone(&engine.catalog, location, &state)
        .await?;
    if !in_txn {
        return Ok(Alone::Taken(Some(held)));
    }
    if let Some(mut txn) = engine.hold_transaction() {
        if let Some(t) = txn.txn.as_mut() {
            t.points.alone.push((location.to_string(), held));
        }
        txn.put_back();
    }
    Ok(Alone::Taken(None))
}

/// `dml` over the table's newest version (its row store just written into
/// it). In a READ COMMITTED transaction that has not changed the table
/// through its files yet, the transaction reads that version from now on:
/// the statement may have waited for another transaction's change of the
/// table, and applies to what that one committed, as PostgreSQL re-applies
/// it (before, it applied to the version it was planned over and failed at
/// COMMIT). Under REPEATABLE READ, 40001 if the version the transaction
/// reads still needs rows the store held (it read the table before they
/// were written into the files).
async fn retarget(engine: &Engine, dml: DmlStatement, location: &str) -> Result<DmlStatement> {
    let Ok(current) = dml::target_table(&dml, "DML") else {
        return Ok(dml);
    };
    let latest = engine.catalog.open_table(location).await?;
    if latest.table_schema() != current.table_schema() {
        // An ALTER TABLE this statement waited for changed the columns it
        // was planned over.
        return Err(point::columns_changed());
    }
    if engine.in_transaction() {
        let staged = engine
            .peek_transaction(|t| t.written.iter().any(|w| w.location == location))
            .unwrap_or(true);
        if engine.session.read_committed() && !staged {
            engine.session.set(location, latest.clone());
        } else {
            point::repin_after_flush(engine, location).await?;
        }
    } else if let Some(reader) = current.rows()
        && reader.view(current.version())?.is_empty()
    {
        return Ok(dml);
    }
    over_table(&dml, latest.with_rows(current.rows().cloned()))
}

/// `dml` with `table` as its target and the scan of it (TRUNCATE and
/// INSERT … VALUES scan none).
fn over_table(dml: &DmlStatement, table: cirro_storage::CirroTable) -> Result<DmlStatement> {
    let source = datafusion::datasource::provider_as_source(Arc::new(table));
    let input = dml::replace_target_scan(&dml.input, &dml.table_name, &source)
        .or_else(|_| Ok::<_, CirroError>(dml.input.as_ref().clone()))?;
    Ok(DmlStatement {
        target: source,
        input: Arc::new(input),
        ..dml.clone()
    })
}

/// `dml` over the transaction's view of the table at `location` (what it
/// staged of it), if it has one.
fn to_view(engine: &Engine, dml: DmlStatement, location: &str) -> Result<DmlStatement> {
    let Some(view) = engine.session.get(location) else {
        return Ok(dml);
    };
    let reader = dml::target_table(&dml, "DML")
        .ok()
        .and_then(|t| t.rows().cloned());
    let source = datafusion::datasource::provider_as_source(Arc::new(view.with_rows(reader)));
    let input = dml::replace_target_scan(&dml.input, &dml.table_name, &source)
        .unwrap_or_else(|_| dml.input.as_ref().clone());
    Ok(DmlStatement {
        target: source,
        input: Arc::new(input),
        ..dml
    })
}

/// Run a row-changing statement: commit it at once, or inside an open
/// transaction take it into the transaction.
async fn execute_dml(
    engine: &Engine,
    dml: &DmlStatement,
    tag: &str,
    (db, schema, name): (String, String, String),
    in_txn: bool,
) -> Result<Outcome> {
    let prepared = dml::prepare(engine, dml, tag).await?;
    let outcome = Outcome::command(dml::tag_of(tag, prepared.count));
    let location = match time_travel::location_of(engine, &db, &schema, &name) {
        Ok(location) => location,
        Err(e) => {
            prepared.change.discard().await;
            return Err(e);
        }
    };
    let checked =
        prepared.change.table().options().has_checks() && !prepared.change.new_files().is_empty();
    // A table the transaction created is its own until COMMIT names it:
    // its changes commit there at once (see txn.rs).
    let private = in_txn && engine.created_in_transaction(&location);
    if private {
        if !prepared.change.is_empty() {
            if checked {
                let post = prepared.change.apply()?;
                if let Err(e) =
                    constraints::check(engine, &name, &post, prepared.change.new_files()).await
                {
                    prepared.change.discard().await;
                    return Err(e);
                }
            }
            let committed = prepared.change.commit(prepared.operation).await?;
            engine.node.cache().forget_files(&committed.replaced);
        }
        let table = engine.catalog.open_table(&location).await?;
        engine.session.set(&location, table);
        return Ok(outcome);
    }
    if !in_txn {
        if prepared.change.is_empty() {
            return Ok(outcome);
        }
        if !checked {
            let committed = prepared.change.commit(prepared.operation).await?;
            engine.node.cache().forget_files(&committed.replaced);
            return Ok(outcome);
        }
        // Check and commit under the table's write lock (see constraints.rs).
        let locked_and_checked = async {
            let held = engine.catalog.lock_table_writes(&location).await?;
            let latest = engine.catalog.open_table(&location).await?;
            let post = prepared.change.apply_to(&latest)?;
            constraints::check(engine, &name, &post, prepared.change.new_files()).await?;
            Ok(held)
        }
        .await;
        let _held = match locked_and_checked {
            Ok(held) => held,
            Err(e) => {
                prepared.change.discard().await;
                return Err(e);
            }
        };
        let committed = prepared.change.commit(prepared.operation).await?;
        engine.node.cache().forget_files(&committed.replaced);
        return Ok(outcome);
    }
    if checked {
        // In a transaction: against its view; COMMIT checks again.
        let verdict = async {
            let view = prepared.change.apply()?;
            constraints::check(engine, &name, &view, prepared.change.new_files()).await
        }
        .await;
        if let Err(e) = verdict {
            prepared.change.discard().await;
            return Err(e);
        }
    }
    let changes_rows = !matches!(
        prepared.operation,
        deltalake::protocol::DeltaOperation::Write {
            mode: deltalake::protocol::SaveMode::Append,
            ..
        }
    );
    // The transaction is put back even if this future is dropped
    // part-way (a cancelled statement): then it is marked failed.
    let Some(mut held) = engine.hold_transaction() else {
        prepared.change.discard().await;
        return Err(CirroError::internal(
            "the transaction ended during a statement",
        ));
    };
    let staged = match held.txn.as_mut() {
        Some(txn) => {
            txn.stage(
                &location,
                &name,
                prepared.change,
                changes_rows,
                !engine.catalog.in_cluster(),
            )
            .await
        }
        None => Err(CirroError::internal(
            "the transaction ended during a statement",
        )),
    };
    let view = staged?;
    held.put_back();
    engine.session.stage(&location, view);
    Ok(outcome)
}

/// DataFusion reports a NULL in a NOT NULL column by its internal column name
/// or position (`Column 'column2' …`, `Invalid batch column at '0' …`); say
/// which column of the table it is, as PostgreSQL does.
fn name_not_null_column(err: CirroError, input: &LogicalPlan, table: &str) -> CirroError {
    if err.state != SqlState::NOT_NULL_VIOLATION {
        return err;
    }
    let quoted = |text: &str, after: &str| -> Option<String> {
        let start = text.find(after)? + after.len();
        let end = text[start..].find('\'')? + start;
        Some(text[start..end].to_string())
    };
    let schema = input.schema();
    let column = if let Some(index) =
        quoted(&err.message, "column at '").and_then(|i| i.parse::<usize>().ok())
    {
        (index < schema.fields().len()).then(|| schema.field(index).name().clone())
    } else if let Some(source) = quoted(&err.message, "Column '") {
        // The insert's projection maps the source column onto a table column.
        match input {
            LogicalPlan::Projection(projection) => projection
                .expr
                .iter()
                .zip(schema.fields())
                .find(|(expr, _)| expr.column_refs().iter().any(|c| c.name == source))
                .map(|(_, field)| field.name().clone())
                .or(Some(source)),
            _ => Some(source),
        }
    } else {
        None
    };
    match column {
        Some(column) => CirroError::new(
            SqlState::NOT_NULL_VIOLATION,
            format!(
                "null value in column \"{column}\" of relation \"{table}\" violates not-null constraint"
            ),
        ),
        None => err,
    }
}
