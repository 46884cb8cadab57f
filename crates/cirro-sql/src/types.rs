//! SQL type names as PostgreSQL reads them, where DataFusion reads them
//! otherwise (a DataFusion [`TypePlanner`], asked before DataFusion's own
//! mapping):
//!
//! | written                   | PostgreSQL              | Arrow            |
//! |---------------------------|-------------------------|------------------|
//! | `FLOAT`, `FLOAT(25..53)`  | double precision        | Float64          |
//! | `FLOAT(1..24)`            | real                    | Float32          |
//! | `FLOAT(0)`, `FLOAT(54..)` | 22023                   | —                |
//! | `NUMERIC(0)`, `NUMERIC(p > 38)`, scale < 0 or > p | 22023 (p 0 or > 1000); allowed | — (22023; 0A000) |
//!
//! | `VARCHAR(n)`, `CHAR(n)`   | length-checked text     | Utf8View, with `CHAR_VARCHAR_KEY` |
//!
//! A string column's declared length travels as field metadata under
//! Spark's key (`__CHAR_VARCHAR_TYPE_STRING` = `varchar(3)`), which the
//! Delta schema keeps: writes check it (22001, with PostgreSQL's rule that
//! spaces past the length are cut, not refused; `cirro_storage::write`).
//! CHAR(n) values are kept without the padding PostgreSQL adds (its
//! comparisons and `length` ignore that padding anyway).
//!
//! DataFusion reads a bare `FLOAT` as a 32-bit float. Tables created with it
//! by an earlier release keep their stored `float` (Float32) columns, which
//! DESCRIBE and `\d` show as `real`: only new statements read the name anew.

use cirro_common::char_length::{CHAR_VARCHAR_KEY, CharLength};
use cirro_common::{CirroError, SqlState};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::planner::TypePlanner;
use datafusion::sql::sqlparser::ast::{CharacterLength, DataType as SqlType, ExactNumberInfo};

/// The longest declared VARCHAR/CHAR length (PostgreSQL's).
pub const CHAR_LENGTH_MAX: u64 = 10_485_760;

/// The widest NUMERIC Cirro keeps (Decimal128's precision).
pub const NUMERIC_PRECISION_MAX: u64 = 38;

#[derive(Debug, Default)]
pub struct PgTypes;

fn refuse(state: SqlState, message: String) -> datafusion::error::DataFusionError {
    CirroError::new(state, message).into_datafusion()
}

impl TypePlanner for PgTypes {
    fn plan_type_field(&self, sql_type: &SqlType) -> DfResult<Option<FieldRef>> {
        let data_type = match sql_type {
            SqlType::Float(ExactNumberInfo::None) => DataType::Float64,
            SqlType::Float(ExactNumberInfo::Precision(p)) => match p {
                0 => {
                    return Err(refuse(
                        SqlState::INVALID_PARAMETER_VALUE,
                        "precision for type float must be at least 1 bit".into(),
                    ));
                }
                1..=24 => DataType::Float32,
                25..=53 => DataType::Float64,
                _ => {
                    return Err(refuse(
                        SqlState::INVALID_PARAMETER_VALUE,
                        "precision for type float must be less than 54 bits".into(),
                    ));
                }
            },
            SqlType::Varchar(Some(length))
            | SqlType::CharacterVarying(Some(length))
            | SqlType::CharVarying(Some(length))
            | SqlType::Char(Some(length))
            | SqlType::Character(Some(length)) => {
                let char = matches!(sql_type, SqlType::Char(_) | SqlType::Character(_));
                let name = if char {
                    "character"
                } else {
                    "character varying"
                };
                let length = match length {
                    CharacterLength::IntegerLength { length, .. } => *length,
                    CharacterLength::Max => return Ok(None),
                };
                if length == 0 || length > CHAR_LENGTH_MAX {
                    return Err(refuse(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("length for type {name} must be between 1 and {CHAR_LENGTH_MAX}"),
                    ));
                }
                let declared = CharLength {
                    length: length as usize,
                    char,
                };
                let field = datafusion::arrow::datatypes::Field::new("", DataType::Utf8View, true)
                    .with_metadata([(CHAR_VARCHAR_KEY.to_string(), declared.spelled())].into());
                return Ok(Some(std::sync::Arc::new(field)));
            }
            SqlType::Numeric(info) | SqlType::Decimal(info) | SqlType::Dec(info) => {
                let precision = match info {
                    ExactNumberInfo::None => return Ok(None),
                    ExactNumberInfo::Precision(p) => *p,
                    ExactNumberInfo::PrecisionAndScale(p, _) => *p,
                };
                if precision == 0 || precision > 1000 {
                    return Err(refuse(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("NUMERIC precision {precision} must be between 1 and 1000"),
                    ));
                }
                if precision > NUMERIC_PRECISION_MAX {
                    return Err(refuse(
                        SqlState::FEATURE_NOT_SUPPORTED,
                        format!(
                            "NUMERIC precision {precision} is not supported: Cirro keeps at most {NUMERIC_PRECISION_MAX} digits"
                        ),
                    ));
                }
                if let ExactNumberInfo::PrecisionAndScale(p, s) = info
                    && (*s < 0 || *s as u64 > *p)
                {
                    // PostgreSQL 15 allows both (NUMERIC(2,5), NUMERIC(3,-2)).
                    return Err(refuse(
                        SqlState::FEATURE_NOT_SUPPORTED,
                        format!(
                            "NUMERIC scale {s} is not supported: Cirro keeps scales between 0 and the precision ({p})"
                        ),
                    ));
                }
                return Ok(None);
            }
            _ => return Ok(None),
        };
        Ok(Some(std::sync::Arc::new(
            datafusion::arrow::datatypes::Field::new("", data_type, true),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(sql_type: SqlType) -> Result<Option<DataType>, String> {
        PgTypes
            .plan_type_field(&sql_type)
            .map(|f| f.map(|f| f.data_type().clone()))
            .map_err(|e| cirro_common::CirroError::from(e).code().to_string())
    }

    #[test]
    fn float_names_as_postgresql_maps_them() {
        assert_eq!(
            planned(SqlType::Float(ExactNumberInfo::None)),
            Ok(Some(DataType::Float64))
        );
        let p = |p| SqlType::Float(ExactNumberInfo::Precision(p));
        assert_eq!(planned(p(24)), Ok(Some(DataType::Float32)));
        assert_eq!(planned(p(25)), Ok(Some(DataType::Float64)));
        assert_eq!(planned(p(53)), Ok(Some(DataType::Float64)));
        assert_eq!(planned(p(0)), Err("22023".to_string()));
        assert_eq!(planned(p(54)), Err("22023".to_string()));
        assert_eq!(planned(SqlType::Real), Ok(None));
    }

    #[test]
    fn string_lengths_travel_as_metadata() {
        let varchar = SqlType::Varchar(Some(CharacterLength::IntegerLength {
            length: 3,
            unit: None,
        }));
        let field = PgTypes
            .plan_type_field(&varchar)
            .expect("plan")
            .expect("planned");
        assert_eq!(
            CharLength::of(&field),
            Some(CharLength {
                length: 3,
                char: false
            })
        );
        let zero = SqlType::Char(Some(CharacterLength::IntegerLength {
            length: 0,
            unit: None,
        }));
        assert_eq!(planned(zero), Err("22023".to_string()));
        assert_eq!(planned(SqlType::Varchar(None)), Ok(None));
    }

    #[test]
    fn numeric_precision_is_checked() {
        let n = |p, s| SqlType::Numeric(ExactNumberInfo::PrecisionAndScale(p, s));
        assert_eq!(planned(n(0, 0)), Err("22023".to_string()));
        assert_eq!(planned(n(39, 2)), Err("0A000".to_string()));
        assert_eq!(planned(n(3, 5)), Err("0A000".to_string()));
        assert_eq!(planned(n(15, 2)), Ok(None));
    }
}
