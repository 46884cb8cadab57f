//! Reads that give up: an HDFS name node or data node that stops answering
//! (frozen, cut off) would hold a query forever, since the native HDFS
//! client has no timeouts of its own. [`ReadTimeouts`] bounds every read
//! (`get`, `head`, listing, and each chunk of a streamed read) by
//! [`read_timeout`]; past it the read fails with an error naming the store,
//! and the statement fails cleanly.
//!
//! Writes are not bounded: a write whose answer is late may still have
//! happened (a commit that lands after its writer gave up would change a
//! table after its statement failed), so a write waits for the storage to
//! answer, or for the statement's cancel or timeout. A commit reads the log
//! first, so a statement that meets an unreachable store fails before it
//! writes.

use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// How long one read may wait for the storage: `CIRRO_STORAGE_READ_TIMEOUT`
/// seconds, default 30.
pub fn read_timeout() -> Duration {
    std::env::var("CIRRO_STORAGE_READ_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(30))
}

/// `inner` with every read bounded (see the module docs).
#[derive(Debug)]
pub struct ReadTimeouts<T> {
    inner: T,
    timeout: Duration,
    /// What the store is, for errors (`HDFS at hdfs://nn:8020`).
    what: String,
}

impl<T> ReadTimeouts<T> {
    pub fn new(inner: T, what: impl Into<String>) -> Self {
        Self {
            inner,
            timeout: read_timeout(),
            what: what.into(),
        }
    }
}

impl<T> std::fmt::Display for ReadTimeouts<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.what)
    }
}

fn timed_out(what: &str, timeout: Duration, path: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "storage",
        source: format!(
            "{what} did not answer within {} s (reading {path}); is it reachable?",
            timeout.as_secs_f64()
        )
        .into(),
    }
}

impl<T: ObjectStore> ReadTimeouts<T> {
    async fn bounded<R>(
        &self,
        path: &str,
        f: impl std::future::Future<Output = Result<R>>,
    ) -> Result<R> {
        tokio::time::timeout(self.timeout, f)
            .await
            .unwrap_or_else(|_| Err(timed_out(&self.what, self.timeout, path)))
    }

    /// `stream` with each item bounded.
    fn bounded_stream<I: Send + 'static>(
        &self,
        stream: BoxStream<'static, Result<I>>,
        path: String,
    ) -> BoxStream<'static, Result<I>> {
        let (timeout, what) = (self.timeout, self.what.clone());
        futures::stream::unfold(Some(stream), move |state| {
            let (path, what) = (path.clone(), what.clone());
            async move {
                let mut stream = state?;
                match tokio::time::timeout(timeout, stream.next()).await {
                    Ok(Some(item)) => Some((item, Some(stream))),
                    Ok(None) => None,
                    Err(_) => Some((Err(timed_out(&what, timeout, &path)), None)),
                }
            }
        })
        // Some readers poll a stream again after its end.
        .fuse()
        .boxed()
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<T: ObjectStore> ObjectStore for ReadTimeouts<T> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let result = self
            .bounded(location.as_ref(), self.inner.get_opts(location, options))
            .await?;
        let payload = match result.payload {
            GetResultPayload::Stream(stream) => {
                GetResultPayload::Stream(self.bounded_stream(stream, location.to_string()))
            }
            other => other,
        };
        Ok(GetResult { payload, ..result })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.bounded(location.as_ref(), self.inner.get_ranges(location, ranges))
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        self.bounded_stream(self.inner.list(prefix), path)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        self.bounded_stream(self.inner.list_with_offset(prefix, offset), path)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        self.bounded(&path, self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn reads_give_up_and_writes_go_through() {
        let memory = InMemory::new();
        let path = Path::from("a");
        memory
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let store = ReadTimeouts {
            inner: memory,
            timeout: Duration::from_millis(200),
            what: "memory".to_string(),
        };
        // An answering store answers.
        let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&bytes[..], b"x");
        assert_eq!(store.list(None).count().await, 1);
        store
            .put(&Path::from("b"), PutPayload::from_static(b"y"))
            .await
            .unwrap();

        // A silent one fails in time, naming itself.
        let pending: BoxStream<'static, Result<ObjectMeta>> = futures::stream::pending().boxed();
        let bounded = store.bounded_stream(pending, "dir".to_string());
        let started = std::time::Instant::now();
        let items: Vec<_> = bounded.collect().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(items.len(), 1);
        let err = items[0].as_ref().unwrap_err().to_string();
        assert!(err.contains("memory did not answer"), "{err}");
        let never = store
            .bounded("x", futures::future::pending::<Result<()>>())
            .await;
        assert!(never.is_err());
    }
}
