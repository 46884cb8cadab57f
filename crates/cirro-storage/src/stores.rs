//! Object stores by URL scheme: the one place that knows which storage
//! Cirro reaches and how. `file` (a local directory) today; `hdfs` and `s3`
//! come with cluster mode, each as one arm here.

use std::sync::Arc;

use cirro_common::{CirroError, Result};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use url::Url;

/// The object store of the data location at `url` (created if it is a new
/// local directory), and the URL normalized to end in `/`.
pub(crate) fn open(url: Url) -> Result<(Url, Arc<dyn ObjectStore>)> {
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
        other => Err(CirroError::unsupported(format!(
            "data location scheme '{other}' is not supported yet (use a local path or file://)"
        ))),
    }
}
