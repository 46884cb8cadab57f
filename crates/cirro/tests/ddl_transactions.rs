//! DDL inside transactions (see `cirro-engine/src/session/txn.rs`): over the wire
//! with psycopg's default connection and SQLAlchemy (`ddl_transactions.py`),
//! and a process killed in the middle of COMMIT leaves no half-created
//! table.

use crate::common::DataDir;
use crate::common::server::{PASSWORD, Server, python_ok};

/// Through the tables' files: another session's write before an ALTER's
/// COMMIT makes the COMMIT fail with 40001.
#[test]
fn clients_create_fill_and_drop_tables_in_transactions() {
    let server = Server::start_with(DataDir::new(), &["--row-store", "off"]);
    let dsn = format!("{} password={PASSWORD}", server.conninfo("cirro"));
    python_ok("ddl_transactions.py", &[&dsn]);
}

/// With the row store: an ALTER in a transaction holds off other
/// sessions' small writes to its table until it ends.
#[test]
fn an_alter_in_a_transaction_holds_off_small_writes() {
    let server = Server::start_with(DataDir::new(), &["--row-store", "on"]);
    let dsn = format!("{} password={PASSWORD}", server.conninfo("cirro"));
    python_ok("ddl_transactions.py", &[&dsn, "row-store"]);
}

const SCRIPT: &str = "BEGIN; \
    CREATE TABLE made (id INT NOT NULL, v VARCHAR); \
    INSERT INTO made SELECT value, 'x' FROM generate_series(1, 1000) AS g(value); \
    CREATE TABLE copied AS SELECT id * 2 AS k FROM made; \
    CREATE VIEW made_view AS SELECT count(*) AS n FROM made; \
    DROP TABLE old; \
    COMMIT";

#[test]
fn a_commit_killed_half_way_leaves_no_half_created_table() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE old AS SELECT 1 AS x");
    let mut command = data.command();
    command.args(["sql", "-c", SCRIPT]);
    let reached = crate::common::kill_at_crash_point(command, "txn.ddl_commit");
    assert!(reached, "the crash point was not reached");
    // Nothing of the transaction is there; what it dropped still is.
    let listed = data.query_csv(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    );
    assert_eq!(listed, "table_name\nold\n");
    assert_eq!(data.query_csv("SELECT x FROM old"), "x\n1\n");
    // The same transaction, not killed, commits all of it.
    data.sql_ok(SCRIPT);
    assert_eq!(
        data.query_csv("SELECT (SELECT count(*) FROM made) AS m, (SELECT n FROM made_view) AS n, (SELECT max(k) FROM copied) AS k"),
        "m|n|k\n1000|1000|2000\n"
    );
    let err = data.sql_err("SELECT * FROM old");
    assert!(err.contains("42P01"), "{err}");
}
