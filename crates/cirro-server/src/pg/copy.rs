//! `COPY … FROM STDIN` and `COPY … TO STDOUT` over the PostgreSQL protocol
//! (psql's `\copy`, psycopg's `cursor.copy`, JDBC's `CopyManager`).
//!
//! COPY FROM STDIN runs as one INSERT in a task of its own that reads the
//! client's CopyData through a bounded channel (so a fast client waits for
//! the writer, and memory stays bounded). The INSERT commits only after
//! CopyDone: a CopyFail, bad data or a client that goes away ends the channel
//! without it, the INSERT fails and the table is left as it was.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::datatypes::Schema;
use arrow_pg::encoder::Encoder;
use async_trait::async_trait;
use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::{CopyIn, Outcome, TextFormat};
use cirro_sql::{CopyStatement, Parsed, Statement};
use datafusion::execution::SendableRecordBatchStream;
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::Format;
use pgwire::api::results::{CopyCsvOptions, CopyEncoder, CopyTextOptions, Tag};
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail, CopyInResponse, CopyOutResponse};
use pgwire::types::format::FormatOptions;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

use crate::pg::{QueryHandler, session_of, to_pg, transaction_status};
use crate::session::Session;

/// CopyData messages buffered between the connection and the INSERT.
const CHANNEL_MESSAGES: usize = 64;

enum Chunk {
    Data(bytes::Bytes),
    /// CopyDone: the data is complete.
    Done,
}

/// A COPY FROM STDIN in progress on a connection.
struct ActiveCopy {
    sender: Option<mpsc::Sender<Chunk>>,
    insert: JoinHandle<Result<Outcome>>,
    /// Statements after the COPY in the same query message.
    rest: Vec<Result<Parsed>>,
}

/// The connection's COPY FROM STDIN, if one is in progress. Kept in the
/// connection's extensions: when the connection ends, it is dropped, the
/// channel closes without CopyDone, and the INSERT fails.
#[derive(Default)]
pub(crate) struct CopySlot(Mutex<Option<ActiveCopy>>);

/// Start `copy`: spawn its INSERT, send CopyInResponse and enter COPY mode.
/// `rest` runs after the data is complete.
pub(crate) async fn start_copy_in<C>(
    client: &mut C,
    session: &Arc<Session>,
    copy: CopyIn,
    rest: Vec<Result<Parsed>>,
) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let client_copy = |p: &Result<Parsed>| {
        matches!(
            p,
            Ok(Parsed {
                statement: Statement::Copy(
                    CopyStatement::FromStdin(_) | CopyStatement::ToStdout { .. }
                ),
                ..
            })
        )
    };
    if rest.iter().any(client_copy) {
        return Err(to_pg(CirroError::unsupported(
            "a query message may hold one COPY FROM STDIN or TO STDOUT, after which no other COPY",
        )));
    }
    let columns = session.engine.copy_in_columns(&copy).await.map_err(to_pg)?;
    let (sender, receiver) = mpsc::channel::<Chunk>(CHANNEL_MESSAGES);
    let data = futures::stream::unfold(Some(receiver), |receiver| async move {
        let mut receiver = receiver?;
        match receiver.recv().await {
            Some(Chunk::Data(bytes)) => Some((Ok(bytes), Some(receiver))),
            Some(Chunk::Done) => None,
            None => Some((
                Err(CirroError::new(
                    SqlState::QUERY_CANCELED,
                    "COPY from stdin failed: the data ended without CopyDone",
                )),
                None,
            )),
        }
    });
    let writer = Arc::clone(session);
    let insert = tokio::spawn(async move { writer.engine.copy_in(&copy, data).await });
    let slot = client
        .session_extensions()
        .get_or_insert_with(CopySlot::default);
    *slot.0.lock().await = Some(ActiveCopy {
        sender: Some(sender),
        insert,
        rest,
    });
    client
        .send(PgWireBackendMessage::CopyInResponse(CopyInResponse::new(
            0,
            columns.len() as i16,
            vec![0; columns.len()],
        )))
        .await?;
    client.set_state(PgWireConnectionState::CopyInProgress(false));
    Ok(())
}

/// Send the rows of `stream` as `COPY … TO STDOUT` data in `format`.
pub(crate) async fn send_copy_out<C>(
    client: &mut C,
    stream: SendableRecordBatchStream,
    format: &TextFormat,
) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let schema = stream.schema();
    let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
    let fields = crate::pg::fields_for(&schema, &Format::UnifiedText, options)?;
    let delimiter = char::from(format.delimiter).to_string();
    let mut encoder = super::text::PgText(if format.csv {
        // Quote text columns always, so an empty string is not read back as
        // NULL (pgwire quotes only values holding special characters).
        let force_quote = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.data_type().is_string())
            .map(|(i, _)| i)
            .collect();
        CopyEncoder::new_csv(
            Arc::clone(&fields),
            CopyCsvOptions {
                delimiter: delimiter.into(),
                quote: char::from(format.quote).to_string().into(),
                escape: char::from(format.escape).to_string().into(),
                null_string: format.null.as_str().into(),
                force_quote,
            },
        )
    } else {
        CopyEncoder::new_text(
            Arc::clone(&fields),
            CopyTextOptions {
                delimiter: delimiter.into(),
                null_string: format.null.as_str().into(),
            },
        )
    });
    let columns = schema.fields().len();
    client
        .send(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
            0,
            columns as i16,
            vec![0; columns],
        )))
        .await?;
    if format.header {
        client
            .feed(PgWireBackendMessage::CopyData(CopyData::new(
                header_line(&schema, format).into(),
            )))
            .await?;
    }
    let mut rows = 0usize;
    let mut stream = stream;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| to_pg(CirroError::from(e)))?;
        for row in 0..batch.num_rows() {
            for (column, field) in schema.fields().iter().enumerate() {
                super::numeric::encode_cell(
                    &mut encoder,
                    batch.column(column),
                    row,
                    field,
                    &fields[column],
                )?;
            }
            client
                .feed(PgWireBackendMessage::CopyData(encoder.take_row()))
                .await?;
            rows += 1;
        }
    }
    client
        .feed(PgWireBackendMessage::CopyDone(CopyDone::new()))
        .await?;
    client
        .feed(PgWireBackendMessage::CommandComplete(
            Tag::new("COPY").with_rows(rows).into(),
        ))
        .await?;
    Ok(())
}

/// The column names as COPY's header line.
fn header_line(schema: &Schema, format: &TextFormat) -> Vec<u8> {
    let mut line = Vec::new();
    let names = schema.fields().iter().map(|f| Some(f.name().as_str()));
    cirro_engine::encode_row(&mut line, format, names, |_| false);
    line
}

#[async_trait]
impl CopyHandler for QueryHandler {
    async fn on_copy_data<C>(&self, client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(slot) = client.session_extensions().get::<CopySlot>() else {
            return Ok(());
        };
        let mut active = slot.0.lock().await;
        if let Some(copy) = active.as_mut()
            && let Some(sender) = &copy.sender
            && sender.send(Chunk::Data(copy_data.data)).await.is_err()
        {
            // The INSERT ended early (bad data): drop the rest; its error
            // is reported at CopyDone, as PostgreSQL reports it then too.
            copy.sender = None;
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = session_of(client)?;
        let Some(copy) = take_copy(client).await else {
            return Ok(());
        };
        if let Some(sender) = &copy.sender {
            let _ = sender.send(Chunk::Done).await;
        }
        let result = finish(copy.insert).await;
        match result {
            Ok(Outcome::Command { tag, .. }) => {
                client
                    .send(PgWireBackendMessage::CommandComplete(Tag::new(&tag).into()))
                    .await?;
                self.run_statements(client, &session, copy.rest).await?;
            }
            Ok(Outcome::Rows(_)) => {}
            Err(error) => {
                session.engine.fail_transaction();
                let info: ErrorInfo = to_pg(error).into();
                client
                    .feed(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await?;
            }
        }
        client.set_transaction_status(transaction_status(&session.engine));
        Ok(())
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(copy) = take_copy(client).await {
            // Closing the channel without CopyDone makes the INSERT fail.
            drop(copy.sender);
            let _ = finish(copy.insert).await;
        }
        if let Ok(session) = session_of(client) {
            session.engine.fail_transaction();
        }
        to_pg(CirroError::new(
            SqlState::QUERY_CANCELED,
            format!("COPY from stdin failed: {}", fail.message),
        ))
    }
}

async fn take_copy<C: ClientInfo>(client: &C) -> Option<ActiveCopy> {
    let slot = client.session_extensions().get::<CopySlot>()?;
    slot.0.lock().await.take()
}

async fn finish(insert: JoinHandle<Result<Outcome>>) -> Result<Outcome> {
    insert
        .await
        .map_err(|e| CirroError::internal(format!("COPY task failed: {e}")))?
}
