//! Transactions across sessions: snapshot reads, read-your-writes, conflicts
//! refused with 40001 and nothing half-applied, and the one-table rule.
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
fn a_transaction_writes_one_table_only() {
    let data = setup();
    data.sql_ok("CREATE TABLE other (x INT)");
    let mut a = Session::open(&data);
    a.ok("BEGIN");
    a.ok("INSERT INTO acct VALUES (4, 1)");
    let err = a
        .run("INSERT INTO other VALUES (1)")
        .expect_err("second table");
    assert!(err.contains("SQLSTATE 0A000"), "{err}");
    // the script stopped at the error, so the transaction never committed
    drop(a);
    assert_eq!(scalar(&data, "SELECT count(*) FROM acct"), "3");
    assert_eq!(scalar(&data, "SELECT count(*) FROM other"), "0");
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
