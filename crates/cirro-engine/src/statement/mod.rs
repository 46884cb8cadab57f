//! Running one statement: the one dispatch on its kind ([`Engine::run`]),
//! then one executor per kind.
//!
//! ```text
//!  Query, Explain, Insert, Update/Delete/Merge, Truncate, Show, COPY … STORED AS
//!                       → query.rs: AS OF resolved (time_travel.rs), planned
//!                         once, the plan run (DML through dml.rs)
//!  CreateTable, Drop, CreateDatabase/Schema → ddl.rs   Describe, SHOW CREATE → describe.rs
//!  CreateView → views.rs   CreateIndex → indexes.rs   AlterTable → alter.rs
//!  Copy → copy.rs (COPY text: copy_text.rs)   Access → access.rs
//!  Maintenance → maintenance.rs, history.rs, analyze.rs
//!  Transaction → session/txn.rs   Setting → session/settings.rs
//!  Prepare, Execute, Deallocate → session/prepared.rs
//! ```
//!
//! Every statement refreshes the catalog first, so a session sees what other
//! processes committed; every change is one atomic commit (see
//! `cirro-catalog`). Results are one type, [`Outcome`]: rows as an Arrow
//! stream, or a command tag with an optional notice and settings to report.

pub(crate) mod access;
pub(crate) mod alter;
pub(crate) mod analyze;
pub(crate) mod by_key;
pub(crate) mod constraints;
pub(crate) mod copy;
pub(crate) mod copy_text;
pub(crate) mod ddl;
pub(crate) mod describe;
pub(crate) mod dml;
pub(crate) mod explain;
pub(crate) mod history;
pub(crate) mod indexes;
mod load;
pub(crate) mod maintenance;
pub(crate) mod point;
mod prerun;
pub(crate) mod query;
pub(crate) mod time_travel;
pub(crate) mod views;
mod write;

use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{Parsed, Statement};
use datafusion::execution::SendableRecordBatchStream;

use crate::Engine;
use crate::session::txn;
use crate::system::queries;

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
    pub(crate) fn command(tag: impl Into<String>) -> Self {
        Outcome::Command {
            tag: tag.into(),
            notice: None,
            reports: vec![],
        }
    }

    pub(crate) fn with_notice(tag: impl Into<String>, notice: impl Into<String>) -> Self {
        Self::skipped_if(tag, true, notice)
    }

    /// This outcome with `notice` added after any it has (a command's; rows
    /// have none).
    pub(crate) fn and_notice(self, notice: String) -> Self {
        match self {
            Outcome::Command {
                tag,
                notice: before,
                reports,
            } => Outcome::Command {
                tag,
                notice: Some(match before {
                    Some(before) => format!("{before}\n{notice}"),
                    None => notice,
                }),
                reports,
            },
            rows => rows,
        }
    }

    /// `tag`, with `notice` when the statement did nothing (IF [NOT] EXISTS).
    pub(crate) fn skipped_if(
        tag: impl Into<String>,
        skipped: bool,
        notice: impl Into<String>,
    ) -> Self {
        Outcome::Command {
            tag: tag.into(),
            notice: skipped.then(|| notice.into()),
            reports: vec![],
        }
    }
}

/// 42P02 for a `$n` where the statement cannot take parameters.
pub(crate) fn no_parameter(n: usize) -> CirroError {
    CirroError::new(
        SqlState::UNDEFINED_PARAMETER,
        format!("there is no parameter ${n}"),
    )
}

impl Engine {
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
            self.session.end_statement();
            if result.is_err() {
                self.fail_transaction();
            }
            result
        })
    }

    /// The one dispatch: a statement to the executor of its kind.
    /// `TRUNCATE a, b, …`: every table or none, as one transaction (the
    /// open one, or one of its own). DataFusion plans one table.
    async fn truncate_tables(
        &self,
        truncate: datafusion::sql::sqlparser::ast::Truncate,
    ) -> Result<Outcome> {
        let own = !self.in_transaction();
        if own {
            self.run_transaction(cirro_sql::TransactionStatement::Begin(Default::default()))
                .await?;
        }
        for target in &truncate.table_names {
            let mut one = truncate.clone();
            one.table_names = vec![target.clone()];
            if let Err(e) = self.run_planned(&Statement::Truncate(Box::new(one))).await {
                if own {
                    self.end_transaction(false).await?;
                }
                return Err(e);
            }
        }
        if own {
            self.end_transaction(true).await?;
        }
        Ok(Outcome::command("TRUNCATE TABLE"))
    }

    pub(crate) async fn run_statement(
        &self,
        statement: Statement,
        placeholders: usize,
    ) -> Result<Outcome> {
        if self.transaction_aborted() && !statement.ends_transaction() {
            return Err(txn::aborted());
        }
        if placeholders > 0 && !matches!(statement, Statement::Prepare { .. }) {
            return Err(no_parameter(1));
        }
        self.check_read_only(&statement)?;
        self.catalog.refresh().await?;
        self.session.start_statement(&self.catalog);
        match statement {
            Statement::Empty => Ok(Outcome::command("")),
            Statement::Truncate(truncate) if truncate.table_names.len() > 1 => {
                self.truncate_tables(*truncate).await
            }
            Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::Insert(_)
            | Statement::Update(_)
            | Statement::Delete(_)
            | Statement::Merge(_)
            | Statement::Truncate(_)
            | Statement::Show(_)
            | Statement::DataFusionSetting(_)
            | Statement::CopyStored(_) => self.run_planned(&statement).await,
            Statement::CreateTable {
                create,
                distributed_by,
            } => ddl::create_table_sql(self, &create, distributed_by).await,
            Statement::CreateView(view) => views::create_view(self, &view).await,
            Statement::CreateIndex(create) => {
                self.flush_row_stores("CREATE INDEX").await?;
                indexes::create_index(self, &create).await
            }
            Statement::AlterTable(alter) => {
                self.flush_row_stores("ALTER TABLE").await?;
                alter::alter_table(self, &alter).await
            }
            Statement::Drop(drop) => ddl::drop_objects(self, &drop).await,
            Statement::CreateDatabase {
                name,
                if_not_exists,
            } => ddl::create_database_sql(self, &name, if_not_exists).await,
            ref schema @ Statement::CreateSchema { .. } => {
                ddl::create_schema_sql(self, schema).await
            }
            Statement::Describe(ref table) => describe::describe(self, &statement, table).await,
            Statement::ShowCreateTable(name) => describe::show_create_table(self, &name).await,
            Statement::Copy(copy) => {
                // COPY … TO reads, as a query does.
                if !matches!(
                    copy,
                    cirro_sql::CopyStatement::ToFile(_) | cirro_sql::CopyStatement::ToStdout { .. }
                ) {
                    self.flush_row_stores("COPY").await?;
                }
                copy::run_copy(self, copy).await
            }
            Statement::Setting(statement) => self.run_setting(statement).await,
            Statement::Access(statement) => {
                self.check_transaction_allows("CREATE/ALTER/DROP USER, GRANT and REVOKE")?;
                self.execute_access(statement).await
            }
            Statement::Maintenance(statement) => {
                self.flush_row_stores("VACUUM or OPTIMIZE").await?;
                maintenance::run_maintenance(self, statement).await
            }
            Statement::Transaction(statement) => self.run_transaction(statement).await,
            Statement::Prepare {
                name,
                data_types,
                statement,
            } => {
                self.prepare_sql(&name, &data_types, *statement, placeholders)
                    .await
            }
            Statement::Execute { name, parameters } => self.execute_sql(&name, &parameters).await,
            Statement::Deallocate(name) => self.deallocate(name),
            Statement::Unsupported(why) => Err(CirroError::unsupported(why)),
        }
    }
}
