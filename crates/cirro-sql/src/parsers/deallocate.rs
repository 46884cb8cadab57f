//! `DEALLOCATE [PREPARE] name | ALL`: forget a prepared statement (drivers
//! send `DEALLOCATE ALL` after DDL, as psycopg does).

use cirro_common::Result;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::Words;

/// Parse `tokens` if they are a DEALLOCATE: `Some(None)` for ALL,
/// `Some(Some(name))` for one statement.
pub(crate) fn parse(tokens: &[Token]) -> Result<Option<Option<String>>> {
    let mut words = Words::new(tokens);
    if !words.keyword("deallocate") {
        return Ok(None);
    }
    words.keyword("prepare");
    let name = if words.keyword("all") {
        None
    } else {
        Some(words.ident("a prepared statement name")?)
    };
    words.end()?;
    Ok(Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::solid;

    #[test]
    fn parses_deallocate() {
        let parse_sql = |sql: &str| parse(&solid(sql)).expect("parse");
        assert_eq!(parse_sql("DEALLOCATE ALL"), Some(None));
        assert_eq!(
            parse_sql("deallocate prepare _pg3_1"),
            Some(Some("_pg3_1".into()))
        );
        assert_eq!(parse_sql("SELECT 1"), None);
        assert!(parse(&solid("DEALLOCATE")).is_err());
    }
}
