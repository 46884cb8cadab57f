//! The worker service every node runs: `datafusion-distributed`'s gRPC
//! `WorkerService` (stages of other nodes' queries run here), behind the
//! cluster secret.
//!
//! A worker executes whatever plan it is sent, reading the shared storage
//! with the node's credentials, so it must only take tasks from members of
//! its cluster: every request carries the cluster secret in
//! [`SECRET_HEADER`] (the coordinator adds it to every request), and a
//! request without it, or with another, is refused with `Unauthenticated`
//! before it reaches the worker. The secret is `--cluster-secret` (the same
//! on every node), or, when not given, one the first node stored in
//! ZooKeeper (`<path>/secret`): then whoever can read that znode is a member.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cirro_common::{CirroError, Result, SqlState};
use datafusion_distributed::Worker;
use tokio::net::TcpListener;
use tonic::codegen::http;

/// The gRPC metadata key carrying the cluster secret.
pub const SECRET_HEADER: &str = "x-cirro-cluster-secret";

/// Whether `given` is `secret`, in time independent of where they differ.
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.len() == secret.len()
        && given
            .iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// `service` behind the cluster secret: a request without `secret` in
/// [`SECRET_HEADER`], or with another, is refused with `Unauthenticated`.
pub(crate) fn protected<S>(
    secret: &str,
    service: S,
) -> tonic::service::interceptor::InterceptedService<S, SecretCheck> {
    let check = SecretCheck(Arc::new(secret.as_bytes().to_vec()));
    tonic::service::interceptor::InterceptedService::new(service, check)
}

/// The check of [`protected`].
#[derive(Clone)]
pub(crate) struct SecretCheck(Arc<Vec<u8>>);

impl tonic::service::Interceptor for SecretCheck {
    fn call(
        &mut self,
        request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        let given = request.metadata().get(SECRET_HEADER).map(|v| v.as_bytes());
        match given {
            Some(given) if same_secret(given, &self.0) => Ok(request),
            _ => Err(tonic::Status::unauthenticated(
                "this worker takes tasks only from members of its cluster (wrong or missing cluster secret)",
            )),
        }
    }
}

/// Serve `worker` on `listener` until the process ends, with the RPC
/// micro-benchmark's service beside it (see [`crate::rpc_bench`]); requests
/// must carry `secret`. Returns the count of requests in flight (a drain
/// waits for it).
pub fn spawn_worker(listener: TcpListener, secret: &str, worker: Worker) -> Result<InFlight> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let in_flight = InFlight::default();
    let server = tonic::transport::Server::builder()
        .max_frame_size(crate::distributed::H2_MAX_FRAME)
        .initial_stream_window_size(crate::distributed::H2_STREAM_WINDOW)
        .initial_connection_window_size(crate::distributed::H2_CONNECTION_WINDOW)
        .layer(CountLayer(in_flight.clone()))
        .add_service(protected(secret, worker.into_worker_server()))
        .add_service(protected(secret, crate::rpc_bench::RpcBenchService))
        .serve_with_incoming(incoming);
    tokio::spawn(async move {
        if let Err(e) = server.await {
            log::error!("the worker service stopped: {e}");
        }
    });
    Ok(in_flight)
}

/// The worker requests in flight: from their arrival until their response's
/// last byte (a task's rows stream in its response) and their request's
/// last byte, whichever is later. A task's plan comes on a request the
/// coordinator keeps open until its query ends, so a node given a task of
/// a query counts it until that query ends, even while none of its rows
/// is being asked for (a drain must not end between two of those asks).
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Held while a request is in flight.
struct InFlightGuard(InFlight);

impl InFlightGuard {
    fn new(in_flight: &InFlight) -> Self {
        in_flight.0.fetch_add(1, Ordering::SeqCst);
        Self(in_flight.clone())
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct CountLayer(InFlight);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            in_flight: self.0.clone(),
        }
    }
}

/// A service whose requests and responses each hold an [`InFlightGuard`]
/// until their body ends.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    in_flight: InFlight,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Counted<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future =
        futures::future::BoxFuture<'static, std::result::Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let guard = InFlightGuard::new(&self.in_flight);
        let request = request.map(|body| {
            tonic::body::Body::new(GuardedBody {
                body,
                _guard: InFlightGuard::new(&self.in_flight),
            })
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                tonic::body::Body::new(GuardedBody {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A request's or response's body that holds a guard until it is dropped.
struct GuardedBody {
    body: tonic::body::Body,
    _guard: InFlightGuard,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>>
    {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A new random cluster secret.
pub fn new_secret() -> String {
    let bytes: [u8; 24] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn bad_secret(why: &str) -> CirroError {
    CirroError::new(
        SqlState::INVALID_PARAMETER_VALUE,
        format!("cluster secret: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"abc"));
        assert_eq!(new_secret().len(), 48);
        assert_ne!(new_secret(), new_secret());
    }
}
