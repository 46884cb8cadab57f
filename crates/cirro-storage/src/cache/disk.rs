//! The local-disk tier (`--cache-dir`): blocks of the data files a node
//! reads from slow storage (HDFS, S3), kept in files on a local disk, so
//! that the next read of them, in this process or after a restart, does not
//! cross the network.
//!
//! # What is kept
//! Data files are cut into blocks of [`BLOCK_BYTES`] (the last one
//! shorter). A read of a byte range reads the blocks that cover it: those
//! on the disk from there, the others from the storage, in one request per
//! run of consecutive blocks, and then writes them to the disk. Only the
//! Parquet data files of tables are kept (`*.parquet` outside `_delta_log/`):
//! Delta never rewrites a data file in place (a change writes new files
//! under new names), so a block keyed by the file's URL is never stale. A
//! write through Cirro to a kept path (a put, copy or rename onto it) and a
//! delete (VACUUM, DROP TABLE) drop its blocks at once.
//!
//! # Faults
//! Each block file starts with a header: a magic number, the CRC-32 of the
//! block, its length, the file it belongs to and that file's size. A block
//! that fails any of these checks (a corrupt or truncated file, a crash in
//! the middle of a write) is dropped and read again from the storage, and
//! counted as a repair. A write that fails (a full disk, an unwritable
//! directory) is logged as a warning and the tier stops writing for
//! [`PAUSE_AFTER_WRITE_FAILURE`]: reads go on from the storage, uncached;
//! a query never fails because of the disk tier.
//!
//! # What leaves
//! The tier holds at most its budget (`--cache-dir-size`). Blocks carry the
//! priority of the scan that read them ([`super::Priority`], from the plan,
//! the same as the memory tier's): they are evicted lowest priority first,
//! least recently used first within a priority, and a read may only evict
//! blocks of its own priority or lower; a block that finds no room is not
//! kept. After a restart every block on the disk is back, at `Normal`
//! priority, in the order of the files' modification times.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions, Result,
};

use super::{FileCounts, Priority};

/// Bytes of one block (the unit kept on the disk).
pub const BLOCK_BYTES: u64 = 1 << 20;

/// How long the tier stops writing after a write failed.
pub const PAUSE_AFTER_WRITE_FAILURE: Duration = Duration::from_secs(30);

const MAGIC: &[u8; 8] = b"CIRROBK1";
/// magic, CRC-32 of the block, length of the file's name, block length,
/// file size, file's last modification (ms since the epoch).
const HEADER_FIXED: usize = 8 + 4 + 4 + 8 + 8 + 8;
/// The longest file name a header may hold.
const NAME_MAX: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct BlockKey {
    file: Arc<str>,
    block: u64,
}

struct Block {
    bytes: u64,
    priority: Priority,
    last_used: u64,
    /// Reserved, its file not written yet: readers do not read it.
    writing: bool,
}

/// What the tier knows of a data file.
#[derive(Default)]
struct FileInfo {
    /// Its size and last modification, once known.
    meta: Option<(u64, DateTime<Utc>)>,
    hits: u64,
    misses: u64,
    repairs: u64,
}

#[derive(Default)]
struct Inner {
    blocks: HashMap<BlockKey, Block>,
    /// Eviction order: (priority, last use, key), the first goes first.
    order: BTreeSet<(Priority, u64, BlockKey)>,
    used: u64,
    tick: u64,
    files: HashMap<Arc<str>, FileInfo>,
}

impl Inner {
    fn remove(&mut self, key: &BlockKey) -> bool {
        match self.blocks.remove(key) {
            Some(block) => {
                self.order
                    .remove(&(block.priority, block.last_used, key.clone()));
                self.used -= block.bytes;
                true
            }
            None => false,
        }
    }

    fn add(&mut self, key: BlockKey, bytes: u64, priority: Priority, writing: bool) {
        self.tick += 1;
        let tick = self.tick;
        self.order.insert((priority, tick, key.clone()));
        self.used += bytes;
        self.blocks.insert(
            key,
            Block {
                bytes,
                priority,
                last_used: tick,
                writing,
            },
        );
    }
}

/// The disk tier's totals since the process started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskTotals {
    pub hits: u64,
    pub misses: u64,
    /// Blocks found corrupt or truncated on the disk and read again.
    pub repairs: u64,
    pub inserted: u64,
    pub evicted: u64,
    /// Blocks not kept: no room without evicting better data.
    pub rejected: u64,
    /// Writes to the disk that failed (then the tier pauses).
    pub write_failures: u64,
    pub bytes: u64,
    pub blocks: u64,
}

/// The local-disk tier of one process (see the module docs).
pub struct DiskTier {
    dir: PathBuf,
    budget: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    repairs: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    rejected: AtomicU64,
    write_failures: AtomicU64,
    paused_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.dir)
            .field("budget", &self.budget)
            .finish()
    }
}

/// The size in bytes of the file system holding `dir`.
pub fn file_system_size(dir: &FsPath) -> Option<u64> {
    file_system_space(dir).map(|(size, _)| size)
}

/// The size and the bytes free to unprivileged users of the file system
/// holding `dir`.
#[allow(unsafe_code)] // one FFI call to libc, see SAFETY below
pub fn file_system_space(dir: &FsPath) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `stat` a writable statvfs.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    let block = stat.f_frsize as u64;
    (rc == 0).then(|| (stat.f_blocks as u64 * block, stat.f_bavail as u64 * block))
}

/// What reading a block file found.
enum Found {
    Good(Bytes),
    /// No file (evicted or forgotten since).
    Gone,
    /// A file that fails its checks, and why.
    Bad(String),
}

impl DiskTier {
    /// The tier in `dir` (created if missing), with the blocks already
    /// there (see the module docs).
    pub fn open(dir: &FsPath, budget: u64) -> std::result::Result<Self, String> {
        let blocks = dir.join("blocks");
        std::fs::create_dir_all(&blocks)
            .map_err(|e| format!("cannot create {}: {e}", blocks.display()))?;
        let tier = Self {
            dir: dir.to_path_buf(),
            budget,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            paused_until: Mutex::new(None),
        };
        tier.load(&blocks);
        Ok(tier)
    }

    pub fn dir(&self) -> &FsPath {
        &self.dir
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change under the lock is a few inserts/removes: after a
        // panic the maps are still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Index the block files under `blocks`, oldest first; remove what is
    /// not a block file (a write cut short) and what exceeds the budget.
    fn load(&self, blocks: &FsPath) {
        let mut found: Vec<(SystemTime, BlockKey, u64, u64, DateTime<Utc>, PathBuf)> = Vec::new();
        let dirs = std::fs::read_dir(blocks).into_iter().flatten().flatten();
        for dir in dirs {
            let files = std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten();
            for file in files {
                let path = file.path();
                let block = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse::<u64>().ok());
                let header = block.and_then(|_| read_header(&path));
                let (Some(block), Some((name, size, modified, length))) = (block, header) else {
                    let _ = std::fs::remove_file(&path);
                    continue;
                };
                let bytes = (HEADER_FIXED + name.len()) as u64 + length;
                let at = file
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let key = BlockKey {
                    file: Arc::from(name),
                    block,
                };
                found.push((at, key, bytes, size, modified, path));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut inner = self.lock();
        for (_, key, bytes, size, modified, _) in &found {
            inner
                .files
                .entry(Arc::clone(&key.file))
                .or_default()
                .meta
                .get_or_insert((*size, *modified));
            inner.add(key.clone(), *bytes, Priority::Normal, false);
        }
        let mut over = Vec::new();
        while inner.used > self.budget {
            let Some((_, _, key)) = inner.order.first().cloned() else {
                break;
            };
            inner.remove(&key);
            over.push(self.block_path(&key));
        }
        drop(inner);
        for path in over {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The folder of a data file's blocks: a hash of its URL (the header
    /// of each block names the file in full).
    fn file_dir(&self, file: &str) -> PathBuf {
        let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
        for b in file.bytes() {
            fnv ^= u64::from(b);
            fnv = fnv.wrapping_mul(0x0100_0000_01b3);
        }
        let crc = crc32fast::hash(file.as_bytes());
        self.dir.join("blocks").join(format!("{fnv:016x}{crc:08x}"))
    }

    fn block_path(&self, key: &BlockKey) -> PathBuf {
        self.file_dir(&key.file).join(key.block.to_string())
    }

    /// The size and modification time of `file`, if known.
    fn meta(&self, file: &Arc<str>) -> Option<(u64, DateTime<Utc>)> {
        self.lock().files.get(file).and_then(|f| f.meta)
    }

    fn remember_meta(&self, file: &Arc<str>, meta: (u64, DateTime<Utc>)) {
        self.lock().files.entry(Arc::clone(file)).or_default().meta = Some(meta);
    }

    fn paused(&self) -> bool {
        let paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        paused.is_some_and(|until| Instant::now() < until)
    }

    /// Drop every block of `file` (a write or delete reached it).
    pub fn forget(&self, file: &str) {
        let mut inner = self.lock();
        let keys: Vec<BlockKey> = inner
            .blocks
            .keys()
            .filter(|k| &*k.file == file)
            .cloned()
            .collect();
        for key in &keys {
            inner.remove(key);
        }
        inner.files.remove(file);
        drop(inner);
        let _ = std::fs::remove_dir_all(self.file_dir(file));
    }

    /// The blocks `wanted` of `file` (`size` bytes): from the disk where
    /// good, else from `store` at `location`, and then kept.
    async fn blocks(
        self: &Arc<Self>,
        store: &dyn ObjectStore,
        file: &Arc<str>,
        location: &Path,
        (size, modified): (u64, DateTime<Utc>),
        wanted: &BTreeSet<u64>,
    ) -> Result<HashMap<u64, Bytes>> {
        let priority = super::current_priority();
        let on_disk: Vec<BlockKey> = {
            let inner = self.lock();
            wanted
                .iter()
                .map(|&block| BlockKey {
                    file: Arc::clone(file),
                    block,
                })
                .filter(|k| inner.blocks.get(k).is_some_and(|b| !b.writing))
                .collect()
        };
        let mut got: HashMap<u64, Bytes> = HashMap::new();
        if !on_disk.is_empty() {
            let tier = Arc::clone(self);
            let reads = on_disk
                .iter()
                .map(|key| {
                    let length = block_length(size, key.block);
                    (key.clone(), self.block_path(key), length)
                })
                .collect::<Vec<_>>();
            let found = tokio::task::spawn_blocking(move || {
                reads
                    .into_iter()
                    .map(|(key, path, length)| {
                        let found = read_block(&path, &key.file, size, length);
                        (key, found, path)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| generic(format!("reading the cache disk: {e}")))?;
            let mut bad = Vec::new();
            {
                let mut inner = tier.lock();
                for (key, found, path) in found {
                    match found {
                        Found::Good(bytes) => {
                            if let Some(block) = inner.blocks.get(&key) {
                                let old = (block.priority, block.last_used, key.clone());
                                let promoted = block.priority.max(priority);
                                inner.tick += 1;
                                let tick = inner.tick;
                                inner.order.remove(&old);
                                inner.order.insert((promoted, tick, key.clone()));
                                if let Some(block) = inner.blocks.get_mut(&key) {
                                    block.priority = promoted;
                                    block.last_used = tick;
                                }
                            }
                            got.insert(key.block, bytes);
                        }
                        Found::Gone => {
                            inner.remove(&key);
                        }
                        Found::Bad(why) => {
                            if inner.remove(&key) {
                                log::warn!(
                                    "cache disk: block {} of {} is damaged ({why}); reading it again from the storage",
                                    key.block,
                                    key.file
                                );
                                self.repairs.fetch_add(1, Ordering::Relaxed);
                                inner.files.entry(Arc::clone(file)).or_default().repairs += 1;
                                bad.push(path);
                            }
                        }
                    }
                }
                let hits = got.len() as u64;
                let misses = (wanted.len() - got.len()) as u64;
                let counts = inner.files.entry(Arc::clone(file)).or_default();
                counts.hits += hits;
                counts.misses += misses;
                self.hits.fetch_add(hits, Ordering::Relaxed);
                self.misses.fetch_add(misses, Ordering::Relaxed);
            }
            for path in bad {
                let _ = std::fs::remove_file(path);
            }
        } else {
            let misses = wanted.len() as u64;
            self.lock()
                .files
                .entry(Arc::clone(file))
                .or_default()
                .misses += misses;
            self.misses.fetch_add(misses, Ordering::Relaxed);
        }

        // The rest from the storage, one range per run of blocks.
        let missing: Vec<u64> = wanted
            .iter()
            .copied()
            .filter(|b| !got.contains_key(b))
            .collect();
        if missing.is_empty() {
            return Ok(got);
        }
        let mut runs: Vec<Range<u64>> = Vec::new();
        for &block in &missing {
            match runs.last_mut() {
                Some(run) if run.end == block => run.end += 1,
                _ => runs.push(block..block + 1),
            }
        }
        let ranges: Vec<Range<u64>> = runs
            .iter()
            .map(|r| r.start * BLOCK_BYTES..(r.end * BLOCK_BYTES).min(size))
            .collect();
        let fetched = store.get_ranges(location, &ranges).await?;
        let mut fresh = Vec::new();
        for ((run, range), bytes) in runs.iter().zip(&ranges).zip(fetched) {
            if bytes.len() as u64 != range.end - range.start {
                return Err(generic(format!(
                    "{location}: asked the storage for {} bytes at {}, got {}",
                    range.end - range.start,
                    range.start,
                    bytes.len()
                )));
            }
            for block in run.clone() {
                let start = ((block - run.start) * BLOCK_BYTES) as usize;
                let end = (start as u64 + block_length(size, block)) as usize;
                let piece = bytes.slice(start..end);
                fresh.push((block, piece.clone()));
                got.insert(block, piece);
            }
        }
        self.keep(file, (size, modified), priority, fresh).await;
        Ok(got)
    }

    /// Write fetched blocks to the disk where the budget has room for them;
    /// a failed write pauses the tier (see the module docs).
    async fn keep(
        self: &Arc<Self>,
        file: &Arc<str>,
        (size, modified): (u64, DateTime<Utc>),
        priority: Priority,
        blocks: Vec<(u64, Bytes)>,
    ) {
        if self.paused() {
            return;
        }
        let header_bytes = (HEADER_FIXED + file.len()) as u64;
        let mut writes = Vec::new();
        let mut victims = Vec::new();
        {
            let mut inner = self.lock();
            for (block, bytes) in blocks {
                let key = BlockKey {
                    file: Arc::clone(file),
                    block,
                };
                if inner.blocks.contains_key(&key) {
                    continue;
                }
                let need = header_bytes + bytes.len() as u64;
                let mut freed = 0u64;
                let mut chosen = Vec::new();
                for (p, _, victim) in inner.order.iter() {
                    if inner.used - freed + need <= self.budget {
                        break;
                    }
                    if *p > priority {
                        break; // all that follow are better still
                    }
                    if inner.blocks.get(victim).is_some_and(|b| b.writing) {
                        continue;
                    }
                    freed += inner.blocks.get(victim).map_or(0, |b| b.bytes);
                    chosen.push(victim.clone());
                }
                if inner.used - freed + need > self.budget {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                for victim in chosen {
                    inner.remove(&victim);
                    victims.push(self.block_path(&victim));
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                }
                inner.add(key.clone(), need, priority, true);
                writes.push((self.block_path(&key), key, bytes));
            }
        }
        if writes.is_empty() && victims.is_empty() {
            return;
        }
        let tier = Arc::clone(self);
        let name = Arc::clone(file);
        let written = tokio::task::spawn_blocking(move || {
            for victim in victims {
                let _ = std::fs::remove_file(victim);
            }
            let mut results = Vec::new();
            let mut failed: Option<String> = None;
            for (path, key, bytes) in writes {
                // After one failure the rest would fail too: skip them.
                let result = match &failed {
                    Some(e) => Err(e.clone()),
                    None => write_block(&path, &name, size, modified, &bytes),
                };
                if let Err(e) = &result {
                    failed.get_or_insert_with(|| e.clone());
                }
                results.push((key, result.is_ok()));
            }
            (results, failed)
        })
        .await;
        let Ok((results, failed)) = written else {
            return;
        };
        {
            let mut inner = tier.lock();
            for (key, ok) in results {
                if ok {
                    if let Some(block) = inner.blocks.get_mut(&key) {
                        block.writing = false;
                    }
                    tier.inserted.fetch_add(1, Ordering::Relaxed);
                } else {
                    inner.remove(&key);
                }
            }
        }
        if let Some(e) = failed {
            tier.write_failures.fetch_add(1, Ordering::Relaxed);
            let mut paused = tier.paused_until.lock().unwrap_or_else(|e| e.into_inner());
            *paused = Some(Instant::now() + PAUSE_AFTER_WRITE_FAILURE);
            log::warn!(
                "cache disk {}: cannot write ({e}); reading from the storage without the disk tier for {} s",
                tier.dir.display(),
                PAUSE_AFTER_WRITE_FAILURE.as_secs()
            );
        }
    }

    pub fn totals(&self) -> DiskTotals {
        let inner = self.lock();
        DiskTotals {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            inserted: self.inserted.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            write_failures: self.write_failures.load(Ordering::Relaxed),
            bytes: inner.used,
            blocks: inner.blocks.len() as u64,
        }
    }

    /// Blocks, bytes, hits, misses and repairs by file (`cirro.cache`).
    pub fn by_file(&self) -> Vec<(String, FileCounts)> {
        let inner = self.lock();
        let mut files: HashMap<&Arc<str>, FileCounts> = HashMap::new();
        for (key, block) in &inner.blocks {
            files
                .entry(&key.file)
                .or_default()
                .add_entry(block.bytes, block.priority);
        }
        for (file, info) in &inner.files {
            if info.hits + info.misses + info.repairs == 0 && !files.contains_key(file) {
                continue;
            }
            let counts = files.entry(file).or_default();
            counts.hits = info.hits;
            counts.misses = info.misses;
            counts.repairs = info.repairs;
        }
        FileCounts::rows(files)
    }
}

/// Bytes of block `block` of a file of `size` bytes.
fn block_length(size: u64, block: u64) -> u64 {
    (size - block * BLOCK_BYTES).min(BLOCK_BYTES)
}

fn generic(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "cache disk",
        source: message.into(),
    }
}

fn encode_header(name: &str, size: u64, modified: DateTime<Utc>, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_FIXED + name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&modified.timestamp_millis().to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

struct Header {
    crc: u32,
    name: String,
    length: u64,
    size: u64,
    modified: DateTime<Utc>,
}

fn parse_header(bytes: &[u8]) -> Option<Header> {
    if bytes.len() < HEADER_FIXED || &bytes[..8] != MAGIC {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let name_len = u32_at(12) as usize;
    if name_len > NAME_MAX || bytes.len() < HEADER_FIXED + name_len {
        return None;
    }
    let name = std::str::from_utf8(&bytes[HEADER_FIXED..HEADER_FIXED + name_len]).ok()?;
    Some(Header {
        crc: u32_at(8),
        name: name.to_string(),
        length: u64_at(16),
        size: u64_at(24),
        modified: DateTime::from_timestamp_millis(u64_at(32) as i64)?,
    })
}

/// The header of the block file at `path`: (file, file size, modified, block length).
fn read_header(path: &FsPath) -> Option<(String, u64, DateTime<Utc>, u64)> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut fixed = vec![0u8; HEADER_FIXED];
    file.read_exact(&mut fixed).ok()?;
    let name_len = u32::from_le_bytes(fixed[12..16].try_into().ok()?) as usize;
    if name_len > NAME_MAX {
        return None;
    }
    let mut rest = vec![0u8; name_len];
    file.read_exact(&mut rest).ok()?;
    fixed.extend_from_slice(&rest);
    let header = parse_header(&fixed)?;
    Some((header.name, header.size, header.modified, header.length))
}

/// Read and check the block file at `path`: it must be block of `file`
/// (`size` bytes) with `length` bytes and the CRC its header gives.
fn read_block(path: &FsPath, file: &str, size: u64, length: u64) -> Found {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Gone,
        Err(e) => return Found::Bad(format!("cannot read it: {e}")),
    };
    let Some(header) = parse_header(&bytes) else {
        return Found::Bad("no valid header".into());
    };
    if header.name != file || header.size != size {
        return Found::Bad(format!(
            "it belongs to {} ({} bytes)",
            header.name, header.size
        ));
    }
    let start = HEADER_FIXED + header.name.len();
    let payload = &bytes[start..];
    if header.length != length || payload.len() as u64 != length {
        return Found::Bad(format!(
            "{} bytes where {length} were written",
            payload.len()
        ));
    }
    if crc32fast::hash(payload) != header.crc {
        return Found::Bad("checksum mismatch".into());
    }
    Found::Good(Bytes::from(bytes).slice(start..))
}

/// Write one block file: to a temporary name, then renamed, so a reader
/// never sees half a block under the real name.
fn write_block(
    path: &FsPath,
    name: &str,
    size: u64,
    modified: DateTime<Utc>,
    payload: &[u8],
) -> std::result::Result<(), String> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(path);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let temporary = path.with_extension("tmp");
    let result = (|| {
        let mut out = std::fs::File::create(&temporary)?;
        out.write_all(&encode_header(name, size, modified, payload))?;
        out.write_all(payload)?;
        drop(out);
        std::fs::rename(&temporary, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&temporary);
        return Err(e.to_string());
    }
    Ok(())
}

/// `inner` with reads of table data files through the disk tier (see the
/// module docs); everything else passes straight through.
#[derive(Debug)]
pub struct DiskCached {
    inner: Arc<dyn ObjectStore>,
    tier: Arc<DiskTier>,
    /// The store's URL (`hdfs://nn:8020`, `s3://bucket`): with an object's
    /// path, the name of a file in the tier.
    root: String,
}

impl std::fmt::Display for DiskCached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (cached in {})", self.inner, self.tier.dir.display())
    }
}

impl DiskCached {
    pub fn new(inner: Arc<dyn ObjectStore>, tier: Arc<DiskTier>, root: impl Into<String>) -> Self {
        Self {
            inner,
            tier,
            root: root.into().trim_end_matches('/').to_string(),
        }
    }

    /// Whether reads of `location` go through the tier: table data files.
    fn cacheable(location: &Path) -> bool {
        let path = location.as_ref();
        path.ends_with(".parquet") && !path.split('/').any(|part| part == "_delta_log")
    }

    fn name(&self, location: &Path) -> Arc<str> {
        Arc::from(format!("{}/{}", self.root, location))
    }

    /// The size and modification time of the file at `location`.
    async fn meta(&self, name: &Arc<str>, location: &Path) -> Result<(u64, DateTime<Utc>)> {
        if let Some(meta) = self.tier.meta(name) {
            return Ok(meta);
        }
        let head = self.inner.head(location).await?;
        let meta = (head.size, head.last_modified);
        self.tier.remember_meta(name, meta);
        Ok(meta)
    }

    fn forget(&self, location: &Path) {
        if Self::cacheable(location) {
            self.tier.forget(&self.name(location));
        }
    }
}

/// The blocks that cover `ranges`.
fn covering(ranges: &[Range<u64>]) -> BTreeSet<u64> {
    ranges
        .iter()
        .flat_map(|r| r.start / BLOCK_BYTES..=(r.end - 1) / BLOCK_BYTES)
        .collect()
}

/// The bytes of `range` from the blocks that cover it.
fn assemble(blocks: &HashMap<u64, Bytes>, range: &Range<u64>) -> Result<Bytes> {
    let (first, last) = (range.start / BLOCK_BYTES, (range.end - 1) / BLOCK_BYTES);
    let piece = |block: u64| {
        blocks
            .get(&block)
            .ok_or_else(|| generic(format!("block {block} went missing")))
    };
    if first == last {
        let at = first * BLOCK_BYTES;
        return Ok(piece(first)?.slice((range.start - at) as usize..(range.end - at) as usize));
    }
    let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
    for block in first..=last {
        let at = block * BLOCK_BYTES;
        let bytes = piece(block)?;
        let start = (range.start.max(at) - at) as usize;
        let end = ((range.end.min(at + bytes.len() as u64)) - at) as usize;
        out.extend_from_slice(&bytes[start..end]);
    }
    Ok(out.freeze())
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for DiskCached {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.forget(location);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.forget(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let plain = options.if_match.is_none()
            && options.if_none_match.is_none()
            && options.if_modified_since.is_none()
            && options.if_unmodified_since.is_none()
            && options.version.is_none()
            && !options.head;
        if !plain || !Self::cacheable(location) {
            return self.inner.get_opts(location, options).await;
        }
        let name = self.name(location);
        let (size, modified) = self.meta(&name, location).await?;
        let range = match &options.range {
            None if size > 0 => 0..size,
            None => return self.inner.get_opts(location, options).await,
            Some(range) => match range.as_range(size) {
                Ok(r) if r.start < r.end => r,
                // Let the storage give its own error.
                _ => return self.inner.get_opts(location, options).await,
            },
        };
        let blocks = self
            .tier
            .blocks(
                self.inner.as_ref(),
                &name,
                location,
                (size, modified),
                &covering(std::slice::from_ref(&range)),
            )
            .await?;
        let bytes = assemble(&blocks, &range)?;
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(bytes) }).boxed()),
            meta: ObjectMeta {
                location: location.clone(),
                last_modified: modified,
                size,
                e_tag: None,
                version: None,
            },
            range,
            attributes: Default::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if !Self::cacheable(location) || ranges.is_empty() {
            return self.inner.get_ranges(location, ranges).await;
        }
        let name = self.name(location);
        let (size, modified) = self.meta(&name, location).await?;
        if ranges.iter().any(|r| r.start >= r.end || r.end > size) {
            return self.inner.get_ranges(location, ranges).await;
        }
        let blocks = self
            .tier
            .blocks(
                self.inner.as_ref(),
                &name,
                location,
                (size, modified),
                &covering(ranges),
            )
            .await?;
        ranges.iter().map(|r| assemble(&blocks, r)).collect()
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let (tier, root) = (Arc::clone(&self.tier), self.root.clone());
        self.inner
            .delete_stream(locations)
            .inspect(move |deleted| {
                if let Ok(location) = deleted
                    && Self::cacheable(location)
                {
                    tier.forget(&format!("{root}/{location}"));
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.forget(to);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.forget(to);
        let result = self.inner.rename_opts(from, to, options).await;
        self.forget(from);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::GetRange;
    use object_store::memory::InMemory;

    /// A file of `len` bytes whose every byte differs from its neighbours'.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    async fn setup(budget: u64) -> (tempfile::TempDir, Arc<DiskTier>, DiskCached, Vec<u8>) {
        let dir = tempfile::tempdir().expect("dir");
        let tier = Arc::new(DiskTier::open(dir.path(), budget).expect("tier"));
        let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let data = pattern((3 * BLOCK_BYTES + 12_345) as usize, 7);
        memory
            .put(&Path::from("t/a.parquet"), PutPayload::from(data.clone()))
            .await
            .expect("put");
        memory
            .put(
                &Path::from("t/_delta_log/0.json"),
                PutPayload::from_static(b"{}"),
            )
            .await
            .expect("put");
        let store = DiskCached::new(memory, Arc::clone(&tier), "mem://x/");
        (dir, tier, store, data)
    }

    async fn read_whole(store: &DiskCached, path: &Path) -> Bytes {
        let got = store.get(path).await.expect("get");
        got.bytes().await.expect("bytes")
    }

    fn block_files(dir: &FsPath) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("blocks"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .collect();
        files.sort();
        files
    }

    #[tokio::test]
    async fn reads_come_back_from_the_disk_the_same() {
        let (dir, tier, store, data) = setup(1 << 30).await;
        let path = Path::from("t/a.parquet");
        let size = data.len() as u64;
        let ranges = [
            0..10,
            100..BLOCK_BYTES + 5,
            BLOCK_BYTES - 1..3 * BLOCK_BYTES + 2,
            size - 8..size,
        ];
        for round in 0..2 {
            let got = store.get_ranges(&path, &ranges).await.expect("ranges");
            for (r, bytes) in ranges.iter().zip(got) {
                assert_eq!(&bytes[..], &data[r.start as usize..r.end as usize], "{r:?}");
            }
            let suffix = store
                .get_opts(
                    &path,
                    GetOptions {
                        range: Some(GetRange::Suffix(64)),
                        ..Default::default()
                    },
                )
                .await
                .expect("suffix");
            assert_eq!(suffix.range, size - 64..size);
            assert_eq!(suffix.meta.size, size);
            assert_eq!(
                &suffix.bytes().await.expect("bytes")[..],
                &data[data.len() - 64..]
            );
            let whole = read_whole(&store, &path).await;
            assert_eq!(&whole[..], &data[..]);
            let totals = tier.totals();
            if round == 0 {
                assert_eq!(totals.blocks, 4, "{totals:?}");
                assert_eq!(totals.inserted, 4, "{totals:?}");
            } else {
                assert_eq!(totals.misses, 4, "only the first reads missed: {totals:?}");
            }
        }
        assert_eq!(block_files(dir.path()).len(), 4);
        // The log is not cached.
        let log = store
            .get(&Path::from("t/_delta_log/0.json"))
            .await
            .expect("log");
        assert_eq!(&log.bytes().await.expect("bytes")[..], b"{}");
        assert_eq!(tier.totals().blocks, 4);
        let rows = tier.by_file();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].0, "mem://x/t/a.parquet");
        assert_eq!(rows[0].1.entries, 4);
        assert!(rows[0].1.hits > 0);
    }

    #[tokio::test]
    async fn damaged_blocks_are_read_again_from_the_storage() {
        let (dir, tier, store, data) = setup(1 << 30).await;
        let path = Path::from("t/a.parquet");
        read_whole(&store, &path).await;
        let files = block_files(dir.path());
        assert_eq!(files.len(), 4);
        // One block with a flipped byte, one cut short, one emptied, one
        // with another file's name in its header.
        let mut flipped = std::fs::read(&files[0]).expect("read");
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        std::fs::write(&files[0], flipped).expect("write");
        let cut = std::fs::read(&files[1]).expect("read");
        std::fs::write(&files[1], &cut[..cut.len() / 2]).expect("write");
        std::fs::write(&files[2], b"").expect("write");
        let good = std::fs::read(&files[3]).expect("read");
        let header = parse_header(&good).expect("header");
        let payload = &good[HEADER_FIXED + header.name.len()..];
        let mut other = encode_header("mem://x/t/b.parquet", header.size, header.modified, payload);
        other.extend_from_slice(payload);
        std::fs::write(&files[3], other).expect("write");

        let whole = read_whole(&store, &path).await;
        assert_eq!(&whole[..], &data[..]);
        assert_eq!(tier.totals().repairs, 4, "{:?}", tier.totals());
        // Written again, good this time.
        let again = read_whole(&store, &path).await;
        assert_eq!(&again[..], &data[..]);
        let totals = tier.totals();
        assert_eq!(totals.repairs, 4, "{totals:?}");
        assert_eq!(totals.hits, 4, "{totals:?}");
        assert_eq!(tier.by_file()[0].1.repairs, 4);
    }

    #[tokio::test]
    async fn the_budget_evicts_and_a_restart_finds_the_blocks() {
        let block_file = HEADER_FIXED as u64 + "mem://x/t/a.parquet".len() as u64 + BLOCK_BYTES;
        let (dir, tier, store, data) = setup(2 * block_file).await;
        let path = Path::from("t/a.parquet");
        let whole = read_whole(&store, &path).await;
        assert_eq!(&whole[..], &data[..]);
        let totals = tier.totals();
        assert!(totals.bytes <= 2 * block_file, "{totals:?}");
        assert_eq!(totals.blocks, 2, "{totals:?}");
        assert_eq!(block_files(dir.path()).len(), 2);
        // A leftover temporary file is not a block.
        let files = block_files(dir.path());
        std::fs::write(files[0].with_extension("tmp"), b"half").expect("write");

        let reopened = Arc::new(DiskTier::open(dir.path(), 2 * block_file).expect("tier"));
        assert_eq!(reopened.totals().blocks, 2);
        assert_eq!(block_files(dir.path()).len(), 2);
        let store = DiskCached::new(Arc::clone(&store.inner), Arc::clone(&reopened), "mem://x");
        // One read larger than the budget kept the blocks that fitted first.
        let head = store.get_range(&path, 0..100).await.expect("range");
        assert_eq!(&head[..], &data[..100]);
        assert_eq!(reopened.totals().hits, 1, "{:?}", reopened.totals());
        assert_eq!(reopened.totals().misses, 0, "{:?}", reopened.totals());
        // A smaller budget at the next start drops the oldest.
        let smaller = DiskTier::open(dir.path(), block_file).expect("tier");
        assert_eq!(smaller.totals().blocks, 1);
        assert_eq!(block_files(dir.path()).len(), 1);
    }

    #[tokio::test]
    async fn writes_and_deletes_drop_the_files_blocks() {
        let (_dir, tier, store, _) = setup(1 << 30).await;
        let path = Path::from("t/a.parquet");
        read_whole(&store, &path).await;
        assert_eq!(tier.totals().blocks, 4);
        let other = pattern(5000, 99);
        store
            .put(&path, PutPayload::from(other.clone()))
            .await
            .expect("put");
        assert_eq!(tier.totals().blocks, 0);
        let got = read_whole(&store, &path).await;
        assert_eq!(&got[..], &other[..]);
        assert_eq!(tier.totals().blocks, 1);
        store.delete(&path).await.expect("delete");
        assert_eq!(tier.totals().blocks, 0);
        assert!(store.get(&path).await.is_err());
    }

    #[tokio::test]
    async fn a_disk_that_cannot_be_written_degrades_to_uncached_reads() {
        let (dir, tier, store, data) = setup(1 << 30).await;
        // The blocks folder replaced by a file: every write fails.
        std::fs::remove_dir_all(dir.path().join("blocks")).expect("rm");
        std::fs::write(dir.path().join("blocks"), b"not a folder").expect("write");
        let path = Path::from("t/a.parquet");
        for _ in 0..2 {
            let whole = read_whole(&store, &path).await;
            assert_eq!(&whole[..], &data[..]);
        }
        let totals = tier.totals();
        assert_eq!(
            totals.write_failures, 1,
            "paused after the first: {totals:?}"
        );
        assert_eq!(totals.blocks, 0, "{totals:?}");
        assert_eq!(totals.hits, 0, "{totals:?}");
    }
}
