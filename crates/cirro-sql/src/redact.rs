//! What of a statement's text may be kept and shown to others.
//!
//! - [`redact_passwords`]: the `PASSWORD '…'` of `CREATE/ALTER USER|ROLE`
//!   becomes `PASSWORD '********'` before a text is kept anywhere (the
//!   statement registry, `pg_stat_activity`, the console, the slow-query
//!   log). A text that does not tokenize but names a password keeps nothing
//!   after the word.
//! - [`normalize_literals`]: every literal becomes `$n` (numbered after the
//!   statement's own placeholders), as `pg_stat_statements` shows a query:
//!   what a `pg_read_all_stats` member sees of a statement over tables it may
//!   not read.
//! - [`relations`]: the names of the tables a statement's text reads or
//!   writes, for deciding whether a viewer may see its literals.
//!
//! All three work on sqlparser's tokens, so quotes, comments and dollar
//! quoting are read as the server reads them.

use std::borrow::Cow;

use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::CirroDialect;

/// What a redacted password reads as.
pub const REDACTED: &str = "'********'";

fn tokens(text: &str) -> Option<Vec<Token>> {
    Tokenizer::new(&CirroDialect, text).tokenize().ok()
}

fn is_word(token: &Token, word: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn is_literal(token: &Token) -> bool {
    matches!(
        token,
        Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
    )
}

/// `text` with the password of every `CREATE/ALTER USER|ROLE … PASSWORD
/// '…'` replaced by [`REDACTED`] (borrowed when there is none).
pub fn redact_passwords(text: &str) -> Cow<'_, str> {
    if !text.to_ascii_lowercase().contains("password") {
        return Cow::Borrowed(text);
    }
    let Some(tokens) = tokens(text) else {
        // Not tokenizable (an open quote): keep nothing after the word.
        let at = text.to_ascii_lowercase().find("password").unwrap_or(0);
        return Cow::Owned(format!("{}PASSWORD {REDACTED}", &text[..at]));
    };
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    // Solid tokens of the current statement so far (at most two are needed).
    let mut leading: Vec<&Token> = Vec::new();
    let mut after_password = false;
    for token in &tokens {
        let solid = !matches!(token, Token::Whitespace(_));
        if matches!(token, Token::SemiColon) {
            leading.clear();
            after_password = false;
        } else if solid && leading.len() < 2 {
            leading.push(token);
        }
        let user_statement = leading.len() == 2
            && (is_word(leading[0], "create") || is_word(leading[0], "alter"))
            && (is_word(leading[1], "user") || is_word(leading[1], "role"));
        if after_password && solid && is_literal(token) {
            out.push_str(REDACTED);
            changed = true;
            after_password = false;
            continue;
        }
        if solid {
            after_password = user_statement && is_word(token, "password");
        }
        out.push_str(&token.to_string());
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    }
}

/// `text` with each literal replaced by `$n`, numbered after the highest
/// placeholder the text has; None when it does not tokenize.
pub fn normalize_literals(text: &str) -> Option<String> {
    let tokens = tokens(text)?;
    let mut next = tokens
        .iter()
        .filter_map(|t| match t {
            Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut out = String::with_capacity(text.len());
    for token in &tokens {
        if is_literal(token) {
            next += 1;
            out.push('$');
            out.push_str(&next.to_string());
        } else {
            out.push_str(&token.to_string());
        }
    }
    Some(out)
}

/// The names (each part unquoted, unquoted parts lowercased) of the relations the
/// statements of `text` name; None when the text does not parse as SQL
/// (Cirro's own statements, or a syntax error).
pub fn relations(text: &str) -> Option<Vec<Vec<String>>> {
    let statements = Parser::parse_sql(&CirroDialect, text).ok()?;
    let mut names = Vec::new();
    for statement in &statements {
        crate::walk::each_relation(statement, &mut |name| {
            names.push(
                name.0
                    .iter()
                    .filter_map(|part| part.as_ident())
                    .map(|i| match i.quote_style {
                        None => i.value.to_lowercase(),
                        Some(_) => i.value.clone(),
                    })
                    .collect(),
            );
        });
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_of_user_statements_are_redacted() {
        for (text, want) in [
            (
                "CREATE USER bob PASSWORD 'bobpw'",
                "CREATE USER bob PASSWORD '********'",
            ),
            (
                "alter role bob with superuser password  'x''y' ",
                "alter role bob with superuser password  '********' ",
            ),
            (
                "SELECT 1; CREATE ROLE a LOGIN PASSWORD $$p$$; SELECT 'password'",
                "SELECT 1; CREATE ROLE a LOGIN PASSWORD '********'; SELECT 'password'",
            ),
            (
                "create user \"Bob\" /* c */ PASSWORD E'se\\'cret'",
                "create user \"Bob\" /* c */ PASSWORD '********'",
            ),
            (
                "CREATE USER x PASSWORD 'open",
                "CREATE USER x PASSWORD '********'",
            ),
        ] {
            assert_eq!(redact_passwords(text), want, "{text}");
            assert!(!redact_passwords(text).contains("bobpw"));
        }
        // Other statements keep their text, borrowed.
        for text in [
            "SELECT password FROM t WHERE password = 'x'",
            "INSERT INTO users (password) VALUES ('x')",
            "SELECT 1",
        ] {
            assert!(matches!(redact_passwords(text), Cow::Borrowed(t) if t == text));
        }
    }

    #[test]
    fn literals_become_numbered_placeholders() {
        assert_eq!(
            normalize_literals("INSERT INTO s VALUES ('the-secret', 42, $1)").as_deref(),
            Some("INSERT INTO s VALUES ($2, $3, $1)")
        );
        assert_eq!(
            normalize_literals("SELECT x FROM t WHERE y = 1.5 -- 'c'").as_deref(),
            Some("SELECT x FROM t WHERE y = $1 -- 'c'")
        );
    }

    #[test]
    fn relations_of_a_statement() {
        assert_eq!(
            relations("SELECT * FROM a JOIN s.b ON true WHERE x IN (SELECT y FROM c)"),
            Some(vec![
                vec!["a".to_string()],
                vec!["s".to_string(), "b".to_string()],
                vec!["c".to_string()],
            ])
        );
        assert_eq!(relations("CREATE USER x PASSWORD 'y'"), None);
    }
}
