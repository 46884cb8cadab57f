//! Crash safety of small writes through the row store (`--row-store on`):
//! four psycopg clients run TPC-B-like transactions (three tables updated
//! by key, a history row inserted with a unique id), logging each id once
//! its COMMIT is answered; the server is killed with SIGKILL part-way and
//! started again on the same data. After each restart every acknowledged id
//! is in the history, any other id only if its COMMIT was in flight (at most
//! one per client), and the TPC-B invariant holds: the sums of the
//! accounts', tellers' and branches' balances and of the history's deltas
//! are equal. Some rounds kill the server right after a background flush
//! could have run, so replay starts from a flushed position.
//!
//! The fast tier runs 2 rounds; the slow tier 20.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::DataDir;
use crate::common::server::{PASSWORD, interop_dir, python, spawn_serve_console};

const CLIENTS: usize = 4;

fn start(data: &Path) -> (Child, String) {
    let (child, port, _, _, _) =
        spawn_serve_console(data, &["--row-store", "on"], PASSWORD, &[], Stdio::null());
    let dsn = format!(
        "host=127.0.0.1 port={port} user=cirro dbname=cirro sslmode=disable password={PASSWORD}"
    );
    (child, dsn)
}

fn psql(dsn: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(dsn)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ids_in(dir: &Path, prefix: &str) -> Vec<(String, HashSet<i64>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let ids = std::fs::read_to_string(entry.path())
            .expect("read")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        out.push((name, ids));
    }
    out
}

fn crash_rounds(rounds: usize) {
    let data = DataDir::new();
    let logs = tempfile::tempdir().expect("log dir");
    let (mut child, mut dsn) = start(data.path());
    psql(
        &dsn,
        "CREATE TABLE accounts (aid int PRIMARY KEY, bid int, abalance bigint); \
         CREATE TABLE tellers (tid int PRIMARY KEY, bid int, tbalance bigint); \
         CREATE TABLE branches (bid int PRIMARY KEY, bbalance bigint); \
         CREATE TABLE history (id bigint, tid int, bid int, aid int, delta bigint); \
         INSERT INTO accounts SELECT value, 1, 0 FROM generate_series(1, 1000); \
         INSERT INTO tellers SELECT value, 1, 0 FROM generate_series(1, 10); \
         INSERT INTO branches VALUES (1, 0)",
    );
    let mut acked_total = 0usize;
    for round in 0..rounds {
        let driver = std::process::Command::new(python())
            .arg(interop_dir().join("tpcb_crash.py"))
            .args([
                dsn.as_str(),
                &CLIENTS.to_string(),
                "20",
                logs.path().to_str().expect("utf8"),
                &round.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the driver");
        // Odd rounds run past a background flush (every 10 s).
        let run = if round % 2 == 1 {
            Duration::from_millis(10_500 + 300 * (round as u64 % 5))
        } else {
            Duration::from_millis(1_500 + 250 * (round as u64 % 7))
        };
        std::thread::sleep(run);
        child.kill().expect("SIGKILL the server");
        child.wait().expect("reap");
        let out = driver.wait_with_output().expect("driver");
        assert!(
            out.status.success(),
            "driver failed in round {round}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (child, dsn) = start(data.path());
        let history: HashSet<i64> = psql(&dsn, "SELECT id FROM history")
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        let mut acked: HashSet<i64> = HashSet::new();
        for (_, ids) in ids_in(logs.path(), "acked-") {
            acked.extend(ids);
        }
        let missing: Vec<&i64> = acked.iter().filter(|id| !history.contains(id)).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged ids lost: {missing:?}"
        );
        let inflight: HashSet<i64> = ids_in(logs.path(), "inflight-")
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .collect();
        let extra: Vec<&i64> = history
            .iter()
            .filter(|id| !acked.contains(id) && !inflight.contains(id))
            .collect();
        assert!(extra.is_empty(), "round {round}: ids never sent: {extra:?}");
        let unacked_in = history.iter().filter(|id| !acked.contains(id)).count();
        assert!(
            unacked_in <= CLIENTS * (round + 1),
            "round {round}: {unacked_in} unacknowledged ids present"
        );
        let sums = psql(
            &dsn,
            "SELECT (SELECT coalesce(sum(abalance), 0) FROM accounts) || ',' || \
                    (SELECT coalesce(sum(tbalance), 0) FROM tellers) || ',' || \
                    (SELECT coalesce(sum(bbalance), 0) FROM branches) || ',' || \
                    (SELECT coalesce(sum(delta), 0) FROM history)",
        );
        let parts: Vec<&str> = sums.split(',').collect();
        assert!(
            parts.len() == 4 && parts.iter().all(|p| *p == parts[0]),
            "round {round}: the TPC-B invariant does not hold: {sums}"
        );
        let count: usize = psql(&dsn, "SELECT count(*) FROM accounts")
            .parse()
            .expect("count");
        assert_eq!(count, 1000, "round {round}: accounts lost or duplicated");
        acked_total = acked.len();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        acked_total >= rounds,
        "only {acked_total} transactions were acknowledged in {rounds} rounds"
    );
}

#[test]
fn killed_small_writes_keep_every_acknowledged_transaction() {
    crash_rounds(2);
}

#[test]
#[ignore = "slow tier: 20 kills"]
fn killed_small_writes_many_times() {
    crash_rounds(20);
}

fn stop_cleanly(mut child: Child) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "SIGTERM");
    let status = child.wait().expect("reap");
    assert!(status.success(), "the server stopped with {status}");
}

/// The write-ahead log's directory deleted after a clean stop (which
/// flushed every store): the log made again at the next start goes on past
/// the position the table's files record, so a row written then is seen at
/// once and after a SIGKILL (numbered from 1 again, it was hidden as
/// already flushed, then lost). A log that ends before that position (an
/// older copy put back) is refused at start, naming the table.
#[test]
fn a_log_made_again_goes_on_past_the_flushed_position() {
    let data = DataDir::new();
    let wal = data.path().join("_cirro_wal");
    let older = tempfile::tempdir().expect("copy dir");
    let (child, dsn) = start(data.path());
    psql(&dsn, "CREATE TABLE t (k int PRIMARY KEY, v int)");
    for k in 1..=5 {
        psql(&dsn, &format!("INSERT INTO t VALUES ({k}, {k})"));
        if k == 2 {
            crate::common::copy_tree(&wal, older.path());
        }
    }
    stop_cleanly(child);

    // An older copy of the log: the start fails and changes nothing.
    std::fs::remove_dir_all(&wal).expect("remove the log");
    crate::common::copy_tree(older.path(), &wal);
    let out = std::process::Command::new(crate::common::cirro_bin())
        .args(["--data", data.path().to_str().expect("utf8")])
        .args(["serve", "--pg-port", "0", "--flight-port", "0", "--no-http"])
        .args(["--row-store", "on"])
        .env("CIRRO_PASSWORD", PASSWORD)
        .output()
        .expect("run cirro serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started over an older log: {stderr}");
    assert!(
        stderr.contains("write-ahead log") && stderr.contains("table"),
        "{stderr}"
    );

    // No log at all: a new one, numbered after the flushed position.
    std::fs::remove_dir_all(&wal).expect("remove the log");
    let (mut child, dsn) = start(data.path());
    assert_eq!(psql(&dsn, "SELECT count(*) FROM t"), "5");
    psql(&dsn, "INSERT INTO t VALUES (10, 10)");
    assert_eq!(psql(&dsn, "SELECT count(*), sum(v) FROM t"), "6|25");
    child.kill().expect("SIGKILL the server");
    child.wait().expect("reap");
    let (mut child, dsn) = start(data.path());
    assert_eq!(psql(&dsn, "SELECT count(*), sum(v) FROM t"), "6|25");
    let _ = child.kill();
    let _ = child.wait();
}

/// A data location whose row store was written by an earlier release
/// (tests/fixtures/location-6cb12fa-wal; its README says how): killed with
/// changes flushed into the tables' files and more only in the write-ahead
/// log. Read without the row store, the files hold the flushed rows; served
/// with it, the log's records (a transaction over two tables among them) are
/// applied once, and the location takes new small writes that outlive a
/// restart.
#[test]
fn a_row_store_written_by_an_earlier_release_replays() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/location-6cb12fa-wal");
    let data = DataDir::new();
    crate::common::copy_tree(&fixture, data.path());
    assert_eq!(
        data.query_csv("SELECT id, owner, balance FROM acct ORDER BY id"),
        "id|owner|balance\n1|ann|100\n2|bob|200\n3|cy|300\n"
    );
    let (mut child, dsn) = start(data.path());
    let acct = "SELECT string_agg(id || ':' || owner || ':' || balance, ',' ORDER BY id) FROM acct";
    let events = "SELECT string_agg(at || ':' || what, ',' ORDER BY at) FROM events";
    assert_eq!(psql(&dsn, acct), "1:ann:50,2:bob:250,4:dee:400");
    assert_eq!(psql(&dsn, events), "1:opened,2:moved 50,3:closed 3");
    psql(
        &dsn,
        "BEGIN; UPDATE acct SET balance = balance + 1 WHERE id = 4; \
         INSERT INTO events VALUES (4, 'paid 1'); COMMIT",
    );
    child.kill().expect("SIGKILL the server");
    child.wait().expect("reap");
    let (child, dsn) = start(data.path());
    assert_eq!(psql(&dsn, acct), "1:ann:50,2:bob:250,4:dee:401");
    assert_eq!(
        psql(&dsn, events),
        "1:opened,2:moved 50,3:closed 3,4:paid 1"
    );
    stop_cleanly(child);
    // A clean stop flushed every store: the files alone hold it all.
    assert_eq!(
        data.query_csv("SELECT count(*), sum(balance) FROM acct"),
        "count|sum\n3|701\n"
    );
}
