//! Transactions: `BEGIN … COMMIT | ROLLBACK` within one session.
//!
//! Outside a transaction every statement is its own Delta commit. Inside one:
//!
//! - every table is read as of the transaction's BEGIN (the commits of
//!   this process that finished after it are not seen, see
//!   `cirro_catalog::commits`), and then at that version for the rest of the
//!   transaction (snapshot isolation; see `cirro_catalog::SessionTables`),
//!   with the transaction's own changes applied, so later statements see
//!   earlier ones;
//! - INSERT, DELETE, UPDATE, MERGE and TRUNCATE write their data and deletion
//!   vector files at once but commit nothing: the transaction's view of the
//!   table takes their actions instead;
//! - COMMIT writes one Delta commit: the difference between the snapshot the
//!   transaction started from and its view (removes for files gone or whose
//!   deletion vector changed, adds for new or changed files). If another
//!   writer committed a conflicting change since (it removed or changed a file
//!   the transaction read), delta-rs's conflict check refuses the commit and
//!   COMMIT fails with 40001; a non-conflicting one (e.g. an append elsewhere)
//!   is committed after;
//! - ROLLBACK (or a failed COMMIT) removes the files the transaction wrote.
//!
//! A transaction may write several tables. Delta commits are per table, so
//! COMMIT then makes one commit per table, one after the other, and
//! `cirro_catalog::commits` keeps them whole: the process's readers see all
//! of them or none, its other writers of those tables wait, an intent
//! written first lets a process that finds it after a crash finish or undo
//! them, and if one commit fails (40001) the others are undone. Other
//! processes and engines reading the Delta logs may see them one by one. On
//! a cluster, whose other nodes read the logs themselves, a transaction
//! still writes one table (the first statement that writes a second fails
//! with 0A000), and so does one that changes a table's columns or indexes
//! beside another table. As in PostgreSQL, after an error the transaction is aborted:
//! statements fail with 25P02 until ROLLBACK (COMMIT then rolls back).
//!
//! DDL in a transaction (CREATE/DROP TABLE, VIEW, SCHEMA, ALTER TABLE …
//! RENAME TO; ALTER TABLE and CREATE/DROP INDEX of the tables it created)
//! changes the transaction's own copy of the catalog ([`CatalogDdl`]),
//! which only its session sees (through `SessionTables`' overlay). A table
//! it creates is written at once to a new directory no other session can
//! name, so the rows the transaction writes to it, and its ALTER TABLEs,
//! commit there directly; a table it drops keeps its files. COMMIT
//! publishes every created, changed and dropped object in one catalog
//! commit, merged into the catalog as other sessions left it: a name another
//! session took meanwhile is 42P07, an object another session changed or
//! dropped meanwhile 40001. Only after that commit are the dropped tables'
//! files removed; ROLLBACK (or a failed COMMIT) removes the created tables'
//! directories.
//!
//! ALTER TABLE (and CREATE/DROP INDEX) of a table that existed before the
//! transaction changes only that table's Delta log (its schema and options
//! live there), so it is staged like DML: the rewritten files are written at
//! once, the transaction's view takes the new schema (later statements read
//! and write the table under it, [`cirro_storage::CirroTable::with_changes`]),
//! and COMMIT writes the metadata with the view's files in one exclusive
//! commit (40001 if any writer committed to the table since the transaction
//! read it).
//!
//! A transaction that changed the catalog may not also write (or alter) a
//! table that existed before it (0A000), nor roll back to a savepoint: its
//! catalog commit and the tables' commits would not land as one.
//!
//! A session's transaction is one state machine ([`TxnState`]):
//!
//! ```text
//!                 BEGIN                         a statement fails or is cancelled
//!   ┌──────┐ ───────────────► ┌────────────┐ ──────────────────────────► ┌────────┐
//!   │ Idle │                  │ InProgress │                             │ Failed │
//!   └──────┘ ◄─────────────── └────────────┘ ◄────────────────────────── └────────┘
//!      ▲     COMMIT (one Delta    │   ▲          ROLLBACK TO savepoint        │
//!      │     commit) | ROLLBACK   └───┘                                      │
//!      │                    DML (staged), SAVEPOINT,                         │
//!      │                    RELEASE, ROLLBACK TO                             │
//!      └──────────────────────────────────────────────────────────────────── ┘
//!                 COMMIT (rolls back) | ROLLBACK: staged files removed
//! ```
//!
//! In `Failed` every statement but COMMIT, ROLLBACK and ROLLBACK TO fails
//! with 25P02. BEGIN in a transaction and COMMIT/ROLLBACK outside one are
//! accepted with a notice, as in PostgreSQL.

use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{Isolation, TransactionModes, TransactionStatement};
use cirro_storage::CirroTable;
use cirro_storage::mutate::{Change, difference, remove_paths};
use cirro_storage::write::{commit_actions, commit_exclusive};
use deltalake::protocol::DeltaOperation;
use object_store::path::Path;

use std::sync::Arc;

use cirro_catalog::CatalogState;

use crate::{Engine, Outcome};

/// A table a transaction writes.
pub(crate) struct WrittenTable {
    pub location: String,
    pub name: String,
    /// The snapshot the transaction read before changing the table.
    pub base: CirroTable,
    /// Its view of the table now.
    pub current: CirroTable,
    /// Files the transaction wrote (data and deletion vectors).
    pub new_files: Vec<Path>,
    /// Whether any statement removed or changed rows (not only appended).
    pub changes_rows: bool,
    /// A staged ALTER TABLE (CREATE/DROP INDEX): the table's new metadata
    /// and the operation the commit is recorded as. COMMIT then commits
    /// exclusively.
    pub schema: Option<SchemaChange>,
}

/// The metadata a transaction's ALTER TABLE gives a table, and its operation.
#[derive(Clone)]
pub(crate) struct SchemaChange {
    metadata: deltalake::kernel::Metadata,
    operation: DeltaOperation,
}

/// What `ROLLBACK TO SAVEPOINT` returns the written tables to.
struct Savepoint {
    name: String,
    /// Each table written by then, in the order of `Transaction::written`.
    written: Vec<Staged>,
    /// The small writes pending by then (see `statement/point.rs`).
    rows: std::collections::HashMap<String, cirro_storage::rowstore::Pending>,
}

/// What a transaction had staged of a written table at a savepoint.
#[derive(Clone)]
struct Staged {
    view: CirroTable,
    new_files: usize,
    changes_rows: bool,
    schema: Option<SchemaChange>,
}

#[derive(Default)]
pub(crate) struct Transaction {
    /// The tables it writes, in the order it first wrote them.
    pub written: Vec<WrittenTable>,
    savepoints: Vec<Savepoint>,
    /// The catalog as the transaction's DDL left it (None: no DDL yet).
    pub ddl: Option<CatalogDdl>,
    /// What its small writes hold (see `statement/point.rs`); their rows
    /// wait in the session's pending changes.
    pub points: crate::statement::point::PointHold,
    /// Its isolation level as set (READ UNCOMMITTED runs as READ
    /// COMMITTED, as in PostgreSQL).
    pub isolation: Option<Isolation>,
    /// READ ONLY: statements that write get 25006.
    pub read_only: bool,
    /// Whether a statement that reads or writes tables ran in it (then its
    /// level and read-write mode are fixed).
    pub queried: bool,
}

/// Marks the version of a transaction's own catalog (never a real one), so
/// that no plan cached against the shared catalog is taken for it.
const OVERLAY_VERSION: u64 = 1 << 62;

/// What a transaction's DDL did to the catalog, published at COMMIT.
pub(crate) struct CatalogDdl {
    /// The catalog when the transaction's first DDL ran.
    base: Arc<CatalogState>,
    /// The transaction's catalog: `base` with its DDL applied.
    pub state: Arc<CatalogState>,
    /// Directories of the tables it created (removed unless it commits).
    created: Vec<String>,
    /// Directories of the tables it dropped (removed once it commits).
    dropped: Vec<String>,
}

impl CatalogDdl {
    fn new(base: Arc<CatalogState>) -> Self {
        Self {
            state: Arc::clone(&base),
            base,
            created: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// Whether the transaction created the table stored at `location`.
    pub fn created(&self, location: &str) -> bool {
        self.created.iter().any(|c| c == location)
    }
}

/// Whether a transaction at `level` reads committed data per statement.
pub(crate) fn reads_committed(level: Isolation) -> bool {
    matches!(level, Isolation::ReadCommitted | Isolation::ReadUncommitted)
}

/// `level` if Cirro runs it; SERIALIZABLE is refused (0A000) rather than
/// run as snapshot isolation, which allows anomalies it promises away.
pub(crate) fn supported_isolation(level: Isolation) -> Result<Isolation> {
    if level == Isolation::Serializable {
        return Err(CirroError::unsupported(
            "isolation level SERIALIZABLE is not supported: REPEATABLE READ (snapshot \
             isolation) is the strictest level, and READ COMMITTED the default",
        ));
    }
    Ok(level)
}

/// Refuse a write of a pre-existing table in a transaction with DDL.
fn ddl_and_writes(name: &str) -> CirroError {
    CirroError::unsupported(format!(
        "a transaction that runs DDL can write only the tables it created, so it cannot change \"{name}\" \
         (the catalog and an existing table cannot commit atomically yet): COMMIT first"
    ))
}

/// Merge what a transaction changed between `base` and `mine` into
/// `latest` (the catalog as other sessions left it).
fn merge_ddl(base: &CatalogState, mine: &CatalogState, latest: &mut CatalogState) -> Result<()> {
    for (db, database) in &mine.databases {
        let Some(target_db) = latest.databases.get_mut(db) else {
            return Err(CirroError::new(
                SqlState::SERIALIZATION_FAILURE,
                format!(
                    "database \"{db}\" was dropped by another session; the transaction cannot commit"
                ),
            ));
        };
        let base_db = base.databases.get(db);
        for (schema, entry) in &database.schemas {
            let base_schema = base_db.and_then(|d| d.schemas.get(schema));
            let target = match (base_schema, target_db.schemas.get_mut(schema)) {
                (None, Some(_)) => {
                    return Err(CirroError::new(
                        SqlState::DUPLICATE_SCHEMA,
                        format!("schema \"{schema}\" already exists"),
                    ));
                }
                (Some(_), None) => {
                    return Err(CirroError::new(
                        SqlState::SERIALIZATION_FAILURE,
                        format!(
                            "schema \"{schema}\" was dropped by another session; the transaction cannot commit"
                        ),
                    ));
                }
                (None, None) => target_db.schemas.entry(schema.clone()).or_default(),
                (Some(_), Some(target)) => target,
            };
            let empty = Default::default();
            let base_schema = base_schema.unwrap_or(&empty);
            merge_map(
                &base_schema.tables,
                &entry.tables,
                &mut target.tables,
                &target.views,
            )?;
            let tables = target.tables.clone();
            merge_map(&base_schema.views, &entry.views, &mut target.views, &tables)?;
        }
        // Schemas the transaction dropped.
        if let Some(base_db) = base_db {
            for (schema, entry) in &base_db.schemas {
                if database.schemas.contains_key(schema) {
                    continue;
                }
                match target_db.schemas.get(schema) {
                    Some(now) if now != entry => {
                        return Err(CirroError::new(
                            SqlState::SERIALIZATION_FAILURE,
                            format!(
                                "schema \"{schema}\" was changed by another session; the transaction cannot commit"
                            ),
                        ));
                    }
                    _ => {
                        target_db.schemas.remove(schema);
                    }
                }
            }
        }
    }
    Ok(())
}

/// One kind of relation (tables or views) of a schema: each name the
/// transaction created, changed or dropped, checked against what other
/// sessions did to it; `others` holds the other kind's names.
fn merge_map<V: Clone + PartialEq, W>(
    base: &std::collections::BTreeMap<String, V>,
    mine: &std::collections::BTreeMap<String, V>,
    latest: &mut std::collections::BTreeMap<String, V>,
    others: &std::collections::BTreeMap<String, W>,
) -> Result<()> {
    let names: std::collections::BTreeSet<&String> = base.keys().chain(mine.keys()).collect();
    for name in names {
        let (before, after) = (base.get(name), mine.get(name));
        if before == after {
            continue;
        }
        let now = latest.get(name);
        match before {
            None if now.is_some() || others.contains_key(name) => {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{name}\" already exists"),
                ));
            }
            Some(before) if now != Some(before) => {
                return Err(CirroError::new(
                    SqlState::SERIALIZATION_FAILURE,
                    format!(
                        "relation \"{name}\" was changed or dropped by another session since the transaction read it"
                    ),
                ));
            }
            _ => {}
        }
        match after {
            Some(after) => {
                latest.insert(name.clone(), after.clone());
            }
            None => {
                latest.remove(name);
            }
        }
    }
    Ok(())
}

/// Where a session's transaction stands (see the module docs).
#[derive(Default)]
pub(crate) enum TxnState {
    #[default]
    Idle,
    InProgress(Transaction),
    Failed(Transaction),
}

/// Refuse a transaction's write of a second table `name` (it changed
/// `other`): on a cluster, whose other nodes would see the two tables'
/// commits one by one, or where it changes a table's columns (ALTER TABLE,
/// CREATE/DROP INDEX), whose undo would need the old metadata too.
fn one_table_only(other: &str, name: &str, altered: bool) -> CirroError {
    let why = if altered {
        "a transaction that changes a table's columns or indexes changes only that table"
    } else {
        "a transaction on a cluster changes only one table (the other nodes would see the \
         two tables' commits one by one)"
    };
    CirroError::unsupported(format!(
        "{why}: it already changed \"{other}\", so it cannot change \"{name}\""
    ))
}

fn no_savepoint(name: &str) -> CirroError {
    CirroError::new(
        SqlState::SAVEPOINT_EXCEPTION,
        format!("savepoint \"{name}\" does not exist"),
    )
}

impl Transaction {
    /// Take `change` (computed against the transaction's view of the table at
    /// `location`) into the transaction. Returns the table's new view.
    /// `several` says whether it may write more than one table (not on a
    /// cluster, whose other nodes' readers would see its tables' commits
    /// one by one).
    pub async fn stage(
        &mut self,
        location: &str,
        name: &str,
        change: Change,
        changes_rows: bool,
        several: bool,
    ) -> Result<CirroTable> {
        if self.ddl.is_some() {
            change.discard().await;
            return Err(ddl_and_writes(name));
        }
        let known = self.written.iter().position(|w| w.location == location);
        if known.is_none()
            && let Some(other) = self.written.first()
        {
            let other = other.name.clone();
            let altered = self.written.iter().any(|w| w.schema.is_some());
            if !several || altered {
                change.discard().await;
                return Err(one_table_only(&other, name, altered));
            }
        }
        let current = match change.apply() {
            Ok(current) => current,
            Err(e) => {
                change.discard().await;
                return Err(e);
            }
        };
        let index = known.unwrap_or_else(|| {
            self.written.push(WrittenTable {
                location: location.to_string(),
                name: name.to_string(),
                base: change.table().clone(),
                current: current.clone(),
                new_files: Vec::new(),
                changes_rows: false,
                schema: None,
            });
            self.written.len() - 1
        });
        let written = &mut self.written[index];
        written.current = current.clone();
        written.new_files.extend(change.new_files().iter().cloned());
        written.changes_rows |= changes_rows;
        Ok(current)
    }

    /// Take a schema change (a staged ALTER TABLE, CREATE/DROP INDEX of
    /// `name`, computed against the transaction's view) into the
    /// transaction, as [`Self::stage`]; COMMIT records it as `operation`.
    pub async fn stage_schema(
        &mut self,
        location: &str,
        name: &str,
        change: Change,
        operation: DeltaOperation,
        several: bool,
    ) -> Result<CirroTable> {
        let Some(metadata) = change.metadata().cloned() else {
            change.discard().await;
            return Err(CirroError::internal("a schema change without metadata"));
        };
        if let Some(other) = self.written.iter().find(|w| w.location != location) {
            let other = other.name.clone();
            change.discard().await;
            return Err(one_table_only(&other, name, true));
        }
        let view = self.stage(location, name, change, true, several).await?;
        if let Some(written) = self.written.iter_mut().find(|w| w.location == location) {
            written.schema = Some(SchemaChange {
                metadata,
                operation,
            });
        }
        Ok(view)
    }

    /// `SAVEPOINT name`: remember the transaction's changes so far.
    pub fn savepoint(
        &mut self,
        name: &str,
        rows: std::collections::HashMap<String, cirro_storage::rowstore::Pending>,
    ) {
        let written = self
            .written
            .iter()
            .map(|w| Staged {
                view: w.current.clone(),
                new_files: w.new_files.len(),
                changes_rows: w.changes_rows,
                schema: w.schema.clone(),
            })
            .collect();
        self.savepoints.push(Savepoint {
            name: name.to_string(),
            written,
            rows,
        });
    }

    /// `RELEASE SAVEPOINT name`: forget it and the savepoints after it.
    pub fn release(&mut self, name: &str) -> Result<()> {
        let at = self
            .savepoints
            .iter()
            .rposition(|s| s.name == name)
            .ok_or_else(|| no_savepoint(name))?;
        self.savepoints.truncate(at);
        Ok(())
    }

    /// `ROLLBACK TO SAVEPOINT name`: drop the changes made since (removing
    /// the files they wrote) and end the aborted state; the savepoint stays.
    /// Returns each table location whose view changed, with the view
    /// sessions should read now.
    pub async fn rollback_to(&mut self, name: &str) -> Result<Vec<(String, CirroTable)>> {
        let at = self
            .savepoints
            .iter()
            .rposition(|s| s.name == name)
            .ok_or_else(|| no_savepoint(name))?;
        self.savepoints.truncate(at + 1);
        let saved = self.savepoints[at].written.clone();
        let mut views = Vec::new();
        // Tables first written after the savepoint: back to their snapshot.
        for written in self.written.drain(saved.len()..) {
            remove_paths(&written.base, &written.new_files).await;
            views.push((written.location, written.base));
        }
        for (written, saved) in self.written.iter_mut().zip(saved) {
            let dropped: Vec<Path> = written.new_files.drain(saved.new_files..).collect();
            remove_paths(&written.base, &dropped).await;
            written.current = saved.view.clone();
            written.changes_rows = saved.changes_rows;
            written.schema = saved.schema;
            views.push((written.location.clone(), saved.view));
        }
        Ok(views)
    }

    /// Commit the transaction's changes: one Delta commit per written
    /// table (exclusive where it changed the table's schema). Over several
    /// tables the commits land under the tables' commit gates and are
    /// registered with `commits` first, so this process's readers see all
    /// of them or none (see `cirro_catalog::commits`); if one fails, those
    /// already in are undone by commits of their inverse. On failure the
    /// files the transaction wrote are removed and the tables are as they
    /// were. Returns the data files the commits replaced (see
    /// `cirro_storage::write::Committed`).
    pub async fn commit(self, catalog: &cirro_catalog::Catalog) -> Result<Vec<String>> {
        match self.written.len() {
            0 => Ok(Vec::new()),
            1 => {
                let written = self.written.into_iter().next().expect("one table");
                let committed = commit_table(&written).await;
                finish_table(&written, committed.is_ok()).await;
                committed.map(|c| c.replaced)
            }
            _ => commit_tables(self.written, catalog).await,
        }
    }

    /// Drop the transaction's changes: remove the files it wrote.
    pub async fn rollback(self) {
        for written in self.written {
            remove_paths(&written.base, &written.new_files).await;
        }
    }
}

/// The actions that take `written` from its snapshot to the transaction's
/// view, its new metadata first.
fn actions_of(written: &WrittenTable) -> Vec<deltalake::kernel::Action> {
    let mut actions = difference(&written.base, &written.current);
    if let Some(schema) = &written.schema {
        actions.insert(
            0,
            deltalake::kernel::Action::Metadata(schema.metadata.clone()),
        );
    }
    actions
}

/// Commit one written table's changes (nothing when there are none).
async fn commit_table(written: &WrittenTable) -> Result<cirro_storage::write::Committed> {
    let actions = actions_of(written);
    let version = written.base.version();
    match &written.schema {
        Some(schema) => {
            commit_exclusive(written.base.delta(), actions, schema.operation.clone()).await
        }
        None if actions.is_empty() => Ok(cirro_storage::write::Committed {
            version,
            replaced: Vec::new(),
        }),
        None => {
            let operation = if written.changes_rows {
                DeltaOperation::Update { predicate: None }
            } else {
                DeltaOperation::Write {
                    mode: deltalake::protocol::SaveMode::Append,
                    partition_by: None,
                    predicate: None,
                }
            };
            commit_actions(written.base.delta(), actions, operation).await
        }
    }
}

/// After a table's commit: remove the files it does not name (written by
/// one statement and dropped by a later one), or all it wrote if it failed.
async fn finish_table(written: &WrittenTable, committed: bool) {
    if !committed {
        remove_paths(&written.base, &written.new_files).await;
        return;
    }
    let kept: std::collections::HashSet<&str> = written
        .current
        .files()
        .iter()
        .map(|f| f.add.path.as_str())
        .collect();
    let dv_files: std::collections::HashSet<String> = written
        .current
        .files()
        .iter()
        .filter_map(|f| f.deletion_vector().and_then(dv_file_name))
        .collect();
    let garbage: Vec<Path> = written
        .new_files
        .iter()
        .filter(|p| !kept.contains(p.as_ref()) && !dv_files.contains(p.as_ref()))
        .cloned()
        .collect();
    remove_paths(&written.base, &garbage).await;
}

/// Commit several written tables as one: see [`Transaction::commit`].
async fn commit_tables(
    written: Vec<WrittenTable>,
    catalog: &cirro_catalog::Catalog,
) -> Result<Vec<String>> {
    let commits = catalog.multi_commits();
    let tables: Vec<&deltalake::DeltaTable> = written.iter().map(|w| w.base.delta()).collect();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut stranded: Vec<String> = Vec::new();
    let landed = cirro_storage::write::with_gates_held(&tables, async {
        // Under the gates no other commit of this process lands on these
        // tables, so each commit's version is the newest one plus one.
        let mut versions = std::collections::HashMap::new();
        let mut intent = cirro_catalog::commits::Intent {
            id: id.clone(),
            tables: Vec::with_capacity(written.len()),
        };
        for table in &written {
            let actions = actions_of(table);
            if actions.is_empty() {
                continue; // nothing to commit there
            }
            let mut latest = table.base.delta().clone();
            latest.update_state().await?;
            let after = latest.version().map_or(0, |v| v as i64);
            versions.insert(table.location.clone(), after + 1);
            intent.tables.push(cirro_catalog::commits::IntentTable {
                location: table.location.clone(),
                after,
                actions,
                inverse: difference(&table.current, &table.base),
            });
        }
        // What a crash part-way leaves for recovery to finish.
        catalog.write_intent(&intent).await?;
        let ticket = commits.begin(versions);
        let mut done: Vec<(&WrittenTable, cirro_storage::write::Committed)> = Vec::new();
        let mut failure = None;
        for table in &written {
            // The crash tests stop here, between two tables' commits.
            if !done.is_empty() {
                cirro_storage::failpoint::reach("txn.multi_commit", 1);
            }
            match cirro_storage::write::with_transaction_id(&id, commit_table(table)).await {
                Ok(committed) => done.push((table, committed)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            // Undo the tables already in: commits of the inverse changes.
            for (table, _) in &done {
                let inverse = difference(&table.current, &table.base);
                let undone = async {
                    let mut latest = table.base.delta().clone();
                    latest.update_state().await?;
                    let operation = DeltaOperation::Update { predicate: None };
                    cirro_storage::write::with_transaction_id(
                        &id,
                        commit_actions(&latest, inverse, operation),
                    )
                    .await
                }
                .await;
                if let Err(undo) = undone {
                    // Its files stay: the table's newest version names them.
                    stranded.push(table.location.clone());
                    log::error!(
                        "a transaction over several tables failed ({e}) and its commit to \
                         \"{}\" could not be undone: {undo}",
                        table.name
                    );
                }
            }
            commits.finish(ticket);
            catalog.remove_intent(&id).await;
            return Err(e);
        }
        commits.finish(ticket);
        catalog.remove_intent(&id).await;
        Ok(done
            .into_iter()
            .flat_map(|(_, committed)| committed.replaced)
            .collect::<Vec<_>>())
    })
    .await;
    for table in &written {
        if !stranded.contains(&table.location) {
            finish_table(table, landed.is_ok()).await;
        }
    }
    landed
}

/// The file name of a deletion vector stored by UUID in the table directory.
fn dv_file_name(descriptor: &deltalake::kernel::DeletionVectorDescriptor) -> Option<String> {
    cirro_storage::dv::file_path(descriptor)
        .ok()
        .map(|p| p.to_string())
}

/// The error of a statement in a transaction an earlier error aborted.
pub(crate) fn aborted() -> CirroError {
    CirroError::new(
        SqlState::IN_FAILED_SQL_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

/// A transaction taken out of its engine for an await; returned to it on
/// drop, marked failed, if the holder did not return it.
pub(crate) struct HeldTransaction<'a> {
    engine: &'a Engine,
    pub(crate) txn: Option<Transaction>,
}

impl Drop for HeldTransaction<'_> {
    fn drop(&mut self) {
        if let Some(txn) = self.txn.take() {
            self.engine.set_txn(TxnState::Failed(txn));
        }
    }
}

impl HeldTransaction<'_> {
    /// Give the transaction back, in progress.
    pub(crate) fn put_back(mut self) {
        if let Some(txn) = self.txn.take() {
            self.engine.set_txn(TxnState::InProgress(txn));
        }
    }
}

impl Engine {
    fn set_txn(&self, state: TxnState) {
        if let Ok(mut t) = self.txn.lock() {
            *t = state;
        }
    }

    fn take_state(&self) -> TxnState {
        self.txn
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
    }

    /// Whether a transaction is open (BEGIN without COMMIT/ROLLBACK yet).
    pub fn in_transaction(&self) -> bool {
        self.txn
            .lock()
            .map(|t| !matches!(*t, TxnState::Idle))
            .unwrap_or(false)
    }

    /// Whether the open transaction has failed (only ROLLBACK is accepted).
    pub fn transaction_aborted(&self) -> bool {
        self.txn
            .lock()
            .map(|t| matches!(*t, TxnState::Failed(_)))
            .unwrap_or(false)
    }

    /// Mark the open transaction failed: a statement failed or was cancelled
    /// part-way (the client saw an error, so the transaction must not commit).
    pub fn fail_transaction(&self) {
        if let Ok(mut t) = self.txn.lock() {
            *t = match std::mem::take(&mut *t) {
                TxnState::InProgress(txn) => TxnState::Failed(txn),
                other => other,
            };
        }
    }

    /// Take the transaction in progress out for an await (None outside one
    /// or when it failed). Dropping the holder marks it failed.
    pub(crate) fn hold_transaction(&self) -> Option<HeldTransaction<'_>> {
        match self.take_state() {
            TxnState::InProgress(txn) => Some(HeldTransaction {
                engine: self,
                txn: Some(txn),
            }),
            other => {
                self.set_txn(other);
                None
            }
        }
    }

    /// The catalog as this session sees it: with its transaction's DDL.
    pub(crate) fn snapshot(&self) -> Arc<CatalogState> {
        self.session.state(&self.catalog)
    }

    /// Change the catalog: one commit now, or, in a transaction, a change
    /// of the transaction's catalog that COMMIT publishes (see the module
    /// docs). Returns the catalog as the session now sees it.
    pub(crate) async fn commit_catalog<F>(&self, mut change: F) -> Result<Arc<CatalogState>>
    where
        F: FnMut(&mut CatalogState) -> Result<()>,
    {
        if !self.in_transaction() {
            return self.catalog.commit(change).await;
        }
        let Some(mut held) = self.hold_transaction() else {
            return Err(aborted());
        };
        let Some(txn) = held.txn.as_mut() else {
            return Err(CirroError::internal(
                "the transaction ended during a statement",
            ));
        };
        if let Some(written) = txn.written.first() {
            let name = written.name.clone();
            held.put_back();
            return Err(ddl_and_writes(&name));
        }
        // Small writes (see point.rs) are writes of existing tables too.
        if self.session.rows.has_pending() || !txn.points.gates.is_empty() {
            held.put_back();
            return Err(CirroError::unsupported(
                "a transaction that changed existing tables cannot run DDL (the catalog and \
                 an existing table cannot commit atomically yet): COMMIT first",
            ));
        }
        let ddl = txn
            .ddl
            .get_or_insert_with(|| CatalogDdl::new(self.catalog.snapshot()));
        let mut next = (*ddl.state).clone();
        let changed = change(&mut next);
        if let Err(e) = changed {
            held.put_back();
            return Err(e);
        }
        next.version = OVERLAY_VERSION + (next.version & (OVERLAY_VERSION - 1)) + 1;
        ddl.state = Arc::new(next);
        let state = Arc::clone(&ddl.state);
        self.session.set_overlay(Some(Arc::clone(&state)));
        held.put_back();
        Ok(state)
    }

    /// Remove the directory of a dropped table: now, or in a transaction
    /// once it commits.
    pub(crate) async fn remove_table_dir(&self, location: &str) {
        if self.in_transaction() {
            let mut state = self.txn.lock().ok();
            if let Some(TxnState::InProgress(txn) | TxnState::Failed(txn)) = state.as_deref_mut()
                && let Some(ddl) = txn.ddl.as_mut()
            {
                // Removed once the transaction commits (one it created is
                // removed by a ROLLBACK too: it is in `created`).
                ddl.dropped.push(location.to_string());
                return;
            }
        }
        self.catalog.forget_table(location);
        let _ = self.catalog.root().remove_dir(location).await;
    }

    /// A table directory the transaction's DDL just made (removed unless the
    /// transaction commits); nothing outside one.
    pub(crate) fn note_created(&self, location: &str) {
        if let Ok(mut state) = self.txn.lock()
            && let TxnState::InProgress(txn) | TxnState::Failed(txn) = &mut *state
            && let Some(ddl) = txn.ddl.as_mut()
        {
            ddl.created.push(location.to_string());
        }
    }

    /// Whether the open transaction created the table at `location`.
    pub(crate) fn created_in_transaction(&self, location: &str) -> bool {
        self.txn
            .lock()
            .map(|state| match &*state {
                TxnState::InProgress(txn) | TxnState::Failed(txn) => {
                    txn.ddl.as_ref().is_some_and(|d| d.created(location))
                }
                TxnState::Idle => false,
            })
            .unwrap_or(false)
    }

    /// The table at `location` as ALTER TABLE, CREATE INDEX and DROP INDEX
    /// in this session read it: in a transaction, its view.
    pub(crate) async fn table_to_alter(&self, location: &str) -> Result<CirroTable> {
        let table = match self.session.get(location) {
            Some(view) => view,
            None => self.catalog.open_table(location).await?,
        };
        Ok(table.without_row_ids())
    }

    /// Change table `name` at `location` (`table`, read by
    /// [`Self::table_to_alter`]) to `schema` and `options`, with `rows` its
    /// rewritten rows where the change needs them (see
    /// `cirro_storage::evolve`): one exclusive commit now; in a transaction
    /// staged as its write of the table until COMMIT, unless the
    /// transaction created the table (then committed at once into the
    /// directory only it can name).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn change_table_schema<S>(
        &self,
        location: &str,
        name: &str,
        table: &CirroTable,
        schema: &arrow::datatypes::Schema,
        options: &cirro_storage::TableOptions,
        rows: Option<S>,
        operation: DeltaOperation,
    ) -> Result<()>
    where
        S: futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin,
    {
        use cirro_storage::evolve::{change_schema, prepare_schema_change};
        if !self.in_transaction() {
            let committed = change_schema(table, schema, options, rows, operation).await?;
            self.node.cache().forget_files(&committed.replaced);
            return Ok(());
        }
        if self.created_in_transaction(location) {
            change_schema(table, schema, options, rows, operation).await?;
            let now = self.catalog.open_table(location).await?;
            self.session.set(location, now);
            return Ok(());
        }
        if self.transaction_ran_ddl() {
            // Refused before any row is rewritten.
            return Err(ddl_and_writes(name));
        }
        let change = prepare_schema_change(table, schema, options, rows).await?;
        let Some(mut held) = self.hold_transaction() else {
            change.discard().await;
            return Err(aborted());
        };
        let staged = match held.txn.as_mut() {
            Some(txn) => {
                let several = !self.catalog.in_cluster();
                txn.stage_schema(location, name, change, operation, several)
                    .await
            }
            None => {
                change.discard().await;
                Err(CirroError::internal(
                    "the transaction ended during a statement",
                ))
            }
        };
        let view = staged?;
        held.put_back();
        self.session.stage(location, view);
        Ok(())
    }

    /// Whether the open transaction changed the catalog (CREATE, DROP, …).
    fn transaction_ran_ddl(&self) -> bool {
        self.txn
            .lock()
            .map(|state| match &*state {
                TxnState::InProgress(txn) | TxnState::Failed(txn) => txn.ddl.is_some(),
                TxnState::Idle => false,
            })
            .unwrap_or(false)
    }

    /// Publish a transaction's DDL (one catalog commit), then remove what
    /// it dropped; on failure remove what it created.
    async fn commit_ddl(&self, ddl: CatalogDdl) -> Result<()> {
        // The crash tests stop here: the created tables are written, the
        // catalog does not name them yet.
        cirro_storage::failpoint::reach("txn.ddl_commit", 1);
        let merged = self
            .catalog
            .commit(|latest| merge_ddl(&ddl.base, &ddl.state, latest))
            .await;
        match merged {
            Ok(_) => {
                for location in &ddl.dropped {
                    self.catalog.forget_table(location);
                    let _ = self.catalog.root().remove_dir(location).await;
                }
                Ok(())
            }
            Err(e) => {
                self.rollback_ddl(ddl).await;
                Err(e)
            }
        }
    }

    /// Remove the directories of the tables a transaction created.
    async fn rollback_ddl(&self, ddl: CatalogDdl) {
        for location in &ddl.created {
            self.catalog.forget_table(location);
            let _ = self.catalog.root().remove_dir(location).await;
        }
    }

    /// Refuse what a transaction cannot hold.
    pub(crate) fn check_transaction_allows(&self, what: &str) -> Result<()> {
        if self.in_transaction() {
            return Err(CirroError::unsupported(format!(
                "{what} cannot run inside a transaction block; COMMIT or ROLLBACK first"
            )));
        }
        Ok(())
    }

    /// The level a transaction started without one runs at
    /// (`default_transaction_isolation`).
    fn default_isolation(&self) -> Isolation {
        Isolation::from_name(&self.settings.get("default_transaction_isolation"))
            .unwrap_or(Isolation::ReadCommitted)
    }

    /// Whether a transaction started without saying is read-only
    /// (`default_transaction_read_only`).
    fn default_read_only(&self) -> bool {
        matches!(
            self.settings
                .get("default_transaction_read_only")
                .to_ascii_lowercase()
                .as_str(),
            "on" | "true" | "1" | "yes"
        )
    }

    /// Whether the open transaction is read-only; outside one, whether the
    /// statement's own transaction is (the default).
    pub(crate) fn transaction_read_only(&self) -> bool {
        self.peek_transaction(|t| t.read_only)
            .unwrap_or_else(|| self.default_read_only())
    }

    /// At the start of `statement`: 25006 if it writes in a read-only
    /// transaction; in a transaction, notes that it began its work if the
    /// statement reads or writes tables.
    pub(crate) fn check_read_only(&self, statement: &cirro_sql::Statement) -> Result<()> {
        let write = statement.write_command();
        let queries = statement.takes_snapshot();
        if write.is_none() && !queries {
            return Ok(());
        }
        let read_only = match self.hold_transaction() {
            Some(mut held) => {
                let read_only = held.txn.as_mut().map(|txn| {
                    txn.queried |= queries;
                    txn.read_only
                });
                held.put_back();
                read_only.unwrap_or(false)
            }
            None => write.is_some() && self.default_read_only(),
        };
        match write {
            Some(command) if read_only => Err(CirroError::new(
                SqlState::READ_ONLY_SQL_TRANSACTION,
                format!("cannot execute {command} in a read-only transaction"),
            )),
            _ => Ok(()),
        }
    }

    /// The isolation level of the open transaction, else the default.
    pub(crate) fn transaction_isolation(&self) -> Isolation {
        self.peek_transaction(|t| t.isolation)
            .flatten()
            .unwrap_or_else(|| self.default_isolation())
    }

    /// `SET TRANSACTION modes`, or with `session` `SET SESSION
    /// CHARACTERISTICS AS TRANSACTION modes` (the defaults). The level of
    /// a transaction can change only before it reads or writes a table
    /// (25001 after, as PostgreSQL says after its first query).
    pub(crate) fn set_transaction_modes(
        &self,
        session: bool,
        modes: TransactionModes,
    ) -> Result<Outcome> {
        let level = modes.isolation.map(supported_isolation).transpose()?;
        if session {
            if let Some(level) = level {
                self.settings
                    .set("default_transaction_isolation", level.name().to_string());
            }
            if let Some(read_only) = modes.read_only {
                let value = if read_only { "on" } else { "off" };
                self.settings
                    .set("default_transaction_read_only", value.to_string());
            }
            return Ok(Outcome::command("SET"));
        }
        if !self.in_transaction() {
            return Ok(Outcome::with_notice(
                "SET",
                "SET TRANSACTION can only be used in transaction blocks",
            ));
        }
        let Some(mut held) = self.hold_transaction() else {
            return Err(aborted());
        };
        let Some(txn) = held.txn.as_mut() else {
            return Err(aborted());
        };
        // As PostgreSQL: the level, and a turn from read-only to
        // read-write, only before the transaction's first query.
        let started = txn.queried
            || self.session.touched_tables()
            || !txn.written.is_empty()
            || txn.ddl.is_some();
        let refused = if started && level.is_some_and(|level| txn.isolation != Some(level)) {
            Some("SET TRANSACTION ISOLATION LEVEL must be called before any query")
        } else if started && txn.read_only && modes.read_only == Some(false) {
            Some("transaction read-write mode must be set before any query")
        } else {
            None
        };
        if let Some(refused) = refused {
            held.put_back();
            return Err(CirroError::new(SqlState::ACTIVE_SQL_TRANSACTION, refused));
        }
        if let Some(read_only) = modes.read_only {
            txn.read_only = read_only;
        }
        let changed = level.filter(|level| txn.isolation != Some(*level));
        if let Some(level) = changed {
            txn.isolation = Some(level);
        }
        held.put_back();
        if let Some(level) = changed {
            self.session
                .set_read_committed(&self.catalog, reads_committed(level));
        }
        Ok(Outcome::command("SET"))
    }

    /// BEGIN, COMMIT, ROLLBACK and savepoints.
    pub(crate) async fn run_transaction(&self, statement: TransactionStatement) -> Result<Outcome> {
        match statement {
            TransactionStatement::Begin(modes) => {
                if self.in_transaction() {
                    return Ok(Outcome::with_notice(
                        "BEGIN",
                        "there is already a transaction in progress",
                    ));
                }
                let level = supported_isolation(
                    modes.isolation.unwrap_or_else(|| self.default_isolation()),
                )?;
                self.session.begin(&self.catalog, reads_committed(level));
                let read_only = modes.read_only.unwrap_or_else(|| self.default_read_only());
                self.set_txn(TxnState::InProgress(Transaction {
                    isolation: Some(level),
                    read_only,
                    ..Transaction::default()
                }));
                Ok(Outcome::command("BEGIN"))
            }
            TransactionStatement::Commit { chain: false } => self.end_transaction(true).await,
            TransactionStatement::Rollback { chain: false } => self.end_transaction(false).await,
            TransactionStatement::Commit { chain: true }
            | TransactionStatement::Rollback { chain: true } => Err(CirroError::unsupported(
                "COMMIT AND CHAIN and ROLLBACK AND CHAIN are not supported",
            )),
            TransactionStatement::Savepoint(name) => self.savepoint(SavepointOp::Set, &name).await,
            TransactionStatement::Release(name) => {
                self.savepoint(SavepointOp::Release, &name).await
            }
            TransactionStatement::RollbackTo(name) => {
                self.savepoint(SavepointOp::RollbackTo, &name).await
            }
        }
    }

    pub(crate) async fn end_transaction(&self, commit: bool) -> Result<Outcome> {
        let tag = if commit { "COMMIT" } else { "ROLLBACK" };
        let (txn, failed) = match self.take_state() {
            TxnState::Idle => {
                return Ok(Outcome::with_notice(
                    tag,
                    "there is no transaction in progress",
                ));
            }
            TxnState::InProgress(txn) => (txn, false),
            TxnState::Failed(txn) => (txn, true),
        };
        // Small writes: logged as one record at COMMIT (see point.rs).
        let pending = self.session.rows.take_pending();
        let mut txn = txn;
        // The gates and key locks the transaction holds are let go only once
        // its changes are committed or rolled back (at the end of this
        // function): a small write waiting for a gate an ALTER or a write
        // through the files holds alone must find the change committed.
        let _points = std::mem::take(&mut txn.points);
        self.session.end();
        self.session.set_overlay(None);
        if pending.values().any(|p| !p.is_empty()) {
            let result = if commit && !failed {
                self.commit_points(pending).await
            } else {
                Ok(())
            };
            txn.rollback().await;
            result?;
            return Ok(Outcome::command(if commit && !failed {
                "COMMIT"
            } else {
                "ROLLBACK"
            }));
        }
        if let Some(ddl) = txn.ddl.take() {
            // DDL and writes of existing tables never share a transaction.
            txn.rollback().await;
            if commit && !failed {
                self.commit_ddl(ddl).await?;
                return Ok(Outcome::command("COMMIT"));
            }
            self.rollback_ddl(ddl).await;
            return Ok(Outcome::command("ROLLBACK"));
        }
        if !commit || failed {
            txn.rollback().await;
            return Ok(Outcome::command("ROLLBACK"));
        }
        // The tables with constraints: checked again, each under its write
        // lock (taken in the order of their locations), against what other
        // writers committed since the transaction read them (see
        // constraints.rs); the locks are held through the commit.
        // Over several tables every one is locked: a process that finds
        // the commit's intent (a crash part-way) waits for it.
        let several = txn.written.len() > 1;
        let checks = |w: &WrittenTable| w.current.options().has_checks() && !w.new_files.is_empty();
        let mut locked: Vec<&WrittenTable> = txn
            .written
            .iter()
            .filter(|w| several || checks(w))
            .collect();
        locked.sort_by(|a, b| a.location.cmp(&b.location));
        let verdict = async {
            let mut held = Vec::with_capacity(locked.len());
            for written in locked {
                held.push(self.catalog().lock_table_writes(&written.location).await?);
                if !checks(written) {
                    continue;
                }
                let latest = self.catalog().open_table(&written.location).await?;
                if latest.version() == written.base.version() {
                    continue;
                }
                let change = difference(&written.base, &written.current);
                // Rows another writer changed since: 40001, as the commit
                // would find, not their new versions taken for this
                // change's duplicates (23505).
                cirro_storage::write::check_applies(latest.delta(), &change).await?;
                let post = latest.with_changes(&change)?;
                crate::statement::constraints::check(
                    self,
                    &written.name,
                    &post,
                    &written.new_files,
                )
                .await?;
            }
            Ok(held)
        }
        .await;
        match verdict {
            Ok(held) => {
                let committed = txn.commit(self.catalog()).await;
                drop(held);
                self.node.cache().forget_files(&committed?);
                Ok(Outcome::command("COMMIT"))
            }
            Err(e) => {
                txn.rollback().await;
                Err(e)
            }
        }
    }

    /// Log and apply a transaction's small writes as one record.
    async fn commit_points(
        &self,
        pending: std::collections::HashMap<String, cirro_storage::rowstore::Pending>,
    ) -> Result<()> {
        let service = self
            .catalog()
            .row_service()
            .ok_or_else(|| CirroError::internal("small writes without row stores"))?;
        let mut changes = Vec::new();
        let mut locations: Vec<&String> = pending.keys().collect();
        locations.sort();
        for location in locations {
            let table = &pending[location];
            if table.is_empty() {
                continue;
            }
            let store = service.stores().get(location).ok_or_else(|| {
                CirroError::internal(format!("no row store for table {location}"))
            })?;
            changes.push((location.clone(), table.change(&store)?));
        }
        service.commit(changes, self.synchronous_commit()).await?;
        Ok(())
    }

    /// Whether a small write's COMMIT waits for its log record's sync
    /// (`synchronous_commit`, on unless set off).
    pub(crate) fn synchronous_commit(&self) -> bool {
        self.settings.get("synchronous_commit") != "off"
    }

    /// `f` of the transaction in progress (None outside one or when it
    /// failed), which stays in progress.
    pub(crate) fn peek_transaction<T>(&self, f: impl FnOnce(&Transaction) -> T) -> Option<T> {
        let held = self.hold_transaction()?;
        let out = held.txn.as_ref().map(f);
        held.put_back();
        out
    }

    /// SAVEPOINT, RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT.
    async fn savepoint(&self, what: SavepointOp, name: &str) -> Result<Outcome> {
        let tag = match what {
            SavepointOp::Set => "SAVEPOINT",
            SavepointOp::Release => "RELEASE",
            SavepointOp::RollbackTo => "ROLLBACK",
        };
        // ROLLBACK TO is the one savepoint statement a failed transaction
        // takes: it ends the failed state.
        let txn = match self.take_state() {
            TxnState::InProgress(txn) => txn,
            TxnState::Failed(txn) if matches!(what, SavepointOp::RollbackTo) => txn,
            TxnState::Failed(txn) => {
                self.set_txn(TxnState::Failed(txn));
                return Err(aborted());
            }
            TxnState::Idle => {
                return Err(CirroError::new(
                    SqlState::NO_ACTIVE_SQL_TRANSACTION,
                    format!("{tag} can only be used in transaction blocks"),
                ));
            }
        };
        let mut held = HeldTransaction {
            engine: self,
            txn: Some(txn),
        };
        let result = match (what, held.txn.as_mut()) {
            (_, None) => Err(CirroError::internal(
                "the transaction ended during a statement",
            )),
            (SavepointOp::Set, Some(txn)) => {
                txn.savepoint(name, self.session.rows.all_pending());
                Ok(Vec::new())
            }
            (SavepointOp::Release, Some(txn)) => txn.release(name).map(|_| Vec::new()),
            (SavepointOp::RollbackTo, Some(txn)) if txn.ddl.is_some() => {
                Err(CirroError::unsupported(
                    "ROLLBACK TO SAVEPOINT in a transaction that ran DDL is not supported: ROLLBACK the transaction",
                ))
            }
            (SavepointOp::RollbackTo, Some(txn)) => {
                let views = txn.rollback_to(name).await;
                // The small writes since the savepoint are dropped (their
                // row locks stay until the transaction ends, as in
                // PostgreSQL).
                if views.is_ok()
                    && let Some(saved) = txn.savepoints.iter().rfind(|s| s.name == name)
                {
                    self.session.rows.set_pending(saved.rows.clone());
                }
                views
            }
        };
        match result {
            Ok(views) => {
                held.put_back();
                for (location, view) in views {
                    self.session.stage(&location, view);
                }
                Ok(Outcome::command(tag))
            }
            // `held` marks the transaction failed when dropped.
            Err(e) => Err(e),
        }
    }
}

#[derive(Clone, Copy)]
enum SavepointOp {
    Set,
    Release,
    RollbackTo,
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{Engine, EngineConfig, Outcome};
    use cirro_common::SqlState;

    async fn tag(engine: &Engine, sql: &str) -> String {
        match engine.execute(sql).await {
            Ok(Outcome::Command { tag, .. }) => tag,
            Ok(Outcome::Rows(_)) => "ROWS".into(),
            Err(e) => panic!("{sql}: {e}"),
        }
    }

    /// The SQLSTATE of a statement that must fail.
    async fn failure(engine: &Engine, sql: &str) -> SqlState {
        match engine.execute(sql).await {
            Err(e) => e.state,
            Ok(_) => panic!("{sql} succeeded"),
        }
    }

    async fn count(engine: &Engine) -> i64 {
        let batches = engine
            .context()
            .sql("SELECT count(*) AS n FROM t")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        arrow::array::cast::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
            batches[0].column(0),
        )
        .value(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_aborts_the_transaction_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_str().unwrap();
        let engine = Engine::open(data, EngineConfig::default()).await.unwrap();
        tag(&engine, "CREATE TABLE t (id INT NOT NULL)").await;
        tag(&engine, "INSERT INTO t VALUES (1), (2)").await;
        tag(&engine, "BEGIN").await;
        assert_eq!(tag(&engine, "DELETE FROM t WHERE id = 1").await, "DELETE 1");
        let err = engine
            .execute("UPDATE t SET id = NULL")
            .await
            .err()
            .unwrap();
        assert_eq!(err.state, SqlState::NOT_NULL_VIOLATION);
        let err = engine.execute("SELECT 1").await.err().unwrap();
        assert_eq!(err.state, SqlState::IN_FAILED_SQL_TRANSACTION);
        // COMMIT of an aborted transaction rolls it back
        assert_eq!(tag(&engine, "COMMIT").await, "ROLLBACK");
        assert!(!engine.in_transaction());
        assert_eq!(count(&engine).await, 2);
        // and the session is usable again
        tag(&engine, "BEGIN").await;
        tag(&engine, "DELETE FROM t WHERE id = 1").await;
        assert_eq!(tag(&engine, "COMMIT").await, "COMMIT");
        assert_eq!(count(&engine).await, 1);
        // the uncommitted files of the rolled back transaction are gone: only
        // files the log references (and the log) remain
        let dir_of_t = std::fs::read_dir(dir.path().join("data/cirro/public"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let files: Vec<String> = std::fs::read_dir(&dir_of_t)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "_delta_log")
            .collect();
        let log: String = std::fs::read_dir(dir_of_t.join("_delta_log"))
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
            .collect();
        for file in files {
            let referenced = log.contains(&file) || file.starts_with("deletion_vector_");
            assert!(referenced, "unreferenced file {file} left behind");
        }
    }

    /// One number a query answers (run as a client's statement is).
    /// The first value of `sql`'s rows, as a 64-bit integer.
    pub(crate) async fn number(engine: &Engine, sql: &str) -> i64 {
        use futures::TryStreamExt;
        let Ok(Outcome::Rows(stream)) = engine.execute(sql).await else {
            panic!("{sql}: no rows");
        };
        let batches: Vec<arrow::array::RecordBatch> = stream.try_collect().await.unwrap();
        let column =
            arrow::compute::cast(batches[0].column(0), &arrow::datatypes::DataType::Int64).unwrap();
        arrow::array::cast::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&column).value(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn several_tables_commit_and_roll_back_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path().to_str().unwrap(), EngineConfig::default())
            .await
            .unwrap();
        let sums = "SELECT (SELECT coalesce(sum(x), 0) FROM a) * 1000 + (SELECT coalesce(sum(x), 0) FROM b)";
        tag(&engine, "CREATE TABLE a (x INT NOT NULL)").await;
        tag(&engine, "CREATE TABLE b (x INT NOT NULL)").await;
        tag(&engine, "INSERT INTO a VALUES (1)").await;
        tag(&engine, "INSERT INTO b VALUES (1)").await;
        tag(&engine, "BEGIN").await;
        tag(&engine, "INSERT INTO a VALUES (2)").await;
        tag(&engine, "UPDATE b SET x = 5").await;
        // The transaction sees its own writes to both.
        assert_eq!(number(&engine, sums).await, 3005);
        assert_eq!(tag(&engine, "COMMIT").await, "COMMIT");
        assert_eq!(number(&engine, sums).await, 3005);
        // ROLLBACK drops the writes to both.
        tag(&engine, "BEGIN").await;
        tag(&engine, "DELETE FROM a").await;
        tag(&engine, "INSERT INTO b VALUES (7)").await;
        assert_eq!(tag(&engine, "ROLLBACK").await, "ROLLBACK");
        assert_eq!(number(&engine, sums).await, 3005);
        // ROLLBACK TO a savepoint drops the table first written after it.
        tag(&engine, "BEGIN").await;
        tag(&engine, "INSERT INTO a VALUES (10)").await;
        tag(&engine, "SAVEPOINT s").await;
        tag(&engine, "INSERT INTO b VALUES (20)").await;
        tag(&engine, "INSERT INTO a VALUES (30)").await;
        tag(&engine, "ROLLBACK TO SAVEPOINT s").await;
        assert_eq!(number(&engine, sums).await, 13005);
        tag(&engine, "COMMIT").await;
        assert_eq!(number(&engine, sums).await, 13005);
        // TRUNCATE of several tables: all of them, or (a table is missing)
        // none, in a transaction of its own or in the open one.
        assert_eq!(
            failure(&engine, "TRUNCATE a, no_such_table").await,
            SqlState::UNDEFINED_TABLE
        );
        assert_eq!(number(&engine, sums).await, 13005);
        tag(&engine, "BEGIN").await;
        assert_eq!(tag(&engine, "TRUNCATE a, b").await, "TRUNCATE TABLE");
        tag(&engine, "INSERT INTO b VALUES (4)").await;
        tag(&engine, "COMMIT").await;
        assert_eq!(number(&engine, sums).await, 4);
        assert_eq!(tag(&engine, "TRUNCATE TABLE a, b").await, "TRUNCATE TABLE");
        assert_eq!(number(&engine, sums).await, 0);
        // A transaction that changes a table's columns changes only it.
        tag(&engine, "BEGIN").await;
        tag(&engine, "INSERT INTO a VALUES (1)").await;
        assert_eq!(
            failure(&engine, "ALTER TABLE b ADD COLUMN y INT").await,
            SqlState::FEATURE_NOT_SUPPORTED
        );
        tag(&engine, "ROLLBACK").await;
        tag(&engine, "BEGIN").await;
        tag(&engine, "ALTER TABLE b ADD COLUMN y INT").await;
        assert_eq!(
            failure(&engine, "INSERT INTO a VALUES (1)").await,
            SqlState::FEATURE_NOT_SUPPORTED
        );
        tag(&engine, "ROLLBACK").await;
        assert_eq!(number(&engine, sums).await, 0);
        // Nothing is left for recovery.
        let intents = dir.path().join(cirro_catalog::commits::INTENT_DIR);
        let left = std::fs::read_dir(&intents).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0);
    }

    /// Transfers between two tables, committed while another session
    /// reads both: every read sees every transfer whole or not at all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_see_a_commit_over_two_tables_whole() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Engine::open(dir.path().to_str().unwrap(), EngineConfig::default())
            .await
            .unwrap();
        let reader = Engine::with_catalog(
            std::sync::Arc::clone(writer.catalog()),
            EngineConfig::default(),
            None,
        );
        tag(&writer, "CREATE TABLE a (x INT NOT NULL)").await;
        tag(&writer, "CREATE TABLE b (x INT NOT NULL)").await;
        tag(&writer, "INSERT INTO a VALUES (100)").await;
        tag(&writer, "INSERT INTO b VALUES (100)").await;
        let transfers = 25;
        let write = async {
            for _ in 0..transfers {
                tag(&writer, "BEGIN").await;
                tag(&writer, "UPDATE a SET x = x - 1").await;
                tag(&writer, "UPDATE b SET x = x + 1").await;
                tag(&writer, "COMMIT").await;
            }
        };
        let done = std::sync::atomic::AtomicBool::new(false);
        let read = async {
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) && reads < 2000 {
                let total = number(
                    &reader,
                    "SELECT (SELECT sum(x) FROM a) + (SELECT sum(x) FROM b)",
                )
                .await;
                assert_eq!(total, 200, "a read saw part of a transfer");
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        };
        let (_, reads) = tokio::join!(
            async {
                write.await;
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            },
            read
        );
        assert!(reads > 0);
        assert_eq!(
            number(&reader, "SELECT sum(x) FROM a").await,
            100 - transfers
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn savepoints_undo_what_came_after_them() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path().to_str().unwrap(), EngineConfig::default())
            .await
            .unwrap();
        tag(&engine, "CREATE TABLE t (id INT NOT NULL)").await;
        tag(&engine, "INSERT INTO t VALUES (1), (2)").await;
        assert_eq!(
            failure(&engine, "SAVEPOINT a").await,
            SqlState::NO_ACTIVE_SQL_TRANSACTION
        );
        tag(&engine, "BEGIN").await;
        // Before anything is written: ROLLBACK TO leaves the table as read.
        tag(&engine, "SAVEPOINT before_all").await;
        tag(&engine, "DELETE FROM t").await;
        assert_eq!(count(&engine).await, 0);
        assert_eq!(
            tag(&engine, "ROLLBACK TO SAVEPOINT before_all").await,
            "ROLLBACK"
        );
        assert_eq!(count(&engine).await, 2);
        tag(&engine, "INSERT INTO t VALUES (3)").await;
        tag(&engine, "SAVEPOINT a").await;
        tag(&engine, "INSERT INTO t VALUES (4), (5)").await;
        tag(&engine, "DELETE FROM t WHERE id < 3").await;
        assert_eq!(count(&engine).await, 3);
        // An error aborts the transaction; ROLLBACK TO ends that.
        assert_eq!(
            failure(&engine, "UPDATE t SET id = NULL").await,
            SqlState::NOT_NULL_VIOLATION
        );
        assert!(engine.transaction_aborted());
        tag(&engine, "ROLLBACK TO a").await;
        assert!(!engine.transaction_aborted());
        assert_eq!(count(&engine).await, 3);
        assert_eq!(
            failure(&engine, "RELEASE SAVEPOINT nope").await,
            SqlState::SAVEPOINT_EXCEPTION
        );
        tag(&engine, "ROLLBACK TO a").await;
        assert_eq!(tag(&engine, "RELEASE a").await, "RELEASE");
        assert_eq!(tag(&engine, "COMMIT").await, "COMMIT");
        assert_eq!(count(&engine).await, 3);
        let ids = engine
            .context()
            .sql("SELECT sum(id) FROM t")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let sum = arrow::array::cast::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
            ids[0].column(0),
        )
        .value(0);
        assert_eq!(sum, 1 + 2 + 3);
    }
}
