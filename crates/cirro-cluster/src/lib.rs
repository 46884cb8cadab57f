//! Cluster state in ZooKeeper: who is in the cluster, which catalog version
//! is current, and the cluster-wide locks (see `docs/cluster.md`).
//!
//! ```text
//! <path>/nodes/<id>          ephemeral, one per live node: its NodeInfo (JSON)
//! <path>/catalog             the current catalog version (decimal)
//! <path>/locks/<name>/…      Curator-compatible lock recipes ("catalog",
//!                            "table-<location>")
//! ```
//!
//! A node joins by registering its znode; it leaves when its ZooKeeper
//! session ends (it stops, dies, or is cut off for longer than the session
//! timeout), and a background task re-registers it when its session expired
//! but ZooKeeper can be reached again. Every statement reads the catalog
//! version (one small read, not a listing of the storage), so a table
//! created through one node is visible through every other node at once.
//! When ZooKeeper cannot be reached, reads go on (the catalog is then read
//! from the storage, where its snapshots live), and what needs a lock (DDL, users and grants, writes to tables
//! with constraints) is refused with 25006, as on a PostgreSQL standby.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
pub use cirro_catalog::coordination::local_capacity;
use cirro_catalog::{Coordination, HeldLock, NodeInfo};
use cirro_common::{CirroError, Result, SqlState};
use zookeeper_client as zk;

mod analyze;
mod codec;
mod deletion_vectors;
pub mod distributed;
pub(crate) mod dynamic_filters;
pub mod local;
mod locality;
mod placement;
pub mod rpc_bench;
pub mod worker;

/// ZooKeeper session timeout: a node that dies or is cut off leaves the
/// member list after this long.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// Longest wait for one ZooKeeper request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for a cluster lock held by another node.
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the member list is re-read even without a watch event.
const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// `zk://host:port[,host:port…][/path]`, split.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterUrl {
    /// ZooKeeper's connect string (`host:port,host:port`).
    pub servers: String,
    /// The cluster's root znode (default `/cirro`).
    pub path: String,
}

impl ClusterUrl {
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!(
                    "invalid --cluster \"{url}\": {why} (expected zk://host:port[,host:port…][/path])"
                ),
            )
        };
        let rest = url
            .strip_prefix("zk://")
            .ok_or_else(|| bad("it does not start with zk://"))?;
        let (servers, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/cirro"),
        };
        if servers.is_empty() {
            return Err(bad("no ZooKeeper server"));
        }
        for server in servers.split(',') {
            let port = server.rsplit_once(':').map(|(_, p)| p);
            if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
                return Err(bad(&format!("\"{server}\" is not host:port")));
            }
        }
        let path = path.trim_end_matches('/');
        if path.is_empty() || path.contains("//") {
            return Err(bad("the path must be like /name"));
        }
        Ok(Self {
            servers: servers.to_string(),
            path: path.to_string(),
        })
    }
}

/// A node's membership in a cluster (see the crate docs).
#[derive(Debug)]
pub struct ZkCluster {
    url: ClusterUrl,
    /// The current session (replaced when one expires).
    client: Mutex<Option<zk::Client>>,
    me: Mutex<NodeInfo>,
    nodes: RwLock<Vec<NodeInfo>>,
    /// Set when the node leaves: the background task stops re-registering.
    leaving: std::sync::atomic::AtomicBool,
}

fn unreachable(url: &ClusterUrl, what: &str, e: impl std::fmt::Display) -> CirroError {
    CirroError::new(
        SqlState::CONNECTION_FAILURE,
        format!(
            "{what}: ZooKeeper at {} cannot be reached ({e})",
            url.servers
        ),
    )
}

fn zk_error(what: &str, e: zk::Error) -> CirroError {
    CirroError::new(SqlState::IO_ERROR, format!("{what}: ZooKeeper: {e}"))
}

async fn within<T>(
    url: &ClusterUrl,
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, zk::Error>>,
) -> Result<std::result::Result<T, zk::Error>> {
    tokio::time::timeout(REQUEST_TIMEOUT, f)
        .await
        .map_err(|_| unreachable(url, what, "no answer in 3 s"))
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

impl ZkCluster {
    /// Join the cluster at `url` as `me`, serving the data location `data`:
    /// connect, refuse if the cluster serves another data location, if a
    /// member runs another Cirro version or already uses `me.id`; register,
    /// and start following the member list.
    pub async fn join(url: &str, data: &str, me: NodeInfo) -> Result<Arc<Self>> {
        let url = ClusterUrl::parse(url)?;
        let cluster = Arc::new(Self {
            url,
            client: Mutex::new(None),
            me: Mutex::new(me),
            nodes: RwLock::new(Vec::new()),
            leaving: Default::default(),
        });
        let client = cluster.connect().await?;
        for dir in ["nodes", "locks"] {
            let path = cluster.path(dir);
            match within(
                &cluster.url,
                "create the cluster's znodes",
                client.mkdir(&path, &persistent()),
            )
            .await?
            {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(zk_error(&format!("create {path}"), e)),
            }
        }
        cluster.check_data_location(&client, data).await?;
        let me = cluster.me();
        for node in cluster.read_nodes(&client).await? {
            if node.version != me.version && node.id != me.id {
                return Err(CirroError::new(
                    SqlState::CANNOT_CONNECT_NOW,
                    format!(
                        "node \"{}\" of the cluster runs Cirro {} and this node runs {}: \
                         nodes of different versions do not work together; \
                         run one version on every node",
                        node.id, node.version, me.version
                    ),
                ));
            }
        }
        cluster.register(&client).await?;
        *cluster.nodes.write().unwrap_or_else(|e| e.into_inner()) =
            cluster.read_nodes(&client).await?;
        let weak = Arc::downgrade(&cluster);
        tokio::spawn(follow(weak));
        Ok(cluster)
    }

    /// The cluster's znodes hold one data location's catalog version: the
    /// first node records its `--data`; a node with another is refused
    /// (its catalog versions would be mixed up with the other's).
    async fn check_data_location(&self, client: &zk::Client, data: &str) -> Result<()> {
        let recorded = self
            .create_or_read(client, "data", data, "record the data location")
            .await?;
        if recorded != data {
            return Err(CirroError::new(
                SqlState::CANNOT_CONNECT_NOW,
                format!(
                    "the cluster at zk://{}{} serves the data location {recorded}, not {data}: \
                     give every node the same --data, or this one another cluster path",
                    self.url.servers, self.url.path
                ),
            ));
        }
        Ok(())
    }

    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.url.path)
    }

    /// This node, as registered.
    pub fn me(&self) -> NodeInfo {
        self.me.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn my_path(&self) -> String {
        self.path(&format!("nodes/{}", self.me().id))
    }

    async fn connect(&self) -> Result<zk::Client> {
        let connect = zk::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .with_connection_timeout(REQUEST_TIMEOUT)
            .connect(&self.url.servers);
        let client = tokio::time::timeout(REQUEST_TIMEOUT * 2, connect)
            .await
            .map_err(|_| unreachable(&self.url, "cannot join the cluster", "no answer"))?
            .map_err(|e| unreachable(&self.url, "cannot join the cluster", e))?;
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
        Ok(client)
    }

    /// The session, if it is connected now (requests would wait otherwise).
    fn connected(&self, what: &str) -> Result<zk::Client> {
        let client = self
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match client {
            Some(c) if matches!(c.state(), zk::SessionState::SyncConnected) => Ok(c),
            Some(c) => Err(unreachable(
                &self.url,
                what,
                format!("session {}", c.state()),
            )),
            None => Err(unreachable(&self.url, what, "not connected")),
        }
    }

    /// Create this node's ephemeral znode. A znode of the same name left by
    /// this node's previous life (a restart within the session timeout)
    /// disappears when that session expires: wait for it.
    /// Claim a node number: an ephemeral `numbers/<n>` znode, the number
    /// held before if it is still free (pids and query ids handed out carry
    /// it), else the smallest free one.
    async fn claim_number(&self, client: &zk::Client) -> Result<()> {
        let dir = self.path("numbers");
        match within(
            &self.url,
            "create the cluster's znodes",
            client.mkdir(&dir, &persistent()),
        )
        .await?
        {
            Ok(()) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(zk_error(&format!("create {dir}"), e)),
        }
        let me = self.me();
        let held = me.number;
        let candidates = std::iter::once(held)
            .filter(|&n| n > 0)
            .chain(1..=cirro_catalog::coordination::NODE_NUMBER_MAX);
        for n in candidates {
            let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
            let path = format!("{dir}/{n}");
            match within(
                &self.url,
                "claim a node number",
                client.create(&path, me.id.as_bytes(), &ephemeral),
            )
            .await?
            {
                Ok(_) => {
                    if held > 0 && n != held {
                        // Rejoined after another node took its number: new
                        // statements still carry the old one.
                        log::warn!("node number {held} was taken while away; holding {n}");
                    } else {
                        self.me.lock().unwrap_or_else(|e| e.into_inner()).number = n;
                    }
                    return Ok(());
                }
                Err(zk::Error::NodeExists) => continue,
                Err(e) => return Err(zk_error("claim a node number", e)),
            }
        }
        Err(CirroError::new(
            SqlState::CANNOT_CONNECT_NOW,
            format!(
                "the cluster has {} nodes, the most it can number",
                cirro_catalog::coordination::NODE_NUMBER_MAX
            ),
        ))
    }

    async fn register(&self, client: &zk::Client) -> Result<()> {
        self.claim_number(client).await?;
        let path = self.my_path();
        let body = serde_json::to_vec(&self.me())?;
        let deadline = tokio::time::Instant::now() + SESSION_TIMEOUT * 2;
        loop {
            let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
            match within(
                &self.url,
                "register the node",
                client.create(&path, &body, &ephemeral),
            )
            .await?
            {
                Ok(_) => return Ok(()),
                Err(zk::Error::NodeExists) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(zk::Error::NodeExists) => {
                    return Err(CirroError::new(
                        SqlState::CANNOT_CONNECT_NOW,
                        format!(
                            "a node named \"{}\" is already in the cluster; give this one another --node-id",
                            self.me().id
                        ),
                    ));
                }
                Err(e) => return Err(zk_error("register the node", e)),
            }
        }
    }

    async fn read_nodes(&self, client: &zk::Client) -> Result<Vec<NodeInfo>> {
        let dir = self.path("nodes");
        let children = match within(&self.url, "list the nodes", client.list_children(&dir)).await?
        {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error("list the nodes", e)),
        };
        let mut nodes = Vec::new();
        for child in children {
            let path = format!("{dir}/{child}");
            match within(&self.url, "read a node", client.get_data(&path)).await? {
                Ok((data, _)) => match serde_json::from_slice::<NodeInfo>(&data) {
                    Ok(node) => nodes.push(node),
                    Err(e) => log::warn!("ignoring cluster member {child}: {e}"),
                },
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(zk_error("read a node", e)),
            }
        }
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(nodes)
    }

    /// Change this node's registration (its state, its running queries).
    pub async fn update_me(&self, change: impl FnOnce(&mut NodeInfo)) -> Result<()> {
        let me = {
            let mut me = self.me.lock().unwrap_or_else(|e| e.into_inner());
            change(&mut me);
            me.clone()
        };
        let client = self.connected("update the node")?;
        let body = serde_json::to_vec(&me)?;
        within(
            &self.url,
            "update the node",
            client.set_data(&self.my_path(), &body, None),
        )
        .await?
        .map_err(|e| zk_error("update the node", e))?;
        // This node sees its own change at once (the others when their
        // watch on the registrations fires).
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = nodes.iter_mut().find(|n| n.id == me.id) {
            *entry = me;
        }
        Ok(())
    }

    /// Leave the cluster: delete this node's znode and end the session.
    pub async fn leave(&self) {
        self.leaving
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(client) = self.connected("leave") {
            let _ = within(&self.url, "leave", client.delete(&self.my_path(), None)).await;
        }
        self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The cluster secret workers require (see [`worker`]): `given` (every
    /// node must be given the same), else the one stored in ZooKeeper,
    /// created by the first node that needs it.
    pub async fn cluster_secret(&self, given: Option<String>) -> Result<String> {
        if let Some(secret) = given {
            if secret.len() < 16 {
                return Err(worker::bad_secret("give at least 16 characters"));
            }
            return Ok(secret);
        }
        let client = self.connected("read the cluster secret")?;
        self.create_or_read(
            &client,
            "secret",
            &worker::new_secret(),
            "the cluster secret",
        )
        .await
    }

    /// The value of the persistent znode `name`, created with `value` if it
    /// does not exist yet (the first node to ask sets it for all).
    async fn create_or_read(
        &self,
        client: &zk::Client,
        name: &str,
        value: &str,
        what: &str,
    ) -> Result<String> {
        let path = self.path(name);
        let create = client.create(&path, value.as_bytes(), &persistent());
        match within(&self.url, what, create).await? {
            Ok(_) => return Ok(value.to_string()),
            Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(zk_error(what, e)),
        }
        let (stored, _) = within(&self.url, what, client.get_data(&path))
            .await?
            .map_err(|e| zk_error(what, e))?;
        String::from_utf8(stored)
            .map_err(|_| CirroError::internal(format!("{what}: the znode {path} is not text")))
    }

    /// The ZooKeeper servers (for messages).
    pub fn servers(&self) -> &str {
        &self.url.servers
    }
}

/// Follow the member list and keep the registration alive: re-read the
/// list on every change (and every few seconds), reconnect and re-register
/// after the session expired. Ends when the node leaves or is dropped.
async fn follow(weak: Weak<ZkCluster>) {
    loop {
        let Some(cluster) = weak.upgrade() else {
            return;
        };
        if cluster.leaving.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let client = cluster
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let client = match client {
            Some(c) if !c.state().is_terminated() => c,
            _ => {
                // The session expired (cut off too long) or never came back:
                // a new session, and the node registers again.
                match cluster.connect().await {
                    Ok(c) => match cluster.register(&c).await {
                        Ok(()) => {
                            log::info!("rejoined the cluster at {}", cluster.url.servers);
                            c
                        }
                        Err(e) => {
                            log::warn!("cannot rejoin the cluster: {e}");
                            drop(cluster);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    },
                    Err(_) => {
                        drop(cluster);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
            }
        };
        // A persistent recursive watch fires on members coming and going
        // and on a member's registration changing (draining, queries), so
        // every node sees either at once; set before the read, so nothing
        // falls between.
        let dir = cluster.path("nodes");
        let watch = within(
            &cluster.url,
            "watch the nodes",
            client.watch(&dir, zk::AddWatchMode::PersistentRecursive),
        )
        .await;
        let mut watcher = match watch {
            Ok(Ok(watcher)) => Some(watcher),
            _ => None,
        };
        if let Ok(nodes) = cluster.read_nodes(&client).await {
            *cluster.nodes.write().unwrap_or_else(|e| e.into_inner()) = nodes;
        }
        let mut state = client.state_watcher();
        drop(cluster);
        match watcher.as_mut() {
            Some(watcher) => {
                tokio::select! {
                    _ = watcher.changed() => {}
                    _ = state.changed() => {}
                    _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
                }
            }
            None => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// A held ZooKeeper lock; dropping it deletes its znode (in the background).
struct ZkLock(#[allow(dead_code)] zk::OwnedLockClient);

#[async_trait]
impl Coordination for ZkCluster {
    async fn catalog_version(&self) -> Result<Option<u64>> {
        let client = self.connected("read the catalog version")?;
        match within(
            &self.url,
            "read the catalog version",
            client.get_data(&self.path("catalog")),
        )
        .await?
        {
            Ok((data, _)) => {
                let text = String::from_utf8_lossy(&data);
                text.trim().parse().map(Some).map_err(|_| {
                    CirroError::internal(format!("the cluster's catalog version is \"{text}\""))
                })
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error("read the catalog version", e)),
        }
    }

    async fn publish_catalog_version(&self, version: u64) -> Result<()> {
        let client = self.connected("publish the catalog version")?;
        let path = self.path("catalog");
        let body = version.to_string();
        for _ in 0..16 {
            let what = "publish the catalog version";
            match within(&self.url, what, client.get_data(&path)).await? {
                Ok((data, stat)) => {
                    let current: u64 = String::from_utf8_lossy(&data).trim().parse().unwrap_or(0);
                    if current >= version {
                        return Ok(());
                    }
                    match within(
                        &self.url,
                        what,
                        client.set_data(&path, body.as_bytes(), Some(stat.version)),
                    )
                    .await?
                    {
                        Ok(_) => return Ok(()),
                        Err(zk::Error::BadVersion) => continue,
                        Err(e) => return Err(zk_error(what, e)),
                    }
                }
                Err(zk::Error::NoNode) => {
                    match within(
                        &self.url,
                        what,
                        client.create(&path, body.as_bytes(), &persistent()),
                    )
                    .await?
                    {
                        Ok(_) => return Ok(()),
                        Err(zk::Error::NodeExists) => continue,
                        Err(e) => return Err(zk_error(what, e)),
                    }
                }
                Err(e) => return Err(zk_error(what, e)),
            }
        }
        Err(CirroError::new(
            SqlState::SERIALIZATION_FAILURE,
            "the catalog version is changing too fast; try again",
        ))
    }

    async fn lock(&self, name: &str) -> Result<HeldLock> {
        let refused = |e: CirroError| {
            CirroError::new(
                SqlState::READ_ONLY_SQL_TRANSACTION,
                format!(
                    "cannot take the cluster's lock \"{name}\": {}; until it is back this node \
                     serves reads (the catalog read from the shared storage) and refuses DDL, \
                     user and grant changes and writes to tables with constraints",
                    e.message
                ),
            )
        };
        let client = self.connected("the session").map_err(refused)?;
        let dir = self.path(&format!("locks/{name}"));
        let id = self.me().id;
        let take = async {
            let prefix = zk::LockPrefix::new_curator(&dir, "lock-")?;
            let options =
                zk::LockOptions::new(zk::Acls::anyone_all()).with_ancestor_options(persistent())?;
            let held = client.lock(prefix, id.as_bytes(), options).await?;
            Ok::<_, zk::Error>(held.into_owned())
        };
        match tokio::time::timeout(LOCK_TIMEOUT, take).await {
            Ok(Ok(held)) => Ok(Box::new(ZkLock(held))),
            Ok(Err(e)) => Err(refused(zk_error("lock", e))),
            Err(_) => Err(CirroError::new(
                SqlState::LOCK_NOT_AVAILABLE,
                format!("the cluster's lock \"{name}\" was not free within 60 s"),
            )),
        }
    }

    fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn node_id(&self) -> String {
        self.me().id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_urls() {
        let url = ClusterUrl::parse("zk://127.0.0.1:2181").expect("plain");
        assert_eq!(url.servers, "127.0.0.1:2181");
        assert_eq!(url.path, "/cirro");
        let url = ClusterUrl::parse("zk://a:1,b:2/prod/cirro/").expect("path");
        assert_eq!(url.servers, "a:1,b:2");
        assert_eq!(url.path, "/prod/cirro");
        for bad in [
            "127.0.0.1:2181",
            "zk://",
            "zk://host/x",
            "zk://h:1//x",
            "zk://h:99999",
        ] {
            let err = ClusterUrl::parse(bad).expect_err(bad);
            assert_eq!(err.state, SqlState::INVALID_PARAMETER_VALUE, "{bad}");
        }
    }
}
