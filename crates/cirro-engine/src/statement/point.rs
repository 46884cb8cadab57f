//! Small writes through the row store (see `cirro_catalog::rows`): an
//! INSERT of VALUES, and an UPDATE or DELETE whose WHERE fixes every
//! primary-key column to a constant, on a table whose only constraint is its
//! primary key. Everything else takes the path through the table's files
//! (`write.rs`), which first writes the table's row store into the files.
//!
//! A small write takes the table's gate shared (a change through the files
//! takes it alone) and the lock of each key it writes, then runs its plan —
//! DataFusion's, over the table merged with its row store, read at a
//! snapshot taken after the locks — for the new rows. Outside a transaction
//! it then logs and applies them at once; in one they wait in the session's
//! pending changes, which its own statements see, until COMMIT logs every
//! table's changes as one record. The locks and the gate are held until then.
//!
//! Under READ COMMITTED (the default) every statement reads at a snapshot
//! taken after its locks: a write that waited for another transaction's
//! lock on a row applies to the row that transaction committed, as
//! PostgreSQL re-applies it. Under REPEATABLE READ the transaction keeps
//! its snapshot, and writing a key another transaction changed after it
//! fails with 40001, as in PostgreSQL.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::CirroTable;
use cirro_storage::rowstore::{Key, RowLock, RowStore, TableChange};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{DmlStatement, Expr, LogicalPlan, WriteOp};

use crate::Engine;
use crate::statement::{Outcome, by_key, dml, time_travel};

/// What a transaction holds for its small writes until it ends.
#[derive(Default)]
pub(crate) struct PointHold {
    /// The lock owner (0: none taken yet).
    pub owner: u64,
    pub locks: Vec<RowLock>,
    pub gates: Vec<(String, tokio::sync::OwnedRwLockReadGuard<()>)>,
    /// Tables whose gate a statement of the transaction through their
    /// files took alone: held until the transaction ends, so that no small
    /// write slips in before its COMMIT.
    pub alone: Vec<(String, tokio::sync::OwnedRwLockWriteGuard<()>)>,
}

impl PointHold {
    fn holds_gate(&self, location: &str) -> bool {
        self.gates.iter().any(|(l, _)| l == location)
    }
}

/// The message of [`columns_changed`].
const COLUMNS_CHANGED: &str =
    "could not serialize access: the table's columns changed while this statement waited for it";

/// 40001 for a write planned over a table's columns that a change it waited
/// for (ALTER TABLE) replaced. Nothing was written; the statement is
/// planned once more over the new columns ([`plan_again`]), as PostgreSQL
/// does.
pub(crate) fn columns_changed() -> CirroError {
    CirroError::new(SqlState::SERIALIZATION_FAILURE, COLUMNS_CHANGED)
}

/// Whether a statement that failed with `error` is to be planned again:
/// [`columns_changed`]'s, outside a transaction or in a READ COMMITTED one,
/// whose statement then reads the commits finished by now (the ALTER's
/// among them). A REPEATABLE READ transaction keeps its snapshot, which
/// does not hold the new columns: the 40001 stands there.
pub(crate) fn plan_again(engine: &Engine, error: &CirroError) -> bool {
    if error.state != SqlState::SERIALIZATION_FAILURE || error.message != COLUMNS_CHANGED {
        return false;
    }
    if engine.in_transaction() && !engine.session.read_committed() {
        return false;
    }
    engine.session.start_statement(&engine.catalog);
    true
}

/// What a small write does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Insert,
    Update,
    Delete,
}

impl Kind {
    /// The command tag before its count.
    fn tag(self) -> &'static str {
        match self {
            Kind::Insert => "INSERT 0",
            Kind::Update => "UPDATE",
            Kind::Delete => "DELETE",
        }
    }
}

/// Where a small write's rows come from.
enum Source<'a> {
    /// The statement's plan, run over the table at the statement's
    /// snapshot.
    Plan(&'a DmlStatement),
    /// A prepared statement compiled once, with its values bound and the
    /// key they fix (`by_key::Compiled`).
    Compiled {
        compiled: &'a by_key::Compiled,
        params: &'a RecordBatch,
        key: Vec<(usize, ScalarValue)>,
    },
}

/// What small write `dml` is by its shape (see the module docs): an INSERT
/// that reads no table, or an UPDATE or DELETE of the target filtered
/// right above its scan, an UPDATE that leaves the key as it is; None
/// where it takes the path through the files. Whether the filter fixes
/// the key is the caller's to check.
pub(crate) fn kind_of(dml: &DmlStatement, store: &RowStore) -> Option<Kind> {
    match &dml.op {
        WriteOp::Insert(InsertOp::Append) if !scans_a_table(&dml.input) => Some(Kind::Insert),
        WriteOp::Update | WriteOp::Delete => {
            store.key_columns()?;
            target_filter(dml)?;
            if matches!(dml.op, WriteOp::Delete) {
                Some(Kind::Delete)
            } else {
                keeps_keys(&dml.input, store).then_some(Kind::Update)
            }
        }
        _ => None,
    }
}

/// Run `dml` as a small write if it is one (see the module docs): None
/// where it takes the path through the files.
pub(crate) async fn try_run(
    engine: &Engine,
    dml: &DmlStatement,
    tag: &str,
    location: &str,
) -> Result<Option<Outcome>> {
    if engine.catalog.row_service().is_none() {
        return Ok(None);
    }
    let Ok(table) = dml::target_table(dml, tag) else {
        return Ok(None);
    };
    let Some(reader) = table.rows() else {
        return Ok(None);
    };
    if !only_primary_key(&table) {
        return Ok(None);
    }
    let Some(kind) = kind_of(dml, &reader.store) else {
        return Ok(None);
    };
    if kind != Kind::Insert && key_values(dml, &reader.store)?.is_none() {
        return Ok(None);
    }
    apply(engine, Source::Plan(dml), kind, &table, location).await
}

/// Run a compiled prepared write (`by_key::Compiled`) with `params`
/// bound: None, having done nothing, where it takes the general path (the
/// table changed, the values fix no key).
pub(crate) async fn run_compiled(
    engine: &Engine,
    compiled: &by_key::Compiled,
    kind: Kind,
    params: &RecordBatch,
) -> Result<Option<Outcome>> {
    if engine.catalog.row_service().is_none() {
        return Ok(None);
    }
    let (db, schema, name) = engine.resolve(compiled.table());
    let Ok(location) = time_travel::location_of(engine, &db, &schema, &name) else {
        return Ok(None);
    };
    let provider = engine
        .context()
        .table_provider(datafusion::common::TableReference::full(db, schema, name))
        .await?;
    let Some(table) = by_key::with_rows(&provider) else {
        return Ok(None);
    };
    if !compiled.fits(table) || !only_primary_key(table) {
        return Ok(None);
    }
    let Some(reader) = table.rows() else {
        return Ok(None);
    };
    let Some(key) = compiled.key(&reader.store, params)? else {
        return Ok(None);
    };
    let source = Source::Compiled {
        compiled,
        params,
        key,
    };
    apply(engine, source, kind, &table.without_row_ids(), &location).await
}

/// Run a small write from `source` on `table` (at `location`): at once
/// outside a transaction, else into its pending changes. None where a
/// transaction that changed tables through their files must go on doing
/// so.
async fn apply(
    engine: &Engine,
    source: Source<'_>,
    kind: Kind,
    table: &CirroTable,
    location: &str,
) -> Result<Option<Outcome>> {
    let service = engine
        .catalog
        .row_service()
        .ok_or_else(|| CirroError::internal("no row stores"))?;
    let in_txn = engine.in_transaction();
    // A transaction that changed tables through their files keeps doing so
    // (its COMMIT is one Delta commit per table).
    let mut hold = if in_txn {
        let Some(mut held) = engine.hold_transaction() else {
            return Ok(None);
        };
        let Some(txn) = held.txn.as_mut() else {
            return Ok(None);
        };
        if !txn.written.is_empty() || txn.ddl.is_some() || !txn.points.alone.is_empty() {
            held.put_back();
            return Ok(None);
        }
        let hold = std::mem::take(&mut txn.points);
        held.put_back();
        hold
    } else {
        PointHold::default()
    };
    let outcome = run(engine, &source, kind, table, location, &mut hold, in_txn).await;
    if in_txn {
        // Put what the transaction holds back, whatever the statement did
        // (a failed statement fails the transaction, whose end releases it).
        if let Some(mut held) = engine.hold_transaction() {
            if let Some(txn) = held.txn.as_mut() {
                let mut mine = std::mem::take(&mut txn.points);
                mine.owner = hold.owner.max(mine.owner);
                mine.locks.append(&mut hold.locks);
                mine.gates.append(&mut hold.gates);
                mine.alone.append(&mut hold.alone);
                txn.points = mine;
            }
            held.put_back();
        }
    } else if let Ok(Some((changes, _))) = &outcome {
        service
            .commit(changes.clone(), engine.synchronous_commit())
            .await?;
    }
    outcome.map(|o| o.map(|(_, outcome)| outcome))
}

type Ran = Option<(Vec<(String, TableChange)>, Outcome)>;

#[allow(clippy::too_many_arguments)]
async fn run(
    engine: &Engine,
    source: &Source<'_>,
    kind: Kind,
    table: &CirroTable,
    location: &str,
    hold: &mut PointHold,
    in_txn: bool,
) -> Result<Ran> {
    let service = engine
        .catalog
        .row_service()
        .ok_or_else(|| CirroError::internal("no row stores"))?;
    let reader = table
        .rows()
        .ok_or_else(|| CirroError::internal("no row store for the table"))?;
    let store = Arc::clone(&reader.store);
    if hold.owner == 0 {
        hold.owner = service.owner();
    }
    if !hold.holds_gate(location) {
        let gate = service.gate(location);
        let gate = match Arc::clone(&gate).try_read_owned() {
            Ok(gate) => gate,
            Err(_) => {
                let gate = engine.wait_for("relation", gate.read_owned()).await;
                // What held the gate alone may have changed the table's
                // columns (ALTER TABLE); this statement was planned over
                // the old ones.
                let now = engine.catalog.open_table(location).await?;
                if now.table_schema() != table.table_schema() {
                    return Err(columns_changed());
                }
                gate
            }
        };
        hold.gates.push((location.to_string(), gate));
    }
    let snapshot = engine.session.rows.snapshot();
    // A transaction that keeps its snapshot (REPEATABLE READ).
    let repeatable = in_txn && !engine.session.read_committed();
    // The keys the statement writes, locked before anything is read.
    let keys: Vec<Key> = match kind {
        Kind::Insert => Vec::new(),
        Kind::Update | Kind::Delete => {
            let values = match source {
                Source::Plan(dml) => key_values(dml, &store)?
                    .ok_or_else(|| CirroError::internal("a small write without its key"))?,
                Source::Compiled { key, .. } => key
                    .iter()
                    .map(|(_, v)| v.to_array())
                    .collect::<datafusion::common::Result<Vec<_>>>()?,
            };
            store.encode_keys(&values)?
        }
    };
    for key in &keys {
        lock(engine, hold, &store, location, key, snapshot, repeatable).await?;
    }
    // Outside a transaction, and under READ COMMITTED, the statement reads
    // what is committed now that it holds its keys.
    if !repeatable {
        engine.session.rows.take_snapshot(service.snapshots());
    }
    let latest = engine.catalog.open_table(location).await?;
    let fresh = latest.clone().with_rows(Some(reader.clone()));
    let (rows, name) = match source {
        Source::Plan(dml) => {
            let plan = match kind {
                Kind::Insert => dml.input.as_ref().clone(),
                Kind::Update | Kind::Delete => dml::replace_target_scan(
                    &dml.input,
                    &dml.table_name,
                    &provider_as_source(Arc::new(fresh)),
                )?,
            };
            (
                evaluate(engine, plan, store.schema()).await?,
                &dml.table_name,
            )
        }
        Source::Compiled {
            compiled,
            params,
            key,
        } => {
            let rows = compiled.rows(engine, &fresh, key, params).await?;
            (table_rows(&[rows], store.schema())?, compiled.table())
        }
    };
    let name = name.table();
    let count = rows.num_rows() as u64;
    let mut pending = engine.session.rows.pending(location).unwrap_or_default();
    match kind {
        Kind::Insert => {
            check_not_null(&rows, store.schema(), name)?;
            let rows = conformed(&rows, table, &store)?;
            if store.key_columns().is_some() {
                let keys = store.keys_of_rows(&rows)?;
                let mut seen = std::collections::HashSet::new();
                let mut unknown: Vec<usize> = Vec::new();
                for (i, key) in keys.iter().enumerate() {
                    lock(engine, hold, &store, location, key, snapshot, repeatable).await?;
                    let taken = !seen.insert(key.clone())
                        || match pending.keyed.get(key) {
                            Some(row) => row.is_some(),
                            None => match store.latest(key) {
                                Some((_, row)) => row.is_some(),
                                None => {
                                    unknown.push(i);
                                    false
                                }
                            },
                        };
                    if taken {
                        return Err(duplicate(table, &rows, i));
                    }
                }
                if let Some(i) = in_files(engine, &latest, &store, &rows, &unknown).await? {
                    return Err(duplicate(table, &rows, i));
                }
                for (i, key) in keys.into_iter().enumerate() {
                    pending.keyed.insert(key, Some(rows.slice(i, 1)));
                }
            } else {
                pending.appends.push(rows.clone());
            }
        }
        Kind::Update => {
            check_not_null(&rows, store.schema(), name)?;
            let rows = conformed(&rows, table, &store)?;
            let keys = store.keys_of_rows(&rows)?;
            for (i, key) in keys.into_iter().enumerate() {
                pending.keyed.insert(key, Some(rows.slice(i, 1)));
            }
        }
        Kind::Delete => {
            for key in store.keys_of_rows(&rows)? {
                pending.keyed.insert(key, None);
            }
        }
    }
    let outcome = Outcome::command(dml::tag_of(kind.tag(), count));
    if in_txn {
        engine
            .session
            .rows
            .update_pending(location, |p| *p = pending)?;
        return Ok(Some((Vec::new(), outcome)));
    }
    let change = pending.change(&store)?;
    Ok(Some((vec![(location.to_string(), change)], outcome)))
}

/// Before a statement through the files in a transaction that made small
/// writes: take its pending appends (tables without a key) out, to be
/// staged as data files once the tables' stores are written into their
/// files ([`stage_appends`]), and let go of those tables' gates. 0A000 if it
/// changed rows by key (those cannot be moved to the files yet).
pub(crate) fn take_pending_appends(
    engine: &Engine,
    name: &str,
) -> Result<Vec<(String, Vec<RecordBatch>)>> {
    let pending = engine.session.rows.all_pending();
    if pending.values().any(|p| !p.keyed.is_empty()) {
        return Err(CirroError::unsupported(format!(
            "this transaction changed rows by key through the row store, so it cannot also \
             change \"{name}\" through its files (a statement over many rows, TRUNCATE, \
             MERGE): COMMIT first"
        )));
    }
    let mut taken: Vec<(String, Vec<RecordBatch>)> = pending
        .into_iter()
        .filter(|(_, p)| !p.appends.is_empty())
        .map(|(l, p)| (l, p.appends))
        .collect();
    taken.sort_by(|a, b| a.0.cmp(&b.0));
    engine.session.rows.set_pending(Default::default());
    if let Some(held) = engine.hold_transaction() {
        let mut held = held;
        if let Some(txn) = held.txn.as_mut() {
            txn.points
                .gates
                .retain(|(l, _)| !taken.iter().any(|(t, _)| t == l));
        }
        held.put_back();
    }
    Ok(taken)
}

/// After the row store of the table at `location` was written into its
/// files: a transaction that read the table before reads the flushed
/// version from now on, which holds the same rows if only flushes came
/// between and they wrote nothing after its snapshot; else 40001 (it read
/// rows the store held, which a statement through the files cannot
/// change).
pub(crate) async fn repin_after_flush(engine: &Engine, location: &str) -> Result<()> {
    let Some(pinned) = engine.session.get(location) else {
        return Ok(());
    };
    let Some(service) = engine.catalog.row_service() else {
        return Ok(());
    };
    let Some(store) = service.stores().get(location) else {
        return Ok(());
    };
    let latest = engine.catalog.open_table(location).await?;
    if latest.version() == pinned.version() {
        return Ok(());
    }
    let snapshot = engine.session.rows.snapshot().unwrap_or(0);
    let view = store.view(snapshot, store.flushed_at(pinned.version()))?;
    if view.is_empty() {
        return Ok(());
    }
    let staged = engine
        .peek_transaction(|t| t.written.iter().any(|w| w.location == location))
        .unwrap_or(false);
    let same = !staged
        && store.only_flushes_between(pinned.version(), latest.version())
        && !store.changed_between(snapshot, store.flushed_at(latest.version()));
    if !same {
        return Err(CirroError::new(
            SqlState::SERIALIZATION_FAILURE,
            "could not serialize access: the table's recent small writes were written into \
             its files after this transaction first read it; retry the transaction",
        ));
    }
    engine.session.set(location, latest);
    Ok(())
}

/// Stage appends taken by [`take_pending_appends`] as data files in the
/// transaction, as an INSERT through the files would have written them.
pub(crate) async fn stage_appends(
    engine: &Engine,
    appends: Vec<(String, Vec<RecordBatch>)>,
) -> Result<()> {
    for (location, batches) in appends {
        let table = match engine.session.get(&location) {
            Some(pinned) => pinned,
            None => engine.catalog.open_table(&location).await?,
        };
        let stored: Vec<Result<RecordBatch>> = batches
            .iter()
            .map(|b| cirro_storage::write::conform(b, table.stored_schema()))
            .collect();
        let (adds, _) =
            cirro_storage::write::write_files(&table, futures::stream::iter(stored)).await?;
        let change = cirro_storage::mutate::Change::append(&table, adds, false);
        let Some(mut held) = engine.hold_transaction() else {
            change.discard().await;
            return Err(CirroError::internal(
                "the transaction ended during a statement",
            ));
        };
        let Some(txn) = held.txn.as_mut() else {
            change.discard().await;
            return Err(CirroError::internal(
                "the transaction ended during a statement",
            ));
        };
        let view = txn
            .stage(
                &location,
                &location,
                change,
                false,
                !engine.catalog.in_cluster(),
            )
            .await?;
        held.put_back();
        engine.session.stage(&location, view);
    }
    Ok(())
}

/// Take the lock of `key` for the statement's owner; in a `repeatable`
/// (REPEATABLE READ) transaction, 40001 if another transaction changed the
/// key after the transaction's snapshot.
async fn lock(
    engine: &Engine,
    hold: &mut PointHold,
    store: &RowStore,
    location: &str,
    key: &[u8],
    snapshot: Option<u64>,
    repeatable: bool,
) -> Result<()> {
    let service = engine
        .catalog
        .row_service()
        .ok_or_else(|| CirroError::internal("no row stores"))?;
    let locks = service.locks();
    let wait = locks.lock(location, key, hold.owner);
    if let Some(lock) = engine.wait_for("transactionid", wait).await? {
        hold.locks.push(lock);
    }
    if repeatable
        && let Some(snapshot) = snapshot
        && store.latest(key).is_some_and(|(lsn, _)| lsn > snapshot)
    {
        return Err(CirroError::new(
            SqlState::SERIALIZATION_FAILURE,
            "could not serialize access due to concurrent update (another transaction \
             changed the row after this one's snapshot); retry the transaction",
        ));
    }
    Ok(())
}

/// Whether the table's only constraint is its primary key (or it has none)
/// and no unique index: the row store checks only that key.
pub(crate) fn only_primary_key(table: &CirroTable) -> bool {
    let options = table.options();
    options.constraints.iter().all(|c| {
        matches!(
            c.kind,
            cirro_storage::options::ConstraintKind::PrimaryKey(_)
        )
    }) && !options.indexes.iter().any(|i| i.unique)
        && options.distribution.is_none()
}

fn scans_a_table(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        if matches!(node, LogicalPlan::TableScan(_)) || has_subquery(node) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn has_subquery(node: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = node.apply_expressions(|e| {
        let _ = e.apply(|e| {
            if matches!(
                e,
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
            ) {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        });
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The filter right above the target's scan, if the plan is `[Projection
/// →] Filter → TableScan` with no other scan or subquery.
fn target_filter(dml: &DmlStatement) -> Option<&Expr> {
    let mut node = dml.input.as_ref();
    if let LogicalPlan::Projection(p) = node {
        node = p.input.as_ref();
    }
    let LogicalPlan::Filter(filter) = node else {
        return None;
    };
    let LogicalPlan::TableScan(scan) = filter.input.as_ref() else {
        return None;
    };
    if !scan.table_name.resolved_eq(&dml.table_name) || has_subquery(node) {
        return None;
    }
    if let LogicalPlan::Projection(p) = dml.input.as_ref()
        && has_subquery(&LogicalPlan::Projection(p.clone()))
    {
        return None;
    }
    Some(&filter.predicate)
}

/// The constant each key column is fixed to by the statement's WHERE
/// (`key = constant` conjuncts), as one-row key columns; None if some key
/// column is not fixed.
fn key_values(dml: &DmlStatement, store: &RowStore) -> Result<Option<Vec<ArrayRef>>> {
    let Some(predicate) = target_filter(dml) else {
        return Ok(None);
    };
    let Some(key) = by_key::fixed_key(predicate, store) else {
        return Ok(None);
    };
    Ok(Some(
        key.into_iter()
            .map(|(_, value)| value.to_array())
            .collect::<datafusion::common::Result<Vec<_>>>()?,
    ))
}

/// Whether an UPDATE's projection leaves every key column as it is.
fn keeps_keys(input: &LogicalPlan, store: &RowStore) -> bool {
    let LogicalPlan::Projection(projection) = input else {
        return false;
    };
    let schema = store.schema();
    store.key_columns().unwrap_or(&[]).iter().all(|&k| {
        let name = schema.field(k).name();
        projection.expr.get(k).is_some_and(|e| {
            let inner = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                other => other,
            };
            matches!(inner, Expr::Column(c) if c.name == *name)
        })
    })
}

/// Run `plan` and return its rows as one batch of `schema`'s columns.
async fn evaluate(engine: &Engine, plan: LogicalPlan, schema: &SchemaRef) -> Result<RecordBatch> {
    let batches = match by_key::evaluate(engine, &plan).await? {
        Some(rows) => vec![rows],
        None => {
            let frame = engine.context().execute_logical_plan(plan).await?;
            frame.collect().await.map_err(engine.input_error())?
        }
    };
    table_rows(&batches, schema)
}

/// `batches` as one batch of `schema`'s columns (NOT NULL relaxed).
fn table_rows(batches: &[RecordBatch], schema: &SchemaRef) -> Result<RecordBatch> {
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); schema.fields().len()];
    for batch in batches {
        if batch.num_columns() != schema.fields().len() {
            return Err(CirroError::internal(format!(
                "a small write produced {} columns for a table of {}",
                batch.num_columns(),
                schema.fields().len()
            )));
        }
        for (i, column) in batch.columns().iter().enumerate() {
            let wanted = schema.field(i).data_type();
            let column = if column.data_type() == wanted {
                Arc::clone(column)
            } else {
                by_key::checked_cast(column, wanted)?
            };
            columns[i].push(column);
        }
    }
    let columns = columns
        .into_iter()
        .enumerate()
        .map(|(i, parts)| {
            if parts.is_empty() {
                return Ok(arrow::array::new_empty_array(schema.field(i).data_type()));
            }
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            Ok(arrow::compute::concat(&refs)?)
        })
        .collect::<Result<Vec<_>>>()?;
    // The store's schema declares the table's NOT NULL columns; they are
    // checked (with PostgreSQL's message) before the batch is made.
    let relaxed = Arc::new(arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let loose = RecordBatch::try_new(relaxed, columns)?;
    Ok(loose)
}

/// 23502 for a NULL in a NOT NULL column; the rows as `schema`'s batch.
fn check_not_null(rows: &RecordBatch, schema: &SchemaRef, table: &str) -> Result<()> {
    for (i, field) in schema.fields().iter().enumerate() {
        if !field.is_nullable() && rows.column(i).null_count() > 0 {
            return Err(CirroError::new(
                SqlState::NOT_NULL_VIOLATION,
                format!(
                    "null value in column \"{}\" of relation \"{table}\" violates not-null constraint",
                    field.name()
                ),
            ));
        }
    }
    Ok(())
}

/// `rows` as the table stores them (VARCHAR(n)/CHAR(n) lengths checked and
/// cut as every write does: `cirro_storage::write::conform`), in the row
/// store's schema.
fn conformed(rows: &RecordBatch, table: &CirroTable, store: &RowStore) -> Result<RecordBatch> {
    let stored = cirro_storage::write::conform(rows, table.stored_schema())?;
    by_key::cast_columns(stored.columns(), Arc::clone(store.schema()))
}

/// The first of `rows` (by index, among `candidates`) whose key the table's
/// files hold, at `latest` (keys the row store does not hold): each looked
/// up by key (`cirro_storage::cache::lookup`), which costs a probe of the
/// key index of the row groups whose key range holds it, however large the
/// table. (A scan with one disjunct per key took 0.47 s to plan and run for
/// 1,000 rows.) A key found in none is noted as such, so that scans need
/// not look for it (`cirro_storage::rowstore::RowAt`).
async fn in_files(
    engine: &Engine,
    latest: &CirroTable,
    store: &RowStore,
    rows: &RecordBatch,
    candidates: &[usize],
) -> Result<Option<usize>> {
    if candidates.is_empty() {
        return Ok(None);
    }
    let key = store.key_columns().unwrap_or(&[]);
    let keys = store.keys_of_rows(rows)?;
    if latest.files().is_empty() {
        for &i in candidates {
            store.note(latest.version(), keys[i].clone(), None);
        }
        return Ok(None);
    }
    let runtime = engine.context().runtime_env();
    for &i in candidates {
        let values = key
            .iter()
            .map(|&k| Ok((k, ScalarValue::try_from_array(rows.column(k), i)?)))
            .collect::<Result<Vec<_>>>()?;
        let found = cirro_storage::cache::lookup::find_row(
            latest,
            &runtime,
            Some(engine.node().cache().as_ref()),
            &values,
        )
        .await?;
        if found.is_some() {
            return Ok(Some(i));
        }
        store.note(latest.version(), keys[i].clone(), None);
    }
    Ok(None)
}

/// 23505 for row `i` of `rows`, whose key exists.
fn duplicate(table: &CirroTable, rows: &RecordBatch, i: usize) -> CirroError {
    let options = table.options();
    let (name, key) = options
        .unique_keys()
        .into_iter()
        .find(|(_, _, primary)| *primary)
        .map(|(n, k, _)| (n, k))
        .unwrap_or_default();
    let schema = rows.schema();
    let values: Vec<String> = key
        .iter()
        .filter_map(|c| schema.index_of(c).ok())
        .map(|k| {
            arrow::util::display::array_value_to_string(rows.column(k), i)
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    CirroError::new(
        SqlState::UNIQUE_VIOLATION,
        format!(
            "duplicate key value violates unique constraint \"{name}\": key ({})=({}) already exists",
            key.join(", "),
            values.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::session::txn::tests::number;
    use crate::{Engine, EngineConfig};

    async fn ok(engine: &Engine, sql: &str) {
        if let Err(e) = engine.execute(sql).await {
            panic!("{sql}: {e}");
        }
    }

    /// Two sessions of a process whose data location (`dir`) has row
    /// stores, over a table `acct` of two rows (ids 1 and 2, balances 100).
    async fn two_sessions(
        dir: &std::path::Path,
        config: impl Fn() -> EngineConfig,
    ) -> (Engine, Engine) {
        let a = Engine::open(dir.to_str().unwrap(), config()).await.unwrap();
        a.catalog()
            .enable_row_store(&cirro_catalog::rows::RowStoreConfig {
                wal_dir: dir.join("_wal"),
                budget: 64 << 20,
                flush_every: cirro_catalog::rows::FLUSH_EVERY,
            })
            .await
            .unwrap();
        let b = Engine::with_catalog(Arc::clone(a.catalog()), config(), None);
        ok(&a, "CREATE TABLE acct (id INT PRIMARY KEY, bal BIGINT)").await;
        ok(&a, "INSERT INTO acct VALUES (1, 100), (2, 100)").await;
        (a, b)
    }

    /// The row store of a table whose rows are in its files: scans drop the
    /// file rows it replaces by their position, which the small writes noted
    /// when they looked their key up, so no scan has to look for them (the
    /// store's count of such scans stays put), before and after a flush;
    /// and a deleted or replaced row is never read twice, LIMIT included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scans_drop_replaced_file_rows_where_the_writes_found_them() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = two_sessions(dir.path(), EngineConfig::default).await;
        ok(&a, "CREATE TABLE big (k INT PRIMARY KEY, v BIGINT)").await;
        ok(
            &a,
            "CREATE TABLE src AS SELECT g::int AS k, g::bigint AS v \
             FROM generate_series(1, 4000) AS s(g)",
        )
        .await;
        // Two files, through the files' path (an INSERT that reads a table).
        ok(&a, "INSERT INTO big SELECT * FROM src WHERE k <= 2000").await;
        ok(&a, "INSERT INTO big SELECT * FROM src WHERE k > 2000").await;
        let store = || async {
            let provider = a.context().table_provider("big").await.unwrap();
            let table = crate::statement::by_key::with_rows(&provider).unwrap();
            Arc::clone(&table.rows().unwrap().store)
        };
        let scans = store().await.located_by_scan();
        for sql in [
            "UPDATE big SET v = v + 1000000 WHERE k = 10",
            "UPDATE big SET v = v + 1000000 WHERE k = 3000",
            "DELETE FROM big WHERE k = 20",
            "DELETE FROM big WHERE k = 99999",
            "INSERT INTO big VALUES (5000, 7)",
        ] {
            ok(&a, sql).await;
        }
        let check = |count: i64, sum: i64| {
            let a = &a;
            async move {
                assert_eq!(number(a, "SELECT count(*) FROM big").await, count);
                assert_eq!(number(a, "SELECT sum(v) FROM big").await, sum);
                assert_eq!(
                    number(a, "SELECT v FROM big WHERE k + 0 = 10").await,
                    1_000_010
                );
                assert_eq!(
                    number(
                        a,
                        "SELECT count(*) FROM (SELECT k FROM big WHERE k IN (10, 20, 3000) LIMIT 5) s"
                    )
                    .await,
                    2
                );
                assert_eq!(
                    number(a, "SELECT count(*) FROM (SELECT k FROM big LIMIT 3999) s").await,
                    3999
                );
            }
        };
        // 1..4000, two rows + 1,000,000, row 20 gone, row 5000 added.
        check(4000, 8_002_000 + 2_000_000 - 20 + 7).await;
        check(4000, 8_002_000 + 2_000_000 - 20 + 7).await;
        assert_eq!(store().await.located_by_scan(), scans);
        // Flushed into the files, then written again: the new version's
        // positions are noted by the write.
        crate::rows::flush_now(a.catalog()).await;
        check(4000, 10_001_987).await;
        ok(&a, "UPDATE big SET v = v + 1 WHERE k = 11").await;
        ok(&a, "UPDATE big SET v = v + 1 WHERE k = 5000").await;
        check(4000, 10_001_989).await;
        assert_eq!(store().await.located_by_scan(), scans);
    }

    /// Two sessions of a process with row stores write one row. Under READ
    /// COMMITTED (the default) the second waits for the first to end and
    /// then applies to the row it committed; under REPEATABLE READ it gets
    /// 40001, since the row changed after its snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_waited_applies_to_the_committed_row_under_read_committed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_sessions(dir.path(), EngineConfig::default).await;
        let before = number(&a, "SHOW cirro.by_key").await;
        for (level, fails) in [("READ COMMITTED", false), ("REPEATABLE READ", true)] {
            ok(&a, "BEGIN").await;
            ok(&a, "UPDATE acct SET bal = bal + 10 WHERE id = 1").await;
            ok(&b, &format!("BEGIN ISOLATION LEVEL {level}")).await;
            // Another row: no wait, under either level.
            ok(&b, "UPDATE acct SET bal = bal + 1 WHERE id = 2").await;
            let committed = AtomicBool::new(false);
            let (_, second) = tokio::join!(
                async {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    committed.store(true, Ordering::SeqCst);
                    ok(&a, "COMMIT").await;
                },
                async {
                    let result = b
                        .execute("UPDATE acct SET bal = bal + 1 WHERE id = 1")
                        .await;
                    (result.map(|_| ()), committed.load(Ordering::SeqCst))
                }
            );
            let (result, after_commit) = second;
            assert!(after_commit, "{level}: the second writer did not wait");
            if fails {
                let e = result.expect_err("REPEATABLE READ must not re-apply");
                assert_eq!(e.state, cirro_common::SqlState::SERIALIZATION_FAILURE);
                ok(&b, "ROLLBACK").await;
            } else {
                result.unwrap();
                ok(&b, "COMMIT").await;
            }
        }
        // 100 + 10 + 1 (READ COMMITTED) + 10 (REPEATABLE READ: its +1 rolled back).
        assert_eq!(number(&a, "SELECT bal FROM acct WHERE id = 1").await, 121);
        assert_eq!(number(&a, "SELECT bal FROM acct WHERE id = 2").await, 101);
        assert!(number(&a, "SHOW cirro.by_key").await > before);
    }

    /// With one statement admitted at a time, a writer waiting for a row
    /// lock must not keep the place the lock's holder needs for its next
    /// statement: before, A's second UPDATE waited for admission behind B,
    /// which waited for A's lock, forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_waiting_for_a_row_lock_gives_up_its_admission() {
        let dir = tempfile::tempdir().unwrap();
        let resources = cirro_exec::resources::ResourceConfig {
            max_running: 1,
            spill_dir: dir.path().join("spill"),
            ..cirro_exec::resources::Resources::with_defaults()
                .config()
                .clone()
        };
        let node = crate::node::Node::new(crate::node::NodeConfig {
            resources,
            cache_policy: cirro_storage::cache::Policy::Plan,
            disk: None,
            gpu_memory: 0,
            gpu_policy: "lru".into(),
        })
        .unwrap();
        let node = Arc::new(node);
        let config = || EngineConfig {
            node: Arc::clone(&node),
            ..EngineConfig::default()
        };
        let (a, b) = two_sessions(dir.path(), config).await;
        ok(&a, "BEGIN").await;
        ok(&a, "UPDATE acct SET bal = bal + 10 WHERE id = 1").await;
        let waited = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            tokio::join!(
                async {
                    // B waits for A's row lock, admitted.
                    ok(&b, "UPDATE acct SET bal = bal + 1 WHERE id = 1").await;
                },
                async {
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    ok(&a, "UPDATE acct SET bal = bal + 10 WHERE id = 2").await;
                    ok(&a, "COMMIT").await;
                }
            )
        })
        .await;
        assert!(waited.is_ok(), "the sessions waited for each other");
        assert_eq!(number(&a, "SELECT bal FROM acct WHERE id = 1").await, 111);
        assert_eq!(number(&a, "SELECT bal FROM acct WHERE id = 2").await, 110);
    }
}
