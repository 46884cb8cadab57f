//! The Cirro SQL engine of one session: a DataFusion session over the Cirro
//! catalog, and the one statement handler every front end calls (the
//! PostgreSQL and Flight SQL servers, the `cirro sql` shell).
//!
//! ```text
//!  text ─► Engine::parse (cirro-sql: parsed once into a Statement)
//!       ─► Engine::run(parsed)                    one statement, no parameters
//!       ─► Engine::prepare(parsed) ─► Engine::execute_prepared(prepared, values)
//!  run / execute_prepared, for each kind:
//!     Transaction  BEGIN/COMMIT/ROLLBACK/savepoints → txn.rs (state machine)
//!     Setting      SET/SHOW/RESET                    → settings.rs
//!     Access       users and grants                  → access.rs
//!     Maintenance  DESCRIBE HISTORY/OPTIMIZE/VACUUM/ANALYZE  → maintenance.rs, history.rs, analyze.rs
//!     Copy         COPY FROM file / TO STDOUT         → copy.rs
//!     Sql          AS OF resolved on the AST (time_travel.rs), then planned once:
//!         CREATE/DROP DATABASE, CREATE VIEW, CREATE TABLE … WITH → ddl.rs / views.rs
//!         CREATE/DROP TABLE, SCHEMA, VIEW (DDL plans)             → ddl.rs / views.rs
//!         ALTER TABLE                                              → alter.rs
//!         DELETE, UPDATE, MERGE, DML in a transaction             → dml.rs
//!         SELECT, INSERT, EXPLAIN, COPY TO file, …                 → DataFusion executes
//! ```
//!
//! Every statement refreshes the catalog first, so a session sees what other
//! processes committed; every change is one atomic commit (see
//! `cirro-catalog`). Results are one type, [`Outcome`]: rows as an Arrow
//! stream, or a command tag with an optional notice and settings to report.

mod access;
pub mod activity;
mod alter;
mod analyze;
mod constraints;
mod copy;
mod copy_text;
mod ddl;
mod dml;
mod explain;
mod functions;
mod history;
mod indexes;
mod maintenance;
mod pg_compat;
mod prepared;
mod queries;
mod settings;
mod storage;
pub mod system;
mod time_travel;
mod txn;
mod views;
pub mod visibility;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cirro_catalog::{Catalog, CirroCatalogList, DEFAULT_DATABASE, DEFAULT_SCHEMA, SessionTables};
use cirro_common::{CirroError, Result, SqlState};
use cirro_exec::resources::SessionMemory;
use cirro_sql::{CopyStatement, Parsed, Statement as CirroStatement, TransactionStatement};
use cirro_storage::StorageRoot;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement, WriteOp};
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, ObjectType, ShowCreateObject, Statement as SqlStatement,
};
use futures::StreamExt;

pub use access::bootstrap_superuser;
pub use cirro_sql::{
    CopyIn, CopyOutSource, SettingStatement, TextFormat, is_complete, split_statements,
};
pub use copy_text::encode_row;
pub use prepared::{NUMERIC_AT_BIND, Prepared};
pub use settings::SERVER_VERSION;
pub use storage::TableStorage;

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
    /// How the process was started (`--data`, `--pg-port`, …): shown by
    /// `SHOW cirro.<name>` and `SHOW ALL`, read-only.
    pub flags: Arc<Vec<Flag>>,
    /// A cluster node's distributed execution (none on a single node).
    pub distribution: Option<Arc<dyn cirro_exec::distribution::Distribution>>,
}

/// One command-line flag of the process, as a read-only setting.
#[derive(Clone, Debug)]
pub struct Flag {
    /// The setting's name (`cirro.pg_port`).
    pub name: &'static str,
    pub value: String,
    pub description: &'static str,
}

/// What a statement produced.
pub enum Outcome {
    /// Rows of a query, streamed.
    Rows(SendableRecordBatchStream),
    /// A command's tag (`CREATE TABLE`, `INSERT 0 5`, …), with a notice if
    /// any, and the settings whose new values the client should be told
    /// (PostgreSQL's ParameterStatus: `(name, value)`).
    Command {
        tag: String,
        notice: Option<String>,
        reports: Vec<(String, String)>,
    },
}

impl Outcome {
    fn command(tag: impl Into<String>) -> Self {
        Outcome::Command {
            tag: tag.into(),
            notice: None,
            reports: vec![],
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
            reports: vec![],
        }
    }
}

/// A session's counts of parser runs and plannings (`SHOW cirro.parses`,
/// `SHOW cirro.plans`): tests assert with them that a statement is parsed
/// once and a prepared statement planned once.
#[derive(Debug, Default)]
struct Counters {
    parses: AtomicU64,
    plans: AtomicU64,
}

/// DataFusion's and Cirro's physical optimizer rules, the hot-data tier's
/// last: it wraps the scans the others have settled. A cluster node's scans
/// are sent to other nodes as DataFusion's own Parquet scans: there the
/// tier is not used (yet).
fn physical_rules(
    distributed: bool,
) -> Vec<Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = cirro_exec::rules::physical_optimizer_rules();
    if !distributed {
        // Radix partitions are planned for one node's threads.
        rules.push(Arc::new(cirro_exec::rules::AdaptiveAggregation));
        // GPU twins of the operators (`SET gpu`), before the rules that
        // rewrite filters for the CPU (compiled and selective conjuncts),
        // and before the tier's: a scan under a GPU filter drops no rows
        // (the device's column cache is keyed by the tier's batches).
        #[cfg(feature = "gpu")]
        rules.push(Arc::new(cirro_gpu::GpuOperators));
        rules.push(Arc::new(cirro_storage::cache::CacheScans::new(Arc::clone(
            cirro_storage::cache::global(),
        ))));
        // Last: the compiled expressions keep their interpreted ones as
        // children only, and DataFusion's codec cannot send them.
        rules.push(Arc::new(cirro_exec::rules::CompileExpressions));
        // Over the compiled conjuncts; not sent either.
        rules.push(Arc::new(cirro_exec::rules::SelectiveConjuncts));
        // Over the compiled expressions and the ordered conjuncts.
        rules.push(Arc::new(cirro_exec::rules::FuseFilterAggregate));
        // Hash joins that spill; after the rules that rewrite hash joins.
        rules.push(Arc::new(cirro_exec::rules::SpillingJoins));
        // After every rewrite: it shares subtrees that print alike.
        rules.push(Arc::new(cirro_exec::rules::SharedSubplans));
    }
    rules
}

/// 42P02 for a `$n` where the statement cannot take parameters.
/// The bucketing of a scan of a Cirro table, for the planning rule that
/// joins co-located tables first ([`cirro_exec::rules::CoLocatedJoinsFirst`]).
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

fn no_parameter(n: usize) -> CirroError {
    CirroError::new(
        SqlState::UNDEFINED_PARAMETER,
        format!("there is no parameter ${n}"),
    )
}

/// Whether `statement` ends a transaction (the only statements a failed
/// transaction accepts).
fn ends_transaction(statement: &CirroStatement) -> bool {
    matches!(
        statement,
        CirroStatement::Transaction(
            TransactionStatement::Commit { .. }
                | TransactionStatement::Rollback { .. }
                | TransactionStatement::RollbackTo(_)
        )
    )
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

/// 08006 for a query a node failed (see [`Engine::query`]).
fn node_failure(e: &datafusion::error::DataFusionError) -> CirroError {
    CirroError::new(
        SqlState::CONNECTION_FAILURE,
        format!("a node of the cluster failed during the query; try again: {e}"),
    )
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

/// DESCRIBE's rows: each column's name, SQL type (DataFusion shows Arrow's
/// type names, Utf8View, Decimal128(8, 2)) and nullability; a bucketed
/// table's distribution as a last row (`DISTRIBUTED BY`, `HASH (…) BUCKETS n`).
fn describe_batch(
    describe: &datafusion::logical_expr::DescribeTable,
    distribution: Option<&cirro_storage::options::Distribution>,
) -> Result<arrow::array::RecordBatch> {
    let fields = describe.schema.fields();
    let mut names: Vec<String> = fields.iter().map(|f| f.name().clone()).collect();
    let mut types: Vec<String> = fields
        .iter()
        .map(|f| cirro_storage::schema::sql_type_name(f.data_type()))
        .collect();
    let mut nullable: Vec<String> = fields
        .iter()
        .map(|f| if f.is_nullable() { "YES" } else { "NO" }.to_string())
        .collect();
    if let Some(distribution) = distribution {
        names.push("DISTRIBUTED BY".into());
        types.push(
            distribution
                .definition()
                .trim_start_matches("DISTRIBUTED BY ")
                .to_string(),
        );
        nullable.push(String::new());
    }
    Ok(arrow::array::RecordBatch::try_new(
        Arc::new(describe.output_schema.as_arrow().clone()),
        vec![
            Arc::new(arrow::array::StringArray::from(names)),
            Arc::new(arrow::array::StringArray::from(types)),
            Arc::new(arrow::array::StringArray::from(nullable)),
        ],
    )?)
}

/// The engine of one session: one catalog, one DataFusion session.
pub struct Engine {
    catalog: Arc<Catalog>,
    /// The session's view of the databases (DataFusion's catalog list).
    catalogs: Arc<CirroCatalogList>,
    ctx: SessionContext,
    /// Tables pinned by the open transaction, if any.
    session: Arc<SessionTables>,
    /// The transaction (see `txn.rs`).
    txn: std::sync::Mutex<txn::TxnState>,
    /// The user the session runs as; None for the local shell (see `access`).
    user: Option<String>,
    /// The session's changes to the PostgreSQL settings.
    settings: settings::Settings,
    counters: Counters,
    flags: Arc<Vec<Flag>>,
    /// The cluster's distributed execution, on a cluster node.
    distribution: Option<Arc<dyn cirro_exec::distribution::Distribution>>,
    /// Statements PREPAREd in SQL, by name.
    sql_prepared: std::sync::Mutex<std::collections::HashMap<String, Arc<Prepared>>>,
    /// The session's entry in the server's registry (none in the shell).
    backend: Arc<std::sync::OnceLock<activity::Backend>>,
    /// The session's memory pool: each statement's own pool in the
    /// server's budget (see `cirro_exec::resources`).
    memory: Arc<SessionMemory>,
    /// The record of the statement it runs (see `queries`).
    current_query: queries::QuerySlot,
}

/// A session's DataFusion runtime: the process's (or `shared`'s) caches,
/// object stores and spill area, with a memory pool of the session's own.
fn session_runtime(shared: Option<&Arc<RuntimeEnv>>) -> (Arc<RuntimeEnv>, Arc<SessionMemory>) {
    let resources = cirro_exec::resources::global();
    let memory = Arc::new(SessionMemory::new(Arc::clone(resources.budget())));
    let mut runtime = match shared {
        Some(runtime) => RuntimeEnv::clone(runtime),
        None => RuntimeEnv::default(),
    };
    runtime.memory_pool = Arc::clone(&memory) as _;
    match resources.spill() {
        Ok(area) => runtime.disk_manager = Arc::clone(area.disk_manager()),
        Err(e) => log::warn!("no spill area, queries spill to DataFusion's default: {e}"),
    }
    (Arc::new(runtime), memory)
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
        // Numbers with a decimal point or an exponent are NUMERIC, as in
        // PostgreSQL (`0.1 + 0.2 = 0.3`), not binary floats.
        session_config
            .options_mut()
            .sql_parser
            .parse_float_as_decimal = true;
        // The hot-data tier's session switch (`SET cache`).
        session_config =
            session_config.with_option_extension(cirro_storage::cache::CacheOptions::default());
        // Adaptive aggregation's switches (`SET adaptive_aggregation`).
        session_config = session_config
            .with_option_extension(cirro_exec::rules::AggregationOptions::default())
            .with_option_extension(cirro_exec::rules::JitOptions::default())
            .with_option_extension(cirro_exec::rules::JoinOrderOptions::default());
        #[cfg(feature = "gpu")]
        {
            session_config = session_config.with_option_extension(cirro_gpu::GpuOptions::default());
        }
        if let Some(partitions) = config.target_partitions {
            session_config = session_config.with_target_partitions(partitions.max(1));
        }
        let mut builder = SessionStateBuilder::new()
            .with_config(session_config)
            .with_default_features()
            .with_type_planner(Arc::new(cirro_sql::PgTypes))
            .with_analyzer_rules(cirro_exec::rules::analyzer_rules());
        if let Some(functions) = builder.aggregate_functions() {
            cirro_exec::functions::replace_udafs(functions);
        }
        if config.distribution.is_none() {
            // On a cluster the co-located joins decide the order.
            builder = builder.with_optimizer_rule(Arc::new(cirro_exec::rules::ReorderJoins::new(
                scan_rows,
                scan_keys,
                scan_range,
                scan_buckets,
            )));
        }
        let mut builder = builder
            .with_optimizer_rule(Arc::new(cirro_exec::rules::CoLocatedJoinsFirst::new(
                scan_buckets,
            )))
            .with_physical_optimizer_rules(physical_rules(config.distribution.is_some()))
            .with_catalog_list(list.clone());
        let (runtime, memory) = session_runtime(config.runtime.as_ref());
        builder = builder.with_runtime_env(runtime);
        if let Some(distribution) = &config.distribution {
            builder = distribution.configure(builder);
        }
        let current_query = queries::QuerySlot::default();
        builder = builder.with_physical_optimizer_rule(Arc::new(queries::RecordPlan(Arc::clone(
            &current_query,
        ))));
        let state = builder.build();
        let superuser = access::SuperuserCheck::new(Arc::clone(&catalog), user.clone());
        let ctx =
            functions::enable_url_tables(SessionContext::new_with_state(state), superuser.clone());
        // Data files are read through the data location's store (a bucket's
        // for s3://; local files are known to DataFusion already).
        let root = catalog.root();
        if root.url().scheme() != "file" {
            ctx.register_object_store(root.url(), Arc::clone(root.store()));
        }
        functions::register(&ctx, &superuser);
        for udf in cirro_exec::functions::sized::sized_udfs(&memory) {
            ctx.register_udf(udf);
        }
        functions::register_identity(
            &ctx,
            &functions::session_user_name(user.as_deref()),
            config.database.as_deref().unwrap_or(DEFAULT_DATABASE),
        );
        list.set_view_planner(Arc::new(views::SessionViewPlanner::for_context(&ctx)));
        let backend: Arc<std::sync::OnceLock<activity::Backend>> = Default::default();
        // The system schemas are shared by every database of the session.
        let any_database = catalog.snapshot().databases.keys().next().cloned();
        if let Some(provider) = any_database.and_then(|db| ctx.catalog(&db)) {
            let _ = provider.register_schema(
                system::SYSTEM_SCHEMA,
                Arc::new(system::SystemSchema {
                    catalog: Arc::clone(&catalog),
                    backend: Arc::clone(&backend),
                    viewer: visibility::StatementViewer::new(Arc::clone(&catalog), user.clone()),
                }),
            );
        }
        let engine = Self {
            catalog,
            catalogs: list,
            ctx,
            session,
            txn: std::sync::Mutex::new(txn::TxnState::Idle),
            user,
            settings: settings::Settings::default(),
            counters: Counters::default(),
            flags: Arc::clone(&config.flags),
            distribution: config.distribution.clone(),
            sql_prepared: Default::default(),
            backend,
            memory,
            current_query,
        };
        engine.apply_user_settings();
        engine
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Parse one statement (see `cirro_sql::parse`); the session counts the
    /// parser runs.
    /// A statement that does not parse fails the open transaction when its
    /// error is reported (by the caller, or by [`Engine::execute`]).
    pub fn parse(&self, sql: &str) -> Result<Parsed> {
        let parsed = cirro_sql::parse(sql)?;
        self.counters
            .parses
            .fetch_add(parsed.parses, Ordering::Relaxed);
        Ok(parsed)
    }

    /// Parse and run one statement (no terminating semicolon needed).
    ///
    /// The future is boxed (and `Send`), so servers can hold it across
    /// their own generic async code.
    pub fn execute<'a>(&'a self, sql: &'a str) -> futures::future::BoxFuture<'a, Result<Outcome>> {
        Box::pin(async move {
            let parsed = self.parse(sql).inspect_err(|_| self.fail_transaction())?;
            self.run(parsed).await
        })
    }

    /// Run one parsed statement without parameters: the handler behind the
    /// shell, the PostgreSQL simple query protocol and Flight SQL statements.
    /// An error fails the open transaction.
    pub fn run(&self, parsed: Parsed) -> futures::future::BoxFuture<'_, Result<Outcome>> {
        Box::pin(async move {
            let admit = queries::needs_admission(self, &parsed.statement);
            let result = self
                .tracked(
                    admit,
                    self.run_statement(parsed.statement, parsed.placeholders),
                )
                .await;
            if result.is_err() {
                self.fail_transaction();
            }
            result
        })
    }

    async fn run_statement(
        &self,
        statement: CirroStatement,
        placeholders: usize,
    ) -> Result<Outcome> {
        if self.transaction_aborted() && !ends_transaction(&statement) {
            return Err(txn::aborted());
        }
        let prepare_sql = matches!(statement.sql(), Some(SqlStatement::Prepare { .. }));
        if placeholders > 0 && !prepare_sql {
            return Err(no_parameter(1));
        }
        self.catalog.refresh().await?;
        if let Some(SqlStatement::Prepare {
            name,
            data_types,
            statement,
        }) = statement.sql()
        {
            return self
                .prepare_sql(name, data_types, statement.as_ref().clone(), placeholders)
                .await;
        }
        if matches!(statement.sql(), Some(SqlStatement::Execute { .. })) {
            return self.execute_sql(&statement).await;
        }
        match statement {
            CirroStatement::Empty => Ok(Outcome::command("")),
            CirroStatement::Transaction(statement) => self.run_transaction(statement).await,
            CirroStatement::Setting(statement) => self.run_setting(statement).await,
            CirroStatement::Access(statement) => {
                self.check_transaction_allows("CREATE/ALTER/DROP USER, GRANT and REVOKE")?;
                self.execute_access(statement).await
            }
            CirroStatement::Maintenance(statement) => {
                maintenance::run_maintenance(self, statement).await
            }
            CirroStatement::Copy(CopyStatement::FromFile(copy)) => {
                self.require_superuser("COPY … FROM a file on the server")?;
                copy::copy_from(self, copy).await
            }
            CirroStatement::Copy(CopyStatement::ToFile(copy)) => {
                self.require_superuser("COPY … TO a file on the server")?;
                copy::copy_to(self, copy).await
            }
            CirroStatement::Copy(CopyStatement::FromStdin(_)) => Err(CirroError::unsupported(
                "COPY FROM STDIN needs a client connection (cirro serve, psql's \\copy)",
            )),
            CirroStatement::Copy(CopyStatement::ToStdout { source, .. }) => {
                copy::copy_out(self, source).await
            }
            CirroStatement::Deallocate(None) => {
                self.forget_all_prepared();
                Ok(Outcome::command("DEALLOCATE ALL"))
            }
            CirroStatement::Deallocate(Some(name)) => {
                if self.forget_prepared(&name) {
                    Ok(Outcome::command("DEALLOCATE"))
                } else {
                    Err(CirroError::new(
                        SqlState::INVALID_SQL_STATEMENT_NAME,
                        format!("prepared statement \"{name}\" does not exist"),
                    ))
                }
            }
            CirroStatement::CreateDistributed {
                create,
                distributed_by,
            } => {
                let create = match *create {
                    DfStatement::Statement(inner) => match *inner {
                        SqlStatement::CreateTable(create) => Some(create),
                        _ => None,
                    },
                    _ => None,
                };
                let Some(create) = create else {
                    return Err(CirroError::new(
                        SqlState::SYNTAX_ERROR,
                        "DISTRIBUTED BY belongs to CREATE TABLE",
                    ));
                };
                self.create_table_sql(&create, Some(distributed_by)).await
            }
            CirroStatement::Sql(statement) => self.run_sql(*statement).await,
        }
    }

    /// Plan a statement: SQL to a logical plan (counted, see [`Counters`]).
    /// A SELECT list whose names DataFusion cannot tell apart (`SELECT 1, 1`,
    /// `SELECT x, x::text`) is planned again with PostgreSQL's names made
    /// unique (see `cirro_sql::names`). VALUES lists nested in an INSERT's
    /// query are typed by their own values (see `cirro_sql::values`).
    pub(crate) async fn plan(&self, mut statement: DfStatement) -> Result<LogicalPlan> {
        self.counters.plans.fetch_add(1, Ordering::Relaxed);
        cirro_sql::values::detach_insert_values(&mut statement);
        // A query's columns are named as PostgreSQL names them (`?column?`).
        cirro_sql::names::name_outputs(&mut statement);
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

    /// Rows of a batch computed by the engine (SHOW, maintenance results).
    pub(crate) async fn batch_rows(&self, batch: arrow::array::RecordBatch) -> Result<Outcome> {
        let frame = self.ctx.read_batch(batch)?;
        Ok(Outcome::Rows(frame.execute_stream().await?))
    }

    /// Refuse in a transaction the DDL PostgreSQL refuses there (25001):
    /// the other DDL is the transaction's (see txn.rs).
    fn check_ddl_allowed(&self, statement: &SqlStatement) -> Result<()> {
        let what = match statement {
            SqlStatement::CreateDatabase { .. } => "CREATE DATABASE",
            SqlStatement::Drop {
                object_type: ObjectType::Database,
                ..
            } => "DROP DATABASE",
            _ => return Ok(()),
        };
        if self.in_transaction() {
            return Err(CirroError::new(
                SqlState::ACTIVE_SQL_TRANSACTION,
                format!("{what} cannot run inside a transaction block"),
            ));
        }
        Ok(())
    }

    /// `DROP TABLE|VIEW names [CASCADE]`, one relation after the other; the
    /// notices of all of them.
    async fn drop_relations(
        &self,
        views: bool,
        names: &[datafusion::sql::sqlparser::ast::ObjectName],
        if_exists: bool,
        cascade: bool,
    ) -> Result<Outcome> {
        let mut notices = Vec::new();
        let tag = if views { "DROP VIEW" } else { "DROP TABLE" };
        for name in names {
            let reference =
                datafusion::sql::planner::object_name_to_table_reference(name.clone(), true)?;
            let outcome = if views {
                views::drop_view(self, &reference, if_exists, cascade).await?
            } else {
                let (db, schema, table) = self.resolve(&reference);
                self.check_owner(&db, &schema, &table, "DROP it")?;
                ddl::drop_table(self, &reference, if_exists, cascade).await?
            };
            if let Outcome::Command {
                notice: Some(notice),
                ..
            } = outcome
            {
                notices.push(notice);
            }
        }
        Ok(if notices.is_empty() {
            Outcome::command(tag)
        } else {
            Outcome::with_notice(tag, notices.join("\n"))
        })
    }

    /// Run a statement DataFusion parsed: the DDL Cirro runs from the AST,
    /// or plan it and run the plan.
    pub(crate) async fn run_sql(&self, mut statement: DfStatement) -> Result<Outcome> {
        if let DfStatement::Statement(inner) = &statement {
            self.check_ddl_allowed(inner)?;
            match inner.as_ref() {
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
                SqlStatement::Drop {
                    object_type: object_type @ (ObjectType::Table | ObjectType::View),
                    if_exists,
                    names,
                    cascade,
                    ..
                } => {
                    return self
                        .drop_relations(
                            *object_type == ObjectType::View,
                            names,
                            *if_exists,
                            *cascade,
                        )
                        .await;
                }
                SqlStatement::CreateIndex(create) => {
                    return indexes::create_index(self, create).await;
                }
                SqlStatement::Drop {
                    object_type: ObjectType::Index,
                    if_exists,
                    names,
                    ..
                } => return indexes::drop_index(self, names, *if_exists).await,
                SqlStatement::AlterTable(alter) => return alter::alter_table(self, alter).await,
                SqlStatement::CreateTable(create) => {
                    return self.create_table_sql(create, None).await;
                }
                SqlStatement::ShowCreate {
                    obj_type: ShowCreateObject::Table,
                    obj_name,
                } => return ddl::show_create_table(self, obj_name).await,
                SqlStatement::ExplainTable { table_name, .. } => {
                    let reference = datafusion::sql::planner::object_name_to_table_reference(
                        table_name.clone(),
                        true,
                    )?;
                    // Views and system tables have no distribution.
                    let table = ddl::open_named_table(self, &reference).await.ok();
                    let plan = self.plan(statement.clone()).await?;
                    self.check_plan(&plan)?;
                    if let LogicalPlan::DescribeTable(describe) = &plan {
                        let distribution = table
                            .as_ref()
                            .and_then(|(_, t)| t.options().distribution.as_ref());
                        let batch = describe_batch(describe, distribution)?;
                        return self.batch_rows(batch).await;
                    }
                    return self.execute_plan(plan).await;
                }
                _ => {}
            }
        }
        time_travel::resolve_time_travel(self, &mut statement).await?;
        let plan = self.plan(statement).await?;
        self.check_plan(&plan)?;
        self.execute_plan(plan).await
    }

    /// CREATE TABLE: DataFusion refuses WITH (…) and does not enforce
    /// constraints: take both out, plan the rest, and create the table with
    /// them (and its distribution, if it has one).
    async fn create_table_sql(
        &self,
        create: &datafusion::sql::sqlparser::ast::CreateTable,
        distributed_by: Option<cirro_sql::DistributedBy>,
    ) -> Result<Outcome> {
        let options = ddl::table_options(&create.table_options)?;
        let mut stripped = create.clone();
        stripped.table_options = CreateTableOptions::None;
        let table_name = create
            .name
            .0
            .last()
            .and_then(|part| part.as_ident())
            .map(alter::ident_name)
            .unwrap_or_default();
        let constraints = constraints::take_from_create(&mut stripped, &table_name)?;
        let plan = self
            .plan(DfStatement::Statement(Box::new(SqlStatement::CreateTable(
                stripped,
            ))))
            .await?;
        self.check_plan(&plan)?;
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) => {
                ddl::create_table(self, cmd, &options, constraints, distributed_by).await
            }
            _ => Err(CirroError::internal(
                "CREATE TABLE planned as something else",
            )),
        }
    }

    pub(crate) async fn execute_plan(&self, plan: LogicalPlan) -> Result<Outcome> {
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
                DdlStatement::CreateMemoryTable(cmd) => {
                    ddl::create_table(self, cmd, &[], Vec::new(), None).await
                }
                DdlStatement::DropTable(cmd) => {
                    let (db, schema, name) = self.resolve(&cmd.name);
                    self.check_owner(&db, &schema, &name, "DROP it")?;
                    ddl::drop_table(self, &cmd.name, cmd.if_exists, false).await
                }
                DdlStatement::DropView(cmd) => {
                    views::drop_view(self, &cmd.name, cmd.if_exists, false).await
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
                if self.snapshot().view(&db, &schema, &name).is_some() {
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
                // Plain INSERTs commit in their sink, unless the table has
                // constraints to check before the commit.
                let constrained = matches!(dml.op, WriteOp::Insert(_))
                    && dml::target_table(&dml, tag)
                        .map(|t| t.options().has_checks())
                        .unwrap_or(false);
                if in_txn || constrained || dml::row_change_tag(&dml.op).is_some() {
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
            LogicalPlan::DescribeTable(describe) => {
                let batch = describe_batch(&describe, None)?;
                self.batch_rows(batch).await
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
            plan => self.query(plan).await,
        }
    }

    /// Run a query. On a cluster node a query that runs on several nodes
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
            let frame = self.ctx.execute_logical_plan(plan).await?;
            return Ok(Outcome::Rows(frame.execute_stream().await?));
        };
        let analyze = matches!(plan, LogicalPlan::Analyze(_));
        let mut retried = false;
        loop {
            let frame = self.ctx.execute_logical_plan(plan.clone()).await?;
            let task_ctx = Arc::new(frame.task_ctx());
            let physical = frame.create_physical_plan().await?;
            let distributed = distribution.is_distributed(&physical);
            // Forget where earlier statements' (or a failed run's) tasks ran.
            distribution.take_task_placement(task_ctx.session_config());
            let mut stream =
                datafusion::physical_plan::execute_stream(physical, Arc::clone(&task_ctx))?;
            if !distributed {
                return Ok(Outcome::Rows(stream));
            }
            let schema = stream.schema();
            let first = stream.next().await;
            if let Some(Err(e)) = &first
                && distribution.is_node_failure(e)
            {
                if !retried {
                    log::warn!("a node failed during a query; running it again: {e}");
                    retried = true;
                    distribution.forget_failed_nodes().await;
                    continue;
                }
                return Err(node_failure(e));
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
    /// line (see `explain.rs`).
    async fn explain(&self, explained: &LogicalPlan, plan: LogicalPlan) -> Result<Outcome> {
        let strategies = match self.ctx.state().create_physical_plan(explained).await {
            Ok(physical) => explain::join_strategies(&physical),
            Err(_) => Vec::new(), // EXPLAIN itself reports what fails
        };
        let frame = self.ctx.execute_logical_plan(plan).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let mut batches = frame.collect().await?;
        if !strategies.is_empty() {
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
                    .map(|t| t.map(|t| explain::mark_joins(t, &strategies)))
                    .collect();
                let mut columns = batch.columns().to_vec();
                columns[1] = Arc::new(marked);
                *batch = arrow::array::RecordBatch::try_new(batch.schema(), columns)?;
            }
        }
        let batch = arrow::compute::concat_batches(&schema, &batches)?;
        self.batch_rows(batch).await
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
        let location = match time_travel::location_of(self, &db, &schema, &name) {
            Ok(location) => location,
            Err(e) => {
                prepared.change.discard().await;
                return Err(e);
            }
        };
        let checked = prepared.change.table().options().has_checks()
            && !prepared.change.new_files().is_empty();
        // A table the transaction created is its own until COMMIT names it:
        // its changes commit there at once (see txn.rs).
        let private = in_txn && self.created_in_transaction(&location);
        if private {
            if !prepared.change.is_empty() {
                if checked {
                    let post = prepared.change.apply()?;
                    if let Err(e) =
                        constraints::check(self, &name, &post, prepared.change.new_files()).await
                    {
                        prepared.change.discard().await;
                        return Err(e);
                    }
                }
                prepared.change.commit(prepared.operation).await?;
            }
            let table = self.catalog.open_table(&location).await?;
            self.session.set(&location, table);
            return Ok(outcome);
        }
        if !in_txn {
            if prepared.change.is_empty() {
                return Ok(outcome);
            }
            if !checked {
                prepared.change.commit(prepared.operation).await?;
                return Ok(outcome);
            }
            // Check and commit under the table's write lock (see constraints.rs).
            let locked_and_checked = async {
                let held = self.catalog.lock_table_writes(&location).await?;
                let latest = self.catalog.open_table(&location).await?;
                let post = prepared.change.apply_to(&latest)?;
                constraints::check(self, &name, &post, prepared.change.new_files()).await?;
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
            prepared.change.commit(prepared.operation).await?;
            return Ok(outcome);
        }
        if checked {
            // In a transaction: against its view; COMMIT checks again.
            let verdict = async {
                let view = prepared.change.apply()?;
                constraints::check(self, &name, &view, prepared.change.new_files()).await
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
        let Some(mut held) = self.hold_transaction() else {
            prepared.change.discard().await;
            return Err(CirroError::internal(
                "the transaction ended during a statement",
            ));
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
        let view = staged?;
        held.put_back();
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
    /// The loaded table is then analyzed (`ANALYZE`).
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
        let rows = ddl::create_with_data(
            self,
            &db,
            schema_name,
            name,
            table_schema,
            &cirro_storage::TableOptions::default(),
            Some(batches),
            replace,
        )
        .await?;
        // The planner's estimates (join order) read the statistics; the
        // table is loaded whether or not they could be taken.
        if let Err(e) = analyze::analyze_table(self, &db, schema_name, name).await {
            log::warn!("ANALYZE {schema_name}.{name} after loading it failed: {e}");
        }
        Ok(rows)
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

/// Set the GPU's device-memory budget (`--gpu-memory`) and replacement
/// policy (`--gpu-policy`: cdr, lru, mru, lfu or random) before the first
/// query; without the `gpu` feature only the policy's name is checked.
pub fn configure_gpu(budget: u64, policy: &str) -> Result<()> {
    let bad = |e: String| CirroError::new(SqlState::INVALID_PARAMETER_VALUE, e);
    #[cfg(feature = "gpu")]
    {
        let policy: cirro_gpu::Policy = policy.parse().map_err(bad)?;
        cirro_gpu::configure(budget, policy);
    }
    #[cfg(not(feature = "gpu"))]
    {
        let _ = budget;
        if !["cdr", "lru", "mru", "lfu", "random"].contains(&policy.to_ascii_lowercase().as_str()) {
            return Err(bad(format!("unknown replacement policy {policy:?}")));
        }
    }
    Ok(())
}
