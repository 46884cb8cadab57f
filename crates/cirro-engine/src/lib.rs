//! The Cirro SQL engine of one process: a DataFusion session over the Cirro
//! catalog, and the statements DataFusion leaves to its host.
//!
//! ```text
//!  text ─► split into statements ─► for each:
//!     COPY … FROM        → copy::copy_from (CSV / Parquet into a table)
//!     CREATE/DROP DATABASE, CREATE VIEW   → ddl (catalog commit)
//!     anything else      → DataFusion plans it, then
//!         CREATE/DROP TABLE, SCHEMA, VIEW → ddl (catalog commit)
//!         INSERT, SELECT, EXPLAIN, SET, … → DataFusion executes it
//! ```
//!
//! Every statement refreshes the catalog first, so a process sees what other
//! processes committed; every change is one atomic commit (see `cirro-catalog`).

mod access;
mod copy;
mod copy_text;
mod ddl;
mod dml;
mod functions;
mod history;
pub mod split;
mod txn;
mod views;

use std::sync::Arc;

use cirro_catalog::{Catalog, CirroCatalogList, DEFAULT_DATABASE, DEFAULT_SCHEMA, SessionTables};
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::StorageRoot;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement, WriteOp};
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{CreateTableOptions, ObjectType, Statement as SqlStatement};
use futures::StreamExt;

pub use access::bootstrap_superuser;
pub use copy::{ClientCopy, CopyIn, parse_client_copy};
pub use copy_text::TextFormat;
pub use split::{is_complete, split_statements};

/// How a process's engine is set up.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// Parallelism of query execution (DataFusion `target_partitions`); all
    /// cores when unset.
    pub target_partitions: Option<usize>,
    /// The database names resolve in (default `cirro`).
    pub database: Option<String>,
    /// The DataFusion runtime (memory pool, Parquet metadata and statistics
    /// caches) to share with other sessions of the process; a new one when
    /// unset. A server shares one: each runtime's caches may hold ~70 MB.
    pub runtime: Option<Arc<RuntimeEnv>>,
}

/// What a statement produced.
pub enum Outcome {
    /// Rows of a query, streamed.
    Rows(SendableRecordBatchStream),
    /// A command's tag (`CREATE TABLE`, `INSERT 0 5`, …), with a notice if any.
    Command { tag: String, notice: Option<String> },
}

impl Outcome {
    fn command(tag: impl Into<String>) -> Self {
        Outcome::Command {
            tag: tag.into(),
            notice: None,
        }
    }

    fn with_notice(tag: impl Into<String>, notice: impl Into<String>) -> Self {
        Self::skipped_if(tag, true, notice)
    }

    /// `tag`, with `notice` when the statement did nothing (IF [NOT] EXISTS).
    fn skipped_if(tag: impl Into<String>, skipped: bool, notice: impl Into<String>) -> Self {
        Outcome::Command {
            tag: tag.into(),
            notice: skipped.then(|| notice.into()),
        }
    }
}

/// What a statement takes and returns, found without running it (for the
/// extended query protocol's Describe).
#[derive(Debug, Clone)]
pub struct Description {
    /// The type of each parameter `$1 … $n`, where it can be inferred.
    pub params: Vec<Option<arrow::datatypes::DataType>>,
    /// The columns of the rows it returns; None for a command.
    pub schema: Option<arrow::datatypes::SchemaRef>,
}

/// The highest `$n` placeholder in `sql` (0 when there is none).
pub fn placeholder_count(sql: &str) -> usize {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize()
        .map(|tokens| {
            tokens
                .iter()
                .filter_map(|t| match t {
                    Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
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

/// The error of a statement in a transaction an earlier error aborted.
fn aborted() -> CirroError {
    CirroError::new(
        SqlState::IN_FAILED_SQL_TRANSACTION,
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

#[derive(Clone, Copy)]
enum Savepoint {
    Set,
    Release,
    RollbackTo,
}

/// A transaction taken out of its engine for an await; returned to it on
/// drop, marked failed, if the holder did not return it.
struct HeldTransaction<'a> {
    engine: &'a Engine,
    txn: Option<txn::Transaction>,
}

impl Drop for HeldTransaction<'_> {
    fn drop(&mut self) {
        if let Some(mut txn) = self.txn.take() {
            txn.aborted = true;
            self.engine.put_txn(txn);
        }
    }
}

/// The engine: one catalog, one DataFusion session.
pub struct Engine {
    catalog: Arc<Catalog>,
    /// The session's view of the databases (DataFusion's catalog list).
    catalogs: Arc<CirroCatalogList>,
    ctx: SessionContext,
    /// Tables pinned by the open transaction, if any.
    session: Arc<SessionTables>,
    /// The open transaction, if any (BEGIN … COMMIT).
    txn: std::sync::Mutex<Option<txn::Transaction>>,
    /// The user the session runs as; None for the local shell (see `access`).
    user: Option<String>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.catalogs.clear_system_schemas();
    }
}

impl Engine {
    /// Open the data location `data` (a path or URL), creating it if new.
    pub async fn open(data: &str, config: EngineConfig) -> Result<Self> {
        let root = StorageRoot::open(data)?;
        let catalog = Catalog::open(root).await?;
        Ok(Self::with_catalog(catalog, config, None))
    }

    /// A session over an open catalog (shared by the sessions of a server),
    /// running as `user` (None: unrestricted, see `access`).
    pub fn with_catalog(catalog: Arc<Catalog>, config: EngineConfig, user: Option<String>) -> Self {
        let session = Arc::new(SessionTables::default());
        let list = Arc::new(CirroCatalogList::new(
            Arc::clone(&catalog),
            Arc::clone(&session),
        ));
        let mut session_config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema(
                config.database.as_deref().unwrap_or(DEFAULT_DATABASE),
                DEFAULT_SCHEMA,
            )
            .with_create_default_catalog_and_schema(false);
        if let Some(partitions) = config.target_partitions {
            session_config = session_config.with_target_partitions(partitions.max(1));
        }
        let mut builder = SessionStateBuilder::new()
            .with_config(session_config)
            .with_default_features()
            .with_catalog_list(list.clone());
        if let Some(runtime) = &config.runtime {
            builder = builder.with_runtime_env(Arc::clone(runtime));
        }
        let state = builder.build();
        let ctx = SessionContext::new_with_state(state).enable_url_table();
        functions::register(&ctx);
        list.set_view_planner(Arc::new(views::SessionViewPlanner::for_context(&ctx)));
        Self {
            catalog,
            catalogs: list,
            ctx,
            session,
            txn: std::sync::Mutex::new(None),
            user,
        }
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Whether a transaction is open (BEGIN without COMMIT/ROLLBACK yet).
    pub fn in_transaction(&self) -> bool {
        self.txn.lock().map(|t| t.is_some()).unwrap_or(false)
    }

    /// Whether the open transaction has failed (only ROLLBACK is accepted).
    pub fn transaction_aborted(&self) -> bool {
        self.txn
            .lock()
            .map(|t| t.as_ref().is_some_and(|t| t.aborted))
            .unwrap_or(false)
    }

    fn take_txn(&self) -> Option<txn::Transaction> {
        self.txn.lock().ok().and_then(|mut t| t.take())
    }

    fn put_txn(&self, txn: txn::Transaction) {
        if let Ok(mut t) = self.txn.lock() {
            *t = Some(txn);
        }
    }

    /// Run one statement (no terminating semicolon needed).
    ///
    /// The future is boxed (and `Send`), so servers can hold it across
    /// their own generic async code.
    pub fn execute<'a>(&'a self, sql: &'a str) -> futures::future::BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.execute_inner(sql))
    }

    async fn execute_inner(&self, sql: &str) -> Result<Outcome> {
        let result = self.execute_statement(sql).await;
        if result.is_err() {
            self.fail_transaction();
        }
        result
    }

    /// Describe one statement without running it: its parameter types and,
    /// for a statement that returns rows, their columns. Errors in the
    /// statement (syntax, missing tables) are reported here, as PostgreSQL
    /// reports them at Parse.
    pub fn describe<'a>(
        &'a self,
        sql: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Description>> {
        Box::pin(self.describe_inner(sql))
    }

    async fn describe_inner(&self, sql: &str) -> Result<Description> {
        let count = placeholder_count(sql);
        let unknown = |schema| Description {
            params: vec![None; count],
            schema,
        };
        if access::parse(sql)?.is_some() {
            return Ok(unknown(None));
        }
        if let Some(statement) = history::parse_maintenance(sql)? {
            return Ok(unknown(Some(history::result_schema(&statement))));
        }
        self.catalog.refresh().await?;
        let rewritten = history::rewrite_time_travel(self, sql).await?;
        if copy::parse_copy_from(&rewritten)?.is_some() {
            return Ok(unknown(None));
        }
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(&rewritten, &dialect)?;
        let (returns_rows, plannable) = match &statement {
            DfStatement::Statement(inner) => match inner.as_ref() {
                SqlStatement::Query(_)
                | SqlStatement::Explain { .. }
                | SqlStatement::ExplainTable { .. }
                | SqlStatement::ShowVariable { .. }
                | SqlStatement::ShowTables { .. }
                | SqlStatement::ShowColumns { .. }
                | SqlStatement::ShowFunctions { .. } => (true, true),
                SqlStatement::Insert(_)
                | SqlStatement::Update(_)
                | SqlStatement::Delete(_)
                | SqlStatement::Merge(_) => (false, true),
                _ => (false, false),
            },
            DfStatement::Explain(_) => (true, true),
            _ => (false, false),
        };
        if !plannable {
            return Ok(unknown(None));
        }
        let plan = state.statement_to_plan(statement).await?;
        let types = plan.get_parameter_types()?;
        let params = (1..=count.max(types.len()))
            .map(|i| types.get(&format!("${i}")).cloned().flatten())
            .collect();
        let schema = returns_rows.then(|| Arc::new(plan.schema().as_arrow().clone()));
        Ok(Description { params, schema })
    }

    /// Mark the open transaction failed: a statement failed or was cancelled
    /// part-way (the client saw an error, so the transaction must not commit).
    pub fn fail_transaction(&self) {
        if let Ok(mut guard) = self.txn.lock()
            && let Some(txn) = guard.as_mut()
        {
            txn.aborted = true;
        }
    }

    async fn begin(&self) -> Result<Outcome> {
        if self.in_transaction() {
            return Ok(Outcome::with_notice(
                "BEGIN",
                "there is already a transaction in progress",
            ));
        }
        self.session.begin();
        self.put_txn(txn::Transaction::default());
        Ok(Outcome::command("BEGIN"))
    }

    async fn end_transaction(&self, commit: bool) -> Result<Outcome> {
        let tag = if commit { "COMMIT" } else { "ROLLBACK" };
        let Some(txn) = self.take_txn() else {
            return Ok(Outcome::with_notice(
                tag,
                "there is no transaction in progress",
            ));
        };
        self.session.end();
        if commit && !txn.aborted {
            txn.commit().await?;
            Ok(Outcome::command("COMMIT"))
        } else {
            txn.rollback().await;
            Ok(Outcome::command("ROLLBACK"))
        }
    }

    /// SAVEPOINT, RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT.
    async fn savepoint(
        &self,
        what: Savepoint,
        name: &datafusion::sql::sqlparser::ast::Ident,
    ) -> Result<Outcome> {
        let name = datafusion::sql::planner::IdentNormalizer::new(true).normalize(name.clone());
        let tag = match what {
            Savepoint::Set => "SAVEPOINT",
            Savepoint::Release => "RELEASE",
            Savepoint::RollbackTo => "ROLLBACK",
        };
        let Some(txn) = self.take_txn() else {
            return Err(CirroError::new(
                SqlState::NO_ACTIVE_SQL_TRANSACTION,
                format!("{tag} can only be used in transaction blocks"),
            ));
        };
        // An aborted transaction only gets here for ROLLBACK TO (see
        // `execute_statement`), which ends the aborted state.
        let mut held = HeldTransaction {
            engine: self,
            txn: Some(txn),
        };
        let result = match (what, held.txn.as_mut()) {
            (_, None) => Err(CirroError::internal(
                "the transaction ended during a statement",
            )),
            (Savepoint::Set, Some(txn)) => {
                txn.savepoint(&name);
                Ok(None)
            }
            (Savepoint::Release, Some(txn)) => txn.release(&name).map(|_| None),
            (Savepoint::RollbackTo, Some(txn)) => txn.rollback_to(&name).await,
        };
        if let Some(txn) = held.txn.take() {
            self.put_txn(txn);
        }
        if let Some((location, view)) = result? {
            self.session.set(&location, view);
        }
        Ok(Outcome::command(tag))
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

    async fn execute_statement(&self, sql: &str) -> Result<Outcome> {
        if self.transaction_aborted() {
            let state = self.ctx.state();
            let dialect = state.config().options().sql_parser.dialect;
            let ends = matches!(
                state.sql_to_statement(sql, &dialect),
                Ok(DfStatement::Statement(ref inner)) if matches!(
                    inner.as_ref(),
                    SqlStatement::Commit { .. } | SqlStatement::Rollback { .. }
                )
            );
            if !ends {
                return Err(aborted());
            }
        }
        self.catalog.refresh().await?;
        if let Some(statement) = access::parse(sql)? {
            self.check_transaction_allows("CREATE/ALTER/DROP USER, GRANT and REVOKE")?;
            return self.execute_access(statement).await;
        }
        if let Some(statement) = history::parse_maintenance(sql)? {
            return history::run_maintenance(self, statement).await;
        }
        let rewritten = history::rewrite_time_travel(self, sql).await?;
        let sql = rewritten.as_str();
        if let Some(copy) = copy::parse_copy_from(sql)? {
            self.check_transaction_allows("COPY")?;
            self.require_superuser("COPY … FROM a file on the server")?;
            return copy::copy_from(self, copy).await;
        }
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(sql, &dialect)?;
        if let DfStatement::Statement(inner) = &statement {
            if matches!(
                inner.as_ref(),
                SqlStatement::CreateView(_)
                    | SqlStatement::CreateDatabase { .. }
                    | SqlStatement::Drop { .. }
                    | SqlStatement::CreateTable(_)
                    | SqlStatement::CreateSchema { .. }
                    | SqlStatement::AlterTable(_)
            ) {
                self.check_transaction_allows("DDL")?;
            }
            match inner.as_ref() {
                SqlStatement::StartTransaction { .. } => return self.begin().await,
                SqlStatement::Commit { chain: false, .. } => {
                    return self.end_transaction(true).await;
                }
                SqlStatement::Rollback {
                    chain: false,
                    savepoint: None,
                } => return self.end_transaction(false).await,
                SqlStatement::Drop {
                    object_type: ObjectType::Database,
                    if_exists,
                    names,
                    cascade,
                    ..
                } => {
                    self.require_superuser("DROP DATABASE")?;
                    return ddl::drop_database(self, names, *if_exists, *cascade).await;
                }
                SqlStatement::CreateDatabase {
                    db_name,
                    if_not_exists,
                    ..
                } => {
                    self.require_superuser("CREATE DATABASE")?;
                    return ddl::create_database(self, &db_name.to_string(), *if_not_exists).await;
                }
                SqlStatement::CreateView(view) => return views::create_view(self, view).await,
                SqlStatement::CreateTable(create)
                    if !matches!(create.table_options, CreateTableOptions::None) =>
                {
                    // DataFusion refuses WITH (…); take the options out, plan
                    // the rest, and create the table with them.
                    let options = ddl::table_options(&create.table_options)?;
                    let mut stripped = create.clone();
                    stripped.table_options = CreateTableOptions::None;
                    let plan = state
                        .statement_to_plan(DfStatement::Statement(Box::new(
                            SqlStatement::CreateTable(stripped),
                        )))
                        .await?;
                    self.check_plan(&plan)?;
                    return match plan {
                        LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) => {
                            ddl::create_table(self, cmd, &options).await
                        }
                        _ => Err(CirroError::internal(
                            "CREATE TABLE planned as something else",
                        )),
                    };
                }
                SqlStatement::Savepoint { name } => {
                    return self.savepoint(Savepoint::Set, name).await;
                }
                SqlStatement::ReleaseSavepoint { name } => {
                    return self.savepoint(Savepoint::Release, name).await;
                }
                SqlStatement::Rollback {
                    chain: false,
                    savepoint: Some(name),
                } => return self.savepoint(Savepoint::RollbackTo, name).await,
                SqlStatement::Commit { .. } | SqlStatement::Rollback { .. } => {
                    return Err(CirroError::unsupported(
                        "COMMIT AND CHAIN and ROLLBACK AND CHAIN are not supported",
                    ));
                }
                _ => {}
            }
        }
        let plan = state.statement_to_plan(statement).await?;
        self.check_plan(&plan)?;
        self.execute_plan(plan).await
    }

    async fn execute_plan(&self, plan: LogicalPlan) -> Result<Outcome> {
        // EXPLAIN of DELETE/UPDATE/MERGE shows the query Cirro runs for it;
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
            LogicalPlan::Ddl(ddl) => match ddl {
                DdlStatement::CreateMemoryTable(cmd) => ddl::create_table(self, cmd, &[]).await,
                DdlStatement::DropTable(cmd) => {
                    let (db, schema, name) = self.resolve(&cmd.name);
                    self.check_owner(&db, &schema, &name, "DROP it")?;
                    ddl::drop_table(self, &cmd.name, cmd.if_exists).await
                }
                DdlStatement::DropView(cmd) => {
                    views::drop_view(self, &cmd.name, cmd.if_exists).await
                }
                DdlStatement::CreateCatalogSchema(cmd) => {
                    self.require_superuser("CREATE SCHEMA")?;
                    ddl::create_schema(self, &cmd.schema_name, cmd.if_not_exists).await
                }
                DdlStatement::DropCatalogSchema(cmd) => {
                    self.require_superuser("DROP SCHEMA")?;
                    ddl::drop_schema(self, &cmd.name, cmd.if_exists, cmd.cascade).await
                }
                DdlStatement::CreateCatalog(cmd) => {
                    self.require_superuser("CREATE DATABASE")?;
                    ddl::create_database(self, &cmd.catalog_name, cmd.if_not_exists).await
                }
                DdlStatement::CreateExternalTable(_) => Err(CirroError::unsupported(
                    "CREATE EXTERNAL TABLE is not supported: use CREATE TABLE and COPY, or query files directly with read_parquet()/read_csv()",
                )),
                other => Err(CirroError::unsupported(format!(
                    "{} is not supported",
                    other.name()
                ))),
            },
            LogicalPlan::Dml(dml) => {
                let (db, schema, name) = self.resolve(&dml.table_name);
                if self.catalog.snapshot().view(&db, &schema, &name).is_some() {
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
                let in_txn = self.in_transaction();
                if in_txn || dml::row_change_tag(&dml.op).is_some() {
                    let input = Arc::clone(&dml.input);
                    return self
                        .execute_dml(&dml, tag, (db, schema, name.clone()), in_txn)
                        .await
                        .map_err(|e| name_not_null_column(e, &input, &name));
                }
                let input = Arc::clone(&dml.input);
                let count = self
                    .run_for_count(LogicalPlan::Dml(dml))
                    .await
                    .map_err(|e| name_not_null_column(e, &input, &name))?;
                Ok(Outcome::command(if tag == "TRUNCATE TABLE" {
                    tag.to_string()
                } else {
                    format!("{tag} {count}")
                }))
            }
            LogicalPlan::Copy(_) => {
                let count = self.run_for_count(plan).await?;
                Ok(Outcome::command(format!("COPY {count}")))
            }
            LogicalPlan::Statement(
                statement @ (Statement::SetVariable(_)
                | Statement::ResetVariable(_)
                | Statement::Prepare(_)
                | Statement::Deallocate(_)),
            ) => {
                let tag = match statement {
                    Statement::ResetVariable(_) => "RESET",
                    Statement::Prepare(_) => "PREPARE",
                    Statement::Deallocate(_) => "DEALLOCATE",
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
                let frame = self.ctx.execute_logical_plan(plan).await?;
                Ok(Outcome::Rows(frame.execute_stream().await?))
            }
        }
    }

    /// Run a row-changing statement: commit it at once, or inside an open
    /// transaction take it into the transaction.
    async fn execute_dml(
        &self,
        dml: &datafusion::logical_expr::DmlStatement,
        tag: &str,
        (db, schema, name): (String, String, String),
        in_txn: bool,
    ) -> Result<Outcome> {
        let prepared = dml::prepare(self, dml, tag).await?;
        let outcome = Outcome::command(dml::tag_of(tag, prepared.count));
        if !in_txn {
            if !prepared.change.is_empty() {
                prepared.change.commit(prepared.operation).await?;
            }
            return Ok(outcome);
        }
        let location = self
            .catalog
            .snapshot()
            .table(&db, &schema, &name)
            .map(|entry| entry.location.clone())
            .ok_or_else(|| {
                CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("relation \"{name}\" does not exist"),
                )
            })?;
        let changes_rows = !matches!(
            prepared.operation,
            deltalake::protocol::DeltaOperation::Write {
                mode: deltalake::protocol::SaveMode::Append,
                ..
            }
        );
        let Some(txn) = self.take_txn() else {
            prepared.change.discard().await;
            return Err(CirroError::internal(
                "the transaction ended during a statement",
            ));
        };
        // Put the transaction back even if this future is dropped part-way
        // (a cancelled statement): then it is marked failed, not lost.
        let mut held = HeldTransaction {
            engine: self,
            txn: Some(txn),
        };
        let staged = match held.txn.as_mut() {
            Some(txn) => {
                txn.stage(&location, &name, prepared.change, changes_rows)
                    .await
            }
            None => Err(CirroError::internal(
                "the transaction ended during a statement",
            )),
        };
        if let Some(txn) = held.txn.take() {
            self.put_txn(txn);
        }
        let view = staged?;
        self.session.set(&location, view);
        Ok(outcome)
    }

    /// Run a plan whose result is one `count` row, and return the count.
    async fn run_for_count(&self, plan: LogicalPlan) -> Result<u64> {
        let frame = self.ctx.execute_logical_plan(plan).await?;
        let mut stream = frame.execute_stream().await?;
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

    /// Load `batches` into a new table `schema_name.name` of the current
    /// database: all rows or nothing. With `replace`, an existing table of that
    /// name is replaced atomically; without it, an existing table gives 42P07.
    pub async fn load_table<S>(
        &self,
        schema_name: &str,
        name: &str,
        table_schema: &arrow::datatypes::Schema,
        batches: S,
        replace: bool,
    ) -> Result<u64>
    where
        S: futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin,
    {
        self.catalog.refresh().await?;
        let db = self.default_database();
        ddl::create_with_data(
            self,
            &db,
            schema_name,
            name,
            table_schema,
            &cirro_storage::TableOptions::default(),
            Some(batches),
            replace,
        )
        .await
    }

    /// Fail with 42P07 if any of `names` exists in `schema_name` (and 3F000 if
    /// the schema does not exist), unless `replace`.
    pub async fn check_new_tables(
        &self,
        schema_name: &str,
        names: &[&str],
        replace: bool,
    ) -> Result<()> {
        let snapshot = self.catalog.refresh().await?;
        let schema = snapshot.schema(&self.default_database(), schema_name)?;
        for name in names {
            if schema.views.contains_key(*name) || schema.tables.contains_key(*name) && !replace {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{name}\" already exists (use --replace to replace it)"),
                ));
            }
        }
        Ok(())
    }

    /// Stream the rows of a delimited text file with the given column types
    /// (dbgen `.tbl` files with a trailing delimiter included).
    pub async fn read_delimited(
        &self,
        path: &str,
        table_schema: &arrow::datatypes::Schema,
        delimiter: u8,
        header: bool,
    ) -> Result<impl futures::Stream<Item = Result<arrow::array::RecordBatch>> + Unpin + use<>>
    {
        let frame = copy::read_delimited(self, path, table_schema, delimiter, header).await?;
        Ok(frame
            .execute_stream()
            .await?
            .map(|b| b.map_err(CirroError::from)))
    }

    /// Resolve a (possibly qualified) name against the session defaults.
    pub(crate) fn resolve(
        &self,
        name: &datafusion::common::TableReference,
    ) -> (String, String, String) {
        let state = self.ctx.state();
        let options = state.config().options();
        let resolved = name.clone().resolve(
            &options.catalog.default_catalog,
            &options.catalog.default_schema,
        );
        (
            resolved.catalog.to_string(),
            resolved.schema.to_string(),
            resolved.table.to_string(),
        )
    }

    pub(crate) fn default_database(&self) -> String {
        self.ctx
            .state()
            .config()
            .options()
            .catalog
            .default_catalog
            .clone()
    }
}
