//! The one error type of Cirro: a SQLSTATE code (PostgreSQL's codes, so that
//! drivers and tools understand them) and a message a user can act on.
//!
//! Errors from DataFusion, Arrow, Parquet and delta-rs are mapped onto codes by
//! [`CirroError::from`]: by their kind where the kind says enough, by the words of
//! the message where it does not (DataFusion reports a missing table as a plan
//! error, for example).

use std::fmt;

use datafusion::error::DataFusionError;

/// A PostgreSQL SQLSTATE code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SqlState(pub &'static str);

impl SqlState {
    pub const SUCCESSFUL: SqlState = SqlState("00000");
    pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState("0A000");
    pub const CARDINALITY_VIOLATION: SqlState = SqlState("21000");
    pub const DATA_EXCEPTION: SqlState = SqlState("22000");
    pub const STRING_DATA_RIGHT_TRUNCATION: SqlState = SqlState("22001");
    pub const INVALID_ARGUMENT_FOR_LOGARITHM: SqlState = SqlState("2201E");
    pub const INVALID_ARGUMENT_FOR_POWER_FUNCTION: SqlState = SqlState("2201F");
    pub const INVALID_ROW_COUNT_IN_LIMIT_CLAUSE: SqlState = SqlState("2201W");
    pub const INVALID_ROW_COUNT_IN_RESULT_OFFSET_CLAUSE: SqlState = SqlState("2201X");
    pub const DATETIME_FIELD_OVERFLOW: SqlState = SqlState("22008");
    pub const NUMERIC_VALUE_OUT_OF_RANGE: SqlState = SqlState("22003");
    pub const INVALID_DATETIME_FORMAT: SqlState = SqlState("22007");
    pub const DIVISION_BY_ZERO: SqlState = SqlState("22012");
    pub const INVALID_PARAMETER_VALUE: SqlState = SqlState("22023");
    pub const BAD_COPY_FILE_FORMAT: SqlState = SqlState("22P04");
    pub const INVALID_TEXT_REPRESENTATION: SqlState = SqlState("22P02");
    pub const SUBSTRING_ERROR: SqlState = SqlState("22011");
    pub const INVALID_COLUMN_REFERENCE: SqlState = SqlState("42P10");
    pub const CHARACTER_NOT_IN_REPERTOIRE: SqlState = SqlState("22021");
    pub const NOT_NULL_VIOLATION: SqlState = SqlState("23502");
    pub const UNIQUE_VIOLATION: SqlState = SqlState("23505");
    pub const CHECK_VIOLATION: SqlState = SqlState("23514");
    pub const INVALID_TABLE_DEFINITION: SqlState = SqlState("42P16");
    pub const GROUPING_ERROR: SqlState = SqlState("42803");
    pub const ACTIVE_SQL_TRANSACTION: SqlState = SqlState("25001");
    pub const NO_ACTIVE_SQL_TRANSACTION: SqlState = SqlState("25P01");
    pub const SAVEPOINT_EXCEPTION: SqlState = SqlState("3B001");
    pub const INVALID_SQL_STATEMENT_NAME: SqlState = SqlState("26000");
    pub const DUPLICATE_PREPARED_STATEMENT: SqlState = SqlState("42P05");
    pub const IN_FAILED_SQL_TRANSACTION: SqlState = SqlState("25P02");
    pub const INVALID_CATALOG_NAME: SqlState = SqlState("3D000");
    pub const INVALID_SCHEMA_NAME: SqlState = SqlState("3F000");
    pub const SERIALIZATION_FAILURE: SqlState = SqlState("40001");
    pub const DEADLOCK_DETECTED: SqlState = SqlState("40P01");
    pub const SYNTAX_ERROR: SqlState = SqlState("42601");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState("42501");
    pub const UNDEFINED_COLUMN: SqlState = SqlState("42703");
    pub const UNDEFINED_FUNCTION: SqlState = SqlState("42883");
    pub const UNDEFINED_TABLE: SqlState = SqlState("42P01");
    pub const UNDEFINED_PARAMETER: SqlState = SqlState("42P02");
    pub const UNDEFINED_OBJECT: SqlState = SqlState("42704");
    pub const DUPLICATE_OBJECT: SqlState = SqlState("42710");
    pub const INVALID_AUTHORIZATION: SqlState = SqlState("28000");
    pub const INVALID_PASSWORD: SqlState = SqlState("28P01");
    pub const PROTOCOL_VIOLATION: SqlState = SqlState("08P01");
    pub const DUPLICATE_TABLE: SqlState = SqlState("42P07");
    pub const DUPLICATE_SCHEMA: SqlState = SqlState("42P06");
    pub const DUPLICATE_DATABASE: SqlState = SqlState("42P04");
    pub const DUPLICATE_COLUMN: SqlState = SqlState("42701");
    pub const AMBIGUOUS_COLUMN: SqlState = SqlState("42702");
    pub const DATATYPE_MISMATCH: SqlState = SqlState("42804");
    pub const WRONG_OBJECT_TYPE: SqlState = SqlState("42809");
    pub const INVALID_OBJECT_DEFINITION: SqlState = SqlState("42P17");
    pub const DEPENDENT_OBJECTS_STILL_EXIST: SqlState = SqlState("2BP01");
    pub const INSUFFICIENT_RESOURCES: SqlState = SqlState("53000");
    pub const DISK_FULL: SqlState = SqlState("53100");
    pub const OUT_OF_MEMORY: SqlState = SqlState("53200");
    pub const QUERY_CANCELED: SqlState = SqlState("57014");
    pub const ADMIN_SHUTDOWN: SqlState = SqlState("57P01");
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState("55000");
    pub const LOCK_NOT_AVAILABLE: SqlState = SqlState("55P03");
    pub const RESERVED_NAME: SqlState = SqlState("42939");
    pub const CANNOT_CONNECT_NOW: SqlState = SqlState("57P03");
    pub const CONNECTION_FAILURE: SqlState = SqlState("08006");
    pub const READ_ONLY_SQL_TRANSACTION: SqlState = SqlState("25006");
    pub const IO_ERROR: SqlState = SqlState("58030");
    pub const UNDEFINED_FILE: SqlState = SqlState("58P01");
    pub const PROGRAM_LIMIT_EXCEEDED: SqlState = SqlState("54000");
    pub const STATEMENT_TOO_COMPLEX: SqlState = SqlState("54001");
    pub const INTERNAL_ERROR: SqlState = SqlState("XX000");
    pub const DATA_CORRUPTED: SqlState = SqlState("XX001");

    pub fn code(&self) -> &'static str {
        self.0
    }
}

impl fmt::Display for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// An error with a SQLSTATE code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CirroError {
    pub state: SqlState,
    pub message: String,
}

pub type Result<T, E = CirroError> = std::result::Result<T, E>;

impl CirroError {
    pub fn new(state: SqlState, message: impl Into<String>) -> Self {
        Self {
            state,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(SqlState::INTERNAL_ERROR, message)
    }

    /// Its SQLSTATE code (`22012`).
    pub fn code(&self) -> &'static str {
        self.state.code()
    }

    /// An I/O failure: 53100 when the disk (or quota) is full, else 58030.
    pub fn io(message: impl Into<String>) -> Self {
        let message = message.into();
        let state = if is_disk_full(&message) {
            SqlState::DISK_FULL
        } else {
            SqlState::IO_ERROR
        };
        Self::new(state, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(SqlState::FEATURE_NOT_SUPPORTED, message)
    }

    /// Carry this error through DataFusion (e.g. out of a `TableProvider`), so that
    /// [`CirroError::from`] can take its code back out on the other side.
    pub fn into_datafusion(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }
}

impl fmt::Display for CirroError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for CirroError {}

impl From<DataFusionError> for CirroError {
    fn from(err: DataFusionError) -> Self {
        from_datafusion(err)
    }
}

impl From<deltalake::DeltaTableError> for CirroError {
    fn from(err: deltalake::DeltaTableError) -> Self {
        from_delta(err)
    }
}

impl From<object_store::Error> for CirroError {
    fn from(err: object_store::Error) -> Self {
        match err {
            object_store::Error::NotFound { path, .. } => {
                CirroError::new(SqlState::UNDEFINED_FILE, format!("file not found: {path}"))
            }
            other => CirroError::io(format!("storage error: {other}")),
        }
    }
}

impl From<std::io::Error> for CirroError {
    fn from(err: std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::NotFound {
            CirroError::new(SqlState::UNDEFINED_FILE, err.to_string())
        } else {
            CirroError::io(err.to_string())
        }
    }
}

impl From<serde_json::Error> for CirroError {
    fn from(err: serde_json::Error) -> Self {
        CirroError::internal(format!("bad metadata JSON: {err}"))
    }
}

impl From<arrow::error::ArrowError> for CirroError {
    fn from(err: arrow::error::ArrowError) -> Self {
        from_arrow(&err)
    }
}

fn from_delta(err: deltalake::DeltaTableError) -> CirroError {
    use deltalake::DeltaTableError as E;
    match err {
        E::ObjectStore { source } => CirroError::from(source),
        E::Arrow { source } => from_arrow(&source),
        E::Transaction { source } => {
            // delta-rs adds a multi-line hint about isolation levels; keep
            // the first line, and say what to do.
            let text = source.to_string();
            let first = text.lines().next().unwrap_or_default().trim().to_string();
            use deltalake::kernel::transaction::TransactionError as T;
            if matches!(
                source,
                T::CommitConflict(_) | T::MaxCommitAttempts(_) | T::VersionAlreadyExists(_)
            ) {
                CirroError::new(
                    SqlState::SERIALIZATION_FAILURE,
                    format!(
                        "could not serialize access due to a concurrent update ({first}); \
                         nothing was changed, retry the statement or transaction"
                    ),
                )
            } else if matches!(
                source,
                T::UnsupportedTableFeatures(_) | T::TableFeaturesRequired(_)
            ) {
                // A table another engine wrote with features Cirro does not
                // write (CHECK constraints, generated columns, …).
                CirroError::unsupported(format!("cannot write this table: {first}"))
            } else {
                CirroError::io(format!("could not commit: {first}"))
            }
        }
        E::GenericError { source } => match source.downcast::<CirroError>() {
            Ok(inner) => *inner,
            Err(other) => CirroError::io(other.to_string()),
        },
        other => {
            let text = other.to_string();
            if text.contains("non-nullable") || text.contains("null values") {
                CirroError::new(SqlState::NOT_NULL_VIOLATION, text)
            } else {
                CirroError::io(format!("table storage error: {text}"))
            }
        }
    }
}

fn from_arrow(err: &arrow::error::ArrowError) -> CirroError {
    use arrow::error::ArrowError as A;
    let text = err.to_string();
    let state = match err {
        A::CastError(_) | A::ParseError(_) => cast_state(&text),
        A::DivideByZero => SqlState::DIVISION_BY_ZERO,
        A::ArithmeticOverflow(_) => SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        A::CsvError(_) | A::JsonError(_) => SqlState::BAD_COPY_FILE_FORMAT,
        // Arrow's IPC writer (spill files) reports a full disk this way.
        A::IoError(_, _) if is_disk_full(&text) => SqlState::DISK_FULL,
        A::IoError(_, _) => SqlState::IO_ERROR,
        A::ExternalError(inner) => {
            if let Some(cirro) = inner.downcast_ref::<CirroError>() {
                return cirro.clone();
            }
            if let Some(df) = inner.downcast_ref::<DataFusionError>() {
                return from_datafusion_ref(df);
            }
            SqlState::INTERNAL_ERROR
        }
        A::ComputeError(_) | A::InvalidArgumentError(_) => classify_message(&text),
        A::MemoryError(_) => SqlState::OUT_OF_MEMORY,
        _ => SqlState::INTERNAL_ERROR,
    };
    CirroError::new(state, clean_message(&text))
}

fn cast_state(text: &str) -> SqlState {
    let lower = text.to_ascii_lowercase();
    if lower.contains("overflow")
        || lower.contains("too large")
        || lower.contains("out of range")
        || lower.contains("can't cast value")
    {
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE
    } else if lower.contains("date") || lower.contains("timestamp") {
        SqlState::INVALID_DATETIME_FORMAT
    } else {
        SqlState::INVALID_TEXT_REPRESENTATION
    }
}

/// The parser's nesting limit (parentheses, subqueries, function arguments,
/// unary operators), as PostgreSQL reports running out of stack.
pub fn too_deeply_nested() -> CirroError {
    CirroError::new(
        SqlState::STATEMENT_TOO_COMPLEX,
        format!(
            "statement too complex: expressions or subqueries nested more than {} levels deep",
            crate::limits::STATEMENT_NESTING_DEPTH_MAX
        ),
    )
}

fn from_datafusion(err: DataFusionError) -> CirroError {
    from_datafusion_ref(&err)
}

fn from_datafusion_ref(err: &DataFusionError) -> CirroError {
    use DataFusionError as D;
    use datafusion::common::SchemaError as S;
    match err {
        D::ArrowError(inner, _) => from_arrow(inner),
        D::ParquetError(inner) => CirroError::io(format!("parquet error: {inner}")),
        D::ObjectStore(inner) => match inner.as_ref() {
            object_store::Error::NotFound { path, .. } => {
                CirroError::new(SqlState::UNDEFINED_FILE, format!("file not found: {path}"))
            }
            other => CirroError::io(format!("storage error: {other}")),
        },
        D::IoError(inner) => {
            if inner.kind() == std::io::ErrorKind::NotFound {
                CirroError::new(SqlState::UNDEFINED_FILE, inner.to_string())
            } else {
                CirroError::io(inner.to_string())
            }
        }
        D::SQL(inner, _) => match inner.as_ref() {
            datafusion::sql::sqlparser::parser::ParserError::RecursionLimitExceeded => {
                too_deeply_nested()
            }
            _ => CirroError::new(SqlState::SYNTAX_ERROR, format!("syntax error: {inner}")),
        },
        D::NotImplemented(msg) => CirroError::new(
            SqlState::FEATURE_NOT_SUPPORTED,
            format!("not supported: {msg}"),
        ),
        // DataFusion reports some errors in the user's statement as internal
        // ones (a call no signature of the function accepts, operand types
        // it cannot coerce): those the message names are the user's.
        D::Internal(msg) => match no_matching_function(msg) {
            Some(err) => err,
            None => match classify_message(msg) {
                SqlState::INTERNAL_ERROR => CirroError::internal(format!("internal error: {msg}")),
                state => CirroError::new(state, clean_message(msg)),
            },
        },
        D::Plan(msg) | D::Execution(msg) | D::Configuration(msg) => no_matching_function(msg)
            .unwrap_or_else(|| CirroError::new(classify_message(msg), clean_message(msg))),
        D::SchemaError(inner, _) => {
            let text = inner.to_string();
            let state = match inner.as_ref() {
                S::FieldNotFound { .. } => SqlState::UNDEFINED_COLUMN,
                S::AmbiguousReference { .. } => SqlState::AMBIGUOUS_COLUMN,
                S::DuplicateQualifiedField { .. } | S::DuplicateUnqualifiedField { .. } => {
                    SqlState::DUPLICATE_COLUMN
                }
            };
            CirroError::new(state, clean_message(&text))
        }
        D::ExecutionJoin(inner) => CirroError::internal(format!("task failed: {inner}")),
        D::ResourcesExhausted(msg) => CirroError::new(
            SqlState::OUT_OF_MEMORY,
            format!("resources exhausted: {msg}"),
        ),
        D::External(inner) => {
            if let Some(cirro) = inner.downcast_ref::<CirroError>() {
                return cirro.clone();
            }
            if let Some(arrow) = inner.downcast_ref::<arrow::error::ArrowError>() {
                return from_arrow(arrow);
            }
            if let Some(df) = inner.downcast_ref::<DataFusionError>() {
                return from_datafusion_ref(df);
            }
            if let Some(delta) = inner.downcast_ref::<deltalake::DeltaTableError>() {
                let text = delta.to_string();
                return CirroError::new(classify_message(&text), text);
            }
            let text = inner.to_string();
            CirroError::new(classify_message(&text), text)
        }
        D::Context(_, inner) => from_datafusion_ref(inner),
        D::Diagnostic(_, inner) => from_datafusion_ref(inner),
        D::Shared(inner) => from_datafusion_ref(inner),
        D::Collection(errors) => match errors.first() {
            Some(first) => from_datafusion_ref(first),
            None => CirroError::internal("empty error collection"),
        },
        other => CirroError::new(SqlState::INTERNAL_ERROR, other.to_string()),
    }
}

/// A call with argument types no signature accepts. DataFusion wraps this in
/// an "internal error … likely a bug" text; the useful sentence is inside.
fn no_matching_function(msg: &str) -> Option<CirroError> {
    let at = msg.find("No function matches")?;
    let text = &msg[at..];
    let end = text.find('\n').unwrap_or(text.len());
    Some(CirroError::new(
        SqlState::UNDEFINED_FUNCTION,
        text[..end].trim().to_string(),
    ))
}

/// DataFusion reports many distinct conditions as plain plan or execution errors;
/// the message is all there is to go on.
/// Whether an error text is the operating system's "disk full" (ENOSPC, EDQUOT).
fn is_disk_full(msg: &str) -> bool {
    let lower = msg.to_ascii_lowercase();
    lower.contains("no space left on device") || lower.contains("disk quota exceeded")
}

fn classify_message(msg: &str) -> SqlState {
    let lower = msg.to_ascii_lowercase();
    let has = |needle: &str| lower.contains(needle);
    if is_disk_full(msg) {
        SqlState::DISK_FULL
    } else if has("table '") && has("not found") || has("table not found") || has("no table named")
    {
        SqlState::UNDEFINED_TABLE
    } else if has("no field named") || has("column") && has("not found") {
        SqlState::UNDEFINED_COLUMN
    } else if has("invalid function") || has("function") && has("not found") {
        SqlState::UNDEFINED_FUNCTION
    } else if has("non-nullable") || has("not null") || has("null values") {
        SqlState::NOT_NULL_VIOLATION
    } else if has("divide by zero") || has("division by zero") {
        SqlState::DIVISION_BY_ZERO
    } else if has("square root of a negative") {
        SqlState::INVALID_ARGUMENT_FOR_POWER_FUNCTION
    } else if has("logarithm of") && (has("negative") || has("zero")) {
        SqlState::INVALID_ARGUMENT_FOR_LOGARITHM
    } else if has("limit must be >= 0") || has("limit must not be negative") {
        SqlState::INVALID_ROW_COUNT_IN_LIMIT_CLAUSE
    } else if has("offset must be >= 0") || has("offset must not be negative") {
        SqlState::INVALID_ROW_COUNT_IN_RESULT_OFFSET_CLAUSE
    } else if has("negative count not allowed") {
        // substr with a negative length, as PostgreSQL classes it
        SqlState::SUBSTRING_ERROR
    } else if has("cannot find column with position") {
        SqlState::INVALID_COLUMN_REFERENCE
    } else if has("failed to match any signature") {
        SqlState::UNDEFINED_FUNCTION
    } else if has("overflow")
        || has("out of range")
        || has("too large to store")
        || has("too small to store")
    {
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE
    } else if has("cannot cast")
        || has("can't cast")
        || has("cast error")
        || has("parser error")
        || has("error parsing")
        || has("invalid digit")
        || has("failed to parse")
        || has("unable to parse")
    {
        cast_state(msg)
    } else if has("csv") && (has("incorrect number of fields") || has("encountered")) {
        SqlState::BAD_COPY_FILE_FORMAT
    } else if has("incorrect number of fields") {
        SqlState::BAD_COPY_FILE_FORMAT
    } else if has("no such file") || has("not found") && has("path") || has("does not exist") {
        SqlState::UNDEFINED_FILE
    } else if has("inconsistent data length across values list") {
        SqlState::SYNTAX_ERROR
    } else if has("cannot infer common")
        || has("cannot coerce")
        || has("no valid cast exists")
        || has("cannot automatically convert")
        || has("coercion")
        || has("type mismatch")
        || has("does not support")
        || has("no function matches")
        || has("failed to coerce")
        || has("common type to coerce")
        || has("compatible types to compare")
        || has("invalid comparison operation")
        || has("cannot be cast")
        || has("inserting query must have the same schema")
        || has("insert") && (has("expected") && has("columns") || has("type") && has("mismatch"))
    {
        SqlState::DATATYPE_MISMATCH
    } else if has("already exists") {
        SqlState::DUPLICATE_TABLE
    } else if has("ambiguous") {
        SqlState::AMBIGUOUS_COLUMN
    } else if has("unsupported")
        || has("not supported")
        || has("not currently supported")
        || has("not implemented")
    {
        SqlState::FEATURE_NOT_SUPPORTED
    } else {
        SqlState::INTERNAL_ERROR
    }
}

/// Strip DataFusion's internal prefixes and backtrace hints from a message.
fn clean_message(msg: &str) -> String {
    let mut text = msg.trim();
    for prefix in [
        "Error during planning: ",
        "Execution error: ",
        "Schema error: ",
        "Arrow error: ",
        "Invalid argument error: ",
        "Cast error: ",
        "Parser error: ",
        "External error: ",
        "Compute error: ",
    ] {
        while let Some(rest) = text.strip_prefix(prefix) {
            text = rest;
        }
    }
    out_of_range(text).unwrap_or_else(|| sql_type_names(text))
}

/// `text` with Arrow's type names (`Decimal128(15, 2)`, `Utf8View`,
/// `Int64`) as SQL names them (`numeric(15,2)`, `text`, `bigint`): a user
/// wrote SQL types, and errors should speak of those.
pub fn sql_type_names(text: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("LargeUtf8", "text"),
        ("Utf8View", "text"),
        ("Utf8", "text"),
        ("Int8", "smallint"),
        ("Int16", "smallint"),
        ("Int32", "integer"),
        ("Int64", "bigint"),
        ("Float32", "real"),
        ("Float64", "double precision"),
        ("Boolean", "boolean"),
        ("Date32", "date"),
        ("Date64", "date"),
        ("BinaryView", "bytea"),
        ("LargeBinary", "bytea"),
        ("Binary", "bytea"),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let at_word = c.is_ascii_alphabetic()
            && !previous.is_some_and(|p| p.is_ascii_alphanumeric() || p == '_');
        if at_word {
            let word_len = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..word_len];
            let after = &rest[word_len..];
            if (word == "Decimal128" || word == "Timestamp") && after.starts_with('(') {
                if let Some(close) = after.find(')') {
                    let inside = &after[1..close];
                    let name = if word == "Decimal128" {
                        format!("numeric({})", inside.replace(' ', ""))
                    } else if inside.contains("UTC")
                        || inside.contains("Some(")
                        || inside.contains('"')
                    {
                        "timestamp with time zone".to_string()
                    } else {
                        "timestamp".to_string()
                    };
                    out.push_str(&name);
                    rest = &after[close + 1..];
                    previous = Some(')');
                    continue;
                }
            }
            if let Some((_, sql)) = WORDS.iter().find(|(arrow, _)| *arrow == word) {
                out.push_str(sql);
            } else {
                out.push_str(word);
            }
            previous = word.chars().last();
            rest = after;
            continue;
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Arrow's "Can't cast value 40000 to type Int16" as PostgreSQL says it:
/// "smallint out of range".
fn out_of_range(text: &str) -> Option<String> {
    let rest = text.strip_prefix("Can't cast value ")?;
    let (_, target) = rest.rsplit_once(" to type ")?;
    let name = match target.trim() {
        "Int8" | "Int16" | "UInt8" => "smallint",
        "Int32" | "UInt16" => "integer",
        "Int64" | "UInt32" | "UInt64" => "bigint",
        _ => return None,
    };
    Some(format!("{name} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_datafusion_errors_to_sqlstate() {
        let cases = [
            (DataFusionError::Plan("table 'cirro.public.x' not found".into()), "42P01"),
            (DataFusionError::NotImplemented("thing".into()), "0A000"),
            (
                DataFusionError::ArrowError(
                    Box::new(arrow::error::ArrowError::CastError(
                        "Cannot cast string 'abc' to value of Int32 type".into(),
                    )),
                    None,
                ),
                "22P02",
            ),
            (
                DataFusionError::ArrowError(Box::new(arrow::error::ArrowError::DivideByZero), None),
                "22012",
            ),
            (
                DataFusionError::Plan("Cannot automatically convert Boolean to Decimal128(10, 2)".into()),
                "42804",
            ),
            (
                DataFusionError::Internal(
                    "Function 'sum' failed. No function matches the given name and argument types 'sum(Utf8View)'.\n\tCandidate".into(),
                ),
                "42883",
            ),
        ];
        for (err, code) in cases {
            assert_eq!(CirroError::from(err).state.code(), code);
        }
    }

    #[test]
    fn messages_name_sql_types() {
        assert_eq!(
            sql_type_names("Decimal128(1, 2) cannot be used as Decimal128(15, 2)"),
            "numeric(1,2) cannot be used as numeric(15,2)"
        );
        assert_eq!(
            sql_type_names(
                "Cannot cast Utf8View to Int64; Timestamp(µs, \"UTC\") vs Timestamp(µs)"
            ),
            "Cannot cast text to bigint; timestamp with time zone vs timestamp"
        );
        assert_eq!(
            sql_type_names("column Int64x and my_Int32"),
            "column Int64x and my_Int32"
        );
    }

    #[test]
    fn external_cirro_error_keeps_its_code() {
        let original = CirroError::new(SqlState::NOT_NULL_VIOLATION, "null in c");
        let back = CirroError::from(original.clone().into_datafusion());
        assert_eq!(back, original);
        let wrapped =
            DataFusionError::Context("ctx".into(), Box::new(original.clone().into_datafusion()));
        assert_eq!(CirroError::from(wrapped), original);
    }
}
