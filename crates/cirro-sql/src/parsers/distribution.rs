//! `DISTRIBUTED BY [HASH] (col, …) BUCKETS n` of CREATE TABLE, which
//! sqlparser does not know: found among the statement's tokens (outside
//! parentheses, before `AS`), taken out, and the rest goes to DataFusion's
//! parser.
//!
//! ```text
//! CREATE TABLE name [(columns)] [WITH (options)]
//!     DISTRIBUTED BY [HASH] (col[, …]) BUCKETS n
//!     [AS SELECT …]
//! ```
//!
//! `ALTER TABLE … SET DISTRIBUTED BY …` (changing the distribution of a
//! table) is refused with 0A000.

use cirro_common::{CirroError, Result, SqlState};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use crate::statement::DistributedBy;
use crate::words::{normalized, syntax};

fn is_word(token: &Token, word: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// Positions in `tokens` of the solid tokens (not whitespace or comments).
fn solid_positions(tokens: &[TokenWithSpan]) -> Vec<usize> {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        .map(|(i, _)| i)
        .collect()
}

/// Take `DISTRIBUTED BY …` out of a CREATE TABLE statement's tokens, if it
/// is there.
pub(crate) fn take(tokens: &mut Vec<TokenWithSpan>) -> Result<Option<DistributedBy>> {
    let solid = solid_positions(tokens);
    let token = |k: usize| solid.get(k).map(|&i| &tokens[i].token);
    let creates_table =
        (0..solid.len().min(6)).any(|k| token(k).is_some_and(|t| is_word(t, "table")));
    if !creates_table {
        return Ok(None);
    }
    let mut depth = 0usize;
    let mut start = None;
    for k in 0..solid.len() {
        let t = token(k).expect("in range");
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ if depth == 0 && is_word(t, "as") => break,
            _ if depth == 0 && is_word(t, "distributed") => {
                start = Some(k);
                break;
            }
            _ => {}
        }
    }
    let Some(start) = start else {
        return Ok(None);
    };
    let mut k = start + 1;
    let expect_word = |k: &mut usize, word: &str| -> Result<()> {
        if token(*k).is_some_and(|t| is_word(t, word)) {
            *k += 1;
            Ok(())
        } else {
            Err(syntax(format!(
                "expected {} after DISTRIBUTED{}",
                word.to_uppercase(),
                if word == "by" { "" } else { " BY (…)" }
            )))
        }
    };
    if token(k).is_some_and(|t| is_word(t, "randomly") || is_word(t, "replicated")) {
        return Err(CirroError::unsupported(
            "only hash distribution is supported: DISTRIBUTED BY HASH (columns) BUCKETS n",
        ));
    }
    expect_word(&mut k, "by")?;
    if token(k).is_some_and(|t| is_word(t, "hash")) {
        k += 1;
    }
    if token(k) != Some(&Token::LParen) {
        return Err(syntax("expected (columns) after DISTRIBUTED BY HASH"));
    }
    k += 1;
    let mut columns = Vec::new();
    loop {
        match token(k) {
            Some(Token::Word(w)) => columns.push(normalized(w)),
            Some(Token::RParen) if columns.is_empty() => {
                return Err(syntax("DISTRIBUTED BY HASH needs at least one column"));
            }
            other => {
                return Err(syntax(format!(
                    "expected a column name in DISTRIBUTED BY HASH (…), found {}",
                    other
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "the end".into())
                )));
            }
        }
        k += 1;
        match token(k) {
            Some(Token::Comma) => k += 1,
            Some(Token::RParen) => {
                k += 1;
                break;
            }
            _ => return Err(syntax("expected , or ) in DISTRIBUTED BY HASH (…)")),
        }
    }
    if !token(k).is_some_and(|t| is_word(t, "buckets")) {
        return Err(syntax(
            "expected BUCKETS n after DISTRIBUTED BY HASH (…): say how many buckets",
        ));
    }
    k += 1;
    let negative = token(k) == Some(&Token::Minus);
    if negative {
        k += 1;
    }
    let buckets = match token(k) {
        Some(Token::Number(text, _)) => match text.parse::<i64>() {
            Ok(n) if negative => -n,
            Ok(n) => n,
            // Too large for i64, or not an integer: out of range either way.
            Err(_) if text.chars().all(|c| c.is_ascii_digit()) => i64::MAX,
            Err(_) => {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("BUCKETS must be a whole number, not {text}"),
                ));
            }
        },
        _ => return Err(syntax("expected a number after BUCKETS")),
    };
    let end = k + 1;
    // Drop the clause (and the whitespace inside it) from the tokens.
    let first = solid[start];
    let last = solid[end - 1];
    tokens.drain(first..=last);
    Ok(Some(DistributedBy { columns, buckets }))
}

/// 0A000 for `ALTER TABLE … SET DISTRIBUTED BY …`.
pub(crate) fn refuse_alter(solid: &[Token]) -> Result<()> {
    if solid.iter().any(|t| is_word(t, "distributed"))
        && solid.get(1).is_some_and(|t| is_word(t, "table"))
    {
        return Err(CirroError::unsupported(
            "changing the distribution of a table is not supported: create a new table with \
             CREATE TABLE new … DISTRIBUTED BY HASH (…) BUCKETS n AS SELECT * FROM old, \
             then DROP the old one and ALTER TABLE new RENAME TO old",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_sql(sql: &str) -> (Result<Option<DistributedBy>>, String) {
        let mut tokens = crate::tokenize(sql).expect("tokenize");
        let taken = take(&mut tokens);
        let rest: String = tokens.iter().map(|t| t.token.to_string()).collect();
        (taken, rest)
    }

    #[test]
    fn takes_the_clause_out() {
        let (by, rest) = take_sql(
            "CREATE TABLE t (a int, \"B\" text) WITH (compression = 'lz4') DISTRIBUTED BY HASH (a, \"B\") BUCKETS 8 AS SELECT 1",
        );
        assert_eq!(
            by.unwrap(),
            Some(DistributedBy {
                columns: vec!["a".into(), "B".into()],
                buckets: 8
            })
        );
        assert!(!rest.to_lowercase().contains("distributed"), "{rest}");
        assert!(rest.contains("AS SELECT 1"), "{rest}");
        let (by, _) = take_sql("create table t distributed by (k) buckets 4 as select 1 as k");
        assert_eq!(by.unwrap().unwrap().columns, vec!["k"]);
        // Not there, or inside the query: nothing taken.
        let (by, _) = take_sql("CREATE TABLE t AS SELECT 1 AS distributed");
        assert_eq!(by.unwrap(), None);
        let (by, _) = take_sql("CREATE VIEW v AS SELECT 1");
        assert_eq!(by.unwrap(), None);
    }

    #[test]
    fn bad_clauses_are_refused() {
        let state = |sql: &str| take_sql(sql).0.unwrap_err().state;
        assert_eq!(
            state("CREATE TABLE t (a int) DISTRIBUTED BY HASH (a)"),
            SqlState::SYNTAX_ERROR
        );
        assert_eq!(
            state("CREATE TABLE t (a int) DISTRIBUTED BY HASH () BUCKETS 2"),
            SqlState::SYNTAX_ERROR
        );
        assert_eq!(
            state("CREATE TABLE t (a int) DISTRIBUTED BY HASH (a) BUCKETS x"),
            SqlState::SYNTAX_ERROR
        );
        assert_eq!(
            state("CREATE TABLE t (a int) DISTRIBUTED RANDOMLY"),
            SqlState::FEATURE_NOT_SUPPORTED
        );
        assert_eq!(
            state("CREATE TABLE t (a int) DISTRIBUTED BY HASH (a) BUCKETS 2.5"),
            SqlState::INVALID_PARAMETER_VALUE
        );
        let (by, _) = take_sql("CREATE TABLE t (a int) DISTRIBUTED BY HASH (a) BUCKETS -3");
        assert_eq!(by.unwrap().unwrap().buckets, -3);
        let (by, _) = take_sql(
            "CREATE TABLE t (a int) DISTRIBUTED BY HASH (a) BUCKETS 99999999999999999999999",
        );
        assert_eq!(by.unwrap().unwrap().buckets, i64::MAX);
        let solid = crate::tests::solid("ALTER TABLE t SET DISTRIBUTED BY HASH (a) BUCKETS 4");
        assert_eq!(
            refuse_alter(&solid).unwrap_err().state,
            SqlState::FEATURE_NOT_SUPPORTED
        );
    }
}
