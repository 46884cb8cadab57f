//! Crash safety of UPDATE, DELETE, MERGE and OPTIMIZE: `cirro` is killed with
//! SIGKILL at random points of a statement — at a random moment, or at a
//! random crash point (while new files are written, just before the commit,
//! just after it). After each restart the table must equal, by content
//! checksum, either the version before the statement or the one after it
//! (computed by running the same statement to completion on a copy of the data
//! directory), and over the run both outcomes must have been seen.
//!
//! The fast tier kills a few times; the slow tier (`scripts/test.sh --slow`)
//! at least 50 times.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{DataDir, scalar};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Small data files, so that statements touch and write several files.
const FILE_BYTES_FOR_TEST: &str = "150000";
const CHECKSUM: &str = "SELECT count(*) || ':' || coalesce(sum(id), 0) || ':' || \
    coalesce(sum(id * grp % 1000003), 0) || ':' || coalesce(sum(length(v)), 0) FROM t";

fn statement(rng: &mut StdRng, round: usize) -> String {
    let k = rng.random_range(2..7);
    let r = rng.random_range(0..k);
    // The first two rounds are UPDATEs killed just before and just after
    // their commit, so that both outcomes are always seen.
    let kind = if round < 2 { 0 } else { rng.random_range(0..4) };
    match kind {
        0 => format!("UPDATE t SET grp = grp + {round}, v = v || 'u' WHERE id % {k} = {r}"),
        1 => format!(
            "DELETE FROM t WHERE id % {k} = {r} AND grp % 3 = {}",
            round % 3
        ),
        2 => {
            let lo = rng.random_range(0..150_000);
            format!(
                "MERGE INTO t USING (SELECT value AS id FROM generate_series({lo}, {}) AS g(value)) AS s \
                 ON t.id = s.id \
                 WHEN MATCHED AND t.id % {k} = {r} THEN DELETE \
                 WHEN MATCHED THEN UPDATE SET grp = t.grp * 2 + 1 \
                 WHEN NOT MATCHED THEN INSERT (id, grp, v) VALUES (s.id, {round}, 'merged')",
                lo + 40_000
            )
        }
        _ => "OPTIMIZE t".to_string(),
    }
}

/// Where to kill: a crash point, or a moment after the start.
enum Kill {
    Point(String),
    After(Duration),
}

fn choose_kill(rng: &mut StdRng, sql: &str, typical: Duration) -> Kill {
    if rng.random_bool(0.5) {
        let (before, after) = if sql.starts_with("OPTIMIZE") {
            ("optimize.before_commit", "optimize.after_commit")
        } else {
            ("mutate.before_commit", "mutate.after_commit")
        };
        let point = match rng.random_range(0..4) {
            0 => format!("write.batch:{}", rng.random_range(1..4)),
            1 | 2 => before.to_string(),
            _ => after.to_string(),
        };
        Kill::Point(point)
    } else {
        let span = typical.as_millis().max(20) as u64;
        Kill::After(Duration::from_millis(rng.random_range(0..span * 5 / 4)))
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Copy the contents of directory `from` into directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success(), "copy of the data directory failed");
}

/// Run `sql` and kill it as `kill` says. Returns whether a kill happened
/// while the statement ran (not after it had finished).
fn run_and_kill(data: &DataDir, sql: &str, kill: &Kill) -> bool {
    let mut command = data.command();
    command
        .args(["sql", "-c", sql])
        .env("CIRRO_DATA_FILE_BYTES", FILE_BYTES_FOR_TEST)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Kill::Point(point) = kill {
        command.env("CIRRO_CRASH_POINT", point);
    }
    let mut child = KillOnDrop(command.spawn().expect("spawn cirro"));
    let stderr = child.0.stderr.take().expect("stderr");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    match kill {
        Kill::Point(point) => {
            // The point may not be reached (e.g. a statement that writes
            // fewer batches): then the statement completes.
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if let Ok(Some(status)) = child.0.try_wait() {
                    assert!(status.success(), "{sql} failed without a kill");
                    return false;
                }
                match receiver.recv_timeout(Duration::from_millis(20)) {
                    Ok(line) if line.contains("CIRRO_CRASH_POINT") => break,
                    Ok(line) => assert!(!line.starts_with("ERROR"), "{sql}: {line}"),
                    Err(_) => assert!(Instant::now() < deadline, "{point} never reached"),
                }
            }
        }
        Kill::After(delay) => {
            std::thread::sleep(*delay);
            if let Ok(Some(status)) = child.0.try_wait() {
                assert!(status.success(), "{sql} failed without a kill");
                return false;
            }
        }
    }
    child.0.kill().expect("SIGKILL");
    let status = child.0.wait().expect("wait");
    !status.success()
}

fn crash_rounds(rounds: usize, seed: u64) {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t (id BIGINT NOT NULL, grp INT, v VARCHAR)");
    let load = data
        .command()
        .args([
            "sql",
            "-c",
            "INSERT INTO t SELECT value, CAST(value % 10 AS INT), 'v' || value FROM generate_series(1, 200000) AS g(value)",
        ])
        .env("CIRRO_DATA_FILE_BYTES", FILE_BYTES_FOR_TEST)
        .output()
        .expect("load");
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut kills, mut saw_before, mut saw_after) = (0, 0, 0);
    for round in 0..rounds {
        let sql = statement(&mut rng, round);
        let before = scalar(&data, CHECKSUM);
        // The outcome of the statement run to completion, on a copy.
        let copy = DataDir::new();
        copy_dir(data.path(), copy.path());
        let started = Instant::now();
        let done = copy
            .command()
            .args(["sql", "-c", &sql])
            .env("CIRRO_DATA_FILE_BYTES", FILE_BYTES_FOR_TEST)
            .output()
            .expect("run on copy");
        assert!(
            done.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&done.stderr)
        );
        let typical = started.elapsed();
        let after = scalar(&copy, CHECKSUM);

        let kill = match round {
            0 => Kill::Point("mutate.before_commit".to_string()),
            1 => Kill::Point("mutate.after_commit".to_string()),
            _ => choose_kill(&mut rng, &sql, typical),
        };
        let killed = run_and_kill(&data, &sql, &kill);
        kills += killed as usize;
        let now = scalar(&data, CHECKSUM);
        if now == before && before != after {
            saw_before += 1;
        } else if now == after {
            saw_after += 1;
        } else {
            panic!(
                "round {round}: after a kill during {sql}\nthe table is {now},\nneither the version before ({before}) nor after ({after})"
            );
        }
    }
    eprintln!(
        "{rounds} statements, {kills} killed mid-statement: {saw_before} left the version before, {saw_after} the version after"
    );
    assert!(
        kills >= rounds / 4,
        "only {kills} of {rounds} runs were killed mid-statement"
    );
    assert!(
        saw_before > 0,
        "no kill left the table at the version before ({kills} kills)"
    );
    assert!(
        saw_after > 0,
        "no kill left the table at the version after ({kills} kills)"
    );
    // The table still takes writes.
    data.sql_ok("UPDATE t SET grp = 0 WHERE id = 1");
}

#[test]
fn killed_dml_leaves_the_version_before_or_after() {
    crash_rounds(8, 11);
}

#[test]
#[ignore = "slow tier: 60 kills"]
fn killed_dml_many_times() {
    crash_rounds(70, 2024);
}
