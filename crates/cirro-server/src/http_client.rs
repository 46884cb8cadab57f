//! A small HTTP/1 client for Cirro's own HTTP APIs: nodes asking each other
//! (`console::peers`) and `cirro admin`. Plain HTTP, or TLS trusting the
//! certificates of a given PEM file (a node's own chain, or `--ca-cert`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use cirro_common::{CirroError, Result, SqlState};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

/// How long a call may take unless the client is given another limit.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read.
const ANSWER_LIMIT: usize = 64 << 20;

pub(crate) struct HttpClient {
    tls: Option<TlsConnector>,
    timeout: Duration,
}

impl HttpClient {
    /// A client of plain HTTP (`ca`: None) or of TLS trusting the
    /// certificates in the PEM file `ca`.
    pub(crate) fn new(ca: Option<&str>) -> Result<Self> {
        let tls = match ca {
            Some(ca) => {
                let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
                let bad = |e: &dyn std::fmt::Display| {
                    CirroError::new(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("TLS certificate {ca}: {e}"),
                    )
                };
                let file = std::fs::File::open(ca).map_err(|e| bad(&e))?;
                let mut roots = tokio_rustls::rustls::RootCertStore::empty();
                for c in rustls_pemfile::certs(&mut std::io::BufReader::new(file)) {
                    roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
                }
                if roots.is_empty() {
                    return Err(bad(&"no certificate in the file"));
                }
                let config = tokio_rustls::rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Some(TlsConnector::from(Arc::new(config)))
            }
            None => None,
        };
        Ok(Self {
            tls,
            timeout: CALL_TIMEOUT,
        })
    }

    /// The client, its calls allowed `timeout`.
    pub(crate) fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// `method path` at `address` (`host:port`) with `headers`; the answer's
    /// status and JSON body.
    pub(crate) async fn call(
        &self,
        address: &str,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, serde_json::Value)> {
        let unreachable = |e: &dyn std::fmt::Display| {
            CirroError::new(SqlState::CONNECTION_FAILURE, format!("{address}: {e}"))
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", address);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::empty()).map_err(|e| unreachable(&e))?;
        let exchange = async {
            let socket = TcpStream::connect(address)
                .await
                .map_err(|e| unreachable(&e))?;
            let _ = socket.set_nodelay(true);
            let response = match &self.tls {
                Some(tls) => {
                    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
                    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                        .map_err(|e| unreachable(&e))?;
                    let stream = tls
                        .connect(name, socket)
                        .await
                        .map_err(|e| unreachable(&e))?;
                    send(TokioIo::new(stream), request).await
                }
                None => send(TokioIo::new(socket), request).await,
            }
            .map_err(|e| unreachable(&e))?;
            let status = response.status();
            let body = axum::body::to_bytes(Body::new(response.into_body()), ANSWER_LIMIT)
                .await
                .map_err(|e| unreachable(&e))?;
            let value = serde_json::from_slice(&body)
                .map_err(|e| unreachable(&format!("not a Cirro HTTP API ({status}, {e})")))?;
            Ok((status, value))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unreachable(&format!("no answer in {} s", self.timeout.as_secs())))?
    }
}

async fn send<IO>(
    io: IO,
    request: Request<Body>,
) -> std::result::Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender.send_request(request).await
}

/// The SQLSTATE of a refusal an API answered with (the codes its callers
/// act on; others read as a connection failure).
pub(crate) fn refusal(address: &str, answer: &serde_json::Value) -> CirroError {
    let message = answer["error"].as_str().unwrap_or("refused").to_string();
    let state = match answer["sqlstate"].as_str() {
        Some("42501") => SqlState::INSUFFICIENT_PRIVILEGE,
        Some("42704") => SqlState::UNDEFINED_OBJECT,
        Some("28000") => SqlState::INVALID_AUTHORIZATION,
        Some("28P01") => SqlState::INVALID_PASSWORD,
        Some("22023") => SqlState::INVALID_PARAMETER_VALUE,
        Some("0A000") => SqlState::FEATURE_NOT_SUPPORTED,
        _ => SqlState::CONNECTION_FAILURE,
    };
    CirroError::new(state, format!("{address}: {message}"))
}
