//! Several `cirro` processes on one data location at once: concurrent appends
//! to one table all land (each its own Delta version), and concurrent DDL all
//! lands (catalog commits that lose a race re-read and retry).

mod common;

use std::process::{Child, Command, Stdio};

use common::{DataDir, scalar};

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
