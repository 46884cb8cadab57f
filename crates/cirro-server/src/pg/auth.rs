//! Login: SCRAM-SHA-256 (RFC 5802, 7677) against the verifiers in the
//! catalog, then a per-connection session running as the user.
//!
//! pgwire's own SCRAM handler checks proofs against a salted password, which
//! is password-equivalent; Cirro keeps only PostgreSQL-style verifiers
//! (StoredKey/ServerKey), so the exchange is implemented here. One handler
//! serves one connection (`startup_handler()` is called per connection).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use cirro_catalog::{DEFAULT_DATABASE, ScramVerifier};
use cirro_common::SqlState;
use cirro_engine::Engine;
use futures::{Sink, SinkExt};
use pgwire::api::auth::{
    StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::{
    ClientInfo, METADATA_DATABASE, METADATA_USER, PgWireConnectionState, PidSecretKeyGenerator,
};

use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily, Startup};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::sync::Mutex;

use crate::Shared;
use crate::session::{Canceller, Session};

const MECHANISM: &str = "SCRAM-SHA-256";

enum AuthState {
    Initial,
    /// Startup received, SASL offered.
    Offered {
        user: String,
    },
    /// server-first sent; waiting for client-final.
    ServerFirstSent {
        user: String,
        verifier: ScramVerifier,
        nonce: String,
        gs2_header: String,
        /// client-first-bare + "," + server-first
        auth_prefix: String,
    },
    Done,
}

pub(crate) struct ScramStartup {
    shared: Arc<Shared>,
    canceller: Arc<Canceller>,
    state: Mutex<AuthState>,
}

impl ScramStartup {
    pub(crate) fn new(shared: Arc<Shared>, canceller: Arc<Canceller>) -> Self {
        Self {
            shared,
            canceller,
            state: Mutex::new(AuthState::Initial),
        }
    }
}

pub(crate) fn fatal(state: SqlState, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        state.0.to_owned(),
        message.into(),
    )))
}

fn protocol(message: impl Into<String>) -> PgWireError {
    fatal(SqlState::PROTOCOL_VIOLATION, message)
}

fn password_failed(user: &str) -> PgWireError {
    fatal(
        SqlState::INVALID_PASSWORD,
        format!("password authentication failed for user \"{user}\""),
    )
}

/// `key=value` attributes of a SCRAM message.
fn attribute<'a>(message: &'a str, key: char) -> Option<&'a str> {
    message.split(',').find_map(|part| {
        let mut chars = part.chars();
        (chars.next() == Some(key) && chars.next() == Some('=')).then(|| &part[2..])
    })
}

fn utf8(data: &[u8]) -> PgWireResult<&str> {
    std::str::from_utf8(data).map_err(|_| protocol("SCRAM message is not valid UTF-8"))
}

/// The database a connection asks for. Clients that name none send the user
/// name (libpq's default); when no such database exists, that means the
/// default database, `cirro`.
fn database_for<C: ClientInfo>(
    client: &C,
    user: &str,
    catalog: &cirro_catalog::CatalogState,
) -> String {
    match client.metadata().get(METADATA_DATABASE) {
        Some(db) if db.is_empty() => DEFAULT_DATABASE.to_string(),
        Some(db) if db == user && !catalog.databases.contains_key(db) => {
            DEFAULT_DATABASE.to_string()
        }
        Some(db) => db.clone(),
        None => DEFAULT_DATABASE.to_string(),
    }
}

#[async_trait]
impl StartupHandler for ScramStartup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut state = self.state.lock().await;
        match (message, &*state) {
            (PgWireFrontendMessage::Startup(startup), AuthState::Initial) => {
                let offered = self.offer(client, &startup).await?;
                *state = offered;
            }
            (
                PgWireFrontendMessage::PasswordMessageFamily(message),
                AuthState::Offered { user },
            ) => {
                let user = user.clone();
                let sent = self.server_first(client, message, user).await?;
                *state = sent;
            }
            (
                PgWireFrontendMessage::PasswordMessageFamily(message),
                AuthState::ServerFirstSent {
                    user,
                    verifier,
                    nonce,
                    gs2_header,
                    auth_prefix,
                },
            ) => {
                client_final(
                    client,
                    message,
                    user,
                    verifier,
                    nonce,
                    gs2_header,
                    auth_prefix,
                )
                .await?;
                let user = user.clone();
                *state = AuthState::Done;
                drop(state);
                self.open_session(client, user).await?;
            }
            (PgWireFrontendMessage::Startup(_), _) => {
                return Err(protocol("startup message sent twice"));
            }
            _ => {
                return Err(protocol("unexpected message during authentication"));
            }
        }
        Ok(())
    }
}

impl ScramStartup {
    /// The startup message: the user and database must exist (and TLS be
    /// used where it is required); SCRAM-SHA-256 is offered.
    async fn offer<C>(&self, client: &mut C, startup: &Startup) -> PgWireResult<AuthState>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        protocol_negotiation(client, startup).await?;
        save_startup_parameters_to_metadata(client, startup);
        if self.shared.require_tls && !client.is_secure() {
            return Err(fatal(
                SqlState::INVALID_AUTHORIZATION,
                "this server accepts only TLS connections (sslmode=require)",
            ));
        }
        let user = client
            .metadata()
            .get(METADATA_USER)
            .cloned()
            .ok_or_else(|| fatal(SqlState::INVALID_AUTHORIZATION, "no user name given"))?;
        let snapshot = self
            .shared
            .catalog
            .refresh()
            .await
            .map_err(|e| fatal(e.state, e.message))?;
        let database = database_for(client, &user, &snapshot);
        if !snapshot.users.contains_key(&user) {
            return Err(fatal(
                SqlState::INVALID_AUTHORIZATION,
                format!("role \"{user}\" does not exist"),
            ));
        }
        if !snapshot.databases.contains_key(&database) {
            return Err(fatal(
                SqlState::INVALID_CATALOG_NAME,
                format!("database \"{database}\" does not exist"),
            ));
        }
        client.set_state(PgWireConnectionState::AuthenticationInProgress);
        client
            .send(PgWireBackendMessage::Authentication(Authentication::SASL(
                vec![MECHANISM.to_owned()],
            )))
            .await?;
        Ok(AuthState::Offered { user })
    }

    /// The client-first message: the server-first message in reply, with
    /// the user's salt and iterations.
    async fn server_first<C>(
        &self,
        client: &mut C,
        message: PasswordMessageFamily,
        user: String,
    ) -> PgWireResult<AuthState>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let initial = message
            .into_sasl_initial_response()
            .map_err(|_| protocol("expected a SASLInitialResponse"))?;
        if initial.auth_method != MECHANISM {
            return Err(protocol(format!(
                "SASL mechanism {} is not supported (use {MECHANISM})",
                initial.auth_method
            )));
        }
        let data = initial
            .data
            .ok_or_else(|| protocol("empty SCRAM client-first message"))?;
        let client_first = utf8(&data)?;
        // gs2-header: "n,," (no channel binding) or "y,,"; the bare
        // message follows the second comma.
        let mut parts = client_first.splitn(3, ',');
        let (Some(flag), Some(_authzid), Some(bare)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(protocol("malformed SCRAM client-first message"));
        };
        if flag.starts_with('p') {
            return Err(protocol(
                "SCRAM channel binding is not supported (use SCRAM-SHA-256)",
            ));
        }
        if flag != "n" && flag != "y" {
            return Err(protocol("malformed SCRAM gs2 header"));
        }
        let gs2_header = &client_first[..client_first.len() - bare.len()];
        let client_nonce = attribute(bare, 'r')
            .filter(|n| !n.is_empty())
            .ok_or_else(|| protocol("SCRAM client-first message has no nonce"))?;
        let snapshot = self.shared.catalog.snapshot();
        let entry = snapshot
            .users
            .get(&user)
            .ok_or_else(|| password_failed(&user))?;
        let verifier = ScramVerifier::parse(&entry.verifier).map_err(|_| password_failed(&user))?;
        let server_nonce = STANDARD.encode(rand::random::<[u8; 18]>());
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&verifier.salt),
            verifier.iterations
        );
        client
            .send(PgWireBackendMessage::Authentication(
                Authentication::SASLContinue(server_first.clone().into_bytes().into()),
            ))
            .await?;
        Ok(AuthState::ServerFirstSent {
            user,
            verifier,
            nonce,
            gs2_header: gs2_header.to_owned(),
            auth_prefix: format!("{bare},{server_first}"),
        })
    }
}

/// The client-final message: the proof checked against the verifier, the
/// server's signature sent.
async fn client_final<C>(
    client: &mut C,
    message: PasswordMessageFamily,
    user: &str,
    verifier: &ScramVerifier,
    nonce: &str,
    gs2_header: &str,
    auth_prefix: &str,
) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let response = message
        .into_sasl_response()
        .map_err(|_| protocol("expected a SASLResponse"))?;
    let client_final = utf8(&response.data)?;
    let without_proof = client_final
        .rsplit_once(",p=")
        .map(|(head, _)| head)
        .ok_or_else(|| protocol("SCRAM client-final message has no proof"))?;
    let proof = attribute(client_final, 'p')
        .and_then(|p| STANDARD.decode(p).ok())
        .ok_or_else(|| protocol("malformed SCRAM proof"))?;
    let binding = attribute(client_final, 'c').unwrap_or_default();
    if binding != STANDARD.encode(gs2_header.as_bytes()) {
        return Err(protocol("SCRAM channel binding does not match"));
    }
    if attribute(client_final, 'r') != Some(nonce) {
        return Err(protocol("SCRAM nonce does not match"));
    }
    let auth_message = format!("{auth_prefix},{without_proof}");
    if !verifier.verify(auth_message.as_bytes(), &proof) {
        return Err(password_failed(user));
    }
    let signature = STANDARD.encode(verifier.server_signature(auth_message.as_bytes()));
    client
        .send(PgWireBackendMessage::Authentication(
            Authentication::SASLFinal(format!("v={signature}").into_bytes().into()),
        ))
        .await?;
    Ok(())
}

impl ScramStartup {
    async fn open_session<C>(&self, client: &mut C, user: String) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let database = database_for(client, &user, &self.shared.catalog.snapshot());
        let config = cirro_engine::EngineConfig {
            database: Some(database.clone()),
            ..self.shared.engine.clone()
        };
        let engine =
            Engine::with_catalog(Arc::clone(&self.shared.catalog), config, Some(user.clone()));
        let signal: Arc<dyn cirro_engine::activity::BackendSignal> = self.canceller.clone();
        let application = client
            .metadata()
            .get("application_name")
            .cloned()
            .unwrap_or_default();
        let backend = self.shared.activity.register(
            &user,
            &database,
            &application,
            Some(client.socket_addr().ip().to_string()),
            Arc::downgrade(&signal),
        );
        let pid = backend.pid;
        engine
            .attach_backend(backend)
            .map_err(|e| fatal(e.state, e.message))?;
        let session = Session::new(engine, &database, Arc::clone(&self.canceller))
            .map_err(|e| fatal(e.state, e.message))?;
        let (_, secret) = self.shared.pids.generate(client);
        client.set_pid_and_secret_key(pid, secret.clone());
        let registration = self
            .shared
            .register(pid, secret.to_bytes().to_vec(), &self.canceller);
        client.session_extensions().insert(registration);
        client.session_extensions().insert(session);
        finish_authentication(client, self.shared.parameters.as_ref()).await
    }
}
