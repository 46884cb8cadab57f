//! Flight SQL prepared statements: `CreatePreparedStatement` parses and
//! plans once (the engine's [`Prepared`]); parameters arrive by DoPut as
//! Arrow rows, each row one execution; `GetFlightInfo` runs a query with the
//! last row bound, a DoPut update runs once per row. Values go into the plan
//! as typed values, never into SQL text.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::{IpcMessage, SchemaAsIpc};
use cirro_common::{CirroError, SqlState};
use cirro_engine::Prepared;
use datafusion::scalar::ScalarValue;
use futures::TryStreamExt;
use tonic::Status;

use super::status;

/// Statements a session may keep prepared at once.
pub(super) const PREPARED_STATEMENTS_MAX: usize = 256;

/// One prepared statement of a Flight SQL session.
pub(super) struct FlightPrepared {
    pub(super) prepared: Arc<Prepared>,
    /// Its text (pg_stat_activity's `query` while it runs).
    pub(super) sql: String,
    /// Rows of parameter values from the last DoPut (each one execution).
    pub(super) rows: Mutex<Vec<Vec<ScalarValue>>>,
}

/// The IPC form of `schema`, as Flight SQL messages carry schemas.
pub(super) fn schema_bytes(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(message.0)
}

/// The parameter schema clients bind by: `$1 … $n` with the types they
/// take (text where the statement leaves a type open).
pub(super) fn parameter_schema(prepared: &Prepared) -> Schema {
    Schema::new(
        prepared
            .placeholder_types()
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Field::new(
                    format!("${}", i + 1),
                    t.clone().unwrap_or(DataType::Utf8),
                    true,
                )
            })
            .collect::<Vec<_>>(),
    )
}

/// The rows of parameter values a DoPut carries.
pub(super) async fn parameter_rows(
    stream: PeekableFlightDataStream,
    wanted: usize,
) -> Result<Vec<Vec<ScalarValue>>, Status> {
    // The stream itself, not `into_inner()`: its first message (the schema,
    // with the descriptor) was peeked at and would be lost.
    let batches: Vec<RecordBatch> =
        FlightRecordBatchStream::new_from_flight_data(stream.map_err(Into::into))
            .try_collect()
            .await
            .map_err(|e| {
                status(CirroError::new(
                    SqlState::PROTOCOL_VIOLATION,
                    format!("cannot read the parameters: {e}"),
                ))
            })?;
    let mut rows = Vec::new();
    for batch in batches {
        if batch.num_columns() != wanted {
            return Err(status(CirroError::new(
                SqlState::PROTOCOL_VIOLATION,
                format!(
                    "{} parameters given, but the prepared statement takes {wanted}",
                    batch.num_columns()
                ),
            )));
        }
        for row in 0..batch.num_rows() {
            let values = batch
                .columns()
                .iter()
                .map(|column| ScalarValue::try_from_array(column, row))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| status(CirroError::from(e)))?;
            rows.push(values);
        }
    }
    Ok(rows)
}
