//! Cirro's statement: one variant per kind of statement, each holding its
//! own kind's parsed form. A statement's text is parsed into it once
//! ([`crate::parse`]); everything after works on this value, and what the
//! engine asks of a statement before running it (is it DDL, does it wait for
//! admission, does a prepared form keep its plan, does it return rows) is
//! answered here, in one place.
//!
//! The kinds DataFusion plans (queries, DML, CREATE TABLE AS, …) give their
//! statement back in DataFusion's form with [`Statement::to_datafusion`].

use datafusion::sql::parser::{CopyToStatement, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{
    AlterTable, CreateIndex, CreateTable, CreateView, DataType, Delete, DescribeAlias, Expr,
    Insert, Merge, ObjectName, ObjectType, Query, SchemaName, Statement as SqlStatement, Truncate,
    Update,
};

pub use crate::parsers::access::{AccessStatement, UserOptions};
pub use crate::parsers::copy::{
    CopyFrom, CopyIn, CopyOutSource, CopyStatement, CopyTo, FileFormat, TextFormat,
};
pub use crate::parsers::maintenance::Maintenance;
pub use crate::parsers::setting::SettingStatement;
pub use crate::parsers::transaction::{Isolation, TransactionModes, TransactionStatement};

#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// Nothing but whitespace and comments.
    Empty,
    /// SELECT, VALUES, WITH …, TABLE t.
    Query(Box<Query>),
    /// EXPLAIN [ANALYZE] [VERBOSE] of a statement, as DataFusion parsed it
    /// (its own EXPLAIN, or sqlparser's `DESCRIBE SELECT …`).
    Explain {
        analyze: bool,
        explain: Box<DfStatement>,
    },
    Insert(Box<Insert>),
    Update(Box<Update>),
    Delete(Box<Delete>),
    Merge(Box<Merge>),
    Truncate(Box<Truncate>),
    /// CREATE TABLE [AS …], with Cirro's `DISTRIBUTED BY HASH (…) BUCKETS n`
    /// when written.
    CreateTable {
        create: Box<CreateTable>,
        distributed_by: Option<DistributedBy>,
    },
    CreateView(Box<CreateView>),
    CreateIndex(Box<CreateIndex>),
    AlterTable(Box<AlterTable>),
    /// DROP TABLE|VIEW|INDEX|SCHEMA|DATABASE|… names.
    Drop(Drop),
    CreateDatabase {
        name: ObjectName,
        if_not_exists: bool,
    },
    CreateSchema {
        name: SchemaName,
        if_not_exists: bool,
    },
    /// `DESCRIBE t`.
    Describe(ObjectName),
    /// `SHOW CREATE TABLE t`.
    ShowCreateTable(ObjectName),
    /// SHOW TABLES, COLUMNS, FUNCTIONS and of `datafusion.*` settings:
    /// DataFusion answers them from the catalog and its settings.
    Show(Box<SqlStatement>),
    /// SET and RESET of a `datafusion.*` setting (DataFusion's own).
    DataFusionSetting(Box<DfStatement>),
    /// COPY FROM/TO a file, FROM STDIN, TO STDOUT.
    Copy(CopyStatement),
    /// `COPY … TO 'file' STORED AS …` (DataFusion's).
    CopyStored(Box<CopyToStatement>),
    /// SET/SHOW/RESET of a session setting.
    Setting(SettingStatement),
    /// Users and privileges.
    Access(AccessStatement),
    /// DESCRIBE HISTORY, OPTIMIZE, VACUUM, ANALYZE, cancelling a query.
    Maintenance(Maintenance),
    /// BEGIN, COMMIT, ROLLBACK, savepoints.
    Transaction(TransactionStatement),
    /// `PREPARE name [(types)] AS statement`.
    Prepare {
        /// Normalized (unquoted names folded to lower case).
        name: String,
        data_types: Vec<DataType>,
        statement: Box<Statement>,
    },
    /// `EXECUTE name [(values)]`.
    Execute {
        /// Normalized, as PREPARE's.
        name: String,
        parameters: Vec<Expr>,
    },
    /// `DEALLOCATE name` (Some) or `DEALLOCATE ALL` (None).
    Deallocate(Option<String>),
    /// A statement Cirro does not run: why (0A000 when it is run).
    Unsupported(String),
}

/// `DROP kind [IF EXISTS] names [CASCADE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drop {
    pub object_type: ObjectType,
    pub names: Vec<ObjectName>,
    pub if_exists: bool,
    pub cascade: bool,
}

/// `DISTRIBUTED BY HASH (columns) BUCKETS n` (checked by the engine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedBy {
    /// Column names, normalized (unquoted ones folded to lower case).
    pub columns: Vec<String>,
    /// As written (range-checked later).
    pub buckets: i64,
}

/// DataFusion's message for the statements its planner does not take, as
/// Cirro reports it.
fn unsupported_by_datafusion(statement: &SqlStatement) -> String {
    format!("not supported: Unsupported SQL statement: {statement}")
}

impl Statement {
    /// The statement DataFusion parsed, as Cirro's kind.
    pub fn classify(statement: DfStatement) -> Statement {
        match statement {
            DfStatement::Statement(inner) => Self::classify_sql(*inner),
            DfStatement::Explain(explain) => Statement::Explain {
                analyze: explain.options.analyze,
                explain: Box::new(DfStatement::Explain(explain)),
            },
            DfStatement::CopyTo(copy) => Statement::CopyStored(Box::new(copy)),
            reset @ DfStatement::Reset(_) => Statement::DataFusionSetting(Box::new(reset)),
            DfStatement::CreateExternalTable(_) => Statement::Unsupported(
                "CREATE EXTERNAL TABLE is not supported: use CREATE TABLE and COPY, or query files directly with read_parquet()/read_csv()".into(),
            ),
        }
    }

    /// sqlparser's statement as Cirro's kind.
    pub fn classify_sql(statement: SqlStatement) -> Statement {
        match statement {
            SqlStatement::Query(query) => Statement::Query(query),
            SqlStatement::Explain { analyze, .. } => Statement::Explain {
                analyze,
                explain: Box::new(DfStatement::Statement(Box::new(statement))),
            },
            SqlStatement::Insert(insert) => Statement::Insert(Box::new(insert)),
            SqlStatement::Update(update) => Statement::Update(Box::new(update)),
            SqlStatement::Delete(delete) => Statement::Delete(Box::new(delete)),
            SqlStatement::Merge(merge) => Statement::Merge(Box::new(merge)),
            SqlStatement::Truncate(truncate) => Statement::Truncate(Box::new(truncate)),
            SqlStatement::CreateTable(create) => Statement::CreateTable {
                create: Box::new(create),
                distributed_by: None,
            },
            SqlStatement::CreateView(view) => Statement::CreateView(Box::new(view)),
            SqlStatement::CreateIndex(index) => Statement::CreateIndex(Box::new(index)),
            SqlStatement::AlterTable(alter) => Statement::AlterTable(Box::new(alter)),
            SqlStatement::Drop {
                object_type,
                if_exists,
                names,
                cascade,
                ..
            } => Statement::Drop(Drop {
                object_type,
                names,
                if_exists,
                cascade,
            }),
            SqlStatement::CreateDatabase {
                db_name,
                if_not_exists,
                ..
            } => Statement::CreateDatabase {
                name: db_name,
                if_not_exists,
            },
            SqlStatement::CreateSchema {
                schema_name,
                if_not_exists,
                ..
            } => Statement::CreateSchema {
                name: schema_name,
                if_not_exists,
            },
            SqlStatement::ExplainTable {
                describe_alias: DescribeAlias::Describe | DescribeAlias::Desc,
                table_name,
                ..
            } => Statement::Describe(table_name),
            SqlStatement::ShowCreate {
                obj_type: datafusion::sql::sqlparser::ast::ShowCreateObject::Table,
                obj_name,
            } => Statement::ShowCreateTable(obj_name),
            SqlStatement::ShowVariable { .. }
            | SqlStatement::ShowVariables { .. }
            | SqlStatement::ShowTables { .. }
            | SqlStatement::ShowColumns { .. }
            | SqlStatement::ShowFunctions { .. } => Statement::Show(Box::new(statement)),
            SqlStatement::Set(_) => {
                Statement::DataFusionSetting(Box::new(DfStatement::Statement(Box::new(statement))))
            }
            SqlStatement::Prepare {
                name,
                data_types,
                statement,
            } => Statement::Prepare {
                name: normalize(name),
                data_types,
                statement: Box::new(Self::classify_sql(*statement)),
            },
            SqlStatement::Execute {
                name: Some(name),
                parameters,
                ..
            } if name.0.last().and_then(|part| part.as_ident()).is_some() => {
                let name = name.0.last().and_then(|part| part.as_ident()).cloned();
                Statement::Execute {
                    name: name.map(normalize).unwrap_or_default(),
                    parameters,
                }
            }
            SqlStatement::CreateFunction(_) => {
                Statement::Unsupported("CreateFunction is not supported".into())
            }
            SqlStatement::DropFunction(_) => {
                Statement::Unsupported("DropFunction is not supported".into())
            }
            other => Statement::Unsupported(unsupported_by_datafusion(&other)),
        }
    }

    /// The statement in DataFusion's form, for the kinds DataFusion plans
    /// (None for those Cirro runs itself).
    pub fn to_datafusion(&self) -> Option<DfStatement> {
        let sql = |statement: SqlStatement| Some(DfStatement::Statement(Box::new(statement)));
        match self {
            Statement::Query(query) => sql(SqlStatement::Query(query.clone())),
            Statement::Explain { explain, .. } => Some(explain.as_ref().clone()),
            Statement::Insert(insert) => sql(SqlStatement::Insert(insert.as_ref().clone())),
            Statement::Update(update) => sql(SqlStatement::Update(update.as_ref().clone())),
            Statement::Delete(delete) => sql(SqlStatement::Delete(delete.as_ref().clone())),
            Statement::Merge(merge) => sql(SqlStatement::Merge(merge.as_ref().clone())),
            Statement::Truncate(truncate) => sql(SqlStatement::Truncate(truncate.as_ref().clone())),
            Statement::CreateTable { create, .. } => {
                sql(SqlStatement::CreateTable(create.as_ref().clone()))
            }
            Statement::CreateView(view) => sql(SqlStatement::CreateView(view.as_ref().clone())),
            Statement::Drop(drop) => sql(SqlStatement::Drop {
                object_type: drop.object_type,
                if_exists: drop.if_exists,
                names: drop.names.clone(),
                cascade: drop.cascade,
                restrict: false,
                purge: false,
                temporary: false,
                table: None,
            }),
            Statement::CreateSchema {
                name,
                if_not_exists,
            } => sql(SqlStatement::CreateSchema {
                schema_name: name.clone(),
                if_not_exists: *if_not_exists,
                with: None,
                options: None,
                default_collate_spec: None,
                clone: None,
            }),
            Statement::Describe(table_name) => sql(SqlStatement::ExplainTable {
                describe_alias: DescribeAlias::Describe,
                hive_format: None,
                has_table_keyword: false,
                table_name: table_name.clone(),
            }),
            Statement::Show(show) => sql(show.as_ref().clone()),
            Statement::DataFusionSetting(setting) => Some(setting.as_ref().clone()),
            Statement::CopyStored(copy) => Some(DfStatement::CopyTo(copy.as_ref().clone())),
            _ => None,
        }
    }

    /// Whether it ends a transaction (the only statements a failed
    /// transaction accepts).
    pub fn ends_transaction(&self) -> bool {
        matches!(
            self,
            Statement::Transaction(
                TransactionStatement::Commit { .. }
                    | TransactionStatement::Rollback { .. }
                    | TransactionStatement::RollbackTo(_)
            )
        )
    }

    /// The command a read-only transaction refuses to run, named as
    /// PostgreSQL names it in 25006 ("cannot execute INSERT in a read-only
    /// transaction"): what changes rows, definitions or users. None for what
    /// it runs (queries, SET, COPY TO, maintenance).
    pub fn write_command(&self) -> Option<&'static str> {
        Some(match self {
            Statement::Insert(_) => "INSERT",
            Statement::Update(_) => "UPDATE",
            Statement::Delete(_) => "DELETE",
            Statement::Merge(_) => "MERGE",
            Statement::Truncate(_) => "TRUNCATE TABLE",
            Statement::CreateTable { create, .. } if create.query.is_some() => "CREATE TABLE AS",
            Statement::CreateTable { .. } => "CREATE TABLE",
            Statement::CreateView(_) => "CREATE VIEW",
            Statement::CreateIndex(_) => "CREATE INDEX",
            Statement::AlterTable(_) => "ALTER TABLE",
            Statement::Drop(_) => "DROP",
            Statement::CreateDatabase { .. } => "CREATE DATABASE",
            Statement::CreateSchema { .. } => "CREATE SCHEMA",
            Statement::Copy(CopyStatement::FromFile(_) | CopyStatement::FromStdin(_)) => {
                "COPY FROM"
            }
            Statement::Access(_) => "CREATE/ALTER/DROP USER, GRANT or REVOKE",
            // EXPLAIN ANALYZE runs the statement it explains.
            Statement::Explain {
                analyze: true,
                explain,
            } => {
                let explained = match explain.as_ref() {
                    DfStatement::Explain(explain) => explain.statement.as_ref().clone(),
                    DfStatement::Statement(inner) => match inner.as_ref() {
                        SqlStatement::Explain { statement, .. } => {
                            DfStatement::Statement(statement.clone())
                        }
                        _ => return None,
                    },
                    _ => return None,
                };
                return Statement::classify(explained).write_command();
            }
            _ => return None,
        })
    }

    /// Whether it reads or writes tables, so that a transaction that runs it
    /// has begun its work (PostgreSQL's first snapshot): after it, the
    /// transaction's isolation level and read-write mode are fixed. SET,
    /// SHOW, BEGIN, PREPARE and the like are not.
    pub fn takes_snapshot(&self) -> bool {
        match self {
            Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::Insert(_)
            | Statement::Update(_)
            | Statement::Delete(_)
            | Statement::Merge(_)
            | Statement::Truncate(_)
            | Statement::Copy(_)
            | Statement::CopyStored(_) => true,
            Statement::CreateTable { create, .. } => create.query.is_some(),
            _ => false,
        }
    }

    /// Whether it changes the catalog's definitions (tables, views,
    /// indexes, schemas, databases).
    pub fn is_ddl(&self) -> bool {
        matches!(
            self,
            Statement::CreateTable { .. }
                | Statement::CreateView(_)
                | Statement::CreateIndex(_)
                | Statement::AlterTable(_)
                | Statement::Drop(_)
                | Statement::CreateDatabase { .. }
                | Statement::CreateSchema { .. }
        )
    }

    /// Whether it runs work that waits for admission when it touches a
    /// table outside the system schemas (the engine looks at the tables):
    /// a query, DML, CREATE TABLE AS, EXPLAIN ANALYZE, COPY, OPTIMIZE,
    /// VACUUM, ANALYZE.
    pub fn takes_admission(&self) -> bool {
        match self {
            Statement::Query(_)
            | Statement::Insert(_)
            | Statement::Update(_)
            | Statement::Delete(_)
            | Statement::Merge(_)
            | Statement::Copy(_) => true,
            Statement::CreateTable { create, .. } => create.query.is_some(),
            Statement::Explain { analyze, .. } => *analyze,
            Statement::Maintenance(m) => {
                !matches!(m, Maintenance::CancelQuery(_) | Maintenance::History(_))
            }
            _ => false,
        }
    }

    /// Whether a prepared form of it keeps its plan between executions
    /// (queries, EXPLAIN, SHOW and DML); the others run as `run` runs them
    /// at each execution.
    pub fn keeps_plan(&self) -> bool {
        matches!(
            self,
            Statement::Query(_)
                | Statement::Explain { .. }
                | Statement::Show(_)
                | Statement::Insert(_)
                | Statement::Update(_)
                | Statement::Delete(_)
                | Statement::Merge(_)
        )
    }

    /// Whether it returns rows (a query, EXPLAIN, SHOW, DESCRIBE, DESCRIBE
    /// HISTORY, …) rather than a command tag. EXECUTE returns what the
    /// statement it names returns (the engine knows).
    pub fn returns_rows(&self) -> bool {
        match self {
            Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::Show(_)
            | Statement::Describe(_)
            | Statement::ShowCreateTable(_) => true,
            Statement::Setting(setting) => matches!(
                setting,
                SettingStatement::Show(_) | SettingStatement::ShowAll
            ),
            Statement::Maintenance(m) => !matches!(
                m,
                Maintenance::Analyze(_)
                    | Maintenance::CancelQuery(_)
                    | Maintenance::VacuumTables { .. }
            ),
            _ => false,
        }
    }

    /// Whether a plan of it holds data taken at planning (settings, the
    /// catalog's lists): such a plan is made again at every execution.
    pub fn shows_data(&self) -> bool {
        matches!(self, Statement::Show(_))
    }
}

/// A name as PostgreSQL folds it (unquoted: lower case).
fn normalize(ident: datafusion::sql::sqlparser::ast::Ident) -> String {
    datafusion::sql::planner::IdentNormalizer::new(true).normalize(ident)
}

/// One parsed statement.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub statement: Statement,
    /// The highest `$n` placeholder (0: none).
    pub placeholders: usize,
    /// How many times a parser ran over the text to get here (1 but for
    /// rare fallbacks; tests assert it).
    pub parses: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(sql: &str) -> Statement {
        crate::parse(sql).expect(sql).statement
    }

    /// The properties the engine asks, per kind: a change to one shows here.
    #[test]
    fn properties_of_each_kind() {
        // (sql, is_ddl, takes_admission, keeps_plan, returns_rows)
        let cases = [
            ("SELECT 1", false, true, true, true),
            ("EXPLAIN SELECT 1", false, false, true, true),
            ("EXPLAIN ANALYZE SELECT 1", false, true, true, true),
            ("INSERT INTO t VALUES (1)", false, true, true, false),
            ("UPDATE t SET a = 1", false, true, true, false),
            ("DELETE FROM t", false, true, true, false),
            ("TRUNCATE t", false, false, false, false),
            ("CREATE TABLE t (a INT)", true, false, false, false),
            ("CREATE TABLE t AS SELECT 1 AS a", true, true, false, false),
            ("CREATE VIEW v AS SELECT 1", true, false, false, false),
            ("CREATE INDEX i ON t (a)", true, false, false, false),
            ("ALTER TABLE t ADD COLUMN b INT", true, false, false, false),
            ("DROP TABLE t", true, false, false, false),
            ("CREATE SCHEMA s", true, false, false, false),
            ("SHOW TABLES", false, false, true, true),
            ("SHOW statement_timeout", false, false, false, true),
            ("SET statement_timeout = 10", false, false, false, false),
            ("DESCRIBE t", false, false, false, true),
            ("DESCRIBE HISTORY t", false, false, false, true),
            ("ANALYZE t", false, true, false, false),
            ("COPY t FROM '/x.csv'", false, true, false, false),
            ("BEGIN", false, false, false, false),
            ("PREPARE p AS SELECT 1", false, false, false, false),
        ];
        for (sql, ddl, admission, plan, rows) in cases {
            let s = statement(sql);
            assert_eq!(s.is_ddl(), ddl, "is_ddl: {sql}");
            assert_eq!(s.takes_admission(), admission, "takes_admission: {sql}");
            assert_eq!(s.keeps_plan(), plan, "keeps_plan: {sql}");
            assert_eq!(s.returns_rows(), rows, "returns_rows: {sql}");
        }
        assert!(statement("COMMIT").ends_transaction());
        assert!(statement("ROLLBACK").ends_transaction());
        assert!(!statement("BEGIN").ends_transaction());
        assert!(statement("SHOW TABLES").shows_data());
    }

    /// The kinds DataFusion plans give their statement back unchanged; the
    /// ones Cirro runs give none.
    #[test]
    fn datafusion_form_round_trips() {
        for sql in [
            "SELECT a FROM t WHERE b > 1",
            "INSERT INTO t VALUES (1, 'x')",
            "UPDATE t SET a = 2 WHERE b = 3",
            "DELETE FROM t WHERE a = 1",
            "DROP TABLE IF EXISTS t CASCADE",
            "CREATE SCHEMA IF NOT EXISTS s",
            "DESCRIBE t",
            "COPY t TO 'x.csv' STORED AS CSV",
        ] {
            let planned = statement(sql).to_datafusion().expect(sql);
            let again = Statement::classify(planned);
            assert_eq!(again, statement(sql), "{sql}");
        }
        for sql in [
            "BEGIN",
            "SET statement_timeout = 1",
            "VACUUM t",
            "COPY t FROM '/x.csv'",
        ] {
            assert!(statement(sql).to_datafusion().is_none(), "{sql}");
        }
    }

    /// What Cirro does not run is refused with DataFusion's words (0A000
    /// when run), and the distributed form belongs to CREATE TABLE only.
    #[test]
    fn unsupported_kinds() {
        let Statement::Unsupported(why) = statement("USE d") else {
            panic!("USE is not run");
        };
        assert!(why.contains("Unsupported SQL statement"), "{why}");
        let err = crate::parse("CREATE VIEW v AS SELECT 1 DISTRIBUTED BY HASH (a) BUCKETS 2")
            .expect_err("not a table");
        assert_eq!(err.state, cirro_common::SqlState::SYNTAX_ERROR);
    }
}
