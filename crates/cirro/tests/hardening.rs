//! No statement takes the server down: the shapes a newcomer sent (a
//! 3,000-term OR, a 2,000-term sum) answer correctly, so do they at 10x, and
//! past the documented limits (docs/configuration.md, "Limits") each gets
//! 54001 at once while the server keeps answering.

use crate::common;

use std::path::Path;

use crate::common::server::{PASSWORD, Server, stderr};
use cirro_common::limits::{
    EXPRESSION_CHAIN_LENGTH_MAX, EXPRESSION_OPERATORS_MAX, STATEMENT_BYTES_MAX,
    STATEMENT_NESTING_DEPTH_MAX,
};

fn or_terms(n: usize) -> String {
    let terms: Vec<String> = (0..n).map(|i| format!("id = {i}")).collect();
    format!("SELECT count(*) FROM trips WHERE {};", terms.join(" OR "))
}

fn sum_of_ones(n: usize) -> String {
    format!("SELECT {};", vec!["1"; n].join("+"))
}

/// Run the statement in `sql` through psql from a file (statements this long
/// do not fit on a command line).
fn run_file(server: &Server, dir: &Path, sql: &str) -> std::process::Output {
    let file = dir.join("statement.sql");
    std::fs::write(&file, sql).expect("write the statement");
    server.psql(
        "cirro",
        PASSWORD,
        &[
            "-At",
            "-v",
            "VERBOSITY=verbose",
            "-f",
            file.to_str().expect("utf8"),
        ],
    )
}

fn answers(server: &Server, dir: &Path, sql: &str) -> String {
    let out = run_file(server, dir, sql);
    assert!(
        out.status.success(),
        "{}…: {}",
        &sql[..80.min(sql.len())],
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn refused(server: &Server, dir: &Path, sql: &str) -> String {
    refused_with(server, dir, sql, &["54001"])
}

/// `sql` fails with one of `codes`, and the server goes on.
fn refused_with(server: &Server, dir: &Path, sql: &str, codes: &[&str]) -> String {
    let out = run_file(server, dir, sql);
    let err = stderr(&out);
    assert!(
        !out.status.success() && codes.iter().any(|code| err.contains(code)),
        "{}… should give {codes:?}: {err}",
        &sql[..80.min(sql.len())]
    );
    // The server is up and this session's next statement answers.
    assert_eq!(server.sql("SELECT 41 + 1").trim(), "42");
    err
}

#[test]
fn no_statement_shape_takes_the_server_down() {
    let server = Server::start();
    let dir = server.data.path().to_path_buf();
    server.sql("CREATE TABLE trips AS SELECT value AS id FROM generate_series(0, 99999)");

    // The shapes from the report, and at 10x.
    assert_eq!(answers(&server, &dir, &or_terms(3_000)), "3000");
    assert_eq!(answers(&server, &dir, &sum_of_ones(2_000)), "2000");
    assert_eq!(answers(&server, &dir, &or_terms(30_000)), "30000");
    let mixed: Vec<String> = (0..15_000)
        .map(|i| format!("(id = {i} AND id >= 0)"))
        .collect();
    let sql = format!("SELECT count(*) FROM trips WHERE {};", mixed.join(" OR "));
    assert_eq!(answers(&server, &dir, &sql), "15000");
    assert_eq!(
        answers(&server, &dir, &sum_of_ones(EXPRESSION_CHAIN_LENGTH_MAX + 1)),
        (EXPRESSION_CHAIN_LENGTH_MAX + 1).to_string(),
        "a chain of EXPRESSION_CHAIN_LENGTH_MAX operators answers"
    );

    // Past the limits: 54001, and the server answers the next statement.
    let err = refused(&server, &dir, &sum_of_ones(EXPRESSION_CHAIN_LENGTH_MAX + 2));
    assert!(err.contains("chain of operators"), "{err}");
    let err = refused(&server, &dir, &sum_of_ones(EXPRESSION_OPERATORS_MAX * 10));
    assert!(err.contains("operators"), "{err}");
    let err = refused(&server, &dir, &or_terms(EXPRESSION_OPERATORS_MAX));
    assert!(err.contains("operators"), "{err}");
    let depth = STATEMENT_NESTING_DEPTH_MAX * 10;
    let err = refused(
        &server,
        &dir,
        &format!("SELECT {}1{};", "(".repeat(depth), ")".repeat(depth)),
    );
    assert!(err.contains("nested"), "{err}");
    let err = refused(
        &server,
        &dir,
        &format!("SELECT '{}';", "x".repeat(STATEMENT_BYTES_MAX)),
    );
    assert!(err.contains("bytes"), "{err}");
    // Deep NOT and unary minus chains recurse in the parser: bounded too.
    refused(&server, &dir, &format!("SELECT {}1;", "- ".repeat(depth)));
    // (sqlparser backtracks over a NOT that hits its limit, and reports
    // the statement as a syntax error.)
    refused_with(
        &server,
        &dir,
        &format!("SELECT {} true;", "NOT ".repeat(depth)),
        &["54001", "42601"],
    );
    // Postfix chains are chains too.
    let casts = "::bigint".repeat(EXPRESSION_CHAIN_LENGTH_MAX + 2);
    refused(&server, &dir, &format!("SELECT 1{casts};"));
}

/// CPU seconds `pid` has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    common::cpu_ticks(pid) as f64 / 100.0
}

/// statement_timeout stops the work, not only the reply: a cross join that
/// would compute for many seconds stops using the CPU once 57014 is sent.
#[test]
fn statement_timeout_stops_the_work() {
    let server = Server::start();
    let pid = server.child.id();
    let out = server.psql(
        "cirro",
        PASSWORD,
        &[
            "-c",
            "SET statement_timeout = '1s'",
            "-c",
            "SELECT sum(a * b % 7) FROM generate_series(1, 100000) a, \
             generate_series(1, 10000) b",
        ],
    );
    assert!(
        stderr(&out).contains("statement timeout"),
        "{}",
        stderr(&out)
    );
    let at_cancel = cpu_seconds(pid);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let used = cpu_seconds(pid) - at_cancel;
    assert!(
        used < 0.5,
        "the server used {used:.2} s of CPU after the timeout"
    );
    assert_eq!(server.sql("SELECT 41 + 1").trim(), "42");
}

/// A writer killed midway leaves object_store's staging file
/// (`part-….parquet#1`) in the table folder: it is never read, VACUUM keeps
/// it while younger than the retention and removes it after.
#[test]
fn vacuum_removes_the_staging_files_of_killed_writers() {
    let data = common::DataDir::new();
    data.sql_ok(
        "CREATE TABLE t (id BIGINT); INSERT INTO t SELECT value FROM generate_series(1, 1000)",
    );
    let dir = common::table_dir(&data, "t");
    let data_file = std::fs::read_dir(&dir)
        .expect("table dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("a data file");
    // Half a file, as a killed writer leaves it.
    let bytes = std::fs::read(&data_file).expect("read");
    let staging = dir.join("part-00000-killed.zstd.parquet#1");
    std::fs::write(&staging, &bytes[..bytes.len() / 2]).expect("write");
    let count = || common::scalar(&data, "SELECT count(*), sum(id) FROM t");
    assert_eq!(count(), "1000|500500");
    data.sql_ok("VACUUM t RETAIN 1 HOURS");
    assert!(staging.exists(), "a fresh staging file was removed");
    data.sql_ok("VACUUM t RETAIN 0 HOURS");
    assert!(!staging.exists(), "VACUUM left the staging file");
    assert!(data_file.exists());
    assert_eq!(count(), "1000|500500");
}
