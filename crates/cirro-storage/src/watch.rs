//! Whether a file exists in a local directory, asked every statement (is
//! there a commit newer than the one this process knows?) and answered
//! without a file-system lookup while nothing was created there.
//!
//! Each directory asked about gets an inotify watch. An "absent" answer is
//! kept with the directory's generation (a number that changes with every
//! event for it, and differs for a directory made again) and given again
//! while the generation is the same. Each question first asks the kernel how
//! many bytes of events are queued (`FIONREAD`, about half a microsecond,
//! against one to two for a stat of the path): the kernel queues an event
//! before the call that created the file returns, so a commit another
//! process finished before the question is always seen. With none queued,
//! the kept answer is read under a shared lock; otherwise the events are
//! read and applied under the exclusive one. (Reading the descriptor under
//! one lock for every question made concurrent statements queue on it and
//! sleep: a quarter of a futex wait per pgbench select at 4 clients.)
//!
//! Only file systems whose changes all pass through this kernel report them
//! (ext4, XFS, Btrfs, tmpfs, F2FS, ZFS); on others (NFS, SMB, FUSE, overlay,
//! …) every question is a stat. A directory that is deleted or moved loses
//! its watch and is watched again at the next question; when the kernel's
//! queue overflows, every kept answer is dropped.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, RwLock};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

/// Directories watched at most; others are asked by stat.
const MAX_WATCHED: usize = 4096;

/// `statfs` magic numbers of the file systems whose changes inotify sees.
const LOCAL_FILE_SYSTEMS: &[u64] = &[
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0xF2F5_2010, // F2FS
    0x2FC1_2FC1, // ZFS
];

/// What is known of one directory.
struct Watched {
    /// None: not watchable (another file system, or no watch to be had).
    wd: Option<WatchDescriptor>,
    /// Changes with every event for the directory; never the same for two
    /// entries of one directory (a directory made again gets a new entry).
    generation: u64,
    /// A name found absent, and `generation` when it was.
    absent: Option<(String, u64)>,
    /// Answers given from `absent` (for tests).
    kept: AtomicU64,
}

impl Watched {
    /// What this entry says of `name`.
    fn look(&self, name: &str) -> Seen {
        match (&self.wd, &self.absent) {
            (None, _) => Seen::Unwatched,
            (Some(_), Some((absent, at))) if absent == name && *at == self.generation => {
                self.kept.fetch_add(1, Ordering::Relaxed);
                Seen::Absent
            }
            (Some(_), _) => Seen::At(self.generation),
        }
    }
}

/// What the watcher knows of a name before any stat.
enum Seen {
    /// Absent, and nothing created in its directory since.
    Absent,
    /// Not known; the directory's generation now.
    At(u64),
    /// Not known, and not to be kept.
    Unwatched,
}

struct Watcher {
    inotify: Inotify,
    dirs: HashMap<PathBuf, Watched>,
    by_wd: HashMap<WatchDescriptor, PathBuf>,
    /// The last generation handed out.
    clock: u64,
}

static WATCHER: LazyLock<Option<RwLock<Watcher>>> = LazyLock::new(|| {
    let inotify = Inotify::init().ok()?;
    Some(RwLock::new(Watcher {
        inotify,
        dirs: HashMap::new(),
        by_wd: HashMap::new(),
        clock: 0,
    }))
});

impl Watcher {
    /// Whether no event is queued (false where the kernel does not say).
    /// Needs no lock: events are only ever taken off the queue under the
    /// exclusive lock, and applied before it is let go.
    #[allow(unsafe_code)] // one FFI call to libc, see SAFETY below
    fn quiet(&self) -> bool {
        let mut queued: libc::c_int = 0;
        // SAFETY: the descriptor is the watcher's own, open while it lives,
        // and FIONREAD writes one c_int to `queued`, which outlives the call.
        let asked = unsafe { libc::ioctl(self.inotify.as_raw_fd(), libc::FIONREAD, &mut queued) };
        asked == 0 && queued == 0
    }

    /// Apply the pending events.
    fn drain(&mut self) {
        let mut buffer = [0u8; 4096];
        loop {
            let events = match self.inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("inotify: {e}; dropping every kept answer");
                    self.forget_all();
                    return;
                }
            };
            let mut any = false;
            let mut gone = Vec::new();
            let mut overflow = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    overflow = true;
                    continue;
                }
                let Some(dir) = self.by_wd.get(&event.wd) else {
                    continue;
                };
                self.clock += 1;
                if let Some(watched) = self.dirs.get_mut(dir) {
                    watched.generation = self.clock;
                }
                if event
                    .mask
                    .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                {
                    gone.push(event.wd.clone());
                }
            }
            for wd in gone {
                if let Some(dir) = self.by_wd.remove(&wd) {
                    self.dirs.remove(&dir);
                    let _ = self.inotify.watches().remove(wd);
                }
            }
            if overflow {
                self.forget_all();
            }
            if !any {
                return;
            }
        }
    }

    /// Drop every kept answer (events may have been lost).
    fn forget_all(&mut self) {
        for watched in self.dirs.values_mut() {
            self.clock += 1;
            watched.generation = self.clock;
        }
    }

    /// The entry of `dir`, watching it first if it is new; None where it
    /// cannot be had now (too many directories, or `dir` not there yet).
    fn entry(&mut self, dir: &Path) -> Option<&mut Watched> {
        if !self.dirs.contains_key(dir) {
            if self.dirs.len() >= MAX_WATCHED {
                return None;
            }
            let wd = if on_local_file_system(dir)? {
                let mask = WatchMask::CREATE
                    | WatchMask::MOVED_TO
                    | WatchMask::DELETE_SELF
                    | WatchMask::MOVE_SELF
                    | WatchMask::ONLYDIR;
                let wd = self.inotify.watches().add(dir, mask).ok()?;
                self.by_wd.insert(wd.clone(), dir.to_path_buf());
                Some(wd)
            } else {
                None
            };
            self.clock += 1;
            self.dirs.insert(
                dir.to_path_buf(),
                Watched {
                    wd,
                    generation: self.clock,
                    absent: None,
                    kept: AtomicU64::new(0),
                },
            );
        }
        self.dirs.get_mut(dir)
    }
}

/// Whether `dir` is on a file system whose changes inotify reports (None:
/// `dir` cannot be asked, for example not there yet).
#[allow(unsafe_code)] // one FFI call to libc, see SAFETY below
fn on_local_file_system(dir: &Path) -> Option<bool> {
    let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs is plain old data, for which all zeroes is a value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a writable
    // statfs that outlives the call.
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(LOCAL_FILE_SYSTEMS.contains(&(stat.f_type as u64)))
}

/// Whether `name` exists in the directory `dir` (None: the file system
/// did not say).
pub(crate) fn exists(dir: &Path, name: &str) -> Option<bool> {
    let stat = || dir.join(name).try_exists().ok();
    let Some(watcher) = WATCHER.as_ref() else {
        return stat();
    };
    let shared = watcher
        .read()
        .ok()
        .filter(|w| w.quiet())
        .and_then(|w| w.dirs.get(dir).map(|watched| watched.look(name)));
    let seen = match shared {
        Some(seen) => seen,
        None => {
            let Ok(mut watcher) = watcher.write() else {
                return stat();
            };
            watcher.drain();
            match watcher.entry(dir) {
                Some(watched) => watched.look(name),
                None => Seen::Unwatched,
            }
        }
    };
    let generation = match seen {
        Seen::Absent => return Some(false),
        Seen::At(generation) => Some(generation),
        Seen::Unwatched => None,
    };
    // The watch is in place before the stat: a file created after it is
    // reported, and then the answer below is not kept.
    let found = stat();
    // Kept only if no event (and no new watch of the directory) came
    // since the generation was read: then it is still that generation.
    if let (Some(generation), Some(false)) = (generation, found)
        && let Ok(mut watcher) = watcher.write()
        && let Some(watched) = watcher.dirs.get_mut(dir)
        && watched.generation == generation
    {
        watched.absent = Some((name.to_string(), generation));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers `exists` gave for `dir` from a kept "absent".
    fn kept(dir: &Path) -> u64 {
        let watcher = WATCHER.as_ref().expect("inotify").read().unwrap();
        watcher
            .dirs
            .get(dir)
            .map_or(0, |w| w.kept.load(Ordering::Relaxed))
    }

    fn touch(path: &Path) {
        // Another process, as a second server committing would be.
        let status = std::process::Command::new("touch")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// An "absent" answer is kept while nothing is created, and never hides
    /// a file another process created, renamed in, or made in a directory
    /// deleted and made again.
    #[test]
    fn kept_answers_never_hide_a_new_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(
            on_local_file_system(&dir),
            Some(true),
            "test needs ext4/tmpfs/…"
        );

        assert_eq!(exists(&dir, "1.json"), Some(false));
        assert_eq!(exists(&dir, "1.json"), Some(false));
        assert_eq!(exists(&dir, "1.json"), Some(false));
        assert_eq!(
            kept(&dir),
            2,
            "the answer was asked of the file system again"
        );
        touch(&dir.join("1.json"));
        assert_eq!(exists(&dir, "1.json"), Some(true));

        // Renamed into the directory (how a staged file becomes a commit).
        assert_eq!(exists(&dir, "2.json"), Some(false));
        assert_eq!(exists(&dir, "2.json"), Some(false));
        std::fs::write(root.path().join("staged"), b"{}").unwrap();
        let status = std::process::Command::new("mv")
            .arg(root.path().join("staged"))
            .arg(dir.join("2.json"))
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(exists(&dir, "2.json"), Some(true));

        // The directory deleted and made again, then the file made.
        assert_eq!(exists(&dir, "3.json"), Some(false));
        assert_eq!(exists(&dir, "3.json"), Some(false));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        touch(&dir.join("3.json"));
        assert_eq!(exists(&dir, "3.json"), Some(true));
        assert_eq!(exists(&dir, "4.json"), Some(false));
        assert_eq!(exists(&dir, "4.json"), Some(false));
        assert_eq!(kept(&dir), 1, "the new directory is watched");
        touch(&dir.join("4.json"));
        assert_eq!(exists(&dir, "4.json"), Some(true));
    }

    /// Threads asking at once (the shared lock's path, racing the drains)
    /// never hide a file created before a question began: each file is
    /// created while others ask for it, then must be seen.
    #[test]
    fn concurrent_questions_never_hide_a_new_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        std::fs::create_dir(&dir).unwrap();
        let next = std::sync::Arc::new(AtomicU64::new(0));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let askers: Vec<_> = (0..3)
            .map(|_| {
                let (dir, next, done) = (dir.clone(), next.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut asked = 0u64;
                    while !done.load(Ordering::Relaxed) && asked < 1_000_000 {
                        let n = next.load(Ordering::Acquire);
                        let _ = exists(&dir, &format!("{n}.json"));
                        asked += 1;
                    }
                    asked
                })
            })
            .collect();
        for n in 0..300u64 {
            // Asked (and kept absent) before it is made.
            assert_eq!(exists(&dir, &format!("{n}.json")), Some(false));
            std::fs::write(dir.join(format!("{n}.json")), b"").unwrap();
            assert_eq!(exists(&dir, &format!("{n}.json")), Some(true), "{n}");
            next.store(n + 1, Ordering::Release);
        }
        done.store(true, Ordering::Relaxed);
        for asker in askers {
            assert!(asker.join().unwrap() > 0);
        }
        assert!(kept(&dir) > 0, "no answer was kept: the test asked nothing");
    }

    /// A directory that does not exist yet is not remembered as unwatchable.
    #[test]
    fn missing_directory_is_watched_once_made() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("later");
        assert_eq!(exists(&dir, "1.json"), Some(false));
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(exists(&dir, "1.json"), Some(false));
        assert_eq!(exists(&dir, "1.json"), Some(false));
        assert_eq!(kept(&dir), 1);
    }
}
