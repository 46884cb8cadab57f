//! Column types: what SQL types become in a Cirro table, and back.
//!
//! Tables store Delta types. SQL strings (VARCHAR, TEXT) are Delta `string`,
//! TIMESTAMP is `timestamp_ntz` (microseconds), TIMESTAMPTZ is `timestamp` (UTC).
//! Scans present strings as `Utf8View`, as DataFusion's own Parquet reader does.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use cirro_common::char_length::{CHAR_VARCHAR_KEY, CharLength};
use cirro_common::{CirroError, Result, SqlState};

/// The SQL name of a column type, as DESCRIBE shows it.
pub fn sql_type_name(data_type: &DataType) -> String {
    use DataType::*;
    match data_type {
        Boolean => "BOOLEAN".into(),
        Int8 | Int16 | UInt8 => "SMALLINT".into(),
        Int32 | UInt16 => "INTEGER".into(),
        Int64 | UInt32 => "BIGINT".into(),
        Float16 | Float32 => "REAL".into(),
        Float64 => "DOUBLE PRECISION".into(),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => {
            format!("DECIMAL({p},{s})")
        }
        Utf8 | LargeUtf8 | Utf8View => "VARCHAR".into(),
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => "BYTEA".into(),
        Date32 | Date64 => "DATE".into(),
        Timestamp(_, None) => "TIMESTAMP".into(),
        Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".into(),
        Time32(_) | Time64(_) => "TIME".into(),
        Interval(_) | Duration(_) => "INTERVAL".into(),
        List(field) | LargeList(field) | ListView(field) | FixedSizeList(field, _) => {
            format!("{}[]", sql_type_name(field.data_type()))
        }
        Null => "NULL".into(),
        other => other.to_string(),
    }
}

/// The type a column of type `data_type` is stored as.
pub fn storage_type(name: &str, data_type: &DataType) -> Result<DataType> {
    use DataType::*;
    Ok(match data_type {
        Boolean | Int8 | Int16 | Int32 | Int64 | Float32 | Float64 | Date32 | Binary => {
            data_type.clone()
        }
        Utf8 | LargeUtf8 | Utf8View => Utf8,
        LargeBinary | BinaryView => Binary,
        UInt8 => Int16,
        UInt16 => Int32,
        UInt32 | UInt64 => Int64,
        Float16 => Float32,
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) if *p <= 38 => Decimal128(*p, *s),
        Date64 => Date32,
        Timestamp(_, None) => Timestamp(TimeUnit::Microsecond, None),
        Timestamp(_, Some(_)) => Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        Null => {
            return Err(CirroError::new(
                SqlState::DATATYPE_MISMATCH,
                format!("column \"{name}\" has no type (NULL); add a CAST"),
            ));
        }
        other => {
            return Err(CirroError::unsupported(format!(
                "column \"{name}\" has type {other}, which tables cannot store yet"
            )));
        }
    })
}

/// The schema a table stores for the given (SQL-planned) schema.
pub fn storage_schema(schema: &Schema) -> Result<SchemaRef> {
    let mut seen = std::collections::HashSet::new();
    let fields = schema
        .fields()
        .iter()
        .map(|f| {
            if !seen.insert(f.name().to_ascii_lowercase()) {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_COLUMN,
                    format!("column \"{}\" specified more than once", f.name()),
                ));
            }
            let stored = Field::new(
                f.name(),
                storage_type(f.name(), f.data_type())?,
                f.is_nullable(),
            );
            // A declared VARCHAR/CHAR length is kept with the column (and
            // checked by every write: `write::conform`).
            Ok(match CharLength::of(f) {
                Some(length) if stored.data_type() == &DataType::Utf8 => {
                    stored.with_metadata([(CHAR_VARCHAR_KEY.to_string(), length.spelled())].into())
                }
                _ => stored,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if fields.is_empty() {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "a table needs at least one column",
        ));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The schema scans present: strings and binaries as view types.
pub fn scan_schema(stored: &Schema) -> SchemaRef {
    let fields: Vec<Field> = stored
        .fields()
        .iter()
        .map(|f| {
            let data_type = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
                other => other.clone(),
            };
            Field::new(f.name(), data_type, f.is_nullable())
        })
        .collect();
    Arc::new(Schema::new(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_types_map_to_storage_types() {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Nanosecond, None), false),
            Field::new("d", DataType::Decimal128(15, 2), true),
        ]);
        let stored = storage_schema(&schema).expect("maps");
        assert_eq!(stored.field(0).data_type(), &DataType::Utf8);
        assert_eq!(
            stored.field(1).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        assert!(!stored.field(1).is_nullable());
        assert_eq!(
            scan_schema(&stored).field(0).data_type(),
            &DataType::Utf8View
        );
    }

    #[test]
    fn duplicate_and_null_columns_are_refused() {
        let dup = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("A", DataType::Int32, true),
        ]);
        assert_eq!(
            storage_schema(&dup).unwrap_err().state,
            SqlState::DUPLICATE_COLUMN
        );
        let null = Schema::new(vec![Field::new("a", DataType::Null, true)]);
        assert_eq!(
            storage_schema(&null).unwrap_err().state,
            SqlState::DATATYPE_MISMATCH
        );
    }
}
