//! Several `cirro` processes on one data location at once: concurrent appends
//! to one table all land (each its own Delta version), and concurrent DDL all
//! lands (catalog commits that lose a race re-read and retry).

use std::process::{Child, Command, Stdio};

use crate::common::{DataDir, scalar};

const PROCESSES: usize = 4;

fn spawn_sql(data: &DataDir, sql: &str) -> Child {
    let mut command: Command = data.command();
    command
        .args(["sql", "-c", sql])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command.spawn().expect("spawn cirro")
}

fn wait_all(children: Vec<Child>) {
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "a concurrent statement failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn concurrent_appends_to_one_table_all_land() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t (id BIGINT, src VARCHAR)");
    let children = (0..PROCESSES)
        .map(|p| {
            spawn_sql(
                &data,
                &format!("INSERT INTO t SELECT value, 'p{p}' FROM generate_series(1, 200000)"),
            )
        })
        .collect();
    wait_all(children);
    assert_eq!(
        scalar(&data, "SELECT count(*) FROM t"),
        (PROCESSES * 200_000).to_string()
    );
    assert_eq!(
        scalar(&data, "SELECT count(DISTINCT src) FROM t"),
        PROCESSES.to_string()
    );
}

#[test]
fn concurrent_ddl_from_several_processes_all_lands() {
    let data = DataDir::new();
    let children = (0..PROCESSES)
        .map(|p| spawn_sql(&data, &format!("CREATE TABLE c{p} (a INT); CREATE SCHEMA s{p}; CREATE VIEW v{p} AS SELECT a FROM c{p}")))
        .collect();
    wait_all(children);
    let tables = scalar(
        &data,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    );
    assert_eq!(
        tables,
        (2 * PROCESSES).to_string(),
        "every table and view is in the catalog"
    );
    let schemas = scalar(
        &data,
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 's%'",
    );
    assert_eq!(schemas, PROCESSES.to_string());
}

/// Inserts the test runs beside one ALTER TABLE at most.
const INSERTS_BESIDE_ALTER: usize = 60;

#[test]
fn alter_table_beside_concurrent_inserts_loses_no_row() {
    // RENAME COLUMN rewrites the table. An INSERT that commits while the
    // rewrite runs must make the ALTER fail (40001), else its file, written
    // under the old column name, would read NULL in the renamed column; an
    // INSERT after the ALTER's commit fails (40001) or lands under the new name.
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR NOT NULL)");
    data.sql_ok("INSERT INTO t SELECT value, 'n' || value FROM generate_series(1, 2000000)");
    let mut alter: Command = data.command();
    alter
        .args(["sql", "-c", "ALTER TABLE t RENAME COLUMN name TO label"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let alter = alter.spawn().expect("spawn ALTER");
    let mut landed = 0;
    let mut refused = 0;
    let alter_out = {
        let mut alter = Some(alter);
        let mut out = None;
        for i in 0..INSERTS_BESIDE_ALTER {
            let insert = data.sql_output(&format!("INSERT INTO t VALUES (-{i}, 'x{i}')"), &[]);
            if insert.status.success() {
                landed += 1;
            } else {
                let err = String::from_utf8_lossy(&insert.stderr).into_owned();
                assert!(err.contains("40001"), "an INSERT failed otherwise: {err}");
                refused += 1;
            }
            if let Some(child) = alter.as_mut()
                && child.try_wait().expect("poll").is_some()
            {
                out = Some(
                    alter
                        .take()
                        .expect("child")
                        .wait_with_output()
                        .expect("wait"),
                );
                break;
            }
        }
        out.unwrap_or_else(|| alter.expect("child").wait_with_output().expect("wait"))
    };
    let alter_err = String::from_utf8_lossy(&alter_out.stderr).into_owned();
    let column = if alter_out.status.success() {
        "label"
    } else {
        assert!(
            alter_err.contains("40001"),
            "ALTER failed otherwise: {alter_err}"
        );
        "name"
    };
    eprintln!(
        "ALTER ok: {}, inserts landed {landed}, refused {refused}",
        alter_out.status.success()
    );
    assert!(landed + refused > 0);
    assert_eq!(
        scalar(
            &data,
            &format!("SELECT count(*) || ':' || count({column}) FROM t")
        ),
        format!("{0}:{0}", 2_000_000 + landed),
        "every landed row is there, with its value in the (renamed) column \
         (ALTER ok: {}, inserts landed {landed}, refused {refused})",
        alter_out.status.success()
    );
}

#[test]
fn concurrent_inserts_of_one_key_keep_the_primary_key_unique() {
    // Every process inserts the same keys (plainly, or in a transaction):
    // the constraint check and the commit hold the table's write lock, which
    // spans processes on a local data directory, so exactly one of each kind
    // lands and the others fail with 23505.
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE k (id BIGINT PRIMARY KEY, src VARCHAR)");
    let mut children = Vec::new();
    for p in 0..PROCESSES {
        children.push(spawn_sql(
            &data,
            &format!("INSERT INTO k SELECT value, 'p{p}' FROM generate_series(1, 20000)"),
        ));
        children.push(spawn_sql(
            &data,
            &format!("BEGIN; INSERT INTO k VALUES (-1, 't{p}'); COMMIT"),
        ));
    }
    let mut landed = 0;
    for child in children {
        let out = child.wait_with_output().expect("wait");
        if out.status.success() {
            landed += 1;
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("23505"), "an INSERT failed otherwise: {err}");
        }
    }
    assert_eq!(landed, 2, "one plain INSERT and one transaction land");
    assert_eq!(scalar(&data, "SELECT count(*) FROM k"), "20001");
    assert_eq!(scalar(&data, "SELECT count(DISTINCT id) FROM k"), "20001");
}
