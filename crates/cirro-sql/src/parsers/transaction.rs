//! Transaction control: `BEGIN [WORK|TRANSACTION] [modes]`,
//! `START TRANSACTION [modes]`, `COMMIT|END [WORK|TRANSACTION] [AND [NO] CHAIN]`,
//! `ROLLBACK|ABORT [WORK|TRANSACTION] [AND [NO] CHAIN]`,
//! `ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name`, `SAVEPOINT name`,
//! `RELEASE [SAVEPOINT] name`. Transaction modes (isolation level, READ
//! WRITE, …) are accepted and ignored: every transaction is
//! snapshot-isolated.

use cirro_common::Result;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::{Words, syntax};

#[derive(Debug, Clone, PartialEq)]
pub enum TransactionStatement {
    Begin,
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
        modes(&mut words)?;
        TransactionStatement::Begin
    } else if words.keywords(&["start", "transaction"]) {
        modes(&mut words)?;
        TransactionStatement::Begin
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

/// Skip transaction modes: words and commas (`ISOLATION LEVEL REPEATABLE
/// READ, READ WRITE`).
fn modes(words: &mut Words) -> Result<()> {
    while let Some(token) = words.peek() {
        match token {
            Token::Word(_) | Token::Comma => words.at += 1,
            other => return Err(syntax(format!("syntax error at or near \"{other}\""))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::solid;

    #[test]
    fn parses_transaction_control() {
        let parse_sql = |sql: &str| parse(&solid(sql)).expect("parse");
        use TransactionStatement::*;
        assert_eq!(parse_sql("BEGIN"), Some(Begin));
        assert_eq!(
            parse_sql("start transaction isolation level repeatable read, read write"),
            Some(Begin)
        );
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
