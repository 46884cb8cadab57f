//! NUMERIC values on the wire with all of Arrow's 38 digits. arrow-pg
//! encodes a Decimal128 through rust_decimal, which holds 28: a 29-digit
//! difference or product (`n1510 - i8`, `10^12 * n380`) failed with 22003
//! where PostgreSQL answers (found by the differential test against
//! PostgreSQL 15). Text as PostgreSQL writes a NUMERIC (every digit of its
//! scale), binary as its `numeric_send` does: base-10000 digits, their
//! weight, the sign and the display scale.

use std::error::Error;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Decimal128Type, Field};
use arrow_pg::encoder::{Encoder, encode_value};
use bytes::{BufMut, BytesMut};
use pgwire::api::results::FieldInfo;
use pgwire::error::PgWireResult;
use pgwire::types::ToSqlText;
use pgwire::types::format::FormatOptions;
use postgres_types::{IsNull, ToSql, Type, to_sql_checked};

/// One NUMERIC: `value` × 10^-`scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PgNumeric {
    pub value: i128,
    pub scale: i8,
}

/// PostgreSQL's `NUMERIC_NEG` sign word.
const NEGATIVE: u16 = 0x4000;

impl PgNumeric {
    /// The digits of |value| split at the point: (integer part, fraction of
    /// `scale` digits). A negative scale appends zeros to the integer part.
    fn parts(&self) -> (String, String) {
        let mut digits = self.value.unsigned_abs().to_string();
        if self.scale <= 0 {
            digits.push_str(&"0".repeat(usize::from(self.scale.unsigned_abs())));
            return (digits, String::new());
        }
        let scale = self.scale as usize;
        if digits.len() <= scale {
            digits.insert_str(0, &"0".repeat(scale + 1 - digits.len()));
        }
        let fraction = digits.split_off(digits.len() - scale);
        (digits, fraction)
    }

    /// The text PostgreSQL writes: `-12.50`.
    pub fn text(&self) -> String {
        let (integer, fraction) = self.parts();
        let sign = if self.value < 0 { "-" } else { "" };
        if fraction.is_empty() {
            format!("{sign}{integer}")
        } else {
            format!("{sign}{integer}.{fraction}")
        }
    }

    /// `numeric_send`'s form: ndigits, weight, sign, dscale (each 16 bits),
    /// then the base-10000 digits from the most significant, without
    /// leading or trailing zero digits.
    pub fn binary(&self, out: &mut BytesMut) {
        let (integer, fraction) = self.parts();
        let groups_of = |s: &str| -> Vec<i16> {
            s.as_bytes()
                .chunks(4)
                .map(|c| c.iter().fold(0i16, |n, d| n * 10 + i16::from(d - b'0')))
                .collect()
        };
        let lead = (4 - integer.len() % 4) % 4;
        let integer = format!("{}{integer}", "0".repeat(lead));
        let trail = (4 - fraction.len() % 4) % 4;
        let fraction = format!("{fraction}{}", "0".repeat(trail));
        let mut digits = groups_of(&integer);
        let mut weight = digits.len() as i16 - 1;
        digits.extend(groups_of(&fraction));
        let leading = digits.iter().take_while(|d| **d == 0).count();
        digits.drain(..leading);
        weight -= leading as i16;
        while digits.last() == Some(&0) {
            digits.pop();
        }
        if digits.is_empty() {
            weight = 0;
        }
        let sign = if self.value < 0 && !digits.is_empty() {
            NEGATIVE
        } else {
            0
        };
        out.put_i16(digits.len() as i16);
        out.put_i16(weight);
        out.put_u16(sign);
        out.put_u16(u16::from(self.scale.max(0).unsigned_abs()));
        for d in digits {
            out.put_i16(d);
        }
    }
}

impl ToSql for PgNumeric {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.binary(out);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }

    to_sql_checked!();
}

impl ToSqlText for PgNumeric {
    fn to_sql_text(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
        _format_options: &FormatOptions,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.put_slice(self.text().as_bytes());
        Ok(IsNull::No)
    }
}

/// Row `row` of `array` through `encoder`: a NUMERIC through [`PgNumeric`],
/// every other type through arrow-pg.
pub(crate) fn encode_cell<E: Encoder>(
    encoder: &mut E,
    array: &ArrayRef,
    row: usize,
    field: &Field,
    pg_field: &FieldInfo,
) -> PgWireResult<()> {
    if let DataType::Decimal128(_, scale) = array.data_type()
        && *pg_field.datatype() == Type::NUMERIC
    {
        let value = (!array.is_null(row)).then(|| PgNumeric {
            value: array.as_primitive::<Decimal128Type>().value(row),
            scale: *scale,
        });
        return encoder.encode_field(&value, pg_field);
    }
    encode_value(encoder, array, row, field, pg_field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(value: i128, scale: i8) -> PgNumeric {
        PgNumeric { value, scale }
    }

    fn words(value: i128, scale: i8) -> Vec<i16> {
        let mut out = BytesMut::new();
        n(value, scale).binary(&mut out);
        out.chunks(2)
            .map(|c| i16::from_be_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn text_keeps_every_digit_of_the_scale() {
        assert_eq!(n(1250, 2).text(), "12.50");
        assert_eq!(n(-6, 2).text(), "-0.06");
        assert_eq!(n(0, 3).text(), "0.000");
        assert_eq!(n(7, 0).text(), "7");
        assert_eq!(n(7, -2).text(), "700");
        // 38 digits, beyond rust_decimal's 28.
        let big = 10i128.pow(38) - 1;
        assert_eq!(
            n(big, 10).text(),
            format!("{}.{}", "9".repeat(28), "9".repeat(10))
        );
        assert_eq!(n(-big, 0).text(), format!("-{}", "9".repeat(38)));
    }

    #[test]
    fn binary_is_numeric_send() {
        // 12.50: digits [12, 5000], weight 0, scale 2.
        assert_eq!(words(1250, 2), vec![2, 0, 0, 2, 12, 5000]);
        // -0.06: one digit 600 at weight -1.
        assert_eq!(words(-6, 2), vec![1, -1, NEGATIVE as i16, 2, 600]);
        // 0.000: no digits.
        assert_eq!(words(0, 3), vec![0, 0, 0, 3]);
        // 123456789: 1|2345|6789, weight 2.
        assert_eq!(words(123_456_789, 0), vec![3, 2, 0, 0, 1, 2345, 6789]);
        // 10000.0000: one digit 1 at weight 1, the zeros dropped.
        assert_eq!(words(100_000_000, 4), vec![1, 1, 0, 4, 1]);
        // 0.00001: 0.0000|1000 → [1000] at weight -2.
        assert_eq!(words(1, 5), vec![1, -2, 0, 5, 1000]);
    }
}
