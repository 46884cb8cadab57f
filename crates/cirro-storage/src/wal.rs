//! A write-ahead log: records appended, made durable by group commit, and
//! read back after a crash.
//!
//! The Kudu idea (`../shared/papers/kudu-fast-networks-bpoe8.txt`): a small
//! write is acknowledged once its log record is on disk, and reaches the
//! table's Parquet files later, in a background flush that records the log
//! position it covers. This module is the log; what a record holds is its
//! writer's business (bytes to the log).
//!
//! Layout: a directory of segment files, `<first LSN, 20 digits>.wal`, and a
//! `LOCK` file that one process holds (`flock`) while the log is open. A
//! segment starts with a header and continues with records:
//!
//! ```text
//! header:  magic "CIRROWAL" | version: u32 | first LSN: u64 | CRC-32 of those: u32
//! record:  payload length: u32 | CRC-32 of LSN and payload: u32 | LSN: u64 | payload
//! ```
//!
//! (little-endian). LSNs count records from 1, without gaps.
//!
//! **Opening** reads every segment up to its last whole record whose checksum
//! holds and whose LSN follows the one before. In the last segment what follows
//! is a record torn by a crash mid-write (or never acknowledged): it is cut
//! off, so that new records follow the last good one. In an older segment it
//! is corruption (XX001): a segment is left behind only once its records are
//! on disk.
//!
//! **Group commit.** One thread owns the open segment. Appenders hand it
//! their records and wait; it takes every record waiting, writes them with
//! one write and makes them durable with one `fdatasync`, then answers each
//! appender with its LSN. A record appended with `sync = false` (PostgreSQL's
//! `synchronous_commit = off`) is answered once written, before the sync; the
//! thread syncs such records within [`SYNC_DELAY`] (PostgreSQL's
//! `wal_writer_delay`), so a crash of the process loses none of them and a
//! crash of the machine at most that much.
//!
//! **Failures.** A write that fails (a full disk: 53100) fails every record
//! of that write and changes nothing: the segment is cut back to its last
//! good record. A failed `fdatasync`, or a failed cut, leaves the log unsure
//! of what is on disk: it then refuses every later append (58030) until the
//! process opens it again (PostgreSQL stops the server for the same reason).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use cirro_common::{CirroError, Result, SqlState};
use tokio::sync::oneshot;

/// A record's log sequence number: 1 for the first record of a log, then
/// one more for each.
pub type Lsn = u64;

const MAGIC: &[u8; 8] = b"CIRROWAL";
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 24;
const RECORD_HEADER_BYTES: usize = 16;
const EXTENSION: &str = "wal";

/// How long a record appended without sync may wait for its sync.
pub const SYNC_DELAY: Duration = Duration::from_millis(200);

/// The most bytes one group commit writes; the records waiting beyond it go
/// in the next write.
const BATCH_BYTES: usize = 16 << 20;

/// The largest record: its length must fit the length field, and one record
/// must fit a segment's batch.
pub const MAX_RECORD_BYTES: usize = BATCH_BYTES - RECORD_HEADER_BYTES;

/// How a log is kept.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// A segment takes records until it holds this many bytes; the next
    /// record starts a new one. Only whole segments are removed.
    pub segment_bytes: u64,
    /// The LSN of a new log's first record (a directory with no segment):
    /// past every position the log's user has already consumed, so that a
    /// log made again never reuses one.
    pub start: Lsn,
}

impl Default for WalOptions {
    fn default() -> Self {
        Self {
            segment_bytes: 64 << 20,
            start: 1,
        }
    }
}

/// A record read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub lsn: Lsn,
    pub payload: Vec<u8>,
}

/// What the log has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended (acknowledged).
    pub records: u64,
    /// Writes made: one per group of records.
    pub writes: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// The LSN the next record gets.
    pub next_lsn: Lsn,
    /// The highest LSN known to be on disk.
    pub synced_lsn: Lsn,
}

#[derive(Default)]
struct Counters {
    records: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    next_lsn: AtomicU64,
    synced_lsn: AtomicU64,
}

enum Request {
    Append {
        payload: Vec<u8>,
        sync: bool,
        reply: oneshot::Sender<Result<Lsn>>,
    },
    /// Remove the segments whose records all come before the LSN.
    RemoveBefore {
        lsn: Lsn,
        reply: oneshot::Sender<Result<usize>>,
    },
}

/// An open write-ahead log (see the module documentation).
pub struct Wal {
    dir: PathBuf,
    requests: Option<Sender<Request>>,
    counters: Arc<Counters>,
    writer: Option<JoinHandle<()>>,
    // Held (with its flock) while the log is open.
    _lock: File,
}

/// A log just opened, with its records from the LSN asked for.
#[derive(Debug)]
pub struct Opened {
    pub wal: Wal,
    pub records: Vec<Record>,
    /// Whether the log was made now (its directory held no segment).
    pub new: bool,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("dir", &self.dir).finish()
    }
}

impl Wal {
    /// Open the log in `dir` (created if missing), cutting off a torn tail,
    /// and read back its records from LSN `from` on. 55P03 if another
    /// process has it open; XX001 if a record before the last segment's
    /// tail is damaged.
    pub fn open(dir: &Path, from: Lsn, options: WalOptions) -> Result<Opened> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "create", e))?;
        let lock = lock_dir(dir)?;
        let mut segments = list_segments(dir)?;
        let mut records = Vec::new();
        let mut expected: Option<Lsn> = None;
        let count = segments.len();
        for (i, segment) in segments.iter_mut().enumerate() {
            let last = i + 1 == count;
            let scan = scan_segment(&segment.path, segment.first, expected, from, &mut records)?;
            match scan {
                Scan::Whole { end, next } => {
                    segment.end = end;
                    expected = Some(next);
                }
                Scan::Torn { end, next } if last => {
                    cut(&segment.path, end)?;
                    segment.end = end;
                    expected = Some(next);
                }
                Scan::Torn { .. } => {
                    return Err(CirroError::new(
                        SqlState::DATA_CORRUPTED,
                        format!(
                            "write-ahead log {}: a damaged record before its last segment",
                            segment.path.display()
                        ),
                    ));
                }
                // A header torn while the segment was being started: it
                // holds no record yet, so it starts again.
                Scan::NoHeader if last => {
                    std::fs::remove_file(&segment.path)
                        .map_err(|e| io_error(&segment.path, "remove", e))?;
                    segment.end = 0;
                }
                Scan::NoHeader => {
                    return Err(CirroError::new(
                        SqlState::DATA_CORRUPTED,
                        format!(
                            "write-ahead log {}: a damaged segment header",
                            segment.path.display()
                        ),
                    ));
                }
            }
        }
        segments.retain(|s| s.end > 0);
        let new = segments.is_empty();
        let next = expected.unwrap_or(options.start.max(1));
        let open = match segments.pop() {
            Some(s) => OpenSegment {
                file: OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&s.path)
                    .map_err(|e| io_error(&s.path, "open", e))?,
                first: s.first,
                end: s.end,
            },
            None => OpenSegment::create(dir, next)?,
        };
        let counters = Arc::new(Counters::default());
        counters.next_lsn.store(next, Ordering::SeqCst);
        counters.synced_lsn.store(next - 1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            dir: dir.to_path_buf(),
            options,
            closed: segments.into_iter().map(|s| s.first).collect(),
            open,
            next,
            unsynced: false,
            broken: None,
            counters: Arc::clone(&counters),
        };
        let handle = std::thread::Builder::new()
            .name("cirro-wal".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| CirroError::io(format!("write-ahead log: start its writer: {e}")))?;
        Ok(Opened {
            wal: Wal {
                dir: dir.to_path_buf(),
                requests: Some(tx),
                counters,
                writer: Some(handle),
                _lock: lock,
            },
            records,
            new,
        })
    }

    /// The directory the log is in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Append `payload` as one record; its LSN once it is on disk (`sync`),
    /// or once written (`sync = false`, synced within [`SYNC_DELAY`]).
    pub async fn append(&self, payload: Vec<u8>, sync: bool) -> Result<Lsn> {
        let reply = self.send_append(payload, sync)?;
        reply.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// [`Wal::append`] for a caller outside an async runtime.
    pub fn append_blocking(&self, payload: Vec<u8>, sync: bool) -> Result<Lsn> {
        let reply = self.send_append(payload, sync)?;
        reply.blocking_recv().unwrap_or_else(|_| Err(stopped()))
    }

    fn send_append(&self, payload: Vec<u8>, sync: bool) -> Result<oneshot::Receiver<Result<Lsn>>> {
        if payload.len() > MAX_RECORD_BYTES {
            return Err(CirroError::new(
                SqlState::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "a write-ahead log record of {} bytes; the most is {MAX_RECORD_BYTES}",
                    payload.len()
                ),
            ));
        }
        let (reply, answer) = oneshot::channel();
        self.send(Request::Append {
            payload,
            sync,
            reply,
        })?;
        Ok(answer)
    }

    /// Remove the segments whose records all come before `lsn` (a flush has
    /// put them in the tables); the open segment stays. How many went.
    pub async fn remove_before(&self, lsn: Lsn) -> Result<usize> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::RemoveBefore { lsn, reply })?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn send(&self, request: Request) -> Result<()> {
        self.requests
            .as_ref()
            .and_then(|tx| tx.send(request).ok())
            .ok_or_else(stopped)
    }

    pub fn stats(&self) -> WalStats {
        let c = &self.counters;
        WalStats {
            records: c.records.load(Ordering::SeqCst),
            writes: c.writes.load(Ordering::SeqCst),
            syncs: c.syncs.load(Ordering::SeqCst),
            next_lsn: c.next_lsn.load(Ordering::SeqCst),
            synced_lsn: c.synced_lsn.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Wal {
    /// Stop the writer once it has written and synced what it was given.
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

fn stopped() -> CirroError {
    CirroError::io("the write-ahead log's writer has stopped")
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> CirroError {
    CirroError::io(format!("write-ahead log {}: {what}: {e}", path.display()))
}

/// Take the directory's `LOCK` file for this process (55P03 if another has it).
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, "open", e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(CirroError::new(
                SqlState::LOCK_NOT_AVAILABLE,
                format!(
                    "write-ahead log {}: another process has it open",
                    dir.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&path, "lock", e)),
    }
    Ok(file)
}

struct Segment {
    path: PathBuf,
    first: Lsn,
    /// Where its good records end (0: none, not even a header).
    end: u64,
}

fn segment_path(dir: &Path, first: Lsn) -> PathBuf {
    dir.join(format!("{first:020}.{EXTENSION}"))
}

/// The directory's segments in LSN order.
fn list_segments(dir: &Path) -> Result<Vec<Segment>> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, "list", e))? {
        let entry = entry.map_err(|e| io_error(dir, "list", e))?;
        let name = entry.file_name();
        let Some(first) = name
            .to_str()
            .and_then(|n| n.strip_suffix(&format!(".{EXTENSION}")))
            .and_then(|n| n.parse::<Lsn>().ok())
        else {
            continue;
        };
        segments.push(Segment {
            path: entry.path(),
            first,
            end: 0,
        });
    }
    segments.sort_by_key(|s| s.first);
    Ok(segments)
}

enum Scan {
    /// Every byte is a good record; `next` is the LSN after the last.
    Whole { end: u64, next: Lsn },
    /// Good records up to `end`, then a damaged or partial one.
    Torn { end: u64, next: Lsn },
    /// The header is missing or damaged.
    NoHeader,
}

fn header(first: Lsn) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&first.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

fn record_crc(lsn: Lsn, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// Append one record's bytes to `buf`.
fn encode(buf: &mut Vec<u8>, lsn: Lsn, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&record_crc(lsn, payload).to_le_bytes());
    buf.extend_from_slice(&lsn.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// Read the segment at `path`, named for LSN `first`; push its records from
/// LSN `from` on. `expected` is the LSN its first record must have (the
/// previous segment's next), if there was one.
fn scan_segment(
    path: &Path,
    first: Lsn,
    expected: Option<Lsn>,
    from: Lsn,
    records: &mut Vec<Record>,
) -> Result<Scan> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| io_error(path, "read", e))?;
    if bytes.len() < HEADER_BYTES as usize || bytes[..HEADER_BYTES as usize] != header(first) {
        return Ok(Scan::NoHeader);
    }
    if expected.is_some_and(|e| e != first) {
        return Err(CirroError::new(
            SqlState::DATA_CORRUPTED,
            format!(
                "write-ahead log {}: starts at record {first}, the one before ends before record {}",
                path.display(),
                expected.unwrap_or_default()
            ),
        ));
    }
    let mut pos = HEADER_BYTES as usize;
    let mut next = first;
    loop {
        if pos == bytes.len() {
            return Ok(Scan::Whole {
                end: pos as u64,
                next,
            });
        }
        let torn = Scan::Torn {
            end: pos as u64,
            next,
        };
        let Some(head) = bytes.get(pos..pos + RECORD_HEADER_BYTES) else {
            return Ok(torn);
        };
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        let lsn = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        let start = pos + RECORD_HEADER_BYTES;
        let Some(payload) = bytes.get(start..start + len) else {
            return Ok(torn);
        };
        if lsn != next || record_crc(lsn, payload) != crc {
            return Ok(torn);
        }
        if lsn >= from {
            records.push(Record {
                lsn,
                payload: payload.to_vec(),
            });
        }
        next += 1;
        pos = start + len;
    }
}

/// Cut the file at `path` to `end` bytes, durably.
fn cut(path: &Path, end: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error(path, "open", e))?;
    file.set_len(end)
        .and_then(|_| file.sync_all())
        .map_err(|e| io_error(path, "cut off a torn record", e))
}

/// Make a new file's name durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "sync", e))
}

struct OpenSegment {
    file: File,
    first: Lsn,
    end: u64,
}

impl OpenSegment {
    /// A new segment whose first record will be `first`, durably there.
    fn create(dir: &Path, first: Lsn) -> Result<Self> {
        let path = segment_path(dir, first);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_error(&path, "create", e))?;
        file.write_all_at(&header(first), 0)
            .and_then(|_| file.sync_all())
            .map_err(|e| io_error(&path, "start", e))?;
        sync_dir(dir)?;
        Ok(Self {
            file,
            first,
            end: HEADER_BYTES,
        })
    }
}

/// The thread that owns the open segment (see the module documentation).
struct Writer {
    dir: PathBuf,
    options: WalOptions,
    /// The first LSNs of the segments before the open one, in order.
    closed: Vec<Lsn>,
    open: OpenSegment,
    /// The LSN the next record gets.
    next: Lsn,
    /// Whether records were written that are not synced yet.
    unsynced: bool,
    /// Why the log refuses appends, once it does.
    broken: Option<String>,
    counters: Arc<Counters>,
}

struct Pending {
    payload: Vec<u8>,
    sync: bool,
    reply: oneshot::Sender<Result<Lsn>>,
}

impl Writer {
    fn run(mut self, requests: Receiver<Request>) {
        loop {
            let first = if self.unsynced {
                match requests.recv_timeout(SYNC_DELAY) {
                    Ok(r) => r,
                    Err(RecvTimeoutError::Timeout) => {
                        self.sync();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match requests.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            let mut batch = Vec::new();
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(request) = next.take() {
                match request {
                    Request::Append {
                        payload,
                        sync,
                        reply,
                    } => {
                        bytes += payload.len() + RECORD_HEADER_BYTES;
                        batch.push(Pending {
                            payload,
                            sync,
                            reply,
                        });
                    }
                    Request::RemoveBefore { lsn, reply } => {
                        // Records given before it are written first.
                        self.write(std::mem::take(&mut batch));
                        bytes = 0;
                        let _ = reply.send(self.remove_before(lsn));
                    }
                }
                if bytes < BATCH_BYTES {
                    next = requests.try_recv().ok();
                }
            }
            self.write(batch);
        }
        if self.unsynced {
            self.sync();
        }
    }

    /// Write `batch` (segment by segment), sync if any record asks for it,
    /// and answer every appender.
    fn write(&mut self, batch: Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        if let Some(why) = &self.broken {
            for p in batch {
                let _ = p.reply.send(Err(CirroError::io(why.clone())));
            }
            return;
        }
        let mut done: Vec<(Pending, Lsn)> = Vec::with_capacity(batch.len());
        let mut batch = batch.into_iter().peekable();
        while let Some(first) = batch.peek() {
            // A segment that holds records and has no room for the next
            // one is closed first.
            let size = (first.payload.len() + RECORD_HEADER_BYTES) as u64;
            if self.open.end > HEADER_BYTES
                && self.open.end + size > self.options.segment_bytes
                && let Err(e) = self.rotate()
            {
                for p in batch.by_ref() {
                    let _ = p.reply.send(Err(e.clone()));
                }
                break;
            }
            // The records that fit the open segment (at least one).
            let mut buf = Vec::new();
            let mut group = Vec::new();
            while let Some(p) = batch.peek() {
                let size = (p.payload.len() + RECORD_HEADER_BYTES) as u64;
                let used = self.open.end + buf.len() as u64;
                if !group.is_empty() && used + size > self.options.segment_bytes {
                    break;
                }
                let p = batch.next().expect("peeked");
                let lsn = self.next + group.len() as u64;
                encode(&mut buf, lsn, &p.payload);
                group.push((p, lsn));
            }
            if let Err(e) = self.write_group(&buf, group.len()) {
                for (p, _) in group.into_iter().chain(batch.by_ref().map(|p| (p, 0))) {
                    let _ = p.reply.send(Err(e.clone()));
                }
                break;
            }
            done.extend(group);
        }
        if done.iter().any(|(p, _)| p.sync) && self.unsynced {
            self.sync();
        }
        let failed = self.broken.clone();
        for (p, lsn) in done {
            let answer = match &failed {
                Some(why) if p.sync => Err(CirroError::io(why.clone())),
                _ => Ok(lsn),
            };
            if answer.is_ok() {
                self.counters.records.fetch_add(1, Ordering::SeqCst);
            }
            let _ = p.reply.send(answer);
        }
    }

    /// Write `buf`, holding `records` records, at the open segment's end;
    /// on failure cut the segment back (or, failing that, refuse every later
    /// append).
    fn write_group(&mut self, buf: &[u8], records: usize) -> Result<()> {
        let path = segment_path(&self.dir, self.open.first);
        match self.open.file.write_all_at(buf, self.open.end) {
            Ok(()) => {
                self.open.end += buf.len() as u64;
                self.next += records as u64;
                self.unsynced = true;
                self.counters.writes.fetch_add(1, Ordering::SeqCst);
                self.counters.next_lsn.store(self.next, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                let error = io_error(&path, "write", e);
                if let Err(cut) = self.open.file.set_len(self.open.end) {
                    self.broken = Some(format!(
                        "{error}; then cutting off what was written failed: {cut}"
                    ));
                }
                Err(error)
            }
        }
    }

    fn sync(&mut self) {
        match self.open.file.sync_data().and_then(|_| self.still_linked()) {
            Ok(()) => {
                self.unsynced = false;
                self.counters.syncs.fetch_add(1, Ordering::SeqCst);
                self.counters
                    .synced_lsn
                    .store(self.next - 1, Ordering::SeqCst);
            }
            Err(e) => {
                let path = segment_path(&self.dir, self.open.first);
                self.broken = Some(format!(
                    "{}; the log takes no more records until it is opened again",
                    io_error(&path, "sync", e)
                ));
            }
        }
    }

    /// Whether the open segment still has a name: a segment deleted under
    /// the log (its directory removed) takes writes and syncs them into a
    /// file no restart can read, so its records are not durable.
    fn still_linked(&self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if self.open.file.metadata()?.nlink() == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the segment was deleted (was the log's directory removed?)",
            ));
        }
        Ok(())
    }

    /// Close the open segment (synced) and start the next.
    fn rotate(&mut self) -> Result<()> {
        if self.unsynced {
            self.sync();
        }
        if let Some(why) = &self.broken {
            return Err(CirroError::io(why.clone()));
        }
        let segment = OpenSegment::create(&self.dir, self.next)?;
        self.closed.push(self.open.first);
        self.open = segment;
        Ok(())
    }

    fn remove_before(&mut self, lsn: Lsn) -> Result<usize> {
        // A closed segment's records end where the next one starts.
        let mut removed = 0;
        while self.closed.len() > removed {
            let next_first = self
                .closed
                .get(removed + 1)
                .copied()
                .unwrap_or(self.open.first);
            if next_first > lsn {
                break;
            }
            let path = segment_path(&self.dir, self.closed[removed]);
            std::fs::remove_file(&path).map_err(|e| io_error(&path, "remove", e))?;
            removed += 1;
        }
        self.closed.drain(..removed);
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
