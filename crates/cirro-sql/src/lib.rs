//! Cirro's SQL front door: split a script into statements once
//! ([`split_statements`]), then parse each statement once ([`parse`]) into a
//! [`Statement`]: Cirro's own kinds (COPY, SET/SHOW, users and grants,
//! OPTIMIZE/VACUUM/DESCRIBE HISTORY, transactions) each by its own parser in
//! `parsers/`, everything else by DataFusion's parser into sqlparser's AST.
//!
//! ```text
//!  text ─► split_statements ─► for each statement:
//!     tokenize once (CirroDialect) ─► first word decides:
//!        SET/SHOW/RESET            → parsers/setting.rs
//!        CREATE/ALTER/DROP USER, GRANT, REVOKE → parsers/access.rs
//!        DESCRIBE HISTORY, OPTIMIZE, VACUUM → parsers/maintenance.rs
//!        COPY … FROM | TO STDOUT   → parsers/copy.rs (sqlparser's COPY)
//!        BEGIN, COMMIT, ROLLBACK, SAVEPOINT, … → parsers/transaction.rs
//!        DEALLOCATE                → parsers/deallocate.rs
//!        CREATE TABLE … DISTRIBUTED BY → parsers/distribution.rs takes the
//!                                    clause out, DataFusion parses the rest
//!        a query over pg_catalog   → pg_catalog.rs (datafusion-pg-catalog)
//!        anything else             → DataFusion's parser, on the same tokens
//! ```
//!
//! Time travel (`FROM t VERSION AS OF 3`) is part of the AST (see
//! `dialect.rs`); the engine resolves it. Parameters (`$1`) stay placeholders
//! in the AST: their values never become SQL text.
//!
//! Every run of a parser over a statement is counted ([`Parsed::parses`],
//! and [`parse_count`] for the process), so tests can assert that a
//! statement was parsed exactly once on its way.

pub mod dialect;
pub mod names;
mod parsers;
mod pg_catalog;
pub mod redact;
mod shape;
pub mod split;
pub mod statement;
pub mod types;
pub mod values;
pub mod walk;
mod words;

use std::sync::atomic::{AtomicU64, Ordering};

use cirro_common::limits::statement_nesting_depth_max;
use cirro_common::{CirroError, Result, SqlState};
use datafusion::sql::parser::DFParserBuilder;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

pub use dialect::CirroDialect;
pub use redact::{normalize_literals, redact_passwords};
pub use split::{is_blank, is_complete, split_statements};
pub use statement::*;
pub use types::PgTypes;

/// Parser runs in this process (see [`parse_count`]).
static PARSES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Parser runs on this thread: parsing is synchronous, so the difference
    /// across one [`parse`] call is that call's count.
    static THREAD_PARSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(crate) fn count_parse() {
    PARSES.fetch_add(1, Ordering::Relaxed);
    THREAD_PARSES.with(|c| c.set(c.get() + 1));
}

/// How many times a parser ran over a statement in this process.
pub fn parse_count() -> u64 {
    PARSES.load(Ordering::Relaxed)
}

fn tokenize(sql: &str) -> Result<Vec<TokenWithSpan>> {
    Tokenizer::new(&CirroDialect, sql)
        .tokenize_with_location()
        .map_err(|e| CirroError::new(SqlState::SYNTAX_ERROR, format!("syntax error: {e}")))
}

/// The tokens that carry meaning: no whitespace or comments, no trailing
/// semicolons.
fn solid_tokens(tokens: &[TokenWithSpan]) -> Vec<Token> {
    let mut solid: Vec<Token> = tokens
        .iter()
        .map(|t| &t.token)
        .filter(|t| !matches!(t, Token::Whitespace(_) | Token::EOF))
        .cloned()
        .collect();
    while solid.last() == Some(&Token::SemiColon) {
        solid.pop();
    }
    solid
}

/// The highest `$n` among the tokens.
fn placeholders(solid: &[Token]) -> usize {
    solid
        .iter()
        .filter_map(|t| match t {
            Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Parse one statement (a trailing semicolon is allowed; several statements
/// are a 42601 error: split scripts with [`split_statements`] first).
pub fn parse(sql: &str) -> Result<Parsed> {
    let before = THREAD_PARSES.with(|c| c.get());
    let mut parsed = parse_statement(sql)?;
    parsed.parses = THREAD_PARSES.with(|c| c.get()) - before;
    Ok(parsed)
}

fn parse_statement(sql: &str) -> Result<Parsed> {
    shape::check_length(sql)?;
    let tokens = tokenize(sql)?;
    let solid = solid_tokens(&tokens);
    shape::check_operators(&solid)?;
    let placeholders = placeholders(&solid);
    let parsed = |statement| {
        Ok(Parsed {
            statement,
            placeholders,
            parses: 0,
        })
    };
    let first = match solid.first() {
        None => return parsed(Statement::Empty),
        Some(Token::Word(w)) if w.quote_style.is_none() => w.value.to_ascii_lowercase(),
        Some(_) => String::new(),
    };
    let own = match first.as_str() {
        "set" | "show" | "reset" => parsers::setting::parse(&solid)?.map(Statement::Setting),
        "create" | "alter" | "drop" | "grant" | "revoke" => {
            parsers::access::parse(&solid)?.map(Statement::Access)
        }
        "describe" | "desc" | "optimize" | "vacuum" | "analyze" | "analyse" | "cancel" => {
            parsers::maintenance::parse(&solid)?.map(Statement::Maintenance)
        }
        "begin" | "start" | "commit" | "end" | "rollback" | "abort" | "savepoint" | "release" => {
            parsers::transaction::parse(&solid)?.map(Statement::Transaction)
        }
        "deallocate" => parsers::deallocate::parse(&solid)?.map(Statement::Deallocate),
        "copy" => {
            let statement = match parsers::copy::parse(&tokens, &solid)? {
                Some(copy) => Statement::Copy(copy),
                None => Statement::classify(parse_datafusion(tokens)?),
            };
            return parsed(statement);
        }
        _ => None,
    };
    if let Some(statement) = own {
        count_parse();
        return parsed(statement);
    }
    if pg_catalog::is_catalog_query(&solid) {
        count_parse();
        if let Some(statement) = pg_catalog::parse_catalog_query(sql) {
            let mut statement = datafusion::sql::parser::Statement::Statement(Box::new(statement));
            shape::shape(&mut statement)?;
            return parsed(Statement::classify(statement));
        }
    }
    if first == "alter" {
        parsers::distribution::refuse_alter(&solid)?;
    }
    let mut tokens = tokens;
    if first == "create"
        && let Some(distributed_by) = parsers::distribution::take(&mut tokens)?
    {
        return match Statement::classify(parse_datafusion(tokens)?) {
            Statement::CreateTable { create, .. } => parsed(Statement::CreateTable {
                create,
                distributed_by: Some(distributed_by),
            }),
            _ => Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                "DISTRIBUTED BY belongs to CREATE TABLE",
            )),
        };
    }
    parsed(Statement::classify(parse_datafusion(tokens)?))
}

/// DataFusion's parser over the statement's tokens.
fn parse_datafusion(tokens: Vec<TokenWithSpan>) -> Result<datafusion::sql::parser::Statement> {
    count_parse();
    let mut parser = DFParserBuilder::new(tokens)
        .with_dialect(&CirroDialect)
        .with_recursion_limit(statement_nesting_depth_max())
        .build()?;
    let mut statements = parser.parse_statements()?;
    match (statements.pop_front(), statements.is_empty()) {
        (Some(mut statement), true) => {
            shape::shape(&mut statement)?;
            Ok(statement)
        }
        (None, _) => Err(CirroError::internal("a statement parsed into nothing")),
        (Some(_), false) => Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "cannot insert multiple commands into a prepared statement",
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use datafusion::sql::sqlparser::ast::{SetExpr, TableFactor, TableVersion};

    /// The solid tokens of `sql`, as the kind parsers get them.
    pub(crate) fn solid(sql: &str) -> Vec<Token> {
        solid_tokens(&tokenize(sql).expect("tokenize"))
    }

    #[test]
    fn one_parser_run_per_statement() {
        for sql in [
            "SELECT 1",
            "INSERT INTO t VALUES ($1, 'a;b')",
            "UPDATE t SET a = 1 WHERE b = $2",
            "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE",
            "COPY t FROM '/x.csv' (FORMAT csv)",
            "COPY t TO '/x.parquet'",
            "SET statement_timeout = 10",
            "SET datafusion.execution.batch_size = 10",
            "SELECT * FROM t VERSION AS OF 3",
            "SELECT relname FROM pg_catalog.pg_class",
            "BEGIN",
            "VACUUM t",
        ] {
            let before = parse_count();
            assert_eq!(parse(sql).expect(sql).parses, 1, "{sql}");
            assert!(parse_count() > before);
        }
    }

    #[test]
    fn statements_of_each_kind() {
        let kind = |sql: &str| parse(sql).expect(sql).statement;
        assert!(matches!(kind("  -- nothing\n"), Statement::Empty));
        assert!(matches!(kind("show all;"), Statement::Setting(_)));
        assert!(matches!(kind("show tables"), Statement::Show(_)));
        assert!(matches!(
            kind("grant select on t to u"),
            Statement::Access(_)
        ));
        assert!(matches!(kind("drop table t"), Statement::Drop(_)));
        assert!(matches!(kind("select 1"), Statement::Query(_)));
        assert!(matches!(
            kind("insert into t values (1)"),
            Statement::Insert(_)
        ));
        assert!(matches!(kind("update t set a = 1"), Statement::Update(_)));
        assert!(matches!(kind("delete from t"), Statement::Delete(_)));
        assert!(matches!(kind("truncate t"), Statement::Truncate(_)));
        assert!(matches!(
            kind("explain analyze select 1"),
            Statement::Explain { analyze: true, .. }
        ));
        assert!(matches!(
            kind("create table t (a int) distributed by hash (a) buckets 4"),
            Statement::CreateTable {
                distributed_by: Some(_),
                ..
            }
        ));
        assert!(matches!(
            kind("create table t (a int)"),
            Statement::CreateTable {
                distributed_by: None,
                ..
            }
        ));
        assert!(matches!(
            kind("alter table t add column b int"),
            Statement::AlterTable(_)
        ));
        assert!(matches!(
            kind("create index i on t (a)"),
            Statement::CreateIndex(_)
        ));
        assert!(matches!(
            kind("create view v as select 1"),
            Statement::CreateView(_)
        ));
        assert!(matches!(
            kind("create schema s"),
            Statement::CreateSchema { .. }
        ));
        assert!(matches!(
            kind("create database d"),
            Statement::CreateDatabase { .. }
        ));
        assert!(matches!(
            kind("show create table t"),
            Statement::ShowCreateTable(_)
        ));
        assert!(matches!(
            kind("set datafusion.execution.batch_size = 10"),
            Statement::DataFusionSetting(_)
        ));
        let Statement::Prepare {
            name, statement, ..
        } = kind("PREPARE Q1 AS select $1")
        else {
            panic!("not a PREPARE");
        };
        assert_eq!(name, "q1");
        assert!(matches!(*statement, Statement::Query(_)));
        assert!(matches!(
            kind("execute q1 (1)"),
            Statement::Execute { name, parameters } if name == "q1" && parameters.len() == 1
        ));
        assert!(matches!(
            kind("create external table t stored as parquet location 'x'"),
            Statement::Unsupported(_)
        ));
        assert!(matches!(kind("use d"), Statement::Unsupported(_)));
        assert!(matches!(
            kind("describe history t"),
            Statement::Maintenance(_)
        ));
        assert!(matches!(kind("describe t"), Statement::Describe(_)));
        assert!(matches!(kind("ANALYZE t"), Statement::Maintenance(_)));
        assert!(matches!(kind("commit"), Statement::Transaction(_)));
        assert!(matches!(
            kind("copy t (a, b) from stdin with (format csv)"),
            Statement::Copy(CopyStatement::FromStdin(_))
        ));
        // pgbench -i's COPY: FREEZE is accepted (Cirro's rows are frozen).
        assert!(matches!(
            kind("copy pgbench_accounts from stdin with (freeze on)"),
            Statement::Copy(CopyStatement::FromStdin(_))
        ));
        assert!(matches!(
            kind("copy (select 1) to stdout"),
            Statement::Copy(CopyStatement::ToStdout { .. })
        ));
        assert!(matches!(
            kind("copy t to 'x.csv'"),
            Statement::Copy(CopyStatement::ToFile(_))
        ));
        assert!(matches!(
            kind("copy t to 'x.csv' stored as csv"),
            Statement::CopyStored(_)
        ));
        assert_eq!(parse("select $1 + $12").expect("parse").placeholders, 12);
        let err = parse("select 1; select 2").expect_err("two statements");
        assert_eq!(err.state, SqlState::SYNTAX_ERROR);
        let err = parse("select 'unterminated").expect_err("bad token");
        assert_eq!(err.state, SqlState::SYNTAX_ERROR);
    }

    #[test]
    fn time_travel_is_in_the_ast() {
        let parsed = parse("SELECT * FROM s.t VERSION AS OF 7 AS old").expect("parse");
        let Statement::Query(query) = &parsed.statement else {
            panic!("not a query");
        };
        let SetExpr::Select(select) = query.body.as_ref() else {
            panic!("not a select");
        };
        let TableFactor::Table { version, alias, .. } = &select.from[0].relation else {
            panic!("not a table");
        };
        assert!(matches!(version, Some(TableVersion::VersionAsOf(_))));
        assert_eq!(alias.as_ref().map(|a| a.name.value.as_str()), Some("old"));
        let parsed = parse("SELECT * FROM t TIMESTAMP AS OF '2024-01-01'").expect("parse");
        assert!(format!("{:?}", parsed.statement).contains("TimestampAsOf"));
    }

    #[test]
    fn copy_options() {
        let copy = |sql: &str| match parse(sql).expect(sql).statement {
            Statement::Copy(CopyStatement::FromFile(copy)) => copy,
            other => panic!("{other:?}"),
        };
        let lineitem =
            copy("COPY lineitem FROM '/x/l.tbl' (FORMAT csv, DELIMITER '|', HEADER false)");
        let FileFormat::Text(text) = &lineitem.format else {
            panic!("{lineitem:?}");
        };
        assert_eq!(text.delimiter, b'|');
        assert!(text.csv && !text.header);
        assert_eq!(lineitem.path, "/x/l.tbl");
        assert_eq!(
            copy("copy t from 'a.parquet' (format parquet)").format,
            FileFormat::Parquet
        );
        // Without FORMAT: the extension, else PostgreSQL's text format.
        assert_eq!(copy("copy t from 'a.parquet'").format, FileFormat::Parquet);
        assert_eq!(
            copy("copy t from 'a.csv'").format,
            FileFormat::Text(TextFormat::csv())
        );
        assert_eq!(
            copy("copy t (b, a) from 'a.txt'").format,
            FileFormat::Text(TextFormat::text())
        );
        assert_eq!(copy("copy t (b, a) from 'a.txt'").columns, ["b", "a"]);
        // PostgreSQL's spellings of a boolean option's value.
        for (header, expected) in [("on", true), ("1", true), ("OFF", false), ("0", false)] {
            let copy = copy(&format!(
                "copy t from 'a.csv' (format csv, header {header})"
            ));
            let FileFormat::Text(text) = &copy.format else {
                panic!("{copy:?}");
            };
            assert_eq!(text.header, expected, "header {header}");
        }
        let err = parse("COPY t FROM 'x' (FORMAT avro)").expect_err("refused");
        assert_eq!(err.state, SqlState::FEATURE_NOT_SUPPORTED);
        let err = parse("COPY t FROM 'x' (FORMAT parquet, DELIMITER '|')").expect_err("refused");
        assert_eq!(err.state, SqlState::INVALID_PARAMETER_VALUE);
    }

    #[test]
    fn catalog_queries_go_through_the_compatibility_parser() {
        let parsed = parse("SELECT 'x'::regclass").expect("parse");
        assert!(matches!(parsed.statement, Statement::Query(_)));
        // A string that merely mentions pg_ is an ordinary query.
        assert!(!pg_catalog::is_catalog_query(&solid("SELECT 'pg_class'")));
        assert!(pg_catalog::is_catalog_query(&solid(
            "select * from pg_catalog.pg_type"
        )));
        assert!(!pg_catalog::is_catalog_query(&solid(
            "insert into t select current_user"
        )));
    }
}
