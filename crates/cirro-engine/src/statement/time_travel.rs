//! Time travel: `FROM t VERSION AS OF n` and `FROM t TIMESTAMP AS OF '…'`.
//!
//! Every commit of a Delta table is a version; a snapshot of any version still
//! in the log (and whose files VACUUM has not removed) can be read. The parser
//! keeps the clause in the AST (`TableFactor::Table`'s `version`, see
//! `cirro_sql::dialect`); before planning, [`resolve_time_travel`] opens each
//! version asked for, serves it to the session under a temporary name for this
//! one statement, and points the table reference at that name (aliased to the
//! table's own name, so `t.col` still resolves). Past versions are read-only.

use std::ops::ControlFlow;
use std::sync::Arc;

use cirro_catalog::PAST_VERSION_PREFIX;
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::walk::{WalkMut, WalkerMut};
use cirro_storage::CirroTable;
use datafusion::common::TableReference;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, ObjectName, ObjectNamePart, TableAlias, TableFactor, TableVersion, Value,
};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::Engine;

/// Which past version a statement asks for.
enum AsOf {
    Version(i64),
    Timestamp(String),
}

/// A table reference with an AS OF clause, found in the AST.
struct Travel {
    reference: TableReference,
    as_of: AsOf,
    temp: String,
}

/// Finds `AS OF` clauses, checks their values, and points each at its
/// temporary name.
struct AsOfClauses<'a> {
    engine: &'a Engine,
    found: Vec<Travel>,
    /// Why the walk stopped: a clause that names no version or table.
    error: Option<CirroError>,
}

fn as_of(version: &TableVersion) -> Result<AsOf> {
    let literal = |expr: &Expr| match expr {
        Expr::Value(v) => Some(v.value.clone()),
        _ => None,
    };
    match version {
        TableVersion::VersionAsOf(expr) => match literal(expr) {
            Some(Value::Number(n, _)) => n.parse().map(AsOf::Version).map_err(|_| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("VERSION AS OF needs a version number, not {n}"),
                )
            }),
            _ => Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                format!("VERSION AS OF needs a version number, not {expr}"),
            )),
        },
        TableVersion::TimestampAsOf(expr) => match literal(expr) {
            Some(Value::SingleQuotedString(s)) => Ok(AsOf::Timestamp(s)),
            _ => Err(CirroError::new(
                SqlState::SYNTAX_ERROR,
                format!("TIMESTAMP AS OF needs a quoted timestamp, not {expr}"),
            )),
        },
        other => Err(CirroError::unsupported(format!(
            "table version {other} is not supported (VERSION AS OF n, TIMESTAMP AS OF '…')"
        ))),
    }
}

impl WalkerMut for AsOfClauses<'_> {
    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name,
            alias,
            version,
            ..
        } = factor
        else {
            return ControlFlow::Continue(());
        };
        let Some(clause) = version.take() else {
            return ControlFlow::Continue(());
        };
        let mut step = || -> Result<()> {
            let as_of = as_of(&clause)?;
            let reference =
                datafusion::sql::planner::object_name_to_table_reference(name.clone(), true)?;
            let (db, schema, table) = self.engine.resolve(&reference);
            let temp = format!("{PAST_VERSION_PREFIX}{}", self.found.len());
            if alias.is_none() {
                *alias = Some(TableAlias {
                    explicit: true,
                    name: Ident::with_quote('"', table.as_str()),
                    columns: vec![],
                    at: None,
                });
            }
            *name = ObjectName(
                [db.as_str(), schema.as_str(), temp.as_str()]
                    .into_iter()
                    .map(|part| ObjectNamePart::Identifier(Ident::with_quote('"', part)))
                    .collect(),
            );
            self.found.push(Travel {
                reference: TableReference::full(db, schema, table),
                as_of,
                temp,
            });
            Ok(())
        };
        match step() {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

/// Resolve the `AS OF` clauses of `statement` (see the module docs): after
/// this, the statement names only tables the session can serve.
pub(crate) async fn resolve_time_travel(
    engine: &Engine,
    statement: &mut DfStatement,
) -> Result<()> {
    engine.session.clear_versions();
    let DfStatement::Statement(inner) = statement else {
        return Ok(());
    };
    let mut clauses = AsOfClauses {
        engine,
        found: Vec::new(),
        error: None,
    };
    let _ = inner.walk_mut(&mut clauses);
    if let Some(error) = clauses.error {
        return Err(error);
    }
    for travel in clauses.found {
        let (db, schema, name) = (
            travel.reference.catalog().unwrap_or_default().to_string(),
            travel.reference.schema().unwrap_or_default().to_string(),
            travel.reference.table().to_string(),
        );
        engine.check_table(&db, &schema, &name, cirro_catalog::Privilege::Select)?;
        let table = open_past_version(engine, &db, &schema, &name, &travel.as_of).await?;
        engine.session.add_version(&travel.temp, table);
    }
    Ok(())
}

/// The location of table `db.schema.name`, or 42P01.
pub(crate) fn location_of(engine: &Engine, db: &str, schema: &str, name: &str) -> Result<String> {
    engine
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
