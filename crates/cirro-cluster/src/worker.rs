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

use cirro_common::{CirroError, Result, SqlState};
use datafusion_distributed::Worker;
use tokio::net::TcpListener;

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

/// Serve `worker` on `listener` until the process ends; requests must carry
/// `secret`.
pub fn spawn_worker(listener: TcpListener, secret: &str, worker: Worker) -> Result<()> {
    let secret = Arc::new(secret.as_bytes().to_vec());
    let check = move |request: tonic::Request<()>| {
        let given = request.metadata().get(SECRET_HEADER).map(|v| v.as_bytes());
        match given {
            Some(given) if same_secret(given, &secret) => Ok(request),
            _ => Err(tonic::Status::unauthenticated(
                "this worker takes tasks only from members of its cluster (wrong or missing cluster secret)",
            )),
        }
    };
    let service =
        tonic::service::interceptor::InterceptedService::new(worker.into_worker_server(), check);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(incoming);
    tokio::spawn(async move {
        if let Err(e) = server.await {
            log::error!("the worker service stopped: {e}");
        }
    });
    Ok(())
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
