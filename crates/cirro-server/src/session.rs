//! One connection's session: its engine (transaction, catalog pins), its
//! settings (SET/SHOW), and the handle that cancels its running statement.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::Engine;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility, create_udf,
};
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use tokio::sync::Notify;

/// The server_version clients see: PostgreSQL 16's protocol and catalog.
pub(crate) const SERVER_VERSION: &str = "16.6";

/// Cancels the statement a session is running (CancelRequest, the client
/// going away, statement_timeout).
#[derive(Debug, Default)]
pub(crate) struct Canceller {
    cancelled: AtomicBool,
    notify: Notify,
}

impl Canceller {
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Forget a cancel that arrived between statements (PostgreSQL ignores it).
    pub(crate) fn reset(&self) {
        self.cancelled.store(false, Ordering::SeqCst);
    }

    /// Resolves with the error the statement ends with: 57014 on cancel or
    /// when `timeout` (if any) passes.
    pub(crate) async fn interrupted(&self, timeout: Option<Duration>) -> CirroError {
        let cancelled = async {
            loop {
                let notified = self.notify.notified();
                if self.cancelled.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        match timeout {
            Some(limit) => tokio::select! {
                _ = cancelled => canceled(),
                _ = tokio::time::sleep(limit) => CirroError::new(
                    SqlState::QUERY_CANCELED,
                    "canceling statement due to statement timeout",
                ),
            },
            None => {
                cancelled.await;
                canceled()
            }
        }
    }
}

fn canceled() -> CirroError {
    CirroError::new(
        SqlState::QUERY_CANCELED,
        "canceling statement due to user request",
    )
}

pub(crate) struct Session {
    pub(crate) engine: Engine,
    /// The session's changes to SETTINGS (shared with `current_setting`).
    settings: Settings,
    pub(crate) canceller: Arc<Canceller>,
}

/// Settings clients set and read, with their defaults. Only these are
/// accepted (42704 otherwise); `datafusion.*` settings go to the engine.
const SETTINGS: &[(&str, &str)] = &[
    ("application_name", ""),
    ("bytea_output", "hex"),
    ("client_encoding", "UTF8"),
    ("client_min_messages", "notice"),
    ("datestyle", "ISO, MDY"),
    ("default_table_access_method", "heap"),
    ("default_transaction_isolation", "repeatable read"),
    ("default_transaction_read_only", "off"),
    ("extra_float_digits", "1"),
    ("integer_datetimes", "on"),
    ("intervalstyle", "postgres"),
    ("lc_messages", "C"),
    ("lc_monetary", "C"),
    ("lc_numeric", "C"),
    ("lc_time", "C"),
    ("max_identifier_length", "63"),
    ("search_path", "\"$user\", public"),
    ("server_encoding", "UTF8"),
    ("server_version", SERVER_VERSION),
    ("server_version_num", "160006"),
    ("standard_conforming_strings", "on"),
    ("statement_timeout", "0"),
    ("timezone", "UTC"),
    ("transaction_isolation", "repeatable read"),
    ("transaction_read_only", "off"),
];

/// Settings whose changes PostgreSQL reports to the client (GUC_REPORT).
const REPORTED: &[(&str, &str)] = &[
    ("application_name", "application_name"),
    ("client_encoding", "client_encoding"),
    ("datestyle", "DateStyle"),
    ("intervalstyle", "IntervalStyle"),
    ("standard_conforming_strings", "standard_conforming_strings"),
    ("timezone", "TimeZone"),
];

/// A session's changes to the SETTINGS defaults.
#[derive(Clone, Default)]
struct Settings(Arc<Mutex<BTreeMap<&'static str, String>>>);

impl Settings {
    /// The value in force of a known setting.
    fn get(&self, name: &'static str) -> String {
        self.0
            .lock()
            .ok()
            .and_then(|s| s.get(name).cloned())
            .or_else(|| {
                SETTINGS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            })
            .unwrap_or_default()
    }
}

/// What a SET/SHOW/RESET statement asks for.
pub(crate) enum SettingStatement {
    Set(&'static str, String),
    Reset(Option<&'static str>),
    Show(&'static str),
    ShowAll,
    /// SET TRANSACTION … / SET SESSION CHARACTERISTICS …: every transaction
    /// is snapshot-isolated; accepted.
    TransactionMode,
}

fn setting_name(name: &str) -> Result<&'static str> {
    let lower = name.to_ascii_lowercase();
    SETTINGS
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(n, _)| *n)
        .ok_or_else(|| {
            CirroError::new(
                SqlState::UNDEFINED_OBJECT,
                format!("unrecognized configuration parameter \"{name}\""),
            )
        })
}

/// Recognise a SET/SHOW/RESET of a PostgreSQL setting (None for anything
/// else, including `datafusion.*` settings, which the engine handles).
pub(crate) fn parse_setting(sql: &str) -> Result<Option<SettingStatement>> {
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return Ok(None);
    };
    let words: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_) | Token::SemiColon | Token::EOF))
        .collect();
    let word = |i: usize| match words.get(i) {
        Some(Token::Word(w)) => Some(w.value.to_ascii_lowercase()),
        _ => None,
    };
    let Some(first) = word(0) else {
        return Ok(None);
    };
    let mut at = 1;
    if first == "set" && matches!(word(1).as_deref(), Some("session" | "local")) {
        at = 2;
    }
    if first == "set" && matches!(word(at).as_deref(), Some("transaction")) {
        return Ok(Some(SettingStatement::TransactionMode));
    }
    if first == "set"
        && word(1).as_deref() == Some("session")
        && word(2).as_deref() == Some("characteristics")
    {
        return Ok(Some(SettingStatement::TransactionMode));
    }
    // Name: one word, or `TIME ZONE`, or a dotted name (datafusion.*).
    let name = match (word(at).as_deref(), word(at + 1).as_deref()) {
        (Some("time"), Some("zone")) => {
            at += 2;
            "timezone".to_string()
        }
        (Some("transaction"), Some("isolation")) if first == "show" => {
            return Ok(Some(SettingStatement::Show("transaction_isolation")));
        }
        (Some(name), _) => {
            at += 1;
            name.to_string()
        }
        (None, _) => return Ok(None),
    };
    if matches!(words.get(at), Some(Token::Period)) {
        return Ok(None);
    }
    match first.as_str() {
        "show" if name == "all" => Ok(Some(SettingStatement::ShowAll)),
        "show" => {
            if at != words.len() {
                return Ok(None);
            }
            Ok(Some(SettingStatement::Show(setting_name(&name)?)))
        }
        "reset" if name == "all" => Ok(Some(SettingStatement::Reset(None))),
        "reset" => Ok(Some(SettingStatement::Reset(Some(setting_name(&name)?)))),
        "set" => {
            if matches!(words.get(at), Some(Token::Eq)) || word(at).as_deref() == Some("to") {
                at += 1;
            } else if name != "timezone" {
                return Ok(None);
            }
            let name = setting_name(&name)?;
            let value = words[at..]
                .iter()
                .map(|t| match t {
                    Token::SingleQuotedString(s) => s.clone(),
                    Token::Word(w) => w.value.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ")
                .replace(" , ", ", ");
            if value.is_empty() {
                return Err(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    format!("SET {name} needs a value"),
                ));
            }
            Ok(Some(SettingStatement::Set(name, value)))
        }
        _ => Ok(None),
    }
}

/// A statement_timeout value: milliseconds, or a number with a unit.
fn parse_timeout(value: &str) -> Result<Duration> {
    let text = value.trim().to_ascii_lowercase();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || {
        CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"statement_timeout\": \"{value}\""),
        )
    };
    let number: f64 = number.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" | "ms" => number,
        "s" => number * 1e3,
        "min" => number * 60e3,
        "h" => number * 3600e3,
        "d" => number * 86_400e3,
        _ => return Err(bad()),
    };
    if !(0.0..=i32::MAX as f64).contains(&ms) {
        return Err(bad());
    }
    Ok(Duration::from_millis(ms as u64))
}

impl Session {
    pub(crate) fn new(engine: Engine, database: &str, canceller: Arc<Canceller>) -> Result<Self> {
        datafusion_pg_catalog::pg_catalog::setup_pg_catalog(
            engine.context(),
            database,
            EmptyContextProvider,
        )
        .map_err(|e| CirroError::from(*e))?;
        engine.context().register_udf(version_udf());
        engine.context().register_udf(to_regtype_udf());
        engine.context().register_udf(no_serial_sequence_udf());
        engine.context().register_udf(collation_is_visible_udf());
        engine.context().register_udf(no_index_definition_udf());
        engine.context().register_udf(json_build_object_udf());
        let settings = Settings::default();
        engine
            .context()
            .register_udf(current_setting_udf(settings.clone()));
        Ok(Self {
            engine,
            settings,
            canceller,
        })
    }

    fn get(&self, name: &'static str) -> String {
        self.settings.get(name)
    }

    /// The statement timeout in force (None: no limit).
    pub(crate) fn statement_timeout(&self) -> Option<Duration> {
        parse_timeout(&self.get("statement_timeout"))
            .ok()
            .filter(|d| !d.is_zero())
    }

    /// Run a SET/SHOW/RESET. Returns the command tag or rows, and the
    /// settings to report to the client (ParameterStatus).
    pub(crate) fn run_setting(
        &self,
        statement: SettingStatement,
    ) -> Result<(SettingOutcome, Vec<(String, String)>)> {
        let reported = |name: &str, value: String| {
            REPORTED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, shown)| (shown.to_string(), value))
        };
        match statement {
            SettingStatement::Set(name, value) => {
                let value = match name {
                    "statement_timeout" => {
                        parse_timeout(&value)?;
                        value
                    }
                    "client_encoding" => {
                        let v = value.to_ascii_uppercase().replace('-', "");
                        if v != "UTF8" && v != "UNICODE" {
                            return Err(CirroError::unsupported(format!(
                                "client_encoding {value} is not supported: the server speaks UTF8"
                            )));
                        }
                        "UTF8".to_string()
                    }
                    "server_version"
                    | "server_version_num"
                    | "server_encoding"
                    | "integer_datetimes"
                    | "max_identifier_length" => {
                        return Err(CirroError::new(
                            SqlState::INSUFFICIENT_PRIVILEGE,
                            format!("parameter \"{name}\" cannot be changed"),
                        ));
                    }
                    _ => value,
                };
                if let Ok(mut settings) = self.settings.0.lock() {
                    settings.insert(name, value.clone());
                }
                Ok((
                    SettingOutcome::Tag("SET"),
                    reported(name, value).into_iter().collect(),
                ))
            }
            SettingStatement::Reset(name) => {
                let mut report = Vec::new();
                if let Ok(mut settings) = self.settings.0.lock() {
                    let names: Vec<&'static str> = match name {
                        Some(n) => vec![n],
                        None => settings.keys().copied().collect(),
                    };
                    for n in names {
                        settings.remove(n);
                        let default = SETTINGS
                            .iter()
                            .find(|(s, _)| *s == n)
                            .map(|(_, v)| v.to_string())
                            .unwrap_or_default();
                        report.extend(reported(n, default));
                    }
                }
                Ok((SettingOutcome::Tag("RESET"), report))
            }
            SettingStatement::Show(name) => {
                let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, false)]));
                let column: ArrayRef = Arc::new(StringArray::from(vec![self.get(name)]));
                Ok((
                    SettingOutcome::Rows(RecordBatch::try_new(schema, vec![column])?),
                    vec![],
                ))
            }
            SettingStatement::ShowAll => {
                let names: Vec<&str> = SETTINGS.iter().map(|(n, _)| *n).collect();
                let values: Vec<String> = SETTINGS.iter().map(|(n, _)| self.get(n)).collect();
                let schema = Arc::new(Schema::new(vec![
                    Field::new("name", DataType::Utf8, false),
                    Field::new("setting", DataType::Utf8, false),
                ]));
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from(names)),
                    Arc::new(StringArray::from(values)),
                ];
                Ok((
                    SettingOutcome::Rows(RecordBatch::try_new(schema, columns)?),
                    vec![],
                ))
            }
            SettingStatement::TransactionMode => Ok((SettingOutcome::Tag("SET"), vec![])),
        }
    }
}

/// The schema a SET/SHOW returns (for Describe).
pub(crate) fn setting_schema(statement: &SettingStatement) -> Option<SchemaRef> {
    match statement {
        SettingStatement::Show(name) => Some(Arc::new(Schema::new(vec![Field::new(
            *name,
            DataType::Utf8,
            false,
        )]))),
        SettingStatement::ShowAll => Some(Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("setting", DataType::Utf8, false),
        ]))),
        _ => None,
    }
}

pub(crate) enum SettingOutcome {
    Tag(&'static str),
    Rows(RecordBatch),
}

/// `version()` as PostgreSQL clients parse it (`PostgreSQL <major>.<minor>`).
fn version_udf() -> ScalarUDF {
    let text = format!(
        "PostgreSQL {SERVER_VERSION} (Cirro {}) on x86_64-pc-linux-gnu",
        env!("CARGO_PKG_VERSION")
    );
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(text.clone()))))
        }),
    )
}

/// The OID of a built-in type by the names PostgreSQL accepts for it.
fn builtin_type_oid(name: &str) -> Option<i32> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name);
    if let Some(element) = name.strip_suffix("[]") {
        // The array type of each (pg_type.typarray).
        return match builtin_type_oid(element)? {
            16 => Some(1000),
            17 => Some(1001),
            20 => Some(1016),
            21 => Some(1005),
            23 => Some(1007),
            25 => Some(1009),
            700 => Some(1021),
            701 => Some(1022),
            1043 => Some(1015),
            1082 => Some(1182),
            1114 => Some(1115),
            1184 => Some(1185),
            1700 => Some(1231),
            _ => None,
        };
    }
    Some(match name {
        "bool" | "boolean" => 16,
        "bytea" => 17,
        "char" => 18,
        "name" => 19,
        "int8" | "bigint" => 20,
        "int2" | "smallint" => 21,
        "int4" | "integer" | "int" => 23,
        "text" => 25,
        "oid" => 26,
        "json" => 114,
        "float4" | "real" => 700,
        "float8" | "double precision" => 701,
        "bpchar" | "character" => 1042,
        "varchar" | "character varying" => 1043,
        "date" => 1082,
        "time" | "time without time zone" => 1083,
        "timestamp" | "timestamp without time zone" => 1114,
        "timestamptz" | "timestamp with time zone" => 1184,
        "interval" => 1186,
        "numeric" | "decimal" => 1700,
        "uuid" => 2950,
        "jsonb" => 3802,
        _ => return None,
    })
}

/// `to_regtype(name)`: the type's OID, or NULL for a type Cirro does not
/// have (drivers probe for extension types such as hstore this way).
fn to_regtype_udf() -> ScalarUDF {
    create_udf(
        "to_regtype",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let names = arrays[0].as_string::<i32>();
            let oids: arrow::array::Int32Array = names
                .iter()
                .map(|name| name.and_then(builtin_type_oid))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(oids)))
        }),
    )
}

/// `pg_get_serial_sequence(table, column)`: NULL, as Cirro has no
/// sequences (SQLAlchemy's column reflection asks).
fn no_serial_sequence_udf() -> ScalarUDF {
    create_udf(
        "pg_get_serial_sequence",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(|_args: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))),
    )
}

/// `current_setting(name [, missing_ok])`: the session's value of a setting,
/// as SHOW gives it; an unknown name is 42704, or NULL when missing_ok.
fn current_setting_udf(settings: Settings) -> ScalarUDF {
    let lookup = move |args: ScalarFunctionArgs| {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let names = arrays[0].as_string::<i32>();
        let missing_ok = arrays.get(1).map(|a| a.as_boolean().clone());
        let mut values = arrow::array::StringBuilder::new();
        for (i, name) in names.iter().enumerate() {
            let Some(name) = name else {
                values.append_null();
                continue;
            };
            match setting_name(name) {
                Ok(known) => values.append_value(settings.get(known)),
                Err(_) if missing_ok.as_ref().is_some_and(|m| m.value(i)) => values.append_null(),
                Err(e) => {
                    return Err(datafusion::error::DataFusionError::External(Box::new(e)));
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(values.finish())))
    };
    TextFunction::udf(
        "current_setting",
        Signature::one_of(
            vec![
                TypeSignature::Exact(vec![DataType::Utf8]),
                TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean]),
            ],
            Volatility::Stable,
        ),
        lookup,
    )
}

/// `pg_get_indexdef(index [, column, pretty])`: NULL, as for an unknown
/// index: Cirro tables have no indexes, and the pg_index rows are
/// PostgreSQL's own (SQLAlchemy's index reflection plans a call to it).
fn no_index_definition_udf() -> ScalarUDF {
    TextFunction::udf(
        "pg_get_indexdef",
        Signature::variadic_any(Volatility::Stable),
        |_args: ScalarFunctionArgs| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
    )
}

type TextBody =
    dyn Fn(ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> + Send + Sync;

/// A function returning text, with any signature (`create_udf` takes only
/// exact argument types) and a body that may hold state.
struct TextFunction {
    name: &'static str,
    signature: Signature,
    body: Arc<TextBody>,
}

impl TextFunction {
    fn udf(
        name: &'static str,
        signature: Signature,
        body: impl Fn(ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue>
        + Send
        + Sync
        + 'static,
    ) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            name,
            signature,
            body: Arc::new(body),
        })
    }
}

impl std::fmt::Debug for TextFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for TextFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.body, &other.body)
    }
}

impl Eq for TextFunction {}

impl std::hash::Hash for TextFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for TextFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        (self.body)(args)
    }
}

/// `pg_collation_is_visible(oid)`: true (one schema of collations).
fn collation_is_visible_udf() -> ScalarUDF {
    create_udf(
        "pg_collation_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(|_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
        }),
    )
}

/// `json_build_object(key, value, …)` as JSON text (SQLAlchemy's column
/// reflection builds identity and collation details with it).
fn json_build_object_udf() -> ScalarUDF {
    TextFunction::udf(
        "json_build_object",
        Signature::variadic_any(Volatility::Immutable),
        json_build_object,
    )
}

fn json_build_object(args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
    if args.args.len() % 2 != 0 {
        return Err(datafusion::error::DataFusionError::Execution(
            "argument list must have even number of elements".to_string(),
        ));
    }
    let arrays = ColumnarValue::values_to_arrays(&args.args)?;
    let rows = args.number_rows;
    let mut out = arrow::array::StringBuilder::new();
    for row in 0..rows {
        let mut object = serde_json::Map::new();
        for pair in arrays.chunks(2) {
            let key = ScalarValue::try_from_array(&pair[0], row)?;
            let value = ScalarValue::try_from_array(&pair[1], row)?;
            let value = match value {
                v if v.is_null() => serde_json::Value::Null,
                ScalarValue::Boolean(Some(b)) => serde_json::Value::Bool(b),
                v if v.data_type().is_numeric() => {
                    serde_json::from_str(&v.to_string()).unwrap_or(serde_json::Value::Null)
                }
                v => serde_json::Value::String(v.to_string()),
            };
            let key = if key.is_null() {
                String::new()
            } else {
                key.to_string()
            };
            object.insert(key, value);
        }
        out.append_value(serde_json::Value::Object(object).to_string());
    }
    Ok(ColumnarValue::Array(Arc::new(out.finish())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_resolve_to_builtin_oids() {
        assert_eq!(builtin_type_oid("integer"), Some(23));
        assert_eq!(builtin_type_oid("pg_catalog.INT8"), Some(20));
        assert_eq!(builtin_type_oid("text[]"), Some(1009));
        assert_eq!(builtin_type_oid("hstore"), None);
    }

    #[test]
    fn parses_settings() {
        assert!(matches!(
            parse_setting("SET statement_timeout = 5000").expect("parse"),
            Some(SettingStatement::Set("statement_timeout", v)) if v == "5000"
        ));
        assert!(matches!(
            parse_setting("set search_path to public, x").expect("parse"),
            Some(SettingStatement::Set("search_path", v)) if v == "public, x"
        ));
        assert!(matches!(
            parse_setting("SET TIME ZONE 'UTC'").expect("parse"),
            Some(SettingStatement::Set("timezone", v)) if v == "UTC"
        ));
        assert!(matches!(
            parse_setting("SHOW transaction isolation level").expect("parse"),
            Some(SettingStatement::Show("transaction_isolation"))
        ));
        assert!(matches!(
            parse_setting("SET datafusion.execution.batch_size = 10").expect("parse"),
            None
        ));
        assert!(parse_setting("SET no_such_thing = 1").is_err());
        assert!(parse_setting("SELECT 1").expect("parse").is_none());
        assert_eq!(
            parse_timeout("1500").expect("ms"),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_timeout("2s").expect("s"), Duration::from_secs(2));
        assert!(parse_timeout("soon").is_err());
    }
}
