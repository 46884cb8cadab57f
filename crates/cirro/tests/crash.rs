//! Crash safety of INSERT: `cirro` is killed with SIGKILL while a large
//! INSERT … SELECT runs, at points where new data files are on disk but not yet
//! committed. After a restart the table must hold exactly its rows from before.
//!
//! The kill points are reached through `CIRRO_CRASH_POINT` (see
//! `cirro_storage::failpoint`): the process announces the point and waits there,
//! the test checks the files on disk, then kills it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{DataDir, scalar, table_dir};

/// Small data files, so that files are completed while the INSERT still runs
/// (by the 10th batch: the writer counts encoded pages, which for these
/// repetitive rows are small).
const FILE_BYTES_FOR_TEST: &str = "50000";
const KILL_WAIT_SECS: u64 = 300;
const CHECKSUM: &str = "SELECT count(*) || ':' || sum(id) || ':' || sum(id * id % 1000003) || ':' || sum(length(v)) FROM t";
const BIG_INSERT: &str = "INSERT INTO t SELECT value, repeat('y', CAST(value % 50 AS INT)) FROM generate_series(1, 3000000)";

fn data_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("table dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .count()
}

fn commits(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("_delta_log"))
        .expect("log dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count()
}

/// A child process that is killed when dropped, so that a failed assertion
/// never leaves a `cirro` waiting at a crash point.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run BIG_INSERT until it reaches `point`, check the disk, and SIGKILL it.
fn kill_at(data: &DataDir, table: &Path, point: &str) {
    let files_before = data_files(table);
    let commits_before = commits(table);
    let mut child = KillOnDrop(
        data.command()
            .args(["sql", "-c", BIG_INSERT])
            .env("CIRRO_CRASH_POINT", point)
            .env("CIRRO_DATA_FILE_BYTES", FILE_BYTES_FOR_TEST)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cirro"),
    );
    let stderr = child.0.stderr.take().expect("stderr");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let reached = line.contains("CIRRO_CRASH_POINT");
            if sender.send(line).is_err() || reached {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let reached = loop {
        match receiver.recv_timeout(Duration::from_secs(KILL_WAIT_SECS)) {
            Ok(line) if line.contains("reached") => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    assert!(reached, "crash point {point} not reached; stderr: {seen:?}");
    // The state we kill in: new data files exist, no new commit. (Uploads that
    // were in flight when the point was reached may take a moment to land.)
    let waited = std::time::Instant::now();
    let mut files_at_kill = data_files(table);
    while files_at_kill <= files_before && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        files_at_kill = data_files(table);
    }
    assert!(
        files_at_kill > files_before,
        "{point}: no new data files on disk ({files_before} → {files_at_kill})"
    );
    assert_eq!(
        commits(table),
        commits_before,
        "{point}: a commit happened before the kill"
    );
    child.0.kill().expect("SIGKILL");
    let status = child.0.wait().expect("wait");
    assert!(!status.success(), "the process was killed");
}

#[test]
fn killed_insert_leaves_the_table_as_it_was() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t (id BIGINT NOT NULL, v VARCHAR)");
    data.sql_ok("INSERT INTO t SELECT value, 'before' FROM generate_series(1, 100000)");
    let table = table_dir(&data, "t");
    let before = scalar(&data, CHECKSUM);

    for point in ["write.batch:10", "write.batch:60", "write.before_commit"] {
        kill_at(&data, &table, point);
        // Restart: the table holds exactly its rows from before.
        assert_eq!(scalar(&data, CHECKSUM), before, "after a kill at {point}");
    }

    // The table still takes writes, and the files the killed runs left are not read.
    data.sql_ok("INSERT INTO t VALUES (0, 'after')");
    let after = scalar(&data, "SELECT count(*) FROM t");
    assert_eq!(after, "100001");
}
