//! The declared length of a VARCHAR(n) or CHAR(n) column, and PostgreSQL's
//! rule for a value written to it.
//!
//! Arrow strings have no length, so the declaration travels as field
//! metadata under Spark's key (`__CHAR_VARCHAR_TYPE_STRING` = `varchar(3)`),
//! which a Delta schema keeps (Spark reads it the same way). A value longer
//! than the length is refused with 22001, unless what is past the length is
//! spaces only: those are cut (PostgreSQL's rule for both types).

use arrow::datatypes::Field;

use crate::{CirroError, Result, SqlState};

/// The field metadata key of a string column's declared length.
pub const CHAR_VARCHAR_KEY: &str = "__CHAR_VARCHAR_TYPE_STRING";

/// A declared length: `varchar(n)` or `char(n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CharLength {
    pub length: usize,
    /// CHAR(n) (blank-padded in PostgreSQL; kept unpadded here).
    pub char: bool,
}

impl CharLength {
    /// The length `field`'s metadata declares, if any.
    pub fn of(field: &Field) -> Option<Self> {
        let spelled = field.metadata().get(CHAR_VARCHAR_KEY)?.to_ascii_lowercase();
        let (kind, rest) = spelled.split_once('(')?;
        let length = rest.strip_suffix(')')?.trim().parse().ok()?;
        Some(Self {
            length,
            char: kind.trim() == "char",
        })
    }

    /// The metadata value that declares this length.
    pub fn spelled(&self) -> String {
        let kind = if self.char { "char" } else { "varchar" };
        format!("{kind}({})", self.length)
    }

    /// PostgreSQL's name of the type (`character varying(3)`).
    pub fn type_name(&self) -> String {
        let kind = if self.char {
            "character"
        } else {
            "character varying"
        };
        format!("{kind}({})", self.length)
    }

    /// `value` as the column stores it: itself, or cut to the length where
    /// only spaces are past it; 22001 otherwise.
    pub fn fit<'a>(&self, value: &'a str) -> Result<&'a str> {
        // Characters, not bytes; the byte length bounds the count.
        if value.len() <= self.length {
            return Ok(value);
        }
        match value.char_indices().nth(self.length) {
            None => Ok(value),
            Some((at, _)) if value[at..].bytes().all(|b| b == b' ') => Ok(&value[..at]),
            Some(_) => Err(CirroError::new(
                SqlState::STRING_DATA_RIGHT_TRUNCATION,
                format!("value too long for type {}", self.type_name()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fit_as_postgresql_fits_them() {
        let v3 = CharLength {
            length: 3,
            char: false,
        };
        assert_eq!(v3.fit("abc").ok(), Some("abc"));
        assert_eq!(v3.fit("ab").ok(), Some("ab"));
        assert_eq!(v3.fit("abc   ").ok(), Some("abc"));
        assert_eq!(v3.fit("äöü").ok(), Some("äöü"));
        let err = v3.fit("abcdef").expect_err("too long");
        assert_eq!(err.code(), "22001");
        assert_eq!(err.message, "value too long for type character varying(3)");
        assert!(v3.fit("ab d").is_err());
        let field = Field::new("c", arrow::datatypes::DataType::Utf8, true)
            .with_metadata([(CHAR_VARCHAR_KEY.to_string(), "char(5)".to_string())].into());
        assert_eq!(
            CharLength::of(&field),
            Some(CharLength {
                length: 5,
                char: true
            })
        );
    }
}
