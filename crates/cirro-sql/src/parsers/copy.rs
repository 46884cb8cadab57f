//! COPY in PostgreSQL's forms:
//! - `COPY t [(columns)] FROM 'path' [(FORMAT text|csv|parquet, DELIMITER 'c', HEADER b, NULL 's', QUOTE 'q', ESCAPE 'e')]`
//!   (a file on the server);
//! - `COPY t [(columns)] FROM STDIN [options]` (rows the client sends);
//! - `COPY t [(columns)] | (query) TO STDOUT [options]` (rows sent to the client);
//! - `COPY t [(columns)] | (query) TO 'path' [options]` (a file on the server).
//!
//! Without FORMAT, a file's format follows its extension (`.csv`, `.parquet`),
//! else PostgreSQL's default, text. DataFusion's `COPY … TO 'file' STORED AS …`
//! is left to DataFusion (None here). Options take the new (`WITH (…)`) and the
//! legacy (`WITH CSV HEADER`) syntax.

use cirro_common::{CirroError, Result, SqlState};
use datafusion::common::TableReference;
use datafusion::sql::planner::{IdentNormalizer, object_name_to_table_reference};
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Query, Statement,
};
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use crate::dialect::CirroDialect;
use crate::words::Words;

/// How COPY text is laid out (PostgreSQL's `FORMAT text | csv` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextFormat {
    /// CSV (true) or PostgreSQL's text format.
    pub csv: bool,
    pub delimiter: u8,
    /// The text of a NULL: `\N` in text format, the empty string in CSV.
    pub null: String,
    /// The first line names the columns (skipped when reading).
    pub header: bool,
    /// CSV only.
    pub quote: u8,
    /// CSV only: the character before a quote inside a quoted field.
    pub escape: u8,
}

impl TextFormat {
    pub fn text() -> Self {
        Self {
            csv: false,
            delimiter: b'\t',
            null: "\\N".to_string(),
            header: false,
            quote: b'"',
            escape: b'"',
        }
    }

    pub fn csv() -> Self {
        Self {
            csv: true,
            delimiter: b',',
            null: String::new(),
            header: false,
            quote: b'"',
            escape: b'"',
        }
    }
}

/// The layout of a file COPY reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFormat {
    /// PostgreSQL's text or CSV format.
    Text(TextFormat),
    Parquet,
}

/// `COPY table [(columns)] FROM 'path' (…)`.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyFrom {
    pub table: TableReference,
    /// Columns the file holds, in order (empty: all of the table's).
    pub columns: Vec<String>,
    pub path: String,
    pub format: FileFormat,
}

/// `COPY table [(columns)] | (query) TO 'path' (…)`.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyTo {
    pub source: CopyOutSource,
    pub path: String,
    pub format: FileFormat,
}

/// `COPY table [(columns)] FROM STDIN`.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyIn {
    pub table: TableReference,
    /// Columns the data holds, in order (empty: all of the table's).
    pub columns: Vec<String>,
    pub format: TextFormat,
}

/// What `COPY … TO STDOUT` sends.
#[derive(Debug, Clone, PartialEq)]
pub enum CopyOutSource {
    Table {
        table: TableReference,
        /// Empty: every column.
        columns: Vec<String>,
    },
    Query(Box<Query>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum CopyStatement {
    FromFile(CopyFrom),
    FromStdin(CopyIn),
    ToStdout {
        source: CopyOutSource,
        format: TextFormat,
    },
    ToFile(CopyTo),
}

/// Whether the solid tokens of a COPY are one Cirro runs: all but
/// DataFusion's `COPY … TO 'file' STORED AS …`. Skips the source (a name with
/// an optional column list, or a parenthesized query) without parsing it.
fn is_cirro_copy(solid: &[Token]) -> bool {
    let mut depth = 0usize;
    let mut to = false;
    for token in solid.iter().skip(1) {
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Word(w) if depth == 0 && w.quote_style.is_none() => {
                if w.value.eq_ignore_ascii_case("from") && !to {
                    return true;
                }
                if w.value.eq_ignore_ascii_case("to") {
                    to = true;
                }
                if to && w.value.eq_ignore_ascii_case("stored") {
                    return false;
                }
            }
            _ => {}
        }
    }
    to
}

/// `tokens` with the value of a boolean option (`FREEZE on`, `HEADER 1`)
/// written as TRUE or FALSE: PostgreSQL takes on/off/1/0 (pgbench -i sends
/// `WITH (freeze on)`), sqlparser only TRUE/FALSE.
fn boolean_words(tokens: &[TokenWithSpan]) -> Vec<TokenWithSpan> {
    let mut out = tokens.to_vec();
    let mut option = false;
    for token in out.iter_mut() {
        if matches!(token.token, Token::Whitespace(_)) {
            continue;
        }
        let value = match &token.token {
            Token::Word(w) if option && w.quote_style.is_none() => {
                match w.value.to_ascii_lowercase().as_str() {
                    "on" => Some(true),
                    "off" => Some(false),
                    _ => None,
                }
            }
            Token::Number(n, _) if option => match n.as_str() {
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            },
            _ => None,
        };
        if let Some(value) = value {
            token.token = Token::make_keyword(if value { "TRUE" } else { "FALSE" });
        }
        option = matches!(&token.token, Token::Word(w)
            if w.quote_style.is_none()
                && (w.value.eq_ignore_ascii_case("freeze") || w.value.eq_ignore_ascii_case("header")));
    }
    out
}

/// Parse a COPY Cirro runs (None for DataFusion's `COPY … TO 'file'`).
/// `tokens` are the statement's tokens with whitespace, `solid` without.
pub(crate) fn parse(tokens: &[TokenWithSpan], solid: &[Token]) -> Result<Option<CopyStatement>> {
    if !Words::new(solid).word_at(0, "copy") || !is_cirro_copy(solid) {
        return Ok(None);
    }
    crate::count_parse();
    let statement = Parser::new(&CirroDialect)
        .with_tokens_with_locations(boolean_words(tokens))
        .parse_statement()
        .map_err(|e| CirroError::new(SqlState::SYNTAX_ERROR, e.to_string()))?;
    let Statement::Copy {
        source,
        to,
        target,
        options,
        legacy_options,
        ..
    } = statement
    else {
        return Err(CirroError::internal("COPY parsed as another statement"));
    };
    let given = given_options(options, legacy_options)?;
    match (to, target) {
        (false, CopyTarget::Stdin) => {
            let CopySource::Table {
                table_name,
                columns,
            } = source
            else {
                return Err(needs_table());
            };
            Ok(Some(CopyStatement::FromStdin(CopyIn {
                table: object_name_to_table_reference(table_name, true)?,
                columns: normalized(columns),
                format: text_format(&given)?,
            })))
        }
        (false, target) => copy_from_file(source, target, given).map(Some),
        (true, target) => {
            let source = match source {
                CopySource::Query(query) => CopyOutSource::Query(query),
                CopySource::Table {
                    table_name,
                    columns,
                } => CopyOutSource::Table {
                    table: object_name_to_table_reference(table_name, true)?,
                    columns: normalized(columns),
                },
            };
            match target {
                CopyTarget::Stdout => Ok(Some(CopyStatement::ToStdout {
                    source,
                    format: text_format(&given)?,
                })),
                CopyTarget::File { filename } => Ok(Some(CopyStatement::ToFile(CopyTo {
                    format: file_format(&given, &filename)?,
                    source,
                    path: filename,
                }))),
                other => Err(CirroError::unsupported(format!(
                    "COPY TO {other} is not supported"
                ))),
            }
        }
    }
}

/// Column names as DataFusion normalizes them.
fn normalized(columns: Vec<datafusion::sql::sqlparser::ast::Ident>) -> Vec<String> {
    columns
        .into_iter()
        .map(|c| IdentNormalizer::new(true).normalize(c))
        .collect()
}

fn needs_table() -> CirroError {
    CirroError::new(SqlState::SYNTAX_ERROR, "COPY FROM needs a table")
}

fn copy_from_file(
    source: CopySource,
    target: CopyTarget,
    given: GivenOptions,
) -> Result<CopyStatement> {
    let CopySource::Table {
        table_name,
        columns,
    } = source
    else {
        return Err(needs_table());
    };
    let path = match target {
        CopyTarget::File { filename } => filename,
        other => {
            return Err(CirroError::unsupported(format!(
                "COPY FROM {other} is not supported"
            )));
        }
    };
    Ok(CopyStatement::FromFile(CopyFrom {
        table: object_name_to_table_reference(table_name, true)?,
        columns: normalized(columns),
        format: file_format(&given, &path)?,
        path,
    }))
}

/// The format of a file: FORMAT if given, else the file's extension (`.csv`,
/// `.parquet`), else text.
fn file_format(given: &GivenOptions, path: &str) -> Result<FileFormat> {
    let extension = std::path::Path::new(path)
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let named = match (&given.format, extension.as_deref()) {
        (Some(format), _) => format.as_str(),
        (None, Some("parquet")) => "parquet",
        (None, Some("csv")) => "csv",
        (None, _) => "text",
    };
    if named != "parquet" {
        return text_format(&GivenOptions {
            format: Some(named.to_string()),
            ..given.clone()
        })
        .map(FileFormat::Text);
    }
    if given.delimiter.is_some()
        || given.header
        || given.null.is_some()
        || given.quote.is_some()
        || given.escape.is_some()
    {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "DELIMITER, HEADER, NULL, QUOTE and ESCAPE are only for FORMAT text and csv",
        ));
    }
    Ok(FileFormat::Parquet)
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

/// The options of a COPY statement as written (new and legacy syntax).
#[derive(Debug, Default, Clone)]
struct GivenOptions {
    format: Option<String>,
    delimiter: Option<u8>,
    header: bool,
    null: Option<String>,
    quote: Option<u8>,
    escape: Option<u8>,
}

fn given_options(
    options: Vec<CopyOption>,
    legacy_options: Vec<CopyLegacyOption>,
) -> Result<GivenOptions> {
    let mut given = GivenOptions::default();
    let refused = |what: &dyn std::fmt::Display| {
        CirroError::unsupported(format!("COPY option {what} is not supported"))
    };
    for option in options {
        match option {
            CopyOption::Format(name) => given.format = Some(name.value.to_ascii_lowercase()),
            CopyOption::Delimiter(c) => given.delimiter = Some(single_byte(c, "delimiter")?),
            CopyOption::Header(h) => given.header = h,
            CopyOption::Null(s) => given.null = Some(s),
            CopyOption::Quote(c) => given.quote = Some(single_byte(c, "quote")?),
            CopyOption::Escape(c) => given.escape = Some(single_byte(c, "escape")?),
            CopyOption::Encoding(e)
                if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
            // PostgreSQL writes the rows frozen (visible to every later
            // snapshot, no hint bits to set): Cirro's committed rows already
            // are. pgbench -i sends it.
            CopyOption::Freeze(_) => {}
            other => return Err(refused(&other)),
        }
    }
    for option in legacy_options {
        match option {
            CopyLegacyOption::Delimiter(c) => given.delimiter = Some(single_byte(c, "delimiter")?),
            CopyLegacyOption::Null(s) => given.null = Some(s),
            CopyLegacyOption::Binary => given.format = Some("binary".to_string()),
            CopyLegacyOption::Csv(csv) => {
                given.format = Some("csv".to_string());
                for o in csv {
                    match o {
                        CopyLegacyCsvOption::Header => given.header = true,
                        CopyLegacyCsvOption::Quote(c) => {
                            given.quote = Some(single_byte(c, "quote")?)
                        }
                        CopyLegacyCsvOption::Escape(c) => {
                            given.escape = Some(single_byte(c, "escape")?)
                        }
                        other => return Err(refused(&other)),
                    }
                }
            }
            CopyLegacyOption::Header => given.header = true,
            other => return Err(refused(&other)),
        }
    }
    Ok(given)
}

fn text_format(given: &GivenOptions) -> Result<TextFormat> {
    let mut format = match given.format.as_deref() {
        None | Some("text") => TextFormat::text(),
        Some("csv") => TextFormat::csv(),
        Some(other) => {
            return Err(CirroError::unsupported(format!(
                "COPY FORMAT {other} is not supported (text, csv; parquet for files)"
            )));
        }
    };
    if let Some(delimiter) = given.delimiter {
        if delimiter == b'\n' || delimiter == b'\r' || !format.csv && delimiter == b'\\' {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                "COPY delimiter cannot be newline, carriage return or (in text format) backslash",
            ));
        }
        format.delimiter = delimiter;
    }
    if let Some(null) = &given.null {
        format.null = null.clone();
    }
    format.header = given.header;
    if given.quote.is_some() || given.escape.is_some() {
        if !format.csv {
            return Err(CirroError::new(
                SqlState::FEATURE_NOT_SUPPORTED,
                "COPY QUOTE and ESCAPE are only for FORMAT csv",
            ));
        }
        format.quote = given.quote.unwrap_or(format.quote);
        format.escape = given.escape.unwrap_or(format.quote);
    }
    if format.csv && format.delimiter == format.quote {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "COPY delimiter and quote must be different",
        ));
    }
    Ok(format)
}
