//! `COPY table FROM 'path' (FORMAT csv|parquet, DELIMITER 'c', HEADER true|false, NULL 's')`.
//!
//! The file is read by DataFusion's CSV or Parquet reader (parallel, streaming)
//! with the table's column types, and written with the same path as INSERT: all
//! rows or none. CSV files whose lines end in the delimiter (dbgen's `.tbl`
//! files: `a|b|c|`) are recognised by their first line and read as such.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::write::write_stream;
use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use deltalake::protocol::SaveMode;
use futures::StreamExt;

use crate::{Engine, Outcome};

const TRAILING_COLUMN: &str = "__cirro_trailing_delimiter";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Csv,
    Parquet,
}

#[derive(Debug, Clone)]
pub(crate) struct CopyFrom {
    table: TableReference,
    path: String,
    format: Format,
    delimiter: u8,
    header: bool,
    null: Option<String>,
    quote: Option<u8>,
    escape: Option<u8>,
}

fn first_word(sql: &str) -> String {
    crate::split::split_statements(sql)
        .first()
        .map(|s| {
            s.split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn single_byte(c: char, what: &str) -> Result<u8> {
    u8::try_from(c as u32)
        .ok()
        .filter(|b| b.is_ascii())
        .ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("COPY {what} must be a single ASCII character"),
            )
        })
}

/// `Some` for `COPY … FROM`; `None` for anything else (including `COPY … TO`,
/// which DataFusion runs).
pub(crate) fn parse_copy_from(sql: &str) -> Result<Option<CopyFrom>> {
    if first_word(sql) != "copy" {
        return Ok(None);
    }
    let dialect = PostgreSqlDialect {};
    let statement = match Parser::new(&dialect)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statement())
    {
        Ok(statement) => statement,
        Err(_) => return Ok(None),
    };
    let Statement::Copy {
        source,
        to: false,
        target,
        options,
        legacy_options,
        ..
    } = statement
    else {
        return Ok(None);
    };
    let CopySource::Table {
        table_name,
        columns,
    } = source
    else {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "COPY FROM needs a table",
        ));
    };
    if !columns.is_empty() {
        return Err(CirroError::unsupported(
            "COPY with a column list is not supported yet; the file must hold every column",
        ));
    }
    let path = match target {
        CopyTarget::File { filename } => filename,
        CopyTarget::Stdin => {
            return Err(CirroError::unsupported(
                "COPY FROM STDIN needs a client connection (cirro serve)",
            ));
        }
        other => {
            return Err(CirroError::unsupported(format!(
                "COPY FROM {other} is not supported"
            )));
        }
    };
    let mut copy = CopyFrom {
        table: object_name_to_table_reference(table_name, true)?,
        path,
        format: Format::Csv,
        delimiter: b',',
        header: false,
        null: None,
        quote: None,
        escape: None,
    };
    let mut delimiter_given = false;
    for option in options {
        match option {
            CopyOption::Format(name) => {
                copy.format = match name.value.to_ascii_lowercase().as_str() {
                    "csv" | "text" => Format::Csv,
                    "parquet" => Format::Parquet,
                    other => {
                        return Err(CirroError::unsupported(format!(
                            "COPY format \"{other}\" is not supported (csv, parquet)"
                        )));
                    }
                }
            }
            CopyOption::Delimiter(c) => {
                copy.delimiter = single_byte(c, "delimiter")?;
                delimiter_given = true;
            }
            CopyOption::Header(h) => copy.header = h,
            CopyOption::Null(s) => copy.null = Some(s),
            CopyOption::Quote(c) => copy.quote = Some(single_byte(c, "quote")?),
            CopyOption::Escape(c) => copy.escape = Some(single_byte(c, "escape")?),
            other => {
                return Err(CirroError::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    for option in legacy_options {
        match option {
            CopyLegacyOption::Delimiter(c) => {
                copy.delimiter = single_byte(c, "delimiter")?;
                delimiter_given = true;
            }
            CopyLegacyOption::Null(s) => copy.null = Some(s),
            CopyLegacyOption::Csv(csv) => {
                copy.format = Format::Csv;
                for o in csv {
                    match o {
                        CopyLegacyCsvOption::Header => copy.header = true,
                        CopyLegacyCsvOption::Quote(c) => {
                            copy.quote = Some(single_byte(c, "quote")?)
                        }
                        CopyLegacyCsvOption::Escape(c) => {
                            copy.escape = Some(single_byte(c, "escape")?)
                        }
                        other => {
                            return Err(CirroError::unsupported(format!(
                                "COPY option {other} is not supported"
                            )));
                        }
                    }
                }
            }
            CopyLegacyOption::Header => copy.header = true,
            other => {
                return Err(CirroError::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    if copy.format == Format::Parquet && delimiter_given {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "DELIMITER is only for FORMAT csv",
        ));
    }
    Ok(Some(copy))
}

/// Whether the first line of a local file ends in the delimiter with one field
/// more than the table has (dbgen's `a|b|c|`).
fn has_trailing_delimiter(path: &str, delimiter: u8, columns: usize) -> bool {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut line = Vec::new();
    if std::io::BufReader::new(file)
        .read_until(b'\n', &mut line)
        .is_err()
    {
        return false;
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    line.last() == Some(&delimiter) && line.iter().filter(|b| **b == delimiter).count() == columns
}

fn extension_of(path: &str) -> String {
    let p = std::path::Path::new(path);
    if p.is_dir() {
        return String::new();
    }
    p.extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default()
}

fn check_exists(path: &str) -> Result<()> {
    if path.contains("://") {
        return Ok(());
    }
    if std::path::Path::new(path).exists() {
        Ok(())
    } else {
        Err(CirroError::new(
            SqlState::UNDEFINED_FILE,
            format!("could not open file \"{path}\" for reading: No such file or directory"),
        ))
    }
}

pub(crate) async fn copy_from(engine: &Engine, copy: CopyFrom) -> Result<Outcome> {
    let (db, schema, name) = engine.resolve(&copy.table);
    let snapshot = engine.catalog().snapshot();
    let entry = match snapshot.table(&db, &schema, &name) {
        Some(entry) => entry.clone(),
        None if snapshot.view(&db, &schema, &name).is_some() => {
            return Err(CirroError::new(
                SqlState::WRONG_OBJECT_TYPE,
                format!("cannot copy to view \"{name}\""),
            ));
        }
        None => {
            return Err(CirroError::new(
                SqlState::UNDEFINED_TABLE,
                format!("relation \"{name}\" does not exist"),
            ));
        }
    };
    check_exists(&copy.path)?;
    let table = engine.catalog().open_table(&entry.location).await?;
    let stored = Arc::clone(table.stored_schema());
    let frame = match copy.format {
        Format::Csv => read_csv(engine, &copy, &stored).await?,
        Format::Parquet => read_parquet(engine, &copy, &stored).await?,
    };
    let stream = frame
        .execute_stream()
        .await?
        .map(|b| b.map_err(CirroError::from));
    let rows = write_stream(table.delta(), stored, stream, SaveMode::Append).await?;
    Ok(Outcome::command(format!("COPY {rows}")))
}

/// A plain delimited file, as COPY reads it.
pub(crate) async fn read_delimited(
    engine: &Engine,
    path: &str,
    schema: &Schema,
    delimiter: u8,
    header: bool,
) -> Result<DataFrame> {
    check_exists(path)?;
    let copy = CopyFrom {
        table: TableReference::bare("_"),
        path: path.to_string(),
        format: Format::Csv,
        delimiter,
        header,
        null: None,
        quote: None,
        escape: None,
    };
    read_csv(engine, &copy, schema).await
}

async fn read_csv(engine: &Engine, copy: &CopyFrom, stored: &Schema) -> Result<DataFrame> {
    // Read every column as nullable: NOT NULL is checked (with its own SQLSTATE)
    // when the rows are written.
    let mut fields: Vec<Field> = stored
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect();
    let trailing = has_trailing_delimiter(&copy.path, copy.delimiter, fields.len());
    if trailing {
        fields.push(Field::new(TRAILING_COLUMN, DataType::Utf8, true));
    }
    let read_schema = Schema::new(fields);
    let extension = extension_of(&copy.path);
    let mut options = CsvReadOptions::new()
        .has_header(copy.header)
        .delimiter(copy.delimiter)
        .schema(&read_schema)
        .file_extension(&extension)
        .null_regex(copy.null.as_ref().map(|n| format!("^{}$", regex_escape(n))));
    if let Some(quote) = copy.quote {
        options = options.quote(quote);
    }
    if let Some(escape) = copy.escape {
        options = options.escape(escape);
    }
    let frame = engine
        .context()
        .read_csv(copy.path.as_str(), options)
        .await?;
    if trailing {
        let names: Vec<&str> = stored.fields().iter().map(|f| f.name().as_str()).collect();
        return Ok(frame.select_columns(&names)?);
    }
    Ok(frame)
}

fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

async fn read_parquet(engine: &Engine, copy: &CopyFrom, stored: &Schema) -> Result<DataFrame> {
    let extension = extension_of(&copy.path);
    let options = ParquetReadOptions::default().file_extension(&extension);
    let frame = engine
        .context()
        .read_parquet(copy.path.as_str(), options)
        .await?;
    let file_fields: Vec<String> = frame
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    // Match columns by name where the file has them all, else by position.
    let by_name: Option<Vec<String>> = stored
        .fields()
        .iter()
        .map(|f| {
            file_fields
                .iter()
                .find(|n| n.eq_ignore_ascii_case(f.name()))
                .cloned()
        })
        .collect();
    match by_name {
        Some(names) => {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            Ok(frame.select_columns(&refs)?)
        }
        None if file_fields.len() == stored.fields().len() => Ok(frame),
        None => Err(CirroError::new(
            SqlState::DATATYPE_MISMATCH,
            format!(
                "the Parquet file has columns ({}) that do not match the table's ({})",
                file_fields.join(", "),
                stored
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_copy_from_options() {
        let copy = parse_copy_from(
            "COPY lineitem FROM '/x/l.tbl' (FORMAT csv, DELIMITER '|', HEADER false)",
        )
        .expect("parses")
        .expect("is COPY FROM");
        assert_eq!(copy.delimiter, b'|');
        assert!(!copy.header);
        assert_eq!(copy.format, Format::Csv);
        assert_eq!(copy.path, "/x/l.tbl");
        let parquet = parse_copy_from("copy t from 'a.parquet' (format parquet)")
            .expect("ok")
            .expect("some");
        assert_eq!(parquet.format, Format::Parquet);
    }

    #[test]
    fn copy_to_and_other_statements_are_not_copy_from() {
        assert!(parse_copy_from("COPY t TO 'x.csv'").expect("ok").is_none());
        assert!(parse_copy_from("select 1").expect("ok").is_none());
    }

    #[test]
    fn bad_options_are_refused() {
        let err = parse_copy_from("COPY t FROM 'x' (FORMAT avro)").expect_err("refused");
        assert_eq!(err.state, SqlState::FEATURE_NOT_SUPPORTED);
        let err = parse_copy_from("COPY t FROM 'x' (FORMAT parquet, DELIMITER '|')")
            .expect_err("refused");
        assert_eq!(err.state, SqlState::INVALID_PARAMETER_VALUE);
    }
}
