//! Requests to the other nodes' HTTP APIs (`/internal/…`), proved with the
//! cluster secret: the cluster-wide lists of statements and of the nodes'
//! hot-data tiers, and cancels of statements that run elsewhere. Over TLS when this node's console uses
//! TLS, trusting the certificates of this node's own chain (the nodes of a
//! cluster share a certificate or its issuer).

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use cirro_common::{CirroError, Result, SqlState};

use crate::http_client::{HttpClient, refusal};

pub(crate) struct Peers {
    client: HttpClient,
    secret: Option<String>,
}

impl Peers {
    pub(crate) fn new(cert: Option<&str>, secret: Option<String>) -> Result<Self> {
        Ok(Self {
            client: HttpClient::new(cert)?,
            secret,
        })
    }

    /// `method path` on the node whose console is at `address` (`host:port`)
    /// for `user`; the answer's status and JSON body.
    pub(crate) async fn call(
        &self,
        address: &str,
        method: Method,
        path: &str,
        user: Option<&str>,
    ) -> Result<(StatusCode, serde_json::Value)> {
        let Some(secret) = &self.secret else {
            return Err(CirroError::new(
                SqlState::CONNECTION_FAILURE,
                format!("node at {address}: no cluster secret"),
            ));
        };
        let mut headers = vec![(super::SECRET_HEADER, secret.as_str())];
        if let Some(user) = user {
            headers.push((super::api::USER_HEADER, user));
        }
        self.client.call(address, method, path, &headers).await
    }
}

/// The other nodes' registries through their HTTP APIs (see
/// [`cirro_engine::activity::ClusterActivity`]).
pub(crate) struct ClusterPeers {
    pub cluster: Arc<cirro_cluster::ZkCluster>,
    pub peers: Peers,
}

impl ClusterPeers {
    /// The console address of node number `number`.
    fn address_of(&self, number: u32) -> Result<String> {
        let me = self.cluster.me();
        cirro_catalog::Coordination::nodes(self.cluster.as_ref())
            .into_iter()
            .find(|n| n.number == number && n.id != me.id)
            .filter(|n| !n.http.is_empty())
            .map(|n| n.http)
            .ok_or_else(|| {
                CirroError::new(
                    SqlState::UNDEFINED_OBJECT,
                    format!("no live node numbered {number} serves an HTTP API"),
                )
            })
    }

    /// POST `path` to node `number` for `user`; the answer's `done`.
    async fn act(&self, number: u32, path: &str, user: Option<&str>) -> Result<bool> {
        let address = self.address_of(number)?;
        let (status, answer) = self.peers.call(&address, Method::POST, path, user).await?;
        if status.is_success() {
            return Ok(answer["done"].as_bool().unwrap_or(false));
        }
        Err(refusal(&format!("node at {address}"), &answer))
    }
}

impl ClusterPeers {
    /// GET `path` from every other live node: their JSON lists, together
    /// (a node that does not answer is left out with a warning naming
    /// `what`: a dead node runs nothing and holds nothing).
    async fn gather<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Vec<T> {
        let me = self.cluster.me();
        let others: Vec<_> = cirro_catalog::Coordination::nodes(self.cluster.as_ref())
            .into_iter()
            .filter(|n| n.id != me.id && !n.http.is_empty())
            .collect();
        let answers = futures::future::join_all(others.iter().map(|node| async move {
            let answer = self
                .peers
                .call(&node.http, Method::GET, path, None)
                .await
                .and_then(|(status, body)| {
                    if !status.is_success() {
                        return Err(CirroError::new(
                            SqlState::CONNECTION_FAILURE,
                            format!("node {}: {status}: {body}", node.id),
                        ));
                    }
                    serde_json::from_value::<Vec<T>>(body)
                        .map_err(|e| CirroError::internal(format!("node {}: {e}", node.id)))
                });
            (node, answer)
        }))
        .await;
        let mut all = Vec::new();
        for (node, answer) in answers {
            match answer {
                Ok(list) => all.extend(list),
                Err(e) => log::warn!("{what} of node {} left out: {}", node.id, e.message),
            }
        }
        all
    }
}

#[async_trait::async_trait]
impl cirro_engine::activity::ClusterActivity for ClusterPeers {
    async fn queries(&self, plans: bool) -> Vec<cirro_engine::activity::QueryView> {
        let path = if plans {
            "/internal/queries"
        } else {
            "/internal/queries?plans=false"
        };
        self.gather(path, "statements").await
    }

    async fn cache(&self) -> Vec<cirro_engine::system::CacheRow> {
        self.gather("/internal/cache", "the cache").await
    }

    async fn cancel_query(&self, node: u32, id: i64, user: Option<&str>) -> Result<bool> {
        self.act(node, &format!("/internal/queries/{id}/cancel"), user)
            .await
    }

    async fn signal(
        &self,
        node: u32,
        pid: i32,
        user: Option<&str>,
        terminate: bool,
    ) -> Result<bool> {
        let signal = if terminate { "terminate" } else { "cancel" };
        self.act(node, &format!("/internal/backends/{pid}/{signal}"), user)
            .await
    }
}
