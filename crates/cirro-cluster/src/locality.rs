//! Where the bytes of a scan's files live: HDFS block locations, asked of
//! the name node when a query is planned, kept on the scan's files for task
//! placement (`placement.rs`).
//!
//! The name node answers `ClientProtocol.getBlockLocations` over Hadoop
//! RPC, the protocol hdfs-native reads files with. hdfs-native keeps the
//! block list it gets private (its `FileReader` holds it), and WebHDFS needs
//! an HTTP address besides the data location's (and does not work in the
//! shaded MiniDFSCluster the tests run), so this module speaks that one call
//! itself: the connection preamble, one connection context and pipelined
//! `getBlockLocations` calls, each message a few protobuf fields (the ones
//! read or written; protobuf skips the rest). Simple authentication only:
//! on a cluster with Kerberos, or a name service URL (HA), the call fails,
//! and tasks are placed by load alone (a warning says so, once a minute).
//!
//! Answers are cached by file for [`CACHE_FOR`] (Delta files never change;
//! blocks move only when HDFS re-replicates them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a name node may take to connect and to answer all the calls of
/// one plan.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a file's block locations are reused.
const CACHE_FOR: Duration = Duration::from_secs(300);
/// Files remembered at most (the cache is emptied when it grows past).
const CACHE_FILES: usize = 200_000;
/// Failures to reach a name node are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Largest RPC answer read (a file of 4,096 blocks is well under 1 MiB).
const MAX_ANSWER: u32 = 64 << 20;

/// The blocks of one file: where each byte range is stored.
#[derive(Debug, Default, PartialEq)]
pub struct FileBlocks {
    blocks: Vec<Block>,
}

#[derive(Debug, PartialEq)]
struct Block {
    offset: u64,
    length: u64,
    /// The data nodes holding a replica, by address and by host name.
    hosts: Vec<String>,
}

impl FileBlocks {
    /// Blocks as (offset, length, hosts), for tests.
    #[cfg(test)]
    pub(crate) fn of(blocks: &[(u64, u64, &[&str])]) -> Self {
        Self {
            blocks: blocks
                .iter()
                .map(|(offset, length, hosts)| Block {
                    offset: *offset,
                    length: *length,
                    hosts: hosts.iter().map(|h| h.to_string()).collect(),
                })
                .collect(),
        }
    }

    /// The bytes of `range` (the whole file when None) stored on `host`.
    pub fn bytes_on(&self, host: &str, range: Option<(u64, u64)>) -> u64 {
        let (start, end) = range.unwrap_or((0, u64::MAX));
        self.blocks
            .iter()
            .filter(|b| b.hosts.iter().any(|h| h == host))
            .map(|b| overlap(b.offset, b.offset + b.length, start, end))
            .sum()
    }
}

fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// A scan file's blocks (a `PartitionedFile` extension).
#[derive(Debug, Clone)]
pub struct Located(pub Arc<FileBlocks>);

/// The byte range a scan file covers, and its length.
pub fn file_range(file: &PartitionedFile) -> (Option<(u64, u64)>, u64) {
    match &file.range {
        Some(r) => {
            let (start, end) = (r.start.max(0) as u64, r.end.max(0) as u64);
            (Some((start, end)), end.saturating_sub(start))
        }
        None => (None, file.object_meta.size),
    }
}

/// Block locations for the scans of plans, cached.
#[derive(Debug, Default)]
pub struct BlockLocator {
    cache: Mutex<HashMap<(String, String), (Instant, Arc<FileBlocks>)>>,
    last_warning: Mutex<Option<Instant>>,
}

impl BlockLocator {
    /// `plan` with the block locations of its HDFS scans' files attached
    /// ([`Located`]). Never fails: a name node that does not answer leaves
    /// the files without locations.
    pub async fn locate(&self, plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        // The files to ask about, by name node.
        let mut wanted: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        let _ = plan.apply(|node| {
            if let Some((namenode, scan)) = hdfs_scan(node) {
                let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                for file in scan.file_groups.iter().flat_map(|g| g.iter()) {
                    let path = format!("/{}", file.object_meta.location);
                    let fresh = cache
                        .get(&(namenode.clone(), path.clone()))
                        .is_some_and(|(at, _)| at.elapsed() < CACHE_FOR);
                    if !fresh {
                        wanted
                            .entry(namenode.clone())
                            .or_default()
                            .push((path, file.object_meta.size));
                    }
                }
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        });
        for (namenode, mut files) in wanted {
            files.sort();
            files.dedup();
            match block_locations(&namenode, &files).await {
                Ok(answers) => {
                    let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                    if cache.len() + answers.len() > CACHE_FILES {
                        cache.clear();
                    }
                    let now = Instant::now();
                    for ((path, _), blocks) in files.into_iter().zip(answers) {
                        if let Some(blocks) = blocks {
                            cache.insert((namenode.clone(), path), (now, Arc::new(blocks)));
                        }
                    }
                }
                Err(e) => self.warn(&namenode, &e),
            }
        }
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.is_empty() {
            return plan;
        }
        let attached = Arc::clone(&plan).transform_up(|node| {
            let Some((namenode, scan)) = hdfs_scan(&node) else {
                return Ok(Transformed::no(node));
            };
            let mut config = scan.clone();
            config.file_groups = scan
                .file_groups
                .iter()
                .map(|group| {
                    FileGroup::new(
                        group
                            .iter()
                            .map(|file| {
                                let path = format!("/{}", file.object_meta.location);
                                match cache.get(&(namenode.clone(), path)) {
                                    Some((_, blocks)) => {
                                        file.clone().with_extension(Located(Arc::clone(blocks)))
                                    }
                                    None => file.clone(),
                                }
                            })
                            .collect(),
                    )
                })
                .collect();
            Ok(Transformed::yes(
                DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
            ))
        });
        match attached {
            Ok(t) => t.data,
            Err(_) => plan,
        }
    }

    fn warn(&self, namenode: &str, error: &std::io::Error) {
        let mut last = self.last_warning.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            log::warn!(
                "no block locations from the HDFS name node {namenode} ({error}): \
                 tasks are placed by load, not by where the data is"
            );
            *last = Some(Instant::now());
        }
    }
}

/// The name node (`host:port`) and the scan, when `node` scans HDFS files.
fn hdfs_scan(node: &Arc<dyn ExecutionPlan>) -> Option<(String, &FileScanConfig)> {
    let scan = node
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    let url = url::Url::parse(scan.object_store_url.as_str()).ok()?;
    if url.scheme() != "hdfs" {
        return None;
    }
    let host = url.host_str()?;
    // A name service (HA) has no port and names no host: the call fails.
    Some((format!("{host}:{}", url.port().unwrap_or(8020)), scan))
}

// The Hadoop RPC messages used (hadoop-common RpcHeader.proto,
// IpcConnectionContext.proto, ProtobufRpcEngine.proto; hadoop-hdfs
// ClientNamenodeProtocol.proto, hdfs.proto), with only the fields read or
// written; every field optional here (protobuf 2's "required" is a check, not
// an encoding).

#[derive(Clone, PartialEq, Message)]
struct RpcRequestHeader {
    /// RPC_PROTOCOL_BUFFER = 2.
    #[prost(int32, optional, tag = "1")]
    rpc_kind: Option<i32>,
    /// RPC_FINAL_PACKET = 0.
    #[prost(int32, optional, tag = "2")]
    rpc_op: Option<i32>,
    #[prost(sint32, optional, tag = "3")]
    call_id: Option<i32>,
    #[prost(bytes = "vec", optional, tag = "4")]
    client_id: Option<Vec<u8>>,
    #[prost(sint32, optional, tag = "5")]
    retry_count: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct UserInformation {
    #[prost(string, optional, tag = "1")]
    effective_user: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct IpcConnectionContext {
    #[prost(message, optional, tag = "2")]
    user_info: Option<UserInformation>,
    #[prost(string, optional, tag = "3")]
    protocol: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct RequestHeader {
    #[prost(string, optional, tag = "1")]
    method_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    declaring_class_protocol_name: Option<String>,
    #[prost(uint64, optional, tag = "3")]
    client_protocol_version: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct GetBlockLocationsRequest {
    #[prost(string, optional, tag = "1")]
    src: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    offset: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    length: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct RpcResponseHeader {
    #[prost(uint32, optional, tag = "1")]
    call_id: Option<u32>,
    /// SUCCESS = 0, ERROR = 1, FATAL = 2.
    #[prost(int32, optional, tag = "2")]
    status: Option<i32>,
    #[prost(string, optional, tag = "4")]
    exception_class_name: Option<String>,
    #[prost(string, optional, tag = "5")]
    error_msg: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct GetBlockLocationsResponse {
    #[prost(message, optional, tag = "1")]
    locations: Option<LocatedBlocks>,
}

#[derive(Clone, PartialEq, Message)]
struct LocatedBlocks {
    #[prost(uint64, optional, tag = "1")]
    file_length: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    blocks: Vec<LocatedBlock>,
}

#[derive(Clone, PartialEq, Message)]
struct LocatedBlock {
    #[prost(message, optional, tag = "1")]
    b: Option<ExtendedBlock>,
    #[prost(uint64, optional, tag = "2")]
    offset: Option<u64>,
    #[prost(message, repeated, tag = "3")]
    locs: Vec<DatanodeInfo>,
}

#[derive(Clone, PartialEq, Message)]
struct ExtendedBlock {
    #[prost(uint64, optional, tag = "4")]
    num_bytes: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct DatanodeInfo {
    #[prost(message, optional, tag = "1")]
    id: Option<DatanodeId>,
}

#[derive(Clone, PartialEq, Message)]
struct DatanodeId {
    #[prost(string, optional, tag = "1")]
    ip_addr: Option<String>,
    #[prost(string, optional, tag = "2")]
    host_name: Option<String>,
}

const CLIENT_PROTOCOL: &str = "org.apache.hadoop.hdfs.protocol.ClientProtocol";

/// The user the calls are made as (simple authentication): as hdfs-native
/// and Hadoop's clients take it.
fn hadoop_user() -> String {
    ["HADOOP_USER_NAME", "USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "cirro".to_string())
}

/// One RPC message: its length, then its parts (each length-delimited).
fn frame(out: &mut Vec<u8>, parts: &[Vec<u8>]) {
    let length: usize = parts.iter().map(Vec::len).sum();
    out.extend((length as u32).to_be_bytes());
    for part in parts {
        out.extend(part);
    }
}

fn header(call_id: i32, retry_count: i32, client_id: &[u8]) -> Vec<u8> {
    RpcRequestHeader {
        rpc_kind: Some(2),
        rpc_op: Some(0),
        call_id: Some(call_id),
        client_id: Some(client_id.to_vec()),
        retry_count: Some(retry_count),
    }
    .encode_length_delimited_to_vec()
}

/// The request bytes: preamble, connection context, one call per file.
fn requests(files: &[(String, u64)], client_id: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    // "hrpc", version 9, service class 0, authentication none.
    out.extend(b"hrpc");
    out.extend([9, 0, 0]);
    let context = IpcConnectionContext {
        user_info: Some(UserInformation {
            effective_user: Some(hadoop_user()),
        }),
        protocol: Some(CLIENT_PROTOCOL.to_string()),
    };
    frame(
        &mut out,
        &[
            header(-3, -1, client_id),
            context.encode_length_delimited_to_vec(),
        ],
    );
    let method = RequestHeader {
        method_name: Some("getBlockLocations".to_string()),
        declaring_class_protocol_name: Some(CLIENT_PROTOCOL.to_string()),
        client_protocol_version: Some(1),
    }
    .encode_length_delimited_to_vec();
    for (call, (path, length)) in files.iter().enumerate() {
        let request = GetBlockLocationsRequest {
            src: Some(path.clone()),
            offset: Some(0),
            length: Some((*length).max(1)),
        };
        frame(
            &mut out,
            &[
                header(call as i32, 0, client_id),
                method.clone(),
                request.encode_length_delimited_to_vec(),
            ],
        );
    }
    out
}

fn invalid(what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// One answer's blocks (None: the call failed, e.g. the file is gone).
fn answer(body: &[u8]) -> std::io::Result<(u32, Option<FileBlocks>)> {
    let mut body = body;
    let head = RpcResponseHeader::decode_length_delimited(&mut body).map_err(invalid)?;
    let call = head.call_id.unwrap_or(u32::MAX);
    match head.status.unwrap_or(0) {
        0 => {}
        1 => return Ok((call, None)),
        _ => {
            return Err(invalid(format!(
                "{}: {}",
                head.exception_class_name.unwrap_or_default(),
                head.error_msg.unwrap_or_default()
            )));
        }
    }
    let response =
        GetBlockLocationsResponse::decode_length_delimited(&mut body).map_err(invalid)?;
    let blocks = response
        .locations
        .map(|l| l.blocks)
        .unwrap_or_default()
        .into_iter()
        .map(|b| Block {
            offset: b.offset.unwrap_or(0),
            length: b.b.and_then(|b| b.num_bytes).unwrap_or(0),
            hosts: b
                .locs
                .into_iter()
                .filter_map(|d| d.id)
                .flat_map(|id| [id.ip_addr, id.host_name])
                .flatten()
                .collect(),
        })
        .collect();
    Ok((call, Some(FileBlocks { blocks })))
}

/// The blocks of `files` (HDFS paths and lengths), in order, from the name
/// node at `namenode`; None for a file it did not answer for.
async fn block_locations(
    namenode: &str,
    files: &[(String, u64)],
) -> std::io::Result<Vec<Option<FileBlocks>>> {
    let timed_out =
        |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string());
    let mut stream =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(namenode))
            .await
            .map_err(|_| timed_out("connect timed out"))??;
    let client_id = *uuid::Uuid::new_v4().as_bytes();
    let exchange = async {
        stream.write_all(&requests(files, &client_id)).await?;
        let mut answers: Vec<Option<FileBlocks>> = files.iter().map(|_| None).collect();
        for _ in 0..files.len() {
            let mut length = [0u8; 4];
            stream.read_exact(&mut length).await?;
            let length = u32::from_be_bytes(length);
            if length > MAX_ANSWER {
                return Err(invalid(format!("an answer of {length} bytes")));
            }
            let mut body = vec![0u8; length as usize];
            stream.read_exact(&mut body).await?;
            let (call, blocks) = answer(&body)?;
            if let Some(slot) = answers.get_mut(call as usize) {
                *slot = blocks;
            }
        }
        Ok::<_, std::io::Error>(answers)
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| timed_out("no answer in time"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_on_a_host_count_the_overlap_of_its_blocks() {
        let blocks = FileBlocks {
            blocks: vec![
                Block {
                    offset: 0,
                    length: 100,
                    hosts: vec!["10.0.0.1".into(), "a".into()],
                },
                Block {
                    offset: 100,
                    length: 50,
                    hosts: vec!["10.0.0.2".into()],
                },
            ],
        };
        assert_eq!(blocks.bytes_on("10.0.0.1", None), 100);
        assert_eq!(blocks.bytes_on("a", Some((50, 150))), 50);
        assert_eq!(blocks.bytes_on("10.0.0.2", Some((50, 120))), 20);
        assert_eq!(blocks.bytes_on("10.0.0.3", None), 0);
    }

    #[test]
    fn an_answer_decodes_to_blocks_and_a_failed_call_to_none() {
        let body = |status: i32, locations: Option<LocatedBlocks>| {
            let mut out = RpcResponseHeader {
                call_id: Some(7),
                status: Some(status),
                exception_class_name: Some("java.io.FileNotFoundException".into()),
                error_msg: None,
            }
            .encode_length_delimited_to_vec();
            if status == 0 {
                out.extend(
                    GetBlockLocationsResponse { locations }.encode_length_delimited_to_vec(),
                );
            }
            out
        };
        let located = LocatedBlocks {
            file_length: Some(10),
            blocks: vec![LocatedBlock {
                b: Some(ExtendedBlock {
                    num_bytes: Some(10),
                }),
                offset: Some(0),
                locs: vec![DatanodeInfo {
                    id: Some(DatanodeId {
                        ip_addr: Some("10.0.0.9".into()),
                        host_name: Some("dn9".into()),
                    }),
                }],
            }],
        };
        let (call, blocks) = answer(&body(0, Some(located))).unwrap();
        assert_eq!(call, 7);
        let blocks = blocks.unwrap();
        assert_eq!(blocks.bytes_on("10.0.0.9", None), 10);
        assert_eq!(blocks.bytes_on("dn9", None), 10);
        assert_eq!(answer(&body(1, None)).unwrap(), (7, None));
        assert!(answer(&body(2, None)).is_err());
    }
}
