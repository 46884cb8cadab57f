//! Time travel (`FROM t VERSION AS OF n`, `FROM t TIMESTAMP AS OF '…'`) and
//! `DESCRIBE HISTORY t`.
//!
//! Every commit of a Delta table is a version; a snapshot of any version still
//! in the log (and whose files VACUUM has not removed) can be read. The SQL
//! dialect Cirro parses has no `AS OF` clause, so a statement's text is
//! rewritten before parsing: each `name VERSION|TIMESTAMP AS OF value` becomes
//! a temporary name under which the session serves that version of the table
//! for this one statement (aliased to the table's name, so `t.col` still
//! resolves). Past versions are read-only.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use cirro_catalog::PAST_VERSION_PREFIX;
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::CirroTable;
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Word};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::{Engine, Outcome};

/// Which past version a statement asks for.
enum AsOf {
    Version(i64),
    Timestamp(String),
}

fn is_space(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// The index of the next non-whitespace token at or after `i`.
fn next_solid(tokens: &[Token], mut i: usize) -> Option<usize> {
    while i < tokens.len() && is_space(&tokens[i]) {
        i += 1;
    }
    (i < tokens.len()).then_some(i)
}

fn word_is(token: &Token, keyword: Keyword) -> bool {
    matches!(token, Token::Word(Word { keyword: k, quote_style: None, .. }) if *k == keyword)
}

/// An identifier as DataFusion normalizes it (unquoted names are lowercased).
fn ident(word: &Word) -> String {
    match word.quote_style {
        Some(_) => word.value.clone(),
        None => word.value.to_lowercase(),
    }
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Rewrite the `AS OF` clauses of `sql`, opening each past version asked for.
/// Returns the text to plan.
pub(crate) async fn rewrite_time_travel(engine: &Engine, sql: &str) -> Result<String> {
    engine.session.clear_versions();
    if !sql.to_ascii_uppercase().contains("AS OF") {
        return Ok(sql.to_string());
    }
    let Ok(mut tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(sql.to_string()); // the parser reports the error
    };
    let mut count = 0;
    let mut i = 0;
    while i < tokens.len() {
        let kind_is_version = word_is(&tokens[i], Keyword::VERSION);
        if !(kind_is_version || word_is(&tokens[i], Keyword::TIMESTAMP)) {
            i += 1;
            continue;
        }
        let (Some(as_at), Some(of_at)) = (
            next_solid(&tokens, i + 1),
            next_solid(&tokens, i + 1).and_then(|a| next_solid(&tokens, a + 1)),
        ) else {
            i += 1;
            continue;
        };
        if !word_is(&tokens[as_at], Keyword::AS) || !word_is(&tokens[of_at], Keyword::OF) {
            i += 1;
            continue;
        }
        let Some(value_at) = next_solid(&tokens, of_at + 1) else {
            i += 1;
            continue;
        };
        let as_of = match (&tokens[value_at], kind_is_version) {
            (Token::Number(n, _), true) => AsOf::Version(n.parse().map_err(|_| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("VERSION AS OF needs a version number, not {n}"),
                )
            })?),
            (Token::SingleQuotedString(s), false) => AsOf::Timestamp(s.clone()),
            (other, true) => {
                return Err(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    format!("VERSION AS OF needs a version number, not {other}"),
                ));
            }
            (other, false) => {
                return Err(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    format!("TIMESTAMP AS OF needs a quoted timestamp, not {other}"),
                ));
            }
        };
        // The table name before the clause: identifiers joined by periods.
        let prev_solid = |k: usize| (0..k).rev().find(|&m| !is_space(&tokens[m]));
        let mut parts = Vec::new();
        let mut start = i;
        let mut cursor = prev_solid(i);
        while let Some(at) = cursor {
            let Token::Word(word) = &tokens[at] else {
                break;
            };
            parts.push(ident(word));
            start = at;
            match prev_solid(at) {
                Some(dot) if matches!(tokens[dot], Token::Period) => cursor = prev_solid(dot),
                _ => break,
            }
        }
        if parts.is_empty() {
            return Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                "AS OF must follow a table name",
            ));
        }
        parts.reverse();
        let reference = match parts.as_slice() {
            [t] => TableReference::bare(t.as_str()),
            [s, t] => TableReference::partial(s.as_str(), t.as_str()),
            [d, s, t] => TableReference::full(d.as_str(), s.as_str(), t.as_str()),
            _ => {
                return Err(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    format!("bad table name {}", parts.join(".")),
                ));
            }
        };
        let (db, schema, name) = engine.resolve(&reference);
        engine.check_table(&db, &schema, &name, cirro_catalog::Privilege::Select)?;
        let table = open_past_version(engine, &db, &schema, &name, &as_of).await?;
        let temp = format!("{PAST_VERSION_PREFIX}{count}");
        count += 1;
        engine.session.add_version(&temp, table);
        // Keep the table's name as the alias unless the statement gives one.
        let alias_follows = next_solid(&tokens, value_at + 1).is_some_and(|k| {
            matches!(&tokens[k], Token::Word(w) if w.keyword == Keyword::AS || w.keyword == Keyword::NoKeyword)
        });
        let mut replacement = format!("{}.{}.{}", quoted(&db), quoted(&schema), quoted(&temp));
        if !alias_follows {
            replacement.push_str(&format!(" AS {}", quoted(&name)));
        }
        let replacement_tokens = Tokenizer::new(&GenericDialect {}, &replacement)
            .tokenize()
            .map_err(|e| CirroError::internal(format!("time travel rewrite: {e}")))?;
        let len = replacement_tokens.len();
        tokens.splice(start..=value_at, replacement_tokens);
        i = start + len;
    }
    Ok(tokens.iter().map(|t| t.to_string()).collect())
}

/// The location of table `db.schema.name`, or 42P01.
fn location_of(engine: &Engine, db: &str, schema: &str, name: &str) -> Result<String> {
    engine
        .catalog
        .snapshot()
        .table(db, schema, name)
        .map(|entry| entry.location.clone())
        .ok_or_else(|| {
            CirroError::new(
                SqlState::UNDEFINED_TABLE,
                format!("relation \"{name}\" does not exist"),
            )
        })
}

async fn open_past_version(
    engine: &Engine,
    db: &str,
    schema: &str,
    name: &str,
    as_of: &AsOf,
) -> Result<CirroTable> {
    let location = location_of(engine, db, schema, name)?;
    let latest = engine.catalog.open_table(&location).await?;
    let mut delta = latest.delta().clone();
    let newest = latest.version();
    match as_of {
        AsOf::Version(version) => {
            if *version < 0 || *version > newest {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!(
                        "table \"{name}\" has no version {version}: its versions are 0 to {newest}"
                    ),
                ));
            }
            delta.load_version(*version as u64).await.map_err(|e| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("cannot read version {version} of \"{name}\": {e}"),
                )
            })?;
        }
        AsOf::Timestamp(text) => {
            let at = parse_timestamp(text)?;
            let created = commit_timestamp(&latest, 0).await?;
            if created.is_some_and(|created| at.timestamp_millis() < created) {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("table \"{name}\" did not exist yet at {text}"),
                ));
            }
            delta.load_with_datetime(at).await.map_err(|e| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("table \"{name}\" has no version as of {text}: {e}"),
                )
            })?;
        }
    }
    let past = CirroTable::from_delta(delta, latest.url().clone())?;
    // VACUUM may have removed the files of old versions: say so instead of
    // failing (or answering from cached statistics) later.
    let store = past.delta().object_store();
    // Owned paths: a future borrowing the file list would not be `Send` for
    // every lifetime, which the server's boxed futures need.
    let paths: Vec<Path> = past
        .files()
        .iter()
        .map(|f| Path::from(f.add.path.as_str()))
        .collect();
    let missing = futures::stream::iter(paths.into_iter().map(|path| {
        let store = Arc::clone(&store);
        async move { store.head(&path).await.is_err() }
    }))
    .buffer_unordered(16)
    .any(|missing| async move { missing })
    .await;
    if missing {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!(
                "version {} of \"{name}\" can no longer be read: VACUUM removed its files",
                past.version()
            ),
        ));
    }
    Ok(past)
}

/// The commit time (ms since the epoch) of `version` of `table`.
async fn commit_timestamp(table: &CirroTable, version: i64) -> Result<Option<i64>> {
    let path = Path::from(format!("_delta_log/{version:020}.json"));
    let bytes = table
        .delta()
        .object_store()
        .get(&path)
        .await?
        .bytes()
        .await?;
    Ok(String::from_utf8_lossy(&bytes).lines().find_map(|line| {
        serde_json::from_str::<serde_json::Value>(line)
            .ok()?
            .get("commitInfo")?
            .get("timestamp")?
            .as_i64()
    }))
}

/// A timestamp in UTC: RFC 3339, `YYYY-MM-DD HH:MM:SS[.f]`, or a date.
fn parse_timestamp(text: &str) -> Result<chrono::DateTime<chrono::Utc>> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone, Utc};
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(Utc.from_utc_datetime(&t));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(Utc.from_utc_datetime(&t));
        }
    }
    Err(CirroError::new(
        SqlState::INVALID_DATETIME_FORMAT,
        format!("invalid timestamp \"{text}\": use 'YYYY-MM-DD HH:MM:SS' (UTC) or RFC 3339"),
    ))
}

/// Table maintenance statements that the SQL dialect does not know.
pub(crate) enum Maintenance {
    /// `DESCRIBE HISTORY name`
    History(TableReference),
    /// `OPTIMIZE name`
    Optimize(TableReference),
    /// `VACUUM name [RETAIN n HOURS]`
    Vacuum(TableReference, Option<u64>),
}

/// Recognize a maintenance statement (any case, optional semicolon). `None`
/// when `sql` is not one; an error when it starts like one but is malformed.
pub(crate) fn parse_maintenance(sql: &str) -> Result<Option<Maintenance>> {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(None);
    };
    let solid: Vec<&Token> = tokens
        .iter()
        .filter(|t| !is_space(t) && !matches!(t, Token::SemiColon))
        .collect();
    let is = |t: &Token, word: &str| matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word));
    let (kind, rest) = match solid.as_slice() {
        [first, second, rest @ ..]
            if (is(first, "DESCRIBE") || is(first, "DESC")) && is(second, "HISTORY") =>
        {
            ("history", rest)
        }
        [first, rest @ ..] if is(first, "OPTIMIZE") => ("optimize", rest),
        [first, rest @ ..] if is(first, "VACUUM") => ("vacuum", rest),
        _ => return Ok(None),
    };
    let syntax = |what: &str| {
        CirroError::new(
            SqlState::SYNTAX_ERROR,
            format!("syntax error: expected {what}"),
        )
    };
    // The table name: identifiers joined by periods.
    let mut parts = Vec::new();
    let mut at = 0;
    while at < rest.len() {
        match rest[at] {
            Token::Word(w) if at % 2 == 0 && !(kind == "vacuum" && is(rest[at], "RETAIN")) => {
                parts.push(ident(w));
            }
            Token::Period if at % 2 == 1 => {}
            _ => break,
        }
        at += 1;
    }
    let reference = match parts.as_slice() {
        [t] => TableReference::bare(t.as_str()),
        [s, t] => TableReference::partial(s.as_str(), t.as_str()),
        [d, s, t] => TableReference::full(d.as_str(), s.as_str(), t.as_str()),
        _ => return Err(syntax("a table name")),
    };
    let tail = &rest[at..];
    match kind {
        "history" if tail.is_empty() => Ok(Some(Maintenance::History(reference))),
        "optimize" if tail.is_empty() => Ok(Some(Maintenance::Optimize(reference))),
        "vacuum" => match tail {
            [] => Ok(Some(Maintenance::Vacuum(reference, None))),
            [retain, Token::Number(n, _), hours]
                if is(retain, "RETAIN") && (is(hours, "HOURS") || is(hours, "HOUR")) =>
            {
                let hours = n.parse::<u64>().map_err(|_| {
                    CirroError::new(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("RETAIN needs a whole number of hours, not {n}"),
                    )
                })?;
                Ok(Some(Maintenance::Vacuum(reference, Some(hours))))
            }
            _ => Err(syntax("VACUUM name [RETAIN n HOURS]")),
        },
        _ => Err(syntax(&format!(
            "end of statement after the table name in {}",
            kind.to_uppercase()
        ))),
    }
}

/// Run a maintenance statement.
pub(crate) async fn run_maintenance(engine: &Engine, statement: Maintenance) -> Result<Outcome> {
    match &statement {
        Maintenance::History(reference) => {
            let (db, schema, name) = engine.resolve(&reference);
            engine.check_table(&db, &schema, &name, cirro_catalog::Privilege::Select)?;
            describe_history(engine, reference).await
        }
        Maintenance::Optimize(reference) => {
            engine.check_transaction_allows("OPTIMIZE")?;
            let (db, schema, name) = engine.resolve(reference);
            engine.check_owner(&db, &schema, &name, "OPTIMIZE it")?;
            let location = location_of(engine, &db, &schema, &name)?;
            let table = engine.catalog.open_table(&location).await?;
            let state = engine.context().state();
            let summary = cirro_storage::maintenance::optimize(&table, &state).await?;
            let schema = result_schema(&statement);
            let columns: Vec<ArrayRef> = [
                summary.files_removed,
                summary.files_added,
                summary.deletion_vectors_removed,
                summary.rows_written,
            ]
            .into_iter()
            .map(|v| Arc::new(Int64Array::from(vec![v as i64])) as ArrayRef)
            .collect();
            rows(engine, schema, columns).await
        }
        Maintenance::Vacuum(reference, hours) => {
            engine.check_transaction_allows("VACUUM")?;
            let (db, schema, name) = engine.resolve(reference);
            engine.check_owner(&db, &schema, &name, "VACUUM it")?;
            let location = location_of(engine, &db, &schema, &name)?;
            let table = engine.catalog.open_table(&location).await?;
            let deleted = cirro_storage::maintenance::vacuum(
                &table,
                hours.unwrap_or(VACUUM_RETAIN_HOURS_DEFAULT),
            )
            .await?;
            let schema = result_schema(&statement);
            let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![deleted as i64]))];
            rows(engine, schema, columns).await
        }
    }
}

/// The columns a maintenance statement returns.
pub(crate) fn result_schema(statement: &Maintenance) -> Arc<Schema> {
    let int = |name: &str| Field::new(name, DataType::Int64, false);
    Arc::new(Schema::new(match statement {
        Maintenance::History(_) => vec![
            int("version"),
            Field::new(
                "timestamp",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                true,
            ),
            Field::new("operation", DataType::Utf8, true),
            Field::new("operation_parameters", DataType::Utf8, true),
            int("files_added"),
            int("files_removed"),
        ],
        Maintenance::Optimize(_) => vec![
            int("files_removed"),
            int("files_added"),
            int("deletion_vectors_removed"),
            int("rows_written"),
        ],
        Maintenance::Vacuum(..) => vec![int("files_deleted")],
    }))
}

/// Retention of VACUUM without RETAIN: 7 days, as in Delta Lake.
const VACUUM_RETAIN_HOURS_DEFAULT: u64 = 7 * 24;

/// A one-batch result.
async fn rows(engine: &Engine, schema: Arc<Schema>, columns: Vec<ArrayRef>) -> Result<Outcome> {
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let provider = MemTable::try_new(schema, vec![vec![batch]])?;
    let frame = engine.context().read_table(Arc::new(provider))?;
    Ok(Outcome::Rows(frame.execute_stream().await?))
}

/// The commits of a table, newest first: version, time, operation, its
/// parameters, and how many data files it added and removed.
pub(crate) async fn describe_history(
    engine: &Engine,
    reference: &TableReference,
) -> Result<Outcome> {
    let (db, schema, name) = engine.resolve(reference);
    let location = location_of(engine, &db, &schema, &name)?;
    let table = engine.catalog.open_table(&location).await?;
    let store = table.delta().object_store();
    let mut commits: Vec<(i64, Path)> = store
        .list(Some(&Path::from("_delta_log")))
        .try_filter_map(|meta| async move {
            let file = meta.location.filename().unwrap_or_default().to_string();
            let version = file
                .strip_suffix(".json")
                .filter(|v| v.len() == 20 && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<i64>().ok());
            Ok(version.map(|v| (v, meta.location)))
        })
        .try_collect()
        .await?;
    commits.sort_by(|a, b| b.0.cmp(&a.0));
    let mut versions = Vec::new();
    let mut times = Vec::new();
    let mut operations = Vec::new();
    let mut parameters = Vec::new();
    let mut added = Vec::new();
    let mut removed = Vec::new();
    for (version, path) in commits {
        let bytes = store.get(&path).await?.bytes().await?;
        let text = String::from_utf8_lossy(&bytes);
        let mut info = serde_json::Value::Null;
        let (mut adds, mut removes) = (0i64, 0i64);
        for line in text.lines() {
            let Ok(action) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(commit) = action.get("commitInfo") {
                info = commit.clone();
            } else if action.get("add").is_some() {
                adds += 1;
            } else if action.get("remove").is_some() {
                removes += 1;
            }
        }
        versions.push(version);
        times.push(info.get("timestamp").and_then(|t| t.as_i64()));
        operations.push(
            info.get("operation")
                .and_then(|o| o.as_str())
                .map(str::to_string),
        );
        parameters.push(info.get("operationParameters").map(|p| p.to_string()));
        added.push(adds);
        removed.push(removes);
    }
    let schema = result_schema(&Maintenance::History(reference.clone()));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(versions)),
        Arc::new(TimestampMillisecondArray::from(times).with_timezone("UTC")),
        Arc::new(StringArray::from(operations)),
        Arc::new(StringArray::from(parameters)),
        Arc::new(Int64Array::from(added)),
        Arc::new(Int64Array::from(removed)),
    ];
    rows(engine, schema, columns).await
}
