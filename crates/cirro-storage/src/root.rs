//! The data location: where databases, tables and the catalog live.
//!
//! `--data` takes a local path (the default `./cirro-data`) or a URL; which
//! URL schemes work, and how their object stores are made, is `stores.rs`.

use std::sync::Arc;

use cirro_common::{CirroError, Result, SqlState};

use crate::cache::disk::DiskTier;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

/// Whether `relative` (a `/`-separated path) exists under the local
/// directory `dir`, asked of the file system directly: a stat of a few
/// microseconds, or none while nothing was created in its directory (see
/// `watch.rs`), where the object store's local implementation hands each
/// call to a blocking thread and back (tens). None where the file system
/// does not say (then ask the object store). Statements ask this of the
/// catalog and of each table they read, to see what other processes
/// committed.
pub(crate) fn local_exists(dir: Option<&std::path::Path>, relative: &str) -> Option<bool> {
    let dir = dir?;
    match relative.rsplit_once('/') {
        Some((parent, name)) => crate::watch::exists(&dir.join(parent), name),
        None => crate::watch::exists(dir, relative),
    }
}

/// `url` as a local directory, for a `file:` URL.
pub(crate) fn local_dir(url: &Url) -> Option<Arc<std::path::Path>> {
    if url.scheme() != "file" {
        return None;
    }
    url.to_file_path().ok().map(Arc::from)
}

/// The root of a data location and the object store that reaches it.
#[derive(Clone, Debug)]
pub struct StorageRoot {
    url: Url,
    store: Arc<dyn ObjectStore>,
    /// The root as a local directory (a `file:` URL), found once.
    local: Option<Arc<std::path::Path>>,
}

impl StorageRoot {
    /// Open (creating if needed) the data location `location`: a path or a URL.
    pub fn open(location: &str) -> Result<Self> {
        Self::open_with(location, None)
    }

    /// [`Self::open`], remote data files read through the node's local-disk
    /// tier `disk`.
    pub fn open_with(location: &str, disk: Option<&Arc<DiskTier>>) -> Result<Self> {
        let url = if location.contains("://") {
            Url::parse(location).map_err(|e| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("bad data URL {location}: {e}"),
                )
            })?
        } else {
            let path = std::path::Path::new(location);
            std::fs::create_dir_all(path).map_err(|e| {
                CirroError::io(format!("cannot create data directory {location}: {e}"))
            })?;
            let absolute = std::fs::canonicalize(path).map_err(|e| {
                CirroError::io(format!("cannot open data directory {location}: {e}"))
            })?;
            Url::from_directory_path(&absolute)
                .map_err(|_| CirroError::io(format!("bad data directory {}", absolute.display())))?
        };
        let (url, store) = crate::stores::open(url, disk)?;
        let local = local_dir(&url);
        Ok(Self { url, store, local })
    }

    /// URL of the root, ending in `/`.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Whether `relative` exists under the root, for a local directory
    /// (None: ask the object store).
    pub fn local_exists(&self, relative: &str) -> Option<bool> {
        local_exists(self.local.as_deref(), relative)
    }

    /// The object store, addressed with [`StorageRoot::path`].
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Object-store path of `relative` (a `/`-separated path under the root).
    pub fn path(&self, relative: &str) -> Path {
        let base = Path::from_url_path(self.url.path()).unwrap_or_default();
        let relative = Path::from(relative);
        let mut parts: Vec<_> = base.parts().collect();
        parts.extend(relative.parts());
        Path::from_iter(parts)
    }

    /// URL of the directory `relative` under the root, ending in `/`.
    pub fn dir_url(&self, relative: &str) -> Result<Url> {
        let trimmed = relative.trim_matches('/');
        self.url
            .join(&format!("{trimmed}/"))
            .map_err(|e| CirroError::internal(format!("bad table path {relative}: {e}")))
    }

    /// Remove everything under the directory `relative` (best effort for local files).
    pub async fn remove_dir(&self, relative: &str) -> Result<()> {
        if self.url.scheme() == "file" {
            let url = self.dir_url(relative)?;
            if let Ok(path) = url.to_file_path() {
                match tokio::fs::remove_dir_all(&path).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => {
                        return Err(CirroError::io(format!(
                            "cannot remove {}: {e}",
                            path.display()
                        )));
                    }
                }
            }
        }
        use futures::TryStreamExt;
        let prefix = self.path(relative);
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        for object in objects {
            self.store.delete(&object.location).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_path_becomes_directory_url() {
        let dir = std::env::temp_dir().join(format!("cirro-root-{}", std::process::id()));
        let root = StorageRoot::open(dir.to_str().expect("utf8")).expect("open");
        assert!(root.url().as_str().starts_with("file:///"));
        assert!(root.url().as_str().ends_with('/'));
        let table = root.dir_url("data/cirro/public/t-1").expect("url");
        assert!(table.as_str().ends_with("/data/cirro/public/t-1/"));
        assert!(
            root.path("_catalog/x.json")
                .as_ref()
                .ends_with("_catalog/x.json")
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
