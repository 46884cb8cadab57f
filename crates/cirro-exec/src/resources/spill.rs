//! The spill area: where queries write what does not fit their memory.
//!
//! `--spill-dir` (default: the system's temporary folder's `cirro-spill`)
//! holds one folder per node: `p<pid>`, or `p<pid>-<n>` for the n-th
//! further node of one process (tests run several). DataFusion's disk manager
//! makes its temporary folder inside it and each spill file is deleted when
//! the operator that wrote it drops it: when its query ends, fails or is
//! cancelled. A process that died (a crash, `kill -9`) leaves its folder
//! behind; the next process to open the area deletes the folders of
//! processes that no longer run, so several servers can share one area.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cirro_common::{CirroError, Result};
use datafusion::execution::disk_manager::{DiskManager, DiskManagerMode};

/// Spill areas this process has opened: the next one's number.
static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One node's part of the spill area.
#[derive(Debug)]
pub struct SpillArea {
    dir: PathBuf,
    disk: Arc<DiskManager>,
}

impl SpillArea {
    /// Open `root` (created if missing), delete what dead processes left
    /// there, and make this node's folder.
    pub fn open(root: &Path) -> Result<Self> {
        let number = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let io = |what: &str, path: &Path, e: std::io::Error| {
            CirroError::io(format!("spill area: cannot {what} {}: {e}", path.display()))
        };
        std::fs::create_dir_all(root).map_err(|e| io("create", root, e))?;
        let me = std::process::id();
        for entry in std::fs::read_dir(root).map_err(|e| io("read", root, e))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some((pid, n)) = name
                .to_str()
                .and_then(|n| n.strip_prefix('p'))
                .and_then(|n| {
                    let (pid, n) = n.split_once('-').unwrap_or((n, "0"));
                    Some((pid.parse::<u32>().ok()?, n.parse::<u64>().ok()?))
                })
            else {
                continue;
            };
            // This process's areas numbered below this one are its other
            // nodes' (alive, or removed when dropped); the rest were left by
            // a dead process of the same pid.
            if (pid == me && n >= number) || (pid != me && !process_runs(pid)) {
                let path = entry.path();
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => log::info!(
                        "spill area: removed {} (left by process {pid})",
                        path.display()
                    ),
                    Err(e) => log::warn!("spill area: cannot remove {}: {e}", path.display()),
                }
            }
        }
        let dir = match number {
            0 => root.join(format!("p{me}")),
            n => root.join(format!("p{me}-{n}")),
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        let disk = DiskManager::builder()
            .with_mode(DiskManagerMode::Directories(vec![dir.clone()]))
            // The disk itself is the limit (53100 when it is full).
            .with_max_temp_directory_size(u64::MAX)
            .build()?;
        Ok(Self {
            dir,
            disk: Arc::new(disk),
        })
    }

    /// This node's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The disk manager that writes spill files into it.
    pub fn disk_manager(&self) -> &Arc<DiskManager> {
        &self.disk
    }

    /// Bytes of spill files that exist now.
    pub fn used(&self) -> u64 {
        self.disk.used_disk_space()
    }
}

impl SpillArea {
    /// Delete the node's folder and what is in it.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for SpillArea {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether process `pid` runs (Linux: it has a /proc entry).
fn process_runs(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_removes_what_dead_processes_left() {
        let root = std::env::temp_dir().join(format!("cirro-spill-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // A dead process's folder (pids wrap far below u32::MAX), a live one's
        // (pid 1 runs on every Linux) and something else.
        let dead = root.join(format!("p{}", u32::MAX - 7));
        std::fs::create_dir_all(dead.join("datafusion-x")).unwrap();
        std::fs::write(dead.join("datafusion-x/spill.arrow"), b"rows").unwrap();
        let live = root.join("p1");
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(root.join("notes.txt"), b"kept").unwrap();
        let area = SpillArea::open(&root).unwrap();
        assert!(!dead.exists(), "a dead process's spill files are removed");
        assert!(live.exists() && root.join("notes.txt").exists());
        assert!(area.dir().exists());
        let dir = area.dir().to_path_buf();
        drop(area);
        assert!(
            !dir.exists(),
            "a process's folder goes when it closes the area"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
