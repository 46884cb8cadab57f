//! `cirro admin`: a node's HTTP API from the command line — status, nodes,
//! statements, cancel — with a user's password (HTTP Basic), as the
//! console's user would see and do.

use axum::http::Method;
use base64::Engine as _;
use cirro_common::{CirroError, Result, SqlState};

use crate::http_client::{HttpClient, refusal};

/// Where and as whom `cirro admin` speaks.
#[derive(Clone, Debug)]
pub struct AdminTarget {
    /// `http://host:port` or `https://host:port` of any node's console.
    pub url: String,
    pub user: String,
    pub password: String,
    /// For https: the PEM file of the certificates to trust.
    pub ca_cert: Option<String>,
}

/// What `cirro admin` asks.
#[derive(Clone, Debug)]
pub enum AdminCall {
    Status,
    Nodes,
    Queries,
    Cancel(i64),
    /// The worker RPC micro-benchmark from the node (message sizes in
    /// bytes; none: the default ones).
    RpcBench(Vec<usize>),
}

/// Ask the node; its JSON answer.
pub async fn admin(target: &AdminTarget, call: AdminCall) -> Result<serde_json::Value> {
    let url = url::Url::parse(&target.url).map_err(|e| {
        CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("--url {}: {e}", target.url),
        )
    })?;
    let tls = match url.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("--url: http:// or https://, not {other}://"),
            ));
        }
    };
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port_or_known_default().unwrap_or(8080);
    let address = format!("{host}:{port}");
    if tls && target.ca_cert.is_none() {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "an https:// URL needs --ca-cert (the server's certificate or its issuer's)",
        ));
    }
    let mut client = HttpClient::new(if tls { target.ca_cert.as_deref() } else { None })?;
    if matches!(call, AdminCall::RpcBench(_)) {
        // Seconds per size and node.
        client = client.with_timeout(std::time::Duration::from_secs(900));
    }
    let credentials = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", target.user, target.password));
    let authorization = format!("Basic {credentials}");
    let (method, path) = match call {
        AdminCall::Status => (Method::GET, "/api/status".to_string()),
        AdminCall::Nodes => (Method::GET, "/api/nodes".to_string()),
        AdminCall::Queries => (Method::GET, "/api/queries".to_string()),
        AdminCall::Cancel(id) => (Method::POST, format!("/api/queries/{id}/cancel")),
        AdminCall::RpcBench(sizes) if sizes.is_empty() => (Method::POST, "/api/rpc-bench".into()),
        AdminCall::RpcBench(sizes) => {
            let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
            (
                Method::POST,
                format!("/api/rpc-bench?sizes={}", list.join(",")),
            )
        }
    };
    let headers = [
        ("authorization", authorization.as_str()),
        ("x-cirro-console", "admin"),
    ];
    let (status, answer) = client.call(&address, method, &path, &headers).await?;
    if !status.is_success() {
        return Err(refusal(&address, &answer));
    }
    Ok(answer)
}
