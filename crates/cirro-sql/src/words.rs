//! A cursor over a statement's tokens (whitespace and comments dropped), for
//! the small hand-written parsers of Cirro's own statement kinds. Words are
//! compared case-insensitively and only when unquoted, so `"vacuum"` is a
//! name, not the keyword.

use cirro_common::{CirroError, Result, SqlState};
use datafusion::common::TableReference;
use datafusion::sql::sqlparser::tokenizer::Token;

pub(crate) fn syntax(message: impl Into<String>) -> CirroError {
    CirroError::new(SqlState::SYNTAX_ERROR, message)
}

/// An identifier as DataFusion normalizes it: quoted keeps its case,
/// unquoted folds to lower case.
pub(crate) fn normalized(word: &datafusion::sql::sqlparser::tokenizer::Word) -> String {
    if word.quote_style.is_some() {
        word.value.clone()
    } else {
        word.value.to_lowercase()
    }
}

pub(crate) struct Words<'a> {
    tokens: &'a [Token],
    pub(crate) at: usize,
}

impl<'a> Words<'a> {
    pub(crate) fn new(tokens: &'a [Token]) -> Self {
        Self { tokens, at: 0 }
    }

    pub(crate) fn peek(&self) -> Option<&'a Token> {
        self.tokens.get(self.at)
    }

    /// Whether the token `ahead` places on is the unquoted word `word`.
    pub(crate) fn word_at(&self, ahead: usize, word: &str) -> bool {
        matches!(self.tokens.get(self.at + ahead), Some(Token::Word(w))
            if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
    }

    /// Consume the unquoted word `word` if it comes next.
    pub(crate) fn keyword(&mut self, word: &str) -> bool {
        let found = self.word_at(0, word);
        if found {
            self.at += 1;
        }
        found
    }

    /// Consume `words` if they all come next, in order.
    pub(crate) fn keywords(&mut self, words: &[&str]) -> bool {
        let found = words.iter().enumerate().all(|(i, w)| self.word_at(i, w));
        if found {
            self.at += words.len();
        }
        found
    }

    pub(crate) fn token(&mut self, token: &Token) -> bool {
        if self.peek() == Some(token) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// An identifier (normalized; see [`normalized`]).
    pub(crate) fn ident(&mut self, what: &str) -> Result<String> {
        match self.peek() {
            Some(Token::Word(w)) => {
                self.at += 1;
                Ok(normalized(w))
            }
            Some(other) => Err(syntax(format!("expected {what}, found {other}"))),
            None => Err(syntax(format!(
                "expected {what} at the end of the statement"
            ))),
        }
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        match self.peek() {
            Some(Token::SingleQuotedString(s)) | Some(Token::EscapedStringLiteral(s)) => {
                self.at += 1;
                Ok(s.clone())
            }
            _ => Err(syntax(format!("expected {what} as a quoted string"))),
        }
    }

    /// A table name: one to three identifiers joined by periods.
    pub(crate) fn table(&mut self) -> Result<TableReference> {
        let mut parts = vec![self.ident("a table name")?];
        while self.token(&Token::Period) {
            parts.push(self.ident("a table name")?);
        }
        Ok(match parts.as_slice() {
            [t] => TableReference::bare(t.as_str()),
            [s, t] => TableReference::partial(s.as_str(), t.as_str()),
            [d, s, t] => TableReference::full(d.as_str(), s.as_str(), t.as_str()),
            _ => return Err(syntax(format!("bad table name {}", parts.join(".")))),
        })
    }

    pub(crate) fn is_end(&self) -> bool {
        self.at >= self.tokens.len()
    }

    /// The statement must end here.
    pub(crate) fn end(&mut self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(other) => Err(syntax(format!("syntax error at or near \"{other}\""))),
        }
    }

    pub(crate) fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut items = vec![item(self)?];
        while self.token(&Token::Comma) {
            items.push(item(self)?);
        }
        Ok(items)
    }

    /// The tokens not consumed yet.
    pub(crate) fn rest(&self) -> &'a [Token] {
        &self.tokens[self.at.min(self.tokens.len())..]
    }
}
