//! The Arrow Flight SQL front end: columnar clients (ADBC, the Flight SQL
//! JDBC driver) get query results as Arrow record batches, without the row
//! conversion of the PostgreSQL protocol.
//!
//! ```text
//!  Handshake (Basic user:password) ─► password checked against the SCRAM
//!      verifier ─► a Session (as on the PostgreSQL side) under a bearer token
//!  GetFlightInfo(CommandStatementQuery) ─► the statement runs through the
//!      same path as a PostgreSQL simple query; its rows wait under a ticket
//!  DoGet(ticket) ─► the rows, streamed as Arrow IPC
//!  DoPut(CommandStatementUpdate) ─► a statement's row count
//!  CreatePreparedStatement ─► parsed and planned once (`prepared.rs`);
//!      DoPut(parameters) ─► GetFlightInfo/DoGet, or DoPut(update) ─► counts
//! ```
//!
//! Statements run through the engine's one handler (`Engine::run`,
//! `Engine::execute_prepared`), as on the PostgreSQL side.
//!
//! Every call after the handshake carries `authorization: Bearer <token>`;
//! the session runs as its user, so privileges are those of the PostgreSQL
//! side. The password travels in the clear unless the server has TLS
//! (`--tls-cert`/`--tls-key`, which then cover Flight SQL too). Commands
//! (DDL, DML, transactions) run at GetFlightInfo, which ADBC uses for every
//! statement; a query's plan runs as DoGet reads it, and a client that goes
//! away stops it. Sessions idle for [`IDLE_SESSION`] are dropped.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandGetSqlInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementQuery, CommandStatementUpdate,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    Ticket,
};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use cirro_catalog::DEFAULT_DATABASE;
use cirro_common::{CirroError, SqlState};
use cirro_engine::{Engine, EngineConfig, Outcome};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::EmptyRecordBatchStream;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status, Streaming};

mod prepared;

use crate::Shared;
use crate::session::{Canceller, Session};
use prepared::{FlightPrepared, PREPARED_STATEMENTS_MAX};

/// A Flight SQL session unused this long is dropped with its pending results.
const IDLE_SESSION: Duration = Duration::from_secs(3600);
/// `application_name` of Flight SQL sessions in pg_stat_activity.
pub(crate) const FLIGHT_APPLICATION_NAME: &str = "Flight SQL";
/// Results a session may leave unread before new statements are refused.
const MAX_PENDING_RESULTS: usize = 64;

/// One logged-in client.
struct FlightSession {
    session: Session,
    last_used: Mutex<Instant>,
    /// Results waiting for their DoGet, by ticket handle, with the text of
    /// the statement that computes them.
    results: Mutex<HashMap<Vec<u8>, (SendableRecordBatchStream, String)>>,
    /// Prepared statements, by handle.
    prepared: Mutex<HashMap<Vec<u8>, Arc<FlightPrepared>>>,
}

impl FlightSession {
    /// Keep `outcome` for its DoGet; returns the FlightInfo that names it.
    fn pending_result(
        &self,
        outcome: Outcome,
        descriptor: FlightDescriptor,
        sql: &str,
    ) -> Result<FlightInfo, Status> {
        let (rows, total) = match outcome {
            Outcome::Rows(rows) => (rows, -1),
            Outcome::Command { tag, .. } => {
                let empty: SendableRecordBatchStream =
                    Box::pin(EmptyRecordBatchStream::new(Arc::new(Schema::empty())));
                (empty, row_count(&tag))
            }
        };
        let schema = rows.schema();
        let handle = rand::random::<[u8; 16]>().to_vec();
        {
            let mut results = self.results.lock().map_err(|_| poisoned())?;
            if results.len() >= MAX_PENDING_RESULTS {
                return Err(status(CirroError::new(
                    SqlState::INSUFFICIENT_RESOURCES,
                    format!(
                        "{MAX_PENDING_RESULTS} results of this session are unread: read (DoGet) or drop them first"
                    ),
                )));
            }
            results.insert(handle.clone(), (rows, sql.to_string()));
        }
        let ticket = TicketStatementQuery {
            statement_handle: handle.into(),
        };
        let info = flight_info(&schema, ticket.as_any(), descriptor)?;
        Ok(info.with_total_records(total))
    }

    fn prepared(&self, handle: &[u8]) -> Result<Arc<FlightPrepared>, Status> {
        self.prepared
            .lock()
            .map_err(|_| poisoned())?
            .get(handle)
            .cloned()
            .ok_or_else(|| {
                status(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "no such prepared statement: it was closed or never created",
                ))
            })
    }

    /// Run a prepared statement once with `values`, as cancellable as any.
    async fn execute(
        &self,
        prepared: &FlightPrepared,
        values: Vec<datafusion::scalar::ScalarValue>,
    ) -> Result<Outcome, Status> {
        let work = self
            .session
            .engine
            .execute_prepared(&prepared.prepared, values);
        self.interruptible(&prepared.sql, work).await
    }

    /// Run statement `sql`.
    async fn run(&self, sql: &str) -> Result<Outcome, Status> {
        self.interruptible(sql, self.session.engine.execute(sql))
            .await
    }

    /// Run `work` (statement `sql`; the session is active meanwhile) until
    /// it ends, is cancelled (`pg_cancel_backend`) or passes
    /// `statement_timeout`: then it is dropped (its plan's streams and tasks
    /// with it) and the call fails with 57014.
    async fn interruptible(
        &self,
        sql: &str,
        work: impl std::future::Future<Output = cirro_common::Result<Outcome>>,
    ) -> Result<Outcome, Status> {
        let engine = &self.session.engine;
        let _running = engine
            .backend()
            .map(|b| b.running(sql, || engine.idle_state()));
        self.session.canceller.reset();
        let timeout = self.session.statement_timeout();
        let ran = tokio::select! {
            ran = work => ran,
            error = self.session.canceller.interrupted(timeout) => {
                self.session.engine.fail_transaction();
                Err(error)
            }
        };
        ran.map_err(status)
    }
}

pub(crate) struct FlightSql {
    shared: Arc<Shared>,
    sessions: Mutex<HashMap<String, Arc<FlightSession>>>,
    info: SqlInfoData,
}

/// Serve Flight SQL on `listener` (with the node's TLS, if it has one)
/// until the process ends.
pub(crate) fn spawn(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    tls: Option<&crate::tls::Tls>,
) -> Result<(), CirroError> {
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls.flight()).map_err(|e| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("TLS configuration (Flight SQL): {e}"),
            )
        })?;
    }
    let served = server
        .add_service(FlightSql::service(shared)?)
        // Without TCP_NODELAY each small reply waits out the client's
        // delayed ACK: ~45 ms per Flight SQL query (GetFlightInfo, then
        // DoGet).
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        );
    tokio::spawn(async move {
        if let Err(e) = served.await {
            eprintln!("cirro: Flight SQL stopped: {e}");
        }
    });
    Ok(())
}

impl FlightSql {
    pub(crate) fn service(shared: Arc<Shared>) -> Result<FlightServiceServer<Self>, CirroError> {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "Cirro");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        info.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        info.append(SqlInfo::FlightSqlServerReadOnly, false);
        let info = info
            .build()
            .map_err(|e| CirroError::internal(e.to_string()))?;
        Ok(FlightServiceServer::new(Self {
            shared,
            sessions: Mutex::new(HashMap::new()),
            info,
        })
        // Results of large queries come in large messages; so may requests.
        .max_decoding_message_size(64 << 20))
    }

    /// The session of the request's bearer token.
    fn session<T>(&self, request: &Request<T>) -> Result<Arc<FlightSession>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                status(CirroError::new(
                    SqlState::INVALID_AUTHORIZATION,
                    "no session: authenticate first (Handshake with a user name and password)",
                ))
            })?;
        let sessions = self.sessions.lock().map_err(|_| poisoned())?;
        let session = sessions.get(token).cloned().ok_or_else(|| {
            status(CirroError::new(
                SqlState::INVALID_AUTHORIZATION,
                "the session has ended or the token is not valid: authenticate again",
            ))
        })?;
        if session.session.canceller.is_terminated() {
            // pg_terminate_backend: the session ends, its token with it.
            drop(sessions);
            if let Ok(mut sessions) = self.sessions.lock() {
                sessions.remove(token);
            }
            return Err(status(CirroError::new(
                SqlState::ADMIN_SHUTDOWN,
                "terminating connection due to administrator command",
            )));
        }
        if let Ok(mut used) = session.last_used.lock() {
            *used = Instant::now();
        }
        Ok(session)
    }

    /// Check `user`'s password and open a session for them, registered in
    /// the server's backend registry (pg_stat_activity, pg_cancel_backend,
    /// pg_terminate_backend) like a PostgreSQL connection.
    async fn login(
        &self,
        user: &str,
        password: &str,
        client_addr: Option<String>,
    ) -> Result<Session, CirroError> {
        self.shared.check_password(user, password).await?;
        let config = EngineConfig {
            database: Some(DEFAULT_DATABASE.to_string()),
            ..self.shared.engine.clone()
        };
        let engine = Engine::with_catalog(
            Arc::clone(&self.shared.catalog),
            config,
            Some(user.to_string()),
        );
        let canceller = Arc::new(Canceller::default());
        let signal: Arc<dyn cirro_engine::activity::BackendSignal> = canceller.clone();
        let backend = self.shared.activity.register(
            user,
            DEFAULT_DATABASE,
            FLIGHT_APPLICATION_NAME,
            client_addr,
            Arc::downgrade(&signal),
        );
        engine.attach_backend(backend)?;
        Session::new(engine, DEFAULT_DATABASE, canceller)
    }

    fn forget_idle_sessions(&self) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.retain(|_, s| {
                s.last_used
                    .lock()
                    .map(|used| used.elapsed() < IDLE_SESSION)
                    .unwrap_or(false)
            });
        }
    }
}

fn poisoned() -> Status {
    Status::internal("session registry lock poisoned")
}

/// A Cirro error as a gRPC status: the code nearest to its SQLSTATE class,
/// the SQLSTATE in the message and in the `x-cirro-sqlstate` metadata.
fn status(error: CirroError) -> Status {
    let state = error.state.0;
    let code = match state {
        "42501" => Code::PermissionDenied,
        "57014" => Code::Cancelled,
        _ => match &state[..2] {
            "28" => Code::Unauthenticated,
            "0A" => Code::Unimplemented,
            "40" => Code::Aborted,
            "53" => Code::ResourceExhausted,
            "XX" | "58" => Code::Internal,
            _ => Code::InvalidArgument,
        },
    };
    let mut metadata = MetadataMap::new();
    metadata.insert("x-cirro-sqlstate", MetadataValue::from_static(state));
    Status::with_metadata(
        code,
        format!("{} (SQLSTATE {state})", error.message),
        metadata,
    )
}

/// `user` and `password` from an `authorization: Basic …` header.
fn basic_credentials(metadata: &MetadataMap) -> Result<(String, String), Status> {
    let refused = |why: &str| {
        status(CirroError::new(
            SqlState::INVALID_AUTHORIZATION,
            format!("{why}: Flight SQL logins use basic authentication (user name and password)"),
        ))
    };
    let header = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| refused("no credentials"))?;
    let encoded = header
        .strip_prefix("Basic ")
        .ok_or_else(|| refused("unsupported authorization scheme"))?;
    // Go's Flight client (ADBC) sends unpadded base64.
    let decoded = STANDARD_NO_PAD
        .decode(encoded.trim().trim_end_matches('='))
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| refused("malformed basic credentials"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| refused("malformed basic credentials"))?;
    Ok((user.to_string(), password.to_string()))
}

/// The row count at the end of a command tag (`INSERT 0 5` → 5), or -1.
fn row_count(tag: &str) -> i64 {
    tag.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// A FlightInfo with one endpoint, whose ticket is `ticket`.
fn flight_info(
    schema: &Schema,
    ticket: arrow_flight::sql::Any,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket.encode_to_vec()));
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(e.to_string()))?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor))
}

/// `batches` as a DoGet reply.
/// A batch that is a small slice of much larger buffers, copied into buffers
/// of its own. Hash aggregation emits its whole output as one batch and
/// slices it; arrow-flight 59's encoder sizes a batch by its underlying
/// buffers (`get_buffer_memory_size`), so it cut each 8,192-row slice of a
/// 10 M-group result into 46-row messages: 26 s to send 10 M rows instead of
/// about 1 s. String and binary view columns are garbage-collected first (see
/// `cirro_common::batch::own_view_data`: a Flight reply of TPC-H Q10 at SF1
/// cost ~200 ms without). Batches that own their buffers pass through untouched.
fn compact(batch: RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    let batch = cirro_common::batch::own_view_data(batch, SMALL)?;
    let whole: usize = batch
        .columns()
        .iter()
        .map(|c| c.get_buffer_memory_size())
        .sum();
    if whole <= SMALL {
        return Ok(batch);
    }
    let mut used = 0;
    for column in batch.columns() {
        let data = column.to_data();
        // A view array's slice size counts its views, not the data buffers
        // they point into (which `own_view_data` has trimmed already).
        let view_data: usize = match column.data_type() {
            DataType::Utf8View | DataType::BinaryView => {
                data.buffers().iter().skip(1).map(|b| b.len()).sum()
            }
            _ => 0,
        };
        used += data.get_slice_memory_size()? + view_data;
    }
    if whole <= 2 * used {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| {
            // (arrow's concat of a single array returns the same slice)
            let data = c.to_data();
            let mut copy = arrow::array::MutableArrayData::new(vec![&data], false, data.len());
            copy.try_extend(0, 0, data.len())?;
            Ok(arrow::array::make_array(copy.freeze()))
        })
        .collect::<Result<Vec<_>, arrow::error::ArrowError>>()?;
    RecordBatch::try_new(batch.schema(), columns)
}

/// Below this many bytes of buffers a batch is sent as it is.
const SMALL: usize = 1 << 20;

fn encode(
    schema: SchemaRef,
    batches: impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
) -> DoGetStream {
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches)
            .map_err(Status::from),
    )
}

/// `batches`, ended with 57014 when the session is cancelled or `timeout`
/// passes while they stream (the rows of a query are computed as DoGet
/// reads them): the query's streams are dropped then.
fn until_interrupted<S>(
    batches: S,
    canceller: Arc<Canceller>,
    timeout: Option<Duration>,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static
where
    S: Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
{
    let interrupted = Box::pin(async move { canceller.interrupted(timeout).await });
    stream::unfold(
        (Box::pin(batches), interrupted, false),
        |(mut batches, mut interrupted, done)| async move {
            if done {
                return None;
            }
            tokio::select! {
                item = batches.next() => item.map(|i| (i, (batches, interrupted, false))),
                error = &mut interrupted => {
                    Some((Err(FlightError::Tonic(Box::new(status(error)))), (batches, interrupted, true)))
                }
            }
        },
    )
}

type DoGetStream = <FlightSql as FlightService>::DoGetStream;

type HandshakeStream = Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<HandshakeStream>, Status> {
        self.forget_idle_sessions();
        let (user, password) = basic_credentials(request.metadata())?;
        let client_addr = request.remote_addr().map(|a| a.ip().to_string());
        let session = self
            .login(&user, &password, client_addr)
            .await
            .map_err(status)?;
        let token = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        self.sessions.lock().map_err(|_| poisoned())?.insert(
            token.clone(),
            Arc::new(FlightSession {
                session,
                last_used: Mutex::new(Instant::now()),
                results: Mutex::new(HashMap::new()),
                prepared: Mutex::new(HashMap::new()),
            }),
        );
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let mut response: Response<HandshakeStream> =
            Response::new(Box::pin(stream::iter([Ok(reply)])));
        let header = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|e| Status::internal(e.to_string()))?;
        response.metadata_mut().insert("authorization", header);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request)?;
        let outcome = session.run(&query.query).await?;
        Ok(Response::new(session.pending_result(
            outcome,
            request.into_inner(),
            &query.query,
        )?))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request)?;
        let rows = session
            .results
            .lock()
            .map_err(|_| poisoned())?
            .remove(ticket.statement_handle.as_ref())
            .ok_or_else(|| {
                status(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "no result for this ticket: it was read already",
                ))
            })?;
        let (rows, sql) = rows;
        let schema = rows.schema();
        // The rows are computed as they stream: the session is active until
        // the stream ends or is dropped.
        let engine = &session.session.engine;
        let running = engine
            .backend()
            .map(|b| b.running_owned(&sql, engine.idle_state()));
        let batches = rows
            .map_err(|e| FlightError::Tonic(Box::new(status(CirroError::from(e)))))
            .and_then(|batch| async move { compact(batch).map_err(FlightError::Arrow) })
            .inspect(move |_| {
                let _ = &running;
            });
        let batches = until_interrupted(
            batches,
            Arc::clone(&session.session.canceller),
            session.session.statement_timeout(),
        );
        Ok(Response::new(encode(schema, batches)))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request)?;
        match session.run(&command.query).await? {
            Outcome::Command { tag, .. } => Ok(row_count(&tag)),
            Outcome::Rows(_) => Err(status(CirroError::new(
                SqlState::WRONG_OBJECT_TYPE,
                "the statement returns rows: run it as a query",
            ))),
        }
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.session(&request)?;
        let schema = query.clone().into_builder(&self.info).schema();
        let info = flight_info(&schema, query.as_any(), request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.session(&request)?;
        let builder = query.into_builder(&self.info);
        let schema = builder.schema();
        let batch = builder.build().map_err(FlightError::from);
        Ok(Response::new(encode(schema, stream::iter([batch]))))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = self.session(&request)?;
        let engine = &session.session.engine;
        let parsed = engine.parse(&query.query).map_err(status)?;
        let prepared = engine.prepare(parsed).await.map_err(status)?;
        let dataset_schema = match prepared.schema() {
            Some(schema) => prepared::schema_bytes(schema)?,
            None => prepared::schema_bytes(&Schema::empty())?,
        };
        let parameter_schema = prepared::schema_bytes(&prepared::parameter_schema(&prepared))?;
        let handle = rand::random::<[u8; 16]>().to_vec();
        {
            let mut all = session.prepared.lock().map_err(|_| poisoned())?;
            if all.len() >= PREPARED_STATEMENTS_MAX {
                return Err(status(CirroError::new(
                    SqlState::INSUFFICIENT_RESOURCES,
                    format!(
                        "this session holds {PREPARED_STATEMENTS_MAX} prepared statements: close some first"
                    ),
                )));
            }
            all.insert(
                handle.clone(),
                Arc::new(FlightPrepared {
                    prepared: Arc::new(prepared),
                    sql: query.query.clone(),
                    rows: Mutex::new(Vec::new()),
                }),
            );
        }
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema,
            parameter_schema,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = self.session(&request)?;
        session
            .prepared
            .lock()
            .map_err(|_| poisoned())?
            .remove(query.prepared_statement_handle.as_ref());
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let session = self.session(&request)?;
        let prepared = session.prepared(&query.prepared_statement_handle)?;
        let wanted = prepared.prepared.placeholder_types().len();
        let rows = prepared::parameter_rows(request.into_inner(), wanted).await?;
        *prepared.rows.lock().map_err(|_| poisoned())? = rows;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request)?;
        let prepared = session.prepared(&query.prepared_statement_handle)?;
        let values = prepared
            .rows
            .lock()
            .map_err(|_| poisoned())?
            .last()
            .cloned()
            .unwrap_or_default();
        let outcome = session.execute(&prepared, values).await?;
        Ok(Response::new(session.pending_result(
            outcome,
            request.into_inner(),
            &prepared.sql,
        )?))
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request)?;
        let prepared = session.prepared(&query.prepared_statement_handle)?;
        let wanted = prepared.prepared.placeholder_types().len();
        let mut rows = prepared::parameter_rows(request.into_inner(), wanted).await?;
        if rows.is_empty() {
            rows.push(vec![]);
        }
        let mut total = 0;
        for values in rows {
            match session.execute(&prepared, values).await? {
                Outcome::Command { tag, .. } => total += row_count(&tag).max(0),
                Outcome::Rows(_) => {
                    return Err(status(CirroError::new(
                        SqlState::WRONG_OBJECT_TYPE,
                        "the statement returns rows: run it as a query",
                    )));
                }
            }
        }
        Ok(total)
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slices_of_large_batches_go_out_whole() {
        use arrow::array::{Array, Int64Array, StringArray};
        let rows = 1_000_000;
        let schema = Arc::new(Schema::new(vec![
            arrow::datatypes::Field::new("k", arrow::datatypes::DataType::Int64, false),
            arrow::datatypes::Field::new("s", arrow::datatypes::DataType::Utf8, true),
        ]));
        let big = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(StringArray::from_iter(
                    (0..rows).map(|i| (i % 7 != 0).then(|| format!("name {i}"))),
                )),
            ],
        )
        .unwrap();
        let slice = big.slice(500_000, 8192);
        let own = compact(slice.clone()).unwrap();
        assert_eq!(own, slice);
        let bytes: usize = own
            .columns()
            .iter()
            .map(|c| c.get_buffer_memory_size())
            .sum();
        assert!(bytes < 400_000, "{bytes}");
        assert_eq!(own.column(1).null_count(), slice.column(1).null_count());
        // The encoder now sends the slice as one message, not hundreds.
        let count = |batch: RecordBatch| {
            let schema = batch.schema();
            async move {
                encode(schema, stream::iter([Ok(batch)]))
                    .try_collect::<Vec<_>>()
                    .await
                    .unwrap()
                    .len()
            }
        };
        assert_eq!(count(own).await, 2); // the schema, then the batch
        assert!(count(slice).await > 10);
        // A batch with buffers of its own is passed through as it is.
        let small = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        assert_eq!(compact(small.clone()).unwrap(), small);
    }

    #[tokio::test]
    async fn view_columns_go_out_without_the_buffers_of_other_rows() {
        use arrow::array::{Array, StringViewArray};
        // 200,000 strings too long to be inlined in their views: ~8 MB of data.
        let long = StringViewArray::from_iter_values(
            (0..200_000).map(|i| format!("customer comment number {i:>20}")),
        );
        let schema = Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
            "c",
            arrow::datatypes::DataType::Utf8View,
            false,
        )]));
        let big = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(long)]).unwrap();
        // What a top-k leaves: a few rows that still point into all of it.
        let top = big.slice(123_456, 20);
        let own = compact(top.clone()).unwrap();
        assert_eq!(own, top);
        let bytes = |b: &RecordBatch| -> usize {
            b.columns().iter().map(|c| c.get_buffer_memory_size()).sum()
        };
        assert!(bytes(&top) > 8_000_000, "{}", bytes(&top));
        assert!(bytes(&own) < 10_000, "{}", bytes(&own));
        let sent = |batch: RecordBatch| async move {
            encode(batch.schema(), stream::iter([Ok(batch)]))
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .iter()
                .map(|m| m.data_body.len())
                .sum::<usize>()
        };
        assert!(sent(own).await < 10_000);
        assert!(sent(top).await > 8_000_000);
        // A view column that uses its buffers is left as it is.
        let whole = compact(big.clone()).unwrap();
        assert!(Arc::ptr_eq(whole.column(0), big.column(0)));
    }

    #[test]
    fn errors_keep_their_sqlstate() {
        let denied = status(CirroError::new(
            SqlState::INSUFFICIENT_PRIVILEGE,
            "permission denied for table t",
        ));
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert!(denied.message().contains("SQLSTATE 42501"));
        assert_eq!(
            denied
                .metadata()
                .get("x-cirro-sqlstate")
                .and_then(|v| v.to_str().ok()),
            Some("42501")
        );
        let login = status(CirroError::new(SqlState::INVALID_PASSWORD, "no"));
        assert_eq!(login.code(), Code::Unauthenticated);
        assert_eq!(row_count("INSERT 0 5"), 5);
        assert_eq!(row_count("CREATE TABLE"), -1);
    }

    #[test]
    fn reads_basic_credentials() {
        let mut metadata = MetadataMap::new();
        let encoded = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("alice:pa:ss")
        );
        metadata.insert(
            "authorization",
            MetadataValue::try_from(encoded).expect("ascii"),
        );
        let (user, password) = basic_credentials(&metadata).expect("credentials");
        assert_eq!((user.as_str(), password.as_str()), ("alice", "pa:ss"));
        metadata.insert("authorization", MetadataValue::from_static("Bearer x"));
        assert_eq!(
            basic_credentials(&metadata).map_err(|s| s.code()).err(),
            Some(Code::Unauthenticated)
        );
    }
}
