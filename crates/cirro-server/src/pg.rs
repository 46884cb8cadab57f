//! The PostgreSQL protocol front end: simple and extended queries over a
//! session's engine.
//!
//! Every statement runs through [`Engine::execute`], whichever protocol
//! carries it, so DML, transactions, maintenance and privileges behave as in
//! the shell. The extended protocol's parameters are bound by rendering each
//! decoded value as a typed SQL literal in place of its `$n` (the tokenizer
//! finds the placeholders, so text inside strings and comments is never
//! touched); Describe plans the statement without running it.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch, into_pg_type};
use async_trait::async_trait;
use cirro_common::{CirroError, SqlState};
use cirro_engine::{ClientCopy, Engine, Outcome, split_statements};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::Expr;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use datafusion::sql::unparser::Unparser;
use futures::stream::{self, BoxStream};
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler, send_query_response};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
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

use crate::session::{Session, SettingOutcome, parse_setting, setting_schema};
use crate::{Shared, compat, copy};

/// A statement as the extended protocol keeps it between Parse and Execute.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    sql: String,
    /// Parameter types reported in ParameterDescription.
    params: Vec<Type>,
    /// Columns of the rows it returns (None: a command).
    schema: Option<SchemaRef>,
}

pub(crate) fn to_pg(error: CirroError) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        error.state.0.to_owned(),
        error.message,
    )))
}

/// The non-empty statements of a query text.
fn statements_of(text: &str) -> Vec<String> {
    split_statements(text)
        .into_iter()
        .filter(|s| !s.trim().trim_matches(';').trim().is_empty())
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

/// What one statement produced, before it is sent.
pub(crate) enum Ran {
    Rows(SendableRecordBatchStream),
    Command {
        tag: String,
        notice: Option<String>,
        reports: Vec<(String, String)>,
    },
}

pub(crate) struct QueryHandler {
    shared: Arc<Shared>,
    parser: Arc<StatementParser>,
}

impl QueryHandler {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            parser: Arc::new(StatementParser {
                shared: Arc::clone(&shared),
            }),
            shared,
        }
    }
}

/// Rewrite what PostgreSQL clients send to their catalogs (psql's `\d`,
/// JDBC's metadata, BI tools) into SQL DataFusion plans; other statements
/// pass unchanged.
fn pg_compatible(shared: &Shared, sql: &str) -> String {
    let lower = sql.to_ascii_lowercase();
    let touches_catalog = [
        "pg_",
        "::reg",
        "information_schema",
        "current_",
        "operator(",
        "collate",
        "any(",
        "all(",
    ]
    .iter()
    .any(|needle| lower.contains(needle));
    if !touches_catalog {
        return sql.to_string();
    }
    match shared.compat.parse(sql) {
        Ok(statements) if statements.len() == 1 => {
            let statement = statements.into_iter().next().map(|s| {
                let mut s = shared.compat.rewrite(s);
                compat::rewrite_catalog_query(&mut s);
                s
            });
            match statement {
                Some(statement @ datafusion::sql::sqlparser::ast::Statement::Query(_)) => {
                    statement.to_string()
                }
                _ => sql.to_string(),
            }
        }
        _ => sql.to_string(),
    }
}

pub(crate) async fn run(shared: &Shared, session: &Session, sql: &str) -> Result<Ran, CirroError> {
    if let Some(setting) = parse_setting(sql)? {
        return match session.run_setting(setting)? {
            (SettingOutcome::Tag(tag), reports) => Ok(Ran::Command {
                tag: tag.to_string(),
                notice: None,
                reports,
            }),
            (SettingOutcome::Rows(batch), _) => {
                let frame = session.engine.context().read_batch(batch)?;
                Ok(Ran::Rows(frame.execute_stream().await?))
            }
        };
    }
    let sql = pg_compatible(shared, sql);
    match session.engine.execute(&sql).await? {
        Outcome::Rows(stream) => Ok(Ran::Rows(stream)),
        Outcome::Command { tag, notice } => Ok(Ran::Command {
            tag,
            notice,
            reports: vec![],
        }),
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
                Ok(batch) => encode_recordbatch(Arc::clone(&fields), batch).collect(),
                Err(e) => vec![Err(e)],
            };
            stream::iter(rows)
        })
        .boxed()
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
        statements: Vec<String>,
    ) -> PgWireResult<Flow>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let mut statements = statements.into_iter();
        while let Some(sql) = statements.next() {
            let timeout = session.statement_timeout();
            let result = {
                let work = async {
                    match cirro_engine::parse_client_copy(&sql).map_err(to_pg)? {
                        Some(ClientCopy::In(copy)) => {
                            let rest = statements.by_ref().collect();
                            copy::start_copy_in(client, session, copy, rest).await?;
                            return Ok(Flow::CopyIn);
                        }
                        Some(ClientCopy::Out { query, format }) => {
                            match run(&self.shared, session, &query).await.map_err(to_pg)? {
                                Ran::Rows(stream) => {
                                    copy::send_copy_out(client, stream, &format).await?;
                                }
                                Ran::Command { .. } => {
                                    return Err(to_pg(CirroError::new(
                                        SqlState::WRONG_OBJECT_TYPE,
                                        "COPY TO STDOUT needs a table or a query that returns rows",
                                    )));
                                }
                            }
                        }
                        None => match run(&self.shared, session, &sql).await.map_err(to_pg)? {
                            Ran::Rows(stream) => {
                                let response = query_response(
                                    session,
                                    stream,
                                    &Format::UnifiedText,
                                    Arc::clone(&options),
                                )?;
                                send_query_response(client, response, true).await?;
                            }
                            Ran::Command {
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
        let statements = statements_of(&query.query);
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

pub(crate) struct StatementParser {
    shared: Arc<Shared>,
}

#[async_trait]
impl QueryParser for StatementParser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let session = session_of(client)?;
        let statements = statements_of(sql);
        let sql = match statements.as_slice() {
            [] => return Ok(None),
            [one] => one.clone(),
            _ => {
                return Err(to_pg(CirroError::new(
                    SqlState::SYNTAX_ERROR,
                    "cannot insert multiple commands into a prepared statement",
                )));
            }
        };
        let (inferred, schema) = match parse_setting(&sql).map_err(to_pg)? {
            Some(setting) => (vec![], setting_schema(&setting)),
            None => {
                let described = session
                    .engine
                    .describe(&pg_compatible(&self.shared, &sql))
                    .await
                    .map_err(to_pg)?;
                (described.params, described.schema)
            }
        };
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
        Ok(Some(Prepared {
            sql,
            params,
            schema,
        }))
    }

    fn get_parameter_types(&self, statement: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(statement.params.clone())
    }

    fn get_result_schema(
        &self,
        statement: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match &statement.schema {
            Some(schema) => Ok(arrow_schema_to_pg_fields(
                schema,
                format.unwrap_or(&Format::UnifiedText),
                None,
            )?),
            None => Ok(vec![]),
        }
    }
}

/// `portal`'s statement with every `$n` replaced by its bound value.
fn bind(portal: &Portal<Prepared>) -> PgWireResult<String> {
    let prepared = &portal.statement.statement;
    if portal.parameter_len() == 0 {
        return Ok(prepared.sql.clone());
    }
    let server_types: Vec<Option<&Type>> = prepared.params.iter().map(Some).collect();
    let values = deserialize_parameters_with_server_types(portal, &[], &server_types)?;
    let values = match values {
        datafusion::common::ParamValues::List(values) => values,
        datafusion::common::ParamValues::Map(_) => {
            return Err(to_pg(CirroError::internal(
                "named parameters are not supported",
            )));
        }
    };
    let unparser = Unparser::default();
    let mut literals = Vec::with_capacity(values.len());
    for value in values {
        let expr = Expr::Literal(value.value().clone(), None);
        let literal = unparser
            .expr_to_sql(&expr)
            .map_err(|e| to_pg(CirroError::from(e)))?
            .to_string();
        literals.push(literal);
    }
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, &prepared.sql)
        .tokenize()
        .map_err(|e| to_pg(CirroError::new(SqlState::SYNTAX_ERROR, e.to_string())))?;
    let mut sql = String::with_capacity(prepared.sql.len() + 16 * literals.len());
    for token in tokens {
        match &token {
            Token::Placeholder(p) if p.starts_with('$') => {
                let index: usize = p[1..].parse().unwrap_or(0);
                let literal = index
                    .checked_sub(1)
                    .and_then(|i| literals.get(i))
                    .ok_or_else(|| {
                        to_pg(CirroError::new(
                            SqlState::PROTOCOL_VIOLATION,
                            format!("there is no parameter {p}"),
                        ))
                    })?;
                // A string literal stands alone (and stays a literal for the
                // catalog rewrites, as in `CAST('pg_class' AS REGCLASS)`);
                // anything else is parenthesized so that `-1` or a CAST
                // cannot merge with its neighbours.
                let plain_string =
                    literal.len() >= 2 && literal.starts_with('\'') && literal.ends_with('\'');
                if plain_string {
                    sql.push(' ');
                    sql.push_str(literal);
                    sql.push(' ');
                } else {
                    sql.push('(');
                    sql.push_str(literal);
                    sql.push(')');
                }
            }
            other => sql.push_str(&other.to_string()),
        }
    }
    Ok(sql)
}

#[async_trait]
impl ExtendedQueryHandler for QueryHandler {
    type Statement = Prepared;
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
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if message.target_type == TARGET_TYPE_BYTE_STATEMENT {
            let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
            if let Some(Entry::Value(stored)) = client.portal_store().get_statement(name)
                && stored.statement.schema.is_none()
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
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = session_of(client)?;
        session.canceller.reset();
        let sql = bind(portal)?;
        if cirro_engine::parse_client_copy(&sql)
            .map_err(to_pg)?
            .is_some()
        {
            return Err(to_pg(CirroError::unsupported(
                "COPY FROM STDIN and TO STDOUT run over the simple query protocol",
            )));
        }
        let timeout = session.statement_timeout();
        let ran = tokio::select! {
            ran = run(&self.shared, &session, &sql) => ran,
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
            Ran::Rows(stream) => {
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                Ok(Response::Query(query_response(
                    &session,
                    stream,
                    &portal.result_column_format,
                    options,
                )?))
            }
            Ran::Command {
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
