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
    a.ok("BEGIN ISOLATION LEVEL REPEATABLE READ");
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

/// READ COMMITTED, the default: each statement of a transaction sees what
/// was committed when it started, and the transaction's own changes; SET
/// TRANSACTION picks the level before the transaction reads a table, and
/// SERIALIZABLE is refused rather than weakened.
#[test]
fn read_committed_sees_what_each_statement_finds_committed() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    assert_eq!(a.rows("SHOW transaction_isolation"), vec!["read committed"]);
    a.ok("BEGIN");
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["300"]);
    b.ok("UPDATE acct SET bal = bal + 1 WHERE id = 3");
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["301"]);
    // Its own change it sees; the other session does not, until COMMIT.
    a.ok("UPDATE acct SET bal = bal - 10 WHERE id = 1");
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["291"]);
    assert_eq!(b.rows("SELECT sum(bal) FROM acct"), vec!["301"]);
    a.ok("COMMIT");
    assert_eq!(scalar(&data, "SELECT sum(bal) FROM acct"), "291");
    // SET TRANSACTION before the first read makes it REPEATABLE READ.
    a.ok("BEGIN");
    a.ok("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    assert_eq!(
        a.rows("SHOW transaction_isolation"),
        vec!["repeatable read"]
    );
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["291"]);
    b.ok("UPDATE acct SET bal = bal + 1 WHERE id = 3");
    assert_eq!(a.rows("SELECT sum(bal) FROM acct"), vec!["291"]);
    let err = a
        .run("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .expect_err("the level cannot change after a read");
    assert!(err.contains("SQLSTATE 25001"), "{err}");
    drop(a);
    // The session's default, and the level SERIALIZABLE is refused at.
    let mut c = Session::open(&data);
    c.ok("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    c.ok("BEGIN");
    assert_eq!(
        c.rows("SHOW transaction_isolation"),
        vec!["repeatable read"]
    );
    assert_eq!(c.rows("SELECT sum(bal) FROM acct"), vec!["292"]);
    b.ok("UPDATE acct SET bal = bal + 1 WHERE id = 3");
    assert_eq!(c.rows("SELECT sum(bal) FROM acct"), vec!["292"]);
    c.ok("COMMIT");
    assert_eq!(c.rows("SELECT sum(bal) FROM acct"), vec!["293"]);
    let err = c
        .run("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .expect_err("SERIALIZABLE is not run as snapshot isolation");
    assert!(err.contains("SQLSTATE 0A000"), "{err}");
}

/// Outside a transaction, at READ COMMITTED, two UPDATEs of one row through
/// the files both apply: the one that loses the race runs again over the
/// winner's version (PostgreSQL re-applies it to the committed row).
#[test]
fn read_committed_statements_of_one_row_both_apply() {
    let data = std::sync::Arc::new(setup());
    let sessions: Vec<_> = (0..2)
        .map(|_| {
            let data = std::sync::Arc::clone(&data);
            std::thread::spawn(move || {
                let mut s = Session::open(&data);
                for _ in 0..15 {
                    s.ok("UPDATE acct SET bal = bal + 1 WHERE id = 2");
                }
            })
        })
        .collect();
    for s in sessions {
        s.join().expect("an updater failed");
    }
    assert_eq!(scalar(&data, "SELECT bal FROM acct WHERE id = 2"), "130");
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

/// Two writers of different rows of one file both commit (the file gets
/// both deletion vectors' rows), in either order and whether each is a
/// transaction or a statement; a third that changes a row one of them
/// changed gets 40001 and changes nothing.
#[test]
fn writers_of_different_rows_of_one_file_both_commit() {
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    a.ok("DELETE FROM acct WHERE id = 3");
    b.ok("DELETE FROM acct WHERE id = 2");
    a.ok("COMMIT");
    assert_eq!(
        data.query_csv("SELECT id, bal FROM acct"),
        "id|bal\n1|100\n"
    );
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    let mut c = Session::open(&data);
    a.ok("BEGIN");
    a.ok("UPDATE acct SET bal = bal + 1 WHERE id = 1");
    b.ok("BEGIN");
    b.ok("UPDATE acct SET bal = bal + 20 WHERE id = 2");
    c.ok("BEGIN");
    c.ok("UPDATE acct SET bal = bal + 300 WHERE id IN (1, 3)");
    b.ok("COMMIT");
    a.ok("COMMIT");
    let err = c.run("COMMIT").expect_err("row 1 was changed by a");
    assert!(err.contains("SQLSTATE 40001"), "{err}");
    assert_eq!(
        data.query_csv("SELECT id, bal FROM acct ORDER BY id"),
        "id|bal\n1|101\n2|120\n3|100\n"
    );
    // A file rewritten by a winner (a DELETE of most of its rows copies the
    // survivors) cannot take the other's deletion vector: 40001.
    let data = setup();
    let mut a = Session::open(&data);
    let mut b = Session::open(&data);
    a.ok("BEGIN");
    a.ok("UPDATE acct SET bal = 0 WHERE id = 1");
    b.ok("DELETE FROM acct WHERE id IN (2, 3)");
    let err = a.run("COMMIT").expect_err("the file was rewritten");
    assert!(err.contains("SQLSTATE 40001"), "{err}");
    assert_eq!(
        data.query_csv("SELECT id, bal FROM acct"),
        "id|bal\n1|100\n"
    );
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

/// Sessions of one server: a transaction reads every table as of its
/// start, including a table it first reads after another session committed
/// to it (PostgreSQL's REPEATABLE READ); a statement outside one sees the
/// newest commits.
#[test]
fn a_transaction_reads_every_table_as_of_its_start() {
    use crate::common::server::Server;
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (a, b) = (server.client().await, server.client().await);
        let first = |rows: Vec<tokio_postgres::SimpleQueryMessage>| -> String {
            rows.iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => {
                        Some(row.get(0).unwrap_or("NULL").to_string())
                    }
                    _ => None,
                })
                .expect("a row")
        };
        for sql in [
            "CREATE TABLE acct (id INT NOT NULL, bal BIGINT)",
            "INSERT INTO acct VALUES (1, 100), (2, 100), (3, 100)",
            "CREATE TABLE other (n INT)",
            "INSERT INTO other VALUES (1)",
        ] {
            b.simple_query(sql).await.expect(sql);
        }
        a.simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await
            .expect("begin");
        let sum = first(
            a.simple_query("SELECT sum(bal) FROM acct")
                .await
                .expect("sum"),
        );
        assert_eq!(sum, "300");
        b.simple_query("INSERT INTO other VALUES (2)")
            .await
            .expect("insert");
        b.simple_query("UPDATE acct SET bal = 0 WHERE id = 1")
            .await
            .expect("update");
        // First read of `other` in the transaction: as of its start.
        let count = first(
            a.simple_query("SELECT count(*) FROM other")
                .await
                .expect("count"),
        );
        assert_eq!(count, "1", "a table first read after another commit");
        let sum = first(
            a.simple_query("SELECT sum(bal) FROM acct")
                .await
                .expect("sum"),
        );
        assert_eq!(sum, "300");
        // Outside a transaction, the newest.
        let count = first(
            b.simple_query("SELECT count(*) FROM other")
                .await
                .expect("count"),
        );
        assert_eq!(count, "2");
        a.simple_query("COMMIT").await.expect("commit");
        let count = first(
            a.simple_query("SELECT count(*) FROM other")
                .await
                .expect("count"),
        );
        assert_eq!(count, "2");
        let sum = first(
            a.simple_query("SELECT sum(bal) FROM acct")
                .await
                .expect("sum"),
        );
        assert_eq!(sum, "200");
    });
}
