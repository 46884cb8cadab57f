//! `DESCRIBE HISTORY t`: one row per commit in the table's Delta log, newest
//! first.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use cirro_common::Result;
use cirro_sql::Maintenance;
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::statement::time_travel::location_of;
use crate::{Engine, Outcome};

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
        // commands: no rows
        Maintenance::Analyze(_)
        | Maintenance::CancelQuery(_)
        | Maintenance::VacuumTables { .. } => vec![],
    }))
}

/// Retention of VACUUM without RETAIN: 7 days, as in Delta Lake.
pub(crate) const VACUUM_RETAIN_HOURS_DEFAULT: u64 = 7 * 24;

/// A one-batch result.
pub(crate) async fn rows(
    engine: &Engine,
    schema: Arc<Schema>,
    columns: Vec<ArrayRef>,
) -> Result<Outcome> {
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
