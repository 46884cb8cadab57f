//! The hot-data tier: decoded Arrow column chunks of Parquet data files,
//! kept in memory under a budget (`--cache-memory`), with what enters and
//! what leaves chosen from the query plan.
//!
//! # What is cached
//! One entry is one column of one row group of one data file, decoded (the
//! array the Parquet reader produced, Utf8View strings and all): a scan that
//! finds every column it needs for a row group builds its batches from the
//! cache and never touches the file. Deletion vectors are applied when the
//! batches are built, from the scan's own snapshot; the entries hold the
//! file as written. Data files of a Delta table are never rewritten (a
//! change writes new files under new names), so an entry keyed by the
//! file's path and size can never be stale: the snapshot decides which
//! files a scan reads, and an entry of a file no snapshot names is only
//! dead weight. Commits that remove a file without adding it back (UPDATE,
//! OPTIMIZE, TRUNCATE, …) drop its entries at once ([`ColumnCache::forget_files`]).
//!
//! # The policy (plan-driven; LRU for comparison)
//! Every scan carries a [`Priority`] that the physical plan gives it
//! (`scan.rs`, [`CacheScans`]): `Scan` for a large sequential scan (one
//! whose decoded columns would take a good part of the budget), `Hot` for
//! the other scans under the build side of a join (small dimension tables,
//! read by every query that joins them), `Normal` for the rest. Entries are evicted lowest
//! priority first, least recently used first within a priority, and an
//! insert may only evict entries of a lower priority, or of its own
//! priority that the running query has not used (its epoch): a large scan
//! of cold data fills free space and cycles through its own kind, but
//! never flushes hot data, and a scan larger than the budget keeps the part
//! that fitted instead of evicting it again before it is read (LRU's
//! failure on a cyclic scan). An entry read again by a later query is
//! promoted from `Scan` to `Normal`, and so is a chunk that was turned away
//! once and is read again by a later query (the cache remembers the keys it
//! rejected, as 2Q and ARC keep "ghost" entries): a scan that repeats is no
//! one-pass scan, and without this a cache filled by earlier queries would
//! turn away a later query's data on every run (TPC-H's stream at SF10:
//! Q15 took 0.48 s in the stream against 0.14 s alone). Under
//! [`Policy::Lru`] every entry is alike and the least recently used goes
//! first.

pub mod disk;
pub mod lookup;
mod routed;
mod scan;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::ArrayRef;
use parquet::file::metadata::ParquetMetaData;

pub use scan::{CacheOptions, CacheScans, CachedParquetSource, OperatorRoles};

/// How valuable a scan's chunks are, from the plan (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A large sequential scan: admitted into free space, evicts only its own kind.
    Scan = 0,
    Normal = 1,
    /// The build side of a join: small tables that many queries read.
    Hot = 2,
}

impl Priority {
    pub fn name(self) -> &'static str {
        match self {
            Priority::Scan => "scan",
            Priority::Normal => "normal",
            Priority::Hot => "hot",
        }
    }
}

tokio::task_local! {
    /// The priority of the scan whose reads run in this task, for the
    /// disk tier below the object store (set by the cached scan).
    pub static SCAN_PRIORITY: Priority;
}

/// The priority of the scan reading now, `Normal` outside one.
pub fn current_priority() -> Priority {
    SCAN_PRIORITY.try_with(|p| *p).unwrap_or(Priority::Normal)
}

/// Which entries leave first when the cache is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Priorities from the plan (the default; see the module docs).
    Plan,
    /// Least recently used first, whatever the plan says.
    Lru,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "plan" => Ok(Policy::Plan),
            "lru" => Ok(Policy::Lru),
            other => Err(format!("unknown cache policy {other:?}: plan or lru")),
        }
    }
}

/// One decoded column chunk: a file (its path in the object store and its
/// size), a row group, a column (its index in the file's Arrow schema),
/// and which of its rows: all (`live` 0), or those a deletion vector keeps
/// (`live`: a fingerprint of the rows it deletes in the row group, see
/// `scan.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkKey {
    pub file: Arc<str>,
    pub size: u64,
    pub row_group: u32,
    pub column: u32,
    pub live: u64,
}

/// A cached column chunk: the column of one row group, in pieces of
/// [`PIECE_ROWS`] rows (the last one shorter), as the reader decoded them.
/// Scans hand the pieces on as they are: batches that are slices of one
/// large array would each count the whole array in DataFusion's memory
/// accounting.
pub type Chunk = Arc<Vec<ArrayRef>>;

impl FileCounts {
    fn add_entry(&mut self, bytes: u64, priority: Priority) {
        self.entries += 1;
        self.bytes += bytes;
        self.priority = self.priority.max(Some(priority));
    }

    /// The counts by file as `cirro.cache`'s rows, by file name.
    fn rows(files: HashMap<&Arc<str>, FileCounts>) -> Vec<(String, FileCounts)> {
        let mut rows: Vec<(String, FileCounts)> = files
            .into_iter()
            .map(|(file, counts)| (file.to_string(), counts))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }
}

/// Rows of a [`Chunk`]'s pieces.
pub const PIECE_ROWS: usize = 8192;

struct Entry {
    array: Chunk,
    bytes: usize,
    priority: Priority,
    last_used: u64,
}

/// Per-file counts for `cirro.cache`.
#[derive(Clone, Debug, Default)]
pub struct FileCounts {
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Blocks of the disk tier found damaged and read again (0 in memory).
    pub repairs: u64,
    pub priority: Option<Priority>,
}

/// The tier's maps, keyed by file paths: hashed with a fast hash (every
/// lookup and scan asks them under the tier's lock; SipHash's resistance to
/// chosen keys buys nothing for the process's own file names).
type Map<K, V> = HashMap<K, V, datafusion::common::hash_utils::RandomState>;

#[derive(Default)]
struct Inner {
    entries: Map<ChunkKey, Entry>,
    /// Eviction order: (priority, last use, key), the first goes first.
    order: BTreeSet<(Priority, u64, ChunkKey)>,
    used: usize,
    tick: u64,
    /// Hits and misses by file, kept while the file has entries or was
    /// looked up since (bounded: forgotten with the file's entries).
    counts: Map<Arc<str>, (u64, u64)>,
    /// Footers of the files read through the cache.
    footers: Map<(Arc<str>, u64), Arc<ParquetMetaData>>,
    /// Chunks turned away, with the epoch that last asked for them: asked
    /// for again by a later epoch, they come in as `Normal` (bounded by
    /// [`GHOSTS_KEPT_MAX`]).
    ghosts: Map<ChunkKey, u64>,
    /// Bytes of the `Hot` entries (at most [`HOT_SHARE_MAX`] of the budget).
    hot_used: usize,
}

/// The cache's totals since the process started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheTotals {
    pub hits: u64,
    pub misses: u64,
    pub inserted: u64,
    pub evicted: u64,
    /// Chunks not admitted (no room without evicting better data).
    pub rejected: u64,
    pub bytes: u64,
    pub entries: u64,
}

/// One node's hot-data tier (see the module docs).
pub struct ColumnCache {
    budget: AtomicU64,
    policy: Mutex<Policy>,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for ColumnCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnCache")
            .field("budget", &self.budget())
            .field("policy", &self.policy())
            .finish()
    }
}

/// The fraction of the machine's memory the cache takes unless
/// `--cache-memory` says otherwise.
pub const DEFAULT_MEMORY_SHARE: f64 = 0.25;

pub use cirro_common::limits::physical_memory;

impl ColumnCache {
    /// The default tier: a quarter of the machine's memory
    /// ([`DEFAULT_MEMORY_SHARE`]), the plan policy.
    pub fn with_defaults() -> Self {
        let memory = physical_memory().unwrap_or(4 << 30);
        Self::new((memory as f64 * DEFAULT_MEMORY_SHARE) as u64, Policy::Plan)
    }

    pub fn new(budget: u64, policy: Policy) -> Self {
        Self {
            budget: AtomicU64::new(budget),
            policy: Mutex::new(policy),
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    pub fn policy(&self) -> Policy {
        self.policy.lock().map(|p| *p).unwrap_or(Policy::Plan)
    }

    pub fn set_budget(&self, budget: u64) {
        self.budget.store(budget, Ordering::Relaxed);
        let mut inner = self.lock();
        while inner.used as u64 > budget {
            let Some(victim) = inner.order.first().cloned() else {
                break;
            };
            inner.remove(&victim.2);
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        inner.cool(budget as usize);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps (every
        // change is a few inserts/removes): keep going with them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new epoch: the value a query's scans pass to [`Self::get`] and
    /// [`Self::insert`], so that the query never evicts what it used itself.
    pub fn epoch(&self) -> u64 {
        let mut inner = self.lock();
        inner.tick += 1;
        inner.tick
    }

    /// The chunk `key`, if cached; counts a hit or a miss.
    pub fn get(&self, key: &ChunkKey, priority: Priority, epoch: u64) -> Option<Chunk> {
        let policy = self.policy();
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let Some(entry) = inner.entries.get_mut(key) else {
            inner.counts.entry(Arc::clone(&key.file)).or_default().1 += 1;
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let old = (entry.priority, entry.last_used, key.clone());
        let mut promoted = entry.priority.max(priority);
        if policy == Policy::Plan && entry.priority == Priority::Scan && entry.last_used < epoch {
            // Read again by a later query: not a one-pass scan after all.
            promoted = promoted.max(Priority::Normal);
        }
        if policy == Policy::Lru {
            promoted = Priority::Normal;
        }
        let heated = if promoted == Priority::Hot && entry.priority != Priority::Hot {
            entry.bytes
        } else {
            0
        };
        entry.priority = promoted;
        entry.last_used = tick;
        let array = Arc::clone(&entry.array);
        inner.order.remove(&old);
        inner.order.insert((promoted, tick, key.clone()));
        if heated > 0 {
            inner.hot_used += heated;
            inner.cool(self.budget() as usize);
        }
        inner.counts.entry(Arc::clone(&key.file)).or_default().0 += 1;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(array)
    }

    /// Keep `array` as chunk `key` if the policy finds room; returns whether it did.
    pub fn insert(&self, key: ChunkKey, array: Chunk, priority: Priority, epoch: u64) -> bool {
        let bytes = array
            .iter()
            .map(|a| a.get_array_memory_size())
            .sum::<usize>();
        let budget = self.budget() as usize;
        let policy = self.policy();
        let priority = if policy == Policy::Lru {
            Priority::Normal
        } else {
            priority
        };
        let mut inner = self.lock();
        if inner.entries.contains_key(&key) {
            return true;
        }
        // Turned away before and asked for again by a later query: not a
        // one-pass scan. It comes in as normal data, but only over chunks
        // that nobody used since it was first turned away: a scan larger
        // than the budget, repeated, must not evict its own first part
        // before reading it (LRU's failure on a cyclic scan).
        let ghost =
            inner.ghosts.get(&key).copied().filter(|asked| {
                policy == Policy::Plan && priority == Priority::Scan && *asked < epoch
            });
        let priority = if ghost.is_some() {
            Priority::Normal
        } else {
            priority
        };
        if bytes > budget {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Find the victims first, evict only if there are enough: by
        // priority, least recently used first, each priority up to the
        // last use that protects it.
        let mut freed = 0usize;
        let mut victims = Vec::new();
        'classes: for class in [Priority::Scan, Priority::Normal, Priority::Hot] {
            let protected_from = match policy {
                Policy::Lru => u64::MAX,
                Policy::Plan if class < priority => ghost.unwrap_or(u64::MAX),
                Policy::Plan if class == priority => ghost.map_or(epoch, |asked| asked.min(epoch)),
                Policy::Plan => break, // all that follow are better still
            };
            let range =
                (class, 0, ChunkKey::default())..(class, protected_from, ChunkKey::default());
            for (_, _, victim) in inner.order.range(range) {
                if inner.used - freed + bytes <= budget {
                    break 'classes;
                }
                freed += inner.entries.get(victim).map_or(0, |e| e.bytes);
                victims.push(victim.clone());
            }
        }
        if inner.used - freed + bytes > budget {
            if policy == Policy::Plan {
                if inner.ghosts.len() >= GHOSTS_KEPT_MAX {
                    inner.ghosts.clear();
                }
                inner.ghosts.insert(key, epoch);
            }
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        inner.ghosts.remove(&key);
        for victim in &victims {
            // A scan's chunk pushed out before a later query read it again
            // is remembered as if turned away (2Q's ghosts of its FIFO):
            // read again by a later query, it comes in as normal data at
            // once. Without this a query after a larger one took three runs
            // to have its data cached: its first run's chunks were evicted
            // by its own normal scans and came back as scan data again
            // (TPC-H SF10 Q7 after Q1: 1.30, 0.83, 0.70 s).
            if policy == Policy::Plan
                && let Some(entry) = inner.entries.get(victim)
                && entry.priority == Priority::Scan
            {
                let used = entry.last_used;
                if inner.ghosts.len() >= GHOSTS_KEPT_MAX {
                    inner.ghosts.clear();
                }
                inner.ghosts.insert(victim.clone(), used);
            }
            inner.remove(victim);
        }
        self.evicted
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        inner.tick += 1;
        let tick = inner.tick;
        inner.order.insert((priority, tick, key.clone()));
        inner.used += bytes;
        inner.entries.insert(
            key,
            Entry {
                array,
                bytes,
                priority,
                last_used: tick,
            },
        );
        if priority == Priority::Hot {
            inner.hot_used += bytes;
            inner.cool(budget);
        }
        self.inserted.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Drop every entry of the files at `paths` (object-store paths), e.g.
    /// files a commit removed.
    pub fn forget_files(&self, paths: &[String]) {
        if paths.is_empty() {
            return;
        }
        let mut inner = self.lock();
        let wanted: std::collections::HashSet<&str> = paths.iter().map(|p| p.as_str()).collect();
        let keys: Vec<ChunkKey> = inner
            .entries
            .keys()
            .filter(|k| wanted.contains(&*k.file))
            .cloned()
            .collect();
        for key in &keys {
            inner.remove(key);
        }
        inner.counts.retain(|file, _| !wanted.contains(&**file));
        inner.ghosts.retain(|key, _| !wanted.contains(&*key.file));
        inner
            .footers
            .retain(|(file, _), _| !wanted.contains(&**file));
    }

    /// The footer of a file read through the cache, if kept.
    pub fn footer(&self, file: &Arc<str>, size: u64) -> Option<Arc<ParquetMetaData>> {
        self.lock().footers.get(&(Arc::clone(file), size)).cloned()
    }

    pub fn keep_footer(&self, file: Arc<str>, size: u64, footer: Arc<ParquetMetaData>) {
        let mut inner = self.lock();
        // Footers are small; still, a process reading many files over a long
        // life should not keep them all.
        if inner.footers.len() >= FOOTERS_KEPT_MAX {
            inner.footers.clear();
        }
        inner.footers.insert((file, size), footer);
    }

    pub fn totals(&self) -> CacheTotals {
        let inner = self.lock();
        CacheTotals {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserted: self.inserted.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            bytes: inner.used as u64,
            entries: inner.entries.len() as u64,
        }
    }

    /// Entries, bytes, hits and misses by file (`cirro.cache`).
    pub fn by_file(&self) -> Vec<(String, FileCounts)> {
        let inner = self.lock();
        let mut files: HashMap<&Arc<str>, FileCounts> = HashMap::new();
        for (key, entry) in &inner.entries {
            files
                .entry(&key.file)
                .or_default()
                .add_entry(entry.bytes as u64, entry.priority);
        }
        for (file, (hits, misses)) in &inner.counts {
            let counts = files.entry(file).or_default();
            counts.hits = *hits;
            counts.misses = *misses;
        }
        FileCounts::rows(files)
    }
}

/// The share of the budget that hot chunks may take before the least
/// recently used of them count as normal ([`Inner::cool`]).
const HOT_SHARE_MAX: f64 = 0.5;

/// Footers the cache keeps at most.
const FOOTERS_KEPT_MAX: usize = 100_000;

/// Keys of rejected chunks the cache remembers at most (about 100 bytes
/// each; a TPC-H SF100 lineitem has about 20,000 column chunks).
const GHOSTS_KEPT_MAX: usize = 200_000;

impl Inner {
    fn remove(&mut self, key: &ChunkKey) {
        if let Some(entry) = self.entries.remove(key) {
            self.order
                .remove(&(entry.priority, entry.last_used, key.clone()));
            self.used -= entry.bytes;
            if entry.priority == Priority::Hot {
                self.hot_used -= entry.bytes;
            }
        }
    }

    /// Demote the least recently used hot chunks to normal until hot data
    /// takes at most [`HOT_SHARE_MAX`] of `budget`: hot data ages like the
    /// rest beyond that share, or build sides that were read once would
    /// hold the cache against everything else for good.
    fn cool(&mut self, budget: usize) {
        let cap = (budget as f64 * HOT_SHARE_MAX) as usize;
        while self.hot_used > cap {
            let Some(first) = self
                .order
                .range((Priority::Hot, 0, ChunkKey::default())..)
                .next()
                .cloned()
            else {
                break;
            };
            self.order.remove(&first);
            let (_, last_used, key) = first;
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.priority = Priority::Normal;
                self.hot_used -= entry.bytes;
            }
            self.order.insert((Priority::Normal, last_used, key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    fn key(file: &str, rg: u32) -> ChunkKey {
        ChunkKey {
            file: Arc::from(file),
            size: 1,
            row_group: rg,
            column: 0,
            live: 0,
        }
    }

    fn chunk() -> Chunk {
        Arc::new(vec![Arc::new(Int64Array::from(vec![7; 1000])) as ArrayRef])
    }

    /// Room for `n` chunks.
    fn cache(n: usize, policy: Policy) -> ColumnCache {
        ColumnCache::new((chunk()[0].get_array_memory_size() * n) as u64, policy)
    }

    #[test]
    fn a_large_scan_does_not_flush_hot_data() {
        let cache = cache(4, Policy::Plan);
        let q1 = cache.epoch();
        assert!(cache.insert(key("dim", 0), chunk(), Priority::Hot, q1));
        assert!(cache.insert(key("dim", 1), chunk(), Priority::Hot, q1));
        let q2 = cache.epoch();
        for rg in 0..10 {
            cache.insert(key("fact", rg), chunk(), Priority::Scan, q2);
        }
        assert!(cache.get(&key("dim", 0), Priority::Hot, q2).is_some());
        assert!(cache.get(&key("dim", 1), Priority::Hot, q2).is_some());
        // The scan kept what fitted first and did not evict it again.
        assert!(cache.get(&key("fact", 0), Priority::Scan, q2).is_some());
        assert!(cache.get(&key("fact", 1), Priority::Scan, q2).is_some());
        assert!(cache.get(&key("fact", 2), Priority::Scan, q2).is_none());
        assert_eq!(cache.totals().entries, 4);

        // Under LRU the same stream flushes the dimension table.
        let lru = self::cache(4, Policy::Lru);
        let q1 = lru.epoch();
        lru.insert(key("dim", 0), chunk(), Priority::Hot, q1);
        let q2 = lru.epoch();
        for rg in 0..10 {
            lru.insert(key("fact", rg), chunk(), Priority::Scan, q2);
        }
        assert!(lru.get(&key("dim", 0), Priority::Hot, q2).is_none());
        assert!(lru.get(&key("fact", 9), Priority::Scan, q2).is_some());
    }

    #[test]
    fn a_later_query_evicts_an_earlier_scan_and_reuse_promotes() {
        let cache = cache(2, Policy::Plan);
        let q1 = cache.epoch();
        assert!(cache.insert(key("a", 0), chunk(), Priority::Scan, q1));
        assert!(cache.insert(key("a", 1), chunk(), Priority::Scan, q1));
        let q2 = cache.epoch();
        // a/0 read again: promoted to normal, a later scan cannot evict it.
        assert!(cache.get(&key("a", 0), Priority::Scan, q2).is_some());
        let q3 = cache.epoch();
        assert!(cache.insert(key("b", 0), chunk(), Priority::Scan, q3));
        assert!(cache.get(&key("a", 1), Priority::Scan, q3).is_none());
        assert!(!cache.insert(key("b", 1), chunk(), Priority::Scan, q3));
        assert!(cache.get(&key("a", 0), Priority::Normal, q3).is_some());
        // A normal insert of a new query evicts the oldest scan chunk.
        let q4 = cache.epoch();
        assert!(cache.insert(key("c", 0), chunk(), Priority::Normal, q4));
        assert!(cache.get(&key("b", 0), Priority::Scan, q4).is_none());
        let totals = cache.totals();
        assert_eq!(totals.entries, 2);
        assert!(totals.rejected >= 1 && totals.evicted >= 2, "{totals:?}");
    }

    #[test]
    fn a_scan_turned_away_and_repeated_comes_in() {
        let cache = cache(2, Policy::Plan);
        let q1 = cache.epoch();
        assert!(cache.insert(key("a", 0), chunk(), Priority::Normal, q1));
        assert!(cache.insert(key("a", 1), chunk(), Priority::Normal, q1));
        // A one-pass scan finds the cache full of better data: turned away.
        let q2 = cache.epoch();
        assert!(!cache.insert(key("b", 0), chunk(), Priority::Scan, q2));
        assert!(!cache.insert(key("b", 1), chunk(), Priority::Scan, q2));
        // Within the same query, asking again changes nothing.
        assert!(!cache.insert(key("b", 0), chunk(), Priority::Scan, q2));
        // A later query reads b again: it comes in as normal data, over the
        // least recently used normal chunk, and stays against a new scan.
        let q3 = cache.epoch();
        assert!(cache.get(&key("a", 1), Priority::Normal, q3).is_some());
        assert!(cache.insert(key("b", 0), chunk(), Priority::Scan, q3));
        assert!(cache.get(&key("a", 0), Priority::Normal, q3).is_none());
        assert!(cache.get(&key("a", 1), Priority::Normal, q3).is_some());
        let q4 = cache.epoch();
        assert!(!cache.insert(key("c", 0), chunk(), Priority::Scan, q4));
        assert!(cache.get(&key("b", 0), Priority::Scan, q4).is_some());
        // Forgetting the file forgets that it was turned away: without
        // that, c/0 would come in over a/1 now.
        cache.forget_files(&["c".to_string()]);
        let q5 = cache.epoch();
        assert!(!cache.insert(key("c", 0), chunk(), Priority::Scan, q5));
        assert_eq!(cache.totals().entries, 2);
        // A repeated scan larger than the cache, in two partitions: what
        // one partition was turned away the first time must not evict what
        // the other kept and has yet to read again.
        let cyclic = self::cache(3, Policy::Plan);
        let q1 = cyclic.epoch();
        assert!(cyclic.insert(key("p", 0), chunk(), Priority::Scan, q1));
        assert!(cyclic.insert(key("x", 0), chunk(), Priority::Scan, q1));
        assert!(cyclic.insert(key("p", 1), chunk(), Priority::Scan, q1));
        assert!(!cyclic.insert(key("x", 1), chunk(), Priority::Scan, q1));
        let q2 = cyclic.epoch();
        assert!(cyclic.get(&key("p", 0), Priority::Scan, q2).is_some());
        assert!(cyclic.get(&key("p", 1), Priority::Scan, q2).is_some());
        assert!(!cyclic.insert(key("x", 1), chunk(), Priority::Scan, q2));
        assert!(cyclic.get(&key("x", 0), Priority::Scan, q2).is_some());
        // Under LRU nothing is remembered: every insert evicts the oldest.
        let lru = self::cache(1, Policy::Lru);
        let q = lru.epoch();
        assert!(lru.insert(key("x", 0), chunk(), Priority::Scan, q));
        assert!(lru.insert(key("y", 0), chunk(), Priority::Scan, q));
    }

    #[test]
    fn a_scan_chunk_pushed_out_and_read_again_comes_in() {
        let cache = cache(2, Policy::Plan);
        let q1 = cache.epoch();
        assert!(cache.insert(key("old", 0), chunk(), Priority::Normal, q1));
        // A scan's chunk comes into free space; normal data of the same
        // query pushes it out.
        let q2 = cache.epoch();
        assert!(cache.insert(key("a", 0), chunk(), Priority::Scan, q2));
        assert!(cache.insert(key("new", 0), chunk(), Priority::Normal, q2));
        assert!(cache.get(&key("a", 0), Priority::Scan, q2).is_none());
        // A later query reads it again: normal data, over the normal chunk
        // nobody used since a/0 was read, not over the one used after.
        let q3 = cache.epoch();
        assert!(cache.insert(key("a", 0), chunk(), Priority::Scan, q3));
        assert!(cache.get(&key("old", 0), Priority::Normal, q3).is_none());
        assert!(cache.get(&key("new", 0), Priority::Normal, q3).is_some());
        // Now normal: a new scan cannot push it out.
        let q4 = cache.epoch();
        assert!(!cache.insert(key("b", 0), chunk(), Priority::Scan, q4));
        assert!(cache.get(&key("a", 0), Priority::Scan, q4).is_some());
    }

    #[test]
    fn hot_data_takes_at_most_half_the_cache() {
        let cache = cache(4, Policy::Plan);
        let q1 = cache.epoch();
        for rg in 0..4 {
            assert!(cache.insert(key("dim", rg), chunk(), Priority::Hot, q1));
        }
        // The two least recently used hot chunks count as normal now: a
        // later query's normal data may evict them, not the other two.
        let q2 = cache.epoch();
        assert!(cache.insert(key("n", 0), chunk(), Priority::Normal, q2));
        assert!(cache.insert(key("n", 1), chunk(), Priority::Normal, q2));
        assert!(!cache.insert(key("n", 2), chunk(), Priority::Normal, q2));
        assert!(cache.get(&key("dim", 0), Priority::Hot, q2).is_none());
        assert!(cache.get(&key("dim", 1), Priority::Hot, q2).is_none());
        assert!(cache.get(&key("dim", 2), Priority::Hot, q2).is_some());
        assert!(cache.get(&key("dim", 3), Priority::Hot, q2).is_some());
        // A normal chunk read by a build side turns hot, and the oldest hot
        // one cools in its place.
        let q3 = cache.epoch();
        assert!(cache.get(&key("n", 0), Priority::Hot, q3).is_some());
        let q4 = cache.epoch();
        assert!(cache.insert(key("n", 3), chunk(), Priority::Normal, q4));
        assert!(cache.insert(key("n", 4), chunk(), Priority::Normal, q4));
        assert!(cache.get(&key("n", 1), Priority::Normal, q4).is_none());
        assert!(cache.get(&key("dim", 2), Priority::Hot, q4).is_none());
        assert!(cache.get(&key("n", 0), Priority::Hot, q4).is_some());
        assert!(cache.get(&key("dim", 3), Priority::Hot, q4).is_some());
    }

    #[test]
    fn forgetting_a_file_and_shrinking_the_budget() {
        let cache = cache(4, Policy::Plan);
        let q = cache.epoch();
        cache.insert(key("x", 0), chunk(), Priority::Normal, q);
        cache.insert(key("x", 1), chunk(), Priority::Normal, q);
        cache.insert(key("y", 0), chunk(), Priority::Normal, q);
        cache.forget_files(&["x".to_string()]);
        assert!(cache.get(&key("x", 0), Priority::Normal, q).is_none());
        assert!(cache.get(&key("y", 0), Priority::Normal, q).is_some());
        assert_eq!(cache.totals().entries, 1);
        cache.set_budget(0);
        assert_eq!(cache.totals().bytes, 0);
        let rows = cache.by_file();
        assert!(
            rows.iter()
                .any(|(f, c)| f == "y" && c.hits == 1 && c.entries == 0)
        );
    }
}
