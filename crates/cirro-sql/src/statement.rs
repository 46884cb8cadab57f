//! Cirro's statement: one variant per kind Cirro runs itself, and
//! DataFusion's statement (sqlparser's AST and DataFusion's extensions) for
//! everything else. A statement's text is parsed into it once; everything
//! after works on this value.

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;

pub use crate::parsers::access::{AccessStatement, UserOptions};
pub use crate::parsers::copy::{
    CopyFrom, CopyIn, CopyOutSource, CopyStatement, CopyTo, FileFormat, TextFormat,
};
pub use crate::parsers::maintenance::Maintenance;
pub use crate::parsers::setting::SettingStatement;
pub use crate::parsers::transaction::TransactionStatement;

#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// Nothing but whitespace and comments.
    Empty,
    /// COPY FROM/TO a file, FROM STDIN, TO STDOUT (`COPY … TO 'file' STORED AS …` is DataFusion's).
    Copy(CopyStatement),
    /// SET/SHOW/RESET of a session setting (`datafusion.*` ones are DataFusion's).
    Setting(SettingStatement),
    /// Users and privileges.
    Access(AccessStatement),
    /// DESCRIBE HISTORY, OPTIMIZE, VACUUM.
    Maintenance(Maintenance),
    /// BEGIN, COMMIT, ROLLBACK, savepoints.
    Transaction(TransactionStatement),
    /// `DEALLOCATE name` (Some) or `DEALLOCATE ALL` (None).
    Deallocate(Option<String>),
    /// `CREATE TABLE … DISTRIBUTED BY HASH (…) BUCKETS n`: the CREATE TABLE
    /// as DataFusion parsed it without the clause, and the clause.
    CreateDistributed {
        create: Box<DfStatement>,
        distributed_by: DistributedBy,
    },
    /// Everything else: queries, DML, DDL, EXPLAIN, … as DataFusion parsed it.
    Sql(Box<DfStatement>),
}

/// `DISTRIBUTED BY HASH (columns) BUCKETS n` (checked by the engine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedBy {
    /// Column names, normalized (unquoted ones folded to lower case).
    pub columns: Vec<String>,
    /// As written (range-checked later).
    pub buckets: i64,
}

impl Statement {
    /// The sqlparser statement inside, if this is one.
    pub fn sql(&self) -> Option<&SqlStatement> {
        match self {
            Statement::Sql(statement) => match statement.as_ref() {
                DfStatement::Statement(inner) => Some(inner),
                _ => None,
            },
            _ => None,
        }
    }
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
