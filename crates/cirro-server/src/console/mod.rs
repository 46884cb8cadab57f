//! The web console and HTTP API of a node (`--http-port`), behind the same
//! logins as SQL.
//!
//! ```text
//!  TCP (TLS with the server's certificate when it has one) ─► hyper HTTP/1
//!    ─► axum router
//!       GET  /login, POST /login ─► password against the catalog's verifier
//!                                  ─► session cookie (HttpOnly, SameSite=Strict)
//!       GET  /                   ─► the console page, or a redirect to /login
//!       GET  /api/…, /metrics    ─► JSON / Prometheus text, for the cookie's
//!                                   user or HTTP Basic credentials
//!       POST /api/queries/ID/cancel ─► the same check as CANCEL QUERY
//!       POST /api/rpc-bench      ─► a superuser's RPC micro-benchmark of
//!                                   the links to the other nodes' workers
//!       GET  /internal/…         ─► other nodes (the cluster secret)
//! ```
//!
//! Every action runs as the logged-in user with the checks SQL makes: the
//! storage view lists the tables the user may SELECT from, a cancel is
//! refused (42501) for another user's statement unless a superuser asks.
//! POSTs also need the `x-cirro-console` header, which a page of another
//! site cannot send without the browser asking this server first (CORS).

mod api;
pub(crate) mod monitor;
pub(crate) mod peers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use axum::routing::{get, post};
use base64::Engine as _;
use cirro_common::{CirroError, Result, SqlState};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::Shared;
use monitor::Monitor;

/// The session cookie's name.
const COOKIE: &str = "cirro_session";
/// A console login ends after this long without a request.
const LOGIN_IDLE: Duration = Duration::from_secs(8 * 3600);
/// The header a POST must carry (see the module docs).
const ACTION_HEADER: &str = "x-cirro-console";
/// The header other nodes prove themselves with.
pub(crate) const SECRET_HEADER: &str = "x-cirro-cluster-secret";
/// Largest request body read (a login form).
const BODY_LIMIT: usize = 16 * 1024;

const LOGIN_HTML: &str = include_str!("assets/login.html");
const CONSOLE_HTML: &str = include_str!("assets/console.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

struct Login {
    user: String,
    last_used: Instant,
}

/// What the console serves from.
pub(crate) struct Console {
    shared: Arc<Shared>,
    monitor: Arc<Monitor>,
    cluster: Option<Arc<cirro_cluster::ZkCluster>>,
    secret: Option<String>,
    /// This node's name (`local` on a single node).
    node: String,
    /// Whether the console runs over TLS (cookies are then `Secure`).
    tls: bool,
    logins: Mutex<HashMap<String, Login>>,
}

/// How the console is set up.
pub(crate) struct ConsoleSetup {
    pub listener: TcpListener,
    pub tls: Option<TlsAcceptor>,
    pub cluster: Option<Arc<cirro_cluster::ZkCluster>>,
    pub secret: Option<String>,
    pub monitor: Arc<Monitor>,
}

/// Serve the console on `setup.listener` until the process ends.
pub(crate) fn spawn(shared: Arc<Shared>, setup: ConsoleSetup) -> Result<()> {
    let node = setup.cluster.as_ref().map_or_else(
        || "local".to_string(),
        |c| cirro_catalog::Coordination::node_id(c.as_ref()).to_string(),
    );
    let console = Arc::new(Console {
        shared,
        monitor: setup.monitor,
        cluster: setup.cluster,
        secret: setup.secret,
        node,
        tls: setup.tls.is_some(),
        logins: Mutex::new(HashMap::new()),
    });
    let router = router(Arc::clone(&console));
    let listener = setup.listener;
    let tls = setup.tls;
    tokio::spawn(async move {
        loop {
            let (socket, peer) = match listener.accept().await {
                Ok(pair) => pair,
                Err(e) => {
                    log::warn!("console accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = socket.set_nodelay(true);
            let service = hyper_util::service::TowerToHyperService::new(router.clone());
            let tls = tls.clone();
            tokio::spawn(async move {
                let http = hyper::server::conn::http1::Builder::new();
                let served = match tls {
                    Some(tls) => {
                        match tokio::time::timeout(LOGIN_TIMEOUT, tls.accept(socket)).await {
                            Ok(Ok(stream)) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Ok(Err(e)) => {
                                log::debug!("console {peer}: TLS: {e}");
                                return;
                            }
                            Err(_) => return,
                        }
                    }
                    None => http.serve_connection(TokioIo::new(socket), service).await,
                };
                if let Err(e) = served {
                    log::debug!("console {peer}: {e}");
                }
            });
        }
    });
    Ok(())
}

/// How long a TLS handshake may take.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);

fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/console.js", get(|| asset(CONSOLE_JS, "text/javascript")))
        .route("/console.css", get(|| asset(CONSOLE_CSS, "text/css")))
        .route("/api/status", get(api::status))
        .route("/api/nodes", get(api::nodes))
        .route("/api/queries", get(api::queries))
        .route("/api/queries/{id}", get(api::query))
        .route("/api/queries/{id}/cancel", post(api::cancel))
        .route("/api/rpc-bench", post(api::rpc_bench))
        .route("/api/tables", get(api::tables))
        .route("/api/history", get(api::history))
        .route("/metrics", get(api::metrics))
        .route("/internal/queries", get(api::internal_queries))
        .route("/internal/cache", get(api::internal_cache))
        .route("/internal/queries/{id}/cancel", post(api::internal_cancel))
        .route(
            "/internal/backends/{pid}/{signal}",
            post(api::internal_signal),
        )
        .fallback(|| async { error(StatusCode::NOT_FOUND, "42704", "no such page") })
        .with_state(console)
}

async fn asset(body: &'static str, kind: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    set(&mut response, header::CONTENT_TYPE, kind);
    response
}

fn set(response: &mut Response<Body>, name: header::HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// A page of the console (no caching: it shows the user's data).
fn html(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    set(
        &mut response,
        header::CONTENT_TYPE,
        "text/html; charset=utf-8",
    );
    set(&mut response, header::CACHE_CONTROL, "no-store");
    set(&mut response, header::X_FRAME_OPTIONS, "DENY");
    set(
        &mut response,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:",
    );
    response
}

fn redirect(to: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    set(&mut response, header::LOCATION, to);
    set(&mut response, header::CACHE_CONTROL, "no-store");
    response
}

/// A JSON answer.
pub(crate) fn json(value: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(value.to_string()));
    set(&mut response, header::CONTENT_TYPE, "application/json");
    set(&mut response, header::CACHE_CONTROL, "no-store");
    response
}

/// A refusal or failure, as JSON with its SQLSTATE.
pub(crate) fn error(status: StatusCode, sqlstate: &str, message: &str) -> Response<Body> {
    let mut response = json(&serde_json::json!({ "error": message, "sqlstate": sqlstate }));
    *response.status_mut() = status;
    response
}

/// A Cirro error as an HTTP answer: the status nearest its SQLSTATE.
pub(crate) fn failure(e: &CirroError) -> Response<Body> {
    let status = match e.state.0 {
        s if s.starts_with("28") => StatusCode::UNAUTHORIZED,
        "42501" => StatusCode::FORBIDDEN,
        "42704" | "42P01" => StatusCode::NOT_FOUND,
        s if s.starts_with("22") || s.starts_with("42") => StatusCode::BAD_REQUEST,
        s if s.starts_with("57") || s.starts_with("08") => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.state.0, &e.message)
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// Who the caller is (see [`Console::caller`]).
pub(crate) enum Caller {
    User(String),
    /// Another node of the cluster (the cluster secret).
    Node,
}

impl Console {
    /// The user of a console login cookie, if it is live.
    fn login_user(&self, headers: &HeaderMap) -> Option<String> {
        let token = cookie(headers, COOKIE)?;
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        logins.retain(|_, l| l.last_used.elapsed() < LOGIN_IDLE);
        let login = logins.get_mut(&token)?;
        // A dropped user's logins end with it.
        if !self
            .shared
            .catalog
            .snapshot()
            .users
            .contains_key(&login.user)
        {
            logins.remove(&token);
            return None;
        }
        login.last_used = Instant::now();
        Some(login.user.clone())
    }

    /// The caller of an API request: the console login's user, the user of
    /// HTTP Basic credentials (`cirro admin`, Prometheus), or another node.
    /// Refused with 28000/28P01 as JSON.
    pub(crate) async fn caller(
        &self,
        headers: &HeaderMap,
    ) -> std::result::Result<Caller, Response<Body>> {
        if let Some(user) = self.login_user(headers) {
            return Ok(Caller::User(user));
        }
        if let (Some(secret), Some(given)) = (&self.secret, headers.get(SECRET_HEADER))
            && constant_time_eq(secret.as_bytes(), given.as_bytes())
        {
            return Ok(Caller::Node);
        }
        let basic = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok());
        let Some((user, password)) = basic.as_deref().and_then(|b| b.split_once(':')) else {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                SqlState::INVALID_AUTHORIZATION.0,
                "log in first (a console session, or HTTP Basic credentials)",
            ));
        };
        match self.shared.check_password(user, password).await {
            Ok(()) => Ok(Caller::User(user.to_string())),
            Err(e) => Err(failure(&login_refused(&e, user))),
        }
    }

    /// [`Console::caller`] for actions that change something: also the
    /// header no other site's page can send.
    pub(crate) async fn actor(
        &self,
        headers: &HeaderMap,
    ) -> std::result::Result<Caller, Response<Body>> {
        let caller = self.caller(headers).await?;
        if matches!(caller, Caller::User(_)) && !headers.contains_key(ACTION_HEADER) {
            return Err(error(
                StatusCode::FORBIDDEN,
                SqlState::INSUFFICIENT_PRIVILEGE.0,
                "console actions need the x-cirro-console header",
            ));
        }
        Ok(caller)
    }
}

/// One message for an unknown user and a wrong password (no probing of
/// user names).
fn login_refused(e: &CirroError, user: &str) -> CirroError {
    if e.state.0.starts_with("28") {
        CirroError::new(
            SqlState::INVALID_PASSWORD,
            format!("password authentication failed for user \"{user}\""),
        )
    } else {
        e.clone()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn index(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response<Body> {
    match console.login_user(&headers) {
        Some(_) => html(StatusCode::OK, CONSOLE_HTML.to_string()),
        None => redirect("/login"),
    }
}

fn login_form(message: &str) -> String {
    LOGIN_HTML.replace("{{message}}", &escape(message))
}

async fn login_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response<Body> {
    if console.login_user(&headers).is_some() {
        return redirect("/");
    }
    html(StatusCode::OK, login_form(""))
}

async fn login(State(console): State<Arc<Console>>, request: Request<Body>) -> Response<Body> {
    let body = match axum::body::to_bytes(request.into_body(), BODY_LIMIT).await {
        Ok(body) => body,
        Err(_) => {
            return html(
                StatusCode::PAYLOAD_TOO_LARGE,
                login_form("the form is too large"),
            );
        }
    };
    let mut user = String::new();
    let mut password = String::new();
    for (key, value) in url::form_urlencoded::parse(&body) {
        match key.as_ref() {
            "user" => user = value.into_owned(),
            "password" => password = value.into_owned(),
            _ => {}
        }
    }
    if let Err(e) = console.shared.check_password(&user, &password).await {
        let e = login_refused(&e, &user);
        log::info!("console login refused: {}", e.message);
        // As slow as a PBKDF2 check, whatever failed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        return html(StatusCode::UNAUTHORIZED, login_form(&e.message));
    }
    let bytes: [u8; 32] = rand::random();
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    console
        .logins
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            token.clone(),
            Login {
                user,
                last_used: Instant::now(),
            },
        );
    let mut response = redirect("/");
    let secure = if console.tls { "; Secure" } else { "" };
    set(
        &mut response,
        header::SET_COOKIE,
        &format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"),
    );
    response
}

async fn logout(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response<Body> {
    if let Some(token) = cookie(&headers, COOKIE) {
        console
            .logins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token);
    }
    let mut response = redirect("/login");
    set(
        &mut response,
        header::SET_COOKIE,
        &format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

/// Text safe inside HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_session_cookie_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; cirro_session=tok-en; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE).as_deref(), Some("tok-en"));
        assert_eq!(cookie(&HeaderMap::new(), COOKIE), None);
    }

    #[test]
    fn compares_secrets_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }

    #[test]
    fn errors_map_to_http_statuses() {
        let status = |state| failure(&CirroError::new(state, "x")).status();
        assert_eq!(
            status(SqlState::INSUFFICIENT_PRIVILEGE),
            StatusCode::FORBIDDEN
        );
        assert_eq!(status(SqlState::INVALID_PASSWORD), StatusCode::UNAUTHORIZED);
        assert_eq!(status(SqlState::UNDEFINED_OBJECT), StatusCode::NOT_FOUND);
        assert_eq!(escape("<b>\"&"), "&lt;b&gt;&quot;&amp;");
    }
}
