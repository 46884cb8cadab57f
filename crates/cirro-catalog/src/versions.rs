//! Where the catalog's versions live and which one is current: the
//! [`VersionStore`] trait, and its implementations.
//!
//! The protocol needs three things of a store: the newest version, a
//! version's bytes, and *create-if-absent* of version `n` (exactly one of
//! several writers racing for `n` wins). [`FileVersions`] keeps each version
//! as `_catalog/v<n>.json` on the data location and gets create-if-absent
//! from the object store (`PutMode::Create`); [`MemoryVersions`] keeps them
//! in memory (tests, and a model of the contract). In a cluster the current
//! version number will be held by ZooKeeper while the snapshots stay on the
//! shared storage; that is one more implementation of this trait.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use cirro_common::{CirroError, Result};
use cirro_storage::StorageRoot;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// Versions of the catalog and the pointer to the current one.
#[async_trait]
pub trait VersionStore: Send + Sync + std::fmt::Debug {
    /// The newest version (0 when there is none yet).
    async fn latest(&self) -> Result<u64>;
    /// The newest version, where `known` is one that exists: versions are
    /// made one after another (`create` of the newest plus one), so a store
    /// without `known + 1` has nothing newer. Every statement asks this.
    async fn latest_after(&self, known: u64) -> Result<u64> {
        let _ = known;
        self.latest().await
    }
    /// The bytes of `version`.
    async fn read(&self, version: u64) -> Result<Bytes>;
    /// Store `version` unless it exists: true when this call created it,
    /// false when another writer did first.
    async fn create(&self, version: u64, body: Bytes) -> Result<bool>;
    /// Forget an old version (best effort).
    async fn remove(&self, version: u64);
}

const CATALOG_DIR: &str = "_catalog";

fn version_path(version: u64) -> String {
    format!("{CATALOG_DIR}/v{version:020}.json")
}

fn parse_version(name: &str) -> Option<u64> {
    name.strip_prefix('v')?.strip_suffix(".json")?.parse().ok()
}

/// Versions as files under `_catalog/` of the data location.
#[derive(Debug)]
pub struct FileVersions {
    root: StorageRoot,
}

impl FileVersions {
    pub fn new(root: StorageRoot) -> Self {
        Self { root }
    }
}

#[async_trait]
impl VersionStore for FileVersions {
    async fn latest(&self) -> Result<u64> {
        let prefix = self.root.path(CATALOG_DIR);
        let objects: Vec<_> = self.root.store().list(Some(&prefix)).try_collect().await?;
        Ok(objects
            .iter()
            .filter_map(|o| o.location.filename().and_then(parse_version))
            .max()
            .unwrap_or(0))
    }

    /// One existence check of the next version rather than a listing of
    /// `_catalog/` (which grows with the versions kept).
    async fn latest_after(&self, known: u64) -> Result<u64> {
        if known > 0 {
            if let Some(false) = self.root.local_exists(&version_path(known + 1)) {
                return Ok(known);
            }
            let next = self.root.path(&version_path(known + 1));
            if let Err(object_store::Error::NotFound { .. }) = self.root.store().head(&next).await {
                return Ok(known);
            }
        }
        self.latest().await
    }

    async fn read(&self, version: u64) -> Result<Bytes> {
        let path = self.root.path(&version_path(version));
        Ok(self.root.store().get(&path).await?.bytes().await?)
    }

    async fn create(&self, version: u64, body: Bytes) -> Result<bool> {
        let path = self.root.path(&version_path(version));
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .root
            .store()
            .put_opts(&path, PutPayload::from(body), options)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn remove(&self, version: u64) {
        let path = self.root.path(&version_path(version));
        let _ = self.root.store().delete(&path).await;
    }
}

/// Versions in memory: for tests, and as the plainest statement of the
/// contract.
#[derive(Debug, Default)]
pub struct MemoryVersions {
    versions: Mutex<BTreeMap<u64, Bytes>>,
}

#[async_trait]
impl VersionStore for MemoryVersions {
    async fn latest(&self) -> Result<u64> {
        let versions = self.versions.lock().map_err(|_| poisoned())?;
        Ok(versions.keys().next_back().copied().unwrap_or(0))
    }

    async fn read(&self, version: u64) -> Result<Bytes> {
        let versions = self.versions.lock().map_err(|_| poisoned())?;
        versions
            .get(&version)
            .cloned()
            .ok_or_else(|| CirroError::internal(format!("catalog version {version} is missing")))
    }

    async fn create(&self, version: u64, body: Bytes) -> Result<bool> {
        let mut versions = self.versions.lock().map_err(|_| poisoned())?;
        if versions.contains_key(&version) {
            return Ok(false);
        }
        versions.insert(version, body);
        Ok(true)
    }

    async fn remove(&self, version: u64) {
        if let Ok(mut versions) = self.versions.lock() {
            versions.remove(&version);
        }
    }
}

fn poisoned() -> CirroError {
    CirroError::internal("catalog version store lock poisoned")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The contract, run against every implementation.
    async fn contract(store: Arc<dyn VersionStore>) {
        assert_eq!(store.latest().await.expect("latest"), 0);
        assert!(
            store
                .create(1, Bytes::from_static(b"one"))
                .await
                .expect("create")
        );
        assert!(
            !store
                .create(1, Bytes::from_static(b"other"))
                .await
                .expect("race")
        );
        assert_eq!(
            store.read(1).await.expect("read"),
            Bytes::from_static(b"one")
        );
        // Racing writers for one version: exactly one wins.
        let racers = (0..8).map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.create(2, Bytes::from(format!("w{i}"))).await })
        });
        let mut winners = 0;
        for racer in racers {
            if racer.await.expect("join").expect("create") {
                winners += 1;
            }
        }
        assert_eq!(winners, 1);
        assert_eq!(store.latest().await.expect("latest"), 2);
        store.remove(1).await;
        assert!(store.read(1).await.is_err());
        assert_eq!(store.latest().await.expect("latest"), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn file_versions_keep_the_contract() {
        let dir = tempfile::tempdir().expect("dir");
        let root = StorageRoot::open(dir.path().to_str().expect("utf8")).expect("root");
        contract(Arc::new(FileVersions::new(root))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_versions_keep_the_contract() {
        contract(Arc::new(MemoryVersions::default())).await;
    }
}
