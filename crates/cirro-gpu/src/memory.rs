//! The device-memory manager (Hetero-DB's): device memory is a budget
//! (`--gpu-memory`); operators' data lives in regions, allocated on the
//! device lazily (at their first use by a kernel), swapped to host memory
//! under pressure and brought back when a kernel needs them again. Each
//! region is tracked in fixed-size pages with a per-page state (on the host
//! only, on the device and clean, on the device and dirty), and before each
//! kernel the operator declares what the kernel reads and writes
//! ([`DeviceMemory::acquire`]): those regions are made resident and held;
//! written pages become dirty.
//!
//! Which region leaves when room is needed is the policy's choice. Cost-
//! Driven Replacement (CDR, the default): cost c = e + f·s·l, with e the
//! bytes that must be written back (its dirty pages), s its size, l its
//! position in LRU order in (0, 1] (1 the most recently used), f the latency
//! factor in (0, 1); the cheapest goes first, ties to the less recently used.
//! LRU, MRU, LFU and RANDOM are there to compare with (`cirro bench gpu`).
//!
//! Regions with a cache key form the column cache: hot columns stay
//! resident between queries and are found by their key. A key names the
//! host buffers the column came from (their addresses and lengths), and the
//! region keeps those buffers alive, so no other data can take their
//! addresses while the key exists; an evicted cached region is dropped
//! (its source is still on the host), which bounds what the cache holds to
//! the device's budget.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use arrow::buffer::Buffer;

use crate::device::{DeviceBuffer, Gpu, GpuError, GpuResult};

/// Bytes of one page.
pub const PAGE: u64 = 64 * 1024;

/// How long a kernel's regions wait for others' kernels to release the
/// memory they hold before the operator works on the CPU instead.
pub const HELD_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Which region leaves the device first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Cdr,
    Lru,
    Mru,
    Lfu,
    Random,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "cdr" => Policy::Cdr,
            "lru" => Policy::Lru,
            "mru" => Policy::Mru,
            "lfu" => Policy::Lfu,
            "random" => Policy::Random,
            _ => {
                return Err(format!(
                    "unknown replacement policy {s:?} (cdr, lru, mru, lfu or random)"
                ));
            }
        })
    }
}

/// What a replacement policy knows of a region that may leave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Bytes on the device.
    pub size: u64,
    /// Bytes that must be copied back to the host before it leaves.
    pub dirty: u64,
    /// The clock of its last use (larger: more recent).
    pub last_use: u64,
    /// Times it was used.
    pub uses: u64,
}

/// The candidate `policy` evicts first; None when there is none. `latency`
/// is CDR's f, `seed` RANDOM's draw.
pub fn choose(policy: Policy, candidates: &[Candidate], latency: f64, seed: u64) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let by = |key: &dyn Fn(&Candidate) -> (f64, u64)| {
        (0..candidates.len()).min_by(|&a, &b| {
            let (ka, ta) = key(&candidates[a]);
            let (kb, tb) = key(&candidates[b]);
            ka.total_cmp(&kb).then(ta.cmp(&tb))
        })
    };
    match policy {
        Policy::Lru => by(&|c| (c.last_use as f64, c.last_use)),
        Policy::Mru => by(&|c| (-(c.last_use as f64), 0)),
        Policy::Lfu => by(&|c| (c.uses as f64, c.last_use)),
        Policy::Random => {
            // splitmix64 of the seed: reproducible in tests and benchmarks.
            let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            Some(((z ^ (z >> 31)) % candidates.len() as u64) as usize)
        }
        Policy::Cdr => {
            // l: rank in LRU order, the least recent 1/n, the most recent 1.
            let mut order: Vec<usize> = (0..candidates.len()).collect();
            order.sort_by_key(|&i| candidates[i].last_use);
            let n = candidates.len() as f64;
            let mut position = vec![0.0; candidates.len()];
            for (rank, &i) in order.iter().enumerate() {
                position[i] = (rank + 1) as f64 / n;
            }
            let f = latency.clamp(f64::MIN_POSITIVE, 1.0);
            (0..candidates.len()).min_by(|&a, &b| {
                let cost = |i: usize| {
                    let c = &candidates[i];
                    c.dirty as f64 + f * c.size as f64 * position[i]
                };
                cost(a)
                    .total_cmp(&cost(b))
                    .then(candidates[a].last_use.cmp(&candidates[b].last_use))
            })
        }
    }
}

/// A page's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Only the host copy holds it (never on the device, or swapped out).
    Host,
    /// On the device, the same as the host copy.
    Clean,
    /// On the device, newer than the host copy.
    Dirty,
}

/// A region's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionId(u64);

/// How a kernel uses a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Written (all of it): its pages become dirty.
    Write,
}

struct Region {
    size: u64,
    pages: Vec<PageState>,
    device: Option<Arc<DeviceBuffer>>,
    /// The host copy (None: never written on the host; zeroed on first use).
    host: Option<Buffer>,
    holds: u32,
    last_use: u64,
    uses: u64,
    key: Option<String>,
    /// What a cached region's key names, kept alive (see the module docs).
    pins: Vec<Buffer>,
}

impl Region {
    fn dirty_bytes(&self) -> u64 {
        self.pages
            .iter()
            .filter(|p| **p == PageState::Dirty)
            .count() as u64
            * PAGE
    }
}

/// What the manager has done (`cirro bench gpu` and tests read it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes on the device now.
    pub resident: u64,
    /// Regions swapped out (or dropped, when clean).
    pub evictions: u64,
    /// Bytes copied back to the host on eviction.
    pub written_back: u64,
    /// Bytes copied to the device (first uses and swaps in).
    pub loaded: u64,
    /// Column-cache lookups that found the column / did not.
    pub hits: u64,
    pub misses: u64,
    /// Bytes of cached columns on the device now (part of `resident`).
    pub cached: u64,
}

struct State {
    regions: HashMap<RegionId, Region>,
    keys: HashMap<String, RegionId>,
    clock: u64,
    next: u64,
    stats: MemoryStats,
}

/// The device memory of one device, as a budget.
pub struct DeviceMemory {
    budget: u64,
    policy: Policy,
    latency: f64,
    state: Mutex<State>,
    /// Signalled when held regions are released or freed.
    released: Condvar,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("budget", &self.budget)
            .field("policy", &self.policy)
            .finish()
    }
}

impl DeviceMemory {
    /// A manager of `budget` bytes evicting by `policy` (CDR's latency
    /// factor f = `latency`).
    pub fn new(budget: u64, policy: Policy, latency: f64) -> Self {
        Self {
            budget,
            policy,
            latency,
            state: Mutex::new(State {
                regions: HashMap::new(),
                keys: HashMap::new(),
                clock: 0,
                next: 0,
                stats: MemoryStats::default(),
            }),
            released: Condvar::new(),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn stats(&self) -> MemoryStats {
        self.state.lock().map(|s| s.stats).unwrap_or_default()
    }

    fn lock(&self) -> GpuResult<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| GpuError("device memory lock poisoned".into()))
    }

    /// A region of `size` bytes, zeroed at its first use; nothing is
    /// allocated on the device yet.
    pub fn region(&self, size: u64) -> GpuResult<RegionId> {
        self.insert(size.next_multiple_of(4).max(16), None, None)
    }

    /// A region holding `data` (a host copy; the device's comes lazily).
    pub fn region_with(&self, data: Buffer) -> GpuResult<RegionId> {
        let size = (data.len() as u64).next_multiple_of(4).max(16);
        self.insert(size, Some(data), None)
    }

    /// The column cache: the region kept under `key`, or a new one holding
    /// `load()`'s bytes, kept under it until evicted; `pins` are the host
    /// buffers the key names, kept alive with it. The region is held (not
    /// evicted) until [`DeviceMemory::release`].
    pub fn cached(
        &self,
        key: &str,
        pins: Vec<Buffer>,
        load: impl FnOnce() -> Buffer,
    ) -> GpuResult<RegionId> {
        if let Some(id) = self.hold_key(key)? {
            return Ok(id);
        }
        let data = load();
        let mut state = self.lock()?;
        // Another thread may have loaded it meanwhile.
        if let Some(id) = state.keys.get(key).copied() {
            if let Some(region) = state.regions.get_mut(&id) {
                region.holds += 1;
                return Ok(id);
            }
        }
        state.stats.misses += 1;
        drop(state);
        let size = (data.len() as u64).next_multiple_of(4).max(16);
        let id = self.insert(size, Some(data), Some(key.to_string()))?;
        let mut state = self.lock()?;
        if let Some(region) = state.regions.get_mut(&id) {
            region.pins = pins;
            region.holds += 1;
        }
        Ok(id)
    }

    /// The region cached under `key`, held; None where there is none.
    fn hold_key(&self, key: &str) -> GpuResult<Option<RegionId>> {
        let mut state = self.lock()?;
        let Some(id) = state.keys.get(key).copied() else {
            return Ok(None);
        };
        let Some(region) = state.regions.get_mut(&id) else {
            return Ok(None);
        };
        region.holds += 1;
        state.stats.hits += 1;
        Ok(Some(id))
    }

    fn insert(&self, size: u64, host: Option<Buffer>, key: Option<String>) -> GpuResult<RegionId> {
        let mut state = self.lock()?;
        let id = RegionId(state.next);
        state.next += 1;
        if let Some(key) = &key {
            state.keys.insert(key.clone(), id);
        }
        state.regions.insert(
            id,
            Region {
                size,
                pages: vec![PageState::Host; size.div_ceil(PAGE) as usize],
                device: None,
                host,
                holds: 0,
                last_use: 0,
                uses: 0,
                key,
                pins: Vec::new(),
            },
        );
        Ok(id)
    }

    /// Make `regions` resident for a kernel and hold them there until
    /// [`DeviceMemory::release`]; evicts others, by the policy, while they
    /// would not fit. Where what is left is held by other kernels (another
    /// operator of the query, running beside this one), waits for them to
    /// release it, at most [`HELD_WAIT`]. Fails (nothing held) when the
    /// held regions would still pass the budget: the operator then works on
    /// the CPU or in smaller chunks.
    pub fn acquire(
        &self,
        gpu: &Gpu,
        regions: &[(RegionId, Access)],
    ) -> GpuResult<Vec<Arc<DeviceBuffer>>> {
        let deadline = std::time::Instant::now() + HELD_WAIT;
        let wanted: Vec<RegionId> = regions.iter().map(|(id, _)| *id).collect();
        let mut guard = self.lock()?;
        loop {
            let state = &mut *guard;
            let mut needed = 0;
            for (id, _) in regions {
                let region = state
                    .regions
                    .get(id)
                    .ok_or_else(|| GpuError("unknown device region".into()))?;
                if region.device.is_none() {
                    needed += region.size;
                }
            }
            if needed > self.budget {
                // Nothing could make room: the cache is left alone.
                return Err(GpuError(format!(
                    "device memory exhausted: {} bytes needed, {} of {} held",
                    needed, state.stats.resident, self.budget
                )));
            }
            let mut fits = true;
            while state.stats.resident + needed > self.budget {
                let candidates: Vec<(RegionId, Candidate)> = state
                    .regions
                    .iter()
                    .filter(|(id, r)| r.device.is_some() && r.holds == 0 && !wanted.contains(id))
                    .map(|(id, r)| {
                        (
                            *id,
                            Candidate {
                                size: r.size,
                                dirty: r.dirty_bytes(),
                                last_use: r.last_use,
                                uses: r.uses,
                            },
                        )
                    })
                    .collect();
                let only: Vec<Candidate> = candidates.iter().map(|(_, c)| *c).collect();
                let Some(victim) = choose(self.policy, &only, self.latency, state.clock) else {
                    fits = false;
                    break;
                };
                evict(gpu, state, candidates[victim].0)?;
            }
            if fits {
                break;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(GpuError(format!(
                    "device memory exhausted: {} bytes needed, {} of {} held",
                    needed, state.stats.resident, self.budget
                )));
            }
            guard = self
                .released
                .wait_timeout(guard, deadline - now)
                .map_err(|_| GpuError("device memory lock poisoned".into()))?
                .0;
        }
        let state = &mut *guard;
        state.clock += 1;
        let clock = state.clock;
        let mut out = Vec::with_capacity(regions.len());
        for (id, access) in regions {
            let Some(region) = state.regions.get_mut(id) else {
                return Err(GpuError("unknown device region".into()));
            };
            if region.device.is_none() {
                let buffer = match &region.host {
                    Some(host) => {
                        state.stats.loaded += region.size;
                        gpu.upload(host.as_slice())
                    }
                    None => gpu.scratch(region.size),
                };
                region.device = Some(Arc::new(buffer));
                state.stats.resident += region.size;
                if region.key.is_some() {
                    state.stats.cached += region.size;
                }
                region.pages.fill(PageState::Clean);
            }
            if *access == Access::Write {
                region.pages.fill(PageState::Dirty);
            }
            region.holds += 1;
            region.last_use = clock;
            region.uses += 1;
            if let Some(buffer) = &region.device {
                out.push(Arc::clone(buffer));
            }
        }
        Ok(out)
    }

    /// `work` over `regions` made resident and held ([`DeviceMemory::acquire`]),
    /// released after it, whatever it returns.
    pub fn holding<T>(
        &self,
        gpu: &Gpu,
        regions: &[(RegionId, Access)],
        work: impl FnOnce(&[Arc<DeviceBuffer>]) -> GpuResult<T>,
    ) -> GpuResult<T> {
        let buffers = self.acquire(gpu, regions)?;
        let out = work(&buffers);
        let held: Vec<RegionId> = regions.iter().map(|(r, _)| *r).collect();
        self.release(&held);
        out
    }

    /// Let `regions` be evicted again.
    pub fn release(&self, regions: &[RegionId]) {
        if let Ok(mut state) = self.state.lock() {
            for id in regions {
                if let Some(r) = state.regions.get_mut(id) {
                    r.holds = r.holds.saturating_sub(1);
                }
            }
        }
        self.released.notify_all();
    }

    /// Forget `regions` (their device and host copies).
    pub fn free(&self, regions: &[RegionId]) {
        if let Ok(mut state) = self.state.lock() {
            for id in regions {
                if let Some(r) = state.regions.remove(id) {
                    if r.device.is_some() {
                        state.stats.resident -= r.size;
                        if r.key.is_some() {
                            state.stats.cached -= r.size;
                        }
                    }
                    if let Some(key) = r.key {
                        state.keys.remove(&key);
                    }
                }
            }
        }
        self.released.notify_all();
    }

    /// The pages' states of a region (tests).
    pub fn pages(&self, id: RegionId) -> Vec<PageState> {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.regions.get(&id).map(|r| r.pages.clone()))
            .unwrap_or_default()
    }

    /// A region's bytes: the device's copy where it is newer.
    pub fn read(&self, gpu: &Gpu, id: RegionId) -> GpuResult<Vec<u8>> {
        let state = self.lock()?;
        let region = state
            .regions
            .get(&id)
            .ok_or_else(|| GpuError("unknown device region".into()))?;
        match (&region.device, &region.host) {
            (Some(device), _) => gpu.download(&device.buffer, region.size),
            (None, Some(host)) => Ok(host.as_slice().to_vec()),
            (None, None) => Ok(vec![0; region.size as usize]),
        }
    }
}

/// Take a region off the device: dirty pages are copied back first; a
/// clean cached column is dropped (its source is on the host).
fn evict(gpu: &Gpu, state: &mut State, id: RegionId) -> GpuResult<()> {
    let Some(region) = state.regions.get_mut(&id) else {
        return Ok(());
    };
    if region.key.is_some() && region.device.is_some() && region.dirty_bytes() == 0 {
        let size = region.size;
        if let Some(key) = state.regions.remove(&id).and_then(|r| r.key) {
            state.keys.remove(&key);
        }
        state.stats.resident -= size;
        state.stats.cached -= size;
        state.stats.evictions += 1;
        return Ok(());
    }
    let Some(device) = region.device.take() else {
        return Ok(());
    };
    let dirty = region.dirty_bytes();
    if dirty > 0 {
        let bytes = gpu.download(&device.buffer, region.size)?;
        region.host = Some(Buffer::from_vec(bytes));
        state.stats.written_back += region.size;
    }
    region.pages.fill(PageState::Host);
    state.stats.resident -= region.size;
    if region.key.is_some() {
        state.stats.cached -= region.size;
    }
    state.stats.evictions += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(size: u64, dirty: u64, last_use: u64, uses: u64) -> Candidate {
        Candidate {
            size,
            dirty,
            last_use,
            uses,
        }
    }

    #[test]
    fn cdr_prefers_clean_regions_over_dirty_ones() {
        // Same size; the dirty one is least recently used, yet writing it
        // back costs more than dropping the clean one.
        let regions = [c(1000, 1000, 1, 1), c(1000, 0, 2, 1)];
        assert_eq!(choose(Policy::Cdr, &regions, 0.5, 0), Some(1));
        // LRU takes the dirty one.
        assert_eq!(choose(Policy::Lru, &regions, 0.5, 0), Some(0));
    }

    #[test]
    fn cdr_weighs_size_by_recency() {
        // Clean: cost f·s·l. A: 4000 bytes, least recent (l = 1/3) → 0.5·4000/3
        // = 667; B: 1000 bytes, middle (l = 2/3) → 333; C: 900, most recent
        // (l = 1) → 450. B goes first.
        let regions = [c(4000, 0, 1, 9), c(1000, 0, 2, 9), c(900, 0, 3, 9)];
        assert_eq!(choose(Policy::Cdr, &regions, 0.5, 0), Some(1));
        // Dirty bytes count in full: B with 200 dirty costs 533 > C's 450.
        let regions = [c(4000, 0, 1, 9), c(1000, 200, 2, 9), c(900, 0, 3, 9)];
        assert_eq!(choose(Policy::Cdr, &regions, 0.5, 0), Some(2));
    }

    #[test]
    fn cdr_ties_go_to_the_less_recently_used() {
        // Equal cost: 2000·(1/2)·f = 1000·1·f.
        let regions = [c(1000, 0, 7, 1), c(2000, 0, 3, 1)];
        assert_eq!(choose(Policy::Cdr, &regions, 0.25, 0), Some(1));
        let regions = [c(500, 0, 5, 1), c(500, 0, 4, 1)];
        // Same size: the less recent is also cheaper (l smaller).
        assert_eq!(choose(Policy::Cdr, &regions, 0.25, 0), Some(1));
    }

    #[test]
    fn the_other_policies_choose_as_named() {
        let regions = [c(10, 0, 5, 3), c(10, 0, 9, 1), c(10, 0, 2, 7)];
        assert_eq!(choose(Policy::Lru, &regions, 0.5, 0), Some(2));
        assert_eq!(choose(Policy::Mru, &regions, 0.5, 0), Some(1));
        assert_eq!(choose(Policy::Lfu, &regions, 0.5, 0), Some(1));
        let drawn: std::collections::HashSet<usize> = (0..64)
            .filter_map(|seed| choose(Policy::Random, &regions, 0.5, seed))
            .collect();
        assert_eq!(drawn.len(), 3, "RANDOM draws every candidate");
        assert_eq!(choose(Policy::Cdr, &[], 0.5, 0), None);
        assert_eq!("CDR".parse::<Policy>(), Ok(Policy::Cdr));
        assert!("fifo".parse::<Policy>().is_err());
    }
}
