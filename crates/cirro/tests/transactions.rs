//! Transactions across sessions: snapshot reads, read-your-writes, conflicts
//! refused with 40001 and nothing half-applied, and transactions over
//! several tables, all or nothing, a crash between their commits included.
//! (Single-session behaviour is in `tests/slt/transactions.slt`.)

use crate::common::{DataDir, Reply, Session, scalar};

fn setup() -> DataDir {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE acct (id INT NOT NULL, bal BIGINT)");
    data.sql_ok("INSERT INTO acct VALUES (1, 100), (2, 100), (3, 100)");
    data
}

#[test]
fn a_transaction_reads_one_snapshot_and_its_own_writes() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["300"]);
    // another session commits; the open transaction does not see it
    assert_eq!(
        b.ok("UPDATE acct SET bal = bal + 1 WHERE id = 3"),
        Reply::Tag("UPDATE 1".into())
    );
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["300"]);
    // its own uncommitted change it does see; the other session does not
    a.ok("UPDATE acct SET bal = bal - 10 WHERE id = 1");
    assert_eq!(a.rows("SELECT bal FROM acct WHERE id = 1"), vec!["90"]);
    assert_eq!(b.rows("SELECT bal FROM acct WHERE id = 1"), vec!["100"]);
    a.ok("ROLLBACK");
    assert_eq!(scalar(&data, "SELECT sum(bal) FROM acct"), "301");
}

#[test]
fn conflicting_commit_is_refused_with_40001_and_changes_nothing() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    a.ok("UPDATE acct SET bal = bal - 50 WHERE id = 1");
    a.ok("UPDATE acct SET bal = bal + 50 WHERE id = 2");
    // b changes the same rows (the same file) and commits first
    b.ok("UPDATE acct SET bal = bal * 2 WHERE id = 1");
    let err = a.run("COMMIT").expect_err("the second writer must not win");
    assert!(err.contains("SQLSTATE 40001"), "{err}");
    // b's update is there, a's transfer is not: no lost update, nothing half-done
    assert_eq!(
        data.query_csv("SELECT id, bal FROM acct ORDER BY id"),
        "id|bal\n1|200\n2|100\n3|100\n"
    );
}

#[test]
fn concurrent_autocommit_updates_of_one_file_conflict_not_lose() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    a.ok("DELETE FROM acct WHERE id = 3");
    b.ok("DELETE FROM acct WHERE id = 2");
    let err = a.run("COMMIT").expect_err("conflict");
    assert!(err.contains("SQLSTATE 40001"), "{err}");
    assert_eq!(scalar(&data, "SELECT count(*) FROM acct"), "2");
}

#[test]
fn a_transaction_writes_several_tables_all_or_nothing() {
    let data = setup();
    data.sql_ok("CREATE TABLE other (x INT)");
    let both = "SELECT (SELECT count(*) FROM acct) * 10 + (SELECT count(*) FROM other)";
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    a.ok("INSERT INTO acct VALUES (4, 1)");
    a.ok("INSERT INTO other VALUES (1)");
    assert_eq!(a.rows(both), vec!["41"]);
    assert_eq!(b.rows(both), vec!["30"]);
    a.ok("COMMIT");
    assert_eq!(b.rows(both), vec!["41"]);
    // ROLLBACK: neither table changes.
    a.ok("BEGIN");
    a.ok("INSERT INTO other VALUES (2)");
    a.ok("DELETE FROM acct WHERE id = 4");
    assert_eq!(a.rows(both), vec!["32"]);
    a.ok("ROLLBACK");
    assert_eq!(a.rows(both), vec!["41"]);
    assert_eq!(b.rows(both), vec!["41"]);
}

/// A process killed between the commits of a transaction's two tables
/// (the first is in the log, the second not): the next process to open
/// the data location finishes it, so both tables have its rows.
#[test]
fn a_commit_over_two_tables_killed_between_them_is_finished_after() {
    let data = setup();
    data.sql_ok("CREATE TABLE other (x INT)");
    let mut command = data.command();
    command.args([
        "sql",
        "-c",
        "BEGIN; INSERT INTO acct VALUES (4, 1); INSERT INTO other VALUES (1); COMMIT",
    ]);
    let reached = crate::common::kill_at_crash_point(command, "txn.multi_commit");
    assert!(reached, "the crash point was not reached");
    let intents = data.path().join("_cirro_txns");
    assert_eq!(std::fs::read_dir(&intents).expect("the intent").count(), 1);
    assert_eq!(
        scalar(
            &data,
            "SELECT (SELECT count(*) FROM acct) * 10 + (SELECT count(*) FROM other)"
        ),
        "41"
    );
    assert_eq!(std::fs::read_dir(&intents).expect("dir").count(), 0);
    assert_eq!(scalar(&data, "SELECT sum(x) FROM other"), "1");
}

#[test]
fn appends_do_not_conflict_with_concurrent_changes() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    // an open transaction that only inserts, while another session deletes
    a.ok("BEGIN");
    a.ok("INSERT INTO acct VALUES (10, 1)");
    b.ok("DELETE FROM acct WHERE id = 1");
    assert_eq!(a.ok("COMMIT"), Reply::Tag("COMMIT".into()));
    // an autocommit INSERT racing with an UPDATE: both land
    a.ok("BEGIN");
    a.ok("UPDATE acct SET bal = 0 WHERE id = 2");
    b.ok("INSERT INTO acct VALUES (11, 1)");
    a.ok("COMMIT");
    assert_eq!(
        data.query_csv("SELECT id, bal FROM acct ORDER BY id"),
        "id|bal\n2|0\n3|100\n10|1\n11|1\n"
    );
}
