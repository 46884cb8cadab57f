//! The PostgreSQL protocol front end: simple and extended queries over a
//! session's engine. This folder owns only the protocol: logins
//! (`auth.rs`), COPY's data transfer (`copy.rs`), and here the mapping of
//! query messages onto the engine's handler.
//!
//! ```text
//!  Query(text)   split once ─► Engine::parse each ─► Engine::run ─► rows | tag
//!  Parse(text)   Engine::parse ─► Engine::prepare (planned once, typed $n)
//!  Bind(values)  decoded by the announced parameter types (arrow-pg)
//!  Execute       Engine::execute_prepared(values) ─► rows | tag
//! ```
//!
//! Bound values reach the plan as typed values (DataFusion's parameter
//! values), never as SQL text.

pub(crate) mod auth;
pub(crate) mod copy;
pub(crate) mod numeric;
pub(crate) mod server;
pub(crate) mod text;

use std::fmt::Debug;
use std::sync::Arc;

use arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use arrow_pg::datatypes::{arrow_schema_to_pg_fields, into_pg_type};
use arrow_pg::encoder::Encoder;
use async_trait::async_trait;
use cirro_common::{CirroError, SqlState};
use cirro_engine::{Engine, Outcome, Prepared, split_statements};
use cirro_sql::{CopyStatement, Parsed, Statement};
use datafusion::arrow::array::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::scalar::ScalarValue;
use futures::stream::{self, BoxStream};
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler, send_query_response};
use pgwire::api::results::{DataRowEncoder, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{ClientInfo, ClientPortalStore, DEFAULT_NAME, PgWireConnectionState, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::data::{NoData, ParameterDescription};
use pgwire::messages::extendedquery::{Describe, TARGET_TYPE_BYTE_STATEMENT};
use pgwire::messages::response::{EmptyQueryResponse, ReadyForQuery, TransactionStatus};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::ParameterStatus;
use pgwire::types::format::FormatOptions;

use crate::session::Session;

/// A statement as the extended protocol keeps it between Parse and Execute.
#[derive(Clone, Debug)]
pub(crate) struct PgStatement {
    prepared: Arc<Prepared>,
    /// Its text (pg_stat_activity's `query`).
    sql: String,
    /// When it was parsed (see `session::Deallocated`).
    generation: u64,
    /// Parameter types reported in ParameterDescription (and by which Bind's
    /// values are decoded).
    params: Vec<Type>,
}

pub(crate) fn to_pg(error: CirroError) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        error.state.0.to_owned(),
        error.message,
    )))
}

/// The non-empty statements of a query text, each parsed (split once, each
/// statement parsed once; a parse error is reported when its turn comes).
fn statements_of(session: &Session, text: &str) -> Vec<cirro_common::Result<Parsed>> {
    split_statements(text)
        .into_iter()
        .filter(|s| !s.trim().trim_matches(';').trim().is_empty())
        .map(|s| session.engine.parse(&s))
        .collect()
}

pub(crate) fn session_of<C: ClientInfo>(client: &C) -> PgWireResult<Arc<Session>> {
    client.session_extensions().get::<Session>().ok_or_else(|| {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "FATAL".to_owned(),
            SqlState::PROTOCOL_VIOLATION.0.to_owned(),
            "query before authentication".to_owned(),
        )))
    })
}

pub(crate) struct QueryHandler {
    parser: Arc<StatementParser>,
}

impl QueryHandler {
    pub(crate) fn new() -> Self {
        Self {
            parser: Arc::new(StatementParser),
        }
    }
}

pub(crate) fn fields_for(
    schema: &arrow::datatypes::Schema,
    format: &Format,
    options: Arc<FormatOptions>,
) -> PgWireResult<Arc<Vec<FieldInfo>>> {
    Ok(Arc::new(arrow_schema_to_pg_fields(
        schema,
        format,
        Some(options),
    )?))
}

/// The rows of `stream` as a query response in `format`.
fn query_response(
    session: &Arc<Session>,
    stream: SendableRecordBatchStream,
    format: &Format,
    options: Arc<FormatOptions>,
) -> PgWireResult<QueryResponse> {
    let fields = fields_for(&stream.schema(), format, options)?;
    let rows = encode_rows(Arc::clone(session), stream, Arc::clone(&fields));
    Ok(QueryResponse::new(fields, rows))
}

/// The rows of `stream` encoded for the wire, ending early with 57014 when
/// the session's statement is cancelled or times out.
fn encode_rows(
    session: Arc<Session>,
    stream: SendableRecordBatchStream,
    fields: Arc<Vec<FieldInfo>>,
) -> BoxStream<'static, PgWireResult<pgwire::messages::data::DataRow>> {
    let timeout = session.statement_timeout();
    let interrupted = Box::pin(async move { session.canceller.interrupted(timeout).await });
    let batches = stream::unfold(
        (stream, Some(interrupted)),
        |(mut stream, interrupted)| async move {
            let mut interrupted = interrupted?;
            tokio::select! {
                next = stream.next() => next.map(|batch| (batch.map_err(|e| to_pg(CirroError::from(e))), (stream, Some(interrupted)))),
                error = &mut interrupted => Some((Err(to_pg(error)), (stream, None))),
            }
        },
    );
    batches
        .flat_map(move |batch| {
            let rows: Vec<PgWireResult<_>> = match batch {
                Ok(batch) => encoded_rows(&fields, batch),
                Err(e) => vec![Err(e)],
            };
            stream::iter(rows)
        })
        // The first error ends the result.
        .scan(false, |failed, row| {
            let next = (!*failed).then(|| {
                *failed = row.is_err();
                row
            });
            std::future::ready(next)
        })
        .boxed()
}

/// The rows of `batch`, up to and including the first that cannot be
/// encoded, times in PostgreSQL's text form ([`text`]), NUMERICs of up to
/// 38 digits ([`numeric`]). (arrow-pg 0.16's row iterator returns the same
/// error again and again without moving on, so collecting it whole never
/// ended and grew without bound: a DECIMAL(36,15) value, which its NUMERIC
/// encoder cannot hold, hung the statement and ate the server's memory;
/// found by the fuzz test.)
fn encoded_rows(
    fields: &Arc<Vec<FieldInfo>>,
    batch: RecordBatch,
) -> Vec<PgWireResult<pgwire::messages::data::DataRow>> {
    let mut rows = Vec::with_capacity(batch.num_rows());
    let mut encoder = text::PgText(DataRowEncoder::new(Arc::clone(fields)));
    let schema = batch.schema();
    'rows: for row in 0..batch.num_rows() {
        for (column, array) in batch.columns().iter().enumerate() {
            let encoded = numeric::encode_cell(
                &mut encoder,
                array,
                row,
                schema.field(column),
                &fields[column],
            );
            if let Err(e) = encoded {
                rows.push(Err(e));
                break 'rows;
            }
        }
        rows.push(Ok(encoder.take_row()));
    }
    rows
}

pub(crate) fn transaction_status(engine: &Engine) -> TransactionStatus {
    if !engine.in_transaction() {
        TransactionStatus::Idle
    } else if engine.transaction_aborted() {
        TransactionStatus::Error
    } else {
        TransactionStatus::Transaction
    }
}

/// The ParameterStatus changes and the notice of a command, before its tag.
async fn send_notices<C>(
    client: &mut C,
    notice: Option<String>,
    reports: Vec<(String, String)>,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    for (name, value) in reports {
        client
            .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                name, value,
            )))
            .await?;
    }
    if let Some(message) = notice {
        client
            .feed(PgWireBackendMessage::NoticeResponse(
                ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), message).into(),
            ))
            .await?;
    }
    Ok(())
}

/// A WARNING before the rows of a query while the node cannot reach the
/// cluster's ZooKeeper (the catalog then comes from the storage).
async fn warn_if_cluster_unreachable<C>(client: &mut C, session: &Session) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    if session.engine.catalog().is_stale() {
        client
            .feed(PgWireBackendMessage::NoticeResponse(
                ErrorInfo::new(
                    "WARNING".to_owned(),
                    "01000".to_owned(),
                    "this node cannot reach the cluster's ZooKeeper: reads go on with the \
                     catalog read from the shared storage; DDL, user and grant changes are \
                     refused until it is back"
                        .to_owned(),
                )
                .into(),
            ))
            .await?;
    }
    Ok(())
}

/// What running statements left the connection in.
pub(crate) enum Flow {
    /// All ran (or one failed, and its error was sent).
    Done,
    /// A COPY FROM STDIN waits for its data; the rest run after it.
    CopyIn,
}

impl QueryHandler {
    /// Run the statements of a simple query one after another, each sent in
    /// full before the next starts; the first error is sent and ends them
    /// (PostgreSQL's rule). A cancel or statement_timeout stops the running
    /// statement.
    pub(crate) async fn run_statements<C>(
        &self,
        client: &mut C,
        session: &Arc<Session>,
        statements: Vec<cirro_common::Result<Parsed>>,
    ) -> PgWireResult<Flow>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let mut statements = statements.into_iter();
        while let Some(parsed) = statements.next() {
            let timeout = session.statement_timeout();
            let result = {
                let work = async {
                    let parsed = parsed.map_err(to_pg)?;
                    match parsed.statement {
                        Statement::Copy(CopyStatement::FromStdin(copy)) => {
                            let rest = statements.by_ref().collect();
                            copy::start_copy_in(client, session, copy, rest).await?;
                            return Ok(Flow::CopyIn);
                        }
                        Statement::Copy(CopyStatement::ToStdout { ref format, .. }) => {
                            let format = format.clone();
                            match session.engine.run(parsed).await.map_err(to_pg)? {
                                Outcome::Rows(stream) => {
                                    copy::send_copy_out(client, stream, &format).await?;
                                }
                                Outcome::Command { .. } => {
                                    return Err(to_pg(CirroError::new(
                                        SqlState::WRONG_OBJECT_TYPE,
                                        "COPY TO STDOUT needs a table or a query that returns rows",
                                    )));
                                }
                            }
                        }
                        Statement::Deallocate(name) => {
                            let tag = deallocate(session, name);
                            client
                                .feed(PgWireBackendMessage::CommandComplete(Tag::new(tag).into()))
                                .await?;
                        }
                        _ => match session.engine.run(parsed).await.map_err(to_pg)? {
                            Outcome::Rows(stream) => {
                                warn_if_cluster_unreachable(client, session).await?;
                                let response = query_response(
                                    session,
                                    stream,
                                    &Format::UnifiedText,
                                    Arc::clone(&options),
                                )?;
                                send_query_response(client, response, true).await?;
                            }
                            Outcome::Command {
                                tag,
                                notice,
                                reports,
                            } => {
                                send_notices(client, notice, reports).await?;
                                client
                                    .feed(PgWireBackendMessage::CommandComplete(
                                        Tag::new(&tag).into(),
                                    ))
                                    .await?;
                            }
                        },
                    }
                    Ok(Flow::Done)
                };
                tokio::select! {
                    result = work => result,
                    error = session.canceller.interrupted(timeout) => Err(to_pg(error)),
                }
            };
            match result {
                Ok(Flow::CopyIn) => return Ok(Flow::CopyIn),
                Ok(Flow::Done) => {}
                Err(error @ PgWireError::IoError(_)) => return Err(error),
                Err(error) => {
                    session.engine.fail_transaction();
                    let info: ErrorInfo = error.into();
                    client
                        .feed(PgWireBackendMessage::ErrorResponse(info.into()))
                        .await?;
                    break;
                }
            }
        }
        Ok(Flow::Done)
    }
}

#[async_trait]
impl SimpleQueryHandler for QueryHandler {
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        let session = session_of(client)?;
        client.set_state(PgWireConnectionState::QueryInProgress);
        session.canceller.reset();
        let _running = session
            .engine
            .backend()
            .map(|b| b.running(&query.query, || session.engine.idle_state()));
        let statements = statements_of(&session, &query.query);
        if statements.is_empty() {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
        }
        if let Flow::CopyIn = self.run_statements(client, &session, statements).await? {
            // ReadyForQuery comes after the data (see `copy`).
            return Ok(());
        }
        let status = transaction_status(&session.engine);
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(status);
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                status,
            )))
            .await?;
        Ok(())
    }

    async fn do_query<C>(&self, _client: &mut C, _query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // on_query handles simple queries itself.
        Err(PgWireError::NotReadyForQuery)
    }
}

pub(crate) struct StatementParser;

#[async_trait]
impl QueryParser for StatementParser {
    type Statement = PgStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<PgStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let session = session_of(client)?;
        let pieces: Vec<String> = split_statements(sql)
            .into_iter()
            .filter(|s| !s.trim().trim_matches(';').trim().is_empty())
            .collect();
        let sql = match pieces.as_slice() {
            [] => return Ok(None),
            [one] => one,
            _ => {
                return Err(to_pg(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    "cannot insert multiple commands into a prepared statement",
                )));
            }
        };
        let parsed = session.engine.parse(sql).map_err(to_pg)?;
        let declared = types
            .iter()
            .map(|t| t.as_ref().and_then(declared_type))
            .collect();
        let prepared = session
            .engine
            .prepare_typed(parsed, declared)
            .await
            .map_err(to_pg)?;
        let inferred = prepared.placeholder_types();
        let count = inferred.len().max(types.len());
        let params = (0..count)
            .map(|i| {
                if let Some(Some(hint)) = types.get(i)
                    && *hint != Type::UNKNOWN
                {
                    return hint.clone();
                }
                inferred
                    .get(i)
                    .cloned()
                    .flatten()
                    .and_then(|t| into_pg_type(&t).ok())
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        let generation = session
            .deallocated
            .lock()
            .map(|mut d| d.parsed())
            .unwrap_or_default();
        Ok(Some(PgStatement {
            prepared: Arc::new(prepared),
            sql: sql.to_string(),
            generation,
            params,
        }))
    }

    fn get_parameter_types(&self, statement: &PgStatement) -> PgWireResult<Vec<Type>> {
        Ok(statement.params.clone())
    }

    fn get_result_schema(
        &self,
        statement: &PgStatement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match statement.prepared.schema() {
            Some(schema) => Ok(arrow_schema_to_pg_fields(
                schema,
                format.unwrap_or(&Format::UnifiedText),
                None,
            )?),
            None => Ok(vec![]),
        }
    }
}

/// The Arrow type of a parameter type a client declared at Parse, where it
/// fixes the parameter's type (a float8 `$1` makes `$1 * 2` a float); a
/// NUMERIC's scale comes with each value. Text and unknown are left to be
/// inferred from where the parameter stands.
fn declared_type(t: &Type) -> Option<datafusion::arrow::datatypes::DataType> {
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    Some(match *t {
        Type::BOOL => DataType::Boolean,
        Type::INT2 => DataType::Int16,
        Type::INT4 => DataType::Int32,
        Type::INT8 => DataType::Int64,
        Type::FLOAT4 => DataType::Float32,
        Type::FLOAT8 => DataType::Float64,
        Type::DATE => DataType::Date32,
        Type::TIMESTAMP => DataType::Timestamp(TimeUnit::Microsecond, None),
        Type::TIMESTAMPTZ => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        // Its scale comes with each value (planned again at each Bind).
        Type::NUMERIC => cirro_engine::NUMERIC_AT_BIND,
        _ => return None,
    })
}

/// `DEALLOCATE name | ALL` of the protocol's prepared statements; the tag.
fn deallocate(session: &Session, name: Option<String>) -> &'static str {
    let all = name.is_none();
    match &name {
        // One PREPAREd in SQL is the engine's.
        Some(name) => {
            session.engine.forget_prepared(name);
        }
        None => session.engine.forget_all_prepared(),
    }
    if let Ok(mut deallocated) = session.deallocated.lock() {
        deallocated.forget(name);
    }
    if all { "DEALLOCATE ALL" } else { "DEALLOCATE" }
}

/// The values bound to `portal`'s parameters, decoded by their announced
/// types.
fn bound_values(portal: &Portal<PgStatement>) -> PgWireResult<Vec<ScalarValue>> {
    let statement = &portal.statement.statement;
    if portal.parameter_len() == 0 {
        return Ok(vec![]);
    }
    let server_types: Vec<Option<&Type>> = statement.params.iter().map(Some).collect();
    let values = deserialize_parameters_with_server_types(portal, &[], &server_types)?;
    match values {
        datafusion::common::ParamValues::List(values) => {
            Ok(values.into_iter().map(|v| v.value().clone()).collect())
        }
        datafusion::common::ParamValues::Map(_) => Err(to_pg(CirroError::internal(
            "named parameters are not supported",
        ))),
    }
}

#[async_trait]
impl ExtendedQueryHandler for QueryHandler {
    type Statement = PgStatement;
    type QueryParser = StatementParser;

    fn query_parser(&self) -> Arc<StatementParser> {
        Arc::clone(&self.parser)
    }

    /// pgwire answers Describe of a statement that has parameters but returns
    /// no rows with an empty RowDescription; PostgreSQL sends NoData, and
    /// pgjdbc takes the empty RowDescription for a query (executeBatch then
    /// counts 0 rows, executeUpdate fails). Such statements are answered
    /// here; the rest go to pgwire's default.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = PgStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if message.target_type == TARGET_TYPE_BYTE_STATEMENT {
            let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
            if let Some(Entry::Value(stored)) = client.portal_store().get_statement(name)
                && stored.statement.prepared.schema().is_none()
            {
                let described = self.do_describe_statement(client, &stored).await?;
                client
                    .send(PgWireBackendMessage::ParameterDescription(
                        ParameterDescription::new(
                            described.parameters.iter().map(|t| t.oid()).collect(),
                        ),
                    ))
                    .await?;
                client
                    .send(PgWireBackendMessage::NoData(NoData::new()))
                    .await?;
                return Ok(());
            }
        }
        self._on_describe(client, message).await
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<PgStatement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = PgStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = session_of(client)?;
        session.canceller.reset();
        let statement = &portal.statement.statement;
        let gone = session
            .deallocated
            .lock()
            .map(|d| d.is_gone(&portal.statement.id, statement.generation))
            .unwrap_or(false);
        if gone {
            return Err(to_pg(CirroError::new(
                SqlState::INVALID_SQL_STATEMENT_NAME,
                format!(
                    "prepared statement \"{}\" does not exist",
                    portal.statement.id
                ),
            )));
        }
        if let Statement::Deallocate(name) = statement.prepared.statement() {
            let tag = deallocate(&session, name.clone());
            return Ok(Response::Execution(Tag::new(tag)));
        }
        let prepared = &statement.prepared;
        if matches!(
            prepared.statement(),
            Statement::Copy(CopyStatement::FromStdin(_) | CopyStatement::ToStdout { .. })
        ) {
            return Err(to_pg(CirroError::unsupported(
                "COPY FROM STDIN and TO STDOUT run over the simple query protocol",
            )));
        }
        let values = bound_values(portal)?;
        let timeout = session.statement_timeout();
        let _running = session.engine.backend().map(|b| {
            b.running(&portal.statement.statement.sql, || {
                session.engine.idle_state()
            })
        });
        let ran = tokio::select! {
            ran = session.engine.execute_prepared(prepared, values) => ran,
            error = session.canceller.interrupted(timeout) => Err(error),
        };
        let ran = match ran {
            Ok(ran) => ran,
            Err(error) => {
                session.engine.fail_transaction();
                return Err(to_pg(error));
            }
        };
        match ran {
            Outcome::Rows(stream) => {
                warn_if_cluster_unreachable(client, &session).await?;
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                Ok(Response::Query(query_response(
                    &session,
                    stream,
                    &portal.result_column_format,
                    options,
                )?))
            }
            Outcome::Command {
                tag,
                notice,
                reports,
            } => {
                send_notices(client, notice, reports).await?;
                let status = transaction_status(&session.engine);
                let tag = Tag::new(&tag);
                Ok(match status {
                    TransactionStatus::Idle
                        if client.transaction_status() != TransactionStatus::Idle =>
                    {
                        Response::TransactionEnd(tag)
                    }
                    TransactionStatus::Transaction
                        if client.transaction_status() == TransactionStatus::Idle =>
                    {
                        Response::TransactionStart(tag)
                    }
                    _ => Response::Execution(tag),
                })
            }
        }
    }
}
