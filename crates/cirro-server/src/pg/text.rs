//! Values as PostgreSQL writes them in text format, where pgwire's writing
//! differs: pgwire prints every timestamp and time with six fractional
//! digits (`2024-05-17 10:00:00.000000`); PostgreSQL drops trailing zeros of
//! the fraction and the point with them (`2024-05-17 10:00:00`,
//! `10:00:00.5`). Clients that compare or parse the text (psql users,
//! scripts, the differential test against DuckDB) see PostgreSQL's form.

use arrow_pg::encoder::Encoder;
use bytes::BytesMut;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::types::ToSqlText;
use postgres_types::{IsNull, ToSql, Type};

/// An arrow-pg encoder whose text-format times read as PostgreSQL's.
pub(crate) struct PgText<E>(pub E);

fn is_time(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::TIMESTAMP | Type::TIMESTAMPTZ | Type::TIME | Type::TIMETZ
    )
}

/// `text` with the zeros ending its fractional seconds removed, and the
/// point if nothing is left after it. The fraction is the run of digits
/// after the first '.' following a ':' (a time zone such as `+05:30` or a
/// trailing year, as in the Postgres date style, stays as it is).
fn trim_fraction(text: &str) -> String {
    let Some(colon) = text.find(':') else {
        return text.to_string();
    };
    let Some(point) = text[colon..].find('.').map(|p| p + colon) else {
        return text.to_string();
    };
    let digits_end = text[point + 1..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(text.len(), |e| e + point + 1);
    let kept = text[point + 1..digits_end].trim_end_matches('0');
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..point]);
    if !kept.is_empty() {
        out.push('.');
        out.push_str(kept);
    }
    out.push_str(&text[digits_end..]);
    out
}

impl<E: Encoder> Encoder for PgText<E> {
    type Item = E::Item;

    fn encode_field<T>(&mut self, value: &T, pg_field: &FieldInfo) -> PgWireResult<()>
    where
        T: ToSql + ToSqlText + Sized,
    {
        if pg_field.format() != FieldFormat::Text || !is_time(pg_field.datatype()) {
            return self.0.encode_field(value, pg_field);
        }
        let mut text = BytesMut::new();
        let written = value
            .to_sql_text(pg_field.datatype(), &mut text, pg_field.format_options())
            .map_err(PgWireError::ApiError)?;
        match written {
            IsNull::Yes => self.0.encode_field(&None::<String>, pg_field),
            IsNull::No => {
                let text = String::from_utf8_lossy(&text);
                self.0.encode_field(&trim_fraction(&text), pg_field)
            }
        }
    }

    fn take_row(&mut self) -> Self::Item {
        self.0.take_row()
    }
}

#[cfg(test)]
mod tests {
    use super::trim_fraction;

    #[test]
    fn trailing_zeros_of_the_fraction_go() {
        assert_eq!(
            trim_fraction("2024-05-17 10:00:00.000000"),
            "2024-05-17 10:00:00"
        );
        assert_eq!(
            trim_fraction("2024-05-17 10:00:00.500000"),
            "2024-05-17 10:00:00.5"
        );
        assert_eq!(
            trim_fraction("2024-05-17 10:00:00.123456"),
            "2024-05-17 10:00:00.123456"
        );
        assert_eq!(trim_fraction("10:00:00.000000"), "10:00:00");
        assert_eq!(
            trim_fraction("2024-05-17 10:00:00.250000+05:30"),
            "2024-05-17 10:00:00.25+05:30"
        );
        assert_eq!(
            trim_fraction("Fri May 17 10:00:00.000000 2024"),
            "Fri May 17 10:00:00 2024"
        );
        assert_eq!(trim_fraction("2024-05-17 10:00:00"), "2024-05-17 10:00:00");
    }
}
