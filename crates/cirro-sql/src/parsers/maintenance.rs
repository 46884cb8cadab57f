//! Table maintenance the SQL dialect does not know:
//! `DESCRIBE|DESC HISTORY t`, `OPTIMIZE t`, `VACUUM t [RETAIN n HOURS]`,
//! PostgreSQL's `VACUUM [options] [t [, …]]`, `ANALYZE [VERBOSE] [t [, …]]`, and `CANCEL QUERY id` (a statement of
//! `cirro.queries`).

use cirro_common::{CirroError, Result, SqlState};
use datafusion::common::TableReference;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::{Words, syntax};

#[derive(Debug, Clone, PartialEq)]
pub enum Maintenance {
    /// `DESCRIBE HISTORY name`
    History(TableReference),
    /// `OPTIMIZE name`
    Optimize(TableReference),
    /// `VACUUM name RETAIN n HOURS` (`VACUUM name` alone is PostgreSQL's
    /// form, [`Maintenance::VacuumTables`])
    Vacuum(TableReference, Option<u64>),
    /// `ANALYZE [VERBOSE] [name [, …]]` (no names: every table of the
    /// database that the user owns).
    Analyze(Vec<TableReference>),
    /// PostgreSQL's `VACUUM [FULL] [FREEZE] [VERBOSE] [ANALYZE] [name [, …]]`
    /// or `VACUUM (option [value] [, …]) [name [, …]]`: each table (no
    /// names: every table of the database that the user owns) vacuumed as
    /// `VACUUM name` does, then analyzed where ANALYZE is asked; it answers
    /// PostgreSQL's command tag, not rows (pgbench runs `vacuum analyze t`
    /// and wants no rows back).
    VacuumTables {
        tables: Vec<TableReference>,
        analyze: bool,
    },
    /// `CANCEL QUERY id`
    CancelQuery(i64),
}

/// PostgreSQL's forms of VACUUM (see [`Maintenance::VacuumTables`]), after
/// the word VACUUM; None where the statement is Cirro's `VACUUM name
/// RETAIN n HOURS` (one table, no options), with `words` left as they were.
fn pg_vacuum(words: &mut Words) -> Result<Option<Maintenance>> {
    let start = words.at;
    let mut options = false;
    let mut analyze = false;
    if words.token(&Token::LParen) {
        let usage = || syntax("syntax error: expected VACUUM (option [value] [, …]) [table [, …]]");
        loop {
            let option = words.ident("a VACUUM option").map_err(|_| usage())?;
            // An option's value, if it has one: a word or a number.
            let value = match words.peek() {
                Some(Token::Word(w)) if w.quote_style.is_none() => {
                    words.at += 1;
                    Some(w.value.to_ascii_lowercase())
                }
                Some(Token::Number(n, _)) => {
                    words.at += 1;
                    Some(n.clone())
                }
                _ => None,
            };
            match option.as_str() {
                "analyze" | "analyse" => {
                    analyze = !matches!(value.as_deref(), Some("false" | "off" | "0" | "no"))
                }
                "full"
                | "freeze"
                | "verbose"
                | "disable_page_skipping"
                | "skip_locked"
                | "index_cleanup"
                | "process_toast"
                | "truncate"
                | "parallel" => {}
                other => {
                    return Err(syntax(format!("unrecognized VACUUM option \"{other}\"")));
                }
            }
            if words.token(&Token::RParen) {
                break;
            }
            if !words.token(&Token::Comma) {
                return Err(usage());
            }
        }
        options = true;
    } else {
        for option in ["full", "freeze", "verbose"] {
            options |= words.keyword(option);
        }
        analyze = words.keyword("analyze") || words.keyword("analyse");
        options |= analyze;
    }
    let tables = if words.is_end() {
        Vec::new()
    } else {
        words
            .list(|w| w.table())
            .map_err(|_| syntax("syntax error: expected VACUUM [ANALYZE] [table [, …]]"))?
    };
    // Only `VACUUM t RETAIN n HOURS` is Cirro's own form (rows back);
    // `VACUUM t` is PostgreSQL's (its tag, no rows: pgbench runs `vacuum
    // pgbench_branches` and wants none).
    if !options && tables.len() == 1 && words.word_at(0, "retain") {
        words.at = start;
        return Ok(None);
    }
    if !words.is_end() {
        return Err(syntax(
            "syntax error: expected the end of the statement after VACUUM's tables",
        ));
    }
    Ok(Some(Maintenance::VacuumTables { tables, analyze }))
}

/// Parse `tokens` if they are a maintenance statement (None otherwise).
pub(crate) fn parse(tokens: &[Token]) -> Result<Option<Maintenance>> {
    let mut words = Words::new(tokens);
    if words.keyword("cancel") {
        let usage = || syntax("syntax error: expected CANCEL QUERY <id> (see cirro.queries)");
        if !words.keyword("query") {
            return Err(usage());
        }
        let id = match words.peek() {
            Some(Token::Number(n, _)) => n.parse::<i64>().map_err(|_| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("{n} is not a query id (see cirro.queries)"),
                )
            })?,
            _ => return Err(usage()),
        };
        words.at += 1;
        if !words.is_end() {
            return Err(usage());
        }
        return Ok(Some(Maintenance::CancelQuery(id)));
    }
    if words.keyword("analyze") || words.keyword("analyse") {
        words.keyword("verbose");
        words.keyword("table");
        if words.is_end() {
            return Ok(Some(Maintenance::Analyze(Vec::new())));
        }
        let tables = words
            .list(|w| w.table())
            .map_err(|_| syntax("syntax error: expected ANALYZE [VERBOSE] [table [, …]]"))?;
        if !words.is_end() {
            return Err(CirroError::new(
                SqlState::FEATURE_NOT_SUPPORTED,
                "ANALYZE takes table names only; it analyzes every column of each",
            ));
        }
        return Ok(Some(Maintenance::Analyze(tables)));
    }
    let kind = if (words.word_at(0, "describe") || words.word_at(0, "desc"))
        && words.word_at(1, "history")
    {
        words.at = 2;
        "DESCRIBE HISTORY"
    } else if words.keyword("optimize") {
        "OPTIMIZE"
    } else if words.keyword("vacuum") {
        if let Some(vacuum) = pg_vacuum(&mut words)? {
            return Ok(Some(vacuum));
        }
        "VACUUM"
    } else {
        return Ok(None);
    };
    let table = words
        .table()
        .map_err(|_| syntax(format!("syntax error: expected {kind} <table name>")))?;
    let statement = match kind {
        "DESCRIBE HISTORY" => Maintenance::History(table),
        "OPTIMIZE" => Maintenance::Optimize(table),
        _ if words.keyword("retain") => {
            let hours = match words.peek() {
                Some(Token::Number(n, _)) => n.parse::<u64>().map_err(|_| {
                    CirroError::new(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("RETAIN needs a whole number of hours, not {n}"),
                    )
                })?,
                _ => {
                    return Err(syntax(
                        "syntax error: expected VACUUM name [RETAIN n HOURS]",
                    ));
                }
            };
            words.at += 1;
            if !(words.keyword("hours") || words.keyword("hour")) {
                return Err(syntax(
                    "syntax error: expected VACUUM name [RETAIN n HOURS]",
                ));
            }
            Maintenance::Vacuum(table, Some(hours))
        }
        _ => Maintenance::Vacuum(table, None),
    };
    if !words.is_end() {
        return Err(syntax(format!(
            "syntax error: expected the end of the statement after {kind} <table name>"
        )));
    }
    Ok(Some(statement))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::solid;

    #[test]
    fn parses_maintenance() {
        let parse_sql = |sql: &str| parse(&solid(sql));
        assert_eq!(
            parse_sql("describe history s.T").expect("parse"),
            Some(Maintenance::History(TableReference::partial("s", "t")))
        );
        assert_eq!(
            parse_sql("VACUUM \"T\" RETAIN 0 HOURS").expect("parse"),
            Some(Maintenance::Vacuum(TableReference::bare("T"), Some(0)))
        );
        assert_eq!(
            parse_sql("optimize t").expect("parse"),
            Some(Maintenance::Optimize(TableReference::bare("t")))
        );
        assert_eq!(parse_sql("DESCRIBE t").expect("parse"), None);
        assert!(parse_sql("VACUUM t RETAIN x HOURS").is_err());
        // PostgreSQL's forms: options, several tables or none.
        let tables = |analyze: bool, names: &[&str]| {
            Some(Maintenance::VacuumTables {
                tables: names.iter().map(|n| TableReference::bare(*n)).collect(),
                analyze,
            })
        };
        assert_eq!(
            parse_sql("vacuum analyze pgbench_branches").expect("parse"),
            tables(true, &["pgbench_branches"])
        );
        assert_eq!(
            parse_sql("vacuum pgbench_branches").expect("parse"),
            tables(false, &["pgbench_branches"])
        );
        assert_eq!(
            parse_sql("VACUUM FULL VERBOSE a, b").expect("parse"),
            tables(false, &["a", "b"])
        );
        assert_eq!(parse_sql("VACUUM").expect("parse"), tables(false, &[]));
        assert_eq!(
            parse_sql("VACUUM (VERBOSE, ANALYZE, PARALLEL 2) a").expect("parse"),
            tables(true, &["a"])
        );
        assert_eq!(
            parse_sql("VACUUM (ANALYZE off) a").expect("parse"),
            tables(false, &["a"])
        );
        assert!(parse_sql("VACUUM (bogus) a").is_err());
        assert!(parse_sql("VACUUM ANALYZE a RETAIN 1 HOURS").is_err());
        assert!(parse_sql("OPTIMIZE t now").is_err());
        assert!(parse_sql("OPTIMIZE").is_err());
        assert_eq!(
            parse_sql("ANALYZE").expect("parse"),
            Some(Maintenance::Analyze(Vec::new()))
        );
        assert_eq!(
            parse_sql("analyze verbose a, s.B").expect("parse"),
            Some(Maintenance::Analyze(vec![
                TableReference::bare("a"),
                TableReference::partial("s", "b")
            ]))
        );
        assert!(parse_sql("ANALYZE t (a)").is_err());
        assert_eq!(
            parse_sql("cancel query 1099511627777").expect("parse"),
            Some(Maintenance::CancelQuery(1_099_511_627_777))
        );
        assert!(parse_sql("CANCEL QUERY").is_err());
        assert!(parse_sql("CANCEL 3").is_err());
        assert!(parse_sql("CANCEL QUERY 3 4").is_err());
    }
}
