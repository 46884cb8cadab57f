//! The node's monitor: once a second it samples the process (CPU, resident
//! memory), the queries' memory, the hot-data tier, the admission queue and
//! the spill disk; keeps the last half hour for the console's plots; counts
//! the statements that ended; and writes the slow-query log.
//!
//! ```text
//!  every 1 s ─► Sample ─► history (1,800 kept) ─► /api/history, plots
//!                 │    └► latest ─► /api/nodes, /metrics, cirro.nodes (report_load)
//!  Activity::queries() ─► ended since last tick ─► counters, slow-query log
//! ```

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cirro_engine::activity::{Activity, QueryState, QueryView};
use serde::Serialize;

/// Samples kept: half an hour at one a second.
const HISTORY: usize = 1800;

/// Linux reports process CPU time in these ticks (USER_HZ, fixed at 100 on
/// every architecture Linux exposes to user space).
const TICKS_PER_SECOND: f64 = 100.0;

/// One look at the node.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t: i64,
    /// Bytes the queries hold, and what they may hold together.
    pub memory_used: u64,
    pub memory_limit: u64,
    /// Resident memory of the process.
    pub rss: u64,
    /// Bytes the hot-data tier holds.
    pub cache_bytes: u64,
    pub running: u32,
    pub queued: u32,
    /// CPU of the process since the previous sample, in thousandths of the
    /// machine (all cores).
    pub cpu_permille: u32,
    /// The spill directory's file system.
    pub disk_bytes: u64,
    pub disk_free: u64,
}

/// Statements that ended, by how (Prometheus counters).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ended {
    pub finished: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub slow: u64,
    pub spilled_bytes: u64,
}

/// Where slow statements are written, and from what duration.
#[derive(Clone, Debug)]
pub(crate) struct SlowLog {
    pub threshold: Duration,
    /// None: standard error.
    pub file: Option<PathBuf>,
}

pub(crate) struct Monitor {
    activity: Arc<Activity>,
    /// The node whose memory, admission and cache are sampled.
    node: Arc<cirro_engine::Node>,
    slow: SlowLog,
    history: Mutex<VecDeque<Sample>>,
    /// The counts, and how many endings the registry had told of.
    ended: Mutex<(Ended, u64)>,
}

impl Monitor {
    pub(crate) fn start(
        activity: Arc<Activity>,
        node: Arc<cirro_engine::Node>,
        slow: SlowLog,
    ) -> Arc<Self> {
        let monitor = Arc::new(Self {
            activity,
            node,
            slow,
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            ended: Mutex::new((Ended::default(), 0)),
        });
        let weak = Arc::downgrade(&monitor);
        tokio::spawn(async move {
            let mut cpu = CpuClock::new();
            loop {
                let Some(monitor) = weak.upgrade() else {
                    return;
                };
                let sample = monitor.sample(&mut cpu);
                {
                    let mut history = monitor.history.lock().unwrap_or_else(|e| e.into_inner());
                    if history.len() == HISTORY {
                        history.pop_front();
                    }
                    history.push_back(sample);
                }
                monitor.collect_ended();
                drop(monitor);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        monitor
    }

    /// The latest sample (a fresh one before the first tick).
    pub(crate) fn latest(&self) -> Sample {
        let last = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .back()
            .copied();
        last.unwrap_or_else(|| self.sample(&mut CpuClock::new()))
    }

    /// Samples since `since` (milliseconds since the epoch; 0: all kept).
    pub(crate) fn history(&self, since: i64) -> Vec<Sample> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.t > since)
            .copied()
            .collect()
    }

    pub(crate) fn ended(&self) -> Ended {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    pub(crate) fn slow_threshold(&self) -> Duration {
        self.slow.threshold
    }

    fn sample(&self, cpu: &mut CpuClock) -> Sample {
        let resources = self.node.resources();
        let counts = resources.admission().counts();
        let (disk_bytes, disk_free) = disk_space(&resources.config().spill_dir).unwrap_or_default();
        Sample {
            t: now_ms(),
            memory_used: resources.budget().used() as u64,
            memory_limit: resources.budget().limit() as u64,
            rss: resident_bytes().unwrap_or(0),
            cache_bytes: self.node.cache().totals().bytes,
            running: counts.running as u32,
            queued: counts.queued as u32,
            cpu_permille: cpu.permille(),
            disk_bytes,
            disk_free,
        }
    }

    /// Count the statements that ended since the last look and log the slow
    /// ones: only those, not the whole registry with its plans (it keeps
    /// the last 1,000 ended statements: a node ending more than that in a
    /// second undercounts).
    fn collect_ended(&self) {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let (counts, seen) = &mut *ended;
        let (total, views) = self.activity.ended_since(*seen);
        *seen = total;
        let mut slow = Vec::new();
        for view in views {
            match view.state {
                QueryState::Finished => counts.finished += 1,
                QueryState::Failed => counts.failed += 1,
                _ => counts.cancelled += 1,
            }
            counts.spilled_bytes += view.spilled_bytes;
            if Duration::from_micros(view.elapsed_micros().max(0) as u64) >= self.slow.threshold {
                counts.slow += 1;
                slow.push(view);
            }
        }
        drop(ended);
        for view in &slow {
            self.log_slow(view);
        }
    }

    fn log_slow(&self, view: &QueryView) {
        let line = serde_json::json!({
            "ended": view.ended.map(|t| t / 1000),
            "elapsed_ms": view.elapsed_micros() / 1000,
            "query_id": view.id,
            "pid": view.pid,
            "user": view.user,
            "state": view.state.as_str(),
            "rows": view.rows,
            "peak_memory": view.peak_memory,
            "spilled_bytes": view.spilled_bytes,
            "error": view.error,
            "query": view.query,
        });
        match &self.slow.file {
            Some(path) => {
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| writeln!(f, "{line}"));
                if let Err(e) = written {
                    log::warn!("slow-query log {}: {e}", path.display());
                }
            }
            None => eprintln!("cirro: slow statement: {line}"),
        }
    }
}

/// The process's CPU time between two calls.
struct CpuClock {
    last: Option<(Instant, u64)>,
}

impl CpuClock {
    fn new() -> Self {
        Self {
            last: process_ticks().map(|t| (Instant::now(), t)),
        }
    }

    fn permille(&mut self) -> u32 {
        let now = (Instant::now(), process_ticks().unwrap_or(0));
        let Some((at, ticks)) = self.last.replace(now) else {
            return 0;
        };
        let wall = now.0.duration_since(at).as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        if wall <= 0.0 {
            return 0;
        }
        let used = now.1.saturating_sub(ticks) as f64 / TICKS_PER_SECOND;
        ((used / wall / cores) * 1000.0).round().clamp(0.0, 1000.0) as u32
    }
}

/// User and system CPU ticks of this process (`/proc/self/stat`).
fn process_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields; `rest` starts at the 3rd.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The process's resident memory (`VmRSS` of `/proc/self/status`).
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Size and free bytes of the file system holding `dir` (or its nearest
/// existing parent: the spill folder is made on first use).
fn disk_space(dir: &Path) -> Option<(u64, u64)> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    cirro_storage::cache::disk::file_system_space(existing)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(resident_bytes().is_some_and(|b| b > 0));
        assert!(process_ticks().is_some());
        let (size, free) = disk_space(&std::env::temp_dir().join("no/such/dir")).expect("fs");
        assert!(size > 0 && free <= size);
    }
}
