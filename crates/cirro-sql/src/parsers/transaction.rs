//! Transaction control: `BEGIN [WORK|TRANSACTION] [modes]`,
//! `START TRANSACTION [modes]`, `COMMIT|END [WORK|TRANSACTION] [AND [NO] CHAIN]`,
//! `ROLLBACK|ABORT [WORK|TRANSACTION] [AND [NO] CHAIN]`,
//! `ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name`, `SAVEPOINT name`,
//! `RELEASE [SAVEPOINT] name`, with PostgreSQL's transaction modes
//! (`ISOLATION LEVEL …`, `READ ONLY|WRITE`, `[NOT] DEFERRABLE`), which `SET
//! TRANSACTION` and `SET SESSION CHARACTERISTICS AS TRANSACTION` take too.

use cirro_common::Result;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::{Words, syntax};

/// PostgreSQL's isolation levels, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadUncommitted,
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl Isolation {
    /// The level's name as PostgreSQL's settings show it.
    pub fn name(self) -> &'static str {
        match self {
            Isolation::ReadUncommitted => "read uncommitted",
            Isolation::ReadCommitted => "read committed",
            Isolation::RepeatableRead => "repeatable read",
            Isolation::Serializable => "serializable",
        }
    }

    /// A level from a setting's value (`'repeatable read'`), any case.
    pub fn from_name(text: &str) -> Option<Self> {
        let words: Vec<String> = text
            .split_whitespace()
            .map(|w| w.to_ascii_lowercase())
            .collect();
        [
            Isolation::ReadUncommitted,
            Isolation::ReadCommitted,
            Isolation::RepeatableRead,
            Isolation::Serializable,
        ]
        .into_iter()
        .find(|level| level.name().split(' ').eq(words.iter().map(String::as_str)))
    }
}

/// The modes a transaction is started or set with (None: not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransactionModes {
    pub isolation: Option<Isolation>,
    pub read_only: Option<bool>,
    pub deferrable: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TransactionStatement {
    Begin(TransactionModes),
    /// COMMIT; `chain` for AND CHAIN.
    Commit {
        chain: bool,
    },
    /// ROLLBACK; `chain` for AND CHAIN.
    Rollback {
        chain: bool,
    },
    Savepoint(String),
    Release(String),
    RollbackTo(String),
}

/// Parse `tokens` if they are a transaction statement (None otherwise).
pub(crate) fn parse(tokens: &[Token]) -> Result<Option<TransactionStatement>> {
    let mut words = Words::new(tokens);
    let work = |w: &mut Words| w.keyword("work") || w.keyword("transaction");
    let statement = if words.keyword("begin") {
        work(&mut words);
        TransactionStatement::Begin(modes(&mut words)?)
    } else if words.keywords(&["start", "transaction"]) {
        TransactionStatement::Begin(modes(&mut words)?)
    } else if words.keyword("commit") || words.keyword("end") {
        work(&mut words);
        TransactionStatement::Commit {
            chain: chain(&mut words)?,
        }
    } else if words.keyword("rollback") || words.keyword("abort") {
        work(&mut words);
        if words.keyword("to") {
            words.keyword("savepoint");
            TransactionStatement::RollbackTo(words.ident("a savepoint name")?)
        } else {
            TransactionStatement::Rollback {
                chain: chain(&mut words)?,
            }
        }
    } else if words.keyword("savepoint") {
        TransactionStatement::Savepoint(words.ident("a savepoint name")?)
    } else if words.keyword("release") {
        words.keyword("savepoint");
        TransactionStatement::Release(words.ident("a savepoint name")?)
    } else {
        return Ok(None);
    };
    words.end()?;
    Ok(Some(statement))
}

fn chain(words: &mut Words) -> Result<bool> {
    if !words.keyword("and") {
        return Ok(false);
    }
    let no = words.keyword("no");
    if !words.keyword("chain") {
        return Err(syntax("syntax error: expected AND [NO] CHAIN"));
    }
    Ok(!no)
}

/// Transaction modes, separated by commas or blanks (`ISOLATION LEVEL
/// REPEATABLE READ, READ WRITE`), up to the end of the statement.
pub(crate) fn modes(words: &mut Words) -> Result<TransactionModes> {
    let mut modes = TransactionModes::default();
    while words.peek().is_some() {
        if words.keywords(&["isolation", "level"]) {
            let level = if words.keyword("serializable") {
                Isolation::Serializable
            } else if words.keywords(&["repeatable", "read"]) {
                Isolation::RepeatableRead
            } else if words.keywords(&["read", "committed"]) {
                Isolation::ReadCommitted
            } else if words.keywords(&["read", "uncommitted"]) {
                Isolation::ReadUncommitted
            } else {
                return Err(syntax(
                    "syntax error: expected ISOLATION LEVEL SERIALIZABLE, REPEATABLE READ, \
                     READ COMMITTED or READ UNCOMMITTED",
                ));
            };
            modes.isolation = Some(level);
        } else if words.keywords(&["read", "only"]) {
            modes.read_only = Some(true);
        } else if words.keywords(&["read", "write"]) {
            modes.read_only = Some(false);
        } else if words.keyword("deferrable") {
            modes.deferrable = Some(true);
        } else if words.keywords(&["not", "deferrable"]) {
            modes.deferrable = Some(false);
        } else {
            let at = words.peek().map(|t| t.to_string()).unwrap_or_default();
            return Err(syntax(format!(
                "syntax error at or near \"{at}\": expected a transaction mode (ISOLATION \
                 LEVEL …, READ ONLY, READ WRITE, [NOT] DEFERRABLE)"
            )));
        }
        if !words.token(&Token::Comma) && words.peek().is_none() {
            break;
        }
    }
    Ok(modes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::solid;

    #[test]
    fn parses_transaction_control() {
        let parse_sql = |sql: &str| parse(&solid(sql)).expect("parse");
        use TransactionStatement::*;
        assert_eq!(parse_sql("BEGIN"), Some(Begin(TransactionModes::default())));
        assert_eq!(
            parse_sql("start transaction isolation level repeatable read, read write"),
            Some(Begin(TransactionModes {
                isolation: Some(Isolation::RepeatableRead),
                read_only: Some(false),
                deferrable: None,
            }))
        );
        assert_eq!(
            parse_sql("BEGIN READ ONLY ISOLATION LEVEL READ COMMITTED NOT DEFERRABLE"),
            Some(Begin(TransactionModes {
                isolation: Some(Isolation::ReadCommitted),
                read_only: Some(true),
                deferrable: Some(false),
            }))
        );
        assert!(parse(&solid("BEGIN ISOLATION LEVEL READ")).is_err());
        assert!(parse(&solid("BEGIN READ SOMETHING")).is_err());
        assert_eq!(
            Isolation::from_name("Repeatable  Read"),
            Some(Isolation::RepeatableRead)
        );
        assert_eq!(Isolation::from_name("snapshot"), None);
        assert_eq!(parse_sql("END WORK"), Some(Commit { chain: false }));
        assert_eq!(parse_sql("COMMIT AND CHAIN"), Some(Commit { chain: true }));
        assert_eq!(parse_sql("abort"), Some(Rollback { chain: false }));
        assert_eq!(
            parse_sql("ROLLBACK TO SAVEPOINT \"A\""),
            Some(RollbackTo("A".into()))
        );
        assert_eq!(parse_sql("rollback to b"), Some(RollbackTo("b".into())));
        assert_eq!(parse_sql("SAVEPOINT s1"), Some(Savepoint("s1".into())));
        assert_eq!(parse_sql("RELEASE s1"), Some(Release("s1".into())));
        assert_eq!(parse_sql("SELECT 1"), None);
        assert!(parse(&solid("COMMIT now")).is_err());
    }
}
