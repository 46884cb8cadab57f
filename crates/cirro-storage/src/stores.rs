//! Object stores by URL scheme: the one place that knows which storage
//! Cirro reaches and how.
//!
//! - `file` — a local directory (the default);
//! - `s3` — an S3 bucket (or an S3-compatible server), configured by the
//!   usual environment variables (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//!   `AWS_ALLOW_HTTP` for a plain-HTTP endpoint). Delta commits and catalog
//!   versions are written with a conditional put (`If-None-Match: *`), so
//!   two writers never both take one version.
//! - `hdfs` — an HDFS name node (`hdfs://host:port/path`), through the
//!   native HDFS client (no JVM); a conditional put there is a write to a
//!   temporary file and a rename that refuses to overwrite, which HDFS does
//!   atomically.
//!
//! Reads of table data files on `s3` and `hdfs` through the data location's
//! store go through the node's local-disk tier when `--cache-dir` names one
//! ([`crate::cache::disk`]); delta-rs's stores (log reads and commits) do
//! not.
//!
//! delta-rs finds stores through its own registry by scheme; `s3` is
//! registered there once, with the same store, so tables and the catalog
//! reach the bucket the same way.

use std::sync::{Arc, Once};

use cirro_common::{CirroError, Result, SqlState};
use deltalake::logstore::{
    LogStore, LogStoreFactory, ObjectStoreFactory, ObjectStoreRef, StorageConfig, default_logstore,
    logstore_factories, object_store_factories,
};
use object_store::ObjectStore;

use crate::cache::disk::DiskTier;
use crate::timeouts::ReadTimeouts;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

/// The object store of the data location at `url` (created if it is a new
/// local directory; remote data files read through `disk` if given), and
/// the URL normalized to end in `/`.
pub(crate) fn open(url: Url, disk: Option<&Arc<DiskTier>>) -> Result<(Url, Arc<dyn ObjectStore>)> {
    let mut url = url;
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    match url.scheme() {
        "file" => {
            let local = url
                .to_file_path()
                .map_err(|_| CirroError::io(format!("bad file URL {url}")))?;
            std::fs::create_dir_all(&local)
                .map_err(|e| CirroError::io(format!("cannot create {}: {e}", local.display())))?;
            Ok((url, Arc::new(LocalFileSystem::new())))
        }
        "s3" | "s3a" | "hdfs" => {
            register_with_delta();
            let store = remote_store(&url, disk)?;
            Ok((url, store))
        }
        other => Err(CirroError::unsupported(format!(
            "data location scheme '{other}' is not supported (use a local path, file://, s3:// or hdfs://)"
        ))),
    }
}

/// The store at the root of remote location `url` (its bucket or name
/// node), its data files read through the disk tier if `--cache-dir` set one.
fn remote_store(url: &Url, disk: Option<&Arc<DiskTier>>) -> Result<Arc<dyn ObjectStore>> {
    let store = match url.scheme() {
        "hdfs" => hdfs_store(url)?,
        _ => s3_store(url)?,
    };
    let Some(tier) = disk else {
        return Ok(store);
    };
    let root = match url.port() {
        Some(port) => format!("{}://{}:{port}", url.scheme(), url.host_str().unwrap_or("")),
        None => format!("{}://{}", url.scheme(), url.host_str().unwrap_or("")),
    };
    Ok(Arc::new(crate::cache::disk::DiskCached::new(
        store,
        Arc::clone(tier),
        root,
    )))
}

/// The store of the name node `url` names.
fn hdfs_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("bad HDFS URL {url}: it names no name node (hdfs://host:port/path)"),
        ));
    };
    let root = match url.port() {
        Some(port) => format!("hdfs://{host}:{port}"),
        None => format!("hdfs://{host}"),
    };
    let store = hdfs_native_object_store::HdfsObjectStoreBuilder::new()
        .with_url(&root)
        .build()
        .map_err(|e| CirroError::io(format!("cannot reach {url}: {e}")))?;
    // The native client has no timeouts: bound the reads.
    Ok(Arc::new(ReadTimeouts::new(
        store,
        format!("HDFS at {root}"),
    )))
}

/// The store of the bucket `url` names, from the environment's settings.
fn s3_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    if url.host_str().is_none_or(str::is_empty) {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("bad S3 URL {url}: it names no bucket (s3://bucket/path)"),
        ));
    }
    let store = AmazonS3Builder::from_env()
        .with_url(url.as_str())
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .map_err(|e| CirroError::io(format!("cannot reach {url}: {e}")))?;
    Ok(Arc::new(store))
}

/// delta-rs's factory for `s3://` and `hdfs://` tables: the bucket's or
/// name node's store and the table's path in it.
struct RemoteStores;

impl ObjectStoreFactory for RemoteStores {
    fn parse_url_opts(
        &self,
        url: &Url,
        _config: &StorageConfig,
    ) -> deltalake::DeltaResult<(ObjectStoreRef, Path)> {
        let store =
            remote_store(url, None).map_err(|e| deltalake::DeltaTableError::Generic(e.message))?;
        let path = Path::from_url_path(url.path())?;
        Ok((store, path))
    }
}

/// delta-rs's default log store: commits are conditional puts.
struct RemoteLogStores;

impl LogStoreFactory for RemoteLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> deltalake::DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

fn register_with_delta() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        for scheme in ["s3://", "s3a://", "hdfs://"] {
            if let Ok(key) = Url::parse(scheme) {
                object_store_factories().insert(key.clone(), Arc::new(RemoteStores));
                logstore_factories().insert(key, Arc::new(RemoteLogStores));
            }
        }
    });
}
